//! Indexing, selection and scan operators: ScatterElements, Scatter, ScatterND, TensorScatter,
//! OneHot, TopK, NonZero, Compress, Unique, Trilu, EyeLike, CumSum, CumProd and
//! ReverseSequence (the gathers are in [`super::gather`]). All work on C-order copies of their
//! inputs and check every index before use.

use std::cmp::Ordering;

use epx_plugin_api::ElementType;
use ndarray::ArrayViewD;

use crate::ops::util::num::Num;

use crate::ops::util::indexing::{c_strides, for_each_index};

use crate::limits::checked_numel;

use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, normalize_axis, opt_input, same_type, scalar_i64, typed_like};
use crate::ops::util::indexing::{contiguous, flat, index_values, norm_index};
use crate::tensor::{Elem, Scalar, Tensor, TensorRef};
use crate::{bail, dispatch_all, dispatch_numeric, with_types};

pub fn register(reg: &mut Registry) {
    add(reg, "ScatterElements", 11, build_scatter_elements);
    add(reg, "Scatter", 9, build_scatter_elements);
    add(reg, "ScatterND", 11, build_scatter_nd);
    add(reg, "OneHot", 9, build_one_hot);
    add(reg, "TopK", 1, build_top_k);
    add(reg, "NonZero", 9, build_non_zero);
    add(reg, "Compress", 9, build_compress);
    add(reg, "Unique", 11, build_unique);
    add(reg, "Trilu", 14, build_trilu);
    add(reg, "EyeLike", 9, build_eye_like);
    add(reg, "CumSum", 11, build_cumsum);
    add(reg, "CumProd", 26, build_cumprod);
    add(reg, "ReverseSequence", 10, build_reverse_sequence);
    add(reg, "TensorScatter", 24, build_tensor_scatter);
}

/// `cache` with `update` written along `axis` from `starts[batch]` (each batch row its own
/// start), wrapping round the axis when `circular`.
fn tensor_scatter_typed<T: Elem>(
    op: &str,
    cache: ArrayViewD<'_, T>,
    update: &TensorRef<'_>,
    axis: usize,
    starts: &[i64],
    circular: bool,
) -> OpResult<Tensor> {
    let upd = typed_like::<T>(op, update)?;
    let shape = cache.shape().to_vec();
    let max_len = shape[axis];
    let seq = upd.shape()[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let per_batch: usize = shape[1..axis].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut out: Vec<T> = cache.iter().copied().collect();
    let src: Vec<T> = upd.iter().copied().collect();
    for o in 0..outer {
        let start = starts[o / per_batch.max(1)];
        for s in 0..seq {
            let pos = start + s as i64;
            let pos = if circular {
                pos.rem_euclid(max_len as i64)
            } else {
                pos
            };
            let pos = usize::try_from(pos).ok().filter(|&p| p < max_len).ok_or_else(|| {
                OpError(format!(
                    "{op}: writing position {pos} is outside the cache's {max_len} positions (mode linear)"
                ))
            })?;
            let d = (o * max_len + pos) * inner;
            let u = (o * seq + s) * inner;
            out[d..d + inner].copy_from_slice(&src[u..u + inner]);
        }
    }
    Tensor::from_vec(&shape, out)
}

fn build_tensor_scatter(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", -2)?;
    let circular = match n.attr_string_or("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        other => return Err(n.error(format_args!("mode `{other}` is not linear or circular"))),
    };
    Ok(kernel(move |inputs| {
        let cache = input(&op, inputs, 0)?;
        let update = input(&op, inputs, 1)?;
        let rank = cache.ndim();
        let ax = normalize_axis(&op, axis, rank)?;
        if ax == 0 {
            bail!("{op}: axis {axis} is the batch axis; the sequence axis must come after it");
        }
        same_type(&op, cache, update)?;
        let ok = update.ndim() == rank
            && (0..rank).all(|d| {
                if d == ax {
                    update.shape()[d] <= cache.shape()[d]
                } else {
                    update.shape()[d] == cache.shape()[d]
                }
            });
        if !ok {
            bail!(
                "{op}: update of shape {:?} does not fit the cache of shape {:?} along axis {ax}",
                update.shape(),
                cache.shape()
            );
        }
        let batch = cache.shape()[0];
        let starts = match opt_input(inputs, 2) {
            Some(w) => {
                let v = w.to_i64_vec(&format!("{op}: write_indices"))?;
                if v.len() != batch {
                    bail!(
                        "{op}: write_indices has {} values for a batch of {batch}",
                        v.len()
                    );
                }
                v
            }
            None => vec![0; batch],
        };
        one(dispatch_all!(
            cache.clone(),
            |a| tensor_scatter_typed(&op, a, update, ax, &starts, circular),
            &op
        ))
    }))
}

// ---------------------------------------------------------------------------------------------
// GatherElements

// ---------------------------------------------------------------------------------------------
// GatherND

// ---------------------------------------------------------------------------------------------
// Scatter reductions

#[derive(Clone, Copy, Debug, PartialEq)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn parse_reduction(n: &NodeDef) -> OpResult<Reduction> {
    match n.attr_string_or("reduction", "none")?.as_str() {
        "none" => Ok(Reduction::None),
        "add" => Ok(Reduction::Add),
        "mul" => Ok(Reduction::Mul),
        "max" => Ok(Reduction::Max),
        "min" => Ok(Reduction::Min),
        other => Err(n.error(format_args!("unknown reduction '{other}'"))),
    }
}

fn reduce_num<T: Num>(r: Reduction, old: T, new: T) -> T {
    match r {
        Reduction::None => new,
        Reduction::Add => old.add(new),
        Reduction::Mul => old.mul(new),
        Reduction::Max => {
            if new > old || new.is_nan() {
                new
            } else {
                old
            }
        }
        Reduction::Min => {
            if new < old || new.is_nan() {
                new
            } else {
                old
            }
        }
    }
}

fn reduce_bool(r: Reduction, old: bool, new: bool) -> bool {
    match r {
        Reduction::None => new,
        Reduction::Add | Reduction::Max => old | new,
        Reduction::Mul | Reduction::Min => old & new,
    }
}

// ---------------------------------------------------------------------------------------------
// ScatterElements / Scatter

#[allow(clippy::too_many_arguments)]
fn scatter_elements_core<T: Elem>(
    op: &str,
    data: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    updates: &TensorRef<'_>,
    axis: usize,
    f: impl Fn(T, T) -> T,
) -> OpResult<Tensor> {
    let upd = typed_like::<T>(op, updates)?;
    if upd.shape() != idx_shape {
        bail!(
            "{op}: updates shape {:?} must equal indices shape {idx_shape:?}",
            upd.shape()
        );
    }
    let dshape = data.shape().to_vec();
    if idx_shape.len() != dshape.len() {
        bail!(
            "{op}: indices rank {} must equal data rank {}",
            idx_shape.len(),
            dshape.len()
        );
    }
    for (d, (&i, &s)) in idx_shape.iter().zip(&dshape).enumerate() {
        if d != axis && i > s {
            bail!("{op}: indices shape {idx_shape:?} exceeds data shape {dshape:?} on axis {d}");
        }
    }
    let mut out = flat(&data);
    let updv = flat(&upd);
    let strides = c_strides(&dshape);
    let mut err = None;
    let mut k = 0usize;
    for_each_index(idx_shape, |pos| {
        if err.is_some() {
            return;
        }
        let raw = idx.get(k).copied().unwrap_or_default();
        let u = updv.get(k).copied().unwrap_or_default();
        k += 1;
        match norm_index(op, raw, dshape[axis], &format!("axis {axis}")) {
            Ok(j) => {
                let off: usize = pos
                    .iter()
                    .enumerate()
                    .map(|(d, &p)| if d == axis { j } else { p } * strides[d])
                    .sum();
                if let Some(slot) = out.get_mut(off) {
                    *slot = f(*slot, u);
                }
            }
            Err(e) => err = Some(e),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    Tensor::from_vec(&dshape, out)
}

fn scatter_elements_num<T: Num>(
    op: &str,
    data: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    updates: &TensorRef<'_>,
    axis: usize,
    r: Reduction,
) -> OpResult<Tensor> {
    scatter_elements_core(op, data, idx, idx_shape, updates, axis, |o, u| {
        reduce_num(r, o, u)
    })
}

fn build_scatter_elements(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 0)?;
    let red = if n.op_type == "ScatterElements" {
        parse_reduction(n)?
    } else {
        Reduction::None
    };
    Ok(kernel(move |inputs| {
        let data = input(&op, inputs, 0)?;
        let indices = input(&op, inputs, 1)?;
        let updates = input(&op, inputs, 2)?;
        let idx = index_values(&op, indices)?;
        let ax = normalize_axis(&op, axis, data.ndim())?;
        let ishape = indices.shape();
        one(match data {
            TensorRef::Bool(a) => {
                scatter_elements_core(&op, a.clone(), &idx, ishape, updates, ax, |o, u| {
                    reduce_bool(red, o, u)
                })
            }
            other => dispatch_numeric!(
                other.clone(),
                |a| scatter_elements_num(&op, a, &idx, ishape, updates, ax, red),
                &op
            ),
        })
    }))
}

// ---------------------------------------------------------------------------------------------
// ScatterND

fn scatter_nd_core<T: Elem>(
    op: &str,
    data: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    updates: &TensorRef<'_>,
    f: impl Fn(T, T) -> T,
) -> OpResult<Tensor> {
    let upd = typed_like::<T>(op, updates)?;
    let dshape = data.shape().to_vec();
    let r = dshape.len();
    let q = idx_shape.len();
    if q < 1 || r < 1 {
        bail!("{op}: data and indices must have rank >= 1, got {r} and {q}");
    }
    let k = idx_shape[q - 1];
    if k > r {
        bail!("{op}: indices last dim {k} exceeds data rank {r}");
    }
    let mut want = idx_shape[..q - 1].to_vec();
    want.extend_from_slice(&dshape[k..]);
    if upd.shape() != want.as_slice() {
        bail!(
            "{op}: updates shape {:?} must be {want:?} (indices.shape[:-1] + data.shape[k:])",
            upd.shape()
        );
    }
    let slice: usize = dshape[k..].iter().product();
    let tuples: usize = idx_shape[..q - 1].iter().product();
    let strides = c_strides(&dshape);
    let mut out = flat(&data);
    let updv = flat(&upd);
    for t in 0..tuples {
        let mut off = 0usize;
        for j in 0..k {
            let raw = idx.get(t * k + j).copied().unwrap_or_default();
            off += norm_index(op, raw, dshape[j], &format!("data dim {j}"))? * strides[j];
        }
        let (Some(dst), Some(src)) = (
            out.get_mut(off..off + slice),
            updv.get(t * slice..(t + 1) * slice),
        ) else {
            bail!("{op}: index tuple {t} out of range");
        };
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f(*d, s);
        }
    }
    Tensor::from_vec(&dshape, out)
}

fn scatter_nd_num<T: Num>(
    op: &str,
    data: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    updates: &TensorRef<'_>,
    r: Reduction,
) -> OpResult<Tensor> {
    scatter_nd_core(op, data, idx, idx_shape, updates, |o, u| {
        reduce_num(r, o, u)
    })
}

fn build_scatter_nd(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let red = parse_reduction(n)?;
    Ok(kernel(move |inputs| {
        let data = input(&op, inputs, 0)?;
        let indices = input(&op, inputs, 1)?;
        let updates = input(&op, inputs, 2)?;
        let idx = index_values(&op, indices)?;
        let ishape = indices.shape();
        one(match data {
            TensorRef::Bool(a) => scatter_nd_core(&op, a.clone(), &idx, ishape, updates, |o, u| {
                reduce_bool(red, o, u)
            }),
            other => dispatch_numeric!(
                other.clone(),
                |a| scatter_nd_num(&op, a, &idx, ishape, updates, red),
                &op
            ),
        })
    }))
}

// ---------------------------------------------------------------------------------------------
// OneHot

fn one_hot_typed<T: Elem>(
    op: &str,
    values: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    depth: usize,
    axis: i64,
) -> OpResult<Tensor> {
    let v = contiguous(&values);
    let [off, on] = &v[..] else {
        bail!(
            "{op}: values must have exactly two elements, got shape {:?}",
            values.shape()
        );
    };
    let rank = idx_shape.len() + 1;
    let ax = normalize_axis(op, axis, rank)?;
    let mut out_shape = idx_shape.to_vec();
    out_shape.insert(ax, depth);
    let total = checked_numel(&out_shape)?;
    // A recycled buffer: a one-hot output is large and written once.
    let mut out = crate::scratch::take_any::<T>(total)?;
    out.resize(total, *off);
    let outer: usize = idx_shape[..ax].iter().product();
    let inner: usize = idx_shape[ax..].iter().product();
    for o in 0..outer {
        for i in 0..inner {
            let raw = idx.get(o * inner + i).copied().unwrap_or_default();
            let d = depth as i64;
            let j = if raw < 0 { raw + d } else { raw };
            if (0..d).contains(&j)
                && let Some(slot) = out.get_mut((o * depth + j as usize) * inner + i)
            {
                *slot = *on;
            }
        }
    }
    Tensor::from_vec(&out_shape, out)
}

fn build_one_hot(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", -1)?;
    Ok(kernel(move |inputs| {
        let indices = input(&op, inputs, 0)?;
        let depth_t = input(&op, inputs, 1)?;
        let values = input(&op, inputs, 2)?;
        if indices.elem_type() == ElementType::Bool {
            bail!("{op}: indices must be numeric, got bool");
        }
        let idx: Vec<i64> = indices.to_f64_vec().into_iter().map(|x| x as i64).collect();
        let depth = match depth_t.to_f64_vec().as_slice() {
            [d] => *d,
            _ => bail!(
                "{op}: depth must have one element, got shape {:?}",
                depth_t.shape()
            ),
        };
        if !(depth >= 1.0 && depth <= (1u64 << 40) as f64) {
            bail!("{op}: depth must be positive, got {depth}");
        }
        let depth = depth as usize;
        one(dispatch_all!(
            values.clone(),
            |a| one_hot_typed(&op, a, &idx, indices.shape(), depth, axis),
            &op
        ))
    }))
}

// ---------------------------------------------------------------------------------------------
// TopK

fn cmp_elem<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    a.partial_cmp(b).unwrap_or(Ordering::Equal)
}

fn top_k_typed<T: Num>(
    op: &str,
    x: ArrayViewD<'_, T>,
    axis: usize,
    k: usize,
    largest: bool,
) -> OpResult<Vec<Tensor>> {
    let shape = x.shape().to_vec();
    let dim = shape[axis];
    if k > dim {
        bail!("{op}: k {k} is larger than axis {axis} of size {dim}");
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let src = contiguous(&x);
    let mut out_shape = shape.clone();
    out_shape[axis] = k;
    let total = checked_numel(&out_shape)?;
    let mut vals = vec![T::default(); total];
    let mut inds = vec![0i64; total];
    let mut order: Vec<usize> = Vec::with_capacity(dim);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| {
                src.get((o * dim + j) * inner + i)
                    .copied()
                    .unwrap_or_default()
            };
            order.clear();
            order.extend(0..dim);
            // Stable sort: ties keep the lower index first. NaN counts as the largest value.
            order.sort_by(|&a, &b| {
                let (va, vb) = (at(a), at(b));
                let c = match (va.is_nan(), vb.is_nan()) {
                    (true, true) => Ordering::Equal,
                    (true, false) => Ordering::Greater,
                    (false, true) => Ordering::Less,
                    _ => cmp_elem(&va, &vb),
                };
                if largest { c.reverse() } else { c }
            });
            for (j, &src_j) in order.iter().take(k).enumerate() {
                let dst = (o * k + j) * inner + i;
                vals[dst] = at(src_j);
                inds[dst] = src_j as i64;
            }
        }
    }
    Ok(vec![
        Tensor::from_vec(&out_shape, vals)?,
        Tensor::from_vec(&out_shape, inds)?,
    ])
}

fn build_top_k(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", -1)?;
    let k_attr = if n.opset < 10 {
        Some(n.req_int("k")?)
    } else {
        None
    };
    let largest = n.opset < 11 || n.attr_int_or("largest", 1)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let k = match k_attr {
            Some(k) => k,
            None => scalar_i64(&op, "k", input(&op, inputs, 1)?)?,
        };
        let Ok(k) = usize::try_from(k) else {
            bail!("{op}: k must be >= 0, got {k}");
        };
        let ax = normalize_axis(&op, axis, x.ndim())?;
        dispatch_numeric!(x.clone(), |a| top_k_typed(&op, a, ax, k, largest), &op)
    }))
}

// ---------------------------------------------------------------------------------------------
// NonZero

fn non_zero_typed<T: Elem>(x: ArrayViewD<'_, T>) -> OpResult<Tensor> {
    let shape: Vec<usize> = if x.ndim() == 0 {
        vec![1]
    } else {
        x.shape().to_vec()
    };
    let zero = T::default();
    let mut coords: Vec<Vec<i64>> = vec![Vec::new(); shape.len()];
    let mut it = x.iter();
    for_each_index(&shape, |pos| {
        if let Some(v) = it.next()
            && *v != zero
        {
            for (c, &p) in coords.iter_mut().zip(pos) {
                c.push(p as i64);
            }
        }
    });
    let nnz = coords.first().map_or(0, Vec::len);
    Tensor::from_vec(&[shape.len(), nnz], coords.concat())
}

fn build_non_zero(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        one(dispatch_all!(x.clone(), |a| non_zero_typed(a), &op))
    }))
}

// ---------------------------------------------------------------------------------------------
// Compress

fn compress_typed<T: Elem>(
    op: &str,
    x: ArrayViewD<'_, T>,
    cond: &[bool],
    axis: Option<usize>,
) -> OpResult<Tensor> {
    let (shape, ax) = match axis {
        Some(a) => (x.shape().to_vec(), a),
        None => (vec![x.len()], 0),
    };
    let dim = shape[ax];
    if cond.iter().skip(dim).any(|&c| c) {
        bail!(
            "{op}: condition has {} elements, more than axis {ax} of size {dim}",
            cond.len()
        );
    }
    let keep: Vec<usize> = (0..dim)
        .filter(|&i| cond.get(i).copied().unwrap_or(false))
        .collect();
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax + 1..].iter().product();
    let src = contiguous(&x);
    let mut out = Vec::with_capacity(outer * keep.len() * inner);
    for o in 0..outer {
        for &j in &keep {
            let start = (o * dim + j) * inner;
            if let Some(s) = src.get(start..start + inner) {
                out.extend_from_slice(s);
            }
        }
    }
    let mut out_shape = shape;
    out_shape[ax] = keep.len();
    Tensor::from_vec(&out_shape, out)
}

fn build_compress(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int("axis")?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let c = input(&op, inputs, 1)?;
        let cond = c.expect_type::<bool>(&format!("{op}: condition"))?;
        if cond.ndim() != 1 {
            bail!("{op}: condition must be 1-D, got shape {:?}", cond.shape());
        }
        let cond: Vec<bool> = cond.iter().copied().collect();
        let ax = axis.map(|a| normalize_axis(&op, a, x.ndim())).transpose()?;
        one(dispatch_all!(
            x.clone(),
            |a| compress_typed(&op, a, &cond, ax),
            &op
        ))
    }))
}

// ---------------------------------------------------------------------------------------------
// Unique

fn cmp_slices<T: Elem>(a: &[T], b: &[T]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        match cmp_elem(x, y) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    a.len().cmp(&b.len())
}

fn unique_typed<T: Elem>(
    x: ArrayViewD<'_, T>,
    axis: Option<usize>,
    sorted: bool,
) -> OpResult<Vec<Tensor>> {
    let (shape, ax) = match axis {
        Some(a) => (x.shape().to_vec(), a),
        None => (vec![x.len()], 0),
    };
    let dim = shape[ax];
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax + 1..].iter().product();
    let src = contiguous(&x);
    // The slice at position j along the axis, flattened.
    let slice_of = |j: usize| -> Vec<T> {
        let mut v = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            let s = (o * dim + j) * inner;
            if let Some(p) = src.get(s..s + inner) {
                v.extend_from_slice(p);
            }
        }
        v
    };
    let slices: Vec<Vec<T>> = (0..dim).map(slice_of).collect();
    // Unique slices in first-occurrence order.
    let mut uniq: Vec<usize> = Vec::new();
    let mut inverse = vec![0usize; dim];
    let mut counts: Vec<i64> = Vec::new();
    for j in 0..dim {
        match uniq.iter().position(|&u| slices[u] == slices[j]) {
            Some(p) => {
                inverse[j] = p;
                counts[p] += 1;
            }
            None => {
                inverse[j] = uniq.len();
                uniq.push(j);
                counts.push(1);
            }
        }
    }
    let mut order: Vec<usize> = (0..uniq.len()).collect();
    if sorted {
        order.sort_by(|&a, &b| cmp_slices(&slices[uniq[a]], &slices[uniq[b]]));
    }
    let mut rank = vec![0usize; uniq.len()];
    for (r, &o) in order.iter().enumerate() {
        rank[o] = r;
    }
    let u = uniq.len();
    let mut y_shape = shape.clone();
    y_shape[ax] = u;
    let mut y = Vec::with_capacity(outer * u * inner);
    for o in 0..outer {
        for &p in &order {
            let s = (o * dim + uniq[p]) * inner;
            if let Some(v) = src.get(s..s + inner) {
                y.extend_from_slice(v);
            }
        }
    }
    let indices: Vec<i64> = order.iter().map(|&p| uniq[p] as i64).collect();
    let inv: Vec<i64> = inverse.iter().map(|&p| rank[p] as i64).collect();
    let cnt: Vec<i64> = order.iter().map(|&p| counts[p]).collect();
    Ok(vec![
        Tensor::from_vec(&y_shape, y)?,
        Tensor::from_vec(&[u], indices)?,
        Tensor::from_vec(&[dim], inv)?,
        Tensor::from_vec(&[u], cnt)?,
    ])
}

fn build_unique(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int("axis")?;
    let sorted = n.attr_int_or("sorted", 1)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let ax = axis.map(|a| normalize_axis(&op, a, x.ndim())).transpose()?;
        dispatch_all!(x.clone(), |a| unique_typed(a, ax, sorted), &op)
    }))
}

// ---------------------------------------------------------------------------------------------
// Trilu and EyeLike

fn trilu_typed<T: Elem>(x: ArrayViewD<'_, T>, k: i64, upper: bool) -> OpResult<Tensor> {
    let shape = x.shape().to_vec();
    let r = shape.len();
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    let mut out = flat(&x);
    for (p, v) in out.iter_mut().enumerate() {
        let j = (p % cols.max(1)) as i64;
        let i = ((p / cols.max(1)) % rows.max(1)) as i64;
        let keep = if upper { j - i >= k } else { j - i <= k };
        if !keep {
            *v = T::default();
        }
    }
    Tensor::from_vec(&shape, out)
}

fn build_trilu(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let upper = n.attr_int_or("upper", 1)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        if x.ndim() < 2 {
            bail!("{op}: input must have rank >= 2, got shape {:?}", x.shape());
        }
        let k = match opt_input(inputs, 1) {
            Some(t) => scalar_i64(&op, "k", t)?,
            None => 0,
        };
        one(dispatch_all!(x.clone(), |a| trilu_typed(a, k, upper), &op))
    }))
}

fn eye_typed<T: Elem>(shape: &[usize], k: i64) -> OpResult<Tensor> {
    let (rows, cols) = (shape[0], shape[1]);
    let mut out = vec![T::default(); checked_numel(shape)?];
    let one_v = T::from_scalar(Scalar::I(1));
    for i in 0..rows {
        let j = i as i64 + k;
        if (0..cols as i64).contains(&j) {
            out[i * cols + j as usize] = one_v;
        }
    }
    Tensor::from_vec(shape, out)
}

fn build_eye_like(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let k = n.attr_int_or("k", 0)?;
    let dtype = match n.attr_int("dtype")? {
        Some(code) => Some(
            i32::try_from(code)
                .ok()
                .and_then(ElementType::from_onnx)
                .ok_or_else(|| n.error(format_args!("unknown dtype {code}")))?,
        ),
        None => None,
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        if x.ndim() != 2 {
            bail!("{op}: input must be 2-D, got shape {:?}", x.shape());
        }
        let ty = dtype.unwrap_or(x.elem_type());
        let shape = x.shape().to_vec();
        one(by_elem_type(&op, ty, |t| match t {
            ElemKind::F32 => eye_typed::<f32>(&shape, k),
            ElemKind::F64 => eye_typed::<f64>(&shape, k),
            ElemKind::F16 => eye_typed::<half::f16>(&shape, k),
            ElemKind::BF16 => eye_typed::<half::bf16>(&shape, k),
            ElemKind::I8 => eye_typed::<i8>(&shape, k),
            ElemKind::I16 => eye_typed::<i16>(&shape, k),
            ElemKind::I32 => eye_typed::<i32>(&shape, k),
            ElemKind::I64 => eye_typed::<i64>(&shape, k),
            ElemKind::U8 => eye_typed::<u8>(&shape, k),
            ElemKind::U16 => eye_typed::<u16>(&shape, k),
            ElemKind::U32 => eye_typed::<u32>(&shape, k),
            ElemKind::U64 => eye_typed::<u64>(&shape, k),
            ElemKind::Bool => eye_typed::<bool>(&shape, k),
        }))
    }))
}

/// The element types the CPU EP holds, for ops whose output type comes from an attribute.
#[derive(Clone, Copy)]
enum ElemKind {
    F32,
    F64,
    F16,
    BF16,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
}

fn by_elem_type(
    op: &str,
    ty: ElementType,
    f: impl FnOnce(ElemKind) -> OpResult<Tensor>,
) -> OpResult<Tensor> {
    let k = match ty {
        ElementType::Float => ElemKind::F32,
        ElementType::Double => ElemKind::F64,
        ElementType::Float16 => ElemKind::F16,
        ElementType::Bfloat16 => ElemKind::BF16,
        ElementType::Int8 => ElemKind::I8,
        ElementType::Int16 => ElemKind::I16,
        ElementType::Int32 => ElemKind::I32,
        ElementType::Int64 => ElemKind::I64,
        ElementType::Uint8 => ElemKind::U8,
        ElementType::Uint16 => ElemKind::U16,
        ElementType::Uint32 => ElemKind::U32,
        ElementType::Uint64 => ElemKind::U64,
        ElementType::Bool => ElemKind::Bool,
        other => bail!("{op}: unsupported element type {other}"),
    };
    f(k)
}

// ---------------------------------------------------------------------------------------------
// CumSum / CumProd

fn cum_typed<T: Num>(
    x: ArrayViewD<'_, T>,
    axis: usize,
    exclusive: bool,
    reverse: bool,
    prod: bool,
) -> OpResult<Tensor> {
    let shape = x.shape().to_vec();
    let dim = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let src = contiguous(&x);
    let mut out = vec![T::default(); src.len()];
    let identity = if prod { T::one() } else { T::zero() };
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = identity;
            for step in 0..dim {
                let j = if reverse { dim - 1 - step } else { step };
                let p = (o * dim + j) * inner + i;
                let v = src.get(p).copied().unwrap_or(identity);
                let next = if prod { acc.mul(v) } else { acc.add(v) };
                if let Some(slot) = out.get_mut(p) {
                    *slot = if exclusive { acc } else { next };
                }
                acc = next;
            }
        }
    }
    Tensor::from_vec(&shape, out)
}

fn build_cum(n: &NodeDef, prod: bool) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let exclusive = n.attr_int_or("exclusive", 0)? != 0;
    let reverse = n.attr_int_or("reverse", 0)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let axis = scalar_i64(&op, "axis", input(&op, inputs, 1)?)?;
        if x.ndim() == 0 {
            bail!("{op}: input must have rank >= 1");
        }
        let ax = normalize_axis(&op, axis, x.ndim())?;
        one(with_types!(
            x.clone(),
            |a| cum_typed(a, ax, exclusive, reverse, prod),
            [F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64],
            &op
        ))
    }))
}

fn build_cumsum(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    build_cum(n, false)
}

fn build_cumprod(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    build_cum(n, true)
}

// ---------------------------------------------------------------------------------------------
// ReverseSequence

fn reverse_sequence_typed<T: Elem>(
    x: ArrayViewD<'_, T>,
    lens: &[usize],
    batch_axis: usize,
    time_axis: usize,
) -> OpResult<Tensor> {
    let shape = x.shape().to_vec();
    let strides = c_strides(&shape);
    let src = contiguous(&x);
    let mut out = src.to_vec();
    let mut k = 0usize;
    for_each_index(&shape, |pos| {
        let b = pos[batch_axis];
        let t = pos[time_axis];
        let len = lens.get(b).copied().unwrap_or(0);
        if t < len {
            let st = len - 1 - t;
            let from = k - t * strides[time_axis] + st * strides[time_axis];
            if let (Some(slot), Some(v)) = (out.get_mut(k), src.get(from)) {
                *slot = *v;
            }
        }
        k += 1;
    });
    Tensor::from_vec(&shape, out)
}

fn build_reverse_sequence(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let batch_axis = n.attr_int_or("batch_axis", 1)?;
    let time_axis = n.attr_int_or("time_axis", 0)?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        if x.ndim() < 2 {
            bail!("{op}: input must have rank >= 2, got shape {:?}", x.shape());
        }
        let b = normalize_axis(&op, batch_axis, x.ndim())?;
        let t = normalize_axis(&op, time_axis, x.ndim())?;
        if b == t {
            bail!("{op}: batch_axis and time_axis must differ");
        }
        let lens_t = input(&op, inputs, 1)?;
        let lens = lens_t.to_i64_vec(&format!("{op}: sequence_lens"))?;
        if lens.len() != x.shape()[b] {
            bail!(
                "{op}: sequence_lens has {} values, batch axis has size {}",
                lens.len(),
                x.shape()[b]
            );
        }
        let tdim = x.shape()[t];
        let lens = lens
            .iter()
            .map(|&l| {
                usize::try_from(l)
                    .ok()
                    .filter(|&u| u <= tdim)
                    .ok_or_else(|| {
                        OpError(format!(
                            "{op}: sequence length {l} out of range for time axis of size {tdim}"
                        ))
                    })
            })
            .collect::<OpResult<Vec<_>>>()?;
        one(dispatch_all!(
            x.clone(),
            |a| reverse_sequence_typed(a, &lens, b, t),
            &op
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    fn i64s(shape: &[usize], v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    fn f32s(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    fn iota(shape: &[usize]) -> Option<Tensor> {
        let n: usize = shape.iter().product();
        Some(Tensor::from_vec(shape, (0..n).map(|x| x as f32).collect()).unwrap())
    }

    #[test]
    fn gather_elements_and_errors() {
        let n = NodeDef::new("GatherElements", 13).with_attr("axis", AttrValue::Int(1));
        let out = run(
            n.clone(),
            vec![
                f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]),
                i64s(&[2, 2], &[0, 0, 1, 0]),
            ],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[1.0, 1.0], [4.0, 3.0]].into_dyn())
        );
        let neg = run(n.clone(), vec![iota(&[2, 3]), i64s(&[2, 1], &[-1, -3])]).unwrap();
        assert_eq!(neg[0], Tensor::F32(array![[2.0], [3.0]].into_dyn()));
        let e = run(n.clone(), vec![iota(&[2, 2]), i64s(&[2, 1], &[2, 0])]).unwrap_err();
        assert_eq!(
            e.0,
            "GatherElements: index 2 out of range for axis 1 of size 2"
        );
        let e = run(n.clone(), vec![iota(&[2, 2]), i64s(&[2], &[0, 0])]).unwrap_err();
        assert!(e.0.contains("indices rank 1 must equal data rank 2"), "{e}");
        let e = run(n.clone(), vec![iota(&[2, 2]), i64s(&[3, 1], &[0, 0, 0])]).unwrap_err();
        assert!(e.0.contains("exceeds data shape"), "{e}");
        let e = run(n, vec![iota(&[2, 2]), f32s(&[2, 1], &[0.0, 0.0])]).unwrap_err();
        assert!(e.0.contains("indices must be int32 or int64"), "{e}");
        let bad_axis = NodeDef::new("GatherElements", 13).with_attr("axis", AttrValue::Int(2));
        let e = run(bad_axis, vec![iota(&[2, 2]), i64s(&[2, 2], &[0; 4])]).unwrap_err();
        assert!(e.0.contains("axis 2 is out of range for rank 2"), "{e}");
    }

    #[test]
    fn gather_nd_batch_dims() {
        let out = run(
            NodeDef::new("GatherND", 13),
            vec![iota(&[2, 2, 2]), i64s(&[2, 1, 2], &[0, 1, 1, 0])],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[2.0, 3.0]], [[4.0, 5.0]]].into_dyn())
        );
        let b1 = NodeDef::new("GatherND", 13).with_attr("batch_dims", AttrValue::Int(1));
        let out = run(b1.clone(), vec![iota(&[2, 2, 2]), i64s(&[2, 1], &[1, 0])]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[2.0, 3.0], [4.0, 5.0]].into_dyn())
        );
        let e = run(b1, vec![iota(&[2, 2, 2]), i64s(&[3, 1], &[1, 0, 0])]).unwrap_err();
        assert!(
            e.0.contains("batch dims of data [2] and indices [3] differ"),
            "{e}"
        );
        let e = run(
            NodeDef::new("GatherND", 13),
            vec![iota(&[2, 2]), i64s(&[1, 3], &[0, 0, 0])],
        )
        .unwrap_err();
        assert!(e.0.contains("exceeds data rank 2"), "{e}");
        let e = run(
            NodeDef::new("GatherND", 13),
            vec![iota(&[2, 2]), i64s(&[1, 2], &[0, 5])],
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            "GatherND: index 5 out of range for data dim 1 of size 2"
        );
    }

    #[test]
    fn scatter_elements_reductions() {
        let data = f32s(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        let idx = i64s(&[1, 2], &[1, 1]);
        let upd = f32s(&[1, 2], &[1.5, 2.5]);
        let mk = |r: &str| {
            NodeDef::new("ScatterElements", 18)
                .with_attr("axis", AttrValue::Int(1))
                .with_attr("reduction", AttrValue::String(r.as_bytes().to_vec()))
        };
        let got = |r: &str| {
            run(mk(r), vec![data.clone(), idx.clone(), upd.clone()]).unwrap()[0]
                .as_array::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<f32>>()
        };
        assert_eq!(got("none"), vec![1.0, 2.5, 3.0, 4.0, 5.0]);
        assert_eq!(got("add"), vec![1.0, 6.0, 3.0, 4.0, 5.0]);
        assert_eq!(got("mul"), vec![1.0, 7.5, 3.0, 4.0, 5.0]);
        assert_eq!(got("max"), vec![1.0, 2.5, 3.0, 4.0, 5.0]);
        assert_eq!(got("min"), vec![1.0, 1.5, 3.0, 4.0, 5.0]);
        let e = run(mk("bogus"), vec![]).unwrap_err();
        assert!(e.0.contains("unknown reduction 'bogus'"), "{e}");
        let e = run(
            mk("none"),
            vec![data.clone(), i64s(&[1, 1], &[5]), f32s(&[1, 1], &[0.0])],
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            "ScatterElements: index 5 out of range for axis 1 of size 5"
        );
        let e = run(
            mk("none"),
            vec![data.clone(), idx.clone(), f32s(&[1, 1], &[0.0])],
        )
        .unwrap_err();
        assert!(
            e.0.contains("updates shape [1, 1] must equal indices shape [1, 2]"),
            "{e}"
        );
        let e = run(
            mk("none"),
            vec![data, idx, Some(Tensor::I64(array![[1i64, 2]].into_dyn()))],
        )
        .unwrap_err();
        assert!(e.0.contains("same element type"), "{e}");
        // Old Scatter is ScatterElements without reduction.
        let s = run(
            NodeDef::new("Scatter", 10),
            vec![
                Some(Tensor::Bool(array![false, false].into_dyn())),
                i64s(&[1], &[-1]),
                Some(Tensor::Bool(array![true].into_dyn())),
            ],
        )
        .unwrap();
        assert_eq!(s[0], Tensor::Bool(array![false, true].into_dyn()));
    }

    #[test]
    fn scatter_nd_and_errors() {
        let data = iota(&[2, 2]);
        let add_n = NodeDef::new("ScatterND", 18)
            .with_attr("reduction", AttrValue::String(b"add".to_vec()));
        let out = run(
            add_n,
            vec![
                data.clone(),
                i64s(&[2, 1], &[1, 1]),
                f32s(&[2, 2], &[1.0, 1.0, 10.0, 10.0]),
            ],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 1.0], [13.0, 14.0]].into_dyn())
        );
        let out = run(
            NodeDef::new("ScatterND", 13),
            vec![data.clone(), i64s(&[1, 2], &[0, 1]), f32s(&[1], &[9.0])],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 9.0], [2.0, 3.0]].into_dyn())
        );
        let e = run(
            NodeDef::new("ScatterND", 13),
            vec![
                data.clone(),
                i64s(&[1, 2], &[0, 1]),
                f32s(&[2], &[9.0, 1.0]),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("updates shape [2] must be [1]"), "{e}");
        let e = run(
            NodeDef::new("ScatterND", 13),
            vec![data.clone(), i64s(&[1, 2], &[-3, 0]), f32s(&[1], &[9.0])],
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            "ScatterND: index -3 out of range for data dim 0 of size 2"
        );
        let e = run(
            NodeDef::new("ScatterND", 13),
            vec![data, i64s(&[1, 3], &[0, 0, 0]), f32s(&[1], &[9.0])],
        )
        .unwrap_err();
        assert!(
            e.0.contains("indices last dim 3 exceeds data rank 2"),
            "{e}"
        );
    }

    #[test]
    fn one_hot_axes() {
        let n = NodeDef::new("OneHot", 11).with_attr("axis", AttrValue::Int(0));
        let out = run(
            n,
            vec![
                i64s(&[2], &[1, -1]),
                Some(Tensor::scalar(3.0f32)),
                Some(Tensor::I32(array![0, 5].into_dyn())),
            ],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::I32(array![[0, 0], [5, 0], [0, 5]].into_dyn())
        );
        let out = run(
            NodeDef::new("OneHot", 11),
            vec![
                f32s(&[2], &[0.0, 7.0]),
                Some(Tensor::scalar(2i64)),
                f32s(&[2], &[0.0, 1.0]),
            ],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[1.0, 0.0], [0.0, 0.0]].into_dyn())
        );
        let e = run(
            NodeDef::new("OneHot", 11),
            vec![
                i64s(&[1], &[0]),
                Some(Tensor::scalar(2i64)),
                f32s(&[3], &[0.0; 3]),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("values must have exactly two elements"), "{e}");
        let e = run(
            NodeDef::new("OneHot", 11),
            vec![
                i64s(&[1], &[0]),
                Some(Tensor::scalar(0i64)),
                f32s(&[2], &[0.0; 2]),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("depth must be positive"), "{e}");
        let bad = NodeDef::new("OneHot", 11).with_attr("axis", AttrValue::Int(3));
        let e = run(
            bad,
            vec![
                i64s(&[1], &[0]),
                Some(Tensor::scalar(2i64)),
                f32s(&[2], &[0.0; 2]),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("axis 3 is out of range for rank 2"), "{e}");
    }

    #[test]
    fn top_k_ties_and_errors() {
        let x = f32s(&[2, 4], &[1.0, 3.0, 3.0, 2.0, 0.0, -1.0, 0.0, 5.0]);
        let out = run(NodeDef::new("TopK", 11), vec![x.clone(), i64s(&[1], &[2])]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[3.0, 3.0], [5.0, 0.0]].into_dyn())
        );
        assert_eq!(out[1], Tensor::I64(array![[1, 2], [3, 0]].into_dyn()));
        let small = NodeDef::new("TopK", 11).with_attr("largest", AttrValue::Int(0));
        let out = run(small, vec![x.clone(), i64s(&[1], &[3])]).unwrap();
        assert_eq!(
            out[1],
            Tensor::I64(array![[0, 3, 1], [5 - 4, 0, 2]].into_dyn())
        );
        let old = NodeDef::new("TopK", 1)
            .with_attr("k", AttrValue::Int(1))
            .with_attr("axis", AttrValue::Int(0));
        let out = run(old, vec![x.clone()]).unwrap();
        assert_eq!(out[1], Tensor::I64(array![[0, 0, 0, 1]].into_dyn()));
        let e = run(NodeDef::new("TopK", 11), vec![x.clone(), i64s(&[1], &[5])]).unwrap_err();
        assert_eq!(e.0, "TopK: k 5 is larger than axis 1 of size 4");
        let e = run(NodeDef::new("TopK", 11), vec![x.clone(), i64s(&[1], &[-1])]).unwrap_err();
        assert_eq!(e.0, "TopK: k must be >= 0, got -1");
        let e = run(NodeDef::new("TopK", 11), vec![x, i64s(&[2], &[1, 1])]).unwrap_err();
        assert!(e.0.contains("k must have one element"), "{e}");
    }

    #[test]
    fn non_zero_compress() {
        let out = run(
            NodeDef::new("NonZero", 13),
            vec![Some(Tensor::Bool(
                array![[true, false], [true, true]].into_dyn(),
            ))],
        )
        .unwrap();
        assert_eq!(out[0], Tensor::I64(array![[0, 1, 1], [0, 0, 1]].into_dyn()));
        let c = NodeDef::new("Compress", 11).with_attr("axis", AttrValue::Int(-1));
        let cond = Some(Tensor::Bool(array![false, true].into_dyn()));
        let out = run(c.clone(), vec![iota(&[3, 2]), cond.clone()]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![[1.0], [3.0], [5.0]].into_dyn()));
        let flat = run(
            NodeDef::new("Compress", 11),
            vec![
                iota(&[3, 2]),
                Some(Tensor::Bool(array![false, true, true].into_dyn())),
            ],
        )
        .unwrap();
        assert_eq!(flat[0], Tensor::F32(array![1.0, 2.0].into_dyn()));
        let e = run(
            c.clone(),
            vec![
                iota(&[3, 2]),
                Some(Tensor::Bool(array![false, true, true].into_dyn())),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("more than axis 1 of size 2"), "{e}");
        let e = run(c, vec![iota(&[3, 2]), i64s(&[2], &[0, 1])]).unwrap_err();
        assert_eq!(e.0, "Compress: condition must be bool, got int64");
    }

    #[test]
    fn unique_outputs() {
        let x = f32s(&[6], &[2.0, 1.0, 1.0, 3.0, 4.0, 3.0]);
        let out = run(NodeDef::new("Unique", 11), vec![x.clone()]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![1.0, 2.0, 3.0, 4.0].into_dyn()));
        assert_eq!(out[1], Tensor::I64(array![1, 0, 3, 4].into_dyn()));
        assert_eq!(out[2], Tensor::I64(array![1, 0, 0, 2, 3, 2].into_dyn()));
        assert_eq!(out[3], Tensor::I64(array![2, 1, 2, 1].into_dyn()));
        let ns = NodeDef::new("Unique", 11).with_attr("sorted", AttrValue::Int(0));
        let out = run(ns, vec![x]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![2.0, 1.0, 3.0, 4.0].into_dyn()));
        let ax = NodeDef::new("Unique", 11).with_attr("axis", AttrValue::Int(0));
        let out = run(
            ax.clone(),
            vec![f32s(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0])],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 1.0], [1.0, 0.0]].into_dyn())
        );
        assert_eq!(out[2], Tensor::I64(array![1, 0, 1].into_dyn()));
        let e = run(
            NodeDef::new("Unique", 11).with_attr("axis", AttrValue::Int(2)),
            vec![iota(&[2, 2])],
        )
        .unwrap_err();
        assert!(e.0.contains("axis 2 is out of range for rank 2"), "{e}");
    }

    #[test]
    fn trilu_eye_like() {
        let out = run(
            NodeDef::new("Trilu", 14),
            vec![iota(&[2, 3]), i64s(&[], &[1])],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 1.0, 2.0], [0.0, 0.0, 5.0]].into_dyn())
        );
        let low = NodeDef::new("Trilu", 14).with_attr("upper", AttrValue::Int(0));
        let out = run(low, vec![iota(&[2, 3])]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]].into_dyn())
        );
        let e = run(NodeDef::new("Trilu", 14), vec![iota(&[3])]).unwrap_err();
        assert_eq!(e.0, "Trilu: input must have rank >= 2, got shape [3]");
        let eye = NodeDef::new("EyeLike", 22)
            .with_attr("k", AttrValue::Int(-1))
            .with_attr("dtype", AttrValue::Int(7));
        let out = run(eye, vec![iota(&[3, 2])]).unwrap();
        assert_eq!(
            out[0],
            Tensor::I64(array![[0, 0], [1, 0], [0, 1]].into_dyn())
        );
        let e = run(NodeDef::new("EyeLike", 22), vec![iota(&[3])]).unwrap_err();
        assert_eq!(e.0, "EyeLike: input must be 2-D, got shape [3]");
        let bad = NodeDef::new("EyeLike", 22).with_attr("dtype", AttrValue::Int(999));
        assert!(
            run(bad, vec![])
                .unwrap_err()
                .0
                .contains("unknown dtype 999")
        );
    }

    #[test]
    fn cumsum_cumprod() {
        let x = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let axis = Some(Tensor::scalar(0i32));
        let out = run(NodeDef::new("CumSum", 14), vec![x.clone(), axis.clone()]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![1.0, 3.0, 6.0, 10.0].into_dyn()));
        let n = NodeDef::new("CumSum", 14)
            .with_attr("exclusive", AttrValue::Int(1))
            .with_attr("reverse", AttrValue::Int(1));
        let out = run(n, vec![x.clone(), axis.clone()]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![9.0, 7.0, 4.0, 0.0].into_dyn()));
        let p = NodeDef::new("CumProd", 26).with_attr("exclusive", AttrValue::Int(1));
        let out = run(p, vec![x.clone(), axis]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![1.0, 1.0, 2.0, 6.0].into_dyn()));
        let e = run(
            NodeDef::new("CumSum", 14),
            vec![x.clone(), Some(Tensor::scalar(1i64))],
        )
        .unwrap_err();
        assert!(e.0.contains("axis 1 is out of range for rank 1"), "{e}");
        let e = run(
            NodeDef::new("CumSum", 14),
            vec![x, Some(Tensor::scalar(0.0f32))],
        )
        .unwrap_err();
        assert!(e.0.contains("axis must be an int32 or int64 tensor"), "{e}");
    }

    #[test]
    fn reverse_sequence() {
        let n = NodeDef::new("ReverseSequence", 10)
            .with_attr("batch_axis", AttrValue::Int(0))
            .with_attr("time_axis", AttrValue::Int(1));
        let out = run(n.clone(), vec![iota(&[2, 3]), i64s(&[2], &[3, 2])]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[2.0, 1.0, 0.0], [4.0, 3.0, 5.0]].into_dyn())
        );
        let e = run(n.clone(), vec![iota(&[2, 3]), i64s(&[2], &[4, 2])]).unwrap_err();
        assert!(e.0.contains("sequence length 4 out of range"), "{e}");
        let e = run(n, vec![iota(&[2, 3]), i64s(&[3], &[1, 1, 1])]).unwrap_err();
        assert!(e.0.contains("sequence_lens has 3 values"), "{e}");
    }
}
