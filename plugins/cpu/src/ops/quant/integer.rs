//! The integer products: MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv. Unsigned
//! activations by signed weights are summed as ONNX Runtime sums them at the level that runs
//! ([`crate::fast::qgemm::Sums::like_onnxruntime`]): in saturated pairs at `avx2` (QLinearConv,
//! MatMulInteger, QLinearMatMul; ConvInteger is exact there too), exactly elsewhere.
//!
//! With 8-bit operands they run on the packed integer GEMM ([`crate::ops::quant::pack`]),
//! exactly. Other cases (16-bit types, 3-D convolutions, a broadcast batched B) run through the
//! float32 MatMul and Conv kernels, still exactly: every partial sum of integers below 2^24 is
//! exact in float32, and a product whose sums could exceed that is split into two with the
//! second operand's low and high 4 bits; only a product too deep even for that runs on f64.
//! QLinear* requantize the exact product once (see [`crate::fast::round`]).

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::fast::round::{low_byte, round_even_f64};
use crate::fast::{qconv, qmatmul};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::quant::linear::{int_range, int_tensor, int_values};
use crate::ops::quant::pack::{FastQConv, FastQMatMul, WithPackedWeights};
use crate::ops::quant::pairs::{self, Product};
use crate::ops::util::args::{input, opt_input, scalar_f64};
use crate::ops::util::indexing::contiguous;
use crate::ops::util::num::float_values;
use crate::ops::util::spatial::SpatialAttrs;
use crate::tensor::{Tensor, TensorRef};
use epx_plugin_api::ElementType;
use half::{bf16, f16};
use std::sync::Arc;

pub fn register(reg: &mut Registry) {
    add(reg, "MatMulInteger", 10, build_matmul_integer);
    add(reg, "QLinearMatMul", 10, build_qlinear_matmul);
    add(reg, "ConvInteger", 10, build_conv_integer);
    add(reg, "QLinearConv", 10, build_qlinear_conv);
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
            Some(contiguous(a).iter().map(|&v| f32::from(v) - z).collect())
        }
        (TensorRef::I8(a), Some(z)) if zp.is_none_or(|z| z.elem_type() == t.elem_type()) => {
            Some(contiguous(a).iter().map(|&v| f32::from(v) - z).collect())
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
    let bv = contiguous(&bv);
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
    product: &Product<'_>,
) -> OpResult<(Vec<usize>, Acc)> {
    let (shape, acc) = exact_integer_product(
        op,
        k,
        (a, a_name, a_zp, a_axis),
        (b, b_name, b_zp, b_axis),
        depth,
    )?;
    // Where this level's pairs saturate, what they take away ([`pairs`]).
    let Some((ar, br)) = pairs::saturating(a, b) else {
        return Ok((shape, acc));
    };
    let za = match a_zp {
        Some(TensorRef::U8(z)) => z.iter().next().copied().unwrap_or(0),
        _ => 0,
    };
    let Some(lost) = pairs::losses(product, (ar, za), br, &shape) else {
        return Ok((shape, acc));
    };
    let acc = acc.into_f64();
    let acc = acc.iter().zip(&lost).map(|(&v, &l)| v - l as f64).collect();
    Ok((shape, Acc::Wide(acc)))
}

/// The exact integer product of [`integer_product`].
fn exact_integer_product(
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
            contiguous(&t.view())
                .iter()
                .map(|&x| f64::from(x))
                .collect(),
        )),
        Some(t) => Ok((t.shape().to_vec(), t.view().to_f64_vec())),
        None => Err(OpError("inner kernel returned no output".into())),
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
    let fast = Arc::new(FastQMatMul::default());
    let packs = fast.clone();
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
            &Product::MatMul,
        )?;
        let v = v.into_f64();
        let v: Vec<i32> = v.into_iter().map(|x| x as i32).collect();
        one(Tensor::from_vec(&shape, v))
    });
    Ok(Box::new(WithPackedWeights {
        inner,
        fast: packs,
        weights: 1,
        zero_point: 3,
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

/// Requantizes `acc` (integer accumulators) with `factor` (per element) and `y_zero_point` as
/// ONNX Runtime does (MlasRequantizeOutput): the accumulator to float32, times the factor in
/// float32, rounded half to even, plus the zero point, saturated; NaN gives the lowest value.
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
        let d = f64::from(c as f32 * factor(i) as f32);
        if d.is_nan() {
            lo as f64
        } else {
            (round_even_f64(d) + *z as f64).clamp(lo as f64, hi as f64)
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
    let fast = Arc::new(FastQMatMul::default());
    let packs = fast.clone();
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
            &Product::MatMul,
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
    Ok(Box::new(WithPackedWeights {
        inner,
        fast: packs,
        weights: 3,
        zero_point: 5,
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

fn build_conv_integer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let conv = inner_kernel(n, "Conv", 11, &CONV_ATTRS)?;
    let fast = Arc::new(FastQConv::new(n)?);
    let packs = fast.clone();
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
        // Exact at every level, as ONNX Runtime's ConvInteger ([`FastQConv`]).
        let (shape, v) = exact_integer_product(
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
    Ok(Box::new(WithPackedWeights {
        inner,
        fast: packs,
        weights: 1,
        zero_point: 3,
    }))
}

fn build_qlinear_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let conv = inner_kernel(n, "Conv", 11, &CONV_ATTRS)?;
    let attrs = SpatialAttrs::parse(n)?;
    let group = usize::try_from(n.attr_int_or("group", 1)?).unwrap_or(0);
    let fast = Arc::new(FastQConv::new(n)?);
    let packs = fast.clone();
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
            &Product::Conv {
                attrs: &attrs,
                group,
            },
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
                // `acc + bias` to float32 once, times the factor in float32 (ONNX Runtime's
                // roundings; `requantize` below takes the product as it is).
                *a = f64::from((*a + b) as f32 * f as f32);
            }
        }
        one(requantize(&op, &shape, &acc, |_| 1.0, yzp))
    });
    Ok(Box::new(WithPackedWeights {
        inner,
        fast: packs,
        weights: 3,
        zero_point: 5,
    }))
}

/// QLinearConv's requantization in one pass to uint8 or int8 with a scalar zero point:
/// `round(f32(acc + bias[c]) · f32(factor[c])) + zp` saturated, channel `c` per run of `plane`
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
                let d = f64::from((get(k * plane + i) + b) as f32 * f as f32);
                let q = if d.is_nan() {
                    lo
                } else {
                    (round_even_f64(d) + z).max(lo).min(hi)
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
    use crate::ops::quant::tests::*;

    use crate::kernel::NodeDef;
    use crate::tensor::Tensor;
    use ndarray::{ArrayD, IxDyn};

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

    /// Unsigned activations by signed weights sum as ONNX Runtime's 8-bit kernels sum them on
    /// the CPUs of each level: each pair of products saturated to i16 at `avx2` (`vpmaddubsw`),
    /// exactly elsewhere; unsigned weights always exactly. Every level this CPU has.
    #[test]
    fn integer_sums_follow_onnxruntime_at_every_level() {
        let a = t(&[1, 4], vec![255u8; 4]);
        let node = NodeDef::new("MatMulInteger", 10).with_io(2, 1);
        let run_with = |b: Tensor| {
            let k = crate::ops::registry().build(&node).unwrap();
            k.prepare(&[None, Some(b.view())]);
            let out = k.run(&[Some(a.view()), Some(b.view())]).unwrap();
            out[0]
                .as_array::<i32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<i32>>()
        };
        for isa in crate::fast::ISAS.iter() {
            let Some((signed, unsigned)) = crate::fast::with_isa(isa, || {
                (
                    run_with(t(&[4, 1], vec![127i8; 4])),
                    run_with(t(&[4, 1], vec![255u8; 4])),
                )
            }) else {
                println!("{}: skipped (this CPU lacks it)", isa.name);
                continue;
            };
            let want = if isa.saturating_pairs {
                2 * 32767
            } else {
                4 * 255 * 127
            };
            println!("{}: u8 · s8 sums {signed:?}", isa.name);
            assert_eq!(signed, vec![want], "{}", isa.name);
            assert_eq!(unsigned, vec![4 * 255 * 255], "{}", isa.name);
        }
    }

    /// QLinearConv with uint8 activations and int8 weights gives, at every level this CPU
    /// has, the bytes of sums taken as ONNX Runtime takes them for that level: at `avx2` in
    /// pairs of consecutive depths of its channels-last column (kernel tap, input channel)
    /// saturated to i16, elsewhere exactly; on each path (im2col with an odd and an even
    /// channel count, channel quads, pointwise, grouped, 1-D, and 3-D on the general path).
    /// A depthwise convolution sums exactly at every level, as ONNX Runtime's depthwise kernels
    /// do. The data are extreme enough that the two rules give other bytes.
    #[test]
    fn qlinear_conv_sums_follow_onnxruntime_at_every_level() {
        use crate::kernel::AttrValue;
        let mut rnd = byte_rng(58);
        // (x shape, w shape, group, stride, pad)
        type Case = (Vec<usize>, Vec<usize>, usize, usize, usize);
        let cases: [Case; 8] = [
            (vec![1, 5, 6, 6], vec![16, 5, 3, 3], 1, 1, 1),
            (vec![1, 6, 7, 7], vec![8, 6, 3, 3], 1, 2, 1),
            (vec![1, 8, 6, 6], vec![16, 8, 3, 3], 1, 1, 1),
            (vec![1, 16, 5, 5], vec![8, 16, 1, 1], 1, 1, 0),
            (vec![1, 6, 6, 6], vec![8, 3, 3, 3], 2, 1, 1),
            (vec![1, 8, 6, 6], vec![8, 1, 3, 3], 8, 1, 1),
            (vec![1, 7, 12], vec![8, 7, 5], 1, 1, 2),
            (vec![1, 3, 3, 4, 4], vec![8, 3, 2, 2, 2], 1, 1, 1),
        ];
        let mut told_apart = 0;
        for (ci, (xs, ws, group, stride, pad)) in cases.iter().enumerate() {
            let rank = xs.len() - 2;
            let x: Vec<u8> = (0..xs.iter().product::<usize>())
                .map(|_| if rnd() < 150 { 255 } else { rnd() })
                .collect();
            let w: Vec<i8> = (0..ws.iter().product::<usize>())
                .map(|_| match rnd() % 4 {
                    0 | 1 => 127,
                    2 => -128,
                    _ => rnd() as i8,
                })
                .collect();
            let zx = 5u8;
            let node = NodeDef::new("QLinearConv", 10)
                .with_io(8, 1)
                .with_attr("group", AttrValue::Int(*group as i64))
                .with_attr("strides", AttrValue::Ints(vec![*stride as i64; rank]))
                .with_attr("pads", AttrValue::Ints(vec![*pad as i64; 2 * rank]));
            let inputs = [
                Some(t(xs, x.clone())),
                Some(Tensor::scalar(1.0f32)),
                Some(Tensor::scalar(zx)),
                Some(t(ws, w.clone())),
                Some(Tensor::scalar(1.0f32)),
                Some(Tensor::scalar(0i8)),
                Some(Tensor::scalar(16384.0f32)),
                Some(Tensor::scalar(128u8)),
            ];
            let sums =
                |pairs: bool| naive_conv_sums(&x, xs, zx, &w, ws, *group, *stride, *pad, pairs);
            let bytes = |acc: Vec<i64>| -> Vec<u8> {
                acc.iter()
                    .map(|&a| (round_even_f64(a as f64 / 16384.0) + 128.0).clamp(0.0, 255.0) as u8)
                    .collect()
            };
            let depthwise = ws[1] == 1 && ws[0] == *group;
            let (exact, paired) = (bytes(sums(false)), bytes(sums(!depthwise)));
            told_apart += usize::from(exact != paired);
            for isa in crate::fast::ISAS.iter() {
                let Some(got) = crate::fast::with_isa(isa, || {
                    let k = crate::ops::registry().build(&node).unwrap();
                    let refs: Vec<_> = inputs
                        .iter()
                        .map(|t| t.as_ref().map(Tensor::view))
                        .collect();
                    k.prepare(&refs);
                    let out = k.run(&refs).unwrap();
                    out[0]
                        .as_array::<u8>()
                        .unwrap()
                        .iter()
                        .copied()
                        .collect::<Vec<u8>>()
                }) else {
                    println!("case {ci}: {} skipped (this CPU lacks it)", isa.name);
                    continue;
                };
                let want = if isa.saturating_pairs {
                    &paired
                } else {
                    &exact
                };
                assert_eq!(&got, want, "case {ci} on {}", isa.name);
            }
        }
        assert_eq!(
            told_apart, 7,
            "every case but the depthwise one tells the two rules apart"
        );
    }

    /// `Σ (x - zx) · w` of a convolution (any rank; the padding holds `zx`), each output's
    /// products taken in the order (kernel tap, input channel) and, with `pairs`, summed two at
    /// a time with each pair of raw products `x · w` saturated to i16.
    #[allow(clippy::too_many_arguments)]
    fn naive_conv_sums(
        x: &[u8],
        xs: &[usize],
        zx: u8,
        w: &[i8],
        ws: &[usize],
        group: usize,
        stride: usize,
        pad: usize,
        pairs: bool,
    ) -> Vec<i64> {
        let (m, cg) = (ws[0], ws[1]);
        let (ins, ks) = (&xs[2..], &ws[2..]);
        let outs: Vec<usize> = ins
            .iter()
            .zip(ks)
            .map(|(&i, &k)| (i + 2 * pad - k) / stride + 1)
            .collect();
        let count = |d: &[usize]| d.iter().product::<usize>();
        let index = |mut i: usize, dims: &[usize]| -> Vec<usize> {
            let mut v = vec![0; dims.len()];
            for d in (0..dims.len()).rev() {
                v[d] = i % dims[d];
                i /= dims[d];
            }
            v
        };
        let (taps, mg) = (count(ks), m / group);
        let mut out = Vec::new();
        for oc in 0..m {
            let g = oc / mg;
            for o in 0..count(&outs) {
                let op = index(o, &outs);
                let mut raw = Vec::new();
                for tap in 0..taps {
                    let kp = index(tap, ks);
                    let pos: Option<usize> = (0..ins.len()).try_fold(0, |acc, d| {
                        let i = (op[d] * stride + kp[d])
                            .checked_sub(pad)
                            .filter(|&i| i < ins[d])?;
                        Some(acc * ins[d] + i)
                    });
                    for ch in 0..cg {
                        let xv = pos.map_or(zx, |p| x[(g * cg + ch) * count(ins) + p]);
                        raw.push((i64::from(xv), i64::from(w[(oc * cg + ch) * taps + tap])));
                    }
                }
                let wsum: i64 = raw.iter().map(|r| r.1).sum();
                let prods: Vec<i64> = raw.iter().map(|r| r.0 * r.1).collect();
                let total: i64 = if pairs {
                    prods
                        .chunks(2)
                        .map(|p| p.iter().sum::<i64>().clamp(-32768, 32767))
                        .sum()
                } else {
                    prods.iter().sum()
                };
                out.push(total - i64::from(zx) * wsum);
            }
        }
        out
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
                .map(|(i, a)| {
                    let c = (i / plane) % m;
                    f64::from((a + bias[c]) as f32 * factors[c] as f32)
                })
                .collect();
            let want = requantize("QLinearConv", &shape, &scaled, |_| 1.0, &zp.view()).unwrap();
            for acc in &kinds {
                let got = requantize_planes(acc, &shape, plane, &bias, &factors, &zp.view())
                    .expect("uint8 and int8 take the one-pass path");
                assert_eq!(got.view().to_f64_vec(), want.view().to_f64_vec());
            }
        }
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
