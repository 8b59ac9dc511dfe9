//! What epx adds on top of ONNX Runtime: the same model run through epx with the `ort_cpu`
//! plugin claiming every node, against ONNX Runtime called directly through `ort`, in ONE process,
//! on the same `libonnxruntime`.
//!
//! - **epx side**: the thin plugin library `libepx_ort_cpu.so` as built in the target folder (the
//!   one `epx run --ep ort_cpu` loads), copied with its `plugin.toml` into a temporary plugin
//!   folder and loaded through discovery, the dependency preflight and `dlopen`. So every call
//!   crosses the C ABI exactly as in production, and the plugin uses its own copy of `ort`. The
//!   EP is `ort_cpu` with `intra_op_num_threads=1` and `error_on_failure`; the session must place
//!   every node on it (`session.providers() == ["ort_cpu"]`). Timed: `Session::run` with a clone
//!   of the input tensors (the API takes them by value) up to the returned host outputs.
//! - **ORT side**: `ort::init_from(<the same library file>)`, `Session::builder` with
//!   `with_intra_threads(1)`, `commit_from_memory(<the model file's bytes>)`. Timed:
//!   `Session::run` with `TensorRef::from_array_view` inputs (zero-copy, like the adapter's) up to
//!   reading each output's data in place with `try_extract_tensor`.
//!
//! Both sides run the same inputs (the model's `.input.*.npy` files) and must agree within 1e-5
//! before anything is timed. After a warm-up, runs alternate epx, ORT, epx, ORT, ... so that
//! frequency changes and noise from other processes hit both sides alike; the table gives the
//! median of each side's run times.
//!
//! Run: `bash plugins/onnxruntime/fetch-runtime.sh && cargo bench -p epx-onnxruntime --bench overhead`.
//! The bench builds the plugin library first (`cargo build --release -p epx-ort-cpu`, a no-op when
//! it is current); `EPX_BENCH_NO_BUILD=1` skips that and uses whatever is in the target folder.
//! `EPX_BENCH_ITERS_SCALE=0.1` runs a tenth of the iterations (smoke test).

use std::borrow::Cow;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use epx::{ElementType, Environment, ExecutionProvider, Tensor};
use epx_tests::examples::{f32s, reference_npy, tensor};
use epx_tests::{TempDir, artifact_dir, library_file_name, repo_root};
use ort::session::{Session as OrtSession, SessionInputValue};
use ort::value::TensorRef;

/// One model of the table.
struct Case {
    /// `examples/models/<stem>.onnx`.
    stem: &'static str,
    warmup: usize,
    iters: usize,
}

const CASES: [Case; 2] = [
    Case {
        stem: "mnist-cnn",
        warmup: 100,
        iters: 500,
    },
    Case {
        stem: "add",
        warmup: 400,
        iters: 2000,
    },
];

/// Target for the ratio on mnist-cnn (epx / ORT, medians).
const MNIST_TARGET: f64 = 1.05;

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("overhead: {msg}");
    std::process::exit(1);
}

/// A float32 model input: the host tensor for epx, and the raw data for ORT.
struct Input {
    name: String,
    tensor: Tensor,
    shape: Vec<i64>,
    data: Vec<f32>,
}

/// The model's `<stem>.input.<name>.npy` files, sorted by name.
fn inputs(stem: &str) -> Vec<Input> {
    reference_npy(stem, "input")
        .into_iter()
        .map(|(name, a)| {
            if a.elem_type != ElementType::Float {
                fail(format!(
                    "{stem} input {name}: only float32 inputs are supported here"
                ));
            }
            Input {
                tensor: tensor(&a),
                shape: a.shape.iter().map(|&d| d as i64).collect(),
                data: f32s(&a.data),
                name,
            }
        })
        .collect()
}

/// Builds the thin `ort_cpu` plugin in the profile this bench was built with, unless told not to.
fn build_plugin(lib: &Path) {
    if std::env::var_os("EPX_BENCH_NO_BUILD").is_some_and(|v| !v.is_empty()) {
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let profile = artifact_dir()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "release".into());
    // `target/release` holds both the `release` and the `bench` profile's outputs.
    let profile_args: &[&str] = match profile.as_str() {
        "debug" => &[],
        "release" => &["--release"],
        other => fail(format!(
            "built into target/{other}: build the plugin yourself (`cargo build --profile \
             {other} -p epx-ort-cpu`) and set EPX_BENCH_NO_BUILD=1"
        )),
    };
    eprintln!(
        "building the ort_cpu plugin: cargo build {} -p epx-ort-cpu",
        profile_args.join(" ")
    );
    let status = Command::new(cargo)
        .args(["build", "--quiet"])
        .args(profile_args)
        .args(["-p", "epx-ort-cpu"])
        .current_dir(repo_root())
        .status()
        .unwrap_or_else(|e| fail(format!("running cargo: {e}")));
    if !status.success() || !lib.is_file() {
        fail(format!(
            "could not build {} (cargo: {status}); build it with `cargo build --release -p \
             epx-ort-cpu` and rerun with EPX_BENCH_NO_BUILD=1",
            lib.display()
        ));
    }
}

fn median(v: &mut [Duration]) -> f64 {
    v.sort_unstable();
    let n = v.len();
    let mid = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    };
    mid.as_secs_f64() * 1e6
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn epx_run(s: &epx::Session, inputs: &[Input]) -> Vec<(String, Tensor)> {
    s.run(
        inputs
            .iter()
            .map(|i| (i.name.as_str(), i.tensor.try_clone().expect("copy"))),
    )
    .unwrap_or_else(|e| fail(format!("epx run: {e}")))
    .into_iter()
    .map(|(n, v)| {
        let t = v
            .into_host()
            .unwrap_or_else(|e| fail(format!("epx output {n}: {e}")));
        (n, t)
    })
    .collect()
}

fn ort_inputs(inputs: &[Input]) -> Vec<(Cow<'_, str>, SessionInputValue<'_>)> {
    inputs
        .iter()
        .map(|i| {
            let v = TensorRef::from_array_view((i.shape.clone(), i.data.as_slice()))
                .unwrap_or_else(|e| fail(format!("ORT input {}: {e}", i.name)));
            (Cow::Borrowed(i.name.as_str()), SessionInputValue::from(v))
        })
        .collect()
}

/// One direct ORT run; calls `each` on every output (name, shape, data) while it is alive.
fn ort_run(s: &mut OrtSession, inputs: &[Input], mut each: impl FnMut(&str, &[i64], &[f32])) {
    let out = s
        .run(ort_inputs(inputs))
        .unwrap_or_else(|e| fail(format!("ORT run: {e}")));
    for (name, value) in out.iter() {
        let (shape, data) = value
            .try_extract_tensor::<f32>()
            .unwrap_or_else(|e| fail(format!("ORT output {name}: {e}")));
        each(name, shape, data);
    }
}

struct Row {
    stem: &'static str,
    nodes: usize,
    iters: usize,
    epx_us: f64,
    ort_us: f64,
    epx_p90: f64,
    ort_p90: f64,
}

fn main() {
    let root = repo_root();
    let models = root.join("examples/models");
    let capi = root.join(".testdata/onnxruntime/capi");
    let Some(ort_lib) = epx_onnxruntime::locate::library_in(&capi) else {
        fail(format!(
            "no ONNX Runtime in {}: run `bash plugins/onnxruntime/fetch-runtime.sh` first",
            capi.display()
        ))
    };
    let ort_lib = ort_lib.canonicalize().unwrap_or(ort_lib);
    // SAFETY: first thing in main, before any thread exists or anything reads the environment.
    // The plugin's adapter then loads exactly this file (EPX_ORT_LIBRARY comes before every
    // folder search), the same one `ort::init_from` gets below.
    unsafe { std::env::set_var("EPX_ORT_LIBRARY", &ort_lib) };

    let plugin_lib = artifact_dir().join(library_file_name("epx_ort_cpu"));
    build_plugin(&plugin_lib);
    if !plugin_lib.is_file() {
        fail(format!(
            "{} is missing: `cargo build --release -p epx-ort-cpu`",
            plugin_lib.display()
        ));
    }
    let plugin_dir = TempDir::new("ort-overhead").unwrap_or_else(|e| fail(e));
    let manifest =
        std::fs::read_to_string(root.join("plugins/onnxruntime/eps/ort_cpu/plugin.toml"))
            .unwrap_or_else(|e| fail(format!("ort_cpu plugin.toml: {e}")));
    plugin_dir
        .add_plugin("ort_cpu", &plugin_lib, Some(&manifest))
        .unwrap_or_else(|e| fail(format!("copying the plugin: {e}")));
    let env: Arc<Environment> = Environment::builder()
        .with_plugin_dirs([plugin_dir.path()])
        .commit()
        .unwrap_or_else(|e| fail(format!("environment: {e}")));
    if !env.discovery().problems.is_empty() {
        fail(format!("plugin discovery: {:?}", env.discovery().problems));
    }

    // The direct side: this binary's own copy of `ort` (the plugin library has another).
    let ort_env = ort::init_from(&ort_lib)
        .unwrap_or_else(|e| fail(format!("ort::init_from({}): {e}", ort_lib.display())))
        .with_name("direct")
        .build()
        .unwrap_or_else(|e| fail(format!("ORT environment: {e}")));

    let scale: f64 = std::env::var("EPX_BENCH_ITERS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(1.0);

    println!("ONNX Runtime CPU through epx (ort_cpu plugin) vs directly (ort), one process");
    println!("  library: {}", ort_lib.display());
    println!(
        "  plugin:  {} (dlopen'd from a temp plugin folder)",
        plugin_lib.display()
    );
    println!("  intra-op threads: 1 on both sides; runs alternate epx/ORT after a warm-up");

    let mut rows = Vec::new();
    for case in &CASES {
        let path = models.join(format!("{}.onnx", case.stem));
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
        let inputs = inputs(case.stem);

        let epx_session = epx::Session::builder()
            .and_then(|b| {
                b.with_environment(env.clone())
                    .with_execution_providers([ExecutionProvider::new("ort_cpu")
                        .with_option("intra_op_num_threads", "1")
                        .error_on_failure()])
            })
            .and_then(|b| b.commit_from_memory(&bytes))
            .unwrap_or_else(|e| fail(format!("epx session for {}: {e}", case.stem)));
        if epx_session.providers() != ["ort_cpu"] {
            fail(format!(
                "{}: nodes placed on {:?}, want every node on ort_cpu",
                case.stem,
                epx_session.providers()
            ));
        }
        let nodes = epx_session.model().graph.nodes.len();
        let mut ort_session = OrtSession::builder(&ort_env)
            .map_err(|e| e.to_string())
            .and_then(|b| b.with_intra_threads(1).map_err(|e| e.to_string()))
            .and_then(|mut b| b.commit_from_memory(&bytes).map_err(|e| e.to_string()))
            .unwrap_or_else(|e| fail(format!("ORT session for {}: {e}", case.stem)));

        // Same answers first.
        let got = epx_run(&epx_session, &inputs);
        let mut checked = 0;
        ort_run(&mut ort_session, &inputs, |name, shape, data| {
            let Some((_, t)) = got.iter().find(|(n, _)| n == name) else {
                fail(format!("{}: epx has no output {name}", case.stem));
            };
            let want_shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            if t.shape() != want_shape.as_slice() || t.elem_type() != ElementType::Float {
                fail(format!(
                    "{} {name}: epx gives {} {:?}, ORT float {:?}",
                    case.stem,
                    t.elem_type(),
                    t.shape(),
                    shape
                ));
            }
            let e = f32s(t.bytes().unwrap_or_default());
            for (i, (a, b)) in e.iter().zip(data).enumerate() {
                if (a - b).abs() > 1e-5 {
                    fail(format!("{} {name}[{i}]: epx {a} vs ORT {b}", case.stem));
                }
            }
            checked += 1;
        });
        if checked != got.len() {
            fail(format!(
                "{}: ORT gave {checked} outputs, epx {}",
                case.stem,
                got.len()
            ));
        }

        let warmup = ((case.warmup as f64 * scale).ceil() as usize).max(1);
        let iters = ((case.iters as f64 * scale).ceil() as usize).max(1);
        for _ in 0..warmup {
            std::hint::black_box(epx_run(&epx_session, &inputs));
            ort_run(&mut ort_session, &inputs, |_, s, d| {
                std::hint::black_box((s, d));
            });
        }
        let mut t_epx = Vec::with_capacity(iters);
        let mut t_ort = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            let out = epx_session
                .run(
                    inputs
                        .iter()
                        .map(|i| (i.name.as_str(), i.tensor.try_clone().expect("copy"))),
                )
                .unwrap_or_else(|e| fail(format!("epx run: {e}")));
            std::hint::black_box(&out);
            drop(out);
            t_epx.push(t0.elapsed());

            let t0 = Instant::now();
            ort_run(&mut ort_session, &inputs, |_, s, d| {
                std::hint::black_box((s, d));
            });
            t_ort.push(t0.elapsed());
        }
        let epx_us = median(&mut t_epx);
        let ort_us = median(&mut t_ort);
        rows.push(Row {
            stem: case.stem,
            nodes,
            iters,
            epx_us,
            ort_us,
            epx_p90: percentile(&t_epx, 0.9),
            ort_p90: percentile(&t_ort, 0.9),
        });
    }

    println!();
    println!(
        "| model | nodes | iterations (each side) | epx median µs | ORT median µs | epx/ORT | epx − ORT µs | epx p90 µs | ORT p90 µs |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.3} | {:.1} | {:.1} | {:.1} |",
            r.stem,
            r.nodes,
            r.iters,
            r.epx_us,
            r.ort_us,
            r.epx_us / r.ort_us,
            r.epx_us - r.ort_us,
            r.epx_p90,
            r.ort_p90
        );
    }
    println!();
    for r in &rows {
        match r.stem {
            "mnist-cnn" => {
                let ratio = r.epx_us / r.ort_us;
                println!(
                    "mnist-cnn: epx/ORT = {ratio:.3} (target ≤ {MNIST_TARGET:.2}): {}",
                    if ratio <= MNIST_TARGET {
                        "met"
                    } else {
                        "MISSED"
                    }
                );
            }
            "add" => println!(
                "add (one Add of two [1,4]): epx adds {:.1} µs per run over ORT ({:.1} vs {:.1} µs)",
                r.epx_us - r.ort_us,
                r.epx_us,
                r.ort_us
            ),
            _ => {}
        }
    }
}
