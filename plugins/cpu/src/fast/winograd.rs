//! 3×3 convolutions of stride 1 by Winograd's minimal filtering, F(2×2, 3×3).
//!
//! Each 2×2 block of outputs (a *tile*) reads a 4×4 patch `d` of each input channel. With the
//! transforms `V = Bᵀ d B` of the patches and `U = G g Gᵀ` of the 3×3 filters (both 4×4), the
//! tile is `Y = Aᵀ (Σ_c U ⊙ V) A`: for each of the 16 positions `ξ` of the 4×4 transforms, the
//! sum over input channels is one matrix product `M_ξ = U_ξ · V_ξ` (output channels × input
//! channels by input channels × tiles). Sixteen products of `m·c·tiles` multiply-adds replace
//! one of `m·(9c)·(4·tiles)`: 2.25 times fewer, for the cost of the two transforms, which are
//! additions over the tiles and vectorize along a row of tiles.
//!
//! The transforms (all exact in exact arithmetic; the only coefficient not ±1 is G's ½):
//!
//! ```text
//! Bᵀ = | 1  0 -1  0 |     G = | 1    0    0  |     Aᵀ = | 1  1  1  0 |
//!      | 0  1  1  0 |         | ½    ½    ½  |          | 0  1 -1 -1 |
//!      | 0 -1  1  0 |         | ½   -½    ½  |
//!      | 0  1  0 -1 |         | 0    0    1  |
//! ```
//!
//! Work is cut in bands of whole tile rows (so each band finishes a band of output rows of
//! every output channel, where a post-op then runs while it is in cache), sized so that the
//! band's transformed inputs and products stay in the core's cache.

use super::gemm::sgemm_raw;
use super::geometry::Conv2d;
use crate::fast::post::PostOp;
use crate::par::Disjoint;

/// Fewest input channels and output channels a group must have. With fewer, the transforms
/// (work in proportion to the channels) cost more than the multiply-adds they save (in
/// proportion to their product); [`applies`] asks more of the two together.
const MIN_CHANNELS: usize = 16;
/// Fewest tiles an image must have: the sixteen products have this many columns, and narrower
/// ones run below the GEMM's speed.
const MIN_TILES: usize = 36;
/// Fewest multiply-adds each of the sixteen products must have: below that, a product's fixed
/// costs (packing `U_ξ`) outweigh what it saves.
const MIN_PRODUCT: usize = 1 << 18;
/// Bytes of transformed inputs and products a band holds.
const BAND_BYTES: usize = 512 << 10;
/// Fewest tiles a band holds (the budget permitting fewer): the 16 products each pack their
/// `U_ξ` again, which a narrow band does not repay.
const BAND_MIN_TILES: usize = 64;

/// Whether `conv` takes this path: 3×3, stride 1, no dilation, enough channels (at least
/// [`MIN_CHANNELS`] each, and `1/c + 1/m ≤ 1/16`: the transforms' share of the work), tiles
/// and work per product.
pub(crate) fn applies(conv: &Conv2d<'_>) -> bool {
    let g = conv.geo;
    let group = conv.group.max(1);
    let (cg, mg) = (conv.c / group, conv.m / group);
    let tiles = conv.oh().div_ceil(2) * conv.ow().div_ceil(2);
    channels_suffice(cg, mg)
        && conv.kh == 3
        && conv.kw == 3
        && g.strides == [1, 1]
        && g.dilations == [1, 1]
        && tiles >= MIN_TILES
        && cg.saturating_mul(mg).saturating_mul(tiles) >= MIN_PRODUCT
}

/// Whether a group of `cg` input and `mg` output channels has enough of them (what
/// [`applies`] asks of the channels, for a kernel deciding whether to prepare the filters).
pub(crate) fn channels_suffice(cg: usize, mg: usize) -> bool {
    cg >= MIN_CHANNELS && mg >= MIN_CHANNELS && cg * mg >= 16 * (cg + mg)
}

/// The filters' transforms `U = G g Gᵀ`: `weights` is `[m, c / group, 3, 3]`; the result is
/// `[group, 16, m / group, c / group]` (for each group and position `ξ`, the row-major matrix
/// `U_ξ` of output by input channels).
pub(crate) fn transform_weights(weights: &[f32], m: usize, cg: usize, group: usize) -> Vec<f32> {
    let mg = m / group.max(1);
    let mut u = vec![0.0f32; 16 * m * cg];
    for (o, g3) in weights.chunks_exact(9).take(m * cg).enumerate() {
        let (mo, ci) = (o / cg, o % cg);
        let (g, mm) = (mo / mg, mo % mg);
        // G g: four rows of three.
        let mut gg = [[0.0f32; 3]; 4];
        for j in 0..3 {
            let (a, b, c) = (g3[j], g3[3 + j], g3[6 + j]);
            gg[0][j] = a;
            gg[1][j] = 0.5 * (a + b + c);
            gg[2][j] = 0.5 * (a - b + c);
            gg[3][j] = c;
        }
        // (G g) Gᵀ: each row of three becomes four.
        for (i, &[a, b, c]) in gg.iter().enumerate() {
            let row = [a, 0.5 * (a + b + c), 0.5 * (a - b + c), c];
            for (k, &v) in row.iter().enumerate() {
                u[((g * 16 + i * 4 + k) * mg + mm) * cg + ci] = v;
            }
        }
    }
    u
}

/// Adds the convolution of `x` (`[n, c, h, w]`) by the transformed filters `u`
/// ([`transform_weights`]) to `out` (`[n, m, oh, ow]`, holding the bias), then applies `post`
/// to each finished band; [`applies`] must hold.
///
/// With enough bands for the pool, each band is one task on one thread. With fewer, the bands
/// run one after the other and each of their three stages is shared across the pool: the
/// input transforms by input channel, the sixteen products by position, the output transforms
/// (and the post-op) by output channel.
pub(crate) fn run(
    conv: &Conv2d<'_>,
    x: &[f32],
    u: &[f32],
    out: &mut [f32],
    post: Option<&dyn PostOp>,
) {
    let group = conv.group.max(1);
    let (cg, mg) = (conv.c / group, conv.m / group);
    let (oh, ow) = (conv.oh(), conv.ow());
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    let (plane_in, plane_out) = (conv.h * conv.w, oh * ow);
    assert!(
        u.len() >= group * 16 * mg * cg
            && x.len() >= conv.n * conv.c * plane_in
            && out.len() >= conv.n * conv.m * plane_out,
        "winograd: buffers too small"
    );
    let per_row = 16 * (cg + mg) * tw * 4;
    let band = (BAND_BYTES / per_row.max(1))
        .max(BAND_MIN_TILES.div_ceil(tw))
        .clamp(1, th.max(1));
    let bands = th.div_ceil(band);
    let tasks = conv.n * group * bands;
    let threads = crate::par::threads();
    let split = threads > 1 && tasks >= 2 * threads;
    let dst = Disjoint::new(out);
    let task = |t: usize| {
        let (ng, b) = (t / bands, t % bands);
        let (n, g) = (ng / group, ng % group);
        let tys = (b * band, ((b + 1) * band).min(th));
        let nt = (tys.1 - tys.0) * tw;
        let oy0 = 2 * tys.0;
        let band = Band {
            conv,
            x_g: &x[(n * conv.c + g * cg) * plane_in..][..cg * plane_in],
            u_g: &u[g * 16 * mg * cg..][..16 * mg * cg],
            tys,
            nt,
            out_at: (n * conv.m + g * mg) * plane_out + oy0 * ow,
            width: ((2 * tys.1).min(oh) - oy0) * ow,
        };
        crate::par::with_buffer(&BANDS, 16 * (cg + mg) * nt, |buf| {
            band.run(buf, &dst, post, !split && threads > 1);
        });
    };
    if split {
        crate::par::for_each_index(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
}

thread_local! {
    /// Each thread's transformed inputs and products of a band, kept between bands and runs.
    static BANDS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Each thread's scratch rows for the input transforms.
    static ROWS_BUF: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One band of tile rows of one group of one image.
struct Band<'a> {
    conv: &'a Conv2d<'a>,
    /// The group's input channels, `[cg, h, w]`.
    x_g: &'a [f32],
    /// The group's transformed filters, `[16, mg, cg]`.
    u_g: &'a [f32],
    /// The tile rows.
    tys: (usize, usize),
    /// Tiles in the band.
    nt: usize,
    /// Where the band's rows of the group's first output channel start in the output.
    out_at: usize,
    /// Output elements a channel of the band has (whole output rows).
    width: usize,
}

impl Band<'_> {
    /// Computes the band into the output `dst` (and applies `post`), with `buf` of
    /// `16·(cg + mg)·nt` elements for the transformed inputs `[cg, 16, nt]` and the products
    /// `[mg, 16, nt]`; `shared` spreads each stage across the pool.
    fn run(
        &self,
        buf: &mut [f32],
        dst: &Disjoint<'_, f32>,
        post: Option<&dyn PostOp>,
        shared: bool,
    ) {
        let conv = self.conv;
        let group = conv.group.max(1);
        let (cg, mg) = (conv.c / group, conv.m / group);
        let (nt, tw, ow) = (self.nt, conv.ow().div_ceil(2), conv.ow());
        let plane_out = conv.oh() * ow;
        let (v, prod) = buf.split_at_mut(16 * cg * nt);
        let prod = &mut prod[..16 * mg * nt];
        let pieces = |len: usize| {
            if shared {
                let step = crate::par::chunk_len(len, 1, 1);
                (len.div_ceil(step), step)
            } else {
                (1, len)
            }
        };
        // The input transforms, by runs of input channels.
        let (k, step) = pieces(cg);
        let vs = Disjoint::new(v);
        let each = |i: usize| {
            let cs = (i * step, ((i + 1) * step).min(cg));
            // SAFETY: piece `i` alone writes the transforms of channels `cs`.
            let v = unsafe { vs.slice(cs.0 * 16 * nt, (cs.1 - cs.0) * 16 * nt) };
            crate::par::with_buffer(&ROWS_BUF, ROWS * (tw + 1), |rows| {
                input_band(conv, self.x_g, self.tys, cs, v, rows);
            });
        };
        run_pieces(k, shared, each);
        let v = &*v;
        // The sixteen products `M_ξ = U_ξ · V_ξ`: `V_ξ` is `v` from `ξ·nt` at a row stride
        // of `16·nt`, `M_ξ` the same within `prod`.
        let ps = Disjoint::new(prod);
        let gemm = |xi: usize| {
            // SAFETY: product `ξ` alone writes columns `ξ·nt..(ξ + 1)·nt` of each of the `mg`
            // rows of `16·nt` of `prod`, which hold them (`prod` is `16·mg·nt` long).
            unsafe {
                sgemm_raw(
                    (mg, cg, nt),
                    &self.u_g[xi * mg * cg..][..mg * cg],
                    (cg, 1),
                    (&v[xi * nt..], 16 * nt),
                    (ps.as_mut_ptr(xi * nt), 16 * nt),
                    false,
                    false,
                );
            }
        };
        run_pieces(16, shared, gemm);
        let prod = &*prod;
        // The output transforms and the post-op, by runs of output channels.
        let (k, step) = pieces(mg);
        let each = |i: usize| {
            for mm in i * step..((i + 1) * step).min(mg) {
                let at = self.out_at + mm * plane_out;
                // SAFETY: this band's rows of output channel `mm` are written by this piece
                // alone (bands and groups are disjoint, pieces split the channels).
                let o = unsafe { dst.slice(at, self.width) };
                output_band(&prod[mm * 16 * nt..][..16 * nt], nt, (tw, ow), o);
                if let Some(p) = post {
                    crate::par::with_work(p.work_len(), |work| p.apply(o, at, work));
                }
            }
        };
        run_pieces(k, shared, each);
    }
}

/// Runs `f(0..k)` across the pool when `shared`, in order otherwise.
fn run_pieces(k: usize, shared: bool, f: impl Fn(usize) + Sync + Send) {
    if shared {
        crate::par::for_each_index(k, f);
    } else {
        (0..k).for_each(f);
    }
}

/// Scratch rows of `tw + 1` elements the transforms use.
const ROWS: usize = 10;

crate::multiversion! {
/// The transforms `Bᵀ d B` of the patches of tile rows `tys.0..tys.1` of input channels
/// `cs.0..cs.1` of `x_g` (one group of one image): position `ξ` of channel `c`'s tile `t`
/// (counted from the band's first) goes to `v[((c - cs.0)·16 + ξ)·nt + t]`. `rows` is scratch
/// of [`ROWS`]`·(tw + 1)`.
fn input_band(
    conv: &Conv2d<'_>,
    x_g: &[f32],
    tys: (usize, usize),
    cs: (usize, usize),
    v: &mut [f32],
    rows: &mut [f32],
) {
    let tw = conv.ow().div_ceil(2);
    let (pt, pl) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
    let (h, w) = (conv.h, conv.w);
    let nt = (tys.1 - tys.0) * tw;
    let n = tw + 1;
    let (eo, padded) = rows[..ROWS * n].split_at_mut(8 * n);
    for c in cs.0..cs.1 {
        let plane = &x_g[c * h * w..][..h * w];
        for ty in tys.0..tys.1 {
            // Patch row r (input row 2ty + r - pt, columns from -pl), split by parity:
            // `e[r][j]` is its column 2j, `o[r][j]` its column 2j + 1; 0 outside the input.
            for r in 0..4 {
                let iy = (2 * ty + r).wrapping_sub(pt);
                let (er, or) = eo[2 * r * n..][..2 * n].split_at_mut(n);
                if iy >= h {
                    er.fill(0.0);
                    or.fill(0.0);
                    continue;
                }
                let row = &plane[iy * w..][..w];
                let padded = &mut padded[..2 * n];
                let lead = pl.min(2 * n);
                let take = w.min(2 * n - lead);
                padded[..lead].fill(0.0);
                padded[lead..lead + take].copy_from_slice(&row[..take]);
                padded[lead + take..].fill(0.0);
                for ((p, e), o) in padded.chunks_exact(2).zip(er.iter_mut()).zip(or.iter_mut()) {
                    *e = p[0];
                    *o = p[1];
                }
            }
            let row = |r: usize| {
                let (e, o) = eo[2 * r * n..][..2 * n].split_at(n);
                [&e[..tw], &e[1..], &o[..tw], &o[1..]]
            };
            let d = [row(0), row(1), row(2), row(3)];
            let at = (c - cs.0) * 16 * nt + (ty - tys.0) * tw;
            let at = |k: usize| [k, 4 + k, 8 + k, 12 + k].map(|xi| at + xi * nt);
            input_column::<0>(&d, four_mut(v, at(0), tw));
            input_column::<1>(&d, four_mut(v, at(1), tw));
            input_column::<2>(&d, four_mut(v, at(2), tw));
            input_column::<3>(&d, four_mut(v, at(3), tw));
        }
    }
}
}

/// Column `K` of the transforms `Bᵀ d B` of a row of tiles: `(d B)[r][K]` for each patch row
/// `r`, from its columns `[e[tx], e[tx + 1], o[tx], o[tx + 1]]` (`d[r]`, each `tw` long), then
/// `Bᵀ`'s row combinations, one value per tile in each of `v`'s four slices (positions `K`,
/// `4 + K`, `8 + K`, `12 + K`).
#[inline(always)]
fn input_column<const K: usize>(d: &[[&[f32]; 4]; 4], v: [&mut [f32]; 4]) {
    let [v0, v1, v2, v3] = v;
    let tw = v0.len();
    let (v1, v2, v3) = (&mut v1[..tw], &mut v2[..tw], &mut v3[..tw]);
    let col = |r: usize| {
        let [ea, eb, oa, ob] = d[r];
        let (ea, eb, oa, ob) = (&ea[..tw], &eb[..tw], &oa[..tw], &ob[..tw]);
        match K {
            0 => (ea, eb, -1.0f32),
            1 => (oa, eb, 1.0),
            2 => (eb, oa, -1.0),
            _ => (oa, ob, -1.0),
        }
    };
    let ((a0, b0, s0), (a1, b1, s1)) = (col(0), col(1));
    let ((a2, b2, s2), (a3, b3, s3)) = (col(2), col(3));
    for tx in 0..tw {
        let h0 = a0[tx] + s0 * b0[tx];
        let h1 = a1[tx] + s1 * b1[tx];
        let h2 = a2[tx] + s2 * b2[tx];
        let h3 = a3[tx] + s3 * b3[tx];
        v0[tx] = h0 - h2;
        v1[tx] = h1 + h2;
        v2[tx] = h2 - h1;
        v3[tx] = h1 - h3;
    }
}

/// Tiles of a row the output transform takes at a time.
const OUT_TILES: usize = 64;

crate::multiversion! {
/// Adds one output channel's outputs of a band, `Aᵀ M A` per tile, to `out` (the band's output
/// rows, `ow` each): position `ξ` of the band's tile `t` is `prod[ξ·stride + t]`; `(tw, ow)`
/// are the tiles and outputs a row.
fn output_band(prod: &[f32], stride: usize, dims: (usize, usize), out: &mut [f32]) {
    let (tw, ow) = dims;
    let mut ys = [0.0f32; 4 * OUT_TILES];
    for (t, orows) in out.chunks_mut(2 * ow).enumerate() {
        for t0 in (0..tw).step_by(OUT_TILES) {
            let n = OUT_TILES.min(tw - t0);
            let m = |xi: usize| &prod[xi * stride + t * tw + t0..][..n];
            let [y00, y01, y10, y11] = four_mut(&mut ys, [0, n, 2 * n, 3 * n], n);
            let (y01, y10, y11) = (&mut y01[..n], &mut y10[..n], &mut y11[..n]);
            let (m0, m1, m2, m3) = (m(0), m(1), m(2), m(3));
            let (m4, m5, m6, m7) = (m(4), m(5), m(6), m(7));
            let (m8, m9, m10, m11) = (m(8), m(9), m(10), m(11));
            let (m12, m13, m14, m15) = (m(12), m(13), m(14), m(15));
            for tx in 0..n {
                // Aᵀ M: two rows of four.
                let s00 = m0[tx] + m4[tx] + m8[tx];
                let s01 = m1[tx] + m5[tx] + m9[tx];
                let s02 = m2[tx] + m6[tx] + m10[tx];
                let s03 = m3[tx] + m7[tx] + m11[tx];
                let s10 = m4[tx] - m8[tx] - m12[tx];
                let s11 = m5[tx] - m9[tx] - m13[tx];
                let s12 = m6[tx] - m10[tx] - m14[tx];
                let s13 = m7[tx] - m11[tx] - m15[tx];
                // (Aᵀ M) A: two columns of each.
                y00[tx] = s00 + s01 + s02;
                y01[tx] = s01 - s02 - s03;
                y10[tx] = s10 + s11 + s12;
                y11[tx] = s11 - s12 - s13;
            }
            // Output columns 2·t0.. of this tile row's one or two output rows.
            let cols = (2 * n).min(ow - 2 * t0);
            for (row, (ye, yo)) in orows.chunks_mut(ow).zip([(&*y00, &*y01), (&*y10, &*y11)]) {
                let row = &mut row[2 * t0..][..cols];
                for (p, (&a, &b)) in row.chunks_exact_mut(2).zip(ye.iter().zip(yo)) {
                    p[0] += a;
                    p[1] += b;
                }
                if cols % 2 == 1 {
                    row[cols - 1] += ye[cols / 2];
                }
            }
        }
    }
}
}

/// Four disjoint slices of `len` elements of `buf` at increasing offsets `at`.
#[inline(always)]
fn four_mut(buf: &mut [f32], at: [usize; 4], len: usize) -> [&mut [f32]; 4] {
    let (_, rest) = buf.split_at_mut(at[0]);
    let (a, rest) = rest.split_at_mut(at[1] - at[0]);
    let (b, rest) = rest.split_at_mut(at[2] - at[1]);
    let (c, d) = rest.split_at_mut(at[3] - at[2]);
    [&mut a[..len], &mut b[..len], &mut c[..len], &mut d[..len]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::geometry::Spatial;

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Adds a value depending on each element's flat index, so that a post-op given the wrong
    /// offset or a segment twice shows.
    struct Mark;
    impl PostOp for Mark {
        fn accepts(&mut self, _: &[usize]) -> bool {
            true
        }
        fn work_len(&self) -> usize {
            0
        }
        fn apply(&self, seg: &mut [f32], base: usize, _: &mut [f32]) {
            for (i, v) in seg.iter_mut().enumerate() {
                *v += ((base + i) % 97) as f32;
            }
        }
    }

    /// The convolution summed directly in f64, with the post-op's marks.
    fn direct(conv: &Conv2d<'_>, x: &[f32], w: &[f32], bias: &[f32]) -> Vec<f64> {
        let (oh, ow, g) = (conv.oh(), conv.ow(), conv.geo);
        let group = conv.group;
        let (cg, mg) = (conv.c / group, conv.m / group);
        let mut out = vec![0.0f64; conv.n * conv.m * oh * ow];
        for n in 0..conv.n {
            for (m, &b) in bias.iter().enumerate().take(conv.m) {
                let gi = m / mg;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = f64::from(b);
                        for c in 0..cg {
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let iy = (oy + ky) as i64 - g.pad_begin[0] as i64;
                                    let ix = (ox + kx) as i64 - g.pad_begin[1] as i64;
                                    if iy < 0
                                        || ix < 0
                                        || iy >= conv.h as i64
                                        || ix >= conv.w as i64
                                    {
                                        continue;
                                    }
                                    let xi = ((n * conv.c + gi * cg + c) * conv.h + iy as usize)
                                        * conv.w
                                        + ix as usize;
                                    let wi = ((m * cg + c) * 3 + ky) * 3 + kx;
                                    acc += f64::from(x[xi]) * f64::from(w[wi]);
                                }
                            }
                        }
                        let at = ((n * conv.m + m) * oh + oy) * ow + ox;
                        out[at] = acc + (at % 97) as f64;
                    }
                }
            }
        }
        out
    }

    /// Every stage against a direct sum: odd and even output sizes, asymmetric padding (none,
    /// one, two on either side), groups, batches, bands of several tile rows, on one thread and
    /// on two (where both the per-band tasks and the shared stages run), with a post-op. The
    /// kernel computes any 3×3 stride-1 convolution; [`applies`] only says when it pays, so
    /// small shapes test it here.
    #[test]
    fn winograd_matches_a_direct_sum() {
        // (n, c, h, w, m, group, pad_begin, pad_end)
        type Case = (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            [usize; 2],
            [usize; 2],
        );
        let cases: [Case; 7] = [
            (1, 8, 8, 8, 8, 1, [1, 1], [1, 1]),
            (2, 12, 9, 11, 10, 1, [0, 2], [1, 0]),
            (1, 16, 7, 13, 24, 2, [2, 0], [0, 2]),
            (1, 9, 40, 37, 11, 1, [1, 1], [1, 1]),
            (3, 8, 6, 30, 8, 1, [0, 0], [0, 0]),
            (1, 64, 20, 22, 40, 1, [1, 0], [1, 1]),
            (2, 32, 64, 9, 16, 2, [1, 1], [0, 0]),
        ];
        let pool = crate::par::Pool::new(2).unwrap();
        for (i, &(n, c, h, w, m, group, pb, pe)) in cases.iter().enumerate() {
            let oh = h + pb[0] + pe[0] - 2;
            let ow = w + pb[1] + pe[1] - 2;
            let geo = Spatial {
                kernel: vec![3, 3],
                strides: vec![1, 1],
                dilations: vec![1, 1],
                pad_begin: pb.to_vec(),
                pad_end: pe.to_vec(),
                out: vec![oh, ow],
            };
            let conv = Conv2d {
                n,
                c,
                h,
                w,
                m,
                group,
                kh: 3,
                kw: 3,
                geo: &geo,
                winograd: None,
                direct: None,
            };
            let x = noise(n * c * h * w, 3 * i as u64 + 1);
            let wts = noise(m * (c / group) * 9, 3 * i as u64 + 2);
            let bias = noise(m, 3 * i as u64 + 3);
            let want = direct(&conv, &x, &wts, &bias);
            let u = transform_weights(&wts, m, c / group, group);
            for threads in [1, 2] {
                let mut out: Vec<f32> = (0..n * m * oh * ow)
                    .map(|j| bias[(j / (oh * ow)) % m])
                    .collect();
                let mut go = || run(&conv, &x, &u, &mut out, Some(&Mark));
                if threads == 2 {
                    pool.enter(go);
                } else {
                    go();
                }
                // Each output is a sum of 9·cg products of values in [-1, 1]; the transforms
                // add a few roundings of sums of that size.
                let tol = 1e-5 * (9 * c / group) as f64;
                for (j, (&got, &want)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(got) - want).abs() <= tol,
                        "case {i}, {threads} thread(s), output {j}: {got} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_stride_one_3x3_with_enough_channels_and_tiles_applies() {
        let geo = |strides: [usize; 2], dil: [usize; 2], out: [usize; 2]| Spatial {
            kernel: vec![3, 3],
            strides: strides.to_vec(),
            dilations: dil.to_vec(),
            pad_begin: vec![1, 1],
            pad_end: vec![1, 1],
            out: out.to_vec(),
        };
        let conv = |c: usize, m: usize, k: usize, geo: &Spatial| {
            applies(&Conv2d {
                n: 1,
                c,
                h: 16,
                w: 16,
                m,
                group: 1,
                kh: k,
                kw: k,
                geo,
                winograd: None,
                direct: None,
            })
        };
        let plain = geo([1, 1], [1, 1], [16, 16]);
        assert!(conv(64, 64, 3, &plain));
        assert!(conv(128, 32, 3, &plain));
        assert!(
            !conv(16, 64, 3, &plain),
            "1/16 + 1/64 of the work in the transforms"
        );
        assert!(!conv(8, 128, 3, &plain), "too few input channels");
        assert!(!conv(32, 32, 3, &plain), "products of 32 × 32 × 64");
        assert!(conv(32, 32, 3, &geo([1, 1], [1, 1], [32, 32])));
        assert!(!conv(64, 64, 5, &plain), "5×5");
        assert!(!conv(64, 64, 3, &geo([2, 2], [1, 1], [8, 8])), "stride 2");
        assert!(
            !conv(64, 64, 3, &geo([1, 1], [2, 2], [14, 14])),
            "dilation 2"
        );
        assert!(!conv(512, 512, 3, &geo([1, 1], [1, 1], [8, 8])), "16 tiles");
    }
}
