//! Einsum: explicit and implicit outputs, ellipses, repeated indices (traces and diagonals).
//!
//! Values are computed in f64 and cast back to the input's float type.

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
}
