//! ONNX Runtime plugin-EP packages installed with pip (`onnxruntime-ep-*`, `onnxruntime-qnn`)
//! in the Python environments epx can see, found without a manifest: each becomes a plugin
//! hosted through epx's ONNX Runtime adapter ([`hosted`](super::hosted)), after every plugin
//! folder in search order, with ONNX Runtime's EP names as its EP names
//! (`OpenVINOExecutionProvider`).
//!
//! Where: the `site-packages` epx itself is installed in (the wheel), and those of
//! `VIRTUAL_ENV`, `CONDA_PREFIX`, `PYTHONPATH`, the user's and the system's
//! ([`site_packages_dirs`](super::resolve)). A package folder named `onnxruntime_ep_*` or
//! `onnxruntime_qnn` holding a shared library is asked, in a child Python process with a
//! timeout, for its library (`get_library_path()` or `library_path()`) and its EP names
//! (`get_ep_names()`, `get_ep_name()`, `ep_name()` or `EP_NAME`): the package's own answer,
//! as ONNX Runtime's documentation tells users to use it. The library must be inside the
//! package folder. Its version is its `.dist-info`'s. Everything else (ownership, the library's
//! dependencies, ONNX Runtime's registration and device list) is checked as for any plugin.
//!
//! `EPX_PYTHON_EPS=0` turns this off.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::discover::{Discovery, DiscoveryError, PluginCandidate, SearchOrigin};
use super::manifest::{LibraryFiles, MIN_ORT_FOR_PLUGIN_EPS, OrtEpSpec, PluginManifest};

/// The environment variable that turns the search off (`0`).
pub const ENV: &str = "EPX_PYTHON_EPS";

/// How long a package may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// What the child prints: the library, then one EP name per line.
const ASK: &str = r#"
import importlib, sys
sys.path.insert(0, sys.argv[2])
m = importlib.import_module(sys.argv[1])
lib = getattr(m, "get_library_path", None) or getattr(m, "library_path", None)
print(lib())
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

/// The Python interpreter of a `site-packages` folder: `<prefix>/bin/python3` for
/// `<prefix>/lib/python3.X/site-packages`, else `python3`.
fn interpreter_for(site_packages: &Path) -> PathBuf {
    site_packages
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|prefix| prefix.join("bin/python3"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The package's answer: its library and EP names, or why there is none.
fn ask(site_packages: &Path, module: &str) -> Answer {
    let python = interpreter_for(site_packages);
    let mut child = Command::new(&python)
        // Isolated (no user site, no PYTHON* variables, not the current folder), with the
        // package's own site-packages first.
        .args(["-I", "-c", ASK, module])
        .arg(site_packages)
        // Not the host's current folder: a stray module there must not run.
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let status = super::resolve::wait_for(&mut child, ANSWER_TIMEOUT).ok_or_else(|| {
        format!(
            "importing it did not finish within {} s",
            ANSWER_TIMEOUT.as_secs()
        )
    })?;
    let read = |r: Option<&mut dyn Read>| {
        let mut text = String::new();
        if let Some(r) = r {
            let _ = r.take(1 << 16).read_to_string(&mut text);
        }
        text
    };
    let out = read(child.stdout.as_mut().map(|s| s as &mut dyn Read));
    if !status.success() {
        let err = read(child.stderr.as_mut().map(|s| s as &mut dyn Read));
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!(
            "{} could not tell its library and EP names ({status}): {last}",
            python.display()
        ));
    }
    let mut lines = out.lines().map(str::trim).filter(|l| !l.is_empty());
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

/// The `site-packages` folders to look in.
fn site_packages() -> Vec<PathBuf> {
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

/// Adds the plugin-EP packages found to `found` (after every plugin already in it).
pub fn discover(found: &mut Discovery) {
    if std::env::var_os(ENV).is_some_and(|v| v == "0") {
        return;
    }
    for sp in site_packages() {
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
            if !has_shared_library(&dir) {
                // A placeholder package (no code yet) or another platform's.
                continue;
            }
            if found.plugins.iter().any(|p| p.dir == dir) {
                continue;
            }
            match candidate(&sp, &module, &dir) {
                Ok(c) => found.plugins.push(c),
                Err(why) => found.problems.push(super::discover::DiscoveryProblem {
                    path: dir.clone(),
                    error: DiscoveryError::PythonPackage {
                        package: module.clone(),
                        why,
                    },
                }),
            }
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

fn candidate(sp: &Path, module: &str, dir: &Path) -> Result<PluginCandidate, String> {
    let answer = {
        let mut answers = ANSWERS.lock().unwrap_or_else(|p| p.into_inner());
        answers
            .get_or_insert_with(HashMap::new)
            .entry(dir.to_path_buf())
            .or_insert_with(|| ask(sp, module))
            .clone()
    };
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
        assert_eq!(
            interpreter_for(Path::new("/nonexistent/lib/python3.11/site-packages")),
            PathBuf::from("python3")
        );
    }
}
