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

/// What one model's requests did.
#[derive(Default)]
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
}

impl ModelStats {
    pub fn ran(&self) {
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
        json!({
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms.load(Ordering::Relaxed),
            "inference_count": runs,
            "execution_count": runs,
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
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
    }
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
        let s = ModelStats::default();
        s.success.add(Duration::from_millis(3));
        s.fail.add(Duration::from_millis(1));
        s.queue.add(Duration::from_micros(5));
        s.compute.add(Duration::from_millis(2));
        s.rejected.fetch_add(1, Ordering::Relaxed);
        s.ran();
        let j = s.json("m", "1");
        assert_eq!(j["inference_count"], 1);
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
    }
}
