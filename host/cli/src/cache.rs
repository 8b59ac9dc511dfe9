//! `epx cache list|clear`: what the compiled-kernel cache and the `measure` policy keep.

use epx::Environment;
use epx::cache::KernelCache;

#[derive(clap::Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    action: CacheAction,
}

#[derive(clap::Subcommand)]
enum CacheAction {
    /// List the stored kernels and recorded partitions (EP, plugin, nodes, size, last use) and
    /// remembered EP choices.
    List,
    /// Delete every stored kernel, recorded partition and remembered EP choice.
    Clear,
}

fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn age(t: std::time::SystemTime) -> String {
    let Ok(d) = t.elapsed() else {
        return "just now".into();
    };
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86400),
    }
}

pub fn cache(env: &Environment, args: CacheArgs) -> epx::Result<()> {
    let Some(root) = env.cache_dir() else {
        return Err(epx::Error::InvalidInput(
            "no cache folder: set EPX_CACHE_DIR (or HOME)".into(),
        ));
    };
    let kernels = env
        .kernel_cache()
        .unwrap_or_else(|| KernelCache::new(&root, epx::cache::DEFAULT_MAX_BYTES));
    let io = |e: std::io::Error| epx::Error::InvalidInput(format!("{}: {e}", root.display()));
    let choices = epx::cache::measured_choices(&root).map_err(io)?;
    match args.action {
        CacheAction::List => {
            let entries = kernels.entries().map_err(io)?;
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            let state = if env.kernel_cache().is_some() {
                format!("limit {}", size(kernels.max_bytes()))
            } else {
                "switched off".to_string()
            };
            say!(
                "kernel cache: {} ({state}); {} entries, {}",
                kernels.dir().display(),
                entries.len(),
                size(total)
            );
            if !entries.is_empty() {
                say!(
                    "  {:<16}  {:<9}  {:<12}  {:<24}  {:>5}  {:>10}  LAST USED",
                    "ENTRY",
                    "KIND",
                    "EP",
                    "PLUGIN",
                    "NODES",
                    "SIZE"
                );
            }
            for e in &entries {
                let key = &e.key[..e.key.len().min(16)];
                match &e.meta {
                    Ok(m) => say!(
                        "  {key:<16}  {:<9}  {:<12}  {:<24}  {:>5}  {:>10}  {}",
                        m.kind,
                        m.provider,
                        m.plugin,
                        m.nodes,
                        size(e.bytes),
                        age(e.last_used)
                    ),
                    Err(why) => say!(
                        "  {key:<16}  unreadable ({why}); the next session to look it up deletes it"
                    ),
                }
            }
            say!(
                "measured EP choices: {} ({} entries)",
                root.join("selection").display(),
                choices.len()
            );
        }
        CacheAction::Clear => {
            let (n, bytes) = kernels.clear().map_err(io)?;
            for c in &choices {
                std::fs::remove_file(c).map_err(io)?;
            }
            say!(
                "removed {n} entries ({}) and {} measured EP choices from {}",
                size(bytes),
                choices.len(),
                root.display()
            );
        }
    }
    Ok(())
}
