//! The C example plugin (`examples/c-plugin`): built with `cc` exactly as its README says,
//! loaded from a temporary plugin folder, and run on models whose nodes it shares with the CPU
//! EP. Its kernels accept only tensors in its own memory space (DLPack device type 12, blocks
//! from its own `allocate`), so a correct result shows the host copied values in and out.
//!
//! Skipped, with a message, when `cc` is not installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use epx::onnx::proto;
use epx::placement::CopyPlacement;
use epx::{Environment, Error, ExecutionProvider, Session, Tensor};
use epx_tests::models::{float_value, model_bytes, node};
use epx_tests::{TempDir, artifact_dir, library_file_name, manifest, repo_root};

/// The build command of `examples/c-plugin/README.md`, run from the repository root.
const README_BUILD_COMMAND: &str = "cc -std=c11 -O2 -shared -fPIC -I include \
     examples/c-plugin/epx_c_example.c -lm -o libepx_c_example.so";

const EXAMPLE_DIR: &str = "examples/c-plugin";
const LIB_NAME: &str = "epx_c_example";
const EP: &str = "c_example";

fn example_file(name: &str) -> PathBuf {
    repo_root().join(EXAMPLE_DIR).join(name)
}

fn read_example(name: &str) -> String {
    let path = example_file(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn have_cc() -> bool {
    Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds the plugin with the README's command, writing the library into `out_dir` instead of
/// the current folder. `None` (after saying why) when `cc` is missing.
fn build_plugin(out_dir: &Path) -> Option<PathBuf> {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found, so the C example plugin cannot be built");
        return None;
    }
    let out = out_dir.join(library_file_name(LIB_NAME));
    let words: Vec<&str> = README_BUILD_COMMAND.split_whitespace().collect();
    let mut args: Vec<String> = words[1..].iter().map(|w| w.to_string()).collect();
    let o = args
        .iter()
        .position(|a| a == "-o")
        .expect("the build command names its output with -o");
    args[o + 1] = out.to_string_lossy().into_owned();
    let result = Command::new(words[0])
        .args(&args)
        .current_dir(repo_root())
        .output()
        .expect("running cc");
    assert!(
        result.status.success(),
        "building the C example plugin failed: {} {}\n{}{}",
        words[0],
        args.join(" "),
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    Some(out)
}

/// A plugin folder `c_example/` in `dir` with the freshly built library and `manifest_text` as
/// its `plugin.toml` (the one the tests write when `None`). Returns the library's path there.
fn install_plugin(dir: &TempDir, manifest_text: Option<String>) -> Option<PathBuf> {
    let built = build_plugin(dir.path())?;
    let file = library_file_name(LIB_NAME);
    let text = manifest_text.unwrap_or_else(|| manifest(EP, "1.8", &[EP], &file));
    let installed = dir
        .add_plugin("c_example", &built, Some(&text))
        .expect("install the plugin");
    std::fs::remove_file(&built).expect("remove the build output");
    Some(installed)
}

fn env_for(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment")
}

/// The plugin's live allocation count, read through its exported counter. `lib` must be the
/// library the host loaded: `dlopen` of the same file returns the same instance.
fn live_allocations(lib: &libloading::Library) -> i32 {
    // SAFETY: the C example exports `int epx_c_example_live_allocations(void)`, which only
    // reads an atomic.
    unsafe {
        let f: libloading::Symbol<'_, unsafe extern "C" fn() -> std::ffi::c_int> = lib
            .get(b"epx_c_example_live_allocations")
            .expect("the plugin exports epx_c_example_live_allocations");
        f()
    }
}

// ---------------------------------------------------------------------------------------------
// Models

const X: [f32; 6] = [-1.5, 0.0, 2.0, -0.25, 3.5, -4.0];
const W: [f32; 9] = [0.5, -1.0, 0.25, 1.5, 0.0, -0.75, -0.5, 2.0, 1.0];

/// `x[2,3] → Relu → r; MatMul(r, W) → m; Sigmoid(m) → s; Add(s, x) → a; Tanh(a) → y`, with
/// the shapes of the intermediate values declared (the host runs no shape inference, and
/// `c_example` takes `Add` only when both input shapes are known and equal).
fn mixed_model() -> Vec<u8> {
    let w = proto::TensorProto {
        name: Some("W".into()),
        dims: vec![3, 3],
        data_type: Some(proto::tensor_proto::DataType::Float as i32),
        float_data: W.to_vec(),
        ..Default::default()
    };
    model_bytes(proto::GraphProto {
        name: Some("c_example_mixed".into()),
        node: vec![
            node("Relu", &["x"], &["r"]),
            node("MatMul", &["r", "W"], &["m"]),
            node("Sigmoid", &["m"], &["s"]),
            node("Add", &["s", "x"], &["a"]),
            node("Tanh", &["a"], &["y"]),
        ],
        initializer: vec![w],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        value_info: vec![
            float_value("r", &[2, 3]),
            float_value("m", &[2, 3]),
            float_value("s", &[2, 3]),
            float_value("a", &[2, 3]),
        ],
        ..Default::default()
    })
}

fn x_tensor() -> Tensor {
    Tensor::from_array(
        ndarray::Array::from_shape_vec((2, 3), X.to_vec()).expect("shape matches data"),
    )
}

fn session(env: &Arc<Environment>, eps: Vec<ExecutionProvider>, bytes: &[u8]) -> Session {
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers(eps)
        .expect("providers")
        .commit_from_memory(bytes)
        .expect("session")
}

fn run_y(session: &Session) -> Vec<f32> {
    let out = session.run([("x", x_tensor())]).expect("run");
    out["y"].as_slice::<f32>().expect("y is float32").to_vec()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "element {i}: got {g}, want {w} (tolerance {tol}); all: {got:?} vs {want:?}"
        );
    }
}

fn copy_summary(copies: &[CopyPlacement]) -> Vec<(String, String, String, Option<u64>)> {
    let mut v: Vec<_> = copies
        .iter()
        .map(|c| (c.value.clone(), c.from.clone(), c.to.clone(), c.bytes))
        .collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn readme_and_manifest_describe_the_plugin() {
    let readme = read_example("README.md");
    assert!(
        readme.contains(&format!("```sh\n{README_BUILD_COMMAND}\n```")),
        "examples/c-plugin/README.md must show the build command this test runs, alone in a sh \
         block:\n{README_BUILD_COMMAND}"
    );
    for needle in [
        "`c_example`",
        "`epx examples`",
        "`Relu`",
        "`Sigmoid`",
        "`Tanh`",
        "`Add`",
        "`Mul`",
        "`device_type = 12`",
        "`kDLExtDev`",
        "`allocate`",
        "`free`",
        "`copy_to_device`",
        "`copy_to_host`",
        "`copy_on_device` is NULL",
        "`epx_c_example_live_allocations",
        "`EPX_PROVIDER_CONCURRENT_KERNELS`",
        "cargo test -p epx-tests --test c_plugin",
        "epx --plugin-dir plugins providers",
    ] {
        assert!(
            readme.contains(needle),
            "the README does not mention {needle}"
        );
    }
    let source = read_example("epx_c_example.c");
    for needle in [
        "#define EP_NAME \"c_example\"",
        "#define EP_VENDOR \"epx examples\"",
        "#define EP_DEVICE_TYPE DL_DEVICE_TYPE_EXT_DEV",
        "f->flags = EPX_PROVIDER_CONCURRENT_KERNELS;",
        "p->copy_on_device = NULL;",
        "-lm",
    ] {
        assert!(source.contains(needle), "epx_c_example.c lacks `{needle}`");
    }
    let toml = read_example("plugin.toml");
    for needle in [
        "name = \"c_example\"",
        "abi = \"1.8\"",
        "providers = [\"c_example\"]",
        "linux = \"libepx_c_example.so\"",
    ] {
        assert!(toml.contains(needle), "plugin.toml lacks `{needle}`");
    }
}

#[test]
fn c_source_compiles_without_warnings() {
    if !have_cc() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    let dir = TempDir::new("c-plugin-warnings").expect("temp dir");
    let out = Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Wshadow",
            "-Werror",
            "-c",
        ])
        .arg("-I")
        .arg(repo_root().join("include"))
        .arg(example_file("epx_c_example.c"))
        .arg("-o")
        .arg(dir.path().join("epx_c_example.o"))
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "epx_c_example.c has warnings:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn loads_with_the_example_manifest_and_is_listed() {
    let dir = TempDir::new("c-plugin-load").expect("temp dir");
    let Some(_lib) = install_plugin(&dir, Some(read_example("plugin.toml"))) else {
        return;
    };
    let env = env_for(&dir);
    assert!(
        env.discovery().problems.is_empty(),
        "{:?}",
        env.discovery().problems
    );
    let (lib, index) = env.find_provider(EP).expect("c_example is found and loads");
    assert_eq!(lib.name, "c_example");
    assert_eq!(lib.version, "0.1.0");
    assert_eq!(lib.providers.len(), 1);
    let desc = &lib.providers[index];
    assert_eq!(desc.name, EP);
    assert_eq!(desc.vendor, "epx examples");
    assert_eq!(desc.version, "0.1.0");
    assert_eq!(desc.device_type, 12, "kDLExtDev: its own memory space");
    assert!(desc.concurrent_kernels);
    assert_eq!(desc.availability, Ok(()));

    // `epx --plugin-dir DIR providers` lists it, when the CLI has been built.
    let cli = artifact_dir().join(format!("epx{}", std::env::consts::EXE_SUFFIX));
    if !cli.is_file() {
        eprintln!(
            "skipping the CLI check: {} is missing (run `cargo build --workspace`)",
            cli.display()
        );
        return;
    }
    let out = Command::new(&cli)
        .arg("--plugin-dir")
        .arg(dir.path())
        .arg("providers")
        .output()
        .expect("running epx");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(EP),
        "`epx --plugin-dir {} providers` does not list {EP}:\n{stdout}{}",
        dir.path().display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn runs_its_nodes_in_its_own_memory_and_matches_the_cpu_ep() {
    let dir = TempDir::new("c-plugin-run").expect("temp dir");
    let Some(lib_path) = install_plugin(&dir, None) else {
        return;
    };
    // Opened before the host loads it, so both share one instance (and one counter).
    // SAFETY: the C example's initialisers only zero its globals.
    let counter_lib = unsafe { libloading::Library::new(&lib_path) }.expect("open the plugin");
    assert_eq!(live_allocations(&counter_lib), 0);

    let env = env_for(&dir);
    let bytes = mixed_model();
    let cpu_only = run_y(&session(&env, vec![], &bytes));

    let s = session(
        &env,
        vec![ExecutionProvider::new(EP).error_on_failure()],
        &bytes,
    );
    assert_eq!(s.providers(), [EP, "cpu"]);
    assert_eq!(
        s.node_placement(),
        [EP, "cpu", EP, EP, EP],
        "Relu, MatMul, Sigmoid, Add, Tanh"
    );
    let y = run_y(&s);
    assert_close(&y, &cpu_only, 1e-6);
    // And against a plain evaluation of the model.
    let want: Vec<f32> = (0..6)
        .map(|i| {
            let (row, col) = (i / 3, i % 3);
            let m: f32 = (0..3)
                .map(|k| X[row * 3 + k].max(0.0) * W[k * 3 + col])
                .sum();
            (1.0 / (1.0 + (-m).exp()) + X[i]).tanh()
        })
        .collect();
    assert_close(&y, &want, 1e-5);
    // A second run reuses the compiled kernels.
    assert_close(&run_y(&s), &cpu_only, 1e-6);

    let report = s.placement();
    let groups: Vec<(&str, &[usize])> = report
        .groups
        .iter()
        .map(|g| (g.provider.as_str(), g.nodes.as_slice()))
        .collect();
    assert!(
        groups.contains(&(EP, &[0][..])) && groups.contains(&(EP, &[2, 3, 4][..])),
        "c_example should run {{Relu}} and {{Sigmoid, Add, Tanh}} as two kernels: {groups:?}"
    );
    let host = || "host".to_string();
    let dev = || EP.to_string();
    assert_eq!(
        copy_summary(&report.copies),
        vec![
            ("m".to_string(), host(), dev(), Some(24)),
            ("r".to_string(), dev(), host(), Some(24)),
            ("x".to_string(), host(), dev(), Some(24)),
            ("y".to_string(), dev(), host(), Some(24)),
        ],
        "copies: {:#?}",
        report.copies
    );
    for c in &report.copies {
        assert_eq!(c.last_run_bytes, Some(24), "{c:?}");
    }

    drop(s);
    assert_eq!(
        live_allocations(&counter_lib),
        0,
        "every block the plugin allocated is freed once the session is dropped"
    );
    drop(env);
    assert_eq!(live_allocations(&counter_lib), 0);
}

#[test]
fn declines_add_unless_both_shapes_are_known_and_equal() {
    let dir = TempDir::new("c-plugin-decline").expect("temp dir");
    let Some(_lib) = install_plugin(&dir, None) else {
        return;
    };
    let env = env_for(&dir);
    // `r` has no declared shape, but the host infers [2, 3] from the Relu: c_example takes both.
    let bytes = epx_tests::models::relu_add_model("c_example_inferred");
    let s = session(
        &env,
        vec![ExecutionProvider::new(EP).error_on_failure()],
        &bytes,
    );
    assert_eq!(s.node_placement(), [EP, EP]);
    let want: Vec<f32> = X.iter().map(|&x| x.max(0.0) + x).collect();
    assert_close(&run_y(&s), &want, 1e-6);

    // `t` comes from a Tile, whose shape the host does not infer: the Add is left to the CPU EP.
    let repeats = proto::TensorProto {
        name: Some("repeats".into()),
        data_type: Some(proto::tensor_proto::DataType::Int64 as i32),
        dims: vec![2],
        int64_data: vec![1, 1],
        ..Default::default()
    };
    let bytes = model_bytes(proto::GraphProto {
        name: Some("c_example_decline".into()),
        node: vec![
            node("Tile", &["x", "repeats"], &["t"]),
            node("Add", &["t", "x"], &["y"]),
        ],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        initializer: vec![repeats],
        ..Default::default()
    });
    let s = session(
        &env,
        vec![ExecutionProvider::new(EP).error_on_failure()],
        &bytes,
    );
    assert_eq!(s.node_placement(), ["cpu", "cpu"]);
    let want: Vec<f32> = X.iter().map(|&x| x + x).collect();
    assert_close(&run_y(&s), &want, 1e-6);

    // Declared but different shapes (a broadcast): declined too.
    let bytes = model_bytes(proto::GraphProto {
        name: Some("c_example_broadcast".into()),
        node: vec![node("Mul", &["x", "b"], &["y"])],
        input: vec![float_value("x", &[2, 3]), float_value("b", &[3])],
        output: vec![float_value("y", &[2, 3])],
        ..Default::default()
    });
    let s = session(&env, vec![ExecutionProvider::new(EP)], &bytes);
    assert_eq!(s.node_placement(), ["cpu"]);
}

#[test]
fn refuses_options() {
    let dir = TempDir::new("c-plugin-options").expect("temp dir");
    let Some(_lib) = install_plugin(&dir, None) else {
        return;
    };
    let env = env_for(&dir);
    let err = Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new(EP)
            .with_option("threads", "2")
            .error_on_failure()])
        .expect("providers")
        .commit_from_memory(&mixed_model())
        .err()
        .expect("an unknown option fails the session");
    let text = err.to_string();
    assert!(
        text.contains("c_example: unknown option `threads`: this EP takes no options"),
        "{text}"
    );
    assert!(matches!(err, Error::ProviderSetup { .. }), "{err:?}");
}

#[test]
fn outputs_can_stay_in_the_plugins_memory_until_asked_for() {
    let dir = TempDir::new("c-plugin-device-out").expect("temp dir");
    let Some(lib_path) = install_plugin(&dir, None) else {
        return;
    };
    // SAFETY: the C example's initialisers only zero its globals.
    let counter_lib = unsafe { libloading::Library::new(&lib_path) }.expect("open the plugin");
    let env = env_for(&dir);
    let bytes = mixed_model();
    let cpu_only = run_y(&session(&env, vec![], &bytes));

    let s = Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new(EP).error_on_failure()])
        .expect("EPs")
        .with_device_outputs(["y"])
        .commit_from_memory(&bytes)
        .expect("session");
    // No copy brings `y` back: three copies instead of four.
    let report = s.placement();
    assert_eq!(report.copies.len(), 3, "{:#?}", report.copies);
    assert!(
        report.copies.iter().all(|c| c.value != "y"),
        "{:#?}",
        report.copies
    );

    let outputs = s.run([("x", x_tensor())]).expect("run");
    assert!(outputs.get("y").is_none(), "y is not in host memory");
    let y = outputs.device("y").expect("y stays on the device");
    assert_eq!(y.provider_name(), EP);
    assert_eq!(y.shape(), &[2, 3]);
    assert!(
        live_allocations(&counter_lib) > 0,
        "y's block is still allocated in the plugin"
    );
    let host = y.to_host().expect("copy y to the host later");
    assert_close(host.as_slice::<f32>().expect("f32"), &cpu_only, 1e-6);

    drop(outputs);
    drop(s);
    assert_eq!(
        live_allocations(&counter_lib),
        0,
        "dropping the output frees its device block"
    );

    // Naming something that is not an output is an error, not a silent no-op.
    let err = Session::builder()
        .expect("builder")
        .with_environment(env)
        .with_device_outputs(["r"])
        .commit_from_memory(&bytes)
        .err()
        .expect("r is not a graph output");
    assert_eq!(
        err.to_string(),
        "`r` given to with_device_outputs is not an output of the model"
    );
}

/// `epx conformance --ep c_example` on the node tests of its five ops and on mnist-cnn: what it
/// claims passes (in its own memory space), what it declines says why, nothing crashes.
#[test]
fn the_c_example_passes_epx_conformance_on_its_ops() {
    let dir = TempDir::new("c-plugin-conformance").expect("temp dir");
    if install_plugin(&dir, None).is_none() {
        return;
    }
    let Some((code, out)) = epx_tests::run_conformance(
        dir.path(),
        EP,
        "test_relu,test_sigmoid,test_tanh,test_add,test_mul",
        &[],
    ) else {
        return;
    };
    let (cases, claimed, passed, wrong, crashed, declined) = epx_tests::conformance_totals(&out);
    assert!(claimed >= 5 && claimed + declined == cases, "{out}");
    assert_eq!((passed, wrong, crashed), (claimed, 0, 0), "{out}");
    assert!(out.contains("not claimed by c_example"), "{out}");
    assert_eq!(code, Some(0), "{out}");
}
