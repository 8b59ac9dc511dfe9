//! The ONNX backend node tests run through the host on the CPU EP, in two sets fetched by
//! `tests/fetch-testdata.sh`: the data shipped in the `onnx==1.22.0` wheel, and the cases that
//! onnx 1.23.2's case scripts generate (that wheel ships no data).
//!
//! Each prints `N passed, M failed` and a per-op table. `conformance/expected_failures.txt`
//! (1.22.0) and `conformance/expected_failures-1.23.2.txt` list the cases known to fail, each with
//! a one-line reason: the test fails when an unlisted case fails, and when a listed case passes
//! (so the lists only ever shrink). Set `EPX_CONFORMANCE_UPDATE=1` to rewrite the lists from the
//! current results. The 1.23.2 list also names how many cases ONNX Runtime 1.31.1 passes
//! (`tests/conformance/ort_node_tests.py`); fewer than that fails the test.
//!
//! The 1.22.0 run generates `docs/ops.md`, the table of the CPU EP's operators: op, opset ranges
//! (from the kernel registry), the element types of the inputs of the node tests that pass, and
//! the node tests passed. The test fails when the committed file is stale; the same variable
//! rewrites it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use epx::ir::ValueType;
use epx::onnx::load_model_file;
use epx::{Environment, Session};
use epx_io::compare::{Tolerance, check_value};
use epx_io::nodetest::{data_sets, read_data_set};

/// One set of node tests: where its cases are and where its list of known failures is.
struct Suite {
    onnx: &'static str,
    data: PathBuf,
    list: PathBuf,
    /// Whether this set writes `docs/ops.md`.
    ops_doc: bool,
}

impl Suite {
    fn onnx_1_22() -> Self {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        Suite {
            onnx: "1.22.0",
            data: match std::env::var_os("EPX_ONNX_NODE_TESTS") {
                Some(d) => PathBuf::from(d),
                None => here.join("../.testdata/onnx-node"),
            },
            list: here.join("conformance/expected_failures.txt"),
            ops_doc: true,
        }
    }

    fn onnx_1_23() -> Self {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        Suite {
            onnx: "1.23.2",
            data: here.join("../.testdata/onnx-node-1.23.2"),
            list: here.join("conformance/expected_failures-1.23.2.txt"),
            ops_doc: false,
        }
    }
}

/// What one case tests: its op (`(domain, op_type)` of a one-node model) and the element types
/// of the graph's tensor inputs.
struct CaseInfo {
    op: String,
    domain: String,
    types: BTreeSet<String>,
}

/// The outcome of one case: `Ok` or a one-line reason.
fn run_case(env: &Arc<Environment>, dir: &Path) -> (CaseInfo, Result<(), String>) {
    let model = match load_model_file(&dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => {
            return (
                CaseInfo {
                    op: "(load)".into(),
                    domain: String::new(),
                    types: BTreeSet::new(),
                },
                Err(format!("load: {}", strip(&e.to_string(), dir))),
            );
        }
    };
    let (op, domain) = match model.graph.nodes.as_slice() {
        [one] => (one.op_type.clone(), one.domain.clone()),
        _ => ("(multi-node)".into(), String::new()),
    };
    let types = model
        .graph
        .inputs
        .iter()
        .filter_map(|&v| match &model.graph.values[v].ty {
            epx::ir::ValueType::Tensor {
                elem_type: Some(t), ..
            } => Some(t.to_string()),
            _ => None,
        })
        .collect();
    let op = CaseInfo { op, domain, types };
    let named = |ids: &[usize]| -> Vec<(String, ValueType)> {
        ids.iter()
            .map(|&v| {
                let v = &model.graph.values[v];
                (v.name.clone(), v.ty.clone())
            })
            .collect()
    };
    let inputs = named(&model.graph.inputs);
    let outputs = named(&model.graph.outputs);
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
    let sets = data_sets(dir);
    for set in sets {
        let result = (|| -> Result<(), String> {
            let feed =
                read_data_set(&set, "input", &inputs).map_err(|e| first_line(&strip(&e, dir)))?;
            let expected =
                read_data_set(&set, "output", &outputs).map_err(|e| first_line(&strip(&e, dir)))?;
            let got = session
                .run(feed)
                .map_err(|e| first_line(&format!("run: {e}")))?;
            for (name, want) in &expected {
                let have = got
                    .value(name)
                    .ok_or_else(|| format!("output `{name}` missing"))?;
                check_value(name, have, want, Tolerance::NODE_TESTS)?;
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

fn read_expected(list: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(list).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once('#') {
            Some((case, reason)) => (case.trim().to_string(), reason.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

/// `# onnxruntime 1.31.1 passes N` in a list: the floor this set must reach.
fn ort_passes(list: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(list).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix("# onnxruntime 1.31.1 passes ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn onnx_node_tests_on_the_cpu_ep() {
    run_suite(Suite::onnx_1_22());
}

/// onnx 1.23.2's cases: the newest operator versions (Attention-24/25, opset 28, IR version 14).
#[test]
fn onnx_node_tests_on_the_cpu_ep_1_23() {
    run_suite(Suite::onnx_1_23());
}

fn run_suite(suite: Suite) {
    let dir = suite.data.clone();
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
    let mut per_op: BTreeMap<(String, String), OpTally> = BTreeMap::new();
    let mut failures: BTreeMap<String, String> = BTreeMap::new();
    let mut passed = 0;
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let (info, result) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&env, case)))
                .unwrap_or_else(|p| {
                    (
                        CaseInfo {
                            op: "(panic)".into(),
                            domain: String::new(),
                            types: BTreeSet::new(),
                        },
                        Err(format!(
                            "PANIC: {}",
                            epx_plugin_api::sdk::panic_message(p.as_ref())
                        )),
                    )
                });
        let domain = epx::ir::normalize_domain(&info.domain).to_string();
        let entry = per_op.entry((domain, info.op)).or_default();
        entry.cases += 1;
        match result {
            Ok(()) => {
                passed += 1;
                entry.passed += 1;
                entry.types.extend(info.types);
            }
            Err(reason) => {
                failures.insert(name, reason);
            }
        }
    }
    println!("\n{:<32} {:>6} {:>6}", "op", "passed", "cases");
    for ((_, op), t) in &per_op {
        println!("{op:<32} {:>6} {:>6}", t.passed, t.cases);
    }
    println!(
        "\nconformance (onnx {}): {passed} passed, {} failed (CPU EP kernels: {})",
        suite.onnx,
        failures.len(),
        epx_cpu::fast::process_isa().name
    );

    let ops_doc = ops_table(&per_op, passed, cases.len());
    let ops_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ops.md");
    let floor = ort_passes(&suite.list);
    if std::env::var_os("EPX_CONFORMANCE_UPDATE").is_some() {
        if suite.ops_doc {
            std::fs::write(&ops_path, &ops_doc).unwrap();
            println!("rewrote {}", ops_path.display());
        }
        let mut text = format!(
            "# ONNX node tests (onnx {}) the CPU EP does not pass yet, with the reason.\n\
             # Regenerate with: EPX_CONFORMANCE_UPDATE=1 cargo test -p epx-tests --test conformance\n",
            suite.onnx
        );
        if let Some(n) = floor {
            text.push_str(&format!(
                "# onnxruntime 1.31.1 passes {n} (tests/conformance/ort_node_tests.py); fewer fails the test\n"
            ));
        }
        for (case, reason) in &failures {
            text.push_str(&format!("{case}  # {}\n", reason.replace('\n', " ")));
        }
        std::fs::write(&suite.list, text).unwrap();
        println!("rewrote {}", suite.list.display());
        return;
    }
    if let Some(n) = floor {
        assert!(
            passed >= n,
            "onnx {}: {passed} node tests pass, fewer than ONNX Runtime 1.31.1's {n}",
            suite.onnx
        );
    }
    let expected = read_expected(&suite.list);
    let failed: BTreeSet<&String> = failures.keys().collect();
    let new_failures: Vec<String> = failures
        .iter()
        .filter(|(c, _)| !expected.contains_key(*c))
        .map(|(c, r)| format!("  {c}: {r}"))
        .collect();
    let now_passing: Vec<&String> = expected.keys().filter(|c| !failed.contains(c)).collect();
    let committed = std::fs::read_to_string(&ops_path).unwrap_or_default();
    assert!(
        !suite.ops_doc || committed == ops_doc,
        "{} is stale; regenerate it with EPX_CONFORMANCE_UPDATE=1 cargo test -p epx-tests --test conformance",
        ops_path.display()
    );
    assert!(
        new_failures.is_empty() && now_passing.is_empty(),
        "onnx {} conformance differs from {}:\n{} case(s) fail that are not listed:\n{}\n{} listed case(s) now pass (remove them from the list): {:?}",
        suite.onnx,
        suite.list.display(),
        new_failures.len(),
        new_failures.join("\n"),
        now_passing.len(),
        now_passing
    );
}

/// Node tests of one op: passed, total, and the input element types of the passing ones.
#[derive(Default)]
struct OpTally {
    passed: usize,
    cases: usize,
    types: BTreeSet<String>,
}

/// Opset ranges of one op's kernels, merged where they touch: `7+`, `1-12, 14+`.
fn opset_ranges(mut ranges: Vec<(i64, i64)>) -> String {
    ranges.sort();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
        .iter()
        .map(|&(a, b)| match b {
            i64::MAX => format!("{a}+"),
            b if a == b => a.to_string(),
            b => format!("{a}-{b}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `docs/ops.md`: every op the CPU EP registers, with its opsets, and the node-test evidence.
fn ops_table(per_op: &BTreeMap<(String, String), OpTally>, passed: usize, total: usize) -> String {
    let registry = epx_cpu::ops::registry();
    let mut ops: BTreeMap<(String, String), Vec<(i64, i64)>> = BTreeMap::new();
    for s in registry.schemas() {
        let domain = epx::ir::normalize_domain(s.domain).to_string();
        ops.entry((domain, s.op_type.to_string()))
            .or_default()
            .push((s.since_version, s.until_version));
    }
    for (op, since) in epx_cpu::kernel::CONTROL_FLOW_OPSETS {
        ops.entry((String::new(), op.to_string()))
            .or_default()
            .push((since, i64::MAX));
    }
    let mut text = format!(
        "# Operators of the CPU EP\n\n\
         Generated by `EPX_CONFORMANCE_UPDATE=1 cargo test -p epx-tests --test conformance` (do not \
         edit; the conformance test fails when this file is stale).\n\n\
         - **opsets**: the opset versions the CPU EP's kernels are registered for \
         (`plugins/cpu/src/ops`); `13+` means 13 and every later version.\n\
         - **input types**: the element types of the graph inputs of the ONNX node tests \
         (onnx 1.22.0) that pass for the op: what is proven, not everything the kernel accepts.\n\
         - **node tests**: passed / cases for the op; the failing ones are listed with a reason in \
         `tests/conformance/expected_failures.txt`.\n\n\
         {} operators; node tests: {passed} of {total} pass.\n\n\
         | op | domain | opsets | input types (passing node tests) | node tests |\n\
         |---|---|---|---|---|\n",
        ops.len()
    );
    for ((domain, op), ranges) in &ops {
        let key = (domain.clone(), op.clone());
        let (types, tests) = match per_op.get(&key) {
            Some(t) if t.passed > 0 => (
                t.types.iter().cloned().collect::<Vec<_>>().join(", "),
                format!("{}/{}", t.passed, t.cases),
            ),
            Some(t) => ("—".to_string(), format!("0/{}", t.cases)),
            None => ("—".to_string(), "no node tests".to_string()),
        };
        let domain = if domain.is_empty() { "ai.onnx" } else { domain };
        text.push_str(&format!(
            "| {op} | {domain} | {} | {types} | {tests} |\n",
            opset_ranges(ranges.clone())
        ));
    }
    let missing: Vec<String> = per_op
        .iter()
        .filter(|((d, op), _)| !ops.contains_key(&(d.clone(), op.clone())) && !op.starts_with('('))
        .map(|((d, op), t)| {
            let d = if d.is_empty() {
                String::new()
            } else {
                format!("{d}:")
            };
            format!("{d}{op} ({})", t.cases)
        })
        .collect();
    if !missing.is_empty() {
        text.push_str(&format!(
            "\nOps with node tests but no CPU kernel (cases): {}.\n",
            missing.join(", ")
        ));
    }
    text
}
