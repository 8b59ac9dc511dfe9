//! The compile passes: each turns a [`Draft`] (the program being compiled) into a better or more
//! finished one, with one job. [`crate::exec::program`] lists them in the order they run
//! (`PASSES`) and runs them; a new pass is a function here and a line in that list.
//!
//! The draft holds the graph, the nodes to compile, and the steps made so far with what each
//! node was ([`NodeInfo`]); a pass that removes a step points the step's readers at what
//! replaces its outputs with [`Draft::replace`], or removes many in one pass with
//! [`Draft::rewrite_steps`]. Passes that only make the program faster can be
//! turned off by name ([`CompileOptions`]) to find which one changes an answer.

pub(crate) mod batch_norm;
pub(crate) mod build;
pub(crate) mod casts;
pub(crate) mod constants;
pub(crate) mod float16;
pub(crate) mod fusion;
pub(crate) mod liveness;
pub(crate) mod matmul_add;
pub(crate) mod outputs;
pub(crate) mod prepare;
pub(crate) mod transposes;

use std::collections::HashMap;

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk::{self, GraphView, NodeView};

use crate::error::OpError;
use crate::exec::lower;

use crate::exec::step::{Source, Step};
use crate::kernel::NodeDef;
use crate::tensor::Tensor;

/// One pass of the pipeline.
pub(crate) struct Pass {
    /// What [`CompileOptions`] and messages call it.
    pub name: &'static str,
    /// Whether the program is wrong or incomplete without it (such a pass cannot be turned off).
    pub required: bool,
    /// Whether it is a fast kernel: it does not run at the `reference` kernel level.
    pub fast_only: bool,
    /// What the pass counts in [`Draft::changed`] (`""`: it counts nothing; the steps it
    /// removed or added say what it did), for the profile's pass notes.
    pub changes: &'static str,
    pub run: fn(&mut Draft<'_, '_>) -> sdk::Result<()>,
}

/// Which passes are turned off, by name: from the CPU EP option `disable_passes` and the
/// environment variable [`ENV_DISABLE_PASSES`] (comma-separated names, checked against the
/// pipeline by [`crate::exec::program::compile_options`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    pub(crate) disabled: Vec<String>,
}

/// The environment variable that turns compile passes off, for bisecting a wrong answer:
/// `EPX_CPU_DISABLE_PASSES=fold_constants,fuse_chains`.
pub const ENV_DISABLE_PASSES: &str = "EPX_CPU_DISABLE_PASSES";

impl CompileOptions {
    /// Whether pass `name` runs.
    pub(crate) fn runs(&self, name: &str) -> bool {
        !self.disabled.iter().any(|d| d == name)
    }
}

/// What a step's node was, for the passes that read or rewrite nodes (steps the passes make
/// themselves, such as conversions and fused chains, have none).
pub(crate) struct NodeInfo<'g> {
    /// The node as its kernel was made (float16 inputs already widened, see
    /// [`crate::exec::lower`]).
    pub def: NodeDef,
    /// The graph values of the node's outputs.
    pub values: Vec<Option<u32>>,
    /// Their declared element types.
    pub output_types: Vec<Option<ElementType>>,
    /// A control-flow node whose kernel is made once the constants are known.
    pub pending: Option<Pending<'g>>,
}

/// A control-flow node waiting for [`build::build_control_flow`].
pub(crate) struct Pending<'g> {
    pub node: NodeView<'g>,
    /// Its nested graphs, by attribute name.
    pub graphs: HashMap<String, GraphView<'g>>,
    /// The float16 inputs to round before it runs, when it reads or writes float16.
    pub round: Option<Vec<usize>>,
}

/// A step being compiled.
pub(crate) struct DraftStep<'g> {
    pub step: Step,
    pub node: Option<NodeInfo<'g>>,
}

impl DraftStep<'_> {
    /// Whether the step runs node op `op_type` of the default domain.
    pub(crate) fn is_op(&self, op_type: &str) -> bool {
        self.node
            .as_ref()
            .is_some_and(|n| n.def.op_type == op_type && n.def.domain.is_empty())
    }
}

/// The program being compiled.
pub(crate) struct Draft<'g, 'k> {
    pub graph: GraphView<'g>,
    /// The nodes to compile, in topological order.
    pub nodes: Vec<NodeView<'g>>,
    /// The graph value bound to each run input (`None`: an input this program does not read).
    pub inputs: &'k [Option<u32>],
    /// The graph values the run returns.
    pub outputs: &'k [u32],
    /// Run input `i`'s value where it is the same in every run (an enclosing graph's constant).
    pub known: &'k [Option<&'k Tensor>],
    pub options: &'k CompileOptions,
    pub steps: Vec<DraftStep<'g>>,
    pub constants: Vec<Tensor>,
    pub num_slots: usize,
    /// Where each graph value compiled so far is.
    pub at: HashMap<u32, Source>,
    /// Where each program output is, once [`outputs::bind_outputs`] ran.
    pub bound: Vec<Source>,
    /// What the pass running now changed without removing or adding steps ([`Pass::changes`]
    /// says what); 0 when each pass starts.
    pub changed: usize,
}

impl<'g, 'k> Draft<'g, 'k> {
    /// A draft of `nodes` of `graph` with no steps yet.
    pub(crate) fn new(
        graph: GraphView<'g>,
        nodes: &[u32],
        inputs: &'k [Option<u32>],
        outputs: &'k [u32],
        known: &'k [Option<&'k Tensor>],
        options: &'k CompileOptions,
    ) -> sdk::Result<Self> {
        let nodes = nodes
            .iter()
            .map(|&id| graph.node(id))
            .collect::<sdk::Result<_>>()?;
        Ok(Draft {
            graph,
            nodes,
            inputs,
            outputs,
            known,
            options,
            steps: Vec::new(),
            constants: Vec::new(),
            num_slots: 0,
            at: HashMap::new(),
            bound: Vec::new(),
            changed: 0,
        })
    }

    /// A new slot.
    pub(crate) fn slot(&mut self) -> usize {
        self.num_slots += 1;
        self.num_slots - 1
    }

    /// A new constant.
    pub(crate) fn constant(&mut self, t: Tensor) -> Source {
        self.constants.push(t);
        Source::Constant(self.constants.len() - 1)
    }

    /// The value of `src` when it is known at compile time: a constant, or a run input whose
    /// value is fixed.
    pub(crate) fn constant_value(&self, src: Source) -> Option<&Tensor> {
        match src {
            Source::Constant(i) => self.constants.get(i),
            Source::Input(i) => self.known.get(i).copied().flatten(),
            Source::Slot(_) => None,
        }
    }

    /// An initializer's data, copied (string initializers come in the ABI's string form); a
    /// float16 one widened to float32 when `widen`.
    pub(crate) fn initializer(
        &self,
        v: u32,
        elem_type: Option<ElementType>,
        widen: bool,
    ) -> Result<Tensor, OpError> {
        let e = |e: sdk::Error| OpError(e.to_string());
        if elem_type == Some(ElementType::String) {
            let t = self.graph.string_initializer(v).map_err(e)?;
            return Tensor::strings_from_bytes(&t.dims(), t.iter());
        }
        let t = self.graph.initializer(v).map_err(e)?;
        let t = Tensor::from_bytes(t.elem_type, &t.dims(), t.data)?;
        Ok(if widen { lower::to_f32(t) } else { t })
    }

    /// From now on, what read slot `slot` reads `with`: every step input, graph value and bound
    /// output.
    pub(crate) fn replace(&mut self, slot: usize, with: Source) {
        let old = Source::Slot(slot);
        let swap = |s: &mut Source| {
            if *s == old {
                *s = with;
            }
        };
        for st in &mut self.steps {
            st.step.inputs.iter_mut().flatten().for_each(swap);
        }
        self.at.values_mut().for_each(swap);
        self.bound.iter_mut().for_each(swap);
    }

    /// Rebuilds the steps in one pass, for a pass that removes steps: each step, its inputs
    /// first renamed through what the steps removed before it were replaced by, is given to
    /// `f`, which keeps it ([`Verdict::Keep`]) or removes it, naming what reads of each of its
    /// output slots read instead ([`Verdict::Remove`]); graph values and bound outputs are
    /// renamed at the end. Linear in the steps and their inputs, where a removal and a
    /// [`Draft::replace`] per step would make a chain of N removable nodes cost N².
    pub(crate) fn rewrite_steps(
        &mut self,
        mut f: impl FnMut(&mut Self, &DraftStep<'g>) -> Verdict,
    ) {
        let steps = std::mem::take(&mut self.steps);
        let mut alias: HashMap<usize, Source> = HashMap::new();
        let mut kept = Vec::with_capacity(steps.len());
        for mut st in steps {
            if !alias.is_empty() {
                st.step
                    .inputs
                    .iter_mut()
                    .flatten()
                    .for_each(|s| renamed(&alias, s));
            }
            match f(self, &st) {
                Verdict::Keep => kept.push(st),
                // `with` was read through `alias` already (it is an input of this step, or
                // new): one lookup always gives the final source.
                Verdict::Remove(renames) => alias.extend(renames),
            }
        }
        self.steps = kept;
        self.rename_values(&alias);
    }

    /// Graph values and bound outputs read through `alias` ([`renamed`]).
    pub(crate) fn rename_values(&mut self, alias: &HashMap<usize, Source>) {
        if !alias.is_empty() {
            self.at.values_mut().for_each(|s| renamed(alias, s));
            self.bound.iter_mut().for_each(|s| renamed(alias, s));
        }
    }

    /// Who reads each slot, counted once over all steps ([`Reads`]), for passes that ask about
    /// many slots without changing who reads them.
    pub(crate) fn reads(&self) -> Reads {
        let mut reads = Reads {
            count: vec![0; self.num_slots],
            first: vec![None; self.num_slots],
        };
        for (i, st) in self.steps.iter().enumerate() {
            for s in st.step.inputs.iter().flatten() {
                if let Source::Slot(k) = *s {
                    reads.grow(k);
                    reads.count[k] += 1;
                    reads.first[k].get_or_insert(i);
                }
            }
        }
        let outputs: std::collections::HashSet<u32> = self.outputs.iter().copied().collect();
        // Once each, however many outputs it is.
        let returned: std::collections::HashSet<usize> = self
            .bound
            .iter()
            .copied()
            .chain(
                self.at
                    .iter()
                    .filter(|(v, _)| outputs.contains(v))
                    .map(|(_, s)| *s),
            )
            .filter_map(|s| match s {
                Source::Slot(k) => Some(k),
                _ => None,
            })
            .collect();
        for k in returned {
            reads.grow(k);
            reads.count[k] += 1;
        }
        reads
    }
}

/// `s`, when a slot that a removed step wrote, as what `alias` says replaced it.
pub(crate) fn renamed(alias: &HashMap<usize, Source>, s: &mut Source) {
    if let Source::Slot(k) = s
        && let Some(a) = alias.get(k)
    {
        *s = *a;
    }
}

/// What [`Draft::rewrite_steps`]'s function says of a step.
pub(crate) enum Verdict {
    Keep,
    /// Remove it; reads of each slot named read the source given instead.
    Remove(Vec<(usize, Source)>),
}

/// Who reads each slot of a draft ([`Draft::reads`]).
pub(crate) struct Reads {
    /// Per slot, the steps' reads of it (a step reading it twice counts twice), plus one when
    /// the program returns it.
    count: Vec<usize>,
    /// Per slot, the first step reading it.
    first: Vec<Option<usize>>,
}

impl Reads {
    /// Room for slot `k` (a draft's `num_slots` counts every slot it made, but a test's hand-made
    /// draft may not).
    fn grow(&mut self, k: usize) {
        if k >= self.count.len() {
            self.count.resize(k + 1, 0);
            self.first.resize(k + 1, None);
        }
    }

    /// How many steps read `slot`, plus one when the program returns it (bound, or a graph
    /// output not bound yet).
    pub(crate) fn count(&self, slot: usize) -> usize {
        self.count.get(slot).copied().unwrap_or(0)
    }

    /// The first step that reads `slot`.
    pub(crate) fn first(&self, slot: usize) -> Option<usize> {
        self.first.get(slot).copied().flatten()
    }

    /// What reads `from` reads `to` instead, and the one step that read `to` (and wrote
    /// `from`) is gone: a step folded into the one before it.
    pub(crate) fn moved(&mut self, from: usize, to: usize) {
        let n = self.count(from);
        if let Some(c) = self.count.get_mut(to) {
            *c = c.saturating_sub(1) + n;
        }
        if let Some(c) = self.count.get_mut(from) {
            *c = 0;
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Drafts for the passes' unit tests.

    use super::*;
    use crate::kernel::OpKernel;

    /// A kernel that must not run (a pass under test only rewrites it).
    pub(crate) struct Unused;

    impl OpKernel for Unused {
        fn run(
            &self,
            _: &[Option<crate::tensor::TensorRef<'_>>],
        ) -> crate::error::OpResult<Vec<Tensor>> {
            Err(crate::error::OpError("this kernel does not run".into()))
        }
    }

    /// A step of node `def` reading `inputs`, writing `outputs` (graph value `v` to slot `v`).
    pub(crate) fn node_step<'g>(
        def: NodeDef,
        kernel: Box<dyn OpKernel>,
        inputs: Vec<Option<Source>>,
        outputs: &[u32],
    ) -> DraftStep<'g> {
        DraftStep {
            step: Step::new(
                def.name.clone(),
                def.op_type.clone(),
                kernel,
                inputs,
                outputs.iter().map(|&v| Some(v as usize)).collect(),
            ),
            node: Some(NodeInfo {
                values: outputs.iter().map(|&v| Some(v)).collect(),
                output_types: vec![Some(ElementType::Float); outputs.len()],
                def,
                pending: None,
            }),
        }
    }

    /// A node of op `op` reading f32 inputs, its kernel made by the registry.
    pub(crate) fn def(op: &str, num_inputs: usize) -> NodeDef {
        NodeDef {
            name: format!("{op}_node"),
            num_inputs,
            input_types: vec![Some(ElementType::Float); num_inputs],
            ..NodeDef::new(op, 17)
        }
    }

    /// A kernel from the registry for `def`.
    pub(crate) fn kernel(def: &NodeDef) -> Box<dyn OpKernel> {
        crate::ops::registry().build(def).expect("kernel")
    }

    /// A step of node `def` (its kernel from the registry) reading `inputs`, writing graph value
    /// `out` to slot `out`, recorded in `d.at`.
    pub(crate) fn push(d: &mut Draft<'_, '_>, def: NodeDef, inputs: &[Source], out: u32) {
        let k = kernel(&def);
        let inputs = inputs.iter().map(|&s| Some(s)).collect();
        d.steps.push(node_step(def, k, inputs, &[out]));
        d.at.insert(out, Source::Slot(out as usize));
        d.num_slots = d.num_slots.max(out as usize + 1);
    }

    /// Runs the draft's steps in order on `inputs` and returns the program outputs
    /// (`d.outputs`, found through `d.at`).
    pub(crate) fn run_draft(d: &Draft<'_, '_>, inputs: &[Tensor]) -> Vec<Tensor> {
        let mut slots: HashMap<usize, Tensor> = HashMap::new();
        let value = |slots: &HashMap<usize, Tensor>, s: Source| -> Tensor {
            match s {
                Source::Input(i) => inputs[i].clone(),
                Source::Constant(i) => d.constants[i].clone(),
                Source::Slot(i) => slots[&i].clone(),
            }
        };
        for st in &d.steps {
            let args: Vec<Option<Tensor>> = st
                .step
                .inputs
                .iter()
                .map(|s| s.map(|s| value(&slots, s)))
                .collect();
            let views: Vec<_> = args.iter().map(|a| a.as_ref().map(Tensor::view)).collect();
            let outs = st.step.kernel.run(&views).expect("the step runs");
            for (o, t) in st.step.outputs.iter().zip(outs) {
                if let Some(o) = o {
                    slots.insert(*o, t);
                }
            }
        }
        d.outputs.iter().map(|v| value(&slots, d.at[v])).collect()
    }

    /// The op kinds of the draft's steps, in order.
    pub(crate) fn kinds(d: &Draft<'_, '_>) -> Vec<String> {
        d.steps.iter().map(|s| s.step.kind.clone()).collect()
    }
}
