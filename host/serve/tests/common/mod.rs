//! What the tests of `epx serve` share: a repository of small models and a server on free
//! ports over it.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use epx::Environment;
use epx::onnx::proto;
use epx_serve::ServeOptions;
use epx_tests::models::{counting_loop, model_bytes, node};

/// A value of ONNX element type `elem` with extents `dims` (-1: a dynamic one, named after its
/// position: `d0`, `d1`, ...).
pub fn value(name: &str, elem: i32, dims: &[i64]) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{Dimension, dimension};
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem),
                    shape: Some(proto::TensorShapeProto {
                        dim: dims
                            .iter()
                            .enumerate()
                            .map(|(i, &d)| Dimension {
                                value: Some(if d < 0 {
                                    dimension::Value::DimParam(format!("d{i}"))
                                } else {
                                    dimension::Value::DimValue(d)
                                }),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// INT32 `[n, 2]`, BYTES `[n]`, BOOL `[2]` (negated) and FP16 `[2]` passed through.
pub fn mixed_model() -> Vec<u8> {
    let (int32, string, boolean, half) = (6, 8, 9, 10);
    model_bytes(proto::GraphProto {
        name: Some("mixed".into()),
        node: vec![
            node("Identity", &["i"], &["i_out"]),
            node("Identity", &["s"], &["s_out"]),
            node("Not", &["b"], &["b_out"]),
            node("Identity", &["h"], &["h_out"]),
        ],
        input: vec![
            value("i", int32, &[-1, 2]),
            value("s", string, &[-1]),
            value("b", boolean, &[2]),
            value("h", half, &[2]),
        ],
        output: vec![
            value("i_out", int32, &[-1, 2]),
            value("s_out", string, &[-1]),
            value("b_out", boolean, &[2]),
            value("h_out", half, &[2]),
        ],
        ..Default::default()
    })
}

pub fn put(root: &Path, model: &str, bytes: &[u8], config: Option<&str>) {
    let dir = root.join(model).join("1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.onnx"), bytes).unwrap();
    if let Some(c) = config {
        std::fs::write(root.join(model).join("config.toml"), c).unwrap();
    }
}

/// A server on a free port over a repository of: `add` (FP32 `[1, 4]` + `[1, 4]`), `mixed`,
/// `loop` (one instance, no queue), `broken` (not ONNX) and `badconfig` (an unknown key).
pub struct Running {
    pub addr: SocketAddr,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    _dir: TempDir,
}

pub struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn start() -> Running {
    start_with(|o| {
        o.control = epx_serve::access::ControlMode::Explicit;
        o.load_models = vec!["*".into()];
    })
}

/// [`start`], with the options as `tune` leaves them (the defaults `epx serve` has, but for
/// loopback addresses and a 1 MiB body limit).
pub fn start_with(tune: impl FnOnce(&mut ServeOptions)) -> Running {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("epx-serve-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = epx_tests::repo_root();
    put(
        &dir,
        "add",
        &std::fs::read(root.join("examples/models/add.onnx")).unwrap(),
        Some("threads = 1\n"),
    );
    put(&dir, "mixed", &mixed_model(), None);
    put(
        &dir,
        "loop",
        &counting_loop(),
        Some("instances = 1\nmax_queue = 0\n"),
    );
    put(&dir, "broken", b"not an onnx model", None);
    put(&dir, "badconfig", &mixed_model(), Some("instance = 2\n"));
    let mut options = ServeOptions {
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        metrics: Some("127.0.0.1:0".parse().unwrap()),
        max_body_bytes: 1 << 20,
        ..ServeOptions::new(dir.clone(), "127.0.0.1:0".parse().unwrap())
    };
    tune(&mut options);
    // A plugin folder with the `adversarial` fixture (a Relu EP that misbehaves as its `mode`
    // option says), and the `epx` executable, which runs isolated EPs.
    let plugins = dir.join(".plugins");
    let lib = epx_tests::fixture_library("adversarial");
    let file = lib.file_name().and_then(|f| f.to_str()).unwrap().to_owned();
    let plugin = plugins.join("adversarial");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::copy(&lib, plugin.join(&file)).unwrap();
    std::fs::write(
        plugin.join("plugin.toml"),
        epx_tests::manifest("adversarial", "1.0", &["adversarial"], &file),
    )
    .unwrap();
    let env: Arc<Environment> = Environment::builder()
        .with_plugin_dirs([&plugins])
        .with_epx_executable(epx_tests::artifact_dir().join("epx"))
        .commit()
        .unwrap();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = epx_serve::Server::bind(env, &options).await?;
            addr_tx.send(server.listening()).unwrap();
            server
                .serve(async move {
                    let _ = stopped.await;
                })
                .await
        })
    });
    let at = addr_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the server starts");
    Running {
        addr: at.http,
        grpc: at.grpc.unwrap(),
        metrics: at.metrics.unwrap(),
        dir: dir.clone(),
        stop: Some(stop),
        thread: Some(thread),
        _dir: TempDir(dir),
    }
}

/// `y = x·W + b` (x FP32 `[n, 4]`, y `[n, 3]`) and `z_out = Relu(z)` (z FP32 `[n, m]`).
pub fn linear_model() -> Vec<u8> {
    let tensor = |name: &str, dims: &[i64], values: Vec<f32>| proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: values,
        ..Default::default()
    };
    let w: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    model_bytes(proto::GraphProto {
        name: Some("linear".into()),
        node: vec![
            node("MatMul", &["x", "w"], &["xw"]),
            node("Add", &["xw", "b"], &["y"]),
            node("Relu", &["z"], &["z_out"]),
        ],
        initializer: vec![
            tensor("w", &[4, 3], w),
            tensor("b", &[3], vec![0.1, -0.2, 0.3]),
        ],
        input: vec![value("x", 1, &[-1, 4]), value("z", 1, &[-1, -1])],
        output: vec![value("y", 1, &[-1, 3]), value("z_out", 1, &[-1, -1])],
        ..Default::default()
    })
}
