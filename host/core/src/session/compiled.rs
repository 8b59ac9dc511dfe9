//! A compiled session: the model, its EPs, kernels and plan that [`compile`](super::compile)
//! fills in and [`run`](super::run) executes, and what a session tells about itself (its
//! inputs and outputs, where each node runs, the copies the last run made).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::partition::Group;
use super::placement::PlacementReport;
use super::plan::Plan;
use super::profile::{CopyProfile, KernelProfile, Profile, Profiler};
use crate::error::{Error, Result};
use crate::model::ir::{Dim, Model, ValueId, ValueType};
use crate::plugin::{CompiledKernel, ProviderInstance};
use crate::value::ElementType;

/// A model ready to run.
pub struct Session {
    pub(super) model: Arc<Model>,
    pub(super) providers: Vec<Arc<ProviderInstance>>,
    pub(super) kernels: Vec<Kernel>,
    pub(super) plan: Plan,
    /// Bytes each copy moved in the last run (`u64::MAX`: not run yet).
    pub(super) copy_bytes: Vec<AtomicU64>,
    pub(super) placement: PlacementReport,
    pub(super) node_provider: Vec<usize>,
    /// This session's tensor limit ([`SessionBuilder::with_max_tensor_bytes`](super::SessionBuilder::with_max_tensor_bytes)).
    pub(super) max_tensor_bytes: Option<u64>,
    /// What runs record, when the session profiles ([`super::SessionBuilder::with_profiling`]).
    pub(super) profiler: Option<Profiler>,
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
    /// The model as compiled: its graph, values, types and shapes. The data of initializers is
    /// released once the EPs have copied it at session creation (all but initializers that are
    /// also graph outputs), so a session holds its weights once; keep the [`Model`] from
    /// [`crate::onnx`]'s loaders for the data.
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
            shape: shape.map(|s| s.iter().map(Dim::known).collect()),
            symbols: shape
                .map(|s| s.iter().map(|d| d.symbol().map(str::to_owned)).collect())
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

    /// Where the runs since the session was made spent their time: per kernel and copy, per
    /// node where the EP records its kernels' parts, and what each EP's compile passes did.
    /// An error unless the session was made [with profiling](super::SessionBuilder::with_profiling).
    pub fn profile(&self) -> Result<Profile> {
        let p = self.profiler.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "this session was made without profiling: make it with profiling on \
                 (SessionBuilder::with_profiling, `epx run --profile`) to read a profile"
                    .into(),
            )
        })?;
        self.read_profile(p)
    }

    /// Starts the profile again from zero (after warm-up runs, say). An error unless the
    /// session profiles.
    pub fn restart_profile(&self) -> Result<()> {
        let p = self.profiler.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "this session was made without profiling: nothing to restart".into(),
            )
        })?;
        p.reset();
        for (k, whole) in self.kernels.iter().zip(&p.whole) {
            if whole.is_none() {
                k.compiled.profile_start()?.map_err(Error::Run)?;
            }
        }
        Ok(())
    }

    fn read_profile(&self, p: &Profiler) -> Result<Profile> {
        let (runs, run_ns) = p.runs.read();
        let mut kernels = Vec::with_capacity(self.kernels.len());
        for (i, k) in self.kernels.iter().enumerate() {
            let (calls, ns) = p.kernels[i].read();
            let detail = match &p.whole[i] {
                None => k.compiled.profile_read()?,
                Some(_) => Default::default(),
            };
            kernels.push(KernelProfile {
                kernel: self
                    .placement
                    .groups
                    .get(i)
                    .map_or_else(|| format!("#{i}"), |g| g.kernel.clone()),
                provider: k.compiled.provider().name().to_string(),
                nodes: k.group.nodes.len(),
                calls,
                ns,
                parts: detail.parts,
                passes: detail.passes,
                whole: p.whole[i].clone(),
            });
        }
        let space = |s: Option<usize>| s.map_or("host", |p| self.providers[p].name()).to_string();
        let copies = self
            .plan
            .copies
            .iter()
            .zip(&p.copies)
            .map(|(c, counter)| {
                let (calls, ns) = counter.read();
                CopyProfile {
                    value: self.model.graph.values[c.value].name.clone(),
                    from: space(c.from),
                    to: space(c.to),
                    calls,
                    ns,
                }
            })
            .collect();
        Ok(Profile {
            runs,
            run_ns,
            kernels,
            copies,
        })
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
}

/// A group of nodes compiled by its EP, with what the model declares about its outputs.
pub(super) struct Kernel {
    pub(super) compiled: CompiledKernel,
    pub(super) group: Group,
    /// The model's declared element type and static extents of each output, checked after
    /// every execute so a plugin returning nonsense is caught where it happens.
    pub(super) expected: Vec<Declared>,
    /// Whether every shape that disagrees with the declaration is only a warning: so for the
    /// built-in CPU EP (named by the session or taking what was left), the reference, whose
    /// outputs are what the nodes define. For another EP only a declaration the host's inference
    /// does not bear out is (`Value::shape_confirmed`): the model's declaration may then be what
    /// is wrong, and ONNX Runtime runs such models on any EP (it warns, `VerifyOutputSizes`).
    pub(super) lenient_shapes: bool,
    /// Per output: the shape warning was logged already (once per session, not per run).
    pub(super) shape_warned: Vec<AtomicBool>,
}

/// What the model declares about a value: element type and static extents, where known.
/// What the host knows of a value: element type, static extents, and whether the extents were
/// inferred by the host rather than declared by the model.
/// Last, whether the host's inference confirms a declared shape.
pub(super) type Declared = (Option<ElementType>, Option<Vec<Option<u64>>>, bool, bool);
