//! The `epx` binary as an operator uses it: outputs, `.npy` files, exit codes, and one clear
//! error line on stderr for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn epx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(args)
        .current_dir(repo())
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("RUST_LOG")
        .output()
        .expect("run epx")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh folder under the system temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("epx-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts a failed run printed exactly one line, `error: ...`, and no panic.
fn assert_one_error_line(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure; stdout: {}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    lines[0].to_string()
}

#[test]
fn run_writes_outputs_that_match_the_reference() {
    let dir = Scratch::new("run");
    let out_dir = dir.0.join("out");
    let out = epx(&[
        "run",
        "examples/models/mlp-int.onnx",
        "--input",
        "x=examples/models/mlp-int.input.x.npy",
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--repeat",
        "3",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("output y: int64 [2, 5]"), "{stdout}");
    assert!(stdout.contains("latency over 3 runs: min"), "{stdout}");
    for name in ["y", "shape"] {
        let got = epx::npy::read_npy(&out_dir.join(format!("{name}.npy"))).unwrap();
        let want =
            epx::npy::read_npy(&repo().join(format!("examples/models/mlp-int.output.{name}.npy")))
                .unwrap();
        assert_eq!(
            (got.elem_type, &got.shape, &got.data),
            (want.elem_type, &want.shape, &want.data),
            "{name}"
        );
    }
}

#[test]
fn run_makes_random_inputs_when_none_are_given() {
    let out = epx(&["run", "examples/models/mnist-cnn.onnx"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("input  image: float32 [1, 1, 28, 28]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("output probabilities: float32 [1, 10]"),
        "{stdout}"
    );
    assert!(stdout.contains("cpu: 11 nodes"), "{stdout}");
}

#[test]
fn bad_input_gets_one_clear_line() {
    let dir = Scratch::new("bad");
    let junk = dir.0.join("notes.onnx");
    std::fs::write(&junk, "these are my notes, not a model\n").unwrap();
    let line = assert_one_error_line(&epx(&["run", junk.to_str().unwrap()]));
    assert!(
        line.contains("notes.onnx") && line.contains("not a valid ONNX model"),
        "{line}"
    );

    let line = assert_one_error_line(&epx(&["run", "no/such/model.onnx"]));
    assert!(
        line.contains("no/such/model.onnx") && line.contains("No such file"),
        "{line}"
    );

    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--ep",
        "warp-drive",
    ]));
    assert!(
        line.contains("`warp-drive`: no plugin provides it; known EPs: cpu"),
        "{line}"
    );

    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--input",
        "c=x.npy",
    ]));
    assert!(line.contains("no input `c`; its inputs: a, b"), "{line}");

    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--input",
        "a=missing.npy",
    ]));
    assert!(line.contains("missing.npy"), "{line}");

    // An input of the wrong type is refused with both types named.
    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--input",
        "a=examples/models/mlp-int.output.y.npy",
    ]));
    assert!(
        line.contains("input `a` must be float32, got int64"),
        "{line}"
    );
}

#[test]
fn providers_and_doctor_report_a_plugin_folder() {
    let dir = Scratch::new("plugins");
    let libs = Path::new(env!("CARGO_BIN_EXE_epx"))
        .parent()
        .unwrap()
        .to_path_buf();
    let cpu = libs.join("libepx_cpu.so");
    let broken = libs.join("libepx_fixture_missing_dep.so");
    for lib in [&cpu, &broken] {
        assert!(
            lib.is_file(),
            "{} is missing: run `cargo build --workspace` before the tests",
            lib.display()
        );
    }
    let plugin = dir.0.join("cpu");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::copy(&cpu, plugin.join("libepx_cpu.so")).unwrap();
    std::fs::copy(
        repo().join("plugins/cpu/cdylib/plugin.toml"),
        plugin.join("plugin.toml"),
    )
    .unwrap();
    let folder = dir.0.to_str().unwrap();

    let out = epx(&["providers", "--plugin-dir", folder]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("(linked into epx)"), "{stdout}");
    assert!(
        stdout.contains(&format!("{}/cpu/libepx_cpu.so", folder)),
        "{stdout}"
    );

    let out = epx(&["doctor", "--plugin-dir", folder]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("✓ loads: plugin cpu 0.1.0, ABI 1.1"),
        "{}",
        text(&out.stdout)
    );

    // A plugin whose vendor runtime is missing: doctor names it, says where it looked, fails.
    std::fs::copy(&broken, dir.0.join("libepx_fixture_missing_dep.so")).unwrap();
    let out = epx(&["doctor", "--plugin-dir", folder]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("✗ libepx_vendor_runtime.so.3 (needed by"),
        "{stdout}"
    );
    assert!(stdout.contains("not found; searched:"), "{stdout}");
    assert!(stdout.contains(&format!("        {folder}\n")), "{stdout}");
    assert!(stdout.contains("1 problem(s) found"), "{stdout}");
}

#[test]
fn partition_prints_the_placement_and_draws_it() {
    let dir = Scratch::new("partition");
    let libs = Path::new(env!("CARGO_BIN_EXE_epx"))
        .parent()
        .unwrap()
        .to_path_buf();
    let lib = libs.join("libepx_fixture_older_minor.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests",
        lib.display()
    );
    let plugin = dir.0.join("older_minor");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::copy(&lib, plugin.join("libepx_fixture_older_minor.so")).unwrap();
    std::fs::write(
        plugin.join("plugin.toml"),
        "name = \"older_minor\"\nversion = \"0.1.0\"\nabi = \"1.0\"\nproviders = [\"relu_only\", \"never_available\"]\n\n[library]\nlinux = \"libepx_fixture_older_minor.so\"\n",
    )
    .unwrap();
    let dot = dir.0.join("placement.dot");
    let folder = dir.0.to_str().unwrap();
    let out = epx(&[
        "partition",
        "examples/models/mnist-cnn.onnx",
        "--plugin-dir",
        folder,
        "--ep",
        "relu_only",
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("relu1    Relu                relu_only  relu_only#0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("11 nodes in 5 kernels (cpu: 9, relu_only: 2)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("9 nodes fell back to the CPU EP:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("conv1 (Conv): not claimed by relu_only"),
        "{stdout}"
    );
    let picture = std::fs::read_to_string(&dot).unwrap();
    assert!(picture.starts_with("digraph placement {"), "{picture}");
    assert!(
        picture.contains("[relu_only]") && picture.contains("label=\"relu_only#0\""),
        "{picture}"
    );

    // Strict placement refuses the same request, naming what would fall back.
    let out = epx(&[
        "partition",
        "examples/models/mnist-cnn.onnx",
        "--plugin-dir",
        folder,
        "--ep",
        "relu_only",
        "--strict",
    ]);
    let line = assert_one_error_line(&out);
    assert!(
        line.starts_with(
            "error: strict placement: 9 nodes would fall back to the CPU EP: `conv1` (Conv)"
        ),
        "{line}"
    );
}
