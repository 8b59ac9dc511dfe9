"""Runs an ONNX model through epx from Python and prints its outputs and placement.

    python3 run_model.py MODEL [--plugin-dir DIR]... [--ep NAME]... [INPUT=FILE.npy]...

Inputs not given are zeros of the model's declared shape (dynamic extents become 1).
"""
import argparse
import sys

import numpy as np

import epx


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("inputs", nargs="*", metavar="INPUT=FILE.npy")
    parser.add_argument("--plugin-dir", action="append", default=[])
    parser.add_argument("--ep", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        env = epx.Environment(plugin_dirs=args.plugin_dir)
        for p in env.providers():
            state = "available" if p.available else f"unavailable: {p.reason}"
            print(f"EP {p.name} ({p.plugin}): {state}")
        session = epx.Session(args.model, providers=args.ep, env=env)
        given = dict(item.split("=", 1) for item in args.inputs)
        feeds = {}
        for spec in session.inputs:
            if spec.name in given:
                feeds[spec.name] = np.load(given[spec.name])
            else:
                shape = tuple(d if isinstance(d, int) else 1 for d in (spec.shape or ()))
                feeds[spec.name] = np.zeros(shape, spec.dtype or np.float32)
        for name, value in session.run(feeds).items():
            print(f"output {name}: {value.dtype}{list(value.shape)} {value.ravel()[:8]}")
        counts = {}
        for node in session.placement()["nodes"]:
            counts[node["provider"]] = counts.get(node["provider"], 0) + 1
        print("placement:", ", ".join(f"{ep}: {n} nodes" for ep, n in counts.items()))
    except epx.EpxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
