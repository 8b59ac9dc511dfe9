//! The CPU EP's fusion: a Conv followed by an elementwise chain (hardswish, a per-channel scale,
//! a bias over the last axis) runs as one step, and a chain with a broadcast the block walk does
//! not cover falls back to the node-by-node kernels. Both must give what the ops define,
//! computed here independently.

use epx::onnx::proto;
use epx::{Environment, Session, Tensor};
use epx_tests::models::{float_init, float_value, ints_attr, model_bytes, node, seeded_floats};

const C: usize = 4;
const H: usize = 5;
const W: usize = 6;

fn floats(seed: u32, n: usize) -> Vec<f32> {
    seeded_floats(seed, n, 4.0)
}

/// `y = hardswish(conv(x)) * s[c] + r[w]` and `z = relu(conv(x) + m[c, w])`, where `m`
/// broadcasts over the height axis only.
fn model() -> Vec<u8> {
    let mut conv = node("Conv", &["x", "w", "b"], &["c"]);
    conv.attribute = vec![ints_attr("pads", &[1, 1, 1, 1])];
    let mut conv2 = conv.clone();
    conv2.name = Some("Conv_c2".into());
    conv2.output = vec!["c2".into()];
    model_bytes(proto::GraphProto {
        name: Some("fusion".into()),
        node: vec![
            conv,
            node("Add", &["c", "three"], &["t0"]),
            node("Clip", &["t0", "zero", "six"], &["t1"]),
            node("Mul", &["c", "t1"], &["t2"]),
            node("Div", &["t2", "six"], &["t3"]),
            node("Mul", &["t3", "s"], &["t4"]),
            node("Add", &["t4", "r"], &["y"]),
            conv2,
            node("Add", &["c2", "m"], &["t5"]),
            node("Relu", &["t5"], &["z"]),
        ],
        input: vec![float_value("x", &[1, C as i64, H as i64, W as i64])],
        output: vec![
            float_value("y", &[1, C as i64, H as i64, W as i64]),
            float_value("z", &[1, C as i64, H as i64, W as i64]),
        ],
        initializer: vec![
            float_init("w", &[C as i64, C as i64, 3, 3], floats(1, C * C * 9)),
            float_init("b", &[C as i64], floats(2, C)),
            float_init("three", &[], vec![3.0]),
            float_init("zero", &[], vec![0.0]),
            float_init("six", &[], vec![6.0]),
            float_init("s", &[1, C as i64, 1, 1], floats(3, C)),
            float_init("r", &[W as i64], floats(4, W)),
            float_init("m", &[C as i64, 1, W as i64], floats(5, C * W)),
        ],
        ..Default::default()
    })
}

/// The 3×3 convolution with padding 1, in f64.
fn conv_ref(x: &[f32]) -> Vec<f64> {
    let (w, b) = (floats(1, C * C * 9), floats(2, C));
    let mut out = vec![0f64; C * H * W];
    for m in 0..C {
        for oy in 0..H {
            for ox in 0..W {
                let mut acc = f64::from(b[m]);
                for c in 0..C {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy + ky, ox + kx);
                            if iy < 1 || ix < 1 || iy > H || ix > W {
                                continue;
                            }
                            acc += f64::from(w[((m * C + c) * 3 + ky) * 3 + kx])
                                * f64::from(x[(c * H + iy - 1) * W + ix - 1]);
                        }
                    }
                }
                out[(m * H + oy) * W + ox] = acc;
            }
        }
    }
    out
}

#[test]
fn fused_conv_chains_compute_what_the_ops_define() {
    let env = Environment::builder().commit().unwrap();
    let session = Session::builder()
        .unwrap()
        .with_environment(env)
        .commit_from_memory(&model())
        .unwrap();
    let xs = floats(6, C * H * W);
    let x = Tensor::from_array(ndarray::Array4::from_shape_vec((1, C, H, W), xs.clone()).unwrap());
    let out = session.run([("x", x)]).unwrap();
    let (y, z) = (
        out["y"].as_slice::<f32>().unwrap(),
        out["z"].as_slice::<f32>().unwrap(),
    );
    let conv = conv_ref(&xs);
    let (s, r, m) = (floats(3, C), floats(4, W), floats(5, C * W));
    for ch in 0..C {
        for i in 0..H * W {
            let p = ch * H * W + i;
            let c = conv[p];
            let hardswish = c * (c + 3.0).clamp(0.0, 6.0) / 6.0;
            let want_y = hardswish * f64::from(s[ch]) + f64::from(r[i % W]);
            let want_z = (c + f64::from(m[ch * W + i % W])).max(0.0);
            for (name, got, want) in [("y", y[p], want_y), ("z", z[p], want_z)] {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 + 1e-5 * want.abs(),
                    "{name}[{p}]: got {got}, want {want}"
                );
            }
        }
    }
}

/// The hot loops exist twice, for AVX2+FMA and for the baseline x86-64; both must compute what
/// the ops define. The test above runs the copy this CPU selects; this one runs it again in a
/// child process with `EPX_CPU_SIMD=baseline`, and says which copies were checked. (The `gemm`
/// crate's own AVX-512 / AVX2 choice cannot be forced from here: it follows the CPU.)
#[test]
fn the_baseline_copies_compute_the_same() {
    if std::env::var_os("EPX_CPU_SIMD").is_some() {
        return; // the child itself
    }
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args([
            "fused_conv_chains_compute_what_the_ops_define",
            "--exact",
            "--nocapture",
        ])
        .env("EPX_CPU_SIMD", "baseline")
        .output()
        .expect("run the test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
    #[cfg(target_arch = "x86_64")]
    let wide =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    if wide {
        eprintln!(
            "checked: the AVX2+FMA copies (this CPU has them) and the baseline copies (forced)"
        );
    } else {
        eprintln!("checked: the baseline copies only (this CPU has no AVX2+FMA)");
    }
}
