//! Property test of partitioning: two in-process EPs claim random subsets of the nodes they are
//! offered, split into random groups that need not be connected or convex; the host must keep
//! every claim, split each group into convex pieces that run in a valid order, and compute the
//! same outputs as the CPU EP alone.
//!
//! Self-contained: no plugin libraries are needed, the EPs are linked into this test.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Arc;

use epx::onnx::proto;
use epx::{Environment, ExecutionProvider, Session, Tensor};
use epx_cpu::CpuProvider;
use epx_plugin_api::dlpack::DLDeviceType;
use epx_plugin_api::sdk::{
    Error, GraphView, Kernel, Provider, ProviderFactory, ProviderInfo, ProviderOptions, Result,
    SubgraphView,
};
use epx_tests::models::{float_value, model_bytes};

const SEEDS: u64 = 150;
const TOLERANCE: f32 = 1e-6;

// ---------------------------------------------------------------------------------------------
// A tiny seeded RNG (xorshift64*).

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Spread small seeds and avoid the all-zero state.
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
        if r.0 == 0 {
            r.0 = 1;
        }
        for _ in 0..4 {
            r.next();
        }
        r
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[-1, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

// ---------------------------------------------------------------------------------------------
// The in-process EPs `rand_a` and `rand_b`.

/// What an EP claims: with option `seed`, a random subset of `unclaimed` in random groups; with
/// option `groups` (`0,3;5`), exactly those groups.
#[derive(Clone, Debug)]
enum Claim {
    Seed(u64),
    Fixed(Vec<Vec<u32>>),
}

/// The groups an EP with `claim` returns when offered `unclaimed`. The test recomputes them to
/// know what each EP claimed.
fn choose(claim: &Claim, unclaimed: &[u32]) -> Vec<Vec<u32>> {
    let seed = match claim {
        Claim::Fixed(groups) => return groups.clone(),
        Claim::Seed(s) => *s,
    };
    let mut rng = Rng::new(seed ^ 0xC1A1_4C1A_1400_0000);
    // How greedy this EP is, and how many groups it scatters its nodes over.
    let percent = rng.range(10, 90);
    let num_groups = rng.range(1, 5);
    let mut groups: Vec<Vec<u32>> = vec![Vec::new(); num_groups];
    for &n in unclaimed {
        if rng.below(100) < percent {
            groups[rng.below(num_groups)].push(n);
        }
    }
    // Not in node order: the host must not rely on it.
    for g in &mut groups {
        if g.len() > 1 && rng.below(2) == 0 {
            g.reverse();
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

struct RandFactory(&'static str);

impl ProviderFactory for RandFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: self.0.into(),
            vendor: "epx tests".into(),
            version: "0.1.0".into(),
            device_type: DLDeviceType::Cpu,
            concurrent_kernels: true,
        }
    }

    fn create(&self, mut options: ProviderOptions) -> Result<Box<dyn Provider>> {
        let seed = options.take_parsed::<u64>("seed", "an unsigned integer")?;
        let groups = options.take("groups");
        options.finish()?;
        let claim = match (seed, groups) {
            (Some(s), None) => Claim::Seed(s),
            (None, Some(text)) => Claim::Fixed(parse_groups(&text)?),
            _ => {
                return Err(Error::invalid_argument(format!(
                    "{}: give exactly one of `seed` and `groups`",
                    self.0
                )));
            }
        };
        Ok(Box::new(RandProvider { claim }))
    }
}

fn parse_groups(text: &str) -> Result<Vec<Vec<u32>>> {
    text.split(';')
        .map(|g| {
            g.split(',')
                .map(|n| {
                    n.trim()
                        .parse::<u32>()
                        .map_err(|_| Error::invalid_argument(format!("bad node id `{n}`")))
                })
                .collect()
        })
        .collect()
}

struct RandProvider {
    claim: Claim,
}

impl Provider for RandProvider {
    fn capability(&self, _graph: &GraphView<'_>, unclaimed: &[u32]) -> Result<Vec<Vec<u32>>> {
        Ok(choose(&self.claim, unclaimed))
    }

    fn compile(&self, graph: &GraphView<'_>, sub: &SubgraphView<'_>) -> Result<Box<dyn Kernel>> {
        CpuProvider::default().compile(graph, sub)
    }
}

epx_plugin_api::plugin_entry! {
    fn rand_a_entry;
    name: "rand_a_plugin",
    version: "0.1.0",
    providers: [RandFactory("rand_a")],
}

epx_plugin_api::plugin_entry! {
    fn rand_b_entry;
    name: "rand_b_plugin",
    version: "0.1.0",
    providers: [RandFactory("rand_b")],
}

fn environment() -> Arc<Environment> {
    // SAFETY: both entry functions are made by `plugin_entry!` in this binary.
    unsafe {
        Environment::builder()
            .with_linked_plugin(rand_a_entry)
            .with_linked_plugin(rand_b_entry)
    }
    .commit()
    .expect("environment")
}

// ---------------------------------------------------------------------------------------------
// Random models.

const UNARY: [&str; 5] = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"];
const BINARY: [&str; 3] = ["Add", "Mul", "Sub"];

fn random_model_bytes(nodes: Vec<proto::NodeProto>, outputs: &[String]) -> Vec<u8> {
    model_bytes(proto::GraphProto {
        name: Some("random".into()),
        node: nodes,
        input: vec![float_value("x", &[4])],
        output: outputs.iter().map(|o| float_value(o, &[4])).collect(),
        ..Default::default()
    })
}

fn node(op: &str, inputs: &[&str], output: &str) -> proto::NodeProto {
    proto::NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("n_{output}")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// A random DAG of 20–120 nodes over input `x` (float32 [4]); node `i` writes `v{i}`. Nodes are
/// listed in creation order, which is topological, so the host keeps the numbering.
fn random_model(rng: &mut Rng) -> (Vec<u8>, usize, Vec<String>) {
    let n = rng.range(20, 120);
    let mut consumed = vec![false; n];
    let mut nodes = Vec::with_capacity(n);
    // Sources of node i: `x` (None) or an earlier node, biased towards recent ones so that
    // chains are long and paths leave and re-enter groups.
    let pick = |rng: &mut Rng, i: usize, consumed: &mut [bool]| -> String {
        // 0..=i: uniform over `x` and the i earlier values; i+1 and i+2: a recent value.
        let choice = rng.below(i + 3);
        let src = if choice > i {
            // Recent: one of the last 3 values.
            i.checked_sub(1 + rng.below(3.min(i.max(1))))
        } else {
            choice.checked_sub(1)
        };
        match src {
            None => "x".to_string(),
            Some(s) => {
                consumed[s] = true;
                format!("v{s}")
            }
        }
    };
    for i in 0..n {
        let out = format!("v{i}");
        if rng.below(8) < 5 {
            let op = UNARY[rng.below(UNARY.len())];
            let a = pick(rng, i, &mut consumed);
            nodes.push(node(op, &[&a], &out));
        } else {
            let op = BINARY[rng.below(BINARY.len())];
            let a = pick(rng, i, &mut consumed);
            let b = pick(rng, i, &mut consumed);
            nodes.push(node(op, &[&a, &b], &out));
        }
    }
    let sinks: Vec<usize> = (0..n).filter(|&i| !consumed[i]).collect();
    let mut outputs: Vec<usize> = Vec::new();
    for _ in 0..rng.range(1, 2) {
        let s = sinks[rng.below(sinks.len())];
        if !outputs.contains(&s) {
            outputs.push(s);
        }
    }
    let any = rng.below(n);
    if !outputs.contains(&any) {
        outputs.push(any);
    }
    let outputs: Vec<String> = outputs.iter().map(|i| format!("v{i}")).collect();
    (random_model_bytes(nodes, &outputs), n, outputs)
}

// ---------------------------------------------------------------------------------------------
// Checks.

fn session(env: &Arc<Environment>, eps: Vec<ExecutionProvider>, bytes: &[u8]) -> Session {
    Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers(eps)
        })
        .and_then(|b| b.commit_from_memory(bytes))
        .unwrap_or_else(|e| panic!("session creation failed: {e}"))
}

/// Whether a path leaves `group` and comes back: BFS over the outside nodes reachable from the
/// group's outside successors; reaching a group node again means the group is not convex.
fn is_convex(group: &HashSet<usize>, succ: &[Vec<usize>]) -> bool {
    let mut seen = vec![false; succ.len()];
    let mut queue: VecDeque<usize> = VecDeque::new();
    for &n in group {
        for &s in &succ[n] {
            if !group.contains(&s) && !seen[s] {
                seen[s] = true;
                queue.push_back(s);
            }
        }
    }
    while let Some(n) = queue.pop_front() {
        for &s in &succ[n] {
            if group.contains(&s) {
                return false;
            }
            if !seen[s] {
                seen[s] = true;
                queue.push_back(s);
            }
        }
    }
    true
}

fn outputs_of(s: &Session, x: &Tensor, names: &[String]) -> Vec<Vec<f32>> {
    let out = s
        .run([("x", x.try_clone().unwrap())])
        .unwrap_or_else(|e| panic!("run failed: {e}"));
    names
        .iter()
        .map(|n| out[n.as_str()].as_slice::<f32>().expect("float32").to_vec())
        .collect()
}

fn close(a: f32, b: f32) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= TOLERANCE * b.abs().max(1.0)
}

/// Creates the session with `eps`, checks the placement against what each EP claimed, checks
/// every group is convex and the groups run in dependency order, and compares the outputs with
/// the CPU EP's.
fn check(
    env: &Arc<Environment>,
    eps: &[(&str, Claim)],
    bytes: &[u8],
    n: usize,
    outputs: &[String],
    x: &Tensor,
) {
    let requested: Vec<ExecutionProvider> = eps
        .iter()
        .map(|(name, claim)| {
            let ep = ExecutionProvider::new(*name).error_on_failure();
            match claim {
                Claim::Seed(s) => ep.with_option("seed", s.to_string()),
                Claim::Fixed(groups) => {
                    let text: Vec<String> = groups
                        .iter()
                        .map(|g| g.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
                        .collect();
                    ep.with_option("groups", text.join(";"))
                }
            }
        })
        .collect();
    let s = session(env, requested, bytes);
    assert_eq!(s.model().graph.nodes.len(), n);

    // What each EP claimed, as the host asked them in priority order.
    let mut want: Vec<&str> = vec!["cpu"; n];
    let mut answered: Vec<(&str, Vec<BTreeSet<usize>>)> = Vec::new();
    for (name, claim) in eps {
        let unclaimed: Vec<u32> = (0..n as u32)
            .filter(|&i| want[i as usize] == "cpu")
            .collect();
        let groups = choose(claim, &unclaimed);
        for g in &groups {
            for &i in g {
                want[i as usize] = name;
            }
        }
        answered.push((
            name,
            groups
                .iter()
                .map(|g| g.iter().map(|&i| i as usize).collect())
                .collect(),
        ));
    }
    let placed = s.node_placement();
    assert_eq!(placed.len(), n, "one placement per node");
    assert_eq!(placed, want, "every claim is kept");

    // The groups partition the nodes, agree with the node placement, and each is a piece of one
    // group its EP returned.
    let report = s.placement();
    let mut group_of = vec![usize::MAX; n];
    for (gi, g) in report.groups.iter().enumerate() {
        assert!(!g.nodes.is_empty(), "group {gi} is empty");
        for &node in &g.nodes {
            assert!(node < n, "group {gi} holds node {node} of {n}");
            assert_eq!(group_of[node], usize::MAX, "node {node} is in two groups");
            group_of[node] = gi;
            assert_eq!(
                placed[node], g.provider,
                "node {node}: group and node placement differ"
            );
        }
        if let Some((_, groups)) = answered.iter().find(|(name, _)| *name == g.provider) {
            assert!(
                groups
                    .iter()
                    .any(|a| g.nodes.iter().all(|node| a.contains(node))),
                "group {gi} of {} ({:?}) merges nodes of different answer groups",
                g.provider,
                g.nodes
            );
        }
        let mut sorted = g.nodes.clone();
        sorted.sort_unstable();
        assert_eq!(
            g.nodes, sorted,
            "group {gi}: nodes in topological (id) order"
        );
    }
    assert!(
        group_of.iter().all(|&g| g != usize::MAX),
        "every node is in a group"
    );

    // Convex groups, run in an order that respects every edge.
    let mut succ = vec![Vec::new(); n];
    for (from, to, _) in s.edges() {
        succ[from].push(to);
        let (gf, gt) = (group_of[from], group_of[to]);
        assert!(
            gf <= gt,
            "edge {from} → {to} goes from group {gf} back to group {gt}"
        );
    }
    for (gi, g) in report.groups.iter().enumerate() {
        let members: HashSet<usize> = g.nodes.iter().copied().collect();
        assert!(
            is_convex(&members, &succ),
            "group {gi} ({} {:?}) is not convex",
            g.provider,
            g.nodes
        );
    }
    assert_eq!(s.kernel_count(), report.groups.len());

    // Same results as the CPU EP alone.
    let cpu = session(env, Vec::new(), bytes);
    let got = outputs_of(&s, x, outputs);
    let reference = outputs_of(&cpu, x, outputs);
    for (name, (g, r)) in outputs.iter().zip(got.iter().zip(&reference)) {
        assert_eq!(g.len(), 4, "{name}");
        for (a, b) in g.iter().zip(r) {
            assert!(close(*a, *b), "output {name}: {g:?} vs CPU {r:?}");
        }
    }
}

fn random_input(rng: &mut Rng) -> Tensor {
    let data: Vec<f32> = (0..4).map(|_| rng.unit() * 2.0).collect();
    Tensor::from_array(ndarray::Array::from_vec(data).into_dyn())
}

#[test]
fn random_groups_are_kept_split_convex_and_correct() {
    let env = environment();
    let mut failures = Vec::new();
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let (bytes, n, outputs) = random_model(&mut rng);
        let x = random_input(&mut rng);
        let eps = [
            ("rand_a", Claim::Seed(seed)),
            ("rand_b", Claim::Seed(seed + 1)),
        ];
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&env, &eps, &bytes, n, &outputs, &x)
        }));
        if let Err(payload) = result {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("seed {seed} ({n} nodes): {msg}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {SEEDS} seeds failed; the first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Fixed cases.

/// `r_i = op(inputs)`: a model from (op, inputs) pairs over `x`, outputs by node index.
fn fixed_model(nodes: &[(&str, &[&str])], outputs: &[usize]) -> (Vec<u8>, usize, Vec<String>) {
    let protos = nodes
        .iter()
        .enumerate()
        .map(|(i, (op, ins))| node(op, ins, &format!("v{i}")))
        .collect();
    let outputs: Vec<String> = outputs.iter().map(|i| format!("v{i}")).collect();
    (random_model_bytes(protos, &outputs), nodes.len(), outputs)
}

fn x() -> Tensor {
    Tensor::from_array(ndarray::Array::from_vec(vec![-1.5f32, -0.25, 0.5, 2.0]).into_dyn())
}

#[test]
fn a_path_through_another_ep_splits_the_group_and_runs() {
    // v0 → v1 → v2 → v3; rand_a claims {0, 2, 3} as one group although v1 is not its own:
    // the host must split it into {0} and {2, 3}, and the run must still be right.
    let (bytes, n, outputs) = fixed_model(
        &[
            ("Relu", &["x"]),
            ("Neg", &["v0"]),
            ("Tanh", &["v1"]),
            ("Abs", &["v2"]),
        ],
        &[3],
    );
    let env = environment();
    check(
        &env,
        &[("rand_a", Claim::Fixed(vec![vec![0, 2, 3]]))],
        &bytes,
        n,
        &outputs,
        &x(),
    );
    let s = session(
        &env,
        vec![ExecutionProvider::new("rand_a").with_option("groups", "0,2,3")],
        &bytes,
    );
    let groups: Vec<Vec<usize>> = s
        .placement()
        .groups
        .iter()
        .map(|g| g.nodes.clone())
        .collect();
    assert_eq!(groups, [vec![0], vec![1], vec![2, 3]]);
}

#[test]
fn two_eps_with_convex_but_entangled_groups() {
    // rand_a claims {0, 3} and rand_b {1, 2}. Each group is convex on its own (no path leaves
    // it and comes back), yet 0 → 2 (a → b) and 1 → 3 (b → a): fused whole, the two kernels
    // would each wait for the other. The host must split one of them.
    let (bytes, n, outputs) = fixed_model(
        &[
            ("Relu", &["x"]),
            ("Neg", &["x"]),
            ("Abs", &["v0"]),
            ("Add", &["v1", "x"]),
        ],
        &[2, 3],
    );
    let env = environment();
    check(
        &env,
        &[
            ("rand_a", Claim::Fixed(vec![vec![0, 3]])),
            ("rand_b", Claim::Fixed(vec![vec![1, 2]])),
        ],
        &bytes,
        n,
        &outputs,
        &x(),
    );
}
