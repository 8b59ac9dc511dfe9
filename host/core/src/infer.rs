//! Element-type inference: fills in the type of values the model does not declare, so EPs see
//! types when they answer capability queries. Only ops whose output type rule is certain are
//! inferred; anything else stays unknown rather than guessed.

use crate::ir::{AttributeValue, Graph, ValueType};
use crate::tensor::ElementType;

/// Where an op's output type comes from.
enum Rule {
    /// The type of input `k`.
    Input(usize),
    Fixed(ElementType),
    /// `Cast`: the `to` attribute.
    CastTo,
    /// `Constant` / `ConstantOfShape`: the `value` tensor (or the typed value attributes).
    ConstantValue,
}

fn rule(op: &str, output: usize) -> Option<Rule> {
    use Rule::*;
    Some(match (op, output) {
        (
            "Relu"
            | "Sigmoid"
            | "Tanh"
            | "Abs"
            | "Neg"
            | "Exp"
            | "Log"
            | "Sqrt"
            | "Reciprocal"
            | "Floor"
            | "Ceil"
            | "Round"
            | "Sign"
            | "Erf"
            | "Sin"
            | "Cos"
            | "Tan"
            | "Asin"
            | "Acos"
            | "Atan"
            | "Sinh"
            | "Cosh"
            | "Asinh"
            | "Acosh"
            | "Atanh"
            | "Softplus"
            | "Softsign"
            | "LeakyRelu"
            | "Elu"
            | "Selu"
            | "Celu"
            | "HardSigmoid"
            | "HardSwish"
            | "ThresholdedRelu"
            | "Gelu"
            | "Mish"
            | "PRelu"
            | "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Pow"
            | "Mod"
            | "Max"
            | "Min"
            | "Sum"
            | "Mean"
            | "Clip"
            | "Softmax"
            | "LogSoftmax"
            | "Hardmax"
            | "MatMul"
            | "Gemm"
            | "Conv"
            | "ConvTranspose"
            | "AveragePool"
            | "GlobalAveragePool"
            | "GlobalMaxPool"
            | "LpPool"
            | "GlobalLpPool"
            | "InstanceNormalization"
            | "LRN"
            | "Flatten"
            | "Reshape"
            | "Transpose"
            | "Concat"
            | "Identity"
            | "Squeeze"
            | "Unsqueeze"
            | "Expand"
            | "Tile"
            | "Slice"
            | "Gather"
            | "GatherElements"
            | "GatherND"
            | "Pad"
            | "Split"
            | "ReduceSum"
            | "ReduceMean"
            | "ReduceMax"
            | "ReduceMin"
            | "ReduceProd"
            | "ReduceL1"
            | "ReduceL2"
            | "ReduceLogSum"
            | "ReduceLogSumExp"
            | "ReduceSumSquare"
            | "Resize"
            | "Upsample"
            | "DepthToSpace"
            | "SpaceToDepth"
            | "Range"
            | "CumSum"
            | "ReverseSequence"
            | "ScatterND"
            | "ScatterElements"
            | "Trilu"
            | "Compress"
            | "BitShift"
            | "Einsum",
            _,
        ) => Input(0),
        ("MaxPool", 0)
        | ("BatchNormalization", _)
        | ("LayerNormalization", 0)
        | ("Dropout", 0)
        | ("TopK", 0) => Input(0),
        ("Where", 0) => Input(1),
        ("CastLike", 0) => Input(1),
        (
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor"
            | "Not" | "IsNaN" | "IsInf",
            0,
        )
        | ("Dropout", 1) => Fixed(ElementType::Bool),
        ("Shape" | "Size" | "ArgMax" | "ArgMin" | "NonZero", 0) | ("MaxPool" | "TopK", 1) => {
            Fixed(ElementType::Int64)
        }
        ("Cast", 0) => CastTo,
        ("Constant" | "ConstantOfShape", 0) => ConstantValue,
        _ => return None,
    })
}

/// Infers element types in topological order. Declared types are kept as they are.
pub fn infer_element_types(g: &mut Graph) {
    for n in 0..g.nodes.len() {
        let node = &g.nodes[n];
        if !node.domain.is_empty() {
            continue;
        }
        let mut found = Vec::new();
        for (k, out) in node.outputs.iter().enumerate() {
            let Some(out) = *out else { continue };
            if g.values[out].elem_type().is_some()
                || matches!(g.values[out].ty, ValueType::Other(_))
            {
                continue;
            }
            let ty = match rule(&node.op_type, k) {
                Some(Rule::Input(i)) => node
                    .inputs
                    .get(i)
                    .copied()
                    .flatten()
                    .and_then(|v| g.values[v].elem_type()),
                Some(Rule::Fixed(t)) => Some(t),
                Some(Rule::CastTo) => match node.attribute("to") {
                    Some(AttributeValue::Int(code)) => {
                        i32::try_from(*code).ok().and_then(ElementType::from_onnx)
                    }
                    _ => None,
                },
                Some(Rule::ConstantValue) => constant_type(node),
                None => None,
            };
            if let Some(t) = ty.filter(|t| *t != ElementType::Undefined) {
                found.push((out, t));
            }
        }
        for (out, t) in found {
            let shape = match &g.values[out].ty {
                ValueType::Tensor { shape, .. } => shape.clone(),
                _ => None,
            };
            g.values[out].ty = ValueType::Tensor {
                elem_type: Some(t),
                shape,
            };
        }
    }
}

fn constant_type(node: &crate::ir::Node) -> Option<ElementType> {
    match node.op_type.as_str() {
        "ConstantOfShape" => match node.attribute("value") {
            Some(AttributeValue::Tensor(t)) => Some(t.elem_type()),
            _ => Some(ElementType::Float),
        },
        _ => node
            .attributes
            .iter()
            .find_map(|a| match (&a.value, a.name.as_str()) {
                (AttributeValue::Tensor(t), "value") => Some(t.elem_type()),
                (_, "value_float" | "value_floats") => Some(ElementType::Float),
                (_, "value_int" | "value_ints") => Some(ElementType::Int64),
                (_, "value_string" | "value_strings") => Some(ElementType::String),
                _ => None,
            }),
    }
}

#[cfg(test)]
mod tests {
    use crate::onnx::{proto, testing};
    use crate::tensor::ElementType;

    #[test]
    fn types_flow_through_the_graph() {
        let mut cast = testing::node("Cast", &["r"], &["c"]);
        cast.attribute.push(proto::AttributeProto {
            name: Some("to".into()),
            r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
            i: Some(7),
            ..Default::default()
        });
        let mut m = testing::model(
            vec![
                testing::node("Relu", &["x"], &["r"]),
                testing::node("Greater", &["r", "x"], &["g"]),
                cast,
                testing::node("Shape", &["c"], &["s"]),
                testing::node("Mystery", &["r"], &["u"]),
            ],
            &["x"],
            &[],
        );
        // Outputs declared without a type, so inference has to supply it.
        if let Some(graph) = m.graph.as_mut() {
            graph.output = vec![proto::ValueInfoProto {
                name: Some("s".into()),
                ..Default::default()
            }];
        }
        let g = testing::graph(&m);
        let ty = |n: &str| g.values[g.value_id(n).unwrap()].elem_type();
        assert_eq!(ty("r"), Some(ElementType::Float));
        assert_eq!(ty("g"), Some(ElementType::Bool));
        assert_eq!(ty("c"), Some(ElementType::Int64));
        assert_eq!(ty("s"), Some(ElementType::Int64));
        assert_eq!(ty("u"), None, "unknown ops are not guessed");
    }
}
