//! A compiled sequence of op kernels over a set of graph nodes: what a CPU EP kernel runs, and
//! what the bodies of `If`, `Loop` and `Scan` are compiled into.

use std::collections::HashMap;

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk::{self, Attribute, Error, GraphView, NodeView};

use crate::error::OpError;
use crate::exec::control;
use crate::exec::fuse::{FusedChain, FusedOp, classify};
use crate::exec::lower;
use crate::exec::qdq;
use crate::fast::{
    self,
    chain::{ChainOp, ChainPost, EwOp, Operand},
};
use crate::kernel::{AttrValue, NodeDef, OpKernel};
use crate::tensor::{Tensor, TensorRef};

/// Ops the CPU EP runs with nested graphs, compiled here rather than through the registry.
/// Whether `op` is a control-flow op ([`control::CONTROL_FLOW_OPSETS`]).
pub(crate) fn is_control_flow(op: &str) -> bool {
    control::CONTROL_FLOW_OPSETS
        .iter()
        .any(|(name, _)| *name == op)
}

pub(crate) fn op_error(node: &str, e: OpError) -> Error {
    Error::runtime(format!("node `{node}`: {e}"))
}

/// Where a node input comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Input `i` of the run.
    Input(usize),
    /// An initializer copied at compile time.
    Constant(usize),
    /// A value computed by an earlier node.
    Slot(usize),
}

struct Step {
    label: String,
    /// The op type, or the fused operations.
    kind: String,
    kernel: Box<dyn OpKernel>,
    inputs: Vec<Option<Source>>,
    outputs: Vec<Option<usize>>,
    /// Slots no later step reads and that are not program outputs: freed after this step.
    frees: Vec<usize>,
    /// What the step is to the elementwise fuser: its operation and operand inputs.
    ew: Option<(EwOp, Vec<usize>)>,
}

/// Nodes compiled once, run many times.
pub struct Program {
    steps: Vec<Step>,
    constants: Vec<Tensor>,
    num_slots: usize,
    outputs: Vec<Source>,
}

/// Ops whose result is not a function of their inputs alone: never evaluated at compile time.
const NOT_FOLDABLE: &[&str] = &[
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
];

/// Runs `kernel` at compile time when every input it reads is a constant; `None` when it
/// cannot (or should not) be folded, including when it fails: the error then comes at run time,
/// where it names the run.
fn fold(
    op_type: &str,
    kernel: &dyn OpKernel,
    srcs: &[Option<Source>],
    (constants, known): (&[Tensor], &[Option<&Tensor>]),
) -> Option<Vec<Tensor>> {
    if NOT_FOLDABLE.contains(&op_type) || is_control_flow(op_type) {
        return None;
    }
    let mut args = Vec::with_capacity(srcs.len());
    for s in srcs {
        args.push(match s {
            None => None,
            Some(s) => Some(constant_value(*s, constants, known)?.view()),
        });
    }
    kernel.run(&args).ok()
}

/// The value of `src` when it is known at compile time: a constant, or a run input whose value
/// is fixed (`known`: an enclosing graph's constant read by a nested body).
fn constant_value<'a>(
    src: Source,
    constants: &'a [Tensor],
    known: &[Option<&'a Tensor>],
) -> Option<&'a Tensor> {
    match src {
        Source::Constant(i) => constants.get(i),
        Source::Input(i) => known.get(i).copied().flatten(),
        Source::Slot(_) => None,
    }
}

/// Folds an inference BatchNormalization into the Conv step whose output only it reads, as
/// ONNX Runtime's Conv/BatchNormalization fusion does: per output channel `s = γ / √(var + ε)`,
/// `W' = W · s`, `B' = (B − mean) · s + β`, in f32. The Conv's weights (and bias, if any) must
/// be float32 constants and the normalization's four parameters float32 constants of one value
/// per channel. Returns the Conv's output, which stands for the normalization's from then on;
/// `None` (nothing changed) when the pattern does not hold.
fn fold_batch_norm(
    graph: &GraphView<'_>,
    node: &NodeView<'_>,
    srcs: &[Option<Source>],
    steps: &mut [Step],
    constants: &mut Vec<Tensor>,
) -> Option<Source> {
    // float32 only: a float16 model's weights keep their own rounding.
    let y = node.outputs.first().copied().flatten()?;
    if graph.value(y).ok()?.elem_type != Some(ElementType::Float) {
        return None;
    }
    let attrs = graph.attributes(node).ok()?;
    let mut eps = 1e-5f32;
    for (name, a) in &attrs {
        match (*name, a) {
            ("epsilon", Attribute::Float(e)) => eps = *e,
            ("training_mode", Attribute::Int(0)) | ("spatial", Attribute::Int(1)) => {}
            ("momentum", _) => {}
            _ => return None,
        }
    }
    let f32_const = |s: &Option<Source>| match s {
        Some(Source::Constant(i)) => match &constants[*i] {
            Tensor::F32(a) => Some(a),
            _ => None,
        },
        _ => None,
    };
    let [Some(Source::Slot(x)), gamma, beta, mean, var] = srcs else {
        return None;
    };
    let x = *x;
    let (gamma, beta, mean, var) = (
        f32_const(gamma)?,
        f32_const(beta)?,
        f32_const(mean)?,
        f32_const(var)?,
    );
    let c = gamma.len();
    if [gamma, beta, mean, var].iter().any(|p| p.shape() != [c]) {
        return None;
    }
    let conv = steps
        .iter_mut()
        .rev()
        .find(|st| st.outputs.iter().flatten().any(|&o| o == x))?;
    if conv.kind != "Conv" || conv.outputs.len() != 1 {
        return None;
    }
    let w = f32_const(conv.inputs.get(1)?)?;
    if w.ndim() < 3 || w.shape()[0] != c || c == 0 {
        return None;
    }
    let bias: Vec<f32> = match conv.inputs.get(2) {
        None | Some(None) => vec![0.0; c],
        Some(b) => {
            let b = f32_const(b).filter(|b| b.shape() == [c])?;
            b.iter().copied().collect()
        }
    };
    let (w_shape, w) = (w.shape().to_vec(), w.as_standard_layout());
    let per = w.len() / c;
    let scale: Vec<f32> = gamma
        .iter()
        .zip(var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let new_w: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| v * scale[i / per])
        .collect();
    let new_b: Vec<f32> = (0..c)
        .map(|k| (bias[k] - mean[[k]]) * scale[k] + beta[[k]])
        .collect();
    let new_w = Tensor::from_vec(&w_shape, new_w).ok()?;
    let new_b = Tensor::from_vec(&[c], new_b).ok()?;
    constants.push(new_w);
    conv.inputs[1] = Some(Source::Constant(constants.len() - 1));
    constants.push(new_b);
    let b = Some(Source::Constant(constants.len() - 1));
    match conv.inputs.get_mut(2) {
        Some(slot) => *slot = b,
        None => conv.inputs.push(b),
    }
    Some(Source::Slot(x))
}

/// A step converting one value between float16 and float32 ([`lower`]).
fn convert_step(label: String, to_half: bool, from: Source, slot: usize) -> Step {
    Step {
        label,
        kind: "Cast".into(),
        kernel: Box::new(lower::Convert { to_half }),
        inputs: vec![Some(from)],
        outputs: vec![Some(slot)],
        frees: Vec::new(),
        ew: None,
    }
}

/// An initializer's data, copied (string initializers come in the ABI's string form).
fn initializer(
    graph: &GraphView<'_>,
    v: u32,
    elem_type: Option<ElementType>,
    widen: bool,
) -> Result<Tensor, OpError> {
    let e = |e: sdk::Error| OpError(e.to_string());
    if elem_type == Some(ElementType::String) {
        let t = graph.string_initializer(v).map_err(e)?;
        return Tensor::strings_from_bytes(&t.dims(), t.iter());
    }
    let t = graph.initializer(v).map_err(e)?;
    let t = Tensor::from_bytes(t.elem_type, &t.dims(), t.data)?;
    // float16 is held as float32 inside a program ([`lower`]), but for a Gather's table.
    Ok(if widen { lower::to_f32(t) } else { t })
}

fn attr_value(a: Attribute<'_>) -> Result<AttrValue, OpError> {
    Ok(match a {
        Attribute::Float(f) => AttrValue::Float(f),
        Attribute::Int(i) => AttrValue::Int(i),
        Attribute::String(s) => AttrValue::String(s.to_vec()),
        Attribute::Floats(v) => AttrValue::Floats(v.to_vec()),
        Attribute::Ints(v) => AttrValue::Ints(v.to_vec()),
        Attribute::Strings(v) => AttrValue::Strings(v.into_iter().map(<[u8]>::to_vec).collect()),
        Attribute::Tensor(t) => {
            AttrValue::Tensor(Tensor::from_bytes(t.elem_type, &t.dims(), t.data)?)
        }
        Attribute::StringTensor(t) => {
            AttrValue::Tensor(Tensor::strings_from_bytes(&t.dims(), t.iter())?)
        }
        Attribute::Graph(_) | Attribute::Unsupported(5 | 10) => AttrValue::Unsupported("graph"),
        Attribute::Unsupported(_) => AttrValue::Unsupported("unsupported attribute kind"),
    })
}

/// Longest chain of elementwise operations fused into one step.
const MAX_CHAIN: usize = 24;

/// Replaces runs of elementwise steps by fused chains ([`crate::exec::fuse`]). A run is consecutive
/// steps, each reading a value of the run before it; every value made inside the run except the
/// last must be read inside it and nowhere else (not by later steps, not as a program output).
fn fuse_chains(steps: Vec<Step>, outputs: &[Source]) -> Vec<Step> {
    // Who reads each slot: step indices, and usize::MAX for a program output.
    let mut readers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        for src in step.inputs.iter().flatten() {
            if let Source::Slot(s) = src {
                readers.entry(*s).or_default().push(i);
            }
        }
    }
    for src in outputs {
        if let Source::Slot(s) = src {
            readers.entry(*s).or_default().push(usize::MAX);
        }
    }
    let out_slot = |step: &Step| match step.outputs.as_slice() {
        [Some(s)] => Some(*s),
        _ => None,
    };
    // Whether step `i` (fusable) reads an operand made by steps `start..i`.
    let continues = |steps: &[Step], start: usize, i: usize| -> bool {
        let Some((_, operands)) = &steps[i].ew else {
            return false;
        };
        operands.iter().any(|&k| {
            matches!(steps[i].inputs.get(k), Some(Some(Source::Slot(s)))
                if (start..i).any(|j| out_slot(&steps[j]) == Some(*s)))
        })
    };
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        if steps[i].ew.is_none() || out_slot(&steps[i]).is_none() {
            i += 1;
            continue;
        }
        let mut end = i + 1;
        while end < steps.len()
            && end - i < MAX_CHAIN
            && out_slot(&steps[end]).is_some()
            && continues(&steps, i, end)
        {
            end += 1;
        }
        // Shrink until every value but the last stays inside and is used there.
        let inside = |e: usize| {
            (i..e - 1).all(|j| {
                let r = out_slot(&steps[j])
                    .and_then(|s| readers.get(&s))
                    .map_or(&[][..], Vec::as_slice);
                !r.is_empty() && r.iter().all(|&x| x > j && x < e)
            })
        };
        while end > i + 1 && !inside(end) {
            end -= 1;
        }
        // A Conv whose output only this run reads: the run becomes its post-op.
        let after_conv = i > 0
            && steps[i - 1].kind == "Conv"
            && out_slot(&steps[i - 1]).is_some_and(|s| {
                readers
                    .get(&s)
                    .is_some_and(|r| r.iter().all(|&x| x >= i && x < end))
            });
        // A single step is a chain too: the block walk splits it across the intra-op pool.
        if end > i {
            runs.push((i, end, after_conv));
        }
        i = end;
    }
    if runs.is_empty() {
        return steps;
    }
    let mut out = Vec::with_capacity(steps.len());
    let mut steps = steps.into_iter().enumerate().peekable();
    for (start, end, after_conv) in runs {
        while let Some((_, s)) = steps.next_if(|(k, _)| *k < start) {
            out.push(s);
        }
        let run: Vec<Step> = (start..end)
            .filter_map(|_| steps.next().map(|(_, s)| s))
            .collect();
        let chain = fused_step(run);
        match out.pop() {
            Some(conv) if after_conv => match with_post(conv, chain) {
                Ok(step) => out.push(step),
                Err(both) => {
                    let (conv, chain) = *both;
                    out.push(conv);
                    out.push(chain.into_step());
                }
            },
            prev => {
                out.extend(prev);
                out.push(chain.into_step());
            }
        }
    }
    out.extend(steps.map(|(_, s)| s));
    out
}

/// A run of fusable steps as one chain, before it becomes a step.
struct Chain {
    chain: FusedChain,
    first: String,
    inputs: Vec<Source>,
    outputs: Vec<Option<usize>>,
}

impl Chain {
    fn into_step(self) -> Step {
        let ops = self.chain.describe();
        Step {
            label: format!("{} (fused {ops})", self.first),
            kind: format!("fused {ops}"),
            kernel: Box::new(self.chain),
            inputs: self.inputs.into_iter().map(Some).collect(),
            outputs: self.outputs,
            frees: Vec::new(),
            ew: None,
        }
    }
}

/// A Conv step with `chain` applied to its output as it is produced ([`PostFused`]); both
/// back when the chain does not read the Conv's output.
fn with_post(conv: Step, chain: Chain) -> Result<Step, Box<(Step, Chain)>> {
    let made = conv.outputs.first().copied().flatten();
    let primary = chain
        .inputs
        .iter()
        .position(|s| matches!((s, made), (Source::Slot(x), Some(m)) if *x == m));
    let Some(primary) = primary else {
        return Err(Box::new((conv, chain)));
    };
    let ops = chain.chain.describe();
    let mut inputs = conv.inputs.clone();
    // The Conv's output is never stored: the chain reads it from the Conv directly.
    inputs.extend(
        chain
            .inputs
            .iter()
            .enumerate()
            .map(|(i, s)| (i != primary).then_some(*s)),
    );
    Ok(Step {
        label: format!("{} (fused {ops})", conv.label),
        kind: format!("Conv+{ops}"),
        kernel: Box::new(PostFused {
            first: conv.kernel,
            first_inputs: conv.inputs.len(),
            chain: chain.chain,
            primary,
        }),
        inputs,
        outputs: chain.outputs,
        frees: Vec::new(),
        ew: None,
    })
}

/// A kernel followed by an elementwise chain over its output 0, applied inside the kernel
/// where it can ([`OpKernel::run_with_post`]), else afterwards.
struct PostFused {
    first: Box<dyn OpKernel>,
    first_inputs: usize,
    chain: FusedChain,
    /// The chain input that is the first kernel's output.
    primary: usize,
}

impl OpKernel for PostFused {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Tensor>, OpError> {
        let (a, b) = inputs.split_at(self.first_inputs.min(inputs.len()));
        let mut post = ChainPost::new(&self.chain.chain, b, self.primary);
        let (outs, applied) = self.first.run_with_post(a, &mut post)?;
        let mut outs = outs.into_iter();
        let y = outs
            .next()
            .ok_or_else(|| OpError("the fused kernel produced no output".into()))?;
        outs.for_each(Tensor::recycle);
        if applied {
            return Ok(vec![y]);
        }
        let r = self.chain.run_with(b, self.primary, &y);
        Tensor::recycle(y);
        Ok(vec![r?])
    }
}

/// One chain for a run of fusable steps.
fn fused_step(run: Vec<Step>) -> Chain {
    let made: Vec<Option<usize>> = run
        .iter()
        .map(|s| s.outputs.first().copied().flatten())
        .collect();
    let mut ext: Vec<Source> = Vec::new();
    let mut operand = |src: Source| -> Operand {
        if let Source::Slot(s) = src
            && let Some(k) = made.iter().position(|m| *m == Some(s))
        {
            return Operand::Tmp(k);
        }
        let key = |x: &Source| match *x {
            Source::Input(i) => (0, i),
            Source::Constant(i) => (1, i),
            Source::Slot(i) => (2, i),
        };
        let i = match ext.iter().position(|e| key(e) == key(&src)) {
            Some(i) => i,
            None => {
                ext.push(src);
                ext.len() - 1
            }
        };
        Operand::Ext(i)
    };
    let first = run[0].label.clone();
    let output = run[run.len() - 1].outputs.clone();
    let mut ops = Vec::with_capacity(run.len());
    let mut parts = Vec::with_capacity(run.len());
    for step in run {
        let inputs: Vec<Option<Operand>> =
            step.inputs.iter().map(|s| s.map(&mut operand)).collect();
        let (op, which) = step.ew.expect("only fusable steps are fused");
        let operands = which
            .iter()
            .map(|&k| inputs[k].expect("operands are present"))
            .collect();
        ops.push(ChainOp { op, operands });
        parts.push(FusedOp {
            label: step.label,
            kernel: step.kernel,
            inputs,
        });
    }
    Chain {
        chain: FusedChain {
            chain: fast::chain::Chain { ops },
            parts,
        },
        first,
        inputs: ext,
        outputs: output,
    }
}

impl Program {
    /// Compiles `nodes` (in topological order) of `graph`. Run input `i` is bound to value
    /// `inputs[i]` (`None`: an input this program does not read); the run returns `outputs`.
    /// `known[i]`, where present, is run input `i`'s value in every run (an enclosing graph's
    /// constant): nodes computed from such values and constants only are evaluated here, once.
    pub fn compile(
        graph: &GraphView<'_>,
        nodes: &[u32],
        inputs: &[Option<u32>],
        outputs: &[u32],
        known: &[Option<&Tensor>],
    ) -> sdk::Result<Program> {
        let reg = crate::ops::registry();
        let mut slot_of: HashMap<u32, Source> = HashMap::new();
        for (i, v) in inputs.iter().enumerate() {
            if let Some(v) = v {
                slot_of.insert(*v, Source::Input(i));
            }
        }
        let mut constants = Vec::new();
        let mut steps = Vec::with_capacity(nodes.len());
        let mut num_slots = 0;
        // float16 run inputs are widened to float32 as the run starts ([`lower`]).
        for (i, v) in inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            let info = graph.value(v)?;
            if info.elem_type == Some(ElementType::Float16) {
                steps.push(convert_step(
                    format!("{} (float16 to float32)", info.name),
                    false,
                    Source::Input(i),
                    num_slots,
                ));
                slot_of.insert(v, Source::Slot(num_slots));
                num_slots += 1;
            }
        }
        // QDQ patterns folded into quantized ops ([`qdq`]).
        let planned = qdq::plan(graph, nodes, outputs)?;
        // How many nodes read each value (an output of the program counts as a reader).
        let mut reads: HashMap<u32, usize> = HashMap::new();
        for n in &planned {
            for v in n.inputs.iter().flatten().chain(&n.implicit_inputs) {
                *reads.entry(*v).or_default() += 1;
            }
        }
        for v in outputs {
            *reads.entry(*v).or_default() += 1;
        }
        // float16 initializers that only Gathers read, as their data: they stay float16 and the
        // Gather's rows are widened (by [`lower::Widened`]), not the whole table, which is most
        // of a float16 transformer's weights (its word embedding).
        let mut gather_only: HashMap<u32, bool> = HashMap::new();
        for n in &planned {
            for (j, v) in n.inputs.iter().enumerate() {
                let Some(v) = *v else { continue };
                let ok = j == 0 && n.op_type == "Gather" && n.domain.is_empty();
                *gather_only.entry(v).or_insert(true) &= ok;
            }
            for v in &n.implicit_inputs {
                gather_only.insert(*v, false);
            }
        }
        for v in outputs {
            gather_only.insert(*v, false);
        }
        // Values that share their data with another (an elided Cast's input and output): their
        // own count of readers is not their data's.
        let mut aliases: std::collections::HashSet<u32> = std::collections::HashSet::new();
        for node in planned {
            let id = node.id;
            let label = if node.name.is_empty() {
                format!("{}#{id}", node.op_type)
            } else {
                node.name.to_string()
            };
            let mut attributes = HashMap::new();
            let mut graphs = HashMap::new();
            for (name, a) in graph.attributes(&node)? {
                if let Attribute::Graph(g) = a {
                    graphs.insert(name.to_string(), g);
                }
                attributes.insert(
                    name.to_string(),
                    attr_value(a).map_err(|e| op_error(&label, e))?,
                );
            }
            // Explicit inputs, then the values nested graphs read implicitly.
            let all_inputs: Vec<Option<u32>> = node
                .inputs
                .iter()
                .copied()
                .chain(node.implicit_inputs.iter().map(|&v| Some(v)))
                .collect();
            let mut input_types = Vec::with_capacity(all_inputs.len());
            let mut srcs = Vec::with_capacity(all_inputs.len());
            for v in &all_inputs {
                let Some(v) = *v else {
                    srcs.push(None);
                    input_types.push(None);
                    continue;
                };
                let info = graph.value(v)?;
                input_types.push(info.elem_type);
                let src = match slot_of.get(&v) {
                    Some(s) => *s,
                    None if info.is_initializer() => {
                        let widen = info.elem_type != Some(ElementType::Float16)
                            || gather_only.get(&v) != Some(&true);
                        let owned = initializer(graph, v, info.elem_type, widen)
                            .map_err(|e| op_error(&label, e))?;
                        constants.push(owned);
                        let s = Source::Constant(constants.len() - 1);
                        slot_of.insert(v, s);
                        s
                    }
                    None => {
                        return Err(Error::invalid_graph(format!(
                            "node `{label}` reads `{}`, which is neither an input, an initializer nor produced earlier",
                            info.name
                        )));
                    }
                };
                srcs.push(Some(src));
            }
            // An inference BatchNormalization after a Conv of constant weights becomes part of
            // those weights.
            if node.op_type == "BatchNormalization"
                && node.domain.is_empty()
                && crate::fast::enabled()
                && let Some(x) = node.inputs.first().copied().flatten()
                && reads.get(&x) == Some(&1)
                && !aliases.contains(&x)
                && let [Some(y), rest @ ..] = node.outputs.as_slice()
                && rest.iter().all(Option::is_none)
                && let Some(conv_out) =
                    fold_batch_norm(graph, &node, &srcs, &mut steps, &mut constants)
            {
                slot_of.insert(*y, conv_out);
                continue;
            }
            let mut def = NodeDef {
                name: label.clone(),
                op_type: node.op_type.to_string(),
                domain: node.domain.to_string(),
                opset: node.opset,
                attributes,
                num_inputs: node.inputs.len(),
                num_outputs: node.outputs.len(),
                input_types,
            };
            let mut output_types = Vec::with_capacity(node.outputs.len());
            for v in &node.outputs {
                output_types.push(match v {
                    Some(v) => graph.value(*v)?.elem_type,
                    None => None,
                });
            }
            // float16 values are float32 here: the node runs on them as such, or rounds them
            // back first when its answer depends on it ([`lower`]).
            let widened =
                lower::touches_float16(&def, &output_types).then(|| lower::prepare(&mut def));
            let ew = classify(&def, |i| match srcs.get(i) {
                Some(Some(Source::Constant(c))) => constants.get(*c),
                _ => None,
            })
            .filter(|(_, operands)| {
                operands
                    .iter()
                    .all(|&k| matches!(srcs.get(k), Some(Some(_))))
            });
            let kernel: Box<dyn OpKernel> = if is_control_flow(node.op_type) {
                // The values the bodies read that are fixed: folded inside them too.
                let fixed: Vec<Option<&Tensor>> = srcs[node.inputs.len()..]
                    .iter()
                    .map(|s| s.and_then(|s| constant_value(s, &constants, known)))
                    .collect();
                control::build(graph, &node, &def, &graphs, &fixed)?
            } else {
                let schema = reg
                    .lookup(node.domain, node.op_type, node.opset)
                    .ok_or_else(|| {
                        Error::not_implemented(format!(
                            "node `{label}`: op {} (opset {}) is not supported",
                            node.op_type, node.opset
                        ))
                    })?;
                reg.make(schema, &def).map_err(|e| op_error(&label, e))?
            };
            let kernel = match widened {
                Some(round) => Box::new(lower::Widened {
                    inner: kernel,
                    round,
                }),
                None => kernel,
            };
            // A Cast from float to float (float16 included, as widened here) is the identity: its
            // readers read its input (ONNX Runtime removes these Casts too), unless the program
            // returns its output. The kernel is made all the same, so that its attributes are
            // checked.
            if node.op_type == "Cast"
                && node.domain.is_empty()
                && def.input_types.first() == Some(&Some(ElementType::Float))
                && matches!(def.attributes.get("to"), Some(AttrValue::Int(1)))
                && let [Some(src)] = srcs.as_slice()
                && let [Some(y)] = node.outputs.as_slice()
                && !outputs.contains(y)
            {
                slot_of.insert(*y, *src);
                aliases.insert(*y);
                aliases.extend(node.inputs.iter().flatten());
                continue;
            }
            // A node of constants only is evaluated once, here.
            if let Some(values) = fold(node.op_type, kernel.as_ref(), &srcs, (&constants, known))
                && values.len() >= node.outputs.iter().flatten().count()
            {
                for (v, t) in node.outputs.iter().zip(values) {
                    if let Some(v) = v {
                        constants.push(t);
                        slot_of.insert(*v, Source::Constant(constants.len() - 1));
                    }
                }
                continue;
            }
            let fixed: Vec<Option<TensorRef<'_>>> = srcs
                .iter()
                .map(|s| match s {
                    Some(Source::Constant(c)) => constants.get(*c).map(Tensor::view),
                    _ => None,
                })
                .collect();
            kernel.prepare(&fixed);
            let mut outs = Vec::with_capacity(node.outputs.len());
            for v in &node.outputs {
                outs.push(v.map(|v| {
                    let s = num_slots;
                    num_slots += 1;
                    slot_of.insert(v, Source::Slot(s));
                    s
                }));
            }
            steps.push(Step {
                kind: node.op_type.to_string(),
                label,
                kernel,
                inputs: srcs,
                outputs: outs,
                frees: Vec::new(),
                ew,
            });
        }
        let mut out_srcs = Vec::with_capacity(outputs.len());
        for &v in outputs {
            let src = match slot_of.get(&v) {
                Some(s) => *s,
                // A graph output that is an initializer of this graph.
                None if graph.value(v)?.is_initializer() => {
                    let ty = graph.value(v)?.elem_type;
                    constants
                        .push(initializer(graph, v, ty, true).map_err(|e| op_error("output", e))?);
                    Source::Constant(constants.len() - 1)
                }
                None => {
                    return Err(Error::invalid_graph(format!(
                        "output `{}` is not produced by the compiled nodes",
                        graph.value(v)?.name
                    )));
                }
            };
            // float16 outputs leave the program rounded back to float16.
            let src = if graph.value(v)?.elem_type == Some(ElementType::Float16) {
                steps.push(convert_step(
                    format!("{} (float32 to float16)", graph.value(v)?.name),
                    true,
                    src,
                    num_slots,
                ));
                num_slots += 1;
                Source::Slot(num_slots - 1)
            } else {
                src
            };
            out_srcs.push(src);
        }
        // Fused chains are a fast kernel: the reference level runs node by node.
        let mut steps = if crate::fast::enabled() {
            fuse_chains(steps, &out_srcs)
        } else {
            steps
        };
        // Each slot dies after the last step that reads it, unless the run returns it.
        let mut last_read: Vec<Option<usize>> = vec![None; num_slots];
        for (i, step) in steps.iter().enumerate() {
            for src in step.inputs.iter().flatten() {
                if let Source::Slot(s) = src {
                    last_read[*s] = Some(i);
                }
            }
            // A value nobody reads dies right after the step that made it.
            for s in step.outputs.iter().flatten() {
                last_read[*s].get_or_insert(i);
            }
        }
        for src in &out_srcs {
            if let Source::Slot(s) = src {
                last_read[*s] = None;
            }
        }
        for (s, last) in last_read.into_iter().enumerate() {
            if let Some(i) = last {
                steps[i].frees.push(s);
            }
        }
        Ok(Program {
            steps,
            constants,
            num_slots,
            outputs: out_srcs,
        })
    }

    /// Compiles a whole graph. Run inputs are its own inputs, then the values of `outer`
    /// (names of enclosing-graph values, in the order the caller passes them); `fixed[j]` is
    /// `outer[j]`'s value where the enclosing graph knows it at compile time.
    pub fn compile_graph(
        graph: &GraphView<'_>,
        outer: &[&str],
        fixed: &[Option<&Tensor>],
    ) -> sdk::Result<Program> {
        let mut inputs: Vec<Option<u32>> = graph.inputs()?.iter().map(|&v| Some(v)).collect();
        for name in outer {
            inputs.push(
                graph
                    .value_named(name)?
                    .filter(|&v| graph.value(v).is_ok_and(|i| i.producer.is_none())),
            );
        }
        let own = inputs.len() - outer.len();
        let known: Vec<Option<&Tensor>> = (0..inputs.len())
            .map(|i| {
                i.checked_sub(own)
                    .and_then(|j| fixed.get(j).copied().flatten())
            })
            .collect();
        let nodes: Vec<u32> = (0..graph.node_count() as u32).collect();
        Program::compile(graph, &nodes, &inputs, graph.outputs()?, &known)
    }

    /// Bytes of the constants the program holds (its weights, and what was folded).
    pub fn constant_bytes(&self) -> usize {
        self.constants.iter().map(Tensor::byte_len).sum()
    }

    /// Number of values a run returns.
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    fn fetch<'r, 'c: 'r>(
        &'r self,
        src: Source,
        inputs: &'r [Option<TensorRef<'c>>],
        slots: &'r [Option<Tensor>],
    ) -> Result<TensorRef<'r>, OpError> {
        match src {
            Source::Input(i) => inputs
                .get(i)
                .and_then(Option::as_ref)
                .map(TensorRef::reborrow)
                .ok_or_else(|| OpError(format!("input {i} is missing"))),
            Source::Constant(i) => Ok(self.constants[i].view()),
            Source::Slot(i) => slots[i]
                .as_ref()
                .map(Tensor::view)
                .ok_or_else(|| OpError("value used before it was computed".into())),
        }
    }

    /// Runs the program; returns its outputs.
    /// Whether a step is a convolution, matrix product or recurrence: work worth sharing with
    /// the intra-op pool whatever the input size.
    pub fn has_heavy_steps(&self) -> bool {
        const HEAVY: &[&str] = &[
            "Conv",
            "ConvTranspose",
            "ConvInteger",
            "QLinearConv",
            "MatMul",
            "MatMulInteger",
            "QLinearMatMul",
            "Gemm",
            "Einsum",
            "Attention",
            "LSTM",
            "GRU",
            "RNN",
        ];
        self.steps
            .iter()
            .any(|s| s.kind.split('+').any(|k| HEAVY.contains(&k)))
    }

    /// Whether a step scores rows one by one against a fixed model (tree ensembles, SVMs):
    /// one loop over the rows, shared with the intra-op pool in one hand-off, which pays on a
    /// few thousand input values already.
    pub fn has_row_model_steps(&self) -> bool {
        const ROWS: &[&str] = &[
            "TreeEnsembleClassifier",
            "TreeEnsembleRegressor",
            "TreeEnsemble",
            "SVMClassifier",
            "SVMRegressor",
        ];
        self.steps.iter().any(|s| ROWS.contains(&s.kind.as_str()))
    }

    pub fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Tensor>, OpError> {
        let mut slots: Vec<Option<Tensor>> = (0..self.num_slots).map(|_| None).collect();
        for step in &self.steps {
            let _timer = profile::Timer::start(&step.kind, &step.label);
            let results = {
                let mut args = Vec::with_capacity(step.inputs.len());
                for src in &step.inputs {
                    args.push(match src {
                        Some(s) => Some(self.fetch(*s, inputs, &slots)?),
                        None => None,
                    });
                }
                step.kernel
                    .run(&args)
                    .map_err(|e| OpError(format!("node `{}`: {e}", step.label)))?
            };
            let mut results = results.into_iter();
            for out in &step.outputs {
                let t = results.next();
                if let Some(slot) = out {
                    slots[*slot] = Some(t.ok_or_else(|| {
                        OpError(format!("node `{}` produced too few outputs", step.label))
                    })?);
                }
            }
            for &s in &step.frees {
                if let Some(t) = slots[s].take() {
                    Tensor::recycle(t);
                }
            }
        }
        let mut outs = Vec::with_capacity(self.outputs.len());
        for (i, src) in self.outputs.iter().enumerate() {
            // Computed values move out of their slot (unless a later output reads it too).
            let again = self.outputs[i + 1..]
                .iter()
                .any(|s| matches!((s, src), (Source::Slot(a), Source::Slot(b)) if a == b));
            outs.push(match src {
                Source::Slot(s) if !again => slots[*s]
                    .take()
                    .ok_or_else(|| OpError("output was not computed".into()))?,
                _ => self.fetch(*src, inputs, &slots)?.try_to_owned()?,
            });
        }
        Ok(outs)
    }
}

/// `EPX_CPU_PROFILE=1`: time spent per step kind (the op type, or the fused operations),
/// summed over the process and printed to stderr at exit. For finding where a model's time goes.
mod profile {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};

    /// Off, by step kind, or by node (`EPX_CPU_PROFILE=nodes`).
    fn mode() -> u8 {
        static MODE: OnceLock<u8> = OnceLock::new();
        *MODE.get_or_init(|| match std::env::var("EPX_CPU_PROFILE").as_deref() {
            Err(_) | Ok("" | "0") => 0,
            Ok("nodes") => 2,
            Ok(_) => 1,
        })
    }

    fn totals() -> &'static Mutex<HashMap<String, (u32, Duration)>> {
        static T: OnceLock<Mutex<HashMap<String, (u32, Duration)>>> = OnceLock::new();
        T.get_or_init(|| {
            extern "C" fn report() {
                // Runs from the C library's exit handlers: a panic must not unwind there.
                epx_plugin_api::ffi_boundary!(print_report())
            }
            fn print_report() {
                let Some(t) = T.get() else { return };
                let Ok(t) = t.lock() else { return };
                let mut rows: Vec<_> = t.iter().collect();
                rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
                let all: Duration = rows.iter().map(|r| r.1.1).sum();
                eprintln!(
                    "EPX_CPU_PROFILE: {:.1} ms in CPU EP steps",
                    all.as_secs_f64() * 1e3
                );
                for (k, (n, d)) in rows {
                    eprintln!(
                        "{:>10.2} ms {:>5.1}% {:>6}x  {k}",
                        d.as_secs_f64() * 1e3,
                        100.0 * d.as_secs_f64() / all.as_secs_f64().max(1e-12),
                        n
                    );
                }
            }
            // SAFETY: registering a plain extern "C" function with no arguments.
            unsafe { atexit(report) };
            Mutex::new(HashMap::new())
        })
    }

    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> i32;
    }

    pub(super) struct Timer<'a>(Option<(&'a str, Instant)>);

    impl<'a> Timer<'a> {
        pub(super) fn start(kind: &'a str, label: &'a str) -> Self {
            match mode() {
                0 => Timer(None),
                1 => Timer(Some((kind, Instant::now()))),
                _ => Timer(Some((label, Instant::now()))),
            }
        }
    }

    impl Drop for Timer<'_> {
        fn drop(&mut self) {
            if let Some((label, t0)) = self.0.take() {
                let d = t0.elapsed();
                if let Ok(mut t) = totals().lock() {
                    let e = t.entry(label.to_string()).or_default();
                    e.0 += 1;
                    e.1 += d;
                }
            }
        }
    }
}
