#!/usr/bin/env python3
"""Latency of the parity corpus on epx's CPU EP against ONNX Runtime, measured in the same run.

    bench.py [--only ID,...] [--subset fast] [--threads 1,2] [--runs 3] [--repeat 20]
             [--epx target/release/epx] [--min-ms 0.05]

For each model and thread count: ONNX Runtime 1.31.1 (its CPU EP, `intra_op_num_threads`, all
graph optimizations, as a program would create it) times `--repeat` runs after one warm-up and
takes the median; epx times the same runs with `epx run --repeat` on the CPU EP
(`--ep cpu:intra_op_num_threads=N`). Both see the same inputs (parity.py's, from each model's
signature and overrides). The whole measurement is taken `--runs` times, alternating the two,
and the median of those medians is reported. One line per model: ms for each and the ratio
epx / ONNX Runtime; then, per thread count, the geometric mean of the ratios over the models
ONNX Runtime runs in more than `--min-ms` and the models above 1.3.

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
    ratios: dict[int, list[tuple[str, float]]] = {t: [] for t in threads}
    print(f"{'model':52} " + " ".join(f"{'ort ms':>9} {'epx ms':>9} {'ratio':>6}" for _ in threads)
          + "   (threads " + ", ".join(map(str, threads)) + ")")
    for m in models:
        try:
            probe = parity.ort_session(ort, m["path"])
        except Exception as e:  # noqa: BLE001 (ONNX Runtime's own exception types)
            print(f"{m['id']:52} ONNX Runtime refuses it: {str(e).splitlines()[0][:80]}")
            continue
        feed = parity.make_inputs(np, m, probe.get_inputs())
        del probe
        inputs = []
        for i, (name, value) in enumerate(feed.items()):
            p = work / f"{m['id']}.{i}.npy"
            parity.write_npy(np, p, value)
            inputs += ["--input", f"{name}={p}"]
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
