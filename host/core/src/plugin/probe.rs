//! Opening a plugin library in a child process before this process opens it: a library that
//! crashes the loader (a corrupt file, a constructor that faults, an `ld.so` assertion) or hangs
//! kills or stalls the child, and is refused here with the signal or exit status
//! ([`PluginLoadErrorKind::Crashed`](crate::error::PluginLoadErrorKind::Crashed)).
//!
//! The child is the `epx` executable: `epx probe-library LIB --sha256 D [--preload DEP
//! --preload-sha256 D]...` opens the library with the function loading uses
//! ([`PluginLibrary::open`](super::PluginLibrary::open): preloads, `dlopen`, the entry, the
//! descriptor read, each EP's availability and devices) and prints [`SURVIVED`] with the
//! outcome. It opens its own sealed copy of each file and refuses one whose SHA-256 is not the
//! one this process checked ([`super::sealed`]), so the child runs the bytes this process will
//! run, whatever happens to the files on disk. The child's outcome is final: a library the
//! child could not load (a `dlopen` error, a missing entry, a failing entry) is refused here
//! with the child's reason and never opened in this process, since the same bytes can load in
//! a process whose address layout differs and fault in it (a corrupt program header maps or
//! not depending on where the loader puts it). `epx providers` / `epx doctor` re-run
//! themselves; libepx looks for `epx` beside itself ([`find_epx`]). The child runs in a process
//! group of its own with bounded output ([`crate::child`]), and the timeout ends the group.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use super::discover::PluginCandidate;
use super::refusal::Refusal;
use super::sealed::LibraryImage;
use crate::error::PluginLoadErrorKind;

/// Opens a library somewhere it may crash (a child process) before this process opens it: gets
/// the candidate, the library as admission checked it and the libraries it preloads, and
/// returns why it must not be opened here
/// ([`EnvironmentBuilder::with_load_probe`](crate::EnvironmentBuilder::with_load_probe)).
pub type LoadProbe = Arc<
    dyn Fn(&PluginCandidate, &LibraryImage, &[LibraryImage]) -> std::result::Result<(), Refusal>
        + Send
        + Sync,
>;

/// The line a child prints when opening the library did not kill it, followed by ` ok` and
/// the number of EPs, or by ` refused KIND MESSAGE` ([`PluginLoadErrorKind::name`]).
pub const SURVIVED: &str = "epx-probe: survived";

/// The child's line for an outcome of [`PluginLibrary::open`](super::PluginLibrary::open).
pub fn outcome_line(outcome: &std::result::Result<usize, Refusal>) -> String {
    match outcome {
        Ok(eps) => format!("{SURVIVED} ok {eps}"),
        // One line: the message's own line breaks become spaces.
        Err(r) => format!(
            "{SURVIVED} refused {} {}",
            r.kind.name(),
            r.message.replace(['\n', '\r'], " ")
        ),
    }
}

/// The outcome a child's [`outcome_line`] reports; `None` for any other line.
fn parse_outcome(line: &str) -> Option<std::result::Result<(), Refusal>> {
    let rest = line.strip_prefix(SURVIVED)?.trim_start();
    if rest.starts_with("ok") {
        return Some(Ok(()));
    }
    let rest = rest.strip_prefix("refused ")?;
    let (kind, message) = rest.split_once(' ').unwrap_or((rest, ""));
    let kind = PluginLoadErrorKind::from_name(kind)?;
    Some(Err(Refusal::new(
        kind,
        format!("{message} (in a child process opening it first; it was not opened here)"),
    )))
}

/// The line a child prints, followed by why, when its copy of a file is not the one this process
/// checked (the file changed on disk in between): it opened nothing.
pub const UNCHECKED: &str = "epx-probe: unchecked";

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

/// A probe that runs `epx` (at `exe`) on each library.
pub fn child_process(exe: PathBuf) -> LoadProbe {
    Arc::new(
        move |_: &PluginCandidate, library: &LibraryImage, preloads: &[LibraryImage]| {
            probe(&exe, library, preloads, timeout())
        },
    )
}

/// The arguments naming a library and its preloads for a child (`probe-library`,
/// `serve-plugin`): `LIB [--sha256 D] [--preload DEP --preload-sha256 D|-]...`, and for a
/// hosted library ([`hosted`](super::hosted)) `--hosted-by ADAPTER --hosted-by-sha256 D|-
/// --onnxruntime V [--ort-ep ORT_NAME=EPX_NAME]...`.
pub fn library_args(cmd: &mut Command, library: &LibraryImage, preloads: &[LibraryImage]) {
    cmd.arg(&library.path);
    if let Some(d) = library.sha256() {
        cmd.arg("--sha256").arg(d);
    }
    for p in preloads {
        cmd.arg("--preload").arg(&p.path);
        cmd.arg("--preload-sha256").arg(p.sha256().unwrap_or("-"));
    }
    if let Some(h) = &library.hosted_by {
        cmd.arg("--hosted-by").arg(&h.adapter.path);
        cmd.arg("--hosted-by-sha256")
            .arg(h.adapter.sha256().unwrap_or("-"));
        cmd.arg("--onnxruntime").arg(&h.onnxruntime);
        cmd.arg("--hosted-name").arg(&h.name);
        cmd.arg("--hosted-version").arg(&h.version);
        for (ort, epx) in h.ep_names.iter().zip(&h.providers) {
            cmd.arg("--ort-ep").arg(format!("{ort}={epx}"));
        }
    }
}

/// The hosting part of [`library_args`], as a child parsed it.
#[derive(Clone, Debug, Default)]
pub struct HostedArgs {
    pub adapter: Option<PathBuf>,
    pub adapter_sha256: Option<String>,
    pub onnxruntime: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
    /// `ORT_NAME=EPX_NAME` per EP.
    pub ort_eps: Vec<String>,
}

/// The child's side of [`library_args`]: its own sealed copies of the library and the
/// preloads (and of the adapter hosting it), each refused when its SHA-256 is not the one given
/// (`-` or none: not checked).
pub fn images_from_args(
    library: &Path,
    sha256: Option<&str>,
    preloads: &[PathBuf],
    preload_sha256: &[String],
    hosted: &HostedArgs,
) -> Result<(LibraryImage, Vec<LibraryImage>), String> {
    let expected = |d: Option<&str>| d.filter(|d| *d != "-").map(str::to_string);
    let mut image = LibraryImage::checked(library, expected(sha256).as_deref())?;
    if let Some(adapter) = &hosted.adapter {
        let adapter = LibraryImage::checked(
            adapter,
            expected(hosted.adapter_sha256.as_deref()).as_deref(),
        )?;
        let mut ep_names = Vec::new();
        let mut providers = Vec::new();
        for pair in &hosted.ort_eps {
            let (ort, epx) = pair
                .split_once('=')
                .ok_or_else(|| format!("--ort-ep {pair}: expected ORT_NAME=EPX_NAME"))?;
            ep_names.push(ort.to_owned());
            providers.push(epx.to_owned());
        }
        image.hosted_by = Some(Arc::new(super::sealed::Hosting {
            adapter,
            ep_names,
            providers,
            onnxruntime: hosted.onnxruntime.clone().unwrap_or_default(),
            name: hosted.name.clone().unwrap_or_default(),
            version: hosted.version.clone().unwrap_or_default(),
        }));
    }
    let mut images = Vec::with_capacity(preloads.len());
    for (i, p) in preloads.iter().enumerate() {
        let d = expected(preload_sha256.get(i).map(String::as_str));
        images.push(LibraryImage::checked(p, d.as_deref())?);
    }
    Ok((image, images))
}

/// The `epx` executable for a library in `lib_dir`: `EPX_PROBE_EXE`, else `<lib_dir>/../bin/epx`
/// (an installed bundle, the Python wheel), else `<lib_dir>/epx` (a cargo build).
pub fn find_epx(lib_dir: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("EPX_PROBE_EXE") {
        return Some(PathBuf::from(p));
    }
    [lib_dir.join("../bin/epx"), lib_dir.join("epx")]
        .into_iter()
        .find(|p| p.is_file())
}

fn probe(
    exe: &Path,
    library: &LibraryImage,
    preloads: &[LibraryImage],
    limit: Duration,
) -> Result<(), Refusal> {
    let crashed = |why: String| Refusal::new(PluginLoadErrorKind::Crashed, why);
    let mut cmd = Command::new(exe);
    cmd.arg("probe-library");
    library_args(&mut cmd, library, preloads);
    let done = crate::child::run(
        &mut cmd,
        crate::child::Limits {
            deadline: limit,
            output: 1 << 20,
        },
    )
    .map_err(|e| {
        crashed(format!(
            "cannot start {} to open it in a child process: {e}",
            exe.display()
        ))
    })?;
    let Some(status) = done.status else {
        return Err(crashed(format!(
            "opening it did not finish within {:.0} s in a child process (hung; set \
             EPX_PROBE_TIMEOUT_S to wait longer), so it was not opened here",
            limit.as_secs_f64()
        )));
    };
    let out = done.stdout_text();
    if let Some(why) = out.lines().find_map(|l| l.strip_prefix(UNCHECKED)) {
        return Err(crashed(format!(
            "the child process could not probe it: {}; run again to check the new file",
            why.trim()
        )));
    }
    let outcome = out.lines().rev().find_map(parse_outcome);
    if status.success()
        && let Some(outcome) = outcome
    {
        return outcome;
    }
    let how = match exit_signal(&status) {
        Some(sig) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        None => format!("ended with {status}"),
    };
    let last = done.last_stderr_line();
    let last = if last.is_empty() {
        String::new()
    } else {
        format!("; it last said: {last}")
    };
    Err(crashed(format!(
        "the library is broken: a child process opening it {how}{last}. It was not opened here"
    )))
}

/// The signal that ended a process, if one did.
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
