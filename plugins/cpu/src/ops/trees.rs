//! Tree ensembles: TreeEnsembleRegressor, TreeEnsembleClassifier (ai.onnx.ml 1–3) and
//! TreeEnsemble (ai.onnx.ml 5).
//!
//! Every form is compiled once, when the kernel is built, into one flat [`Forest`]: branch nodes
//! in one array (feature, threshold, comparison, children as indices), leaves as ranges of one
//! array of (target, weight) pairs. Evaluating a row walks each tree with plain index loads and
//! allocates nothing.

use std::collections::HashMap;

use epx_plugin_api::ElementType;

use super::ml::{PostTransform, add_ml, class_labels, floats_attr, logistic, rows_cols};
use super::one;
use super::util::input;
use crate::bail;
use crate::kernel::{AttrValue, NodeDef, OpKernel, OpResult, Registry, kernel};
use crate::tensor::Tensor;

pub fn register(reg: &mut Registry) {
    add_ml(reg, "TreeEnsembleRegressor", 1, build_regressor);
    add_ml(reg, "TreeEnsembleClassifier", 1, build_classifier);
    add_ml(reg, "TreeEnsemble", 5, build_tree_ensemble);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Member,
}

/// A child: a branch index, or (high bit set) a leaf index.
const LEAF: u32 = 1 << 31;

#[derive(Clone, Copy, Debug)]
struct Branch {
    feature: u32,
    cmp: Cmp,
    missing_true: bool,
    value: f64,
    /// For `Member`: the range of `Forest::members` holding the set.
    members: (u32, u32),
    if_true: u32,
    if_false: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aggregate {
    Sum,
    Average,
    Min,
    Max,
}

impl Aggregate {
    fn parse(n: &NodeDef, s: &str) -> OpResult<Self> {
        Ok(match s {
            "SUM" => Aggregate::Sum,
            "AVERAGE" => Aggregate::Average,
            "MIN" => Aggregate::Min,
            "MAX" => Aggregate::Max,
            other => {
                return Err(n.error(format_args!(
                    "aggregate_function `{other}` is not one of SUM, AVERAGE, MIN, MAX"
                )));
            }
        })
    }
}

#[derive(Debug, Default)]
struct Forest {
    branches: Vec<Branch>,
    /// Per leaf, the range of `weights` it adds.
    leaves: Vec<(u32, u32)>,
    /// (target, weight) pairs.
    weights: Vec<(u32, f64)>,
    members: Vec<f64>,
    roots: Vec<u32>,
    targets: usize,
    max_feature: usize,
}

impl Forest {
    /// Checks that every walk from a root ends at a leaf: children in range, and no branch
    /// reachable from itself (a hostile model could otherwise make evaluation loop forever).
    fn validate(&self, n: &NodeDef) -> OpResult<()> {
        let child_ok = |c: u32| {
            if c & LEAF != 0 {
                ((c & !LEAF) as usize) < self.leaves.len()
            } else {
                (c as usize) < self.branches.len()
            }
        };
        // 0: not seen, 1: on the current path, 2: done.
        let mut state = vec![0u8; self.branches.len()];
        for &root in &self.roots {
            if !child_ok(root) {
                return Err(n.error("a tree root is out of range"));
            }
            if root & LEAF != 0 || state[root as usize] == 2 {
                continue;
            }
            let mut stack = vec![(root, false)];
            while let Some((at, children_done)) = stack.pop() {
                let i = at as usize;
                if children_done {
                    state[i] = 2;
                    continue;
                }
                if state[i] == 2 {
                    continue;
                }
                state[i] = 1;
                stack.push((at, true));
                let b = &self.branches[i];
                for c in [b.if_true, b.if_false] {
                    if !child_ok(c) {
                        return Err(n.error(format_args!("branch {i} has a child out of range")));
                    }
                    if c & LEAF == 0 {
                        match state[c as usize] {
                            1 => {
                                return Err(n.error(format_args!(
                                    "the trees have a cycle through branch {c}"
                                )));
                            }
                            0 => stack.push((c, false)),
                            _ => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds the weights of the leaf `x` reaches in every tree to `acc` (one slot per target,
    /// with a flag saying whether any leaf wrote it).
    fn evaluate(&self, x: &[f64], agg: Aggregate, acc: &mut [(f64, bool)]) {
        acc.fill((0.0, false));
        for &root in &self.roots {
            let mut at = root;
            while at & LEAF == 0 {
                let b = &self.branches[at as usize];
                let v = x[b.feature as usize];
                let go_true = (b.missing_true && v.is_nan())
                    || match b.cmp {
                        Cmp::Leq => v <= b.value,
                        Cmp::Lt => v < b.value,
                        Cmp::Gte => v >= b.value,
                        Cmp::Gt => v > b.value,
                        Cmp::Eq => v == b.value,
                        Cmp::Neq => v != b.value,
                        Cmp::Member => {
                            self.members[b.members.0 as usize..b.members.1 as usize].contains(&v)
                        }
                    };
                at = if go_true { b.if_true } else { b.if_false };
            }
            let (start, end) = self.leaves[(at & !LEAF) as usize];
            for &(t, w) in &self.weights[start as usize..end as usize] {
                let slot = &mut acc[t as usize];
                slot.0 = if !slot.1 {
                    w
                } else {
                    match agg {
                        Aggregate::Sum | Aggregate::Average => slot.0 + w,
                        Aggregate::Min => slot.0.min(w),
                        Aggregate::Max => slot.0.max(w),
                    }
                };
                slot.1 = true;
            }
        }
    }

    /// Scores `[rows, targets]` of every row: aggregated, then `base` added.
    fn scores(
        &self,
        op: &str,
        x: &[f64],
        rows: usize,
        cols: usize,
        agg: Aggregate,
        base: &[f64],
    ) -> OpResult<Vec<f32>> {
        if cols <= self.max_feature && !self.branches.is_empty() {
            bail!(
                "{op}: the trees read feature {}, but the input has {cols} features",
                self.max_feature
            );
        }
        let targets = self.targets;
        let mut out = vec![0f32; rows * targets];
        if targets == 0 {
            return Ok(out);
        }
        let trees = self.roots.len().max(1) as f64;
        // Runs of rows shared across the intra-op pool, each with its own accumulators.
        let run = crate::par::chunk_len(rows, 16, 1);
        crate::par::for_each_chunk(&mut out, run * targets, |i, o| {
            let mut acc = vec![(0.0, false); targets];
            for (k, orow) in o.chunks_exact_mut(targets).enumerate() {
                let r = i * run + k;
                self.evaluate(&x[r * cols..(r + 1) * cols], agg, &mut acc);
                for (t, (&(v, _), d)) in acc.iter().zip(orow).enumerate() {
                    let v = if agg == Aggregate::Average {
                        v / trees
                    } else {
                        v
                    };
                    *d = (v + base.get(t).copied().unwrap_or(0.0)) as f32;
                }
            }
        });
        Ok(out)
    }
}

fn strings_attr(n: &NodeDef, name: &str) -> OpResult<Vec<String>> {
    match n.attributes.get(name) {
        Some(AttrValue::Strings(v)) => Ok(v
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()),
        None => Ok(Vec::new()),
        Some(_) => Err(n.error(format_args!("attribute `{name}` must be a list of strings"))),
    }
}

/// A float list given as floats or as a tensor (`<name>_as_tensor`, any float type).
fn values_attr(n: &NodeDef, name: &str) -> OpResult<Vec<f64>> {
    if let Some(AttrValue::Tensor(t)) = n.attributes.get(&format!("{name}_as_tensor")) {
        return Ok(t.view().to_f64_vec());
    }
    Ok(floats_attr(n, name)?.into_iter().map(f64::from).collect())
}

fn ints(n: &NodeDef, name: &str) -> OpResult<Vec<i64>> {
    Ok(n.attr_ints(name)?.unwrap_or_default())
}

/// Checks that each list of `lists` has `count` entries, one per node.
fn one_per_node(n: &NodeDef, count: usize, lists: &[(&str, usize)]) -> OpResult<()> {
    match lists.iter().find(|(_, len)| *len != count) {
        Some((name, len)) => {
            Err(n.error(format_args!("{name} has {len} entries for {count} nodes")))
        }
        None => Ok(()),
    }
}

fn to_u32(n: &NodeDef, what: &str, v: i64) -> OpResult<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v < LEAF)
        .ok_or_else(|| n.error(format_args!("{what} {v} is out of range")))
}

/// Builds a forest from the attributes of TreeEnsembleRegressor / TreeEnsembleClassifier;
/// `prefix` is `target` or `class`.
fn legacy_forest(n: &NodeDef, prefix: &str, targets: usize) -> OpResult<Forest> {
    let tree_ids = ints(n, "nodes_treeids")?;
    let node_ids = ints(n, "nodes_nodeids")?;
    let features = ints(n, "nodes_featureids")?;
    let values = values_attr(n, "nodes_values")?;
    let modes = strings_attr(n, "nodes_modes")?;
    let true_ids = ints(n, "nodes_truenodeids")?;
    let false_ids = ints(n, "nodes_falsenodeids")?;
    let missing = ints(n, "nodes_missing_value_tracks_true")?;
    let count = tree_ids.len();
    one_per_node(
        n,
        count,
        &[
            ("nodes_nodeids", node_ids.len()),
            ("nodes_featureids", features.len()),
            ("nodes_modes", modes.len()),
            ("nodes_truenodeids", true_ids.len()),
            ("nodes_falsenodeids", false_ids.len()),
        ],
    )?;
    if (!values.is_empty() && values.len() != count)
        || (!missing.is_empty() && missing.len() != count)
    {
        return Err(n.error(
            "nodes_values / nodes_missing_value_tracks_true do not have one entry per node",
        ));
    }
    // Each node becomes a branch or a leaf, numbered in order.
    let mut slot: HashMap<(i64, i64), u32> = HashMap::with_capacity(count);
    let mut forest = Forest {
        targets,
        ..Forest::default()
    };
    let mut leaf_weights: Vec<Vec<(u32, f64)>> = Vec::new();
    for i in 0..count {
        let key = (tree_ids[i], node_ids[i]);
        let id = if modes[i] == "LEAF" {
            leaf_weights.push(Vec::new());
            LEAF | (leaf_weights.len() - 1) as u32
        } else {
            forest.branches.len() as u32
        };
        if modes[i] != "LEAF" {
            let cmp = match modes[i].as_str() {
                "BRANCH_LEQ" => Cmp::Leq,
                "BRANCH_LT" => Cmp::Lt,
                "BRANCH_GTE" => Cmp::Gte,
                "BRANCH_GT" => Cmp::Gt,
                "BRANCH_EQ" => Cmp::Eq,
                "BRANCH_NEQ" => Cmp::Neq,
                other => return Err(n.error(format_args!("node mode `{other}` is not known"))),
            };
            let feature = to_u32(n, "feature id", features[i])?;
            forest.max_feature = forest.max_feature.max(feature as usize);
            forest.branches.push(Branch {
                feature,
                cmp,
                missing_true: missing.get(i).is_some_and(|&m| m != 0),
                value: values.get(i).copied().unwrap_or(0.0),
                members: (0, 0),
                if_true: 0,
                if_false: 0,
            });
        }
        if slot.insert(key, id).is_some() {
            return Err(n.error(format_args!(
                "node {} of tree {} is listed twice",
                key.1, key.0
            )));
        }
        // A tree's first node is its root.
        if i == 0 || tree_ids[i] != tree_ids[i - 1] {
            forest.roots.push(id);
        }
    }
    // Children.
    let mut b = 0usize;
    for i in 0..count {
        if modes[i] == "LEAF" {
            continue;
        }
        let child = |id: i64| {
            slot.get(&(tree_ids[i], id)).copied().ok_or_else(|| {
                n.error(format_args!(
                    "node {} of tree {} points at node {id}, which the tree does not have",
                    node_ids[i], tree_ids[i]
                ))
            })
        };
        forest.branches[b].if_true = child(true_ids[i])?;
        forest.branches[b].if_false = child(false_ids[i])?;
        b += 1;
    }
    // Leaf weights.
    let w_trees = ints(n, &format!("{prefix}_treeids"))?;
    let w_nodes = ints(n, &format!("{prefix}_nodeids"))?;
    let w_ids = ints(n, &format!("{prefix}_ids"))?;
    let w_values = values_attr(n, &format!("{prefix}_weights"))?;
    if w_nodes.len() != w_trees.len()
        || w_ids.len() != w_trees.len()
        || w_values.len() != w_trees.len()
    {
        return Err(n.error(format_args!(
            "the {prefix}_treeids, _nodeids, _ids and _weights lists differ in length"
        )));
    }
    for i in 0..w_trees.len() {
        let leaf = slot
            .get(&(w_trees[i], w_nodes[i]))
            .copied()
            .filter(|id| id & LEAF != 0)
            .ok_or_else(|| {
                n.error(format_args!(
                    "a weight names node {} of tree {}, which is not a leaf",
                    w_nodes[i], w_trees[i]
                ))
            })?;
        let target = usize::try_from(w_ids[i])
            .ok()
            .filter(|&t| t < targets)
            .ok_or_else(|| {
                n.error(format_args!(
                    "{prefix} id {} is not below {targets}",
                    w_ids[i]
                ))
            })?;
        leaf_weights[(leaf & !LEAF) as usize].push((target as u32, w_values[i]));
    }
    for w in leaf_weights {
        let start = forest.weights.len() as u32;
        forest.weights.extend(w);
        forest.leaves.push((start, forest.weights.len() as u32));
    }
    forest.validate(n)?;
    Ok(forest)
}

fn build_regressor(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let targets = n.attr_count_or("n_targets", 1)?;
    let forest = legacy_forest(n, "target", targets)?;
    let agg = Aggregate::parse(n, &n.attr_string_or("aggregate_function", "SUM")?)?;
    let base = values_attr(n, "base_values")?;
    let post = PostTransform::parse(n)?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        let mut s = forest.scores(&op, &x.to_f64_vec(), rows, cols, agg, &base)?;
        for row in s.chunks_mut(targets) {
            post.apply(row);
        }
        one(Tensor::from_vec(&[rows, targets], s))
    }))
}

fn build_classifier(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let labels = class_labels(n, "classlabels_int64s")?;
    let classes = labels.len();
    let forest = legacy_forest(n, "class", classes)?;
    let base = values_attr(n, "base_values")?;
    let post = PostTransform::parse(n)?;
    // Two labels, weights for one class only: the weights score the second (positive) label.
    let class_ids: std::collections::BTreeSet<u32> = forest.weights.iter().map(|w| w.0).collect();
    let binary = classes == 2 && class_ids.len() == 1;
    let all_positive = forest.weights.iter().all(|w| w.1 >= 0.0);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        let raw = forest.scores(&op, &x.to_f64_vec(), rows, cols, Aggregate::Sum, &base)?;
        let mut out_labels = Vec::with_capacity(rows);
        let mut out = Vec::with_capacity(rows * classes);
        for row in raw.chunks(classes.max(1)) {
            if binary {
                let id = *class_ids.iter().next().unwrap_or(&0) as usize;
                let s = row[id];
                let positive = if all_positive && post == PostTransform::None {
                    s > 0.5
                } else {
                    s > 0.0
                };
                out_labels.push(usize::from(positive));
                let pair = match post {
                    PostTransform::None if all_positive => [1.0 - s, s],
                    PostTransform::None => [-s, s],
                    PostTransform::Logistic => [logistic(-s), logistic(s)],
                    _ => {
                        let mut pair = [-s, s];
                        post.apply(&mut pair);
                        pair
                    }
                };
                out.extend(pair);
                continue;
            }
            let best = row
                .iter()
                .enumerate()
                .fold(0, |b, (i, &v)| if v > row[b] { i } else { b });
            out_labels.push(best);
            let mut r = row.to_vec();
            post.apply(&mut r);
            out.extend(r);
        }
        Ok(vec![
            labels.tensor(&out_labels)?,
            Tensor::from_vec(&[rows, classes], out)?,
        ])
    }))
}

/// TreeEnsemble (opset 5): nodes and leaves in separate arrays, modes as a uint8 tensor.
fn build_tree_ensemble(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let tensor = |name: &str| -> OpResult<Vec<f64>> {
        match n.attributes.get(name) {
            Some(AttrValue::Tensor(t)) => Ok(t.view().to_f64_vec()),
            None => Ok(Vec::new()),
            Some(_) => Err(n.error(format_args!("attribute `{name}` must be a tensor"))),
        }
    };
    let splits = tensor("nodes_splits")?;
    let modes = tensor("nodes_modes")?;
    let leaf_w = tensor("leaf_weights")?;
    let members = tensor("membership_values")?;
    let features = ints(n, "nodes_featureids")?;
    let true_ids = ints(n, "nodes_truenodeids")?;
    let false_ids = ints(n, "nodes_falsenodeids")?;
    let true_leaf = ints(n, "nodes_trueleafs")?;
    let false_leaf = ints(n, "nodes_falseleafs")?;
    let missing = ints(n, "nodes_missing_value_tracks_true")?;
    let leaf_targets = ints(n, "leaf_targetids")?;
    let roots = ints(n, "tree_roots")?;
    let targets = n.req_count("n_targets")?;
    let count = features.len();
    one_per_node(
        n,
        count,
        &[
            ("nodes_splits", splits.len()),
            ("nodes_modes", modes.len()),
            ("nodes_truenodeids", true_ids.len()),
            ("nodes_falsenodeids", false_ids.len()),
            ("nodes_trueleafs", true_leaf.len()),
            ("nodes_falseleafs", false_leaf.len()),
        ],
    )?;
    if leaf_targets.len() != leaf_w.len() {
        return Err(n.error("leaf_targetids and leaf_weights differ in length"));
    }
    let mut forest = Forest {
        targets,
        ..Forest::default()
    };
    forest.members = members.clone();
    let mut member_at = 0usize;
    for i in 0..count {
        let cmp = match modes[i] as i64 {
            0 => Cmp::Leq,
            1 => Cmp::Lt,
            2 => Cmp::Gte,
            3 => Cmp::Gt,
            4 => Cmp::Eq,
            5 => Cmp::Neq,
            6 => Cmp::Member,
            m => return Err(n.error(format_args!("node mode {m} is not known"))),
        };
        let mut range = (0, 0);
        if cmp == Cmp::Member {
            // Each set ends with a NaN.
            let start = member_at;
            while member_at < members.len() && !members[member_at].is_nan() {
                member_at += 1;
            }
            if member_at >= members.len() {
                return Err(
                    n.error("membership_values has fewer NaN-ended sets than BRANCH_MEMBER nodes")
                );
            }
            range = (start as u32, member_at as u32);
            member_at += 1;
        }
        let child = |id: i64, leaf: i64| -> OpResult<u32> {
            if leaf != 0 {
                usize::try_from(id)
                    .ok()
                    .filter(|&l| l < leaf_w.len())
                    .map(|l| LEAF | l as u32)
                    .ok_or_else(|| n.error(format_args!("leaf {id} is out of range")))
            } else {
                usize::try_from(id)
                    .ok()
                    .filter(|&b| b < count)
                    .map(|b| b as u32)
                    .ok_or_else(|| n.error(format_args!("node {id} is out of range")))
            }
        };
        let feature = to_u32(n, "feature id", features[i])?;
        forest.max_feature = forest.max_feature.max(feature as usize);
        forest.branches.push(Branch {
            feature,
            cmp,
            missing_true: missing.get(i).is_some_and(|&m| m != 0),
            value: splits[i],
            members: range,
            if_true: child(true_ids[i], true_leaf[i])?,
            if_false: child(false_ids[i], false_leaf[i])?,
        });
    }
    for (i, (&t, &w)) in leaf_targets.iter().zip(&leaf_w).enumerate() {
        let t = usize::try_from(t)
            .ok()
            .filter(|&t| t < targets)
            .ok_or_else(|| n.error(format_args!("leaf {i} has target {t}, not below {targets}")))?;
        forest.weights.push((t as u32, w));
        forest.leaves.push((i as u32, i as u32 + 1));
    }
    for &r in &roots {
        let r = usize::try_from(r)
            .ok()
            .filter(|&r| r < count)
            .ok_or_else(|| n.error(format_args!("tree root {r} is out of range")))?;
        // A root whose both branches go to the same leaf is that leaf.
        let b = forest.branches[r];
        let root = if b.if_true == b.if_false && b.if_true & LEAF != 0 {
            b.if_true
        } else {
            r as u32
        };
        forest.roots.push(root);
    }
    forest.validate(n)?;
    let agg = match n.attr_int_or("aggregate_function", 1)? {
        0 => Aggregate::Average,
        1 => Aggregate::Sum,
        2 => Aggregate::Min,
        3 => Aggregate::Max,
        a => return Err(n.error(format_args!("aggregate_function {a} is not 0-3"))),
    };
    let post = match n.attr_int_or("post_transform", 0)? {
        0 => "NONE",
        1 => "SOFTMAX",
        2 => "LOGISTIC",
        3 => "SOFTMAX_ZERO",
        4 => "PROBIT",
        p => return Err(n.error(format_args!("post_transform {p} is not 0-4"))),
    };
    let post = PostTransform::from_name(n, post)?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        let mut s = forest.scores(&op, &x.to_f64_vec(), rows, cols, agg, &[])?;
        for row in s.chunks_mut(targets) {
            post.apply(row);
        }
        let t = Tensor::from_vec(&[rows, targets], s)?;
        match x.elem_type() {
            ElementType::Float => one(Ok(t)),
            ty => one(t.view().cast(ty)),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regressor(true_ids: Vec<i64>) -> NodeDef {
        let mut n = NodeDef::new("TreeEnsembleRegressor", 3);
        n.domain = super::super::ml::ML.into();
        let ints = |v: Vec<i64>| AttrValue::Ints(v);
        let modes = AttrValue::Strings(vec![
            b"BRANCH_LEQ".to_vec(),
            b"LEAF".to_vec(),
            b"LEAF".to_vec(),
        ]);
        n.with_attr("nodes_treeids", ints(vec![0, 0, 0]))
            .with_attr("nodes_nodeids", ints(vec![0, 1, 2]))
            .with_attr("nodes_featureids", ints(vec![0, 0, 0]))
            .with_attr("nodes_values", AttrValue::Floats(vec![0.5, 0.0, 0.0]))
            .with_attr("nodes_modes", modes)
            .with_attr("nodes_truenodeids", ints(true_ids))
            .with_attr("nodes_falsenodeids", ints(vec![2, 0, 0]))
            .with_attr("target_treeids", ints(vec![0, 0]))
            .with_attr("target_nodeids", ints(vec![1, 2]))
            .with_attr("target_ids", ints(vec![0, 0]))
            .with_attr("target_weights", AttrValue::Floats(vec![-1.0, 1.0]))
            .with_io(1, 1)
    }

    #[test]
    fn a_tree_is_walked_and_a_cyclic_one_refused() {
        let k = crate::kernel::Registry::with_all_ops()
            .build(&regressor(vec![1, 0, 0]))
            .unwrap();
        let x = Tensor::from_vec(&[2, 1], vec![0.25f32, 0.75]).unwrap();
        let y = k.run(&[Some(x.view())]).unwrap();
        assert_eq!(y[0], Tensor::from_vec(&[2, 1], vec![-1.0f32, 1.0]).unwrap());
        // The root's true branch is the root itself: evaluation would never end.
        let e = crate::kernel::Registry::with_all_ops()
            .build(&regressor(vec![0, 0, 0]))
            .err()
            .unwrap();
        assert!(e.0.contains("cycle"), "{e}");
    }
}
