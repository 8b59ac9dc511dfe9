//! The f32 GEMM every fast kernel multiplies with: `dst = beta·dst + alpha·(lhs · rhs)` over
//! strided operands, on the `gemm` crate's SGEMM (AVX-512 or AVX2+FMA kernels chosen at run
//! time), cut into one piece per thread of the intra-op pool when asked, and a row kernel of
//! its own for narrow products (an MLP's last layers, a linear model's scores), where the
//! crate's packing costs more than the product.

/// `c[m, n] += a[m, k] · b[k, n]` (`=` when not `accumulate`): `a`'s element `(i, p)` is at
/// `i * rs + p * cs`; `b` and `c` are row-major with row strides `ldb` and `ldc` (each may be a
/// band of columns of a wider matrix).
pub(crate) fn sgemm_strided(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    (rs, cs): (usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
    par: bool,
) {
    assert!(
        m == 0 || n == 0 || (ldc >= n && c.len() >= (m - 1) * ldc + n),
        "sgemm: output too small"
    );
    // SAFETY: `c` is exclusively borrowed and holds every element written (asserted above).
    unsafe {
        sgemm_raw(
            (m, k, n),
            a,
            (rs, cs),
            (b, ldb),
            (c.as_mut_ptr(), ldc),
            accumulate,
            par,
        );
    }
}

/// `c[m, n] = (accumulate ? c : 0) + a[m, k] · btᵀ`, the second operand given transposed: `bt`
/// is `n` rows of `k` values `ldbt` apart (ONNX's recurrent weights, `[gates, input]`); `a` and
/// `c` are row-major with row strides `lda` and `ldc`. Split across the pool when large.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_nt(
    (m, k, n): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (bt, ldbt): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lda >= k
            && ldbt >= k
            && ldc >= n
            && (k == 0 || (a.len() >= (m - 1) * lda + k && bt.len() >= (n - 1) * ldbt + k))
            && c.len() >= (m - 1) * ldc + n,
        "sgemm_nt: buffers too small"
    );
    let par = crate::par::gemm_splits(m, k, n);
    // SAFETY: every element the strides reach lies inside `a`, `bt` and `c` (asserted above);
    // `c` is exclusively borrowed, so it overlaps neither input.
    unsafe {
        gemm_f32(
            (m, n, k),
            (c.as_mut_ptr(), 1, ldc as isize),
            accumulate,
            (a.as_ptr(), 1, lda as isize),
            (bt.as_ptr(), ldbt as isize, 1),
            (1.0, 1.0),
            par,
        );
    }
}

/// [`sgemm_strided`] into `c` given as a pointer, for tasks that write disjoint bands of columns
/// of one output.
///
/// # Safety
/// `c` must be valid for writes of the `m` rows of `n` elements at row stride `ldc >= n`, and no
/// other thread may read or write those elements during the call.
pub(crate) unsafe fn sgemm_raw(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    (rs, cs): (usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    par: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    let a_needed = if k == 0 {
        0
    } else {
        (m - 1) * rs + (k - 1) * cs + 1
    };
    assert!(
        a.len() >= a_needed && (k == 0 || b.len() >= (k - 1) * ldb + n) && ldb >= n && ldc >= n,
        "sgemm: buffers too small"
    );
    // SAFETY: every element of `a` and `b` the strides reach lies inside them (asserted above);
    // `c` is valid and exclusive by this function's contract, so it overlaps neither.
    unsafe {
        gemm_f32(
            (m, n, k),
            (c, 1, ldc as isize),
            accumulate,
            (a.as_ptr(), cs as isize, rs as isize),
            (b.as_ptr(), 1, ldb as isize),
            (1.0, 1.0),
            par,
        );
    }
}

/// `dst = beta·dst + alpha·(lhs · rhs)` for an `m × k` by `k × n` product, each operand given
/// as a pointer with its (column, row) strides in elements, `dst` read only when `read_dst`.
/// When `split`, the output is cut into one piece per thread of the pool, along its longer
/// side, and each piece is one GEMM call on one thread: one hand-off for the whole product.
///
/// # Safety
/// Every element the shapes and strides reach must be valid: readable in `lhs` and `rhs`,
/// writable (and readable when `read_dst`) in `dst`, with `dst` overlapping neither input, and
/// no other thread may touch `dst`'s elements during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    (dst, dst_cs, dst_rs): (*mut f32, isize, isize),
    read_dst: bool,
    (lhs, lhs_cs, lhs_rs): (*const f32, isize, isize),
    (rhs, rhs_cs, rhs_rs): (*const f32, isize, isize),
    (alpha, beta): (f32, f32),
    split: bool,
) {
    // Addresses as integers, so that the pieces can be shared with the pool.
    let (d, l, r) = (dst as usize, lhs as usize, rhs as usize);
    // Rows of `lhs` and of `dst` contiguous and apart: a narrow product may take the row
    // kernel ([`narrow_rows`]).
    let rows_apart = lhs_cs == 1 && dst_cs == 1 && lhs_rs >= k as isize && dst_rs >= n as isize;
    let piece = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        let (i, j) = (rows.start as isize, cols.start as isize);
        if rows_apart && cols.len() <= NARROW_N && k <= NARROW_K && !rows.is_empty() {
            let (mr, nc) = (rows.len(), cols.len());
            let mut packed = [0f32; NARROW_N * NARROW_K];
            for kk in 0..k {
                for jj in 0..nc {
                    // SAFETY: element (kk, j + jj) of `rhs`, inside what the caller vouched for.
                    packed[kk * NARROW_N + jj] = unsafe {
                        *(r as *const f32).offset(kk as isize * rhs_rs + (j + jj as isize) * rhs_cs)
                    };
                }
            }
            // SAFETY: rows `rows` of `lhs` (k elements each, `lhs_rs` apart) and of `dst`
            // (columns `cols`, `dst_rs` apart) lie inside what the caller vouched for; this
            // piece's output elements are its own.
            let (a, c) = unsafe {
                (
                    std::slice::from_raw_parts(
                        (l as *const f32).offset(i * lhs_rs),
                        (mr - 1) * lhs_rs as usize + k,
                    ),
                    std::slice::from_raw_parts_mut(
                        (d as *mut f32).offset(i * dst_rs + j),
                        (mr - 1) * dst_rs as usize + nc,
                    ),
                )
            };
            let shape = (mr, nc, k, lhs_rs as usize, dst_rs as usize);
            narrow_rows(
                shape,
                a,
                &packed[..k * NARROW_N],
                c,
                (read_dst, alpha, beta),
            );
            return;
        }
        // SAFETY: each piece is a block of the output and the matching rows of `lhs` and
        // columns of `rhs`, inside what the caller vouched for; the pieces share no output
        // element.
        unsafe {
            ::gemm::gemm(
                rows.len(),
                cols.len(),
                k,
                (d as *mut f32).offset(i * dst_rs + j * dst_cs),
                dst_cs,
                dst_rs,
                read_dst,
                (l as *const f32).offset(i * lhs_rs),
                lhs_cs,
                lhs_rs,
                (r as *const f32).offset(j * rhs_cs),
                rhs_cs,
                rhs_rs,
                beta,
                alpha,
                false,
                false,
                false,
                ::gemm::Parallelism::None,
            );
        }
    };
    if split {
        crate::par::split_gemm(m, n, piece);
    } else {
        piece(0..m, 0..n);
    }
}

/// The widest and deepest products [`narrow_rows`] takes (an MLP's last layers, a linear
/// model's scores): the `gemm` crate's packing and blocking cost more than the product there.
const NARROW_N: usize = 16;
const NARROW_K: usize = 64;

crate::multiversion! {
/// `c = beta·c + alpha·(a · b)` for `m` rows (`c` read only when `read`): each row of `a`
/// (`k` values, rows `lda` apart) times `b` packed as `k` rows of [`NARROW_N`] (zeros past
/// `n`), accumulated in one register-wide row, then `n` values written (rows `ldc` apart).
fn narrow_rows(
    shape: (usize, usize, usize, usize, usize),
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    scale: (bool, f32, f32),
) {
    let (m, n, k, lda, ldc) = shape;
    let (read, alpha, beta) = scale;
    // Rows four at a time: four independent chains of additions instead of one, held in
    // registers (fixed trip counts), then the last rows one at a time.
    const R: usize = 4;
    let mut i = 0;
    let put = |c: &mut [f32], at: usize, acc: &[f32; NARROW_N]| {
        let row = &mut c[at..][..n];
        if read {
            for (o, &s) in row.iter_mut().zip(acc) {
                *o = beta * *o + alpha * s;
            }
        } else {
            for (o, &s) in row.iter_mut().zip(acc) {
                *o = alpha * s;
            }
        }
    };
    while i + R <= m {
        let mut acc = [[0f32; NARROW_N]; R];
        for kk in 0..k {
            let brow: &[f32; NARROW_N] = b[kk * NARROW_N..][..NARROW_N]
                .try_into()
                .expect("a packed row");
            let av: [f32; R] = std::array::from_fn(|r| a[(i + r) * lda + kk]);
            for r in 0..R {
                for j in 0..NARROW_N {
                    acc[r][j] += av[r] * brow[j];
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            put(c, (i + r) * ldc, acc);
        }
        i += R;
    }
    for i in i..m {
        let mut acc = [0f32; NARROW_N];
        for kk in 0..k {
            let av = a[i * lda + kk];
            for (s, &bv) in acc.iter_mut().zip(&b[kk * NARROW_N..][..NARROW_N]) {
                *s += av * bv;
            }
        }
        put(c, i * ldc, &acc);
    }
}
}

/// `c[m, n] += a[m, k] · b[k, n]`, all row-major and contiguous.
pub fn sgemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    sgemm_strided(
        (m, k, n),
        a,
        (k, 1),
        (b, n),
        (c, n),
        true,
        crate::par::gemm_splits(m, k, n),
    );
}

/// `c = beta·c + alpha·(a · b)` over ndarray views at any strides (transposed ones included);
/// `c` is read only when `beta` is not 0. The shapes must agree (checked by the caller).
pub fn gemm_views(
    alpha: f32,
    a: &ndarray::ArrayView2<'_, f32>,
    b: &ndarray::ArrayView2<'_, f32>,
    beta: f32,
    c: &mut ndarray::ArrayViewMut2<'_, f32>,
) {
    let ((m, k), n) = (a.dim(), b.dim().1);
    assert!(
        b.dim().0 == k && c.dim() == (m, n),
        "gemm_views: shapes disagree"
    );
    let (sa, sb) = (a.strides(), b.strides());
    let (sc0, sc1) = (c.strides()[0], c.strides()[1]);
    // SAFETY: the three views are valid for every index within their shapes (asserted to
    // agree above) at their own strides; `c` is borrowed mutably, so it overlaps neither `a`
    // nor `b`.
    unsafe {
        gemm_f32(
            (m, n, k),
            (c.as_mut_ptr(), sc1, sc0),
            beta != 0.0,
            (a.as_ptr(), sa[1], sa[0]),
            (b.as_ptr(), sb[1], sb[0]),
            (alpha, beta),
            crate::par::gemm_splits(m, k, n),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Narrow products (the row kernel) against sums in f64: row counts around its block of
    /// four, widths and depths up to its limits, strided rows, with and without `dst` read.
    #[test]
    fn narrow_products_match_sums_on_every_instruction_set() {
        let val = |i: usize, salt: usize| ((i * 37 + salt * 11) % 23) as f32 / 7.0 - 1.5;
        let mut checked = Vec::new();
        for isa in crate::fast::isa::ISAS.iter().filter(|i| i.fast) {
            let ran = crate::fast::isa::with_isa(isa, || {
                for (m, n, k) in [(1, 1, 1), (3, 3, 6), (4, 8, 8), (9, 16, 64), (7, 5, 33)] {
                    let (lda, ldc) = (k + 2, n + 3);
                    let a: Vec<f32> = (0..m * lda).map(|i| val(i, 1)).collect();
                    let b: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
                    for read in [false, true] {
                        let mut c: Vec<f32> = (0..m * ldc).map(|i| val(i, 3)).collect();
                        let before = c.clone();
                        let (alpha, beta) = (0.5f32, 2.0f32);
                        // SAFETY: every index the shapes and strides reach is inside the three
                        // vectors, and `c` is its own allocation.
                        unsafe {
                            gemm_f32(
                                (m, n, k),
                                (c.as_mut_ptr(), 1, ldc as isize),
                                read,
                                (a.as_ptr(), 1, lda as isize),
                                (b.as_ptr(), 1, n as isize),
                                (alpha, beta),
                                false,
                            );
                        }
                        for i in 0..m {
                            for j in 0..ldc {
                                let got = c[i * ldc + j];
                                if j >= n {
                                    assert_eq!(got, before[i * ldc + j], "padding written");
                                    continue;
                                }
                                let dot: f64 = (0..k)
                                    .map(|p| f64::from(a[i * lda + p]) * f64::from(b[p * n + j]))
                                    .sum();
                                let mut want = f64::from(alpha) * dot;
                                if read {
                                    want += f64::from(beta) * f64::from(before[i * ldc + j]);
                                }
                                assert!(
                                    (f64::from(got) - want).abs() < 1e-4,
                                    "{m}x{n}x{k} read {read} at ({i}, {j}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            });
            if ran.is_some() {
                checked.push(isa.name);
            }
        }
        eprintln!("narrow products checked on: {}", checked.join(", "));
        assert!(!checked.is_empty());
    }
}
