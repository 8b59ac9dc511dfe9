//! The fuzz targets: what one input is run through. A target returns normally whatever the
//! input is (an error from epx is a normal outcome); a panic or a crash is a finding.

use std::path::{Path, PathBuf};

use epx::{ElementType, Session, Tensor};

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
}

pub const ALL: [Target; 4] = [Target::Onnx, Target::Npy, Target::Manifest, Target::Capi];

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Onnx => "onnx",
            Target::Npy => "npy",
            Target::Manifest => "manifest",
            Target::Capi => "capi",
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
    }
    paths.sort();
    let mut seeds: Vec<Vec<u8>> = paths.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    if seeds.is_empty() {
        seeds.push(Vec::new());
    }
    seeds
}
