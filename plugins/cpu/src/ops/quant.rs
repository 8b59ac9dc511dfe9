//! Quantization: QuantizeLinear / DequantizeLinear (per-tensor, per-axis and blocked, with the
//! 8-, 16- and 32-bit integer types), DynamicQuantizeLinear, MatMulInteger, QLinearMatMul,
//! ConvInteger and QLinearConv. The float8 / int4 / int2 types are not supported.
//!
//! With 8-bit operands, the integer products of ConvInteger, QLinearConv, MatMulInteger and
//! QLinearMatMul run on the integer GEMM of [`crate::fast::qgemm`] (through
//! [`crate::fast::qconv`] and [`crate::fast::qmatmul`]), exactly. Other cases (16-bit types,
//! 3-D convolutions, a broadcast batched B) run through the float32 MatMul and Conv kernels,
//! still exactly: every partial sum of integers below 2^24 is exact in float32, and a product
//! whose sums could exceed that is split into two with the second operand's low and high 4
//! bits; only a product too deep even for that runs on f64. The per-tensor 8-bit
//! QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear run in one vectorized pass. All of
//! these are fast paths: at the reference kernel level the general f64 code computes the same
//! values.

use epx_plugin_api::ElementType;
use half::{bf16, f16};

use std::sync::{Arc, Mutex, OnceLock};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::fast::conv2d::Conv2d;
use crate::fast::qconv::{self, PackedConv};
use crate::fast::qmatmul::{self, PackedB};
use crate::fast::round::{low_byte, round_even_f32, round_even_f64};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::narrow::{I2, I4, NarrowCast, U2, U4};
use crate::ops::conv::as_2d;
use crate::ops::util::args::{input, normalize_axis, opt_input, scalar_f64};
use crate::ops::util::indexing::{c_strides, for_each_index};
use crate::ops::util::num::{float_values, is_float_type, tensor_from_f64};
use crate::ops::util::spatial::{SpatialAttrs, kernel_dims};
use crate::tensor::{Tensor, TensorRef};

/// The elements of a view as one slice: borrowed when it is contiguous in C order.
fn flat<'a, T: Clone>(a: &'a ndarray::ArrayViewD<'_, T>) -> std::borrow::Cow<'a, [T]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().cloned().collect()),
    }
}

pub fn register(reg: &mut Registry) {
    add(reg, "QuantizeLinear", 10, build_quantize);
    add(reg, "DequantizeLinear", 10, build_dequantize);
    add(reg, "DynamicQuantizeLinear", 11, build_dynamic);
    add(reg, "MatMulInteger", 10, build_matmul_integer);
    add(reg, "QLinearMatMul", 10, build_qlinear_matmul);
    add(reg, "ConvInteger", 10, build_conv_integer);
    add(reg, "QLinearConv", 10, build_qlinear_conv);
}

/// The range of an integer element type the quantizers support.
fn int_range(op: &str, ty: ElementType) -> OpResult<(i64, i64)> {
    Ok(match ty {
        ElementType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        ElementType::Uint8 => (0, u8::MAX.into()),
        ElementType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        ElementType::Uint16 => (0, u16::MAX.into()),
        ElementType::Int32 => (i32::MIN.into(), i32::MAX.into()),
        ElementType::Int4 => (I4::MIN, I4::MAX),
        ElementType::Uint4 => (U4::MIN, U4::MAX),
        ElementType::Int2 => (I2::MIN, I2::MAX),
        ElementType::Uint2 => (U2::MIN, U2::MAX),
        other => bail!("{op}: unsupported quantized element type {other}"),
    })
}

/// The 8- and 4-bit floats a tensor can be quantized to.
fn is_narrow_float(ty: ElementType) -> bool {
    use ElementType::*;
    matches!(
        ty,
        Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ | Float4E2M1
    )
}

/// A float8 zero point must be zero (ONNX: the formula keeps it only for symmetry).
fn check_float8_zero(op: &str, ty: ElementType, zp: &[f64]) -> OpResult<()> {
    if ty != ElementType::Float4E2M1 && zp.iter().any(|&z| z != 0.0) {
        bail!("{op}: a {ty} zero point must be zero");
    }
    Ok(())
}

/// The integer values of a quantized tensor (2- to 32-bit integers).
fn int_values(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<Vec<i64>> {
    int_range(op, t.elem_type()).map_err(|_| {
        OpError(format!(
            "{op}: {what} has unsupported element type {}",
            t.elem_type()
        ))
    })?;
    t.to_i64_vec(&format!("{op}: {what}"))
}

/// A tensor of integer type `ty` from values already inside its range.
fn int_tensor(ty: ElementType, shape: &[usize], v: Vec<i64>) -> OpResult<Tensor> {
    Tensor::from_vec(shape, v)?.view().cast(ty)
}

/// For each element of `xs`, the index of its scale / zero point: per tensor (one element),
/// per axis (1-D of `xs[axis]` values) or blocked (same rank, `block_size` along `axis`).
fn param_index(
    op: &str,
    xs: &[usize],
    ps: &[usize],
    axis: i64,
    block_size: i64,
) -> OpResult<Vec<usize>> {
    let total: usize = xs.iter().product();
    let plen: usize = ps.iter().product();
    if plen == 1 && block_size <= 0 && ps.len() <= 1 {
        return Ok(vec![0; total]);
    }
    let ax = normalize_axis(op, axis, xs.len())?;
    if block_size <= 0 {
        if ps != [xs[ax]] {
            bail!(
                "{op}: scale of shape {ps:?} must be a scalar or have shape [{}] (axis {ax} of {xs:?})",
                xs[ax]
            );
        }
        let inner: usize = xs[ax + 1..].iter().product();
        return Ok((0..total)
            .map(|i| (i / inner.max(1)) % xs[ax].max(1))
            .collect());
    }
    let bs = block_size as usize;
    let ok = ps.len() == xs.len()
        && (0..xs.len()).all(|d| {
            if d == ax {
                ps[d] == xs[d].div_ceil(bs)
            } else {
                ps[d] == xs[d]
            }
        });
    if !ok {
        bail!(
            "{op}: scale of shape {ps:?} does not block X of shape {xs:?} by {bs} along axis {ax}"
        );
    }
    let pstr = c_strides(ps);
    let mut out = Vec::with_capacity(total);
    for_each_index(xs, |ii| {
        let k: usize = ii
            .iter()
            .enumerate()
            .map(|(d, &i)| if d == ax { i / bs } else { i } * pstr[d])
            .sum();
        out.push(k);
    });
    Ok(out)
}

fn check_zp_shape(op: &str, scale: &TensorRef<'_>, zp: &TensorRef<'_>) -> OpResult<()> {
    if scale.len() != zp.len() || (zp.ndim() > 1 && scale.shape() != zp.shape()) {
        bail!(
            "{op}: zero point of shape {:?} must match scale of shape {:?}",
            zp.shape(),
            scale.shape()
        );
    }
    Ok(())
}

fn build_quantize(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 1)?;
    let block_size = n.attr_int_or("block_size", 0)?;
    let out_dtype = n.attr_int_or("output_dtype", 0)?;
    let precision = n.attr_int_or("precision", 0)?;
    let cast = NarrowCast {
        saturate: n.attr_int_or("saturate", 1)? != 0,
        ..NarrowCast::default()
    };
    let out_attr = if out_dtype == 0 {
        None
    } else {
        Some(
            ElementType::from_onnx(out_dtype as i32)
                .ok_or_else(|| n.error(format_args!("unknown output_dtype {out_dtype}")))?,
        )
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let scale = input(&op, inputs, 1)?;
        let zp = opt_input(inputs, 2);
        let out_ty = match (zp, out_attr) {
            (Some(z), Some(t)) if z.elem_type() != t => {
                bail!(
                    "{op}: output_dtype {t} differs from the zero point's type {}",
                    z.elem_type()
                )
            }
            (Some(z), _) => z.elem_type(),
            (None, Some(t)) => t,
            (None, None) => ElementType::Uint8,
        };
        // The one-pass paths are fast kernels: the reference level takes the general path.
        if let Some(t) = crate::fast::enabled()
            .then(|| quantize_f32_per_tensor(x, scale, zp, out_ty, precision, block_size))
            .flatten()
        {
            return one(Ok(t));
        }
        let xv = match x.elem_type() {
            ElementType::Int32 => x.to_f64_vec(),
            _ => float_values(&op, "x", x)?,
        };
        let sv = float_values(&op, "y_scale", scale)?;
        let wide = x.elem_type() == ElementType::Double
            || precision == i64::from(ElementType::Double.onnx_code());
        let divide = |v: f64, s: f64| {
            if wide {
                v / s
            } else {
                f64::from(v as f32 / s as f32)
            }
        };
        let pidx = param_index(&op, x.shape(), scale.shape(), axis, block_size)?;
        if is_narrow_float(out_ty) {
            let zv = match zp {
                Some(z) => {
                    check_zp_shape(&op, scale, z)?;
                    z.to_f64_vec()
                }
                None => vec![0.0; sv.len()],
            };
            check_float8_zero(&op, out_ty, &zv)?;
            let y: Vec<f64> = xv
                .iter()
                .zip(&pidx)
                .map(|(&v, &k)| {
                    let q = divide(v, sv.get(k).copied().unwrap_or(1.0));
                    q + zv.get(k).copied().unwrap_or(0.0)
                })
                .collect();
            return one(Tensor::from_vec(x.shape(), y)?
                .view()
                .cast_with(out_ty, cast));
        }
        let (lo, hi) = int_range(&op, out_ty)?;
        let zv = match zp {
            Some(z) => {
                check_zp_shape(&op, scale, z)?;
                int_values(&op, "y_zero_point", z)?
            }
            None => vec![0; sv.len()],
        };
        // The division runs in the precision of x (or of the `precision` attribute).
        let y: Vec<i64> = xv
            .iter()
            .zip(&pidx)
            .map(|(&v, &k)| {
                let q = divide(v, sv.get(k).copied().unwrap_or(1.0));
                let z = zv.get(k).copied().unwrap_or(0);
                // NaN saturates to 0 like a C cast of NaN would be undefined; use 0.
                let r = if q.is_nan() { 0.0 } else { round_even_f64(q) };
                (r + z as f64).clamp(lo as f64, hi as f64) as i64
            })
            .collect();
        one(int_tensor(out_ty, x.shape(), y))
    }))
}

crate::multiversion! {
/// `(v - z) · s` of each uint8 element, appended to `out`.
fn dequantize_u8(x: &[u8], s: f32, z: f32, out: &mut crate::par::Filler<'_, f32>) {
    out.extend_map(x, |v| (f32::from(v) - z) * s);
}
}

crate::multiversion! {
/// `(v - z) · s` of each int8 element, appended to `out`.
fn dequantize_i8(x: &[i8], s: f32, z: f32, out: &mut crate::par::Filler<'_, f32>) {
    out.extend_map(x, |v| (f32::from(v) - z) * s);
}
}

/// The common QuantizeLinear: float32 `x`, one float32 scale, a uint8 / int8 (or no) zero
/// point. Computes what the general path does (`x / scale` in float32, rounded half to even,
/// plus the zero point, saturated) without going through f64. `None` for any other case.
fn quantize_f32_per_tensor(
    x: &TensorRef<'_>,
    scale: &TensorRef<'_>,
    zp: Option<&TensorRef<'_>>,
    out_ty: ElementType,
    precision: i64,
    block_size: i64,
) -> Option<Tensor> {
    let (TensorRef::F32(xv), TensorRef::F32(sv)) = (x, scale) else {
        return None;
    };
    if sv.len() != 1 || block_size > 0 || precision != 0 {
        return None;
    }
    let s = *sv.iter().next()?;
    let shape = x.shape().to_vec();
    let (z, signed) = match (out_ty, zp) {
        (ElementType::Uint8, None) => (0, false),
        (ElementType::Uint8, Some(TensorRef::U8(z))) if z.len() == 1 => {
            (i32::from(*z.iter().next()?), false)
        }
        (ElementType::Int8, Some(TensorRef::I8(z))) if z.len() == 1 => {
            (i32::from(*z.iter().next()?), true)
        }
        _ => return None,
    };
    let x = flat(xv);
    let piece = crate::par::chunk_len(x.len(), 16 << 10, 64);
    // Memory that is not there: the general path reports it.
    let buf = crate::scratch::take(x.len()).ok()?;
    let y = crate::par::build_vec(buf, x.len(), piece, |at, f| {
        let x = &x[at..][..piece.min(x.len() - at)];
        // SAFETY: the kernel writes every slot it is handed.
        unsafe {
            f.extend_raw(x.len(), |o| {
                crate::fast::qbytes::quantize(x, s, z, signed, o)
            })
        };
    });
    if signed {
        let y: Vec<i8> = y.into_iter().map(|b| b as i8).collect();
        Tensor::from_vec(&shape, y).ok()
    } else {
        Tensor::from_vec(&shape, y).ok()
    }
}

/// The common DequantizeLinear: uint8 / int8 `x`, one float32 scale, a scalar zero point of
/// x's type (or none), to float32: `(x - zero point) · scale`, one float32 rounding as in the
/// general path. `None` for any other case.
fn dequantize_8bit_per_tensor(
    x: &TensorRef<'_>,
    scale: &TensorRef<'_>,
    zp: Option<&TensorRef<'_>>,
    block_size: i64,
) -> Option<Tensor> {
    let TensorRef::F32(sv) = scale else {
        return None;
    };
    if sv.len() != 1 || block_size > 0 {
        return None;
    }
    let s = *sv.iter().next()?;
    let shape = x.shape().to_vec();
    // `v - z` is exact in float32, so this is the general path's one rounding of the product.
    // Pieces for the intra-op pool (one piece on one thread).
    let piece = crate::par::chunk_len(x.len(), 16 << 10, 64);
    let y = match (x, zp) {
        (TensorRef::U8(xv), None) => each_piece(&flat(xv), piece, |x, o| {
            dequantize_u8(x, s, 0.0, o);
        }),
        (TensorRef::U8(xv), Some(TensorRef::U8(z))) if z.len() == 1 => {
            let z = f32::from(*z.iter().next()?);
            each_piece(&flat(xv), piece, |x, o| dequantize_u8(x, s, z, o))
        }
        (TensorRef::I8(xv), None) => each_piece(&flat(xv), piece, |x, o| {
            dequantize_i8(x, s, 0.0, o);
        }),
        (TensorRef::I8(xv), Some(TensorRef::I8(z))) if z.len() == 1 => {
            let z = f32::from(*z.iter().next()?);
            each_piece(&flat(xv), piece, |x, o| dequantize_i8(x, s, z, o))
        }
        _ => return None,
    };
    // Memory that is not there: the general path reports it.
    Tensor::from_vec(&shape, y.ok()?).ok()
}

/// A float32 output of `x`'s length built piece by piece across the intra-op pool:
/// `f(x piece, out)` appends the piece's elements ([`crate::par::build_vec`]).
fn each_piece<T: Sync>(
    x: &[T],
    piece: usize,
    f: impl Fn(&[T], &mut crate::par::Filler<'_, f32>) + Sync + Send,
) -> OpResult<Vec<f32>> {
    let buf = crate::scratch::take(x.len())?;
    Ok(crate::par::build_vec(buf, x.len(), piece, |start, out| {
        f(&x[start..][..piece.min(x.len() - start)], out);
    }))
}

fn build_dequantize(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 1)?;
    let block_size = n.attr_int_or("block_size", 0)?;
    let out_dtype = n.attr_int_or("output_dtype", 0)?;
    let out_attr = if out_dtype == 0 {
        None
    } else {
        Some(
            ElementType::from_onnx(out_dtype as i32)
                .ok_or_else(|| n.error(format_args!("unknown output_dtype {out_dtype}")))?,
        )
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let scale = input(&op, inputs, 1)?;
        if out_attr.is_none_or(|t| t == ElementType::Float)
            && crate::fast::enabled()
            && let Some(t) = dequantize_8bit_per_tensor(x, scale, opt_input(inputs, 2), block_size)
        {
            return one(Ok(t));
        }
        let narrow = is_narrow_float(x.elem_type());
        let xv: Vec<f64> = if narrow {
            x.to_f64_vec()
        } else {
            int_values(&op, "x", x)?
                .into_iter()
                .map(|v| v as f64)
                .collect()
        };
        let sv = float_values(&op, "x_scale", scale)?;
        let zv: Vec<f64> = match opt_input(inputs, 2) {
            Some(z) => {
                check_zp_shape(&op, scale, z)?;
                if z.elem_type() != x.elem_type() {
                    bail!(
                        "{op}: zero point must have x's type {}, got {}",
                        x.elem_type(),
                        z.elem_type()
                    );
                }
                if narrow {
                    let zv = z.to_f64_vec();
                    check_float8_zero(&op, x.elem_type(), &zv)?;
                    zv
                } else {
                    int_values(&op, "x_zero_point", z)?
                        .into_iter()
                        .map(|v| v as f64)
                        .collect()
                }
            }
            None => vec![0.0; sv.len()],
        };
        let pidx = param_index(&op, x.shape(), scale.shape(), axis, block_size)?;
        let out_ty = out_attr.unwrap_or(scale.elem_type());
        if !is_float_type(out_ty) {
            bail!("{op}: output type must be a float type, got {out_ty}");
        }
        let y: Vec<f64> = xv
            .iter()
            .zip(&pidx)
            .map(|(&v, &k)| {
                let d = v - zv.get(k).copied().unwrap_or(0.0);
                d * sv.get(k).copied().unwrap_or(0.0)
            })
            .collect();
        one(tensor_from_f64(out_ty, x.shape(), y))
    }))
}

fn build_dynamic(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        if x.elem_type() != ElementType::Float {
            bail!("{op}: x must be float32, got {}", x.elem_type());
        }
        let view = x.as_f32()?;
        let xv = flat(&view);
        let (scale, zp) = dynamic_u8_params(&xv);
        let mut y = vec![zp as u8; xv.len()];
        if scale != 0.0 && crate::fast::enabled() {
            dynamic_quantize(&xv, scale, zp, &mut y);
        } else if scale != 0.0 {
            for (o, &v) in y.iter_mut().zip(xv.iter()) {
                *o = ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8;
            }
        }
        Ok(vec![
            Tensor::from_vec(x.shape(), y)?,
            Tensor::scalar(scale),
            Tensor::scalar(zp as u8),
        ])
    }))
}

crate::multiversion! {
/// DynamicQuantizeLinear's quantization: `round(v / scale) + zp` saturated to 0..=255, NaN to 0.
fn dynamic_quantize(x: &[f32], scale: f32, zp: f32, out: &mut [u8]) {
    for (o, &v) in out.iter_mut().zip(x) {
        let q = round_even_f32(v / scale) + zp;
        *o = if q.is_nan() { 0 } else { low_byte(q.clamp(0.0, 255.0)) };
    }
}
}

crate::multiversion! {
/// The least and greatest of `xv` and 0, NaN passed over: in sixteen independent lanes, so the
/// loop vectorizes (a max is the same whatever the order it is taken in).
fn range_with_zero(xv: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([0f32; 16], [0f32; 16]);
    let chunks = xv.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        // Compare-and-select (`f32::min` does not vectorize); a NaN compares false and is
        // passed over.
        for ((l, h), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(c) {
            *l = if v < *l { v } else { *l };
            *h = if v > *h { v } else { *h };
        }
    }
    let min = rest.iter().chain(&lo).fold(0.0f32, |a, &v| if v < a { v } else { a });
    let max = rest.iter().chain(&hi).fold(0.0f32, |a, &v| if v > a { v } else { a });
    (min, max)
}
}

/// DynamicQuantizeLinear's uint8 scale and zero point for `xv`: its range widened to hold 0,
/// over 255 steps, the zero point rounded half to even.
pub(crate) fn dynamic_u8_params(xv: &[f32]) -> (f32, f32) {
    let (min, max) = range_with_zero(xv);
    let scale = (max - min) / 255.0;
    let zp = if scale == 0.0 {
        0.0
    } else {
        (-min / scale).round_ties_even().clamp(0.0, 255.0)
    };
    (scale, zp)
}

/// `xv` quantized to uint8 from its own range and back (what a product with dynamically
/// quantized activations sees), in place.
pub(crate) fn fake_quantize_u8(xv: &mut [f64]) {
    let f: Vec<f32> = xv.iter().map(|&v| v as f32).collect();
    let (scale, zp) = dynamic_u8_params(&f);
    if scale == 0.0 {
        xv.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    for (v, x) in xv.iter_mut().zip(f) {
        let q = ((x / scale).round_ties_even() + zp).clamp(0.0, 255.0);
        *v = f64::from(q - zp) * f64::from(scale);
    }
}

/// `t - zp` as an f64 tensor; `zp` is a scalar or per-`axis` (1-D of `t.shape()[axis]`).
fn centered(
    op: &str,
    what: &str,
    t: &TensorRef<'_>,
    zp: Option<&TensorRef<'_>>,
    axis: usize,
) -> OpResult<Tensor> {
    let v = int_values(op, what, t)?;
    let shape = t.shape();
    let z = match zp {
        Some(z) => {
            if z.elem_type() != t.elem_type() {
                bail!(
                    "{op}: {what} zero point must have type {}, got {}",
                    t.elem_type(),
                    z.elem_type()
                );
            }
            int_values(op, what, z)?
        }
        None => vec![0],
    };
    let out: Vec<f64> = if z.len() == 1 {
        v.iter().map(|&a| (a - z[0]) as f64).collect()
    } else {
        let n = shape.get(axis).copied().unwrap_or(0);
        if z.len() != n || shape.len() < 2 {
            bail!(
                "{op}: {what} zero point must be a scalar or have {n} values, got shape {:?}",
                zp.map(|z| z.shape().to_vec()).unwrap_or_default()
            );
        }
        let inner: usize = shape[axis + 1..].iter().product();
        v.iter()
            .enumerate()
            .map(|(i, &a)| (a - z.get((i / inner.max(1)) % n.max(1)).copied().unwrap_or(0)) as f64)
            .collect()
    };
    Tensor::from_vec(shape, out)
}

/// Builds the kernel of another CPU op (MatMul, Conv) for the integer ops to run through, from
/// the process-wide registry.
fn inner_kernel(
    n: &NodeDef,
    op_type: &str,
    opset: i64,
    attrs: &[&str],
) -> OpResult<Box<dyn OpKernel>> {
    let mut node = NodeDef::new(op_type, opset).with_io(2, 1);
    node.name.clone_from(&n.name);
    for &a in attrs {
        if let Some(v) = n.attributes.get(a) {
            node = node.with_attr(a, v.clone());
        }
    }
    crate::kernel::installed_registry()?
        .build(&node)
        .map_err(|e| n.error(e))
}

/// `t - zp` as a float32 tensor (exact: the values are integers of at most 17 bits) and the
/// largest magnitude in it; `None` when `t` is not an 8- or 16-bit integer tensor.
fn centered_f32(
    op: &str,
    what: &str,
    t: &TensorRef<'_>,
    zp: Option<&TensorRef<'_>>,
    axis: usize,
) -> OpResult<Option<(Tensor, f32)>> {
    if !matches!(
        t.elem_type(),
        ElementType::Uint8 | ElementType::Int8 | ElementType::Uint16 | ElementType::Int16
    ) {
        return Ok(None);
    }
    let scalar_zp = |z: Option<&TensorRef<'_>>| -> Option<f32> {
        match z {
            None => Some(0.0),
            Some(TensorRef::U8(z)) if z.len() == 1 => z.iter().next().map(|&v| f32::from(v)),
            Some(TensorRef::I8(z)) if z.len() == 1 => z.iter().next().map(|&v| f32::from(v)),
            _ => None,
        }
    };
    let direct: Option<Vec<f32>> = match (t, scalar_zp(zp)) {
        (TensorRef::U8(a), Some(z)) if zp.is_none_or(|z| z.elem_type() == t.elem_type()) => {
            Some(flat(a).iter().map(|&v| f32::from(v) - z).collect())
        }
        (TensorRef::I8(a), Some(z)) if zp.is_none_or(|z| z.elem_type() == t.elem_type()) => {
            Some(flat(a).iter().map(|&v| f32::from(v) - z).collect())
        }
        _ => None,
    };
    let f = match direct {
        Some(f) => f,
        None => {
            let c = centered(op, what, t, zp, axis)?;
            c.view()
                .to_f64_vec()
                .into_iter()
                .map(|x| x as f32)
                .collect()
        }
    };
    let max = f.iter().fold(0f32, |m, x| m.max(x.abs()));
    Ok(Some((Tensor::from_vec(t.shape(), f)?, max)))
}

/// Integers below this are exact in float32, and so is every sum that stays below it.
const F32_EXACT: f64 = (1u32 << 24) as f64;

/// The integer product `k(a, b)` (a float32 Conv or MatMul kernel) of the centered values
/// `a` and `b` (largest magnitudes `ma`, `mb`), reducing over `depth` terms, exactly: as one
/// float32 product when no partial sum can reach 2^24, else as `16·k(a, hi) + k(a, lo)` with
/// `b = 16·hi + lo`, `lo` in 0..16. `None` when even the halves could overflow float32's
/// integers.
fn exact_product(
    k: &dyn OpKernel,
    (a, ma): (&Tensor, f32),
    (b, mb): (&Tensor, f32),
    depth: usize,
) -> OpResult<Option<(Vec<usize>, Acc)>> {
    let bound = |m: f64| depth as f64 * f64::from(ma) * m;
    if bound(f64::from(mb)) < F32_EXACT {
        let (shape, acc) = run_inner_f32(k, a, b)?;
        return Ok(Some((shape, Acc::One(acc))));
    }
    let hi_max = (f64::from(mb) / 16.0).ceil() + 1.0;
    if bound(15.0) >= F32_EXACT || bound(hi_max) >= F32_EXACT {
        return Ok(None);
    }
    let bv = b.view();
    let bv = bv.as_f32()?;
    let bv = flat(&bv);
    // The values are integers of at most 17 bits: split them as integers (floor division by
    // 16 is an arithmetic shift).
    let lo: Vec<f32> = bv.iter().map(|&x| ((x as i32) & 15) as f32).collect();
    let hi: Vec<f32> = bv.iter().map(|&x| ((x as i32) >> 4) as f32).collect();
    let (shape, lo) = run_inner_f32(k, a, &Tensor::from_vec(b.shape(), lo)?)?;
    let (_, hi) = run_inner_f32(k, a, &Tensor::from_vec(b.shape(), hi)?)?;
    Ok(Some((shape, Acc::Split { hi, lo })))
}

/// Exact integer accumulators: one float32 product, the two products of a split one
/// (`16·hi + lo`), or f64.
enum Acc {
    One(Vec<f32>),
    Split { hi: Vec<f32>, lo: Vec<f32> },
    Wide(Vec<f64>),
}

impl Acc {
    fn into_f64(self) -> Vec<f64> {
        match self {
            Acc::One(v) => v.into_iter().map(f64::from).collect(),
            Acc::Split { hi, lo } => hi
                .iter()
                .zip(&lo)
                .map(|(h, l)| f64::from(*h) * 16.0 + f64::from(*l))
                .collect(),
            Acc::Wide(v) => v,
        }
    }
}

/// A float32 kernel's output 0 as a flat vector, with its shape.
fn run_inner_f32(k: &dyn OpKernel, a: &Tensor, b: &Tensor) -> OpResult<(Vec<usize>, Vec<f32>)> {
    match k.run(&[Some(a.view()), Some(b.view())])?.into_iter().next() {
        Some(Tensor::F32(t)) => {
            let shape = t.shape().to_vec();
            let v = if t.is_standard_layout() {
                t.into_raw_vec_and_offset().0
            } else {
                t.iter().copied().collect()
            };
            Ok((shape, v))
        }
        _ => Err(OpError("inner kernel returned no float32 output".into())),
    }
}

/// The integer product of `a` and `b` (minus their zero points) through `k`, a Conv or MatMul
/// kernel, as exact accumulators ([`Acc`]): on float32 where that is exact ([`exact_product`]),
/// else on f64.
#[allow(clippy::too_many_arguments)]
fn integer_product(
    op: &str,
    k: &dyn OpKernel,
    (a, a_name, a_zp, a_axis): (&TensorRef<'_>, &str, Option<&TensorRef<'_>>, usize),
    (b, b_name, b_zp, b_axis): (&TensorRef<'_>, &str, Option<&TensorRef<'_>>, usize),
    depth: usize,
) -> OpResult<(Vec<usize>, Acc)> {
    let e = |e: OpError| OpError(format!("{op}: {e}"));
    // On float32 kernels is a fast path: the reference level multiplies in f64.
    if crate::fast::enabled()
        && let (Some(af), Some(bf)) = (
            centered_f32(op, a_name, a, a_zp, a_axis)?,
            centered_f32(op, b_name, b, b_zp, b_axis)?,
        )
        && let Some(r) = exact_product(k, (&af.0, af.1), (&bf.0, bf.1), depth).map_err(e)?
    {
        return Ok(r);
    }
    let ac = centered(op, a_name, a, a_zp, a_axis)?;
    let bc = centered(op, b_name, b, b_zp, b_axis)?;
    let (shape, acc) = run_inner_shape(k, &ac, &bc).map_err(e)?;
    Ok((shape, Acc::Wide(acc)))
}

fn run_inner_shape(k: &dyn OpKernel, a: &Tensor, b: &Tensor) -> OpResult<(Vec<usize>, Vec<f64>)> {
    let out = k.run(&[Some(a.view()), Some(b.view())])?;
    match out.first() {
        Some(Tensor::F32(t)) => Ok((
            t.shape().to_vec(),
            flat(&t.view()).iter().map(|&x| f64::from(x)).collect(),
        )),
        Some(t) => Ok((t.shape().to_vec(), t.view().to_f64_vec())),
        None => Err(OpError("inner kernel returned no output".into())),
    }
}

/// The 8-bit matrix product fast path of MatMulInteger and QLinearMatMul
/// ([`crate::fast::qmatmul`]): `B` two-dimensional (packed once while it stays the same), or
/// with the batch dimensions of `A` (packed per batch).
#[derive(Default)]
struct FastQMatMul {
    cache: Arc<PackCache<PackedB>>,
}

impl FastQMatMul {
    /// `A · B` with their zero points into `out`, with the output shape; `None` where the
    /// fast path does not apply and the general path runs.
    fn run(
        &self,
        (a, azp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        (b, bzp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        out: &qmatmul::Output<'_>,
    ) -> Option<(Vec<usize>, qconv::Result)> {
        if !crate::fast::enabled() {
            return None;
        }
        let (sa, sb) = (a.shape(), b.shape());
        if sa.len() < 2 || sb.len() < 2 {
            return None;
        }
        let (k, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if sa[sa.len() - 1] != k || (sb.len() > 2 && sb[..sb.len() - 2] != sa[..sa.len() - 2]) {
            return None;
        }
        let [za] = zero_points(azp, a.elem_type())?[..] else {
            return None;
        };
        let zb = zero_points(bzp, b.elem_type())?;
        if zb.len() != 1 && (zb.len() != n || bzp.is_some_and(|z| z.ndim() != 1)) {
            return None;
        }
        let (ab, a_signed) = bytes_of(a)?;
        let (bb, b_signed) = bytes_of(b)?;
        let mut shape = sa.to_vec();
        *shape.last_mut()? = n;
        let rows: usize = sa[..sa.len() - 1].iter().product();
        let batches = if sb.len() > 2 {
            sb[..sb.len() - 2].iter().product()
        } else {
            1
        };
        // Over the size limit: the reference path reports it.
        crate::limits::checked_len(&[rows, n], 4).ok()?;
        let mut bytes = Vec::new();
        let mut ints = Vec::new();
        match out {
            qmatmul::Output::Int32 => ints = vec![0i32; rows * n],
            // Memory that is not there: the reference path reports it.
            qmatmul::Output::Bytes { .. } => bytes = crate::scratch::zeros(rows * n).ok()?,
        }
        let per = rows / batches.max(1);
        for i in 0..batches {
            let packed = if batches == 1 {
                self.cache
                    .get(&bb, &zb, [k, n, usize::from(b_signed), 0], || {
                        PackedB::new(&bb, b_signed, (k, n), &zb)
                    })?
            } else {
                Arc::new(PackedB::new(
                    &bb[i * k * n..][..k * n],
                    b_signed,
                    (k, n),
                    &zb,
                )?)
            };
            let dst = match out {
                qmatmul::Output::Int32 => qmatmul::Dst::Int32(&mut ints[i * per * n..][..per * n]),
                qmatmul::Output::Bytes { .. } => {
                    qmatmul::Dst::Bytes(&mut bytes[i * per * n..][..per * n])
                }
            };
            qmatmul::run(
                &ab[i * per * k..][..per * k],
                a_signed,
                za,
                &packed,
                out,
                dst,
            )?;
        }
        Some((
            shape,
            match out {
                qmatmul::Output::Int32 => qconv::Result::Int32(ints),
                qmatmul::Output::Bytes { .. } => qconv::Result::Bytes(bytes),
            },
        ))
    }
}

/// An 8-bit result as a uint8 or int8 tensor.
fn byte_tensor(shape: &[usize], v: Vec<u8>, signed: bool) -> OpResult<Tensor> {
    if signed {
        Tensor::from_vec(shape, v.into_iter().map(|b| b as i8).collect::<Vec<i8>>())
    } else {
        Tensor::from_vec(shape, v)
    }
}

/// The scalar uint8 or int8 output zero point `zp`, as a value and whether it is signed.
fn output_zero_point(zp: &TensorRef<'_>) -> Option<(f64, bool)> {
    match zp {
        TensorRef::U8(z) if z.len() == 1 => z.iter().next().map(|&z| (f64::from(z), false)),
        TensorRef::I8(z) if z.len() == 1 => z.iter().next().map(|&z| (f64::from(z), true)),
        _ => None,
    }
}

fn build_matmul_integer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let mm = inner_kernel(n, "MatMul", 13, &[])?;
    let fast = FastQMatMul::default();
    let cache = fast.cache.clone();
    let inner = kernel(move |inputs| {
        let a = input(&op, inputs, 0)?;
        let b = input(&op, inputs, 1)?;
        if let Some((shape, qconv::Result::Int32(v))) = fast.run(
            (a, opt_input(inputs, 2)),
            (b, opt_input(inputs, 3)),
            &qmatmul::Output::Int32,
        ) {
            return one(Tensor::from_vec(&shape, v));
        }
        let ra = a.ndim().saturating_sub(2);
        let rb = b.ndim().saturating_sub(1);
        let (shape, v) = integer_product(
            &op,
            mm.as_ref(),
            (a, "A", opt_input(inputs, 2), ra),
            (b, "B", opt_input(inputs, 3), rb),
            a.shape().last().copied().unwrap_or(0),
        )?;
        let v = v.into_f64();
        let v: Vec<i32> = v.into_iter().map(|x| x as i32).collect();
        one(Tensor::from_vec(&shape, v))
    });
    Ok(Box::new(PackedInput {
        inner,
        cache,
        index: 1,
    }))
}

/// A scale in its own precision: the product `a * b / y` rounded like the scale type.
fn scale_factor(ty: ElementType, a: f64, b: f64, y: f64) -> f64 {
    match ty {
        ElementType::Float16 => {
            let p = f16::from_f64(a * b);
            f16::from_f64(p.to_f64() / y).to_f64()
        }
        ElementType::Bfloat16 => {
            let p = bf16::from_f64(a * b);
            bf16::from_f64(p.to_f64() / y).to_f64()
        }
        ElementType::Float => f64::from((a as f32 * b as f32) / y as f32),
        _ => a * b / y,
    }
}

/// Requantizes `acc` (integer accumulators) with `factor` (per element) and `y_zero_point`.
fn requantize(
    op: &str,
    shape: &[usize],
    acc: &[f64],
    factor: impl Fn(usize) -> f64,
    yzp: &TensorRef<'_>,
) -> OpResult<Tensor> {
    let z = int_values(op, "y_zero_point", yzp)?;
    let [z] = z.as_slice() else {
        bail!(
            "{op}: y_zero_point must have one element, got shape {:?}",
            yzp.shape()
        );
    };
    let (lo, hi) = int_range(op, yzp.elem_type())?;
    let q = |i: usize, c: f64| {
        let d = c * factor(i) + *z as f64;
        if d.is_nan() {
            0.0
        } else {
            round_even_f64(d).clamp(lo as f64, hi as f64)
        }
    };
    let each = acc.iter().enumerate();
    match yzp.elem_type() {
        // In range and integer-valued: the byte is exact ([`low_byte`], which vectorizes).
        ElementType::Uint8 => Tensor::from_vec(
            shape,
            each.map(|(i, &c)| low_byte(q(i, c) as f32)).collect(),
        ),
        ElementType::Int8 => Tensor::from_vec(
            shape,
            each.map(|(i, &c)| (low_byte(q(i, c) as f32 + 128.0) ^ 0x80) as i8)
                .collect(),
        ),
        ty => int_tensor(ty, shape, each.map(|(i, &c)| q(i, c) as i64).collect()),
    }
}

fn build_qlinear_matmul(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let mm = inner_kernel(n, "MatMul", 13, &[])?;
    let fast = FastQMatMul::default();
    let cache = fast.cache.clone();
    let inner = kernel(move |inputs| {
        let a = input(&op, inputs, 0)?;
        let b = input(&op, inputs, 3)?;
        let ra = a.ndim().saturating_sub(2);
        let rb = b.ndim().saturating_sub(1);
        let sa = input(&op, inputs, 1)?;
        let (a_scale, y_scale) = (
            scalar_f64(&op, "a_scale", sa)?,
            scalar_f64(&op, "y_scale", input(&op, inputs, 6)?)?,
        );
        // b_scale: one, or one per column of a 2-D B.
        let bs = input(&op, inputs, 4)?;
        let bsv = float_values(&op, "b_scale", bs)?;
        let cols = b.shape().last().copied().unwrap_or(0);
        if bsv.len() != 1 && (bsv.len() != cols || b.ndim() != 2 || bs.ndim() != 1) {
            bail!(
                "{op}: b_scale must have one element, or one per column of a 2-D b ({cols}), \
                 got shape {:?}",
                bs.shape()
            );
        }
        let factors: Vec<f64> = bsv
            .iter()
            .map(|&s| scale_factor(sa.elem_type(), a_scale, s, y_scale))
            .collect();
        let yzp = input(&op, inputs, 7)?;
        if let Some((zy, signed)) = output_zero_point(yzp)
            && let Some((shape, qconv::Result::Bytes(v))) = fast.run(
                (a, opt_input(inputs, 2)),
                (b, opt_input(inputs, 5)),
                &qmatmul::Output::Bytes {
                    factors: &factors,
                    zy,
                    signed,
                },
            )
        {
            return one(byte_tensor(&shape, v, signed));
        }
        let (shape, acc) = integer_product(
            &op,
            mm.as_ref(),
            (a, "a", opt_input(inputs, 2), ra),
            (b, "b", opt_input(inputs, 5), rb),
            a.shape().last().copied().unwrap_or(0),
        )?;
        let acc = acc.into_f64();
        let per = factors.len();
        one(requantize(
            &op,
            &shape,
            &acc,
            |i| factors[i % per],
            input(&op, inputs, 7)?,
        ))
    });
    Ok(Box::new(PackedInput {
        inner,
        cache,
        index: 3,
    }))
}

/// The number of terms each output of a convolution with weights `w` sums: input channels
/// per group times the kernel's size.
fn conv_depth(w: &TensorRef<'_>) -> usize {
    w.shape().iter().skip(1).product()
}

const CONV_ATTRS: [&str; 6] = [
    "auto_pad",
    "dilations",
    "group",
    "kernel_shape",
    "pads",
    "strides",
];

/// The bytes of an 8-bit tensor (int8 as its bits), with whether it is signed; `None` for
/// other types.
fn bytes_of<'a>(t: &'a TensorRef<'_>) -> Option<(std::borrow::Cow<'a, [u8]>, bool)> {
    match t {
        TensorRef::U8(a) => Some((flat(a), false)),
        TensorRef::I8(a) => Some((
            match flat(a) {
                std::borrow::Cow::Borrowed(s) => {
                    std::borrow::Cow::Borrowed(bytemuck::cast_slice::<i8, u8>(s))
                }
                std::borrow::Cow::Owned(v) => {
                    std::borrow::Cow::Owned(v.into_iter().map(|b| b as u8).collect())
                }
            },
            true,
        )),
        _ => None,
    }
}

/// The zero points of an 8-bit tensor of type `ty` (0 when absent); `None` when `zp` has
/// another type.
fn zero_points(zp: Option<&TensorRef<'_>>, ty: ElementType) -> Option<Vec<i32>> {
    match zp {
        None => Some(vec![0]),
        Some(z) if z.elem_type() == ty => match z {
            TensorRef::U8(z) => Some(z.iter().map(|&v| i32::from(v)).collect()),
            TensorRef::I8(z) => Some(z.iter().map(|&v| i32::from(v)).collect()),
            _ => None,
        },
        Some(_) => None,
    }
}

/// The weights a convolution kernel packed last, with what they were packed from: a run with
/// the same weight bytes (a constant, every run) reuses them.
struct PackCache<T> {
    slot: Mutex<Option<PackKey<T>>>,
    /// Where the weights lie when they are one of the program's constants
    /// ([`OpKernel::prepare`]): `(address, length)`.
    constant: OnceLock<(usize, usize)>,
}

type PackKey<T> = (Packed, Vec<i32>, [usize; 4], Arc<T>);

/// What the packed weights were made from.
enum Packed {
    /// A copy of the bytes, compared on each use.
    Bytes(Vec<u8>),
    /// The program's constant at this `(address, length)`: no other bytes can lie there while
    /// the program (and so this kernel) lives, and it never changes, so matching the address is
    /// matching the bytes.
    Constant(usize, usize),
}

impl<T> Default for PackCache<T> {
    fn default() -> Self {
        PackCache {
            slot: Mutex::new(None),
            constant: OnceLock::new(),
        }
    }
}

impl<T> PackCache<T> {
    /// Notes that `w` is one of the program's constants (see [`Packed::Constant`]).
    fn mark_constant(&self, w: &[u8]) {
        let _ = self.constant.set((w.as_ptr() as usize, w.len()));
    }

    fn get(
        &self,
        w: &[u8],
        zw: &[i32],
        dims: [usize; 4],
        make: impl FnOnce() -> Option<T>,
    ) -> Option<Arc<T>> {
        let at = (w.as_ptr() as usize, w.len());
        let constant = self.constant.get() == Some(&at);
        let mut slot = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((from, z, d, packed)) = slot.as_ref()
            && match from {
                Packed::Bytes(bytes) => bytes.as_slice() == w,
                Packed::Constant(a, n) => constant && (*a, *n) == at,
            }
            && z.as_slice() == zw
            && *d == dims
        {
            return Some(packed.clone());
        }
        let packed = Arc::new(make()?);
        let from = if constant {
            Packed::Constant(at.0, at.1)
        } else {
            Packed::Bytes(w.to_vec())
        };
        *slot = Some((from, zw.to_vec(), dims, packed.clone()));
        Some(packed)
    }
}

/// A kernel whose input `index` holds weights packed through `cache`: when that input is one of
/// the program's constants, the cache knows it ([`PackCache::mark_constant`]) and neither keeps
/// a copy of the bytes nor compares them on each run.
struct PackedInput<T> {
    inner: Box<dyn OpKernel>,
    cache: Arc<PackCache<T>>,
    index: usize,
}

impl<T: Send + Sync> OpKernel for PackedInput<T> {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        self.inner.run(inputs)
    }

    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        // Only bytes that lie in the constant itself: a copy (`Cow::Owned`) dies here.
        if let Some(Some(t)) = constants.get(self.index)
            && let Some((std::borrow::Cow::Borrowed(w), _)) = bytes_of(t)
        {
            self.cache.mark_constant(w);
        }
    }
}

/// The 8-bit convolution fast path of ConvInteger and QLinearConv ([`crate::fast::qconv`]).
struct FastQConv {
    attrs: SpatialAttrs,
    group: usize,
    cache: Arc<PackCache<PackedConv>>,
}

impl FastQConv {
    fn new(n: &NodeDef) -> OpResult<Self> {
        let group = n.attr_int_or("group", 1)?;
        Ok(FastQConv {
            attrs: SpatialAttrs::parse(n)?,
            group: usize::try_from(group).unwrap_or(0),
            cache: Arc::default(),
        })
    }

    /// The convolution of 8-bit `x` by 8-bit `w` into `out`, with the output shape; `None`
    /// where the fast path does not apply (other types or ranks, shapes the general path
    /// rejects, the reference level), and the general path runs.
    fn run(
        &self,
        op: &str,
        (x, xzp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        (w, wzp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        out: &qconv::Output<'_>,
    ) -> Option<(Vec<usize>, qconv::Result)> {
        if !crate::fast::enabled() {
            return None;
        }
        let (xs, ws) = (x.shape(), w.shape());
        if !matches!(xs.len(), 3 | 4) || ws.len() != xs.len() {
            return None;
        }
        let [zx] = zero_points(xzp, x.elem_type())?[..] else {
            return None;
        };
        let zw = zero_points(wzp, w.elem_type())?;
        let (xb, x_signed) = bytes_of(x)?;
        let (wb, w_signed) = bytes_of(w)?;
        let (nb, c, m, cg, g) = (xs[0], xs[1], ws[0], ws[1], self.group);
        if g == 0 || c != cg * g || m % g != 0 || (zw.len() != 1 && zw.len() != m) {
            return None;
        }
        let kernel = ws[2..].to_vec();
        if let Some(k) = &self.attrs.kernel_shape
            && kernel_dims(op, k).ok()? != kernel
        {
            return None;
        }
        let geo = self.attrs.resolve(op, &xs[2..], &kernel).ok()?;
        geo.checked_output(&[xs[0], m]).ok()?;
        let ((h, wd), (kh, kw), geo2) = match (&xs[2..], &kernel[..]) {
            ([h, wd], [kh, kw]) => ((*h, *wd), (*kh, *kw), geo.clone()),
            ([wd], [kw]) => ((1, *wd), (1, *kw), as_2d(&geo)),
            _ => return None,
        };
        let depth = cg * kh * kw;
        let depthwise = cg == 1 && m == g;
        // A stride-1 convolution over whole channel quads reads its input in quads
        // ([`qconv`]): its weights are packed in that depth order instead.
        let quad_taps =
            (geo2.strides == [1, 1] && !depthwise && cg % 4 == 0 && kh * kw > 1).then_some(kh * kw);
        let key = [
            m,
            depth,
            g,
            usize::from(w_signed) | usize::from(quad_taps.is_some()) << 1,
        ];
        let packed = self.cache.get(&wb, &zw, key, || {
            PackedConv::new(&wb, w_signed, (m, depth, g), quad_taps, depthwise, &zw)
        })?;
        let conv = Conv2d {
            n: nb,
            c,
            h,
            w: wd,
            m,
            group: g,
            kh,
            kw,
            geo: &geo2,
        };
        let input = qconv::Input {
            x: &xb,
            signed: x_signed,
            zx,
        };
        let r = crate::par::serial_below(conv.macs(), || qconv::run(&conv, &input, &packed, out))?;
        let mut shape = vec![nb, m];
        shape.extend_from_slice(&geo.out);
        Some((shape, r))
    }
}

fn build_conv_integer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let conv = inner_kernel(n, "Conv", 11, &CONV_ATTRS)?;
    let fast = FastQConv::new(n)?;
    let cache = fast.cache.clone();
    let inner = kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let w = input(&op, inputs, 1)?;
        if let Some((shape, qconv::Result::Int32(v))) = fast.run(
            &op,
            (x, opt_input(inputs, 2)),
            (w, opt_input(inputs, 3)),
            &qconv::Output::Int32,
        ) {
            return one(Tensor::from_vec(&shape, v));
        }
        let (shape, v) = integer_product(
            &op,
            conv.as_ref(),
            (x, "x", opt_input(inputs, 2), 1),
            (w, "w", opt_input(inputs, 3), 0),
            conv_depth(w),
        )?;
        let v = v.into_f64();
        let v: Vec<i32> = v.into_iter().map(|x| x as i32).collect();
        one(Tensor::from_vec(&shape, v))
    });
    Ok(Box::new(PackedInput {
        inner,
        cache,
        index: 1,
    }))
}

fn build_qlinear_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let conv = inner_kernel(n, "Conv", 11, &CONV_ATTRS)?;
    let fast = FastQConv::new(n)?;
    let cache = fast.cache.clone();
    let inner = kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let w = input(&op, inputs, 3)?;
        let sx = scalar_f64(&op, "x_scale", input(&op, inputs, 1)?)?;
        let ws = input(&op, inputs, 4)?;
        let wsv = float_values(&op, "w_scale", ws)?;
        let sy = scalar_f64(&op, "y_scale", input(&op, inputs, 6)?)?;
        let m = w.shape().first().copied().unwrap_or(0);
        if wsv.len() != 1 && wsv.len() != m {
            bail!(
                "{op}: w_scale must have 1 or {m} values, got shape {:?}",
                ws.shape()
            );
        }
        let bias = match opt_input(inputs, 8) {
            Some(b) => {
                if b.elem_type() != ElementType::Int32 || b.shape() != [m] {
                    bail!(
                        "{op}: B must be int32 of shape [{m}], got {} {:?}",
                        b.elem_type(),
                        b.shape()
                    );
                }
                b.to_f64_vec()
            }
            None => vec![0.0; m],
        };
        let ty = input(&op, inputs, 1)?.elem_type();
        let factors: Vec<f64> = (0..m)
            .map(|c| scale_factor(ty, sx, if wsv.len() == 1 { wsv[0] } else { wsv[c] }, sy))
            .collect();
        let yzp = input(&op, inputs, 7)?;
        if let Some((zy, signed)) = output_zero_point(yzp)
            && let Some((shape, qconv::Result::Bytes(v))) = fast.run(
                &op,
                (x, opt_input(inputs, 2)),
                (w, opt_input(inputs, 5)),
                &qconv::Output::Bytes {
                    bias: &bias,
                    factors: &factors,
                    zy,
                    signed,
                },
            )
        {
            return one(byte_tensor(&shape, v, signed));
        }
        let (shape, acc) = integer_product(
            &op,
            conv.as_ref(),
            (x, "x", opt_input(inputs, 2), 1),
            (w, "w", opt_input(inputs, 5), 0),
            conv_depth(w),
        )?;
        let plane: usize = shape.get(2..).map_or(1, |s| s.iter().product());
        if let Some(t) = crate::fast::enabled()
            .then(|| requantize_planes(&acc, &shape, plane, &bias, &factors, yzp))
            .flatten()
        {
            return one(Ok(t));
        }
        // Channel by channel: each run of `plane` accumulators shares one bias and one factor.
        let mut acc = acc.into_f64();
        for (k, run) in acc.chunks_mut(plane.max(1)).enumerate() {
            let c = k % m.max(1);
            let (b, f) = (bias.get(c).copied().unwrap_or(0.0), factors.get(c).copied());
            let f = f.unwrap_or(0.0);
            for a in run {
                // The factor multiplies `acc + bias`, as one f64 product per element.
                *a = (*a + b) * f;
            }
        }
        one(requantize(&op, &shape, &acc, |_| 1.0, yzp))
    });
    Ok(Box::new(PackedInput {
        inner,
        cache,
        index: 3,
    }))
}

/// QLinearConv's requantization in one pass to uint8 or int8 with a scalar zero point:
/// `round((acc + bias[c]) · factor[c] + zp)` saturated, channel `c` per run of `plane`
/// accumulators, as [`requantize`] computes it. `None` for other output types.
fn requantize_planes(
    acc: &Acc,
    shape: &[usize],
    plane: usize,
    bias: &[f64],
    factors: &[f64],
    yzp: &TensorRef<'_>,
) -> Option<Tensor> {
    let (z, lo, hi, signed) = match yzp {
        TensorRef::U8(z) if z.len() == 1 => (f64::from(*z.iter().next()?), 0.0, 255.0, false),
        TensorRef::I8(z) if z.len() == 1 => (f64::from(*z.iter().next()?), -128.0, 127.0, true),
        _ => return None,
    };
    let (m, plane) = (factors.len().max(1), plane.max(1));
    fn go(
        get: impl Fn(usize) -> f64,
        n: usize,
        (plane, m): (usize, usize),
        (bias, factors): (&[f64], &[f64]),
        (z, lo, hi, signed): (f64, f64, f64, bool),
    ) -> Vec<u8> {
        let mut out = vec![0u8; n];
        for (k, run) in out.chunks_mut(plane).enumerate() {
            let c = k % m;
            let (b, f) = (bias.get(c).copied().unwrap_or(0.0), factors.get(c).copied());
            let f = f.unwrap_or(0.0);
            let off = if signed { 128.0 } else { 0.0 };
            for (i, o) in run.iter_mut().enumerate() {
                let d = (get(k * plane + i) + b) * f + z;
                let q = if d.is_nan() {
                    0.0
                } else {
                    round_even_f64(d).max(lo).min(hi)
                };
                let byte = low_byte((q + off) as f32);
                *o = if signed { byte ^ 0x80 } else { byte };
            }
        }
        out
    }
    let args = ((plane, m), (bias, factors), (z, lo, hi, signed));
    let bytes = match acc {
        Acc::One(v) => go(|i| f64::from(v[i]), v.len(), args.0, args.1, args.2),
        Acc::Split { hi, lo } => go(
            |i| f64::from(hi[i]) * 16.0 + f64::from(lo[i]),
            hi.len(),
            args.0,
            args.1,
            args.2,
        ),
        Acc::Wide(v) => go(|i| v[i], v.len(), args.0, args.1, args.2),
    };
    if signed {
        Tensor::from_vec(
            shape,
            bytes.into_iter().map(|b| b as i8).collect::<Vec<i8>>(),
        )
        .ok()
    } else {
        Tensor::from_vec(shape, bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::{ArrayD, IxDyn};

    /// DynamicQuantizeLinear's range holds 0, passes over NaN, and does not depend on where
    /// a value sits among the lanes or the remainder.
    #[test]
    fn dynamic_range_holds_zero_and_passes_over_nan() {
        for len in [0, 5, 16, 37, 200] {
            let mut v: Vec<f32> = (0..len)
                .map(|i| (i as f32 * 0.7).sin() * 3.0 + 4.0)
                .collect();
            let (lo, hi) = range_with_zero(&v);
            assert_eq!(lo, 0.0, "all positive: the range reaches down to 0 ({len})");
            let want = v.iter().copied().fold(0.0f32, f32::max);
            assert_eq!(hi, want, "{len}");
            if len > 0 {
                v[len / 2] = f32::NAN;
                v[len - 1] = -9.5;
                let (lo, hi2) = range_with_zero(&v);
                assert_eq!(lo, -9.5, "{len}");
                assert!(!hi2.is_nan() && hi2 <= hi, "{len}");
            }
        }
        assert_eq!(range_with_zero(&[f32::NAN; 20]), (0.0, 0.0));
    }

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    fn t<T: crate::tensor::Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    /// Integer products deep enough that float32 partial sums could pass 2^24 take the split
    /// path, and those too deep for it the f64 one: all three give the exact integer sums.
    #[test]
    fn integer_products_are_exact_on_every_path() {
        // depth · 255 · 127: 60 (one float32 product), 800 (split), 5000 (f64).
        for k in [60usize, 800, 5000] {
            let a: Vec<u8> = (0..2 * k)
                .map(|i| if i % 3 == 0 { 0 } else { 255 })
                .collect();
            let b: Vec<i8> = (0..k * 3)
                .map(|i| match i % 4 {
                    0 => 127,
                    1 => -128,
                    2 => 127,
                    _ => -1,
                })
                .collect();
            let mut want = vec![0i64; 2 * 3];
            for r in 0..2 {
                for c in 0..3 {
                    want[r * 3 + c] = (0..k)
                        .map(|j| (i64::from(a[r * k + j]) - 3) * i64::from(b[j * 3 + c]))
                        .sum();
                }
            }
            let o = run(
                NodeDef::new("MatMulInteger", 10).with_io(4, 1),
                vec![
                    Some(t(&[2, k], a)),
                    Some(t(&[k, 3], b)),
                    Some(Tensor::scalar(3u8)),
                    Some(Tensor::scalar(0i8)),
                ],
            )
            .unwrap();
            let got: Vec<i64> = o[0]
                .as_array::<i32>()
                .unwrap()
                .iter()
                .map(|&v| i64::from(v))
                .collect();
            assert_eq!(got, want, "depth {k}");
        }
    }

    /// A stream of pseudo-random bytes.
    fn byte_rng(seed: u64) -> impl FnMut() -> u8 {
        let mut words = crate::fast::qgemm::tests::lcg(seed);
        move || words() as u8
    }

    /// `v` as a uint8 tensor, or as int8 bits.
    fn bytes_tensor(v: &[u8], shape: &[usize], signed: bool) -> Tensor {
        if signed {
            t(shape, v.iter().map(|&b| b as i8).collect::<Vec<i8>>())
        } else {
            t(shape, v.to_vec())
        }
    }

    /// `node` on `inputs` gives the reference level's output at every fast level this CPU
    /// has (it says which it skipped).
    fn assert_levels_agree(node: &NodeDef, inputs: &[Option<Tensor>], case: &str) {
        let reference = crate::fast::ISAS
            .iter()
            .find(|i| !i.fast)
            .expect("a reference level");
        let op = &node.op_type;
        let want = crate::fast::with_isa(reference, || run(node.clone(), inputs.to_vec()))
            .expect("the reference level")
            .unwrap();
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            let Some(got) = crate::fast::with_isa(isa, || run(node.clone(), inputs.to_vec()))
            else {
                println!("{op}: {} skipped (this CPU lacks it)", isa.name);
                continue;
            };
            let got = got.unwrap();
            assert_eq!(got[0].shape(), want[0].shape(), "{op} {case}");
            assert_eq!(got[0].elem_type(), want[0].elem_type(), "{op} {case}");
            assert_eq!(
                got[0].view().to_f64_vec(),
                want[0].view().to_f64_vec(),
                "{op} {case} on {}",
                isa.name
            );
        }
    }

    /// Weights marked as the program's constant are packed once and matched by where they lie,
    /// with no copy kept; other bytes (or the same bytes elsewhere) are compared as before.
    #[test]
    fn a_constant_is_packed_once_and_other_weights_are_still_compared() {
        let cache = PackCache::<usize>::default();
        let w = vec![1u8, 2, 3, 4];
        let copy = w.clone();
        let other = vec![9u8, 2, 3, 4];
        let made = std::cell::Cell::new(0);
        let get = |bytes: &[u8]| {
            cache
                .get(bytes, &[0], [4, 1, 1, 0], || {
                    made.set(made.get() + 1);
                    Some(usize::from(bytes[0]))
                })
                .map(|p| *p)
        };
        cache.mark_constant(&w);
        assert_eq!(get(&w), Some(1));
        assert!(matches!(
            cache.slot.lock().unwrap().as_ref().map(|s| &s.0),
            Some(Packed::Constant(..))
        ));
        assert_eq!((get(&w), made.get()), (Some(1), 1), "packed once");
        // Equal bytes at another address are compared, and kept as a copy.
        assert_eq!((get(&copy), made.get()), (Some(1), 2));
        assert_eq!((get(&copy), made.get()), (Some(1), 2));
        assert_eq!((get(&other), made.get()), (Some(9), 3));
        assert_eq!((get(&w), made.get()), (Some(1), 4));
    }

    /// The 8-bit matrix product fast path ([`qmatmul`]) on every level gives the general
    /// path's exact answers: MatMulInteger and QLinearMatMul, uint8 and int8 operands and
    /// outputs, per-column zero points of B, a 2-D B and a batched one.
    #[test]
    fn fast_integer_matmul_equals_the_general_path() {
        let mut rnd = byte_rng(5);
        let cases: [(&[usize], &[usize]); 5] = [
            (&[5, 37], &[37, 19]),
            (&[2, 3, 70], &[70, 40]),
            (&[2, 9, 33], &[2, 33, 7]),
            (&[1, 65], &[65, 1]),
            (&[21, 64], &[64, 70]),
        ];
        for (ci, (sa, sb)) in cases.into_iter().enumerate() {
            let n = sb[sb.len() - 1];
            let ab: Vec<u8> = (0..sa.iter().product()).map(|_| rnd()).collect();
            let bb: Vec<u8> = (0..sb.iter().product()).map(|_| rnd()).collect();
            for (a_signed, b_signed, per_column, y_signed) in [
                (false, true, false, false),
                (true, true, true, true),
                (false, false, true, false),
                (true, false, false, true),
            ] {
                let bytes = bytes_tensor;
                let a = bytes(&ab, sa, a_signed);
                let b = bytes(&bb, sb, b_signed);
                let za = bytes(&[rnd()], &[], a_signed);
                let zb = if per_column && sb.len() == 2 {
                    bytes(&(0..n).map(|_| rnd()).collect::<Vec<u8>>(), &[n], b_signed)
                } else {
                    bytes(&[rnd()], &[], b_signed)
                };
                let zy = bytes(&[rnd()], &[], y_signed);
                let fast = FastQMatMul::default();
                let portable = crate::fast::ISAS.iter().find(|i| i.key == "portable");
                let taken = crate::fast::with_isa(portable.expect("a portable level"), || {
                    fast.run(
                        (&a.view(), Some(&za.view())),
                        (&b.view(), Some(&zb.view())),
                        &qmatmul::Output::Int32,
                    )
                    .is_some()
                });
                assert_eq!(taken, Some(true), "case {ci}");
                // The VNNI kernel takes every case too, where the CPU has it.
                let vnni = crate::fast::ISAS.iter().find(|i| i.vnni);
                let taken = crate::fast::with_isa(vnni.expect("a VNNI level"), || {
                    FastQMatMul::default()
                        .run(
                            (&a.view(), Some(&za.view())),
                            (&b.view(), Some(&zb.view())),
                            &qmatmul::Output::Int32,
                        )
                        .is_some()
                });
                match taken {
                    Some(t) => assert!(t, "case {ci} on the VNNI level"),
                    None => println!("qmatmul case {ci}: VNNI kernel skipped (no AVX-512 VNNI)"),
                }
                let integer = vec![
                    Some(a.clone()),
                    Some(b.clone()),
                    Some(za.clone()),
                    Some(zb.clone()),
                ];
                let b_scale = if per_column && sb.len() == 2 {
                    t(
                        &[n],
                        (0..n)
                            .map(|j| 0.011 + j as f32 * 1e-3)
                            .collect::<Vec<f32>>(),
                    )
                } else {
                    Tensor::scalar(0.011f32)
                };
                let qlinear = vec![
                    Some(a.clone()),
                    Some(Tensor::scalar(0.03f32)),
                    Some(za.clone()),
                    Some(b.clone()),
                    Some(b_scale),
                    Some(zb.clone()),
                    Some(Tensor::scalar(0.9f32)),
                    Some(zy.clone()),
                ];
                for (op, inputs) in [("MatMulInteger", integer), ("QLinearMatMul", qlinear)] {
                    let k = NodeDef::new(op, 10).with_io(inputs.len(), 1);
                    let case = format!("case {ci} ({a_signed}, {b_signed}, {per_column})");
                    assert_levels_agree(&k, &inputs, &case);
                }
            }
        }
    }

    /// The 8-bit convolution fast path ([`qconv`]) on every level gives the general path's
    /// exact answers: QLinearConv and ConvInteger, uint8 and int8 inputs, weights and outputs,
    /// per-tensor and per-channel weight zero points, for the GEMM (with im2col, with the input
    /// in channel quads, and 1×1), depthwise, grouped, strided, dilated, asymmetrically padded
    /// and 1-D cases.
    #[test]
    fn fast_integer_convolution_equals_the_general_path() {
        let mut rnd = byte_rng(17);
        let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
        // (x shape, w shape, group, strides, pads, dilations)
        type Case = (Vec<usize>, Vec<usize>, i64, Vec<i64>, Vec<i64>, Vec<i64>);
        let cases: Vec<Case> = vec![
            (
                vec![1, 5, 9, 11],
                vec![7, 5, 3, 3],
                1,
                vec![1, 1],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            (
                vec![2, 6, 8, 8],
                vec![9, 6, 1, 1],
                1,
                vec![1, 1],
                vec![0, 0, 0, 0],
                vec![1, 1],
            ),
            (
                vec![1, 6, 10, 9],
                vec![6, 1, 3, 3],
                6,
                vec![2, 2],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            (
                vec![1, 8, 7, 7],
                vec![6, 4, 3, 3],
                2,
                vec![1, 2],
                vec![2, 1, 0, 2],
                vec![2, 2],
            ),
            (
                vec![1, 4, 50],
                vec![5, 4, 7],
                1,
                vec![3],
                vec![3, 2],
                vec![1],
            ),
            (
                vec![1, 5, 9, 13],
                vec![5, 1, 3, 3],
                5,
                vec![2, 2],
                vec![0, 3, 1, 0],
                vec![1, 1],
            ),
            (
                vec![1, 3, 40, 36],
                vec![40, 3, 3, 3],
                1,
                vec![2, 2],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            // Stride 1 over whole channel quads (the input laid out in quads): two images,
            // then groups with dilation and asymmetric pads on rows longer than a panel, then
            // no padding at all.
            (
                vec![2, 8, 9, 11],
                vec![6, 8, 3, 3],
                1,
                vec![1, 1],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            (
                vec![1, 8, 12, 35],
                vec![6, 4, 3, 5],
                2,
                vec![1, 1],
                vec![0, 2, 3, 1],
                vec![2, 1],
            ),
            (
                vec![1, 4, 5, 70],
                vec![3, 4, 2, 2],
                1,
                vec![1, 1],
                vec![0, 0, 0, 0],
                vec![1, 1],
            ),
        ];
        for (ci, (xs, ws, group, strides, pads, dil)) in cases.into_iter().enumerate() {
            let nx: usize = xs.iter().product();
            let nw: usize = ws.iter().product();
            let m = ws[0];
            let xb: Vec<u8> = (0..nx).map(|_| rnd()).collect();
            let wb: Vec<u8> = (0..nw).map(|_| rnd()).collect();
            for (x_signed, w_signed, per_channel, y_signed) in [
                (false, true, false, false),
                (true, true, true, true),
                (false, false, true, true),
                (true, false, false, false),
            ] {
                let bytes = bytes_tensor;
                let x = bytes(&xb, &xs, x_signed);
                let w = bytes(&wb, &ws, w_signed);
                let zx = bytes(&[rnd()], &[], x_signed);
                let zw = if per_channel {
                    let z: Vec<u8> = (0..m).map(|_| rnd()).collect();
                    bytes(&z, &[m], w_signed)
                } else {
                    bytes(&[rnd()], &[], w_signed)
                };
                let zy = bytes(&[rnd()], &[], y_signed);
                let bias = t(
                    &[m],
                    (0..m).map(|i| i as i32 * 977 - 3000).collect::<Vec<i32>>(),
                );
                let ws_scale = t(
                    &[m],
                    (0..m)
                        .map(|i| 0.002 + i as f32 * 1e-4)
                        .collect::<Vec<f32>>(),
                );
                let node = |op: &str, io: usize| {
                    NodeDef::new(op, 10)
                        .with_io(io, 1)
                        .with_attr("group", AttrValue::Int(group))
                        .with_attr("strides", ints(&strides))
                        .with_attr("pads", ints(&pads))
                        .with_attr("dilations", ints(&dil))
                };
                let qlinear = vec![
                    Some(x.clone()),
                    Some(Tensor::scalar(0.05f32)),
                    Some(zx.clone()),
                    Some(w.clone()),
                    Some(ws_scale.clone()),
                    Some(zw.clone()),
                    Some(Tensor::scalar(0.7f32)),
                    Some(zy.clone()),
                    Some(bias.clone()),
                ];
                let integer = vec![
                    Some(x.clone()),
                    Some(w.clone()),
                    Some(zx.clone()),
                    Some(zw.clone()),
                ];
                // The fast path takes every case (else this would compare the general path
                // with itself).
                let fast = FastQConv::new(&node("ConvInteger", 4)).unwrap();
                let portable = crate::fast::ISAS.iter().find(|i| i.key == "portable");
                let taken = crate::fast::with_isa(portable.expect("a portable level"), || {
                    fast.run(
                        "ConvInteger",
                        (&x.view(), Some(&zx.view())),
                        (&w.view(), Some(&zw.view())),
                        &qconv::Output::Int32,
                    )
                    .is_some()
                });
                assert_eq!(taken, Some(true), "case {ci}");
                for (op, inputs) in [("QLinearConv", qlinear), ("ConvInteger", integer)] {
                    let k = node(op, inputs.len());
                    let case = format!("case {ci} ({x_signed}, {w_signed}, {per_channel})");
                    assert_levels_agree(&k, &inputs, &case);
                }
            }
        }
    }

    /// QLinearConv's one-pass requantization gives [`requantize`]'s bytes for each kind of
    /// accumulator, to uint8 and int8, ties and saturation included.
    #[test]
    fn one_pass_requantization_equals_the_general_one() {
        let (m, plane) = (3, 5);
        let acc: Vec<f64> = (0..2 * m * plane)
            .map(|i| (i as f64 - 12.0) * 37.5)
            .collect();
        let bias = [4.0, -900.0, 0.0];
        let factors = [0.02, 0.1, 1.0 / 3.0];
        let halves = |v: &[f64]| -> (Vec<f32>, Vec<f32>) {
            let lo: Vec<f32> = v.iter().map(|x| (*x as f32).rem_euclid(16.0)).collect();
            let hi = v
                .iter()
                .zip(&lo)
                .map(|(x, l)| (*x as f32 - l) / 16.0)
                .collect();
            (hi, lo)
        };
        let ints: Vec<f64> = acc.iter().map(|x| x.round()).collect();
        let (hi, lo) = halves(&ints);
        let kinds = [
            Acc::One(ints.iter().map(|&x| x as f32).collect()),
            Acc::Split { hi, lo },
            Acc::Wide(ints.clone()),
        ];
        let shape = [2, m, plane];
        for zp in [Tensor::scalar(7u8), Tensor::scalar(-5i8)] {
            let scaled: Vec<f64> = ints
                .iter()
                .enumerate()
                .map(|(i, a)| (a + bias[(i / plane) % m]) * factors[(i / plane) % m])
                .collect();
            let want = requantize("QLinearConv", &shape, &scaled, |_| 1.0, &zp.view()).unwrap();
            for acc in &kinds {
                let got = requantize_planes(acc, &shape, plane, &bias, &factors, &zp.view())
                    .expect("uint8 and int8 take the one-pass path");
                assert_eq!(got.view().to_f64_vec(), want.view().to_f64_vec());
            }
        }
    }

    /// The per-tensor float32 / 8-bit paths of QuantizeLinear and DequantizeLinear give what
    /// the general path gives: ties to even, saturation, NaN to the zero point.
    #[test]
    fn quantize_fast_path_rounds_like_the_general_path() {
        let xs = vec![
            0.0f32,
            0.25,
            0.75,
            1.25,
            -0.25,
            -1.25,
            2.5,
            1e9,
            -1e9,
            f32::NAN,
            63.5,
            -64.5,
        ];
        for (zp, ty) in [
            (Tensor::scalar(128u8), ElementType::Uint8),
            (Tensor::scalar(-3i8), ElementType::Int8),
        ] {
            let x = t(&[xs.len()], xs.clone());
            let s = Tensor::scalar(0.5f32);
            let fast = quantize_f32_per_tensor(&x.view(), &s.view(), Some(&zp.view()), ty, 0, 0)
                .expect("the fast path takes it");
            // The general path, through f64: a scale of two elements (per axis) declines the
            // fast path.
            let o = run(
                NodeDef::new("QuantizeLinear", 21).with_attr("axis", AttrValue::Int(0)),
                vec![
                    Some(t(&[2, xs.len() / 2], xs.clone())),
                    Some(t(&[2], vec![0.5f32, 0.5])),
                    Some(match &zp {
                        Tensor::U8(_) => t(&[2], vec![128u8, 128]),
                        _ => t(&[2], vec![-3i8, -3]),
                    }),
                ],
            )
            .unwrap();
            assert_eq!(fast.view().to_f64_vec(), o[0].view().to_f64_vec(), "{ty}");
            let back = dequantize_8bit_per_tensor(&fast.view(), &s.view(), Some(&zp.view()), 0)
                .expect("the fast path takes it");
            let general = run(
                NodeDef::new("DequantizeLinear", 21).with_attr("axis", AttrValue::Int(0)),
                vec![
                    Some(o[0].clone()),
                    Some(t(&[2], vec![0.5f32, 0.5])),
                    Some(match &zp {
                        Tensor::U8(_) => t(&[2], vec![128u8, 128]),
                        _ => t(&[2], vec![-3i8, -3]),
                    }),
                ],
            )
            .unwrap();
            assert_eq!(
                back.view().to_f64_vec(),
                general[0].view().to_f64_vec(),
                "{ty}"
            );
        }
    }

    #[test]
    fn quantize_dequantize() {
        let x = t(&[4], vec![0.0f32, 2.5, -3.0, 1000.0]);
        let n = NodeDef::new("QuantizeLinear", 21);
        let o = run(
            n.clone(),
            vec![
                Some(x.clone()),
                Some(Tensor::scalar(1.0f32)),
                Some(Tensor::scalar(1i8)),
            ],
        )
        .unwrap();
        assert_eq!(o[0], t(&[4], vec![1i8, 3, -2, 127]));
        let o = run(
            n.clone(),
            vec![Some(x.clone()), Some(Tensor::scalar(1.0f32)), None],
        )
        .unwrap();
        assert_eq!(o[0], t(&[4], vec![0u8, 2, 0, 255]));
        // Per axis.
        let x2 = t(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]);
        let o = run(
            n.clone().with_attr("axis", AttrValue::Int(0)),
            vec![Some(x2.clone()), Some(t(&[2], vec![1.0f32, 2.0])), None],
        )
        .unwrap();
        assert_eq!(o[0], t(&[2, 2], vec![1u8, 2, 2, 2]));
        let e = run(
            n.clone(),
            vec![Some(x2.clone()), Some(t(&[3], vec![1.0f32; 3])), None],
        )
        .unwrap_err();
        assert!(
            e.0.contains("scale of shape [3] must be a scalar or have shape [2]"),
            "{e}"
        );
        // Blocked.
        let o = run(
            n.clone()
                .with_attr("axis", AttrValue::Int(1))
                .with_attr("block_size", AttrValue::Int(2)),
            vec![Some(x2.clone()), Some(t(&[2, 1], vec![1.0f32, 2.0])), None],
        )
        .unwrap();
        assert_eq!(o[0], t(&[2, 2], vec![1u8, 2, 2, 2]));
        let d = NodeDef::new("DequantizeLinear", 21);
        let o = run(
            d.clone(),
            vec![
                Some(t(&[2], vec![10u8, 0])),
                Some(Tensor::scalar(0.5f32)),
                Some(Tensor::scalar(2u8)),
            ],
        )
        .unwrap();
        assert_eq!(o[0], t(&[2], vec![4.0f32, -1.0]));
        let e = run(
            d,
            vec![
                Some(t(&[2], vec![1.0f32, 0.0])),
                Some(Tensor::scalar(0.5f32)),
                None,
            ],
        )
        .unwrap_err();
        assert!(
            e.0.contains("x has unsupported element type float32"),
            "{e}"
        );
    }

    #[test]
    fn dynamic_and_integer_matmul() {
        let x = t(&[3], vec![0.0f32, 2.0, -3.0]);
        let o = run(NodeDef::new("DynamicQuantizeLinear", 11), vec![Some(x)]).unwrap();
        let s = 5.0f32 / 255.0;
        assert_eq!(o[1], Tensor::scalar(s));
        assert_eq!(o[2], Tensor::scalar(153u8));
        let a = t(&[1, 2], vec![3u8, 4]);
        let b = t(&[2, 1], vec![1u8, 2]);
        let o = run(
            NodeDef::new("MatMulInteger", 10),
            vec![
                Some(a.clone()),
                Some(b.clone()),
                Some(Tensor::scalar(1u8)),
                None,
            ],
        )
        .unwrap();
        assert_eq!(o[0], t(&[1, 1], vec![2i32 + 6]));
        let e = run(
            NodeDef::new("MatMulInteger", 10),
            vec![Some(a.clone()), Some(t(&[3, 1], vec![1u8, 2, 3]))],
        )
        .unwrap_err();
        assert!(e.0.starts_with("MatMulInteger: "), "{e}");
        let o = run(
            NodeDef::new("QLinearMatMul", 10),
            vec![
                Some(a),
                Some(Tensor::scalar(0.5f32)),
                Some(Tensor::scalar(0u8)),
                Some(b),
                Some(Tensor::scalar(2.0f32)),
                Some(Tensor::scalar(0u8)),
                Some(Tensor::scalar(1.0f32)),
                Some(Tensor::scalar(1u8)),
            ],
        )
        .unwrap();
        assert_eq!(o[0], t(&[1, 1], vec![12u8]));
        let x = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1, 1, 2, 2]), vec![1, 2, 3, 4]).unwrap());
        let w = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1, 1, 1, 1]), vec![2]).unwrap());
        let o = run(NodeDef::new("ConvInteger", 10), vec![Some(x), Some(w)]).unwrap();
        assert_eq!(o[0], t(&[1, 1, 2, 2], vec![2i32, 4, 6, 8]));
    }
}
