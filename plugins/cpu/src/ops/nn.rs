//! Neural-network layers that complement Conv and the pools: ConvTranspose (group, strides,
//! dilations, pads, output_padding, output_shape, auto_pad), LpPool, MaxUnpool, Einsum,
//! AffineGrid and GridSample.
//!
//! Values are computed in f64 and cast back to the input's float type.

use super::util::{
    AutoPad, SpatialAttrs, c_strides, float_values, for_each_index, input, kernel_dims, opt_input,
    tensor_from_f64,
};
use super::{add, one};
use crate::bail;
use crate::kernel::{NodeDef, OpError, OpKernel, OpResult, Registry, kernel};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "ConvTranspose", 1, build_conv_transpose);
    add(reg, "LpPool", 1, build_lp_pool);
    add(reg, "MaxUnpool", 9, build_max_unpool);
    add(reg, "Einsum", 12, build_einsum);
    add(reg, "AffineGrid", 20, build_affine_grid);
    add(reg, "GridSample", 16, build_grid_sample);
}

/// A per-spatial-dim attribute: `n` values (default `dflt` each).
fn per_dim(op: &str, what: &str, v: &Option<Vec<i64>>, n: usize, dflt: i64) -> OpResult<Vec<i64>> {
    match v {
        None => Ok(vec![dflt; n]),
        Some(v) if v.len() == n => Ok(v.clone()),
        Some(v) => Err(OpError(format!("{op}: {what} {v:?} must have {n} values"))),
    }
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
        if let Some(k) = &self.attrs.kernel_shape {
            if kernel_dims(op, k)? != kernel {
                bail!("{op}: kernel_shape {k:?} does not match W shape {ws:?}");
            }
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
        let full: Vec<i64> = (0..nd)
            .map(|d| strides[d] * (in_sp[d] - 1) + opad[d] + (kernel[d] as i64 - 1) * dil[d] + 1)
            .collect();
        let out_shape_attr = match &self.output_shape {
            // output_shape may list the spatial dims only, or the whole shape.
            Some(s) if s.len() == nd => Some(s.clone()),
            Some(s) if s.len() == nd + 2 => Some(s[2..].to_vec()),
            Some(s) => bail!("{op}: output_shape {s:?} must have {nd} values"),
            None => None,
        };
        let same = matches!(self.attrs.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
        let (pad_begin, out_sp): (Vec<i64>, Vec<i64>) = if same && self.attrs.pads.is_none() {
            let out = out_shape_attr
                .clone()
                .unwrap_or_else(|| (0..nd).map(|d| in_sp[d] * strides[d]).collect());
            let pb = (0..nd)
                .map(|d| {
                    let total = full[d] - out[d];
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
                None => (0..nd).map(|d| full[d] - pads[d] - pads[d + nd]).collect(),
            };
            (pads[..nd].to_vec(), out)
        };
        if out_sp.iter().any(|&o| o < 0) {
            bail!("{op}: output spatial shape {out_sp:?} is negative");
        }
        let out_u: Vec<usize> = out_sp.iter().map(|&o| o as usize).collect();
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
        {
            let fast = super::conv2d::ConvTranspose2d {
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
            if pad_begin.iter().all(|&p| p >= 0) {
                if let (Some(xf), Some(wf)) = (xc.as_slice(), wc.as_slice()) {
                    let bias: Vec<f32> = b.iter().map(|&v| v as f32).collect();
                    let y = fast.run(xf, wf, Some(&bias));
                    return one(Tensor::from_vec(&shape_of(nb, m, &out_u), y));
                }
            }
        }
        let xv = float_values(op, "X", x)?;
        let wv = float_values(op, "W", w)?;
        let plane_in: usize = xs[2..].iter().product();
        let plane_out: usize = out_u.iter().product();
        let kn: usize = kernel.iter().product();
        let ostr = c_strides(&out_u);
        let mut shape = vec![nb, m];
        shape.extend_from_slice(&out_u);
        let total = super::util::checked_numel(&shape)?;
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
                                if let (Some(o), Some(wval)) = (off, wv.get(wbase + k)) {
                                    if let Some(slot) = y.get_mut(ybase + o) {
                                        *slot += xval * wval;
                                    }
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
        let xv = float_values(&op, "X", x)?;
        let planes = xs[0] * xs[1];
        let plane_in: usize = in_sp.iter().product();
        let plane_out: usize = geo.out.iter().product();
        let istr = c_strides(in_sp);
        let nd = in_sp.len();
        // For each output position: the in-plane offsets of the taps inside the input.
        let mut windows: Vec<Vec<usize>> = Vec::with_capacity(plane_out);
        for_each_index(&geo.out, |oo| {
            let mut taps = Vec::new();
            for_each_index(&geo.kernel, |kk| {
                let mut off = Some(0usize);
                for d in 0..nd {
                    let i = (oo[d] * geo.strides[d] + kk[d] * geo.dilations[d]) as i64
                        - geo.pad_begin[d] as i64;
                    off = match off {
                        Some(acc) if i >= 0 && (i as usize) < in_sp[d] => {
                            Some(acc + i as usize * istr[d])
                        }
                        _ => None,
                    };
                }
                if let Some(o) = off {
                    taps.push(o);
                }
            });
            windows.push(taps);
        });
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
            let v = (xs[d + 2] as i64 - 1) * strides[d] - pads[d] - pads[d + nd]
                + kernel_attr[d] as i64;
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
        let ninf = super::util::checked_numel(&inferred)?;
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
        let total = super::util::checked_numel(&shape)?;
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

/// One Einsum operand term: labels, with the ellipsis expanded to labels `256 + k` where `k`
/// counts broadcast dims from the right.
fn einsum_term(op: &str, term: &str, rank: Option<usize>, ell: usize) -> OpResult<Vec<u32>> {
    let (pre, post, has_ell) = match term.find("...") {
        Some(i) => (&term[..i], &term[i + 3..], true),
        None => (term, "", false),
    };
    let letter = |c: char| -> OpResult<u32> {
        if c.is_ascii_alphabetic() {
            Ok(c as u32)
        } else {
            Err(OpError(format!(
                "{op}: invalid character '{c}' in term '{term}'"
            )))
        }
    };
    let mut out: Vec<u32> = pre.chars().map(letter).collect::<OpResult<_>>()?;
    let tail: Vec<u32> = post.chars().map(letter).collect::<OpResult<_>>()?;
    if has_ell {
        let n = match rank {
            Some(r) => r.checked_sub(out.len() + tail.len()).ok_or_else(|| {
                OpError(format!(
                    "{op}: term '{term}' has more labels than the input's rank {r}"
                ))
            })?,
            None => ell,
        };
        out.extend((0..n).map(|k| 256 + (n - 1 - k) as u32));
    }
    out.extend(tail);
    if let Some(r) = rank {
        if out.len() != r {
            bail!(
                "{op}: term '{term}' has {} labels, the input has rank {r}",
                out.len()
            );
        }
    }
    Ok(out)
}

fn build_einsum(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let eq: String = n
        .attr_string("equation")?
        .ok_or_else(|| n.error("missing required attribute 'equation'"))?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    Ok(kernel(move |inputs| {
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        let present: Vec<&TensorRef<'_>> = inputs.iter().flatten().collect();
        if terms.len() != present.len() {
            bail!(
                "{op}: equation '{eq}' has {} operands, got {} inputs",
                terms.len(),
                present.len()
            );
        }
        let ty = present
            .first()
            .map(|t| t.elem_type())
            .unwrap_or(epx_plugin_api::ElementType::Float);
        let mut labels = Vec::new();
        let mut sizes: std::collections::BTreeMap<u32, usize> = Default::default();
        let mut ell = 0usize;
        for (term, t) in terms.iter().zip(&present) {
            if t.elem_type() != ty {
                bail!(
                    "{op}: inputs must have the same element type, got {ty} and {}",
                    t.elem_type()
                );
            }
            let l = einsum_term(&op, term, Some(t.ndim()), 0)?;
            for (&lab, &d) in l.iter().zip(t.shape()) {
                let e = sizes.entry(lab).or_insert(d);
                if *e == 1 {
                    *e = d;
                } else if d != 1 && d != *e {
                    bail!("{op}: label dims disagree ({} vs {d}) in '{eq}'", *e);
                }
                if lab >= 256 {
                    ell = ell.max(lab as usize - 255);
                }
            }
            labels.push(l);
        }
        let out_labels: Vec<u32> = match rhs {
            Some(r) => einsum_term(&op, r, None, ell)?,
            None => {
                let mut counts: std::collections::BTreeMap<u32, usize> = Default::default();
                for l in &labels {
                    for &x in l {
                        *counts.entry(x).or_default() += 1;
                    }
                }
                let mut o: Vec<u32> = (0..ell).map(|k| 256 + (ell - 1 - k) as u32).collect();
                o.extend(
                    counts
                        .iter()
                        .filter(|(k, c)| **k < 256 && **c == 1)
                        .map(|(k, _)| *k),
                );
                o
            }
        };
        for l in &out_labels {
            if !sizes.contains_key(l) {
                bail!(
                    "{op}: output label {} does not appear in the inputs of '{eq}'",
                    char::from_u32(*l).unwrap_or('?')
                );
            }
        }
        let summed: Vec<u32> = sizes
            .keys()
            .copied()
            .filter(|k| !out_labels.contains(k))
            .collect();
        let all: Vec<u32> = out_labels.iter().chain(&summed).copied().collect();
        let dims: Vec<usize> = all
            .iter()
            .map(|l| sizes.get(l).copied().unwrap_or(1))
            .collect();
        let out_shape: Vec<usize> = dims[..out_labels.len()].to_vec();
        let out_n = super::util::checked_numel(&out_shape)?;
        super::util::checked_numel(&dims)?;
        let vals: Vec<Vec<f64>> = present.iter().map(|t| t.to_f64_vec()).collect();
        // For each operand: the stride of each label in `all` (0 for absent or broadcast dims).
        let strides: Vec<Vec<usize>> = labels
            .iter()
            .zip(&present)
            .map(|(l, t)| {
                let cs = c_strides(t.shape());
                all.iter()
                    .map(|lab| {
                        l.iter()
                            .enumerate()
                            .filter(|(i, x)| *x == lab && t.shape()[*i] != 1)
                            .map(|(i, _)| cs[i])
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let mut out = vec![0.0f64; out_n];
        let inner: usize = dims[out_labels.len()..].iter().product();
        let mut k = 0usize;
        for_each_index(&dims, |ii| {
            let mut prod = 1.0;
            for (v, st) in vals.iter().zip(&strides) {
                let off: usize = ii.iter().zip(st).map(|(a, b)| a * b).sum();
                prod *= v.get(off).copied().unwrap_or(0.0);
            }
            if let Some(o) = out.get_mut(k / inner.max(1)) {
                *o += prod;
            }
            k += 1;
        });
        one(tensor_from_f64(ty, &out_shape, out))
    }))
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
        let mut out = Vec::with_capacity(super::util::checked_numel(&shape)?);
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
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::{ArrayD, IxDyn};

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let k = Registry::with_all_ops().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
    }

    fn vals(t: &Tensor) -> Vec<f32> {
        t.as_array::<f32>().unwrap().iter().copied().collect()
    }

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
    fn einsum_forms() {
        let a = t(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let e = |eq: &str| {
            NodeDef::new("Einsum", 12)
                .with_attr("equation", AttrValue::String(eq.as_bytes().to_vec()))
        };
        let o = run(e("ij,jk->ik"), vec![a.clone(), a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![7.0, 10.0, 15.0, 22.0]);
        let o = run(e("ij->ji"), vec![a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.0, 3.0, 2.0, 4.0]);
        let o = run(e("ii"), vec![a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![5.0]);
        let o = run(e("...ii ->...i"), vec![a.clone()]).unwrap();
        assert_eq!(vals(&o[0]), vec![1.0, 4.0]);
        let err = run(e("ijk->i"), vec![a.clone()]).unwrap_err();
        assert!(
            err.0.contains("has 3 labels, the input has rank 2"),
            "{err}"
        );
        let err = run(e("ij,jk->ik"), vec![a.clone(), t(&[3, 1], vec![0.0; 3])]).unwrap_err();
        assert!(err.0.contains("label dims disagree"), "{err}");
    }

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
