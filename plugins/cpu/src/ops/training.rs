//! The optimizers of the `ai.onnx.preview.training` domain: Adagrad, Momentum (standard and
//! Nesterov) and Adam, each updating any number of tensors in one node.
//!
//! Inputs are `[R, T, X1..Xn, G1..Gn, (V1..Vn,) H1..Hn]`: the learning rate, the update count,
//! then one group per kind of tensor; outputs are the new values of every group but `G`.

use epx_plugin_api::ElementType;

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::OpResult;
use crate::kernel::{NodeDef, OpKernel, OpSchema, Registry, kernel};
use crate::ops::util::args::{input, scalar_i64};
use crate::tensor::{Tensor, TensorRef};

const TRAINING: &str = "ai.onnx.preview.training";

pub fn register(reg: &mut Registry) {
    for (op_type, build) in [
        ("Adagrad", build_adagrad as crate::kernel::BuildFn),
        ("Momentum", build_momentum),
        ("Adam", build_adam),
    ] {
        reg.add(OpSchema {
            op_type,
            domain: TRAINING,
            since_version: 1,
            until_version: i64::MAX,
            build,
        });
    }
}

/// The learning rate, the update count, and `groups` lists of `n` tensors each (as `f64`, with
/// the first group's shapes and types, which every group must share).
struct Step {
    r: f64,
    t: i64,
    n: usize,
    /// `groups[g][i]`: tensor `i` of group `g`.
    groups: Vec<Vec<Vec<f64>>>,
    shapes: Vec<Vec<usize>>,
    types: Vec<ElementType>,
}

fn read_step(op: &str, inputs: &[Option<TensorRef<'_>>], groups: usize) -> OpResult<Step> {
    let rest = inputs.len().saturating_sub(2);
    if rest == 0 || !rest.is_multiple_of(groups) {
        bail!(
            "{op}: after R and T the inputs must come in {groups} equal groups, got {rest} inputs"
        );
    }
    let n = rest / groups;
    let r_t = input(op, inputs, 0)?;
    let r = float_values(op, "R", r_t)?;
    let [r] = r[..] else {
        bail!("{op}: R must hold one value, has shape {:?}", r_t.shape());
    };
    let t = scalar_i64(op, "T", input(op, inputs, 1)?)?;
    let mut all = Vec::with_capacity(groups);
    let mut shapes = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for g in 0..groups {
        let mut group = Vec::with_capacity(n);
        for i in 0..n {
            let x = input(op, inputs, 2 + g * n + i)?;
            if g == 0 {
                shapes.push(x.shape().to_vec());
                types.push(x.elem_type());
            } else if x.shape() != shapes[i].as_slice() {
                bail!(
                    "{op}: input {} has shape {:?}, but the tensor it belongs to has {:?}",
                    2 + g * n + i,
                    x.shape(),
                    shapes[i]
                );
            }
            group.push(float_values(op, "tensor", x)?);
        }
        all.push(group);
    }
    Ok(Step {
        r,
        t,
        n,
        groups: all,
        shapes,
        types,
    })
}

/// Outputs: for each output group (in order), its `n` tensors.
fn write_step(step: &Step, outs: Vec<Vec<Vec<f64>>>) -> OpResult<Vec<Tensor>> {
    let mut v = Vec::with_capacity(outs.len() * step.n);
    for group in outs {
        for (i, data) in group.into_iter().enumerate() {
            v.push(tensor_from_f64(step.types[i], &step.shapes[i], data)?);
        }
    }
    Ok(v)
}

fn build_adagrad(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let epsilon = f64::from(n.attr_float_or("epsilon", 1e-6)?);
    let decay = f64::from(n.attr_float_or("decay_factor", 0.0)?);
    let norm = f64::from(n.attr_float_or("norm_coefficient", 0.0)?);
    Ok(kernel(move |inputs| {
        let s = read_step(&op, inputs, 3)?;
        let rate = s.r / (1.0 + s.t as f64 * decay);
        let (mut xs, mut hs) = (Vec::new(), Vec::new());
        for i in 0..s.n {
            let (x, g, h) = (&s.groups[0][i], &s.groups[1][i], &s.groups[2][i]);
            let mut xn = Vec::with_capacity(x.len());
            let mut hn = Vec::with_capacity(x.len());
            for ((&x, &g), &h) in x.iter().zip(g).zip(h) {
                let g = norm * x + g;
                let h = h + g * g;
                xn.push(x - rate * g / (h.sqrt() + epsilon));
                hn.push(h);
            }
            xs.push(xn);
            hs.push(hn);
        }
        write_step(&s, vec![xs, hs])
    }))
}

fn build_momentum(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let alpha = f64::from(
        n.attr_float("alpha")?
            .ok_or_else(|| n.error("needs `alpha`"))?,
    );
    let beta = f64::from(
        n.attr_float("beta")?
            .ok_or_else(|| n.error("needs `beta`"))?,
    );
    let norm = f64::from(
        n.attr_float("norm_coefficient")?
            .ok_or_else(|| n.error("needs `norm_coefficient`"))?,
    );
    let nesterov = match n.attr_string("mode")?.as_deref() {
        Some("standard") => false,
        Some("nesterov") => true,
        Some(other) => {
            return Err(n.error(format_args!("mode `{other}` is not standard or nesterov")));
        }
        None => return Err(n.error("needs `mode`")),
    };
    Ok(kernel(move |inputs| {
        let s = read_step(&op, inputs, 3)?;
        // The gradient's coefficient is 1 on the first update.
        let beta = if s.t > 0 { beta } else { 1.0 };
        let (mut xs, mut vs) = (Vec::new(), Vec::new());
        for i in 0..s.n {
            let (x, g, v) = (&s.groups[0][i], &s.groups[1][i], &s.groups[2][i]);
            let mut xn = Vec::with_capacity(x.len());
            let mut vn = Vec::with_capacity(x.len());
            for ((&x, &g), &v) in x.iter().zip(g).zip(v) {
                let g = norm * x + g;
                let v = alpha * v + beta * g;
                xn.push(if nesterov {
                    x - s.r * (g + alpha * v)
                } else {
                    x - s.r * v
                });
                vn.push(v);
            }
            xs.push(xn);
            vs.push(vn);
        }
        write_step(&s, vec![xs, vs])
    }))
}

fn build_adam(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let alpha = f64::from(n.attr_float_or("alpha", 0.9)?);
    let beta = f64::from(n.attr_float_or("beta", 0.999)?);
    let epsilon = f64::from(n.attr_float_or("epsilon", 1e-6)?);
    let norm = f64::from(n.attr_float_or("norm_coefficient", 0.0)?);
    let norm_post = f64::from(n.attr_float_or("norm_coefficient_post", 0.0)?);
    Ok(kernel(move |inputs| {
        let s = read_step(&op, inputs, 4)?;
        // Bias correction of both moments after the first update.
        let rate = if s.t > 0 {
            let t = s.t as f64;
            s.r * (1.0 - beta.powf(t)).sqrt() / (1.0 - alpha.powf(t))
        } else {
            s.r
        };
        let (mut xs, mut vs, mut hs) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..s.n {
            let x = &s.groups[0][i];
            let (g, v, h) = (&s.groups[1][i], &s.groups[2][i], &s.groups[3][i]);
            let mut xn = Vec::with_capacity(x.len());
            let mut vn = Vec::with_capacity(x.len());
            let mut hn = Vec::with_capacity(x.len());
            for (((&x, &g), &v), &h) in x.iter().zip(g).zip(v).zip(h) {
                let g = norm * x + g;
                let v = alpha * v + (1.0 - alpha) * g;
                let h = beta * h + (1.0 - beta) * g * g;
                let x = x - rate * (v / (h.sqrt() + epsilon));
                xn.push((1.0 - norm_post) * x);
                vn.push(v);
                hn.push(h);
            }
            xs.push(xn);
            vs.push(vn);
            hs.push(hn);
        }
        write_step(&s, vec![xs, vs, hs])
    }))
}
