//! Matrix products: MatMul (numpy `matmul`: batch broadcasting, 1-D promotion) and Gemm.
//! f32 goes through the `gemm` crate, f64 through ndarray's `general_mat_mul`; integer types use a wrapping loop; f16/bf16 compute
//! in f32.

use std::sync::OnceLock;

use ndarray::{Array2, Array3, ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Axis, IxDyn, Zip};

use crate::ops::util::num::{Num, via_f32};

use crate::ops::util::broadcast::broadcast_shapes;

use crate::error::{OpError, OpResult};
use crate::kernel::add_ms;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::activation::activate;
use crate::ops::activation::activation;
use crate::ops::activation::base_attrs;
use crate::ops::util::args::{input, opt_input, same_type, typed_like};
use crate::tensor::Tensor;
use crate::tensor::TensorRef;
use crate::{bail, with_types};

pub fn register(reg: &mut Registry) {
    add(reg, "MatMul", 1, build_matmul);
    add(reg, "Gemm", 1, build_gemm);
    add(reg, "Det", 11, build_det);
    add_ms(reg, "FusedGemm", build_fused_gemm);
    add_ms(reg, "FusedMatMul", build_fused_matmul);
}

/// Element types with a matrix product `c = alpha * a @ b + beta * c`.
pub trait MatElem: Num + Send + Sync {
    fn gemm(
        alpha: Self,
        a: &ArrayView2<'_, Self>,
        b: &ArrayView2<'_, Self>,
        beta: Self,
        c: &mut ArrayViewMut2<'_, Self>,
    );
}

impl MatElem for f32 {
    /// Through the `gemm` crate, which reads any strides (transposed views included); at the
    /// reference level through ndarray's `general_mat_mul`.
    fn gemm(
        alpha: Self,
        a: &ArrayView2<'_, Self>,
        b: &ArrayView2<'_, Self>,
        beta: Self,
        c: &mut ArrayViewMut2<'_, Self>,
    ) {
        let ((m, k), n) = (a.dim(), b.dim().1);
        assert!(
            b.dim().0 == k && c.dim() == (m, n),
            "gemm: shapes {:?} · {:?} into {:?}",
            a.dim(),
            b.dim(),
            c.dim()
        );
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            c.mapv_inplace(|v| if beta == 0.0 { 0.0 } else { v * beta });
            return;
        }
        if !crate::fast::enabled() {
            // The reference product: ndarray's own, without the `gemm` crate's kernels.
            ndarray::linalg::general_mat_mul(alpha, a, b, beta, c);
            return;
        }
        crate::fast::gemm::gemm_views(alpha, a, b, beta, c);
    }
}

impl MatElem for f64 {
    fn gemm(
        alpha: Self,
        a: &ArrayView2<'_, Self>,
        b: &ArrayView2<'_, Self>,
        beta: Self,
        c: &mut ArrayViewMut2<'_, Self>,
    ) {
        ndarray::linalg::general_mat_mul(alpha, a, b, beta, c);
    }
}

macro_rules! impl_mat_int {
    ($($t:ty),*) => {$(
        impl MatElem for $t {
            fn gemm(alpha: Self, a: &ArrayView2<'_, Self>, b: &ArrayView2<'_, Self>, beta: Self, c: &mut ArrayViewMut2<'_, Self>) {
                c.mapv_inplace(|x| x.mul(beta));
                for (a_row, mut c_row) in a.outer_iter().zip(c.outer_iter_mut()) {
                    for (&aip, b_row) in a_row.iter().zip(b.outer_iter()) {
                        let s = aip.mul(alpha);
                        Zip::from(&mut c_row).and(&b_row).for_each(|o, &bv| *o = o.add(s.mul(bv)));
                    }
                }
            }
        }
    )*};
}

impl_mat_int!(i8, i16, i32, i64, u8, u16, u32, u64);

/// numpy `matmul` of two arrays.
pub fn matmul<T: MatElem>(
    op: &str,
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
) -> OpResult<ArrayD<T>> {
    matmul_plus(op, a, b, None)
}

/// numpy `matmul` of two arrays plus `row` (a vector as long as a row of the product) added
/// to every row: the rows start as `row` and the product accumulates onto them, the sum of a
/// Gemm with a bias (see [`build_matmul_add`]).
pub fn matmul_plus<T: MatElem>(
    op: &str,
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
    row: Option<&[T]>,
) -> OpResult<ArrayD<T>> {
    let (ra, rb) = (a.ndim(), b.ndim());
    if ra == 0 || rb == 0 {
        bail!(
            "{op}: inputs must have rank >= 1, got shapes {:?} and {:?}",
            a.shape(),
            b.shape()
        );
    }
    let a = if ra == 1 {
        a.clone().insert_axis(Axis(0))
    } else {
        a.clone()
    };
    let b = if rb == 1 {
        b.clone().insert_axis(Axis(1))
    } else {
        b.clone()
    };
    let (sa, sb) = (a.shape(), b.shape());
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        bail!("{op}: inner dimensions differ: A has shape {sa:?}, B has shape {sb:?}");
    }
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let batch = broadcast_shapes(ba, bb).ok_or_else(|| {
        OpError(format!(
            "{op}: batch dims of {sa:?} and {sb:?} cannot be broadcast"
        ))
    })?;
    let nbatch = crate::limits::checked_numel(&batch)?;
    crate::limits::checked_numel(&[nbatch, m, n])?;
    let a_c = a.as_standard_layout();
    let b_c = b.as_standard_layout();
    let a3 = a_c
        .view()
        .into_shape_with_order((ba.iter().product(), m, k))
        .map_err(|e| OpError(format!("{op}: {e}")))?;
    let b3 = b_c
        .view()
        .into_shape_with_order((bb.iter().product(), k, n))
        .map_err(|e| OpError(format!("{op}: {e}")))?;
    if let Some(r) = row
        && r.len() != n
    {
        bail!(
            "{op}: a row of {} values added to products of {n} columns",
            r.len()
        );
    }
    let len = nbatch * m * n;
    let mut data = crate::scratch::take_any::<T>(len)?;
    match row {
        Some(r) if n > 0 => (0..nbatch * m).for_each(|_| data.extend_from_slice(r)),
        _ => data.resize(len, T::zero()),
    }
    let mut out =
        Array3::from_shape_vec((nbatch, m, n), data).map_err(|e| OpError(format!("{op}: {e}")))?;
    let beta = if row.is_some() { T::one() } else { T::zero() };
    let ia = batch_map(&batch, ba);
    let ib = batch_map(&batch, bb);
    let one_gemm = |bi: usize, o: &mut ndarray::ArrayViewMut2<'_, T>| {
        T::gemm(
            T::one(),
            &a3.index_axis(Axis(0), ia[bi]),
            &b3.index_axis(Axis(0), ib[bi]),
            beta,
            o,
        );
    };
    // Small products of many batches (attention heads) share the pool batch by batch; a
    // large one splits inside the GEMM instead.
    let small = m.saturating_mul(k).saturating_mul(n) < crate::par::GEMM_PAR_MIN;
    match out.as_slice_mut() {
        Some(flat) if small && nbatch > 1 && m * n > 0 && crate::par::threads() > 1 => {
            crate::par::for_each_chunk(flat, m * n, |bi, chunk| {
                if let Ok(mut o) = ndarray::ArrayViewMut2::from_shape((m, n), chunk) {
                    one_gemm(bi, &mut o);
                }
            });
        }
        _ => {
            for (bi, mut o) in out.outer_iter_mut().enumerate() {
                one_gemm(bi, &mut o);
            }
        }
    }
    let mut shape = batch;
    if ra > 1 {
        shape.push(m);
    }
    if rb > 1 {
        shape.push(n);
    }
    out.into_shape_with_order(IxDyn(&shape))
        .map_err(|e| OpError(format!("{op}: {e}")))
}

/// For each flat index of the broadcast `batch` shape, the flat index into `src` (a shape that
/// broadcasts to `batch`, right-aligned).
fn batch_map(batch: &[usize], src: &[usize]) -> Vec<usize> {
    let off = batch.len() - src.len();
    let mut out = Vec::new();
    crate::ops::util::indexing::for_each_index(batch, |idx| {
        let mut flat = 0;
        for (d, &s) in src.iter().enumerate() {
            flat = flat * s + if s == 1 { 0 } else { idx[off + d] };
        }
        out.push(flat);
    });
    if batch.is_empty() {
        out = vec![0];
    }
    out
}

fn build_matmul(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        via_f32(inputs, |inputs| {
            let a = input(&op, inputs, 0)?;
            let b = input(&op, inputs, 1)?;
            same_type(&op, a, b)?;
            one(with_types!(
                a.clone(),
                |x| Ok(matmul(&op, &x, &typed_like(&op, b)?)?.into()),
                [F32, F64, I8, I16, I32, I64, U8, U16, U32, U64],
                &op
            ))
        })
    }))
}

/// `MatMul` then `Add` of a constant row (`[N]`, or `[1, .., 1, N]`): the node the
/// `fuse_matmul_add` pass makes of the two (inputs: A, B, the row). The product's rows start as
/// the row and the GEMM accumulates onto them, as ONNX Runtime's Gemm adds its `C`; a row
/// of higher rank than the product adds its leading 1s to the output's shape.
pub(crate) fn build_matmul_add(op: String) -> Box<dyn OpKernel> {
    kernel(move |inputs| {
        let a = input(&op, inputs, 0)?;
        let b = input(&op, inputs, 1)?;
        let c = input(&op, inputs, 2)?;
        same_type(&op, a, b)?;
        same_type(&op, a, c)?;
        one(with_types!(
            a.clone(),
            |x| {
                let row = typed_like(&op, c)?;
                let flat = crate::ops::util::indexing::contiguous(&row);
                let y = matmul_plus(&op, &x, &typed_like(&op, b)?, Some(&flat))?;
                if row.ndim() > y.ndim() {
                    let mut shape = vec![1; row.ndim() - y.ndim()];
                    shape.extend_from_slice(y.shape());
                    Ok(y.into_shape_with_order(IxDyn(&shape))
                        .map_err(|e| OpError(format!("{op}: {e}")))?
                        .into())
                } else {
                    Ok(y.into())
                }
            },
            [F32, F64],
            &op
        ))
    })
}

/// Det: the determinant of each `[M, M]` matrix of `[*, M, M]`, by LU decomposition with
/// partial pivoting in f64, cast back to the input's float type.
fn build_det(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let shape = x.shape();
        let r = shape.len();
        if r < 2 || shape[r - 1] != shape[r - 2] {
            bail!("{op}: the input must be [*, M, M], got shape {shape:?}");
        }
        let m = shape[r - 1];
        let values = crate::ops::util::num::float_values(&op, "X", x)?;
        let mut dets = Vec::with_capacity(values.len() / (m * m).max(1));
        let mut a = vec![0.0f64; m * m];
        for mat in values.chunks_exact((m * m).max(1)) {
            if m == 0 {
                dets.push(1.0);
                continue;
            }
            a.copy_from_slice(mat);
            dets.push(determinant(&mut a, m));
        }
        if m == 0 {
            dets.truncate(shape[..r - 2].iter().product());
        }
        one(crate::ops::util::num::tensor_from_f64(
            x.elem_type(),
            &shape[..r - 2],
            dets,
        ))
    }))
}

/// The determinant of the row-major `m`×`m` matrix `a` (overwritten with its LU factors).
fn determinant(a: &mut [f64], m: usize) -> f64 {
    let mut det = 1.0;
    for col in 0..m {
        let pivot = (col..m)
            .max_by(|&i, &j| a[i * m + col].abs().total_cmp(&a[j * m + col].abs()))
            .unwrap_or(col);
        if a[pivot * m + col] == 0.0 {
            return 0.0;
        }
        if pivot != col {
            for k in 0..m {
                a.swap(pivot * m + k, col * m + k);
            }
            det = -det;
        }
        let p = a[col * m + col];
        det *= p;
        for row in col + 1..m {
            let f = a[row * m + col] / p;
            if f != 0.0 {
                for k in col..m {
                    a[row * m + k] -= f * a[col * m + k];
                }
            }
        }
    }
    det
}

fn as_2d<'x, T>(
    op: &str,
    x: &'x ArrayViewD<'_, T>,
    what: &str,
    t: bool,
) -> OpResult<ArrayView2<'x, T>> {
    let v = x
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .map_err(|_| {
            OpError(format!(
                "{op}: {what} must be 2-D, got shape {:?}",
                x.shape()
            ))
        })?;
    Ok(if t { v.reversed_axes() } else { v })
}

struct Gemm {
    op: String,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
}

impl Gemm {
    fn run_typed<T: MatElem>(
        &self,
        a: &ArrayViewD<'_, T>,
        b: &ArrayViewD<'_, T>,
        c: Option<ArrayViewD<'_, T>>,
    ) -> OpResult<Tensor> {
        let op = &self.op;
        let a2 = as_2d(op, a, "A", self.trans_a)?;
        let b2 = as_2d(op, b, "B", self.trans_b)?;
        let (m, k) = a2.dim();
        let (k2, n) = b2.dim();
        if k != k2 {
            bail!(
                "{op}: inner dimensions differ: op(A) is {:?}, op(B) is {:?}",
                [m, k],
                [k2, n]
            );
        }
        crate::limits::checked_numel(&[m, n])?;
        let (mut out, beta) = match c {
            Some(c) if self.beta != 0.0 => {
                if broadcast_shapes(c.shape(), &[m, n]).as_deref() != Some(&[m, n][..]) {
                    bail!(
                        "{op}: C of shape {:?} cannot be broadcast to {:?}",
                        c.shape(),
                        [m, n]
                    );
                }
                let cb = c
                    .broadcast(IxDyn(&[m, n]))
                    .ok_or_else(|| OpError(format!("{op}: C cannot be broadcast")))?;
                let cb = cb
                    .into_dimensionality::<ndarray::Ix2>()
                    .map_err(|e| OpError(format!("{op}: {e}")))?;
                (cb.to_owned(), T::from_f64(self.beta.into()))
            }
            _ => (Array2::from_elem((m, n), T::zero()), T::zero()),
        };
        T::gemm(
            T::from_f64(self.alpha.into()),
            &a2,
            &b2,
            beta,
            &mut out.view_mut(),
        );
        Ok(out.into_dyn().into())
    }
}

fn build_gemm(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(Box::new(GemmKernel {
        g: Gemm {
            op: n.op_type.clone(),
            alpha: n.attr_float_or("alpha", 1.0)?,
            beta: n.attr_float_or("beta", 1.0)?,
            trans_a: n.attr_int_or("transA", 0)? != 0,
            trans_b: n.attr_int_or("transB", 0)? != 0,
        },
        b_rows: OnceLock::new(),
    }))
}

/// Rows of A above which a Gemm with `transB = 1` reads the row-major copy of a constant B
/// ([`GemmKernel::b_rows`]); at most this many, each output is a dot product of an A row with
/// a B row where they lie, faster than the packed product for one row.
const FEW_ROWS: usize = 4;

/// Gemm, keeping for a float32 constant B given transposed (`transB = 1`) a row-major copy
/// `[K, N]` made at `prepare`: the `gemm` crate packs a transposed B column by column on every
/// run, three times slower than from rows on a wide classifier layer. ONNX Runtime likewise
/// packs a constant B once.
struct GemmKernel {
    g: Gemm,
    b_rows: OnceLock<ArrayD<f32>>,
}

impl OpKernel for GemmKernel {
    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        if !self.g.trans_b {
            return;
        }
        if let Some(Some(b)) = constants.get(1)
            && let Ok(b) = b.as_f32()
            && b.ndim() == 2
        {
            let _ = self.b_rows.set(b.t().as_standard_layout().into_owned());
        }
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let g = &self.g;
        let op = &g.op;
        let a = input(op, inputs, 0)?;
        let rows = a.shape().get(usize::from(g.trans_a)).copied().unwrap_or(0);
        if let Some(b_rows) = self.b_rows.get()
            && rows > FEW_ROWS
            && let Ok(av) = a.as_f32()
        {
            let b = input(op, inputs, 1)?;
            same_type(op, a, b)?;
            let c = opt_input(inputs, 2);
            if let Some(c) = c {
                same_type(op, a, c)?;
            }
            let untransposed = Gemm {
                trans_b: false,
                op: op.clone(),
                ..*g
            };
            let c = c.map(|c| c.as_f32()).transpose()?;
            return Ok(vec![untransposed.run_typed(&av, &b_rows.view(), c)?]);
        }
        via_f32(inputs, |inputs| {
            let a = input(op, inputs, 0)?;
            let b = input(op, inputs, 1)?;
            same_type(op, a, b)?;
            let c = opt_input(inputs, 2);
            if let Some(c) = c {
                same_type(op, a, c)?;
            }
            one(with_types!(
                a.clone(),
                |x| g.run_typed(
                    &x,
                    &typed_like(op, b)?,
                    c.map(|c| typed_like(op, c)).transpose()?
                ),
                [F32, F64, I32, I64, U32, U64],
                op
            ))
        })
    }
}

/// `act(Gemm(A, B, C))`.
fn build_fused_gemm(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let gemm = crate::kernel::build_part(n, "Gemm", 13, base_attrs(n), n.num_inputs, 1)?;
    let act = activation(n)?;
    let op = n.op_type.clone();
    Ok(crate::kernel::kernel(move |inputs| {
        let mut outs = gemm.run(inputs)?;
        if let Some(act) = act {
            activate(&op, act, &mut outs)?;
        }
        Ok(outs)
    }))
}

/// `alpha * MatMul(A', B')`, where `'` swaps the last two axes when `transA` / `transB` is set;
/// `transBatchA` / `transBatchB` move the batch axes (all but the last two) behind them.
fn build_fused_matmul(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let alpha = n.attr_float_or("alpha", 1.0)?;
    let flags = [
        n.attr_int_or("transA", 0)? != 0,
        n.attr_int_or("transB", 0)? != 0,
    ];
    let batch = [
        n.attr_int_or("transBatchA", 0)? != 0,
        n.attr_int_or("transBatchB", 0)? != 0,
    ];
    let matmul = crate::kernel::build_part(n, "MatMul", 13, Vec::new(), 2, 1)?;
    let op = n.op_type.clone();
    Ok(crate::kernel::kernel(move |inputs| {
        let mut prepared = Vec::with_capacity(2);
        for (i, (&trans, &trans_batch)) in flags.iter().zip(&batch).enumerate() {
            let t = input(&op, inputs, i)?;
            prepared.push(fused_operand(&op, t, trans, trans_batch)?);
        }
        let views: Vec<Option<TensorRef<'_>>> = prepared
            .iter()
            .zip(inputs)
            .map(|(p, orig)| match p {
                Some(t) => Some(t.view()),
                None => orig.as_ref().map(TensorRef::reborrow),
            })
            .collect();
        let mut outs = matmul.run(&views)?;
        if alpha != 1.0 {
            let a = alpha;
            match outs.first_mut() {
                Some(Tensor::F32(y)) => y.mapv_inplace(|v| v * a),
                Some(Tensor::F64(y)) => y.mapv_inplace(|v| v * f64::from(a)),
                Some(other) => {
                    let ty = other.elem_type();
                    let Tensor::F32(mut y) =
                        other.view().cast(epx_plugin_api::ElementType::Float)?
                    else {
                        return Err(OpError(format!("{op}: cannot scale in f32")));
                    };
                    y.mapv_inplace(|v| v * a);
                    *other = Tensor::F32(y).view().cast(ty)?;
                }
                None => return Err(OpError(format!("{op}: no output"))),
            }
        }
        Ok(outs)
    }))
}

/// One FusedMatMul operand in the layout MatMul reads, or `None` when it already is.
fn fused_operand(
    op: &str,
    t: &TensorRef<'_>,
    trans: bool,
    trans_batch: bool,
) -> OpResult<Option<Tensor>> {
    let rank = t.ndim();
    if rank < 2 || (!trans && !trans_batch) {
        if trans && rank < 2 {
            return Err(OpError(format!(
                "{op}: a transposed operand needs rank >= 2, got shape {:?}",
                t.shape()
            )));
        }
        return Ok(None);
    }
    // transBatch: the operand is stored [M, B.., K] (its row axis first) and read as
    // [B.., M, K]; the batch axes move ahead of it.
    let mut perm: Vec<usize> = (0..rank).collect();
    if trans_batch {
        perm = (1..rank - 1).chain([0, rank - 1]).collect();
    }
    if trans {
        perm.swap(rank - 2, rank - 1);
    }
    let transposed = crate::ops::shape::transpose(op, t, &perm)?;
    Ok(Some(transposed))
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

    #[test]
    fn matmul_2d_batched_and_1d() {
        let a = Tensor::F32(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
        let b = Tensor::F32(array![[5.0, 6.0], [7.0, 8.0]].into_dyn());
        let out = run(NodeDef::new("MatMul", 13), vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[19.0, 22.0], [43.0, 50.0]].into_dyn())
        );
        // Batch broadcast: [2,1,2,2] x [3,2,2] -> [2,3,2,2].
        let a4 = Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[2, 1, 2, 2]), |i| {
            (i[0] * 4 + i[2] * 2 + i[3]) as f32
        }));
        let b3 = Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[3, 2, 2]), |i| {
            if i[1] == i[2] { (i[0] + 1) as f32 } else { 0.0 }
        }));
        let out = run(NodeDef::new("MatMul", 13), vec![a4, b3]).unwrap();
        let o = out[0].as_array::<f32>().unwrap();
        assert_eq!(o.shape(), &[2, 3, 2, 2]);
        assert_eq!(o[[1, 2, 1, 0]], 6.0 * 3.0);
        // 1-D promotion.
        let v = Tensor::F64(array![1.0, 1.0].into_dyn());
        let m = Tensor::F64(array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
        let out = run(NodeDef::new("MatMul", 13), vec![v.clone(), m.clone()]).unwrap();
        assert_eq!(out[0], Tensor::F64(array![4.0, 6.0].into_dyn()));
        let out = run(NodeDef::new("MatMul", 13), vec![m, v.clone()]).unwrap();
        assert_eq!(out[0], Tensor::F64(array![3.0, 7.0].into_dyn()));
        let out = run(NodeDef::new("MatMul", 13), vec![v.clone(), v]).unwrap();
        assert_eq!(out[0].shape(), &[] as &[usize]);
        let ai = Tensor::I32(array![[1, 2]].into_dyn());
        let bi = Tensor::I32(array![[3], [4]].into_dyn());
        assert_eq!(
            run(NodeDef::new("MatMul", 13), vec![ai, bi]).unwrap()[0],
            Tensor::I32(array![[11]].into_dyn())
        );
        let h = Tensor::F16(array![[half::f16::from_f32(2.0)]].into_dyn());
        assert_eq!(
            run(NodeDef::new("MatMul", 13), vec![h.clone(), h]).unwrap()[0],
            Tensor::F16(array![[half::f16::from_f32(4.0)]].into_dyn())
        );
    }

    #[test]
    fn matmul_errors() {
        let a = Tensor::F32(ArrayD::zeros(IxDyn(&[2, 3])));
        let e = run(NodeDef::new("MatMul", 13), vec![a.clone(), a.clone()]).unwrap_err();
        assert!(e.0.contains("MatMul: inner dimensions differ"), "{e}");
        let e = run(
            NodeDef::new("MatMul", 13),
            vec![a.clone(), Tensor::scalar(1.0f32)],
        )
        .unwrap_err();
        assert!(e.0.contains("rank >= 1"), "{e}");
        let b = Tensor::F32(ArrayD::zeros(IxDyn(&[2, 3, 2])));
        let c = Tensor::F32(ArrayD::zeros(IxDyn(&[3, 2, 3])));
        let e = run(NodeDef::new("MatMul", 13), vec![b, c]).unwrap_err();
        assert!(e.0.contains("cannot be broadcast"), "{e}");
    }

    #[test]
    fn gemm_all_attrs() {
        let a = Tensor::F32(array![[1.0, 3.0], [2.0, 4.0]].into_dyn()); // A^T = [[1,2],[3,4]]
        let b = Tensor::F32(array![[1.0, 0.0], [0.0, 1.0]].into_dyn());
        let c = Tensor::F32(array![1.0, 2.0].into_dyn());
        let n = NodeDef::new("Gemm", 13)
            .with_attr("transA", AttrValue::Int(1))
            .with_attr("alpha", AttrValue::Float(2.0))
            .with_attr("beta", AttrValue::Float(0.5));
        let out = run(n.clone(), vec![a.clone(), b.clone(), c]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[2.5, 5.0], [6.5, 9.0]].into_dyn())
        );
        let out = run(n.clone(), vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(
            out[0],
            Tensor::F32(array![[2.0, 4.0], [6.0, 8.0]].into_dyn())
        );
        let bad_c = Tensor::F32(array![1.0, 2.0, 3.0].into_dyn());
        let e = run(n, vec![a.clone(), b, bad_c]).unwrap_err();
        assert!(
            e.0.contains("Gemm: C of shape [3] cannot be broadcast to [2, 2]"),
            "{e}"
        );
        let e = run(
            NodeDef::new("Gemm", 13),
            vec![Tensor::F32(array![1.0].into_dyn()), a],
        )
        .unwrap_err();
        assert!(e.0.contains("Gemm: A must be 2-D"), "{e}");
    }

    #[test]
    fn fused_matmul_transposes_and_scales() {
        // A stored transposed [K=3, M=2], B stored transposed [N=2, K=3].
        let at = f32s(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let bt = f32s(&[2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        let n = ms("FusedMatMul")
            .with_attr("transA", AttrValue::Int(1))
            .with_attr("transB", AttrValue::Int(1))
            .with_attr("alpha", AttrValue::Float(0.5));
        let y = run_some(n, vec![Some(at), Some(bt)]);
        // A = [[1,2,3],[4,5,6]], B = [[1,0],[0,1],[1,0]]: A·B = [[4,2],[10,5]], halved.
        close_within(&y[0], &[2.0, 1.0, 5.0, 2.5], 0.0);
        // transBatchA: A stored [M=1, B=2, K=2] is read as [2, 1, 2].
        let a = f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f32s(&[2, 2, 1], &[1.0, 1.0, 1.0, 0.0]);
        let n = ms("FusedMatMul").with_attr("transBatchA", AttrValue::Int(1));
        let y = run_some(n, vec![Some(a), Some(b)]);
        close_within(&y[0], &[3.0, 3.0], 0.0);
    }

    /// Gemm with `transB = 1` and a constant B: prepared, it reads B's row-major copy for A of
    /// more than a few rows, with the answers of the unprepared kernel; with a few rows it reads
    /// B as given (shown by preparing from zeros, which a program never does).
    #[test]
    fn gemm_reads_a_prepared_row_major_b_for_many_rows() {
        let (k, n) = (7, 5);
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b = Tensor::from_vec(&[n, k], b).unwrap();
        let c = Tensor::from_vec(&[n], vec![0.5f32, -1.0, 2.0, 0.25, -0.75]).unwrap();
        let zeros = Tensor::from_vec(&[n, k], vec![0.0f32; n * k]).unwrap();
        let def = NodeDef::new("Gemm", 13)
            .with_attr("transB", AttrValue::Int(1))
            .with_io(3, 1);
        for m in [1, 8] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.11).cos()).collect();
            let a = Tensor::from_vec(&[m, k], a).unwrap();
            let refs = [Some(a.view()), Some(b.view()), Some(c.view())];
            let plain = crate::ops::registry().build(&def).unwrap();
            let prepared = crate::ops::registry().build(&def).unwrap();
            prepared.prepare(&[None, Some(b.view()), Some(c.view())]);
            let (want, got) = (plain.run(&refs).unwrap(), prepared.run(&refs).unwrap());
            let (want, got) = (
                want[0].as_array::<f32>().unwrap().to_owned(),
                got[0].as_array::<f32>().unwrap().to_owned(),
            );
            for (w, g) in want.iter().zip(&got) {
                assert!((w - g).abs() <= 1e-5, "{m} rows: {g} against {w}");
            }
            let from_zeros = crate::ops::registry().build(&def).unwrap();
            from_zeros.prepare(&[None, Some(zeros.view()), Some(c.view())]);
            let z = from_zeros.run(&refs).unwrap();
            let z = z[0].as_array::<f32>().unwrap().to_owned();
            let bias_only = z
                .indexed_iter()
                .all(|(i, &v)| v == c.as_array::<f32>().unwrap()[[i[1]]]);
            assert_eq!(bias_only, m > FEW_ROWS, "{m} rows");
        }
    }
}
