//! Eight threads running several models on shared sessions, many times: every output is
//! bit-identical to the first single-threaded run, and the process's resident memory after the
//! first round stays flat (nothing accumulates per run: no leak, no cache that grows).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use epx::{Session, Tensor};
use epx_tests::examples::{reference_npy_in, tensor};
use epx_tests::repo_root;

/// (folder, model) pairs: a CNN, an int8 QDQ CNN, a transformer encoder, GQA with rotary
/// embeddings, a dynamically quantized LSTM, float16 gathers.
fn models() -> Vec<(PathBuf, &'static str)> {
    let examples = repo_root().join("examples/models");
    let tests = repo_root().join("tests/models");
    vec![
        (examples, "mnist-cnn"),
        (tests.clone(), "ort-qdq-cnn"),
        (tests.clone(), "ort-transformers-encoder"),
        (tests.clone(), "ort-gqa-prompt-rotary"),
        (tests.clone(), "ort-dynamic-quantize-lstm"),
        (tests, "float16-gather"),
    ]
}

struct Case {
    name: &'static str,
    session: Session,
    inputs: Vec<(String, Tensor)>,
    want: Vec<(String, Vec<u8>)>,
}

fn outputs(session: &Session, inputs: &[(String, Tensor)]) -> Vec<(String, Vec<u8>)> {
    session
        .run(
            inputs
                .iter()
                .map(|(n, t)| (n.as_str(), t.try_clone().expect("copy"))),
        )
        .expect("run")
        .into_iter()
        .map(|(n, v)| {
            let t = v.into_host().expect("a host tensor");
            (n, t.bytes().expect("plain tensor bytes").to_vec())
        })
        .collect()
}

fn load(dir: &Path, name: &'static str) -> Case {
    let session = Session::builder()
        .and_then(|b| b.commit_from_file(dir.join(format!("{name}.onnx"))))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let inputs: Vec<(String, Tensor)> = reference_npy_in(dir, name, "input")
        .iter()
        .map(|(n, a)| (n.clone(), tensor(a)))
        .collect();
    let want = outputs(&session, &inputs);
    Case {
        name,
        session,
        inputs,
        want,
    }
}

/// Resident memory of this process in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// Each of `threads` threads runs every model `rounds` times per phase (each thread starting at
/// another model) and checks each output bit for bit; after each of `phases` phases all threads
/// wait while the resident memory is sampled. The threads live through all phases, so what is
/// sampled is the steady state of one set of threads, not the churn of starting new ones.
fn soak(cases: &Arc<Vec<Case>>, threads: usize, phases: usize, rounds: usize) -> Vec<u64> {
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let cases = Arc::clone(cases);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                for p in 0..phases {
                    for r in 0..rounds {
                        for k in 0..cases.len() {
                            let c = &cases[(t + k) % cases.len()];
                            let got = outputs(&c.session, &c.inputs);
                            assert_eq!(got.len(), c.want.len(), "{}", c.name);
                            for ((name, have), (_, want)) in got.iter().zip(&c.want) {
                                assert!(
                                    have == want,
                                    "{}: output {name} differs on thread {t}, phase {p}, round {r}",
                                    c.name
                                );
                            }
                        }
                    }
                    barrier.wait();
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for _ in 0..phases {
        barrier.wait();
        samples.push(rss_kib());
        barrier.wait();
    }
    for w in workers {
        w.join().expect("a soak thread failed");
    }
    samples
}

#[test]
fn eight_threads_stay_bit_identical_and_flat_in_memory() {
    let cases: Arc<Vec<Case>> = Arc::new(
        models()
            .into_iter()
            .map(|(dir, name)| load(&dir, name))
            .collect(),
    );
    let started = std::time::Instant::now();
    // The first phases fill the pools, caches and allocator arenas a steady state keeps.
    let (phases, rounds) = (12, 200);
    let samples = soak(&cases, 8, phases, rounds);
    let runs = 8 * phases * rounds * cases.len();
    eprintln!(
        "soak: {runs} runs of {} models on 8 threads in {:.1} s, all bit-identical; RSS after \
         each phase of {} runs: {samples:?} KiB",
        cases.len(),
        started.elapsed().as_secs_f64(),
        runs / phases
    );
    // Flat over the second half: a leak of 16 bytes a run would add more than allowed.
    let (warm, end) = (samples[phases / 2], samples[phases - 1]);
    let growth = end.saturating_sub(warm);
    let later_runs = (runs / phases * (phases - 1 - phases / 2)) as u64;
    assert!(
        growth * 1024 < later_runs * 16,
        "RSS grew by {growth} KiB over the last {later_runs} runs ({samples:?} KiB)"
    );
}
