//! ONNX Runtime's log in epx's log, at the level a user of epx would give each line.
//!
//! ONNX Runtime writes many notes at its WARNING severity that say nothing is wrong: its graph
//! optimizers report each rewrite they skipped (`UnsqueezeElimination cannot remove node ...`,
//! once per node, a dozen per session on a large model), and the adapter's capability probes
//! build throwaway one-node sessions whose notes (and expected refusals) are the probe's answer,
//! reported by the adapter itself as a decline reason. Passed on as warnings they bury the ones
//! that matter. The rules:
//!
//! - VERBOSE is a trace line, INFO a debug line;
//! - while the calling thread builds a probe session ([`Quiet`]), every line below FATAL is a
//!   debug line;
//! - a WARNING from one of ONNX Runtime's graph optimizers (its source file, which ONNX Runtime
//!   gives as the message's location, is named as they all are: `*_fusion.cc`,
//!   `*_elimination.cc`, ...) is a debug line: the optimizer left the graph as it was, which
//!   changes no result;
//! - any other WARNING stays a warning, ERROR and FATAL are errors.

use std::cell::Cell;

use epx_plugin_api::abi::EpxLogLevel;
use ort::logging::LogLevel;

thread_local! {
    static QUIET: Cell<u32> = const { Cell::new(0) };
}

/// While alive, ONNX Runtime's lines logged on this thread (below FATAL) are debug lines: made
/// around the creation of probe sessions, whose messages are not the user's concern.
pub(crate) struct Quiet(());

impl Quiet {
    pub(crate) fn new() -> Quiet {
        QUIET.with(|q| q.set(q.get() + 1));
        Quiet(())
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.with(|q| q.set(q.get().saturating_sub(1)));
    }
}

/// Whether this thread is inside a [`Quiet`] span.
fn quiet() -> bool {
    QUIET.with(|q| q.get() > 0)
}

/// The endings of the source-file names of ONNX Runtime's graph optimizers (its
/// `core/optimizer` folder: `conv_bn_fusion.cc`, `unsqueeze_elimination.cc`,
/// `insert_cast_transformer.cc`, `double_qdq_pairs_remover.cc`, `constant_folding.cc`, ...).
const OPTIMIZER_FILES: &[&str] = &[
    "_fusion.cc",
    "_elimination.cc",
    "_transformer.cc",
    "_rewriter.cc",
    "_remover.cc",
    "_replacement.cc",
    "_folding.cc",
    "_transformation.cc",
    "_optimizer.cc",
    "_actors.cc",
];

/// Whether `location` (`file.cc:LINE function`, as ONNX Runtime formats it; a path before the
/// file name is allowed) is in one of ONNX Runtime's graph optimizers.
fn from_optimizer(location: &str) -> bool {
    let head = location.split(' ').next().unwrap_or("");
    let file = head.rsplit_once(':').map_or(head, |(file, _line)| file);
    let file = file.rsplit(['/', '\\']).next().unwrap_or(file);
    file.starts_with("graph_transformer") || OPTIMIZER_FILES.iter().any(|s| file.ends_with(s))
}

/// The epx level of an ONNX Runtime line of severity `level` logged at `location`.
pub(crate) fn level(level: LogLevel, location: &str) -> EpxLogLevel {
    level_in(level, location, quiet())
}

fn level_in(level: LogLevel, location: &str, quiet: bool) -> EpxLogLevel {
    match level {
        LogLevel::Verbose => EpxLogLevel::Trace,
        LogLevel::Fatal => EpxLogLevel::Error,
        _ if quiet => EpxLogLevel::Debug,
        LogLevel::Info => EpxLogLevel::Debug,
        LogLevel::Warning if from_optimizer(location) => EpxLogLevel::Debug,
        LogLevel::Warning => EpxLogLevel::Warn,
        LogLevel::Error => EpxLogLevel::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimizer_notes_are_debug_lines_and_other_warnings_stay() {
        let l = |lvl, loc| level_in(lvl, loc, false);
        assert_eq!(
            l(LogLevel::Warning, "unsqueeze_elimination.cc:24 Apply"),
            EpxLogLevel::Debug
        );
        assert_eq!(
            l(
                LogLevel::Warning,
                "/src/onnxruntime/core/optimizer/conv_bn_fusion.cc:88 ApplyImpl"
            ),
            EpxLogLevel::Debug
        );
        assert_eq!(
            l(LogLevel::Warning, "graph_transformer_utils.cc:310 Generate"),
            EpxLogLevel::Debug
        );
        assert_eq!(
            l(LogLevel::Warning, "C:\\ort\\insert_cast_transformer.cc:5 f"),
            EpxLogLevel::Debug
        );
        // Session and EP warnings are the user's business.
        assert_eq!(
            l(
                LogLevel::Warning,
                "session_state.cc:1280 VerifyEachNodeIsAssignedToAnEp"
            ),
            EpxLogLevel::Warn
        );
        assert_eq!(
            l(LogLevel::Warning, "cuda_execution_provider.cc:12 f"),
            EpxLogLevel::Warn
        );
        assert_eq!(l(LogLevel::Warning, ""), EpxLogLevel::Warn);
        assert_eq!(l(LogLevel::Info, "x.cc:1 f"), EpxLogLevel::Debug);
        assert_eq!(l(LogLevel::Verbose, "x.cc:1 f"), EpxLogLevel::Trace);
        assert_eq!(l(LogLevel::Error, "x.cc:1 f"), EpxLogLevel::Error);
        assert_eq!(
            l(LogLevel::Error, "constant_folding.cc:1 f"),
            EpxLogLevel::Error
        );
    }

    #[test]
    fn a_probe_is_quiet_below_fatal_on_its_own_thread_only() {
        assert_eq!(
            level(LogLevel::Warning, "session_state.cc:1 f"),
            EpxLogLevel::Warn
        );
        {
            let _q = Quiet::new();
            let _nested = Quiet::new();
            assert_eq!(
                level(LogLevel::Warning, "session_state.cc:1 f"),
                EpxLogLevel::Debug
            );
            assert_eq!(level(LogLevel::Error, "x.cc:1 f"), EpxLogLevel::Debug);
            assert_eq!(level(LogLevel::Fatal, "x.cc:1 f"), EpxLogLevel::Error);
            let other = std::thread::spawn(|| level(LogLevel::Warning, "session_state.cc:1 f"));
            assert_eq!(other.join().unwrap(), EpxLogLevel::Warn);
        }
        assert_eq!(
            level(LogLevel::Warning, "session_state.cc:1 f"),
            EpxLogLevel::Warn
        );
    }
}
