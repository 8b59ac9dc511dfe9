"""rapidocr-onnxruntime: PaddleOCR det + cls + rec models, run through RapidOCR's pipeline."""
import synth

CATEGORY = "OCR"
PACKAGE = "rapidocr-onnxruntime"

LINES = ["Hello World 2024", "epx runs ONNX models", "The quick brown fox", "Invoice No. 31415"]


def run() -> dict:
    from rapidocr_onnxruntime import RapidOCR
    engine = RapidOCR()
    out = {}
    img = synth.text_image(LINES, size=(720, 280), font_size=36)
    result, _ = engine(synth.bgr(img))
    out["page"] = [{"box": synth.r(box, 2), "text": text, "score": round(float(score), 5)}
                   for box, text, score in (result or [])]
    # A single-line crop through the recogniser only (no detection).
    line = synth.text_image(["ONNX 1.31"], size=(260, 56), font_size=36, origin=(8, 6))
    rec, _ = engine(synth.bgr(line), use_det=False, use_cls=False, use_rec=True)
    out["line"] = [[t, round(float(s), 5)] for t, s in (rec or [])]
    return out


def summary(result: dict) -> str:
    return " | ".join(x["text"] for x in result["page"])
