//! Resize (opsets 10, 11, 13, 18, 19) and its predecessor Upsample (opsets 7 and 9).
//!
//! Resizing is separable: each resized axis is resampled in turn, in f64, with a per-output
//! table of (source index, weight) pairs. The tables follow the ONNX reference exactly: the
//! source coordinate comes from `coordinate_transformation_mode`, the kernel (nearest, linear,
//! cubic, optionally antialiased) gives the weights of the `n` nearest source pixels (edge
//! clamped, or dropped and renormalized with `exclude_outside`), and `tf_crop_and_resize`
//! replaces out-of-range samples with `extrapolation_value`.

use ndarray::ArrayViewD;

use crate::ops::util::num::Num;

use crate::limits::checked_numel;

use crate::error::OpResult;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, normalize_axes, opt_input};
use crate::tensor::{Tensor, TensorRef};
use crate::{bail, dispatch_numeric};

pub fn register(reg: &mut Registry) {
    add(reg, "Resize", 10, build_resize);
    add(reg, "Upsample", 7, build_upsample);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Resize-10 / Upsample: floor when upsampling, ceil when downsampling.
    Simple,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Policy {
    Stretch,
    NotLarger,
    NotSmaller,
}

/// Where the inputs are: Upsample-7 has scales as an attribute, Upsample-9 / Resize-10 take
/// `(X, scales)`, Resize-11+ take `(X, roi, scales, sizes)`.
#[derive(Clone, Debug, PartialEq)]
enum Layout {
    AttrScales(Vec<f32>),
    XScales,
    Full,
}

#[derive(Clone, Debug)]
struct Cfg {
    op: String,
    layout: Layout,
    mode: Mode,
    coord: Coord,
    nearest: Nearest,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
    axes: Option<Vec<i64>>,
    policy: Policy,
}

fn parse_mode(n: &NodeDef) -> OpResult<Mode> {
    match n.attr_string_or("mode", "nearest")?.as_str() {
        "nearest" => Ok(Mode::Nearest),
        "linear" | "bilinear" => Ok(Mode::Linear),
        "cubic" if n.op_type == "Resize" && n.opset >= 11 => Ok(Mode::Cubic),
        other => Err(n.error(format_args!("unknown mode '{other}'"))),
    }
}

fn build_resize(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mode = parse_mode(n)?;
    let legacy = n.opset < 11;
    let coord = if legacy {
        Coord::Asymmetric
    } else {
        match n
            .attr_string_or("coordinate_transformation_mode", "half_pixel")?
            .as_str()
        {
            "half_pixel" => Coord::HalfPixel,
            "half_pixel_symmetric" if n.opset >= 19 => Coord::HalfPixelSymmetric,
            "pytorch_half_pixel" => Coord::PytorchHalfPixel,
            "align_corners" => Coord::AlignCorners,
            "asymmetric" => Coord::Asymmetric,
            "tf_crop_and_resize" => Coord::TfCropAndResize,
            "tf_half_pixel_for_nn" if n.opset < 13 => Coord::HalfPixel,
            other => {
                return Err(n.error(format_args!(
                    "unknown coordinate_transformation_mode '{other}'"
                )));
            }
        }
    };
    let nearest = if legacy {
        Nearest::Simple
    } else {
        match n
            .attr_string_or("nearest_mode", "round_prefer_floor")?
            .as_str()
        {
            "round_prefer_floor" => Nearest::RoundPreferFloor,
            "round_prefer_ceil" => Nearest::RoundPreferCeil,
            "floor" => Nearest::Floor,
            "ceil" => Nearest::Ceil,
            other => return Err(n.error(format_args!("unknown nearest_mode '{other}'"))),
        }
    };
    let new = n.opset >= 18;
    let policy = if new {
        match n
            .attr_string_or("keep_aspect_ratio_policy", "stretch")?
            .as_str()
        {
            "stretch" => Policy::Stretch,
            "not_larger" => Policy::NotLarger,
            "not_smaller" => Policy::NotSmaller,
            other => {
                return Err(n.error(format_args!("unknown keep_aspect_ratio_policy '{other}'")));
            }
        }
    } else {
        Policy::Stretch
    };
    let antialias = new && n.attr_int_or("antialias", 0)? != 0;
    if antialias && mode == Mode::Nearest {
        return Err(n.error("antialias is not supported with mode 'nearest'"));
    }
    let cfg = Cfg {
        op: n.op_type.clone(),
        layout: if legacy {
            Layout::XScales
        } else {
            Layout::Full
        },
        mode,
        coord,
        nearest,
        cubic_a: f64::from(n.attr_float_or("cubic_coeff_a", -0.75)?),
        exclude_outside: !legacy && n.attr_int_or("exclude_outside", 0)? != 0,
        extrapolation: f64::from(n.attr_float_or("extrapolation_value", 0.0)?),
        antialias,
        axes: if new { n.attr_ints("axes")? } else { None },
        policy,
    };
    Ok(kernel(move |inputs| run_resize(&cfg, inputs)))
}

fn build_upsample(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mode = parse_mode(n)?;
    let layout = if n.opset < 9 {
        Layout::AttrScales(
            n.attr_floats("scales")?
                .ok_or_else(|| n.error("missing required attribute 'scales'"))?,
        )
    } else {
        Layout::XScales
    };
    let cfg = Cfg {
        op: n.op_type.clone(),
        layout,
        mode,
        coord: Coord::Asymmetric,
        nearest: Nearest::Simple,
        cubic_a: -0.75,
        exclude_outside: false,
        extrapolation: 0.0,
        antialias: false,
        axes: None,
        policy: Policy::Stretch,
    };
    Ok(kernel(move |inputs| run_resize(&cfg, inputs)))
}

/// A present, non-empty optional input.
fn nonempty<'b, 'a>(inputs: &'b [Option<TensorRef<'a>>], i: usize) -> Option<&'b TensorRef<'a>> {
    opt_input(inputs, i).filter(|t| !t.is_empty())
}

fn float_values(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<Vec<f64>> {
    use epx_plugin_api::ElementType::*;
    if !matches!(t.elem_type(), Float | Double | Float16 | Bfloat16) {
        bail!("{op}: {what} must be a float tensor, got {}", t.elem_type());
    }
    Ok(t.to_f64_vec())
}

/// The resolved plan: output shape, per-dim scale factors, full roi and the axes to resample.
struct Plan {
    out: Vec<usize>,
    scales: Vec<f64>,
    roi: Vec<f64>,
    axes: Vec<usize>,
}

fn plan(cfg: &Cfg, x: &TensorRef<'_>, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Plan> {
    let op = cfg.op.as_str();
    let shape = x.shape();
    let r = shape.len();
    let axes = match &cfg.axes {
        Some(a) => normalize_axes(op, a, r)?,
        None => (0..r).collect(),
    };
    let k = axes.len();
    let (roi_in, scales_in, sizes_in) = match &cfg.layout {
        Layout::AttrScales(s) => (None, Some(s.iter().map(|&v| f64::from(v)).collect()), None),
        Layout::XScales => (
            None,
            Some(float_values(op, "scales", input(op, inputs, 1)?)?),
            None,
        ),
        Layout::Full => (
            nonempty(inputs, 1)
                .map(|t| float_values(op, "roi", t))
                .transpose()?,
            nonempty(inputs, 2)
                .map(|t| float_values(op, "scales", t))
                .transpose()?,
            nonempty(inputs, 3)
                .map(|t| t.to_i64_vec(&format!("{op}: sizes")))
                .transpose()?,
        ),
    };
    let mut roi: Vec<f64> = [vec![0.0; r], vec![1.0; r]].concat();
    if let Some(v) = roi_in.filter(|_| cfg.coord == Coord::TfCropAndResize) {
        if v.len() != 2 * k {
            bail!("{op}: roi has {} values, expected {}", v.len(), 2 * k);
        }
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = v[i];
            roi[r + a] = v[k + i];
        }
    }
    let mut scales = vec![1.0f64; r];
    let mut out = shape.to_vec();
    match (scales_in, sizes_in) {
        (Some(_), Some(_)) => bail!("{op}: only one of scales and sizes may be given"),
        (None, None) => bail!("{op}: one of scales and sizes must be given"),
        (Some(s), None) => {
            if s.len() != k {
                bail!("{op}: scales has {} values, expected {k}", s.len());
            }
            for (i, &a) in axes.iter().enumerate() {
                let sc = s[i];
                if !(sc > 0.0 && sc.is_finite()) {
                    bail!("{op}: scales must be positive, got {s:?}");
                }
                scales[a] = sc;
                let o = (sc * shape[a] as f64).floor();
                if o > (1u64 << 40) as f64 {
                    bail!("{op}: output dim {o} is too large");
                }
                out[a] = o as usize;
            }
        }
        (None, Some(sz)) => {
            if sz.len() != k {
                bail!("{op}: sizes has {} values, expected {k}", sz.len());
            }
            for (i, &a) in axes.iter().enumerate() {
                let Ok(o) = usize::try_from(sz[i]) else {
                    bail!("{op}: sizes must be >= 0, got {sz:?}");
                };
                if shape[a] == 0 {
                    bail!("{op}: cannot resize the empty axis {a}");
                }
                out[a] = o;
                scales[a] = o as f64 / shape[a] as f64;
            }
            if cfg.policy != Policy::Stretch && !axes.is_empty() {
                let it = axes.iter().map(|&a| scales[a]);
                let s = if cfg.policy == Policy::NotLarger {
                    it.fold(f64::INFINITY, f64::min)
                } else {
                    it.fold(f64::NEG_INFINITY, f64::max)
                };
                for &a in &axes {
                    scales[a] = s;
                    out[a] = (s * shape[a] as f64 + 0.5) as usize;
                }
            }
        }
    }
    checked_numel(&out)?;
    Ok(Plan {
        out,
        scales,
        roi,
        axes,
    })
}

fn run_resize(cfg: &Cfg, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
    let op = cfg.op.as_str();
    let x = input(op, inputs, 0)?;
    let p = plan(cfg, x, inputs)?;
    one(dispatch_numeric!(
        x.clone(),
        |a| resize_typed(cfg, a, &p),
        op
    ))
}

fn resize_typed<T: Num>(cfg: &Cfg, x: ArrayViewD<'_, T>, p: &Plan) -> OpResult<Tensor> {
    if cfg.mode == Mode::Nearest
        && let Some(out) = nearest(cfg, &x, p)
    {
        return Tensor::from_vec(&p.out, out);
    }
    let r = x.ndim();
    let mut shape = x.shape().to_vec();
    let mut data: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    for &a in &p.axes {
        let (in_w, out_w, sc) = (shape[a], p.out[a], p.scales[a]);
        let (r0, r1) = (p.roi[a], p.roi[a + r]);
        let identity = (sc - 1.0).abs() < 1e-9
            && out_w == in_w
            && (cfg.coord != Coord::TfCropAndResize
                || (r0.abs() < 1e-9 && (r1 - 1.0).abs() < 1e-9));
        if identity {
            continue;
        }
        if in_w == 0 && out_w > 0 {
            bail!("{}: cannot resize the empty axis {a}", cfg.op);
        }
        let table = weights(cfg, in_w, out_w, sc, r0, r1);
        let outer: usize = shape[..a].iter().product();
        let inner: usize = shape[a + 1..].iter().product();
        let mut next = vec![0.0f64; outer * out_w * inner];
        for o in 0..outer {
            for (y, entry) in table.iter().enumerate() {
                let dst = (o * out_w + y) * inner;
                match entry {
                    None => next[dst..dst + inner].fill(cfg.extrapolation),
                    Some(ws) => {
                        for &(src_i, w) in ws {
                            let src = (o * in_w + src_i) * inner;
                            let (Some(d), Some(s)) =
                                (next.get_mut(dst..dst + inner), data.get(src..src + inner))
                            else {
                                continue;
                            };
                            for (d, &s) in d.iter_mut().zip(s) {
                                *d += w * s;
                            }
                        }
                    }
                }
            }
        }
        data = next;
        shape[a] = out_w;
    }
    let out: Vec<T> = data
        .into_iter()
        .map(|v| T::from_f64(if T::IS_FLOAT { v } else { v.round_ties_even() }))
        .collect();
    Tensor::from_vec(&shape, out)
}

/// Nearest-neighbour resampling as one gather: each output element copies the source element
/// the per-axis index tables pick, and an output row that reads the same source row as the one
/// before it is a copy of that row. `None` when some output position has no single source (an
/// extrapolated `tf_crop_and_resize` sample), which the general path handles.
fn nearest<T: crate::tensor::Elem>(cfg: &Cfg, x: &ArrayViewD<'_, T>, p: &Plan) -> Option<Vec<T>> {
    let xc = x.as_standard_layout();
    let src = xc.as_slice()?;
    let shape = x.shape();
    let r = shape.len();
    if r == 0 || p.out.len() != r {
        return None;
    }
    // Per axis, the source offset of each output index.
    let mut stride = 1;
    let mut offsets: Vec<Vec<usize>> = vec![Vec::new(); r];
    for a in (0..r).rev() {
        let (in_w, out_w) = (shape[a], p.out[a]);
        offsets[a] = if p.axes.contains(&a) {
            let table = weights(cfg, in_w, out_w, p.scales[a], p.roi[a], p.roi[a + r]);
            let mut o = Vec::with_capacity(out_w);
            for e in table {
                match e?.as_slice() {
                    [(i, _)] if *i < in_w => o.push(i * stride),
                    _ => return None,
                }
            }
            o
        } else if in_w == out_w {
            (0..out_w).map(|i| i * stride).collect()
        } else {
            return None;
        };
        stride *= in_w;
    }
    let total: usize = p.out.iter().product();
    let w = p.out[r - 1];
    if total == 0 {
        return Some(Vec::new());
    }
    let last = &offsets[r - 1];
    let rows = total / w;
    // Runs of output rows, shared across the intra-op pool.
    let run = crate::par::chunk_len(rows, (16 << 10) / w, 1);
    // Memory that is not there: the general path reports it.
    let out = crate::par::build_vec(T::buffer(total).ok()?, total, run * w, |start, out| {
        let r0 = start / w;
        // The multi-index of row `r0` over the leading output axes.
        let mut index = vec![0usize; r - 1];
        let mut rest = r0;
        for d in (0..r - 1).rev() {
            index[d] = rest % p.out[d];
            rest /= p.out[d];
        }
        let mut prev: Option<usize> = None;
        for _ in r0..(r0 + run).min(rows) {
            let base: usize = index.iter().zip(&offsets).map(|(&i, o)| o[i]).sum();
            let at = out.len();
            if prev == Some(base) {
                out.extend_from_within(at - w..at);
            } else {
                let row = &src[base..];
                out.extend(last.iter().map(|&o| row[o]));
            }
            prev = Some(base);
            for d in (0..r - 1).rev() {
                index[d] += 1;
                if index[d] < p.out[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    });
    Some(out)
}

/// Per output position: `None` for an extrapolated sample, else the (source, weight) pairs.
type Table = Vec<Option<Vec<(usize, f64)>>>;

fn weights(cfg: &Cfg, in_w: usize, out_w: usize, sc: f64, r0: f64, r1: f64) -> Table {
    let inf = in_w as f64;
    let out_f = sc * inf;
    (0..out_w)
        .map(|y| {
            let y = y as f64;
            let x = match cfg.coord {
                Coord::AlignCorners => {
                    if out_f == 1.0 {
                        0.0
                    } else {
                        y * (inf - 1.0) / (out_f - 1.0)
                    }
                }
                Coord::Asymmetric => y / sc,
                Coord::TfCropAndResize => {
                    let base = if out_f == 1.0 {
                        (r1 - r0) * (inf - 1.0) / 2.0
                    } else {
                        y * (r1 - r0) * (inf - 1.0) / (out_f - 1.0)
                    };
                    base + r0 * (inf - 1.0)
                }
                Coord::PytorchHalfPixel => {
                    if out_f == 1.0 {
                        -0.5
                    } else {
                        (y + 0.5) / sc - 0.5
                    }
                }
                Coord::HalfPixel => (y + 0.5) / sc - 0.5,
                Coord::HalfPixelSymmetric => {
                    let adjustment = out_w as f64 / out_f;
                    let offset = inf / 2.0 * (1.0 - adjustment);
                    offset + (y + 0.5) / sc - 0.5
                }
            };
            if cfg.coord == Coord::TfCropAndResize && (x < 0.0 || x > inf - 1.0) {
                return None;
            }
            Some(taps(cfg, x, sc, in_w))
        })
        .collect()
}

/// The weights of the source pixels around coordinate `x`.
fn taps(cfg: &Cfg, x: f64, sc: f64, in_w: usize) -> Vec<(usize, f64)> {
    let p = x.floor();
    let exact = x == p;
    // The ratio lies in (0, 1]: an exact coordinate counts as 1 past the pixel on its left.
    let ratio = if exact { 1.0 } else { x - p };
    let mut coeffs = match cfg.mode {
        Mode::Nearest => nearest_coeffs(cfg.nearest, ratio, exact, sc),
        Mode::Linear if cfg.antialias => linear_aa(ratio, sc),
        Mode::Linear => vec![1.0 - ratio, ratio],
        Mode::Cubic if cfg.antialias => cubic_aa(ratio, sc, cfg.cubic_a),
        Mode::Cubic => cubic_coeffs(ratio, cfg.cubic_a),
    };
    let n = coeffs.len() as i64;
    let p = p as i64;
    let start = if exact { p - n / 2 } else { p - n / 2 + 1 };
    let hi = in_w as i64 - 1;
    if cfg.exclude_outside {
        for (i, c) in coeffs.iter_mut().enumerate() {
            let idx = start + i as i64;
            if idx < 0 || idx > hi {
                *c = 0.0;
            }
        }
        let sum: f64 = coeffs.iter().sum();
        if sum != 0.0 {
            for c in &mut coeffs {
                *c /= sum;
            }
        }
    }
    coeffs
        .into_iter()
        .enumerate()
        .filter(|(_, c)| *c != 0.0)
        .map(|(i, c)| ((start + i as i64).clamp(0, hi.max(0)) as usize, c))
        .collect()
}

fn nearest_coeffs(mode: Nearest, ratio: f64, exact: bool, sc: f64) -> Vec<f64> {
    let pick_right = if exact {
        true
    } else {
        match mode {
            Nearest::RoundPreferFloor => ratio > 0.5,
            Nearest::RoundPreferCeil => ratio >= 0.5,
            Nearest::Floor => false,
            Nearest::Ceil => true,
            Nearest::Simple => sc < 1.0,
        }
    };
    if pick_right {
        vec![0.0, 1.0]
    } else {
        vec![1.0, 0.0]
    }
}

fn cubic_coeffs(r: f64, a: f64) -> Vec<f64> {
    let s = 1.0 - r;
    vec![
        ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
        ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
        ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
        ((a * (s + 1.0) - 5.0 * a) * (s + 1.0) + 8.0 * a) * (s + 1.0) - 4.0 * a,
    ]
}

fn normalized(v: Vec<f64>) -> Vec<f64> {
    let sum: f64 = v.iter().sum();
    if sum == 0.0 {
        v
    } else {
        v.into_iter().map(|c| c / sum).collect()
    }
}

fn linear_aa(ratio: f64, sc: f64) -> Vec<f64> {
    let s = sc.min(1.0);
    let start = (-1.0 / s).floor() as i64 + 1;
    let footprint = 2 - 2 * start;
    normalized(
        (start..start + footprint)
            .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
            .collect(),
    )
}

fn cubic_aa(ratio: f64, sc: f64, a: f64) -> Vec<f64> {
    let s = sc.min(1.0);
    let coeff = |x: f64| {
        let x = x.abs();
        let (x2, x3) = (x * x, x * x * x);
        if x <= 1.0 {
            (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
        } else if x < 2.0 {
            a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
        } else {
            0.0
        }
    };
    let i_start = (-2.0 / s).floor() as i64 + 1;
    let i_end = 2 - i_start;
    normalized(
        (i_start..i_end)
            .map(|i| coeff(s * (i as f64 - ratio)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    fn f32s(v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
    }

    fn i64s(v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
    }

    fn img() -> Option<Tensor> {
        Some(Tensor::F32(
            array![[[[1.0f32, 2.0], [3.0, 4.0]]]].into_dyn(),
        ))
    }

    fn resize(attrs: &[(&str, &str)]) -> NodeDef {
        let mut n = NodeDef::new("Resize", 19);
        for (k, v) in attrs {
            n = n.with_attr(k, AttrValue::String(v.as_bytes().to_vec()));
        }
        n
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.as_array::<f32>().unwrap().iter().copied().collect()
    }

    #[test]
    fn nearest_upsample_and_sizes() {
        let out = run(
            resize(&[("mode", "nearest")]),
            vec![img(), None, f32s(&[1.0, 1.0, 2.0, 3.0])],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[1, 1, 4, 6]);
        assert_eq!(values(&out[0])[..6], [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
        let out = run(
            resize(&[("mode", "nearest")]),
            vec![img(), None, None, i64s(&[1, 1, 1, 3])],
        )
        .unwrap();
        assert_eq!(values(&out[0]), vec![1.0, 1.0, 2.0]);
        let up = NodeDef::new("Upsample", 9);
        let out = run(up, vec![img(), f32s(&[1.0, 1.0, 2.0, 2.0])]).unwrap();
        assert_eq!(values(&out[0])[..4], [1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn linear_modes() {
        let out = run(
            resize(&[("mode", "linear")]),
            vec![img(), None, f32s(&[1.0, 1.0, 1.0, 2.0])],
        )
        .unwrap();
        // half_pixel: x = (y + 0.5) / 2 - 0.5 -> -0.25, 0.25, 0.75, 1.25 (edge clamped).
        assert_eq!(values(&out[0])[..4], [1.0, 1.25, 1.75, 2.0]);
        let ac = resize(&[
            ("mode", "linear"),
            ("coordinate_transformation_mode", "align_corners"),
        ]);
        let out = run(ac, vec![img(), None, f32s(&[1.0, 1.0, 1.0, 1.5])]).unwrap();
        assert_eq!(values(&out[0])[..3], [1.0, 1.5, 2.0]);
        // Integer data rounds half to even.
        let ints = Some(Tensor::I32(array![[0, 3]].into_dyn()));
        let out = run(
            resize(&[("mode", "linear")]),
            vec![ints, None, f32s(&[1.0, 2.0])],
        )
        .unwrap();
        assert_eq!(out[0], Tensor::I32(array![[0, 1, 2, 3]].into_dyn()));
    }

    #[test]
    fn cubic_identity_weights_sum_to_one() {
        for r in [0.1, 0.5, 0.9, 1.0] {
            let s: f64 = cubic_coeffs(r, -0.75).iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
            let s: f64 = cubic_aa(r, 0.5, -0.75).iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
            let s: f64 = linear_aa(r, 0.25).iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn tf_crop_and_resize_extrapolates() {
        let n = resize(&[
            ("mode", "linear"),
            ("coordinate_transformation_mode", "tf_crop_and_resize"),
        ])
        .with_attr("extrapolation_value", AttrValue::Float(9.0))
        .with_attr("axes", AttrValue::Ints(vec![3]));
        let out = run(n, vec![img(), f32s(&[0.5, 1.5]), None, i64s(&[3])]).unwrap();
        assert_eq!(values(&out[0])[..3], [1.5, 2.0, 9.0]);
    }

    #[test]
    fn resize_errors() {
        let e = run(resize(&[("mode", "linear")]), vec![img(), None, None, None]).unwrap_err();
        assert_eq!(e.0, "Resize: one of scales and sizes must be given");
        let e = run(
            resize(&[("mode", "linear")]),
            vec![img(), None, f32s(&[1.0, 2.0])],
        )
        .unwrap_err();
        assert_eq!(e.0, "Resize: scales has 2 values, expected 4");
        let e = run(
            resize(&[("mode", "linear")]),
            vec![img(), None, f32s(&[1.0, 1.0, 0.0, 1.0])],
        )
        .unwrap_err();
        assert!(e.0.contains("scales must be positive"), "{e}");
        let e = run(
            resize(&[("mode", "linear")]),
            vec![img(), None, None, i64s(&[1, 1, -1, 2])],
        )
        .unwrap_err();
        assert!(e.0.contains("sizes must be >= 0"), "{e}");
        let e = run(
            resize(&[("mode", "linear")]).with_attr("axes", AttrValue::Ints(vec![4])),
            vec![img(), None, f32s(&[2.0])],
        )
        .unwrap_err();
        assert!(e.0.contains("axis 4 is out of range for rank 4"), "{e}");
        let e = run(resize(&[("mode", "bogus")]), vec![]).unwrap_err();
        assert!(e.0.contains("unknown mode 'bogus'"), "{e}");
        let e = run(
            resize(&[("mode", "nearest")]).with_attr("antialias", AttrValue::Int(1)),
            vec![],
        )
        .unwrap_err();
        assert!(e.0.contains("antialias is not supported"), "{e}");
        let e = run(
            resize(&[("mode", "nearest")]),
            vec![
                img(),
                None,
                Some(Tensor::I64(array![1, 1, 2, 2].into_dyn())),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("scales must be a float tensor"), "{e}");
    }
}
