//! QDQ folding: a node between DequantizeLinear inputs and one QuantizeLinear consumer, as
//! `onnxruntime.quantization` writes a static int8 model, becomes the quantized op it stands
//! for, as ONNX Runtime's QDQ transformer does:
//!
//! - `Conv` (weights and optional int32 bias constants) → `QLinearConv`;
//! - `MatMul` → `QLinearMatMul`;
//! - `Add`, `Mul` → `com.microsoft` `QLinearAdd`, `QLinearMul` (the same float32 operations,
//!   in one pass over the bytes);
//! - ops that only move values (`Transpose`, `Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`,
//!   `Identity`, `Slice`, `Gather`, `Expand`, `Tile`, `DepthToSpace`, `SpaceToDepth`, nearest
//!   `Resize`, `Concat`), and `MaxPool` under a positive scale, whose DequantizeLinear and
//!   QuantizeLinear share scale and zero point → the same op on the bytes (exact: `q(dq(x))`
//!   is `x`);
//! - `GlobalAveragePool` → `com.microsoft` `QLinearGlobalAveragePool` (each plane's exact
//!   integer sum, scaled once);
//! - `Div` by a float32 constant (hard-swish's `/ 6`) → the CPU EP's own
//!   `ai.epx.cpu` `QLinearDivByConstant` (one pass over the bytes).
//!
//! A DequantizeLinear nobody reads after that, and each absorbed QuantizeLinear, is dropped.
//! The folded Conv and MatMul sum exact integer products and requantize once, where the float
//! path rounds each float32 product: answers differ from the unfolded graph's in the last unit
//! of the few outputs that fall near a rounding boundary, like ONNX Runtime's.
//!
//! Folding is a fast kernel: the reference level runs the graph as written (the `plan_qdq`
//! pass of [`crate::exec::program`] runs at the fast levels only).

use std::collections::{HashMap, HashSet};

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk::{self, Attribute, GraphView, NodeView, TensorView};

/// The nodes to compile, in order: `views` with the patterns folded.
pub(crate) fn plan<'a>(
    graph: &GraphView<'a>,
    views: Vec<NodeView<'a>>,
    outputs: &[u32],
) -> sdk::Result<Vec<NodeView<'a>>> {
    let mut producer: HashMap<u32, usize> = HashMap::new();
    // How many times each value is read, and the last node that reads it.
    let mut readers: HashMap<u32, usize> = HashMap::new();
    let mut reader: HashMap<u32, usize> = HashMap::new();
    for (i, n) in views.iter().enumerate() {
        for v in n.outputs.iter().flatten() {
            producer.insert(*v, i);
        }
        for v in n.inputs.iter().flatten().chain(&n.implicit_inputs) {
            *readers.entry(*v).or_default() += 1;
            reader.insert(*v, i);
        }
    }
    let kept: HashSet<u32> = outputs.iter().copied().collect();
    let f = Folder {
        graph,
        views: &views,
        producer: &producer,
    };
    let mut out: Vec<Option<NodeView<'a>>> = views.iter().cloned().map(Some).collect();
    for i in 0..views.len() {
        let n = &views[i];
        if !n.domain.is_empty() || n.outputs.len() != 1 {
            continue;
        }
        let Some(o) = n.outputs[0] else { continue };
        // The one reader of the output: a QuantizeLinear.
        if kept.contains(&o) || readers.get(&o) != Some(&1) {
            continue;
        }
        let Some(&q) = reader.get(&o) else { continue };
        if views[q].op_type != "QuantizeLinear" || views[q].inputs.first() != Some(&Some(o)) {
            continue;
        }
        let Some(qp) = f.quantize(q) else { continue };
        let Some(folded) = f.fold(n, &qp) else {
            continue;
        };
        for v in folded.dropped_reads.iter() {
            if let Some(c) = readers.get_mut(v) {
                *c -= 1;
            }
        }
        out[i] = Some(folded.node);
        out[q] = None;
    }
    // A DequantizeLinear whose output nobody reads any more.
    for (i, n) in views.iter().enumerate() {
        if n.op_type == "DequantizeLinear"
            && n.domain.is_empty()
            && let Some(Some(o)) = n.outputs.first()
            && !kept.contains(o)
            && readers.get(o).copied().unwrap_or(0) == 0
        {
            out[i] = None;
        }
    }
    Ok(out.into_iter().flatten().collect())
}

struct Folder<'g, 'a> {
    graph: &'g GraphView<'a>,
    views: &'g [NodeView<'a>],
    producer: &'g HashMap<u32, usize>,
}

/// A quantized value's parameters: the bytes' value, scale and zero point (constants).
struct Qp {
    /// DequantizeLinear's input, or QuantizeLinear's output.
    value: u32,
    scale: u32,
    zero: Option<u32>,
    /// The scale's values, and the zero point's (empty when absent).
    scales: Vec<f32>,
    zeros: Vec<i64>,
    ty: ElementType,
    /// DequantizeLinear's output (the float value a node reads).
    float: u32,
}

/// A folded node and the values it no longer reads through a DequantizeLinear.
struct Folded<'a> {
    node: NodeView<'a>,
    dropped_reads: Vec<u32>,
}

impl<'a> Folder<'_, 'a> {
    fn initializer(&self, v: Option<u32>) -> Option<TensorView<'a>> {
        let v = v?;
        if !self.graph.value(v).ok()?.is_initializer() {
            return None;
        }
        self.graph.initializer(v).ok()
    }

    /// The attribute `name` of `n` as an int, if it has it.
    fn int_attr(&self, n: &NodeView<'a>, name: &str) -> Option<Option<i64>> {
        let attrs = self.graph.attributes(n).ok()?;
        Some(attrs.iter().find_map(|(k, a)| match a {
            Attribute::Int(v) if *k == name => Some(*v),
            _ => None,
        }))
    }

    /// The parameters of a DequantizeLinear or QuantizeLinear `n` (`value`: its quantized
    /// side): 8-bit, a float32 scale and a zero point of the same type, both constants, not
    /// blocked.
    fn params(&self, n: &NodeView<'a>, value: u32, float: u32) -> Option<Qp> {
        if !n.domain.is_empty() || self.int_attr(n, "block_size")?.unwrap_or(0) != 0 {
            return None;
        }
        let scale = (*n.inputs.get(1)?)?;
        let zero = n.inputs.get(2).copied().flatten();
        let scales = floats(&self.initializer(Some(scale))?)?;
        // The quantized type: the zero point's (intermediate values often have no declared
        // type), else the value's own.
        let (ty, zeros) = match zero {
            None => (self.graph.value(value).ok()?.elem_type?, Vec::new()),
            Some(_) => {
                let z = self.initializer(zero)?;
                let zeros = match z.elem_type {
                    ElementType::Uint8 => z.data.iter().map(|&b| i64::from(b)).collect(),
                    ElementType::Int8 => z.data.iter().map(|&b| i64::from(b as i8)).collect(),
                    _ => return None,
                };
                (z.elem_type, zeros)
            }
        };
        if !matches!(ty, ElementType::Uint8 | ElementType::Int8) {
            return None;
        }
        Some(Qp {
            value,
            scale,
            zero,
            scales,
            zeros,
            ty,
            float,
        })
    }

    /// The QuantizeLinear at `q`, per tensor, with a zero point.
    fn quantize(&self, q: usize) -> Option<Qp> {
        let n = &self.views[q];
        let out = (*n.outputs.first()?)?;
        let input = (*n.inputs.first()?)?;
        let p = self.params(n, out, input)?;
        (p.scales.len() == 1 && p.zeros.len() == 1).then_some(p)
    }

    /// The DequantizeLinear producing the float value `v`, and its axis.
    fn dequantize(&self, v: Option<u32>) -> Option<(Qp, i64)> {
        let v = v?;
        let d = &self.views[*self.producer.get(&v)?];
        if d.op_type != "DequantizeLinear" || d.outputs.len() != 1 {
            return None;
        }
        let p = self.params(d, (*d.inputs.first()?)?, v)?;
        let axis = self.int_attr(d, "axis")?.unwrap_or(1);
        Some((p, axis))
    }

    /// A per-tensor DequantizeLinear producing `v`.
    fn scalar_dq(&self, v: Option<u32>) -> Option<Qp> {
        let (p, _) = self.dequantize(v)?;
        (p.scales.len() == 1 && p.zeros.len() <= 1).then_some(p)
    }

    fn fold(&self, n: &NodeView<'a>, q: &Qp) -> Option<Folded<'a>> {
        let node = |op: &'a str, domain: &'a str, opset: i64, inputs: Vec<Option<u32>>| NodeView {
            op_type: op,
            domain,
            opset,
            inputs,
            outputs: vec![Some(q.value)],
            ..n.clone()
        };
        let triple = |p: &Qp| [Some(p.value), Some(p.scale), p.zero];
        match n.op_type {
            "Conv" => {
                let x = self.scalar_dq(n.inputs.first().copied().flatten())?;
                let (w, axis) = self.dequantize(n.inputs.get(1).copied().flatten())?;
                self.initializer(Some(w.value))?;
                let m = self.graph.value(w.value).ok()?.shape?.first().copied()?;
                let per_channel = w.scales.len() != 1;
                if per_channel && (axis != 0 || w.scales.len() as i64 != m) {
                    return None;
                }
                let mut inputs: Vec<Option<u32>> = triple(&x).into_iter().collect();
                inputs.extend(triple(&w));
                inputs.extend([Some(q.scale), q.zero]);
                let mut dropped = vec![x.float, w.float];
                if let Some(b) = n.inputs.get(2).copied().flatten() {
                    inputs.push(Some(self.bias(b, &x, &w)?));
                    dropped.push(b);
                }
                Some(Folded {
                    node: node("QLinearConv", "", n.opset.max(10), inputs),
                    dropped_reads: dropped,
                })
            }
            "MatMul" => {
                let a = self.scalar_dq(n.inputs.first().copied().flatten())?;
                // B per tensor, or per column of a 2-D constant (axis 1).
                let (b, axis) = self.dequantize(n.inputs.get(1).copied().flatten())?;
                if b.scales.len() != 1 {
                    self.initializer(Some(b.value))?;
                    let shape = self.graph.value(b.value).ok()?.shape?;
                    if shape.len() != 2
                        || !matches!(axis, 1 | -1)
                        || shape[1] != b.scales.len() as i64
                        || (b.zeros.len() != b.scales.len() && !b.zeros.is_empty())
                    {
                        return None;
                    }
                } else if b.zeros.len() > 1 {
                    return None;
                }
                let mut inputs: Vec<Option<u32>> = triple(&a).into_iter().collect();
                inputs.extend(triple(&b));
                inputs.extend([Some(q.scale), q.zero]);
                Some(Folded {
                    node: node("QLinearMatMul", "", n.opset.max(10), inputs),
                    dropped_reads: vec![a.float, b.float],
                })
            }
            "Add" | "Mul" => {
                let a = self.scalar_dq(n.inputs.first().copied().flatten())?;
                let b = self.scalar_dq(n.inputs.get(1).copied().flatten())?;
                let op = if n.op_type == "Add" {
                    "QLinearAdd"
                } else {
                    "QLinearMul"
                };
                let mut inputs: Vec<Option<u32>> = triple(&a).into_iter().collect();
                inputs.extend(triple(&b));
                inputs.extend([Some(q.scale), q.zero]);
                Some(Folded {
                    node: node(op, "com.microsoft", 1, inputs),
                    dropped_reads: vec![a.float, b.float],
                })
            }
            "Transpose" | "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" | "Identity"
            | "Slice" | "Gather" | "Expand" | "Tile" | "DepthToSpace" | "SpaceToDepth"
            | "Resize" | "MaxPool" => {
                let x = self.scalar_dq(n.inputs.first().copied().flatten())?;
                if !same_params(&x, q) {
                    return None;
                }
                // Resize moves values only when it picks the nearest one; a max commutes with
                // the dequantization when its scale is positive.
                let moves = match n.op_type {
                    "Resize" => {
                        // (Outside the region of interest, tf_crop_and_resize writes a float.)
                        self.str_attr(n, "mode")?.is_none_or(|m| m == b"nearest")
                            && self.str_attr(n, "coordinate_transformation_mode")?
                                != Some(b"tf_crop_and_resize")
                    }
                    "MaxPool" => x.scales[0] > 0.0,
                    _ => true,
                };
                if !moves {
                    return None;
                }
                let mut inputs = n.inputs.clone();
                inputs[0] = Some(x.value);
                Some(Folded {
                    node: NodeView {
                        inputs,
                        outputs: vec![Some(q.value)],
                        ..n.clone()
                    },
                    dropped_reads: vec![x.float],
                })
            }
            "Concat" => {
                let xs: Vec<Qp> = n
                    .inputs
                    .iter()
                    .map(|&v| self.scalar_dq(v).filter(|x| same_params(x, q)))
                    .collect::<Option<_>>()?;
                Some(Folded {
                    node: NodeView {
                        inputs: xs.iter().map(|x| Some(x.value)).collect(),
                        outputs: vec![Some(q.value)],
                        ..n.clone()
                    },
                    dropped_reads: xs.iter().map(|x| x.float).collect(),
                })
            }
            "Div" => {
                // By a float32 constant: the CPU EP's own QLinearDivByConstant.
                let x = self.scalar_dq(n.inputs.first().copied().flatten())?;
                let d = n.inputs.get(1).copied().flatten()?;
                let dv = floats(&self.initializer(Some(d))?)?;
                if x.ty != q.ty || dv.len() != 1 || !dv[0].is_normal() {
                    return None;
                }
                let mut inputs: Vec<Option<u32>> = triple(&x).into_iter().collect();
                inputs.extend([Some(d), Some(q.scale), q.zero]);
                Some(Folded {
                    node: node("QLinearDivByConstant", crate::kernel::EPX_CPU, 1, inputs),
                    dropped_reads: vec![x.float],
                })
            }
            "GlobalAveragePool" => {
                let x = self.scalar_dq(n.inputs.first().copied().flatten())?;
                if x.ty != q.ty || x.zero.is_none() {
                    return None;
                }
                let mut inputs: Vec<Option<u32>> = triple(&x).into_iter().collect();
                inputs.extend([Some(q.scale), q.zero]);
                Some(Folded {
                    node: node("QLinearGlobalAveragePool", "com.microsoft", 1, inputs),
                    dropped_reads: vec![x.float],
                })
            }
            _ => None,
        }
    }

    /// The string attribute `name` of `n`, if it has it.
    fn str_attr(&self, n: &NodeView<'a>, name: &str) -> Option<Option<&'a [u8]>> {
        let attrs = self.graph.attributes(n).ok()?;
        Some(attrs.iter().find_map(|(k, a)| match a {
            Attribute::String(v) if *k == name => Some(*v),
            _ => None,
        }))
    }

    /// A Conv bias that is a DequantizeLinear of int32 constants with zero points 0 and the
    /// scale `x_scale · w_scale` (per channel) that QLinearConv implies: its int32 value.
    fn bias(&self, b: u32, x: &Qp, w: &Qp) -> Option<u32> {
        let d = &self.views[*self.producer.get(&b)?];
        if d.op_type != "DequantizeLinear" || !d.domain.is_empty() {
            return None;
        }
        let value = (*d.inputs.first()?)?;
        let t = self.initializer(Some(value))?;
        // QLinearConv's bias is int32 of shape [M].
        let m = self.graph.value(w.value).ok()?.shape?.first().copied()?;
        if t.elem_type != ElementType::Int32 || t.shape != [m] {
            return None;
        }
        let scales = floats(&self.initializer(*d.inputs.get(1)?)?)?;
        if let Some(z) = d.inputs.get(2).copied().flatten() {
            let z = self.initializer(Some(z))?;
            if z.elem_type != ElementType::Int32 || z.data.iter().any(|&b| b != 0) {
                return None;
            }
        }
        let channels = w.scales.len().max(scales.len());
        for c in 0..channels {
            let ws = w.scales[if w.scales.len() == 1 { 0 } else { c }];
            let bs = scales[if scales.len() == 1 { 0 } else { c }];
            let want = x.scales[0] * ws;
            if (bs - want).abs() > want.abs() * 1e-6 {
                return None;
            }
        }
        Some(value)
    }
}

/// Whether a DequantizeLinear's parameters are a QuantizeLinear's: then `q(dq(x))` is `x`, and
/// an op that only moves values can move the bytes.
fn same_params(x: &Qp, q: &Qp) -> bool {
    x.ty == q.ty
        && x.scales[0].to_bits() == q.scales[0].to_bits()
        && x.zeros.first().copied().unwrap_or(0) == q.zeros[0]
}

/// The values of a float32 constant; `None` for another type.
fn floats(t: &TensorView<'_>) -> Option<Vec<f32>> {
    (t.elem_type == ElementType::Float).then(|| {
        t.data
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    })
}
