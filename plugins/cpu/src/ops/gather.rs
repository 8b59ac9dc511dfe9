//! The gathers: Gather (whole slices along an axis), GatherElements (one element per index,
//! along an axis) and GatherND (slices addressed by index tuples). Every index is checked
//! against its extent before use; negative indices count from the end.

use epx_plugin_api::ElementType;
use ndarray::{ArrayViewD, Axis};

use crate::ops::util::indexing::{c_strides, for_each_index};

use crate::limits::checked_numel;

use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::shape::reshape_ref;
use crate::ops::util::args::{input, normalize_axis};
use crate::ops::util::indexing::{contiguous, index_values, norm_index};
use crate::tensor::{Elem, Tensor};
use crate::{bail, dispatch_all};

pub fn register(reg: &mut Registry) {
    add(reg, "GatherElements", 11, build_gather_elements);
    add(reg, "GatherND", 11, build_gather_nd);
    add(reg, "Gather", 1, build_gather);
}

fn gather_elements_typed<T: Elem>(
    op: &str,
    data: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    axis: usize,
) -> OpResult<Tensor> {
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
    let src = contiguous(&data);
    let strides = c_strides(&dshape);
    let mut out = Vec::with_capacity(idx.len());
    let mut err = None;
    let mut k = 0usize;
    for_each_index(idx_shape, |pos| {
        if err.is_some() {
            return;
        }
        let raw = idx.get(k).copied().unwrap_or_default();
        k += 1;
        match norm_index(op, raw, dshape[axis], &format!("axis {axis}")) {
            Ok(j) => {
                let off: usize = pos
                    .iter()
                    .enumerate()
                    .map(|(d, &p)| if d == axis { j } else { p } * strides[d])
                    .sum();
                out.push(src.get(off).copied().unwrap_or_default());
            }
            Err(e) => err = Some(e),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    Tensor::from_vec(idx_shape, out)
}

fn build_gather_elements(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 0)?;
    Ok(kernel(move |inputs| {
        let data = input(&op, inputs, 0)?;
        let indices = input(&op, inputs, 1)?;
        let idx = index_values(&op, indices)?;
        let ax = normalize_axis(&op, axis, data.ndim())?;
        one(dispatch_all!(
            data.clone(),
            |a| gather_elements_typed(&op, a, &idx, indices.shape(), ax),
            &op
        ))
    }))
}

fn gather_nd_typed<T: Elem>(
    op: &str,
    data: ArrayViewD<'_, T>,
    idx: &[i64],
    idx_shape: &[usize],
    b: usize,
) -> OpResult<Tensor> {
    let dshape = data.shape().to_vec();
    let r = dshape.len();
    let q = idx_shape.len();
    if r < 1 || q < 1 {
        bail!("{op}: data and indices must have rank >= 1, got {r} and {q}");
    }
    if b >= q.min(r) {
        bail!("{op}: batch_dims {b} must be less than the ranks of data ({r}) and indices ({q})");
    }
    let k = idx_shape[q - 1];
    if b + k > r {
        bail!("{op}: indices last dim {k} plus batch_dims {b} exceeds data rank {r}");
    }
    if dshape[..b] != idx_shape[..b] {
        bail!(
            "{op}: batch dims of data {:?} and indices {:?} differ",
            &dshape[..b],
            &idx_shape[..b]
        );
    }
    let batch: usize = dshape[..b].iter().product();
    let slice: usize = dshape[b + k..].iter().product();
    let per_batch_data: usize = dshape[b..].iter().product();
    let tuples_per_batch: usize = idx_shape[b..q - 1].iter().product();
    let strides = c_strides(&dshape[b..]);
    let src = contiguous(&data);
    let mut out_shape = idx_shape[..q - 1].to_vec();
    out_shape.extend_from_slice(&dshape[b + k..]);
    let total = checked_numel(&out_shape)?;
    let mut out = Vec::with_capacity(total);
    for bi in 0..batch {
        for t in 0..tuples_per_batch {
            let base = (bi * tuples_per_batch + t) * k;
            let mut off = bi * per_batch_data;
            for j in 0..k {
                let raw = idx.get(base + j).copied().unwrap_or_default();
                let d = norm_index(op, raw, dshape[b + j], &format!("data dim {}", b + j))?;
                off += d * strides[j];
            }
            match src.get(off..off + slice) {
                Some(s) => out.extend_from_slice(s),
                None => bail!("{op}: index tuple out of range"),
            }
        }
    }
    Tensor::from_vec(&out_shape, out)
}

fn build_gather_nd(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let batch_dims = n.attr_int_or("batch_dims", 0)?;
    let Ok(b) = usize::try_from(batch_dims) else {
        return Err(n.error(format_args!("batch_dims {batch_dims} must be >= 0")));
    };
    Ok(kernel(move |inputs| {
        let data = input(&op, inputs, 0)?;
        let indices = input(&op, inputs, 1)?;
        if indices.elem_type() != ElementType::Int64 && indices.elem_type() != ElementType::Int32 {
            bail!("{op}: indices must be int64, got {}", indices.elem_type());
        }
        let idx = indices.to_i64_vec(&format!("{op}: indices"))?;
        one(dispatch_all!(
            data.clone(),
            |a| gather_nd_typed(&op, a, &idx, indices.shape(), b),
            &op
        ))
    }))
}

fn gather_typed<T: Elem>(
    op: &str,
    data: ArrayViewD<'_, T>,
    axis: usize,
    idx: &[usize],
    idx_shape: &[usize],
) -> OpResult<Tensor> {
    let sel = data.select(Axis(axis), idx);
    let mut shape = data.shape()[..axis].to_vec();
    shape.extend_from_slice(idx_shape);
    shape.extend_from_slice(&data.shape()[axis + 1..]);
    reshape_ref(op, &T::wrap_ref(sel.view()), &shape)
}

fn build_gather(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 0)?;
    Ok(kernel(move |inputs| {
        let data = input(&op, inputs, 0)?;
        let indices = input(&op, inputs, 1)?;
        if !matches!(indices.elem_type(), ElementType::Int32 | ElementType::Int64) {
            bail!(
                "{op}: indices must be int32 or int64, got {}",
                indices.elem_type()
            );
        }
        let ax = normalize_axis(&op, axis, data.ndim())?;
        let dim = data.shape()[ax];
        let raw = indices.to_i64_vec(&format!("{op}: indices"))?;
        let idx: Vec<usize> = raw
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + dim as i64 } else { i };
                usize::try_from(j).ok().filter(|&j| j < dim).ok_or_else(|| {
                    OpError(format!(
                        "{op}: index {i} out of range for axis {ax} of size {dim}"
                    ))
                })
            })
            .collect::<OpResult<_>>()?;
        one(dispatch_all!(
            data.clone(),
            |a| gather_typed(&op, a, ax, &idx, indices.shape()),
            &op
        ))
    }))
}
