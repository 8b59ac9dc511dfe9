"""A real third-party package written for ONNX Runtime, run unchanged on epx.

RapidOCR (`rapidocr_onnxruntime` from PyPI) imports `onnxruntime` and runs its three PP-OCR
models (text detection, direction classification, recognition) through `InferenceSession`,
`SessionOptions`, `get_available_providers`, `get_device` and `get_modelmeta` (the recognizer's
character set is in the model's metadata). The test draws an image with text, runs the whole
pipeline once with ONNX Runtime and once with `epx.onnxruntime` installed in its place, each in
a fresh interpreter, and compares what they read.
"""

import json

import pytest

from conftest import python

pytest.importorskip("rapidocr_onnxruntime", reason="rapidocr_onnxruntime is not installed")
pytest.importorskip("PIL", reason="Pillow is not installed")

PIPELINE = """
import json, sys
{switch}
import numpy as np
from PIL import Image, ImageDraw, ImageFont
from rapidocr_onnxruntime import RapidOCR
import onnxruntime

img = Image.new("RGB", (560, 200), "white")
draw = ImageDraw.Draw(img)
font = ImageFont.load_default(size=44)
draw.text((24, 24), "epx runs ONNX", fill="black", font=font)
draw.text((24, 110), "Model 2026", fill=(20, 20, 90), font=font)
engine = RapidOCR()
result, _ = engine(np.asarray(img))
print(json.dumps({{"engine": onnxruntime.__name__,
                   "lines": [[box, text, float(score)] for box, text, score in result or []]}}))
"""


def read(switch):
    out = python(PIPELINE.format(switch=switch))
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_rapidocr_reads_the_same_text_on_epx_as_on_onnxruntime():
    want = read("")
    got = read("import epx.onnxruntime; epx.onnxruntime.install()")
    assert want["engine"] == "onnxruntime" and got["engine"] == "epx.onnxruntime"
    texts = [line[1] for line in want["lines"]]
    # The image reads back (PP-OCR's Chinese models may drop the spaces).
    joined = " ".join(texts).replace(" ", "")
    assert "epxrunsONNX" in joined and "Model2026" in joined, texts
    assert [line[1] for line in got["lines"]] == texts
    for (wbox, _, wscore), (gbox, _, gscore) in zip(want["lines"], got["lines"]):
        assert abs(wscore - gscore) <= 1e-4, (wscore, gscore)
        for wp, gp in zip(wbox, gbox):
            assert all(abs(a - b) <= 1.0 for a, b in zip(wp, gp)), (wbox, gbox)
