//! f32 MaxPool and AveragePool over 2-D planes without dilation, each plane as whole rows: the
//! window rows of an output row reduced down the columns over whole input rows, then the
//! windows wholly inside the row reduced across: in pairs for windows of two side by side,
//! else tap by tap over all of them (for a stride above 1, on the row split by column phase,
//! so each tap reads a contiguous run). The loops are compiled for the widest vectors the CPU
//! has and written in groups of eight and four lanes, since a small plane's rows are shorter
//! than what a loop the compiler vectorizes by itself needs; where the windows tile the rows in
//! pairs, the pass across runs over the whole plane at once. Windows that reach into the
//! padding take a plain loop; a plane's NaN check is made once.
//!
//! Each output is the fold the reference kernels in `ops::pool` define, in the same order, so
//! the two agree bit for bit (NaN payloads aside): MaxPool's largest value that is not NaN (NaN
//! where the window's first value is, or where all of them are), AveragePool's sum down the
//! columns then across them (the order ONNX Runtime adds a window in where its vector kernel
//! applies), divided by the count.

use crate::error::OpResult;
use crate::fast::geometry::Spatial;

/// The planes of one 2-D pool: `planes` planes of `h × w`, and the window geometry.
#[derive(Debug, Clone, Copy)]
pub struct Pool2d<'a> {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub geo: &'a Spatial,
}

/// One spatial axis of a pool: each output index's span of input positions (`lo..hi`, the
/// taps inside the input) and the taps inside the padded input.
#[derive(Debug)]
struct Axis {
    k: usize,
    s: usize,
    spans: Vec<(usize, usize)>,
    padded: Vec<usize>,
    /// The run of output indices whose windows lie wholly inside the input.
    full: std::ops::Range<usize>,
}

impl Axis {
    fn new(geo: &Spatial, d: usize, len: usize) -> Axis {
        let (k, s) = (geo.kernel[d], geo.strides[d].max(1));
        let (pb, pe) = (geo.pad_begin[d], geo.pad_end[d]);
        let spans: Vec<(usize, usize)> = (0..geo.out[d])
            .map(|o| {
                let start = o * s;
                (
                    start.saturating_sub(pb).min(len),
                    (start + k).saturating_sub(pb).min(len),
                )
            })
            .collect();
        let padded = (0..geo.out[d])
            .map(|o| (len + pb + pe).saturating_sub(o * s).min(k))
            .collect();
        let is_full = |c: &(usize, usize)| c.1 - c.0 == k;
        let i0 = spans.iter().position(is_full).unwrap_or(spans.len());
        let i1 = i0 + spans[i0..].iter().take_while(|c| is_full(c)).count();
        Axis {
            k,
            s,
            spans,
            padded,
            full: i0..i1,
        }
    }

    /// The run of full windows of `row`: its first column, the elements it reads, and the
    /// length of each column phase of those; `None` when no window is full.
    fn full_run<'a>(&self, row: &'a [f32]) -> Option<(usize, &'a [f32], usize)> {
        let n = self.full.len();
        let c = self.spans.get(self.full.start)?.0;
        (n > 0).then(|| {
            let len = (n - 1) * self.s + self.k;
            (c, &row[c..c + len], n + (self.k - 1) / self.s)
        })
    }
}

/// The larger of `a` and `b` where a NaN `a` gives way to `b` (the reference kernels' fold).
#[inline(always)]
fn max_step(a: f32, b: f32) -> f32 {
    if b > a || a.is_nan() { b } else { a }
}

/// `out[i] = f(a[i], b[i])` (`a` and `b` at least as long as `out`), in whole groups of eight
/// lanes, then four, then one at a time: a pool's rows are often shorter than the 64 elements
/// after which a loop the compiler vectorizes by itself runs its vector code.
#[inline(always)]
fn zip_with(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    let n = out.len();
    let (a, b) = (&a[..n], &b[..n]);
    let (o8, o_rest) = out.as_chunks_mut::<8>();
    let (a8, a_rest) = a.as_chunks::<8>();
    let (b8, b_rest) = b.as_chunks::<8>();
    for ((o, a), b) in o8.iter_mut().zip(a8).zip(b8) {
        *o = std::array::from_fn(|i| f(a[i], b[i]));
    }
    let (o4, o_rest) = o_rest.as_chunks_mut::<4>();
    let (a4, a_rest) = a_rest.as_chunks::<4>();
    let (b4, b_rest) = b_rest.as_chunks::<4>();
    for ((o, a), b) in o4.iter_mut().zip(a4).zip(b4) {
        *o = std::array::from_fn(|i| f(a[i], b[i]));
    }
    for ((o, &a), &b) in o_rest.iter_mut().zip(a_rest).zip(b_rest) {
        *o = f(a, b);
    }
}

/// `out[i] = f(out[i], a[i])`, grouped as [`zip_with`] (for folds that keep no select: a max
/// kept in place compiles to masked stores, which the next step's loads wait on).
#[inline(always)]
fn update(out: &mut [f32], a: &[f32], f: impl Fn(f32, f32) -> f32) {
    let a = &a[..out.len()];
    let (o8, o_rest) = out.as_chunks_mut::<8>();
    let (a8, a_rest) = a.as_chunks::<8>();
    for (o, a) in o8.iter_mut().zip(a8) {
        *o = std::array::from_fn(|i| f(o[i], a[i]));
    }
    let (o4, o_rest) = o_rest.as_chunks_mut::<4>();
    let (a4, a_rest) = a_rest.as_chunks::<4>();
    for (o, a) in o4.iter_mut().zip(a4) {
        *o = std::array::from_fn(|i| f(o[i], a[i]));
    }
    for (o, &a) in o_rest.iter_mut().zip(a_rest) {
        *o = f(*o, a);
    }
}

/// `out[i] = f(a[i])`, grouped as [`zip_with`].
#[inline(always)]
fn map(out: &mut [f32], a: &[f32], f: impl Fn(f32) -> f32) {
    update(out, a, |_, v| f(v));
}

/// `down` = the sum down each column of rows `rows` (at least one) of the plane `xp` (`w`
/// wide), each column summed from 0 as the reference kernel does (so -0 sums alike).
#[inline(always)]
fn sum_rows(down: &mut [f32], xp: &[f32], w: usize, rows: std::ops::Range<usize>) {
    let row = |r: usize| &xp[r * w..][..w];
    let (r0, r1) = (rows.start, rows.end);
    if r1 - r0 == 1 {
        map(down, row(r0), |v| 0.0 + v);
    } else {
        zip_with(down, row(r0), row(r0 + 1), |a, b| (0.0 + a) + b);
        for r in r0 + 2..r1 {
            update(down, row(r), |d, v| d + v);
        }
    }
}

/// `out[j] = f(span[2j], span[2j + 1])`, grouped as [`zip_with`] (each group's pairs split
/// into even and odd lanes by shuffles).
#[inline(always)]
fn pairs(out: &mut [f32], span: &[f32], f: impl Fn(f32, f32) -> f32) {
    let span = &span[..2 * out.len()];
    let (o8, o_rest) = out.as_chunks_mut::<8>();
    let (p8, p_rest) = span.as_chunks::<16>();
    for (o, p) in o8.iter_mut().zip(p8) {
        *o = std::array::from_fn(|i| f(p[2 * i], p[2 * i + 1]));
    }
    for (o, p) in o_rest.iter_mut().zip(p_rest.as_chunks::<2>().0) {
        *o = f(p[0], p[1]);
    }
}

/// Whether `v` holds a NaN, eight lanes at a time.
#[inline(always)]
fn any_nan(v: &[f32]) -> bool {
    let (v8, rest) = v.as_chunks::<8>();
    let mut lanes = [false; 8];
    for c in v8 {
        lanes = std::array::from_fn(|i| lanes[i] | c[i].is_nan());
    }
    lanes.iter().any(|&l| l) || rest.iter().any(|v| v.is_nan())
}

/// `span` split into its first `min(s, k)` column phases of `per` elements each (phase `p`
/// holds `span[p], span[p + s], ...`) in `phases`; elements past the span's end are left as
/// they were (no tap reads them).
#[inline(always)]
fn split_phases(span: &[f32], s: usize, k: usize, per: usize, phases: &mut [f32]) {
    if s == 2 {
        let (even, odd) = phases[..2 * per].split_at_mut(per);
        let pairs = span.len() / 2;
        let (e8, even_rest) = even[..pairs].as_chunks_mut::<8>();
        let (o8, odd_rest) = odd[..pairs].as_chunks_mut::<8>();
        let (pairs8, rest) = span.as_chunks::<16>();
        for ((e, o), p) in e8.iter_mut().zip(o8.iter_mut()).zip(pairs8) {
            *e = std::array::from_fn(|i| p[2 * i]);
            *o = std::array::from_fn(|i| p[2 * i + 1]);
        }
        let (e4, even_rest) = even_rest.as_chunks_mut::<4>();
        let (o4, odd_rest) = odd_rest.as_chunks_mut::<4>();
        let (pairs4, rest) = rest.as_chunks::<8>();
        for ((e, o), p) in e4.iter_mut().zip(o4.iter_mut()).zip(pairs4) {
            *e = std::array::from_fn(|i| p[2 * i]);
            *o = std::array::from_fn(|i| p[2 * i + 1]);
        }
        let (pairs, last) = rest.as_chunks::<2>();
        for ((e, o), p) in even_rest.iter_mut().zip(odd_rest.iter_mut()).zip(pairs) {
            *e = p[0];
            *o = p[1];
        }
        if let Some(&v) = last.first() {
            even[span.len() / 2] = v;
        }
        return;
    }
    for p in 0..s.min(k) {
        for (d, &v) in phases[p * per..(p + 1) * per]
            .iter_mut()
            .zip(span[p..].iter().step_by(s))
        {
            *d = v;
        }
    }
}

/// The input elements tap `kx` of a run of `n` full windows reads: a slice of `span` for a
/// stride of 1, else of the tap's column phase.
#[inline(always)]
fn tap<'a>(
    span: &'a [f32],
    phases: &'a [f32],
    a: &Axis,
    per: usize,
    kx: usize,
    n: usize,
) -> &'a [f32] {
    if a.s == 1 {
        &span[kx..kx + n]
    } else {
        &phases[(kx % a.s) * per + kx / a.s..][..n]
    }
}

/// Scratch elements one plane needs: two rows (column reductions, a fold's other buffer) and
/// the column phases of one.
fn scratch_len(p: &Pool2d<'_>, tiled: bool) -> usize {
    let (k, s) = (p.geo.kernel[1], p.geo.strides[1].max(1));
    if tiled {
        // The window rows' reductions of every output row, a fold's other row, their phases.
        (2 * p.geo.out[0] + 1) * p.w
    } else {
        2 * p.w + s.min(k) * (p.w / s + k + 1)
    }
}

/// Whether the windows tile each row in pairs (two columns, stride two, from the row's first
/// column to its last, none in the padding) and every output row has as many window rows: then
/// the rows of column reductions, laid end to end, are one run of pairs, and the pass across
/// runs over the whole plane at once rather than row by row (a small plane's rows are a few
/// vectors long, and the per-row work would dominate).
fn tiled_pairs(rows: &Axis, cols: &Axis, w: usize) -> bool {
    let ow = cols.spans.len();
    cols.k == 2
        && cols.s == 2
        && cols.full == (0..ow)
        && cols.spans.first().is_some_and(|c| c.0 == 0)
        && w == 2 * ow
        && rows.spans.iter().all(|&(r0, r1)| r1 - r0 == rows.k)
        && rows.padded.iter().all(|&p| p == rows.k)
}

/// `dst` = the step-by-step max of the `k` slices `src(0), src(1), ...` (each at least as long
/// as `dst`), folded in that order. Each step writes a buffer other than the one it reads
/// (`dst` and `tmp` in turn, ending on `dst`): a max kept in place would compile to masked
/// stores, which the next step's loads wait on.
#[inline(always)]
fn fold_max<'a>(dst: &mut [f32], tmp: &mut [f32], k: usize, src: impl Fn(usize) -> &'a [f32]) {
    let n = dst.len();
    let tmp = &mut tmp[..n];
    if k <= 1 {
        dst.copy_from_slice(&src(0)[..n]);
        return;
    }
    let pair = |out: &mut [f32], a: &[f32], b: &[f32]| {
        for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
            *o = max_step(a, b);
        }
    };
    // Step i (1..k) folds src(i) in; the last one writes `dst`.
    for i in 1..k {
        let to_dst = (k - 1 - i).is_multiple_of(2);
        match (i, to_dst) {
            (1, true) => pair(dst, src(0), src(1)),
            (1, false) => pair(tmp, src(0), src(1)),
            (_, true) => pair(dst, tmp, src(i)),
            (_, false) => pair(tmp, dst, src(i)),
        }
    }
}

crate::multiversion! {
    /// One plane of MaxPool: `xp` (`h × w`) into `out` (`oh × ow`).
    fn max_plane(xp: &[f32], out: &mut [f32], w: usize, rows: &Axis, cols: &Axis, buf: &mut [f32]) {
        let (down, rest) = buf.split_at_mut(w);
        let (tmp, phases) = rest.split_at_mut(w);
        let ow = cols.spans.len();
        // Most planes hold no NaN: their windows need no check of their first value.
        let nan = any_nan(xp);
        for (orow, &(r0, r1)) in out.chunks_exact_mut(ow).zip(&rows.spans) {
            if r0 == r1 {
                orow.fill(f32::MIN);
                continue;
            }
            let row = |r: usize| &xp[(r0 + r) * w..][..w];
            let first_row = row(0);
            let down: &[f32] = if r1 - r0 == 1 {
                first_row
            } else {
                fold_max(down, tmp, r1 - r0, row);
                &*down
            };
            let full = cols.full.clone();
            if let Some((c, span, per)) = cols.full_run(down) {
                let n = full.len();
                let run = &mut orow[full.clone()];
                if cols.k == 2 && cols.s == 2 {
                    // Windows of two side by side (the usual pooling): pairs, no phases.
                    for (o, p) in run.iter_mut().zip(span.as_chunks::<2>().0) {
                        *o = max_step(p[0], p[1]);
                    }
                } else {
                    if cols.s > 1 {
                        split_phases(span, cols.s, cols.k, per, phases);
                    }
                    let phases = &*phases;
                    fold_max(run, tmp, cols.k, |kx| tap(span, phases, cols, per, kx, n));
                }
                // A window whose first value is NaN is NaN.
                let firsts = &first_row[c..c + (n - 1) * cols.s + 1];
                if nan && any_nan(firsts) {
                    for (o, &f) in run.iter_mut().zip(firsts.iter().step_by(cols.s)) {
                        if f.is_nan() {
                            *o = f;
                        }
                    }
                }
            }
            for i in (0..full.start).chain(full.end..ow) {
                let (c0, c1) = cols.spans[i];
                orow[i] = if c0 == c1 {
                    f32::MIN
                } else if nan && first_row[c0].is_nan() {
                    first_row[c0]
                } else {
                    down[c0 + 1..c1].iter().fold(down[c0], |a, &v| max_step(a, v))
                };
            }
        }
    }
}

crate::multiversion! {
    /// One plane of AveragePool: `xp` (`h × w`) into `out` (`oh × ow`), each window summed
    /// down its columns, then across them, and divided by its count.
    fn avg_plane(
        xp: &[f32],
        out: &mut [f32],
        w: usize,
        rows: &Axis,
        cols: &Axis,
        count_include_pad: bool,
        buf: &mut [f32],
    ) {
        let (down, rest) = buf.split_at_mut(w);
        let phases = &mut rest[w..];
        let ow = cols.spans.len();
        for ((orow, &(r0, r1)), &rows_padded) in
            out.chunks_exact_mut(ow).zip(&rows.spans).zip(&rows.padded)
        {
            if r0 == r1 {
                orow.fill(0.0);
                continue;
            }
            sum_rows(down, xp, w, r0..r1);
            let row_count = if count_include_pad { rows_padded } else { r1 - r0 };
            let full = cols.full.clone();
            if let Some((_, span, per)) = cols.full_run(down) {
                let n = full.len();
                let run = &mut orow[full.clone()];
                let count = (row_count * cols.k).max(1) as f32;
                if cols.k == 2 && cols.s == 2 {
                    // Windows of two side by side (the usual pooling): pairs, no phases.
                    for (o, p) in run.iter_mut().zip(span.as_chunks::<2>().0) {
                        *o = (p[0] + p[1]) / count;
                    }
                } else {
                    if cols.s > 1 {
                        split_phases(span, cols.s, cols.k, per, phases);
                    }
                    let tap = |kx| tap(span, phases, cols, per, kx, n);
                    // The taps summed in order, the last step divided by the count.
                    match cols.k {
                        1 => map(run, tap(0), |v| v / count),
                        2 => zip_with(run, tap(0), tap(1), |a, b| (a + b) / count),
                        k => {
                            zip_with(run, tap(0), tap(1), |a, b| a + b);
                            for kx in 2..k - 1 {
                                update(run, tap(kx), |o, v| o + v);
                            }
                            update(run, tap(k - 1), |o, v| (o + v) / count);
                        }
                    }
                }
            }
            for i in (0..full.start).chain(full.end..ow) {
                let (c0, c1) = cols.spans[i];
                let sum = if c0 == c1 {
                    0.0
                } else {
                    down[c0 + 1..c1].iter().fold(down[c0], |a, &v| a + v)
                };
                let count = if count_include_pad {
                    rows_padded * cols.padded[i]
                } else {
                    (r1 - r0) * (c1 - c0)
                };
                orow[i] = sum / count.max(1) as f32;
            }
        }
    }
}

crate::multiversion! {
    /// [`max_plane`] where the windows tile the rows in pairs ([`tiled_pairs`]): the window
    /// rows' max of every output row first, then those rows, laid end to end, split into even
    /// and odd columns, and the max of each pair over the whole plane at once.
    fn max_plane_pairs(xp: &[f32], out: &mut [f32], w: usize, rows: &Axis, cols: &Axis, buf: &mut [f32]) {
        let ow = cols.spans.len();
        let oh = rows.spans.len();
        let (down, rest) = buf.split_at_mut(oh * w);
        let (tmp, phases) = rest.split_at_mut(w);
        for (d, &(r0, r1)) in down.chunks_exact_mut(w).zip(&rows.spans) {
            let row = |r: usize| &xp[(r0 + r) * w..][..w];
            fold_max(d, tmp, r1 - r0, row);
        }
        let per = oh * ow;
        split_phases(down, 2, 2, per, phases);
        let (even, odd) = phases[..2 * per].split_at(per);
        for ((o, &a), &b) in out[..per].iter_mut().zip(even).zip(odd) {
            *o = max_step(a, b);
        }
        // A window whose first value is NaN is NaN.
        if any_nan(xp) {
            for (orow, &(r0, _)) in out.chunks_exact_mut(ow).zip(&rows.spans) {
                let first_row = &xp[r0 * w..][..w];
                for (o, p) in orow.iter_mut().zip(first_row.as_chunks::<2>().0) {
                    if p[0].is_nan() {
                        *o = p[0];
                    }
                }
            }
        }
    }
}

crate::multiversion! {
    /// [`avg_plane`] where the windows tile the rows in pairs ([`tiled_pairs`]): the window
    /// rows' sums of every output row first, then the pairs over all of them.
    fn avg_plane_pairs(xp: &[f32], out: &mut [f32], w: usize, rows: &Axis, cols: &Axis, buf: &mut [f32]) {
        let ow = cols.spans.len();
        let oh = rows.spans.len();
        let down = &mut buf[..oh * w];
        for (d, &(r0, r1)) in down.chunks_exact_mut(w).zip(&rows.spans) {
            sum_rows(d, xp, w, r0..r1);
        }
        // Every window has `rows.k` rows inside the input and the padding alike.
        let count = (rows.k * 2).max(1) as f32;
        pairs(&mut out[..oh * ow], down, |a, b| (a + b) / count);
    }
}

/// Runs `plane` over each plane of `p` (told whether the windows tile the rows in pairs,
/// [`tiled_pairs`]), planes shared across the intra-op pool.
fn each_plane(
    p: &Pool2d<'_>,
    xs: &[f32],
    plane: impl Fn(&[f32], &mut [f32], &Axis, &Axis, bool, &mut [f32]) + Sync + Send,
) -> OpResult<Vec<f32>> {
    let (oh, ow) = (p.geo.out[0], p.geo.out[1]);
    let len = p.planes * oh * ow;
    let mut y = crate::scratch::take::<f32>(len)?;
    y.resize(len, 0.0);
    if oh * ow == 0 {
        return Ok(y);
    }
    let rows = Axis::new(p.geo, 0, p.h);
    let cols = Axis::new(p.geo, 1, p.w);
    let tiled = tiled_pairs(&rows, &cols, p.w);
    let (hw, scratch) = (p.h * p.w, scratch_len(p, tiled));
    // Every input value is read at least once: a pool of small windows over large planes is
    // as much work as its input.
    let work = (len * p.geo.kernel[0] * p.geo.kernel[1]).max(4 * p.planes * hw);
    crate::par::serial_below(work, || {
        crate::par::for_each_chunk(&mut y, oh * ow, |i, out| {
            crate::par::with_work(scratch, |buf| {
                plane(&xs[i * hw..][..hw], out, &rows, &cols, tiled, buf)
            })
        })
    });
    Ok(y)
}

/// MaxPool of `xs` (`planes × h × w`, row-major) without dilation.
pub fn max_pool(p: &Pool2d<'_>, xs: &[f32]) -> OpResult<Vec<f32>> {
    let w = p.w;
    each_plane(p, xs, |xp, out, rows, cols, tiled, buf| {
        if tiled {
            max_plane_pairs(xp, out, w, rows, cols, buf)
        } else {
            max_plane(xp, out, w, rows, cols, buf)
        }
    })
}

/// AveragePool of `xs` (`planes × h × w`, row-major) without dilation, each window summed down
/// its columns then across them; padding counts in the divisor only with `count_include_pad`.
pub fn avg_pool(p: &Pool2d<'_>, xs: &[f32], count_include_pad: bool) -> OpResult<Vec<f32>> {
    let w = p.w;
    each_plane(p, xs, |xp, out, rows, cols, tiled, buf| {
        if tiled {
            avg_plane_pairs(xp, out, w, rows, cols, buf)
        } else {
            avg_plane(xp, out, w, rows, cols, count_include_pad, buf)
        }
    })
}
