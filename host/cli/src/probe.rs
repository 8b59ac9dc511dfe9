//! Opening each plugin library in a child process before this one opens it, so a library that
//! crashes the loader (a corrupt file, a constructor that faults, an `ld.so` assertion) or hangs
//! is reported as broken and `epx providers` / `epx doctor` go on with the others.
//!
//! The child is `epx` itself (`epx probe-library LIB --preload DEP ...`, hidden): it opens the
//! library exactly as loading does (dependencies preloaded first, entry called, EPs asked whether
//! they are available) and prints one line saying it got through.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use epx::plugin::PluginLibrary;
use epx::plugin::discover::PluginCandidate;

/// The line a child prints when opening the library did not kill it.
const SURVIVED: &str = "epx-probe: survived";

/// How long a library may take to open in the child (`EPX_PROBE_TIMEOUT_S`, default 60 s: ONNX
/// Runtime and OpenVINO take a second or two; a GPU runtime's first start can take longer).
fn timeout() -> Duration {
    let secs = std::env::var("EPX_PROBE_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(60.0);
    Duration::from_secs_f64(secs)
}

#[derive(clap::Args)]
pub struct ProbeArgs {
    library: PathBuf,
    /// A library to open first (repeatable, in order).
    #[arg(long = "preload", value_name = "LIB")]
    preloads: Vec<PathBuf>,
}

/// The child's side: open, and say so. Whether the library loaded or was refused does not
/// matter here (the parent finds that out itself); only that this process lived through it.
pub fn child(args: ProbeArgs) -> ExitCode {
    match PluginLibrary::open(&args.library, &args.preloads) {
        Ok(lib) => println!("{SURVIVED} (loaded {} EP(s))", lib.providers.len()),
        Err(e) => println!("{SURVIVED} (refused: {})", e.message),
    }
    ExitCode::SUCCESS
}

/// The probe handed to the environment: runs the child and turns its death into a reason.
pub fn load_probe() -> epx::LoadProbe {
    Arc::new(|candidate: &PluginCandidate, preloads: &[PathBuf]| {
        probe(&candidate.library, preloads, timeout())
    })
}

fn probe(library: &Path, preloads: &[PathBuf], limit: Duration) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| {
        format!("cannot find epx's own executable to open the library in a child process: {e}")
    })?;
    let mut cmd = Command::new(exe);
    cmd.arg("probe-library").arg(library);
    for p in preloads {
        cmd.arg("--preload").arg(p);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start a child process to open it in: {e}"))?;
    // Both pipes are drained on threads so a chatty library cannot block the child.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.by_ref().take(1 << 20).read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("lost the child process opening it: {e}")),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(format!(
            "opening it did not finish within {:.0} s in a child process (hung; set \
             EPX_PROBE_TIMEOUT_S to wait longer), so it was not opened here",
            limit.as_secs_f64()
        ));
    };
    if status.success() && out.lines().any(|l| l.starts_with(SURVIVED)) {
        return Ok(());
    }
    let how = match exit_signal(&status) {
        Some(sig) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        None => format!("ended with {status}"),
    };
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| format!("; it last said: {}", l.trim()))
        .unwrap_or_default();
    Err(format!(
        "the library is broken: a child process opening it {how}{last}. It was not opened here"
    ))
}

#[cfg(unix)]
pub fn exit_signal(s: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    s.signal()
}

#[cfg(not(unix))]
pub fn exit_signal(_: &std::process::ExitStatus) -> Option<i32> {
    None
}

/// The usual name of a signal number on Linux.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => "signal",
    }
}
