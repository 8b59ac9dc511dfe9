//! The f32 2-D convolution fast path (NCHW), used by `Conv` for the common case:
//!
//! - **depthwise** (one input and one output channel per group): a direct loop per tap, whose
//!   inner loop runs over a contiguous output row and vectorizes;
//! - **1×1, stride 1, no padding**: the input planes already are the column matrix, one GEMM;
//! - **a plane of a few outputs** (a convolution over a short signal): dot products of the
//!   weight rows with the transposed columns ([`super::dots`]), since packing the weights for a
//!   GEMM would cost more than the product;
//! - **3×3, stride 1**, with enough channels: Winograd's F(2×2, 3×3) ([`super::winograd`]);
//! - **small, stride 1**: direct, a few vectors of outputs by a few output channels in registers
//!   ([`super::direct`]);
//! - **everything else**: im2col built row by row (contiguous spans copied, padding zeroed, no
//!   per-element index arithmetic), then one GEMM per group ([`super::gemm`]).
//!
//! The bias initializes the output and the GEMM accumulates onto it (beta = 1).

use super::dots::{NARROW, row_dots};
use super::gemm::{sgemm_raw, sgemm_strided};
use crate::error::OpResult;
pub use crate::fast::geometry::Conv2d;
use crate::fast::post::PostOp;
use crate::par::Disjoint;

impl Conv2d<'_> {
    /// Runs the convolution: `x` is `[n, c, h, w]`, `weights` `[m, c / group, kh, kw]`, `bias`
    /// `[m]`; returns `[n, m, oh, ow]`, C order.
    pub fn run(&self, x: &[f32], weights: &[f32], bias: Option<&[f32]>) -> OpResult<Vec<f32>> {
        Ok(self.run_post(x, weights, bias, None)?.0)
    }

    /// [`run`](Self::run), applying `post` to each part of the output as soon as it is final
    /// (if `post` accepts the output shape); returns whether it did.
    pub fn run_post(
        &self,
        x: &[f32],
        weights: &[f32],
        bias: Option<&[f32]>,
        post: Option<&mut dyn PostOp>,
    ) -> OpResult<(Vec<f32>, bool)> {
        // A small convolution stays on this thread.
        crate::par::serial_below(self.macs(), || run_conv2d(self, x, weights, bias, post))
    }

    #[inline(always)]
    fn run_inline(
        &self,
        x: &[f32],
        weights: &[f32],
        bias: Option<&[f32]>,
        post: Option<&mut dyn PostOp>,
    ) -> OpResult<(Vec<f32>, bool)> {
        let (oh, ow) = (self.oh(), self.ow());
        let plane_out = oh * ow;
        let mut post = post.filter(|_| plane_out > 0);
        if let Some(p) = post.as_mut()
            && !p.accepts(&[self.n, self.m, oh, ow])
        {
            post = None;
        }
        let post: Option<&dyn PostOp> = post.map(|p| &*p);
        let applied = post.is_some();
        if super::direct::applies(self) {
            // Every element is written, the bias with it.
            let mut out = crate::scratch::zeros(self.n * self.m * plane_out)?;
            super::direct::run(self, x, weights, bias, &mut out, post)?;
            return Ok((out, applied));
        }
        let mut out = initial_output(self.n, self.m, plane_out, bias)?;
        let cg = self.c / self.group;
        let mg = self.m / self.group;
        if cg == 1 && mg == 1 {
            self.depthwise(x, weights, &mut out, post);
            return Ok((out, applied));
        }
        if mg == 0 || out.is_empty() {
            return Ok((out, applied));
        }
        if super::winograd::applies(self) {
            let made;
            let u = match self.winograd {
                Some(u) if u.len() == 16 * self.m * cg => u,
                _ => {
                    made = super::winograd::transform_weights(weights, self.m, cg, self.group);
                    &made
                }
            };
            super::winograd::run(self, x, u, &mut out, post);
            return Ok((out, applied));
        }
        let rows = cg * self.kh * self.kw;
        let plane_in = self.h * self.w;
        let pointwise = self.kh == 1
            && self.kw == 1
            && self.geo.strides == [1, 1]
            && self.geo.pad_begin == [0, 0]
            && oh == self.h
            && ow == self.w;
        let threads = crate::par::threads();
        // The output columns of one group's planes that one task computes and finishes: for
        // im2col, bands of output rows of about 256 KiB of columns, so the column matrix stays
        // in cache between being written and being multiplied; for 1×1, bands of columns when a
        // post-op is to run while they are in cache, or when the pool is to share them.
        let ranges: Vec<(usize, usize)> = if pointwise {
            let mut step = if applied {
                (2 * COLS_BYTES / (mg * 4).max(1)).max(64)
            } else {
                plane_out
            };
            if threads > 1 {
                step = step.min(crate::par::chunk_len(plane_out, 64, 16));
            }
            let step = step.clamp(1, plane_out.max(1));
            (0..plane_out)
                .step_by(step)
                .map(|j0| (j0, step.min(plane_out - j0)))
                .collect()
        } else {
            // At least MIN_COLS columns a band: each GEMM call packs the weights again, which
            // a narrow band does not repay (a 1-D convolution has one column per output row).
            let band = (COLS_BYTES / (rows * ow * 4).max(1))
                .max(MIN_COLS.div_ceil(ow.max(1)))
                .clamp(1, oh.max(1));
            (0..oh)
                .step_by(band)
                .map(|oy0| (oy0 * ow, band.min(oh - oy0) * ow))
                .collect()
        };
        let tasks = self.n * self.group * ranges.len();
        // Enough tasks: the pool shares them, each GEMM on one thread. Too few: one after the
        // other, each GEMM split across the pool instead.
        let split = threads > 1 && tasks >= 2 * threads;
        let inner = !split
            && crate::par::gemm_splits(mg, rows, ranges.iter().map(|r| r.1).max().unwrap_or(0));
        let dst = Disjoint::new(&mut out);
        let task = |t: usize| {
            let (ng, (j0, width)) = (t / ranges.len(), ranges[t % ranges.len()]);
            let (n, g) = (ng / self.group, ng % self.group);
            let x_g = &x[(n * self.c + g * cg) * plane_in..][..cg * plane_in];
            let w_g = &weights[g * mg * rows..][..mg * rows];
            let base = (n * self.m + g * mg) * plane_out;
            assert!(base + (mg - 1) * plane_out + j0 + width <= dst.len());
            if width == plane_out && plane_out <= NARROW {
                // A few output columns: dot products over the weights where they lie, not a
                // GEMM that packs them first ([`super::dots`]).
                // SAFETY: this task's range is the whole plane, so it alone writes the `mg`
                // planes of its image and group.
                let o = unsafe { dst.slice(base, mg * plane_out) };
                with_cols(rows * width, |bt| {
                    self.tap_columns(x_g, cg, bt);
                    row_dots(mg, width, rows, w_g, bt, o, plane_out);
                });
            } else if pointwise {
                // SAFETY: task `t` alone writes columns `j0..j0 + width` of the `mg` planes of
                // its image and group, which lie inside `out` (asserted above).
                unsafe {
                    sgemm_raw(
                        (mg, rows, width),
                        w_g,
                        (rows, 1),
                        (&x_g[j0..], plane_in),
                        (dst.as_mut_ptr(base + j0), plane_out),
                        true,
                        inner,
                    );
                }
            } else {
                with_cols(rows * width, |cols| {
                    let oy0 = j0 / ow;
                    self.im2col(x_g, cg, oy0..oy0 + width / ow, cols, 0.0, false);
                    // SAFETY: as for the 1×1 case: these columns are this task's alone.
                    unsafe {
                        sgemm_raw(
                            (mg, rows, width),
                            w_g,
                            (rows, 1),
                            (cols, width),
                            (dst.as_mut_ptr(base + j0), plane_out),
                            true,
                            inner,
                        );
                    }
                });
            }
            if let Some(p) = post {
                crate::par::with_work(p.work_len(), |work| {
                    if width == plane_out {
                        // Whole planes: the `mg` of them lie together, one call.
                        // SAFETY: as above, these planes are this task's alone.
                        p.apply(unsafe { dst.slice(base, mg * plane_out) }, base, work);
                        return;
                    }
                    for mm in 0..mg {
                        let at = base + mm * plane_out + j0;
                        // SAFETY: as above, these columns are this task's alone.
                        p.apply(unsafe { dst.slice(at, width) }, at, work);
                    }
                });
            }
        };
        if split {
            crate::par::for_each_index(tasks, task);
        } else {
            (0..tasks).for_each(task);
        }
        Ok((out, applied))
    }

    /// `bt[(oy, ox), (ci, ky, kx)]`, the input pixel each tap of each output reads (0 in the
    /// padding), output by output: the transposed column matrix of a convolution with a few
    /// outputs a plane, gathered directly.
    fn tap_columns(&self, x_g: &[f32], cg: usize, bt: &mut [f32]) {
        let (ow, taps, plane_in) = (self.ow().max(1), self.kh * self.kw, self.h * self.w);
        let g = self.geo;
        // Each tap's input offset within a plane for the current output (`usize::MAX` in the
        // padding).
        let mut offs = vec![0usize; taps];
        for (j, col) in bt.chunks_exact_mut(cg * taps).enumerate() {
            let (oy, ox) = (j / ow, j % ow);
            for (t, slot) in offs.iter_mut().enumerate() {
                let (ky, kx) = (t / self.kw, t % self.kw);
                let iy = (oy * g.strides[0] + ky * g.dilations[0]).checked_sub(g.pad_begin[0]);
                let ix = (ox * g.strides[1] + kx * g.dilations[1]).checked_sub(g.pad_begin[1]);
                let at = match (iy, ix) {
                    (Some(iy), Some(ix)) if iy < self.h && ix < self.w => iy * self.w + ix,
                    _ => usize::MAX,
                };
                *slot = at;
            }
            for (ci, dst) in col.chunks_exact_mut(taps).enumerate() {
                let plane = &x_g[ci * plane_in..][..plane_in];
                for (d, &o) in dst.iter_mut().zip(&offs) {
                    *d = if o == usize::MAX { 0.0 } else { plane[o] };
                }
            }
        }
    }

    /// `cols[(ci, ky, kx), (oy, ox)]` for the output rows `oys` = the input pixel each tap reads
    /// (`pad` in the padding); with `tap_major`, the rows in the order `(ky, kx, ci)` instead
    /// (a channels-last column matrix's depth).
    #[inline(always)]
    pub(crate) fn im2col<T: Copy>(
        &self,
        x_g: &[T],
        cg: usize,
        oys: std::ops::Range<usize>,
        cols: &mut [T],
        pad: T,
        tap_major: bool,
    ) {
        let ow = self.ow();
        let width = oys.len() * ow;
        let (sh, sw) = (self.geo.strides[0], self.geo.strides[1]);
        let (dh, dw) = (self.geo.dilations[0], self.geo.dilations[1]);
        let (ph, pw) = (self.geo.pad_begin[0], self.geo.pad_begin[1]);
        let taps = self.kh * self.kw;
        for ci in 0..cg {
            let plane = &x_g[ci * self.h * self.w..][..self.h * self.w];
            for ky in 0..self.kh {
                for kx in 0..self.kw {
                    let tap = ky * self.kw + kx;
                    let r = if tap_major {
                        tap * cg + ci
                    } else {
                        ci * taps + tap
                    };
                    let row = &mut cols[r * width..][..width];
                    let (lo, hi) = valid_span(ow, sw, kx * dw, pw, self.w);
                    if sh == 1 && sw == 1 && ow == self.w {
                        // Consecutive output rows read consecutive input rows at one shift: the
                        // whole band is one contiguous copy, then the columns that fell outside
                        // the image (in the padding) are zeroed.
                        let rows_of =
                            |oy: usize| (oy + ky * dh).checked_sub(ph).filter(|&i| i < self.h);
                        let a = oys.clone().find(|&oy| rows_of(oy).is_some());
                        let b = oys.clone().rev().find(|&oy| rows_of(oy).is_some());
                        let (Some(a), Some(b), true) = (a, b, lo < hi) else {
                            row.fill(pad);
                            continue;
                        };
                        let (d0, d1) = ((a - oys.start) * ow, (b + 1 - oys.start) * ow);
                        row[..d0].fill(pad);
                        row[d1..].fill(pad);
                        let dst = &mut row[d0..d1];
                        let s0 =
                            (rows_of(a).unwrap_or(0) * self.w + kx * dw) as isize - pw as isize;
                        let src_lo = s0.max(0) as usize;
                        let src_hi = ((s0 + dst.len() as isize) as usize).min(plane.len());
                        let off = (src_lo as isize - s0) as usize;
                        dst[off..off + (src_hi - src_lo)].copy_from_slice(&plane[src_lo..src_hi]);
                        for line in dst.chunks_exact_mut(ow) {
                            fill_few(&mut line[..lo], pad);
                            fill_few(&mut line[hi..], pad);
                        }
                        continue;
                    }
                    for oy in oys.clone() {
                        let dst = &mut row[(oy - oys.start) * ow..][..ow];
                        let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&i| i < self.h)
                        else {
                            dst.fill(pad);
                            continue;
                        };
                        let src = &plane[iy * self.w..][..self.w];
                        dst[..lo].fill(pad);
                        dst[hi.max(lo)..].fill(pad);
                        if lo < hi {
                            let first = lo * sw + kx * dw - pw;
                            if sw == 1 {
                                dst[lo..hi].copy_from_slice(&src[first..first + (hi - lo)]);
                            } else {
                                for (d, s) in
                                    dst[lo..hi].iter_mut().zip(src[first..].iter().step_by(sw))
                                {
                                    *d = *s;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// One input channel per output channel: accumulate each tap over whole output rows, then
    /// apply `post` to the plane. Planes are shared across the pool.
    #[inline(always)]
    fn depthwise(&self, x: &[f32], weights: &[f32], out: &mut [f32], post: Option<&dyn PostOp>) {
        let plane_out = self.oh() * self.ow();
        if plane_out == 0 {
            return;
        }
        let geo = Padded::new(self);
        // Planes per task: a post-op is applied to all of a task's planes in one call, so that
        // its fixed cost per call is spread over at least POST_SPAN outputs (the planes of a
        // text-line model's late layers are 2 × 96); four tasks a thread at least.
        let planes = out.len() / plane_out;
        let mut per = if post.is_some() {
            POST_SPAN.div_ceil(plane_out)
        } else {
            1
        };
        let threads = crate::par::threads();
        if threads > 1 {
            per = per.min(planes.div_ceil(4 * threads));
        }
        let per = per.max(1);
        crate::par::for_each_chunk(out, per * plane_out, |i, chunk| {
            for (j, o_plane) in chunk.chunks_exact_mut(plane_out).enumerate() {
                // A function of its own: a closure does not inherit the AVX2 copy's features.
                depthwise_plane(self, &geo, (x, weights), i * per + j, o_plane);
            }
            if let Some(p) = post {
                let at = i * per * plane_out;
                crate::par::with_work(p.work_len(), |work| p.apply(chunk, at, work));
            }
        });
    }
}

/// Plane `nc` (image and channel) of [`Conv2d::depthwise`], accumulated onto `o_plane`: the
/// input plane copied into a padded, stride-split buffer laid out by `geo`, then
/// [`depthwise_taps`].
pub(crate) fn depthwise_plane(
    conv: &Conv2d<'_>,
    geo: &Padded,
    xw: (&[f32], &[f32]),
    nc: usize,
    o_plane: &mut [f32],
) {
    let (x, weights) = xw;
    let plane_in = conv.h * conv.w;
    let plane = &x[nc * plane_in..][..plane_in];
    let ch = nc % conv.c;
    let wk = &weights[ch * conv.kh * conv.kw..][..conv.kh * conv.kw];
    crate::par::with_work(geo.len(), |xs| {
        fill_f32(conv, geo, plane, xs);
        depthwise_taps(conv, geo, xs, wk, o_plane);
    });
}

crate::multiversion! {
/// [`Padded::fill`] of a float32 plane.
fn fill_f32(conv: &Conv2d<'_>, geo: &Padded, plane: &[f32], xs: &mut [f32]) {
    geo.fill(conv, plane, xs, |v| v);
}
}

/// Outputs a post-op is applied to at least per call on depthwise planes.
const POST_SPAN: usize = 4096;

/// Output columns the direct depthwise kernel computes at a time.
const DW_BLOCK: usize = 16;

/// The layout of one input plane for [`depthwise_direct`]: centered f32 values with the
/// convolution's padding (and enough zero columns past it for whole blocks of [`DW_BLOCK`]
/// outputs) around them, each row's columns split by phase of the column stride `s` (phase
/// `p` holds padded columns `p, p + s, ...` in `wq` slots), so that every tap of a block reads
/// [`DW_BLOCK`] contiguous values.
pub(crate) struct Padded {
    rows: usize,
    s: usize,
    wq: usize,
    /// Where tap column `kx` starts within a row: its phase's slots plus its offset in them.
    offsets: Vec<usize>,
}

impl Padded {
    pub(crate) fn new(conv: &Conv2d<'_>) -> Padded {
        let (oh, ow) = (conv.oh(), conv.ow());
        let (sh, s) = (conv.geo.strides[0], conv.geo.strides[1].max(1));
        let (dh, dw) = (conv.geo.dilations[0], conv.geo.dilations[1]);
        let (ph, pw) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
        let rows = (conv.h + ph).max((oh.max(1) - 1) * sh + (conv.kh.max(1) - 1) * dh + 1);
        let reach = (conv.kw.max(1) - 1) * dw / s;
        let wq = (conv.w + pw)
            .div_ceil(s)
            .max(ow.div_ceil(DW_BLOCK) * DW_BLOCK + reach);
        let offsets = (0..conv.kw)
            .map(|kx| (kx * dw % s) * wq + kx * dw / s)
            .collect();
        Padded {
            rows,
            s,
            wq,
            offsets,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.rows * self.s * self.wq
    }

    /// `map` of each element of `plane` (`conv.h × conv.w`) into its place in `xs` (at
    /// least [`len`](Self::len) slots), every other slot zero.
    #[inline(always)]
    pub(crate) fn fill<T: Copy>(
        &self,
        conv: &Conv2d<'_>,
        plane: &[T],
        xs: &mut [f32],
        map: impl Fn(T) -> f32,
    ) {
        let (ph, pw) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
        let (s, wq) = (self.s, self.wq);
        let rs = s * wq;
        xs.fill(0.0);
        for (iy, src) in plane.chunks_exact(conv.w.max(1)).enumerate() {
            let row = &mut xs[(iy + ph) * rs..][..rs];
            if s == 1 {
                for (d, &v) in row[pw..pw + src.len()].iter_mut().zip(src) {
                    *d = map(v);
                }
            } else if s == 2 {
                // Input columns `2j` and `2j + 1` (padded `2j + pw` and `2j + 1 + pw`) go to
                // slot `j + pw / 2` of phase `pw % 2` and slot `j + (pw + 1) / 2` of the other
                // one: one pass over pairs, which vectorizes (the general loop below reads
                // every input row once per phase, element by element).
                let (p0, p1) = row.split_at_mut(wq);
                let (even, odd) = if pw % 2 == 0 { (p0, p1) } else { (p1, p0) };
                let even = &mut even[pw / 2..];
                let odd = &mut odd[pw.div_ceil(2)..];
                let pairs = src.chunks_exact(2);
                if let [last] = pairs.remainder() {
                    even[src.len() / 2] = map(*last);
                }
                for ((e, o), p) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
                    *e = map(p[0]);
                    *o = map(p[1]);
                }
            } else {
                // Phase by phase: padded column `c = ix + pw` goes to slot `c / s` of phase
                // `c % s`; the first input column of phase `p` is the `ix` with `c ≡ p`.
                for (p, phase) in row.chunks_exact_mut(wq).enumerate() {
                    let ix0 = (p + s - pw % s) % s;
                    let q0 = (ix0 + pw) / s;
                    let cols = src.iter().skip(ix0).step_by(s);
                    for (d, &v) in phase[q0..].iter_mut().zip(cols) {
                        *d = map(v);
                    }
                }
            }
        }
    }
}

crate::multiversion! {
/// Each output `of[oy][ox] += Σ wf[ky][kx] · xs[oy·sh + ky·dh][ox·sw + kx·dw]` of one
/// depthwise plane, `xs` laid out by `geo`, [`DW_BLOCK`] outputs at a time in registers.
pub(crate) fn depthwise_taps(
    conv: &Conv2d<'_>,
    geo: &Padded,
    xs: &[f32],
    wf: &[f32],
    of: &mut [f32],
) {
    let (oh, ow) = (conv.oh(), conv.ow());
    let (sh, dh) = (conv.geo.strides[0], conv.geo.dilations[0]);
    let ph = conv.geo.pad_begin[0];
    let taps = DwTaps {
        xs,
        rs: geo.s * geo.wq,
        dh,
        kh: conv.kh,
        wf,
        offsets: &geo.offsets,
        data: ph..ph + conv.h,
    };
    let ow = ow.max(1);
    let oh = oh.min(of.len() / ow);
    let mut oy = 0;
    #[cfg(target_arch = "x86_64")]
    if super::isa::isa().vnni {
        // Eight output rows at a time, one 16-lane accumulator each per block of columns.
        for rows in of[..oh * ow].chunks_exact_mut(8 * ow) {
            // SAFETY: the level is VNNI only on a CPU with AVX-512F and BW.
            unsafe { x86::depthwise_rows512::<8>(&taps, oy, sh, rows, ow) };
            oy += 8;
        }
        let rest = &mut of[oy * ow..oh * ow];
        // SAFETY: as above.
        unsafe {
            match oh - oy {
                7 => x86::depthwise_rows512::<7>(&taps, oy, sh, rest, ow),
                6 => x86::depthwise_rows512::<6>(&taps, oy, sh, rest, ow),
                5 => x86::depthwise_rows512::<5>(&taps, oy, sh, rest, ow),
                4 => x86::depthwise_rows512::<4>(&taps, oy, sh, rest, ow),
                3 => x86::depthwise_rows512::<3>(&taps, oy, sh, rest, ow),
                2 => x86::depthwise_rows512::<2>(&taps, oy, sh, rest, ow),
                1 => x86::depthwise_rows512::<1>(&taps, oy, sh, rest, ow),
                _ => {}
            }
        }
        oy = oh;
    }
    #[cfg(target_arch = "x86_64")]
    if super::isa::isa().wide && oy < oh {
        // Four output rows at a time: eight independent chains of fused multiply-adds, enough
        // to cover their latency (one row's two chains wait on it).
        for rows in of[..oh * ow].chunks_exact_mut(4 * ow) {
            let y0 = [0, 1, 2, 3].map(|r| (oy + r) * sh);
            // SAFETY: the level is wide only on a CPU with AVX2 and FMA.
            unsafe { x86::depthwise_rows(&taps, y0, rows, ow) };
            oy += 4;
        }
        // The last one to three rows together: more chains than one row at a time (a plane
        // of two or three rows, as in narrow text-line models, is only this).
        let rest = &mut of[oy * ow..oh * ow];
        // SAFETY: as above.
        unsafe {
            match oh - oy {
                3 => x86::depthwise_rows(&taps, [0, 1, 2].map(|r| (oy + r) * sh), rest, ow),
                2 => x86::depthwise_rows(&taps, [0, 1].map(|r| (oy + r) * sh), rest, ow),
                1 => x86::depthwise_rows(&taps, [oy * sh], rest, ow),
                _ => {}
            }
        }
        oy = oh;
    }
    for orow in of[oy * ow..].chunks_exact_mut(ow).take(oh - oy) {
        taps.row(oy * sh, orow);
        oy += 1;
    }
}
}

/// What [`depthwise_taps`] reads for a row of outputs.
struct DwTaps<'a> {
    /// The padded plane ([`Padded`]) and its row stride.
    xs: &'a [f32],
    rs: usize,
    dh: usize,
    kh: usize,
    /// `[kh][kw]` weights, and each kernel column's start in a row.
    wf: &'a [f32],
    offsets: &'a [usize],
    /// The padded rows that hold input rows; the others are zeros, whose taps are skipped
    /// (a 5 × 5 kernel over a plane of two rows reads data in two of its five rows).
    data: std::ops::Range<usize>,
}

impl DwTaps<'_> {
    /// The output row whose first kernel row is padded row `y0`, added onto `orow`,
    /// [`DW_BLOCK`] at a time.
    #[inline(always)]
    fn row(&self, y0: usize, orow: &mut [f32]) {
        let kw = self.offsets.len();
        for ox in (0..orow.len()).step_by(DW_BLOCK) {
            let n = DW_BLOCK.min(orow.len() - ox);
            let mut acc = [0f32; DW_BLOCK];
            acc[..n].copy_from_slice(&orow[ox..ox + n]);
            for ky in 0..self.kh {
                let y = y0 + ky * self.dh;
                if !self.data.contains(&y) {
                    continue;
                }
                let row = &self.xs[y * self.rs..][..self.rs];
                for (&w, &off) in self.wf[ky * kw..][..kw].iter().zip(self.offsets) {
                    for (a, &v) in acc.iter_mut().zip(&row[off + ox..][..DW_BLOCK]) {
                        *a += w * v;
                    }
                }
            }
            orow[ox..ox + n].copy_from_slice(&acc[..n]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{DW_BLOCK, DwTaps};
    use std::arch::x86_64::*;

    /// [`DwTaps::row`] for `R` output rows at once (`out` holds them, `ow` apart; row `r`'s
    /// first kernel row is padded row `y0[r]`), with two 8-lane accumulators per row and block
    /// held in registers (fused multiply-adds: on integer sums below 2^24, as the 8-bit
    /// convolution makes, the same sums as separate products and additions).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn depthwise_rows<const R: usize>(
        t: &DwTaps<'_>,
        y0: [usize; R],
        out: &mut [f32],
        ow: usize,
    ) {
        const _: () = assert!(DW_BLOCK == 16);
        let kw = t.offsets.len();
        for ox in (0..ow).step_by(DW_BLOCK) {
            let n = DW_BLOCK.min(ow - ox);
            // Each row's block: read from `out` in place, or through `part` when partial.
            let mut part = [[0f32; DW_BLOCK]; R];
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for r in 0..R {
                let src = &mut out[r * ow + ox..][..n];
                let p: &[f32] = if n == DW_BLOCK {
                    src
                } else {
                    part[r][..n].copy_from_slice(src);
                    &part[r]
                };
                // SAFETY: `p` has 16 slots.
                acc[r] = unsafe {
                    [
                        _mm256_loadu_ps(p.as_ptr()),
                        _mm256_loadu_ps(p.as_ptr().add(8)),
                    ]
                };
            }
            for ky in 0..t.kh {
                // Kernel rows over padding in all `R` rows add nothing.
                if !y0.iter().any(|y| t.data.contains(&(y + ky * t.dh))) {
                    continue;
                }
                let rows = y0.map(|y| &t.xs[(y + ky * t.dh) * t.rs..][..t.rs]);
                for (&w, &off) in t.wf[ky * kw..][..kw].iter().zip(t.offsets) {
                    let w = _mm256_set1_ps(w);
                    for (a, row) in acc.iter_mut().zip(&rows) {
                        let seg = &row[off + ox..][..DW_BLOCK];
                        // SAFETY: `seg` holds the 16 values loaded.
                        unsafe {
                            a[0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(seg.as_ptr()), a[0]);
                            a[1] = _mm256_fmadd_ps(w, _mm256_loadu_ps(seg.as_ptr().add(8)), a[1]);
                        }
                    }
                }
            }
            for r in 0..R {
                let dst = &mut out[r * ow + ox..][..n];
                let p: &mut [f32] = if n == DW_BLOCK { dst } else { &mut part[r] };
                // SAFETY: `p` has 16 slots.
                unsafe {
                    _mm256_storeu_ps(p.as_mut_ptr(), acc[r][0]);
                    _mm256_storeu_ps(p.as_mut_ptr().add(8), acc[r][1]);
                }
                if n < DW_BLOCK {
                    out[r * ow + ox..][..n].copy_from_slice(&part[r][..n]);
                }
            }
        }
    }

    /// [`DwTaps::row`] for `R` output rows at once (rows `oy..oy + R`, each `ow` long in
    /// `out`; row `oy + r`'s first kernel row is padded row `(oy + r) · sh`), one 16-lane
    /// accumulator per row and block of columns held in registers, the last block of a row
    /// masked. Every tap reads 16 values whole: the padded rows are long enough ([`super::Padded`]).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn depthwise_rows512<const R: usize>(
        t: &DwTaps<'_>,
        oy: usize,
        sh: usize,
        out: &mut [f32],
        ow: usize,
    ) {
        const _: () = assert!(DW_BLOCK == 16);
        let kw = t.offsets.len();
        let out = &mut out[..R * ow];
        for ox in (0..ow).step_by(DW_BLOCK) {
            let n = DW_BLOCK.min(ow - ox);
            let mask: __mmask16 = if n == DW_BLOCK { !0 } else { (1 << n) - 1 };
            let mut acc = [_mm512_setzero_ps(); R];
            for (r, a) in acc.iter_mut().enumerate() {
                let src = &out[r * ow + ox..][..n];
                // SAFETY: the mask reads the `n` values of `src`.
                *a = unsafe { _mm512_maskz_loadu_ps(mask, src.as_ptr()) };
            }
            for ky in 0..t.kh {
                let dy = ky * t.dh;
                // Kernel rows over padding in all `R` rows add nothing.
                let first = oy * sh + dy;
                let last = (oy + R - 1) * sh + dy;
                if last < t.data.start || first >= t.data.end {
                    continue;
                }
                let mut base = [0usize; R];
                for (r, b) in base.iter_mut().enumerate() {
                    *b = ((oy + r) * sh + dy) * t.rs + ox;
                }
                // Tap by tap, its weight broadcast once for the `R` rows.
                for (&w, &off) in t.wf[ky * kw..][..kw].iter().zip(t.offsets) {
                    let w = _mm512_set1_ps(w);
                    for (a, &b) in acc.iter_mut().zip(&base) {
                        let seg = &t.xs[b + off..][..DW_BLOCK];
                        // SAFETY: `seg` holds the 16 values loaded.
                        let v = unsafe { _mm512_loadu_ps(seg.as_ptr()) };
                        *a = _mm512_fmadd_ps(w, v, *a);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let dst = &mut out[r * ow + ox..][..n];
                // SAFETY: the mask writes the `n` slots of `dst`.
                unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, *a) };
            }
        }
    }
}

/// Shapes and geometry of one 2-D transposed convolution (NCHW).
pub struct ConvTranspose2d {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// Output channels and spatial size.
    pub m: usize,
    pub oh: usize,
    pub ow: usize,
    pub group: usize,
    pub kh: usize,
    pub kw: usize,
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pad_begin: [usize; 2],
}

impl ConvTranspose2d {
    /// `x` is `[n, c, h, w]`, `weights` `[c, m / group, kh, kw]`, `bias` `[m]`; returns
    /// `[n, m, oh, ow]`. Per group: one GEMM `cols = Wᵀ · X` (taps × input pixels), then each tap's
    /// row is added into the output at its strided positions (col2im).
    pub fn run(&self, x: &[f32], weights: &[f32], bias: Option<&[f32]>) -> OpResult<Vec<f32>> {
        run_conv_transpose2d(self, x, weights, bias)
    }

    #[inline(always)]
    fn run_inline(&self, x: &[f32], weights: &[f32], bias: Option<&[f32]>) -> OpResult<Vec<f32>> {
        let plane_out = self.oh * self.ow;
        let plane_in = self.h * self.w;
        let mut out = initial_output(self.n, self.m, plane_out, bias)?;
        let cg = self.c / self.group;
        let mg = self.m / self.group;
        let kn = self.kh * self.kw;
        let rows = mg * kn;
        // Bands of input rows whose columns stay in cache between the GEMM that writes them
        // and the scatter that reads them (a 2 × 2, stride-2 upsampling of 24 channels at
        // 160 × 160 made 10 MB of columns in one piece).
        let band = (COLS_BYTES / (rows * self.w * 4).max(1))
            .max(MIN_COLS.div_ceil(self.w.max(1)))
            .clamp(1, self.h.max(1));
        let mut cols = crate::scratch::zeros(rows * band * self.w)?;
        let [sh, sw] = self.strides;
        let [dh, dw] = self.dilations;
        let [ph, pw] = self.pad_begin;
        let spans: Vec<(usize, usize)> = (0..self.kw)
            .map(|kx| valid_span(self.w, sw, kx * dw, pw, self.ow))
            .collect();
        for n in 0..self.n {
            for g in 0..self.group {
                let x_g = &x[(n * self.c + g * cg) * plane_in..][..cg * plane_in];
                let w_g = &weights[g * cg * rows..][..cg * rows];
                let o_g = &mut out[(n * self.m + g * mg) * plane_out..][..mg * plane_out];
                for iy0 in (0..self.h).step_by(band) {
                    let bh = band.min(self.h - iy0);
                    let np = bh * self.w;
                    let cols = &mut cols[..rows * np];
                    // cols[r, p] = Σ_ci w_g[ci, r] · x_g[ci, iy0·w + p]: A is w_g transposed.
                    sgemm_strided(
                        (rows, cg, np),
                        w_g,
                        (1, rows),
                        (&x_g[iy0 * self.w..], plane_in),
                        (cols, np),
                        false,
                        crate::par::gemm_splits(rows, cg, np),
                    );
                    let cols = &*cols;
                    // Two taps a row, side by side in the output (the 2 × 2, stride-2
                    // upsampling): both rows interleaved in one pass.
                    let pairs =
                        self.kw == 2 && sw == 2 && dw == 1 && pw == 0 && self.ow >= 2 * self.w;
                    // The output row input row `iy` reaches through kernel row `ky`, if any.
                    let out_row = |iy: usize, ky: usize| {
                        (iy * sh + ky * dh).checked_sub(ph).filter(|&o| o < self.oh)
                    };
                    crate::par::for_each_chunk(o_g, plane_out, |mi, o_plane| {
                        if pairs {
                            for ky in 0..self.kh {
                                let tap = |kx: usize| &cols[(mi * kn + ky * 2 + kx) * np..][..np];
                                let (t0, t1) = (tap(0), tap(1));
                                for iy in iy0..iy0 + bh {
                                    let Some(oy) = out_row(iy, ky) else {
                                        continue;
                                    };
                                    let at = (iy - iy0) * self.w;
                                    let (a, b) = (&t0[at..][..self.w], &t1[at..][..self.w]);
                                    let dst = &mut o_plane[oy * self.ow..][..2 * self.w];
                                    for ((d, &x0), &x1) in dst.chunks_exact_mut(2).zip(a).zip(b) {
                                        d[0] += x0;
                                        d[1] += x1;
                                    }
                                }
                            }
                            return;
                        }
                        for ky in 0..self.kh {
                            for (kx, &(lo, hi)) in spans.iter().enumerate() {
                                let row = &cols[(mi * kn + ky * self.kw + kx) * np..][..np];
                                for iy in iy0..iy0 + bh {
                                    let Some(oy) = out_row(iy, ky) else {
                                        continue;
                                    };
                                    let src = &row[(iy - iy0) * self.w..][..self.w];
                                    let dst = &mut o_plane[oy * self.ow..][..self.ow];
                                    for ix in lo..hi {
                                        dst[ix * sw + kx * dw - pw] += src[ix];
                                    }
                                }
                            }
                        }
                    });
                }
            }
        }
        crate::scratch::give(cols);
        Ok(out)
    }
}

/// The output `[n, m, plane]` before accumulation: each channel's bias, or zeros; an error when
/// the memory is not there.
fn initial_output(n: usize, m: usize, plane: usize, bias: Option<&[f32]>) -> OpResult<Vec<f32>> {
    Ok(match bias {
        Some(b) => {
            let mut out = crate::scratch::take(n * m * plane)?;
            for _ in 0..n {
                for &v in &b[..m] {
                    out.extend(std::iter::repeat_n(v, plane));
                }
            }
            out
        }
        None => crate::scratch::zeros(n * m * plane)?,
    })
}

crate::multiversion! {
/// [`Conv2d::run`], compiled for AVX2 where the CPU has it (the depthwise loops and im2col).
fn run_conv2d(
    conv: &Conv2d<'_>,
    x: &[f32],
    weights: &[f32],
    bias: Option<&[f32]>,
    post: Option<&mut dyn PostOp>,
) -> OpResult<(Vec<f32>, bool)> {
    conv.run_inline(x, weights, bias, post)
}
}

crate::multiversion! {
/// [`ConvTranspose2d::run`], compiled for AVX2 where the CPU has it.
fn run_conv_transpose2d(
    conv: &ConvTranspose2d,
    x: &[f32],
    weights: &[f32],
    bias: Option<&[f32]>,
) -> OpResult<Vec<f32>> {
    conv.run_inline(x, weights, bias)
}
}

/// Fills a slice that is usually one or two elements long, without a `memset` call for those.
#[inline(always)]
fn fill_few<T: Copy>(s: &mut [T], v: T) {
    match s {
        [] => {}
        [a] => *a = v,
        [a, b] => {
            *a = v;
            *b = v;
        }
        _ => s.fill(v),
    }
}

/// The output columns `lo..hi` whose input column `ox * stride + offset - pad` lies in
/// `0..width`.
pub(crate) fn valid_span(
    ow: usize,
    stride: usize,
    offset: usize,
    pad: usize,
    width: usize,
) -> (usize, usize) {
    // ox * stride + offset >= pad  and  ox * stride + offset - pad < width
    let lo = pad.saturating_sub(offset).div_ceil(stride);
    let hi = if width + pad > offset {
        ((width + pad - offset - 1) / stride + 1).min(ow)
    } else {
        0
    };
    (lo.min(ow), hi)
}

/// Bytes of im2col columns built at a time.
const COLS_BYTES: usize = 256 << 10;
/// The fewest output columns an im2col band holds ([`COLS_BYTES`] permitting fewer).
const MIN_COLS: usize = 256;

thread_local! {
    /// Each thread's im2col column buffer, kept between bands and runs.
    static COLS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f` with this thread's column buffer of `len` elements ([`crate::par::with_buffer`]).
fn with_cols<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    crate::par::with_buffer(&COLS, len, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_spans() {
        // width 5, pad 1, kernel tap 0, stride 1: ox 0 reads -1 (pad), ox 1..=5 read 0..=4.
        assert_eq!(valid_span(5, 1, 0, 1, 5), (1, 5));
        assert_eq!(valid_span(5, 1, 2, 1, 5), (0, 4));
        // stride 2, pad 1, tap 0: ox 0 → -1, ox 1 → 1, ox 2 → 3; width 5 → (1, 3).
        assert_eq!(valid_span(3, 2, 0, 1, 5), (1, 3));
        assert_eq!(valid_span(4, 1, 9, 0, 5), (0, 0));
    }
}
