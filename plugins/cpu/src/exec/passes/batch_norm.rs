//! An inference BatchNormalization after a Conv of constant weights, folded into the weights.

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use super::Draft;
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
    let mut i = 0;
    while i < d.steps.len() {
        if let Some((conv, x)) = foldable(d, i)
            && let Some((w, b)) = folded_weights(d, conv, i)
        {
            let w = d.constant(w);
            let b = Some(d.constant(b));
            let inputs = &mut d.steps[conv].step.inputs;
            inputs[1] = Some(w);
            match inputs.get_mut(2) {
                Some(slot) => *slot = b,
                None => inputs.push(b),
            }
            let bn = d.steps.remove(i);
            if let Some(Some(y)) = bn.step.outputs.first() {
                d.replace(*y, Source::Slot(x));
            }
            continue;
        }
        i += 1;
    }
    Ok(())
}

/// For step `i`, a BatchNormalization of the pattern: the Conv step it follows and the slot
/// between them.
fn foldable(d: &Draft<'_, '_>, i: usize) -> Option<(usize, usize)> {
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
    if d.readers(*x) != 1 {
        return None;
    }
    let conv = d.steps[..i]
        .iter()
        .rposition(|s| s.step.outputs.contains(&Some(*x)))?;
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
    let (w_shape, w) = (w.shape().to_vec(), w.as_standard_layout());
    let per = w.len() / c;
    let scale: Vec<f32> = gamma
        .iter()
        .zip(var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let new_w: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| v * scale[i / per])
        .collect();
    let new_b: Vec<f32> = (0..c)
        .map(|k| (bias[k] - mean[[k]]) * scale[k] + beta[[k]])
        .collect();
    Some((
        Tensor::from_vec(&w_shape, new_w).ok()?,
        Tensor::from_vec(&[c], new_b).ok()?,
    ))
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
}
