"""An epx session behind Ray Serve: a deployment of two replicas, autoscaled on the requests
each has in flight, answering JSON requests over Ray Serve's HTTP proxy.

    python -m venv .testdata/ray-venv
    .testdata/ray-venv/bin/pip install "ray[serve]==2.60.0" requests target/wheels/epx-*.whl
    .testdata/ray-venv/bin/python examples/ray-serve/serve_epx.py examples/models/mnist-cnn.onnx

It starts Ray on this machine, deploys the model, sends `--requests` requests from several
threads through the proxy, checks every answer against a session in this process, prints the
replicas that answered and the latency, and shuts Ray down. A request is
`{"inputs": {NAME: {"data": [...], "shape": [...], "dtype": "float32"}}}`; the answer is
`{"outputs": {NAME: {"data": [...], "shape": [...], "dtype": ...}}, "replica": ID}`.
"""

import argparse
import concurrent.futures
import os
import statistics
import sys
import time

import epx
import numpy as np
import ray
import requests
from ray import serve
from starlette.requests import Request


@serve.deployment(
    # Two replicas at least; more (up to four) when each has over four requests in flight.
    autoscaling_config={"min_replicas": 2, "initial_replicas": 2, "max_replicas": 4,
                        "target_ongoing_requests": 4},
    max_ongoing_requests=16,
    ray_actor_options={"num_cpus": 0.5},
)
class EpxModel:
    def __init__(self, model: bytes, threads: int):
        # One session per replica; `run` releases the GIL, so requests in flight overlap.
        self.session = epx.Session(model, intra_op_threads=threads)
        self.replica = f"{os.getpid()}"

    async def __call__(self, request: Request) -> dict:
        body = await request.json()
        feeds = {name: np.asarray(t["data"], dtype=t["dtype"]).reshape(t["shape"])
                 for name, t in body["inputs"].items()}
        outputs = self.session.run(feeds)
        return {"outputs": {name: {"data": v.ravel().tolist(), "shape": list(v.shape),
                                   "dtype": str(v.dtype)} for name, v in outputs.items()},
                "replica": self.replica}


def random_feeds(session: epx.Session, rng) -> dict:
    feeds = {}
    for spec in session.inputs:
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape or ()]
        feeds[spec.name] = rng.random(shape).astype(np.float32)
    return feeds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="an ONNX model with float inputs")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="CPU EP threads per replica")
    p.add_argument("--port", type=int, default=8000)
    a = p.parse_args()
    with open(a.model, "rb") as f:
        model = f.read()
    local = epx.Session(model, intra_op_threads=1)
    rng = np.random.default_rng(0)
    cases = [random_feeds(local, rng) for _ in range(16)]
    expected = [local.run(c) for c in cases]

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": a.port})
    serve.run(EpxModel.bind(model, a.threads), name="epx", route_prefix="/")
    url = f"http://127.0.0.1:{a.port}/"

    def one(i: int):
        feeds = cases[i % len(cases)]
        body = {"inputs": {n: {"data": v.ravel().tolist(), "shape": list(v.shape),
                               "dtype": str(v.dtype)} for n, v in feeds.items()}}
        t0 = time.monotonic()
        r = requests.post(url, json=body, timeout=60)
        took = time.monotonic() - t0
        r.raise_for_status()
        answer = r.json()
        for name, want in expected[i % len(cases)].items():
            got = answer["outputs"][name]
            value = np.asarray(got["data"], dtype=got["dtype"]).reshape(got["shape"])
            if not np.array_equal(value, want):
                raise AssertionError(f"request {i}: output {name} differs from the local run")
        return answer["replica"], took

    try:
        with concurrent.futures.ThreadPoolExecutor(a.clients) as pool:
            results = list(pool.map(one, range(a.requests)))
    finally:
        status = serve.status().applications["epx"].deployments["EpxModel"]
        serve.shutdown()
        ray.shutdown()
    replicas = sorted({r for r, _ in results})
    latencies = sorted(t for _, t in results)
    print(f"{len(results)} requests, all equal to the local session's outputs; "
          f"{len(replicas)} replicas answered; deployment {status.status}")
    print(f"latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"p99 {latencies[int(0.99 * (len(latencies) - 1))] * 1000:.1f} ms")
    return 0 if len(replicas) >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
