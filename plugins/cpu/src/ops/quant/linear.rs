//! QuantizeLinear / DequantizeLinear (per-tensor, per-axis and blocked, with the 8-, 16- and
//! 32-bit integer types) and DynamicQuantizeLinear. The per-tensor 8-bit forms run in one
//! vectorized pass; the general code computes in f64 and is what the reference level runs.

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::fast::round::{low_byte, round_even_f32, round_even_f64};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::narrow::{I2, I4, NarrowCast, U2, U4};
use crate::ops::util::args::{input, normalize_axis, opt_input};
use crate::ops::util::indexing::contiguous;
use crate::ops::util::indexing::{c_strides, for_each_index};
use crate::ops::util::num::{float_values, is_float_type, tensor_from_f64};
use crate::tensor::{Tensor, TensorRef};
use epx_plugin_api::ElementType;

pub fn register(reg: &mut Registry) {
    add(reg, "QuantizeLinear", 10, build_quantize);
    add(reg, "DequantizeLinear", 10, build_dequantize);
    add(reg, "DynamicQuantizeLinear", 11, build_dynamic);
}

/// The range of an integer element type the quantizers support.
pub(crate) fn int_range(op: &str, ty: ElementType) -> OpResult<(i64, i64)> {
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
pub(crate) fn is_narrow_float(ty: ElementType) -> bool {
    use ElementType::*;
    matches!(
        ty,
        Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ | Float4E2M1
    )
}

/// A float8 zero point must be zero (ONNX: the formula keeps it only for symmetry).
pub(crate) fn check_float8_zero(op: &str, ty: ElementType, zp: &[f64]) -> OpResult<()> {
    if ty != ElementType::Float4E2M1 && zp.iter().any(|&z| z != 0.0) {
        bail!("{op}: a {ty} zero point must be zero");
    }
    Ok(())
}

/// The integer values of a quantized tensor (2- to 32-bit integers).
pub(crate) fn int_values(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<Vec<i64>> {
    int_range(op, t.elem_type()).map_err(|_| {
        OpError(format!(
            "{op}: {what} has unsupported element type {}",
            t.elem_type()
        ))
    })?;
    t.to_i64_vec(&format!("{op}: {what}"))
}

/// A tensor of integer type `ty` from values already inside its range.
pub(crate) fn int_tensor(ty: ElementType, shape: &[usize], v: Vec<i64>) -> OpResult<Tensor> {
    Tensor::from_vec(shape, v)?.view().cast(ty)
}

/// For each element of `xs`, the index of its scale / zero point: per tensor (one element),
/// per axis (1-D of `xs[axis]` values) or blocked (same rank, `block_size` along `axis`).
pub(crate) fn param_index(
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

pub(crate) fn check_zp_shape(op: &str, scale: &TensorRef<'_>, zp: &TensorRef<'_>) -> OpResult<()> {
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
    let x = contiguous(xv);
    let piece = crate::par::chunk_len(x.len(), 16 << 10, 64);
    // Memory that is not there: the general path reports it.
    let buf = crate::scratch::take(x.len()).ok()?;
    let y = crate::par::build_vec(buf, x.len(), piece, |at, f| {
        let x = &x[at..][..piece.min(x.len() - at)];
        crate::fast::qbytes::quantize_append(x, (s, z), signed, f);
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
        (TensorRef::U8(xv), None) => each_piece(&contiguous(xv), piece, |x, o| {
            dequantize_u8(x, s, 0.0, o);
        }),
        (TensorRef::U8(xv), Some(TensorRef::U8(z))) if z.len() == 1 => {
            let z = f32::from(*z.iter().next()?);
            each_piece(&contiguous(xv), piece, |x, o| dequantize_u8(x, s, z, o))
        }
        (TensorRef::I8(xv), None) => each_piece(&contiguous(xv), piece, |x, o| {
            dequantize_i8(x, s, 0.0, o);
        }),
        (TensorRef::I8(xv), Some(TensorRef::I8(z))) if z.len() == 1 => {
            let z = f32::from(*z.iter().next()?);
            each_piece(&contiguous(xv), piece, |x, o| dequantize_i8(x, s, z, o))
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
        // To float32 as ONNX Runtime computes it: the difference (exact) rounded to float32,
        // times the float32 scale. For int32 values past 2^24 (a bias) the two roundings give
        // other bits than one rounding of the exact product.
        let f32_out = out_ty == ElementType::Float;
        let y: Vec<f64> = xv
            .iter()
            .zip(&pidx)
            .map(|(&v, &k)| {
                let d = v - zv.get(k).copied().unwrap_or(0.0);
                let s = sv.get(k).copied().unwrap_or(0.0);
                if f32_out {
                    f64::from(d as f32 * s as f32)
                } else {
                    d * s
                }
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
        let (y, scale, zp) = quantize_dynamic_u8(&contiguous(&view));
        Ok(vec![
            Tensor::from_vec(x.shape(), y)?,
            Tensor::scalar(scale),
            Tensor::scalar(zp),
        ])
    }))
}

/// DynamicQuantizeLinear of `xv`: the bytes, the scale and the zero point, as ONNX Runtime
/// computes them (also the activations of DynamicQuantizeLSTM's products).
pub(crate) fn quantize_dynamic_u8(xv: &[f32]) -> (Vec<u8>, f32, u8) {
    let (scale, zp) = dynamic_u8_params(xv);
    let mut y = vec![zp as u8; xv.len()];
    if scale != 0.0 && crate::fast::enabled() {
        dynamic_quantize(xv, scale, zp, &mut y);
    } else if scale != 0.0 {
        for (o, &v) in y.iter_mut().zip(xv.iter()) {
            *o = ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) as u8;
        }
    }
    // An input of zeros alone has no range: ONNX Runtime gives scale 1 (the values are the zero
    // point either way), so a product scaled by it is 0 and never NaN.
    let scale = if scale == 0.0 { 1.0 } else { scale };
    (y, scale, zp as u8)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::tests::*;

    use crate::kernel::{AttrValue, NodeDef};
    use crate::tensor::Tensor;

    /// An int32 value past 2^24 dequantizes as ONNX Runtime does: the value rounded to float32,
    /// then multiplied by the scale in float32 (not one rounding of the exact product).
    #[test]
    fn int32_dequantizes_in_float32_steps() {
        let x = 16_777_217i32; // 2^24 + 1: float32 rounds it to 2^24
        let scale = 1.1f32;
        let out = run(
            NodeDef::new("DequantizeLinear", 21).with_io(2, 1),
            vec![Some(t(&[1], vec![x])), Some(Tensor::scalar(scale))],
        )
        .unwrap();
        let got = out[0].as_array::<f32>().unwrap()[[0]];
        assert_eq!(got, x as f32 * scale);
        assert_ne!(
            got,
            (f64::from(x) * f64::from(scale)) as f32,
            "the case tells them apart"
        );
    }

    /// A tensor of zeros quantizes to its zero point 0 with scale 1, as ONNX Runtime gives it.
    #[test]
    fn dynamic_quantization_of_zeros_has_scale_one() {
        let out = run(
            NodeDef::new("DynamicQuantizeLinear", 11).with_io(1, 3),
            vec![Some(t(&[3], vec![0.0f32; 3]))],
        )
        .unwrap();
        assert_eq!(
            out[0]
                .as_array::<u8>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [0; 3]
        );
        assert_eq!(
            out[1]
                .as_array::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [1.0]
        );
        assert_eq!(
            out[2]
                .as_array::<u8>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [0]
        );
    }

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
}
