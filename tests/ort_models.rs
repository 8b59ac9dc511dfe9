//! Models as ONNX Runtime saves them after its own graph optimizations (`tests/models/`, made by
//! `tests/models/make_models.py`): they carry its `com.microsoft` operators (FusedConv,
//! FusedGemm, FusedMatMul, Gelu, BiasGelu) and its opset-1 LayerNormalization. The CPU EP must
//! run every node of each and give ONNX Runtime's outputs.

use epx::{ElementType, Session};
use epx_tests::examples::{f32s, reference_npy_in, run, tensor};
use epx_tests::repo_root;

const MODELS: [(&str, f32); 4] = [
    ("ort-opt-mnist-cnn", 1e-5),
    ("ort-opt-mlp-int", 0.0),
    ("ort-opt-encoder", 1e-4),
    ("ort-transformers-encoder", 1e-4),
];

#[test]
fn onnx_runtime_optimized_models_run_on_the_cpu_ep() {
    let dir = repo_root().join("tests/models");
    for (model, tolerance) in MODELS {
        let session = Session::builder()
            .expect("builder")
            .with_strict_placement(true)
            .commit_from_file(dir.join(format!("{model}.onnx")))
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let loaded = epx::onnx::load_model_file(&dir.join(format!("{model}.onnx"))).expect("load");
        let ms_nodes = loaded
            .graph
            .nodes
            .iter()
            .filter(|n| n.domain == "com.microsoft")
            .count();
        assert!(ms_nodes > 0, "{model}: no com.microsoft node to test");
        assert!(
            session.node_placement().iter().all(|p| *p == "cpu"),
            "{model}: {:?}",
            session.node_placement()
        );
        let inputs: Vec<_> = reference_npy_in(&dir, model, "input")
            .iter()
            .map(|(n, a)| (n.clone(), tensor(a)))
            .collect();
        let got = run(&session, &inputs);
        for (name, want) in reference_npy_in(&dir, model, "output") {
            let (_, t) = got
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{model}: no output {name}"));
            assert_eq!(t.elem_type(), want.elem_type, "{model}/{name}");
            assert_eq!(t.shape(), want.shape.as_slice(), "{model}/{name}");
            if want.elem_type == ElementType::Float {
                let (a, b) = (f32s(t.bytes().expect("host tensor")), f32s(&want.data));
                let worst = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                eprintln!("{model}/{name}: largest difference from ONNX Runtime {worst:e}");
                assert!(
                    worst <= tolerance,
                    "{model}/{name}: differs from ONNX Runtime by {worst} (allowed {tolerance})"
                );
            } else {
                assert_eq!(
                    t.bytes().expect("host tensor"),
                    want.data.as_slice(),
                    "{model}/{name}"
                );
            }
        }
    }
}
