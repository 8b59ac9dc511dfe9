"""The native per-call path (`epx._native`, built with the wheel for CPython 3.11+): a run whose
inputs are all C-contiguous numpy arrays of their declared element types, and whose outputs are
all numeric tensors, goes from Python to libepx and back without ctypes. Everything else, and
any Python without the extension, takes the ctypes path. `EPX_PYTHON_NATIVE=0` turns it off."""

from __future__ import annotations

import ctypes
import os
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _capi

try:
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # no extension in this install (an older CPython, a source tree)
    _native = None

_FUNCTIONS = ("epx_session_run_with_options", "epx_outputs_count", "epx_outputs_get",
              "epx_outputs_free", "epx_error_code", "epx_error_message", "epx_error_free")


def available() -> bool:
    return _native is not None and os.environ.get("EPX_PYTHON_NATIVE", "1") != "0"


# A run of a session that may keep the GIL keeps it when the previous run took less than this
# (ns) and its inputs are no larger: releasing and retaking the GIL costs more than such a run.
HOLD_GIL_BELOW_NS = 10_000

# Operators whose run time does not follow their inputs' size: a session with one never keeps
# the GIL during a run.
_CONTROL_FLOW = frozenset(("Loop", "If", "Scan"))


def runner(lib: _capi.Library, handle: int, inputs: Sequence[Tuple[str, str]],
           outputs: Sequence[Tuple[str, str]], placement: Optional[dict] = None) -> Optional[Any]:
    """A native runner for a session whose inputs and outputs (`(name, type)`, type as
    `tensor(float)`) are all numeric tensors; None where the native path does not apply.
    `placement` (the session's placement report) says whether a short run may keep the GIL:
    every node on the CPU EP in this process, none with control flow."""
    if not available():
        return None
    codes = []
    for name, ty in inputs:
        code = _numeric(ty)
        if code is None:
            return None
        codes.append((name, code))
    if any(_numeric(ty) is None for _, ty in outputs):
        return None
    addresses = {f: ctypes.cast(lib._lib[f], ctypes.c_void_p).value for f in _FUNCTIONS}
    return _native.Runner(addresses, handle, codes, [name for name, _ in outputs], np,
                          may_hold_gil(placement), HOLD_GIL_BELOW_NS)


def may_hold_gil(placement: Optional[dict]) -> bool:
    """Whether a session with this placement report may keep the GIL through a short run: its
    time then follows its inputs' size and nothing in it waits (see `GilRule` in the
    extension)."""
    if not placement or placement.get("isolated_providers"):
        return False
    nodes = placement.get("nodes") or []
    return bool(nodes) and all(n.get("provider") == "cpu" and n.get("op_type") not in _CONTROL_FLOW
                               for n in nodes)


def _numeric(ty: str) -> Optional[int]:
    if not ty.startswith("tensor(") or not ty.endswith(")"):
        return None
    code = _capi.ONNX_NAMES.get(ty[len("tensor("):-1])
    return code if code in _capi.DTYPES and code not in (14, 15) else None


def names(values: Sequence[Any]) -> List[Tuple[str, str]]:
    return [(v.name, v.type) for v in values]
