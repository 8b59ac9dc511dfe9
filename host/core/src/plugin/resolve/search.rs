//! The folders each search rule looks in, read once from the process environment: the library
//! path variables, `/etc/ld.so.conf` with its includes, the default folders, and Python
//! `site-packages` (asking `python3` only when a library is still missing).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Environment variable with extra folders to search for plugin dependencies (a path list).
pub const LIBRARY_PATH_ENV: &str = "EPX_LIBRARY_PATH";

/// How long the `python3` site-packages query may take.
pub(super) const PYTHON_TIMEOUT: Duration = Duration::from_secs(5);

/// Python `site-packages` subfolders that vendor wheels put shared libraries in.
pub(super) const PYTHON_LIBRARY_FOLDERS: &[&str] = &[
    "onnxruntime/capi",
    "nvidia/*/lib",
    "openvino/libs",
    "tensorrt_libs",
    "tensorrt",
];

/// The environment resolution depends on, captured once so tests can supply their own.
#[derive(Debug, Clone, Default)]
pub(super) struct SearchEnv {
    /// Environment variables, for hint expansion.
    pub(super) vars: HashMap<String, OsString>,
    /// `EPX_LIBRARY_PATH`, absolute entries only.
    pub(super) library_path: Vec<PathBuf>,
    /// `LD_LIBRARY_PATH`, ld.so.conf folders and default folders.
    pub(super) system_dirs: Vec<PathBuf>,
    /// Known `site-packages` folders (existing ones).
    pub(super) site_packages: Vec<PathBuf>,
    /// Ask `python3` for more `site-packages` folders when a library is still missing.
    pub(super) ask_python: bool,
}

impl SearchEnv {
    pub(super) fn from_process() -> SearchEnv {
        let vars: HashMap<String, OsString> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
            .collect();
        let absolute_entries = |name: &str| -> Vec<PathBuf> {
            let Some(value) = vars.get(name) else {
                return Vec::new();
            };
            std::env::split_paths(value)
                .filter(|p| {
                    if p.as_os_str().is_empty() {
                        return false;
                    }
                    let absolute = p.is_absolute();
                    if !absolute {
                        tracing::warn!(
                            path = %p.display(),
                            "{name} entry skipped: only absolute paths are searched for libraries"
                        );
                    }
                    absolute
                })
                .collect()
        };
        let library_path = absolute_entries(LIBRARY_PATH_ENV);
        let mut system_dirs = Vec::new();
        if cfg!(target_os = "linux") {
            system_dirs.extend(absolute_entries("LD_LIBRARY_PATH"));
            system_dirs.extend(ld_so_conf_dirs(Path::new("/etc/ld.so.conf")));
            system_dirs.extend(default_library_dirs());
        }
        dedupe(&mut system_dirs);
        let mut site_packages = site_packages_dirs(&vars);
        // The environment this epx is installed in comes first, activated or not (a venv's
        // `bin/epx` run from a Dockerfile, a systemd unit or pipx).
        if let Some(own) = installation_site_packages() {
            site_packages.insert(0, own.to_path_buf());
            dedupe(&mut site_packages);
        }
        SearchEnv {
            vars,
            library_path,
            system_dirs,
            site_packages,
            ask_python: true,
        }
    }
}

/// Libraries every Linux process (including the host) already has loaded, or that come with
/// the C/C++ toolchain runtime; a plugin must not bring its own.
pub(super) fn is_host_provided(name: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    if name.starts_with("ld-linux") || name.starts_with("ld64.so") || name == "linux-vdso.so.1" {
        return true;
    }
    let Some((stem, _)) = name.split_once(".so") else {
        return false;
    };
    matches!(
        stem,
        "libc"
            | "libm"
            | "libdl"
            | "libpthread"
            | "librt"
            | "libutil"
            | "libresolv"
            | "libmvec"
            | "libstdc++"
            | "libgcc_s"
    )
}

/// Expands `$VAR` and `${VAR}`; `None` if a variable is unset (a hint like `$CUDA_HOME/lib`
/// must not turn into `/lib`). A `$` not followed by a name is kept.
pub(super) fn expand_vars(
    text: &str,
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Option<OsString> {
    let mut out = OsString::new();
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (name, next) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], &braced[end + 1..]),
                None => return None,
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() {
            out.push("$");
            rest = after;
            continue;
        }
        out.push(lookup(name)?);
        rest = next;
    }
    out.push(rest);
    Some(out)
}

/// Expands the loader's dynamic string tokens in a run path entry.
pub(super) fn expand_run_path(entry: &str, origin: &Path, is_64bit: bool) -> Option<PathBuf> {
    let lib = if is_64bit && cfg!(target_pointer_width = "64") {
        "lib64"
    } else {
        "lib"
    };
    let expanded = expand_vars(entry, |var| match var {
        "ORIGIN" => Some(origin.as_os_str().to_owned()),
        "LIB" => Some(OsString::from(lib)),
        "PLATFORM" => Some(OsString::from(std::env::consts::ARCH)),
        _ => None,
    })?;
    let dir = PathBuf::from(expanded);
    // The loader would resolve a relative run path against the current folder; not trusted.
    dir.is_absolute().then_some(dir)
}

pub(super) fn dedupe(dirs: &mut Vec<PathBuf>) {
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
}

/// The default library folders of the dynamic loader for this architecture.
pub(super) fn default_library_dirs() -> Vec<PathBuf> {
    let triple = match std::env::consts::ARCH {
        "x86" => "i386-linux-gnu".to_owned(),
        "arm" => "arm-linux-gnueabihf".to_owned(),
        "powerpc64" if cfg!(target_endian = "little") => "powerpc64le-linux-gnu".to_owned(),
        "riscv64" => "riscv64-linux-gnu".to_owned(),
        arch => format!("{arch}-linux-gnu"),
    };
    let mut dirs = vec![
        PathBuf::from(format!("/lib/{triple}")),
        PathBuf::from(format!("/usr/lib/{triple}")),
    ];
    if cfg!(target_pointer_width = "64") {
        dirs.push(PathBuf::from("/lib64"));
        dirs.push(PathBuf::from("/usr/lib64"));
    }
    dirs.push(PathBuf::from("/lib"));
    dirs.push(PathBuf::from("/usr/lib"));
    dirs
}

/// Folders listed in an `ld.so.conf`, following `include` lines (globs are relative to the
/// including file's folder when not absolute). Unreadable files are skipped.
pub(super) fn ld_so_conf_dirs(conf: &Path) -> Vec<PathBuf> {
    fn walk(file: &Path, depth: usize, out: &mut Vec<PathBuf>, visited: &mut HashSet<PathBuf>) {
        let key = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
        if depth > 8 || !visited.insert(key) {
            return;
        }
        let Ok(bytes) = crate::files::read_regular(file, 1 << 20, "1 MiB") else {
            return;
        };
        let text = String::from_utf8_lossy(&bytes);
        let base = file.parent().unwrap_or(Path::new("/"));
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            match words.next() {
                Some("include") => {
                    for pattern in words {
                        let pattern = Path::new(pattern);
                        let pattern = if pattern.is_absolute() {
                            pattern.to_path_buf()
                        } else {
                            base.join(pattern)
                        };
                        for included in glob_paths(&pattern) {
                            walk(&included, depth + 1, out, visited);
                        }
                    }
                }
                Some("hwcap") => {}
                _ => {
                    for dir in line.split([':', ',', ' ', '\t']) {
                        // Old syntax allowed `dir=TYPE`.
                        let dir = dir.split('=').next().unwrap_or("");
                        if dir.starts_with('/') {
                            out.push(PathBuf::from(dir));
                        }
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(conf, 0, &mut out, &mut HashSet::new());
    out
}

/// Existing paths matching `pattern`, where any component may contain `*` and `?` (which do
/// not match a leading `.`). Sorted per component, so results are deterministic.
pub(super) fn glob_paths(pattern: &Path) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::new()];
    for component in pattern.components() {
        let wildcard = match component {
            Component::Normal(part) => part.to_str().filter(|s| s.contains(['*', '?'])),
            _ => None,
        };
        match wildcard {
            None => current.iter_mut().for_each(|p| p.push(component)),
            Some(part) => {
                let mut next = Vec::new();
                for base in &current {
                    let listing = if base.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        base
                    };
                    let Ok(entries) = std::fs::read_dir(listing) else {
                        continue;
                    };
                    let mut names: Vec<String> = entries
                        .filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .filter(|n| {
                            (!n.starts_with('.') || part.starts_with('.'))
                                && wildcard_match(part, n)
                        })
                        .collect();
                    names.sort();
                    next.extend(names.into_iter().map(|n| base.join(n)));
                }
                current = next;
            }
        }
        if current.is_empty() {
            break;
        }
    }
    current.retain(|p| !p.as_os_str().is_empty() && p.exists());
    current
}

/// `*` matches any run of characters, `?` one character.
pub(super) fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The `site-packages` (or `dist-packages`) folder epx is installed under: the wheel puts the
/// CLI at `site-packages/epx/bin/epx` and libepx at `site-packages/epx/lib/`. Asked of the code
/// running this (the program, or libepx loaded into Python), so both find the same environment,
/// activated or not; `None` elsewhere.
pub fn installation_site_packages() -> Option<&'static Path> {
    static OWN: OnceLock<Option<PathBuf>> = OnceLock::new();
    OWN.get_or_init(|| {
        let here = installation_site_packages as fn() -> Option<&'static Path> as usize;
        let file =
            epx_plugin_api::sdk::library_path_of(here).or_else(|| std::env::current_exe().ok())?;
        let file = file.canonicalize().unwrap_or(file);
        epx_plugin_api::sdk::site_packages_above(&file).filter(|d| d.is_dir())
    })
    .as_deref()
}

/// `site-packages` folders known without running Python (existing ones only).
pub(crate) fn site_packages_dirs(vars: &HashMap<String, OsString>) -> Vec<PathBuf> {
    let mut patterns: Vec<PathBuf> = Vec::new();
    for prefix_var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = vars
            .get(prefix_var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
        {
            patterns.push(prefix.join("lib/python3*/site-packages"));
            patterns.push(prefix.join("Lib/site-packages"));
        }
    }
    if let Some(value) = vars.get("PYTHONPATH") {
        patterns.extend(std::env::split_paths(value).filter(|p| p.is_absolute()));
    }
    if let Some(home) = vars
        .get("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        patterns.push(home.join(".local/lib/python3*/site-packages"));
    }
    for system in [
        "/usr/local/lib/python3*/dist-packages",
        "/usr/local/lib/python3*/site-packages",
        "/usr/lib/python3/dist-packages",
        "/usr/lib/python3*/site-packages",
    ] {
        patterns.push(PathBuf::from(system));
    }
    let mut dirs: Vec<PathBuf> = patterns
        .iter()
        .flat_map(|p| glob_paths(p))
        .filter(|p| p.is_dir())
        .collect();
    dedupe(&mut dirs);
    dirs
}

/// What `python3` says its site-packages folders are; asked at most once per process, with a
/// timeout, and any failure means "none".
pub(super) fn python_site_packages() -> &'static [PathBuf] {
    static CACHE: OnceLock<Vec<PathBuf>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let dirs = ask_python().unwrap_or_default();
        tracing::debug!(?dirs, "site-packages folders reported by python3");
        dirs
    })
}

pub(super) fn ask_python() -> Option<Vec<PathBuf>> {
    // `python3` from PATH, absolute, and only when nobody else could change it: it runs.
    let python = std::env::split_paths(&std::env::var_os("PATH")?)
        .filter(|d| d.is_absolute())
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())?;
    if let Err(u) =
        crate::plugin::trust::check_guarding(&python, "the Python interpreter epx would start")
    {
        tracing::debug!("python3 is not asked for its site-packages: {u}");
        return None;
    }
    let mut cmd = std::process::Command::new(&python);
    // Isolated, without `site`'s start-up (no `.pth` file runs): only the standard library's
    // `site` module answers. Not the host's current folder: a stray `site.py` there must not
    // run.
    cmd.args([
        "-I",
        "-S",
        "-c",
        "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))",
    ])
    .current_dir(std::env::temp_dir());
    let done = crate::child::run(
        &mut cmd,
        crate::child::Limits {
            deadline: PYTHON_TIMEOUT,
            output: 1 << 20,
        },
    )
    .ok()?;
    let Some(status) = done.status else {
        tracing::debug!("python3 did not answer in time; its site-packages are not searched");
        return None;
    };
    if !status.success() {
        return None;
    }
    let text = done.stdout_text();
    let mut dirs: Vec<PathBuf> = text
        .lines()
        .map(|l| PathBuf::from(l.trim()))
        .filter(|p| p.is_absolute() && p.is_dir())
        .collect();
    dedupe(&mut dirs);
    Some(dirs)
}
