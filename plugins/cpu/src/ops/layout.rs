//! Layout operators that move or pad data: Pad (constant/reflect/edge/wrap, every opset),
//! CenterCropPad, Split (attribute, input and `num_outputs` forms) and its inverse Concat,
//! DepthToSpace, SpaceToDepth and Col2Im.

use ndarray::{ArrayViewD, Axis, IxDyn, Slice};

use crate::ops::util::num::FloatElem;

use crate::ops::util::indexing::{c_strides, contiguous, for_each_index};

use crate::limits::checked_numel;

use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, normalize_axes, normalize_axis, opt_input, typed_like};
use crate::tensor::{Elem, Scalar, Tensor, TensorRef};
use crate::{bail, dispatch_all, dispatch_float};

pub fn register(reg: &mut Registry) {
    add(reg, "Pad", 1, build_pad);
    add(reg, "CenterCropPad", 18, build_center_crop_pad);
    add(reg, "Split", 1, build_split);
    add(reg, "DepthToSpace", 1, build_depth_to_space);
    add(reg, "SpaceToDepth", 1, build_space_to_depth);
    add(reg, "Col2Im", 18, build_col2im);
    add(reg, "Concat", 1, build_concat);
}

// ---------------------------------------------------------------------------------------------
// Pad

#[derive(Clone, Copy, Debug, PartialEq)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

/// The source coordinate of output coordinate `o` on one dim (None = the constant value).
fn pad_source(mode: PadMode, o: usize, begin: i64, n: usize) -> Option<usize> {
    let c = o as i64 - begin;
    let ni = n as i64;
    if (0..ni).contains(&c) {
        return Some(c as usize);
    }
    if n == 0 {
        return None;
    }
    match mode {
        PadMode::Constant => None,
        PadMode::Edge => Some(c.clamp(0, ni - 1) as usize),
        PadMode::Wrap => Some(c.rem_euclid(ni) as usize),
        PadMode::Reflect => {
            if n == 1 {
                return Some(0);
            }
            let period = 2 * (ni - 1);
            let m = c.rem_euclid(period);
            Some(if m >= ni { period - m } else { m } as usize)
        }
    }
}

fn pad_typed<T: Elem>(
    op: &str,
    x: ArrayViewD<'_, T>,
    begins: &[i64],
    ends: &[i64],
    mode: PadMode,
    value: T,
) -> OpResult<Tensor> {
    let shape = x.shape().to_vec();
    let mut out_shape = Vec::with_capacity(shape.len());
    for (d, &n) in shape.iter().enumerate() {
        let o = (n as i64)
            .checked_add(begins[d])
            .and_then(|v| v.checked_add(ends[d]))
            .filter(|&v| v >= 0)
            .ok_or_else(|| {
                OpError(format!(
                    "{op}: pads {}/{} make dim {d} of size {n} negative",
                    begins[d], ends[d]
                ))
            })?;
        let grows = begins[d] > 0 || ends[d] > 0;
        if n == 0 && grows && mode != PadMode::Constant {
            bail!("{op}: cannot pad the empty dim {d} in {mode:?} mode");
        }
        out_shape.push(o as usize);
    }
    let total = checked_numel(&out_shape)?;
    // Per dim, the source index of each output index (None: the constant).
    let maps: Vec<Vec<Option<usize>>> = (0..shape.len())
        .map(|d| {
            (0..out_shape[d])
                .map(|o| pad_source(mode, o, begins[d], shape[d]))
                .collect()
        })
        .collect();
    let src = contiguous(&x);
    // A recycled buffer where one fits (a new one is faulted in page by page).
    let mut out = crate::scratch::take_any::<T>(total)?;
    // Rows along the last padded dim; the dims after it are not padded, and each of their
    // blocks of `block` elements moves whole.
    let rank = shape.len();
    let Some(last) = (0..rank).rev().find(|&d| begins[d] != 0 || ends[d] != 0) else {
        out.extend_from_slice(&src);
        return Tensor::from_vec(&out_shape, out);
    };
    let block: usize = shape[last + 1..].iter().product();
    let (inner_map, outer_maps) = (&maps[last], &maps[..last]);
    let row = shape[last] * block;
    let segments = row_segments(inner_map);
    let strides = c_strides(&shape[..last]);
    for_each_index(&out_shape[..last], |pos| {
        // The source row, or none when an outer dim is in the padding.
        let mut off = Some(0usize);
        for (d, &p) in pos.iter().enumerate() {
            off = off.zip(outer_maps[d][p]).map(|(o, s)| o + s * strides[d]);
        }
        let Some(r) = off.map(|o| &src[o * row..(o + 1) * row]) else {
            out.extend(std::iter::repeat_n(value, inner_map.len() * block));
            return;
        };
        for seg in &segments {
            match *seg {
                Segment::Copy(from, len) => {
                    out.extend_from_slice(&r[from * block..(from + len) * block]);
                }
                Segment::One(from) => out.extend_from_slice(&r[from * block..(from + 1) * block]),
                Segment::Value(len) => out.extend(std::iter::repeat_n(value, len * block)),
            }
        }
    });
    Tensor::from_vec(&out_shape, out)
}

/// A piece of a padded row: a run of the source row, one source element, or the constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Segment {
    Copy(usize, usize),
    One(usize),
    Value(usize),
}

/// A padded row as runs: consecutive output indices that read consecutive source indices are
/// one copy, consecutive constants one fill (the reflected or repeated edges stay single
/// elements).
fn row_segments(map: &[Option<usize>]) -> Vec<Segment> {
    let mut segs: Vec<Segment> = Vec::new();
    for &m in map {
        let merged = match (segs.last_mut(), m) {
            (Some(Segment::Value(len)), None) => {
                *len += 1;
                true
            }
            (Some(Segment::Copy(from, len)), Some(s)) if *from + *len == s => {
                *len += 1;
                true
            }
            (Some(last @ Segment::One(_)), Some(s)) => match *last {
                Segment::One(from) if from + 1 == s => {
                    *last = Segment::Copy(from, 2);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !merged {
            segs.push(match m {
                Some(s) => Segment::One(s),
                None => Segment::Value(1),
            });
        }
    }
    segs
}

fn parse_pad_mode(n: &NodeDef) -> OpResult<PadMode> {
    match n.attr_string_or("mode", "constant")?.as_str() {
        "constant" => Ok(PadMode::Constant),
        "reflect" => Ok(PadMode::Reflect),
        "edge" => Ok(PadMode::Edge),
        "wrap" if n.opset >= 19 => Ok(PadMode::Wrap),
        other => Err(n.error(format_args!("unknown mode '{other}'"))),
    }
}

/// Splits a `[x1_begin, x2_begin, .., x1_end, x2_end, ..]` list for the given axes into full
/// per-dim begin/end vectors.
fn expand_pads(
    op: &str,
    pads: &[i64],
    axes: &[usize],
    rank: usize,
) -> OpResult<(Vec<i64>, Vec<i64>)> {
    let k = axes.len();
    if pads.len() != 2 * k {
        bail!(
            "{op}: pads has {} values, expected {} (2 per padded axis)",
            pads.len(),
            2 * k
        );
    }
    let mut begins = vec![0i64; rank];
    let mut ends = vec![0i64; rank];
    for (i, &a) in axes.iter().enumerate() {
        begins[a] = pads[i];
        ends[a] = pads[i + k];
    }
    Ok((begins, ends))
}

fn pad_value<T: Elem>(
    op: &str,
    _x: &ArrayViewD<'_, T>,
    value_attr: f32,
    value_in: Option<&TensorRef<'_>>,
) -> OpResult<T> {
    match value_in {
        Some(t) if !t.is_empty() => {
            let v = typed_like::<T>(op, t)?;
            if v.len() != 1 {
                bail!(
                    "{op}: constant_value must have one element, got shape {:?}",
                    v.shape()
                );
            }
            Ok(v.iter().next().copied().unwrap_or_default())
        }
        Some(_) => Ok(T::default()),
        None => Ok(T::from_scalar(Scalar::F(f64::from(value_attr)))),
    }
}

fn build_pad(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let mode = parse_pad_mode(n)?;
    let attr_pads = if n.opset < 11 {
        let name = if n.opset < 2 { "paddings" } else { "pads" };
        Some(n.req_ints(name)?)
    } else {
        None
    };
    let value_attr = n.attr_float_or("value", 0.0)?;
    let opset = n.opset;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let rank = x.ndim();
        let (pads, value_in, axes) = match &attr_pads {
            Some(p) => (p.clone(), None, None),
            None => {
                let p = input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: pads"))?;
                let axes = if opset >= 18 {
                    opt_input(inputs, 3)
                        .map(|t| t.to_i64_vec(&format!("{op}: axes")))
                        .transpose()?
                } else {
                    None
                };
                (p, opt_input(inputs, 2), axes)
            }
        };
        let axes = match axes {
            Some(a) => normalize_axes(&op, &a, rank)?,
            None => (0..rank).collect(),
        };
        let (begins, ends) = expand_pads(&op, &pads, &axes, rank)?;
        one(dispatch_all!(
            x.clone(),
            |a| {
                let v = if mode == PadMode::Constant {
                    pad_value(&op, &a, value_attr, value_in)?
                } else {
                    Default::default()
                };
                pad_typed(&op, a, &begins, &ends, mode, v)
            },
            &op
        ))
    }))
}

fn build_center_crop_pad(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axes_attr = n.attr_ints("axes")?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let rank = x.ndim();
        let shape = input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: shape"))?;
        let axes = match &axes_attr {
            Some(a) => normalize_axes(&op, a, rank)?,
            None => (0..rank).collect(),
        };
        if shape.len() != axes.len() {
            bail!(
                "{op}: shape has {} values, expected {} (one per axis)",
                shape.len(),
                axes.len()
            );
        }
        let mut begins = vec![0i64; rank];
        let mut ends = vec![0i64; rank];
        for (&a, &target) in axes.iter().zip(&shape) {
            if target < 0 {
                bail!("{op}: negative target size {target} for axis {a}");
            }
            let dim = x.shape()[a] as i64;
            let diff = target - dim;
            let b = if diff >= 0 { diff / 2 } else { -((-diff) / 2) };
            begins[a] = b;
            ends[a] = diff - b;
        }
        one(dispatch_all!(
            x.clone(),
            |a| pad_typed(
                &op,
                a,
                &begins,
                &ends,
                PadMode::Constant,
                Default::default()
            ),
            &op
        ))
    }))
}

// ---------------------------------------------------------------------------------------------
// Split

fn split_typed<T: Elem>(x: ArrayViewD<'_, T>, axis: usize, sizes: &[usize]) -> Vec<Tensor> {
    let mut start = 0usize;
    sizes
        .iter()
        .map(|&s| {
            let v = x.slice_axis(
                Axis(axis),
                Slice::from(start as isize..(start + s) as isize),
            );
            start += s;
            T::wrap(v.as_standard_layout().into_owned())
        })
        .collect()
}

fn build_split(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = n.attr_int_or("axis", 0)?;
    let split_attr = if n.opset < 13 {
        n.attr_ints("split")?
    } else {
        None
    };
    let num_outputs_attr = if n.opset >= 18 {
        n.attr_int("num_outputs")?
    } else {
        None
    };
    let outputs = n.num_outputs;
    let opset = n.opset;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let ax = normalize_axis(&op, axis, x.ndim())?;
        let dim = x.shape()[ax];
        let split_in = if !(2..13).contains(&opset) {
            opt_input(inputs, 1)
                .map(|t| t.to_i64_vec(&format!("{op}: split")))
                .transpose()?
        } else {
            None
        };
        let split = split_attr.clone().or(split_in);
        let sizes: Vec<usize> = match split {
            Some(s) => {
                let sizes = s
                    .iter()
                    .map(|&v| {
                        usize::try_from(v).map_err(|_| {
                            OpError(format!("{op}: split sizes must be >= 0, got {s:?}"))
                        })
                    })
                    .collect::<OpResult<Vec<_>>>()?;
                let sum = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
                if sum != Some(dim) {
                    bail!("{op}: split sizes {s:?} do not sum to axis {ax} of size {dim}");
                }
                if num_outputs_attr.is_some() {
                    bail!("{op}: split input and num_outputs attribute are both given");
                }
                sizes
            }
            None => {
                let parts = match num_outputs_attr {
                    Some(k) => usize::try_from(k)
                        .ok()
                        .filter(|&k| k > 0)
                        .ok_or_else(|| OpError(format!("{op}: num_outputs must be positive")))?,
                    None => outputs,
                };
                if parts == 0 {
                    bail!("{op}: needs at least one output");
                }
                if parts != outputs {
                    bail!("{op}: num_outputs is {parts}, but the node has {outputs} outputs");
                }
                if num_outputs_attr.is_some() {
                    let chunk = dim.div_ceil(parts);
                    (0..parts)
                        .map(|i| dim.saturating_sub(i * chunk).min(chunk))
                        .collect()
                } else {
                    if dim % parts != 0 {
                        bail!("{op}: axis {ax} of size {dim} cannot be split evenly into {parts}");
                    }
                    vec![dim / parts; parts]
                }
            }
        };
        if sizes.len() != outputs {
            bail!("{op}: {} split sizes for {outputs} outputs", sizes.len());
        }
        dispatch_all!(x.clone(), |a| Ok(split_typed(a, ax, &sizes)), &op)
    }))
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace / SpaceToDepth

fn permute_typed<T: Elem>(
    op: &str,
    x: ArrayViewD<'_, T>,
    split_shape: &[usize],
    perm: &[usize],
    out_shape: &[usize],
) -> OpResult<Tensor> {
    let v = x
        .to_shape(IxDyn(split_shape))
        .map_err(|e| OpError(format!("{op}: {e}")))?;
    let p = v.view().permuted_axes(IxDyn(perm));
    let data: Vec<T> = p.iter().copied().collect();
    Tensor::from_vec(out_shape, data)
}

fn blocksize(n: &NodeDef) -> OpResult<usize> {
    let b = n.req_int("blocksize")?;
    usize::try_from(b)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| n.error(format_args!("blocksize must be positive, got {b}")))
}

/// `mode`: whether a channel splits as (channel, row, column) in the block — CRD — or as
/// (row, column, channel) — DCR, the default of DepthToSpace and of SpaceToDepth-28.
fn crd_mode(n: &NodeDef) -> OpResult<bool> {
    match n.attr_string_or("mode", "DCR")?.as_str() {
        "DCR" => Ok(false),
        "CRD" => Ok(true),
        other => Err(n.error(format_args!("unknown mode '{other}' (DCR or CRD)"))),
    }
}

fn build_depth_to_space(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let b = blocksize(n)?;
    let crd = crd_mode(n)?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let [nn, c, h, w] = x.shape() else {
            bail!("{op}: input must be 4-D, got shape {:?}", x.shape());
        };
        let (nn, c, h, w) = (*nn, *c, *h, *w);
        if c % (b * b) != 0 {
            bail!(
                "{op}: channels {c} are not divisible by blocksize^2 = {}",
                b * b
            );
        }
        let cc = c / (b * b);
        let (split, perm): (Vec<usize>, Vec<usize>) = if crd {
            (vec![nn, cc, b, b, h, w], vec![0, 1, 4, 2, 5, 3])
        } else {
            (vec![nn, b, b, cc, h, w], vec![0, 3, 4, 1, 5, 2])
        };
        let out = [nn, cc, h * b, w * b];
        one(dispatch_all!(
            x.clone(),
            |a| permute_typed(&op, a, &split, &perm, &out),
            &op
        ))
    }))
}

fn build_space_to_depth(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let b = blocksize(n)?;
    // Opset 28 added `mode`; the schema check refuses it at older opsets.
    let crd = crd_mode(n)?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let [nn, c, h, w] = x.shape() else {
            bail!("{op}: input must be 4-D, got shape {:?}", x.shape());
        };
        let (nn, c, h, w) = (*nn, *c, *h, *w);
        if h % b != 0 || w % b != 0 {
            bail!("{op}: spatial dims {h}x{w} are not divisible by blocksize {b}");
        }
        let split = [nn, c, h / b, b, w / b, b];
        // Output channel (c, by, bx) for CRD, (by, bx, c) for DCR.
        let perm = if crd {
            [0, 1, 3, 5, 2, 4]
        } else {
            [0, 3, 5, 1, 2, 4]
        };
        let out = [nn, c * b * b, h / b, w / b];
        one(dispatch_all!(
            x.clone(),
            |a| permute_typed(&op, a, &split, &perm, &out),
            &op
        ))
    }))
}

// ---------------------------------------------------------------------------------------------
// Col2Im

struct Col2ImGeom {
    image: Vec<usize>,
    block: Vec<usize>,
    dil: Vec<usize>,
    strides: Vec<usize>,
    pad_begin: Vec<usize>,
    /// number of sliding positions per spatial dim
    blocks: Vec<usize>,
}

fn col2im_typed<T: FloatElem>(op: &str, x: ArrayViewD<'_, T>, g: &Col2ImGeom) -> OpResult<Tensor> {
    let [nn, cb, l] = x.shape() else {
        bail!(
            "{op}: input must be 3-D [N, C*prod(block_shape), L], got {:?}",
            x.shape()
        );
    };
    let (nn, cb, l) = (*nn, *cb, *l);
    let kprod: usize = g.block.iter().product();
    if kprod == 0 || cb % kprod != 0 {
        bail!("{op}: input dim 1 ({cb}) is not divisible by prod(block_shape) = {kprod}");
    }
    let lprod: usize = g.blocks.iter().product();
    if lprod != l {
        bail!("{op}: input dim 2 ({l}) must equal the number of blocks {lprod}");
    }
    let c = cb / kprod;
    let img: usize = g.image.iter().product();
    let mut out_shape = vec![nn, c];
    out_shape.extend_from_slice(&g.image);
    let total = checked_numel(&out_shape)?;
    let mut out = vec![T::zero().to_acc(); total];
    let src: Vec<T> = x.iter().copied().collect();
    let istr = c_strides(&g.image);
    let nd = g.image.len();
    for b in 0..nn {
        for ch in 0..c {
            let mut kk = 0usize;
            for_each_index(&g.block, |kpos| {
                let row = (b * cb) + ch * kprod + kk;
                kk += 1;
                let mut ll = 0usize;
                for_each_index(&g.blocks, |lpos| {
                    let s = src.get(row * l + ll).copied();
                    ll += 1;
                    let mut off = 0usize;
                    for d in 0..nd {
                        let p = (lpos[d] * g.strides[d] + kpos[d] * g.dil[d]) as i64
                            - g.pad_begin[d] as i64;
                        if p < 0 || p >= g.image[d] as i64 {
                            return;
                        }
                        off += p as usize * istr[d];
                    }
                    if let (Some(s), Some(o)) = (s, out.get_mut((b * c + ch) * img + off)) {
                        *o = *o + s.to_acc();
                    }
                });
            });
        }
    }
    Tensor::from_vec(&out_shape, out.into_iter().map(T::from_acc).collect())
}

fn build_col2im(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let dil_attr = n.attr_ints("dilations")?;
    let pads_attr = n.attr_ints("pads")?;
    let strides_attr = n.attr_ints("strides")?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let to_dims = |i: usize, what: &str| -> OpResult<Vec<usize>> {
            input(&op, inputs, i)?
                .to_i64_vec(&format!("{op}: {what}"))?
                .iter()
                .map(|&v| {
                    usize::try_from(v)
                        .ok()
                        .filter(|&u| u > 0)
                        .ok_or_else(|| OpError(format!("{op}: {what} must be positive, got {v}")))
                })
                .collect()
        };
        let image = to_dims(1, "image_shape")?;
        let block = to_dims(2, "block_shape")?;
        let nd = image.len();
        if block.len() != nd {
            bail!("{op}: image_shape and block_shape must have the same length");
        }
        let per =
            |v: &Option<Vec<i64>>, len: usize, def: i64, what: &str| -> OpResult<Vec<usize>> {
                let v = v.clone().unwrap_or_else(|| vec![def; len]);
                if v.len() != len {
                    bail!("{op}: {what} must have {len} values, got {v:?}");
                }
                v.iter()
                    .map(|&x| {
                        usize::try_from(x)
                            .ok()
                            .filter(|&u| def == 0 || u > 0)
                            .ok_or_else(|| OpError(format!("{op}: invalid {what} {v:?}")))
                    })
                    .collect()
            };
        let dil = per(&dil_attr, nd, 1, "dilations")?;
        let strides = per(&strides_attr, nd, 1, "strides")?;
        let pads = per(&pads_attr, 2 * nd, 0, "pads")?;
        let mut blocks = Vec::with_capacity(nd);
        for d in 0..nd {
            let eff = dil[d] * (block[d] - 1) + 1;
            let padded = image[d] + pads[d] + pads[d + nd];
            if padded < eff {
                bail!("{op}: block extent {eff} exceeds padded image {padded} in dim {d}");
            }
            blocks.push((padded - eff) / strides[d] + 1);
        }
        let g = Col2ImGeom {
            image,
            block,
            dil,
            strides,
            pad_begin: pads[..nd].to_vec(),
            blocks,
        };
        one(dispatch_float!(
            x.clone(),
            |a| col2im_typed(&op, a, &g),
            &op
        ))
    }))
}

fn concat_typed<T: Elem>(
    op: &str,
    axis: usize,
    first: ArrayViewD<'_, T>,
    all: &[&TensorRef<'_>],
) -> OpResult<Tensor> {
    let views: Vec<ArrayViewD<'_, T>> = all
        .iter()
        .map(|t| typed_like::<T>(op, t))
        .collect::<OpResult<_>>()?;
    for (i, v) in views.iter().enumerate() {
        let ok = v.ndim() == first.ndim()
            && v.shape()
                .iter()
                .zip(first.shape())
                .enumerate()
                .all(|(d, (a, b))| d == axis || a == b);
        if !ok {
            bail!(
                "{op}: input {i} has shape {:?}, incompatible with input 0 of shape {:?} on axis {axis}",
                v.shape(),
                first.shape()
            );
        }
    }
    let slices: Option<Vec<&[T]>> = views.iter().map(|v| v.as_slice()).collect();
    if let Some(parts) = slices {
        // All C-contiguous: each output row is the inputs' blocks one after the other.
        let inner: usize = first.shape()[axis + 1..].iter().product();
        let outer: usize = first.shape()[..axis].iter().product();
        let blocks: Vec<usize> = views.iter().map(|v| v.shape()[axis] * inner).collect();
        let mut shape = first.shape().to_vec();
        shape[axis] = views.iter().map(|v| v.shape()[axis]).sum();
        let data = concat_rows(&parts, &blocks, outer)?;
        return ndarray::ArrayD::from_shape_vec(shape, data)
            .map(Tensor::from)
            .map_err(|e| OpError(format!("{op}: {e}")));
    }
    ndarray::concatenate(Axis(axis), &views)
        .map(Tensor::from)
        .map_err(|e| OpError(format!("{op}: {e}")))
}

/// `outer` rows, each input `i`'s `blocks[i]` elements of that row in turn, copied in pieces
/// shared across the intra-op pool.
fn concat_rows<T: Elem>(parts: &[&[T]], blocks: &[usize], outer: usize) -> OpResult<Vec<T>> {
    let row: usize = blocks.iter().sum();
    let total = outer * row;
    let piece = crate::par::chunk_len(total, 64 << 10, 16);
    if row > 0 && row <= piece {
        // Pieces of whole rows: each row is the inputs' blocks in turn, single elements
        // (stacking along a new last axis) pushed one by one.
        let piece = piece / row * row;
        return Ok(crate::par::build_vec(
            T::buffer(total)?,
            total,
            piece,
            |start, out| {
                let rows = start / row..((start + piece).min(total) / row);
                for o in rows {
                    for (part, &b) in parts.iter().zip(blocks) {
                        if b == 1 {
                            out.push(part[o]);
                        } else {
                            out.extend_from_slice(&part[o * b..(o + 1) * b]);
                        }
                    }
                }
            },
        ));
    }
    Ok(crate::par::build_vec(
        T::buffer(total)?,
        total,
        piece,
        |start, out| {
            let end = (start + piece).min(total);
            let mut pos = start;
            while pos < end {
                let (o, mut within) = (pos / row, pos % row);
                let mut i = 0;
                while within >= blocks[i] {
                    within -= blocks[i];
                    i += 1;
                }
                let take = (blocks[i] - within).min(end - pos);
                out.extend_from_slice(&parts[i][o * blocks[i] + within..][..take]);
                pos += take;
            }
        },
    ))
}

fn build_concat(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let axis = if n.opset < 4 {
        n.attr_int_or("axis", 1)?
    } else {
        n.req_int("axis")?
    };
    Ok(kernel(move |inputs| {
        let all: Vec<&TensorRef<'_>> = inputs.iter().flatten().collect();
        let Some(first) = all.first() else {
            bail!("{op}: needs at least one input")
        };
        let ax = normalize_axis(&op, axis, first.ndim())?;
        one(dispatch_all!(
            (*first).clone(),
            |a| concat_typed(&op, ax, a, &all),
            &op
        ))
    }))
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

    fn i64s(v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
    }

    fn iota(shape: &[usize]) -> Option<Tensor> {
        let n: usize = shape.iter().product();
        Some(Tensor::from_vec(shape, (0..n).map(|x| x as f32).collect()).unwrap())
    }

    fn mode(m: &str) -> NodeDef {
        NodeDef::new("Pad", 19).with_attr("mode", AttrValue::String(m.as_bytes().to_vec()))
    }

    /// Padded rows built from runs give, in every mode and with pads that crop, what each
    /// output element's own source index gives.
    #[test]
    fn padded_rows_from_runs_match_the_element_map() {
        let shape = [2usize, 3, 5];
        let x: Vec<i32> = (0..30).collect();
        let xa = ndarray::ArrayD::from_shape_vec(IxDyn(&shape), x.clone()).unwrap();
        let pad_cases: [([i64; 3], [i64; 3]); 6] = [
            ([0, 1, 2], [1, 0, 3]),
            ([0, 0, -1], [0, -1, 2]),
            ([1, 2, 4], [0, 2, 4]),
            ([0, 0, 0], [0, 0, 0]),
            ([0, 2, 0], [0, 1, 0]),
            ([1, 0, 0], [2, 0, 0]),
        ];
        for mode in [
            PadMode::Constant,
            PadMode::Reflect,
            PadMode::Edge,
            PadMode::Wrap,
        ] {
            for (b, e) in pad_cases {
                if mode == PadMode::Reflect && b.iter().chain(&e).any(|&p| p >= 3) {
                    continue;
                }
                let got = pad_typed("Pad", xa.view(), &b, &e, mode, -1).unwrap();
                let out: Vec<usize> = (0..3)
                    .map(|d| (shape[d] as i64 + b[d] + e[d]) as usize)
                    .collect();
                let mut want = Vec::new();
                for_each_index(&out, |pos| {
                    let src: Option<usize> = (0..3).try_fold(0, |off, d| {
                        pad_source(mode, pos[d], b[d], shape[d]).map(|s| off * shape[d] + s)
                    });
                    want.push(src.map_or(-1, |s| x[s]));
                });
                assert_eq!(
                    got,
                    Tensor::from_vec(&out, want).unwrap(),
                    "{mode:?} {b:?} {e:?}"
                );
            }
        }
        let m = [
            None,
            Some(1),
            Some(0),
            Some(1),
            Some(2),
            Some(3),
            Some(2),
            None,
            None,
        ];
        assert_eq!(
            row_segments(&m),
            [
                Segment::Value(1),
                Segment::One(1),
                Segment::Copy(0, 4),
                Segment::One(2),
                Segment::Value(2)
            ]
        );
    }

    /// Concatenating along the last axis with blocks of one element (stacking) and of several
    /// interleaves the rows in input order.
    #[test]
    fn concat_of_single_elements_interleaves_rows() {
        let a: Vec<i32> = (0..6).collect();
        let b: Vec<i32> = (10..16).collect();
        let c: Vec<i32> = (20..32).collect();
        let got = concat_rows(&[&a[..], &b[..], &c[..]], &[1, 1, 2], 6).unwrap();
        let want: Vec<i32> = (0..6)
            .flat_map(|o| [a[o], b[o], c[2 * o], c[2 * o + 1]])
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn pad_modes() {
        let x = iota(&[3]);
        let pads = i64s(&[2, 3]);
        let got = |m: &str| {
            run(mode(m), vec![x.clone(), pads.clone()])
                .unwrap()
                .remove(0)
        };
        assert_eq!(
            got("constant"),
            Tensor::F32(array![0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0].into_dyn())
        );
        assert_eq!(
            got("reflect"),
            Tensor::F32(array![2.0, 1.0, 0.0, 1.0, 2.0, 1.0, 0.0, 1.0].into_dyn())
        );
        assert_eq!(
            got("edge"),
            Tensor::F32(array![0.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0].into_dyn())
        );
        assert_eq!(
            got("wrap"),
            Tensor::F32(array![1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0].into_dyn())
        );
        // Constant value, negative pads (crop) and axes.
        let out = run(
            mode("constant"),
            vec![
                iota(&[2, 3]),
                i64s(&[1, -1]),
                Some(Tensor::scalar(9.0f32)),
                i64s(&[-1]),
            ],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[9.0, 0.0, 1.0], [9.0, 3.0, 4.0]].into_dyn())
        );
        // Opset 2 attributes.
        let old = NodeDef::new("Pad", 2)
            .with_attr("pads", AttrValue::Ints(vec![1, 0]))
            .with_attr("value", AttrValue::Float(5.0));
        assert_eq!(
            run(old, vec![Some(Tensor::I32(array![7].into_dyn()))]).unwrap()[0],
            Tensor::I32(array![5, 7].into_dyn())
        );
    }

    #[test]
    fn pad_errors() {
        let e = run(mode("constant"), vec![iota(&[3]), i64s(&[1, 2, 3])]).unwrap_err();
        assert!(e.0.contains("pads has 3 values, expected 2"), "{e}");
        let e = run(mode("constant"), vec![iota(&[3]), i64s(&[-2, -2])]).unwrap_err();
        assert!(e.0.contains("negative"), "{e}");
        let e = run(mode("reflect"), vec![iota(&[0]), i64s(&[1, 0])]).unwrap_err();
        assert!(e.0.contains("cannot pad the empty dim 0"), "{e}");
        let e = run(mode("bogus"), vec![]).unwrap_err();
        assert!(e.0.contains("unknown mode 'bogus'"), "{e}");
        let e = run(
            mode("constant"),
            vec![iota(&[3]), i64s(&[1, 1]), None, i64s(&[1])],
        )
        .unwrap_err();
        assert!(e.0.contains("axis 1 is out of range for rank 1"), "{e}");
        let e = run(
            mode("constant"),
            vec![iota(&[3]), i64s(&[1, 1]), Some(Tensor::scalar(1i64))],
        )
        .unwrap_err();
        assert!(e.0.contains("same element type"), "{e}");
    }

    #[test]
    fn center_crop_pad() {
        let out = run(
            NodeDef::new("CenterCropPad", 18),
            vec![iota(&[5, 2]), i64s(&[2, 4])],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[0.0, 2.0, 3.0, 0.0], [0.0, 4.0, 5.0, 0.0]].into_dyn())
        );
        let e = run(
            NodeDef::new("CenterCropPad", 18),
            vec![iota(&[5, 2]), i64s(&[2])],
        )
        .unwrap_err();
        assert!(e.0.contains("shape has 1 values, expected 2"), "{e}");
    }

    #[test]
    fn split_forms() {
        let x = iota(&[7]);
        let n18 = NodeDef::new("Split", 18)
            .with_attr("num_outputs", AttrValue::Int(3))
            .with_io(1, 3);
        let out = run(n18, vec![x.clone()]).unwrap();
        let shapes: Vec<_> = out.iter().map(|t| t.shape().to_vec()).collect();
        assert_eq!(shapes, vec![vec![3], vec![3], vec![1]]);
        let n13 = NodeDef::new("Split", 13).with_io(2, 2);
        let out = run(n13.clone(), vec![x.clone(), i64s(&[2, 5])]).unwrap();
        assert_eq!(out[0], Tensor::F32(array![0.0, 1.0].into_dyn()));
        let e = run(n13.clone(), vec![x.clone(), i64s(&[2, 4])]).unwrap_err();
        assert!(e.0.contains("do not sum to axis 0 of size 7"), "{e}");
        let e = run(n13, vec![x.clone()]).unwrap_err();
        assert!(e.0.contains("cannot be split evenly"), "{e}");
        let n11 = NodeDef::new("Split", 11)
            .with_attr("split", AttrValue::Ints(vec![6, 1]))
            .with_io(1, 2);
        let out = run(n11, vec![x.clone()]).unwrap();
        assert_eq!(out[1], Tensor::F32(array![6.0].into_dyn()));
        let bad = NodeDef::new("Split", 13)
            .with_attr("axis", AttrValue::Int(1))
            .with_io(1, 1);
        let e = run(bad, vec![x]).unwrap_err();
        assert!(e.0.contains("axis 1 is out of range for rank 1"), "{e}");
    }

    #[test]
    fn depth_space_round_trip() {
        let x = iota(&[1, 8, 2, 3]);
        for m in ["DCR", "CRD"] {
            let d2s = NodeDef::new("DepthToSpace", 13)
                .with_attr("blocksize", AttrValue::Int(2))
                .with_attr("mode", AttrValue::String(m.as_bytes().to_vec()));
            let y = run(d2s, vec![x.clone()]).unwrap().remove(0);
            assert_eq!(y.shape(), &[1, 2, 4, 6]);
            if m == "CRD" {
                // CRD: channel 0 takes input channels 0..4 as its 2x2 blocks.
                let v = y.as_array::<f32>().unwrap();
                assert_eq!(v[[0, 0, 0, 1]], 6.0);
                assert_eq!(v[[0, 0, 1, 0]], 12.0);
            }
            // SpaceToDepth in the same mode undoes it (opset 28 has `mode`; 13 is DCR).
            let s2d = if m == "DCR" {
                NodeDef::new("SpaceToDepth", 13)
            } else {
                NodeDef::new("SpaceToDepth", 28).with_attr("mode", AttrValue::String(m.into()))
            };
            let back = run(s2d.with_attr("blocksize", AttrValue::Int(2)), vec![Some(y)]);
            assert_eq!(Some(back.unwrap().remove(0)), x, "{m}");
        }
        let s2d = NodeDef::new("SpaceToDepth", 13).with_attr("blocksize", AttrValue::Int(2));
        let e = run(s2d, vec![iota(&[1, 1, 3, 4])]).unwrap_err();
        assert!(e.0.contains("not divisible by blocksize 2"), "{e}");
        let d2s = NodeDef::new("DepthToSpace", 13).with_attr("blocksize", AttrValue::Int(2));
        let e = run(d2s.clone(), vec![iota(&[1, 3, 2, 2])]).unwrap_err();
        assert!(e.0.contains("not divisible by blocksize^2"), "{e}");
        let e = run(d2s, vec![iota(&[4, 2])]).unwrap_err();
        assert!(e.0.contains("must be 4-D"), "{e}");
    }

    #[test]
    fn col2im_sums_overlaps() {
        // 1-D image of 4, block 2, stride 1: 3 blocks; overlapping positions add.
        let x = Tensor::from_vec(&[1, 2, 3], vec![1.0f32, 1.0, 1.0, 1.0, 1.0, 1.0]).unwrap();
        let out = run(
            NodeDef::new("Col2Im", 18),
            vec![Some(x.clone()), i64s(&[4]), i64s(&[2])],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[1.0, 2.0, 2.0, 1.0]]].into_dyn())
        );
        let e = run(
            NodeDef::new("Col2Im", 18),
            vec![Some(x.clone()), i64s(&[5]), i64s(&[2])],
        )
        .unwrap_err();
        assert!(e.0.contains("must equal the number of blocks 4"), "{e}");
        let e = run(
            NodeDef::new("Col2Im", 18),
            vec![Some(x), i64s(&[4]), i64s(&[0])],
        )
        .unwrap_err();
        assert!(e.0.contains("block_shape must be positive"), "{e}");
    }
}
