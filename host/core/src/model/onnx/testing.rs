//! Small model builders for the unit tests of the host crate.

use prost::Message;

use super::proto::*;
use crate::model::ir::Graph;

/// A float32 value info without shape.
pub fn vi(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            denotation: None,
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: None,
            })),
        }),
        ..Default::default()
    }
}

/// A node named `<op>_<outputs>`.
pub fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_{}", outputs.join("_"))),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// An opset-17 model of `nodes` with float32 graph inputs and outputs.
pub fn model(nodes: Vec<NodeProto>, inputs: &[&str], outputs: &[&str]) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            input: inputs.iter().map(|s| vi(s)).collect(),
            output: outputs.iter().map(|s| vi(s)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The loaded graph of a model (which must load).
pub fn graph(m: &ModelProto) -> Graph {
    match crate::model::onnx::load_model_bytes(&m.encode_to_vec(), "test.onnx", None) {
        Ok(model) => model.graph,
        Err(e) => panic!("test model does not load: {e}"),
    }
}
