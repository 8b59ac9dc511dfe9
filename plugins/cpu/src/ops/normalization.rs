//! Normalizations over statistics of the input: BatchNormalization (inference and training mode),
//! LayerNormalization (with the Mean and InvStdDev outputs), RMSNormalization,
//! InstanceNormalization, GroupNormalization, LpNormalization, LRN and MeanVarianceNormalization.
//!
//! Statistics and results are computed in f64 (at least as precise as any `stash_type`) and cast
//! back to the input's float type.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::ops::util::num::{FloatElem, float_values, tensor_from_f64};

use crate::ops::util::broadcast::broadcast_to;

use crate::error::{OpError, OpResult};
use crate::kernel::AttrValue;
use crate::kernel::add_ms;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::composite::Arg;
use crate::ops::composite::Composite;
use crate::ops::util::args::{input, normalize_axes, normalize_axis, opt_input};
use crate::tensor::{Tensor, TensorRef};
use crate::{bail, dispatch_float};

pub fn register(reg: &mut Registry) {
    add(reg, "BatchNormalization", 1, build_batchnorm);
    add(reg, "LayerNormalization", 17, |n| build_layer(n, false));
    add(reg, "RMSNormalization", 23, |n| build_layer(n, true));
    add(reg, "InstanceNormalization", 1, build_instance);
    add(reg, "GroupNormalization", 18, build_group);
    add(reg, "LpNormalization", 1, build_lp);
    add(reg, "LRN", 1, build_lrn);
    add(reg, "MeanVarianceNormalization", 9, build_mvn);
    add_ms(reg, "SkipLayerNormalization", |n| build_skip_norm(n, false));
    add_ms(reg, "SkipSimplifiedLayerNormalization", |n| {
        build_skip_norm(n, true)
    });
    // ONNX Runtime registers these two in the default domain at opset 1, before ONNX had them;
    // from opset 17 (LayerNormalization) ONNX's own schema takes over.
    crate::kernel::add_range(reg, "LayerNormalization", 1, 16, |n| build_norm(n, false));
    crate::kernel::add(reg, "SimplifiedLayerNormalization", 1, |n| {
        build_norm(n, true)
    });
}

/// The values of `t` broadcast (numpy rules, one-directional) to `shape`, in C order.
fn broadcast_values(
    op: &str,
    what: &str,
    t: &TensorRef<'_>,
    shape: &[usize],
) -> OpResult<Vec<f64>> {
    let v = float_values(op, what, t)?;
    let a =
        ArrayD::from_shape_vec(IxDyn(t.shape()), v).map_err(|e| OpError(format!("{op}: {e}")))?;
    let view = a.view();
    let b = broadcast_to(op, &view, shape).map_err(|_| {
        OpError(format!(
            "{op}: {what} of shape {:?} cannot be broadcast to {shape:?}",
            t.shape()
        ))
    })?;
    Ok(b.iter().copied().collect())
}

fn build_layer(n: &NodeDef, rms: bool) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", -1)?;
    let eps = f64::from(n.attr_float_or("epsilon", 1e-5)?);
    let stash = n.attr_int_or("stash_type", 1)?;
    if !matches!(stash, 1 | 10 | 11 | 16) {
        return Err(n.error(format_args!("unsupported stash_type {stash}")));
    }
    let outputs = n.num_outputs;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let ty = x.elem_type();
        let xs = x.shape().to_vec();
        let ax = normalize_axis(&op, axis, xs.len())?;
        let rows: usize = xs[..ax].iter().product();
        let cols: usize = xs[ax..].iter().product();
        if let Some(outs) = layer_norm_f32(inputs, &xs, ax, eps, rms, outputs, stash) {
            return outs;
        }
        let xv = float_values(&op, "X", x)?;
        let scale = broadcast_values(&op, "scale", input(&op, inputs, 1)?, &xs)?;
        let bias = match opt_input(inputs, 2) {
            Some(b) if !rms => Some(broadcast_values(&op, "B", b, &xs)?),
            _ => None,
        };
        let mut y = vec![0.0f64; xv.len()];
        let mut means = vec![0.0f64; rows];
        let mut invs = vec![0.0f64; rows];
        for r in 0..rows {
            let lo = r * cols;
            let row = xv.get(lo..lo + cols).unwrap_or(&[]);
            let cnt = cols.max(1) as f64;
            let mean = if rms {
                0.0
            } else {
                row.iter().sum::<f64>() / cnt
            };
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cnt;
            let inv = 1.0 / (var + eps).sqrt();
            means[r] = mean;
            invs[r] = inv;
            for (j, v) in row.iter().enumerate() {
                let i = lo + j;
                let mut o = (v - mean) * inv * scale.get(i).copied().unwrap_or(0.0);
                if let Some(b) = &bias {
                    o += b.get(i).copied().unwrap_or(0.0);
                }
                if let Some(slot) = y.get_mut(i) {
                    *slot = o;
                }
            }
        }
        let mut outs = vec![tensor_from_f64(ty, &xs, y)?];
        if !rms && outputs > 1 {
            let mut st = xs[..ax].to_vec();
            st.resize(xs.len(), 1);
            // Mean and InvStdDev have the stash type (float unless stash_type says otherwise).
            let sty = if stash == 1 {
                epx_plugin_api::ElementType::Float
            } else {
                ty
            };
            outs.push(tensor_from_f64(sty, &st, means)?);
            outs.push(tensor_from_f64(sty, &st, invs)?);
        }
        Ok(outs)
    }))
}

/// The f32 fast path of LayerNormalization / RMSNormalization: X, scale and bias f32 and
/// contiguous, scale and bias one value per normalized element. `None` when it does not apply.
fn layer_norm_f32(
    inputs: &[Option<TensorRef<'_>>],
    xs: &[usize],
    ax: usize,
    eps: f64,
    rms: bool,
    outputs: usize,
    stash: i64,
) -> Option<OpResult<Vec<Tensor>>> {
    if !crate::fast::enabled() {
        return None;
    }
    let strip = |s: &[usize]| -> Vec<usize> { s.iter().copied().skip_while(|&d| d == 1).collect() };
    let norm_shape = strip(&xs[ax..]);
    fn per_element<'a>(
        t: &Option<TensorRef<'a>>,
        norm_shape: &[usize],
    ) -> Option<Option<ndarray::ArrayViewD<'a, f32>>> {
        let strip =
            |s: &[usize]| -> Vec<usize> { s.iter().copied().skip_while(|&d| d == 1).collect() };
        match t {
            None => Some(None),
            Some(TensorRef::F32(v)) if strip(v.shape()) == norm_shape => Some(Some(v.clone())),
            Some(_) => None,
        }
    }
    let Some(TensorRef::F32(x)) = inputs.first()? else {
        return None;
    };
    let scale = per_element(inputs.get(1)?, &norm_shape)??;
    let bias = if rms {
        None
    } else {
        per_element(inputs.get(2).unwrap_or(&None), &norm_shape)?
    };
    if outputs > 1 && (rms || stash != 1) {
        return None;
    }
    let (xc, sc) = (x.as_standard_layout(), scale.as_standard_layout());
    let bc = bias.as_ref().map(|b| b.as_standard_layout());
    let (xf, sf) = (xc.as_slice()?, sc.as_slice()?);
    let bf = match &bc {
        Some(b) => Some(b.as_slice()?),
        None => None,
    };
    // Memory that is not there: the general path reports it.
    let mut y = crate::scratch::zeros(xf.len()).ok()?;
    // Runs of rows shared across the intra-op pool; each run's statistics kept in order.
    let cols = sf.len().max(1);
    let piece = crate::par::chunk_len(xf.len() / cols, (16 << 10) / cols, 1) * cols;
    let stats = std::sync::Mutex::new(Vec::new());
    crate::par::for_each_chunk(&mut y, piece, |i, part| {
        let x_part = &xf[i * piece..][..part.len()];
        let st = crate::fast::math::layer_norm_rows(x_part, sf, bf, eps, rms, part);
        if let Ok(mut all) = stats.lock() {
            all.push((i, st));
        }
    });
    let mut stats = stats.into_inner().ok()?;
    stats.sort_by_key(|(i, _)| *i);
    let (mut means, mut invs) = (Vec::new(), Vec::new());
    for (_, (m, v)) in stats {
        means.extend(m);
        invs.extend(v);
    }
    let run = || -> OpResult<Vec<Tensor>> {
        let mut outs = vec![Tensor::from_vec(xs, y)?];
        if outputs > 1 {
            let mut st = xs[..ax].to_vec();
            st.resize(xs.len(), 1);
            outs.push(Tensor::from_vec(&st, means)?);
            outs.push(Tensor::from_vec(&st, invs)?);
        }
        Ok(outs)
    };
    Some(run())
}

/// Normalizes each of `groups` contiguous chunks of `xv` to zero mean and unit variance.
fn normalize_chunks(xv: &[f64], groups: usize, eps: f64) -> Vec<f64> {
    let len = xv.len().checked_div(groups).unwrap_or(0);
    let mut y = vec![0.0; xv.len()];
    for (chunk, out) in xv.chunks(len.max(1)).zip(y.chunks_mut(len.max(1))) {
        let cnt = chunk.len().max(1) as f64;
        let mean = chunk.iter().sum::<f64>() / cnt;
        let var = chunk.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cnt;
        let inv = 1.0 / (var + eps).sqrt();
        for (o, v) in out.iter_mut().zip(chunk) {
            *o = (v - mean) * inv;
        }
    }
    y
}

/// Per-channel parameter of length `want`.
fn channel_param(op: &str, what: &str, t: &TensorRef<'_>, want: usize) -> OpResult<Vec<f64>> {
    if t.shape() != [want] {
        bail!("{op}: {what} must have shape [{want}], got {:?}", t.shape());
    }
    float_values(op, what, t)
}

fn build_instance(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let eps = f64::from(n.attr_float_or("epsilon", 1e-5)?);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape();
        if xs.len() < 3 {
            bail!("{op}: input must have rank >= 3 (N, C, D1, ...), got shape {xs:?}");
        }
        let c = xs[1];
        let scale = channel_param(&op, "scale", input(&op, inputs, 1)?, c)?;
        let bias = channel_param(&op, "B", input(&op, inputs, 2)?, c)?;
        let planes = xs[0] * c;
        let inner: usize = xs[2..].iter().product();
        if crate::fast::enabled()
            && let Ok(xf) = x.as_f32()
            && let Some(xf) = xf.as_slice()
        {
            let y = instance_norm_f32(xf, (c, inner), (&scale, &bias), eps)?;
            return one(Tensor::from_vec(xs, y));
        }
        let xv = float_values(&op, "input", x)?;
        let mut y = normalize_chunks(&xv, planes, eps);
        for (i, v) in y.iter_mut().enumerate() {
            let ch = (i / inner.max(1)) % c.max(1);
            *v = *v * scale.get(ch).copied().unwrap_or(0.0) + bias.get(ch).copied().unwrap_or(0.0);
        }
        one(tensor_from_f64(x.elem_type(), xs, y))
    }))
}

/// InstanceNormalization of float32 `x` (planes of `inner` values, `c` channels) on the fast
/// levels: each plane's mean and variance summed in f64 (two passes), then
/// `(x - mean) · (scale[c] / sqrt(var + eps)) + bias[c]` in f32; planes across the intra-op
/// pool.
fn instance_norm_f32(
    x: &[f32],
    (c, inner): (usize, usize),
    (scale, bias): (&[f64], &[f64]),
    eps: f64,
) -> OpResult<Vec<f32>> {
    let inner = inner.max(1);
    let planes = x.len() / inner;
    let per = crate::par::chunk_len(planes, (8192 / inner).max(1), 1);
    let buf = crate::scratch::take(x.len())?;
    Ok(crate::par::build_vec(
        buf,
        x.len(),
        per * inner,
        |at, out| {
            let first = at / inner;
            for p in first..(first + per).min(planes) {
                let v = &x[p * inner..(p + 1) * inner];
                let mean = v.iter().map(|&a| f64::from(a)).sum::<f64>() / inner as f64;
                let var = v
                    .iter()
                    .map(|&a| {
                        let d = f64::from(a) - mean;
                        d * d
                    })
                    .sum::<f64>()
                    / inner as f64;
                let ch = p % c.max(1);
                let k = scale.get(ch).copied().unwrap_or(0.0) / (var + eps).sqrt();
                let (k, b, m) = (
                    k as f32,
                    bias.get(ch).copied().unwrap_or(0.0) as f32,
                    mean as f32,
                );
                out.extend_map(v, |a| (a - m) * k + b);
            }
        },
    ))
}

fn build_group(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let eps = f64::from(n.attr_float_or("epsilon", 1e-5)?);
    let g = n.req_int("num_groups")?;
    let opset = n.opset;
    let g = usize::try_from(g)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| n.error(format_args!("num_groups must be positive, got {g}")))?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape();
        if xs.len() < 2 {
            bail!("{op}: input must have rank >= 2 (N, C, ...), got shape {xs:?}");
        }
        let c = xs[1];
        if c % g != 0 {
            bail!("{op}: {c} channels are not divisible by num_groups {g}");
        }
        let (s, b) = (input(&op, inputs, 1)?, input(&op, inputs, 2)?);
        // Opset 18 took one scale/bias per group; opset 21 takes one per channel.
        let per_group = opset < 21 && s.shape() == [g];
        let want = if per_group { g } else { c };
        let scale = channel_param(&op, "scale", s, want)?;
        let bias = channel_param(&op, "bias", b, want)?;
        let xv = float_values(&op, "X", x)?;
        let inner: usize = xs[2..].iter().product();
        let mut y = normalize_chunks(&xv, xs[0] * g, eps);
        for (i, v) in y.iter_mut().enumerate() {
            let ch = (i / inner.max(1)) % c.max(1);
            let k = if per_group { ch / (c / g).max(1) } else { ch };
            *v = *v * scale.get(k).copied().unwrap_or(0.0) + bias.get(k).copied().unwrap_or(0.0);
        }
        one(tensor_from_f64(x.elem_type(), xs, y))
    }))
}

/// Splits `shape` into (outer, n, inner) around `axis`.
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn build_lp(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", -1)?;
    let p = n.attr_int_or("p", 2)?;
    if p != 1 && p != 2 {
        return Err(n.error(format_args!("p must be 1 or 2, got {p}")));
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape();
        let ax = normalize_axis(&op, axis, xs.len())?;
        let (outer, len, inner) = split(xs, ax);
        let xv = float_values(&op, "input", x)?;
        let mut y = vec![0.0; xv.len()];
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| (o * len + j) * inner + i;
                let vals = (0..len).map(|j| xv.get(at(j)).copied().unwrap_or(0.0));
                let norm = if p == 1 {
                    vals.map(f64::abs).sum::<f64>()
                } else {
                    vals.map(|v| v * v).sum::<f64>().sqrt()
                };
                for j in 0..len {
                    if let (Some(s), Some(v)) = (y.get_mut(at(j)), xv.get(at(j))) {
                        *s = if norm == 0.0 { 0.0 } else { v / norm };
                    }
                }
            }
        }
        one(tensor_from_f64(x.elem_type(), xs, y))
    }))
}

fn build_lrn(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let alpha = f64::from(n.attr_float_or("alpha", 1e-4)?);
    let beta = f64::from(n.attr_float_or("beta", 0.75)?);
    let bias = f64::from(n.attr_float_or("bias", 1.0)?);
    let size = n.req_int("size")?;
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| n.error(format_args!("size must be positive, got {size}")))?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape();
        if xs.len() < 3 {
            bail!("{op}: input must have rank >= 3 (N, C, D1, ...), got shape {xs:?}");
        }
        let (outer, c, inner) = split(xs, 1);
        let xv = float_values(&op, "X", x)?;
        let (before, after) = ((size - 1) / 2, (size - 1).div_ceil(2));
        let mut y = vec![0.0; xv.len()];
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| (o * c + j) * inner + i;
                for ch in 0..c {
                    let lo = ch.saturating_sub(before);
                    let hi = (ch + after).min(c.saturating_sub(1));
                    let sq: f64 = (lo..=hi)
                        .map(|j| xv.get(at(j)).map_or(0.0, |v| v * v))
                        .sum();
                    if let (Some(s), Some(v)) = (y.get_mut(at(ch)), xv.get(at(ch))) {
                        *s = v / (bias + alpha / size as f64 * sq).powf(beta);
                    }
                }
            }
        }
        one(tensor_from_f64(x.elem_type(), xs, y))
    }))
}

fn build_mvn(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axes = n.attr_ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape();
        let axes = normalize_axes(&op, &axes, xs.len())?;
        let xv = float_values(&op, "X", x)?;
        // Group elements by their index over the kept axes.
        let kept: Vec<usize> = (0..xs.len()).filter(|d| !axes.contains(d)).collect();
        let strides = crate::ops::util::indexing::c_strides(xs);
        let key = |flat: usize| -> usize {
            kept.iter().fold(0usize, |acc, &d| {
                acc * xs[d] + (flat / strides[d].max(1)) % xs[d].max(1)
            })
        };
        let groups: usize = kept.iter().map(|&d| xs[d]).product();
        let mut sum = vec![0.0f64; groups];
        let mut sq = vec![0.0f64; groups];
        let mut cnt = vec![0usize; groups];
        for (i, v) in xv.iter().enumerate() {
            let k = key(i);
            if let (Some(s), Some(q), Some(c)) = (sum.get_mut(k), sq.get_mut(k), cnt.get_mut(k)) {
                *s += v;
                *q += v * v;
                *c += 1;
            }
        }
        let y: Vec<f64> = xv
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let k = key(i);
                let c = cnt.get(k).copied().unwrap_or(1).max(1) as f64;
                let mean = sum.get(k).copied().unwrap_or(0.0) / c;
                let var = (sq.get(k).copied().unwrap_or(0.0) / c - mean * mean).max(0.0);
                (v - mean) / (var.sqrt() + 1e-9)
            })
            .collect();
        one(tensor_from_f64(x.elem_type(), xs, y))
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
            let mut y = T::zeroed(xs.len())?;
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
        let xv = crate::ops::util::num::float_values(&op, "X", x)?;
        let param = |i: usize, what: &str| -> OpResult<Vec<f64>> {
            let t = input(&op, inputs, i)?;
            let v = crate::ops::util::num::float_values(&op, what, t)?;
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
            crate::ops::util::num::tensor_from_f64(x.elem_type(), &shape, y)?,
            crate::ops::util::num::tensor_from_f64(stat_ty, &[c], moved(&run_mean, &mean))?,
            crate::ops::util::num::tensor_from_f64(stat_ty, &[c], moved(&run_var, &var))?,
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
            out.push(p[2].try_to_owned()?);
        }
        if outputs > 2 {
            out.push(p[3].try_to_owned()?);
        }
        Ok(out)
    }))
}

/// ONNX Runtime's opset-1 LayerNormalization / SimplifiedLayerNormalization in the default
/// domain: the ONNX LayerNormalization / RMSNormalization of later opsets.
fn build_norm(n: &NodeDef, rms: bool) -> OpResult<Box<dyn OpKernel>> {
    let (op, opset) = if rms {
        ("RMSNormalization", 23)
    } else {
        ("LayerNormalization", 17)
    };
    let attrs = n
        .attributes
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let outputs = if rms { 1 } else { n.num_outputs };
    crate::kernel::build_part(n, op, opset, attrs, n.num_inputs, outputs)
}

/// SkipLayerNormalization (input, skip, gamma, beta?, bias?) → (output, mean?, inv_std_var?,
/// input_skip_bias_sum?): a LayerNormalization (or, simplified, RMSNormalization) over the last
/// axis of `input + skip + bias`.
fn build_skip_norm(n: &NodeDef, rms: bool) -> OpResult<Box<dyn OpKernel>> {
    let eps = n.attr_float_or("epsilon", 1e-12)?;
    let mut c = Composite::new(n);
    let sum = c.step("Add", 14, &[], &[Some(Arg::In(0)), Some(Arg::In(1))])?;
    let bias_input = if rms { 3 } else { 4 };
    let sum = if n.num_inputs > bias_input {
        c.step_if_present(
            bias_input,
            "Add",
            14,
            &[Some(sum), Some(Arg::In(bias_input))],
        )?
    } else {
        sum
    };
    let attrs = [
        ("axis", AttrValue::Int(-1)),
        ("epsilon", AttrValue::Float(eps)),
    ];
    let outputs = if rms {
        // RMSNormalization gives no statistics: output 1 (mean) does not exist for the
        // simplified op, output 2 (inv_std_var) is refused below.
        let y = Arg::Out(
            c.step_n(
                "RMSNormalization",
                23,
                &attrs,
                &[Some(sum), Some(Arg::In(2))],
                1,
                None,
            )?,
            0,
        );
        if n.num_outputs > 1 && n.num_outputs < 4 {
            return Err(n.error(
                "the mean and inv_std_var outputs of SkipSimplifiedLayerNormalization are not \
                 computed; only output 0 and input_skip_bias_sum (output 3)",
            ));
        }
        let mut outs = vec![Some(y)];
        if n.num_outputs == 4 {
            outs.extend([None, None, Some(sum)]);
        }
        outs
    } else {
        let mut args = vec![Some(sum), Some(Arg::In(2))];
        if n.num_inputs > 3 {
            args.push(Some(Arg::In(3)));
        }
        let stats = n.num_outputs.clamp(1, 3);
        let s = c.step_n("LayerNormalization", 17, &attrs, &args, stats, None)?;
        let mut outs: Vec<Option<Arg>> = (0..stats).map(|o| Some(Arg::Out(s, o))).collect();
        if n.num_outputs == 4 {
            outs.push(Some(sum));
        }
        outs
    };
    c.finish(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::ops::testing::{close_within, f32s, ms, run_some};
    use crate::tensor::Tensor;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    fn close(t: &Tensor, want: &[f32]) {
        let a = t.as_array::<f32>().unwrap();
        assert_eq!(a.len(), want.len(), "{a:?} vs {want:?}");
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-4, "{a:?} vs {want:?}");
        }
    }

    fn f(v: ArrayD<f32>) -> Tensor {
        Tensor::F32(v)
    }

    #[test]
    fn layer_norm_outputs() {
        let x = f(array![[1.0f32, 3.0], [2.0, 6.0]].into_dyn());
        let w = f(array![1.0f32, 2.0].into_dyn());
        let b = f(array![0.0f32, 1.0].into_dyn());
        let n = NodeDef::new("LayerNormalization", 17)
            .with_attr("epsilon", AttrValue::Float(0.0))
            .with_io(3, 3);
        let o = run(n.clone(), vec![x.clone(), w.clone(), b]).unwrap();
        close(&o[0], &[-1.0, 3.0, -1.0, 3.0]);
        close(&o[1], &[2.0, 4.0]);
        assert_eq!(o[1].shape(), &[2, 1]);
        close(&o[2], &[1.0, 0.5]);
        let bad = f(array![1.0f32, 2.0, 3.0].into_dyn());
        let e = run(n.clone(), vec![x.clone(), bad]).unwrap_err();
        assert!(
            e.0.contains("scale of shape [3] cannot be broadcast to [2, 2]"),
            "{e}"
        );
        let e = run(
            n.with_attr("axis", AttrValue::Int(2)),
            vec![x.clone(), w.clone()],
        )
        .unwrap_err();
        assert_eq!(e.0, "LayerNormalization: axis 2 is out of range for rank 2");
        let r = NodeDef::new("RMSNormalization", 23).with_attr("epsilon", AttrValue::Float(0.0));
        let o = run(r, vec![f(array![[3.0f32, 4.0]].into_dyn()), w]).unwrap();
        let rms = (12.5f32).sqrt();
        close(&o[0], &[3.0 / rms, 8.0 / rms]);
    }

    /// The fast levels' InstanceNormalization (f64 statistics, f32 output) gives the
    /// reference's values within float32 rounding, on two batches of three channels.
    #[test]
    fn instance_norm_levels_agree() {
        let shape = [2usize, 3, 5, 7];
        let v: Vec<f32> = (0..210)
            .map(|i| ((i * 29) % 17) as f32 * 0.37 - 2.0)
            .collect();
        let x = f(ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap());
        let s = f(array![1.0f32, -2.0, 0.5].into_dyn());
        let b = f(array![0.25f32, 1.0, -3.0].into_dyn());
        let n = NodeDef::new("InstanceNormalization", 6);
        let reference = crate::fast::ISAS
            .iter()
            .find(|i| !i.fast)
            .expect("a reference level");
        let want = crate::fast::with_isa(reference, || {
            run(n.clone(), vec![x.clone(), s.clone(), b.clone()])
        })
        .expect("reference")
        .unwrap();
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            let Some(got) = crate::fast::with_isa(isa, || {
                run(n.clone(), vec![x.clone(), s.clone(), b.clone()])
            }) else {
                continue;
            };
            let vals = |t: &Tensor| {
                t.as_array::<f32>()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect::<Vec<_>>()
            };
            close_within(&vals(&got.unwrap()[0]), &vals(&want[0]), 1e-5);
        }
    }

    #[test]
    fn instance_group_norm() {
        let x = f(ArrayD::from_shape_vec(IxDyn(&[1, 2, 2]), vec![1.0f32, 3.0, 5.0, 9.0]).unwrap());
        let s = f(array![1.0f32, 2.0].into_dyn());
        let b = f(array![0.0f32, 1.0].into_dyn());
        let n =
            NodeDef::new("InstanceNormalization", 6).with_attr("epsilon", AttrValue::Float(0.0));
        let o = run(n.clone(), vec![x.clone(), s.clone(), b.clone()]).unwrap();
        close(&o[0], &[-1.0, 1.0, -1.0, 3.0]);
        let e = run(n, vec![x.clone(), f(array![1.0f32].into_dyn()), b.clone()]).unwrap_err();
        assert_eq!(
            e.0,
            "InstanceNormalization: scale must have shape [2], got [1]"
        );
        let g = NodeDef::new("GroupNormalization", 21)
            .with_attr("epsilon", AttrValue::Float(0.0))
            .with_attr("num_groups", AttrValue::Int(1));
        let o = run(g.clone(), vec![x.clone(), s.clone(), b.clone()]).unwrap();
        let inv = 1.0 / 8.75f32.sqrt();
        close(
            &o[0],
            &[
                -3.5 * inv,
                -1.5 * inv,
                0.5 * inv * 2.0 + 1.0,
                4.5 * inv * 2.0 + 1.0,
            ],
        );
        let g3 = g.with_attr("num_groups", AttrValue::Int(3));
        let e = run(g3, vec![x, s, b]).unwrap_err();
        assert!(e.0.contains("not divisible by num_groups 3"), "{e}");
    }

    #[test]
    fn lp_lrn_mvn() {
        let x = f(array![[3.0f32, 4.0], [0.0, 0.0]].into_dyn());
        let o = run(NodeDef::new("LpNormalization", 1), vec![x.clone()]).unwrap();
        close(&o[0], &[0.6, 0.8, 0.0, 0.0]);
        let o = run(
            NodeDef::new("LpNormalization", 1).with_attr("p", AttrValue::Int(1)),
            vec![x.clone()],
        )
        .unwrap();
        close(&o[0], &[3.0 / 7.0, 4.0 / 7.0, 0.0, 0.0]);
        assert!(
            crate::ops::registry()
                .build(&NodeDef::new("LpNormalization", 1).with_attr("p", AttrValue::Int(3)))
                .is_err()
        );
        let x3 = f(ArrayD::from_shape_vec(IxDyn(&[1, 2, 1]), vec![1.0f32, 2.0]).unwrap());
        let lrn = NodeDef::new("LRN", 13)
            .with_attr("size", AttrValue::Int(2))
            .with_attr("alpha", AttrValue::Float(2.0))
            .with_attr("beta", AttrValue::Float(1.0));
        let o = run(lrn.clone(), vec![x3]).unwrap();
        close(&o[0], &[1.0 / 6.0, 2.0 / 5.0]);
        let e = run(lrn, vec![x.clone()]).unwrap_err();
        assert!(e.0.contains("rank >= 3"), "{e}");
        let mvn = NodeDef::new("MeanVarianceNormalization", 13)
            .with_attr("axes", AttrValue::Ints(vec![1]));
        let o = run(mvn.clone(), vec![f(array![[1.0f32, 3.0]].into_dyn())]).unwrap();
        close(&o[0], &[-1.0, 1.0]);
        let e = run(mvn.with_attr("axes", AttrValue::Ints(vec![5])), vec![x]).unwrap_err();
        assert!(e.0.contains("axis 5 is out of range"), "{e}");
    }

    #[test]
    fn batchnorm_inference() {
        let x = Tensor::F32(array![[[1.0, 2.0]], [[3.0, 4.0]]].into_dyn())
            .view()
            .try_to_owned()
            .unwrap();
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

    #[test]
    fn skip_layer_normalization_and_its_sum_output() {
        let x = [1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 2.0];
        let skip = [0.5; 8];
        let gamma = [1.0, 2.0, 1.0, 0.5];
        let beta = [0.0, 0.0, 1.0, 0.0];
        let bias = [0.0, 1.0, 0.0, -1.0];
        let mut n = ms("SkipLayerNormalization").with_attr("epsilon", AttrValue::Float(1e-5));
        n.num_outputs = 4;
        let out = run_some(
            n,
            vec![
                Some(f32s(&[1, 2, 4], &x)),
                Some(f32s(&[1, 2, 4], &skip)),
                Some(f32s(&[4], &gamma)),
                Some(f32s(&[4], &beta)),
                Some(f32s(&[4], &bias)),
            ],
        );
        let mut want = Vec::new();
        let mut sums = Vec::new();
        for row in 0..2 {
            let s: Vec<f32> = (0..4)
                .map(|i| x[row * 4 + i] + skip[row * 4 + i] + bias[i])
                .collect();
            let mean = s.iter().sum::<f32>() / 4.0;
            let var = s.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
            let inv = 1.0 / (var + 1e-5).sqrt();
            want.extend((0..4).map(|i| (s[i] - mean) * inv * gamma[i] + beta[i]));
            sums.extend(s);
        }
        close_within(&out[0], &want, 1e-5);
        close_within(&out[3], &sums, 0.0);
        // The simplified form: x / rms(x) * gamma over the same sum.
        let out = run_some(
            ms("SkipSimplifiedLayerNormalization").with_attr("epsilon", AttrValue::Float(1e-5)),
            vec![
                Some(f32s(&[1, 2, 4], &x)),
                Some(f32s(&[1, 2, 4], &skip)),
                Some(f32s(&[4], &gamma)),
                Some(f32s(&[4], &bias)),
            ],
        );
        let want: Vec<f32> = sums
            .chunks(4)
            .flat_map(|s| {
                let rms = (s.iter().map(|v| v * v).sum::<f32>() / 4.0 + 1e-5).sqrt();
                (0..4).map(move |i| s[i] / rms * gamma[i])
            })
            .collect();
        close_within(&out[0], &want, 1e-5);
    }
}
