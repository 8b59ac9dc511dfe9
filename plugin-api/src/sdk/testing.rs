//! A graph held in memory behind the host's graph functions, so that the parts of an EP that
//! read a [`GraphView`] (its capability answer, its compiler's passes) can be unit-tested
//! without a host:
//!
//! ```
//! use epx_plugin_api::ElementType;
//! use epx_plugin_api::sdk::testing::TestGraph;
//!
//! let mut g = TestGraph::new();
//! g.input("x", ElementType::Float, &[2, 3]);
//! g.initializer("w", &[3], &[1.0f32, 2.0, 3.0]);
//! g.node("Mul", &["x", "w"], &["y"]).attr_int("unused", 1);
//! g.output("y", ElementType::Float, &[2, 3]);
//! let view = g.view();
//! assert_eq!(view.node_count(), 1);
//! assert_eq!(view.node(0).unwrap().op_type, "Mul");
//! assert!(view.value(1).unwrap().is_initializer());
//! ```
//!
//! Values are named and made on first mention; a node's output gets the node as producer. An
//! empty name in a node's inputs or outputs is an absent optional one. Nodes are listed in the
//! order they are added, which must be a topological order, as a host's is.

use std::ffi::c_char;
use std::sync::OnceLock;

use crate::abi::*;
use crate::dlpack::{DLDataType, DLDevice, DLTensor};
use crate::dtype::ElementType;
use crate::ffi_boundary;
use crate::sdk::graph::GraphView;
use crate::sdk::tensor::Element;
use crate::status::Error;

/// A graph for tests: see the [module](self) documentation.
#[derive(Default)]
pub struct TestGraph {
    nodes: Vec<Node>,
    values: Vec<Value>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
}

struct Node {
    name: String,
    op_type: String,
    domain: String,
    opset: i64,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    implicit: Vec<u32>,
    attributes: Vec<Attribute>,
}

/// An attribute and the data its ABI form points into (kept alive beside it).
struct Attribute {
    raw: EpxAttribute,
    _name: Box<str>,
    _data: AttributeData,
}

enum AttributeData {
    None,
    Bytes(Vec<u8>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    /// The strings, and their ABI form pointing into them.
    Strings {
        _owned: Vec<Vec<u8>>,
        strs: Vec<EpxStr>,
    },
    /// The tensor's data, and its ABI form pointing into it.
    Tensor {
        _data: Box<Data>,
        dl: Box<DLTensor>,
    },
    Graph(Box<TestGraph>),
}

struct Value {
    name: String,
    elem_type: i32,
    /// -1 when the rank is not known.
    rank: i64,
    dims: Vec<i64>,
    flags: u32,
    producer: u32,
    data: Option<Data>,
}

/// A tensor's bytes and shape, in the layout a `DLTensor` points at.
struct Data {
    dtype: DLDataType,
    shape: Vec<i64>,
    bytes: Vec<u8>,
}

impl Data {
    fn new<T: Element>(shape: &[i64], data: &[T]) -> Data {
        let expect: i64 = shape.iter().product();
        assert_eq!(
            expect as usize,
            data.len(),
            "a tensor of shape {shape:?} holds {expect} elements"
        );
        Data {
            dtype: T::TYPE.to_dlpack().expect("numeric element type"),
            shape: shape.to_vec(),
            // SAFETY: `Element` types are plain numbers; their bytes are initialized.
            bytes: unsafe {
                std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
            }
            .to_vec(),
        }
    }

    /// A `DLTensor` over the data: valid while `self` is alive and unmoved in memory (the
    /// vectors' heap buffers do not move with `self`).
    fn dl(&self) -> DLTensor {
        DLTensor {
            data: self.bytes.as_ptr().cast_mut().cast(),
            device: DLDevice::CPU,
            ndim: self.shape.len() as i32,
            dtype: self.dtype,
            shape: self.shape.as_ptr().cast_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
}

/// Adds attributes to the node just added ([`TestGraph::node`]).
pub struct NodeBuilder<'g> {
    node: &'g mut Node,
}

impl NodeBuilder<'_> {
    pub fn name(self, name: &str) -> Self {
        self.node.name = name.to_string();
        self
    }

    /// The operator domain (empty, the default, for ONNX's own).
    pub fn domain(self, domain: &str) -> Self {
        self.node.domain = domain.to_string();
        self
    }

    /// The opset the model imports for the node's domain (17 unless set).
    pub fn opset(self, opset: i64) -> Self {
        self.node.opset = opset;
        self
    }

    fn attr(self, name: &str, kind: EpxAttributeKind, data: AttributeData) -> Self {
        let name: Box<str> = name.into();
        // SAFETY: all-zero is a valid EpxAttribute (null pointers, zero counts).
        let mut raw: EpxAttribute = unsafe { std::mem::zeroed() };
        raw.struct_size = std::mem::size_of::<EpxAttribute>();
        raw.name = EpxStr::new(&name);
        raw.kind = kind as u32;
        match &data {
            AttributeData::None => {}
            AttributeData::Bytes(b) => raw.s = EpxStr::from_bytes(b),
            AttributeData::Floats(v) => (raw.floats, raw.num_values) = (v.as_ptr(), v.len()),
            AttributeData::Ints(v) => (raw.ints, raw.num_values) = (v.as_ptr(), v.len()),
            AttributeData::Strings { strs, .. } => {
                (raw.strings, raw.num_values) = (strs.as_ptr(), strs.len())
            }
            AttributeData::Tensor { dl, .. } => raw.tensor = &**dl,
            AttributeData::Graph(g) => raw.graph = (&**g as *const TestGraph).cast(),
        }
        self.node.attributes.push(Attribute {
            raw,
            _name: name,
            _data: data,
        });
        self
    }

    pub fn attr_float(self, name: &str, v: f32) -> Self {
        let b = self.attr(name, EpxAttributeKind::Float, AttributeData::None);
        b.node.attributes.last_mut().expect("just added").raw.f = v;
        b
    }

    pub fn attr_int(self, name: &str, v: i64) -> Self {
        let b = self.attr(name, EpxAttributeKind::Int, AttributeData::None);
        b.node.attributes.last_mut().expect("just added").raw.i = v;
        b
    }

    pub fn attr_string(self, name: &str, v: &str) -> Self {
        let data = AttributeData::Bytes(v.as_bytes().to_vec());
        self.attr(name, EpxAttributeKind::String, data)
    }

    pub fn attr_floats(self, name: &str, v: &[f32]) -> Self {
        self.attr(
            name,
            EpxAttributeKind::Floats,
            AttributeData::Floats(v.to_vec()),
        )
    }

    pub fn attr_ints(self, name: &str, v: &[i64]) -> Self {
        self.attr(
            name,
            EpxAttributeKind::Ints,
            AttributeData::Ints(v.to_vec()),
        )
    }

    pub fn attr_strings(self, name: &str, v: &[&str]) -> Self {
        let owned: Vec<Vec<u8>> = v.iter().map(|s| s.as_bytes().to_vec()).collect();
        let strs = owned.iter().map(|b| EpxStr::from_bytes(b)).collect();
        let data = AttributeData::Strings {
            _owned: owned,
            strs,
        };
        self.attr(name, EpxAttributeKind::Strings, data)
    }

    /// A numeric tensor attribute (as `Constant`'s `value`).
    pub fn attr_tensor<T: Element>(self, name: &str, shape: &[i64], data: &[T]) -> Self {
        let d = Box::new(Data::new(shape, data));
        let dl = Box::new(d.dl());
        let data = AttributeData::Tensor { _data: d, dl };
        self.attr(name, EpxAttributeKind::Tensor, data)
    }

    /// A nested graph (an `If` branch, a `Loop` or `Scan` body). Values it reads from this
    /// graph are named in it with no producer, and listed when the node is added
    /// ([`TestGraph::node_reading`]).
    pub fn attr_graph(self, name: &str, body: TestGraph) -> Self {
        let data = AttributeData::Graph(Box::new(body));
        self.attr(name, EpxAttributeKind::Graph, data)
    }
}

impl TestGraph {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of value `name`, made (type unknown) when it is new.
    pub fn value_id(&mut self, name: &str) -> u32 {
        if let Some(i) = self.values.iter().position(|v| v.name == name) {
            return i as u32;
        }
        self.values.push(Value {
            name: name.to_string(),
            elem_type: 0,
            rank: -1,
            dims: Vec::new(),
            flags: 0,
            producer: EPX_VALUE_NONE,
            data: None,
        });
        (self.values.len() - 1) as u32
    }

    /// Declares value `name`'s element type and shape (-1: an unknown extent).
    pub fn typed(&mut self, name: &str, elem: ElementType, shape: &[i64]) -> u32 {
        let id = self.value_id(name);
        let v = &mut self.values[id as usize];
        v.elem_type = elem.onnx_code();
        v.rank = shape.len() as i64;
        v.dims = shape.to_vec();
        id
    }

    /// Declares value `name`'s element type, its rank unknown.
    pub fn typed_unranked(&mut self, name: &str, elem: ElementType) -> u32 {
        let id = self.value_id(name);
        let v = &mut self.values[id as usize];
        v.elem_type = elem.onnx_code();
        v.rank = -1;
        v.dims.clear();
        id
    }

    /// A graph input.
    pub fn input(&mut self, name: &str, elem: ElementType, shape: &[i64]) -> u32 {
        let id = self.typed(name, elem, shape);
        self.values[id as usize].flags |= EPX_VALUE_GRAPH_INPUT;
        self.inputs.push(id);
        id
    }

    /// An initializer holding `data` (row-major, of `shape`).
    pub fn initializer<T: Element>(&mut self, name: &str, shape: &[i64], data: &[T]) -> u32 {
        let id = self.typed(name, T::TYPE, shape);
        let v = &mut self.values[id as usize];
        v.flags |= EPX_VALUE_INITIALIZER;
        v.data = Some(Data::new(shape, data));
        id
    }

    /// An initializer of element type `elem` holding `bytes` as they are (float16, bfloat16,
    /// bool: the types with no [`Element`]).
    pub fn initializer_bytes(
        &mut self,
        name: &str,
        elem: ElementType,
        shape: &[i64],
        bytes: &[u8],
    ) -> u32 {
        let id = self.typed(name, elem, shape);
        let v = &mut self.values[id as usize];
        v.flags |= EPX_VALUE_INITIALIZER;
        v.data = Some(Data {
            dtype: elem.to_dlpack().expect("an element type DLPack has"),
            shape: shape.to_vec(),
            bytes: bytes.to_vec(),
        });
        id
    }

    /// A graph output, with its declared type.
    pub fn output(&mut self, name: &str, elem: ElementType, shape: &[i64]) -> u32 {
        let id = self.typed(name, elem, shape);
        self.values[id as usize].flags |= EPX_VALUE_GRAPH_OUTPUT;
        self.outputs.push(id);
        id
    }

    /// A graph output whose type is not declared.
    pub fn output_untyped(&mut self, name: &str) -> u32 {
        let id = self.value_id(name);
        self.values[id as usize].flags |= EPX_VALUE_GRAPH_OUTPUT;
        self.outputs.push(id);
        id
    }

    /// Adds a node of the default domain at opset 17, its id the number of nodes before it.
    pub fn node(&mut self, op_type: &str, inputs: &[&str], outputs: &[&str]) -> NodeBuilder<'_> {
        self.node_reading(op_type, inputs, outputs, &[])
    }

    /// As [`TestGraph::node`], for a node whose nested graphs read `implicit` values of this
    /// graph.
    pub fn node_reading(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        outputs: &[&str],
        implicit: &[&str],
    ) -> NodeBuilder<'_> {
        let id = self.nodes.len() as u32;
        let mut ids = |names: &[&str]| -> Vec<u32> {
            names
                .iter()
                .map(|n| {
                    if n.is_empty() {
                        EPX_VALUE_NONE
                    } else {
                        self.value_id(n)
                    }
                })
                .collect()
        };
        let inputs = ids(inputs);
        let outputs = ids(outputs);
        let implicit = ids(implicit);
        for &o in outputs.iter().filter(|&&o| o != EPX_VALUE_NONE) {
            self.values[o as usize].producer = id;
        }
        self.nodes.push(Node {
            name: String::new(),
            op_type: op_type.to_string(),
            domain: String::new(),
            opset: 17,
            inputs,
            outputs,
            implicit,
            attributes: Vec::new(),
        });
        NodeBuilder {
            node: self.nodes.last_mut().expect("just pushed"),
        }
    }

    /// The graph as an EP sees it, borrowed from `self`.
    pub fn view(&self) -> GraphView<'_> {
        // SAFETY: the handle is `self`, which the view borrows; `test_host` implements the
        // graph functions over it.
        unsafe { GraphView::from_raw(test_host(), (self as *const TestGraph).cast()) }
    }
}

/// The host function table over [`TestGraph`]s: the graph functions, `log` and
/// `status_create`; no kernel or value functions.
fn test_host() -> &'static EpxHostApi {
    struct Table(EpxHostApi);
    // SAFETY: function pointers and a pointer to a static string, never mutated.
    unsafe impl Send for Table {}
    // SAFETY: as above.
    unsafe impl Sync for Table {}
    static API: OnceLock<Table> = OnceLock::new();
    &API.get_or_init(|| {
        // SAFETY: all-zero is a valid EpxHostApi: every function absent, pointers null.
        let mut api: EpxHostApi = unsafe { std::mem::zeroed() };
        api.struct_size = std::mem::size_of::<EpxHostApi>();
        api.abi_version = EpxVersion::CURRENT;
        api.host_version = c"test graph".as_ptr();
        api.log = Some(log);
        api.graph_node_count = Some(node_count);
        api.graph_value_count = Some(value_count);
        api.graph_node = Some(node);
        api.graph_node_attribute = Some(attribute);
        api.graph_value = Some(value);
        api.graph_initializer = Some(initializer);
        api.graph_inputs = Some(inputs);
        api.graph_outputs = Some(outputs);
        Table(api)
    })
    .0
}

/// # Safety
/// `g` is a handle made by [`TestGraph::view`], alive.
unsafe fn graph<'a>(g: *const EpxGraph) -> Result<&'a TestGraph, Error> {
    // SAFETY: the caller's contract.
    unsafe { g.cast::<TestGraph>().as_ref() }.ok_or_else(|| Error::invalid_argument("NULL graph"))
}

fn at<T>(items: &[T], i: usize, what: &str) -> Result<usize, Error> {
    if i < items.len() {
        Ok(i)
    } else {
        Err(Error::invalid_argument(format!(
            "{what} {i} out of range (there are {})",
            items.len()
        )))
    }
}

/// # Safety
/// `out` is NULL or writable.
unsafe fn put<T>(out: *mut T, v: T) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::invalid_argument("NULL out-pointer"));
    }
    // SAFETY: checked non-null; the caller's contract. Every reader of this test host is this
    // crate's SDK, whose structs are exactly these.
    unsafe { out.write(v) };
    Ok(())
}

unsafe extern "C" fn log(_level: u32, _target: *const c_char, _message: EpxStr) {}

unsafe extern "C" fn node_count(g: *const EpxGraph) -> usize {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { graph(g) }.map_or(0, |g| g.nodes.len()))
}

unsafe extern "C" fn value_count(g: *const EpxGraph) -> usize {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { graph(g) }.map_or(0, |g| g.values.len()))
}

unsafe extern "C" fn node(g: *const EpxGraph, id: u32, out: *mut EpxNodeInfo) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { graph(g) }?;
        let n = &g.nodes[at(&g.nodes, id as usize, "node")?];
        let info = EpxNodeInfo {
            struct_size: std::mem::size_of::<EpxNodeInfo>(),
            name: EpxStr::new(&n.name),
            op_type: EpxStr::new(&n.op_type),
            domain: EpxStr::new(&n.domain),
            opset: n.opset,
            num_inputs: n.inputs.len(),
            inputs: n.inputs.as_ptr(),
            num_outputs: n.outputs.len(),
            outputs: n.outputs.as_ptr(),
            num_attributes: n.attributes.len(),
            num_implicit_inputs: n.implicit.len(),
            implicit_inputs: n.implicit.as_ptr(),
        };
        // SAFETY: host API contract on `out`.
        unsafe { put(out, info) }
    })
}

unsafe extern "C" fn attribute(
    g: *const EpxGraph,
    id: u32,
    index: usize,
    out: *mut EpxAttribute,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { graph(g) }?;
        let n = &g.nodes[at(&g.nodes, id as usize, "node")?];
        let a = &n.attributes[at(&n.attributes, index, "attribute")?];
        // SAFETY: plain data; the copy shares pointers into the graph, which outlives it.
        let copy = unsafe { std::ptr::read(&a.raw) };
        // SAFETY: host API contract on `out`.
        unsafe { put(out, copy) }
    })
}

unsafe extern "C" fn value(g: *const EpxGraph, id: u32, out: *mut EpxValueInfo) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { graph(g) }?;
        let v = &g.values[at(&g.values, id as usize, "value")?];
        let info = EpxValueInfo {
            struct_size: std::mem::size_of::<EpxValueInfo>(),
            name: EpxStr::new(&v.name),
            elem_type: v.elem_type,
            rank: v.rank,
            dims: v.dims.as_ptr(),
            flags: v.flags,
            producer: v.producer,
            kind: if v.elem_type == 0 {
                EpxValueKind::Unknown as u32
            } else {
                EpxValueKind::Tensor as u32
            },
        };
        // SAFETY: host API contract on `out`.
        unsafe { put(out, info) }
    })
}

unsafe extern "C" fn initializer(
    g: *const EpxGraph,
    id: u32,
    out: *mut DLTensor,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let g = unsafe { graph(g) }?;
        let v = &g.values[at(&g.values, id as usize, "value")?];
        let data = v.data.as_ref().ok_or_else(|| {
            Error::invalid_argument(format!("value `{}` is not an initializer", v.name))
        })?;
        // SAFETY: host API contract on `out`.
        unsafe { put(out, data.dl()) }
    })
}

unsafe fn ids(list: &[u32], out_ids: *mut *const u32, out_len: *mut usize) -> Result<(), Error> {
    // SAFETY: the caller's contract.
    unsafe {
        put(out_ids, list.as_ptr())?;
        put(out_len, list.len())
    }
}

unsafe extern "C" fn inputs(
    g: *const EpxGraph,
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> *mut EpxStatus {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { graph(g).and_then(|g| ids(&g.inputs, out_ids, out_len)) })
}

unsafe extern "C" fn outputs(
    g: *const EpxGraph,
    out_ids: *mut *const u32,
    out_len: *mut usize,
) -> *mut EpxStatus {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { graph(g).and_then(|g| ids(&g.outputs, out_ids, out_len)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdk::Attribute as A;

    #[test]
    fn a_view_reads_what_was_built() {
        let mut g = TestGraph::new();
        g.input("x", ElementType::Float, &[2, -1]);
        g.initializer("w", &[2], &[0.5f32, 2.0]);
        let mut body = TestGraph::new();
        body.output_untyped("w");
        g.node("Mul", &["x", "w"], &["y"])
            .name("mul")
            .attr_float("f", 1.5)
            .attr_ints("is", &[1, -2])
            .attr_strings("ss", &["a", "bc"])
            .attr_tensor("t", &[2], &[7i64, 8])
            .attr_string("s", "hi");
        g.node_reading("If", &["c", ""], &["z"], &["w"])
            .domain("")
            .opset(13)
            .attr_graph("then_branch", body);
        g.output("z", ElementType::Float, &[2]);
        let v = g.view();
        assert_eq!((v.node_count(), v.value_count()), (2, 5));
        let mul = v.node(0).unwrap();
        assert_eq!((mul.name, mul.op_type, mul.opset), ("mul", "Mul", 17));
        assert_eq!(mul.inputs, [Some(0), Some(1)]);
        let attrs = v.attributes(&mul).unwrap();
        assert!(matches!(attrs[0], ("f", A::Float(f)) if f == 1.5));
        assert!(matches!(attrs[1], ("is", A::Ints(is)) if is == [1, -2]));
        assert!(matches!(&attrs[2], ("ss", A::Strings(s)) if s == &[b"a".as_slice(), b"bc"]));
        assert!(matches!(&attrs[3], ("t", A::Tensor(t)) if t.shape == [2] && t.data.len() == 16));
        assert!(matches!(attrs[4], ("s", A::String(b"hi"))));
        let w = v.value(1).unwrap();
        assert!(w.is_initializer());
        assert_eq!(v.initializer(1).unwrap().data.len(), 8);
        assert!(v.initializer(0).is_err(), "x has no data");
        assert_eq!(v.value(0).unwrap().shape, Some(&[2, -1][..]));
        assert_eq!(v.value(2).unwrap().producer, Some(0));
        let iff = v.node(1).unwrap();
        assert_eq!(
            (iff.inputs.clone(), iff.implicit_inputs.clone()),
            (vec![Some(3), None], vec![1])
        );
        let A::Graph(b) = v.attributes(&iff).unwrap().remove(0).1 else {
            panic!("a graph attribute")
        };
        assert_eq!(b.outputs().unwrap(), [0]);
        assert_eq!(v.inputs().unwrap(), [0]);
        assert_eq!(v.outputs().unwrap(), [4]);
        assert!(v.node(2).is_err());
    }
}
