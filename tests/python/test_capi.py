"""The Python module over libepx (examples/python/epx.py), run by tests/capi.rs:

    EPX_LIBRARY=target/debug/libepx.so PYTHONPATH=examples/python python3 tests/python/test_capi.py MODEL_DIR

Prints one line per check and "ALL OK"; any failure raises (non-zero exit).
"""
import os
import sys

import numpy as np

import epx

models = sys.argv[1]


def path(name):
    return os.path.join(models, name)


lib = epx.Library.default()
assert lib.version().count(".") == 2, lib.version()
env = epx.Environment()
eps = env.providers()
assert any(p["name"] == "cpu" and p["available"] and p["reason"] is None for p in eps), eps
ok, report = env.doctor()
assert "plugin search path" in report, report
print("ok   environment, providers, doctor")

# mnist-cnn from a path: the reference output within 1e-5.
s = epx.Session(env, path("mnist-cnn.onnx"), providers=["cpu"])
assert [i["name"] for i in s.inputs] == ["image"], s.inputs
assert s.inputs[0]["dtype"] == np.float32 and s.inputs[0]["shape"] == (1, 1, 28, 28), s.inputs
out = s.run({"image": np.load(path("mnist-cnn.input.image.npy"))})
want = np.load(path("mnist-cnn.output.probabilities.npy"))
got = out["probabilities"]
assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape)
assert np.max(np.abs(got - want)) <= 1e-5, np.max(np.abs(got - want))
placement = s.placement()
assert len(placement["nodes"]) == 11 and {n["provider"] for n in placement["nodes"]} == {"cpu"}
print("ok   mnist-cnn matches the reference; placement", len(placement["groups"]), "groups")

# mlp-int from bytes, with integer inputs and outputs.
with open(path("mlp-int.onnx"), "rb") as f:
    s2 = epx.Session(env, f.read(), strict=True)
feeds = {i["name"]: np.load(path(f"mlp-int.input.{i['name']}.npy")) for i in s2.inputs}
out2 = s2.run(feeds)
for name, value in out2.items():
    want = np.load(path(f"mlp-int.output.{name}.npy"))
    assert value.dtype == want.dtype and np.array_equal(value, want), (name, value, want)
print("ok   mlp-int from bytes, strict, exact integer outputs")

# Errors are EpxError exceptions with the code and message.
def raises(code, needle, fn):
    try:
        fn()
    except epx.EpxError as e:
        assert e.code == code, (e.code, e.message)
        assert needle in e.message, (needle, e.message)
        print(f"ok   EpxError {epx.ERROR_NAMES[code]}: {e.message}")
        return
    raise AssertionError(f"no EpxError for {needle}")


raises(2, "not a valid ONNX model", lambda: epx.Session(env, b"\x08\x01garbage"))
raises(3, "nonexistent", lambda: epx.Session(env, "/nonexistent.onnx"))
raises(5, "frobnicator", lambda: epx.Session(env, path("add.onnx"), providers=["frobnicator"]))
raises(5, "colour", lambda: epx.Session(env, path("add.onnx"), providers=[("cpu", {"colour": "red"})]))
raises(8, "image", lambda: s.run({"imag": np.zeros((1, 1, 28, 28), np.float32)}))
raises(8, "must have shape [1, 1, 28, 28]", lambda: s.run({"image": np.zeros((1, 1, 28, 27), np.float32)}))
raises(8, "dtype", lambda: s.run({"image": np.zeros(3, dtype=object)}))
# Strings, sequences and maps (tests/models/sklearn-values, with ONNX Runtime's outputs).
values = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "sklearn-values")


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


import json  # noqa: E402

text = epx.Session(env, os.path.join(values, "tfidf-text", "model.onnx"))
assert text.inputs[0]["type"] == "tensor(string)", text.inputs
assert text.outputs[1]["type"] == "seq(map(int64,tensor(float)))", text.outputs
words = np.load(os.path.join(values, "tfidf-text", "input", "text.npy"))
out = text.run({"text": words})
probs = out["output_probability"]
assert isinstance(probs, list) and len(probs) == len(words), probs
for k, row in enumerate(probs):
    with open(os.path.join(values, "tfidf-text", "output", "output_probability", f"{k}.json")) as f:
        want = {int(key): v for key, v in json.load(f).items()}
    assert row.keys() == want.keys() and all(close(row[c], want[c]) for c in want), (row, want)
print("ok   tfidf-text: numpy unicode input, a list of dicts out, equal to ONNX Runtime's")

forest = epx.Session(env, os.path.join(values, "random-forest-string-labels", "model.onnx"))
out = forest.run({"X": np.load(os.path.join(values, "random-forest-string-labels", "input", "X.npy"))})
want = np.load(os.path.join(values, "random-forest-string-labels", "output", "output_label.npy"))
assert out["output_label"].dtype.kind == "U" and list(out["output_label"]) == list(want), out
assert set(out["output_probability"][0]) == {"setosa", "versicolor", "virginica"}, out
print("ok   string class labels come back as a numpy unicode array, probabilities keyed by them")

dv = epx.Session(env, os.path.join(values, "dict-vectorizer", "model.onnx"))
out = dv.run({"x": {"a": 1.0, "c": 2.0}})
want = np.load(os.path.join(values, "dict-vectorizer", "output", "output_label.npy"))
assert np.array_equal(out["output_label"], want), (out, want)
print("ok   a dict goes in as a map")

print("ALL OK")
