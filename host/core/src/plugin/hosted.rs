//! ONNX Runtime plugin-EP libraries (a manifest with `[onnxruntime_ep]`), hosted through epx's
//! ONNX Runtime adapter.
//!
//! The vendor's library is the plugin's library as far as admission goes: its ownership, its
//! `sha256` pin and its dependencies are checked, and it is sealed, like any epx plugin's. It is
//! not an epx plugin, so what the host opens is the adapter (`libepx_ort_plugin_ep.so`, shipped
//! with epx and checked the same way), through its entry with settings
//! ([`EPX_PLUGIN_ENTRY_WITH_SETTINGS_SYMBOL`](epx_plugin_api::abi::EPX_PLUGIN_ENTRY_WITH_SETTINGS_SYMBOL)):
//! the settings name the sealed copy of the vendor's library, which ONNX Runtime then registers
//! (`RegisterExecutionProviderLibrary`), so the bytes checked are the bytes that run.
//!
//! The adapter is looked for, in order: `EPX_ORT_EP_ADAPTER` (the file), the `adapters` folder
//! next to each default plugin folder a program named (libepx: `<its folder>/epx/adapters`),
//! `<exe dir>/../lib/epx/adapters` (an installed bundle) and `<exe dir>` (a cargo build).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The environment variable naming the adapter's file.
pub const ADAPTER_ENV: &str = "EPX_ORT_EP_ADAPTER";

/// The adapter's file name on this OS.
pub fn adapter_file_name() -> &'static str {
    if cfg!(target_os = "windows") {
        "epx_ort_plugin_ep.dll"
    } else if cfg!(target_os = "macos") {
        "libepx_ort_plugin_ep.dylib"
    } else {
        "libepx_ort_plugin_ep.so"
    }
}

/// Adapter folders added by programs ([`add_adapter_dirs`]).
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Adds folders to look for the adapter in: for each default plugin folder `<x>/plugins` a
/// program names, `<x>/adapters`.
pub fn add_adapter_dirs_for(plugin_dirs: &[PathBuf]) {
    let mut dirs = DIRS.lock().unwrap_or_else(|p| p.into_inner());
    for d in plugin_dirs {
        if let Some(parent) = d.parent() {
            let a = parent.join("adapters");
            if !dirs.contains(&a) {
                dirs.push(a);
            }
        }
    }
}

/// Every place the adapter is looked for, in order.
pub fn adapter_candidates() -> Vec<PathBuf> {
    let name = adapter_file_name();
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os(ADAPTER_ENV) {
        out.push(PathBuf::from(p));
    }
    for d in DIRS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        out.push(d.join(name));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        out.push(exe_dir.join("../lib/epx/adapters").join(name));
        out.push(exe_dir.join(name));
    }
    out
}

/// The adapter's file, or why it was not found (every place looked).
pub fn locate_adapter() -> Result<PathBuf, String> {
    let candidates = adapter_candidates();
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(std::fs::canonicalize(found).unwrap_or_else(|_| found.clone()));
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "it is an ONNX Runtime plugin-EP library, which epx hosts through its ONNX Runtime \
         adapter ({}), and that was not found; looked in: {} (set {ADAPTER_ENV} to its path)",
        adapter_file_name(),
        looked.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_folders_sit_beside_the_default_plugin_folders() {
        add_adapter_dirs_for(&[PathBuf::from("/opt/x/lib/epx/plugins")]);
        let c = adapter_candidates();
        assert!(
            c.contains(&PathBuf::from("/opt/x/lib/epx/adapters").join(adapter_file_name())),
            "{c:?}"
        );
        let err = locate_adapter().err();
        if let Some(e) = err {
            assert!(
                e.contains("/opt/x/lib/epx/adapters") && e.contains(ADAPTER_ENV),
                "{e}"
            );
        }
    }
}
