//! The CPU EP built as a plugin library (`plugins/cpu/cdylib` → `libepx_cpu.so`), loaded
//! through the ABI like any vendor plugin, must compute exactly what the same EP linked into the
//! host computes, and what onnxruntime computed for the example models.
//!
//! Needs the plugin built: `cargo build --workspace` before `cargo test`.

use std::path::Path;
use std::sync::Arc;

use epx::{ElementType, Environment, ExecutionProvider, Session, Tensor};
use epx_io::npy::NpyArray;
use epx_tests::examples::{
    env_for, f32s, model_path, reference_inputs, reference_npy, run, shipped_plugin,
};

const MODELS: [&str; 2] = ["mnist-cnn", "mlp-int"];

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
    let dir = shipped_plugin(
        "cpu-plugin",
        "cpu",
        "plugins/cpu/cdylib/plugin.toml",
        "epx_cpu",
    );
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
        let inputs = reference_inputs(model);
        let references = reference_npy(model, "output");

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
    let dir = shipped_plugin(
        "cpu-plugin",
        "cpu",
        "plugins/cpu/cdylib/plugin.toml",
        "epx_cpu",
    );
    let env = env_for(&dir);
    for model in MODELS {
        let session = plugin_session(&env, &model_path(model));
        let inputs = reference_inputs(model);
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
        for (name, reference) in &reference_npy(model, "output") {
            let got = first
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .expect("output");
            assert_matches_reference(model, name, got, reference);
        }
    }
}
