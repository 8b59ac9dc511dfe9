//! `epx doctor`: per plugin, whether it loads and why not, and where each dependency is.

use std::process::ExitCode;
use std::sync::Arc;

use epx::Environment;
use epx::resolve::{self, DependencyStatus};

pub fn doctor(env: &Arc<Environment>) -> ExitCode {
    let mut broken = 0;
    println!("plugin search path:");
    for d in env.search_path() {
        println!("  {} ({:?})", d.path.display(), d.origin);
    }
    if env.search_path().is_empty() {
        println!("  (none: pass --plugin-dir or set EPX_PLUGIN_PATH)");
    }
    for problem in &env.discovery().problems {
        broken += 1;
        println!("\n✗ {}\n    {}", problem.path.display(), problem.error);
    }
    for candidate in &env.discovery().plugins {
        println!("\n{} — {}", candidate.name, candidate.library.display());
        match &candidate.manifest {
            Some(m) => println!(
                "    manifest: version {}, ABI {}, provides {}",
                m.version,
                m.abi,
                m.providers.join(", ")
            ),
            None => println!("    no plugin.toml (bare library)"),
        }
        let deps = candidate
            .manifest
            .as_ref()
            .map(|m| m.dependencies.as_slice())
            .unwrap_or(&[]);
        let mut deps_ok = true;
        match resolve::resolve_dependencies(&candidate.library, &candidate.dir, deps) {
            Ok(report) => {
                for e in &report.entries {
                    match &e.status {
                        DependencyStatus::Found { path, place } => {
                            println!("    ✓ {} → {} ({place})", e.name, path.display())
                        }
                        DependencyStatus::System { path } => println!(
                            "    ✓ {} → {} (system)",
                            e.name,
                            path.as_ref().map_or_else(
                                || "already loaded".to_string(),
                                |p| p.display().to_string()
                            )
                        ),
                        DependencyStatus::Missing { searched } => {
                            deps_ok &= e.optional;
                            let mark = if e.optional { "○ (optional)" } else { "✗" };
                            println!(
                                "    {mark} {} (needed by {}): not found; searched:",
                                e.name,
                                e.needed_by.display()
                            );
                            for s in searched {
                                println!("        {}", s.display());
                            }
                        }
                    }
                }
            }
            Err(e) => {
                deps_ok = false;
                println!("    ✗ cannot read dependencies: {e}");
            }
        }
        if !deps_ok {
            broken += 1;
            println!(
                "    ✗ not loadable until the missing libraries are installed or their folder is given in EPX_LIBRARY_PATH"
            );
            continue;
        }
        match env.load(candidate) {
            Ok(lib) => {
                let abi = lib.abi_version;
                println!(
                    "    ✓ loads: plugin {} {}, ABI {}.{}",
                    lib.name, lib.version, abi.major, abi.minor
                );
                for p in &lib.providers {
                    match &p.availability {
                        Ok(()) => println!("    ✓ EP {} {} available", p.name, p.version),
                        Err(reason) => {
                            println!("    ○ EP {} {} not available: {reason}", p.name, p.version)
                        }
                    }
                }
            }
            Err(e) => {
                broken += 1;
                println!("    ✗ {e}");
            }
        }
    }
    println!();
    if broken == 0 {
        println!("all plugins OK");
        ExitCode::SUCCESS
    } else {
        println!("{broken} problem(s) found");
        ExitCode::FAILURE
    }
}
