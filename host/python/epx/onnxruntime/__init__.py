"""ONNX Runtime's Python API on epx.

A program written for ONNX Runtime runs on epx by changing its import:

    import epx.onnxruntime as onnxruntime        # was: import onnxruntime

    session = onnxruntime.InferenceSession("model.onnx", providers=["CUDAExecutionProvider",
                                                                    "CPUExecutionProvider"])
    outputs = session.run(None, {"input": x})

A package that imports `onnxruntime` itself is switched by `epx.onnxruntime.install()` before it
is imported (it makes `import onnxruntime` give this module).

ONNX Runtime's provider names map to epx's EPs: `CPUExecutionProvider` is epx's CPU EP,
`CUDAExecutionProvider` the `cuda` EP, `OpenVINOExecutionProvider` the native `openvino` EP,
`TensorrtExecutionProvider` `tensorrt`, and so on (`PROVIDER_NAMES`); epx's own EP names are
accepted too. As in ONNX Runtime, a known provider that is not available here is skipped with a
warning, an unknown name is an error, and the CPU EP runs whatever the others do not take.

What differs, and says so: IO binding and OrtValue hold host memory only (binding device memory
raises); `register_custom_ops_library` raises (custom ops come as epx plugins);
overridable initializers are constants (feeding one raises); `optimized_model_filepath` and
`enable_profiling` write no file (a warning says so).
"""

from __future__ import annotations

import os
import sys
import warnings
from enum import IntEnum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import epx as _epx
from epx._capi import EpxError

from .capi.onnxruntime_pybind11_state import (
    EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile, NotImplemented,
    RuntimeException, _from_epx,
)

# The ONNX Runtime release whose Python API this module follows (programs compare against it).
__version__ = "1.22.0"

__all__ = [
    "InferenceSession", "SessionOptions", "RunOptions", "IOBinding", "OrtValue", "NodeArg",
    "ModelMetadata", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder",
    "get_available_providers", "get_all_providers", "get_device", "get_version_string",
    "set_default_logger_severity", "set_default_logger_verbosity", "install", "PROVIDER_NAMES",
]

# ONNX Runtime's provider names -> epx EP names.
PROVIDER_NAMES: Dict[str, str] = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "tensorrt",
    "NvTensorRTRTXExecutionProvider": "tensorrt_rtx",
    "OpenVINOExecutionProvider": "openvino",
    "DmlExecutionProvider": "directml",
    "CoreMLExecutionProvider": "coreml",
    "QNNExecutionProvider": "qnn",
    "ROCMExecutionProvider": "rocm",
    "MIGraphXExecutionProvider": "migraphx",
    "DnnlExecutionProvider": "dnnl",
    "XnnpackExecutionProvider": "xnnpack",
    "WebGpuExecutionProvider": "webgpu",
    "NnapiExecutionProvider": "nnapi",
    "ACLExecutionProvider": "acl",
    "ArmNNExecutionProvider": "armnn",
    "CANNExecutionProvider": "cann",
    "VitisAIExecutionProvider": "vitisai",
    "RknpuExecutionProvider": "rknpu",
    "AzureExecutionProvider": "azure",
}
_ORT_NAMES = {v: k for k, v in PROVIDER_NAMES.items()}
# The EPs an ONNX Runtime name may run on, first available first: OpenVINO natively, else
# through ONNX Runtime's own OpenVINO EP.
_CANDIDATES: Dict[str, Tuple[str, ...]] = {k: (v,) for k, v in PROVIDER_NAMES.items()}
_CANDIDATES["OpenVINOExecutionProvider"] = ("openvino", "ort_openvino")
_ORT_NAMES["ort_openvino"] = "OpenVINOExecutionProvider"
# ONNX Runtime's CPU provider options: they tune its memory arena, which epx's CPU EP does not
# have (it keeps buffer pools per session); accepted and without effect.
_CPU_ARENA_OPTIONS = {"arena_extend_strategy", "use_arena", "enable_cpu_mem_arena",
                      "initial_chunk_size_bytes", "max_mem", "max_dead_bytes_per_chunk"}


class GraphOptimizationLevel(IntEnum):
    """Accepted for compatibility: epx always compiles a session fully."""
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


def _type_of(dtype: np.dtype) -> str:
    names = {code: name for name, code in _epx._capi.ONNX_NAMES.items()}
    if dtype.kind in "USO":
        return "tensor(string)"
    code = _epx._capi.CODES.get(np.dtype(dtype))
    return f"tensor({names[code]})" if code else f"tensor({dtype})"


def _env() -> _epx.Environment:
    return _epx.Environment.default()


def _available() -> Dict[str, _epx.ProviderInfo]:
    return {p.name: p for p in _env().providers() if p.available}


def get_available_providers() -> List[str]:
    """The available EPs, spelled as ONNX Runtime spells them where it has a name for them
    (epx's own name otherwise), `CPUExecutionProvider` last."""
    names = []
    for name in _available():
        ort = next((o for o, eps in _CANDIDATES.items() if name in eps), name)
        if ort != "CPUExecutionProvider":
            names.append(ort)
    names.append("CPUExecutionProvider")
    return list(dict.fromkeys(names))


def get_all_providers() -> List[str]:
    """Every provider name this module knows."""
    return list(PROVIDER_NAMES)


def get_device() -> str:
    """"GPU" when a GPU EP (CUDA, TensorRT, ROCm, MIGraphX, DirectML) is available, else "CPU"."""
    gpu = {"cuda", "tensorrt", "tensorrt_rtx", "rocm", "migraphx", "directml"}
    return "GPU" if gpu & set(_available()) else "CPU"


def get_version_string() -> str:
    return __version__


def set_default_logger_severity(severity: int) -> None:
    """Accepted: epx logs through EPX_LOG (warnings by default)."""


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted: epx logs through EPX_LOG."""


def install() -> None:
    """Makes `import onnxruntime` (and its usual submodules) give this module, for packages that
    import ONNX Runtime themselves. Call it before importing them."""
    here = sys.modules[__name__]
    sys.modules["onnxruntime"] = here
    sys.modules["onnxruntime.capi"] = sys.modules[__name__ + ".capi"]
    sys.modules["onnxruntime.capi.onnxruntime_pybind11_state"] = \
        sys.modules[__name__ + ".capi.onnxruntime_pybind11_state"]


class _ConfigEntries:
    """The string key/value entries ONNX Runtime's option objects carry."""

    _kind = "config"

    def __init__(self) -> None:
        self._config: Dict[str, str] = {}

    def _set_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def _entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeException(1, f"{self._kind} config entry `{key}` is not set") from None


class SessionOptions(_ConfigEntries):
    """ONNX Runtime's session options. Thread counts take effect (`intra_op_num_threads`: the
    CPU EP's threads; 0 means one per core); the others are accepted, and those that would write
    a file epx does not write warn when the session is made."""

    _kind = "session"

    def __init__(self) -> None:
        super().__init__()
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.optimized_model_filepath = ""
        self.use_deterministic_compute = False

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._set_entry(key, value)

    def get_session_config_entry(self, key: str) -> str:
        return self._entry(key)

    def register_custom_ops_library(self, library_path: str) -> None:
        raise NotImplemented(7, f"custom op libraries are ONNX Runtime's ({library_path}); in "
                                "epx, custom ops come as an EP plugin (see docs/ABI.md)")

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        raise NotImplemented(7, "free dimension overrides are not supported: epx sizes "
                                f"dimensions from the inputs of each run (`{dim_name}`)")

    def add_initializer(self, name: str, value: Any) -> None:
        raise NotImplemented(7, f"initializers cannot be replaced here (`{name}`): epx compiles "
                                "them into the session")


class RunOptions(_ConfigEntries):
    """ONNX Runtime's run options: accepted; `terminate` set before a run makes it fail."""

    _kind = "run"

    def __init__(self) -> None:
        super().__init__()
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._set_entry(key, value)

    def get_run_config_entry(self, key: str) -> str:
        return self._entry(key)


class NodeArg:
    """An input or output: `name`, `type` (`tensor(float)`), `shape` (ints, symbol strings,
    None for an unknown extent)."""

    def __init__(self, name: str, type: str, shape: List[Union[int, str, None]]):
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    """The model's descriptive fields, as ONNX Runtime's `ModelMetadata`."""

    def __init__(self, meta: Mapping[str, Any]):
        self.producer_name: str = meta.get("producer_name", "")
        self.graph_name: str = meta.get("graph_name", "")
        self.domain: str = meta.get("domain", "")
        self.description: str = meta.get("description", "")
        self.graph_description: str = meta.get("graph_description", "")
        version = meta.get("model_version")
        # ONNX Runtime's value for a model that sets no version: INT64_MAX.
        self.version: int = (1 << 63) - 1 if version is None else version
        self.custom_metadata_map: Dict[str, str] = dict(meta.get("custom", {}))


def _node_args(infos: Sequence[_epx.ValueInfo], dims: Sequence[Mapping[str, Any]]) -> List[NodeArg]:
    by_name = {d["name"]: d.get("dims") for d in dims}
    args = []
    for v in infos:
        shape = by_name.get(v.name)
        args.append(NodeArg(v.name, v.type, list(shape) if shape is not None else []))
    return args


def _normalize(providers: Optional[Sequence[Any]], provider_options: Optional[Sequence[Mapping]]
               ) -> List[Tuple[str, Dict[str, Any]]]:
    """ONNX Runtime's `providers` / `provider_options` as (name, options) pairs."""
    if providers is None:
        return []
    if isinstance(providers, str):
        raise ValueError("'providers' should be a list of provider names or (name, options) "
                         "pairs, not a string")
    if provider_options is not None and len(provider_options) != len(providers):
        raise ValueError("'providers' and 'provider_options' should be the same length if both "
                         "are given.")
    pairs = []
    for i, p in enumerate(providers):
        if isinstance(p, str):
            opts = dict(provider_options[i]) if provider_options is not None else {}
            pairs.append((p, opts))
        elif isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) \
                and isinstance(p[1], Mapping):
            if provider_options is not None:
                raise ValueError("Only one of 'providers' with options and 'provider_options' "
                                 "should be given.")
            pairs.append((p[0], dict(p[1])))
        else:
            raise ValueError("'providers' values must be either strings or (string, dict) tuples.")
    return pairs


class InferenceSession:
    """ONNX Runtime's `InferenceSession`, running on epx.

    `path_or_bytes` is a model path or the model's bytes; `providers` ONNX Runtime's provider
    names (or epx EP names), each optionally `(name, {option: value})`, in priority order.
    """

    def __init__(self, path_or_bytes: Union[str, bytes, os.PathLike],
                 sess_options: Optional[SessionOptions] = None,
                 providers: Optional[Sequence[Any]] = None,
                 provider_options: Optional[Sequence[Mapping]] = None, **kwargs: Any) -> None:
        if not isinstance(path_or_bytes, (str, bytes, bytearray, os.PathLike)):
            raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
        self._model_path = path_or_bytes if not isinstance(path_or_bytes, (bytes, bytearray)) else None
        self._model_bytes = path_or_bytes if isinstance(path_or_bytes, (bytes, bytearray)) else None
        self._sess_options = sess_options or SessionOptions()
        self._read_config_entries = kwargs.pop("read_config_from_model", None)
        if kwargs:
            raise TypeError(f"InferenceSession got unexpected arguments: {', '.join(kwargs)}")
        self._create(providers, provider_options)

    def _create(self, providers, provider_options) -> None:
        opts = self._sess_options
        if opts.optimized_model_filepath:
            warnings.warn(f"epx writes no optimized model: `{opts.optimized_model_filepath}` is "
                          "not created", RuntimeWarning, stacklevel=3)
        if opts.enable_profiling:
            warnings.warn("epx writes no ONNX Runtime profile; use EPX_CPU_PROFILE=1 for the CPU "
                          "EP's per-node times", RuntimeWarning, stacklevel=3)
        requested = _normalize(providers, provider_options)
        available = _available()
        eps: List[Tuple[str, Dict[str, Any]]] = []
        chosen: List[Tuple[str, str, Dict[str, str]]] = []  # (ort name, epx name, options)
        for name, options in requested:
            candidates = _CANDIDATES.get(name, (name,))
            ep = next((c for c in candidates if c in available), candidates[0])
            if ep not in available:
                if name not in PROVIDER_NAMES and ep not in {p.name for p in _env().providers()}:
                    raise ValueError(f"Unknown Provider Type: {name}; known: "
                                     f"{', '.join(get_available_providers())} (and the names in "
                                     "epx.onnxruntime.PROVIDER_NAMES)")
                warnings.warn(f"Specified provider '{name}' is not in available provider names."
                              f"Available providers: '{', '.join(get_available_providers())}'",
                              UserWarning, stacklevel=3)
                continue
            given = {str(k): str(v) for k, v in options.items()}
            if ep == "cpu":
                unknown = set(given) - _CPU_ARENA_OPTIONS
                if unknown:
                    raise ValueError(f"CPUExecutionProvider: unknown options "
                                     f"{', '.join(sorted(unknown))}; epx's CPU EP takes none "
                                     f"(accepted without effect: {', '.join(sorted(_CPU_ARENA_OPTIONS))})")
                options = {}
            eps.append((ep, options))
            chosen.append((_ORT_NAMES.get(ep, name), ep, given))
        try:
            threads = int(opts.intra_op_num_threads or 0)
            model = self._model_bytes if self._model_bytes is not None else self._model_path
            self._session = _epx.Session(model, eps, intra_op_threads=threads or None)
        except EpxError as e:
            raise _from_epx(e) from None
        skipped = {s["name"] for s in self._session.placement().get("skipped_providers", [])}
        # As ONNX Runtime lists them: in the order given, the CPU EP last unless given earlier.
        self._providers = [c for c in chosen if c[1] not in skipped]
        if not any(c[1] == "cpu" for c in self._providers):
            self._providers.append(("CPUExecutionProvider", "cpu", {}))
        meta = self._session.metadata()
        self._meta = meta
        self._inputs = _node_args(self._session.inputs, meta.get("inputs", []))
        self._outputs = _node_args(self._session.outputs, meta.get("outputs", []))
        self._overridable = [NodeArg(o["name"], o.get("type") or "", list(o.get("dims") or []))
                             for o in meta.get("overridable_initializers", [])]
        self._required = [i.name for i in self._inputs if not i.type.startswith("optional")]
        self._output_names = [o.name for o in self._outputs]

    # Introspection

    def get_inputs(self) -> List[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> List[NodeArg]:
        """Graph inputs with an initializer. epx compiles them into the session: feeding one
        raises InvalidArgument."""
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        return ModelMetadata(self._meta)

    def get_providers(self) -> List[str]:
        return [ort for ort, _, _ in self._providers]

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        return {ort: dict(opts) for ort, _, opts in self._providers}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def get_profiling_start_time_ns(self) -> int:
        return 0

    def end_profiling(self) -> str:
        """No ONNX Runtime profile is written; returns "" (see SessionOptions.enable_profiling)."""
        return ""

    def set_providers(self, providers: Optional[Sequence[Any]] = None,
                      provider_options: Optional[Sequence[Mapping]] = None) -> None:
        """Makes the session again with other providers."""
        self._create(providers, provider_options)

    def disable_fallback(self) -> None:
        """Accepted: epx never retries a failed session on other providers."""

    def enable_fallback(self) -> None:
        """Accepted: epx never retries a failed session on other providers."""

    @property
    def epx_session(self) -> _epx.Session:
        """The epx session underneath (for `placement()` and the rest of epx's API)."""
        return self._session

    # Running

    def _check_feed(self, input_feed: Mapping[str, Any]) -> None:
        if len(input_feed) == len(self._required) and all(n in input_feed for n in self._required):
            return  # the usual case: exactly the required inputs
        overridden = [n for n in input_feed if n in {o.name for o in self._overridable}]
        if overridden:
            raise InvalidArgument(8, f"{', '.join(overridden)}: an initializer of the model; "
                                     "epx compiles initializers into the session and does not "
                                     "take them as inputs")
        missing = [i.name for i in self._inputs
                   if i.name not in input_feed and not i.type.startswith("optional")]
        if missing:
            raise ValueError(f"Required inputs ({missing}) are missing from input feed "
                             f"({list(input_feed)}).")

    def _feed(self, input_feed: Mapping[str, Any]) -> Dict[str, Any]:
        feeds = {}
        for name, value in input_feed.items():
            if isinstance(value, OrtValue):
                value = value._value
            feeds[name] = value
        return feeds

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Optional[RunOptions] = None) -> List[Any]:
        """Runs the model; returns the outputs named (all when `output_names` is None or empty)
        in that order: numpy arrays, lists for sequences, dicts for maps."""
        if run_options is not None and run_options.terminate:
            raise RuntimeException(9, "the run was terminated (RunOptions.terminate is set)")
        self._check_feed(input_feed)
        names = list(output_names) if output_names else self._output_names
        try:
            result = self._session.run(self._feed(input_feed), names)
        except EpxError as e:
            raise _from_epx(e) from None
        return [result[n] for n in names]

    def run_with_ort_values(self, output_names: Optional[Sequence[str]],
                            input_dict_ort_values: Mapping[str, "OrtValue"],
                            run_options: Optional[RunOptions] = None) -> List["OrtValue"]:
        return [OrtValue(v) for v in self.run(output_names, input_dict_ort_values, run_options)]

    def io_binding(self) -> "IOBinding":
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: "IOBinding",
                           run_options: Optional[RunOptions] = None) -> None:
        iobinding._run(self, run_options)


def _host_only(device_type: str, what: str) -> None:
    if str(device_type).lower() != "cpu":
        raise EPFail(6, f"{what}: device `{device_type}`: epx's Python binding exchanges host "
                        "memory only; bind a CPU buffer (the EP copies to its device itself)")


class OrtValue:
    """A value in host memory: a numpy array (or a list / dict for sequences and maps), shared,
    not copied."""

    def __init__(self, value: Any):
        self._value = value

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu",
                            device_id: int = 0) -> "OrtValue":
        _host_only(device_type, "OrtValue.ortvalue_from_numpy")
        return OrtValue(np.asarray(numpy_obj))

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any = np.float32,
                                     device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        _host_only(device_type, "OrtValue.ortvalue_from_shape_and_type")
        return OrtValue(np.zeros(tuple(shape), dtype=element_type))

    def numpy(self) -> Any:
        return self._value

    def __array__(self, dtype=None, copy=None):
        arr = np.asarray(self._value)
        return arr if dtype is None else arr.astype(dtype)

    def __dlpack__(self, *args: Any, **kwargs: Any):
        return np.asarray(self._value).__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return np.asarray(self._value).__dlpack_device__()

    def shape(self) -> List[int]:
        return list(np.shape(self._value))

    def data_type(self) -> str:
        if isinstance(self._value, list):
            return "seq"
        if isinstance(self._value, dict):
            return "map"
        return _type_of(np.asarray(self._value).dtype)

    def element_type(self) -> Any:
        return np.asarray(self._value).dtype.type

    def device_name(self) -> str:
        return "cpu"

    def is_tensor(self) -> bool:
        return isinstance(self._value, np.ndarray)

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def has_value(self) -> bool:
        return self._value is not None

    def data_ptr(self) -> int:
        return int(np.asarray(self._value).ctypes.data)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        np.copyto(self._value, np_arr)


class IOBinding:
    """ONNX Runtime's IO binding over host memory: inputs bound as numpy arrays, OrtValues or raw
    CPU pointers; outputs returned as OrtValues, or written into a bound OrtValue or buffer."""

    def __init__(self, session: InferenceSession):
        self._session = session
        self._inputs: Dict[str, Any] = {}
        self._outputs: Dict[str, Optional[Any]] = {}  # name -> None, OrtValue or raw spec
        self._results: List[OrtValue] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Sequence[int], buffer_ptr: int) -> None:
        _host_only(device_type, f"IOBinding.bind_input `{name}`")
        self._inputs[name] = _view(buffer_ptr, element_type, shape)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = ortvalue._value

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Optional[Sequence[int]] = None,
                    buffer_ptr: Optional[int] = None) -> None:
        _host_only(device_type, f"IOBinding.bind_output `{name}`")
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise InvalidArgument(1, f"bind_output `{name}`: a buffer needs its "
                                         "element_type and shape")
            self._outputs[name] = OrtValue(_view(buffer_ptr, element_type, shape))
        else:
            self._outputs[name] = None

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._outputs[name] = ortvalue

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def synchronize_inputs(self) -> None:
        """Host memory: nothing to wait for."""

    def synchronize_outputs(self) -> None:
        """Host memory: nothing to wait for."""

    def get_outputs(self) -> List[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> List[Any]:
        return [np.array(v._value, copy=True) if isinstance(v._value, np.ndarray) else v._value
                for v in self._results]

    def _run(self, session: InferenceSession, run_options: Optional[RunOptions]) -> None:
        names = list(self._outputs) or [o.name for o in session._outputs]
        values = session.run(names, self._inputs, run_options)
        results = []
        for name, value in zip(names, values):
            target = self._outputs.get(name)
            if target is None:
                results.append(OrtValue(value))
                continue
            dest = target._value
            if not isinstance(dest, np.ndarray) or dest.shape != np.shape(value) \
                    or dest.dtype != np.asarray(value).dtype:
                raise InvalidArgument(8, f"output `{name}` is {_type_of(np.asarray(value).dtype)}"
                                         f"{list(np.shape(value))}, but the bound buffer is "
                                         f"{_type_of(dest.dtype)}{list(dest.shape)}")
            np.copyto(dest, value)
            results.append(target)
        self._results = results


def _view(buffer_ptr: int, element_type: Any, shape: Sequence[int]) -> np.ndarray:
    """A numpy array over `prod(shape)` elements at `buffer_ptr` (host memory the caller owns)."""
    import ctypes
    dtype = np.dtype(element_type)
    if any(int(d) < 0 for d in shape):
        raise InvalidArgument(1, f"buffer shape {list(shape)} has a negative extent")
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if count and not int(buffer_ptr or 0):
        raise InvalidArgument(1, f"buffer_ptr is NULL (0) for {count} elements of {dtype}: "
                                 "bind host memory the program owns")
    if not count:
        return np.zeros(tuple(shape), dtype)
    buf = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(int(buffer_ptr))
    return np.frombuffer(buf, dtype=dtype).reshape(tuple(shape))
