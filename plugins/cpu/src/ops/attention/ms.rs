//! ONNX Runtime's attention operators for transformer exports: Attention (BERT's, with packed
//! QKV weights), MultiHeadAttention, RotaryEmbedding and EmbedLayerNormalization, in the
//! `com.microsoft` domain. Each prepares its inputs and runs the CPU EP's ONNX kernels
//! (Attention 23, RotaryEmbedding 23, LayerNormalization 17), so the two families cannot give
//! different answers.

use epx_plugin_api::ElementType;

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::add_ms;
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add_ms(reg, "MultiHeadAttention", build_mha);
    add_ms(reg, "Attention", build_bert_attention);
    add_ms(reg, "RotaryEmbedding", build_rotary);
    add_ms(reg, "EmbedLayerNormalization", build_embed_layer_norm);
    add_ms(reg, "GroupQueryAttention", build_gqa);
}

fn f32_values(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<Vec<f32>> {
    match t.elem_type() {
        ElementType::Float | ElementType::Float16 | ElementType::Bfloat16 | ElementType::Double => {
            Ok(t.to_f64_vec().into_iter().map(|v| v as f32).collect())
        }
        other => bail!("{op}: {what} must be a float tensor, got {other}"),
    }
}

/// The additive mask `[B, 1, 1, L]` of a key padding mask: `[B, L]` of 1 (attend) / 0 (skip),
/// or `[B]` lengths (keys from the length on are skipped).
fn padding_mask(
    op: &str,
    m: &TensorRef<'_>,
    b: usize,
    l: usize,
    filter: f32,
) -> OpResult<Vec<f32>> {
    let v = m.to_i64_vec(&format!("{op}: mask"))?;
    match *m.shape() {
        [bb, ll] if bb == b && ll == l => Ok(v
            .iter()
            .map(|&x| if x == 0 { filter } else { 0.0 })
            .collect()),
        [bb] if bb == b => Ok((0..b * l)
            .map(|i| {
                if (i % l) as i64 >= v[i / l] {
                    filter
                } else {
                    0.0
                }
            })
            .collect()),
        ref s => bail!("{op}: a mask of shape {s:?} is not supported (only [{b}, {l}] or [{b}])"),
    }
}

/// `a + b` for masks broadcast to `[B, H', S, L]` (`a` is `[B, 1, 1, L]`).
fn combine_masks(
    op: &str,
    pad: Option<Vec<f32>>,
    bias: Option<&TensorRef<'_>>,
    dims: (usize, usize, usize, usize),
) -> OpResult<Option<Tensor>> {
    let (b, h, s, l) = dims;
    let bias = match bias {
        Some(t) => {
            let sh = t.shape();
            let ok = sh.len() == 4
                && (sh[0] == 1 || sh[0] == b)
                && (sh[1] == 1 || sh[1] == h)
                && sh[2] == s
                && sh[3] == l;
            if !ok {
                bail!(
                    "{op}: attention_bias of shape {sh:?} does not broadcast to [{b}, {h}, {s}, {l}]"
                );
            }
            Some((f32_values(op, "attention_bias", t)?, sh[0], sh[1]))
        }
        None => None,
    };
    Ok(match (pad, bias) {
        (None, None) => None,
        (Some(p), None) => Some(Tensor::from_vec(&[b, 1, 1, l], p)?),
        (pad, Some((bv, bb, bh))) => {
            let mut out = vec![0f32; b * bh * s * l];
            for bi in 0..b {
                for hi in 0..bh {
                    for si in 0..s {
                        for li in 0..l {
                            let src = ((if bb == 1 { 0 } else { bi } * bh + hi) * s + si) * l + li;
                            let p = pad.as_ref().map_or(0.0, |p| p[bi * l + li]);
                            out[((bi * bh + hi) * s + si) * l + li] = bv[src] + p;
                        }
                    }
                }
            }
            Some(Tensor::from_vec(&[b, bh, s, l], out)?)
        }
    })
}

fn attention_kernel(n: &NodeDef, heads: usize, outputs: usize) -> OpResult<Box<dyn OpKernel>> {
    let mut attrs = vec![
        ("q_num_heads", AttrValue::Int(heads as i64)),
        ("kv_num_heads", AttrValue::Int(heads as i64)),
        (
            "is_causal",
            AttrValue::Int(n.attr_int_or("unidirectional", 0)?),
        ),
    ];
    if let Some(s) = n.attr_float("scale")?.filter(|&s| s != 0.0) {
        attrs.push(("scale", AttrValue::Float(s)));
    }
    crate::kernel::build_part(n, "Attention", 23, attrs, 6, outputs)
}

struct Mha {
    op: String,
    heads: usize,
    filter: f32,
    attention: Box<dyn OpKernel>,
}

/// MultiHeadAttention `(query, key, value, bias, key_padding_mask, attention_bias, past_key,
/// past_value)` with 3-D query, key and value.
fn build_mha(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let heads = n.req_count("num_heads")?;
    Ok(Box::new(Mha {
        op: n.op_type.clone(),
        heads,
        filter: n.attr_float_or("mask_filter_value", -10000.0)?,
        attention: attention_kernel(n, heads, n.num_outputs.clamp(1, 3))?,
    }))
}

impl OpKernel for Mha {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let q = input(op, inputs, 0)?;
        let (Some(k), Some(v)) = (opt_input(inputs, 1), opt_input(inputs, 2)) else {
            bail!("{op}: packed QKV (no key and value inputs) is not supported");
        };
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        if qs.len() != 3 || ks.len() != 3 || vs.len() != 3 {
            bail!("{op}: query, key and value must be 3-D, got {qs:?}, {ks:?}, {vs:?}");
        }
        let (b, s, d, l, dv) = (qs[0], qs[1], qs[2], ks[1], vs[2]);
        let mut qv = f32_values(op, "query", q)?;
        let mut kv = f32_values(op, "key", k)?;
        let mut vv = f32_values(op, "value", v)?;
        if let Some(bias) = opt_input(inputs, 3) {
            let bias = f32_values(op, "bias", bias)?;
            if bias.len() != 2 * d + dv {
                bail!(
                    "{op}: bias has {} values, {} needed",
                    bias.len(),
                    2 * d + dv
                );
            }
            let add = |x: &mut [f32], part: &[f32]| {
                for row in x.chunks_mut(part.len()) {
                    row.iter_mut().zip(part).for_each(|(a, b)| *a += b);
                }
            };
            add(&mut qv, &bias[..d]);
            add(&mut kv, &bias[d..2 * d]);
            add(&mut vv, &bias[2 * d..]);
        }
        let past = opt_input(inputs, 6).map(|p| p.shape().get(2).copied().unwrap_or(0));
        let total = l + past.unwrap_or(0);
        let pad = match opt_input(inputs, 4) {
            Some(m) => Some(padding_mask(op, m, b, total, self.filter)?),
            None => None,
        };
        let mask = combine_masks(op, pad, opt_input(inputs, 5), (b, self.heads, s, total))?;
        let (q, k, v) = (
            Tensor::from_vec(qs, qv)?,
            Tensor::from_vec(ks, kv)?,
            Tensor::from_vec(vs, vv)?,
        );
        let ty = inputs[0]
            .as_ref()
            .map_or(ElementType::Float, |t| t.elem_type());
        let mut past_k = opt_input(inputs, 6)
            .map(|t| t.cast(ElementType::Float))
            .transpose()?;
        let mut past_v = opt_input(inputs, 7)
            .map(|t| t.cast(ElementType::Float))
            .transpose()?;
        let args = [
            Some(q.view()),
            Some(k.view()),
            Some(v.view()),
            mask.as_ref().map(Tensor::view),
            past_k.as_mut().map(|t| t.view()),
            past_v.as_mut().map(|t| t.view()),
        ];
        let out = self.attention.run(&args)?;
        out.into_iter().map(|t| t.view().cast(ty)).collect()
    }
}

struct BertAttention {
    op: String,
    heads: usize,
    sizes: Option<[usize; 3]>,
    filter: f32,
    matmul: Box<dyn OpKernel>,
    attention: Box<dyn OpKernel>,
}

/// Attention `(input, weights, bias, mask_index, past, attention_bias)`: Q, K and V from one
/// packed projection, then multi-head attention.
fn build_bert_attention(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let heads = n.req_count("num_heads")?;
    if n.attr_int_or("do_rotary", 0)? != 0 {
        return Err(n.error("do_rotary=1 is not supported"));
    }
    let sizes = match n.attr_ints("qkv_hidden_sizes")? {
        Some(v) if v.len() == 3 && v.iter().all(|&x| x > 0) => {
            Some([v[0] as usize, v[1] as usize, v[2] as usize])
        }
        Some(v) => {
            return Err(n.error(format_args!(
                "qkv_hidden_sizes {v:?} must be 3 positive sizes"
            )));
        }
        None => None,
    };
    Ok(Box::new(BertAttention {
        op: n.op_type.clone(),
        heads,
        sizes,
        filter: n.attr_float_or("mask_filter_value", -10000.0)?,
        matmul: crate::kernel::build_part(n, "MatMul", 13, Vec::new(), 2, 1)?,
        attention: attention_kernel(n, heads, 1)?,
    }))
}

impl OpKernel for BertAttention {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        if opt_input(inputs, 4).is_some() {
            bail!(
                "{op}: the past input is not supported; use MultiHeadAttention's past_key/past_value"
            );
        }
        let ty = x.elem_type();
        let x32 = x.cast(ElementType::Float)?;
        let w32 = input(op, inputs, 1)?.cast(ElementType::Float)?;
        let [b, s, _] = *x.shape() else {
            bail!(
                "{op}: input must be [batch, sequence, hidden], got {:?}",
                x.shape()
            );
        };
        let total = w32.shape().get(1).copied().unwrap_or(0);
        let [dq, dk, dv] = self.sizes.unwrap_or([total / 3; 3]);
        if dq + dk + dv != total || dq != dk {
            bail!("{op}: weights of {total} columns do not split into Q, K, V of {dq}, {dk}, {dv}");
        }
        let proj = self
            .matmul
            .run(&[Some(x32.view()), Some(w32.view())])?
            .remove(0);
        let mut p = f32_values(op, "projection", &proj.view())?;
        if let Some(bias) = opt_input(inputs, 2) {
            let bias = f32_values(op, "bias", bias)?;
            if bias.len() != total {
                bail!("{op}: bias has {} values for {total} columns", bias.len());
            }
            for row in p.chunks_mut(total) {
                row.iter_mut().zip(&bias).for_each(|(a, c)| *a += c);
            }
        }
        let split = |from: usize, width: usize| -> OpResult<Tensor> {
            let v: Vec<f32> = p
                .chunks(total)
                .flat_map(|row| row[from..from + width].iter().copied())
                .collect();
            Tensor::from_vec(&[b, s, width], v)
        };
        let (q, k, v) = (split(0, dq)?, split(dq, dk)?, split(dq + dk, dv)?);
        let pad = match opt_input(inputs, 3) {
            Some(m) if m.ndim() == 3 => {
                // [B, S, L] of 1 / 0.
                let mv = m.to_i64_vec(&format!("{op}: mask_index"))?;
                if m.shape() != [b, s, s] {
                    bail!(
                        "{op}: a 3-D mask_index must be [{b}, {s}, {s}], got {:?}",
                        m.shape()
                    );
                }
                let add: Vec<f32> = mv
                    .iter()
                    .map(|&x| if x == 0 { self.filter } else { 0.0 })
                    .collect();
                let t = Tensor::from_vec(&[b, 1, s, s], add)?;
                let bias = opt_input(inputs, 5)
                    .map(|t| t.cast(ElementType::Float))
                    .transpose()?;
                let joined = match bias {
                    Some(bt) => {
                        let add = reference_kernel_add(op)?;
                        add.run(&[Some(t.view()), Some(bt.view())])?.remove(0)
                    }
                    None => t,
                };
                let out = self.attention.run(&[
                    Some(q.view()),
                    Some(k.view()),
                    Some(v.view()),
                    Some(joined.view()),
                    None,
                    None,
                ])?;
                return out.into_iter().map(|t| t.view().cast(ty)).collect();
            }
            Some(m) => Some(padding_mask(op, m, b, s, self.filter)?),
            None => None,
        };
        let mask = combine_masks(op, pad, opt_input(inputs, 5), (b, self.heads, s, s))?;
        let out = self.attention.run(&[
            Some(q.view()),
            Some(k.view()),
            Some(v.view()),
            mask.as_ref().map(Tensor::view),
            None,
            None,
        ])?;
        out.into_iter().map(|t| t.view().cast(ty)).collect()
    }
}

fn reference_kernel_add(op: &str) -> OpResult<Box<dyn OpKernel>> {
    crate::kernel::installed_registry()?
        .build(&NodeDef::new("Add", 14).with_io(2, 1))
        .map_err(|e| OpError(format!("{op}: {e}")))
}

struct MsRotary {
    op: String,
    rotary: Box<dyn OpKernel>,
}

/// RotaryEmbedding `(input, position_ids, cos_cache, sin_cache)`: ONNX's RotaryEmbedding with
/// its inputs reordered; a one-element position_ids is the first position of every sequence.
fn build_rotary(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut attrs = Vec::new();
    for name in ["interleaved", "num_heads", "rotary_embedding_dim"] {
        if let Some(v) = n.attributes.get(name) {
            attrs.push((name, v.clone()));
        }
    }
    if n.attr_int_or("is_packed_batching", 0)? != 0 {
        return Err(n.error("is_packed_batching=1 is not supported"));
    }
    Ok(Box::new(MsRotary {
        op: n.op_type.clone(),
        rotary: crate::kernel::build_part(n, "RotaryEmbedding", 23, attrs, 4, 1)?,
    }))
}

impl OpKernel for MsRotary {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        let pos = input(op, inputs, 1)?;
        let (b, s) = match *x.shape() {
            [b, s, _] => (b, s),
            [b, _, s, _] => (b, s),
            ref sh => bail!("{op}: input must be 3-D or 4-D, got {sh:?}"),
        };
        let pv = pos.to_i64_vec(&format!("{op}: position_ids"))?;
        let ids: Vec<i64> = if pv.len() == 1 {
            (0..b * s).map(|i| pv[0] + (i % s) as i64).collect()
        } else if pv.len() == b * s {
            pv
        } else {
            bail!(
                "{op}: position_ids of shape {:?} is not [{b}, {s}] or [1]",
                pos.shape()
            );
        };
        let ids = Tensor::from_vec(&[b, s], ids)?;
        self.rotary.run(&[
            Some(x.reborrow()),
            opt_input(inputs, 2).map(TensorRef::reborrow),
            opt_input(inputs, 3).map(TensorRef::reborrow),
            Some(ids.view()),
        ])
    }
}

struct EmbedLayerNorm {
    op: String,
    outputs: usize,
    norm: Box<dyn OpKernel>,
}

/// EmbedLayerNormalization `(input_ids, segment_ids, word_embedding, position_embedding,
/// segment_embedding, gamma, beta, mask, position_ids)`: the sum of the three embeddings,
/// layer-normalized; the mask's row sums as `mask_index`; the sum itself as `embedding_sum`.
fn build_embed_layer_norm(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let eps = n.attr_float_or("epsilon", 1e-12)?;
    Ok(Box::new(EmbedLayerNorm {
        op: n.op_type.clone(),
        outputs: n.num_outputs.clamp(1, 3),
        norm: crate::kernel::build_part(
            n,
            "LayerNormalization",
            17,
            vec![
                ("axis", AttrValue::Int(-1)),
                ("epsilon", AttrValue::Float(eps)),
            ],
            3,
            1,
        )?,
    }))
}

impl OpKernel for EmbedLayerNorm {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let ids = input(op, inputs, 0)?;
        let [b, s] = *ids.shape() else {
            bail!(
                "{op}: input_ids must be [batch, sequence], got {:?}",
                ids.shape()
            );
        };
        let word = input(op, inputs, 2)?;
        let posemb = input(op, inputs, 3)?;
        let h = word.shape().last().copied().unwrap_or(0);
        let table = |t: &TensorRef<'_>, what: &str| -> OpResult<(Vec<f32>, usize)> {
            if t.ndim() != 2 || t.shape()[1] != h {
                bail!("{op}: {what} must be [rows, {h}], got {:?}", t.shape());
            }
            Ok((f32_values(op, what, t)?, t.shape()[0]))
        };
        let (wv, wrows) = table(word, "word_embedding")?;
        let (pv, prows) = table(posemb, "position_embedding")?;
        let seg = match (opt_input(inputs, 1), opt_input(inputs, 4)) {
            (Some(ids), Some(t)) => Some((
                ids.to_i64_vec(&format!("{op}: segment_ids"))?,
                table(t, "segment_embedding")?,
            )),
            _ => None,
        };
        let idv = ids.to_i64_vec(&format!("{op}: input_ids"))?;
        let positions: Vec<i64> = match opt_input(inputs, 8) {
            Some(p) => {
                let v = p.to_i64_vec(&format!("{op}: position_ids"))?;
                if v.len() == s {
                    (0..b * s).map(|i| v[i % s]).collect()
                } else if v.len() == b * s {
                    v
                } else {
                    bail!(
                        "{op}: position_ids of shape {:?} is not [{b}, {s}] or [1, {s}]",
                        p.shape()
                    );
                }
            }
            None => (0..b * s).map(|i| (i % s) as i64).collect(),
        };
        let row = |rows: usize, i: i64, what: &str| -> OpResult<std::ops::Range<usize>> {
            let i = usize::try_from(i)
                .ok()
                .filter(|&i| i < rows)
                .ok_or_else(|| {
                    OpError(format!(
                        "{op}: {what} {i} is outside the table's {rows} rows"
                    ))
                })?;
            Ok(i * h..(i + 1) * h)
        };
        let mut sum = vec![0f32; b * s * h];
        for t in 0..b * s {
            let out = &mut sum[t * h..(t + 1) * h];
            let w = row(wrows, idv[t], "input id")?;
            let p = row(prows, positions[t], "position")?;
            for ((o, a), c) in out.iter_mut().zip(&wv[w]).zip(&pv[p]) {
                *o = a + c;
            }
            if let Some((sids, (sv, srows))) = &seg {
                let r = row(*srows, sids[t], "segment id")?;
                for (o, c) in out.iter_mut().zip(&sv[r]) {
                    *o += c;
                }
            }
        }
        let sum = Tensor::from_vec(&[b, s, h], sum)?;
        let normed = self
            .norm
            .run(&[
                Some(sum.view()),
                opt_input(inputs, 5).map(TensorRef::reborrow),
                opt_input(inputs, 6).map(TensorRef::reborrow),
            ])?
            .remove(0);
        let mask_index: Vec<i32> = match opt_input(inputs, 7) {
            Some(m) => {
                let mv = m.to_i64_vec(&format!("{op}: mask"))?;
                if mv.len() != b * s {
                    bail!("{op}: mask of shape {:?} is not [{b}, {s}]", m.shape());
                }
                mv.chunks(s.max(1))
                    .map(|r| r.iter().sum::<i64>() as i32)
                    .collect()
            }
            None => vec![0; b],
        };
        let ty = word.elem_type();
        let mut out = vec![normed.view().cast(ty)?, Tensor::from_vec(&[b], mask_index)?];
        if self.outputs > 2 {
            out.push(sum.view().cast(ty)?);
        }
        out.truncate(self.outputs);
        Ok(out)
    }
}

struct Gqa {
    op: String,
    heads: usize,
    kv_heads: usize,
    scale: Option<f32>,
    window: i64,
    softcap: f32,
    /// RotaryEmbedding kernels for the query and key heads (`do_rotary`).
    rotary: Option<(Box<dyn OpKernel>, Box<dyn OpKernel>)>,
}

/// GroupQueryAttention `(query, key, value, past_key, past_value, seqlens_k,
/// total_sequence_length, cos_cache, sin_cache)`: causal attention of grouped KV heads over a
/// KV cache, each sequence of the batch `seqlens_k[b] + 1` tokens long in total; the new keys
/// and values are written into the cache at the end of each sequence's past.
fn build_gqa(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let heads = n.req_count("num_heads")?;
    let kv_heads = usize::try_from(n.req_int("kv_num_heads")?)
        .ok()
        .filter(|&k| k > 0 && heads % k == 0)
        .ok_or_else(|| n.error("kv_num_heads must be a positive divisor of num_heads"))?;
    if n.attr_int_or("smooth_softmax", 0)? != 0 {
        return Err(n.error("smooth_softmax=1 is not supported"));
    }
    let rotary = if n.attr_int_or("do_rotary", 0)? != 0 {
        let interleaved = AttrValue::Int(n.attr_int_or("rotary_interleaved", 0)?);
        let make = |h: usize| {
            crate::kernel::build_part(
                n,
                "RotaryEmbedding",
                23,
                vec![
                    ("interleaved", interleaved.clone()),
                    ("num_heads", AttrValue::Int(h as i64)),
                ],
                4,
                1,
            )
        };
        Some((make(heads)?, make(kv_heads)?))
    } else {
        None
    };
    Ok(Box::new(Gqa {
        op: n.op_type.clone(),
        heads,
        kv_heads,
        scale: n.attr_float("scale")?.filter(|&s| s != 0.0),
        window: n.attr_int_or("local_window_size", -1)?,
        softcap: n.attr_float_or("softcap", 0.0)?,
        rotary,
    }))
}

impl OpKernel for Gqa {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let op = &self.op;
        let q_in = input(op, inputs, 0)?;
        let [b, s, _] = *q_in.shape() else {
            bail!(
                "{op}: query must be [batch, sequence, hidden], got {:?}",
                q_in.shape()
            );
        };
        let ty = q_in.elem_type();
        let (heads, kvh) = (self.heads, self.kv_heads);
        // Q, K, V as f32, [B, S, heads·hd] / [B, S, kv·hd]; packed QKV when key is absent.
        let (mut q, mut k, v, hd) = match (opt_input(inputs, 1), opt_input(inputs, 2)) {
            (Some(k), Some(v)) => {
                let d = q_in.shape()[2];
                if d % heads != 0 {
                    bail!("{op}: query width {d} does not split into {heads} heads");
                }
                let hd = d / heads;
                if k.shape() != [b, s, kvh * hd] || v.shape() != [b, s, kvh * hd] {
                    bail!(
                        "{op}: key {:?} and value {:?} must be [{b}, {s}, {}]",
                        k.shape(),
                        v.shape(),
                        kvh * hd
                    );
                }
                (
                    f32_values(op, "query", q_in)?,
                    f32_values(op, "key", k)?,
                    f32_values(op, "value", v)?,
                    hd,
                )
            }
            _ => {
                let d = q_in.shape()[2];
                if d % (heads + 2 * kvh) != 0 {
                    bail!("{op}: packed QKV width {d} does not split into {heads}+2×{kvh} heads");
                }
                let hd = d / (heads + 2 * kvh);
                let all = f32_values(op, "packed QKV", q_in)?;
                let part = |from: usize, w: usize| -> Vec<f32> {
                    all.chunks(d)
                        .flat_map(|r| r[from..from + w].iter().copied())
                        .collect()
                };
                (
                    part(0, heads * hd),
                    part(heads * hd, kvh * hd),
                    part((heads + kvh) * hd, kvh * hd),
                    hd,
                )
            }
        };
        let seqlens = input(op, inputs, 5)?.to_i64_vec(&format!("{op}: seqlens_k"))?;
        if seqlens.len() != b {
            bail!(
                "{op}: seqlens_k has {} values for a batch of {b}",
                seqlens.len()
            );
        }
        let total_len =
            crate::ops::util::args::scalar_i64(op, "total_sequence_length", input(op, inputs, 6)?)?;
        let total_len = usize::try_from(total_len)
            .map_err(|_| OpError(format!("{op}: negative total_sequence_length")))?;
        let past_k = opt_input(inputs, 3);
        let past_buf = past_k.map_or(0, |p| p.shape().get(2).copied().unwrap_or(0));
        if let Some(p) = past_k
            && (p.ndim() != 4 || p.shape()[0] != b || p.shape()[1] != kvh || p.shape()[3] != hd)
        {
            bail!(
                "{op}: past_key of shape {:?} is not [{b}, {kvh}, past, {hd}]",
                p.shape()
            );
        }
        let present_len = past_buf.max(total_len);
        // The first prompt fills every sequence from position 0 (right-padded to S).
        let first_prompt = total_len == s;
        let past_of = |bi: usize| -> OpResult<usize> {
            let total = usize::try_from(seqlens[bi] + 1)
                .map_err(|_| OpError(format!("{op}: seqlens_k[{bi}] is negative")))?;
            if first_prompt {
                return Ok(0);
            }
            total.checked_sub(s).ok_or_else(|| {
                OpError(format!(
                    "{op}: sequence {bi} is {total} tokens long, shorter than the {s} new ones"
                ))
            })
        };
        let mut pasts = Vec::with_capacity(b);
        for bi in 0..b {
            let p = past_of(bi)?;
            if p + s > present_len {
                bail!(
                    "{op}: sequence {bi} needs {} cache positions, the cache has {present_len}",
                    p + s
                );
            }
            pasts.push(p);
        }
        if let Some((rq, rk)) = &self.rotary {
            let pos: Vec<i64> = (0..b * s).map(|i| (pasts[i / s] + i % s) as i64).collect();
            let pos = Tensor::from_vec(&[b, s], pos)?;
            let (cos, sin) = (opt_input(inputs, 7), opt_input(inputs, 8));
            let rot = |kern: &dyn OpKernel, x: Vec<f32>, width: usize| -> OpResult<Vec<f32>> {
                let t = Tensor::from_vec(&[b, s, width], x)?;
                let out = kern.run(&[
                    Some(t.view()),
                    cos.map(TensorRef::reborrow),
                    sin.map(TensorRef::reborrow),
                    Some(pos.view()),
                ])?;
                f32_values(op, "rotated", &out[0].view())
            };
            q = rot(rq.as_ref(), q, heads * hd)?;
            k = rot(rk.as_ref(), k, kvh * hd)?;
        }
        // The caches: each sequence's past, then its new keys and values; zeros after.
        let cache_len = [b, kvh, present_len, hd]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                OpError(format!(
                    "{op}: a KV cache of {present_len} positions is too large"
                ))
            })?;
        let cache = |past: Option<&TensorRef<'_>>, new: &[f32]| -> OpResult<Vec<f32>> {
            let mut c: Vec<f32> = crate::limits::zeros_checked(cache_len, op)?;
            if let Some(p) = past {
                let pv = f32_values(op, "past", p)?;
                for bh in 0..b * kvh {
                    for t in 0..pasts[bh / kvh].min(past_buf) {
                        let (dst, src) = ((bh * present_len + t) * hd, (bh * past_buf + t) * hd);
                        c[dst..dst + hd].copy_from_slice(&pv[src..src + hd]);
                    }
                }
            }
            for (bi, &past) in pasts.iter().enumerate() {
                for si in 0..s {
                    for h in 0..kvh {
                        let src = ((bi * s + si) * kvh + h) * hd;
                        let dst = ((bi * kvh + h) * present_len + past + si) * hd;
                        c[dst..dst + hd].copy_from_slice(&new[src..src + hd]);
                    }
                }
            }
            Ok(c)
        };
        let ck = cache(past_k, &k)?;
        let cv = cache(opt_input(inputs, 4), &v)?;
        let scale = self.scale.unwrap_or(1.0 / (hd as f32).sqrt());
        let group = heads / kvh;
        let mut out = vec![0f32; b * s * heads * hd];
        let mut scores: Vec<f32> = crate::limits::zeros_checked(present_len, op)?;
        for bi in 0..b {
            let total = (seqlens[bi] + 1) as usize;
            for si in 0..s {
                let pos = pasts[bi] + si;
                let last = pos.min(total.saturating_sub(1));
                let first = if self.window > 0 {
                    (pos + 1).saturating_sub(self.window as usize)
                } else {
                    0
                };
                for h in 0..heads {
                    let kh = h / group;
                    let qv = &q[((bi * s + si) * heads + h) * hd..][..hd];
                    let mut max = f32::NEG_INFINITY;
                    for j in first..=last {
                        let kr = &ck[((bi * kvh + kh) * present_len + j) * hd..][..hd];
                        let mut d = qv.iter().zip(kr).map(|(a, c)| a * c).sum::<f32>() * scale;
                        if self.softcap > 0.0 {
                            d = self.softcap * (d / self.softcap).tanh();
                        }
                        scores[j] = d;
                        max = max.max(d);
                    }
                    let mut sum = 0f32;
                    for sc in &mut scores[first..=last] {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    let o = &mut out[((bi * s + si) * heads + h) * hd..][..hd];
                    for j in first..=last {
                        let w = scores[j] / sum;
                        let vr = &cv[((bi * kvh + kh) * present_len + j) * hd..][..hd];
                        o.iter_mut().zip(vr).for_each(|(a, c)| *a += w * c);
                    }
                }
            }
        }
        let cast = |shape: &[usize], v: Vec<f32>| Tensor::from_vec(shape, v)?.view().cast(ty);
        Ok(vec![
            cast(&[b, s, heads * hd], out)?,
            cast(&[b, kvh, present_len, hd], ck)?,
            cast(&[b, kvh, present_len, hd], cv)?,
        ])
    }
}
