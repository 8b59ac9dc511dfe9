"""libepx through ctypes: the library, its function signatures and its error type.

Nothing here is public API; `epx` and `epx.onnxruntime` build on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

import numpy as np

# EpxElementType (epx_plugin.h) <-> numpy. bfloat16 has no numpy dtype; strings are handled apart.
DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
    7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
    14: np.complex64, 15: np.complex128,
}
CODES = {np.dtype(t): c for c, t in DTYPES.items()}
STRING = 8
# ONNX's element type names, as in `tensor(float)`.
ONNX_NAMES = {
    "float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "string": 8, "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13,
    "complex64": 14, "complex128": 15, "bfloat16": 16,
}
# EpxValueKind (epx_plugin.h).
TENSOR, SEQUENCE, MAP, OPTIONAL = 1, 2, 3, 4

# EpxErrorCode (epx.h).
ERROR_NAMES = {
    1: "invalid argument", 2: "model", 3: "io", 4: "plugin load", 5: "provider setup",
    6: "provider", 7: "unsupported", 8: "invalid input", 9: "run", 10: "panic", 11: "internal",
    12: "cancelled",
}


class EpxError(Exception):
    """A failure reported by libepx.

    `code` is the EpxErrorCode number (`code_name` says it in words: "model",
    "invalid input", ...) and `message` libepx's message, which names what failed and why.
    """

    def __init__(self, code: int, message: str):
        super().__init__(f"{message} [{ERROR_NAMES.get(code, code)}]")
        self.code = code
        self.message = message

    @property
    def code_name(self) -> str:
        return ERROR_NAMES.get(self.code, str(self.code))


class ProviderDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("plugin", ctypes.c_char_p),
                ("version", ctypes.c_char_p), ("library", ctypes.c_char_p),
                ("available", ctypes.c_bool), ("reason", ctypes.c_char_p)]


class ValueDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elem_type", ctypes.c_int32),
                ("ndim", ctypes.c_int64), ("shape", ctypes.POINTER(ctypes.c_int64))]


class TensorRef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elem_type", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("ndim", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("byte_len", ctypes.c_size_t)]


P = ctypes.c_void_p
_STR = ctypes.c_char_p
_PP = ctypes.POINTER(P)

# size_t select(const char *devices_json, const char *model_json, char *eps, size_t capacity,
#               void *user_data)
SELECTION_FN = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p, P,
                                ctypes.c_size_t, P)
_SIZE = ctypes.c_size_t
SIGNATURES = {
    "epx_version": (_STR, []),
    "epx_plugin_abi_version": (_STR, []),
    "epx_max_tensor_bytes": (ctypes.c_uint64, []),
    "epx_set_max_tensor_bytes": (ctypes.c_uint64, [ctypes.c_uint64]),
    "epx_error_code": (ctypes.c_int, [P]),
    "epx_error_message": (_STR, [P]),
    "epx_error_free": (None, [P]),
    "epx_string_free": (None, [P]),
    "epx_session_options_new": (P, []),
    "epx_session_options_free": (None, [P]),
    "epx_session_options_add_provider": (
        P, [P, _STR, ctypes.POINTER(_STR), ctypes.POINTER(_STR), _SIZE, ctypes.c_bool]),
    "epx_session_options_set_strict": (P, [P, ctypes.c_bool]),
    "epx_session_options_set_intra_op_threads": (P, [P, _SIZE]),
    "epx_session_options_set_max_tensor_bytes": (P, [P, ctypes.c_uint64]),
    "epx_session_options_set_isolated": (P, [P, ctypes.c_bool]),
    "epx_session_options_set_kernel_cache": (P, [P, ctypes.c_bool]),
    "epx_session_options_set_profiling": (P, [P, ctypes.c_bool]),
    "epx_session_options_set_selection_policy": (P, [P, _STR]),
    "epx_session_options_set_selection_function": (P, [P, P, P]),
    "epx_env_new": (P, [ctypes.POINTER(_STR), _SIZE, P, _PP]),
    "epx_env_free": (None, [P]),
    "epx_env_provider_count": (_SIZE, [P]),
    "epx_env_provider": (P, [P, _SIZE, ctypes.POINTER(ProviderDesc)]),
    "epx_env_doctor": (P, [P, ctypes.POINTER(ctypes.c_bool), _PP]),
    "epx_env_devices_json": (P, [P, _PP]),
    "epx_session_new": (P, [P, _STR, P, _PP]),
    "epx_session_new_from_bytes": (P, [P, _STR, _SIZE, P, _PP]),
    "epx_session_free": (None, [P]),
    "epx_session_input_count": (_SIZE, [P]),
    "epx_session_output_count": (_SIZE, [P]),
    "epx_session_input": (P, [P, _SIZE, ctypes.POINTER(ValueDesc)]),
    "epx_session_output": (P, [P, _SIZE, ctypes.POINTER(ValueDesc)]),
    "epx_session_input_type": (P, [P, _SIZE, _PP]),
    "epx_session_output_type": (P, [P, _SIZE, _PP]),
    "epx_session_placement_json": (P, [P, _PP]),
    "epx_session_profile_json": (P, [P, ctypes.c_bool, _PP]),
    "epx_session_metadata_json": (P, [P, _PP]),
    "epx_outputs_count": (_SIZE, [P]),
    "epx_outputs_free": (None, [P]),
    "epx_value_new_tensor": (P, [ctypes.POINTER(TensorRef), _PP]),
    "epx_value_new_strings": (P, [ctypes.POINTER(_STR), ctypes.POINTER(ctypes.c_int64), _SIZE, _PP]),
    "epx_value_new_sequence": (P, [ctypes.c_int32, _PP, _SIZE, _PP]),
    "epx_value_new_map": (P, [P, P, _PP]),
    "epx_value_new_optional": (P, [P, _PP]),
    "epx_value_free": (None, [P]),
    "epx_value_kind": (ctypes.c_uint32, [P]),
    "epx_value_tensor": (P, [P, ctypes.POINTER(TensorRef)]),
    "epx_value_string": (P, [P, _SIZE, _PP, ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE)]),
    "epx_value_sequence_len": (_SIZE, [P]),
    "epx_value_sequence_at": (P, [P, _SIZE, _PP]),
    "epx_value_map": (P, [P, _PP, _PP]),
    "epx_value_optional": (P, [P, _PP]),
    "epx_session_run": (P, [P, ctypes.POINTER(TensorRef), _SIZE, _PP]),
    "epx_session_run_values": (P, [P, ctypes.POINTER(_STR), _PP, _SIZE, _PP]),
    "epx_run_options_new": (P, []),
    "epx_run_options_free": (None, [P]),
    "epx_run_options_set_terminate": (P, [P, ctypes.c_bool]),
    "epx_session_run_with_options": (P, [P, ctypes.POINTER(TensorRef), _SIZE, P, _PP]),
    "epx_session_run_values_with_options": (P, [P, ctypes.POINTER(_STR), _PP, _SIZE, P, _PP]),
    "epx_session_options_set_cancellation": (P, [P, P]),
    "epx_outputs_value": (P, [P, _SIZE, ctypes.POINTER(_STR), _PP]),
}


def text(s) -> bytes:
    """A C string argument from str, bytes or a path."""
    if isinstance(s, bytes):
        return s
    return os.fsencode(s) if isinstance(s, os.PathLike) else str(s).encode()


def package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


class Library:
    """libepx, opened with ctypes.

    Found, in order: the `path` given, the EPX_LIBRARY environment variable, the copy inside this
    package (a wheel ships `epx/lib/libepx.so`), the install prefix around this package
    (`<prefix>/lib/libepx.so` for `<prefix>/share/epx/python/epx/`), then the system's library
    search (ctypes.util.find_library).
    """

    _default: Optional["Library"] = None

    def __init__(self, path: Optional[str] = None):
        path = path or os.environ.get("EPX_LIBRARY") or self._find()
        if not path:
            raise EpxError(4, "libepx was not found: install the epx wheel, pass "
                              "epx.Library(path), or set EPX_LIBRARY to libepx.so's path")
        self.path = path
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            raise EpxError(4, f"cannot open libepx at {path}: {e}") from None
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise EpxError(4, f"{path} has no `{name}`: that libepx is older than this "
                                  "Python module; install libepx and the module from one "
                                  "release") from None
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)

    @staticmethod
    def _find() -> Optional[str]:
        here = package_dir()
        for candidate in (os.path.join(here, "lib", "libepx.so"),
                          os.path.join(here, "..", "..", "..", "..", "lib", "libepx.so")):
            if os.path.exists(candidate):
                return os.path.normpath(candidate)
        return ctypes.util.find_library("epx")

    @classmethod
    def default(cls) -> "Library":
        if cls._default is None:
            cls._default = cls()
        return cls._default

    def version(self) -> str:
        return self.epx_version().decode()

    def check(self, error) -> None:
        """Raises EpxError for a non-NULL EpxError pointer (and frees it)."""
        if error:
            code = self.epx_error_code(error)
            message = self.epx_error_message(error).decode("utf-8", "replace")
            self.epx_error_free(error)
            raise EpxError(code, message)

    def take_string(self, ptr) -> str:
        """A string libepx returned through `char **`, freed after reading."""
        try:
            return ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self.epx_string_free(ptr)

    def out(self, fn, *args):
        """Calls `fn(*args, &out)`, checks the error, returns `out`."""
        out = P()
        self.check(fn(*args, ctypes.byref(out)))
        return out.value

    def json_of(self, fn, handle) -> str:
        return self.take_string(self.out(fn, handle))
