#!/usr/bin/env python3
"""ONNX Runtime's own time per op type and per node on a benchmark model, for reading beside
the CPU EP's `EPX_CPU_PROFILE=1` (per op) and `EPX_CPU_PROFILE=nodes` (per node) tables.

    .testdata/bench-venv/bin/python tests/bench/ort-profile.py MODEL [--threads N] [--runs R]
        [--shape NAME=D,D,...] [--nodes K]

e.g. `--shape x=1,3,640,640` for PP-OCR det, `--shape input_ids=1,128 --shape
attention_mask=1,128` for MiniLM (the benchmark's inputs).

Inputs are made like the benchmark's: float inputs are pseudo-random values in [0, 1), int64
inputs token ids in 1000..20000 or, for a name with `mask` in it, all ones; each with the shape
`--shape` gives it, else the model's with symbolic dimensions set to 1. Node names are ONNX
Runtime's after its own graph optimizations (a fused node keeps the name of the node it started
from, with a `_token_N` suffix stripped here).
"""

import argparse
import collections
import json
import os
import re
import tempfile

import numpy as np
import onnxruntime as ort


def feeds(session, shapes):
    rng = np.random.default_rng(7)
    out = {}
    for i in session.get_inputs():
        shape = shapes.get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape]
        if i.type == "tensor(float)":
            out[i.name] = rng.random(shape, dtype=np.float32)
        elif i.type == "tensor(int64)":
            if "mask" in i.name:
                out[i.name] = np.ones(shape, dtype=np.int64)
            else:
                out[i.name] = rng.integers(1000, 20000, size=shape, dtype=np.int64)
        else:
            raise SystemExit(f"input {i.name}: {i.type} is not made by this script")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--shape", action="append", default=[], help="NAME=D,D,... for an input")
    p.add_argument("--nodes", type=int, default=30, help="how many of the slowest nodes to list")
    a = p.parse_args()
    shapes = {}
    for s in a.shape:
        name, dims = s.split("=", 1)
        shapes[name] = [int(d) for d in dims.split(",")]
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    inputs = feeds(session, shapes)
    for _ in range(a.runs):
        session.run(None, inputs)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    per_op, count, per_node = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            node = re.sub(r"_token_\d+$", "", e["name"][: -len("_kernel_time")])
            per_op[op] += e["dur"]
            count[op] += 1
            per_node[node] += e["dur"]
    total = sum(per_op.values())
    print(f"ONNX Runtime: {total / 1000:.1f} ms in kernels over {a.runs} runs, {a.threads} thread(s)")
    for op, us in per_op.most_common():
        print(f"{us / 1000:10.2f} ms {100 * us / total:5.1f}% {count[op]:6d}x  {op}")
    print(f"the {a.nodes} slowest nodes:")
    for node, us in per_node.most_common(a.nodes):
        print(f"{us / 1000:10.2f} ms  {node}")


if __name__ == "__main__":
    main()
