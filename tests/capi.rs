//! libepx's C API from C and Python: the C example host (`examples/c-host`), linked against
//! `libepx.so` and against `libepx.a`; the contract checks in `tests/capi/contract.c` (NULL
//! arguments, free(NULL), error codes and messages, both run forms); the Python example
//! `examples/python/run_model.py` on the package of `host/python` (whose own tests run from the
//! wheel: `host/python/tests/run.sh`); the C++ example (`examples/cpp-host`, RAII wrappers over
//! the C API).
//!
//! Needs `cargo build --workspace` first (libepx is a cdylib/staticlib crate that `cargo test`
//! does not build for this package), `cc`, and python3 with numpy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use epx_tests::examples::assert_printed_mnist_probabilities;
use epx_tests::{TempDir, artifact_dir, repo_root};

fn libepx(kind: &str) -> PathBuf {
    let path = artifact_dir().join(format!("libepx.{kind}"));
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` (or `-p epx-capi`) first",
        path.display()
    );
    path
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Compiles C `sources` into `exe`, against libepx as a shared library (with an rpath) or
/// statically.
fn build_c(sources: &[PathBuf], exe: &Path, shared: bool) {
    let mut cmd = Command::new("cc");
    cmd.args([
        "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-I",
    ])
    .arg(repo_root().join("include"))
    .args(sources)
    .arg("-o")
    .arg(exe);
    if shared {
        let dir = artifact_dir();
        cmd.arg("-L")
            .arg(&dir)
            .arg("-lepx")
            .arg(format!("-Wl,-rpath,{}", dir.display()));
    } else {
        // A Rust staticlib needs the system libraries its std uses.
        cmd.arg(libepx("a"))
            .args(["-lpthread", "-ldl", "-lm", "-lrt", "-lgcc_s", "-lc"]);
    }
    let out = cmd.output().expect("running cc");
    assert!(out.status.success(), "cc failed:\n{}", text(&out));
}

/// `epx-c-host` on mnist-cnn: the EP list, the outputs and the placement JSON.
fn check_c_host(exe: &Path) {
    let models = repo_root().join("examples/models");
    let out = Command::new(exe)
        .arg(models.join("mnist-cnn.onnx"))
        .arg(format!(
            "image={}",
            models.join("mnist-cnn.input.image.npy").display()
        ))
        .env_remove("EPX_PLUGIN_PATH")
        .output()
        .expect("running the C example");
    let stdout = text(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("cpu") && l.contains("available")),
        "no available cpu EP listed:\n{stdout}"
    );
    assert_printed_mnist_probabilities(&stdout);
    let placement = stdout
        .lines()
        .find_map(|l| l.strip_prefix("placement: "))
        .unwrap_or_else(|| panic!("no placement line:\n{stdout}"));
    assert!(
        placement.starts_with("{\"nodes\":[") && placement.ends_with('}'),
        "{placement}"
    );
    // Every node and group on the CPU EP (11 nodes).
    let on_cpu = placement.matches("\"provider\":\"cpu\"").count();
    assert!(on_cpu >= 11, "{placement}");
    assert_eq!(
        placement.matches("\"provider\":").count(),
        on_cpu,
        "{placement}"
    );
}

fn have_cc() -> bool {
    Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A C program that makes an environment, lists its EPs and runs a model on the CPU EP starts
/// no process and imports no Python package, with an ONNX Runtime plugin-EP package on
/// `PYTHONPATH` and in `VIRTUAL_ENV` (its import would leave a mark) and a `python3` first on
/// `PATH` that marks each start.
#[test]
fn a_c_program_on_the_cpu_ep_starts_no_process() {
    use std::os::unix::fs::PermissionsExt;
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-host-quiet").expect("temp dir");
    let exe = dir.path().join("epx-c-host");
    build_c(&[repo_root().join("examples/c-host/main.c")], &exe, true);
    let mark = dir.path().join("mark");
    let site = dir.path().join("venv/lib/python3.11/site-packages");
    let pkg = site.join("onnxruntime_ep_marker");
    std::fs::create_dir_all(&pkg).expect("mkdir");
    std::fs::write(
        pkg.join("__init__.py"),
        format!(
            "open({:?}, 'a').write('imported')\n",
            mark.display().to_string()
        ),
    )
    .expect("write");
    std::fs::write(pkg.join("libmarker.so"), b"").expect("write");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::fs::write(
        bin.join("python3"),
        format!("#!/bin/sh\necho started >> {}\nexit 1\n", mark.display()),
    )
    .expect("write");
    std::fs::set_permissions(bin.join("python3"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let models = repo_root().join("examples/models");
    let out = Command::new(&exe)
        .arg(models.join("mnist-cnn.onnx"))
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("EPX_PYTHON_EPS")
        .env("PYTHONPATH", &site)
        .env("VIRTUAL_ENV", dir.path().join("venv"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .expect("running the C example");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !mark.exists(),
        "the C program started something: {:?}",
        std::fs::read_to_string(&mark)
    );
}

#[test]
fn the_c_host_example_runs_a_model_through_the_shared_library() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-host").expect("temp dir");
    let exe = dir.path().join("epx-c-host");
    build_c(&[repo_root().join("examples/c-host/main.c")], &exe, true);
    check_c_host(&exe);
    // A model that is not there: one clear line, non-zero exit.
    let out = Command::new(&exe)
        .arg("/nonexistent.onnx")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("error: epx_session_new: [code 3] /nonexistent.onnx"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_c_host_example_links_the_static_library() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-host-static").expect("temp dir");
    let exe = dir.path().join("epx-c-host");
    build_c(&[repo_root().join("examples/c-host/main.c")], &exe, false);
    let ldd = Command::new("ldd")
        .arg(&exe)
        .output()
        .map(|o| text(&o))
        .unwrap_or_default();
    assert!(!ldd.contains("libepx.so"), "linked dynamically:\n{ldd}");
    check_c_host(&exe);
}

#[test]
fn the_c_api_keeps_its_contract() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-contract").expect("temp dir");
    let exe = dir.path().join("contract");
    build_c(&[repo_root().join("tests/capi/contract.c")], &exe, true);
    let out = Command::new(&exe)
        .arg(repo_root().join("examples/models"))
        .env_remove("EPX_PLUGIN_PATH")
        .output()
        .expect("running the contract checks");
    let stdout = text(&out);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "{stdout}"
    );
}

#[test]
fn a_run_is_cancelled_from_another_thread_through_the_c_api() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-cancel").expect("temp dir");
    let model = dir.path().join("loop.onnx");
    std::fs::write(&model, epx_tests::models::counting_loop()).expect("model");
    let exe = dir.path().join("cancel");
    build_c(&[repo_root().join("tests/capi/cancel.c")], &exe, true);
    let out = Command::new(&exe)
        .arg(&model)
        .output()
        .expect("running the cancellation checks");
    let stdout = text(&out);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "{stdout}"
    );
}

/// The Python package of the source tree, and the extra site-packages for numpy when python3
/// has none (`tests/run.sh` installs it there).
fn python_path() -> String {
    let mut parts = vec![repo_root().join("host/python")];
    let extra = repo_root().join(".testdata/py");
    if extra.is_dir() {
        parts.push(extra);
    }
    std::env::join_paths(parts)
        .expect("paths")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_python_example_script_runs() {
    let models = repo_root().join("examples/models");
    let out = Command::new("python3")
        .arg(repo_root().join("examples/python/run_model.py"))
        .arg(models.join("mlp-int.onnx"))
        .arg(format!(
            "x={}",
            models.join("mlp-int.input.x.npy").display()
        ))
        .env("EPX_LIBRARY", libepx("so"))
        .env("PYTHONPATH", python_path())
        .output()
        .expect("running python3");
    let stdout = text(&out);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("placement: cpu:"), "{stdout}");
    assert!(stdout.contains("output y:"), "{stdout}");
}

#[test]
fn the_cpp_example_runs_with_raii_wrappers() {
    let have_cxx = Command::new("c++")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_cxx {
        eprintln!("skipping: `c++` was not found");
        return;
    }
    let dir = TempDir::new("cpp-host").expect("temp dir");
    let exe = dir.path().join("epx-cpp-host");
    let lib_dir = artifact_dir();
    let out = Command::new("c++")
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo_root().join("include"))
        .arg(repo_root().join("examples/cpp-host/main.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lepx")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .output()
        .expect("running c++");
    assert!(out.status.success(), "c++ failed:\n{}", text(&out));
    let run = Command::new(&exe)
        .arg(repo_root().join("examples/models/mnist-cnn.onnx"))
        .env_remove("EPX_PLUGIN_PATH")
        .output()
        .expect("running the C++ example");
    let stdout = text(&run);
    assert!(run.status.success(), "{stdout}");
    assert!(
        stdout.contains("output probabilities: shape [1, 10]") && stdout.contains("placement: "),
        "{stdout}"
    );
    let bad = Command::new(&exe)
        .arg("/nonexistent.onnx")
        .output()
        .expect("run");
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("error: [code 3] /nonexistent.onnx"),
        "{}",
        text(&bad)
    );
}

/// An Add(x, c) model whose `c` [1] is external data at `location` (4 bytes unless `dims` say
/// more).
fn external_model(location: &str, dims: &[i64]) -> Vec<u8> {
    use epx::onnx::proto;
    use epx_tests::models::{float_value, model_bytes, node};
    let entry = |k: &str, v: &str| proto::StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    };
    model_bytes(proto::GraphProto {
        name: Some("external".into()),
        node: vec![node("Add", &["x", "c"], &["y"])],
        input: vec![float_value("x", &[1])],
        output: vec![float_value("y", &[-1])],
        initializer: vec![proto::TensorProto {
            name: Some("c".into()),
            dims: dims.to_vec(),
            data_type: Some(1),
            data_location: Some(1),
            external_data: vec![entry("location", location)],
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// Every hostile model of `epx_tests::hostile`, models whose external data leaves their folder,
/// is a FIFO or a 1 TiB sparse file, a truncated model, and an input far larger than its buffer:
/// all through the C API in one process, which must report each as an error and then still run
/// a model.
#[test]
fn one_process_survives_every_hostile_model_through_the_c_api() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    use epx_tests::hostile::{Expect, TOO_BIG};
    let dir = TempDir::new("c-hostile").expect("temp dir");
    let mut cases = String::new();
    for (i, case) in epx_tests::hostile::cases().into_iter().enumerate() {
        let path = dir.path().join(format!("case{i:02}.onnx"));
        std::fs::write(&path, &case.model).unwrap();
        let needle = match case.expect {
            Expect::TooBig => TOO_BIG,
            Expect::Error(s) => s,
        };
        cases.push_str(&format!("{}\t{needle}\n", path.display()));
    }
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let mut add = |file: &str, bytes: Vec<u8>, needle: &str| {
        let path = models.join(file);
        std::fs::write(&path, bytes).unwrap();
        cases.push_str(&format!("{}\t{needle}\n", path.display()));
    };
    std::fs::write(dir.path().join("outside.bin"), [0u8; 4]).unwrap();
    add(
        "dotdot.onnx",
        external_model("../outside.bin", &[1]),
        "must stay inside the model's folder",
    );
    add(
        "absolute.onnx",
        external_model("/etc/passwd", &[1]),
        "must stay inside the model's folder",
    );
    std::os::unix::fs::symlink("/etc/passwd", models.join("passwd.bin")).unwrap();
    add(
        "symlink.onnx",
        external_model("passwd.bin", &[1]),
        "outside the model's folder",
    );
    let fifo = Command::new("mkfifo")
        .arg(models.join("fifo.bin"))
        .status()
        .is_ok_and(|s| s.success());
    if fifo {
        add(
            "fifo.onnx",
            external_model("fifo.bin", &[1]),
            "not a regular file",
        );
    } else {
        eprintln!("mkfifo failed: the FIFO case was not tried");
    }
    let sparse = std::fs::File::create(models.join("sparse.bin")).unwrap();
    sparse.set_len(1 << 40).unwrap();
    add(
        "sparse.onnx",
        external_model("sparse.bin", &[1 << 38]),
        "1099511627776 bytes, more than the 1000000000",
    );
    let mnist = std::fs::read(repo_root().join("examples/models/mnist-cnn.onnx")).unwrap();
    add(
        "truncated.onnx",
        mnist[..mnist.len() / 2].to_vec(),
        "not a valid ONNX model",
    );
    let list = dir.path().join("cases.txt");
    std::fs::write(&list, &cases).unwrap();

    let exe = dir.path().join("hostile");
    build_c(&[repo_root().join("tests/capi/hostile.c")], &exe, true);
    let out = Command::new(&exe)
        .arg(&list)
        .arg(repo_root().join("examples/models/add.onnx"))
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("EPX_MAX_TENSOR_BYTES")
        .output()
        .expect("running the hostile cases");
    let stdout = text(&out);
    let n = cases.lines().count() + 2;
    assert!(
        out.status.success() && stdout.contains(&format!("SURVIVED {n}")),
        "{:?}\n{stdout}",
        out.status
    );
}

/// Bytes valgrind reports "in use at exit" and "definitely lost", and its error count, for
/// `leaks` on mnist-cnn over `cycles` create/run/free cycles.
fn valgrind_leaks(exe: &Path, cycles: u32) -> (u64, u64, u64) {
    let out = Command::new("valgrind")
        .args([
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--error-exitcode=99",
        ])
        .arg(exe)
        .arg(repo_root().join("examples/models/mnist-cnn.onnx"))
        .args([&cycles.to_string(), "3"])
        .env_remove("EPX_PLUGIN_PATH")
        .output()
        .expect("running valgrind");
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("DONE"),
        "{:?}\n{report}",
        out.status
    );
    // `==pid==    definitely lost: 1,234 bytes in 5 blocks`
    let bytes_after = |label: &str| -> u64 {
        let line = report
            .lines()
            .find(|l| l.contains(label))
            .unwrap_or_else(|| panic!("no `{label}` in:\n{report}"));
        let rest = &line[line.find(label).unwrap() + label.len()..];
        rest.split_whitespace()
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap()
    };
    let errors = bytes_after("ERROR SUMMARY:");
    let lost = if report.contains("All heap blocks were freed") {
        0
    } else {
        bytes_after("definitely lost:")
    };
    let in_use = bytes_after("in use at exit:");
    (in_use, lost, errors)
}

/// valgrind over the C API's create/run/free cycle: no byte definitely lost, no invalid read
/// or write, and what is still held at exit (process-wide tables built once) does not grow with
/// the number of cycles.
#[test]
fn the_c_api_life_cycle_leaks_nothing_under_valgrind() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        // .ci/run installs it; a developer machine may not have it.
        eprintln!("skipping: valgrind is not installed (apt-get install valgrind)");
        return;
    }
    let dir = TempDir::new("c-leaks").expect("temp dir");
    let exe = dir.path().join("leaks");
    build_c(&[repo_root().join("tests/capi/leaks.c")], &exe, true);
    let (held_1, lost_1, errors_1) = valgrind_leaks(&exe, 1);
    let (held_3, lost_3, errors_3) = valgrind_leaks(&exe, 3);
    eprintln!(
        "valgrind: 1 cycle: {held_1} bytes held at exit, {lost_1} definitely lost, {errors_1} errors; \
         3 cycles: {held_3} held, {lost_3} lost, {errors_3} errors"
    );
    assert_eq!((lost_1, errors_1, lost_3, errors_3), (0, 0, 0, 0));
    assert_eq!(held_1, held_3, "memory held at exit grows with the cycles");
}

/// A session freed while 8 threads run it, round after round: every run started before the
/// free finishes on its own reference, every run after it fails with "the session is closed",
/// and valgrind finds no invalid read or write (the runs outlive the caller's handle).
#[test]
fn freeing_a_session_while_threads_run_it_is_safe() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-close-during-run").expect("temp dir");
    let exe = dir.path().join("close_during_run");
    build_c(
        &[repo_root().join("tests/capi/close_during_run.c")],
        &exe,
        true,
    );
    let model = repo_root().join("examples/models/add.onnx");
    let run = |wrapper: Option<&[&str]>, rounds: u32| {
        let mut cmd = match wrapper {
            Some(w) => {
                let mut c = Command::new(w[0]);
                c.args(&w[1..]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let out = cmd
            .arg(&model)
            .args([&rounds.to_string(), "8"])
            .env_remove("EPX_PLUGIN_PATH")
            .output()
            .expect("running close_during_run");
        let stdout = text(&out);
        assert!(
            out.status.success() && stdout.contains(&format!("ROUNDS {rounds} ")),
            "{:?}\n{stdout}",
            out.status
        );
        stdout
    };
    let native = run(None, 300);
    eprintln!("natively: {}", native.lines().last().unwrap_or(""));
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("not checked under valgrind: it is not installed (apt-get install valgrind)");
        return;
    }
    let checked = run(
        Some(&["valgrind", "--error-exitcode=99", "--fair-sched=yes"]),
        30,
    );
    eprintln!("under valgrind: {}", checked.lines().last().unwrap_or(""));
}
