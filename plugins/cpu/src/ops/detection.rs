//! Object detection: NonMaxSuppression (opsets 10, 11), RoiAlign (opsets 10, 16, 22) and the
//! deformable convolution of detection backbones, DeformConv (opset 19, 2-D).

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "NonMaxSuppression", 10, build_nms);
    add(reg, "RoiAlign", 10, build_roi_align);
    add(reg, "DeformConv", 19, build_deform_conv);
}

/// `plane` (`h × w`) at the real point `(y, x)`, bilinearly, with zeros outside.
fn sample_zero_padded(plane: &[f64], h: usize, w: usize, y: f64, x: f64) -> f64 {
    let (y0, x0) = (y.floor(), x.floor());
    let (dy, dx) = (y - y0, x - x0);
    let mut v = 0.0;
    for (yy, wy) in [(y0, 1.0 - dy), (y0 + 1.0, dy)] {
        for (xx, wx) in [(x0, 1.0 - dx), (x0 + 1.0, dx)] {
            if yy >= 0.0 && xx >= 0.0 && (yy as usize) < h && (xx as usize) < w && wy * wx != 0.0 {
                v += wy * wx * plane[yy as usize * w + xx as usize];
            }
        }
    }
    v
}

fn build_deform_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let (group, offset_group) = (
        n.attr_count_or("group", 1)?,
        n.attr_count_or("offset_group", 1)?,
    );
    let list = |name: &str, default: Vec<i64>| -> OpResult<Vec<usize>> {
        n.attr_ints(name)?
            .unwrap_or(default)
            .into_iter()
            .map(|v| {
                usize::try_from(v).map_err(|_| n.error(format_args!("{name} must not be negative")))
            })
            .collect()
    };
    let strides = list("strides", vec![1, 1])?;
    let dilations = list("dilations", vec![1, 1])?;
    let pads = list("pads", vec![0, 0, 0, 0])?;
    if strides.len() != 2 || dilations.len() != 2 || pads.len() != 4 {
        return Err(n.error("only 2-D deformable convolution is supported"));
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let wt = input(&op, inputs, 1)?;
        let off = input(&op, inputs, 2)?;
        let [nb, ic, h, w] = *x.shape() else {
            bail!("{op}: X must be [N, C, H, W], got {:?}", x.shape());
        };
        let [oc, icg, kh, kw] = *wt.shape() else {
            bail!("{op}: W must be [M, C/group, kH, kW], got {:?}", wt.shape());
        };
        let [ob, oc2, oh, ow] = *off.shape() else {
            bail!(
                "{op}: offset must be [N, 2·offset_group·kH·kW, oH, oW], got {:?}",
                off.shape()
            );
        };
        let taps = kh * kw;
        if icg * group != ic || oc % group != 0 || ic % offset_group != 0 {
            bail!(
                "{op}: X {:?} and W {:?} do not fit group {group} / offset_group {offset_group}",
                x.shape(),
                wt.shape()
            );
        }
        if ob != nb || oc2 != 2 * offset_group * taps {
            bail!(
                "{op}: offset of shape {:?} does not fit {offset_group} offset groups of {kh}×{kw}",
                off.shape()
            );
        }
        let reach = |size: usize, k: usize, d: usize, p0: usize, p1: usize, st: usize| {
            (size + p0 + p1)
                .checked_sub((k - 1) * d + 1)
                .map(|v| v / st + 1)
        };
        if reach(h, kh, dilations[0], pads[0], pads[2], strides[0]) != Some(oh)
            || reach(w, kw, dilations[1], pads[1], pads[3], strides[1]) != Some(ow)
        {
            bail!(
                "{op}: an output of {oh}×{ow} does not follow from the input, kernel, pads and strides"
            );
        }
        let xv = float_values(&op, "X", x)?;
        let wv = float_values(&op, "W", wt)?;
        let ov = float_values(&op, "offset", off)?;
        let mv = match opt_input(inputs, 4) {
            Some(m) if m.len() == nb * offset_group * taps * oh * ow => {
                Some(float_values(&op, "mask", m)?)
            }
            Some(m) => bail!(
                "{op}: mask of shape {:?} is not [N, offset_group·kH·kW, oH, oW]",
                m.shape()
            ),
            None => None,
        };
        let bias = match opt_input(inputs, 3) {
            Some(b) if b.len() == oc => float_values(&op, "B", b)?,
            Some(b) => bail!("{op}: B has {} values for {oc} output channels", b.len()),
            None => vec![0.0; oc],
        };
        let (ocg, icog) = (oc / group, ic / offset_group);
        let mut out = vec![0f64; nb * oc * oh * ow];
        for b in 0..nb {
            for o in 0..oc {
                let g = o / ocg;
                for i in 0..oh {
                    for j in 0..ow {
                        let mut acc = bias[o];
                        for c in 0..icg {
                            let ch = g * icg + c;
                            let og = ch / icog;
                            let plane = &xv[(b * ic + ch) * h * w..][..h * w];
                            for t in 0..taps {
                                let (ky, kx) = (t / kw, t % kw);
                                let at = |k: usize| ((b * oc2 + k) * oh + i) * ow + j;
                                let dy = ov[at((og * taps + t) * 2)];
                                let dx = ov[at((og * taps + t) * 2 + 1)];
                                let y = (strides[0] * i + ky * dilations[0]) as f64
                                    - pads[0] as f64
                                    + dy;
                                let xx = (strides[1] * j + kx * dilations[1]) as f64
                                    - pads[1] as f64
                                    + dx;
                                let m = mv.as_ref().map_or(1.0, |m| {
                                    m[((b * offset_group * taps + og * taps + t) * oh + i) * ow + j]
                                });
                                let wgt = wv[((o * icg + c) * kh + ky) * kw + kx];
                                acc += wgt * m * sample_zero_padded(plane, h, w, y, xx);
                            }
                        }
                        out[((b * oc + o) * oh + i) * ow + j] = acc;
                    }
                }
            }
        }
        one(tensor_from_f64(x.elem_type(), &[nb, oc, oh, ow], out))
    }))
}

/// One bilinear sample: the four neighbours' offsets in a plane and their weights.
#[derive(Clone, Copy, Default)]
struct Sample {
    at: [usize; 4],
    w: [f64; 4],
}

fn bilinear(y: f64, x: f64, h: usize, w: usize) -> Sample {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
        return Sample::default();
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut y0, mut x0) = (y as usize, x as usize);
    let y1 = if y0 >= h - 1 {
        y0 = h - 1;
        y = y0 as f64;
        y0
    } else {
        y0 + 1
    };
    let x1 = if x0 >= w - 1 {
        x0 = w - 1;
        x = x0 as f64;
        x0
    } else {
        x0 + 1
    };
    let (ly, lx) = (y - y0 as f64, x - x0 as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    Sample {
        at: [y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    }
}

fn build_roi_align(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let default_mode = if n.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel =
        match n
            .attr_string_or("coordinate_transformation_mode", default_mode)?
            .as_str()
        {
            "half_pixel" => true,
            "output_half_pixel" => false,
            other => return Err(n.error(format_args!(
                "coordinate_transformation_mode `{other}` is not half_pixel or output_half_pixel"
            ))),
        };
    let max = match n.attr_string_or("mode", "avg")?.as_str() {
        "avg" => false,
        "max" => true,
        other => return Err(n.error(format_args!("mode `{other}` is not avg or max"))),
    };
    let (oh, ow) = (
        n.attr_count_or("output_height", 1)?,
        n.attr_count_or("output_width", 1)?,
    );
    let ratio = usize::try_from(n.attr_int_or("sampling_ratio", 0)?)
        .map_err(|_| n.error("sampling_ratio must not be negative"))?;
    let scale = f64::from(n.attr_float_or("spatial_scale", 1.0)?);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let rois = input(&op, inputs, 1)?;
        let idx = input(&op, inputs, 2)?.to_i64_vec(&format!("{op}: batch_indices"))?;
        let [nb, c, h, w] = *x.shape() else {
            bail!("{op}: X must be [N, C, H, W], got {:?}", x.shape());
        };
        if h == 0 || w == 0 {
            bail!("{op}: X has an empty plane {:?}", x.shape());
        }
        let k = rois.shape().first().copied().unwrap_or(0);
        if rois.shape() != [k, 4] || idx.len() != k {
            bail!(
                "{op}: rois {:?} and batch_indices of {} must be [num_rois, 4] and [num_rois]",
                rois.shape(),
                idx.len()
            );
        }
        let xv = float_values(&op, "X", x)?;
        let rv = float_values(&op, "rois", rois)?;
        let mut out = vec![0f64; crate::limits::checked_len(&[k, c, oh, ow], 8)?];
        let mut samples = Vec::new();
        for r in 0..k {
            let b = usize::try_from(idx[r])
                .ok()
                .filter(|&b| b < nb)
                .ok_or_else(|| OpError(format!("{op}: batch index {} is out of range", idx[r])))?;
            let off = if half_pixel { 0.5 } else { 0.0 };
            let roi = &rv[r * 4..r * 4 + 4];
            let (x0, y0) = (roi[0] * scale - off, roi[1] * scale - off);
            let (mut rw, mut rh) = (roi[2] * scale - off - x0, roi[3] * scale - off - y0);
            if !half_pixel {
                rw = rw.max(1.0);
                rh = rh.max(1.0);
            }
            let (bh, bw) = (rh / oh as f64, rw / ow as f64);
            let gh = if ratio > 0 {
                ratio
            } else {
                (rh / oh as f64).ceil().max(0.0) as usize
            };
            let gw = if ratio > 0 {
                ratio
            } else {
                (rw / ow as f64).ceil().max(0.0) as usize
            };
            // The sample table of one roi: a huge sampling_ratio (or roi) is a size error.
            crate::limits::checked_len(&[oh, ow, gh, gw], size_of_val(&bilinear(0.0, 0.0, 1, 1)))
                .map_err(|e| OpError(format!("{op}: sampling grid {gh}x{gw} per bin: {}", e.0)))?;
            let count = (gh * gw).max(1) as f64;
            samples.clear();
            for ph in 0..oh {
                for pw in 0..ow {
                    for iy in 0..gh {
                        let yy = y0 + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                        for ix in 0..gw {
                            let xx = x0 + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                            samples.push(bilinear(yy, xx, h, w));
                        }
                    }
                }
            }
            let per_bin = gh * gw;
            for ch in 0..c {
                let plane = &xv[(b * c + ch) * h * w..(b * c + ch + 1) * h * w];
                for bin in 0..oh * ow {
                    let bin_samples = &samples[bin * per_bin..(bin + 1) * per_bin];
                    let v = if max {
                        // As ONNX Runtime: the largest weighted neighbour, over the samples.
                        bin_samples
                            .iter()
                            .map(|s| {
                                (0..4)
                                    .map(|i| s.w[i] * plane[s.at[i]])
                                    .fold(f64::NEG_INFINITY, f64::max)
                            })
                            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                            .unwrap_or(0.0)
                    } else {
                        bin_samples
                            .iter()
                            .map(|s| (0..4).map(|i| s.w[i] * plane[s.at[i]]).sum::<f64>())
                            .sum::<f64>()
                            / count
                    };
                    out[((r * c + ch) * oh * ow) + bin] = v;
                }
            }
        }
        one(tensor_from_f64(x.elem_type(), &[k, c, oh, ow], out))
    }))
}

/// A box as (x_min, y_min, x_max, y_max).
#[derive(Clone, Copy)]
struct Corners([f64; 4]);

impl Corners {
    fn new(b: &[f64], center_point: bool) -> Self {
        if center_point {
            let (xc, yc, w, h) = (b[0], b[1], b[2], b[3]);
            Corners([xc - w / 2.0, yc - h / 2.0, xc + w / 2.0, yc + h / 2.0])
        } else {
            // [y1, x1, y2, x2], either diagonal.
            Corners([
                b[1].min(b[3]),
                b[0].min(b[2]),
                b[1].max(b[3]),
                b[0].max(b[2]),
            ])
        }
    }

    fn area(self) -> f64 {
        (self.0[2] - self.0[0]) * (self.0[3] - self.0[1])
    }

    /// Whether `other` overlaps this box by more than `threshold` (intersection over union).
    fn suppresses(self, other: Corners, threshold: f64) -> bool {
        let w = self.0[2].min(other.0[2]) - self.0[0].max(other.0[0]);
        let h = self.0[3].min(other.0[3]) - self.0[1].max(other.0[1]);
        if w <= 0.0 || h <= 0.0 {
            return false;
        }
        let inter = w * h;
        let (a, b) = (self.area(), other.area());
        let union = a + b - inter;
        if a <= 0.0 || b <= 0.0 || union <= 0.0 {
            return false;
        }
        inter / union > threshold
    }
}

/// The first value of an optional float input (a threshold), `None` when absent or empty.
fn first_f64(op: &str, what: &str, t: Option<&TensorRef<'_>>) -> OpResult<Option<f64>> {
    match t {
        Some(t) if t.is_empty() => Ok(None),
        Some(t) => Ok(float_values(op, what, t)?.first().copied()),
        None => Ok(None),
    }
}

fn build_nms(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let center_point = match n.attr_int_or("center_point_box", 0)? {
        0 => false,
        1 => true,
        other => return Err(n.error(format_args!("center_point_box must be 0 or 1, got {other}"))),
    };
    Ok(kernel(move |inputs| {
        let boxes = input(&op, inputs, 0)?;
        let scores = input(&op, inputs, 1)?;
        if boxes.ndim() != 3 || boxes.shape()[2] != 4 {
            bail!(
                "{op}: boxes must be [batches, boxes, 4], got {:?}",
                boxes.shape()
            );
        }
        let (batches, count) = (boxes.shape()[0], boxes.shape()[1]);
        if scores.ndim() != 3 || scores.shape()[0] != batches || scores.shape()[2] != count {
            bail!(
                "{op}: scores of shape {:?} must be [{batches}, classes, {count}]",
                scores.shape()
            );
        }
        let classes = scores.shape()[1];
        let max_out = match opt_input(inputs, 2) {
            Some(t) if !t.is_empty() => {
                let v = t.to_i64_vec(&format!("{op}: max_output_boxes_per_class"))?;
                v.first().copied().unwrap_or(0).max(0) as usize
            }
            _ => 0,
        };
        let iou = first_f64(&op, "iou_threshold", opt_input(inputs, 3))?.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&iou) {
            bail!("{op}: iou_threshold {iou} is outside [0, 1]");
        }
        let score_threshold = first_f64(&op, "score_threshold", opt_input(inputs, 4))?;
        let bv = float_values(&op, "boxes", boxes)?;
        let sv = float_values(&op, "scores", scores)?;
        let mut selected: Vec<i64> = Vec::new();
        let mut candidates: Vec<(f64, usize)> = Vec::with_capacity(count);
        let mut kept: Vec<Corners> = Vec::new();
        for b in 0..batches {
            let corners: Vec<Corners> = (0..count)
                .map(|i| {
                    Corners::new(
                        &bv[(b * count + i) * 4..(b * count + i + 1) * 4],
                        center_point,
                    )
                })
                .collect();
            for c in 0..classes {
                let s = &sv[(b * classes + c) * count..(b * classes + c + 1) * count];
                candidates.clear();
                candidates.extend(
                    s.iter()
                        .enumerate()
                        .filter(|&(_, &v)| score_threshold.is_none_or(|t| v > t))
                        .map(|(i, &v)| (v, i)),
                );
                // Highest score first; equal scores keep the lower box index first.
                candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                kept.clear();
                for &(_, i) in &candidates {
                    if kept.len() >= max_out {
                        break;
                    }
                    if kept.iter().all(|k| !k.suppresses(corners[i], iou)) {
                        kept.push(corners[i]);
                        selected.extend([b as i64, c as i64, i as i64]);
                    }
                }
            }
        }
        let rows = selected.len() / 3;
        one(Tensor::from_vec(&[rows, 3], selected))
    }))
}
