//! Einsum: explicit and implicit outputs, ellipses, repeated indices (traces and diagonals).
//!
//! On the fast levels, a float32 Einsum of two operands that is a contraction (no label twice in
//! one operand, equal extents) is a batched matrix product: each operand's labels sorted into
//! batch, kept and contracted groups by a permutation, a label found in one operand alone and not
//! kept summed first, the product taken by the f32 GEMM, and the result permuted to the output's
//! order ([`contraction`]). Anything else, and every equation on the reference level, is the
//! general loop: values computed in f64 and cast back to the input's float type.

use crate::ops::util::indexing::{c_strides, for_each_index};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::num::tensor_from_f64;
use crate::tensor::TensorRef;

pub fn register(reg: &mut Registry) {
    add(reg, "Einsum", 12, build_einsum);
}

/// One Einsum operand term: labels, with the ellipsis expanded to labels `256 + k` where `k`
/// counts broadcast dims from the right.
fn einsum_term(op: &str, term: &str, rank: Option<usize>, ell: usize) -> OpResult<Vec<u32>> {
    let (pre, post, has_ell) = match term.find("...") {
        Some(i) => (&term[..i], &term[i + 3..], true),
        None => (term, "", false),
    };
    let letter = |c: char| -> OpResult<u32> {
        if c.is_ascii_alphabetic() {
            Ok(c as u32)
        } else {
            Err(OpError(format!(
                "{op}: invalid character '{c}' in term '{term}'"
            )))
        }
    };
    let mut out: Vec<u32> = pre.chars().map(letter).collect::<OpResult<_>>()?;
    let tail: Vec<u32> = post.chars().map(letter).collect::<OpResult<_>>()?;
    if has_ell {
        let n = match rank {
            Some(r) => r.checked_sub(out.len() + tail.len()).ok_or_else(|| {
                OpError(format!(
                    "{op}: term '{term}' has more labels than the input's rank {r}"
                ))
            })?,
            None => ell,
        };
        out.extend((0..n).map(|k| 256 + (n - 1 - k) as u32));
    }
    out.extend(tail);
    if let Some(r) = rank
        && out.len() != r
    {
        bail!(
            "{op}: term '{term}' has {} labels, the input has rank {r}",
            out.len()
        );
    }
    Ok(out)
}

fn build_einsum(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let eq: String = n
        .attr_string("equation")?
        .ok_or_else(|| n.error("missing required attribute 'equation'"))?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    Ok(kernel(move |inputs| {
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        let present: Vec<&TensorRef<'_>> = inputs.iter().flatten().collect();
        if terms.len() != present.len() {
            bail!(
                "{op}: equation '{eq}' has {} operands, got {} inputs",
                terms.len(),
                present.len()
            );
        }
        let ty = present
            .first()
            .map(|t| t.elem_type())
            .unwrap_or(epx_plugin_api::ElementType::Float);
        let mut labels = Vec::new();
        let mut sizes: std::collections::BTreeMap<u32, usize> = Default::default();
        let mut ell = 0usize;
        for (term, t) in terms.iter().zip(&present) {
            if t.elem_type() != ty {
                bail!(
                    "{op}: inputs must have the same element type, got {ty} and {}",
                    t.elem_type()
                );
            }
            let l = einsum_term(&op, term, Some(t.ndim()), 0)?;
            for (&lab, &d) in l.iter().zip(t.shape()) {
                let e = sizes.entry(lab).or_insert(d);
                if *e == 1 {
                    *e = d;
                } else if d != 1 && d != *e {
                    bail!("{op}: label dims disagree ({} vs {d}) in '{eq}'", *e);
                }
                if lab >= 256 {
                    ell = ell.max(lab as usize - 255);
                }
            }
            labels.push(l);
        }
        let out_labels: Vec<u32> = match rhs {
            Some(r) => einsum_term(&op, r, None, ell)?,
            None => {
                let mut counts: std::collections::BTreeMap<u32, usize> = Default::default();
                for l in &labels {
                    for &x in l {
                        *counts.entry(x).or_default() += 1;
                    }
                }
                let mut o: Vec<u32> = (0..ell).map(|k| 256 + (ell - 1 - k) as u32).collect();
                o.extend(
                    counts
                        .iter()
                        .filter(|(k, c)| **k < 256 && **c == 1)
                        .map(|(k, _)| *k),
                );
                o
            }
        };
        for l in &out_labels {
            if !sizes.contains_key(l) {
                bail!(
                    "{op}: output label {} does not appear in the inputs of '{eq}'",
                    char::from_u32(*l).unwrap_or('?')
                );
            }
        }
        if crate::fast::enabled()
            && let [a, b] = present[..]
            && let (Ok(av), Ok(bv)) = (a.as_f32(), b.as_f32())
            && let Some(t) = contraction((&av, &labels[0]), (&bv, &labels[1]), &out_labels)
        {
            return one(Ok(t));
        }
        let summed: Vec<u32> = sizes
            .keys()
            .copied()
            .filter(|k| !out_labels.contains(k))
            .collect();
        let all: Vec<u32> = out_labels.iter().chain(&summed).copied().collect();
        let dims: Vec<usize> = all
            .iter()
            .map(|l| sizes.get(l).copied().unwrap_or(1))
            .collect();
        let out_shape: Vec<usize> = dims[..out_labels.len()].to_vec();
        let out_n = crate::limits::checked_numel(&out_shape)?;
        crate::limits::checked_numel(&dims)?;
        let vals: Vec<Vec<f64>> = present.iter().map(|t| t.to_f64_vec()).collect();
        // For each operand: the stride of each label in `all` (0 for absent or broadcast dims).
        let strides: Vec<Vec<usize>> = labels
            .iter()
            .zip(&present)
            .map(|(l, t)| {
                let cs = c_strides(t.shape());
                all.iter()
                    .map(|lab| {
                        l.iter()
                            .enumerate()
                            .filter(|(i, x)| *x == lab && t.shape()[*i] != 1)
                            .map(|(i, _)| cs[i])
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let mut out = vec![0.0f64; out_n];
        let inner: usize = dims[out_labels.len()..].iter().product();
        let mut k = 0usize;
        for_each_index(&dims, |ii| {
            let mut prod = 1.0;
            for (v, st) in vals.iter().zip(&strides) {
                let off: usize = ii.iter().zip(st).map(|(a, b)| a * b).sum();
                prod *= v.get(off).copied().unwrap_or(0.0);
            }
            if let Some(o) = out.get_mut(k / inner.max(1)) {
                *o += prod;
            }
            k += 1;
        });
        one(tensor_from_f64(ty, &out_shape, out))
    }))
}

/// `a` and `b` (each with its labels, one per axis) contracted into `out` as a batched matrix
/// product, or `None` when the equation is not a plain contraction (a label twice in one
/// operand, extents that differ or broadcast, an output label in neither operand).
///
/// Labels in both operands and the output are batch dimensions; in both and not the output,
/// contracted; in one operand and the output, that operand's rows or columns; in one operand
/// alone, summed out of it first. `a` is permuted to `[batch, rows, contracted]`, `b` to
/// `[batch, contracted, columns]`, each batch multiplied by the f32 GEMM, and the
/// `[batch, rows, columns]` result permuted to `out`'s order.
fn contraction(
    (a, la): (&ndarray::ArrayViewD<'_, f32>, &[u32]),
    (b, lb): (&ndarray::ArrayViewD<'_, f32>, &[u32]),
    out: &[u32],
) -> Option<crate::tensor::Tensor> {
    use ndarray::{Axis, IxDyn};
    let unique = |l: &[u32]| l.iter().enumerate().all(|(i, x)| !l[..i].contains(x));
    if !unique(la) || !unique(lb) || !unique(out) {
        return None;
    }
    let extent = |lab: u32| {
        let ea = la.iter().position(|&x| x == lab).map(|i| a.shape()[i]);
        let eb = lb.iter().position(|&x| x == lab).map(|i| b.shape()[i]);
        match (ea, eb) {
            (Some(x), Some(y)) if x != y => None,
            (Some(x), _) | (None, Some(x)) => Some(x),
            (None, None) => None,
        }
    };
    // Labels in one operand alone, not kept: summed out of that operand first.
    let reduce = |v: &ndarray::ArrayViewD<'_, f32>, l: &[u32], other: &[u32]| {
        let mut v = v.to_owned();
        let mut kept = l.to_vec();
        for i in (0..l.len()).rev() {
            if !other.contains(&l[i]) && !out.contains(&l[i]) {
                v = v.sum_axis(Axis(i));
                kept.remove(i);
            }
        }
        (v, kept)
    };
    let (a, la) = reduce(a, la, lb);
    let (b, lb) = reduce(b, lb, &la);
    let in_a = |x: &u32| la.contains(x);
    let in_b = |x: &u32| lb.contains(x);
    let batch: Vec<u32> = out.iter().copied().filter(|x| in_a(x) && in_b(x)).collect();
    let rows: Vec<u32> = out
        .iter()
        .copied()
        .filter(|x| in_a(x) && !in_b(x))
        .collect();
    let cols: Vec<u32> = out
        .iter()
        .copied()
        .filter(|x| !in_a(x) && in_b(x))
        .collect();
    let inner: Vec<u32> = la
        .iter()
        .copied()
        .filter(|x| in_b(x) && !out.contains(x))
        .collect();
    if batch.len() + rows.len() + cols.len() != out.len() {
        return None;
    }
    let size = |g: &[u32]| -> Option<usize> {
        g.iter().try_fold(1usize, |p, &x| p.checked_mul(extent(x)?))
    };
    let (nb, m, k, n) = (size(&batch)?, size(&rows)?, size(&inner)?, size(&cols)?);
    let axes = |l: &[u32], groups: [&[u32]; 3]| -> Vec<usize> {
        groups
            .iter()
            .flat_map(|g| g.iter())
            .filter_map(|x| l.iter().position(|y| y == x))
            .collect()
    };
    let pa = axes(&la, [&batch, &rows, &inner]);
    let pb = axes(&lb, [&batch, &inner, &cols]);
    if pa.len() != la.len() || pb.len() != lb.len() {
        return None;
    }
    let a3 = a
        .view()
        .permuted_axes(IxDyn(&pa))
        .as_standard_layout()
        .into_owned();
    let b3 = b
        .view()
        .permuted_axes(IxDyn(&pb))
        .as_standard_layout()
        .into_owned();
    let a3 = a3.into_shape_with_order((nb, m, k)).ok()?;
    let b3 = b3.into_shape_with_order((nb, k, n)).ok()?;
    let mut c = ndarray::Array3::<f32>::zeros((nb, m, n));
    for i in 0..nb {
        let mut ci = c.index_axis_mut(Axis(0), i);
        <f32 as crate::ops::matmul::MatElem>::gemm(
            1.0,
            &a3.index_axis(Axis(0), i),
            &b3.index_axis(Axis(0), i),
            0.0,
            &mut ci,
        );
    }
    // [batch, rows, cols] in the output's label order.
    let grouped: Vec<u32> = batch.iter().chain(&rows).chain(&cols).copied().collect();
    let dims: Vec<usize> = grouped.iter().map(|&x| extent(x)).collect::<Option<_>>()?;
    let c = c.into_shape_with_order(IxDyn(&dims)).ok()?;
    let perm: Vec<usize> = out
        .iter()
        .filter_map(|x| grouped.iter().position(|y| y == x))
        .collect();
    let c = c
        .permuted_axes(IxDyn(&perm))
        .as_standard_layout()
        .into_owned();
    Some(crate::tensor::Tensor::from(c))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run, t, vals};
    use super::*;
    use crate::kernel::AttrValue;

    #[test]
    fn einsum_forms() {
        let a = t(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let e = |eq: &str| {
            NodeDef::new("Einsum", 12)
                .with_attr("equation", AttrValue::String(eq.as_bytes().to_vec()))
        };
        let o = run(e("ij,jk->ik"), vec![a.clone(), a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![7.0, 10.0, 15.0, 22.0]);
        let o = run(e("ij->ji"), vec![a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.0, 3.0, 2.0, 4.0]);
        let o = run(e("ii"), vec![a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![5.0]);
        let o = run(e("...ii ->...i"), vec![a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.0, 4.0]);
        let err = run(e("ijk->i"), vec![a.clone()]).unwrap_err();
        assert!(
            err.0.contains("has 3 labels, the input has rank 2"),
            "{err}"
        );
        let err = run(e("ij,jk->ik"), vec![a.clone(), t(&[3, 1], vec![0.0; 3])]).unwrap_err();
        assert!(err.0.contains("label dims disagree"), "{err}");
    }

    /// Contractions take the batched product on the fast levels and give the general loop's
    /// values (within float32 rounding): attention written as Einsum, batched products, a dot
    /// product, an outer product, a matrix by a vector, a label summed out of one operand, an
    /// ellipsis; an equation with a diagonal stays on the loop.
    #[test]
    fn contractions_match_the_general_loop() {
        let e = |eq: &str| {
            NodeDef::new("Einsum", 12)
                .with_attr("equation", AttrValue::String(eq.as_bytes().to_vec()))
        };
        let filled = |shape: &[usize], seed: usize| {
            let n: usize = shape.iter().product();
            t(
                shape,
                (0..n)
                    .map(|i| ((i * 37 + seed * 11) % 23) as f32 * 0.125 - 1.3)
                    .collect(),
            )
        };
        let cases: [(&str, &[usize], &[usize]); 10] = [
            ("abcd,cde->abe", &[2, 3, 4, 5], &[4, 5, 6]),
            ("bhqd,bhkd->bhqk", &[2, 3, 4, 5], &[2, 3, 6, 5]),
            ("bij,bjk->bik", &[3, 4, 5], &[3, 5, 2]),
            ("i,i->", &[7], &[7]),
            ("i,j->ij", &[3], &[4]),
            ("ij,j->i", &[5, 6], &[6]),
            ("ij,jk->k", &[3, 4], &[4, 5]),
            ("ij,kj->ki", &[3, 4], &[5, 4]),
            ("...ij,...jk->...ik", &[2, 3, 4], &[2, 4, 3]),
            ("ii,ij->j", &[3, 3], &[3, 4]),
        ];
        let reference = crate::fast::ISAS
            .iter()
            .find(|i| !i.fast)
            .expect("a reference level");
        for (eq, sa, sb) in cases {
            let inputs = vec![filled(sa, 1), filled(sb, 2)];
            // The product path takes every case but the diagonal.
            let (lhs, rhs) = eq.split_once("->").expect("explicit");
            let (ta, tb) = lhs.split_once(',').expect("two operands");
            let ell = sa.len().saturating_sub(2);
            let la = einsum_term("Einsum", ta, Some(sa.len()), 0).unwrap();
            let lb = einsum_term("Einsum", tb, Some(sb.len()), 0).unwrap();
            let lo = einsum_term(
                "Einsum",
                rhs,
                None,
                if eq.contains("...") { ell } else { 0 },
            )
            .unwrap();
            let (va, vb) = (inputs[0].view(), inputs[1].view());
            let taken = contraction(
                (&va.as_f32().unwrap(), &la),
                (&vb.as_f32().unwrap(), &lb),
                &lo,
            );
            assert_eq!(taken.is_some(), !eq.starts_with("ii"), "{eq}");
            let want = crate::fast::with_isa(reference, || run(e(eq), inputs.clone()))
                .expect("reference")
                .unwrap();
            for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
                let Some(got) = crate::fast::with_isa(isa, || run(e(eq), inputs.clone())) else {
                    continue;
                };
                let got = got.unwrap();
                assert_eq!(got[0].shape(), want[0].shape(), "{eq}");
                for (g, w) in vals(&got[0]).iter().zip(vals(&want[0])) {
                    assert!(
                        (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{eq} on {}: {g} vs {w}",
                        isa.name
                    );
                }
            }
        }
    }
}
