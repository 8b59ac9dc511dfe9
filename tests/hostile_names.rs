//! Names a model chose (nodes, values, op types) and names a program passed reach error messages
//! escaped: no control character (an escape sequence that recolours a terminal, a backspace
//! that hides text, a newline that forges a log line) survives into any error, from the library,
//! the C API or the CLI.

use std::process::Command;

use epx::onnx::proto;
use epx::{Session, Tensor};
use epx_tests::models::{float_value, model_bytes, node};
use epx_tests::repo_root;

const HOSTILE: &str = "bad\u{1b}[31mRED\u{8}\u{8}\nforged line\r\u{9b}2J";

fn assert_escaped(what: &str, message: &str) {
    assert!(
        !message.chars().any(char::is_control),
        "{what}: a control character survived in {message:?}"
    );
    assert!(
        message.contains("\\u{1b}[31mRED"),
        "{what}: the name is not shown: {message:?}"
    );
}

fn session_error(model: Vec<u8>) -> String {
    match Session::builder().unwrap().commit_from_memory(&model) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_node_no_ep_supports_is_named_escaped() {
    let mut n = node("Relu", &["x"], &["y"]);
    n.op_type = Some(format!("Op{HOSTILE}"));
    n.domain = Some("com.example".into());
    n.name = Some(format!("node{HOSTILE}"));
    let model = model_bytes(proto::GraphProto {
        name: Some("g".into()),
        node: vec![n],
        input: vec![float_value("x", &[1])],
        output: vec![float_value("y", &[1])],
        ..Default::default()
    });
    assert_escaped("unsupported node", &session_error(model));
}

#[test]
fn a_graph_output_nothing_produces_is_named_escaped() {
    let out = format!("y{HOSTILE}");
    let model = model_bytes(proto::GraphProto {
        name: Some("g".into()),
        node: vec![node("Relu", &["x"], &["y"])],
        input: vec![float_value("x", &[1])],
        output: vec![float_value(&out, &[1])],
        ..Default::default()
    });
    assert_escaped("graph output", &session_error(model));
}

#[test]
fn an_input_name_a_program_passes_is_escaped_in_the_run_error() {
    let model = model_bytes(proto::GraphProto {
        name: Some("g".into()),
        node: vec![node("Relu", &["x"], &["y"])],
        input: vec![float_value("x", &[1])],
        output: vec![float_value("y", &[1])],
        ..Default::default()
    });
    let s = Session::builder()
        .unwrap()
        .commit_from_memory(&model)
        .unwrap();
    let x = Tensor::from_array(ndarray::arr1(&[1.0f32]));
    let e = s.run([(format!("x{HOSTILE}").as_str(), x)]).unwrap_err();
    assert_escaped("unknown input", &e.to_string());
}

#[test]
fn the_cli_prints_errors_escaped() {
    let dir = epx_tests::TempDir::new("hostile-names").unwrap();
    let model = dir.path().join("m.onnx");
    let out = format!("y{HOSTILE}");
    std::fs::write(
        &model,
        model_bytes(proto::GraphProto {
            name: Some("g".into()),
            node: vec![node("Relu", &["x"], &["y"])],
            input: vec![float_value("x", &[1])],
            output: vec![float_value(&out, &[1])],
            ..Default::default()
        }),
    )
    .unwrap();
    let run = Command::new(epx_tests::artifact_dir().join("epx"))
        .arg("run")
        .arg(&model)
        .current_dir(repo_root())
        .env_remove("EPX_PLUGIN_PATH")
        .output()
        .expect("run epx");
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    let line = stderr.trim_end_matches('\n');
    assert_eq!(line.lines().count(), 1, "{stderr:?}");
    assert_escaped("epx run", line);
}
