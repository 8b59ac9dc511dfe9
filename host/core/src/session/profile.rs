//! Profiling a session ([`SessionBuilder::with_profiling`]): the host times every kernel and
//! copy of every run; EPs that record their kernels' parts (ABI 1.7, the CPU EP among them) add
//! the time of each node or fused node, and what their compile passes did. [`Profile`] is the
//! data; [`Profile::table`] the view a person reads, JSON (serde) the one a program reads.
//!
//! [`SessionBuilder::with_profiling`]: super::SessionBuilder::with_profiling

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use crate::plugin::{PartDetail, PassDetail};

/// Calls and nanoseconds, added to from any thread.
#[derive(Default)]
pub(super) struct Counter {
    calls: AtomicU64,
    ns: AtomicU64,
}

impl Counter {
    pub(super) fn add(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn reset(&self) {
        self.calls.store(0, Ordering::Relaxed);
        self.ns.store(0, Ordering::Relaxed);
    }

    pub(super) fn read(&self) -> (u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.ns.load(Ordering::Relaxed),
        )
    }
}

/// What a profiling session records as it runs.
pub(super) struct Profiler {
    pub(super) runs: Counter,
    /// One per kernel.
    pub(super) kernels: Vec<Counter>,
    /// One per copy of the plan.
    pub(super) copies: Vec<Counter>,
    /// Per kernel: `None` when its EP records the kernel's parts, else why not.
    pub(super) whole: Vec<Option<String>>,
}

impl Profiler {
    pub(super) fn new(kernels: usize, copies: usize) -> Self {
        Profiler {
            runs: Counter::default(),
            kernels: (0..kernels).map(|_| Counter::default()).collect(),
            copies: (0..copies).map(|_| Counter::default()).collect(),
            whole: vec![None; kernels],
        }
    }

    /// Every host counter back to zero.
    pub(super) fn reset(&self) {
        self.runs.reset();
        self.kernels
            .iter()
            .chain(&self.copies)
            .for_each(Counter::reset);
    }
}

/// Where a profiling session's runs spent their time, since it was made.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Profile {
    /// Runs that returned (failed runs included).
    pub runs: u64,
    /// Nanoseconds in [`Session::run`](super::Session::run), all runs together.
    pub run_ns: u64,
    pub kernels: Vec<KernelProfile>,
    pub copies: Vec<CopyProfile>,
}

/// One compiled kernel: the group of nodes one EP runs as one call.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KernelProfile {
    /// The kernel's name in the placement report (`cpu#0`).
    pub kernel: String,
    pub provider: String,
    /// How many of the model's nodes it runs.
    pub nodes: usize,
    pub calls: u64,
    /// Nanoseconds from the host's call to its return, inputs and outputs handed over included.
    pub ns: u64,
    /// The EP's parts, with their time (empty when `whole` says why there are none).
    pub parts: Vec<PartDetail>,
    /// What the EP's compile passes did to the kernel's nodes.
    pub passes: Vec<PassDetail>,
    /// Why the kernel is timed only as a whole, when it is.
    pub whole: Option<String>,
}

/// One copy between memory spaces.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyProfile {
    pub value: String,
    pub from: String,
    pub to: String,
    pub calls: u64,
    pub ns: u64,
}

/// Time summed by op type and EP: [`Profile::by_op`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OpTime {
    /// The op type (`Conv`), the ops of a fused part (`Conv+Relu`), `copy` for copies,
    /// `kernel call` for what a kernel took outside its parts, or `<n> nodes` for a kernel
    /// timed whole.
    pub op: String,
    pub provider: String,
    pub calls: u64,
    pub ns: u64,
}

impl Profile {
    /// Time by op type and EP, most first. A kernel timed whole is one row; the time a kernel
    /// took outside its parts (handing inputs and outputs over, the EP's own bookkeeping) is a
    /// `kernel call` row of its EP.
    pub fn by_op(&self) -> Vec<OpTime> {
        let mut rows: HashMap<(String, String), (u64, u64)> = HashMap::new();
        let mut add = |op: String, provider: &str, calls: u64, ns: u64| {
            let e = rows.entry((op, provider.to_string())).or_default();
            e.0 += calls;
            e.1 += ns;
        };
        for k in &self.kernels {
            if k.whole.is_some() {
                add(format!("{} nodes", k.nodes), &k.provider, k.calls, k.ns);
                continue;
            }
            let mut inside = 0u64;
            for p in &k.parts {
                add(p.op.clone(), &k.provider, p.calls, p.ns);
                inside = inside.saturating_add(p.ns);
            }
            add(
                "kernel call".into(),
                &k.provider,
                k.calls,
                k.ns.saturating_sub(inside),
            );
        }
        for c in &self.copies {
            add(
                "copy".into(),
                &format!("{} -> {}", c.from, c.to),
                c.calls,
                c.ns,
            );
        }
        let mut rows: Vec<OpTime> = rows
            .into_iter()
            .filter(|(_, (calls, _))| *calls > 0)
            .map(|((op, provider), (calls, ns))| OpTime {
                op,
                provider,
                calls,
                ns,
            })
            .collect();
        rows.sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.op.cmp(&b.op)));
        rows
    }

    /// The profile as a person reads it: time per run by op, the `top` slowest parts, and the
    /// compile passes that changed something.
    pub fn table(&self, top: usize) -> String {
        let mut s = String::new();
        let runs = self.runs.max(1) as f64;
        let ms = |ns: u64| ns as f64 / 1e6 / runs;
        let total: u64 = self.kernels.iter().map(|k| k.ns).sum::<u64>()
            + self.copies.iter().map(|c| c.ns).sum::<u64>();
        let share = |ns: u64| 100.0 * ns as f64 / total.max(1) as f64;
        let _ = writeln!(
            s,
            "profile: {} runs, {:.3} ms a run ({:.3} ms in kernels and copies)",
            self.runs,
            ms(self.run_ns),
            ms(total)
        );
        let _ = writeln!(s, "\nby op:");
        let _ = writeln!(
            s,
            "  {:>10} {:>6} {:>9}  {:<12} op",
            "ms a run", "share", "calls/run", "EP"
        );
        for r in self.by_op() {
            let _ = writeln!(
                s,
                "  {:>10.3} {:>5.1}% {:>9.1}  {:<12} {}",
                ms(r.ns),
                share(r.ns),
                r.calls as f64 / runs,
                r.provider,
                r.op
            );
        }
        let mut parts: Vec<(&KernelProfile, &PartDetail)> = self
            .kernels
            .iter()
            .flat_map(|k| k.parts.iter().map(move |p| (k, p)))
            .filter(|(_, p)| p.calls > 0)
            .collect();
        parts.sort_by_key(|p| std::cmp::Reverse(p.1.ns));
        if !parts.is_empty() {
            let _ = writeln!(s, "\nslowest nodes:");
            let _ = writeln!(
                s,
                "  {:>10} {:>6}  {:<12} {:<20} node",
                "ms a run", "share", "EP", "op"
            );
            for (k, p) in parts.iter().take(top) {
                let _ = writeln!(
                    s,
                    "  {:>10.3} {:>5.1}%  {:<12} {:<20} {}",
                    ms(p.ns),
                    share(p.ns),
                    k.provider,
                    p.op,
                    p.name
                );
            }
        }
        let whole: Vec<&KernelProfile> =
            self.kernels.iter().filter(|k| k.whole.is_some()).collect();
        if !whole.is_empty() {
            let _ = writeln!(s, "\ntimed whole:");
            for k in whole {
                let _ = writeln!(
                    s,
                    "  {} ({} nodes): {}",
                    k.kernel,
                    k.nodes,
                    k.whole.as_deref().unwrap_or_default()
                );
            }
        }
        let changed: Vec<(&KernelProfile, Vec<&PassDetail>)> = self
            .kernels
            .iter()
            .map(|k| (k, k.passes.iter().filter(|p| p.changed > 0).collect()))
            .filter(|(_, p): &(_, Vec<_>)| !p.is_empty())
            .collect();
        if !changed.is_empty() {
            let _ = writeln!(s, "\ncompile passes that changed the graph:");
            for (k, passes) in changed {
                let _ = writeln!(s, "  {} ({} nodes):", k.kernel, k.nodes);
                for p in passes {
                    let _ = writeln!(s, "    {:<20} {}", p.name, p.note);
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, op: &str, calls: u64, ns: u64) -> PartDetail {
        PartDetail {
            name: name.into(),
            op: op.into(),
            calls,
            ns,
        }
    }

    fn profile() -> Profile {
        Profile {
            runs: 2,
            run_ns: 12_000_000,
            kernels: vec![
                KernelProfile {
                    kernel: "cpu#0".into(),
                    provider: "cpu".into(),
                    nodes: 3,
                    calls: 2,
                    ns: 8_000_000,
                    parts: vec![
                        part("conv1 (fused Relu)", "Conv+Relu", 2, 5_000_000),
                        part("pool", "MaxPool", 2, 1_000_000),
                        part("conv2", "Conv", 2, 1_000_000),
                    ],
                    passes: vec![
                        PassDetail {
                            name: "fuse_chains".into(),
                            changed: 1,
                            note: "4 -> 3 steps".into(),
                        },
                        PassDetail {
                            name: "fold_constants".into(),
                            changed: 0,
                            note: "3 steps".into(),
                        },
                    ],
                    whole: None,
                },
                KernelProfile {
                    kernel: "ort_cpu#0".into(),
                    provider: "ort_cpu".into(),
                    nodes: 5,
                    calls: 2,
                    ns: 3_000_000,
                    parts: Vec::new(),
                    passes: Vec::new(),
                    whole: Some("its plugin does not record parts".into()),
                },
            ],
            copies: Vec::new(),
        }
    }

    #[test]
    fn time_is_summed_by_op_with_the_kernel_call_and_whole_kernels_as_rows() {
        let rows = profile().by_op();
        let got: Vec<(&str, &str, u64)> = rows
            .iter()
            .map(|r| (r.op.as_str(), r.provider.as_str(), r.ns))
            .collect();
        assert_eq!(
            got,
            [
                ("Conv+Relu", "cpu", 5_000_000),
                ("5 nodes", "ort_cpu", 3_000_000),
                ("Conv", "cpu", 1_000_000),
                ("MaxPool", "cpu", 1_000_000),
                ("kernel call", "cpu", 1_000_000),
            ]
        );
    }

    #[test]
    fn the_table_gives_time_a_run_the_slowest_nodes_and_the_passes_that_changed_something() {
        let t = profile().table(2);
        assert!(
            t.starts_with("profile: 2 runs, 6.000 ms a run (5.500 ms in kernels"),
            "{t}"
        );
        assert!(
            t.contains("     2.500  45.5%       1.0  cpu          Conv+Relu\n"),
            "{t}"
        );
        assert!(
            t.contains("conv1 (fused Relu)") && t.contains("pool"),
            "{t}"
        );
        // Two slowest only.
        assert!(!t.contains("conv2"), "{t}");
        assert!(
            t.contains("ort_cpu#0 (5 nodes): its plugin does not record parts"),
            "{t}"
        );
        assert!(t.contains("fuse_chains          4 -> 3 steps"), "{t}");
        assert!(!t.contains("fold_constants"), "{t}");
    }
}
