"""Load on `epx serve` from outside the server, side by side with in-process runs and with
KServe's Python model server on ONNX Runtime.

For each model and thread count T, it measures:

- **in-process**: `epx run MODEL --repeat N --threads T` (Session::run in a loop, one caller,
  about 2 s), throughput = 1 / median latency, measured right before each load run;
- **epx serve**: the model alone in a repository with `threads = T`, `instances = 1`, loaded
  by C concurrent clients for `--seconds` (tritonclient's asyncio gRPC or HTTP client, one
  process, binary tensor data), after a warm-up: throughput, p50 and p99 latency, failures;
- **KServe** (with `--kserve PYTHON`, a Python with `kserve` and `onnxruntime`): the same load
  on `kserve_onnx.py` serving the same model with `intra_op_num_threads = T`.

Each figure is the median of `--repeats` runs (the ratio: the median of each load run over
the in-process figure measured just before it). Prints a table per model and writes JSON with
`--json FILE`.

    .testdata/load-venv/bin/python tests/bench/serve/load.py --epx target/release/epx \
        --models rec,magika,det --concurrency 1,2,4,8,16 --threads 1,2 \
        --kserve .testdata/kserve-venv/bin/python

Models: tests/bench/fetch-models.sh fetches them into .testdata/bench-models.
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BENCH = os.path.join(REPO, ".testdata", "bench-models")

# name: (file, extents for dynamic dimensions by input name)
MODELS = {
    "mnist": (os.path.join(REPO, "examples", "models", "mnist-cnn.onnx"), {}),
    "magika": (os.path.join(BENCH, "magika.onnx"), {}),
    "rec": (os.path.join(BENCH, "ch_PP-OCRv4_rec_infer.onnx"), {"x": [1, 3, 48, 320]}),
    "det": (os.path.join(BENCH, "ch_PP-OCRv4_det_infer.onnx"), {"x": [1, 3, 640, 640]}),
    "minilm": (os.path.join(BENCH, "paraphrase-MiniLM-L3-v2.onnx"), {}),
}

NP = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
      "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16,
      "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}


def make_inputs(path, extents):
    """Random inputs for every input of the model: dynamic extents from `extents`, else 1 (a
    sequence length of 128 for 2-D integer inputs); integers small and non-negative."""
    rng = np.random.default_rng(0)
    feeds = {}
    for i in ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs():
        dt = NP[i.type]
        if i.name in extents:
            shape = extents[i.name]
        else:
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            if np.issubdtype(dt, np.integer) and len(shape) == 2 and not isinstance(i.shape[1], int):
                shape[1] = 128
        if np.issubdtype(dt, np.integer):
            feeds[i.name] = rng.integers(0, 100, size=shape).astype(dt)
        elif dt is np.bool_:
            feeds[i.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[i.name] = rng.random(size=shape).astype(dt)
    return feeds


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_process(epx, path, feeds, threads, runs):
    """Runs per second of `epx run --repeat` (one caller), from its median latency."""
    with tempfile.TemporaryDirectory() as d:
        args = [epx, "run", path, "--repeat", str(runs), "--threads", str(threads)]
        for name, value in feeds.items():
            f = os.path.join(d, f"{name}.npy")
            np.save(f, value)
            args += ["--input", f"{name}={f}"]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    median = float(re.search(r"median ([0-9.]+) ms", out).group(1))
    return 1000.0 / median


class Server:
    """A server process on free ports; `kind` is "epx" or "kserve"."""

    def __init__(self, kind, exe, name, path, threads, extra=""):
        self.kind = kind
        self.dir = tempfile.mkdtemp(prefix="epx-load-")
        self.http, self.grpc = free_port(), free_port()
        if kind == "epx":
            os.makedirs(os.path.join(self.dir, name, "1"))
            shutil.copy(path, os.path.join(self.dir, name, "1", "model.onnx"))
            with open(os.path.join(self.dir, name, "config.toml"), "w") as f:
                f.write(f"threads = {threads}\ninstances = 1\nmax_queue = 256\n{extra}\n")
            args = [exe, "serve", "--model-repository", self.dir, "--host", "127.0.0.1",
                    "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                    "--metrics-port", "0", "--model-control-mode", "explicit",
                    "--load-model", "*"]
        else:
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kserve_onnx.py")
            args = [exe, script, "--model_name", name, "--model_file", path,
                    "--threads", str(threads), "--http_port", str(self.http),
                    "--grpc_port", str(self.grpc), "--workers", "1"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.wait_ready(name)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, name):
        import tritonclient.http as http
        until = time.monotonic() + 120
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                client = http.InferenceServerClient(f"127.0.0.1:{self.http}")
                if client.is_model_ready(name):
                    return
                if self.kind == "epx":
                    # A model that failed to load says why in the repository index.
                    for m in client.get_model_repository_index():
                        if m.get("name") == name and m.get("state") == "UNAVAILABLE":
                            raise RuntimeError(f"`{name}` did not load: {m.get('reason')}")
            except RuntimeError:
                raise
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server did not get ready in 120 s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


async def load(protocol, port, name, feeds, concurrency, seconds):
    """C clients sending back to back for `seconds` after 1 s of warm-up: (requests/s, p50 ms,
    p99 ms, failures)."""
    if protocol == "grpc":
        import tritonclient.grpc.aio as client
    else:
        import tritonclient.http.aio as client
    from tritonclient.utils import np_to_triton_dtype
    c = client.InferenceServerClient(f"127.0.0.1:{port}")

    def request():
        inputs = []
        for n, v in feeds.items():
            i = client.InferInput(n, list(v.shape), np_to_triton_dtype(v.dtype))
            if protocol == "grpc":
                i.set_data_from_numpy(v)
            else:
                i.set_data_from_numpy(v, binary_data=True)
            inputs.append(i)
        return inputs

    latencies, failures = [], 0
    start = time.monotonic()
    warm_until, stop_at = start + 1.0, start + 1.0 + seconds

    async def worker():
        nonlocal failures
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                return
            try:
                await c.infer(name, request())
                ok = True
            except Exception:
                ok = False
            t1 = time.monotonic()
            if t0 >= warm_until:
                if ok:
                    latencies.append(t1 - t0)
                else:
                    failures += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await c.close()
    latencies.sort()
    if not latencies:
        return 0.0, float("nan"), float("nan"), failures
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
    return len(latencies) / seconds, pick(0.50), pick(0.99), failures


def rust_load(exe, port, name, feeds, concurrency, seconds):
    """The same load from host/serve/examples/grpc_load.rs (random inputs of the model's
    shapes, a few µs of client CPU a request): (requests/s, p50 ms, p99 ms, failures)."""
    args = [exe, "--addr", f"127.0.0.1:{port}", "--model", name, "--concurrency",
            str(concurrency), "--seconds", str(seconds)]
    from tritonclient.utils import np_to_triton_dtype
    for n, v in feeds.items():
        dims = ",".join(str(d) for d in v.shape)
        args += ["--shape", f"{n}={dims}:{np_to_triton_dtype(v.dtype)}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    c, rps, p50, p99, failed = out.strip().splitlines()[-1].split()
    return float(rps), float(p50), float(p99), int(failed)


def median_of(runs):
    return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0])))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epx", required=True, help="the epx executable (a release build)")
    p.add_argument("--models", default="mnist,rec,det")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--protocol", default="grpc", choices=["grpc", "http"])
    p.add_argument("--kserve", help="a Python with kserve and onnxruntime: compare KServe")
    p.add_argument("--epx-config", default="",
                   help="more lines of the model's config.toml, `\\n` for a new line (e.g. "
                        "dynamic batching); the server is then labelled epx+")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--servers", default="epx,kserve",
                   help="which servers to load (kserve only with --kserve)")
    p.add_argument("--rust-client", help="target/release/examples/grpc_load: load with it "
                                         "instead of tritonclient (gRPC only)")
    a = p.parse_args()
    results = []
    for model in a.models.split(","):
        path, extents = MODELS[model]
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run tests/bench/fetch-models.sh")
        feeds = make_inputs(path, extents)
        for threads in (int(t) for t in a.threads.split(",")):
            # About two seconds of in-process runs, measured right before each load run: this
            # machine's speed drifts by a third from minute to minute, so each load figure is
            # compared with the in-process figure of the same minute.
            runs = max(10, min(5000, int(2 * in_process(a.epx, path, feeds, threads, 10))))
            print(f"\n{model}, {threads} thread(s)", flush=True)
            print(f"{'server':8} {'C':>3} {'req/s':>9} {'in-process/s':>13} {'ratio':>6} "
                  f"{'p50 ms':>8} {'p99 ms':>8} {'failed':>6}")
            extra = a.epx_config.replace("\\n", "\n")
            wanted = a.servers.split(",")
            kinds = [("epx+" if extra else "epx", a.epx)] if "epx" in wanted else []
            kinds += [("kserve", a.kserve)] if a.kserve and "kserve" in wanted else []
            for kind, exe in kinds:
                server = Server(kind.rstrip("+"), exe, model, path, threads, extra)
                try:
                    port = server.grpc if a.protocol == "grpc" else server.http
                    for c in (int(x) for x in a.concurrency.split(",")):
                        pairs = []
                        for _ in range(a.repeats):
                            inproc = in_process(a.epx, path, feeds, threads, runs)
                            f = (rust_load(a.rust_client, port, model, feeds, c, a.seconds)
                                 if a.rust_client else
                                 asyncio.run(load(a.protocol, port, model, feeds, c, a.seconds)))
                            pairs.append(f + (inproc, f[0] / inproc))
                        rps, p50, p99, failed, inproc, ratio = median_of(pairs)
                        print(f"{kind:8} {c:>3} {rps:>9.1f} {inproc:>13.1f} {ratio:>6.0%} "
                              f"{p50:>8.2f} {p99:>8.2f} {int(failed):>6}", flush=True)
                        results.append({"model": model, "threads": threads, "server": kind,
                                        "protocol": a.protocol, "concurrency": c,
                                        "client": "rust" if a.rust_client else "tritonclient",
                                        "requests_per_s": rps, "in_process_per_s": inproc,
                                        "ratio": ratio,
                                        "p50_ms": p50, "p99_ms": p99, "failed": failed})
                finally:
                    server.stop()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
