//! Models as ONNX Runtime saves them after its own graph optimizations (`tests/models/`, made by
//! `tests/models/make_models.py`): they carry its `com.microsoft` operators (FusedConv,
//! FusedGemm, FusedMatMul, Gelu, BiasGelu) and its opset-1 LayerNormalization. The CPU EP must
//! run every node of each and give ONNX Runtime's outputs.

use epx::{ElementType, Session};
use epx_tests::examples::{f32s, reference_npy_in, run, tensor};
use epx_tests::repo_root;
use std::path::Path;

const MODELS: [(&str, f32); 15] = [
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
];

#[test]
fn onnx_runtime_optimized_models_run_on_the_cpu_ep() {
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

/// Dynamically quantized models requantize every float result, so a last-bit difference in a
/// float op can move a quantized value by a whole step: a PP-OCR recognizer quantized by
/// `quantize_dynamic` ended up 0.06 away from ONNX Runtime through its pooling and Sigmoid
/// roundings alone. The CPU EP sums pools and evaluates the logistic function as ONNX
/// Runtime's NCHW kernels do; these models pin it, bit for bit.
#[test]
fn float_ops_under_requantization_round_as_onnx_runtime_does() {
    let dir = repo_root().join("tests/models");
    for model in ["ort-rounding", "dynamic-int8-ocr-block"] {
        check_against_onnx_runtime(&dir, model, |_| 0.0);
    }
}

/// The scikit-learn pipelines of `tests/models/sklearn/` (made by `make_sklearn.py`): every
/// node on the CPU EP, labels equal to ONNX Runtime's, scores within 1e-5 (relative) of them.
#[test]
fn scikit_learn_models_run_on_the_cpu_ep() {
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

/// Runs `dir/model.onnx` with every node on the CPU EP on its saved input and compares each
/// output with ONNX Runtime's: floats within `tolerance(expected value)`, others exactly.
fn check_against_onnx_runtime(dir: &Path, model: &str, tolerance: impl Fn(f32) -> f32) {
    let session = Session::builder()
        .expect("builder")
        .with_strict_placement(true)
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
