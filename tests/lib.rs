//! Helpers shared by the integration tests: where the built plugin libraries are, and
//! throw-away plugin folders to copy them into.
//!
//! The plugin libraries (`tests/fixtures/*` and `plugins/cpu/cdylib`) are cdylib crates of the
//! workspace; `cargo test` does not build them for this package, so run
//! `cargo build --workspace` before `cargo test`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The root of the repository (the workspace).
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .map_or_else(|| here.to_path_buf(), Path::to_path_buf)
}

/// The folder cargo puts the workspace's libraries in for the profile these tests were built
/// with (`target/debug` by default): the parent of the `deps/` folder holding the test
/// executable, which follows `CARGO_TARGET_DIR`, `--target` and `--profile` by construction.
/// Falls back to `$CARGO_TARGET_DIR/debug`, then `<repo>/target/debug`.
pub fn artifact_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe()
        && let Some(deps) = exe.parent()
        && deps.file_name().is_some_and(|n| n == "deps")
        && let Some(dir) = deps.parent()
    {
        return dir.to_path_buf();
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            };
            dir.join("debug")
        }
        _ => repo_root().join("target").join("debug"),
    }
}

/// The file name of a cdylib whose `[lib] name` is `lib_name`, on this OS.
pub fn library_file_name(lib_name: &str) -> String {
    if cfg!(target_os = "windows") {
        format!("{lib_name}.dll")
    } else if cfg!(target_os = "macos") {
        format!("lib{lib_name}.dylib")
    } else {
        format!("lib{lib_name}.so")
    }
}

/// The built library of the workspace cdylib whose `[lib] name` is `lib_name`.
///
/// # Panics
/// When it has not been built, saying how to build it.
pub fn built_library(lib_name: &str) -> PathBuf {
    let path = artifact_dir().join(library_file_name(lib_name));
    assert!(
        path.is_file(),
        "{} is missing: the plugin libraries are separate cdylib crates that `cargo test` does not \
         build; run `cargo build --workspace` first (same profile and target dir as the tests)",
        path.display()
    );
    path
}

/// The built library of fixture `name` (`tests/fixtures/<name>`, `libepx_fixture_<name>.so`).
pub fn fixture_library(name: &str) -> PathBuf {
    built_library(&format!("epx_fixture_{name}"))
}

/// A `plugin.toml` for a plugin called `name` offering `providers`, whose library is
/// `library` (a file name in the plugin folder).
pub fn manifest(name: &str, abi: &str, providers: &[&str], library: &str) -> String {
    let providers: Vec<String> = providers.iter().map(|p| format!("{p:?}")).collect();
    let key = if cfg!(target_os = "windows") {
        "windows"
    } else if cfg!(target_os = "macos") {
        "macos"
    } else {
        "linux"
    };
    format!(
        "name = {name:?}\nversion = \"0.1.0\"\nabi = {abi:?}\nproviders = [{}]\n\n[library]\n{key} = {library:?}\n",
        providers.join(", ")
    )
}

/// A fresh folder under the system temp folder, removed (with everything in it) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Makes `<temp>/epx-tests-<tag>-<pid>-<n>`, permissions 0755 (plugin discovery refuses
    /// world-writable folders).
    pub fn new(tag: &str) -> std::io::Result<TempDir> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("epx-tests-{tag}-{}-{n}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        make_dir(&path)?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes plugin folder `<self>/<folder>` holding a copy of `library` and, when given, a
    /// `plugin.toml` with `manifest` as its text. Returns the path of the copied library.
    pub fn add_plugin(
        &self,
        folder: &str,
        library: &Path,
        manifest: Option<&str>,
    ) -> std::io::Result<PathBuf> {
        let dir = self.path.join(folder);
        make_dir(&dir)?;
        let file_name = library.file_name().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} has no file name", library.display()),
            )
        })?;
        let dest = dir.join(file_name);
        std::fs::copy(library, &dest)?;
        set_mode(&dest, 0o755)?;
        if let Some(text) = manifest {
            self.write(&format!("{folder}/plugin.toml"), text)?;
        }
        Ok(dest)
    }

    /// Writes a file (relative to the folder), making its parent folders.
    pub fn write(&self, relative: &str, text: &str) -> std::io::Result<PathBuf> {
        let path = self.path.join(relative);
        if let Some(parent) = path.parent() {
            make_dir(parent)?;
        }
        std::fs::write(&path, text)?;
        set_mode(&path, 0o644)?;
        Ok(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn make_dir(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    set_mode(path, 0o755)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> std::io::Result<()> {
    Ok(())
}

/// Models asking for huge tensors or lying about their data.
#[path = "hostile_models.rs"]
pub mod hostile;

/// Builders for the small ONNX models the tests make.
pub mod models {
    use epx::onnx::proto;
    use prost::Message;

    /// A float32 value with static dims.
    pub fn float_value(name: &str, dims: &[i64]) -> proto::ValueInfoProto {
        use proto::tensor_shape_proto::{Dimension, dimension};
        proto::ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(proto::TypeProto {
                value: Some(proto::type_proto::Value::TensorType(
                    proto::type_proto::Tensor {
                        elem_type: Some(proto::tensor_proto::DataType::Float as i32),
                        shape: Some(proto::TensorShapeProto {
                            dim: dims
                                .iter()
                                .map(|&d| Dimension {
                                    value: Some(dimension::Value::DimValue(d)),
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

    /// A node named `<op>_<outputs joined by _>`.
    pub fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> proto::NodeProto {
        proto::NodeProto {
            op_type: Some(op.into()),
            name: Some(format!("{op}_{}", outputs.join("_"))),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// An integer attribute.
    pub fn int_attr(name: &str, v: i64) -> proto::AttributeProto {
        proto::AttributeProto {
            name: Some(name.into()),
            i: Some(v),
            r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
            ..Default::default()
        }
    }

    /// An integer-list attribute.
    pub fn ints_attr(name: &str, v: &[i64]) -> proto::AttributeProto {
        proto::AttributeProto {
            name: Some(name.into()),
            ints: v.to_vec(),
            r#type: Some(proto::attribute_proto::AttributeType::Ints as i32),
            ..Default::default()
        }
    }

    /// A float32 initializer.
    pub fn float_init(name: &str, dims: &[i64], data: Vec<f32>) -> proto::TensorProto {
        proto::TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(proto::tensor_proto::DataType::Float as i32),
            float_data: data,
            ..Default::default()
        }
    }

    /// `n` deterministic pseudo-random floats in `[-scale, scale)` (a linear congruential
    /// sequence from `seed`).
    pub fn seeded_floats(seed: u32, n: usize, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// x [2, 3] → Relu → r; y = Add(r, x), with `r` undeclared (its shape is the host's
    /// inference).
    pub fn relu_add_model(name: &str) -> Vec<u8> {
        model_bytes(proto::GraphProto {
            name: Some(name.into()),
            node: vec![
                node("Relu", &["x"], &["r"]),
                node("Add", &["r", "x"], &["y"]),
            ],
            input: vec![float_value("x", &[2, 3])],
            output: vec![float_value("y", &[2, 3])],
            ..Default::default()
        })
    }

    /// r = Relu(x), y = Neg(r); both graph outputs, float32 [2, 3], so the host knows the type
    /// and shape a Relu kernel must produce (the EP tests' model: one node an EP can claim).
    pub fn relu_neg_model() -> Vec<u8> {
        model_bytes(proto::GraphProto {
            name: Some("relu_neg".into()),
            node: vec![node("Relu", &["x"], &["r"]), node("Neg", &["r"], &["y"])],
            input: vec![float_value("x", &[2, 3])],
            output: vec![float_value("r", &[2, 3]), float_value("y", &[2, 3])],
            ..Default::default()
        })
    }

    pub fn scalar_value(name: &str, elem_type: i32) -> proto::ValueInfoProto {
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
    pub fn counting_loop() -> Vec<u8> {
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
        let mut out = float_value("scan", &[]);
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

    /// An opset-17 (IR 8) model around `graph`, encoded.
    pub fn model_bytes(graph: proto::GraphProto) -> Vec<u8> {
        proto::ModelProto {
            ir_version: Some(8),
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            producer_name: Some("epx-tests".into()),
            graph: Some(graph),
            ..Default::default()
        }
        .encode_to_vec()
    }
}

/// The example models in `examples/models/`, their reference `.npy` files, and sessions over
/// shipped plugins.
pub mod examples {
    use std::path::PathBuf;
    use std::sync::Arc;

    use epx::{Environment, Session, Tensor};
    use epx_io::npy::{NpyArray, read_npy};

    use crate::{TempDir, built_library, repo_root};

    pub fn models_dir() -> PathBuf {
        repo_root().join("examples/models")
    }

    /// `examples/models/<model>.onnx`.
    pub fn model_path(model: &str) -> PathBuf {
        models_dir().join(format!("{model}.onnx"))
    }

    /// The `<model>.<kind>.<name>.npy` files next to a model in `examples/models` (`kind` is
    /// `input` or `output`), by value name, sorted.
    pub fn reference_npy(model: &str, kind: &str) -> Vec<(String, NpyArray)> {
        reference_npy_in(&models_dir(), model, kind)
    }

    /// [`reference_npy`] for a model in `dir`.
    pub fn reference_npy_in(
        dir: &std::path::Path,
        model: &str,
        kind: &str,
    ) -> Vec<(String, NpyArray)> {
        let prefix = format!("{model}.{kind}.");
        let mut found: Vec<(String, NpyArray)> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().to_string_lossy().into_owned();
                let name = file
                    .strip_prefix(&prefix)?
                    .strip_suffix(".npy")?
                    .to_string();
                Some((name, e.path()))
            })
            .map(|(name, path)| {
                let array = read_npy(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                (name, array)
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(
            !found.is_empty(),
            "no {prefix}*.npy files in {}",
            dir.display()
        );
        found
    }

    /// Checks the `output probabilities: ... values v0 v1 ...` line the C and C++ examples print
    /// for mnist-cnn against the reference output, within 1e-5.
    pub fn assert_printed_mnist_probabilities(stdout: &str) {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("output probabilities:"))
            .unwrap_or_else(|| panic!("no output line:\n{stdout}"));
        let got: Vec<f32> = line
            .split(" values ")
            .nth(1)
            .unwrap_or_else(|| panic!("no values in `{line}`"))
            .split_whitespace()
            .map(|v| v.parse().expect("a number"))
            .collect();
        let want = f32s(&reference_npy("mnist-cnn", "output")[0].1.data);
        assert_eq!(got.len(), want.len(), "{line}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-5, "probabilities[{i}]: {a} vs {b}");
        }
    }

    /// A `.npy` array as a tensor.
    pub fn tensor(a: &NpyArray) -> Tensor {
        Tensor::from_bytes(a.elem_type, &a.shape, &a.data).expect("npy data makes a tensor")
    }

    /// The reference inputs of a model, by name.
    pub fn reference_inputs(model: &str) -> Vec<(String, Tensor)> {
        reference_npy(model, "input")
            .iter()
            .map(|(n, a)| (n.clone(), tensor(a)))
            .collect()
    }

    /// Runs a session and brings every output to host memory.
    pub fn run(session: &Session, inputs: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        session
            .run(
                inputs
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.try_clone().expect("copy"))),
            )
            .expect("run")
            .into_iter()
            .map(|(n, v)| (n, v.into_host().expect("host output")))
            .collect()
    }

    /// Little-endian f32 bytes as numbers.
    pub fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// A plugin folder `<folder>/` holding the built library `lib_name` and the repo's
    /// `plugin.toml` at `manifest` (relative to the repo root).
    pub fn shipped_plugin(tag: &str, folder: &str, manifest: &str, lib_name: &str) -> TempDir {
        let dir = TempDir::new(tag).expect("temp dir");
        let path = repo_root().join(manifest);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        dir.add_plugin(folder, &built_library(lib_name), Some(&text))
            .expect("copy the plugin");
        dir
    }

    /// An environment over one plugin folder, which must hold no broken plugin, with its cache
    /// folder (compiled kernels) inside that folder.
    pub fn env_for(dir: &TempDir) -> Arc<Environment> {
        let env = Environment::builder()
            .with_plugin_dirs([dir.path()])
            .with_cache_dir(dir.path().join("cache"))
            .commit()
            .expect("environment");
        assert!(
            env.discovery().problems.is_empty(),
            "{:?}",
            env.discovery().problems
        );
        env
    }
}

/// `epx --plugin-dir DIR conformance --ep EP` on the node tests matching `filter` and on
/// `examples/models/mnist-cnn.onnx`, with `envs` set: the exit code and what it printed (or
/// `None`, saying why, when the CLI is not built). The node tests come from
/// `tests/fetch-testdata.sh`.
pub fn run_conformance(
    dir: &Path,
    ep: &str,
    filter: &str,
    envs: &[(&str, &Path)],
) -> Option<(Option<i32>, String)> {
    let cli = artifact_dir().join(format!("epx{}", std::env::consts::EXE_SUFFIX));
    if !cli.is_file() {
        eprintln!(
            "skipping: {} is missing (run `cargo build --workspace`)",
            cli.display()
        );
        return None;
    }
    let nodes = repo_root().join(".testdata/onnx-node");
    assert!(
        nodes.is_dir(),
        "{} is missing: run `bash tests/fetch-testdata.sh`",
        nodes.display()
    );
    let mut cmd = std::process::Command::new(cli);
    cmd.arg("--plugin-dir")
        .arg(dir)
        .args([
            "conformance",
            "--ep",
            ep,
            "--filter",
            filter,
            "--node-tests",
        ])
        .arg(&nodes)
        .arg("--model")
        .arg(repo_root().join("examples/models/mnist-cnn.onnx"));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running epx conformance");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.code(), text))
}

/// The totals line of `epx conformance`: (cases, claimed, passed, wrong, crashed, declined).
pub fn conformance_totals(report: &str) -> (usize, usize, usize, usize, usize, usize) {
    let line = report
        .lines()
        .rev()
        .find(|l| l.contains(" cases, ") && l.contains(" claimed, "))
        .unwrap_or_else(|| panic!("no totals line:\n{report}"));
    let n = |word: &str| -> usize {
        let before = line.split(&format!(" {word}")).next().unwrap_or("");
        before
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("no `{word}` count in `{line}`"))
    };
    (
        n("cases"),
        n("claimed"),
        n("passed"),
        n("wrong"),
        n("crashed"),
        n("declined"),
    )
}
