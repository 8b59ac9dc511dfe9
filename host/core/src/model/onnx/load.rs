//! ONNX bytes → [`Model`]: decode, check, resolve names to ids, sort topologically.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

use prost::Message;

use super::proto;
use crate::error::{Error, Result};
use crate::model::ir::*;
use crate::value::{ElementType, Tensor};
use crate::value::{Map, Sequence, Value as DynValue};

/// Oldest IR version accepted (the first with opset imports).
pub const MIN_IR_VERSION: i64 = 3;
/// Newest IR version accepted (ONNX 1.23: IR 14 adds FLOAT6E2M3 and FLOAT6E3M2, read as unsupported
/// element types where a tensor uses them).
pub const MAX_IR_VERSION: i64 = 14;

/// Loads a model file; external data is read relative to its folder. Tensor data is decoded
/// as slices of the file's bytes and copied once, into the tensors, so loading holds at most
/// the file and the tensors at the same time.
pub fn load_model_file(path: &Path) -> Result<Model> {
    let bytes = crate::files::read_regular(
        path,
        crate::files::MAX_MODEL_BYTES,
        "the 2 GiB a model file may hold (larger models keep their weights in external data)",
    )
    .map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_model_buf(
        bytes::Bytes::from(bytes),
        &path.display().to_string(),
        path.parent(),
    )
}

/// Loads a model from bytes. `source` names it in messages; external data, if any, is read
/// from `base_dir` (and refused without one).
pub fn load_model_bytes(bytes: &[u8], source: &str, base_dir: Option<&Path>) -> Result<Model> {
    load_model_buf(bytes, source, base_dir)
}

fn load_model_buf(bytes: impl bytes::Buf, source: &str, base_dir: Option<&Path>) -> Result<Model> {
    let model_err = |message: String| Error::Model {
        source_name: source.to_string(),
        message,
    };
    if !bytes.has_remaining() {
        return Err(model_err("the file is empty, not an ONNX model".into()));
    }
    if bytes.remaining() as u64 > crate::files::MAX_MODEL_BYTES {
        return Err(model_err(format!(
            "{} bytes, more than the 2 GiB an ONNX model may hold (protobuf's limit); larger \
             models keep their weights in external data files",
            bytes.remaining()
        )));
    }
    let proto = proto::ModelProto::decode(bytes).map_err(|e| {
        model_err(format!(
            "not a valid ONNX model (protobuf decoding failed: {e}); the file may be truncated or of another format"
        ))
    })?;
    let Some(ir_version) = proto.ir_version else {
        return Err(model_err("not an ONNX model: no ir_version field".into()));
    };
    let Some(graph) = proto.graph.as_ref() else {
        return Err(model_err("not an ONNX model: it has no graph".into()));
    };
    if !(MIN_IR_VERSION..=MAX_IR_VERSION).contains(&ir_version) {
        return Err(model_err(format!(
            "unsupported ONNX IR version {ir_version}; this build reads IR versions {MIN_IR_VERSION} to {MAX_IR_VERSION}"
        )));
    }
    let mut opsets = BTreeMap::new();
    for o in &proto.opset_import {
        let domain = normalize_domain(o.domain.as_deref().unwrap_or("")).to_string();
        opsets.insert(domain, o.version.unwrap_or(0));
    }
    for (domain, &version) in &opsets {
        if let Some(newest) = super::schema::newest_opset(domain)
            && version > newest
        {
            let name = if domain.is_empty() { "ai.onnx" } else { domain };
            return Err(model_err(format!(
                "the model imports {name} opset {version}, newer than this build knows ({name} up \
                 to opset {newest}): what its operators mean there is not defined yet. Convert \
                 the model to opset {newest} or older (onnx.version_converter), or use an epx \
                 built for that ONNX release"
            )));
        }
    }
    if !opsets.contains_key("") {
        // IR ≥ 3 requires an import of the default domain when default ops are used; a model
        // without one cannot say which semantics its ops have.
        if graph
            .node
            .iter()
            .any(|n| normalize_domain(n.domain.as_deref().unwrap_or("")).is_empty())
        {
            return Err(model_err(
                "the model uses ONNX operators but imports no default-domain opset".into(),
            ));
        }
    }
    let ctx = Ctx { source, base_dir };
    let mut graph = ctx.graph(graph, &HashSet::new())?;
    super::schema::check_graph(&graph, &opsets).map_err(|m| ctx.invalid(m))?;
    crate::model::infer::infer_element_types(&mut graph, &opsets);
    crate::model::infer::infer_shapes(&mut graph);
    Ok(Model {
        source: source.to_string(),
        base_dir: base_dir.map(Path::to_path_buf),
        ir_version,
        opsets,
        producer: proto.producer_name.clone().unwrap_or_default(),
        metadata: metadata(&proto),
        graph,
    })
}

/// The descriptive fields of `proto` (see [`ModelMetadata`]).
fn metadata(proto: &proto::ModelProto) -> ModelMetadata {
    let graph = proto.graph.as_ref();
    let initializers: HashSet<&str> = graph
        .map(|g| {
            g.initializer
                .iter()
                .filter_map(|t| t.name.as_deref())
                .collect()
        })
        .unwrap_or_default();
    ModelMetadata {
        producer_version: proto.producer_version.clone().unwrap_or_default(),
        domain: proto.domain.clone().unwrap_or_default(),
        model_version: proto.model_version,
        description: proto.doc_string.clone().unwrap_or_default(),
        graph_name: graph.and_then(|g| g.name.clone()).unwrap_or_default(),
        graph_description: graph.and_then(|g| g.doc_string.clone()).unwrap_or_default(),
        custom: proto
            .metadata_props
            .iter()
            .map(|e| {
                let key = e.key.clone().unwrap_or_default();
                (key, e.value.clone().unwrap_or_default())
            })
            .collect(),
        overridable_initializers: graph
            .map(|g| {
                g.input
                    .iter()
                    .filter_map(|vi| vi.name.as_deref())
                    .filter(|n| initializers.contains(n))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Decodes a serialized `TensorProto` (as the ONNX test data `.pb` files hold).
pub fn load_tensor_bytes(bytes: &[u8], source: &str) -> Result<(String, Tensor)> {
    let t = proto::TensorProto::decode(bytes).map_err(|e| Error::Model {
        source_name: source.to_string(),
        message: format!("not a TensorProto: {e}"),
    })?;
    let ctx = Ctx {
        source,
        base_dir: None,
    };
    let tensor = ctx.tensor(&t)?;
    Ok((t.name.clone().unwrap_or_default(), tensor))
}

/// Decodes a serialized value of type `ty` as ONNX test data stores it: a `TensorProto`, or a
/// `SequenceProto`, `MapProto` or `OptionalProto` for those types.
pub fn load_value_bytes(bytes: &[u8], ty: &ValueType, source: &str) -> Result<(String, DynValue)> {
    let ctx = Ctx {
        source,
        base_dir: None,
    };
    let not = |what: &str, e: prost::DecodeError| Error::Model {
        source_name: source.to_string(),
        message: format!("not a {what}: {e}"),
    };
    match ty {
        ValueType::Sequence(_) => {
            let p = proto::SequenceProto::decode(bytes).map_err(|e| not("SequenceProto", e))?;
            Ok((
                p.name.clone().unwrap_or_default(),
                ctx.sequence_value(&p, 0)?,
            ))
        }
        ValueType::Map { .. } => {
            let p = proto::MapProto::decode(bytes).map_err(|e| not("MapProto", e))?;
            Ok((p.name.clone().unwrap_or_default(), ctx.map_value(&p, 0)?))
        }
        ValueType::Optional(_) => {
            let p = proto::OptionalProto::decode(bytes).map_err(|e| not("OptionalProto", e))?;
            Ok((
                p.name.clone().unwrap_or_default(),
                ctx.optional_value(&p, 0)?,
            ))
        }
        _ => {
            let (name, t) = load_tensor_bytes(bytes, source)?;
            Ok((name, DynValue::Host(t)))
        }
    }
}

/// A map's values, stored as a sequence of scalars (or of one 1-D tensor), as one 1-D tensor.
fn map_values(s: Sequence, len: usize) -> std::result::Result<Tensor, String> {
    let tensors = s
        .tensors()
        .ok_or_else(|| "map values must be tensors".to_string())?;
    if let [one] = tensors.as_slice() {
        if one.shape() == [len] {
            return one.try_clone().map_err(|e| e.to_string());
        }
    }
    let Some(first) = tensors.first() else {
        return Tensor::zeros(s.elem_type().unwrap_or(ElementType::Float), &[0])
            .map_err(|e| e.to_string());
    };
    if tensors
        .iter()
        .any(|t| t.len() != 1 || t.elem_type() != first.elem_type())
    {
        return Err("map values must be scalars of one type".into());
    }
    match first.strings() {
        Some(_) => Tensor::from_strings(
            &[tensors.len()],
            tensors
                .iter()
                .map(|t| t.strings().map_or_else(Vec::new, |s| s[0].clone()))
                .collect(),
        ),
        None => {
            let bytes: Vec<u8> = tensors
                .iter()
                .flat_map(|t| t.bytes().unwrap_or_default().to_vec())
                .collect();
            Tensor::from_bytes(first.elem_type(), &[tensors.len()], &bytes)
        }
    }
    .map_err(|e| e.to_string())
}

/// Deepest nesting of sequences, maps and optionals read from data.
const MAX_VALUE_DEPTH: usize = 32;

struct Ctx<'a> {
    source: &'a str,
    base_dir: Option<&'a Path>,
}

impl Ctx<'_> {
    fn sequence_value(&self, p: &proto::SequenceProto, depth: usize) -> Result<DynValue> {
        if depth > MAX_VALUE_DEPTH {
            return Err(self.err("values nested more than 32 deep"));
        }
        let mut items = Vec::new();
        let mut elem_type = None;
        match p.elem_type.unwrap_or(0) {
            1 => {
                for t in &p.tensor_values {
                    let t = self.tensor(t)?;
                    elem_type = Some(t.elem_type());
                    items.push(DynValue::Host(t));
                }
            }
            3 => {
                for s in &p.sequence_values {
                    items.push(self.sequence_value(s, depth + 1)?);
                }
            }
            4 => {
                for m in &p.map_values {
                    items.push(self.map_value(m, depth + 1)?);
                }
            }
            5 => {
                for o in &p.optional_values {
                    items.push(self.optional_value(o, depth + 1)?);
                }
            }
            0 if p.tensor_values.is_empty()
                && p.sequence_values.is_empty()
                && p.map_values.is_empty()
                && p.optional_values.is_empty() => {}
            2 => return Err(self.err("sequences of sparse tensors are not supported")),
            other => return Err(self.err(format!("SequenceProto elem_type {other} is unknown"))),
        }
        Ok(DynValue::Sequence(
            Sequence::new(elem_type, items).map_err(|e| self.err(e.to_string()))?,
        ))
    }

    fn map_value(&self, p: &proto::MapProto, depth: usize) -> Result<DynValue> {
        let keys = if p.key_type == Some(ElementType::String.onnx_code()) {
            let n = p.string_keys.len();
            Tensor::from_strings(&[n], p.string_keys.clone())?
        } else {
            Tensor::from_array(ndarray::Array1::from(p.keys.clone()))
        };
        let values = match &p.values {
            Some(seq) => match self.sequence_value(seq, depth + 1)? {
                DynValue::Sequence(s) => map_values(s, keys.len()).map_err(|m| self.err(m))?,
                _ => return Err(self.err("map values must be a sequence")),
            },
            None => return Err(self.err("MapProto has no values")),
        };
        Ok(DynValue::Map(
            Map::new(keys, values).map_err(|e| self.err(e.to_string()))?,
        ))
    }

    fn optional_value(&self, p: &proto::OptionalProto, depth: usize) -> Result<DynValue> {
        if depth > MAX_VALUE_DEPTH {
            return Err(self.err("values nested more than 32 deep"));
        }
        let inner = if let Some(t) = &p.tensor_value {
            Some(DynValue::Host(self.tensor(t)?))
        } else if let Some(s) = &p.sequence_value {
            Some(self.sequence_value(s, depth + 1)?)
        } else if let Some(m) = &p.map_value {
            Some(self.map_value(m, depth + 1)?)
        } else if let Some(o) = &p.optional_value {
            Some(self.optional_value(o, depth + 1)?)
        } else if p.sparse_tensor_value.is_some() {
            return Err(self.err("optional sparse tensors are not supported"));
        } else {
            None
        };
        Ok(DynValue::Optional(inner.map(Box::new)))
    }

    fn err(&self, message: impl Into<String>) -> Error {
        Error::Model {
            source_name: self.source.to_string(),
            message: message.into(),
        }
    }

    fn invalid(&self, message: impl Into<String>) -> Error {
        Error::InvalidGraph {
            source_name: self.source.to_string(),
            message: message.into(),
        }
    }

    /// Builds a graph. `outer` holds names visible from enclosing graphs.
    fn graph(&self, g: &proto::GraphProto, outer: &HashSet<String>) -> Result<Graph> {
        let mut graph = Graph {
            name: g.name.clone().unwrap_or_default(),
            ..Graph::default()
        };
        let add_value = |graph: &mut Graph, name: &str, ty: ValueType| -> ValueId {
            if let Some(&id) = graph.by_name.get(name) {
                if graph.values[id].ty == ValueType::Unknown {
                    graph.values[id].ty = ty;
                }
                return id;
            }
            let id = graph.values.len();
            graph.values.push(Value {
                name: name.to_string(),
                ty,
                producer: None,
                consumers: Vec::new(),
                initializer: None,
                is_graph_input: false,
                is_graph_output: false,
                shape_inferred: false,
                shape_confirmed: false,
            });
            graph.by_name.insert(name.to_string(), id);
            id
        };

        for init in &g.initializer {
            let name = init.name.clone().unwrap_or_default();
            if name.is_empty() {
                return Err(self.invalid("an initializer has no name"));
            }
            if graph.by_name.contains_key(&name) {
                return Err(self.invalid(format!("initializer `{name}` is defined twice")));
            }
            let tensor = self.tensor(init).map_err(|e| match e {
                // Its message without the model's name, which the new error carries.
                Error::Model { message, .. } | Error::InvalidGraph { message, .. } => {
                    self.invalid(format!("initializer `{name}`: {message}"))
                }
                other => self.invalid(format!("initializer `{name}`: {other}")),
            })?;
            let ty = ValueType::Tensor {
                elem_type: Some(tensor.elem_type()),
                shape: Some(
                    tensor
                        .shape()
                        .iter()
                        .map(|&d| Dim::Known(d as u64))
                        .collect(),
                ),
            };
            let id = add_value(&mut graph, &name, ty);
            graph.values[id].initializer = Some(std::sync::Arc::new(tensor));
        }
        if !g.sparse_initializer.is_empty() {
            return Err(self.err("sparse initializers are not supported"));
        }
        for vi in &g.input {
            let name = vi.name.clone().unwrap_or_default();
            let ty = self.value_type(vi.r#type.as_ref());
            let id = add_value(&mut graph, &name, ty);
            // An input with an initializer is a constant with a default (IR < 4 lists every
            // initializer as an input too): it is not something the caller must provide.
            if graph.values[id].initializer.is_none() {
                if graph.values[id].is_graph_input {
                    return Err(self.invalid(format!("graph input `{name}` is listed twice")));
                }
                graph.values[id].is_graph_input = true;
                graph.inputs.push(id);
            }
        }
        for vi in &g.value_info {
            let name = vi.name.clone().unwrap_or_default();
            add_value(&mut graph, &name, self.value_type(vi.r#type.as_ref()));
        }

        // Nodes in file order first; sorted below.
        let mut produced_by: HashMap<String, usize> = HashMap::new();
        for (i, n) in g.node.iter().enumerate() {
            for out in n.output.iter().filter(|o| !o.is_empty()) {
                if produced_by.insert(out.clone(), i).is_some() {
                    return Err(self.invalid(format!("value `{out}` is produced by two nodes")));
                }
                if let Some(&id) = graph.by_name.get(out.as_str()) {
                    if graph.values[id].initializer.is_some() || graph.values[id].is_graph_input {
                        return Err(self.invalid(format!(
                            "node {} writes `{out}`, which is a graph input or initializer",
                            node_label(n, i)
                        )));
                    }
                }
            }
        }
        // Names visible to nested graphs: everything of this graph plus what the outer ones see.
        let mut visible: HashSet<String> = outer.clone();
        visible.extend(graph.by_name.keys().cloned());
        visible.extend(produced_by.keys().cloned());

        // Attributes first: nested graphs (If/Loop/Scan bodies) may read values of this graph
        // by name, and those implicit reads order the nodes as much as explicit inputs do.
        let mut parsed: Vec<Option<(Vec<Attribute>, Vec<String>)>> =
            Vec::with_capacity(g.node.len());
        for (i, n) in g.node.iter().enumerate() {
            let mut attributes = Vec::with_capacity(n.attribute.len());
            for a in &n.attribute {
                attributes.push(self.attribute(a, &visible).map_err(|e| match e {
                    Error::Model { message, .. } | Error::InvalidGraph { message, .. } => {
                        self.invalid(format!(
                            "node {}: attribute `{}`: {message}",
                            node_label(n, i),
                            a.name()
                        ))
                    }
                    other => other,
                })?);
            }
            let mut implicit: Vec<String> = Vec::new();
            for a in &attributes {
                let graphs: Vec<&Graph> = match &a.value {
                    AttributeValue::Graph(b) => vec![b.as_ref()],
                    AttributeValue::Graphs(v) => v.iter().collect(),
                    _ => Vec::new(),
                };
                let mut listed: std::collections::HashSet<String> =
                    implicit.iter().cloned().collect();
                for name in graphs.iter().flat_map(|b| b.outer_refs.iter()) {
                    if listed.insert(name.clone()) {
                        implicit.push(name.clone());
                    }
                }
            }
            parsed.push(Some((attributes, implicit)));
        }
        let implicit_names: Vec<Vec<String>> = parsed
            .iter()
            .map(|p| p.as_ref().map(|(_, i)| i.clone()).unwrap_or_default())
            .collect();
        let order =
            self.topological_order(g, &produced_by, &graph.by_name, outer, &implicit_names)?;
        // The names read from an enclosing graph, each once.
        let mut outer_seen: std::collections::HashSet<String> =
            graph.outer_refs.iter().cloned().collect();
        for &i in &order {
            let n = &g.node[i];
            let mut inputs = Vec::with_capacity(n.input.len());
            for name in &n.input {
                if name.is_empty() {
                    inputs.push(None);
                    continue;
                }
                let known =
                    graph.by_name.contains_key(name.as_str()) || produced_by.contains_key(name);
                // Read from an enclosing graph (nested graphs only).
                if !known && outer_seen.insert(name.clone()) {
                    graph.outer_refs.push(name.clone());
                }
                inputs.push(Some(add_value(&mut graph, name, ValueType::Unknown)));
            }
            let mut outputs = Vec::with_capacity(n.output.len());
            for name in &n.output {
                outputs.push(if name.is_empty() {
                    None
                } else {
                    Some(add_value(&mut graph, name, ValueType::Unknown))
                });
            }
            let (attributes, implicit) = parsed[i].take().unwrap_or_default();
            let mut implicit_inputs = Vec::with_capacity(implicit.len());
            for name in &implicit {
                let known =
                    graph.by_name.contains_key(name.as_str()) || produced_by.contains_key(name);
                if !known && outer_seen.insert(name.clone()) {
                    // Read from further out: this graph reads it implicitly too.
                    graph.outer_refs.push(name.clone());
                }
                implicit_inputs.push(add_value(&mut graph, name, ValueType::Unknown));
            }
            let id = graph.nodes.len();
            for v in outputs.iter().flatten() {
                graph.values[*v].producer = Some(id);
            }
            for v in inputs.iter().flatten().chain(&implicit_inputs) {
                // Node ids come in increasing order: a node already listed is the last one.
                if graph.values[*v].consumers.last() != Some(&id) {
                    graph.values[*v].consumers.push(id);
                }
            }
            graph.nodes.push(Node {
                name: n.name.clone().unwrap_or_default(),
                op_type: n.op_type.clone().unwrap_or_default(),
                domain: normalize_domain(n.domain.as_deref().unwrap_or("")).to_string(),
                inputs,
                outputs,
                implicit_inputs,
                attributes,
            });
        }
        for vi in &g.output {
            let name = vi.name.clone().unwrap_or_default();
            let Some(&id) = graph.by_name.get(name.as_str()) else {
                return Err(self.invalid(format!(
                    "graph output `{name}` is produced by no node and is no input"
                )));
            };
            let declared = self.value_type(vi.r#type.as_ref());
            if declared != ValueType::Unknown && graph.values[id].initializer.is_none() {
                graph.values[id].ty = declared;
            }
            graph.values[id].is_graph_output = true;
            graph.outputs.push(id);
        }
        Ok(graph)
    }

    /// Kahn's algorithm, keeping file order among ready nodes. Reports dangling inputs and
    /// cycles by name.
    fn topological_order(
        &self,
        g: &proto::GraphProto,
        produced_by: &HashMap<String, usize>,
        defined: &HashMap<String, ValueId>,
        outer: &HashSet<String>,
        implicit: &[Vec<String>],
    ) -> Result<Vec<usize>> {
        let n = g.node.len();
        let mut indegree = vec![0usize; n];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in g.node.iter().enumerate() {
            let mut seen = HashSet::new();
            let names = node
                .input
                .iter()
                .filter(|s| !s.is_empty())
                .chain(implicit.get(i).into_iter().flatten());
            for name in names {
                if let Some(&p) = produced_by.get(name) {
                    if seen.insert(p) {
                        indegree[i] += 1;
                        users[p].push(i);
                    }
                } else if !defined.contains_key(name.as_str()) && !outer.contains(name) {
                    return Err(self.invalid(format!(
                        "node {} reads `{name}`, which no node produces and is no graph input or initializer (dangling input)",
                        node_label(node, i)
                    )));
                }
            }
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
            .filter(|&i| indegree[i] == 0)
            .map(std::cmp::Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            order.push(i);
            for &u in &users[i] {
                indegree[u] -= 1;
                if indegree[u] == 0 {
                    ready.push(std::cmp::Reverse(u));
                }
            }
        }
        if order.len() != n {
            let stuck: Vec<String> = (0..n)
                .filter(|&i| indegree[i] > 0)
                .take(8)
                .map(|i| node_label(&g.node[i], i))
                .collect();
            return Err(self.invalid(format!(
                "the graph has a cycle through nodes {}",
                stuck.join(", ")
            )));
        }
        Ok(order)
    }

    fn value_type(&self, t: Option<&proto::TypeProto>) -> ValueType {
        use proto::type_proto::Value as V;
        match t.and_then(|t| t.value.as_ref()) {
            Some(V::TensorType(tt)) => ValueType::Tensor {
                elem_type: tt
                    .elem_type
                    .and_then(ElementType::from_onnx)
                    .filter(|e| *e != ElementType::Undefined),
                shape: tt.shape.as_ref().map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(proto::tensor_shape_proto::dimension::Value::DimValue(v))
                                if *v >= 0 =>
                            {
                                Dim::Known(*v as u64)
                            }
                            Some(proto::tensor_shape_proto::dimension::Value::DimParam(p))
                                if !p.is_empty() =>
                            {
                                Dim::Symbolic(p.clone())
                            }
                            _ => Dim::Unknown,
                        })
                        .collect()
                }),
            },
            Some(V::SequenceType(st)) => {
                ValueType::Sequence(Box::new(self.value_type(st.elem_type.as_deref())))
            }
            Some(V::MapType(mt)) => ValueType::Map {
                key: mt
                    .key_type
                    .and_then(ElementType::from_onnx)
                    .unwrap_or(ElementType::Undefined),
                value: Box::new(self.value_type(mt.value_type.as_deref())),
            },
            Some(V::OptionalType(ot)) => {
                ValueType::Optional(Box::new(self.value_type(ot.elem_type.as_deref())))
            }
            Some(V::SparseTensorType(_)) => ValueType::SparseTensor,
            None => ValueType::Unknown,
        }
    }

    fn attribute(&self, a: &proto::AttributeProto, visible: &HashSet<String>) -> Result<Attribute> {
        use proto::attribute_proto::AttributeType as T;
        let name = a.name.clone().unwrap_or_default();
        if a.ref_attr_name.as_deref().is_some_and(|r| !r.is_empty()) {
            return Err(self.err("attribute references are only valid inside functions"));
        }
        // Older writers leave `type` unset; infer it from the field that is set.
        let kind = match a.r#type.and_then(|t| T::try_from(t).ok()) {
            Some(k) if k != T::Undefined => k,
            _ => {
                if a.f.is_some() {
                    T::Float
                } else if a.i.is_some() {
                    T::Int
                } else if a.s.is_some() {
                    T::String
                } else if a.t.is_some() {
                    T::Tensor
                } else if a.g.is_some() {
                    T::Graph
                } else if !a.floats.is_empty() {
                    T::Floats
                } else if !a.ints.is_empty() {
                    T::Ints
                } else if !a.strings.is_empty() {
                    T::Strings
                } else if !a.tensors.is_empty() {
                    T::Tensors
                } else if !a.graphs.is_empty() {
                    T::Graphs
                } else {
                    return Err(self.err("attribute has no type and no value"));
                }
            }
        };
        let value = match kind {
            T::Float => AttributeValue::Float(a.f.unwrap_or(0.0)),
            T::Int => AttributeValue::Int(a.i.unwrap_or(0)),
            T::String => AttributeValue::String(a.s.clone().unwrap_or_default()),
            T::Tensor => AttributeValue::Tensor(std::sync::Arc::new(
                self.tensor(a.t.as_ref().ok_or_else(|| self.err("tensor missing"))?)?,
            )),
            T::Graph => {
                let g = a.g.as_ref().ok_or_else(|| self.err("graph missing"))?;
                AttributeValue::Graph(Box::new(self.graph(g, visible)?))
            }
            T::Floats => AttributeValue::Floats(a.floats.clone()),
            T::Ints => AttributeValue::Ints(a.ints.clone()),
            T::Strings => AttributeValue::Strings(a.strings.clone()),
            T::Tensors => AttributeValue::Tensors(
                a.tensors
                    .iter()
                    .map(|t| self.tensor(t).map(std::sync::Arc::new))
                    .collect::<Result<_>>()?,
            ),
            T::Graphs => AttributeValue::Graphs(
                a.graphs
                    .iter()
                    .map(|g| self.graph(g, visible))
                    .collect::<Result<_>>()?,
            ),
            T::SparseTensor | T::SparseTensors => AttributeValue::Other("sparse tensor"),
            T::TypeProto | T::TypeProtos => AttributeValue::Other("type proto"),
            T::Undefined => AttributeValue::Other("undefined"),
        };
        Ok(Attribute { name, value })
    }

    /// Decodes a `TensorProto`'s data, from raw bytes, typed fields or external data.
    fn tensor(&self, t: &proto::TensorProto) -> Result<Tensor> {
        let code = t.data_type.unwrap_or(0);
        let ty = ElementType::from_onnx(code)
            .filter(|e| *e != ElementType::Undefined)
            .ok_or_else(|| self.err(format!("tensor has unknown data type {code}")))?;
        let mut shape = Vec::with_capacity(t.dims.len());
        for &d in &t.dims {
            shape.push(
                usize::try_from(d)
                    .map_err(|_| self.err(format!("tensor has negative dimension {d}")))?,
            );
        }
        let count = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| self.err(format!("tensor shape {shape:?} is too large")))?;
        if t.segment.is_some() {
            return Err(self.err("segmented tensors are not supported"));
        }
        if ty == ElementType::String {
            if t.string_data.len() != count {
                return Err(self.err(format!(
                    "string tensor of shape {shape:?} has {} strings",
                    t.string_data.len()
                )));
            }
            return Tensor::from_strings(&shape, t.string_data.clone());
        }
        let nbytes = ty
            .storage_bytes(count)
            .ok_or_else(|| self.err(format!("{ty} tensor of shape {shape:?} is too large")))?;
        let external = t.data_location == Some(proto::tensor_proto::DataLocation::External as i32);
        let owned;
        let bytes: &[u8] = if external {
            owned = self.external_data(t, nbytes)?;
            &owned
        } else if let Some(raw) = &t.raw_data {
            raw
        } else {
            owned = typed_field_bytes(t, ty, count).map_err(|m| self.err(m))?;
            &owned
        };
        if bytes.len() != nbytes {
            return Err(self.err(format!(
                "{ty} tensor of shape {shape:?} needs {nbytes} bytes of data, has {}",
                bytes.len()
            )));
        }
        Tensor::from_bytes(ty, &shape, bytes).map_err(|e| self.err(e.to_string()))
    }

    fn external_data(&self, t: &proto::TensorProto, nbytes: usize) -> Result<Vec<u8>> {
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for kv in &t.external_data {
            let value = kv.value.clone().unwrap_or_default();
            match kv.key.as_deref().unwrap_or("") {
                "location" => location = Some(value),
                "offset" => {
                    offset = value
                        .parse()
                        .map_err(|_| self.err(format!("bad external data offset `{value}`")))?
                }
                "length" => {
                    length = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| self.err(format!("bad external data length `{value}`")))?,
                    )
                }
                _ => {}
            }
        }
        let location = location.ok_or_else(|| self.err("external tensor has no location"))?;
        let rel = Path::new(&location);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
        {
            return Err(self.err(format!(
                "external data location `{location}` must stay inside the model's folder"
            )));
        }
        let base = self
            .base_dir
            .ok_or_else(|| self.err(format!("tensor data is in external file `{location}`, but the model was loaded from bytes without a folder")))?;
        let path = base.join(rel);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        // Symbolic links may not lead out of the model's folder (a link to /etc/passwd, or
        // through a linked subfolder): the file is opened by its resolved path inside it.
        let real = std::fs::canonicalize(&path).map_err(io)?;
        let real_base = std::fs::canonicalize(base).map_err(|source| Error::Io {
            path: base.to_path_buf(),
            source,
        })?;
        if !real.starts_with(&real_base) {
            return Err(self.err(format!(
                "external data `{location}` resolves to {}, outside the model's folder {} \
                 (through a symbolic link); copy the file into the folder",
                real.display(),
                real_base.display()
            )));
        }
        // A FIFO would block the open and a device never ends: only a regular file is read,
        // told by what was opened.
        let (mut f, meta) = crate::files::open_regular(&real)
            .map_err(|e| self.err(format!("external data `{location}`: {e}")))?;
        let file_len = meta.len();
        let want = length.unwrap_or(nbytes as u64);
        if offset.checked_add(want).is_none_or(|end| end > file_len) {
            return Err(self.err(format!(
                "external data `{location}`: range {offset}+{want} is past the end of the file ({file_len} bytes)"
            )));
        }
        // A sparse file can be larger than the machine's memory while taking no disk.
        let limit = crate::max_tensor_bytes();
        if want > limit {
            return Err(self.err(format!(
                "external data `{location}`: {want} bytes, more than the {limit} this host \
                 allocates for one tensor (EPX_MAX_TENSOR_BYTES; default: the machine's memory)"
            )));
        }
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(want as usize).map_err(|_| {
            self.err(format!(
                "external data `{location}`: cannot allocate {want} bytes"
            ))
        })?;
        f.take(want).read_to_end(&mut buf).map_err(io)?;
        if buf.len() as u64 != want {
            return Err(self.err(format!(
                "external data `{location}`: the file ended after {} of {want} bytes",
                buf.len()
            )));
        }
        Ok(buf)
    }
}

fn node_label(n: &proto::NodeProto, i: usize) -> String {
    match n.name.as_deref() {
        Some(name) if !name.is_empty() => format!("`{name}` ({})", n.op_type()),
        _ => format!("#{i} ({})", n.op_type()),
    }
}

/// The little-endian bytes of a tensor stored in the typed repeated fields.
fn typed_field_bytes(
    t: &proto::TensorProto,
    ty: ElementType,
    count: usize,
) -> std::result::Result<Vec<u8>, std::string::String> {
    fn check<T>(v: &[T], n: usize, field: &str) -> std::result::Result<(), std::string::String> {
        if v.len() == n {
            Ok(())
        } else {
            Err(format!(
                "{field} holds {} values, the shape needs {n}",
                v.len()
            ))
        }
    }
    use ElementType::*;
    let mut out = Vec::new();
    match ty {
        Float => {
            check(&t.float_data, count, "float_data")?;
            t.float_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Complex64 => {
            check(&t.float_data, count * 2, "float_data")?;
            t.float_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Double => {
            check(&t.double_data, count, "double_data")?;
            t.double_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Complex128 => {
            check(&t.double_data, count * 2, "double_data")?;
            t.double_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Int64 => {
            check(&t.int64_data, count, "int64_data")?;
            t.int64_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Uint32 | Uint64 => {
            check(&t.uint64_data, count, "uint64_data")?;
            for v in &t.uint64_data {
                if ty == Uint32 {
                    out.extend_from_slice(&(*v as u32).to_le_bytes());
                } else {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        Int32 => {
            check(&t.int32_data, count, "int32_data")?;
            t.int32_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
        Int16 | Uint16 | Float16 | Bfloat16 => {
            check(&t.int32_data, count, "int32_data")?;
            t.int32_data
                .iter()
                .for_each(|v| out.extend_from_slice(&(*v as u16).to_le_bytes()));
        }
        Int8 | Uint8 | Bool | Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ
        | Float8E8M0 => {
            check(&t.int32_data, count, "int32_data")?;
            t.int32_data.iter().for_each(|v| out.push(*v as u8));
        }
        // Sub-byte types: each int32 holds one byte of packed elements.
        Uint4 | Int4 | Float4E2M1 | Uint2 | Int2 => {
            let bytes = ty.storage_bytes(count).unwrap_or(0);
            check(&t.int32_data, bytes, "int32_data")?;
            t.int32_data.iter().for_each(|v| out.push(*v as u8));
        }
        other => return Err(format!("{other} tensors are not supported")),
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
