//! The host's half of the ABI: the function table every plugin receives, the graph handle it
//! reads through it, and the per-call kernel context.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::{DLDataType, DLDevice, DLTensor};
use epx_plugin_api::sdk::{Error as SdkError, guard, guard_value, into_raw_status};

use std::sync::Arc;

use crate::device::{DeviceTensor, Value};
use crate::ir::{AttributeValue, Dim, Graph, Model};
use crate::plugin::ProviderInstance;
use crate::tensor::{ElementType, Tensor};

static HOST_VERSION: &std::ffi::CStr = c"0.1.0";

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

/// A host tensor described as a DLTensor; owns the shape array the DLTensor points at.
pub(crate) struct DlView {
    pub(crate) dl: DLTensor,
    _shape: Vec<i64>,
}

impl DlView {
    /// Describes `t` (which must outlive the view and not move its buffer). `None` for strings.
    pub(crate) fn of(t: &Tensor) -> Option<Box<DlView>> {
        let dtype = t.elem_type().to_dlpack()?;
        let mut shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        let dl = DLTensor {
            data: t.data_ptr().cast_mut().cast::<c_void>(),
            device: DLDevice::CPU,
            ndim: shape.len() as i32,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        Some(Box::new(DlView { dl, _shape: shape }))
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
                    elem_type: v.elem_type().map_or(0, ElementType::onnx_code),
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
        let info = EpxValueInfo {
            struct_size: std::mem::size_of::<EpxValueInfo>(),
            name: EpxStr::new(&v.name),
            elem_type: a.elem_type,
            rank: a.rank,
            dims: a.dims.as_ptr(),
            flags: a.flags,
            producer: a.producer,
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
                "value `{}` is not an initializer with numeric data",
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
    fn of(v: &Value) -> Result<CallTensor, String> {
        Ok(match v {
            Value::Host(t) => {
                CallTensor::Host(DlView::of(t).ok_or_else(|| {
                    format!("{} tensors cannot cross the plugin ABI", t.elem_type())
                })?)
            }
            Value::Device(t) => CallTensor::Device(Box::new(t.dl())),
        })
    }

    fn dl_mut(&mut self) -> &mut DLTensor {
        match self {
            CallTensor::Host(v) => &mut v.dl,
            CallTensor::Device(d) => d,
        }
    }
}

/// One kernel call's inputs and the outputs the kernel allocated.
pub(crate) struct KernelCall<'t> {
    inputs: Vec<Option<CallTensor>>,
    pub(crate) outputs: Vec<Option<(Value, CallTensor)>>,
    /// Where outputs are allocated: `None` for host memory, else the device EP.
    device: Option<&'t Arc<ProviderInstance>>,
    _borrow: std::marker::PhantomData<&'t Value>,
}

impl<'t> KernelCall<'t> {
    /// Inputs borrow `inputs` for the call; outputs go to `device`'s memory, or the host's.
    pub(crate) fn new(
        inputs: &[Option<&'t Value>],
        num_outputs: usize,
        device: Option<&'t Arc<ProviderInstance>>,
    ) -> Result<Self, String> {
        let mut views = Vec::with_capacity(inputs.len());
        for v in inputs {
            views.push(match v {
                None => None,
                Some(v) => Some(CallTensor::of(v)?),
            });
        }
        Ok(KernelCall {
            inputs: views,
            outputs: (0..num_outputs).map(|_| None).collect(),
            device,
            _borrow: std::marker::PhantomData,
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
    ) -> Result<(Value, CallTensor), SdkError> {
        let oom = |e: crate::error::Error| SdkError::new(EpxStatusCode::OutOfMemory, e.to_string());
        match self.device {
            None => {
                let tensor = Tensor::zeros(elem, shape).map_err(oom)?;
                let view = DlView::of(&tensor)
                    .ok_or_else(|| SdkError::not_implemented(format!("{elem} outputs")))?;
                Ok((Value::Host(tensor), CallTensor::Host(view)))
            }
            Some(p) => {
                let t = DeviceTensor::allocate(p, elem, shape).map_err(oom)?;
                let dl = Box::new(t.dl());
                Ok((Value::Device(t), CallTensor::Device(dl)))
            }
        }
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
        if out.is_null() {
            return Err(SdkError::invalid_argument("NULL out-pointer"));
        }
        let p = c.inputs[i]
            .as_mut()
            .map_or(std::ptr::null(), |v| v.dl_mut() as *const DLTensor);
        // SAFETY: `out` checked non-null.
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
        if c.outputs[i].is_some() {
            return Err(SdkError::invalid_argument(format!(
                "output {i} was already allocated in this call"
            )));
        }
        let elem = ElementType::from_dlpack(dtype).ok_or_else(|| {
            SdkError::not_implemented(format!(
                "output dtype (code {}, bits {}, lanes {})",
                dtype.code, dtype.bits, dtype.lanes
            ))
        })?;
        let ndim = usize::try_from(ndim)
            .map_err(|_| SdkError::invalid_argument(format!("negative ndim {ndim}")))?;
        let dims: &[i64] = if ndim == 0 {
            &[]
        } else if shape.is_null() {
            return Err(SdkError::invalid_argument("NULL shape"));
        } else {
            // SAFETY: plugin contract: `shape` holds `ndim` extents.
            unsafe { std::slice::from_raw_parts(shape, ndim) }
        };
        let mut ushape = Vec::with_capacity(ndim);
        for &d in dims {
            ushape.push(usize::try_from(d).map_err(|_| {
                SdkError::invalid_argument(format!("negative extent {d} in output shape {dims:?}"))
            })?);
        }
        if out.is_null() {
            return Err(SdkError::invalid_argument("NULL out-pointer"));
        }
        let (value, mut view) = c.allocate(elem, &ushape)?;
        let p: *mut DLTensor = view.dl_mut();
        c.outputs[i] = Some((value, view));
        if out.is_null() {
            return Err(SdkError::invalid_argument("NULL out-pointer"));
        }
        // SAFETY: `out` checked non-null; the DLTensor lives in the call until it ends.
        unsafe { *out = p };
        Ok(())
    })
}
