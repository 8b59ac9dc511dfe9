//! Loading real plugin libraries that are broken in each way we know of (the fixtures under
//! `tests/fixtures/`), checking the exact error kind and message, and that a good plugin in the
//! same plugin folder and the same environment still loads and runs afterwards.
//!
//! Needs the fixture libraries built: `cargo build --workspace` before `cargo test`.

use std::sync::Arc;

use epx::onnx::proto;
use epx::plugin::discover::DiscoveryError;
use epx::plugin::manifest::ManifestError;
use epx::{Environment, Error, ExecutionProvider, PluginLoadErrorKind, Session, Tensor};
use epx_plugin_api::abi::{EpxStatusCode, EpxVersion};
use epx_tests::models::{float_value, int_attr, model_bytes, node};
use epx_tests::{TempDir, fixture_library, manifest};
use prost::Message;

// ---------------------------------------------------------------------------------------------
// The test model: y = Sigmoid(Relu(x) + x), x and y float32 [2, 3].

const X: [f32; 6] = [-1.5, 0.0, 2.0, -0.25, 3.5, -4.0];

/// x → Relu → r; Add(r, x) → s; Sigmoid(s) → y.
fn relu_add_sigmoid_model() -> Vec<u8> {
    let graph = proto::GraphProto {
        name: Some("relu_add_sigmoid".into()),
        node: vec![
            node("Relu", &["x"], &["r"]),
            node("Add", &["r", "x"], &["s"]),
            node("Sigmoid", &["s"], &["y"]),
        ],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        ..Default::default()
    };
    model_bytes(graph)
}

fn input() -> Tensor {
    Tensor::from_array(
        ndarray::Array::from_shape_vec((2, 3), X.to_vec()).expect("shape matches data"),
    )
}

fn expected() -> Vec<f32> {
    X.iter()
        .map(|&x| 1.0 / (1.0 + (-(x.max(0.0) + x)).exp()))
        .collect()
}

fn session(
    env: &Arc<Environment>,
    eps: impl IntoIterator<Item = ExecutionProvider>,
) -> epx::Result<Session> {
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers(eps)?
        .commit_from_memory(&relu_add_sigmoid_model())
}

fn run_y(session: &Session) -> Vec<f32> {
    let out = session.run([("x", input())]).expect("run");
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

fn env_for(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment")
}

/// A plugin folder with the good plugin (`older_minor`: EPs `relu_only`, `never_available`).
fn dir_with_good_plugin(tag: &str) -> TempDir {
    dir_with_manifest(tag, "older_minor", "1.0", &["relu_only", "never_available"])
}

/// Adds fixture `name` to `dir` as plugin `name` offering EP `ep`; returns the copied library.
fn add_fixture(dir: &TempDir, name: &str, abi: &str, ep: &str) -> std::path::PathBuf {
    let lib = fixture_library(name);
    let file = lib
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name")
        .to_string();
    dir.add_plugin(name, &lib, Some(&manifest(name, abi, &[ep], &file)))
        .expect("copy fixture")
}

/// The good plugin loads and runs in `env`, whatever failed before in it.
fn assert_good_plugin_works(env: &Arc<Environment>) {
    let (lib, index) = env.find_provider("relu_only").expect("relu_only is found");
    assert_eq!(lib.name, "older_minor");
    assert_eq!(lib.providers[index].name, "relu_only");
    let s = session(
        env,
        [ExecutionProvider::new("relu_only").error_on_failure()],
    )
    .expect("session on relu_only");
    assert_eq!(s.providers(), ["relu_only", "cpu"]);
    assert_eq!(s.node_placement(), ["relu_only", "cpu", "cpu"]);
    assert_close(&run_y(&s), &expected(), 1e-6);
}

fn load_error(result: epx::Result<impl std::fmt::Debug>) -> (PluginLoadErrorKind, String) {
    match result {
        Err(Error::PluginLoad { kind, message, .. }) => (kind, message),
        other => panic!("expected a plugin load error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The good plugin

#[test]
fn good_plugin_runs_relu_and_matches_cpu() {
    let dir = dir_with_good_plugin("good");
    let env = env_for(&dir);
    assert!(
        env.discovery().problems.is_empty(),
        "{:?}",
        env.discovery().problems
    );

    let (lib, _) = env.find_provider("relu_only").expect("relu_only");
    // The descriptor is pinned to the ABI 1.0 layout: an older minor than the host's 1.1, which
    // loads and runs.
    assert_eq!(
        lib.abi_version,
        EpxVersion {
            major: 1,
            minor: 0,
            patch: 0
        }
    );
    assert_eq!(
        lib.path.as_deref(),
        Some(
            dir.path()
                .join("older_minor")
                .join(epx_tests::library_file_name("epx_fixture_older_minor"))
                .as_path()
        )
    );
    let names: Vec<&str> = lib.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["relu_only", "never_available"]);
    assert!(lib.providers[0].availability.is_ok());
    assert!(lib.providers[0].concurrent_kernels);

    let cpu_only = session(&env, []).expect("cpu session");
    assert_eq!(cpu_only.providers(), ["cpu"]);
    let on_plugin = session(
        &env,
        [ExecutionProvider::new("relu_only").error_on_failure()],
    )
    .expect("plugin session");
    assert_eq!(on_plugin.providers(), ["relu_only", "cpu"]);
    assert_eq!(on_plugin.node_placement(), ["relu_only", "cpu", "cpu"]);
    let (a, b) = (run_y(&cpu_only), run_y(&on_plugin));
    assert_close(&b, &a, 1e-6);
    assert_close(&a, &expected(), 1e-6);

    // Plugin-qualified name, and an option the EP knows.
    let qualified = session(
        &env,
        [ExecutionProvider::new("older_minor/relu_only").error_on_failure()],
    )
    .expect("qualified");
    assert_eq!(qualified.providers(), ["relu_only", "cpu"]);
    let declined = session(
        &env,
        [ExecutionProvider::new("relu_only")
            .with_option("claim", "false")
            .error_on_failure()],
    )
    .expect("claim=false");
    assert_eq!(declined.providers(), ["cpu"]);
    assert_close(&run_y(&declined), &expected(), 1e-6);
}

// ---------------------------------------------------------------------------------------------
// One test per broken fixture

/// x → Relu → r; Cast(r) to float8e4m3fn → q; Cast(q) to float → y (opset 19).
fn relu_float8_model() -> Vec<u8> {
    let cast = |input: &str, output: &str, to: proto::tensor_proto::DataType| {
        let mut n = node("Cast", &[input], &[output]);
        n.attribute.push(int_attr("to", to as i64));
        n
    };
    let graph = proto::GraphProto {
        name: Some("relu_float8".into()),
        node: vec![
            node("Relu", &["x"], &["r"]),
            cast("r", "q", proto::tensor_proto::DataType::Float8e4m3fn),
            cast("q", "y", proto::tensor_proto::DataType::Float),
        ],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        ..Default::default()
    };
    let mut model = proto::ModelProto::decode(model_bytes(graph).as_slice()).expect("model");
    model.ir_version = Some(9);
    model.opset_import[0].version = Some(19);
    model.encode_to_vec()
}

/// A session whose first EP is relu_only (ABI 1.0) claiming every node the host offers it.
fn claiming_everything(env: &Arc<Environment>, model: &[u8]) -> Session {
    Session::builder()
        .unwrap()
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new("relu_only")
            .with_option("claim_all", "true")
            .error_on_failure()])
        .unwrap()
        .commit_from_memory(model)
        .expect("session")
}

#[test]
fn a_1_0_plugin_is_not_offered_nodes_with_element_types_newer_than_its_abi() {
    let dir = dir_with_good_plugin("older-types");
    let env = env_for(&dir);
    // relu_only claims every node it is offered; the host offers it only the Relu, because
    // the Casts touch a float8 value, which a 1.0 plugin cannot read.
    let s = claiming_everything(&env, &relu_float8_model());
    assert_eq!(s.node_placement(), ["relu_only", "cpu", "cpu"]);
    // Every value of relu(x) is exact in float8e4m3fn.
    let want: Vec<f32> = X.iter().map(|x| x.max(0.0)).collect();
    assert_close(&run_y(&s), &want, 0.0);
}

/// Relu, then its result through a sequence: SequenceConstruct, SequenceAt (position 0).
fn relu_sequence_model() -> Vec<u8> {
    let zero = proto::TensorProto {
        name: Some("zero".into()),
        data_type: Some(proto::tensor_proto::DataType::Int64 as i32),
        int64_data: vec![0],
        ..Default::default()
    };
    let graph = proto::GraphProto {
        name: Some("relu_sequence".into()),
        node: vec![
            node("Relu", &["x"], &["r"]),
            node("SequenceConstruct", &["r"], &["s"]),
            node("SequenceAt", &["s", "zero"], &["y"]),
        ],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        initializer: vec![zero],
        ..Default::default()
    };
    let mut model = proto::ModelProto::decode(model_bytes(graph).as_slice()).expect("model");
    model.ir_version = Some(9);
    model.opset_import[0].version = Some(19);
    model.encode_to_vec()
}

#[test]
fn a_1_0_plugin_is_not_offered_nodes_that_make_or_read_sequences() {
    let dir = dir_with_good_plugin("older-values");
    let env = env_for(&dir);
    // relu_only (ABI 1.0) claims every node it is offered; the sequence ops are not offered to
    // it, although the model declares no type for the sequence between them.
    let s = claiming_everything(&env, &relu_sequence_model());
    assert_eq!(s.node_placement(), ["relu_only", "cpu", "cpu"]);
    let want: Vec<f32> = X.iter().map(|x| x.max(0.0)).collect();
    assert_close(&run_y(&s), &want, 0.0);
}

#[test]
fn abi_too_new_is_refused_and_its_descriptor_released() {
    let dir = dir_with_good_plugin("abi-too-new");
    // Honest manifest (abi = "2.0"): refused from the manifest, without running library code.
    let honest = add_fixture(&dir, "abi_too_new", "2.0", "too_new");
    // Stale manifest (abi = "1.0") on the same library: only the descriptor tells.
    let lib = fixture_library("abi_too_new");
    let file = lib
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name")
        .to_string();
    let stale = dir
        .add_plugin(
            "abi_too_new_stale",
            &lib,
            Some(&manifest(
                "abi_too_new_stale",
                "1.0",
                &["too_new_stale"],
                &file,
            )),
        )
        .expect("copy fixture");
    let env = env_for(&dir);

    // Keep both copies loaded across the host's attempts, so their counters can be read after
    // the host unloads its own handles (dlopen of the same file returns the same instance).
    let honest_handle = dl::Handle::open(&honest);
    let stale_handle = dl::Handle::open(&stale);

    for ep in ["too_new", "too_new_stale"] {
        let (kind, message) = load_error(env.find_provider(ep));
        assert_eq!(kind, PluginLoadErrorKind::AbiMismatch, "{ep}: {message}");
        assert!(
            message.contains("2.0"),
            "{ep}: message should name the plugin's ABI 2.0: {message}"
        );
        let host = format!(
            "{}.{}",
            epx_plugin_api::abi::EPX_ABI_VERSION_MAJOR,
            epx_plugin_api::abi::EPX_ABI_VERSION_MINOR
        );
        assert!(
            message.contains(&host),
            "{ep}: message should name the host's ABI {host}: {message}"
        );
        // Asking again gives the same answer without calling the plugin again.
        let (again, _) = load_error(env.find_provider(ep));
        assert_eq!(again, PluginLoadErrorKind::AbiMismatch);
    }
    // The same through a session.
    match session(
        &env,
        [ExecutionProvider::new("too_new_stale").error_on_failure()],
    ) {
        Err(Error::PluginLoad {
            kind: PluginLoadErrorKind::AbiMismatch,
            ..
        }) => {}
        Err(other) => panic!("expected AbiMismatch, got {other:?}"),
        Ok(_) => panic!("expected AbiMismatch, got a session"),
    }

    match (honest_handle, stale_handle) {
        (Some(honest), Some(stale)) => {
            assert_eq!(
                honest.counter(c"epx_fixture_descriptors_made"),
                Some(0),
                "a 2.0 manifest must stop the host before the entry call"
            );
            assert_eq!(
                stale.counter(c"epx_fixture_descriptors_made"),
                Some(1),
                "entry called once"
            );
            assert_eq!(
                stale.counter(c"epx_fixture_descriptors_released"),
                Some(1),
                "the refused descriptor must be released once"
            );
        }
        _ => eprintln!(
            "note: could not dlopen the fixture here; entry calls and descriptor release not checked"
        ),
    }

    assert_good_plugin_works(&env);
}

#[test]
fn no_entry_symbol_is_refused() {
    let dir = dir_with_good_plugin("no-entry");
    add_fixture(&dir, "no_entry", "1.0", "no_entry");
    let env = env_for(&dir);
    let (kind, message) = load_error(env.find_provider("no_entry"));
    assert_eq!(kind, PluginLoadErrorKind::MissingEntry, "{message}");
    assert!(message.contains("epx_plugin_entry"), "{message}");
    assert_good_plugin_works(&env);
}

#[test]
fn entry_failure_reports_the_plugins_reason() {
    let dir = dir_with_good_plugin("entry-null");
    add_fixture(&dir, "entry_null", "1.0", "licensed");
    let env = env_for(&dir);
    let (kind, message) = load_error(env.find_provider("licensed"));
    assert_eq!(kind, PluginLoadErrorKind::EntryFailed, "{message}");
    assert!(
        message.contains("license key not found in EPX_FIXTURE_LICENSE"),
        "{message}"
    );
    // Through a session too, as a user would meet it.
    match session(
        &env,
        [ExecutionProvider::new("licensed").error_on_failure()],
    ) {
        Err(Error::PluginLoad {
            kind: PluginLoadErrorKind::EntryFailed,
            message,
            ..
        }) => {
            assert!(message.contains("EPX_FIXTURE_LICENSE"), "{message}");
        }
        Err(other) => panic!("expected an EntryFailed plugin load error, got {other:?}"),
        Ok(_) => panic!("expected an EntryFailed plugin load error, got a session"),
    }
    assert_good_plugin_works(&env);
}

#[test]
fn entry_panic_is_caught() {
    let dir = dir_with_good_plugin("entry-panic");
    add_fixture(&dir, "entry_panic", "1.0", "entry_panic");
    let env = env_for(&dir);
    let (kind, message) = load_error(env.find_provider("entry_panic"));
    assert_eq!(kind, PluginLoadErrorKind::EntryPanicked, "{message}");
    assert!(message.contains("panic"), "{message}");
    assert!(
        message.contains("fixture: panic during plugin init"),
        "{message}"
    );
    assert_good_plugin_works(&env);
}

#[test]
fn execute_panic_is_an_error_every_run() {
    let dir = dir_with_good_plugin("execute-panic");
    add_fixture(&dir, "execute_panic", "1.0", "panicky");
    let env = env_for(&dir);
    let s = session(&env, [ExecutionProvider::new("panicky").error_on_failure()])
        .expect("session creation works");
    assert_eq!(s.providers(), ["panicky", "cpu"]);
    for attempt in 0..2 {
        match s.run([("x", input())]) {
            Err(Error::Provider {
                provider,
                call,
                code,
                message,
            }) => {
                assert_eq!(provider, "panicky");
                assert_eq!(call, "execute");
                assert_eq!(code, EpxStatusCode::Panic, "{message}");
                assert!(
                    message.contains("fixture: panic in execute"),
                    "run {attempt}: {message}"
                );
            }
            other => panic!("run {attempt}: expected a Provider execute error, got {other:?}"),
        }
    }
    assert_good_plugin_works(&env);
}

#[test]
fn missing_dependency_names_the_library_and_where_it_looked() {
    let dir = dir_with_good_plugin("missing-dep");
    let copied = add_fixture(&dir, "missing_dep", "1.0", "vendor_ep");
    let needed = epx::plugin::resolve::needed_libraries(&copied).expect("read the fixture's ELF");
    if !needed
        .needed
        .iter()
        .any(|n| n == "libepx_vendor_runtime.so.3")
    {
        eprintln!(
            "SKIPPED missing-dependency case: {} was built without its vendor runtime dependency \
             (no C compiler when tests/fixtures/missing_dep/build.rs ran; see its cargo warning). \
             Its DT_NEEDED entries: {:?}",
            copied.display(),
            needed.needed
        );
        assert_good_plugin_works(
            &Environment::builder()
                .with_plugin_dirs([dir.path()])
                .commit()
                .expect("env"),
        );
        return;
    }
    let env = env_for(&dir);
    let (kind, message) = load_error(env.find_provider("vendor_ep"));
    assert_eq!(kind, PluginLoadErrorKind::MissingDependency, "{message}");
    assert!(message.contains("libepx_vendor_runtime.so.3"), "{message}");
    assert!(
        message.contains("searched"),
        "the message should list the places searched: {message}"
    );
    let plugin_dir = copied.parent().expect("plugin folder");
    assert!(
        message.contains(&plugin_dir.display().to_string()),
        "the places searched should include the plugin folder: {message}"
    );
    assert_good_plugin_works(&env);
}

// ---------------------------------------------------------------------------------------------
// Discovery problems: the other plugins are still found

#[test]
fn manifest_naming_a_missing_library_is_a_discovery_problem() {
    let dir = dir_with_good_plugin("ghost");
    dir.write(
        "ghost/plugin.toml",
        &manifest("ghost", "1.0", &["ghost"], "libepx_ghost.so"),
    )
    .expect("write");
    let env = env_for(&dir);
    let problems = &env.discovery().problems;
    assert_eq!(problems.len(), 1, "{problems:?}");
    match &problems[0].error {
        DiscoveryError::LibraryMissing {
            library,
            dir: in_dir,
            manifest,
        } => {
            assert_eq!(library, "libepx_ghost.so");
            assert_eq!(in_dir, &dir.path().join("ghost"));
            assert_eq!(manifest, &dir.path().join("ghost").join("plugin.toml"));
        }
        other => panic!("expected LibraryMissing, got {other:?}"),
    }
    assert!(problems[0].error.to_string().contains("libepx_ghost.so"));
    assert!(env.discovery().find("older_minor").is_some());
    assert!(env.discovery().find("ghost").is_none());
    assert_good_plugin_works(&env);
}

#[test]
fn garbage_manifest_is_a_syntax_problem() {
    let dir = dir_with_good_plugin("garbage");
    let garbage = dir
        .write("garbage/plugin.toml", "this is [not a manifest\n= = =\n")
        .expect("write");
    let env = env_for(&dir);
    let problems = &env.discovery().problems;
    assert_eq!(problems.len(), 1, "{problems:?}");
    match &problems[0].error {
        DiscoveryError::Manifest(ManifestError::Syntax { path, message }) => {
            assert_eq!(path, &garbage);
            assert!(!message.is_empty());
        }
        other => panic!("expected a manifest syntax error, got {other:?}"),
    }
    assert!(
        problems[0]
            .error
            .to_string()
            .contains(&garbage.display().to_string())
    );
    assert!(env.discovery().find("older_minor").is_some());
    assert_good_plugin_works(&env);
}

// ---------------------------------------------------------------------------------------------
// The `sha256` pin of plugin.toml

/// The SHA-256 of a file as `sha256sum` prints it, computed here independently of the host.
fn sha256_hex(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).expect("read library");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `manifest` with a top-level `sha256 = "<digest>"` (top-level keys come before `[library]`).
fn pinned(manifest: &str, digest: &str) -> String {
    format!("sha256 = {digest:?}\n{manifest}")
}

#[test]
fn library_matching_its_sha256_pin_loads_and_runs() {
    let dir = TempDir::new("sha256-good").expect("temp dir");
    let lib = fixture_library("older_minor");
    let file = epx_tests::library_file_name("epx_fixture_older_minor");
    let digest = sha256_hex(&lib);
    // Any case is accepted.
    let text = pinned(
        &manifest(
            "older_minor",
            "1.0",
            &["relu_only", "never_available"],
            &file,
        ),
        &digest.to_ascii_uppercase(),
    );
    let copied = dir
        .add_plugin("older_minor", &lib, Some(&text))
        .expect("copy older_minor");
    assert_eq!(sha256_hex(&copied), digest);

    let env = env_for(&dir);
    assert!(
        env.discovery().problems.is_empty(),
        "{:?}",
        env.discovery().problems
    );
    let candidate = env.discovery().find("older_minor").expect("discovered");
    assert_eq!(
        candidate
            .manifest
            .as_ref()
            .and_then(|m| m.sha256.as_deref()),
        Some(digest.as_str())
    );
    assert_eq!(
        candidate.verify_sha256().expect("matches"),
        Some(digest.clone())
    );
    assert_good_plugin_works(&env);
    let (lib, _) = env.find_provider("relu_only").expect("relu_only");
    assert_eq!(lib.path.as_deref(), Some(copied.as_path()));
}

#[test]
fn library_not_matching_its_sha256_pin_is_refused_before_it_runs() {
    let dir = dir_with_good_plugin("sha256-bad");
    // The manifest pins the good library; the file in the folder was replaced by another
    // plugin's library (one whose entry function panics). Had the host opened it, the error
    // would be EntryPanicked.
    let original = fixture_library("older_minor");
    let expected = sha256_hex(&original);
    let file = epx_tests::library_file_name("epx_fixture_older_minor");
    let tampered = dir
        .add_plugin(
            "tampered",
            &original,
            Some(&pinned(
                &manifest("tampered", "1.0", &["tampered"], &file),
                &expected,
            )),
        )
        .expect("copy older_minor");
    std::fs::copy(fixture_library("entry_panic"), &tampered).expect("replace the library");
    let actual = sha256_hex(&tampered);
    assert_ne!(actual, expected);
    // A malformed pin is a manifest problem found by discovery, naming the field.
    let malformed = dir
        .write(
            "malformed/plugin.toml",
            &pinned(
                &manifest("malformed", "1.0", &["malformed"], &file),
                &expected[..63],
            ),
        )
        .expect("write");
    std::fs::copy(&original, dir.path().join("malformed").join(&file)).expect("copy");

    let env = env_for(&dir);
    let problems = &env.discovery().problems;
    assert_eq!(problems.len(), 1, "{problems:?}");
    match &problems[0].error {
        DiscoveryError::Manifest(ManifestError::Invalid {
            path,
            field,
            message,
        }) => {
            assert_eq!(path, &malformed);
            assert_eq!(field, "sha256");
            assert!(
                message.contains("has 63 hex digits; expected 64"),
                "{message}"
            );
        }
        other => panic!("expected an invalid sha256 field, got {other:?}"),
    }

    for attempt in 0..2 {
        let (kind, message) = load_error(env.find_provider("tampered"));
        assert_eq!(
            kind,
            PluginLoadErrorKind::ChecksumMismatch,
            "attempt {attempt}: {message}"
        );
        for needle in [
            expected.as_str(),
            actual.as_str(),
            &tampered.display().to_string(),
            &dir.path()
                .join("tampered")
                .join("plugin.toml")
                .display()
                .to_string(),
            "Reinstall the plugin",
            "update the pin to",
        ] {
            assert!(
                message.contains(needle),
                "attempt {attempt}: message should contain {needle:?}: {message}"
            );
        }
    }
    // The same through a session, as a user would meet it; the error names the library.
    match session(
        &env,
        [ExecutionProvider::new("tampered").error_on_failure()],
    ) {
        Err(
            e @ Error::PluginLoad {
                kind: PluginLoadErrorKind::ChecksumMismatch,
                ..
            },
        ) => {
            let text = e.to_string();
            assert!(
                text.starts_with(&format!(
                    "plugin {}: SHA-256 mismatch: ",
                    tampered.display()
                )),
                "{text}"
            );
        }
        Err(other) => panic!("expected ChecksumMismatch, got {other:?}"),
        Ok(_) => panic!("expected ChecksumMismatch, got a session"),
    }
    assert_good_plugin_works(&env);

    // Control: without the pin the same file is opened, and its entry function runs (and
    // panics). So the refusal above came before any of its code ran.
    let unpinned = TempDir::new("sha256-control").expect("temp dir");
    let copy = unpinned
        .add_plugin(
            "tampered",
            &original,
            Some(&manifest("tampered", "1.0", &["tampered"], &file)),
        )
        .expect("copy");
    std::fs::copy(fixture_library("entry_panic"), &copy).expect("replace the library");
    let (kind, message) = load_error(env_for(&unpinned).find_provider("tampered"));
    assert_eq!(kind, PluginLoadErrorKind::EntryPanicked, "{message}");
}

// ---------------------------------------------------------------------------------------------
// Two plugins claiming the same EP name

#[test]
fn same_ep_in_two_folders_is_reported_and_the_first_folder_wins() {
    let first = TempDir::new("shadow-first").expect("temp dir");
    let second = TempDir::new("shadow-second").expect("temp dir");
    let lib = fixture_library("older_minor");
    let file = epx_tests::library_file_name("epx_fixture_older_minor");
    let eps = ["relu_only", "never_available"];
    let first_lib = first
        .add_plugin(
            "first",
            &lib,
            Some(&manifest("first_relu", "1.0", &eps, &file)),
        )
        .expect("copy");
    let second_lib = second
        .add_plugin(
            "second",
            &lib,
            Some(&manifest("second_relu", "1.0", &eps, &file)),
        )
        .expect("copy");

    let env = Environment::builder()
        .with_plugin_dirs([first.path(), second.path()])
        .commit()
        .expect("environment");
    let discovery = env.discovery();
    assert!(discovery.problems.is_empty(), "{:?}", discovery.problems);
    let shadowed: Vec<(&str, &str, &std::path::Path, &str, &std::path::Path)> = discovery
        .shadowed
        .iter()
        .map(|s| {
            (
                s.provider.as_str(),
                s.winner.as_str(),
                s.winner_library.as_path(),
                s.shadowed.as_str(),
                s.shadowed_library.as_path(),
            )
        })
        .collect();
    assert_eq!(
        shadowed,
        [
            (
                "relu_only",
                "first_relu",
                first_lib.as_path(),
                "second_relu",
                second_lib.as_path()
            ),
            (
                "never_available",
                "first_relu",
                first_lib.as_path(),
                "second_relu",
                second_lib.as_path()
            ),
        ]
    );
    let text = discovery.shadowed[0].to_string();
    for needle in [
        "EP `relu_only`",
        &first_lib.display().to_string(),
        &second_lib.display().to_string(),
        "ask for `second_relu/relu_only`",
    ] {
        assert!(text.contains(needle), "should contain {needle:?}: {text}");
    }

    // The EP resolves to the first folder's plugin, for lookups and sessions alike.
    let (winner, _) = env.find_provider("relu_only").expect("relu_only");
    assert_eq!(winner.path.as_deref(), Some(first_lib.as_path()));
    assert_good_plugin_works(&env);
    // The shadowed one stays reachable by its plugin name.
    let (other, _) = env
        .find_provider("second_relu/relu_only")
        .expect("qualified");
    assert_eq!(other.path.as_deref(), Some(second_lib.as_path()));

    // The search order decides: the other way round, the other plugin wins.
    let env = Environment::builder()
        .with_plugin_dirs([second.path(), first.path()])
        .commit()
        .expect("environment");
    let (winner, _) = env.find_provider("relu_only").expect("relu_only");
    assert_eq!(winner.path.as_deref(), Some(second_lib.as_path()));
    assert_eq!(
        env.discovery()
            .shadowing(&first_lib, "relu_only")
            .map(|s| s.winner_library.clone()),
        Some(second_lib.clone())
    );
}

// ---------------------------------------------------------------------------------------------
// Asking for EPs that do not exist, do not take an option, or cannot run here

#[test]
fn unknown_ep_lists_the_known_ones() {
    let dir = dir_with_good_plugin("unknown-ep");
    let env = env_for(&dir);
    let err = match session(
        &env,
        [ExecutionProvider::new("frobnicator").error_on_failure()],
    ) {
        Err(e) => e,
        Ok(_) => panic!("an unknown EP with error_on_failure must fail the session"),
    };
    match &err {
        Error::ProviderSetup { name, message } => {
            assert_eq!(name, "frobnicator");
            assert!(message.contains("known EPs"), "{message}");
            for ep in ["relu_only", "never_available", "cpu"] {
                assert!(message.contains(ep), "should list {ep}: {message}");
            }
            assert!(
                message.contains(&dir.path().display().to_string()),
                "should list the folders searched: {message}"
            );
        }
        other => panic!("expected ProviderSetup, got {other:?}"),
    }
    // Without error_on_failure the session runs on what is there.
    let s = session(&env, [ExecutionProvider::new("frobnicator")])
        .expect("session without the unknown EP");
    assert_eq!(s.providers(), ["cpu"]);
    assert_eq!(s.skipped_providers().len(), 1);
    assert_eq!(s.skipped_providers()[0].0, "frobnicator");
    assert_close(&run_y(&s), &expected(), 1e-6);
}

#[test]
fn unknown_option_names_the_valid_keys() {
    let dir = dir_with_good_plugin("unknown-option");
    let env = env_for(&dir);
    let err = match session(
        &env,
        [ExecutionProvider::new("relu_only")
            .with_option("colour", "red")
            .error_on_failure()],
    ) {
        Err(e) => e,
        Ok(_) => panic!("an unknown option with error_on_failure must fail the session"),
    };
    match &err {
        Error::ProviderSetup { name, message } => {
            assert_eq!(name, "relu_only");
            assert!(message.contains("colour"), "{message}");
            assert!(message.contains("valid keys: claim"), "{message}");
        }
        other => panic!("expected ProviderSetup, got {other:?}"),
    }
    // A bad value is refused the same way.
    match session(
        &env,
        [ExecutionProvider::new("relu_only")
            .with_option("claim", "maybe")
            .error_on_failure()],
    ) {
        Err(Error::ProviderSetup { message, .. }) => assert!(
            message.contains("`maybe` is not true or false"),
            "{message}"
        ),
        Err(other) => panic!("expected ProviderSetup, got {other:?}"),
        Ok(_) => panic!("a bad option value must fail the session"),
    }
    assert_good_plugin_works(&env);
}

#[test]
fn unavailable_ep_fails_or_is_skipped() {
    let dir = dir_with_good_plugin("unavailable");
    let env = env_for(&dir);
    let reason = "fixture: needs the Frobnicator 9000 driver";

    let (lib, index) = env
        .find_provider("never_available")
        .expect("found, though unavailable");
    assert_eq!(lib.providers[index].availability, Err(reason.to_string()));

    match session(
        &env,
        [ExecutionProvider::new("never_available").error_on_failure()],
    ) {
        Err(Error::ProviderSetup { name, message }) => {
            assert_eq!(name, "never_available");
            assert!(message.contains(reason), "{message}");
        }
        Err(other) => panic!("expected ProviderSetup, got {other:?}"),
        Ok(_) => panic!("an unavailable EP with error_on_failure must fail the session"),
    }

    let s = session(&env, [ExecutionProvider::new("never_available")])
        .expect("session falls back to CPU");
    assert_eq!(s.providers(), ["cpu"]);
    let skipped = s.skipped_providers();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].0, "never_available");
    assert!(skipped[0].1.contains(reason), "{skipped:?}");
    assert_close(&run_y(&s), &expected(), 1e-6);

    // An unavailable EP first in line does not stop the next one from being used.
    let s = session(
        &env,
        [
            ExecutionProvider::new("never_available"),
            ExecutionProvider::new("relu_only"),
        ],
    )
    .expect("session");
    assert_eq!(s.providers(), ["relu_only", "cpu"]);
    assert_eq!(s.skipped_providers().len(), 1);
    assert_close(&run_y(&s), &expected(), 1e-6);
}

#[test]
fn all_broken_plugins_in_one_folder() {
    // Every fixture side by side, as a messy real plugin folder would be: each fails on its
    // own, and the good one is unaffected.
    let dir = dir_with_good_plugin("all");
    for (name, abi, ep) in [
        ("abi_too_new", "2.0", "too_new"),
        ("no_entry", "1.0", "no_entry"),
        ("entry_null", "1.0", "licensed"),
        ("entry_panic", "1.0", "entry_panic"),
        ("execute_panic", "1.0", "panicky"),
        ("missing_dep", "1.0", "vendor_ep"),
    ] {
        add_fixture(&dir, name, abi, ep);
    }
    let env = env_for(&dir);
    assert!(
        env.discovery().problems.is_empty(),
        "{:?}",
        env.discovery().problems
    );
    let results = env.load_all();
    assert_eq!(results.len(), 7);
    for (candidate, result) in &results {
        let expected = match candidate.name.as_str() {
            "older_minor" | "execute_panic" => None,
            "abi_too_new" => Some(PluginLoadErrorKind::AbiMismatch),
            "no_entry" => Some(PluginLoadErrorKind::MissingEntry),
            "entry_null" => Some(PluginLoadErrorKind::EntryFailed),
            "entry_panic" => Some(PluginLoadErrorKind::EntryPanicked),
            // MissingDependency, or loads when built without its dependency (no C compiler).
            "missing_dep" => continue,
            other => panic!("unexpected plugin {other}"),
        };
        match (expected, result) {
            (None, Ok(_)) => {}
            (Some(kind), Err(Error::PluginLoad { kind: got, .. })) => {
                assert_eq!(*got, kind, "{}", candidate.name)
            }
            (want, got) => panic!("{}: expected {want:?}, got {got:?}", candidate.name),
        }
    }
    // A plugin whose kernels panic and six that do not load leave the good one usable.
    let s = session(
        &env,
        [ExecutionProvider::new("relu_only").error_on_failure()],
    )
    .expect("session");
    assert_eq!(s.providers(), ["relu_only", "cpu"]);
    assert_close(&run_y(&s), &expected(), 1e-6);
    assert_good_plugin_works(&env);
}

// ---------------------------------------------------------------------------------------------
// A minimal dlopen wrapper, to read the abi_too_new fixture's counters.

mod dl {
    use std::ffi::{CStr, c_char, c_int, c_void};
    use std::path::Path;

    #[cfg(target_os = "linux")]
    unsafe extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
        fn dlclose(handle: *mut c_void) -> c_int;
    }

    pub struct Handle(*mut c_void);

    impl Handle {
        #[cfg(target_os = "linux")]
        pub fn open(path: &Path) -> Option<Handle> {
            use std::os::unix::ffi::OsStrExt;
            const RTLD_NOW: c_int = 2;
            let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
            // SAFETY: loading a fixture library of this workspace; its initializers are Rust's.
            let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
            (!h.is_null()).then_some(Handle(h))
        }

        #[cfg(not(target_os = "linux"))]
        pub fn open(_path: &Path) -> Option<Handle> {
            None
        }

        /// Calls an exported `extern "C" fn() -> u32`.
        pub fn counter(&self, name: &CStr) -> Option<u32> {
            #[cfg(target_os = "linux")]
            {
                // SAFETY: a live handle; the symbol, if present, has the fixture's signature.
                unsafe {
                    let f = dlsym(self.0, name.as_ptr());
                    if f.is_null() {
                        return None;
                    }
                    let f: extern "C" fn() -> u32 = std::mem::transmute(f);
                    Some(f())
                }
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = name;
                None
            }
        }
    }

    impl Drop for Handle {
        fn drop(&mut self) {
            #[cfg(target_os = "linux")]
            // SAFETY: opened by `open`, closed once.
            unsafe {
                dlclose(self.0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Partitioning errors

#[test]
fn a_node_no_ep_supports_is_an_error_naming_it() {
    let dir = dir_with_good_plugin("unsupported");
    let env = env_for(&dir);
    let mut custom = node("FrobnicateTensor", &["r"], &["y"]);
    custom.domain = Some("com.example.vision".into());
    custom.name = Some("frob_1".into());
    let graph = proto::GraphProto {
        name: Some("custom_op".into()),
        node: vec![node("Relu", &["x"], &["r"]), custom],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        ..Default::default()
    };
    let model = proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            },
            proto::OperatorSetIdProto {
                domain: Some("com.example.vision".into()),
                version: Some(3),
            },
        ],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    let err = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([ExecutionProvider::new("relu_only").error_on_failure()])
        })
        .and_then(|b| b.commit_from_memory(&model))
        .err()
        .expect("an op nobody runs fails session creation");
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "no execution provider supports node `frob_1`: op `FrobnicateTensor` \
         (domain com.example.vision, opset 3); EPs asked: relu_only, cpu"
    );
    assert_good_plugin_works(&env);
}

// ---------------------------------------------------------------------------------------------
// The manifest against what the library reports

/// `older_minor` (built for ABI 1.0, EPs `relu_only` and `never_available`) as plugin `name` in
/// its own folder, under a manifest declaring `abi` and `providers`.
fn dir_with_manifest(tag: &str, name: &str, abi: &str, providers: &[&str]) -> TempDir {
    let dir = TempDir::new(tag).expect("temp dir");
    let lib = fixture_library("older_minor");
    let file = lib
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name")
        .to_string();
    dir.add_plugin(name, &lib, Some(&manifest(name, abi, providers, &file)))
        .expect("copy older_minor");
    dir
}

#[test]
fn a_manifest_listing_other_eps_than_the_library_registers_is_refused_naming_both() {
    let dir = dir_with_manifest("manifest-eps", "toy", "1.0", &["toyx", "relu_only"]);
    let env = env_for(&dir);
    let (kind, message) = load_error(env.find_provider("toyx"));
    assert_eq!(kind, PluginLoadErrorKind::ManifestMismatch, "{message}");
    assert!(
        message.contains("lists EP `toyx` that the library does not register")
            && message.contains("registers EP `never_available` that plugin.toml does not list"),
        "{message}"
    );
    // The EP both agree on is refused too: the package is wrong as a whole.
    let (kind, _) = load_error(env.find_provider("relu_only"));
    assert_eq!(kind, PluginLoadErrorKind::ManifestMismatch);
    let (report, ok) = epx::doctor::report(&env);
    assert!(!ok, "{report}");
    assert!(
        report.contains("✗") && report.contains("`toyx`"),
        "{report}"
    );
}

#[test]
fn doctor_says_when_the_manifest_abi_differs_from_the_library_or_the_host() {
    let eps = ["relu_only", "never_available"];
    // A stale minor: the library loads and runs; doctor says what differs and how to fix it.
    let dir = dir_with_manifest("manifest-abi", "toy", "1.1", &eps);
    let env = env_for(&dir);
    assert!(env.find_provider("relu_only").is_ok());
    let (report, ok) = epx::doctor::report(&env);
    assert!(ok, "{report}");
    assert!(
        report.contains(
            "! plugin.toml declares ABI 1.1, but the library was built for ABI 1.0 (set abi = \"1.0\")"
        ),
        "{report}"
    );
    assert!(report.contains("all plugins OK, 1 warning(s)"), "{report}");
    assert!(
        report.starts_with(&format!(
            "host: epx {}, plugin ABI {}",
            env!("CARGO_PKG_VERSION"),
            epx::plugin_abi_version()
        )),
        "{report}"
    );
    // A minor newer than the host's.
    let dir = dir_with_manifest("manifest-abi-new", "toy", "1.99", &eps);
    let (report, ok) = epx::doctor::report(&env_for(&dir));
    assert!(ok, "{report}");
    assert!(
        report.contains(&format!(
            "plugin.toml declares ABI 1.99, newer than this host's {}",
            epx::plugin_abi_version()
        )),
        "{report}"
    );
}
