"""captcha-whisperer: CRNN + CTC captcha recogniser (captcha_crnn.onnx shipped in the wheel)."""
import synth

CATEGORY = "OCR"
PACKAGE = "captcha-whisperer"


def run() -> dict:
    import numpy as np
    from captcha_whisperer import CaptchaRecognizer
    rec = CaptchaRecognizer(threads=1)
    out = {}
    for i, text in enumerate(["3x7Kq", "ab12", "HELLO9"]):
        res = rec.recognize_bytes(synth.png_bytes(synth.captcha_image(text, seed=i)))
        out[f"bytes{i}"] = synth.r(res, 5)
    arrays = [np.asarray(synth.captcha_image(t, seed=10 + j).convert("L" if j else "RGB"))
              for j, t in enumerate(["w3Zp", "7777"])]
    out["arrays"] = synth.r(rec.recognize_arrays(arrays), 5)
    return out


def summary(result: dict) -> str:
    return " ".join(repr(v.get("text", v)) for k, v in result.items() if k.startswith("bytes"))
