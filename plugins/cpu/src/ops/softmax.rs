//! The softmax family: Softmax, LogSoftmax and Hardmax, with the pre-opset-13 "coerce to 2-D"
//! semantics registered as their own opset range.

use ndarray::ArrayViewD;

use crate::ops::util::num::FloatElem;

use crate::dispatch_float;
use crate::error::{OpError, OpResult};
use crate::kernel::AttrValue;
use crate::kernel::add_ms;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, add_range, one};
use crate::ops::composite::Arg;
use crate::ops::composite::Composite;
use crate::ops::util::args::{input, normalize_axis};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    // Opsets 1-12 coerce the input to 2-D at `axis` (default 1); from 13 on the op runs along
    // one axis (default -1).
    add_range(reg, "Softmax", 1, 12, |n| {
        build_softmax(n, SoftKind::Softmax, true)
    });
    add(reg, "Softmax", 13, |n| {
        build_softmax(n, SoftKind::Softmax, false)
    });
    add_range(reg, "LogSoftmax", 1, 12, |n| {
        build_softmax(n, SoftKind::LogSoftmax, true)
    });
    add(reg, "LogSoftmax", 13, |n| {
        build_softmax(n, SoftKind::LogSoftmax, false)
    });
    add_range(reg, "Hardmax", 1, 12, |n| {
        build_softmax(n, SoftKind::Hardmax, true)
    });
    add(reg, "Hardmax", 13, |n| {
        build_softmax(n, SoftKind::Hardmax, false)
    });
    add_ms(reg, "BiasSoftmax", build_bias_softmax);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SoftKind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

/// Splits `shape` into (outer, n, inner) around `axis`; before opset 13 the input is coerced to
/// 2-D at `axis`, so `n` spans every dim from `axis` on.
fn split_axis(shape: &[usize], axis: usize, coerce_2d: bool) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    if coerce_2d {
        (outer, shape[axis..].iter().product(), 1)
    } else {
        (outer, shape[axis], shape[axis + 1..].iter().product())
    }
}

fn softmax_typed<T: FloatElem>(
    kind: SoftKind,
    x: &ArrayViewD<'_, T>,
    (outer, n, inner): (usize, usize, usize),
) -> OpResult<Tensor> {
    use num_traits::Float;
    let xc = x.as_standard_layout();
    let xs = xc
        .as_slice()
        .ok_or_else(|| OpError("softmax: input not contiguous".into()))?;
    let mut out = vec![T::zero(); xs.len()];
    let mut buf: Vec<T::Acc> = vec![T::lit(0.0); n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * n * inner + j * inner + i;
            for (j, b) in buf.iter_mut().enumerate() {
                *b = xs.get(at(j)).map_or(T::lit(0.0), |v| v.to_acc());
            }
            let mut max = T::lit(f64::NEG_INFINITY);
            let mut arg = 0;
            for (j, &v) in buf.iter().enumerate() {
                if v > max {
                    max = v;
                    arg = j;
                }
            }
            match kind {
                SoftKind::Hardmax => {
                    if let Some(slot) = out.get_mut(at(arg)) {
                        *slot = T::one();
                    }
                }
                SoftKind::Softmax | SoftKind::LogSoftmax => {
                    let sum: T::Acc = buf.iter().map(|&v| (v - max).exp()).sum();
                    let log_sum = sum.ln();
                    for (j, &v) in buf.iter().enumerate() {
                        let y = if kind == SoftKind::Softmax {
                            (v - max).exp() / sum
                        } else {
                            v - max - log_sum
                        };
                        if let Some(slot) = out.get_mut(at(j)) {
                            *slot = T::from_acc(y);
                        }
                    }
                }
            }
        }
    }
    Tensor::from_vec(x.shape(), out)
}

fn build_softmax(n: &NodeDef, kind: SoftKind, coerce_2d: bool) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", if coerce_2d { 1 } else { -1 })?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let ax = normalize_axis(&op, axis, x.ndim())?;
        let split = split_axis(x.shape(), ax, coerce_2d);
        if let (TensorRef::F32(a), (_, n, 1), SoftKind::Softmax | SoftKind::LogSoftmax) =
            (x, split, kind)
            && crate::fast::enabled()
        {
            let ac = a.as_standard_layout();
            if let Some(xs) = ac.as_slice() {
                let mut out = crate::scratch::zeros(xs.len())?;
                let log = kind == SoftKind::LogSoftmax;
                // Runs of rows shared across the intra-op pool.
                let n1 = n.max(1);
                let piece = crate::par::chunk_len(xs.len() / n1, (16 << 10) / n1, 1) * n1;
                crate::par::for_each_chunk(&mut out, piece, |i, o| {
                    crate::fast::math::softmax_rows(&xs[i * piece..][..o.len()], n, log, o);
                });
                return one(Tensor::from_vec(a.shape(), out));
            }
        }
        one(dispatch_float!(
            x.clone(),
            |a| softmax_typed(kind, &a, split),
            &op
        ))
    }))
}

/// BiasSoftmax `(data, bias)`: `Softmax(data + bias)` along `axis` (default 1).
fn build_bias_softmax(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let axis = n.attr_int_or("axis", 1)?;
    let mut c = Composite::new(n);
    let sum = c.step("Add", 14, &[], &[Some(Arg::In(0)), Some(Arg::In(1))])?;
    let y = c.step(
        "Softmax",
        13,
        &[("axis", AttrValue::Int(axis))],
        &[Some(sum)],
    )?;
    c.finish(vec![Some(y)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::ops::testing::{close_within, f32s, ms, run_some};
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    fn close(t: &Tensor, want: &[f32]) {
        let a = t.as_array::<f32>().unwrap();
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {want:?}");
        }
        assert_eq!(a.len(), want.len());
    }

    #[test]
    fn softmax_versions() {
        let x = Tensor::F32(array![[1.0, 2.0], [3.0, 5.0]].into_dyn());
        let out = run(NodeDef::new("Softmax", 13), vec![x.clone()]).unwrap();
        close(
            &out[0],
            &[0.268_941_43, 0.731_058_6, 0.119_202_92, 0.880_797],
        );
        let out = run(
            NodeDef::new("Softmax", 13).with_attr("axis", AttrValue::Int(0)),
            vec![x.clone()],
        )
        .unwrap();
        close(
            &out[0],
            &[0.119_202_92, 0.047_425_87, 0.880_797, 0.952_574_1],
        );
        // Opset 11, axis 0: the whole tensor is one row.
        let out = run(
            NodeDef::new("Softmax", 11).with_attr("axis", AttrValue::Int(0)),
            vec![x.clone()],
        )
        .unwrap();
        let s: f32 = out[0].as_array::<f32>().unwrap().sum();
        assert!((s - 1.0).abs() < 1e-6);
        let out = run(NodeDef::new("LogSoftmax", 13), vec![x.clone()]).unwrap();
        close(
            &out[0],
            &[-1.313_261_7, -0.313_261_7, -2.126_928, -0.126_928],
        );
        let out = run(NodeDef::new("Hardmax", 13), vec![x.clone()]).unwrap();
        close(&out[0], &[0.0, 1.0, 0.0, 1.0]);
        let e = run(
            NodeDef::new("Softmax", 13).with_attr("axis", AttrValue::Int(2)),
            vec![x],
        )
        .unwrap_err();
        assert_eq!(e.0, "Softmax: axis 2 is out of range for rank 2");
    }

    #[test]
    fn bias_softmax_adds_then_normalizes() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.0, 1.0]);
        let bias = f32s(&[3], &[0.5, -0.5, 0.0]);
        let y = run_some(
            ms("BiasSoftmax").with_attr("axis", AttrValue::Int(-1)),
            vec![Some(x), Some(bias)],
        );
        let row = |v: [f32; 3]| {
            let e: Vec<f32> = v.iter().map(|x| x.exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        let want: Vec<f32> = [row([1.5, 1.5, 3.0]), row([-0.5, -0.5, 1.0])].concat();
        close_within(&y[0], &want, 1e-6);
    }
}
