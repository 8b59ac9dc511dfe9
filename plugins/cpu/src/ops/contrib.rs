//! ONNX Runtime's own operators (`com.microsoft`, and the two it registers in the default
//! domain at opset 1), as ONNX Runtime's optimizer, quantization tools and transformer optimizer
//! write them into the models they save. Each is defined by ONNX Runtime's
//! `docs/ContribOperators.md`; here each is built from the CPU EP's reference kernels of the
//! ONNX operators it fuses, wired by a small [`Composite`], so the two cannot drift apart.
//! FusedConv keeps the convolution's fast path: its activation runs inside the convolution,
//! band by band, as a [`PostOp`].

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::fast::chain::EwOp;
use crate::fast::post::PostOp;
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, add_epx, add_ms};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    // `QuantizeLinear(DequantizeLinear(X) / D)` for a float32 constant D:
    // `(X, X_scale, X_zp, D, Y_scale, Y_zp)` (the QDQ folding writes it; see `qdq.rs`).
    add_epx(reg, "QLinearDivByConstant", build_qlinear_div_by_constant);
    add_ms(reg, "FusedConv", build_fused_conv);
    add_ms(reg, "FusedGemm", build_fused_gemm);
    add_ms(reg, "FusedMatMul", build_fused_matmul);
    add_ms(reg, "Gelu", |n| {
        let mut c = Composite::new(n);
        let y = c.step("Gelu", 20, &[], &[Some(Arg::In(0))])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "BiasGelu", |n| {
        let mut c = Composite::new(n);
        let sum = c.step("Add", 14, &[], &[Some(Arg::In(0)), Some(Arg::In(1))])?;
        let y = c.step("Gelu", 20, &[], &[Some(sum)])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "FastGelu", |n| {
        let mut c = Composite::new(n);
        let x = if n.num_inputs > 1 {
            c.step_if_present(1, "Add", 14, &[Some(Arg::In(0)), Some(Arg::In(1))])?
        } else {
            Arg::In(0)
        };
        let tanh = [("approximate", AttrValue::String(b"tanh".to_vec()))];
        let y = c.step("Gelu", 20, &tanh, &[Some(x)])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "QuickGelu", |n| build_swish(n, 1.702));
    // ONNX's own Swish (opset 24) is the same function with alpha 1 by default.
    crate::kernel::add(reg, "Swish", 24, |n| build_swish(n, 1.0));
    add_ms(reg, "BiasAdd", |n| {
        let mut c = Composite::new(n);
        let xb = c.step("Add", 14, &[], &[Some(Arg::In(0)), Some(Arg::In(1))])?;
        let y = c.step("Add", 14, &[], &[Some(xb), Some(Arg::In(2))])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "SkipLayerNormalization", |n| build_skip_norm(n, false));
    add_ms(reg, "SkipSimplifiedLayerNormalization", |n| {
        build_skip_norm(n, true)
    });
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
    add_ms(reg, "DynamicQuantizeMatMul", build_dynamic_quantize_matmul);
    add_ms(reg, "MatMulIntegerToFloat", build_matmul_integer_to_float);
    add_ms(reg, "BiasSoftmax", build_bias_softmax);
    add_ms(reg, "MatMulNBits", build_matmul_nbits);
    add_ms(reg, "NhwcMaxPool", build_nhwc_max_pool);
    add_ms(reg, "QuantizeLinear", |n| ms_quantize(n, "QuantizeLinear"));
    add_ms(reg, "DequantizeLinear", |n| {
        ms_quantize(n, "DequantizeLinear")
    });
    // ONNX Runtime registers these two in the default domain at opset 1, before ONNX had them;
    // from opset 17 (LayerNormalization) ONNX's own schema takes over.
    crate::kernel::add_range(reg, "LayerNormalization", 1, 16, |n| build_norm(n, false));
    crate::kernel::add(reg, "SimplifiedLayerNormalization", 1, |n| {
        build_norm(n, true)
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
            // SAFETY: i8 and u8 have the same size and alignment; every bit pattern is valid.
            let b = unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), s.len()) };
            Some((b, true))
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
        // SAFETY: the kernel writes every slot it is handed.
        unsafe { f.extend_raw(n, |o| crate::fast::qbytes::run(form, a, b, zy, signed, o)) };
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
        // Elementwise.
        if sha == shb {
            let form = if self.mul {
                Form::Mul {
                    za,
                    zb,
                    r: (sa * sb / sc) as f32,
                }
            } else {
                Form::Add {
                    za,
                    ra: (sa / sc) as f32,
                    zb,
                    rb: (sb / sc) as f32,
                }
            };
            if !form.usable(signed) {
                return None;
            }
            return byte_tensor(sha, bytes_pass(form, a, b, zc, signed).ok()?, signed);
        }
        // The larger operand, and the smaller one repeating along it.
        let (big, (sbig, zbig), shape, small, (ssmall, zsmall), other) = if a.len() >= b.len() {
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
                // The composite's float32 value of the broadcast element.
                let w = f64::from(((v - zsmall) as f32) * ssmall as f32);
                if self.mul {
                    Form::Affine {
                        za: zbig,
                        alpha: (sbig * w / sc) as f32,
                        gamma: 0.0,
                    }
                } else {
                    Form::Affine {
                        za: zbig,
                        alpha: (sbig / sc) as f32,
                        gamma: (w / sc) as f32,
                    }
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
                    // SAFETY: the kernel writes every slot it is handed.
                    unsafe { f.extend_raw(run, |o| qbytes::run(form, src, &[], zc, signed, o)) };
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

/// `MatMulInteger(a, b, a_zp, b_zp)` as float, times `a_scale · b_scale`, plus an optional
/// bias: the unfused graph `quantize_dynamic` writes, in its order of operations.
fn integer_matmul_to_float(
    c: &mut Composite<'_>,
    a: Arg,
    a_scale: Arg,
    a_zp: Option<Arg>,
    b: (usize, usize, usize),
    bias: usize,
) -> OpResult<Arg> {
    let (b, b_scale, b_zp) = b;
    let prod = c.step(
        "MatMulInteger",
        10,
        &[],
        &[Some(a), Some(Arg::In(b)), a_zp, Some(Arg::In(b_zp))],
    )?;
    let float = c.step("Cast", 19, &[("to", AttrValue::Int(1))], &[Some(prod)])?;
    let scale = c.step("Mul", 14, &[], &[Some(a_scale), Some(Arg::In(b_scale))])?;
    let y = c.step("Mul", 14, &[], &[Some(float), Some(scale)])?;
    c.step_if_present(bias, "Add", 14, &[Some(y), Some(Arg::In(bias))])
}

/// DynamicQuantizeMatMul `(A, B, b_scale, b_zero_point, bias)`: A quantized to uint8 from its
/// own range, then an integer product scaled back to float.
fn build_dynamic_quantize_matmul(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let q = c.step_n(
        "DynamicQuantizeLinear",
        11,
        &[],
        &[Some(Arg::In(0))],
        3,
        None,
    )?;
    let y = integer_matmul_to_float(
        &mut c,
        Arg::Out(q, 0),
        Arg::Out(q, 1),
        Some(Arg::Out(q, 2)),
        (1, 2, 3),
        4,
    )?;
    c.finish(vec![Some(y)])
}

/// MatMulIntegerToFloat `(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias)`.
fn build_matmul_integer_to_float(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let y = integer_matmul_to_float(
        &mut c,
        Arg::In(0),
        Arg::In(2),
        Some(Arg::In(4)),
        (1, 3, 5),
        6,
    )?;
    c.finish(vec![Some(y)])
}

/// MatMulNBits `(A, B, scales, zero_points, g_idx, bias)`: `A · Wᵀ` with `W [N, K]` stored in
/// blocks of `block_size` values along K, `bits` (2, 4 or 8) per value packed low bits first:
/// `B [N, blocks, block_size·bits/8]`, one scale per block, zero points packed the same way
/// (or as floats), `2^(bits-1)` when absent. Dequantized to f32, multiplied in f32.
fn build_matmul_nbits(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let k = usize::try_from(n.req_int("K")?).map_err(|_| n.error("K must not be negative"))?;
    let cols = usize::try_from(n.req_int("N")?).map_err(|_| n.error("N must not be negative"))?;
    let bits = n.attr_int_or("bits", 4)?;
    if !matches!(bits, 2 | 4 | 8) {
        return Err(n.error(format_args!("bits={bits} is not supported (2, 4 or 8)")));
    }
    let bits = bits as usize;
    let block = usize::try_from(n.req_int("block_size")?)
        .ok()
        .filter(|b| *b >= 16 && b.is_power_of_two())
        .ok_or_else(|| n.error("block_size must be a power of two of at least 16"))?;
    let blocks = k.div_ceil(block);
    let matmul = crate::kernel::build_part(n, "MatMul", 13, Vec::new(), 2, 1)?;
    Ok(Box::new(MatMulNBits {
        op,
        k,
        cols,
        bits,
        block,
        blocks,
        matmul,
    }))
}

struct MatMulNBits {
    op: String,
    k: usize,
    cols: usize,
    bits: usize,
    block: usize,
    blocks: usize,
    matmul: Box<dyn OpKernel>,
}

impl MatMulNBits {
    /// `W` dequantized and transposed, `[K, N]`.
    fn weights(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<f32>> {
        let op = &self.op;
        let (k, cols, bits, block, blocks) =
            (self.k, self.cols, self.bits, self.block, self.blocks);
        let per = 8 / bits;
        let mask = (1u8 << bits) - 1;
        let blob = block * bits / 8;
        let b = input(op, inputs, 1)?;
        let b = b
            .get::<u8>()
            .ok_or_else(|| OpError(format!("{op}: B must be uint8, got {}", b.elem_type())))?;
        let need = cols.checked_mul(blocks).and_then(|v| v.checked_mul(blob));
        if need != Some(b.len()) {
            bail!(
                "{op}: B has {} bytes, [N={cols}, {blocks} blocks, {blob}] needs {}",
                b.len(),
                need.map_or("more than memory holds".to_string(), |v| v.to_string())
            );
        }
        let b: Vec<u8> = b.iter().copied().collect();
        let scales = input(op, inputs, 2)?.to_f64_vec();
        if scales.len() != cols * blocks {
            bail!("{op}: {} scales for {cols}×{blocks} blocks", scales.len());
        }
        let default_zp = f64::from(1u32 << (bits - 1));
        let zp: Box<dyn Fn(usize, usize) -> f64> = match opt_input(inputs, 3) {
            None => Box::new(move |_, _| default_zp),
            Some(z) if z.elem_type() == epx_plugin_api::ElementType::Uint8 => {
                let row = blocks.div_ceil(per);
                let zv: Vec<u8> = z.get::<u8>().into_iter().flatten().copied().collect();
                if zv.len() != cols * row {
                    bail!("{op}: {} packed zero points, N×{row} needed", zv.len());
                }
                Box::new(move |c, blk| {
                    f64::from((zv[c * row + blk / per] >> ((blk % per) * bits)) & mask)
                })
            }
            Some(z) => {
                let zv = z.to_f64_vec();
                if zv.len() != cols * blocks {
                    bail!("{op}: {} zero points for {cols}×{blocks} blocks", zv.len());
                }
                Box::new(move |c, blk| zv[c * blocks + blk])
            }
        };
        let g_idx = match opt_input(inputs, 4) {
            Some(g) => {
                let g = g.to_i64_vec(&format!("{op}: g_idx"))?;
                if g.len() != k || g.iter().any(|&v| v < 0 || v as usize >= blocks) {
                    bail!("{op}: g_idx must give a block below {blocks} for each of {k} rows");
                }
                Some(g)
            }
            None => None,
        };
        let mut w = vec![0f32; k * cols];
        for c in 0..cols {
            for kk in 0..k {
                let blk = g_idx.as_ref().map_or(kk / block, |g| g[kk] as usize);
                // The value's place in its own block of storage.
                let (sb, i) = (kk / block, kk % block);
                let byte = b[(c * blocks + sb) * blob + i / per];
                let q = f64::from((byte >> ((i % per) * bits)) & mask);
                w[kk * cols + c] = ((q - zp(c, blk)) * scales[c * blocks + blk]) as f32;
            }
        }
        Ok(w)
    }
}

impl OpKernel for MatMulNBits {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let a = input(&self.op, inputs, 0)?;
        if a.shape().last() != Some(&self.k) {
            bail!(
                "{}: A of shape {:?} does not end in K={}",
                self.op,
                a.shape(),
                self.k
            );
        }
        let w = Tensor::from_vec(&[self.k, self.cols], self.weights(inputs)?)?;
        let ty = a.elem_type();
        let a32 = a.cast(epx_plugin_api::ElementType::Float)?;
        let mut y = self.matmul.run(&[Some(a32.view()), Some(w.view())])?;
        let mut out = y.remove(0);
        if let Some(bias) = opt_input(inputs, 5) {
            let bv = bias.to_f64_vec();
            if bv.len() != self.cols {
                bail!(
                    "{}: bias has {} values for N={}",
                    self.op,
                    bv.len(),
                    self.cols
                );
            }
            if let Tensor::F32(a) = &mut out {
                for row in a
                    .as_slice_mut()
                    .into_iter()
                    .flat_map(|s| s.chunks_mut(self.cols))
                {
                    for (v, b) in row.iter_mut().zip(&bv) {
                        *v += *b as f32;
                    }
                }
            }
        }
        Ok(vec![out.view().cast(ty)?])
    }
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

/// NhwcMaxPool: MaxPool of a channels-last 4-D tensor (uint8 or int8).
fn build_nhwc_max_pool(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut attrs = Vec::new();
    for name in [
        "auto_pad",
        "ceil_mode",
        "dilations",
        "kernel_shape",
        "pads",
        "strides",
    ] {
        if let Some(v) = n.attributes.get(name) {
            attrs.push((name, v.clone()));
        }
    }
    let rank = n.attr_ints("kernel_shape")?.map_or(2, |k| k.len()) + 2;
    let to_nchw: Vec<i64> = std::iter::once(0)
        .chain(std::iter::once(rank as i64 - 1))
        .chain(1..rank as i64 - 1)
        .collect();
    let to_nhwc: Vec<i64> = std::iter::once(0)
        .chain(2..rank as i64)
        .chain(std::iter::once(1))
        .collect();
    let mut c = Composite::new(n);
    let x = c.step(
        "Transpose",
        13,
        &[("perm", AttrValue::Ints(to_nchw))],
        &[Some(Arg::In(0))],
    )?;
    let p = c.step("MaxPool", 12, &attrs, &[Some(x)])?;
    let y = c.step(
        "Transpose",
        13,
        &[("perm", AttrValue::Ints(to_nhwc))],
        &[Some(p)],
    )?;
    c.finish(vec![Some(y)])
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

/// `x * sigmoid(alpha * x)`, computed in the input's type.
fn build_swish(n: &NodeDef, default_alpha: f32) -> OpResult<Box<dyn OpKernel>> {
    let alpha = n.attr_float_or("alpha", default_alpha)?;
    let mut c = Composite::new(n);
    let a = c.constant(Tensor::scalar(alpha));
    // alpha as the input's type: Mul needs both operands of one type.
    let a = c.step("CastLike", 19, &[], &[Some(a), Some(Arg::In(0))])?;
    let ax = c.step("Mul", 14, &[], &[Some(Arg::In(0)), Some(a)])?;
    let s = c.step("Sigmoid", 13, &[], &[Some(ax)])?;
    let y = c.step("Mul", 14, &[], &[Some(Arg::In(0)), Some(s)])?;
    c.finish(vec![Some(y)])
}

/// An input of a composite step: an input of the node, the output of an earlier step, or a
/// constant made when the node was built.
#[derive(Clone, Copy, Debug)]
enum Arg {
    In(usize),
    Out(usize, usize),
    Const(usize),
}

struct Step {
    kernel: Box<dyn OpKernel>,
    args: Vec<Option<Arg>>,
    /// Runs only when this node input is present (optional inputs such as FastGelu's bias).
    when_present: Option<usize>,
}

/// A node computed as a few reference kernels in a row.
struct Composite<'n> {
    node: &'n NodeDef,
    steps: Vec<Step>,
    constants: Vec<Tensor>,
}

struct CompositeKernel {
    op: String,
    steps: Vec<Step>,
    constants: Vec<Tensor>,
    outputs: Vec<Option<Arg>>,
}

impl<'n> Composite<'n> {
    fn new(node: &'n NodeDef) -> Self {
        Composite {
            node,
            steps: Vec::new(),
            constants: Vec::new(),
        }
    }

    fn constant(&mut self, t: Tensor) -> Arg {
        self.constants.push(t);
        Arg::Const(self.constants.len() - 1)
    }

    /// Adds a step running the ONNX op `op_type` at `opset` with `attrs`; returns its output 0.
    fn step(
        &mut self,
        op_type: &str,
        opset: i64,
        attrs: &[(&str, AttrValue)],
        args: &[Option<Arg>],
    ) -> OpResult<Arg> {
        let s = self.step_n(op_type, opset, attrs, args, 1, None)?;
        Ok(Arg::Out(s, 0))
    }

    /// A one-input-dependent step: `Arg::In(0)` passes through when node input `present` is
    /// absent (an optional bias).
    fn step_if_present(
        &mut self,
        present: usize,
        op_type: &str,
        opset: i64,
        args: &[Option<Arg>],
    ) -> OpResult<Arg> {
        let s = self.step_n(op_type, opset, &[], args, 1, Some(present))?;
        Ok(Arg::Out(s, 0))
    }

    fn step_n(
        &mut self,
        op_type: &str,
        opset: i64,
        attrs: &[(&str, AttrValue)],
        args: &[Option<Arg>],
        outputs: usize,
        when_present: Option<usize>,
    ) -> OpResult<usize> {
        let attrs = attrs.iter().map(|(k, v)| (*k, v.clone())).collect();
        let kernel =
            crate::kernel::build_part(self.node, op_type, opset, attrs, args.len(), outputs)?;
        self.steps.push(Step {
            kernel,
            args: args.to_vec(),
            when_present,
        });
        Ok(self.steps.len() - 1)
    }

    fn finish(self, outputs: Vec<Option<Arg>>) -> OpResult<Box<dyn OpKernel>> {
        Ok(Box::new(CompositeKernel {
            op: self.node.op_type.clone(),
            steps: self.steps,
            constants: self.constants,
            outputs,
        }))
    }
}

impl CompositeKernel {
    fn resolve<'a>(
        &'a self,
        arg: Arg,
        inputs: &'a [Option<TensorRef<'_>>],
        done: &'a [Option<Vec<Tensor>>],
    ) -> OpResult<Option<TensorRef<'a>>> {
        Ok(match arg {
            Arg::In(i) => opt_input(inputs, i).map(TensorRef::reborrow),
            Arg::Const(c) => Some(self.constants[c].view()),
            Arg::Out(s, o) => match &done[s] {
                // A skipped optional step passes its first argument through.
                None => match self.steps[s].args.first().copied().flatten() {
                    Some(a) => self.resolve(a, inputs, done)?,
                    None => None,
                },
                Some(outs) => Some(
                    outs.get(o)
                        .ok_or_else(|| OpError(format!("{}: part {s} has no output {o}", self.op)))?
                        .view(),
                ),
            },
        })
    }
}

impl OpKernel for CompositeKernel {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let mut done: Vec<Option<Vec<Tensor>>> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            if step
                .when_present
                .is_some_and(|i| opt_input(inputs, i).is_none())
            {
                done.push(None);
                continue;
            }
            let out = {
                let mut args = Vec::with_capacity(step.args.len());
                for a in &step.args {
                    args.push(match a {
                        Some(a) => self.resolve(*a, inputs, &done)?,
                        None => None,
                    });
                }
                step.kernel.run(&args)?
            };
            done.push(Some(out));
        }
        let mut result = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            result.push(match o {
                None => Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[0]))),
                Some(a) => match self.resolve(*a, inputs, &done)? {
                    Some(t) => t.try_to_owned()?,
                    None => bail_missing(&self.op)?,
                },
            });
        }
        Ok(result)
    }
}

fn bail_missing(op: &str) -> OpResult<Tensor> {
    Err(OpError(format!(
        "{op}: an output depends on an absent input"
    )))
}

/// The activation of FusedConv / FusedGemm: `activation` and `activation_params`.
fn activation(n: &NodeDef) -> OpResult<Option<EwOp>> {
    let Some(name) = n.attr_string("activation")? else {
        return Ok(None);
    };
    let params = n.attr_floats("activation_params")?.unwrap_or_default();
    let p = |i: usize, default: f32| params.get(i).copied().unwrap_or(default);
    Ok(Some(match name.as_str() {
        "Relu" => EwOp::Relu,
        "Sigmoid" => EwOp::Sigmoid,
        "Tanh" => EwOp::Tanh,
        "LeakyRelu" => EwOp::LeakyRelu(p(0, 0.01)),
        "Clip" => EwOp::Clip(p(0, f32::MIN), p(1, f32::MAX)),
        "HardSigmoid" => EwOp::HardSigmoid(p(0, 0.2), p(1, 0.5)),
        other => {
            return Err(n.error(format_args!(
                "activation `{other}` is not one of Relu, Sigmoid, Tanh, LeakyRelu, Clip, \
                 HardSigmoid"
            )));
        }
    }))
}

/// The node's attributes less the activation ones, for the ONNX op it fuses.
fn base_attrs(n: &NodeDef) -> Vec<(&str, AttrValue)> {
    n.attributes
        .iter()
        .filter(|(k, _)| !k.starts_with("activation"))
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect()
}

/// Applies one activation to each element of an f32 output.
struct Activation(EwOp);

impl PostOp for Activation {
    fn accepts(&mut self, _shape: &[usize]) -> bool {
        true
    }
    fn work_len(&self) -> usize {
        0
    }
    fn apply(&self, seg: &mut [f32], _base: usize, _work: &mut [f32]) {
        for x in seg {
            *x = self.0.unary(*x);
        }
    }
}

/// Runs `act` over output 0 of `outs` (f32 only: the fused ops are float ops; other float types
/// go through f32, as their reference kernels do).
fn activate(op: &str, act: EwOp, outs: &mut [Tensor]) -> OpResult<()> {
    let Some(first) = outs.first_mut() else {
        return Err(OpError(format!("{op}: no output")));
    };
    match first {
        Tensor::F32(a) => a.mapv_inplace(|x| act.unary(x)),
        other => {
            let ty = other.elem_type();
            let f = other.view().cast(epx_plugin_api::ElementType::Float)?;
            let Tensor::F32(mut a) = f else {
                return Err(OpError(format!("{op}: cannot compute in f32")));
            };
            a.mapv_inplace(|x| act.unary(x));
            *other = Tensor::F32(a).view().cast(ty)?;
        }
    }
    Ok(())
}

/// `act(Conv(X, W, B) + Z)`.
struct FusedConv {
    op: String,
    conv: Box<dyn OpKernel>,
    add: Box<dyn OpKernel>,
    act: Option<EwOp>,
}

impl OpKernel for FusedConv {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let conv_inputs = &inputs[..inputs.len().min(3)];
        let z = opt_input(inputs, 3);
        let mut outs = match (self.act, z) {
            (Some(act), None) => {
                let mut post = Activation(act);
                let (mut outs, applied) = self.conv.run_with_post(conv_inputs, &mut post)?;
                if !applied {
                    activate(&self.op, act, &mut outs)?;
                }
                return Ok(outs);
            }
            _ => self.conv.run(conv_inputs)?,
        };
        if let Some(z) = z {
            let y = outs
                .first()
                .ok_or_else(|| OpError(format!("{}: no output", self.op)))?;
            let sum = self.add.run(&[Some(y.view()), Some(z.reborrow())])?;
            outs = sum;
        }
        if let Some(act) = self.act {
            activate(&self.op, act, &mut outs)?;
        }
        Ok(outs)
    }
}

fn build_fused_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(Box::new(FusedConv {
        op: n.op_type.clone(),
        conv: crate::kernel::build_part(n, "Conv", 11, base_attrs(n), n.num_inputs.min(3), 1)?,
        add: crate::kernel::build_part(n, "Add", 14, Vec::new(), 2, 1)?,
        act: activation(n)?,
    }))
}

/// `act(Gemm(A, B, C))`.
fn build_fused_gemm(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let gemm = crate::kernel::build_part(n, "Gemm", 13, base_attrs(n), n.num_inputs, 1)?;
    let act = activation(n)?;
    let op = n.op_type.clone();
    Ok(crate::kernel::kernel(move |inputs| {
        let mut outs = gemm.run(inputs)?;
        if let Some(act) = act {
            activate(&op, act, &mut outs)?;
        }
        Ok(outs)
    }))
}

/// `alpha * MatMul(A', B')`, where `'` swaps the last two axes when `transA` / `transB` is set;
/// `transBatchA` / `transBatchB` move the batch axes (all but the last two) behind them.
fn build_fused_matmul(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let alpha = n.attr_float_or("alpha", 1.0)?;
    let flags = [
        n.attr_int_or("transA", 0)? != 0,
        n.attr_int_or("transB", 0)? != 0,
    ];
    let batch = [
        n.attr_int_or("transBatchA", 0)? != 0,
        n.attr_int_or("transBatchB", 0)? != 0,
    ];
    let matmul = crate::kernel::build_part(n, "MatMul", 13, Vec::new(), 2, 1)?;
    let op = n.op_type.clone();
    Ok(crate::kernel::kernel(move |inputs| {
        let mut prepared = Vec::with_capacity(2);
        for (i, (&trans, &trans_batch)) in flags.iter().zip(&batch).enumerate() {
            let t = input(&op, inputs, i)?;
            prepared.push(fused_operand(&op, t, trans, trans_batch)?);
        }
        let views: Vec<Option<TensorRef<'_>>> = prepared
            .iter()
            .zip(inputs)
            .map(|(p, orig)| match p {
                Some(t) => Some(t.view()),
                None => orig.as_ref().map(TensorRef::reborrow),
            })
            .collect();
        let mut outs = matmul.run(&views)?;
        if alpha != 1.0 {
            let a = alpha;
            match outs.first_mut() {
                Some(Tensor::F32(y)) => y.mapv_inplace(|v| v * a),
                Some(Tensor::F64(y)) => y.mapv_inplace(|v| v * f64::from(a)),
                Some(other) => {
                    let ty = other.elem_type();
                    let Tensor::F32(mut y) =
                        other.view().cast(epx_plugin_api::ElementType::Float)?
                    else {
                        return Err(OpError(format!("{op}: cannot scale in f32")));
                    };
                    y.mapv_inplace(|v| v * a);
                    *other = Tensor::F32(y).view().cast(ty)?;
                }
                None => return Err(OpError(format!("{op}: no output"))),
            }
        }
        Ok(outs)
    }))
}

/// One FusedMatMul operand in the layout MatMul reads, or `None` when it already is.
fn fused_operand(
    op: &str,
    t: &TensorRef<'_>,
    trans: bool,
    trans_batch: bool,
) -> OpResult<Option<Tensor>> {
    let rank = t.ndim();
    if rank < 2 || (!trans && !trans_batch) {
        if trans && rank < 2 {
            return Err(OpError(format!(
                "{op}: a transposed operand needs rank >= 2, got shape {:?}",
                t.shape()
            )));
        }
        return Ok(None);
    }
    // transBatch: the operand is stored [M, B.., K] (its row axis first) and read as
    // [B.., M, K]; the batch axes move ahead of it.
    let mut perm: Vec<usize> = (0..rank).collect();
    if trans_batch {
        perm = (1..rank - 1).chain([0, rank - 1]).collect();
    }
    if trans {
        perm.swap(rank - 2, rank - 1);
    }
    let transposed = crate::ops::shape::transpose(op, t, &perm)?;
    Ok(Some(transposed))
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
    use ndarray::{ArrayD, IxDyn};

    fn ms(op: &str) -> NodeDef {
        let mut n = NodeDef::new(op, 1);
        n.domain = crate::kernel::MS.into();
        n
    }

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
    }

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

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> Vec<Vec<f32>> {
        let outputs = n.num_outputs;
        let n = n.with_io(inputs.len(), outputs);
        let k = crate::ops::registry().build(&n).unwrap();
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
            .unwrap()
            .iter()
            .map(|t| t.as_array::<f32>().unwrap().iter().copied().collect())
            .collect()
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
        }
    }

    fn gelu(x: f32) -> f32 {
        0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2))
    }

    #[test]
    fn gelu_family() {
        let x = [-2.0, -0.5, 0.0, 1.0, 3.0];
        let b = [0.5, 0.5, -0.5, 0.0, 1.0];
        let y = run(
            ms("BiasGelu"),
            vec![Some(f32s(&[5], &x)), Some(f32s(&[5], &b))],
        );
        let want: Vec<f32> = x.iter().zip(&b).map(|(x, b)| gelu(x + b)).collect();
        close(&y[0], &want, 1e-6);
        // FastGelu: the tanh form, with and without its optional bias.
        let tanh_gelu = |x: f32| {
            0.5 * x
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        };
        let y = run(ms("FastGelu"), vec![Some(f32s(&[5], &x))]);
        close(&y[0], &x.map(tanh_gelu), 1e-6);
        let y = run(
            ms("FastGelu"),
            vec![Some(f32s(&[5], &x)), Some(f32s(&[5], &b))],
        );
        let want: Vec<f32> = x.iter().zip(&b).map(|(x, b)| tanh_gelu(x + b)).collect();
        close(&y[0], &want, 1e-6);
        let y = run(
            ms("QuickGelu").with_attr("alpha", AttrValue::Float(1.5)),
            vec![Some(f32s(&[5], &x))],
        );
        close(&y[0], &x.map(|x| x / (1.0 + (-1.5 * x).exp())), 1e-6);
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
        let out = run(
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
        close(&out[0], &want, 1e-5);
        close(&out[3], &sums, 0.0);
        // The simplified form: x / rms(x) * gamma over the same sum.
        let out = run(
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
        close(&out[0], &want, 1e-5);
    }

    #[test]
    fn fused_conv_with_sum_and_activation() {
        // 1x1 convolution of a 1-channel 2x2 image by weight 2, bias 1, plus Z, LeakyRelu(0.1).
        let n = ms("FusedConv")
            .with_attr("activation", AttrValue::String(b"LeakyRelu".to_vec()))
            .with_attr("activation_params", AttrValue::Floats(vec![0.1]));
        let x = f32s(&[1, 1, 2, 2], &[1.0, -2.0, 3.0, -4.0]);
        let w = f32s(&[1, 1, 1, 1], &[2.0]);
        let b = f32s(&[1], &[1.0]);
        let z = f32s(&[1, 1, 2, 2], &[0.0, 1.0, -10.0, 0.0]);
        let y = run(
            n.clone(),
            vec![Some(x.clone()), Some(w.clone()), Some(b.clone()), Some(z)],
        );
        close(&y[0], &[3.0, -0.2, -0.3, -0.7], 1e-6);
        let y = run(n, vec![Some(x), Some(w), Some(b)]);
        close(&y[0], &[3.0, -0.3, 7.0, -0.7], 1e-6);
        let bad = ms("FusedConv").with_attr("activation", AttrValue::String(b"Swish".to_vec()));
        let err = crate::ops::registry()
            .build(&bad.with_io(2, 1))
            .err()
            .expect("an unknown activation is refused");
        assert!(err.0.contains("activation `Swish` is not one of"), "{err}");
    }

    #[test]
    fn fused_matmul_transposes_and_scales() {
        // A stored transposed [K=3, M=2], B stored transposed [N=2, K=3].
        let at = f32s(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let bt = f32s(&[2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        let n = ms("FusedMatMul")
            .with_attr("transA", AttrValue::Int(1))
            .with_attr("transB", AttrValue::Int(1))
            .with_attr("alpha", AttrValue::Float(0.5));
        let y = run(n, vec![Some(at), Some(bt)]);
        // A = [[1,2,3],[4,5,6]], B = [[1,0],[0,1],[1,0]]: A·B = [[4,2],[10,5]], halved.
        close(&y[0], &[2.0, 1.0, 5.0, 2.5], 0.0);
        // transBatchA: A stored [M=1, B=2, K=2] is read as [2, 1, 2].
        let a = f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f32s(&[2, 2, 1], &[1.0, 1.0, 1.0, 0.0]);
        let n = ms("FusedMatMul").with_attr("transBatchA", AttrValue::Int(1));
        let y = run(n, vec![Some(a), Some(b)]);
        close(&y[0], &[3.0, 3.0], 0.0);
    }

    #[test]
    fn bias_softmax_and_integer_matmul_to_float() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.0, 1.0]);
        let bias = f32s(&[3], &[0.5, -0.5, 0.0]);
        let y = run(
            ms("BiasSoftmax").with_attr("axis", AttrValue::Int(-1)),
            vec![Some(x), Some(bias)],
        );
        let row = |v: [f32; 3]| {
            let e: Vec<f32> = v.iter().map(|x| x.exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        let want: Vec<f32> = [row([1.5, 1.5, 3.0]), row([-0.5, -0.5, 1.0])].concat();
        close(&y[0], &want, 1e-6);

        // [1, 2] u8 (zero point 1) times [2, 2] i8, scaled by 0.5 · 0.25, plus a bias.
        let a = Tensor::from_vec(&[1, 2], vec![3u8, 5]).unwrap();
        let b = Tensor::from_vec(&[2, 2], vec![1i8, -2, 4, 3]).unwrap();
        let n = ms("MatMulIntegerToFloat");
        let y = run(
            n,
            vec![
                Some(a),
                Some(b),
                Some(Tensor::scalar(0.5f32)),
                Some(Tensor::scalar(0.25f32)),
                Some(Tensor::scalar(1u8)),
                None,
                Some(f32s(&[2], &[1.0, -1.0])),
            ],
        );
        // (3-1)·1 + (5-1)·4 = 18, (3-1)·-2 + (5-1)·3 = 8.
        close(&y[0], &[18.0 * 0.125 + 1.0, 8.0 * 0.125 - 1.0], 0.0);
    }

    #[test]
    fn nhwc_max_pool_pools_channels_last() {
        // [1, 2, 2, 2] NHWC: channel 0 holds 1..4, channel 1 holds 10..40.
        let x = Tensor::from_vec(&[1, 2, 2, 2], vec![1u8, 10, 2, 20, 3, 30, 4, 40]).unwrap();
        let n = ms("NhwcMaxPool").with_attr("kernel_shape", AttrValue::Ints(vec![2, 2]));
        let k = crate::ops::registry().build(&n.with_io(1, 1)).unwrap();
        let y = k.run(&[Some(x.view())]).unwrap();
        assert_eq!(
            y[0],
            Tensor::from_vec(&[1, 1, 1, 2], vec![4u8, 40]).unwrap()
        );
    }
}
