//! The 8-bit fast paths of the integer products: MatMul ([`FastQMatMul`]) and convolution
//! ([`FastQConv`]) on the integer GEMM of [`crate::fast::qgemm`]. Each owns its packed weights:
//! packed once at [`crate::kernel::OpKernel::prepare`] when the weights (and their zero points)
//! are constants of the program, else packed for the run.

use crate::error::OpResult;
use crate::fast::conv2d::Conv2d;
use crate::fast::qconv::{self, PackedConv};
use crate::fast::qgemm::Sums;
use crate::fast::qmatmul::{self, PackedB};
use crate::kernel::{NodeDef, OpKernel};
use crate::ops::conv::as_2d;
use crate::ops::util::indexing::contiguous;
use crate::ops::util::spatial::{SpatialAttrs, kernel_dims};
use crate::tensor::{Tensor, TensorRef};
use epx_plugin_api::ElementType;
use std::sync::{Arc, OnceLock};

/// The 8-bit matrix product fast path of MatMulInteger and QLinearMatMul
/// ([`crate::fast::qmatmul`]): `B` two-dimensional (packed once while it stays the same), or
/// with the batch dimensions of `A` (packed per batch).
#[derive(Default)]
pub(crate) struct FastQMatMul {
    packs: Packs<PackedB>,
}

impl FastQMatMul {
    /// Packs `b` when it is one matrix (no batch of several), with its zero points `bzp`
    /// (absent or not constant: packed for 0, and used only when the run's are that too).
    fn prepare(&self, b: &TensorRef<'_>, bzp: Option<&TensorRef<'_>>) {
        let sb = b.shape();
        if sb.len() < 2 || sb[..sb.len() - 2].iter().product::<usize>() != 1 {
            return;
        }
        let (k, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        let Some(zb) = zero_points(bzp, b.elem_type()) else {
            return;
        };
        if zb.len() != 1 && (zb.len() != n || bzp.is_some_and(|z| z.ndim() != 1)) {
            return;
        }
        let Some((bb, b_signed)) = bytes_of(b) else {
            return;
        };
        self.packs
            .prepare(zb.clone(), [k, n, usize::from(b_signed), 0], || {
                PackedB::new(&bb, b_signed, (k, n), &zb)
            });
    }

    /// `A · B` with their zero points into `out`, with the output shape; `None` where the
    /// fast path does not apply and the general path runs.
    pub(crate) fn run(
        &self,
        (a, azp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        (b, bzp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        out: &qmatmul::Output<'_>,
    ) -> Option<(Vec<usize>, qconv::Result)> {
        if !crate::fast::enabled() {
            return None;
        }
        let (sa, sb) = (a.shape(), b.shape());
        if sa.len() < 2 || sb.len() < 2 {
            return None;
        }
        let (k, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if sa[sa.len() - 1] != k || (sb.len() > 2 && sb[..sb.len() - 2] != sa[..sa.len() - 2]) {
            return None;
        }
        let [za] = zero_points(azp, a.elem_type())?[..] else {
            return None;
        };
        let zb = zero_points(bzp, b.elem_type())?;
        if zb.len() != 1 && (zb.len() != n || bzp.is_some_and(|z| z.ndim() != 1)) {
            return None;
        }
        let (ab, a_signed) = bytes_of(a)?;
        let (bb, b_signed) = bytes_of(b)?;
        let mut shape = sa.to_vec();
        *shape.last_mut()? = n;
        let rows: usize = sa[..sa.len() - 1].iter().product();
        let batches = if sb.len() > 2 {
            sb[..sb.len() - 2].iter().product()
        } else {
            1
        };
        // Over the size limit: the reference path reports it.
        crate::limits::checked_len(&[rows, n], 4).ok()?;
        let mut bytes = Vec::new();
        let mut ints = Vec::new();
        match out {
            qmatmul::Output::Int32 => ints = vec![0i32; rows * n],
            // Memory that is not there: the reference path reports it.
            qmatmul::Output::Bytes { .. } => bytes = crate::scratch::zeros(rows * n).ok()?,
        }
        let per = rows / batches.max(1);
        for i in 0..batches {
            let packed = if batches == 1 {
                self.packs.get(&zb, [k, n, usize::from(b_signed), 0], || {
                    PackedB::new(&bb, b_signed, (k, n), &zb)
                })?
            } else {
                Arc::new(PackedB::new(
                    &bb[i * k * n..][..k * n],
                    b_signed,
                    (k, n),
                    &zb,
                )?)
            };
            let dst = match out {
                qmatmul::Output::Int32 => qmatmul::Dst::Int32(&mut ints[i * per * n..][..per * n]),
                qmatmul::Output::Bytes { .. } => {
                    qmatmul::Dst::Bytes(&mut bytes[i * per * n..][..per * n])
                }
            };
            qmatmul::run(
                &ab[i * per * k..][..per * k],
                a_signed,
                za,
                &packed,
                out,
                dst,
            )?;
        }
        Some((
            shape,
            match out {
                qmatmul::Output::Int32 => qconv::Result::Int32(ints),
                qmatmul::Output::Bytes { .. } => qconv::Result::Bytes(bytes),
            },
        ))
    }
}

/// The bytes of an 8-bit tensor (int8 as its bits), with whether it is signed; `None` for
/// other types.
fn bytes_of<'a>(t: &'a TensorRef<'_>) -> Option<(std::borrow::Cow<'a, [u8]>, bool)> {
    match t {
        TensorRef::U8(a) => Some((contiguous(a), false)),
        TensorRef::I8(a) => Some((
            match contiguous(a) {
                std::borrow::Cow::Borrowed(s) => {
                    std::borrow::Cow::Borrowed(bytemuck::cast_slice::<i8, u8>(s))
                }
                std::borrow::Cow::Owned(v) => {
                    std::borrow::Cow::Owned(v.into_iter().map(|b| b as u8).collect())
                }
            },
            true,
        )),
        _ => None,
    }
}

/// The zero points of an 8-bit tensor of type `ty` (0 when absent); `None` when `zp` has
/// another type.
pub(crate) fn zero_points(zp: Option<&TensorRef<'_>>, ty: ElementType) -> Option<Vec<i32>> {
    match zp {
        None => Some(vec![0]),
        Some(z) if z.elem_type() == ty => match z {
            TensorRef::U8(z) => Some(z.iter().map(|&v| i32::from(v)).collect()),
            TensorRef::I8(z) => Some(z.iter().map(|&v| i32::from(v)).collect()),
            _ => None,
        },
        Some(_) => None,
    }
}

/// Weights packed once, at [`OpKernel::prepare`], from one of the program's constants: the
/// dimensions and zero points they were packed for travel with them, and a run whose own differ
/// packs its weights for itself.
struct Prepared<T> {
    dims: [usize; 4],
    zw: Vec<i32>,
    packed: Arc<T>,
}

/// The packed weights a fast path owns: set at most once, at prepare, and read without a lock.
struct Packs<T> {
    prepared: OnceLock<Prepared<T>>,
}

impl<T> Default for Packs<T> {
    fn default() -> Self {
        Packs {
            prepared: OnceLock::new(),
        }
    }
}

impl<T> Packs<T> {
    /// Packs constant weights with `make` for zero points `zw` and dimensions `dims`.
    fn prepare(&self, zw: Vec<i32>, dims: [usize; 4], make: impl FnOnce() -> Option<T>) {
        if self.prepared.get().is_none()
            && let Some(packed) = make()
        {
            let _ = self.prepared.set(Prepared {
                dims,
                zw,
                packed: Arc::new(packed),
            });
        }
    }

    /// The weights of this run packed: the prepared ones when they were packed for `zw` and
    /// `dims` (the weights input is a constant: the same bytes on every run), else packed
    /// now with `make`.
    fn get(
        &self,
        zw: &[i32],
        dims: [usize; 4],
        make: impl FnOnce() -> Option<T>,
    ) -> Option<Arc<T>> {
        match self.prepared.get() {
            Some(p) if p.dims == dims && p.zw == zw => Some(p.packed.clone()),
            _ => make().map(Arc::new),
        }
    }
}

/// What a fast path packs from the weights input of its node, when that input is a constant.
pub(crate) trait PacksWeights: Send + Sync {
    /// Packs weights `w` with zero points `zw` (absent, or not a constant: `None`).
    fn prepare(&self, w: &TensorRef<'_>, zw: Option<&TensorRef<'_>>);
}

impl PacksWeights for FastQMatMul {
    fn prepare(&self, w: &TensorRef<'_>, zw: Option<&TensorRef<'_>>) {
        FastQMatMul::prepare(self, w, zw);
    }
}

impl PacksWeights for FastQConv {
    fn prepare(&self, w: &TensorRef<'_>, zw: Option<&TensorRef<'_>>) {
        FastQConv::prepare(self, w, zw);
    }
}

/// An integer-product kernel whose fast path packs its weights (input `weights`, zero points
/// input `zero_point`) once, when the program is compiled and they are constants.
pub(crate) struct WithPackedWeights<P> {
    pub(crate) inner: Box<dyn OpKernel>,
    pub(crate) fast: Arc<P>,
    pub(crate) weights: usize,
    pub(crate) zero_point: usize,
}

impl<P: PacksWeights> OpKernel for WithPackedWeights<P> {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        self.inner.run(inputs)
    }

    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        if let Some(Some(w)) = constants.get(self.weights) {
            let zw = constants.get(self.zero_point).and_then(Option::as_ref);
            self.fast.prepare(w, zw);
        }
    }
}

/// How a convolution's weights are packed.
struct Layout {
    m: usize,
    depth: usize,
    group: usize,
    taps: usize,
    depthwise: bool,
    quad_taps: Option<usize>,
    sums: Sums,
}

impl Layout {
    fn pack(&self, w: &[u8], signed: bool, zw: &[i32]) -> Option<PackedConv> {
        PackedConv::new(
            w,
            signed,
            (self.m, self.depth, self.group),
            self.taps,
            self.quad_taps,
            self.depthwise,
            zw,
            self.sums,
        )
    }
}

/// The 8-bit convolution fast path of ConvInteger and QLinearConv ([`crate::fast::qconv`]).
pub(crate) struct FastQConv {
    attrs: SpatialAttrs,
    group: usize,
    /// Unsigned activations by signed weights are summed as ONNX Runtime's kernels sum them at
    /// this level ([`Sums::like_onnxruntime`]): QLinearConv. ConvInteger's are exact at every
    /// level (ONNX Runtime's GEMM takes its weights as the left operand there, in kernels that
    /// widen to 16 bits).
    follows_level: bool,
    packs: Packs<PackedConv>,
}

impl FastQConv {
    pub(crate) fn new(n: &NodeDef) -> OpResult<Self> {
        let group = n.attr_int_or("group", 1)?;
        Ok(FastQConv {
            attrs: SpatialAttrs::parse(n)?,
            group: usize::try_from(group).unwrap_or(0),
            follows_level: n.op_type == "QLinearConv",
            packs: Packs::default(),
        })
    }

    /// How weights of shape `ws` are packed: `(m, depth, group, depthwise, quad_taps)` and the
    /// key the packing is kept under; `None` where the fast path does not apply.
    fn layout(&self, ws: &[usize], signed: bool, zw: usize) -> Option<(Layout, [usize; 4])> {
        if !matches!(ws.len(), 3 | 4) {
            return None;
        }
        let (m, cg, g) = (ws[0], ws[1], self.group);
        if g == 0 || m % g != 0 || (zw != 1 && zw != m) {
            return None;
        }
        let taps: usize = ws[2..].iter().product();
        let depth = cg * taps;
        let depthwise = cg == 1 && m == g;
        // A stride-1 convolution over whole channel quads reads its input in quads
        // ([`qconv`]): its weights are packed in that depth order instead.
        let unit_strides = self
            .attrs
            .strides
            .as_ref()
            .is_none_or(|s| s.iter().all(|&v| v == 1));
        let quad_taps = (unit_strides && !depthwise && cg % 4 == 0 && taps > 1).then_some(taps);
        let sums = if self.follows_level && signed {
            Sums::like_onnxruntime()
        } else {
            Sums::Exact
        };
        let key = [
            m,
            depth,
            g,
            usize::from(signed)
                | usize::from(quad_taps.is_some()) << 1
                | usize::from(sums == Sums::PairsSaturated) << 2,
        ];
        Some((
            Layout {
                m,
                depth,
                group: g,
                taps,
                depthwise,
                quad_taps,
                sums,
            },
            key,
        ))
    }

    /// Packs constant weights `w` with their zero points (absent or not constant: packed for
    /// 0, and used only when the run's are that too).
    fn prepare(&self, w: &TensorRef<'_>, wzp: Option<&TensorRef<'_>>) {
        let Some(zw) = zero_points(wzp, w.elem_type()) else {
            return;
        };
        let Some((wb, signed)) = bytes_of(w) else {
            return;
        };
        if let Some((l, key)) = self.layout(w.shape(), signed, zw.len()) {
            self.packs
                .prepare(zw.clone(), key, || l.pack(&wb, signed, &zw));
        }
    }

    /// The convolution of 8-bit `x` by 8-bit `w` into `out`, with the output shape; `None`
    /// where the fast path does not apply (other types or ranks, shapes the general path
    /// rejects, the reference level), and the general path runs.
    pub(crate) fn run(
        &self,
        op: &str,
        (x, xzp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        (w, wzp): (&TensorRef<'_>, Option<&TensorRef<'_>>),
        out: &qconv::Output<'_>,
    ) -> Option<(Vec<usize>, qconv::Result)> {
        if !crate::fast::enabled() {
            return None;
        }
        let (xs, ws) = (x.shape(), w.shape());
        if !matches!(xs.len(), 3 | 4) || ws.len() != xs.len() {
            return None;
        }
        let [zx] = zero_points(xzp, x.elem_type())?[..] else {
            return None;
        };
        let zw = zero_points(wzp, w.elem_type())?;
        let (xb, x_signed) = bytes_of(x)?;
        let (wb, w_signed) = bytes_of(w)?;
        let (nb, c, m, cg, g) = (xs[0], xs[1], ws[0], ws[1], self.group);
        if g == 0 || c != cg * g || m % g != 0 || (zw.len() != 1 && zw.len() != m) {
            return None;
        }
        let kernel = ws[2..].to_vec();
        if let Some(k) = &self.attrs.kernel_shape
            && kernel_dims(op, k).ok()? != kernel
        {
            return None;
        }
        let geo = self.attrs.resolve(op, &xs[2..], &kernel).ok()?;
        geo.checked_output(&[xs[0], m]).ok()?;
        let ((h, wd), (kh, kw), geo2) = match (&xs[2..], &kernel[..]) {
            ([h, wd], [kh, kw]) => ((*h, *wd), (*kh, *kw), geo.clone()),
            ([wd], [kw]) => ((1, *wd), (1, *kw), as_2d(&geo)),
            _ => return None,
        };
        let (layout, key) = self.layout(ws, w_signed, zw.len())?;
        if layout.quad_taps.is_some()
            != (geo2.strides == [1, 1] && cg % 4 == 0 && kh * kw > 1 && !layout.depthwise)
        {
            // The attributes and the resolved geometry disagree on the strides: the general
            // path reports whatever is wrong.
            return None;
        }
        let packed = self
            .packs
            .get(&zw, key, || layout.pack(&wb, w_signed, &zw))?;
        let conv = Conv2d {
            n: nb,
            c,
            h,
            w: wd,
            m,
            group: g,
            kh,
            kw,
            geo: &geo2,
            winograd: None,
            direct: None,
        };
        let input = qconv::Input {
            x: &xb,
            signed: x_signed,
            zx,
        };
        let r = crate::par::serial_below(conv.macs(), || qconv::run(&conv, &input, &packed, out))?;
        let mut shape = vec![nb, m];
        shape.extend_from_slice(&geo.out);
        Some((shape, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::tests::*;

    use crate::kernel::{AttrValue, NodeDef};
    use crate::tensor::Tensor;

    /// Weights packed at prepare serve every run with the dimensions and zero points they were
    /// packed for; a run with others, or a kernel never prepared, packs for itself.
    #[test]
    fn weights_are_packed_once_at_prepare() {
        let made = std::cell::Cell::new(0);
        let make = |v: usize| {
            made.set(made.get() + 1);
            Some(v)
        };
        let packs = Packs::<usize>::default();
        assert_eq!(
            packs.get(&[0], [4, 1, 1, 0], || make(7)).as_deref(),
            Some(&7)
        );
        assert_eq!(
            packs.get(&[0], [4, 1, 1, 0], || make(7)).as_deref(),
            Some(&7)
        );
        assert_eq!(made.get(), 2, "not prepared: packed on each run");
        packs.prepare(vec![0], [4, 1, 1, 0], || make(1));
        packs.prepare(vec![0], [4, 1, 1, 0], || make(2));
        assert_eq!(made.get(), 3, "prepared once");
        assert_eq!(
            packs.get(&[0], [4, 1, 1, 0], || make(9)).as_deref(),
            Some(&1)
        );
        assert_eq!(made.get(), 3, "the prepared weights serve the run");
        // Other zero points or dimensions than the prepared ones: packed for the run.
        assert_eq!(
            packs.get(&[3], [4, 1, 1, 0], || make(5)).as_deref(),
            Some(&5)
        );
        assert_eq!(
            packs.get(&[0], [2, 2, 1, 0], || make(6)).as_deref(),
            Some(&6)
        );
        assert_eq!(made.get(), 5);
    }

    /// A kernel prepared with constant weights packs them once; its answers are those of an
    /// unprepared kernel, and of the general path.
    #[test]
    fn prepared_weights_give_the_same_answers() {
        let mut rnd = byte_rng(11);
        let a = bytes_tensor(
            &(0..6 * 40).map(|_| rnd()).collect::<Vec<_>>(),
            &[6, 40],
            false,
        );
        let b = bytes_tensor(
            &(0..40 * 9).map(|_| rnd()).collect::<Vec<_>>(),
            &[40, 9],
            true,
        );
        let zb = Tensor::from_vec(&[9], (0..9).map(|i| i as i8 - 4).collect::<Vec<i8>>()).unwrap();
        let node = NodeDef::new("MatMulInteger", 10).with_io(4, 1);
        let prepared = crate::ops::registry().build(&node).unwrap();
        let constants = [None, Some(b.view()), None, Some(zb.view())];
        prepared.prepare(&constants);
        let fresh = crate::ops::registry().build(&node).unwrap();
        let inputs = [Some(a.view()), Some(b.view()), None, Some(zb.view())];
        let want = fresh.run(&inputs).unwrap();
        for _ in 0..2 {
            let got = prepared.run(&inputs).unwrap();
            assert_eq!(got[0].as_array::<i32>(), want[0].as_array::<i32>());
        }
        assert_levels_agree(
            &node,
            &[Some(a.clone()), Some(b.clone()), None, Some(zb.clone())],
            "prepared",
        );
    }

    /// The 8-bit matrix product fast path ([`qmatmul`]) on every level gives the general
    /// path's exact answers: MatMulInteger and QLinearMatMul, uint8 and int8 operands and
    /// outputs, per-column zero points of B, a 2-D B and a batched one.
    #[test]
    fn fast_integer_matmul_equals_the_general_path() {
        let mut rnd = byte_rng(5);
        let cases: [(&[usize], &[usize]); 5] = [
            (&[5, 37], &[37, 19]),
            (&[2, 3, 70], &[70, 40]),
            (&[2, 9, 33], &[2, 33, 7]),
            (&[1, 65], &[65, 1]),
            (&[21, 64], &[64, 70]),
        ];
        for (ci, (sa, sb)) in cases.into_iter().enumerate() {
            let n = sb[sb.len() - 1];
            let ab: Vec<u8> = (0..sa.iter().product()).map(|_| rnd()).collect();
            let bb: Vec<u8> = (0..sb.iter().product()).map(|_| rnd()).collect();
            for (a_signed, b_signed, per_column, y_signed) in [
                (false, true, false, false),
                (true, true, true, true),
                (false, false, true, false),
                (true, false, false, true),
            ] {
                let bytes = bytes_tensor;
                let a = bytes(&ab, sa, a_signed);
                let b = bytes(&bb, sb, b_signed);
                let za = bytes(&[rnd()], &[], a_signed);
                let zb = if per_column && sb.len() == 2 {
                    bytes(&(0..n).map(|_| rnd()).collect::<Vec<u8>>(), &[n], b_signed)
                } else {
                    bytes(&[rnd()], &[], b_signed)
                };
                let zy = bytes(&[rnd()], &[], y_signed);
                let fast = FastQMatMul::default();
                let portable = crate::fast::ISAS.iter().find(|i| i.key == "portable");
                let taken = crate::fast::with_isa(portable.expect("a portable level"), || {
                    fast.run(
                        (&a.view(), Some(&za.view())),
                        (&b.view(), Some(&zb.view())),
                        &qmatmul::Output::Int32,
                    )
                    .is_some()
                });
                assert_eq!(taken, Some(true), "case {ci}");
                // The VNNI kernel takes every case too, where the CPU has it.
                let vnni = crate::fast::ISAS.iter().find(|i| i.vnni);
                let taken = crate::fast::with_isa(vnni.expect("a VNNI level"), || {
                    FastQMatMul::default()
                        .run(
                            (&a.view(), Some(&za.view())),
                            (&b.view(), Some(&zb.view())),
                            &qmatmul::Output::Int32,
                        )
                        .is_some()
                });
                match taken {
                    Some(t) => assert!(t, "case {ci} on the VNNI level"),
                    None => println!("qmatmul case {ci}: VNNI kernel skipped (no AVX-512 VNNI)"),
                }
                let integer = vec![
                    Some(a.clone()),
                    Some(b.clone()),
                    Some(za.clone()),
                    Some(zb.clone()),
                ];
                let b_scale = if per_column && sb.len() == 2 {
                    t(
                        &[n],
                        (0..n)
                            .map(|j| 0.011 + j as f32 * 1e-3)
                            .collect::<Vec<f32>>(),
                    )
                } else {
                    Tensor::scalar(0.011f32)
                };
                let qlinear = vec![
                    Some(a.clone()),
                    Some(Tensor::scalar(0.03f32)),
                    Some(za.clone()),
                    Some(b.clone()),
                    Some(b_scale),
                    Some(zb.clone()),
                    Some(Tensor::scalar(0.9f32)),
                    Some(zy.clone()),
                ];
                for (op, inputs) in [("MatMulInteger", integer), ("QLinearMatMul", qlinear)] {
                    let k = NodeDef::new(op, 10).with_io(inputs.len(), 1);
                    let case = format!("case {ci} ({a_signed}, {b_signed}, {per_column})");
                    assert_levels_agree(&k, &inputs, &case);
                }
            }
        }
    }

    /// The 8-bit convolution fast path ([`qconv`]) on every level gives the general path's
    /// exact answers: QLinearConv and ConvInteger, uint8 and int8 inputs, weights and outputs,
    /// per-tensor and per-channel weight zero points, for the GEMM (with im2col, with the input
    /// in channel quads, and 1×1), depthwise, grouped, strided, dilated, asymmetrically padded
    /// and 1-D cases.
    #[test]
    fn fast_integer_convolution_equals_the_general_path() {
        let mut rnd = byte_rng(17);
        let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
        // (x shape, w shape, group, strides, pads, dilations)
        type Case = (Vec<usize>, Vec<usize>, i64, Vec<i64>, Vec<i64>, Vec<i64>);
        let cases: Vec<Case> = vec![
            (
                vec![1, 5, 9, 11],
                vec![7, 5, 3, 3],
                1,
                vec![1, 1],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            (
                vec![2, 6, 8, 8],
                vec![9, 6, 1, 1],
                1,
                vec![1, 1],
                vec![0, 0, 0, 0],
                vec![1, 1],
            ),
            (
                vec![1, 6, 10, 9],
                vec![6, 1, 3, 3],
                6,
                vec![2, 2],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            (
                vec![1, 8, 7, 7],
                vec![6, 4, 3, 3],
                2,
                vec![1, 2],
                vec![2, 1, 0, 2],
                vec![2, 2],
            ),
            (
                vec![1, 4, 50],
                vec![5, 4, 7],
                1,
                vec![3],
                vec![3, 2],
                vec![1],
            ),
            (
                vec![1, 5, 9, 13],
                vec![5, 1, 3, 3],
                5,
                vec![2, 2],
                vec![0, 3, 1, 0],
                vec![1, 1],
            ),
            (
                vec![1, 3, 40, 36],
                vec![40, 3, 3, 3],
                1,
                vec![2, 2],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            // Stride 1 over whole channel quads (the input laid out in quads): two images,
            // then groups with dilation and asymmetric pads on rows longer than a panel, then
            // no padding at all.
            (
                vec![2, 8, 9, 11],
                vec![6, 8, 3, 3],
                1,
                vec![1, 1],
                vec![1, 1, 1, 1],
                vec![1, 1],
            ),
            (
                vec![1, 8, 12, 35],
                vec![6, 4, 3, 5],
                2,
                vec![1, 1],
                vec![0, 2, 3, 1],
                vec![2, 1],
            ),
            (
                vec![1, 4, 5, 70],
                vec![3, 4, 2, 2],
                1,
                vec![1, 1],
                vec![0, 0, 0, 0],
                vec![1, 1],
            ),
        ];
        for (ci, (xs, ws, group, strides, pads, dil)) in cases.into_iter().enumerate() {
            let nx: usize = xs.iter().product();
            let nw: usize = ws.iter().product();
            let m = ws[0];
            let xb: Vec<u8> = (0..nx).map(|_| rnd()).collect();
            let wb: Vec<u8> = (0..nw).map(|_| rnd()).collect();
            for (x_signed, w_signed, per_channel, y_signed) in [
                (false, true, false, false),
                (true, true, true, true),
                (false, false, true, true),
                (true, false, false, false),
            ] {
                let bytes = bytes_tensor;
                let x = bytes(&xb, &xs, x_signed);
                let w = bytes(&wb, &ws, w_signed);
                let zx = bytes(&[rnd()], &[], x_signed);
                let zw = if per_channel {
                    let z: Vec<u8> = (0..m).map(|_| rnd()).collect();
                    bytes(&z, &[m], w_signed)
                } else {
                    bytes(&[rnd()], &[], w_signed)
                };
                let zy = bytes(&[rnd()], &[], y_signed);
                let bias = t(
                    &[m],
                    (0..m).map(|i| i as i32 * 977 - 3000).collect::<Vec<i32>>(),
                );
                let ws_scale = t(
                    &[m],
                    (0..m)
                        .map(|i| 0.002 + i as f32 * 1e-4)
                        .collect::<Vec<f32>>(),
                );
                let node = |op: &str, io: usize| {
                    NodeDef::new(op, 10)
                        .with_io(io, 1)
                        .with_attr("group", AttrValue::Int(group))
                        .with_attr("strides", ints(&strides))
                        .with_attr("pads", ints(&pads))
                        .with_attr("dilations", ints(&dil))
                };
                let qlinear = vec![
                    Some(x.clone()),
                    Some(Tensor::scalar(0.05f32)),
                    Some(zx.clone()),
                    Some(w.clone()),
                    Some(ws_scale.clone()),
                    Some(zw.clone()),
                    Some(Tensor::scalar(0.7f32)),
                    Some(zy.clone()),
                    Some(bias.clone()),
                ];
                let integer = vec![
                    Some(x.clone()),
                    Some(w.clone()),
                    Some(zx.clone()),
                    Some(zw.clone()),
                ];
                // The fast path takes every case (else this would compare the general path
                // with itself).
                let fast = FastQConv::new(&node("ConvInteger", 4)).unwrap();
                let portable = crate::fast::ISAS.iter().find(|i| i.key == "portable");
                let taken = crate::fast::with_isa(portable.expect("a portable level"), || {
                    fast.run(
                        "ConvInteger",
                        (&x.view(), Some(&zx.view())),
                        (&w.view(), Some(&zw.view())),
                        &qconv::Output::Int32,
                    )
                    .is_some()
                });
                assert_eq!(taken, Some(true), "case {ci}");
                for (op, inputs) in [("QLinearConv", qlinear), ("ConvInteger", integer)] {
                    let k = node(op, inputs.len());
                    let case = format!("case {ci} ({x_signed}, {w_signed}, {per_channel})");
                    assert_levels_agree(&k, &inputs, &case);
                }
            }
        }
    }
}
