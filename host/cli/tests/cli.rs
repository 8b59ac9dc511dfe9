//! The `epx` binary as an operator uses it: outputs, `.npy` files, exit codes, and one clear
//! error line on stderr for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn epx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(args)
        .current_dir(repo())
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("RUST_LOG")
        .output()
        .expect("run epx")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fresh folder under the system temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("epx-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts a failed run printed exactly one line, `error: ...`, and no panic.
fn assert_one_error_line(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure; stdout: {}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    lines[0].to_string()
}

#[test]
fn run_writes_outputs_that_match_the_reference() {
    let dir = Scratch::new("run");
    let out_dir = dir.0.join("out");
    let out = epx(&[
        "run",
        "examples/models/mlp-int.onnx",
        "--input",
        "x=examples/models/mlp-int.input.x.npy",
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--repeat",
        "3",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("output y: int64 [2, 5]"), "{stdout}");
    assert!(stdout.contains("latency over 3 runs: min"), "{stdout}");
    for name in ["y", "shape"] {
        let got = epx_io::npy::read_npy(&out_dir.join(format!("{name}.npy"))).unwrap();
        let want = epx_io::npy::read_npy(
            &repo().join(format!("examples/models/mlp-int.output.{name}.npy")),
        )
        .unwrap();
        assert_eq!(
            (got.elem_type, &got.shape, &got.data),
            (want.elem_type, &want.shape, &want.data),
            "{name}"
        );
    }
}

/// x: bfloat16 [3]; y = Cast(x) to float, q = Cast(x) to float8e4m3fn, i = Cast(x) to int4.
fn narrow_types_model() -> Vec<u8> {
    use epx::onnx::proto::{self, tensor_proto::DataType};
    use prost::Message;
    let value = |name: &str, ty: DataType| proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(ty as i32),
                    shape: Some(proto::TensorShapeProto {
                        dim: vec![proto::tensor_shape_proto::Dimension {
                            value: Some(proto::tensor_shape_proto::dimension::Value::DimValue(3)),
                            ..Default::default()
                        }],
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    let cast = |out: &str, to: DataType| proto::NodeProto {
        op_type: Some("Cast".into()),
        input: vec!["x".into()],
        output: vec![out.into()],
        attribute: vec![proto::AttributeProto {
            name: Some("to".into()),
            i: Some(to as i64),
            r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
            ..Default::default()
        }],
        ..Default::default()
    };
    proto::ModelProto {
        ir_version: Some(10),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(21),
        }],
        graph: Some(proto::GraphProto {
            name: Some("narrow".into()),
            node: vec![
                cast("y", DataType::Float),
                cast("q", DataType::Float8e4m3fn),
                cast("i", DataType::Int4),
            ],
            input: vec![value("x", DataType::Bfloat16)],
            output: vec![
                value("y", DataType::Float),
                value("q", DataType::Float8e4m3fn),
                value("i", DataType::Int4),
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// numpy saves `ml_dtypes` arrays as raw bytes (`<V2`, `<V1`): the CLI reads them as the type
/// the model declares and writes narrow outputs the same way, one element per byte.
#[test]
fn ml_dtypes_npy_files_go_in_and_come_out() {
    let dir = Scratch::new("narrow");
    let model = dir.0.join("narrow.onnx");
    std::fs::write(&model, narrow_types_model()).unwrap();
    // As np.save(f, np.array([1.0, -2.0, 3.5], ml_dtypes.bfloat16)) writes it: '<V2'.
    let x = dir.0.join("x.npy");
    let bf16 = [0x80, 0x3f, 0x00, 0xc0, 0x60, 0x40];
    let bytes = epx_io::npy::encode_npy(epx::ElementType::Bfloat16, &[3], &bf16).unwrap();
    assert!(text(&bytes).contains("'descr': '<V2'"));
    std::fs::write(&x, bytes).unwrap();
    let out_dir = dir.0.join("out");
    let out = epx(&[
        "run",
        model.to_str().unwrap(),
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("input  x: bfloat16 [3]"), "{stdout}");
    let y = epx_io::npy::read_npy(&out_dir.join("y.npy")).unwrap();
    let floats: Vec<f32> = y
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [1.0, -2.0, 3.5]);
    // float8e4m3fn codes of 1, -2, 3.5; int4 codes of 1, -2, 3 (truncated), one per byte.
    for (name, codes) in [("q", [0x38u8, 0xc0, 0x46]), ("i", [0x01, 0x0e, 0x03])] {
        let bytes = std::fs::read(out_dir.join(format!("{name}.npy"))).unwrap();
        assert!(text(&bytes).contains("'descr': '|V1'"), "{name}");
        assert_eq!(&bytes[bytes.len() - 3..], codes, "{name}");
    }
    // A raw 2-byte array given for a float32 input is refused with the reason.
    let out = epx(&[
        "run",
        "examples/models/mnist-cnn.onnx",
        "--input",
        &format!("image={}", x.display()),
    ]);
    let line = assert_one_error_line(&out);
    assert!(
        line.contains("raw 2-byte elements") && line.contains("float32"),
        "{line}"
    );
}

#[test]
fn run_makes_random_inputs_when_none_are_given() {
    let out = epx(&["run", "examples/models/mnist-cnn.onnx"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("input  image: float32 [1, 1, 28, 28]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("output probabilities: float32 [1, 10]"),
        "{stdout}"
    );
    assert!(stdout.contains("cpu: 11 nodes"), "{stdout}");
}

#[test]
fn bad_input_gets_one_clear_line() {
    let dir = Scratch::new("bad");
    let junk = dir.0.join("notes.onnx");
    std::fs::write(&junk, "these are my notes, not a model\n").unwrap();
    let line = assert_one_error_line(&epx(&["run", junk.to_str().unwrap()]));
    assert!(
        line.contains("notes.onnx") && line.contains("not a valid ONNX model"),
        "{line}"
    );

    let line = assert_one_error_line(&epx(&["run", "no/such/model.onnx"]));
    assert!(
        line.contains("no/such/model.onnx") && line.contains("No such file"),
        "{line}"
    );

    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--ep",
        "warp-drive",
    ]));
    assert!(
        line.contains("`warp-drive`: no plugin provides it; known EPs: cpu"),
        "{line}"
    );

    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--input",
        "c=x.npy",
    ]));
    assert!(line.contains("no input `c`; its inputs: a, b"), "{line}");

    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--input",
        "a=missing.npy",
    ]));
    assert!(line.contains("missing.npy"), "{line}");

    // An input of the wrong type is refused with both types named.
    let line = assert_one_error_line(&epx(&[
        "run",
        "examples/models/add.onnx",
        "--input",
        "a=examples/models/mlp-int.output.y.npy",
    ]));
    assert!(
        line.contains("input `a` must be float32, got int64"),
        "{line}"
    );
}

#[test]
fn providers_and_doctor_report_a_plugin_folder() {
    let dir = Scratch::new("plugins");
    let libs = Path::new(env!("CARGO_BIN_EXE_epx"))
        .parent()
        .unwrap()
        .to_path_buf();
    let cpu = libs.join("libepx_cpu.so");
    let broken = libs.join("libepx_fixture_missing_dep.so");
    for lib in [&cpu, &broken] {
        assert!(
            lib.is_file(),
            "{} is missing: run `cargo build --workspace` before the tests",
            lib.display()
        );
    }
    let plugin = dir.0.join("cpu");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::copy(&cpu, plugin.join("libepx_cpu.so")).unwrap();
    std::fs::copy(
        repo().join("plugins/cpu/cdylib/plugin.toml"),
        plugin.join("plugin.toml"),
    )
    .unwrap();
    let folder = dir.0.to_str().unwrap();

    let out = epx(&["providers", "--plugin-dir", folder]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("(linked into epx)"), "{stdout}");
    assert!(
        stdout.contains(&format!("{}/cpu/libepx_cpu.so", folder)),
        "{stdout}"
    );

    let out = epx(&["doctor", "--plugin-dir", folder]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    // The copied CPU plugin is built with this checkout's SDK, so it declares the ABI the
    // header (and the host) speaks.
    let header = std::fs::read_to_string(repo().join("include/epx_plugin.h")).unwrap();
    let minor = header
        .lines()
        .find_map(|l| l.strip_prefix("#define EPX_ABI_VERSION_MINOR "))
        .expect("the header defines the ABI minor version");
    assert!(
        text(&out.stdout).contains(&format!(
            "✓ loads: plugin cpu 0.1.0, ABI 1.{}",
            minor.trim()
        )),
        "{}",
        text(&out.stdout)
    );

    // A plugin whose vendor runtime is missing: doctor names it, says where it looked, fails.
    std::fs::copy(&broken, dir.0.join("libepx_fixture_missing_dep.so")).unwrap();
    let out = epx(&["doctor", "--plugin-dir", folder]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("✗ libepx_vendor_runtime.so.3 (needed by"),
        "{stdout}"
    );
    assert!(stdout.contains("not found; searched:"), "{stdout}");
    assert!(stdout.contains(&format!("        {folder}\n")), "{stdout}");
    assert!(stdout.contains("1 problem(s) found"), "{stdout}");
}

#[test]
fn partition_prints_the_placement_and_draws_it() {
    let dir = Scratch::new("partition");
    let libs = Path::new(env!("CARGO_BIN_EXE_epx"))
        .parent()
        .unwrap()
        .to_path_buf();
    let lib = libs.join("libepx_fixture_older_minor.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build --workspace` before the tests",
        lib.display()
    );
    let plugin = dir.0.join("older_minor");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::copy(&lib, plugin.join("libepx_fixture_older_minor.so")).unwrap();
    std::fs::write(
        plugin.join("plugin.toml"),
        "name = \"older_minor\"\nversion = \"0.1.0\"\nabi = \"1.0\"\nproviders = [\"relu_only\", \"never_available\"]\n\n[library]\nlinux = \"libepx_fixture_older_minor.so\"\n",
    )
    .unwrap();
    let dot = dir.0.join("placement.dot");
    let folder = dir.0.to_str().unwrap();
    let out = epx(&[
        "partition",
        "examples/models/mnist-cnn.onnx",
        "--plugin-dir",
        folder,
        "--ep",
        "relu_only",
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("relu1    Relu                relu_only  relu_only#0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("11 nodes in 5 kernels (cpu: 9, relu_only: 2)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("9 nodes fell back to the CPU EP:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("conv1 (Conv): not claimed by relu_only"),
        "{stdout}"
    );
    let picture = std::fs::read_to_string(&dot).unwrap();
    assert!(picture.starts_with("digraph placement {"), "{picture}");
    assert!(
        picture.contains("[relu_only]") && picture.contains("label=\"relu_only#0\""),
        "{picture}"
    );

    // Strict placement refuses the same request, naming what would fall back.
    let out = epx(&[
        "partition",
        "examples/models/mnist-cnn.onnx",
        "--plugin-dir",
        folder,
        "--ep",
        "relu_only",
        "--strict",
    ]);
    let line = assert_one_error_line(&out);
    assert!(
        line.starts_with(
            "error: strict placement: 9 nodes would fall back to the CPU EP: `conv1` (Conv)"
        ),
        "{line}"
    );
}

/// A text model (string input) whose probabilities come out as a sequence of maps: the string
/// `.npy` goes in, the label `.npy` and one `.json` per row come out, equal to ONNX Runtime's.
#[test]
fn strings_sequences_and_maps_go_in_and_come_out_as_files() {
    let dir = Scratch::new("values");
    let model = "tests/models/sklearn-values/tfidf-text";
    let out = epx(&[
        "run",
        &format!("{model}/model.onnx"),
        "--input",
        &format!("text={model}/input/text.npy"),
        "--output-dir",
        dir.0.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("input  text: string [8] [\"the cat sat on the mat\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("output output_probability: seq(map(int64,tensor(float))) of 8 items"),
        "{stdout}"
    );
    let want =
        std::fs::read_to_string(repo().join(format!("{model}/output/output_probability/0.json")))
            .unwrap();
    let got = std::fs::read_to_string(dir.0.join("output_probability/0.json")).unwrap();
    let numbers = |s: &str| -> Vec<f64> {
        s.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
            .filter_map(|t| t.parse().ok())
            .collect()
    };
    let (g, w) = (numbers(&got), numbers(&want));
    assert_eq!(g.len(), w.len(), "{got} vs {want}");
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() < 1e-6, "{got} vs {want}");
    }
    let label = epx_io::npy::read_npy(&dir.0.join("output_label.npy")).unwrap();
    let want =
        epx_io::npy::read_npy(&repo().join(format!("{model}/output/output_label.npy"))).unwrap();
    assert_eq!(label.data, want.data);

    // A map input is a JSON object; a missing one is named, not made up.
    let dv = "tests/models/sklearn-values/dict-vectorizer/model.onnx";
    let out = epx(&[
        "run",
        dv,
        "--input",
        "x=tests/models/sklearn-values/dict-vectorizer/input/x.json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout)
            .contains("input  x: map(string,tensor(float)) of 2 entries {\"a\": 1.0, \"c\": 2.0}"),
        "{}",
        text(&out.stdout)
    );
    let line = assert_one_error_line(&epx(&["run", dv]));
    assert!(
        line.contains("input `x` is a map(string,tensor(float))"),
        "{line}"
    );
}

/// The kind of each step the CPU EP ran for `model` (`tests/models/<model>.onnx` on its saved
/// inputs, `inputs`), with how many times, from `epx run --profile-json`; `level` forces a
/// kernel level.
fn step_kinds(model: &str, inputs: &[&str], level: Option<&str>) -> Vec<(String, u32)> {
    let dir = epx_tests::TempDir::new("step-kinds").expect("temp dir");
    let json = dir.path().join("profile.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_epx"));
    cmd.args(["run", &format!("tests/models/{model}.onnx")]);
    for name in inputs {
        cmd.args([
            "--input",
            &format!("{name}=tests/models/{model}.input.{name}.npy"),
        ]);
    }
    cmd.arg("--profile-json").arg(&json);
    cmd.current_dir(repo())
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("RUST_LOG")
        .env_remove("EPX_CPU_PROFILE");
    match level {
        Some(l) => cmd.env("EPX_CPU_KERNELS", l),
        None => cmd.env_remove("EPX_CPU_KERNELS"),
    };
    let out = cmd.output().expect("run epx");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("profile written")).expect("JSON");
    let mut kinds: Vec<(String, u32)> = Vec::new();
    for k in profile["kernels"].as_array().expect("kernels") {
        assert_eq!(k["provider"], "cpu", "{k}");
        for part in k["parts"].as_array().expect("parts") {
            let op = part["op"].as_str().expect("op").to_string();
            let calls = part["calls"].as_u64().expect("calls") as u32;
            match kinds.iter_mut().find(|(o, _)| *o == op) {
                Some((_, c)) => *c += calls,
                None => kinds.push((op, calls)),
            }
        }
    }
    kinds
}

/// `epx run --profile` prints the time by op, the slowest nodes and the passes that changed
/// the graph, of the `--repeat` runs (the warm-up run left out); `--profile-json` writes the
/// same as JSON.
#[test]
fn run_profile_prints_where_the_time_went_and_what_the_passes_did() {
    let dir = epx_tests::TempDir::new("profile").expect("temp dir");
    let json = dir.path().join("p.json");
    let json_arg = json.to_str().expect("utf-8 path");
    // The fast kernels' fused steps and passes (a kernel level set outside would change them).
    let out = Command::new(env!("CARGO_BIN_EXE_epx"))
        .args([
            "run",
            "examples/models/mnist-cnn.onnx",
            "--repeat",
            "4",
            "--profile",
            "--profile-json",
            json_arg,
        ])
        .current_dir(repo())
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("RUST_LOG")
        .env_remove("EPX_CPU_KERNELS")
        .env_remove("EPX_CPU_DISABLE_PASSES")
        .output()
        .expect("run epx");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for want in [
        "profile: 4 runs, ",
        "\nby op:\n",
        "cpu          Conv+Relu\n",
        "\nslowest nodes:\n",
        "cpu          Conv+Relu            conv1 (fused Relu)\n",
        "\ncompile passes that changed the graph:\n  cpu#0 (11 nodes):\n",
        "    fold_batch_norm      11 -> 10 steps\n",
    ] {
        assert!(stdout.contains(want), "{want:?} in\n{stdout}");
    }
    let p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("written")).expect("JSON");
    assert_eq!(p["runs"], 4);
    let parts = p["kernels"][0]["parts"].as_array().expect("parts");
    assert!(parts.iter().all(|s| s["calls"] == 4), "{parts:?}");
    // A session made without --profile has none to print.
    let plain = epx(&["run", "examples/models/mnist-cnn.onnx"]);
    assert!(!text(&plain.stdout).contains("profile:"));
}

/// How many times steps of kind `k` ran, from [`step_kinds`].
fn count(kinds: &[(String, u32)], k: &str) -> u32 {
    kinds.iter().find(|(n, _)| n == k).map_or(0, |(_, c)| *c)
}

/// A CNN written channels-last (each Conv between Transposes, its bias and normalization as
/// NHWC arithmetic): on the fast levels the Transposes after each Conv move down and cancel the
/// ones before the next, and the arithmetic folds into the Conv's weights; what stays is the
/// input's Transpose, the one that makes the NHWC model output, and the one before the Pad that
/// reads that output. The reference level runs the nodes as written.
#[test]
fn channels_last_transposes_cancel_and_the_arithmetic_folds_into_the_convolutions() {
    let fast = step_kinds("ort-channels-last-cnn", &["x"], None);
    assert_eq!(count(&fast, "Transpose"), 3, "{fast:?}");
    for op in ["Add", "Sub", "Mul", "Relu"] {
        assert_eq!(count(&fast, op), 0, "{op} in {fast:?}");
    }
    assert_eq!(count(&fast, "Conv+Relu"), 1, "{fast:?}");
    assert_eq!(count(&fast, "Conv+Add+Relu"), 1, "{fast:?}");
    let reference = step_kinds("ort-channels-last-cnn", &["x"], Some("reference"));
    assert_eq!(count(&reference, "Transpose"), 6, "{reference:?}");
}

/// With fast kernels, the DequantizeLinear / op / QuantizeLinear groups of a QDQ model run as
/// the quantized ops they stand for (the CPU EP's step profile names what ran); the reference
/// kernels run the nodes as written.
#[test]
fn qdq_groups_fold_into_quantized_ops_except_on_the_reference_kernels() {
    let fast = step_kinds("ort-qdq-cnn", &["x"], None);
    for (op, n) in [
        ("QLinearConv", 3),
        ("QLinearMatMul", 1),
        ("QLinearMul", 1),
        ("QLinearAdd", 2),
    ] {
        assert_eq!(count(&fast, op), n, "{op} in {fast:?}");
    }
    for op in ["Conv", "MatMul", "Mul"] {
        assert_eq!(count(&fast, op), 0, "{op} in {fast:?}");
    }
    // The input's QuantizeLinear and the output's DequantizeLinear stay; the others fold.
    assert_eq!(count(&fast, "QuantizeLinear"), 1, "{fast:?}");
    assert_eq!(count(&fast, "DequantizeLinear"), 1, "{fast:?}");
    let reference = step_kinds("ort-qdq-cnn", &["x"], Some("reference"));
    assert_eq!(count(&reference, "Conv"), 3, "{reference:?}");
    assert_eq!(count(&reference, "QLinearConv"), 0, "{reference:?}");
    // MaxPool and the nearest Resize run on the bytes, the Div by 6 and GlobalAveragePool as
    // quantized ops: after the input, no value is dequantized until the MatMul's output.
    let fast = step_kinds("ort-qdq-movers", &["x"], None);
    for (op, n) in [
        ("MaxPool", 1),
        ("Resize", 1),
        ("QLinearDivByConstant", 1),
        ("Div", 0),
        ("QLinearGlobalAveragePool", 1),
        ("GlobalAveragePool", 0),
        ("QuantizeLinear", 1),
        ("DequantizeLinear", 1),
    ] {
        assert_eq!(count(&fast, op), n, "{op} in {fast:?}");
    }
    let reference = step_kinds("ort-qdq-movers", &["x"], Some("reference"));
    assert_eq!(count(&reference, "GlobalAveragePool"), 1, "{reference:?}");
    assert_eq!(count(&reference, "DequantizeLinear"), 11, "{reference:?}");
}

/// A BatchNormalization after a Conv of constant weights whose output nothing else reads goes
/// into those weights on the fast levels; the one whose Conv output is read twice stays. The
/// reference level runs the nodes as written.
#[test]
fn batch_normalization_folds_into_the_conv_before_it() {
    let fast = step_kinds("ort-conv-bn", &["x"], None);
    assert_eq!(count(&fast, "BatchNormalization"), 1, "{fast:?}");
    let reference = step_kinds("ort-conv-bn", &["x"], Some("reference"));
    assert_eq!(count(&reference, "BatchNormalization"), 3, "{reference:?}");
}

/// float16 values are float32 inside a program, so a Cast between float and float16 there is
/// the identity: its readers read its input. Of `float16-overflow`'s two Casts only the one
/// that makes the model's float32 output runs, on every kernel level.
#[test]
fn casts_between_float_and_float16_inside_a_program_do_not_run() {
    for level in [None, Some("reference")] {
        let kinds = step_kinds("float16-overflow", &["x"], level);
        assert_eq!(count(&kinds, "Cast"), 1, "{level:?}: {kinds:?}");
    }
}

/// Nodes of an If's branches that read only constants, some of them the enclosing graph's
/// initializers, are computed once when the session is made, on every kernel level: a run
/// executes the If and its MatMul and Add alone.
#[test]
fn nested_bodies_fold_what_reads_only_enclosing_constants() {
    for level in [None, Some("reference")] {
        let kinds = step_kinds("ort-nested-constants", &["cond", "x"], level);
        for op in ["Slice", "Concat", "Transpose"] {
            assert_eq!(count(&kinds, op), 0, "{op} ran ({level:?}): {kinds:?}");
        }
        assert_eq!(count(&kinds, "If"), 1, "{level:?}: {kinds:?}");
        assert_eq!(count(&kinds, "MatMul"), 1, "{level:?}: {kinds:?}");
    }
}

#[test]
fn the_kernel_level_is_chosen_by_environment_and_a_wrong_one_is_one_clear_error() {
    let run = |level: &str| {
        Command::new(env!("CARGO_BIN_EXE_epx"))
            .args(["run", "examples/models/mnist-cnn.onnx"])
            .current_dir(repo())
            .env_remove("EPX_PLUGIN_PATH")
            .env_remove("RUST_LOG")
            .env("EPX_CPU_KERNELS", level)
            .output()
            .expect("run epx")
    };
    for level in ["reference", "portable"] {
        let out = run(level);
        assert!(out.status.success(), "{level}: {}", text(&out.stderr));
    }
    let line = assert_one_error_line(&run("fastest"));
    assert!(
        line.contains("EPX_CPU_KERNELS=fastest is not a kernel level")
            && line.contains("avx512-vnni, avx-vnni, avx2, portable, reference"),
        "{line}"
    );
    let has_avx2 =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    let out = run("avx2");
    if has_avx2 {
        eprintln!("this CPU has AVX2 and FMA: checked that the avx2 level runs");
        assert!(out.status.success(), "{}", text(&out.stderr));
    } else {
        eprintln!("this CPU lacks AVX2 or FMA: checked that asking for it is an error");
        let line = assert_one_error_line(&out);
        assert!(line.contains("which this CPU does not have"), "{line}");
    }
}

#[test]
fn version_names_the_plugin_abi_and_doctor_names_the_host() {
    let out = epx(&["--version"]);
    assert!(out.status.success());
    let line = text(&out.stdout);
    assert_eq!(
        line.trim(),
        format!(
            "epx {} (plugin ABI {})",
            env!("CARGO_PKG_VERSION"),
            epx::plugin_abi_version()
        )
    );
    let out = epx(&["doctor"]);
    let report = text(&out.stdout);
    assert!(
        report.starts_with(&format!(
            "host: epx {}, plugin ABI {}",
            env!("CARGO_PKG_VERSION"),
            epx::plugin_abi_version()
        )),
        "{report}"
    );
}

#[test]
fn compare_names_the_outputs_that_are_off_and_the_first_node_that_diverges() {
    let dir = adversarial_plugin();
    let folder = dir.path().to_str().unwrap();
    let out = epx(&[
        "--plugin-dir",
        folder,
        "compare",
        "examples/models/mnist-cnn.onnx",
        "--input",
        "image=examples/models/mnist-cnn.input.image.npy",
        "--ep",
        "adversarial:mode=good",
        "--ep",
        "adversarial:mode=wrong_values",
    ]);
    let stdout = text(&out.stdout);
    // Exit 3: the comparison ran and found outputs off (not an error of the tool).
    assert_eq!(out.status.code(), Some(3), "{stdout}{}", text(&out.stderr));
    let (good, bad) = stdout
        .split_once("--ep adversarial:mode=wrong_values")
        .expect("a section per EP list");
    assert!(
        good.contains("--ep adversarial:mode=good: nodes on")
            && good.contains("adversarial 2")
            && good.contains("cpu 9"),
        "{good}"
    );
    assert!(
        good.lines()
            .any(|l| l.trim_start().starts_with("probabilities") && l.ends_with("ok")),
        "{good}"
    );
    assert!(
        bad.lines()
            .any(|l| l.trim_start().starts_with("probabilities") && l.ends_with("OFF")),
        "{bad}"
    );
    assert!(
        bad.contains("first divergence: node") && bad.contains("(Relu) on adversarial"),
        "{bad}"
    );
    assert!(
        stdout.trim_end().ends_with("some outputs are off"),
        "{stdout}"
    );
}

/// A plugin folder holding the `adversarial` fixture (EP `adversarial`).
fn adversarial_plugin() -> epx_tests::TempDir {
    let dir = epx_tests::TempDir::new("cli-adversarial").expect("temp dir");
    let file = epx_tests::library_file_name("epx_fixture_adversarial");
    let manifest = epx_tests::manifest("adversarial", "1.8", &["adversarial"], &file);
    dir.add_plugin(
        "adversarial",
        &epx_tests::fixture_library("adversarial"),
        Some(&manifest),
    )
    .expect("copy the adversarial fixture");
    dir
}

#[test]
fn run_isolate_turns_a_plugin_crash_into_one_error_line() {
    let dir = adversarial_plugin();
    let plugins = dir.path().display().to_string();
    let model = "examples/models/mnist-cnn.onnx";
    let run = |mode: &str, isolate: bool| {
        let ep = format!("adversarial:mode={mode}");
        let mut args = vec!["run", model, "--plugin-dir", &plugins, "--ep", &ep];
        if isolate {
            args.push("--isolate");
        }
        epx(&args)
    };
    // In process, the plugin's abort is epx's.
    let crashed = run("abort", false);
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(crashed.status.signal(), Some(6), "{crashed:?}");
    }
    // Isolated, it is one error line, and epx exits normally.
    let out = run("abort", true);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let line = assert_one_error_line(&out);
    assert!(
        line.contains("adversarial: execute failed")
            && line.contains("was killed by signal 6 (SIGABRT)"),
        "{line}"
    );
    // A good plugin gives the same answer isolated as in process (random inputs are seeded).
    let (a, b) = (run("good", false), run("good", true));
    assert!(a.status.success() && b.status.success(), "{a:?} {b:?}");
    assert_eq!(text(&a.stdout), text(&b.stdout));
    assert!(
        text(&b.stdout).contains("adversarial: 2 nodes"),
        "{}",
        text(&b.stdout)
    );
}

#[test]
fn providers_devices_lists_each_eps_devices_and_why_one_is_unusable() {
    let dir = adversarial_plugin();
    let plugins = dir.path().display().to_string();
    let out = epx(&["providers", "--devices", "--plugin-dir", &plugins]);
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    let line = |needle: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(needle))
            .unwrap_or_else(|| panic!("no line for {needle}:\n{stdout}"))
            .to_string()
    };
    let gpu = line("adversarial:0 ");
    assert!(
        gpu.contains("gpu")
            && gpu.contains("Fixture Graphics FG-1 (fake) (8.0 GiB, driver 2.5.1) — ok"),
        "{gpu}"
    );
    let npu = line("adversarial:NPU.0");
    assert!(
        npu.contains("npu")
            && npu.contains("unusable: driver 1.2.0 is older than the 2.0 this EP needs"),
        "{npu}"
    );
    assert!(line("cpu:0").contains("kernels: "), "{stdout}");
    // Without --devices, no device lines.
    let plain = text(&epx(&["providers", "--plugin-dir", &plugins]).stdout);
    assert!(!plain.contains("adversarial:0"), "{plain}");
    // `--ep NAME:DEVICE` runs there, or says why it cannot.
    let model = "examples/models/mnist-cnn.onnx";
    let on = |ep: &str| epx(&["partition", model, "--plugin-dir", &plugins, "--ep", ep]);
    let out = on("adversarial:0");
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).contains("EP adversarial runs on device adversarial:0"),
        "{}",
        text(&out.stdout)
    );
    // `--ep auto` / `--policy`: chosen from the devices, and said why.
    let auto = text(&on("auto").stdout);
    assert!(
        auto.contains("selection policy max-performance chose adversarial:0:")
            && auto.contains("adversarial:NPU.0 (npu FN-7 (fake)): unusable"),
        "{auto}"
    );
    let cpu = epx(&[
        "partition",
        model,
        "--plugin-dir",
        &plugins,
        "--policy",
        "prefer-cpu",
    ]);
    assert!(
        text(&cpu.stdout).contains("selection policy prefer-cpu chose nothing"),
        "{cpu:?}"
    );
    let bad = assert_one_error_line(&epx(&[
        "partition",
        model,
        "--plugin-dir",
        &plugins,
        "--policy",
        "fastest",
    ]));
    assert!(
        bad.contains("the policies are prefer-cpu, prefer-gpu"),
        "{bad}"
    );
    let both = assert_one_error_line(&epx(&[
        "run",
        model,
        "--plugin-dir",
        &plugins,
        "--ep",
        "auto",
        "--isolate",
    ]));
    assert!(
        both.contains("a selection policy chooses its own"),
        "{both}"
    );
    let line = assert_one_error_line(&on("adversarial:NPU.0"));
    assert!(
        line.contains("adversarial") && line.contains("present but unusable: driver 1.2.0"),
        "{line}"
    );
}

/// Pids of `epx serve-plugin` processes serving a library under `dir`.
fn serving(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let cmd = String::from_utf8_lossy(&cmd);
                    cmd.contains("serve-plugin") && cmd.contains(&needle)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[cfg(target_os = "linux")]
fn an_isolated_ep_stuck_in_a_call_does_not_outlive_epx() {
    let dir = adversarial_plugin();
    let mut child = Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(["run", "examples/models/mnist-cnn.onnx", "--plugin-dir"])
        .arg(dir.path())
        .args(["--ep", "adversarial:mode=hang", "--isolate"])
        .current_dir(repo())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start epx");
    let wait_for = |want: bool| {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(20) {
            if serving(dir.path()).is_empty() != want {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    };
    assert!(wait_for(true), "no epx serve-plugin process appeared");
    // epx is killed while its EP hangs in execute: the child must end too.
    child.kill().expect("kill epx");
    child.wait().expect("wait");
    assert!(
        wait_for(false),
        "epx serve-plugin outlived epx: {:?}",
        serving(dir.path())
    );
}

/// The cases of one run: Relu node tests (the EP claims the one-node ones), LeakyRelu (not
/// claimed), and mnist-cnn (claimed in part, compared with the CPU EP alone).
fn conformance(dir: &str, mode: &str, extra: &[&str]) -> (Option<i32>, String) {
    let nodes = repo().join(".testdata/onnx-node");
    assert!(
        nodes.join("test_relu").is_dir(),
        "{} has no node tests: run `bash tests/fetch-testdata.sh`",
        nodes.display()
    );
    let ep = format!("adversarial:mode={mode}");
    let mut args = vec![
        "--plugin-dir",
        dir,
        "conformance",
        "--ep",
        &ep,
        "--node-tests",
        nodes.to_str().unwrap(),
        "--filter",
        "test_relu,test_leakyrelu_example",
        "--model",
        "examples/models/mnist-cnn.onnx",
    ];
    args.extend_from_slice(extra);
    let out = epx(&args);
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

fn row<'a>(table: &'a str, op: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(op))
        .unwrap_or_else(|| panic!("no row for {op}:\n{table}"))
        .split_whitespace()
        .collect()
}

#[test]
fn conformance_tables_what_an_ep_claims_passes_gets_wrong_and_declines() {
    let dir = adversarial_plugin();
    let folder = dir.path().to_str().unwrap();
    let (code, out) = conformance(folder, "good", &[]);
    assert_eq!(code, Some(0), "{out}");
    // op, cases, claimed, passed, wrong, max err, crashed, declined
    assert_eq!(
        row(&out, "Relu"),
        ["Relu", "1", "1", "1", "0", "-", "0", "0"],
        "{out}"
    );
    assert_eq!(
        row(&out, "LeakyRelu"),
        ["LeakyRelu", "1", "0", "0", "0", "-", "0", "1"]
    );
    assert!(
        out.contains("LeakyRelu: not claimed by adversarial"),
        "{out}"
    );
    assert_eq!(
        row(&out, "mnist-cnn.onnx")[..5],
        ["mnist-cnn.onnx", "1", "1", "1", "0"],
        "{out}"
    );

    // The same as JSON, for CI: every case, the per-op rows and the totals.
    let (code, out) = conformance(folder, "good", &["--json"]);
    assert_eq!(code, Some(0), "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let cases = doc["cases"].as_array().expect("cases").len() as u64;
    assert_eq!(doc["totals"]["cases"].as_u64(), Some(cases), "{doc:#}");
    assert_eq!(doc["totals"]["wrong"].as_u64(), Some(0));
    assert_eq!(doc["ops"]["Relu"]["passed"].as_u64(), Some(1));
    assert_eq!(
        doc["ops"]["LeakyRelu"]["declined_reason"].as_str(),
        Some("not claimed by adversarial")
    );

    let (code, out) = conformance(folder, "wrong_values", &[]);
    assert_eq!(code, Some(3), "{out}");
    let relu = row(&out, "Relu");
    assert_eq!(relu[..5], ["Relu", "1", "1", "0", "1"], "{out}");
    assert_eq!(relu[5], "1.00e0", "{out}");
    assert!(out.contains("test_relu: output `y`: element"), "{out}");
}

#[test]
fn conformance_contains_a_crash_or_a_hang_and_goes_on() {
    let dir = adversarial_plugin();
    let folder = dir.path().to_str().unwrap();
    let (code, out) = conformance(folder, "abort", &[]);
    assert_eq!(code, Some(3), "{out}");
    assert_eq!(
        row(&out, "Relu")[..7],
        ["Relu", "1", "1", "0", "0", "-", "1"],
        "{out}"
    );
    assert!(
        out.contains("test_relu: the process died with signal 6"),
        "{out}"
    );
    // The cases after the crash still ran, in a new worker.
    assert_eq!(row(&out, "LeakyRelu")[7], "1", "{out}");
    assert_eq!(row(&out, "mnist-cnn.onnx")[6], "1", "{out}");

    let (code, out) = conformance(folder, "hang", &["--timeout", "2"]);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains("test_relu: no answer within 2 s (hung)"),
        "{out}"
    );
    assert_eq!(row(&out, "LeakyRelu")[7], "1", "{out}");
}

/// Builds the folder `epx new-plugin` wrote and runs `epx conformance` on it: the scaffold
/// passes for its ops as generated.
fn check_scaffold(folder: &Path, name: &str) {
    let model = folder.join("models/relu_add.onnx");
    let out = epx(&[
        "--plugin-dir",
        folder.to_str().unwrap(),
        "conformance",
        "--ep",
        name,
        "--node-tests",
        repo().join(".testdata/onnx-node").to_str().unwrap(),
        "--filter",
        "test_relu,test_add",
        "--model",
        model.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!(
            "{name}: 11 cases, 3 claimed, 3 passed, 0 wrong, 0 crashed"
        )),
        "{stdout}"
    );
}

#[test]
fn new_plugin_writes_a_c_plugin_that_builds_and_passes_conformance() {
    let dir = Scratch::new("new-plugin-c");
    let out = epx(&[
        "new-plugin",
        "demo_c",
        "--lang",
        "c",
        "--dir",
        dir.0.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let folder = dir.0.join("demo_c");
    let built = std::process::Command::new("cc")
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", "-I", ".",
        ])
        .args(["epx_demo_c.c", "-o", "libepx_demo_c.so"])
        .current_dir(&folder)
        .output();
    let Ok(built) = built else {
        eprintln!("skipping: `cc` was not found");
        return;
    };
    assert!(built.status.success(), "{}", text(&built.stderr));
    check_scaffold(&folder, "demo_c");
    // A second time, or a bad name, is an error that says so.
    for (name, says) in [
        ("demo_c", "exists already"),
        ("Demo-X", "is not a plugin name"),
    ] {
        let dir = dir.0.to_str().unwrap();
        let out = epx(&["new-plugin", name, "--lang", "c", "--dir", dir]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{stderr}");
    }
}

#[test]
fn new_plugin_writes_a_rust_plugin_that_builds_and_passes_conformance() {
    let dir = Scratch::new("new-plugin-rust");
    let sdk = repo().join("plugin-api");
    let out = epx(&[
        "new-plugin",
        "demo_rs",
        "--lang",
        "rust",
        "--dir",
        dir.0.to_str().unwrap(),
        "--sdk",
        sdk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let folder = dir.0.join("demo_rs");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(&folder)
        .env("CARGO_TARGET_DIR", dir.0.join("target"))
        .output()
        .expect("run cargo");
    assert!(built.status.success(), "{}", text(&built.stderr));
    std::fs::copy(
        dir.0.join("target/debug/libepx_demo_rs.so"),
        folder.join("libepx_demo_rs.so"),
    )
    .unwrap();
    check_scaffold(&folder, "demo_rs");
}

/// x: float [3] → Identity → each of `outputs` (the nodes named after them).
fn identity_model(outputs: &[&str]) -> Vec<u8> {
    use epx::onnx::proto;
    use epx_tests::models::{float_value, model_bytes, node};
    model_bytes(proto::GraphProto {
        name: Some("identities".into()),
        node: outputs
            .iter()
            .map(|o| node("Identity", &["x"], &[o]))
            .collect(),
        input: vec![float_value("x", &[3])],
        output: outputs.iter().map(|o| float_value(o, &[3])).collect(),
        ..Default::default()
    })
}

#[test]
fn outputs_whose_file_names_collide_are_all_written() {
    let dir = Scratch::new("collide");
    let model = dir.0.join("m.onnx");
    std::fs::write(&model, identity_model(&["a/b", "a_b", "a:b"])).unwrap();
    let out_dir = dir.0.join("out");
    let out = epx(&[
        "run",
        model.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let mut files: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["a_b.npy", "a_b~1.npy", "a_b~2.npy"], "{stdout}");
    assert!(
        stdout.contains("output a_b is written as a_b~1: its file name would be another output's"),
        "{stdout}"
    );
}

#[test]
fn names_with_escape_sequences_are_printed_escaped() {
    let dir = Scratch::new("escapes");
    let model = dir.0.join("m.onnx");
    std::fs::write(&model, identity_model(&["\u{1b}[2J\u{1b}[31mred\r"])).unwrap();
    for args in [
        vec!["run", model.to_str().unwrap()],
        vec!["partition", model.to_str().unwrap()],
    ] {
        let out = epx(&args);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
        assert!(
            !stdout.contains('\u{1b}') && !stdout.contains('\r'),
            "{stdout:?}"
        );
        assert!(
            stdout.contains("\\u{1b}[2J\\u{1b}[31mred\\u{d}"),
            "{stdout}"
        );
    }
}

#[test]
fn inputs_that_are_not_regular_files_are_refused_not_read_forever() {
    let out = epx(&["run", "examples/models/add.onnx", "--input", "a=/dev/zero"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("/dev/zero") && stderr.contains("not a regular file"),
        "{stderr}"
    );
}

#[test]
fn log_lines_carry_no_colour_codes_into_a_pipe() {
    let dir = Scratch::new("plain-log");
    std::fs::create_dir_all(dir.0.join("bad")).unwrap();
    std::fs::write(dir.0.join("bad/plugin.toml"), "garbage [").unwrap();
    let out = epx(&["--plugin-dir", dir.0.to_str().unwrap(), "providers"]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("WARN") && stderr.contains("plugin.toml"),
        "{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

/// `epx run` on `graph` (random inputs) with a 1 GB tensor limit: exit code and stderr.
fn run_under_a_1_gb_limit(
    dir: &Scratch,
    graph: epx::onnx::proto::GraphProto,
) -> (Option<i32>, String) {
    let model = dir.0.join("huge.onnx");
    std::fs::write(&model, epx_tests::models::model_bytes(graph)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(["run", model.to_str().unwrap()])
        .env("EPX_MAX_TENSOR_BYTES", "1000000000")
        .output()
        .expect("run epx");
    (out.status.code(), text(&out.stderr))
}

/// A graph input declared [2^33] (32 GiB of float32): `epx run`'s random input is an error
/// naming the size, not an abort in the allocator.
#[test]
fn a_huge_declared_input_is_an_error_not_an_abort() {
    use epx::onnx::proto;
    use epx_tests::models::{float_value, node};
    let dir = Scratch::new("huge");
    let (code, stderr) = run_under_a_1_gb_limit(
        &dir,
        proto::GraphProto {
            name: Some("huge".into()),
            node: vec![node("Relu", &["x"], &["y"])],
            input: vec![float_value("x", &[1 << 33])],
            output: vec![float_value("y", &[1 << 33])],
            ..Default::default()
        },
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("a float32 tensor of shape [8589934592] needs 34359738368 bytes")
            && stderr.contains("EPX_MAX_TENSOR_BYTES"),
        "{stderr}"
    );
}

/// Valid models asking the CPU EP for huge tensors (the sizes come from constants in the
/// model, `epx_tests::hostile`): each run is an error naming the size, and the process exits
/// normally, never with an allocator abort.
#[test]
fn huge_tensors_asked_for_by_a_model_are_errors_not_aborts() {
    use epx_tests::hostile::{Expect, LIMIT, TOO_BIG};
    let dir = Scratch::new("huge-ops");
    let mut failures = Vec::new();
    for case in epx_tests::hostile::cases() {
        let model = dir.0.join("hostile.onnx");
        std::fs::write(&model, &case.model).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_epx"))
            .args(["run", model.to_str().unwrap()])
            .env("EPX_MAX_TENSOR_BYTES", LIMIT.to_string())
            .output()
            .expect("run epx");
        let stderr = text(&out.stderr);
        let says = match case.expect {
            Expect::TooBig => TOO_BIG,
            Expect::Error(s) => s,
        };
        let ok = out.status.code() == Some(1)
            && stderr.starts_with("error: ")
            && stderr.lines().count() == 1
            && stderr.contains(says);
        eprintln!("{}: {:?} {}", case.name, out.status, stderr.trim_end());
        if !ok {
            failures.push(format!("{}: {:?}: {stderr}", case.name, out.status));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `epx providers` / `epx doctor` with `EPX_PROBE_TIMEOUT_S=2`.
fn listing(dir: &Path, command: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(["--plugin-dir", dir.to_str().unwrap(), command])
        .env_remove("EPX_PLUGIN_PATH")
        .env_remove("RUST_LOG")
        .env("EPX_PROBE_TIMEOUT_S", "2")
        .output()
        .expect("run epx")
}

/// Builds `libepx_<name>.so` in `dir` from C source; `None` without a C compiler.
fn c_library(dir: &Path, name: &str, source: &str) -> Option<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let lib = dir.join(format!("libepx_{name}.so"));
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&c)
        .output()
        .ok()?;
    assert!(built.status.success(), "{}", text(&built.stderr));
    std::fs::remove_file(&c).unwrap();
    Some(lib)
}

#[test]
fn libraries_that_crash_or_hang_the_loader_are_reported_and_the_listing_goes_on() {
    let dir = adversarial_plugin();
    let crashes = c_library(
        dir.path(),
        "segv",
        "__attribute__((constructor)) static void boom(void) { *(volatile int *)0 = 1; }\n",
    );
    if crashes.is_none() {
        eprintln!("skipping: `cc` was not found");
        return;
    }
    c_library(
        dir.path(),
        "hang",
        "#include <unistd.h>\n__attribute__((constructor)) static void wait(void) { for (;;) pause(); }\n",
    );
    let out = listing(dir.path(), "providers");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{stdout}"))
            .to_string()
    };
    let segv = row("segv");
    assert!(segv.contains("broken"), "{segv}");
    assert!(
        segv.contains(
            "a child process opening it was killed by signal 11 (SIGSEGV). It was not opened here"
        ),
        "{segv}"
    );
    let hang = row("hang");
    assert!(
        hang.contains("opening it did not finish within 2 s in a child process (hung"),
        "{hang}"
    );
    assert!(row("adversarial").contains(" ok "), "{stdout}");

    // doctor goes through all of them too, and fails only for the two.
    let out = listing(dir.path(), "doctor");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("✓ loads: plugin adversarial"), "{stdout}");
    assert!(stdout.contains("killed by signal 11 (SIGSEGV)"), "{stdout}");
    assert!(stdout.contains("did not finish within 2 s"), "{stdout}");
    assert!(stdout.contains("2 problem(s) found"), "{stdout}");
}

/// Byte-mutated copies of a real plugin library crash `ld.so` in many ways (SIGSEGV, SIGBUS,
/// its own assertions); the listing reports each and never dies.
#[test]
fn corrupt_copies_of_a_plugin_library_do_not_kill_the_listing() {
    let dir = epx_tests::TempDir::new("cli-corrupt").expect("temp dir");
    let original = std::fs::read(epx_tests::fixture_library("adversarial")).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let copies = 30;
    for i in 0..copies {
        let mut bytes = original.clone();
        // Headers, dynamic section and relocations live in the first 64 KiB.
        for _ in 0..8 {
            let at = (next() % 65536.min(bytes.len() as u64)) as usize;
            bytes[at] = next() as u8;
        }
        std::fs::write(dir.path().join(format!("libepx_m{i:02}.so")), &bytes).unwrap();
    }
    for command in ["providers", "doctor"] {
        let out = listing(dir.path(), command);
        let stdout = text(&out.stdout);
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{command}: {:?}\n{stdout}{}",
            out.status,
            text(&out.stderr)
        );
        for i in 0..copies {
            assert!(
                stdout.contains(&format!("libepx_m{i:02}.so")),
                "{command}: m{i:02}\n{stdout}"
            );
        }
        let died = stdout.matches("a child process opening it").count();
        eprintln!("{command}: {died} of {copies} copies killed the child process that opened them");
        assert!(died > 0, "{stdout}");
    }
}

#[test]
fn cache_list_and_clear_show_and_remove_the_kernels_sessions_stored() {
    let dir = adversarial_plugin();
    let cache = Scratch::new("kernel-cache");
    let plugins = dir.path().display().to_string();
    let epx_in = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_epx"))
            .args(args)
            .current_dir(repo())
            .env_remove("EPX_PLUGIN_PATH")
            .env_remove("EPX_KERNEL_CACHE")
            .env("EPX_CACHE_DIR", &cache.0)
            .output()
            .expect("run epx")
    };
    let partition = || {
        let out = epx_in(&[
            "partition",
            "examples/models/mnist-cnn.onnx",
            "--plugin-dir",
            &plugins,
            "--ep",
            "adversarial:cache=on",
        ]);
        assert!(out.status.success(), "{out:?}");
        text(&out.stdout)
    };
    let cold = partition();
    assert!(cold.contains("kernel cache:"), "{cold}");
    assert_eq!(cold.matches("compiled and stored").count(), 2, "{cold}");
    let list = text(&epx_in(&["cache", "list"]).stdout);
    // Two kernels, and the EP's recorded capability answer.
    assert!(list.contains("3 entries"), "{list}");
    assert_eq!(
        list.matches("  kernel     adversarial  ").count(),
        2,
        "{list}"
    );
    assert_eq!(
        list.matches("  partition  adversarial  ").count(),
        1,
        "{list}"
    );
    let warm = partition();
    assert_eq!(warm.matches(": loaded (").count(), 2, "{warm}");
    let clear = epx_in(&["cache", "clear"]);
    assert!(clear.status.success(), "{clear:?}");
    assert!(
        text(&clear.stdout).contains("removed 3 entries"),
        "{}",
        text(&clear.stdout)
    );
    let list = text(&epx_in(&["cache", "list"]).stdout);
    assert!(list.contains("0 entries"), "{list}");
}

/// A plugin library rewritten in place again and again (as `cp` over it does) while `providers`,
/// `doctor` and `run` open it: none of them dies, and each runs the old file or the new one,
/// whole and checked (the SHA-256 doctor prints of the loaded copy is one of the two), or
/// refuses the library with its reason.
#[test]
fn a_plugin_library_rewritten_in_place_while_epx_opens_it_never_kills_epx() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = adversarial_plugin();
    let file = epx_tests::library_file_name("epx_fixture_adversarial");
    let lib = dir.path().join("adversarial").join(&file);
    let old = std::fs::read(&lib).unwrap();
    // The new version: the same code and a different digest (bytes after the ELF contents).
    let mut new = old.clone();
    new.extend(std::iter::repeat_n(0x5a, 40_000));
    let digests = [epx::plugin::manifest::sha256_file(&lib).unwrap(), {
        let p = dir.path().join("new.bin");
        std::fs::write(&p, &new).unwrap();
        epx::plugin::manifest::sha256_file(&p).unwrap()
    }];
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, lib) = (stop.clone(), lib.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut rewrites = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for version in [&new, &old] {
                    // In place, piecewise, as fast as it goes: the inode stays, its bytes change.
                    let mut f = std::fs::OpenOptions::new().write(true).open(&lib).unwrap();
                    for chunk in version.chunks(64 * 1024) {
                        f.write_all(chunk).unwrap();
                    }
                    f.set_len(version.len() as u64).unwrap();
                    drop(f);
                    rewrites += 1;
                    // A pause as between two `cp` commands of a shell loop, 10 to 70 ms.
                    std::thread::sleep(std::time::Duration::from_millis(
                        10 + u64::from(rewrites % 7) * 10,
                    ));
                }
            }
            rewrites
        })
    };
    let plugins = dir.path().display().to_string();
    let (mut loaded, mut refused) = (0, 0);
    for _ in 0..30 {
        for args in [
            vec!["providers"],
            vec!["doctor"],
            vec![
                "run",
                "examples/models/mnist-cnn.onnx",
                "--ep",
                "adversarial:mode=good",
            ],
        ] {
            let mut all = vec!["--plugin-dir", plugins.as_str()];
            all.extend(args.iter().copied());
            let out = epx(&all);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert!(
                out.status.code().is_some(),
                "epx {args:?} was killed: {:?}\n{stdout}{stderr}",
                out.status
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
            for line in stdout.lines() {
                if let Some(d) = line
                    .trim()
                    .strip_prefix("✓ loaded from a sealed copy, sha256 ")
                {
                    assert!(digests.iter().any(|x| x == d), "a third version ran: {d}");
                    loaded += 1;
                }
            }
            if !out.status.success() {
                refused += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rewrites = writer.join().unwrap();
    eprintln!(
        "{rewrites} rewrites; doctor loaded a checked copy {loaded} times; {refused} commands \
         refused the library"
    );
    assert!(
        rewrites > 10 && loaded > 0,
        "{rewrites} rewrites, {loaded} loads"
    );
}

/// A 256 MiB input to two models that list their output twice (the input itself, and an
/// Identity node's output, which the CPU EP computes), under address-space limits from too small
/// to enough (`ulimit -v`): every run ends in its outputs or in one error line, never in an abort
/// ("memory allocation of N bytes failed") or another signal. Reading the input, copying it for
/// the run, the kernel's output and the copy of the output listed twice each meet the limit at
/// one of them.
#[cfg(target_os = "linux")]
#[test]
fn large_inputs_under_an_address_space_limit_end_in_an_error_never_an_abort() {
    use epx::onnx::proto;
    use epx_tests::models::{float_value, model_bytes, node};
    use std::os::unix::process::ExitStatusExt;
    const N: usize = 64 << 20;
    let dir = Scratch::new("ulimit");
    let passthrough = dir.0.join("passthrough.onnx");
    std::fs::write(
        &passthrough,
        model_bytes(proto::GraphProto {
            name: Some("twice".into()),
            input: vec![float_value("x", &[N as i64])],
            output: vec![float_value("x", &[N as i64]), float_value("x", &[N as i64])],
            ..Default::default()
        }),
    )
    .unwrap();
    let identity = dir.0.join("identity.onnx");
    std::fs::write(
        &identity,
        model_bytes(proto::GraphProto {
            name: Some("twice".into()),
            node: vec![node("Identity", &["x"], &["y"])],
            input: vec![float_value("x", &[N as i64])],
            output: vec![float_value("y", &[N as i64]), float_value("y", &[N as i64])],
            ..Default::default()
        }),
    )
    .unwrap();
    let input = dir.0.join("x.npy");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({N},), }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        f.write_all(b"\x93NUMPY\x01\x00").unwrap();
        f.write_all(&(header.len() as u16).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(N * 4) >> 20 {
            f.write_all(&zeros).unwrap();
        }
    }
    let (mut ran, mut refused, mut copies_refused) = (0, 0, 0);
    let cases = [0u64, 256, 384, 512, 640, 768, 4096]
        .into_iter()
        .flat_map(|extra| [(extra, &passthrough), (extra, &identity)]);
    for (extra_mib, model) in cases {
        let limit_kib = (256 + extra_mib) * 1024;
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "ulimit -v {limit_kib} && exec \"$0\" run \"$1\" --input x=\"$2\" --threads 1"
            ))
            .arg(env!("CARGO_BIN_EXE_epx"))
            .arg(model)
            .arg(&input)
            .env_remove("EPX_PLUGIN_PATH")
            .env("MALLOC_ARENA_MAX", "1")
            .output()
            .expect("run epx under ulimit");
        let stderr = text(&out.stderr);
        assert!(
            out.status.signal().is_none() && !stderr.contains("memory allocation of"),
            "limit {limit_kib} KiB: {:?}\n{stderr}",
            out.status
        );
        match out.status.code() {
            Some(0) => ran += 1,
            Some(1) => {
                assert_eq!(stderr.lines().count(), 1, "limit {limit_kib} KiB: {stderr}");
                refused += 1;
                copies_refused += usize::from(stderr.contains("cannot allocate"));
            }
            other => panic!("limit {limit_kib} KiB: exit {other:?}\n{stderr}"),
        }
        eprintln!(
            "{}, limit {limit_kib} KiB: {}",
            model.display(),
            stderr.lines().next().unwrap_or("ran")
        );
    }
    assert!(
        ran > 0 && refused > 0 && copies_refused > 0,
        "{ran} ran, {refused} refused ({copies_refused} at a copy)"
    );
}

/// `epx` with a timeout: `None` when it had to be killed (it blocked).
fn epx_within(args: &[&str], secs: u64) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(args)
        .current_dir(repo())
        .env_remove("EPX_PLUGIN_PATH")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run epx");
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(secs) {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A model or an input that is a FIFO, or a device that never ends, is refused at once with
/// what it is: not read until memory runs out, not waited on forever.
#[cfg(unix)]
#[test]
fn models_and_inputs_that_block_or_flood_are_refused_at_once() {
    let dir = Scratch::new("fifo");
    let fifo_model = dir.0.join("p.onnx");
    let fifo_input = dir.0.join("p.npy");
    for p in [&fifo_model, &fifo_input] {
        assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
    }
    let input = format!("a={}", fifo_input.display());
    for (args, kind) in [
        (vec!["run", fifo_model.to_str().unwrap()], "a FIFO"),
        (vec!["run", "/dev/zero"], "a device"),
        (vec!["partition", "/dev/zero"], "a device"),
        (
            vec!["run", "examples/models/add.onnx", "--input", input.as_str()],
            "a FIFO",
        ),
    ] {
        let out = epx_within(&args, 20).unwrap_or_else(|| panic!("epx {args:?} blocked"));
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains(kind) && stderr.contains("not a regular file"),
            "{args:?}: {stderr}"
        );
    }
}
