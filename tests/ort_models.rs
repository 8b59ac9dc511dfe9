//! Models as ONNX Runtime saves them after its own graph optimizations (`tests/models/`, made by
//! `tests/models/make_models.py`): they carry its `com.microsoft` operators (FusedConv,
//! FusedGemm, FusedMatMul, Gelu, BiasGelu) and its opset-1 LayerNormalization. The CPU EP must
//! run every node of each and give ONNX Runtime's outputs.
//!
//! The committed outputs are ONNX Runtime's exact integer sums (its answer on a CPU with VNNI).
//! On a CPU without, ONNX Runtime sums u8 × s8 products in saturated pairs and the CPU EP does
//! too; these tests ask for exact sums (`EPX_CPU_INTEGER_SUMS=exact`) so the committed answers
//! hold on any CPU. The pairs rule is tested against ONNX Runtime live by the parity corpus
//! (`tests/parity/quantized.py`) and in `epx_cpu`'s unit tests.

use epx::{ElementType, ExecutionProvider, Session, Value};
use epx_io::valuefile;
use epx_tests::examples::{f32s, reference_npy_in, run, tensor};
use epx_tests::repo_root;
use std::path::Path;

const MODELS: [(&str, f32); 16] = [
    ("ort-opt-mnist-cnn", 1e-5),
    ("ort-opt-mlp-int", 0.0),
    ("ort-opt-encoder", 1e-4),
    ("ort-transformers-encoder", 1e-4),
    // Quantized end to end: every intermediate is an integer, equal to ONNX Runtime's.
    ("ort-qoperator-cnn", 0.0),
    ("ort-opt-dynamic-mlp", 1e-6),
    ("ort-matmul-nbits-asym", 1e-5),
    ("ort-matmul-nbits-sym", 1e-5),
    ("ort-contrib-transformer", 2e-5),
    ("ort-gqa-prompt", 1e-5),
    ("ort-gqa-prompt-rotary", 1e-5),
    ("ort-gqa-decode-rotary", 1e-5),
    ("ort-gqa-window", 1e-5),
    ("ort-mha-past", 1e-5),
    ("ort-mha-past-causal", 1e-5),
    // X and the hidden state quantized to uint8 as ONNX Runtime does, the cell in its float32
    // operations: bit for bit.
    ("ort-dynamic-quantize-lstm", 0.0),
];

#[test]
fn onnx_runtime_optimized_models_run_on_the_cpu_ep() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    for (model, tolerance) in MODELS {
        let loaded = epx::onnx::load_model_file(&dir.join(format!("{model}.onnx"))).expect("load");
        let ms_nodes = loaded
            .graph
            .nodes
            .iter()
            .filter(|n| n.domain == "com.microsoft")
            .count();
        assert!(ms_nodes > 0, "{model}: no com.microsoft node to test");
        check_against_onnx_runtime(&dir, model, |_| tolerance);
    }
}

/// A float16 model (`tests/models/make_float16.py`) whose values pass float16's range between
/// its first and last node: ONNX Runtime computes in float32 between the model's edges and
/// answers with finite values, and so does the CPU EP, which holds float16 values as float32
/// inside a kernel. Rounded to float16 after every node, 10 of its 144 outputs would be 1.0.
/// `float16-gather`: a table only a Gather reads stays float16 in the CPU EP (its rows are
/// widened as they are gathered), one that an Add reads too is widened whole; both answer as
/// ONNX Runtime does.
#[test]
fn float16_models_compute_in_float32_between_their_edges() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    check_against_onnx_runtime(&dir, "float16-overflow", |_| 1e-3);
    check_against_onnx_runtime(&dir, "float16-gather", |y| 1e-3 * y.abs().max(1.0));
}

/// Dynamically quantized models requantize every float result, so a last-bit difference in a
/// float op can move a quantized value by a whole step: a PP-OCR recognizer quantized by
/// `quantize_dynamic` ended up 0.06 away from ONNX Runtime through its pooling and Sigmoid
/// roundings alone. The CPU EP sums pools and evaluates the logistic function as ONNX
/// Runtime's NCHW kernels do; these models pin it, bit for bit.
#[test]
fn float_ops_under_requantization_round_as_onnx_runtime_does() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    for model in ["ort-rounding", "dynamic-int8-ocr-block"] {
        check_against_onnx_runtime(&dir, model, |_| 0.0);
    }
}

/// Models in the QDQ format (`quantize_static`). With fast kernels the CPU EP folds their
/// DequantizeLinear / op / QuantizeLinear groups as ONNX Runtime does: into QLinearConv,
/// QLinearMatMul, QLinearAdd and QLinearMul (`ort-qdq-cnn`, per-channel int8 weights), and
/// MaxPool, nearest Resize, a Div by a constant and GlobalAveragePool onto the bytes
/// (`ort-qdq-movers`); the CLI
/// tests check the folding in the step profile. The reference kernels run the nodes as
/// written. On these models both give ONNX Runtime's output bit for bit.
#[test]
fn qdq_models_give_onnx_runtimes_output() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    let level = std::env::var("EPX_CPU_KERNELS").unwrap_or_else(|_| "the best".into());
    eprintln!("checked on {level} kernel level");
    check_against_onnx_runtime(&dir, "ort-qdq-cnn", |_| 0.0);
    check_against_onnx_runtime(&dir, "ort-qdq-movers", |_| 0.0);
}

/// An If whose branches rearrange an initializer of the enclosing graph (Slice, Concat,
/// Transpose) before a MatMul: folded once when the session is made (`host/cli/tests/cli.rs`
/// counts the steps), with ONNX Runtime's answer.
#[test]
fn nested_bodies_on_enclosing_constants_give_onnx_runtimes_output() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    check_against_onnx_runtime(&dir, "ort-nested-constants", |_| 1e-5);
}

/// Conv then BatchNormalization (`ort-conv-bn`): folded into the Conv's weights on the fast
/// levels where the Conv's output has no other reader (`host/cli/tests/cli.rs` counts the
/// steps), run as written on the reference level; ONNX Runtime's answer either way.
#[test]
fn conv_batch_norm_gives_onnx_runtimes_output() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    check_against_onnx_runtime(&dir, "ort-conv-bn", |y| 1e-5 * y.abs().max(1.0));
}

/// A CNN written channels-last (`ort-channels-last-cnn`): its Transposes moved and cancelled,
/// its NHWC arithmetic folded into the Conv's weights on the fast levels
/// (`host/cli/tests/cli.rs` counts the steps); ONNX Runtime's answer, the NHWC output included.
#[test]
fn channels_last_cnn_gives_onnx_runtimes_output() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    check_against_onnx_runtime(&dir, "ort-channels-last-cnn", |y| 1e-5 * y.abs().max(1.0));
}

/// The scikit-learn pipelines of `tests/models/sklearn/` (made by `make_sklearn.py`): every
/// node on the CPU EP, labels equal to ONNX Runtime's, scores within 1e-5 (relative) of them.
#[test]
fn scikit_learn_models_run_on_the_cpu_ep() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models/sklearn");
    let mut models: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/models/sklearn")
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".onnx").map(str::to_string)
        })
        .collect();
    models.sort();
    assert!(models.len() >= 20, "{models:?}");
    let failed: Vec<String> = models
        .iter()
        .filter_map(|model| {
            std::panic::catch_unwind(|| {
                check_against_onnx_runtime(&dir, model, |want| 1e-5 * want.abs().max(1.0))
            })
            .err()
            .map(|_| model.clone())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "models that differ from ONNX Runtime: {failed:?}"
    );
    eprintln!("{} scikit-learn models match ONNX Runtime", models.len());
}

/// Each compile pass of the CPU EP that can be turned off (`disable_passes`, for bisecting a
/// wrong answer) leaves the answer ONNX Runtime's on models where it has work to do: QDQ
/// folding, Conv/BatchNormalization folding, Transposes moved and cancelled, NHWC arithmetic
/// folded into convolutions, constants folded into nested bodies, float16 tables, fused chains.
/// A name that is no pass is refused with the list.
#[test]
fn every_compile_pass_that_can_be_turned_off_keeps_the_answer() {
    exact_integer_sums();
    let dir = repo_root().join("tests/models");
    let passes = [
        "plan_qdq",
        "fold_batch_norm",
        "elide_casts",
        "elide_identities",
        "fold_constants",
        "push_transposes",
        "fold_conv_affine",
        "prepare_kernels",
        "fuse_matmul_add",
        "fuse_chains",
        "hoist_shape_reads",
        "plan_frees",
        "move_reshapes",
    ];
    // The tolerance of each output element, from the reference value.
    type Tolerance = fn(f32) -> f32;
    let models: [(&str, Tolerance); 6] = [
        ("ort-qdq-cnn", |_| 0.0),
        // Without folding, the normalization scales the convolutions' rounding: at the worst
        // element, against the answer computed in float64, ONNX Runtime is off by 7.0e-6 and
        // epx by 6.7e-6, in opposite directions; the two differ by their sum.
        ("ort-conv-bn", |y| 2e-5 * y.abs().max(1.0)),
        ("ort-channels-last-cnn", |y| 1e-5 * y.abs().max(1.0)),
        ("ort-nested-constants", |_| 1e-5),
        ("float16-gather", |y| 1e-3 * y.abs().max(1.0)),
        ("ort-opt-mnist-cnn", |_| 1e-5),
    ];
    for pass in passes {
        for (model, tolerance) in models {
            eprintln!("{model} without {pass}");
            check_with(&dir, model, Some(pass), tolerance);
        }
    }
    let err = Session::builder()
        .unwrap()
        .with_execution_providers([ExecutionProvider::new("cpu")
            .with_option("disable_passes", "fold_constant")
            .error_on_failure()])
        .unwrap()
        .commit_from_file(dir.join("ort-conv-bn.onnx"))
        .err()
        .expect("an unknown pass is refused")
        .to_string();
    assert!(
        err.contains("no compile pass `fold_constant`") && err.contains("fold_constants"),
        "{err}"
    );
}

/// Runs `dir/model.onnx` with every node on the CPU EP on its saved input and compares each
/// output with ONNX Runtime's: floats within `tolerance(expected value)`, others exactly.
/// Exact integer sums for this process, before any session reads the setting (see the top).
fn exact_integer_sums() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        // SAFETY: every test of this file calls this before it creates a session, and nothing
        // else here reads or writes the environment.
        unsafe { std::env::set_var("EPX_CPU_INTEGER_SUMS", "exact") };
    });
}

fn check_against_onnx_runtime(dir: &Path, model: &str, tolerance: impl Fn(f32) -> f32) {
    check_with(dir, model, None, tolerance)
}

/// [`check_against_onnx_runtime`], with the CPU EP's compile passes `disable` turned off.
fn check_with(dir: &Path, model: &str, disable: Option<&str>, tolerance: impl Fn(f32) -> f32) {
    exact_integer_sums();
    eprintln!(
        "{model}: CPU EP kernels: {}",
        epx_cpu::fast::process_isa().name
    );
    let mut cpu = ExecutionProvider::new("cpu").error_on_failure();
    if let Some(passes) = disable {
        cpu = cpu.with_option("disable_passes", passes);
    }
    let session = Session::builder()
        .expect("builder")
        .with_strict_placement(true)
        .with_execution_providers([cpu])
        .expect("the CPU EP")
        .commit_from_file(dir.join(format!("{model}.onnx")))
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    assert!(
        session.node_placement().iter().all(|p| *p == "cpu"),
        "{model}: {:?}",
        session.node_placement()
    );
    let inputs: Vec<_> = reference_npy_in(dir, model, "input")
        .iter()
        .map(|(n, a)| (n.clone(), tensor(a)))
        .collect();
    let got = run(&session, &inputs);
    for (name, want) in reference_npy_in(dir, model, "output") {
        let (_, t) = got
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{model}: no output {name}"));
        assert_eq!(t.elem_type(), want.elem_type, "{model}/{name}");
        assert_eq!(t.shape(), want.shape.as_slice(), "{model}/{name}");
        if want.elem_type == ElementType::Float {
            let (a, b) = (f32s(t.bytes().expect("host tensor")), f32s(&want.data));
            let mut worst = 0.0f32;
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                let d = (x - y).abs();
                assert!(
                    d <= tolerance(*y),
                    "{model}/{name}[{i}]: {x} vs ONNX Runtime's {y}"
                );
                worst = worst.max(d);
            }
            eprintln!("{model}/{name}: largest difference from ONNX Runtime {worst:e}");
        } else {
            assert_eq!(
                t.bytes().expect("host tensor"),
                want.data.as_slice(),
                "{model}/{name}"
            );
        }
    }
}

/// The value file of `name` in `dir`, as `epx run --output-dir` names it.
fn value_file(dir: &Path, name: &str) -> std::path::PathBuf {
    valuefile::find(&dir.join(valuefile::safe_file_name(name)))
        .unwrap_or_else(|| panic!("no value file for `{name}` in {}", dir.display()))
}

/// Floats within `1e-5` (relative above 1), everything else exactly; sequences item by item,
/// maps key by key in order.
fn assert_same_value(what: &str, have: &Value, want: &Value) {
    match (have, want) {
        (Value::Host(h), Value::Host(w)) => {
            assert_eq!(h.elem_type(), w.elem_type(), "{what}: element type");
            assert_eq!(h.shape(), w.shape(), "{what}: shape");
            match (h.as_slice::<f32>(), w.as_slice::<f32>()) {
                (Some(a), Some(b)) => {
                    for (i, (x, y)) in a.iter().zip(b).enumerate() {
                        assert!(
                            (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                            "{what}[{i}]: {x} vs ONNX Runtime's {y}"
                        );
                    }
                }
                _ => assert_eq!(h, w, "{what}"),
            }
        }
        (Value::Sequence(h), Value::Sequence(w)) => {
            assert_eq!(h.len(), w.len(), "{what}: sequence length");
            for (i, (a, b)) in h.items().iter().zip(w.items()).enumerate() {
                assert_same_value(&format!("{what}[{i}]"), a, b);
            }
        }
        (Value::Map(h), Value::Map(w)) => {
            assert_eq!(h.keys(), w.keys(), "{what}: map keys");
            assert_same_value(
                &format!("{what} values"),
                &Value::Host(h.values().try_clone().unwrap()),
                &Value::Host(w.values().try_clone().unwrap()),
            );
        }
        _ => panic!(
            "{what}: {} vs ONNX Runtime's {}",
            have.type_name(),
            want.type_name()
        ),
    }
}

/// scikit-learn pipelines with string columns, a text pipeline (StringNormalizer, Tokenizer,
/// TfIdfVectorizer), a map input (DictVectorizer) and the default ZipMap output (a sequence of
/// maps), with int64 and string class labels: `tests/models/sklearn-values/<model>/`, values in
/// the form `epx run` reads (`epx_io::valuefile`).
#[test]
fn scikit_learn_models_with_strings_sequences_and_maps_match_onnx_runtime() {
    exact_integer_sums();
    let root = repo_root().join("tests/models/sklearn-values");
    let mut models: Vec<_> = std::fs::read_dir(&root)
        .expect("tests/models/sklearn-values")
        .map(|e| e.expect("entry").path())
        .collect();
    models.sort();
    assert!(models.len() >= 5, "{models:?}");
    for dir in &models {
        let model = dir.file_name().unwrap().to_string_lossy().into_owned();
        let session = Session::builder()
            .expect("builder")
            .with_strict_placement(true)
            .commit_from_file(dir.join("model.onnx"))
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let feeds: Vec<(String, Value)> = session
            .inputs()
            .iter()
            .map(|spec| {
                let path = value_file(&dir.join("input"), &spec.name);
                let v = valuefile::read_value(&path, &spec.ty)
                    .unwrap_or_else(|e| panic!("{model}: {e}"));
                (spec.name.clone(), v)
            })
            .collect();
        let got = session
            .run(feeds)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        for spec in session.outputs() {
            let path = value_file(&dir.join("output"), &spec.name);
            let want =
                valuefile::read_value(&path, &spec.ty).unwrap_or_else(|e| panic!("{model}: {e}"));
            let have = got.value(&spec.name).expect("output");
            assert_same_value(&format!("{model}/{}", spec.name), have, &want);
        }
        eprintln!("{model}: every output matches ONNX Runtime's ({})", {
            let kinds: Vec<String> = got
                .values()
                .map(|(n, v)| format!("{n}: {}", v.type_name()))
                .collect();
            kinds.join(", ")
        });
    }
}
