//! ONNX Runtime plugin-EP libraries (a `plugin.toml` with `[onnxruntime_ep]`) hosted through
//! epx's adapter, tested with the project's own plugin-EP library
//! (`tests/fixtures/ort_plugin_ep`: one CPU device, float Add/Sub/Mul/Relu of one shape) on the
//! ONNX Runtime wheel `plugins/onnxruntime/fetch-runtime.sh` unpacks: registration, devices,
//! capability with decline reasons, compile, run against the CPU EP, options, the checks a
//! vendor library passes like any plugin, isolation, and the CLI's `providers`, `partition` and
//! `compare`.
//!
//! Needs `bash plugins/onnxruntime/fetch-runtime.sh` and `cargo build --workspace` first (the
//! README's test command runs both).

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Once};

use epx::{Environment, ExecutionProvider, Session, Tensor};
use epx_tests::examples::run;
use epx_tests::models::{relu_add_model, relu_neg_model, seeded_floats};
use epx_tests::{TempDir, artifact_dir, built_library, fixture_library, repo_root};

const ORT_NAME: &str = "EpxFixtureExecutionProvider";

/// Points the adapter at the fetched runtime and the host at the built adapter, once per
/// process, before any environment exists.
fn ready() {
    static SET: Once = Once::new();
    let dir = repo_root().join(".testdata/onnxruntime/capi");
    assert!(
        dir.join("libonnxruntime.so.1").exists(),
        "{} has no ONNX Runtime: run `bash plugins/onnxruntime/fetch-runtime.sh` (the README's test command does)",
        dir.display()
    );
    let adapter = built_library("epx_ort_plugin_ep");
    SET.call_once(|| {
        // SAFETY: runs once, before this process creates any environment or loads any plugin;
        // every test calls this first.
        unsafe {
            std::env::set_var("EPX_ORT_SEARCH_PATH", &dir);
            std::env::set_var("EPX_ORT_EP_ADAPTER", &adapter);
        }
    });
}

fn epx_exe() -> PathBuf {
    artifact_dir().join(format!("epx{}", std::env::consts::EXE_SUFFIX))
}

/// The fixture's manifest: `extra` lines go before the first table.
fn manifest(extra: &str) -> String {
    format!(
        "name = \"fixture-ort-ep\"\nversion = \"0.2.0\"\nproviders = [\"fx\"]\n{extra}\n\
         [library]\nlinux = \"libepx_fixture_ort_plugin_ep.so\"\n\n\
         [onnxruntime_ep]\nep_names = [\"{ORT_NAME}\"]\nonnxruntime = \"1.23\"\n"
    )
}

fn plugin_dir(extra: &str) -> TempDir {
    let dir = TempDir::new("ort-plugin-ep").expect("temp dir");
    dir.add_plugin(
        "fx",
        &fixture_library("ort_plugin_ep"),
        Some(&manifest(extra)),
    )
    .expect("copy the fixture");
    dir
}

fn environment(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_epx_executable(epx_exe())
        .with_cache_dir(dir.path().join("cache"))
        .commit()
        .expect("environment")
}

fn session(
    env: &Arc<Environment>,
    model: &[u8],
    eps: Vec<ExecutionProvider>,
) -> epx::Result<Session> {
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers(eps)?
        .commit_from_memory(model)
}

fn input() -> Vec<(String, Tensor)> {
    let x: Vec<u8> = seeded_floats(7, 6, 2.0)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let t = Tensor::from_bytes(epx::ElementType::Float, &[2, 3], &x).expect("tensor");
    vec![("x".into(), t)]
}

fn outputs(s: &Session) -> Vec<(String, Vec<u8>)> {
    run(s, &input())
        .into_iter()
        .map(|(n, t)| (n, t.bytes().expect("bytes").to_vec()))
        .collect()
}

#[test]
fn a_plugin_ep_library_lists_its_device_and_runs_like_the_cpu_ep() {
    ready();
    let dir = plugin_dir("");
    let env = environment(&dir);
    let (lib, index) = env.find_provider("fx").expect("fx is found");
    let fx = &lib.providers[index];
    assert_eq!(fx.availability, Ok(()), "fx should be available");
    assert_eq!(
        lib.name, "fixture-ort-ep",
        "listed under its manifest's name"
    );
    assert_eq!(lib.version, "0.2.0");
    assert_eq!(fx.devices.len(), 1, "{:?}", fx.devices);
    assert_eq!(fx.devices[0].kind, "cpu");

    let model = relu_add_model("relu_add");
    let cpu = session(&env, &model, vec![]).expect("cpu session");
    let on_fx = session(
        &env,
        &model,
        vec![ExecutionProvider::new("fx").error_on_failure()],
    )
    .expect("fx session");
    assert_eq!(on_fx.providers(), ["fx"], "every node on fx");
    // Relu and Add in f32 on both: bit for bit.
    assert_eq!(outputs(&on_fx), outputs(&cpu));
    // On the chosen device, as the session names it.
    let on_device = session(
        &env,
        &model,
        vec![
            ExecutionProvider::new("fx")
                .on_device("0")
                .error_on_failure(),
        ],
    )
    .expect("fx:0 session");
    assert_eq!(outputs(&on_device), outputs(&cpu));
}

#[test]
fn what_it_does_not_take_stays_on_the_cpu_ep_with_the_reason() {
    ready();
    let dir = plugin_dir("");
    let env = environment(&dir);
    let model = relu_neg_model();
    let cpu = session(&env, &model, vec![]).expect("cpu session");
    let s = session(&env, &model, vec![ExecutionProvider::new("fx")]).expect("session");
    let placement = s.placement();
    let on = |op: &str| {
        placement
            .nodes
            .iter()
            .find(|n| n.op_type == op)
            .map(|n| n.provider.clone())
    };
    assert_eq!(on("Relu").as_deref(), Some("fx"));
    assert_eq!(on("Neg").as_deref(), Some("cpu"));
    let neg = placement
        .fallbacks
        .iter()
        .find(|f| f.op_type == "Neg")
        .expect("Neg fell back");
    assert!(
        neg.reason.contains(ORT_NAME) && neg.reason.contains("does not take it"),
        "{}",
        neg.reason
    );
    assert_eq!(outputs(&s), outputs(&cpu));
}

#[test]
fn its_options_reach_it_and_one_it_refuses_fails_with_its_message() {
    ready();
    let dir = plugin_dir("");
    let env = environment(&dir);
    let model = relu_add_model("relu_add");
    // `ops` is the EP's own option: it then claims Relu only.
    let only_relu = session(
        &env,
        &model,
        vec![ExecutionProvider::new("fx").with_option("ops", "Relu")],
    )
    .expect("session");
    let placement = only_relu.placement();
    let add = placement
        .nodes
        .iter()
        .find(|n| n.op_type == "Add")
        .expect("Add");
    assert_eq!(add.provider, "cpu");
    let err = session(
        &env,
        &model,
        vec![
            ExecutionProvider::new("fx")
                .with_option("colour", "blue")
                .error_on_failure(),
        ],
    )
    .err()
    .expect("an option the EP does not know");
    let text = err.to_string();
    assert!(
        text.contains("unknown option `colour`")
            && text.contains(ORT_NAME)
            && text.contains("options given: colour"),
        "{text}"
    );
}

#[test]
fn the_vendor_library_passes_the_checks_of_every_plugin() {
    ready();
    // Pinned to another digest: refused before any of its code runs.
    let dir = plugin_dir(&format!("sha256 = \"{}\"", "ab".repeat(32)));
    let env = environment(&dir);
    let err = env.find_provider("fx").expect_err("refused");
    assert!(err.to_string().contains("SHA-256"), "{err}");
    // Writable by others: skipped when the folder is scanned, saying why.
    let dir = plugin_dir("");
    let lib = dir.path().join("fx/libepx_fixture_ort_plugin_ep.so");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let env = environment(&dir);
    assert!(env.find_provider("fx").is_err());
    let problems: Vec<String> = env
        .discovery()
        .problems
        .iter()
        .map(|p| p.error.to_string())
        .collect();
    assert!(
        problems.iter().any(|p| p.contains("writable")),
        "{problems:?}"
    );
}

#[test]
fn an_isolated_plugin_ep_library_runs_in_a_child() {
    ready();
    let dir = plugin_dir("isolate = true");
    let env = environment(&dir);
    let model = relu_add_model("relu_add");
    let cpu = session(&env, &model, vec![]).expect("cpu session");
    let s = session(
        &env,
        &model,
        vec![ExecutionProvider::new("fx").error_on_failure()],
    )
    .expect("session");
    assert_eq!(s.placement().isolated_providers, ["fx"]);
    assert_eq!(outputs(&s), outputs(&cpu));
}

fn cli(dir: &TempDir, args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(epx_exe());
    cmd.arg("--plugin-dir").arg(dir.path()).args(args);
    cmd.env(
        "EPX_ORT_SEARCH_PATH",
        repo_root().join(".testdata/onnxruntime/capi"),
    );
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run epx");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_cli_lists_partitions_and_compares_it() {
    ready();
    let dir = plugin_dir("");
    let model = dir.path().join("relu_neg.onnx");
    std::fs::write(&model, relu_neg_model()).expect("write the model");
    let model = model.to_str().expect("utf-8 path");
    let (ok, text) = cli(&dir, &["providers", "--devices"], &[]);
    assert!(ok, "{text}");
    let line = text.lines().find(|l| l.starts_with("fx ")).expect(&text);
    assert!(
        line.contains("fixture-ort-ep") && line.contains(" ok "),
        "{line}"
    );
    assert!(text.contains("fx:0") && text.contains("cpu"), "{text}");
    let (ok, text) = cli(&dir, &["partition", model, "--ep", "fx"], &[]);
    assert!(ok, "{text}");
    assert!(text.contains("does not take it"), "{text}");
    let (ok, text) = cli(&dir, &["compare", model, "--ep", "fx"], &[]);
    assert!(
        ok && text.contains("all outputs within the tolerance"),
        "{text}"
    );
    // A selection policy sees its CPU device like any EP's.
    let (ok, text) = cli(&dir, &["run", model, "--policy", "prefer-cpu"], &[]);
    assert!(ok, "{text}");
    // The ONNX node tests of the ops it runs, and a model.
    let node_tests = repo_root().join(".testdata/onnx-node");
    let relu_add = dir.path().join("relu_add.onnx");
    std::fs::write(&relu_add, relu_add_model("relu_add")).expect("write the model");
    let (ok, text) = cli(
        &dir,
        &[
            "conformance",
            "--ep",
            "fx",
            "--filter",
            "test_relu,test_add",
            "--node-tests",
            node_tests.to_str().expect("utf-8"),
            "--model",
            relu_add.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert!(ok, "{text}");
    let summary = text.lines().find(|l| l.starts_with("fx: ")).expect(&text);
    assert!(
        summary.contains(" 0 wrong, 0 crashed") && !summary.contains(" 0 claimed"),
        "{text}"
    );
}

#[test]
fn a_library_that_lists_no_device_is_unavailable_and_says_what_onnx_runtime_found() {
    ready();
    let dir = plugin_dir("");
    let (_, text) = cli(
        &dir,
        &["providers"],
        &[("EPX_FIXTURE_ORT_EP_NO_DEVICES", "1")],
    );
    let line = text.lines().find(|l| l.starts_with("fx ")).expect(&text);
    assert!(
        line.contains("lists no device for EpxFixtureExecutionProvider") && line.contains("CPU"),
        "{line}"
    );
}

/// A pip-installed plugin-EP package, as `onnxruntime-ep-*` wheels lay them out: the package
/// folder with its library and an `__init__.py` that names it, and its `.dist-info`.
fn python_package(init: &str) -> TempDir {
    let sp = TempDir::new("site-packages").expect("temp dir");
    sp.add_plugin(
        "onnxruntime_ep_epxfixture",
        &fixture_library("ort_plugin_ep"),
        None,
    )
    .expect("copy the fixture");
    sp.write("onnxruntime_ep_epxfixture/__init__.py", init)
        .expect("write __init__.py");
    sp.write(
        "onnxruntime_ep_epxfixture-0.3.0.dist-info/METADATA",
        "Name: x\n",
    )
    .expect("write METADATA");
    sp
}

const INIT: &str = "import os\n\
def get_library_path():\n    return os.path.join(os.path.dirname(__file__), 'libepx_fixture_ort_plugin_ep.so')\n\
def get_ep_names():\n    return ['EpxFixtureExecutionProvider']\n";

#[test]
fn an_installed_plugin_ep_package_is_found_listed_and_run() {
    ready();
    let sp = python_package(INIT);
    let empty = TempDir::new("no-plugins").expect("temp dir");
    let pythonpath = sp.path().to_str().expect("utf-8").to_owned();
    let env = [("PYTHONPATH", pythonpath.as_str()), ("EPX_PYTHON_EPS", "1")];
    let (ok, text) = cli(&empty, &["providers", "--devices"], &env);
    assert!(ok, "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with(ORT_NAME))
        .unwrap_or_else(|| panic!("{ORT_NAME} is not listed:\n{text}"));
    assert!(
        line.contains("onnxruntime-ep-epxfixture")
            && line.contains("0.3.0")
            && line.contains(" ok "),
        "{line}"
    );
    let model = empty.path().join("relu_add.onnx");
    std::fs::write(&model, relu_add_model("relu_add")).expect("write the model");
    let model = model.to_str().expect("utf-8");
    let (ok, text) = cli(&empty, &["compare", model, "--ep", ORT_NAME], &env);
    assert!(
        ok && text.contains("all outputs within the tolerance"),
        "{text}"
    );
    // Turned off.
    let (_, text) = cli(
        &empty,
        &["providers"],
        &[("PYTHONPATH", pythonpath.as_str()), ("EPX_PYTHON_EPS", "0")],
    );
    assert!(!text.contains(ORT_NAME), "{text}");
}

#[test]
fn a_package_that_cannot_say_what_it_is_is_reported_with_its_error() {
    ready();
    let sp = python_package(
        "def get_library_path():\n    raise FileNotFoundError('plugin library missing')\n",
    );
    let empty = TempDir::new("no-plugins").expect("temp dir");
    let pythonpath = sp.path().to_str().expect("utf-8").to_owned();
    let (_, text) = cli(
        &empty,
        &["providers", "--python-eps"],
        &[("PYTHONPATH", pythonpath.as_str())],
    );
    assert!(
        text.contains("onnxruntime_ep_epxfixture") && text.contains("plugin library missing"),
        "{text}"
    );
}

/// An `__init__.py` that leaves a mark (the file `EPX_TEST_MARK` names) when it is imported,
/// then says what [`INIT`] says; `extra` runs first.
fn marking_init(extra: &str) -> String {
    format!(
        "import os\nopen(os.environ['EPX_TEST_MARK'], 'a').write('imported\\n')\n{extra}\n{INIT}"
    )
}

/// A folder holding a `python3` that only leaves a mark: any Python epx starts from `PATH`.
fn fake_python(mark: &std::path::Path) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let bin = TempDir::new("fake-python").expect("temp dir");
    let py = bin.path().join("python3");
    std::fs::write(
        &py,
        format!("#!/bin/sh\necho started >> {}\nexit 1\n", mark.display()),
    )
    .expect("write python3");
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

/// Nothing the user did not ask for runs: a plugin-EP package on `PYTHONPATH` is not imported
/// by `epx providers`, `epx run` or a Rust program unless the search is switched on, and even
/// then not by a run that needs none of its EPs; asked for its EP, it is. A `python3` first on
/// `PATH` that marks each start shows that no Python at all is started where none is asked for.
#[test]
fn a_python_package_runs_only_when_asked_for() {
    ready();
    let sp = python_package(&marking_init(""));
    let empty = TempDir::new("no-plugins").expect("temp dir");
    let mark = empty.path().join("mark");
    let marks = || std::fs::read_to_string(&mark).unwrap_or_default();
    let bin = fake_python(&mark);
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pythonpath = sp.path().to_str().expect("utf-8").to_owned();
    let mark_s = mark.to_str().expect("utf-8").to_owned();
    let cache = empty.path().join("cache");
    let cache = cache.to_str().expect("utf-8");
    let base = [
        ("PYTHONPATH", pythonpath.as_str()),
        ("EPX_TEST_MARK", mark_s.as_str()),
        ("PATH", path.as_str()),
        ("EPX_CACHE_DIR", cache),
    ];
    let model = empty.path().join("relu_add.onnx");
    std::fs::write(&model, relu_add_model("relu_add")).expect("write the model");
    let model = model.to_str().expect("utf-8");
    // Not switched on: listed nowhere, imported by nothing, no Python started.
    for args in [
        vec!["providers"],
        vec!["doctor"],
        vec!["run", model],
        vec!["cache", "list"],
    ] {
        let (_, text) = cli(&empty, &args, &base);
        assert!(!text.contains(ORT_NAME), "{args:?}: {text}");
        assert_eq!(marks(), "", "{args:?} started something: {text}");
    }
    // Switched on: a CPU-only run still asks nobody.
    let on = [base.as_slice(), &[("EPX_PYTHON_EPS", "1")]].concat();
    let (ok, text) = cli(&empty, &["run", model], &on);
    assert!(ok, "{text}");
    assert_eq!(marks(), "", "a CPU-only run imported the package: {text}");
    // Asked for its EP: imported (by the real interpreter: the fake one is not `python3` of
    // the package's prefix, so put the real one first).
    let real = std::env::var("PATH").unwrap_or_default();
    let asked = [
        ("PYTHONPATH", pythonpath.as_str()),
        ("EPX_TEST_MARK", mark_s.as_str()),
        ("PATH", real.as_str()),
        ("EPX_PYTHON_EPS", "1"),
    ];
    let (ok, text) = cli(&empty, &["run", model, "--ep", ORT_NAME], &asked);
    assert!(ok, "{text}");
    assert_eq!(marks(), "imported\n", "{text}");
}

/// The same from a Rust program, in a child process of this test binary (the search reads the
/// process's environment): an environment made with no opt-in, a session on the CPU EP and a
/// run start no process and import nothing.
#[test]
fn a_rust_program_on_the_cpu_ep_starts_no_process() {
    if std::env::var_os("EPX_TEST_RUST_FACE").is_some() {
        let env = Environment::builder().commit().expect("environment");
        assert!(env.python_packages().is_empty());
        let s = Session::builder()
            .expect("builder")
            .with_environment(env)
            .commit_from_memory(&relu_add_model("relu_add"))
            .expect("session");
        let x = Tensor::from_array(ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[2, 3])));
        s.run([("x", x)]).expect("run");
        return;
    }
    ready();
    let sp = python_package(&marking_init(""));
    let dir = TempDir::new("rust-face").expect("temp dir");
    let mark = dir.path().join("mark");
    let bin = fake_python(&mark);
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_rust_program_on_the_cpu_ep_starts_no_process",
            "--nocapture",
        ])
        .env("EPX_TEST_RUST_FACE", "1")
        .env("EPX_TEST_MARK", &mark)
        .env("PYTHONPATH", sp.path())
        .env("VIRTUAL_ENV", sp.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.path().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .expect("run the child");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !mark.exists(),
        "something was started: {:?}",
        std::fs::read_to_string(&mark)
    );
}

/// A package anyone else could change is not imported, nor is one the interpreter epx would
/// start could be changed by others: both refused with the reason, before any of their code
/// runs.
#[test]
fn a_package_or_interpreter_others_could_change_is_not_run() {
    use std::os::unix::fs::PermissionsExt;
    ready();
    let empty = TempDir::new("no-plugins").expect("temp dir");
    let mark = empty.path().join("mark");
    let mark_s = mark.to_str().expect("utf-8").to_owned();
    // A package folder writable by every user.
    let sp = python_package(&marking_init(""));
    let pkg = sp.path().join("onnxruntime_ep_epxfixture");
    std::fs::set_permissions(&pkg, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let pythonpath = sp.path().to_str().expect("utf-8").to_owned();
    let env = [
        ("PYTHONPATH", pythonpath.as_str()),
        ("EPX_TEST_MARK", mark_s.as_str()),
        ("EPX_PYTHON_EPS", "1"),
    ];
    let (_, text) = cli(&empty, &["providers"], &env);
    assert!(
        text.contains("was not imported") && text.contains("writable by every user"),
        "{text}"
    );
    assert!(!mark.exists(), "the package ran before the check");
    // The package is fine, but the interpreter of its environment is writable by every user.
    let prefix = TempDir::new("venv").expect("temp dir");
    let site = prefix.path().join("lib/python3.11/site-packages");
    std::fs::create_dir_all(&site).expect("mkdir");
    let sp2 = python_package(&marking_init(""));
    std::fs::rename(
        sp2.path().join("onnxruntime_ep_epxfixture"),
        site.join("onnxruntime_ep_epxfixture"),
    )
    .expect("move the package");
    std::fs::create_dir_all(prefix.path().join("bin")).expect("mkdir");
    let py = prefix.path().join("bin/python3");
    std::fs::write(&py, format!("#!/bin/sh\necho started >> {mark_s}\n")).expect("write");
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let venv = prefix.path().to_str().expect("utf-8").to_owned();
    let env = [
        ("VIRTUAL_ENV", venv.as_str()),
        ("EPX_TEST_MARK", mark_s.as_str()),
        ("EPX_PYTHON_EPS", "1"),
    ];
    let (_, text) = cli(&empty, &["providers"], &env);
    assert!(
        text.contains("the Python interpreter epx would start")
            && text.contains("writable by every user"),
        "{text}"
    );
    assert!(!mark.exists(), "the interpreter ran before the check");
    // SAFETY: geteuid takes no arguments and touches no memory.
    if unsafe { libc::geteuid() } == 0 {
        // As root: one owned by another user (nobody) is refused too.
        std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::chown(&py, Some(65534), None).expect("chown");
        let (_, text) = cli(&empty, &["providers"], &env);
        assert!(
            text.contains("owned by") && text.contains("(uid 65534)"),
            "{text}"
        );
        assert!(!mark.exists(), "the interpreter owned by nobody ran");
        eprintln!("running as root: checked an interpreter owned by another user too");
    } else {
        eprintln!("not root: an interpreter owned by another user could not be made here");
    }
}

/// A package whose import forks a daemon holding its output, one that prints without end and
/// one that never finishes: each ends within the deadline with its reason, the daemon killed.
#[test]
fn a_package_child_cannot_hold_epx() {
    ready();
    let empty = TempDir::new("no-plugins").expect("temp dir");
    let pidfile = empty.path().join("daemon.pid");
    let daemon = format!(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        \
         open({:?}, 'w').write(str(os.getpid()))\n        time.sleep(600)\n    os._exit(0)\n\
         time.sleep(0.3)\n",
        pidfile.display().to_string()
    );
    let cases = [
        ("daemon", daemon, ""),
        (
            "chatty",
            "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n".to_owned(),
            "did not finish within 3 s",
        ),
        (
            "stuck",
            "import time\ntime.sleep(600)\n".to_owned(),
            "did not finish within 3 s",
        ),
    ];
    for (what, extra, want) in cases {
        let sp = python_package(&marking_init(&extra));
        let mark = empty.path().join(format!("mark-{what}"));
        let pythonpath = sp.path().to_str().expect("utf-8").to_owned();
        let mark_s = mark.to_str().expect("utf-8").to_owned();
        let env = [
            ("PYTHONPATH", pythonpath.as_str()),
            ("EPX_TEST_MARK", mark_s.as_str()),
            ("EPX_PYTHON_EPS", "1"),
            ("EPX_PYTHON_EPS_TIMEOUT_S", "3"),
        ];
        let started = std::time::Instant::now();
        let (_, text) = cli(&empty, &["providers"], &env);
        let took = started.elapsed();
        assert!(took.as_secs() < 10, "{what}: took {took:?}\n{text}");
        assert!(text.contains(want), "{what}: {text}");
        eprintln!("{what}: {took:?}");
    }
    // The daemon listed its EP (its parent answered), and is gone.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("the daemon started");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|s| s.split_whitespace().next());
    assert!(
        state.is_none_or(|s| s == "Z" || s == "X"),
        "the daemon {pid} outlived epx: {stat}"
    );
}

/// The plugin-EP packages `plugins/onnxruntime/fetch-plugin-eps.sh` installs from PyPI
/// (onnxruntime-ep-openvino 1.8.1, onnxruntime-ep-webgpu 0.4.0): each is found and either
/// lists a device and runs, or says why it lists none. Which case this machine is, is printed.
#[test]
fn pypi_plugin_ep_packages_are_listed_with_their_devices_or_why_they_have_none() {
    ready();
    let sp = repo_root().join(".testdata/ort-plugin-eps");
    assert!(
        sp.join("onnxruntime_ep_openvino").is_dir(),
        "{} has no plugin-EP packages: run `bash plugins/onnxruntime/fetch-plugin-eps.sh` (the README's test command does)",
        sp.display()
    );
    let empty = TempDir::new("no-plugins").expect("temp dir");
    let pythonpath = sp.to_str().expect("utf-8").to_owned();
    let env = [("PYTHONPATH", pythonpath.as_str()), ("EPX_PYTHON_EPS", "1")];
    let (ok, text) = cli(&empty, &["providers", "--devices"], &env);
    assert!(ok, "{text}");
    let mut usable = Vec::new();
    for (ep, package, version) in [
        (
            "OpenVINOExecutionProvider",
            "onnxruntime-ep-openvino",
            "1.8.1",
        ),
        ("WebGpuExecutionProvider", "onnxruntime-ep-webgpu", "0.4.0"),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{ep} ")))
            .unwrap_or_else(|| panic!("{ep} is not listed:\n{text}"));
        assert!(line.contains(package) && line.contains(version), "{line}");
        if line.contains(" ok ") {
            assert!(
                text.contains(&format!("{ep}:0")),
                "{ep} ok without a device:\n{text}"
            );
            println!("{ep}: lists a device here and is available");
            usable.push(ep);
        } else {
            assert!(
                line.contains(&format!("lists no device for {ep}")) && line.contains("CPU"),
                "{ep} is unavailable without the reason:\n{line}"
            );
            println!("{ep}: lists no device here: {line}");
        }
    }
    if usable.contains(&"OpenVINOExecutionProvider") {
        // OpenVINO computes in reduced precision on CPUs with bf16 unless told f32, through its
        // own option (a JSON file): then it matches the CPU EP.
        let config = empty.path().join("ov.json");
        std::fs::write(&config, r#"{"CPU":{"INFERENCE_PRECISION_HINT":"f32"}}"#)
            .expect("write the config");
        let ep = format!(
            "OpenVINOExecutionProvider:load_config={}",
            config.to_str().expect("utf-8")
        );
        let model = repo_root().join("examples/models/mnist-cnn.onnx");
        let (ok, text) = cli(
            &empty,
            &["compare", model.to_str().expect("utf-8"), "--ep", &ep],
            &env,
        );
        assert!(
            ok && text.contains("all outputs within the tolerance"),
            "{text}"
        );
        assert!(
            text.contains("nodes on OpenVINOExecutionProvider 11"),
            "every node on OpenVINO:\n{text}"
        );
    }
}

/// A plugin-EP library that writes EPContext nodes (the fixture does when ONNX Runtime compiles
/// for it) has its groups stored in epx's kernel cache as the EPContext model ONNX Runtime's
/// compile API gives, and a later session loads them instead of compiling.
#[test]
fn its_groups_are_stored_as_epcontext_models_and_loaded_again() {
    ready();
    let dir = plugin_dir("");
    let model = relu_add_model("relu_add");
    let first = environment(&dir);
    let cpu = session(&first, &model, vec![]).expect("cpu session");
    let want = outputs(&cpu);
    let s = session(
        &first,
        &model,
        vec![ExecutionProvider::new("fx").error_on_failure()],
    )
    .expect("session");
    let uses = s.placement().kernel_cache;
    assert_eq!(uses.len(), 1, "{uses:?}");
    assert!(uses[0].in_cache && !uses[0].loaded, "{uses:?}");
    assert_eq!(outputs(&s), want);
    // Another environment on the same cache folder: the group is loaded, not compiled.
    let second = environment(&dir);
    let s = session(
        &second,
        &model,
        vec![ExecutionProvider::new("fx").error_on_failure()],
    )
    .expect("session");
    let uses = s.placement().kernel_cache;
    assert!(
        !uses.is_empty() && uses.iter().all(|u| u.loaded),
        "the stored EPContext model was not loaded: {uses:?}"
    );
    assert_eq!(outputs(&s), want);
}
