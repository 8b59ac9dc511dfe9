"""`epx.onnxruntime` against ONNX Runtime's whole public Python API, enumerated from the installed
`onnxruntime` package, and the behaviour of the calls that map onto epx (devices, selection
policies, plugin libraries, placement, free dimensions, asynchronous runs, cancellation)."""

import copy
import inspect
import os
import threading
import types

import numpy as np
import pytest

import epx.onnxruntime as eort
from conftest import example, here, plugin_folder

ort = pytest.importorskip("onnxruntime", reason="the API is enumerated from onnxruntime")
MNIST = example("mnist-cnn.onnx")
MNIST_IN = example("mnist-cnn.input.image.npy")


def public_surface(module):
    """{name: [member, ...]} of every public function, class and constant of `module` (modules
    it imports aside); a class lists its public attributes."""
    out = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            continue
        out[name] = sorted(m for m in dir(value) if not m.startswith("_")) \
            if inspect.isclass(value) else []
    return out


def instances(module, session):
    """Instances of the classes whose members are set per instance, by class name."""
    made = {
        "SessionOptions": module.SessionOptions(),
        "RunOptions": module.RunOptions(),
        "InferenceSession": session,
        "NodeArg": session.get_inputs()[0],
        "ModelMetadata": session.get_modelmeta(),
        "OrtValue": module.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32)),
        "IOBinding": session.io_binding(),
        "SessionIOBinding": session.io_binding(),
        "OrtMemoryInfo": session.get_input_memory_infos()[0],
        "OrtArenaCfg": module.OrtArenaCfg(0, -1, -1, -1),
        # ONNX Runtime makes these itself (no public constructor); epx's can be made to probe.
        "OrtEpAssignedNode": module.OrtEpAssignedNode("n", "Relu", ""),
        "OrtEpAssignedSubgraph": module.OrtEpAssignedSubgraph("CPUExecutionProvider", []),
        "OrtEpContextData": module.OrtEpContextData(b""),
        "OrtEpContextDataBuffer": module.OrtEpContextDataBuffer(0),
        "OrtExternalInitializerInfo": module.OrtExternalInitializerInfo("w.bin", 0, 0),
    }
    devices = module.get_ep_devices()
    if devices:
        made["OrtEpDevice"] = devices[0]
        made["OrtHardwareDevice"] = devices[0].device
    return made


def missing_names():
    ours = public_surface(eort)
    session = eort.InferenceSession(MNIST)
    made = instances(eort, session)
    missing = []
    for name, members in public_surface(ort).items():
        if name not in ours:
            missing.append(name)
            continue
        cls = getattr(eort, name)
        probe = made.get(name)
        if probe is None and inspect.isclass(cls) and issubclass(cls, int):
            probe = next(iter(cls))  # an enum: its members carry `name` and `value`
        for m in members:
            if not hasattr(cls, m) and not (probe is not None and hasattr(probe, m)):
                missing.append(f"{name}.{m}")
    return missing


def test_every_public_name_of_onnxruntime_is_here():
    assert ort.__version__ == eort.__version__, (ort.__version__, eort.__version__)
    missing = missing_names()
    assert not missing, f"{len(missing)} names of onnxruntime {ort.__version__} are missing: " \
                        f"{', '.join(missing)}"


def test_the_exception_classes_of_the_native_module_are_here():
    from onnxruntime.capi import onnxruntime_pybind11_state as theirs

    import epx.onnxruntime.capi.onnxruntime_pybind11_state as ours
    names = [n for n in dir(theirs) if inspect.isclass(getattr(theirs, n))
             and issubclass(getattr(theirs, n), Exception)]
    assert len(names) >= 14, names
    assert [n for n in names if not hasattr(ours, n)] == []
    # Raised errors read as ONNX Runtime's.
    with pytest.raises(ours.NoSuchFile, match=r"^\[ONNXRuntimeError\] : 3 : NO_SUCHFILE : "):
        eort.InferenceSession("/nonexistent/model.onnx")


def test_what_cannot_exist_in_epx_raises_onnxruntimes_exception_saying_why():
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.NotImplemented, match="LoRA"):
        eort.LoraAdapter().Load("adapter.onnx_adapter")
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.NotImplemented, match="LoRA"):
        eort.RunOptions().add_active_adapter(None)
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.NotImplemented, match="LoRA"):
        eort.AdapterFormat()


def test_ep_devices_come_from_epxs_device_list_and_choose_the_devices_of_a_session():
    import epx
    devices = eort.get_ep_devices()
    assert len(devices) == len(epx.devices())
    cpu = [d for d in devices if d.ep_name == "CPUExecutionProvider"]
    assert cpu and cpu[0].device.type == eort.OrtHardwareDeviceType.CPU
    assert cpu[0].memory_info(eort.OrtDeviceMemoryType.DEFAULT).name == "Cpu"
    so = eort.SessionOptions()
    assert not so.has_providers()
    so.add_provider_for_devices(cpu[:1], {})
    assert so.has_providers()
    s = eort.InferenceSession(MNIST, so)
    assert s.get_providers() == ["CPUExecutionProvider"]
    other = copy.copy(cpu[0])
    other.ep_name = "OpenVINOExecutionProvider"
    with pytest.raises(eort.InvalidArgument, match="one EP"):
        eort.SessionOptions().add_provider_for_devices([cpu[0], other], {})


def test_the_cpu_device_is_described_as_onnxruntime_describes_it():
    theirs = next(d for d in ort.get_ep_devices() if d.ep_name == "CPUExecutionProvider")
    ours = next(d for d in eort.get_ep_devices() if d.ep_name == "CPUExecutionProvider")
    describe = lambda d: (int(d.device.type), d.device.vendor, d.device.vendor_id)  # noqa: E731
    assert describe(ours) == describe(theirs)


def test_selection_policies_and_the_delegate_choose_through_epx():
    x = np.load(MNIST_IN)
    want = eort.InferenceSession(MNIST).run(None, {"image": x})[0]
    for policy in eort.OrtExecutionProviderDevicePolicy:
        so = eort.SessionOptions()
        so.set_provider_selection_policy(policy)
        assert so.has_providers()
        got = eort.InferenceSession(MNIST, so).run(None, {"image": x})[0]
        assert np.allclose(got, want, atol=1e-5), policy
    seen = {}

    def delegate(ep_devices, model_metadata, runtime_metadata, max_selections):
        seen["devices"] = ep_devices
        seen["max"] = max_selections
        return [d for d in ep_devices if d.ep_name == "CPUExecutionProvider"]

    so = eort.SessionOptions()
    so.set_provider_selection_policy_delegate(delegate)
    s = eort.InferenceSession(MNIST, so)
    assert seen["devices"] and all(isinstance(d, eort.OrtEpDevice) for d in seen["devices"])
    assert seen["max"] == len(seen["devices"])
    assert s.get_providers() == ["CPUExecutionProvider"]

    so = eort.SessionOptions()
    so.set_provider_selection_policy_delegate(lambda *a: ["not a device"])
    with pytest.raises(TypeError, match="OrtEpDevice"):
        eort.InferenceSession(MNIST, so)


def test_graph_assignment_info_is_the_placement_report_when_asked_for():
    s = eort.InferenceSession(MNIST)
    with pytest.raises(eort.Fail, match="record_ep_graph_assignment_info"):
        s.get_provider_graph_assignment_info()
    so = eort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    s = eort.InferenceSession(MNIST, so)
    parts = s.get_provider_graph_assignment_info()
    nodes = [(n.name, n.op_type) for p in parts for n in p.get_nodes()]
    assert {p.ep_name for p in parts} == {"CPUExecutionProvider"}
    placed = [(n["name"], n["op_type"]) for n in s.epx_session.placement()["nodes"]]
    assert sorted(nodes) == sorted(placed) and ("conv1", "Conv") in nodes


def test_a_plugin_library_registers_lists_its_eps_and_unregisters(tmp_path, fixture_library):
    before = {d.ep_name for d in eort.get_ep_devices()}
    folder = plugin_folder(str(tmp_path), fixture_library)
    library = os.path.join(folder, os.path.basename(fixture_library))
    eort.register_execution_provider_library("fixture", library)
    try:
        with pytest.raises(eort.InvalidArgument, match="already registered"):
            eort.register_execution_provider_library("fixture", library)
        names = {p for p in eort.get_available_providers()}
        assert "relu_only" in names, names
        s = eort.InferenceSession(example("mnist-cnn.onnx"), providers=["relu_only"])
        assert s.get_providers()[0] == "relu_only"
    finally:
        eort.unregister_execution_provider_library("fixture")
    assert "relu_only" not in eort.get_available_providers()
    assert {d.ep_name for d in eort.get_ep_devices()} == before
    with pytest.raises(eort.InvalidArgument, match="No execution provider library"):
        eort.unregister_execution_provider_library("fixture")
    with pytest.raises(eort.Fail, match="does not exist"):
        eort.register_execution_provider_library("nothing", "/nonexistent/libx.so")
    # A bare library (no plugin.toml beside it) loads too; one built for another ABI is refused.
    eort.register_execution_provider_library("bare", fixture_library)
    assert "relu_only" in eort.get_available_providers()
    eort.unregister_execution_provider_library("bare")
    too_new = os.path.join(os.path.dirname(fixture_library), "libepx_fixture_abi_too_new.so")
    with pytest.raises(eort.EPFail, match="ABI"):
        eort.register_execution_provider_library("too_new", too_new)


def test_a_free_dimension_override_fixes_the_extent_as_in_onnxruntime():
    path = here("models", "metadata.onnx")  # x: [batch, 3]
    results = []
    for module in (ort, eort):
        so = module.SessionOptions()
        so.add_free_dimension_override_by_name("batch", 2)
        s = module.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        shape = s.get_inputs()[0].shape
        ok = s.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape
        with pytest.raises(Exception) as bad:
            s.run(None, {"x": np.ones((4, 3), np.float32)})
        results.append((shape, ok, type(bad.value).__name__, str(bad.value).split(":")[:3]))
    assert results[0] == results[1], results
    assert "Got invalid dimensions for input: x" in str(bad.value)


def test_run_async_calls_back_from_another_thread_with_results_or_the_error():
    s = eort.InferenceSession(MNIST)
    x = np.load(MNIST_IN)
    done = threading.Event()
    got = {}

    def callback(results, user_data, err):
        got.update(results=results, user_data=user_data, err=err,
                   thread=threading.current_thread())
        done.set()

    s.run_async(None, {"image": x}, callback, "mine")
    assert done.wait(60)
    assert got["err"] == "" and got["user_data"] == "mine"
    assert got["thread"] is not threading.main_thread()
    assert np.allclose(got["results"][0], s.run(None, {"image": x})[0])
    done.clear()
    s.run_async(None, {"image": x[..., :5]}, callback, None)
    assert done.wait(60) and got["err"] and got["results"] == []


def test_ortvalue_vectors_dlpack_and_onnx_typed_values():
    s = eort.InferenceSession(MNIST)
    x = eort.OrtValue.ortvalue_from_numpy(np.load(MNIST_IN))
    fetches = eort.capi.onnxruntime_pybind11_state.OrtValueVector()
    s.run_with_ortvaluevector(eort.RunOptions(), ["image"], [x], ["probabilities"], fetches,
                              [None])
    assert len(fetches) == 1 and fetches[0].shape() == [1, 10]
    assert x.tensor_size_in_bytes() == x.numpy().nbytes
    f16 = eort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(3, np.uint16), 10)
    assert f16.data_type() == "tensor(float16)"
    shared = eort.OrtValue.from_dlpack(x.numpy())
    assert shared.data_ptr() == x.data_ptr()
    binding = s.io_binding()
    binding.bind_ortvalue_input("image", x)
    binding.bind_output("probabilities")
    s.run_with_iobinding(binding)
    assert len(binding.get_outputs_as_ortvaluevector()) == 1
    dst = eort.OrtValue.ortvalue_from_shape_and_type([1, 10], np.float32)
    eort.copy_tensors(binding.get_outputs(), [dst])
    assert np.array_equal(dst.numpy(), binding.get_outputs()[0].numpy())


def test_sparse_tensors_are_values_that_a_run_refuses():
    dense = np.array([2, 3], np.int64)
    coo = eort.SparseTensor.sparse_coo_from_numpy(dense, np.array([1.0, 2.0], np.float32),
                                                  np.array([0, 4], np.int64),
                                                  eort.OrtDevice.make("cpu", 0))
    assert coo.format() == eort.OrtSparseFormat.ORT_SPARSE_COO
    assert list(coo.as_coo_view().indices()) == [0, 4]
    v = eort.OrtValue.ort_value_from_sparse_tensor(coo)
    assert v.is_sparse_tensor() and v.as_sparse_tensor() is coo
    with pytest.raises(eort.Fail, match="CSR"):
        coo.as_csrc_view()


@pytest.mark.parametrize("module", [ort, eort], ids=["onnxruntime", "epx"])
def test_run_options_terminate_cancels_a_long_loop_from_another_thread(module):
    import time
    session = module.InferenceSession(here("models", "loop.onnx"),
                                      providers=["CPUExecutionProvider"])
    ro = module.RunOptions()
    ro.terminate = True
    with pytest.raises(module.capi.onnxruntime_pybind11_state.Fail,
                       match="Exiting due to terminate flag being set to true"):
        session.run(None, {"m": np.array(5)}, ro)
    ro.terminate = False
    assert session.run(None, {"m": np.array(5)}, ro)[0].tolist() == [0, 1, 2, 3, 4]

    def stop():
        time.sleep(0.3)
        ro.terminate = True
        stopped.append(time.monotonic())

    stopped = []
    threading.Thread(target=stop).start()
    with pytest.raises(module.capi.onnxruntime_pybind11_state.Fail, match="terminate flag"):
        session.run(None, {"m": np.array(10 ** 10)}, ro)
    # Ten billion iterations take hours; the run ended within a second of the flag.
    assert stopped and time.monotonic() - stopped[0] < 1.0


def test_load_cancellation_and_the_compiler_without_epcontext(tmp_path):
    so = eort.SessionOptions()
    so.set_load_cancellation_flag(True)
    with pytest.raises(eort.capi.onnxruntime_pybind11_state.ModelLoadCanceled):
        eort.InferenceSession(MNIST, so)
    so.set_load_cancellation_flag(False)
    eort.InferenceSession(MNIST, so)
    out = tmp_path / "mnist_ctx.onnx"
    eort.ModelCompiler(eort.SessionOptions(), MNIST).compile_to_file(str(out))
    assert out.read_bytes() == open(MNIST, "rb").read()
    strict = eort.ModelCompiler(eort.SessionOptions(), MNIST,
                                flags=eort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
    with pytest.raises(eort.Fail, match="kernel cache"):
        strict.compile_to_bytes()


def test_module_functions_behave_as_onnxruntimes_cpu_package(capsys):
    assert eort.has_collective_ops() is False
    assert eort.cuda_version == "" and eort.package_name == "onnxruntime"
    eort.disable_telemetry_events()
    eort.enable_telemetry_events()
    eort.preload_dlls()
    eort.set_seed(1)
    assert eort.get_build_info().startswith("epx ")
    eort.print_debug_info()
    assert "Available providers" in capsys.readouterr().out
    eort.create_and_register_allocator(eort.OrtMemoryInfo("CpuShared"), eort.OrtArenaCfg({}))
    with pytest.raises(eort.InvalidArgument, match="already registered"):
        eort.create_and_register_allocator(eort.OrtMemoryInfo("CpuShared"), None)
