//! Matrix products with few columns, as dot products of rows: `out[i, j] += a[i, :] · bt[j, :]`.
//!
//! A GEMM packs both operands into panels before it multiplies. When the product has only a
//! handful of columns (a recurrent cell's one input vector, a convolution over a short signal),
//! packing the weights costs more than the product itself. Here the weights are read once, where
//! they lie, row after row; the few columns are given transposed (`bt`, one contiguous row per
//! column) so both operands of every dot product are contiguous. Blocks of 4 weight rows by 2
//! columns keep 8 vector accumulators in flight, which hides the fused multiply-add latency.

/// Columns up to which [`row_dots`] beats packing for a GEMM.
pub const NARROW: usize = 8;

/// `out[i · ldo + j] += Σₚ a[i · k + p] · bt[j · k + p]` for `i < m`, `j < n`.
#[allow(clippy::too_many_arguments)]
pub fn row_dots(m: usize, n: usize, k: usize, a: &[f32], bt: &[f32], out: &mut [f32], ldo: usize) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        a.len() >= m * k && bt.len() >= n * k && ldo >= n && out.len() >= (m - 1) * ldo + n,
        "row_dots: buffers too small"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let isa = crate::fast::isa::isa();
        if isa.vnni {
            // SAFETY: the VNNI level is chosen only on a CPU with AVX-512F.
            unsafe { avx512::row_dots(m, n, k, a, bt, out, ldo) };
            return;
        }
        if isa.wide {
            // SAFETY: the CPU has AVX2 and FMA, checked just above.
            unsafe { avx2::row_dots(m, n, k, a, bt, out, ldo) };
            return;
        }
    }
    drive!(portable_block, m, n, k, a, bt, out, ldo);
}

/// The loop over blocks of 4 rows by 2 columns (and the smaller ones at the edges), with
/// `$block::<R, C>` computing one.
macro_rules! drive {
    ($block:ident, $m:expr, $n:expr, $k:expr, $a:expr, $bt:expr, $out:expr, $ldo:expr) => {{
        let (m, n, k, a, bt, out, ldo): (usize, usize, usize, &[f32], &[f32], &mut [f32], usize) =
            ($m, $n, $k, $a, $bt, $out, $ldo);
        let row = |i: usize| &a[i * k..][..k];
        let col = |j: usize| &bt[j * k..][..k];
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(4);
            let mut j = 0;
            while j < n {
                let cols = (n - j).min(2);
                if rows == 4 {
                    let r4 = [row(i), row(i + 1), row(i + 2), row(i + 3)];
                    if cols == 2 {
                        store(out, ldo, i, j, &$block::<4, 2>(r4, [col(j), col(j + 1)]));
                    } else {
                        store(out, ldo, i, j, &$block::<4, 1>(r4, [col(j)]));
                    }
                } else {
                    for r in i..i + rows {
                        if cols == 2 {
                            store(
                                out,
                                ldo,
                                r,
                                j,
                                &$block::<1, 2>([row(r)], [col(j), col(j + 1)]),
                            );
                        } else {
                            store(out, ldo, r, j, &$block::<1, 1>([row(r)], [col(j)]));
                        }
                    }
                }
                j += cols;
            }
            i += rows;
        }
    }};
}
use drive;

/// Adds the block of sums `s` at row `i`, column `j` of `out`.
#[inline(always)]
fn store<const R: usize, const C: usize>(
    out: &mut [f32],
    ldo: usize,
    i: usize,
    j: usize,
    s: &[[f32; C]; R],
) {
    for (r, sums) in s.iter().enumerate() {
        for (o, v) in out[(i + r) * ldo + j..][..C].iter_mut().zip(sums) {
            *o += v;
        }
    }
}

/// The `R × C` dot products of rows `a` with rows `b` (all of one length), in plain Rust.
#[inline(always)]
fn portable_block<const R: usize, const C: usize>(a: [&[f32]; R], b: [&[f32]; C]) -> [[f32; C]; R] {
    let mut sums = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            sums[r][c] = a[r].iter().zip(b[c]).map(|(x, y)| x * y).sum();
        }
    }
    sums
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::store;
    use std::arch::x86_64::*;

    /// [`super::row_dots`] with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn row_dots(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        bt: &[f32],
        out: &mut [f32],
        ldo: usize,
    ) {
        drive!(block, m, n, k, a, bt, out, ldo);
    }

    /// The `R × C` dot products of rows `a` with rows `b`, each over 8 lanes of one register.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn block<const R: usize, const C: usize>(a: [&[f32]; R], b: [&[f32]; C]) -> [[f32; C]; R] {
        let k = a[0].len();
        assert!(a.iter().all(|r| r.len() == k) && b.iter().all(|c| c.len() == k));
        let body = k - k % 8;
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut p = 0;
        while p < body {
            let mut bv = [_mm256_setzero_ps(); C];
            for c in 0..C {
                // SAFETY: `p + 8 <= k`, the length of every row (asserted above).
                bv[c] = unsafe { _mm256_loadu_ps(b[c].as_ptr().add(p)) };
            }
            for r in 0..R {
                // SAFETY: as above.
                let av = unsafe { _mm256_loadu_ps(a[r].as_ptr().add(p)) };
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(av, bv[c], acc[r][c]);
                }
            }
            p += 8;
        }
        let mut sums = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let v = acc[r][c];
                let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
                let q = _mm_add_ss(q, _mm_movehdup_ps(q));
                let mut s = _mm_cvtss_f32(q);
                for t in body..k {
                    s = a[r][t].mul_add(b[c][t], s);
                }
                sums[r][c] = s;
            }
        }
        sums
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::store;
    use std::arch::x86_64::*;

    /// [`super::row_dots`] with AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn row_dots(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        bt: &[f32],
        out: &mut [f32],
        ldo: usize,
    ) {
        drive!(block, m, n, k, a, bt, out, ldo);
    }

    /// The `R × C` dot products of rows `a` with rows `b`, each over 16 lanes of one register,
    /// the last values of a row masked in rather than summed one by one.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn block<const R: usize, const C: usize>(a: [&[f32]; R], b: [&[f32]; C]) -> [[f32; C]; R] {
        let k = a[0].len();
        assert!(a.iter().all(|r| r.len() == k) && b.iter().all(|c| c.len() == k));
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut p = 0;
        while p < k {
            let left = k - p;
            let mask: __mmask16 = if left >= 16 {
                0xffff
            } else {
                ((1u32 << left) - 1) as __mmask16
            };
            let mut bv = [_mm512_setzero_ps(); C];
            for c in 0..C {
                // SAFETY: the mask covers only `p..k`, inside every row (asserted above).
                bv[c] = unsafe { _mm512_maskz_loadu_ps(mask, b[c].as_ptr().add(p)) };
            }
            for r in 0..R {
                // SAFETY: as above.
                let av = unsafe { _mm512_maskz_loadu_ps(mask, a[r].as_ptr().add(p)) };
                for c in 0..C {
                    acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
                }
            }
            p += 16;
        }
        let mut sums = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                sums[r][c] = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_dots_equal_the_plain_sums() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let mut checked = Vec::new();
        for isa in crate::fast::isa::ISAS.iter().filter(|i| i.fast) {
            let ran = crate::fast::isa::with_isa(isa, || {
                // Every block shape and tail: up to 9 rows, 5 columns, depths across 8 lanes.
                for (m, n, k) in [
                    (9, 5, 21),
                    (4, 2, 8),
                    (1, 1, 1),
                    (7, 3, 0),
                    (5, 4, 64),
                    (3, 1, 17),
                ] {
                    let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
                    let bt: Vec<f32> = (0..n * k).map(|_| next()).collect();
                    let ldo = n + 2;
                    let mut out: Vec<f32> = (0..m * ldo).map(|_| next()).collect();
                    let mut want = out.clone();
                    for i in 0..m {
                        for j in 0..n {
                            let s: f64 = (0..k)
                                .map(|p| a[i * k + p] as f64 * bt[j * k + p] as f64)
                                .sum();
                            want[i * ldo + j] += s as f32;
                        }
                    }
                    row_dots(m, n, k, &a, &bt, &mut out, ldo);
                    for (got, want) in out.iter().zip(&want) {
                        assert!((got - want).abs() < 1e-5, "{m}×{n}×{k}: {got} vs {want}");
                    }
                }
            });
            match ran {
                Some(()) => checked.push(isa.name),
                None => eprintln!("{}: not checked, this CPU lacks its features", isa.name),
            }
        }
        eprintln!("row dots checked on: {}", checked.join(", "));
    }
}
