//! ONNX Runtime plugin-EP packages installed with pip (`onnxruntime-ep-*`, `onnxruntime-qnn`)
//! in the Python environments epx can see, found without a manifest: each becomes a plugin
//! hosted through epx's ONNX Runtime adapter ([`hosted`](super::hosted)), after every plugin
//! folder, linked plugin and built-in EP, with ONNX Runtime's EP names as its EP names
//! (`OpenVINOExecutionProvider`).
//!
//! Asking a package runs its code (its import), so the search runs only where the user's
//! configuration asks for it ([`PythonEps`]): never by default in a program (Rust, C, Python),
//! `EPX_PYTHON_EPS=1` or [`EnvironmentBuilder::with_python_eps`](crate::EnvironmentBuilder)
//! anywhere, and by default for the `epx` command in the one Python environment it is installed
//! in. Even then a package is asked only when its EPs are wanted: an EP name nothing else
//! provides, or a listing (`epx providers`, `epx doctor`).
//!
//! Where: the `site-packages` epx itself is installed in (the wheel), and with [`PythonEps::All`]
//! those of `VIRTUAL_ENV`, `CONDA_PREFIX`, `PYTHONPATH`, the user's and the system's
//! ([`site_packages_dirs`](super::resolve)). A package folder named `onnxruntime_ep_*` or
//! `onnxruntime_qnn` holding a shared library is asked, in a child Python process
//! ([`crate::child`]: its own process group, bounded output, a deadline), for its library
//! (`get_library_path()` or `library_path()`) and its EP names (`get_ep_names()`,
//! `get_ep_name()`, `ep_name()` or `EP_NAME`): the package's own answer, as ONNX Runtime's
//! documentation tells users to use it. Before that, the package folder with everything in it
//! and the interpreter that would import it pass the same ownership checks as a plugin folder
//! ([`trust`](super::trust)): nothing anyone else could change is run. The interpreter runs
//! isolated and without `site` (no `.pth` file of any other package runs). The library must be
//! inside the package folder. Its version is its `.dist-info`'s. Everything else (the library's
//! dependencies, ONNX Runtime's registration and device list) is checked as for any plugin.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::discover::{Discovery, DiscoveryError, PluginCandidate, SearchOrigin};
use super::manifest::{LibraryFiles, MIN_ORT_FOR_PLUGIN_EPS, OrtEpSpec, PluginManifest};

/// The environment variable that sets where the search looks, over what the program chose:
/// `0` (or `off`) nowhere, `own` the environment epx is installed in, `1` (or `all`, `on`)
/// every environment [`PythonEps::All`] names.
pub const ENV: &str = "EPX_PYTHON_EPS";

/// Where the search for pip-installed plugin-EP packages looks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PythonEps {
    /// Nowhere: no package is imported (the default of every program).
    #[default]
    Off,
    /// The `site-packages` epx itself is installed in (the Python wheel's environment): the
    /// `epx` command's default, where a package installed beside it was clearly meant for it.
    Own,
    /// That one, then those of `VIRTUAL_ENV`, `CONDA_PREFIX`, `PYTHONPATH`, the user's and the
    /// system's.
    All,
}

impl PythonEps {
    /// `chosen`, unless [`ENV`] says otherwise (an unknown value is warned about and ignored).
    pub fn from_env_or(chosen: PythonEps) -> PythonEps {
        let Some(v) = std::env::var_os(ENV) else {
            return chosen;
        };
        match v.to_string_lossy().trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "false" | "no" => PythonEps::Off,
            "own" => PythonEps::Own,
            "1" | "on" | "all" | "true" | "yes" => PythonEps::All,
            other => {
                tracing::warn!(
                    "{ENV}={other:?} is not one of 0, own, 1; the search stays {chosen:?}"
                );
                chosen
            }
        }
    }
}

/// A package folder found (nothing of it run yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    pub site_packages: PathBuf,
    pub module: String,
    pub dir: PathBuf,
}

/// How long a package may take to answer: `EPX_PYTHON_EPS_TIMEOUT_S`, default 20 s.
fn answer_timeout() -> Duration {
    std::env::var("EPX_PYTHON_EPS_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(20), Duration::from_secs_f64)
}

/// What the child prints: a marker line, the library, then one EP name per line (what the
/// import prints before is not the answer).
const ASK: &str = r#"
import importlib, sys
sys.path.insert(0, sys.argv[2])
m = importlib.import_module(sys.argv[1])
lib = getattr(m, "get_library_path", None) or getattr(m, "library_path", None)
lib = lib()
print("epx-python-eps-answer")
print(lib)
names = getattr(m, "get_ep_names", None)
if names is not None:
    names = list(names())
else:
    one = getattr(m, "get_ep_name", None) or getattr(m, "ep_name", None)
    names = [one()] if one is not None else [getattr(m, "EP_NAME")]
for n in names:
    print(n)
"#;

/// Whether a folder name is one of ONNX Runtime's plugin-EP packages.
fn is_plugin_ep_package(name: &str) -> bool {
    (name.starts_with("onnxruntime_ep_") || name == "onnxruntime_qnn") && !name.contains('.')
}

/// The line the child prints before its answer.
const MARKER: &str = "epx-python-eps-answer";

/// The Python interpreter of a `site-packages` folder: `<prefix>/bin/python3` for
/// `<prefix>/lib/python3.X/site-packages`, else `python3` as found on `PATH` (absolute; `None`
/// when there is none).
fn interpreter_for(site_packages: &Path) -> Option<PathBuf> {
    let own = site_packages
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|prefix| prefix.join("bin/python3"))
        .filter(|p| p.is_file());
    own.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .filter(|d| d.is_absolute())
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
    })
}

/// The package's answer: its library and EP names, or why there is none. Nothing runs unless
/// the package folder (with all it holds) and the interpreter pass the trust checks; the child
/// then runs in a process group of its own, its output bounded, and [`answer_timeout`] ends
/// the group.
fn ask(package: &Package) -> Answer {
    let (site_packages, module) = (&package.site_packages, package.module.as_str());
    super::trust::check_tree(&package.dir, "the Python package's code")
        .map_err(|u| format!("it was not imported: {u}"))?;
    let python = interpreter_for(site_packages).ok_or_else(|| {
        format!(
            "no Python interpreter to ask it with: none at {}/../../../bin/python3, and no \
             python3 on PATH",
            site_packages.display()
        )
    })?;
    super::trust::check_guarding(&python, "the Python interpreter epx would start")
        .map_err(|u| format!("it was not imported: {u}"))?;
    let mut cmd = Command::new(&python);
    // Isolated (no user site, no PYTHON* variables, not the current folder) and without
    // `site` (no other package's `.pth` code), with the package's own site-packages first.
    cmd.args(["-I", "-S", "-c", ASK, module])
        .arg(site_packages)
        // Not the host's current folder: a stray module there must not run.
        .current_dir(std::env::temp_dir());
    let limit = answer_timeout();
    let done = crate::child::run(
        &mut cmd,
        crate::child::Limits {
            deadline: limit,
            output: 1 << 16,
        },
    )
    .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let Some(status) = done.status else {
        return Err(format!(
            "importing it did not finish within {:.0} s (EPX_PYTHON_EPS_TIMEOUT_S sets the \
             limit); its process group was ended",
            limit.as_secs_f64()
        ));
    };
    if !status.success() {
        return Err(format!(
            "{} could not tell its library and EP names ({status}): {}",
            python.display(),
            done.last_stderr_line()
        ));
    }
    if done.truncated {
        return Err(format!(
            "it printed more than {} KiB while telling its library and EP names",
            (1 << 16) / 1024
        ));
    }
    let out = done.stdout_text();
    let mut lines = out
        .lines()
        .skip_while(|l| l.trim() != MARKER)
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty());
    let library = PathBuf::from(lines.next().ok_or("it named no library")?);
    let names: Vec<String> = lines.map(str::to_owned).collect();
    if names.is_empty() {
        return Err("it named no EP".to_owned());
    }
    Ok((library, names))
}

/// The version of `module`'s distribution (`<dist>-<version>.dist-info` beside it).
fn version_of(site_packages: &Path, module: &str) -> semver::Version {
    let prefix = format!("{module}-");
    std::fs::read_dir(site_packages)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| {
            let v = n
                .strip_prefix(&prefix)?
                .strip_suffix(".dist-info")?
                .to_owned();
            let mut parts = v.split(['.', '+', '-']).map(|p| p.parse::<u64>().ok());
            let (a, b, c) = (
                parts.next()??,
                parts.next().flatten()?,
                parts.next().flatten().unwrap_or(0),
            );
            Some(semver::Version::new(a, b, c))
        })
        .next()
        .unwrap_or_else(|| semver::Version::new(0, 0, 0))
}

/// A package's answer: its library and EP names, or why there is none.
type Answer = Result<(PathBuf, Vec<String>), String>;

/// Answers already had in this process, by package folder.
static ANSWERS: Mutex<Option<HashMap<PathBuf, Answer>>> = Mutex::new(None);

/// The `site-packages` folders `scope` looks in.
fn site_packages(scope: PythonEps) -> Vec<PathBuf> {
    let own = super::resolve::installation_site_packages().map(Path::to_path_buf);
    match scope {
        PythonEps::Off => Vec::new(),
        PythonEps::Own => own.into_iter().collect(),
        PythonEps::All => every_site_packages(),
    }
}

/// Every `site-packages` folder [`PythonEps::All`] names, each once.
fn every_site_packages() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let vars: HashMap<String, OsString> = std::env::vars_os()
            .filter_map(|(k, v)| k.into_string().ok().map(|k| (k, v)))
            .collect();
        let mut dirs: Vec<PathBuf> = super::resolve::installation_site_packages()
            .map(Path::to_path_buf)
            .into_iter()
            .chain(super::resolve::site_packages_dirs(&vars))
            .collect();
        let mut seen = Vec::new();
        dirs.retain(|d| {
            let key = d.canonicalize().unwrap_or_else(|_| d.clone());
            !seen.contains(&key) && {
                seen.push(key);
                true
            }
        });
        dirs
    })
    .clone()
}

/// The plugin-EP package folders `scope` finds, in search order: folder names only, nothing
/// of them read or run.
pub fn find(scope: PythonEps) -> Vec<Package> {
    let mut out = Vec::new();
    for sp in site_packages(scope) {
        let Ok(entries) = std::fs::read_dir(&sp) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_plugin_ep_package(n))
            .collect();
        names.sort();
        for module in names {
            let dir = sp.join(&module);
            // A placeholder package (no code yet) or another platform's has no library.
            if has_shared_library(&dir) && !out.iter().any(|p: &Package| p.dir == dir) {
                out.push(Package {
                    site_packages: sp.clone(),
                    module,
                    dir,
                });
            }
        }
    }
    out
}

/// Asks each of `packages` (those not among `found`'s plugins already) for its library and EP
/// names and adds it to `found`, after every plugin in it; a package that cannot say is a
/// problem of `found`.
pub fn ask_all(packages: &[Package], found: &mut Discovery) {
    let packages: Vec<&Package> = packages
        .iter()
        .filter(|p| !found.plugins.iter().any(|c| c.dir == p.dir))
        .collect();
    // Each package in a child of its own, all at once: one slow import costs its own time only.
    let answers: Vec<Answer> = std::thread::scope(|s| {
        let asking: Vec<_> = packages
            .iter()
            .map(|&p| s.spawn(move || answer_of(p)))
            .collect();
        asking
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("asking it failed".to_owned()))
            })
            .collect()
    });
    for (package, answer) in packages.into_iter().zip(answers) {
        match candidate(package, answer) {
            Ok(c) => found.plugins.push(c),
            Err(why) => found.problems.push(super::discover::DiscoveryProblem {
                path: package.dir.clone(),
                error: DiscoveryError::PythonPackage {
                    package: package.module.clone(),
                    why,
                },
            }),
        }
    }
}

fn has_shared_library(dir: &Path) -> bool {
    let ext = if cfg!(target_os = "windows") {
        ".dll"
    } else if cfg!(target_os = "macos") {
        ".dylib"
    } else {
        ".so"
    };
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(ext) || n.contains(&format!("{ext}.")))
        })
}

/// The package's answer, asked once per process.
fn answer_of(package: &Package) -> Answer {
    let known = ANSWERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&package.dir)
        .cloned();
    if let Some(answer) = known {
        return answer;
    }
    let answer = ask(package);
    ANSWERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(package.dir.clone())
        .or_insert(answer)
        .clone()
}

fn candidate(package: &Package, answer: Answer) -> Result<PluginCandidate, String> {
    let (sp, module, dir) = (
        &package.site_packages,
        package.module.as_str(),
        &package.dir,
    );
    let (library, ep_names) = answer?;
    let library = library.canonicalize().unwrap_or(library);
    let real_dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let file = library
        .strip_prefix(&real_dir)
        .ok()
        .and_then(|f| f.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "its library {} is not inside the package folder {}",
                library.display(),
                real_dir.display()
            )
        })?;
    let mut files = LibraryFiles::default();
    if cfg!(target_os = "windows") {
        files.windows = Some(file);
    } else if cfg!(target_os = "macos") {
        files.macos = Some(file);
    } else {
        files.linux = Some(file);
    }
    let name = module.replace('_', "-");
    Ok(PluginCandidate {
        name: name.clone(),
        dir: real_dir,
        library,
        manifest: Some(PluginManifest {
            name,
            version: version_of(sp, module),
            abi: semver::Version::new(
                u64::from(epx_plugin_api::abi::EPX_ABI_VERSION_MAJOR),
                u64::from(epx_plugin_api::abi::EPX_ABI_VERSION_MINOR),
                0,
            ),
            description: Some(format!(
                "ONNX Runtime plugin-EP package `{module}` (pip), found in {}",
                sp.display()
            )),
            providers: ep_names.clone(),
            sha256: None,
            library: files,
            dependencies: Vec::new(),
            default_options: Default::default(),
            isolate: false,
            onnxruntime_ep: Some(OrtEpSpec {
                ep_names,
                onnxruntime: MIN_ORT_FOR_PLUGIN_EPS,
            }),
        }),
        origin: SearchOrigin::PythonPackage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_and_interpreters() {
        assert!(is_plugin_ep_package("onnxruntime_ep_openvino"));
        assert!(is_plugin_ep_package("onnxruntime_qnn"));
        assert!(!is_plugin_ep_package(
            "onnxruntime_ep_openvino-1.8.1.dist-info"
        ));
        assert!(!is_plugin_ep_package("onnxruntime"));
        assert!(!is_plugin_ep_package("onnxruntime_genai"));
        // No interpreter in the prefix: python3 from PATH, absolute, or none.
        let found = interpreter_for(Path::new("/nonexistent/lib/python3.11/site-packages"));
        assert!(found.is_none_or(|p| p.is_absolute() && p.ends_with("python3")));
    }
}
