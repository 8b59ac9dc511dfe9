//! Opening a plugin library in a child process before this process opens it: a library that
//! crashes the loader (a corrupt file, a constructor that faults, an `ld.so` assertion) or hangs
//! kills or stalls the child, and is refused here with the signal or exit status
//! ([`PluginLoadErrorKind::Crashed`](crate::error::PluginLoadErrorKind::Crashed)).
//!
//! The child is the `epx` executable: `epx probe-library LIB --sha256 D [--preload DEP
//! --preload-sha256 D]...` opens the library as loading does and prints [`SURVIVED`]. It opens
//! its own sealed copy of each file and refuses one whose SHA-256 is not the one this process
//! checked ([`super::sealed`]), so the child runs the bytes this process will run, whatever
//! happens to the files on disk. `epx providers` / `epx doctor` re-run themselves; libepx looks
//! for `epx` beside itself ([`find_epx`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::discover::PluginCandidate;
use super::sealed::LibraryImage;

/// Opens a library somewhere it may crash (a child process) before this process opens it: gets
/// the candidate, the library as admission checked it and the libraries it preloads, and
/// returns why it must not be opened here
/// ([`EnvironmentBuilder::with_load_probe`](crate::EnvironmentBuilder::with_load_probe)).
pub type LoadProbe = Arc<
    dyn Fn(&PluginCandidate, &LibraryImage, &[LibraryImage]) -> std::result::Result<(), String>
        + Send
        + Sync,
>;

/// The line a child prints when opening the library did not kill it.
pub const SURVIVED: &str = "epx-probe: survived";

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
) -> Result<(), String> {
    let mut cmd = Command::new(exe);
    cmd.arg("probe-library");
    library_args(&mut cmd, library, preloads);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} to open it in a child process: {e}",
                exe.display()
            )
        })?;
    // Both pipes are drained on threads so a chatty library cannot block the child.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(1 << 20).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
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
    if let Some(why) = out.lines().find_map(|l| l.strip_prefix(UNCHECKED)) {
        return Err(format!(
            "the child process could not probe it: {}; run again to check the new file",
            why.trim()
        ));
    }
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
