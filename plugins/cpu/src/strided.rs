//! Copying a strided view (a slice, a transpose, a broadcast) into C order: runs of elements
//! that lie one after another in memory are copied as runs, whatever the view's rank.
//!
//! A view's dims are first merged where one dim steps exactly over the next (a slice along the
//! outer axes of a `[N, C, H, W]` tensor is `[N', C·H·W]`); axes of length 1 are left out. Then
//! the innermost dim is copied as one `copy_from_slice` where its stride is 1, else in one tight
//! loop, for each position of the outer dims.

use ndarray::ArrayViewD;

use crate::error::OpResult;

/// The merged `(length, stride)` dims of a view with no zero length, outer first.
fn merged_dims(shape: &[usize], strides: &[isize]) -> Vec<(usize, isize)> {
    let mut dims: Vec<(usize, isize)> = Vec::with_capacity(shape.len());
    for (&n, &s) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match dims.last_mut() {
            // The outer dim steps over the whole of this one: they are one dim.
            Some(last) if last.1 == s * n as isize => *last = (last.0 * n, s),
            _ => dims.push((n, s)),
        }
    }
    dims
}

/// The elements of `v` in C order (row-major over its shape), copied into a recycled buffer
/// where one fits ([`crate::scratch`]); an error when the memory is not there.
pub(crate) fn to_vec<T: Copy + 'static>(v: &ArrayViewD<'_, T>) -> OpResult<Vec<T>> {
    let mut out = crate::scratch::take_any::<T>(v.len())?;
    extend(v, &mut out);
    Ok(out)
}

/// Appends the elements of `v` to `out` in C order.
pub(crate) fn extend<T: Copy>(v: &ArrayViewD<'_, T>, out: &mut Vec<T>) {
    if let Some(s) = v.as_slice() {
        out.extend_from_slice(s);
        return;
    }
    if v.is_empty() {
        return;
    }
    let dims = merged_dims(v.shape(), v.strides());
    // The lowest and highest offsets (in elements, from the first element) the view reads.
    let (mut lo, mut hi) = (0isize, 0isize);
    for &(n, s) in &dims {
        let reach = s * (n as isize - 1);
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    // SAFETY: every element of the view lies at `as_ptr() + o` for an offset `o` in `lo..=hi`
    // (the sum over dims of index times stride, each index below its length), inside the
    // allocation the view borrows, which outlives `base`; `T: Copy` is read by value only.
    let base: &[T] =
        unsafe { std::slice::from_raw_parts(v.as_ptr().offset(lo), (hi - lo) as usize + 1) };
    let start = -lo;
    let Some((&(inner_n, inner_s), outer)) = dims.split_last() else {
        // Every dim has length 1: one element.
        out.push(base[start as usize]);
        return;
    };
    out.reserve(v.len());
    let mut idx = vec![0usize; outer.len()];
    let mut off = start;
    loop {
        let o = off as usize;
        if inner_s == 1 {
            out.extend_from_slice(&base[o..o + inner_n]);
        } else {
            out.extend((0..inner_n).map(|i| base[(off + i as isize * inner_s) as usize]));
        }
        // The next position of the outer dims, the last one fastest.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += outer[d].1;
            if idx[d] < outer[d].0 {
                break;
            }
            off -= outer[d].1 * outer[d].0 as isize;
            idx[d] = 0;
        }
    }
}

/// `v` as an owned array in C order; an error when the memory is not there.
pub(crate) fn to_owned<T: Copy + 'static>(v: &ArrayViewD<'_, T>) -> OpResult<ndarray::ArrayD<T>> {
    let data = to_vec(v)?;
    ndarray::ArrayD::from_shape_vec(v.raw_dim(), data)
        .map_err(|e| crate::error::OpError(format!("copying a strided view: {e}")))
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, Axis, IxDyn, Slice};

    use super::*;

    fn iota(shape: &[usize]) -> ArrayD<i32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(IxDyn(shape), (0..n as i32).collect()).unwrap()
    }

    fn check(v: ndarray::ArrayViewD<'_, i32>) {
        let want: Vec<i32> = v.iter().copied().collect();
        assert_eq!(
            to_vec(&v).unwrap(),
            want,
            "shape {:?} strides {:?}",
            v.shape(),
            v.strides()
        );
    }

    #[test]
    fn slices_transposes_reversals_and_broadcasts_copy_in_c_order() {
        let a = iota(&[3, 1, 4, 5, 2]);
        // Outer slices (inner dims merge into one run), inner slices, steps, reversals.
        for (axis, s) in [
            (0, Slice::new(1, None, 1)),
            (2, Slice::new(1, Some(3), 1)),
            (3, Slice::new(0, None, 2)),
            (4, Slice::new(0, Some(1), 1)),
            (2, Slice::new(0, None, -1)),
            (0, Slice::new(0, None, -2)),
        ] {
            check(a.view().slice_axis(Axis(axis), s));
        }
        let mut two = a.view();
        two.slice_axis_inplace(Axis(3), Slice::new(1, Some(4), -1));
        two.slice_axis_inplace(Axis(0), Slice::new(0, Some(2), 1));
        check(two);
        check(a.view().permuted_axes(IxDyn(&[4, 2, 0, 1, 3])));
        check(a.view().reversed_axes());
        check(iota(&[4, 1]).broadcast(IxDyn(&[3, 4, 6])).unwrap());
        check(iota(&[1, 1, 1]).view());
        check(iota(&[2, 0, 3]).view().permuted_axes(IxDyn(&[2, 1, 0])));
        assert_eq!(
            to_owned(&a.view().reversed_axes()).unwrap(),
            a.t().to_owned()
        );
    }

    #[test]
    fn dims_that_step_over_each_other_merge() {
        assert_eq!(merged_dims(&[2, 3, 4], &[12, 4, 1]), [(24, 1)]);
        assert_eq!(
            merged_dims(&[2, 1, 3, 4], &[24, 99, 4, 1]),
            [(2, 24), (12, 1)]
        );
        assert_eq!(merged_dims(&[3, 4], &[1, 3]), [(3, 1), (4, 3)]);
    }
}
