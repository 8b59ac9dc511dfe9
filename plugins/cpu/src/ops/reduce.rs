//! Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare (axes as an
//! attribute before opset 13 (ReduceSum) or 18 (the others), as an input after; keepdims;
//! noop_with_empty_axes) and ArgMax/ArgMin.

use ndarray::{ArrayViewD, IxDyn};

use crate::ops::util::num::Num;

use crate::error::OpResult;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, normalize_axes, normalize_axis, opt_input};
use crate::tensor::Tensor;
use crate::{bail, dispatch_numeric};

pub fn register(reg: &mut Registry) {
    add(reg, "ReduceSum", 1, |n| build_reduce(n, Red::Sum, 13));
    add(reg, "ReduceMean", 1, |n| build_reduce(n, Red::Mean, 18));
    add(reg, "ReduceMax", 1, |n| build_reduce(n, Red::Max, 18));
    add(reg, "ReduceMin", 1, |n| build_reduce(n, Red::Min, 18));
    add(reg, "ReduceProd", 1, |n| build_reduce(n, Red::Prod, 18));
    add(reg, "ReduceL1", 1, |n| build_reduce(n, Red::L1, 18));
    add(reg, "ReduceL2", 1, |n| build_reduce(n, Red::L2, 18));
    add(reg, "ReduceLogSum", 1, |n| build_reduce(n, Red::LogSum, 18));
    add(reg, "ReduceLogSumExp", 1, |n| {
        build_reduce(n, Red::LogSumExp, 18)
    });
    add(reg, "ReduceSumSquare", 1, |n| {
        build_reduce(n, Red::SumSquare, 18)
    });
    add(reg, "ArgMax", 1, |n| build_arg(n, true));
    add(reg, "ArgMin", 1, |n| build_arg(n, false));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

fn reduce_chunk<T: Num>(kind: Red, c: &[T]) -> T {
    let f = |x: T| x.to_f64();
    let float_sum = |g: &dyn Fn(f64) -> f64| c.iter().map(|&x| g(f(x))).sum::<f64>();
    match kind {
        Red::Max => c
            .iter()
            .copied()
            .fold(T::lowest(), |a, b| if b > a || b.is_nan() { b } else { a }),
        Red::Min => c
            .iter()
            .copied()
            .fold(T::highest(), |a, b| if b < a || b.is_nan() { b } else { a }),
        Red::Sum if !T::IS_FLOAT => c.iter().fold(T::zero(), |a, &b| a.add(b)),
        Red::Prod if !T::IS_FLOAT => c.iter().fold(T::one(), |a, &b| a.mul(b)),
        Red::L1 if !T::IS_FLOAT => c.iter().fold(T::zero(), |a, &b| a.add(b.abs())),
        Red::SumSquare if !T::IS_FLOAT => c.iter().fold(T::zero(), |a, &b| a.add(b.mul(b))),
        Red::Sum => T::from_f64(float_sum(&|x| x)),
        Red::Prod => T::from_f64(c.iter().map(|&x| f(x)).product()),
        Red::L1 => T::from_f64(float_sum(&f64::abs)),
        Red::SumSquare => T::from_f64(float_sum(&|x| x * x)),
        Red::Mean => T::from_f64(float_sum(&|x| x) / c.len() as f64),
        Red::L2 => T::from_f64(float_sum(&|x| x * x).sqrt()),
        Red::LogSum => T::from_f64(float_sum(&|x| x).ln()),
        Red::LogSumExp => {
            let m = c.iter().map(|&x| f(x)).fold(f64::NEG_INFINITY, f64::max);
            if m.is_infinite() {
                T::from_f64(m)
            } else {
                T::from_f64(m + float_sum(&|x| (x - m).exp()).ln())
            }
        }
    }
}

/// Moves `axes` last, returning the contiguous data, the kept size and the reduced size.
fn gather_last<T: Num>(x: &ArrayViewD<'_, T>, axes: &[usize]) -> (Vec<T>, usize, usize) {
    let r = x.ndim();
    let mut perm: Vec<usize> = (0..r).filter(|d| !axes.contains(d)).collect();
    perm.extend_from_slice(axes);
    let inner: usize = axes.iter().map(|&d| x.shape()[d]).product();
    let outer: usize = perm[..r - axes.len()]
        .iter()
        .map(|&d| x.shape()[d])
        .product();
    let p = x.view().permuted_axes(IxDyn(&perm));
    (p.iter().copied().collect(), outer, inner)
}

/// The input seen as `[outer, reduced, inner]`: where the reduced axes, once the axes of size 1
/// are left out, are one run of consecutive axes. `None` for any other layout.
fn blocks(shape: &[usize], axes: &[usize]) -> Option<(usize, usize, usize)> {
    let (mut outer, mut red, mut inner) = (1usize, 1usize, 1usize);
    // 0: before the reduced run, 1: in it, 2: after it.
    let mut at = 0;
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let reduced = axes.contains(&d);
        at = match (at, reduced) {
            (0, false) => 0,
            (0 | 1, true) => 1,
            (1 | 2, false) => 2,
            _ => return None,
        };
        match at {
            0 => outer *= n,
            1 => red *= n,
            _ => inner *= n,
        }
    }
    Some((outer, red, inner))
}

/// How many independent accumulators a row reduction keeps: enough for the compiler to fill
/// vector registers, and a fixed order of additions whatever the machine.
const LANES: usize = 16;

/// The larger (Max) or smaller of `a` and `b`, NaN winning, as [`reduce_chunk`] folds.
#[inline(always)]
fn pick<T: Num>(max: bool, a: T, b: T) -> T {
    let better = if max { b > a } else { b < a };
    if better || b.is_nan() { b } else { a }
}

/// Max or Min of a contiguous row that is not empty, in [`LANES`] independent lanes.
fn extreme_row<T: Num>(max: bool, row: &[T]) -> T {
    let mut lanes = [row[0]; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = pick(max, *l, v);
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(tail)
        .fold(row[0], |a, b| pick(max, a, b))
}

/// The sum of `each(v)` over a contiguous float row, in float64 and [`LANES`] lanes.
#[inline(always)]
fn sum_row<T: Num>(each: impl Fn(f64) -> f64, row: &[T]) -> f64 {
    let mut lanes = [0f64; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += each(v.to_f64());
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| each(v.to_f64())).sum();
    lanes.iter().sum::<f64>() + tail
}

/// A float sum of `red` terms, finished for `kind` (mean, norm).
fn finish_sum<T: Num>(kind: Red, sum: f64, red: usize) -> T {
    T::from_f64(match kind {
        Red::Mean => sum / red as f64,
        Red::L2 => sum.sqrt(),
        _ => sum,
    })
}

/// Float sums of `each(v)` over data seen as `[outer, red, inner]`, finished for `kind`.
fn sum_blocks<T: Num>(
    kind: Red,
    each: impl Fn(f64) -> f64 + Copy,
    data: &[T],
    (red, inner): (usize, usize),
    y: &mut Vec<T>,
) {
    if inner == 1 {
        y.extend(
            data.chunks_exact(red)
                .map(|row| finish_sum::<T>(kind, sum_row(each, row), red)),
        );
        return;
    }
    let mut acc = vec![0f64; inner];
    for block in data.chunks_exact(red * inner) {
        acc.fill(0.0);
        for row in block.chunks_exact(inner) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += each(v.to_f64());
            }
        }
        y.extend(acc.iter().map(|&a| finish_sum::<T>(kind, a, red)));
    }
}

/// Max (`max`) or Min over data seen as `[outer, red, inner]`.
fn extreme_blocks<T: Num>(max: bool, data: &[T], (red, inner): (usize, usize), y: &mut Vec<T>) {
    if inner == 1 {
        y.extend(data.chunks_exact(red).map(|row| extreme_row(max, row)));
        return;
    }
    for block in data.chunks_exact(red * inner) {
        let (first, rest) = block.split_at(inner);
        let start = y.len();
        y.extend_from_slice(first);
        let acc = &mut y[start..];
        for row in rest.chunks_exact(inner) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = pick(max, *a, v);
            }
        }
    }
}

/// The reduction of contiguous data seen as `[outer, reduced, inner]` ([`blocks`]), without moving
/// the data: over the last axes (`inner == 1`) each row is reduced where it lies, Max and Min
/// and float sums in independent lanes; over axes followed by others, whole rows are combined
/// into `inner` accumulators (Max and Min in the element type, float sums in float64). `None`
/// when the layout or the kind does not apply (the caller gathers the reduced axes last).
fn reduce_blocks<T: Num>(kind: Red, x: &ArrayViewD<'_, T>, axes: &[usize]) -> Option<Vec<T>> {
    let (outer, red, inner) = blocks(x.shape(), axes)?;
    let data = x.as_slice()?;
    if red == 0 || data.is_empty() {
        return None;
    }
    let mut y = Vec::with_capacity(outer * inner);
    let geometry = (red, inner);
    match kind {
        Red::Max | Red::Min => extreme_blocks(kind == Red::Max, data, geometry, &mut y),
        _ if !T::IS_FLOAT => return None,
        Red::Sum | Red::Mean => sum_blocks(kind, |v| v, data, geometry, &mut y),
        Red::SumSquare | Red::L2 => sum_blocks(kind, |v| v * v, data, geometry, &mut y),
        Red::L1 => sum_blocks(kind, f64::abs, data, geometry, &mut y),
        _ => return None,
    }
    Some(y)
}

fn out_shape(shape: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(d, &s)| {
            if axes.contains(&d) {
                keepdims.then_some(1)
            } else {
                Some(s)
            }
        })
        .collect()
}

fn reduce_typed<T: Num>(
    kind: Red,
    x: &ArrayViewD<'_, T>,
    axes: &[usize],
    keepdims: bool,
) -> OpResult<Tensor> {
    if let Some(y) = reduce_blocks(kind, x, axes) {
        return Tensor::from_vec(&out_shape(x.shape(), axes, keepdims), y);
    }
    let (data, outer, inner) = gather_last(x, axes);
    let y: Vec<T> = if inner == 0 {
        vec![reduce_chunk::<T>(kind, &[]); outer]
    } else {
        data.chunks(inner).map(|c| reduce_chunk(kind, c)).collect()
    };
    Tensor::from_vec(&out_shape(x.shape(), axes, keepdims), y)
}

fn build_reduce(n: &NodeDef, kind: Red, axes_input_from: i64) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let keepdims = n.attr_int_or("keepdims", 1)? != 0;
    let noop = n.attr_int_or("noop_with_empty_axes", 0)? != 0;
    let attr_axes = if n.opset < axes_input_from {
        n.attr_ints("axes")?
    } else {
        None
    };
    let from_input = n.opset >= axes_input_from;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let axes = match (&attr_axes, from_input) {
            (Some(a), _) => a.clone(),
            (None, true) => match opt_input(inputs, 1) {
                Some(t) => t.to_i64_vec(&format!("{op}: axes"))?,
                None => vec![],
            },
            (None, false) => vec![],
        };
        if axes.is_empty() && noop {
            return Ok(vec![x.try_to_owned()?]);
        }
        let ax = if axes.is_empty() {
            (0..x.ndim()).collect()
        } else {
            normalize_axes(&op, &axes, x.ndim())?
        };
        if let (Some(b), Red::Max | Red::Min) = (x.get::<bool>(), kind) {
            // Max is "any", Min is "all": reduce as u8.
            let u = b.mapv(u8::from);
            let r = reduce_typed(kind, &u.view(), &ax, keepdims)?;
            return one(r.view().cast(epx_plugin_api::ElementType::Bool));
        }
        one(dispatch_numeric!(
            x.clone(),
            |a| reduce_typed(kind, &a, &ax, keepdims),
            &op
        ))
    }))
}

/// The index of the largest (`max`) or smallest value of a row that is not empty: the first
/// such (the last with `last`), values compared with `>` / `<` so that NaN never wins, except
/// that a row starting with NaN gives 0. Found in two passes that vectorize: the extreme value
/// over lanes, then where it is.
fn arg_row<T: Num>(c: &[T], max: bool, last: bool) -> usize {
    if c[0].is_nan() {
        return 0;
    }
    // The extreme of the values that are not NaN (lanes start at `c[0]`, not NaN).
    let better = |a: T, b: T| {
        let wins = if max { b > a } else { b < a };
        if wins { b } else { a }
    };
    let mut lanes = [c[0]; LANES];
    let mut chunks = c.chunks_exact(LANES);
    for ch in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(ch) {
            *l = better(*l, v);
        }
    }
    let tail = chunks.remainder().iter().copied();
    let best = lanes.into_iter().chain(tail).fold(c[0], better);
    let at = if last {
        c.iter().rposition(|&v| v == best)
    } else {
        c.iter().position(|&v| v == best)
    };
    at.unwrap_or(0)
}

fn arg_typed<T: Num>(
    op: &str,
    x: &ArrayViewD<'_, T>,
    axis: usize,
    keepdims: bool,
    max: bool,
    last: bool,
) -> OpResult<Tensor> {
    if x.shape()[axis] == 0 {
        bail!("{op}: cannot reduce over the empty axis {axis}");
    }
    // Over the last axis of contiguous data the rows are where they lie; else gathered.
    let gathered;
    let (data, inner): (&[T], usize) = match x.as_slice() {
        Some(d) if axis + 1 == x.ndim() => (d, x.shape()[axis]),
        _ => {
            let (d, _, inner) = gather_last(x, &[axis]);
            gathered = d;
            (&gathered, inner)
        }
    };
    // `c` is not empty: the axis is not (checked above).
    let y: Vec<i64> = data
        .chunks(inner)
        .map(|c| arg_row(c, max, last) as i64)
        .collect();
    Tensor::from_vec(&out_shape(x.shape(), &[axis], keepdims), y)
}

fn build_arg(n: &NodeDef, max: bool) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 0)?;
    let keepdims = n.attr_int_or("keepdims", 1)? != 0;
    let last = n.attr_int_or("select_last_index", 0)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let ax = normalize_axis(&op, axis, x.ndim())?;
        one(dispatch_numeric!(
            x.clone(),
            |a| arg_typed(&op, &a, ax, keepdims, max, last),
            &op
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::tensor::TensorRef;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    /// Wherever the reduced axes are one run once axes of size 1 are left out (last axes, middle
    /// axes, all axes, with size-1 axes anywhere), reducing the rows where they lie gives what
    /// the permuted walk gives, for each kind it takes; NaN wins Max and Min in every lane.
    #[test]
    fn rows_reduced_in_place_match_the_permuted_walk() {
        let shape = [2, 1, 3, 37, 1, 5];
        let n: usize = shape.iter().product();
        let mut v: Vec<f32> = (0..n).map(|i| ((i * 13) % 11) as f32 * 0.5 - 2.0).collect();
        v[777] = f32::NAN;
        let x = ndarray::ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap();
        let kinds = [
            Red::Sum,
            Red::Mean,
            Red::SumSquare,
            Red::L1,
            Red::L2,
            Red::Max,
            Red::Min,
        ];
        let axes_cases: [&[usize]; 7] = [
            &[3],
            &[3, 5],
            &[2, 3],
            &[0],
            &[1, 2, 4],
            &[0, 1, 2, 3, 4, 5],
            &[4],
        ];
        for kind in kinds {
            for axes in axes_cases {
                let got = reduce_blocks(kind, &x.view(), axes).expect("one run of axes");
                let (data, _, inner) = gather_last(&x.view(), axes);
                let want: Vec<f32> = data.chunks(inner).map(|c| reduce_chunk(kind, c)).collect();
                assert_eq!(got.len(), want.len(), "{kind:?} {axes:?}");
                for (g, w) in got.iter().zip(&want) {
                    let same =
                        (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-5 * (1.0 + w.abs());
                    assert!(same, "{kind:?} {axes:?}: {g} vs {w}");
                }
            }
        }
        // Reduced axes apart, and kinds these loops do not take, go the permuted way.
        assert!(reduce_blocks(Red::Max, &x.view(), &[0, 3]).is_none());
        assert!(reduce_blocks(Red::Prod, &x.view(), &[3]).is_none());
        assert_eq!(blocks(&[4, 1, 6, 7], &[1, 2]), Some((4, 6, 7)));
        assert_eq!(blocks(&[4, 6, 1, 7], &[0, 2]), Some((1, 4, 42)));
        assert_eq!(blocks(&[4, 6, 7], &[0, 2]), None);
        // Integers: Max and Min in their own type, sums left to the exact fold.
        let i = ndarray::ArrayD::from_shape_vec(
            IxDyn(&[3, 4]),
            vec![5i64, -2, 9, 0, 1, 1, 1, 1, -7, 3, 2, 8],
        )
        .unwrap();
        assert_eq!(
            reduce_blocks(Red::Max, &i.view(), &[1]),
            Some(vec![9, 1, 8])
        );
        assert_eq!(
            reduce_blocks(Red::Min, &i.view(), &[0]),
            Some(vec![-7, -2, 1, 0])
        );
        assert!(reduce_blocks(Red::Sum, &i.view(), &[1]).is_none());
    }

    /// The two-pass index search gives what the one-pass comparison walk gives: first or last
    /// of equal extremes, NaN never winning unless it comes first.
    #[test]
    fn arg_rows_match_the_comparison_walk() {
        let walk = |c: &[f32], max: bool, last: bool| {
            let (mut best, mut b) = (0usize, c[0]);
            for (i, &v) in c.iter().enumerate().skip(1) {
                let better = if max { v > b } else { v < b };
                if better || (last && v == b) {
                    (best, b) = (i, v);
                }
            }
            best
        };
        let mut rows: Vec<Vec<f32>> = vec![
            (0..53).map(|i| ((i * 7) % 13) as f32).collect(),
            (0..40).map(|i| -(((i * 5) % 9) as f32)).collect(),
            vec![2.0],
            vec![f32::NAN, 5.0, 9.0],
        ];
        let mut with_nan: Vec<f32> = (0..37).map(|i| ((i * 3) % 11) as f32).collect();
        with_nan[20] = f32::NAN;
        rows.push(with_nan);
        rows.push(vec![-0.0, 0.0, -0.0]);
        for row in &rows {
            for (max, last) in [(true, false), (true, true), (false, false), (false, true)] {
                assert_eq!(
                    arg_row(row, max, last),
                    walk(row, max, last),
                    "{row:?} {max} {last}"
                );
            }
        }
    }

    #[test]
    fn reduce_versions_and_kinds() {
        let x = Tensor::F32(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
        let axes = Tensor::I64(array![1].into_dyn());
        let s = run(NodeDef::new("ReduceSum", 13), vec![x.clone(), axes.clone()]).unwrap();
        assert_eq!(s[0], Tensor::F32(array![[3.0], [7.0]].into_dyn()));
        let m = NodeDef::new("ReduceMean", 13)
            .with_attr("axes", AttrValue::Ints(vec![0]))
            .with_attr("keepdims", AttrValue::Int(0));
        assert_eq!(
            run(m, vec![x.clone()]).unwrap()[0],
            Tensor::F32(array![2.0, 3.0].into_dyn())
        );
        let all = run(NodeDef::new("ReduceMax", 18), vec![x.clone()]).unwrap();
        assert_eq!(all[0], Tensor::F32(array![[4.0]].into_dyn()));
        let l2 = run(NodeDef::new("ReduceL2", 18), vec![x.clone(), axes.clone()]).unwrap();
        assert!((l2[0].as_array::<f32>().unwrap()[[0, 0]] - 5f32.sqrt()).abs() < 1e-6);
        let p = run(
            NodeDef::new("ReduceProd", 18),
            vec![Tensor::I32(array![[2, 3], [4, 5]].into_dyn())],
        )
        .unwrap();
        assert_eq!(p[0], Tensor::I32(array![[120]].into_dyn()));
        let noop =
            NodeDef::new("ReduceSum", 13).with_attr("noop_with_empty_axes", AttrValue::Int(1));
        assert_eq!(run(noop, vec![x.clone()]).unwrap()[0], x);
        let empty = Tensor::F32(ndarray::ArrayD::zeros(IxDyn(&[2, 0])));
        let e = run(NodeDef::new("ReduceSum", 13), vec![empty, axes]).unwrap();
        assert_eq!(e[0], Tensor::F32(array![[0.0], [0.0]].into_dyn()));
        let b = Tensor::Bool(array![[true, false], [false, false]].into_dyn());
        let any = run(
            NodeDef::new("ReduceMax", 20),
            vec![b.clone(), Tensor::I64(array![1].into_dyn())],
        )
        .unwrap();
        assert_eq!(any[0], Tensor::Bool(array![[true], [false]].into_dyn()));
        let all = run(NodeDef::new("ReduceMin", 20), vec![b]).unwrap();
        assert_eq!(all[0], Tensor::Bool(array![[false]].into_dyn()));
        let bad = run(
            NodeDef::new("ReduceSum", 13),
            vec![x, Tensor::I64(array![2].into_dyn())],
        )
        .unwrap_err();
        assert_eq!(bad.0, "ReduceSum: axis 2 is out of range for rank 2");
    }

    #[test]
    fn argmax_argmin() {
        let x = Tensor::F32(array![[1.0, 5.0, 5.0], [7.0, 0.0, 7.0]].into_dyn());
        let a = run(
            NodeDef::new("ArgMax", 13).with_attr("axis", AttrValue::Int(1)),
            vec![x.clone()],
        )
        .unwrap();
        assert_eq!(a[0], Tensor::I64(array![[1], [0]].into_dyn()));
        let n = NodeDef::new("ArgMax", 13)
            .with_attr("axis", AttrValue::Int(-1))
            .with_attr("keepdims", AttrValue::Int(0))
            .with_attr("select_last_index", AttrValue::Int(1));
        assert_eq!(
            run(n, vec![x.clone()]).unwrap()[0],
            Tensor::I64(array![2, 2].into_dyn())
        );
        let m = run(NodeDef::new("ArgMin", 13), vec![x.clone()]).unwrap();
        assert_eq!(m[0], Tensor::I64(array![[0, 1, 0]].into_dyn()));
        let e = run(
            NodeDef::new("ArgMin", 13).with_attr("axis", AttrValue::Int(5)),
            vec![x],
        )
        .unwrap_err();
        assert_eq!(e.0, "ArgMin: axis 5 is out of range for rank 2");
    }
}
