"""The native per-call path (`epx._native`): used where it applies, the same answers as the
ctypes path, and the GIL released while a run computes on either path."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import epx
import epx.onnxruntime as eort
from epx import _fast
from conftest import example, here


def test_the_wheel_ships_the_native_path_for_this_python():
    if sys.version_info < (3, 11):
        pytest.skip("the native path is built for CPython 3.11 and newer (stable ABI)")
    assert _fast.available(), "epx._native is missing from this install"
    s = eort.InferenceSession(example("add.onnx"))
    assert s._fast is not None
    # Not where it does not apply: string inputs, or a free dimension each run checks.
    assert eort.InferenceSession(here("models", "identities.onnx"))._fast is None
    so = eort.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 2)
    assert eort.InferenceSession(here("models", "metadata.onnx"), so)._fast is None


@pytest.mark.parametrize("model", ["add", "mnist-cnn"])
def test_native_and_ctypes_paths_answer_alike(model):
    s = eort.InferenceSession(example(f"{model}.onnx"))
    names = [i.name for i in s.get_inputs()]
    feed = {n: np.load(example(f"{model}.input.{n}.npy")) for n in names}
    fast = s.run(None, feed)
    slow_session = eort.InferenceSession(example(f"{model}.onnx"))
    slow_session._fast = None
    slow = slow_session.run(None, feed)
    assert [a.dtype for a in fast] == [b.dtype for b in slow]
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    # Outputs own their memory: they outlive the session and later runs.
    kept = s.run(None, feed)
    del s
    assert all(np.array_equal(a, b) for a, b in zip(kept, slow))
    # Output names select and order; an unknown one is ONNX Runtime's error either way.
    out_names = [o.name for o in slow_session.get_outputs()]
    assert len(slow_session.run(out_names[:1], feed)) == 1
    with pytest.raises(Exception) as native_error:
        eort.InferenceSession(example(f"{model}.onnx")).run(["nope"], feed)
    with pytest.raises(Exception) as ctypes_error:
        slow_session.run(["nope"], feed)
    assert type(native_error.value) is type(ctypes_error.value)


def test_refusals_and_conversions_take_the_onnxruntime_rules_path():
    s = eort.InferenceSession(example("add.onnx"))
    a = np.load(example("add.input.a.npy"))
    b = np.load(example("add.input.b.npy"))
    # A list is converted; a strided view is read; a wrong dtype is refused as ONNX Runtime does.
    out = s.run(None, {"a": a.tolist(), "b": b[:, ::1]})[0]
    assert np.array_equal(out, a + b)
    with pytest.raises(eort.InvalidArgument, match="Unexpected input data type"):
        s.run(None, {"a": a.astype(np.float64), "b": b})
    with pytest.raises(ValueError, match="Required inputs"):
        s.run(None, {"a": a})


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_the_gil_is_released_while_a_run_computes(path):
    s = eort.InferenceSession(here("models", "loop.onnx"))
    if path == "ctypes":
        # Both layers: the epx.Session inside has a native path of its own.
        s._fast = s._session._fast = None
    elif s._fast is None:
        pytest.skip("no native path in this install")
    ro = eort.RunOptions()
    outcome = []

    def work():
        try:
            s.run(None, {"m": np.array(10 ** 10)}, ro)
        except Exception as e:  # noqa: BLE001 - the cancellation is the expected end
            outcome.append(e)

    worker = threading.Thread(target=work)
    worker.start()
    # While the worker runs, this thread keeps running Python; had the run held the GIL, the
    # loop below could not have counted (nor stopped the run).
    count = 0
    import time
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        count += 1
    ro.terminate = True
    worker.join(30)
    assert not worker.is_alive()
    assert outcome and "terminate flag" in str(outcome[0])
    assert count > 10_000, count


def test_a_short_run_keeps_the_gil_and_a_long_or_control_flow_one_releases_it(monkeypatch):
    feed = {n: np.load(example(f"add.input.{n}.npy")) for n in ("a", "b")}
    size = sum(v.nbytes for v in feed.values())
    # "Short" is under _fast.HOLD_GIL_BELOW_NS; set here so that it does not depend on how fast
    # this build runs one Add: any run is short, then none is.
    monkeypatch.setattr(_fast, "HOLD_GIL_BELOW_NS", 10 ** 12)
    s = eort.InferenceSession(example("add.onnx"))
    if s._fast is None:
        pytest.skip("no native path in this install")
    runner = s._fast
    # Before any run, nothing says the run is short: it releases the GIL.
    assert not runner.keeps_gil(size)
    for _ in range(3):
        s.run(None, feed)
    # One Add on CPU: short; the same inputs keep the GIL, larger ones do not.
    assert runner.keeps_gil(size)
    assert not runner.keeps_gil(size + 1)
    # A failed run (here refused at once: terminate set) says nothing of how long a run takes;
    # the next one releases the GIL, and a good run after it makes runs short again.
    stop = eort.RunOptions()
    stop.terminate = True
    with pytest.raises(Exception, match="terminate"):
        s.run(None, feed, stop)
    assert not runner.keeps_gil(size)
    s.run(None, feed)
    assert runner.keeps_gil(size)
    # A Loop's time does not follow its inputs: never, however short its runs.
    loop = eort.InferenceSession(here("models", "loop.onnx"))
    loop.run(None, {"m": np.array(1)})
    assert not loop._fast.keeps_gil(8)
    # With no run short enough, the same Add never keeps it.
    monkeypatch.setattr(_fast, "HOLD_GIL_BELOW_NS", 0)
    never = eort.InferenceSession(example("add.onnx"))
    never.run(None, feed)
    assert not never._fast.keeps_gil(size)
    assert _fast.may_hold_gil({"nodes": [{"op_type": "Add", "provider": "cpu"}]})
    for report in ({"nodes": [{"op_type": "Add", "provider": "openvino"}]},
                   {"nodes": [{"op_type": "If", "provider": "cpu"}]},
                   {"nodes": [{"op_type": "Add", "provider": "cpu"}], "isolated_providers": ["x"]},
                   {"nodes": []}, None):
        assert not _fast.may_hold_gil(report), report


def test_epx_sessions_take_the_native_path_with_the_same_answers():
    s = epx.Session(example("add.onnx"))
    if s._fast is None:
        pytest.skip("no native path in this install")
    feed = {n: np.load(example(f"add.input.{n}.npy")) for n in ("a", "b")}
    slow = epx.Session(example("add.onnx"))
    slow._fast = None
    for names in (None, ["sum"], []):
        fast_out, slow_out = s.run(feed, names), slow.run(feed, names)
        assert list(fast_out) == list(slow_out)
        assert all(np.array_equal(fast_out[k], slow_out[k]) for k in fast_out)
    s.close()
    with pytest.raises(epx.EpxError, match="close"):
        s.run(feed)


def test_epx_session_outputs_stay_valid_after_the_run_that_made_them():
    s = epx.Session(example("mnist-cnn.onnx"))
    x = np.load(example("mnist-cnn.input.image.npy"))
    first = s.run({"image": x})["probabilities"]
    second = s.run({"image": x + 1})["probabilities"]
    assert not np.array_equal(first, second)
    assert np.allclose(first, np.load(example("mnist-cnn.output.probabilities.npy")), atol=1e-5)


RESIZE_RACE = """
import sys, threading, faulthandler, weakref
import numpy as np, epx
faulthandler.enable()
path, what, rounds = sys.argv[1], sys.argv[2], 20
# The canary: a weak reference is what makes numpy refuse to resize an array.
a = np.ones(8, np.float32); w = weakref.ref(a)
try:
    a.resize(16, refcheck=False); sys.exit("numpy resized an array with a weak reference")
except ValueError:
    pass
del w
model = {models!r} + ("/identities.onnx" if what == "values" else "/metadata.onnx")
s = epx.Session(model)
if path == "native" and s._fast is None:
    print("SKIP no native path"); sys.exit(0)
small = {{v.name: (np.array(["a"]) if v.dtype is None else np.zeros(2, v.dtype))
         for v in s.inputs}}
N = 1 << 22                                    # 48 MiB of float32: a block of its own
go, done, stop = threading.Event(), threading.Event(), False
box, refused, resized = [None], [0], [0]
def resizer():
    while True:
        go.wait(); go.clear()
        if stop:
            return
        try:
            box[0].resize((1, 3), refcheck=False)  # would free the rest of the block
            resized[0] += 1
        except ValueError:
            refused[0] += 1
        done.set()
t = threading.Thread(target=resizer); t.start()
sys.setswitchinterval(1000)                    # the resizer runs as soon as the run lets go
for r in range(rounds):
    x = box[0] = np.ones((N, 3), np.float32)
    feed = {{"x": x}} if what != "values" else dict(small, x_float=x)
    go.set()
    try:
        s.run(feed)
    except epx.EpxError:
        pass                                   # a values model may refuse the shapes: no crash
    done.wait(); done.clear()
stop = True; go.set(); t.join()
print("OK refused", refused[0], "resized", resized[0])
"""


@pytest.mark.parametrize("path,what", [("native", "tensors"), ("ctypes", "tensors"),
                                       ("ctypes", "values")])
def test_an_input_cannot_be_resized_while_a_run_reads_it(path, what):
    """Another thread calls `ndarray.resize(..., refcheck=False)` on an input the moment a run
    lets go of the GIL: the array is held for the run, the resize is refused (ValueError), and
    nothing is freed under the run. In a child process: a regression is a signal there, not
    here."""
    env = {"EPX_PYTHON_NATIVE": "1" if path == "native" else "0"}
    code = RESIZE_RACE.format(models=here("models"))
    out = subprocess.run([sys.executable, "-c", code, path, what], capture_output=True,
                         text=True, env=dict(os.environ, **env), timeout=600)
    if "SKIP" in out.stdout:
        pytest.skip("no native path in this install")
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    words = out.stdout.split()
    assert words[:2] == ["OK", "refused"], out.stdout
    # Every resize that raced a run was refused (one before a run took the array is fine).
    assert int(words[2]) >= 19, out.stdout


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_a_closed_run_options_gives_one_clear_error(path, monkeypatch):
    """Closed options are libepx's error on every path (never a TypeError, never a run that
    goes ahead uncancellable), as the C API gives it for a freed handle."""
    monkeypatch.setenv("EPX_PYTHON_NATIVE", "1" if path == "native" else "0")
    feed = {n: np.load(example(f"add.input.{n}.npy")) for n in ("a", "b")}
    s = epx.Session(example("add.onnx"))
    if path == "native" and s._fast is None:
        pytest.skip("no native path in this install")
    assert (s._fast is None) == (path == "ctypes")
    ro = epx.RunOptions()
    ro.terminate()
    ro.close()
    closed = "the run option set is closed: epx_run_options_free was called on it"
    with pytest.raises(epx.EpxError, match=closed) as e:
        s.run(feed, run_options=ro)
    assert e.value.code == 1
    with pytest.raises(epx.EpxError, match=closed):
        ro.terminate()
    ro.close()  # a second close does nothing
    o = eort.InferenceSession(example("add.onnx"))
    r = eort.RunOptions()
    r._epx().close()
    with pytest.raises(eort.InvalidArgument, match=closed):
        o.run(None, feed, r)
