"""nudenet (inputs: photos shipped in scikit-image, and a synthetic scene): a YOLOv8n detector (320n.onnx shipped in the wheel), through NudeDetector.detect."""
import os
import tempfile

import synth

CATEGORY = "image detection"
PACKAGE = "nudenet"


def run() -> dict:
    from nudenet import NudeDetector
    det = NudeDetector()
    out = {}
    tmp = tempfile.mkdtemp(prefix="nudenet-")
    images = {"astronaut": synth.sample_image("astronaut.png"),
              "camera": synth.sample_image("camera.png"),
              "chelsea": synth.sample_image("chelsea.png"),
              "shapes": synth.shapes_image()}
    for name, img in images.items():
        path = os.path.join(tmp, name + ".png")
        img.save(path)
        res = det.detect(path)
        out[name] = sorted(({"class": d["class"], "score": round(float(d["score"]), 5),
                             "box": [int(v) for v in d["box"]]} for d in res),
                           key=lambda d: (d["class"], d["box"]))
    # detect_batch takes the same paths (a batched input tensor).
    batch = det.detect_batch([os.path.join(tmp, n + ".png") for n in ("astronaut", "camera", "shapes")])
    out["batch_counts"] = [len(x) for x in batch]
    return out


def summary(result: dict) -> str:
    return ", ".join(f"{k}: {len(v)} det" + (f" (top {v[0]['class']} {v[0]['score']:.2f})" if v else "")
                     for k, v in result.items() if k != "batch_counts")
