//! The doctor report (`epx doctor`, `epx_env_doctor` in the C API): the plugin search path, and per
//! plugin the admission report loading used ([`crate::plugin::admit`]): whether it loads and why
//! not, whether its library matches the manifest's `sha256` pin, where each dependency is, and
//! which EP names more than one plugin claims.

use std::fmt::Write as _;

use epx_plugin_api::abi::{EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR};

use crate::error::PluginLoadErrorKind;
use crate::plugin::admit::compare_with_manifest;
use crate::plugin::resolve::DependencyStatus;
use crate::session::Environment;

/// The report text, and whether every plugin found is usable (shadowed EPs are warnings, not
/// problems).
pub fn report(env: &Environment) -> (String, bool) {
    // Each plugin opened first in a child (with the environment's probe), all at once.
    env.probe_all();
    let mut out = String::new();
    let mut broken = 0;
    let _ = writeln!(
        out,
        "host: epx {}, plugin ABI {EPX_ABI_VERSION_MAJOR}.{EPX_ABI_VERSION_MINOR}",
        env!("CARGO_PKG_VERSION")
    );
    let _ = match crate::plugin::resolve::installation_site_packages() {
        Some(dir) => writeln!(
            out,
            "Python environment: {} (where this epx is installed; searched first for the \
             libraries plugins link to)",
            dir.display()
        ),
        None => writeln!(
            out,
            "Python environment: none of its own (this epx is not installed in a \
             site-packages folder; VIRTUAL_ENV, CONDA_PREFIX, PYTHONPATH and python3's are searched)"
        ),
    };
    let _ = writeln!(out, "plugin search path:");
    for d in env.search_path() {
        let _ = writeln!(out, "  {} ({:?})", d.path.display(), d.origin);
    }
    if env.search_path().is_empty() {
        let _ = writeln!(out, "  (none: pass --plugin-dir or set EPX_PLUGIN_PATH)");
    }
    for problem in &env.discovery().problems {
        broken += 1;
        let _ = writeln!(out, "\n✗ {}\n    {}", problem.path.display(), problem.error);
    }
    // Not a failure (both plugins are offered), but which one runs depends on the search order.
    let mut warnings = env.discovery().shadowed.len();
    for s in &env.discovery().shadowed {
        let _ = writeln!(
            out,
            "\n! EP {} is claimed by two plugins\n    {s}",
            s.provider
        );
    }
    for candidate in &env.discovery().plugins {
        let _ = writeln!(
            out,
            "\n{} — {}",
            candidate.name,
            candidate.library.display()
        );
        match &candidate.manifest {
            Some(m) => {
                let _ = writeln!(
                    out,
                    "    manifest: version {}, ABI {}, provides {}",
                    m.version,
                    m.abi,
                    m.providers.join(", ")
                );
            }
            None => {
                let _ = writeln!(out, "    no plugin.toml (bare library)");
            }
        }
        // The same admission loading runs (and caches): doctor shows what loading decided.
        let (admission, loaded) = env.admission(candidate);
        if let Some(digest) = &admission.sha256 {
            let _ = writeln!(out, "    ✓ sha256 matches the pin ({digest})");
        }
        let mut deps_ok = true;
        for e in admission.dependencies.iter().flat_map(|d| &d.entries) {
            match &e.status {
                DependencyStatus::Found { path, place } => {
                    let _ = writeln!(out, "    ✓ {} → {} ({place})", e.name, path.display());
                }
                DependencyStatus::System { path } => {
                    let _ = writeln!(
                        out,
                        "    ✓ {} → {} (system)",
                        e.name,
                        path.as_ref().map_or_else(
                            || "already loaded".to_string(),
                            |p| p.display().to_string()
                        )
                    );
                }
                DependencyStatus::Missing { searched } => {
                    deps_ok &= e.optional;
                    let mark = if e.optional { "○ (optional)" } else { "✗" };
                    let _ = writeln!(
                        out,
                        "    {mark} {} (needed by {}): not found; searched:",
                        e.name,
                        e.needed_by.display()
                    );
                    for s in searched {
                        let _ = writeln!(out, "        {}", s.display());
                    }
                }
            }
        }
        if let Some(refusal) = &admission.refusal {
            broken += 1;
            if refusal.kind == PluginLoadErrorKind::MissingDependency && !deps_ok {
                let _ = writeln!(
                    out,
                    "    ✗ not loadable until the missing libraries are installed or their folder is given in EPX_LIBRARY_PATH"
                );
            } else {
                let _ = writeln!(out, "    ✗ {}", refusal.message);
            }
            continue;
        }
        match loaded {
            Ok(lib) => {
                let abi = lib.abi_version;
                let _ = writeln!(
                    out,
                    "    ✓ loads: plugin {} {}, ABI {}.{}",
                    lib.name, lib.version, abi.major, abi.minor
                );
                // The digest of the bytes that were checked and loaded (a sealed copy).
                if let Some(d) = lib.loaded_sha256() {
                    let _ = writeln!(out, "    ✓ loaded from a sealed copy, sha256 {d}");
                }
                if let Some(m) = &candidate.manifest {
                    for w in compare_with_manifest(m, &lib).abi_warnings {
                        warnings += 1;
                        let _ = writeln!(out, "    ! {w}");
                    }
                }
                for p in &lib.providers {
                    match &p.availability {
                        Ok(()) => {
                            let _ = writeln!(out, "    ✓ EP {} {} available", p.name, p.version);
                        }
                        Err(reason) => {
                            let _ = writeln!(
                                out,
                                "    ○ EP {} {} not available: {reason}",
                                p.name, p.version
                            );
                        }
                    }
                    if let Some(s) = env.discovery().shadowing(&candidate.library, &p.name) {
                        let _ = writeln!(
                            out,
                            "    ! EP {} is shadowed: plugin {} ({}) provides it first",
                            p.name,
                            s.winner,
                            s.winner_library.display()
                        );
                    }
                }
            }
            Err(e) => {
                broken += 1;
                let _ = writeln!(out, "    ✗ {e}");
            }
        }
    }
    let _ = writeln!(out);
    let warnings = if warnings == 0 {
        String::new()
    } else {
        format!(", {warnings} warning(s)")
    };
    if broken == 0 {
        let _ = writeln!(out, "all plugins OK{warnings}");
    } else {
        let _ = writeln!(out, "{broken} problem(s) found{warnings}");
    }
    (out, broken == 0)
}
