//! Running a session: the plan's kernels and copies in order, each kernel's outputs checked
//! against the model's declarations, values released as soon as nothing reads them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use epx_plugin_api::abi::EpxStatusCode;

use super::compiled::Kernel;
use super::compiled::Session;
use super::plan::{Action, Source};
use crate::error::{Error, Result};
use crate::model::ir::{Dim, ValueId};
use crate::value::{DeviceMemory, DeviceTensor, Tensor, Value};

/// What `run` returns: the graph outputs, in the model's order, in host memory (except those
/// kept on their device with [`SessionBuilder::with_device_outputs`]).
#[derive(Debug)]
pub struct SessionOutputs {
    outputs: Vec<(String, Value)>,
}

/// How a run goes: its terminate flag, which another thread sets to cancel the run (ONNX
/// Runtime's `RunOptions.terminate`). Cheap to clone; clones share the flag.
///
/// A run made with options whose flag is set stops at its next check: before each kernel and
/// copy of the session's plan, and inside kernels of EPs that read the flag (ABI 1.8; the CPU EP
/// checks between nodes and at each iteration of a Loop or Scan), and fails with
/// [`Error::Cancelled`]. The flag stays set (runs made with these options fail at once) until
/// [`RunOptions::set_terminate`] clears it.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    terminate: Arc<AtomicBool>,
}

impl RunOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or clears) the terminate flag; safe from any thread, while runs are in progress.
    pub fn set_terminate(&self, terminate: bool) {
        self.terminate.store(terminate, Ordering::Relaxed);
    }

    /// Whether the terminate flag is set.
    pub fn terminated(&self) -> bool {
        self.terminate.load(Ordering::Relaxed)
    }

    pub(crate) fn flag(&self) -> &AtomicBool {
        &self.terminate
    }
}

/// [`Error::Cancelled`] when `flag` is set: a session creation checks it between its steps.
pub(crate) fn check_cancelled(flag: Option<&AtomicBool>, when: &str) -> Result<()> {
    match flag {
        Some(f) if f.load(Ordering::Relaxed) => Err(Error::Cancelled(format!(
            "the session creation was cancelled {when} (its cancellation flag is set)"
        ))),
        _ => Ok(()),
    }
}

impl SessionOutputs {
    /// A host-memory output.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        match self.outputs.iter().find(|(n, _)| n == name) {
            Some((_, Value::Host(t))) => Some(t),
            _ => None,
        }
    }

    /// An output kept in its EP's memory.
    pub fn device(&self, name: &str) -> Option<&DeviceTensor> {
        match self.outputs.iter().find(|(n, _)| n == name) {
            Some((_, Value::Device(t))) => Some(t),
            _ => None,
        }
    }

    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// An output of any kind: a tensor (host or device), sequence, map or optional.
    pub fn value(&self, name: &str) -> Option<&Value> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Every output, by name, in the model's order.
    pub fn values(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.outputs.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// The host-memory tensor outputs.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.outputs.iter().filter_map(|(n, v)| match v {
            Value::Host(t) => Some((n.as_str(), t)),
            _ => None,
        })
    }
}

impl IntoIterator for SessionOutputs {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.outputs.into_iter()
    }
}

impl std::ops::Index<&str> for SessionOutputs {
    type Output = Tensor;
    fn index(&self, name: &str) -> &Tensor {
        match self.get(name) {
            Some(t) => t,
            None => panic!("the session has no host-memory output named `{name}`"),
        }
    }
}

impl Session {
    /// Runs the model. Every graph input must be given, by name: tensors, or [`Value`]s for
    /// inputs that are sequences, maps or optionals.
    pub fn run<S: AsRef<str>, V: Into<Value>>(
        &self,
        inputs: impl IntoIterator<Item = (S, V)>,
    ) -> Result<SessionOutputs> {
        self.run_with_options(inputs, None)
    }

    /// Runs the model as [`Session::run`] does, cancellable through `options`
    /// ([`RunOptions::set_terminate`] from another thread).
    pub fn run_with_options<S: AsRef<str>, V: Into<Value>>(
        &self,
        inputs: impl IntoIterator<Item = (S, V)>,
        options: Option<&RunOptions>,
    ) -> Result<SessionOutputs> {
        let start = self.profiler.as_ref().map(|_| Instant::now());
        let terminate = options.map(RunOptions::flag);
        let out = self.within_limits(|| self.run_unscoped(inputs, terminate));
        if let (Some(p), Some(t)) = (&self.profiler, start) {
            p.runs.add(t);
        }
        out
    }

    /// Runs `f` under this session's tensor limit ([`SessionBuilder::with_max_tensor_bytes`];
    /// the process's when it has none): for callers that make the session's input tensors
    /// themselves, as the C API does.
    ///
    /// [`SessionBuilder::with_max_tensor_bytes`]: crate::SessionBuilder::with_max_tensor_bytes
    pub fn within_limits<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::with_max_tensor_bytes(self.max_tensor_bytes, f)
    }

    fn run_unscoped<S: AsRef<str>, V: Into<Value>>(
        &self,
        inputs: impl IntoIterator<Item = (S, V)>,
        terminate: Option<&AtomicBool>,
    ) -> Result<SessionOutputs> {
        let terminated = || terminate.is_some_and(|t| t.load(Ordering::Relaxed));
        let cancelled = || {
            Error::Cancelled(
                "the run was terminated (its RunOptions' terminate flag is set)".into(),
            )
        };
        let g = &self.model.graph;
        let mut homes: Vec<Option<Value>> = (0..g.values.len()).map(|_| None).collect();
        let mut copies: Vec<Option<Value>> = (0..self.plan.copies.len()).map(|_| None).collect();
        for (name, value) in inputs {
            let name = name.as_ref();
            let value: Value = value.into();
            let id = g
                .value_id(name)
                .filter(|id| g.values[*id].is_graph_input)
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "the model has no input named `{name}`; its inputs are: {}",
                        self.input_names()
                    ))
                })?;
            if homes[id].is_some() {
                return Err(Error::InvalidInput(format!("input `{name}` given twice")));
            }
            self.check_input(id, &value)?;
            homes[id] = Some(value);
        }
        if let Some(&missing) = g.inputs.iter().find(|&&i| homes[i].is_none()) {
            return Err(Error::InvalidInput(format!(
                "input `{}` was not given; the model's inputs are: {}",
                g.values[missing].name,
                self.input_names()
            )));
        }
        for (ai, action) in self.plan.actions.iter().enumerate() {
            if terminated() {
                return Err(cancelled());
            }
            let started = self.profiler.as_ref().map(|_| Instant::now());
            match *action {
                Action::Kernel(k) => {
                    let kernel = &self.kernels[k];
                    let _span = tracing::trace_span!(
                        "kernel",
                        provider = kernel.compiled.provider().name()
                    )
                    .entered();
                    let outputs = {
                        // bounded: one per input of the kernel (the model's graph).
                        let mut args = Vec::with_capacity(kernel.group.inputs.len());
                        for (&src, &v) in
                            self.plan.kernel_inputs[k].iter().zip(&kernel.group.inputs)
                        {
                            args.push(Some(read(&homes, &copies, src).ok_or_else(|| {
                                Error::Run(format!(
                                    "internal: value `{}` not computed before use",
                                    g.values[v].name
                                ))
                            })?));
                        }
                        // An EP that stopped for the terminate flag fails its call: the run
                        // was cancelled, whatever the EP says.
                        kernel
                            .compiled
                            .execute(&args, terminate)
                            .map_err(|e| if terminated() { cancelled() } else { e })?
                    };
                    if let (Some(p), Some(t)) = (&self.profiler, started) {
                        p.kernels[k].add(t);
                    }
                    for (i, (&v, out)) in kernel.group.outputs.iter().zip(outputs).enumerate() {
                        self.check_output(kernel, i, v, &out)?;
                        homes[v] = Some(out);
                    }
                }
                Action::Copy(c) => {
                    let step = &self.plan.copies[c];
                    let src = read(&homes, &copies, step.src).ok_or_else(|| {
                        Error::Run(format!(
                            "internal: `{}` not computed before its copy",
                            g.values[step.value].name
                        ))
                    })?;
                    let moved = match (src, step.to) {
                        (Value::Host(t), Some(p)) => {
                            let memory: Arc<dyn DeviceMemory> = self.providers[p].clone();
                            Value::Device(DeviceTensor::from_host(&memory, t)?)
                        }
                        (Value::Device(t), None) => Value::Host(t.to_host()?),
                        _ => {
                            return Err(Error::Run(format!(
                                "internal: bad copy of `{}`",
                                g.values[step.value].name
                            )));
                        }
                    };
                    self.copy_bytes[c].store(moved.byte_len() as u64, Ordering::Relaxed);
                    if let (Some(p), Some(t)) = (&self.profiler, started) {
                        p.copies[c].add(t);
                    }
                    copies[c] = Some(moved);
                }
            }
            for s in &self.plan.release_after[ai] {
                match *s {
                    Source::Home(v) => homes[v] = None,
                    Source::Copy(c) => copies[c] = None,
                }
            }
        }
        // bounded: one per graph output.
        let mut outputs = Vec::with_capacity(g.outputs.len());
        for (i, (&o, &src)) in g.outputs.iter().zip(&self.plan.outputs).enumerate() {
            let used_again = self.plan.output_reused[i];
            let slot = match src {
                Source::Home(v) => &mut homes[v],
                Source::Copy(c) => &mut copies[c],
            };
            let value = match (slot.take(), &g.values[o].initializer) {
                (Some(Value::Device(_)), _) if used_again => {
                    return Err(Error::Run(format!(
                        "output `{}` is listed twice and kept on a device",
                        g.values[o].name
                    )));
                }
                (Some(v), _) if used_again => {
                    let copy = v.try_clone()?;
                    *slot = Some(v);
                    copy
                }
                (Some(v), _) => v,
                (None, Some(init)) => Value::Host(init.try_clone()?),
                (None, None) => {
                    return Err(Error::Run(format!(
                        "output `{}` was not produced",
                        g.values[o].name
                    )));
                }
            };
            outputs.push((g.values[o].name.clone(), value));
        }
        Ok(SessionOutputs { outputs })
    }

    /// Checks a kernel output against the type and static shape the host knows for it, declared
    /// by the model or inferred from it. For the built-in CPU EP, inferred shapes are not
    /// checked and a shape against the declaration is a warning, once per session; for another
    /// EP a shape against what the host infers (or a declaration its inference confirms) is an
    /// error, against a declaration alone a warning, as ONNX Runtime warns for any EP.
    fn check_output(&self, kernel: &Kernel, index: usize, v: ValueId, out: &Value) -> Result<()> {
        let (want_type, want_dims, inferred, confirmed) = &kernel.expected[index];
        let name = &self.model.graph.values[v].name;
        let provider = kernel.compiled.provider().name();
        let bad = |message: String| Error::Provider {
            provider: provider.to_string(),
            call: "execute",
            code: EpxStatusCode::InvalidGraph,
            message,
        };
        if let (Some(t), Some(have)) = (want_type, out.elem_type()) {
            if *t != have {
                return Err(bad(format!(
                    "output `{name}` is {have}, but the model declares {t}"
                )));
            }
        }
        self.check_kind(kernel, v, out)?;
        // The reference CPU EP computes what the nodes define: an inferred shape is no contract
        // for it (the host's inference is what would be wrong).
        if *inferred && kernel.lenient_shapes {
            return Ok(());
        }
        if let (Some(dims), Some(shape)) = (want_dims, out.shape()) {
            let ok = dims.len() == shape.len()
                && dims
                    .iter()
                    .zip(shape)
                    .all(|(d, &s)| d.is_none_or(|d| d == s as u64));
            if !ok {
                let want: Vec<String> = dims
                    .iter()
                    .map(|d| d.map_or_else(|| "?".to_string(), |d| d.to_string()))
                    .collect();
                let want = want.join(", ");
                if !kernel.lenient_shapes && (*inferred || *confirmed) {
                    let source = if *inferred {
                        "the host infers from the model"
                    } else {
                        "the model declares"
                    };
                    return Err(bad(format!(
                        "the kernel of nodes {}: output `{name}` has shape {shape:?}, but \
                         {source} [{want}]",
                        node_names(&self.model.graph, &kernel.group.nodes)
                    )));
                }
                if !kernel.shape_warned[index].swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "value `{name}` has shape {shape:?} as its nodes compute it, but the \
                         model declares [{want}]; the computed shape is used (said once per \
                         session)"
                    );
                }
            }
        }
        Ok(())
    }

    /// The output's kind (tensor, sequence, ...) against the declared type.
    fn check_kind(&self, kernel: &Kernel, v: ValueId, out: &Value) -> Result<()> {
        let declared = &self.model.graph.values[v].ty;
        if declared.admits(out) {
            return Ok(());
        }
        Err(Error::Provider {
            provider: kernel.compiled.provider().name().to_string(),
            call: "execute",
            code: EpxStatusCode::InvalidGraph,
            message: format!(
                "output `{}` is a {}, but the model declares {declared}",
                self.model.graph.values[v].name,
                out.type_name()
            ),
        })
    }

    fn input_names(&self) -> String {
        let g = &self.model.graph;
        g.inputs
            .iter()
            .map(|&i| format!("`{}`", g.values[i].name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn check_input(&self, id: ValueId, value: &Value) -> Result<()> {
        let v = &self.model.graph.values[id];
        if let (Some(want), Value::Host(t)) = (v.elem_type(), value) {
            if want != t.elem_type() {
                return Err(Error::InvalidInput(format!(
                    "input `{}` must be {want}, got {}",
                    v.name,
                    t.elem_type()
                )));
            }
        }
        if !v.ty.admits(value) {
            return Err(Error::InvalidInput(format!(
                "input `{}` must be a {}, got a {}",
                v.name,
                v.ty,
                value.type_name()
            )));
        }
        let Value::Host(t) = value else {
            return Ok(());
        };
        // A declaration without dimensions holds nothing: ONNX Runtime takes a tensor of any
        // shape for an input declared as a scalar (`inference_session.cc`, `ValidateInputsOutputs`
        // checks shapes only when the declaration has a dimension), and programs feed `[1]` there.
        if let Some(shape) = v.shape().filter(|s| !s.is_empty()) {
            let ok = shape.len() == t.shape().len()
                && shape
                    .iter()
                    .zip(t.shape())
                    .all(|(d, &n)| !matches!(d, Dim::Known(k) if *k != n as u64));
            if !ok {
                let want: Vec<String> = shape
                    .iter()
                    .map(|d| match d {
                        Dim::Known(k) => k.to_string(),
                        Dim::Symbolic(s) => s.clone(),
                        Dim::Unknown => "?".into(),
                    })
                    .collect();
                return Err(Error::InvalidInput(format!(
                    "input `{}` must have shape [{}], got {:?}",
                    v.name,
                    want.join(", "),
                    t.shape()
                )));
            }
        }
        Ok(())
    }
}

/// The value a source names, if it is there.
fn read<'a>(
    homes: &'a [Option<Value>],
    copies: &'a [Option<Value>],
    s: Source,
) -> Option<&'a Value> {
    match s {
        Source::Home(v) => homes[v].as_ref(),
        Source::Copy(c) => copies[c].as_ref(),
    }
}

/// `a, b, c` (the nodes' names, or `#index` for unnamed ones), at most five then `...`.
fn node_names(g: &crate::model::ir::Graph, nodes: &[crate::model::ir::NodeId]) -> String {
    let mut names: Vec<String> = nodes
        .iter()
        .take(5)
        .map(|&n| {
            let node = &g.nodes[n];
            if node.name.is_empty() {
                format!("#{n} {}", node.op_type)
            } else {
                format!("{} ({})", node.name, node.op_type)
            }
        })
        .collect();
    if nodes.len() > 5 {
        names.push(format!("... {} in all", nodes.len()));
    }
    names.join(", ")
}
