//! The two small example EPs, `toy` in Rust (`examples/rust-plugin`, with the SDK) and `toy_c`
//! in C (`examples/c-toy`, with the header's helpers): each with its manifest as shipped, loaded
//! from a plugin folder, run on a model whose Relu and Add it claims and whose Sigmoid and
//! broadcasting Add fall back to the CPU EP; their results equal the CPU EP's bit for bit. Each
//! stays the small example it is meant to be (60 and 120 lines).
//!
//! Needs `cargo build --workspace` first (the Rust plugin is a cdylib crate) and `cc` for the C
//! one (skipped, saying so, without it).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use epx::onnx::proto;
use epx::{Environment, ExecutionProvider, Session, Tensor};
use epx_tests::models::{float_value, model_bytes, node};
use epx_tests::{TempDir, built_library, library_file_name, repo_root};

/// x → Relu → r; Add(r, x) → s; Sigmoid(s) → y; and Add(y, b) with `b` of another shape
/// (broadcast), which `toy` must leave to the CPU EP.
fn model() -> Vec<u8> {
    model_bytes(proto::GraphProto {
        name: Some("relu_add_sigmoid".into()),
        node: vec![
            node("Relu", &["x"], &["r"]),
            node("Add", &["r", "x"], &["s"]),
            node("Sigmoid", &["s"], &["y"]),
            node("Add", &["y", "b"], &["z"]),
        ],
        input: vec![float_value("x", &[2, 3]), float_value("b", &[3])],
        output: vec![float_value("z", &[2, 3])],
        ..Default::default()
    })
}

/// A plugin folder holding `library` under the example's own `plugin.toml`.
fn plugin_dir(example: &str, library: &Path) -> TempDir {
    let dir = TempDir::new(example).expect("temp dir");
    let manifest = std::fs::read_to_string(repo_root().join(example).join("plugin.toml"))
        .expect("the example's plugin.toml");
    dir.add_plugin("plugin", library, Some(&manifest))
        .expect("copy the example plugin");
    dir
}

fn run(env: &Arc<Environment>, eps: Vec<ExecutionProvider>) -> (Vec<String>, Vec<f32>) {
    let s = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers(eps)
        })
        .and_then(|b| b.commit_from_memory(&model()))
        .expect("session");
    let x = Tensor::from_array(
        ndarray::Array::from_shape_vec((2, 3), vec![-1.5, 0.0, 2.0, -0.25, f32::NAN, -4.0])
            .expect("x"),
    );
    let b = Tensor::from_array(ndarray::arr1(&[0.5f32, -1.0, 2.0]).into_dyn());
    let out = s.run([("x", x), ("b", b)]).expect("run");
    let z = out["z"].as_slice::<f32>().expect("f32").to_vec();
    (
        s.node_placement().iter().map(|p| p.to_string()).collect(),
        z,
    )
}

/// The example EP `ep` in `dir` claims Relu and the same-shape Add, computes what the CPU EP
/// computes, and refuses an option it does not take.
fn check_example(dir: &TempDir, ep: &str) {
    let env = Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment");
    let (placed, got) = run(&env, vec![ExecutionProvider::new(ep).error_on_failure()]);
    assert_eq!(placed, [ep, ep, "cpu", "cpu"]);
    let (_, want) = run(&env, vec![]);
    // Bit for bit, NaN included (Relu keeps a NaN, as the CPU EP does).
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let e = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([ExecutionProvider::new(ep)
                    .with_option("colour", "red")
                    .error_on_failure()])
        })
        .and_then(|b| b.commit_from_memory(&model()))
        .err()
        .expect("an unknown option is an error")
        .to_string();
    assert!(e.contains("colour"), "{e}");
}

/// `epx conformance --ep ep` on the Relu and Add node tests: the example claims some, passes
/// what it claims, and crashes on none.
fn check_conformance(dir: &TempDir, ep: &str) {
    let Some((code, out)) = epx_tests::run_conformance(dir.path(), ep, "test_relu,test_add", &[])
    else {
        return;
    };
    let (_, claimed, passed, wrong, crashed, _) = epx_tests::conformance_totals(&out);
    assert!(claimed >= 3, "{out}");
    assert_eq!((passed, wrong, crashed), (claimed, 0, 0), "{out}");
    assert_eq!(code, Some(0), "{out}");
}

fn line_count(file: &str) -> usize {
    let path = repo_root().join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .count()
}

#[test]
fn the_rust_example_runs_relu_and_add_and_matches_the_cpu_ep() {
    let dir = plugin_dir("examples/rust-plugin", &built_library("epx_toy"));
    check_example(&dir, "toy");
    check_conformance(&dir, "toy");
}

#[test]
fn the_c_example_runs_relu_and_add_and_matches_the_cpu_ep() {
    let have_cc = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_cc {
        eprintln!("skipping: `cc` was not found, so the C example cannot be built");
        return;
    }
    let build = TempDir::new("c-toy-build").expect("temp dir");
    let lib = build.path().join(library_file_name("epx_c_toy"));
    // The build command in the file's own comment, warnings as errors.
    let out = Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-O2",
            "-shared",
        ])
        .args(["-fPIC", "-I"])
        .arg(repo_root().join("include"))
        .arg(repo_root().join("examples/c-toy/epx_c_toy.c"))
        .arg("-o")
        .arg(&lib)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = plugin_dir("examples/c-toy", &lib);
    check_example(&dir, "toy_c");
    check_conformance(&dir, "toy_c");
}

#[test]
fn the_c_example_stays_within_120_lines() {
    let lines = line_count("examples/c-toy/epx_c_toy.c");
    assert!(lines <= 120, "examples/c-toy/epx_c_toy.c has {lines} lines");
}

#[test]
fn the_rust_example_stays_within_60_lines() {
    let path = repo_root().join("examples/rust-plugin/src/lib.rs");
    let lines = std::fs::read_to_string(&path)
        .expect("read")
        .lines()
        .count();
    assert!(lines <= 60, "{} has {lines} lines", path.display());
}

#[test]
fn the_abi_walk_through_shows_the_example_as_it_is() {
    let doc = std::fs::read_to_string(repo_root().join("docs/ABI.md")).expect("docs/ABI.md");
    let section = doc
        .split("## 10. Writing a plugin in Rust with the SDK")
        .nth(1)
        .and_then(|s| s.split("## 11.").next())
        .expect("section 10");
    let shown = section
        .split("```rust\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a rust block in section 10");
    let source = std::fs::read_to_string(repo_root().join("examples/rust-plugin/src/lib.rs"))
        .expect("the example's source");
    assert_eq!(
        shown, source,
        "docs/ABI.md §10 differs from examples/rust-plugin/src/lib.rs"
    );
}

/// `epx-plugin-api` stands alone: a copy of its folder, outside any workspace, builds the Rust
/// example as a third party's crate would (a path dependency, no checkout of the rest).
#[test]
fn the_rust_example_builds_against_a_standalone_copy_of_plugin_api() {
    let root = TempDir::new("standalone-sdk").expect("temp dir");
    let sdk = root.path().join("epx-plugin-api");
    copy_dir(&repo_root().join("plugin-api"), &sdk);
    let crate_dir = root.path().join("toy");
    std::fs::create_dir_all(crate_dir.join("src")).expect("mkdir");
    std::fs::copy(
        repo_root().join("examples/rust-plugin/src/lib.rs"),
        crate_dir.join("src/lib.rs"),
    )
    .expect("copy lib.rs");
    std::fs::write(
        crate_dir.join("Cargo.toml"),
        "[package]\nname = \"epx-toy\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
         [lib]\nname = \"epx_toy\"\ncrate-type = [\"cdylib\"]\n\n\
         [dependencies]\nepx-plugin-api = { path = \"../epx-plugin-api\" }\n\n[workspace]\n",
    )
    .expect("write Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", root.path().join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "the example does not build against a standalone copy of plugin-api:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = root
        .path()
        .join("target/debug")
        .join(library_file_name("epx_toy"));
    assert!(lib.is_file(), "{} was not built", lib.display());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}
