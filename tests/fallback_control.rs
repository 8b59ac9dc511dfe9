//! Control over where nodes run: strict placement, environment-wide default EPs, skipped EPs and
//! fallbacks in the placement report, availability queries.

use std::sync::Arc;

use epx::onnx::proto;
use epx::{Environment, Error, ExecutionProvider, Session, Tensor};
use epx_tests::models::{float_value, model_bytes, node};
use epx_tests::{TempDir, fixture_library, manifest};

/// x[2,3] → Relu → r → Sigmoid → y: `relu_only` can take the Relu, nobody but the CPU EP the
/// Sigmoid.
fn model() -> Vec<u8> {
    model_bytes(proto::GraphProto {
        node: vec![
            node("Relu", &["x"], &["r"]),
            node("Sigmoid", &["r"], &["y"]),
        ],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("y", &[2, 3])],
        ..Default::default()
    })
}

fn env(dir: &TempDir, defaults: Vec<ExecutionProvider>) -> Arc<Environment> {
    let lib = fixture_library("older_minor");
    let file = lib.file_name().unwrap().to_str().unwrap().to_string();
    dir.add_plugin(
        "older_minor",
        &lib,
        Some(&manifest(
            "older_minor",
            "1.0",
            &["relu_only", "never_available"],
            &file,
        )),
    )
    .unwrap();
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_execution_providers(defaults)
        .commit()
        .unwrap()
}

fn session(
    env: &Arc<Environment>,
    eps: Vec<ExecutionProvider>,
    strict: bool,
) -> epx::Result<Session> {
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers(eps)?
        .with_strict_placement(strict)
        .commit_from_memory(&model())
}

fn x() -> Tensor {
    Tensor::from_array(ndarray::arr2(&[[-1.0f32, 2.0, -3.0], [4.0, -5.0, 6.0]]))
}

#[test]
fn fallbacks_are_reported_and_strict_mode_refuses_them() {
    let dir = TempDir::new("strict").unwrap();
    let env = env(&dir, vec![]);
    let relu = || ExecutionProvider::new("relu_only").error_on_failure();

    let s = session(&env, vec![relu()], false).unwrap();
    let report = s.placement();
    assert_eq!(s.providers(), ["relu_only", "cpu"]);
    assert_eq!(report.fallbacks.len(), 1);
    assert_eq!(report.fallbacks[0].name, "Sigmoid_y");
    assert_eq!(report.fallbacks[0].reason, "not claimed by relu_only");
    assert_eq!(
        report
            .groups
            .iter()
            .map(|g| g.kernel.as_str())
            .collect::<Vec<_>>(),
        ["relu_only#0", "cpu#0"]
    );
    assert!(
        report.copies.is_empty(),
        "both EPs use host memory: {:?}",
        report.copies
    );
    assert!(report.table().contains(
        "1 nodes fell back to the CPU EP:\n  Sigmoid_y (Sigmoid): not claimed by relu_only"
    ));

    let err = session(&env, vec![relu()], true)
        .err()
        .expect("strict refuses the fallback");
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "strict placement: 1 node would fall back to the CPU EP: `Sigmoid_y` (Sigmoid)"
    );

    // Asking for the CPU EP explicitly makes it a choice, not a fallback.
    let s = session(&env, vec![relu(), ExecutionProvider::new("cpu")], true).unwrap();
    assert!(s.placement().fallbacks.is_empty());
    let y = s.run([("x", x())]).unwrap();
    // The CPU EP's logistic function is ONNX Runtime's approximation, within 2 ulp.
    let (got, want) = (
        y["y"].as_slice::<f32>().unwrap()[1],
        1.0 / (1.0 + (-2.0f32).exp()),
    );
    assert!((got - want).abs() <= 2.0 * f32::EPSILON, "{got} vs {want}");
}

#[test]
fn environment_defaults_extend_session_eps() {
    let dir = TempDir::new("defaults").unwrap();
    let env = env(&dir, vec![ExecutionProvider::new("relu_only")]);
    // No EPs on the session: the environment's default takes the Relu.
    let s = session(&env, vec![], false).unwrap();
    assert_eq!(s.node_placement(), ["relu_only", "cpu"]);
    // Session EPs come first; the default is still tried after them.
    let off = ExecutionProvider::new("relu_only").with_option("claim", "false");
    let s = session(&env, vec![off], false).unwrap();
    assert_eq!(
        s.node_placement(),
        ["cpu", "cpu"],
        "the session's own relu_only (claiming nothing) replaces the default"
    );
}

#[test]
fn skipped_eps_are_in_the_report_and_availability_is_queryable() {
    let dir = TempDir::new("avail").unwrap();
    let env = env(&dir, vec![]);
    assert!(env.is_available("relu_only"));
    assert!(env.is_available("cpu"));
    assert!(!env.is_available("never_available"));
    assert!(!env.is_available("warp_drive"));
    let names = env.available_providers();
    assert!(
        names.contains(&"relu_only".to_string()) && names.contains(&"cpu".to_string()),
        "{names:?}"
    );
    assert!(!names.contains(&"never_available".to_string()), "{names:?}");

    let s = session(&env, vec![ExecutionProvider::new("never_available")], false).unwrap();
    let report = s.placement();
    assert_eq!(report.skipped_providers.len(), 1);
    assert_eq!(report.skipped_providers[0].name, "never_available");
    assert!(
        report.skipped_providers[0]
            .reason
            .contains("Frobnicator 9000"),
        "{:?}",
        report.skipped_providers
    );
    assert!(report.table().contains("EP never_available was skipped: "));
    // Nothing else was requested, so nothing "fell back".
    assert!(report.fallbacks.is_empty());
}
