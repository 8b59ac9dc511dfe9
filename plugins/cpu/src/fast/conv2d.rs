//! The f32 2-D convolution fast path (NCHW), used by `Conv` for the common case:
//!
//! - **depthwise** (one input and one output channel per group): a direct loop per tap, whose
//!   inner loop runs over a contiguous output row and vectorizes;
//! - **1×1, stride 1, no padding**: the input planes already are the column matrix, one GEMM;
//! - **a plane of a few outputs** (a convolution over a short signal): dot products of the
//!   weight rows with the transposed columns ([`super::dots`]), since packing the weights for a
//!   GEMM would cost more than the product;
//! - **everything else**: im2col built row by row (contiguous spans copied, padding zeroed, no
//!   per-element index arithmetic), then one GEMM per group with the `gemm` crate's SGEMM.
//!
//! The bias initializes the output and the GEMM accumulates onto it (beta = 1).

use super::dots::{NARROW, row_dots};
use crate::kernel::PostOp;
use crate::ops::util::Spatial;
use crate::par::Disjoint;

/// Shapes and geometry of one 2-D convolution.
pub struct Conv2d<'a> {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// Output channels.
    pub m: usize,
    pub group: usize,
    pub kh: usize,
    pub kw: usize,
    pub geo: &'a Spatial,
}

impl Conv2d<'_> {
    pub(crate) fn oh(&self) -> usize {
        self.geo.out[0]
    }
    pub(crate) fn ow(&self) -> usize {
        self.geo.out[1]
    }

    /// The multiply-adds of the convolution.
    pub(crate) fn macs(&self) -> usize {
        [
            self.n,
            self.m,
            self.oh(),
            self.ow(),
            self.c / self.group.max(1),
            self.kh,
            self.kw,
        ]
        .iter()
        .fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Runs the convolution: `x` is `[n, c, h, w]`, `weights` `[m, c / group, kh, kw]`, `bias`
    /// `[m]`; returns `[n, m, oh, ow]`, C order.
    pub fn run(&self, x: &[f32], weights: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        self.run_post(x, weights, bias, None).0
    }

    /// [`run`](Self::run), applying `post` to each part of the output as soon as it is final
    /// (if `post` accepts the output shape); returns whether it did.
    pub fn run_post(
        &self,
        x: &[f32],
        weights: &[f32],
        bias: Option<&[f32]>,
        post: Option<&mut dyn PostOp>,
    ) -> (Vec<f32>, bool) {
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
    ) -> (Vec<f32>, bool) {
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
        let mut out = initial_output(self.n, self.m, plane_out, bias);
        let cg = self.c / self.group;
        let mg = self.m / self.group;
        if cg == 1 && mg == 1 {
            self.depthwise(x, weights, &mut out, post);
            return (out, applied);
        }
        if mg == 0 || out.is_empty() {
            return (out, applied);
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
        let inner = if split {
            gemm::Parallelism::None
        } else {
            crate::par::gemm_parallelism(mg, rows, ranges.iter().map(|r| r.1).max().unwrap_or(0))
        };
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
                with_cols(2 * rows * width, |buf| {
                    let (cols, bt) = buf.split_at_mut(rows * width);
                    let (b, ldb): (&[f32], usize) = if pointwise {
                        (x_g, plane_in)
                    } else {
                        self.im2col(x_g, cg, 0..oh, cols, 0.0);
                        (cols, width)
                    };
                    for (j, col) in bt.chunks_exact_mut(rows).enumerate() {
                        for (p, v) in col.iter_mut().enumerate() {
                            *v = b[p * ldb + j];
                        }
                    }
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
                    self.im2col(x_g, cg, oy0..oy0 + width / ow, cols, 0.0);
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
        (out, applied)
    }

    /// `cols[(ci, ky, kx), (oy, ox)]` for the output rows `oys` = the input pixel each tap reads
    /// (`pad` in the padding).
    #[inline(always)]
    pub(crate) fn im2col<T: Copy>(
        &self,
        x_g: &[T],
        cg: usize,
        oys: std::ops::Range<usize>,
        cols: &mut [T],
        pad: T,
    ) {
        let ow = self.ow();
        let width = oys.len() * ow;
        let (sh, sw) = (self.geo.strides[0], self.geo.strides[1]);
        let (dh, dw) = (self.geo.dilations[0], self.geo.dilations[1]);
        let (ph, pw) = (self.geo.pad_begin[0], self.geo.pad_begin[1]);
        let mut r = 0;
        for ci in 0..cg {
            let plane = &x_g[ci * self.h * self.w..][..self.h * self.w];
            for ky in 0..self.kh {
                for kx in 0..self.kw {
                    let row = &mut cols[r * width..][..width];
                    let (lo, hi) = valid_span(ow, sw, kx * dw, pw, self.w);
                    r += 1;
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
        let (ow, sw, dw, pw) = (
            self.ow(),
            self.geo.strides[1],
            self.geo.dilations[1],
            self.geo.pad_begin[1],
        );
        let plane_out = self.oh() * ow;
        if plane_out == 0 {
            return;
        }
        let spans: Vec<(usize, usize)> = (0..self.kw)
            .map(|kx| valid_span(ow, sw, kx * dw, pw, self.w))
            .collect();
        crate::par::for_each_chunk(out, plane_out, |nc, o_plane| {
            // A function of its own: a closure does not inherit the AVX2 copy's features.
            depthwise_plane(self, (x, weights), &spans, nc, o_plane);
            if let Some(p) = post {
                crate::par::with_work(p.work_len(), |work| p.apply(o_plane, nc * plane_out, work));
            }
        });
    }
}

/// Plane `nc` (image and channel) of [`Conv2d::depthwise`], accumulated onto `o_plane`.
pub(crate) fn depthwise_plane(
    conv: &Conv2d<'_>,
    xw: (&[f32], &[f32]),
    spans: &[(usize, usize)],
    nc: usize,
    o_plane: &mut [f32],
) {
    let (x, weights) = xw;
    let plane_in = conv.h * conv.w;
    let plane = &x[nc * plane_in..][..plane_in];
    let ch = nc % conv.c;
    let wk = &weights[ch * conv.kh * conv.kw..][..conv.kh * conv.kw];
    let sw = conv.geo.strides[1];
    if sw == 1 {
        return depthwise_rows(conv, Phased::whole(plane, conv.w), wk, spans, o_plane);
    }
    let len = Phased::len(conv.h, conv.w, sw);
    crate::par::with_work(len, |buf| {
        let src = Phased::split(plane, conv.w, sw, buf, |v| v);
        depthwise_rows(conv, src, wk, spans, o_plane);
    });
}

/// The rows of a plane with each row's columns split by phase of the column stride `s`: phase
/// `p` of a row holds its columns `p, p + s, p + 2s, ...` contiguously, in `wq = w.div_ceil(s)`
/// slots, so that every tap of a strided convolution reads a contiguous run. With `s = 1`, the
/// plane itself.
#[derive(Clone, Copy)]
pub(crate) struct Phased<'a> {
    data: &'a [f32],
    s: usize,
    wq: usize,
}

impl<'a> Phased<'a> {
    /// A plane read as it is (stride 1).
    pub(crate) fn whole(plane: &'a [f32], w: usize) -> Self {
        Phased {
            data: plane,
            s: 1,
            wq: w,
        }
    }

    /// The slots [`split`](Self::split) fills for an `h × w` plane and stride `s`.
    pub(crate) fn len(h: usize, w: usize, s: usize) -> usize {
        h * s * w.div_ceil(s)
    }

    /// `map` of each element of `plane` (`w` columns), split by phase into `buf` (at least
    /// [`len`](Self::len) slots; the slots past a row's last column in its last phases are
    /// left as they are and never read).
    #[inline(always)]
    pub(crate) fn split<T: Copy>(
        plane: &[T],
        w: usize,
        s: usize,
        buf: &'a mut [f32],
        map: impl Fn(T) -> f32,
    ) -> Self {
        let wq = w.div_ceil(s);
        let rs = s * wq;
        for (src, dst) in plane
            .chunks_exact(w.max(1))
            .zip(buf.chunks_exact_mut(rs.max(1)))
        {
            for (p, phase) in dst.chunks_exact_mut(wq.max(1)).enumerate() {
                for (d, &v) in phase.iter_mut().zip(src.iter().skip(p).step_by(s)) {
                    *d = map(v);
                }
            }
        }
        Phased { data: buf, s, wq }
    }

    /// Row `iy`.
    #[inline(always)]
    fn row(&self, iy: usize) -> &'a [f32] {
        let rs = self.s * self.wq;
        &self.data[iy * rs..][..rs]
    }

    /// `n` input columns `first, first + s, ...` of row `row` (from [`row`](Self::row)).
    #[inline(always)]
    fn run(&self, row: &'a [f32], first: usize, n: usize) -> &'a [f32] {
        &row[(first % self.s) * self.wq + first / self.s..][..n]
    }
}

crate::multiversion! {
/// One depthwise plane accumulated onto `o_plane`: each tap over whole output rows, reading
/// contiguous runs of `src` (split by the column stride).
pub(crate) fn depthwise_rows(
    conv: &Conv2d<'_>,
    src: Phased<'_>,
    wk: &[f32],
    spans: &[(usize, usize)],
    o_plane: &mut [f32],
) {
    let (oh, ow) = (conv.oh(), conv.ow());
    let (sh, sw) = (conv.geo.strides[0], conv.geo.strides[1]);
    let (dh, dw) = (conv.geo.dilations[0], conv.geo.dilations[1]);
    let (ph, pw) = (conv.geo.pad_begin[0], conv.geo.pad_begin[1]);
    for oy in 0..oh {
        let o_row = &mut o_plane[oy * ow..][..ow];
        for ky in 0..conv.kh {
            let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&i| i < conv.h) else {
                continue;
            };
            let row = src.row(iy);
            for (kx, &(lo, hi)) in spans.iter().enumerate() {
                if lo >= hi {
                    continue;
                }
                let wv = wk[ky * conv.kw + kx];
                let first = lo * sw + kx * dw - pw;
                for (o, s) in o_row[lo..hi].iter_mut().zip(src.run(row, first, hi - lo)) {
                    *o += wv * s;
                }
            }
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
    pub fn run(&self, x: &[f32], weights: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        run_conv_transpose2d(self, x, weights, bias)
    }

    #[inline(always)]
    fn run_inline(&self, x: &[f32], weights: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let plane_out = self.oh * self.ow;
        let plane_in = self.h * self.w;
        let mut out = initial_output(self.n, self.m, plane_out, bias);
        let cg = self.c / self.group;
        let mg = self.m / self.group;
        let kn = self.kh * self.kw;
        let rows = mg * kn;
        let mut cols = crate::scratch::zeros(rows * plane_in);
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
                // cols[r, p] = Σ_ci w_g[ci, r] · x_g[ci, p]: A is w_g transposed.
                sgemm_strided(
                    (rows, cg, plane_in),
                    w_g,
                    (1, rows),
                    (x_g, plane_in),
                    (&mut cols, plane_in),
                    false,
                    crate::par::gemm_parallelism(rows, cg, plane_in),
                );
                let o_g = &mut out[(n * self.m + g * mg) * plane_out..][..mg * plane_out];
                crate::par::for_each_chunk(o_g, plane_out, |mi, o_plane| {
                    for ky in 0..self.kh {
                        for (kx, &(lo, hi)) in spans.iter().enumerate() {
                            let row = &cols[(mi * kn + ky * self.kw + kx) * plane_in..][..plane_in];
                            for iy in 0..self.h {
                                let Some(oy) =
                                    (iy * sh + ky * dh).checked_sub(ph).filter(|&o| o < self.oh)
                                else {
                                    continue;
                                };
                                let src = &row[iy * self.w..][..self.w];
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
        crate::scratch::give(cols);
        out
    }
}

/// The output `[n, m, plane]` before accumulation: each channel's bias, or zeros.
fn initial_output(n: usize, m: usize, plane: usize, bias: Option<&[f32]>) -> Vec<f32> {
    match bias {
        Some(b) => {
            let mut out = crate::scratch::take(n * m * plane);
            for _ in 0..n {
                for &v in &b[..m] {
                    out.extend(std::iter::repeat_n(v, plane));
                }
            }
            out
        }
        None => crate::scratch::zeros(n * m * plane),
    }
}

crate::multiversion! {
/// [`Conv2d::run`], compiled for AVX2 where the CPU has it (the depthwise loops and im2col).
fn run_conv2d(
    conv: &Conv2d<'_>,
    x: &[f32],
    weights: &[f32],
    bias: Option<&[f32]>,
    post: Option<&mut dyn PostOp>,
) -> (Vec<f32>, bool) {
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
) -> Vec<f32> {
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

/// `c[m, n] += a[m, k] · b[k, n]` (`=` when not `accumulate`): `a`'s element `(i, p)` is at
/// `i * rs + p * cs`; `b` and `c` are row-major with row strides `ldb` and `ldc` (each may be a
/// band of columns of a wider matrix).
fn sgemm_strided(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    (rs, cs): (usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
    par: gemm::Parallelism,
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

/// [`sgemm_strided`] into `c` given as a pointer, for tasks that write disjoint bands of columns
/// of one output.
///
/// # Safety
/// `c` must be valid for writes of the `m` rows of `n` elements at row stride `ldc >= n`, and no
/// other thread may read or write those elements during the call.
unsafe fn sgemm_raw(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    (rs, cs): (usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    par: gemm::Parallelism,
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
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.as_ptr(),
            cs as isize,
            rs as isize,
            b.as_ptr(),
            1,
            ldb as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

thread_local! {
    /// Each thread's im2col column buffer, kept between bands and runs.
    static COLS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f` with this thread's column buffer of `len` elements ([`crate::par::with_buffer`]).
fn with_cols<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    crate::par::with_buffer(&COLS, len, f)
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
        crate::par::gemm_parallelism(m, k, n),
    );
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
