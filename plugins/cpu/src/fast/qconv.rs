//! The 8-bit convolution fast path of QLinearConv and ConvInteger (NCHW, 1-D and 2-D): the
//! integer GEMM of [`super::qgemm`] on the column matrix of the input bytes, with the zero
//! points, the bias and the requantization applied to each panel while it is in cache.
//!
//! - **depthwise** (one input and one output channel per group): the f32 depthwise loop of
//!   [`super::conv2d`] on the centered plane, exact while the sums stay below 2^24 (up to 258
//!   taps), else a direct i32 loop per tap over contiguous output rows;
//! - **1×1, stride 1, no padding**: the input planes are the column matrix;
//! - **everything else**: im2col on the bytes (the padding holds the input zero point, so it
//!   adds nothing), a band of output rows at a time.
//!
//! The weights are packed once per weight tensor ([`PackedConv`]); int8 activations and uint8
//! weights are moved into the kernel's u8 × i8 domain by ±128 with their zero points.
//!
//! Weights packed for [`Sums::PairsSaturated`] (QLinearConv's u8 × s8 at the `avx2` level) sum
//! the pairs ONNX Runtime's kernels sum: its column matrix is channels-last, so a pair is two
//! consecutive depths in the order (kernel tap, input channel), crossing into the next tap
//! where a group's channel count is odd. The im2col path then builds its columns in that
//! order; the channel-quad order of [`indirect`] pairs the same products (channels `c`, `c + 1`
//! of one tap), and so does any order where a group has one channel or the kernel one tap.

use super::conv2d::{Conv2d, Padded, valid_span};
use super::qgemm::{self, Cols, NR, QWeights, Sums, XBytes};
use crate::fast::round::round_even_f64;
use crate::par::Disjoint;

/// The weights of one convolution, packed for the integer GEMM.
#[derive(Debug)]
pub struct PackedConv {
    /// Output channels, and input channels times taps per group.
    m: usize,
    depth: usize,
    group: usize,
    /// Per group, `[m / group] × depth`; empty when depthwise or packed in quads.
    groups: Vec<QWeights>,
    /// `groups`' depth is in the order (tap, channel), and so must the column matrix be.
    tap_major: bool,
    /// Per group, the weights with their depth in the order of [`Cols::Quads`] (channel quad,
    /// tap, channel within the quad), for the stride-1 path of [`indirect`]; empty unless
    /// asked for (then `groups` is).
    quads: Vec<QWeights>,
    /// The centered weights `w - zw`, `[m] × taps`, for the depthwise loop (else empty), and
    /// the same values as f32 for its float32 kernel.
    centered: Vec<i32>,
    centered_f32: Vec<f32>,
    /// Each channel's weight zero point in the kernel's domain.
    zw: Vec<i32>,
}

impl PackedConv {
    /// Packs `w` (`[m, depth]` bytes; `signed`: int8, else uint8) with its zero points (`zw`:
    /// one, or one per output channel, in `w`'s own domain), for the depthwise loop when each
    /// group has one input and one output channel, else for the GEMM: with `quad_taps`
    /// (`Some(taps)`, the kernel's taps), its depth in the order of [`indirect`], for a stride-1
    /// convolution over whole channel quads. `taps` is the kernel's, `sums` how the GEMM sums
    /// unsigned activations by these weights (signed ones; see the module's notes). `None` when
    /// the depth is past [`MAX_DEPTH`], or the quad order is asked for weights whose channels
    /// are not whole quads.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        w: &[u8],
        signed: bool,
        (m, depth, group): (usize, usize, usize),
        taps: usize,
        quad_taps: Option<usize>,
        depthwise: bool,
        zw: &[i32],
        sums: Sums,
    ) -> Option<PackedConv> {
        if depth > MAX_DEPTH
            || group == 0
            || m % group != 0
            || w.len() != m * depth
            || (zw.len() != 1 && zw.len() != m)
            || taps == 0
            || !depth.is_multiple_of(taps)
        {
            return None;
        }
        let sums = if signed { sums } else { Sums::Exact };
        // The kernel's domain is signed: uint8 weights are w - 128, with their zero points.
        let shift = if signed { 0 } else { 128 };
        let zw: Vec<i32> = (0..m)
            .map(|c| zw[if zw.len() == 1 { 0 } else { c }] - shift)
            .collect();
        let val = |b: u8| {
            if signed {
                i32::from(b as i8)
            } else {
                i32::from(b) - 128
            }
        };
        let mg = m / group;
        if let Some(taps) = quad_taps {
            let cg = depth.checked_div(taps).unwrap_or(0);
            if depthwise || taps < 2 || cg * taps != depth || !cg.is_multiple_of(4) {
                return None;
            }
        }
        let cg = depth / taps;
        let tap_major =
            sums == Sums::PairsSaturated && quad_taps.is_none() && !depthwise && cg > 1 && taps > 1;
        let (mut groups, mut quads, mut centered) = (Vec::new(), Vec::new(), Vec::new());
        if depthwise {
            centered = w
                .iter()
                .enumerate()
                .map(|(i, &b)| val(b) - zw[i / depth.max(1)])
                .collect();
        } else {
            for g in 0..group {
                let wg: Vec<i8> = w[g * mg * depth..][..mg * depth]
                    .iter()
                    .map(|&b| val(b) as i8)
                    .collect();
                let ones = zw[g * mg..][..mg].iter().any(|&z| z != 0);
                if let Some(taps) = quad_taps {
                    // Depth `(c, tap)` becomes `(c / 4, tap, c % 4)`.
                    let mut wq = vec![0i8; wg.len()];
                    for (row, src) in wq.chunks_exact_mut(depth).zip(wg.chunks_exact(depth)) {
                        for (c, per_tap) in src.chunks_exact(taps).enumerate() {
                            for (tap, &v) in per_tap.iter().enumerate() {
                                row[((c / 4) * taps + tap) * 4 + c % 4] = v;
                            }
                        }
                    }
                    quads.push(QWeights::pack(&wq, mg, depth, ones, sums));
                } else if tap_major {
                    // Depth `(c, tap)` becomes `(tap, c)`.
                    let mut wt = vec![0i8; wg.len()];
                    for (row, src) in wt.chunks_exact_mut(depth).zip(wg.chunks_exact(depth)) {
                        for (c, per_tap) in src.chunks_exact(taps).enumerate() {
                            for (tap, &v) in per_tap.iter().enumerate() {
                                row[tap * cg + c] = v;
                            }
                        }
                    }
                    groups.push(QWeights::pack(&wt, mg, depth, ones, sums));
                } else {
                    groups.push(QWeights::pack(&wg, mg, depth, ones, sums));
                }
            }
        }
        Some(PackedConv {
            m,
            depth,
            group,
            groups,
            tap_major,
            quads,
            centered_f32: centered.iter().map(|&v| v as f32).collect(),
            centered,
            zw,
        })
    }
}

/// The deepest convolution whose exact sums `Σ (w - zw)(x - zx)` fit in i32 (`· 255 · 255`).
pub const MAX_DEPTH: usize = 32_768;

/// What the accumulators become.
#[derive(Clone, Copy, Debug)]
pub enum Output<'a> {
    /// ConvInteger: the i32 sums themselves.
    Int32,
    /// QLinearConv: `round((acc + bias[c]) · factor[c] + zy)`, saturated to u8 or i8.
    Bytes {
        bias: &'a [f64],
        factors: &'a [f64],
        zy: f64,
        signed: bool,
    },
}

/// The result of [`run`]: bytes (u8, or i8 bits) or i32.
pub enum Result {
    Bytes(Vec<u8>),
    Int32(Vec<i32>),
}

/// The input of [`run`]: the bytes of `x` (`[n, c, h, w]`; `signed`: int8 bits) and its zero
/// point in its own domain.
pub struct Input<'a> {
    pub x: &'a [u8],
    pub signed: bool,
    pub zx: i32,
}

crate::multiversion! {
/// The convolution of `x` by `w` with geometry `conv`; `None` when the shapes do not match the
/// packed weights.
pub fn run(conv: &Conv2d<'_>, x: &Input<'_>, w: &PackedConv, out: &Output<'_>) -> Option<Result> {
    run_inline(conv, x, w, out)
}
}

#[inline(always)]
fn run_inline(
    conv: &Conv2d<'_>,
    x: &Input<'_>,
    w: &PackedConv,
    out: &Output<'_>,
) -> Option<Result> {
    let (oh, ow) = (conv.oh(), conv.ow());
    let plane_out = oh * ow;
    let plane_in = conv.h * conv.w;
    let cg = conv.c / conv.group.max(1);
    let mg = conv.m / conv.group.max(1);
    if conv.group != w.group
        || conv.m != w.m
        || cg * conv.kh * conv.kw != w.depth
        || x.x.len() != conv.n * conv.c * plane_in
    {
        return None;
    }
    let total = conv.n * conv.m * plane_out;
    let mut bytes = Vec::new();
    let mut ints = Vec::new();
    match out {
        Output::Int32 => ints = vec![0i32; total],
        // Memory that is not there: the reference path reports it.
        Output::Bytes { .. } => bytes = crate::scratch::zeros(total).ok()?,
    }
    if total == 0 {
        return Some(match out {
            Output::Int32 => Result::Int32(ints),
            Output::Bytes { .. } => Result::Bytes(bytes),
        });
    }
    let requant = match *out {
        Output::Int32 => Vec::new(),
        Output::Bytes {
            bias,
            factors,
            zy,
            signed,
        } => (0..conv.m)
            .map(|c| {
                let zy = (zy.fract() == 0.0 && zy.abs() <= 255.0).then_some(zy as i32)?;
                super::qbytes::Requant::new(*bias.get(c)?, *factors.get(c)?, zy, signed)
            })
            .collect(),
    };
    let store = Store {
        bytes: Disjoint::new(&mut bytes),
        ints: Disjoint::new(&mut ints),
        out: *out,
        requant,
    };
    // The input zero point in the kernel's (unsigned) domain.
    let zx = if x.signed { x.zx + 128 } else { x.zx };
    if cg == 1 && mg == 1 {
        if w.centered.len() != w.m * w.depth {
            return None;
        }
        depthwise(conv, x, w, &store);
    } else {
        if w.quads.is_empty() {
            if w.groups.len() != w.group {
                return None;
            }
            gemm_conv(conv, x, w, zx, &store);
        } else {
            if conv.geo.strides != [1, 1]
                || w.quads.len() != w.group
                || !cg.is_multiple_of(4)
                || conv.kh * conv.kw < 2
            {
                return None;
            }
            indirect(conv, x, w, zx, &store)?;
        }
    }
    Some(match out {
        Output::Int32 => Result::Int32(ints),
        Output::Bytes { .. } => Result::Bytes(bytes),
    })
}

/// The output being written: element `i` is written by exactly one task.
struct Store<'a> {
    bytes: Disjoint<'a, u8>,
    ints: Disjoint<'a, i32>,
    out: Output<'a>,
    /// Per output channel, the float32 requantization when it applies ([`Output::Bytes`]).
    requant: Vec<Option<super::qbytes::Requant>>,
}

impl Store<'_> {
    /// Writes `acc` (exact sums, as i32 or as integer-valued f32) of channel `c` at
    /// `at..at + acc.len()`.
    ///
    /// # Safety
    /// No other task writes these elements.
    #[inline(always)]
    unsafe fn put<A: super::qbytes::Acc>(&self, c: usize, at: usize, acc: &[A]) {
        match self.out {
            Output::Int32 => {
                // SAFETY: the caller's contract; the range lies inside the output (sliced).
                let dst = unsafe { self.ints.slice(at, acc.len()) };
                for (d, &a) in dst.iter_mut().zip(acc) {
                    *d = a.int();
                }
            }
            Output::Bytes {
                bias,
                factors,
                zy,
                signed,
            } => {
                // SAFETY: as above.
                let dst = unsafe { self.bytes.slice(at, acc.len()) };
                match self.requant.get(c).copied().flatten() {
                    Some(rq) => rq.run(acc, dst),
                    None => {
                        let ints: Vec<i32> = acc.iter().map(|&a| a.int()).collect();
                        requantize_f64(&ints, (bias[c], factors[c], zy), signed, dst);
                    }
                }
            }
        }
    }
}

/// `dst[i] = saturate(round(f32(acc[i] + b) · f32(f)) + zy)` as u8, or as i8 bits when
/// `signed`: ONNX Runtime's requantization ([`super::qbytes::requantize`]), through its vector
/// kernel where it applies, else [`requantize_f64`].
pub(crate) fn requantize(acc: &[i32], bf: (f64, f64, f64), signed: bool, dst: &mut [u8]) {
    let (b, f, zy) = bf;
    let fast = (zy.fract() == 0.0 && zy.abs() <= 255.0)
        .then(|| super::qbytes::requantize(acc, b, f, zy as i32, signed, dst))
        .flatten();
    if fast.is_none() {
        requantize_f64(acc, bf, signed, dst);
    }
}

/// [`requantize`] one element at a time, for what the vector kernel does not take (a factor
/// past float32, a bias that is not an i32): the same roundings, the sum with its bias to
/// float32 once, the product in float32, the zero point added after rounding; NaN gives the
/// lowest value, as ONNX Runtime's clamp (`max_ps`) does.
pub(crate) fn requantize_f64(acc: &[i32], bf: (f64, f64, f64), signed: bool, dst: &mut [u8]) {
    let (b, f, zy) = bf;
    let (lo, hi, off) = if signed {
        (-128.0, 127.0, 128.0)
    } else {
        (0.0, 255.0, 0.0)
    };
    let flip = if signed { 0x80 } else { 0 };
    let f = f as f32;
    for (d, &a) in dst.iter_mut().zip(acc) {
        let v = f64::from((f64::from(a) + b) as f32 * f);
        let q = if v.is_nan() {
            lo
        } else {
            (round_even_f64(v) + zy).clamp(lo, hi)
        };
        *d = ((q + off) as i32 as u8) ^ flip;
    }
}

/// [`requantize`] with a factor per element (and no bias).
pub(crate) fn requantize_each(acc: &[i32], factors: &[f64], zy: f64, signed: bool, dst: &mut [u8]) {
    for ((d, &a), &f) in dst.iter_mut().zip(acc).zip(factors) {
        requantize(&[a], (0.0, f, zy), signed, std::slice::from_mut(d));
    }
}

/// One channel per group: `Σ_taps (w - zw) · (x - zx)` over the valid taps of each output row.
#[inline(always)]
fn depthwise(conv: &Conv2d<'_>, x: &Input<'_>, w: &PackedConv, store: &Store<'_>) {
    let spans: Vec<(usize, usize)> = (0..conv.kw)
        .map(|kx| {
            valid_span(
                conv.ow(),
                conv.geo.strides[1],
                kx * conv.geo.dilations[1],
                conv.geo.pad_begin[1],
                conv.w,
            )
        })
        .collect();
    let dw = Depthwise {
        conv,
        x,
        w,
        store,
        spans: &spans,
        geo: Padded::new(conv),
    };
    crate::par::for_each_index(conv.n * conv.c, |nc| depthwise_plane(&dw, nc));
}

/// The most taps whose sums of `(w - zw)(x - zx)` stay below 2^24 (each term is at most
/// 255 · 255 in magnitude).
const F32_EXACT_TAPS: usize = 258;

/// What [`depthwise_plane`] reads.
struct Depthwise<'a> {
    conv: &'a Conv2d<'a>,
    x: &'a Input<'a>,
    w: &'a PackedConv,
    store: &'a Store<'a>,
    /// The valid output columns of each kernel column.
    spans: &'a [(usize, usize)],
    /// The layout of a padded plane for the float32 kernel.
    geo: Padded,
}

crate::multiversion! {
/// Plane `nc` (image and channel) of the depthwise convolution.
fn depthwise_plane(dw: &Depthwise<'_>, nc: usize) {
    let (conv, x) = (dw.conv, dw.x);
    let (oh, ow) = (conv.oh(), conv.ow());
    let (sh, sw) = (conv.geo.strides[0], conv.geo.strides[1]);
    let (dh, dwid) = (conv.geo.dilations[0], conv.geo.dilations[1]);
    let (ph, pw) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
    let plane_in = conv.h * conv.w;
    let taps = conv.kh * conv.kw;
    let flip = if x.signed { 0x80u8 } else { 0 };
    let zx = if x.signed { x.zx + 128 } else { x.zx };
    let ch = nc % conv.c;
    let plane = &x.x[nc * plane_in..][..plane_in];
    let wk = &dw.w.centered[ch * taps..][..taps];
    if taps <= F32_EXACT_TAPS {
        // Every sum is an integer below 2^24, exact in float32: the direct f32 kernel on the
        // centered, padded plane, requantized from the f32 sums.
        let (geo, wf) = (&dw.geo, &dw.w.centered_f32[ch * taps..][..taps]);
        crate::par::with_work(geo.len() + oh * ow, |buf| {
            let (xs, of) = buf.split_at_mut(geo.len());
            depthwise_direct(conv, geo, (plane, flip, zx), wf, xs, of);
            // SAFETY: plane `nc` is this task's alone.
            unsafe { dw.store.put(ch, nc * oh * ow, of) };
        });
        return;
    }
    let mut acc = vec![0i32; ow];
    for oy in 0..oh {
        acc.fill(0);
        for ky in 0..conv.kh {
            let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&i| i < conv.h) else {
                continue;
            };
            let src = &plane[iy * conv.w..][..conv.w];
            for (kx, &(lo, hi)) in dw.spans.iter().enumerate() {
                if lo >= hi {
                    continue;
                }
                let wv = wk[ky * conv.kw + kx];
                let first = lo * sw + kx * dwid - pw;
                if sw == 1 {
                    for (o, &s) in acc[lo..hi].iter_mut().zip(&src[first..first + (hi - lo)]) {
                        *o += wv * (i32::from(s ^ flip) - zx);
                    }
                } else {
                    for (o, &s) in acc[lo..hi].iter_mut().zip(src[first..].iter().step_by(sw)) {
                        *o += wv * (i32::from(s ^ flip) - zx);
                    }
                }
            }
        }
        // SAFETY: row `oy` of plane `nc` is this task's alone.
        unsafe { dw.store.put(ch, (nc * oh + oy) * ow, &acc) };
    }
}
}

crate::multiversion! {
/// One depthwise plane: `x` (`(plane, flip, zx)`: its bytes, their bit flip into the unsigned
/// domain and the zero point there) centered into `xs` as laid out by `geo`, then the sums of
/// [`super::conv2d::depthwise_taps`] into `of`. Exact: the caller keeps every sum below 2^24.
fn depthwise_direct(
    conv: &Conv2d<'_>,
    geo: &Padded,
    x: (&[u8], u8, i32),
    wf: &[f32],
    xs: &mut [f32],
    of: &mut [f32],
) {
    let (plane, flip, zx) = x;
    geo.fill(conv, plane, xs, |v| (i32::from(v ^ flip) - zx) as f32);
    of.fill(0.0);
    super::conv2d::depthwise_taps(conv, geo, xs, wf, of);
}
}

/// Bytes of column matrix built at a time.
const COLS_BYTES: usize = 128 << 10;

/// The GEMM path: per image, group and band of output columns, the integer GEMM with the
/// zero-point corrections of each panel.
#[inline(always)]
fn gemm_conv(conv: &Conv2d<'_>, x: &Input<'_>, w: &PackedConv, zx: i32, store: &Store<'_>) {
    let (oh, ow) = (conv.oh(), conv.ow());
    let plane_out = oh * ow;
    let plane_in = conv.h * conv.w;
    let cg = conv.c / conv.group;
    let mg = conv.m / conv.group;
    let depth = w.depth;
    let pointwise = conv.kh == 1
        && conv.kw == 1
        && conv.geo.strides == [1, 1]
        && conv.geo.pad_begin == [0, 0]
        && oh == conv.h
        && ow == conv.w;
    let threads = crate::par::threads();
    let ranges: Vec<(usize, usize)> = if pointwise {
        let step = crate::par::chunk_len(plane_out, 256, NR)
            .min(plane_out)
            .max(1);
        (0..plane_out)
            .step_by(step)
            .map(|j0| (j0, step.min(plane_out - j0)))
            .collect()
    } else {
        let mut band = (COLS_BYTES / (depth * ow).max(1)).clamp(1, oh.max(1));
        if threads > 1 {
            band = band.min(oh.div_ceil(2 * threads).max(1));
        }
        (0..oh)
            .step_by(band)
            .map(|oy0| (oy0 * ow, band.min(oh - oy0) * ow))
            .collect()
    };
    let tasks = conv.n * conv.group * ranges.len();
    // The pad byte: the zero point, in x's own bits.
    let pad = if x.signed { (zx - 128) as u8 } else { zx as u8 };
    // Columns whose corrected sums are gathered before each output row of them is finished in
    // one call: about 128 KiB of i32 sums.
    let sub = ((32 << 10) / mg.max(1) / NR * NR).max(NR);
    crate::par::for_each_index(tasks, |t| {
        let (ng, (j0, width)) = (t / ranges.len(), ranges[t % ranges.len()]);
        let (n, g) = (ng / conv.group, ng % conv.group);
        let x_g = &x.x[(n * conv.c + g * cg) * plane_in..][..cg * plane_in];
        let wg = &w.groups[g];
        let fin = Finish {
            mg,
            depth,
            zw: &w.zw[g * mg..][..mg],
            zx,
            sums: wg.row_sums(),
            has_ones: wg.rows() > mg,
        };
        let mut panel = vec![0u8; qgemm::panel_len(depth)];
        let mut tile = vec![0i32; qgemm::tile_len(wg)];
        let ld = sub.min(width);
        let mut sums = vec![0i32; mg * ld];
        let base = (n * conv.m + g * mg) * plane_out + j0;
        let mut band = |src: Cols<'_>, at: usize| {
            for s0 in (0..width).step_by(ld) {
                let cnt = ld.min(width - s0);
                qgemm::qgemm(
                    wg,
                    src,
                    at + s0..at + s0 + cnt,
                    if x.signed {
                        XBytes::Int8
                    } else {
                        XBytes::Unsigned
                    },
                    (&mut panel, &mut tile),
                    |p0, k, tile| finish(&fin, tile, k, &mut sums[p0 - at - s0..], ld),
                );
                for r in 0..mg {
                    // SAFETY: columns `j0..j0 + width` of this image and group's planes are
                    // this task's alone, and `s0..s0 + cnt` lies inside them.
                    unsafe {
                        store.put(
                            g * mg + r,
                            base + r * plane_out + s0,
                            &sums[r * ld..][..cnt],
                        )
                    };
                }
            }
        };
        if pointwise {
            band(
                Cols::KByP {
                    x: x_g,
                    ld: plane_in,
                },
                j0,
            );
        } else {
            // The band's column matrix, in this thread's byte buffer (im2col writes all of it).
            crate::par::with_bytes(depth * width, |cols| {
                let oy0 = j0 / ow;
                conv.im2col(x_g, cg, oy0..oy0 + width / ow, cols, pad, w.tap_major);
                band(Cols::KByP { x: cols, ld: width }, 0);
            });
        }
    });
}

/// The stride-1 path for groups of whole channel quads: the input is laid out once as
/// `[image][group][channel quad][padded row][padded column][4]` (the unsigned domain, the
/// padding holding the zero point), so that each quad of the GEMM's depth (a channel quad at
/// one kernel tap) is a fixed offset into it and a panel of columns is one run of bytes: no
/// column matrix. The GEMM's columns run over the padded width, those past the output width
/// computed and dropped (2 of 162 for a 3 × 3 kernel on a 160-wide plane).
#[inline(always)]
fn indirect(
    conv: &Conv2d<'_>,
    x: &Input<'_>,
    w: &PackedConv,
    zx: i32,
    store: &Store<'_>,
) -> Option<()> {
    let (oh, ow) = (conv.oh(), conv.ow());
    let plane_out = oh * ow;
    let cg = conv.c / conv.group;
    let mg = conv.m / conv.group;
    let taps = conv.kh * conv.kw;
    let (dh, dw) = (conv.geo.dilations[0], conv.geo.dilations[1]);
    let (pt, pl) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
    // The padded plane: every row and column a tap reaches.
    let hp = (conv.h + pt).max(oh + (conv.kh - 1) * dh);
    let wp = (conv.w + pl).max(ow + (conv.kw - 1) * dw);
    let plane4 = hp * wp * 4;
    let cq = cg / 4;
    let block = cq * plane4;
    let blocks = conv.n * conv.group;
    let flip = if x.signed { 0x80u8 } else { 0 };
    let pad = zx as u8;
    let plane_in = conv.h * conv.w;
    // The padding everywhere first, then each row's data interleaved over it.
    // Memory that is not there: the reference path reports it.
    let mut xq = crate::scratch::take::<u8>(blocks * block).ok()?;
    xq.resize(blocks * block, pad);
    crate::par::for_each_chunk(&mut xq, plane4, |i, dst| {
        // Chunk `i` is channels `4i..4i + 4` counted over all images and groups.
        let src = &x.x[4 * i * plane_in..][..4 * plane_in];
        for iy in 0..conv.h {
            let row = &mut dst[((iy + pt) * wp + pl) * 4..][..conv.w * 4];
            let rows = [0, 1, 2, 3].map(|t| &src[t * plane_in + iy * conv.w..][..conv.w]);
            qgemm::interleave_rows(rows, flip, row);
        }
    });
    let offs: Vec<usize> = (0..cq)
        .flat_map(|q| {
            (0..conv.kh).flat_map(move |ky| {
                (0..conv.kw).map(move |kx| q * plane4 + (ky * dh * wp + kx * dw) * 4)
            })
        })
        .collect();
    debug_assert_eq!(offs.len() * 4, taps * cg);
    // Bands of output rows: about 128 KiB of i32 sums each, two tasks a thread at least.
    let mut band = ((32 << 10) / mg.max(1) / wp.max(1)).clamp(1, oh.max(1));
    let threads = crate::par::threads();
    if threads > 1 {
        band = band.min(oh.div_ceil(2 * threads).max(1));
    }
    let bands = oh.div_ceil(band);
    crate::par::for_each_index(blocks * bands, |t| {
        let (ng, oy0) = (t / bands, t % bands * band);
        let oy1 = (oy0 + band).min(oh);
        let (n, g) = (ng / conv.group, ng % conv.group);
        let wg = &w.quads[g];
        let fin = Finish {
            mg,
            depth: w.depth,
            zw: &w.zw[g * mg..][..mg],
            zx,
            sums: wg.row_sums(),
            has_ones: wg.rows() > mg,
        };
        // Columns `oy · wp + ox` of the padded grid, up to the last output of the band.
        let (start, end) = (oy0 * wp, (oy1 - 1) * wp + ow);
        let ld = end - start;
        let mut sums = vec![0i32; mg * ld];
        crate::par::with_bytes(qgemm::panel_len(w.depth), |panel| {
            let mut tile = vec![0i32; qgemm::tile_len(wg)];
            qgemm::qgemm(
                wg,
                Cols::Quads {
                    x: &xq[ng * block..][..block],
                    offs: &offs,
                },
                start..end,
                // The input was laid out in the unsigned domain above.
                if x.signed {
                    XBytes::Int8Flipped
                } else {
                    XBytes::Unsigned
                },
                (panel, &mut tile),
                |p0, k, tile| finish(&fin, tile, k, &mut sums[p0 - start..], ld),
            );
        });
        let base = (n * conv.m + g * mg) * plane_out;
        for r in 0..mg {
            for oy in oy0..oy1 {
                let row = &sums[r * ld + (oy - oy0) * wp..][..ow];
                // SAFETY: rows `oy0..oy1` of this image and group's planes are this task's.
                unsafe { store.put(g * mg + r, base + r * plane_out + oy * ow, row) };
            }
        }
    });
    crate::scratch::give(xq);
    Some(())
}

/// What [`finish`] needs of one task of [`gemm_conv`]: a group's zero-point corrections.
struct Finish<'a> {
    mg: usize,
    depth: usize,
    zw: &'a [i32],
    zx: i32,
    sums: &'a [i32],
    has_ones: bool,
}

crate::multiversion! {
/// The `cnt` columns of one tile of raw sums, corrected, row `r`'s into `out[r * ld..][..cnt]`:
/// `Σ (w - zw)(x - zx) = Σ w·x - zx·Σ w - zw·Σ x + depth·zw·zx`. The terms may pass i32 while
/// the result does not ([`MAX_DEPTH`]): wrapping arithmetic gets it exactly.
fn finish(f: &Finish<'_>, tile: &[i32], cnt: usize, out: &mut [i32], ld: usize) {
    // The ones row, when there is one, holds Σ x of each column.
    let ones = f.has_ones.then(|| &tile[f.mg * NR..][..cnt]);
    for r in 0..f.mg {
        let zw = f.zw[r];
        let corr = (f.depth as i32)
            .wrapping_mul(zw)
            .wrapping_mul(f.zx)
            .wrapping_sub(f.zx.wrapping_mul(f.sums[r]));
        let raw = &tile[r * NR..][..cnt];
        let row = &mut out[r * ld..][..cnt];
        if let Some(ones) = ones {
            for ((o, &a), &s) in row.iter_mut().zip(raw).zip(ones) {
                *o = a.wrapping_add(corr).wrapping_sub(zw.wrapping_mul(s));
            }
        } else {
            for (o, &a) in row.iter_mut().zip(raw) {
                *o = a.wrapping_add(corr);
            }
        }
    }
}
}
