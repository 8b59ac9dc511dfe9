//! Sessions: a model planned once across its EPs, run many times from any number of threads.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::environment::Environment;
use crate::error::{Error, Result};
use crate::ir::{Dim, Model, ValueId};
use crate::partition::{Group, partition};
use crate::plugin::host_api::AbiGraph;
use crate::plugin::{CompiledKernel, ProviderInstance};
use crate::tensor::{ElementType, Tensor};

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

    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }
}

/// Configures and creates a [`Session`].
pub struct SessionBuilder {
    env: Option<Arc<Environment>>,
    providers: Vec<ExecutionProvider>,
}

/// A model ready to run.
pub struct Session {
    model: Arc<Model>,
    providers: Vec<Arc<ProviderInstance>>,
    steps: Vec<Step>,
    /// For each step, the values no later step or output needs.
    release_after: Vec<Vec<ValueId>>,
    node_provider: Vec<usize>,
    skipped: Vec<(String, String)>,
}

struct Step {
    kernel: CompiledKernel,
    group: Group,
}

impl Session {
    pub fn builder() -> Result<SessionBuilder> {
        Ok(SessionBuilder {
            env: None,
            providers: Vec::new(),
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
                    skipped.push((ep.name.clone(), e.to_string()));
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
        providers.push(ProviderInstance::create(builtin, cpu, &[])?);

        let model = Arc::new(model);
        let abi = AbiGraph::new(&model);
        let groups = partition(&abi, &providers)?;
        let mut node_provider = vec![0; model.graph.nodes.len()];
        let mut steps = Vec::with_capacity(groups.len());
        for group in groups {
            for &n in &group.nodes {
                node_provider[n] = group.provider;
            }
            let ids = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
            let kernel = providers[group.provider].compile(
                &abi,
                &ids(&group.nodes),
                &ids(&group.inputs),
                &ids(&group.outputs),
            )?;
            steps.push(Step { kernel, group });
        }
        drop(abi);
        let release_after = plan_releases(&model, &steps);
        tracing::debug!(steps = steps.len(), "session planned");
        Ok(Session {
            model,
            providers,
            steps,
            release_after,
            node_provider,
            skipped,
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

/// After which step each intermediate value can be dropped.
fn plan_releases(model: &Model, steps: &[Step]) -> Vec<Vec<ValueId>> {
    let g = &model.graph;
    let mut last_use: HashMap<ValueId, usize> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        for &v in &s.group.inputs {
            last_use.insert(v, i);
        }
    }
    let mut release = vec![Vec::new(); steps.len()];
    for (v, i) in last_use {
        if !g.values[v].is_graph_output {
            release[i].push(v);
        }
    }
    release
}

/// What `run` returns: the graph outputs, in the model's order.
#[derive(Debug)]
pub struct SessionOutputs {
    outputs: Vec<(String, Tensor)>,
}

impl SessionOutputs {
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.outputs.iter().map(|(n, t)| (n.as_str(), t))
    }
}

impl IntoIterator for SessionOutputs {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;
    fn into_iter(self) -> Self::IntoIter {
        self.outputs.into_iter()
    }
}

impl std::ops::Index<&str> for SessionOutputs {
    type Output = Tensor;
    fn index(&self, name: &str) -> &Tensor {
        match self.get(name) {
            Some(t) => t,
            None => panic!("the session has no output named `{name}`"),
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
}

enum Slot<'a> {
    Empty,
    Owned(Tensor),
    Borrowed(&'a Tensor),
}

impl Slot<'_> {
    fn get(&self) -> Option<&Tensor> {
        match self {
            Slot::Empty => None,
            Slot::Owned(t) => Some(t),
            Slot::Borrowed(t) => Some(t),
        }
    }
}

impl Session {
    pub fn model(&self) -> &Model {
        &self.model
    }

    fn spec(&self, v: ValueId) -> ValueSpec {
        let val = &self.model.graph.values[v];
        let shape = val.shape();
        ValueSpec {
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
    pub fn skipped_providers(&self) -> &[(String, String)] {
        &self.skipped
    }

    /// Number of compiled kernels.
    pub fn kernel_count(&self) -> usize {
        self.steps.len()
    }

    /// Runs the model. Every graph input must be given, by name.
    pub fn run<S: AsRef<str>>(
        &self,
        inputs: impl IntoIterator<Item = (S, Tensor)>,
    ) -> Result<SessionOutputs> {
        let g = &self.model.graph;
        let mut slots: Vec<Slot<'_>> = (0..g.values.len()).map(|_| Slot::Empty).collect();
        for (i, v) in g.values.iter().enumerate() {
            if let Some(t) = &v.initializer {
                slots[i] = Slot::Borrowed(t);
            }
        }
        for (name, tensor) in inputs {
            let name = name.as_ref();
            let id = g
                .value_id(name)
                .filter(|id| g.values[*id].is_graph_input)
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "the model has no input named `{name}`; its inputs are: {}",
                        self.input_names()
                    ))
                })?;
            if matches!(slots[id], Slot::Owned(_)) {
                return Err(Error::InvalidInput(format!("input `{name}` given twice")));
            }
            self.check_input(id, &tensor)?;
            slots[id] = Slot::Owned(tensor);
        }
        if let Some(&missing) = g.inputs.iter().find(|&&i| matches!(slots[i], Slot::Empty)) {
            return Err(Error::InvalidInput(format!(
                "input `{}` was not given; the model's inputs are: {}",
                g.values[missing].name,
                self.input_names()
            )));
        }
        for (si, step) in self.steps.iter().enumerate() {
            let _span = tracing::trace_span!(
                "kernel",
                step = si,
                provider = step.kernel.provider().name()
            )
            .entered();
            let inputs: Vec<Option<&Tensor>> =
                step.group.inputs.iter().map(|&v| slots[v].get()).collect();
            if let Some(pos) = inputs.iter().position(Option::is_none) {
                return Err(Error::Run(format!(
                    "internal: value `{}` not computed before use",
                    g.values[step.group.inputs[pos]].name
                )));
            }
            let outputs = step.kernel.execute(&inputs)?;
            drop(inputs);
            for (&v, t) in step.group.outputs.iter().zip(outputs) {
                slots[v] = Slot::Owned(t);
            }
            for &v in &self.release_after[si] {
                if g.values[v].initializer.is_none() {
                    slots[v] = Slot::Empty;
                }
            }
        }
        let mut outputs = Vec::with_capacity(g.outputs.len());
        for &o in &g.outputs {
            let tensor = match std::mem::replace(&mut slots[o], Slot::Empty) {
                Slot::Owned(t) => t,
                Slot::Borrowed(t) => t.clone(),
                Slot::Empty => {
                    return Err(Error::Run(format!(
                        "output `{}` was not produced",
                        g.values[o].name
                    )));
                }
            };
            outputs.push((g.values[o].name.clone(), tensor));
        }
        Ok(SessionOutputs { outputs })
    }

    fn input_names(&self) -> String {
        let g = &self.model.graph;
        g.inputs
            .iter()
            .map(|&i| format!("`{}`", g.values[i].name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn check_input(&self, id: ValueId, t: &Tensor) -> Result<()> {
        let v = &self.model.graph.values[id];
        if let Some(ty) = v.elem_type() {
            if ty != t.elem_type() {
                return Err(Error::InvalidInput(format!(
                    "input `{}` must be {ty}, got {}",
                    v.name,
                    t.elem_type()
                )));
            }
        }
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
