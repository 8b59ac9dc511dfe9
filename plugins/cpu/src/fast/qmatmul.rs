//! The 8-bit matrix product fast path of QLinearMatMul and MatMulInteger: `Y = A · B` with `A`
//! `[.., M, K]` and `B` `[K, N]` (weights, packed once) or `[.., K, N]` with the same batch
//! dimensions, on the integer GEMM of [`super::qgemm`]. The GEMM computes `Bᵀ · Aᵀ`: `B`'s
//! columns are the packed rows, `A`'s rows the panel columns, and each tile is written back
//! transposed with the zero points applied and, for QLinearMatMul, requantized.

use super::qgemm::{self, Cols, NR, QWeights};

/// `B`, packed: `Bᵀ` (`n × k`) in the kernel's signed domain, with its zero points there.
#[derive(Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    w: QWeights,
    zb: Vec<i32>,
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
        let mut t = vec![0i8; n * k];
        for (kk, row) in b.chunks_exact(n.max(1)).enumerate().take(k) {
            for (j, &v) in row.iter().enumerate() {
                t[j * k + kk] = val(v);
            }
        }
        let ones = zb.iter().any(|&z| z != 0);
        Some(PackedB {
            k,
            n,
            w: QWeights::pack(&t, n, k, ones),
            zb,
        })
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
    // Pieces of whole panels of rows, about four per thread; `store(row, sums, dst)` writes
    // one output row.
    let per = crate::par::chunk_len(rows, NR, NR);
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
            piece(a, signed, b, t * per, count, za, |j, row| {
                store(row, &mut d[j * n..][..n]);
            });
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

/// `count` rows of the product from row `r0`: `store(j, sums)` for each, `j` from 0.
fn piece(
    a: &[u8],
    signed: bool,
    b: &PackedB,
    r0: usize,
    count: usize,
    za: i32,
    mut store: impl FnMut(usize, &[i32]),
) {
    let k = b.k;
    let mut panel = vec![0u8; qgemm::panel_len(k)];
    let mut tile = vec![0i32; qgemm::tile_len(&b.w)];
    let mut row = vec![0i32; b.n];
    qgemm::qgemm(
        &b.w,
        Cols::PByK { x: a, ld: k },
        r0..r0 + count,
        signed,
        (&mut panel, &mut tile),
        |p0, cnt, tile| {
            for j in 0..cnt {
                correct(b, za, tile, j, &mut row);
                store(p0 - r0 + j, &row);
            }
        },
    );
}

crate::multiversion! {
/// Column `j` of a tile across `B`'s columns, corrected for the zero points:
/// `Σ (a - za)(b - zb) = Σ a·b - za·Σ b - zb·Σ a + k·za·zb`, wrapping (see [`super::qconv`]).
fn correct(b: &PackedB, za: i32, tile: &[i32], j: usize, row: &mut [i32]) {
    let n = b.n;
    let sums = b.w.row_sums();
    let colsum = if b.w.rows() > n { tile[n * NR + j] } else { 0 };
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
