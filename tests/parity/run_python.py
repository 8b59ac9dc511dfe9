"""Runs one model through epx's Python package as a program written for ONNX Runtime runs it:
`epx.onnxruntime.InferenceSession(model, providers=[...]).run(None, feed)`, over libepx's C API.

    python run_python.py MODEL OUT.pickle PROVIDER[,PROVIDER...] NAME=INPUT.npy ...

parity.py starts it once per model (a crash fails that model only) with `epx` importable
(PYTHONPATH), EPX_LIBRARY naming libepx and EPX_PLUGIN_PATH the plugins. It writes the outputs,
by name, as a pickle of what `run` returned (arrays, lists, dicts), or exits with the error.
"""

import pickle
import sys

import numpy as np

import epx.onnxruntime as ort


def main() -> int:
    model, out, providers, *pairs = sys.argv[1:]
    feed = {}
    for pair in pairs:
        name, path = pair.split("=", 1)
        value = np.load(path, allow_pickle=False)
        # ONNX Runtime's programs hand strings over as object arrays.
        feed[name] = value.astype(object) if value.dtype.kind == "U" else value
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(model, so, providers=providers.split(","))
    names = [o.name for o in session.get_outputs()]
    results = session.run(None, feed)
    with open(out, "wb") as f:
        pickle.dump(dict(zip(names, results)), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
