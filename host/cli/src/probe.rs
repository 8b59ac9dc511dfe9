//! Opening each plugin library in a child process before this one opens it, so a library that
//! crashes the loader (a corrupt file, a constructor that faults, an `ld.so` assertion) or hangs
//! is reported as broken and `epx providers` / `epx doctor` go on with the others.
//!
//! The child is `epx` itself (`epx probe-library LIB --preload DEP ...`, hidden): it opens the
//! library exactly as loading does (dependencies preloaded first, entry called, EPs asked whether
//! they are available) and prints one line saying it got through, with the outcome, which is
//! the parent's. The parent's side is [`epx::plugin::probe`], which libepx uses too.

use std::path::PathBuf;
use std::process::ExitCode;

use epx::plugin::PluginLibrary;
use epx::plugin::probe::{UNCHECKED, outcome_line};

/// A library and its preloads as a parent names them to a child: paths, and the SHA-256 each
/// must have (what the parent checked).
#[derive(clap::Args)]
pub struct LibraryArgs {
    library: PathBuf,
    /// The SHA-256 the library must have.
    #[arg(long = "sha256", value_name = "HEX")]
    sha256: Option<String>,
    /// A library to open first (repeatable, in order).
    #[arg(long = "preload", value_name = "LIB")]
    preloads: Vec<PathBuf>,
    /// The SHA-256 of each preload, in order (`-`: not checked).
    #[arg(long = "preload-sha256", value_name = "HEX")]
    preload_sha256: Vec<String>,
    /// The library is an ONNX Runtime plugin-EP library that this adapter opens.
    #[arg(long = "hosted-by", value_name = "ADAPTER")]
    hosted_by: Option<PathBuf>,
    /// The SHA-256 the adapter must have (`-`: not checked).
    #[arg(long = "hosted-by-sha256", value_name = "HEX")]
    hosted_by_sha256: Option<String>,
    /// The oldest ONNX Runtime the hosted library works with.
    #[arg(long = "onnxruntime", value_name = "VERSION")]
    onnxruntime: Option<String>,
    /// The hosted plugin's name.
    #[arg(long = "hosted-name", value_name = "NAME")]
    hosted_name: Option<String>,
    /// The hosted plugin's version.
    #[arg(long = "hosted-version", value_name = "VERSION")]
    hosted_version: Option<String>,
    /// A hosted EP: ONNX Runtime's name and epx's (repeatable, in order).
    #[arg(long = "ort-ep", value_name = "ORT_NAME=EPX_NAME")]
    ort_eps: Vec<String>,
}

impl LibraryArgs {
    fn images(
        &self,
    ) -> Result<
        (
            epx::plugin::sealed::LibraryImage,
            Vec<epx::plugin::sealed::LibraryImage>,
        ),
        String,
    > {
        epx::plugin::probe::images_from_args(
            &self.library,
            self.sha256.as_deref(),
            &self.preloads,
            &self.preload_sha256,
            &epx::plugin::probe::HostedArgs {
                adapter: self.hosted_by.clone(),
                adapter_sha256: self.hosted_by_sha256.clone(),
                onnxruntime: self.onnxruntime.clone(),
                name: self.hosted_name.clone(),
                version: self.hosted_version.clone(),
                ort_eps: self.ort_eps.clone(),
            },
        )
    }
}

#[derive(clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    library: LibraryArgs,
}

/// The child's side: open, and say how it went (the parent takes that outcome as its own).
pub fn child(args: ProbeArgs) -> ExitCode {
    let (library, preloads) = match args.library.images() {
        Ok(images) => images,
        // Not the bytes the parent checked: nothing was opened, and the parent must not open
        // its copy on the strength of this probe.
        Err(why) => {
            println!("{UNCHECKED} {why}");
            return ExitCode::SUCCESS;
        }
    };
    let outcome = PluginLibrary::open(&library, &preloads).map(|lib| lib.providers.len());
    println!("{}", outcome_line(&outcome));
    ExitCode::SUCCESS
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    library: LibraryArgs,
    /// The descriptor of the memory shared with the parent.
    #[arg(long = "shm-fd", value_name = "FD")]
    shm_fd: i32,
}

/// An isolated EP's process: serves its parent until the parent closes the pipe.
pub fn serve(args: ServeArgs) -> ExitCode {
    let code = epx::plugin::isolate::serve(args.library.images(), args.shm_fd);
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}

/// The probe handed to the environment: this executable, re-run.
pub fn load_probe() -> epx::LoadProbe {
    match std::env::current_exe() {
        Ok(exe) => epx::plugin::probe::child_process(exe),
        Err(e) => {
            let why = format!(
                "cannot find epx's own executable to open the library in a child process: {e}"
            );
            std::sync::Arc::new(move |_: &_, _: &_, _: &[_]| {
                Err(epx::plugin::refusal::Refusal::new(
                    epx::PluginLoadErrorKind::Crashed,
                    why.clone(),
                ))
            })
        }
    }
}
