"""trueocr: Vietnamese OCR (text detector, orientation, reading order and recogniser models)."""
import synth

CATEGORY = "OCR"
PACKAGE = "trueocr"


def run() -> dict:
    from trueocr import TrueOCR, OCRConfig
    ocr = TrueOCR(OCRConfig(threads=2))
    out = {}
    page = synth.text_image(["Xin chao the gioi", "Hoa don so 31415", "ONNX Runtime va epx"],
                            size=(640, 220), font_size=36)
    for name, img in (("page", page), ("skimage_page", synth.sample_image("page.png"))):
        res = ocr.predict(img)
        out[name] = {"rotation": res.data["rotation_clockwise_degrees"],
                     "skew": round(res.data["skew_degrees"], 3),
                     "lines": [{"text": l["text"], "confidence": round(float(l["confidence"]), 5),
                                "bbox": l["bbox"]} for l in res.lines]}
    line = synth.text_image(["Cam on ban"], size=(260, 56), font_size=36, origin=(8, 6))
    res = ocr.predict(line, mode="line")
    out["line"] = [[l["text"], round(float(l["confidence"]), 5)] for l in res.lines]
    return out


def summary(result: dict) -> str:
    return " | ".join(l["text"] for l in result["page"]["lines"])
