//! Sessions: a model planned once across its EPs, run many times from any number of threads.
//!
//! The stage after the plugins are loaded. [`environment`] holds the plugins a session can use
//! and the EPs every session starts from; [`request`] is what a session asks for (an EP by
//! name, with options); [`builder`] collects the requests and hands them to [`compile`], the
//! pipeline of named steps that turns a model into a session: set up the EPs, [`partition`]
//! the graph, place what no EP claimed, compile the groups into kernels, [`plan`] the copies
//! and releases, report the [`placement`]. [`run`] executes the plan.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::ir::{Dim, Model, ValueId, ValueType};
use crate::plugin::ProviderInstance;
use crate::value::ElementType;

pub mod builder;
mod compile;
pub mod environment;
mod kernel_cache;
pub mod partition;
pub mod placement;
pub mod plan;
pub mod request;
mod run;
mod select;

pub use builder::SessionBuilder;
pub use environment::{
    BUILTIN_PLUGIN, BuiltinProviders, Environment, EnvironmentBuilder, ProviderDevice,
};
pub use placement::PlacementReport;
pub use request::ExecutionProvider;
pub use run::SessionOutputs;
pub use select::{Selection, SelectionFn, SelectionInput, SelectionPolicy};

use compile::Kernel;
use plan::Plan;

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
    /// This session's tensor limit ([`SessionBuilder::with_max_tensor_bytes`]).
    max_tensor_bytes: Option<u64>,
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
