#!/usr/bin/env python3
"""Writes `float16-overflow.onnx` and `float16-gather.onnx` in this folder, with fixed inputs and
ONNX Runtime's outputs.

A float32 network written with onnx's helpers (Conv, Relu, Mul by 1000, Add -65000, Mul by
0.001, Sigmoid: no pattern ONNX Runtime fuses into the Conv's weights), converted to float16 by `onnxconverter_common.float16.convert_float_to_float16` with
float32 inputs and outputs kept. After the first Mul its values pass float16's largest finite
value (65504): rounded to float16 after every node they become infinity, and the output 1.0
(or NaN).
ONNX Runtime's CPU EP computes between the model's edges in float32 and gives finite values;
so must epx.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install onnx==1.22.0 onnxruntime==1.31.1 \
        onnxconverter-common==1.16.0 numpy
    /tmp/v/bin/python tests/models/make_float16.py
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "float16-overflow"


def main():
    rng = np.random.default_rng(16)
    w = (rng.random((4, 3, 3, 3), dtype=np.float32) * 12.0).astype(np.float32)
    bias = rng.random(4, dtype=np.float32) - 0.5
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(1000.0, np.float32), "big"),
        numpy_helper.from_array(np.array(0.001, np.float32), "small"),
        numpy_helper.from_array(np.full((4, 1, 1), -65000.0, np.float32), "shift"),
        numpy_helper.from_array(bias, "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Mul", ["r", "big"], ["m"]),
        helper.make_node("Add", ["m", "shift"], ["a"]),
        helper.make_node("Mul", ["a", "small"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        NAME,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.random((1, 3, 6, 6), dtype=np.float32)
    # The Conv's output in float32, to show that the float16 model overflows in between.
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    c = ort.InferenceSession(probe.SerializeToString()).run(["c"], {"x": x})[0]
    model = float16.convert_float_to_float16(model, max_finite_val=65504.0, keep_io_types=True)
    onnx.checker.check_model(model)
    path = os.path.join(HERE, f"{NAME}.onnx")
    onnx.save(model, path)
    y = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # Elements whose `c · 1000` overflows float16 but whose answer is not 1.
    shown = int(((c * 1000 > 65504) & (y < 0.99)).sum())
    assert np.isfinite(y).all() and shown > 0, "the model does not show the overflow"
    print(f"{NAME}: {shown} of {y.size} outputs pass through a float16 overflow")
    np.save(os.path.join(HERE, f"{NAME}.input.x.npy"), x)
    np.save(os.path.join(HERE, f"{NAME}.output.y.npy"), y)
    print(f"{NAME}: y in [{y.min():.4f}, {y.max():.4f}]")


def gather_tables():
    """`float16-gather.onnx`: a float16 table that only a Gather reads (kept float16 by the CPU
    EP, the gathered rows widened) and one that a Gather and an Add read (widened whole)."""
    name = "float16-gather"
    rng = np.random.default_rng(17)
    table = (rng.random((40, 6), dtype=np.float32) * 8.0 - 4.0).astype(np.float32)
    shared = (rng.random((4, 6), dtype=np.float32) - 0.5).astype(np.float32)
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(shared, "shared"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("Mul", ["rows", "three"], ["y"]),
        helper.make_node("Gather", ["shared", "idx"], ["picked"]),
        helper.make_node("Add", ["picked", "shared"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 6]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 6]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = float16.convert_float_to_float16(model, keep_io_types=True)
    onnx.checker.check_model(model)
    path = os.path.join(HERE, f"{name}.onnx")
    onnx.save(model, path)
    feeds = {
        "ids": rng.integers(0, 40, size=(2, 5), dtype=np.int64),
        "idx": np.array([3, 0, 2, 2], np.int64),
    }
    y, z = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for k, v in feeds.items():
        np.save(os.path.join(HERE, f"{name}.input.{k}.npy"), v)
    np.save(os.path.join(HERE, f"{name}.output.y.npy"), y)
    np.save(os.path.join(HERE, f"{name}.output.z.npy"), z)
    print(f"{name}: y {y.shape}, z {z.shape}")


if __name__ == "__main__":
    main()
    gather_tables()
