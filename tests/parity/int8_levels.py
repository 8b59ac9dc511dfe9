#!/usr/bin/env python3
"""The 8-bit integer ops at every kernel level of the CPU EP against ONNX Runtime's integers on
the CPUs each level stands for.

    python3 tests/parity/int8_levels.py [--epx target/debug/epx] [--keep DIR]

ONNX Runtime's 8-bit kernels (MLAS) sum unsigned activations by signed weights in pairs of
products saturated to 16 bits on CPUs with AVX2 (or AVX-512BW) and no VNNI, and exactly on CPUs
with VNNI and on baseline x86-64 (SSE). Each level of the CPU EP answers as ONNX Runtime does on
its CPUs: `avx512-vnni`, `avx-vnni`, `portable` and `reference` exactly, `avx2` in saturated
pairs. This script builds one-node models of every 8-bit op with seeded extreme values (so that
pairs do saturate), runs them on ONNX Runtime here and, where they are installed, on ONNX Runtime
on other CPUs: under valgrind (whose CPU is an AVX2+FMA one without AVX-512 or VNNI) and under
`qemu-x86_64 -cpu Nehalem` (SSE4.2), then on epx at every level this CPU has, and compares each
level with ONNX Runtime on a CPU of that level's kind, bit for bit. It prints which ONNX Runtime
CPUs it could run and which levels it checked, and exits 1 when an answer differs, when ONNX
Runtime's pair sums and exact sums are not both seen (nothing would have been shown), or when a
level this CPU has could not be checked.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity  # noqa: E402

LEVELS = ["avx512-vnni", "avx-vnni", "avx2", "portable", "reference"]
# Cases whose float arithmetic after the integer sums follows ONNX Runtime's FMA kernels (the
# LSTM cell's logistic and tanh): compared with ONNX Runtime on CPUs with FMA only.
NEEDS_FMA = ("DynamicQuantizeLSTM.",)
# How each level sums unsigned activations by signed weights.
PAIRS_LEVELS = {"avx2"}


# ---------------------------------------------------------------------------------------------
# The cases (built in ONNX Runtime's Python, which has onnx and numpy)


def cases():
    """(name, model, feeds) for every case, seeded."""
    import itertools

    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    U8, S8 = np.uint8, np.int8
    rng = np.random.default_rng(58)

    def tt(d):
        return T.UINT8 if d == U8 else T.INT8

    def extreme(shape, d):
        # Mostly extreme values, so that pairs of products pass 16 bits.
        if d == U8:
            v = np.where(rng.random(shape) < 0.6, 255, rng.integers(0, 256, shape))
        else:
            r = rng.random(shape)
            v = np.where(r < 0.3, 127, np.where(r < 0.6, -128, rng.integers(-128, 128, shape)))
        return v.astype(d)

    def zp(d, v):
        return np.array(v % 256 if d == U8 else v, d)

    def model(node, inputs, out_type, inits, ms=False):
        ops = [h.make_opsetid("", 13)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
        g = h.make_graph([node], "g", inputs, [h.make_tensor_value_info("y", out_type, None)], inits)
        m = h.make_model(g, opset_imports=ops)
        m.ir_version = 8
        return m.SerializeToString()

    out = []
    mm_types = [(U8, S8), (U8, U8), (S8, S8), (S8, U8)]
    # MatMulInteger: 2-D, a row vector, 1-D A, B batched as A and broadcast.
    shapes = [((5, 33), (33, 6)), ((1, 16), (16, 6)), ((7,), (7, 5)), ((2, 3, 9), (2, 9, 4)),
              ((2, 3, 9), (1, 9, 4)), ((3, 10), (2, 10, 3))]
    for (ad, bd), (sa, sb) in itertools.product(mm_types, shapes):
        a, b = extreme(sa, ad), extreme(sb, bd)
        node = h.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
        m = model(node, [h.make_tensor_value_info("a", tt(ad), list(sa))], T.INT32,
                  [nh.from_array(b, "b"), nh.from_array(zp(ad, 3), "za"), nh.from_array(zp(bd, -2), "zb")])
        out.append((f"MatMulInteger.{ad.__name__}x{bd.__name__}.{'x'.join(map(str, sa))}.{'x'.join(map(str, sb))}", m, {"a": a}))
    # QLinearMatMul: factor 2^-12 (a_scale 1, b_scale 1, y_scale 4096), exact in float32.
    for (ad, bd), (sa, sb), per_col in itertools.product(
            [(U8, S8), (U8, U8), (S8, S8)], [((5, 40), (40, 7)), ((1, 24), (24, 5)), ((2, 3, 8), (8, 4))], [False, True]):
        a, b = extreme(sa, ad), extreme(sb, bd)
        n = sb[-1]
        bs = np.ones(n if per_col else 1, np.float32) * (np.float32(2.0) if per_col else 1)
        node = h.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        m = model(node, [h.make_tensor_value_info("a", tt(ad), list(sa))], tt(ad),
                  [nh.from_array(np.array(1.0, np.float32), "as"), nh.from_array(zp(ad, 5), "az"),
                   nh.from_array(b, "b"), nh.from_array(bs if per_col else np.array(1.0, np.float32), "bs"),
                   nh.from_array(zp(bd, -3), "bz"),
                   nh.from_array(np.array(4096.0, np.float32), "ys"), nh.from_array(zp(ad, 128 if ad == U8 else 0), "yz")])
        out.append((f"QLinearMatMul.{ad.__name__}x{bd.__name__}.{'x'.join(map(str, sa))}{'.per-column' if per_col else ''}", m, {"a": a}))
    # MatMulIntegerToFloat and DynamicQuantizeMatMul (com.microsoft): scales of powers of two.
    for bd in (S8, U8):
        a, b = extreme((4, 20), U8), extreme((20, 6), bd)
        node = h.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz"], ["y"], domain="com.microsoft")
        m = model(node, [h.make_tensor_value_info("a", T.UINT8, [4, 20])], T.FLOAT,
                  [nh.from_array(b, "b"), nh.from_array(np.array(0.25, np.float32), "as"),
                   nh.from_array(np.array(0.5, np.float32), "bs"), nh.from_array(zp(U8, 7), "az"),
                   nh.from_array(zp(bd, 1), "bz")], ms=True)
        out.append((f"MatMulIntegerToFloat.uint8x{bd.__name__}", m, {"a": a}))
        x = (rng.random((3, 24), np.float32) * 2 - 0.1).astype(np.float32)
        x[:, ::3] = 1.9
        b = extreme((24, 5), bd)
        node = h.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz"], ["y"], domain="com.microsoft")
        m = model(node, [h.make_tensor_value_info("a", T.FLOAT, [3, 24])], T.FLOAT,
                  [nh.from_array(b, "b"), nh.from_array(np.array(0.5, np.float32), "bs"),
                   nh.from_array(zp(bd, 0 if bd == S8 else 128), "bz")], ms=True)
        out.append((f"DynamicQuantizeMatMul.{bd.__name__}", m, {"a": x}))
    # QLinearConv, factor 2^-12, on the paths ONNX Runtime and epx take: symmetric and not,
    # channel quads, odd channel counts (pairs across taps), pointwise, grouped, depthwise,
    # a single output, 1-D, dilated, 3-D.
    convs = [
        dict(cin=16, cout=16, k=(3, 3), group=1, pad=1, stride=1, hw=(7, 7)),
        dict(cin=16, cout=8, k=(3, 3), group=1, pad=1, stride=2, hw=(7, 7)),
        dict(cin=3, cout=16, k=(3, 3), group=1, pad=1, stride=2, hw=(9, 9)),
        dict(cin=5, cout=16, k=(3, 3), group=1, pad=0, stride=1, hw=(6, 6)),
        dict(cin=16, cout=16, k=(1, 1), group=1, pad=0, stride=1, hw=(6, 6)),
        dict(cin=16, cout=16, k=(1, 1), group=1, pad=0, stride=2, hw=(6, 6)),
        dict(cin=8, cout=16, k=(3, 3), group=2, pad=1, stride=1, hw=(6, 6)),
        dict(cin=6, cout=6, k=(3, 3), group=3, pad=1, stride=1, hw=(5, 5)),
        dict(cin=16, cout=16, k=(3, 3), group=16, pad=1, stride=1, hw=(7, 7)),
        dict(cin=8, cout=8, k=(5, 5), group=8, pad=2, stride=2, hw=(9, 9)),
        dict(cin=16, cout=16, k=(6, 6), group=1, pad=0, stride=1, hw=(6, 6)),
        dict(cin=4, cout=8, k=(3, 3), group=1, pad=2, stride=1, hw=(7, 7), dilation=2),
        dict(cin=7, cout=8, k=(5,), group=1, pad=2, stride=1, hw=(11,)),
        dict(cin=8, cout=8, k=(3,), group=1, pad=1, stride=1, hw=(12,)),
        dict(cin=3, cout=8, k=(2, 2, 2), group=1, pad=1, stride=1, hw=(3, 4, 4)),
    ]
    for c in convs:
        for (xd, wd), wz in itertools.product([(U8, S8), (U8, U8), (S8, S8)], [0, 3]):
            if wd == U8:
                wz += 125
            rank = len(c["k"])
            x = extreme((1, c["cin"]) + c["hw"], xd)
            w = extreme((c["cout"], c["cin"] // c["group"]) + c["k"], wd)
            zx, zy = zp(xd, 5 if xd == U8 else -3), zp(xd, 128 if xd == U8 else 0)
            inits = [nh.from_array(np.array(1.0, np.float32), "xs"), nh.from_array(zx, "xz"),
                     nh.from_array(w, "w"), nh.from_array(np.ones(c["cout"], np.float32), "ws"),
                     nh.from_array(np.full(c["cout"], wz, wd), "wz"),
                     nh.from_array(np.array(4096.0, np.float32), "ys"), nh.from_array(zy, "yz"),
                     nh.from_array(rng.integers(-5000, 5000, c["cout"]).astype(np.int32), "b")]
            node = h.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                               group=c["group"], pads=[c["pad"]] * 2 * rank, strides=[c["stride"]] * rank,
                               dilations=[c.get("dilation", 1)] * rank)
            m = model(node, [h.make_tensor_value_info("x", tt(xd), list(x.shape))], tt(xd), inits)
            geo = f"c{c['cin']}-m{c['cout']}-k{'x'.join(map(str, c['k']))}-g{c['group']}-p{c['pad']}-s{c['stride']}"
            if c.get("dilation"):
                geo += f"-d{c['dilation']}"
            out.append((f"QLinearConv.{xd.__name__}x{wd.__name__}.{geo}.wz{wz}", m, {"x": x}))
    # ConvInteger: uint8 by uint8 and by int8.
    for c in convs[:8] + convs[-3:]:
        for wd in (U8, S8):
            rank = len(c["k"])
            x = extreme((1, c["cin"]) + c["hw"], U8)
            w = extreme((c["cout"], c["cin"] // c["group"]) + c["k"], wd)
            node = h.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], group=c["group"],
                               pads=[c["pad"]] * 2 * rank, strides=[c["stride"]] * rank,
                               dilations=[c.get("dilation", 1)] * rank)
            m = model(node, [h.make_tensor_value_info("x", T.UINT8, list(x.shape))], T.INT32,
                      [nh.from_array(w, "w"), nh.from_array(zp(U8, 5), "xz"), nh.from_array(zp(wd, 3), "wz")])
            geo = f"c{c['cin']}-m{c['cout']}-k{'x'.join(map(str, c['k']))}-g{c['group']}"
            out.append((f"ConvInteger.uint8x{wd.__name__}.{geo}", m, {"x": x}))
    # DynamicQuantizeLSTM (com.microsoft): int8 weights, one direction.
    seq, batch, inp, hid = 3, 2, 12, 8
    wx = extreme((1, inp, 4 * hid), S8)
    wr = extreme((1, hid, 4 * hid), S8)
    x = (rng.random((seq, batch, inp), np.float32) * 4 - 0.5).astype(np.float32)
    node = h.make_node("DynamicQuantizeLSTM", ["x", "w", "r", "", "", "", "", "", "ws", "wz", "rs", "rz"],
                       ["y"], domain="com.microsoft", hidden_size=hid)
    m = model(node, [h.make_tensor_value_info("x", T.FLOAT, [seq, batch, inp])], T.FLOAT,
              [nh.from_array(wx, "w"), nh.from_array(wr, "r"),
               nh.from_array(np.array([0.01], np.float32), "ws"), nh.from_array(np.array([0], np.int8), "wz"),
               nh.from_array(np.array([0.02], np.float32), "rs"), nh.from_array(np.array([0], np.int8), "rz")],
              ms=True)
    out.append(("DynamicQuantizeLSTM.int8", m, {"x": x}))
    return out


def ort_worker(dest: str) -> None:
    """Runs every case on ONNX Runtime (no graph optimization, one thread) into `dest`."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    res = {}
    for name, m, feeds in cases():
        try:
            s = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])
            res[name] = s.run(None, feeds)[0]
        except Exception as e:  # reported per case by the comparison
            res[name] = f"ONNX Runtime refused it: {str(e).splitlines()[0][:200]}"
    with open(dest, "wb") as f:
        pickle.dump(res, f)


def write_cases(dest: Path) -> None:
    """Writes every case as DIR/NAME.onnx and DIR/NAME.INPUT.npy, and their list (with the
    inputs of each) as DIR/cases.json."""
    import numpy as np

    dest.mkdir(parents=True, exist_ok=True)
    listing = {}
    for name, m, feeds in cases():
        (dest / f"{name}.onnx").write_bytes(m)
        for k, v in feeds.items():
            np.save(dest / f"{name}.{k}.npy", v)
        listing[name] = sorted(feeds)
    (dest / "cases.json").write_text(json.dumps(listing, indent=1))


# ---------------------------------------------------------------------------------------------
# The CPUs ONNX Runtime runs on


CPUID_C = r"""
#include <cpuid.h>
#include <stdio.h>
int main(void) {
    unsigned a, b, c, d, a1 = 0, b1, c1, d1;
    __cpuid(1, a, b, c, d);
    int fma = (c >> 12) & 1, avx = (c >> 28) & 1;
    __cpuid_count(7, 0, a, b, c, d);
    __cpuid_count(7, 1, a1, b1, c1, d1);
    printf("avx=%d fma=%d avx2=%d avx512f=%d avx512bw=%d avx512vnni=%d avxvnni=%d\n", avx, fma,
           (b >> 5) & 1, (b >> 16) & 1, (b >> 30) & 1, (c >> 11) & 1, (a1 >> 4) & 1);
    return 0;
}
"""


def sums_of(flags: dict) -> tuple[str, str]:
    """How MLAS's dispatch sums u8·s8 on a CPU with `flags`: (description, 'pairs' | 'exact')."""
    if not (flags.get("avx") and flags.get("fma") and flags.get("avx2")):
        return "baseline x86-64 (SSE)", "exact"
    if flags.get("avx512f") and flags.get("avx512bw"):
        if flags.get("avx512vnni"):
            return "AVX-512 with VNNI", "exact"
        return "AVX-512 without VNNI", "pairs"
    if flags.get("avxvnni"):
        return "AVX2 with AVX-VNNI", "exact"
    return "AVX2+FMA without VNNI", "pairs"


def probe_cpu(prefix: list[str], work: Path) -> dict | None:
    """The CPUID features a program run under `prefix` sees."""
    exe = work / "cpuid"
    if not exe.exists():
        (work / "cpuid.c").write_text(CPUID_C)
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc or subprocess.run([cc, "-O1", "-o", str(exe), str(work / "cpuid.c")]).returncode:
            return None
    p = subprocess.run(prefix + [str(exe)], capture_output=True, text=True)
    if p.returncode:
        return None
    line = p.stdout.strip().splitlines()[-1]
    return {k: v == "1" for k, v in (kv.split("=") for kv in line.split())}


def ort_runs(py: Path, work: Path) -> list[tuple[str, str, str, bool, dict]]:
    """ONNX Runtime on this CPU and on each emulated one: (label, cpu, sums, fma, results)."""
    runs = []
    emulators = [("on this CPU", [])]
    if shutil.which("valgrind"):
        emulators.append(("under valgrind", ["valgrind", "-q", "--error-limit=no"]))
    else:
        print("int8 levels: valgrind is not installed: ONNX Runtime's AVX2 kernels not run here")
    if shutil.which("qemu-x86_64"):
        emulators.append(("under qemu-x86_64 -cpu Nehalem", ["qemu-x86_64", "-cpu", "Nehalem"]))
    else:
        print("int8 levels: qemu-x86_64 is not installed: ONNX Runtime's SSE kernels not run here")
    for label, prefix in emulators:
        flags = probe_cpu(prefix, work)
        if flags is None:
            print(f"int8 levels: ONNX Runtime {label}: the CPU probe did not run; skipped")
            continue
        cpu, sums = sums_of(flags)
        dest = work / f"ort-{len(runs)}.pkl"
        # valgrind reports the interpreter's own noise on stderr; only the exit status counts.
        p = subprocess.run(prefix + [str(py), __file__, "--ort-worker", str(dest)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode or not dest.exists():
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
            print(f"int8 levels: ONNX Runtime {label} failed: {' / '.join(tail)}")
            continue
        with open(dest, "rb") as f:
            runs.append((label, cpu, sums, bool(flags.get("fma")), pickle.load(f)))
        print(f"int8 levels: ONNX Runtime {label}: {cpu}, u8·s8 sums {sums}")
    return runs


# ---------------------------------------------------------------------------------------------
# epx


def epx_level(exe: Path, level: str, cases_dir: Path, names: list[str], feeds: dict, work: Path):
    """Every case on epx's CPU EP at `level`; None when this CPU lacks the level."""
    import numpy as np

    env = dict(os.environ, EPX_CPU_KERNELS=level)
    res = {}
    for name in names:
        out = Path(tempfile.mkdtemp(dir=work))
        args = [str(exe), "run", str(cases_dir / f"{name}.onnx"), "--output-dir", str(out)]
        for k in feeds[name]:
            args += ["--input", f"{k}={cases_dir / f'{name}.{k}.npy'}"]
        p = subprocess.run(args, env=env, capture_output=True, text=True)
        if p.returncode and "which this CPU does not have" in p.stderr:
            return None
        res[name] = np.load(out / "y.npy") if p.returncode == 0 else \
            f"epx refused it: {p.stderr.strip().splitlines()[-1][:200] if p.stderr.strip() else p.returncode}"
        shutil.rmtree(out, ignore_errors=True)
    return res


def same(a, b) -> bool:
    import numpy as np

    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return np.array_equal(a.view(np.uint32 if a.itemsize == 4 else np.uint64),
                              b.view(np.uint32 if b.itemsize == 4 else np.uint64))
    return np.array_equal(a, b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epx", default=str(parity.ROOT / "target/debug/epx"))
    ap.add_argument("--keep", help="write the cases and results here instead of a temporary folder")
    ap.add_argument("--ort-worker", help=argparse.SUPPRESS)
    ap.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ort_worker:
        ort_worker(args.ort_worker)
        return 0
    exe = Path(args.epx)
    if not exe.exists():
        sys.exit(f"{exe} is missing: build it with `cargo build -p epx-cli`")
    py = parity.ort_python()
    if not args.in_venv:
        # The rest runs in ONNX Runtime's environment, which has onnx and numpy.
        os.execv(str(py), [str(py), __file__, "--in-venv", *sys.argv[1:]])
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="epx-int8-levels-"))
    work.mkdir(parents=True, exist_ok=True)
    cases_dir = work / "cases"
    write_cases(cases_dir)
    feeds = json.loads((cases_dir / "cases.json").read_text())
    names = sorted(feeds)
    ops = sorted({n.split(".")[0] for n in names})
    print(f"int8 levels: {len(names)} cases of {', '.join(ops)}")
    runs = ort_runs(py, work)
    failed = False
    by_sums: dict[str, list] = {}
    for label, cpu, sums, fma, res in runs:
        by_sums.setdefault(sums, []).append((label, cpu, fma, res))
    # ONNX Runtime's two rules must differ somewhere, or nothing is shown.
    if "pairs" in by_sums and "exact" in by_sums:
        differ = [n for n in names if not same(by_sums["pairs"][0][3][n], by_sums["exact"][0][3][n])]
        print(f"int8 levels: ONNX Runtime's saturated pairs and exact sums differ on {len(differ)} "
              f"cases ({', '.join(sorted({n.split('.')[0] for n in differ}))})")
        if not differ:
            failed = True
            print("int8 levels: FAIL: no case tells the two rules apart")
    for level in LEVELS:
        want = "pairs" if level in PAIRS_LEVELS else "exact"
        got = epx_level(exe, level, cases_dir, names, feeds, work)
        if got is None:
            print(f"int8 levels: epx {level}: skipped (this CPU lacks it)")
            continue
        if want not in by_sums:
            print(f"int8 levels: epx {level}: FAIL: not checked, no ONNX Runtime run here sums "
                  f"u8·s8 {'in saturated pairs' if want == 'pairs' else 'exactly'} (install "
                  f"{'valgrind' if want == 'pairs' else 'qemu-user'})")
            failed = True
            continue
        for label, cpu, fma, res in by_sums[want]:
            checked = [n for n in names if fma or not n.startswith(NEEDS_FMA)]
            bad = [n for n in checked if not same(got[n], res[n])]
            note = "" if len(checked) == len(names) else \
                f" ({len(names) - len(checked)} left out: their float cell needs FMA)"
            print(f"int8 levels: epx {level} against ONNX Runtime {label} ({cpu}): "
                  f"{len(checked) - len(bad)}/{len(checked)} bit-identical{note}")
            for n in bad[:20]:
                g, r = got[n], res[n]
                if isinstance(g, str) or isinstance(r, str):
                    why = g if isinstance(g, str) else r
                else:
                    why = f"{int((g != r).sum()) if g.shape == r.shape else 'shape'} elements differ"
                print(f"    {n}: {why}")
            failed |= bool(bad)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
