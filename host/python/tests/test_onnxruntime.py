"""`epx.onnxruntime`: ONNX Runtime's Python API on epx, checked against ONNX Runtime itself
(installed in the same venv) on the same models and calls."""

import os
import warnings

import numpy as np
import pytest

import epx
import epx.onnxruntime as eort
from conftest import example, here, python, repo

ort = pytest.importorskip("onnxruntime", reason="the comparison needs onnxruntime in this venv")

MODELS = [
    (example("mnist-cnn.onnx"), lambda: {"image": np.load(example("mnist-cnn.input.image.npy"))}),
    (example("mlp-int.onnx"), lambda: {"x": np.load(example("mlp-int.input.x.npy"))}),
    (here("models", "metadata.onnx"), lambda: {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}),
    (repo("tests", "models", "sklearn-values", "tfidf-text", "model.onnx"),
     lambda: {"text": np.load(repo("tests", "models", "sklearn-values", "tfidf-text", "input", "text.npy"))}),
]


def both(path, **kwargs):
    return (ort.InferenceSession(path, providers=["CPUExecutionProvider"], **kwargs),
            eort.InferenceSession(path, providers=["CPUExecutionProvider"], **kwargs))


def same(a, b):
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), (k, a[k], b[k])
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        if a.dtype.kind in "fc":
            assert np.allclose(a, b, rtol=1e-4, atol=1e-5), np.max(np.abs(a - b))
        else:
            assert np.array_equal(a, b)


@pytest.mark.parametrize("path,feeds", MODELS, ids=lambda p: os.path.basename(str(p)))
def test_sessions_describe_and_run_as_onnxruntime_does(path, feeds):
    o, e = both(path)
    for get in ("get_inputs", "get_outputs", "get_overridable_initializers"):
        want = [(a.name, a.type, a.shape) for a in getattr(o, get)()]
        got = [(a.name, a.type, a.shape) for a in getattr(e, get)()]
        assert got == want, (get, got, want)
    mo, me = o.get_modelmeta(), e.get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description",
                  "version", "custom_metadata_map"):
        assert getattr(me, field) == getattr(mo, field), field
    assert e.get_providers() == o.get_providers() == ["CPUExecutionProvider"]
    f = feeds()
    same(o.run(None, f), e.run(None, f))
    last = [o.get_outputs()[-1].name]
    same(o.run(last, f), e.run(last, f))


def test_module_level_functions():
    assert "CPUExecutionProvider" == eort.get_available_providers()[-1]
    assert eort.get_device() == "CPU"
    assert "CUDAExecutionProvider" in eort.get_all_providers()
    assert isinstance(eort.__version__, str) and eort.get_version_string() == eort.__version__


def test_provider_names_and_options_map_to_epx_eps():
    path = example("mnist-cnn.onnx")
    with pytest.warns(UserWarning, match="Specified provider 'CUDAExecutionProvider' is not in available"):
        s = eort.InferenceSession(path, providers=[("CUDAExecutionProvider", {"device_id": 0}),
                                                   ("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})])
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert s.get_provider_options() == {"CPUExecutionProvider": {"arena_extend_strategy": "kSameAsRequested"}}
    with pytest.raises(ValueError, match="Unknown Provider Type: FrobnicatorExecutionProvider"):
        eort.InferenceSession(path, providers=["FrobnicatorExecutionProvider"])
    with pytest.raises(ValueError, match="same length"):
        eort.InferenceSession(path, providers=["CPUExecutionProvider"], provider_options=[{}, {}])
    with pytest.raises(ValueError, match="unknown options colour"):
        eort.InferenceSession(path, providers=[("CPUExecutionProvider", {"colour": "red"})])
    # ONNX Runtime's own CPU EP through the adapter, by epx's name, when onnxruntime is here.
    s = eort.InferenceSession(path, providers=["ort_cpu"])
    assert s.get_providers() == ["ort_cpu", "CPUExecutionProvider"]
    assert {n["provider"] for n in s.epx_session.placement()["nodes"]} == {"ort_cpu"}


def test_session_and_run_options_are_accepted():
    so = eort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = eort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = eort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_cpu_mem_arena = False
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    s = eort.InferenceSession(example("add.onnx"), sess_options=so)
    assert s.get_session_options() is so
    ro = eort.RunOptions()
    ro.log_severity_level = 3
    feeds = {n: np.load(example(f"add.input.{n}.npy")) for n in ("a", "b")}
    same(s.run(None, feeds, ro), [np.load(example("add.output.sum.npy"))])
    ro.terminate = True
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.Fail, match="terminate flag"):
        s.run(None, feeds, ro)
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.NotImplemented, match="EP plugin"):
        so.register_custom_ops_library("/x/libcustom.so")
    so.optimized_model_filepath = "/tmp/never-written.onnx"
    with pytest.warns(RuntimeWarning, match="writes no optimized model"):
        eort.InferenceSession(example("add.onnx"), sess_options=so)
    assert not os.path.exists("/tmp/never-written.onnx")


def test_errors_are_onnxruntime_exception_classes_and_epx_errors():
    from epx.onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, InvalidProtobuf, NoSuchFile
    s = eort.InferenceSession(example("mnist-cnn.onnx"))
    o = ort.InferenceSession(example("mnist-cnn.onnx"), providers=["CPUExecutionProvider"])
    x = np.zeros((1, 1, 28, 28), np.float64)
    with pytest.raises(Exception) as want:
        o.run(None, {"image": x})
    with pytest.raises(InvalidArgument) as got:
        s.run(None, {"image": x})
    assert type(want.value).__name__ == "InvalidArgument"
    assert isinstance(got.value, epx.EpxError) and "image" in got.value.message
    with pytest.raises(ValueError, match=r"Required inputs \(\['image'\]\) are missing"):
        s.run(None, {})
    with pytest.raises(ValueError, match=r"Required inputs \(\['image'\]\) are missing"):
        o.run(None, {})
    with pytest.raises(InvalidProtobuf):
        eort.InferenceSession(b"\x08\x01garbage")
    with pytest.raises(NoSuchFile):
        eort.InferenceSession("/nonexistent/model.onnx")


def test_feeding_an_overridable_initializer_is_refused_clearly():
    s = eort.InferenceSession(here("models", "metadata.onnx"))
    from epx.onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
    with pytest.raises(InvalidArgument, match="bias: an initializer of the model"):
        s.run(None, {"x": np.ones((1, 3), np.float32), "bias": np.zeros(3, np.float32)})


def test_io_binding_and_ortvalues():
    path = example("mnist-cnn.onnx")
    x = np.load(example("mnist-cnn.input.image.npy"))
    want = np.load(example("mnist-cnn.output.probabilities.npy"))
    for mod in (ort, eort):
        s = mod.InferenceSession(path, providers=["CPUExecutionProvider"])
        b = s.io_binding()
        b.bind_cpu_input("image", x)
        b.bind_output("probabilities")
        s.run_with_iobinding(b)
        got = b.copy_outputs_to_cpu()[0]
        assert np.max(np.abs(got - want)) <= 1e-5, mod.__name__
        assert b.get_outputs()[0].shape() == [1, 10]
        # An OrtValue input, and the output written into a preallocated buffer.
        xv = mod.OrtValue.ortvalue_from_numpy(x, "cpu", 0)
        assert xv.shape() == [1, 1, 28, 28] and xv.data_type() == "tensor(float)"
        assert xv.device_name() == "cpu" and xv.is_tensor()
        out = np.zeros((1, 10), np.float32)
        b = s.io_binding()
        b.bind_ortvalue_input("image", xv)
        b.bind_output("probabilities", "cpu", 0, np.float32, [1, 10], out.ctypes.data)
        s.run_with_iobinding(b)
        assert np.max(np.abs(out - want)) <= 1e-5, mod.__name__
        # A raw host pointer as input.
        b = s.io_binding()
        b.bind_input("image", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
        b.bind_output("probabilities")
        s.run_with_iobinding(b)
        assert np.max(np.abs(b.copy_outputs_to_cpu()[0] - want)) <= 1e-5
    s = eort.InferenceSession(path)
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.EPFail, match="host memory only"):
        s.io_binding().bind_input("image", "cuda", 0, np.float32, [1, 1, 28, 28], x.ctypes.data)
    vals = s.run_with_ort_values(None, {"image": eort.OrtValue.ortvalue_from_numpy(x)})
    assert np.max(np.abs(vals[0].numpy() - want)) <= 1e-5
    assert np.shares_memory(np.from_dlpack(vals[0]), vals[0].numpy())


def test_install_makes_import_onnxruntime_give_epx():
    out = python(
        "import epx.onnxruntime; epx.onnxruntime.install()\n"
        "import onnxruntime\n"
        "from onnxruntime import InferenceSession, GraphOptimizationLevel\n"
        "from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument\n"
        "import epx\n"
        "assert onnxruntime is epx.onnxruntime and issubclass(InvalidArgument, epx.EpxError)\n"
        f"s = InferenceSession({example('add.onnx')!r})\n"
        "print(type(s).__module__)\n")
    assert out.stdout.strip() == "epx.onnxruntime", out.stdout


def test_binding_a_null_buffer_is_refused():
    from epx.onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
    sess = eort.InferenceSession(example("add.onnx"), providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    with pytest.raises(InvalidArgument, match="buffer_ptr is NULL"):
        binding.bind_input("a", "cpu", 0, np.float32, [1, 4], 0)


def test_a_model_path_that_never_ends_is_refused_at_once():
    with pytest.raises(Exception, match="not a regular file"):
        eort.InferenceSession("/dev/zero")
