//! Sampling a grid: AffineGrid (the grid of an affine transform) and GridSample (bilinear,
//! nearest and bicubic, with the padding modes).
//!
//! Values are computed in f64 and cast back to the input's float type.

use crate::ops::util::indexing::{c_strides, for_each_index};

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::input;

pub fn register(reg: &mut Registry) {
    add(reg, "AffineGrid", 20, build_affine_grid);
    add(reg, "GridSample", 16, build_grid_sample);
}

/// The normalized coordinate of index `i` of `n` along one axis.
fn grid_coord(i: usize, n: usize, align_corners: bool) -> f64 {
    if align_corners {
        if n <= 1 {
            0.0
        } else {
            -1.0 + 2.0 * i as f64 / (n - 1) as f64
        }
    } else {
        (2.0 * i as f64 + 1.0) / n as f64 - 1.0
    }
}

fn build_affine_grid(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let align = n.attr_int_or("align_corners", 0)? != 0;
    Ok(kernel(move |inputs| {
        let theta = input(&op, inputs, 0)?;
        let size = input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: size"))?;
        let sp: Vec<usize> = match size.as_slice() {
            [_, _, rest @ ..] if (2..=3).contains(&rest.len()) => rest
                .iter()
                .map(|&v| usize::try_from(v))
                .collect::<Result<_, _>>()
                .map_err(|_| OpError(format!("{op}: size {size:?} has a negative dim")))?,
            _ => bail!("{op}: size must have 4 or 5 values, got {size:?}"),
        };
        let nd = sp.len();
        let nb = usize::try_from(size[0])
            .map_err(|_| OpError(format!("{op}: size {size:?} has a negative dim")))?;
        if theta.shape() != [nb, nd, nd + 1] {
            bail!(
                "{op}: theta must have shape [{nb}, {nd}, {}], got {:?}",
                nd + 1,
                theta.shape()
            );
        }
        let tv = float_values(&op, "theta", theta)?;
        let mut shape = vec![nb];
        shape.extend_from_slice(&sp);
        shape.push(nd);
        let mut out = Vec::with_capacity(crate::limits::checked_numel(&shape)?);
        for b in 0..nb {
            for_each_index(&sp, |ii| {
                // Base coordinates in (x, y[, z]) order: the last spatial dim is x.
                let mut base: Vec<f64> = (0..nd)
                    .rev()
                    .map(|d| grid_coord(ii[d], sp[d], align))
                    .collect();
                base.push(1.0);
                for r in 0..nd {
                    let row = tv
                        .get((b * nd + r) * (nd + 1)..(b * nd + r + 1) * (nd + 1))
                        .unwrap_or(&[]);
                    out.push(row.iter().zip(&base).map(|(a, c)| a * c).sum());
                }
            });
        }
        one(tensor_from_f64(theta.elem_type(), &shape, out))
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GsMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GsPad {
    Zeros,
    Border,
    Reflection,
}

/// Reflects `x` by the borders until it lies within `[lo, hi]`.
fn gs_reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if rng <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n as i64 % 2 == 0 { lo + r } else { hi - r }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n as i64 % 2 == 0 { hi - r } else { lo + r }
    } else {
        x
    }
}

/// Keys cubic convolution coefficients (alpha = -0.75) for fractional offset `t`.
fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    let c0 = ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a;
    let c1 = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    let y = 1.0 - x;
    let c2 = ((a + 2.0) * y - (a + 3.0)) * y * y + 1.0;
    let z = 2.0 - x;
    let c3 = ((a * z - 5.0 * a) * z + 8.0 * a) * z - 4.0 * a;
    [c0, c1, c2, c3]
}

fn build_grid_sample(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let mode = match n
        .attr_string_or("mode", if n.opset < 20 { "bilinear" } else { "linear" })?
        .as_str()
    {
        "nearest" => GsMode::Nearest,
        "linear" | "bilinear" => GsMode::Linear,
        "cubic" | "bicubic" => GsMode::Cubic,
        other => return Err(n.error(format_args!("unknown mode '{other}'"))),
    };
    let pad = match n.attr_string_or("padding_mode", "zeros")?.as_str() {
        "zeros" => GsPad::Zeros,
        "border" => GsPad::Border,
        "reflection" => GsPad::Reflection,
        other => return Err(n.error(format_args!("unknown padding_mode '{other}'"))),
    };
    let align = n.attr_int_or("align_corners", 0)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let grid = input(&op, inputs, 1)?;
        let (xs, gs) = (x.shape().to_vec(), grid.shape().to_vec());
        if xs.len() < 3 {
            bail!("{op}: X must have rank >= 3 (N, C, spatial...), got shape {xs:?}");
        }
        let nd = xs.len() - 2;
        if gs.len() != xs.len() || gs[0] != xs[0] || gs[gs.len() - 1] != nd {
            bail!(
                "{op}: grid must have shape [{}, out..., {nd}] with {nd} spatial dims, got {gs:?}",
                xs[0]
            );
        }
        let dims = &xs[2..];
        let out_sp = &gs[1..gs.len() - 1];
        let plane_in: usize = dims.iter().product();
        let plane_out: usize = out_sp.iter().product();
        let istr = c_strides(dims);
        let xv = float_values(&op, "X", x)?;
        let gv = float_values(&op, "grid", grid)?;
        let (nb, c) = (xs[0], xs[1]);
        let (lo, hi): (Vec<f64>, Vec<f64>) = dims
            .iter()
            .map(|&d| {
                if align {
                    (0.0, d as f64 - 1.0)
                } else {
                    (-0.5, d as f64 - 0.5)
                }
            })
            .unzip();
        let mut y = vec![0.0f64; nb * c * plane_out];
        for b in 0..nb {
            for p in 0..plane_out {
                // Per spatial dim: the taps (index, weight).
                let mut taps: Vec<Vec<(i64, f64)>> = Vec::with_capacity(nd);
                for d in 0..nd {
                    // grid holds (x, y[, z]): the last spatial dim first.
                    let g = gv
                        .get((b * plane_out + p) * nd + (nd - 1 - d))
                        .copied()
                        .unwrap_or(0.0);
                    let len = dims[d] as f64;
                    let mut v = if align {
                        (g + 1.0) / 2.0 * (len - 1.0)
                    } else {
                        ((g + 1.0) * len - 1.0) / 2.0
                    };
                    if mode == GsMode::Nearest {
                        v = v.round_ties_even();
                    }
                    if v < lo[d] || v > hi[d] {
                        match pad {
                            GsPad::Border => v = v.clamp(0.0, len - 1.0),
                            GsPad::Reflection => v = gs_reflect(v, lo[d], hi[d]),
                            GsPad::Zeros => {}
                        }
                    }
                    let t = match mode {
                        GsMode::Nearest => vec![(v as i64, 1.0)],
                        GsMode::Linear => {
                            let i0 = v.floor();
                            let f = v - i0;
                            vec![(i0 as i64, 1.0 - f), (i0 as i64 + 1, f)]
                        }
                        GsMode::Cubic => {
                            let i0 = v.floor();
                            let cf = cubic_coeffs(v - i0);
                            (0..4).map(|k| (i0 as i64 - 1 + k as i64, cf[k])).collect()
                        }
                    };
                    taps.push(t);
                }
                let tap_dims: Vec<usize> = taps.iter().map(Vec::len).collect();
                let mut acc = vec![0.0f64; c];
                let mut bad = false;
                for_each_index(&tap_dims, |kk| {
                    let mut w = 1.0;
                    let mut off = Some(0usize);
                    for d in 0..nd {
                        let Some(&(i, wt)) = taps[d].get(kk[d]) else {
                            bad = true;
                            return;
                        };
                        w *= wt;
                        let dim = dims[d] as i64;
                        let idx = match pad {
                            GsPad::Zeros => (0..dim).contains(&i).then_some(i),
                            GsPad::Border => Some(i.clamp(0, dim - 1)),
                            GsPad::Reflection => {
                                Some((gs_reflect(i as f64, lo[d], hi[d]) as i64).clamp(0, dim - 1))
                            }
                        };
                        off = match (off, idx) {
                            (Some(o), Some(i)) => Some(o + i as usize * istr[d]),
                            _ => None,
                        };
                    }
                    if let Some(o) = off {
                        for (ch, a) in acc.iter_mut().enumerate() {
                            *a += w * xv.get((b * c + ch) * plane_in + o).copied().unwrap_or(0.0);
                        }
                    }
                });
                if bad {
                    bail!("{op}: internal tap error");
                }
                for (ch, a) in acc.into_iter().enumerate() {
                    if let Some(s) = y.get_mut((b * c + ch) * plane_out + p) {
                        *s = a;
                    }
                }
            }
        }
        let mut shape = vec![nb, c];
        shape.extend_from_slice(out_sp);
        one(tensor_from_f64(x.elem_type(), &shape, y))
    }))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run, t, vals};
    use super::*;
    use crate::kernel::AttrValue;
    use crate::tensor::Tensor;

    #[test]
    fn affine_grid_identity() {
        let theta = t(&[1, 2, 3], vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let size = Tensor::from_vec(&[4], vec![1i64, 1, 1, 2]).unwrap();
        let n = NodeDef::new("AffineGrid", 20).with_attr("align_corners", AttrValue::Int(1));
        let o = run(n.clone(), vec![theta.clone(), size]).unwrap();
        assert_eq!(o[0].shape(), &[1, 1, 2, 2]);
        assert_eq!(vals(&o[0]), vec![-1.0, 0.0, 1.0, 0.0]);
        let e = run(
            n,
            vec![
                theta,
                Tensor::from_vec(&[5], vec![1i64, 1, 1, 2, 2]).unwrap(),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("theta must have shape [1, 3, 4]"), "{e}");
    }

    #[test]
    fn grid_sample_modes() {
        let x = t(&[1, 1, 1, 2], vec![1.0, 3.0]);
        let g = t(&[1, 1, 3, 2], vec![-1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let n = |m: &str| {
            NodeDef::new("GridSample", 20)
                .with_attr("mode", AttrValue::String(m.as_bytes().to_vec()))
                .with_attr("align_corners", AttrValue::Int(1))
        };
        let o = run(n("linear"), vec![x.clone(), g.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.0, 2.0, 3.0]);
        let o = run(n("nearest"), vec![x.clone(), g.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.0, 1.0, 3.0]);
        let e = run(n("linear"), vec![x, t(&[1, 3, 3], vec![0.0; 9])]).unwrap_err();
        assert!(e.0.contains("grid must have shape"), "{e}");
    }
}
