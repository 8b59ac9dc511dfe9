use super::*;
use crate::model::onnx::testing::{model, node, vi};
use proto::{GraphProto, ModelProto, TensorProto};

fn load(m: &ModelProto) -> Result<Model> {
    load_model_bytes(&m.encode_to_vec(), "test.onnx", None)
}

#[test]
fn nodes_come_out_in_topological_order() {
    // File order is reversed on purpose.
    let m = model(
        vec![node("Relu", &["t"], &["y"]), node("Neg", &["x"], &["t"])],
        &["x"],
        &["y"],
    );
    let g = load(&m).unwrap().graph;
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(ops, ["Neg", "Relu"]);
    let t = g.value_id("t").unwrap();
    assert_eq!(g.values[t].producer, Some(0));
    assert_eq!(g.values[t].consumers, vec![1]);
    assert_eq!(g.inputs, vec![g.value_id("x").unwrap()]);
}

#[test]
fn cycle_is_an_error_naming_the_nodes() {
    let m = model(
        vec![
            node("Add", &["x", "b"], &["a"]),
            node("Relu", &["a"], &["b"]),
        ],
        &["x"],
        &["a"],
    );
    let err = load(&m).unwrap_err().to_string();
    assert!(
        err.starts_with("test.onnx: invalid graph: the graph has a cycle"),
        "{err}"
    );
    assert!(err.contains("Add_a") && err.contains("Relu_b"), "{err}");
}

#[test]
fn dangling_input_is_an_error() {
    let m = model(vec![node("Relu", &["nowhere"], &["y"])], &["x"], &["y"]);
    let err = load(&m).unwrap_err().to_string();
    assert!(err.contains("reads `nowhere`"), "{err}");
    assert!(err.contains("dangling input"), "{err}");
}

#[test]
fn truncated_and_foreign_files_are_errors() {
    let bytes = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]).encode_to_vec();
    let err = load_model_bytes(&bytes[..bytes.len() - 3], "cut.onnx", None).unwrap_err();
    assert!(matches!(err, Error::Model { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("cut.onnx: not a valid ONNX model"),
        "{err}"
    );

    let err = load_model_bytes(b"#!/bin/sh\necho hello\n", "script.sh", None).unwrap_err();
    assert!(err.to_string().starts_with("script.sh: "), "{err}");
    assert!(err.to_string().contains("ONNX"), "{err}");

    let err = load_model_bytes(&[], "empty.onnx", None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "empty.onnx: the file is empty, not an ONNX model"
    );
}

#[test]
fn unsupported_ir_version_names_the_range() {
    let mut m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    m.ir_version = Some(99);
    let err = load(&m).unwrap_err().to_string();
    assert_eq!(
        err,
        "test.onnx: unsupported ONNX IR version 99; this build reads IR versions 3 to 14"
    );
}

/// IR version 14 (ONNX 1.23) loads; a FLOAT6 tensor in it is refused by name, not misread.
#[test]
fn ir_version_14_loads() {
    let mut m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    m.ir_version = Some(14);
    assert!(load(&m).is_ok());
}

/// Output types the schema fixes are inferred in any domain the table holds, and those an
/// attribute decides from the attribute: what a partition boundary then declares.
#[test]
fn element_types_come_from_schemas_and_attributes() {
    let mut m = model(
        vec![
            node("DynamicQuantizeLinear", &["x"], &["q", "s", "z"]),
            node("MatMulInteger", &["q", "q"], &["i"]),
            node("Relu", &["s"], &["y"]),
        ],
        &["x"],
        &["y"],
    );
    let g = load(&m).unwrap().graph;
    let ty = |n: &str| g.values[g.value_id(n).unwrap()].elem_type();
    assert_eq!(ty("q"), Some(ElementType::Uint8));
    assert_eq!(ty("s"), Some(ElementType::Float));
    assert_eq!(ty("i"), Some(ElementType::Int32));
    // LabelEncoder (ai.onnx.ml): its values attribute decides.
    let mut enc = node("LabelEncoder", &["x"], &["e"]);
    let cast = node("Relu", &["x"], &["y"]);
    enc.domain = Some("ai.onnx.ml".into());
    enc.attribute
        .push(crate::model::onnx::proto::AttributeProto {
            name: Some("keys_floats".into()),
            r#type: Some(6),
            floats: vec![1.0],
            ..Default::default()
        });
    enc.attribute
        .push(crate::model::onnx::proto::AttributeProto {
            name: Some("values_int64s".into()),
            r#type: Some(7),
            ints: vec![3],
            ..Default::default()
        });
    m = model(vec![enc, cast], &["x"], &["y"]);
    m.opset_import
        .push(crate::model::onnx::proto::OperatorSetIdProto {
            domain: Some("ai.onnx.ml".into()),
            version: Some(2),
        });
    let g = load(&m).unwrap().graph;
    assert_eq!(
        g.values[g.value_id("e").unwrap()].elem_type(),
        Some(ElementType::Int64)
    );
}

#[test]
fn initializers_from_raw_typed_and_external_data() {
    let dir = std::env::temp_dir().join(format!("epx-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut file = vec![0u8; 16];
    file.extend_from_slice(&data);
    std::fs::write(dir.join("weights.bin"), &file).unwrap();

    let kv = |k: &str, v: &str| proto::StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    };
    let mut m = model(
        vec![
            node("Add", &["x", "w"], &["s"]),
            node("Add", &["s", "v"], &["y"]),
        ],
        &["x"],
        &["y"],
    );
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(TensorProto {
        name: Some("w".into()),
        data_type: Some(1),
        dims: vec![4],
        data_location: Some(proto::tensor_proto::DataLocation::External as i32),
        external_data: vec![
            kv("location", "weights.bin"),
            kv("offset", "16"),
            kv("length", "16"),
        ],
        ..Default::default()
    });
    g.initializer.push(TensorProto {
        name: Some("v".into()),
        data_type: Some(7),
        dims: vec![2],
        int64_data: vec![5, -6],
        ..Default::default()
    });
    let path = dir.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let model = load_model_file(&path).unwrap();
    let w = model.graph.values[model.graph.value_id("w").unwrap()]
        .initializer
        .clone()
        .unwrap();
    assert_eq!(w.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    let v = model.graph.values[model.graph.value_id("v").unwrap()]
        .initializer
        .clone()
        .unwrap();
    assert_eq!(v.as_slice::<i64>().unwrap(), &[5, -6]);

    // Loaded from bytes, there is no folder to read the external file from.
    let err = load_model_bytes(&m.encode_to_vec(), "mem", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("external file `weights.bin`"), "{err}");

    // A location escaping the folder is refused.
    let g = m.graph.as_mut().unwrap();
    g.initializer[0].external_data[0] = kv("location", "../etc/passwd");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let err = load_model_file(&path).unwrap_err().to_string();
    assert!(err.contains("must stay inside the model's folder"), "{err}");

    // Symbolic links out of the folder, directly or through a linked subfolder, are refused;
    // so is anything that is not a regular file (a FIFO would block the read forever).
    #[cfg(unix)]
    {
        let outside = std::env::temp_dir().join(format!("epx-ext-out-{}", std::process::id()));
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.bin"), &file).unwrap();
        std::os::unix::fs::symlink(outside.join("secret.bin"), dir.join("link.bin")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("sub")).unwrap();
        // A link that stays inside the folder is fine.
        std::os::unix::fs::symlink(dir.join("weights.bin"), dir.join("inside.bin")).unwrap();
        let fifo = dir.join("fifo.bin");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        for (location, want) in [
            ("link.bin", Some("outside the model's folder")),
            ("sub/secret.bin", Some("outside the model's folder")),
            ("inside.bin", None),
            ("fifo.bin", Some("not a regular file")),
        ] {
            if location == "fifo.bin" && !made.as_ref().is_ok_and(|s| s.success()) {
                eprintln!("skipping the FIFO case: mkfifo is not available");
                continue;
            }
            let g = m.graph.as_mut().unwrap();
            g.initializer[0].external_data[0] = kv("location", location);
            std::fs::write(&path, m.encode_to_vec()).unwrap();
            match (load_model_file(&path), want) {
                (Ok(_), None) => {}
                (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{location}: {e}"),
                (Ok(_), Some(w)) => panic!("{location}: loaded, expected `{w}`"),
                (Err(e), None) => panic!("{location}: {e}"),
            }
        }
        std::fs::remove_dir_all(&outside).ok();
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn nested_graphs_may_read_outer_values() {
    let then_branch = GraphProto {
        name: Some("then".into()),
        node: vec![node("Identity", &["x"], &["t_out"])],
        output: vec![vi("t_out")],
        ..Default::default()
    };
    let else_branch = GraphProto {
        name: Some("else".into()),
        node: vec![node("Neg", &["x"], &["e_out"])],
        output: vec![vi("e_out")],
        ..Default::default()
    };
    let mut if_node = node("If", &["cond"], &["y"]);
    for (name, g) in [("then_branch", then_branch), ("else_branch", else_branch)] {
        if_node.attribute.push(proto::AttributeProto {
            name: Some(name.into()),
            r#type: Some(proto::attribute_proto::AttributeType::Graph as i32),
            g: Some(g),
            ..Default::default()
        });
    }
    let m = model(vec![if_node], &["cond", "x"], &["y"]);
    let g = load(&m).unwrap().graph;
    let AttributeValue::Graph(body) = g.nodes[0].attribute("then_branch").unwrap() else {
        panic!()
    };
    assert_eq!(body.outer_refs, vec!["x".to_string()]);
}

fn int_attr(name: &str, v: i64) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

fn schema_error(m: &ModelProto) -> String {
    match load(m) {
        Err(e @ Error::InvalidGraph { .. }) => e.to_string(),
        other => panic!("expected an invalid-graph error, got {other:?}"),
    }
}

#[test]
fn an_attribute_the_op_does_not_define_is_an_error() {
    let mut gemm = node("Gemm", &["a", "b"], &["y"]);
    gemm.attribute.push(int_attr("transb", 1));
    let err = schema_error(&model(vec![gemm], &["a", "b"], &["y"]));
    assert!(
        err.contains("node `Gemm_y` (Gemm): Gemm (opset 13) has no attribute `transb` (did you mean `transB`?)"),
        "{err}"
    );
    let mut softmax = node("Softmax", &["x"], &["y"]);
    softmax.attribute.push(proto::AttributeProto {
        name: Some("axes".into()),
        r#type: Some(proto::attribute_proto::AttributeType::Ints as i32),
        ints: vec![1],
        ..Default::default()
    });
    let err = schema_error(&model(vec![softmax], &["x"], &["y"]));
    assert!(
        err.contains("Softmax (opset 13) has no attribute `axes`; its attributes are: axis"),
        "{err}"
    );
}

#[test]
fn an_attribute_of_the_wrong_kind_or_a_missing_required_one_is_an_error() {
    let mut gemm = node("Gemm", &["a", "b"], &["y"]);
    gemm.attribute.push(proto::AttributeProto {
        name: Some("alpha".into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(2),
        ..Default::default()
    });
    let err = schema_error(&model(vec![gemm], &["a", "b"], &["y"]));
    assert!(
        err.contains("attribute `alpha` of Gemm must be a float, but the model gives an int"),
        "{err}"
    );
    let err = schema_error(&model(vec![node("Cast", &["x"], &["y"])], &["x"], &["y"]));
    assert!(
        err.contains("Cast (opset 13) needs the attribute `to` (an int)"),
        "{err}"
    );
}

#[test]
fn input_and_output_counts_are_held_to_the_schema() {
    let err = schema_error(&model(
        vec![node("Relu", &["x", "x"], &["y"])],
        &["x"],
        &["y"],
    ));
    assert!(
        err.contains("node `Relu_y` (Relu) has 2 inputs; Relu (opset 14) takes 1"),
        "{err}"
    );
    let err = schema_error(&model(
        vec![node("Dropout", &["x"], &["y", "m", "z"])],
        &["x"],
        &["y"],
    ));
    assert!(
        err.contains("has 3 outputs; Dropout (opset 13) gives 1 to 2"),
        "{err}"
    );
}

#[test]
fn an_opset_older_than_the_op_is_an_error() {
    let mut m = model(vec![node("Gelu", &["x"], &["y"])], &["x"], &["y"]);
    let err = schema_error(&m);
    assert!(
        err.contains("ai.onnx has no Gelu before opset 20, and the model imports ai.onnx opset 17"),
        "{err}"
    );
    m.opset_import[0].version = Some(20);
    load(&m).expect("Gelu at opset 20");
    // An op the table does not know is left to the EPs.
    load(&model(
        vec![node("NoSuchOp", &["x"], &["y"])],
        &["x"],
        &["y"],
    ))
    .expect("unknown op");
}

/// An ONNX opset newer than the build knows is refused, naming the newest it knows, as ONNX
/// Runtime refuses opsets newer than its ONNX release; the newest known one loads. Domains the
/// build does not hold whole (ONNX Runtime's, custom ones) are left to the EPs.
#[test]
fn an_opset_newer_than_the_build_knows_is_refused() {
    let newest = crate::model::onnx::schema::newest_opset("").expect("ai.onnx is known");
    assert!(
        newest >= 23,
        "the table holds ONNX 1.22's opsets, got {newest}"
    );
    let mut m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    m.opset_import[0].version = Some(newest);
    load(&m).expect("the newest known opset");
    m.opset_import[0].version = Some(99);
    let err = load(&m).expect_err("opset 99").to_string();
    assert!(
        err.contains(&format!(
            "the model imports ai.onnx opset 99, newer than this build knows (ai.onnx up to \
             opset {newest})"
        )),
        "{err}"
    );
    let ml = crate::model::onnx::schema::newest_opset("ai.onnx.ml").expect("ai.onnx.ml");
    let mut m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    m.opset_import.push(proto::OperatorSetIdProto {
        domain: Some("ai.onnx.ml".into()),
        version: Some(ml + 1),
    });
    let err = load(&m).expect_err("a newer ai.onnx.ml").to_string();
    assert!(
        err.contains(&format!("ai.onnx.ml opset {}", ml + 1)),
        "{err}"
    );
    let mut m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
    m.opset_import.push(proto::OperatorSetIdProto {
        domain: Some("com.microsoft".into()),
        version: Some(7),
    });
    load(&m).expect("a domain the build does not hold whole");
}

#[test]
fn descriptive_fields_and_overridable_initializers_are_kept() {
    let mut m = model(vec![node("Add", &["x", "b"], &["y"])], &["x", "b"], &["y"]);
    m.producer_version = Some("2.1".into());
    m.domain = Some("ai.example".into());
    m.doc_string = Some("a model".into());
    m.metadata_props = ["one", "two", "one"]
        .iter()
        .zip(["1", "2", "3"])
        .map(|(k, v)| proto::StringStringEntryProto {
            key: Some(k.to_string()),
            value: Some(v.into()),
        })
        .collect();
    let g = m.graph.as_mut().unwrap();
    g.doc_string = Some("the graph".into());
    g.initializer.push(TensorProto {
        name: Some("b".into()),
        data_type: Some(1),
        dims: vec![1],
        float_data: vec![1.0],
        ..Default::default()
    });
    let loaded = load(&m).unwrap();
    let meta = &loaded.metadata;
    assert_eq!(meta.producer_version, "2.1");
    assert_eq!(meta.domain, "ai.example");
    assert_eq!(meta.model_version, None);
    assert_eq!(
        (meta.description.as_str(), meta.graph_description.as_str()),
        ("a model", "the graph")
    );
    // A later duplicate key wins, as in ONNX Runtime's metadata map.
    let custom: Vec<_> = meta
        .custom
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(custom, [("one", "3"), ("two", "2")]);
    // `b` is both an input and an initializer: a constant here, listed as overridable.
    assert_eq!(meta.overridable_initializers, ["b"]);
    assert_eq!(
        loaded.graph.inputs,
        vec![loaded.graph.value_id("x").unwrap()]
    );
}

/// A value read by many nodes (and a node reading one value twice) lists each consumer once,
/// and loading grows about linearly with the readers: `16 n` take under 100 times as long as
/// `n` (a scan of the consumers per read, as before, grows by about 256).
#[test]
fn a_value_read_by_many_nodes_loads_in_linear_time() {
    let wide = |n: usize| {
        let names: Vec<String> = (0..n).map(|i| format!("y{i}")).collect();
        let nodes = names
            .iter()
            .map(|y| node("Add", &["x", "x"], &[y]))
            .collect();
        let outs: Vec<&str> = names.iter().map(String::as_str).collect();
        model(nodes, &["x"], &outs)
    };
    let g = load(&wide(3)).unwrap().graph;
    assert_eq!(g.values[g.value_id("x").unwrap()].consumers, vec![0, 1, 2]);
    let time = |n: usize| {
        let bytes = wide(n).encode_to_vec();
        (0..3)
            .map(|_| {
                let t = std::time::Instant::now();
                load_model_bytes(&bytes, "test.onnx", None).unwrap();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (small, large) = (time(1000), time(16_000));
    let growth = large / small.max(1e-6);
    eprintln!("1000 readers {small:.4} s, 16000 readers {large:.4} s: x{growth:.0}");
    assert!(growth < 100.0, "16x the readers took {growth:.0}x as long");
}
