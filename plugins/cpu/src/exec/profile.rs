//! `EPX_CPU_PROFILE=1`: time spent per step kind (the op type, or the fused operations),
//! summed over the process and printed to stderr at exit. For finding where a model's time goes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Off, by step kind, or by node (`EPX_CPU_PROFILE=nodes`).
fn mode() -> u8 {
    static MODE: OnceLock<u8> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("EPX_CPU_PROFILE").as_deref() {
        Err(_) | Ok("" | "0") => 0,
        Ok("nodes") => 2,
        Ok(_) => 1,
    })
}

fn totals() -> &'static Mutex<HashMap<String, (u32, Duration)>> {
    static T: OnceLock<Mutex<HashMap<String, (u32, Duration)>>> = OnceLock::new();
    T.get_or_init(|| {
        extern "C" fn report() {
            // Runs from the C library's exit handlers: a panic must not unwind there.
            epx_plugin_api::ffi_boundary!(print_report())
        }
        fn print_report() {
            let Some(t) = T.get() else { return };
            let Ok(t) = t.lock() else { return };
            let mut rows: Vec<_> = t.iter().collect();
            rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
            let all: Duration = rows.iter().map(|r| r.1.1).sum();
            eprintln!(
                "EPX_CPU_PROFILE: {:.1} ms in CPU EP steps",
                all.as_secs_f64() * 1e3
            );
            for (k, (n, d)) in rows {
                eprintln!(
                    "{:>10.2} ms {:>5.1}% {:>6}x  {k}",
                    d.as_secs_f64() * 1e3,
                    100.0 * d.as_secs_f64() / all.as_secs_f64().max(1e-12),
                    n
                );
            }
        }
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { atexit(report) };
        Mutex::new(HashMap::new())
    })
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
}

pub(crate) struct Timer<'a>(Option<(&'a str, Instant)>);

impl<'a> Timer<'a> {
    pub(crate) fn start(kind: &'a str, label: &'a str) -> Self {
        match mode() {
            0 => Timer(None),
            1 => Timer(Some((kind, Instant::now()))),
            _ => Timer(Some((label, Instant::now()))),
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        if let Some((label, t0)) = self.0.take() {
            let d = t0.elapsed();
            if let Ok(mut t) = totals().lock() {
                let e = t.entry(label.to_string()).or_default();
                e.0 += 1;
                e.1 += d;
            }
        }
    }
}

/// Adds one call and the time until it is dropped to a step's counters (the profile a session
/// asks for, [`crate::exec::program::Program::profile_start`]).
pub(crate) struct Count<'a> {
    calls: &'a AtomicU64,
    ns: &'a AtomicU64,
    start: Instant,
}

impl<'a> Count<'a> {
    pub(crate) fn start(calls: &'a AtomicU64, ns: &'a AtomicU64) -> Self {
        Count {
            calls,
            ns,
            start: Instant::now(),
        }
    }
}

impl Drop for Count<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
}
