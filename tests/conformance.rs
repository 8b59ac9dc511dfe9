//! The ONNX backend node tests (from the `onnx==1.22.0` wheel, fetched by
//! `tests/fetch-testdata.sh`) run through the host on the CPU EP.
//!
//! Prints `N passed, M failed` and a per-op table. `conformance/expected_failures.txt` lists
//! the cases known to fail, each with a one-line reason: the test fails when an unlisted case
//! fails, and when a listed case passes (so the list only ever shrinks). Set
//! `EPX_CONFORMANCE_UPDATE=1` to rewrite the list from the current results.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use epx::onnx::{load_model_file, load_tensor_bytes};
use epx::{ElementType, Environment, Session, Tensor};

const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-5;

fn data_dir() -> PathBuf {
    match std::env::var_os("EPX_ONNX_NODE_TESTS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.testdata/onnx-node"),
    }
}

fn list_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/expected_failures.txt")
}

/// The outcome of one case: `Ok` or a one-line reason.
fn run_case(env: &Arc<Environment>, dir: &Path) -> (String, Result<(), String>) {
    let model = match load_model_file(&dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => {
            return (
                "(load)".into(),
                Err(format!("load: {}", strip(&e.to_string(), dir))),
            );
        }
    };
    let op = match model.graph.nodes.as_slice() {
        [one] => one.op_type.clone(),
        _ => "(multi-node)".into(),
    };
    let inputs: Vec<String> = model
        .graph
        .inputs
        .iter()
        .map(|&v| model.graph.values[v].name.clone())
        .collect();
    let outputs: Vec<String> = model
        .graph
        .outputs
        .iter()
        .map(|&v| model.graph.values[v].name.clone())
        .collect();
    let session = match Session::builder()
        .and_then(|b| b.with_environment(env.clone()).commit_from_model(model))
    {
        Ok(s) => s,
        Err(e) => {
            return (
                op,
                Err(first_line(&format!(
                    "session: {}",
                    strip(&e.to_string(), dir)
                ))),
            );
        }
    };
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    sets.sort();
    for set in sets {
        let result = (|| -> Result<(), String> {
            let feed = read_tensors(&set, "input", &inputs).map_err(|e| strip(&e, dir))?;
            let expected = read_tensors(&set, "output", &outputs).map_err(|e| strip(&e, dir))?;
            let got = session
                .run(feed)
                .map_err(|e| first_line(&format!("run: {e}")))?;
            for (name, want) in &expected {
                let have = got
                    .get(name)
                    .ok_or_else(|| format!("output `{name}` missing"))?;
                compare(name, have, want)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            return (op, Err(e));
        }
    }
    (op, Ok(()))
}

/// Messages name files relative to the case folder, so the list does not depend on where the
/// data lives.
fn strip(s: &str, dir: &Path) -> String {
    s.replace(&format!("{}/", dir.display()), "")
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("").to_string();
    if line.chars().count() > 160 {
        line.chars().take(160).collect::<String>() + "…"
    } else {
        line
    }
}

/// `input_K.pb` (or `output_K.pb`) of a data set, named after the model's K-th input/output.
fn read_tensors(
    set: &Path,
    prefix: &str,
    names: &[String],
) -> Result<Vec<(String, Tensor)>, String> {
    let mut out = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let path = set.join(format!("{prefix}_{k}.pb"));
        if !path.exists() {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (_, t) = load_tensor_bytes(&bytes, &format!("test data {prefix}_{k}.pb"))
            .map_err(|e| first_line(&e.to_string()))?;
        out.push((name.clone(), t));
    }
    Ok(out)
}

fn as_f64(t: &Tensor) -> Option<Vec<f64>> {
    Some(match t.elem_type() {
        ElementType::Float => t.as_slice::<f32>()?.iter().map(|&x| f64::from(x)).collect(),
        ElementType::Double => t.as_slice::<f64>()?.to_vec(),
        ElementType::Float16 => t
            .as_slice::<half::f16>()?
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        ElementType::Bfloat16 => t
            .as_slice::<half::bf16>()?
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        _ => return None,
    })
}

fn compare(name: &str, have: &Tensor, want: &Tensor) -> Result<(), String> {
    if have.elem_type() != want.elem_type() {
        return Err(format!(
            "output `{name}`: type {} instead of {}",
            have.elem_type(),
            want.elem_type()
        ));
    }
    if have.shape() != want.shape() {
        return Err(format!(
            "output `{name}`: shape {:?} instead of {:?}",
            have.shape(),
            want.shape()
        ));
    }
    if let (Some(h), Some(w)) = (as_f64(have), as_f64(want)) {
        for (i, (a, b)) in h.iter().zip(&w).enumerate() {
            let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= ATOL + RTOL * b.abs();
            if !ok {
                return Err(format!("output `{name}`: element {i} is {a}, expected {b}"));
            }
        }
        return Ok(());
    }
    if have != want {
        return Err(format!("output `{name}`: values differ"));
    }
    Ok(())
}

fn read_expected() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(list_path()).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once('#') {
            Some((case, reason)) => (case.trim().to_string(), reason.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

#[test]
fn onnx_node_tests_on_the_cpu_ep() {
    let dir = data_dir();
    assert!(
        dir.is_dir(),
        "ONNX node tests not found at {}; run `bash tests/fetch-testdata.sh` (the README's test command does)",
        dir.display()
    );
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    let env = Environment::builder().commit().unwrap();
    let mut per_op: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut failures: BTreeMap<String, String> = BTreeMap::new();
    let mut passed = 0;
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let (op, result) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&env, case)))
                .unwrap_or_else(|p| {
                    (
                        "(panic)".into(),
                        Err(format!(
                            "PANIC: {}",
                            epx_plugin_api::sdk::panic_message(p.as_ref())
                        )),
                    )
                });
        let entry = per_op.entry(op).or_default();
        entry.1 += 1;
        match result {
            Ok(()) => {
                passed += 1;
                entry.0 += 1;
            }
            Err(reason) => {
                failures.insert(name, reason);
            }
        }
    }
    println!("\n{:<32} {:>6} {:>6}", "op", "passed", "cases");
    for (op, (p, n)) in &per_op {
        println!("{op:<32} {p:>6} {n:>6}");
    }
    println!("\nconformance: {passed} passed, {} failed", failures.len());

    if std::env::var_os("EPX_CONFORMANCE_UPDATE").is_some() {
        let mut text = String::from(
            "# ONNX node tests (onnx 1.22.0) the CPU EP does not pass yet, with the reason.\n\
             # Regenerate with: EPX_CONFORMANCE_UPDATE=1 cargo test -p epx-tests --test conformance\n",
        );
        for (case, reason) in &failures {
            text.push_str(&format!("{case}  # {}\n", reason.replace('\n', " ")));
        }
        std::fs::write(list_path(), text).unwrap();
        println!("rewrote {}", list_path().display());
        return;
    }
    let expected = read_expected();
    let failed: BTreeSet<&String> = failures.keys().collect();
    let new_failures: Vec<String> = failures
        .iter()
        .filter(|(c, _)| !expected.contains_key(*c))
        .map(|(c, r)| format!("  {c}: {r}"))
        .collect();
    let now_passing: Vec<&String> = expected.keys().filter(|c| !failed.contains(c)).collect();
    assert!(
        new_failures.is_empty() && now_passing.is_empty(),
        "conformance differs from {}:\n{} case(s) fail that are not listed:\n{}\n{} listed case(s) now pass (remove them from the list): {:?}",
        list_path().display(),
        new_failures.len(),
        new_failures.join("\n"),
        now_passing.len(),
        now_passing
    );
}
