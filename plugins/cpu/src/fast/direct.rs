//! The direct f32 2-D convolution at stride 1 for small problems, where building im2col
//! columns and packing them for a GEMM cost as much as the products.
//!
//! Each input plane is copied once, with the convolution's padding, into rows of
//! `wp = ow + (kw - 1)·dw` columns laid end to end. Output `(oy, ox)` is then flat position
//! `p = oy·wp + ox`, and its tap `(ci, ky, kx)` reads padded position
//! `p + ky·dh·wp + kx·dw` of plane `ci`: every tap of a run of consecutive positions reads a
//! run of consecutive values, whatever the width of the plane. Vectors of positions (the last
//! `(kw - 1)·dw` of each row of `wp` are discarded) are multiplied by each tap's weight for a
//! block of output channels, with the accumulators of several vectors and channels held in
//! registers, the bias in them from the start; the valid positions are then copied out row by
//! row and the post-op applied to the block's planes while they are in cache.

use super::geometry::Conv2d;
use super::post::PostOp;
use crate::error::OpResult;
use crate::par::Disjoint;

/// The largest column matrix (`c / group · kh · kw` rows by output positions, bytes) of a
/// convolution that runs here; larger ones repay im2col and a GEMM.
const MAX_COLS_BYTES: usize = 512 << 10;
/// The most output channels a group may have here: with more, a GEMM's larger register block
/// reuses each input value more.
const MAX_GROUP_OUT: usize = 32;
/// Vectors of positions per register block.
const MAX_VECS: usize = 3;
/// Output channels per block of packed filters (one register block with 16 lanes; two with 8).
pub(crate) const BLOCK: usize = 8;

/// Whether the direct kernel runs `conv` on this CPU: stride 1, a kernel larger than 1×1, not
/// depthwise, rows not mostly padding, small enough, not for Winograd, and a level with AVX2
/// and FMA.
pub(crate) fn applies(conv: &Conv2d<'_>) -> bool {
    let group = conv.group.max(1);
    let (cg, mg) = (conv.c / group, conv.m / group);
    let rows = cg * conv.kh * conv.kw;
    let (oh, ow) = (conv.oh(), conv.ow());
    let positions = oh * ow;
    // The flat positions computed per plane, of which the last `(kw - 1)·dw` of each padded
    // row are discarded: at most twice the outputs.
    let wp = ow.saturating_add((conv.kw.max(1) - 1).saturating_mul(conv.geo.dilations[1]));
    let flat = oh.saturating_sub(1).saturating_mul(wp).saturating_add(ow);
    conv.geo.strides == [1, 1]
        && conv.kh * conv.kw > 1
        && channels_fit(cg, mg)
        && positions > 0
        && flat <= 2 * positions
        && rows.saturating_mul(positions).saturating_mul(4) <= MAX_COLS_BYTES
        && !super::winograd::applies(conv)
        && lanes().is_some()
}

/// The vector lanes of this CPU's kernel, if it has one.
fn lanes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = super::isa::isa();
        if isa.vnni {
            return Some(16);
        }
        if isa.wide {
            return Some(8);
        }
    }
    None
}

/// Whether a group of `cg` input and `mg` output channels may run here (what [`applies`] asks
/// of the channels, for a kernel deciding whether to pack constant filters once).
pub(crate) fn channels_fit(cg: usize, mg: usize) -> bool {
    mg > 0 && mg <= MAX_GROUP_OUT && !(cg == 1 && mg == 1)
}

/// The filters as the kernel reads them: `weights` is `[m, c / group, taps...]`; the result
/// is `[group, block, tap, BLOCK]`, [`BLOCK`] output channels of a group side by side for each
/// tap (channels past the group's last zero).
pub(crate) fn pack_weights(weights: &[f32], m: usize, taps: usize, group: usize) -> Vec<f32> {
    let group = group.max(1);
    let mg = m / group;
    let blocks = mg.div_ceil(BLOCK);
    let mut out = vec![0f32; group * blocks * taps * BLOCK];
    for (gb, dst) in out.chunks_exact_mut(taps * BLOCK).enumerate() {
        let (gi, b) = (gb / blocks, gb % blocks);
        let m0 = gi * mg + b * BLOCK;
        let mine = BLOCK.min(mg - b * BLOCK);
        for (t, lanes) in dst.chunks_exact_mut(BLOCK).enumerate() {
            for (l, d) in lanes[..mine].iter_mut().enumerate() {
                *d = weights[(m0 + l) * taps + t];
            }
        }
    }
    out
}

/// The padded layout of one image's input planes.
struct Layout {
    /// Padded row length: `ow + (kw - 1)·dw`.
    wp: usize,
    /// Floats between planes: `(oh + (kh - 1)·dh)·wp`.
    plane: usize,
    /// Flat positions that hold outputs: `(oh - 1)·wp + ow`.
    positions: usize,
}

/// Runs `conv` (which [`applies`]) into `out` (`[n, m, oh, ow]`, every element overwritten),
/// applying `post` to each block of planes when given.
pub(crate) fn run(
    conv: &Conv2d<'_>,
    x: &[f32],
    weights: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    post: Option<&dyn PostOp>,
) -> OpResult<()> {
    let Some(lanes) = lanes() else {
        return Err(crate::error::OpError::new(
            "the direct convolution needs AVX2 and FMA, which this CPU lacks",
        ));
    };
    let group = conv.group.max(1);
    let (cg, mg) = (conv.c / group, conv.m / group);
    let (oh, ow) = (conv.oh(), conv.ow());
    let g = conv.geo;
    let (dh, dw) = (g.dilations[0], g.dilations[1]);
    let wp = ow + (conv.kw - 1) * dw;
    let lay = Layout {
        wp,
        plane: (oh + (conv.kh - 1) * dh) * wp,
        positions: (oh - 1) * wp + ow,
    };
    let taps = cg * conv.kh * conv.kw;
    // Each tap's offset from an output's flat position, channel plane included.
    let offsets: Vec<usize> = (0..taps)
        .map(|t| {
            let (ci, k) = (t / (conv.kh * conv.kw), t % (conv.kh * conv.kw));
            let (ky, kx) = (k / conv.kw, k % conv.kw);
            ci * lay.plane + ky * dh * wp + kx * dw
        })
        .collect();
    let blocks = mg.div_ceil(BLOCK);
    let made;
    let wpk = match conv.direct {
        Some(p) if p.len() == group * blocks * taps * BLOCK => p,
        _ => {
            made = pack_weights(weights, conv.m, taps, group);
            &made
        }
    };
    // Biases as `[group, block, BLOCK]`, output channels past the group's last zero.
    let mut bpk = vec![0f32; group * blocks * BLOCK];
    if let Some(bias) = bias {
        for (gm, &b) in bias.iter().enumerate().take(conv.m) {
            bpk[(gm / mg * blocks) * BLOCK + gm % mg] = b;
        }
    }
    // The padded planes of every image and channel, and whole vectors of slack past the last.
    let padded = conv.n * conv.c * lay.plane + lanes * MAX_VECS;
    let mut xs = crate::scratch::take::<f32>(padded)?;
    fill(conv, &lay, x, &mut xs);
    xs.resize(padded, 0.0);

    let plane_out = oh * ow;
    let vecs = lay.positions.div_ceil(lanes);
    let tasks = conv.n * group * blocks;
    let dst = Disjoint::new(out);
    let task = |t: usize| {
        let (ng, b) = (t / blocks, t % blocks);
        let (n, gi) = (ng / group, ng % group);
        let m0 = b * BLOCK;
        let mine = BLOCK.min(mg - m0);
        let xs_g = &xs[(n * conv.c + gi * cg) * lay.plane..];
        let w = &wpk[(gi * blocks + b) * taps * BLOCK..][..taps * BLOCK];
        let bias = &bpk[(gi * blocks + b) * BLOCK..][..BLOCK];
        let first = (n * conv.m + gi * mg + m0) * plane_out;
        assert!(first + mine * plane_out <= dst.len());
        // SAFETY: task `t` alone writes the planes of its image, group and block of channels,
        // which lie inside `out` (asserted).
        let o = unsafe { dst.slice(first, mine * plane_out) };
        crate::par::with_buffer(&TILE, BLOCK * vecs * lanes, |tile| {
            compute(xs_g, &offsets, w, bias, vecs, lanes, tile);
            copy_out(tile, vecs * lanes, wp, ow, plane_out, o);
        });
        if let Some(p) = post {
            crate::par::with_work(p.work_len(), |work| p.apply(o, first, work));
        }
    };
    if crate::par::threads() > 1 && tasks > 1 {
        crate::par::for_each_index(tasks, task);
    } else {
        (0..tasks).for_each(task);
    }
    crate::scratch::give(xs);
    Ok(())
}

thread_local! {
    /// Each thread's tile of one block of output channels, kept between runs.
    static TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

crate::multiversion! {
/// Appends every input plane of `x` to `xs`, padded: each value written once, the padding as
/// zeros (no whole-buffer clear first).
fn fill(conv: &Conv2d<'_>, lay: &Layout, x: &[f32], xs: &mut Vec<f32>) {
    let (ph, pw) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
    let planes = conv.n * conv.c;
    let plane_in = conv.h * conv.w;
    if plane_in == 0 {
        xs.resize(xs.len() + planes * lay.plane, 0.0);
        return;
    }
    let (wp, rows) = (lay.wp, lay.plane / lay.wp);
    // Rows and columns past the padded extent are never read (an end pad below zero).
    let (top, left) = (ph.min(rows), pw.min(wp));
    let keep = conv.w.min(wp - left);
    for src in x.chunks_exact(plane_in).take(planes) {
        let end = xs.len() + lay.plane;
        xs.resize(xs.len() + top * wp + left, 0.0);
        for row in src.chunks_exact(conv.w).take(rows - top) {
            xs.extend_from_slice(&row[..keep]);
            // This row's right pad and the next row's left pad.
            xs.resize(xs.len() + wp - keep, 0.0);
        }
        // The bottom pad; the last row's extra left pad is taken back.
        xs.resize(end, 0.0);
    }
}
}

crate::multiversion! {
/// Copies the valid positions of each plane of `tile` (rows `wp` apart) into the planes of
/// `o` (`ow` wide, `plane` long).
fn copy_out(tile: &[f32], stride: usize, wp: usize, ow: usize, plane: usize, o: &mut [f32]) {
    for (to, from) in o.chunks_exact_mut(plane).zip(tile.chunks_exact(stride)) {
        for (oy, dst) in to.chunks_exact_mut(ow).enumerate() {
            copy_short(dst, &from[oy * wp..][..ow]);
        }
    }
}
}

/// `dst.copy_from_slice(src)` for rows of a few dozen values, in the caller's vector width
/// rather than through a call to `memmove`.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    let (d8, d_rest) = dst.as_chunks_mut::<8>();
    let (s8, s_rest) = src[..d8.len() * 8 + d_rest.len()].as_chunks::<8>();
    for (d, s) in d8.iter_mut().zip(s8) {
        *d = *s;
    }
    for (d, s) in d_rest.iter_mut().zip(s_rest) {
        *d = *s;
    }
}

/// `tile[c][p] = bias[c] + Σ_t w[t][c] · xs[p + offsets[t]]` for the [`BLOCK`] channels of a block
/// and positions `p < vecs · lanes`.
fn compute(
    xs: &[f32],
    offsets: &[usize],
    w: &[f32],
    bias: &[f32],
    vecs: usize,
    lanes: usize,
    tile: &mut [f32],
) {
    let stride = vecs * lanes;
    let reach = offsets.iter().max().copied().unwrap_or(0);
    // Every load of every block below stays inside `xs`.
    assert!(reach + stride <= xs.len());
    assert!(bias.len() == BLOCK && tile.len() >= BLOCK * stride);
    assert!(w.len() == offsets.len() * BLOCK);
    #[cfg(target_arch = "x86_64")]
    {
        let mut v = 0;
        while v < vecs {
            let n = (vecs - v).min(MAX_VECS);
            let p0 = v * lanes;
            // SAFETY: `lanes()` chose the level from this CPU's features; the loads end before
            // `reach + stride` and the stores before `BLOCK · stride` (asserted above).
            unsafe {
                if lanes == 16 {
                    match n {
                        3 => x86::block512::<3, 0>(xs, offsets, w, bias, p0, tile, stride),
                        2 => x86::block512::<2, 0>(xs, offsets, w, bias, p0, tile, stride),
                        _ => x86::block512::<1, 0>(xs, offsets, w, bias, p0, tile, stride),
                    }
                } else {
                    let (b0, b1) = bias.split_at(x86::CH256);
                    let (t0, t1) = tile.split_at_mut(x86::CH256 * stride);
                    match n {
                        3 => {
                            x86::block256::<3, 0>(xs, offsets, w, b0, p0, t0, stride);
                            x86::block256::<3, 1>(xs, offsets, w, b1, p0, t1, stride);
                        }
                        2 => {
                            x86::block256::<2, 0>(xs, offsets, w, b0, p0, t0, stride);
                            x86::block256::<2, 1>(xs, offsets, w, b1, p0, t1, stride);
                        }
                        _ => {
                            x86::block256::<1, 0>(xs, offsets, w, b0, p0, t0, stride);
                            x86::block256::<1, 1>(xs, offsets, w, b1, p0, t1, stride);
                        }
                    }
                }
            }
            v += n;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (xs, offsets, w, bias, vecs, lanes, tile);
        unreachable!("no direct kernel on this architecture");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Output channels per register block with 16 lanes (32 registers: 8 × 3 accumulators).
    pub(super) const CH512: usize = super::BLOCK;
    /// Output channels per register block with 8 lanes (16 registers: 4 × 3 accumulators).
    pub(super) const CH256: usize = 4;
    /// Defines one register block of [`super::compute`], `$name::<V, H>`: `V` vectors of
    /// positions from `p0`, for the `$ch` channels `H·$ch..(H + 1)·$ch` of a block, `$lanes`
    /// lanes a vector.
    macro_rules! block {
        ($(#[$doc:meta])* $name:ident, $feat:literal, $ch:expr, $lanes:expr,
         $set1:ident, $load:ident, $fmadd:ident, $store:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $name<const V: usize, const H: usize>(
                xs: &[f32],
                offsets: &[usize],
                w: &[f32],
                bias: &[f32],
                p0: usize,
                tile: &mut [f32],
                stride: usize,
            ) {
                let w0 = H * $ch;
                let mut acc = [[$set1(0.0); V]; $ch];
                for (a, &b) in acc.iter_mut().zip(bias) {
                    *a = [$set1(b); V];
                }
                // SAFETY: the caller's bounds (`p0` inside `xs`).
                let x = unsafe { xs.as_ptr().add(p0) };
                for (&off, wt) in offsets.iter().zip(w.as_chunks::<{ super::BLOCK }>().0) {
                    let wt: &[f32; $ch] = (&wt[w0..w0 + $ch]).try_into().unwrap();
                    // SAFETY: the caller's bounds (`p0 + off` inside `xs`).
                    let at = unsafe { x.add(off) };
                    let mut xv = [$set1(0.0); V];
                    for (r, v) in xv.iter_mut().enumerate() {
                        // SAFETY: the caller's bounds (`p0 + off + $lanes·V` inside `xs`),
                        // and the CPU's features.
                        *v = unsafe { $load(at.add(r * $lanes)) };
                    }
                    for (a, &wc) in acc.iter_mut().zip(wt) {
                        let wb = $set1(wc);
                        for (s, &v) in a.iter_mut().zip(&xv) {
                            *s = $fmadd(wb, v, *s);
                        }
                    }
                }
                // SAFETY: the caller's bounds (`p0` inside `tile`).
                let out = unsafe { tile.as_mut_ptr().add(p0) };
                for (c, a) in acc.iter().enumerate() {
                    for (r, &s) in a.iter().enumerate() {
                        // SAFETY: the caller's bounds (`$ch · stride` values in `tile`), and
                        // the CPU's features.
                        unsafe { $store(out.add(c * stride + r * $lanes), s) };
                    }
                }
            }
        };
    }

    block!(
        /// A block with 16 lanes (`H` = 0).
        ///
        /// # Safety
        /// The CPU has AVX-512F; `xs` holds `p0 + max(offsets) + 16·V` values, `tile` holds
        /// `8 · stride` with `p0 + 16·V <= stride`, `w` holds `8` weights per offset and `bias` 8.
        block512, "avx512f,avx2,fma", CH512, 16,
        _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_storeu_ps
    );

    block!(
        /// Half `H` (channels `4H..4H + 4`) of a block with 8 lanes.
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA; `xs` holds `p0 + max(offsets) + 8·V` values, `tile` holds
        /// `4 · stride` with `p0 + 8·V <= stride`, `w` holds `8` weights per offset and `bias` 4.
        block256, "avx2,fma", CH256, 8,
        _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_storeu_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::geometry::Spatial;

    /// `Conv2d` over `[1, c, h, w]` by `[m, c / group, k, k]`, padding `pad` all round.
    fn applies_to(c: usize, hw: usize, m: usize, group: usize, k: usize, stride: usize) -> bool {
        let pad = k / 2;
        let out = (hw + 2 * pad - k) / stride + 1;
        let geo = Spatial {
            kernel: vec![k, k],
            strides: vec![stride, stride],
            dilations: vec![1, 1],
            pad_begin: vec![pad, pad],
            pad_end: vec![pad, pad],
            out: vec![out, out],
        };
        let conv = Conv2d {
            n: 1,
            c,
            h: hw,
            w: hw,
            m,
            group,
            kh: k,
            kw: k,
            geo: &geo,
            winograd: None,
            direct: None,
        };
        applies(&conv)
    }

    /// Which convolutions the direct kernel takes, on a CPU with AVX2 (or AVX-512): small ones
    /// of stride 1 with a few output channels a group; not 1×1, depthwise, strided, large or
    /// wide ones.
    #[test]
    fn the_direct_kernel_takes_small_stride_1_convolutions() {
        if lanes().is_none() {
            eprintln!("not checked: this CPU has neither AVX2+FMA nor AVX-512 (no direct kernel)");
            return;
        }
        eprintln!("checked with {} lanes", lanes().unwrap_or(0));
        assert!(applies_to(1, 28, 8, 1, 3, 1));
        assert!(applies_to(8, 14, 16, 1, 3, 1));
        assert!(applies_to(16, 8, 32, 2, 5, 1));
        assert!(!applies_to(8, 14, 16, 1, 3, 2), "strided");
        assert!(!applies_to(8, 14, 16, 1, 1, 1), "1×1");
        assert!(!applies_to(8, 14, 8, 8, 3, 1), "depthwise");
        assert!(!applies_to(8, 14, 64, 1, 3, 1), "many output channels");
        assert!(!applies_to(32, 64, 16, 1, 3, 1), "large");
        assert!(!applies_to(4, 2, 8, 1, 7, 1), "rows mostly padding");
    }

    /// Packed filters: `[group, block, tap, BLOCK]`, channels past a group's last zero.
    #[test]
    fn filters_pack_by_group_block_and_tap() {
        // m = 10 in 2 groups of 5, 2 taps: weight (m, t) = 10·m + t.
        let w: Vec<f32> = (0..10)
            .flat_map(|m| (0..2).map(move |t| (10 * m + t) as f32))
            .collect();
        let p = pack_weights(&w, 10, 2, 2);
        assert_eq!(p.len(), 2 * 2 * BLOCK);
        assert_eq!(&p[..5], &[0.0, 10.0, 20.0, 30.0, 40.0]);
        assert_eq!(&p[5..BLOCK], &[0.0; BLOCK - 5]);
        assert_eq!(&p[BLOCK..BLOCK + 5], &[1.0, 11.0, 21.0, 31.0, 41.0]);
        assert_eq!(
            &p[2 * BLOCK..2 * BLOCK + 5],
            &[50.0, 60.0, 70.0, 80.0, 90.0]
        );
    }
}
