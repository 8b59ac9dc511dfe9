//! Control flow: `If`, `Loop`, `Scan` and `SequenceMap`, whose bodies are nested graphs compiled into
//! [`Program`]s. The values a body reads from enclosing graphs arrive as the node's implicit
//! inputs, after its explicit ones.

use std::collections::HashMap;

use epx_plugin_api::sdk::{self, Error, GraphView, NodeView};
use ndarray::Axis;

use crate::kernel::{Body, NodeDef, OpKernel};

use crate::error::{OpError, OpResult};
use crate::exec::passes::CompileOptions;
use crate::exec::program::Program;
use crate::tensor::{Elem, Tensor, TensorRef};

/// Builds the kernel of a control-flow node. `given[i]` is the value of explicit input `i`,
/// and `fixed[j]` that of implicit input `j`, where the enclosing program knows it at compile
/// time.
pub(crate) fn build(
    graph: &GraphView<'_>,
    node: &NodeView<'_>,
    def: &NodeDef,
    graphs: &HashMap<String, GraphView<'_>>,
    (given, fixed): (&[Option<&Tensor>], &[Option<&Tensor>]),
    options: &CompileOptions,
) -> sdk::Result<Box<dyn OpKernel>> {
    let mut outer = Vec::with_capacity(node.implicit_inputs.len());
    for &v in &node.implicit_inputs {
        outer.push(graph.value(v)?.name);
    }
    let body = |name: &str| -> sdk::Result<Program> {
        let g = graphs.get(name).ok_or_else(|| {
            Error::invalid_graph(format!(
                "{} node `{}` has no `{name}` graph attribute",
                def.op_type, def.name
            ))
        })?;
        Program::compile_graph(g, &[], &outer, fixed, options)
    };
    let explicit = node.inputs.len();
    Ok(match def.op_type.as_str() {
        "If" => Box::new(If {
            label: def.name.clone(),
            then_branch: body("then_branch")?,
            else_branch: body("else_branch")?,
        }),
        "Loop" => {
            let body_graph = graphs
                .get("body")
                .ok_or_else(|| Error::invalid_graph("Loop has no body"))?;
            let formal = body_graph.inputs()?.len();
            if formal < 2 || explicit < 2 || formal - 2 != explicit - 2 {
                return Err(Error::invalid_graph(format!(
                    "Loop `{}`: the body takes {formal} inputs but the node passes {explicit} (it must be 2 + the loop-carried values)",
                    def.name
                )));
            }
            // A carried value the body passes on unchanged is its initial value in every
            // iteration: where that is a constant, the body is compiled knowing it (a weight a
            // converter threads through the loop is then folded and packed once).
            let (ins, outs) = (body_graph.inputs()?, body_graph.outputs()?);
            let own: Vec<Option<&Tensor>> = (0..formal)
                .map(|i| {
                    let unchanged = i >= 2 && outs.get(i - 1) == ins.get(i);
                    given.get(i).copied().flatten().filter(|_| unchanged)
                })
                .collect();
            let body = Program::compile_graph(body_graph, &own, &outer, fixed, options)?;
            let carried = explicit - 2;
            // Loop-carried values the body hands back as they came (weights a converter
            // threads through the loop): read where they are in every iteration, not copied.
            let unchanged = (0..carried)
                .map(|k| body.passes_through(1 + k) == Some(2 + k))
                .collect();
            Box::new(Loop {
                label: def.name.clone(),
                body,
                carried,
                unchanged,
                explicit,
            })
        }
        "Scan" => {
            // Opset 8 puts an optional sequence_lens first and a batch axis before the
            // sequence axis of every input and output.
            let batched = def.opset < 9;
            let explicit = if batched { explicit - 1 } else { explicit };
            let scan_inputs = def
                .attr_int("num_scan_inputs")
                .map_err(|e| Error::invalid_graph(e.0))?
                .unwrap_or(0);
            let scan_inputs = usize::try_from(scan_inputs)
                .ok()
                .filter(|&m| m >= 1 && m <= explicit)
                .ok_or_else(|| {
                    Error::invalid_graph(format!(
                        "Scan `{}`: bad num_scan_inputs {scan_inputs}",
                        def.name
                    ))
                })?;
            let ints = |name: &str, n: usize| -> sdk::Result<Vec<i64>> {
                let v = def
                    .attr_ints(name)
                    .map_err(|e| Error::invalid_graph(e.0))?
                    .unwrap_or_else(|| vec![0; n]);
                if v.len() == n {
                    Ok(v)
                } else {
                    Err(Error::invalid_graph(format!(
                        "Scan `{}`: `{name}` needs {n} values, has {}",
                        def.name,
                        v.len()
                    )))
                }
            };
            let states = explicit - scan_inputs;
            let scan_outputs = def.num_outputs.saturating_sub(states);
            let scan = Scan {
                label: def.name.clone(),
                body: body("body")?,
                states,
                scan_inputs,
                explicit,
                input_axes: if batched {
                    vec![0; scan_inputs]
                } else {
                    ints("scan_input_axes", scan_inputs)?
                },
                input_reverse: ints(
                    if batched {
                        "directions"
                    } else {
                        "scan_input_directions"
                    },
                    scan_inputs,
                )?,
                output_axes: if batched {
                    vec![0; scan_outputs]
                } else {
                    ints("scan_output_axes", scan_outputs)?
                },
                output_reverse: if batched {
                    vec![0; scan_outputs]
                } else {
                    ints("scan_output_directions", scan_outputs)?
                },
            };
            if batched {
                Box::new(BatchedScan(scan))
            } else {
                Box::new(scan)
            }
        }
        "SequenceMap" => Box::new(SequenceMap {
            label: def.name.clone(),
            body: body("body")?,
            explicit,
        }),
        other => {
            return Err(Error::not_implemented(format!(
                "{other} is not a control-flow op"
            )));
        }
    })
}

/// The single value of a one-element tensor as a condition.
fn condition(t: &TensorRef<'_>, what: &str) -> OpResult<bool> {
    if t.shape().iter().product::<usize>() != 1 {
        return Err(OpError(format!(
            "{what} must hold one element, has shape {:?}",
            t.shape()
        )));
    }
    crate::dispatch_all!(
        TensorRef::reborrow(t),
        |v| Ok(v.iter().next().is_some_and(|x| x.to_scalar().is_nonzero())),
        what
    )
}

fn count(t: &TensorRef<'_>, what: &str) -> OpResult<i64> {
    match t {
        TensorRef::I64(a) if a.len() == 1 => Ok(a.iter().next().copied().unwrap_or(0)),
        _ => Err(OpError(format!(
            "{what} must be a one-element int64 tensor, got {} {:?}",
            t.elem_type(),
            t.shape()
        ))),
    }
}

/// Slice `index` of `t` along `axis` (the axis removed).
fn slice(t: &TensorRef<'_>, axis: usize, index: usize) -> OpResult<Tensor> {
    crate::dispatch_any!(
        TensorRef::reborrow(t),
        |v| Ok(Tensor::from(v.index_axis(Axis(axis), index).to_owned())),
        "Scan"
    )
}

fn stack_typed<'a, T: Elem>(
    first: ndarray::ArrayViewD<'a, T>,
    items: &'a [Tensor],
    axis: usize,
) -> OpResult<Tensor> {
    let mut views = vec![first];
    for t in &items[1..] {
        views.push(
            T::unwrap_ref(&t.view())
                .ok_or_else(|| OpError("iterations produced different element types".into()))?,
        );
    }
    ndarray::stack(Axis(axis), &views)
        .map(T::wrap)
        .map_err(|e| OpError(format!("iterations produced different shapes: {e}")))
}

/// A Loop's scan output, stacked as the iterations come: the elements of each one appended to
/// one byte buffer, so that ten million scalar iterations hold their 40 MB of floats and not a
/// tensor (with its shape and allocation) each. Types whose elements share bytes (4-bit, 2-bit)
/// and strings keep the tensors and stack them at the end.
#[derive(Default)]
struct ScanStack {
    /// Element type and shape of the first iteration's value.
    first: Option<(epx_plugin_api::ElementType, Vec<usize>)>,
    bytes: Vec<u8>,
    count: usize,
    kept: Vec<Tensor>,
}

impl ScanStack {
    fn push(&mut self, t: Tensor, label: &str) -> OpResult<()> {
        let ty = t.elem_type();
        let flat = crate::tensor::packed_bits(ty).is_none() && ty.storage_bytes(1).is_some();
        if !flat || !self.kept.is_empty() {
            self.kept.push(t);
            return Ok(());
        }
        match &self.first {
            None => self.first = Some((ty, t.shape().to_vec())),
            Some((first_ty, shape)) if *first_ty == ty && shape == t.shape() => {}
            Some((first_ty, shape)) => {
                return Err(OpError(format!(
                    "Loop `{label}`: iteration {} gave a scan output of {ty} {:?}, the first gave {first_ty} {shape:?}",
                    self.count,
                    t.shape()
                )));
            }
        }
        let n = t.byte_len();
        let total = self
            .bytes
            .len()
            .checked_add(n)
            .filter(|&b| b as u64 <= crate::limits::max_tensor_bytes())
            .ok_or_else(|| {
                OpError(format!(
                    "Loop `{label}`: the scan output after {} iterations is more than the {} bytes allocated for one tensor (EPX_MAX_TENSOR_BYTES; default: the machine's memory)",
                    self.count + 1,
                    crate::limits::max_tensor_bytes()
                ))
            })?;
        self.bytes.try_reserve(n).map_err(|_| {
            OpError(format!(
                "Loop `{label}`: cannot allocate {total} bytes for a scan output"
            ))
        })?;
        let start = self.bytes.len();
        self.bytes.resize(total, 0);
        t.write_bytes(&mut self.bytes[start..])?;
        self.count += 1;
        Ok(())
    }

    fn finish(self) -> OpResult<Tensor> {
        match self.first {
            Some((ty, shape)) if self.kept.is_empty() => {
                let mut full = vec![self.count];
                full.extend(shape);
                Tensor::from_bytes(ty, &full, &self.bytes)
            }
            _ => stack(&self.kept, 0),
        }
    }
}

/// Stacks per-iteration values along a new `axis`.
fn stack(items: &[Tensor], axis: usize) -> OpResult<Tensor> {
    let Some(first) = items.first() else {
        return Tensor::from_vec::<f32>(&[0], Vec::new());
    };
    crate::dispatch_any!(first.view(), |v| stack_typed(v, items, axis), "stack")
}

fn normalize(axis: i64, rank: usize, what: &str) -> OpResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(OpError(format!(
            "{what}: axis {axis} out of range for rank {rank}"
        )))
    }
}

/// Inputs `range`, each of which must be given.
fn present<'b, 'a>(
    inputs: &'b [Option<TensorRef<'a>>],
    range: std::ops::Range<usize>,
    op: &str,
    label: &str,
) -> OpResult<Vec<&'b TensorRef<'a>>> {
    range
        .map(|i| {
            inputs
                .get(i)
                .and_then(Option::as_ref)
                .ok_or_else(|| OpError(format!("{op} `{label}`: input {i} is missing")))
        })
        .collect()
}

/// Runs the body once per item of the input sequences (the first input, and every additional
/// input that is a sequence; tensors are passed whole), collecting each output into a sequence.
struct SequenceMap {
    label: String,
    body: Program,
    explicit: usize,
}

impl OpKernel for SequenceMap {
    fn bodies(&self) -> Vec<(&'static str, &dyn Body)> {
        vec![("body", &self.body)]
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let err = |m: String| OpError(format!("SequenceMap `{}`: {m}", self.label));
        let explicit = present(inputs, 0..self.explicit, "SequenceMap", &self.label)?;
        let first = explicit[0].as_sequence("SequenceMap input 0")?;
        let len = first.items.len();
        for (i, t) in explicit.iter().enumerate().skip(1) {
            if let TensorRef::Seq(s) = t
                && s.items.len() != len
            {
                return Err(err(format!(
                    "input sequence {i} has {} items, input 0 has {len}",
                    s.items.len()
                )));
            }
        }
        let outer = inputs.get(self.explicit..).unwrap_or(&[]);
        let mut outs: Vec<Vec<Tensor>> = vec![Vec::with_capacity(len); self.body.num_outputs()];
        for k in 0..len {
            let mut args: Vec<Option<TensorRef<'_>>> =
                Vec::with_capacity(self.explicit + outer.len());
            for t in &explicit {
                args.push(Some(match t {
                    TensorRef::Seq(s) => s.items[k].view(),
                    t => t.reborrow(),
                }));
            }
            args.extend(outer.iter().map(|t| t.as_ref().map(TensorRef::reborrow)));
            for (o, t) in outs.iter_mut().zip(self.body.run(&args)?) {
                o.push(t);
            }
        }
        Ok(outs
            .into_iter()
            .map(|items| {
                let elem_type = items
                    .first()
                    .map_or(first.elem_type, |t: &Tensor| t.elem_type());
                Tensor::Seq(std::sync::Arc::new(crate::tensor::Sequence {
                    elem_type,
                    items,
                }))
            })
            .collect())
    }
}

struct If {
    label: String,
    then_branch: Program,
    else_branch: Program,
}

impl OpKernel for If {
    fn bodies(&self) -> Vec<(&'static str, &dyn Body)> {
        vec![
            ("then_branch", &self.then_branch),
            ("else_branch", &self.else_branch),
        ]
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let cond = inputs
            .first()
            .and_then(Option::as_ref)
            .ok_or_else(|| OpError(format!("If `{}`: no condition", self.label)))?;
        let branch = if condition(cond, "If condition")? {
            &self.then_branch
        } else {
            &self.else_branch
        };
        // Branches take no inputs of their own: only the enclosing values, after `cond`.
        branch.run(&inputs[1..])
    }
}

struct Loop {
    label: String,
    body: Program,
    carried: usize,
    /// Per loop-carried value: the body passes it on unchanged.
    unchanged: Vec<bool>,
    explicit: usize,
}

impl OpKernel for Loop {
    fn bodies(&self) -> Vec<(&'static str, &dyn Body)> {
        vec![("body", &self.body)]
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let max = match inputs.first().and_then(Option::as_ref) {
            Some(t) => Some(count(t, "Loop trip count M")?),
            None => None,
        };
        let mut cond = match inputs.get(1).and_then(Option::as_ref) {
            Some(t) => condition(t, "Loop condition")?,
            None => true,
        };
        // The values carried from one iteration to the next: `None` for those the body passes
        // on unchanged, read from the Loop's own inputs every time.
        let mut carried: Vec<Option<Tensor>> = Vec::with_capacity(self.carried);
        let mut initial: Vec<&TensorRef<'_>> = Vec::with_capacity(self.carried);
        for k in 0..self.carried {
            let t = inputs.get(2 + k).and_then(Option::as_ref).ok_or_else(|| {
                OpError(format!(
                    "Loop `{}`: loop-carried input {k} is missing",
                    self.label
                ))
            })?;
            initial.push(t);
            carried.push(if self.unchanged[k] {
                None
            } else {
                Some(t.try_to_owned()?)
            });
        }
        // The body's outputs the loop keeps no copy of: the unchanged carried values.
        let mut skip = vec![false; 1 + self.carried];
        skip[1..].copy_from_slice(&self.unchanged);
        let missing = || {
            OpError(format!(
                "Loop `{}`: the body returned too few outputs",
                self.label
            ))
        };
        let outer = inputs.get(self.explicit..).unwrap_or(&[]);
        let scan_count = self.body.num_outputs().saturating_sub(1 + self.carried);
        let mut scans: Vec<ScanStack> = (0..scan_count).map(|_| ScanStack::default()).collect();
        let mut i: i64 = 0;
        while cond && max.is_none_or(|m| i < m) {
            let iter = Tensor::scalar(i);
            let cond_in = Tensor::scalar(cond);
            let mut args: Vec<Option<TensorRef<'_>>> =
                Vec::with_capacity(2 + self.carried + outer.len());
            args.push(Some(iter.view()));
            args.push(Some(cond_in.view()));
            args.extend(carried.iter().zip(&initial).map(|(c, t)| {
                Some(match c {
                    Some(c) => c.view(),
                    None => t.reborrow(),
                })
            }));
            args.extend(outer.iter().map(|t| t.as_ref().map(TensorRef::reborrow)));
            let mut outs = self.body.run_except(&args, &skip)?.into_iter();
            drop(args);
            let c = outs.next().flatten().ok_or_else(missing)?;
            cond = condition(&c.view(), "Loop body condition")?;
            for (k, c) in carried.iter_mut().enumerate() {
                let out = outs.next().ok_or_else(missing)?;
                if !self.unchanged[k] {
                    *c = Some(out.ok_or_else(missing)?);
                }
            }
            for (k, t) in outs.enumerate() {
                if let (Some(s), Some(t)) = (scans.get_mut(k), t) {
                    s.push(t, &self.label)?;
                }
            }
            i += 1;
        }
        let mut result = Vec::with_capacity(self.carried + scans.len());
        for (c, t) in carried.into_iter().zip(initial) {
            result.push(match c {
                Some(c) => c,
                None => t.try_to_owned()?,
            });
        }
        for s in scans {
            result.push(s.finish()?);
        }
        Ok(result)
    }
}

struct Scan {
    label: String,
    body: Program,
    states: usize,
    scan_inputs: usize,
    explicit: usize,
    input_axes: Vec<i64>,
    input_reverse: Vec<i64>,
    output_axes: Vec<i64>,
    output_reverse: Vec<i64>,
}

/// Scan of opset 8: input 0 is the optional `sequence_lens` (one length per batch entry), and
/// every state and scan input and output has a leading batch axis. Each batch entry runs as an
/// opset-9 scan over its first `sequence_lens[b]` steps; scan outputs are zero past its length.
struct BatchedScan(Scan);

/// `t` narrowed to `0..len` along `axis`.
fn prefix(t: &Tensor, axis: usize, len: usize) -> OpResult<Tensor> {
    crate::dispatch_any!(
        t.view(),
        |v| Ok(Tensor::from(
            v.slice_axis(Axis(axis), ndarray::Slice::from(0..len))
                .to_owned()
        )),
        "Scan"
    )
}

/// `t` padded with zeros to `len` along `axis`.
fn pad_to(t: Tensor, axis: usize, len: usize) -> OpResult<Tensor> {
    let have = t.shape().get(axis).copied().unwrap_or(0);
    if have >= len {
        return Ok(t);
    }
    let mut shape = t.shape().to_vec();
    shape[axis] = len - have;
    crate::dispatch_any!(
        t.view(),
        |v| {
            let zeros = ndarray::ArrayD::from_elem(ndarray::IxDyn(&shape), Default::default());
            ndarray::concatenate(Axis(axis), &[v.view(), zeros.view()])
                .map(Tensor::from)
                .map_err(|e| OpError(format!("Scan: {e}")))
        },
        "Scan"
    )
}

impl OpKernel for BatchedScan {
    fn bodies(&self) -> Vec<(&'static str, &dyn Body)> {
        vec![("body", &self.0.body)]
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let scan = &self.0;
        let err = |m: String| OpError(format!("Scan `{}`: {m}", scan.label));
        let explicit = present(inputs, 1..1 + scan.explicit, "Scan", &scan.label)?;
        let batch = explicit
            .first()
            .and_then(|t| t.shape().first().copied())
            .ok_or_else(|| err("inputs need a batch axis".into()))?;
        if explicit.iter().any(|t| t.shape().first() != Some(&batch)) {
            return Err(err("inputs have different batch sizes".into()));
        }
        let max_len = explicit[scan.states..]
            .first()
            .and_then(|t| t.shape().get(1).copied())
            .unwrap_or(0);
        let lens: Vec<usize> = match inputs.first().and_then(Option::as_ref) {
            None => vec![max_len; batch],
            Some(l) => l
                .to_i64_vec("Scan sequence_lens")?
                .into_iter()
                .map(|n| {
                    usize::try_from(n)
                        .ok()
                        .filter(|&n| n <= max_len)
                        .ok_or_else(|| err(format!("sequence length {n} is outside 0..={max_len}")))
                })
                .collect::<OpResult<_>>()?,
        };
        if lens.len() != batch {
            return Err(err(format!(
                "{} sequence_lens for a batch of {batch}",
                lens.len()
            )));
        }
        let outer = inputs.get(1 + scan.explicit..).unwrap_or(&[]);
        let mut per_output: Vec<Vec<Tensor>> = Vec::new();
        for (b, &len) in lens.iter().enumerate() {
            let mut owned = Vec::with_capacity(explicit.len());
            for (i, t) in explicit.iter().enumerate() {
                let entry = slice(t, 0, b)?;
                owned.push(if i >= scan.states {
                    prefix(&entry, 0, len)?
                } else {
                    entry
                });
            }
            let mut args: Vec<Option<TensorRef<'_>>> =
                owned.iter().map(|t| Some(t.view())).collect();
            args.extend(outer.iter().map(|t| t.as_ref().map(TensorRef::reborrow)));
            let outs = scan.run(&args)?;
            per_output.resize_with(outs.len(), Vec::new);
            for (k, t) in outs.into_iter().enumerate() {
                let t = if k >= scan.states {
                    pad_to(t, 0, max_len)?
                } else {
                    t
                };
                per_output[k].push(t);
            }
        }
        per_output.iter().map(|items| stack(items, 0)).collect()
    }
}

impl OpKernel for Scan {
    fn bodies(&self) -> Vec<(&'static str, &dyn Body)> {
        vec![("body", &self.body)]
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let get = |i: usize| {
            inputs
                .get(i)
                .and_then(Option::as_ref)
                .ok_or_else(|| OpError(format!("Scan `{}`: input {i} is missing", self.label)))
        };
        let mut states: Vec<Tensor> = (0..self.states)
            .map(|i| get(i).and_then(|t| t.try_to_owned()))
            .collect::<OpResult<_>>()?;
        let mut seqs = Vec::with_capacity(self.scan_inputs);
        let mut length = None;
        for j in 0..self.scan_inputs {
            let t = get(self.states + j)?;
            let axis = normalize(self.input_axes[j], t.shape().len(), "Scan input")?;
            let n = t.shape()[axis];
            if length.is_some_and(|l| l != n) {
                return Err(OpError(format!(
                    "Scan `{}`: scan inputs have different lengths",
                    self.label
                )));
            }
            length = Some(n);
            seqs.push((t, axis));
        }
        let length = length.unwrap_or(0);
        let outer = inputs.get(self.explicit..).unwrap_or(&[]);
        let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); self.output_axes.len()];
        for step in 0..length {
            let slices: Vec<Tensor> = seqs
                .iter()
                .enumerate()
                .map(|(j, (t, axis))| {
                    let idx = if self.input_reverse[j] == 1 {
                        length - 1 - step
                    } else {
                        step
                    };
                    slice(t, *axis, idx)
                })
                .collect::<OpResult<_>>()?;
            let mut args: Vec<Option<TensorRef<'_>>> = Vec::new();
            args.extend(states.iter().map(|t| Some(t.view())));
            args.extend(slices.iter().map(|t| Some(t.view())));
            args.extend(outer.iter().map(|t| t.as_ref().map(TensorRef::reborrow)));
            let mut outs = self.body.run(&args)?.into_iter();
            drop(args);
            states = outs.by_ref().take(self.states).collect();
            for (k, t) in outs.enumerate() {
                if let Some(s) = scans.get_mut(k) {
                    s.push(t);
                }
            }
        }
        let mut result = states;
        for (k, mut s) in scans.into_iter().enumerate() {
            if self.output_reverse[k] == 1 {
                s.reverse();
            }
            let rank = s.first().map_or(0, |t| t.shape().len()) + 1;
            let axis = normalize(self.output_axes[k], rank, "Scan output")?;
            result.push(stack(&s, axis)?);
        }
        Ok(result)
    }
}
