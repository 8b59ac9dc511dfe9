//! Object-detection post-processing: NonMaxSuppression (opsets 10, 11).

use super::util::{float_values, input, opt_input};
use super::{add, one};
use crate::bail;
use crate::kernel::{NodeDef, OpKernel, OpResult, Registry, kernel};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "NonMaxSuppression", 10, build_nms);
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

fn scalar_f64(op: &str, what: &str, t: Option<&TensorRef<'_>>) -> OpResult<Option<f64>> {
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
        let iou = scalar_f64(&op, "iou_threshold", opt_input(inputs, 3))?.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&iou) {
            bail!("{op}: iou_threshold {iou} is outside [0, 1]");
        }
        let score_threshold = scalar_f64(&op, "score_threshold", opt_input(inputs, 4))?;
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
