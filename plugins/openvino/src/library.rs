//! Finding and opening OpenVINO's C library (`libopenvino_c.so`).
//!
//! `openvino-sys` is built with `runtime-linking`: nothing links against OpenVINO, and the C
//! functions are looked up in whichever library `openvino_sys::library::load_from` opened. Its
//! own finder only knows unversioned names and system folders, while the `openvino` Python
//! wheel ships `openvino/libs/libopenvino_c.so.<N>` only, so this module does the search and
//! hands the exact file to `load_from`. That library's `$ORIGIN` run path finds the core
//! (`libopenvino.so.<N>`), the device plugins and oneTBB next to it.
//!
//! The library is opened once per process (`openvino-sys` keeps it in a static) and never
//! closed; asking for a different file afterwards is an error rather than a silent mix.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A file path (or a folder holding the library) to use; takes precedence over any search.
pub const ENV_LIBRARY: &str = "EPX_OPENVINO_LIBRARY";
/// Extra folders to search, a path list (`:`-separated), searched before the plugin folder and
/// the Python wheels.
pub const ENV_SEARCH_PATH: &str = "EPX_OPENVINO_SEARCH_PATH";

/// The base name of the C library; versioned names (`libopenvino_c.so.2641`) match too.
const LIBRARY_BASE: &str = "libopenvino_c.so";

/// The library this process opened.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub path: PathBuf,
    /// OpenVINO's build number, e.g. `2026.4.1-22982-...`.
    pub version: String,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

/// Opens the library (once per process) and returns it. `explicit` is the provider option
/// `library`: a file, or a folder holding the library. Without it, `EPX_OPENVINO_LIBRARY`, then
/// the search of [`locate`]. An explicit path that names a different file than the one already
/// open is an error.
pub fn ensure_loaded(explicit: Option<&str>) -> Result<Loaded, String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = loaded.as_ref() {
        if let Some(value) = explicit {
            let wanted = locate_explicit("option `library`", value)?;
            if !same_file(&wanted, &l.path) {
                return Err(format!(
                    "option `library`: {} was asked for, but this process already opened OpenVINO \
                     from {}; one process can use only one OpenVINO library",
                    wanted.display(),
                    l.path.display()
                ));
            }
        }
        return Ok(l.clone());
    }
    let path = locate(explicit)?;
    openvino_sys::library::load_from(path.clone())
        .map_err(|e| format!("cannot open OpenVINO's C library {}: {e}", path.display()))?;
    let version = crate::ov::version()?;
    let l = Loaded { path, version };
    *loaded = Some(l.clone());
    Ok(l)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Finds the C library: option `library` or else `EPX_OPENVINO_LIBRARY` when given (only
/// there); otherwise the first folder holding one among `EPX_OPENVINO_SEARCH_PATH`, the plugin's
/// own folder, the `openvino/libs/` folder of the `site-packages` the plugin is installed in, and
/// that of the `openvino` Python wheel in the usual
/// `site-packages`. The error names every place searched.
pub fn locate(explicit: Option<&str>) -> Result<PathBuf, String> {
    if let Some(value) = explicit {
        return locate_explicit("option `library`", value);
    }
    if let Some(value) = std::env::var_os(ENV_LIBRARY).filter(|v| !v.is_empty()) {
        return locate_explicit(ENV_LIBRARY, &value.to_string_lossy());
    }
    let places = search_places();
    for (_, dir) in &places {
        if let Some(found) = library_in(dir) {
            return Ok(found);
        }
    }
    let listed: Vec<String> = places
        .iter()
        .map(|(why, dir)| format!("{} ({why})", dir.display()))
        .collect();
    Err(format!(
        "OpenVINO's C library ({LIBRARY_BASE} or {LIBRARY_BASE}.*) was not found; searched: {}. \
         Install the `openvino` Python wheel, or point the provider option `library` or \
         {ENV_LIBRARY} at the file, or {ENV_SEARCH_PATH} at its folder",
        if listed.is_empty() {
            "(nothing)".to_string()
        } else {
            listed.join(", ")
        }
    ))
}

/// A path the user gave: the file itself, or a folder to look in.
fn locate_explicit(source: &str, value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_dir() {
        return library_in(&path).ok_or_else(|| {
            format!(
                "{source}: the folder {} holds no {LIBRARY_BASE} or {LIBRARY_BASE}.* (the only place \
                 searched when {source} is set)",
                path.display()
            )
        });
    }
    if path.is_file() {
        return Ok(path);
    }
    Err(format!(
        "{source}: {} does not exist (the only place searched when {source} is set)",
        path.display()
    ))
}

/// The library in `dir`: `libopenvino_c.so` itself, else the versioned name with the highest
/// version.
fn library_in(dir: &Path) -> Option<PathBuf> {
    let plain = dir.join(LIBRARY_BASE);
    if plain.is_file() {
        return Some(plain);
    }
    let mut versioned: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let suffix = name.strip_prefix(LIBRARY_BASE)?.strip_prefix('.')?;
            let version: Option<Vec<u64>> = suffix.split('.').map(|p| p.parse().ok()).collect();
            let path = e.path();
            path.is_file().then_some((version?, path))
        })
        .collect();
    versioned.sort();
    versioned.pop().map(|(_, p)| p)
}

/// The folders searched when no file is given, in order, each with why it is searched.
fn search_places() -> Vec<(String, PathBuf)> {
    let mut places: Vec<(String, PathBuf)> = Vec::new();
    let mut push = |why: &str, dir: PathBuf| {
        if !places.iter().any(|(_, d)| *d == dir) {
            places.push((why.to_string(), dir));
        }
    };
    if let Some(list) = std::env::var_os(ENV_SEARCH_PATH) {
        for dir in std::env::split_paths(&list).filter(|d| !d.as_os_str().is_empty()) {
            push(ENV_SEARCH_PATH, dir);
        }
    }
    if let Some(dir) = plugin_folder() {
        // The `openvino` wheel installed in the same Python environment as the plugin (the epx
        // wheel puts it at `site-packages/epx/lib/epx/plugins/openvino/`), activated or not.
        let site = epx_plugin_api::sdk::site_packages_above(&dir);
        push("plugin folder", dir);
        if let Some(site) = site {
            push(
                "the site-packages the plugin is installed in",
                site.join("openvino").join("libs"),
            );
        }
    }
    for (why, site) in site_packages() {
        push(&why, site.join("openvino").join("libs"));
    }
    places
}

/// `site-packages` folders where an `openvino` wheel may be installed.
fn site_packages() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            for d in python_dirs(&PathBuf::from(prefix).join("lib"), "site-packages") {
                out.push((format!("${var}"), d));
            }
        }
    }
    if let Some(list) = std::env::var_os("PYTHONPATH") {
        for dir in std::env::split_paths(&list).filter(|d| !d.as_os_str().is_empty()) {
            out.push(("$PYTHONPATH".to_string(), dir));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        let lib = PathBuf::from(home).join(".local").join("lib");
        for d in python_dirs(&lib, "site-packages") {
            out.push(("user site-packages".to_string(), d));
        }
    }
    for lib in ["/usr/local/lib", "/usr/lib"] {
        for leaf in ["site-packages", "dist-packages"] {
            for d in python_dirs(Path::new(lib), leaf) {
                out.push(("system site-packages".to_string(), d));
            }
        }
    }
    out.push((
        "system site-packages".to_string(),
        PathBuf::from("/usr/lib/python3/dist-packages"),
    ));
    out
}

/// `<lib>/python3*/<leaf>` that exist, sorted (newest Python last is fine: any has the wheel).
fn python_dirs(lib: &Path, leaf: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join(leaf))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The folder this plugin library was loaded from, as the loader names it
/// ([`epx_plugin_api::sdk::library_folder_of`]; `None` where that cannot be told).
pub fn plugin_folder() -> Option<PathBuf> {
    epx_plugin_api::sdk::library_folder_of(plugin_folder as fn() -> Option<PathBuf> as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_names_match_and_the_highest_wins() {
        let dir = std::env::temp_dir().join(format!("epx-openvino-lib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libopenvino_c.so.2541",
            "libopenvino_c.so.2641",
            "libopenvino_c.so.bak",
            "libopenvino.so.2641",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        assert_eq!(library_in(&dir).unwrap(), dir.join("libopenvino_c.so.2641"));
        std::fs::write(dir.join("libopenvino_c.so"), b"").unwrap();
        assert_eq!(library_in(&dir).unwrap(), dir.join("libopenvino_c.so"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn explicit_missing_file_is_named() {
        let err = locate(Some("/nonexistent/libopenvino_c.so")).unwrap_err();
        assert!(err.contains("/nonexistent/libopenvino_c.so"), "{err}");
    }
}
