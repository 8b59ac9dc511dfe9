//! `epx`: the operator's tool. Lists the EPs plugins provide, checks plugins and their
//! dependencies, and runs models.

#![forbid(unsafe_code)]

mod compare;
mod conformance;
mod doctor;
mod probe;
mod run;
mod scaffold;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use epx::Environment;

#[derive(Parser)]
#[command(
    name = "epx",
    version,
    about = "Run ONNX models on execution providers shipped as plugins"
)]
struct Cli {
    /// Plugin folder searched before EPX_PLUGIN_PATH and the default location (repeatable).
    #[arg(long = "plugin-dir", global = true, value_name = "DIR")]
    plugin_dirs: Vec<PathBuf>,
    /// Also look for ONNX Runtime plugin-EP packages installed with pip in every Python
    /// environment epx sees (VIRTUAL_ENV, CONDA_PREFIX, PYTHONPATH, the user's and the
    /// system's), not only the one this `epx` is installed in. A package is imported (in a
    /// child Python) only when its EPs are wanted. EPX_PYTHON_EPS=0|own|1 overrides.
    #[arg(long = "python-eps", global = true)]
    python_eps: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every EP found: plugin, library, version, available or why not.
    Providers(ProvidersArgs),
    /// Check every plugin: manifest, ABI, each dependency found where or missing.
    Doctor,
    /// Show where each node of a model would run: EP, fused kernels, copies, fallbacks.
    Partition(run::PartitionArgs),
    /// Run a model and print (or save) its outputs.
    Run(run::RunArgs),
    /// Run a model on the CPU EP alone and on other EP lists; show per output how far each is,
    /// and the first node that diverges.
    Compare(compare::CompareArgs),
    /// Test an EP on the ONNX node tests and on models: per op what it claimed, passed, got
    /// wrong, crashed on or declined; each batch of cases runs in a child process.
    Conformance(conformance::ConformanceArgs),
    /// List or clear what epx keeps between runs: compiled kernels and measured EP choices.
    Cache(cache::CacheArgs),
    /// Write a new plugin folder (Rust or C) that builds and passes `epx conformance`.
    NewPlugin(scaffold::NewPluginArgs),
    /// Serve a model repository over the Open Inference Protocol (KServe v2, REST).
    Serve(serve::ServeArgs),
    /// Open one plugin library and report surviving it (run by `providers` and `doctor`, in a
    /// child process, before they open a library themselves).
    #[command(hide = true)]
    ProbeLibrary(probe::ProbeArgs),
    /// Host one plugin library's EP for an isolated session, over the pipes and shared memory
    /// its parent set up (see `epx::plugin::isolate`).
    #[command(hide = true)]
    ServePlugin(probe::ServeArgs),
}

#[derive(clap::Args)]
struct ProvidersArgs {
    /// Also list, under each EP, the devices it can run on (kind, name, memory, driver, and why
    /// a present device cannot be used), with the name a session asks for it by.
    #[arg(long)]
    devices: bool,
}

/// Output cut short by a closed pipe (`epx providers | head`) ends the program quietly; any other
/// panic is reported in one line, never as a Rust backtrace.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error{at}: {msg}; please report it");
    }));
}

fn main() -> ExitCode {
    install_panic_hook();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log piped to a file or another program stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The version line names the plugin ABI too: what a plugin author needs to build against.
    let version: &'static str = Box::leak(
        format!(
            "{} (plugin ABI {})",
            env!("CARGO_PKG_VERSION"),
            epx::plugin_abi_version()
        )
        .into_boxed_str(),
    );
    let cli = match Cli::command()
        .version(version)
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Every plugin is opened in a child process first (the bytes admission checked and this
    // process will map), so one that crashes the loader is reported, not fatal.
    // Python packages: those installed beside this `epx` (the wheel's environment) were put
    // there for it; others only when asked for.
    let mut builder = Environment::builder()
        .with_plugin_dirs(cli.plugin_dirs)
        .with_python_eps(if cli.python_eps {
            epx::PythonEps::All
        } else {
            epx::PythonEps::Own
        });
    if let Ok(exe) = std::env::current_exe() {
        // Isolated EPs run in this same executable (`epx serve-plugin`).
        builder = builder.with_epx_executable(exe);
    }
    let builder = match cli.command {
        Command::ProbeLibrary(args) => return probe::child(args),
        Command::ServePlugin(args) => return probe::serve(args),
        _ => builder.with_load_probe(probe::load_probe()),
    };
    let result = builder.commit().and_then(|env| match cli.command {
        Command::Providers(args) => providers(&env, args.devices).map(|()| ExitCode::SUCCESS),
        Command::Doctor => Ok(doctor::doctor(&env)),
        Command::Partition(args) => run::partition(env, args).map(|()| ExitCode::SUCCESS),
        Command::Run(args) => run::run(env, args).map(|()| ExitCode::SUCCESS),
        Command::NewPlugin(args) => scaffold::new_plugin(args).map(|()| ExitCode::SUCCESS),
        Command::Cache(args) => cache::cache(&env, args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::serve(env, args).map(|()| ExitCode::SUCCESS),
        Command::Conformance(args) => conformance::conformance(env, args).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            }
        }),
        Command::ProbeLibrary(_) | Command::ServePlugin(_) => {
            unreachable!("handled before the environment is built")
        }
        Command::Compare(args) => compare::compare(env, args).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            }
        }),
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", epx::printable_lines(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// `println!` with names from plugins made safe for a terminal.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{}", epx::printable_lines(&format!($($arg)*)))
    };
}

// After `say!`, which it uses.
mod cache;

/// The device lines printed under an EP by `epx providers --devices`.
fn device_lines(p: &epx::plugin::ProviderDescription) -> Vec<String> {
    if let Some(e) = &p.devices_error {
        return vec![format!("    devices could not be listed: {e}")];
    }
    if p.devices.is_empty() {
        return vec!["    (lists no devices)".into()];
    }
    p.devices
        .iter()
        .map(|d| {
            let mut what = vec![d.vendor.clone(), d.name.clone()];
            what.retain(|s| !s.is_empty());
            let mut detail = Vec::new();
            if let Some(m) = d.memory_bytes {
                detail.push(format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64));
            }
            if !d.driver_version.is_empty() {
                detail.push(format!("driver {}", d.driver_version));
            }
            let detail = if detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", detail.join(", "))
            };
            let status = match &d.unusable {
                None => "ok".to_string(),
                Some(why) => format!("unusable: {why}"),
            };
            format!(
                "    {:<20} {:<5} {}{detail} — {status}",
                d.selector(&p.name),
                d.kind,
                what.join(" ")
            )
        })
        .collect()
}

fn providers(env: &Arc<Environment>, devices: bool) -> epx::Result<()> {
    say!(
        "{:<16} {:<12} {:<10} {:<9} library / reason",
        "EP",
        "plugin",
        "version",
        "status"
    );
    let builtin = env.builtin();
    for p in &builtin.providers {
        say!(
            "{:<16} {:<12} {:<10} {:<9} (linked into epx)",
            p.name,
            epx::BUILTIN_PLUGIN,
            p.version,
            "ok"
        );
        if devices {
            for l in device_lines(p) {
                say!("{l}");
            }
        }
    }
    let shadowed = &env.discovery().shadowed;
    let mut shown = vec![false; shadowed.len()];
    let shadowed_by = |s: &epx::plugin::discover::ShadowedProvider| {
        format!(
            "shadowed by plugin {} ({}), found first on the search path",
            s.winner,
            s.winner_library.display()
        )
    };
    for (candidate, lib) in env.load_all() {
        match lib {
            Ok(lib) => {
                for p in &lib.providers {
                    let shadow = shadowed.iter().position(|s| {
                        s.provider == p.name && s.shadowed_library == candidate.library
                    });
                    let (status, detail) = match (&p.availability, shadow) {
                        (Ok(()), None) => ("ok", lib.origin()),
                        (Err(reason), None) => {
                            ("no", format!("{} — not available: {reason}", lib.origin()))
                        }
                        (availability, Some(i)) => {
                            shown[i] = true;
                            let mut detail =
                                format!("{} — {}", lib.origin(), shadowed_by(&shadowed[i]));
                            if let Err(reason) = availability {
                                detail.push_str(&format!("; not available: {reason}"));
                            }
                            ("shadowed", detail)
                        }
                    };
                    say!(
                        "{:<16} {:<12} {:<10} {:<9} {detail}",
                        p.name,
                        lib.name,
                        p.version,
                        status
                    );
                    if devices {
                        for l in device_lines(p) {
                            say!("{l}");
                        }
                    }
                }
            }
            Err(e) => {
                let eps = candidate
                    .manifest
                    .as_ref()
                    .map_or_else(|| candidate.name.clone(), |m| m.providers.join(","));
                say!(
                    "{:<16} {:<12} {:<10} {:<9} {e}",
                    eps,
                    candidate.name,
                    "-",
                    "broken"
                );
            }
        }
    }
    // EPs claimed in a manifest but not in a row above (the plugin is broken, or its library
    // does not provide the EP after all).
    for (s, _) in shadowed.iter().zip(&shown).filter(|(_, shown)| !**shown) {
        say!(
            "{:<16} {:<12} {:<10} {:<9} {} — {}",
            s.provider,
            s.shadowed,
            "-",
            "shadowed",
            s.shadowed_library.display(),
            shadowed_by(s)
        );
    }
    for problem in &env.discovery().problems {
        say!(
            "{:<16} {:<12} {:<10} {:<9} {}: {}",
            "-",
            "-",
            "-",
            "refused",
            problem.path.display(),
            problem.error
        );
    }
    Ok(())
}
