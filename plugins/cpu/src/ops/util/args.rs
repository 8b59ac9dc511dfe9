//! An op's arguments: inputs by index, scalar inputs, element types that must agree, axes
//! normalized against a rank.

use ndarray::ArrayViewD;

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::ops::util::num::float_values;
use crate::tensor::{Elem, TensorRef};

/// Normalizes an axis in `[-rank, rank)` to `[0, rank)`.
pub fn normalize_axis(op: &str, axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(OpError(format!(
            "{op}: axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// Normalizes a list of axes; duplicates are an error.
pub fn normalize_axes(op: &str, axes: &[i64], rank: usize) -> OpResult<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(OpError(format!("{op}: axis {a} is repeated in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// The `i`-th input, which must be present.
pub fn input<'b, 'a>(
    op: &str,
    inputs: &'b [Option<TensorRef<'a>>],
    i: usize,
) -> OpResult<&'b TensorRef<'a>> {
    inputs
        .get(i)
        .and_then(Option::as_ref)
        .ok_or_else(|| OpError(format!("{op}: missing required input {i}")))
}

/// The `i`-th input if present.
pub fn opt_input<'b, 'a>(
    inputs: &'b [Option<TensorRef<'a>>],
    i: usize,
) -> Option<&'b TensorRef<'a>> {
    inputs.get(i).and_then(Option::as_ref)
}

/// Checks that two inputs have the same element type.
pub fn same_type(op: &str, a: &TensorRef<'_>, b: &TensorRef<'_>) -> OpResult<()> {
    if a.elem_type() != b.elem_type() {
        return Err(OpError(format!(
            "{op}: inputs must have the same element type, got {} and {}",
            a.elem_type(),
            b.elem_type()
        )));
    }
    Ok(())
}

/// The typed view of `t`, which must have the same element type as `like`.
pub fn typed_like<'a, T: Elem>(op: &str, t: &TensorRef<'a>) -> OpResult<ArrayViewD<'a, T>> {
    t.get::<T>().ok_or_else(|| {
        OpError(format!(
            "{op}: inputs must have the same element type, got {} and {}",
            T::TYPE,
            t.elem_type()
        ))
    })
}

/// A scalar-or-1-element input as i64.
pub fn scalar_i64(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<i64> {
    let v = t.to_i64_vec(&format!("{op}: {what}"))?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(OpError(format!(
            "{op}: {what} must have one element, got shape {:?}",
            t.shape()
        ))),
    }
}

/// A scalar-or-1-element float input as f64.
pub fn scalar_f64(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<f64> {
    let v = float_values(op, what, t)?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => bail!(
            "{op}: {what} must have one element, got shape {:?}",
            t.shape()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes() {
        assert_eq!(normalize_axis("X", -1, 3), Ok(2));
        assert!(
            normalize_axis("X", 3, 3)
                .unwrap_err()
                .0
                .contains("axis 3 is out of range for rank 3")
        );
        assert!(
            normalize_axes("X", &[0, -3], 3)
                .unwrap_err()
                .0
                .contains("repeated")
        );
    }
}
