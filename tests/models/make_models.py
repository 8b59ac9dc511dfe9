#!/usr/bin/env python3
"""Writes the test models in this folder: models as ONNX Runtime saves them after its own graph
optimizations (`SessionOptions.optimized_model_filepath`), so that they carry its `com.microsoft`
operators, each with a fixed input and ONNX Runtime's output for it.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install onnx==1.22.0 onnxruntime==1.31.1 numpy sympy \
        onnx_ir
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
  dynamic-int8-ocr-block  a block in the style of PP-OCR's recognizer (a squeeze-and-excite
                      GlobalAveragePool, HardSigmoid, a [3, 2] AveragePool, Swish), quantized by
                      `onnxruntime.quantization.quantize_dynamic` with int8 weights: every
                      float result is requantized by DynamicQuantizeLinear, so an op that
                      rounds differently from ONNX Runtime moves the output by whole steps
  ort-qoperator-cnn   a small CNN quantized by `quantize_static` in the QOperator format:
                      QLinearConv, QLinearMatMul and ONNX Runtime's QLinearAdd, QLinearMul,
                      QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool, QLinearConcat,
                      QLinearGlobalAveragePool
  ort-qdq-cnn         a small CNN (Conv with bias, a residual Add, Mul, Transpose and Reshape,
                      MatMul) quantized by `quantize_static` in the QDQ format with per-channel
                      int8 weights: the DequantizeLinear / QuantizeLinear pairs that ONNX
                      Runtime folds into QLinearConv, QLinearMatMul, QLinearAdd and QLinearMul
  ort-qdq-movers      a small CNN in the QDQ format whose MaxPool, nearest Resize, a Div by a
                      float constant and GlobalAveragePool sit between DequantizeLinear /
                      QuantizeLinear pairs (of the same parameters around the first two)
  ort-opt-dynamic-mlp an MLP quantized by `quantize_dynamic` (int8 weights), then saved at the
                      extended level: DynamicQuantizeMatMul
  ort-matmul-nbits-asym / -sym  a two-layer MLP with its weights quantized to int4 blocks of
                      16 by ONNX Runtime's `MatMulNBitsQuantizer` (asymmetric: packed zero
                      points; symmetric: the default zero point 8): MatMulNBits
  ort-contrib-transformer  a transformer layer written with ONNX Runtime's own operators, as
                      its transformer tools and LLM exports write them: EmbedLayerNormalization
                      (its mask_index feeding Attention), Attention with packed QKV weights,
                      MultiHeadAttention (bias, key padding mask; causal), RotaryEmbedding
  ort-mha-past / -causal  MultiHeadAttention over past_key / past_value (the KV cache of
                      decoder exports), plain and causal
  ort-gqa-*           GroupQueryAttention as LLM exports use it (4 query heads over 2 KV heads):
                      a first prompt, with rotary embedding, one decoding step over a KV
                      cache of sequences of different lengths, and a local window
  ort-nested-constants  an If whose branches rearrange an initializer of the enclosing graph
                      (Slice, Concat, Transpose) before using it, as exporters of recurrent
                      layers write it: work on constants that runs once, not on every run
  ort-conv-bn         Conv (with and without bias) then an inference BatchNormalization, as
                      exporters of CNNs write them, and one Conv output also read elsewhere:
                      folded into the Conv's weights where the Conv's output has no other use
  ort-channels-last-cnn  a CNN as converters from channels-last frameworks write it: each Conv
                      between Transposes to NCHW and back, its bias and a normalization as
                      Add / Sub / Mul on the NHWC tensor, a residual sum, Pad, MaxPool between
                      Transposes, a Concat and a mean over H and W; the NHWC block output is a
                      model output too
  ort-rounding        Sigmoid, GlobalAveragePool and a [3, 2] AveragePool on many values:
                      the float ops whose last bits the block above depends on, each of which
                      must give ONNX Runtime's results bit for bit (its NCHW kernels)
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


def save_with_ort(model, name, inputs):
    """Saves `model` as `<name>.onnx` with `inputs` and ONNX Runtime's outputs for them."""
    path = os.path.join(HERE, f"{name}.onnx")
    onnx.save(model, path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for k, v in inputs.items():
        np.save(os.path.join(HERE, f"{name}.input.{k}.npy"), v)
    for o, v in zip(sess.get_outputs(), sess.run(None, inputs)):
        np.save(os.path.join(HERE, f"{name}.output.{o.name}.npy"), v)


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


def dynamic_int8_block():
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(SEED)
    C, E = 16, 8

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c0"], ["h0"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["c0", "h0"], ["a0"]),
        # Squeeze and excite.
        helper.make_node("GlobalAveragePool", ["a0"], ["g"]),
        helper.make_node("Conv", ["g", "w1"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["s2"]),
        helper.make_node("HardSigmoid", ["s2"], ["h2"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["a0", "h2"], ["a1"]),
        helper.make_node("AveragePool", ["a1"], ["p"], kernel_shape=[3, 2], strides=[3, 2]),
        helper.make_node("Conv", ["p", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c3"], ["sg"]),
        helper.make_node("Mul", ["c3", "sg"], ["sw"]),
        helper.make_node("Conv", ["sw", "w4"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic_int8_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 48, 160])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w("w0", C, 3, 3, 3), w("w1", E, C, 1, 1), w("w2", C, E, 1, 1),
         w("w3", C, C, 3, 3, scale=0.1), w("w4", 4, C, 1, 1)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    src = os.path.join(HERE, "block.src.onnx")
    onnx.save(model, src)
    path = os.path.join(HERE, "dynamic-int8-ocr-block.onnx")
    quantize_dynamic(src, path, weight_type=QuantType.QInt8)
    os.remove(src)
    # Dark strokes on a light, noisy background, normalized to [-1, 1] as PaddleOCR does.
    img = np.ones((48, 160), np.float32)
    for k in range(12):
        img[12:36, 4 + 13 * k : 7 + 13 * k] = 0.1
        img[12:15, 4 + 13 * k : 14 + 13 * k] = 0.1
    img += rng.normal(0, 0.05, img.shape).astype(np.float32)
    x = np.repeat(((img - 0.5) / 0.5)[None, None], 3, axis=1).astype(np.float32)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x})
    np.save(os.path.join(HERE, "dynamic-int8-ocr-block.input.x.npy"), x)
    np.save(os.path.join(HERE, "dynamic-int8-ocr-block.output.y.npy"), y)
    ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
    print(f"dynamic-int8-ocr-block: {dict(ops)}")


def rounding():
    rng = np.random.default_rng(SEED)
    nodes = [
        helper.make_node("Sigmoid", ["s"], ["sigmoid"]),
        helper.make_node("GlobalAveragePool", ["p"], ["global_average"]),
        helper.make_node("AveragePool", ["p"], ["average"], kernel_shape=[3, 2], strides=[3, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "ort_rounding",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [4096]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 32, 12, 41])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
         for n in ["sigmoid", "global_average", "average"]],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = os.path.join(HERE, "ort-rounding.onnx")
    onnx.save(model, path)
    inputs = {
        "s": np.concatenate([np.linspace(-20, 20, 2048), rng.normal(0, 4, 2048)]).astype(np.float32),
        "p": rng.normal(0, 1, (1, 32, 12, 41)).astype(np.float32),
    }
    # Its NCHW kernels: at ORT_ENABLE_ALL its NCHWc layout rewrite sums pools channel-blocked,
    # in yet another order (the dynamic-int8 block has no float Conv, so no rewrite applies).
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for k, v in inputs.items():
        np.save(os.path.join(HERE, f"ort-rounding.input.{k}.npy"), v)
    for o, v in zip(sess.get_outputs(), sess.run(None, inputs)):
        np.save(os.path.join(HERE, f"ort-rounding.output.{o.name}.npy"), v)


def nested_constants():
    rng = np.random.default_rng(SEED)
    w = rng.normal(0, 1, (6, 4)).astype(np.float32)
    ints = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)

    def branch(name, combine):
        nodes = [
            helper.make_node("Slice", ["w", f"{name}_s0", f"{name}_e0"], [f"{name}_top"]),
            helper.make_node("Slice", ["w", f"{name}_s1", f"{name}_e1"], [f"{name}_bottom"]),
            helper.make_node("Concat", [f"{name}_bottom", f"{name}_top"], [f"{name}_swapped"],
                             axis=0),
            helper.make_node("Transpose", [f"{name}_swapped"], [f"{name}_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", f"{name}_t"], [f"{name}_y"]),
            helper.make_node(combine, [f"{name}_y", f"{name}_c"], [f"{name}_out"]),
        ]
        inits = [ints(f"{name}_s0", [0]), ints(f"{name}_e0", [3]),
                 ints(f"{name}_s1", [3]), ints(f"{name}_e1", [6]),
                 numpy_helper.from_array(np.array(0.5, dtype=np.float32), f"{name}_c")]
        return helper.make_graph(
            nodes, name, [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [6, 6])], inits)

    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Add"),
                          else_branch=branch("else", "Sub"))],
        "ort_nested_constants",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    inputs = {"cond": np.array(True), "x": rng.normal(0, 1, (6, 4)).astype(np.float32)}
    save_with_ort(model, "ort-nested-constants", inputs)


def conv_batch_norm():
    rng = np.random.default_rng(SEED)
    f32 = lambda *shape: rng.normal(0, 1, shape).astype(np.float32)

    def bn(name, c):
        return [numpy_helper.from_array(f32(c), f"{name}_gamma"),
                numpy_helper.from_array(f32(c), f"{name}_beta"),
                numpy_helper.from_array(f32(c), f"{name}_mean"),
                numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32),
                                        f"{name}_var")]

    def bn_node(name, x, y, **attrs):
        return helper.make_node(
            "BatchNormalization",
            [x, f"{name}_gamma", f"{name}_beta", f"{name}_mean", f"{name}_var"], [y], **attrs)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        bn_node("bn1", "c1", "n1", epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2]),
        bn_node("bn2", "c2", "n2"),
        # c3 is read twice: the normalization cannot go into the Conv's weights.
        helper.make_node("Conv", ["n2", "w3"], ["c3"], group=2),
        bn_node("bn3", "c3", "n3"),
        helper.make_node("Add", ["n3", "c3"], ["y"]),
    ]
    inits = ([numpy_helper.from_array(f32(8, 3, 3, 3), "w1"),
              numpy_helper.from_array(f32(8), "b1"),
              numpy_helper.from_array(f32(6, 8, 1, 1), "w2"),
              numpy_helper.from_array(f32(6, 3, 3, 3), "w3")]
             + bn("bn1", 8) + bn("bn2", 6) + bn("bn3", 6))
    graph = helper.make_graph(
        nodes, "ort_conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    onnx.checker.check_model(model)
    save_with_ort(model, "ort-conv-bn", {"x": f32(1, 3, 12, 12)})


def channels_last_cnn():
    rng = np.random.default_rng(SEED)
    f32 = lambda *shape: rng.normal(0, 1, shape).astype(np.float32)
    nchw, nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    T = lambda x, y, perm: helper.make_node("Transpose", [x], [y], perm=perm)
    nodes = [
        T("x", "x_t", nchw),
        helper.make_node("Conv", ["x_t", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        T("c1", "c1_t", nhwc),
        helper.make_node("Add", ["c1_t", "b1"], ["a1"]),
        helper.make_node("Sub", ["a1", "mean1"], ["s1"]),
        helper.make_node("Mul", ["s1", "scale1"], ["m1"]),
        helper.make_node("Add", ["m1", "shift1"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        T("r1", "r1_t", nchw),
        helper.make_node("Conv", ["r1_t", "w2"], ["c2"]),
        T("c2", "c2_t", nhwc),
        helper.make_node("Add", ["c2_t", "b2"], ["a2"]),
        helper.make_node("Add", ["a2", "r1"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["feat"]),
        helper.make_node("Pad", ["feat", "pads"], ["p"]),
        T("p", "p_t", nchw),
        helper.make_node("MaxPool", ["p_t"], ["mp"], kernel_shape=[3, 3], strides=[2, 2]),
        T("mp", "mp_t", nhwc),
        helper.make_node("Sigmoid", ["mp_t"], ["g"]),
        helper.make_node("Concat", ["mp_t", "g"], ["cat"], axis=3),
        helper.make_node("ReduceMean", ["cat"], ["y"], axes=[1, 2], keepdims=0),
    ]
    inits = [numpy_helper.from_array(f32(8, 3, 3, 3), "w1"),
             numpy_helper.from_array(f32(8), "b1"),
             numpy_helper.from_array(f32(1, 1, 1, 8), "mean1"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, (8,)).astype(np.float32), "scale1"),
             numpy_helper.from_array(f32(1, 1, 1, 8), "shift1"),
             numpy_helper.from_array(f32(8, 8, 1, 1), "w2"),
             numpy_helper.from_array(f32(8), "b2"),
             numpy_helper.from_array(np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int64), "pads")]
    graph = helper.make_graph(
        nodes, "ort_channels_last_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 10, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 10, 10, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    save_with_ort(model, "ort-channels-last-cnn", {"x": f32(1, 10, 10, 3)})


def quantized_cnn(name, nodes, inits, rng, **options):
    """Writes `<name>.onnx`: the float CNN `nodes` / `inits` (input x [1, 3, 16, 16], output y
    [1, 5]) quantized by `quantize_static` with `options`, calibrated on 8 inputs from `rng`;
    then one input from `rng` and ONNX Runtime's output for it."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    graph = helper.make_graph(
        nodes,
        name.removeprefix("ort-").replace("-", "_"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src = os.path.join(HERE, f"{name}.src.onnx")
    onnx.save(model, src)

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(
                [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
            )

        def get_next(self):
            return next(self.batches, None)

    path = os.path.join(HERE, f"{name}.onnx")
    quantize_static(src, path, Calibration(), **options)
    os.remove(src)
    x = rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.save(os.path.join(HERE, f"{name}.input.x.npy"), x)
    np.save(os.path.join(HERE, f"{name}.output.y.npy"), y)
    ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
    print(f"{name}: {dict(ops)}")


def qoperator_cnn():
    from onnxruntime.quantization import QuantFormat, QuantType

    rng = np.random.default_rng(SEED)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c0"], ["l0"], alpha=0.1),
        helper.make_node("Conv", ["l0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "l0"], ["a1"]),
        helper.make_node("Sigmoid", ["a1"], ["s1"]),
        helper.make_node("Mul", ["a1", "s1"], ["m1"]),
        helper.make_node("AveragePool", ["m1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["p1", "c2"], ["k"], axis=1),
        helper.make_node("GlobalAveragePool", ["k"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["mm"]),
        helper.make_node("Add", ["mm", "b3"], ["y"]),
    ]
    inits = [w("w0", 8, 3, 3, 3), w("b0", 8, scale=0.1), w("w1", 8, 8, 3, 3, scale=0.1),
             w("b1", 8, scale=0.1), w("w2", 8, 8, 3, 3, scale=0.1), w("b2", 8, scale=0.1),
             w("w3", 16, 5), w("b3", 5, scale=0.1)]
    quantized_cnn("ort-qoperator-cnn", nodes, inits, rng, quant_format=QuantFormat.QOperator,
                  activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def qdq_cnn():
    from onnxruntime.quantization import QuantFormat, QuantType

    rng = np.random.default_rng(SEED + 1)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Add", ["c1", "r0"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], strides=[2, 2]),
        helper.make_node("Mul", ["c2", "c2"], ["m2"]),
        helper.make_node("Transpose", ["m2"], ["t2"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["t2", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["mm"]),
        helper.make_node("Add", ["mm", "b3"], ["y"]),
    ]
    inits = [w("w0", 8, 3, 3, 3), w("b0", 8, scale=0.1), w("w1", 8, 4, 3, 3, scale=0.2),
             w("b1", 8, scale=0.1), w("w2", 6, 8, 1, 1, scale=0.3), w("b2", 6, scale=0.1),
             numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape"),
             w("w3", 6 * 8 * 8, 5, scale=0.05), w("b3", 5, scale=0.1)]
    quantized_cnn("ort-qdq-cnn", nodes, inits, rng, quant_format=QuantFormat.QDQ,
                  per_channel=True, activation_type=QuantType.QUInt8,
                  weight_type=QuantType.QInt8)


def qdq_movers():
    from onnxruntime.quantization import QuantFormat, QuantType

    rng = np.random.default_rng(SEED + 2)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c1", "", "scales"], ["u1"], mode="nearest"),
        helper.make_node("Add", ["u1", "r0"], ["a1"]),
        helper.make_node("Div", ["a1", "six"], ["d1"]),
        helper.make_node("GlobalAveragePool", ["d1"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["mm"]),
        helper.make_node("Add", ["mm", "b3"], ["y"]),
    ]
    inits = [w("w0", 8, 3, 3, 3), w("b0", 8, scale=0.1), w("w1", 8, 8, 3, 3, scale=0.2),
             w("b1", 8, scale=0.1),
             numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales"),
             numpy_helper.from_array(np.array(6.0, dtype=np.float32), "six"),
             w("w3", 8, 5), w("b3", 5, scale=0.1)]
    quantized_cnn("ort-qdq-movers", nodes, inits, rng, quant_format=QuantFormat.QDQ,
                  activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def dynamic_mlp():
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(SEED)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"]),
        helper.make_node("Add", ["m0", "b0"], ["a0"]),
        helper.make_node("Relu", ["a0"], ["r0"]),
        helper.make_node("MatMul", ["r0", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w("w0", 16, 12), w("b0", 12, scale=0.1), w("w1", 12, 5), w("b1", 5, scale=0.1)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src = os.path.join(HERE, "dynamic_mlp.src.onnx")
    quantized = os.path.join(HERE, "dynamic_mlp.q.onnx")
    onnx.save(model, src)
    quantize_dynamic(src, quantized, weight_type=QuantType.QInt8)
    optimize(quantized, "ort-opt-dynamic-mlp",
             {"x": rng.normal(0, 1, (2, 6, 16)).astype(np.float32)})
    os.remove(src)
    os.remove(quantized)


def dynamic_lstm():
    """A bidirectional LSTM quantized by quantize_dynamic: ONNX Runtime's DynamicQuantizeLSTM
    (int8 weights, per-tensor scales; activations quantized to uint8 as it runs). Batch 1: with
    more rows, ONNX Runtime quantizes each thread's share of the batch on its own."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(SEED + 7)
    hidden, inp, seq = 8, 6, 5

    def w(name, *shape, scale=0.4):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h", "y_c"],
                            hidden_size=hidden, direction="bidirectional")
    graph = helper.make_graph(
        [node],
        "dynamic_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, inp])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
        [w("W", 2, 4 * hidden, inp), w("R", 2, 4 * hidden, hidden), w("B", 2, 8 * hidden, scale=0.1)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src = os.path.join(HERE, "dynamic_lstm.src.onnx")
    quantized = os.path.join(HERE, "dynamic_lstm.q.onnx")
    onnx.save(model, src)
    quantize_dynamic(src, quantized, weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM"])
    optimize(quantized, "ort-dynamic-quantize-lstm",
             {"x": rng.normal(0, 1, (seq, 1, inp)).astype(np.float32)})
    os.remove(src)
    os.remove(quantized)


def matmul_nbits():
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(SEED)

    def w(name, *shape):
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"]),
        helper.make_node("Relu", ["m0"], ["r0"]),
        helper.make_node("MatMul", ["r0", "w1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w("w0", 64, 48), w("w1", 48, 40)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.normal(0, 1, (2, 5, 64)).astype(np.float32)
    for name, symmetric in [("ort-matmul-nbits-asym", False), ("ort-matmul-nbits-sym", True)]:
        q = MatMulNBitsQuantizer(onnx.ModelProto.FromString(model.SerializeToString()),
                                 block_size=16, is_symmetric=symmetric)
        q.process()
        path = os.path.join(HERE, f"{name}.onnx")
        q.model.save_model_to_file(path)
        (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.save(os.path.join(HERE, f"{name}.input.x.npy"), x)
        np.save(os.path.join(HERE, f"{name}.output.y.npy"), y)
        ops = collections.Counter(n.op_type for n in onnx.load(path).graph.node)
        print(f"{name}: {dict(ops)}")


def contrib_transformer():
    rng = np.random.default_rng(SEED)
    B, S, H, N, V, P = 2, 5, 16, 2, 30, 12

    def f(*shape):
        return rng.normal(0, 0.5, shape).astype(np.float32)

    ms = "com.microsoft"
    nodes = [
        helper.make_node("EmbedLayerNormalization",
                         ["ids", "seg", "wemb", "pemb", "semb", "gamma", "beta", "mask"],
                         ["emb", "mask_index", "emb_sum"], domain=ms, epsilon=1e-5),
        helper.make_node("Attention", ["emb", "w", "bqkv", "mask_index"], ["att"], domain=ms,
                         num_heads=N),
        helper.make_node("MultiHeadAttention", ["att", "att", "att", "bmha", "kpm"], ["mha"],
                         domain=ms, num_heads=N),
        helper.make_node("RotaryEmbedding", ["mha", "pos", "cos", "sin"], ["rot"], domain=ms,
                         num_heads=N),
        helper.make_node("MultiHeadAttention", ["rot", "rot", "rot"], ["y"], domain=ms,
                         num_heads=N, unidirectional=1),
    ]
    freq = 1 / 10000 ** (np.arange(0, H // N, 2) / (H // N))
    angles = np.outer(np.arange(P), freq)
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("wemb", f(V, H)), ("pemb", f(P, H)), ("semb", f(2, H)), ("gamma", 1 + f(H)),
        ("beta", f(H)), ("w", f(H, 3 * H)), ("bqkv", f(3 * H)), ("bmha", f(3 * H)),
        ("cos", np.cos(angles).astype(np.float32)), ("sin", np.sin(angles).astype(np.float32))]]
    ints = lambda n, t: helper.make_tensor_value_info(n, t, [B, S])  # noqa: E731
    outs = ["y", "emb_sum", "mask_index", "att", "mha", "rot"]
    graph = helper.make_graph(
        nodes,
        "contrib_transformer",
        [ints("ids", TensorProto.INT32), ints("seg", TensorProto.INT32),
         ints("mask", TensorProto.INT32), ints("kpm", TensorProto.INT32),
         ints("pos", TensorProto.INT64)],
        [helper.make_tensor_value_info(o, TensorProto.INT32 if o == "mask_index"
                                       else TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ms, 1)], ir_version=8)
    feeds = {
        "ids": rng.integers(0, V, (B, S)).astype(np.int32),
        "seg": rng.integers(0, 2, (B, S)).astype(np.int32),
        "mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32),
        "kpm": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32),
        "pos": np.tile(np.arange(S), (B, 1)).astype(np.int64),
    }
    save_with_ort(model, "ort-contrib-transformer", feeds)


def gqa():
    rng = np.random.default_rng(SEED)
    B, N, KV, HD = 2, 4, 2, 16
    freq = 1 / 10000 ** (np.arange(0, HD, 2) / HD)
    angles = np.outer(np.arange(16), freq)
    caches = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
              numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]

    def one(name, s, rotary, past_len, seqlens, total, window=-1):
        inputs = ["q", "k", "v", "pk", "pv", "seqlens", "total"] + (["cos", "sin"] if rotary else [])
        node = helper.make_node("GroupQueryAttention", inputs, ["y", "present_key", "present_value"],
                                domain="com.microsoft", num_heads=N, kv_num_heads=KV,
                                do_rotary=int(rotary), local_window_size=window)
        vi = helper.make_tensor_value_info
        F, I = TensorProto.FLOAT, TensorProto.INT32
        graph = helper.make_graph(
            [node], "gqa",
            [vi("q", F, [B, s, N * HD]), vi("k", F, [B, s, KV * HD]), vi("v", F, [B, s, KV * HD]),
             vi("pk", F, [B, KV, past_len, HD]), vi("pv", F, [B, KV, past_len, HD]),
             vi("seqlens", I, [B]), vi("total", I, [])],
            [vi(o, F, None) for o in ["y", "present_key", "present_value"]],
            caches if rotary else [],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  ir_version=8)
        path = os.path.join(HERE, f"{name}.onnx")
        onnx.save(model, path)

        def f(*shape):
            return rng.normal(0, 1, shape).astype(np.float32)

        feeds = {"q": f(B, s, N * HD), "k": f(B, s, KV * HD), "v": f(B, s, KV * HD),
                 "pk": f(B, KV, past_len, HD), "pv": f(B, KV, past_len, HD),
                 "seqlens": np.array(seqlens, np.int32), "total": np.array(total, np.int32)}
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for k, v in feeds.items():
            np.save(os.path.join(HERE, f"{name}.input.{k}.npy"), v)
        for o, v in zip(sess.get_outputs(), sess.run(None, feeds)):
            np.save(os.path.join(HERE, f"{name}.output.{o.name}.npy"), v)

    one("ort-gqa-prompt", 4, False, 0, [3, 3], 4)
    one("ort-gqa-prompt-rotary", 4, True, 0, [3, 3], 4)
    one("ort-gqa-decode-rotary", 1, True, 6, [5, 3], 6)
    one("ort-gqa-window", 4, False, 0, [3, 3], 4, window=2)


def mha_past():
    rng = np.random.default_rng(SEED)
    B, S, P, N, HD = 2, 3, 4, 2, 8
    D = N * HD
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    for name, causal in [("ort-mha-past", 0), ("ort-mha-past-causal", 1)]:
        node = helper.make_node(
            "MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"],
            ["y", "present_key", "present_value"], domain="com.microsoft", num_heads=N,
            unidirectional=causal)
        graph = helper.make_graph(
            [node], "mha_past",
            [vi("q", F, [B, S, D]), vi("k", F, [B, S, D]), vi("v", F, [B, S, D]),
             vi("pk", F, [B, N, P, HD]), vi("pv", F, [B, N, P, HD])],
            [vi(o, F, None) for o in ["y", "present_key", "present_value"]],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)],
                                  ir_version=8)
        path = os.path.join(HERE, f"{name}.onnx")
        onnx.save(model, path)
        feeds = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in [
            ("q", (B, S, D)), ("k", (B, S, D)), ("v", (B, S, D)),
            ("pk", (B, N, P, HD)), ("pv", (B, N, P, HD))]}
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for k, v in feeds.items():
            np.save(os.path.join(HERE, f"{name}.input.{k}.npy"), v)
        for o, v in zip(sess.get_outputs(), sess.run(None, feeds)):
            np.save(os.path.join(HERE, f"{name}.output.{o.name}.npy"), v)


def main():
    rng = np.random.default_rng(SEED)
    optimize(os.path.join(EXAMPLES, "mnist-cnn.onnx"), "ort-opt-mnist-cnn",
             {"image": rng.random((1, 1, 28, 28), dtype=np.float32)})
    optimize(os.path.join(EXAMPLES, "mlp-int.onnx"), "ort-opt-mlp-int",
             {"x": np.load(os.path.join(EXAMPLES, "mlp-int.input.x.npy"))})
    encoder()
    dynamic_int8_block()
    rounding()
    nested_constants()
    conv_batch_norm()
    channels_last_cnn()
    qoperator_cnn()
    qdq_cnn()
    qdq_movers()
    dynamic_mlp()
    dynamic_lstm()
    matmul_nbits()
    contrib_transformer()
    gqa()
    mha_past()


if __name__ == "__main__":
    import sys

    # `make_models.py NAME ...` writes only the named models (the functions above).
    if len(sys.argv) > 1:
        for name in sys.argv[1:]:
            globals()[name]()
    else:
        main()
