#!/usr/bin/env python3
"""Runs ONNX node tests (a folder of test_*/model.onnx + test_data_set_*/) on ONNX Runtime's CPU
EP and prints `N passed, M failed`, with one line per failing case (`--list FILE` writes them).
The tolerance is the node tests' own (rtol 1e-3, atol 1e-7, as epx's conformance test uses).

    python ort_node_tests.py .testdata/onnx-node-1.23.2 [--list FILE]

Needs onnxruntime, onnx and numpy (tests/fetch-testdata.sh's venv at .testdata/onnx-1.23.2-venv
has onnx; add onnxruntime==1.31.1).
"""
import argparse
import glob
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def load(path, vi):
    t = vi.type
    if t.HasField("sequence_type"):
        p = onnx.SequenceProto()
        with open(path, "rb") as f:
            p.ParseFromString(f.read())
        return numpy_helper.to_list(p)
    if t.HasField("optional_type"):
        p = onnx.OptionalProto()
        with open(path, "rb") as f:
            p.ParseFromString(f.read())
        return numpy_helper.to_optional(p)
    p = onnx.TensorProto()
    with open(path, "rb") as f:
        p.ParseFromString(f.read())
    return numpy_helper.to_array(p)


def close(got, want):
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(close, got, want))
    if want is None:
        return got is None
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype == object or want.dtype.kind in "USb" or not np.issubdtype(want.dtype, np.number):
        return np.array_equal(got, want)
    if np.issubdtype(want.dtype, np.integer):
        return np.array_equal(got, want)
    return np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3, atol=1e-7,
                       equal_nan=True)


def run_case(d):
    model = onnx.load(os.path.join(d, "model.onnx"))
    so = ort.SessionOptions()
    so.log_severity_level = 4
    s = ort.InferenceSession(os.path.join(d, "model.onnx"), so, providers=["CPUExecutionProvider"])
    inputs = [i for i in model.graph.input]
    outputs = list(model.graph.output)
    for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*"))):
        feed = {}
        for j, vi in enumerate(inputs):
            p = os.path.join(ds, f"input_{j}.pb")
            if os.path.exists(p):
                feed[vi.name] = load(p, vi)
        res = s.run([o.name for o in outputs], feed)
        for j, (vi, got) in enumerate(zip(outputs, res)):
            want = load(os.path.join(ds, f"output_{j}.pb"), vi)
            if not close(got, want):
                return f"output {vi.name} differs"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--list")
    a = ap.parse_args()
    cases = sorted(p for p in glob.glob(os.path.join(a.dir, "test_*")) if os.path.isdir(p))
    failed = {}
    for d in cases:
        try:
            why = run_case(d)
        except Exception as e:  # ONNX Runtime's own exception types
            why = str(e).replace("\n", " ")[:200]
        if why:
            failed[os.path.basename(d)] = why
    print(f"onnxruntime {ort.__version__}: {len(cases) - len(failed)} passed, {len(failed)} failed")
    if a.list:
        with open(a.list, "w") as f:
            for k, v in failed.items():
                f.write(f"{k}  # {v}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
