//! Isolated EPs: an EP running in a child process (`epx serve-plugin`) gives the same answers as
//! in this process, and a crash or hang of its plugin fails that run with an error saying how the
//! child ended, never this process; the next run starts a new child and compiles again.
//!
//! Uses the `adversarial` fixture (a Relu EP that misbehaves as its `mode` says) and the `epx`
//! executable of this build: `cargo build --workspace` before `cargo test`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use epx::{Environment, Error, ExecutionProvider, Session, Tensor};
use epx_plugin_api::abi::EpxStatusCode;
use epx_tests::models::relu_neg_model;
use epx_tests::{TempDir, artifact_dir, fixture_library, manifest};

fn epx_exe() -> std::path::PathBuf {
    artifact_dir().join(format!("epx{}", std::env::consts::EXE_SUFFIX))
}

/// A plugin folder with the `adversarial` fixture; `isolate` goes into its manifest.
fn plugin_dir(isolate: bool) -> TempDir {
    let dir = TempDir::new("isolation").expect("temp dir");
    let lib = fixture_library("adversarial");
    let file = lib.file_name().and_then(|f| f.to_str()).expect("file name");
    let mut text = manifest("adversarial", "1.0", &["adversarial"], file);
    if isolate {
        text.insert_str(0, "isolate = true\n");
    }
    dir.add_plugin("adversarial", &lib, Some(&text))
        .expect("copy fixture");
    dir
}

fn environment(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_epx_executable(epx_exe())
        .commit()
        .expect("environment")
}

fn session(env: &Arc<Environment>, ep: ExecutionProvider) -> epx::Result<Session> {
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers([ep.error_on_failure()])?
        .commit_from_memory(&relu_neg_model())
}

fn adversarial(mode: &str) -> ExecutionProvider {
    ExecutionProvider::new("adversarial").with_option("mode", mode)
}

fn input(values: [f32; 6]) -> Tensor {
    Tensor::from_array(ndarray::Array::from_shape_vec((2, 3), values.to_vec()).expect("shape"))
}

const X: [f32; 6] = [-1.5, 0.0, 2.0, -0.25, 3.5, -4.0];

fn outputs(s: &Session, x: Tensor) -> epx::Result<Vec<Vec<f32>>> {
    let out = s.run(vec![("x".to_string(), x)])?;
    Ok(out
        .into_iter()
        .map(|(_, v)| {
            v.into_host()
                .expect("host")
                .as_slice::<f32>()
                .expect("f32")
                .to_vec()
        })
        .collect())
}

fn expected() -> Vec<Vec<f32>> {
    let r: Vec<f32> = X.iter().map(|v| v.max(0.0)).collect();
    let y = r.iter().map(|v| -v).collect();
    vec![r, y]
}

/// The error of a run whose isolated process died or hung: `execute` failed, naming the EP.
fn assert_lost(result: epx::Result<Vec<Vec<f32>>>, how: &str) {
    match result {
        Err(Error::Provider {
            provider,
            call,
            code,
            message,
        }) => {
            assert_eq!(provider, "adversarial");
            assert_eq!(call, "execute");
            assert_eq!(code, EpxStatusCode::RuntimeError);
            assert!(
                message.contains(how) && message.contains("starts a new process"),
                "{message}"
            );
        }
        other => panic!("expected the isolated EP's execute to fail, got {other:?}"),
    }
}

#[test]
fn an_isolated_ep_answers_as_it_does_in_process() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let local = session(&env, adversarial("good")).expect("in-process session");
    let isolated = session(&env, adversarial("good").isolated()).expect("isolated session");
    assert!(local.placement().isolated_providers.is_empty());
    assert_eq!(isolated.placement().isolated_providers, ["adversarial"]);
    assert!(
        isolated
            .placement()
            .table()
            .contains("EP adversarial runs isolated, in a child process")
    );
    for s in [&local, &isolated] {
        assert_eq!(
            s.placement().node_counts(),
            vec![("adversarial".to_string(), 1), ("cpu".to_string(), 1)]
        );
        for _ in 0..3 {
            assert_eq!(outputs(s, input(X)).expect("run"), expected());
        }
    }
}

#[test]
fn a_crash_in_an_isolated_ep_fails_the_run_and_the_next_run_works() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let s = session(&env, adversarial("abort_on_nan").isolated()).expect("session");
    assert_eq!(outputs(&s, input(X)).expect("first run"), expected());
    let mut bad = X;
    bad[4] = f32::NAN;
    assert_lost(outputs(&s, input(bad)), "killed by signal 6 (SIGABRT)");
    // A new child, the kernel compiled again in it: good inputs run again.
    assert_eq!(
        outputs(&s, input(X)).expect("run after the crash"),
        expected()
    );
    assert_lost(outputs(&s, input(bad)), "SIGABRT");
    assert_eq!(
        outputs(&s, input(X)).expect("run after two crashes"),
        expected()
    );
    // This process is alive, and so is a session of the same EP in it.
    let local = session(&env, adversarial("good")).expect("in-process session");
    assert_eq!(
        outputs(&local, input(X)).expect("in-process run"),
        expected()
    );
}

#[test]
fn an_ep_that_always_crashes_fails_every_run_with_the_signal() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let s = session(&env, adversarial("abort").isolated()).expect("session");
    for _ in 0..3 {
        assert_lost(outputs(&s, input(X)), "killed by signal 6 (SIGABRT)");
    }
}

#[test]
fn an_isolated_ep_that_hangs_is_killed_after_the_timeout() {
    let dir = plugin_dir(false);
    let env = Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_epx_executable(epx_exe())
        .with_isolation_timeout(Duration::from_secs(3))
        .commit()
        .expect("environment");
    let s = session(&env, adversarial("hang").isolated()).expect("session");
    let started = Instant::now();
    assert_lost(outputs(&s, input(X)), "did not answer within 3 s");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(30),
        "{took:?}"
    );
}

#[test]
fn a_manifest_with_isolate_keeps_the_library_out_of_this_process() {
    let dir = plugin_dir(true);
    let env = environment(&dir);
    let s = session(&env, adversarial("abort_on_nan")).expect("session");
    assert_eq!(outputs(&s, input(X)).expect("run"), expected());
    let mut bad = X;
    bad[0] = f32::NAN;
    assert_lost(outputs(&s, input(bad)), "SIGABRT");
    assert_eq!(
        outputs(&s, input(X)).expect("run after the crash"),
        expected()
    );
    // The library was opened in the child processes only.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let copied = dir.path().join("adversarial");
    assert!(
        !maps.contains(&copied.display().to_string()),
        "the isolated plugin is mapped into the host process"
    );
}

#[test]
fn what_cannot_be_isolated_is_refused_with_the_reason() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    // The built-in CPU EP is linked into the program: there is no library to open elsewhere.
    let err = session(&env, ExecutionProvider::new("cpu").isolated())
        .err()
        .expect("the built-in EP cannot be isolated");
    assert!(
        err.to_string()
            .contains("only a plugin library can run in a child process"),
        "{err}"
    );
    // Without an epx executable to host it.
    let no_exe = Environment::builder()
        .with_plugin_dirs([dir.path()])
        .commit()
        .expect("environment");
    if std::env::var_os("EPX_PROBE_EXE").is_none() {
        let err = session(&no_exe, adversarial("good").isolated())
            .err()
            .expect("no executable");
        assert!(err.to_string().contains("no epx executable"), "{err}");
    }
    // Options are still checked, by the EP in its own process.
    let err = session(&env, adversarial("sideways").isolated())
        .err()
        .expect("bad option");
    assert!(
        err.to_string().contains("`sideways` is not one of"),
        "{err}"
    );
}
