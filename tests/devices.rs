//! Devices (ABI 1.5): each EP lists the devices it can run on, present ones it cannot use
//! included, and the host lists them all (`Environment::devices`, `epx providers --devices`).
//!
//! The `adversarial` fixture lists a fake GPU and a fake NPU whose driver is too old; the
//! `older_minor` fixture (ABI 1.0) lists none; the built-in CPU EP lists this machine's processor.

use std::sync::Arc;

use epx::{Environment, ProviderDevice};
use epx_tests::models::relu_neg_model;
use epx_tests::{TempDir, artifact_dir, fixture_library, manifest};

fn plugin_dir(isolate: bool) -> TempDir {
    let dir = TempDir::new("devices").expect("temp dir");
    for (name, eps) in [
        ("adversarial", &["adversarial"][..]),
        ("older_minor", &["relu_only", "never_available"][..]),
    ] {
        let lib = fixture_library(name);
        let file = lib.file_name().and_then(|f| f.to_str()).expect("file name");
        let abi = if name == "older_minor" { "1.0" } else { "1.8" };
        let mut text = manifest(name, abi, eps, file);
        if isolate && name == "adversarial" {
            text.insert_str(0, "isolate = true\n");
        }
        dir.add_plugin(name, &lib, Some(&text))
            .expect("copy fixture");
    }
    dir
}

fn environment(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_epx_executable(artifact_dir().join("epx"))
        .commit()
        .expect("environment")
}

fn of<'a>(devices: &'a [ProviderDevice], provider: &str) -> Vec<&'a ProviderDevice> {
    devices.iter().filter(|d| d.provider == provider).collect()
}

fn check_fixture_devices(devices: &[ProviderDevice]) {
    let adv = of(devices, "adversarial");
    assert_eq!(adv.len(), 2, "{adv:?}");
    let gpu = &adv[0];
    assert_eq!(gpu.selector, "adversarial:0");
    assert_eq!(gpu.plugin, "adversarial");
    assert_eq!(gpu.device.kind, "gpu");
    assert_eq!(gpu.device.name, "FG-1 (fake)");
    assert_eq!(gpu.device.vendor, "Fixture Graphics");
    assert_eq!(gpu.device.memory_bytes, Some(8 << 30));
    assert_eq!(gpu.device.driver_version, "2.5.1");
    assert_eq!(gpu.device.unusable, None);
    let npu = &adv[1];
    assert_eq!(npu.selector, "adversarial:NPU.0");
    assert_eq!((npu.device.kind, npu.device.id), ("npu", 1));
    assert_eq!(npu.device.memory_bytes, None);
    assert_eq!(
        npu.device.unusable.as_deref(),
        Some("driver 1.2.0 is older than the 2.0 this EP needs")
    );
}

#[test]
fn every_ep_lists_its_devices_and_older_plugins_list_none() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let devices = env.devices();
    check_fixture_devices(&devices);
    // ABI 1.0: nothing said, and no error either.
    assert!(of(&devices, "relu_only").is_empty());
    let (lib, i) = env.find_provider("relu_only").expect("relu_only");
    assert!(lib.providers[i].devices.is_empty() && lib.providers[i].devices_error.is_none());
    // The built-in CPU EP: this processor, with the kernel level it runs.
    let cpu = of(&devices, "cpu");
    assert_eq!(cpu.len(), 1, "{cpu:?}");
    assert_eq!(cpu[0].selector, "cpu:0");
    assert_eq!(cpu[0].device.kind, "cpu");
    assert!(
        cpu[0].device.driver_version.contains("kernels: "),
        "{:?}",
        cpu[0].device
    );
}

#[test]
fn an_isolated_plugin_lists_the_same_devices() {
    let dir = plugin_dir(true);
    let env = environment(&dir);
    let (lib, _) = env.find_provider("adversarial").expect("adversarial");
    assert!(lib.isolation.is_some(), "the manifest asks for isolation");
    check_fixture_devices(&env.devices());
}

fn session_on(env: &Arc<Environment>, ep: epx::ExecutionProvider) -> epx::Result<epx::Session> {
    epx::Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers([ep.error_on_failure()])?
        .commit_from_memory(&relu_neg_model())
}

fn setup_error(r: epx::Result<epx::Session>) -> String {
    match r {
        Err(epx::Error::ProviderSetup { message, .. }) => message,
        other => panic!("expected a set-up error, got {:?}", other.err()),
    }
}

#[test]
fn a_session_runs_an_ep_on_the_device_it_names() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    for isolated in [false, true] {
        let ep = epx::ExecutionProvider::new("adversarial").on_device("0");
        let ep = if isolated { ep.isolated() } else { ep };
        let s = session_on(&env, ep).expect("session on adversarial:0");
        let report = s.placement();
        assert_eq!(
            report.devices,
            [("adversarial".to_string(), "adversarial:0".to_string())]
        );
        assert!(
            report
                .table()
                .contains("EP adversarial runs on device adversarial:0")
        );
        let x = epx::Tensor::from_array(
            ndarray::Array::from_shape_vec((2, 3), vec![-1.0f32, 2.0, -3.0, 4.0, -5.0, 6.0])
                .expect("shape"),
        );
        let out = s.run(vec![("x".to_string(), x)]).expect("run");
        assert_eq!(
            out["r"].as_slice::<f32>().expect("f32"),
            &[0.0, 2.0, 0.0, 4.0, 0.0, 6.0]
        );
    }
    // The built-in CPU EP on its one device, by number.
    let s = session_on(&env, epx::ExecutionProvider::new("cpu").on_device("0")).expect("cpu:0");
    assert_eq!(
        s.placement().devices,
        [("cpu".to_string(), "cpu:0".to_string())]
    );
}

#[test]
fn a_device_that_is_unusable_unknown_or_unlisted_is_refused_with_the_reason() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let adv = |d: &str| epx::ExecutionProvider::new("adversarial").on_device(d);
    let msg = setup_error(session_on(&env, adv("NPU.0")));
    assert_eq!(
        msg,
        "device adversarial:NPU.0 (FN-7 (fake)) is present but unusable: driver 1.2.0 is older \
         than the 2.0 this EP needs"
    );
    // By number, the same device.
    assert!(setup_error(session_on(&env, adv("1"))).contains("unusable"));
    let msg = setup_error(session_on(&env, adv("7")));
    assert_eq!(
        msg,
        "has no device `7`; its devices: adversarial:0, adversarial:NPU.0"
    );
    let msg = setup_error(session_on(
        &env,
        epx::ExecutionProvider::new("relu_only").on_device("0"),
    ));
    assert!(msg.contains("the EP lists no devices"), "{msg}");
}

fn session_by(env: &Arc<Environment>, policy: epx::SelectionPolicy) -> epx::Session {
    epx::Session::builder()
        .map(|b| {
            b.with_environment(env.clone())
                .with_selection_policy(policy)
        })
        .and_then(|b| b.commit_from_memory(&relu_neg_model()))
        .expect("session by policy")
}

#[test]
fn a_selection_policy_picks_eps_by_the_devices_they_list_and_says_why() {
    use epx::SelectionPolicy as P;
    let dir = plugin_dir(false);
    let env = environment(&dir);
    // The fixture's GPU is usable, its NPU is not: every policy but prefer-cpu lands on the GPU.
    for policy in [P::PreferGpu, P::MaxPerformance, P::PreferNpu, P::MinPower] {
        let name = policy.name();
        let s = session_by(&env, policy);
        let report = s.placement();
        let sel = report.selection.clone().expect("selection reported");
        assert_eq!(sel.policy, name);
        assert_eq!(sel.chosen, ["adversarial:0"], "{name}");
        assert!(
            sel.reasons.iter().any(|r| r
                == "adversarial:NPU.0 (npu FN-7 (fake)): unusable: driver 1.2.0 is older than \
                    the 2.0 this EP needs"),
            "{name}: {:?}",
            sel.reasons
        );
        assert_eq!(
            report.node_counts(),
            vec![("adversarial".to_string(), 1), ("cpu".to_string(), 1)],
            "{name}"
        );
        assert!(
            report
                .table()
                .contains(&format!("selection policy {name} chose adversarial:0"))
        );
    }
    // No plugin EP lists a CPU device: the built-in CPU EP runs everything, and the report says so.
    let s = session_by(&env, P::PreferCpu);
    let sel = s.placement().selection.expect("selection");
    assert!(sel.chosen.is_empty());
    assert!(
        sel.reasons
            .last()
            .is_some_and(|r| r.contains("the built-in cpu EP runs everything")),
        "{:?}",
        sel.reasons
    );
    assert_eq!(s.placement().node_counts(), vec![("cpu".to_string(), 2)]);
}

#[test]
fn an_applications_own_policy_sees_the_devices_and_the_model() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let policy = epx::SelectionPolicy::Custom(Arc::new(move |input: &epx::SelectionInput<'_>| {
        let mut log = log.lock().expect("lock");
        log.extend(input.devices.iter().map(|d| d.selector.clone()));
        log.push(format!("nodes: {}", input.model.graph.nodes.len()));
        Ok(vec![
            epx::ExecutionProvider::new("adversarial").on_device("0"),
        ])
    }));
    let s = session_by(&env, policy);
    let seen = seen.lock().expect("lock").clone();
    assert!(seen.contains(&"adversarial:NPU.0".to_string()), "{seen:?}");
    assert!(seen.contains(&"nodes: 2".to_string()), "{seen:?}");
    let sel = s.placement().selection.expect("selection");
    assert_eq!(
        (sel.policy.as_str(), sel.chosen.clone()),
        ("custom", vec!["adversarial:0".to_string()])
    );
    // Naming EPs as well as a policy is an error, not a silent choice of one.
    let both = epx::Session::builder()
        .map(|b| b.with_environment(env.clone()))
        .and_then(|b| b.with_execution_providers([epx::ExecutionProvider::new("adversarial")]))
        .map(|b| b.with_selection_policy(epx::SelectionPolicy::PreferGpu))
        .and_then(|b| b.commit_from_memory(&relu_neg_model()));
    assert!(both.err().expect("error").to_string().contains("not both"));
    assert!(epx::SelectionPolicy::from_name("fastest").is_err());
    // A function that cannot choose fails the session with its reason.
    let refuses = epx::SelectionPolicy::Custom(Arc::new(|_: &epx::SelectionInput<'_>| {
        Err("no device is good enough".to_string())
    }));
    let err = epx::Session::builder()
        .map(|b| {
            b.with_environment(env.clone())
                .with_selection_policy(refuses)
        })
        .and_then(|b| b.commit_from_memory(&relu_neg_model()))
        .err()
        .expect("error");
    assert!(
        err.to_string()
            .contains("the selection function failed: no device is good enough"),
        "{err}"
    );
}

#[test]
fn the_measure_policy_times_the_candidates_and_remembers_the_fastest() {
    let dir = plugin_dir(false);
    let cache = TempDir::new("devices-cache").expect("cache dir");
    let env = Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_cache_dir(cache.path())
        .commit()
        .expect("environment");
    let measure = || epx::SelectionPolicy::Measure { runs: 3 };
    let first = session_by(&env, measure()).placement();
    let sel = first.selection.clone().expect("selection");
    assert_eq!(sel.policy, "measure");
    // Both candidates were timed: the fixture's GPU EP alone, and the CPU EP alone.
    for who in ["adversarial:0: ", "cpu alone: "] {
        assert!(
            sel.reasons
                .iter()
                .any(|r| r.starts_with(who) && r.ends_with("ms a run (median of 3)")),
            "{who} {:?}",
            sel.reasons
        );
    }
    let winner = sel
        .reasons
        .iter()
        .find_map(|r| r.strip_suffix(": fastest, chosen"))
        .expect("a winner")
        .to_string();
    assert!(
        winner == "adversarial:0" || winner == "cpu alone",
        "{winner}"
    );
    // The choice is in the cache folder, and the next session of the model uses it unmeasured.
    let remembered: Vec<_> = std::fs::read_dir(cache.path().join("selection"))
        .expect("selection cache")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).expect("read"))
        .collect();
    assert_eq!(remembered, std::slice::from_ref(&winner));
    let again = session_by(&env, measure()).placement();
    let sel = again.selection.clone().expect("selection");
    assert_eq!(sel.reasons.len(), 1, "{:?}", sel.reasons);
    assert!(
        sel.reasons[0].starts_with(&format!("{winner}: remembered")),
        "{:?}",
        sel.reasons
    );
    assert_eq!(again.node_counts(), first.node_counts());
}
