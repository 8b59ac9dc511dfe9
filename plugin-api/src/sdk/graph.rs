//! Safe, borrowed views over the host's graph and kernel-call handles.

use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;

use crate::abi::*;
use crate::dlpack::{DLDevice, DLDeviceType, DLTensor};
use crate::dtype::ElementType;
use crate::sdk::tensor::{Element, TensorView};
use crate::sdk::value::{OwnedValue, StringTensorView, ValueRef, is_string_dtype};
use crate::status::{Error, Result, take_status};

fn missing(name: &str) -> Error {
    Error::new(
        EpxStatusCode::AbiMismatch,
        format!("host API has no `{name}` function"),
    )
}

/// A host-table function pointer, `None` when the host's table is too short to have it (an
/// older host) or leaves it NULL.
macro_rules! host_fn {
    ($api:expr, $f:ident) => {
        if $api.struct_size >= $crate::epx_field_end!(EpxHostApi, $f) {
            $api.$f
        } else {
            None
        }
    };
}

/// Calls a host function that fills an out-struct, checking the status.
macro_rules! host_call {
    ($api:expr, $f:ident ( $($arg:expr),* )) => {{
        let f = host_fn!($api, $f).ok_or_else(|| missing(stringify!($f)))?;
        // SAFETY: the host API contract: handles passed are the ones the host gave us for
        // this call, and out-pointers point at initialized structs with `struct_size` set.
        unsafe { take_status(f($($arg),*)) }
    }};
}

/// An attribute value, borrowed from the graph.
#[derive(Clone, Debug)]
pub enum Attribute<'a> {
    Float(f32),
    Int(i64),
    String(&'a [u8]),
    Tensor(TensorView<'a>),
    /// (ABI 1.3) A string tensor.
    StringTensor(StringTensorView<'a>),
    Floats(&'a [f32]),
    Ints(&'a [i64]),
    Strings(Vec<&'a [u8]>),
    /// A nested graph (If/Loop/Scan bodies), from hosts of ABI 1.1 on.
    Graph(GraphView<'a>),
    /// A kind this ABI version does not describe (graph lists, sparse tensor, string tensor, ...).
    Unsupported(u32),
}

/// The host's graph, borrowed for one call (`get_capability` or `compile`).
#[derive(Clone, Copy)]
pub struct GraphView<'a> {
    api: &'a EpxHostApi,
    raw: *const EpxGraph,
    _life: PhantomData<&'a EpxGraph>,
}

/// One node, borrowed from the graph.
#[derive(Clone, Debug)]
pub struct NodeView<'a> {
    pub id: u32,
    pub name: &'a str,
    pub op_type: &'a str,
    /// Empty for the default ONNX domain.
    pub domain: &'a str,
    pub opset: i64,
    /// Value ids, `None` for absent optional inputs.
    pub inputs: Vec<Option<u32>>,
    pub outputs: Vec<Option<u32>>,
    pub num_attributes: usize,
    /// Values of this graph its nested graphs read by name (empty before ABI 1.1).
    pub implicit_inputs: Vec<u32>,
}

/// One value, borrowed from the graph.
#[derive(Clone, Debug)]
pub struct ValueView<'a> {
    pub id: u32,
    pub name: &'a str,
    pub elem_type: Option<ElementType>,
    /// `None` when the rank is unknown; `-1` marks an unknown extent.
    pub shape: Option<&'a [i64]>,
    pub flags: u32,
    pub producer: Option<u32>,
    /// (ABI 1.3) Tensor, sequence, map or optional; `Unknown` from older hosts.
    pub kind: EpxValueKind,
}

impl ValueView<'_> {
    pub fn is_initializer(&self) -> bool {
        self.flags & EPX_VALUE_INITIALIZER != 0
    }
}

fn ids(ptr: *const u32, n: usize) -> Vec<Option<u32>> {
    if n == 0 || ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: host contract: `ptr` points at `n` ids living as long as the graph.
    unsafe { std::slice::from_raw_parts(ptr, n) }
        .iter()
        .map(|&v| (v != EPX_VALUE_NONE).then_some(v))
        .collect()
}

fn text<'a>(s: EpxStr) -> Result<&'a str> {
    // SAFETY: host contract: strings borrow from the graph for the call.
    std::str::from_utf8(unsafe { s.as_bytes() })
        .map_err(|_| Error::invalid_graph("graph string is not UTF-8"))
}

impl std::fmt::Debug for GraphView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphView")
            .field("nodes", &self.node_count())
            .field("values", &self.value_count())
            .finish()
    }
}

impl<'a> GraphView<'a> {
    /// Wraps a graph handle.
    ///
    /// # Safety
    /// `raw` is a graph handle the host passed for the current call; `'a` does not outlive it.
    pub unsafe fn from_raw(api: &'a EpxHostApi, raw: *const EpxGraph) -> Self {
        GraphView {
            api,
            raw,
            _life: PhantomData,
        }
    }

    pub fn raw(&self) -> *const EpxGraph {
        self.raw
    }

    pub fn node_count(&self) -> usize {
        // SAFETY: valid handle (constructor contract).
        host_fn!(self.api, graph_node_count).map_or(0, |f| unsafe { f(self.raw) })
    }

    pub fn value_count(&self) -> usize {
        // SAFETY: valid handle (constructor contract).
        host_fn!(self.api, graph_value_count).map_or(0, |f| unsafe { f(self.raw) })
    }

    pub fn node(&self, id: u32) -> Result<NodeView<'a>> {
        // SAFETY: all-zero is a valid EpxNodeInfo (null pointers, zero counts).
        let mut info: EpxNodeInfo = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<EpxNodeInfo>();
        host_call!(self.api, graph_node(self.raw, id, &mut info))?;
        Ok(NodeView {
            id,
            name: text(info.name)?,
            op_type: text(info.op_type)?,
            domain: text(info.domain)?,
            opset: info.opset,
            inputs: ids(info.inputs, info.num_inputs),
            outputs: ids(info.outputs, info.num_outputs),
            num_attributes: info.num_attributes,
            implicit_inputs: if info.struct_size
                >= crate::epx_field_end!(EpxNodeInfo, implicit_inputs)
            {
                ids(info.implicit_inputs, info.num_implicit_inputs)
                    .into_iter()
                    .flatten()
                    .collect()
            } else {
                Vec::new()
            },
        })
    }

    /// The graph's inputs (initializers excluded), in order. Needs a host of ABI 1.1.
    pub fn inputs(&self) -> Result<&'a [u32]> {
        let mut ptr: *const u32 = std::ptr::null();
        let mut len = 0usize;
        host_call!(self.api, graph_inputs(self.raw, &mut ptr, &mut len))?;
        Ok(slice(ptr, len))
    }

    /// The graph's outputs, in order. Needs a host of ABI 1.1.
    pub fn outputs(&self) -> Result<&'a [u32]> {
        let mut ptr: *const u32 = std::ptr::null();
        let mut len = 0usize;
        host_call!(self.api, graph_outputs(self.raw, &mut ptr, &mut len))?;
        Ok(slice(ptr, len))
    }

    /// The id of the value called `name`, if any (a linear search).
    pub fn value_named(&self, name: &str) -> Result<Option<u32>> {
        for id in 0..self.value_count() as u32 {
            if self.value(id)?.name == name {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// The static shape of tensor value `id` when its element type is `elem_type` and every
    /// extent is known; `None` otherwise (or when `id` is not a value).
    pub fn static_shape(&self, id: u32, elem_type: ElementType) -> Option<&'a [i64]> {
        let v = self.value(id).ok()?;
        let shape = v.shape.filter(|s| s.iter().all(|&d| d >= 0))?;
        (v.elem_type == Some(elem_type)).then_some(shape)
    }

    /// The usual capability answer: each node of `unclaimed` for which `claims` says yes, as a
    /// group of its own.
    pub fn claim_each(
        &self,
        unclaimed: &[u32],
        mut claims: impl FnMut(&NodeView<'a>) -> Result<bool>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut groups = Vec::new();
        for &id in unclaimed {
            if claims(&self.node(id)?)? {
                groups.push(vec![id]);
            }
        }
        Ok(groups)
    }

    pub fn value(&self, id: u32) -> Result<ValueView<'a>> {
        // SAFETY: all-zero is a valid EpxValueInfo.
        let mut info: EpxValueInfo = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<EpxValueInfo>();
        host_call!(self.api, graph_value(self.raw, id, &mut info))?;
        let shape = match usize::try_from(info.rank) {
            Ok(0) => Some(&[][..]),
            Ok(r) if !info.dims.is_null() => {
                // SAFETY: host contract: `dims` points at `rank` extents living as long as the
                // graph.
                Some(unsafe { std::slice::from_raw_parts(info.dims, r) })
            }
            _ => None,
        };
        Ok(ValueView {
            id,
            name: text(info.name)?,
            elem_type: ElementType::from_onnx(info.elem_type)
                .filter(|t| *t != ElementType::Undefined),
            shape,
            flags: info.flags,
            producer: (info.producer != EPX_VALUE_NONE).then_some(info.producer),
            kind: if info.struct_size >= crate::epx_field_end!(EpxValueInfo, kind) {
                EpxValueKind::from_raw(info.kind).unwrap_or(EpxValueKind::Unknown)
            } else {
                EpxValueKind::Unknown
            },
        })
    }

    /// The attributes of a node, by name.
    pub fn attributes(&self, node: &NodeView<'a>) -> Result<Vec<(&'a str, Attribute<'a>)>> {
        let mut out = Vec::with_capacity(node.num_attributes);
        for index in 0..node.num_attributes {
            // SAFETY: all-zero is a valid EpxAttribute.
            let mut a: EpxAttribute = unsafe { std::mem::zeroed() };
            a.struct_size = std::mem::size_of::<EpxAttribute>();
            host_call!(
                self.api,
                graph_node_attribute(self.raw, node.id, index, &mut a)
            )?;
            let n = a.num_values;
            // SAFETY (all slices below): host contract: arrays of `num_values` elements that
            // borrow from the graph for the call.
            let value = match a.kind {
                k if k == EpxAttributeKind::Float as u32 => Attribute::Float(a.f),
                k if k == EpxAttributeKind::Int as u32 => Attribute::Int(a.i),
                k if k == EpxAttributeKind::String as u32 => {
                    // SAFETY: see above.
                    Attribute::String(unsafe { a.s.as_bytes() })
                }
                k if k == EpxAttributeKind::Floats as u32 => Attribute::Floats(slice(a.floats, n)),
                k if k == EpxAttributeKind::Ints as u32 => Attribute::Ints(slice(a.ints, n)),
                k if k == EpxAttributeKind::Strings as u32 => Attribute::Strings(
                    slice(a.strings, n)
                        .iter()
                        // SAFETY: see above.
                        .map(|s| unsafe { s.as_bytes() })
                        .collect(),
                ),
                k if k == EpxAttributeKind::Graph as u32
                    && a.struct_size >= crate::epx_field_end!(EpxAttribute, graph)
                    && !a.graph.is_null() =>
                {
                    // SAFETY: the host's nested graph handle lives as long as this graph.
                    Attribute::Graph(unsafe { GraphView::from_raw(self.api, a.graph) })
                }
                k if k == EpxAttributeKind::Tensor as u32 && !a.tensor.is_null() => {
                    // SAFETY: the tensor borrows from the graph for the call.
                    let t = unsafe { &*a.tensor };
                    if is_string_dtype(t.dtype) {
                        // SAFETY: as above; the strings borrow from the graph too.
                        Attribute::StringTensor(unsafe { StringTensorView::from_dl(t) }?)
                    } else {
                        // SAFETY: as above.
                        Attribute::Tensor(unsafe { TensorView::from_dl(t) }?)
                    }
                }
                k => Attribute::Unsupported(k),
            };
            out.push((text(a.name)?, value));
        }
        Ok(out)
    }

    /// The data of an initializer.
    pub fn initializer(&self, value: u32) -> Result<TensorView<'a>> {
        let t = self.initializer_raw(value)?;
        // SAFETY: the pointers in `t` borrow from the graph, which lives for 'a.
        unsafe { TensorView::from_dl(&t) }
    }

    /// (ABI 1.3) The strings of a string initializer.
    pub fn string_initializer(&self, value: u32) -> Result<StringTensorView<'a>> {
        let t = self.initializer_raw(value)?;
        // SAFETY: the pointers in `t` borrow from the graph, which lives for 'a.
        unsafe { StringTensorView::from_dl(&t) }
    }

    fn initializer_raw(&self, value: u32) -> Result<DLTensor> {
        let f =
            host_fn!(self.api, graph_initializer).ok_or_else(|| missing("graph_initializer"))?;
        let mut t = DLTensor {
            data: std::ptr::null_mut(),
            device: DLDevice::CPU,
            ndim: 0,
            dtype: crate::dlpack::DLDataType {
                code: 0,
                bits: 0,
                lanes: 0,
            },
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: valid handle; `t` is a valid out-struct.
        unsafe { take_status(f(self.raw, value, &mut t)) }?;
        Ok(t)
    }

    /// The subgraph serialized as a standalone ONNX model.
    pub fn serialize_subgraph(&self, sub: &SubgraphView<'_>) -> Result<Vec<u8>> {
        let raw = EpxSubgraph::borrowing(sub.nodes, sub.inputs, sub.outputs);
        let mut buf = EpxBuffer::empty();
        host_call!(self.api, graph_serialize_subgraph(self.raw, &raw, &mut buf))?;
        let bytes = if buf.data.is_null() {
            Vec::new()
        } else {
            // SAFETY: the host filled `len` bytes at `data`.
            unsafe { std::slice::from_raw_parts(buf.data, buf.len) }.to_vec()
        };
        if let Some(release) = buf.release {
            // SAFETY: released once, as the contract says.
            unsafe { release(&mut buf) };
        }
        Ok(bytes)
    }
}

fn slice<'a, T>(ptr: *const T, n: usize) -> &'a [T] {
    if ptr.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: callers pass host arrays of `n` elements borrowed for 'a.
        unsafe { std::slice::from_raw_parts(ptr, n) }
    }
}

/// The group of nodes handed to `compile`.
#[derive(Clone, Copy, Debug)]
pub struct SubgraphView<'a> {
    pub nodes: &'a [u32],
    pub inputs: &'a [u32],
    pub outputs: &'a [u32],
}

impl<'a> SubgraphView<'a> {
    /// # Safety
    /// `raw` points at a subgraph the host passed for the current call.
    pub unsafe fn from_raw(raw: &'a EpxSubgraph) -> Self {
        SubgraphView {
            nodes: slice(raw.nodes, raw.num_nodes),
            inputs: slice(raw.inputs, raw.num_inputs),
            outputs: slice(raw.outputs, raw.num_outputs),
        }
    }
}

/// The host's side of one `execute` call.
pub struct KernelContext<'a> {
    api: &'a EpxHostApi,
    raw: *mut EpxKernelContext,
}

impl<'a> KernelContext<'a> {
    /// # Safety
    /// `raw` is the context the host passed to the current `execute` call.
    pub unsafe fn from_raw(api: &'a EpxHostApi, raw: *mut EpxKernelContext) -> Self {
        KernelContext { api, raw }
    }

    pub fn input_count(&self) -> usize {
        // SAFETY: valid context (constructor contract).
        host_fn!(self.api, kernel_input_count).map_or(0, |f| unsafe { f(self.raw) })
    }

    pub fn output_count(&self) -> usize {
        // SAFETY: valid context (constructor contract).
        host_fn!(self.api, kernel_output_count).map_or(0, |f| unsafe { f(self.raw) })
    }

    /// Input `index` as a raw DLTensor (any memory space); `None` for an absent optional input.
    pub fn input_raw(&self, index: usize) -> Result<Option<&'a DLTensor>> {
        let mut t: *const DLTensor = std::ptr::null();
        host_call!(self.api, kernel_input(self.raw, index, &mut t))?;
        // SAFETY: the host keeps inputs alive for the whole call.
        Ok(unsafe { t.as_ref() })
    }

    /// Input `index` in host memory. Every input the node has is there; an optional input
    /// the model left out (an empty name) is an error here: read such inputs with
    /// [`Self::optional_input`].
    pub fn input(&self, index: usize) -> Result<TensorView<'a>> {
        self.optional_input(index)?.ok_or_else(|| {
            Error::invalid_argument(format!(
                "input {index} is absent (an optional input the model left out); read it with \
                 `optional_input`"
            ))
        })
    }

    /// Input `index` in host memory; `None` for an optional input the model left out.
    pub fn optional_input(&self, index: usize) -> Result<Option<TensorView<'a>>> {
        match self.input_raw(index)? {
            // SAFETY: inputs live for the call.
            Some(t) => Ok(Some(unsafe { TensorView::from_dl(t) }?)),
            None => Ok(None),
        }
    }

    /// Input `index` as `&[T]` with its shape: `let (x, shape) = ctx.input_as::<f32>(0)?;`.
    /// An error names both types when the input holds another element type.
    pub fn input_as<T: Element>(&self, index: usize) -> Result<(&'a [T], &'a [i64])> {
        let view = self.input(index)?;
        let data = view
            .as_slice::<T>()
            .map_err(|e| Error::invalid_argument(format!("input {index}: {}", e.message)))?;
        Ok((data, view.shape))
    }

    /// Allocates output `index` in host memory as `T` elements of `shape` and returns them for
    /// writing.
    pub fn output_as<T: Element>(&mut self, index: usize, shape: &[i64]) -> Result<&'a mut [T]> {
        let bytes = self.output(index, T::TYPE, shape)?;
        // SAFETY: `T` is a plain number type (sealed `Element`): every bit pattern is a value.
        let (head, body, tail) = unsafe { bytes.align_to_mut::<T>() };
        if !head.is_empty() || !tail.is_empty() {
            return Err(Error::runtime(format!(
                "output {index}: the host's buffer is not aligned for {}",
                T::TYPE
            )));
        }
        Ok(body)
    }

    /// Whether the host speaks ABI 1.3's values ([`Self::input_value`], [`Self::set_output`]).
    /// (ABI 1.8) The run's terminate flag, set from another thread when the application
    /// cancels the run; `None` when this run cannot be cancelled (or the host predates 1.8).
    /// Read it where that is cheap (between nodes, at loop iterations) and fail the call soon
    /// after it is set; the host reports the run as cancelled.
    pub fn terminate_flag(&self) -> Option<&'a AtomicBool> {
        let f = host_fn!(self.api, kernel_terminate_flag)?;
        // SAFETY: valid context (constructor contract).
        let flag = unsafe { f(self.raw) };
        // SAFETY: NULL or a byte the host keeps alive for the call and writes only 0 or 1 to,
        // atomically; AtomicBool has u8's size and alignment.
        unsafe { flag.cast::<AtomicBool>().as_ref() }
    }

    pub fn supports_values(&self) -> bool {
        host_fn!(self.api, kernel_input_value).is_some()
            && host_fn!(self.api, value_release).is_some()
    }

    /// (ABI 1.3) Input `index` as a value of any kind (string tensors, sequences, maps,
    /// optionals, and plain tensors too); `None` for an absent optional input. Host memory only.
    pub fn input_value(&self, index: usize) -> Result<Option<ValueRef<'a>>> {
        let mut v: *const EpxValue = std::ptr::null();
        host_call!(self.api, kernel_input_value(self.raw, index, &mut v))?;
        if v.is_null() {
            return Ok(None);
        }
        // SAFETY: the host keeps inputs alive for the whole call.
        unsafe { crate::sdk::value::read_value(self.api, v) }.map(Some)
    }

    /// (ABI 1.3) Sets output `index` to a value of any kind (instead of [`Self::output`]).
    pub fn set_output(&mut self, index: usize, value: &OwnedValue) -> Result<()> {
        let raw = crate::sdk::value::make_value(self.api, value)?;
        host_call!(self.api, kernel_output_value(self.raw, index, raw))
    }

    /// Allocates output `index` and returns it as a raw DLTensor in the EP's memory space.
    pub fn output_raw(
        &mut self,
        index: usize,
        elem_type: ElementType,
        shape: &[i64],
    ) -> Result<&'a mut DLTensor> {
        let dtype = elem_type.to_dlpack().ok_or_else(|| {
            Error::not_implemented(format!("{elem_type} outputs cannot cross the ABI"))
        })?;
        let ndim =
            i32::try_from(shape.len()).map_err(|_| Error::invalid_argument("rank too large"))?;
        let mut t: *mut DLTensor = std::ptr::null_mut();
        host_call!(
            self.api,
            kernel_output(self.raw, index, dtype, ndim, shape.as_ptr(), &mut t)
        )?;
        // SAFETY: the host owns the output and keeps it writable until execute returns.
        unsafe { t.as_mut() }.ok_or_else(|| Error::runtime("host returned no output tensor"))
    }

    /// Allocates output `index` in host memory and returns its bytes for writing.
    pub fn output(
        &mut self,
        index: usize,
        elem_type: ElementType,
        shape: &[i64],
    ) -> Result<&'a mut [u8]> {
        let t = self.output_raw(index, elem_type, shape)?;
        if t.device.device_type != DLDeviceType::Cpu as i32 {
            return Err(Error::runtime("output is not in host memory"));
        }
        let count = shape.iter().try_fold(1usize, |acc, &d| {
            usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        });
        let bytes = count
            .and_then(|c| elem_type.storage_bytes(c))
            .ok_or_else(|| Error::invalid_argument("bad output shape"))?;
        if bytes == 0 {
            return Ok(&mut []);
        }
        if t.data.is_null() {
            return Err(Error::runtime("host returned a NULL output buffer"));
        }
        // SAFETY: the host allocated `bytes` writable bytes at data + byte_offset, exclusive to
        // this output, alive until execute returns.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(t.data.cast::<u8>().add(t.byte_offset as usize), bytes)
        })
    }
}

#[cfg(test)]
mod typed_tests {
    use super::*;

    #[test]
    fn a_view_reads_as_its_own_element_type_only() {
        let values = [1.5f32, -2.0];
        // f32 storage, so the bytes are aligned for f32 as host tensors are.
        let storage: Vec<f32> = values.to_vec();
        // SAFETY: viewing initialized f32 storage as its bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(storage.as_ptr().cast::<u8>(), storage.len() * 4) };
        let view = TensorView {
            elem_type: ElementType::Float,
            shape: &[2],
            data: bytes,
        };
        assert_eq!(view.as_slice::<f32>().unwrap(), &values);
        let e = view.as_slice::<i32>().unwrap_err();
        assert_eq!(e.code, EpxStatusCode::InvalidArgument);
        assert!(
            e.message.contains("holds float32") && e.message.contains("int32"),
            "{}",
            e.message
        );
    }
}
