//! Sessions: a model planned once across its EPs, run many times from any number of threads.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use epx_plugin_api::abi::EpxStatusCode;

use crate::device::DeviceTensor;
use crate::environment::Environment;
use crate::error::{Error, Result};
use crate::ir::{Dim, Model, ValueId, ValueType};
use crate::partition::{Group, partition};
use crate::placement::{
    CopyPlacement, Fallback, GroupPlacement, NodePlacement, PlacementReport, SkippedProvider,
};
use crate::plan::{self, Action, Plan, Source, Space};
use crate::plugin::host_api::AbiGraph;
use crate::plugin::{CompiledKernel, ProviderInstance};
use crate::tensor::{ElementType, Tensor};
use crate::value::Value;

/// An EP requested for a session, by name (`cuda`, or `plugin/ep` to pick one plugin), with
/// string options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionProvider {
    name: String,
    options: Vec<(String, String)>,
    error_on_failure: bool,
}

impl ExecutionProvider {
    pub fn new(name: impl Into<String>) -> Self {
        ExecutionProvider {
            name: name.into(),
            options: Vec::new(),
            error_on_failure: false,
        }
    }

    /// Adds a provider option; the EP rejects keys it does not know when the session is made.
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// Fail session creation when this EP cannot be set up, instead of continuing without it.
    pub fn error_on_failure(mut self) -> Self {
        self.error_on_failure = true;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this EP is found and can run on this machine, in the global environment
    /// (`EPX_PLUGIN_PATH` and the default plugin folder). See [`Environment::is_available`].
    pub fn is_available(&self) -> Result<bool> {
        Ok(Environment::global()?.is_available(&self.name))
    }

    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }
}

/// Configures and creates a [`Session`].
pub struct SessionBuilder {
    env: Option<Arc<Environment>>,
    providers: Vec<ExecutionProvider>,
    strict: bool,
    device_outputs: Vec<String>,
    intra_op_threads: Option<usize>,
}

/// A model ready to run.
pub struct Session {
    model: Arc<Model>,
    providers: Vec<Arc<ProviderInstance>>,
    kernels: Vec<Kernel>,
    plan: Plan,
    /// Bytes each copy moved in the last run (`u64::MAX`: not run yet).
    copy_bytes: Vec<AtomicU64>,
    placement: PlacementReport,
    node_provider: Vec<usize>,
}

struct Kernel {
    compiled: CompiledKernel,
    group: Group,
    /// The model's declared element type and static extents of each output, checked after
    /// every execute so a plugin returning nonsense is caught where it happens.
    expected: Vec<Declared>,
    /// Whether a shape that disagrees with the declaration is only a warning: so for the
    /// built-in CPU EP, the reference, whose outputs are what the nodes define; the model's
    /// declaration is then what is wrong, and ONNX Runtime runs such models too.
    lenient_shapes: bool,
    /// Per output: the shape warning was logged already (once per session, not per run).
    shape_warned: Vec<AtomicBool>,
}

/// What the model declares about a value: element type and static extents, where known.
type Declared = (Option<ElementType>, Option<Vec<Option<u64>>>);

impl Session {
    pub fn builder() -> Result<SessionBuilder> {
        Ok(SessionBuilder {
            env: None,
            providers: Vec::new(),
            strict: false,
            device_outputs: Vec::new(),
            intra_op_threads: None,
        })
    }
}

impl SessionBuilder {
    /// Uses `env` instead of [`Environment::global`].
    pub fn with_environment(mut self, env: Arc<Environment>) -> Self {
        self.env = Some(env);
        self
    }

    /// EPs in priority order; the CPU EP is always added last.
    pub fn with_execution_providers(
        mut self,
        eps: impl IntoIterator<Item = ExecutionProvider>,
    ) -> Result<Self> {
        self.providers.extend(eps);
        Ok(self)
    }

    /// Strict placement: session creation fails if any node would fall back to the CPU EP
    /// (the error lists them). Requesting `cpu` explicitly allows it.
    pub fn with_strict_placement(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Threads the CPU EP shares a kernel's work across (its `intra_op_num_threads` option): 1
    /// runs everything on the calling thread; 0, the default, one per core. It applies to the
    /// fallback CPU EP and to a requested `cpu` EP that does not set the option itself. Vendor
    /// EPs take their own threading options.
    pub fn with_intra_op_threads(mut self, threads: usize) -> Self {
        self.intra_op_threads = Some(threads);
        self
    }

    /// Leaves these graph outputs in their EP's memory instead of copying them to the host;
    /// read them with [`SessionOutputs::device`] and copy them later with
    /// [`DeviceTensor::to_host`].
    pub fn with_device_outputs<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Self {
        self.device_outputs
            .extend(names.into_iter().map(Into::into));
        self
    }

    pub fn commit_from_file(self, path: impl AsRef<Path>) -> Result<Session> {
        let model = crate::onnx::load_model_file(path.as_ref())?;
        self.commit_from_model(model)
    }

    pub fn commit_from_memory(self, bytes: &[u8]) -> Result<Session> {
        let model = crate::onnx::load_model_bytes(bytes, "<memory>", None)?;
        self.commit_from_model(model)
    }

    pub fn commit_from_model(self, model: Model) -> Result<Session> {
        let env = match self.env {
            Some(e) => e,
            None => Environment::global()?,
        };
        let _span = tracing::debug_span!("session", model = %model.source).entered();
        let mut requested = self.providers;
        let threads_option = self
            .intra_op_threads
            .map(|n| ("intra_op_num_threads".to_string(), n.to_string()));
        if let Some(opt) = &threads_option {
            for ep in requested.iter_mut().filter(|ep| ep.name == "cpu") {
                if !ep.options.iter().any(|(k, _)| k == &opt.0) {
                    ep.options.insert(0, opt.clone());
                }
            }
        }
        for d in env.default_providers() {
            if !requested.iter().any(|r| r.name == d.name) {
                requested.push(d.clone());
            }
        }
        let mut providers: Vec<Arc<ProviderInstance>> = Vec::new();
        let mut skipped = Vec::new();
        for ep in &requested {
            match setup_provider(&env, ep) {
                Ok(p) => providers.push(p),
                Err(e) if ep.error_on_failure => return Err(e),
                Err(e) => {
                    tracing::warn!(provider = %ep.name, "continuing without this EP: {e}");
                    skipped.push(SkippedProvider {
                        name: ep.name.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        // The fallback: the built-in CPU EP, always last.
        let builtin = env.builtin();
        let cpu = builtin
            .providers
            .iter()
            .position(|p| p.name == "cpu")
            .ok_or_else(|| Error::ProviderSetup {
                name: "cpu".into(),
                message: "the built-in CPU EP is missing".into(),
            })?;
        let cpu_options: Vec<(String, String)> = threads_option.into_iter().collect();
        providers.push(ProviderInstance::create(builtin, cpu, &cpu_options)?);
        let fallback = providers.len() - 1;
        let cpu_requested = providers[..fallback].iter().any(|p| p.name() == "cpu");

        let model = Arc::new(model);
        let g = &model.graph;
        let abi = AbiGraph::new(&model);
        let groups = partition(&abi, &providers)?;
        let mut node_provider = vec![0; g.nodes.len()];
        let mut fallbacks = Vec::new();
        for group in &groups {
            for &n in &group.nodes {
                node_provider[n] = group.provider;
                if group.provider == fallback && fallback > 0 && !cpu_requested {
                    let asked: Vec<&str> = providers[..fallback].iter().map(|p| p.name()).collect();
                    fallbacks.push(Fallback {
                        node: n,
                        name: g.nodes[n].display_name(n),
                        op_type: g.nodes[n].op_type.clone(),
                        reason: format!("not claimed by {}", asked.join(", ")),
                    });
                }
            }
        }
        fallbacks.sort_by_key(|f| f.node);
        if self.strict && !fallbacks.is_empty() {
            let list: Vec<String> = fallbacks
                .iter()
                .map(|f| format!("`{}` ({})", f.name, f.op_type))
                .collect();
            return Err(Error::Unsupported(format!(
                "strict placement: {} node{} would fall back to the CPU EP: {}",
                list.len(),
                if list.len() == 1 { "" } else { "s" },
                list.join(", ")
            )));
        }
        let mut keep_on_device = Vec::new();
        for name in &self.device_outputs {
            let id = g
                .value_id(name)
                .filter(|&v| g.values[v].is_graph_output)
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "`{name}` given to with_device_outputs is not an output of the model"
                    ))
                })?;
            keep_on_device.push(id);
        }
        let mut kernels = Vec::with_capacity(groups.len());
        for group in &groups {
            let ids = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
            let compiled = providers[group.provider].compile(
                &abi,
                &ids(&group.nodes),
                &ids(&group.inputs),
                &ids(&group.outputs),
            )?;
            let expected = group
                .outputs
                .iter()
                .map(|&v| {
                    let val = &g.values[v];
                    // Only what the model declares is held against a kernel: inferred shapes
                    // help EPs decide, they are not a contract.
                    let declared = val.shape().filter(|_| !val.shape_inferred);
                    let dims = declared.map(|s| {
                        s.iter()
                            .map(|d| {
                                if let Dim::Known(k) = d {
                                    Some(*k)
                                } else {
                                    None
                                }
                            })
                            .collect()
                    });
                    (val.elem_type(), dims)
                })
                .collect();
            kernels.push(Kernel {
                compiled,
                group: group.clone(),
                lenient_shapes: group.provider == fallback,
                shape_warned: group
                    .outputs
                    .iter()
                    .map(|_| AtomicBool::new(false))
                    .collect(),
                expected,
            });
        }
        drop(abi);
        let space_of: Vec<Space> = providers
            .iter()
            .enumerate()
            .map(|(i, p)| (!p.description.uses_host_memory()).then_some(i))
            .collect();
        let plan = plan::plan(g, &groups, &space_of, &keep_on_device);
        let placement = report(&model, &providers, &groups, &plan, fallbacks, skipped);
        tracing::debug!("placement of {}:\n{}", model.source, placement.table());
        let copy_bytes = plan
            .copies
            .iter()
            .map(|_| AtomicU64::new(u64::MAX))
            .collect();
        Ok(Session {
            model: model.clone(),
            providers,
            kernels,
            plan,
            copy_bytes,
            placement,
            node_provider,
        })
    }
}

fn setup_provider(env: &Environment, ep: &ExecutionProvider) -> Result<Arc<ProviderInstance>> {
    let (lib, index) = env.find_provider(&ep.name)?;
    let desc = &lib.providers[index];
    if let Err(reason) = &desc.availability {
        return Err(Error::ProviderSetup {
            name: ep.name.clone(),
            message: format!("not available: {reason}"),
        });
    }
    // Manifest defaults first: the user's options come later and win.
    let mut options = env.default_options(&lib, &desc.name);
    options.extend(ep.options.iter().cloned());
    ProviderInstance::create(&lib, index, &options)
}

fn space_name(providers: &[Arc<ProviderInstance>], s: Space) -> String {
    s.map_or_else(|| "host".to_string(), |p| providers[p].name().to_string())
}

/// Builds the placement report of a planned session.
fn report(
    model: &Model,
    providers: &[Arc<ProviderInstance>],
    groups: &[Group],
    plan: &Plan,
    fallbacks: Vec<Fallback>,
    skipped_providers: Vec<SkippedProvider>,
) -> PlacementReport {
    let g = &model.graph;
    let mut per_provider = vec![0usize; providers.len()];
    let mut group_of = vec![0usize; g.nodes.len()];
    let names = |vs: &[ValueId]| {
        vs.iter()
            .map(|&v| g.values[v].name.clone())
            .collect::<Vec<_>>()
    };
    let groups_out: Vec<GroupPlacement> = groups
        .iter()
        .enumerate()
        .map(|(i, grp)| {
            for &n in &grp.nodes {
                group_of[n] = i;
            }
            let kernel = format!(
                "{}#{}",
                providers[grp.provider].name(),
                per_provider[grp.provider]
            );
            per_provider[grp.provider] += 1;
            GroupPlacement {
                id: i,
                provider: providers[grp.provider].name().to_string(),
                nodes: grp.nodes.clone(),
                kernel,
                inputs: names(&grp.inputs),
                outputs: names(&grp.outputs),
            }
        })
        .collect();
    let nodes = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodePlacement {
            id: i,
            name: n.display_name(i),
            op_type: n.op_type.clone(),
            provider: groups_out[group_of[i]].provider.clone(),
            group: group_of[i],
        })
        .collect();
    // The kernel each copy feeds: the first kernel after it in the plan that reads it.
    let mut before_group = vec![None; plan.copies.len()];
    for (i, a) in plan.actions.iter().enumerate() {
        if let Action::Copy(c) = *a {
            before_group[c] = plan.actions[i..].iter().find_map(|a| match *a {
                Action::Kernel(k) if plan.kernel_inputs[k].contains(&Source::Copy(c)) => Some(k),
                _ => None,
            });
        }
    }
    let copies = plan
        .copies
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let v = &g.values[c.value];
            let bytes = v.shape().and_then(|s| {
                let count = s.iter().try_fold(1usize, |acc, d| match d {
                    Dim::Known(k) => acc.checked_mul(usize::try_from(*k).ok()?),
                    _ => None,
                })?;
                v.elem_type()?.storage_bytes(count).map(|b| b as u64)
            });
            CopyPlacement {
                value: v.name.clone(),
                from: space_name(providers, c.from),
                to: space_name(providers, c.to),
                before_group: before_group[i],
                bytes,
                last_run_bytes: None,
            }
        })
        .collect();
    PlacementReport {
        nodes,
        groups: groups_out,
        copies,
        fallbacks,
        skipped_providers,
    }
}

/// What `run` returns: the graph outputs, in the model's order, in host memory (except those
/// kept on their device with [`SessionBuilder::with_device_outputs`]).
#[derive(Debug)]
pub struct SessionOutputs {
    outputs: Vec<(String, Value)>,
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

/// A graph input or output as the session sees it.
#[derive(Clone, Debug)]
pub struct ValueSpec {
    pub name: String,
    pub elem_type: Option<ElementType>,
    /// `None` when the rank is unknown; `None` extents are dynamic.
    pub shape: Option<Vec<Option<u64>>>,
    /// Symbolic extent names, where the model gives them.
    pub symbols: Vec<Option<String>>,
    /// The declared type: tensor, sequence, map or optional.
    pub ty: ValueType,
}

impl Session {
    pub fn model(&self) -> &Model {
        &self.model
    }

    fn spec(&self, v: ValueId) -> ValueSpec {
        let val = &self.model.graph.values[v];
        let shape = val.shape();
        ValueSpec {
            ty: val.ty.clone(),
            name: val.name.clone(),
            elem_type: val.elem_type(),
            shape: shape.map(|s| {
                s.iter()
                    .map(|d| {
                        if let Dim::Known(k) = d {
                            Some(*k)
                        } else {
                            None
                        }
                    })
                    .collect()
            }),
            symbols: shape
                .map(|s| {
                    s.iter()
                        .map(|d| {
                            if let Dim::Symbolic(n) = d {
                                Some(n.clone())
                            } else {
                                None
                            }
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    pub fn inputs(&self) -> Vec<ValueSpec> {
        self.model
            .graph
            .inputs
            .iter()
            .map(|&v| self.spec(v))
            .collect()
    }

    pub fn outputs(&self) -> Vec<ValueSpec> {
        self.model
            .graph
            .outputs
            .iter()
            .map(|&v| self.spec(v))
            .collect()
    }

    /// The names of the EPs that got at least one node, in priority order.
    pub fn providers(&self) -> Vec<String> {
        let mut used: Vec<usize> = self.node_provider.clone();
        used.sort_unstable();
        used.dedup();
        used.into_iter()
            .map(|i| self.providers[i].name().to_string())
            .collect()
    }

    /// The EP each node was placed on, by node id.
    pub fn node_placement(&self) -> Vec<&str> {
        self.node_provider
            .iter()
            .map(|&i| self.providers[i].name())
            .collect()
    }

    /// Requested EPs that could not be set up, with the reason (they are also logged).
    pub fn skipped_providers(&self) -> Vec<(String, String)> {
        self.placement
            .skipped_providers
            .iter()
            .map(|s| (s.name.clone(), s.reason.clone()))
            .collect()
    }

    /// Number of compiled kernels.
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// Where every node runs, the fused groups, the copies (with the bytes the last run moved)
    /// and the fallbacks.
    pub fn placement(&self) -> PlacementReport {
        let mut report = self.placement.clone();
        for (c, bytes) in report.copies.iter_mut().zip(&self.copy_bytes) {
            let b = bytes.load(Ordering::Relaxed);
            c.last_run_bytes = (b != u64::MAX).then_some(b);
        }
        report
    }

    /// The graph's data edges as (producer node, consumer node, value name), for pictures.
    pub fn edges(&self) -> Vec<(usize, usize, String)> {
        let g = &self.model.graph;
        let mut edges = Vec::new();
        for (i, n) in g.nodes.iter().enumerate() {
            for v in n.all_inputs() {
                if let Some(p) = g.values[v].producer {
                    edges.push((p, i, g.values[v].name.clone()));
                }
            }
        }
        edges
    }

    /// Runs the model. Every graph input must be given, by name: tensors, or [`Value`]s for
    /// inputs that are sequences, maps or optionals.
    pub fn run<S: AsRef<str>, V: Into<Value>>(
        &self,
        inputs: impl IntoIterator<Item = (S, V)>,
    ) -> Result<SessionOutputs> {
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
            match *action {
                Action::Kernel(k) => {
                    let kernel = &self.kernels[k];
                    let _span = tracing::trace_span!(
                        "kernel",
                        provider = kernel.compiled.provider().name()
                    )
                    .entered();
                    let outputs = {
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
                        kernel.compiled.execute(&args)?
                    };
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
                            Value::Device(DeviceTensor::from_host(&self.providers[p], t)?)
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
        let mut outputs = Vec::with_capacity(g.outputs.len());
        for (i, (&o, &src)) in g.outputs.iter().zip(&self.plan.outputs).enumerate() {
            let used_again = self.plan.outputs[i + 1..].contains(&src);
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
                (None, Some(init)) => Value::Host(init.clone()),
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

    /// Checks a kernel output against the model's declared type and static shape. A shape the
    /// built-in CPU EP computed against the declaration is a warning, once per session.
    fn check_output(&self, kernel: &Kernel, index: usize, v: ValueId, out: &Value) -> Result<()> {
        let (want_type, want_dims) = &kernel.expected[index];
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
        let declared = &self.model.graph.values[v].ty;
        if !out.fits(declared) {
            return Err(bad(format!(
                "output `{name}` is a {}, but the model declares {declared}",
                out.type_name()
            )));
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
                if !kernel.lenient_shapes {
                    return Err(bad(format!(
                        "output `{name}` has shape {shape:?}, but the model declares [{want}]"
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
        if !value.fits(&v.ty) {
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
        if let Some(shape) = v.shape() {
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
