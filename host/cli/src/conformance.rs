//! `epx conformance --ep NAME`: runs the ONNX node tests (and any models given) with NAME first,
//! and says per op what the EP claimed, passed, got wrong (with the largest error), crashed on
//! or declined (with the host's reason).
//!
//! Each batch of cases runs in a child process (`epx` itself, with the hidden `--worker` flag),
//! which prints one JSON line as it starts a case and one with its result. A child that dies
//! (a crash in the plugin) or stops answering (a hang, past `--timeout`) marks the case it was
//! on, and a new child takes the rest: one bad case never stops the run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use epx::onnx::load_model_file;
use epx::plugin::discover::SearchOrigin;
use epx::{Environment, Error, ExecutionProvider, Result, Session};
use epx_io::compare::{Tolerance, check_value, max_abs_error};
use epx_io::nodetest::{data_sets, read_data_set};
use serde_json::json;

use crate::run::{make_inputs, parse_ep};
use epx::plugin::probe::{exit_signal, signal_name};

#[derive(clap::Args)]
pub struct ConformanceArgs {
    /// The EP to test, with options as for `run` (NAME:KEY=VALUE,...).
    #[arg(long = "ep", value_name = "NAME")]
    ep: String,
    /// The ONNX node tests: a folder of `test_*` cases, each a model.onnx and data sets (default:
    /// $EPX_ONNX_NODE_TESTS, else .testdata/onnx-node, which the repository's
    /// `bash tests/fetch-testdata.sh` fills from the onnx wheel).
    #[arg(long = "node-tests", value_name = "DIR")]
    node_tests: Option<PathBuf>,
    /// Only node tests whose folder name contains one of these (comma-separated).
    #[arg(long, value_name = "TEXT,...")]
    filter: Option<String>,
    /// A model to run on the EP and on the CPU EP alone (random inputs) and compare
    /// (repeatable). With models and no --node-tests or --filter, only the models run.
    #[arg(long = "model", value_name = "MODEL")]
    models: Vec<PathBuf>,
    /// Seconds one case may take before it counts as hung.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    timeout: u64,
    /// Print every case and the per-op table as JSON.
    #[arg(long)]
    json: bool,
    /// Internal: run the cases named on stdin in this process, a JSON line each.
    #[arg(long, hide = true)]
    worker: bool,
}

/// Cases a child process takes at once.
const BATCH: usize = 256;

/// Runs the conformance check; `Ok(false)` when a case is wrong or crashed.
pub fn conformance(env: Arc<Environment>, args: ConformanceArgs) -> Result<bool> {
    let ep = parse_ep(&args.ep)?;
    if args.worker {
        worker(&env, &ep)?;
        return Ok(true);
    }
    let cases = cases(&args)?;
    if cases.is_empty() {
        return Err(Error::InvalidInput(
            "no case to run: --filter matched no node test, and no --model was given".into(),
        ));
    }
    let plugin_dirs: Vec<PathBuf> = env
        .search_path()
        .iter()
        .filter(|d| d.origin == SearchOrigin::Explicit)
        .map(|d| d.path.clone())
        .collect();
    let mut results = Vec::with_capacity(cases.len());
    let mut next = 0;
    while next < cases.len() {
        let batch = &cases[next..(next + BATCH).min(cases.len())];
        let done = run_batch(&plugin_dirs, &args, batch, &mut results)?;
        next += done.max(1);
    }
    let ok = report(&args, &results);
    Ok(ok)
}

/// The node test folders (filtered) and the models, in order.
fn cases(args: &ConformanceArgs) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let node_tests_wanted =
        args.node_tests.is_some() || args.filter.is_some() || args.models.is_empty();
    if node_tests_wanted {
        let dir = args
            .node_tests
            .clone()
            .or_else(|| std::env::var_os("EPX_ONNX_NODE_TESTS").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(".testdata/onnx-node"));
        let entries = std::fs::read_dir(&dir).map_err(|e| {
            Error::InvalidInput(format!(
                "no ONNX node tests at {}: {e}; fetch them with `bash tests/fetch-testdata.sh` in \
                 the epx repository, or pass --node-tests with the `onnx/backend/test/data/node` \
                 folder of an onnx wheel",
                dir.display()
            ))
        })?;
        let filters: Vec<&str> = args
            .filter
            .as_deref()
            .map(|f| f.split(',').filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("model.onnx").is_file())
            .filter(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                filters.is_empty() || name.is_some_and(|n| filters.iter().any(|f| n.contains(f)))
            })
            .collect();
        found.sort();
        out.extend(found);
    }
    out.extend(args.models.iter().cloned());
    Ok(out)
}

/// Runs `batch` in one child; returns how many cases got a result (the last one possibly as
/// crashed or hung).
fn run_batch(
    plugin_dirs: &[PathBuf],
    args: &ConformanceArgs,
    batch: &[PathBuf],
    results: &mut Vec<serde_json::Value>,
) -> Result<usize> {
    let exe = std::env::current_exe().map_err(|e| Error::Run(format!("own executable: {e}")))?;
    let mut cmd = Command::new(exe);
    // A group of its own: a hang ends the worker and everything the EP started in it.
    epx::child::own_group(&mut cmd);
    for d in plugin_dirs {
        cmd.arg("--plugin-dir").arg(d);
    }
    let mut child = cmd
        .args(["conformance", "--worker", "--ep", &args.ep])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::Run(format!("starting a worker: {e}")))?;
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        for case in batch {
            let _ = writeln!(stdin, "{}", case.display());
        }
    }
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Lines past MAX_LINE (an EP printing to stdout without end) are dropped, not kept.
        const MAX_LINE: u64 = 1 << 20;
        let mut r = BufReader::new(stdout);
        loop {
            let mut line = Vec::new();
            let n = match (&mut r).take(MAX_LINE).read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    break;
                }
            };
            if n as u64 == MAX_LINE && !line.ends_with(b"\n") {
                // The rest of an over-long line.
                let mut skip = Vec::new();
                while let Ok(k) = (&mut r).take(MAX_LINE).read_until(b'\n', &mut skip) {
                    if k == 0 || skip.ends_with(b"\n") {
                        break;
                    }
                    skip.clear();
                }
                continue;
            }
            let text = String::from_utf8_lossy(&line).trim_end().to_owned();
            if tx.send(Ok(text)).is_err() {
                break;
            }
        }
    });
    let mut done = 0;
    let mut current: Option<String> = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(args.timeout)) {
            Ok(Ok(line)) => {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if v.get("start").is_some() {
                    current = v["case"].as_str().map(str::to_string);
                } else {
                    results.push(v);
                    current = None;
                    done += 1;
                }
            }
            Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                epx::child::kill_group(child.id());
                // Ended between cases with some left: the next one gets the blame, so no case
                // is dropped without a result.
                let current = current
                    .or_else(|| (done < batch.len()).then(|| batch[done].display().to_string()));
                if let Some(case) = current {
                    let how = match status.and_then(|s| exit_signal(&s)) {
                        Some(sig) => {
                            format!("the process died with signal {sig} ({})", signal_name(sig))
                        }
                        None => format!(
                            "the process ended ({}) during the case",
                            status.map_or("unknown status".into(), |s| s.to_string())
                        ),
                    };
                    results.push(unfinished(&case, "crashed", how));
                    done += 1;
                }
                return Ok(done);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                epx::child::kill_group(child.id());
                let _ = child.kill();
                let _ = child.wait();
                let case = current.unwrap_or_else(|| batch[done].display().to_string());
                results.push(unfinished(
                    &case,
                    "crashed",
                    format!(
                        "no answer within {} s (hung); the process was killed",
                        args.timeout
                    ),
                ));
                return Ok(done + 1);
            }
        }
    }
}

fn unfinished(case: &str, status: &str, message: String) -> serde_json::Value {
    let (op, domain) = load_model_file(&case_model(Path::new(case)))
        .ok()
        .map(|m| op_of(Path::new(case), &m))
        .unwrap_or_else(|| ("(unknown)".into(), String::new()));
    json!({ "case": case_name(Path::new(case)), "op": op, "domain": domain, "status": status,
            "claimed": serde_json::Value::Null, "message": message })
}

fn case_model(case: &Path) -> PathBuf {
    if case.is_dir() {
        case.join("model.onnx")
    } else {
        case.to_path_buf()
    }
}

fn case_name(case: &Path) -> String {
    case.file_name().map_or_else(
        || case.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The row a case counts in: a node test's op (`(multi-node)` for an expanded one), or a
/// given model's file name.
fn op_of(case: &Path, model: &epx::ir::Model) -> (String, String) {
    if !case.is_dir() {
        return (case_name(case), String::new());
    }
    match model.graph.nodes.as_slice() {
        [one] => (one.op_type.clone(), one.domain.clone()),
        _ => ("(multi-node)".into(), String::new()),
    }
}

/// The child's side: each case named on stdin, a start line and a result line.
fn worker(env: &Arc<Environment>, ep: &ExecutionProvider) -> Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(case) = line else { break };
        let path = PathBuf::from(&case);
        let _ = writeln!(out, "{}", json!({ "start": true, "case": case }));
        let _ = out.flush();
        let result = run_case(env, ep, &path);
        let _ = writeln!(out, "{result}");
        let _ = out.flush();
    }
    Ok(())
}

fn run_case(env: &Arc<Environment>, ep: &ExecutionProvider, case: &Path) -> serde_json::Value {
    let name = case_name(case);
    let model = match load_model_file(&case_model(case)) {
        Ok(m) => m,
        Err(e) => {
            // Not the EP's doing: counted as declined, with the host's reason.
            let message = first_line(&format!("the host cannot load it: {e}"));
            return json!({ "case": name, "op": "(load)", "domain": "", "status": "declined",
                           "claimed": 0, "message": message });
        }
    };
    let (op, domain) = op_of(case, &model);
    let result = |status: &str, claimed: usize, max: Option<f64>, message: String| {
        json!({ "case": name, "op": op, "domain": domain, "status": status, "claimed": claimed,
                "max_abs_error": max, "message": message })
    };
    let ep_name = ep.name().rsplit('/').next().unwrap_or_default().to_string();
    // Each case tests the EP's compile: never a kernel stored by an earlier run.
    let session = match Session::builder().and_then(|b| {
        b.with_environment(env.clone())
            .with_kernel_cache(false)
            .with_execution_providers([ep.clone()])?
            .commit_from_model(model.clone())
    }) {
        Ok(s) => s,
        Err(e) => return result("wrong", 0, None, first_line(&format!("session: {e}"))),
    };
    let placement = session.placement();
    let claimed = placement
        .nodes
        .iter()
        .filter(|n| n.provider == ep_name)
        .count();
    if claimed == 0 {
        let reason = placement
            .fallbacks
            .first()
            .map_or_else(|| "no node claimed".to_string(), |f| f.reason.clone());
        return result("declined", 0, None, reason);
    }
    let outcome = if case.is_dir() {
        check_node_test(&session, &model, case)
    } else {
        check_against_cpu(env, &session, &model)
    };
    match outcome {
        Ok(max) => result("passed", claimed, Some(max), String::new()),
        Err((max, message)) => result("wrong", claimed, max, first_line(&message)),
    }
}

type Outcome = std::result::Result<f64, (Option<f64>, String)>;

/// Every data set of a node test against its expected outputs.
fn check_node_test(session: &Session, model: &epx::ir::Model, dir: &Path) -> Outcome {
    let g = &model.graph;
    let named = |ids: &[usize]| -> Vec<(String, epx::ir::ValueType)> {
        ids.iter()
            .map(|&v| (g.values[v].name.clone(), g.values[v].ty.clone()))
            .collect()
    };
    let (inputs, outputs) = (named(&g.inputs), named(&g.outputs));
    let mut max = 0.0f64;
    for set in data_sets(dir) {
        let feed = read_data_set(&set, "input", &inputs).map_err(|e| (None, e))?;
        let want = read_data_set(&set, "output", &outputs).map_err(|e| (None, e))?;
        let got = session.run(feed).map_err(|e| (None, format!("run: {e}")))?;
        for (name, w) in &want {
            let h = got
                .value(name)
                .ok_or_else(|| (None, format!("output `{name}` missing")))?;
            let err = max_abs_error(h, w);
            max = max.max(check_value(name, h, w, Tolerance::NODE_TESTS).map_err(|m| (err, m))?);
        }
    }
    Ok(max)
}

/// A model on the EP against the CPU EP alone, on random inputs.
fn check_against_cpu(env: &Arc<Environment>, session: &Session, model: &epx::ir::Model) -> Outcome {
    let cpu = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .commit_from_model(model.clone())
        })
        .map_err(|e| (None, format!("the CPU EP: {e}")))?;
    let want = cpu
        .run(make_inputs(&cpu, &[]).map_err(|e| (None, e.to_string()))?)
        .map_err(|e| (None, format!("the CPU EP: {e}")))?;
    let got = session
        .run(make_inputs(session, &[]).map_err(|e| (None, e.to_string()))?)
        .map_err(|e| (None, format!("run: {e}")))?;
    let tol = Tolerance {
        atol: 1e-4,
        rtol: 1e-3,
    };
    let mut max = 0.0f64;
    for (name, w) in want.values() {
        let h = got
            .value(name)
            .ok_or_else(|| (None, format!("output `{name}` missing")))?;
        let err = max_abs_error(h, w);
        max = max.max(check_value(name, h, w, tol).map_err(|m| (err, m))?);
    }
    Ok(max)
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > 200 {
        line.chars().take(200).collect::<String>() + "…"
    } else {
        line.to_string()
    }
}

#[derive(Default)]
struct OpRow {
    cases: usize,
    claimed: usize,
    passed: usize,
    wrong: usize,
    /// The largest error of the wrong cases that had comparable values.
    max_error: Option<f64>,
    crashed: usize,
    declined: usize,
    /// The first reason given for a decline, and the first message of a wrong or crashed case.
    declined_reason: Option<String>,
    problem: Option<String>,
}

/// Prints the per-op table (or JSON); whether nothing was wrong or crashed.
fn report(args: &ConformanceArgs, results: &[serde_json::Value]) -> bool {
    let mut rows: BTreeMap<String, OpRow> = BTreeMap::new();
    for r in results {
        let op = r["op"].as_str().unwrap_or("?");
        let domain = r["domain"].as_str().unwrap_or("");
        let key = if domain.is_empty() || domain == "ai.onnx" {
            op.to_string()
        } else {
            format!("{domain}.{op}")
        };
        let row = rows.entry(key).or_default();
        row.cases += 1;
        let status = r["status"].as_str().unwrap_or("");
        if r["claimed"].as_u64().is_some_and(|c| c > 0) || status == "crashed" {
            row.claimed += 1;
        }
        let message = r["message"].as_str().unwrap_or("").to_string();
        let case = r["case"].as_str().unwrap_or("");
        match status {
            "passed" => row.passed += 1,
            "wrong" => {
                row.wrong += 1;
                if let Some(e) = r["max_abs_error"].as_f64() {
                    row.max_error = Some(row.max_error.map_or(e, |m| m.max(e)));
                }
                row.problem.get_or_insert(format!("{case}: {message}"));
            }
            "crashed" => {
                row.crashed += 1;
                row.problem.get_or_insert(format!("{case}: {message}"));
            }
            "declined" => {
                row.declined += 1;
                row.declined_reason.get_or_insert(message);
            }
            _ => {}
        }
    }
    let total = |f: fn(&OpRow) -> usize| rows.values().map(f).sum::<usize>();
    let (claimed, passed, wrong, crashed, declined) = (
        total(|r| r.claimed),
        total(|r| r.passed),
        total(|r| r.wrong),
        total(|r| r.crashed),
        total(|r| r.declined),
    );
    let ok = wrong == 0 && crashed == 0;
    if args.json {
        let ops: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(op, r)| {
                (
                    op.clone(),
                    json!({ "cases": r.cases, "claimed": r.claimed, "passed": r.passed,
                    "wrong": r.wrong, "max_abs_error": r.max_error, "crashed": r.crashed,
                    "declined": r.declined, "declined_reason": r.declined_reason,
                    "first_problem": r.problem }),
                )
            })
            .collect();
        let doc = json!({ "ep": args.ep, "cases": results, "ops": ops,
            "totals": { "cases": results.len(), "claimed": claimed, "passed": passed,
                        "wrong": wrong, "crashed": crashed, "declined": declined } });
        println!("{doc:#}");
        return ok;
    }
    println!(
        "{:<28} {:>6} {:>8} {:>7} {:>6} {:>10} {:>8} {:>9}",
        "op", "cases", "claimed", "passed", "wrong", "max err", "crashed", "declined"
    );
    for (op, r) in &rows {
        let max = r
            .max_error
            .map_or_else(|| "-".into(), |e| format!("{e:.2e}"));
        println!(
            "{:<28} {:>6} {:>8} {:>7} {:>6} {:>10} {:>8} {:>9}",
            op, r.cases, r.claimed, r.passed, r.wrong, max, r.crashed, r.declined
        );
    }
    let problems: Vec<&String> = rows.values().filter_map(|r| r.problem.as_ref()).collect();
    if !problems.is_empty() {
        println!("\nfirst wrong or crashed case per op:");
        for p in problems {
            println!("  {}", epx::printable(p));
        }
    }
    let reasons: Vec<(String, String)> = rows
        .iter()
        .filter(|(_, r)| r.claimed == 0)
        .filter_map(|(op, r)| r.declined_reason.clone().map(|why| (op.clone(), why)))
        .collect();
    if !reasons.is_empty() {
        println!("\ndeclined, with the host's reason (first case per op):");
        for (op, why) in reasons.iter().take(40) {
            println!("  {}: {}", epx::printable(op), epx::printable(why));
        }
        if reasons.len() > 40 {
            println!(
                "  ... and {} more ops (--json lists every case)",
                reasons.len() - 40
            );
        }
    }
    println!(
        "\n{}: {} cases, {claimed} claimed, {passed} passed, {wrong} wrong, {crashed} crashed, \
         {declined} declined",
        args.ep,
        results.len()
    );
    ok
}
