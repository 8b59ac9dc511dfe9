//! Per-model counters of what the server did, read two ways: the protocol's statistics extension
//! (`GET /v2/models/{m}/stats`, the shape tritonclient's `get_inference_statistics` reads) and
//! Prometheus' text format (`GET /metrics` on the metrics port).
//!
//! Counters only (a count and a total time per stage), updated with relaxed atomics on each
//! request: nothing grows with the load.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value as Json, json};

/// A count and the total time of one stage.
#[derive(Default)]
pub struct Timed {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Timed {
    pub fn add(&self, took: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The count and the total nanoseconds.
    pub fn read(&self) -> (u64, u64) {
        (
            self.count.load(Ordering::Relaxed),
            self.ns.load(Ordering::Relaxed),
        )
    }

    fn json(&self) -> Json {
        let (count, ns) = self.read();
        json!({"count": count, "ns": ns})
    }
}

/// Upper bounds (seconds) of the request latency histogram's buckets; a last one is +Inf.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What one model's requests did.
pub struct ModelStats {
    /// Requests answered with outputs, from arrival to answer.
    pub success: Timed,
    /// Requests refused or failed after the model was found, from arrival to answer.
    pub fail: Timed,
    /// Time waiting for an instance.
    pub queue: Timed,
    /// Time in the run.
    pub compute: Timed,
    /// Requests refused because the queue was full (also counted in `fail`).
    pub rejected: AtomicU64,
    /// When the last run ended, ms since the Unix epoch.
    last_inference_ms: AtomicU64,
    /// Rows inferred (a run of a batch of n counts n).
    inferences: AtomicU64,
    /// Runs and their time by batch size (index: rows; 1 for a model without batching).
    batches: Vec<Timed>,
    /// Requests answered (either way) by latency: `LATENCY_BUCKETS`, then +Inf.
    latency: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// Nodes each EP runs, from the placement report.
    pub nodes_by_provider: Vec<(String, usize)>,
}

impl ModelStats {
    /// Counters for a model whose runs take up to `max_batch` rows (0: no batching).
    pub fn new(max_batch: usize, nodes_by_provider: Vec<(String, usize)>) -> Self {
        ModelStats {
            success: Timed::default(),
            fail: Timed::default(),
            queue: Timed::default(),
            compute: Timed::default(),
            rejected: AtomicU64::new(0),
            last_inference_ms: AtomicU64::new(0),
            inferences: AtomicU64::new(0),
            batches: (0..=max_batch.max(1)).map(|_| Timed::default()).collect(),
            latency: Default::default(),
            nodes_by_provider,
        }
    }

    /// Counts a run of `rows` rows that took `took`.
    pub fn computed(&self, rows: usize, took: Duration) {
        self.compute.add(took);
        self.inferences.fetch_add(rows as u64, Ordering::Relaxed);
        if let Some(b) = self.batches.get(rows.max(1)) {
            b.add(took);
        }
        self.ran();
    }

    /// Counts a request answered (either way) after `took`.
    pub fn answered(&self, took: Duration, ok: bool) {
        if ok {
            self.success.add(took);
        } else {
            self.fail.add(took);
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Runs and their total time (ns) by batch size, for the sizes that ran.
    pub fn batch_sizes(&self) -> Vec<(usize, u64, u64)> {
        self.batches
            .iter()
            .enumerate()
            .filter_map(|(size, t)| {
                let (count, ns) = t.read();
                (count > 0).then_some((size, count, ns))
            })
            .collect()
    }

    /// Rows inferred.
    pub fn inferences(&self) -> u64 {
        self.inferences.load(Ordering::Relaxed)
    }

    fn ran(&self) {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        self.last_inference_ms.store(ms, Ordering::Relaxed);
    }

    /// When the last run ended, ms since the Unix epoch (0 before any).
    pub fn last_inference_ms(&self) -> u64 {
        self.last_inference_ms.load(Ordering::Relaxed)
    }

    /// The statistics extension's entry of one model version.
    pub fn json(&self, name: &str, version: &str) -> Json {
        let (runs, _) = self.compute.read();
        let batch_stats: Vec<Json> = self
            .batch_sizes()
            .into_iter()
            .map(|(size, count, ns)| {
                json!({"batch_size": size, "compute_infer": {"count": count, "ns": ns}})
            })
            .collect();
        json!({
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms.load(Ordering::Relaxed),
            "inference_count": self.inferences(),
            "execution_count": runs,
            "batch_stats": batch_stats,
            "inference_stats": {
                "success": self.success.json(),
                "fail": self.fail.json(),
                "queue": self.queue.json(),
                "compute_infer": self.compute.json(),
            },
        })
    }

    /// This model's lines of the Prometheus text format (after [`prometheus_header`]).
    pub fn prometheus(&self, name: &str, version: &str, out: &mut String) {
        let labels = format!("model=\"{}\",version=\"{}\"", escape(name), escape(version));
        let (ok, ok_ns) = self.success.read();
        let (fail, fail_ns) = self.fail.read();
        let (queued, queue_ns) = self.queue.read();
        let (runs, run_ns) = self.compute.read();
        let s = |ns: u64| ns as f64 / 1e9;
        let _ = writeln!(
            out,
            "epx_requests_total{{{labels},outcome=\"success\"}} {ok}"
        );
        let _ = writeln!(
            out,
            "epx_requests_total{{{labels},outcome=\"failure\"}} {fail}"
        );
        let _ = writeln!(
            out,
            "epx_requests_rejected_total{{{labels}}} {}",
            self.rejected.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "epx_request_seconds_total{{{labels},outcome=\"success\"}} {}",
            s(ok_ns)
        );
        let _ = writeln!(
            out,
            "epx_request_seconds_total{{{labels},outcome=\"failure\"}} {}",
            s(fail_ns)
        );
        let _ = writeln!(out, "epx_queue_seconds_total{{{labels}}} {}", s(queue_ns));
        let _ = writeln!(out, "epx_queue_waits_total{{{labels}}} {queued}");
        let _ = writeln!(out, "epx_compute_seconds_total{{{labels}}} {}", s(run_ns));
        let _ = writeln!(out, "epx_runs_total{{{labels}}} {runs}");
        let _ = writeln!(
            out,
            "epx_inferences_total{{{labels}}} {}",
            self.inferences()
        );
        for (size, count, ns) in self.batch_sizes() {
            let _ = writeln!(
                out,
                "epx_batch_runs_total{{{labels},size=\"{size}\"}} {count}"
            );
            let _ = writeln!(
                out,
                "epx_batch_compute_seconds_total{{{labels},size=\"{size}\"}} {}",
                s(ns)
            );
        }
        let mut below = 0;
        for (i, n) in self.latency.iter().enumerate() {
            below += n.load(Ordering::Relaxed);
            let le = LATENCY_BUCKETS
                .get(i)
                .map_or("+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(
                out,
                "epx_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {below}"
            );
        }
        let _ = writeln!(
            out,
            "epx_request_duration_seconds_sum{{{labels}}} {}",
            s(ok_ns + fail_ns)
        );
        let _ = writeln!(
            out,
            "epx_request_duration_seconds_count{{{labels}}} {}",
            ok + fail
        );
        for (provider, nodes) in &self.nodes_by_provider {
            let _ = writeln!(
                out,
                "epx_model_nodes{{{labels},provider=\"{}\"}} {nodes}",
                escape(provider)
            );
        }
    }
}

/// The `# HELP` and `# TYPE` lines of every metric [`ModelStats::prometheus`] writes.
pub fn prometheus_header(out: &mut String) {
    for (name, help) in [
        (
            "epx_requests_total",
            "Inference requests answered, by outcome.",
        ),
        (
            "epx_requests_rejected_total",
            "Inference requests refused because the model's queue was full.",
        ),
        (
            "epx_request_seconds_total",
            "Time from a request's arrival to its answer, by outcome.",
        ),
        (
            "epx_queue_seconds_total",
            "Time requests waited for an instance of the model.",
        ),
        (
            "epx_queue_waits_total",
            "Requests that were admitted to wait for an instance.",
        ),
        ("epx_compute_seconds_total", "Time in the model's runs."),
        ("epx_runs_total", "Runs of the model."),
        (
            "epx_inferences_total",
            "Rows inferred (a run of a batch of n rows counts n).",
        ),
        ("epx_batch_runs_total", "Runs of the model by batch size."),
        (
            "epx_batch_compute_seconds_total",
            "Time in the model's runs by batch size.",
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
    }
    let _ = writeln!(
        out,
        "# HELP epx_request_duration_seconds Time from a request's arrival to its answer."
    );
    let _ = writeln!(out, "# TYPE epx_request_duration_seconds histogram");
    let _ = writeln!(
        out,
        "# HELP epx_model_nodes Nodes of the model each execution provider runs."
    );
    let _ = writeln!(out, "# TYPE epx_model_nodes gauge");
}

/// A label value with `\`, `"` and newlines escaped, as the text format asks.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_read_as_statistics_and_as_prometheus_text() {
        let s = ModelStats::new(4, vec![("cpu".into(), 3)]);
        s.answered(Duration::from_millis(3), true);
        s.answered(Duration::from_millis(1), false);
        s.queue.add(Duration::from_micros(5));
        s.computed(3, Duration::from_millis(2));
        s.rejected.fetch_add(1, Ordering::Relaxed);
        let j = s.json("m", "1");
        assert_eq!(
            (j["inference_count"].as_u64(), j["execution_count"].as_u64()),
            (Some(3), Some(1))
        );
        assert_eq!(
            j["batch_stats"],
            json!([{"batch_size": 3, "compute_infer": {"count": 1, "ns": 2_000_000}}])
        );
        assert_eq!(
            j["inference_stats"]["success"],
            json!({"count": 1, "ns": 3_000_000})
        );
        assert_eq!(j["inference_stats"]["compute_infer"]["ns"], 2_000_000);
        assert!(j["last_inference"].as_u64().unwrap() > 0);
        let mut text = String::new();
        prometheus_header(&mut text);
        s.prometheus("a\"b", "1", &mut text);
        assert!(text.contains("# TYPE epx_runs_total counter"));
        assert!(text.contains(
            "epx_requests_total{model=\"a\\\"b\",version=\"1\",outcome=\"success\"} 1\n"
        ));
        assert!(text.contains("epx_compute_seconds_total{model=\"a\\\"b\",version=\"1\"} 0.002\n"));
        assert!(text.contains("epx_requests_rejected_total{model=\"a\\\"b\",version=\"1\"} 1\n"));
        // The latency histogram: 1 ms and 3 ms, cumulative.
        let l = "epx_request_duration_seconds_bucket{model=\"a\\\"b\",version=\"1\",le=";
        assert!(text.contains(&format!("{l}\"0.0005\"}} 0\n")), "{text}");
        assert!(text.contains(&format!("{l}\"0.001\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("{l}\"0.005\"}} 2\n")), "{text}");
        assert!(text.contains(&format!("{l}\"+Inf\"}} 2\n")), "{text}");
        assert!(
            text.contains("epx_batch_runs_total{model=\"a\\\"b\",version=\"1\",size=\"3\"} 1\n")
        );
        assert!(
            text.contains("epx_model_nodes{model=\"a\\\"b\",version=\"1\",provider=\"cpu\"} 3\n")
        );
        assert!(text.contains("# TYPE epx_request_duration_seconds histogram"));
    }
}
