"""Per-call cost of a run from Python: ONNX Runtime and `epx.onnxruntime` on the same models,
in the same process, at 1 and 2 Python threads.

    python tests/bench/python_call.py [--calls 20000] [--repeats 3]

Run it where both `onnxruntime` and the `epx` wheel are installed (a release wheel:
`bash packaging/wheel.sh`). Models: `examples/models/add.onnx` (one Add of two [3, 4] floats: the
cost is nearly all per-call overhead) and `examples/models/mnist-cnn.onnx` (a small CNN). Each
figure is the median over `--repeats` of (wall time / calls) in microseconds; with 2 threads,
both threads call the same session and the figure is wall time over all calls of both. Sessions
use their defaults, as programs do. The last column is epx / ONNX Runtime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def models():
    ex = os.path.join(ROOT, "examples", "models")
    add = {n: np.load(os.path.join(ex, f"add.input.{n}.npy")) for n in ("a", "b")}
    cnn = {"image": np.load(os.path.join(ex, "mnist-cnn.input.image.npy"))}
    return [("one Add", os.path.join(ex, "add.onnx"), add),
            ("small CNN", os.path.join(ex, "mnist-cnn.onnx"), cnn)]


def per_call_us(session, feed, calls: int, threads: int) -> float:
    def work(n):
        run = session.run
        for _ in range(n):
            run(None, feed)

    work(200)  # warm up
    each = calls // threads
    pool = [threading.Thread(target=work, args=(each,)) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return (time.perf_counter() - start) / (each * threads) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import onnxruntime as ort

    import epx
    import epx.onnxruntime as eort

    print(f"onnxruntime {ort.__version__}, epx {epx.version()} ({epx._capi.Library.default().path})")
    print(f"{'model':<10} {'threads':>7} {'ORT µs':>8} {'epx µs':>8} {'epx/ORT':>8}")
    for label, path, feed in models():
        sessions = [ort.InferenceSession(path, providers=["CPUExecutionProvider"]),
                    eort.InferenceSession(path, providers=["CPUExecutionProvider"])]
        for threads in (1, 2):
            calls = args.calls if label == "one Add" else args.calls // 10
            figures = [statistics.median(per_call_us(s, feed, calls, threads)
                                         for _ in range(args.repeats)) for s in sessions]
            print(f"{label:<10} {threads:>7} {figures[0]:>8.2f} {figures[1]:>8.2f} "
                  f"{figures[1] / figures[0]:>8.2f}")


if __name__ == "__main__":
    main()
