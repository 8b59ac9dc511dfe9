//! Per-channel affine maps after a Conv of constant weights, folded into its weights and bias:
//! an inference BatchNormalization, and Add, Sub and Mul by a constant of one value per channel
//! (a normalization written out as arithmetic, as converters from other frameworks do).

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use std::collections::HashMap;

use super::{Draft, Reads, renamed};
use crate::exec::step::Source;
use crate::kernel::AttrValue;
use crate::tensor::Tensor;

/// `fold_batch_norm` (fast levels): an inference BatchNormalization whose input only it reads,
/// made by a Conv of float32 constant weights (and bias), becomes part of those weights, as ONNX
/// Runtime's Conv/BatchNormalization fusion does: per output channel `s = γ / √(var + ε)`,
/// `W' = W · s`, `B' = (B − mean) · s + β`, in f32. The normalization's four parameters must be
/// float32 constants of one value per channel; a float16 model keeps its own rounding.
///
/// In: steps. Out: each such pair one Conv step with new weight and bias constants; readers of
/// the normalization's output read the Conv's.
pub(crate) fn fold_batch_norm(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    fold_steps(d, |d, f, i| {
        let (conv, x) = foldable(d, f, i)?;
        let (w, b) = folded_weights(d, conv, i)?;
        Some((conv, x, (Some(w), b)))
    });
    Ok(())
}

/// What [`fold_steps`] knows of the draft while it folds: who reads each slot (kept up to date
/// as folds move readers), the step making each slot (stable: no step moves until the end).
struct Folds {
    reads: Reads,
    producer: HashMap<usize, usize>,
}

/// Runs `find` on each step in order (its inputs renamed first through the folds before it);
/// for each `Some((conv, x, (w, b)))` gives the Conv step `conv` (writing slot `x`) the weights
/// `w` (when given) and bias `b`, removes the step and points its readers at `x`. One pass:
/// removed steps are dropped and graph values renamed at the end, so a chain of N folds is not
/// N removals and N [`Draft::replace`]s.
#[allow(clippy::type_complexity)]
fn fold_steps(
    d: &mut Draft<'_, '_>,
    find: impl Fn(&Draft<'_, '_>, &Folds, usize) -> Option<(usize, usize, (Option<Tensor>, Tensor))>,
) {
    let mut producer = HashMap::new();
    for (i, st) in d.steps.iter().enumerate() {
        for s in st.step.outputs.iter().flatten() {
            producer.insert(*s, i);
        }
    }
    let mut f = Folds {
        reads: d.reads(),
        producer,
    };
    let mut alias: HashMap<usize, Source> = HashMap::new();
    let mut removed = Vec::new();
    for i in 0..d.steps.len() {
        if !alias.is_empty() {
            let inputs = d.steps[i].step.inputs.iter_mut().flatten();
            inputs.for_each(|s| renamed(&alias, s));
        }
        let Some((conv, x, (w, b))) = find(d, &f, i) else {
            continue;
        };
        let w = w.map(|w| d.constant(w));
        let b = Some(d.constant(b));
        let inputs = &mut d.steps[conv].step.inputs;
        if let Some(w) = w {
            inputs[1] = Some(w);
        }
        match inputs.get_mut(2) {
            Some(slot) => *slot = b,
            None => inputs.push(b),
        }
        removed.push(i);
        if let Some(Some(y)) = d.steps[i].step.outputs.first() {
            alias.insert(*y, Source::Slot(x));
            f.reads.moved(*y, x);
        }
    }
    if alias.is_empty() {
        return;
    }
    let mut gone = vec![false; d.steps.len()];
    for i in removed {
        gone[i] = true;
    }
    let steps = std::mem::take(&mut d.steps);
    d.steps = steps
        .into_iter()
        .zip(gone)
        .filter_map(|(st, gone)| (!gone).then_some(st))
        .collect();
    d.rename_values(&alias);
}

/// For step `i`, a BatchNormalization of the pattern: the Conv step it follows and the slot
/// between them.
fn foldable(d: &Draft<'_, '_>, f: &Folds, i: usize) -> Option<(usize, usize)> {
    let st = &d.steps[i];
    let info = st.node.as_ref()?;
    if !st.is_op("BatchNormalization")
        || info.output_types.first() != Some(&Some(ElementType::Float))
    {
        return None;
    }
    let [Some(_), rest @ ..] = st.step.outputs.as_slice() else {
        return None;
    };
    if rest.iter().any(Option::is_some) {
        return None;
    }
    for (name, a) in &info.def.attributes {
        match (name.as_str(), a) {
            ("epsilon", AttrValue::Float(_))
            | ("training_mode", AttrValue::Int(0))
            | ("spatial", AttrValue::Int(1))
            | ("momentum", _) => {}
            _ => return None,
        }
    }
    let Some(Some(Source::Slot(x))) = st.step.inputs.first() else {
        return None;
    };
    if f.reads.count(*x) != 1 {
        return None;
    }
    let conv = f.producer.get(x).copied().filter(|&c| c < i)?;
    let c = &d.steps[conv];
    (c.is_op("Conv") && c.step.outputs.len() == 1).then_some((conv, *x))
}

/// The Conv's weights and bias with normalization `bn` folded in; `None` when a parameter is
/// not a float32 constant of the right shape.
fn folded_weights(d: &Draft<'_, '_>, conv: usize, bn: usize) -> Option<(Tensor, Tensor)> {
    let f32_const = |s: Option<&Option<Source>>| match s {
        Some(Some(Source::Constant(i))) => match &d.constants[*i] {
            Tensor::F32(a) => Some(a),
            _ => None,
        },
        _ => None,
    };
    let bn_step = &d.steps[bn];
    let eps = match bn_step.node.as_ref()?.def.attributes.get("epsilon") {
        Some(AttrValue::Float(e)) => *e,
        _ => 1e-5,
    };
    let p = |k: usize| f32_const(bn_step.step.inputs.get(k));
    let (gamma, beta, mean, var) = (p(1)?, p(2)?, p(3)?, p(4)?);
    if bn_step.step.inputs.len() != 5 {
        return None;
    }
    let c = gamma.len();
    if [gamma, beta, mean, var].iter().any(|p| p.shape() != [c]) {
        return None;
    }
    let conv_inputs = &d.steps[conv].step.inputs;
    let w = f32_const(conv_inputs.get(1))?;
    if w.ndim() < 3 || w.shape()[0] != c || c == 0 {
        return None;
    }
    let bias: Vec<f32> = match conv_inputs.get(2) {
        None | Some(None) => vec![0.0; c],
        b => {
            let b = f32_const(b).filter(|b| b.shape() == [c])?;
            b.iter().copied().collect()
        }
    };
    let scale: Vec<f32> = gamma
        .iter()
        .zip(var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let new_b: Vec<f32> = (0..c)
        .map(|k| (bias[k] - mean[[k]]) * scale[k] + beta[[k]])
        .collect();
    Some((scaled(w, &scale)?, Tensor::from_vec(&[c], new_b).ok()?))
}

/// Weights `w` (`[m, ...]`) with output channel `k`'s multiplied by `scale[k]`.
fn scaled(w: &ndarray::ArrayD<f32>, scale: &[f32]) -> Option<Tensor> {
    let (shape, w) = (w.shape().to_vec(), w.as_standard_layout());
    let per = w.len() / scale.len().max(1);
    let new_w: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| v * scale[i / per])
        .collect();
    Tensor::from_vec(&shape, new_w).ok()
}

/// `fold_conv_affine` (fast levels): an Add, Sub (of the constant) or Mul whose other operand
/// is a float32 constant of one value per output channel (`[1, m, 1, 1]`, `[m, 1, 1]`, or one
/// value), reading a Conv of float32 constant weights whose output only it reads, becomes part
/// of the Conv: `+ c` and `− c` of the bias, `· c` of the weights and the bias, as ONNX
/// Runtime's Conv/Add and Conv/Mul fusions do (and Sub as the Add of `−c`, which is the same
/// sum). Repeated, a normalization written as `(x − mean) · scale + shift` folds whole.
///
/// In: steps. Out: each such Conv with new weight and bias constants, without the steps folded
/// into it; their readers read the Conv's output.
pub(crate) fn fold_conv_affine(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    fold_steps(d, affine_after_conv);
    Ok(())
}

/// The new weights (`None`: unchanged) and bias of a Conv when step `i` is an affine map of its
/// output by a per-channel constant; with the Conv's step and output slot.
#[allow(clippy::type_complexity)]
fn affine_after_conv(
    d: &Draft<'_, '_>,
    f: &Folds,
    i: usize,
) -> Option<(usize, usize, (Option<Tensor>, Tensor))> {
    let st = &d.steps[i];
    let info = st.node.as_ref()?;
    let op = info.def.op_type.as_str();
    if !matches!(op, "Add" | "Sub" | "Mul")
        || !info.def.domain.is_empty()
        || info.def.opset < 7
        || info.output_types.first() != Some(&Some(ElementType::Float))
        || st.step.outputs.len() != 1
        || st.step.inputs.len() != 2
    {
        return None;
    }
    // The Conv's output, and the constant: either order but for Sub.
    let (x, c) = match (st.step.inputs[0], st.step.inputs[1]) {
        (Some(Source::Slot(x)), Some(c @ Source::Constant(_))) => (x, c),
        (Some(c @ Source::Constant(_)), Some(Source::Slot(x))) if op != "Sub" => (x, c),
        _ => return None,
    };
    if f.reads.count(x) != 1 {
        return None;
    }
    let conv = f.producer.get(&x).copied().filter(|&c| c < i)?;
    let cv = &d.steps[conv];
    if !cv.is_op("Conv") || cv.step.outputs.len() != 1 {
        return None;
    }
    let f32_const = |s: Option<&Option<Source>>| match s {
        Some(Some(Source::Constant(k))) => match &d.constants[*k] {
            Tensor::F32(a) => Some(a),
            _ => None,
        },
        _ => None,
    };
    let w = f32_const(cv.step.inputs.get(1))?;
    let (m, rank) = (*w.shape().first()?, w.ndim());
    if rank < 3 || m == 0 {
        return None;
    }
    // One value per channel of the `[n, m, ...]` output, or one for all.
    let Tensor::F32(c) = d.constant_value(c)? else {
        return None;
    };
    let cs = c.shape();
    if cs.len() > rank {
        return None;
    }
    // Axis 1 of the output is `rank - 2` counted from the right.
    let per_channel = cs
        .iter()
        .rev()
        .enumerate()
        .all(|(a, &n)| n == 1 || (a == rank - 2 && n == m));
    if !per_channel {
        return None;
    }
    let c: Vec<f32> = match c.len() {
        1 => vec![*c.iter().next()?; m],
        _ => c.iter().copied().collect(),
    };
    let bias: Vec<f32> = match cv.step.inputs.get(2) {
        None | Some(None) => vec![0.0; m],
        b => {
            let b = f32_const(b).filter(|b| b.shape() == [m])?;
            b.iter().copied().collect()
        }
    };
    let (w, b) = match op {
        "Add" => (None, bias.iter().zip(&c).map(|(b, c)| b + c).collect()),
        "Sub" => (None, bias.iter().zip(&c).map(|(b, c)| b - c).collect()),
        _ => (
            Some(scaled(w, &c)?),
            bias.iter().zip(&c).map(|(b, c)| b * c).collect(),
        ),
    };
    Some((conv, x, (w, Tensor::from_vec(&[m], b).ok()?)))
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::testing::{Unused, def, node_step};
    use crate::exec::passes::{CompileOptions, Draft};
    use crate::ops::testing::{t, vals};

    /// Conv (weights 2, bias 1) → BatchNormalization (γ 3, β 0.5, mean 1, var 3, ε 1) on one
    /// channel, with a Relu reading the normalization: `s = 3/2`, `W' = 3`, `B' = 0.5`.
    fn draft<'a>(
        options: &'a CompileOptions,
        g: &'a TestGraph,
        extra_reader: bool,
    ) -> Draft<'a, 'a> {
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], options).unwrap();
        for v in [2.0, 1.0, 3.0, 0.5, 1.0, 3.0] {
            d.constant(t(&[1], vec![v]));
        }
        d.constants[0] = t(&[1, 1, 1], vec![2.0]);
        let c = |i| Some(Source::Constant(i));
        d.steps.push(node_step(
            def("Conv", 3),
            Box::new(Unused),
            vec![Some(Source::Input(0)), c(0), c(1)],
            &[0],
        ));
        let mut bn = def("BatchNormalization", 5);
        bn.attributes
            .insert("epsilon".into(), AttrValue::Float(1.0));
        let x = Some(Source::Slot(0));
        d.steps.push(node_step(
            bn,
            Box::new(Unused),
            vec![x, c(2), c(3), c(4), c(5)],
            &[1],
        ));
        d.steps.push(node_step(
            def("Relu", 1),
            Box::new(Unused),
            vec![Some(Source::Slot(1))],
            &[2],
        ));
        if extra_reader {
            d.steps
                .push(node_step(def("Neg", 1), Box::new(Unused), vec![x], &[3]));
        }
        d
    }

    #[test]
    fn the_normalization_becomes_the_convolution_weights() {
        let (options, g) = (CompileOptions::default(), TestGraph::new());
        let mut d = draft(&options, &g, false);
        fold_batch_norm(&mut d).unwrap();
        let kinds: Vec<&str> = d.steps.iter().map(|s| s.step.kind.as_str()).collect();
        assert_eq!(kinds, ["Conv", "Relu"]);
        let conv = &d.steps[0].step.inputs;
        let value = |k: usize| match conv[k] {
            Some(Source::Constant(i)) => vals(&d.constants[i]),
            other => panic!("{other:?}"),
        };
        assert_eq!((value(1), value(2)), (vec![3.0], vec![0.5]));
        assert_eq!(d.steps[1].step.inputs, [Some(Source::Slot(0))]);
    }

    #[test]
    fn a_convolution_output_read_elsewhere_is_left_alone() {
        let (options, g) = (CompileOptions::default(), TestGraph::new());
        let mut d = draft(&options, &g, true);
        fold_batch_norm(&mut d).unwrap();
        assert_eq!(d.steps.len(), 4);
    }

    /// Conv (two output channels, 1×1) then `kinds` of ops by constants; returns the step kinds
    /// after `fold_conv_affine` and checks the output is the same but for rounding.
    fn affine(ops: &[(&str, Tensor, bool)]) -> Vec<String> {
        use crate::exec::passes::testing::{kinds, push, run_draft};
        let (g, options) = (TestGraph::new(), CompileOptions::default());
        let last = 10 + ops.len() as u32;
        let outputs = [last + 1];
        let mut d = Draft::new(g.view(), &[], &[], &outputs, &[], &options).unwrap();
        let w = d.constant(t(&[2, 1, 1, 1], vec![2.0, -1.5]));
        push(&mut d, def("Conv", 2), &[Source::Input(0), w], 10);
        for (k, (op, c, first)) in ops.iter().enumerate() {
            let c = d.constant(c.clone());
            let x = Source::Slot(10 + k);
            let ins = if *first { [c, x] } else { [x, c] };
            push(&mut d, def(op, 2), &ins, 11 + k as u32);
        }
        push(
            &mut d,
            def("Relu", 1),
            &[Source::Slot(last as usize)],
            last + 1,
        );
        let x = [t(&[1, 1, 2, 2], vec![1.0, -2.0, 0.5, 3.0])];
        let before = run_draft(&d, &x);
        fold_conv_affine(&mut d).unwrap();
        let after = run_draft(&d, &x);
        for (a, b) in vals(&after[0]).iter().zip(vals(&before[0])) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
        kinds(&d)
    }

    #[test]
    fn per_channel_add_sub_and_mul_after_a_convolution_become_its_weights() {
        let per_channel = |shape: &[usize], v: Vec<f32>| t(shape, v);
        let kinds = affine(&[
            ("Add", per_channel(&[1, 2, 1, 1], vec![0.5, -1.0]), false),
            ("Sub", per_channel(&[2, 1, 1], vec![0.25, 2.0]), false),
            ("Mul", per_channel(&[1, 2, 1, 1], vec![3.0, -0.5]), true),
            ("Add", per_channel(&[1], vec![0.125]), true),
        ]);
        assert_eq!(kinds, ["Conv", "Relu"]);
    }

    #[test]
    fn constants_that_vary_over_the_plane_or_subtract_the_convolution_stay() {
        let kinds = affine(&[("Add", t(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]), false)]);
        assert_eq!(kinds, ["Conv", "Add", "Relu"]);
        let kinds = affine(&[("Sub", t(&[1, 2, 1, 1], vec![1.0, 2.0]), true)]);
        assert_eq!(kinds, ["Conv", "Sub", "Relu"]);
    }
}
