"""epx from Python: a pure-Python module over libepx's C API (ctypes) and numpy.

    import numpy as np, epx
    env = epx.Environment(plugin_dirs=["/opt/epx/plugins"])
    for ep in env.providers():
        print(ep["name"], ep["available"], ep["reason"])
    session = epx.Session(env, "model.onnx", providers=["cuda", ("ort_cpu", {"intra_op_num_threads": "2"})])
    outputs = session.run({"image": np.zeros((1, 1, 28, 28), np.float32)})
    print(session.placement()["nodes"])

Values beyond numeric tensors: string tensors are numpy unicode arrays (`np.array(["a", "b"])`),
sequences are lists, maps are dicts, and an optional is its value or None, in both directions.

Failures raise epx.EpxError, carrying libepx's error code and message. libepx is found through
`Library(path)`, the EPX_LIBRARY environment variable, the installed prefix next to this file
(`<prefix>/lib/libepx.so` for `<prefix>/share/epx/python/epx.py`), then the system's library
search (ctypes.util.find_library).
"""

import ctypes
import ctypes.util
import json
import os

import numpy as np

__all__ = ["EpxError", "Library", "Environment", "Session"]

# EpxElementType (epx_plugin.h) ↔ numpy. bfloat16 and strings have no numpy dtype here.
_DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
    7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
    14: np.complex64, 15: np.complex128,
}
_CODES = {np.dtype(t): c for c, t in _DTYPES.items()}

# EpxErrorCode (epx.h).
ERROR_NAMES = {
    1: "invalid argument", 2: "model", 3: "io", 4: "plugin load", 5: "provider setup",
    6: "provider", 7: "unsupported", 8: "invalid input", 9: "run", 10: "panic", 11: "internal",
}


class EpxError(Exception):
    """A failure reported by libepx: `code` (an EpxErrorCode value) and `message`."""

    def __init__(self, code, message):
        super().__init__(f"{message} [{ERROR_NAMES.get(code, code)}]")
        self.code = code
        self.message = message


class _ProviderDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("plugin", ctypes.c_char_p),
                ("version", ctypes.c_char_p), ("library", ctypes.c_char_p),
                ("available", ctypes.c_bool), ("reason", ctypes.c_char_p)]


class _ValueDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elem_type", ctypes.c_int32),
                ("ndim", ctypes.c_int64), ("shape", ctypes.POINTER(ctypes.c_int64))]


class _TensorRef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elem_type", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("ndim", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("byte_len", ctypes.c_size_t)]


_P = ctypes.c_void_p
_SIGNATURES = {
    "epx_version": (ctypes.c_char_p, []),
    "epx_error_code": (ctypes.c_int, [_P]),
    "epx_error_message": (ctypes.c_char_p, [_P]),
    "epx_error_free": (None, [_P]),
    "epx_string_free": (None, [_P]),
    "epx_session_options_new": (_P, []),
    "epx_session_options_free": (None, [_P]),
    "epx_session_options_add_provider": (
        _P, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
             ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_bool]),
    "epx_session_options_set_strict": (_P, [_P, ctypes.c_bool]),
    "epx_env_new": (_P, [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, _P, ctypes.POINTER(_P)]),
    "epx_env_free": (None, [_P]),
    "epx_env_provider_count": (ctypes.c_size_t, [_P]),
    "epx_env_provider": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_ProviderDesc)]),
    "epx_env_doctor": (_P, [_P, ctypes.POINTER(ctypes.c_bool), ctypes.POINTER(_P)]),
    "epx_session_new": (_P, [_P, ctypes.c_char_p, _P, ctypes.POINTER(_P)]),
    "epx_session_new_from_bytes": (_P, [_P, ctypes.c_char_p, ctypes.c_size_t, _P, ctypes.POINTER(_P)]),
    "epx_session_free": (None, [_P]),
    "epx_session_input_count": (ctypes.c_size_t, [_P]),
    "epx_session_output_count": (ctypes.c_size_t, [_P]),
    "epx_session_input": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_ValueDesc)]),
    "epx_session_output": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_ValueDesc)]),
    "epx_session_placement_json": (_P, [_P, ctypes.POINTER(_P)]),
    "epx_session_run": (_P, [_P, ctypes.POINTER(_TensorRef), ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_outputs_count": (ctypes.c_size_t, [_P]),
    "epx_outputs_get": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_TensorRef)]),
    "epx_outputs_free": (None, [_P]),
    "epx_session_input_type": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_session_output_type": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_value_new_tensor": (_P, [ctypes.POINTER(_TensorRef), ctypes.POINTER(_P)]),
    "epx_value_new_strings": (_P, [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64),
                                   ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_value_new_sequence": (_P, [ctypes.c_int32, ctypes.POINTER(_P), ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_value_new_map": (_P, [_P, _P, ctypes.POINTER(_P)]),
    "epx_value_new_optional": (_P, [_P, ctypes.POINTER(_P)]),
    "epx_value_free": (None, [_P]),
    "epx_value_kind": (ctypes.c_uint32, [_P]),
    "epx_value_tensor": (_P, [_P, ctypes.POINTER(_TensorRef)]),
    "epx_value_string": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
    "epx_value_sequence_len": (ctypes.c_size_t, [_P]),
    "epx_value_sequence_at": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_value_map": (_P, [_P, ctypes.POINTER(_P), ctypes.POINTER(_P)]),
    "epx_value_optional": (_P, [_P, ctypes.POINTER(_P)]),
    "epx_session_run_values": (_P, [_P, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_P),
                                    ctypes.c_size_t, ctypes.POINTER(_P)]),
    "epx_outputs_value": (_P, [_P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_P)]),
}

# EpxValueKind (epx_plugin.h).
_TENSOR, _SEQUENCE, _MAP, _OPTIONAL = 1, 2, 3, 4
# ONNX's type names (as in `tensor(float)`) ↔ EpxElementType.
_ONNX_NAMES = {"float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
               "string": 8, "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13}


class Library:
    """libepx, opened with ctypes. `Library()` finds it as the module docstring says."""

    _default = None

    def __init__(self, path=None):
        path = path or os.environ.get("EPX_LIBRARY") or self._find()
        if not path:
            raise EpxError(4, "libepx was not found: pass Library(path) or set EPX_LIBRARY")
        self.path = path
        self._lib = ctypes.CDLL(path)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self._lib, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)

    @staticmethod
    def _find():
        here = os.path.dirname(os.path.abspath(__file__))
        installed = os.path.join(here, "..", "..", "..", "lib", "libepx.so")
        if os.path.exists(installed):
            return os.path.normpath(installed)
        return ctypes.util.find_library("epx")

    @classmethod
    def default(cls):
        if cls._default is None:
            cls._default = cls()
        return cls._default

    def version(self):
        return self.epx_version().decode()

    def check(self, error):
        """Raises EpxError for a non-NULL EpxError pointer (and frees it)."""
        if error:
            code = self.epx_error_code(error)
            message = self.epx_error_message(error).decode("utf-8", "replace")
            self.epx_error_free(error)
            raise EpxError(code, message)

    def take_string(self, ptr):
        try:
            return ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self.epx_string_free(ptr)


def _text(s):
    return os.fsencode(s) if isinstance(s, os.PathLike) else str(s).encode()


class _Options:
    """An EpxSessionOptions built from `providers`: names, or (name, {key: value}) pairs."""

    def __init__(self, lib, providers, strict=False, error_on_failure=True):
        self._lib = lib
        self.ptr = lib.epx_session_options_new()
        if not self.ptr:
            raise EpxError(11, "epx_session_options_new failed")
        try:
            for p in providers:
                name, opts = (p, {}) if isinstance(p, str) else p
                keys = (ctypes.c_char_p * len(opts))(*[_text(k) for k in opts])
                values = (ctypes.c_char_p * len(opts))(*[_text(v) for v in opts.values()])
                lib.check(lib.epx_session_options_add_provider(
                    self.ptr, _text(name), keys, values, len(opts), error_on_failure))
            lib.check(lib.epx_session_options_set_strict(self.ptr, strict))
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.ptr:
            self._lib.epx_session_options_free(self.ptr)
            self.ptr = None


class Environment:
    """Plugin folders and default EPs; see epx_env_new in epx.h."""

    def __init__(self, plugin_dirs=(), default_providers=(), library=None):
        self._lib = library or Library.default()
        dirs = [_text(d) for d in plugin_dirs]
        arr = (ctypes.c_char_p * len(dirs))(*dirs)
        opts = _Options(self._lib, default_providers)
        out = _P()
        try:
            self._lib.check(self._lib.epx_env_new(arr, len(dirs), opts.ptr, ctypes.byref(out)))
        finally:
            opts.close()
        self._ptr = out.value

    def providers(self):
        """Every EP found: dicts with name, plugin, version, library, available, reason."""
        result = []
        for i in range(self._lib.epx_env_provider_count(self._ptr)):
            d = _ProviderDesc()
            self._lib.check(self._lib.epx_env_provider(self._ptr, i, ctypes.byref(d)))
            dec = lambda s: s.decode("utf-8", "replace") if s is not None else None
            result.append({"name": dec(d.name), "plugin": dec(d.plugin), "version": dec(d.version),
                           "library": dec(d.library), "available": bool(d.available),
                           "reason": dec(d.reason)})
        return result

    def doctor(self):
        """(all plugins usable, the report text epx doctor prints)."""
        ok, text = ctypes.c_bool(), _P()
        self._lib.check(self._lib.epx_env_doctor(self._ptr, ctypes.byref(ok), ctypes.byref(text)))
        return bool(ok.value), self._lib.take_string(text)

    def close(self):
        if getattr(self, "_ptr", None):
            self._lib.epx_env_free(self._ptr)
            self._ptr = None

    __del__ = close


def _describe(desc):
    shape = None if desc.ndim < 0 else tuple(desc.shape[i] if desc.shape[i] >= 0 else None
                                              for i in range(desc.ndim))
    dtype = _DTYPES.get(desc.elem_type)
    return {"name": desc.name.decode(), "dtype": np.dtype(dtype) if dtype else None, "shape": shape}


class Session:
    """A model partitioned across `providers` (in priority order; the CPU EP takes the rest).

    `model` is a path or the model's bytes. With `strict`, making the session fails when a node
    would fall back to the CPU EP; with `error_on_failure` (the default), an EP that cannot be
    set up is an error rather than skipped.
    """

    def __init__(self, env, model, providers=(), strict=False, error_on_failure=True):
        self._env = env  # keeps the environment (and libepx) alive
        self._lib = env._lib
        opts = _Options(self._lib, providers, strict, error_on_failure)
        out = _P()
        try:
            if isinstance(model, (bytes, bytearray, memoryview)):
                data = bytes(model)
                self._lib.check(self._lib.epx_session_new_from_bytes(
                    env._ptr, data, len(data), opts.ptr, ctypes.byref(out)))
            else:
                self._lib.check(self._lib.epx_session_new(
                    env._ptr, _text(model), opts.ptr, ctypes.byref(out)))
        finally:
            opts.close()
        self._ptr = out.value
        self.inputs = [self._value(self._lib.epx_session_input, i)
                       for i in range(self._lib.epx_session_input_count(self._ptr))]
        self.outputs = [self._value(self._lib.epx_session_output, i)
                        for i in range(self._lib.epx_session_output_count(self._ptr))]
        for i, d in enumerate(self.inputs):
            d["type"] = self._type(self._lib.epx_session_input_type, i)
        for i, d in enumerate(self.outputs):
            d["type"] = self._type(self._lib.epx_session_output_type, i)

    def _type(self, fn, i):
        text = _P()
        self._lib.check(fn(self._ptr, i, ctypes.byref(text)))
        return self._lib.take_string(text)

    def _value(self, fn, i):
        d = _ValueDesc()
        self._lib.check(fn(self._ptr, i, ctypes.byref(d)))
        return _describe(d)

    def run(self, feeds):
        """Runs on `feeds` ({input name: value}); returns {output name: value}. Tensors are
        numpy arrays (strings as unicode arrays), sequences lists, maps dicts, optionals their
        value or None."""
        types = {d["name"]: d["type"] for d in self.inputs}
        made = []
        try:
            for name, value in feeds.items():
                made.append(self._make(value, types.get(name, ""), f"input `{name}`"))
            names = (ctypes.c_char_p * len(feeds))(*[_text(n) for n in feeds])
            values = (_P * len(made))(*made)
            out = _P()
            self._lib.check(self._lib.epx_session_run_values(
                self._ptr, names, values, len(made), ctypes.byref(out)))
        finally:
            for v in made:
                self._lib.epx_value_free(v)
        try:
            result = {}
            for i in range(self._lib.epx_outputs_count(out)):
                name, value = ctypes.c_char_p(), _P()
                self._lib.check(self._lib.epx_outputs_value(out, i, ctypes.byref(name), ctypes.byref(value)))
                result[name.value.decode()] = self._read(value.value)
            return result
        finally:
            self._lib.epx_outputs_free(out)

    def _made(self, fn, *args):
        out = _P()
        self._lib.check(fn(*args, ctypes.byref(out)))
        return out.value

    def _make(self, value, ty, what):
        """A libepx value (owned by the caller) from a Python value of declared type `ty`."""
        lib = self._lib
        if ty.startswith("optional("):
            if value is None:
                return self._made(lib.epx_value_new_optional, None)
            inner = self._make(value, ty[len("optional("):-1], what)
            return self._made(lib.epx_value_new_optional, inner)
        if isinstance(value, dict) or ty.startswith("map("):
            key_ty, _, val_ty = ty[len("map("):-1].partition(",")
            keys = list(value.keys())
            if key_ty == "string" or (not key_ty and keys and isinstance(keys[0], str)):
                k = np.array([str(x) for x in keys], dtype=str)
            else:
                k = np.array(keys, dtype=np.int64)
            vdtype = {"tensor(double)": np.float64, "tensor(int64)": np.int64,
                      "tensor(string)": str}.get(val_ty, np.float32)
            v = np.array(list(value.values()), dtype=vdtype)
            kv = self._make(k, "", what)
            return self._made(lib.epx_value_new_map, kv, self._make(v, "", what))
        if isinstance(value, (list, tuple)) and ty.startswith("seq("):
            inner = ty[len("seq("):-1]
            items = [self._make(v, inner, f"{what}[{k}]") for k, v in enumerate(value)]
            elem = _ONNX_NAMES.get(inner[len("tensor("):-1], 0) if inner.startswith("tensor(") else 0
            arr = (_P * len(items))(*items)
            return self._made(lib.epx_value_new_sequence, elem, arr, len(items))
        arr = np.ascontiguousarray(value)
        shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        if arr.dtype.kind == "O" and not all(isinstance(x, str) for x in arr.reshape(-1)):
            raise EpxError(8, f"{what}: numpy dtype object has no epx element type "
                              "(object arrays are read only when every element is a str)")
        if arr.dtype.kind in "USO":
            texts = [_text(x.decode() if isinstance(x, bytes) else x) for x in arr.reshape(-1)]
            strs = (ctypes.c_char_p * len(texts))(*texts)
            return self._made(lib.epx_value_new_strings, strs, shape, arr.ndim)
        code = _CODES.get(arr.dtype)
        if code is None:
            raise EpxError(8, f"{what}: numpy dtype {arr.dtype} has no epx element type")
        ref = _TensorRef()
        ref.name, ref.elem_type = None, code
        ref.shape, ref.ndim = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), arr.ndim
        ref.data, ref.byte_len = arr.ctypes.data, arr.nbytes
        return self._made(lib.epx_value_new_tensor, ctypes.byref(ref))

    def _read(self, v):
        """A Python value from a libepx value borrowed from the outputs."""
        lib = self._lib
        kind = lib.epx_value_kind(v)
        if kind == _SEQUENCE:
            items = []
            for k in range(lib.epx_value_sequence_len(v)):
                item = _P()
                lib.check(lib.epx_value_sequence_at(v, k, ctypes.byref(item)))
                items.append(self._read(item.value))
            return items
        if kind == _MAP:
            k, val = _P(), _P()
            lib.check(lib.epx_value_map(v, ctypes.byref(k), ctypes.byref(val)))
            return {(x.item() if hasattr(x, "item") else x): (y.item() if hasattr(y, "item") else y)
                    for x, y in zip(self._read(k.value), self._read(val.value))}
        if kind == _OPTIONAL:
            inner = _P()
            lib.check(lib.epx_value_optional(v, ctypes.byref(inner)))
            return None if not inner.value else self._read(inner.value)
        t = _TensorRef()
        lib.check(lib.epx_value_tensor(v, ctypes.byref(t)))
        shape = tuple(t.shape[k] for k in range(t.ndim))
        if t.elem_type == _ONNX_NAMES["string"]:
            count, data, n = ctypes.c_size_t(), ctypes.c_void_p(), ctypes.c_size_t()
            lib.check(lib.epx_value_string(v, 0, None, None, ctypes.byref(count)))
            texts = []
            for k in range(count.value):
                lib.check(lib.epx_value_string(v, k, ctypes.byref(data), ctypes.byref(n), None))
                texts.append(ctypes.string_at(data, n.value).decode() if n.value else "")
            return np.array(texts, dtype=str).reshape(shape)
        dtype = _DTYPES.get(t.elem_type)
        if dtype is None:
            raise EpxError(9, f"element type {t.elem_type} has no numpy dtype")
        raw = ctypes.string_at(t.data, t.byte_len) if t.byte_len else b""
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def placement(self):
        """The placement report (nodes, groups, copies, fallbacks, skipped_providers) as a dict."""
        text = _P()
        self._lib.check(self._lib.epx_session_placement_json(self._ptr, ctypes.byref(text)))
        return json.loads(self._lib.take_string(text))

    def close(self):
        if getattr(self, "_ptr", None):
            self._lib.epx_session_free(self._ptr)
            self._ptr = None

    __del__ = close
