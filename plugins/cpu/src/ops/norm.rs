//! Normalization: BatchNormalization (inference mode) and the softmax family (Softmax,
//! LogSoftmax, Hardmax, with the pre-opset-13 "coerce to 2-D" semantics).

use ndarray::ArrayViewD;

use super::util::{FloatElem, input, normalize_axis};
use super::{add, one};
use crate::kernel::{NodeDef, OpError, OpKernel, OpResult, Registry, kernel};
use crate::tensor::{Tensor, TensorRef};
use crate::{bail, dispatch_float};

pub fn register(reg: &mut Registry) {
    add(reg, "BatchNormalization", 1, build_batchnorm);
    add(reg, "Softmax", 1, |n| build_softmax(n, SoftKind::Softmax));
    add(reg, "LogSoftmax", 1, |n| {
        build_softmax(n, SoftKind::LogSoftmax)
    });
    add(reg, "Hardmax", 1, |n| build_softmax(n, SoftKind::Hardmax));
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

fn build_softmax(n: &NodeDef, kind: SoftKind) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let coerce_2d = n.opset < 13;
    let axis = n.attr_int_or("axis", if coerce_2d { 1 } else { -1 })?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let ax = normalize_axis(&op, axis, x.ndim())?;
        let split = split_axis(x.shape(), ax, coerce_2d);
        if let (TensorRef::F32(a), (_, n, 1), SoftKind::Softmax | SoftKind::LogSoftmax) =
            (x, split, kind)
        {
            let ac = a.as_standard_layout();
            if let Some(xs) = ac.as_slice() {
                let mut out = crate::scratch::zeros(xs.len());
                let log = kind == SoftKind::LogSoftmax;
                // Runs of rows shared across the intra-op pool.
                let n1 = n.max(1);
                let piece = crate::par::chunk_len(xs.len() / n1, (16 << 10) / n1, 1) * n1;
                crate::par::for_each_chunk(&mut out, piece, |i, o| {
                    super::fastmath::softmax_rows(&xs[i * piece..][..o.len()], n, log, o);
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

struct BatchNorm {
    op: String,
    epsilon: f64,
}

impl BatchNorm {
    fn run_typed<T: FloatElem>(
        &self,
        x: &ArrayViewD<'_, T>,
        params: [&TensorRef<'_>; 4],
    ) -> OpResult<Tensor> {
        let op = &self.op;
        let shape = x.shape();
        if shape.len() < 2 {
            bail!("{op}: X must have rank >= 2 (N, C, ...), got shape {shape:?}");
        }
        let c = shape[1];
        let inner: usize = shape[2..].iter().product();
        let names = ["scale", "B", "mean", "var"];
        // Parameters are per channel ([C]) or, for spatial=0, per (C, D1, ...) position.
        let per_channel = params[0].shape() == [c];
        let want: Vec<usize> = if per_channel {
            vec![c]
        } else {
            shape[1..].to_vec()
        };
        let mut vals = Vec::with_capacity(4);
        for (p, name) in params.iter().zip(names) {
            if p.shape() != want.as_slice() {
                bail!("{op}: {name} must have shape {want:?}, got {:?}", p.shape());
            }
            if !matches!(
                p.elem_type(),
                epx_plugin_api::ElementType::Float
                    | epx_plugin_api::ElementType::Double
                    | epx_plugin_api::ElementType::Float16
                    | epx_plugin_api::ElementType::Bfloat16
            ) {
                bail!("{op}: {name} must be a float tensor, got {}", p.elem_type());
            }
            vals.push(p.to_f64_vec());
        }
        let (scale, bias, mean, var) = (&vals[0], &vals[1], &vals[2], &vals[3]);
        let a: Vec<f64> = scale
            .iter()
            .zip(var)
            .map(|(s, v)| s / (v + self.epsilon).sqrt())
            .collect();
        let b: Vec<f64> = bias
            .iter()
            .zip(mean)
            .zip(&a)
            .map(|((b, m), a)| b - m * a)
            .collect();
        let a: Vec<T::Acc> = a.into_iter().map(T::lit).collect();
        let b: Vec<T::Acc> = b.into_iter().map(T::lit).collect();
        let xc = x.as_standard_layout();
        let xs = xc
            .as_slice()
            .ok_or_else(|| OpError(format!("{op}: X not contiguous")))?;
        if per_channel && inner > 0 && c > 0 {
            // Per channel: runs of planes shared across the intra-op pool.
            let mut y = T::zeroed(xs.len());
            let planes = crate::par::chunk_len(xs.len() / inner, 1, 1);
            crate::par::for_each_chunk(&mut y, planes * inner, |i, part| {
                let src = &xs[i * planes * inner..][..part.len()];
                for (r, (o, x)) in part.chunks_mut(inner).zip(src.chunks(inner)).enumerate() {
                    let ch = (i * planes + r) % c;
                    let (a, b) = (a[ch], b[ch]);
                    o.iter_mut()
                        .zip(x)
                        .for_each(|(o, x)| *o = T::from_acc(x.to_acc() * a + b));
                }
            });
            return Tensor::from_vec(shape, y);
        }
        // Runs of `inner` elements share one channel (per channel), or the parameters repeat
        // every `c * inner` elements (spatial=0): contiguous loops either way.
        let mut y: Vec<T> = Vec::with_capacity(xs.len());
        let per = c * inner;
        if per > 0 && !per_channel {
            for chunk in xs.chunks(per) {
                y.extend(
                    chunk
                        .iter()
                        .zip(a.iter().zip(&b))
                        .map(|(v, (&a, &b))| T::from_acc(v.to_acc() * a + b)),
                );
            }
        }
        Tensor::from_vec(shape, y)
    }
}

/// BatchNormalization with `training_mode=1` (opset 14+): normalized by the batch's own mean
/// and (biased) variance per channel; the running statistics move towards them by `momentum`.
fn build_batchnorm_training(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let eps = f64::from(n.attr_float_or("epsilon", 1e-5)?);
    let momentum = f64::from(n.attr_float_or("momentum", 0.9)?);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let shape = x.shape().to_vec();
        if shape.len() < 2 {
            crate::bail!("{op}: X must have a channel axis, got shape {shape:?}");
        }
        let (n, c) = (shape[0], shape[1]);
        let inner: usize = shape[2..].iter().product();
        let xv = super::util::float_values(&op, "X", x)?;
        let param = |i: usize, what: &str| -> OpResult<Vec<f64>> {
            let t = input(&op, inputs, i)?;
            let v = super::util::float_values(&op, what, t)?;
            if v.len() != c {
                crate::bail!("{op}: {what} has {} values for {c} channels", v.len());
            }
            Ok(v)
        };
        let (scale, bias) = (param(1, "scale")?, param(2, "B")?);
        let (run_mean, run_var) = (param(3, "input_mean")?, param(4, "input_var")?);
        let count = (n * inner).max(1) as f64;
        let mut mean = vec![0f64; c];
        let mut var = vec![0f64; c];
        for (i, v) in xv.iter().enumerate() {
            mean[(i / inner.max(1)) % c] += v;
        }
        mean.iter_mut().for_each(|m| *m /= count);
        for (i, v) in xv.iter().enumerate() {
            let ch = (i / inner.max(1)) % c;
            var[ch] += (v - mean[ch]) * (v - mean[ch]);
        }
        var.iter_mut().for_each(|v| *v /= count);
        let y: Vec<f64> = xv
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let ch = (i / inner.max(1)) % c;
                (v - mean[ch]) / (var[ch] + eps).sqrt() * scale[ch] + bias[ch]
            })
            .collect();
        let moved = |run: &[f64], now: &[f64]| -> Vec<f64> {
            run.iter()
                .zip(now)
                .map(|(r, m)| r * momentum + m * (1.0 - momentum))
                .collect()
        };
        let stat_ty = input(&op, inputs, 3)?.elem_type();
        Ok(vec![
            super::util::tensor_from_f64(x.elem_type(), &shape, y)?,
            super::util::tensor_from_f64(stat_ty, &[c], moved(&run_mean, &mean))?,
            super::util::tensor_from_f64(stat_ty, &[c], moved(&run_var, &var))?,
        ])
    }))
}

fn build_batchnorm(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    if n.attr_int_or("training_mode", 0)? != 0 {
        return build_batchnorm_training(n);
    }
    if n.opset < 7 && n.attr_int_or("is_test", 0)? == 0 && n.num_outputs > 1 {
        return Err(n.error("training mode (is_test=0) is not supported (inference only)"));
    }
    let bn = BatchNorm {
        op: n.op_type.clone(),
        epsilon: n.attr_float_or("epsilon", 1e-5)?.into(),
    };
    let outputs = n.num_outputs;
    Ok(kernel(move |inputs| {
        let op = &bn.op;
        let x = input(op, inputs, 0)?;
        let p = [
            input(op, inputs, 1)?,
            input(op, inputs, 2)?,
            input(op, inputs, 3)?,
            input(op, inputs, 4)?,
        ];
        let y = dispatch_float!(x.clone(), |a| bn.run_typed(&a, p), op)?;
        let mut out = vec![y];
        // Inference: running statistics pass through unchanged.
        if outputs > 1 {
            out.push(p[2].to_owned());
        }
        if outputs > 2 {
            out.push(p[3].to_owned());
        }
        Ok(out)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::{ArrayD, IxDyn, array};

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = Registry::with_all_ops().build(&n)?;
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
    fn batchnorm_inference() {
        let x = Tensor::F32(array![[[1.0, 2.0]], [[3.0, 4.0]]].into_dyn())
            .view()
            .to_owned();
        let x = match x {
            Tensor::F32(a) => Tensor::F32(a.into_shape_with_order(IxDyn(&[1, 2, 2])).unwrap()),
            t => t,
        };
        let scale = Tensor::F32(array![1.0, 2.0].into_dyn());
        let b = Tensor::F32(array![0.0, 1.0].into_dyn());
        let mean = Tensor::F32(array![1.0, 3.0].into_dyn());
        let var = Tensor::F32(array![4.0, 1.0].into_dyn());
        let n = NodeDef::new("BatchNormalization", 15).with_attr("epsilon", AttrValue::Float(0.0));
        let out = run(
            n.clone(),
            vec![
                x.clone(),
                scale.clone(),
                b.clone(),
                mean.clone(),
                var.clone(),
            ],
        )
        .unwrap();
        close(&out[0], &[0.0, 0.5, 1.0, 3.0]);
        let e = run(
            n.clone(),
            vec![
                x.clone(),
                scale,
                b.clone(),
                mean.clone(),
                Tensor::F32(ArrayD::zeros(IxDyn(&[3]))),
            ],
        )
        .unwrap_err();
        assert!(
            e.0.contains("BatchNormalization: var must have shape [2], got [3]"),
            "{e}"
        );
        // Training mode normalizes by the batch's statistics and moves the running ones.
        let t = n
            .with_attr("training_mode", AttrValue::Int(1))
            .with_attr("momentum", AttrValue::Float(0.5))
            .with_io(5, 3);
        let x = Tensor::F32(array![[1.0f32, 3.0], [3.0, 5.0]].into_dyn());
        let ones = Tensor::F32(array![1.0f32, 1.0].into_dyn());
        let zeros = Tensor::F32(array![0.0f32, 0.0].into_dyn());
        let out = run(t, vec![x, ones.clone(), zeros.clone(), zeros, ones]).unwrap();
        // Per channel: means 2 and 4, variances 1.
        let y: Vec<f32> = out[0].as_array::<f32>().unwrap().iter().copied().collect();
        for (got, want) in y.iter().zip([-1.0f32, -1.0, 1.0, 1.0]) {
            assert!((got - want).abs() < 1e-4, "{y:?}");
        }
        assert_eq!(out[1], Tensor::F32(array![1.0f32, 2.0].into_dyn()));
        assert_eq!(out[2], Tensor::F32(array![1.0f32, 1.0].into_dyn()));
    }
}
