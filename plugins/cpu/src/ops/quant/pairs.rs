//! The integer products' general path at a level whose ONNX Runtime kernels sum unsigned
//! activations by signed weights in pairs saturated to i16 ([`Sums::PairsSaturated`]), for the
//! shapes the packed fast paths do not take (a broadcast batch of `B`, a 1-D operand, 3-D
//! convolutions, depths past the packed GEMM's): the exact product, then minus what saturating
//! each pair takes away. A pair is two consecutive products in ONNX Runtime's depth order: `k`
//! and `k + 1` (`k` even) of a matrix product; of a convolution's channels-last column, the
//! order (kernel tap, input channel), its padding holding the input zero point.

use crate::fast::qgemm::Sums;
use crate::ops::util::spatial::SpatialAttrs;
use crate::tensor::TensorRef;
use ndarray::ArrayViewD;

/// What a product is, for its pairs.
pub(crate) enum Product<'a> {
    /// MatMulInteger, QLinearMatMul: `A [..., M, K] · B [..., K, N]`, batches broadcast.
    MatMul,
    /// QLinearConv: `x [N, C, ...] * w [M, C / group, ...]`.
    Conv {
        attrs: &'a SpatialAttrs,
        group: usize,
    },
}

/// The raw operands when their pairs saturate at this thread's level: uint8 activations by
/// int8 weights under [`Sums::PairsSaturated`].
pub(crate) fn saturating<'p, 'q, 'x, 'y>(
    a: &'p TensorRef<'x>,
    b: &'q TensorRef<'y>,
) -> Option<(&'p ArrayViewD<'x, u8>, &'q ArrayViewD<'y, i8>)> {
    match (a, b) {
        (TensorRef::U8(a), TensorRef::I8(b))
            if Sums::like_onnxruntime() == Sums::PairsSaturated =>
        {
            Some((a, b))
        }
        _ => None,
    }
}

/// `p - clamp(p, i16)`: what saturating one pair sum takes away.
#[inline]
fn lost(p: i32) -> i64 {
    i64::from(p) - i64::from(p.clamp(i32::from(i16::MIN), i32::from(i16::MAX)))
}

/// Per output element of `product` (in the order of its row-major output of shape `out`),
/// what saturating the pairs of raw products takes from the exact sum; `None` when the shapes
/// are not the product's (the exact path has reported them).
pub(crate) fn losses(
    product: &Product<'_>,
    (a, za): (&ArrayViewD<'_, u8>, u8),
    b: &ArrayViewD<'_, i8>,
    out: &[usize],
) -> Option<Vec<i64>> {
    match product {
        Product::MatMul => matmul_losses(a, b, out),
        Product::Conv { attrs, group } => conv_losses(a, za, b, attrs, *group, out),
    }
}

/// The row-major strides of `shape`.
fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn matmul_losses(
    a: &ArrayViewD<'_, u8>,
    b: &ArrayViewD<'_, i8>,
    out: &[usize],
) -> Option<Vec<i64>> {
    // 1-D operands as numpy promotes them: A [K] is [1, K], B [K] is [K, 1].
    let mut sa = a.shape().to_vec();
    let mut sb = b.shape().to_vec();
    if sa.len() == 1 {
        sa.insert(0, 1);
    }
    if sb.len() == 1 {
        sb.push(1);
    }
    if sa.len() < 2 || sb.len() < 2 {
        return None;
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (kb, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != kb {
        return None;
    }
    let av: Vec<u8> = a.iter().copied().collect();
    let bv: Vec<i8> = b.iter().copied().collect();
    let batch = sa.len().max(sb.len()) - 2;
    // The batch dimensions, right-aligned and broadcast.
    let dim = |s: &[usize], d: usize| -> usize {
        let lead = s.len() - 2;
        (d + lead).checked_sub(batch).map_or(1, |i| s[i])
    };
    let bshape: Vec<usize> = (0..batch).map(|d| dim(&sa, d).max(dim(&sb, d))).collect();
    let batches: usize = bshape.iter().product();
    if out.iter().product::<usize>() != batches * m * n {
        return None;
    }
    let astr = strides_of(&(0..batch).map(|d| dim(&sa, d)).collect::<Vec<_>>());
    let bstr = strides_of(&(0..batch).map(|d| dim(&sb, d)).collect::<Vec<_>>());
    let mut losses = vec![0i64; batches * m * n];
    for bi in 0..batches {
        let (mut ao, mut bo, mut rest) = (0, 0, bi);
        for d in (0..batch).rev() {
            let i = rest % bshape[d];
            rest /= bshape[d];
            if dim(&sa, d) > 1 {
                ao += i * astr[d];
            }
            if dim(&sb, d) > 1 {
                bo += i * bstr[d];
            }
        }
        let am = &av[ao * m * k..][..m * k];
        let bm = &bv[bo * k * n..][..k * n];
        for r in 0..m {
            let row = &am[r * k..][..k];
            for c in 0..n {
                let term = |j: usize| i32::from(row[j]) * i32::from(bm[j * n + c]);
                let mut l = 0;
                for j in (0..k).step_by(2) {
                    let p = term(j) + if j + 1 < k { term(j + 1) } else { 0 };
                    l += lost(p);
                }
                losses[(bi * m + r) * n + c] = l;
            }
        }
    }
    Some(losses)
}

fn conv_losses(
    x: &ArrayViewD<'_, u8>,
    zx: u8,
    w: &ArrayViewD<'_, i8>,
    attrs: &SpatialAttrs,
    group: usize,
    out: &[usize],
) -> Option<Vec<i64>> {
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() || group == 0 {
        return None;
    }
    let (nb, c, m, cg) = (xs[0], xs[1], ws[0], ws[1]);
    if c != cg * group || m % group != 0 {
        return None;
    }
    let (ins, kernel) = (&xs[2..], &ws[2..]);
    let geo = attrs.resolve("QLinearConv", ins, kernel).ok()?;
    let outs = &geo.out;
    let mut want = vec![nb, m];
    want.extend_from_slice(outs);
    if want != out {
        return None;
    }
    let xv: Vec<u8> = x.iter().copied().collect();
    let wv: Vec<i8> = w.iter().copied().collect();
    let taps: usize = kernel.iter().product();
    let plane_in: usize = ins.iter().product();
    let plane_out: usize = outs.iter().product();
    let (istr, kstr, ostr) = (strides_of(ins), strides_of(kernel), strides_of(outs));
    let mg = m / group;
    let depth = cg * taps;
    let mut col = vec![0u8; depth];
    let mut losses = vec![0i64; nb * m * plane_out];
    for n in 0..nb {
        for g in 0..group {
            for o in 0..plane_out {
                // The channels-last column of output position `o`: (tap, channel).
                for t in 0..taps {
                    let mut at = Some(0usize);
                    for d in 0..ins.len() {
                        let (od, kd) = (o / ostr[d] % outs[d], t / kstr[d] % kernel[d]);
                        let i = (od * geo.strides[d] + kd * geo.dilations[d])
                            .checked_sub(geo.pad_begin[d])
                            .filter(|&i| i < ins[d]);
                        at = at.zip(i).map(|(a, i)| a + i * istr[d]);
                    }
                    for ci in 0..cg {
                        col[t * cg + ci] =
                            at.map_or(zx, |p| xv[(n * c + g * cg + ci) * plane_in + p]);
                    }
                }
                for r in 0..mg {
                    let oc = g * mg + r;
                    let wr = &wv[oc * depth..][..depth];
                    // Weight depth `(channel, tap)` read in the column's order.
                    let term = |j: usize| {
                        let (t, ci) = (j / cg, j % cg);
                        i32::from(col[j]) * i32::from(wr[ci * taps + t])
                    };
                    let mut l = 0;
                    for j in (0..depth).step_by(2) {
                        let p = term(j) + if j + 1 < depth { term(j + 1) } else { 0 };
                        l += lost(p);
                    }
                    losses[(n * m + oc) * plane_out + o] = l;
                }
            }
        }
    }
    Some(losses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    /// A pair of 255 · 127 twice loses `2 · 32385 - 32767`; one product alone loses nothing.
    #[test]
    fn a_saturated_pair_loses_its_excess() {
        let a = ArrayD::from_shape_vec(IxDyn(&[1, 3]), vec![255u8; 3]).unwrap();
        let b = ArrayD::from_shape_vec(IxDyn(&[3, 1]), vec![127i8; 3]).unwrap();
        let l = losses(&Product::MatMul, (&a.view(), 0), &b.view(), &[1, 1]).unwrap();
        assert_eq!(l, vec![2 * 32385 - 32767]);
    }

    /// A convolution's pairs run over (tap, channel): with three channels, the last channel of
    /// tap 0 pairs with the first of tap 1, and a channel's two taps never pair.
    #[test]
    fn conv_pairs_cross_taps_where_the_channels_are_odd() {
        let attrs = SpatialAttrs {
            auto_pad: crate::ops::util::spatial::AutoPad::NotSet,
            kernel_shape: None,
            strides: None,
            dilations: None,
            pads: None,
            ceil_mode: false,
        };
        let conv = Product::Conv {
            attrs: &attrs,
            group: 1,
        };
        // x and w [1, 3, 1, 2] (element `2c + t`), one output position.
        let loss = |hot: [usize; 2]| {
            let mut x = vec![0u8; 6];
            let mut w = vec![0i8; 6];
            for i in hot {
                (x[i], w[i]) = (255, 127);
            }
            let x = ArrayD::from_shape_vec(IxDyn(&[1, 3, 1, 2]), x).unwrap();
            let w = ArrayD::from_shape_vec(IxDyn(&[1, 3, 1, 2]), w).unwrap();
            losses(&conv, (&x.view(), 0), &w.view(), &[1, 1, 1, 1]).unwrap()[0]
        };
        // Channel 2 at tap 0 with channel 0 at tap 1: one pair, saturated.
        assert_eq!(loss([4, 1]), 2 * 32385 - 32767);
        // Channel 0 at both taps: two pairs, neither saturated.
        assert_eq!(loss([0, 1]), 0);
    }
}
