//! The CPU EP built as a plugin library (`plugins/cpu/cdylib` → `libepx_cpu.so`), loaded
//! through the ABI like any vendor plugin, must compute exactly what the same EP linked into the
//! host computes, and what onnxruntime computed for the example models.
//!
//! Needs the plugin built: `cargo build --workspace` before `cargo test`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use epx::npy::{NpyArray, read_npy};
use epx::{ElementType, Environment, ExecutionProvider, Session, Tensor};
use epx_tests::{TempDir, built_library, repo_root};

const MODELS: [&str; 2] = ["mnist-cnn", "mlp-int"];

/// A plugin folder holding the CPU plugin library and its `plugin.toml`.
fn cpu_plugin_dir() -> TempDir {
    let dir = TempDir::new("cpu-plugin").expect("temp dir");
    let manifest = std::fs::read_to_string(repo_root().join("plugins/cpu/cdylib/plugin.toml"))
        .expect("read plugin.toml");
    dir.add_plugin("cpu", &built_library("epx_cpu"), Some(&manifest))
        .expect("copy the CPU plugin");
    dir
}

fn env_for(dir: &TempDir) -> Arc<Environment> {
    let env = Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment");
    assert!(
        env.discovery().problems.is_empty(),
        "{:?}",
        env.discovery().problems
    );
    env
}

fn models_dir() -> PathBuf {
    repo_root().join("examples/models")
}

/// The `<model>.<kind>.<name>.npy` files next to a model, by value name (sorted).
fn npy_files(model: &str, kind: &str) -> Vec<(String, NpyArray)> {
    let prefix = format!("{model}.{kind}.");
    let mut found: Vec<(String, NpyArray)> = std::fs::read_dir(models_dir())
        .expect("read examples/models")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let name = file
                .strip_prefix(&prefix)?
                .strip_suffix(".npy")?
                .to_string();
            Some((name, e.path()))
        })
        .map(|(name, path)| {
            let array = read_npy(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name, array)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !found.is_empty(),
        "no {prefix}*.npy files in {}",
        models_dir().display()
    );
    found
}

fn tensor(a: &NpyArray) -> Tensor {
    Tensor::from_bytes(a.elem_type, &a.shape, &a.data).expect("npy data makes a tensor")
}

fn inputs(model: &str) -> Vec<(String, Tensor)> {
    npy_files(model, "input")
        .iter()
        .map(|(n, a)| (n.clone(), tensor(a)))
        .collect()
}

fn model_path(model: &str) -> PathBuf {
    models_dir().join(format!("{model}.onnx"))
}

fn builtin_session(env: &Arc<Environment>, model: &Path) -> Session {
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .commit_from_file(model)
        .expect("builtin session")
}

fn plugin_session(env: &Arc<Environment>, model: &Path) -> Session {
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new("cpu/cpu").error_on_failure()])
        .expect("providers")
        .commit_from_file(model)
        .expect("plugin session")
}

fn run(session: &Session, inputs: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    session
        .run(inputs.iter().map(|(n, t)| (n.as_str(), t.clone())))
        .expect("run")
        .into_iter()
        .map(|(n, v)| (n, v.into_host().expect("host output")))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Compares an output with onnxruntime's: 1e-5 absolute + 1e-4 relative for floats, exact
/// otherwise.
fn assert_matches_reference(model: &str, name: &str, got: &Tensor, want: &NpyArray) {
    assert_eq!(
        got.elem_type(),
        want.elem_type,
        "{model} output {name}: element type"
    );
    assert_eq!(
        got.shape(),
        want.shape.as_slice(),
        "{model} output {name}: shape"
    );
    let bytes = got.bytes().expect("numeric output");
    if want.elem_type == ElementType::Float {
        let (g, w) = (f32s(bytes), f32s(&want.data));
        for (i, (g, w)) in g.iter().zip(&w).enumerate() {
            let tol = 1e-5 + 1e-4 * w.abs();
            assert!(
                (g - w).abs() <= tol,
                "{model} output {name}[{i}]: got {g}, onnxruntime {w}"
            );
        }
    } else {
        assert_eq!(
            bytes,
            want.data.as_slice(),
            "{model} output {name}: differs from onnxruntime"
        );
    }
}

#[test]
fn cpu_plugin_matches_builtin_cpu_and_onnxruntime() {
    let dir = cpu_plugin_dir();
    let env = env_for(&dir);
    let (lib, index) = env
        .find_provider("cpu/cpu")
        .expect("the CPU plugin is found");
    assert_eq!(lib.name, "cpu");
    assert_eq!(lib.providers[index].name, "cpu");
    let plugin_path = lib
        .path
        .clone()
        .expect("loaded from a file, not the built-in");
    assert!(
        plugin_path.starts_with(dir.path()),
        "{}",
        plugin_path.display()
    );

    for model in MODELS {
        let path = model_path(model);
        let inputs = inputs(model);
        let references = npy_files(model, "output");

        let builtin = builtin_session(&env, &path);
        assert_eq!(builtin.providers(), ["cpu"], "{model}");

        let users_before = Arc::strong_count(&lib);
        let plugin = plugin_session(&env, &path);
        assert_eq!(plugin.providers(), ["cpu"], "{model}");
        // Both EPs are called `cpu`; the plugin's is the one in use when the session holds the
        // plugin library.
        assert_eq!(
            Arc::strong_count(&lib),
            users_before + 1,
            "{model}: the session should use the plugin's EP"
        );
        assert!(builtin.skipped_providers().is_empty() && plugin.skipped_providers().is_empty());

        let a = run(&builtin, &inputs);
        let b = run(&plugin, &inputs);
        assert_eq!(a.len(), references.len(), "{model}: number of outputs");
        for ((name_a, ta), (name_b, tb)) in a.iter().zip(&b) {
            assert_eq!(name_a, name_b);
            assert!(
                ta == tb,
                "{model} output {name_a}: plugin and built-in CPU EP differ: {ta:?} vs {tb:?}"
            );
        }
        for (name, reference) in &references {
            let got = a.iter().find(|(n, _)| n == name).map(|(_, t)| t);
            let got =
                got.unwrap_or_else(|| panic!("{model}: no output `{name}` (reference {name}.npy)"));
            assert_matches_reference(model, name, got, reference);
        }
    }
}

#[test]
fn one_plugin_session_from_four_threads() {
    let dir = cpu_plugin_dir();
    let env = env_for(&dir);
    for model in MODELS {
        let session = plugin_session(&env, &model_path(model));
        let inputs = inputs(model);
        let first = run(&session, &inputs);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        for i in 0..20 {
                            let out = run(&session, &inputs);
                            assert_eq!(out.len(), first.len());
                            for ((n, t), (n0, t0)) in out.iter().zip(&first) {
                                assert_eq!(n, n0);
                                assert!(
                                    t == t0,
                                    "{model} run {i}: output {n} differs between runs"
                                );
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("a thread panicked");
            }
        });
        for (name, reference) in &npy_files(model, "output") {
            let got = first
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .expect("output");
            assert_matches_reference(model, name, got, reference);
        }
    }
}
