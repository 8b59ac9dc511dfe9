"""Per-call cost of single-node models from Python: ONNX Runtime and `epx.onnxruntime` in one
process, one Python thread, to put a model's per-node gap against ONNX Runtime where each
engine's own profiler cannot (ONNX Runtime's adds about 2 µs a node).

    python tests/bench/single_node_call.py [--calls 5000]

Run it where both `onnxruntime` and the `epx` wheel are installed. Models (made here with the
`onnx` helpers, random weights): Conv 3×3 (pads 1, bias) + Relu of 1→8 channels over 28×28 and
of 8→16 over 14×14, and the one-Add model of `examples/models`, whose figure is the call alone;
each figure is the best of 5 repeats, in µs, and the last columns subtract the one-Add call.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def conv_relu(c: int, m: int, hw: int, rng) -> bytes:
    import onnx.helper as h
    from onnx import TensorProto, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((m, c, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((m,)).astype(np.float32), "b")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             h.make_node("Relu", ["c"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=9).SerializeToString()


def per_call_us(session, feed, calls: int) -> float:
    for _ in range(calls // 10):
        session.run(None, feed)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            session.run(None, feed)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    import onnxruntime as ort

    import epx.onnxruntime as eort

    rng = np.random.default_rng(0)
    ex = os.path.join(ROOT, "examples", "models")
    add = {n: np.load(os.path.join(ex, f"add.input.{n}.npy")) for n in ("a", "b")}
    cases = [("one Add (the call)", os.path.join(ex, "add.onnx"), add)]
    for c, m, hw in [(1, 8, 28), (8, 16, 14)]:
        cases.append((f"Conv+Relu {c}->{m} @{hw}x{hw}", conv_relu(c, m, hw, rng),
                      {"x": rng.random((1, c, hw, hw)).astype(np.float32)}))
    print(f"{'model':<26} {'ORT µs':>8} {'epx µs':>8} {'ORT-call':>9} {'epx-call':>9}")
    base = None
    for label, model, feed in cases:
        figures = [per_call_us(mod.InferenceSession(model, providers=["CPUExecutionProvider"]),
                               feed, args.calls) for mod in (ort, eort)]
        base = base or figures
        print(f"{label:<26} {figures[0]:>8.2f} {figures[1]:>8.2f} "
              f"{figures[0] - base[0]:>9.2f} {figures[1] - base[1]:>9.2f}")


if __name__ == "__main__":
    main()
