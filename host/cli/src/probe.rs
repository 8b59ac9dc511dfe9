//! Opening each plugin library in a child process before this one opens it, so a library that
//! crashes the loader (a corrupt file, a constructor that faults, an `ld.so` assertion) or hangs
//! is reported as broken and `epx providers` / `epx doctor` go on with the others.
//!
//! The child is `epx` itself (`epx probe-library LIB --preload DEP ...`, hidden): it opens the
//! library exactly as loading does (dependencies preloaded first, entry called, EPs asked whether
//! they are available) and prints one line saying it got through. The parent's side is
//! [`epx::plugin::probe`], which libepx uses too.

use std::path::PathBuf;
use std::process::ExitCode;

use epx::plugin::PluginLibrary;
use epx::plugin::probe::SURVIVED;

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

#[derive(clap::Args)]
pub struct ServeArgs {
    library: PathBuf,
    /// A library to open first (repeatable, in order).
    #[arg(long = "preload", value_name = "LIB")]
    preloads: Vec<PathBuf>,
    /// The descriptor of the memory shared with the parent.
    #[arg(long = "shm-fd", value_name = "FD")]
    shm_fd: i32,
}

/// An isolated EP's process: serves its parent until the parent closes the pipe.
pub fn serve(args: ServeArgs) -> ExitCode {
    let code = epx::plugin::isolate::serve(&args.library, &args.preloads, args.shm_fd);
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
            std::sync::Arc::new(move |_: &_, _: &[PathBuf]| Err(why.clone()))
        }
    }
}
