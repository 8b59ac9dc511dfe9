//! The ONNX Runtime adapter plugins (`plugins/onnxruntime/eps/*`), loaded through the ABI against
//! the ONNX Runtime CPU wheel that `plugins/onnxruntime/fetch-runtime.sh` unpacks into
//! `.testdata/onnxruntime/capi/`.
//!
//! Needs `bash plugins/onnxruntime/fetch-runtime.sh` and `cargo build --workspace` first (the
//! README's test command runs both); without the runtime the tests fail saying so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Once};

use epx::{ElementType, Environment, ExecutionProvider, Session, Tensor};
use epx_tests::examples::{env_for, f32s, model_path, reference_inputs, reference_npy, run};
use epx_tests::{TempDir, artifact_dir, built_library, repo_root};

/// Where the fetch script puts the libraries.
fn runtime_dir() -> PathBuf {
    repo_root().join(".testdata/onnxruntime/capi")
}

/// Points the adapter at the fetched runtime, once per process, before any environment exists.
/// Fails, saying how to fetch it, when the runtime is not there.
fn ort_ready() -> bool {
    static SET: Once = Once::new();
    let dir = runtime_dir();
    assert!(
        dir.join("libonnxruntime.so.1").exists(),
        "{} has no ONNX Runtime: run `bash plugins/onnxruntime/fetch-runtime.sh` (the README's test command does)",
        dir.display()
    );
    SET.call_once(|| {
        // SAFETY: runs once, before this process creates any environment or loads any plugin;
        // every test calls this first, so nothing of ours reads the environment concurrently.
        unsafe { std::env::set_var("EPX_ORT_SEARCH_PATH", &dir) };
    });
    true
}

/// A plugin folder holding the thin plugin for EP `ep` and its `plugin.toml`.
fn plugin_dir(ep: &str) -> TempDir {
    let dir = TempDir::new(&format!("ort-{ep}")).expect("temp dir");
    let manifest_path = repo_root().join(format!("plugins/onnxruntime/eps/{ep}/plugin.toml"));
    let manifest = std::fs::read_to_string(&manifest_path)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest_path.display()));
    dir.add_plugin(ep, &built_library(&format!("epx_{ep}")), Some(&manifest))
        .expect("copy the plugin");
    dir
}

fn session(env: &Arc<Environment>, model: &Path, eps: Vec<ExecutionProvider>) -> Session {
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers(eps)
        .expect("providers")
        .commit_from_file(model)
        .unwrap_or_else(|e| panic!("session for {}: {e}", model.display()))
}

/// Floats within 1e-5, everything else exactly.
fn assert_close(what: &str, got: &[(String, Tensor)], want: &[(String, Tensor)]) {
    assert_eq!(got.len(), want.len(), "{what}: number of outputs");
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}: output order");
        assert_eq!(g.elem_type(), w.elem_type(), "{what} {gn}: element type");
        assert_eq!(g.shape(), w.shape(), "{what} {gn}: shape");
        let (gb, wb) = (g.bytes().expect("numeric"), w.bytes().expect("numeric"));
        if g.elem_type() == ElementType::Float {
            for (i, (a, b)) in f32s(gb).iter().zip(f32s(wb)).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{what} {gn}[{i}]: {a} vs {b}");
            }
        } else {
            assert_eq!(gb, wb, "{what} {gn}: differs");
        }
    }
}

/// The reference `.npy` outputs (computed by onnxruntime when the models were made).
fn assert_matches_reference(model: &str, got: &[(String, Tensor)]) {
    for (name, want) in reference_npy(model, "output") {
        let (_, g) = got
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{model}: no output {name}"));
        assert_eq!(g.shape(), want.shape.as_slice(), "{model} {name}: shape");
        let gb = g.bytes().expect("numeric");
        if want.elem_type == ElementType::Float {
            for (i, (a, b)) in f32s(gb).iter().zip(f32s(&want.data)).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{model} {name}[{i}]: {a} vs {b}");
            }
        } else {
            assert_eq!(gb, want.data.as_slice(), "{model} {name}");
        }
    }
}

#[test]
fn ort_cpu_runs_the_example_models_like_the_cpu_ep() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let (lib, index) = env.find_provider("ort_cpu").expect("ort_cpu is found");
    assert_eq!(
        lib.providers[index].availability,
        Ok(()),
        "ort_cpu should be available with the fetched runtime"
    );
    assert!(lib.providers[index].concurrent_kernels);
    for model in ["mnist-cnn", "mlp-int"] {
        let path = model_path(model);
        let inputs = reference_inputs(model);
        let cpu = session(&env, &path, vec![]);
        let ort = session(
            &env,
            &path,
            vec![
                ExecutionProvider::new("ort_cpu")
                    .with_option("intra_op_num_threads", "1")
                    .error_on_failure(),
            ],
        );
        assert_eq!(
            ort.providers(),
            ["ort_cpu"],
            "{model}: every node on ort_cpu"
        );
        assert!(ort.skipped_providers().is_empty());
        let want = run(&cpu, &inputs);
        let got = run(&ort, &inputs);
        assert_close(model, &got, &want);
        assert_matches_reference(model, &got);
        // Runs from several threads at once agree (ORT's Run is thread-safe).
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| assert_close(model, &run(&ort, &inputs), &got));
            }
        });
    }
}

/// ONNX Runtime's own device list (`GetEpDevices`) becomes the EP's: `ort_cpu` lists the
/// processor ONNX Runtime sees, a session can name it, and a device it does not list, or a
/// `device_id` that contradicts the chosen device, is an error.
#[test]
fn ort_cpu_lists_the_devices_onnx_runtime_reports() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let devices: Vec<_> = env
        .devices()
        .into_iter()
        .filter(|d| d.provider == "ort_cpu")
        .collect();
    assert_eq!(devices.len(), 1, "{devices:?}");
    let d = &devices[0];
    assert_eq!(d.selector, "ort_cpu:0");
    assert_eq!(d.device.kind, "cpu");
    assert!(d.device.unusable.is_none());
    assert!(
        !d.device.vendor.is_empty() && !d.device.name.is_empty(),
        "{d:?}"
    );
    assert!(
        !d.device.driver_version.is_empty(),
        "ONNX Runtime's version or the driver's: {d:?}"
    );
    let path = model_path("mnist-cnn");
    let on = session(
        &env,
        &path,
        vec![
            ExecutionProvider::new("ort_cpu")
                .on_device("0")
                .error_on_failure(),
        ],
    );
    assert_eq!(
        on.placement().devices,
        [("ort_cpu".to_string(), "ort_cpu:0".to_string())]
    );
    assert_matches_reference("mnist-cnn", &run(&on, &reference_inputs("mnist-cnn")));
    let err = Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new("ort_cpu")
            .on_device("3")
            .error_on_failure()])
        .expect("eps")
        .commit_from_file(&path)
        .err()
        .expect("no device 3");
    assert!(err.to_string().contains("ort_cpu:0"), "{err}");
}

#[test]
fn ort_cpu_and_the_cpu_ep_share_a_model() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let model = "mnist-cnn";
    let path = model_path(model);
    let s = session(
        &env,
        &path,
        vec![
            ExecutionProvider::new("ort_cpu")
                .with_option("ops", "Conv,Relu")
                .error_on_failure(),
        ],
    );
    assert_eq!(
        s.providers(),
        ["ort_cpu", "cpu"],
        "{model}: split placement"
    );
    let placement = s.node_placement();
    assert_eq!(placement.iter().filter(|p| **p == "ort_cpu").count(), 4);
    // Each node left to the CPU EP says why the adapter declined it.
    let report = s.placement();
    let pool = report
        .fallbacks
        .iter()
        .find(|f| f.op_type == "MaxPool")
        .expect("MaxPool falls back");
    assert_eq!(
        pool.reason,
        "ort_cpu declined it: `MaxPool` is not in its `ops` option"
    );
    let inputs = reference_inputs(model);
    let got = run(&s, &inputs);
    assert_close(model, &got, &run(&session(&env, &path, vec![]), &inputs));
    assert_matches_reference(model, &got);
}

/// A node whose output is not a tensor (ZipMap's sequence of maps) stays on the CPU EP, with
/// the reason; the rest of the model runs on ONNX Runtime and the answers are the CPU EP's.
#[test]
fn ort_cpu_declines_values_that_are_not_tensors() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let path = repo_root().join("tests/models/sklearn-values/logistic-zipmap/model.onnx");
    let s = session(&env, &path, vec![ExecutionProvider::new("ort_cpu")]);
    let report = s.placement();
    let zipmap = report
        .fallbacks
        .iter()
        .find(|f| f.op_type == "ZipMap")
        .expect("ZipMap falls back");
    assert_eq!(
        zipmap.reason,
        "ort_cpu declined it: sequence outputs do not cross this adapter, which passes tensors only"
    );
    assert!(
        s.node_placement().contains(&"ort_cpu"),
        "{:?}",
        s.node_placement()
    );
    let spec = &s.inputs()[0];
    let x = epx_io::valuefile::read_value(
        &repo_root().join("tests/models/sklearn-values/logistic-zipmap/input/X.npy"),
        &spec.ty,
    )
    .expect("X.npy");
    let got = s.run([(spec.name.clone(), x)]).expect("split run");
    assert_eq!(got.len(), 2);
}

/// The device path of the adapter (ORT's allocator, IO binding, copies through ORT), run
/// without a GPU: the `ort_cpu_device` fixture is ORT's CPU EP with its tensors in memory from
/// ORT's allocator, declared as its own memory space. The CUDA and TensorRT plugins take the
/// same path with ORT's CUDA allocator (`tests/gpu/check-cuda.sh` runs it on a GPU).
#[test]
fn an_ort_ep_with_its_own_memory_keeps_tensors_there_between_kernels() {
    if !ort_ready() {
        return;
    }
    let dir = TempDir::new("ort-device").expect("temp dir");
    dir.add_plugin(
        "ort_cpu_device",
        &built_library("epx_fixture_ort_cpu_device"),
        Some(
            "name = \"ort_cpu_device\"\nversion = \"0.1.0\"\nabi = \"1.1\"\n\
             providers = [\"ort_cpu_device\"]\n\n[library]\nlinux = \"libepx_fixture_ort_cpu_device.so\"\n",
        ),
    )
    .expect("copy the plugin");
    let env = env_for(&dir);
    let model = "mnist-cnn";
    let path = model_path(model);
    let inputs = reference_inputs(model);
    let want = run(&session(&env, &path, vec![]), &inputs);
    let ep = || ExecutionProvider::new("ort_cpu_device").error_on_failure();

    // Conv, BatchNormalization and Relu on the EP, the pools and the head on the CPU EP: two
    // groups, conv1→bn1→relu1 and conv2→relu2. Values inside a group never leave ORT; each
    // group's input goes to the device and its output comes back: four copies.
    let split = session(
        &env,
        &path,
        vec![ep().with_option("ops", "Conv,BatchNormalization,Relu")],
    );
    assert_eq!(split.providers(), ["ort_cpu_device", "cpu"]);
    let got = run(&split, &inputs);
    assert_close(model, &got, &want);
    assert_matches_reference(model, &got);
    let report = split.placement();
    assert_eq!(report.copies.len(), 4, "{:#?}", report.copies);
    let (to_dev, to_host) =
        report
            .copies
            .iter()
            .fold((0, 0), |(d, h), c| match (c.from.as_str(), c.to.as_str()) {
                ("host", "ort_cpu_device") => (d + 1, h),
                ("ort_cpu_device", "host") => (d, h + 1),
                other => panic!("unexpected copy {other:?}: {c:?}"),
            });
    assert_eq!((to_dev, to_host), (2, 2), "{:#?}", report.copies);
    for c in &report.copies {
        assert!(
            c.last_run_bytes.is_some_and(|b| b > 0),
            "copy of {} did not run: {c:?}",
            c.value
        );
    }

    // Every node on the EP, the output kept there: one copy in (the image), none out; the
    // output is read back through the EP's copy to the host.
    let output = reference_npy(model, "output")
        .into_iter()
        .next()
        .expect("a reference output")
        .0;
    let whole = Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ep()])
        .expect("providers")
        .with_device_outputs([output.as_str()])
        .commit_from_file(&path)
        .expect("session");
    assert_eq!(whole.providers(), ["ort_cpu_device"]);
    assert_eq!(
        whole.placement().copies.len(),
        1,
        "{:#?}",
        whole.placement().copies
    );
    let outs = whole
        .run(
            inputs
                .iter()
                .map(|(n, t)| (n.as_str(), t.try_clone().unwrap())),
        )
        .expect("run");
    let on_device = outs.device(&output).expect("the output stays on the EP");
    assert_eq!(on_device.provider_name(), "ort_cpu_device");
    let host = on_device.to_host().expect("copy back through ORT");
    assert_close(model, &[(output.clone(), host)], &want);
}

#[test]
fn unknown_options_name_the_valid_ones() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let err = Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new("ort_cpu")
            .with_option("colour", "red")
            .error_on_failure()])
        .expect("providers")
        .commit_from_file(model_path("mlp-int"))
        .err()
        .expect("an unknown option fails");
    let msg = err.to_string();
    assert!(
        msg.contains("`colour`") && msg.contains("intra_op_num_threads") && msg.contains("library"),
        "{msg}"
    );
}

#[test]
fn a_library_option_naming_nothing_says_where_it_looked() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let err = Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ExecutionProvider::new("ort_cpu")
            .with_option("library", "/nonexistent/libonnxruntime.so")
            .error_on_failure()])
        .expect("providers")
        .commit_from_file(model_path("mlp-int"))
        .err()
        .expect("a missing library fails");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/libonnxruntime.so") && msg.contains("not found"),
        "{msg}"
    );
}

#[test]
fn cuda_is_unavailable_with_the_cpu_wheel_and_says_why() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("cuda");
    let env = env_for(&dir);
    let (lib, index) = env.find_provider("cuda").expect("the cuda plugin loads");
    let reason = lib.providers[index]
        .availability
        .clone()
        .expect_err("the CPU wheel has no CUDA EP");
    let library = std::fs::canonicalize(runtime_dir().join("libonnxruntime.so.1"))
        .expect("the fetched library");
    let lib_dir = runtime_dir();
    assert!(
        reason.contains("CUDAExecutionProvider")
            && reason.contains("CPUExecutionProvider")
            && (reason.contains(&*library.to_string_lossy())
                || reason.contains(&*lib_dir.to_string_lossy())),
        "{reason}"
    );
}

#[test]
fn directml_needs_windows() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("directml");
    let env = env_for(&dir);
    let (lib, index) = env.find_provider("directml").expect("the plugin loads");
    let reason = lib.providers[index]
        .availability
        .clone()
        .expect_err("DirectML is Windows-only");
    if cfg!(target_os = "windows") {
        return;
    }
    assert!(
        reason.contains("Windows") && reason.contains("DmlExecutionProvider"),
        "{reason}"
    );
}

fn cli() -> Option<PathBuf> {
    let cli = artifact_dir().join(format!("epx{}", std::env::consts::EXE_SUFFIX));
    if cli.is_file() {
        Some(cli)
    } else {
        eprintln!(
            "skipping the CLI check: {} is missing (run `cargo build --workspace`)",
            cli.display()
        );
        None
    }
}

#[test]
fn doctor_names_the_missing_cuda_libraries() {
    if !ort_ready() {
        return;
    }
    let Some(cli) = cli() else { return };
    let dir = plugin_dir("cuda");
    let out = Command::new(&cli)
        .arg("--plugin-dir")
        .arg(dir.path())
        .arg("doctor")
        .env("EPX_LIBRARY_PATH", "")
        .output()
        .expect("running epx doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("libcudart.so.13"))
        .unwrap_or_else(|| panic!("doctor does not name libcudart.so.13:\n{stdout}"));
    if line.contains('✓') {
        eprintln!("this machine has the CUDA runtime: {line}");
    } else {
        assert!(line.contains("not found"), "{line}\n{stdout}");
    }
}

/// With no ONNX Runtime anywhere, availability lists every place searched. Run in a child
/// process with a scrubbed environment (the search reads process-wide variables).
#[test]
fn without_a_runtime_availability_lists_the_places_searched() {
    let Some(cli) = cli() else { return };
    let dir = plugin_dir("ort_cpu");
    let home = TempDir::new("ort-home").expect("temp dir");
    let out = Command::new(&cli)
        .arg("--plugin-dir")
        .arg(dir.path())
        .arg("providers")
        .env_remove("EPX_ORT_SEARCH_PATH")
        .env_remove("EPX_ORT_LIBRARY")
        .env_remove("ORT_DYLIB_PATH")
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH")
        .env("HOME", home.path())
        .output()
        .expect("running epx providers");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("ort_cpu"))
        .unwrap_or_else(|| panic!("no ort_cpu line:\n{stdout}"));
    if line.contains(" ok ") {
        eprintln!("skipping: a system-wide ONNX Runtime was found anyway: {line}");
        return;
    }
    for needle in [
        "was not found",
        "option `library` (not given)",
        "EPX_ORT_LIBRARY (unset)",
        "ORT_DYLIB_PATH (unset)",
        "EPX_ORT_SEARCH_PATH (unset)",
        "VIRTUAL_ENV (unset)",
        ".local/lib/python3*/site-packages",
    ] {
        assert!(line.contains(needle), "`{needle}` missing: {line}");
    }
    // The plugin's own folder is searched (Linux reads it from /proc/self/maps).
    if cfg!(target_os = "linux") {
        let plugin_folder = dir.path().join("ort_cpu");
        assert!(
            line.contains(&*plugin_folder.to_string_lossy()),
            "the plugin folder {} is not among the places searched: {line}",
            plugin_folder.display()
        );
    }
}

/// `x[2,3] → Shrink(lambd 0.5) → s → Relu → y`, with `s` left untyped: the host infers no type
/// for `Shrink`, so the adapter must guess the untyped input of `Relu` (float) and leave ORT to
/// infer the untyped output of `Shrink`. The built-in CPU EP has no `Shrink`.
fn shrink_relu_model() -> Vec<u8> {
    use epx::onnx::proto;
    use prost::Message;
    let float_value = |name: &str| proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(proto::tensor_proto::DataType::Float as i32),
                    shape: Some(proto::TensorShapeProto {
                        dim: [2, 3]
                            .iter()
                            .map(|&d| proto::tensor_shape_proto::Dimension {
                                value: Some(proto::tensor_shape_proto::dimension::Value::DimValue(
                                    d,
                                )),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    let shrink = proto::NodeProto {
        op_type: Some("Shrink".into()),
        name: Some("shrink".into()),
        input: vec!["x".into()],
        output: vec!["s".into()],
        attribute: vec![proto::AttributeProto {
            name: Some("lambd".into()),
            f: Some(0.5),
            r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
            ..Default::default()
        }],
        ..Default::default()
    };
    let relu = proto::NodeProto {
        op_type: Some("Relu".into()),
        name: Some("relu".into()),
        input: vec!["s".into()],
        output: vec!["y".into()],
        ..Default::default()
    };
    proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(proto::GraphProto {
            name: Some("shrink_relu".into()),
            node: vec![shrink, relu],
            input: vec![float_value("x")],
            output: vec![float_value("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn untyped_values_are_probed_as_float_and_inferred_by_ort() {
    if !ort_ready() {
        return;
    }
    let dir = plugin_dir("ort_cpu");
    let env = env_for(&dir);
    let bytes = shrink_relu_model();
    let x = [-1.5f32, 0.25, 2.0, -0.25, 0.75, -4.0];
    let want: Vec<f32> = x
        .iter()
        .map(|&v| if v.abs() > 0.5 { v } else { 0.0 })
        .map(|v: f32| v.max(0.0))
        .collect();
    for (ops, placement) in [
        (None, vec!["ort_cpu", "ort_cpu"]),
        (Some("Shrink"), vec!["ort_cpu", "cpu"]),
    ] {
        let mut ep = ExecutionProvider::new("ort_cpu").error_on_failure();
        if let Some(ops) = ops {
            ep = ep.with_option("ops", ops);
        }
        let s = Session::builder()
            .expect("builder")
            .with_environment(env.clone())
            .with_execution_providers([ep])
            .expect("providers")
            .commit_from_memory(&bytes)
            .unwrap_or_else(|e| panic!("ops {ops:?}: {e}"));
        assert_eq!(s.node_placement(), placement, "ops {ops:?}");
        let input = Tensor::from_bytes(
            ElementType::Float,
            &[2, 3],
            &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        )
        .expect("x");
        let out = s.run([("x", input)]).expect("run");
        let y = out.get("y").expect("y");
        assert_eq!(f32s(y.bytes().expect("numeric")), want, "ops {ops:?}");
    }
}

/// `epx conformance --ep ort_cpu` on the node tests of common float ops and on mnist-cnn: every
/// case claimed and passed, each batch in a child process.
#[test]
fn ort_cpu_passes_epx_conformance_on_common_ops() {
    ort_ready();
    let dir = plugin_dir("ort_cpu");
    let runtime = runtime_dir();
    let Some((code, out)) = epx_tests::run_conformance(
        dir.path(),
        "ort_cpu",
        "test_relu,test_sigmoid,test_tanh,test_add,test_mul,test_conv_,test_matmul,test_softmax",
        &[("EPX_ORT_SEARCH_PATH", runtime.as_path())],
    ) else {
        return;
    };
    let (cases, claimed, passed, wrong, crashed, declined) = epx_tests::conformance_totals(&out);
    assert!(cases > 40, "{out}");
    assert_eq!(
        (claimed, passed, wrong, crashed, declined),
        (cases, cases, 0, 0, 0),
        "{out}"
    );
    assert_eq!(code, Some(0), "{out}");
}
