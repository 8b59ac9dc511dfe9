//! Attention (opsets 23, 24 and 28 — Attention-25: 3-D or 4-D Q/K/V, causal and additive/boolean
//! masks, grouped-query heads, softcap, past/present key and value, the optional QK output,
//! nonpad_kv_seqlen, sliding windows) and RotaryEmbedding (opset 23).
//!
//! Values are computed in f64 (at least the precision `softmax_precision` asks for) and cast
//! back to Q's float type. Masks follow the specification's reference: the causal frontier and
//! the window are aligned bottom-right (a query at row `i` sits at `i + offset`, `offset` the
//! past length, or per batch `nonpad_kv_seqlen - q_len` over an external cache, unclamped), and
//! a row whose bias masks every key gives zeros (never NaN) in Y and in the softmax output.
//!
//! The attention family: [`ms`] holds ONNX Runtime's `com.microsoft` attention operators,
//! built on these kernels; [`linear`] the recurrent layers of linear-attention models.

pub mod linear;
pub mod ms;

use ndarray::{ArrayD, IxDyn};

use crate::ops::util::broadcast::broadcast_to;

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::add;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "Attention", 23, build_attention);
    add(reg, "RotaryEmbedding", 23, build_rotary);
    linear::register(reg);
    ms::register(reg);
}

struct Attention {
    op: String,
    scale: Option<f64>,
    is_causal: bool,
    q_heads: Option<usize>,
    kv_heads: Option<usize>,
    softcap: Option<f64>,
    qk_mode: i64,
    /// Attention-25's sliding window: keys more than this many positions before (after) the
    /// query are masked; `None`: unbounded.
    left_window: Option<i64>,
    right_window: Option<i64>,
    /// Attention-25 (opset 28) refuses head counts given for 4-D inputs.
    heads_only_for_3d: bool,
    outputs: usize,
}

/// A Q/K/V input as `[B, H, S, D]` values (3-D inputs `[B, S, H*D]` are split into `heads`).
struct Heads {
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    v: Vec<f64>,
}

impl Heads {
    fn at(&self, b: usize, h: usize, s: usize) -> &[f64] {
        let lo = ((b * self.h + h) * self.s + s) * self.d;
        self.v.get(lo..lo + self.d).unwrap_or(&[])
    }
}

fn heads(op: &str, what: &str, t: &TensorRef<'_>, heads: Option<usize>) -> OpResult<Heads> {
    let v = float_values(op, what, t)?;
    match *t.shape() {
        [b, h, s, d] => Ok(Heads { b, h, s, d, v }),
        [b, s, hd] => {
            let Some(h) = heads.filter(|&h| h > 0 && hd % h == 0) else {
                bail!(
                    "{op}: 3-D {what} of shape {:?} needs a head count attribute dividing {hd}",
                    t.shape()
                );
            };
            let d = hd / h;
            let mut out = vec![0.0; v.len()];
            for bi in 0..b {
                for si in 0..s {
                    for hi in 0..h {
                        for di in 0..d {
                            if let (Some(o), Some(x)) = (
                                out.get_mut(((bi * h + hi) * s + si) * d + di),
                                v.get(((bi * s + si) * h + hi) * d + di),
                            ) {
                                *o = *x;
                            }
                        }
                    }
                }
            }
            Ok(Heads { b, h, s, d, v: out })
        }
        _ => bail!(
            "{op}: {what} must have rank 3 or 4, got shape {:?}",
            t.shape()
        ),
    }
}

/// Concatenates past (`[B, H, P, D]`) and current heads along the sequence.
fn concat_past(op: &str, what: &str, past: Option<&TensorRef<'_>>, cur: Heads) -> OpResult<Heads> {
    let Some(p) = past else { return Ok(cur) };
    let ps = p.shape();
    if ps.len() != 4 || ps[0] != cur.b || ps[1] != cur.h || ps[3] != cur.d {
        bail!(
            "{op}: {what} must have shape [{}, {}, past, {}], got {ps:?}",
            cur.b,
            cur.h,
            cur.d
        );
    }
    let pv = float_values(op, what, p)?;
    let (b, h, d) = (cur.b, cur.h, cur.d);
    let s = ps[2] + cur.s;
    let mut v = Vec::with_capacity(b * h * s * d);
    for bi in 0..b {
        for hi in 0..h {
            let lo = (bi * h + hi) * ps[2] * d;
            v.extend_from_slice(pv.get(lo..lo + ps[2] * d).unwrap_or(&[]));
            let lo = (bi * h + hi) * cur.s * d;
            v.extend_from_slice(cur.v.get(lo..lo + cur.s * d).unwrap_or(&[]));
        }
    }
    Ok(Heads { b, h, s, d, v })
}

impl Attention {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let qt = input(op, inputs, 0)?;
        let ty = qt.elem_type();
        for i in 1..3 {
            let t = input(op, inputs, i)?;
            if t.elem_type() != ty || t.ndim() != qt.ndim() {
                bail!(
                    "{op}: Q, K and V must have the same type and rank, got {} {:?} and {} {:?}",
                    ty,
                    qt.shape(),
                    t.elem_type(),
                    t.shape()
                );
            }
        }
        let three_d = qt.ndim() == 3;
        if self.heads_only_for_3d && !three_d && (self.q_heads.is_some() || self.kv_heads.is_some())
        {
            bail!(
                "{op}: q_num_heads and kv_num_heads are for 3-D inputs; 4-D Q, K and V carry their heads"
            );
        }
        let q = heads(op, "Q", qt, self.q_heads)?;
        let k = heads(op, "K", input(op, inputs, 1)?, self.kv_heads)?;
        let v = heads(op, "V", input(op, inputs, 2)?, self.kv_heads)?;
        let past_len = opt_input(inputs, 4).map_or(0, |p| p.shape().get(2).copied().unwrap_or(0));
        let k = concat_past(op, "past_key", opt_input(inputs, 4), k)?;
        let v = concat_past(op, "past_value", opt_input(inputs, 5), v)?;
        let (b, hq, sq, dq) = (q.b, q.h, q.s, q.d);
        let (hk, t, dv) = (k.h, k.s, v.d);
        if k.b != b || v.b != b || k.d != dq || v.h != hk || v.s != t {
            bail!(
                "{op}: incompatible Q [{b}, {hq}, {sq}, {dq}], K [{}, {hk}, {t}, {}] and V [{}, {}, {}, {dv}]",
                k.b,
                k.d,
                v.b,
                v.h,
                v.s
            );
        }
        if hk == 0 || hq % hk != 0 {
            bail!("{op}: {hq} query heads are not a multiple of {hk} key/value heads");
        }
        let group = hq / hk;
        let scale = self.scale.unwrap_or(1.0 / (dq as f64).sqrt());

        // The additive bias, [B, Hq, Sq, T].
        let full = [b, hq, sq, t];
        let mut bias = vec![0.0f64; b * hq * sq * t];
        if let Some(m) = opt_input(inputs, 3) {
            let ms = m.shape();
            let Some(&ml) = ms.last() else {
                bail!("{op}: attn_mask must have rank >= 1, got a scalar");
            };
            if ml > t {
                bail!("{op}: attn_mask of shape {ms:?} has more than {t} key positions");
            }
            let vals: Vec<f64> = match m {
                TensorRef::Bool(a) => a
                    .iter()
                    .map(|&x| if x { 0.0 } else { f64::NEG_INFINITY })
                    .collect(),
                _ if m.elem_type() == ty => m.to_f64_vec(),
                _ => bail!(
                    "{op}: attn_mask must be bool or {ty}, got {}",
                    m.elem_type()
                ),
            };
            // Pad the key axis to T with -inf.
            let rows = vals.len().checked_div(ml).unwrap_or(0);
            let mut padded = Vec::with_capacity(rows * t);
            for r in 0..rows {
                padded.extend_from_slice(vals.get(r * ml..(r + 1) * ml).unwrap_or(&[]));
                padded.extend(std::iter::repeat_n(f64::NEG_INFINITY, t - ml));
            }
            let mut pshape = ms.to_vec();
            if let Some(last) = pshape.last_mut() {
                *last = t;
            }
            let a = ArrayD::from_shape_vec(IxDyn(&pshape), padded)
                .map_err(|e| OpError(format!("{op}: {e}")))?;
            let view = a.view();
            let bv = broadcast_to(op, &view, &full)?;
            for (o, x) in bias.iter_mut().zip(bv.iter()) {
                *o = *x;
            }
        }
        let nonpad = match opt_input(inputs, 6) {
            Some(n) => {
                if opt_input(inputs, 4).is_some() {
                    bail!("{op}: nonpad_kv_seqlen cannot be combined with past_key and past_value");
                }
                let lens = n.to_i64_vec(&format!("{op}: nonpad_kv_seqlen"))?;
                if lens.len() != b {
                    bail!(
                        "{op}: nonpad_kv_seqlen must have {b} values, got shape {:?}",
                        n.shape()
                    );
                }
                Some(lens)
            }
            None => None,
        };
        // Where query row 0 sits among the keys: after the past, or (an external cache) at the
        // batch's valid length minus the query length. Not clamped: a negative offset masks
        // whole rows, which then give zeros.
        let offset = |bi: usize| -> i64 {
            match &nonpad {
                Some(lens) => lens.get(bi).copied().unwrap_or(0) - sq as i64,
                None => past_len as i64,
            }
        };
        let windowed = self.left_window.is_some() || self.right_window.is_some();
        if self.is_causal || windowed || nonpad.is_some() {
            for (i, o) in bias.iter_mut().enumerate() {
                let (j, s, bi) = (i % t, (i / t) % sq, i / (hq * sq * t));
                let j = j as i64;
                // How far the key is before the query (negative: after it).
                let before = s as i64 + offset(bi) - j;
                let masked = (self.is_causal && before < 0)
                    || self.left_window.is_some_and(|l| before > l)
                    || self.right_window.is_some_and(|r| -before > r)
                    || nonpad
                        .as_ref()
                        .is_some_and(|lens| j >= lens.get(bi).copied().unwrap_or(0));
                if masked {
                    *o = f64::NEG_INFINITY;
                }
            }
        }

        let mut y = vec![0.0f64; b * hq * sq * dv];
        let mut qk_out = vec![0.0f64; b * hq * sq * t];
        let mut row = vec![0.0f64; t];
        for bi in 0..b {
            for h in 0..hq {
                let kh = h / group;
                for s in 0..sq {
                    let qr = q.at(bi, h, s);
                    let base = ((bi * hq + h) * sq + s) * t;
                    for (j, r) in row.iter_mut().enumerate() {
                        let kr = k.at(bi, kh, j);
                        let mut dot: f64 =
                            qr.iter().zip(kr).map(|(a, c)| a * c).sum::<f64>() * scale;
                        if let Some(c) = self.softcap.filter(|&c| c > 0.0) {
                            dot = (dot / c).tanh() * c;
                        }
                        let bsum = dot + bias.get(base + j).copied().unwrap_or(0.0);
                        if let Some(o) = qk_out.get_mut(base + j) {
                            *o = if self.qk_mode == 2 { bsum } else { dot };
                        }
                        *r = bsum;
                    }
                    // A row the bias masks entirely attends to nothing: zeros, not NaN.
                    let masked = bias
                        .get(base..base + t)
                        .is_some_and(|r| r.iter().all(|&x| x == f64::NEG_INFINITY));
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let max = if max == f64::NEG_INFINITY { 0.0 } else { max };
                    let mut sum = 0.0;
                    for r in row.iter_mut() {
                        *r = (*r - max).exp();
                        sum += *r;
                    }
                    let sum = if sum == 0.0 { 1.0 } else { sum };
                    for (j, r) in row.iter_mut().enumerate() {
                        *r = if masked { 0.0 } else { *r / sum };
                        if self.qk_mode == 3
                            && let Some(o) = qk_out.get_mut(base + j)
                        {
                            *o = *r;
                        }
                    }
                    let ybase = ((bi * hq + h) * sq + s) * dv;
                    for (j, p) in row.iter().enumerate() {
                        let vr = v.at(bi, kh, j);
                        for (dd, x) in vr.iter().enumerate() {
                            if let Some(o) = y.get_mut(ybase + dd) {
                                *o += p * x;
                            }
                        }
                    }
                }
            }
        }
        let y = if three_d {
            let mut o = vec![0.0; y.len()];
            for bi in 0..b {
                for h in 0..hq {
                    for s in 0..sq {
                        for dd in 0..dv {
                            if let (Some(dst), Some(src)) = (
                                o.get_mut(((bi * sq + s) * hq + h) * dv + dd),
                                y.get(((bi * hq + h) * sq + s) * dv + dd),
                            ) {
                                *dst = *src;
                            }
                        }
                    }
                }
            }
            tensor_from_f64(ty, &[b, sq, hq * dv], o)?
        } else {
            tensor_from_f64(ty, &[b, hq, sq, dv], y)?
        };
        let mut outs = vec![y];
        if self.outputs > 1 {
            outs.push(tensor_from_f64(ty, &[b, hk, t, dq], k.v)?);
        }
        if self.outputs > 2 {
            outs.push(tensor_from_f64(ty, &[b, hk, t, dv], v.v)?);
        }
        if self.outputs > 3 {
            outs.push(tensor_from_f64(ty, &full, qk_out)?);
        }
        Ok(outs)
    }
}

fn build_attention(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let qk_mode = n.attr_int_or("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&qk_mode) {
        return Err(n.error(format_args!(
            "qk_matmul_output_mode must be 0..=3, got {qk_mode}"
        )));
    }
    let window = |name: &str| -> OpResult<Option<i64>> {
        match n.attr_int_or(name, -1)? {
            -1 => Ok(None),
            w if w >= 0 => Ok(Some(w)),
            w => Err(n.error(format_args!(
                "{name} must be -1 (unbounded) or a number of positions, got {w}"
            ))),
        }
    };
    let q_heads = n.attr_count("q_num_heads")?;
    let kv_heads = n.attr_count("kv_num_heads")?;
    let a = Attention {
        op: n.op_type.clone(),
        scale: n.attr_float("scale")?.map(f64::from),
        is_causal: n.attr_int_or("is_causal", 0)? != 0,
        q_heads,
        kv_heads,
        softcap: n.attr_float("softcap")?.map(f64::from),
        qk_mode,
        left_window: window("left_window_size")?,
        right_window: window("right_window_size")?,
        heads_only_for_3d: n.opset >= 28,
        outputs: n.num_outputs,
    };
    Ok(kernel(move |inputs| a.run(inputs)))
}

struct Rotary {
    op: String,
    interleaved: bool,
    rotary_dim: usize,
    num_heads: Option<usize>,
}

impl Rotary {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        let cos_t = input(op, inputs, 1)?;
        let sin_t = input(op, inputs, 2)?;
        let xs = x.shape().to_vec();
        // Work in [B, S, H, D] order.
        let (b, s, h, d, four_d) = match *xs.as_slice() {
            [b, h, s, d] => (b, s, h, d, true),
            [b, s, hd] => {
                let Some(h) = self.num_heads.filter(|&h| h > 0 && hd % h == 0) else {
                    bail!("{op}: 3-D input of shape {xs:?} needs num_heads dividing {hd}");
                };
                (b, s, h, hd / h, false)
            }
            _ => bail!("{op}: input must have rank 3 or 4, got shape {xs:?}"),
        };
        let rd = if self.rotary_dim == 0 {
            d
        } else {
            self.rotary_dim
        };
        if rd > d || rd % 2 != 0 {
            bail!("{op}: rotary_embedding_dim {rd} must be even and at most the head size {d}");
        }
        let half = rd / 2;
        let xv = float_values(op, "X", x)?;
        let cv = float_values(op, "cos_cache", cos_t)?;
        let sv = float_values(op, "sin_cache", sin_t)?;
        let cs = cos_t.shape().to_vec();
        if sin_t.shape() != cs.as_slice() {
            bail!(
                "{op}: cos_cache {cs:?} and sin_cache {:?} must have the same shape",
                sin_t.shape()
            );
        }
        let pos: Option<Vec<i64>> = match opt_input(inputs, 3) {
            Some(p) => {
                if p.shape() != [b, s] {
                    bail!(
                        "{op}: position_ids must have shape [{b}, {s}], got {:?}",
                        p.shape()
                    );
                }
                if cs.len() != 2 || cs[1] != half {
                    bail!(
                        "{op}: with position_ids the caches must have shape [max_pos, {half}], got {cs:?}"
                    );
                }
                Some(p.to_i64_vec(&format!("{op}: position_ids"))?)
            }
            None => {
                if cs != [b, s, half] {
                    bail!(
                        "{op}: without position_ids the caches must have shape [{b}, {s}, {half}], got {cs:?}"
                    );
                }
                None
            }
        };
        let idx = |bi: usize, hi: usize, si: usize, di: usize| {
            if four_d {
                ((bi * h + hi) * s + si) * d + di
            } else {
                ((bi * s + si) * h + hi) * d + di
            }
        };
        let mut y = xv.clone();
        for bi in 0..b {
            for si in 0..s {
                let row = match &pos {
                    Some(p) => {
                        let pi = p.get(bi * s + si).copied().unwrap_or(0);
                        match usize::try_from(pi).ok().filter(|&r| r < cs[0]) {
                            Some(r) => r,
                            None => bail!(
                                "{op}: position id {pi} is out of range for {} cache rows",
                                cs[0]
                            ),
                        }
                    }
                    None => bi * s + si,
                };
                for hi in 0..h {
                    for i in 0..half {
                        let (c, sn) = (
                            cv.get(row * half + i).copied().unwrap_or(0.0),
                            sv.get(row * half + i).copied().unwrap_or(0.0),
                        );
                        let (i1, i2) = if self.interleaved {
                            (2 * i, 2 * i + 1)
                        } else {
                            (i, i + half)
                        };
                        let (a1, a2) = (idx(bi, hi, si, i1), idx(bi, hi, si, i2));
                        let (x1, x2) = (
                            xv.get(a1).copied().unwrap_or(0.0),
                            xv.get(a2).copied().unwrap_or(0.0),
                        );
                        if let Some(o) = y.get_mut(a1) {
                            *o = x1 * c - x2 * sn;
                        }
                        if let Some(o) = y.get_mut(a2) {
                            *o = x2 * c + x1 * sn;
                        }
                    }
                }
            }
        }
        Ok(vec![tensor_from_f64(x.elem_type(), &xs, y)?])
    }
}

fn build_rotary(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let rd = n.attr_int_or("rotary_embedding_dim", 0)?;
    let r = Rotary {
        op: n.op_type.clone(),
        interleaved: n.attr_int_or("interleaved", 0)? != 0,
        rotary_dim: usize::try_from(rd)
            .map_err(|_| n.error(format_args!("rotary_embedding_dim must be >= 0, got {rd}")))?,
        num_heads: n.attr_count("num_heads")?,
    };
    Ok(kernel(move |inputs| r.run(inputs)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    fn vals(t: &Tensor) -> Vec<f32> {
        t.as_array::<f32>().unwrap().iter().copied().collect()
    }

    #[test]
    fn attention_basic_causal_and_errors() {
        // One head, d = 1: q = 1, keys 0 and ln(3) with scale 1 give weights 1/4, 3/4.
        let q = t(&[1, 1, 1, 1], vec![1.0]);
        let k = t(&[1, 1, 2, 1], vec![0.0, 3f32.ln()]);
        let v = t(&[1, 1, 2, 1], vec![4.0, 8.0]);
        let n = NodeDef::new("Attention", 23).with_io(3, 4);
        let o = run(
            n.clone(),
            vec![Some(q.clone()), Some(k.clone()), Some(v.clone())],
        )
        .unwrap();
        assert!((vals(&o[0])[0] - 7.0).abs() < 1e-5, "{:?}", vals(&o[0]));
        assert_eq!(o[1].shape(), &[1, 1, 2, 1]);
        assert_eq!(o[3].shape(), &[1, 1, 1, 2]);
        // Causal with one query position: only the first key is visible.
        let o = run(
            n.clone().with_attr("is_causal", AttrValue::Int(1)),
            vec![Some(q.clone()), Some(k.clone()), Some(v.clone())],
        )
        .unwrap();
        assert!((vals(&o[0])[0] - 4.0).abs() < 1e-5);
        // A boolean mask hiding the first key.
        let m = Tensor::from_vec(&[1, 2], vec![false, true]).unwrap();
        let o = run(
            n.clone(),
            vec![Some(q.clone()), Some(k.clone()), Some(v.clone()), Some(m)],
        )
        .unwrap();
        assert!((vals(&o[0])[0] - 8.0).abs() < 1e-5);
        let e = run(
            n.clone(),
            vec![
                Some(q.clone()),
                Some(t(&[1, 2, 1], vec![0.0; 2])),
                Some(v.clone()),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("must have the same type and rank"), "{e}");
        let e = run(
            n,
            vec![
                Some(t(&[1, 1, 2], vec![0.0; 2])),
                Some(t(&[1, 2, 2], vec![0.0; 4])),
                Some(t(&[1, 2, 2], vec![0.0; 4])),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("needs a head count attribute"), "{e}");
    }

    /// Three keys valued 1, 10, 100 and a query that weighs them alike: Y is the mean of the
    /// keys a row may see.
    fn three_keys() -> (Tensor, Tensor, Tensor) {
        let q = t(&[1, 1, 1, 1], vec![0.0]);
        let k = t(&[1, 1, 3, 1], vec![0.0; 3]);
        let v = t(&[1, 1, 3, 1], vec![1.0, 10.0, 100.0]);
        (q, k, v)
    }

    #[test]
    fn a_fully_masked_row_gives_zeros_not_nan() {
        let (q, k, v) = three_keys();
        let mask = Tensor::from_vec(&[1, 3], vec![false; 3]).unwrap();
        let n = NodeDef::new("Attention", 24)
            .with_io(4, 4)
            .with_attr("qk_matmul_output_mode", AttrValue::Int(3));
        let o = run(n, vec![Some(q), Some(k), Some(v), Some(mask)]).unwrap();
        assert_eq!(vals(&o[0]), vec![0.0]);
        assert_eq!(
            vals(&o[3]),
            vec![0.0; 3],
            "the softmax output of a masked row"
        );
    }

    #[test]
    fn causal_frontier_over_an_external_cache_follows_nonpad_kv_seqlen() {
        // One query over a cache of 3 slots, 2 valid: offset 2 - 1 = 1, so the query sees keys 0
        // and 1 (causal) and the padding mask hides key 2 anyway: mean of 1 and 10.
        let (q, k, v) = three_keys();
        let causal = NodeDef::new("Attention", 24)
            .with_io(7, 1)
            .with_attr("is_causal", AttrValue::Int(1));
        let lens = Tensor::from_vec(&[1], vec![2i64]).unwrap();
        let inputs = |lens: Tensor| {
            let (q, k, v) = three_keys();
            vec![Some(q), Some(k), Some(v), None, None, None, Some(lens)]
        };
        let o = run(causal.clone(), inputs(lens)).unwrap();
        assert!((vals(&o[0])[0] - 5.5).abs() < 1e-5, "{:?}", vals(&o[0]));
        // A valid length shorter than the query block: offset -1 masks the row entirely.
        let none = Tensor::from_vec(&[1], vec![0i64]).unwrap();
        assert_eq!(vals(&run(causal, inputs(none)).unwrap()[0]), vec![0.0]);
        // The cache length and past_key together are refused.
        let past = t(&[1, 1, 0, 1], vec![]);
        let n = NodeDef::new("Attention", 24).with_io(7, 1);
        let lens = Tensor::from_vec(&[1], vec![2i64]).unwrap();
        let err = run(
            n,
            vec![
                Some(q),
                Some(k),
                Some(v),
                None,
                Some(past.clone()),
                Some(past),
                Some(lens),
            ],
        )
        .unwrap_err();
        assert!(err.0.contains("cannot be combined"), "{err}");
    }

    #[test]
    fn sliding_windows_mask_keys_outside_them() {
        // Three queries over the three keys, no causality: with left_window_size 1 and
        // right_window_size 0 query i sees keys i-1 and i.
        let q = t(&[1, 1, 3, 1], vec![0.0; 3]);
        let (_, k, v) = three_keys();
        let n = NodeDef::new("Attention", 28)
            .with_io(3, 1)
            .with_attr("left_window_size", AttrValue::Int(1))
            .with_attr("right_window_size", AttrValue::Int(0));
        let o = run(n, vec![Some(q.clone()), Some(k.clone()), Some(v.clone())]).unwrap();
        let y = vals(&o[0]);
        for (got, want) in y.iter().zip([1.0, 5.5, 55.0]) {
            assert!((got - want).abs() < 1e-4, "{y:?}");
        }
        let bad = NodeDef::new("Attention", 28)
            .with_io(3, 1)
            .with_attr("left_window_size", AttrValue::Int(-2));
        assert!(crate::ops::registry().build(&bad).is_err());
        // Attention-25 refuses head counts for 4-D inputs; Attention-24 ignores them.
        let heads = |opset| {
            NodeDef::new("Attention", opset)
                .with_io(3, 1)
                .with_attr("q_num_heads", AttrValue::Int(1))
                .with_attr("kv_num_heads", AttrValue::Int(1))
        };
        let inputs = vec![Some(q), Some(k), Some(v)];
        assert!(run(heads(24), inputs.to_vec()).is_ok());
        let err = run(heads(28), inputs).unwrap_err();
        assert!(err.0.contains("3-D inputs"), "{err}");
    }

    #[test]
    fn rotary_rotates_pairs() {
        let x = t(&[1, 1, 1, 2], vec![1.0, 0.0]);
        let (c, s) = (0.0f32, 1.0f32);
        let n = NodeDef::new("RotaryEmbedding", 23);
        let o = run(
            n.clone(),
            vec![
                Some(x.clone()),
                Some(t(&[1, 1, 1], vec![c])),
                Some(t(&[1, 1, 1], vec![s])),
            ],
        )
        .unwrap();
        assert_eq!(vals(&o[0]), vec![0.0, 1.0]);
        let e = run(
            n.clone(),
            vec![
                Some(x.clone()),
                Some(t(&[1, 1], vec![c])),
                Some(t(&[1, 1], vec![s])),
                Some(Tensor::from_vec(&[1, 1], vec![5i64]).unwrap()),
            ],
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            "RotaryEmbedding: position id 5 is out of range for 1 cache rows"
        );
        let e = run(
            n,
            vec![Some(t(&[2], vec![0.0; 2])), Some(x.clone()), Some(x)],
        )
        .unwrap_err();
        assert!(e.0.contains("input must have rank 3 or 4"), "{e}");
    }
}
