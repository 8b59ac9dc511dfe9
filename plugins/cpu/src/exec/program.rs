//! A compiled sequence of op kernels over a set of graph nodes: what a CPU EP kernel runs, and
//! what the bodies of `If`, `Loop` and `Scan` are compiled into.
//!
//! Compiling is the pipeline of named passes [`PASSES`] over a [`Draft`]; any pass that is not
//! required can be turned off by name ([`compile_options`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use epx_plugin_api::sdk;

use crate::error::OpError;
use crate::exec::passes::{
    CompileOptions, Draft, ENV_DISABLE_PASSES, Pass, batch_norm, build, casts, constants, float16,
    fusion, liveness, matmul_add, outputs, prepare, transposes,
};
use crate::exec::profile;
use crate::exec::step::{Source, Step};
use crate::kernel::Body;
use crate::tensor::{Tensor, TensorRef};

thread_local! {
    /// The terminate flag of the run this thread is executing ([`watch_terminate`]).
    static TERMINATE: std::cell::Cell<*const AtomicBool> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

/// While the guard lives, programs run on this thread (and the bodies of their `Loop`, `Scan`
/// and `If` nodes) stop before their next node once `flag` is set, failing with "the run was
/// terminated". Nested guards restore the outer flag when they drop.
pub fn watch_terminate(flag: Option<&AtomicBool>) -> TerminateGuard<'_> {
    let flag = flag.map_or(std::ptr::null(), |f| f as *const AtomicBool);
    TerminateGuard {
        previous: TERMINATE.with(|t| t.replace(flag)),
        _flag: std::marker::PhantomData,
    }
}

/// See [`watch_terminate`].
pub struct TerminateGuard<'a> {
    previous: *const AtomicBool,
    _flag: std::marker::PhantomData<&'a AtomicBool>,
}

impl Drop for TerminateGuard<'_> {
    fn drop(&mut self) {
        TERMINATE.with(|t| t.set(self.previous));
    }
}

fn terminated() -> bool {
    TERMINATE.with(|t| {
        let flag = t.get();
        // SAFETY: set only by `watch_terminate` from a reference that outlives its guard, and
        // the guard restores the previous pointer before that reference ends.
        !flag.is_null() && unsafe { (*flag).load(Ordering::Relaxed) }
    })
}

/// The compile pipeline, in the order the passes run.
pub(crate) const PASSES: &[Pass] = &[
    Pass {
        name: "bind_inputs",
        required: true,
        fast_only: false,
        changes: "",
        run: float16::bind_inputs,
    },
    Pass {
        name: "plan_qdq",
        required: false,
        fast_only: true,
        changes: "",
        run: build::plan_qdq,
    },
    Pass {
        name: "build_steps",
        required: true,
        fast_only: false,
        changes: "",
        run: build::build_steps,
    },
    Pass {
        name: "fold_batch_norm",
        required: false,
        fast_only: true,
        changes: "",
        run: batch_norm::fold_batch_norm,
    },
    Pass {
        name: "elide_casts",
        required: false,
        fast_only: false,
        changes: "",
        run: casts::elide_casts,
    },
    Pass {
        name: "elide_identities",
        required: false,
        fast_only: false,
        changes: "",
        run: casts::elide_identities,
    },
    Pass {
        name: "fold_constants",
        required: false,
        fast_only: false,
        changes: "",
        run: constants::fold_constants,
    },
    Pass {
        name: "push_transposes",
        required: false,
        fast_only: true,
        changes: "",
        run: transposes::push_transposes,
    },
    Pass {
        name: "fold_conv_affine",
        required: false,
        fast_only: true,
        changes: "",
        run: batch_norm::fold_conv_affine,
    },
    Pass {
        name: "build_control_flow",
        required: true,
        fast_only: false,
        changes: "",
        run: build::build_control_flow,
    },
    Pass {
        name: "bind_outputs",
        required: true,
        fast_only: false,
        changes: "",
        run: outputs::bind_outputs,
    },
    Pass {
        name: "prepare_kernels",
        required: false,
        fast_only: false,
        changes: "",
        run: prepare::prepare_kernels,
    },
    Pass {
        name: "fuse_matmul_add",
        required: false,
        fast_only: true,
        changes: "",
        run: matmul_add::fuse_matmul_add,
    },
    Pass {
        name: "fuse_chains",
        required: false,
        fast_only: true,
        changes: "",
        run: fusion::fuse_chains,
    },
    Pass {
        name: "hoist_shape_reads",
        required: false,
        fast_only: false,
        changes: "Shape/Size steps moved next to their input",
        run: liveness::hoist_shape_reads,
    },
    Pass {
        name: "plan_frees",
        required: false,
        fast_only: false,
        changes: "",
        run: liveness::plan_frees,
    },
    Pass {
        name: "move_reshapes",
        required: false,
        fast_only: false,
        changes: "reshapes that take their input's buffer",
        run: liveness::move_reshapes,
    },
];

/// The passes turned off by `list` (comma-separated names, the CPU EP option `disable_passes`)
/// and by the environment variable [`ENV_DISABLE_PASSES`]. An unknown name, or a pass the
/// program needs, is an error listing the passes that can be turned off.
pub fn compile_options(list: Option<&str>) -> Result<CompileOptions, String> {
    let env = std::env::var(ENV_DISABLE_PASSES).unwrap_or_default();
    let optional: Vec<&str> = PASSES
        .iter()
        .filter(|p| !p.required)
        .map(|p| p.name)
        .collect();
    let mut disabled = Vec::new();
    for (source, text) in [
        ("option `disable_passes`", list.unwrap_or("")),
        (ENV_DISABLE_PASSES, env.as_str()),
    ] {
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match PASSES.iter().find(|p| p.name == name) {
                Some(p) if p.required => {
                    return Err(format!(
                        "{source}: the compile pass `{name}` is required and cannot be turned off; \
                         the passes that can are {}",
                        optional.join(", ")
                    ));
                }
                Some(_) => disabled.push(name.to_string()),
                None => {
                    return Err(format!(
                        "{source}: there is no compile pass `{name}`; the passes that can be \
                         turned off are {}",
                        optional.join(", ")
                    ));
                }
            }
        }
    }
    disabled.sort();
    disabled.dedup();
    Ok(CompileOptions { disabled })
}

impl Body for Program {
    fn profile_start(&self) {
        for (st, c) in self.steps.iter().zip(&self.counters) {
            c.calls.store(0, Ordering::Relaxed);
            c.ns.store(0, Ordering::Relaxed);
            for (_, body) in st.kernel.bodies() {
                body.profile_start();
            }
        }
        self.recording.store(true, Ordering::Relaxed);
    }

    fn profile_parts(&self, prefix: &str, out: &mut Vec<sdk::ProfilePart>) -> u64 {
        let mut total = 0u64;
        for (st, c) in self.steps.iter().zip(&self.counters) {
            let ns = c.ns.load(Ordering::Relaxed);
            total = total.saturating_add(ns);
            let at = out.len();
            out.push(sdk::ProfilePart {
                name: format!("{prefix}{}", st.label),
                op: st.kind.clone(),
                calls: c.calls.load(Ordering::Relaxed),
                ns,
            });
            let mut inside = 0u64;
            for (attr, body) in st.kernel.bodies() {
                let nested = format!("{prefix}{}/{attr}/", st.label);
                inside = inside.saturating_add(body.profile_parts(&nested, out));
            }
            out[at].ns = ns.saturating_sub(inside);
        }
        total
    }
}

/// What pass `pass` did: the steps it removed or added, and how many others it changed (what
/// it counts in [`Draft::changed`]).
fn pass_note(pass: &Pass, before: usize, after: usize, changed: usize) -> sdk::PassNote {
    let plural = if after == 1 { "" } else { "s" };
    let steps = if before == after {
        format!("{after} step{plural}")
    } else {
        format!("{before} -> {after} step{plural}")
    };
    let note = match (changed, pass.changes) {
        (0, _) | (_, "") => steps,
        (n, what) => format!("{steps}; {n} {what}"),
    };
    sdk::PassNote {
        name: pass.name.to_string(),
        changed: (before.abs_diff(after) + changed) as u64,
        note,
    }
}

/// One step's calls and nanoseconds while profiling.
#[derive(Default)]
struct StepCounter {
    calls: AtomicU64,
    ns: AtomicU64,
}

/// Nodes compiled once, run many times.
pub struct Program {
    pub(crate) steps: Vec<Step>,
    constants: Vec<Tensor>,
    num_slots: usize,
    outputs: Vec<Source>,
    /// Per output, whether a later output reads the same slot (this one then takes a copy).
    output_again: Vec<bool>,
    /// What each pass that ran did.
    passes: Vec<sdk::PassNote>,
    /// Whether runs record into `counters` ([`Self::profile_start`]).
    recording: AtomicBool,
    /// One per step.
    counters: Box<[StepCounter]>,
}

impl Program {
    /// Compiles `nodes` (in topological order) of `graph`. Run input `i` is bound to value
    /// `inputs[i]` (`None`: an input this program does not read); the run returns `outputs`.
    /// `known[i]`, where present, is run input `i`'s value in every run (an enclosing graph's
    /// constant): nodes computed from such values and constants only are evaluated here, once.
    pub fn compile(
        graph: &sdk::GraphView<'_>,
        nodes: &[u32],
        inputs: &[Option<u32>],
        outputs: &[u32],
        known: &[Option<&Tensor>],
        options: &CompileOptions,
    ) -> sdk::Result<Program> {
        let mut d = Draft::new(*graph, nodes, inputs, outputs, known, options)?;
        let fast = crate::fast::enabled();
        let mut notes = Vec::new();
        for pass in PASSES {
            if pass.required || (options.runs(pass.name) && (fast || !pass.fast_only)) {
                let before = d.steps.len();
                d.changed = 0;
                (pass.run)(&mut d)?;
                // The passes that build the program are not what a profile reader asks about.
                if !pass.required {
                    notes.push(pass_note(pass, before, d.steps.len(), d.changed));
                }
            }
        }
        let mut program = Program::finish(d);
        program.passes = notes;
        Ok(program)
    }

    /// The program of a finished draft, its slots numbered from 0 in the order steps write
    /// them (slots the passes emptied are dropped).
    fn finish(d: Draft<'_, '_>) -> Program {
        let mut number: Vec<Option<usize>> = vec![None; d.num_slots];
        let mut next = 0;
        let mut renumber = |s: &mut usize| {
            *s = *number[*s].get_or_insert_with(|| {
                next += 1;
                next - 1
            });
        };
        let mut steps: Vec<Step> = d.steps.into_iter().map(|st| st.step).collect();
        for st in &mut steps {
            for src in st.inputs.iter_mut().flatten() {
                if let Source::Slot(s) = src {
                    renumber(s);
                }
            }
            st.outputs.iter_mut().flatten().for_each(&mut renumber);
            st.frees.iter_mut().for_each(&mut renumber);
        }
        let mut outputs = d.bound;
        for src in &mut outputs {
            if let Source::Slot(s) = src {
                renumber(s);
            }
        }
        let counters = steps.iter().map(|_| StepCounter::default()).collect();
        // From the back: an output read again later is copied, not moved.
        let mut seen = std::collections::HashSet::new();
        let mut output_again: Vec<bool> = outputs
            .iter()
            .rev()
            .map(|o| matches!(o, Source::Slot(s) if !seen.insert(*s)))
            .collect();
        output_again.reverse();
        Program {
            steps,
            constants: d.constants,
            num_slots: next,
            outputs,
            output_again,
            passes: Vec::new(),
            recording: AtomicBool::new(false),
            counters,
        }
    }

    /// Starts recording each step's calls and time, from zero, and those of the programs
    /// nested in its control-flow steps ([`Self::profile`] reads them).
    pub fn profile_start(&self) {
        Body::profile_start(self);
    }

    /// Each step's calls and time since [`Self::profile_start`], and what the passes did. The
    /// steps of a control-flow step's bodies follow it, named `<step>/<attribute>/<step>`; the
    /// control-flow step's own time is then what it took outside them.
    pub fn profile(&self) -> sdk::KernelProfile {
        let mut parts = Vec::with_capacity(self.steps.len());
        self.profile_parts("", &mut parts);
        sdk::KernelProfile {
            parts,
            passes: self.passes.clone(),
        }
    }

    /// Compiles a whole graph. Run inputs are its own inputs, then the values of `outer`
    /// (names of enclosing-graph values, in the order the caller passes them); `own[i]` is its
    /// input `i`'s value and `fixed[j]` is `outer[j]`'s where they are the same in every run
    /// and known at compile time.
    pub fn compile_graph(
        graph: &sdk::GraphView<'_>,
        own: &[Option<&Tensor>],
        outer: &[&str],
        fixed: &[Option<&Tensor>],
        options: &CompileOptions,
    ) -> sdk::Result<Program> {
        let mut inputs: Vec<Option<u32>> = graph.inputs()?.iter().map(|&v| Some(v)).collect();
        for name in outer {
            inputs.push(
                graph
                    .value_named(name)?
                    .filter(|&v| graph.value(v).is_ok_and(|i| i.producer.is_none())),
            );
        }
        let count = inputs.len() - outer.len();
        let known: Vec<Option<&Tensor>> = (0..inputs.len())
            .map(|i| match i.checked_sub(count) {
                Some(j) => fixed.get(j).copied().flatten(),
                None => own.get(i).copied().flatten(),
            })
            .collect();
        let nodes: Vec<u32> = (0..graph.node_count() as u32).collect();
        Program::compile(graph, &nodes, &inputs, graph.outputs()?, &known, options)
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

    /// The run input that output `i` is, unchanged, when it is one (a Loop body that passes a
    /// loop-carried value on as it came).
    pub fn passes_through(&self, i: usize) -> Option<usize> {
        match self.outputs.get(i) {
            Some(Source::Input(k)) => Some(*k),
            _ => None,
        }
    }

    /// Runs the program; returns its outputs.
    pub fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Tensor>, OpError> {
        self.run_except(inputs, &[])?
            .into_iter()
            .map(|t| t.ok_or_else(|| OpError("output was not computed".into())))
            .collect()
    }

    /// Runs the program; returns its outputs, except `None` for each `i` where `skip[i]` (so a
    /// caller that has a value already is not handed a copy of it).
    pub fn run_except(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        skip: &[bool],
    ) -> Result<Vec<Option<Tensor>>, OpError> {
        let mut slots: Vec<Option<Tensor>> = (0..self.num_slots).map(|_| None).collect();
        let recording = self.recording.load(Ordering::Relaxed);
        for (step, counter) in self.steps.iter().zip(&self.counters) {
            if terminated() {
                return Err(OpError(format!(
                    "the run was terminated (before node `{}`)",
                    step.label
                )));
            }
            let _timer = profile::Timer::start(&step.kind, &step.label);
            let _count = recording.then(|| profile::Count::start(&counter.calls, &counter.ns));
            let failed = |e: OpError| OpError(format!("node `{}`: {e}", step.label));
            let mut moved = None;
            let results = {
                let mut args = Vec::with_capacity(step.inputs.len());
                for src in &step.inputs {
                    args.push(match src {
                        Some(s) => Some(self.fetch(*s, inputs, &slots)?),
                        None => None,
                    });
                }
                match step.kernel.reshaped_shape(&args) {
                    Some(shape) if step.moves_input => {
                        moved = Some(shape.map_err(failed)?);
                        Vec::new()
                    }
                    _ => step.kernel.run(&args).map_err(failed)?,
                }
            };
            let results = match (moved, step.inputs.first()) {
                // Input 0 dies here: its buffer becomes the output, unless its layout is not
                // C order (then it is copied as the kernel would).
                (Some(shape), Some(Some(Source::Slot(s)))) => {
                    let t = slots[*s].take().ok_or_else(|| {
                        failed(OpError("value used before it was computed".into()))
                    })?;
                    if t.reshapes_in_place(&shape) {
                        vec![t.into_shape(&shape).map_err(failed)?]
                    } else {
                        let r = crate::ops::shape::reshape_ref(&step.label, &t.view(), &shape);
                        vec![r.map_err(failed)?]
                    }
                }
                (Some(_), _) => {
                    return Err(failed(OpError(
                        "a moved input is not a computed value".into(),
                    )));
                }
                (None, _) => results,
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
            if skip.get(i).copied().unwrap_or(false) {
                outs.push(None);
                continue;
            }
            // Computed values move out of their slot (unless a later output reads it too).
            let again = self.output_again[i];
            outs.push(Some(match src {
                Source::Slot(s) if !again => slots[*s]
                    .take()
                    .ok_or_else(|| OpError("output was not computed".into()))?,
                _ => self.fetch(*src, inputs, &slots)?.try_to_owned()?,
            }));
        }
        Ok(outs)
    }
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::ElementType;
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::ops::testing::{t, vals};

    /// `y = x * -(w)`: the Neg of an initializer folds, the Mul reads the run input.
    fn graph() -> (TestGraph, [Option<u32>; 1], [u32; 1]) {
        let mut g = TestGraph::new();
        let x = g.input("x", ElementType::Float, &[2]);
        g.initializer("w", &[2], &[1.0f32, 2.0]);
        g.node("Neg", &["w"], &["nw"]);
        g.node("Mul", &["x", "nw"], &["y"]);
        let y = g.output("y", ElementType::Float, &[2]);
        (g, [Some(x)], [y])
    }

    fn run(p: &Program, x: &Tensor) -> Vec<f32> {
        vals(&p.run(&[Some(x.view())]).unwrap()[0])
    }

    #[test]
    fn a_pass_turned_off_by_name_leaves_its_work_undone_and_the_answer_alone() {
        let (g, inputs, outputs) = graph();
        let x = t(&[2], vec![3.0, 4.0]);
        let all = CompileOptions::default();
        let p = Program::compile(&g.view(), &[0, 1], &inputs, &outputs, &[], &all).unwrap();
        let no_fold = compile_options(Some("fold_constants, fuse_chains")).unwrap();
        let q = Program::compile(&g.view(), &[0, 1], &inputs, &outputs, &[], &no_fold).unwrap();
        let kinds = |p: &Program| p.steps.iter().map(|s| s.kind.clone()).collect::<Vec<_>>();
        assert_eq!(kinds(&q), ["Neg", "Mul"]);
        assert!(!kinds(&p).contains(&"Neg".to_string()), "{:?}", kinds(&p));
        assert_eq!(run(&p, &x), [-3.0, -8.0]);
        assert_eq!(run(&q, &x), [-3.0, -8.0]);
    }

    /// A profile counts each step's runs from `profile_start` on (none before), and notes what
    /// each optional pass did: the folded Neg, and the passes that found nothing to do.
    #[test]
    fn a_profile_counts_each_steps_runs_and_notes_what_the_passes_did() {
        let (g, inputs, outputs) = graph();
        let x = t(&[2], vec![3.0, 4.0]);
        let all = CompileOptions::default();
        let p = Program::compile(&g.view(), &[0, 1], &inputs, &outputs, &[], &all).unwrap();
        run(&p, &x);
        assert!(p.profile().parts.iter().all(|s| s.calls == 0 && s.ns == 0));
        p.profile_start();
        run(&p, &x);
        run(&p, &x);
        let profile = p.profile();
        let parts: Vec<(&str, u64)> = profile
            .parts
            .iter()
            .map(|s| (s.op.as_str(), s.calls))
            .collect();
        assert_eq!(parts, [("Mul", 2)]);
        let note = |name: &str| {
            let n = profile.passes.iter().find(|n| n.name == name).expect(name);
            (n.changed, n.note.as_str())
        };
        assert_eq!(note("elide_casts"), (0, "2 steps"));
        assert_eq!(note("fold_constants"), (1, "2 -> 1 step"));
        assert_eq!(note("fuse_chains"), (0, "1 step"));
        // The passes that build the program are not noted.
        assert!(profile.passes.iter().all(|n| n.name != "build_steps"));
        p.profile_start();
        assert_eq!(p.profile().parts[0].calls, 0);
    }

    /// Compiling grows about linearly with the graph for each pass that removes or moves many
    /// steps: chains of Identity (`elide_identities`), Cast to float (`elide_casts`),
    /// constant Adds (`fold_constants`), Shape reads of a chain (`hoist_shape_reads`),
    /// MatMul + bias Add (`fuse_matmul_add`), Conv + per-channel Mul (`fold_conv_affine`), and
    /// many outputs of one value. Each made at `n` and `16 n` nodes, best of three: a pass that
    /// removes a step and rewrites every later one (what each did before) grows by about 256,
    /// a linear one by about 16 (to 40 with caches and allocation); under 100 passes.
    #[test]
    fn compiling_grows_linearly_with_the_graph() {
        fn graph(kind: &str, n: usize) -> (TestGraph, Vec<Option<u32>>, Vec<u32>) {
            let mut g = TestGraph::new();
            let x = g.input("x", ElementType::Float, &[1, 4, 1, 1]);
            g.initializer("c", &[1, 4, 1, 1], &[1.0f32, 2.0, 3.0, 4.0]);
            g.initializer("w", &[4, 4, 1, 1], &[0.5f32; 16]);
            g.initializer("m", &[4, 4], &[0.25f32; 16]);
            g.initializer("b", &[4], &[1.0f32; 4]);
            g.initializer("k", &[1, 4, 1, 1], &[2.0f32; 4]);
            let mut prev = "x".to_string();
            let mut outputs = Vec::new();
            for i in 0..n {
                let o = format!("t{i}");
                match kind {
                    "identity" => {
                        g.node("Identity", &[&prev], &[&o]);
                    }
                    "cast" => {
                        g.node("Cast", &[&prev], &[&o]).attr_int("to", 1);
                    }
                    "constant" => {
                        let from = if i == 0 {
                            "c".to_string()
                        } else {
                            prev.clone()
                        };
                        g.node("Add", &[&from, "c"], &[&o]);
                    }
                    "shape" => {
                        g.node("Relu", &[&prev], &[&o]);
                    }
                    "matmul" => {
                        let mm = format!("mm{i}");
                        g.node("MatMul", &[&prev, "m"], &[&mm]);
                        g.node("Add", &[&mm, "b"], &[&o]);
                    }
                    "conv" => {
                        let cv = format!("cv{i}");
                        g.node("Conv", &[&prev, "w"], &[&cv]);
                        g.node("Mul", &[&cv, "k"], &[&o]);
                    }
                    _ => {
                        // Many outputs: every node reads x, each output.
                        g.node("Identity", &["x"], &[&o]);
                        outputs.push(g.output(&o, ElementType::Float, &[1, 4, 1, 1]));
                        continue;
                    }
                }
                prev = o;
            }
            if kind == "shape" {
                for i in 0..n {
                    g.node("Shape", &[&format!("t{i}")], &[&format!("s{i}")]);
                    outputs.push(g.output(&format!("s{i}"), ElementType::Int64, &[4]));
                }
            }
            let last = if kind == "constant" {
                g.node("Add", &[&prev, "x"], &["y"]);
                "y".to_string()
            } else {
                prev
            };
            if kind != "outputs" {
                outputs.push(g.output(&last, ElementType::Float, &[1, 4, 1, 1]));
            }
            (g, vec![Some(x)], outputs)
        }
        let compile = |kind: &str, n: usize| -> f64 {
            let (g, inputs, outputs) = graph(kind, n);
            let nodes: Vec<u32> = (0..g.view().node_count() as u32).collect();
            (0..3)
                .map(|_| {
                    let t = std::time::Instant::now();
                    Program::compile(
                        &g.view(),
                        &nodes,
                        &inputs,
                        &outputs,
                        &[],
                        &CompileOptions::default(),
                    )
                    .expect("compiles");
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        for (kind, n) in [
            ("identity", 600),
            ("cast", 600),
            ("constant", 600),
            ("shape", 300),
            ("matmul", 300),
            ("conv", 300),
            ("outputs", 600),
        ] {
            let (small, large) = (compile(kind, n), compile(kind, 16 * n));
            let growth = large / small.max(1e-6);
            eprintln!(
                "{kind}: {n} nodes {small:.4} s, {} nodes {large:.4} s: x{growth:.0}",
                16 * n
            );
            assert!(
                growth < 100.0,
                "{kind}: compiling 16x the nodes took {growth:.0}x as long"
            );
        }
    }

    /// A Reshape (or Squeeze, Flatten, Unsqueeze) that is its input's last reader takes the
    /// input's buffer; one whose input is read again copies; both answer the same.
    #[test]
    fn a_reshape_of_a_dying_value_moves_it() {
        let mut g = TestGraph::new();
        let x = g.input("x", ElementType::Float, &[2, 3]);
        g.initializer("s", &[2], &[3i64, 2]);
        g.initializer("ax", &[1], &[0i64]);
        g.node("Relu", &["x"], &["r"]);
        g.node("Reshape", &["r", "s"], &["a"]);
        g.node("Unsqueeze", &["a", "ax"], &["b"]);
        g.node("Flatten", &["r"], &["f"]);
        g.node("Neg", &["b"], &["y"]);
        let y = g.output("y", ElementType::Float, &[1, 3, 2]);
        let f = g.output("f", ElementType::Float, &[2, 3]);
        let all = CompileOptions::default();
        let p =
            Program::compile(&g.view(), &[0, 1, 2, 3, 4], &[Some(x)], &[y, f], &[], &all).unwrap();
        let moves: Vec<(&str, bool)> = p
            .steps
            .iter()
            .map(|s| (s.kind.as_str(), s.moves_input))
            .collect();
        // `r` is read again by the Flatten after the Reshape: the Reshape copies; the
        // Unsqueeze and the Flatten are their inputs' last readers.
        assert_eq!(
            moves,
            [
                ("Relu", false),
                ("Reshape", false),
                ("Unsqueeze", true),
                ("Flatten", true),
                ("Neg", false)
            ]
        );
        let xv = t(&[2, 3], vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0]);
        let out = p.run(&[Some(xv.view())]).unwrap();
        assert_eq!(out[0].shape(), [1, 3, 2]);
        assert_eq!(vals(&out[0]), [-1.0, -0.0, -3.0, -0.0, -5.0, -0.0]);
        assert_eq!(out[1].shape(), [2, 3]);
        assert_eq!(vals(&out[1]), [1.0, 0.0, 3.0, 0.0, 5.0, 0.0]);
        let no_move = compile_options(Some("move_reshapes")).unwrap();
        let q = Program::compile(
            &g.view(),
            &[0, 1, 2, 3, 4],
            &[Some(x)],
            &[y, f],
            &[],
            &no_move,
        )
        .unwrap();
        assert!(q.steps.iter().all(|s| !s.moves_input));
        assert_eq!(q.run(&[Some(xv.view())]).unwrap(), out);
    }

    #[test]
    fn an_unknown_or_required_pass_is_refused_with_the_list() {
        let e = compile_options(Some("fold_constant")).unwrap_err();
        assert!(e.contains("no compile pass `fold_constant`"), "{e}");
        let list = "plan_qdq, fold_batch_norm, elide_casts, elide_identities, fold_constants, push_transposes, fold_conv_affine, prepare_kernels, fuse_matmul_add, fuse_chains, hoist_shape_reads, plan_frees, move_reshapes";
        assert!(e.contains(list), "{e}");
        let e = compile_options(Some("build_steps")).unwrap_err();
        assert!(e.contains("`build_steps` is required"), "{e}");
        assert_eq!(
            compile_options(Some(" ")).unwrap(),
            CompileOptions::default()
        );
    }

    /// A Loop whose body hands a carried value back as it came reads it in place each
    /// iteration (and returns it once); where its initial value is a constant, the body is
    /// compiled knowing it and what reads only it is folded. The profile lists the body's
    /// steps after the Loop.
    #[test]
    fn a_loop_passes_unchanged_carried_values_through_and_folds_constant_ones() {
        let body = || {
            let mut b = TestGraph::new();
            b.input("i", ElementType::Int64, &[]);
            b.input("c", ElementType::Bool, &[]);
            b.input("xi", ElementType::Float, &[2]);
            b.input("wi", ElementType::Float, &[2]);
            b.node("Identity", &["c"], &["co"]);
            b.node("Neg", &["wi"], &["nw"]);
            b.node("Add", &["xi", "nw"], &["xo"]);
            b.node("Identity", &["xo"], &["s"]);
            b.output("co", ElementType::Bool, &[]);
            b.output("xo", ElementType::Float, &[2]);
            b.output("wi", ElementType::Float, &[2]);
            b.output("s", ElementType::Float, &[2]);
            b
        };
        let all = CompileOptions::default();
        let b = body();
        let p = Program::compile_graph(&b.view(), &[], &[], &[], &all).unwrap();
        assert_eq!(
            (0..4).map(|i| p.passes_through(i)).collect::<Vec<_>>(),
            [None, None, Some(3), None]
        );
        // `w` a constant, then a run input.
        for constant in [true, false] {
            let mut g = TestGraph::new();
            let m = g.input("m", ElementType::Int64, &[]);
            let x = g.input("x", ElementType::Float, &[2]);
            let w = if constant {
                g.initializer("w", &[2], &[1.0f32, 2.0])
            } else {
                g.input("w", ElementType::Float, &[2])
            };
            g.node("Loop", &["m", "", "x", "w"], &["xf", "wf", "ss"])
                .name("loop")
                .attr_graph("body", body());
            let outs = [
                g.output("xf", ElementType::Float, &[2]),
                g.output("wf", ElementType::Float, &[2]),
                g.output("ss", ElementType::Float, &[3, 2]),
            ];
            let inputs = [Some(m), Some(x), (!constant).then_some(w)];
            let p = Program::compile(&g.view(), &[0], &inputs, &outs, &[], &all).unwrap();
            p.profile_start();
            let (mv, xv) = (Tensor::scalar(3i64), t(&[2], vec![0.0, 0.5]));
            let wv = t(&[2], vec![1.0, 2.0]);
            let r = p
                .run(&[Some(mv.view()), Some(xv.view()), Some(wv.view())])
                .unwrap();
            assert_eq!(vals(&r[0]), [-3.0, -5.5]);
            assert_eq!(vals(&r[1]), [1.0, 2.0]);
            assert_eq!(r[2].shape(), [3, 2]);
            assert_eq!(vals(&r[2]), [-1.0, -1.5, -2.0, -3.5, -3.0, -5.5]);
            let parts = p.profile().parts;
            assert_eq!((parts[0].name.as_str(), parts[0].calls), ("loop", 1));
            assert!(parts[1..].iter().all(|s| s.name.starts_with("loop/body/")));
            let body: Vec<(&str, u64)> = parts[1..]
                .iter()
                .filter(|s| s.op != "Identity")
                .map(|s| (s.op.as_str(), s.calls))
                .collect();
            // The Neg of the constant weight was computed once, at compile time.
            let want = if constant { "Add" } else { "fused Neg+Add" };
            assert_eq!(body, [(want, 3)], "constant: {constant}");
        }
    }

    #[test]
    fn a_body_reading_a_folded_outer_value_runs_right() {
        let mut g = TestGraph::new();
        let c = g.input("c", ElementType::Bool, &[]);
        g.initializer("w", &[1], &[2.0f32]);
        g.node("Neg", &["w"], &["nw"]);
        let branch = |op: &str| {
            let mut b = TestGraph::new();
            b.typed("nw", ElementType::Float, &[1]);
            b.node(op, &["nw", "nw"], &["r"]);
            b.output("r", ElementType::Float, &[1]);
            b
        };
        g.node_reading("If", &["c"], &["y"], &["nw"])
            .attr_graph("then_branch", branch("Add"))
            .attr_graph("else_branch", branch("Mul"));
        let y = g.output("y", ElementType::Float, &[1]);
        let all = CompileOptions::default();
        let p = Program::compile(&g.view(), &[0, 1], &[Some(c)], &[y], &[], &all).unwrap();
        let run = |b: bool| {
            let c = Tensor::from_vec(&[], vec![b]).unwrap();
            vals(&p.run(&[Some(c.view())]).unwrap()[0])
        };
        assert_eq!((run(true), run(false)), (vec![-4.0], vec![4.0]));
    }
}
