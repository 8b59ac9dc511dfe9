#!/usr/bin/env python3
"""Latency of the parity corpus on epx's CPU EP against ONNX Runtime, measured in the same run.

    bench.py [--only ID,...] [--subset fast] [--threads 1,2] [--runs 3] [--repeat 20]
             [--epx target/release/epx] [--min-ms 0.05]
    bench.py --ops [--only ID,...] [--subset fast] [--repeat 20] [--share 1]

For each model and thread count: ONNX Runtime 1.31.1 (its CPU EP, `intra_op_num_threads`, all
graph optimizations, as a program would create it) times `--repeat` runs after one warm-up and
takes the median; epx times the same runs with `epx run --repeat` on the CPU EP
(`--ep cpu:intra_op_num_threads=N`). Both see the same inputs (parity.py's, from each model's
signature and overrides). The whole measurement is taken `--runs` times, alternating the two,
and the median of those medians is reported. One line per model: ms for each and the ratio
epx / ONNX Runtime; then, per thread count, the geometric mean of the ratios over the models
ONNX Runtime runs in more than `--min-ms` and the models above 1.3.

`--ops` prints the op-level table instead, at one thread: per model, each op with more than
`--share` percent of the model's time on either side, its largest input shape, ms per run on each
and the ratio; then the worst rows over all models. ONNX Runtime's side is its own profiler
(`enable_profiling`, per node, after its graph optimizations); epx's is `EPX_CPU_PROFILE=1`, per
step kind. A fused step counts for its first op on both sides (epx's `Conv+Add+Relu` and ONNX
Runtime's `FusedConv` are both Conv; ONNX Runtime's NCHWc layout reorders count for Conv too,
and its Gemm that a MatMul and an Add became for MatMul).

Timings need a release build (`cargo build --release -p epx-cli`): the dev profile leaves the
GEMM unoptimized. A benchmark, not a test: machines are noisy, so read medians.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity  # noqa: E402


def ort_median(ort, np, path: Path, feed: dict, threads: int, repeat: int) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    session.run(None, feed)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


UNITS = {"s": 1e3, "ms": 1.0, "µs": 1e-3, "us": 1e-3, "ns": 1e-6}


def epx_median(exe: Path, path: Path, inputs: list[str], threads: int, repeat: int,
               timeout: float) -> float | str:
    args = [str(exe), "run", str(path), "--ep", f"cpu:intra_op_num_threads={threads}",
            "--repeat", str(repeat), *inputs]
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no answer in {timeout:.0f} s"
    m = re.search(r"median ([0-9.]+) (s|ms|µs|us|ns)", p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        return lines[-1][:160] if lines else f"exit status {p.returncode}"
    return float(m.group(1)) * UNITS[m.group(2)]


# ONNX Runtime's fused and relaid node kinds, by the op they replace.
ORT_OPS = {
    "FusedConv": "Conv", "NchwcConv": "Conv", "ReorderInput": "Conv", "ReorderOutput": "Conv",
    "FusedMatMul": "MatMul", "Gemm": "MatMul", "FusedGemm": "Gemm", "NchwcMaxPool": "MaxPool",
    "NchwcAveragePool": "AveragePool", "NchwcGlobalAveragePool": "GlobalAveragePool",
    "NchwcUpsample": "Resize", "BiasGelu": "Add", "FastGelu": "Add", "Gelu": "Div",
    "SkipLayerNormalization": "Add", "QuickGelu": "Sigmoid", "MatMulIntegerToFloat": "MatMulInteger",
    "DynamicQuantizeMatMul": "MatMulInteger", "SimplifiedLayerNormalization": "LayerNormalization",
}


def epx_kind(kind: str) -> str:
    """The op an epx step kind counts for: its first op (`fused Add+Mul` is Add)."""
    return kind.removeprefix("fused ").split("+")[0]


def ort_op_times(ort, path: Path, feed: dict, repeat: int) -> tuple[dict, dict]:
    """ms per run by op, and the largest input shape seen per op, from ONNX Runtime's profiler."""
    import json
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.mkdtemp(prefix="epx-ortprof-")) / "p")
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, float] = {}
    shapes: dict[str, tuple[int, list]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        op = ORT_OPS.get(op, op)
        times[op] = times.get(op, 0.0) + e.get("dur", 0) / 1e3 / (repeat + 1)
        for shape in e.get("args", {}).get("input_type_shape", []):
            dims = next(iter(shape.values()), [])
            size = math.prod(d for d in dims if isinstance(d, int))
            if size > shapes.get(op, (-1, []))[0]:
                shapes[op] = (size, dims)
    return times, {k: v[1] for k, v in shapes.items()}


def epx_op_times(exe: Path, path: Path, inputs: list[str], repeat: int,
                 timeout: float) -> dict | str:
    """ms per run by op from `EPX_CPU_PROFILE=1` (the warm-up run included, as for ONNX Runtime)."""
    args = [str(exe), "run", str(path), "--ep", "cpu:intra_op_num_threads=1",
            "--repeat", str(repeat), *inputs]
    env = dict(os.environ, EPX_CPU_PROFILE="1")
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"no answer in {timeout:.0f} s"
    if p.returncode != 0:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        return lines[-1][:160] if lines else f"exit status {p.returncode}"
    times: dict[str, float] = {}
    for line in p.stderr.splitlines():
        m = re.match(r"\s*([0-9.]+) ms\s+[0-9.]+%\s+\d+x\s+(.+)$", line)
        if m:
            op = epx_kind(m.group(2).strip())
            times[op] = times.get(op, 0.0) + float(m.group(1)) / (repeat + 1)
    return times


def ops_table(models: list[dict], exe: Path, args, ort, np, work: Path) -> int:
    """The op-level table (see the module's doc)."""
    rows = []
    print(f"{'model':44} {'op':24} {'shape':24} {'ort ms':>8} {'epx ms':>8} {'ratio':>6}")
    for m in models:
        fed = model_feed(ort, np, m, work, 44)
        if fed is None:
            continue
        feed, inputs = fed
        o, shapes = ort_op_times(ort, m["path"], feed, args.repeat)
        e = epx_op_times(exe, m["path"], inputs, args.repeat, args.timeout)
        if isinstance(e, str):
            print(f"{m['id']:44} epx: {e}")
            continue
        o_all, e_all = sum(o.values()), sum(e.values())
        for op in sorted(set(o) | set(e), key=lambda k: -max(o.get(k, 0), e.get(k, 0))):
            ot, et = o.get(op, 0.0), e.get(op, 0.0)
            if max(ot / max(o_all, 1e-9), et / max(e_all, 1e-9)) * 100 < args.share:
                continue
            ratio = et / ot if ot > 0 else float("inf")
            shape = "x".join(map(str, shapes.get(op, []))) or "-"
            rows.append((m["id"], op, shape, ot, et, ratio))
            print(f"{m['id']:44} {op:24} {shape[:24]:24} {ot:8.3f} {et:8.3f} {ratio:6.2f}", flush=True)
    print("\nworst rows (ratio, over the ops with more than "
          f"{args.share:g}% of a model's time):")
    for r in sorted(rows, key=lambda r: -r[5])[:10]:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.2f} |")
    return 0


def model_feed(ort, np, m: dict, work: Path, width: int) -> tuple[dict, list[str]] | None:
    """Model `m`'s inputs (parity.py's), and the same written as .npy files as `epx run --input`
    arguments; None, with a line saying why, when ONNX Runtime refuses the model."""
    try:
        probe = parity.ort_session(ort, m["path"])
    except Exception as e:  # noqa: BLE001 (ONNX Runtime's own exception types)
        print(f"{m['id']:{width}} ONNX Runtime refuses it: {str(e).splitlines()[0][:80]}")
        return None
    feed = parity.make_inputs(np, m, probe.get_inputs())
    del probe
    inputs = []
    for i, (name, value) in enumerate(feed.items()):
        p = work / f"{m['id']}.{i}.npy"
        parity.write_npy(np, p, value)
        inputs += ["--input", f"{name}={p}"]
    return feed, inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated model ids")
    ap.add_argument("--subset", help="only the models of this subset (fast)")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="whole measurements per model")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per measurement")
    ap.add_argument("--epx", default=str(parity.ROOT / "target/release/epx"))
    ap.add_argument("--min-ms", type=float, default=0.05,
                    help="leave models faster than this on ONNX Runtime out of the mean")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--ops", action="store_true", help="the op-level table at one thread")
    ap.add_argument("--share", type=float, default=1.0,
                    help="with --ops: leave out ops under this percent of a model's time")
    args = ap.parse_args()
    models = parity.select(parity.load_corpus(), args.only, args.subset)
    parity.fetch(models)
    try:
        import onnxruntime

        ours = onnxruntime.__version__ == parity.ORT_VERSION
    except ImportError:
        ours = False
    if not ours:
        py = parity.ort_python()
        os.execv(py, [str(py), __file__, *sys.argv[1:]])
    import numpy as np
    import onnxruntime as ort

    exe = Path(args.epx).resolve()
    if not exe.exists():
        sys.exit(f"{exe} is missing: cargo build --release -p epx-cli")
    threads = [int(t) for t in args.threads.split(",")]
    work = Path(tempfile.mkdtemp(prefix="epx-bench-"))
    if args.ops:
        return ops_table(models, exe, args, ort, np, work)
    ratios: dict[int, list[tuple[str, float]]] = {t: [] for t in threads}
    print(f"{'model':52} " + " ".join(f"{'ort ms':>9} {'epx ms':>9} {'ratio':>6}" for _ in threads)
          + "   (threads " + ", ".join(map(str, threads)) + ")")
    for m in models:
        fed = model_feed(ort, np, m, work, 52)
        if fed is None:
            continue
        feed, inputs = fed
        cells = []
        for t in threads:
            o, e = [], []
            for _ in range(args.runs):
                try:
                    o.append(ort_median(ort, np, m["path"], feed, t, args.repeat))
                except Exception as err:  # noqa: BLE001
                    o = str(err).splitlines()[0][:80]
                    break
                v = epx_median(exe, m["path"], inputs, t, args.repeat, args.timeout)
                if isinstance(v, str):
                    e = v
                    break
                e.append(v)
            if isinstance(o, str) or isinstance(e, str):
                cells.append(f"{'-':>9} {'-':>9} {'-':>6}")
                print(f"{m['id']:52} {t} thread(s): {o if isinstance(o, str) else e}")
                continue
            om, em = float(np.median(o)), float(np.median(e))
            ratio = em / om
            if om > args.min_ms:
                ratios[t].append((m["id"], ratio))
            cells.append(f"{om:9.3f} {em:9.3f} {ratio:6.2f}")
        print(f"{m['id']:52} " + " ".join(cells), flush=True)
    print()
    for t in threads:
        r = ratios[t]
        if not r:
            continue
        geo = math.exp(sum(math.log(x) for _, x in r) / len(r))
        slow = sorted((x for x in r if x[1] > 1.3), key=lambda x: -x[1])
        print(f"{t} thread(s): geometric mean epx / ONNX Runtime {geo:.2f} over {len(r)} models; "
              f"{len(slow)} above 1.3" + (": " + ", ".join(f"{i} {x:.2f}" for i, x in slow[:12])
                                          if slow else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
