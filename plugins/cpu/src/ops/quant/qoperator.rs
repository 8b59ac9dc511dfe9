//! The quantized operators of ONNX Runtime's QOperator format (`com.microsoft`): QLinearAdd,
//! QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool, QLinearGlobalAveragePool,
//! QLinearConcat, QLinearSoftmax and its QuantizeLinear / DequantizeLinear; and the CPU EP's
//! own QLinearDivByConstant, which the QDQ planning writes. Each is defined as dequantize, the
//! float op, quantize, built as a [`Composite`] of ONNX kernels; 8-bit operands with scalar
//! parameters take one pass over the bytes ([`crate::fast::qbytes`]) instead.

use crate::error::OpResult;
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, add_epx, add_ms};
use crate::ops::composite::Arg;
use crate::ops::composite::Composite;
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    // `QuantizeLinear(DequantizeLinear(X) / D)` for a float32 constant D:
    // `(X, X_scale, X_zp, D, Y_scale, Y_zp)` (the QDQ folding writes it; see `qdq.rs`).
    add_epx(reg, "QLinearDivByConstant", build_qlinear_div_by_constant);
    // The quantized operators its QOperator format writes: dequantize, the float op, quantize.
    add_ms(reg, "QLinearAdd", |n| {
        Ok(Box::new(qlinear_binary(n, "Add")?))
    });
    add_ms(reg, "QLinearMul", |n| {
        Ok(Box::new(qlinear_binary(n, "Mul")?))
    });
    add_ms(reg, "QLinearSigmoid", |n| {
        qlinear_unary(n, "Sigmoid", 13, &[])
    });
    add_ms(reg, "QLinearLeakyRelu", |n| {
        let alpha = n.attr_float_or("alpha", 0.01)?;
        qlinear_unary(n, "LeakyRelu", 16, &[("alpha", AttrValue::Float(alpha))])
    });
    add_ms(reg, "QLinearAveragePool", |n| {
        let mut attrs = Vec::new();
        for name in [
            "auto_pad",
            "ceil_mode",
            "count_include_pad",
            "kernel_shape",
            "pads",
            "strides",
        ] {
            if let Some(v) = n.attributes.get(name) {
                attrs.push((name, v.clone()));
            }
        }
        channels_first(n)?;
        qlinear_unary(n, "AveragePool", 19, &attrs)
    });
    add_ms(reg, "QLinearGlobalAveragePool", |n| {
        channels_first(n)?;
        Ok(Box::new(QLinearGlobalAveragePool {
            general: qlinear_unary(n, "GlobalAveragePool", 1, &[])?,
        }))
    });
    add_ms(reg, "QLinearConcat", build_qlinear_concat);
    // `Softmax(X)` requantized, with the Softmax of opset `opset` (the 2-D coercion before 13).
    add_ms(reg, "QLinearSoftmax", |n| {
        let opset = n.req_int("opset")?;
        if opset < 1 {
            return Err(n.error(format_args!("opset must be positive, got {opset}")));
        }
        let axis = AttrValue::Int(n.attr_int_or("axis", -1)?);
        qlinear_unary(n, "Softmax", opset, &[("axis", axis)])
    });
    add_ms(reg, "QuantizeLinear", |n| ms_quantize(n, "QuantizeLinear"));
    add_ms(reg, "DequantizeLinear", |n| {
        ms_quantize(n, "DequantizeLinear")
    });
}

/// `channels_last` of the quantized pools: only the ONNX layout (NCHW) is taken.
fn channels_first(n: &NodeDef) -> OpResult<()> {
    if n.attr_int_or("channels_last", 0)? != 0 {
        return Err(n.error("channels_last=1 (NHWC) is not supported; the CPU EP pools NCHW"));
    }
    Ok(())
}

/// The quantized type of a QLinear op's output: its zero point's, else its first input's.
fn quantized_type(n: &NodeDef, zero_point: usize, data: usize) -> AttrValue {
    let ty = n
        .input_types
        .get(zero_point)
        .copied()
        .flatten()
        .or_else(|| n.input_types.get(data).copied().flatten())
        .unwrap_or(epx_plugin_api::ElementType::Uint8);
    AttrValue::Int(i64::from(ty.onnx_code()))
}

/// QLinearAdd / QLinearMul: `(A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp)`.
fn qlinear_binary(n: &NodeDef, op: &str) -> OpResult<QLinearBinary> {
    let mut c = Composite::new(n);
    let dq = |c: &mut Composite<'_>, i: usize| {
        c.step(
            "DequantizeLinear",
            21,
            &[],
            &[Some(Arg::In(i)), Some(Arg::In(i + 1)), Some(Arg::In(i + 2))],
        )
    };
    let a = dq(&mut c, 0)?;
    let b = dq(&mut c, 3)?;
    let y = c.step(op, 14, &[], &[Some(a), Some(b)])?;
    let out = [("output_dtype", quantized_type(n, 7, 0))];
    let q = c.step(
        "QuantizeLinear",
        21,
        &out,
        &[Some(y), Some(Arg::In(6)), Some(Arg::In(7))],
    )?;
    Ok(QLinearBinary {
        mul: op == "Mul",
        general: c.finish(vec![Some(q)])?,
    })
}

/// QLinearAdd / QLinearMul in one pass over 8-bit data with scalar scales and zero points,
/// where B has A's shape, one element, or one element per leading `[N, C]` plane (and the same
/// with A and B swapped): the kernels of [`crate::fast::qbytes`], on the scale ratios
/// `a_scale / c_scale` and `b_scale / c_scale` (Add) or `a_scale · b_scale / c_scale` (Mul),
/// a broadcast operand folded into them. Else the composite of DequantizeLinear, Add / Mul and
/// QuantizeLinear, which divides by `c_scale` last: the two can differ by one step where the
/// exact result lies within a rounding of a half.
struct QLinearBinary {
    mul: bool,
    general: Box<dyn OpKernel>,
}

/// A scalar float32 scale and zero point of the element type (`signed`: int8, else uint8).
fn byte_params(
    scale: Option<&TensorRef<'_>>,
    zp: Option<&TensorRef<'_>>,
    signed: bool,
) -> Option<(f64, i32)> {
    let s = match scale? {
        TensorRef::F32(s) if s.len() == 1 => *s.iter().next()?,
        _ => return None,
    };
    let z = match (zp, signed) {
        (None, _) => 0,
        (Some(TensorRef::U8(z)), false) if z.len() == 1 => i32::from(*z.iter().next()?),
        (Some(TensorRef::I8(z)), true) if z.len() == 1 => i32::from(*z.iter().next()?),
        _ => return None,
    };
    Some((f64::from(s), z))
}

/// The bytes of an 8-bit tensor in C order, and whether it is int8.
fn bytes_of<'t>(t: &'t TensorRef<'_>) -> Option<(&'t [u8], bool)> {
    match t {
        TensorRef::U8(v) => Some((v.as_slice()?, false)),
        TensorRef::I8(v) => {
            let s = v.as_slice()?;
            Some((bytemuck::cast_slice::<i8, u8>(s), true))
        }
        _ => None,
    }
}

/// An 8-bit tensor of `shape` from its bytes: int8 when `signed`, else uint8.
fn byte_tensor(shape: &[usize], bytes: Vec<u8>, signed: bool) -> Option<Tensor> {
    if signed {
        Tensor::from_vec(shape, bytes.into_iter().map(|v| v as i8).collect()).ok()
    } else {
        Tensor::from_vec(shape, bytes).ok()
    }
}

/// [`qbytes::run`](crate::fast::qbytes::run) over all of `a` (and `b`, for the two-operand
/// forms), in pieces shared across the intra-op pool.
fn bytes_pass(
    form: crate::fast::qbytes::Form,
    a: &[u8],
    b: &[u8],
    zy: i32,
    signed: bool,
) -> OpResult<Vec<u8>> {
    let two = !b.is_empty();
    let piece = crate::par::chunk_len(a.len(), 16 << 10, 64);
    let buf = crate::scratch::take(a.len())?;
    Ok(crate::par::build_vec(buf, a.len(), piece, |at, f| {
        let n = piece.min(a.len() - at);
        let (a, b) = (&a[at..][..n], if two { &b[at..][..n] } else { &[][..] });
        crate::fast::qbytes::run_append(form, (a, b), zy, signed, f);
    }))
}

/// A kernel's one-pass answer where `fast` gives one (on the fast levels), else `general`'s.
fn fast_or(
    fast: impl FnOnce() -> Option<Tensor>,
    general: &dyn OpKernel,
    inputs: &[Option<TensorRef<'_>>],
) -> OpResult<Vec<Tensor>> {
    match crate::fast::enabled().then(fast).flatten() {
        Some(t) => Ok(vec![t]),
        None => general.run(inputs),
    }
}

impl QLinearBinary {
    fn fast(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<Tensor> {
        use crate::fast::qbytes::{self, Form};
        let at = |i: usize| inputs.get(i).and_then(Option::as_ref);
        let ((a, signed), (b, b_signed)) = (bytes_of(at(0)?)?, bytes_of(at(3)?)?);
        if signed != b_signed {
            return None;
        }
        let (sa, za) = byte_params(at(1), at(2), signed)?;
        let (sb, zb) = byte_params(at(4), at(5), signed)?;
        let (sc, zc) = byte_params(at(6), at(7), signed)?;
        let (sha, shb) = (at(0)?.shape(), at(3)?.shape());
        // QLinearAdd's forms hold the output zero point.
        let zy = if self.mul { zc } else { 0 };
        // Elementwise (for QLinearAdd, unless an operand has one element: ONNX Runtime takes
        // that one as a scalar, the first input when both are).
        if sha == shb && (self.mul || a.len() > 1) {
            let form = if self.mul {
                Form::Mul {
                    za,
                    zb,
                    r: (sa * sb / sc) as f32,
                }
            } else {
                Form::add((sa as f32, za), (sb as f32, zb), (sc as f32, zc))
            };
            if !form.usable(signed) {
                return None;
            }
            return byte_tensor(sha, bytes_pass(form, a, b, zy, signed).ok()?, signed);
        }
        // The larger operand, and the smaller one repeating along it (a one-element first
        // input is the smaller one, as ONNX Runtime takes it).
        let first_small = a.len() < b.len() || (!self.mul && a.len() == 1);
        let (big, (sbig, zbig), shape, small, (ssmall, zsmall), other) = if !first_small {
            (a, (sa, za), sha, b, (sb, zb), shb)
        } else {
            (b, (sb, zb), shb, a, (sa, za), sha)
        };
        let run = if small.len() == 1 && other.len() <= shape.len() {
            big.len()
        } else if other.len() == shape.len()
            && shape.len() >= 2
            && other[..2] == shape[..2]
            && other[2..].iter().all(|&d| d == 1)
        {
            shape[2..].iter().product()
        } else {
            return None;
        };
        if run == 0 {
            return None;
        }
        // The form of each run: the smaller operand's value folded into the ratios.
        let forms: Vec<Form> = small
            .iter()
            .map(|&v| {
                let v = if signed {
                    i32::from(v as i8)
                } else {
                    i32::from(v)
                };
                if self.mul {
                    // The composite's float32 value of the broadcast element.
                    let w = f64::from(((v - zsmall) as f32) * ssmall as f32);
                    Form::Affine {
                        za: zbig,
                        alpha: (sbig * w / sc) as f32,
                        gamma: 0.0,
                    }
                } else {
                    let c = (sc as f32, zc);
                    Form::add_scalar((sbig as f32, zbig), (ssmall as f32, zsmall), v, c)
                }
            })
            .collect();
        if !forms.iter().all(|f| f.usable(signed)) {
            return None;
        }
        // Whole runs per piece of the intra-op pool.
        let runs = crate::par::chunk_len(big.len(), 16 << 10, 1)
            .div_ceil(run)
            .max(1);
        // Memory that is not there: the general path reports it.
        let out = crate::par::build_vec(
            crate::scratch::take(big.len()).ok()?,
            big.len(),
            runs * run,
            |at, f| {
                let end = big.len().min(at + runs * run);
                for k in at / run..end / run {
                    let src = &big[k * run..][..run];
                    let form = forms[k % forms.len()];
                    qbytes::run_append(form, (src, &[]), zy, signed, f);
                }
            },
        );
        byte_tensor(shape, out, signed)
    }
}

impl OpKernel for QLinearBinary {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        fast_or(|| self.fast(inputs), self.general.as_ref(), inputs)
    }
}

/// `QuantizeLinear(DequantizeLinear(X) / D)` with scalar scales and zero points and a float32
/// scalar `D`: one pass over the bytes with the ratio `x_scale / (D · y_scale)` ([`qbytes`]'s
/// affine form). Else the composite, which divides twice: the two can differ by one step where
/// the exact result lies within a rounding of a half.
///
/// [`qbytes`]: crate::fast::qbytes
struct QLinearDivByConstant {
    general: Box<dyn OpKernel>,
}

fn build_qlinear_div_by_constant(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let x = c.step(
        "DequantizeLinear",
        21,
        &[],
        &[Some(Arg::In(0)), Some(Arg::In(1)), Some(Arg::In(2))],
    )?;
    let y = c.step("Div", 14, &[], &[Some(x), Some(Arg::In(3))])?;
    let out = [("output_dtype", quantized_type(n, 5, 0))];
    let q = c.step(
        "QuantizeLinear",
        21,
        &out,
        &[Some(y), Some(Arg::In(4)), Some(Arg::In(5))],
    )?;
    Ok(Box::new(QLinearDivByConstant {
        general: c.finish(vec![Some(q)])?,
    }))
}

impl QLinearDivByConstant {
    fn fast(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<Tensor> {
        use crate::fast::qbytes::Form;
        let at = |i: usize| inputs.get(i).and_then(Option::as_ref);
        let x = at(0)?;
        let (a, signed) = bytes_of(x)?;
        let (sx, zx) = byte_params(at(1), at(2), signed)?;
        let d = match at(3)? {
            TensorRef::F32(d) if d.len() == 1 => f64::from(*d.iter().next()?),
            _ => return None,
        };
        let (sy, zy) = byte_params(at(4), at(5), signed)?;
        let form = Form::Affine {
            za: zx,
            alpha: (sx / (d * sy)) as f32,
            gamma: 0.0,
        };
        if d == 0.0 || !form.usable(signed) {
            return None;
        }
        byte_tensor(
            x.shape(),
            bytes_pass(form, a, &[], zy, signed).ok()?,
            signed,
        )
    }
}

impl OpKernel for QLinearDivByConstant {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        fast_or(|| self.fast(inputs), self.general.as_ref(), inputs)
    }
}

/// QLinearGlobalAveragePool on 8-bit data with scalar scales and zero points: each plane's
/// exact integer sum, scaled once, `saturate(round((Σx - n·zx) · sx / (n · sy)) + zy)`, rounding
/// half to even. Else the composite of DequantizeLinear, GlobalAveragePool and QuantizeLinear,
/// which averages float32 values: the two can differ by one step where the exact mean lies
/// within a rounding of a half.
struct QLinearGlobalAveragePool {
    general: Box<dyn OpKernel>,
}

impl QLinearGlobalAveragePool {
    fn fast(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<Tensor> {
        let at = |i: usize| inputs.get(i).and_then(Option::as_ref);
        let x = at(0)?;
        let (bytes, signed) = bytes_of(x)?;
        let (sx, zx) = byte_params(at(1), at(2), signed)?;
        let (sy, zy) = byte_params(at(3), at(4), signed)?;
        let shape = x.shape();
        if shape.len() < 3 {
            return None;
        }
        let n: usize = shape[2..].iter().product();
        let factor = sx / (sy * n as f64);
        if n == 0 || !factor.is_finite() {
            return None;
        }
        // Sums in the unsigned domain (int8 bits plus 128), in runs short enough for u32.
        let (flip, shift) = if signed { (0x80u8, 128i64) } else { (0, 0) };
        let (lo, hi) = if signed {
            (-128.0, 127.0)
        } else {
            (0.0, 255.0)
        };
        let out: Vec<u8> = bytes
            .chunks_exact(n)
            .map(|plane| {
                let sum: i64 = plane
                    .chunks(1 << 20)
                    .map(|run| i64::from(run.iter().map(|&b| u32::from(b ^ flip)).sum::<u32>()))
                    .sum();
                let centered = sum - (shift + i64::from(zx)) * n as i64;
                let y =
                    crate::fast::round::round_even_f64(centered as f64 * factor) + f64::from(zy);
                // As a byte of the output type: int8 values keep their two's complement bits.
                y.clamp(lo, hi) as i32 as u8
            })
            .collect();
        let mut out_shape = shape[..2].to_vec();
        out_shape.resize(shape.len(), 1);
        byte_tensor(&out_shape, out, signed)
    }
}

impl OpKernel for QLinearGlobalAveragePool {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        fast_or(|| self.fast(inputs), self.general.as_ref(), inputs)
    }
}

/// A QLinear op of one tensor: `(X, X_scale, X_zp, Y_scale, Y_zp)`.
fn qlinear_unary(
    n: &NodeDef,
    op: &str,
    opset: i64,
    attrs: &[(&str, AttrValue)],
) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let x = c.step(
        "DequantizeLinear",
        21,
        &[],
        &[Some(Arg::In(0)), Some(Arg::In(1)), Some(Arg::In(2))],
    )?;
    let y = c.step(op, opset, attrs, &[Some(x)])?;
    let out = [("output_dtype", quantized_type(n, 4, 0))];
    let q = c.step(
        "QuantizeLinear",
        21,
        &out,
        &[Some(y), Some(Arg::In(3)), Some(Arg::In(4))],
    )?;
    c.finish(vec![Some(q)])
}

/// QLinearConcat: `(Y_scale, Y_zp, X1, X1_scale, X1_zp, X2, ...)` along `axis`.
fn build_qlinear_concat(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let parts = n.num_inputs.saturating_sub(2);
    if parts == 0 || !parts.is_multiple_of(3) {
        return Err(n.error(format_args!(
            "needs Y_scale, Y_zp and (X, X_scale, X_zp) triples, got {} inputs",
            n.num_inputs
        )));
    }
    let axis = n.attr_int("axis")?.ok_or_else(|| n.error("needs `axis`"))?;
    let mut c = Composite::new(n);
    let mut xs = Vec::with_capacity(parts / 3);
    for k in 0..parts / 3 {
        let i = 2 + 3 * k;
        xs.push(Some(c.step(
            "DequantizeLinear",
            21,
            &[],
            &[Some(Arg::In(i)), Some(Arg::In(i + 1)), Some(Arg::In(i + 2))],
        )?));
    }
    let y = c.step("Concat", 13, &[("axis", AttrValue::Int(axis))], &xs)?;
    let out = [("output_dtype", quantized_type(n, 1, 2))];
    let q = c.step(
        "QuantizeLinear",
        21,
        &out,
        &[Some(y), Some(Arg::In(0)), Some(Arg::In(1))],
    )?;
    Ok(Box::new(QLinearConcat {
        axis,
        general: c.finish(vec![Some(q)])?,
    }))
}

/// QLinearConcat with scalar scales and zero points: each input's bytes mapped to the output's
/// through a table of its 256 values, computed by the composite's own arithmetic (dequantize
/// in float32, divide by the output scale, round half to even, add the zero point, saturate),
/// so the bytes are the composite's; an input whose table is the identity is copied.
struct QLinearConcat {
    axis: i64,
    general: Box<dyn OpKernel>,
}

impl QLinearConcat {
    fn fast(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<Tensor> {
        let at = |i: usize| inputs.get(i).and_then(Option::as_ref);
        let signed = matches!(at(1), Some(TensorRef::I8(_)));
        let (sy, zy) = byte_params(at(0), at(1), signed)?;
        let first = at(2)?.shape();
        let rank = first.len();
        let axis = usize::try_from(if self.axis < 0 {
            self.axis + rank as i64
        } else {
            self.axis
        })
        .ok()
        .filter(|&a| a < rank)?;
        let mut parts = Vec::with_capacity((inputs.len() - 2) / 3);
        let mut along = 0usize;
        for k in 0..(inputs.len() - 2) / 3 {
            let x = at(2 + 3 * k)?;
            let (bytes, s) = bytes_of(x)?;
            let shape = x.shape();
            if s != signed
                || shape.len() != rank
                || (0..rank).any(|d| d != axis && shape[d] != first[d])
            {
                return None;
            }
            let (sx, zx) = byte_params(at(3 + 3 * k), at(4 + 3 * k), signed)?;
            along += shape[axis];
            let table = requant_table((sx as f32, zx), (sy as f32, zy), signed);
            let inner: usize = shape[axis..].iter().product();
            parts.push((bytes, inner, table));
        }
        let outer: usize = first[..axis].iter().product();
        let total = outer * parts.iter().map(|p| p.1).sum::<usize>();
        // Memory that is not there: the general path reports it.
        let mut out = crate::scratch::take(total).ok()?;
        for o in 0..outer {
            for (bytes, inner, table) in &parts {
                let src = &bytes[o * inner..][..*inner];
                match table {
                    None => out.extend_from_slice(src),
                    Some(t) => out.extend(src.iter().map(|&b| t[usize::from(b)])),
                }
            }
        }
        let mut shape = first.to_vec();
        shape[axis] = along;
        byte_tensor(&shape, out, signed)
    }
}

impl OpKernel for QLinearConcat {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        fast_or(|| self.fast(inputs), self.general.as_ref(), inputs)
    }
}

/// The output byte of each input byte (its raw bits; int8 when `signed`) requantized from
/// `(scale, zero point)` `x` to `y` as DequantizeLinear then QuantizeLinear compute it in
/// float32; `None` when that is every byte itself.
fn requant_table(x: (f32, i32), y: (f32, i32), signed: bool) -> Option<[u8; 256]> {
    let (lo, hi) = if signed {
        (-128.0, 127.0)
    } else {
        (0.0, 255.0)
    };
    let mut t = [0u8; 256];
    for (b, slot) in t.iter_mut().enumerate() {
        let v = if signed {
            f32::from(b as u8 as i8)
        } else {
            b as f32
        };
        let q = crate::fast::round::quantize_one((v - x.1 as f32) * x.0, y.0, y.1 as f32, lo, hi);
        *slot = if signed { q as i8 as u8 } else { q as u8 };
    }
    (!t.iter().enumerate().all(|(b, &v)| usize::from(v) == b)).then_some(t)
}

/// com.microsoft QuantizeLinear / DequantizeLinear: ONNX's, per tensor or per `axis`.
fn ms_quantize(n: &NodeDef, op: &str) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let mut attrs = Vec::new();
    if let Some(axis) = n.attr_int("axis")? {
        attrs.push(("axis", AttrValue::Int(axis)));
    }
    let args: Vec<Option<Arg>> = (0..n.num_inputs.max(2)).map(|i| Some(Arg::In(i))).collect();
    let y = c.step(op, 21, &attrs, &args)?;
    c.finish(vec![Some(y)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{f32s, ms};

    /// QLinearDivByConstant's one pass gives the composite's bytes, or one step off where the
    /// exact quotient lies within a rounding of a half; a zero divisor goes to the composite.
    #[test]
    fn qlinear_div_by_constant_equals_the_composite() {
        let mut node = NodeDef::new("QLinearDivByConstant", 1).with_io(6, 1);
        node.domain = crate::kernel::EPX_CPU.into();
        let k = crate::ops::registry().build(&node).unwrap();
        let x: Vec<u8> = (0..4099u32).map(|i| ((i * 37 + 5) % 256) as u8).collect();
        let owned = |d: f32| {
            [
                Tensor::from_vec(&[4099], x.clone()).unwrap(),
                f32s(&[], &[0.043]),
                Tensor::from_vec(&[], vec![117u8]).unwrap(),
                f32s(&[], &[d]),
                f32s(&[], &[0.0171]),
                Tensor::from_vec(&[], vec![3u8]).unwrap(),
            ]
        };
        for d in [6.0f32, -0.37, 0.0] {
            let t = owned(d);
            let inputs: Vec<Option<TensorRef<'_>>> = t.iter().map(|t| Some(t.view())).collect();
            let fast = k.run(&inputs).unwrap().remove(0);
            let level = crate::fast::ISAS.last().unwrap();
            let general = crate::fast::with_isa(level, || k.run(&inputs).unwrap().remove(0))
                .expect("the reference level is always there");
            let (f, g) = (
                fast.as_array::<u8>().unwrap(),
                general.as_array::<u8>().unwrap(),
            );
            let off = f.iter().zip(&g).filter(|(a, b)| a != b).count();
            assert!(f.iter().zip(&g).all(|(a, b)| a.abs_diff(*b) <= 1), "{d}");
            assert!(off * 100 <= f.len(), "{d}: {off} of {} differ", f.len());
        }
    }

    /// QLinearConcat's table pass gives the composite's bytes, for uint8 and int8, with an
    /// input already in the output's parameters (copied).
    #[test]
    fn qlinear_concat_tables_equal_the_composite() {
        let raw = |n: usize, salt: u32| -> Vec<u8> {
            (0..n as u32)
                .map(|i| ((i * 37 + salt * 101) % 256) as u8)
                .collect()
        };
        for signed in [false, true] {
            let mut node = ms("QLinearConcat")
                .with_io(11, 1)
                .with_attr("axis", AttrValue::Int(1));
            let ty = if signed {
                epx_plugin_api::ElementType::Int8
            } else {
                epx_plugin_api::ElementType::Uint8
            };
            node.input_types = vec![Some(epx_plugin_api::ElementType::Float), Some(ty)];
            let k = crate::ops::registry().build(&node).unwrap();
            let byte_t = |shape: &[usize], v: Vec<u8>| -> Tensor {
                if signed {
                    Tensor::from_vec(shape, v.into_iter().map(|b| b as i8).collect()).unwrap()
                } else {
                    Tensor::from_vec(shape, v).unwrap()
                }
            };
            let zp = |z: u8| byte_t(&[], vec![z]);
            let owned = [
                f32s(&[], &[0.021]),
                zp(7),
                byte_t(&[2, 3, 4], raw(24, 1)),
                f32s(&[], &[0.05]),
                zp(250),
                byte_t(&[2, 5, 4], raw(40, 2)),
                f32s(&[], &[0.021]),
                zp(7),
                byte_t(&[2, 1, 4], raw(8, 3)),
                f32s(&[], &[0.003]),
                zp(128),
            ];
            let inputs: Vec<Option<TensorRef<'_>>> = owned.iter().map(|t| Some(t.view())).collect();
            let fast = k.run(&inputs).unwrap();
            let level = crate::fast::ISAS.last().unwrap();
            let general = crate::fast::with_isa(level, || k.run(&inputs).unwrap())
                .expect("the reference level is always there");
            assert_eq!(fast, general, "signed {signed}");
            assert_eq!(fast[0].shape(), [2, 9, 4]);
        }
    }

    /// QLinearGlobalAveragePool's integer sums give the composite's bytes on uint8, or one
    /// step off where the float32 mean rounds across a half; on int8, the uint8 answer for the
    /// same values shifted by 128.
    #[test]
    fn qlinear_global_average_pool_sums_bytes_exactly() {
        let reg = crate::ops::registry();
        let k = reg
            .build(&ms("QLinearGlobalAveragePool").with_io(5, 1))
            .unwrap();
        let shape = [2, 5, 7, 9];
        let n: usize = shape.iter().product();
        let raw: Vec<u8> = (0..n as u32).map(|i| ((i * 97 + 13) % 256) as u8).collect();
        let (sx, sy) = (f32s(&[], &[0.037]), f32s(&[], &[0.011]));
        let run = |x: Tensor, zx: Tensor, zy: Tensor, reference: bool| -> Tensor {
            let owned = [x, sx.clone(), zx, sy.clone(), zy];
            let inputs: Vec<Option<TensorRef<'_>>> = owned.iter().map(|t| Some(t.view())).collect();
            if reference {
                let level = crate::fast::ISAS.last().unwrap();
                crate::fast::with_isa(level, || k.run(&inputs).unwrap().remove(0))
                    .expect("the reference level is always there")
            } else {
                k.run(&inputs).unwrap().remove(0)
            }
        };
        let u8s = |v: Vec<u8>, shape: &[usize]| Tensor::from_vec(shape, v).unwrap();
        let unsigned = |reference| {
            run(
                u8s(raw.clone(), &shape),
                u8s(vec![125], &[]),
                u8s(vec![133], &[]),
                reference,
            )
        };
        let (fast, general) = (unsigned(false), unsigned(true));
        assert_eq!(fast.shape(), [2, 5, 1, 1]);
        let (f, g) = (
            fast.as_array::<u8>().unwrap(),
            general.as_array::<u8>().unwrap(),
        );
        assert!(
            f.iter().zip(&g).all(|(&a, &b)| a.abs_diff(b) <= 1),
            "{f:?} vs {g:?}"
        );
        assert!(
            f.iter().zip(&g).filter(|(a, b)| a == b).count() >= 8,
            "{f:?} vs {g:?}"
        );
        let i8s = |v: Vec<i8>, shape: &[usize]| Tensor::from_vec(shape, v).unwrap();
        let shifted: Vec<i8> = raw.iter().map(|&b| (i32::from(b) - 128) as i8).collect();
        let signed = run(
            i8s(shifted, &shape),
            i8s(vec![-3], &[]),
            i8s(vec![5], &[]),
            false,
        );
        let s: Vec<i32> = signed
            .as_array::<i8>()
            .unwrap()
            .iter()
            .map(|&v| i32::from(v))
            .collect();
        let u: Vec<i32> = f.iter().map(|&v| i32::from(v) - 128).collect();
        assert_eq!(s, u);
    }

    /// The one-pass QLinearAdd / QLinearMul gives the composite's bytes, on the shapes it takes
    /// (equal, one element, one per [N, C] plane, either operand the smaller), and declines
    /// the others.
    #[test]
    fn qlinear_binary_fast_path_equals_the_composite() {
        let bytes = |n: usize, k: u32| -> Tensor {
            let v: Vec<u8> = (0..n as u32)
                .map(|i| ((i * 37 + k * 11) % 256) as u8)
                .collect();
            Tensor::from_vec(&[n], v).unwrap()
        };
        let shaped = |t: Tensor, shape: &[usize]| {
            Tensor::from_vec(shape, t.as_array::<u8>().unwrap().iter().copied().collect()).unwrap()
        };
        let scalar_u8 = |v: u8| Tensor::from_vec(&[], vec![v]).unwrap();
        let scalar_f32 = |v: f32| Tensor::from_vec(&[], vec![v]).unwrap();
        let cases: [(&[usize], &[usize], bool); 5] = [
            (&[2, 3, 4, 5], &[2, 3, 4, 5], true),
            (&[2, 3, 4, 5], &[1], true),
            (&[2, 3, 4, 5], &[2, 3, 1, 1], true),
            (&[2, 3, 1, 1], &[2, 3, 4, 5], true),
            (&[2, 3, 4, 5], &[5], false),
        ];
        for op in ["Add", "Mul"] {
            let mut n = ms(&format!("QLinear{op}"));
            n.num_inputs = 8;
            n.num_outputs = 1;
            let k = qlinear_binary(&n, op).unwrap();
            for (sa, sb, fast) in cases {
                let na: usize = sa.iter().product();
                let nb: usize = sb.iter().product();
                let ins = [
                    Some(shaped(bytes(na, 1), sa)),
                    Some(scalar_f32(0.037)),
                    Some(scalar_u8(121)),
                    Some(shaped(bytes(nb, 2), sb)),
                    Some(scalar_f32(0.0213)),
                    Some(scalar_u8(3)),
                    Some(scalar_f32(if op == "Add" { 0.051 } else { 0.43 })),
                    Some(scalar_u8(130)),
                ];
                let refs: Vec<Option<TensorRef<'_>>> =
                    ins.iter().map(|t| t.as_ref().map(Tensor::view)).collect();
                let general = k.general.run(&refs).unwrap();
                match k.fast(&refs) {
                    Some(t) => {
                        assert!(fast, "{op} {sa:?} {sb:?}: took a shape it should decline");
                        assert_eq!(t.shape(), general[0].shape());
                        assert_eq!(
                            t.as_array::<u8>().unwrap(),
                            general[0].as_array::<u8>().unwrap(),
                            "{op} {sa:?} {sb:?}"
                        );
                    }
                    None => assert!(!fast, "{op} {sa:?} {sb:?}: declined"),
                }
            }
        }
    }
}
