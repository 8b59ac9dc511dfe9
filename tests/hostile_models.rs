//! Valid (or nearly valid) models that ask for far more memory than any machine has, or that
//! lie about their data: each must be an error naming the size or the lie, whatever runs it
//! (`epx run`, the C API, a fuzz run), never an abort in the allocator.
//!
//! Every model takes one float32 input `x` of shape [1] and has one output `y`.

use epx::onnx::proto;

use crate::models::{float_value, int_attr, ints_attr, node};

/// What a run of a hostile model must end in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// An error saying the size is over the tensor limit ([`LIMIT`] in the tests).
    TooBig,
    /// An error whose message contains this text.
    Error(&'static str),
}

/// The tensor limit the tests run hostile models under (`EPX_MAX_TENSOR_BYTES`).
pub const LIMIT: u64 = 1_000_000_000;

/// The text every "over the limit" error has, with [`LIMIT`].
pub const TOO_BIG: &str = "more than the 1000000000";

pub struct Case {
    pub name: &'static str,
    pub model: Vec<u8>,
    pub expect: Expect,
}

fn ints(name: &str, v: &[i64]) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        data_type: Some(7),
        dims: vec![v.len() as i64],
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn floats(name: &str, v: &[f32]) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        data_type: Some(1),
        dims: vec![v.len() as i64],
        float_data: v.to_vec(),
        ..Default::default()
    }
}

fn scalar_f(name: &str, v: f32) -> proto::TensorProto {
    proto::TensorProto {
        dims: vec![],
        ..floats(name, &[v])
    }
}

fn scalar_i(name: &str, v: i64) -> proto::TensorProto {
    proto::TensorProto {
        dims: vec![],
        ..ints(name, &[v])
    }
}

fn with(mut n: proto::NodeProto, attrs: Vec<proto::AttributeProto>) -> proto::NodeProto {
    n.attribute.extend(attrs);
    n
}

/// `x` reshaped to [1, 1, 1, 1] as `x4`.
fn to_4d() -> (proto::NodeProto, proto::TensorProto) {
    (
        node("Reshape", &["x", "s4"], &["x4"]),
        ints("s4", &[1, 1, 1, 1]),
    )
}

fn model(opset: i64, nodes: Vec<proto::NodeProto>, inits: Vec<proto::TensorProto>) -> Vec<u8> {
    use prost::Message;
    proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        producer_name: Some("epx-tests".into()),
        graph: Some(proto::GraphProto {
            name: Some("hostile".into()),
            node: nodes,
            input: vec![float_value("x", &[1])],
            output: vec![float_value("y", &[-1])],
            initializer: inits,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Every case, in a fixed order.
pub fn cases() -> Vec<Case> {
    let big = 1i64 << 40;
    let max_pad = (1i64 << 31) - 1;
    let (reshape, s4) = to_4d();
    let w = proto::TensorProto {
        dims: vec![1, 1, 1, 1],
        ..floats("w", &[1.0])
    };
    let too_big = |name, opset, nodes, inits| Case {
        name,
        model: model(opset, nodes, inits),
        expect: Expect::TooBig,
    };
    vec![
        too_big(
            "ConstantOfShape [2^40]",
            17,
            vec![
                node("ConstantOfShape", &["s"], &["c"]),
                node("Add", &["x", "c"], &["y"]),
            ],
            vec![ints("s", &[big])],
        ),
        too_big(
            "Expand [2^20, 2^20]",
            17,
            vec![node("Expand", &["x", "s"], &["y"])],
            vec![ints("s", &[1 << 20, 1 << 20])],
        ),
        Case {
            name: "Expand [2^62, 4] (the element count overflows)",
            model: model(
                17,
                vec![node("Expand", &["x", "s"], &["y"])],
                vec![ints("s", &[1 << 62, 4])],
            ),
            expect: Expect::Error("has too many elements"),
        },
        too_big(
            "Tile x 2^40",
            17,
            vec![node("Tile", &["x", "r"], &["y"])],
            vec![ints("r", &[big])],
        ),
        too_big(
            "Pad 2^40",
            17,
            vec![node("Pad", &["x", "p"], &["y"])],
            vec![ints("p", &[0, big])],
        ),
        too_big(
            "Resize x 1e12",
            17,
            vec![node("Resize", &["x", "", "sc"], &["y"])],
            vec![floats("sc", &[1e12])],
        ),
        too_big(
            "Resize to sizes [2^40]",
            17,
            vec![node("Resize", &["x", "", "", "sz"], &["y"])],
            vec![ints("sz", &[big])],
        ),
        too_big(
            "OneHot depth 2^40",
            17,
            vec![
                with(node("Cast", &["x"], &["i"]), vec![int_attr("to", 7)]),
                node("OneHot", &["i", "d", "v"], &["h"]),
                node("ReduceSum", &["h"], &["y"]),
            ],
            vec![ints("d", &[big]), floats("v", &[0.0, 1.0])],
        ),
        too_big(
            "Conv pads 2^31-1",
            17,
            vec![
                reshape.clone(),
                with(
                    node("Conv", &["x4", "w"], &["y"]),
                    vec![ints_attr("pads", &[max_pad; 4])],
                ),
            ],
            vec![s4.clone(), w.clone()],
        ),
        too_big(
            "AveragePool pads 2^31-1",
            17,
            vec![
                reshape.clone(),
                with(
                    node("AveragePool", &["x4"], &["y"]),
                    vec![
                        ints_attr("kernel_shape", &[1, 1]),
                        ints_attr("pads", &[max_pad; 4]),
                    ],
                ),
            ],
            vec![s4.clone()],
        ),
        too_big(
            "ConvTranspose output_shape [2^31, 2^31]",
            17,
            vec![
                reshape.clone(),
                with(
                    node("ConvTranspose", &["x4", "w"], &["y"]),
                    vec![ints_attr("output_shape", &[1 << 31, 1 << 31])],
                ),
            ],
            vec![s4.clone(), w],
        ),
        too_big(
            "MaxUnpool output_shape [1, 1, 2^20, 2^20]",
            17,
            vec![
                reshape.clone(),
                with(node("Cast", &["x4"], &["i4"]), vec![int_attr("to", 7)]),
                with(
                    node("MaxUnpool", &["x4", "i4", "os"], &["y"]),
                    vec![ints_attr("kernel_shape", &[1, 1])],
                ),
            ],
            vec![s4.clone(), ints("os", &[1, 1, 1 << 20, 1 << 20])],
        ),
        too_big(
            "Range 0 to 1e15",
            17,
            vec![
                node("Range", &["a", "b", "d"], &["r"]),
                node("Add", &["x", "r"], &["y"]),
            ],
            vec![scalar_f("a", 0.0), scalar_f("b", 1e15), scalar_f("d", 1.0)],
        ),
        too_big(
            "HannWindow size 2^40",
            17,
            vec![
                node("HannWindow", &["n"], &["r"]),
                node("Add", &["x", "r"], &["y"]),
            ],
            vec![scalar_i("n", big)],
        ),
        too_big(
            "DFT length 2^40",
            17,
            vec![
                node("Reshape", &["x", "s3"], &["x3"]),
                node("DFT", &["x3", "n"], &["y"]),
            ],
            vec![ints("s3", &[1, 1, 1]), scalar_i("n", big)],
        ),
        too_big(
            "CenterCropPad to [2^40]",
            18,
            vec![node("CenterCropPad", &["x", "s"], &["y"])],
            vec![ints("s", &[big])],
        ),
        too_big(
            "Conv with 65536 output channels and pads 2^15",
            17,
            vec![
                node("Reshape", &["x", "s3"], &["x3"]),
                with(
                    node("Conv", &["x3", "w1"], &["y"]),
                    vec![ints_attr("pads", &[0, 1 << 15])],
                ),
            ],
            vec![
                ints("s3", &[1, 1, 1]),
                proto::TensorProto {
                    dims: vec![65536, 1, 1],
                    ..floats("w1", &vec![1.0; 65536])
                },
            ],
        ),
        too_big(
            "MaxPool of 65536 channels padded by 128",
            17,
            vec![
                node("Expand", &["x", "s"], &["x4"]),
                with(
                    node("MaxPool", &["x4"], &["y"]),
                    vec![
                        ints_attr("kernel_shape", &[1, 1]),
                        ints_attr("pads", &[0, 0, 128, 128]),
                    ],
                ),
            ],
            vec![ints("s", &[1, 65536, 1, 1])],
        ),
        too_big(
            "Add of [2^20, 1] and [1, 2^20]",
            17,
            vec![
                node("Expand", &["x", "sa"], &["a"]),
                node("Expand", &["x", "sb"], &["b"]),
                node("Add", &["a", "b"], &["y"]),
            ],
            vec![ints("sa", &[1 << 20, 1]), ints("sb", &[1, 1 << 20])],
        ),
        too_big(
            "MatMul of [2^20, 0] and [0, 2^20]",
            17,
            vec![
                node("ConstantOfShape", &["sa"], &["a"]),
                node("ConstantOfShape", &["sb"], &["b"]),
                node("MatMul", &["a", "b"], &["m"]),
                node("Add", &["x", "m"], &["y"]),
            ],
            vec![ints("sa", &[1 << 20, 0]), ints("sb", &[0, 1 << 20])],
        ),
        Case {
            name: "an empty tensor [2^40, 0]",
            model: model(
                17,
                vec![
                    node("ConstantOfShape", &["s"], &["z"]),
                    with(
                        node("ReduceSum", &["z", "ax"], &["r"]),
                        vec![int_attr("keepdims", 1)],
                    ),
                    node("Add", &["x", "r"], &["y"]),
                ],
                vec![ints("s", &[big, 0]), ints("ax", &[1])],
            ),
            expect: Expect::Error("empty shape [1099511627776, 0]"),
        },
        Case {
            name: "Split into num_outputs 2^40",
            model: model(
                18,
                vec![with(
                    node("Split", &["x"], &["y"]),
                    vec![int_attr("num_outputs", big)],
                )],
                vec![],
            ),
            expect: Expect::Error("num_outputs is 1099511627776"),
        },
        too_big(
            "STFT of 2^20 samples in frames of 2^19, step 1",
            17,
            vec![
                node("Expand", &["x", "s"], &["sig"]),
                node("STFT", &["sig", "step", "", "len"], &["y"]),
            ],
            vec![
                ints("s", &[1, 1 << 20, 1]),
                scalar_i("step", 1),
                scalar_i("len", 1 << 19),
            ],
        ),
        too_big(
            "MelWeightMatrix of 2^40 bins",
            17,
            vec![
                node("MelWeightMatrix", &["m", "n", "r", "lo", "hi"], &["w"]),
                node("Add", &["x", "w"], &["y"]),
            ],
            vec![
                scalar_i("m", big),
                scalar_i("n", 16),
                scalar_i("r", 16000),
                scalar_f("lo", 0.0),
                scalar_f("hi", 8000.0),
            ],
        ),
        Case {
            name: "ConstantOfShape [-5]",
            model: model(
                17,
                vec![
                    node("ConstantOfShape", &["s"], &["c"]),
                    node("Add", &["x", "c"], &["y"]),
                ],
                vec![ints("s", &[-5])],
            ),
            expect: Expect::Error("-5"),
        },
        Case {
            name: "an initializer declaring [2^40] that holds 4 bytes",
            model: model(
                17,
                vec![node("Add", &["x", "c"], &["y"])],
                vec![proto::TensorProto {
                    dims: vec![big],
                    ..floats("c", &[1.0])
                }],
            ),
            expect: Expect::Error("c"),
        },
    ]
}
