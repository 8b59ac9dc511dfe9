//! Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (reductions none/sum/mean,
//! optional class weights, ignore_index, and the optional log_prob output of the latter).
//!
//! Values are computed in f64 and cast back to the input's float type.

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::OpResult;
use crate::kernel::add;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "NegativeLogLikelihoodLoss", 12, |n| build(n, false));
    add(reg, "SoftmaxCrossEntropyLoss", 12, |n| build(n, true));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

#[derive(Debug, Clone)]
struct Loss {
    op: String,
    reduction: Reduction,
    ignore_index: Option<i64>,
    softmax: bool,
    outputs: usize,
}

fn build(n: &NodeDef, softmax: bool) -> OpResult<Box<dyn OpKernel>> {
    let reduction = match n.attr_string_or("reduction", "mean")?.as_str() {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        other => return Err(n.error(format_args!("unknown reduction '{other}'"))),
    };
    let l = Loss {
        op: n.op_type.clone(),
        reduction,
        ignore_index: n.attr_int("ignore_index")?,
        softmax,
        outputs: n.num_outputs,
    };
    Ok(kernel(move |inputs| l.run(inputs)))
}

/// Log-softmax over axis 1 of an `[N, C, D]`-shaped buffer.
fn log_softmax_axis1(x: &[f64], n: usize, c: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for i in 0..n {
        for k in 0..d {
            let at = |j: usize| (i * c + j) * d + k;
            let max = (0..c)
                .map(|j| x.get(at(j)).copied().unwrap_or(f64::NEG_INFINITY))
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..c)
                .map(|j| (x.get(at(j)).copied().unwrap_or(0.0) - max).exp())
                .sum();
            let ls = sum.ln();
            for j in 0..c {
                if let (Some(o), Some(v)) = (out.get_mut(at(j)), x.get(at(j))) {
                    *o = v - max - ls;
                }
            }
        }
    }
    out
}

impl Loss {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        let target = input(op, inputs, 1)?;
        let ty = x.elem_type();
        let xs = x.shape();
        if xs.len() < 2 {
            bail!("{op}: input must have rank >= 2 (N, C, ...), got shape {xs:?}");
        }
        let (n, c) = (xs[0], xs[1]);
        let mut want_t = vec![n];
        want_t.extend_from_slice(&xs[2..]);
        if target.shape() != want_t.as_slice() {
            bail!(
                "{op}: target must have shape {want_t:?} for input shape {xs:?}, got {:?}",
                target.shape()
            );
        }
        let t = match target.elem_type() {
            epx_plugin_api::ElementType::Int32 | epx_plugin_api::ElementType::Int64 => {
                target.to_i64_vec(&format!("{op}: target"))?
            }
            other => bail!("{op}: target must be an int32 or int64 tensor, got {other}"),
        };
        let weight = match opt_input(inputs, 2) {
            Some(w) => {
                if w.shape() != [c] {
                    bail!("{op}: weight must have shape [{c}], got {:?}", w.shape());
                }
                if w.elem_type() != ty {
                    bail!(
                        "{op}: weight must have the input's type {ty}, got {}",
                        w.elem_type()
                    );
                }
                Some(float_values(op, "weight", w)?)
            }
            None => None,
        };
        let d: usize = xs[2..].iter().product();
        let mut xv = float_values(op, "input", x)?;
        if self.softmax {
            xv = log_softmax_axis1(&xv, n, c, d);
        }
        let mut loss = vec![0.0f64; t.len()];
        let mut wsum = 0.0f64;
        for (idx, (&cls, l)) in t.iter().zip(loss.iter_mut()).enumerate() {
            if Some(cls) == self.ignore_index {
                continue;
            }
            let j = usize::try_from(cls)
                .ok()
                .filter(|&j| j < c)
                .ok_or_else(|| {
                    crate::error::OpError(format!(
                        "{op}: target value {cls} is out of range for {c} classes"
                    ))
                })?;
            let (i, k) = (idx / d.max(1), idx % d.max(1));
            let w = weight
                .as_ref()
                .map_or(1.0, |w| w.get(j).copied().unwrap_or(0.0));
            let v = xv.get((i * c + j) * d + k).copied().unwrap_or(0.0);
            *l = -v * w;
            wsum += w;
        }
        let out = match self.reduction {
            Reduction::None => tensor_from_f64(ty, target.shape(), loss)?,
            Reduction::Sum => tensor_from_f64(ty, &[], vec![loss.iter().sum()])?,
            Reduction::Mean => tensor_from_f64(ty, &[], vec![loss.iter().sum::<f64>() / wsum])?,
        };
        let mut outs = vec![out];
        if self.softmax && self.outputs > 1 {
            outs.push(tensor_from_f64(ty, xs, xv)?);
        }
        Ok(outs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    fn vals(t: &Tensor) -> Vec<f32> {
        t.as_array::<f32>().unwrap().iter().copied().collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn nll_reductions_weights_ignore() {
        let x = Tensor::F32(array![[0.1f32, 0.2, 0.7], [0.5, 0.3, 0.2]].into_dyn());
        let t = Tensor::I64(array![2i64, 0].into_dyn());
        let w = Tensor::F32(array![1.0f32, 1.0, 3.0].into_dyn());
        let node = |r: &str| {
            NodeDef::new("NegativeLogLikelihoodLoss", 13)
                .with_attr("reduction", AttrValue::String(r.as_bytes().to_vec()))
        };
        let o = run(node("none"), vec![x.clone(), t.clone()]).unwrap();
        close(&vals(&o[0]), &[-0.7, -0.5]);
        let o = run(node("sum"), vec![x.clone(), t.clone()]).unwrap();
        close(&vals(&o[0]), &[-1.2]);
        let o = run(node("mean"), vec![x.clone(), t.clone(), w.clone()]).unwrap();
        close(&vals(&o[0]), &[(-2.1 - 0.5) / 4.0]);
        let o = run(
            node("mean").with_attr("ignore_index", AttrValue::Int(0)),
            vec![x.clone(), t.clone()],
        )
        .unwrap();
        close(&vals(&o[0]), &[-0.7]);
        let bad = Tensor::I64(array![3i64, 0].into_dyn());
        let e = run(node("sum"), vec![x.clone(), bad]).unwrap_err();
        assert_eq!(
            e.0,
            "NegativeLogLikelihoodLoss: target value 3 is out of range for 3 classes"
        );
        let e = run(
            node("sum"),
            vec![x.clone(), Tensor::I64(array![1i64].into_dyn())],
        )
        .unwrap_err();
        assert!(e.0.contains("target must have shape [2]"), "{e}");
        let e = run(
            node("sum"),
            vec![Tensor::F32(array![1.0f32].into_dyn()), t.clone()],
        )
        .unwrap_err();
        assert!(e.0.contains("input must have rank >= 2"), "{e}");
        let e = run(
            node("sum"),
            vec![x, t, Tensor::F32(array![1.0f32].into_dyn())],
        )
        .unwrap_err();
        assert!(e.0.contains("weight must have shape [3]"), "{e}");
    }

    #[test]
    fn sce_with_log_prob() {
        let x = Tensor::F32(array![[1.0f32, 2.0], [3.0, 5.0]].into_dyn());
        let t = Tensor::I32(array![1i32, 0].into_dyn());
        let n = NodeDef::new("SoftmaxCrossEntropyLoss", 13).with_io(2, 2);
        let o = run(n, vec![x, t]).unwrap();
        let lp = vals(&o[1]);
        close(&lp, &[-1.313_261_7, -0.313_261_7, -2.126_928, -0.126_928]);
        close(&vals(&o[0]), &[(0.313_261_7 + 2.126_928) / 2.0]);
    }
}
