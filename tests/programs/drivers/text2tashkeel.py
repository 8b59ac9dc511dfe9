"""text2tashkeel: Arabic diacritization; the INT8 models shipped in the wheel
(BiLSTM with attention, Rawi BiLSTMs, and stitched ensembles). The fp32 ones download: not used."""
CATEGORY = "text"
PACKAGE = "text2tashkeel"

TEXTS = ["السلام عليكم ورحمة الله وبركاته", "ذهب الولد إلى المدرسة صباحا",
         "العلم نور والجهل ظلام", "كتب الطالب الدرس في الدفتر"]


def run() -> dict:
    import text2tashkeel as t
    out = {}
    for cls in ("BilstmInt8", "RawiInt8", "RawiV2Int8", "RawiV3Int8", "BilstmInt8RawiInt8",
                "RawiV2Int8RawiV3Int8"):
        if hasattr(t, cls):
            model = getattr(t, cls)()
            out[cls] = [model.diacritize(x) for x in TEXTS]
    return out


def summary(result: dict) -> str:
    return result["RawiV2Int8RawiV3Int8"][0] + f" ({len(result)} models)"
