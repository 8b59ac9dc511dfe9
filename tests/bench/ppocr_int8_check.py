#!/usr/bin/env python3
"""Compares epx with ONNX Runtime on PP-OCRv4's recognizer quantized by
`onnxruntime.quantization.quantize_dynamic` (int8 weights), on a text-like input.

Dynamic quantization requantizes every float result, so a float op that rounds its last bit
differently from ONNX Runtime shows up here as a whole quantization step: this is the check
behind the rounding decisions in docs/decisions.md.

    bash tests/bench/fetch-models.sh
    python3 -m venv /tmp/v && /tmp/v/bin/pip install onnx==1.22.0 onnxruntime==1.31.1 numpy
    cargo build -p epx-cli
    /tmp/v/bin/python tests/bench/ppocr_int8_check.py [path/to/epx]

Prints the largest difference of the output probabilities from ONNX Runtime's, with its graph
optimizations at the basic level (the graph as written) and at the default level (where it fuses
LayerNormalization and friends, which rounds differently again), and between those two.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.shape_inference import quant_pre_process

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SRC = os.path.join(ROOT, ".testdata", "bench-models", "ch_PP-OCRv4_rec_infer.onnx")


def text_like_image(rng):
    """Dark strokes on a light, noisy background, normalized to [-1, 1] as PaddleOCR does."""
    img = np.ones((48, 320), np.float32)
    for k in range(12):
        x0 = 10 + k * 25
        img[12:36, x0 : x0 + 3] = 0.1
        img[12:15, x0 : x0 + 15] = 0.1
    img += rng.normal(0, 0.05, img.shape).astype(np.float32)
    return np.repeat(((img - 0.5) / 0.5)[None, None], 3, axis=1).astype(np.float32)


def main():
    epx = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "epx")
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "rec.pre.onnx")
        quantized = os.path.join(tmp, "rec.int8.onnx")
        # Constant folding first, or the quantizer finds convolution weights it cannot read.
        quant_pre_process(SRC, pre, skip_symbolic_shape=True)
        quantize_dynamic(pre, quantized, weight_type=QuantType.QInt8)
        x = text_like_image(np.random.default_rng(5))
        np.save(os.path.join(tmp, "x.npy"), x)
        refs = {}
        for level in ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"]:
            so = ort.SessionOptions()
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
            sess = ort.InferenceSession(quantized, so, providers=["CPUExecutionProvider"])
            name = sess.get_inputs()[0].name
            (refs[level],) = sess.run(None, {name: x})
        out_dir = os.path.join(tmp, "out")
        subprocess.run(
            [epx, "run", quantized, "--input", f"{name}={tmp}/x.npy", "--output-dir", out_dir],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (got_file,) = os.listdir(out_dir)
        got = np.load(os.path.join(out_dir, got_file))
        for level, want in refs.items():
            print(
                f"PP-OCRv4 rec, dynamic int8, epx vs ONNX Runtime at {level}: largest difference "
                f"{np.abs(got - want).max():.3g} (output range {np.ptp(want):.3g}); argmax agrees "
                f"on {np.mean(got.argmax(-1) == want.argmax(-1)):.0%} of positions"
            )
        basic, full = refs["ORT_ENABLE_BASIC"], refs["ORT_ENABLE_ALL"]
        print(f"ONNX Runtime ORT_ENABLE_BASIC vs ORT_ENABLE_ALL: {np.abs(basic - full).max():.3g}")


if __name__ == "__main__":
    main()
