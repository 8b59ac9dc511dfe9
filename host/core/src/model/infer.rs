//! Type and shape inference: fills in the element type and static shape of values the model does
//! not declare, so EPs see them when they answer capability queries (many vendor runtimes refuse
//! inputs of unknown rank). Only rules that are certain are applied; anything else stays
//! unknown rather than guessed. Inferred shapes are marked as such: a kernel's output is only
//! held against what the model itself declares.

use std::collections::HashMap;

use crate::model::ir::{AttributeValue, Dim, Graph, Node, ValueId, ValueType};
use crate::value::{ElementType, Tensor};

/// Elementwise ops with one tensor input whose output has the input's type and shape.
const UNARY_ELEMENTWISE: [&str; 36] = [
    "Relu",
    "Sigmoid",
    "Tanh",
    "Abs",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Erf",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Softplus",
    "Softsign",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "HardSwish",
    "ThresholdedRelu",
    "Gelu",
    "Mish",
];

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
        (op, _) if UNARY_ELEMENTWISE.contains(&op) => Input(0),
        (
            "PRelu"
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

/// The type an attribute decides, for outputs whose schema leaves it open: LabelEncoder's
/// values, QuantizeLinear's zero point or `output_dtype`, DequantizeLinear's `output_dtype` or
/// scale.
fn attribute_type(g: &Graph, node: &crate::model::ir::Node, k: usize) -> Option<ElementType> {
    let dtype = |name: &str| match node.attribute(name) {
        Some(AttributeValue::Int(code)) if *code != 0 => {
            i32::try_from(*code).ok().and_then(ElementType::from_onnx)
        }
        _ => None,
    };
    let input = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| g.values[v].elem_type())
    };
    match (node.domain.as_str(), node.op_type.as_str(), k) {
        ("ai.onnx.ml", "LabelEncoder", 0) => node.attributes.iter().find_map(|a| {
            match (a.name.as_str(), &a.value) {
                ("values_strings", _) => Some(ElementType::String),
                ("values_int64s", _) => Some(ElementType::Int64),
                ("values_floats", _) => Some(ElementType::Float),
                ("values_tensor", AttributeValue::Tensor(t)) => Some(t.elem_type()),
                // LabelEncoder-1 maps strings to int64 and back.
                ("classes_strings", _) => match input(0) {
                    Some(ElementType::String) => Some(ElementType::Int64),
                    Some(_) => Some(ElementType::String),
                    None => None,
                },
                _ => None,
            }
        }),
        ("", "QuantizeLinear", 0) => dtype("output_dtype")
            .or_else(|| input(2))
            .or(Some(ElementType::Uint8)),
        ("", "DequantizeLinear", 0) => dtype("output_dtype").or_else(|| input(1)),
        _ => None,
    }
}

/// Infers element types in topological order, from the rules above, else from the operator's
/// schema (any domain the schema table holds), as ONNX's type inference does. Declared types
/// are kept as they are.
pub fn infer_element_types(g: &mut Graph, opsets: &std::collections::BTreeMap<String, i64>) {
    use crate::model::onnx::schema::{OutputType, output_type};
    for n in 0..g.nodes.len() {
        let node = &g.nodes[n];
        let opset = opsets.get(&node.domain).copied().unwrap_or(i64::MAX);
        let mut found = Vec::new();
        for (k, out) in node.outputs.iter().enumerate() {
            let Some(out) = *out else { continue };
            if g.values[out].elem_type().is_some() || g.values[out].ty.is_non_tensor() {
                continue;
            }
            let own = if node.domain.is_empty() {
                rule(&node.op_type, k)
            } else {
                None
            };
            let from_schema = || match output_type(&node.domain, &node.op_type, opset, k) {
                Some(OutputType::Input(i)) => node
                    .inputs
                    .get(i)
                    .copied()
                    .flatten()
                    .and_then(|v| g.values[v].elem_type()),
                Some(OutputType::Fixed(code)) => ElementType::from_onnx(code),
                Some(OutputType::Open) | None => attribute_type(g, node, k),
            };
            let ty = match own {
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
                None => from_schema(),
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

fn constant_type(node: &crate::model::ir::Node) -> Option<ElementType> {
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

/// Infers static shapes in topological order, for values the model gives no shape. Extents
/// that cannot be known become [`Dim::Unknown`]; a rank that cannot be known leaves the shape
/// unset.
pub fn infer_shapes(g: &mut Graph) {
    // Constant data visible at load time: initializers (read in place, never copied: they
    // can be most of the model) and `Constant` node outputs.
    let mut constants: HashMap<ValueId, std::sync::Arc<Tensor>> = HashMap::new();
    let mut confirmed = Vec::new();
    for n in 0..g.nodes.len() {
        let node = &g.nodes[n];
        if !node.domain.is_empty() {
            continue;
        }
        if node.op_type == "Constant" {
            if let Some(Some(out)) = node.outputs.first() {
                match (node.attribute("value"), node.attribute("value_ints")) {
                    (Some(AttributeValue::Tensor(t)), _) => {
                        constants.insert(*out, t.clone());
                    }
                    // A list of extents, as shape-building subgraphs write them.
                    (_, Some(AttributeValue::Ints(v))) => {
                        let bytes: Vec<u8> = v.iter().flat_map(|i| i.to_le_bytes()).collect();
                        if let Ok(t) = Tensor::from_bytes(ElementType::Int64, &[v.len()], &bytes) {
                            constants.insert(*out, std::sync::Arc::new(t));
                        }
                    }
                    _ => {}
                }
            }
        }
        let inputs: Vec<Option<Vec<Dim>>> = node
            .inputs
            .iter()
            .map(|v| v.and_then(|v| g.values[v].shape().map(<[Dim]>::to_vec)))
            .collect();
        let consts: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|v| {
                v.and_then(|v| {
                    g.values[v]
                        .initializer
                        .as_deref()
                        .or(constants.get(&v).map(|t| &**t))
                })
            })
            .collect();
        let shapes = output_shapes(node, &inputs, &consts);
        let mut updates = Vec::new();
        for (k, out) in node.outputs.iter().enumerate() {
            let (Some(out), Some(Some(shape))) = (*out, shapes.get(k)) else {
                continue;
            };
            let value = &g.values[out];
            if let Some(declared) = value.shape() {
                // A declaration the node's inputs bear out: every extent inference knows agrees.
                let agrees = declared.len() == shape.len()
                    && declared
                        .iter()
                        .zip(shape)
                        .all(|(d, s)| match (known(d), known(s)) {
                            (Some(d), Some(s)) => d == s,
                            (None, None) => true,
                            _ => false,
                        });
                if agrees {
                    confirmed.push(out);
                }
                continue;
            }
            if value.ty.is_non_tensor() {
                continue;
            }
            updates.push((out, shape.clone()));
        }
        for out in confirmed.drain(..) {
            g.values[out].shape_confirmed = true;
        }
        for (out, shape) in updates {
            let elem_type = g.values[out].elem_type();
            g.values[out].ty = ValueType::Tensor {
                elem_type,
                shape: Some(shape),
            };
            g.values[out].shape_inferred = true;
        }
    }
}

fn known(d: &Dim) -> Option<u64> {
    if let Dim::Known(k) = d {
        Some(*k)
    } else {
        None
    }
}

fn attr_int(node: &Node, name: &str) -> Option<i64> {
    match node.attribute(name) {
        Some(AttributeValue::Int(i)) => Some(*i),
        _ => None,
    }
}

fn attr_ints(node: &Node, name: &str) -> Option<Vec<i64>> {
    match node.attribute(name) {
        Some(AttributeValue::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

/// The integers of a constant int64/int32 tensor.
fn const_ints(t: Option<&Tensor>) -> Option<Vec<i64>> {
    let t = t?;
    match t.elem_type() {
        ElementType::Int64 => t.as_slice::<i64>().map(<[i64]>::to_vec),
        ElementType::Int32 => t
            .as_slice::<i32>()
            .map(|s| s.iter().map(|&x| i64::from(x)).collect()),
        _ => None,
    }
}

fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// Numpy broadcasting of several shapes.
fn broadcast(shapes: &[&Vec<Dim>]) -> Option<Vec<Dim>> {
    let rank = shapes.iter().map(|s| s.len()).max()?;
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let mut d = Dim::Known(1);
        for s in shapes {
            let Some(j) = (i + s.len()).checked_sub(rank) else {
                continue;
            };
            d = match (&d, &s[j]) {
                (Dim::Known(1), x) => x.clone(),
                (x, Dim::Known(1)) => x.clone(),
                (Dim::Known(a), Dim::Known(b)) if a == b => Dim::Known(*a),
                (Dim::Known(_), Dim::Known(_)) => return None,
                (Dim::Known(a), _) | (_, Dim::Known(a)) => Dim::Known(*a),
                (x, y) if x == y => x.clone(),
                _ => Dim::Unknown,
            };
        }
        out.push(d);
    }
    Some(out)
}

/// Output extent of a sliding window (convolution or pooling).
fn window(
    input: &Dim,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pads: (u64, u64),
    ceil: bool,
    auto_pad: &str,
) -> Dim {
    let Some(n) = known(input) else {
        return Dim::Unknown;
    };
    let stride = stride.max(1);
    // Attributes past any real size leave the dim unknown; the kernel says what is wrong.
    let Some(effective) = dilation
        .max(1)
        .checked_mul(kernel.max(1) - 1)
        .and_then(|e| e.checked_add(1))
    else {
        return Dim::Unknown;
    };
    match auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => Dim::Known(n.div_ceil(stride)),
        "VALID" => Dim::Known(if n >= effective {
            (n - effective) / stride + 1
        } else {
            0
        }),
        _ => {
            let Some(padded) = n.checked_add(pads.0).and_then(|p| p.checked_add(pads.1)) else {
                return Dim::Unknown;
            };
            if padded < effective {
                return Dim::Known(0);
            }
            let span = padded - effective;
            let mut out = if ceil {
                span.div_ceil(stride) + 1
            } else {
                span / stride + 1
            };
            // A window that would start in the end padding is dropped (ONNX, as in PyTorch).
            if ceil && (out - 1).saturating_mul(stride) >= n.saturating_add(pads.0) {
                out -= 1;
            }
            Dim::Known(out)
        }
    }
}

fn spatial(node: &Node, x: &[Dim], kernel: &[u64], channels: Dim) -> Option<Vec<Dim>> {
    let n = kernel.len();
    if x.len() != n + 2 {
        return None;
    }
    let strides = attr_ints(node, "strides").unwrap_or_else(|| vec![1; n]);
    let dilations = attr_ints(node, "dilations").unwrap_or_else(|| vec![1; n]);
    let pads = attr_ints(node, "pads").unwrap_or_else(|| vec![0; 2 * n]);
    if strides.len() != n
        || dilations.len() != n
        || pads.len() != 2 * n
        || pads.iter().any(|&p| p < 0)
    {
        return None;
    }
    let auto_pad = match node.attribute("auto_pad") {
        Some(AttributeValue::String(s)) => String::from_utf8_lossy(s).into_owned(),
        _ => "NOTSET".into(),
    };
    let ceil = attr_int(node, "ceil_mode") == Some(1);
    let mut out = vec![x[0].clone(), channels];
    for i in 0..n {
        out.push(window(
            &x[i + 2],
            kernel[i],
            strides[i] as u64,
            dilations[i] as u64,
            (pads[i] as u64, pads[i + n] as u64),
            ceil,
            &auto_pad,
        ));
    }
    Some(out)
}

/// The shapes of a node's outputs, where certain.
fn output_shapes(
    node: &Node,
    inputs: &[Option<Vec<Dim>>],
    consts: &[Option<&Tensor>],
) -> Vec<Option<Vec<Dim>>> {
    let input = |i: usize| inputs.get(i).and_then(Option::as_ref);
    let one = |s: Option<Vec<Dim>>| vec![s];
    match node.op_type.as_str() {
        op if UNARY_ELEMENTWISE.contains(&op) => one(input(0).cloned()),
        "Softmax"
        | "LogSoftmax"
        | "Hardmax"
        | "Cast"
        | "CastLike"
        | "Identity"
        | "Clip"
        | "Not"
        | "IsNaN"
        | "IsInf"
        | "LRN"
        | "InstanceNormalization" => one(input(0).cloned()),
        "Dropout" => vec![input(0).cloned(), input(0).cloned()],
        "BatchNormalization" | "LayerNormalization" => one(input(0).cloned()),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max" | "Min" | "Sum" | "Mean"
        | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or"
        | "Xor" | "PRelu" | "Where" | "BitShift" => {
            let all: Option<Vec<&Vec<Dim>>> = (0..inputs.len()).map(input).collect();
            one(all.and_then(|s| broadcast(&s)))
        }
        "MatMul" => {
            let (Some(a), Some(b)) = (input(0), input(1)) else {
                return vec![None];
            };
            if a.is_empty() || b.is_empty() {
                return vec![None];
            }
            let (a2, b2) = (a.len() == 1, b.len() == 1);
            let a = if a2 {
                vec![Dim::Known(1), a[0].clone()]
            } else {
                a.clone()
            };
            let b = if b2 {
                vec![b[0].clone(), Dim::Known(1)]
            } else {
                b.clone()
            };
            let batch_a = a[..a.len() - 2].to_vec();
            let batch_b = b[..b.len() - 2].to_vec();
            let Some(mut out) = broadcast(&[&batch_a, &batch_b]) else {
                return vec![None];
            };
            if !a2 {
                out.push(a[a.len() - 2].clone());
            }
            if !b2 {
                out.push(b[b.len() - 1].clone());
            }
            one(Some(out))
        }
        "Gemm" => {
            let (Some(a), Some(b)) = (input(0), input(1)) else {
                return vec![None];
            };
            if a.len() != 2 || b.len() != 2 {
                return vec![None];
            }
            let m = if attr_int(node, "transA") == Some(1) {
                &a[1]
            } else {
                &a[0]
            };
            let n = if attr_int(node, "transB") == Some(1) {
                &b[0]
            } else {
                &b[1]
            };
            one(Some(vec![m.clone(), n.clone()]))
        }
        "Conv" => {
            let (Some(x), Some(w)) = (input(0), input(1)) else {
                return vec![None];
            };
            let kernel: Option<Vec<u64>> = match attr_ints(node, "kernel_shape") {
                Some(k) => Some(k.iter().map(|&k| k.max(0) as u64).collect()),
                None => w
                    .get(2..)
                    .and_then(|s| s.iter().map(known).collect::<Option<Vec<u64>>>()),
            };
            let Some(kernel) = kernel else {
                return vec![None];
            };
            one(w.first().and_then(|m| spatial(node, x, &kernel, m.clone())))
        }
        "MaxPool" | "AveragePool" | "LpPool" => {
            let (Some(x), Some(k)) = (input(0), attr_ints(node, "kernel_shape")) else {
                return vec![None];
            };
            let kernel: Vec<u64> = k.iter().map(|&k| k.max(0) as u64).collect();
            let s = x.get(1).and_then(|c| spatial(node, x, &kernel, c.clone()));
            vec![s.clone(), s]
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            one(input(0).filter(|x| x.len() >= 2).map(|x| {
                let mut out = x[..2].to_vec();
                out.extend(std::iter::repeat_n(Dim::Known(1), x.len() - 2));
                out
            }))
        }
        "Flatten" => one(input(0).and_then(|x| {
            let a = axis(attr_int(node, "axis").unwrap_or(1), x.len() + 1)?;
            let prod = |d: &[Dim]| {
                d.iter()
                    .try_fold(1u64, |acc, d| known(d).and_then(|k| acc.checked_mul(k)))
            };
            let left = prod(&x[..a]).map_or(Dim::Unknown, Dim::Known);
            let right = prod(&x[a..]).map_or(Dim::Unknown, Dim::Known);
            Some(vec![left, right])
        })),
        "Transpose" => one(input(0).and_then(|x| {
            let perm =
                attr_ints(node, "perm").unwrap_or_else(|| (0..x.len() as i64).rev().collect());
            perm.iter()
                .map(|&p| usize::try_from(p).ok().and_then(|p| x.get(p).cloned()))
                .collect()
        })),
        "Concat" => {
            let all: Option<Vec<&Vec<Dim>>> = (0..inputs.len()).map(input).collect();
            one(all.and_then(|shapes| {
                let first = shapes.first()?;
                let a = axis(attr_int(node, "axis")?, first.len())?;
                let mut out = (*first).clone();
                let mut total = Some(0u64);
                for s in &shapes {
                    if s.len() != first.len() {
                        return None;
                    }
                    total = total.zip(known(&s[a])).and_then(|(t, k)| t.checked_add(k));
                }
                out[a] = total.map_or(Dim::Unknown, Dim::Known);
                Some(out)
            }))
        }
        "Reshape" => one(input(0)
            .zip(const_ints(consts.get(1).copied().flatten()))
            .and_then(|(x, spec)| {
                let allow_zero = attr_int(node, "allowzero") == Some(1);
                let total = x
                    .iter()
                    .try_fold(1u64, |acc, d| known(d).and_then(|k| acc.checked_mul(k)));
                let mut out = Vec::with_capacity(spec.len());
                let mut infer_at = None;
                for (i, &s) in spec.iter().enumerate() {
                    out.push(match s {
                        0 if !allow_zero => x.get(i)?.clone(),
                        -1 => {
                            infer_at = Some(i);
                            Dim::Unknown
                        }
                        s if s >= 0 => Dim::Known(s as u64),
                        _ => return None,
                    });
                }
                if let Some(i) = infer_at {
                    let rest = out
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .try_fold(1u64, |acc, (_, d)| {
                            known(d).and_then(|k| acc.checked_mul(k))
                        });
                    if let (Some(t), Some(r)) = (total, rest) {
                        if r > 0 && t % r == 0 {
                            out[i] = Dim::Known(t / r);
                        }
                    }
                }
                Some(out)
            })),
        "Unsqueeze" | "Squeeze" => {
            let axes =
                attr_ints(node, "axes").or_else(|| const_ints(consts.get(1).copied().flatten()));
            one(input(0).and_then(|x| {
                if node.op_type == "Unsqueeze" {
                    let axes = axes?;
                    let rank = x.len() + axes.len();
                    let mut axes: Vec<usize> =
                        axes.iter().map(|&a| axis(a, rank)).collect::<Option<_>>()?;
                    axes.sort_unstable();
                    let mut out = x.clone();
                    for a in axes {
                        if a > out.len() {
                            return None;
                        }
                        out.insert(a, Dim::Known(1));
                    }
                    Some(out)
                } else {
                    match axes {
                        Some(axes) => {
                            let axes: Vec<usize> = axes
                                .iter()
                                .map(|&a| axis(a, x.len()))
                                .collect::<Option<_>>()?;
                            Some(
                                x.iter()
                                    .enumerate()
                                    .filter(|(i, _)| !axes.contains(i))
                                    .map(|(_, d)| d.clone())
                                    .collect(),
                            )
                        }
                        // Without axes every extent of 1 goes; unknown extents make it uncertain.
                        None if x.iter().all(|d| known(d).is_some()) => {
                            Some(x.iter().filter(|d| **d != Dim::Known(1)).cloned().collect())
                        }
                        None => None,
                    }
                }
            }))
        }
        "Shape" => one(input(0).map(|x| {
            let r = x.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
            let start = clamp(attr_int(node, "start").unwrap_or(0));
            let end = clamp(attr_int(node, "end").unwrap_or(r));
            vec![Dim::Known((end - start).max(0) as u64)]
        })),
        "Size" => one(Some(Vec::new())),
        // The shape its one value attribute gives (`value`: the tensor's; a single number or
        // string: a scalar; a list: its length).
        "Constant" => one(node.attributes.iter().find_map(|a| match &a.value {
            AttributeValue::Tensor(t) => {
                Some(t.shape().iter().map(|&d| Dim::Known(d as u64)).collect())
            }
            AttributeValue::Float(_) | AttributeValue::Int(_) | AttributeValue::String(_) => {
                Some(Vec::new())
            }
            AttributeValue::Floats(v) => Some(vec![Dim::Known(v.len() as u64)]),
            AttributeValue::Ints(v) => Some(vec![Dim::Known(v.len() as u64)]),
            AttributeValue::Strings(v) => Some(vec![Dim::Known(v.len() as u64)]),
            _ => None,
        })),
        // The extents its input holds, when it is constant.
        "ConstantOfShape" => one(const_ints(consts.first().copied().flatten()).and_then(|s| {
            s.iter()
                .map(|&d| u64::try_from(d).ok().map(Dim::Known))
                .collect()
        })),
        "Gather" => one(input(0).zip(input(1)).and_then(|(x, idx)| {
            let a = axis(attr_int(node, "axis").unwrap_or(0), x.len())?;
            let mut out = x[..a].to_vec();
            out.extend(idx.iter().cloned());
            out.extend(x[a + 1..].iter().cloned());
            Some(out)
        })),
        _ => vec![None; node.outputs.len()],
    }
}

#[cfg(test)]
mod tests {
    use crate::model::onnx::{proto, testing};
    use crate::value::ElementType;

    #[test]
    fn constant_nodes_have_the_shape_of_their_value() {
        let attr = |name: &str, ty: proto::attribute_proto::AttributeType| proto::AttributeProto {
            name: Some(name.into()),
            r#type: Some(ty as i32),
            ..Default::default()
        };
        let mut scalar = testing::node("Constant", &[], &["k"]);
        let mut f = attr("value_float", proto::attribute_proto::AttributeType::Float);
        f.f = Some(6.0);
        scalar.attribute.push(f);
        let mut list = testing::node("Constant", &[], &["dims"]);
        let mut ints = attr("value_ints", proto::attribute_proto::AttributeType::Ints);
        ints.ints = vec![2, 3, 4];
        list.attribute.push(ints);
        let mut m = testing::model(
            vec![
                scalar,
                testing::node("Div", &["x", "k"], &["d"]),
                list,
                testing::node("ConstantOfShape", &["dims"], &["z"]),
            ],
            &["x"],
            &[],
        );
        // x: float32 [2, 3, 4].
        if let Some(proto::type_proto::Value::TensorType(t)) = m
            .graph
            .as_mut()
            .and_then(|g| g.input[0].r#type.as_mut())
            .and_then(|t| t.value.as_mut())
        {
            t.shape = Some(proto::TensorShapeProto {
                dim: [2, 3, 4]
                    .iter()
                    .map(|&d| proto::tensor_shape_proto::Dimension {
                        denotation: None,
                        value: Some(proto::tensor_shape_proto::dimension::Value::DimValue(d)),
                    })
                    .collect(),
            });
        }
        let g = testing::graph(&m);
        let shape = |n: &str| {
            g.values[g.value_id(n).unwrap()].shape().map(|s| {
                s.iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
        };
        assert_eq!(shape("k").as_deref(), Some(""), "a scalar");
        assert_eq!(shape("dims").as_deref(), Some("Known(3)"));
        assert_eq!(
            shape("d").as_deref(),
            Some("Known(2),Known(3),Known(4)"),
            "a broadcast with the constant's shape"
        );
        assert_eq!(shape("z").as_deref(), Some("Known(2),Known(3),Known(4)"));
    }

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

    #[test]
    fn shapes_of_the_example_cnn_are_inferred() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/models/mnist-cnn.onnx");
        let g = crate::model::onnx::load_model_file(&path).unwrap().graph;
        let shape = |n: &str| {
            let v = &g.values[g.value_id(n).unwrap()];
            (
                v.shape().map(|s| {
                    s.iter()
                        .map(|d| format!("{d:?}"))
                        .collect::<Vec<_>>()
                        .join(",")
                }),
                v.shape_inferred,
            )
        };
        let k = |d: &[u64]| {
            Some(
                d.iter()
                    .map(|x| format!("Known({x})"))
                    .collect::<Vec<_>>()
                    .join(","),
            )
        };
        assert_eq!(shape("conv1"), (k(&[1, 8, 28, 28]), true));
        assert_eq!(shape("pool1"), (k(&[1, 8, 14, 14]), true));
        assert_eq!(shape("pool2"), (k(&[1, 16, 7, 7]), true));
        assert_eq!(shape("gap"), (k(&[1, 16, 1, 1]), true));
        assert_eq!(shape("flat"), (k(&[1, 16]), true));
        assert_eq!(shape("logits"), (k(&[1, 10]), true));
        // Declared by the model: kept, and not marked as inferred.
        assert_eq!(shape("probabilities"), (k(&[1, 10]), false));
    }

    #[test]
    fn broadcasting_reshape_and_unknown_extents() {
        use super::*;
        let d = |v: &[i64]| {
            v.iter()
                .map(|&x| {
                    if x < 0 {
                        Dim::Unknown
                    } else {
                        Dim::Known(x as u64)
                    }
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            broadcast(&[&d(&[2, 1, 4]), &d(&[3, 1])]),
            Some(d(&[2, 3, 4]))
        );
        assert_eq!(broadcast(&[&d(&[2, -1]), &d(&[4])]), Some(d(&[2, 4])));
        assert_eq!(
            broadcast(&[&d(&[2]), &d(&[3])]),
            None,
            "incompatible extents infer nothing"
        );
        assert_eq!(
            window(&Dim::Known(28), 3, 1, 1, (1, 1), false, "NOTSET"),
            Dim::Known(28)
        );
        assert_eq!(
            window(&Dim::Known(7), 2, 2, 1, (0, 0), true, "NOTSET"),
            Dim::Known(4)
        );
        assert_eq!(
            window(&Dim::Known(7), 3, 2, 1, (0, 0), false, "SAME_UPPER"),
            Dim::Known(4)
        );
    }
}
