"""`epx serve` (the wheel's `epx` command) against clients no one here wrote: tritonclient's HTTP
and gRPC clients from PyPI, on every datatype a model in the repository takes (over HTTP as JSON
and as binary tensor data), their refusals, the statistics and the model repository extension."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import example, here

http = pytest.importorskip("tritonclient.http")
grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

TYPES = {"float": np.float32, "double": np.float64, "float16": np.float16, "int8": np.int8,
         "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
         "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_}


def serve(repo, *flags):
    """An `epx serve` over `repo` on free loopback ports: (process, HTTP address, gRPC address)."""
    exe = shutil.which("epx", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("no epx command beside this Python")
    proc = subprocess.Popen([exe, "serve", "--model-repository", str(repo), "--http-port", "0",
                             "--grpc-port", "0", "--metrics-port", "0", "--host", "127.0.0.1",
                             *flags], stdout=subprocess.PIPE, text=True)
    lines = [proc.stdout.readline() for _ in range(2)]
    found = re.search(r"over HTTP at http://(\S+)", lines[0])
    assert found, lines
    at_grpc = re.search(r"over gRPC at (\S+)", lines[1])
    assert at_grpc, lines
    return proc, found.group(1), at_grpc.group(1)


def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repository")
    for name, path in (("ids", here("models", "identities.onnx")), ("add", example("add.onnx"))):
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(path, repo / name / "1" / "model.onnx")
    return repo


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, at_http, at_grpc = serve(repository(tmp_path_factory), "--model-control-mode",
                                   "explicit", "--load-model", "*")
    yield {"http": at_http, "grpc": at_grpc}
    proc.terminate()
    assert proc.wait(30) == 0


@pytest.fixture(scope="module")
def server(served):
    return http.InferenceServerClient(served["http"])


@pytest.fixture(scope="module")
def grpc_server(served):
    return grpc.InferenceServerClient(served["grpc"])


def test_health_and_metadata(server):
    assert server.is_server_live() and server.is_server_ready()
    assert server.get_server_metadata()["name"] == "epx"
    assert "statistics" in server.get_server_metadata()["extensions"]
    assert server.is_model_ready("ids")
    meta = server.get_model_metadata("add")
    assert meta["inputs"][0] == {"name": "a", "datatype": "FP32", "shape": [1, 4]}
    with pytest.raises(InferenceServerException, match="no model named `nope`"):
        server.get_model_metadata("nope")


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips(server, binary):
    inputs, outputs, sent = [], [], {}
    for t, dt in TYPES.items():
        a = (np.arange(6).reshape(2, 3) % 3).astype(dt)
        if dt is np.bool_:
            a = np.arange(6).reshape(2, 3) % 2 == 0
        i = http.InferInput(f"x_{t}", a.shape, np_to_triton_dtype(np.dtype(dt)))
        i.set_data_from_numpy(a, binary_data=binary)
        inputs.append(i)
        outputs.append(http.InferRequestedOutput(f"y_{t}", binary_data=binary))
        sent[t] = a
    s = np.array([b"ab", "\u00fc".encode(), b""], dtype=np.object_)
    i = http.InferInput("x_string", s.shape, "BYTES")
    i.set_data_from_numpy(s, binary_data=binary)
    inputs.append(i)
    outputs.append(http.InferRequestedOutput("y_string", binary_data=binary))
    result = server.infer("ids", inputs, outputs=outputs, request_id="r7")
    assert result.get_response()["id"] == "r7"
    for t, a in sent.items():
        got = result.as_numpy(f"y_{t}")
        assert got.dtype == a.dtype and np.array_equal(got, a), t
    strings = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("y_string")]
    assert strings == list(s)


def test_refusals_reach_the_client_with_the_reason(server):
    i = http.InferInput("x_float", [2], "FP64")
    i.set_data_from_numpy(np.zeros(2))
    with pytest.raises(InferenceServerException, match="datatype FP64 but the model declares FP32"):
        server.infer("ids", [i])
    a = http.InferInput("a", [1, 3], "FP32")
    a.set_data_from_numpy(np.zeros((1, 3), np.float32))
    b = http.InferInput("b", [1, 4], "FP32")
    b.set_data_from_numpy(np.zeros((1, 4), np.float32))
    with pytest.raises(InferenceServerException, match=r"does not fit the model's \[1,4\]"):
        server.infer("add", [a, b])
    # The server goes on.
    a = http.InferInput("a", [1, 4], "FP32")
    a.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=True)
    assert np.array_equal(server.infer("add", [a, b]).as_numpy("sum"), np.ones((1, 4)))
    # The statistics extension, as tritonclient reads it.
    stats = server.get_inference_statistics("add")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_stats"]["fail"]["count"] >= 1


def test_grpc_health_metadata_and_statistics(grpc_server):
    assert grpc_server.is_server_live() and grpc_server.is_server_ready()
    meta = grpc_server.get_server_metadata(as_json=True)
    assert meta["name"] == "epx" and "model_repository" in meta["extensions"]
    assert grpc_server.is_model_ready("ids") and not grpc_server.is_model_ready("nope")
    m = grpc_server.get_model_metadata("add", as_json=True)
    assert m["inputs"][0] == {"name": "a", "datatype": "FP32", "shape": ["1", "4"]}
    with pytest.raises(InferenceServerException, match="no model named `nope`") as e:
        grpc_server.get_model_metadata("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_every_datatype_round_trips_over_grpc(grpc_server):
    inputs, outputs, sent = [], [], {}
    for t, dt in TYPES.items():
        a = (np.arange(6).reshape(2, 3) % 3).astype(dt)
        if dt is np.bool_:
            a = np.arange(6).reshape(2, 3) % 2 == 0
        i = grpc.InferInput(f"x_{t}", a.shape, np_to_triton_dtype(np.dtype(dt)))
        i.set_data_from_numpy(a)
        inputs.append(i)
        outputs.append(grpc.InferRequestedOutput(f"y_{t}"))
        sent[t] = a
    s = np.array([b"ab", "\u00fc".encode(), b""], dtype=np.object_)
    i = grpc.InferInput("x_string", s.shape, "BYTES")
    i.set_data_from_numpy(s)
    inputs.append(i)
    outputs.append(grpc.InferRequestedOutput("y_string"))
    result = grpc_server.infer("ids", inputs, outputs=outputs, request_id="g7")
    assert result.get_response().id == "g7"
    for t, a in sent.items():
        got = result.as_numpy(f"y_{t}")
        assert got.dtype == a.dtype and np.array_equal(got, a), t
    assert list(result.as_numpy("y_string")) == list(s)


def test_grpc_refusals_carry_the_reason_and_code(grpc_server):
    i = grpc.InferInput("x_float", [2], "FP64")
    i.set_data_from_numpy(np.zeros(2))
    with pytest.raises(InferenceServerException, match="datatype FP64 but the model declares FP32") as e:
        grpc_server.infer("ids", [i])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    a = grpc.InferInput("a", [1, 4], "FP32")
    a.set_data_from_numpy(np.ones((1, 4), np.float32))
    b = grpc.InferInput("b", [1, 4], "FP32")
    b.set_data_from_numpy(np.full((1, 4), 2, np.float32))
    assert np.array_equal(grpc_server.infer("add", [a, b]).as_numpy("sum"), np.full((1, 4), 3))
    stats = grpc_server.get_inference_statistics("add", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1


def test_the_repository_extension_from_both_clients(server, grpc_server):
    index = {m["name"]: m["state"] for m in server.get_model_repository_index()}
    assert index == {"add": "READY", "ids": "READY"}
    grpc_index = grpc_server.get_model_repository_index(as_json=True)["models"]
    assert {m["name"]: m["state"] for m in grpc_index} == index
    grpc_server.unload_model("add")
    assert not server.is_model_ready("add") and not grpc_server.is_model_ready("add")
    server.load_model("add")
    assert grpc_server.is_model_ready("add")
    server.unload_model("add")
    assert not grpc_server.is_model_ready("add")
    server.load_model("add")
    grpc_server.unload_model("add")
    grpc_server.load_model("add")
    assert server.is_model_ready("add")
    with pytest.raises(InferenceServerException, match="no folder"):
        grpc_server.load_model("nope")


def test_by_default_neither_client_can_load_or_unload(tmp_path_factory):
    proc, at_http, at_grpc = serve(repository(tmp_path_factory))
    try:
        h, g = http.InferenceServerClient(at_http), grpc.InferenceServerClient(at_grpc)
        assert {m["name"] for m in h.get_model_repository_index()} == {"add", "ids"}
        for call in (h.unload_model, h.load_model):
            with pytest.raises(InferenceServerException, match="model-control-mode explicit") as e:
                call("add")
            assert "403" in str(e.value.status())
        for call in (g.unload_model, g.load_model):
            with pytest.raises(InferenceServerException, match="model-control-mode explicit") as e:
                call("add")
            assert "PERMISSION_DENIED" in str(e.value.status())
        assert h.is_model_ready("add") and g.is_model_ready("add")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_explicit_mode_loads_the_named_models_only(tmp_path_factory):
    proc, at_http, _ = serve(repository(tmp_path_factory), "--model-control-mode", "explicit",
                             "--load-model", "add")
    try:
        h = http.InferenceServerClient(at_http)
        assert h.is_model_ready("add") and not h.is_model_ready("ids")
        h.load_model("ids")
        assert h.is_model_ready("ids")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_poll_mode_serves_a_folder_added_after_the_start(tmp_path_factory):
    import time
    repo = repository(tmp_path_factory)
    proc, at_http, at_grpc = serve(repo, "--model-control-mode", "poll",
                                   "--repository-poll-secs", "1")
    try:
        h, g = http.InferenceServerClient(at_http), grpc.InferenceServerClient(at_grpc)
        assert not h.is_model_ready("late")
        (repo / "late" / "1").mkdir(parents=True)
        shutil.copy(example("add.onnx"), repo / "late" / "1" / "model.onnx")
        until = time.monotonic() + 30
        while not g.is_model_ready("late"):
            assert time.monotonic() < until, "the added folder was not served within 30 s"
            time.sleep(0.2)
        with pytest.raises(InferenceServerException, match="poll"):
            h.unload_model("late")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_restricted_groups_answer_only_with_their_header(tmp_path_factory):
    proc, at_http, at_grpc = serve(repository(tmp_path_factory),
                                   "--http-restricted-api", "inference,statistics:x-key=s3",
                                   "--grpc-restricted-protocol", "inference:x-key=s3")
    try:
        a = http.InferInput("a", [1, 4], "FP32")
        a.set_data_from_numpy(np.ones((1, 4), np.float32))
        b = http.InferInput("b", [1, 4], "FP32")
        b.set_data_from_numpy(np.ones((1, 4), np.float32))
        h = http.InferenceServerClient(at_http)
        with pytest.raises(InferenceServerException, match="x-key") as e:
            h.infer("add", [a, b])
        assert "403" in str(e.value.status()) and "s3" not in str(e.value)
        with pytest.raises(InferenceServerException, match="x-key"):
            h.get_inference_statistics("add")
        sum_ = h.infer("add", [a, b], headers={"x-key": "s3"}).as_numpy("sum")
        assert np.array_equal(sum_, np.full((1, 4), 2))
        assert h.is_server_live() and h.get_model_metadata("add")["name"] == "add"
        g = grpc.InferenceServerClient(at_grpc)
        ga = grpc.InferInput("a", [1, 4], "FP32")
        ga.set_data_from_numpy(np.ones((1, 4), np.float32))
        gb = grpc.InferInput("b", [1, 4], "FP32")
        gb.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException, match="x-key") as e:
            g.infer("add", [ga, gb])
        assert "PERMISSION_DENIED" in str(e.value.status())
        assert np.array_equal(g.infer("add", [ga, gb], headers={"x-key": "s3"}).as_numpy("sum"),
                              np.full((1, 4), 2))
        g.get_inference_statistics("add")  # statistics are restricted over REST only
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
