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

The whole public API of ONNX Runtime 1.31.1 is here (tests/test_onnxruntime_api.py enumerates
it from the installed onnxruntime): the device calls map onto epx's device lists, selection
policies and plugin libraries (`get_ep_devices`, `add_provider_for_devices`,
`set_provider_selection_policy`, `register_execution_provider_library`), the graph assignment
info is epx's placement report, and inputs are converted and refused by ONNX Runtime's rules
(`_inputs`).

What differs, and says so: IO binding and OrtValue hold host memory only (binding device memory
raises EPFail); LoRA adapters, custom op libraries, initializers and external data given in
memory, and dimension denotations raise NotImplemented saying why; overridable initializers are
constants (feeding one raises); `optimized_model_filepath` and `enable_profiling` write no file
(a warning says so); `ModelCompiler` writes the model unchanged (epx keeps compiled kernels in
its kernel cache, not in EPContext nodes).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from enum import IntEnum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import epx as _epx
from epx._capi import EpxError

from .capi import onnxruntime_pybind11_state as _state
from .capi.onnxruntime_pybind11_state import (
    EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, ModelLoadCanceled, NoSuchFile,
    NotImplemented, RuntimeException, _from_epx,
)
from . import _devices, _inputs
from ._devices import (
    OrtAllocatorType, OrtDevice, OrtDeviceMemoryType, OrtDeviceVendorId, OrtEpDevice,
    OrtExecutionProviderDevicePolicy, OrtHardwareDevice, OrtHardwareDeviceType, OrtMemoryInfo,
    OrtMemoryInfoDeviceType, OrtMemType, OrtSyncStream, register_execution_provider_library,
    unregister_execution_provider_library,
)
from ._extras import lora_unsupported as _extras_lora
from ._extras import (
    AdapterFormat, LoraAdapter, ModelCompiler, OrtArenaCfg, OrtCompileApiFlags,
    OrtEpAssignedNode, OrtEpAssignedSubgraph, OrtEpContextData, OrtEpContextDataBuffer,
    OrtExternalInitializerInfo, OrtSparseFormat, SparseTensor,
)

# The ONNX Runtime release whose Python API this module follows (programs compare against it).
__version__ = "1.31.1"
version = __version__
package_name = "onnxruntime"
# epx's Python binding is not a CUDA build of ONNX Runtime: its CUDA EP is a plugin that finds
# the CUDA libraries itself.
cuda_version = ""
# ONNX Runtime keeps the exception its native module raised on import here (None: it imported).
import_capi_exception = None

__all__ = [
    "InferenceSession", "SessionOptions", "RunOptions", "IOBinding", "SessionIOBinding",
    "OrtValue", "NodeArg", "ModelMetadata", "GraphOptimizationLevel", "ExecutionMode",
    "ExecutionOrder", "SparseTensor", "OrtSparseFormat", "OrtDevice", "OrtDeviceVendorId",
    "OrtMemoryInfo", "OrtMemType", "OrtAllocatorType", "OrtDeviceMemoryType",
    "OrtMemoryInfoDeviceType", "OrtHardwareDevice", "OrtHardwareDeviceType", "OrtEpDevice",
    "OrtSyncStream", "OrtExecutionProviderDevicePolicy", "OrtArenaCfg", "OrtEpAssignedNode",
    "OrtEpAssignedSubgraph", "OrtEpContextData", "OrtEpContextDataBuffer",
    "OrtExternalInitializerInfo", "OrtCompileApiFlags", "ModelCompiler", "LoraAdapter",
    "AdapterFormat", "get_available_providers", "get_all_providers", "get_device",
    "get_version_string", "get_build_info", "get_ep_devices", "set_seed",
    "set_default_logger_severity", "set_default_logger_verbosity",
    "set_global_thread_pool_sizes", "disable_telemetry_events", "enable_telemetry_events",
    "has_collective_ops", "preload_dlls", "print_debug_info", "copy_tensors",
    "create_and_register_allocator", "create_and_register_allocator_v2",
    "register_execution_provider_library", "unregister_execution_provider_library",
    "install", "PROVIDER_NAMES", "version", "package_name", "cuda_version",
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
    return _devices.environment()


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


def _ort_name(ep: str) -> str:
    """ONNX Runtime's name for an epx EP where it has one, epx's name otherwise."""
    return _ORT_NAMES.get(ep, ep)


def get_build_info() -> str:
    """What this build is: epx's version and its CPU EP's kernels."""
    cpu = next((d for d in _env().devices() if d.get("provider") == "cpu"), {})
    kernels = (cpu.get("device") or {}).get("driver_version") or ""
    return f"epx {_epx.version()}, plugin ABI {_epx.plugin_abi_version()}" + \
        (f", {kernels}" if kernels else "")


def set_seed(seed: int) -> None:
    """The seed of random operators. epx's CPU EP runs none (RandomNormal, RandomUniform and
    Multinomial are refused when a session is made), so there is nothing to seed."""
    int(seed)  # refused as ONNX Runtime refuses a seed that is not an integer


def preload_dlls(cuda: bool = True, cudnn: bool = True, msvc: bool = True,
                 directory: Optional[str] = None) -> None:
    """Nothing to preload: like ONNX Runtime's CPU package (whose `cuda_version` is empty), this
    returns at once. epx's CUDA and TensorRT plugins find the CUDA libraries they link to
    themselves, in the `nvidia-*` wheels of this environment among other places (`epx doctor`
    says where)."""


def print_debug_info() -> None:
    """Prints the package, the platform and what `epx doctor` finds."""
    import platform
    print(f"{package_name} version: {__version__} (epx {_epx.version()})")
    print("platform:", platform.platform())
    print(f"\nepx package location: {os.path.dirname(os.path.abspath(_epx.__file__))}")
    print("\nAvailable providers:", ", ".join(get_available_providers()))
    print("\n" + _env().doctor().text)


def has_collective_ops() -> bool:
    """No collective (multi-process) operators: False, as in ONNX Runtime's usual builds."""
    return False


def disable_telemetry_events() -> None:
    """epx sends no telemetry: nothing to disable."""


def enable_telemetry_events() -> None:
    """epx sends no telemetry: nothing to enable."""


_global_threads: Optional[Tuple[int, int]] = None


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0,
                                 inter_op_num_threads: int = 0) -> None:
    """The thread counts of sessions whose options set `use_per_session_threads = False` (and
    no thread count of their own). Set once, as in ONNX Runtime."""
    global _global_threads
    if _global_threads is not None:
        raise RuntimeException(1, "The global thread pools are already set")
    if int(intra_op_num_threads) < 0 or int(inter_op_num_threads) < 0:
        raise InvalidArgument(1, "thread counts must not be negative")
    _global_threads = (int(intra_op_num_threads), int(inter_op_num_threads))


def copy_tensors(src: Sequence["OrtValue"], dst: Sequence["OrtValue"], stream: Any = None) -> None:
    """Copies each source OrtValue's data into the destination at the same index (same type and
    shape)."""
    if len(src) != len(dst):
        raise InvalidArgument(1, f"copy_tensors: {len(src)} sources and {len(dst)} destinations")
    for i, (a, b) in enumerate(zip(src, dst)):
        x, y = np.asarray(a._value), b._value
        if not isinstance(y, np.ndarray) or x.shape != y.shape or x.dtype != y.dtype:
            raise InvalidArgument(1, f"copy_tensors: pair {i}: {_type_of(x.dtype)}{list(x.shape)} "
                                     f"into {_type_of(np.asarray(y).dtype)}"
                                     f"{list(np.shape(y))}")
        np.copyto(y, x)


_allocators: Dict[str, Any] = {}


def create_and_register_allocator(mem_info: OrtMemoryInfo, arena_cfg: Optional[OrtArenaCfg]
                                  ) -> None:
    """Registers an allocator shared by the sessions. epx's CPU EP keeps buffer pools per
    session, so a host allocator is accepted and has no effect; a device one raises."""
    _register_allocator(mem_info)


def create_and_register_allocator_v2(provider_type: str, mem_info: OrtMemoryInfo,
                                     provider_options: Mapping[str, str],
                                     arena_cfg: Optional[OrtArenaCfg]) -> None:
    """As `create_and_register_allocator`, for a provider."""
    _register_allocator(mem_info)


def _register_allocator(mem_info: OrtMemoryInfo) -> None:
    if not isinstance(mem_info, OrtMemoryInfo):
        raise TypeError(f"an OrtMemoryInfo is needed, not {type(mem_info).__name__}")
    if mem_info.device_type != OrtMemoryInfoDeviceType.CPU:
        raise EPFail(6, f"{mem_info}: epx's Python binding exchanges host memory only")
    if mem_info.name in _allocators:
        raise InvalidArgument(1, f"An allocator for {mem_info.name} is already registered")
    _allocators[mem_info.name] = mem_info


def get_ep_devices() -> List[OrtEpDevice]:
    """One OrtEpDevice per device an EP of this environment can run on (`epx.devices()`), the
    EP named as ONNX Runtime names it where it has a name for it."""
    return _devices.get_ep_devices(_ort_name)


def install() -> None:
    """Makes `import onnxruntime` (and its usual submodules) give this module, for packages that
    import ONNX Runtime themselves. Call it before importing them."""
    here = sys.modules[__name__]
    sys.modules["onnxruntime"] = here
    sys.modules["onnxruntime.capi"] = sys.modules[__name__ + ".capi"]
    # The native module under both of its names, and the module of the Python classes.
    sys.modules["onnxruntime.capi.onnxruntime_pybind11_state"] = _state
    sys.modules["onnxruntime.capi._pybind_state"] = _state
    sys.modules["onnxruntime.capi.onnxruntime_inference_collection"] = here


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
        self.use_per_session_threads = True
        self._free_dims: Dict[str, int] = {}
        self._providers: List[Tuple[str, Dict[str, str]]] = []
        self._policy: Any = None  # an epx policy name or function
        self._cancel: Optional[_epx.RunOptions] = None
        self._ep_context_read_func: Optional[Any] = None

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._set_entry(key, value)

    def get_session_config_entry(self, key: str) -> str:
        return self._entry(key)

    def register_custom_ops_library(self, library_path: str) -> None:
        raise NotImplemented(7, f"custom op libraries are ONNX Runtime's ({library_path}); in "
                                "epx, custom ops come as an EP plugin (see docs/ABI.md)")

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fixes a named (symbolic) dimension of the inputs: `get_inputs()` shows the value, and
        a run whose input has another extent there raises InvalidArgument, as in ONNX Runtime."""
        if int(dim_value) < 0:
            raise InvalidArgument(1, f"free dimension `{dim_name}`: {dim_value} is negative")
        self._free_dims[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str,
                                                  dim_value: int) -> None:
        raise NotImplemented(7, f"dimension denotations (`{dim_denotation}`) are not read by epx; "
                                "override the dimension by its name "
                                "(add_free_dimension_override_by_name)")

    def add_initializer(self, name: str, value: Any) -> None:
        raise NotImplemented(7, f"initializers cannot be replaced here (`{name}`): epx compiles "
                                "them into the session")

    def add_external_initializers(self, names: Sequence[str], ort_values: Sequence[Any]) -> None:
        raise NotImplemented(7, f"external initializers given in memory ({', '.join(names)}) are "
                                "not supported: epx reads external data from the files the model "
                                "names, next to the model")

    def add_external_initializers_from_files_in_memory(self, names: Sequence[str],
                                                       buffers: Sequence[Any],
                                                       lengths: Sequence[int]) -> None:
        raise NotImplemented(7, f"external data files given in memory ({', '.join(names)}) are "
                                "not supported: epx reads external data from the files the model "
                                "names, next to the model")

    def add_provider(self, provider_name: str, provider_options: Mapping[str, Any]) -> None:
        """Adds an EP for sessions made with these options and no `providers` of their own."""
        self._providers.append((str(provider_name),
                                {str(k): str(v) for k, v in dict(provider_options).items()}))

    def add_provider_for_devices(self, ep_devices: Sequence[OrtEpDevice],
                                 provider_options: Mapping[str, Any]) -> None:
        """Adds an EP on the devices given (all of one EP, from `get_ep_devices()`)."""
        if not ep_devices:
            raise InvalidArgument(1, "add_provider_for_devices: no devices given")
        names = {d.ep_name for d in ep_devices}
        if len(names) != 1:
            raise InvalidArgument(1, "add_provider_for_devices: the devices must belong to one "
                                     f"EP; got {', '.join(sorted(names))}")
        opts = {str(k): str(v) for k, v in dict(provider_options).items()}
        for d in ep_devices:
            self._providers.append((d.selector, opts))

    def has_providers(self) -> bool:
        return bool(self._providers) or self._policy is not None

    def set_provider_selection_policy(self, policy: OrtExecutionProviderDevicePolicy) -> None:
        """Lets epx choose the EPs from the devices present, as ONNX Runtime's policy would:
        NPUs first for efficiency and power, GPUs first for performance, else the CPU."""
        self._policy = _devices.POLICY_NAMES[OrtExecutionProviderDevicePolicy(int(policy))]

    def set_provider_selection_policy_delegate(self, selection_delegate: Any) -> None:
        """Lets a function choose: `(ep_devices, model_metadata, runtime_metadata,
        max_selections) -> [OrtEpDevice]`, in priority order."""
        if not callable(selection_delegate):
            raise TypeError("the selection delegate must be callable")
        self._policy = _devices.policy_function(selection_delegate, _ort_name)

    def set_load_cancellation_flag(self, value: bool) -> None:
        """Cancels the creation of sessions with these options, from any thread: one being made
        stops at its next step (between loading, setting up EPs, partitioning and compiling
        each kernel), and one made while the flag is set fails at once; both raise
        ModelLoadCanceled."""
        if self._cancel is None:
            self._cancel = _epx.RunOptions(_env()._lib)
        self._cancel.terminate() if value else self._cancel.clear()

    def set_ep_context_data_read_func(self, read_func: Any) -> None:
        """Kept: called when an EP reads EPContext data, which epx's EPs do not (they rebuild
        compiled kernels from the kernel cache)."""
        self._ep_context_read_func = read_func

    def clear_ep_context_data_read_func(self) -> None:
        self._ep_context_read_func = None


class RunOptions(_ConfigEntries):
    """ONNX Runtime's run options. Setting `terminate = True`, from any thread, cancels the runs
    made with these options: one in progress stops at its next check (between kernels; the CPU
    EP checks between nodes and at each Loop iteration) and raises Fail, as ONNX Runtime's
    does; while it is set, runs with these options fail at once."""

    _kind = "run"

    def __init__(self) -> None:
        super().__init__()
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self._flag: Optional[_epx.RunOptions] = None
        self._terminate = False

    @property
    def terminate(self) -> bool:
        return self._terminate

    @terminate.setter
    def terminate(self, value: bool) -> None:
        self._terminate = bool(value)
        flag = self._epx()
        flag.terminate() if self._terminate else flag.clear()

    def _epx(self) -> _epx.RunOptions:
        if self._flag is None:
            self._flag = _epx.RunOptions(_env()._lib)
        return self._flag

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._set_entry(key, value)

    def get_run_config_entry(self, key: str) -> str:
        return self._entry(key)

    def add_active_adapter(self, adapter: Any) -> None:
        _extras_lora("RunOptions.add_active_adapter")


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
        policy = None
        if requested and opts.has_providers():
            warnings.warn("Specified 'providers'/'provider_options' when creating "
                          "InferenceSession but SessionOptions has already been configured with "
                          "providers. InferenceSession will only use the providers passed to "
                          "InferenceSession().", UserWarning, stacklevel=3)
        elif not requested:
            requested = list(opts._providers)
            policy = opts._policy
        eps: List[Tuple[str, Dict[str, Any]]] = []
        chosen: List[Tuple[str, str, Dict[str, str]]] = []  # (ort name, epx name, options)
        # The plugins are listed (each opened, first in a child) only when a session asks for
        # an EP other than the CPU EP, which is always there: as ONNX Runtime loads no EP
        # library for a CPU session.
        needs_plugins = any(_CANDIDATES.get(n, (n,)) != ("cpu",) for n, _ in requested)
        available = _available() if needs_plugins else {"cpu": None}
        for name, options in requested:
            if ":" in name and name.split(":", 1)[0] in {p.name for p in _env().providers()}:
                # A device chosen by add_provider_for_devices: epx's `ep:device`.
                ep = name.split(":", 1)[0]
                if ep != "cpu":
                    eps.append((name, dict(options)))
                chosen.append((_ort_name(ep), ep, {str(k): str(v) for k, v in options.items()}))
                continue
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
        threads = int(opts.intra_op_num_threads or 0)
        if not threads and not opts.use_per_session_threads and _global_threads is not None:
            threads = _global_threads[0]
        try:
            model = self._model_bytes if self._model_bytes is not None else self._model_path
            self._session = _epx.Session(model, eps, env=_env(), intra_op_threads=threads or None,
                                         policy=policy, cancel=opts._cancel)
        except EpxError as e:
            if e.code == 12:
                raise ModelLoadCanceled(12, f"Model loading was canceled: {e.message}") from None
            raise _from_epx(e) from None
        if policy is not None:
            placed = {n["provider"] for n in self._session.placement().get("nodes", [])}
            chosen = [(_ort_name(ep), ep, {}) for ep in dict.fromkeys(
                p.split("/")[-1] for p in placed) if ep != "cpu"]
        skipped = {s["name"] for s in self._session.placement().get("skipped_providers", [])}
        # As ONNX Runtime lists them: in the order given, the CPU EP last unless given earlier.
        self._providers = [c for c in chosen if c[1] not in skipped]
        if not any(c[1] == "cpu" for c in self._providers):
            self._providers.append(("CPUExecutionProvider", "cpu", {}))
        meta = self._session.metadata()
        self._meta = meta
        self._inputs = _node_args(self._session.inputs, meta.get("inputs", []))
        # Free dimensions fixed by the options: (index, extent) per input, checked at each run.
        self._fixed: Dict[str, List[Tuple[int, int]]] = {}
        for arg in self._inputs:
            fixed = [(i, opts._free_dims[d]) for i, d in enumerate(arg.shape)
                     if isinstance(d, str) and d in opts._free_dims]
            if fixed:
                self._fixed[arg.name] = fixed
                arg.shape = [opts._free_dims.get(d, d) if isinstance(d, str) else d
                             for d in arg.shape]
        self._outputs = _node_args(self._session.outputs, meta.get("outputs", []))
        self._overridable = [NodeArg(o["name"], o.get("type") or "", list(o.get("dims") or []))
                             for o in meta.get("overridable_initializers", [])]
        # The native per-call path, where it applies (not with fixed free dimensions, which
        # each run checks here).
        self._fast = None if self._fixed else self._session._fast
        self._required = [i.name for i in self._inputs if not i.type.startswith("optional")]
        # The numpy dtype each input takes (None: left to epx), for ONNX Runtime's input rules.
        self._want = {i.name: _inputs.element_dtype(i.type) for i in self._inputs}
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

    # What ONNX Runtime's Python class keeps, which some programs read directly.
    @property
    def _inputs_meta(self) -> List[NodeArg]:
        return self._inputs

    @property
    def _outputs_meta(self) -> List[NodeArg]:
        return self._outputs

    @property
    def _model_meta(self) -> ModelMetadata:
        return ModelMetadata(self._meta)

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

    def _check_fixed(self, input_feed: Mapping[str, Any]) -> None:
        for name, fixed in self._fixed.items():
            value = input_feed.get(name)
            shape = np.shape(value._value if isinstance(value, OrtValue) else value)
            bad = [(i, shape[i], want) for i, want in fixed if i < len(shape) and shape[i] != want]
            if bad:
                lines = "".join(f" index: {i} Got: {got} Expected: {want}\n" for i, got, want in bad)
                raise InvalidArgument(8, f"Got invalid dimensions for input: {name} for the "
                                         f"following indices\n{lines} Please fix either the "
                                         "inputs/outputs or the model.")

    def _check_feed(self, input_feed: Mapping[str, Any]) -> None:
        if self._fixed:
            self._check_fixed(input_feed)
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
        unknown = [n for n in input_feed if n not in self._want]
        if unknown:
            raise InvalidArgument(8, f"Invalid input name: {unknown[0]}")

    def _feed(self, input_feed: Mapping[str, Any]) -> Dict[str, Any]:
        """The values as ONNX Runtime's binding converts them (`_inputs`)."""
        feeds = {}
        want = self._want
        for name, value in input_feed.items():
            if isinstance(value, OrtValue):
                value = value._value
            else:
                dtype = want.get(name)
                if dtype is not None and not (type(value) is np.ndarray and value.dtype == dtype
                                              and dtype.kind != "O"):
                    value = _inputs.convert(name, value, dtype)
            feeds[name] = value
        return feeds

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Optional[RunOptions] = None) -> List[Any]:
        """Runs the model; returns the outputs named (all when `output_names` is None or empty)
        in that order: numpy arrays, lists for sequences, dicts for maps."""
        fast = self._fast
        if fast is not None and type(input_feed) is dict:
            out = fast.run(input_feed, output_names,
                           run_options._epx()._ptr if run_options is not None else 0)
            if out is not None:
                if type(out) is tuple:  # libepx's (code, message)
                    raise _run_error(EpxError(*out))
                return out
        self._check_feed(input_feed)
        names = list(output_names) if output_names else self._output_names
        feeds = self._feed(input_feed)
        flag = run_options._epx() if run_options is not None else None
        try:
            result = self._session.run(feeds, names, flag)
        except EpxError as e:
            raise _run_error(e) from None
        return [result[n] for n in names]

    def run_with_ort_values(self, output_names: Optional[Sequence[str]],
                            input_dict_ort_values: Mapping[str, "OrtValue"],
                            run_options: Optional[RunOptions] = None) -> List["OrtValue"]:
        return [OrtValue(v) for v in self.run(output_names, input_dict_ort_values, run_options)]

    def run_async(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
                  callback: Any, user_data: Any, run_options: Optional[RunOptions] = None) -> None:
        """Runs on another thread and calls `callback(results, user_data, error)` from it:
        `error` is "" on success, else the error's text (and `results` empty)."""
        self._check_feed(input_feed)
        feed = dict(input_feed)

        def work() -> None:
            try:
                results = self.run(output_names, feed, run_options)
            except Exception as e:  # noqa: BLE001 - handed to the callback, as ONNX Runtime does
                callback([], user_data, f"{type(e).__name__}: {e}")
                return
            callback(results, user_data, "")

        threading.Thread(target=work, name="epx-run-async", daemon=True).start()

    def run_with_ortvaluevector(self, run_options: Optional[RunOptions], feed_names: Sequence[str],
                                feeds: Sequence["OrtValue"], fetch_names: Sequence[str],
                                fetches: "OrtValueVector", fetch_devices: Sequence[Any]) -> None:
        """Runs with inputs given as OrtValues; the outputs are appended to `fetches`."""
        if len(feed_names) != len(feeds):
            raise InvalidArgument(1, f"{len(feed_names)} feed names for {len(feeds)} feeds")
        values = self.run(list(fetch_names), dict(zip(feed_names, feeds)), run_options)
        fetches.extend(OrtValue(v) for v in values)

    def create_ortvalue_from_shape_and_type(self, shape: Sequence[int], element_type: Any,
                                            device_type: str, device_id: int = 0,
                                            vendor_id: int = -1) -> "OrtValue":
        """A zeroed OrtValue in host memory (the only memory epx's Python binding exchanges)."""
        return OrtValue.ortvalue_from_shape_and_type(shape, element_type, device_type, device_id)

    def get_input_memory_infos(self) -> List[OrtMemoryInfo]:
        """Inputs are read from host memory: one host OrtMemoryInfo per input."""
        return [_devices.host_memory_info() for _ in self._inputs]

    def get_output_memory_infos(self) -> List[OrtMemoryInfo]:
        """Outputs are returned in host memory: one host OrtMemoryInfo per output."""
        return [_devices.host_memory_info() for _ in self._outputs]

    def get_input_epdevices(self) -> List[Optional[OrtEpDevice]]:
        """The device of the EP that first reads each input."""
        providers: Dict[str, str] = {}
        for group in self._session.placement().get("groups", []):
            for name in group.get("inputs", []):
                providers.setdefault(name, group.get("provider", "cpu").split("/")[-1])
        devices: Dict[str, OrtEpDevice] = {}
        for d in get_ep_devices():
            devices.setdefault(d.ep_metadata["provider"], d)
        return [devices.get(providers.get(i.name, "cpu")) for i in self._inputs]

    def get_provider_graph_assignment_info(self) -> List[OrtEpAssignedSubgraph]:
        """Which EP runs which nodes: the placement report's parts, one per compiled kernel.
        As in ONNX Runtime, the session options must set the config entry
        `session.record_ep_graph_assignment_info` to "1"."""
        if self._sess_options._config.get("session.record_ep_graph_assignment_info") != "1":
            raise Fail(1, "Session configuration entry 'session.record_ep_graph_assignment_info' "
                          "must be set to \"1\" to get graph assignment information (epx's "
                          "placement report is always at InferenceSession.epx_session.placement())")
        from ._extras import assigned_subgraphs
        return assigned_subgraphs(self._session.placement(), _ort_name)

    def get_tuning_results(self) -> List[Dict[str, Any]]:
        """Tunable operators are ROCm/CUDA kernels' own; epx records no tuning results."""
        return []

    def set_tuning_results(self, results: Sequence[Mapping[str, Any]], *,
                           error_on_invalid: bool = False) -> None:
        """Tuning results apply to ONNX Runtime's tunable operators, which epx does not have:
        none apply here."""
        if error_on_invalid and results:
            raise InvalidArgument(1, "these tuning results are for ONNX Runtime's tunable "
                                     "operators (ROCm/CUDA), which this session does not have")

    def release_captured_graph(self, graph_annotation_id: int = 0) -> None:
        """No EP of epx captures graphs: nothing to release (ONNX Runtime treats EPs without
        captured-graph support the same way)."""

    def set_ep_dynamic_options(self, options: Mapping[str, str]) -> None:
        """Run-time options for EPs that take them (ONNX Runtime's `ep.dynamic.*` keys). epx's
        EPs take their options when the session is made; as ONNX Runtime's CPU EP does, they
        accept these and change nothing."""
        for k, v in dict(options).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("set_ep_dynamic_options: keys and values must be strings")

    def io_binding(self) -> "IOBinding":
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: "IOBinding",
                           run_options: Optional[RunOptions] = None) -> None:
        iobinding._run(self, run_options)


def _run_error(e: EpxError) -> Exception:
    """ONNX Runtime's exception for a failed run."""
    if e.code == 12:  # cancelled: ONNX Runtime's Fail and message
        return Fail(12, f"Exiting due to terminate flag being set to true. ({e.message})")
    return _from_epx(e)


def _host_only(device_type: Any, what: str) -> None:
    if isinstance(device_type, OrtDevice):
        if device_type.device_type() == OrtDevice.cpu():
            return
        device_type = {1: "gpu", 2: "fpga", 3: "npu"}.get(device_type.device_type(), device_type)
    if str(device_type).lower() != "cpu":
        raise EPFail(6, f"{what}: device `{device_type}`: epx's Python binding exchanges host "
                        "memory only; bind a CPU buffer (the EP copies to its device itself)")


class OrtValue:
    """A value in host memory: a numpy array (or a list / dict for sequences and maps), shared,
    not copied."""

    def __init__(self, ortvalue: Any, numpy_obj: Any = None):
        # ONNX Runtime's form: OrtValue(native OrtValue, numpy array it views); both are the
        # same Python object here.
        self._value = ortvalue._value if isinstance(ortvalue, OrtValue) else ortvalue

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

    def element_type(self) -> int:
        """The ONNX element type code of the tensor (`TensorProto.FLOAT` = 1, ...)."""
        if not isinstance(self._value, np.ndarray):
            raise Fail(1, "element_type: the OrtValue is not a tensor")
        if self._value.dtype.kind in "USO":
            return _epx._capi.STRING
        code = _epx._capi.CODES.get(self._value.dtype)
        if code is None:
            raise Fail(1, f"element_type: numpy dtype {self._value.dtype} has no ONNX type")
        return code

    def device_name(self) -> str:
        return "cpu"

    def is_tensor(self) -> bool:
        return isinstance(self._value, np.ndarray)

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return isinstance(self._value, SparseTensor)

    def has_value(self) -> bool:
        return self._value is not None

    def data_ptr(self) -> int:
        return int(np.asarray(self._value).ctypes.data)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        np.copyto(self._value, np_arr)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: np.ndarray, onnx_element_type: int
                                           ) -> "OrtValue":
        """An OrtValue over `data`, typed by an ONNX element type code (`TensorProto.*`): the
        array's bytes are read as that type (same item size)."""
        dtype = _epx._capi.DTYPES.get(int(onnx_element_type))
        if dtype is None:
            raise InvalidArgument(1, f"ONNX element type {onnx_element_type} has no numpy type "
                                     "here")
        arr = np.ascontiguousarray(data)
        if arr.dtype.itemsize != np.dtype(dtype).itemsize:
            raise InvalidArgument(1, f"a {arr.dtype} array cannot hold ONNX element type "
                                     f"{onnx_element_type} ({np.dtype(dtype)}): the item sizes "
                                     "differ")
        return OrtValue(arr.view(dtype))

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> "OrtValue":
        """An OrtValue sharing the memory of a DLPack tensor (or capsule) in host memory."""
        arr = np.from_dlpack(data) if hasattr(data, "__dlpack__") else _from_capsule(data)
        if is_bool_tensor and arr.dtype == np.uint8:
            arr = arr.view(np.bool_)
        return OrtValue(arr)

    def tensor_size_in_bytes(self) -> int:
        if not isinstance(self._value, np.ndarray):
            raise Fail(1, "tensor_size_in_bytes: the OrtValue is not a tensor")
        if self._value.dtype.kind in "USO":
            raise Fail(1, "tensor_size_in_bytes: a string tensor has no fixed byte size")
        return int(self._value.nbytes)

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor: SparseTensor) -> "OrtValue":
        return OrtValue(sparse_tensor)

    def as_sparse_tensor(self) -> SparseTensor:
        if not isinstance(self._value, SparseTensor):
            raise Fail(1, "This OrtValue does not hold a sparse tensor")
        return self._value


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

    def get_outputs_as_ortvaluevector(self) -> "OrtValueVector":
        return OrtValueVector(self._results)

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


SessionIOBinding = IOBinding


class OrtValueVector(list):
    """A list of OrtValues (what `run_with_ortvaluevector` fills)."""

    def push_back(self, value: OrtValue) -> None:
        self.append(value)

    def bool_tensor_indices(self) -> List[int]:
        return [i for i, v in enumerate(self) if np.asarray(v._value).dtype == np.bool_]

    def to_dlpacks(self, to_tensor: Any = None) -> List[Any]:
        out = [np.asarray(v._value).__dlpack__() for v in self]
        return [to_tensor(c) for c in out] if to_tensor is not None else out


def _from_capsule(capsule: Any) -> np.ndarray:
    """A numpy array over a bare DLPack capsule (numpy takes objects with `__dlpack__`)."""
    class _Holder:
        def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
            return capsule

        def __dlpack_device__(self) -> Tuple[int, int]:
            return (1, 0)  # kDLCPU
    return np.from_dlpack(_Holder())


def get_default_session_options() -> SessionOptions:
    return SessionOptions()


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


# ONNX Runtime's native module holds the classes and functions too (programs import them from
# `onnxruntime.capi.onnxruntime_pybind11_state` or `_pybind_state`).
for _name in ("InferenceSession", "SessionOptions", "RunOptions", "NodeArg", "ModelMetadata",
              "OrtValue", "OrtValueVector", "SessionIOBinding", "SparseTensor", "OrtDevice",
              "OrtMemoryInfo", "OrtEpDevice", "OrtHardwareDevice", "OrtSyncStream",
              "OrtArenaCfg", "OrtEpAssignedNode", "OrtEpAssignedSubgraph", "OrtEpContextData",
              "OrtEpContextDataBuffer", "OrtExternalInitializerInfo", "LoraAdapter",
              "ModelCompiler", "AdapterFormat", "GraphOptimizationLevel", "ExecutionMode",
              "ExecutionOrder", "OrtAllocatorType", "OrtMemType", "OrtDeviceMemoryType",
              "OrtMemoryInfoDeviceType", "OrtHardwareDeviceType", "OrtSparseFormat",
              "OrtCompileApiFlags", "OrtExecutionProviderDevicePolicy", "get_all_providers",
              "get_available_providers", "get_device", "get_version_string", "get_build_info",
              "get_ep_devices", "get_default_session_options", "set_seed",
              "set_default_logger_severity", "set_default_logger_verbosity",
              "set_global_thread_pool_sizes", "disable_telemetry_events",
              "enable_telemetry_events", "has_collective_ops", "copy_tensors",
              "create_and_register_allocator", "create_and_register_allocator_v2",
              "register_execution_provider_library", "unregister_execution_provider_library"):
    setattr(_state, _name, globals()[_name])
del _name
