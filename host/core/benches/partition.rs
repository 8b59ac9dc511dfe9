//! How session creation (partitioning, convex splitting, compile, plan) grows with the graph.
//!
//! Graphs of 1,000, 10,000 and 100,000 nodes: a long chain with side branches and merges, ops
//! cycling through Relu, Sigmoid, Add, Mul, Neg on float32 [8]. Three EPs: `ep_a` (Relu and
//! Sigmoid) and `ep_b` (Add and Mul) are linked in-process plugins that each return ALL their
//! nodes as ONE group, so the host must split them into convex pieces; their kernels are the CPU
//! EP's. Neg falls back to the CPU EP.
//!
//! Run: `cargo bench -p epx --bench partition`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use epx::ir::Model;
use epx::onnx::proto;
use epx::{Environment, ExecutionProvider, Session, Tensor};
use epx_cpu::CpuProvider;
use epx_plugin_api::dlpack::DLDeviceType;
use epx_plugin_api::sdk::{
    GraphView, Kernel, Provider, ProviderFactory, ProviderInfo, ProviderOptions, Result,
    SubgraphView,
};
use prost::Message;

const OPS: [&str; 5] = ["Relu", "Sigmoid", "Add", "Mul", "Neg"];
const WIDTH: i64 = 8;

// ---------------------------------------------------------------------------------------------
// The in-process EPs.

struct OneGroupFactory {
    name: &'static str,
    ops: &'static [&'static str],
}

impl ProviderFactory for OneGroupFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: self.name.into(),
            vendor: "epx bench".into(),
            version: "0.1.0".into(),
            device_type: DLDeviceType::Cpu,
            concurrent_kernels: true,
        }
    }

    fn create(&self, options: ProviderOptions) -> Result<Box<dyn Provider>> {
        options.finish()?;
        Ok(Box::new(OneGroup { ops: self.ops }))
    }
}

/// Claims every node whose op is in `ops`, all in one group.
struct OneGroup {
    ops: &'static [&'static str],
}

impl Provider for OneGroup {
    fn capability(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> Result<Vec<Vec<u32>>> {
        let mut group = Vec::new();
        for &id in unclaimed {
            let node = graph.node(id)?;
            if node.domain.is_empty() && self.ops.contains(&node.op_type) {
                group.push(id);
            }
        }
        Ok(if group.is_empty() {
            Vec::new()
        } else {
            vec![group]
        })
    }

    fn compile(&self, graph: &GraphView<'_>, sub: &SubgraphView<'_>) -> Result<Box<dyn Kernel>> {
        CpuProvider::default().compile(graph, sub)
    }
}

epx_plugin_api::plugin_entry! {
    fn ep_a_entry;
    name: "bench_a",
    version: "0.1.0",
    providers: [OneGroupFactory { name: "ep_a", ops: &["Relu", "Sigmoid"] }],
}

epx_plugin_api::plugin_entry! {
    fn ep_b_entry;
    name: "bench_b",
    version: "0.1.0",
    providers: [OneGroupFactory { name: "ep_b", ops: &["Add", "Mul"] }],
}

// ---------------------------------------------------------------------------------------------
// The graphs.

fn value_info(name: &str) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{Dimension, dimension};
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(proto::tensor_proto::DataType::Float as i32),
                    shape: Some(proto::TensorShapeProto {
                        dim: vec![Dimension {
                            value: Some(dimension::Value::DimValue(WIDTH)),
                            ..Default::default()
                        }],
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `nodes` nodes; node `i` runs `OPS[i % 5]` and writes `v{i}`. Unary nodes extend the chain,
/// except every 7th, which starts a side branch off the chain; Add and Mul merge the chain with
/// the oldest open side branch, or with a chain value up to 12 steps back.
fn chain_model(nodes: usize) -> Model {
    let mut protos = Vec::with_capacity(nodes);
    let mut chain: Vec<String> = vec!["x".into()];
    let mut branches: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    for i in 0..nodes {
        let op = OPS[i % OPS.len()];
        let out = format!("v{i}");
        let last = chain[chain.len() - 1].clone();
        let inputs = match op {
            "Add" | "Mul" => {
                let other = branches
                    .pop_front()
                    .unwrap_or_else(|| chain[chain.len().saturating_sub(1 + i % 13)].clone());
                vec![last, other]
            }
            _ => vec![last],
        };
        let branch = op != "Add" && op != "Mul" && i % 7 == 3;
        protos.push(proto::NodeProto {
            op_type: Some(op.into()),
            name: Some(format!("n{i}")),
            input: inputs,
            output: vec![out.clone()],
            ..Default::default()
        });
        if branch {
            branches.push_back(out);
        } else {
            chain.push(out);
        }
    }
    let mut outputs = vec![chain[chain.len() - 1].clone()];
    outputs.extend(branches);
    let bytes = proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        producer_name: Some("epx-bench".into()),
        graph: Some(proto::GraphProto {
            name: Some(format!("chain{nodes}")),
            node: protos,
            input: vec![value_info("x")],
            output: outputs.iter().map(|o| value_info(o)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    match epx::onnx::load_model_bytes(&bytes, &format!("chain{nodes}"), None) {
        Ok(m) => m,
        Err(e) => fail(&format!("building the {nodes}-node model: {e}")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("partition bench: {message}");
    std::process::exit(1)
}

/// Minor page faults of this process so far (Linux; `None` elsewhere): fresh memory the
/// allocator maps in is a cost that grows with the working set, not with instructions.
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; minflt is field 10 of the whole line.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(7)?.parse().ok()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Row {
    nodes: usize,
    kernels: usize,
    per_ep: String,
    copies: usize,
    create_ms: f64,
    faults: Option<u64>,
    runs: usize,
    run_ms: f64,
}

fn measure(env: &Arc<Environment>, nodes: usize, repeats: usize) -> Row {
    let model = chain_model(nodes);
    let eps = [
        ExecutionProvider::new("ep_a"),
        ExecutionProvider::new("ep_b"),
    ];
    let mut times = Vec::with_capacity(repeats);
    let mut last = None;
    let mut faults = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let model = model.clone();
        // The previous session goes first, so each creation starts from the same heap.
        drop(last.take());
        let faults_before = minor_faults();
        let start = Instant::now();
        let session = Session::builder()
            .map(|b| b.with_environment(env.clone()))
            .and_then(|b| b.with_execution_providers(eps.clone()))
            .and_then(|b| b.commit_from_model(model));
        let elapsed = start.elapsed();
        if let (Some(a), Some(b)) = (faults_before, minor_faults()) {
            faults.push(b.saturating_sub(a));
        }
        let session = session.unwrap_or_else(|e| fail(&format!("{nodes} nodes: {e}")));
        times.push(ms(elapsed));
        // Dropped outside the timing (releasing kernels is not what is measured).
        last = Some(session);
    }
    let Some(session) = last else {
        fail("no repeats")
    };
    let report = session.placement();
    let per_ep: Vec<String> = ["ep_a", "ep_b", "cpu"]
        .iter()
        .map(|p| {
            let groups = report.groups.iter().filter(|g| g.provider == *p).count();
            format!("{p} {groups}")
        })
        .collect();
    let x = Tensor::from_array(ndarray::Array::from_elem(WIDTH as usize, 0.5f32).into_dyn());
    let start = Instant::now();
    let outputs = session
        .run([("x", x)])
        .unwrap_or_else(|e| fail(&format!("{nodes} nodes: run: {e}")));
    let run_ms = ms(start.elapsed());
    Row {
        nodes,
        kernels: session.kernel_count(),
        per_ep: per_ep.join(", "),
        copies: report.copies.len(),
        create_ms: median(times),
        faults: (faults.len() == repeats).then(|| {
            faults.sort_unstable();
            faults[faults.len() / 2]
        }),
        runs: outputs.len(),
        run_ms,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    // SAFETY: both entry functions are made by `plugin_entry!` in this binary.
    let env = unsafe {
        Environment::builder()
            .with_linked_plugin(ep_a_entry)
            .with_linked_plugin(ep_b_entry)
    }
    .commit()
    .unwrap_or_else(|e| fail(&format!("environment: {e}")));

    // `EPX_BENCH_NODES=10000,100000` measures only those sizes (for profiling one size).
    let all = [(1_000, 5), (10_000, 5), (100_000, 3)];
    let sizes: Vec<(usize, usize)> = match std::env::var("EPX_BENCH_NODES") {
        Ok(list) => {
            list.split(',')
                .map(|n| {
                    let n: usize = n.trim().parse().unwrap_or_else(|_| {
                        fail(&format!("EPX_BENCH_NODES: `{n}` is not a number"))
                    });
                    (n, if n >= 100_000 { 3 } else { 5 })
                })
                .collect()
        }
        Err(_) => all.to_vec(),
    };
    let mut rows = Vec::new();
    for (nodes, repeats) in sizes {
        let row = measure(&env, nodes, repeats);
        eprintln!("  {nodes} nodes: {:.1} ms", row.create_ms);
        rows.push(row);
    }

    println!(
        "Session creation (partition + convex split + compile + plan), median of 5 runs (3 from 100,000 nodes):"
    );
    println!();
    println!(
        "| nodes | groups = kernels | groups per EP | copies | creation ms (median) | growth vs 10x fewer nodes | page faults per creation | one run ms |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let growth = if i == 0 {
            "-".to_string()
        } else {
            let ratio = r.create_ms / rows[i - 1].create_ms;
            ratios.push(ratio);
            format!("{ratio:.1}x")
        };
        println!(
            "| {} | {} | {} | {} | {:.1} | {growth} | {} | {:.1} ({} outputs) |",
            r.nodes,
            r.kernels,
            r.per_ep,
            r.copies,
            r.create_ms,
            r.faults.map_or_else(|| "-".to_string(), |f| f.to_string()),
            r.run_ms,
            r.runs
        );
    }
    println!();
    let worst = ratios.iter().copied().fold(0.0f64, f64::max);
    let verdict = if worst <= 13.0 {
        "near-linear (every 10x step costs at most ~13x; target ~10x)"
    } else if worst <= 20.0 {
        "mildly super-linear (a 10x step costs between 13x and 20x; target ~10x)"
    } else {
        "super-linear (a 10x step costs more than 20x; target ~10x)"
    };
    println!("Judgement: {verdict}; worst ratio {worst:.1}x.");
}
