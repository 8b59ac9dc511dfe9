#!/usr/bin/env python3
"""Runs real third-party PyPI programs that call `onnxruntime` themselves, once on ONNX Runtime
and once on epx (`epx.onnxruntime.install()` before the package is imported), and compares
what their public APIs return.

    python3 tests/programs/run.py                       # epx from target/wheels/epx-*.whl
    python3 tests/programs/run.py --wheel PATH.whl      # epx from that wheel (CI)
    python3 tests/programs/run.py --tree                # epx from host/python + target/debug
    python3 tests/programs/run.py --only magika,nudenet --json out.json
    python3 tests/programs/run.py --list

The virtual environment lives in .testdata/programs/venv (made on first use; requirements.txt
is reinstalled when it changes). Each driver (drivers/<name>.py) runs in two fresh processes
(_child.py); results are compared by the driver's compare() or compare.compare()."""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENV = ROOT / ".testdata" / "programs" / "venv"
REQUIREMENTS = HERE / "requirements.txt"
DRIVERS = HERE / "drivers"
PIP = ["--quiet", "--disable-pip-version-check"]


def drivers() -> list[Path]:
    return sorted(p for p in DRIVERS.glob("*.py") if not p.name.startswith("_"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


# Setup (runs under any Python 3.9+; then re-executes itself inside the venv) ---------------

def setup(args) -> Path:
    py = VENV / "bin" / "python"
    t0 = time.perf_counter()
    if not py.exists():
        log(f"making {VENV}")
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", *PIP, "--upgrade", "pip"], check=True)
    stamp = VENV / ".requirements.sha"
    want = sha(REQUIREMENTS)
    if not stamp.exists() or stamp.read_text() != want:
        log("installing tests/programs/requirements.txt (binary wheels only)")
        subprocess.run([str(py), "-m", "pip", "install", *PIP, "--only-binary=:all:",
                        "-r", str(REQUIREMENTS)], check=True)
        stamp.write_text(want)
    if args.wheel:
        wheel = Path(args.wheel).resolve()
        wstamp = VENV / ".epx-wheel.sha"
        want = sha(wheel)
        if not wstamp.exists() or wstamp.read_text() != want:
            log(f"installing {wheel.name}")
            subprocess.run([str(py), "-m", "pip", "install", *PIP, "--no-deps", "--force-reinstall",
                            str(wheel)], check=True)
            wstamp.write_text(want)
    dt = time.perf_counter() - t0
    if dt > 1:
        log(f"venv ready in {dt:.0f} s")
    return py


def tree_env() -> dict:
    """epx from the source tree: host/python on PYTHONPATH, libepx.so and the ONNX Runtime CPU
    plugin from target/debug (as tests/parity/parity.py does)."""
    debug = ROOT / "target" / "debug"
    lib = debug / "libepx.so"
    if not lib.exists():
        sys.exit(f"{lib} is missing: build it with `cargo build -p epx-capi` (or the workspace)")
    plugins = Path(tempfile.mkdtemp(prefix="epx-programs-plugins-"))
    ort_cpu = debug / "libepx_ort_cpu.so"
    if ort_cpu.exists():
        shutil.copy(ort_cpu, plugins / ort_cpu.name)
        shutil.copy(ROOT / "plugins/onnxruntime/eps/ort_cpu/plugin.toml", plugins / "plugin.toml")
    env = {"EPX_LIBRARY": str(lib), "EPX_PLUGIN_PATH": str(plugins),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "host" / "python")]
                                         + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    return env


# Running (inside the venv) -------------------------------------------------------------------

def run_child(py: str, driver: Path, mode: str, env: dict, timeout: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"epx-program-{driver.stem}-{mode}-"))
    out = work / "result.json"
    t0 = time.perf_counter()
    try:
        p = subprocess.run([py, str(HERE / "_child.py"), str(driver), mode, str(out)], cwd=work,
                           env=env, capture_output=True, text=True, timeout=timeout)
        if out.exists():
            report = json.loads(out.read_text())
        else:
            tail = (p.stderr or p.stdout).strip().splitlines()[-15:]
            report = {"ok": False, "error": f"process died (exit {p.returncode})",
                      "traceback": "\n".join(tail)}
        report["stderr_tail"] = "\n".join((p.stderr or "").strip().splitlines()[-15:])
    except subprocess.TimeoutExpired:
        report = {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    report["wall"] = round(time.perf_counter() - t0, 2)
    shutil.rmtree(work, ignore_errors=True)
    return report


def load_driver(path: Path):
    sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location(f"_driver_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def first_line(s: str, n: int = 110) -> str:
    s = (s or "").strip().splitlines()[0] if (s or "").strip() else ""
    return s if len(s) <= n else s[: n - 3] + "..."


def inside(args) -> int:
    import compare as default_compare  # noqa: E402  (HERE is on sys.path)
    base_env = dict(os.environ)
    base_env.pop("PYTHONPATH", None)
    base_env.setdefault("OMP_NUM_THREADS", "2")
    base_env.setdefault("TQDM_DISABLE", "1")
    base_env["HF_HUB_OFFLINE"] = "1"
    ort_env = dict(base_env)
    epx_env = dict(base_env)
    if args.tree:
        epx_env.update(tree_env())
    only = {n.strip().replace("-", "_") for n in args.only.split(",")} if args.only else None
    rows, records, failed = [], [], 0
    t_all = time.perf_counter()
    for path in drivers():
        if only and path.stem not in only:
            continue
        mod = load_driver(path)
        log(f"{path.stem}: ONNX Runtime ...")
        ort = run_child(sys.executable, path, "ort", ort_env, args.timeout)
        log(f"{path.stem}: epx ...")
        epx = run_child(sys.executable, path, "epx", epx_env, args.timeout)
        problems: list[str] = []
        if not ort.get("ok"):
            status = "ORT error: " + first_line(ort.get("error"))
            failed += 1
        elif not epx.get("ok"):
            status = "error: " + first_line(epx.get("error"))
            failed += 1
        else:
            cmp = getattr(mod, "compare", None) or default_compare.compare
            try:
                problems = cmp(ort["result"], epx["result"])
            except Exception as e:  # noqa: BLE001
                problems = [f"compare raised {type(e).__name__}: {e}"]
            status = "match" if not problems else "differs: " + first_line(problems[0], 90) + (
                f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            failed += bool(problems)
        rec = {"driver": path.stem, "package": getattr(mod, "PACKAGE", path.stem),
               "version": ort.get("version") or epx.get("version") or "?",
               "category": getattr(mod, "CATEGORY", "?"), "status": status, "problems": problems,
               "ort": ort, "epx": epx}
        records.append(rec)
        rows.append((rec["package"], rec["version"], rec["category"],
                     ort.get("summary") or first_line(ort.get("error")) or "", status,
                     f"{ort.get('wall', 0):.1f}/{epx.get('wall', 0):.1f}"))
        log(f"{path.stem}: {status}")
    total = time.perf_counter() - t_all
    print_table(rows)
    for rec in records:
        e = rec["epx"]
        if rec["status"] != "match":
            print(f"\n--- {rec['package']} {rec['version']}: {rec['status']}")
            if not rec["ort"].get("ok"):
                print(rec["ort"].get("traceback", "")[-2500:])
            elif not e.get("ok"):
                print(e.get("traceback", "")[-2500:] or e.get("error"))
            else:
                for p in rec["problems"]:
                    print("   " + p)
    print(f"\n{len(records) - failed} of {len(records)} programs match on epx "
          f"({'tree' if args.tree else 'wheel'}); {total:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1, ensure_ascii=False, default=str))
    return 1 if failed else 0


def print_table(rows) -> None:
    head = ("package", "version", "category", "ONNX Runtime result", "epx", "s ort/epx")
    widths = [18, 9, 22, 60, 70, 9]

    def cut(s, w):
        s = str(s).replace("\n", " ")
        return s if len(s) <= w else s[: w - 1] + "…"

    line = " | ".join(cut(h, w).ljust(w) for h, w in zip(head, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print(" | ".join(cut(c, w).ljust(w) for c, w in zip(r, widths)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--wheel", help="epx wheel to install into the venv (default: target/wheels/epx-*.whl)")
    src.add_argument("--tree", action="store_true",
                     help="epx from host/python with target/debug/libepx.so (no wheel)")
    ap.add_argument("--only", help="comma-separated driver names (drivers/<name>.py)")
    ap.add_argument("--list", action="store_true", help="list the drivers and exit")
    ap.add_argument("--json", help="write every result, traceback and problem to this file")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per process (default 300)")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.list:
        for p in drivers():
            cat = next((l.split("=", 1)[1].strip().strip('"') for l in p.read_text().splitlines()
                        if l.startswith("CATEGORY")), "?")
            print(f"{p.stem:24} {cat}")
        return 0
    if args.inside:
        return inside(args)
    if not args.tree and not args.wheel:
        found = sorted(glob.glob(str(ROOT / "target" / "wheels" / "epx-*.whl")))
        if not found:
            sys.exit("no epx wheel in target/wheels: pass --wheel PATH or --tree")
        args.wheel = found[-1]
    py = setup(args)
    if args.tree:
        # A wheel installed earlier would shadow nothing (PYTHONPATH comes first), but say so.
        pass
    argv = [str(py), str(Path(__file__).resolve()), "--inside", "--timeout", str(args.timeout)]
    if args.tree:
        argv.append("--tree")
    if args.only:
        argv += ["--only", args.only]
    if args.json:
        argv += ["--json", str(Path(args.json).resolve())]
    sys.stdout.flush()
    return subprocess.run(argv).returncode


if __name__ == "__main__":
    sys.exit(main())
