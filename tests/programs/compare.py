"""The default comparison of a driver's ONNX Runtime result with its epx result.

`compare(ort, epx)` walks both JSON values together and returns a list of problems (empty when
they match):
- strings, booleans and None: equal;
- integers: equal (they are labels, counts, indices), except under a key naming a box (see
  BOX_KEYS), where they are pixel coordinates and may differ by `px`;
- floats: |a - b| <= atol + rtol * |b| (scores, probabilities, timestamps in seconds), or `px`
  under a box key;
- lists: same length, element by element; dicts: same keys, value by value.
A driver with its own `compare(ort, epx)` can call these with other tolerances."""

from __future__ import annotations

import math

RTOL = 1e-3
ATOL = 1e-3
PX = 2.0
BOX_KEYS = ("box", "boxes", "bbox", "det", "points", "polygon")
MAX_PROBLEMS = 8


def _is_box_key(key: str) -> bool:
    key = key.lower()
    return any(key == b or key.endswith("_" + b) or key.startswith(b) for b in BOX_KEYS)


def _short(v, n: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def compare(ort, epx, where: str = "", rtol: float = RTOL, atol: float = ATOL, px: float = PX,
            _box: bool = False) -> list[str]:
    problems: list[str] = []
    _walk(ort, epx, where or "result", rtol, atol, px, _box, problems)
    if len(problems) > MAX_PROBLEMS:
        problems = problems[:MAX_PROBLEMS] + [f"... and {len(problems) - MAX_PROBLEMS} more"]
    return problems


def _walk(a, b, where, rtol, atol, px, box, problems):
    if len(problems) > MAX_PROBLEMS * 4:
        return
    if isinstance(a, bool) or a is None or isinstance(a, str):
        if a != b or type(a) is not type(b):
            problems.append(f"{where}: ORT {_short(a)} != epx {_short(b)}")
        return
    if isinstance(a, (int, float)):
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            problems.append(f"{where}: ORT {_short(a)} != epx {_short(b)}")
            return
        if isinstance(a, float) or isinstance(b, float) or box:
            if math.isnan(a) or math.isnan(b):
                if not (math.isnan(a) and math.isnan(b)):
                    problems.append(f"{where}: ORT {a} != epx {b}")
                return
            tol = px if box else atol + rtol * abs(a)
            if abs(a - b) > tol:
                problems.append(f"{where}: ORT {a:.6g} vs epx {b:.6g} (|diff| {abs(a - b):.3g} > {tol:.3g})")
        elif a != b:
            problems.append(f"{where}: ORT {a} != epx {b}")
        return
    if isinstance(a, list):
        if not isinstance(b, list):
            problems.append(f"{where}: ORT list, epx {_short(b)}")
            return
        if len(a) != len(b):
            problems.append(f"{where}: ORT has {len(a)} items, epx {len(b)} (ORT {_short(a, 60)}, epx {_short(b, 60)})")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{where}[{i}]", rtol, atol, px, box, problems)
        return
    if isinstance(a, dict):
        if not isinstance(b, dict):
            problems.append(f"{where}: ORT dict, epx {_short(b)}")
            return
        for k in a:
            if k not in b:
                problems.append(f"{where}.{k}: missing on epx")
        for k in b:
            if k not in a:
                problems.append(f"{where}.{k}: only on epx")
        for k in a:
            if k in b:
                _walk(a[k], b[k], f"{where}.{k}", rtol, atol, px, box or _is_box_key(str(k)), problems)
        return
    if a != b:
        problems.append(f"{where}: ORT {_short(a)} != epx {_short(b)}")


def compare_boxes(ort, epx, tol: float = PX, where: str = "boxes") -> list[str]:
    """Lists of boxes (lists of numbers) with a pixel tolerance, in the same order."""
    return compare(ort, epx, where=where, px=tol, _box=True)
