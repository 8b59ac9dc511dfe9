//! Tree ensembles: TreeEnsembleRegressor, TreeEnsembleClassifier (ai.onnx.ml 1–3) and
//! TreeEnsemble (ai.onnx.ml 5).
//!
//! Every form is compiled once, when the kernel is built, into one flat [`Forest`]: branch nodes
//! in one array (feature, threshold, comparison, children as indices), leaves as ranges of one
//! array of (target, weight) pairs. Evaluating a row walks each tree with plain index loads and
//! allocates nothing. When every branch compares the same way, a [`Flat`] copy (leaves as
//! self-looping nodes, optionally a dense leaf-by-target weight table) lets sums walk eight rows
//! at a time, a fixed number of steps in trees that are about as deep everywhere.

use std::collections::HashMap;

use epx_plugin_api::ElementType;

use crate::bail;
use crate::error::OpResult;
use crate::kernel::add_ml;
use crate::kernel::one;
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, kernel};
use crate::ops::ml::{PostTransform, class_labels, floats_attr, logistic, rows_cols};
use crate::ops::util::args::input;
use crate::tensor::{Tensor, TensorRef};

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
    /// The same trees laid out for walking several rows at once, where they allow it.
    flat: Option<Flat>,
}

/// Rows walked through a tree together: their node loads are independent, so they overlap.
const BLOCK: usize = 8;

/// Set in [`FlatNode::feature`] when a missing (NaN) value takes the true branch.
const MISSING_TRUE: u32 = 1 << 31;

/// A node of a [`Flat`] forest. Leaves are nodes too, after the branches, with both children
/// pointing at themselves, so a walk of fixed length may run past them.
#[derive(Clone, Copy, Debug)]
struct FlatNode {
    value: f64,
    /// The feature read, with [`MISSING_TRUE`] or-ed in.
    feature: u32,
    /// The false child, then the true child.
    next: [u32; 2],
}

/// A forest whose branches all compare the same way (no set membership), as one array of
/// [`FlatNode`]s.
#[derive(Debug)]
struct Flat {
    cmp: Cmp,
    /// Whether any branch sends a missing value to its true child.
    missing: bool,
    nodes: Vec<FlatNode>,
    /// Index of the first leaf node.
    first_leaf: u32,
    /// Per tree: its root node and, when every row is best walked the same number of steps
    /// (the tree is about as deep everywhere), that number.
    trees: Vec<(u32, Option<u32>)>,
    /// Per leaf, its weights as one row of `targets` values, when every leaf has at most one
    /// weight per target and the table stays small; sums then add whole rows.
    dense: Option<Vec<f64>>,
}

impl Flat {
    fn new(f: &Forest) -> Option<Flat> {
        let cmp = f.branches.first().map_or(Cmp::Leq, |b| b.cmp);
        if cmp == Cmp::Member || f.branches.iter().any(|b| b.cmp != cmp) {
            return None;
        }
        let first_leaf = u32::try_from(f.branches.len()).ok()?;
        let node = |c: u32| {
            if c & LEAF != 0 {
                first_leaf + (c & !LEAF)
            } else {
                c
            }
        };
        let mut nodes: Vec<FlatNode> = f
            .branches
            .iter()
            .map(|b| FlatNode {
                value: b.value,
                feature: b.feature | if b.missing_true { MISSING_TRUE } else { 0 },
                next: [node(b.if_false), node(b.if_true)],
            })
            .collect();
        for l in 0..f.leaves.len() as u32 {
            nodes.push(FlatNode {
                value: 0.0,
                feature: 0,
                next: [first_leaf + l; 2],
            });
        }
        // Per node: (deepest leaf, leaves below, sum of their depths), children before parents
        // (the forest is acyclic, checked by `validate`).
        let mut shape: Vec<Option<(u32, u64, u64)>> = vec![None; f.branches.len()];
        let mut stack = Vec::new();
        let leaf_shape = (0u32, 1u64, 0u64);
        let of = |shape: &[Option<(u32, u64, u64)>], c: u32| {
            if c & LEAF != 0 {
                Some(leaf_shape)
            } else {
                shape[c as usize]
            }
        };
        let mut trees = Vec::with_capacity(f.roots.len());
        for &root in &f.roots {
            if root & LEAF == 0 {
                stack.push(root);
            }
            while let Some(&at) = stack.last() {
                let b = &f.branches[at as usize];
                match (of(&shape, b.if_true), of(&shape, b.if_false)) {
                    (Some(t), Some(e)) => {
                        let leaves = t.1.saturating_add(e.1);
                        let sum = t.2.saturating_add(e.2).saturating_add(leaves);
                        shape[at as usize] = Some((t.0.max(e.0) + 1, leaves, sum));
                        stack.pop();
                    }
                    (t, e) => {
                        for (c, done) in [(b.if_true, t), (b.if_false, e)] {
                            if done.is_none() {
                                stack.push(c);
                            }
                        }
                    }
                }
            }
            let (depth, leaves, sum) = of(&shape, root).unwrap_or(leaf_shape);
            // A fixed walk costs the deepest leaf's depth for every row; it pays while that is
            // not far beyond the mean depth of the leaves.
            let mean = sum as f64 / leaves.max(1) as f64;
            let fixed = (f64::from(depth) <= 1.5 * mean + 1.0).then_some(depth);
            trees.push((node(root), fixed));
        }
        let t = f.targets;
        let one_each = f.leaves.iter().all(|&(s, e)| {
            let w = &f.weights[s as usize..e as usize];
            w.iter()
                .enumerate()
                .all(|(i, a)| w[..i].iter().all(|b| b.0 != a.0))
        });
        let cells = f.leaves.len().saturating_mul(t);
        let dense = (one_each && cells <= 4 * f.weights.len() + 4096).then(|| {
            let mut d = vec![0.0; cells];
            for (l, &(s, e)) in f.leaves.iter().enumerate() {
                for &(target, w) in &f.weights[s as usize..e as usize] {
                    d[l * t + target as usize] = w;
                }
            }
            d
        });
        Some(Flat {
            cmp,
            missing: f.branches.iter().any(|b| b.missing_true),
            nodes,
            first_leaf,
            trees,
            dense,
        })
    }

    /// The leaf node each of `R` rows (`x`, `cols` values each) reaches in the tree at `root`,
    /// walked `steps` steps, or to a leaf when `steps` is `None`.
    #[inline(always)]
    fn walk<const R: usize, const MISSING: bool, C: Fn(f64, f64) -> bool>(
        &self,
        c: &C,
        x: &[f64],
        cols: usize,
        root: u32,
        steps: Option<u32>,
    ) -> [u32; R] {
        let step = |at: u32, row: usize| {
            let n = &self.nodes[at as usize];
            let v = x[row + (n.feature & !MISSING_TRUE) as usize];
            let go = c(v, n.value) | (MISSING && n.feature & MISSING_TRUE != 0 && v.is_nan());
            n.next[usize::from(go)]
        };
        let mut at = [root; R];
        match steps {
            Some(steps) => {
                for _ in 0..steps {
                    for (r, a) in at.iter_mut().enumerate() {
                        *a = step(*a, r * cols);
                    }
                }
            }
            None => {
                for (r, a) in at.iter_mut().enumerate() {
                    while *a < self.first_leaf {
                        *a = step(*a, r * cols);
                    }
                }
            }
        }
        at
    }

    /// Adds, for `R` rows, the weights of the leaf they reach in every tree to `acc` (`R` rows of
    /// `targets`), summing: only for `Sum` and `Average`.
    fn sum_rows<const R: usize, const MISSING: bool, C: Fn(f64, f64) -> bool>(
        &self,
        forest: &Forest,
        c: &C,
        x: &[f64],
        cols: usize,
        acc: &mut [f64],
    ) {
        let t = forest.targets;
        acc.fill(0.0);
        for &(root, steps) in &self.trees {
            let at = self.walk::<R, MISSING, C>(c, x, cols, root, steps);
            for (r, &a) in at.iter().enumerate() {
                let leaf = (a - self.first_leaf) as usize;
                let dst = &mut acc[r * t..(r + 1) * t];
                match &self.dense {
                    Some(d) => {
                        for (s, &w) in dst.iter_mut().zip(&d[leaf * t..(leaf + 1) * t]) {
                            *s += w;
                        }
                    }
                    None => {
                        let (s, e) = forest.leaves[leaf];
                        for &(target, w) in &forest.weights[s as usize..e as usize] {
                            dst[target as usize] += w;
                        }
                    }
                }
            }
        }
    }
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
        let mut out = vec![0f32; crate::limits::checked_len(&[rows, targets], 4)?];
        if targets == 0 {
            return Ok(out);
        }
        let trees = self.roots.len().max(1) as f64;
        let finish = |acc: &[f64], orow: &mut [f32]| {
            for (t, (&v, d)) in acc.iter().zip(orow).enumerate() {
                let v = if agg == Aggregate::Average {
                    v / trees
                } else {
                    v
                };
                *d = (v + base.get(t).copied().unwrap_or(0.0)) as f32;
            }
        };
        // Runs of rows shared across the intra-op pool, each with its own accumulators.
        let run = crate::par::chunk_len(rows, 16, BLOCK);
        let summed = matches!(agg, Aggregate::Sum | Aggregate::Average);
        crate::par::for_each_chunk(&mut out, run * targets, |i, o| {
            let x = &x[i * run * cols..];
            match &self.flat {
                Some(flat) if summed => {
                    let mut acc = vec![0.0; BLOCK * targets];
                    flat.sum_all(self, x, cols, o, &mut acc, &finish);
                }
                _ => {
                    let mut acc = vec![(0.0, false); targets];
                    let mut sums = vec![0.0; targets];
                    for (r, orow) in o.chunks_exact_mut(targets).enumerate() {
                        self.evaluate(&x[r * cols..(r + 1) * cols], agg, &mut acc);
                        for (s, a) in sums.iter_mut().zip(&acc) {
                            *s = a.0;
                        }
                        finish(&sums, orow);
                    }
                }
            }
        });
        Ok(out)
    }
}

impl Flat {
    /// Sums every tree's leaves for each row of `out` (`targets` values each; `x` holds the rows
    /// from the first) and writes them through `finish`, walking [`BLOCK`] rows at a time.
    fn sum_all(
        &self,
        forest: &Forest,
        x: &[f64],
        cols: usize,
        out: &mut [f32],
        acc: &mut [f64],
        finish: &dyn Fn(&[f64], &mut [f32]),
    ) {
        macro_rules! by_cmp {
            ($missing:literal) => {{
                macro_rules! sum {
                    ($c:expr) => {
                        self.sum_with::<$missing, _>(forest, &$c, x, cols, out, acc, finish)
                    };
                }
                match self.cmp {
                    Cmp::Leq => sum!(|v: f64, t: f64| v <= t),
                    Cmp::Lt => sum!(|v: f64, t: f64| v < t),
                    Cmp::Gte => sum!(|v: f64, t: f64| v >= t),
                    Cmp::Gt => sum!(|v: f64, t: f64| v > t),
                    Cmp::Eq => sum!(|v: f64, t: f64| v == t),
                    Cmp::Neq => sum!(|v: f64, t: f64| v != t),
                    Cmp::Member => unreachable!("a forest with set membership is not flattened"),
                }
            }};
        }
        if self.missing {
            by_cmp!(true)
        } else {
            by_cmp!(false)
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn sum_with<const MISSING: bool, C: Fn(f64, f64) -> bool>(
        &self,
        forest: &Forest,
        c: &C,
        x: &[f64],
        cols: usize,
        out: &mut [f32],
        acc: &mut [f64],
        finish: &dyn Fn(&[f64], &mut [f32]),
    ) {
        let t = forest.targets;
        let done = (out.len() / t) / BLOCK * BLOCK;
        let mut blocks = out.chunks_exact_mut(BLOCK * t);
        for (b, o) in blocks.by_ref().enumerate() {
            let rows = &x[b * BLOCK * cols..(b + 1) * BLOCK * cols];
            self.sum_rows::<BLOCK, MISSING, C>(forest, c, rows, cols, acc);
            for (a, orow) in acc.chunks_exact(t).zip(o.chunks_exact_mut(t)) {
                finish(a, orow);
            }
        }
        for (r, orow) in blocks.into_remainder().chunks_exact_mut(t).enumerate() {
            let row = &x[(done + r) * cols..(done + r + 1) * cols];
            self.sum_rows::<1, MISSING, C>(forest, c, row, cols, &mut acc[..t]);
            finish(&acc[..t], orow);
        }
    }
}

/// The input as float64 values, converted directly when it is a float32 tensor.
fn features_f64(x: &TensorRef<'_>) -> Vec<f64> {
    match x.as_f32() {
        Ok(v) => match v.as_slice() {
            Some(v) => v.iter().map(|&v| f64::from(v)).collect(),
            None => x.to_f64_vec(),
        },
        Err(_) => x.to_f64_vec(),
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
    forest.flat = Flat::new(&forest);
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
        let mut s = forest.scores(&op, &features_f64(x), rows, cols, agg, &base)?;
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
        let raw = forest.scores(&op, &features_f64(x), rows, cols, Aggregate::Sum, &base)?;
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
            let start = out.len();
            out.extend_from_slice(row);
            post.apply(&mut out[start..]);
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
    forest.flat = Flat::new(&forest);
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
        let mut s = forest.scores(&op, &features_f64(x), rows, cols, agg, &[])?;
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
        n.domain = crate::kernel::ML.into();
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
        let k = crate::ops::registry()
            .build(&regressor(vec![1, 0, 0]))
            .unwrap();
        let x = Tensor::from_vec(&[2, 1], vec![0.25f32, 0.75]).unwrap();
        let y = k.run(&[Some(x.view())]).unwrap();
        assert_eq!(y[0], Tensor::from_vec(&[2, 1], vec![-1.0f32, 1.0]).unwrap());
        // The root's true branch is the root itself: evaluation would never end.
        let e = crate::ops::registry()
            .build(&regressor(vec![0, 0, 0]))
            .err()
            .unwrap();
        assert!(e.0.contains("cycle"), "{e}");
    }

    /// A random forest in the legacy attributes: `trees` trees, each balanced to three to five
    /// levels or (odd trees) a chain 16 levels deep with a leaf at every level, comparing with
    /// `mode`;
    /// some branches send missing values to their true child, and leaves have one to three
    /// weights over `targets` targets (twice the same target when `repeat`).
    fn random_forest(mode: &str, trees: i64, targets: usize, repeat: bool, seed: u64) -> NodeDef {
        let mut next = crate::fast::qgemm::tests::lcg(seed);
        let mut a: HashMap<&str, Vec<i64>> = HashMap::new();
        let (mut values, mut modes, mut weights) = (Vec::new(), Vec::new(), Vec::new());
        for tree in 0..trees {
            // (node id, depth) of nodes still to lay out.
            let mut todo = vec![(0i64, 0u32)];
            let mut ids = 1i64;
            let chain = tree % 2 == 1;
            while let Some((id, d)) = todo.pop() {
                let leaf = if chain {
                    d >= 16
                } else {
                    d == 3 + (tree as u32 % 3)
                };
                for (k, v) in [("nodes_treeids", tree), ("nodes_nodeids", id)] {
                    a.entry(k).or_default().push(v);
                }
                a.entry("nodes_featureids")
                    .or_default()
                    .push((next() % 5) as i64);
                a.entry("nodes_missing_value_tracks_true")
                    .or_default()
                    .push(i64::from(next().is_multiple_of(3)));
                values.push((next() % 200) as f32 / 100.0 - 1.0);
                if leaf {
                    modes.push(b"LEAF".to_vec());
                    a.entry("nodes_truenodeids").or_default().push(0);
                    a.entry("nodes_falsenodeids").or_default().push(0);
                    let n = 1 + next() as usize % 3;
                    for k in 0..n.min(targets) {
                        let target = if repeat && k == 1 { 0 } else { k };
                        a.entry("target_treeids").or_default().push(tree);
                        a.entry("target_nodeids").or_default().push(id);
                        a.entry("target_ids").or_default().push(target as i64);
                        weights.push((next() % 1000) as f32 / 300.0 - 1.5);
                    }
                    continue;
                }
                modes.push(mode.as_bytes().to_vec());
                let (t, f) = (ids, ids + 1);
                ids += 2;
                a.entry("nodes_truenodeids").or_default().push(t);
                a.entry("nodes_falsenodeids").or_default().push(f);
                // A chain goes on through one side, chosen at random; the other is a leaf.
                let f_depth = if chain { 16 } else { d + 1 };
                if chain && next().is_multiple_of(2) {
                    todo.push((t, f_depth));
                    todo.push((f, d + 1));
                } else {
                    todo.push((t, d + 1));
                    todo.push((f, f_depth));
                }
            }
        }
        let mut n = NodeDef::new("TreeEnsembleRegressor", 3);
        n.domain = crate::kernel::ML.into();
        for (k, v) in a {
            n = n.with_attr(k, AttrValue::Ints(v));
        }
        n.with_attr("nodes_values", AttrValue::Floats(values))
            .with_attr("nodes_modes", AttrValue::Strings(modes))
            .with_attr("target_weights", AttrValue::Floats(weights))
            .with_attr("n_targets", AttrValue::Int(targets as i64))
            .with_io(1, 1)
    }

    /// The flat walk (blocks of rows, fixed-length and to-a-leaf walks, dense and sparse leaf
    /// weights, missing values) gives exactly the scores of the branch-by-branch walk.
    #[test]
    fn the_flat_walk_scores_as_the_branch_walk_does() {
        let mut next = crate::fast::qgemm::tests::lcg(7);
        let rows = 2 * BLOCK + 5;
        let cols = 5;
        let x: Vec<f64> = (0..rows * cols)
            .map(|_| match next() % 10 {
                0 => f64::NAN,
                1 => 0.5,
                v => v as f64 / 5.0 - 1.0,
            })
            .collect();
        let modes = [
            "BRANCH_LEQ",
            "BRANCH_LT",
            "BRANCH_GTE",
            "BRANCH_GT",
            "BRANCH_EQ",
            "BRANCH_NEQ",
        ];
        for (seed, mode) in modes.iter().enumerate() {
            for repeat in [false, true] {
                let n = random_forest(mode, 6, 3, repeat, seed as u64);
                let flat = legacy_forest(&n, "target", 3).unwrap();
                let plain = Forest {
                    flat: None,
                    ..legacy_forest(&n, "target", 3).unwrap()
                };
                let f = flat.flat.as_ref().expect("one comparison: flattened");
                assert!(
                    f.trees.iter().any(|t| t.1.is_some()),
                    "{mode}: a fixed walk"
                );
                assert!(
                    f.trees.iter().any(|t| t.1.is_none()),
                    "{mode}: a walk to a leaf"
                );
                assert_eq!(f.dense.is_some(), !repeat, "{mode}");
                assert!(f.missing, "{mode}");
                for agg in [Aggregate::Sum, Aggregate::Average] {
                    let base = [0.25, -1.0];
                    let want = plain.scores("t", &x, rows, cols, agg, &base).unwrap();
                    let got = flat.scores("t", &x, rows, cols, agg, &base).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{mode} {agg:?} repeat {repeat}");
                }
            }
        }
    }
}
