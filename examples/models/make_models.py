#!/usr/bin/env python3
"""Writes the small example models in this folder, deterministically.

    python3 examples/models/make_models.py

Needs `onnx` (tested with 1.22.0) and numpy. Models:

  mnist-cnn.onnx  image float32 [1,1,28,28] -> Conv -> BatchNormalization -> Relu -> MaxPool
                  -> Conv -> Relu -> AveragePool -> GlobalAveragePool -> Flatten -> Gemm
                  -> Softmax -> probabilities [1,10]
  add.onnx        a + b (float32 [1,4]) -> sum
  mlp-int.onnx    x float32 [2,3,4] -> Shape -> Gather -> Unsqueeze -> Concat([n, -1])
                  -> Reshape -> MatMul -> Add -> Relu -> Cast(int64) -> y int64 [2,5];
                  second output `shape` (int64 [3]) from the Shape node

All use opset 17 and IR version 8. If onnxruntime is installed, each model also gets reference
data next to it: `<model>.input.<name>.npy` (a fixed random input) and
`<model>.output.<name>.npy` (what onnxruntime computes from it), with characters other than
[A-Za-z0-9._-] in names replaced by `_`.

mlp-int's weights and inputs are multiples of 1/4 and 1/2, so every product and sum in it is
exact in float32: its int64 output does not depend on summation order or rounding.
"""

import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17
IR_VERSION = 8
SEED = 20250101


def make_model(graph):
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="epx-examples",
        producer_version="1",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def init(name, array):
    return numpy_helper.from_array(np.array(array, order="C"), name)


def mnist_cnn(rng):
    f32 = np.float32
    w1 = rng.normal(0, 0.5, (8, 1, 3, 3)).astype(f32)
    b1 = rng.normal(0, 0.1, (8,)).astype(f32)
    scale = rng.uniform(0.5, 1.5, (8,)).astype(f32)
    bias = rng.normal(0, 0.1, (8,)).astype(f32)
    mean = rng.normal(0, 0.1, (8,)).astype(f32)
    var = rng.uniform(0.5, 1.5, (8,)).astype(f32)
    w2 = rng.normal(0, 0.2, (16, 8, 3, 3)).astype(f32)
    b2 = rng.normal(0, 0.1, (16,)).astype(f32)
    fc_w = rng.normal(0, 0.5, (10, 16)).astype(f32)
    fc_b = rng.normal(0, 0.1, (10,)).astype(f32)
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["conv1"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization",
                         ["conv1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"], ["bn1"],
                         name="bn1", epsilon=1e-5),
        helper.make_node("Relu", ["bn1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool1", "conv2.w", "conv2.b"], ["conv2"], name="conv2",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("AveragePool", ["relu2"], ["pool2"], name="pool2",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["pool2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mnist-cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 10])],
        initializer=[
            init("conv1.w", w1), init("conv1.b", b1),
            init("bn1.scale", scale), init("bn1.bias", bias),
            init("bn1.mean", mean), init("bn1.var", var),
            init("conv2.w", w2), init("conv2.b", b2),
            init("fc.w", fc_w), init("fc.b", fc_b),
        ],
    )
    inputs = {"image": rng.uniform(0, 1, (1, 1, 28, 28)).astype(f32)}
    return make_model(graph), inputs


def add(rng):
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "add",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4]),
        ],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, [1, 4])],
    )
    inputs = {
        "a": rng.normal(0, 1, (1, 4)).astype(np.float32),
        "b": rng.normal(0, 1, (1, 4)).astype(np.float32),
    }
    return make_model(graph), inputs


def mlp_int(rng):
    # Multiples of 1/4 (weights) and 1/2 (inputs): all arithmetic below is exact in float32.
    w = (rng.integers(-8, 9, (12, 5)) / 4).astype(np.float32)
    b = (rng.integers(-8, 9, (5,)) / 4).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"], name="unsqueeze"),
        helper.make_node("Concat", ["batch1", "minus_one"], ["new_shape"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["flat"], name="reshape"),
        helper.make_node("MatMul", ["flat", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "b"], ["biased"], name="add"),
        helper.make_node("Relu", ["biased"], ["relu"], name="relu"),
        helper.make_node("Cast", ["relu"], ["y"], name="cast", to=TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp-int",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.INT64, [2, 5]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [3]),
        ],
        initializer=[
            init("zero", np.array(0, dtype=np.int64)),
            init("axes0", np.array([0], dtype=np.int64)),
            init("minus_one", np.array([-1], dtype=np.int64)),
            init("w", w),
            init("b", b),
        ],
    )
    inputs = {"x": (rng.integers(-6, 7, (2, 3, 4)) / 2).astype(np.float32)}
    return make_model(graph), inputs


def sanitize(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def main():
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("onnxruntime is not installed: writing models without reference data",
              file=sys.stderr)

    for stem, build in [("mnist-cnn", mnist_cnn), ("add", add), ("mlp-int", mlp_int)]:
        # One generator per model, so that each model's contents depend only on its own code.
        rng = np.random.default_rng([SEED, sum(stem.encode())])
        model, inputs = build(rng)
        path = os.path.join(HERE, stem + ".onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        written = [path]
        if ort is not None:
            sess = ort.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            outputs = sess.run(names, inputs)
            for kind, named in [("input", inputs.items()), ("output", zip(names, outputs))]:
                for name, value in named:
                    p = os.path.join(HERE, f"{stem}.{kind}.{sanitize(name)}.npy")
                    np.save(p, np.array(value, order="C"), allow_pickle=False)
                    written.append(p)
        for p in written:
            size = os.path.getsize(p)
            assert size < 100_000, f"{p} is {size} bytes"
    print(f"wrote models to {os.path.relpath(HERE)}")


if __name__ == "__main__":
    main()
