//! The fuzz targets: what one input is run through. A target returns normally whatever the
//! input is (an error from epx is a normal outcome); a panic or a crash is a finding.

use std::path::{Path, PathBuf};

use epx::ir::ValueType;
use epx::{ElementType, Session, Tensor, ValueSpec};

use crate::capi;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Model bytes through the loader, then a session on the CPU EP and one run on zeros.
    Onnx,
    /// `.npy` bytes through the reader.
    Npy,
    /// `plugin.toml` text through the manifest parser.
    Manifest,
    /// `epx_session_run` of libepx.so with random names, types, shapes and buffer lengths.
    Capi,
    /// An inference request of `epx serve`'s REST API (JSON, or JSON then binary data, the
    /// first byte choosing the header length) checked against a model of every datatype.
    ServeRest,
    /// A ModelInferRequest message of `epx serve`'s gRPC API, decoded and checked the same way.
    ServeGrpc,
    /// A plugin library (a mutant of the fixture plugins) in a plugin folder, listed as `epx
    /// providers` lists it: admitted, opened first in an `epx probe-library` child, then here
    /// with its EPs and devices. This process is the host: its crash is a finding.
    Elf,
}

pub const ALL: [Target; 7] = [
    Target::Onnx,
    Target::Npy,
    Target::Manifest,
    Target::Capi,
    Target::ServeRest,
    Target::ServeGrpc,
    Target::Elf,
];

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Onnx => "onnx",
            Target::Npy => "npy",
            Target::Manifest => "manifest",
            Target::Capi => "capi",
            Target::ServeRest => "serve-rest",
            Target::ServeGrpc => "serve-grpc",
            Target::Elf => "elf",
        }
    }
}

/// The largest tensor a fuzz case may allocate: a mutant asking for more gets epx's error.
pub const TENSOR_LIMIT: u64 = 64 << 20;

/// Runs one input; whether it went all the way (loaded, ran, parsed) without an error.
pub fn run(target: Target, input: &[u8]) -> bool {
    match target {
        Target::Onnx => onnx(input).is_some(),
        Target::Npy => epx_io::npy::parse_npy(input).is_ok(),
        Target::Manifest => std::str::from_utf8(input).is_ok_and(|text| {
            epx::plugin::manifest::parse_manifest(text, Path::new("fuzz/plugin.toml")).is_ok()
        }),
        Target::Capi => capi::run(input),
        Target::ServeRest => {
            // First byte odd: a JSON header of the next byte's length, then binary data.
            let (header_len, body) = match input.split_first() {
                Some((&b, rest)) if b & 1 == 1 && !rest.is_empty() => {
                    (Some(usize::from(rest[0])), &rest[1..])
                }
                Some((_, rest)) => (None, rest),
                None => (None, input),
            };
            serve_models().iter().any(|(inputs, outputs)| {
                epx_serve::protocol::parse_infer(body, header_len, inputs, outputs).is_ok()
            })
        }
        Target::ServeGrpc => serve_models().iter().any(|(inputs, outputs)| {
            epx_serve::grpc::parse_request(input, inputs, outputs).is_ok()
        }),
        Target::Elf => elf(input),
    }
}

/// The `epx` executable the `elf` target's probe runs: beside this one (a cargo build).
fn epx_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let epx = exe.parent()?.join("epx");
    epx.is_file().then_some(epx)
}

/// A mutant library listed as `epx providers` lists a plugin folder; whether it loaded.
fn elf(input: &[u8]) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(exe) = epx_exe() else {
        panic!("the elf target needs target/debug/epx beside epx-fuzz (cargo build -p epx-cli)");
    };
    let dir = std::env::temp_dir().join(format!("epx-fuzz-elf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a plugin folder");
    let lib = dir.join("libepx_fuzzed.so");
    std::fs::write(&lib, input).expect("the library");
    let _ = std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755));
    let loaded = epx::Environment::builder()
        .with_plugin_dirs([&dir])
        .with_load_probe(epx::plugin::probe::child_process(exe))
        .commit()
        .ok()
        .map(|env| {
            let all = env.load_all();
            let _ = env.devices();
            all.iter().any(|(_, l)| l.is_ok())
        })
        .unwrap_or(false);
    let _ = std::fs::remove_dir_all(&dir);
    loaded
}

/// The models the serve targets check a request against, each with one input of one datatype
/// (fixed, dynamic or unknown extents) and outputs of every datatype.
fn serve_models() -> Vec<(Vec<ValueSpec>, Vec<ValueSpec>)> {
    let spec = |name: &str, elem: ElementType, shape: Option<Vec<Option<u64>>>| ValueSpec {
        name: name.into(),
        elem_type: Some(elem),
        symbols: vec![None; shape.as_ref().map_or(0, Vec::len)],
        shape: shape.clone(),
        ty: ValueType::Tensor {
            elem_type: Some(elem),
            shape: None,
        },
    };
    let types = [
        ("f", ElementType::Float),
        ("d", ElementType::Double),
        ("h", ElementType::Float16),
        ("bf", ElementType::Bfloat16),
        ("i8", ElementType::Int8),
        ("i16", ElementType::Int16),
        ("i32", ElementType::Int32),
        ("i64", ElementType::Int64),
        ("u8", ElementType::Uint8),
        ("u16", ElementType::Uint16),
        ("u32", ElementType::Uint32),
        ("u64", ElementType::Uint64),
        ("b", ElementType::Bool),
        ("s", ElementType::String),
    ];
    let outputs: Vec<ValueSpec> = types
        .iter()
        .map(|&(name, elem)| spec(&format!("{name}_out"), elem, None))
        .collect();
    types
        .iter()
        .enumerate()
        .map(|(i, &(name, elem))| {
            let shape = match i % 3 {
                0 => Some(vec![None, Some(2)]),
                1 => Some(vec![Some(2)]),
                _ => None,
            };
            (vec![spec(name, elem, shape)], outputs.clone())
        })
        .collect()
}

/// Requests that the serve targets start from: well-formed ones of each datatype, as JSON,
/// JSON with binary data, and protobuf.
fn serve_seeds(target: Target) -> Vec<Vec<u8>> {
    use epx_serve::grpc::pb;
    use prost::Message as _;
    let json = |datatype: &str, name: &str, data: &str| {
        format!(
            r#"{{"id": "1", "inputs": [{{"name": "{name}", "shape": [1, 2], "datatype": "{datatype}", "data": {data}}}], "outputs": [{{"name": "{name}_out", "parameters": {{"binary_data": true}}}}], "parameters": {{"timeout": 1000}}}}"#
        )
    };
    match target {
        Target::ServeRest => {
            let mut seeds: Vec<Vec<u8>> = [
                json("FP32", "f", "[1.5, -2]"),
                json("INT64", "i64", "[[1], [2]]").replace("[1, 2]", "[2]"),
                json("BOOL", "b", "[true, false]"),
                json("BYTES", "s", r#"["a", "ü"]"#).replace("[1, 2]", "[2]"),
                json("FP16", "h", "[0.5, 1e4]"),
            ]
            .into_iter()
            .map(|j| [b"\0".to_vec(), j.into_bytes()].concat())
            .collect();
            let header = r#"{"inputs": [{"name": "u16", "shape": [2], "datatype": "UINT16", "parameters": {"binary_data_size": 4}}]}"#;
            let mut binary = vec![1, header.len() as u8];
            binary.extend_from_slice(header.as_bytes());
            binary.extend_from_slice(&[1, 0, 2, 0]);
            seeds.push(binary);
            seeds
        }
        _ => {
            let input = |name: &str, datatype: &str, shape: Vec<i64>, contents| {
                pb::model_infer_request::InferInputTensor {
                    name: name.into(),
                    datatype: datatype.into(),
                    shape,
                    contents,
                    ..Default::default()
                }
            };
            let typed = pb::ModelInferRequest {
                model_name: "m".into(),
                inputs: vec![input(
                    "i32",
                    "INT32",
                    vec![1, 2],
                    Some(pb::InferTensorContents {
                        int_contents: vec![1, -2],
                        ..Default::default()
                    }),
                )],
                ..Default::default()
            };
            let raw = pb::ModelInferRequest {
                model_name: "m".into(),
                inputs: vec![input("f", "FP32", vec![1, 2], None)],
                raw_input_contents: vec![vec![0; 8]],
                outputs: vec![pb::model_infer_request::InferRequestedOutputTensor {
                    name: "f_out".into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            vec![typed.encode_to_vec(), raw.encode_to_vec()]
        }
    }
}

fn onnx(input: &[u8]) -> Option<()> {
    let model = epx::onnx::load_model_bytes(input, "fuzz.onnx", None).ok()?;
    let session = Session::builder()
        .ok()?
        .with_intra_op_threads(1)
        .commit_from_model(model)
        .ok()?;
    let mut feeds = Vec::new();
    for spec in session.inputs() {
        let ty = spec.elem_type?;
        // Dynamic and unknown dims are 1; declared ones are used as they are (a huge one is
        // the size check's to refuse).
        let shape: Vec<usize> = spec
            .shape
            .unwrap_or_default()
            .iter()
            .map(|d| d.map_or(1, |v| usize::try_from(v).unwrap_or(usize::MAX)))
            .collect();
        feeds.push((spec.name, zeros(ty, &shape).ok()?));
    }
    session.run(feeds).ok().map(|_| ())
}

fn zeros(ty: ElementType, shape: &[usize]) -> epx::Result<Tensor> {
    Tensor::zeros(ty, shape)
}

/// Files under `dir` (recursively) whose name ends with `suffix` and that are at most
/// `max_len` bytes, sorted.
fn files(dir: &Path, suffix: &str, max_len: u64, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            files(&path, suffix, max_len, out);
        } else if meta.is_file()
            && meta.len() <= max_len
            && path.to_string_lossy().ends_with(suffix)
        {
            out.push(path);
        }
    }
}

/// The seed inputs of a target, from the repository (and its test data, when fetched).
pub fn seeds(target: Target, repo: &Path) -> Vec<Vec<u8>> {
    let mut paths = Vec::new();
    match target {
        Target::Onnx => {
            for dir in ["examples/models", "tests/models", ".testdata/onnx-node"] {
                files(&repo.join(dir), ".onnx", 256 << 10, &mut paths);
            }
        }
        Target::Npy => {
            for dir in ["examples/models", "tests/models"] {
                files(&repo.join(dir), ".npy", 256 << 10, &mut paths);
            }
        }
        Target::Manifest => {
            for dir in ["plugins", "tests/fixtures", "examples"] {
                files(&repo.join(dir), "plugin.toml", 64 << 10, &mut paths);
            }
        }
        // Its inputs are choices, not files: random bytes are as good a start as any.
        Target::Capi => {}
        // The plugin libraries of the build (the fixtures, one per way loading can fail, and
        // the example plugins), as `cargo build --workspace` leaves them.
        Target::Elf => {
            let Ok(entries) = std::fs::read_dir(repo.join("target/debug")) else {
                return vec![Vec::new()];
            };
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                let small = e
                    .metadata()
                    .is_ok_and(|m| m.is_file() && m.len() <= 16 << 20);
                if small && name.starts_with("libepx_") && name.ends_with(".so") {
                    paths.push(path);
                }
            }
        }
        Target::ServeRest | Target::ServeGrpc => return serve_seeds(target),
    }
    paths.sort();
    let mut seeds: Vec<Vec<u8>> = paths.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    if seeds.is_empty() {
        seeds.push(Vec::new());
    }
    seeds
}
