"""The rest of ONNX Runtime's Python API: sparse tensors, arena settings, the placement report as
ONNX Runtime's assignment info, model compilation, and what has no counterpart in epx (LoRA
adapters), which raises ONNX Runtime's own exception saying why."""

from __future__ import annotations

import os
from enum import IntEnum
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from .capi.onnxruntime_pybind11_state import Fail, InvalidArgument, NotImplemented
from ._devices import OrtDevice


class OrtSparseFormat(IntEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


class OrtCompileApiFlags(IntEnum):
    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2


class _CooView:
    def __init__(self, indices: np.ndarray):
        self._indices = indices

    def indices(self) -> np.ndarray:
        return self._indices


class _CsrView:
    def __init__(self, inner: np.ndarray, outer: np.ndarray):
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        return self._inner

    def outer(self) -> np.ndarray:
        return self._outer


def _int64_vector(value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype != np.int64:
        raise InvalidArgument(1, f"{what} must be int64, got {arr.dtype}")
    return np.ascontiguousarray(arr)


class SparseTensor:
    """A sparse tensor in host memory, in COO or CSR form, as ONNX Runtime's. Models with sparse
    inputs or outputs are not run by epx: feeding one raises NotImplemented."""

    def __init__(self, fmt: OrtSparseFormat, dense_shape: np.ndarray, values: np.ndarray,
                 views: Any):
        self._format, self._dense_shape, self._values, self._views = (fmt, dense_shape, values,
                                                                      views)

    @staticmethod
    def sparse_coo_from_numpy(dense_shape: Any, values: np.ndarray, coo_indices: np.ndarray,
                              ort_device: OrtDevice) -> "SparseTensor":
        shape = _int64_vector(dense_shape, "dense_shape")
        values = np.asarray(values)
        indices = _int64_vector(coo_indices, "coo_indices")
        if values.ndim != 1:
            raise InvalidArgument(1, "values must be a 1-D array")
        if indices.size not in (values.size, values.size * shape.size):
            raise InvalidArgument(1, f"coo_indices holds {indices.size} indices for "
                                     f"{values.size} values: expected {values.size} (linear) "
                                     f"or {values.size * shape.size} (one per dimension)")
        _cpu(ort_device)
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_COO, shape, values, _CooView(indices))

    @staticmethod
    def sparse_csr_from_numpy(dense_shape: Any, values: np.ndarray, inner_indices: np.ndarray,
                              outer_indices: np.ndarray, ort_device: OrtDevice) -> "SparseTensor":
        shape = _int64_vector(dense_shape, "dense_shape")
        if shape.size != 2:
            raise InvalidArgument(1, f"a CSR tensor is 2-D; dense_shape is {list(shape)}")
        values = np.asarray(values)
        inner = _int64_vector(inner_indices, "inner_indices")
        outer = _int64_vector(outer_indices, "outer_indices")
        if inner.size != values.size or outer.size != shape[0] + 1:
            raise InvalidArgument(1, f"CSR indices: {inner.size} inner for {values.size} values "
                                     f"and {outer.size} outer for {shape[0]} rows (+1 expected)")
        _cpu(ort_device)
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_CSRC, shape, values, _CsrView(inner, outer))

    def values(self) -> np.ndarray:
        return self._values

    def dense_shape(self) -> np.ndarray:
        return self._dense_shape

    def format(self) -> OrtSparseFormat:
        return self._format

    def data_type(self) -> str:
        from . import _type_of
        return "sparse_" + _type_of(self._values.dtype)

    def device_name(self) -> str:
        return "cpu"

    def as_coo_view(self) -> _CooView:
        if self._format != OrtSparseFormat.ORT_SPARSE_COO:
            raise Fail(1, "This sparse tensor is not in COO format")
        return self._views

    def as_csrc_view(self) -> _CsrView:
        if self._format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise Fail(1, "This sparse tensor is not in CSR format")
        return self._views

    def as_blocksparse_view(self) -> Any:
        raise Fail(1, "This sparse tensor is not in BlockSparse format")

    def to_cuda(self, ort_device: OrtDevice) -> "SparseTensor":
        raise Fail(1, "CUDA is not present in this build: epx's Python binding holds values in "
                      "host memory (an EP copies to its device itself)")


def _cpu(device: Optional[OrtDevice]) -> None:
    if device is not None and device.device_type() != 0:
        raise Fail(1, "epx's Python binding holds sparse tensors in host memory (OrtDevice cpu)")


class OrtArenaCfg:
    """A memory arena's settings. epx's CPU EP keeps buffer pools per session instead of an
    arena: the settings are kept and have no effect."""

    _KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes",
             "max_dead_bytes_per_chunk", "initial_growth_chunk_size_bytes",
             "max_power_of_two_extend_bytes")

    def __init__(self, *args: Any):
        self.max_mem = 0
        self.arena_extend_strategy = -1
        self.initial_chunk_size_bytes = -1
        self.max_dead_bytes_per_chunk = -1
        self.initial_growth_chunk_size_bytes = -1
        self.max_power_of_two_extend_bytes = -1
        if len(args) == 1 and isinstance(args[0], dict):
            for key, value in args[0].items():
                if key not in self._KEYS:
                    raise InvalidArgument(1, f"OrtArenaCfg: unknown key `{key}`; known: "
                                             f"{', '.join(self._KEYS)}")
                setattr(self, key, int(value))
        elif len(args) == 4:
            (self.max_mem, self.arena_extend_strategy, self.initial_chunk_size_bytes,
             self.max_dead_bytes_per_chunk) = (int(a) for a in args)
        elif args:
            raise TypeError("OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes,"
                            " max_dead_bytes_per_chunk) or OrtArenaCfg(dict)")


class OrtEpAssignedNode:
    """A node as the placement report lists it."""

    def __init__(self, name: str, op_type: str, domain: str):
        self.name, self.op_type, self.domain = name, op_type, domain

    def __repr__(self) -> str:
        return f"OrtEpAssignedNode(name='{self.name}', op_type='{self.op_type}')"


class OrtEpAssignedSubgraph:
    """The nodes one EP runs (one part of the placement report)."""

    def __init__(self, ep_name: str, nodes: List[OrtEpAssignedNode]):
        self.ep_name = ep_name
        self._nodes = nodes

    def get_nodes(self) -> List[OrtEpAssignedNode]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"OrtEpAssignedSubgraph(ep_name='{self.ep_name}', nodes={len(self._nodes)})"


def assigned_subgraphs(placement: Dict[str, Any], ort_name: Callable[[str], str]
                       ) -> List[OrtEpAssignedSubgraph]:
    """The placement report's groups (the parts each EP compiles as one kernel, in execution
    order) as ONNX Runtime's assignment info."""
    nodes = {n.get("id"): n for n in placement.get("nodes", [])}
    out = []
    for group in placement.get("groups", []):
        members = [nodes.get(i, {}) for i in group.get("nodes", [])]
        out.append(OrtEpAssignedSubgraph(
            ort_name(group.get("provider", "")),
            [OrtEpAssignedNode(m.get("name", ""), m.get("op_type", ""), m.get("domain", ""))
             for m in members]))
    return out


class OrtExternalInitializerInfo:
    """Where an initializer's data lies in an external file."""

    def __init__(self, filepath: str, file_offset: int, byte_size: int):
        self.filepath, self.file_offset, self.byte_size = str(filepath), int(file_offset), \
            int(byte_size)


class OrtEpContextData:
    """A view of named EPContext data (passed to a write callback; epx's EPs write none)."""

    def __init__(self, data: bytes):
        self._data = data
        self.size = len(data)

    def read(self, offset: int = 0, length: Optional[int] = None) -> bytes:
        end = self.size if length is None else int(offset) + int(length)
        return bytes(self._data[int(offset):end])


class OrtEpContextDataBuffer:
    """The buffer a read callback fills (epx's EPs ask for none)."""

    def __init__(self, max_size: int):
        self.max_size = int(max_size)
        self.size = 0
        self.is_allocated = False
        self._buf = bytearray()

    def allocate(self, size: int) -> None:
        if int(size) > self.max_size:
            raise InvalidArgument(1, f"{size} bytes asked for; at most {self.max_size}")
        self._buf = bytearray(int(size))
        self.size, self.is_allocated = int(size), True

    def write(self, data: Any, offset: int = 0) -> None:
        chunk = bytes(memoryview(data))
        if not self.is_allocated or int(offset) + len(chunk) > self.size:
            raise InvalidArgument(1, "write past the allocated buffer")
        self._buf[int(offset):int(offset) + len(chunk)] = chunk


class ModelCompiler:
    """Compiles a model for its EPs into a model with EPContext nodes. epx keeps compiled kernels
    in its kernel cache (EPX_CACHE_DIR) rather than in EPContext nodes, so no node is ever
    compiled into the model: as ONNX Runtime does when no EP compiles a node, the output is the
    input model, and `OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED` makes that an error."""

    def __init__(self, sess_options: Any, input_model_path_or_bytes: Union[str, os.PathLike,
                                                                           bytes],
                 embed_compiled_data_into_model: bool = False,
                 external_initializers_file_path: Optional[Union[str, os.PathLike]] = None,
                 external_initializers_size_threshold: int = 1024,
                 flags: int = OrtCompileApiFlags.NONE, graph_optimization_level: Any = 0,
                 get_initializer_location_func: Optional[Callable] = None):
        if isinstance(input_model_path_or_bytes, (bytes, bytearray)):
            self._bytes: Optional[bytes] = bytes(input_model_path_or_bytes)
            self._path: Optional[str] = None
        else:
            self._path = os.fspath(input_model_path_or_bytes)
            self._bytes = None
            if not os.path.isfile(self._path):
                raise InvalidArgument(1, f"ModelCompiler: the model {self._path} does not exist")
        self._flags = int(flags)
        self._write_func: Optional[Callable] = None

    def _compiled(self) -> bytes:
        if self._flags & OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED:
            raise Fail(1, "Unable to compile any nodes: epx stores compiled kernels in its kernel "
                          "cache (EPX_CACHE_DIR), not as EPContext nodes in the model")
        if self._bytes is not None:
            return self._bytes
        with open(self._path, "rb") as f:  # type: ignore[arg-type]
            return f.read()

    def compile_to_file(self, output_model_path: Optional[str] = None) -> None:
        if output_model_path is None:
            if self._path is None:
                raise InvalidArgument(1, "ModelCompiler: a model given as bytes needs an output "
                                         "path")
            root, _ = os.path.splitext(self._path)
            output_model_path = root + "_ctx.onnx"
        if self._flags & OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS and \
                os.path.exists(output_model_path):
            raise Fail(1, f"The output model {output_model_path} exists")
        data = self._compiled()
        with open(output_model_path, "wb") as f:
            f.write(data)

    def compile_to_bytes(self) -> bytes:
        return self._compiled()

    def compile_to_stream(self, write_function: Callable[[bytes], None]) -> None:
        write_function(self._compiled())

    def set_ep_context_data_write_func(self, write_func: Callable[[str, OrtEpContextData],
                                                                  None]) -> None:
        self._write_func = write_func

    def clear_ep_context_data_write_func(self) -> None:
        self._write_func = None


_NO_LORA = ("LoRA adapters are not supported by epx: no EP applies adapter weights at run time "
            "(merge the adapter into the model's weights before export)")


class LoraAdapter:
    """ONNX Runtime's LoRA adapters have no counterpart in epx: loading one raises."""

    def Load(self, adapter_file_path: str) -> None:  # noqa: N802 (ONNX Runtime's name)
        raise NotImplemented(7, f"{_NO_LORA}: {adapter_file_path}")


class AdapterFormat:
    """ONNX Runtime's LoRA adapter file format: not supported by epx (see LoraAdapter)."""

    def __init__(self, adapter: Any = None):
        raise NotImplemented(7, _NO_LORA)

    @staticmethod
    def read_adapter(file_path: Any) -> "AdapterFormat":
        raise NotImplemented(7, f"{_NO_LORA}: {file_path}")

    def export_adapter(self, file_path: Any) -> None:
        raise NotImplemented(7, _NO_LORA)

    def get_adapter_version(self) -> int:
        raise NotImplemented(7, _NO_LORA)

    def get_format_version(self) -> int:
        raise NotImplemented(7, _NO_LORA)

    def get_model_version(self) -> int:
        raise NotImplemented(7, _NO_LORA)

    def get_parameters(self) -> Dict[str, Any]:
        raise NotImplemented(7, _NO_LORA)

    def set_adapter_version(self, adapter_version: int) -> None:
        raise NotImplemented(7, _NO_LORA)

    def set_model_version(self, model_version: int) -> None:
        raise NotImplemented(7, _NO_LORA)

    def set_parameters(self, params: Dict[str, Any]) -> None:
        raise NotImplemented(7, _NO_LORA)


def lora_unsupported(what: str) -> None:
    raise NotImplemented(7, f"{_NO_LORA} ({what})")

