//! The host's half of the ABI: the function table every plugin receives, the graph handle it
//! reads through it, and the per-call kernel context.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::{DLDataType, DLDevice, DLTensor};
use epx_plugin_api::sdk::{Error as SdkError, guard, guard_value, into_raw_status};

use std::sync::Arc;

use crate::device::DeviceTensor;
use crate::ir::{AttributeValue, Dim, Graph, Model, ValueType};
use crate::plugin::ProviderInstance;
use crate::tensor::{ElementType, Tensor};
use crate::value::{Map, Sequence, Value};

/// The host crate's version, NUL-terminated, checked at compile time.
static HOST_VERSION: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(v) => v,
    Err(_) => panic!("the crate version holds a NUL byte"),
};

/// The table passed to every plugin's entry function; lives for the whole process.
pub(crate) fn host_api() -> &'static EpxHostApi {
    static API: OnceLock<HostApiCell> = OnceLock::new();
    &API.get_or_init(|| {
        HostApiCell(EpxHostApi {
            struct_size: std::mem::size_of::<EpxHostApi>(),
            abi_version: EpxVersion::CURRENT,
            host_version: HOST_VERSION.as_ptr(),
            log: Some(host_log),
            status_create: Some(host_status_create),
            graph_node_count: Some(graph_node_count),
            graph_value_count: Some(graph_value_count),
            graph_node: Some(graph_node),
            graph_node_attribute: Some(graph_node_attribute),
            graph_value: Some(graph_value),
            graph_initializer: Some(graph_initializer),
            graph_serialize_subgraph: Some(graph_serialize_subgraph),
            kernel_input_count: Some(kernel_input_count),
            kernel_input: Some(kernel_input),
            kernel_output_count: Some(kernel_output_count),
            kernel_output: Some(kernel_output),
            graph_inputs: Some(graph_inputs),
            graph_outputs: Some(graph_outputs),
            kernel_input_value: Some(kernel_input_value),
            kernel_output_value: Some(kernel_output_value),
            value_kind: Some(value_kind),
            value_tensor: Some(value_tensor),
            value_sequence: Some(value_sequence),
            value_sequence_at: Some(value_sequence_at),
            value_map: Some(value_map),
            value_optional: Some(value_optional),
            value_new_tensor: Some(value_new_tensor),
            value_new_sequence: Some(value_new_sequence),
            value_new_map: Some(value_new_map),
            value_new_optional: Some(value_new_optional),
            value_release: Some(value_release),
        })
    })
    .0
}

struct HostApiCell(EpxHostApi);
// SAFETY: the table holds function pointers and a pointer to a static C string; nothing in it
// is ever mutated after construction.
unsafe impl Send for HostApiCell {}
// SAFETY: as above.
unsafe impl Sync for HostApiCell {}

unsafe extern "C" fn host_log(level: u32, target: *const c_char, message: EpxStr) {
    guard_value((), || {
        // SAFETY: plugin contract: `target` is NULL or a C string, `message` valid for the call.
        let (target, message) = unsafe {
            let t = epx_plugin_api::sdk::cstr_or_empty(target).into_owned();
            (
                if t.is_empty() {
                    "plugin".to_string()
                } else {
                    t
                },
                String::from_utf8_lossy(message.as_bytes()).into_owned(),
            )
        };
        match level {
            1 => tracing::error!(target: "epx::plugin", plugin = %target, "{message}"),
            2 => tracing::warn!(target: "epx::plugin", plugin = %target, "{message}"),
            3 => tracing::info!(target: "epx::plugin", plugin = %target, "{message}"),
            4 => tracing::debug!(target: "epx::plugin", plugin = %target, "{message}"),
            _ => tracing::trace!(target: "epx::plugin", plugin = %target, "{message}"),
        }
    })
}

unsafe extern "C" fn host_status_create(code: u32, message: EpxStr) -> *mut EpxStatus {
    guard_value(std::ptr::null_mut(), || {
        if code == 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: plugin contract: `message` is valid for the call.
        let text = String::from_utf8_lossy(unsafe { message.as_bytes() }).into_owned();
        into_raw_status(SdkError::new(EpxStatusCode::from_raw(code), text))
    })
}

/// A host tensor described as a DLTensor; owns the shape array (and, for strings, the
/// `EpxStr` array) the DLTensor points at.
pub(crate) struct DlView {
    pub(crate) dl: DLTensor,
    _shape: Vec<i64>,
    _strings: Vec<EpxStr>,
}

impl DlView {
    /// Describes `t` (which must outlive the view and not move its buffers). A string tensor
    /// comes in the ABI 1.3 string form; `None` for a type with no form at all.
    pub(crate) fn of(t: &Tensor) -> Option<Box<DlView>> {
        let (dtype, strings) = match t.strings() {
            Some(s) => (
                epx_plugin_api::sdk::STRING_DTYPE,
                s.iter().map(|b| EpxStr::from_bytes(b)).collect::<Vec<_>>(),
            ),
            None => (t.elem_type().to_dlpack()?, Vec::new()),
        };
        let mut shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        let data = if t.strings().is_some() {
            strings.as_ptr().cast_mut().cast::<c_void>()
        } else {
            t.data_ptr().cast_mut().cast::<c_void>()
        };
        let dl = DLTensor {
            data,
            device: DLDevice::CPU,
            ndim: shape.len() as i32,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        Some(Box::new(DlView {
            dl,
            _shape: shape,
            _strings: strings,
        }))
    }
}

struct AbiAttribute<'m> {
    raw: EpxAttribute,
    _strings: Vec<EpxStr>,
    _tensor: Option<Box<DlView>>,
    /// A graph attribute's own view; `raw.graph` points at it.
    _nested: Option<Box<AbiGraph<'m>>>,
}

struct AbiNode<'m> {
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    implicit: Vec<u32>,
    opset: i64,
    attributes: Vec<AbiAttribute<'m>>,
}

struct AbiValue {
    dims: Vec<i64>,
    rank: i64,
    elem_type: i32,
    kind: u32,
    flags: u32,
    producer: u32,
    initializer: Option<Box<DlView>>,
}

/// The graph as plugins see it: C-layout descriptions of every node, value and attribute,
/// built once per session and borrowing the model.
pub(crate) struct AbiGraph<'m> {
    pub(crate) model: &'m Model,
    /// The graph shown: the model's main graph, or a nested one (an If/Loop/Scan body).
    pub(crate) graph: &'m Graph,
    nodes: Vec<AbiNode<'m>>,
    values: Vec<AbiValue>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
}

fn id32(v: Option<usize>) -> u32 {
    v.map_or(EPX_VALUE_NONE, |v| v as u32)
}

impl<'m> AbiGraph<'m> {
    pub(crate) fn new(model: &'m Model) -> Self {
        Self::of_graph(model, &model.graph)
    }

    fn of_graph(model: &'m Model, g: &'m Graph) -> Self {
        let nodes = g
            .nodes
            .iter()
            .map(|n| AbiNode {
                inputs: n.inputs.iter().map(|v| id32(*v)).collect(),
                outputs: n.outputs.iter().map(|v| id32(*v)).collect(),
                implicit: n.implicit_inputs.iter().map(|&v| v as u32).collect(),
                opset: model.opset(&n.domain).unwrap_or(0),
                attributes: n
                    .attributes
                    .iter()
                    .map(|a| abi_attribute(model, &a.name, &a.value))
                    .collect(),
            })
            .collect();
        let values = g
            .values
            .iter()
            .map(|v| {
                let dims: Vec<i64> = v
                    .shape()
                    .map(|s| {
                        s.iter()
                            .map(|d| if let Dim::Known(k) = d { *k as i64 } else { -1 })
                            .collect()
                    })
                    .unwrap_or_default();
                let mut flags = 0;
                if v.is_graph_input {
                    flags |= EPX_VALUE_GRAPH_INPUT;
                }
                if v.is_graph_output {
                    flags |= EPX_VALUE_GRAPH_OUTPUT;
                }
                if v.initializer.is_some() {
                    flags |= EPX_VALUE_INITIALIZER;
                }
                AbiValue {
                    rank: if v.shape().is_some() {
                        dims.len() as i64
                    } else {
                        -1
                    },
                    dims,
                    elem_type: v.ty.innermost_elem_type().map_or(0, ElementType::onnx_code),
                    kind: value_kind_of(&v.ty) as u32,
                    flags,
                    producer: id32(v.producer),
                    initializer: v.initializer.as_ref().and_then(DlView::of),
                }
            })
            .collect();
        AbiGraph {
            model,
            graph: g,
            inputs: g.inputs.iter().map(|&v| v as u32).collect(),
            outputs: g.outputs.iter().map(|&v| v as u32).collect(),
            nodes,
            values,
        }
    }

    pub(crate) fn as_raw(&self) -> *const EpxGraph {
        (self as *const Self).cast::<EpxGraph>()
    }
}

fn value_kind_of(ty: &ValueType) -> EpxValueKind {
    match ty {
        ValueType::Tensor { .. } => EpxValueKind::Tensor,
        ValueType::Sequence(_) => EpxValueKind::Sequence,
        ValueType::Map { .. } => EpxValueKind::Map,
        ValueType::Optional(_) => EpxValueKind::Optional,
        ValueType::SparseTensor => EpxValueKind::SparseTensor,
        ValueType::Unknown => EpxValueKind::Unknown,
    }
}

fn abi_attribute<'m>(model: &'m Model, name: &str, value: &'m AttributeValue) -> AbiAttribute<'m> {
    // SAFETY: all-zero is a valid EpxAttribute (null pointers, zero numbers).
    let mut raw: EpxAttribute = unsafe { std::mem::zeroed() };
    raw.struct_size = std::mem::size_of::<EpxAttribute>();
    raw.name = EpxStr::new(name);
    let mut strings = Vec::new();
    let mut tensor = None;
    let mut nested = None;
    raw.kind = match value {
        AttributeValue::Float(f) => {
            raw.f = *f;
            EpxAttributeKind::Float
        }
        AttributeValue::Int(i) => {
            raw.i = *i;
            EpxAttributeKind::Int
        }
        AttributeValue::String(s) => {
            raw.s = EpxStr::from_bytes(s);
            EpxAttributeKind::String
        }
        AttributeValue::Floats(v) => {
            raw.floats = v.as_ptr();
            raw.num_values = v.len();
            EpxAttributeKind::Floats
        }
        AttributeValue::Ints(v) => {
            raw.ints = v.as_ptr();
            raw.num_values = v.len();
            EpxAttributeKind::Ints
        }
        AttributeValue::Strings(v) => {
            strings = v.iter().map(|s| EpxStr::from_bytes(s)).collect();
            raw.strings = strings.as_ptr();
            raw.num_values = strings.len();
            EpxAttributeKind::Strings
        }
        AttributeValue::Tensor(t) => {
            tensor = DlView::of(t);
            raw.tensor = tensor
                .as_ref()
                .map_or(std::ptr::null(), |v| &v.dl as *const DLTensor);
            EpxAttributeKind::Tensor
        }
        AttributeValue::Graph(g) => {
            let view = Box::new(AbiGraph::of_graph(model, g));
            raw.graph = view.as_raw();
            nested = Some(view);
            EpxAttributeKind::Graph
        }
        AttributeValue::Graphs(_) => EpxAttributeKind::Graphs,
        AttributeValue::Tensors(_) => EpxAttributeKind::Tensors,
        AttributeValue::Other("sparse tensor") => EpxAttributeKind::SparseTensor,
        AttributeValue::Other(_) => EpxAttributeKind::TypeProto,
    } as u32;
    AbiAttribute {
        raw,
        _strings: strings,
        _tensor: tensor,
        _nested: nested,
    }
}

/// # Safety
/// `graph` is a handle made by [`AbiGraph::as_raw`] that is still alive.
unsafe fn abi_graph<'a>(graph: *const EpxGraph) -> Result<&'a AbiGraph<'a>, SdkError> {
    // SAFETY: the caller's contract.
    unsafe { graph.cast::<AbiGraph<'a>>().as_ref() }
        .ok_or_else(|| SdkError::invalid_argument("NULL graph handle"))
}

fn index<T>(items: &[T], i: usize, what: &str) -> Result<usize, SdkError> {
    if i < items.len() {
        Ok(i)
    } else {
        Err(SdkError::invalid_argument(format!(
            "{what} {i} out of range (the graph has {})",
            items.len()
        )))
    }
}

/// Writes `value` into a plugin-provided out-struct, never past the size the plugin declared.
///
/// # Safety
/// `out` points at a writable struct of at least `(*out).struct_size` bytes.
unsafe fn write_sized<T>(out: *mut T, value: T) -> Result<(), SdkError> {
    if out.is_null() {
        return Err(SdkError::invalid_argument("NULL out-pointer"));
    }
    // SAFETY: every ABI struct starts with `struct_size: usize` (caller's contract).
    let declared = unsafe { *out.cast::<usize>() };
    let full = std::mem::size_of::<T>();
    if declared >= full {
        // SAFETY: the plugin's struct is at least as large as ours.
        unsafe { out.write(value) };
    } else if declared >= std::mem::size_of::<usize>() {
        // An older plugin with a shorter struct: copy the prefix it knows, keeping its size.
        // SAFETY: both regions are valid for `declared` bytes and do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&value as *const T).cast::<u8>(),
                out.cast::<u8>(),
                declared,
            );
            *out.cast::<usize>() = declared;
        }
    } else {
        return Err(SdkError::invalid_argument(
            "out-struct has no valid struct_size",
        ));
    }
    Ok(())
}

unsafe extern "C" fn graph_node_count(graph: *const EpxGraph) -> usize {
    guard_value(0, || {
        // SAFETY: host API contract: the handle is one we made and is still alive.
        unsafe { abi_graph(graph) }.map_or(0, |g| g.nodes.len())
    })
}

unsafe extern "C" fn graph_value_count(graph: *const EpxGraph) -> usize {
    guard_value(0, || {
        // SAFETY: host API contract: the handle is one we made and is still alive.
        unsafe { abi_graph(graph) }.map_or(0, |g| g.values.len())
    })
}

unsafe extern "C" fn graph_node(
    graph: *const EpxGraph,
    node: u32,
    out: *mut EpxNodeInfo,
) -> *mut EpxStatus {
    guard("graph_node", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        let i = index(&g.nodes, node as usize, "node")?;
        let (n, a) = (&g.graph.nodes[i], &g.nodes[i]);
        let info = EpxNodeInfo {
            struct_size: std::mem::size_of::<EpxNodeInfo>(),
            name: EpxStr::new(&n.name),
            op_type: EpxStr::new(&n.op_type),
            domain: EpxStr::new(&n.domain),
            opset: a.opset,
            num_inputs: a.inputs.len(),
            inputs: a.inputs.as_ptr(),
            num_outputs: a.outputs.len(),
            outputs: a.outputs.as_ptr(),
            num_attributes: a.attributes.len(),
            num_implicit_inputs: a.implicit.len(),
            implicit_inputs: a.implicit.as_ptr(),
        };
        // SAFETY: plugin contract on `out`.
        unsafe { write_sized(out, info) }
    })
}

unsafe extern "C" fn graph_node_attribute(
    graph: *const EpxGraph,
    node: u32,
    index_: usize,
    out: *mut EpxAttribute,
) -> *mut EpxStatus {
    guard("graph_node_attribute", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        let n = &g.nodes[index(&g.nodes, node as usize, "node")?];
        let a = &n.attributes[index(&n.attributes, index_, "attribute")?];
        // SAFETY: EpxAttribute is plain data; this copy shares the graph-owned pointers.
        let copy = unsafe { std::ptr::read(&a.raw) };
        // SAFETY: plugin contract on `out`.
        unsafe { write_sized(out, copy) }
    })
}

unsafe extern "C" fn graph_value(
    graph: *const EpxGraph,
    value: u32,
    out: *mut EpxValueInfo,
) -> *mut EpxStatus {
    guard("graph_value", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        let i = index(&g.values, value as usize, "value")?;
        let (v, a) = (&g.graph.values[i], &g.values[i]);
        // A reader without `kind` (ABI < 1.3) would take a sequence's element type for a
        // tensor's: it sees "not known" instead.
        let sees_kind = !out.is_null()
            // SAFETY: plugin contract: `out` starts with its struct_size.
            && unsafe { (*out).struct_size } >= epx_plugin_api::epx_field_end!(EpxValueInfo, kind);
        let non_tensor =
            a.kind != EpxValueKind::Tensor as u32 && a.kind != EpxValueKind::Unknown as u32;
        let info = EpxValueInfo {
            struct_size: std::mem::size_of::<EpxValueInfo>(),
            name: EpxStr::new(&v.name),
            elem_type: if non_tensor && !sees_kind {
                0
            } else {
                a.elem_type
            },
            rank: a.rank,
            dims: a.dims.as_ptr(),
            flags: a.flags,
            producer: a.producer,
            kind: a.kind,
        };
        // SAFETY: plugin contract on `out`.
        unsafe { write_sized(out, info) }
    })
}

/// Writes a borrowed id list through a plugin's out-pointers.
fn write_ids(ids: &[u32], out_ids: *mut *const u32, out_len: *mut usize) -> Result<(), SdkError> {
    if out_ids.is_null() || out_len.is_null() {
        return Err(SdkError::invalid_argument("NULL out-pointer"));
    }
    // SAFETY: both checked non-null; the plugin passes writable out-parameters.
    unsafe {
        *out_ids = ids.as_ptr();
        *out_len = ids.len();
    }
    Ok(())
}

unsafe extern "C" fn graph_inputs(
    graph: *const EpxGraph,
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> *mut EpxStatus {
    guard("graph_inputs", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        write_ids(&g.inputs, out_ids, out_len)
    })
}

unsafe extern "C" fn graph_outputs(
    graph: *const EpxGraph,
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> *mut EpxStatus {
    guard("graph_outputs", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        write_ids(&g.outputs, out_ids, out_len)
    })
}

unsafe extern "C" fn graph_initializer(
    graph: *const EpxGraph,
    value: u32,
    out: *mut DLTensor,
) -> *mut EpxStatus {
    guard("graph_initializer", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        let i = index(&g.values, value as usize, "value")?;
        let view = g.values[i].initializer.as_ref().ok_or_else(|| {
            SdkError::invalid_argument(format!(
                "value `{}` is not an initializer with tensor data",
                g.graph.values[i].name
            ))
        })?;
        if out.is_null() {
            return Err(SdkError::invalid_argument("NULL out-pointer"));
        }
        // SAFETY: `out` is a writable DLTensor (plugin contract); DLTensor is plain data.
        unsafe { out.write(std::ptr::read(&view.dl)) };
        Ok(())
    })
}

unsafe extern "C" fn graph_serialize_subgraph(
    graph: *const EpxGraph,
    subgraph: *const EpxSubgraph,
    out: *mut EpxBuffer,
) -> *mut EpxStatus {
    guard("graph_serialize_subgraph", || {
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        // SAFETY: plugin contract: the subgraph is valid for the call.
        let sub = unsafe { subgraph.as_ref() }
            .ok_or_else(|| SdkError::invalid_argument("NULL subgraph"))?;
        // SAFETY: as above.
        let view = unsafe { epx_plugin_api::sdk::SubgraphView::from_raw(sub) };
        let bytes = crate::onnx::save::subgraph_model_bytes(
            g.model,
            g.graph,
            view.nodes,
            view.inputs,
            view.outputs,
        )
        .map_err(|e| SdkError::invalid_argument(e.to_string()))?;
        if out.is_null() {
            return Err(SdkError::invalid_argument("NULL out-pointer"));
        }
        let mut boxed = bytes.into_boxed_slice();
        let (data, len) = (boxed.as_mut_ptr(), boxed.len());
        std::mem::forget(boxed);
        // SAFETY: `out` is a writable EpxBuffer (plugin contract).
        unsafe {
            (*out).data = data;
            (*out).len = len;
            (*out).release = Some(release_buffer);
            (*out).private_data = std::ptr::null_mut();
        }
        Ok(())
    })
}

unsafe extern "C" fn release_buffer(buffer: *mut EpxBuffer) {
    guard_value((), || {
        // SAFETY: buffers with this release function hold a leaked Box<[u8]> of `len` bytes.
        unsafe {
            if let Some(b) = buffer.as_mut() {
                if !b.data.is_null() {
                    drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                        b.data, b.len,
                    )));
                    b.data = std::ptr::null_mut();
                    b.len = 0;
                }
            }
        }
    })
}

/// A tensor handed to a plugin for one call: a host tensor's view (owning its shape array) or
/// a device tensor's descriptor.
pub(crate) enum CallTensor {
    Host(Box<DlView>),
    Device(Box<DLTensor>),
}

impl CallTensor {
    fn dl_mut(&mut self) -> &mut DLTensor {
        match self {
            CallTensor::Host(v) => &mut v.dl,
            CallTensor::Device(d) => d,
        }
    }
}

/// What an `EpxValue *` points at. Handles the host hands out borrow the session's values;
/// handles a plugin makes (`value_new_*`) own theirs until handed over.
pub(crate) struct ValueHandle {
    made_by_plugin: bool,
    node: HandleNode,
}

enum HandleNode {
    /// `view` points into `owned` or into a session value that outlives the handle.
    Tensor {
        view: Box<DlView>,
        owned: Option<Tensor>,
    },
    Sequence {
        elem_type: Option<ElementType>,
        items: Vec<ValueHandle>,
    },
    Map {
        keys: Box<ValueHandle>,
        values: Box<ValueHandle>,
    },
    Optional(Option<Box<ValueHandle>>),
}

impl ValueHandle {
    /// Describes a host value for a plugin to read; the value must outlive the handle.
    fn borrow(v: &Value) -> Result<Box<ValueHandle>, String> {
        let node = match v {
            Value::Host(t) => HandleNode::Tensor {
                view: DlView::of(t)
                    .ok_or_else(|| format!("{} tensors cannot cross the ABI", t.elem_type()))?,
                owned: None,
            },
            Value::Device(_) => {
                return Err("a device tensor is read with kernel_input, not as a value".into());
            }
            Value::Sequence(s) => HandleNode::Sequence {
                elem_type: s.elem_type(),
                items: s
                    .items()
                    .iter()
                    .map(|v| ValueHandle::borrow(v).map(|h| *h))
                    .collect::<Result<_, _>>()?,
            },
            Value::Map(m) => HandleNode::Map {
                keys: ValueHandle::borrow_tensor(m.keys())?,
                values: ValueHandle::borrow_tensor(m.values())?,
            },
            Value::Optional(v) => HandleNode::Optional(match v {
                Some(v) => Some(ValueHandle::borrow(v)?),
                None => None,
            }),
        };
        Ok(Box::new(ValueHandle {
            made_by_plugin: false,
            node,
        }))
    }

    fn borrow_tensor(t: &Tensor) -> Result<Box<ValueHandle>, String> {
        Ok(Box::new(ValueHandle {
            made_by_plugin: false,
            node: HandleNode::Tensor {
                view: DlView::of(t)
                    .ok_or_else(|| format!("{} tensors cannot cross the ABI", t.elem_type()))?,
                owned: None,
            },
        }))
    }

    fn owned_tensor(t: Tensor) -> Result<Box<ValueHandle>, SdkError> {
        let view = DlView::of(&t)
            .ok_or_else(|| SdkError::not_implemented(format!("{} values", t.elem_type())))?;
        Ok(Box::new(ValueHandle {
            made_by_plugin: true,
            node: HandleNode::Tensor {
                view,
                owned: Some(t),
            },
        }))
    }

    /// The handle as part of another value: the plugin may still read it (through the value
    /// holding it) but no longer hand it over or release it.
    fn into_part(self) -> ValueHandle {
        ValueHandle {
            made_by_plugin: false,
            node: self.node,
        }
    }

    fn kind(&self) -> EpxValueKind {
        match self.node {
            HandleNode::Tensor { .. } => EpxValueKind::Tensor,
            HandleNode::Sequence { .. } => EpxValueKind::Sequence,
            HandleNode::Map { .. } => EpxValueKind::Map,
            HandleNode::Optional(_) => EpxValueKind::Optional,
        }
    }

    /// The host value a plugin built.
    fn into_value(self) -> Result<Value, SdkError> {
        let bad = |m: &str| SdkError::invalid_argument(m.to_string());
        Ok(match self.node {
            HandleNode::Tensor { owned: Some(t), .. } => Value::Host(t),
            HandleNode::Tensor { owned: None, .. } => {
                return Err(bad(
                    "a value the host lent cannot be handed back as an output",
                ));
            }
            HandleNode::Sequence { elem_type, items } => {
                let items = items
                    .into_iter()
                    .map(ValueHandle::into_value)
                    .collect::<Result<Vec<_>, _>>()?;
                Value::Sequence(
                    Sequence::new(elem_type, items)
                        .map_err(|e| SdkError::invalid_argument(e.to_string()))?,
                )
            }
            HandleNode::Map { keys, values } => {
                let tensor = |h: Box<ValueHandle>| match h.into_value()? {
                    Value::Host(t) => Ok(t),
                    _ => Err(bad("map keys and values must be tensors")),
                };
                Value::Map(
                    Map::new(tensor(keys)?, tensor(values)?)
                        .map_err(|e| SdkError::invalid_argument(e.to_string()))?,
                )
            }
            HandleNode::Optional(v) => Value::Optional(match v {
                Some(v) => Some(Box::new(v.into_value()?)),
                None => None,
            }),
        })
    }
}

/// # Safety
/// `v` is NULL or a live handle.
unsafe fn handle<'a>(v: *const EpxValue) -> Result<&'a ValueHandle, SdkError> {
    // SAFETY: the caller's contract.
    unsafe { v.cast::<ValueHandle>().as_ref() }
        .ok_or_else(|| SdkError::invalid_argument("NULL value"))
}

/// Takes over a value a plugin made.
///
/// # Safety
/// `v` is NULL or a live handle, not used by the caller afterwards.
unsafe fn take_handle(v: *mut EpxValue) -> Result<Box<ValueHandle>, SdkError> {
    // SAFETY: the caller's contract.
    let h = unsafe { handle(v) }?;
    if !h.made_by_plugin {
        return Err(SdkError::invalid_argument(
            "this value belongs to the host (it was lent for the call); only values made with \
             value_new_* can be handed over",
        ));
    }
    // SAFETY: made by `Box::into_raw` in a `value_new_*` function and owned by the caller.
    Ok(unsafe { Box::from_raw(v.cast::<ValueHandle>()) })
}

fn out_ptr<T>(out: *mut T) -> Result<*mut T, SdkError> {
    if out.is_null() {
        Err(SdkError::invalid_argument("NULL out-pointer"))
    } else {
        Ok(out)
    }
}

/// One input of a kernel call: the session's value, its tensor view when it is a tensor, and
/// (made when a plugin first asks) its value handle.
struct CallInput<'t> {
    value: &'t Value,
    tensor: Option<CallTensor>,
    handle: Option<Box<ValueHandle>>,
}

/// One kernel call's inputs and the outputs the kernel produced.
pub(crate) struct KernelCall<'t> {
    inputs: Vec<Option<CallInput<'t>>>,
    pub(crate) outputs: Vec<Option<(Value, Option<CallTensor>)>>,
    /// Where outputs are allocated: `None` for host memory, else the device EP.
    device: Option<&'t Arc<ProviderInstance>>,
}

impl<'t> KernelCall<'t> {
    /// Inputs borrow `inputs` for the call; outputs go to `device`'s memory, or the host's.
    /// `abi_minor` is the plugin's: strings and non-tensor values reach plugins of 1.3 on.
    pub(crate) fn new(
        inputs: &[Option<&'t Value>],
        num_outputs: usize,
        device: Option<&'t Arc<ProviderInstance>>,
        abi_minor: u32,
    ) -> Result<Self, String> {
        let mut call_inputs = Vec::with_capacity(inputs.len());
        for v in inputs {
            call_inputs.push(match v {
                None => None,
                Some(value) => {
                    let old = abi_minor < ElementType::String.since_abi_minor();
                    let tensor = match value {
                        Value::Host(t) if old && t.elem_type() == ElementType::String => {
                            return Err(format!(
                                "a string tensor cannot reach a plugin built for ABI 1.{abi_minor} \
                                 (strings cross from ABI 1.3)"
                            ));
                        }
                        Value::Host(t) => {
                            Some(CallTensor::Host(DlView::of(t).ok_or_else(|| {
                                format!("{} tensors cannot cross the plugin ABI", t.elem_type())
                            })?))
                        }
                        Value::Device(t) => Some(CallTensor::Device(Box::new(t.dl()))),
                        other if old => {
                            return Err(format!(
                                "a {} cannot reach a plugin built for ABI 1.{abi_minor} \
                                 (sequences, maps and optionals cross from ABI 1.3)",
                                other.type_name()
                            ));
                        }
                        _ => None,
                    };
                    Some(CallInput {
                        value,
                        tensor,
                        handle: None,
                    })
                }
            });
        }
        Ok(KernelCall {
            inputs: call_inputs,
            outputs: (0..num_outputs).map(|_| None).collect(),
            device,
        })
    }

    pub(crate) fn as_raw(&mut self) -> *mut EpxKernelContext {
        (self as *mut Self).cast::<EpxKernelContext>()
    }

    /// Allocates output storage where this call's EP keeps its tensors.
    fn allocate(
        &self,
        elem: ElementType,
        shape: &[usize],
    ) -> Result<(Value, Option<CallTensor>), SdkError> {
        let oom = |e: crate::error::Error| SdkError::new(EpxStatusCode::OutOfMemory, e.to_string());
        match self.device {
            None => {
                let tensor = Tensor::zeros(elem, shape).map_err(oom)?;
                let view = DlView::of(&tensor)
                    .ok_or_else(|| SdkError::not_implemented(format!("{elem} outputs")))?;
                Ok((Value::Host(tensor), Some(CallTensor::Host(view))))
            }
            Some(p) => {
                let t = DeviceTensor::allocate(p, elem, shape).map_err(oom)?;
                let dl = Box::new(t.dl());
                Ok((Value::Device(t), Some(CallTensor::Device(dl))))
            }
        }
    }

    fn free_output(&self, i: usize) -> Result<(), SdkError> {
        if self.outputs[i].is_some() {
            return Err(SdkError::invalid_argument(format!(
                "output {i} was already produced in this call"
            )));
        }
        Ok(())
    }
}

/// # Safety
/// `ctx` was made by [`KernelCall::as_raw`] for the call in progress.
unsafe fn call<'a>(ctx: *const EpxKernelContext) -> Result<&'a mut KernelCall<'a>, SdkError> {
    // SAFETY: the caller's contract; the host does not touch the call while the kernel runs.
    unsafe { ctx.cast_mut().cast::<KernelCall<'a>>().as_mut() }
        .ok_or_else(|| SdkError::invalid_argument("NULL kernel context"))
}

unsafe extern "C" fn kernel_input_count(ctx: *const EpxKernelContext) -> usize {
    // SAFETY: host API contract.
    guard_value(0, || unsafe { call(ctx) }.map_or(0, |c| c.inputs.len()))
}

unsafe extern "C" fn kernel_output_count(ctx: *const EpxKernelContext) -> usize {
    // SAFETY: host API contract.
    guard_value(0, || unsafe { call(ctx) }.map_or(0, |c| c.outputs.len()))
}

unsafe extern "C" fn kernel_input(
    ctx: *const EpxKernelContext,
    index_: usize,
    out: *mut *const DLTensor,
) -> *mut EpxStatus {
    guard("kernel_input", || {
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.inputs, index_, "input")?;
        let out = out_ptr(out)?;
        let p = match c.inputs[i].as_mut() {
            None => std::ptr::null(),
            Some(CallInput {
                tensor: Some(t), ..
            }) => t.dl_mut() as *const DLTensor,
            Some(input) => {
                return Err(SdkError::invalid_argument(format!(
                    "input {i} is a {}, not a tensor: read it with kernel_input_value",
                    input.value.type_name()
                )));
            }
        };
        // SAFETY: `out` checked non-null.
        unsafe { *out = p };
        Ok(())
    })
}

unsafe extern "C" fn kernel_input_value(
    ctx: *const EpxKernelContext,
    index_: usize,
    out: *mut *const EpxValue,
) -> *mut EpxStatus {
    guard("kernel_input_value", || {
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.inputs, index_, "input")?;
        let out = out_ptr(out)?;
        let p = match c.inputs[i].as_mut() {
            None => std::ptr::null(),
            Some(input) => {
                if input.handle.is_none() {
                    input.handle =
                        Some(ValueHandle::borrow(input.value).map_err(SdkError::invalid_argument)?);
                }
                input.handle.as_deref().map_or(std::ptr::null(), |h| {
                    (h as *const ValueHandle).cast::<EpxValue>()
                })
            }
        };
        // SAFETY: `out` checked non-null; the handle lives until the call ends.
        unsafe { *out = p };
        Ok(())
    })
}

unsafe extern "C" fn kernel_output(
    ctx: *mut EpxKernelContext,
    index_: usize,
    dtype: DLDataType,
    ndim: i32,
    shape: *const i64,
    out: *mut *mut DLTensor,
) -> *mut EpxStatus {
    guard("kernel_output", || {
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.outputs, index_, "output")?;
        c.free_output(i)?;
        if epx_plugin_api::sdk::is_string_dtype(dtype) {
            return Err(SdkError::not_implemented(
                "string outputs are made with value_new_tensor and set with kernel_output_value",
            ));
        }
        let elem = ElementType::from_dlpack(dtype).ok_or_else(|| {
            SdkError::not_implemented(format!(
                "output dtype (code {}, bits {}, lanes {})",
                dtype.code, dtype.bits, dtype.lanes
            ))
        })?;
        // SAFETY: plugin contract: `shape` holds `ndim` extents.
        let ushape = unsafe { read_shape(ndim, shape) }?;
        let out = out_ptr(out)?;
        let (value, mut view) = c.allocate(elem, &ushape)?;
        let p: *mut DLTensor = view
            .as_mut()
            .map_or(std::ptr::null_mut(), |v| v.dl_mut() as *mut DLTensor);
        c.outputs[i] = Some((value, view));
        // SAFETY: `out` checked non-null; the DLTensor lives in the call until it ends.
        unsafe { *out = p };
        Ok(())
    })
}

/// # Safety
/// `shape` is NULL or points at `ndim` extents.
unsafe fn read_shape(ndim: i32, shape: *const i64) -> Result<Vec<usize>, SdkError> {
    let ndim = usize::try_from(ndim)
        .map_err(|_| SdkError::invalid_argument(format!("negative ndim {ndim}")))?;
    let dims: &[i64] = if ndim == 0 {
        &[]
    } else if shape.is_null() {
        return Err(SdkError::invalid_argument("NULL shape"));
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(shape, ndim) }
    };
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                SdkError::invalid_argument(format!("negative extent {d} in shape {dims:?}"))
            })
        })
        .collect()
}

unsafe extern "C" fn kernel_output_value(
    ctx: *mut EpxKernelContext,
    index_: usize,
    value: *mut EpxValue,
) -> *mut EpxStatus {
    guard("kernel_output_value", || {
        // SAFETY: plugin contract: `value` is a value it made and hands over.
        let v = unsafe { take_handle(value) }?;
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.outputs, index_, "output")?;
        c.free_output(i)?;
        if c.device.is_some() {
            return Err(SdkError::invalid_argument(
                "an EP with its own memory produces tensors with kernel_output",
            ));
        }
        c.outputs[i] = Some((v.into_value()?, None));
        Ok(())
    })
}

unsafe extern "C" fn value_kind(value: *const EpxValue) -> u32 {
    guard_value(0, || {
        // SAFETY: host API contract: `value` is NULL or a live handle.
        unsafe { handle(value) }.map_or(0, |h| h.kind() as u32)
    })
}

unsafe extern "C" fn value_tensor(
    value: *const EpxValue,
    out: *mut *const DLTensor,
) -> *mut EpxStatus {
    guard("value_tensor", || {
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let out = out_ptr(out)?;
        let HandleNode::Tensor { view, .. } = &h.node else {
            return Err(SdkError::invalid_argument("the value is not a tensor"));
        };
        // SAFETY: `out` checked non-null; the view lives as long as the handle.
        unsafe { *out = &view.dl };
        Ok(())
    })
}

unsafe extern "C" fn value_sequence(
    value: *const EpxValue,
    len: *mut usize,
    elem_type: *mut i32,
) -> *mut EpxStatus {
    guard("value_sequence", || {
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Sequence {
            elem_type: ty,
            items,
        } = &h.node
        else {
            return Err(SdkError::invalid_argument("the value is not a sequence"));
        };
        let (len, elem_type) = (out_ptr(len)?, out_ptr(elem_type)?);
        // SAFETY: both checked non-null.
        unsafe {
            *len = items.len();
            *elem_type = ty.map_or(0, ElementType::onnx_code);
        }
        Ok(())
    })
}

unsafe extern "C" fn value_sequence_at(
    value: *const EpxValue,
    index_: usize,
    out: *mut *const EpxValue,
) -> *mut EpxStatus {
    guard("value_sequence_at", || {
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Sequence { items, .. } = &h.node else {
            return Err(SdkError::invalid_argument("the value is not a sequence"));
        };
        let i = index(items, index_, "sequence item")?;
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-null; the item lives as long as the sequence.
        unsafe { *out = (&items[i] as *const ValueHandle).cast::<EpxValue>() };
        Ok(())
    })
}

unsafe extern "C" fn value_map(
    value: *const EpxValue,
    keys: *mut *const EpxValue,
    values: *mut *const EpxValue,
) -> *mut EpxStatus {
    guard("value_map", || {
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Map { keys: k, values: v } = &h.node else {
            return Err(SdkError::invalid_argument("the value is not a map"));
        };
        let (keys, values) = (out_ptr(keys)?, out_ptr(values)?);
        // SAFETY: both checked non-null; the parts live as long as the map.
        unsafe {
            *keys = (&**k as *const ValueHandle).cast::<EpxValue>();
            *values = (&**v as *const ValueHandle).cast::<EpxValue>();
        }
        Ok(())
    })
}

unsafe extern "C" fn value_optional(
    value: *const EpxValue,
    out: *mut *const EpxValue,
) -> *mut EpxStatus {
    guard("value_optional", || {
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Optional(inner) = &h.node else {
            return Err(SdkError::invalid_argument("the value is not an optional"));
        };
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-null; the inner value lives as long as the optional.
        unsafe {
            *out = inner.as_deref().map_or(std::ptr::null(), |v| {
                (v as *const ValueHandle).cast::<EpxValue>()
            })
        };
        Ok(())
    })
}

/// Hands a new handle to the plugin.
fn give(h: Box<ValueHandle>, out: *mut *mut EpxValue) -> Result<(), SdkError> {
    let out = out_ptr(out)?;
    // SAFETY: `out` checked non-null.
    unsafe { *out = Box::into_raw(h).cast::<EpxValue>() };
    Ok(())
}

unsafe extern "C" fn value_new_tensor(
    dtype: DLDataType,
    ndim: i32,
    shape: *const i64,
    data: *const c_void,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    guard("value_new_tensor", || {
        // SAFETY: plugin contract: `shape` holds `ndim` extents.
        let ushape = unsafe { read_shape(ndim, shape) }?;
        let count = ushape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| SdkError::invalid_argument(format!("shape {ushape:?} overflows")))?;
        let bad = |e: crate::error::Error| SdkError::invalid_argument(e.to_string());
        let tensor = if epx_plugin_api::sdk::is_string_dtype(dtype) {
            let strings = if count == 0 || data.is_null() {
                let mut v = Vec::new();
                v.try_reserve_exact(count).map_err(|_| {
                    SdkError::new(
                        EpxStatusCode::OutOfMemory,
                        format!("{count} strings do not fit in memory"),
                    )
                })?;
                v.resize(count, Vec::new());
                v
            } else {
                // SAFETY: plugin contract: `data` points at `count` EpxStr, each valid.
                unsafe {
                    std::slice::from_raw_parts(data.cast::<EpxStr>(), count)
                        .iter()
                        .map(|s| s.as_bytes().to_vec())
                        .collect()
                }
            };
            Tensor::from_strings(&ushape, strings).map_err(bad)?
        } else {
            let elem = ElementType::from_dlpack(dtype).ok_or_else(|| {
                SdkError::not_implemented(format!(
                    "dtype (code {}, bits {}, lanes {})",
                    dtype.code, dtype.bits, dtype.lanes
                ))
            })?;
            let mut t = Tensor::zeros(elem, &ushape)
                .map_err(|e| SdkError::new(EpxStatusCode::OutOfMemory, e.to_string()))?;
            if !data.is_null() {
                let bytes = t
                    .bytes_mut()
                    .ok_or_else(|| SdkError::not_implemented(format!("{elem} values")))?;
                // SAFETY: plugin contract: `data` holds the tensor's bytes, C order.
                let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), bytes.len()) };
                if elem == ElementType::Bool && src.iter().any(|&b| b > 1) {
                    return Err(SdkError::invalid_argument(
                        "a bool tensor holds a byte other than 0 or 1",
                    ));
                }
                bytes.copy_from_slice(src);
            }
            t
        };
        give(ValueHandle::owned_tensor(tensor)?, out)
    })
}

unsafe extern "C" fn value_new_sequence(
    elem_type: i32,
    items: *const *mut EpxValue,
    num_items: usize,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    guard("value_new_sequence", || {
        let raw: &[*mut EpxValue] = if num_items == 0 {
            &[]
        } else if items.is_null() {
            return Err(SdkError::invalid_argument("NULL items"));
        } else {
            // SAFETY: plugin contract: `items` holds `num_items` values.
            unsafe { std::slice::from_raw_parts(items, num_items) }
        };
        // Every item is taken over, also when one of them is refused; one given twice is taken
        // once (freeing it twice would corrupt the heap).
        let mut taken = Vec::with_capacity(raw.len());
        let mut refused = None;
        let mut seen = std::collections::HashSet::with_capacity(raw.len());
        for &v in raw {
            if !seen.insert(v) {
                refused = refused.or(Some(SdkError::invalid_argument(
                    "a value is given twice in one sequence",
                )));
                continue;
            }
            // SAFETY: plugin contract: each is a value it made and hands over.
            match unsafe { take_handle(v) } {
                Ok(h) => taken.push((*h).into_part()),
                Err(e) => refused = refused.or(Some(e)),
            }
        }
        if let Some(e) = refused {
            return Err(e);
        }
        let elem = match elem_type {
            0 => None,
            code => Some(ElementType::from_onnx(code).ok_or_else(|| {
                SdkError::invalid_argument(format!("unknown element type {code}"))
            })?),
        };
        for h in &taken {
            if let (HandleNode::Tensor { view, .. }, Some(want)) = (&h.node, elem) {
                let have = if epx_plugin_api::sdk::is_string_dtype(view.dl.dtype) {
                    Some(ElementType::String)
                } else {
                    ElementType::from_dlpack(view.dl.dtype)
                };
                if have != Some(want) {
                    return Err(SdkError::invalid_argument(format!(
                        "a sequence of {want} tensors cannot hold a {} tensor",
                        have.map_or("?".into(), |t| t.to_string())
                    )));
                }
            }
        }
        give(
            Box::new(ValueHandle {
                made_by_plugin: true,
                node: HandleNode::Sequence {
                    elem_type: elem,
                    items: taken,
                },
            }),
            out,
        )
    })
}

unsafe extern "C" fn value_new_map(
    keys: *mut EpxValue,
    values: *mut EpxValue,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    guard("value_new_map", || {
        if keys == values {
            // SAFETY: plugin contract: a value it made and hands over (taken once).
            drop(unsafe { take_handle(keys) });
            return Err(SdkError::invalid_argument(
                "a map's keys and values must be two values",
            ));
        }
        // SAFETY: plugin contract: both are values it made and hands over.
        let (k, v) = unsafe { (take_handle(keys), take_handle(values)) };
        let (k, v) = (Box::new((*k?).into_part()), Box::new((*v?).into_part()));
        // Checked here, where the plugin can be told, rather than at the output.
        fn tensor(h: &ValueHandle) -> Result<&Tensor, SdkError> {
            match &h.node {
                HandleNode::Tensor { owned: Some(t), .. } => Ok(t),
                _ => Err(SdkError::invalid_argument(
                    "map keys and values must be tensors",
                )),
            }
        }
        Map::check(tensor(&k)?, tensor(&v)?)
            .map_err(|e| SdkError::invalid_argument(e.to_string()))?;
        give(
            Box::new(ValueHandle {
                made_by_plugin: true,
                node: HandleNode::Map { keys: k, values: v },
            }),
            out,
        )
    })
}

unsafe extern "C" fn value_new_optional(
    value: *mut EpxValue,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    guard("value_new_optional", || {
        let inner = if value.is_null() {
            None
        } else {
            // SAFETY: plugin contract: a value it made and hands over.
            Some(Box::new((*unsafe { take_handle(value) }?).into_part()))
        };
        give(
            Box::new(ValueHandle {
                made_by_plugin: true,
                node: HandleNode::Optional(inner),
            }),
            out,
        )
    })
}

unsafe extern "C" fn value_release(value: *mut EpxValue) {
    guard_value((), || {
        if value.is_null() {
            return;
        }
        // SAFETY: plugin contract: a value it made and has not handed over.
        match unsafe { take_handle(value) } {
            Ok(h) => drop(h),
            Err(e) => tracing::warn!(target: "epx::plugin", "value_release: {e}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new int64 tensor value `[v]`, owned by the caller.
    fn scalar_value(v: i64) -> *mut EpxValue {
        let mut out = std::ptr::null_mut();
        let shape = [1i64];
        // SAFETY: shape holds 1 extent and data one i64, both alive for the call.
        let status = unsafe {
            value_new_tensor(
                ElementType::Int64.to_dlpack().unwrap(),
                1,
                shape.as_ptr(),
                (&v as *const i64).cast(),
                &mut out,
            )
        };
        assert!(status.is_null());
        out
    }

    fn failed(status: *mut EpxStatus) -> bool {
        // SAFETY: a status from a host function.
        unsafe { epx_plugin_api::sdk::take_status(status) }.is_err()
    }

    #[test]
    fn values_handed_over_twice_or_from_inside_another_are_refused_not_freed() {
        // One value twice in a sequence: refused, taken once.
        let a = scalar_value(1);
        let mut seq = std::ptr::null_mut();
        // SAFETY: two pointers to one live value; the call takes it (once).
        assert!(failed(unsafe {
            value_new_sequence(0, [a, a].as_ptr(), 2, &mut seq)
        }));
        assert!(seq.is_null());

        // An item read back from a sequence is part of it: releasing or handing it over fails
        // and leaves it to the sequence, which frees it once.
        let b = scalar_value(2);
        // SAFETY: one live value, handed over.
        assert!(!failed(unsafe {
            value_new_sequence(0, [b].as_ptr(), 1, &mut seq)
        }));
        let mut item: *const EpxValue = std::ptr::null();
        // SAFETY: a live sequence of one item.
        assert!(!failed(unsafe { value_sequence_at(seq, 0, &mut item) }));
        let mut opt = std::ptr::null_mut();
        // SAFETY: `item` is live (inside `seq`); the call must refuse it.
        assert!(failed(unsafe {
            value_new_optional(item.cast_mut(), &mut opt)
        }));
        // SAFETY: as above; a no-op with a warning.
        unsafe { value_release(item.cast_mut()) };
        // SAFETY: the sequence is the caller's; it still holds its item.
        assert!(!failed(unsafe { value_sequence_at(seq, 0, &mut item) }));
        let mut t: *const DLTensor = std::ptr::null();
        // SAFETY: a live tensor value.
        assert!(!failed(unsafe { value_tensor(item, &mut t) }));
        // SAFETY: `t` points at one int64.
        assert_eq!(unsafe { *(*t).data.cast::<i64>() }, 2);
        // SAFETY: owned by the caller, released once.
        unsafe { value_release(seq) };

        // A map of one value as both keys and values: refused.
        let k = scalar_value(3);
        let mut map = std::ptr::null_mut();
        // SAFETY: one live value twice; taken once.
        assert!(failed(unsafe { value_new_map(k, k, &mut map) }));
    }
}
