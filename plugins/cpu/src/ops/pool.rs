//! Pooling: MaxPool (with the optional Indices output), AveragePool, GlobalAveragePool and
//! GlobalMaxPool, over any number of spatial dimensions.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::ops::util::num::{FloatElem, Num, float_values, tensor_from_f64, via_f32};

use crate::ops::util::spatial::{SpatialAttrs, kernel_dims, per_dim};

use crate::ops::util::indexing::{c_strides, for_each_index};

use crate::error::{OpError, OpResult};
use crate::fast::FastKernels;
use crate::fast::geometry::Spatial;
use crate::fast::pool2d::Pool2d;
use crate::kernel::AttrValue;
use crate::kernel::add_ms;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::composite::Arg;
use crate::ops::composite::Composite;
use crate::ops::util::args::{input, opt_input};
use crate::tensor::Tensor;
use crate::{bail, dispatch_float, with_types};

pub fn register(reg: &mut Registry) {
    add(reg, "MaxPool", 1, |n| build_pool(n, PoolKind::Max));
    add(reg, "LpPool", 1, build_lp_pool);
    add(reg, "MaxUnpool", 9, build_max_unpool);
    add(reg, "AveragePool", 1, |n| build_pool(n, PoolKind::Avg));
    add(reg, "GlobalAveragePool", 1, |n| build_global(n, false));
    add(reg, "GlobalMaxPool", 1, |n| build_global(n, true));
    add_ms(reg, "NhwcMaxPool", build_nhwc_max_pool);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolKind {
    Max,
    Avg,
}

/// The windows of a pool over one (n, c) plane: for each output position, the in-plane offsets
/// of the taps inside the input and the number of taps inside the padded input.
struct Windows {
    /// `ranges[o]..ranges[o + 1]` indexes `taps` for output position `o`.
    ranges: Vec<usize>,
    taps: Vec<(usize, usize)>,
    padded_counts: Vec<usize>,
}

fn windows(input: &[usize], geo: &Spatial) -> Windows {
    let nd = input.len();
    let c_str = c_strides(input);
    // Column-major strides, for storage_order = 1.
    let mut f_str = vec![1usize; nd];
    for d in 1..nd {
        f_str[d] = f_str[d - 1] * input[d - 1];
    }
    // Per dim and output index: the input positions of the taps that fall inside the input (in
    // tap order), and how many taps fall inside the padded input. Computed per dim rather than
    // per tap, so a window mostly made of padding (SAME padding of a huge kernel) costs what
    // its taps inside the input cost.
    let per_dim: Vec<Vec<(Vec<usize>, usize)>> = (0..nd)
        .map(|d| {
            let (n, k) = (input[d] as i128, geo.kernel[d] as i128);
            let (s, dl) = (geo.strides[d] as i128, geo.dilations[d].max(1) as i128);
            let (pb, pe) = (geo.pad_begin[d] as i128, geo.pad_end[d] as i128);
            (0..geo.out[d])
                .map(|o| {
                    // The position of tap 0; tap t is at start + t·dl.
                    let start = o as i128 * s - pb;
                    let first = if start >= 0 {
                        0
                    } else {
                        (-start + dl - 1) / dl
                    };
                    let last = if start >= n {
                        -1
                    } else {
                        ((n - 1 - start) / dl).min(k - 1)
                    };
                    let inside = (first..=last).map(|t| (start + t * dl) as usize).collect();
                    let padded = ((n + pe - start + dl - 1) / dl).clamp(0, k) as usize;
                    (inside, padded)
                })
                .collect()
        })
        .collect();
    let mut w = Windows {
        ranges: vec![0],
        taps: Vec::new(),
        padded_counts: Vec::new(),
    };
    for_each_index(&geo.out, |o| {
        let dims: Vec<&(Vec<usize>, usize)> = (0..nd).map(|d| &per_dim[d][o[d]]).collect();
        let padded = dims.iter().fold(1usize, |a, (_, p)| a.saturating_mul(*p));
        let counts: Vec<usize> = dims.iter().map(|(inside, _)| inside.len()).collect();
        if counts.iter().all(|&c| c > 0) {
            for_each_index(&counts, |t| {
                let (mut off, mut foff) = (0, 0);
                for d in 0..nd {
                    let i = dims[d].0[t[d]];
                    off += i * c_str[d];
                    foff += i * f_str[d];
                }
                w.taps.push((off, foff));
            });
        }
        w.ranges.push(w.taps.len());
        w.padded_counts.push(padded);
    });
    w
}

struct Pool {
    op: String,
    kind: PoolKind,
    attrs: SpatialAttrs,
    kernel: Vec<usize>,
    count_include_pad: bool,
    storage_order: bool,
    want_indices: bool,
}

impl Pool {
    fn geometry(&self, shape: &[usize]) -> OpResult<(Spatial, usize, usize)> {
        let op = &self.op;
        if shape.len() != self.kernel.len() + 2 {
            bail!(
                "{op}: input of shape {shape:?} does not match kernel_shape {:?} (expected rank {})",
                self.kernel,
                self.kernel.len() + 2
            );
        }
        let geo = self.attrs.resolve(op, &shape[2..], &self.kernel)?;
        geo.checked_output(&shape[..2])?;
        Ok((geo, shape[0] * shape[1], shape[2..].iter().product()))
    }

    fn out_shape(shape: &[usize], geo: &Spatial) -> Vec<usize> {
        let mut s = shape[..2].to_vec();
        s.extend_from_slice(&geo.out);
        s
    }

    fn max<T: Num + FastKernels>(&self, x: &ArrayViewD<'_, T>) -> OpResult<Vec<Tensor>> {
        let (geo, planes, plane) = self.geometry(x.shape())?;
        let xc = x.as_standard_layout();
        let xs = xc
            .as_slice()
            .ok_or_else(|| OpError(format!("{}: input not contiguous", self.op)))?;
        let spatial = &x.shape()[2..];
        if spatial.len() == 2 && !self.want_indices && geo.dilations.iter().all(|&d| d == 1) {
            let (h, w) = (spatial[0], spatial[1]);
            let p = Pool2d {
                planes,
                h,
                w,
                geo: &geo,
            };
            let y = match T::max_pool2d(&p, xs) {
                Some(y) => y?,
                None => max_2d(xs, planes, (h, w), &geo)?,
            };
            return Ok(vec![Tensor::from_vec(
                &Self::out_shape(x.shape(), &geo),
                y,
            )?]);
        }
        let w = windows(spatial, &geo);
        let nout = w.padded_counts.len();
        let mut y = Vec::with_capacity(planes * nout);
        let mut idx = Vec::with_capacity(if self.want_indices { planes * nout } else { 0 });
        for (p, xp) in xs.chunks(plane.max(1)).enumerate().take(planes) {
            for o in 0..nout {
                let mut best = T::lowest();
                let mut best_i = 0usize;
                let mut first = true;
                for &(off, foff) in w.taps.get(w.ranges[o]..w.ranges[o + 1]).unwrap_or(&[]) {
                    let v = xp.get(off).copied().unwrap_or(best);
                    if first || v > best {
                        best = v;
                        best_i = if self.storage_order { foff } else { off };
                        first = false;
                    }
                }
                y.push(best);
                if self.want_indices {
                    idx.push((p * plane + best_i) as i64);
                }
            }
        }
        let shape = Self::out_shape(x.shape(), &geo);
        let mut out = vec![Tensor::from_vec(&shape, y)?];
        if self.want_indices {
            out.push(Tensor::from_vec(&shape, idx)?);
        }
        Ok(out)
    }

    fn avg<T: FloatElem + FastKernels>(&self, x: &ArrayViewD<'_, T>) -> OpResult<Vec<Tensor>> {
        let (geo, planes, plane) = self.geometry(x.shape())?;
        let spatial = &x.shape()[2..];
        if spatial.len() == 2 && geo.dilations.iter().all(|&d| d == 1) {
            let xc = x.as_standard_layout();
            let xs = xc
                .as_slice()
                .ok_or_else(|| OpError(format!("{}: input not contiguous", self.op)))?;
            let (h, w) = (spatial[0], spatial[1]);
            let p = Pool2d {
                planes,
                h,
                w,
                geo: &geo,
            };
            let fast = sums_by_columns(w, &geo)
                .then(|| T::avg_pool2d(&p, xs, self.count_include_pad))
                .flatten();
            let y = match fast {
                Some(y) => y?,
                None => avg_2d(xs, planes, (h, w), &geo, self.count_include_pad),
            };
            return Ok(vec![Tensor::from_vec(
                &Self::out_shape(x.shape(), &geo),
                y,
            )?]);
        }
        let w = windows(&x.shape()[2..], &geo);
        let xc = x.as_standard_layout();
        let xs = xc
            .as_slice()
            .ok_or_else(|| OpError(format!("{}: input not contiguous", self.op)))?;
        let nout = w.padded_counts.len();
        // 2-D windows without dilation went to `avg_2d`; the others are summed in tap order.
        let at = |xp: &[T], off: usize| xp.get(off).map_or(T::lit(0.0), |v| v.to_acc());
        let mut y = Vec::with_capacity(planes * nout);
        for xp in xs.chunks(plane.max(1)).take(planes) {
            for o in 0..nout {
                let taps = w.taps.get(w.ranges[o]..w.ranges[o + 1]).unwrap_or(&[]);
                let sum: T::Acc = taps
                    .iter()
                    .fold(T::lit(0.0), |a, &(off, _)| a + at(xp, off));
                let count = if self.count_include_pad {
                    w.padded_counts[o]
                } else {
                    taps.len()
                };
                y.push(T::from_acc(sum / T::lit(count.max(1) as f64)));
            }
        }
        Ok(vec![Tensor::from_vec(
            &Self::out_shape(x.shape(), &geo),
            y,
        )?])
    }
}

/// The larger of `a` and `b`, where a NaN `a` gives way to `b`: folded from a non-NaN value it
/// is the largest non-NaN value.
#[inline(always)]
fn ignore_nan_max<T: Num>(a: T, b: T) -> T {
    if b > a || a.is_nan() { b } else { a }
}

/// The input span `lo..hi` that output position `o`'s window covers along one dimension of
/// `len` (kernel `k`, stride `s`, `pad` before), without dilation.
fn window_span(o: usize, k: usize, s: usize, pad: usize, len: usize) -> (usize, usize) {
    let start = o * s;
    (
        start.saturating_sub(pad).min(len),
        (start + k).saturating_sub(pad).min(len),
    )
}

/// How many of output position `o`'s window taps fall inside the padded input along one
/// dimension of `len` (pads `pb` before and `pe` after), without dilation.
fn padded_taps(o: usize, k: usize, s: usize, (pb, pe): (usize, usize), len: usize) -> usize {
    (len + pb + pe).saturating_sub(o * s).min(k)
}

/// Whether ONNX Runtime sums a 2-D average window column by column (each column top to bottom,
/// then the columns left to right), as its vector kernel does where it applies, rather than
/// row by row. Summing in the same order gives the same roundings, which requantizing models
/// amplify.
fn sums_by_columns(width: usize, geo: &Spatial) -> bool {
    geo.dilations.iter().all(|&d| d == 1)
        && geo.strides[1] <= 2
        && geo.kernel.iter().all(|&k| k <= 32)
        && width + geo.pad_begin[1] + geo.pad_end[1] <= 2048 - 16
}

/// AveragePool over 2-D planes without dilation, planes shared across the pool. Where ONNX
/// Runtime sums by columns ([`sums_by_columns`]) each output row's window rows are first summed
/// down the columns over whole input rows (a loop that vectorizes), then each window across its
/// columns; elsewhere each window is summed row by row. Padding counts in the divisor only with
/// `count_include_pad`; a window wholly in the padding is 0.
fn avg_2d<T: FloatElem>(
    xs: &[T],
    planes: usize,
    (h, w): (usize, usize),
    geo: &Spatial,
    count_include_pad: bool,
) -> Vec<T> {
    let (oh, ow) = (geo.out[0], geo.out[1]);
    let (kh, kw) = (geo.kernel[0], geo.kernel[1]);
    let zero = T::lit(0.0);
    let cols: Vec<(usize, usize, usize)> = (0..ow)
        .map(|ox| {
            let (c0, c1) = window_span(ox, kw, geo.strides[1], geo.pad_begin[1], w);
            let padded = (geo.pad_begin[1], geo.pad_end[1]);
            (c0, c1, padded_taps(ox, kw, geo.strides[1], padded, w))
        })
        .collect();
    let mut y = vec![T::from_acc(zero); planes * oh * ow];
    if oh * ow == 0 {
        return y;
    }
    let by_columns = sums_by_columns(w, geo);
    let work = y.len() * kh * kw;
    crate::par::serial_below(work, || {
        crate::par::for_each_chunk(&mut y, oh * ow, |p, out| {
            let xp = &xs[p * h * w..][..h * w];
            let mut down = vec![zero; if by_columns { w } else { 0 }];
            for (oy, orow) in out.chunks_exact_mut(ow).enumerate() {
                let (r0, r1) = window_span(oy, kh, geo.strides[0], geo.pad_begin[0], h);
                let padded = (geo.pad_begin[0], geo.pad_end[0]);
                let rows_padded = padded_taps(oy, kh, geo.strides[0], padded, h);
                if by_columns {
                    down.fill(zero);
                    for r in r0..r1 {
                        for (d, &v) in down.iter_mut().zip(&xp[r * w..][..w]) {
                            *d = *d + v.to_acc();
                        }
                    }
                }
                for (o, &(c0, c1, cols_padded)) in orow.iter_mut().zip(&cols) {
                    let sum = if r0 == r1 || c0 == c1 {
                        zero
                    } else if by_columns {
                        down[c0 + 1..c1].iter().fold(down[c0], |a, &v| a + v)
                    } else {
                        (r0..r1).fold(zero, |a, r| {
                            xp[r * w + c0..r * w + c1]
                                .iter()
                                .fold(a, |a, v| a + v.to_acc())
                        })
                    };
                    let count = if count_include_pad {
                        rows_padded * cols_padded
                    } else {
                        (r1 - r0) * (c1 - c0)
                    };
                    *o = T::from_acc(sum / T::lit(count.max(1) as f64));
                }
            }
        })
    });
    y
}

/// MaxPool over 2-D planes without dilation: each window's rectangle inside the input read in
/// place (padding never wins a max), planes shared across the pool. Ties and NaN as in the
/// general path: a window's first value, replaced only by a strictly greater one (so NaN when
/// the first value is NaN, else the largest value that is not). Per output row, the window rows
/// are first reduced down the columns over whole input rows (a loop that vectorizes).
fn max_2d<T: Num>(
    xs: &[T],
    planes: usize,
    (h, w): (usize, usize),
    geo: &Spatial,
) -> OpResult<Vec<T>> {
    let (oh, ow) = (geo.out[0], geo.out[1]);
    let cols: Vec<(usize, usize)> = (0..ow)
        .map(|ox| window_span(ox, geo.kernel[1], geo.strides[1], geo.pad_begin[1], w))
        .collect();
    // A recycled buffer where one fits (a new one is faulted in page by page).
    let len = planes * oh * ow;
    let mut y = crate::scratch::take_any::<T>(len)?;
    y.resize(len, T::lowest());
    if oh * ow == 0 || h * w == 0 {
        return Ok(y);
    }
    // Each input value is read (and compared) at least once: a pool of small windows over
    // large planes is as much work as its input, four element steps a value.
    let work = (y.len() * geo.kernel[0] * geo.kernel[1]).max(4 * planes * h * w);
    crate::par::serial_below(work, || {
        crate::par::for_each_chunk(&mut y, oh * ow, |p, out| {
            let xp = &xs[p * h * w..][..h * w];
            // The max down each column of an output row's window rows: whole input rows at a
            // time, then each window's columns of it.
            let mut down = vec![T::lowest(); w];
            let mut phases = Vec::new();
            for (oy, orow) in out.chunks_exact_mut(ow).enumerate() {
                let (r0, r1) = window_span(oy, geo.kernel[0], geo.strides[0], geo.pad_begin[0], h);
                if r0 == r1 {
                    continue;
                }
                let first_row = &xp[r0 * w..][..w];
                // One window row: the input row is its own max down the columns.
                let rows = if r1 - r0 == 1 {
                    first_row
                } else {
                    down.copy_from_slice(first_row);
                    for r in r0 + 1..r1 {
                        for (m, &v) in down.iter_mut().zip(&xp[r * w..][..w]) {
                            *m = ignore_nan_max(*m, v);
                        }
                    }
                    &down
                };
                across(
                    orow,
                    rows,
                    first_row,
                    &cols,
                    (geo.kernel[1], geo.strides[1]),
                    &mut phases,
                );
            }
        })
    });
    Ok(y)
}

/// One output row of [`max_2d`] from `down` (the window rows' max down each column) and
/// `first_row` (the window's first input row): each window's max across its columns, NaN when
/// its first value is. The windows wholly inside the row go tap by tap over all of them (a loop
/// that vectorizes, each window's values folded in the same order as one at a time), reading
/// `down` split by column phase into `phases` when the stride is above 1; the others fold their
/// span.
fn across<T: Num>(
    orow: &mut [T],
    down: &[T],
    first_row: &[T],
    cols: &[(usize, usize)],
    (k, s): (usize, usize),
    phases: &mut Vec<T>,
) {
    let window = |o: &mut T, (c0, c1): (usize, usize)| {
        if c0 == c1 {
            return;
        }
        let best = down[c0 + 1..c1]
            .iter()
            .fold(down[c0], |a, &v| ignore_nan_max(a, v));
        let first = first_row[c0];
        *o = if first.is_nan() { first } else { best };
    };
    let full = |c: &(usize, usize)| c.1 - c.0 == k;
    let i0 = cols.iter().position(full).unwrap_or(cols.len());
    let i1 = i0 + cols[i0..].iter().take_while(|c| full(c)).count();
    if i1 > i0 && k > 0 {
        // Window `j` of the run starts at column `c + j·s`; its tap `kx` is column
        // `c + kx + j·s`, which is element `j + kx / s` of phase `kx % s` (every s-th column
        // from `c + kx % s`): each tap reads a contiguous run of one phase.
        let (c, n, s) = (cols[i0].0, i1 - i0, s.max(1));
        let run = &mut orow[i0..i1];
        let span = &down[c..c + (n - 1) * s + k];
        if s == k && s > 1 {
            // Windows side by side (the usual pooling): each folds its own k values in
            // place, no phase copies.
            for ((o, w), &f) in run
                .iter_mut()
                .zip(span.chunks_exact(k))
                .zip(first_row[c..].iter().step_by(s))
            {
                let best = w[1..].iter().fold(w[0], |a, &v| ignore_nan_max(a, v));
                *o = if f.is_nan() { f } else { best };
            }
            for i in (0..i0).chain(i1..orow.len()) {
                window(&mut orow[i], cols[i]);
            }
            return;
        }
        let per = n + (k - 1) / s;
        phases.clear();
        if s > 1 {
            for p in 0..s.min(k) {
                phases.extend(span[p..].iter().step_by(s).take(per).copied());
                phases.resize((p + 1) * per, T::lowest());
            }
        }
        let tap = |kx: usize| -> &[T] {
            if s == 1 {
                &span[kx..kx + n]
            } else {
                &phases[(kx % s) * per + kx / s..][..n]
            }
        };
        run.copy_from_slice(tap(0));
        for kx in 1..k {
            for (o, &v) in run.iter_mut().zip(tap(kx)) {
                *o = ignore_nan_max(*o, v);
            }
        }
        for (j, o) in run.iter_mut().enumerate() {
            let f = first_row[c + j * s];
            if f.is_nan() {
                *o = f;
            }
        }
    }
    for i in (0..i0).chain(i1..orow.len()) {
        window(&mut orow[i], cols[i]);
    }
}

fn build_pool(n: &NodeDef, kind: PoolKind) -> OpResult<Box<dyn OpKernel>> {
    let kernel_shape = kernel_dims(&n.op_type, &n.req_ints("kernel_shape")?)?;
    let storage_order = n.attr_int_or("storage_order", 0)? != 0;
    let pool = Pool {
        op: n.op_type.clone(),
        kind,
        attrs: SpatialAttrs::parse(n)?,
        kernel: kernel_shape,
        count_include_pad: n.attr_int_or("count_include_pad", 0)? != 0,
        storage_order,
        want_indices: n.num_outputs > 1,
    };
    Ok(kernel(move |inputs| {
        let op = &pool.op;
        let x = input(op, inputs, 0)?;
        match pool.kind {
            PoolKind::Max => with_types!(
                x.clone(),
                |a| pool.max(&a),
                [F32, F64, F16, BF16, I8, U8],
                op
            ),
            PoolKind::Avg => dispatch_float!(x.clone(), |a| pool.avg(&a), op),
        }
    }))
}

/// `f` folded over `v` (in the accumulator type) in eight interleaved partial results, then
/// those folded together.
fn lanes8<T: FloatElem>(v: &[T], init: T::Acc, f: impl Fn(T::Acc, T::Acc) -> T::Acc) -> T::Acc {
    let mut acc = [init; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = f(*a, x.to_acc());
        }
    }
    for (a, x) in acc.iter_mut().zip(rest) {
        *a = f(*a, x.to_acc());
    }
    acc.into_iter().fold(init, f)
}

/// The sum of `v` in the order ONNX Runtime's global pooling adds it: four lanes over the
/// whole groups of four, the lanes added as `(l0 + l2) + (l1 + l3)`, then the tail one by one.
/// Dynamically quantized models requantize the result, so an order that rounds differently
/// can move a quantized value by a step and the model's output by far more than an ulp.
fn sum4<T: FloatElem>(v: &[T]) -> T::Acc {
    let mut acc = [T::lit(0.0); 4];
    let chunks = v.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = *a + x.to_acc();
        }
    }
    let mut s = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    for x in rest {
        s = s + x.to_acc();
    }
    s
}

fn global<T: FloatElem>(op: &str, x: &ArrayViewD<'_, T>, max: bool) -> OpResult<Tensor> {
    let shape = x.shape();
    if shape.len() < 3 {
        bail!("{op}: input must have rank >= 3 (N, C, spatial...), got shape {shape:?}");
    }
    let planes = shape[0] * shape[1];
    let plane: usize = shape[2..].iter().product();
    if plane == 0 {
        bail!("{op}: input has an empty spatial extent {shape:?}");
    }
    let xc = x.as_standard_layout();
    let xs = xc
        .as_slice()
        .ok_or_else(|| OpError(format!("{op}: input not contiguous")))?;
    // Runs of planes shared across the intra-op pool; each plane reduced in eight partial
    // results, so the loop vectorizes.
    let run = crate::par::chunk_len(planes, ((64 << 10) / plane).max(1), 1);
    let y: Vec<T> = crate::par::build_vec(T::buffer(planes)?, planes, run, |start, out| {
        for c in xs[start * plane..]
            .chunks(plane)
            .take(run.min(planes - start))
        {
            let v = if max {
                let nan = c.iter().find(|v| num_traits::Float::is_nan(v.to_acc()));
                match nan {
                    Some(v) => v.to_acc(),
                    None => lanes8(
                        c,
                        T::lit(f64::NEG_INFINITY),
                        |a, b| if b > a { b } else { a },
                    ),
                }
            } else {
                sum4(c) / T::lit(plane as f64)
            };
            out.extend([T::from_acc(v)]);
        }
    });
    let mut out_shape = shape[..2].to_vec();
    out_shape.extend(std::iter::repeat_n(1, shape.len() - 2));
    let a =
        ArrayD::from_shape_vec(IxDyn(&out_shape), y).map_err(|e| OpError(format!("{op}: {e}")))?;
    Ok(a.into())
}

fn build_global(n: &NodeDef, max: bool) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        via_f32(inputs, |inputs| {
            let x = input(&op, inputs, 0)?;
            one(dispatch_float!(x.clone(), |a| global(&op, &a, max), &op))
        })
    }))
}

// ---- LpPool and MaxUnpool (computed in f64, cast back to the input's float type) ----

fn build_lp_pool(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let attrs = SpatialAttrs::parse(n)?;
    let kernel_attr = kernel_dims(&op, &n.req_ints("kernel_shape")?)?;
    let p = f64::from(if n.opset < 2 {
        n.attr_float_or("p", 2.0)?
    } else {
        n.attr_int_or("p", 2)? as f32
    });
    if p <= 0.0 {
        return Err(n.error(format_args!("p must be positive, got {p}")));
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape();
        if xs.len() != kernel_attr.len() + 2 {
            bail!(
                "{op}: X must have rank {} (N, C and {} spatial dims), got shape {xs:?}",
                kernel_attr.len() + 2,
                kernel_attr.len()
            );
        }
        let in_sp = &xs[2..];
        let geo = attrs.resolve(&op, in_sp, &kernel_attr)?;
        geo.checked_output(&xs[..2])?;
        let xv = float_values(&op, "X", x)?;
        let planes = xs[0] * xs[1];
        let plane_in: usize = in_sp.iter().product();
        let plane_out: usize = geo.out.iter().product();
        // For each output position: the in-plane offsets of the taps inside the input.
        let w = windows(in_sp, &geo);
        let windows: Vec<Vec<usize>> = w
            .ranges
            .windows(2)
            .map(|r| w.taps[r[0]..r[1]].iter().map(|&(off, _)| off).collect())
            .collect();
        let mut y = Vec::with_capacity(planes * plane_out);
        for pl in 0..planes {
            let base = pl * plane_in;
            for taps in &windows {
                let s: f64 = taps
                    .iter()
                    .map(|&t| xv.get(base + t).map_or(0.0, |v| v.abs().powf(p)))
                    .sum();
                y.push(s.powf(1.0 / p));
            }
        }
        let mut shape = xs[..2].to_vec();
        shape.extend_from_slice(&geo.out);
        one(tensor_from_f64(x.elem_type(), &shape, y))
    }))
}

fn build_max_unpool(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let kernel_attr = kernel_dims(&op, &n.req_ints("kernel_shape")?)?;
    let nd = kernel_attr.len();
    let strides = per_dim(&op, "strides", &n.attr_ints("strides")?, nd, 1)?;
    let pads = match n.attr_ints("pads")? {
        None => vec![0; 2 * nd],
        Some(p) if p.len() == 2 * nd => p,
        Some(p) => return Err(n.error(format_args!("pads {p:?} must have {} values", 2 * nd))),
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let idx = input(&op, inputs, 1)?;
        let xs = x.shape();
        if xs.len() != nd + 2 {
            bail!("{op}: X must have rank {}, got shape {xs:?}", nd + 2);
        }
        if idx.shape() != xs {
            bail!("{op}: I must have X's shape {xs:?}, got {:?}", idx.shape());
        }
        let mut inferred = xs[..2].to_vec();
        for d in 0..nd {
            let v = (xs[d + 2] as i64 - 1)
                .saturating_mul(strides[d])
                .saturating_sub(pads[d])
                .saturating_sub(pads[d + nd])
                .saturating_add(kernel_attr[d] as i64);
            if v < 0 {
                bail!("{op}: inferred output dim {d} is negative ({v})");
            }
            inferred.push(v as usize);
        }
        let shape: Vec<usize> = match opt_input(inputs, 2) {
            Some(s) => {
                let s = s.to_i64_vec(&format!("{op}: output_shape"))?;
                if s.len() != inferred.len() || s.iter().zip(&inferred).any(|(&a, &b)| a < b as i64)
                {
                    bail!(
                        "{op}: output_shape {s:?} must have {} dims, each at least {inferred:?}",
                        inferred.len()
                    );
                }
                s.iter().map(|&v| v as usize).collect()
            }
            None => inferred.clone(),
        };
        // Sized before the indices are read: a huge output_shape is refused as such.
        let total = crate::limits::checked_len(&shape, 8)?;
        let ninf = crate::limits::checked_len(&inferred, 8)?;
        let mut yinf = vec![0.0f64; ninf];
        let xv = float_values(&op, "X", x)?;
        let iv = idx.to_i64_vec(&format!("{op}: I"))?;
        for (&i, &v) in iv.iter().zip(&xv) {
            let slot = usize::try_from(i)
                .ok()
                .and_then(|i| yinf.get_mut(i))
                .ok_or_else(|| {
                    OpError(format!(
                        "{op}: index {i} is out of range for output shape {inferred:?}"
                    ))
                })?;
            *slot = v;
        }
        let mut y = vec![0.0f64; total];
        let ostr = c_strides(&shape);
        let mut k = 0;
        for_each_index(&inferred, |ii| {
            let off: usize = ii.iter().zip(&ostr).map(|(a, b)| a * b).sum();
            if let (Some(s), Some(v)) = (y.get_mut(off), yinf.get(k)) {
                *s = *v;
            }
            k += 1;
        });
        one(tensor_from_f64(x.elem_type(), &shape, y))
    }))
}

/// NhwcMaxPool: MaxPool of a channels-last 4-D tensor (uint8 or int8).
fn build_nhwc_max_pool(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut attrs = Vec::new();
    for name in [
        "auto_pad",
        "ceil_mode",
        "dilations",
        "kernel_shape",
        "pads",
        "strides",
    ] {
        if let Some(v) = n.attributes.get(name) {
            attrs.push((name, v.clone()));
        }
    }
    let rank = n.attr_ints("kernel_shape")?.map_or(2, |k| k.len()) + 2;
    let to_nchw: Vec<i64> = std::iter::once(0)
        .chain(std::iter::once(rank as i64 - 1))
        .chain(1..rank as i64 - 1)
        .collect();
    let to_nhwc: Vec<i64> = std::iter::once(0)
        .chain(2..rank as i64)
        .chain(std::iter::once(1))
        .collect();
    let mut c = Composite::new(n);
    let x = c.step(
        "Transpose",
        13,
        &[("perm", AttrValue::Ints(to_nchw))],
        &[Some(Arg::In(0))],
    )?;
    let p = c.step("MaxPool", 12, &attrs, &[Some(x)])?;
    let y = c.step(
        "Transpose",
        13,
        &[("perm", AttrValue::Ints(to_nhwc))],
        &[Some(p)],
    )?;
    c.finish(vec![Some(y)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::ops::testing::{ms, t, vals};
    use crate::tensor::TensorRef;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|x| x as f32).collect()).unwrap()
    }

    fn ks(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// 2-D pool geometries for the fast paths' tests, on a 7×9 plane: kernel, strides, pads
    /// (begin, begin, end, end), ceil_mode. Padding on either side, strides 1 to 3, windows
    /// wider than the stride and windows that reach past the padded end.
    type Geometry = ([i64; 2], [i64; 2], [i64; 4], i64);
    const GEOMETRIES: [Geometry; 10] = [
        ([2, 2], [2, 2], [0, 0, 0, 0], 0),
        // One row high, windows side by side (spectrogram models pool frequency alone).
        ([1, 4], [1, 4], [0, 0, 0, 0], 0),
        ([1, 3], [1, 3], [0, 1, 0, 2], 1),
        ([3, 3], [2, 2], [1, 1, 1, 1], 0),
        ([3, 3], [2, 2], [0, 0, 0, 0], 1),
        ([3, 2], [1, 3], [2, 0, 1, 1], 1),
        ([5, 5], [1, 1], [2, 2, 2, 2], 0),
        ([2, 2], [1, 1], [0, 0, 1, 1], 0),
        ([2, 2], [1, 1], [1, 1, 0, 0], 0),
        ([2, 4], [3, 3], [1, 1, 0, 2], 1),
    ];

    #[test]
    fn maxpool_2d_in_place_matches_the_window_walk() {
        // Values with ties, negatives and a NaN; the Indices output sends a node down the
        // general path, so the two paths' first outputs must agree.
        let shape = [2, 3, 7, 9];
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n)
            .map(|i| {
                if i == 40 || i == 100 || i == 190 {
                    f32::NAN
                } else {
                    ((i * 37) % 23) as f32 - 11.0
                }
            })
            .collect();
        let x = Tensor::from_vec(&shape, vals).unwrap();
        for (k, st, pads, ceil) in GEOMETRIES {
            let node = NodeDef::new("MaxPool", 12)
                .with_attr("kernel_shape", ks(&k))
                .with_attr("strides", ks(&st))
                .with_attr("pads", ks(&pads))
                .with_attr("ceil_mode", AttrValue::Int(ceil));
            let fast = run(node.clone(), vec![x.clone()]).unwrap();
            let walk = run(node.with_io(1, 2), vec![x.clone()]).unwrap();
            let (Tensor::F32(a), Tensor::F32(b)) = (&fast[0], &walk[0]) else {
                panic!("float outputs")
            };
            assert_eq!(a.shape(), b.shape(), "{k:?} {st:?} {pads:?} {ceil}");
            assert!(
                a.iter()
                    .zip(b)
                    .all(|(p, q)| p == q || (p.is_nan() && q.is_nan())),
                "{k:?} {st:?} {pads:?} {ceil}: {a:?} vs {b:?}"
            );
        }
    }

    /// The f32 fast kernels (`fast::pool2d`) against the reference kernels, bit for bit, on
    /// every instruction set level this CPU has: each geometry on planes of 7×9, 5×37 (rows long
    /// enough for whole vectors and a remainder), 6×10 and 8×36, values with ties, signed zeros,
    /// infinities and NaN (a window's first value, or any other).
    #[test]
    fn the_fast_2d_pools_match_the_reference_on_every_instruction_set() {
        let planes = |shape: [usize; 4]| {
            let n: usize = shape.iter().product();
            let v = (0..n).map(|i| match (i * 37) % 29 {
                0 => f32::NAN,
                1 => -0.0,
                2 => f32::INFINITY,
                3 => f32::NEG_INFINITY,
                r => (r as f32 - 14.0) * 0.37,
            });
            Tensor::from_vec(&shape, v.collect()).unwrap()
        };
        // Even widths as well: windows of two tile those rows (the whole-plane pass).
        let inputs = [
            planes([2, 3, 7, 9]),
            planes([1, 2, 5, 37]),
            planes([1, 3, 6, 10]),
            planes([2, 1, 8, 36]),
        ];
        let reference = crate::fast::ISAS
            .iter()
            .find(|i| !i.fast)
            .expect("a reference level");
        let same = |a: &Tensor, b: &Tensor| {
            let (Tensor::F32(a), Tensor::F32(b)) = (a, b) else {
                panic!("float outputs")
            };
            a.shape() == b.shape()
                && a.iter()
                    .zip(b)
                    .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
        };
        let mut checked = Vec::new();
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            let ran = crate::fast::with_isa(isa, || {
                for (k, st, pads, ceil) in GEOMETRIES {
                    for (op, include) in [("MaxPool", 0), ("AveragePool", 0), ("AveragePool", 1)] {
                        let node = NodeDef::new(op, 19)
                            .with_attr("kernel_shape", ks(&k))
                            .with_attr("strides", ks(&st))
                            .with_attr("pads", ks(&pads))
                            .with_attr("ceil_mode", AttrValue::Int(ceil))
                            .with_attr("count_include_pad", AttrValue::Int(include));
                        for x in &inputs {
                            let fast = run(node.clone(), vec![x.clone()]).unwrap();
                            let want = crate::fast::with_isa(reference, || {
                                run(node.clone(), vec![x.clone()]).unwrap()
                            })
                            .expect("the reference level is always available");
                            assert!(
                                same(&fast[0], &want[0]),
                                "{op} {k:?} {st:?} {pads:?} ceil {ceil} include {include} on {} \
                                 ({:?}): {:?} vs {:?}",
                                isa.name,
                                x.shape(),
                                fast[0],
                                want[0]
                            );
                        }
                    }
                }
            });
            if ran.is_some() {
                checked.push(isa.name);
            }
        }
        eprintln!("fast 2-D pools checked on: {checked:?}");
        assert!(!checked.is_empty(), "no fast level ran");
    }

    #[test]
    fn maxpool_2d_with_indices_and_ceil() {
        let x = iota(&[1, 1, 4, 4]);
        let n = NodeDef::new("MaxPool", 12)
            .with_attr("kernel_shape", ks(&[2, 2]))
            .with_attr("strides", ks(&[2, 2]))
            .with_io(1, 2);
        let out = run(n, vec![x.clone()]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[[5.0, 7.0], [13.0, 15.0]]]].into_dyn())
        );
        assert_eq!(out[1], Tensor::I64(array![[[[5, 7], [13, 15]]]].into_dyn()));
        let n = NodeDef::new("MaxPool", 12)
            .with_attr("kernel_shape", ks(&[3, 3]))
            .with_attr("strides", ks(&[2, 2]))
            .with_attr("ceil_mode", AttrValue::Int(1));
        let out = run(n, vec![x.clone()]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[[10.0, 11.0], [14.0, 15.0]]]].into_dyn())
        );
        // Column-major indices.
        let n = NodeDef::new("MaxPool", 12)
            .with_attr("kernel_shape", ks(&[2, 2]))
            .with_attr("storage_order", AttrValue::Int(1))
            .with_io(1, 2);
        let out = run(n, vec![iota(&[1, 1, 2, 3])]).unwrap();
        assert_eq!(out[1], Tensor::I64(array![[[[3, 5]]]].into_dyn()));
        // 1-D with pads and dilation on int8.
        let n = NodeDef::new("MaxPool", 12)
            .with_attr("kernel_shape", ks(&[2]))
            .with_attr("dilations", ks(&[2]))
            .with_attr("pads", ks(&[1, 1]));
        let out = run(n, vec![Tensor::I8(array![[[3, -1, 2, 5]]].into_dyn())]).unwrap();
        assert_eq!(out[0], Tensor::I8(array![[[-1, 3, 5, 2]]].into_dyn()));
    }

    /// The 2-D AveragePool (by columns where ONNX Runtime sums so, row by row elsewhere)
    /// against a direct walk of each window, with and without the padding in the divisor.
    #[test]
    fn avgpool_2d_matches_a_walk_of_each_window() {
        let shape = [2, 3, 7, 9];
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        let x = Tensor::from_vec(&shape, vals.clone()).unwrap();
        for (k, st, pads, ceil) in GEOMETRIES {
            for include in [0, 1] {
                let node = NodeDef::new("AveragePool", 19)
                    .with_attr("kernel_shape", ks(&k))
                    .with_attr("strides", ks(&st))
                    .with_attr("pads", ks(&pads))
                    .with_attr("ceil_mode", AttrValue::Int(ceil))
                    .with_attr("count_include_pad", AttrValue::Int(include));
                let out = run(node, vec![x.clone()]).unwrap();
                let Tensor::F32(y) = &out[0] else {
                    panic!("float output")
                };
                let (oh, ow) = (y.shape()[2], y.shape()[3]);
                let (h, w) = (7i64, 9i64);
                for p in 0..6 {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let (y0, x0) =
                                (oy as i64 * st[0] - pads[0], ox as i64 * st[1] - pads[1]);
                            let (mut sum, mut inside, mut padded) = (0.0f64, 0, 0);
                            for r in y0..y0 + k[0] {
                                for c in x0..x0 + k[1] {
                                    let in_pad = r < h + pads[2] && c < w + pads[3];
                                    padded += usize::from(in_pad);
                                    if (0..h).contains(&r) && (0..w).contains(&c) {
                                        sum += vals[p * 63 + (r * w + c) as usize] as f64;
                                        inside += 1;
                                    }
                                }
                            }
                            let count = if include == 1 { padded } else { inside };
                            let want = if inside == 0 { 0.0 } else { sum / count as f64 };
                            let got = y[[p / 3, p % 3, oy, ox]] as f64;
                            assert!(
                                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                                "{k:?} {st:?} {pads:?} {ceil} {include} at {p},{oy},{ox}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn avgpool_pads_and_count_include_pad() {
        let x = iota(&[1, 1, 3, 3]);
        let base = NodeDef::new("AveragePool", 19)
            .with_attr("kernel_shape", ks(&[2, 2]))
            .with_attr("pads", ks(&[1, 1, 0, 0]));
        let out = run(base.clone(), vec![x.clone()]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[[0.0, 0.5, 1.5], [1.5, 2.0, 3.0], [4.5, 5.0, 6.0]]]].into_dyn())
        );
        let inc = base.with_attr("count_include_pad", AttrValue::Int(1));
        let out = run(inc, vec![x]).unwrap();
        assert_eq!(out[0].as_array::<f32>().unwrap()[[0, 0, 0, 0]], 0.0);
        assert_eq!(out[0].as_array::<f32>().unwrap()[[0, 0, 0, 1]], 0.25);
        let same = NodeDef::new("AveragePool", 19)
            .with_attr("kernel_shape", ks(&[3]))
            .with_attr("auto_pad", AttrValue::String(b"SAME_UPPER".to_vec()));
        let out = run(
            same,
            vec![Tensor::F64(array![[[1.0, 2.0, 3.0]]].into_dyn())],
        )
        .unwrap();
        assert_eq!(out[0], Tensor::F64(array![[[1.5, 2.0, 2.5]]].into_dyn()));
    }

    #[test]
    fn global_pools() {
        let x = iota(&[1, 2, 2, 2]);
        let a = run(NodeDef::new("GlobalAveragePool", 1), vec![x.clone()]).unwrap();
        assert_eq!(a[0], Tensor::F32(array![[[[1.5]], [[5.5]]]].into_dyn()));
        let m = run(NodeDef::new("GlobalMaxPool", 1), vec![x]).unwrap();
        assert_eq!(m[0], Tensor::F32(array![[[[3.0]], [[7.0]]]].into_dyn()));
        let e = run(NodeDef::new("GlobalMaxPool", 1), vec![iota(&[2, 2])]).unwrap_err();
        assert!(
            e.0.contains("GlobalMaxPool: input must have rank >= 3"),
            "{e}"
        );
    }

    #[test]
    fn pool_errors() {
        let e = crate::ops::registry()
            .build(&NodeDef::new("MaxPool", 12))
            .err()
            .unwrap();
        assert!(
            e.0.contains("missing required attribute 'kernel_shape'"),
            "{e}"
        );
        let n = NodeDef::new("MaxPool", 12).with_attr("kernel_shape", ks(&[2, 2]));
        let e = run(n.clone(), vec![iota(&[1, 4, 4])]).unwrap_err();
        assert!(e.0.contains("does not match kernel_shape"), "{e}");
        let e = run(
            n.with_attr("strides", ks(&[0, 1])),
            vec![iota(&[1, 1, 4, 4])],
        )
        .unwrap_err();
        assert!(e.0.contains("strides must be positive"), "{e}");
        let n = NodeDef::new("AveragePool", 12).with_attr("kernel_shape", ks(&[2]));
        let e = run(n, vec![Tensor::I32(ArrayD::zeros(IxDyn(&[1, 1, 4])))]).unwrap_err();
        assert_eq!(e.0, "AveragePool: unsupported element type int32");
    }

    #[test]
    fn lp_pool_and_unpool() {
        let x = t(&[1, 1, 4], vec![3.0, -4.0, 0.0, 1.0]);
        let n = NodeDef::new("LpPool", 18)
            .with_attr("kernel_shape", AttrValue::Ints(vec![2]))
            .with_attr("strides", AttrValue::Ints(vec![2]));
        let o = run(n.clone(), vec![x.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![5.0, 1.0]);
        let e = run(n, vec![t(&[4], vec![0.0; 4])]).unwrap_err();
        assert!(e.0.contains("X must have rank 3"), "{e}");

        let u = NodeDef::new("MaxUnpool", 11)
            .with_attr("kernel_shape", AttrValue::Ints(vec![2]))
            .with_attr("strides", AttrValue::Ints(vec![2]));
        let xv = t(&[1, 1, 2], vec![5.0, 7.0]);
        let i = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1, 1, 2]), vec![1, 2]).unwrap());
        let o = run(u.clone(), vec![xv.clone(), i]).unwrap();
        assert_eq!(vals(&o[0]), vec![0.0, 5.0, 7.0, 0.0]);
        let bad = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1, 1, 2]), vec![1, 9]).unwrap());
        let e = run(u, vec![xv, bad]).unwrap_err();
        assert_eq!(
            e.0,
            "MaxUnpool: index 9 is out of range for output shape [1, 1, 4]"
        );
    }

    #[test]
    fn nhwc_max_pool_pools_channels_last() {
        // [1, 2, 2, 2] NHWC: channel 0 holds 1..4, channel 1 holds 10..40.
        let x = Tensor::from_vec(&[1, 2, 2, 2], vec![1u8, 10, 2, 20, 3, 30, 4, 40]).unwrap();
        let n = ms("NhwcMaxPool").with_attr("kernel_shape", AttrValue::Ints(vec![2, 2]));
        let k = crate::ops::registry().build(&n.with_io(1, 1)).unwrap();
        let y = k.run(&[Some(x.view())]).unwrap();
        assert_eq!(
            y[0],
            Tensor::from_vec(&[1, 1, 1, 2], vec![4u8, 40]).unwrap()
        );
    }
}
