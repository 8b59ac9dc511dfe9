//! The CPU EP's intra-op threads: a graph with every kernel that splits its work across the pool
//! (3×3, strided, 1×1 and depthwise Conv with fused chains, ConvTranspose, BatchNormalization,
//! nearest Resize, Concat, a single Add, Softmax, LayerNormalization, MatMul) gives the same
//! outputs on 1, 2 and 3 threads, and the thread option is checked like any other.

use epx::onnx::proto;
use epx::{Environment, ExecutionProvider, Session, Tensor};
use epx_tests::models::{
    float_init, float_value, int_attr, ints_attr, model_bytes, node, seeded_floats,
};

fn floats(seed: u32, n: usize) -> Vec<f32> {
    seeded_floats(seed, n, 1.0)
}

fn with(mut n: proto::NodeProto, attrs: Vec<proto::AttributeProto>) -> proto::NodeProto {
    n.attribute = attrs;
    n
}

const C: i64 = 8;
// Large enough that each kernel splits: an input of more than 64Ki elements goes to the pool
// from the first run, and every convolution has more than 2^20 multiply-adds.
const S: i64 = 128;

fn model() -> Vec<u8> {
    let nodes = vec![
        // 3×3, padded, with a fused hard-sigmoid-like chain: [1, 16, S, S].
        with(
            node("Conv", &["x", "w1", "b16"], &["c1"]),
            vec![ints_attr("pads", &[1, 1, 1, 1])],
        ),
        node("Add", &["c1", "three"], &["c1a"]),
        node("Clip", &["c1a", "zero", "six"], &["c1b"]),
        node("Mul", &["c1b", "c1"], &["c1c"]),
        // Depthwise with Relu: [1, 16, S, S].
        with(
            node("Conv", &["c1c", "wd", "b16"], &["d"]),
            vec![ints_attr("pads", &[1, 1, 1, 1]), int_attr("group", 16)],
        ),
        node("Relu", &["d"], &["dr"]),
        // 1×1: [1, 16, S, S].
        node("Conv", &["dr", "wp", "b16"], &["p"]),
        // Strided 3×3: [1, 32, S/2, S/2].
        with(
            node("Conv", &["p", "ws", "b32"], &["s"]),
            vec![
                ints_attr("pads", &[1, 1, 1, 1]),
                ints_attr("strides", &[2, 2]),
            ],
        ),
        // ConvTranspose back up: [1, 16, S, S], then BatchNormalization.
        with(
            node("ConvTranspose", &["s", "wt", "b16"], &["u"]),
            vec![ints_attr("strides", &[2, 2])],
        ),
        node(
            "BatchNormalization",
            &["u", "bn_s", "bn_b", "bn_m", "bn_v"],
            &["bn"],
        ),
        // Nearest ×2 of the strided output: [1, 32, S, S].
        node("Resize", &["s", "", "scales"], &["r"]),
        // [1, 64, S, S]
        with(
            node("Concat", &["bn", "p", "r"], &["cat"]),
            vec![int_attr("axis", 1)],
        ),
        node("Add", &["cat", "cat"], &["twice"]),
        with(
            node("Softmax", &["twice"], &["sm"]),
            vec![int_attr("axis", -1)],
        ),
        with(
            node("LayerNormalization", &["twice", "ln_s", "ln_b"], &["ln"]),
            vec![int_attr("axis", -1)],
        ),
        node("MatMul", &["ln", "wm"], &["mm"]),
    ];
    let s = S;
    model_bytes(proto::GraphProto {
        name: Some("threads".into()),
        node: nodes,
        input: vec![float_value("x", &[1, C, s, s])],
        output: vec![
            float_value("sm", &[1, 64, s, s]),
            float_value("mm", &[1, 64, s, 24]),
        ],
        initializer: vec![
            float_init("w1", &[16, C, 3, 3], floats(1, 16 * C as usize * 9)),
            float_init("b16", &[16], floats(2, 16)),
            float_init("b32", &[32], floats(3, 32)),
            float_init("three", &[], vec![3.0]),
            float_init("zero", &[], vec![0.0]),
            float_init("six", &[], vec![6.0]),
            float_init("wd", &[16, 1, 3, 3], floats(4, 16 * 9)),
            float_init("wp", &[16, 16, 1, 1], floats(5, 16 * 16)),
            float_init("ws", &[32, 16, 3, 3], floats(6, 32 * 16 * 9)),
            float_init("wt", &[32, 16, 2, 2], floats(7, 32 * 16 * 4)),
            float_init("bn_s", &[16], floats(8, 16)),
            float_init("bn_b", &[16], floats(9, 16)),
            float_init("bn_m", &[16], floats(10, 16)),
            float_init(
                "bn_v",
                &[16],
                floats(11, 16).iter().map(|v| v.abs() + 0.5).collect(),
            ),
            float_init("scales", &[4], vec![1.0, 1.0, 2.0, 2.0]),
            float_init("ln_s", &[s], floats(12, s as usize)),
            float_init("ln_b", &[s], floats(13, s as usize)),
            float_init("wm", &[s, 24], floats(14, s as usize * 24)),
        ],
        ..Default::default()
    })
}

fn run(threads: usize) -> Vec<(String, Vec<f32>)> {
    let env = Environment::builder().commit().unwrap();
    let session = Session::builder()
        .unwrap()
        .with_environment(env)
        .with_intra_op_threads(threads)
        .commit_from_memory(&model())
        .unwrap();
    let n = (C * S * S) as usize;
    let x = Tensor::from_array(
        ndarray::Array4::from_shape_vec((1, C as usize, S as usize, S as usize), floats(99, n))
            .unwrap(),
    );
    // Twice: the second run reuses the buffers the first one recycled.
    session.run([("x", x.try_clone().unwrap())]).unwrap();
    let out = session.run([("x", x)]).unwrap();
    ["sm", "mm"]
        .iter()
        .map(|k| (k.to_string(), out[*k].as_slice::<f32>().unwrap().to_vec()))
        .collect()
}

#[test]
fn split_kernels_give_what_one_thread_gives() {
    let one = run(1);
    for threads in [2, 3] {
        let many = run(threads);
        for ((name, a), (_, b)) in one.iter().zip(&many) {
            assert_eq!(a.len(), b.len());
            assert!(a.iter().any(|v| *v != 0.0), "{name}: all zeros");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-5 + 1e-5 * x.abs(),
                    "{name}[{i}] on {threads} threads: {y}, on one: {x}"
                );
            }
        }
    }
}

#[test]
fn the_thread_option_is_checked() {
    let env = Environment::builder().commit().unwrap();
    let make = |value: &str| {
        Session::builder()
            .unwrap()
            .with_environment(env.clone())
            .with_execution_providers([ExecutionProvider::new("cpu")
                .with_option("intra_op_num_threads", value)
                .error_on_failure()])
            .unwrap()
            .commit_from_memory(&model())
    };
    let err = make("lots")
        .err()
        .expect("a non-number is refused")
        .to_string();
    assert!(
        err.contains("intra_op_num_threads") && err.contains("`lots`"),
        "{err}"
    );
    let err = make("100000")
        .err()
        .expect("too many is refused")
        .to_string();
    assert!(err.contains("more than 1024"), "{err}");
    // 0 means one per core, as in ONNX Runtime.
    assert!(make("0").is_ok());
}
