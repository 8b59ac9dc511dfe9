//! Convolution: N-d Conv (1-D, 2-D, 3-D, ...) with group, strides, dilations, pads, auto_pad and
//! an optional bias, computed as im2col + a matrix product per (batch, group).

use std::sync::OnceLock;

use ndarray::{Array3, ArrayD, ArrayView2, ArrayViewD, Axis, IxDyn, s};

use crate::fast::FastKernels;
use crate::fast::geometry::Spatial;
use crate::kernel::{add, one};
use crate::ops::matmul::MatElem;
use crate::ops::util::args::{input, opt_input, typed_like};
use crate::ops::util::indexing::{c_strides, for_each_index};
use crate::ops::util::num::via_f32;
use crate::ops::util::spatial::{SpatialAttrs, kernel_dims};
use epx_plugin_api::ElementType;

use crate::kernel::{NodeDef, OpKernel, Registry};

use crate::error::{OpError, OpResult};

use crate::fast::chain::EwOp;
use crate::fast::post::PostOp;
use crate::kernel::add_ms;
use crate::ops::activation::Activation;
use crate::ops::activation::activate;
use crate::ops::activation::activation;
use crate::ops::activation::base_attrs;
use crate::tensor::{Tensor, TensorRef};
use crate::{bail, with_types};

pub fn register(reg: &mut Registry) {
    add(reg, "Conv", 1, build_conv);
    add_ms(reg, "FusedConv", build_fused_conv);
}

/// A 1-D geometry as the 2-D one of height 1 (kernel height 1, no vertical stride or padding).
pub(crate) fn as_2d(geo: &Spatial) -> Spatial {
    let two = |unit: usize, v: &[usize]| vec![unit, v[0]];
    Spatial {
        kernel: two(1, &geo.kernel),
        strides: two(1, &geo.strides),
        dilations: two(1, &geo.dilations),
        pad_begin: two(0, &geo.pad_begin),
        pad_end: two(0, &geo.pad_end),
        out: two(1, &geo.out),
    }
}

/// A 2-D geometry with its two spatial axes exchanged: a convolution along the height of planes
/// one column wide (kernel width 1, no horizontal padding) reads and writes the same memory as
/// one along the width of planes one row high, which the 2-D kernels run along their rows.
pub(crate) fn transposed_2d(geo: &Spatial) -> Spatial {
    let swap = |v: &[usize]| vec![v[1], v[0]];
    Spatial {
        kernel: swap(&geo.kernel),
        strides: swap(&geo.strides),
        dilations: swap(&geo.dilations),
        pad_begin: swap(&geo.pad_begin),
        pad_end: swap(&geo.pad_end),
        out: swap(&geo.out),
    }
}

struct Conv {
    op: String,
    attrs: SpatialAttrs,
    group: usize,
    /// The Winograd transforms of constant 3×3 filters, made once at `prepare`.
    winograd: OnceLock<Vec<f32>>,
    /// Constant filters packed for the direct kernel, made once at `prepare`.
    direct: OnceLock<Vec<f32>>,
}

impl Conv {
    /// The convolution; `post` (when given) is applied to the output if the f32 2-D path runs,
    /// which the flag reports.
    fn run_typed<T: MatElem + FastKernels>(
        &self,
        x: &ArrayViewD<'_, T>,
        w: &ArrayViewD<'_, T>,
        b: Option<ArrayViewD<'_, T>>,
        post: Option<&mut dyn PostOp>,
    ) -> OpResult<(Tensor, bool)> {
        let op = &self.op;
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
        let (nb, c) = (xs[0], xs[1]);
        let (m, cg) = (ws[0], ws[1]);
        let g = self.group;
        if g == 0 || c != cg * g || m % g != 0 {
            bail!("{op}: X has {c} channels and W has shape {ws:?}, incompatible with group {g}");
        }
        let kernel: Vec<usize> = match &self.attrs.kernel_shape {
            Some(k) => {
                let k = kernel_dims(op, k)?;
                if k != ws[2..] {
                    bail!("{op}: kernel_shape {k:?} does not match W shape {ws:?}");
                }
                k
            }
            None => ws[2..].to_vec(),
        };
        if let Some(b) = &b
            && b.shape() != [m]
        {
            bail!("{op}: B must have shape [{m}], got {:?}", b.shape());
        }
        let in_sp = &xs[2..];
        let geo = self.attrs.resolve(op, in_sp, &kernel)?;
        geo.checked_output(&[xs[0], m])?;
        // 1-D and 2-D convolutions take the 2-D fast kernel: a 1-D one is a 2-D one of height 1
        // with a kernel of height 1, which reads and writes the same memory.
        let planar = match *in_sp {
            // Along the height of one-column planes: along the width of one-row ones.
            [h, 1] if h > 1 && kernel[1] == 1 && geo.pad_begin[1] == 0 && geo.pad_end[1] == 0 => {
                Some(((1, h), (1, kernel[0]), transposed_2d(&geo)))
            }
            [h, w_] => Some(((h, w_), (kernel[0], kernel[1]), geo.clone())),
            [w_] => Some(((1, w_), (1, kernel[0]), as_2d(&geo))),
            _ => None,
        };
        if let Some(((h, w_), (kh, kw), geo2)) = planar {
            let (xc, wc) = (x.as_standard_layout(), w.as_standard_layout());
            let bc = b.as_ref().map(|b| b.as_standard_layout());
            if let (Some(xf), Some(wf)) = (xc.as_slice(), wc.as_slice()) {
                let conv = crate::fast::conv2d::Conv2d {
                    n: nb,
                    c,
                    h,
                    w: w_,
                    m,
                    group: g,
                    kh,
                    kw,
                    geo: &geo2,
                    winograd: self.winograd.get().map(Vec::as_slice),
                    direct: self.direct.get().map(Vec::as_slice),
                };
                let bf = bc.as_ref().and_then(|b| b.as_slice());
                if let Some(done) = T::conv2d(&conv, xf, wf, bf, post) {
                    let (out, applied) = done.map_err(|e| OpError(format!("{op}: {}", e.0)))?;
                    let mut shape = vec![nb, m];
                    shape.extend_from_slice(&geo.out);
                    return ArrayD::from_shape_vec(IxDyn(&shape), out)
                        .map(|a| (Tensor::from(a), applied))
                        .map_err(|e| OpError(format!("{op}: {e}")));
                }
            }
        }
        let kn: usize = kernel.iter().product();
        let ln: usize = geo.out.iter().product();
        let mg = m / g;
        let rows = cg * kn;

        // For each spatial dim, kernel tap and output position: the input coordinate, if inside.
        let nd = in_sp.len();
        let coord: Vec<Vec<Option<usize>>> = (0..nd)
            .map(|d| {
                let mut v = Vec::with_capacity(kernel[d] * geo.out[d]);
                for k in 0..kernel[d] {
                    for o in 0..geo.out[d] {
                        let i = (o * geo.strides[d] + k * geo.dilations[d]) as i64
                            - geo.pad_begin[d] as i64;
                        v.push(usize::try_from(i).ok().filter(|&i| i < in_sp[d]));
                    }
                }
                v
            })
            .collect();
        let in_strides = c_strides(in_sp);
        let plane: usize = in_sp.iter().product();

        let xc = x.as_standard_layout();
        let xs_flat = xc
            .as_slice()
            .ok_or_else(|| OpError(format!("{op}: X is not contiguous")))?;
        let wc = w.as_standard_layout();
        let w2 = wc
            .view()
            .into_shape_with_order((m, rows))
            .map_err(|e| OpError(format!("{op}: {e}")))?;
        let mut out = Array3::from_elem((nb, m, ln), T::zero());
        let mut cols = ndarray::Array2::from_elem((rows, ln), T::zero());
        for n in 0..nb {
            for gi in 0..g {
                for ci in 0..cg {
                    let base = (n * c + gi * cg + ci) * plane;
                    let mut r = ci * kn;
                    for_each_index(&kernel, |kk| {
                        let mut row = cols.row_mut(r);
                        let mut l = 0;
                        for_each_index(&geo.out, |oo| {
                            let mut off = Some(base);
                            for d in 0..nd {
                                off = match (off, coord[d][kk[d] * geo.out[d] + oo[d]]) {
                                    (Some(o), Some(i)) => Some(o + i * in_strides[d]),
                                    _ => None,
                                };
                            }
                            if let Some(slot) = row.get_mut(l) {
                                *slot = off
                                    .and_then(|o| xs_flat.get(o).copied())
                                    .unwrap_or(T::zero());
                            }
                            l += 1;
                        });
                        r += 1;
                    });
                }
                let wg: ArrayView2<'_, T> = w2.slice(s![gi * mg..(gi + 1) * mg, ..]);
                let mut og = out.slice_mut(s![n, gi * mg..(gi + 1) * mg, ..]);
                T::gemm(T::one(), &wg, &cols.view(), T::zero(), &mut og);
            }
        }
        if let Some(b) = b {
            for (mut o, &bv) in out.axis_iter_mut(Axis(1)).zip(b.iter()) {
                o.mapv_inplace(|v| v.add(bv));
            }
        }
        let mut shape = vec![nb, m];
        shape.extend_from_slice(&geo.out);
        let out: ArrayD<T> = out
            .into_shape_with_order(IxDyn(&shape))
            .map_err(|e| OpError(format!("{op}: {e}")))?;
        Ok((out.into(), false))
    }

    /// The convolution of one node: f32 and f64 directly, f16/bf16 through f32.
    fn run_node(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        mut post: Option<&mut dyn PostOp>,
    ) -> OpResult<(Vec<Tensor>, bool)> {
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        let w = input(op, inputs, 1)?;
        let b = opt_input(inputs, 2);
        let half = inputs
            .iter()
            .flatten()
            .any(|t| matches!(t.elem_type(), ElementType::Float16 | ElementType::Bfloat16));
        if !half {
            let (t, applied) = with_types!(
                x.clone(),
                |xv| self.run_typed(
                    &xv,
                    &typed_like(op, w)?,
                    b.map(|b| typed_like(op, b)).transpose()?,
                    post.take(),
                ),
                [F32, F64],
                op
            )?;
            return Ok((vec![t], applied));
        }
        let out = via_f32(inputs, |inputs| {
            let x = input(op, inputs, 0)?;
            let w = input(op, inputs, 1)?;
            let b = opt_input(inputs, 2);
            one(with_types!(
                x.clone(),
                |xv| self
                    .run_typed(
                        &xv,
                        &typed_like(op, w)?,
                        b.map(|b| typed_like(op, b)).transpose()?,
                        None,
                    )
                    .map(|r| r.0),
                [F32, F64],
                op
            ))
        })?;
        Ok((out, false))
    }
}

impl OpKernel for Conv {
    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        // Constant f32 3×3 filters of a stride-1, undilated convolution with enough channels:
        // their Winograd transforms, made once (the fast kernel decides per run whether the
        // input's size takes that path).
        let Some(Some(w)) = constants.get(1) else {
            return;
        };
        let ones = |v: &Option<Vec<i64>>| v.as_ref().is_none_or(|v| v.iter().all(|&s| s == 1));
        let Ok(wv) = w.as_f32() else {
            return;
        };
        let (g, s) = (self.group, wv.shape());
        // Constant f32 filters of a stride-1 1-D or 2-D convolution with channels the direct
        // kernel takes: packed once for it (the kernel decides per run whether it runs).
        if ones(&self.attrs.strides)
            && (s.len() == 3 || s.len() == 4)
            && s[2..].iter().product::<usize>() > 1
            && g > 0
            && s[0] % g == 0
            && crate::fast::direct::channels_fit(s[1], s[0] / g)
        {
            let wc = wv.as_standard_layout();
            if let Some(ws) = wc.as_slice() {
                let taps = s[1] * s[2..].iter().product::<usize>();
                let _ = (self.direct).set(crate::fast::direct::pack_weights(ws, s[0], taps, g));
            }
        }
        if !ones(&self.attrs.strides)
            || !ones(&self.attrs.dilations)
            || s.len() != 4
            || s[2..] != [3, 3]
            || g == 0
            || s[0] % g != 0
            || !crate::fast::winograd::channels_suffice(s[1], s[0] / g)
        {
            return;
        }
        let wc = wv.as_standard_layout();
        if let Some(ws) = wc.as_slice() {
            let _ =
                (self.winograd).set(crate::fast::winograd::transform_weights(ws, s[0], s[1], g));
        }
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        self.run_node(inputs, None).map(|r| r.0)
    }

    fn run_with_post(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        post: &mut dyn PostOp,
    ) -> OpResult<(Vec<Tensor>, bool)> {
        self.run_node(inputs, Some(post))
    }
}

fn build_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let group = n.attr_int_or("group", 1)?;
    let conv = Conv {
        op: n.op_type.clone(),
        attrs: SpatialAttrs::parse(n)?,
        group: usize::try_from(group)
            .map_err(|_| n.error(format_args!("invalid group {group}")))?,
        winograd: OnceLock::new(),
        direct: OnceLock::new(),
    };
    Ok(Box::new(conv))
}

/// `act(Conv(X, W, B) + Z)`.
struct FusedConv {
    op: String,
    conv: Box<dyn OpKernel>,
    add: Box<dyn OpKernel>,
    act: Option<EwOp>,
}

impl OpKernel for FusedConv {
    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        self.conv.prepare(&constants[..constants.len().min(3)]);
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let conv_inputs = &inputs[..inputs.len().min(3)];
        let z = opt_input(inputs, 3);
        let mut outs = match (self.act, z) {
            (Some(act), None) => {
                let mut post = Activation(act);
                let (mut outs, applied) = self.conv.run_with_post(conv_inputs, &mut post)?;
                if !applied {
                    activate(&self.op, act, &mut outs)?;
                }
                return Ok(outs);
            }
            _ => self.conv.run(conv_inputs)?,
        };
        if let Some(z) = z {
            let y = outs
                .first()
                .ok_or_else(|| OpError(format!("{}: no output", self.op)))?;
            let sum = self.add.run(&[Some(y.view()), Some(z.reborrow())])?;
            outs = sum;
        }
        if let Some(act) = self.act {
            activate(&self.op, act, &mut outs)?;
        }
        Ok(outs)
    }
}

fn build_fused_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(Box::new(FusedConv {
        op: n.op_type.clone(),
        conv: crate::kernel::build_part(n, "Conv", 11, base_attrs(n), n.num_inputs.min(3), 1)?,
        add: crate::kernel::build_part(n, "Add", 14, Vec::new(), 2, 1)?,
        act: activation(n)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::ops::testing::{close_within, f32s, ms, run_some};
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

    #[test]
    fn conv2d_pads_strides_bias() {
        // ONNX test_basic_conv_with_padding: 5x5 iota, 3x3 ones, pads 1.
        let x = iota(&[1, 1, 5, 5]);
        let w = Tensor::F32(ArrayD::from_elem(IxDyn(&[1, 1, 3, 3]), 1.0));
        let n = NodeDef::new("Conv", 11).with_attr("pads", AttrValue::Ints(vec![1, 1, 1, 1]));
        let out = run(n, vec![x.clone(), w.clone()]).unwrap();
        let o = out[0].as_array::<f32>().unwrap();
        assert_eq!(o.shape(), &[1, 1, 5, 5]);
        assert_eq!(o[[0, 0, 0, 0]], 12.0);
        assert_eq!(o[[0, 0, 2, 2]], 108.0);
        assert_eq!(o[[0, 0, 4, 4]], 84.0);
        assert_eq!(o[[0, 0, 4, 0]], 72.0);
        let n = NodeDef::new("Conv", 11)
            .with_attr("strides", AttrValue::Ints(vec![2, 2]))
            .with_attr("auto_pad", AttrValue::String(b"VALID".to_vec()));
        let out = run(n, vec![x, w, Tensor::F32(array![1.0].into_dyn())]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[[55.0, 73.0], [145.0, 163.0]]]].into_dyn())
        );
    }

    #[test]
    fn conv1d_group_dilation_and_3d() {
        // 2 channels, group 2, dilation 2: each channel convolved with its own [1, 1] kernel.
        let x = iota(&[1, 2, 5]);
        let w = Tensor::F32(array![[[1.0, 1.0]], [[1.0, -1.0]]].into_dyn());
        let n = NodeDef::new("Conv", 11)
            .with_attr("group", AttrValue::Int(2))
            .with_attr("dilations", AttrValue::Ints(vec![2]));
        let out = run(n, vec![x, w]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[[2.0, 4.0, 6.0], [-2.0, -2.0, -2.0]]].into_dyn())
        );
        let x3 = iota(&[1, 1, 2, 2, 2]);
        let w3 = Tensor::F32(ArrayD::from_elem(IxDyn(&[2, 1, 2, 2, 2]), 1.0));
        let out = run(NodeDef::new("Conv", 11), vec![x3, w3]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(ArrayD::from_elem(IxDyn(&[1, 2, 1, 1, 1]), 28.0))
        );
    }

    #[test]
    fn conv_same_upper_f64() {
        let x = Tensor::F64(ArrayD::from_elem(IxDyn(&[1, 1, 4]), 1.0));
        let w = Tensor::F64(ArrayD::from_elem(IxDyn(&[1, 1, 3]), 1.0));
        let n = NodeDef::new("Conv", 11)
            .with_attr("auto_pad", AttrValue::String(b"SAME_UPPER".to_vec()))
            .with_attr("strides", AttrValue::Ints(vec![2]));
        let out = run(n, vec![x, w]).unwrap();
        // out = ceil(4/2) = 2; total pad 1 -> end. Windows [0,1,2], [2,3,pad].
        assert_eq!(out[0], Tensor::F64(array![[[3.0, 2.0]]].into_dyn()));
    }

    #[test]
    fn conv_errors() {
        let x = iota(&[1, 3, 4, 4]);
        let w = Tensor::F32(ArrayD::zeros(IxDyn(&[2, 2, 3, 3])));
        let e = run(NodeDef::new("Conv", 11), vec![x.clone(), w]).unwrap_err();
        assert!(
            e.0.contains("Conv: X has 3 channels and W has shape [2, 2, 3, 3]"),
            "{e}"
        );
        let e = run(NodeDef::new("Conv", 11), vec![iota(&[4, 4]), iota(&[1, 1])]).unwrap_err();
        assert!(e.0.contains("X must have rank >= 3"), "{e}");
        let w = Tensor::F32(ArrayD::zeros(IxDyn(&[1, 3, 5, 5])));
        let e = run(NodeDef::new("Conv", 11), vec![iota(&[1, 3, 4, 4]), w]).unwrap_err();
        assert!(e.0.contains("larger than the padded input"), "{e}");
        let e = run(
            NodeDef::new("Conv", 11),
            vec![
                Tensor::I32(ArrayD::zeros(IxDyn(&[1, 1, 1]))),
                Tensor::I32(ArrayD::zeros(IxDyn(&[1, 1, 1]))),
            ],
        )
        .unwrap_err();
        assert_eq!(e.0, "Conv: unsupported element type int32");
    }

    #[test]
    fn conv_with_no_output_channels_is_empty() {
        let w = Tensor::F32(ArrayD::zeros(IxDyn(&[0, 3, 3, 3])));
        let out = run(NodeDef::new("Conv", 11), vec![iota(&[1, 3, 4, 4]), w]).unwrap();
        assert_eq!(out[0].shape(), [1, 0, 2, 2]);
    }

    /// `n` values in [-1, 1) from a fixed seed, the same on every machine.
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn f64_copy(t: &Tensor) -> Tensor {
        Tensor::F64(t.as_array::<f32>().unwrap().mapv(f64::from))
    }

    /// Runs `node` on f32 inputs (the fast kernels, for 2-D) and on the same values as f64 (the
    /// reference kernel), and returns the largest difference.
    fn fast_vs_reference(node: &NodeDef, inputs: &[Tensor]) -> f64 {
        let fast = run(node.clone(), inputs.to_vec()).expect("f32 run");
        let reference = run(node.clone(), inputs.iter().map(f64_copy).collect()).expect("f64 run");
        let (a, b) = (
            fast[0].as_array::<f32>().unwrap(),
            reference[0].as_array::<f64>().unwrap(),
        );
        assert_eq!(a.shape(), b.shape(), "{node:?}");
        a.iter()
            .zip(b.iter())
            .map(|(&x, &y)| (f64::from(x) - y).abs())
            .fold(0.0, f64::max)
    }

    /// Conv and ConvTranspose shapes that take each branch of the 2-D fast kernels: 1x1,
    /// depthwise, grouped, strided, dilated, padded, odd sizes, with and without bias.
    #[test]
    fn the_fast_2d_convolutions_match_the_reference_on_every_instruction_set() {
        struct Case {
            x: [usize; 4],
            w: [usize; 4],
            group: i64,
            strides: [i64; 2],
            dilations: [i64; 2],
            pads: [i64; 4],
            bias: bool,
        }
        let case = |x, w, group, strides, dilations, pads, bias| Case {
            x,
            w,
            group,
            strides,
            dilations,
            pads,
            bias,
        };
        let convs = [
            case([1, 3, 8, 8], [4, 3, 1, 1], 1, [1, 1], [1, 1], [0; 4], true),
            // Along the height of one-column planes (run as one-row planes): depthwise, strided,
            // dilated, padded at both ends; and a dense one.
            case(
                [1, 6, 23, 1],
                [6, 1, 5, 1],
                6,
                [2, 1],
                [2, 1],
                [1, 0, 3, 0],
                true,
            ),
            case(
                [2, 3, 17, 1],
                [4, 3, 4, 1],
                1,
                [1, 1],
                [1, 1],
                [2, 0, 1, 0],
                false,
            ),
            case(
                [2, 3, 9, 7],
                [5, 3, 3, 3],
                1,
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                true,
            ),
            case(
                [1, 8, 10, 10],
                [8, 1, 3, 3],
                8,
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
            ),
            case(
                [1, 6, 11, 9],
                [4, 3, 3, 2],
                2,
                [2, 1],
                [2, 1],
                [0, 1, 2, 0],
                true,
            ),
            case(
                [1, 16, 14, 14],
                [32, 16, 3, 3],
                1,
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                true,
            ),
            // 3×3 at stride 1 with channels and tiles enough for Winograd's F(2×2, 3×3), padded
            // on one side of each axis.
            case(
                [1, 32, 33, 32],
                [48, 32, 3, 3],
                1,
                [1, 1],
                [1, 1],
                [0, 1, 1, 0],
                true,
            ),
            case([1, 4, 5, 5], [2, 4, 5, 5], 1, [1, 1], [1, 1], [0; 4], false),
            // The direct kernel ([`crate::fast::direct`]): two images and groups, output
            // channels that fill no whole block (5, 12), dilation, asymmetric and one-sided
            // padding, even kernels, a one-channel input, planes whose rows are not a whole
            // number of vectors.
            case(
                [2, 6, 9, 13],
                [10, 3, 3, 3],
                2,
                [1, 1],
                [2, 1],
                [2, 1, 0, 3],
                true,
            ),
            case(
                [1, 5, 7, 5],
                [12, 5, 2, 4],
                1,
                [1, 1],
                [1, 1],
                [0, 1, 1, 2],
                false,
            ),
            case(
                [1, 1, 28, 28],
                [8, 1, 3, 3],
                1,
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                true,
            ),
            case(
                [1, 8, 14, 14],
                [16, 8, 3, 3],
                1,
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                true,
            ),
            // Depthwise with column stride 2: even and odd begin pads, odd widths, dilation.
            case(
                [1, 4, 9, 11],
                [4, 1, 3, 3],
                4,
                [2, 2],
                [1, 1],
                [0, 0, 1, 1],
                true,
            ),
            case(
                [1, 3, 7, 10],
                [3, 1, 2, 3],
                3,
                [1, 2],
                [1, 2],
                [2, 3, 0, 1],
                false,
            ),
            case(
                [1, 2, 13, 3],
                [3, 2, 1, 3],
                1,
                [3, 1],
                [1, 1],
                [0, 1, 0, 1],
                true,
            ),
            // A few outputs a plane (the taps gathered output by output): padding, stride and
            // dilation in both axes, groups.
            case(
                [1, 5, 3, 4],
                [4, 5, 3, 3],
                1,
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                true,
            ),
            case(
                [2, 4, 4, 5],
                [6, 2, 2, 3],
                2,
                [3, 2],
                [2, 1],
                [1, 0, 0, 2],
                false,
            ),
            // 2 × 2 at stride 2: the transposed one is an upsampling whose two taps a row
            // interleave; tall enough for its columns to come in two bands of rows.
            case(
                [1, 4, 50, 64],
                [6, 4, 2, 2],
                1,
                [2, 2],
                [1, 1],
                [0; 4],
                true,
            ),
            // Depthwise 5 × 5 over planes of two and three rows (text-line models' late
            // layers): kernel rows over padding alone are skipped.
            case(
                [1, 6, 2, 37],
                [6, 1, 5, 5],
                6,
                [1, 1],
                [1, 1],
                [2, 2, 2, 2],
                true,
            ),
            case(
                [1, 5, 3, 20],
                [5, 1, 5, 5],
                5,
                [1, 1],
                [1, 1],
                [2, 2, 2, 2],
                false,
            ),
        ];
        let mut checked = Vec::new();
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            let ran = crate::fast::with_isa(isa, || {
                for (i, c) in convs.iter().enumerate() {
                    let nx: usize = c.x.iter().product();
                    let nw: usize = c.w.iter().product();
                    let x = Tensor::from_vec(&c.x, noise(nx, 2 * i as u64)).unwrap();
                    let w = Tensor::from_vec(&c.w, noise(nw, 2 * i as u64 + 1)).unwrap();
                    let mut inputs = vec![x.clone(), w];
                    if c.bias {
                        inputs.push(Tensor::from_vec(&[c.w[0]], noise(c.w[0], 99)).unwrap());
                    }
                    let conv = NodeDef::new("Conv", 11)
                        .with_attr("group", AttrValue::Int(c.group))
                        .with_attr("strides", AttrValue::Ints(c.strides.to_vec()))
                        .with_attr("dilations", AttrValue::Ints(c.dilations.to_vec()))
                        .with_attr("pads", AttrValue::Ints(c.pads.to_vec()));
                    let d = fast_vs_reference(&conv, &inputs);
                    assert!(d < 1e-4, "Conv case {i} on {}: differs by {d}", isa.name);

                    // The transposed convolution of the same geometry: W is [C, M/group, kh, kw].
                    let wt = [c.x[1], c.w[0] / c.group as usize, c.w[2], c.w[3]];
                    let nwt: usize = wt.iter().product();
                    let mut inputs = vec![
                        Tensor::from_vec(
                            &[c.x[0], c.x[1], c.x[2], c.x[3]],
                            noise(nx, 7 + i as u64),
                        )
                        .unwrap(),
                        Tensor::from_vec(&wt, noise(nwt, 11 + i as u64)).unwrap(),
                    ];
                    if c.bias {
                        let m = wt[1] * c.group as usize;
                        inputs.push(Tensor::from_vec(&[m], noise(m, 5)).unwrap());
                    }
                    let transpose = NodeDef::new("ConvTranspose", 11)
                        .with_attr("group", AttrValue::Int(c.group))
                        .with_attr("strides", AttrValue::Ints(c.strides.to_vec()))
                        .with_attr("dilations", AttrValue::Ints(c.dilations.to_vec()))
                        .with_attr("pads", AttrValue::Ints(c.pads.to_vec()));
                    let d = fast_vs_reference(&transpose, &inputs);
                    assert!(
                        d < 1e-4,
                        "ConvTranspose case {i} on {}: differs by {d}",
                        isa.name
                    );
                }
            });
            match ran {
                Some(()) => checked.push(isa.name),
                None => eprintln!("{}: not checked, this CPU lacks its features", isa.name),
            }
        }
        eprintln!("fast convolutions checked on: {}", checked.join(", "));

        // 1-D convolutions run on the same kernel as 2-D ones of height 1: wide kernels,
        // strides, dilations, groups, asymmetric pads.
        // (X shape, W shape, group, stride, dilation, pads)
        type Case1d = ([usize; 3], [usize; 3], i64, i64, i64, [i64; 2]);
        // The last two have planes of a few outputs ([`crate::fast::dots`]).
        let convs_1d: [Case1d; 8] = [
            ([1, 4, 64], [8, 4, 9], 1, 1, 1, [4, 4]),
            ([2, 6, 33], [6, 1, 5], 6, 2, 1, [2, 1]),
            ([1, 8, 50], [4, 4, 3], 2, 1, 3, [0, 3]),
            ([1, 16, 200], [32, 16, 31], 1, 4, 1, [15, 15]),
            ([1, 3, 7], [5, 3, 1], 1, 1, 1, [0, 0]),
            ([3, 2, 19], [2, 2, 4], 1, 3, 2, [1, 2]),
            ([1, 65, 4], [128, 65, 3], 1, 1, 1, [1, 1]),
            ([2, 8, 6], [6, 4, 3], 2, 2, 1, [1, 1]),
        ];
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            crate::fast::with_isa(isa, || {
                for (i, (xs, ws, group, stride, dilation, pads)) in convs_1d.iter().enumerate() {
                    let nx: usize = xs.iter().product();
                    let nw: usize = ws.iter().product();
                    let inputs = vec![
                        Tensor::from_vec(xs, noise(nx, 40 + i as u64)).unwrap(),
                        Tensor::from_vec(ws, noise(nw, 50 + i as u64)).unwrap(),
                        Tensor::from_vec(&[ws[0]], noise(ws[0], 60 + i as u64)).unwrap(),
                    ];
                    let conv = NodeDef::new("Conv", 11)
                        .with_attr("group", AttrValue::Int(*group))
                        .with_attr("strides", AttrValue::Ints(vec![*stride]))
                        .with_attr("dilations", AttrValue::Ints(vec![*dilation]))
                        .with_attr("pads", AttrValue::Ints(pads.to_vec()));
                    let d = fast_vs_reference(&conv, &inputs);
                    assert!(
                        d < 1e-4,
                        "1-D Conv case {i} on {}: differs by {d}",
                        isa.name
                    );
                }
            });
        }
        // The reference level takes no fast kernel.
        let reference = crate::fast::ISAS
            .iter()
            .find(|i| !i.fast)
            .expect("a reference level");
        let geo = crate::fast::geometry::Spatial {
            kernel: vec![1, 1],
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pad_begin: vec![0, 0],
            pad_end: vec![0, 0],
            out: vec![1, 1],
        };
        let conv = crate::fast::conv2d::Conv2d {
            n: 1,
            c: 1,
            h: 1,
            w: 1,
            m: 1,
            group: 1,
            kh: 1,
            kw: 1,
            geo: &geo,
            winograd: None,
            direct: None,
        };
        let fast = crate::fast::with_isa(reference, || {
            <f32 as FastKernels>::conv2d(&conv, &[1.0], &[2.0], None, None)
        });
        assert_eq!(fast, Some(None), "the reference level ran a fast kernel");
        let portable = crate::fast::ISAS.iter().find(|i| i.key == "portable");
        assert!(
            portable.is_some_and(|p| checked.contains(&p.name)),
            "the portable level always runs"
        );
    }

    /// Constant filters of a stride-1 convolution are prepared once, at `prepare`: transformed
    /// for the Winograd kernel (3×3, many channels) or packed for the direct one (few
    /// channels); the answers are the same bits as with the filters prepared per run, alone
    /// and under FusedConv, and a convolution neither kernel takes (stride 2) is unchanged by
    /// `prepare`.
    #[test]
    fn prepared_filters_give_the_same_bits() {
        // (X shape, W shape): Winograd's, then the direct kernel's.
        let shapes = [
            ([1, 32, 32, 30], [40, 32, 3, 3]),
            ([2, 6, 15, 11], [12, 6, 3, 3]),
        ];
        for (s, (xs, ws)) in shapes.iter().enumerate() {
            let nx: usize = xs.iter().product();
            let nw: usize = ws.iter().product();
            let x = Tensor::from_vec(xs, noise(nx, 5)).unwrap();
            let w = Tensor::from_vec(ws, noise(nw, 6)).unwrap();
            let b = Tensor::from_vec(&[ws[0]], noise(ws[0], 7)).unwrap();
            for (op, strides) in [("Conv", 1), ("FusedConv", 1), ("Conv", 2)] {
                let n = if op == "FusedConv" {
                    ms(op).with_attr("activation", AttrValue::String(b"Relu".to_vec()))
                } else {
                    NodeDef::new(op, 11)
                };
                let n = n
                    .with_attr("pads", AttrValue::Ints(vec![1, 1, 1, 1]))
                    .with_attr("strides", AttrValue::Ints(vec![strides, strides]))
                    .with_io(3, 1);
                let refs = [Some(x.view()), Some(w.view()), Some(b.view())];
                let per_run = crate::ops::registry().build(&n).unwrap();
                let prepared = crate::ops::registry().build(&n).unwrap();
                prepared.prepare(&[None, Some(w.view()), Some(b.view())]);
                let (a, p) = (per_run.run(&refs).unwrap(), prepared.run(&refs).unwrap());
                let (a, p) = (
                    a[0].as_array::<f32>().unwrap().to_owned(),
                    p[0].as_array::<f32>().unwrap().to_owned(),
                );
                assert_eq!(a.shape(), p.shape());
                assert!(
                    a.iter()
                        .zip(p.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "shape {s}: {op} stride {strides}"
                );
            }
        }
    }

    /// FusedConv's sum and activation on the direct kernel's output: each block of output
    /// planes (two images, two blocks of channels, one part-filled) gets the Z elements at its
    /// own offsets; the answer is Relu(Conv(X, W, B) + Z) bit for bit.
    #[test]
    fn fused_conv_sums_each_direct_block_at_its_offset() {
        let (xs, ws) = ([2, 3, 10, 9], [13, 3, 3, 3]);
        let nx: usize = xs.iter().product();
        let nw: usize = ws.iter().product();
        let x = Tensor::from_vec(&xs, noise(nx, 21)).unwrap();
        let w = Tensor::from_vec(&ws, noise(nw, 22)).unwrap();
        let b = Tensor::from_vec(&[13], noise(13, 23)).unwrap();
        let z = Tensor::from_vec(&[2, 13, 10, 9], noise(2 * 13 * 90, 24)).unwrap();
        let pads = AttrValue::Ints(vec![1, 1, 1, 1]);
        let conv = run(
            NodeDef::new("Conv", 11).with_attr("pads", pads.clone()),
            vec![x.clone(), w.clone(), b.clone()],
        )
        .unwrap();
        let fused = run_some(
            ms("FusedConv")
                .with_attr("activation", AttrValue::String(b"Relu".to_vec()))
                .with_attr("pads", pads),
            vec![Some(x), Some(w), Some(b), Some(z.clone())],
        );
        let (c, z, f) = (
            conv[0].as_array::<f32>().unwrap(),
            z.as_array::<f32>().unwrap(),
            &fused[0],
        );
        assert_eq!(c.len(), f.len());
        for ((&c, &z), &f) in c.iter().zip(z.iter()).zip(f) {
            assert_eq!((c + z).max(0.0).to_bits(), f.to_bits());
        }
    }

    #[test]
    fn fused_conv_with_sum_and_activation() {
        // 1x1 convolution of a 1-channel 2x2 image by weight 2, bias 1, plus Z, LeakyRelu(0.1).
        let n = ms("FusedConv")
            .with_attr("activation", AttrValue::String(b"LeakyRelu".to_vec()))
            .with_attr("activation_params", AttrValue::Floats(vec![0.1]));
        let x = f32s(&[1, 1, 2, 2], &[1.0, -2.0, 3.0, -4.0]);
        let w = f32s(&[1, 1, 1, 1], &[2.0]);
        let b = f32s(&[1], &[1.0]);
        let z = f32s(&[1, 1, 2, 2], &[0.0, 1.0, -10.0, 0.0]);
        let y = run_some(
            n.clone(),
            vec![Some(x.clone()), Some(w.clone()), Some(b.clone()), Some(z)],
        );
        close_within(&y[0], &[3.0, -0.2, -0.3, -0.7], 1e-6);
        let y = run_some(n, vec![Some(x), Some(w), Some(b)]);
        close_within(&y[0], &[3.0, -0.3, 7.0, -0.7], 1e-6);
        let bad = ms("FusedConv").with_attr("activation", AttrValue::String(b"Swish".to_vec()));
        let err = crate::ops::registry()
            .build(&bad.with_io(2, 1))
            .err()
            .expect("an unknown activation is refused");
        assert!(err.0.contains("activation `Swish` is not one of"), "{err}");
    }
}
