//! Walking the multi-indices of a shape, its row-major strides, and index inputs read and
//! checked against the extent they index.

use epx_plugin_api::ElementType;
use ndarray::ArrayViewD;

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::tensor::{Elem, TensorRef};

/// Iterates over all multi-indices of `shape` in C order, calling `f` with each.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// C-order strides of a shape.
pub fn c_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Normalizes an index in `[-dim, dim)` to `[0, dim)`.
pub(crate) fn norm_index(op: &str, i: i64, dim: usize, what: &str) -> OpResult<usize> {
    let j = if i < 0 {
        i.saturating_add(dim as i64)
    } else {
        i
    };
    usize::try_from(j).ok().filter(|&j| j < dim).ok_or_else(|| {
        OpError(format!(
            "{op}: index {i} out of range for {what} of size {dim}"
        ))
    })
}

/// Integer index tensor values (int32 or int64 only).
pub(crate) fn index_values(op: &str, t: &TensorRef<'_>) -> OpResult<Vec<i64>> {
    if !matches!(t.elem_type(), ElementType::Int32 | ElementType::Int64) {
        bail!(
            "{op}: indices must be int32 or int64, got {}",
            t.elem_type()
        );
    }
    t.to_i64_vec(&format!("{op}: indices"))
}

pub(crate) fn flat<T: Elem>(a: &ArrayViewD<'_, T>) -> Vec<T> {
    let mut v = Vec::with_capacity(a.len());
    crate::strided::extend(a, &mut v);
    v
}

/// The elements of a view as one slice: borrowed when it is contiguous in C order.
pub(crate) fn contiguous<'a, T: Clone>(
    a: &'a ndarray::ArrayViewD<'_, T>,
) -> std::borrow::Cow<'a, [T]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().cloned().collect()),
    }
}
