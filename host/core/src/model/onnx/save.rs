//! [`Model`] (or a part of it) → ONNX bytes, for EPs that consume ONNX themselves.

use prost::Message;

use super::proto;
use crate::error::{Error, Result};
use crate::model::ir::*;
use crate::value::Tensor;

/// Serializes the nodes `nodes` of `model` as a standalone model whose inputs are `inputs` and
/// outputs are `outputs` (value ids), with the initializers those nodes read.
pub fn subgraph_model_bytes(
    model: &Model,
    g: &Graph,
    nodes: &[u32],
    inputs: &[u32],
    outputs: &[u32],
) -> Result<Vec<u8>> {
    subgraph_bytes(model, g, nodes, inputs, outputs, false)
}

/// As [`subgraph_model_bytes`], with a `value_info` entry for every value the nodes make, so a
/// loader on the other side knows the types and shapes this host knew (inferred or declared)
/// rather than what its own inference finds.
pub fn subgraph_model_bytes_with_shapes(
    model: &Model,
    g: &Graph,
    nodes: &[u32],
    inputs: &[u32],
    outputs: &[u32],
) -> Result<Vec<u8>> {
    subgraph_bytes(model, g, nodes, inputs, outputs, true)
}

fn subgraph_bytes(
    model: &Model,
    g: &Graph,
    nodes: &[u32],
    inputs: &[u32],
    outputs: &[u32],
    shapes: bool,
) -> Result<Vec<u8>> {
    let bad = |m: String| Error::InvalidInput(format!("subgraph: {m}"));
    let value = |id: u32| {
        g.values
            .get(id as usize)
            .ok_or_else(|| bad(format!("value id {id} out of range")))
    };
    let mut graph = proto::GraphProto {
        name: Some(format!("{}_subgraph", g.name)),
        ..Default::default()
    };
    let mut seen_inits = std::collections::HashSet::new();
    for &n in nodes {
        let node = g
            .nodes
            .get(n as usize)
            .ok_or_else(|| bad(format!("node id {n} out of range")))?;
        // Implicit inputs too: an If/Loop/Scan body may read an initializer of this graph.
        for v in node.all_inputs() {
            let val = &g.values[v];
            if let Some(t) = &val.initializer {
                if seen_inits.insert(v) {
                    graph.initializer.push(tensor_proto(&val.name, t));
                }
            }
        }
        graph.node.push(node_proto(g, node));
    }
    for &i in inputs {
        graph.input.push(value_info(value(i)?));
    }
    for &o in outputs {
        graph.output.push(value_info(value(o)?));
    }
    if shapes {
        let listed: std::collections::HashSet<u32> =
            inputs.iter().chain(outputs).copied().collect();
        for &n in nodes {
            for &v in g.nodes[n as usize].outputs.iter().flatten() {
                let val = &g.values[v];
                if !listed.contains(&(v as u32)) && val.shape().is_some() {
                    graph.value_info.push(value_info(val));
                }
            }
        }
    }
    let proto = proto::ModelProto {
        ir_version: Some(model.ir_version),
        opset_import: model
            .opsets
            .iter()
            .map(|(d, v)| proto::OperatorSetIdProto {
                domain: Some(d.clone()),
                version: Some(*v),
            })
            .collect(),
        producer_name: Some("epx".into()),
        graph: Some(graph),
        ..Default::default()
    };
    Ok(proto.encode_to_vec())
}

fn name_of(g: &Graph, v: &Option<ValueId>) -> String {
    v.map(|v| g.values[v].name.clone()).unwrap_or_default()
}

fn node_proto(g: &Graph, n: &Node) -> proto::NodeProto {
    proto::NodeProto {
        name: Some(n.name.clone()),
        op_type: Some(n.op_type.clone()),
        domain: Some(n.domain.clone()),
        input: n.inputs.iter().map(|v| name_of(g, v)).collect(),
        output: n.outputs.iter().map(|v| name_of(g, v)).collect(),
        attribute: n.attributes.iter().map(attribute_proto).collect(),
        ..Default::default()
    }
}

fn attribute_proto(a: &Attribute) -> proto::AttributeProto {
    use proto::attribute_proto::AttributeType as T;
    let mut p = proto::AttributeProto {
        name: Some(a.name.clone()),
        ..Default::default()
    };
    let kind = match &a.value {
        AttributeValue::Float(f) => {
            p.f = Some(*f);
            T::Float
        }
        AttributeValue::Int(i) => {
            p.i = Some(*i);
            T::Int
        }
        AttributeValue::String(s) => {
            p.s = Some(s.clone());
            T::String
        }
        AttributeValue::Tensor(t) => {
            p.t = Some(tensor_proto("", t));
            T::Tensor
        }
        AttributeValue::Graph(g) => {
            p.g = Some(graph_proto(g));
            T::Graph
        }
        AttributeValue::Floats(v) => {
            p.floats = v.clone();
            T::Floats
        }
        AttributeValue::Ints(v) => {
            p.ints = v.clone();
            T::Ints
        }
        AttributeValue::Strings(v) => {
            p.strings = v.clone();
            T::Strings
        }
        AttributeValue::Tensors(v) => {
            p.tensors = v.iter().map(|t| tensor_proto("", t)).collect();
            T::Tensors
        }
        AttributeValue::Graphs(v) => {
            p.graphs = v.iter().map(graph_proto).collect();
            T::Graphs
        }
        AttributeValue::Other(_) => T::Undefined,
    };
    p.r#type = Some(kind as i32);
    p
}

/// A whole (nested) graph back to protobuf.
fn graph_proto(g: &Graph) -> proto::GraphProto {
    proto::GraphProto {
        name: Some(g.name.clone()),
        node: g.nodes.iter().map(|n| node_proto(g, n)).collect(),
        initializer: g
            .initializers()
            .map(|(id, t)| tensor_proto(&g.values[id].name, t))
            .collect(),
        input: g.inputs.iter().map(|&i| value_info(&g.values[i])).collect(),
        output: g
            .outputs
            .iter()
            .map(|&o| value_info(&g.values[o]))
            .collect(),
        ..Default::default()
    }
}

fn value_info(v: &Value) -> proto::ValueInfoProto {
    let r#type = match &v.ty {
        ValueType::Tensor { elem_type, shape } => Some(proto::TypeProto {
            denotation: None,
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: elem_type.map(|e| e.onnx_code()),
                    shape: shape.as_ref().map(|s| proto::TensorShapeProto {
                        dim: s
                            .iter()
                            .map(|d| proto::tensor_shape_proto::Dimension {
                                denotation: None,
                                value: match d {
                                    Dim::Known(k) => {
                                        Some(proto::tensor_shape_proto::dimension::Value::DimValue(
                                            *k as i64,
                                        ))
                                    }
                                    Dim::Symbolic(s) => {
                                        Some(proto::tensor_shape_proto::dimension::Value::DimParam(
                                            s.clone(),
                                        ))
                                    }
                                    Dim::Unknown => None,
                                },
                            })
                            .collect(),
                    }),
                },
            )),
        }),
        _ => None,
    };
    proto::ValueInfoProto {
        name: Some(v.name.clone()),
        r#type,
        ..Default::default()
    }
}

/// A tensor as a `TensorProto` with raw data.
pub fn tensor_proto(name: &str, t: &Tensor) -> proto::TensorProto {
    let mut p = proto::TensorProto {
        name: (!name.is_empty()).then(|| name.to_string()),
        data_type: Some(t.elem_type().onnx_code()),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        ..Default::default()
    };
    match t.strings() {
        Some(s) => p.string_data = s.to_vec(),
        None => p.raw_data = t.bytes().map(bytes::Bytes::copy_from_slice),
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::onnx::load_model_bytes;

    #[test]
    fn a_subgraph_round_trips_through_the_loader() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let path = std::path::Path::new(dir).join("../../examples/models/mnist-cnn.onnx");
        let model = crate::model::onnx::load_model_file(&path).unwrap();
        let g = &model.graph;
        // The first two nodes (Conv, BatchNormalization) as a standalone model.
        let first = &g.nodes[0];
        let second = &g.nodes[1];
        let input = first.inputs[0].unwrap() as u32;
        let output = second.outputs[0].unwrap() as u32;
        let bytes =
            subgraph_model_bytes(&model, &model.graph, &[0, 1], &[input], &[output]).unwrap();
        let sub = load_model_bytes(&bytes, "sub", None).unwrap();
        assert_eq!(sub.graph.nodes.len(), 2);
        assert_eq!(sub.graph.nodes[0].op_type, first.op_type);
        assert_eq!(sub.graph.inputs.len(), 1);
        assert_eq!(sub.graph.outputs.len(), 1);
        // Conv weights, bias and the four BatchNormalization tensors travel along.
        assert_eq!(
            sub.graph.initializers().count(),
            first.inputs.len() - 1 + second.inputs.len() - 1
        );
        assert_eq!(sub.opsets, model.opsets);
    }
}
