"""`onnxruntime.capi` as programs import it: the native module (exception classes, classes and
functions) under both of its names, `onnxruntime_pybind11_state` and `_pybind_state`."""

from . import onnxruntime_pybind11_state
from . import onnxruntime_pybind11_state as _pybind_state  # noqa: F401
