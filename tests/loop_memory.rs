//! A Loop's scan output is stacked as it grows: two million scalar iterations hold their 8 MB
//! of floats, not a tensor per iteration (which held about 240 bytes each, 480 MB here). Its own
//! test binary, so the process's peak memory is this test's alone.

use epx::onnx::proto;
use epx::{Session, Tensor};
use epx_tests::models::{model_bytes, node};

fn scalar_value(name: &str, elem_type: i32) -> proto::ValueInfoProto {
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem_type),
                    shape: Some(proto::TensorShapeProto { dim: vec![] }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Loop(M): each iteration outputs its counter as a float; the scan output is [0, 1, ..., M-1].
fn counting_loop() -> Vec<u8> {
    let (float, int64, boolean) = (1, 7, 9);
    let mut cast = node("Cast", &["i"], &["f"]);
    cast.attribute.push(proto::AttributeProto {
        name: Some("to".into()),
        i: Some(i64::from(float)),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        ..Default::default()
    });
    let body = proto::GraphProto {
        name: Some("body".into()),
        node: vec![cast, node("Identity", &["c"], &["c_out"])],
        input: vec![scalar_value("i", int64), scalar_value("c", boolean)],
        output: vec![scalar_value("c_out", boolean), scalar_value("f", float)],
        ..Default::default()
    };
    let mut lp = node("Loop", &["m", ""], &["scan"]);
    lp.attribute.push(proto::AttributeProto {
        name: Some("body".into()),
        g: Some(body),
        r#type: Some(proto::attribute_proto::AttributeType::Graph as i32),
        ..Default::default()
    });
    let mut out = epx_tests::models::float_value("scan", &[]);
    if let Some(proto::type_proto::Value::TensorType(t)) =
        out.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        t.shape = None;
    }
    model_bytes(proto::GraphProto {
        name: Some("loop".into()),
        node: vec![lp],
        input: vec![scalar_value("m", int64)],
        output: vec![out],
        ..Default::default()
    })
}

/// The process's peak resident memory in KiB.
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

#[test]
fn a_long_loop_holds_its_scan_output_not_a_tensor_per_iteration() {
    let session = Session::builder()
        .and_then(|b| b.commit_from_memory(&counting_loop()))
        .expect("session");
    let before = peak_kib();
    let m = 2_000_000usize;
    let out = session
        .run([(
            "m",
            Tensor::from_bytes(epx::ElementType::Int64, &[], &(m as i64).to_le_bytes()).expect("m"),
        )])
        .expect("run");
    let after = peak_kib();
    let scan = out
        .into_iter()
        .next()
        .expect("one output")
        .1
        .into_host()
        .expect("a host tensor");
    assert_eq!(scan.shape(), [m]);
    let values = epx_tests::examples::f32s(scan.bytes().expect("bytes"));
    assert!(values.iter().enumerate().all(|(i, &v)| v == i as f32));
    let grew = after.saturating_sub(before);
    eprintln!(
        "{m} iterations: peak RSS grew by {grew} KiB for an {} KiB result",
        m * 4 / 1024
    );
    // The result and one copy of it, plus slack; a tensor per iteration is 60 times that.
    assert!(grew < 48 * 1024, "peak RSS grew by {grew} KiB");
}
