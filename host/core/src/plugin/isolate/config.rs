//! How isolated EPs are hosted: the executable and the call timeout. Named by the library a
//! plugin is (an isolated library remembers it) and by the proxy that starts the child.

use std::path::PathBuf;
use std::time::Duration;

/// How an EP runs in its own process: the `epx` executable that hosts it, and how long one call
/// may take before the process is taken for hung.
#[derive(Clone, Debug)]
pub struct Isolation {
    pub exe: PathBuf,
    pub timeout: Duration,
}

impl Isolation {
    /// `exe`, with the call timeout `EPX_ISOLATE_TIMEOUT_S` (default 600 s: a compile through
    /// a GPU runtime can take minutes).
    pub fn new(exe: PathBuf) -> Self {
        let secs = std::env::var("EPX_ISOLATE_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(600.0);
        Isolation {
            exe,
            timeout: Duration::from_secs_f64(secs),
        }
    }
}
