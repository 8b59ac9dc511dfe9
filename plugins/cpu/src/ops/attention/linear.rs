//! The stateful layers of linear-attention and state-space language models (opset 27):
//! LinearAttention (the linear, gated, delta and gated-delta recurrences, grouped KV heads) and
//! CausalConvWithState (a depthwise causal 1-D convolution that carries its last inputs).
//!
//! Both accumulate in f32, as ONNX's reference does, and return the input's float type.

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::OpResult;
use crate::kernel::add;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::Tensor;

pub fn register(reg: &mut Registry) {
    add(reg, "LinearAttention", 27, build_linear_attention);
    add(reg, "CausalConvWithState", 27, build_causal_conv);
}

fn f32s(op: &str, what: &str, t: &crate::tensor::TensorRef<'_>) -> OpResult<Vec<f32>> {
    Ok(float_values(op, what, t)?
        .into_iter()
        .map(|v| v as f32)
        .collect())
}

fn out(ty: epx_plugin_api::ElementType, shape: &[usize], v: Vec<f32>) -> OpResult<Tensor> {
    tensor_from_f64(ty, shape, v.into_iter().map(f64::from).collect())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Rule {
    Linear,
    Gated,
    Delta,
    GatedDelta,
}

fn build_linear_attention(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let rule = match n.attr_string_or("update_rule", "gated_delta")?.as_str() {
        "linear" => Rule::Linear,
        "gated" => Rule::Gated,
        "delta" => Rule::Delta,
        "gated_delta" => Rule::GatedDelta,
        other => {
            return Err(n.error(format_args!(
                "update_rule `{other}` is not one of linear, gated, delta, gated_delta"
            )));
        }
    };
    let hq = n.req_int("q_num_heads")?;
    let hkv = n.req_int("kv_num_heads")?;
    if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
        return Err(n.error(format_args!(
            "q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})"
        )));
    }
    let (hq, hkv) = (hq as usize, hkv as usize);
    let scale_attr = n.attr_float("scale")?.filter(|&s| s != 0.0);
    let gating = matches!(rule, Rule::Gated | Rule::GatedDelta);
    let delta = matches!(rule, Rule::Delta | Rule::GatedDelta);
    Ok(kernel(move |inputs| {
        let q = input(&op, inputs, 0)?;
        let k = input(&op, inputs, 1)?;
        let v = input(&op, inputs, 2)?;
        let past = opt_input(inputs, 3);
        let decay = opt_input(inputs, 4);
        let beta = opt_input(inputs, 5);
        if gating != decay.is_some() {
            bail!(
                "{op}: this update_rule {} the decay input",
                if gating { "needs" } else { "forbids" }
            );
        }
        if delta != beta.is_some() {
            bail!(
                "{op}: this update_rule {} the beta input",
                if delta { "needs" } else { "forbids" }
            );
        }
        for (name, t) in [("query", q), ("key", k), ("value", v)] {
            if t.ndim() != 3 {
                bail!(
                    "{op}: {name} must be rank 3 (B, T, H*D), got {:?}",
                    t.shape()
                );
            }
        }
        let (b, t) = (q.shape()[0], q.shape()[1]);
        if q.shape()[2] % hq != 0 || k.shape()[2] % hkv != 0 || v.shape()[2] % hkv != 0 {
            bail!(
                "{op}: the last dims of query {:?}, key {:?} and value {:?} must split into {hq}, {hkv} and {hkv} heads",
                q.shape(),
                k.shape(),
                v.shape()
            );
        }
        let dk = q.shape()[2] / hq;
        let dv = v.shape()[2] / hkv;
        if k.shape() != [b, t, hkv * dk] || v.shape()[..2] != [b, t] {
            bail!(
                "{op}: key {:?} and value {:?} must be [{b}, {t}, {hkv}*d] like query {:?}",
                k.shape(),
                v.shape(),
                q.shape()
            );
        }
        let group = hq / hkv;
        let qv = f32s(&op, "query", q)?;
        let kv = f32s(&op, "key", k)?;
        let vv = f32s(&op, "value", v)?;
        // Decay: per KV head (last dim hkv) or per key dim (hkv * dk); beta: per head or one.
        let dv_ = match decay {
            Some(d) => {
                let last = d.shape().last().copied().unwrap_or(0);
                if d.ndim() != 3 || d.shape()[..2] != [b, t] || (last != hkv && last != hkv * dk) {
                    bail!(
                        "{op}: decay of shape {:?} must be [{b}, {t}, {hkv}] or [{b}, {t}, {}]",
                        d.shape(),
                        hkv * dk
                    );
                }
                Some((f32s(&op, "decay", d)?, last))
            }
            None => None,
        };
        let beta_ = match beta {
            Some(bt) => {
                let last = bt.shape().last().copied().unwrap_or(0);
                if bt.ndim() != 3 || bt.shape()[..2] != [b, t] || (last != hkv && last != 1) {
                    bail!(
                        "{op}: beta of shape {:?} must be [{b}, {t}, {hkv}] or [{b}, {t}, 1]",
                        bt.shape()
                    );
                }
                Some((f32s(&op, "beta", bt)?, last))
            }
            None => None,
        };
        let state_len = b * hkv * dk * dv;
        let (mut state, state_ty) = match past {
            Some(p) => {
                if p.shape() != [b, hkv, dk, dv] {
                    bail!(
                        "{op}: past_state of shape {:?} must be [{b}, {hkv}, {dk}, {dv}]",
                        p.shape()
                    );
                }
                (f32s(&op, "past_state", p)?, p.elem_type())
            }
            None => (vec![0f32; state_len], q.elem_type()),
        };
        let scale = scale_attr.unwrap_or(1.0 / (dk as f32).sqrt());
        let mut o = vec![0f32; b * t * hq * dv];
        let mut retrieved = vec![0f32; dv];
        let mut vt = vec![0f32; dv];
        for bi in 0..b {
            for ti in 0..t {
                let row = bi * t + ti;
                for h in 0..hkv {
                    let s = &mut state[((bi * hkv + h) * dk) * dv..((bi * hkv + h + 1) * dk) * dv];
                    let kt = &kv[(row * hkv + h) * dk..(row * hkv + h + 1) * dk];
                    vt.copy_from_slice(&vv[(row * hkv + h) * dv..(row * hkv + h + 1) * dv]);
                    if let Some((d, last)) = &dv_ {
                        for di in 0..dk {
                            let g = if *last == hkv {
                                d[row * hkv + h]
                            } else {
                                d[(row * hkv + h) * dk + di]
                            };
                            let f = g.exp();
                            s[di * dv..(di + 1) * dv].iter_mut().for_each(|x| *x *= f);
                        }
                    }
                    if let Some((bv, last)) = &beta_ {
                        let bt = bv[row * last + if *last == 1 { 0 } else { h }];
                        retrieved.fill(0.0);
                        for (di, &kd) in kt.iter().enumerate() {
                            for (r, &sv) in retrieved.iter_mut().zip(&s[di * dv..(di + 1) * dv]) {
                                *r += sv * kd;
                            }
                        }
                        for (x, r) in vt.iter_mut().zip(&retrieved) {
                            *x = bt * (*x - r);
                        }
                    }
                    for (di, &kd) in kt.iter().enumerate() {
                        for (sv, &x) in s[di * dv..(di + 1) * dv].iter_mut().zip(&vt) {
                            *sv += kd * x;
                        }
                    }
                    for g in 0..group {
                        let hh = h * group + g;
                        let qt = &qv[(row * hq + hh) * dk..(row * hq + hh + 1) * dk];
                        let ot = &mut o[(row * hq + hh) * dv..(row * hq + hh + 1) * dv];
                        for (di, &qd) in qt.iter().enumerate() {
                            for (x, &sv) in ot.iter_mut().zip(&s[di * dv..(di + 1) * dv]) {
                                *x += qd * sv;
                            }
                        }
                        ot.iter_mut().for_each(|x| *x *= scale);
                    }
                }
            }
        }
        Ok(vec![
            out(q.elem_type(), &[b, t, hq * dv], o)?,
            out(state_ty, &[b, hkv, dk, dv], state)?,
        ])
    }))
}

fn build_causal_conv(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let silu = match n.attr_string_or("activation", "none")?.as_str() {
        "none" => false,
        "silu" | "swish" => true,
        other => {
            return Err(n.error(format_args!(
                "activation `{other}` is not one of none, silu, swish"
            )));
        }
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let w = input(&op, inputs, 1)?;
        let bias = opt_input(inputs, 2);
        let past = opt_input(inputs, 3);
        if x.ndim() != 3 {
            bail!("{op}: input must be rank 3 (B, C, L), got {:?}", x.shape());
        }
        let (b, c, l) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        if w.ndim() != 3 || w.shape()[0] != c || w.shape()[1] != 1 || w.shape()[2] == 0 {
            bail!(
                "{op}: weight of shape {:?} must be [{c}, 1, k] with k >= 1",
                w.shape()
            );
        }
        let k = w.shape()[2];
        let xv = f32s(&op, "input", x)?;
        let wv = f32s(&op, "weight", w)?;
        let bv = match bias {
            Some(t) if t.shape() == [c] => f32s(&op, "bias", t)?,
            Some(t) => bail!("{op}: bias of shape {:?} must be [{c}]", t.shape()),
            None => vec![0.0; c],
        };
        let pv = match past {
            Some(t) if t.shape() == [b, c, k - 1] => f32s(&op, "past_state", t)?,
            Some(t) => bail!(
                "{op}: past_state of shape {:?} must be [{b}, {c}, {}]",
                t.shape(),
                k - 1
            ),
            None => vec![0.0; b * c * (k - 1)],
        };
        let span = l + k - 1;
        let mut y = vec![0f32; b * c * l];
        let mut state = vec![0f32; b * c * (k - 1)];
        let mut padded = vec![0f32; span];
        for bc in 0..b * c {
            let ch = bc % c;
            padded[..k - 1].copy_from_slice(&pv[bc * (k - 1)..(bc + 1) * (k - 1)]);
            padded[k - 1..].copy_from_slice(&xv[bc * l..(bc + 1) * l]);
            let wk = &wv[ch * k..(ch + 1) * k];
            for (ti, o) in y[bc * l..(bc + 1) * l].iter_mut().enumerate() {
                let acc = bv[ch]
                    + wk.iter()
                        .zip(&padded[ti..ti + k])
                        .map(|(a, p)| a * p)
                        .sum::<f32>();
                *o = if silu {
                    acc / (1.0 + (-acc).exp())
                } else {
                    acc
                };
            }
            state[bc * (k - 1)..(bc + 1) * (k - 1)].copy_from_slice(&padded[span - (k - 1)..]);
        }
        Ok(vec![
            out(x.elem_type(), &[b, c, l], y)?,
            out(x.elem_type(), &[b, c, k - 1], state)?,
        ])
    }))
}
