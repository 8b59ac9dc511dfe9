"""ONNX Runtime's rules for the values a Python program feeds, as its Python binding applies them
(checked against onnxruntime itself by tests/test_input_rules.py):

* a numpy array must have exactly the input's element type (`Unexpected input data type`,
  InvalidArgument); any layout is read (strided, Fortran-ordered, negative strides, broadcast,
  read-only); a dtype numpy has but ONNX does not (complex, long double, datetime) is a
  RuntimeError. A string input takes unicode, bytes and object arrays (each element as `str()`).
* a list is converted to the input's element type as numpy converts it (`[1, 2]` into `int32`,
  `[1, 2.5]` into `float16`); one numpy cannot convert (ragged, out of range for the type, text
  into a number) is a RuntimeError. A string input takes `str()` of each element.
* tuples, `str` and `bytes` are refused (`Input must be a list of dictionaries or a single numpy
  array`), as are Python and numpy scalars (`Unable to handle object of type`): RuntimeError.

Deliberately not as ONNX Runtime: a byte-swapped array is read by its values (ONNX Runtime reads
its bytes as if native), and a bytes array's elements are decoded whole (ONNX Runtime reads past
the shorter ones); both give ONNX Runtime wrong values without a word.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from epx import _capi

from .capi.onnxruntime_pybind11_state import Fail, InvalidArgument

# numpy dtype kinds ONNX has no element type for: complex, datetime, timedelta, void.
_NO_ONNX_KIND = frozenset("cmMV")


def element_dtype(ty: str) -> Optional[np.dtype]:
    """The numpy dtype of `tensor(<elem>)`, `np.dtype(object)` for strings, None for types this
    module leaves to epx (sequences, maps, optionals, bfloat16, ...)."""
    if not ty.startswith("tensor(") or not ty.endswith(")"):
        return None
    name = ty[len("tensor("):-1]
    if name == "string":
        return np.dtype(object)
    code = _capi.ONNX_NAMES.get(name)
    dtype = _capi.DTYPES.get(code) if code is not None else None
    return np.dtype(dtype) if dtype is not None else None


def _tensor_name(dtype: np.dtype) -> str:
    if dtype.kind in "USO":
        return "tensor(string)"
    names = {code: n for n, code in _capi.ONNX_NAMES.items()}
    code = _capi.CODES.get(dtype.newbyteorder("=")) if dtype.kind != "b" else 9
    return f"tensor({names.get(code, dtype.name)})"


def convert(name: str, value: Any, want: np.dtype) -> Any:
    """`value` as ONNX Runtime's binding would hand it to an input of numpy dtype `want`, or the
    exception it would raise."""
    if isinstance(value, np.ndarray):
        return _array(name, value, want)
    if isinstance(value, list):
        if want.kind == "O":
            arr = np.array(value, dtype=object)
            return _strings(arr)
        try:
            return np.array(value, dtype=want)
        except (ValueError, TypeError, OverflowError):
            raise RuntimeError("Could not create tensor from given input list") from None
    if isinstance(value, (tuple, str, bytes)):
        raise RuntimeError(f"Input must be a list of dictionaries or a single numpy array for "
                           f"input '{name}'.")
    if value is None:
        raise Fail(1, f"input '{name}' is None: feed a numpy array (an optional input is left "
                      "out of the feed instead)")
    if isinstance(value, np.generic):
        raise RuntimeError(f"Unable to handle object of type {type(value)}")
    if hasattr(value, "__dlpack__") or hasattr(value, "__array_interface__"):
        return value  # a tensor of another library: epx reads it through DLPack / numpy
    raise RuntimeError(f"Unable to handle object of type {type(value)}")


def _array(name: str, arr: np.ndarray, want: np.dtype) -> np.ndarray:
    dtype = arr.dtype
    if dtype == want and want.kind != "O":
        return arr
    if dtype.kind in _NO_ONNX_KIND or (dtype.kind == "f" and dtype.itemsize > 8):
        raise RuntimeError(f"Numpy_type {dtype.num} can't be converted to MLDataType.")
    if want.kind == "O":
        if dtype.kind == "U":
            return arr
        if dtype.kind == "S":
            return _strings(arr)
        if dtype.kind == "O":
            return arr if all(type(x) is str for x in arr.flat) else _strings(arr)
    elif dtype.byteorder not in "=|" and dtype.newbyteorder("=") == want:
        return arr.astype(want)  # byte-swapped: its values, in native order
    raise InvalidArgument(8, f"Unexpected input data type. Actual: ({_tensor_name(dtype)}) , "
                             f"expected: ({_tensor_name(want)}) (input '{name}')")


def _strings(arr: np.ndarray) -> np.ndarray:
    """Each element as text: bytes decoded as UTF-8, anything else through `str()`."""
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, x in enumerate(arr.reshape(-1)):
        flat[i] = x.decode("utf-8", "replace") if isinstance(x, bytes) else \
            x if type(x) is str else str(x)
    return out
