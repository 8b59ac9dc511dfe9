//! `epx compare`: runs a model on the CPU EP alone (the reference) and on each EP list given,
//! on the same inputs, and reports per output the largest absolute and relative error. When an
//! output is off, both are run again with every intermediate value as an output, and the first
//! node (in topological order) whose output diverges beyond the tolerance is named, with the EP
//! that ran it.

use std::path::PathBuf;
use std::sync::Arc;

use epx::ir::Model;
use epx::{ElementType, Environment, Error, ExecutionProvider, Result, Session, Tensor, Value};

use crate::run::{make_inputs, parse_ep};

#[derive(clap::Args)]
pub struct CompareArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// An EP list to compare with the CPU EP alone (repeatable): EPs joined by `+` in priority
    /// order, each with options as for `run` (`openvino:device_type=CPU+cuda`).
    #[arg(long = "ep", value_name = "EPS", required = true)]
    eps: Vec<String>,
    /// An input as NAME=FILE.npy (repeatable); inputs not given get the same random data in
    /// every run.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Absolute tolerance: a value is off when |a - b| > atol + rtol * |reference|.
    #[arg(long, default_value_t = 1e-4)]
    atol: f64,
    /// Relative tolerance (see --atol).
    #[arg(long, default_value_t = 1e-3)]
    rtol: f64,
}

/// How far one value is from the reference.
struct Diff {
    max_abs: f64,
    max_rel: f64,
    /// Values off by more than the tolerance (for non-numeric values: 1 when they differ).
    off: usize,
    /// Why the values cannot be compared element by element (shape or type differs).
    mismatch: Option<String>,
    /// Why the values were not compared at all (not tensors in host memory).
    skipped: Option<String>,
}

impl Diff {
    fn same() -> Self {
        Diff {
            max_abs: 0.0,
            max_rel: 0.0,
            off: 0,
            mismatch: None,
            skipped: None,
        }
    }

    fn ok(&self) -> bool {
        self.off == 0 && self.mismatch.is_none()
    }
}

/// Compares the EP lists of `args` with the CPU EP; `Ok(false)` when any output is off.
pub fn compare(env: Arc<Environment>, args: CompareArgs) -> Result<bool> {
    let model = epx::onnx::load_model_file(&args.model)?;
    let reference = session(&env, &model, &[])?;
    // Values are not Clone: each run reads the files again, and the random inputs are the
    // same in every run (a fixed seed, in the inputs' order).
    let inputs = || make_inputs(&reference, &args.inputs);
    let want = reference.run(inputs()?)?;
    println!(
        "reference: the CPU EP alone; tolerance |a - b| <= {} + {} * |reference|",
        args.atol, args.rtol
    );
    let mut all_ok = true;
    for spec in &args.eps {
        let eps = spec.split('+').map(parse_ep).collect::<Result<Vec<_>>>()?;
        let candidate = session(&env, &model, &eps)?;
        let counts: Vec<String> = candidate
            .placement()
            .node_counts()
            .iter()
            .map(|(ep, n)| format!("{ep} {n}"))
            .collect();
        println!("\n--ep {spec}: nodes on {}", counts.join(", "));
        let got = candidate.run(inputs()?)?;
        println!(
            "  {:<32} {:>12} {:>12} {:>10}  verdict",
            "output", "max abs err", "max rel err", "off"
        );
        let mut ok = true;
        for (name, w) in want.values() {
            let Some(g) = got.value(name) else {
                return Err(Error::Run(format!("--ep {spec}: no output `{name}`")));
            };
            let d = diff(w, g, args.atol, args.rtol);
            let verdict = match (&d.mismatch, &d.skipped) {
                (Some(why), _) => format!("DIFFERS: {why}"),
                (None, Some(why)) => format!("not compared: {why}"),
                (None, None) if d.off == 0 => "ok".to_string(),
                (None, None) => "OFF".to_string(),
            };
            ok &= d.ok();
            println!(
                "  {:<32} {:>12.3e} {:>12.3e} {:>10}  {}",
                epx::printable(name),
                d.max_abs,
                d.max_rel,
                d.off,
                epx::printable(&verdict)
            );
        }
        if !ok {
            all_ok = false;
            first_divergence(&env, &model, &eps, &args)?;
        }
    }
    println!(
        "\n{}",
        if all_ok {
            "all outputs within the tolerance"
        } else {
            "some outputs are off"
        }
    );
    Ok(all_ok)
}

fn session(env: &Arc<Environment>, model: &Model, eps: &[ExecutionProvider]) -> Result<Session> {
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers(eps.iter().cloned())?
        .commit_from_model(model.clone())
}

/// Runs the reference and the candidate with every node output of the main graph as a model
/// output, and prints the first node whose outputs differ beyond the tolerance.
fn first_divergence(
    env: &Arc<Environment>,
    model: &Model,
    eps: &[ExecutionProvider],
    args: &CompareArgs,
) -> Result<()> {
    let mut wide = model.clone();
    let g = &mut wide.graph;
    for n in 0..g.nodes.len() {
        for &v in &g.nodes[n].outputs.clone() {
            let Some(v) = v else { continue };
            if !g.values[v].is_graph_output && !g.values[v].ty.is_non_tensor() {
                g.values[v].is_graph_output = true;
                g.outputs.push(v);
            }
        }
    }
    let reference_session = session(env, &wide, &[])?;
    let reference = reference_session.run(make_inputs(&reference_session, &args.inputs)?)?;
    let candidate_session = session(env, &wide, eps)?;
    let placement = candidate_session.placement();
    let candidate = candidate_session.run(make_inputs(&candidate_session, &args.inputs)?)?;
    for (n, node) in wide.graph.nodes.iter().enumerate() {
        for v in node.outputs.iter().flatten() {
            let name = &wide.graph.values[*v].name;
            let (Some(w), Some(c)) = (reference.value(name), candidate.value(name)) else {
                continue;
            };
            let d = diff(w, c, args.atol, args.rtol);
            if d.ok() {
                continue;
            }
            let ep = placement
                .nodes
                .iter()
                .find(|p| p.id == n)
                .map_or("?", |p| p.provider.as_str());
            let label = if node.name.is_empty() {
                format!("#{n}")
            } else {
                node.name.clone()
            };
            let what = d.mismatch.unwrap_or_else(|| {
                format!("max abs err {:.3e}, {} value(s) off", d.max_abs, d.off)
            });
            let line = format!(
                "  first divergence: node {label} ({}) on {ep}, output `{name}`: {what}",
                node.op_type
            );
            println!("{}", epx::printable(&line));
            return Ok(());
        }
    }
    println!(
        "  no single node diverges when every intermediate is an output (the fused kernels of \
         the first run may round differently from node-by-node execution)"
    );
    Ok(())
}

/// The elements of a numeric tensor as f64: floats as the node tests read them, integers and
/// bools here.
fn numbers(t: &Tensor) -> Option<Vec<f64>> {
    fn conv<T: epx::TensorElement + Copy>(t: &Tensor, f: impl Fn(T) -> f64) -> Option<Vec<f64>> {
        t.as_slice::<T>().map(|s| s.iter().map(|&v| f(v)).collect())
    }
    if let Some(floats) = epx_io::compare::float_elements(t) {
        return Some(floats);
    }
    match t.elem_type() {
        ElementType::Int8 => conv::<i8>(t, f64::from),
        ElementType::Uint8 => conv::<u8>(t, f64::from),
        ElementType::Int16 => conv::<i16>(t, f64::from),
        ElementType::Uint16 => conv::<u16>(t, f64::from),
        ElementType::Int32 => conv::<i32>(t, f64::from),
        ElementType::Uint32 => conv::<u32>(t, f64::from),
        ElementType::Int64 => conv::<i64>(t, |v| v as f64),
        ElementType::Uint64 => conv::<u64>(t, |v| v as f64),
        ElementType::Bool => conv::<bool>(t, |v| f64::from(u8::from(v))),
        _ => None,
    }
}

fn diff(want: &Value, got: &Value, atol: f64, rtol: f64) -> Diff {
    let mismatch = |why: String| Diff {
        max_abs: f64::NAN,
        max_rel: f64::NAN,
        off: 1,
        mismatch: Some(why),
        skipped: None,
    };
    let (Value::Host(w), Value::Host(g)) = (want, got) else {
        return Diff {
            skipped: Some(format!("a {}", want.type_name())),
            ..Diff::same()
        };
    };
    if w.elem_type() != g.elem_type() || w.shape() != g.shape() {
        return mismatch(format!(
            "{} {:?} against the reference's {} {:?}",
            g.elem_type(),
            g.shape(),
            w.elem_type(),
            w.shape()
        ));
    }
    let (Some(a), Some(b)) = (numbers(w), numbers(g)) else {
        // Strings and the packed types: equal or not.
        return if w == g {
            Diff::same()
        } else {
            mismatch("the values differ".into())
        };
    };
    let mut d = Diff::same();
    for (&r, &c) in a.iter().zip(&b) {
        if r.is_nan() || c.is_nan() {
            if r.is_nan() != c.is_nan() {
                d.off += 1;
                d.max_abs = f64::INFINITY;
            }
            continue;
        }
        let abs = (r - c).abs();
        if abs.is_nan() {
            continue; // the same infinity on both sides
        }
        d.max_abs = d.max_abs.max(abs);
        if r != 0.0 {
            d.max_rel = d.max_rel.max(abs / r.abs());
        }
        if abs > atol + rtol * r.abs() {
            d.off += 1;
        }
    }
    d
}
