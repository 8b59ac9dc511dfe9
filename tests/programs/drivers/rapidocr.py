"""rapidocr 3.x: PP-OCRv6 det/rec + orientation cls (shipped in the wheel); its ONNX Runtime
engine sets SessionOptions (arena, threads) and reads get_modelmeta().custom_metadata_map
(the recogniser's character list lives in the model's metadata)."""
import synth

CATEGORY = "OCR"
PACKAGE = "rapidocr"

LINES = ["Hello World 2024", "epx runs ONNX models", "The quick brown fox", "Invoice No. 31415"]


def run() -> dict:
    from rapidocr import RapidOCR
    engine = RapidOCR()
    out = {}
    for name, img in (("synthetic", synth.text_image(LINES, size=(720, 280), font_size=36)),
                      ("skimage_page", synth.sample_image("page.png"))):
        res = engine(synth.bgr(img))
        out[name] = [{"text": t, "score": round(float(s), 5), "box": synth.r(b, 1)}
                     for b, t, s in zip(res.boxes if res.boxes is not None else [], res.txts or [],
                                        res.scores or [])]
    words = engine(synth.bgr(synth.text_image(["epx 2026"], size=(240, 60), font_size=36)),
                   return_word_box=True)
    out["word_results"] = synth.r([list(w) for w in words.word_results], 3) if words.word_results else []
    return out


def summary(result: dict) -> str:
    return " | ".join(x["text"] for x in result["synthetic"]) + f" | page: {len(result['skimage_page'])} lines"
