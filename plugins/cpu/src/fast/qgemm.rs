//! The integer GEMM of the quantized ops: `C[r][p] = Σ_k W[r][k] · X[k][p]`, with `W` signed
//! bytes (weights, packed once by [`QWeights::pack`]) and `X` unsigned bytes (activations,
//! packed a panel of [`NR`] columns at a time), summed exactly in i32.
//!
//! Both operands are packed in quads of four consecutive `k`: a quad of one weight row is one
//! 32-bit word, a panel's quad is [`NR`] such words. Four kernels compute a tile of [`MR`]
//! rows by [`NR`] columns from them:
//!
//! - **AVX-512 VNNI**: one `vpdpbusd` adds 4 products into each of 16 lanes (64 products per
//!   instruction), the weight quad broadcast from memory;
//! - **AVX-VNNI**: the same instruction on 8 lanes (VEX-encoded);
//! - **AVX2**: the bytes widened to 16 bits (even and odd bytes of each quad apart) and
//!   multiplied with `vpmaddwd`. Not `vpmaddubsw`: its 16-bit pair sums saturate (255·127·2 does
//!   not fit), which would make some answers silently wrong;
//! - **portable**: plain i32 loops.
//!
//! None of them can overflow for a depth up to [`MAX_DEPTH`]: every partial sum stays below
//! `2^31` in magnitude.
//!
//! [`Sums::PairsSaturated`] sums the products as ONNX Runtime's 8-bit GEMM does on the CPUs of
//! the `avx2` level (its AVX2 and AVX-512BW kernels, `vpmaddubsw`): the products of `k` and
//! `k + 1` (`k` even) added and saturated to i16 before they reach the i32 sum. With unsigned
//! activations and signed weights the pair can exceed i16 (255·127·2), and ONNX Runtime's answer
//! is then the saturated one; weights packed so give the same bits (see
//! [`Sums::like_onnxruntime`]). Int8 activations are summed exactly whatever the weights were
//! packed for, as ONNX Runtime's s8·s8 kernels sum them.

use super::isa;

/// Weight rows per tile.
pub const MR: usize = 8;
/// Columns per panel.
pub const NR: usize = 32;
/// The deepest product the kernels sum exactly in i32: `MAX_DEPTH · 255 · 128 < 2^31`.
pub const MAX_DEPTH: usize = 65_536;

/// How a tile sums its products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sums {
    /// Exactly, in i32.
    Exact,
    /// Each pair of products (`k` and `k + 1`, `k` even) saturated to i16 first.
    PairsSaturated,
}

/// The environment variable that makes every 8-bit sum exact: `EPX_CPU_INTEGER_SUMS=exact`
/// (answers then differ from ONNX Runtime's where it saturates a pair).
pub const ENV_INTEGER_SUMS: &str = "EPX_CPU_INTEGER_SUMS";

impl Sums {
    /// How ONNX Runtime's 8-bit kernels sum unsigned activations by signed weights on the
    /// CPUs of the level this thread runs ([`super::Isa::saturating_pairs`]): in saturated
    /// pairs at `avx2`, exactly at every other level. Weights that are unsigned in the model
    /// are summed exactly everywhere (its u8·u8 kernels widen to 16 bits): pack those with
    /// [`Sums::Exact`]. [`ENV_INTEGER_SUMS`] makes every sum exact.
    pub fn like_onnxruntime() -> Sums {
        #[cfg(test)]
        if let Some(forced) = FORCED.with(std::cell::Cell::get) {
            return forced;
        }
        static EXACT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let exact =
            *EXACT.get_or_init(|| std::env::var(ENV_INTEGER_SUMS).is_ok_and(|v| v == "exact"));
        if !exact && isa().saturating_pairs {
            Sums::PairsSaturated
        } else {
            Sums::Exact
        }
    }
}

#[cfg(test)]
thread_local! {
    static FORCED: std::cell::Cell<Option<Sums>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with weights packed for `sums` on this thread (tests of one rule or the other).
#[cfg(test)]
pub(crate) fn with_sums<R>(sums: Sums, f: impl FnOnce() -> R) -> R {
    let before = FORCED.with(|c| c.replace(Some(sums)));
    let r = f();
    FORCED.with(|c| c.set(before));
    r
}

/// A weight matrix (`rows × depth`, signed bytes) packed for [`qgemm`].
#[derive(Debug, Clone)]
pub struct QWeights {
    rows: usize,
    depth: usize,
    sums: Sums,
    /// `[rows.div_ceil(MR)][depth.div_ceil(4)][MR][4]`, zero-padded.
    packed: Vec<i8>,
    /// `Σ_k W[r][k]` of each row.
    row_sums: Vec<i32>,
}

impl QWeights {
    /// Packs `w` (`rows × depth`, row-major). With `ones_row`, one more row of ones follows, so
    /// that row `rows` of every tile holds the column sums `Σ_k X[k][p]` (exact under either
    /// [`Sums`]: a pair of ones times bytes stays below 511).
    pub fn pack(w: &[i8], rows: usize, depth: usize, ones_row: bool, sums: Sums) -> Self {
        assert_eq!(w.len(), rows * depth, "weights are rows × depth");
        let all = rows + usize::from(ones_row);
        let quads = depth.div_ceil(4);
        let blocks = all.div_ceil(MR);
        let mut packed = vec![0i8; blocks * quads * MR * 4];
        for r in 0..all {
            let (b, rr) = (r / MR, r % MR);
            for k in 0..depth {
                let v = if r < rows { w[r * depth + k] } else { 1 };
                packed[((b * quads + k / 4) * MR + rr) * 4 + k % 4] = v;
            }
        }
        let row_sums = (0..rows)
            .map(|r| w[r * depth..][..depth].iter().map(|&v| i32::from(v)).sum())
            .collect();
        QWeights {
            rows: all,
            depth,
            sums,
            packed,
            row_sums,
        }
    }

    /// The rows of every tile, the ones row included.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// `Σ_k W[r][k]` of each weight row (the ones row excluded).
    pub fn row_sums(&self) -> &[i32] {
        &self.row_sums
    }

    fn quads(&self) -> usize {
        self.depth.div_ceil(4)
    }
}

/// Where the columns of `X` come from.
#[derive(Clone, Copy, Debug)]
pub enum Cols<'a> {
    /// `X` itself, row-major (`depth × cols`, row stride `ld`): the column matrix of a
    /// convolution.
    KByP { x: &'a [u8], ld: usize },
    /// `Xᵀ`, row-major (`cols × depth`, row stride `ld`): the rows of a MatMul's left operand.
    PByK { x: &'a [u8], ld: usize },
    /// Quads already interleaved: quad `q` of column `p` is the four bytes at
    /// `x[offs[q] + 4 · p..]`, so that a panel's quad is one run of `4 · NR` bytes (a
    /// convolution's input in channel quads, each kernel tap an offset into it). The depth is
    /// `4 · offs.len()`.
    Quads { x: &'a [u8], offs: &'a [usize] },
}

/// The bytes of a panel of one [`QWeights`]' depth.
pub fn panel_len(depth: usize) -> usize {
    depth.div_ceil(4) * NR * 4
}

/// The length of the tile buffer [`qgemm`] hands its sink.
pub fn tile_len(w: &QWeights) -> usize {
    w.rows().div_ceil(MR) * MR * NR
}

/// What the bytes of `X` are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XBytes {
    /// uint8 activations, summed as the weights were packed to sum them.
    Unsigned,
    /// int8 activations: each byte read as `x ^ 0x80` (the activation plus 128).
    Int8,
    /// int8 activations already moved to the unsigned domain (`x ^ 0x80`) by the caller.
    Int8Flipped,
}

/// Computes `C = W · X` over the columns `cols` of `x`, one panel of [`NR`] columns at a time:
/// `sink(p0, n, tile)` gets columns `p0..p0 + n` as `tile[r * NR + j]` for every row `r` of `w`
/// (the ones row included). Int8 activations ([`XBytes`]) are summed exactly, as ONNX Runtime's
/// s8·s8 kernels sum them, whatever the weights were packed for. `panel` and `tile` are
/// scratch of [`panel_len`] and [`tile_len`].
pub fn qgemm(
    w: &QWeights,
    x: Cols<'_>,
    cols: std::ops::Range<usize>,
    bytes: XBytes,
    (panel, tile): (&mut [u8], &mut [i32]),
    mut sink: impl FnMut(usize, usize, &[i32]),
) {
    let flip = bytes == XBytes::Int8;
    assert!(w.depth() <= MAX_DEPTH, "depth {} is too deep", w.depth());
    let quads = w.quads();
    let panel = &mut panel[..quads * NR * 4];
    let tile = &mut tile[..tile_len(w)];
    let blocks = w.rows().div_ceil(MR);
    let level = Level::current();
    let mut p0 = cols.start;
    while p0 < cols.end {
        let n = NR.min(cols.end - p0);
        pack_panel(x, w.depth(), p0, n, flip, panel, level);
        for b in 0..blocks {
            let wq = &w.packed[b * quads * MR * 4..][..quads * MR * 4];
            let t: &mut [i32; MR * NR] = (&mut tile[b * MR * NR..][..MR * NR])
                .try_into()
                .expect("a tile");
            let sums = if bytes == XBytes::Unsigned {
                w.sums
            } else {
                Sums::Exact
            };
            tile_kernel(level, sums, wq, panel, quads, t);
        }
        sink(p0, n, tile);
        p0 += n;
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Level {
    Vnni,
    AvxVnni,
    Avx2,
    Portable,
}

impl Level {
    fn current() -> Level {
        let i = isa();
        if i.vnni {
            Level::Vnni
        } else if i.avx_vnni {
            Level::AvxVnni
        } else if i.wide {
            Level::Avx2
        } else {
            Level::Portable
        }
    }
}

fn tile_kernel(
    level: Level,
    sums: Sums,
    w: &[i8],
    b: &[u8],
    quads: usize,
    out: &mut [i32; MR * NR],
) {
    assert!(w.len() >= quads * MR * 4 && b.len() >= quads * NR * 4);
    if sums == Sums::PairsSaturated {
        #[cfg(target_arch = "x86_64")]
        if level != Level::Portable {
            // SAFETY: every wide level runs only on a CPU with AVX2; sizes asserted above.
            unsafe { x86::tile_avx2_pairs(w.as_ptr(), b.as_ptr(), quads, out) };
            return;
        }
        return tile_portable_pairs(w, b, quads, out);
    }
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is VNNI only on a CPU with AVX-512F/BW and VNNI (its row of
        // `ISAS`); the slices hold `quads` quads of the tile's rows and columns (asserted).
        Level::Vnni => unsafe { x86::tile_vnni(w.as_ptr(), b.as_ptr(), quads, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is AVX-VNNI only on a CPU with AVX2 and AVX-VNNI (its row of
        // `ISAS`); sizes as above.
        Level::AvxVnni => unsafe { x86::tile_avx_vnni(w.as_ptr(), b.as_ptr(), quads, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is AVX2 only on a CPU with AVX2; sizes as above.
        Level::Avx2 => unsafe { x86::tile_avx2(w.as_ptr(), b.as_ptr(), quads, out) },
        _ => tile_portable(w, b, quads, out),
    }
}

/// The tile in plain i32 arithmetic, in the same packed layout.
fn tile_portable(w: &[i8], b: &[u8], quads: usize, out: &mut [i32; MR * NR]) {
    out.fill(0);
    for q in 0..quads {
        let bq = &b[q * NR * 4..][..NR * 4];
        let wq = &w[q * MR * 4..][..MR * 4];
        for r in 0..MR {
            let wr = &wq[r * 4..][..4];
            let o = &mut out[r * NR..][..NR];
            for (j, o) in o.iter_mut().enumerate() {
                let bj = &bq[j * 4..][..4];
                *o += (0..4)
                    .map(|t| i32::from(wr[t]) * i32::from(bj[t]))
                    .sum::<i32>();
            }
        }
    }
}

/// [`tile_portable`] with each pair of products saturated to i16 ([`Sums::PairsSaturated`]).
fn tile_portable_pairs(w: &[i8], b: &[u8], quads: usize, out: &mut [i32; MR * NR]) {
    let pair = |w: &[i8], x: &[u8]| -> i32 {
        let s = i32::from(w[0]) * i32::from(x[0]) + i32::from(w[1]) * i32::from(x[1]);
        s.clamp(i32::from(i16::MIN), i32::from(i16::MAX))
    };
    out.fill(0);
    for q in 0..quads {
        let bq = &b[q * NR * 4..][..NR * 4];
        let wq = &w[q * MR * 4..][..MR * 4];
        for r in 0..MR {
            let wr = &wq[r * 4..][..4];
            let o = &mut out[r * NR..][..NR];
            for (j, o) in o.iter_mut().enumerate() {
                let bj = &bq[j * 4..][..4];
                *o += pair(&wr[..2], &bj[..2]) + pair(&wr[2..], &bj[2..]);
            }
        }
    }
}

/// Packs columns `p0..p0 + n` of `x` into `panel` (`[quads][NR][4]`; columns past `n` and
/// depths past `depth` zero).
fn pack_panel(
    x: Cols<'_>,
    depth: usize,
    p0: usize,
    n: usize,
    flip: bool,
    panel: &mut [u8],
    level: Level,
) {
    let quads = depth.div_ceil(4);
    let fl = if flip { 0x80 } else { 0 };
    match x {
        Cols::KByP { x, ld } => {
            for q in 0..quads {
                let out: &mut [u8; NR * 4] = (&mut panel[q * NR * 4..][..NR * 4])
                    .try_into()
                    .expect("a quad");
                let k0 = 4 * q;
                #[cfg(target_arch = "x86_64")]
                if level != Level::Portable && n == NR && k0 + 4 <= depth {
                    let rows = [0, 1, 2, 3].map(|t| &x[(k0 + t) * ld + p0..][..NR]);
                    // SAFETY: AVX2 is present at every wide level; each row holds NR bytes.
                    unsafe { x86::interleave4(rows, fl, out) };
                    continue;
                }
                let _ = level;
                out.fill(0);
                for t in 0..4.min(depth - k0) {
                    let row = &x[(k0 + t) * ld + p0..][..n];
                    for (j, &v) in row.iter().enumerate() {
                        out[j * 4 + t] = v ^ fl;
                    }
                }
            }
        }
        Cols::Quads { x, offs } => {
            assert_eq!(offs.len() * 4, depth, "a quad per offset");
            let fl = u32::from_ne_bytes([fl; 4]);
            for (q, &off) in offs.iter().enumerate() {
                let out = &mut panel[q * NR * 4..][..NR * 4];
                let (head, rest) = out.split_at_mut(4 * n);
                head.copy_from_slice(&x[off + 4 * p0..][..4 * n]);
                rest.fill(0);
                if fl != 0 {
                    for word in head.chunks_exact_mut(4) {
                        let v = u32::from_ne_bytes(word.try_into().unwrap_or([0; 4])) ^ fl;
                        word.copy_from_slice(&v.to_ne_bytes());
                    }
                }
            }
        }
        Cols::PByK { x, ld } => {
            let full = depth / 4;
            for j in 0..NR {
                let row = (j < n).then(|| &x[(p0 + j) * ld..][..depth]);
                for q in 0..quads {
                    let o = &mut panel[(q * NR + j) * 4..][..4];
                    match row {
                        Some(row) if q < full => {
                            let v =
                                u32::from_ne_bytes(row[4 * q..][..4].try_into().unwrap_or([0; 4]));
                            let f = u32::from_ne_bytes([fl; 4]);
                            o.copy_from_slice(&(v ^ f).to_ne_bytes());
                        }
                        Some(row) => {
                            o.fill(0);
                            for (t, &v) in row[4 * q..].iter().enumerate() {
                                o[t] = v ^ fl;
                            }
                        }
                        None => o.fill(0),
                    }
                }
            }
        }
    }
}

/// Interleaves four rows of bytes into quads: `out[4 · j + t] = rows[t][j] ^ flip` for every
/// column `j` of the rows (all of one length; `out` four times it).
pub fn interleave_rows(rows: [&[u8]; 4], flip: u8, out: &mut [u8]) {
    let len = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == len) && out.len() == 4 * len);
    let mut j = 0;
    #[cfg(target_arch = "x86_64")]
    if Level::current() != Level::Portable {
        while j + NR <= len {
            let chunk: &mut [u8; NR * 4] =
                (&mut out[4 * j..][..NR * 4]).try_into().expect("a quad");
            let r = [0, 1, 2, 3].map(|t| &rows[t][j..][..NR]);
            // SAFETY: AVX2 is present at every wide level; each row holds NR bytes from `j`.
            unsafe { x86::interleave4(r, flip, chunk) };
            j += NR;
        }
    }
    for (col, quad) in out[4 * j..].chunks_exact_mut(4).enumerate() {
        for (t, b) in quad.iter_mut().enumerate() {
            *b = rows[t][j + col] ^ flip;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// The tile with `vpdpbusd`: 2 × 16 columns by [`MR`] rows of i32 accumulators.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and AVX-512 VNNI; `w` holds `quads · MR · 4` bytes and
    /// `b` `quads · NR · 4`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile_vnni(
        w: *const i8,
        b: *const u8,
        quads: usize,
        out: &mut [i32; MR * NR],
    ) {
        let mut acc = [[_mm512_setzero_si512(); 2]; MR];
        for q in 0..quads {
            // SAFETY: quad `q` of the panel and of the weights lies inside them (contract).
            unsafe {
                let bq = b.add(q * NR * 4);
                let b0 = _mm512_loadu_si512(bq.cast());
                let b1 = _mm512_loadu_si512(bq.add(64).cast());
                let wq = w.add(q * MR * 4);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_epi32(wq.add(r * 4).cast::<i32>().read_unaligned());
                    acc[0] = _mm512_dpbusd_epi32(acc[0], b0, wv);
                    acc[1] = _mm512_dpbusd_epi32(acc[1], b1, wv);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: row `r` of `out` has NR = 32 i32s.
            unsafe {
                let o = out.as_mut_ptr().add(r * NR);
                _mm512_storeu_si512(o.cast(), acc[0]);
                _mm512_storeu_si512(o.add(16).cast(), acc[1]);
            }
        }
    }

    /// A tile in 256-bit vectors, four rows by 16 columns of i32 accumulators at a time (8 of
    /// the 16 vector registers): each quad of the panel's bytes `x` against each row's weight
    /// quad `w` (broadcast) is added into the accumulator by `dot(acc, x, w)`.
    ///
    /// # Safety
    /// The CPU has AVX2 (and what `dot` needs); sizes as for [`tile_vnni`].
    #[inline(always)]
    unsafe fn tile_256(
        w: *const i8,
        b: *const u8,
        quads: usize,
        out: &mut [i32; MR * NR],
        dot: impl Fn(__m256i, __m256i, __m256i) -> __m256i,
    ) {
        const R: usize = 4;
        // SAFETY: inlined into callers compiled with AVX2 (their contract); quad `q` of the
        // panel and the weights lies inside them, and row `r0 + r` of `out` has NR = 32 i32s,
        // 16 of them written per half.
        unsafe {
            for r0 in (0..MR).step_by(R) {
                for half in 0..2 {
                    let mut acc = [[_mm256_setzero_si256(); 2]; R];
                    for q in 0..quads {
                        let bq = b.add(q * NR * 4 + half * 64);
                        let x0 = _mm256_loadu_si256(bq.cast());
                        let x1 = _mm256_loadu_si256(bq.add(32).cast());
                        let wq = w.add(q * MR * 4 + r0 * 4);
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let wv =
                                _mm256_set1_epi32(wq.add(r * 4).cast::<i32>().read_unaligned());
                            acc[0] = dot(acc[0], x0, wv);
                            acc[1] = dot(acc[1], x1, wv);
                        }
                    }
                    for (r, acc) in acc.iter().enumerate() {
                        let o = out.as_mut_ptr().add((r0 + r) * NR + half * 16);
                        _mm256_storeu_si256(o.cast(), acc[0]);
                        _mm256_storeu_si256(o.add(8).cast(), acc[1]);
                    }
                }
            }
        }
    }

    /// The tile with the VEX-encoded `vpdpbusd` (exact).
    ///
    /// # Safety
    /// The CPU has AVX2 and AVX-VNNI; sizes as for [`tile_vnni`].
    #[target_feature(enable = "avx2,avxvnni")]
    pub(super) unsafe fn tile_avx_vnni(
        w: *const i8,
        b: *const u8,
        quads: usize,
        out: &mut [i32; MR * NR],
    ) {
        // SAFETY: the caller's contract; the closure runs with this function's features.
        unsafe {
            tile_256(w, b, quads, out, |acc, x, wv| {
                _mm256_dpbusd_avx_epi32(acc, x, wv)
            })
        }
    }

    /// The tile with `vpmaddwd` on bytes widened to 16 bits: four rows and 16 columns at a
    /// time, exact (no 16-bit sum can saturate).
    ///
    /// # Safety
    /// The CPU has AVX2; sizes as for [`tile_vnni`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn tile_avx2(
        w: *const i8,
        b: *const u8,
        quads: usize,
        out: &mut [i32; MR * NR],
    ) {
        const R: usize = 4;
        let low = _mm256_set1_epi16(0x00ff);
        for r0 in (0..MR).step_by(R) {
            for half in 0..2 {
                let mut acc = [[_mm256_setzero_si256(); 2]; R];
                for q in 0..quads {
                    // SAFETY: quad `q` of the panel and the weights lies inside them.
                    unsafe {
                        let bq = b.add(q * NR * 4 + half * 64);
                        let x0 = _mm256_loadu_si256(bq.cast());
                        let x1 = _mm256_loadu_si256(bq.add(32).cast());
                        // Bytes 0 and 2 of each quad, and bytes 1 and 3, as u16 pairs.
                        let (e0, o0) = (_mm256_and_si256(x0, low), _mm256_srli_epi16(x0, 8));
                        let (e1, o1) = (_mm256_and_si256(x1, low), _mm256_srli_epi16(x1, 8));
                        let wq = w.add(q * MR * 4 + r0 * 4);
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let wv =
                                _mm256_set1_epi32(wq.add(r * 4).cast::<i32>().read_unaligned());
                            // The signed weights 0 and 2, and 1 and 3, as i16 pairs.
                            let we = _mm256_srai_epi16(_mm256_slli_epi16(wv, 8), 8);
                            let wo = _mm256_srai_epi16(wv, 8);
                            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(e0, we));
                            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(o0, wo));
                            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(e1, we));
                            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(o1, wo));
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    // SAFETY: row `r0 + r` of `out` has NR = 32 i32s; this half is 16 of them.
                    unsafe {
                        let o = out.as_mut_ptr().add((r0 + r) * NR + half * 16);
                        _mm256_storeu_si256(o.cast(), acc[0]);
                        _mm256_storeu_si256(o.add(8).cast(), acc[1]);
                    }
                }
            }
        }
    }

    /// [`tile_avx2`] summing as ONNX Runtime does without VNNI ([`super::Sums::PairsSaturated`]):
    /// `vpmaddubsw` (pairs of products, saturated to i16) then `vpmaddwd` by ones.
    ///
    /// # Safety
    /// The CPU has AVX2; sizes as for [`tile_vnni`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn tile_avx2_pairs(
        w: *const i8,
        b: *const u8,
        quads: usize,
        out: &mut [i32; MR * NR],
    ) {
        let ones = _mm256_set1_epi16(1);
        // SAFETY: the caller's contract; the closure runs with this function's features.
        unsafe {
            tile_256(w, b, quads, out, |acc, x, wv| {
                _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, wv), ones))
            })
        }
    }

    /// One quad of a panel from four rows of [`NR`] bytes: `out[j * 4 + t] = rows[t][j] ^ fl`.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn interleave4(rows: [&[u8]; 4], fl: u8, out: &mut [u8; NR * 4]) {
        let f = _mm256_set1_epi8(fl as i8);
        // SAFETY: each row has NR = 32 bytes (the caller slices them so).
        let [r0, r1, r2, r3] = rows
            .map(|r| unsafe { _mm256_xor_si256(_mm256_loadu_si256(r[..NR].as_ptr().cast()), f) });
        // Within each 128-bit lane: bytes of rows 0 and 1 paired, then of 2 and 3.
        let a_lo = _mm256_unpacklo_epi8(r0, r1);
        let a_hi = _mm256_unpackhi_epi8(r0, r1);
        let b_lo = _mm256_unpacklo_epi8(r2, r3);
        let b_hi = _mm256_unpackhi_epi8(r2, r3);
        // Quads: columns 0-3|16-19, 4-7|20-23, 8-11|24-27, 12-15|28-31.
        let q0 = _mm256_unpacklo_epi16(a_lo, b_lo);
        let q1 = _mm256_unpackhi_epi16(a_lo, b_lo);
        let q2 = _mm256_unpacklo_epi16(a_hi, b_hi);
        let q3 = _mm256_unpackhi_epi16(a_hi, b_hi);
        let o = out.as_mut_ptr();
        // SAFETY: `out` has 128 bytes: four stores of 32.
        unsafe {
            _mm256_storeu_si256(o.cast(), _mm256_permute2x128_si256(q0, q1, 0x20));
            _mm256_storeu_si256(o.add(32).cast(), _mm256_permute2x128_si256(q2, q3, 0x20));
            _mm256_storeu_si256(o.add(64).cast(), _mm256_permute2x128_si256(q0, q1, 0x31));
            _mm256_storeu_si256(o.add(96).cast(), _mm256_permute2x128_si256(q2, q3, 0x31));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fast::{ISAS, with_isa};

    /// A stream of pseudo-random words (a linear congruential generator's high bits).
    pub(crate) fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            s >> 33
        }
    }

    /// Every level gives the exact integer products, on both column layouts, with flipped
    /// bytes and the ones row, for shapes that leave partial tiles, panels and quads, and with
    /// the extreme values that would saturate 16-bit pair sums.
    /// Summing in saturated pairs gives the same bits at every level, and those of a plain
    /// loop that saturates each pair (`k` even and `k + 1`) to i16.
    #[test]
    fn saturated_pairs_agree_at_every_level() {
        let mut rnd = lcg(3);
        let (rows, depth, cols) = (11, 38, 41);
        let w: Vec<i8> = (0..rows * depth)
            .map(|i| if i % 3 == 0 { 127 } else { rnd() as i8 })
            .collect();
        let x: Vec<u8> = (0..depth * cols)
            .map(|i| if i % 2 == 0 { 255 } else { rnd() as u8 })
            .collect();
        let want = |r: usize, p: usize| -> i32 {
            (0..depth)
                .step_by(2)
                .map(|k| {
                    let term = |k: usize| {
                        if k >= depth {
                            return 0;
                        }
                        let wv = if r < rows {
                            i32::from(w[r * depth + k])
                        } else {
                            1
                        };
                        wv * i32::from(x[k * cols + p])
                    };
                    (term(k) + term(k + 1)).clamp(-32768, 32767)
                })
                .sum()
        };
        let packed = QWeights::pack(&w, rows, depth, true, Sums::PairsSaturated);
        let mut saturated = 0;
        for isa in ISAS.iter().filter(|i| i.fast) {
            let ran = with_isa(isa, || {
                let mut panel = vec![0u8; panel_len(depth)];
                let mut tile = vec![0i32; tile_len(&packed)];
                qgemm(
                    &packed,
                    Cols::KByP { x: &x, ld: cols },
                    0..cols,
                    XBytes::Unsigned,
                    (&mut panel, &mut tile),
                    |p0, n, t| {
                        for r in 0..=rows {
                            for j in 0..n {
                                assert_eq!(t[r * NR + j], want(r, p0 + j), "{} r {r}", isa.name);
                            }
                        }
                    },
                );
            });
            if ran.is_none() {
                println!("{}: skipped (this CPU lacks it)", isa.name);
            }
        }
        // The data do saturate some pairs (else the test would prove nothing).
        for k in (0..depth).step_by(2) {
            let pair = i32::from(w[k]) * i32::from(x[k * cols])
                + i32::from(w[k + 1]) * i32::from(x[(k + 1) * cols]);
            saturated += usize::from(!(-32768..=32767).contains(&pair));
        }
        assert!(saturated > 0);
    }

    #[test]
    fn every_level_is_exact() {
        let mut rnd = lcg(7);
        for &(rows, depth, cols) in &[
            (1, 1, 1),
            (8, 4, 32),
            (13, 27, 45),
            (3, 130, 70),
            (17, 9, 33),
            (5, 12, 40),
        ] {
            for extreme in [false, true] {
                let w: Vec<i8> = (0..rows * depth)
                    .map(|_| if extreme { -128 } else { rnd() as i8 })
                    .collect();
                let x: Vec<u8> = (0..depth * cols)
                    .map(|_| if extreme { 255 } else { rnd() as u8 })
                    .collect();
                let xt: Vec<u8> = (0..cols * depth)
                    .map(|i| x[(i % depth) * cols + i / depth])
                    .collect();
                // In quads, `[depth / 4][cols][4]`, when the depth is whole quads.
                let quads = depth / 4;
                let xq: Vec<u8> = (0..quads * cols * 4)
                    .map(|i| x[(i / (cols * 4) * 4 + i % 4) * cols + i / 4 % cols])
                    .collect();
                let offs: Vec<usize> = (0..quads).map(|q| q * cols * 4).collect();
                for flip in [false, true] {
                    let want = |r: usize, p: usize| -> i64 {
                        (0..depth)
                            .map(|k| {
                                let wv = if r < rows {
                                    i64::from(w[r * depth + k])
                                } else {
                                    1
                                };
                                wv * i64::from(x[k * cols + p] ^ if flip { 0x80 } else { 0 })
                            })
                            .sum()
                    };
                    let packed = QWeights::pack(&w, rows, depth, true, Sums::Exact);
                    for isa in ISAS.iter().filter(|i| i.fast) {
                        let ran = with_isa(isa, || {
                            let mut layouts = vec![
                                Cols::KByP { x: &x, ld: cols },
                                Cols::PByK { x: &xt, ld: depth },
                            ];
                            if depth.is_multiple_of(4) {
                                layouts.push(Cols::Quads {
                                    x: &xq,
                                    offs: &offs,
                                });
                            }
                            for layout in layouts {
                                let mut panel = vec![0u8; panel_len(depth)];
                                let mut tile = vec![0i32; tile_len(&packed)];
                                let mut seen = 0;
                                qgemm(
                                    &packed,
                                    layout,
                                    0..cols,
                                    if flip { XBytes::Int8 } else { XBytes::Unsigned },
                                    (&mut panel, &mut tile),
                                    |p0, n, t| {
                                        for r in 0..=rows {
                                            for j in 0..n {
                                                assert_eq!(
                                                    i64::from(t[r * NR + j]),
                                                    want(r, p0 + j),
                                                    "{} {layout:?}: row {r} column {}",
                                                    isa.name,
                                                    p0 + j
                                                );
                                            }
                                        }
                                        seen += n;
                                    },
                                );
                                assert_eq!(seen, cols);
                            }
                        });
                        if ran.is_none() {
                            println!("qgemm: {} skipped (this CPU lacks it)", isa.name);
                        }
                    }
                }
            }
        }
    }
}
