//! Shape and data-movement operators: Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
//! Shape, Size, Identity, Dropout (inference), Constant, ConstantOfShape, Cast, CastLike,
//! Expand, Tile, Slice and Range. All work on every element type unless ONNX says otherwise.

use epx_plugin_api::ElementType;
use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};

use crate::ops::util::num::Num;

use crate::ops::util::broadcast::broadcast_shapes;

use crate::limits::checked_numel;

use crate::error::{OpError, OpResult};
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::narrow::{E8m0Round, NarrowCast};
use crate::ops::util::args::{input, normalize_axes, opt_input, same_type, typed_like};
use crate::tensor::{Elem, Tensor, TensorRef};
use crate::{bail, dispatch_all, dispatch_any, with_types};

pub fn register(reg: &mut Registry) {
    add(reg, "Reshape", 1, build_reshape);
    add(reg, "Flatten", 1, build_flatten);
    add(reg, "Transpose", 1, build_transpose);
    add(reg, "Squeeze", 1, build_squeeze);
    add(reg, "Unsqueeze", 1, build_unsqueeze);
    add(reg, "Shape", 1, build_shape);
    add(reg, "Size", 1, build_size);
    add(reg, "Identity", 1, build_identity);
    add(reg, "Dropout", 1, build_dropout);
    add(reg, "Constant", 1, build_constant);
    add(reg, "ConstantOfShape", 9, build_constant_of_shape);
    add(reg, "Cast", 1, build_cast);
    add(reg, "BitCast", 26, build_bitcast);
    add(reg, "CastLike", 15, build_cast_like);
    add(reg, "Expand", 8, build_expand);
    add(reg, "Tile", 6, build_tile);
    add(reg, "Slice", 1, build_slice);
    add(reg, "Range", 11, build_range);
}

/// Reshapes to `shape` in C order (copying only when the input is not contiguous).
pub fn reshape_ref(op: &str, t: &TensorRef<'_>, shape: &[usize]) -> OpResult<Tensor> {
    fn go<T: Elem>(op: &str, a: &ArrayViewD<'_, T>, shape: &[usize]) -> OpResult<Tensor> {
        let r = a
            .to_shape(IxDyn(shape))
            .map_err(|_| OpError(format!("{op}: cannot reshape {:?} to {shape:?}", a.shape())))?;
        Ok(r.into_owned().into())
    }
    dispatch_any!(t.clone(), |a| go(op, &a, shape), op)
}

/// A kernel whose output is input 0 reshaped to what `shape` computes from the inputs: the
/// output is input 0's elements (copied by [`OpKernel::run`], moved by a program that no longer
/// needs the input, see [`OpKernel::reshaped_shape`]).
pub fn reshaping<F>(op: String, shape: F) -> Box<dyn OpKernel>
where
    F: Fn(&[Option<TensorRef<'_>>]) -> OpResult<Vec<usize>> + Send + Sync + 'static,
{
    Box::new(Reshaping { op, shape })
}

struct Reshaping<F> {
    op: String,
    shape: F,
}

impl<F> OpKernel for Reshaping<F>
where
    F: Fn(&[Option<TensorRef<'_>>]) -> OpResult<Vec<usize>> + Send + Sync + 'static,
{
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let dims = (self.shape)(inputs)?;
        let x = input(&self.op, inputs, 0)?;
        Ok(vec![reshape_ref(&self.op, x, &dims)?])
    }

    fn reshaped_shape(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<OpResult<Vec<usize>>> {
        Some((self.shape)(inputs))
    }
}

/// Resolves a Reshape target (0 copies the input dim unless `allowzero`, one -1 is inferred).
pub fn reshape_dims(
    op: &str,
    input: &[usize],
    spec: &[i64],
    allowzero: bool,
) -> OpResult<Vec<usize>> {
    let numel = checked_numel(input)?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        out.push(match d {
            -1 => {
                if infer.replace(i).is_some() {
                    bail!("{op}: more than one -1 in shape {spec:?}");
                }
                1
            }
            0 if !allowzero => *input.get(i).ok_or_else(|| {
                OpError(format!(
                    "{op}: shape {spec:?} copies dim {i} but the input {input:?} has rank {}",
                    input.len()
                ))
            })?,
            d if d < 0 => bail!("{op}: invalid dim {d} in shape {spec:?}"),
            d => usize::try_from(d).map_err(|_| OpError(format!("{op}: dim {d} too large")))?,
        });
    }
    let known = checked_numel(&out)?;
    if let Some(i) = infer {
        if known == 0 || numel % known != 0 {
            bail!("{op}: cannot infer -1 in shape {spec:?} for input shape {input:?}");
        }
        out[i] = numel / known;
    } else if known != numel {
        bail!("{op}: cannot reshape input of shape {input:?} ({numel} elements) to {spec:?}");
    }
    Ok(out)
}

fn build_reshape(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let allowzero = n.opset >= 14 && n.attr_int_or("allowzero", 0)? != 0;
    let attr_shape = if n.opset < 5 {
        Some(n.req_ints("shape")?)
    } else {
        None
    };
    Ok(reshaping(op.clone(), move |inputs| {
        let x = input(&op, inputs, 0)?;
        let spec = match &attr_shape {
            Some(s) => s.clone(),
            None => input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: shape"))?,
        };
        reshape_dims(&op, x.shape(), &spec, allowzero)
    }))
}

fn build_flatten(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 1)?;
    Ok(reshaping(op.clone(), move |inputs| {
        let x = input(&op, inputs, 0)?;
        let r = x.ndim() as i64;
        if axis < -r || axis > r {
            bail!("{op}: axis {axis} is out of range for rank {r}");
        }
        let a = if axis < 0 { axis + r } else { axis } as usize;
        let outer: usize = x.shape()[..a].iter().product();
        let inner: usize = x.shape()[a..].iter().product();
        Ok(vec![outer, inner])
    }))
}

fn transpose_typed<T: Elem>(a: ArrayViewD<'_, T>, perm: &[usize]) -> OpResult<Tensor> {
    if crate::fast::enabled()
        && let Some(t) = batched_transpose(&a, perm)
    {
        return Ok(t.into());
    }
    Ok(crate::strided::to_owned(&a.permuted_axes(IxDyn(perm)))?.into())
}

/// A transpose that is, once axes of size 1 are dropped and axes that stay together are merged,
/// a copy, a 2-D transpose or a batch of them (`[B, R, C] -> [B, C, R]`), done in 32×32 tiles
/// over the contiguous input. `None` for any other permutation (or a non-contiguous input): the
/// general path takes it.
fn batched_transpose<T: Elem>(a: &ArrayViewD<'_, T>, perm: &[usize]) -> Option<ndarray::ArrayD<T>> {
    let data = a.as_slice()?;
    let shape = a.shape();
    // The permutation over the axes longer than 1, renumbered 0..k.
    let long: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
    let q: Vec<usize> = perm
        .iter()
        .filter(|&&p| shape[p] != 1)
        .map(|p| long.iter().position(|d| d == p))
        .collect::<Option<_>>()?;
    // Runs of q that stay in order merge into one axis: (first axis, merged length).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for &d in &q {
        match groups.last_mut() {
            Some((first, len)) if *first + *len == d => *len += 1,
            _ => groups.push((d, 1)),
        }
    }
    let size = |(first, len): (usize, usize)| -> usize {
        long[first..first + len].iter().map(|&d| shape[d]).product()
    };
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let k = long.len();
    // Two swapped groups `[R, C] -> [C, R]`, after a leading batch group and before a trailing
    // group that stays last (runs of `inner` contiguous elements, as in a transformer's
    // `[B, S, H, D] -> [B, H, S, D]`).
    let (batch, rows, cols, inner) = match groups.as_slice() {
        [] | [_] => return ndarray::ArrayD::from_shape_vec(out_shape, data.to_vec()).ok(),
        [g1, g0] if g1.0 > g0.0 => (1, size(*g0), size(*g1), 1),
        [b, g1, g0] if b.0 == 0 && g1.0 > g0.0 => (size(*b), size(*g0), size(*g1), 1),
        [g1, g0, t] if g1.0 > g0.0 && t.0 + t.1 == k && t.0 > g1.0 => {
            (1, size(*g0), size(*g1), size(*t))
        }
        [b, g1, g0, t] if b.0 == 0 && g1.0 > g0.0 && t.0 + t.1 == k && t.0 > g1.0 => {
            (size(*b), size(*g0), size(*g1), size(*t))
        }
        _ => return None,
    };
    // A recycled buffer where one fits (a new one is faulted in page by page).
    let mut out = crate::scratch::take_any::<T>(data.len()).ok()?;
    // Every element is written once below; the loops visit each (r, c) exactly once.
    out.resize(data.len(), *data.first()?);
    if inner > 1 {
        let plane = rows * cols * inner;
        for (src, dst) in data.chunks_exact(plane).zip(out.chunks_exact_mut(plane)) {
            for (c, block) in dst.chunks_exact_mut(rows * inner).enumerate() {
                for (r, run) in block.chunks_exact_mut(inner).enumerate() {
                    run.copy_from_slice(&src[(r * cols + c) * inner..][..inner]);
                }
            }
        }
        return ndarray::ArrayD::from_shape_vec(out_shape, out).ok();
    }
    const TILE: usize = 16;
    for (src, dst) in data
        .chunks_exact(rows * cols)
        .zip(out.chunks_exact_mut(rows * cols))
        .take(batch)
    {
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    for c in c0..(c0 + TILE).min(cols) {
                        dst[c * rows + r] = src[r * cols + c];
                    }
                }
            }
        }
    }
    ndarray::ArrayD::from_shape_vec(out_shape, out).ok()
}

/// BitCast: the same bytes (little endian) read as another type of the same width.
fn build_bitcast(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let code = n.req_int("to")?;
    let to = i32::try_from(code)
        .ok()
        .and_then(ElementType::from_onnx)
        .ok_or_else(|| n.error(format_args!("unknown element type code {code}")))?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let from = x.elem_type();
        if from.byte_size().is_none() || from.byte_size() != to.byte_size() {
            bail!("{op}: {from} and {to} do not have the same bit width");
        }
        let owned = x.try_to_owned()?;
        let mut bytes = crate::limits::zeros_checked(owned.byte_len(), &op)?;
        owned.write_bytes(&mut bytes)?;
        one(Tensor::from_bytes(to, x.shape(), &bytes))
    }))
}

/// `x` with its axes permuted (`perm` must be a permutation of its axes).
pub(crate) fn transpose(op: &str, x: &TensorRef<'_>, perm: &[usize]) -> OpResult<Tensor> {
    dispatch_any!(x.clone(), |a| transpose_typed(a, perm), op)
}

fn build_transpose(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let perm_attr = n.attr_ints("perm")?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let r = x.ndim();
        let perm: Vec<usize> = match &perm_attr {
            None => (0..r).rev().collect(),
            Some(p) => {
                let mut seen = vec![false; r];
                let mut out = Vec::with_capacity(r);
                for &v in p {
                    let u = usize::try_from(v).ok().filter(|&u| u < r && !seen[u]);
                    let Some(u) = u else {
                        bail!("{op}: perm {p:?} is not a permutation of 0..{r}");
                    };
                    seen[u] = true;
                    out.push(u);
                }
                if out.len() != r {
                    bail!("{op}: perm {p:?} is not a permutation of 0..{r}");
                }
                out
            }
        };
        one(dispatch_any!(x.clone(), |a| transpose_typed(a, &perm), &op))
    }))
}

/// Axes from the attribute (before `input_from`) or from optional input 1.
fn axes_of(
    op: &str,
    attr: &Option<Vec<i64>>,
    inputs: &[Option<TensorRef<'_>>],
) -> OpResult<Option<Vec<i64>>> {
    match attr {
        Some(a) => Ok(Some(a.clone())),
        None => opt_input(inputs, 1)
            .map(|t| t.to_i64_vec(&format!("{op}: axes")))
            .transpose(),
    }
}

fn build_squeeze(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let attr = if n.opset < 13 {
        n.attr_ints("axes")?
    } else {
        None
    };
    Ok(reshaping(op.clone(), move |inputs| {
        let x = input(&op, inputs, 0)?;
        let shape = x.shape();
        let axes = match axes_of(&op, &attr, inputs)? {
            Some(a) => {
                let ax = normalize_axes(&op, &a, shape.len())?;
                for &d in &ax {
                    if shape[d] != 1 {
                        bail!("{op}: cannot squeeze axis {d} of size {}", shape[d]);
                    }
                }
                ax
            }
            None => (0..shape.len()).filter(|&d| shape[d] == 1).collect(),
        };
        Ok(shape
            .iter()
            .enumerate()
            .filter(|(d, _)| !axes.contains(d))
            .map(|(_, &s)| s)
            .collect())
    }))
}

fn build_unsqueeze(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let attr = if n.opset < 13 {
        Some(n.req_ints("axes")?)
    } else {
        None
    };
    Ok(reshaping(op.clone(), move |inputs| {
        let x = input(&op, inputs, 0)?;
        let Some(axes) = axes_of(&op, &attr, inputs)? else {
            bail!("{op}: missing required input 1 (axes)");
        };
        let rank = x.ndim() + axes.len();
        let ax = normalize_axes(&op, &axes, rank)?;
        let mut src = x.shape().iter();
        Ok((0..rank)
            .map(|d| {
                if ax.contains(&d) {
                    1
                } else {
                    src.next().copied().unwrap_or(1)
                }
            })
            .collect())
    }))
}

fn build_shape(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let start = n.attr_int_or("start", 0)?;
    let end = n.attr_int("end")?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let r = x.ndim() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
        let dims: Vec<i64> = x
            .shape()
            .iter()
            .skip(s)
            .take(e.saturating_sub(s))
            .map(|&d| d as i64)
            .collect();
        let len = dims.len();
        one(Tensor::from_vec(&[len], dims))
    }))
}

fn build_size(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        one(Ok(Tensor::scalar(input(&op, inputs, 0)?.len() as i64)))
    }))
}

fn build_identity(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        one(Ok(input(&op, inputs, 0)?.try_to_owned()?))
    }))
}

fn build_dropout(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let outputs = n.num_outputs;
    if n.opset < 7 && n.attr_int_or("is_test", 0)? == 0 && outputs > 1 {
        return Err(n.error("training mode (is_test=0) is not supported"));
    }
    let seed = n.attr_int("seed")?;
    // Draws of one kernel: each run takes the next from one sequence.
    let draws = std::sync::atomic::AtomicU64::new(0);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let training = match opt_input(inputs, 2) {
            Some(t) => t
                .expect_type::<bool>(&format!("{op}: training_mode"))?
                .iter()
                .any(|&b| b),
            None => false,
        };
        let ratio = match opt_input(inputs, 1) {
            Some(r) if training => {
                let v = crate::ops::util::num::float_values(&op, "ratio", r)?;
                match v.as_slice() {
                    [r] if (0.0..1.0).contains(r) => *r,
                    _ => bail!("{op}: ratio must be one value in [0, 1), got {v:?}"),
                }
            }
            _ if training => 0.5,
            _ => 0.0,
        };
        if ratio == 0.0 {
            let mut out = vec![x.try_to_owned()?];
            if outputs > 1 {
                out.push(Tensor::Bool(ArrayD::from_elem(IxDyn(x.shape()), true)));
            }
            return Ok(out);
        }
        // Training with a positive ratio: drop each element with probability `ratio` and
        // scale the kept ones by 1 / (1 - ratio). SplitMix64 from `seed` (or a fresh one).
        let run = draws.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut state = match seed {
            Some(s) => s as u64,
            None => {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(run);
                h.finish()
            }
        }
        .wrapping_add(run.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        let keep: Vec<bool> = (0..x.len()).map(|_| next() >= ratio).collect();
        let xv = x.to_f64_vec();
        let y: Vec<f64> = xv
            .iter()
            .zip(&keep)
            .map(|(v, &k)| if k { v / (1.0 - ratio) } else { 0.0 })
            .collect();
        let mut out = vec![crate::ops::util::num::tensor_from_f64(
            x.elem_type(),
            x.shape(),
            y,
        )?];
        if outputs > 1 {
            out.push(Tensor::from_vec(x.shape(), keep)?);
        }
        Ok(out)
    }))
}

fn constant_value(n: &NodeDef) -> OpResult<Tensor> {
    let mut found = n
        .attributes
        .iter()
        .filter(|(k, _)| k.starts_with("value") || k.as_str() == "sparse_value");
    let (Some((name, value)), None) = (found.next(), found.next()) else {
        return Err(n.error("exactly one value attribute is required"));
    };
    Ok(match value {
        AttrValue::Tensor(t) if name == "value" => t.clone(),
        AttrValue::Float(f) if name == "value_float" => Tensor::scalar(*f),
        AttrValue::Int(i) if name == "value_int" => Tensor::scalar(*i),
        AttrValue::Floats(v) if name == "value_floats" => Tensor::from_vec(&[v.len()], v.clone())?,
        AttrValue::Ints(v) if name == "value_ints" => Tensor::from_vec(&[v.len()], v.clone())?,
        _ if name.starts_with("value_string") => {
            return Err(n.error("string tensors are not supported"));
        }
        other => {
            return Err(n.error(format_args!(
                "unsupported value attribute '{name}' ({other:?})"
            )));
        }
    })
}

fn build_constant(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let t = constant_value(n)?;
    Ok(kernel(move |_| Ok(vec![t.clone()])))
}

fn fill<T: Elem>(v: ArrayViewD<'_, T>, shape: &[usize]) -> OpResult<Tensor> {
    let x = v.iter().next().copied().unwrap_or_default();
    Ok(ArrayD::from_elem(IxDyn(shape), x).into())
}

fn shape_input(op: &str, t: &TensorRef<'_>) -> OpResult<Vec<usize>> {
    let dims = t
        .to_i64_vec(&format!("{op}: shape"))?
        .into_iter()
        .map(|d| {
            usize::try_from(d).map_err(|_| OpError(format!("{op}: negative dim {d} in shape")))
        })
        .collect::<OpResult<Vec<_>>>()?;
    checked_numel(&dims)?;
    Ok(dims)
}

fn build_constant_of_shape(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let value = match n.attr_tensor("value")? {
        Some(t) if t.len() == 1 => t.clone(),
        Some(t) => {
            return Err(n.error(format_args!(
                "value must have one element, got shape {:?}",
                t.shape()
            )));
        }
        None => Tensor::scalar(0.0f32),
    };
    Ok(kernel(move |inputs| {
        let shape = shape_input(&op, input(&op, inputs, 0)?)?;
        one(dispatch_any!(value.view(), |v| fill(v, &shape), &op))
    }))
}

fn cast_target(n: &NodeDef) -> OpResult<ElementType> {
    let to = n.req_int("to").or_else(|e| match n.attr_string("to") {
        // Opset 1 spelled the type as a string.
        Ok(Some(s)) => match s.to_ascii_uppercase().as_str() {
            "FLOAT" => Ok(1),
            "UINT8" => Ok(2),
            "INT8" => Ok(3),
            "UINT16" => Ok(4),
            "INT16" => Ok(5),
            "INT32" => Ok(6),
            "INT64" => Ok(7),
            "BOOL" => Ok(9),
            "FLOAT16" => Ok(10),
            "DOUBLE" => Ok(11),
            "UINT32" => Ok(12),
            "UINT64" => Ok(13),
            _ => Err(n.error(format_args!("unknown type name '{s}'"))),
        },
        _ => Err(e),
    })?;
    let ty = i32::try_from(to)
        .ok()
        .and_then(ElementType::from_onnx)
        .ok_or_else(|| n.error(format_args!("unknown element type code {to}")))?;
    check_castable(&n.op_type, ty)?;
    Ok(ty)
}

fn check_castable(op: &str, ty: ElementType) -> OpResult<()> {
    use ElementType::*;
    match ty {
        Undefined | String | Complex64 | Complex128 => {
            Err(OpError(format!("{op}: casting to {ty} is not supported")))
        }
        _ => Ok(()),
    }
}

/// The `saturate` and `round_mode` attributes of Cast and CastLike (opsets 19 and 25).
fn narrow_cast(n: &NodeDef) -> OpResult<NarrowCast> {
    let round = n.attr_string_or("round_mode", "up")?;
    Ok(NarrowCast {
        saturate: n.attr_int_or("saturate", 1)? != 0,
        e8m0_round: E8m0Round::parse(&round).ok_or_else(|| {
            n.error(format_args!(
                "round_mode `{round}` is not one of up, down, nearest"
            ))
        })?,
    })
}

fn build_cast(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let to = cast_target(n)?;
    let mode = narrow_cast(n)?;
    Ok(kernel(move |inputs| {
        one(input(&op, inputs, 0)?.cast_with(to, mode))
    }))
}

fn build_cast_like(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let mode = narrow_cast(n)?;
    Ok(kernel(move |inputs| {
        let to = input(&op, inputs, 1)?.elem_type();
        one(input(&op, inputs, 0)?.cast_with(to, mode))
    }))
}

fn expand_typed<T: Elem>(op: &str, a: ArrayViewD<'_, T>, shape: &[usize]) -> OpResult<Tensor> {
    let out = broadcast_shapes(a.shape(), shape).ok_or_else(|| {
        OpError(format!(
            "{op}: input shape {:?} cannot expand to {shape:?}",
            a.shape()
        ))
    })?;
    checked_numel(&out)?;
    let v = crate::ops::util::broadcast::broadcast_to(op, &a, &out)?;
    Ok(crate::strided::to_owned(&v)?.into())
}

fn build_expand(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let shape = shape_input(&op, input(&op, inputs, 1)?)?;
        one(dispatch_all!(
            x.clone(),
            |a| expand_typed(&op, a, &shape),
            &op
        ))
    }))
}

fn tile_typed<T: Elem>(op: &str, a: ArrayViewD<'_, T>, reps: &[usize]) -> OpResult<Tensor> {
    let out_shape: Vec<usize> = a
        .shape()
        .iter()
        .zip(reps)
        .map(|(&d, &r)| d.saturating_mul(r))
        .collect();
    checked_numel(&out_shape)?;
    let mut cur = a.to_owned();
    for (ax, &r) in reps.iter().enumerate() {
        if r == 1 {
            continue;
        }
        if r == 0 {
            let mut s = cur.shape().to_vec();
            s[ax] = 0;
            cur = ArrayD::from_elem(IxDyn(&s), T::default());
            continue;
        }
        if r <= 64 {
            let parts = vec![cur.view(); r];
            cur = ndarray::concatenate(Axis(ax), &parts)
                .map_err(|e| OpError(format!("{op}: {e}")))?;
            continue;
        }
        // Many repeats: doubling copies, log2(r) concatenations of two views each, never r
        // views at once.
        let mut rep = cur.clone();
        let mut out: Option<ArrayD<T>> = None;
        let mut left = r;
        while left > 0 {
            if left & 1 == 1 {
                out = Some(match out {
                    None => rep.clone(),
                    Some(o) => ndarray::concatenate(Axis(ax), &[o.view(), rep.view()])
                        .map_err(|e| OpError(format!("{op}: {e}")))?,
                });
            }
            left >>= 1;
            if left > 0 {
                rep = ndarray::concatenate(Axis(ax), &[rep.view(), rep.view()])
                    .map_err(|e| OpError(format!("{op}: {e}")))?;
            }
        }
        cur = out.unwrap_or(cur);
    }
    Ok(cur.into())
}

fn build_tile(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let reps = input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: repeats"))?;
        if reps.len() != x.ndim() {
            bail!(
                "{op}: repeats has {} values, input has rank {}",
                reps.len(),
                x.ndim()
            );
        }
        let reps = reps
            .iter()
            .map(|&r| usize::try_from(r).map_err(|_| OpError(format!("{op}: negative repeat {r}"))))
            .collect::<OpResult<Vec<_>>>()?;
        one(dispatch_all!(x.clone(), |a| tile_typed(&op, a, &reps), &op))
    }))
}

/// One resolved slice along an axis, in ndarray terms.
fn slice_axis_params(op: &str, start: i64, end: i64, step: i64, dim: usize) -> OpResult<Slice> {
    if step == 0 {
        bail!("{op}: step must not be 0");
    }
    let d = dim as i64;
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = (norm(start), norm(end));
    let max_step = d.max(1);
    if step > 0 {
        let s = s.clamp(0, d);
        let e = e.clamp(0, d).max(s);
        Ok(Slice::new(
            s as isize,
            Some(e as isize),
            step.min(max_step) as isize,
        ))
    } else {
        // ONNX walks down from `s` while > `e`: ndarray's reversed range (e, s].
        let s = s.clamp(-1, d - 1);
        let e = e.clamp(-1, d - 1).min(s);
        Ok(Slice::new(
            (e + 1) as isize,
            Some((s + 1) as isize),
            -(step.max(-max_step).abs()) as isize,
        ))
    }
}

fn slice_typed<T: Elem>(a: ArrayViewD<'_, T>, slices: &[(usize, Slice)]) -> OpResult<Tensor> {
    let mut v = a;
    for &(ax, s) in slices {
        v.slice_axis_inplace(Axis(ax), s);
    }
    Ok(crate::strided::to_owned(&v)?.into())
}

struct SliceAttrs {
    starts: Vec<i64>,
    ends: Vec<i64>,
    axes: Option<Vec<i64>>,
}

fn build_slice(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let attrs = if n.opset < 10 {
        Some(SliceAttrs {
            starts: n.req_ints("starts")?,
            ends: n.req_ints("ends")?,
            axes: n.attr_ints("axes")?,
        })
    } else {
        None
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let list = |i: usize, what: &str| -> OpResult<Option<Vec<i64>>> {
            opt_input(inputs, i)
                .map(|t| t.to_i64_vec(&format!("{op}: {what}")))
                .transpose()
        };
        let (starts, ends, axes, steps) = match &attrs {
            Some(a) => (a.starts.clone(), a.ends.clone(), a.axes.clone(), None),
            None => (
                input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: starts"))?,
                input(&op, inputs, 2)?.to_i64_vec(&format!("{op}: ends"))?,
                list(3, "axes")?,
                list(4, "steps")?,
            ),
        };
        let k = starts.len();
        let axes = axes.unwrap_or_else(|| (0..k as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; k]);
        if ends.len() != k || axes.len() != k || steps.len() != k {
            bail!(
                "{op}: starts, ends, axes and steps must have the same length, got {}, {}, {}, {}",
                k,
                ends.len(),
                axes.len(),
                steps.len()
            );
        }
        let ax = normalize_axes(&op, &axes, x.ndim())?;
        let slices = (0..k)
            .map(|i| {
                Ok((
                    ax[i],
                    slice_axis_params(&op, starts[i], ends[i], steps[i], x.shape()[ax[i]])?,
                ))
            })
            .collect::<OpResult<Vec<_>>>()?;
        one(dispatch_all!(x.clone(), |a| slice_typed(a, &slices), &op))
    }))
}

fn range_typed<T: Num>(
    op: &str,
    start: ArrayViewD<'_, T>,
    limit: &TensorRef<'_>,
    delta: &TensorRef<'_>,
) -> OpResult<Tensor> {
    let scalar = |v: ArrayViewD<'_, T>, what: &str| -> OpResult<T> {
        match (v.len(), v.iter().next()) {
            (1, Some(&x)) => Ok(x),
            _ => Err(OpError(format!(
                "{op}: {what} must be a scalar, got shape {:?}",
                v.shape()
            ))),
        }
    };
    let s = scalar(start, "start")?;
    let l = scalar(typed_like::<T>(op, limit)?, "limit")?;
    let d = scalar(typed_like::<T>(op, delta)?, "delta")?;
    if d == T::zero() {
        bail!("{op}: delta must not be zero");
    }
    let count = ((l.to_f64() - s.to_f64()) / d.to_f64()).ceil();
    if count.is_nan() || count >= u64::MAX as f64 {
        bail!("{op}: range of {count} elements is too large");
    }
    let n = count.max(0.0) as usize;
    crate::limits::checked_len(&[n], size_of::<T>())
        .map_err(|e| OpError(format!("{op}: {}", e.0)))?;
    let v: Vec<T> = if T::IS_FLOAT {
        (0..n)
            .map(|i| T::from_f64(s.to_f64() + i as f64 * d.to_f64()))
            .collect()
    } else {
        let mut x = s;
        (0..n)
            .map(|_| {
                let cur = x;
                x = x.add(d);
                cur
            })
            .collect()
    };
    Tensor::from_vec(&[n], v)
}

fn build_range(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let s = input(&op, inputs, 0)?;
        let l = input(&op, inputs, 1)?;
        let d = input(&op, inputs, 2)?;
        same_type(&op, s, l)?;
        same_type(&op, s, d)?;
        one(with_types!(
            s.clone(),
            |a| range_typed(&op, a, l, d),
            [F32, F64, F16, BF16, I16, I32, I64],
            &op
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// The tiled transpose gives ndarray's answer on every permutation of a few shapes with unit
    /// axes and on tiles that do not divide the sides, and declines what it cannot take.
    #[test]
    fn batched_transpose_matches_the_general_one() {
        fn perms(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut out = Vec::new();
            for p in perms(n - 1) {
                for i in 0..=p.len() {
                    let mut q = p.clone();
                    q.insert(i, n - 1);
                    out.push(q);
                }
            }
            out
        }
        let mut taken = 0;
        for shape in [vec![1, 37, 70, 1], vec![3, 5, 1, 33], vec![2, 3, 4, 5]] {
            let n: usize = shape.iter().product();
            let a =
                ndarray::ArrayD::from_shape_vec(shape.clone(), (0..n as i32).collect()).unwrap();
            for perm in perms(shape.len()) {
                let want = a
                    .view()
                    .permuted_axes(IxDyn(&perm))
                    .as_standard_layout()
                    .into_owned();
                if let Some(got) = batched_transpose(&a.view(), &perm) {
                    assert_eq!(got, want, "{shape:?} by {perm:?}");
                    taken += 1;
                }
            }
        }
        // [2,3,4,5] has 24 permutations, of which only the copy, the 2-D and the batched 2-D
        // forms (with or without a trailing run) are taken; the unit axes make more of the
        // others such.
        assert!(taken >= 24, "the tiled path took only {taken} cases");
        let x =
            ndarray::ArrayD::from_shape_vec(vec![2, 3, 4], (0..24).collect::<Vec<i32>>()).unwrap();
        assert!(batched_transpose(&x.view(), &[2, 1, 0]).is_none());
        let runs = batched_transpose(&x.view(), &[1, 0, 2]).expect("a swap before a run");
        let want = x
            .view()
            .permuted_axes(IxDyn(&[1, 0, 2]))
            .as_standard_layout()
            .into_owned();
        assert_eq!(runs, want);
    }

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    /// The reshaping ops, as the registry makes them (wrapped for string tensors), say the
    /// shape their output takes, so that a program can move their input's buffer; the other
    /// ops say nothing.
    #[test]
    fn reshaping_kernels_name_their_output_shape() {
        let shape_of = |n: NodeDef, inputs: Vec<Option<Tensor>>| {
            let k = crate::ops::registry().build(&n).unwrap();
            let refs: Vec<Option<TensorRef<'_>>> = inputs
                .iter()
                .map(|t| t.as_ref().map(Tensor::view))
                .collect();
            k.reshaped_shape(&refs).map(Result::unwrap)
        };
        let x = Some(iota(&[2, 1, 6]));
        let reshape = NodeDef::new("Reshape", 14);
        assert_eq!(
            shape_of(reshape, vec![x.clone(), i64s(&[3, -1])]),
            Some(vec![3, 4])
        );
        let flatten = NodeDef::new("Flatten", 13).with_attr("axis", AttrValue::Int(2));
        assert_eq!(shape_of(flatten, vec![x.clone()]), Some(vec![2, 6]));
        let squeeze = NodeDef::new("Squeeze", 13);
        assert_eq!(
            shape_of(squeeze, vec![x.clone(), i64s(&[1])]),
            Some(vec![2, 6])
        );
        let unsqueeze = NodeDef::new("Unsqueeze", 13);
        assert_eq!(
            shape_of(unsqueeze, vec![x.clone(), i64s(&[0])]),
            Some(vec![1, 2, 1, 6])
        );
        assert_eq!(shape_of(NodeDef::new("Identity", 16), vec![x]), None);
        let bad = NodeDef::new("Reshape", 14);
        let k = crate::ops::registry().build(&bad).unwrap();
        let (t, s) = (iota(&[2, 3]), i64s(&[4]).unwrap());
        let e = k.reshaped_shape(&[Some(t.view()), Some(s.view())]);
        assert!(
            matches!(e, Some(Err(_))),
            "a shape of the wrong size is refused"
        );
    }

    fn i64s(v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
    }

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|x| x as f32).collect()).unwrap()
    }

    #[test]
    fn reshape_zero_and_minus_one() {
        let x = iota(&[2, 3, 4]);
        let out = run(
            NodeDef::new("Reshape", 14),
            vec![Some(x.clone()), i64s(&[0, -1])],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[2, 12]);
        let n = NodeDef::new("Reshape", 14).with_attr("allowzero", AttrValue::Int(1));
        let e = run(n, vec![Some(x.clone()), i64s(&[0, -1])]).unwrap_err();
        assert!(e.0.contains("cannot infer -1"), "{e}");
        let e = run(
            NodeDef::new("Reshape", 14),
            vec![Some(x.clone()), i64s(&[5, -1])],
        )
        .unwrap_err();
        assert!(
            e.0.contains("Reshape: cannot infer -1 in shape [5, -1]"),
            "{e}"
        );
        let e = run(
            NodeDef::new("Reshape", 14),
            vec![Some(x.clone()), i64s(&[-1, -1])],
        )
        .unwrap_err();
        assert!(e.0.contains("more than one -1"), "{e}");
        let old = NodeDef::new("Reshape", 1).with_attr("shape", AttrValue::Ints(vec![4, 6]));
        assert_eq!(run(old, vec![Some(x)]).unwrap()[0].shape(), &[4, 6]);
    }

    #[test]
    fn flatten_transpose_concat() {
        let x = iota(&[2, 3, 4]);
        let f = NodeDef::new("Flatten", 13).with_attr("axis", AttrValue::Int(-1));
        assert_eq!(run(f, vec![Some(x.clone())]).unwrap()[0].shape(), &[6, 4]);
        let f0 = NodeDef::new("Flatten", 13).with_attr("axis", AttrValue::Int(0));
        assert_eq!(run(f0, vec![Some(x.clone())]).unwrap()[0].shape(), &[1, 24]);
        let bad = NodeDef::new("Flatten", 13).with_attr("axis", AttrValue::Int(4));
        assert!(
            run(bad, vec![Some(x.clone())])
                .unwrap_err()
                .0
                .contains("Flatten: axis 4 is out of range")
        );
        let t = run(NodeDef::new("Transpose", 13), vec![Some(iota(&[2, 3]))]).unwrap();
        assert_eq!(
            t[0],
            Tensor::F32(array![[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]].into_dyn())
        );
        let tp = NodeDef::new("Transpose", 13).with_attr("perm", AttrValue::Ints(vec![0, 0]));
        assert!(
            run(tp, vec![Some(iota(&[2, 3]))])
                .unwrap_err()
                .0
                .contains("not a permutation")
        );
        let c = NodeDef::new("Concat", 13).with_attr("axis", AttrValue::Int(-1));
        let out = run(c.clone(), vec![Some(iota(&[2, 1])), Some(iota(&[2, 2]))]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 0.0, 1.0], [1.0, 2.0, 3.0]].into_dyn())
        );
        let e = run(c, vec![Some(iota(&[2, 1])), Some(iota(&[3, 2]))]).unwrap_err();
        assert!(e.0.contains("Concat: input 1 has shape [3, 2]"), "{e}");
    }

    #[test]
    fn squeeze_unsqueeze_versions() {
        let x = iota(&[1, 3, 1]);
        assert_eq!(
            run(NodeDef::new("Squeeze", 13), vec![Some(x.clone())]).unwrap()[0].shape(),
            &[3]
        );
        assert_eq!(
            run(
                NodeDef::new("Squeeze", 13),
                vec![Some(x.clone()), i64s(&[-1])]
            )
            .unwrap()[0]
                .shape(),
            &[1, 3]
        );
        let s11 = NodeDef::new("Squeeze", 11).with_attr("axes", AttrValue::Ints(vec![0]));
        assert_eq!(run(s11, vec![Some(x.clone())]).unwrap()[0].shape(), &[3, 1]);
        let e = run(
            NodeDef::new("Squeeze", 13),
            vec![Some(x.clone()), i64s(&[1])],
        )
        .unwrap_err();
        assert_eq!(e.0, "Squeeze: cannot squeeze axis 1 of size 3");
        let u = run(
            NodeDef::new("Unsqueeze", 13),
            vec![Some(iota(&[3])), i64s(&[0, -1])],
        )
        .unwrap();
        assert_eq!(u[0].shape(), &[1, 3, 1]);
        let u1 = NodeDef::new("Unsqueeze", 1).with_attr("axes", AttrValue::Ints(vec![1]));
        assert_eq!(run(u1, vec![Some(iota(&[3]))]).unwrap()[0].shape(), &[3, 1]);
        let e = run(
            NodeDef::new("Unsqueeze", 13),
            vec![Some(iota(&[3])), i64s(&[3])],
        )
        .unwrap_err();
        assert!(e.0.contains("axis 3 is out of range for rank 2"), "{e}");
    }

    #[test]
    fn shape_gather_identity() {
        let x = iota(&[2, 3, 4]);
        let s = run(
            NodeDef::new("Shape", 15).with_attr("start", AttrValue::Int(-2)),
            vec![Some(x.clone())],
        )
        .unwrap();
        assert_eq!(s[0], Tensor::I64(array![3, 4].into_dyn()));
        let g = NodeDef::new("Gather", 13).with_attr("axis", AttrValue::Int(1));
        let idx = Tensor::I32(array![[-1, 0]].into_dyn());
        let out = run(g.clone(), vec![Some(iota(&[2, 3])), Some(idx)]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[2.0, 0.0]], [[5.0, 3.0]]].into_dyn())
        );
        let e = run(
            NodeDef::new("Gather", 13),
            vec![Some(iota(&[3])), i64s(&[7])],
        )
        .unwrap_err();
        assert_eq!(e.0, "Gather: index 7 out of range for axis 0 of size 3");
        let sc = run(
            NodeDef::new("Gather", 13),
            vec![Some(iota(&[3])), Some(Tensor::scalar(1i64))],
        )
        .unwrap();
        assert_eq!(sc[0], Tensor::scalar(1.0f32));
        assert_eq!(
            run(NodeDef::new("Identity", 16), vec![Some(x.clone())]).unwrap()[0],
            x
        );
        let e = run(NodeDef::new("Identity", 16), vec![None]).unwrap_err();
        assert_eq!(e.0, "Identity: missing required input 0");
    }

    #[test]
    fn constant_and_cast() {
        let c = NodeDef::new("Constant", 13).with_attr("value_ints", AttrValue::Ints(vec![1, 2]));
        assert_eq!(
            run(c, vec![]).unwrap()[0],
            Tensor::I64(array![1, 2].into_dyn())
        );
        let c = NodeDef::new("Constant", 13).with_attr("value_float", AttrValue::Float(2.5));
        assert_eq!(run(c, vec![]).unwrap()[0], Tensor::scalar(2.5f32));
        let c = NodeDef::new("Constant", 13).with_attr("value", AttrValue::Tensor(iota(&[2])));
        assert_eq!(run(c, vec![]).unwrap()[0], iota(&[2]));
        let c = NodeDef::new("Constant", 13)
            .with_attr("value_string", AttrValue::String(b"x".to_vec()));
        assert!(
            run(c, vec![])
                .unwrap_err()
                .0
                .contains("string tensors are not supported")
        );
        let cast = NodeDef::new("Cast", 13).with_attr("to", AttrValue::Int(7));
        let out = run(cast, vec![Some(Tensor::F32(array![1.9, -1.9].into_dyn()))]).unwrap();
        assert_eq!(out[0], Tensor::I64(array![1, -1].into_dyn()));
        let cast = NodeDef::new("Cast", 13).with_attr("to", AttrValue::Int(8));
        assert!(
            run(cast, vec![Some(iota(&[1]))])
                .unwrap_err()
                .0
                .contains("casting to string is not supported")
        );
    }

    #[test]
    fn expand_tile_slice_range() {
        let e = run(
            NodeDef::new("Expand", 13),
            vec![Some(iota(&[3, 1])), i64s(&[2, 1, 2])],
        )
        .unwrap();
        assert_eq!(e[0].shape(), &[2, 3, 2]);
        let bad = run(
            NodeDef::new("Expand", 13),
            vec![Some(iota(&[3])), i64s(&[2])],
        )
        .unwrap_err();
        assert!(bad.0.contains("cannot expand"), "{bad}");
        let t = run(NodeDef::new("Tile", 13), vec![Some(iota(&[2])), i64s(&[2])]).unwrap();
        assert_eq!(t[0], Tensor::F32(array![0.0, 1.0, 0.0, 1.0].into_dyn()));
        let x = iota(&[10]);
        let s = run(
            NodeDef::new("Slice", 13),
            vec![
                Some(x.clone()),
                i64s(&[-1]),
                i64s(&[i64::MIN]),
                None,
                i64s(&[-3]),
            ],
        )
        .unwrap();
        assert_eq!(s[0], Tensor::F32(array![9.0, 6.0, 3.0, 0.0].into_dyn()));
        let s = run(
            NodeDef::new("Slice", 13),
            vec![
                Some(x.clone()),
                i64s(&[2]),
                i64s(&[i64::MAX]),
                i64s(&[0]),
                i64s(&[3]),
            ],
        )
        .unwrap();
        assert_eq!(s[0], Tensor::F32(array![2.0, 5.0, 8.0].into_dyn()));
        let s = run(
            NodeDef::new("Slice", 13),
            vec![Some(x.clone()), i64s(&[5]), i64s(&[2])],
        )
        .unwrap();
        assert_eq!(s[0].shape(), &[0]);
        let e = run(
            NodeDef::new("Slice", 13),
            vec![Some(x.clone()), i64s(&[0]), i64s(&[1]), None, i64s(&[0])],
        )
        .unwrap_err();
        assert_eq!(e.0, "Slice: step must not be 0");
        let s1 = NodeDef::new("Slice", 1)
            .with_attr("starts", AttrValue::Ints(vec![1]))
            .with_attr("ends", AttrValue::Ints(vec![3]));
        assert_eq!(
            run(s1, vec![Some(x)]).unwrap()[0],
            Tensor::F32(array![1.0, 2.0].into_dyn())
        );
        let r = run(
            NodeDef::new("Range", 11),
            vec![
                Some(Tensor::scalar(10i32)),
                Some(Tensor::scalar(4i32)),
                Some(Tensor::scalar(-3i32)),
            ],
        )
        .unwrap();
        assert_eq!(r[0], Tensor::I32(array![10, 7].into_dyn()));
        let e = run(
            NodeDef::new("Range", 11),
            vec![
                Some(Tensor::scalar(1.0f32)),
                Some(Tensor::scalar(4.0f32)),
                Some(Tensor::scalar(0.0f32)),
            ],
        )
        .unwrap_err();
        assert_eq!(e.0, "Range: delta must not be zero");
    }
}
