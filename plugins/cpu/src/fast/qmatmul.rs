//! The 8-bit matrix product fast path of QLinearMatMul and MatMulInteger: `Y = A · B` with `A`
//! `[.., M, K]` and `B` `[K, N]` (weights, packed once) or `[.., K, N]` with the same batch
//! dimensions. Two layouts, chosen when `B` is packed:
//!
//! - **AVX-512 VNNI** ([`Layout::Cols`]): `B` packed in blocks of [`NB`] columns, each quad of
//!   four `k` one 64-byte vector per 16 columns; a tile of [`MA`] rows of `A` broadcasts four
//!   bytes of each row against those vectors, so the sums come out as rows of `Y`, read from
//!   `A` where it lies (no packing of the activations);
//! - **otherwise** ([`Layout::Rows`]): the integer GEMM of [`super::qgemm`] on `Bᵀ · Aᵀ`: `B`'s
//!   columns are the packed rows, `A`'s rows the panel columns, and each tile is written back
//!   transposed.
//!
//! Either way the zero points are applied to the sums and, for QLinearMatMul, each output row
//! is requantized. Signed weights are summed as ONNX Runtime sums them on the same CPU
//! ([`Sums::like_onnxruntime`]): exactly with VNNI, in i16-saturated pairs without.

use super::qgemm::{self, Cols, NR, QWeights, Sums, XBytes};

/// Rows of `A` per tile of the VNNI kernel.
pub const MA: usize = 8;
/// Columns of `B` per block of the VNNI kernel.
pub const NB: usize = 32;

/// `B`, packed in the kernel's signed domain, with its zero points there.
#[derive(Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    layout: Layout,
    zb: Vec<i32>,
}

/// How [`PackedB`] holds `B`.
#[derive(Debug)]
enum Layout {
    /// `Bᵀ` (`n × k`) for [`qgemm`].
    Rows(QWeights),
    /// `[n.div_ceil(NB)][k.div_ceil(4)][NB][4]`, zero-padded, and `Σ_k B[k][j]` of each column:
    /// for the VNNI kernel (packed only where the CPU has it).
    Cols { packed: Vec<i8>, sums: Vec<i32> },
}

impl PackedB {
    /// Packs `b` (`k × n` bytes, row-major; `signed`: int8 bits, else uint8) with its zero
    /// points (one, or one per column, in `b`'s domain). `None` past [`MAX_DEPTH`].
    pub fn new(b: &[u8], signed: bool, (k, n): (usize, usize), zb: &[i32]) -> Option<PackedB> {
        if k > MAX_DEPTH || b.len() != k * n || (zb.len() != 1 && zb.len() != n) {
            return None;
        }
        let shift = if signed { 0 } else { 128 };
        let zb: Vec<i32> = (0..n)
            .map(|j| zb[if zb.len() == 1 { 0 } else { j }] - shift)
            .collect();
        let val = |v: u8| {
            if signed {
                v as i8
            } else {
                (i32::from(v) - 128) as i8
            }
        };
        let layout = if super::isa::isa().vnni {
            let quads = k.div_ceil(4);
            let mut packed = vec![0i8; n.div_ceil(NB) * quads * NB * 4];
            let mut sums = vec![0i32; n];
            for (kk, row) in b.chunks_exact(n.max(1)).enumerate().take(k) {
                let (q, t) = (kk / 4, kk % 4);
                for (j, &v) in row.iter().enumerate() {
                    let v = val(v);
                    packed[((j / NB * quads + q) * NB + j % NB) * 4 + t] = v;
                    sums[j] += i32::from(v);
                }
            }
            Layout::Cols { packed, sums }
        } else {
            let mut t = vec![0i8; n * k];
            for (kk, row) in b.chunks_exact(n.max(1)).enumerate().take(k) {
                for (j, &v) in row.iter().enumerate() {
                    t[j * k + kk] = val(v);
                }
            }
            let ones = zb.iter().any(|&z| z != 0);
            // Signed weights sum as ONNX Runtime's u8·s8 kernels do on this CPU; unsigned ones
            // (moved into the signed domain here) as its exact u8·u8 kernels.
            let sums = if signed {
                Sums::like_onnxruntime()
            } else {
                Sums::Exact
            };
            Layout::Rows(QWeights::pack(&t, n, k, ones, sums))
        };
        Some(PackedB { k, n, layout, zb })
    }
}

/// The deepest product whose exact sums fit in i32 (`· 255 · 255`).
pub const MAX_DEPTH: usize = 32_768;

/// What the sums become.
#[derive(Clone, Copy, Debug)]
pub enum Output<'a> {
    /// MatMulInteger: the i32 sums.
    Int32,
    /// QLinearMatMul: `round(acc · factor[j] + zy)` saturated to u8 or i8 (one factor, or one
    /// per column).
    Bytes {
        factors: &'a [f64],
        zy: f64,
        signed: bool,
    },
}

/// The output: `rows × n` i32, or bytes for [`Output::Bytes`].
pub enum Dst<'a> {
    Bytes(&'a mut [u8]),
    Int32(&'a mut [i32]),
}

/// The rows of `A` (`rows × k` bytes, row-major; `signed`: int8 bits; `za` its zero point in
/// its domain) times `b`, into `dst`. `None` when the sizes do not match.
pub fn run(
    a: &[u8],
    signed: bool,
    za: i32,
    b: &PackedB,
    out: &Output<'_>,
    dst: Dst<'_>,
) -> Option<()> {
    let (k, n) = (b.k, b.n);
    let rows = a.len().checked_div(k).unwrap_or(0);
    if rows * k != a.len() || k == 0 || n == 0 {
        return None;
    }
    let za = if signed { za + 128 } else { za };
    // Pieces of whole tiles of rows, about four per thread; `store(row, sums, dst)` writes
    // one output row.
    let per = match b.layout {
        Layout::Rows(_) => crate::par::chunk_len(rows, NR, NR),
        Layout::Cols { .. } => crate::par::chunk_len(rows, MA, MA),
    };
    fn split<T: Send>(
        d: &mut [T],
        (rows, n, per): (usize, usize, usize),
        (a, signed, za, b): (&[u8], bool, i32, &PackedB),
        store: impl Fn(&[i32], &mut [T]) + Sync + Send,
    ) -> Option<()> {
        if d.len() != rows * n {
            return None;
        }
        crate::par::for_each_chunk(d, per * n, |t, d| {
            let count = d.len() / n;
            let put = |j: usize, row: &[i32]| store(row, &mut d[j * n..][..n]);
            match &b.layout {
                Layout::Rows(w) => piece(a, signed, b, w, t * per, count, za, put),
                #[cfg(target_arch = "x86_64")]
                Layout::Cols { packed, sums } => {
                    cols_piece(a, signed, b, (packed, sums), t * per, count, za, put)
                }
                #[cfg(not(target_arch = "x86_64"))]
                Layout::Cols { .. } => unreachable!("packed for VNNI on a CPU without it"),
            }
        });
        Some(())
    }
    let geo = (rows, n, per);
    let args = (a, signed, za, b);
    match (out, dst) {
        (Output::Int32, Dst::Int32(d)) => split(d, geo, args, |row, d| d.copy_from_slice(row)),
        (
            Output::Bytes {
                factors,
                zy,
                signed,
            },
            Dst::Bytes(d),
        ) => split(d, geo, args, |row, d| {
            if factors.len() == 1 {
                super::qconv::requantize(row, (0.0, factors[0], *zy), *signed, d);
            } else {
                super::qconv::requantize_each(row, factors, *zy, *signed, d);
            }
        }),
        _ => None,
    }
}

/// `count` rows of the product from row `r0` on [`qgemm`] (`w`: `b`'s [`Layout::Rows`]):
/// `store(j, sums)` for each, `j` from 0.
#[allow(clippy::too_many_arguments)]
fn piece(
    a: &[u8],
    signed: bool,
    b: &PackedB,
    w: &QWeights,
    r0: usize,
    count: usize,
    za: i32,
    mut store: impl FnMut(usize, &[i32]),
) {
    let k = b.k;
    let mut panel = vec![0u8; qgemm::panel_len(k)];
    let mut tile = vec![0i32; qgemm::tile_len(w)];
    let mut row = vec![0i32; b.n];
    qgemm::qgemm(
        w,
        Cols::PByK { x: a, ld: k },
        r0..r0 + count,
        if signed {
            XBytes::Int8
        } else {
            XBytes::Unsigned
        },
        (&mut panel, &mut tile),
        |p0, cnt, tile| {
            for j in 0..cnt {
                correct(b, w, za, tile, j, &mut row);
                store(p0 - r0 + j, &row);
            }
        },
    );
}

/// [`piece`] on the VNNI kernel (`cols`: `b`'s [`Layout::Cols`]): [`MA`] rows of `A` at a
/// time against every block of [`NB`] columns, each row corrected for the zero points:
/// `Σ (a - za)(b - zb) = Σ a·b - za·Σ b - zb·Σ a + k·za·zb`, wrapping (see [`super::qconv`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn cols_piece(
    a: &[u8],
    signed: bool,
    b: &PackedB,
    (packed, sums): (&[i8], &[i32]),
    r0: usize,
    count: usize,
    za: i32,
    mut store: impl FnMut(usize, &[i32]),
) {
    let (k, n) = (b.k, b.n);
    let quads = k.div_ceil(4);
    let kq = quads * 4;
    let a = &a[r0 * k..][..count * k];
    // The kernel reads four bytes at a time: rows padded to whole quads, and int8 moved into
    // the unsigned domain, in a copy where either is needed.
    let copy: Vec<u8>;
    let (a, lda) = if kq == k && !signed {
        (a, k)
    } else {
        let fl = if signed { 0x80 } else { 0 };
        let mut c = vec![0u8; count * kq];
        for (d, s) in c.chunks_exact_mut(kq).zip(a.chunks_exact(k)) {
            for (d, &v) in d.iter_mut().zip(s) {
                *d = v ^ fl;
            }
        }
        copy = c;
        (&copy[..], kq)
    };
    let with_zb = b.zb.iter().any(|&z| z != 0);
    // The terms of each column that do not depend on the row: `k·za·zb - za·Σ b`.
    let kz = k as i32;
    let offsets: Vec<i32> =
        b.zb.iter()
            .zip(sums)
            .map(|(&zb, &bs)| {
                kz.wrapping_mul(za)
                    .wrapping_mul(zb)
                    .wrapping_sub(za.wrapping_mul(bs))
            })
            .collect();
    let mut tile = [0i32; MA * NB];
    let mut rows = vec![0i32; MA * n];
    for t0 in (0..count).step_by(MA) {
        let m = MA.min(count - t0);
        let at = &a[t0 * lda..][..(m - 1) * lda + kq];
        for (nb, bq) in packed.chunks_exact(quads * NB * 4).enumerate() {
            let c0 = nb * NB;
            let w = NB.min(n - c0);
            // SAFETY: the level is VNNI only on a CPU with AVX-512 VNNI (`Layout::Cols` is
            // packed only then); `at` holds `m` rows of `kq` bytes `lda` apart and `bq` one
            // block of `quads` quads (both sliced above).
            unsafe { x86::tile(at, lda, m, bq, quads, &mut tile) };
            for r in 0..m {
                let row = &mut rows[r * n + c0..][..w];
                let t = &tile[r * NB..][..w];
                let off = &offsets[c0..][..w];
                if with_zb {
                    let asum: i32 = at[r * lda..][..k].iter().map(|&v| i32::from(v)).sum();
                    for (((o, &v), &f), &zb) in row.iter_mut().zip(t).zip(off).zip(&b.zb[c0..]) {
                        *o = v.wrapping_add(f).wrapping_sub(zb.wrapping_mul(asum));
                    }
                } else {
                    for ((o, &v), &f) in row.iter_mut().zip(t).zip(off) {
                        *o = v.wrapping_add(f);
                    }
                }
            }
        }
        for r in 0..m {
            store(t0 + r, &rows[r * n..][..n]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MA, NB};
    use std::arch::x86_64::*;

    /// The sums of `m` rows of `a` (`lda` apart, each `4 · quads` bytes read) by one block of
    /// [`NB`] packed columns into `out[r * NB + j]`, with `vpdpbusd`: four bytes of a row
    /// broadcast against the block's 64-byte vectors.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and AVX-512 VNNI; `m` is 1..=[`MA`]; `a` holds
    /// `(m - 1) · lda + 4 · quads` bytes and `b` `quads · NB · 4`.
    pub(super) unsafe fn tile(
        a: &[u8],
        lda: usize,
        m: usize,
        b: &[i8],
        quads: usize,
        out: &mut [i32; MA * NB],
    ) {
        assert!(
            (1..=MA).contains(&m)
                && a.len() > (m - 1) * lda + 4 * quads - 1
                && b.len() >= quads * NB * 4
        );
        // SAFETY: the caller's contract on the CPU; sizes asserted.
        unsafe {
            match m {
                1 => rows::<1>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                2 => rows::<2>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                3 => rows::<3>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                4 => rows::<4>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                5 => rows::<5>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                6 => rows::<6>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                7 => rows::<7>(a.as_ptr(), lda, b.as_ptr(), quads, out),
                _ => rows::<8>(a.as_ptr(), lda, b.as_ptr(), quads, out),
            }
        }
    }

    /// [`tile`] for `R` rows.
    ///
    /// # Safety
    /// As for [`tile`], with `m = R`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn rows<const R: usize>(
        a: *const u8,
        lda: usize,
        b: *const i8,
        quads: usize,
        out: &mut [i32; MA * NB],
    ) {
        const { assert!(NB == 32 && R <= MA) };
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        for q in 0..quads {
            // SAFETY: quad `q` of the block and of each row lies inside them (contract).
            unsafe {
                let bq = b.add(q * NB * 4);
                let b0 = _mm512_loadu_si512(bq.cast());
                let b1 = _mm512_loadu_si512(bq.add(64).cast());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av =
                        _mm512_set1_epi32(a.add(r * lda + 4 * q).cast::<i32>().read_unaligned());
                    acc[0] = _mm512_dpbusd_epi32(acc[0], av, b0);
                    acc[1] = _mm512_dpbusd_epi32(acc[1], av, b1);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: row `r` of `out` has NB = 32 i32s.
            unsafe {
                let o = out.as_mut_ptr().add(r * NB);
                _mm512_storeu_si512(o.cast(), acc[0]);
                _mm512_storeu_si512(o.add(16).cast(), acc[1]);
            }
        }
    }
}

crate::multiversion! {
/// Column `j` of a tile across `B`'s columns, corrected for the zero points:
/// `Σ (a - za)(b - zb) = Σ a·b - za·Σ b - zb·Σ a + k·za·zb`, wrapping (see [`super::qconv`]).
fn correct(b: &PackedB, w: &QWeights, za: i32, tile: &[i32], j: usize, row: &mut [i32]) {
    let n = b.n;
    let sums = w.row_sums();
    let colsum = if w.rows() > n { tile[n * NR + j] } else { 0 };
    let k = b.k as i32;
    for (c, o) in row.iter_mut().enumerate() {
        let zb = b.zb[c];
        *o = tile[c * NR + j]
            .wrapping_add(k.wrapping_mul(zb).wrapping_mul(za))
            .wrapping_sub(za.wrapping_mul(sums[c]))
            .wrapping_sub(zb.wrapping_mul(colsum));
    }
}
}
