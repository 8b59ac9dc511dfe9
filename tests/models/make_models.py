#!/usr/bin/env python3
"""Writes the test models in this folder: models as ONNX Runtime saves them after its own graph
optimizations (`SessionOptions.optimized_model_filepath`), so that they carry its `com.microsoft`
operators, each with a fixed input and ONNX Runtime's output for it.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install onnx==1.22.0 onnxruntime==1.31.1 numpy sympy
    /tmp/v/bin/python tests/models/make_models.py

Files: `<model>.onnx`, `<model>.input.<name>.npy`, `<model>.output.<name>.npy`. Models:

  ort-opt-mnist-cnn   examples/models/mnist-cnn.onnx at the extended level: FusedConv (Relu)
  ort-opt-mlp-int     examples/models/mlp-int.onnx at the extended level: FusedGemm (Relu)
  ort-opt-encoder     a one-layer transformer encoder written with onnx's helpers at opset 13
                      (LayerNorm, GELU and attention spelled out in primitive ops), then fused
                      at the extended level: LayerNormalization, SkipLayerNormalization, Gelu /
                      BiasGelu, FusedMatMul
  ort-transformers-encoder  the same encoder through ONNX Runtime's transformer optimizer
                      (`onnxruntime.transformers.optimizer`, model_type bert), then saved at the
                      extended level: SkipLayerNormalization, BiasGelu
"""

import collections
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "models")
SEED = 20261201


def safe(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def optimize(src, name, inputs):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    path = os.path.join(HERE, f"{name}.onnx")
    so.optimized_model_filepath = path
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outputs = sess.run(None, inputs)
    for k, v in inputs.items():
        np.save(os.path.join(HERE, f"{name}.input.{safe(k)}.npy"), v)
    for o, v in zip(sess.get_outputs(), outputs):
        np.save(os.path.join(HERE, f"{name}.output.{safe(o.name)}.npy"), v)
    m = onnx.load(path)
    ops = collections.Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in m.graph.node)
    print(f"{name}: {dict(ops)}")


def encoder():
    rng = np.random.default_rng(SEED)
    S, D, F, H = 8, 16, 32, 2
    inits = []

    def w(name, *shape, scale=0.2):
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        inits.append(numpy_helper.from_array(a, name))
        return name

    def c(name, value):
        inits.append(numpy_helper.from_array(np.array(value, dtype=np.float32), name))
        return name

    nodes = []

    def n(op, ins, outs, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **attrs))
        return outs[0]

    def layer_norm(x, p):
        mean = n("ReduceMean", [x], [f"{p}_mean"], axes=[-1])
        d = n("Sub", [x, mean], [f"{p}_d"])
        sq = n("Pow", [d, c(f"{p}_two", 2.0)], [f"{p}_sq"])
        var = n("ReduceMean", [sq], [f"{p}_var"], axes=[-1])
        ve = n("Add", [var, c(f"{p}_eps", 1e-5)], [f"{p}_ve"])
        sd = n("Sqrt", [ve], [f"{p}_sd"])
        nm = n("Div", [d, sd], [f"{p}_nm"])
        g = n("Mul", [nm, w(f"{p}_gamma", D, scale=1.0)], [f"{p}_g"])
        return n("Add", [g, w(f"{p}_beta", D)], [f"{p}_out"])

    x = layer_norm("x", "ln0")
    # Self-attention with the heads spelled out.
    q = n("Add", [n("MatMul", [x, w("wq", D, D)], ["q0"]), w("bq", D)], ["q"])
    k = n("Add", [n("MatMul", [x, w("wk", D, D)], ["k0"]), w("bk", D)], ["k"])
    v = n("Add", [n("MatMul", [x, w("wv", D, D)], ["v0"]), w("bv", D)], ["v"])
    shape = "heads_shape"
    inits.append(numpy_helper.from_array(np.array([S, H, D // H], np.int64), shape))
    qh = n("Transpose", [n("Reshape", [q, shape], ["qr"])], ["qh"], perm=[1, 0, 2])
    kh = n("Transpose", [n("Reshape", [k, shape], ["kr"])], ["kh"], perm=[1, 2, 0])
    vh = n("Transpose", [n("Reshape", [v, shape], ["vr"])], ["vh"], perm=[1, 0, 2])
    scores = n("Mul", [n("MatMul", [qh, kh], ["qk"]), c("scale", 1.0 / np.sqrt(D // H))], ["scores"])
    probs = n("Softmax", [scores], ["probs"], axis=-1)
    ctx = n("Transpose", [n("MatMul", [probs, vh], ["ctx0"])], ["ctx1"], perm=[1, 0, 2])
    inits.append(numpy_helper.from_array(np.array([S, D], np.int64), "flat_shape"))
    ctx = n("Reshape", [ctx, "flat_shape"], ["ctx"])
    attn = n("Add", [n("MatMul", [ctx, w("wo", D, D)], ["o0"]), w("bo", D)], ["attn"])
    h = layer_norm(n("Add", [attn, x], ["res1"]), "ln1")
    # Feed-forward with the erf GELU spelled out, and a MatMul against a transposed weight.
    f = n("Add", [n("MatMul", [h, w("w1", D, F)], ["f0"]), w("b1", F)], ["f"])
    e = n("Erf", [n("Div", [f, c("sqrt2", np.sqrt(2.0))], ["fd"])], ["fe"])
    gelu = n("Mul", [n("Mul", [f, n("Add", [e, c("one", 1.0)], ["fe1"])], ["fm"]), c("half", 0.5)], ["gelu"])
    w2t = n("Transpose", [w("w2", F, D)], ["w2t"], perm=[1, 0])
    f2 = n("Add", [n("MatMul", [gelu, n("Transpose", [w2t], ["w2tt"], perm=[1, 0])], ["g0"]), w("b2", D)], ["f2"])
    y = layer_norm(n("Add", [f2, h], ["res2"]), "ln2")
    n("Identity", [y], ["y"])
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [S, D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    model.producer_name = "epx tests/models/make_models.py"
    onnx.checker.check_model(model)
    src = os.path.join(HERE, "encoder.src.onnx")
    onnx.save(model, src)
    inputs = {"x": rng.standard_normal((S, D)).astype(np.float32)}
    optimize(src, "ort-opt-encoder", inputs)
    # ONNX Runtime's transformer optimizer, as used on BERT-like exports.
    from onnxruntime.transformers.optimizer import optimize_model
    fused = optimize_model(src, model_type="bert", num_heads=H, hidden_size=D, opt_level=0)
    fused_src = os.path.join(HERE, "encoder.fused.onnx")
    fused.save_model_to_file(fused_src)
    optimize(fused_src, "ort-transformers-encoder", inputs)
    os.remove(src)
    os.remove(fused_src)


def main():
    rng = np.random.default_rng(SEED)
    optimize(os.path.join(EXAMPLES, "mnist-cnn.onnx"), "ort-opt-mnist-cnn",
             {"image": rng.random((1, 1, 28, 28), dtype=np.float32)})
    optimize(os.path.join(EXAMPLES, "mlp-int.onnx"), "ort-opt-mlp-int",
             {"x": np.load(os.path.join(EXAMPLES, "mlp-int.input.x.npy"))})
    encoder()


if __name__ == "__main__":
    main()
