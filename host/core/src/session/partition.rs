//! Partitioning: EPs in priority order claim groups of the nodes still unclaimed; the CPU EP,
//! always last, takes what is left. Every answer is validated, and a group that is not convex
//! (a path leaves it and comes back) is split so the fused graph stays acyclic.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::ir::{Graph, NodeId, ValueId};
use crate::plugin::AbiGraph;
use crate::plugin::{Declined, ProviderInstance};
use crate::value::ElementType;

/// A fused group: nodes one EP runs as one kernel, with the values crossing its border.
#[derive(Clone, Debug)]
pub struct Group {
    /// Index into the session's provider list.
    pub provider: usize,
    /// Node ids, in topological order.
    pub nodes: Vec<NodeId>,
    /// Values read from outside the group (initializers excluded), in first-use order.
    pub inputs: Vec<ValueId>,
    /// Values produced inside and read outside the group, or graph outputs.
    pub outputs: Vec<ValueId>,
}

/// Why EPs declined nodes, as they said (ABI 1.4): per node, (provider index, reason).
pub(crate) type Declines = std::collections::HashMap<NodeId, Vec<(usize, String)>>;

/// Asks provider `index` which of the `unclaimed` nodes it runs (groups, and reasons for the
/// nodes it declined): the query itself, or an answer recorded by the kernel cache.
pub(crate) type AskCapability<'a> =
    dyn FnMut(usize, &[u32]) -> Result<(Vec<Vec<usize>>, Declined)> + 'a;

/// Assigns every node to a provider; groups come back in an order they can run in, with the
/// reasons EPs gave for the nodes they declined.
pub(crate) fn partition(
    graph: &AbiGraph<'_>,
    providers: &[Arc<ProviderInstance>],
    ask: &mut AskCapability<'_>,
) -> Result<(Vec<Group>, Declines)> {
    let g = graph.graph;
    let mut owner: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut raw_groups: Vec<(usize, Vec<NodeId>)> = Vec::new();
    let mut declines = Declines::new();
    for (pi, p) in providers.iter().enumerate() {
        let minor = p.library.abi_version.minor;
        let unclaimed: Vec<u32> = (0..g.nodes.len())
            .filter(|&n| owner[n].is_none() && readable_by(g, n, minor))
            .map(|n| n as u32)
            .collect();
        if unclaimed.is_empty() {
            break;
        }
        let _span = tracing::debug_span!("capability", provider = p.name()).entered();
        let (groups, declined) = ask(pi, &unclaimed)?;
        for (n, reason) in declined {
            declines.entry(n).or_default().push((pi, reason));
        }
        for mut group in groups {
            group.sort_unstable();
            for &n in &group {
                owner[n] = Some(pi);
            }
            for piece in convex_pieces(g, &group) {
                raw_groups.push((pi, piece));
            }
        }
        tracing::debug!(
            provider = p.name(),
            claimed = owner.iter().filter(|o| **o == Some(pi)).count(),
            "capability answered"
        );
    }
    if let Some(n) = owner.iter().position(Option::is_none) {
        let node = &g.nodes[n];
        let asked: Vec<&str> = providers.iter().map(|p| p.name()).collect();
        let domain = if node.domain.is_empty() {
            "ai.onnx"
        } else {
            node.domain.as_str()
        };
        let opset = graph
            .model
            .opset(&node.domain)
            .map_or_else(|| "none".to_string(), |v| v.to_string());
        return Err(Error::Unsupported(format!(
            "no execution provider supports node `{}`: op `{}` (domain {domain}, opset {opset}); EPs asked: {}",
            node.display_name(n),
            node.op_type,
            asked.join(", ")
        )));
    }
    let groups: Vec<Group> = raw_groups
        .into_iter()
        .map(|(provider, nodes)| {
            let (inputs, outputs) = borders(g, &nodes);
            Group {
                provider,
                nodes,
                inputs,
                outputs,
            }
        })
        .collect();
    let ordered = match order_groups(g, groups) {
        Ok(ordered) => ordered,
        // Convex groups can still wait on each other (a → b in one pair of groups, b' → a' in
        // the other): split further by level, which always gives a runnable order.
        Err(groups) => {
            tracing::debug!(
                groups = groups.len(),
                "fused groups wait on each other; split by level"
            );
            order_groups(g, split_by_level(g, groups))
                .map_err(|_| Error::Run("internal: fused groups form a cycle".into()))?
        }
    };
    Ok((ordered, declines))
}

/// Ops whose inputs or outputs are sequences, maps or optionals whatever the model declares.
const NON_TENSOR_OPS: &[&str] = &[
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceAt",
    "SequenceInsert",
    "SequenceErase",
    "SequenceLength",
    "SequenceMap",
    "SplitToSequence",
    "ConcatFromSequence",
    "Optional",
    "OptionalHasElement",
    "OptionalGetElement",
    "ZipMap",
    "DictVectorizer",
    "CastMap",
];

/// Whether a plugin built for ABI minor version `minor` can read every value node `n` touches:
/// element types added in later minor versions (strings from 1.3), and sequences, maps and
/// optionals (from 1.3), are never shown to it as a node's values.
fn readable_by(g: &Graph, n: NodeId, minor: u32) -> bool {
    let node = &g.nodes[n];
    let values_minor = ElementType::String.since_abi_minor();
    if minor < values_minor && NON_TENSOR_OPS.contains(&node.op_type.as_str()) {
        return false;
    }
    // A control-flow node is readable only when its bodies are: the plugin runs them.
    let bodies_readable = node.attributes.iter().all(|a| match &a.value {
        crate::model::ir::AttributeValue::Graph(body) => {
            (0..body.nodes.len()).all(|b| readable_by(body, b, minor))
        }
        crate::model::ir::AttributeValue::Graphs(bodies) => bodies
            .iter()
            .all(|body| (0..body.nodes.len()).all(|b| readable_by(body, b, minor))),
        _ => true,
    });
    if !bodies_readable {
        return false;
    }
    node.all_inputs()
        .chain(node.outputs.iter().flatten().copied())
        .all(|v| {
            let ty = &g.values[v].ty;
            (minor >= values_minor || !ty.is_non_tensor())
                && ty
                    .innermost_elem_type()
                    .is_none_or(|t| t.since_abi_minor() <= minor)
        })
}

/// Splits every group by level: a node's level is the largest number of group changes on a
/// path from the graph inputs to it. An edge between two different groups raises the level, so
/// every edge between two pieces goes from a lower level to a higher one: the pieces form an
/// acyclic graph, and each is convex. One pass over the nodes in topological order.
fn split_by_level(g: &Graph, groups: Vec<Group>) -> Vec<Group> {
    let mut group_of = vec![usize::MAX; g.nodes.len()];
    for (gi, grp) in groups.iter().enumerate() {
        for &n in &grp.nodes {
            group_of[n] = gi;
        }
    }
    let mut level = vec![0usize; g.nodes.len()];
    for n in 0..g.nodes.len() {
        let mut l = 0;
        for v in g.nodes[n].all_inputs() {
            if let Some(p) = g.values[v].producer {
                l = l.max(level[p] + usize::from(group_of[p] != group_of[n]));
            }
        }
        level[n] = l;
    }
    let mut out = Vec::with_capacity(groups.len());
    for grp in groups {
        let mut by_level: std::collections::BTreeMap<usize, Vec<NodeId>> = Default::default();
        for &n in &grp.nodes {
            by_level.entry(level[n]).or_default().push(n);
        }
        for nodes in by_level.into_values() {
            let (inputs, outputs) = borders(g, &nodes);
            out.push(Group {
                provider: grp.provider,
                nodes,
                inputs,
                outputs,
            });
        }
    }
    out
}

/// Splits a group into convex pieces. A group is convex when no path leaves it and comes back;
/// fusing a non-convex group would make the fused graph cyclic.
///
/// Each node of the group gets a stage: the number of times a path from the group's earliest
/// nodes must leave the group and re-enter it to reach the node. Nodes of one stage can never
/// reach each other through outside nodes, so each stage is a convex piece. (Convex pieces of
/// different groups can still wait on each other; [`split_by_level`] handles that case.) One
/// pass over the nodes between the group's first and last node.
fn convex_pieces(g: &Graph, group: &[NodeId]) -> Vec<Vec<NodeId>> {
    let (Some(&first), Some(&last)) = (group.first(), group.last()) else {
        return Vec::new();
    };
    if group.len() == 1 {
        return vec![group.to_vec()];
    }
    let inside: HashSet<NodeId> = group.iter().copied().collect();
    // stage[n - first]: for group nodes, their stage; for outside nodes reached from the group,
    // the stage their successors in the group must at least have.
    let mut stage: Vec<Option<usize>> = vec![None; last - first + 1];
    for n in first..=last {
        let mut s: Option<usize> = None;
        for v in g.nodes[n].all_inputs() {
            let Some(p) = g.values[v].producer else {
                continue;
            };
            if p < first {
                continue;
            }
            let Some(ps) = stage[p - first] else { continue };
            // Leaving the group costs one stage when the edge goes group → outside.
            let ps = if inside.contains(&p) && !inside.contains(&n) {
                ps + 1
            } else {
                ps
            };
            s = Some(s.map_or(ps, |x| x.max(ps)));
        }
        stage[n - first] = if inside.contains(&n) {
            Some(s.unwrap_or(0))
        } else {
            s
        };
    }
    let mut pieces: Vec<Vec<NodeId>> = Vec::new();
    for &n in group {
        let k = stage[n - first].unwrap_or(0);
        if pieces.len() <= k {
            pieces.resize(k + 1, Vec::new());
        }
        pieces[k].push(n);
    }
    pieces.retain(|p| !p.is_empty());
    if pieces.len() > 1 {
        tracing::debug!(
            nodes = group.len(),
            pieces = pieces.len(),
            "group is not convex; split"
        );
    }
    pieces
}

fn borders(g: &Graph, nodes: &[NodeId]) -> (Vec<ValueId>, Vec<ValueId>) {
    let inside: HashSet<NodeId> = nodes.iter().copied().collect();
    let mut seen: HashSet<ValueId> = HashSet::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for &n in nodes {
        for v in g.nodes[n].all_inputs() {
            let val = &g.values[v];
            let produced_inside = val.producer.is_some_and(|p| inside.contains(&p));
            if !produced_inside && val.initializer.is_none() && seen.insert(v) {
                inputs.push(v);
            }
        }
        for &v in g.nodes[n].outputs.iter().flatten() {
            let val = &g.values[v];
            if val.is_graph_output || val.consumers.iter().any(|c| !inside.contains(c)) {
                outputs.push(v);
            }
        }
    }
    (inputs, outputs)
}

/// Orders groups so each runs after the groups producing its inputs; gives the groups back
/// unordered when they wait on each other.
fn order_groups(g: &Graph, groups: Vec<Group>) -> std::result::Result<Vec<Group>, Vec<Group>> {
    let mut group_of = vec![usize::MAX; g.nodes.len()];
    for (gi, grp) in groups.iter().enumerate() {
        for &n in &grp.nodes {
            group_of[n] = gi;
        }
    }
    let mut indegree = vec![0usize; groups.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
    for (gi, grp) in groups.iter().enumerate() {
        let mut deps = HashSet::new();
        for &v in &grp.inputs {
            if let Some(p) = g.values[v].producer {
                if group_of[p] != gi && deps.insert(group_of[p]) {
                    users[group_of[p]].push(gi);
                    indegree[gi] += 1;
                }
            }
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<(NodeId, usize)>> = groups
        .iter()
        .enumerate()
        .filter(|(gi, _)| indegree[*gi] == 0)
        .map(|(gi, grp)| std::cmp::Reverse((grp.nodes[0], gi)))
        .collect();
    let mut order = Vec::with_capacity(groups.len());
    while let Some(std::cmp::Reverse((_, gi))) = ready.pop() {
        order.push(gi);
        for &u in &users[gi] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push(std::cmp::Reverse((groups[u].nodes[0], u)));
            }
        }
    }
    if order.len() != groups.len() {
        return Err(groups);
    }
    let mut slots: Vec<Option<Group>> = groups.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .filter_map(|gi| slots[gi].take())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::onnx::{proto, testing};

    /// A graph from (op, inputs, output) triples (nodes named after their output); `x` is the
    /// only graph input.
    fn graph(nodes: &[(&str, &[&str], &str)], output: &str) -> Graph {
        let nodes = nodes
            .iter()
            .map(|(op, ins, out)| proto::NodeProto {
                name: Some(out.to_string()),
                ..testing::node(op, ins, &[out])
            })
            .collect();
        testing::graph(&testing::model(nodes, &["x"], &[output]))
    }

    fn id(g: &Graph, name: &str) -> NodeId {
        g.nodes.iter().position(|n| n.name == name).unwrap()
    }

    #[test]
    fn a_path_through_another_ep_splits_the_group() {
        // a → b → c → d, with b elsewhere: {a, c, d} would be a cycle once fused.
        let g = graph(
            &[
                ("Relu", &["x"], "a"),
                ("Neg", &["a"], "b"),
                ("Relu", &["b"], "c"),
                ("Relu", &["c"], "d"),
            ],
            "d",
        );
        let group = vec![id(&g, "a"), id(&g, "c"), id(&g, "d")];
        assert_eq!(
            convex_pieces(&g, &group),
            vec![vec![id(&g, "a")], vec![id(&g, "c"), id(&g, "d")]]
        );
    }

    #[test]
    fn a_diamond_keeps_what_it_can_together() {
        // a feeds b (elsewhere) and c; d reads b and c. {a, c} stays fused, d must follow b.
        let g = graph(
            &[
                ("Relu", &["x"], "a"),
                ("Neg", &["a"], "b"),
                ("Relu", &["a"], "c"),
                ("Add", &["b", "c"], "d"),
            ],
            "d",
        );
        let group = vec![id(&g, "a"), id(&g, "c"), id(&g, "d")];
        let mut want = vec![vec![id(&g, "a"), id(&g, "c")], vec![id(&g, "d")]];
        want[0].sort_unstable();
        assert_eq!(convex_pieces(&g, &group), want);
    }

    #[test]
    fn a_convex_group_stays_whole() {
        let g = graph(
            &[
                ("Relu", &["x"], "a"),
                ("Relu", &["a"], "b"),
                ("Neg", &["x"], "c"),
                ("Add", &["b", "c"], "d"),
            ],
            "d",
        );
        let group = vec![id(&g, "a"), id(&g, "b"), id(&g, "d")];
        let mut sorted = group.clone();
        sorted.sort_unstable();
        assert_eq!(convex_pieces(&g, &sorted), vec![sorted.clone()]);
    }
}
