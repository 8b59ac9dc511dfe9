//! The placement report: which EP runs each node, the fused groups and their kernels, the copies
//! between memory spaces, and the nodes that fell back to the CPU EP and why. Data first; a
//! table and a Graphviz picture are views of it; the types serialize with serde (the C API
//! hands the report out as JSON).

use std::fmt::Write as _;

/// Where one node runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodePlacement {
    pub id: usize,
    pub name: String,
    pub op_type: String,
    pub provider: String,
    /// Index into [`PlacementReport::groups`].
    pub group: usize,
}

/// A fused group: the nodes one compiled kernel runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GroupPlacement {
    pub id: usize,
    pub provider: String,
    /// Node ids, in topological order.
    pub nodes: Vec<usize>,
    /// The kernel's name: `<provider>#<index among that provider's kernels>`.
    pub kernel: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

/// A copy the plan inserts where a value crosses memory spaces.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CopyPlacement {
    pub value: String,
    /// `host` or the name of the device EP whose memory it is.
    pub from: String,
    pub to: String,
    /// The group it feeds (`None`: a graph output brought back to the host at the end).
    pub before_group: Option<usize>,
    /// Bytes per run when the value's shape is static.
    pub bytes: Option<u64>,
    /// Bytes the copy moved in the most recent run (`None` before the first run).
    pub last_run_bytes: Option<u64>,
}

/// A node that ended on the CPU EP although other EPs were requested.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Fallback {
    pub node: usize,
    pub name: String,
    pub op_type: String,
    pub reason: String,
}

/// A requested EP that took no part, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SkippedProvider {
    pub name: String,
    pub reason: String,
}

/// What the kernel cache did for one kernel of an EP that can store its kernels (ABI 1.6).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KernelCacheUse {
    /// Index into [`PlacementReport::groups`].
    pub group: usize,
    /// The kernel's name, as in [`GroupPlacement::kernel`].
    pub kernel: String,
    /// Whether the kernel was rebuilt from the cache (not compiled).
    pub loaded: bool,
    /// Whether the kernel is in the cache after this session (rebuilt from it, or stored).
    pub in_cache: bool,
    /// What happened: `loaded (...)`, `compiled and stored (...)`, or why it was compiled and
    /// what went wrong (a damaged entry, an entry the EP refused, a folder it could not write).
    pub note: String,
}

impl KernelCacheUse {
    pub(crate) fn new(loaded: bool, in_cache: bool, note: String) -> Self {
        KernelCacheUse {
            group: 0,
            kernel: String::new(),
            loaded,
            in_cache,
            note,
        }
    }
}

/// Everything about where a session runs what.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlacementReport {
    pub nodes: Vec<NodePlacement>,
    pub groups: Vec<GroupPlacement>,
    pub copies: Vec<CopyPlacement>,
    pub fallbacks: Vec<Fallback>,
    pub skipped_providers: Vec<SkippedProvider>,
    /// EPs of the session running in a child process ([`crate::plugin::isolate`]).
    pub isolated_providers: Vec<String>,
    /// (EP, device) for the EPs the session put on a chosen device (`cuda:1`).
    pub devices: Vec<(String, String)>,
    /// What a selection policy chose and why, when the session used one.
    pub selection: Option<Selection>,
    /// What the compiled-kernel cache did, per kernel of an EP that can store its kernels.
    pub kernel_cache: Vec<KernelCacheUse>,
    /// EPs whose capability answers were replayed from the kernel cache (recorded by an earlier
    /// session of the same model and options, with every one of their kernels stored), not asked.
    pub replayed_capabilities: Vec<String>,
}

const PALETTE: [&str; 8] = [
    "#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#f9c74f", "#a8dadc", "#e9c46a",
];

impl PlacementReport {
    /// Nodes per EP, in order of first appearance.
    pub fn node_counts(&self) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for n in &self.nodes {
            match counts.iter_mut().find(|(p, _)| *p == n.provider) {
                Some((_, c)) => *c += 1,
                None => counts.push((n.provider.clone(), 1)),
            }
        }
        counts
    }

    /// A plain-text table: one line per node, then copies, fallbacks and skipped EPs.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let w_name = self
            .nodes
            .iter()
            .map(|n| n.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let w_op = self
            .nodes
            .iter()
            .map(|n| n.op_type.len())
            .max()
            .unwrap_or(2)
            .max(2);
        let w_ep = self
            .nodes
            .iter()
            .map(|n| n.provider.len())
            .max()
            .unwrap_or(2)
            .max(2);
        let _ = writeln!(
            s,
            "{:>5}  {:<w_name$}  {:<w_op$}  {:<w_ep$}  kernel",
            "node", "name", "op", "EP"
        );
        for n in &self.nodes {
            let kernel = self.groups.get(n.group).map_or("", |g| g.kernel.as_str());
            let _ = writeln!(
                s,
                "{:>5}  {:<w_name$}  {:<w_op$}  {:<w_ep$}  {kernel}",
                n.id, n.name, n.op_type, n.provider
            );
        }
        let counts: Vec<String> = self
            .node_counts()
            .iter()
            .map(|(p, c)| format!("{p}: {c}"))
            .collect();
        let _ = writeln!(
            s,
            "\n{} nodes in {} kernels ({})",
            self.nodes.len(),
            self.groups.len(),
            counts.join(", ")
        );
        if self.copies.is_empty() {
            let _ = writeln!(s, "no copies between memory spaces");
        } else {
            let _ = writeln!(s, "\n{} copies between memory spaces:", self.copies.len());
            for c in &self.copies {
                let bytes = match (c.last_run_bytes, c.bytes) {
                    (Some(b), _) | (None, Some(b)) => format!("{b} bytes per run"),
                    (None, None) => "size known at run time".to_string(),
                };
                let into = c.before_group.map_or_else(
                    || "graph output".to_string(),
                    |g| format!("kernel {}", self.groups[g].kernel),
                );
                let _ = writeln!(
                    s,
                    "  {}: {} → {} (for {into}), {bytes}",
                    c.value, c.from, c.to
                );
            }
        }
        if !self.fallbacks.is_empty() {
            let _ = writeln!(
                s,
                "\n{} nodes fell back to the CPU EP:",
                self.fallbacks.len()
            );
            for f in &self.fallbacks {
                let _ = writeln!(s, "  {} ({}): {}", f.name, f.op_type, f.reason);
            }
        }
        for p in &self.skipped_providers {
            let _ = writeln!(s, "\nEP {} was skipped: {}", p.name, p.reason);
        }
        if let Some(sel) = &self.selection {
            let chosen = if sel.chosen.is_empty() {
                "nothing".to_string()
            } else {
                sel.chosen.join(", ")
            };
            let _ = writeln!(s, "\nselection policy {} chose {chosen}:", sel.policy);
            for r in &sel.reasons {
                let _ = writeln!(s, "  {r}");
            }
        }
        for (p, d) in &self.devices {
            let _ = writeln!(s, "\nEP {p} runs on device {d}");
        }
        for p in &self.isolated_providers {
            let _ = writeln!(s, "\nEP {p} runs isolated, in a child process");
        }
        if !self.kernel_cache.is_empty() {
            let _ = writeln!(s, "\nkernel cache:");
            for u in &self.kernel_cache {
                let _ = writeln!(s, "  {}: {}", u.kernel, u.note);
            }
            for p in &self.replayed_capabilities {
                let _ = writeln!(
                    s,
                    "  {p}: its nodes as an earlier session's query recorded them"
                );
            }
        }
        // Names come from the model and the plugins: no escape sequence reaches a terminal.
        crate::printable_lines(&s).into_owned()
    }

    /// A Graphviz picture: nodes coloured by EP, fused groups boxed, copy edges dashed red and
    /// labelled with their bytes.
    pub fn to_dot(&self, edges: &[(usize, usize, String)]) -> String {
        let providers: Vec<String> = self.node_counts().into_iter().map(|(p, _)| p).collect();
        let colour =
            |p: &str| PALETTE[providers.iter().position(|x| x == p).unwrap_or(0) % PALETTE.len()];
        let mut s = String::from(
            "digraph placement {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\"];\n",
        );
        for g in &self.groups {
            let _ = writeln!(
                s,
                "  subgraph cluster_{} {{\n    label=\"{}\"; style=dashed; color=\"#888888\";",
                g.id,
                esc(&g.kernel)
            );
            for &n in &g.nodes {
                if let Some(node) = self.nodes.get(n) {
                    // A node that fell back carries why, as a tooltip (SVG) and a dashed border.
                    let why =
                        self.fallbacks
                            .iter()
                            .find(|f| f.node == n)
                            .map_or_else(String::new, |f| {
                                format!(
                                    ", tooltip=\"{}\", penwidth=2, color=\"#cc3333\"",
                                    esc(&f.reason)
                                )
                            });
                    let _ = writeln!(
                        s,
                        "    n{} [label=\"{}\\n{}\\n[{}]\", fillcolor=\"{}\"{why}];",
                        n,
                        esc(&node.name),
                        esc(&node.op_type),
                        esc(&node.provider),
                        colour(&node.provider)
                    );
                }
            }
            s.push_str("  }\n");
        }
        for (from, to, value) in edges {
            let crossing = self
                .nodes
                .get(*from)
                .zip(self.nodes.get(*to))
                .is_some_and(|(a, b)| a.group != b.group);
            let copy = self.copies.iter().find(|c| {
                c.value == *value && c.before_group == self.nodes.get(*to).map(|n| n.group)
            });
            match copy {
                Some(c) => {
                    let bytes = c
                        .last_run_bytes
                        .or(c.bytes)
                        .map_or_else(String::new, |b| format!(", {b} B"));
                    let _ = writeln!(
                        s,
                        "  n{from} -> n{to} [label=\"{} ({} → {}{bytes})\", color=red, style=dashed, fontcolor=red];",
                        esc(value),
                        esc(&c.from),
                        esc(&c.to)
                    );
                }
                None if crossing => {
                    let _ = writeln!(
                        s,
                        "  n{from} -> n{to} [label=\"{}\", color=\"#444444\"];",
                        esc(value)
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "  n{from} -> n{to} [label=\"{}\", color=\"#aaaaaa\"];",
                        esc(value)
                    );
                }
            }
        }
        s.push_str("  subgraph cluster_legend {\n    label=\"EPs\"; style=solid;\n");
        for (i, p) in providers.iter().enumerate() {
            let _ = writeln!(
                s,
                "    legend{i} [label=\"{}\", fillcolor=\"{}\"];",
                esc(p),
                colour(p)
            );
        }
        s.push_str("  }\n}\n");
        s
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// What a policy chose, and why, for the placement report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Selection {
    pub policy: String,
    /// The EPs it asked for, in order (`adversarial:0`, or the EP's name for a custom policy).
    pub chosen: Vec<String>,
    /// One line per device considered: chosen, passed over, or unusable, and why.
    pub reasons: Vec<String>,
}
