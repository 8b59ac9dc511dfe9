//! The OpenVINO EP plugin (`plugins/openvino` → `libepx_openvino.so`), loaded from a temporary
//! plugin folder with its `plugin.toml`, running on the OpenVINO runtime that
//! `plugins/openvino/fetch-runtime.sh` extracts into `.testdata/openvino/libs/` (found through
//! `EPX_OPENVINO_SEARCH_PATH`). The example models must give what the CPU EP gives.
//!
//! Needs the plugin built (`cargo build --workspace`) and the runtime fetched
//! (`bash plugins/openvino/fetch-runtime.sh`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Once};

use epx::{ElementType, Environment, ExecutionProvider, Session, Tensor};
use epx_tests::examples::{env_for, model_path, reference_inputs, run, shipped_plugin};
use epx_tests::{TempDir, repo_root};

const EP: &str = "openvino";
const MODELS: [&str; 2] = ["mnist-cnn", "mlp-int"];
const SEARCH_PATH_VAR: &str = "EPX_OPENVINO_SEARCH_PATH";
const LIBRARY_VAR: &str = "EPX_OPENVINO_LIBRARY";
/// Set in the child processes of `missing_runtime_names_the_places_searched`.
const CHILD_VAR: &str = "EPX_OPENVINO_TEST_CHILD";

/// A plugin folder with the OpenVINO plugin and its shipped manifest.
fn openvino_plugin() -> TempDir {
    shipped_plugin(
        "openvino",
        "openvino",
        "plugins/openvino/plugin.toml",
        "epx_openvino",
    )
}

fn runtime_dir() -> PathBuf {
    repo_root().join(".testdata/openvino/libs")
}

/// Points the plugin at the fetched runtime, once per test process, before any test loads it.
fn use_fetched_runtime() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = runtime_dir();
        let has_lib = std::fs::read_dir(&dir).is_ok_and(|entries| {
            entries.filter_map(|e| e.ok()).any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("libopenvino_c.so")
            })
        });
        assert!(
            has_lib,
            "no libopenvino_c.so* in {}: run `bash plugins/openvino/fetch-runtime.sh` first",
            dir.display()
        );
        // SAFETY: every test of this binary calls this first, and the others wait on the
        // `Once` while it runs, so no thread of ours reads the environment meanwhile.
        unsafe {
            std::env::set_var(SEARCH_PATH_VAR, &dir);
            std::env::remove_var(LIBRARY_VAR);
        }
    });
}

fn cpu_session(env: &Arc<Environment>, model: &str) -> Session {
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .commit_from_file(model_path(model))
        .expect("CPU session")
}

fn openvino_session(
    env: &Arc<Environment>,
    model: &str,
    options: &[(&str, &str)],
) -> epx::Result<Session> {
    let mut ep = ExecutionProvider::new(EP).error_on_failure();
    for (k, v) in options {
        ep = ep.with_option(*k, *v);
    }
    Session::builder()?
        .with_environment(env.clone())
        .with_execution_providers([ep])?
        .commit_from_file(model_path(model))
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.bytes()
        .expect("numeric tensor")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Largest `|a - b| - rel * |b|` over the elements of two float outputs (<= `abs` means
/// within `abs` absolute + `rel` relative).
fn excess(a: &Tensor, b: &Tensor, rel: f32) -> f32 {
    f32s(a)
        .iter()
        .zip(f32s(b))
        .map(|(x, y)| (x - y).abs() - rel * y.abs())
        .fold(f32::MIN, f32::max)
}

/// `got` (OpenVINO) against `want` (CPU EP): same names, types and shapes; floats within
/// `abs` + `rel`·|want|, everything else exact.
fn assert_close(
    model: &str,
    got: &[(String, Tensor)],
    want: &[(String, Tensor)],
    abs: f32,
    rel: f32,
) {
    assert_eq!(got.len(), want.len(), "{model}: number of outputs");
    for ((ng, g), (nw, w)) in got.iter().zip(want) {
        assert_eq!(ng, nw, "{model}: output order");
        assert_eq!(g.elem_type(), w.elem_type(), "{model} output {ng}: type");
        assert_eq!(g.shape(), w.shape(), "{model} output {ng}: shape");
        if w.elem_type() == ElementType::Float {
            let e = excess(g, w, rel);
            assert!(
                e <= abs,
                "{model} output {ng}: OpenVINO differs from the CPU EP by {e} beyond {rel} \
                 relative (allowed {abs}):\n{:?}\nvs\n{:?}",
                f32s(g),
                f32s(w)
            );
        } else {
            assert!(g == w, "{model} output {ng}: {g:?} vs CPU {w:?}");
        }
    }
}

#[test]
fn models_match_the_cpu_ep_in_f32() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let env = env_for(&dir);
    let (lib, i) = env.find_provider(EP).expect("the OpenVINO plugin is found");
    assert!(
        lib.path.as_ref().is_some_and(|p| p.starts_with(dir.path())),
        "{:?}",
        lib.path
    );
    assert_eq!(
        lib.providers[i].availability,
        Ok(()),
        "the OpenVINO EP should be available with {SEARCH_PATH_VAR}={}",
        runtime_dir().display()
    );

    for model in MODELS {
        let inputs = reference_inputs(model);
        let want = run(&cpu_session(&env, model), &inputs);
        for options in [
            &[("precision", "f32")][..],
            &[][..],
            &[("num_of_threads", "1"), ("device_type", "CPU")][..],
        ] {
            let session = openvino_session(&env, model, options)
                .unwrap_or_else(|e| panic!("{model} {options:?}: {e}"));
            // With the host's shape inference every node of both models has a known rank,
            // so OpenVINO takes them all, as one kernel.
            assert!(
                session.node_placement().iter().all(|p| *p == EP),
                "{model}: not every node on openvino: {:?}",
                session.node_placement()
            );
            assert_eq!(session.kernel_count(), 1, "{model}");
            let got = run(&session, &inputs);
            assert_close(model, &got, &want, 1e-4, 1e-3);
        }
    }
}

/// What OpenVINO's CPU device says it computes natively (`OPTIMIZATION_CAPABILITIES`, e.g.
/// `FP32 BF16 INT8 BIN EXPORT_IMPORT`), asked directly through the C API rather than through the
/// plugin under test.
fn cpu_optimization_capabilities() -> Vec<String> {
    use openvino_sys as sys;
    use std::ffi::{CStr, CString, c_char};
    load_fetched_runtime();
    let (device, key) = (c"CPU", CString::new("OPTIMIZATION_CAPABILITIES").unwrap());
    let mut core = std::ptr::null_mut();
    let mut value: *mut c_char = std::ptr::null_mut();
    // SAFETY: the library is loaded; every out-pointer is valid; the core and the string are
    // freed once, with OpenVINO's own functions.
    unsafe {
        assert_eq!(sys::ov_core_create(&mut core), sys::ov_status_e::OK);
        let status = sys::ov_core_get_property(core, device.as_ptr(), key.as_ptr(), &mut value);
        assert_eq!(
            status,
            sys::ov_status_e::OK,
            "reading OPTIMIZATION_CAPABILITIES"
        );
        let caps = CStr::from_ptr(value).to_string_lossy().into_owned();
        sys::ov_free(value);
        sys::ov_core_free(core);
        caps.split_whitespace().map(str::to_string).collect()
    }
}

/// `precision=bf16` must reach OpenVINO. On a CPU that computes in bf16 (AVX-512 BF16, AMX) the
/// results move a little; on one that cannot (AVX2 only), OpenVINO computes in f32 and the
/// results must be exactly the f32 ones. The test asks the device which case it is in and says so.
#[test]
fn bf16_precision_changes_results_a_little() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let env = env_for(&dir);
    let model = "mnist-cnn";
    let inputs = reference_inputs(model);
    let f32_out = run(
        &openvino_session(&env, model, &[("precision", "f32")]).expect("f32 session"),
        &inputs,
    );
    let bf16_out = run(
        &openvino_session(&env, model, &[("precision", "bf16")]).expect("bf16 session"),
        &inputs,
    );
    assert_close(model, &bf16_out, &f32_out, 1e-1, 0.0);
    let differs = f32_out
        .iter()
        .zip(&bf16_out)
        .any(|((_, a), (_, b))| f32s(a) != f32s(b));
    let caps = cpu_optimization_capabilities();
    if caps.iter().any(|c| c == "BF16") {
        eprintln!(
            "checked: the CPU computes in bf16 ({}): results must move",
            caps.join(" ")
        );
        assert!(
            differs,
            "precision=bf16 gave exactly the f32 results on a CPU with BF16 in its \
             OPTIMIZATION_CAPABILITIES ({}): the option did not reach OpenVINO",
            caps.join(" ")
        );
    } else {
        eprintln!(
            "checked: the CPU has no bf16 ({}): results must equal f32",
            caps.join(" ")
        );
        assert!(
            !differs,
            "precision=bf16 changed the results on a CPU without BF16 in its \
             OPTIMIZATION_CAPABILITIES ({})",
            caps.join(" ")
        );
    }
}

#[test]
fn one_session_from_four_threads() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let env = env_for(&dir);
    for model in MODELS {
        let session = openvino_session(&env, model, &[]).expect("session");
        let inputs = reference_inputs(model);
        let first = run(&session, &inputs);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..10 {
                            let out = run(&session, &inputs);
                            for ((n, t), (n0, t0)) in out.iter().zip(&first) {
                                assert_eq!(n, n0);
                                assert!(t == t0, "{model}: output {n} differs between runs");
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("a thread panicked");
            }
        });
    }
}

#[test]
fn the_devices_openvino_lists_are_the_eps_devices() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let env = env_for(&dir);
    let devices: Vec<_> = env
        .devices()
        .into_iter()
        .filter(|d| d.provider == "openvino")
        .collect();
    // This machine has no Intel GPU or NPU: OpenVINO's CPU device is the one listed, under its
    // OpenVINO name, with the processor's full name and OpenVINO's version.
    let cpu = devices
        .iter()
        .find(|d| d.selector == "openvino:CPU")
        .unwrap_or_else(|| panic!("no openvino:CPU in {devices:?}"));
    assert_eq!(cpu.device.kind, "cpu");
    assert!(!cpu.device.name.is_empty(), "{cpu:?}");
    assert!(
        cpu.device.driver_version.starts_with("OpenVINO 20"),
        "{cpu:?}"
    );
    assert_eq!(cpu.device.unusable, None);
    for d in &devices {
        println!(
            "{}: {} {} {:?}",
            d.selector, d.device.kind, d.device.name, d.device.memory_bytes
        );
    }
    // A session on that device: the EP compiles for OpenVINO's `CPU`, and says so.
    let on_cpu = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([ExecutionProvider::new(EP)
                    .on_device("CPU")
                    .error_on_failure()])
        })
        .and_then(|b| b.commit_from_file(model_path("mlp-int")))
        .expect("openvino:CPU session");
    assert_eq!(
        on_cpu.placement().devices,
        [(EP.to_string(), "openvino:CPU".to_string())]
    );
    let inputs = reference_inputs("mlp-int");
    let plain = openvino_session(&env, "mlp-int", &[]).expect("session");
    assert_eq!(run(&on_cpu, &inputs), run(&plain, &inputs));
    // Naming the device twice, differently, is an error.
    let both = Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([ExecutionProvider::new(EP)
                    .on_device("CPU")
                    .with_option("device_type", "GPU")
                    .error_on_failure()])
        })
        .and_then(|b| b.commit_from_file(model_path("mlp-int")));
    let msg = both.err().expect("conflicting devices").to_string();
    assert!(
        msg.contains("says GPU, but the session chose device CPU"),
        "{msg}"
    );
}

#[test]
fn bad_options_are_errors_naming_the_valid_keys() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let env = env_for(&dir);
    let err = openvino_session(&env, "mlp-int", &[("colour", "red")])
        .err()
        .expect("an unknown option must fail the session");
    let msg = err.to_string();
    assert!(msg.contains("`colour`"), "{msg}");
    for key in ["device_type", "precision", "num_of_threads", "library"] {
        assert!(
            msg.contains(key),
            "the error should name valid key `{key}`: {msg}"
        );
    }
    let err = openvino_session(&env, "mlp-int", &[("precision", "f64")])
        .err()
        .expect("a bad precision must fail");
    assert!(err.to_string().contains("f32, bf16, f16"), "{err}");
    let err = openvino_session(&env, "mlp-int", &[("device_type", "NOSUCHDEVICE")])
        .err()
        .expect("an unknown device must fail");
    assert!(err.to_string().contains("NOSUCHDEVICE"), "{err}");
    // A `library` other than the one this process opened.
    let err = openvino_session(
        &env,
        "mlp-int",
        &[("library", "/nonexistent/libopenvino_c.so")],
    )
    .err()
    .expect("a missing library must fail");
    assert!(
        err.to_string().contains("/nonexistent/libopenvino_c.so"),
        "{err}"
    );
}

/// Runs `child_reports_what_it_searched` in a fresh process (the library, once opened, stays
/// open) with no way to find OpenVINO: empty search path, no Python environments, a `HOME`
/// without `.local`.
#[test]
fn missing_runtime_names_the_places_searched() {
    let home = TempDir::new("openvino-home").expect("temp dir");
    for library in [None, Some("/nonexistent/libopenvino_c.so")] {
        let mut cmd = Command::new(std::env::current_exe().expect("test executable"));
        cmd.args([
            "--exact",
            "child_reports_what_it_searched",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env(SEARCH_PATH_VAR, "")
        .env("HOME", home.path())
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .env_remove("PYTHONPATH")
        .env_remove(LIBRARY_VAR);
        if let Some(l) = library {
            cmd.env(LIBRARY_VAR, l);
        }
        let out = cmd.output().expect("run the child test");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "child ({library:?}) failed:\n{text}");
        assert!(
            text.contains("1 passed"),
            "the child test did not run:\n{text}"
        );
    }
}

#[test]
#[ignore = "run in a child process by missing_runtime_names_the_places_searched"]
fn child_reports_what_it_searched() {
    assert!(
        std::env::var_os(CHILD_VAR).is_some(),
        "run by missing_runtime_names_the_places_searched, with its environment"
    );
    let dir = openvino_plugin();
    let env = env_for(&dir);
    let (lib, i) = env
        .find_provider(EP)
        .expect("the plugin loads without OpenVINO");
    let reason = lib.providers[i]
        .availability
        .clone()
        .expect_err("OpenVINO must be unavailable with nothing to find it by");
    eprintln!("availability: {reason}");
    match std::env::var(LIBRARY_VAR) {
        Ok(path) => {
            assert!(reason.contains(&path), "{reason}");
            assert!(reason.contains(LIBRARY_VAR), "{reason}");
        }
        Err(_) => {
            assert!(reason.contains("not found"), "{reason}");
            let plugin_folder = dir.path().join("openvino");
            assert!(
                reason.contains(&plugin_folder.display().to_string()),
                "the plugin folder should be among the places searched: {reason}"
            );
            assert!(reason.contains("searched:"), "{reason}");
        }
    }
    // A session asking for the EP gets the same reason.
    let err = openvino_session(&env, "mlp-int", &[])
        .err()
        .expect("an unavailable EP must fail the session with error_on_failure");
    let msg = err.to_string();
    assert!(
        msg.contains("not available") && msg.contains(&reason),
        "{msg}"
    );
}

/// `epx conformance --ep openvino` on the node tests of common float ops and on mnist-cnn:
/// nothing wrong or crashed, most cases claimed.
#[test]
fn openvino_passes_epx_conformance_on_common_ops() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let runtime = runtime_dir();
    let Some((code, out)) = epx_tests::run_conformance(
        dir.path(),
        EP,
        "test_relu,test_sigmoid,test_tanh,test_add,test_mul,test_conv_,test_matmul,test_softmax",
        &[(SEARCH_PATH_VAR, runtime.as_path())],
    ) else {
        return;
    };
    let (cases, claimed, passed, wrong, crashed, _) = epx_tests::conformance_totals(&out);
    assert!(cases > 40 && claimed * 2 > cases, "{out}");
    assert_eq!((wrong, crashed), (0, 0), "{out}");
    assert_eq!(passed, claimed, "{out}");
    assert_eq!(code, Some(0), "{out}");
}

/// The kernel cache through OpenVINO's export and import: a second session imports what the
/// first compiled and gives the same numbers, bit for bit; a stored kernel of another OpenVINO
/// build, or one OpenVINO cannot read, is refused by the EP and compiled again.
#[test]
fn compiled_models_are_exported_and_imported_by_the_next_session() {
    use_fetched_runtime();
    let dir = openvino_plugin();
    let env = env_for(&dir);
    let cache = env.kernel_cache().expect("a kernel cache");
    let only_use = |s: &Session| {
        let uses = s.placement().kernel_cache;
        assert_eq!(uses.len(), 1, "{uses:?}");
        (uses[0].loaded, uses[0].note.clone())
    };
    for model in MODELS {
        let inputs = reference_inputs(model);
        let cold = openvino_session(&env, model, &[]).expect("cold session");
        let (loaded, note) = only_use(&cold);
        assert!(
            !loaded && note.starts_with("compiled and stored"),
            "{model}: {note}"
        );
        let want = run(&cold, &inputs);
        let warm = openvino_session(&env, model, &[]).expect("warm session");
        let (loaded, note) = only_use(&warm);
        assert!(loaded, "{model}: {note}");
        assert_eq!(warm.placement().replayed_capabilities, [EP], "{model}");
        let got = run(&warm, &inputs);
        assert!(
            got == want,
            "{model}: imported kernel differs from the compiled one"
        );
    }
    // A kernel with weights over the allocator's mmap threshold (512 KiB): OpenVINO reads an
    // imported blob in place, so the blob must live as long as the kernel, or this run reads
    // unmapped memory.
    let big = big_weights_model();
    let inputs = vec![(
        "x".to_string(),
        Tensor::from_array(
            ndarray::ArrayD::from_shape_vec(
                ndarray::IxDyn(&[1, 64, 8, 8]),
                epx_tests::models::seeded_floats(3, 64 * 64, 1.0),
            )
            .expect("shape"),
        ),
    )];
    let mut outs = Vec::new();
    for _ in 0..2 {
        let s = Session::builder()
            .and_then(|b| {
                b.with_environment(env.clone())
                    .with_execution_providers([ExecutionProvider::new(EP).error_on_failure()])
            })
            .and_then(|b| b.commit_from_memory(&big))
            .expect("session");
        // Allocations the size of the entry the host read, to take that memory if the kernel
        // were still pointing into it after the host freed it.
        let entry = cache
            .entries()
            .expect("entries")
            .iter()
            .map(|e| e.bytes as usize)
            .max()
            .unwrap_or(0);
        let scribble: Vec<Vec<u8>> = (0..8).map(|i| vec![0xa5 ^ i; entry]).collect();
        outs.push((only_use(&s).0, run(&s, &inputs)));
        drop(scribble);
    }
    assert!(!outs[0].0 && outs[1].0, "compiled, then imported");
    assert!(outs[0].1 == outs[1].1, "imported weights differ");

    // Another precision is another kernel.
    let f16 = openvino_session(&env, "mnist-cnn", &[("precision", "f16")]).expect("session");
    assert!(!only_use(&f16).0);

    let stored = |model: &str| {
        let s = openvino_session(&env, model, &[]).expect("session");
        let (loaded, _) = only_use(&s);
        assert!(loaded);
        let entries = cache.entries().expect("entries");
        let key = s.placement().kernel_cache[0].note.clone();
        let e = entries
            .into_iter()
            .find(|e| key.contains(&e.key[..16]))
            .expect("the session's entry");
        (e.key.clone(), e.meta.clone().expect("readable"))
    };
    let (key, meta) = stored("mnist-cnn");
    let payload = |bytes: &[u8]| {
        cache.put(&key, &meta, bytes).expect("put");
    };
    for (what, bytes, says) in [
        (
            "another OpenVINO build",
            b"epx openvino kernel 1; OpenVINO 2019.1.0-0000; device CPU\nblob".to_vec(),
            "the stored kernel was made for `epx openvino kernel 1; OpenVINO 2019.1.0",
        ),
        (
            "OpenVINO cannot read it",
            [
                format!(
                    "epx openvino kernel 1; OpenVINO {}; device CPU\n",
                    openvino_version()
                )
                .into_bytes(),
                vec![0x5a; 4096],
            ]
            .concat(),
            "importing a compiled model for CPU",
        ),
    ] {
        payload(&bytes);
        let s = openvino_session(&env, "mnist-cnn", &[]).expect("session");
        let (loaded, note) = only_use(&s);
        assert!(!loaded, "{what}");
        assert!(
            note.contains("the EP refused its stored kernel")
                && note.contains(says)
                && note.contains("compiled and stored"),
            "{what}: {note}"
        );
        let inputs = reference_inputs("mnist-cnn");
        let want = run(&cpu_session(&env, "mnist-cnn"), &inputs);
        assert_close("mnist-cnn", &run(&s, &inputs), &want, 1e-4, 1e-3);
    }
}

/// Two 3×3 convolutions of 64 channels with biases and a Relu between, on [1, 64, 8, 8] (about
/// 300 KiB of weights).
fn big_weights_model() -> Vec<u8> {
    use epx_tests::models::{float_init, float_value, model_bytes, node, seeded_floats};
    let conv = |x: &str, w: &str, b: &str, y: &str| {
        let mut n = node("Conv", &[x, w, b], &[y]);
        n.attribute
            .push(epx_tests::models::ints_attr("pads", &[1, 1, 1, 1]));
        n
    };
    model_bytes(epx::onnx::proto::GraphProto {
        name: Some("big_weights".into()),
        node: vec![
            conv("x", "w1", "b1", "h"),
            node("Relu", &["h"], &["r"]),
            conv("r", "w2", "b2", "y"),
        ],
        initializer: vec![
            float_init("w1", &[64, 64, 3, 3], seeded_floats(5, 64 * 64 * 9, 0.05)),
            float_init("b1", &[64], seeded_floats(6, 64, 0.1)),
            float_init("w2", &[64, 64, 3, 3], seeded_floats(7, 64 * 64 * 9, 0.05)),
            float_init("b2", &[64], seeded_floats(8, 64, 0.1)),
        ],
        input: vec![float_value("x", &[1, 64, 8, 8])],
        output: vec![float_value("y", &[1, 64, 8, 8])],
        ..Default::default()
    })
}

/// Opens the fetched `libopenvino_c.so` for the test's own calls into OpenVINO.
fn load_fetched_runtime() {
    let lib = std::fs::read_dir(runtime_dir())
        .expect("runtime folder")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libopenvino_c.so"))
        })
        .expect("libopenvino_c.so in the runtime folder");
    // The plugin may have opened the same file already; `load_from` then shares that handle.
    let _ = openvino_sys::library::load_from(&lib);
}

/// OpenVINO's build number, asked through the C API directly.
fn openvino_version() -> String {
    use openvino_sys as sys;
    load_fetched_runtime();
    let mut v = sys::ov_version_t {
        buildNumber: std::ptr::null(),
        description: std::ptr::null(),
    };
    // SAFETY: a valid out-struct, freed with the matching function; the string is copied first.
    unsafe {
        assert_eq!(sys::ov_get_openvino_version(&mut v), sys::ov_status_e::OK);
        let s = std::ffi::CStr::from_ptr(v.buildNumber)
            .to_string_lossy()
            .into_owned();
        sys::ov_version_free(&mut v);
        s
    }
}
