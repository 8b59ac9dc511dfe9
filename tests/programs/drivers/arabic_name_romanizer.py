"""arabic-name-romanizer: Arabic personal names -> Latin; ONNX encoder/decoder with beam search."""
CATEGORY = "text (seq2seq)"
PACKAGE = "arabic-name-romanizer"

NAMES = ["محمد", "عبد الرحمن", "فاطمة الزهراء", "خالد بن الوليد", "يوسف", "نور الهدى", "قتيبة",
         "ذو الفقار", "زينب", "شهرزاد"]


def run() -> dict:
    from arabic_name_romanizer import Transliterator
    tr = Transliterator()
    out = {}
    for name in NAMES:
        res = tr.transliterate(name)
        out[name] = _plain(res)
    return out


def _plain(x):
    import dataclasses
    if dataclasses.is_dataclass(x):
        return {k: _plain(v) for k, v in dataclasses.asdict(x).items()}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float):
        return round(x, 5)
    return x if isinstance(x, (str, int, bool, type(None))) else str(x)


def summary(result: dict) -> str:
    def best(v):
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v:
            return best(v[0])
        if isinstance(v, dict):
            for k in ("text", "latin", "best", "candidates", "units"):
                if k in v:
                    return best(v[k])
        return str(v)[:20]
    return ", ".join(best(v) for v in list(result.values())[:5])
