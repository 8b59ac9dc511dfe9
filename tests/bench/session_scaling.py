#!/usr/bin/env python3
"""How session creation grows with the graph, against ONNX Runtime in the same process.

    cargo build --release -p epx-capi
    python3 tests/bench/session_scaling.py [--sizes 10000,100000,1000000] [--threads 1,2]
                                           [--kinds chain,wide] [--runs 3]

Two kinds of graph, each at every size (nodes):

- `chain`: x -> Identity -> ... -> y, the nodes both engines remove;
- `wide`: 256 independent chains of Relu from one input, joined by a balanced tree of Adds.

For each, the median of `--runs` session creations from the model's bytes (parsing included)
with epx (`epx.Session`, through the release libepx) and with ONNX Runtime
(`onnxruntime.InferenceSession`, its default optimizations), at each intra-op thread count,
then the ratio epx / ONNX Runtime and each engine's growth per 10x nodes. ONNX Runtime comes
from `.testdata/parity/venv` (made on first use); libepx from `target/release`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "parity"))
import parity  # noqa: E402

BRANCHES = 256


def build(kind: str, n: int) -> bytes:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes = []
    if kind == "chain":
        prev = "x"
        for i in range(n):
            out = "y" if i == n - 1 else f"t{i}"
            nodes.append(h.make_node("Identity", [prev], [out]))
            prev = out
    else:
        depth = max(1, (n - (BRANCHES - 1)) // BRANCHES)
        ends = []
        for b in range(BRANCHES):
            prev = "x"
            for i in range(depth):
                out = f"b{b}_{i}"
                nodes.append(h.make_node("Relu", [prev], [out]))
                prev = out
            ends.append(prev)
        k = 0
        while len(ends) > 1:
            nxt = []
            for a, b in zip(ends[0::2], ends[1::2]):
                out = f"s{k}"
                k += 1
                nodes.append(h.make_node("Add", [a, b], [out]))
                nxt.append(out)
            if len(ends) % 2:
                nxt.append(ends[-1])
            ends = nxt
        nodes.append(h.make_node("Identity", [ends[0]], ["y"]))
    g = h.make_graph(nodes, kind, [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def median_time(make, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        s = make()
        times.append(time.perf_counter() - t)
        del s
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--kinds", default="chain,wide")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    lib = ROOT / "target" / "release" / "libepx.so"
    if not lib.exists():
        sys.exit(f"{lib} is missing: build it with `cargo build --release -p epx-capi`")
    if not args.in_venv:
        py = parity.ort_python()
        env = dict(os.environ, EPX_LIBRARY=str(lib),
                   PYTHONPATH=os.pathsep.join([str(ROOT / "host" / "python"),
                                               os.environ.get("PYTHONPATH", "")]))
        os.execve(str(py), [str(py), __file__, "--in-venv", *sys.argv[1:]], env)
    import onnxruntime as ort

    import epx

    sizes = [int(s) for s in args.sizes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    print(f"session creation, median of {args.runs}; epx {lib}, ONNX Runtime {ort.__version__}")
    print(f"{'graph':8} {'nodes':>9} {'threads':>7} {'epx s':>9} {'ORT s':>9} {'epx/ORT':>8} "
          f"{'epx x/10x':>9} {'ORT x/10x':>9}")
    for kind in args.kinds.split(","):
        models = {n: build(kind, n) for n in sizes}
        for t in threads:
            before = None
            for n in sizes:
                data = models[n]
                e = median_time(lambda: epx.Session(data, intra_op_threads=t), args.runs)
                so = ort.SessionOptions()
                so.intra_op_num_threads = t
                o = median_time(lambda: ort.InferenceSession(
                    data, so, providers=["CPUExecutionProvider"]), args.runs)
                grow = ("", "") if before is None else (
                    f"{e / before[0]:.1f}", f"{o / before[1]:.1f}")
                print(f"{kind:8} {n:>9} {t:>7} {e:>9.3f} {o:>9.3f} {e / o:>8.2f} "
                      f"{grow[0]:>9} {grow[1]:>9}", flush=True)
                before = (e, o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
