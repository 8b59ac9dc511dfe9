//! Profiling a session: the host times each kernel; an EP that records its kernels' parts (ABI
//! 1.7: the CPU EP, and the `adversarial` fixture with `profile=parts`) adds each node's time
//! and its compile passes; one that does not is timed whole and the profile says why; one that
//! fails to report fails the read with an error naming it, and runs go on.
//!
//! Needs the fixture libraries built: `cargo build --workspace` before `cargo test`.

use std::sync::Arc;

use epx::{Environment, Error, ExecutionProvider, Session, Tensor};
use epx_plugin_api::abi::EpxStatusCode;
use epx_tests::models::relu_neg_model;
use epx_tests::{TempDir, fixture_library, manifest};

fn environment(dir: &TempDir) -> Arc<Environment> {
    let lib = fixture_library("adversarial");
    let file = lib.file_name().and_then(|f| f.to_str()).expect("file name");
    dir.add_plugin(
        "adversarial",
        &lib,
        Some(&manifest("adversarial", "1.0", &["adversarial"], file)),
    )
    .expect("copy fixture");
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment")
}

/// Relu on the fixture (recording as `profile` says), Neg on the CPU EP, profiling on.
fn session(env: &Arc<Environment>, profile: &str) -> Session {
    let ep = ExecutionProvider::new("adversarial")
        .with_option("profile", profile)
        .error_on_failure();
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ep])
        .expect("EPs")
        .with_profiling(true)
        .commit_from_memory(&relu_neg_model())
        .expect("session")
}

fn run(s: &Session) {
    let x = Tensor::from_array(ndarray::arr2(&[[-1.0f32, 2.0, 3.0], [4.0, -5.0, 6.0]]));
    s.run([("x", x)]).expect("run");
}

#[test]
fn every_kernel_is_timed_and_each_node_where_its_ep_records_parts() {
    let dir = TempDir::new("profile").expect("temp dir");
    let env = environment(&dir);
    let s = session(&env, "parts");
    for _ in 0..3 {
        run(&s);
    }
    let p = s.profile().expect("profile");
    assert_eq!(p.runs, 3);
    assert!(p.run_ns > 0);
    let providers: Vec<&str> = p.kernels.iter().map(|k| k.provider.as_str()).collect();
    assert_eq!(providers, ["adversarial", "cpu"]);
    for k in &p.kernels {
        assert_eq!((k.calls, k.nodes, &k.whole), (3, 1, &None), "{k:?}");
        assert_eq!(k.parts.len(), 1, "{k:?}");
        assert_eq!(k.parts[0].calls, 3, "{k:?}");
        // A part runs inside its kernel's call.
        assert!(k.parts[0].ns <= k.ns, "{k:?}");
    }
    assert_eq!(p.kernels[0].parts[0].name, "Relu_r (fixture)");
    assert_eq!(p.kernels[1].parts[0].op, "Neg");
    // The CPU EP notes each of its optional passes, what it did or that it did nothing.
    let passes: Vec<&str> = p.kernels[1]
        .passes
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert!(
        passes.contains(&"fold_constants") && passes.contains(&"fuse_chains"),
        "{passes:?}"
    );
    let ops: Vec<(String, String)> = p.by_op().into_iter().map(|r| (r.op, r.provider)).collect();
    for want in [
        ("Relu", "adversarial"),
        ("Neg", "cpu"),
        ("kernel call", "cpu"),
    ] {
        assert!(
            ops.iter().any(|(o, e)| (o.as_str(), e.as_str()) == want),
            "{want:?} in {ops:?}"
        );
    }
    let table = p.table(10);
    assert!(table.starts_with("profile: 3 runs"), "{table}");
    assert!(table.contains("Relu_r (fixture)"), "{table}");

    // Restarted: zero, then counting again.
    s.restart_profile().expect("restart");
    let p = s.profile().expect("profile");
    assert_eq!(p.runs, 0);
    assert!(
        p.kernels
            .iter()
            .all(|k| k.calls == 0 && k.parts[0].calls == 0)
    );
    run(&s);
    let p = s.profile().expect("profile");
    assert!(
        p.kernels
            .iter()
            .all(|k| k.calls == 1 && k.parts[0].calls == 1)
    );
}

#[test]
fn a_kernel_whose_ep_does_not_record_parts_is_timed_whole_and_the_profile_says_why() {
    let dir = TempDir::new("profile").expect("temp dir");
    let env = environment(&dir);
    let s = session(&env, "none");
    run(&s);
    let p = s.profile().expect("profile");
    let k = &p.kernels[0];
    assert_eq!(
        (k.provider.as_str(), k.calls, k.parts.len()),
        ("adversarial", 1, 0)
    );
    let why = k.whole.as_deref().expect("timed whole");
    assert!(
        why.contains("fixture: no parts in profile mode none"),
        "{why}"
    );
    assert!(p.table(10).contains("timed whole:"));
    assert!(
        p.by_op()
            .iter()
            .any(|r| r.op == "1 nodes" && r.provider == "adversarial")
    );
}

#[test]
fn a_profile_read_that_panics_is_an_error_naming_the_ep_and_the_session_runs_on() {
    let dir = TempDir::new("profile").expect("temp dir");
    let env = environment(&dir);
    let s = session(&env, "panic");
    run(&s);
    match s.profile() {
        Err(Error::Provider {
            provider,
            call,
            code,
            message,
        }) => {
            assert_eq!(
                (provider.as_str(), call),
                ("adversarial", "kernel_profile_read")
            );
            assert_eq!(code, EpxStatusCode::Panic);
            assert!(message.contains("fixture: profile panics"), "{message}");
        }
        other => panic!("expected a provider error, got {other:?}"),
    }
    run(&s);
}

#[test]
fn a_session_made_without_profiling_says_how_to_profile() {
    let s = Session::builder()
        .expect("builder")
        .commit_from_memory(&relu_neg_model())
        .expect("session");
    run(&s);
    let e = s.profile().expect_err("no profile").to_string();
    assert!(
        e.contains("made without profiling") && e.contains("with_profiling"),
        "{e}"
    );
    assert!(s.restart_profile().is_err());
}
