//! The C ABI between the epx host and a plugin library, version 1.
//!
//! Rules every type here follows (docs/ABI.md says the same for C authors):
//!
//! - Every struct exchanged starts with `struct_size` (the `sizeof` the writer was built with).
//!   Fields are only ever appended; a reader checks `struct_size` before reading a field, and
//!   treats a field past the end as absent (NULL / zero).
//! - Every fallible call returns `*mut EpxStatus`: NULL means success; otherwise the status
//!   carries a code and a message and is freed by calling its own `release`.
//! - Whoever allocates, frees. Borrowed pointers say how long they live.
//! - No unwinding crosses the boundary: both sides catch panics at every exported function and
//!   every callback.

use std::ffi::{c_char, c_void};

use crate::dlpack::{DLDataType, DLTensor};

/// Major version of this ABI. A plugin built for another major version is refused.
pub const EPX_ABI_VERSION_MAJOR: u32 = 1;
/// Minor version of this ABI. A plugin built for an older minor version is accepted.
pub const EPX_ABI_VERSION_MINOR: u32 = 8;
/// Patch version of this ABI (documentation fixes only).
pub const EPX_ABI_VERSION_PATCH: u32 = 0;

/// The name of the one symbol a plugin library exports, of type [`EpxPluginEntryFn`].
pub const EPX_PLUGIN_ENTRY_SYMBOL: &str = "epx_plugin_entry";

/// The name of an optional second entry function, of type [`EpxPluginEntryWithSettingsFn`]. A
/// library that learns what it provides from settings its host gives it (the ONNX Runtime
/// plugin-EP adapter, told which vendor library to host and under which EP names) exports it;
/// the host calls it, instead of `epx_plugin_entry`, when it has settings for the library.
pub const EPX_PLUGIN_ENTRY_WITH_SETTINGS_SYMBOL: &str = "epx_plugin_entry_with_settings";

/// A value id meaning "no value" (an absent optional input or output of a node).
pub const EPX_VALUE_NONE: u32 = u32::MAX;

/// Flag of [`EpxValueInfo::flags`]: the value is an input of the graph.
pub const EPX_VALUE_GRAPH_INPUT: u32 = 1;
/// Flag of [`EpxValueInfo::flags`]: the value is an output of the graph.
pub const EPX_VALUE_GRAPH_OUTPUT: u32 = 2;
/// Flag of [`EpxValueInfo::flags`]: the value is an initializer (a constant with data).
pub const EPX_VALUE_INITIALIZER: u32 = 4;

/// Flag of [`EpxProviderFactory::flags`]: a kernel of this EP may be executed from several
/// threads at once. Without it the host serializes calls to each kernel's `execute`.
pub const EPX_PROVIDER_CONCURRENT_KERNELS: u32 = 1;

/// (ABI 1.3) The DLPack type code of a string tensor's `DLTensor`: its `data` points at one
/// [`EpxStr`] per element (C order) and `bits` is `8 * sizeof(EpxStr)`. DLPack has no string
/// type; this form is epx's own and only ever appears where a string value is expected.
pub const EPX_DLPACK_STRING_CODE: u8 = 3;

/// (ABI 1.3) What an [`EpxValue`] is ([`EpxHostApi::value_kind`]) and, in
/// [`EpxValueInfo::kind`], what the graph declares a value to be.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpxValueKind {
    /// Not known (value infos only).
    Unknown = 0,
    /// A tensor of any element type, strings included.
    Tensor = 1,
    /// An ONNX `sequence`: zero or more values of one type.
    Sequence = 2,
    /// An ONNX `map` (`ai.onnx.ml`): a 1-D key tensor and a 1-D value tensor of one length.
    Map = 3,
    /// An ONNX `optional`: one value or none.
    Optional = 4,
    /// A sparse tensor (value infos only; no value of this kind crosses the ABI).
    SparseTensor = 5,
}

impl EpxValueKind {
    pub fn from_raw(raw: u32) -> Option<Self> {
        use EpxValueKind::*;
        Some(match raw {
            0 => Unknown,
            1 => Tensor,
            2 => Sequence,
            3 => Map,
            4 => Optional,
            5 => SparseTensor,
            _ => return None,
        })
    }
}

/// Log levels of [`EpxHostApi::log`]; they map onto `tracing` levels.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpxLogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

/// Status codes. Values are fixed and never renumbered; new codes are only appended.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpxStatusCode {
    /// Unspecified failure.
    Fail = 1,
    /// An argument or option was wrong (unknown key, bad value, NULL where not allowed).
    InvalidArgument = 2,
    /// The operation, op or data type is not supported.
    NotImplemented = 3,
    /// The EP cannot run here (missing driver, wrong OS, no device).
    Unavailable = 4,
    /// An allocation failed.
    OutOfMemory = 5,
    /// Code on the other side of the boundary panicked; the panic was caught there.
    Panic = 6,
    /// The graph or subgraph handed over is malformed.
    InvalidGraph = 7,
    /// Running a kernel failed.
    RuntimeError = 8,
    /// The ABI versions of host and plugin are incompatible.
    AbiMismatch = 9,
}

impl EpxStatusCode {
    /// The code for a raw value read from the other side; unknown values become `Fail`.
    pub fn from_raw(code: u32) -> Self {
        use EpxStatusCode::*;
        match code {
            2 => InvalidArgument,
            3 => NotImplemented,
            4 => Unavailable,
            5 => OutOfMemory,
            6 => Panic,
            7 => InvalidGraph,
            8 => RuntimeError,
            9 => AbiMismatch,
            _ => Fail,
        }
    }
}

/// A version triple.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpxVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl EpxVersion {
    /// The ABI version this crate describes.
    ///
    /// cbindgen:ignore
    pub const CURRENT: EpxVersion = EpxVersion {
        major: EPX_ABI_VERSION_MAJOR,
        minor: EPX_ABI_VERSION_MINOR,
        patch: EPX_ABI_VERSION_PATCH,
    };
}

/// A borrowed UTF-8 string: pointer and length, not NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EpxStr {
    pub data: *const u8,
    pub len: usize,
}

impl EpxStr {
    /// The empty string.
    pub const EMPTY: EpxStr = EpxStr {
        data: std::ptr::null(),
        len: 0,
    };

    /// Borrows `s`; the result is valid while `s` is.
    pub fn new(s: &str) -> Self {
        EpxStr {
            data: s.as_ptr(),
            len: s.len(),
        }
    }

    /// Borrows raw bytes; the result is valid while `b` is.
    pub fn from_bytes(b: &[u8]) -> Self {
        EpxStr {
            data: b.as_ptr(),
            len: b.len(),
        }
    }

    /// The bytes.
    ///
    /// # Safety
    /// `data` must point at `len` readable bytes (or be NULL with `len` 0) for `'a`.
    pub unsafe fn as_bytes<'a>(self) -> &'a [u8] {
        if self.data.is_null() || self.len == 0 {
            &[]
        } else {
            // SAFETY: the caller guarantees `data` points at `len` readable bytes for 'a.
            unsafe { std::slice::from_raw_parts(self.data, self.len) }
        }
    }
}

/// An error: a code and a message, made and freed by the same side.
///
/// Returned as `*mut EpxStatus` by every fallible call, NULL meaning success. The receiver reads
/// `code` and `message`, then calls `release(status)` exactly once.
#[repr(C)]
#[derive(Debug)]
pub struct EpxStatus {
    pub struct_size: usize,
    /// An [`EpxStatusCode`] value.
    pub code: u32,
    /// NUL-terminated UTF-8, owned by the status.
    pub message: *const c_char,
    /// Frees the status and its message. Set by its maker; never NULL.
    pub release: Option<unsafe extern "C" fn(status: *mut EpxStatus)>,
}

/// Bytes made by one side and handed to the other, freed through `release`.
#[repr(C)]
#[derive(Debug)]
pub struct EpxBuffer {
    pub struct_size: usize,
    pub data: *mut u8,
    pub len: usize,
    /// Frees `data`; the receiver calls it exactly once. NULL when nothing was handed over.
    pub release: Option<unsafe extern "C" fn(buffer: *mut EpxBuffer)>,
    /// The maker's bookkeeping; the receiver never reads it.
    pub private_data: *mut c_void,
}

impl EpxBuffer {
    /// An empty buffer, for the receiver to pass as an out-parameter.
    pub fn empty() -> Self {
        EpxBuffer {
            struct_size: std::mem::size_of::<EpxBuffer>(),
            data: std::ptr::null_mut(),
            len: 0,
            release: None,
            private_data: std::ptr::null_mut(),
        }
    }
}

/// A model graph, read-only, owned by the host. Opaque: read it through [`EpxHostApi`].
#[repr(C)]
pub struct EpxGraph {
    _private: [u8; 0],
}

/// The host's side of one kernel call. Opaque: read inputs and allocate outputs through
/// [`EpxHostApi`]. Valid only during the `execute` call it was passed to.
#[repr(C)]
pub struct EpxKernelContext {
    _private: [u8; 0],
}

/// (ABI 1.3) A value of any kind: a tensor (strings included), sequence, map or optional. Opaque:
/// read it with the `value_*` functions of [`EpxHostApi`]. The host owns a value it hands out
/// (borrowed for the call); a value made with a `value_new_*` function belongs to the plugin
/// until it is given to another `value_new_*` function or to `kernel_output_value`, or freed with
/// `value_release`.
#[repr(C)]
pub struct EpxValue {
    _private: [u8; 0],
}

/// One node of a graph, as [`EpxHostApi::graph_node`] describes it. All pointers borrow from the
/// graph and live as long as the graph handle they came from.
#[repr(C)]
#[derive(Debug)]
pub struct EpxNodeInfo {
    pub struct_size: usize,
    pub name: EpxStr,
    pub op_type: EpxStr,
    /// The operator domain; empty for the default ONNX domain (`ai.onnx`).
    pub domain: EpxStr,
    /// The opset version the model imports for `domain`.
    pub opset: i64,
    pub num_inputs: usize,
    /// Value ids; [`EPX_VALUE_NONE`] for an absent optional input.
    pub inputs: *const u32,
    pub num_outputs: usize,
    /// Value ids; [`EPX_VALUE_NONE`] for an absent optional output.
    pub outputs: *const u32,
    pub num_attributes: usize,
    /// (ABI 1.1) Values of this graph that the node's nested graphs (If/Loop/Scan bodies) read
    /// by name. They are inputs of the node for scheduling and partitioning: a compiled group
    /// receives them among its subgraph inputs.
    pub num_implicit_inputs: usize,
    /// (ABI 1.1) Value ids, `num_implicit_inputs` of them.
    pub implicit_inputs: *const u32,
}

/// One value (edge) of a graph. Pointers borrow from the graph.
#[repr(C)]
#[derive(Debug)]
pub struct EpxValueInfo {
    pub struct_size: usize,
    pub name: EpxStr,
    /// ONNX `TensorProto.DataType` code; 0 when not known.
    pub elem_type: i32,
    /// Number of dimensions; -1 when not known.
    pub rank: i64,
    /// `rank` extents; -1 for an extent not known statically.
    pub dims: *const i64,
    /// `EPX_VALUE_*` flags.
    pub flags: u32,
    /// The node producing this value, or [`EPX_VALUE_NONE`] for graph inputs and initializers.
    pub producer: u32,
    /// (ABI 1.3) An [`EpxValueKind`]: tensor, sequence, map or optional, as declared or
    /// inferred; 0 when not known. For a non-tensor, `elem_type` is the element type of the
    /// tensors inside (0 when not known) and `rank` is -1.
    pub kind: u32,
}

/// Attribute kinds, numbered as ONNX numbers `AttributeProto.AttributeType`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpxAttributeKind {
    Undefined = 0,
    Float = 1,
    Int = 2,
    String = 3,
    Tensor = 4,
    Graph = 5,
    Floats = 6,
    Ints = 7,
    Strings = 8,
    Tensors = 9,
    Graphs = 10,
    SparseTensor = 11,
    SparseTensors = 12,
    TypeProto = 13,
    TypeProtos = 14,
}

/// One attribute of a node. Which fields carry the value depends on `kind`; pointers borrow
/// from the graph. Kinds this version cannot describe (graphs, sparse tensors, type protos) are
/// reported with their `kind` and no value.
#[repr(C)]
#[derive(Debug)]
pub struct EpxAttribute {
    pub struct_size: usize,
    pub name: EpxStr,
    /// An [`EpxAttributeKind`] value.
    pub kind: u32,
    pub f: f32,
    pub i: i64,
    /// Bytes of a `String` attribute (not necessarily UTF-8).
    pub s: EpxStr,
    /// Element count of `floats`, `ints` or `strings`.
    pub num_values: usize,
    pub floats: *const f32,
    pub ints: *const i64,
    pub strings: *const EpxStr,
    /// A `Tensor` attribute, in host memory; NULL otherwise. From ABI 1.3 a string tensor comes
    /// in the form of [`EPX_DLPACK_STRING_CODE`] (NULL before).
    pub tensor: *const DLTensor,
    /// (ABI 1.1) A `Graph` attribute: the nested graph, readable with the same graph functions
    /// and living as long as the graph it belongs to; NULL otherwise. Values it reads from
    /// enclosing graphs appear in it with no producer and carry the enclosing value's name.
    pub graph: *const EpxGraph,
}

/// A group of nodes handed to `compile`. Ids borrow from the host for the call.
#[repr(C)]
#[derive(Debug)]
pub struct EpxSubgraph {
    pub struct_size: usize,
    pub num_nodes: usize,
    /// Node ids, in topological order.
    pub nodes: *const u32,
    pub num_inputs: usize,
    /// Values the group reads that are produced outside it and are not initializers, in the
    /// order `execute` receives them.
    pub inputs: *const u32,
    pub num_outputs: usize,
    /// Values produced in the group that are read outside it (or are graph outputs), in the
    /// order `execute` must produce them.
    pub outputs: *const u32,
}

impl EpxSubgraph {
    /// A subgraph borrowing the id lists (they must outlive every use of it).
    pub fn borrowing(nodes: &[u32], inputs: &[u32], outputs: &[u32]) -> Self {
        EpxSubgraph {
            struct_size: std::mem::size_of::<EpxSubgraph>(),
            num_nodes: nodes.len(),
            nodes: nodes.as_ptr(),
            num_inputs: inputs.len(),
            inputs: inputs.as_ptr(),
            num_outputs: outputs.len(),
            outputs: outputs.as_ptr(),
        }
    }
}

/// A capability answer: groups of node ids, each to be fused and compiled as one kernel.
/// Filled by the plugin; the host calls `release` once it has read it.
#[repr(C)]
#[derive(Debug)]
pub struct EpxCapability {
    pub struct_size: usize,
    pub num_groups: usize,
    /// `num_groups` sizes; the groups' ids follow each other in `nodes`.
    pub group_sizes: *const usize,
    pub nodes: *const u32,
    /// Frees the arrays; NULL when the plugin returned no groups.
    pub release: Option<unsafe extern "C" fn(capability: *mut EpxCapability)>,
    pub private_data: *mut c_void,
    /// (ABI 1.4) How many nodes the EP says why it declined (optional; 0 says nothing). Write
    /// the three `declined` fields only when `struct_size` (the host's) covers them.
    pub num_declined: usize,
    /// (ABI 1.4) `num_declined` node ids, each one of `unclaimed` and not in a group.
    pub declined_nodes: *const u32,
    /// (ABI 1.4) `num_declined` reasons (UTF-8), one per id: what a user reads in the placement
    /// report. Plugin memory until `release`, like the groups.
    pub declined_reasons: *const EpxStr,
}

impl EpxCapability {
    /// An empty answer, for the host to pass as the out-parameter.
    pub fn empty() -> Self {
        EpxCapability {
            struct_size: std::mem::size_of::<EpxCapability>(),
            num_groups: 0,
            group_sizes: std::ptr::null(),
            nodes: std::ptr::null(),
            release: None,
            private_data: std::ptr::null_mut(),
            num_declined: 0,
            declined_nodes: std::ptr::null(),
            declined_reasons: std::ptr::null(),
        }
    }
}

/// Functions the host gives every plugin. Valid from the entry call until the library is
/// unloaded; every function may be called from any thread.
#[repr(C)]
pub struct EpxHostApi {
    pub struct_size: usize,
    /// The ABI version the host implements.
    pub abi_version: EpxVersion,
    /// NUL-terminated version of the host library, for messages.
    pub host_version: *const c_char,

    /// Writes a message into the host's log (`tracing`), under `target` (NUL-terminated,
    /// usually the plugin's name; NULL means "plugin").
    pub log: Option<unsafe extern "C" fn(level: u32, target: *const c_char, message: EpxStr)>,
    /// Makes a status the host owns (its `release` frees it), for plugins that do not make
    /// their own. Returns NULL only when `code` is 0.
    pub status_create: Option<unsafe extern "C" fn(code: u32, message: EpxStr) -> *mut EpxStatus>,

    /// Number of nodes; ids run from 0 to this minus one, in topological order.
    pub graph_node_count: Option<unsafe extern "C" fn(graph: *const EpxGraph) -> usize>,
    /// Number of values; ids run from 0 to this minus one.
    pub graph_value_count: Option<unsafe extern "C" fn(graph: *const EpxGraph) -> usize>,
    /// Describes node `node` into `*out` (whose `struct_size` the caller sets).
    pub graph_node: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            node: u32,
            out: *mut EpxNodeInfo,
        ) -> *mut EpxStatus,
    >,
    /// Describes attribute `index` (0..num_attributes) of node `node` into `*out`.
    pub graph_node_attribute: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            node: u32,
            index: usize,
            out: *mut EpxAttribute,
        ) -> *mut EpxStatus,
    >,
    /// Describes value `value` into `*out`.
    pub graph_value: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            value: u32,
            out: *mut EpxValueInfo,
        ) -> *mut EpxStatus,
    >,
    /// Fills `*out` with the data of initializer `value`, in host memory, borrowed from the graph.
    /// Fails with `InvalidArgument` when the value is not an initializer.
    pub graph_initializer: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            value: u32,
            out: *mut DLTensor,
        ) -> *mut EpxStatus,
    >,
    /// Serializes `subgraph` as a standalone ONNX model (its inputs as graph inputs, its
    /// outputs as graph outputs, the initializers it reads included) into `*out`, which the
    /// caller frees through `out.release`.
    pub graph_serialize_subgraph: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            subgraph: *const EpxSubgraph,
            out: *mut EpxBuffer,
        ) -> *mut EpxStatus,
    >,

    /// Number of inputs of this kernel call (the subgraph's `num_inputs`).
    pub kernel_input_count: Option<unsafe extern "C" fn(ctx: *const EpxKernelContext) -> usize>,
    /// Input `index`, in the EP's memory space, borrowed for the call.
    pub kernel_input: Option<
        unsafe extern "C" fn(
            ctx: *const EpxKernelContext,
            index: usize,
            out: *mut *const DLTensor,
        ) -> *mut EpxStatus,
    >,
    /// Number of outputs of this kernel call (the subgraph's `num_outputs`).
    pub kernel_output_count: Option<unsafe extern "C" fn(ctx: *const EpxKernelContext) -> usize>,
    /// Allocates output `index` with the given type and shape in the EP's memory space and
    /// returns it, owned by the host, writable until `execute` returns. Each output is
    /// allocated exactly once per call.
    pub kernel_output: Option<
        unsafe extern "C" fn(
            ctx: *mut EpxKernelContext,
            index: usize,
            dtype: DLDataType,
            ndim: i32,
            shape: *const i64,
            out: *mut *mut DLTensor,
        ) -> *mut EpxStatus,
    >,

    /// (ABI 1.1) The graph's inputs (initializers excluded), in the model's order: writes a
    /// pointer to the value ids and their count, borrowed from the graph.
    pub graph_inputs: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            out_ids: *mut *const u32,
            out_len: *mut usize,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.1) The graph's outputs, in the model's order, as for `graph_inputs`.
    pub graph_outputs: Option<
        unsafe extern "C" fn(
            graph: *const EpxGraph,
            out_ids: *mut *const u32,
            out_len: *mut usize,
        ) -> *mut EpxStatus,
    >,

    /// (ABI 1.3) Input `index` as a value of any kind, borrowed for the call; `*out` NULL for an
    /// absent optional input. Host-memory inputs only.
    pub kernel_input_value: Option<
        unsafe extern "C" fn(
            ctx: *const EpxKernelContext,
            index: usize,
            out: *mut *const EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) Sets output `index` to `value` (made with a `value_new_*` function), taking it
    /// over whatever the outcome. Instead of `kernel_output` for that output.
    pub kernel_output_value: Option<
        unsafe extern "C" fn(
            ctx: *mut EpxKernelContext,
            index: usize,
            value: *mut EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) The [`EpxValueKind`] of a value; 0 for NULL.
    pub value_kind: Option<unsafe extern "C" fn(value: *const EpxValue) -> u32>,
    /// (ABI 1.3) The tensor a tensor value holds, in host memory, borrowed from the value. A
    /// string tensor comes in the form of [`EPX_DLPACK_STRING_CODE`].
    pub value_tensor: Option<
        unsafe extern "C" fn(value: *const EpxValue, out: *mut *const DLTensor) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) A sequence's length and the ONNX element type of its tensors (0 when the
    /// sequence holds maps or the type is not known).
    pub value_sequence: Option<
        unsafe extern "C" fn(
            value: *const EpxValue,
            len: *mut usize,
            elem_type: *mut i32,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) Item `index` of a sequence, borrowed from it.
    pub value_sequence_at: Option<
        unsafe extern "C" fn(
            value: *const EpxValue,
            index: usize,
            out: *mut *const EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) A map's keys and values: two 1-D tensor values of one length, borrowed.
    pub value_map: Option<
        unsafe extern "C" fn(
            value: *const EpxValue,
            keys: *mut *const EpxValue,
            values: *mut *const EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) An optional's value, borrowed; `*out` NULL when it holds none.
    pub value_optional: Option<
        unsafe extern "C" fn(value: *const EpxValue, out: *mut *const EpxValue) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) A new host-memory tensor value of the given type and shape, with a copy of
    /// `data` (C order; `ndim` extents in `shape`), or zeros when `data` is NULL. For strings
    /// (`dtype.code` [`EPX_DLPACK_STRING_CODE`]) `data` points at one [`EpxStr`] per element.
    pub value_new_tensor: Option<
        unsafe extern "C" fn(
            dtype: DLDataType,
            ndim: i32,
            shape: *const i64,
            data: *const c_void,
            out: *mut *mut EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) A new sequence of `num_items` values, taking them over whatever the outcome.
    /// `elem_type` is the ONNX element type of its tensors (needed when it is empty; 0 for a
    /// sequence of maps).
    pub value_new_sequence: Option<
        unsafe extern "C" fn(
            elem_type: i32,
            items: *const *mut EpxValue,
            num_items: usize,
            out: *mut *mut EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) A new map from 1-D `keys` (int64 or string) to 1-D `values` of the same length,
    /// taking both over whatever the outcome.
    pub value_new_map: Option<
        unsafe extern "C" fn(
            keys: *mut EpxValue,
            values: *mut EpxValue,
            out: *mut *mut EpxValue,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) A new optional holding `value` (taken over), or none when `value` is NULL.
    pub value_new_optional: Option<
        unsafe extern "C" fn(value: *mut EpxValue, out: *mut *mut EpxValue) -> *mut EpxStatus,
    >,
    /// (ABI 1.3) Frees a value made with a `value_new_*` function and not handed over.
    pub value_release: Option<unsafe extern "C" fn(value: *mut EpxValue)>,

    /// (ABI 1.8) The run's terminate flag: a byte, 0 while the run goes on, set to 1 from
    /// another thread when the application cancels it (ONNX Runtime's `RunOptions.terminate`).
    /// Valid until `execute` returns; read it atomically (a relaxed load is enough) as often as
    /// is cheap (between nodes, loop iterations) and return an error status soon after it is
    /// set. NULL when this run cannot be cancelled.
    pub kernel_terminate_flag:
        Option<unsafe extern "C" fn(ctx: *const EpxKernelContext) -> *const u8>,
}

/// A compiled kernel: one fused group, ready to run. Made by `EpxProvider::compile`.
#[repr(C)]
pub struct EpxKernel {
    pub struct_size: usize,
    /// The plugin's state, passed back to every function below.
    pub state: *mut c_void,
    /// Runs the kernel: read inputs and allocate outputs through the host API with `ctx`.
    /// Thread safety: see [`EPX_PROVIDER_CONCURRENT_KERNELS`].
    pub execute: Option<
        unsafe extern "C" fn(state: *mut c_void, ctx: *mut EpxKernelContext) -> *mut EpxStatus,
    >,
    /// Frees the kernel (and this struct). Called once, after the last `execute` returned.
    pub release: Option<unsafe extern "C" fn(kernel: *mut EpxKernel)>,
}

/// An EP instance, made by `EpxProviderFactory::create` with the user's options.
#[repr(C)]
pub struct EpxProvider {
    pub struct_size: usize,
    pub state: *mut c_void,
    /// Which nodes of `graph` this EP runs, as groups (see [`EpxCapability`]). Only ids among
    /// the `unclaimed` ones may be returned; the host validates every id. `graph` and
    /// `unclaimed` are borrowed for the call.
    pub get_capability: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            graph: *const EpxGraph,
            unclaimed: *const u32,
            num_unclaimed: usize,
            out: *mut EpxCapability,
        ) -> *mut EpxStatus,
    >,
    /// Compiles one group into a kernel. `graph` and `subgraph` are borrowed for the call: copy
    /// whatever the kernel needs later (initializers included).
    pub compile: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            graph: *const EpxGraph,
            subgraph: *const EpxSubgraph,
            out: *mut *mut EpxKernel,
        ) -> *mut EpxStatus,
    >,
    /// Data transfer, for EPs whose memory is not host memory (NULL for host-memory EPs).
    /// Allocates `bytes` bytes aligned to `alignment` on the EP's device.
    pub allocate: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            bytes: usize,
            alignment: usize,
            out: *mut *mut c_void,
        ) -> *mut EpxStatus,
    >,
    /// Frees memory from `allocate`.
    pub free: Option<unsafe extern "C" fn(state: *mut c_void, ptr: *mut c_void)>,
    /// Copies a host tensor into a device tensor of the same type and shape.
    pub copy_to_device: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            src: *const DLTensor,
            dst: *mut DLTensor,
        ) -> *mut EpxStatus,
    >,
    /// Copies a device tensor into a host tensor of the same type and shape.
    pub copy_to_host: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            src: *const DLTensor,
            dst: *mut DLTensor,
        ) -> *mut EpxStatus,
    >,
    /// Copies between two tensors on the EP's device (optional).
    pub copy_on_device: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            src: *const DLTensor,
            dst: *mut DLTensor,
        ) -> *mut EpxStatus,
    >,
    /// Frees the provider (and this struct). Called once, after every kernel it made was released.
    pub release: Option<unsafe extern "C" fn(provider: *mut EpxProvider)>,
    /// (ABI 1.6, optional, with `kernel_deserialize`) Writes bytes from which
    /// `kernel_deserialize` rebuilds `kernel` (one this provider compiled) into `out`, which the
    /// host passes zeroed except `struct_size`. The plugin fills `data`, `len`, `release` and
    /// `private_data`; the host copies the bytes and calls `out->release` once. A
    /// `NotImplemented` status says this kernel cannot be stored (not an error); the host then
    /// compiles it again next time.
    pub kernel_serialize: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            kernel: *const EpxKernel,
            out: *mut EpxBuffer,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.6, optional, with `kernel_serialize`) Rebuilds a kernel from bytes an earlier
    /// `kernel_serialize` wrote, for the same group: the host passes the graph and subgraph a
    /// compile would get, and the `len` bytes at `data`, all borrowed for the call. The bytes
    /// come from a file: a plugin checks what it reads and fails on anything it does not
    /// recognise (another version, another device, damage); the host then compiles instead.
    pub kernel_deserialize: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            graph: *const EpxGraph,
            subgraph: *const EpxSubgraph,
            data: *const u8,
            len: usize,
            out: *mut *mut EpxKernel,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.7, optional, with `kernel_profile_read`) Starts recording where `kernel`'s runs
    /// spend their time, part by part (a part: a node, or nodes the EP fused), from zero again
    /// when it was recording already. The host calls it once a session with profiling on is
    /// made, from one thread, before any run. A `NotImplemented` status says this kernel does
    /// not record parts (not an error): the host still times the kernel as a whole.
    pub kernel_profile_start: Option<
        unsafe extern "C" fn(state: *mut c_void, kernel: *const EpxKernel) -> *mut EpxStatus,
    >,
    /// (ABI 1.7, optional, with `kernel_profile_start`) Writes what `kernel` recorded since
    /// `kernel_profile_start`, and how the EP compiled it, into `out` as for `kernel_serialize`:
    /// one UTF-8 JSON object, `{"parts": [{"name", "op", "calls", "ns"}], "passes": [{"name",
    /// "changed", "note"}]}` (docs/ABI.md gives the rules). May be called while runs go on.
    pub kernel_profile_read: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            kernel: *const EpxKernel,
            out: *mut EpxBuffer,
        ) -> *mut EpxStatus,
    >,
}

/// One EP a library offers: what it is, whether it can run here, and how to make one.
/// Lives as long as the plugin descriptor it belongs to.
#[repr(C)]
pub struct EpxProviderFactory {
    pub struct_size: usize,
    pub state: *mut c_void,
    /// NUL-terminated EP name, unique among loaded plugins (e.g. `cpu`, `cuda`).
    pub name: *const c_char,
    /// NUL-terminated vendor name.
    pub vendor: *const c_char,
    /// NUL-terminated EP version (semver).
    pub version: *const c_char,
    /// The memory space of the EP's tensors: a `DLDeviceType` value (`1` = host memory).
    pub device_type: i32,
    /// `EPX_PROVIDER_*` flags.
    pub flags: u32,
    /// Whether the EP can run on this machine: NULL when it can, else a status whose message
    /// says why not (missing driver, wrong OS, ...).
    pub is_available: Option<unsafe extern "C" fn(state: *mut c_void) -> *mut EpxStatus>,
    /// Makes an EP instance from string options. An unknown key or a bad value is an error whose
    /// message names the valid keys.
    pub create: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            num_options: usize,
            keys: *const EpxStr,
            values: *const EpxStr,
            out: *mut *mut EpxProvider,
        ) -> *mut EpxStatus,
    >,
    /// (ABI 1.5) The devices this EP can run on, present ones it cannot use included (with the
    /// reason). Optional: NULL, or an answer of zero devices, says nothing about devices. The
    /// host passes `out` zeroed except `struct_size`; the plugin fills it, and the host calls
    /// `out->release` once it has read it.
    pub get_devices:
        Option<unsafe extern "C" fn(state: *mut c_void, out: *mut EpxDeviceList) -> *mut EpxStatus>,
}

/// The option key (ABI 1.5) under which the host passes `create` the device a session chose:
/// the `device_id` of one of the EP's listed devices, in decimal. Passed only to EPs that list
/// devices, and only a usable one; an EP that lists devices accepts it.
pub const EPX_DEVICE_OPTION: &str = "epx.device";

/// What kind of hardware a device is (ABI 1.5).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpxDeviceKind {
    /// Not said, or none of the others.
    Other = 0,
    Cpu = 1,
    Gpu = 2,
    Npu = 3,
}

impl EpxDeviceKind {
    /// The kind for a raw value read from a plugin; unknown values become `Other`.
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => EpxDeviceKind::Cpu,
            2 => EpxDeviceKind::Gpu,
            3 => EpxDeviceKind::Npu,
            _ => EpxDeviceKind::Other,
        }
    }
}

/// One device an EP can run on (ABI 1.5). Strings are UTF-8, plugin memory until the list's
/// `release`; an empty string means unknown.
#[repr(C)]
#[derive(Debug)]
pub struct EpxDevice {
    pub struct_size: usize,
    /// An [`EpxDeviceKind`] value.
    pub kind: u32,
    /// The EP's own number for the device (`cuda:1` is id 1); unique within the EP.
    pub device_id: u32,
    /// The name a user asks for the device by, when it is not its number (OpenVINO's `GPU.0`);
    /// empty to use the number.
    pub id_name: EpxStr,
    pub vendor: EpxStr,
    /// The product name (`NVIDIA A100-SXM4-80GB`).
    pub name: EpxStr,
    /// Memory of the device in bytes; 0 when unknown or shared with the host.
    pub memory_bytes: u64,
    /// Driver or runtime version, as the vendor writes it.
    pub driver_version: EpxStr,
    /// Empty when the EP can use the device; else why not (driver too old, library missing).
    pub unusable_reason: EpxStr,
}

/// The devices of one EP, filled by `get_devices` (ABI 1.5).
#[repr(C)]
#[derive(Debug)]
pub struct EpxDeviceList {
    pub struct_size: usize,
    pub num_devices: usize,
    /// `num_devices` entries, each `device_size` bytes apart (the plugin's `sizeof(EpxDevice)`).
    pub devices: *const EpxDevice,
    pub device_size: usize,
    /// Frees the array and its strings; NULL when there is nothing to free.
    pub release: Option<unsafe extern "C" fn(list: *mut EpxDeviceList)>,
    pub private_data: *mut c_void,
}

impl EpxDeviceList {
    /// An empty answer, for the host to pass as the out-parameter.
    pub fn empty() -> Self {
        EpxDeviceList {
            struct_size: std::mem::size_of::<EpxDeviceList>(),
            num_devices: 0,
            devices: std::ptr::null(),
            device_size: 0,
            release: None,
            private_data: std::ptr::null_mut(),
        }
    }
}

/// What a plugin library provides. Returned by the entry function; freed through `release`.
#[repr(C)]
pub struct EpxPluginDescriptor {
    pub struct_size: usize,
    /// The ABI version the plugin was built against.
    pub abi_version: EpxVersion,
    /// NUL-terminated plugin name.
    pub name: *const c_char,
    /// NUL-terminated plugin version (semver).
    pub version: *const c_char,
    pub num_providers: usize,
    pub providers: *const *const EpxProviderFactory,
    /// Frees the descriptor and its factories. Called once, after every provider made from it
    /// was released.
    pub release: Option<unsafe extern "C" fn(descriptor: *mut EpxPluginDescriptor)>,
}

/// The entry function every plugin library exports as `epx_plugin_entry`.
///
/// The host passes its API table (valid until the library is unloaded). On success the plugin
/// writes its descriptor to `*out` and returns NULL; on failure it returns a status saying why
/// and leaves `*out` NULL. The plugin must not call back into the host before returning except
/// through `host.log`.
pub type EpxPluginEntryFn = unsafe extern "C" fn(
    host: *const EpxHostApi,
    out: *mut *mut EpxPluginDescriptor,
) -> *mut EpxStatus;

/// The entry function with settings, exported as `epx_plugin_entry_with_settings` by a library
/// that needs them. As [`EpxPluginEntryFn`], with `num_settings` key/value pairs (UTF-8, valid
/// for the call) that the plugin copies what it needs of. An unknown key is an error naming it.
pub type EpxPluginEntryWithSettingsFn = unsafe extern "C" fn(
    host: *const EpxHostApi,
    num_settings: usize,
    keys: *const EpxStr,
    values: *const EpxStr,
    out: *mut *mut EpxPluginDescriptor,
) -> *mut EpxStatus;

/// The end of a field: what `struct_size` must reach for a reader to use that field.
#[macro_export]
macro_rules! epx_field_end {
    ($ty:ty, $field:ident) => {
        ::std::mem::offset_of!($ty, $field) + ::std::mem::size_of::<usize>()
    };
}

/// Sizes of the structs as ABI 1.0 laid them out (the end of their last 1.0 field). A struct
/// from a 1.0 peer is at least this large; fields appended later are absent when its
/// `struct_size` ends before them. These never change.
pub const EPX_PLUGIN_DESCRIPTOR_SIZE_1_0: usize = epx_field_end!(EpxPluginDescriptor, release);
/// See [`EPX_PLUGIN_DESCRIPTOR_SIZE_1_0`].
pub const EPX_PROVIDER_FACTORY_SIZE_1_0: usize = epx_field_end!(EpxProviderFactory, create);
/// See [`EPX_PLUGIN_DESCRIPTOR_SIZE_1_0`].
pub const EPX_PROVIDER_SIZE_1_0: usize = epx_field_end!(EpxProvider, release);
/// See [`EPX_PLUGIN_DESCRIPTOR_SIZE_1_0`].
pub const EPX_KERNEL_SIZE_1_0: usize = epx_field_end!(EpxKernel, release);
/// See [`EPX_PLUGIN_DESCRIPTOR_SIZE_1_0`].
pub const EPX_HOST_API_SIZE_1_0: usize = epx_field_end!(EpxHostApi, kernel_output);
/// See [`EPX_PLUGIN_DESCRIPTOR_SIZE_1_0`].
pub const EPX_NODE_INFO_SIZE_1_0: usize = epx_field_end!(EpxNodeInfo, num_attributes);
/// See [`EPX_PLUGIN_DESCRIPTOR_SIZE_1_0`].
pub const EPX_ATTRIBUTE_SIZE_1_0: usize = epx_field_end!(EpxAttribute, tensor);
/// A factory from ABI 1.5 on (with `get_devices`).
pub const EPX_PROVIDER_FACTORY_SIZE_1_5: usize = epx_field_end!(EpxProviderFactory, get_devices);
/// A provider from ABI 1.6 on (with `kernel_serialize` and `kernel_deserialize`).
pub const EPX_PROVIDER_SIZE_1_6: usize = epx_field_end!(EpxProvider, kernel_deserialize);
/// A provider from ABI 1.7 on (with `kernel_profile_start` and `kernel_profile_read`).
pub const EPX_PROVIDER_SIZE_1_7: usize = epx_field_end!(EpxProvider, kernel_profile_read);
/// A host API from ABI 1.8 on (with `kernel_terminate_flag`).
pub const EPX_HOST_API_SIZE_1_8: usize = epx_field_end!(EpxHostApi, kernel_terminate_flag);
/// The first version of [`EpxDevice`] (ABI 1.5).
pub const EPX_DEVICE_SIZE_1_5: usize =
    ::std::mem::offset_of!(EpxDevice, unusable_reason) + ::std::mem::size_of::<EpxStr>();

#[cfg(test)]
mod tests {
    use super::*;

    /// The 1.0 sizes are frozen: appending a field must not move them (x86-64 / aarch64).
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn sizes_of_abi_1_0_are_frozen() {
        assert_eq!(EPX_PLUGIN_DESCRIPTOR_SIZE_1_0, 64);
        assert_eq!(EPX_PROVIDER_FACTORY_SIZE_1_0, 64);
        assert_eq!(EPX_PROVIDER_SIZE_1_0, 80);
        assert_eq!(EPX_KERNEL_SIZE_1_0, 32);
        assert_eq!(EPX_HOST_API_SIZE_1_0, 136);
        assert_eq!(EPX_NODE_INFO_SIZE_1_0, 104);
        assert_eq!(EPX_ATTRIBUTE_SIZE_1_0, 96);
        assert_eq!(EPX_PROVIDER_FACTORY_SIZE_1_5, 72);
        assert_eq!(EPX_DEVICE_SIZE_1_5, 104);
        assert_eq!(EPX_PROVIDER_SIZE_1_6, 96);
        assert_eq!(EPX_PROVIDER_SIZE_1_7, 112);
    }
}
