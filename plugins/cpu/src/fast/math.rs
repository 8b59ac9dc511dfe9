//! f32 kernels written so the compiler vectorizes them: `exp` by range reduction and a
//! polynomial (branch-free, about 1 ulp over the range that does not under- or overflow), and the
//! row-wise Sigmoid, Softmax and LayerNormalization built on it.

/// e^x for f32: `x = n·ln2 + r`, `|r| ≤ ln2/2`, a degree-6 polynomial for e^r, and 2^n built in the
/// exponent bits. Inputs are clamped to [-87.3, 88.3] (results stay normal); NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a rounding instruction.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.3);
    // `t` holds n in its low mantissa bits: 2^n is built from them with integer operations
    // only (a float-to-int conversion would keep the loop from vectorizing).
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // n + 127 lies in [1, 254] over the clamped range: a normal exponent field.
    let pow2 = f32::from_bits(t.to_bits().wrapping_add(127) << 23);
    y * pow2
}

/// tanh(x) for f32, branch-free so it vectorizes: [`tanh_unclamped_f32`] kept inside [-1, 1].
/// NaN stays NaN.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    // The quotient overshoots 1 by up to two ulp near the clamp.
    tanh_unclamped_f32(x).clamp(-1.0, 1.0)
}

/// tanh(x) as ONNX Runtime's MLAS computes it on x86-64 (`MlasComputeTanh`): an odd degree-13
/// polynomial over an even degree-6 one in x, evaluated with fused multiply-adds, on x clamped
/// to ±9; within a few ulp of the exact value, and up to 2 ulp past ±1 near the clamp (as
/// MLAS's is). Bit for bit ONNX Runtime's Tanh on 400,000 values (1.31.1). NaN stays NaN.
#[inline(always)]
#[allow(clippy::excessive_precision)]
pub fn tanh_unclamped_f32(x: f32) -> f32 {
    let x = x.clamp(-9.0, 9.0);
    let x2 = x * x;
    let mut p = x2.mul_add(-2.760_768_477_423_55e-16, 2.000_187_904_824_77e-13);
    p = p.mul_add(x2, -8.604_671_522_137_35e-11);
    p = p.mul_add(x2, 5.122_297_090_371_14e-8);
    p = p.mul_add(x2, 1.485_722_357_179_79e-5);
    p = p.mul_add(x2, 6.372_619_288_754_36e-4);
    p = p.mul_add(x2, 4.893_524_558_917_86e-3);
    let p = p * x;
    let mut q = x2.mul_add(1.198_258_394_667_02e-6, 1.185_347_056_866_54e-4);
    q = q.mul_add(x2, 2.268_434_632_439_00e-3);
    q = q.mul_add(x2, 4.893_525_185_543_85e-3);
    p / q
}

/// erf(x) for f32, branch-free so it vectorizes: the Taylor series to x^13 below |x| = 0.5,
/// else `1 - t·P(t)·e^(-x²)` with `t = 1 / (1 + 0.3275911|x|)` (Abramowitz and Stegun 7.1.26,
/// absolute error below 1.5e-7; under 1e-6 relative in f32). NaN stays NaN; ±inf gives ±1.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let mut p = 1.205_533e-4f32;
    p = p * x2 - 8.548_327e-4;
    p = p * x2 + 5.223_977_6e-3;
    p = p * x2 - 2.686_617e-2;
    p = p * x2 + 0.112_837_92;
    p = p * x2 - 0.376_126_38;
    p = p * x2 + std::f32::consts::FRAC_2_SQRT_PI;
    let small = x * p;
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let mut q = 1.061_405_4f32;
    q = q * t - 1.453_152;
    q = q * t + 1.421_413_7;
    q = q * t - 0.284_496_74;
    q = q * t + 0.254_829_6;
    let big = (1.0 - q * t * exp_f32(-a * a)).copysign(x);
    if a < 0.5 { small } else { big }
}

crate::multiversion! {
/// erf of each element of `x` into `out` ([`erf_f32`]).
pub fn erf_slice(x: &[f32], out: &mut Vec<f32>) {
    out.extend(x.iter().map(|&v| erf_f32(v)));
}
}

/// The logistic function `1 / (1 + e^-x)` as ONNX Runtime computes it on x86-64 (MLAS's
/// rational approximation: an odd degree-9 numerator over an even degree-10 denominator in
/// x², evaluated with fused multiply-adds, on x clamped to ±18). Dynamically quantized models
/// requantize what follows a Sigmoid or a Swish, so the last bit matters there; the
/// approximation is within 2 ulp of the exact value. NaN stays NaN.
#[inline(always)]
#[allow(clippy::excessive_precision)]
pub fn sigmoid_f32(x: f32) -> f32 {
    let x = x.clamp(-18.0, 18.0);
    let x2 = x * x;
    let mut p = x2.mul_add(4.370_310_125_798_01e-11, 1.156_273_244_599_42e-7);
    p = x2.mul_add(p, 6.085_748_646_001_43e-5);
    p = x2.mul_add(p, 8.513_771_333_047_01e-3);
    p = x2.mul_add(p, 2.482_879_470_615_29e-1);
    let p = x * p;
    let mut q = x2.mul_add(6.102_473_897_556_81e-13, 5.761_021_369_934_27e-9);
    q = x2.mul_add(q, 6.291_067_850_170_40e-6);
    q = x2.mul_add(q, 1.701_988_173_740_94e-3);
    q = x2.mul_add(q, 1.168_176_569_044_53e-1);
    q = x2.mul_add(q, 9.931_519_210_231_80e-1);
    let r = p / q + 0.5;
    if r < 0.0 { 0.0 } else { r }
}

crate::multiversion! {
/// [`sigmoid_f32`] of each element; an error when the memory is not there.
pub fn sigmoid(x: &[f32]) -> crate::error::OpResult<Vec<f32>> {
    let mut out = crate::scratch::take(x.len())?;
    out.extend(x.iter().map(|&v| sigmoid_f32(v)));
    Ok(out)
}
}

/// Each row of `N` values of `x` less the row's maximum, into `out`.
#[inline(always)]
fn short_shift<const N: usize>(x: &[f32], out: &mut [f32]) {
    for (row, o) in x.chunks_exact(N).zip(out.chunks_exact_mut(N)) {
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        for (d, &v) in o.iter_mut().zip(row) {
            *d = v - max;
        }
    }
}

/// Each row of `N` values divided by its sum (times the reciprocal, summed left to right).
#[inline(always)]
fn short_scale<const N: usize>(v: &mut [f32]) {
    for o in v.chunks_exact_mut(N) {
        let inv = 1.0 / o.iter().sum::<f32>();
        for d in o.iter_mut() {
            *d *= inv;
        }
    }
}

crate::multiversion! {
/// Softmax (or log-softmax) over each contiguous row of `n` values.
pub fn softmax_rows(x: &[f32], n: usize, log: bool, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    if n < 8 {
        // Short rows (class scores): the exponentials over the whole buffer at once, so they
        // vectorize across rows.
        // Fixed row lengths for the per-row passes: loops of a known trip count, unrolled.
        match n {
            1 => short_shift::<1>(x, out),
            2 => short_shift::<2>(x, out),
            3 => short_shift::<3>(x, out),
            4 => short_shift::<4>(x, out),
            5 => short_shift::<5>(x, out),
            6 => short_shift::<6>(x, out),
            _ => short_shift::<7>(x, out),
        }
        let shifted = &mut out[..x.len() / n * n];
        let mut logs = [0f32; 8];
        if log {
            // Log-softmax needs the shifted values after the sums: each row's go in `logs`.
            for o in shifted.chunks_exact_mut(n) {
                logs[..n].copy_from_slice(o);
                let sum: f32 = o.iter().map(|&v| exp_f32(v)).sum();
                let ls = sum.ln();
                for (d, &v) in o.iter_mut().zip(&logs[..n]) {
                    *d = v - ls;
                }
            }
            return;
        }
        for d in shifted.iter_mut() {
            *d = exp_f32(*d);
        }
        match n {
            1 => short_scale::<1>(shifted),
            2 => short_scale::<2>(shifted),
            3 => short_scale::<3>(shifted),
            4 => short_scale::<4>(shifted),
            5 => short_scale::<5>(shifted),
            6 => short_scale::<6>(shifted),
            _ => short_scale::<7>(shifted),
        }
        return;
    }
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let max = lanes(row, f32::NEG_INFINITY, f32::max);
        for (d, &v) in o.iter_mut().zip(row) {
            *d = exp_f32(v - max);
        }
        let sum = lanes(o, 0.0, |a, b| a + b);
        if log {
            let ls = sum.ln();
            for (d, &v) in o.iter_mut().zip(row) {
                *d = v - max - ls;
            }
        } else {
            let inv = 1.0 / sum;
            for d in o.iter_mut() {
                *d *= inv;
            }
        }
    }
}
}

/// `Σ f(v)` in f64 over 8 independent partial sums (so the loop vectorizes).
#[inline(always)]
fn sum_f64(v: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(f64::from(x));
        }
    }
    acc.iter().sum::<f64>() + rest.iter().map(|&x| f(f64::from(x))).sum::<f64>()
}

/// Folds `v` with `f` over 8 independent lanes (so the loop vectorizes), then across them.
#[inline(always)]
fn lanes(v: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = f(*a, x);
        }
    }
    let mut r = acc.iter().copied().fold(init, &f);
    for &x in rest {
        r = f(r, x);
    }
    r
}

crate::multiversion! {
/// LayerNormalization (or RMSNormalization, `rms`) of each contiguous row of `scale.len()`
/// values; statistics in f64. Returns each row's mean and 1/σ.
pub fn layer_norm_rows(
    x: &[f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f64,
    rms: bool,
    out: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    let cols = scale.len();
    let rows = x.len().checked_div(cols).unwrap_or(0);
    let (mut means, mut invs) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    if cols == 0 {
        return (means, invs);
    }
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mean = if rms {
            0.0
        } else {
            sum_f64(row, |v| v) / cols as f64
        };
        let var = sum_f64(row, |v| (v - mean) * (v - mean)) / cols as f64;
        let inv = 1.0 / (var + eps).sqrt();
        let (m, i) = (mean as f32, inv as f32);
        match bias {
            Some(b) => {
                for (((d, &v), &s), &bb) in o.iter_mut().zip(row).zip(scale).zip(b) {
                    *d = (v - m) * i * s + bb;
                }
            }
            None => {
                for ((d, &v), &s) in o.iter_mut().zip(row).zip(scale) {
                    *d = (v - m) * i * s;
                }
            }
        }
        means.push(m);
        invs.push(i);
    }
    (means, invs)
}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_and_keeps_nan() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_f32(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) < 1e-37 && exp_f32(1000.0) > 1e38);
    }

    #[test]
    fn tanh_is_accurate_and_keeps_nan() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4;
            let want = (x as f64).tanh();
            let got = tanh_f32(x) as f64;
            worst = worst.max((got - want).abs() / want.abs().max(1e-30));
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert!((tanh_f32(1e-30) / 1e-30 - 1.0).abs() < 1e-6);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(-f32::INFINITY), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn erf_is_accurate() {
        let mut worst = 0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            let (a, b) = (f64::from(erf_f32(x)), libm::erf(f64::from(x)));
            worst = worst.max((a - b).abs() / b.abs().max(1e-3));
            x += 0.000_37;
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32(0.0), 0.0);
        assert!((erf_f32(1e-30) - 1.128_379_2e-30).abs() < 1e-36);
    }

    #[test]
    fn short_and_long_softmax_rows_agree_with_f64() {
        let mut seed = 3u32;
        for n in 1..=10 {
            let x: Vec<f32> = (0..n * 5)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 20) as f32 - 8.0
                })
                .collect();
            for log in [false, true] {
                let mut o = vec![0f32; x.len()];
                softmax_rows(&x, n, log, &mut o);
                for (row, got) in x.chunks(n).zip(o.chunks(n)) {
                    let max = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
                    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
                    for (&v, &g) in row.iter().zip(got) {
                        let want = if log {
                            v as f64 - max - sum.ln()
                        } else {
                            (v as f64 - max).exp() / sum
                        };
                        assert!(
                            (g as f64 - want).abs() < 1e-6,
                            "n {n} log {log}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_and_layer_norm_rows() {
        let x = [1.0f32, 2.0, 3.0, -1.0, 0.0, 1.0];
        let mut o = [0f32; 6];
        softmax_rows(&x, 3, false, &mut o);
        let e = [1f32.exp(), 2f32.exp(), 3f32.exp()];
        let s: f32 = e.iter().sum();
        for (a, b) in o[..3].iter().zip(e.iter().map(|v| v / s)) {
            assert!((a - b).abs() < 1e-6);
        }
        assert_eq!(o[..3], o[3..]);
        let (m, i) = layer_norm_rows(
            &x,
            &[1.0, 1.0, 1.0],
            Some(&[0.0, 0.0, 1.0]),
            0.0,
            false,
            &mut o,
        );
        assert_eq!(m, [2.0, 0.0]);
        let inv = 1.0 / (2.0f32 / 3.0).sqrt();
        assert!((i[0] - inv).abs() < 1e-6 && (o[2] - (inv + 1.0)).abs() < 1e-6);
    }
}

crate::multiversion! {
/// `f(a, b)` elementwise with numpy broadcasting over contiguous f32 buffers of shapes `sa` and
/// `sb`. The trailing dimensions in which the operands agree (or one of them is broadcast
/// throughout) form one inner loop over contiguous slices, which vectorizes; the dimensions
/// before it are walked once per inner block. `None` when the shapes do not broadcast.
pub fn broadcast_binary(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    f: impl Fn(f32, f32) -> f32 + Copy,
) -> Option<(Vec<f32>, Vec<usize>)> {
    let rank = sa.len().max(sb.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(sa), pad(sb));
    let mut out_shape = Vec::with_capacity(rank);
    for (&x, &y) in pa.iter().zip(&pb) {
        out_shape.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        });
    }
    // Over the size limit: the general path reports it.
    let total = crate::limits::checked_numel(&out_shape).ok()?;
    // Filled block by block, in order: no zero-fill first. Memory that is not there: the
    // general path reports it.
    let mut out = crate::scratch::take(total).ok()?;
    if total == 0 {
        return Some((out, out_shape));
    }
    // The kind of a dimension: both operands vary along it, only `a`, or only `b`.
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Both,
        OnlyA,
        OnlyB,
    }
    let kind = |d: usize| match (pa[d] == out_shape[d], pb[d] == out_shape[d]) {
        _ if out_shape[d] == 1 => None,
        (true, true) => Some(Kind::Both),
        (true, false) => Some(Kind::OnlyA),
        _ => Some(Kind::OnlyB),
    };
    // The innermost run of dimensions of one kind (extent-1 dimensions fit any run).
    let mut split = rank;
    let mut inner_kind = None;
    while split > 0 {
        match (kind(split - 1), inner_kind) {
            (None, _) => {}
            (Some(k), None) => inner_kind = Some(k),
            (Some(k), Some(i)) if k == i => {}
            _ => break,
        }
        split -= 1;
    }
    let inner: usize = out_shape[split..].iter().product();
    let inner_kind = inner_kind.unwrap_or(Kind::Both);
    let strides = |s: &[usize]| -> Vec<usize> {
        let mut st = vec![0; rank];
        let mut acc = 1;
        for d in (0..rank).rev() {
            st[d] = if s[d] == 1 { 0 } else { acc };
            acc *= s[d];
        }
        st
    };
    let (ta, tb) = (strides(&pa), strides(&pb));
    let outer_shape = &out_shape[..split];
    let mut idx = vec![0usize; split];
    for _ in 0..total / inner {
        let oa: usize = idx.iter().zip(&ta).map(|(i, s)| i * s).sum();
        let ob: usize = idx.iter().zip(&tb).map(|(i, s)| i * s).sum();
        match inner_kind {
            Kind::Both => out.extend(
                a[oa..oa + inner]
                    .iter()
                    .zip(&b[ob..ob + inner])
                    .map(|(&x, &y)| f(x, y)),
            ),
            Kind::OnlyA => {
                let y = b[ob];
                out.extend(a[oa..oa + inner].iter().map(|&x| f(x, y)));
            }
            Kind::OnlyB => {
                let x = a[oa];
                out.extend(b[ob..ob + inner].iter().map(|&y| f(x, y)));
            }
        }
        // Next outer index (row-major).
        for d in (0..split).rev() {
            idx[d] += 1;
            if idx[d] < outer_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some((out, out_shape))
}
}

#[cfg(test)]
mod broadcast_tests {
    use super::broadcast_binary;

    #[test]
    fn broadcasts_like_numpy() {
        // [2, 3] + [3]
        let (o, s) = broadcast_binary(
            &[1., 2., 3., 4., 5., 6.],
            &[2, 3],
            &[10., 20., 30.],
            &[3],
            |x, y| x + y,
        )
        .unwrap();
        assert_eq!((o, s), (vec![11., 22., 33., 14., 25., 36.], vec![2, 3]));
        // [2, 1] * [1, 3]
        let (o, s) =
            broadcast_binary(&[1., 2.], &[2, 1], &[1., 10., 100.], &[1, 3], |x, y| x * y).unwrap();
        assert_eq!((o, s), (vec![1., 10., 100., 2., 20., 200.], vec![2, 3]));
        // [1, 2, 2, 2] - [1, 2, 1, 1] (per channel)
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let (o, _) =
            broadcast_binary(&x, &[1, 2, 2, 2], &[1., 2.], &[1, 2, 1, 1], |x, y| x - y).unwrap();
        assert_eq!(o, vec![-1., 0., 1., 2., 2., 3., 4., 5.]);
        // scalar / tensor
        let (o, _) = broadcast_binary(&[8.], &[], &[2., 4.], &[2], |x, y| x / y).unwrap();
        assert_eq!(o, vec![4., 2.]);
        assert!(broadcast_binary(&[1., 2.], &[2], &[1., 2., 3.], &[3], |x, y| x + y).is_none());
    }
}
