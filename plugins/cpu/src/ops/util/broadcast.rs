//! numpy broadcasting: shapes, views and elementwise maps over two broadcast operands.

use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};

use crate::error::{OpError, OpResult};
use crate::limits::checked_numel;

/// The numpy broadcast of two shapes, or `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a.get(i + a.len() - n).copied().unwrap_or(1)
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b.get(i + b.len() - n).copied().unwrap_or(1)
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// The numpy broadcast of several shapes, with an error naming the op.
pub fn broadcast_all(op: &str, shapes: &[&[usize]]) -> OpResult<Vec<usize>> {
    let mut out: Vec<usize> = Vec::new();
    for s in shapes {
        out = broadcast_shapes(&out, s).ok_or_else(|| {
            OpError(format!(
                "{op}: shapes {shapes:?} cannot be broadcast together"
            ))
        })?;
    }
    checked_numel(&out).map_err(|e| OpError(format!("{op}: broadcast result: {}", e.0)))?;
    Ok(out)
}

/// A view broadcast to `shape`, with an error naming the op.
pub fn broadcast_to<'a, T>(
    op: &str,
    a: &'a ArrayViewD<'_, T>,
    shape: &[usize],
) -> OpResult<ArrayViewD<'a, T>> {
    a.broadcast(IxDyn(shape)).ok_or_else(|| {
        OpError(format!(
            "{op}: shape {:?} cannot be broadcast to {:?}",
            a.shape(),
            shape
        ))
    })
}

/// Applies `f` elementwise over two broadcast arrays.
pub fn binary_map<A: Copy, B: Copy, O>(
    op: &str,
    a: &ArrayViewD<'_, A>,
    b: &ArrayViewD<'_, B>,
    mut f: impl FnMut(A, B) -> O,
) -> OpResult<ArrayD<O>> {
    if a.shape() == b.shape() {
        return Ok(Zip::from(a).and(b).map_collect(|&x, &y| f(x, y)));
    }
    let shape = broadcast_all(op, &[a.shape(), b.shape()])?;
    let av = broadcast_to(op, a, &shape)?;
    let bv = broadcast_to(op, b, &shape)?;
    Ok(Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shapes(&[], &[3]), Some(vec![3]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 5]), Some(vec![0, 5]));
        let e = broadcast_all("Add", &[&[2], &[3]]).unwrap_err();
        assert!(e.0.starts_with("Add: shapes"), "{e}");
    }
}
