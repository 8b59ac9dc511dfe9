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

/// Sum, mean, sum of squares, L1 or L2 norm of float data over consecutive axes followed by
/// others (`[outer, reduced, inner]` with `inner > 1`): whole contiguous rows (each value, its
/// square or its magnitude) added into an f64 accumulator, instead of walking the data in a
/// permuted order. `None` when the case does not apply.
fn sum_middle<T: Num>(kind: Red, x: &ArrayViewD<'_, T>, axes: &[usize]) -> Option<Vec<T>> {
    let each: fn(f64) -> f64 = match kind {
        Red::Sum | Red::Mean => |v| v,
        Red::SumSquare | Red::L2 => |v| v * v,
        Red::L1 => f64::abs,
        _ => return None,
    };
    if !T::IS_FLOAT || axes.is_empty() {
        return None;
    }
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    let (first, last) = (sorted[0], sorted[sorted.len() - 1]);
    if last - first + 1 != sorted.len() {
        return None;
    }
    let shape = x.shape();
    let outer: usize = shape[..first].iter().product();
    let red: usize = shape[first..=last].iter().product();
    let inner: usize = shape[last + 1..].iter().product();
    if inner <= 1 || red == 0 {
        return None;
    }
    let data = x.as_slice()?;
    let mut y = Vec::with_capacity(outer * inner);
    let mut acc = vec![0f64; inner];
    for block in data.chunks_exact(red * inner) {
        acc.fill(0.0);
        for row in block.chunks_exact(inner) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += each(v.to_f64());
            }
        }
        y.extend(acc.iter().map(|&a| {
            T::from_f64(match kind {
                Red::Mean => a / red as f64,
                Red::L2 => a.sqrt(),
                _ => a,
            })
        }));
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
    if let Some(y) = sum_middle(kind, x, axes) {
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
    let y: Vec<i64> = data
        .chunks(inner)
        .map(|c| {
            // `c` is not empty: the axis is not (checked above).
            let (mut best, mut b) = (0usize, c[0]);
            for (i, &v) in c.iter().enumerate().skip(1) {
                let better = if max { v > b } else { v < b };
                if better || (last && v == b) {
                    (best, b) = (i, v);
                }
            }
            best as i64
        })
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

    /// Over axes followed by others, the row-wise accumulation gives what the permuted walk
    /// gives, for each kind it takes (a mel front end's power: ReduceSumSquare over the
    /// real/imaginary axis).
    #[test]
    fn middle_axes_match_the_permuted_walk() {
        let v: Vec<f32> = (0..120)
            .map(|i| ((i * 13) % 11) as f32 * 0.5 - 2.0)
            .collect();
        let x = ndarray::ArrayD::from_shape_vec(IxDyn(&[2, 3, 4, 5]), v).unwrap();
        for kind in [Red::Sum, Red::Mean, Red::SumSquare, Red::L1, Red::L2] {
            for axes in [vec![1], vec![1, 2], vec![0]] {
                let got = sum_middle(kind, &x.view(), &axes).expect("middle axes take the rows");
                let (data, _, inner) = gather_last(&x.view(), &axes);
                let want: Vec<f32> = data.chunks(inner).map(|c| reduce_chunk(kind, c)).collect();
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{kind:?} {axes:?}: {g} vs {w}"
                    );
                }
            }
        }
        assert!(sum_middle(Red::Max, &x.view(), &[1]).is_none());
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
