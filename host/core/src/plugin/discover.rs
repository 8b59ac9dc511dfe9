//! Finding plugins: the search path and what is in it.
//!
//! Discovery only reads directories and manifests; it never loads a library, so listing plugins
//! is cheap and cannot run plugin code. Whatever is wrong with one plugin (a garbage manifest, a
//! missing library, a world-writable folder) is reported as a [`DiscoveryProblem`] and the other
//! plugins are still found.
//!
//! Security: only absolute, configured paths are scanned (relative `EPX_PLUGIN_PATH` entries are
//! skipped), and a world-writable search folder, plugin folder or library file is refused,
//! because anyone on the machine could replace the code the host is about to run.
//!
//! Two more rules hold for plugin folders:
//!
//! - **SHA-256 pin.** A `plugin.toml` may pin its library with `sha256 = "<64 hex digits>"`
//!   (validated when the manifest is read). When the plugin is loaded, the library file is
//!   hashed (streamed, not read whole) *before* it is opened, and a file whose digest differs is
//!   refused with [`PluginLoadErrorKind::ChecksumMismatch`](crate::PluginLoadErrorKind): none of
//!   its code runs. See [`PluginCandidate::verify_sha256`]. The pin covers the plugin library
//!   itself, not the dependencies it loads.
//! - **One EP name, one plugin.** When two discovered plugins claim the same EP name (their
//!   manifests' `providers`; a bare library claims the EP it is named after), the first on the
//!   search path provides it and the other is shadowed. Discovery does not refuse either; it
//!   records each case in [`Discovery::shadowed`] (the EP, both plugins and both library paths),
//!   the environment logs it as a warning, and `epx providers` and `epx doctor` show it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::manifest::{ManifestError, PluginManifest, read_manifest};
use super::trust;

/// Name of the manifest file in a plugin folder.
pub const MANIFEST_FILE: &str = "plugin.toml";

/// Environment variable with extra plugin folders (a path list, like `PATH`).
pub const PLUGIN_PATH_ENV: &str = "EPX_PLUGIN_PATH";

/// Where a search folder came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SearchOrigin {
    /// Given in code or on the command line.
    Explicit,
    /// From `EPX_PLUGIN_PATH`.
    EnvVar,
    /// The default install location next to the running executable.
    Default,
    /// An ONNX Runtime plugin-EP package installed with pip ([`super::python_eps`]).
    PythonPackage,
}

/// One folder of the plugin search path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDir {
    pub path: PathBuf,
    pub origin: SearchOrigin,
}

/// A plugin found on the search path (not loaded).
#[derive(Debug, Clone)]
pub struct PluginCandidate {
    /// The manifest's `name`, or for a bare library the part of the file name after
    /// `libepx_`/`epx_` (`libepx_foo.so` → `foo`).
    pub name: String,
    /// The plugin folder (for a bare library: the folder it is in).
    pub dir: PathBuf,
    /// Absolute path of the library file (it existed when discovered).
    pub library: PathBuf,
    /// `None` for a bare library.
    pub manifest: Option<PluginManifest>,
    pub origin: SearchOrigin,
}

impl PluginCandidate {
    /// The EP names this plugin claims without being loaded: its manifest's `providers`, or for
    /// a bare library its name (a bare library is assumed to be named after its EP).
    pub fn claimed_providers(&self) -> Vec<&str> {
        match &self.manifest {
            Some(m) => m.providers.iter().map(String::as_str).collect(),
            None => vec![self.name.as_str()],
        }
    }
}

/// Two discovered plugins claim the same EP name (see [`PluginCandidate::claimed_providers`]):
/// the first on the search path provides it; the other is never asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowedProvider {
    /// The EP name both claim.
    pub provider: String,
    /// The plugin that provides it (found first).
    pub winner: String,
    pub winner_library: PathBuf,
    /// The plugin that also claims it (found later).
    pub shadowed: String,
    pub shadowed_library: PathBuf,
}

impl std::fmt::Display for ShadowedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EP `{}` is provided by plugin `{}` ({}), found first on the search path; plugin `{}` ({}) also provides it and is shadowed for it",
            self.provider,
            self.winner,
            self.winner_library.display(),
            self.shadowed,
            self.shadowed_library.display()
        )?;
        if self.winner == self.shadowed {
            write!(
                f,
                " (both plugins are called `{}`: remove one, or reorder the search path, to choose)",
                self.shadowed
            )
        } else {
            write!(
                f,
                " (ask for `{}/{}` to use it, or reorder the search path)",
                self.shadowed, self.provider
            )
        }
    }
}

/// Why a plugin (or search folder) was not usable.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(
        "plugin manifest {} names library \"{library}\", which is not in {}",
        manifest.display(),
        dir.display()
    )]
    LibraryMissing {
        manifest: PathBuf,
        library: String,
        dir: PathBuf,
    },
    /// Someone other than root and the current user could change it ([`trust::check`]).
    #[error("refused: {0}")]
    Untrusted(trust::Untrusted),
    #[error("cannot read plugin folder {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A pip package of an ONNX Runtime plugin EP that could not tell its library or EP names.
    #[error("ONNX Runtime plugin-EP package `{package}`: {why}")]
    PythonPackage { package: String, why: String },
    #[error("plugin search path entry {} is not a folder", path.display())]
    NotADirectory { path: PathBuf },
    /// A `plugin.toml`, or a file named like a plugin library, that is not a regular file
    /// (a folder, a FIFO, a dangling symbolic link or a loop of them).
    #[error("{} is named like a plugin {what}, but {why}; it was not loaded", path.display())]
    NotAFile {
        path: PathBuf,
        what: &'static str,
        why: String,
    },
}

impl Clone for DiscoveryError {
    fn clone(&self) -> Self {
        match self {
            DiscoveryError::Manifest(e) => DiscoveryError::Manifest(e.clone()),
            DiscoveryError::LibraryMissing {
                manifest,
                library,
                dir,
            } => DiscoveryError::LibraryMissing {
                manifest: manifest.clone(),
                library: library.clone(),
                dir: dir.clone(),
            },
            DiscoveryError::Untrusted(u) => DiscoveryError::Untrusted(u.clone()),
            DiscoveryError::Unreadable { path, source } => DiscoveryError::Unreadable {
                path: path.clone(),
                source: super::manifest::io_again(source),
            },
            DiscoveryError::PythonPackage { package, why } => DiscoveryError::PythonPackage {
                package: package.clone(),
                why: why.clone(),
            },
            DiscoveryError::NotADirectory { path } => {
                DiscoveryError::NotADirectory { path: path.clone() }
            }
            DiscoveryError::NotAFile { path, what, why } => DiscoveryError::NotAFile {
                path: path.clone(),
                what,
                why: why.clone(),
            },
        }
    }
}

/// Why `path` is not a regular file (`None` when it is one): what it is, or why it cannot be
/// looked at (a link leading nowhere, a loop of links).
fn not_a_file(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => None,
        Ok(m) if m.is_dir() => Some("it is a folder".into()),
        Ok(_) => Some("it is a FIFO, socket or device, not a regular file".into()),
        Err(e) if std::fs::symlink_metadata(path).is_ok() => Some(format!(
            "it is a symbolic link that leads nowhere usable ({e})"
        )),
        Err(e) => Some(format!("it cannot be read ({e})")),
    }
}

/// Whether a `plugin.toml` is there in any form (a file, or something that is not one and will
/// be reported).
fn manifest_present(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(MANIFEST_FILE)).is_ok()
}

/// A problem found while discovering; it concerns `path` only.
#[derive(Debug, Clone)]
pub struct DiscoveryProblem {
    pub path: PathBuf,
    pub error: DiscoveryError,
}

/// Everything found on the search path: usable plugins, problems and EP names claimed by more
/// than one plugin, all in search order.
#[derive(Debug, Default, Clone)]
pub struct Discovery {
    pub plugins: Vec<PluginCandidate>,
    pub problems: Vec<DiscoveryProblem>,
    /// Each later plugin claiming an EP name an earlier one already claims. Not a problem (both
    /// plugins are offered); a warning, since which one runs depends on the search order.
    pub shadowed: Vec<ShadowedProvider>,
}

impl Discovery {
    /// The first plugin with this name (earlier search folders shadow later ones).
    pub fn find(&self, name: &str) -> Option<&PluginCandidate> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// Whether EP `provider` of the plugin whose library is `library` is shadowed, and by whom.
    pub fn shadowing(&self, library: &Path, provider: &str) -> Option<&ShadowedProvider> {
        self.shadowed
            .iter()
            .find(|s| s.provider == provider && s.shadowed_library == library)
    }
}

/// The plugin search path, in order: `explicit` folders (relative ones are made absolute against
/// the current folder, since they were given on purpose), then each absolute entry of
/// `EPX_PLUGIN_PATH` (relative entries are skipped with a warning), then the defaults: the
/// `defaults` given (libepx passes `<its own folder>/epx/plugins`), then the folders next to the
/// running executable, `<exe dir>/../lib/epx/plugins` and `<exe dir>/plugins`, each when it
/// exists. A folder listed twice is kept at its first place.
pub fn plugin_search_path(explicit: &[PathBuf], defaults: &[PathBuf]) -> Vec<SearchDir> {
    let env_value = std::env::var_os(PLUGIN_PATH_ENV);
    let cwd = std::env::current_dir().ok();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    search_path_from(
        explicit,
        env_value.as_deref(),
        cwd.as_deref(),
        defaults,
        exe_dir.as_deref(),
    )
}

/// [`plugin_search_path`] with its inputs given, so it can be tested without touching the
/// process environment.
fn search_path_from(
    explicit: &[PathBuf],
    env_value: Option<&OsStr>,
    cwd: Option<&Path>,
    defaults: &[PathBuf],
    exe_dir: Option<&Path>,
) -> Vec<SearchDir> {
    let mut dirs: Vec<SearchDir> = Vec::new();
    let mut push = |path: PathBuf, origin: SearchOrigin| {
        if !dirs.iter().any(|d| d.path == path) {
            dirs.push(SearchDir { path, origin });
        }
    };

    for path in explicit {
        if path.is_absolute() {
            push(path.clone(), SearchOrigin::Explicit);
        } else if let Some(cwd) = cwd {
            push(cwd.join(path), SearchOrigin::Explicit);
        } else {
            tracing::warn!(
                path = %path.display(),
                "plugin folder skipped: it is relative and the current folder is unknown"
            );
        }
    }

    if let Some(value) = env_value {
        for path in std::env::split_paths(value) {
            if path.as_os_str().is_empty() {
                continue;
            }
            if path.is_absolute() {
                push(path, SearchOrigin::EnvVar);
            } else {
                tracing::warn!(
                    path = %path.display(),
                    "{PLUGIN_PATH_ENV} entry skipped: it is relative, and only absolute paths are scanned for plugins"
                );
            }
        }
    }

    let exe_defaults = exe_dir.map_or_else(Vec::new, |d| {
        vec![d.join("../lib/epx/plugins"), d.join("plugins")]
    });
    {
        for candidate in defaults.iter().cloned().chain(exe_defaults) {
            // Canonical so that `bin/../lib/epx/plugins` and `lib/epx/plugins` given explicitly
            // are recognised as the same folder.
            if let Ok(path) = candidate.canonicalize()
                && path.is_dir()
            {
                push(path, SearchOrigin::Default);
            }
        }
    }
    dirs
}

/// If `file_name` is a bare plugin library for this OS (`libepx_<name>.so` on Linux,
/// `libepx_<name>.dylib` on macOS, `epx_<name>.dll` on Windows), the plugin name.
pub fn plugin_name_from_library_file(file_name: &str) -> Option<&str> {
    let (prefix, suffix) = if cfg!(target_os = "windows") {
        ("epx_", ".dll")
    } else if cfg!(target_os = "macos") {
        ("libepx_", ".dylib")
    } else {
        ("libepx_", ".so")
    };
    let name = file_name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (!name.is_empty()).then_some(name)
}

/// Finds the plugins in `dirs` (see the module docs). Never stops at a problem.
pub fn discover(dirs: &[SearchDir]) -> Discovery {
    let mut found = Discovery::default();
    for dir in dirs {
        scan_search_dir(dir, &mut found);
    }
    found.shadowed = shadowed_providers(&found.plugins);
    found
}

/// Every EP name claimed by a plugin after an earlier one (in search order) claimed it.
pub(crate) fn shadowed_providers(plugins: &[PluginCandidate]) -> Vec<ShadowedProvider> {
    let mut first: Vec<(&str, &PluginCandidate)> = Vec::new();
    let mut shadowed = Vec::new();
    for candidate in plugins {
        for provider in candidate.claimed_providers() {
            match first.iter().find(|(ep, _)| *ep == provider) {
                Some((_, winner)) => {
                    tracing::debug!(
                        ep = provider,
                        winner = %winner.library.display(),
                        shadowed = %candidate.library.display(),
                        "EP claimed by two plugins; the first on the search path wins"
                    );
                    shadowed.push(ShadowedProvider {
                        provider: provider.to_owned(),
                        winner: winner.name.clone(),
                        winner_library: winner.library.clone(),
                        shadowed: candidate.name.clone(),
                        shadowed_library: candidate.library.clone(),
                    });
                }
                None => first.push((provider, candidate)),
            }
        }
    }
    shadowed
}

fn scan_search_dir(search: &SearchDir, found: &mut Discovery) {
    let path = &search.path;
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(dir = %path.display(), "plugin search folder does not exist; skipped");
            return;
        }
        Err(source) => {
            found.problem(
                path,
                DiscoveryError::Unreadable {
                    path: path.clone(),
                    source,
                },
            );
            return;
        }
    };
    if !meta.is_dir() {
        found.problem(path, DiscoveryError::NotADirectory { path: path.clone() });
        return;
    }
    // Whoever could write into the search folder could drop a plugin in it.
    if let Err(u) = trust::check(path) {
        found.problem(path, DiscoveryError::Untrusted(u));
        return;
    }

    if manifest_present(path) {
        scan_plugin_folder(path, search.origin, found);
        return;
    }

    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(source) => {
            found.problem(
                path,
                DiscoveryError::Unreadable {
                    path: path.clone(),
                    source,
                },
            );
            return;
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => names.push(entry.file_name()),
            Err(source) => {
                found.problem(
                    path,
                    DiscoveryError::Unreadable {
                        path: path.clone(),
                        source,
                    },
                );
            }
        }
    }
    names.sort();

    for name in names {
        let entry_path = path.join(&name);
        // Follows symlinks: a linked plugin folder or library is fine, and the checks below
        // apply to what the link points at.
        let plugin = name.to_str().and_then(plugin_name_from_library_file);
        let meta = std::fs::metadata(&entry_path).ok();
        if meta.as_ref().is_some_and(|m| m.is_dir()) && manifest_present(&entry_path) {
            scan_plugin_folder(&entry_path, search.origin, found);
        } else if let Some(plugin) = plugin {
            // Named like a plugin library: anything but a regular file is reported, not
            // skipped without a word.
            if let Some(why) = not_a_file(&entry_path) {
                found.problem(
                    &entry_path,
                    DiscoveryError::NotAFile {
                        path: entry_path.clone(),
                        what: "library",
                        why,
                    },
                );
                continue;
            }
            if let Err(u) = trust::check(&entry_path) {
                found.problem(&entry_path, DiscoveryError::Untrusted(u));
                continue;
            }
            found.add(PluginCandidate {
                name: plugin.to_owned(),
                dir: path.clone(),
                library: entry_path,
                manifest: None,
                origin: search.origin,
            });
        }
    }
}

/// A folder with a `plugin.toml`.
fn scan_plugin_folder(dir: &Path, origin: SearchOrigin, found: &mut Discovery) {
    match std::fs::metadata(dir).map(|_| trust::check(dir)) {
        Ok(Err(u)) => {
            found.problem(dir, DiscoveryError::Untrusted(u));
            return;
        }
        Ok(Ok(())) => {}
        Err(source) => {
            found.problem(
                dir,
                DiscoveryError::Unreadable {
                    path: dir.to_path_buf(),
                    source,
                },
            );
            return;
        }
    }

    let manifest_path = dir.join(MANIFEST_FILE);
    if let Some(why) = not_a_file(&manifest_path) {
        found.problem(
            &manifest_path,
            DiscoveryError::NotAFile {
                path: manifest_path.clone(),
                what: "manifest",
                why,
            },
        );
        return;
    }
    if let Err(u) = trust::check(&manifest_path) {
        found.problem(&manifest_path, DiscoveryError::Untrusted(u));
        return;
    }
    let manifest = match read_manifest(&manifest_path) {
        Ok(manifest) => manifest,
        Err(e) => {
            found.problem(&manifest_path, e.into());
            return;
        }
    };
    // read_manifest guarantees a library for this OS; the `else` only guards against that
    // changing.
    let Some(library_name) = manifest.library_for_current_os().map(str::to_owned) else {
        found.problem(
            &manifest_path,
            DiscoveryError::LibraryMissing {
                manifest: manifest_path.clone(),
                library: String::new(),
                dir: dir.to_path_buf(),
            },
        );
        return;
    };
    let library = dir.join(&library_name);
    match std::fs::metadata(&library) {
        Ok(meta) if meta.is_file() => {
            if let Err(u) = trust::check(&library) {
                found.problem(&library, DiscoveryError::Untrusted(u));
                return;
            }
        }
        _ if std::fs::symlink_metadata(&library).is_ok() => {
            let why = not_a_file(&library).unwrap_or_default();
            found.problem(
                &library,
                DiscoveryError::NotAFile {
                    path: library.clone(),
                    what: "library",
                    why,
                },
            );
            return;
        }
        _ => {
            found.problem(
                &manifest_path,
                DiscoveryError::LibraryMissing {
                    manifest: manifest_path.clone(),
                    library: library_name,
                    dir: library.parent().unwrap_or(dir).to_path_buf(),
                },
            );
            return;
        }
    }
    found.add(PluginCandidate {
        name: manifest.name.clone(),
        dir: dir.to_path_buf(),
        library,
        manifest: Some(manifest),
        origin,
    });
}

impl Discovery {
    fn problem(&mut self, path: &Path, error: DiscoveryError) {
        tracing::warn!(path = %path.display(), "{error}");
        self.problems.push(DiscoveryProblem {
            path: path.to_path_buf(),
            error,
        });
    }

    fn add(&mut self, candidate: PluginCandidate) {
        if let Some(first) = self.find(&candidate.name) {
            tracing::debug!(
                plugin = %candidate.name,
                shadowed = %candidate.library.display(),
                by = %first.library.display(),
                "plugin found twice; the first one on the search path wins"
            );
        } else {
            tracing::debug!(plugin = %candidate.name, library = %candidate.library.display(), "plugin found");
        }
        self.plugins.push(candidate);
    }
}

/// A fresh folder under the system temp folder, removed on drop (tests only; std only).
#[cfg(test)]
pub(crate) struct TestDir(PathBuf);

#[cfg(test)]
impl TestDir {
    pub(crate) fn new(tag: &str) -> TestDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("epx-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create test dir");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .expect("chmod test dir");
        }
        // Canonical, so comparisons with canonicalized paths hold even if /tmp is a symlink.
        TestDir(path.canonicalize().expect("canonicalize test dir"))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

#[cfg(test)]
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib_file(name: &str) -> String {
        if cfg!(target_os = "windows") {
            format!("epx_{name}.dll")
        } else if cfg!(target_os = "macos") {
            format!("libepx_{name}.dylib")
        } else {
            format!("libepx_{name}.so")
        }
    }

    fn manifest_text(name: &str, library: &str) -> String {
        format!(
            "name = \"{name}\"\nversion = \"0.1.0\"\nabi = \"1.0\"\nproviders = [\"{name}\"]\n\
             [library]\nlinux = \"{library}\"\nmacos = \"{library}\"\nwindows = \"{library}\"\n"
        )
    }

    /// Folders with a fixed mode, whatever the umask.
    fn mkdir(dir: &Path) {
        std::fs::create_dir_all(dir).expect("mkdir");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
    }

    fn plugin_folder(root: &Path, folder: &str, name: &str, with_library: bool) -> PathBuf {
        let dir = root.join(folder);
        mkdir(&dir);
        let lib = lib_file(name);
        std::fs::write(dir.join(MANIFEST_FILE), manifest_text(name, &lib)).expect("write");
        if with_library {
            std::fs::write(dir.join(&lib), b"not really a library").expect("write");
        }
        dir
    }

    fn sd(path: &Path, origin: SearchOrigin) -> SearchDir {
        SearchDir {
            path: path.to_path_buf(),
            origin,
        }
    }

    #[test]
    fn bare_library_names() {
        let (good, noext) = if cfg!(target_os = "windows") {
            ("epx_foo.dll", "epx_foo")
        } else if cfg!(target_os = "macos") {
            ("libepx_foo.dylib", "libepx_foo")
        } else {
            ("libepx_foo.so", "libepx_foo")
        };
        assert_eq!(plugin_name_from_library_file(good), Some("foo"));
        assert_eq!(plugin_name_from_library_file(noext), None);
        assert_eq!(plugin_name_from_library_file(&lib_file("")), None);
        assert_eq!(plugin_name_from_library_file("libfoo.so"), None);
        #[cfg(target_os = "linux")]
        assert_eq!(plugin_name_from_library_file("libepx_foo.so.1"), None);
    }

    #[test]
    fn discovers_a_mix_and_reports_problems() {
        let root = TestDir::new("discover-mix");
        let a = root.path().join("a");
        let b = root.path().join("b");
        mkdir(&a);
        mkdir(&b);

        // In a: folders and bare libraries, in an order different from their names.
        let good = plugin_folder(&a, "m_good", "good", true);
        std::fs::write(a.join(lib_file("bare")), b"x").expect("write");
        let garbage = a.join("c_garbage");
        mkdir(&garbage);
        std::fs::write(garbage.join(MANIFEST_FILE), "this is = = not toml").expect("write");
        let nolib = plugin_folder(&a, "d_nolib", "nolib", false);
        std::fs::create_dir_all(a.join("e_not_a_plugin")).expect("mkdir");
        std::fs::write(a.join("README.txt"), b"hello").expect("write");
        let good2 = plugin_folder(&a, "z_good2", "good2", true);

        // b is itself a plugin folder.
        let own = plugin_folder(&b, ".", "own", true);

        let missing = root.path().join("does-not-exist");
        let dirs = [
            sd(&missing, SearchOrigin::Explicit),
            sd(&a, SearchOrigin::Explicit),
            sd(&b, SearchOrigin::EnvVar),
        ];
        let found = discover(&dirs);

        let names: Vec<&str> = found.plugins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["bare", "good", "good2", "own"], "{found:#?}");
        let bare = &found.plugins[0];
        assert!(bare.manifest.is_none());
        assert_eq!(bare.library, a.join(lib_file("bare")));
        assert_eq!(bare.dir, a);
        let g = &found.plugins[1];
        assert_eq!(g.dir, good);
        assert_eq!(g.library, good.join(lib_file("good")));
        assert_eq!(g.manifest.as_ref().map(|m| m.name.as_str()), Some("good"));
        assert_eq!(g.origin, SearchOrigin::Explicit);
        assert_eq!(found.plugins[2].dir, good2);
        assert_eq!(found.plugins[3].origin, SearchOrigin::EnvVar);
        assert_eq!(found.plugins[3].library, own.join(lib_file("own")));
        assert_eq!(found.find("good").map(|p| p.dir.clone()), Some(good));

        assert_eq!(found.problems.len(), 2, "{:#?}", found.problems);
        let p0 = &found.problems[0];
        assert_eq!(p0.path, garbage.join(MANIFEST_FILE));
        assert!(matches!(
            p0.error,
            DiscoveryError::Manifest(ManifestError::Syntax { .. })
        ));
        let p1 = &found.problems[1];
        assert_eq!(p1.path, nolib.join(MANIFEST_FILE));
        let text = p1.error.to_string();
        assert!(matches!(p1.error, DiscoveryError::LibraryMissing { .. }));
        assert!(text.contains(&lib_file("nolib")), "{text}");
        assert!(
            text.contains(&nolib.join(MANIFEST_FILE).display().to_string()),
            "{text}"
        );
        assert!(
            text.contains(&format!("not in {}", nolib.display())),
            "{text}"
        );

        // deterministic
        let again = discover(&dirs);
        let names2: Vec<&str> = again.plugins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, names2);
    }

    #[cfg(unix)]
    #[test]
    fn world_writable_folders_and_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = TestDir::new("discover-ww");
        let open = plugin_folder(root.path(), "a_open", "open", true);
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let openlib = plugin_folder(root.path(), "b_openlib", "openlib", true);
        let lib = openlib.join(lib_file("openlib"));
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let bare = root.path().join(lib_file("openbare"));
        std::fs::write(&bare, b"x").expect("write");
        std::fs::set_permissions(&bare, std::fs::Permissions::from_mode(0o646)).expect("chmod");
        plugin_folder(root.path(), "c_fine", "fine", true);

        let found = discover(&[sd(root.path(), SearchOrigin::Explicit)]);
        let names: Vec<&str> = found.plugins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["fine"]);
        let paths: Vec<&Path> = found.problems.iter().map(|p| p.path.as_path()).collect();
        assert_eq!(paths, [open.as_path(), lib.as_path(), bare.as_path()]);
        let text = found.problems[0].error.to_string();
        assert_eq!(
            text,
            format!(
                "refused: folder {0} is writable by every user (mode 0777), so any of them could \
                 replace the plugin's code; remove their write permission (chmod o-w {0})",
                open.display()
            )
        );

        // A world-writable search folder is refused as a whole.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let found = discover(&[sd(root.path(), SearchOrigin::Explicit)]);
        assert!(found.plugins.is_empty());
        assert!(matches!(
            found.problems[..],
            [DiscoveryProblem {
                error: DiscoveryError::Untrusted(_),
                ..
            }]
        ));
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }

    /// The ways around a check of the plugin's own folder alone: a search folder under a folder
    /// anyone may write to, and a library that is a symlink into one.
    #[cfg(unix)]
    #[test]
    fn folders_above_and_symlink_targets_are_checked_too() {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        let root = TestDir::new("discover-above");
        let open = root.path().join("open");
        mkdir(&open);
        let search = open.join("plugins");
        mkdir(&search);
        plugin_folder(&search, "p", "p", true);
        chmod(&open, 0o777);
        let found = discover(&[sd(&search, SearchOrigin::Explicit)]);
        assert!(found.plugins.is_empty());
        assert_eq!(found.problems.len(), 1);
        assert_eq!(found.problems[0].path, search);
        let text = found.problems[0].error.to_string();
        assert!(
            text.starts_with(&format!(
                "refused: folder {} is writable by every user",
                open.display()
            )),
            "{text}"
        );
        chmod(&open, 0o755);
        assert_eq!(
            discover(&[sd(&search, SearchOrigin::Explicit)])
                .plugins
                .len(),
            1
        );

        // The library is a symlink to a file in a world-writable folder elsewhere.
        let lib = search.join("p").join(lib_file("p"));
        let elsewhere = root.path().join("elsewhere");
        mkdir(&elsewhere);
        std::fs::rename(&lib, elsewhere.join("real.so")).expect("move");
        std::os::unix::fs::symlink(elsewhere.join("real.so"), &lib).expect("symlink");
        chmod(&elsewhere, 0o777);
        let found = discover(&[sd(&search, SearchOrigin::Explicit)]);
        assert!(found.plugins.is_empty());
        assert_eq!(found.problems[0].path, lib);
        let text = found.problems[0].error.to_string();
        assert!(text.contains(&elsewhere.display().to_string()), "{text}");
        chmod(&elsewhere, 0o755);
        assert_eq!(
            discover(&[sd(&search, SearchOrigin::Explicit)])
                .plugins
                .len(),
            1
        );
    }

    /// A plugin folder `root/folder` holding plugin `name` (providing `providers`) with library
    /// `lib_file(name)` and, when given, a `sha256` pin.
    fn plugin_with(
        root: &Path,
        folder: &str,
        name: &str,
        providers: &[&str],
        sha256: Option<&str>,
    ) -> PathBuf {
        let dir = root.join(folder);
        mkdir(&dir);
        let lib = lib_file(name);
        let providers: Vec<String> = providers.iter().map(|p| format!("{p:?}")).collect();
        let pin = sha256.map_or_else(String::new, |d| format!("sha256 = {d:?}\n"));
        std::fs::write(
            dir.join(MANIFEST_FILE),
            format!(
                "name = {name:?}\nversion = \"0.1.0\"\nabi = \"1.0\"\nproviders = [{}]\n{pin}\
                 [library]\nlinux = {lib:?}\nmacos = {lib:?}\nwindows = {lib:?}\n",
                providers.join(", ")
            ),
        )
        .expect("write");
        std::fs::write(dir.join(&lib), format!("library of {name}")).expect("write");
        dir.join(lib)
    }

    #[test]
    fn an_ep_claimed_twice_is_reported_and_the_first_wins() {
        let root = TestDir::new("discover-shadow");
        let a = root.path().join("a");
        let b = root.path().join("b");
        mkdir(&a);
        mkdir(&b);
        let alpha = plugin_with(&a, "alpha", "alpha", &["relu", "gelu"], None);
        let beta = plugin_with(&b, "beta", "beta", &["relu", "tanh"], None);
        // A bare library claims the EP it is named after.
        let bare_gelu = b.join(lib_file("gelu"));
        std::fs::write(&bare_gelu, b"x").expect("write");
        let bare_tanh = a.join(lib_file("tanh"));
        std::fs::write(&bare_tanh, b"x").expect("write");

        let found = discover(&[sd(&a, SearchOrigin::Explicit), sd(&b, SearchOrigin::EnvVar)]);
        let names: Vec<&str> = found.plugins.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["alpha", "tanh", "beta", "gelu"], "{found:#?}");
        assert!(found.problems.is_empty(), "{:?}", found.problems);
        let got: Vec<(&str, &Path, &Path)> = found
            .shadowed
            .iter()
            .map(|s| {
                (
                    s.provider.as_str(),
                    s.winner_library.as_path(),
                    s.shadowed_library.as_path(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("relu", alpha.as_path(), beta.as_path()),
                ("tanh", bare_tanh.as_path(), beta.as_path()),
                ("gelu", alpha.as_path(), bare_gelu.as_path()),
            ]
        );
        assert_eq!(found.shadowed[1].winner, "tanh");
        assert_eq!(found.shadowed[1].shadowed, "beta");
        assert_eq!(
            found.shadowed[0].to_string(),
            format!(
                "EP `relu` is provided by plugin `alpha` ({}), found first on the search path; \
                 plugin `beta` ({}) also provides it and is shadowed for it \
                 (ask for `beta/relu` to use it, or reorder the search path)",
                alpha.display(),
                beta.display()
            )
        );
        assert_eq!(found.shadowing(&beta, "relu"), Some(&found.shadowed[0]));
        assert_eq!(found.shadowing(&alpha, "relu"), None);
        assert_eq!(found.shadowing(&beta, "nope"), None);

        // The same plugin name twice: only removing one (or reordering) chooses.
        let again = plugin_with(&b, "z_alpha", "alpha", &["relu"], None);
        let found = discover(&[sd(&a, SearchOrigin::Explicit), sd(&b, SearchOrigin::EnvVar)]);
        let last = found.shadowed.last().expect("shadowed");
        assert_eq!(
            (
                last.winner_library.as_path(),
                last.shadowed_library.as_path()
            ),
            (alpha.as_path(), again.as_path())
        );
        assert!(
            last.to_string().ends_with(
                "(both plugins are called `alpha`: remove one, or reorder the search path, to choose)"
            ),
            "{last}"
        );

        // Search order decides: b first makes beta the winner for relu.
        let found = discover(&[sd(&b, SearchOrigin::Explicit), sd(&a, SearchOrigin::EnvVar)]);
        let relu = found
            .shadowed
            .iter()
            .find(|s| s.provider == "relu")
            .expect("relu shadowed");
        assert_eq!(relu.winner_library, beta);
    }

    #[test]
    fn sha256_pin_is_checked_against_the_file() {
        let root = TestDir::new("discover-sha256");
        let digest = |name: &str| {
            crate::plugin::manifest::sha256_file(&root.path().join(name).join(lib_file(name)))
                .expect("hash")
        };
        plugin_with(root.path(), "unpinned", "unpinned", &["a"], None);
        // Written twice: the pin is the digest of the library as written first.
        plugin_with(root.path(), "pinned", "pinned", &["b"], None);
        let good = digest("pinned");
        plugin_with(
            root.path(),
            "pinned",
            "pinned",
            &["b"],
            Some(&good.to_ascii_uppercase()),
        );
        let wrong = "0".repeat(64);
        let bad_lib = plugin_with(root.path(), "wrong", "wrong", &["c"], Some(&wrong));
        let actual = digest("wrong");

        let found = discover(&[sd(root.path(), SearchOrigin::Explicit)]);
        assert!(found.problems.is_empty(), "{:?}", found.problems);
        let get = |name: &str| found.find(name).expect(name);
        assert_eq!(get("unpinned").verify_sha256().expect("no pin"), None);
        assert_eq!(get("pinned").verify_sha256().expect("matches"), Some(good));

        match get("wrong").verify_sha256() {
            Err(crate::Error::PluginLoad {
                path,
                kind: crate::PluginLoadErrorKind::ChecksumMismatch,
                message,
            }) => {
                assert_eq!(path, bad_lib);
                assert_eq!(
                    message,
                    format!(
                        "SHA-256 mismatch: {} has SHA-256 {actual}, but {} pins sha256 = \"{wrong}\". \
                         The file is not the library this plugin was packaged with, so it was not opened. \
                         Reinstall the plugin, or, if this library is the one you mean to run, update the pin to \"{actual}\"",
                        bad_lib.display(),
                        root.path().join("wrong").join(MANIFEST_FILE).display()
                    )
                );
            }
            other => panic!("expected ChecksumMismatch, got {other:?}"),
        }

        // A library that went away after discovery cannot be hashed: an Open error saying why.
        std::fs::remove_file(&bad_lib).expect("rm");
        match get("wrong").verify_sha256() {
            Err(crate::Error::PluginLoad {
                kind: crate::PluginLoadErrorKind::Open,
                message,
                ..
            }) => assert!(
                message.contains("to check it against the sha256 pinned in its plugin.toml"),
                "{message}"
            ),
            other => panic!("expected Open, got {other:?}"),
        }
    }

    #[test]
    fn a_file_as_search_dir_is_a_problem() {
        let root = TestDir::new("discover-file");
        let file = root.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        let found = discover(&[sd(&file, SearchOrigin::Explicit)]);
        assert!(found.plugins.is_empty());
        assert!(matches!(
            found.problems[..],
            [DiscoveryProblem {
                error: DiscoveryError::NotADirectory { .. },
                ..
            }]
        ));
    }

    #[test]
    fn search_path_order_and_relative_env_entries() {
        let root = TestDir::new("search-path");
        let exe_dir = root.path().join("bin");
        let lib_plugins = root.path().join("lib/epx/plugins");
        std::fs::create_dir_all(&exe_dir).expect("mkdir");
        std::fs::create_dir_all(&lib_plugins).expect("mkdir");
        // <exe dir>/plugins does not exist: not listed.

        let cwd = root.path().join("work");
        let env1 = root.path().join("env1");
        let env2 = root.path().join("env2");
        let env = std::env::join_paths([
            env1.clone(),
            PathBuf::from("relative/plugins"),
            PathBuf::new(),
            env2.clone(),
            env1.clone(),
            lib_plugins.clone(),
        ])
        .expect("join");

        let explicit = [PathBuf::from("mine"), env2.clone(), PathBuf::from("mine")];
        let dirs = search_path_from(&explicit, Some(&env), Some(&cwd), &[], Some(&exe_dir));
        let got: Vec<(PathBuf, SearchOrigin)> =
            dirs.into_iter().map(|d| (d.path, d.origin)).collect();
        assert_eq!(
            got,
            [
                (cwd.join("mine"), SearchOrigin::Explicit),
                (env2.clone(), SearchOrigin::Explicit),
                (env1.clone(), SearchOrigin::EnvVar),
                (lib_plugins.clone(), SearchOrigin::EnvVar),
            ]
        );

        // Without the env var the default comes last with its own origin.
        let dirs = search_path_from(&[], None, Some(&cwd), &[], Some(&exe_dir));
        assert_eq!(
            dirs,
            [SearchDir {
                path: lib_plugins,
                origin: SearchOrigin::Default
            }]
        );

        std::fs::create_dir_all(exe_dir.join("plugins")).expect("mkdir");
        let dirs = search_path_from(&[], None, None, &[], Some(&exe_dir));
        assert_eq!(dirs.len(), 2);
        assert_eq!(dirs[1].path, exe_dir.join("plugins"));

        // The public fn runs against the real environment without panicking.
        let _ = plugin_search_path(&[PathBuf::from("x")], &[]);
    }

    /// A `plugin.toml` that is a folder or a FIFO, and a library file that is a dangling link, a
    /// loop of links, a folder or a FIFO: each is a problem named with what it is, never a
    /// plugin skipped without a word (so `epx doctor` cannot say "all plugins OK").
    #[cfg(unix)]
    #[test]
    fn entries_that_are_not_regular_files_are_reported() {
        let root = TestDir::new("discover-not-files");
        let mk_fifo = |p: &Path| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        };
        let a = root.path().join("manifest-folder");
        mkdir(&a);
        mkdir(&a.join(MANIFEST_FILE));
        let b = root.path().join("manifest-fifo");
        mkdir(&b);
        mk_fifo(&b.join(MANIFEST_FILE));
        std::os::unix::fs::symlink(
            root.path().join("nowhere.so"),
            root.path().join(lib_file("dangling")),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            root.path().join(lib_file("loop2")),
            root.path().join(lib_file("loop1")),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            root.path().join(lib_file("loop1")),
            root.path().join(lib_file("loop2")),
        )
        .unwrap();
        mkdir(&root.path().join(lib_file("folder")));
        mk_fifo(&root.path().join(lib_file("fifo")));
        let c = plugin_folder(root.path(), "library-fifo", "libfifo", false);
        mk_fifo(&c.join(lib_file("libfifo")));

        let found = discover(&[sd(root.path(), SearchOrigin::Explicit)]);
        assert!(found.plugins.is_empty(), "{:?}", found.plugins);
        let text: Vec<String> = found.problems.iter().map(|p| p.error.to_string()).collect();
        let has = |needle: &str, what: &str| {
            assert!(
                text.iter().any(|t| t.contains(needle) && t.contains(what)),
                "{needle} / {what}: {text:#?}"
            )
        };
        has("manifest-folder", "it is a folder");
        has("manifest-fifo", "FIFO");
        has(&lib_file("dangling"), "leads nowhere");
        has(&lib_file("loop1"), "leads nowhere");
        has(&lib_file("folder"), "it is a folder");
        has(&lib_file("fifo"), "FIFO");
        has(&lib_file("libfifo"), "FIFO");
        assert_eq!(found.problems.len(), 8, "{text:#?}");
    }
}
