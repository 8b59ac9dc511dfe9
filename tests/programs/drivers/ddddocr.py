"""ddddocr: captcha OCR (classification model) and its text-box detector (det model)."""
import synth

CATEGORY = "OCR"
PACKAGE = "ddddocr"


def run() -> dict:
    import ddddocr
    out = {}
    ocr = ddddocr.DdddOcr(show_ad=False)
    for i, text in enumerate(["3x7Kq", "ab12", "HELLO", "9042"]):
        out[f"ocr{i}"] = ocr.classification(synth.png_bytes(synth.captcha_image(text, seed=i)))
    ocr_beta = ddddocr.DdddOcr(beta=True, show_ad=False)
    out["beta"] = ocr_beta.classification(synth.png_bytes(synth.captcha_image("k7Mz2", seed=9)))
    det = ddddocr.DdddOcr(det=True, ocr=False, show_ad=False)
    img = synth.text_image(["A B C", "x y z"], size=(320, 200), font_size=48)
    out["det"] = [list(map(int, b)) for b in det.detection(synth.png_bytes(img))]
    return out


def summary(result: dict) -> str:
    return f"{result['ocr0']!r} {result['ocr1']!r} {result['beta']!r} det={len(result['det'])} boxes"


def compare(ort: dict, epx: dict) -> list:
    import compare as c
    problems = []
    for k in ort:
        if k == "det":
            problems += c.compare_boxes(ort[k], epx.get(k), tol=2, where="det")
        else:
            problems += c.compare(ort[k], epx.get(k), where=k)
    return problems
