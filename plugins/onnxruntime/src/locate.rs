//! Finding the ONNX Runtime shared library.
//!
//! Order (the first hit wins):
//!
//! 1. the provider option `library` (a file path; when given, it is the only candidate, so a wrong
//!    path is an error rather than a silent fallback to another copy),
//! 2. `EPX_ORT_LIBRARY` (a file path),
//! 3. `ORT_DYLIB_PATH` (a file path; the variable the `ort` crate itself reads),
//! 4. the plugin's own folder (the folder of the loaded plugin library, see [`plugin_dir`]),
//! 5. `onnxruntime/capi/` in the `site-packages` the plugin is installed in (the epx wheel puts
//!    it at `site-packages/epx/lib/epx/plugins/<name>/`): the `onnxruntime` wheel installed in
//!    the same Python environment, activated or not,
//! 6. each folder of `EPX_ORT_SEARCH_PATH` (a path list; the folder itself and its
//!    `onnxruntime/capi/`: `plugins/onnxruntime/fetch-runtime.sh` fills
//!    `.testdata/onnxruntime/capi/`),
//! 7. `onnxruntime/capi/` — where the `onnxruntime`, `onnxruntime-gpu` and
//!    `onnxruntime-openvino` wheels all put the library — under the Python `site-packages` folders
//!    of `$VIRTUAL_ENV`, each `$PYTHONPATH` entry, `~/.local/lib/python3*/site-packages` and
//!    `/usr/local/lib/python3*/site-packages`.
//!
//! In a folder the names tried are `libonnxruntime.so`, `libonnxruntime.so.1`, then versioned
//! names (`libonnxruntime.so.1.31.1`, newest first); `libonnxruntime.dylib` /
//! `libonnxruntime.1.*.dylib` on macOS, `onnxruntime.dll` on Windows.

use std::path::{Path, PathBuf};

/// The inputs of a search, read from the process by [`SearchEnv::from_process`]; tests build
/// their own.
#[derive(Clone, Debug, Default)]
pub struct SearchEnv {
    pub library_option: Option<PathBuf>,
    pub epx_ort_library: Option<PathBuf>,
    pub ort_dylib_path: Option<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
    /// The `site-packages` folder above the plugin's, when it is installed in one.
    pub installed_site_packages: Option<PathBuf>,
    pub search_path: Vec<PathBuf>,
    pub virtual_env: Option<PathBuf>,
    pub python_path: Vec<PathBuf>,
    pub home: Option<PathBuf>,
    /// Prefixes whose `lib/python3*/site-packages` are searched (`/usr/local` by default).
    pub system_prefixes: Vec<PathBuf>,
}

fn non_empty_var(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

fn path_list(name: &str) -> Vec<PathBuf> {
    non_empty_var(name)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

impl SearchEnv {
    /// The search inputs of this process, with the `library` option if one was given.
    pub fn from_process(library_option: Option<PathBuf>) -> Self {
        let plugin_dir = plugin_dir();
        SearchEnv {
            library_option,
            epx_ort_library: non_empty_var("EPX_ORT_LIBRARY").map(PathBuf::from),
            ort_dylib_path: non_empty_var("ORT_DYLIB_PATH").map(PathBuf::from),
            installed_site_packages: plugin_dir
                .as_deref()
                .and_then(epx_plugin_api::sdk::site_packages_above),
            plugin_dir,
            search_path: path_list("EPX_ORT_SEARCH_PATH"),
            virtual_env: non_empty_var("VIRTUAL_ENV").map(PathBuf::from),
            python_path: path_list("PYTHONPATH"),
            home: non_empty_var("HOME").map(PathBuf::from),
            system_prefixes: vec![PathBuf::from("/usr/local")],
        }
    }
}

/// The library was not found; `searched` names every place looked at, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotFound {
    pub searched: Vec<String>,
}

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the ONNX Runtime library ({}) was not found; searched: {}. Set the `library` \
             option, EPX_ORT_LIBRARY or EPX_ORT_SEARCH_PATH, or `pip install onnxruntime` (or \
             onnxruntime-gpu, onnxruntime-openvino)",
            library_names_hint(),
            self.searched.join("; ")
        )
    }
}

fn library_names_hint() -> &'static str {
    if cfg!(target_os = "windows") {
        "onnxruntime.dll"
    } else if cfg!(target_os = "macos") {
        "libonnxruntime*.dylib"
    } else {
        "libonnxruntime.so*"
    }
}

/// The ONNX Runtime library files in `dir`, in the order they are tried.
pub fn library_in(dir: &Path) -> Option<PathBuf> {
    let fixed: &[&str] = if cfg!(target_os = "windows") {
        &["onnxruntime.dll"]
    } else if cfg!(target_os = "macos") {
        &["libonnxruntime.dylib"]
    } else {
        &["libonnxruntime.so", "libonnxruntime.so.1"]
    };
    for name in fixed {
        let p = dir.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    // Versioned names, newest first: libonnxruntime.so.1.31.1 / libonnxruntime.1.31.1.dylib.
    let mut versioned: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = if cfg!(target_os = "macos") {
                name.strip_prefix("libonnxruntime.")?
                    .strip_suffix(".dylib")?
                    .to_string()
            } else {
                name.strip_prefix("libonnxruntime.so.")?.to_string()
            };
            let parts: Option<Vec<u64>> = version.split('.').map(|p| p.parse().ok()).collect();
            let path = e.path();
            path.is_file().then_some((parts?, path))
        })
        .collect();
    versioned.sort();
    versioned.pop().map(|(_, p)| p)
}

/// `<prefix>/lib/python3*/site-packages` folders that exist, sorted.
fn site_packages_under(prefix: &Path) -> Vec<PathBuf> {
    let lib = prefix.join("lib");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path().join("site-packages"))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Finds the library. Every place looked at is recorded for the error message.
pub fn locate(env: &SearchEnv) -> Result<PathBuf, NotFound> {
    let mut searched = Vec::new();
    if let Some(p) = &env.library_option {
        if p.is_file() {
            return Ok(p.clone());
        }
        searched.push(format!("option `library` = {} (no such file)", p.display()));
        return Err(NotFound { searched });
    }
    searched.push("option `library` (not given)".into());
    for (var, value) in [
        ("EPX_ORT_LIBRARY", &env.epx_ort_library),
        ("ORT_DYLIB_PATH", &env.ort_dylib_path),
    ] {
        match value {
            Some(p) if p.is_file() => return Ok(p.clone()),
            Some(p) => searched.push(format!("{var} = {} (no such file)", p.display())),
            None => searched.push(format!("{var} (unset)")),
        }
    }
    // Folders to look in, and notes on places that could not be looked at, in search order.
    enum Place {
        Dir(&'static str, PathBuf),
        Note(String),
    }
    let mut places = Vec::new();
    places.push(match &env.plugin_dir {
        Some(d) => Place::Dir("the plugin's folder", d.clone()),
        None => Place::Note("the plugin's folder (unknown on this OS)".into()),
    });
    let capi = |p: PathBuf| p.join("onnxruntime").join("capi");
    if let Some(site) = &env.installed_site_packages {
        places.push(Place::Dir(
            "the site-packages the plugin is installed in",
            capi(site.clone()),
        ));
    }
    if env.search_path.is_empty() {
        places.push(Place::Note("EPX_ORT_SEARCH_PATH (unset)".into()));
    }
    for d in &env.search_path {
        places.push(Place::Dir("EPX_ORT_SEARCH_PATH", d.clone()));
        places.push(Place::Dir(
            "EPX_ORT_SEARCH_PATH",
            d.join("onnxruntime").join("capi"),
        ));
    }
    match &env.virtual_env {
        Some(v) => {
            let found = site_packages_under(v);
            if found.is_empty() {
                places.push(Place::Note(format!(
                    "{}/lib/python3*/site-packages (none; VIRTUAL_ENV)",
                    v.display()
                )));
            }
            places.extend(
                found
                    .into_iter()
                    .map(|p| Place::Dir("VIRTUAL_ENV", capi(p))),
            );
        }
        None => places.push(Place::Note("VIRTUAL_ENV (unset)".into())),
    }
    places.extend(
        env.python_path
            .iter()
            .map(|p| Place::Dir("PYTHONPATH", capi(p.clone()))),
    );
    let mut prefixes: Vec<(&'static str, PathBuf)> = Vec::new();
    match &env.home {
        Some(h) => prefixes.push(("user site-packages", h.join(".local"))),
        None => places.push(Place::Note("~/.local (HOME unset)".into())),
    }
    prefixes.extend(
        env.system_prefixes
            .iter()
            .map(|p| ("system site-packages", p.clone())),
    );
    for (why, prefix) in prefixes {
        let found = site_packages_under(&prefix);
        if found.is_empty() {
            places.push(Place::Note(format!(
                "{}/lib/python3*/site-packages (none)",
                prefix.display()
            )));
        }
        places.extend(found.into_iter().map(|p| Place::Dir(why, capi(p))));
    }
    for place in places {
        match place {
            Place::Note(n) => searched.push(n),
            Place::Dir(why, dir) => {
                if let Some(p) = library_in(&dir) {
                    return Ok(p);
                }
                searched.push(format!("{} ({why})", dir.display()));
            }
        }
    }
    Err(NotFound { searched })
}

/// The folder of the library this code is linked into, or `None` where that cannot be told:
/// the plugin's folder, or the program's when the adapter is linked into one. Asked of the
/// loader ([`epx_plugin_api::sdk::library_folder_of`]), not read from `/proc/self/maps`, which
/// shows the sealed copy the host maps instead of the file.
pub fn plugin_dir() -> Option<PathBuf> {
    epx_plugin_api::sdk::library_folder_of(plugin_dir as fn() -> Option<PathBuf> as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("epx-ort-locate-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    fn empty_env() -> SearchEnv {
        SearchEnv::default()
    }

    #[test]
    fn library_option_is_strict() {
        let env = SearchEnv {
            library_option: Some("/nonexistent/libonnxruntime.so".into()),
            epx_ort_library: Some("/also/missing".into()),
            ..empty_env()
        };
        let e = locate(&env).unwrap_err();
        assert_eq!(e.searched.len(), 1);
        assert!(e.to_string().contains("/nonexistent/libonnxruntime.so"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn order_and_versioned_names() {
        let d = temp("order");
        let plugin = d.join("plugin");
        let search = d.join("search");
        let venv = d.join("venv");
        touch(&search.join("libonnxruntime.so.1.31.1"));
        touch(&search.join("libonnxruntime.so.1.9.0"));
        touch(
            &venv
                .join("lib/python3.11/site-packages/onnxruntime/capi")
                .join("libonnxruntime.so.1.20.0"),
        );
        std::fs::create_dir_all(&plugin).unwrap();
        let mut env = SearchEnv {
            plugin_dir: Some(plugin.clone()),
            search_path: vec![search.clone()],
            virtual_env: Some(venv.clone()),
            ..empty_env()
        };
        // Newest versioned name in the search path beats the venv.
        assert_eq!(
            locate(&env).unwrap(),
            search.join("libonnxruntime.so.1.31.1")
        );
        // The plugin's own folder comes first.
        touch(&plugin.join("libonnxruntime.so.1"));
        assert_eq!(locate(&env).unwrap(), plugin.join("libonnxruntime.so.1"));
        // Environment variables come before folders.
        let explicit = d.join("explicit/libonnxruntime.so");
        touch(&explicit);
        env.ort_dylib_path = Some(explicit.clone());
        assert_eq!(locate(&env).unwrap(), explicit);
        env.ort_dylib_path = None;
        std::fs::remove_file(plugin.join("libonnxruntime.so.1")).unwrap();
        env.search_path.clear();
        assert_eq!(
            locate(&env).unwrap(),
            venv.join("lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.20.0")
        );
        // The wheel installed beside the plugin (same site-packages) comes before VIRTUAL_ENV
        // and the search path, activated or not.
        let own = d.join("own/lib/python3.12/site-packages");
        touch(&own.join("onnxruntime/capi/libonnxruntime.so.1.31.1"));
        env.installed_site_packages = Some(own.clone());
        env.search_path = vec![search.clone()];
        assert_eq!(
            locate(&env).unwrap(),
            own.join("onnxruntime/capi/libonnxruntime.so.1.31.1")
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn not_found_lists_every_place() {
        let d = temp("missing");
        let env = SearchEnv {
            epx_ort_library: Some(d.join("nope.so")),
            plugin_dir: Some(d.join("plugin")),
            search_path: vec![d.join("search")],
            python_path: vec![d.join("pp")],
            home: Some(d.join("home")),
            system_prefixes: vec![d.join("usr")],
            ..empty_env()
        };
        let e = locate(&env).unwrap_err();
        let text = e.to_string();
        for needle in [
            "option `library` (not given)",
            "EPX_ORT_LIBRARY",
            "nope.so",
            "ORT_DYLIB_PATH (unset)",
            "plugin",
            "search",
            "pp/onnxruntime/capi",
            "home/.local",
            "VIRTUAL_ENV (unset)",
        ] {
            assert!(text.contains(needle), "`{needle}` missing from: {text}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn plugin_dir_is_the_folder_of_this_binary() {
        let exe = std::env::current_exe().unwrap();
        assert_eq!(plugin_dir().unwrap(), exe.parent().unwrap());
    }
}
