//! The graph view a plugin reads: nodes, values, attributes and initializers of one model,
//! in the ABI's form, and the callbacks over it.

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::DLTensor;
use epx_plugin_api::ffi_boundary;
use epx_plugin_api::sdk::Error as SdkError;

use super::args::{index, write_sized};
use crate::model::ir::{AttributeValue, Dim, Graph, Model, ValueType};
use crate::value::{DlView, ElementType};

pub(super) struct AbiAttribute<'m> {
    raw: EpxAttribute,
    _strings: Vec<EpxStr>,
    _tensor: Option<Box<DlView>>,
    /// A graph attribute's own view; `raw.graph` points at it.
    _nested: Option<Box<AbiGraph<'m>>>,
}

pub(super) struct AbiNode<'m> {
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    implicit: Vec<u32>,
    opset: i64,
    attributes: Vec<AbiAttribute<'m>>,
}

pub(super) struct AbiValue {
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

pub(super) fn id32(v: Option<usize>) -> u32 {
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
                    initializer: v.initializer.as_deref().and_then(DlView::of),
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

pub(super) fn value_kind_of(ty: &ValueType) -> EpxValueKind {
    match ty {
        ValueType::Tensor { .. } => EpxValueKind::Tensor,
        ValueType::Sequence(_) => EpxValueKind::Sequence,
        ValueType::Map { .. } => EpxValueKind::Map,
        ValueType::Optional(_) => EpxValueKind::Optional,
        ValueType::SparseTensor => EpxValueKind::SparseTensor,
        ValueType::Unknown => EpxValueKind::Unknown,
    }
}

pub(super) fn abi_attribute<'m>(
    model: &'m Model,
    name: &str,
    value: &'m AttributeValue,
) -> AbiAttribute<'m> {
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
pub(super) unsafe fn abi_graph<'a>(graph: *const EpxGraph) -> Result<&'a AbiGraph<'a>, SdkError> {
    // SAFETY: the caller's contract.
    unsafe { graph.cast::<AbiGraph<'a>>().as_ref() }
        .ok_or_else(|| SdkError::invalid_argument("NULL graph handle"))
}

pub(super) unsafe extern "C" fn graph_node_count(graph: *const EpxGraph) -> usize {
    ffi_boundary!({
        // SAFETY: host API contract: the handle is one we made and is still alive.
        unsafe { abi_graph(graph) }.map_or(0, |g| g.nodes.len())
    })
}

pub(super) unsafe extern "C" fn graph_value_count(graph: *const EpxGraph) -> usize {
    ffi_boundary!({
        // SAFETY: host API contract: the handle is one we made and is still alive.
        unsafe { abi_graph(graph) }.map_or(0, |g| g.values.len())
    })
}

pub(super) unsafe extern "C" fn graph_node(
    graph: *const EpxGraph,
    node: u32,
    out: *mut EpxNodeInfo,
) -> *mut EpxStatus {
    ffi_boundary!({
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

pub(super) unsafe extern "C" fn graph_node_attribute(
    graph: *const EpxGraph,
    node: u32,
    index_: usize,
    out: *mut EpxAttribute,
) -> *mut EpxStatus {
    ffi_boundary!({
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

pub(super) unsafe extern "C" fn graph_value(
    graph: *const EpxGraph,
    value: u32,
    out: *mut EpxValueInfo,
) -> *mut EpxStatus {
    ffi_boundary!({
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
pub(super) fn write_ids(
    ids: &[u32],
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> Result<(), SdkError> {
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

pub(super) unsafe extern "C" fn graph_inputs(
    graph: *const EpxGraph,
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        write_ids(&g.inputs, out_ids, out_len)
    })
}

pub(super) unsafe extern "C" fn graph_outputs(
    graph: *const EpxGraph,
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        write_ids(&g.outputs, out_ids, out_len)
    })
}

pub(super) unsafe extern "C" fn graph_initializer(
    graph: *const EpxGraph,
    value: u32,
    out: *mut DLTensor,
) -> *mut EpxStatus {
    ffi_boundary!({
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
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn graph_serialize_subgraph(
    graph: *const EpxGraph,
    subgraph: *const EpxSubgraph,
    out: *mut EpxBuffer,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { abi_graph(graph) }?;
        // SAFETY: plugin contract: the subgraph is valid for the call.
        let sub = unsafe { subgraph.as_ref() }
            .ok_or_else(|| SdkError::invalid_argument("NULL subgraph"))?;
        // SAFETY: as above.
        let view = unsafe { epx_plugin_api::sdk::SubgraphView::from_raw(sub) };
        let bytes = crate::model::onnx::save::subgraph_model_bytes(
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
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn release_buffer(buffer: *mut EpxBuffer) {
    ffi_boundary!({
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
