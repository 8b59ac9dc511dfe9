"""A soak of `epx serve`: several models in one repository, loaded at once from gRPC and REST
clients for `--minutes`, the server's resident memory sampled every 10 s. Ends with the count
of failed requests (0 expected) and the RSS at each sample; fails (exit 1) on any failure or
when RSS in the second half grew more than 10% over its first sample of that half.

    .testdata/load-venv/bin/python tests/bench/serve/soak.py --epx target/release/epx --minutes 10
"""

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def soak(server, models, seconds, samples):
    failures = {"n": 0}
    counts = {}
    stop_at = time.monotonic() + seconds

    async def clients(protocol, name, feeds, concurrency):
        while time.monotonic() < stop_at:
            rps, _, _, failed = await load.load(protocol, server.grpc if protocol == "grpc" else server.http,
                                                name, feeds, concurrency, 5.0)
            failures["n"] += int(failed)
            counts[name] = counts.get(name, 0) + int(rps * 5)

    async def sampler():
        while time.monotonic() < stop_at:
            samples.append((round(seconds - (stop_at - time.monotonic())), rss_kib(server.proc.pid)))
            await asyncio.sleep(10)

    tasks = [sampler()]
    for i, (name, feeds) in enumerate(models):
        tasks.append(clients("grpc" if i % 2 == 0 else "http", name, feeds, 2 + i))
    await asyncio.gather(*tasks)
    return failures["n"], counts


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epx", required=True)
    p.add_argument("--models", default="mnist,rec,magika")
    p.add_argument("--minutes", type=float, default=10)
    a = p.parse_args()
    names = a.models.split(",")
    # One repository with every model: the first server copies one, the others are added.
    first = names[0]
    server = load.Server("epx", a.epx, first, load.MODELS[first][0], 1)
    try:
        import shutil
        import urllib.request
        for name in names[1:]:
            os.makedirs(os.path.join(server.dir, name, "1"))
            shutil.copy(load.MODELS[name][0], os.path.join(server.dir, name, "1", "model.onnx"))
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.http}/v2/repository/models/{name}/load", method="POST")
            urllib.request.urlopen(req).read()
        models = [(n, load.make_inputs(load.MODELS[n][0], load.MODELS[n][1])) for n in names]
        samples = []
        failed, counts = asyncio.run(soak(server, models, a.minutes * 60, samples))
    finally:
        server.stop()
    half = samples[len(samples) // 2:]
    growth = (half[-1][1] - half[0][1]) / max(1, half[0][1])
    print(f"soak: {a.minutes} min over {', '.join(names)}: requests {counts}, failed {failed}")
    print("RSS (s: KiB): " + ", ".join(f"{t}: {k}" for t, k in samples))
    print(f"second half RSS {half[0][1]} -> {half[-1][1]} KiB ({growth:+.1%})")
    return 0 if failed == 0 and growth <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
