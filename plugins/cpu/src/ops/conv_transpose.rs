//! ConvTranspose: group, strides, dilations, pads, output_padding, output_shape and auto_pad, with
//! the f32 2-D case on the fast kernel ([`crate::fast::conv2d::ConvTranspose2d`]).
//!
//! Values are computed in f64 and cast back to the input's float type.

use crate::ops::util::spatial::{AutoPad, SpatialAttrs, kernel_dims, per_dim};

use crate::ops::util::indexing::{c_strides, for_each_index};

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::OpResult;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "ConvTranspose", 1, build_conv_transpose);
}

struct ConvT {
    op: String,
    attrs: SpatialAttrs,
    group: usize,
    output_padding: Option<Vec<i64>>,
    output_shape: Option<Vec<i64>>,
}

impl ConvT {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        let w = input(op, inputs, 1)?;
        let (xs, ws) = (x.shape(), w.shape());
        if xs.len() < 3 {
            bail!("{op}: X must have rank >= 3 (N, C, spatial...), got shape {xs:?}");
        }
        if ws.len() != xs.len() {
            bail!(
                "{op}: W has shape {ws:?}, expected rank {} like X {xs:?}",
                xs.len()
            );
        }
        if w.elem_type() != x.elem_type() {
            bail!(
                "{op}: W must have X's type {}, got {}",
                x.elem_type(),
                w.elem_type()
            );
        }
        let nd = xs.len() - 2;
        let (nb, c) = (xs[0], xs[1]);
        let g = self.group;
        if g == 0 || ws[0] != c || c % g != 0 {
            bail!("{op}: X has {c} channels and W has shape {ws:?}, incompatible with group {g}");
        }
        let (cg, mg) = (c / g, ws[1]);
        let m = mg * g;
        let kernel = ws[2..].to_vec();
        if let Some(k) = &self.attrs.kernel_shape
            && kernel_dims(op, k)? != kernel
        {
            bail!("{op}: kernel_shape {k:?} does not match W shape {ws:?}");
        }
        let strides = per_dim(op, "strides", &self.attrs.strides, nd, 1)?;
        let dil = per_dim(op, "dilations", &self.attrs.dilations, nd, 1)?;
        let opad = per_dim(op, "output_padding", &self.output_padding, nd, 0)?;
        if strides.iter().chain(&dil).any(|&v| v <= 0) || opad.iter().any(|&v| v < 0) {
            bail!(
                "{op}: strides {strides:?} and dilations {dil:?} must be positive, output_padding {opad:?} non-negative"
            );
        }
        let in_sp: Vec<i64> = xs[2..].iter().map(|&d| d as i64).collect();
        let full = (0..nd)
            .map(|d| {
                strides[d]
                    .checked_mul(in_sp[d] - 1)
                    .and_then(|v| v.checked_add(opad[d]))
                    .and_then(|v| v.checked_add((kernel[d] as i64 - 1).checked_mul(dil[d])?))
                    .and_then(|v| v.checked_add(1))
            })
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| {
                crate::error::OpError(format!(
                    "{op}: strides {strides:?}, dilations {dil:?} and output_padding {opad:?} make an output too large to count"
                ))
            })?;
        let out_shape_attr = match &self.output_shape {
            // output_shape may list the spatial dims only, or the whole shape.
            Some(s) if s.len() == nd => Some(s.clone()),
            Some(s) if s.len() == nd + 2 => Some(s[2..].to_vec()),
            Some(s) => bail!("{op}: output_shape {s:?} must have {nd} values"),
            None => None,
        };
        let same = matches!(self.attrs.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
        let (pad_begin, out_sp): (Vec<i64>, Vec<i64>) = if same && self.attrs.pads.is_none() {
            let out = out_shape_attr.clone().unwrap_or_else(|| {
                (0..nd)
                    .map(|d| in_sp[d].saturating_mul(strides[d]))
                    .collect()
            });
            let pb = (0..nd)
                .map(|d| {
                    let total = full[d].saturating_sub(out[d]);
                    if self.attrs.auto_pad == AutoPad::SameUpper {
                        total.div_euclid(2)
                    } else {
                        total - total.div_euclid(2)
                    }
                })
                .collect();
            (pb, out)
        } else {
            let pads = match &self.attrs.pads {
                Some(p) => {
                    if p.len() != 2 * nd || p.iter().any(|&v| v < 0) {
                        bail!("{op}: pads {p:?} must be {} non-negative values", 2 * nd);
                    }
                    p.clone()
                }
                None => vec![0; 2 * nd],
            };
            let out = match &out_shape_attr {
                Some(s) => s.clone(),
                None => (0..nd)
                    .map(|d| full[d].saturating_sub(pads[d]).saturating_sub(pads[d + nd]))
                    .collect(),
            };
            (pads[..nd].to_vec(), out)
        };
        if out_sp.iter().any(|&o| o < 0) {
            bail!("{op}: output spatial shape {out_sp:?} is negative");
        }
        let out_u: Vec<usize> = out_sp.iter().map(|&o| o as usize).collect();
        let mut shape = vec![nb, m];
        shape.extend_from_slice(&out_u);
        let total = crate::limits::checked_numel(&shape)?;
        let b = match opt_input(inputs, 2) {
            Some(b) => {
                if b.shape() != [m] {
                    bail!("{op}: B must have shape [{m}], got {:?}", b.shape());
                }
                float_values(op, "B", b)?
            }
            None => vec![0.0; m],
        };
        if let (TensorRef::F32(xa), TensorRef::F32(wa), [h, w_], [oh, ow]) =
            (x, w, &xs[2..], &out_u[..])
            && crate::fast::enabled()
        {
            let fast = crate::fast::conv2d::ConvTranspose2d {
                n: nb,
                c,
                h: *h,
                w: *w_,
                m,
                oh: *oh,
                ow: *ow,
                group: g,
                kh: kernel[0],
                kw: kernel[1],
                strides: [strides[0] as usize, strides[1] as usize],
                dilations: [dil[0] as usize, dil[1] as usize],
                pad_begin: [pad_begin[0].max(0) as usize, pad_begin[1].max(0) as usize],
            };
            let (xc, wc) = (xa.as_standard_layout(), wa.as_standard_layout());
            if pad_begin.iter().all(|&p| p >= 0)
                && let (Some(xf), Some(wf)) = (xc.as_slice(), wc.as_slice())
            {
                let bias: Vec<f32> = b.iter().map(|&v| v as f32).collect();
                let y = fast.run(xf, wf, Some(&bias))?;
                return one(Tensor::from_vec(&shape_of(nb, m, &out_u), y));
            }
        }
        let xv = float_values(op, "X", x)?;
        let wv = float_values(op, "W", w)?;
        let plane_in: usize = xs[2..].iter().product();
        let plane_out: usize = out_u.iter().product();
        let kn: usize = kernel.iter().product();
        let ostr = c_strides(&out_u);
        let mut y = vec![0.0f64; total];
        for (i, v) in y.iter_mut().enumerate() {
            *v = b
                .get((i / plane_out.max(1)) % m.max(1))
                .copied()
                .unwrap_or(0.0);
        }
        // For each input position and kernel tap: the output offset, if inside.
        let mut taps: Vec<Vec<Option<usize>>> = Vec::with_capacity(plane_in);
        for_each_index(&xs[2..], |ii| {
            let mut row = Vec::with_capacity(kn);
            for_each_index(&kernel, |kk| {
                let mut off = Some(0usize);
                for d in 0..nd {
                    let o = ii[d] as i64 * strides[d] + kk[d] as i64 * dil[d] - pad_begin[d];
                    off = match off {
                        Some(acc) if (0..out_sp[d]).contains(&o) => {
                            Some(acc + o as usize * ostr[d])
                        }
                        _ => None,
                    };
                }
                row.push(off);
            });
            taps.push(row);
        });
        for n in 0..nb {
            for gi in 0..g {
                for ci in 0..cg {
                    let ch = gi * cg + ci;
                    let xbase = (n * c + ch) * plane_in;
                    for mi in 0..mg {
                        let oc = gi * mg + mi;
                        let ybase = (n * m + oc) * plane_out;
                        let wbase = (ch * mg + mi) * kn;
                        for (p, row) in taps.iter().enumerate() {
                            let xval = xv.get(xbase + p).copied().unwrap_or(0.0);
                            for (k, off) in row.iter().enumerate() {
                                if let (Some(o), Some(wval)) = (off, wv.get(wbase + k))
                                    && let Some(slot) = y.get_mut(ybase + o)
                                {
                                    *slot += xval * wval;
                                }
                            }
                        }
                    }
                }
            }
        }
        one(tensor_from_f64(x.elem_type(), &shape, y))
    }
}

fn shape_of(n: usize, m: usize, spatial: &[usize]) -> Vec<usize> {
    let mut shape = vec![n, m];
    shape.extend_from_slice(spatial);
    shape
}

fn build_conv_transpose(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let group = n.attr_int_or("group", 1)?;
    let ct = ConvT {
        op: n.op_type.clone(),
        attrs: SpatialAttrs::parse(n)?,
        group: usize::try_from(group)
            .map_err(|_| n.error(format_args!("invalid group {group}")))?,
        output_padding: n.attr_ints("output_padding")?,
        output_shape: n.attr_ints("output_shape")?,
    };
    Ok(kernel(move |inputs| ct.run(inputs)))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{run, t, vals};
    use super::*;
    use crate::kernel::AttrValue;

    #[test]
    fn conv_transpose_1d() {
        let x = t(&[1, 1, 3], vec![1.0, 2.0, 3.0]);
        let w = t(&[1, 1, 2], vec![1.0, 10.0]);
        let n = NodeDef::new("ConvTranspose", 11);
        let o = run(n.clone(), vec![x.clone(), w.clone()]).unwrap();
        assert_eq!(o[0].shape(), &[1, 1, 4]);
        assert_eq!(vals(&o[0]), vec![1.0, 12.0, 23.0, 30.0]);
        let s = n.clone().with_attr("strides", AttrValue::Ints(vec![2]));
        let o = run(s.clone(), vec![x.clone(), w.clone(), t(&[1], vec![0.5])]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.5, 10.5, 2.5, 20.5, 3.5, 30.5]);
        let o = run(
            s.with_attr("pads", AttrValue::Ints(vec![1, 0])),
            vec![x.clone(), w.clone()],
        )
        .unwrap();
        assert_eq!(vals(&o[0]), vec![10.0, 2.0, 20.0, 3.0, 30.0]);
        let e = run(n.clone(), vec![x.clone(), t(&[2, 1, 2], vec![0.0; 4])]).unwrap_err();
        assert!(e.0.contains("incompatible with group 1"), "{e}");
        let e = run(n, vec![t(&[3], vec![0.0; 3]), w]).unwrap_err();
        assert!(e.0.contains("X must have rank >= 3"), "{e}");
    }
}
