"""epx: run ONNX models on execution providers shipped as plugins.

    import numpy as np
    import epx

    session = epx.Session("model.onnx", providers=["cuda", ("openvino", {"device": "GPU"})])
    outputs = session.run({"image": np.zeros((1, 3, 224, 224), np.float32)})
    print(session.placement()["nodes"])      # which EP runs which node
    print(epx.providers())                   # every EP found, and why one is unavailable

EPs are tried in the order given; the CPU EP runs whatever they do not claim. Values beyond
numeric tensors: string tensors are numpy unicode arrays, sequences lists, maps dicts, an
optional its value or None, in both directions. Inputs may be numpy arrays or any object with
`__dlpack__` in host memory (PyTorch CPU tensors, ...); outputs are numpy arrays over the
memory libepx returned (no copy), so `torch.from_dlpack(out)` and `np.asarray(out)` share it.

Failures raise `epx.EpxError` with libepx's code and message. For a program written for ONNX
Runtime, `import epx.onnxruntime as onnxruntime` gives ONNX Runtime's Python API on epx.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _capi, _fast, _plugins
from ._capi import ERROR_NAMES, EpxError, Library

__version__ = "0.1.0"
__all__ = [
    "devices", "EpxError", "ERROR_NAMES", "Library", "Environment", "Session", "RunOptions",
    "ValueInfo", "ProviderInfo",
    "DoctorReport", "providers", "doctor", "version", "plugin_abi_version", "plugin_dirs",
    "max_tensor_bytes", "set_max_tensor_bytes",
]

ProviderSpec = Union[str, Tuple[str, Mapping[str, Any]]]
"""An EP to try: its name (`"cuda"`, `"ort_cpu"`, `"plugin/ep"`) or `(name, {option: value})`."""


def version() -> str:
    """libepx's version."""
    return Library.default().version()


def plugin_abi_version() -> str:
    """The plugin ABI version libepx speaks, as "major.minor"."""
    return Library.default().epx_plugin_abi_version().decode()


def max_tensor_bytes() -> int:
    """The largest tensor (bytes) epx allocates: a model or input asking for more gets an
    EpxError naming the shape and the size. Default: EPX_MAX_TENSOR_BYTES, else the machine's
    memory."""
    return int(Library.default().epx_max_tensor_bytes())


def set_max_tensor_bytes(limit: int) -> int:
    """Sets `max_tensor_bytes()` for the whole process; returns the limit now in force.
    `limit` is a number of bytes from 1 to 2**64 - 1 (0 is taken as 1)."""
    return int(Library.default().epx_set_max_tensor_bytes(_byte_count(limit, "limit")))


def _byte_count(value: Any, what: str) -> int:
    """`value` as a uint64 byte count, refused (not wrapped) when it is out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int number of bytes, not {type(value).__name__}")
    n = int(value)
    if not 0 <= n < 2 ** 64:
        raise ValueError(f"{what} must be between 0 and 2**64 - 1 bytes, got {n}")
    return n


def plugin_dirs() -> List[str]:
    """The plugin folders Python packages add (see `epx._plugins`): `epx.plugins` entry points,
    then `epx_plugins` folders on sys.path. libepx adds `EPX_PLUGIN_PATH` and its own folder."""
    return _plugins.discovered_dirs()


@dataclass(frozen=True)
class ProviderInfo:
    """An EP libepx found: its plugin, version, library, and why it is unavailable if it is."""

    name: str
    plugin: Optional[str]
    version: Optional[str]
    library: Optional[str]
    available: bool
    reason: Optional[str]


@dataclass(frozen=True)
class DoctorReport:
    """What `epx doctor` says about the plugins: `ok` when every one is usable."""

    ok: bool
    text: str

    def __str__(self) -> str:
        return self.text

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class ValueInfo:
    """A model input or output.

    `type` is ONNX's spelling (`tensor(float)`, `seq(tensor(int64))`, `map(string,tensor(float))`);
    `dtype` the numpy dtype of a tensor (None for strings, bfloat16 and non-tensors); `shape` a
    tuple whose dynamic extents are their symbol (`"batch"`) or None, itself None when the rank
    is unknown.
    """

    name: str
    type: str
    dtype: Optional[np.dtype]
    shape: Optional[Tuple[Union[int, str, None], ...]]


def _decode(s: Optional[bytes]) -> Optional[str]:
    return None if s is None else s.decode("utf-8", "replace")


class _Options:
    """An EpxSessionOptions built from provider specs; freed by `close`."""

    def __init__(self, lib: Library, providers: Sequence[ProviderSpec], strict: bool = False,
                 error_on_failure: bool = True, intra_op_threads: Optional[int] = None,
                 max_tensor_bytes: Optional[int] = None, isolate: bool = False,
                 policy: Union[None, str, Callable[[List[Dict[str, Any]], Dict[str, Any]],
                                                    Sequence[str]]] = None,
                 kernel_cache: bool = True, profile: bool = False,
                 cancel: Optional["RunOptions"] = None):
        self._lib = lib
        self._select = None
        self.policy_error: Optional[BaseException] = None
        self.ptr = lib.epx_session_options_new()
        if not self.ptr:
            raise EpxError(11, "epx_session_options_new failed")
        try:
            for p in providers:
                name, opts = (p, {}) if isinstance(p, str) else p
                opts = dict(opts or {})
                keys = (ctypes.c_char_p * len(opts))(*[_capi.text(k) for k in opts])
                values = (ctypes.c_char_p * len(opts))(*[_option_text(v) for v in opts.values()])
                lib.check(lib.epx_session_options_add_provider(
                    self.ptr, _capi.text(name), keys, values, len(opts), error_on_failure))
            lib.check(lib.epx_session_options_set_strict(self.ptr, strict))
            if intra_op_threads:
                lib.check(lib.epx_session_options_set_intra_op_threads(self.ptr, intra_op_threads))
            if max_tensor_bytes is not None:
                lib.check(lib.epx_session_options_set_max_tensor_bytes(
                    self.ptr, _byte_count(max_tensor_bytes, "max_tensor_bytes")))
            if isolate:
                lib.check(lib.epx_session_options_set_isolated(self.ptr, True))
            if not kernel_cache:
                lib.check(lib.epx_session_options_set_kernel_cache(self.ptr, False))
            if profile:
                lib.check(lib.epx_session_options_set_profiling(self.ptr, True))
            if cancel is not None:
                lib.check(lib.epx_session_options_set_cancellation(self.ptr, cancel._ptr))
            if isinstance(policy, str):
                lib.check(lib.epx_session_options_set_selection_policy(self.ptr,
                                                                       _capi.text(policy)))
            elif policy is not None:
                self._select = _capi.SELECTION_FN(self._trampoline(policy))
                lib.check(lib.epx_session_options_set_selection_function(
                    self.ptr, ctypes.cast(self._select, ctypes.c_void_p), None))
        except BaseException:
            self.close()
            raise

    def _trampoline(self, policy):
        """The C callback around a Python policy: its exception is kept and re-raised."""
        def select(devices_json, model_json, buf, capacity, _user):
            try:
                eps = policy(json.loads(devices_json), json.loads(model_json))
                data = ",".join(str(e) for e in eps).encode("utf-8")
                if len(data) < capacity:
                    ctypes.memmove(buf, data, len(data))
                    ctypes.memset(buf + len(data), 0, 1)
                return len(data)
            except BaseException as e:  # noqa: BLE001 - re-raised by Session
                self.policy_error = e
                return ctypes.c_size_t(-1).value
        return select

    def close(self) -> None:
        if self.ptr:
            self._lib.epx_session_options_free(self.ptr)
            self.ptr = None


def _option_text(v: Any) -> bytes:
    if isinstance(v, bool):  # ONNX Runtime's Python API spells booleans as "1"/"0" too
        return b"1" if v else b"0"
    return _capi.text(v)


class Environment:
    """Plugin folders and default EPs, shared by the sessions made from it.

    Plugins are searched in `plugin_dirs`, then in the folders Python packages add (unless
    `discover=False`; see `plugin_dirs()`), then `EPX_PLUGIN_PATH`, then the plugins this package
    ships. `default_providers` are tried by every session after its own. The `onnxruntime` and
    `openvino` wheels of this Python environment are added to `EPX_ORT_SEARCH_PATH` and
    `EPX_OPENVINO_SEARCH_PATH`, where the ONNX Runtime and OpenVINO plugins look for them.
    """

    _default: Optional["Environment"] = None
    _default_lock = threading.Lock()

    def __init__(self, plugin_dirs: Sequence[Union[str, os.PathLike]] = (),
                 default_providers: Sequence[ProviderSpec] = (), *,
                 discover: bool = True, library: Optional[Library] = None):
        self._lib = library or Library.default()
        _plugins.export_runtime_paths()
        dirs = [_capi.text(d) for d in plugin_dirs]
        if discover:
            dirs += [_capi.text(d) for d in _plugins.discovered_dirs()]
        self.plugin_dirs = [os.fsdecode(d) for d in dirs]
        arr = (ctypes.c_char_p * len(dirs))(*dirs)
        opts = _Options(self._lib, default_providers)
        try:
            self._ptr = self._lib.out(self._lib.epx_env_new, arr, len(dirs), opts.ptr)
        finally:
            opts.close()

    @classmethod
    def default(cls) -> "Environment":
        """The process-wide environment `Session` uses when given none."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def providers(self) -> List[ProviderInfo]:
        """Every EP found (loading each plugin), the CPU EP last."""
        result = []
        for i in range(self._lib.epx_env_provider_count(self._ptr)):
            d = _capi.ProviderDesc()
            self._lib.check(self._lib.epx_env_provider(self._ptr, i, ctypes.byref(d)))
            result.append(ProviderInfo(_decode(d.name), _decode(d.plugin), _decode(d.version),
                                       _decode(d.library), bool(d.available), _decode(d.reason)))
        return result

    def devices(self) -> List[Dict[str, Any]]:
        """Every device the EPs can run on (plugins listing devices, ABI 1.5), as plain data:
        `selector` (`cuda:1`, `openvino:GPU.0`), `provider`, `plugin` and `device` (kind, id,
        id_name, vendor, name, memory_bytes, driver_version, and `unusable`: why the EP cannot
        use a present device, or None)."""
        return json.loads(self._lib.json_of(self._lib.epx_env_devices_json, self._ptr))

    def doctor(self) -> DoctorReport:
        """Checks every plugin as `epx doctor` does."""
        ok, report = ctypes.c_bool(), _capi.P()
        self._lib.check(self._lib.epx_env_doctor(self._ptr, ctypes.byref(ok), ctypes.byref(report)))
        return DoctorReport(bool(ok.value), self._lib.take_string(report))

    def close(self) -> None:
        """Frees the environment; sessions made from it stay usable."""
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr:
            self._lib.epx_env_free(ptr)

    def __del__(self) -> None:
        self.close()


def providers(env: Optional[Environment] = None) -> List[ProviderInfo]:
    """Every EP found in `env` (default: `Environment.default()`)."""
    return (env or Environment.default()).providers()


def devices(env: Optional[Environment] = None) -> List[Dict[str, Any]]:
    """Every device the EPs of `env` (default: `Environment.default()`) can run on."""
    return (env or Environment.default()).devices()


def doctor(env: Optional[Environment] = None) -> DoctorReport:
    """The plugin check `epx doctor` prints, for `env` (default: `Environment.default()`)."""
    return (env or Environment.default()).doctor()


class _Outputs:
    """Owns an EpxOutputs; the numpy arrays that view its memory keep it alive."""

    def __init__(self, lib: Library, ptr: int):
        self._lib, self.ptr = lib, ptr

    def __del__(self) -> None:
        if self.ptr:
            self._lib.epx_outputs_free(self.ptr)
            self.ptr = None


def _contiguous(arr: np.ndarray, what: str) -> np.ndarray:
    """`arr` C-contiguous. A strided view (a broadcast, a transpose) is copied, so its size is
    held to the tensor limit before the copy is made, not after."""
    if arr.flags.c_contiguous:
        return arr
    count = 1
    for d in arr.shape:
        count *= int(d)
    nbytes = count * arr.dtype.itemsize
    limit = max_tensor_bytes()
    if nbytes > limit:
        raise EpxError(8, f"{what}: shape {list(arr.shape)} of {arr.dtype} needs {nbytes} bytes, "
                          f"more than the {limit} epx allocates for one tensor "
                          "(epx.set_max_tensor_bytes; EPX_MAX_TENSOR_BYTES)")
    return np.ascontiguousarray(arr)


def _pin(arr: np.ndarray) -> Optional["weakref.ref"]:
    """Holds `arr`'s memory in place until the returned reference is dropped: numpy refuses to
    resize (realloc) an array that has a weak reference, even with refcheck=False, while a
    buffer export or a view does not stop it. None where nothing can resize the memory."""
    owner = arr
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    return weakref.ref(owner) if owner.flags.owndata else None


def _host_array(value: Any, what: str) -> np.ndarray:
    """A C-contiguous numpy array for a tensor input: numpy arrays as they are (copied only when
    not contiguous), objects with `__dlpack__` through `np.from_dlpack` (no copy for host memory),
    anything else through `np.asarray`."""
    if isinstance(value, np.ndarray):
        return _contiguous(value, what)
    if hasattr(value, "__dlpack__") and not isinstance(value, (list, tuple, str, bytes)):
        try:
            arr = np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            device = getattr(value, "device", None)
            raise EpxError(8, f"{what}: cannot read this {type(value).__name__} through DLPack "
                              f"in host memory (device {device}): {e}; move it to the CPU "
                              "first (e.g. `.cpu()`)") from None
        return _contiguous(arr, what)
    return _contiguous(np.asarray(value), what)


_CLOSE_LOCK = threading.Lock()


class RunOptions:
    """A terminate flag for runs (and session creations) to watch: `terminate()` from any
    thread stops the runs made with these options at their next check (between kernels; the
    CPU EP checks between nodes and at each Loop iteration) and they raise `EpxError` with code
    12 ("cancelled"); while set, runs made with them fail at once. `clear()` lets them run
    again."""

    def __init__(self, library: Optional[Library] = None):
        self._lib = library or Library.default()
        self._ptr = self._lib.epx_run_options_new()
        if not self._ptr:
            raise EpxError(11, "epx_run_options_new failed")
        self._closed = False
        self._set = False

    def terminate(self) -> None:
        self._lib.check(self._lib.epx_run_options_set_terminate(self._ptr, True))
        self._set = True

    def clear(self) -> None:
        self._lib.check(self._lib.epx_run_options_set_terminate(self._ptr, False))
        self._set = False

    @property
    def terminated(self) -> bool:
        return self._set

    def close(self) -> None:
        """Frees the options. The handle is kept: libepx's handles are generational, so a later
        run, terminate() or clear() with it fails with libepx's own InvalidArgument error ("the
        run option set is closed: epx_run_options_free was called on it") on every path."""
        with _CLOSE_LOCK:
            ptr = None if getattr(self, "_closed", True) else self._ptr
            self._closed = True
        if ptr:
            self._lib.epx_run_options_free(ptr)

    def __del__(self) -> None:
        self.close()


class Session:
    """A model partitioned across `providers` and compiled, ready to run (from several threads).

    `model` is a path or the model's bytes. `providers` are tried in order, each a name or
    `(name, {option: value})`; the CPU EP runs what is left. With `strict`, making the session
    fails when a node would fall back to the CPU EP; with `error_on_failure` (the default) an EP
    that cannot be set up is an error, otherwise it is skipped and `placement()` says why.
    `intra_op_threads` sets the CPU EP's thread count (default: one per core);
    `max_tensor_bytes` this session's tensor limit (default: `epx.max_tensor_bytes()`).
    With `isolate`, every EP in `providers` runs in a child process: a crash or hang of its
    plugin raises `EpxError` from that `run` (the next run starts a new process) instead of
    ending Python. `policy` chooses the EPs instead of `providers`: a name (`prefer-gpu`,
    `prefer-npu`, `prefer-cpu`, `max-performance`, `min-power`) or a function given the devices
    (as `epx.devices()`) and the model (`graph_name`, `producer_name`, `op_types`, `inputs`,
    `outputs`) that returns `"ep"` or `"ep:device"` strings in order. `kernel_cache=False`
    compiles every kernel afresh instead of rebuilding kernels of EPs that store them (ABI 1.6,
    e.g. OpenVINO) from the cache folder (`EPX_CACHE_DIR`, else `$XDG_CACHE_HOME/epx`, else
    `~/.cache/epx`); the placement's
    `kernel_cache` says what happened per kernel. With `profile`, runs are timed per kernel,
    copy and node (where the EP records its kernels' parts): read it with `profile()`.
    `cancel` (a `RunOptions`) lets another thread cancel the creation: once it is terminated,
    creation stops at its next step and raises `EpxError` with code 12 ("cancelled").
    """

    def __init__(self, model: Union[str, os.PathLike, bytes, bytearray, memoryview],
                 providers: Sequence[ProviderSpec] = (), *, env: Optional[Environment] = None,
                 strict: bool = False, error_on_failure: bool = True,
                 intra_op_threads: Optional[int] = None, max_tensor_bytes: Optional[int] = None,
                 isolate: bool = False,
                 policy: Union[None, str, Callable[[List[Dict[str, Any]], Dict[str, Any]],
                                                    Sequence[str]]] = None,
                 kernel_cache: bool = True, profile: bool = False,
                 cancel: Optional[RunOptions] = None):
        env = env or Environment.default()
        self._env = env  # keeps the environment (and libepx) alive
        self._lib = lib = env._lib
        opts = _Options(lib, providers, strict, error_on_failure, intra_op_threads,
                        max_tensor_bytes, isolate, policy, kernel_cache, profile, cancel)
        try:
            if isinstance(model, (bytes, bytearray, memoryview)):
                data = bytes(model)
                self._ptr = lib.out(lib.epx_session_new_from_bytes, env._ptr, data, len(data),
                                    opts.ptr)
            else:
                self._ptr = lib.out(lib.epx_session_new, env._ptr, _capi.text(model), opts.ptr)
        except EpxError:
            if opts.policy_error is not None:
                raise opts.policy_error
            raise
        finally:
            opts.close()
        self.inputs: List[ValueInfo] = [
            self._info(lib.epx_session_input, lib.epx_session_input_type, i)
            for i in range(lib.epx_session_input_count(self._ptr))]
        self.outputs: List[ValueInfo] = [
            self._info(lib.epx_session_output, lib.epx_session_output_type, i)
            for i in range(lib.epx_session_output_count(self._ptr))]
        self._types = {v.name: v.type for v in self.inputs}
        self._names = {v.name: v.name.encode() for v in self.inputs}
        self._metadata: Optional[Dict[str, Any]] = None
        # Symbolic extents by name, where the model gives them.
        meta = self.metadata()
        dims = {d["name"]: d["dims"] for d in meta["inputs"] + meta["outputs"]}
        self.inputs = [self._named_extents(v, dims.get(v.name)) for v in self.inputs]
        self.outputs = [self._named_extents(v, dims.get(v.name)) for v in self.outputs]
        self._output_names = [v.name for v in self.outputs]
        # The native per-call path (epx._native), where it applies.
        self._fast = _fast.runner(lib, self._ptr, _fast.names(self.inputs),
                                  _fast.names(self.outputs), self.placement())

    @staticmethod
    def _named_extents(v: ValueInfo, dims: Optional[List[Any]]) -> ValueInfo:
        if v.shape is None or dims is None or len(dims) != len(v.shape):
            return v
        shape = tuple(d if d is not None else s for s, d in zip(v.shape, dims))
        return replace(v, shape=shape)

    def _info(self, desc_fn, type_fn, i: int) -> ValueInfo:
        lib = self._lib
        d = _capi.ValueDesc()
        lib.check(desc_fn(self._ptr, i, ctypes.byref(d)))
        ty = lib.take_string(lib.out(type_fn, self._ptr, i))
        dtype = _capi.DTYPES.get(d.elem_type)
        shape = None
        if d.ndim >= 0:
            shape = tuple(d.shape[k] if d.shape[k] >= 0 else None for k in range(d.ndim))
        return ValueInfo(d.name.decode(), ty, np.dtype(dtype) if dtype else None, shape)

    def _handle(self) -> int:
        """The session's libepx handle; EpxError once `close()` was called. A run that read the
        handle before a `close()` on another thread finishes (libepx keeps the session until it
        does) or fails with the same error: never a use of freed memory."""
        ptr = getattr(self, "_ptr", None)
        if not ptr:
            raise EpxError(1, "the session is closed: close() was called on it")
        return ptr

    def metadata(self) -> Dict[str, Any]:
        """The model's metadata: producer_name, producer_version, domain, model_version,
        description, graph_name, graph_description, custom (metadata_props), dims (symbolic
        extents of each input and output), overridable_initializers."""
        if self._metadata is None:
            self._metadata = json.loads(
                self._lib.json_of(self._lib.epx_session_metadata_json, self._handle()))
        return self._metadata

    def placement(self) -> Dict[str, Any]:
        """Which EP runs which node, the fused groups, the copies between memory spaces, the
        nodes that fell back to the CPU EP and the EPs skipped, with reasons: plain data."""
        return json.loads(self._lib.json_of(self._lib.epx_session_placement_json,
                                            self._handle()))

    def profile(self, restart: bool = False) -> Dict[str, Any]:
        """Where the runs so far spent their time (a session made with `profile=True`): `runs`,
        `run_ns`, per kernel its `provider`, `calls`, `ns`, its `parts` (per node or fused node:
        `name`, `op`, `calls`, `ns`) and the EP's compile `passes` (`name`, `changed`, `note`),
        and the `copies`. With `restart`, the profile then starts again from zero."""
        lib = self._lib
        return json.loads(lib.take_string(
            lib.out(lib.epx_session_profile_json, self._handle(), restart)))

    def run(self, feeds: Mapping[str, Any],
            output_names: Optional[Sequence[str]] = None,
            run_options: Optional[RunOptions] = None) -> Dict[str, Any]:
        """Runs on `feeds` ({input name: value}) and returns {output name: value} for every
        output, or for `output_names` in that order. `run_options` lets another thread cancel
        the run (`RunOptions.terminate()`): it raises EpxError with code 12 ("cancelled")."""
        fast = self._fast
        if fast is not None and type(feeds) is dict and getattr(self, "_ptr", None) \
                and (output_names is None or len(output_names)):
            done = fast.run(feeds, output_names,
                            run_options._ptr if run_options is not None else 0)
            if done is not None:
                if type(done) is tuple:  # libepx's (code, message)
                    raise EpxError(*done)
                return dict(zip(output_names or self._output_names, done))
        lib = self._lib
        ro = run_options._ptr if run_options is not None else None
        out = self._run_tensors(feeds, ro)
        if out is None:
            made = []
            try:
                for name, value in feeds.items():
                    made.append(self._make(value, self._types.get(name, ""), f"input `{name}`"))
                names = (ctypes.c_char_p * len(made))(*[_capi.text(n) for n in feeds])
                values = (_capi.P * len(made))(*made)
                out = lib.out(lib.epx_session_run_values_with_options, self._handle(), names,
                              values, len(made), ro)
            finally:
                for v in made:
                    lib.epx_value_free(v)
        owner = _Outputs(lib, out)
        result = {}
        for i in range(lib.epx_outputs_count(out)):
            name, value = ctypes.c_char_p(), _capi.P()
            lib.check(lib.epx_outputs_value(out, i, ctypes.byref(name), ctypes.byref(value)))
            result[name.value.decode()] = self._read(value.value, owner)
        if output_names is None:
            return result
        missing = [n for n in output_names if n not in result]
        if missing:
            raise EpxError(1, f"the model has no output {', '.join(map(repr, missing))}; "
                              f"its outputs are {', '.join(map(repr, result))}")
        return {n: result[n] for n in output_names}

    def _run_tensors(self, feeds: Mapping[str, Any], run_options: Optional[int] = None
                     ) -> Optional[int]:
        """Runs through `epx_session_run` (each input copied once, straight from its buffer) when
        every input is a numeric tensor; None when one is not (strings, sequences, maps,
        optionals go through libepx values)."""
        refs = []
        keep = []  # the arrays and shapes the refs point into, alive until the call returns
        for name, value in feeds.items():
            ty = self._types.get(name)
            if ty is None or not ty.startswith("tensor(") or isinstance(value, (dict, list, tuple, str)):
                return None
            arr = _host_array(value, f"input `{name}`")
            code = _capi.CODES.get(arr.dtype)
            if code is None:
                return None  # strings, objects, unknown dtypes: the value path says what is wrong
            pin = _pin(arr)  # before the shape and pointer are read
            shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
            keep.append((arr, shape, pin))
            refs.append(_capi.TensorRef(self._names[name], code, shape, arr.ndim,
                                        arr.ctypes.data, arr.nbytes))
        array = (_capi.TensorRef * len(refs))(*refs)
        return self._lib.out(self._lib.epx_session_run_with_options, self._handle(), array,
                             len(refs), run_options)

    def _make(self, value: Any, ty: str, what: str) -> int:
        """A libepx value (owned by the caller) from a Python value of declared type `ty`."""
        lib = self._lib
        if ty.startswith("optional("):
            inner = None if value is None else self._make(value, ty[len("optional("):-1], what)
            return lib.out(lib.epx_value_new_optional, inner)
        if isinstance(value, dict) or ty.startswith("map("):
            return self._make_map(value, ty, what)
        if isinstance(value, (list, tuple)) and ty.startswith("seq("):
            inner = ty[len("seq("):-1]
            items = []
            try:
                for k, v in enumerate(value):
                    items.append(self._make(v, inner, f"{what}[{k}]"))
            except BaseException:
                for v in items:
                    lib.epx_value_free(v)
                raise
            elem = _capi.ONNX_NAMES.get(inner[len("tensor("):-1], 0) if inner.startswith("tensor(") else 0
            arr = (_capi.P * len(items))(*items)
            return lib.out(lib.epx_value_new_sequence, elem, arr, len(items))
        arr = _host_array(value, what)
        shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        if arr.dtype.kind in "USO":
            flat = arr.reshape(-1)
            if arr.dtype.kind == "O" and not all(isinstance(x, (str, bytes)) for x in flat):
                raise EpxError(8, f"{what}: numpy dtype object has no epx element type "
                                  "(object arrays are read only when every element is a str)")
            texts = [x if isinstance(x, bytes) else str(x).encode() for x in flat]
            strs = (ctypes.c_char_p * len(texts))(*texts)
            return lib.out(lib.epx_value_new_strings, strs, shape, arr.ndim)
        code = _capi.CODES.get(arr.dtype)
        if code is None:
            raise EpxError(8, f"{what}: numpy dtype {arr.dtype} has no epx element type")
        pin = _pin(arr)
        shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        ref = _capi.TensorRef()
        ref.name, ref.elem_type = None, code
        ref.shape, ref.ndim = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), arr.ndim
        ref.data, ref.byte_len = arr.ctypes.data, arr.nbytes
        try:
            return lib.out(lib.epx_value_new_tensor, ctypes.byref(ref))
        finally:
            del pin

    def _make_map(self, value: Mapping, ty: str, what: str) -> int:
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
        try:
            vv = self._make(v, "", what)
        except BaseException:
            self._lib.epx_value_free(kv)
            raise
        return self._lib.out(self._lib.epx_value_new_map, kv, vv)

    def _read(self, v: int, owner: _Outputs) -> Any:
        """A Python value from a libepx value borrowed from the outputs `owner` holds."""
        lib = self._lib
        kind = lib.epx_value_kind(v)
        if kind == _capi.SEQUENCE:
            items = []
            for k in range(lib.epx_value_sequence_len(v)):
                items.append(self._read(lib.out(lib.epx_value_sequence_at, v, k), owner))
            return items
        if kind == _capi.MAP:
            k, val = _capi.P(), _capi.P()
            lib.check(lib.epx_value_map(v, ctypes.byref(k), ctypes.byref(val)))
            keys, vals = self._read(k.value, owner), self._read(val.value, owner)
            return {x.item(): y.item() if hasattr(y, "item") else y for x, y in zip(keys, vals)}
        if kind == _capi.OPTIONAL:
            inner = lib.out(lib.epx_value_optional, v)
            return None if not inner else self._read(inner, owner)
        t = _capi.TensorRef()
        lib.check(lib.epx_value_tensor(v, ctypes.byref(t)))
        shape = tuple(t.shape[k] for k in range(t.ndim))
        if t.elem_type == _capi.STRING:
            return self._strings(v, shape)
        dtype = _capi.DTYPES.get(t.elem_type)
        if dtype is None:
            raise EpxError(9, f"output element type {t.elem_type} has no numpy dtype")
        if not t.byte_len:
            return np.zeros(shape, dtype)
        # A view of libepx's buffer, writable (the outputs belong to this call alone), that keeps
        # the outputs alive as long as any array over them lives.
        buf = (ctypes.c_uint8 * t.byte_len).from_address(t.data)
        buf._epx_outputs = owner
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    def _strings(self, v: int, shape: Tuple[int, ...]) -> np.ndarray:
        lib = self._lib
        count, data, n = ctypes.c_size_t(), ctypes.c_void_p(), ctypes.c_size_t()
        lib.check(lib.epx_value_string(v, 0, None, None, ctypes.byref(count)))
        texts = []
        for k in range(count.value):
            lib.check(lib.epx_value_string(v, k, ctypes.byref(data), ctypes.byref(n), None))
            texts.append(ctypes.string_at(data, n.value).decode("utf-8", "replace") if n.value else "")
        return np.array(texts, dtype=str).reshape(shape)

    def close(self) -> None:
        """Releases the session now rather than when it is collected. Runs in progress on other
        threads finish; later calls raise EpxError ("the session is closed")."""
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr:
            self._lib.epx_session_free(ptr)

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{v.name}: {v.type}" for v in self.inputs)
        outs = ", ".join(f"{v.name}: {v.type}" for v in self.outputs)
        return f"<epx.Session ({ins}) -> ({outs})>"
