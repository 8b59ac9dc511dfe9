"""ONNX Runtime's device API (1.22+) over epx's device lists, plugins and selection policies.

`get_ep_devices()` lists one `OrtEpDevice` per device an epx EP can run on (`epx.devices()`),
named as ONNX Runtime names the EP where it has a name for it. `add_provider_for_devices` and
the selection policies choose among them through epx's device selection: a session made with
them runs on the devices chosen, in the order chosen, with the CPU EP for the rest.
`register_execution_provider_library` loads an epx plugin library into the environment the
sessions of this module use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from enum import IntEnum
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import epx as _epx

from .capi.onnxruntime_pybind11_state import EPFail, Fail, InvalidArgument


class OrtHardwareDeviceType(IntEnum):
    CPU = 0
    GPU = 1
    NPU = 2


class OrtDeviceVendorId(IntEnum):
    """PCI vendor ids, as ONNX Runtime's `OrtDevice::VendorIds`."""
    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


class OrtDeviceMemoryType(IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtAllocatorType(IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtExecutionProviderDevicePolicy(IntEnum):
    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6


# ONNX Runtime's policies -> epx's (ONNX Runtime chooses NPUs first for efficiency and power,
# GPUs first for performance, and the CPU by default).
POLICY_NAMES: Dict[OrtExecutionProviderDevicePolicy, str] = {
    OrtExecutionProviderDevicePolicy.DEFAULT: "prefer-cpu",
    OrtExecutionProviderDevicePolicy.PREFER_CPU: "prefer-cpu",
    OrtExecutionProviderDevicePolicy.PREFER_NPU: "prefer-npu",
    OrtExecutionProviderDevicePolicy.PREFER_GPU: "prefer-gpu",
    OrtExecutionProviderDevicePolicy.MAX_PERFORMANCE: "prefer-gpu",
    OrtExecutionProviderDevicePolicy.MAX_EFFICIENCY: "prefer-npu",
    OrtExecutionProviderDevicePolicy.MIN_OVERALL_POWER: "prefer-npu",
}

_VENDORS = {"amd": OrtDeviceVendorId.AMD, "authenticamd": OrtDeviceVendorId.AMD,
            "nvidia": OrtDeviceVendorId.NVIDIA, "arm": OrtDeviceVendorId.ARM,
            "microsoft": OrtDeviceVendorId.MICROSOFT, "huawei": OrtDeviceVendorId.HUAWEI,
            "qualcomm": OrtDeviceVendorId.QUALCOMM, "intel": OrtDeviceVendorId.INTEL,
            "genuineintel": OrtDeviceVendorId.INTEL}
_KINDS = {"cpu": OrtHardwareDeviceType.CPU, "gpu": OrtHardwareDeviceType.GPU,
          "npu": OrtHardwareDeviceType.NPU}


def vendor_id(vendor: Optional[str]) -> int:
    """The PCI vendor id of a vendor's name (`AMD`, `AuthenticAMD`, `NVIDIA Corporation`), 0
    when unknown."""
    words = (vendor or "").lower().replace(",", " ").split()
    return int(next((_VENDORS[w] for w in words if w in _VENDORS), OrtDeviceVendorId.NONE))


class OrtDevice:
    """A memory location: device type (`OrtDevice.cpu()` = 0, `cuda()` = 1, `npu()` = 3 as in
    ONNX Runtime), memory type, vendor and id. epx's Python binding exchanges host memory."""

    _TYPES = {"cpu": 0, "cuda": 1, "gpu": 1, "dml": 1, "webgpu": 1, "cann": 3, "npu": 3,
              "fpga": 2}

    def __init__(self, device_type: Any = 0, mem_type: int = 0, vendor_id: int = 0,
                 device_id: int = 0):
        if isinstance(device_type, OrtDevice):  # ONNX Runtime's wrapper form: OrtDevice(native)
            device_type, mem_type, vendor_id, device_id = (
                device_type._type, device_type._mem, device_type._vendor, device_type._id)
        self._type, self._mem, self._vendor, self._id = (int(device_type), int(mem_type),
                                                         int(vendor_id), int(device_id))

    @staticmethod
    def make(ort_device_name: str, device_id: int, vendor_id: int = -1) -> "OrtDevice":
        name = str(ort_device_name).lower()
        if name not in OrtDevice._TYPES:
            raise Fail(1, f"Unsupported device type: {ort_device_name}")
        vendor = int(vendor_id) if int(vendor_id) >= 0 else 0
        return OrtDevice(OrtDevice._TYPES[name], 0, vendor, int(device_id))

    @staticmethod
    def cpu() -> int:
        return 0

    @staticmethod
    def cuda() -> int:
        return 1

    @staticmethod
    def fpga() -> int:
        return 2

    @staticmethod
    def npu() -> int:
        return 3

    @staticmethod
    def default_memory() -> int:
        return 0

    def device_id(self) -> int:
        return self._id

    def device_type(self) -> int:
        return self._type

    def device_mem_type(self) -> int:
        return self._mem

    def device_vendor_id(self) -> int:
        return self._vendor

    def __repr__(self) -> str:
        return (f"OrtDevice(device_type={self._type}, mem_type={self._mem}, "
                f"vendor_id={self._vendor}, device_id={self._id})")


class OrtMemoryInfo:
    """Where a value's memory is: `name` (`Cpu` for host memory), the device and allocator."""

    def __init__(self, name: str = "Cpu", alloc_type: int = OrtAllocatorType.ORT_ARENA_ALLOCATOR,
                 device_id: int = 0, mem_type: int = OrtMemType.DEFAULT):
        self.name = str(name)
        self.allocator_type = OrtAllocatorType(int(alloc_type))
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(int(mem_type))
        self.device_mem_type = OrtDeviceMemoryType.DEFAULT
        self.device_vendor_id = 0
        self.device_type = OrtMemoryInfoDeviceType.CPU

    @staticmethod
    def create_v2(name: str, device_type: OrtMemoryInfoDeviceType, vendor_id: int,
                  device_id: int, mem_type: OrtDeviceMemoryType, alignment: int,
                  allocator_type: OrtAllocatorType) -> "OrtMemoryInfo":
        info = OrtMemoryInfo(name, allocator_type, device_id, OrtMemType.DEFAULT)
        info.device_type = OrtMemoryInfoDeviceType(int(device_type))
        info.device_mem_type = OrtDeviceMemoryType(int(mem_type))
        info.device_vendor_id = int(vendor_id)
        return info

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtMemoryInfo) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo(name='{self.name}', device_type={self.device_type.name}, "
                f"device_id={self.device_id}, mem_type={self.mem_type.name})")


def host_memory_info() -> OrtMemoryInfo:
    return OrtMemoryInfo("Cpu", OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, OrtMemType.DEFAULT)


class OrtHardwareDevice:
    """A physical device: `type`, `vendor`, `vendor_id`, `device_id`, `metadata`."""

    def __init__(self, device: Mapping[str, Any]):
        kind = str(device.get("kind") or "cpu").lower()
        self.type = _KINDS.get(kind, OrtHardwareDeviceType.CPU)
        self.vendor: str = device.get("vendor") or ""
        self.vendor_id: int = vendor_id(self.vendor)
        if self.type == OrtHardwareDeviceType.CPU and self.vendor_id == OrtDeviceVendorId.AMD:
            self.vendor_id = 0x1022  # AMD's CPUs carry its other PCI id, as ONNX Runtime reports
        cpuid_names = {"authenticamd": "AMD", "genuineintel": "Intel"}
        if self.type == OrtHardwareDeviceType.CPU and self.vendor.lower() in cpuid_names:
            self.vendor = cpuid_names[self.vendor.lower()]  # as ONNX Runtime spells CPUID's name
        self.device_id: int = int(device.get("id") or 0)
        self.metadata: Dict[str, str] = {
            k: str(device[k]) for k in ("name", "id_name", "driver_version", "memory_bytes")
            if device.get(k) is not None}

    def __repr__(self) -> str:
        return (f"OrtHardwareDevice(type={self.type.name}, vendor='{self.vendor}', "
                f"device_id={self.device_id})")


class OrtSyncStream:
    """A synchronization stream. Host memory needs none: its handle is 0."""

    def get_handle(self) -> int:
        return 0


class OrtEpDevice:
    """A device an EP can run on: `ep_name` (as a provider name for `InferenceSession`),
    `ep_vendor`, `device`, `ep_metadata` (epx's `selector`, `plugin`) and `ep_options`."""

    def __init__(self, entry: Mapping[str, Any], ep_name: str):
        self.ep_name = ep_name
        self.ep_vendor = "epx" if entry.get("plugin") == "builtin" else str(entry.get("plugin"))
        self.device = OrtHardwareDevice(entry.get("device") or {})
        self.ep_metadata: Dict[str, str] = {"selector": str(entry.get("selector")),
                                            "provider": str(entry.get("provider")),
                                            "plugin": str(entry.get("plugin"))}
        unusable = (entry.get("device") or {}).get("unusable")
        if unusable:
            self.ep_metadata["unusable"] = str(unusable)
        self.ep_options: Dict[str, str] = {}
        self.selector: str = str(entry.get("selector"))

    def memory_info(self, memory_type: OrtDeviceMemoryType) -> Optional[OrtMemoryInfo]:
        if self.device.type == OrtHardwareDeviceType.CPU:
            return host_memory_info()
        return OrtMemoryInfo.create_v2(self.ep_name, OrtMemoryInfoDeviceType.GPU
                                       if self.device.type == OrtHardwareDeviceType.GPU
                                       else OrtMemoryInfoDeviceType.NPU,
                                       self.device.vendor_id, self.device.device_id,
                                       memory_type, 0, OrtAllocatorType.ORT_DEVICE_ALLOCATOR)

    def create_sync_stream(self) -> OrtSyncStream:
        return OrtSyncStream()

    def __repr__(self) -> str:
        return f"OrtEpDevice(ep_name='{self.ep_name}', selector='{self.selector}')"


# Plugin libraries registered by name, and the environment that loads them.
_lock = threading.Lock()
_registered: Dict[str, str] = {}  # registration name -> folder given to the environment
_made: Dict[str, str] = {}  # registration name -> the folder made for a bare library
_env: Optional[_epx.Environment] = None


def environment() -> _epx.Environment:
    """The environment the sessions of `epx.onnxruntime` use: the default one, plus the plugin
    libraries registered here."""
    with _lock:
        if not _registered:
            return _epx.Environment.default()
        global _env
        if _env is None:
            _env = _epx.Environment(plugin_dirs=list(_registered.values()))
        return _env


def register_execution_provider_library(registration_name: str, path_to_library: str) -> None:
    """Loads an EP plugin library (an epx plugin: `epx new-plugin` makes one) under a name;
    its EPs and devices are listed from then on. A name already registered is an error."""
    global _env
    name = str(registration_name)
    path = os.path.abspath(os.fsdecode(path_to_library))
    with _lock:
        if name in _registered:
            raise InvalidArgument(1, f"An execution provider library is already registered "
                                     f"as `{name}`")
        if not os.path.isfile(path):
            raise Fail(3, f"The execution provider library {path} does not exist")
        folder = os.path.dirname(path)
        made = None
        if not os.path.isfile(os.path.join(folder, "plugin.toml")):
            # A bare library: a folder of its own, so that nothing else beside it loads.
            folder = made = tempfile.mkdtemp(prefix=f"epx-{name}-")
            target = os.path.join(folder, os.path.basename(path))
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
            path = target
        env = _epx.Environment(plugin_dirs=list(_registered.values()) + [folder])
        mine = [p for p in env.providers()
                if p.library and os.path.realpath(p.library) == os.path.realpath(path)]
        failure = None
        if not mine:
            failure = (f"{path} was not loaded as an EP plugin (`epx doctor --plugin-dir "
                       f"{folder}` says why)")
        elif not any(p.version for p in mine):  # the plugin itself failed to load
            failure = mine[0].reason or f"{path} failed to load"
        if failure is not None:
            env.close()
            if made:
                shutil.rmtree(made, ignore_errors=True)
            raise EPFail(4, failure)
        _registered[name] = folder
        if made:
            _made[name] = made
        _env = env


def unregister_execution_provider_library(registration_name: str) -> None:
    """Forgets a registered library: sessions made from now on do not see its EPs."""
    global _env
    name = str(registration_name)
    with _lock:
        if name not in _registered:
            raise InvalidArgument(1, f"No execution provider library is registered as `{name}`")
        del _registered[name]
        made = _made.pop(name, None)
        if made:  # the library stays mapped in this process; the folder's link can go
            shutil.rmtree(made, ignore_errors=True)
        _env = None


def get_ep_devices(ort_name: Callable[[str], str]) -> List[OrtEpDevice]:
    """Every device the EPs of this environment can run on, `ort_name` naming each EP."""
    return [OrtEpDevice(d, ort_name(d["provider"])) for d in environment().devices()]


def policy_function(delegate: Callable[..., Sequence[OrtEpDevice]],
                    ort_name: Callable[[str], str]) -> Callable[[List[Dict[str, Any]],
                                                                 Dict[str, Any]], List[str]]:
    """ONNX Runtime's selection delegate `(ep_devices, model_metadata, runtime_metadata,
    max_selections) -> [OrtEpDevice]` as an epx policy function."""
    def select(devices: List[Dict[str, Any]], model: Dict[str, Any]) -> List[str]:
        eps = [OrtEpDevice(d, ort_name(d["provider"])) for d in devices]
        model_meta = {k: str(v) for k, v in model.items() if isinstance(v, (str, int, float))}
        chosen = delegate(eps, model_meta, {}, len(eps))
        if chosen is None:
            return []
        if not all(isinstance(c, OrtEpDevice) for c in chosen):
            raise TypeError("the selection delegate must return a list of OrtEpDevice, got "
                            f"{[type(c).__name__ for c in chosen]}")
        if len(chosen) > len(eps):
            raise InvalidArgument(1, f"the selection delegate returned {len(chosen)} devices; "
                                     f"at most {len(eps)} may be selected")
        return [c.selector for c in chosen]
    return select
