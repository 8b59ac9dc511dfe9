"""ONNX Runtime's input rules, with ONNX Runtime as the oracle: every value a Python program may
feed (numpy arrays of every dtype, lists, tuples, Python and numpy scalars, non-contiguous,
Fortran-ordered and byte-swapped arrays, strings and objects) goes to an input of every element
type, once through onnxruntime and once through epx.onnxruntime; both must convert it the same way
(same dtype, shape and values out of an Identity) or refuse it with the same exception type and
the same message opening."""

import numpy as np
import pytest

import epx.onnxruntime as eort
from conftest import here

ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle here")

IDENTITIES = here("models", "identities.onnx")
SCALAR = here("models", "scalar.onnx")
TYPES = ["float", "double", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
         "uint32", "uint64", "bool", "string"]
NUMPY = {"float": np.float32, "double": np.float64, "float16": np.float16, "int8": np.int8,
         "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
         "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_,
         "string": np.str_}

_c = np.arange(12, dtype=np.float32).reshape(3, 4)
VALUES = {
    # numpy arrays of every dtype a program may hold
    **{f"array {np.dtype(t).name}": np.array([[1, 0, 2]], dtype=t) for t in (
        np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
        np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.longdouble)},
    "array unicode": np.array(["a", "bc"]),
    "array bytes": np.array([b"a", b"bc"]),
    "array object str": np.array(["a", "bc"], dtype=object),
    "array object int": np.array([1, 2], dtype=object),
    "array datetime": np.array(["2026-01-01"], dtype="datetime64[D]"),
    "array empty float": np.zeros((0, 3), np.float32),
    "array 0-d float": np.array(2.5, np.float32),
    # layouts
    "non-contiguous": _c[:, ::2],
    "fortran": np.asfortranarray(_c),
    "negative strides": _c[::-1],
    "byte-swapped": _c.astype(">f4"),
    "broadcast view": np.broadcast_to(np.float32(3), (2, 3)),
    "read-only": np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), np.float32),
    # Python values
    "list int": [1, 2, 3],
    "list float": [1.5, -2.0],
    "list bool": [True, False],
    "list str": ["a", "bc"],
    "list mixed int float": [1, 2.5],
    "list nested": [[1, 2], [3, 4]],
    "list ragged": [[1, 2], [3]],
    "list empty": [],
    "tuple int": (1, 2),
    "int": 3,
    "float": 2.5,
    "bool": True,
    "str": "abc",
    "bytes": b"abc",
    "None": None,
    "numpy scalar float32": np.float32(1.5),
    "numpy scalar int64": np.int64(7),
    "int too big": [2 ** 70],
    "negative into unsigned": [-1],
}


# Where ONNX Runtime answers wrong values without a word, epx reads the values as they are.
NOT_AS_ONNXRUNTIME = {
    "byte-swapped": {"float"},   # ONNX Runtime reads the swapped bytes as if native
    "array bytes": {"string"},   # ONNX Runtime reads past the end of the shorter elements
}
# Where ONNX Runtime's message is an internal failure: the exception type is the same, the
# message epx's own.
INTERNAL_MESSAGES = {"None"}


def _session(module, path):
    so = module.SessionOptions()
    so.log_severity_level = 3
    return module.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _default(t):
    return np.array(["x"], dtype=object) if t == "string" else np.zeros(1, NUMPY[t])


def outcome(session, feed, output):
    """What a run makes of a feed: ("ok", dtype, shape, values) or ("error", type, opening)."""
    try:
        out = session.run([output], feed)[0]
    except Exception as e:  # noqa: BLE001 - the outcome compared
        text = str(e)
        # The opening of ONNX Runtime's message: up to the first detail that names a value.
        return ("error", type(e).__name__, text.split(":", 3)[-1].strip()[:40]
                if text.startswith("[ONNXRuntimeError]") else text[:40])
    out = np.asarray(out)
    values = out.astype(str).tolist() if out.dtype.kind in "OUS" else out.tolist()
    return ("ok", out.dtype.str if out.dtype.kind not in "OUS" else "str", out.shape, values)


@pytest.fixture(scope="module")
def sessions():
    return {m: _session(m, IDENTITIES) for m in (ort, eort)}


@pytest.mark.parametrize("t", TYPES)
def test_each_value_converts_or_is_refused_as_onnxruntime_does(sessions, t):
    differences = []
    for label, value in VALUES.items():
        results = []
        for module, session in sessions.items():
            feed = {f"x_{u}": _default(u) for u in TYPES}
            feed[f"x_{t}"] = value
            results.append(outcome(session, feed, f"y_{t}"))
        theirs, ours = results
        if label in NOT_AS_ONNXRUNTIME and t in NOT_AS_ONNXRUNTIME[label]:
            want = np.asarray(value).astype(NUMPY[t] if t != "string" else str)
            assert ours[0] == "ok" and ours[3] == want.tolist(), (label, ours)
            continue
        same = theirs[:2] == ours[:2] and (theirs[0] == "error" or theirs == ours)
        if same and theirs[0] == "error" and label not in INTERNAL_MESSAGES:
            same = theirs[2] == ours[2]  # the same message opening
        if not same:
            differences.append(f"{label}: onnxruntime {theirs}, epx {ours}")
    assert not differences, f"tensor({t}):\n" + "\n".join(differences)


@pytest.mark.parametrize("label,value", [
    ("scalar", np.float32(1.0)), ("0-d", np.array(1.0, np.float32)),
    ("[1]", np.ones(1, np.float32)), ("[1,1]", np.ones((1, 1), np.float32)),
    ("python float", 1.0), ("list", [1.0])])
def test_scalar_and_one_element_inputs_follow_onnxruntimes_rank_rules(label, value):
    for name, other in (("s", np.ones(1, np.float32)), ("one", np.float32(1.0))):
        results = []
        for module in (ort, eort):
            session = _session(module, SCALAR)
            feed = {"s": np.array(1.0, np.float32), "one": np.ones(1, np.float32)}
            feed[name] = value
            results.append(outcome(session, feed, f"{name}_out"))
        assert results[0][:2] == results[1][:2] and \
            (results[0][0] == "error" or results[0] == results[1]), (name, label, results)
