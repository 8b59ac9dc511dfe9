//! The graph IR: what a loaded ONNX model is to the rest of the host.
//!
//! Nodes are stored in topological order and refer to values by index; every value knows its
//! producer and consumers. Nested graphs (the bodies of `If`, `Loop`, `Scan`) are kept as
//! attributes and may read values of the enclosing graphs by name.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use crate::value::{ElementType, Tensor, Value as RuntimeValue};

/// Index of a node in [`Graph::nodes`].
pub type NodeId = usize;
/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// A loaded model.
#[derive(Clone, Debug)]
pub struct Model {
    /// Where the model came from (a file path, or a name given with the bytes), for messages.
    pub source: String,
    /// The folder external data is read from.
    pub base_dir: Option<PathBuf>,
    pub ir_version: i64,
    /// Imported opsets: domain (`""` for the default ONNX domain) → version.
    pub opsets: BTreeMap<String, i64>,
    pub producer: String,
    /// What the model says about itself (ONNX Runtime's `ModelMetadata`).
    pub metadata: ModelMetadata,
    pub graph: Graph,
}

/// The descriptive fields of a model file: none of them changes what the model computes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelMetadata {
    pub producer_version: String,
    pub domain: String,
    /// `None` when the file does not set it.
    pub model_version: Option<i64>,
    /// The model's `doc_string`.
    pub description: String,
    pub graph_name: String,
    /// The main graph's `doc_string`.
    pub graph_description: String,
    /// `metadata_props`, in file order (a later duplicate key replaces an earlier one's value).
    pub custom: BTreeMap<String, String>,
    /// Graph inputs that also have an initializer (IR < 4 lists every initializer as an input):
    /// ONNX Runtime lets a run override them; here they are constants of the session.
    pub overridable_initializers: Vec<String>,
}

impl Model {
    /// The opset version imported for `domain` (`""` and `ai.onnx` are the same domain).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        self.opsets.get(normalize_domain(domain)).copied()
    }
}

/// `ai.onnx` is the default domain, also spelled as the empty string.
pub fn normalize_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

/// A static extent of a value's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    Known(u64),
    Symbolic(String),
    Unknown,
}

impl Dim {
    /// The extent, when it is a number.
    pub fn known(&self) -> Option<u64> {
        match self {
            Dim::Known(k) => Some(*k),
            _ => None,
        }
    }

    /// The symbol, when the extent is named.
    pub fn symbol(&self) -> Option<&str> {
        match self {
            Dim::Symbolic(s) => Some(s),
            _ => None,
        }
    }
}

/// What kind of thing flows along an edge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueType {
    /// A dense tensor; element type and shape where known.
    Tensor {
        elem_type: Option<ElementType>,
        shape: Option<Vec<Dim>>,
    },
    /// A sequence of values of one type.
    Sequence(Box<ValueType>),
    /// A map (`ai.onnx.ml`) from int64 or string keys to values.
    Map {
        key: ElementType,
        value: Box<ValueType>,
    },
    /// A value of the inner type, or none.
    Optional(Box<ValueType>),
    /// A sparse tensor (declared by models; no op here makes or reads one).
    SparseTensor,
    /// Nothing declared.
    Unknown,
}

/// A value (edge) of the graph.
#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    pub ty: ValueType,
    pub producer: Option<NodeId>,
    pub consumers: Vec<NodeId>,
    /// Constant data, for initializers: shared, so that copies of the graph (subgraphs for EPs,
    /// rewritten graphs) share the weights instead of copying them.
    pub initializer: Option<Arc<Tensor>>,
    pub is_graph_input: bool,
    pub is_graph_output: bool,
    /// The shape in `ty` was inferred by the host, not declared by the model.
    pub shape_inferred: bool,
    /// The model declares the shape in `ty`, and the host's inference from the producing node's
    /// inputs gives the same: a kernel output against it is the kernel's error, where against an
    /// unconfirmed declaration it may be the model's (see `session::run::check_output`).
    pub shape_confirmed: bool,
}

impl ValueType {
    /// Whether `value` fits this declared type (unknown parts always fit; shapes are checked
    /// elsewhere).
    pub fn admits(&self, value: &RuntimeValue) -> bool {
        match (self, value) {
            (ValueType::Unknown, _) => true,
            (
                ValueType::Tensor { elem_type, .. },
                RuntimeValue::Host(_) | RuntimeValue::Device(_),
            ) => elem_type.is_none_or(|t| Some(t) == value.elem_type()),
            (ValueType::Sequence(inner), RuntimeValue::Sequence(s)) => {
                s.items().iter().all(|v| inner.admits(v))
                    && match (inner.as_ref(), s.elem_type()) {
                        (
                            ValueType::Tensor {
                                elem_type: Some(want),
                                ..
                            },
                            Some(have),
                        ) => *want == have,
                        _ => true,
                    }
            }
            (ValueType::Map { key, value }, RuntimeValue::Map(m)) => {
                (*key == ElementType::Undefined || *key == m.keys().elem_type())
                    && match value.as_ref() {
                        ValueType::Tensor {
                            elem_type: Some(t), ..
                        } => *t == m.values().elem_type(),
                        _ => true,
                    }
            }
            (ValueType::Optional(inner), RuntimeValue::Optional(v)) => {
                v.as_deref().is_none_or(|v| inner.admits(v))
            }
            // ONNX lets an optional input take a plain value.
            (ValueType::Optional(inner), v) => inner.admits(v),
            _ => false,
        }
    }

    /// Whether the value is something other than a tensor (a sequence, map, optional or
    /// sparse tensor); `false` for tensors and for values of unknown type.
    pub fn is_non_tensor(&self) -> bool {
        !matches!(self, ValueType::Tensor { .. } | ValueType::Unknown)
    }

    /// The element type of the tensors this type holds, however deeply nested.
    pub fn innermost_elem_type(&self) -> Option<ElementType> {
        match self {
            ValueType::Tensor { elem_type, .. } => *elem_type,
            ValueType::Sequence(t) | ValueType::Optional(t) => t.innermost_elem_type(),
            ValueType::Map { value, .. } => value.innermost_elem_type(),
            ValueType::SparseTensor | ValueType::Unknown => None,
        }
    }
}

impl std::fmt::Display for ValueType {
    /// As ONNX spells types: `tensor(float)`, `seq(tensor(int64))`, `map(string,tensor(float))`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValueType::Tensor {
                elem_type: Some(t), ..
            } => write!(f, "tensor({})", t.onnx_name()),
            ValueType::Tensor {
                elem_type: None, ..
            } => write!(f, "tensor"),
            ValueType::Sequence(t) => write!(f, "seq({t})"),
            ValueType::Map { key, value } => write!(f, "map({},{value})", key.onnx_name()),
            ValueType::Optional(t) => write!(f, "optional({t})"),
            ValueType::SparseTensor => write!(f, "sparse_tensor"),
            ValueType::Unknown => write!(f, "unknown"),
        }
    }
}

impl Value {
    pub fn elem_type(&self) -> Option<ElementType> {
        match &self.ty {
            ValueType::Tensor { elem_type, .. } => *elem_type,
            _ => None,
        }
    }

    pub fn shape(&self) -> Option<&[Dim]> {
        match &self.ty {
            ValueType::Tensor { shape: Some(s), .. } => Some(s),
            _ => None,
        }
    }
}

/// An attribute value.
#[derive(Clone, Debug)]
pub enum AttributeValue {
    Float(f32),
    Int(i64),
    String(Vec<u8>),
    Tensor(Arc<Tensor>),
    Graph(Box<Graph>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<Vec<u8>>),
    Tensors(Vec<Arc<Tensor>>),
    Graphs(Vec<Graph>),
    /// A kind kept by name only (sparse tensors, type protos).
    Other(&'static str),
}

#[derive(Clone, Debug)]
pub struct Attribute {
    pub name: String,
    pub value: AttributeValue,
}

/// A node: one operator call.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    /// `""` for the default ONNX domain.
    pub domain: String,
    /// `None` for an absent optional input (empty name in ONNX).
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<Option<ValueId>>,
    /// Values its nested graphs (If/Loop/Scan bodies) read from this graph by name: inputs of
    /// the node as far as scheduling and partitioning are concerned.
    pub implicit_inputs: Vec<ValueId>,
    pub attributes: Vec<Attribute>,
}

impl Node {
    /// Every value the node reads: its inputs, then the values its nested graphs read.
    pub fn all_inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.inputs
            .iter()
            .flatten()
            .copied()
            .chain(self.implicit_inputs.iter().copied())
    }

    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|a| a.name == name)
            .map(|a| &a.value)
    }

    /// `name` if the node has one, else `op_type` with its index, for messages.
    pub fn display_name(&self, id: NodeId) -> String {
        if self.name.is_empty() {
            format!("{}#{id}", self.op_type)
        } else {
            self.name.clone()
        }
    }
}

/// A graph: nodes in topological order over values.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    pub nodes: Vec<Node>,
    pub values: Vec<Value>,
    /// Graph inputs the caller provides (initializers excluded).
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Names of values read from enclosing graphs (nested graphs only).
    pub outer_refs: Vec<String>,
    pub(crate) by_name: HashMap<String, ValueId>,
}

impl Graph {
    pub fn value_id(&self, name: &str) -> Option<ValueId> {
        self.by_name.get(name).copied()
    }

    /// Values that are initializers.
    pub fn initializers(&self) -> impl Iterator<Item = (ValueId, &Tensor)> {
        self.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.initializer.as_deref().map(|t| (i, t)))
    }
}
