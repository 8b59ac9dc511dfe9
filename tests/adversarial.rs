//! An EP that answers the host wrongly (the `adversarial` fixture, one way per `mode`): every
//! wrong answer must fail session creation or `run` with `Error::Provider` naming the EP, the
//! call and what was wrong, and the same environment must still run a well-behaved session.
//!
//! Needs the fixture libraries built: `cargo build --workspace` before `cargo test`.

use std::sync::Arc;

use epx::onnx::proto;
use epx::{Environment, Error, ExecutionProvider, Session, Tensor};
use epx_plugin_api::abi::EpxStatusCode;
use epx_tests::models::{float_value, model_bytes, node, relu_neg_model};
use epx_tests::{TempDir, fixture_library, manifest};

const X: [f32; 6] = [-1.5, 0.0, 2.0, -0.25, 3.5, -4.0];

/// A plugin folder holding the `adversarial` fixture and the good `older_minor` one.
fn plugin_dir() -> TempDir {
    let dir = TempDir::new("adversarial").expect("temp dir");
    for (name, eps) in [
        ("adversarial", &["adversarial"][..]),
        ("older_minor", &["relu_only", "never_available"][..]),
    ] {
        let lib = fixture_library(name);
        let file = lib
            .file_name()
            .and_then(|f| f.to_str())
            .expect("file name")
            .to_string();
        dir.add_plugin(name, &lib, Some(&manifest(name, "1.0", eps, &file)))
            .expect("copy fixture");
    }
    dir
}

fn environment(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment")
}

fn adversarial(mode: &str) -> ExecutionProvider {
    ExecutionProvider::new("adversarial")
        .with_option("mode", mode)
        .error_on_failure()
}

fn session(
    env: &Arc<Environment>,
    eps: impl IntoIterator<Item = ExecutionProvider>,
) -> epx::Result<Session> {
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers(eps)?
        .commit_from_memory(&relu_neg_model())
}

fn input() -> Tensor {
    Tensor::from_array(
        ndarray::Array::from_shape_vec((2, 3), X.to_vec()).expect("shape matches data"),
    )
}

/// Checks `result` is `Error::Provider` from the adversarial EP for `call` with `message`.
fn assert_provider_error<T>(
    result: epx::Result<T>,
    mode: &str,
    want_call: &str,
    want_code: EpxStatusCode,
    want_message: &str,
) {
    match result {
        Err(Error::Provider {
            provider,
            call,
            code,
            message,
        }) => {
            assert_eq!(provider, "adversarial", "mode {mode}");
            assert_eq!(call, want_call, "mode {mode}: {message}");
            assert_eq!(code, want_code, "mode {mode}: {message}");
            assert_eq!(message, want_message, "mode {mode}");
        }
        Err(other) => panic!("mode {mode}: expected a provider error, got {other:?} ({other})"),
        Ok(_) => panic!("mode {mode}: expected a provider error, got success"),
    }
}

/// A `mode=good` session in `env` places Relu on the EP and computes the right values.
fn assert_good_mode_works(env: &Arc<Environment>) {
    let s = session(env, [adversarial("good")]).expect("good session");
    assert_eq!(s.node_placement(), ["adversarial", "cpu"]);
    let out = s.run([("x", input())]).expect("good run");
    let r = out["r"].as_slice::<f32>().expect("r is float32").to_vec();
    let y = out["y"].as_slice::<f32>().expect("y is float32").to_vec();
    let want_r: Vec<f32> = X.iter().map(|x| x.max(0.0)).collect();
    let want_y: Vec<f32> = want_r.iter().map(|r| -r).collect();
    assert_eq!(r, want_r);
    assert_eq!(y, want_y);
}

#[test]
fn wrong_capability_answers_fail_session_creation() {
    let dir = plugin_dir();
    let env = environment(&dir);
    let bad = EpxStatusCode::InvalidGraph;
    let cases = [
        (
            "out_of_range",
            "returned node id 7, but the graph has 2 nodes",
        ),
        ("duplicate", "claimed node 0 twice"),
        ("empty_group", "returned an empty group"),
        // Offered every node, it picks id `node_count`: out of range.
        (
            "not_offered",
            "returned node id 2, but the graph has 2 nodes",
        ),
    ];
    for (mode, message) in cases {
        let result = session(&env, [adversarial(mode)]);
        assert_provider_error(result, mode, "get_capability", bad, message);
        assert_good_mode_works(&env);
    }
}

#[test]
fn claiming_a_node_that_was_not_offered_fails() {
    let dir = plugin_dir();
    let env = environment(&dir);
    // `relu_only` takes the Relu (node 0) first, so the adversarial EP is offered only the Neg
    // (node 1) and claims node 0 anyway.
    let result = session(
        &env,
        [
            ExecutionProvider::new("relu_only").error_on_failure(),
            adversarial("not_offered"),
        ],
    );
    assert_provider_error(
        result,
        "not_offered",
        "get_capability",
        EpxStatusCode::InvalidGraph,
        "claimed node 0 (Relu), which is not among the unclaimed nodes it was offered",
    );
    assert_good_mode_works(&env);
    // And the EP ahead of it is still fine too.
    let s = session(
        &env,
        [
            ExecutionProvider::new("relu_only").error_on_failure(),
            adversarial("good"),
        ],
    )
    .expect("relu_only then adversarial");
    assert_eq!(s.node_placement(), ["relu_only", "cpu"]);
}

#[test]
fn a_failing_compile_fails_session_creation() {
    let dir = plugin_dir();
    let env = environment(&dir);
    let result = session(&env, [adversarial("compile_fails")]);
    assert_provider_error(
        result,
        "compile_fails",
        "compile",
        EpxStatusCode::NotImplemented,
        "fixture: compile refuses",
    );
    assert_good_mode_works(&env);
}

#[test]
fn wrong_kernel_outputs_fail_run() {
    let dir = plugin_dir();
    let env = environment(&dir);
    let cases = [
        (
            "wrong_shape",
            "the kernel of nodes Relu_r (Relu): output `r` has shape [1], but the model declares [2, 3]",
        ),
        (
            "wrong_type",
            "output `r` is int64, but the model declares float32",
        ),
        (
            "missing_output",
            "returned success without producing output 0",
        ),
    ];
    for (mode, message) in cases {
        let s = session(&env, [adversarial(mode)]).expect("session creation succeeds");
        assert_eq!(s.node_placement(), ["adversarial", "cpu"], "mode {mode}");
        // Twice: a failed run leaves nothing behind that breaks the next one.
        for _ in 0..2 {
            let result = s.run([("x", input())]);
            assert_provider_error(
                result,
                mode,
                "execute",
                EpxStatusCode::InvalidGraph,
                message,
            );
        }
        assert_good_mode_works(&env);
    }
}

#[test]
fn an_unknown_mode_names_the_valid_ones() {
    let dir = plugin_dir();
    let env = environment(&dir);
    match session(&env, [adversarial("sideways")]) {
        Err(Error::ProviderSetup { name, message }) => {
            assert_eq!(name, "adversarial");
            assert_eq!(
                message,
                "adversarial option `mode`: `sideways` is not one of good, out_of_range, \
                 duplicate, not_offered, empty_group, compile_fails, wrong_shape, wrong_type, \
                 missing_output, wrong_values, abort, hang, explains, decline_unoffered, abort_on_nan"
            );
        }
        other => panic!("expected a setup error, got {:?}", other.err()),
    }
    // Without `error_on_failure` the EP is skipped and the CPU EP runs everything.
    let s = session(
        &env,
        [ExecutionProvider::new("adversarial").with_option("mode", "sideways")],
    )
    .expect("session without the EP");
    assert_eq!(s.node_placement(), ["cpu", "cpu"]);
    assert_eq!(s.skipped_providers().len(), 1);
    assert_good_mode_works(&env);
}

/// Declared shapes are hints, as in ONNX Runtime: a model whose declared output shape disagrees
/// with what its nodes compute runs on the built-in CPU EP, with the computed shape (and a
/// warning), whether the session names the CPU EP or it takes what is left: one rule. The same
/// disagreement coming from a plugin EP is an error above.
#[test]
fn a_wrong_declared_shape_runs_on_the_cpu_ep() {
    let bytes = model_bytes(proto::GraphProto {
        name: Some("declared_wrong".into()),
        node: vec![node("Relu", &["x"], &["r"]), node("Neg", &["r"], &["y"])],
        input: vec![float_value("x", &[2, 3])],
        output: vec![float_value("r", &[1, 6]), float_value("y", &[6])],
        ..Default::default()
    });
    let fallback = Session::builder()
        .expect("builder")
        .commit_from_memory(&bytes)
        .expect("session");
    let named = Session::builder()
        .and_then(|b| b.with_execution_providers([ExecutionProvider::new("cpu")]))
        .and_then(|b| b.commit_from_memory(&bytes))
        .expect("session naming the CPU EP");
    for s in [&fallback, &named, &fallback, &named] {
        let out = s.run([("x", input())]).expect("run");
        assert_eq!(out["r"].shape(), [2, 3]);
        assert_eq!(out["y"].shape(), [2, 3]);
        let y: Vec<f32> = out["y"]
            .view::<f32>()
            .expect("f32")
            .iter()
            .copied()
            .collect();
        let want: Vec<f32> = X.iter().map(|v| -v.max(0.0)).collect();
        assert_eq!(y, want);
    }
}

/// A plugin EP's output that disagrees with a declaration the host's inference cannot bear out
/// (the input's first dimension is symbolic, the output declares 1 there) runs with the computed
/// shape and a warning, as the CPU EP's does and as ONNX Runtime does for any EP. A declaration
/// the inference confirms still stops a kernel that contradicts it (`wrong_kernel_outputs_fail_run`).
#[test]
fn an_unconfirmed_declared_shape_runs_on_a_plugin_ep() {
    use proto::tensor_shape_proto::dimension;
    let dir = plugin_dir();
    let env = environment(&dir);
    let mut x = float_value("x", &[0, 3]);
    if let Some(proto::type_proto::Value::TensorType(t)) =
        x.r#type.as_mut().and_then(|t| t.value.as_mut())
        && let Some(d) = t.shape.as_mut().and_then(|s| s.dim.first_mut())
    {
        d.value = Some(dimension::Value::DimParam("N".into()));
    }
    let bytes = model_bytes(proto::GraphProto {
        name: Some("unconfirmed".into()),
        node: vec![node("Relu", &["x"], &["r"]), node("Neg", &["r"], &["y"])],
        input: vec![x],
        output: vec![float_value("r", &[1, 3]), float_value("y", &[1, 3])],
        ..Default::default()
    });
    let s = Session::builder()
        .map(|b| b.with_environment(env.clone()))
        .and_then(|b| {
            b.with_execution_providers([ExecutionProvider::new("relu_only").error_on_failure()])
        })
        .and_then(|b| b.commit_from_memory(&bytes))
        .expect("session");
    assert_eq!(s.node_placement(), ["relu_only", "cpu"]);
    for _ in 0..2 {
        let out = s.run([("x", input())]).expect("the computed shape runs");
        assert_eq!(out["r"].shape(), [2, 3]);
        assert_eq!(out["y"].shape(), [2, 3]);
        let y = out["y"].as_slice::<f32>().expect("y is float32").to_vec();
        let want: Vec<f32> = X.iter().map(|v| -v.max(0.0)).collect();
        assert_eq!(y, want);
    }
}

/// An input declared as a scalar takes a tensor of any shape, as in ONNX Runtime (it holds an
/// input to its declared shape only when the declaration has a dimension): a one-element `[1]`
/// array where `[]` is declared runs. Any other declared shape is held exactly.
#[test]
fn an_input_declared_as_a_scalar_takes_any_shape() {
    // y = Neg(x), with x and y declared of shape `dims`, as a session.
    let neg = |dims: &[i64]| {
        let bytes = model_bytes(proto::GraphProto {
            name: Some("neg".into()),
            node: vec![node("Neg", &["x"], &["y"])],
            input: vec![float_value("x", dims)],
            output: vec![float_value("y", dims)],
            ..Default::default()
        });
        Session::builder()
            .and_then(|b| b.commit_from_memory(&bytes))
            .expect("session")
    };
    let twos = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        Tensor::from_array(
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), vec![2.0f32; n])
                .expect("shape matches data"),
        )
    };
    let s = neg(&[]);
    let shapes: [&[usize]; 3] = [&[], &[1], &[2, 1]];
    for shape in shapes {
        let out = s.run([("x", twos(shape))]).expect("run");
        assert_eq!(out["y"].shape(), shape);
        let y: Vec<f32> = out["y"]
            .view::<f32>()
            .expect("f32")
            .iter()
            .copied()
            .collect();
        assert_eq!(y, vec![-2.0; shape.iter().product()]);
    }
    // A declared dimension is held: rank and extent.
    let s = neg(&[1]);
    let shapes: [&[usize]; 3] = [&[], &[2], &[1, 1]];
    for shape in shapes {
        let err = s
            .run([("x", twos(shape))])
            .expect_err("a wrong shape for a declared dimension");
        assert!(err.to_string().contains("must have shape [1]"), "{err}");
    }
}

/// r = Relu(x) with no declaration of `r` (the host infers [2, 3]), then y = Add(r, x): a
/// wrong-shaped `r` of [1] would broadcast into a wrong `y` of the right shape.
fn relu_add_undeclared_model() -> Vec<u8> {
    epx_tests::models::relu_add_model("relu_add")
}

#[test]
fn a_wrong_shape_against_an_inferred_one_stops_at_the_kernel_not_downstream() {
    let dir = plugin_dir();
    let env = environment(&dir);
    let s = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([adversarial("wrong_shape")])
        })
        .and_then(|b| b.commit_from_memory(&relu_add_undeclared_model()))
        .expect("session");
    assert_eq!(s.node_placement(), ["adversarial", "cpu"]);
    assert_provider_error(
        s.run([("x", input())]),
        "wrong_shape",
        "execute",
        EpxStatusCode::InvalidGraph,
        "the kernel of nodes Relu_r (Relu): output `r` has shape [1], but the host infers from the \
         model [2, 3]",
    );
    // The same model on a well-behaved kernel runs.
    let s = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([adversarial("good")])
        })
        .and_then(|b| b.commit_from_memory(&relu_add_undeclared_model()))
        .expect("session");
    let y = s.run([("x", input())]).expect("run");
    let want: Vec<f32> = X.iter().map(|v| v.max(0.0) + v).collect();
    assert_eq!(y["y"].as_slice::<f32>().expect("f32"), &want[..]);
}

#[test]
fn decline_reasons_reach_the_placement_report_and_nonsense_ones_are_refused() {
    let dir = plugin_dir();
    let env = environment(&dir);
    let s = session(&env, [adversarial("explains")]).expect("session");
    let report = s.placement();
    assert_eq!(report.fallbacks.len(), 1, "{report:?}");
    assert_eq!(
        report.fallbacks[0].reason,
        "adversarial declined it: adversarial runs Relu only, not Neg"
    );
    assert!(
        report
            .table()
            .contains("adversarial declined it: adversarial runs Relu only, not Neg")
    );
    // Saying it declines a node it was never offered is a wrong answer, like claiming one.
    match session(&env, [adversarial("decline_unoffered")]) {
        Err(Error::Provider {
            provider, message, ..
        }) => {
            assert_eq!(provider, "adversarial");
            assert!(message.contains("which was not offered"), "{message}");
        }
        Err(other) => panic!("expected a provider error, got {other}"),
        Ok(_) => panic!("expected a provider error, got a session"),
    }
    assert_good_mode_works(&env);
}
