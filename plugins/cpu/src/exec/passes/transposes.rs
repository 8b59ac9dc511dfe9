//! Transposes pushed down through the ops that commute with them, until they meet their inverse.
//!
//! A model converted from a channels-last framework wraps every convolution in a pair of
//! Transposes (NHWC → NCHW before, back after) and runs everything between convolutions (bias,
//! normalization, activation, residual sums, pooling, concatenation) channels-last. Each
//! Transpose is a full copy of its tensor. Pushing the one after a convolution down through the
//! elementwise ops that follow (their constants transposed instead) brings it next to the one
//! before the next convolution, its inverse, and both go: the model runs channels-first from its
//! first convolution to its last, as ONNX Runtime's transpose optimizer makes it run.

use std::collections::HashMap;

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use super::{Draft, DraftStep, NodeInfo};
use crate::exec::step::{Source, Step};
use crate::kernel::{AttrValue, NodeDef, OpKernel};
use crate::tensor::Tensor;

/// Ops of one data input (input 0) computed element by element, whatever the layout: the other
/// inputs, where they have any, are scalars (Clip's bounds) or only give a type (CastLike's).
const UNARY: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Cos",
    "Cosh",
    "Elu",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "IsInf",
    "IsNaN",
    "LeakyRelu",
    "Log",
    "Mish",
    "Neg",
    "Not",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
];

/// Ops computed element by element over inputs that broadcast together (multidirectionally,
/// PRelu's slope unidirectionally), from the opset where they broadcast as numpy does.
const BROADCAST: &[(&str, i64)] = &[
    ("Add", 7),
    ("And", 7),
    ("BitShift", 11),
    ("BitwiseAnd", 18),
    ("BitwiseOr", 18),
    ("BitwiseXor", 18),
    ("Div", 7),
    ("Equal", 7),
    ("Greater", 7),
    ("GreaterOrEqual", 12),
    ("Less", 7),
    ("LessOrEqual", 12),
    ("Max", 8),
    ("Mean", 8),
    ("Min", 8),
    ("Mod", 10),
    ("Mul", 7),
    ("Or", 7),
    ("Pow", 7),
    ("PRelu", 7),
    ("Sub", 7),
    ("Sum", 8),
    ("Where", 9),
    ("Xor", 7),
];

/// Reductions over an `axes` attribute or input, `keepdims` either way.
const REDUCE: &[&str] = &[
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
];

/// `push_transposes` (fast levels): a Transpose whose output an op below reads is moved to
/// after that op, which then reads the Transpose's input: through elementwise ops (constant
/// operands transposed to match; every other operand must come from a Transpose of the same
/// permutation), Concat (its axis renumbered), reductions (their
/// axes renumbered; with `keepdims` 0 the Transpose after them may vanish), Pad and Resize
/// (their pads, scales and sizes permuted). Two Transposes in a row become one, or none when
/// they undo each other. A Transpose is pushed only when one it reads from then has no other
/// reader, so the number of Transposes never grows; those left with no reader are removed.
///
/// In: steps, in order. Out: steps with Transposes moved down, merged or gone; every program
/// output holds the same value as before.
pub(crate) fn push_transposes(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let mut readers = count_readers(d);
    // The slots a Transpose step writes: its permutation and input.
    let mut made: HashMap<usize, (Vec<usize>, Source)> = HashMap::new();
    let mut i = 0;
    while i < d.steps.len() {
        if let Some(t) = as_transpose(&d.steps[i]) {
            if let Source::Slot(y) = t.input
                && let Some((p1, x)) = made.get(&y).cloned()
                && p1.len() == t.perm.len()
            {
                // Transpose of a Transpose: one permutation, `c[i] = p1[p2[i]]`.
                let c: Vec<usize> = t.perm.iter().map(|&k| p1[k]).collect();
                move_reader(&mut readers, y, x);
                let returned = |s: usize| {
                    d.outputs
                        .iter()
                        .any(|v| d.at.get(v) == Some(&Source::Slot(s)))
                };
                if is_identity(&c) && !returned(t.output) {
                    // The step's own read of `x` goes; its readers read `x`.
                    let n = readers.remove(&t.output).unwrap_or(0);
                    if let Source::Slot(s) = x {
                        let r = readers.entry(s).or_default();
                        *r = (*r + n).saturating_sub(1);
                    }
                    d.steps.remove(i);
                    d.replace(t.output, x);
                    continue;
                }
                // The program returns the second one's output: the step that made the first
                // one's input writes it there instead, when nothing else returns that input.
                if is_identity(&c)
                    && let Source::Slot(xs) = x
                    && !returned(xs)
                    && let Some(p) = d.steps[..i]
                        .iter()
                        .rposition(|st| st.step.outputs.contains(&Some(xs)))
                {
                    let out = t.output;
                    d.steps.remove(i);
                    for o in d.steps[p].step.outputs.iter_mut().flatten() {
                        if *o == xs {
                            *o = out;
                        }
                    }
                    d.replace(xs, Source::Slot(out));
                    let n = readers.remove(&xs).unwrap_or(0).saturating_sub(1);
                    *readers.entry(out).or_default() += n;
                    if let Some(m) = made.remove(&xs) {
                        made.insert(out, m);
                    }
                    continue;
                }
                let def = transpose_def(&d.steps[i], &c);
                let kernel = remake(&def)?;
                let st = &mut d.steps[i];
                st.step.inputs[0] = Some(x);
                st.step.kernel = kernel;
                if let Some(info) = st.node.as_mut() {
                    info.def = def;
                }
                made.insert(t.output, (c, x));
            } else {
                made.insert(t.output, (t.perm, t.input));
            }
            i += 1;
            continue;
        }
        if let Some(plan) = plan(d, i, &made, &readers) {
            apply(d, i, plan, &mut readers)?;
        }
        i += 1;
    }
    remove_unread(d);
    Ok(())
}

/// A Transpose step with an explicit permutation.
struct TransposeStep {
    perm: Vec<usize>,
    input: Source,
    output: usize,
}

fn as_transpose(st: &DraftStep<'_>) -> Option<TransposeStep> {
    if !st.is_op("Transpose") {
        return None;
    }
    let Some(AttrValue::Ints(p)) = st.node.as_ref()?.def.attributes.get("perm") else {
        return None;
    };
    let perm = permutation(p)?;
    match (st.step.inputs.as_slice(), st.step.outputs.as_slice()) {
        ([Some(x)], [Some(y)]) => Some(TransposeStep {
            perm,
            input: *x,
            output: *y,
        }),
        _ => None,
    }
}

/// `p` as a permutation of `0..p.len()`, if it is one.
fn permutation(p: &[i64]) -> Option<Vec<usize>> {
    let mut seen = vec![false; p.len()];
    p.iter()
        .map(|&v| {
            let u = usize::try_from(v)
                .ok()
                .filter(|&u| u < p.len() && !seen[u])?;
            seen[u] = true;
            Some(u)
        })
        .collect()
}

fn is_identity(p: &[usize]) -> bool {
    p.iter().enumerate().all(|(i, &v)| i == v)
}

fn inverse(p: &[usize]) -> Vec<usize> {
    let mut q = vec![0; p.len()];
    for (i, &v) in p.iter().enumerate() {
        q[v] = i;
    }
    q
}

/// How many times each slot is read: by steps, and once more when the program returns it.
fn count_readers(d: &Draft<'_, '_>) -> HashMap<usize, usize> {
    let mut n: HashMap<usize, usize> = HashMap::new();
    let steps = d
        .steps
        .iter()
        .flat_map(|st| st.step.inputs.iter().flatten());
    let returned = d.outputs.iter().filter_map(|v| d.at.get(v)).chain(&d.bound);
    for s in steps.chain(returned) {
        if let Source::Slot(s) = s {
            *n.entry(*s).or_default() += 1;
        }
    }
    n
}

fn move_reader(readers: &mut HashMap<usize, usize>, from: usize, to: Source) {
    if let Some(n) = readers.get_mut(&from) {
        *n = n.saturating_sub(1);
    }
    if let Source::Slot(s) = to {
        *readers.entry(s).or_default() += 1;
    }
}

/// How a step changes when the Transposes before it move after it.
struct Plan {
    /// The step's new inputs.
    inputs: Vec<Option<Source>>,
    /// New constants, by input index.
    constants: Vec<(usize, Tensor)>,
    /// The node with renumbered attributes, when its kernel must be made again.
    def: Option<NodeDef>,
    /// The permutation of the Transpose after the step (`None`: none is needed).
    after: Option<Vec<usize>>,
}

/// Whether step `i` can read past the Transposes before it, and how.
fn plan(
    d: &Draft<'_, '_>,
    i: usize,
    made: &HashMap<usize, (Vec<usize>, Source)>,
    readers: &HashMap<usize, usize>,
) -> Option<Plan> {
    let st = &d.steps[i];
    let info = st.node.as_ref()?;
    let def = &info.def;
    if !moves_through(def)
        || info.pending.is_some()
        || st.step.outputs.len() != 1
        || st.step.outputs[0].is_none()
    {
        return None;
    }
    let op = def.op_type.as_str();
    let broadcast = is_broadcast(def);
    // The inputs laid out as the output is: every input of an elementwise op or Concat, else
    // input 0 (the others are parameters).
    let data = if broadcast || op == "Concat" {
        st.step.inputs.len()
    } else {
        1
    };
    let transposed = |k: usize| match st.step.inputs.get(k) {
        Some(Some(Source::Slot(s))) => made.get(s).map(|t| (*s, t)),
        _ => None,
    };
    let (_, (perm, _)) = (0..data).find_map(transposed)?;
    let perm = perm.clone();
    let n = perm.len();
    // Some Transpose before the step must be left with no other reader.
    let reads_of = |s: usize| {
        st.step
            .inputs
            .iter()
            .filter(|i| **i == Some(Source::Slot(s)))
            .count()
    };
    let freed = (0..data)
        .filter_map(transposed)
        .any(|(s, (p, _))| *p == perm && readers.get(&s).copied().unwrap_or(0) == reads_of(s));
    // Or every reader of each is an op the Transpose moves through, so that it goes once they
    // all read past it (one of them alone would leave it in place for the others).
    if !freed
        && !(0..data)
            .filter_map(transposed)
            .all(|(s, _)| read_only_by_movers(d, s, readers))
    {
        return None;
    }
    let q = inverse(&perm);
    let mut inputs = st.step.inputs.clone();
    let mut constants = Vec::new();
    for (k, input) in inputs.iter_mut().enumerate().take(data) {
        match *input {
            None => return None,
            Some(Source::Slot(s)) => {
                let (p, x) = made.get(&s)?;
                if *p != perm {
                    return None;
                }
                *input = Some(*x);
            }
            Some(src) => {
                let c = d.constant_value(src)?;
                let c = if op == "Concat" {
                    if c.shape().len() != n {
                        return None;
                    }
                    crate::ops::shape::transpose("Transpose", &c.view(), &q).ok()?
                } else {
                    broadcast_transposed(c, &q)?
                };
                constants.push((k, c));
            }
        }
    }
    let same = |def: Option<NodeDef>, constants| {
        Some(Plan {
            inputs: inputs.clone(),
            constants,
            def,
            after: Some(perm.clone()),
        })
    };
    if UNARY.contains(&op) || broadcast {
        return same(None, constants);
    }
    // The rest is made again with renumbered attributes or new parameters: not for the nodes
    // kept in float16 ([`crate::exec::lower`]).
    if info.output_types.contains(&Some(ElementType::Float16)) {
        return None;
    }
    let axis = |a: i64| -> Option<usize> {
        let a = if a < 0 { a + n as i64 } else { a };
        usize::try_from(a).ok().filter(|&a| a < n).map(|a| perm[a])
    };
    let param = |k: usize| d.constant_value(st.step.inputs.get(k).copied()??);
    match op {
        "Concat" => {
            let a = axis(def.attr_int("axis").ok()??)?;
            same(
                Some(with_attr(def, "axis", AttrValue::Int(a as i64))),
                constants,
            )
        }
        _ if REDUCE.contains(&op) && inputs.len() <= 2 => {
            let keep = def.attr_int_or("keepdims", 1).ok()? != 0;
            let (axes, from_input) = match (def.attr_ints("axes").ok()?, inputs.len()) {
                (Some(a), 1) => (a, false),
                (None, 2) => (param(1)?.view().to_i64_vec("axes").ok()?, true),
                _ => return None,
            };
            if axes.is_empty() {
                return None;
            }
            let mut mapped: Vec<usize> = axes.iter().map(|&a| axis(a)).collect::<Option<_>>()?;
            let y_axes: Vec<usize> = mapped.iter().map(|&a| q[a]).collect();
            mapped.sort_unstable();
            mapped.dedup();
            let new_axes: Vec<i64> = mapped.iter().map(|&a| a as i64).collect();
            let def = if from_input {
                constants.push((1, Tensor::from_vec(&[new_axes.len()], new_axes).ok()?));
                None
            } else {
                Some(with_attr(def, "axes", AttrValue::Ints(new_axes)))
            };
            let after = if keep {
                perm.clone()
            } else {
                // The axes left: the output's in its order, each at its place among the input's.
                let left_x: Vec<usize> = (0..n).filter(|a| !mapped.contains(a)).collect();
                (0..n)
                    .filter(|a| !y_axes.contains(a))
                    .map(|a| left_x.iter().position(|&b| b == perm[a]))
                    .collect::<Option<Vec<_>>>()?
            };
            Some(Plan {
                inputs,
                constants,
                def,
                after: (!is_identity(&after)).then_some(after),
            })
        }
        "Pad" if def.opset >= 11 && inputs.len() <= 3 => {
            let pads = param(1)?.view().to_i64_vec("pads").ok()?;
            if pads.len() != 2 * n {
                return None;
            }
            let mut new = vec![0i64; 2 * n];
            for (a, &p) in perm.iter().enumerate() {
                new[p] = pads[a];
                new[n + p] = pads[n + a];
            }
            constants.push((1, Tensor::from_vec(&[2 * n], new).ok()?));
            same(None, constants)
        }
        "Resize" if def.opset >= 11 && !def.has_attr("axes") && inputs.len() <= 4 => {
            // roi (2n), scales (n) and sizes (n): each a constant, empty, or absent.
            for k in 1..inputs.len() {
                if st.step.inputs[k].is_none() {
                    continue;
                }
                let c = param(k)?;
                if c.is_empty() {
                    continue;
                }
                let per = if k == 1 { 2 } else { 1 };
                if c.shape().len() != 1 || c.len() != per * n {
                    return None;
                }
                constants.push((k, permuted_runs(c, &perm)?));
            }
            same(None, constants)
        }
        _ => None,
    }
}

/// 1-D `c`, runs of `perm.len()` values, each run permuted: `out[r·n + perm[a]] = c[r·n + a]`
/// (a value per axis of the transposed tensor, made a value per axis of its input).
fn permuted_runs(c: &Tensor, perm: &[usize]) -> Option<Tensor> {
    fn go<T: crate::tensor::Elem>(v: Vec<T>, perm: &[usize]) -> Option<Tensor> {
        let n = perm.len();
        let mut out = v.clone();
        for (r, run) in v.chunks_exact(n).enumerate() {
            for (a, x) in run.iter().enumerate() {
                out[r * n + perm[a]] = *x;
            }
        }
        Tensor::from_vec(&[v.len()], out).ok()
    }
    match c.view() {
        crate::tensor::TensorRef::F32(a) => go(a.iter().copied().collect(), perm),
        crate::tensor::TensorRef::I64(a) => go(a.iter().copied().collect(), perm),
        _ => None,
    }
}

/// Whether a Transpose moves through an op of this kind (by its type, opset and domain
/// alone; [`plan`] then checks its inputs and attributes).
fn moves_through(def: &NodeDef) -> bool {
    let op = def.op_type.as_str();
    (def.domain.is_empty() || def.domain == "ai.onnx")
        && (UNARY.contains(&op)
            || is_broadcast(def)
            || REDUCE.contains(&op)
            || op == "Concat"
            || (matches!(op, "Pad" | "Resize") && def.opset >= 11))
}

/// Whether `def` is an elementwise op that broadcasts as numpy does at its opset.
fn is_broadcast(def: &NodeDef) -> bool {
    BROADCAST
        .iter()
        .any(|&(name, since)| name == def.op_type && def.opset >= since)
}

/// Whether every reader of `slot` is a step of an op a Transpose moves through (by its op type
/// alone), and the program does not return it.
fn read_only_by_movers(d: &Draft<'_, '_>, slot: usize, readers: &HashMap<usize, usize>) -> bool {
    let mut reads = 0;
    for st in &d.steps {
        let n = st
            .step
            .inputs
            .iter()
            .filter(|i| **i == Some(Source::Slot(slot)))
            .count();
        if n == 0 {
            continue;
        }
        if !st
            .node
            .as_ref()
            .is_some_and(|info| moves_through(&info.def))
        {
            return false;
        }
        reads += n;
    }
    readers.get(&slot).copied().unwrap_or(0) == reads
}

/// Constant `c`, an operand broadcast against a transposed tensor of rank `q.len()`, as the
/// operand of the untransposed one: its shape aligned to the right, then its axes permuted by
/// `q` (the inverse of the Transpose's permutation). `None` when its rank is larger.
fn broadcast_transposed(c: &Tensor, q: &[usize]) -> Option<Tensor> {
    let n = q.len();
    let r = c.shape().len();
    if r > n {
        return None;
    }
    let mut full = vec![1usize; n - r];
    full.extend_from_slice(c.shape());
    if full.iter().filter(|&&d| d != 1).count() == 0 {
        // One value: it broadcasts the same either way.
        return Some(c.clone());
    }
    let aligned = c.clone().into_shape(&full).ok()?;
    crate::ops::shape::transpose("Transpose", &aligned.view(), q).ok()
}

fn with_attr(def: &NodeDef, name: &str, v: AttrValue) -> NodeDef {
    let mut def = def.clone();
    def.attributes.insert(name.to_string(), v);
    def
}

/// A Transpose node by `perm`, named after step `st`.
fn transpose_def(st: &DraftStep<'_>, perm: &[usize]) -> NodeDef {
    let mut def = NodeDef::new("Transpose", 13).with_attr(
        "perm",
        AttrValue::Ints(perm.iter().map(|&p| p as i64).collect()),
    );
    def.name = st.step.label.clone();
    def.num_inputs = 1;
    def
}

/// The kernel of `def` from the registry.
fn remake(def: &NodeDef) -> sdk::Result<Box<dyn OpKernel>> {
    crate::ops::registry()
        .build(def)
        .map_err(|e| sdk::Error::runtime(format!("node `{}`: {e}", def.name)))
}

/// Rewrites step `i` by `plan`: it reads the Transposes' inputs and writes a new slot, and a
/// Transpose after it writes what it wrote.
fn apply(
    d: &mut Draft<'_, '_>,
    i: usize,
    plan: Plan,
    readers: &mut HashMap<usize, usize>,
) -> sdk::Result<()> {
    let mut inputs = plan.inputs;
    for (k, c) in plan.constants {
        inputs[k] = Some(d.constant(c));
    }
    let kernel = plan.def.as_ref().map(remake).transpose()?;
    let fresh = plan.after.is_some().then(|| d.slot());
    let st = &mut d.steps[i];
    for (old, new) in st.step.inputs.iter().zip(&inputs) {
        if old != new
            && let (Some(Source::Slot(s)), Some(new)) = (old, new)
        {
            move_reader(readers, *s, *new);
        }
    }
    st.step.inputs = inputs;
    if let Some(k) = kernel {
        st.step.kernel = k;
    }
    let info = st.node.as_mut().expect("a node step");
    if let Some(def) = plan.def {
        info.def = def;
    }
    let (Some(perm), Some(fresh)) = (plan.after, fresh) else {
        return Ok(());
    };
    let out = st.step.outputs[0].replace(fresh).expect("one output");
    let values = std::mem::replace(&mut info.values, vec![None]);
    let output_types = info.output_types.clone();
    readers.insert(fresh, 1);
    let def = transpose_def(st, &perm);
    let step = Step::new(
        format!("{} (transposed after)", st.step.label),
        "Transpose".into(),
        remake(&def)?,
        vec![Some(Source::Slot(fresh))],
        vec![Some(out)],
    );
    d.steps.insert(
        i + 1,
        DraftStep {
            step,
            node: Some(NodeInfo {
                def,
                values,
                output_types,
                pending: None,
            }),
        },
    );
    Ok(())
}

/// Removes the Transposes nobody reads (those this pass bypassed).
fn remove_unread(d: &mut Draft<'_, '_>) {
    let readers = count_readers(d);
    d.steps.retain(|st| {
        !(st.is_op("Transpose")
            && st
                .step
                .outputs
                .iter()
                .all(|o| o.is_none_or(|s| readers.get(&s).copied().unwrap_or(0) == 0)))
    });
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;
    use crate::exec::passes::testing::{def, kinds, push, run_draft};

    const TO_NHWC: [i64; 4] = [0, 2, 3, 1];
    const TO_NCHW: [i64; 4] = [0, 3, 1, 2];

    fn transpose(perm: [i64; 4]) -> NodeDef {
        def("Transpose", 1).with_attr("perm", AttrValue::Ints(perm.to_vec()))
    }

    fn iota(shape: &[usize], from: f32) -> Tensor {
        let n = shape.iter().product::<usize>();
        let v = (0..n)
            .map(|i| from + (i as f32) * 0.37 - (i % 5) as f32)
            .collect();
        Tensor::from_vec(shape, v).unwrap()
    }

    /// Runs `build`'s draft on `inputs` before and after the pass: the outputs must be the
    /// same, bit for bit; returns the step kinds after it.
    fn check(
        outputs: &[u32],
        inputs: &[Tensor],
        build: impl Fn(&mut Draft<'_, '_>),
    ) -> Vec<String> {
        let (g, options) = (TestGraph::new(), CompileOptions::default());
        let mut d = Draft::new(g.view(), &[], &[], outputs, &[], &options).unwrap();
        build(&mut d);
        let before = run_draft(&d, inputs);
        push_transposes(&mut d).unwrap();
        assert_eq!(run_draft(&d, inputs), before, "the pass changed an answer");
        kinds(&d)
    }

    #[test]
    fn a_channels_last_chain_between_inverse_transposes_runs_without_them() {
        let kinds = check(&[13], &[iota(&[1, 2, 3, 4], -3.0)], |d| {
            let bias = d.constant(iota(&[1, 1, 1, 2], 0.5));
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, def("Add", 2), &[Source::Slot(10), bias], 11);
            push(d, def("Relu", 1), &[Source::Slot(11)], 12);
            push(d, transpose(TO_NCHW), &[Source::Slot(12)], 13);
        });
        // The program's output is the Relu's now.
        assert_eq!(kinds, ["Add", "Relu"]);
    }

    #[test]
    fn a_residual_sum_of_two_transposed_branches_is_pushed_and_every_transpose_goes() {
        let kinds = check(&[17], &[iota(&[1, 3, 2, 2], -4.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, def("Relu", 1), &[Source::Slot(10)], 11);
            push(d, transpose(TO_NCHW), &[Source::Slot(11)], 12);
            // Stands for a convolution: an op the pass does not push through.
            push(
                d,
                def("MaxPool", 1).with_attr("kernel_shape", AttrValue::Ints(vec![1, 1])),
                &[Source::Slot(12)],
                13,
            );
            push(d, transpose(TO_NHWC), &[Source::Slot(13)], 14);
            push(d, def("Add", 2), &[Source::Slot(14), Source::Slot(11)], 15);
            push(d, transpose(TO_NCHW), &[Source::Slot(15)], 16);
            push(d, def("Neg", 1), &[Source::Slot(16)], 17);
        });
        assert_eq!(kinds, ["Relu", "MaxPool", "Add", "Neg"]);
    }

    #[test]
    fn a_reduction_without_kept_axes_needs_no_transpose_after_it() {
        let reduce = def("ReduceMean", 1)
            .with_attr("axes", AttrValue::Ints(vec![1, 2]))
            .with_attr("keepdims", AttrValue::Int(0));
        let kinds = check(&[11], &[iota(&[2, 3, 4, 5], 1.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, reduce.clone(), &[Source::Slot(10)], 11);
        });
        assert_eq!(kinds, ["ReduceMean"]);
        // Kept axes: the Transpose moves after it, onto the smaller tensor.
        let kept = reduce.with_attr("keepdims", AttrValue::Int(1));
        let kinds = check(&[11], &[iota(&[2, 3, 4, 5], 1.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, kept.clone(), &[Source::Slot(10)], 11);
        });
        assert_eq!(kinds, ["ReduceMean", "Transpose"]);
    }

    #[test]
    fn concat_and_pad_renumber_their_axes_and_softmax_stops_the_transpose() {
        let concat = def("Concat", 2).with_attr("axis", AttrValue::Int(3));
        // Over another axis than the last, Softmax would sum in another order.
        let softmax = def("Softmax", 1).with_attr("axis", AttrValue::Int(-1));
        let inputs = [iota(&[1, 2, 3, 4], 0.0), iota(&[1, 3, 3, 4], 2.0)];
        let kinds = check(&[14], &inputs, |d| {
            let pads = d.constant(Tensor::from_vec(&[8], vec![0i64, 1, 2, 0, 0, 0, 1, 0]).unwrap());
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, transpose(TO_NHWC), &[Source::Input(1)], 11);
            push(d, concat.clone(), &[Source::Slot(10), Source::Slot(11)], 12);
            push(d, def("Pad", 2), &[Source::Slot(12), pads], 13);
            push(d, softmax.clone(), &[Source::Slot(13)], 15);
            push(d, transpose(TO_NCHW), &[Source::Slot(15)], 14);
        });
        assert_eq!(
            kinds,
            ["Concat", "Pad", "Transpose", "Softmax", "Transpose"]
        );
    }

    #[test]
    fn two_transposes_in_a_row_become_one() {
        let kinds = check(&[11], &[iota(&[2, 3, 4, 5], 0.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, transpose([1, 0, 2, 3]), &[Source::Slot(10)], 11);
        });
        assert_eq!(kinds, ["Transpose"]);
    }

    #[test]
    fn a_transpose_another_op_also_reads_stays_where_it_is() {
        let kinds = check(&[11, 12], &[iota(&[1, 2, 3, 4], -3.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, def("Relu", 1), &[Source::Slot(10)], 11);
            push(d, def("Shape", 1), &[Source::Slot(10)], 12);
        });
        assert_eq!(kinds, ["Transpose", "Relu", "Shape"]);
        // A program output made by a Transpose stays the Transpose's.
        let kinds = check(&[10, 11], &[iota(&[1, 2, 3, 4], -3.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, def("Relu", 1), &[Source::Slot(10)], 11);
        });
        assert_eq!(kinds, ["Transpose", "Relu"]);
    }

    #[test]
    fn a_transpose_read_by_several_ops_it_moves_through_goes_once_they_all_read_past_it() {
        let concat = def("Concat", 2).with_attr("axis", AttrValue::Int(3));
        let kinds = check(&[13], &[iota(&[1, 2, 3, 4], -3.0)], |d| {
            push(d, transpose(TO_NHWC), &[Source::Input(0)], 10);
            push(d, def("Sigmoid", 1), &[Source::Slot(10)], 11);
            push(d, concat.clone(), &[Source::Slot(10), Source::Slot(11)], 12);
            push(d, transpose(TO_NCHW), &[Source::Slot(12)], 14);
            push(d, def("Neg", 1), &[Source::Slot(14)], 13);
        });
        assert_eq!(kinds, ["Sigmoid", "Concat", "Neg"]);
    }
}
