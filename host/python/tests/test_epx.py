"""`import epx`: the Pythonic API over libepx, as installed from the wheel."""

import json
import os
import shutil
import sys
import textwrap

import numpy as np
import pytest

import epx
from conftest import example, here, plugin_folder, python, repo


def test_the_package_is_the_installed_wheel_with_its_library_and_plugins():
    pkg = os.path.dirname(epx.__file__)
    assert pkg.startswith(sys.prefix), (pkg, sys.prefix)
    lib = epx.Library.default()
    assert lib.path == os.path.join(pkg, "lib", "libepx.so"), lib.path
    assert epx.version().count(".") == 2
    assert epx.plugin_abi_version().startswith("1.")
    plugins = os.listdir(os.path.join(pkg, "lib", "epx", "plugins"))
    assert {"openvino", "ort_cpu", "cuda"} <= set(plugins), plugins
    for name in plugins:
        assert os.path.exists(os.path.join(pkg, "lib", "epx", "plugins", name, "plugin.toml"))


def test_providers_and_doctor_are_plain_data():
    eps = {p.name: p for p in epx.providers()}
    assert eps["cpu"].available and eps["cpu"].reason is None
    # The shipped plugins are listed; one that cannot run here says why.
    assert "cuda" in eps and "openvino" in eps, sorted(eps)
    for p in eps.values():
        assert p.available or p.reason, p
    report = epx.doctor()
    assert "plugin search path" in report.text and isinstance(report.ok, bool)
    assert f"plugin ABI {epx.plugin_abi_version()}" in report.text


def test_the_shipped_ort_cpu_plugin_finds_onnxruntime_in_this_environment():
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed in this venv")
    eps = {p.name: p for p in epx.providers()}
    assert eps["ort_cpu"].available, eps["ort_cpu"].reason
    s = epx.Session(example("mnist-cnn.onnx"), providers=["ort_cpu"], strict=True)
    out = s.run({"image": np.load(example("mnist-cnn.input.image.npy"))})
    want = np.load(example("mnist-cnn.output.probabilities.npy"))
    assert np.max(np.abs(out["probabilities"] - want)) <= 1e-5
    assert {n["provider"] for n in s.placement()["nodes"]} == {"ort_cpu"}


def test_a_session_from_a_path_runs_and_describes_itself():
    s = epx.Session(example("mnist-cnn.onnx"), providers=["cpu"])
    assert [(i.name, i.type, i.dtype, i.shape) for i in s.inputs] == [
        ("image", "tensor(float)", np.dtype(np.float32), (1, 1, 28, 28))]
    assert [(o.name, o.type) for o in s.outputs] == [("probabilities", "tensor(float)")]
    out = s.run({"image": np.load(example("mnist-cnn.input.image.npy"))})
    want = np.load(example("mnist-cnn.output.probabilities.npy"))
    got = out["probabilities"]
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-5
    placement = s.placement()
    assert len(placement["nodes"]) == 11 and {n["provider"] for n in placement["nodes"]} == {"cpu"}
    json.dumps(placement)  # plain data


def test_a_profiling_session_says_where_the_time_went_and_restarts_from_zero():
    s = epx.Session(example("mnist-cnn.onnx"), profile=True, intra_op_threads=1)
    image = np.load(example("mnist-cnn.input.image.npy"))
    for _ in range(3):
        s.run({"image": image})
    p = s.profile(restart=True)
    assert p["runs"] == 3 and p["run_ns"] > 0
    [k] = p["kernels"]
    assert k["provider"] == "cpu" and k["calls"] == 3 and k["whole"] is None
    assert {part["op"] for part in k["parts"]} >= {"Conv+Relu", "MaxPool", "Gemm"}
    assert all(part["calls"] == 3 for part in k["parts"])
    assert sum(part["ns"] for part in k["parts"]) <= k["ns"]
    assert any(n["name"] == "fold_batch_norm" and n["changed"] == 1 for n in k["passes"])
    assert s.profile()["runs"] == 0
    plain = epx.Session(example("mnist-cnn.onnx"))
    with pytest.raises(epx.EpxError, match="made without profiling"):
        plain.profile()


def test_a_session_from_bytes_with_threads_and_strict_placement():
    with open(example("mlp-int.onnx"), "rb") as f:
        s = epx.Session(f.read(), strict=True, intra_op_threads=1)
    feeds = {i.name: np.load(example(f"mlp-int.input.{i.name}.npy")) for i in s.inputs}
    for name, value in s.run(feeds).items():
        want = np.load(example(f"mlp-int.output.{name}.npy"))
        assert value.dtype == want.dtype and np.array_equal(value, want), name


def test_outputs_are_numpy_views_of_libepx_memory_and_stay_valid():
    s = epx.Session(example("mnist-cnn.onnx"))
    x = np.load(example("mnist-cnn.input.image.npy"))
    got = s.run({"image": x})["probabilities"]
    want = got.copy()
    # The array owns nothing itself: its base chain ends at libepx's buffer, freed with it.
    assert not got.flags.owndata and got.flags.writeable
    del s
    for _ in range(3):  # other runs and sessions reuse memory; this view must not change
        epx.Session(example("mnist-cnn.onnx")).run({"image": x * 0.5})
    assert np.array_equal(got, want)
    # DLPack and the array protocol share the buffer, no copy.
    assert np.shares_memory(np.from_dlpack(got), got)
    assert np.shares_memory(np.asarray(got), got)


class HostTensor:
    """An array-like that offers only DLPack, as a framework's CPU tensor does."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, *args, **kwargs):
        return self._arr.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_inputs_with_dlpack_are_read():
    s = epx.Session(example("add.onnx"))
    a, b = (np.load(example(f"add.input.{n}.npy")) for n in ("a", "b"))
    out = s.run({"a": HostTensor(a), "b": HostTensor(b)})
    assert np.array_equal(out["sum"], np.load(example("add.output.sum.npy")))


def test_torch_tensors_go_in_and_come_out_through_dlpack():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed in this venv")
    s = epx.Session(example("add.onnx"))
    a, b = (np.load(example(f"add.input.{n}.npy")) for n in ("a", "b"))
    out = s.run({"a": torch.from_numpy(a), "b": torch.from_numpy(b)})["sum"]
    t = torch.from_dlpack(out)
    assert t.data_ptr() == out.ctypes.data


def test_a_plugin_that_crashes_the_loader_is_listed_as_broken(tmp_path):
    """libepx opens each plugin in a child process (the wheel's bin/epx) before loading it, so a
    library whose constructor faults is a row with the signal, not the end of Python."""
    import subprocess
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the faulting library")
    src = tmp_path / "segv.c"
    src.write_text("__attribute__((constructor)) static void boom(void) { *(volatile int *)0 = 1; }\n")
    plugins = tmp_path / "plugins"
    plugins.mkdir(mode=0o755)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(plugins / "libepx_segv.so"), str(src)],
                   check=True)
    env = epx.Environment(plugin_dirs=[plugins], discover=False)
    rows = {p.name: p for p in env.providers()}
    assert not rows["segv"].available
    assert "killed by signal 11 (SIGSEGV)" in rows["segv"].reason, rows["segv"].reason
    assert rows["cpu"].available
    report = env.doctor()
    assert not report.ok and "SIGSEGV" in report.text, report.text


def _adversarial_plugins(tmp_path):
    """A plugin folder holding the `adversarial` fixture (a Relu EP with fake devices)."""
    folder = os.environ.get("EPX_TEST_FIXTURES")
    if not folder:
        pytest.skip("EPX_TEST_FIXTURES is not set: no adversarial fixture plugin")
    library = os.path.join(folder, "libepx_fixture_adversarial.so")
    plugin = tmp_path / "plugins" / "adversarial"
    plugin.mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "plugins", 0o755)
    shutil.copy(library, plugin)
    (plugin / "plugin.toml").write_text(textwrap.dedent(f"""\
        name = "adversarial"
        version = "0.1.0"
        abi = "1.8"
        providers = ["adversarial"]

        [library]
        linux = "{os.path.basename(library)}"
        """))
    return tmp_path / "plugins"


def test_devices_are_listed_with_why_one_is_unusable(tmp_path):
    env = epx.Environment(plugin_dirs=[_adversarial_plugins(tmp_path)], discover=False)
    devices = {d["selector"]: d for d in env.devices()}
    gpu = devices["adversarial:0"]["device"]
    assert gpu["kind"] == "gpu" and gpu["memory_bytes"] == 8 << 30 and gpu["unusable"] is None
    npu = devices["adversarial:NPU.0"]["device"]
    assert npu["kind"] == "npu" and "older than the 2.0" in npu["unusable"], npu
    assert devices["cpu:0"]["device"]["kind"] == "cpu"
    # A session on a listed device, by its selector; an unusable one is an error saying why.
    model = example("mnist-cnn.onnx")
    s = epx.Session(model, ["adversarial:0"], env=env)
    assert s.placement()["devices"] == [["adversarial", "adversarial:0"]]
    with pytest.raises(epx.EpxError) as e:
        epx.Session(model, ["adversarial:NPU.0"], env=env)
    assert "present but unusable" in str(e.value), str(e.value)
    # By policy: the usable GPU; the report says what was chosen and why.
    s = epx.Session(model, env=env, policy="max-performance")
    sel = s.placement()["selection"]
    # The fake GPU first, then the CPU the wheel's ort_cpu lists (ONNX Runtime's device list).
    assert sel["policy"] == "max-performance", sel
    assert sel["chosen"] == ["adversarial:0", "ort_cpu:0"], sel
    # By the program's own function, given the devices and the model.
    seen = {}

    def choose(devices, model_info):
        seen["devices"] = [d["selector"] for d in devices]
        seen["ops"] = model_info["op_types"]
        return ["adversarial:0"]

    s = epx.Session(model, env=env, policy=choose)
    assert s.placement()["selection"]["chosen"] == ["adversarial:0"]
    assert "adversarial:NPU.0" in seen["devices"] and ":Relu" in seen["ops"], seen

    def refuse(devices, model_info):
        raise LookupError("nothing suits this model")

    with pytest.raises(LookupError, match="nothing suits"):
        epx.Session(model, env=env, policy=refuse)


def test_a_second_session_rebuilds_its_kernels_from_the_cache(tmp_path, monkeypatch):
    """The fixture EP stores its kernels (ABI 1.6): the second session of the same model takes
    them, and the EP's recorded capability answer, from the cache folder; `kernel_cache=False`
    compiles afresh. The answers are the same each time."""
    monkeypatch.setenv("EPX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EPX_KERNEL_CACHE", raising=False)
    env = epx.Environment(plugin_dirs=[_adversarial_plugins(tmp_path)], discover=False)
    model = example("mnist-cnn.onnx")
    spec = [("adversarial", {"cache": "on"})]
    x = np.random.default_rng(1).standard_normal((1, 1, 28, 28), dtype=np.float32)
    cold = epx.Session(model, spec, env=env)
    name = cold.inputs[0].name
    uses = cold.placement()["kernel_cache"]
    assert len(uses) == 2 and not any(u["loaded"] for u in uses), uses
    assert all(u["note"].startswith("compiled and stored") for u in uses), uses
    warm = epx.Session(model, spec, env=env)
    placement = warm.placement()
    assert all(u["loaded"] for u in placement["kernel_cache"]), placement["kernel_cache"]
    assert placement["replayed_capabilities"] == ["adversarial"]
    off = epx.Session(model, spec, env=env, kernel_cache=False)
    assert off.placement()["kernel_cache"] == []
    want = cold.run({name: x})
    for s in (warm, off):
        got = s.run({name: x})
        assert all(np.array_equal(got[k], want[k]) for k in want)
    assert len(list((tmp_path / "cache" / "kernels").glob("*.kernel"))) == 3


def test_an_isolated_ep_that_crashes_raises_and_python_lives_on(tmp_path):
    """With `isolate=True` the EP runs in the wheel's bin/epx (`epx serve-plugin`): the fixture
    EP aborting on a NaN input fails that run with an EpxError; the next run starts a new
    process and answers again."""
    plugins = _adversarial_plugins(tmp_path)
    env = epx.Environment(plugin_dirs=[plugins], discover=False)
    s = epx.Session(example("mnist-cnn.onnx"), [("adversarial", {"mode": "abort_on_nan"})],
                    env=env, isolate=True)
    placed = {n["op_type"]: n["provider"] for n in s.placement()["nodes"]}
    assert placed["Relu"] == "adversarial", placed
    assert s.placement()["isolated_providers"] == ["adversarial"]
    name = s.inputs[0].name
    x = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    want = epx.Session(example("mnist-cnn.onnx")).run({name: x})
    got = s.run({name: x})
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    bad = x.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(epx.EpxError) as e:
        s.run({name: bad})
    assert "SIGABRT" in str(e.value), str(e.value)
    got = s.run({name: x})
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_errors_are_exceptions_with_code_and_message():
    def raises(code, needle, fn):
        with pytest.raises(epx.EpxError) as e:
            fn()
        assert e.value.code == code, (e.value.code, e.value.message)
        assert needle in e.value.message, e.value.message
        assert e.value.code_name == epx.ERROR_NAMES[code]

    s = epx.Session(example("mnist-cnn.onnx"))
    raises(2, "not a valid ONNX model", lambda: epx.Session(b"\x08\x01garbage"))
    raises(3, "nonexistent", lambda: epx.Session("/nonexistent.onnx"))
    raises(5, "frobnicator", lambda: epx.Session(example("add.onnx"), providers=["frobnicator"]))
    raises(5, "colour", lambda: epx.Session(example("add.onnx"), providers=[("cpu", {"colour": "red"})]))
    raises(8, "image", lambda: s.run({"imag": np.zeros((1, 1, 28, 28), np.float32)}))
    raises(8, "must have shape [1, 1, 28, 28]", lambda: s.run({"image": np.zeros((1, 1, 28, 27), np.float32)}))
    raises(8, "dtype", lambda: s.run({"image": np.zeros(3, dtype=object)}))
    raises(1, "no output 'nope'", lambda: s.run({"image": np.zeros((1, 1, 28, 28), np.float32)}, ["nope"]))


def test_the_tensor_limit_turns_a_huge_tensor_into_an_error():
    old = epx.max_tensor_bytes()
    assert old > 0
    s = epx.Session(example("mnist-cnn.onnx"))
    image = np.zeros((1, 1, 28, 28), np.float32)
    try:
        assert epx.set_max_tensor_bytes(1000) == 1000
        with pytest.raises(epx.EpxError) as e:
            s.run({"image": image})
        assert "more than the 1000" in e.value.message, e.value.message
    finally:
        epx.set_max_tensor_bytes(old)
    assert s.run({"image": image})["probabilities"].shape == (1, 10)
    # A session's own limit, for that session alone (here its weights are already too big).
    with pytest.raises(epx.EpxError) as e:
        epx.Session(example("mnist-cnn.onnx"), max_tensor_bytes=1000)
    assert "more than the 1000" in e.value.message, e.value.message
    assert epx.max_tensor_bytes() == old
    assert s.run({"image": image})["probabilities"].shape == (1, 10)


def test_model_metadata_and_symbolic_extents():
    s = epx.Session(here("models", "metadata.onnx"))
    m = s.metadata()
    assert (m["producer_name"], m["producer_version"], m["domain"], m["model_version"]) == (
        "epx-tests", "2.1", "ai.epx.tests", 7)
    assert m["description"] == "a model with metadata" and m["graph_description"] == "adds a bias"
    assert m["custom"] == {"character": "a\nb\nc", "author": "epx"}
    assert m["inputs"] == [{"name": "x", "dims": ["batch", 3]}]
    assert m["overridable_initializers"] == [{"name": "bias", "type": "tensor(float)", "dims": [3]}]
    assert [i.name for i in s.inputs] == ["x"] and s.inputs[0].shape == ("batch", 3)
    out = s.run({"x": np.ones((2, 3), np.float32)})["y"]
    assert np.array_equal(out, np.array([[2.0, -1.0, 1.5]] * 2, np.float32))


VALUES = repo("tests", "models", "sklearn-values")


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def test_strings_sequences_and_maps():
    text = epx.Session(os.path.join(VALUES, "tfidf-text", "model.onnx"))
    assert text.inputs[0].type == "tensor(string)" and text.inputs[0].dtype is None
    assert text.outputs[1].type == "seq(map(int64,tensor(float)))"
    words = np.load(os.path.join(VALUES, "tfidf-text", "input", "text.npy"))
    probs = text.run({"text": words})["output_probability"]
    assert isinstance(probs, list) and len(probs) == len(words)
    for k, row in enumerate(probs):
        with open(os.path.join(VALUES, "tfidf-text", "output", "output_probability", f"{k}.json")) as f:
            want = {int(key): v for key, v in json.load(f).items()}
        assert row.keys() == want.keys() and all(close(row[c], want[c]) for c in want)

    forest = epx.Session(os.path.join(VALUES, "random-forest-string-labels", "model.onnx"))
    out = forest.run({"X": np.load(os.path.join(VALUES, "random-forest-string-labels", "input", "X.npy"))})
    want = np.load(os.path.join(VALUES, "random-forest-string-labels", "output", "output_label.npy"))
    assert out["output_label"].dtype.kind == "U" and list(out["output_label"]) == list(want)
    assert set(out["output_probability"][0]) == {"setosa", "versicolor", "virginica"}

    dv = epx.Session(os.path.join(VALUES, "dict-vectorizer", "model.onnx"))
    out = dv.run({"x": {"a": 1.0, "c": 2.0}})
    want = np.load(os.path.join(VALUES, "dict-vectorizer", "output", "output_label.npy"))
    assert np.array_equal(out["output_label"], want)


PLACEMENT = f"""
import epx, numpy as np
eps = {{p.name: p for p in epx.providers()}}
assert eps["relu_only"].available, eps["relu_only"]
assert not eps["never_available"].available and "Frobnicator" in eps["never_available"].reason
s = epx.Session({example("mnist-cnn.onnx")!r}, providers=["relu_only"])
placed = {{n["op_type"]: n["provider"] for n in s.placement()["nodes"]}}
assert placed["Relu"] == "relu_only" and placed["Conv"] == "cpu", placed
print("ok")
"""


def test_a_plugin_declared_by_an_entry_point_is_found(tmp_path, fixture_library):
    # What pip leaves for a package that declares `[project.entry-points."epx.plugins"]`: the
    # package's folder holds the plugin folder. It is found without being imported (its
    # `__init__.py` would leave a mark); an entry point naming an object is skipped, unimported,
    # with a warning; one naming a module that is not there too.
    site = tmp_path / "site"
    pkg = site / "vendor_ep"
    pkg.mkdir(parents=True)
    plugin_folder(str(pkg), fixture_library)
    mark = tmp_path / "mark"
    (pkg / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write('imported')\n"
                                     "def plugin_dir():\n    return __path__[0]\n")
    dist = site / "vendor_ep-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-ep\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[epx.plugins]\nrelu = vendor_ep\nobject = vendor_ep:plugin_dir\n"
        "broken = vendor_ep_missing\n")
    out = python(PLACEMENT, env={"PYTHONPATH": str(site)})
    assert out.stdout.strip() == "ok"
    assert not mark.exists(), "the entry point's package was imported"
    assert "object = vendor_ep:plugin_dir" in out.stderr and "names an object" in out.stderr, \
        out.stderr
    assert "broken = vendor_ep_missing" in out.stderr and "vendor-ep" in out.stderr, out.stderr


def test_nothing_is_imported_or_started_that_was_not_asked_for(tmp_path):
    """An ONNX Runtime plugin-EP package (its import leaves a mark) on PYTHONPATH and in
    VIRTUAL_ENV, and a `python3` first on PATH that leaves another when started: `epx.Session`,
    `epx.Environment(discover=False)` and `epx.onnxruntime` on the CPU EP import nothing and
    start nothing; `epx.providers()` (which opens the plugins the wheel ships, each first in a
    child) imports no package. With the search switched on (EPX_PYTHON_EPS=1) a listing asks the
    package."""
    imported, started = tmp_path / "imported", tmp_path / "started"
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    pkg = site / "onnxruntime_ep_marker"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(imported)!r}, 'a').write('imported')\n")
    (pkg / "libmarker.so").write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"#!/bin/sh\necho started >> {started}\nexit 1\n")
    fake.chmod(0o755)
    env = {"PYTHONPATH": str(site), "VIRTUAL_ENV": str(tmp_path / "venv"),
           "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    quiet = f"""
import numpy as np, epx, epx.onnxruntime as ort
a = np.ones((1, 4), np.float32)
s = epx.Session({example("add.onnx")!r})
s.run({{"a": a, "b": a}})
epx.Environment([], discover=False)
o = ort.InferenceSession({example("add.onnx")!r}, providers=["CPUExecutionProvider"])
o.run(None, {{"a": a, "b": a}})
print("ok")
"""
    out = python(quiet, env=env)
    assert out.stdout.strip() == "ok", out.stdout
    assert not imported.exists() and not started.exists(), out.stderr
    out = python("import epx; print([p.name for p in epx.providers()])", env=env)
    assert "cpu" in out.stdout and not imported.exists(), out.stdout + out.stderr
    # Switched on: a listing asks the package (its import marks; it names no library).
    out = python("import epx; print([p.name for p in epx.providers()])",
                 env=dict(env, EPX_PYTHON_EPS="1", PATH=os.environ.get("PATH", "")))
    assert imported.read_text().startswith("imported"), out.stderr


def test_a_plugin_in_an_epx_plugins_folder_on_sys_path_is_found(tmp_path, fixture_library):
    plugin_folder(str(tmp_path / "epx_plugins"), fixture_library)
    out = python(PLACEMENT, env={"PYTHONPATH": str(tmp_path)})
    assert out.stdout.strip() == "ok"


def test_the_epx_command_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "epx")
    out = python(f"import subprocess; print(subprocess.run([{exe!r}, '--version'], "
                 "capture_output=True, text=True, check=True).stdout)")
    assert out.stdout.startswith("epx "), out.stdout


def test_the_epx_command_finds_its_own_environment_without_activation():
    """A Dockerfile, a systemd unit or pipx runs `venv/bin/epx` with no VIRTUAL_ENV and no
    PYTHONPATH: the plugins still find the ONNX Runtime installed in that same venv, and
    `epx doctor` names the environment."""
    import subprocess
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed in this venv")
    import site
    exe = os.path.join(os.path.dirname(sys.executable), "epx")
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/nonexistent")}
    out = subprocess.run([exe, "providers"], capture_output=True, text=True, env=bare,
                         timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:] if line.strip()}
    assert "ort_cpu" in rows and " ok " in rows["ort_cpu"], out.stdout
    own = [os.path.realpath(p) for p in site.getsitepackages()
           if os.path.isdir(os.path.join(p, "epx"))]
    assert own, site.getsitepackages()
    # An adapter whose EP this ONNX Runtime lacks says which library it found: this venv's.
    assert f"{own[0]}/onnxruntime/capi/" in rows["cuda"], rows["cuda"]
    doctor = subprocess.run([exe, "doctor"], capture_output=True, text=True, env=bare,
                            timeout=120, cwd="/")
    assert f"Python environment: {own[0]}" in doctor.stdout, doctor.stdout


CLOSE_DURING_RUN = r"""
import sys, threading
import numpy as np
import epx

rounds, threads, use_with = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "with"
path = sys.argv[4]
feeds = {"a": np.ones((1, 4), np.float32), "b": np.ones((1, 4), np.float32)}
runs = closed = 0
lock = threading.Lock()

def worker(s, started):
    global runs, closed
    first = True
    while True:
        try:
            s.run(feeds)
        except epx.EpxError as e:
            assert "the session is closed" in str(e), str(e)
            with lock:
                closed += 1
            if first:
                started.release()
            return
        with lock:
            runs += 1
        if first:
            first = False
            started.release()

for r in range(rounds):
    started = threading.Semaphore(0)
    s = epx.Session(path)
    ts = [threading.Thread(target=worker, args=(s, started)) for _ in range(threads)]
    if use_with:
        with s:
            for t in ts:
                t.start()
            for _ in ts:
                started.acquire()
    else:
        for t in ts:
            t.start()
        for _ in ts:
            started.acquire()
        s.close()
    for t in ts:
        t.join()
print("ROUNDS", rounds, "RUNS", runs, "CLOSED", closed)
assert closed == rounds * threads, closed
"""


@pytest.mark.parametrize("how", ["close", "with"])
def test_closing_a_session_while_threads_run_it_is_safe(how):
    # In a child: a use of freed memory would end it with a signal, not an exception.
    out = subprocess_run([sys.executable, "-c", CLOSE_DURING_RUN, "200", "8", how,
                          example("add.onnx")])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ROUNDS 200" in out.stdout and "CLOSED 1600" in out.stdout, out.stdout


def subprocess_run(args):
    import subprocess
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


def test_a_run_after_close_raises_session_closed():
    s = epx.Session(example("add.onnx"))
    s.close()
    with pytest.raises(epx.EpxError, match="the session is closed"):
        s.run({"a": np.ones((1, 4), np.float32), "b": np.ones((1, 4), np.float32)})
    with pytest.raises(epx.EpxError, match="the session is closed"):
        s.placement()


def test_models_that_block_or_flood_are_refused_at_once(tmp_path):
    with pytest.raises(epx.EpxError, match="a device, not a regular file"):
        epx.Session("/dev/zero")
    fifo = tmp_path / "p.onnx"
    os.mkfifo(fifo)
    with pytest.raises(epx.EpxError, match="a FIFO, not a regular file"):
        epx.Session(str(fifo))


def test_tensor_limits_out_of_range_are_refused_not_wrapped():
    before = epx.max_tensor_bytes()
    for bad in (2 ** 64 + 5, -1, 2 ** 64):
        with pytest.raises(ValueError, match="between 0 and 2\\*\\*64 - 1"):
            epx.set_max_tensor_bytes(bad)
    with pytest.raises(TypeError):
        epx.set_max_tensor_bytes(1.5)
    assert epx.max_tensor_bytes() == before
    with pytest.raises(ValueError):
        epx.Session(example("add.onnx"), max_tensor_bytes=-5)


def test_a_huge_strided_view_is_refused_before_it_is_copied():
    s = epx.Session(example("add.onnx"))
    # 2**40 float32 elements that share one: copying it would need 4 TiB.
    view = np.broadcast_to(np.zeros((1, 1), np.float32), (1 << 20, 1 << 20))
    with pytest.raises(epx.EpxError, match="more than the"):
        s.run({"a": view, "b": np.ones((1, 4), np.float32)})
