//! The environment: where plugins are searched, which were found, which are loaded, and the
//! execution providers every session starts from.
//!
//! It knows no EP by name: the providers linked into the host library (the CPU EP) are handed
//! to it as [`BuiltinProviders`] by the layer that links them (`crate::builtin`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::request::ExecutionProvider;
use crate::error::{Error, Result};
use crate::plugin::PluginLibrary;
use crate::plugin::admit::{AdmissionReport, admit, compare_with_manifest};
use crate::plugin::discover::{self, Discovery, PluginCandidate, SearchDir};
use crate::plugin::isolate::{self, Isolation};
use crate::plugin::probe::LoadProbe;
use crate::plugin::python_eps::{Package as PythonPackage, PythonEps};
use crate::plugin::refusal::Refusal;
use crate::plugin::sealed::LibraryImage;
use epx_plugin_api::abi::EpxPluginEntryFn;

/// Name of the plugin that holds the providers linked into the host (the CPU EP).
pub const BUILTIN_PLUGIN: &str = "builtin";

/// The providers linked into the host library, and the one among them that runs what no other
/// EP claims.
#[derive(Clone, Copy, Debug)]
pub struct BuiltinProviders {
    /// The entry function of the linked plugin.
    pub entry: EpxPluginEntryFn,
    /// The EP every session falls back to, always last.
    pub fallback: &'static str,
    /// The fallback EP's option for its thread count
    /// ([`SessionBuilder::with_intra_op_threads`](crate::SessionBuilder::with_intra_op_threads)).
    pub threads_option: &'static str,
}

/// What loading one library came to: the admission report it was loaded on, and the library or
/// the refusal.
#[derive(Clone)]
struct LoadOutcome {
    admission: Arc<AdmissionReport>,
    library: std::result::Result<Arc<PluginLibrary>, Refusal>,
}

/// A library as its entry function described it (opened here or in a child), held against its
/// manifest: ABI differences are logged, a mismatch in the EPs it provides refuses it.
fn checked_against_manifest(
    candidate: &PluginCandidate,
    lib: Arc<PluginLibrary>,
) -> std::result::Result<Arc<PluginLibrary>, Refusal> {
    let Some(m) = &candidate.manifest else {
        return Ok(lib);
    };
    let diff = compare_with_manifest(m, &lib);
    for w in &diff.abi_warnings {
        tracing::warn!(plugin = %candidate.name, "{w}");
    }
    diff.refusal().map_or(Ok(lib), Err)
}

/// A device one EP can run on, as [`Environment::devices`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProviderDevice {
    /// How a session asks for this EP on this device: `cuda:1`, `openvino:GPU.0`.
    pub selector: String,
    pub provider: String,
    /// The plugin as sessions name it (`plugin/ep`): its manifest's name, or `builtin`.
    pub plugin: String,
    pub device: crate::plugin::Device,
}

/// Plugin search path, discovery results, loaded libraries and default EPs.
pub struct Environment {
    search: Vec<SearchDir>,
    /// The plugins of the plugin folders.
    folders: Discovery,
    /// Plugin-EP packages the Python search found, not asked yet ([`crate::plugin::python_eps`]).
    packages: Vec<PythonPackage>,
    /// `folders` with the packages asked and added, made the first time a package's EPs are
    /// wanted (an EP nothing else provides, a listing).
    with_packages: OnceLock<Discovery>,
    /// Load results by library path; failures are kept so a broken plugin is tried once.
    loaded: Mutex<HashMap<PathBuf, LoadOutcome>>,
    /// Admission reports by library path: the probe child and loading open the copies one
    /// report sealed, so a file rewritten between the probe and the load changes nothing.
    admitted: Mutex<HashMap<PathBuf, Arc<AdmissionReport>>>,
    /// Libraries whose probe child loaded them (the same sealed copies): not probed again.
    probed: Mutex<std::collections::HashSet<PathBuf>>,
    /// Plugins linked into the application ([`EnvironmentBuilder::with_linked_plugin`]).
    linked: Vec<Arc<PluginLibrary>>,
    builtin: Arc<PluginLibrary>,
    builtin_providers: BuiltinProviders,
    default_providers: Vec<ExecutionProvider>,
    probe: Option<LoadProbe>,
    epx_exe: Option<PathBuf>,
    isolation_timeout: Option<std::time::Duration>,
    cache_dir: Option<PathBuf>,
    kernel_cache: Option<bool>,
    kernel_cache_limit: Option<u64>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("search", &self.search)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Environment`]; [`Environment::builder`] starts one with the providers linked
/// into the host library.
pub struct EnvironmentBuilder {
    builtin: BuiltinProviders,
    dirs: Vec<PathBuf>,
    default_dirs: Vec<PathBuf>,
    providers: Vec<ExecutionProvider>,
    linked: Vec<EpxPluginEntryFn>,
    probe: Option<LoadProbe>,
    epx_exe: Option<PathBuf>,
    isolation_timeout: Option<std::time::Duration>,
    cache_dir: Option<PathBuf>,
    kernel_cache: Option<bool>,
    kernel_cache_limit: Option<u64>,
    python_eps: PythonEps,
}

impl EnvironmentBuilder {
    /// A builder whose environment has `builtin` as its built-in providers.
    pub fn with_builtin(builtin: BuiltinProviders) -> Self {
        EnvironmentBuilder {
            builtin,
            dirs: Vec::new(),
            default_dirs: Vec::new(),
            providers: Vec::new(),
            linked: Vec::new(),
            probe: None,
            epx_exe: None,
            isolation_timeout: None,
            cache_dir: None,
            kernel_cache: None,
            kernel_cache_limit: None,
            python_eps: PythonEps::Off,
        }
    }

    /// Where ONNX Runtime plugin-EP packages installed with pip are looked for
    /// ([`crate::plugin::python_eps`]); `EPX_PYTHON_EPS` overrides it. Default: nowhere, since
    /// asking a package runs its code. Even where the search looks, a package is asked only when
    /// its EPs are wanted (an EP name nothing else provides, or a listing).
    pub fn with_python_eps(mut self, scope: PythonEps) -> Self {
        self.python_eps = scope;
        self
    }

    /// The folder for what epx remembers between runs (the `measure` policy's choices). Without
    /// one: `EPX_CACHE_DIR`, else `$XDG_CACHE_HOME/epx`, else `$HOME/.cache/epx`.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Whether sessions keep compiled kernels of EPs that can serialize them (ABI 1.6) in
    /// `<cache dir>/kernels` and reuse them. Default: on, unless `EPX_KERNEL_CACHE` is `0`,
    /// `off`, `false` or `no`.
    pub fn with_kernel_cache(mut self, enabled: bool) -> Self {
        self.kernel_cache = Some(enabled);
        self
    }

    /// The size the kernel cache folder is held to, evicting the entries used least recently
    /// (default: `EPX_KERNEL_CACHE_MAX_BYTES`, else 2 GiB).
    pub fn with_kernel_cache_limit(mut self, bytes: u64) -> Self {
        self.kernel_cache_limit = Some(bytes);
        self
    }

    /// How long one call into an isolated EP may take before its process is taken for hung,
    /// killed and restarted (default: `EPX_ISOLATE_TIMEOUT_S`, else 600 s).
    pub fn with_isolation_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.isolation_timeout = Some(timeout);
        self
    }

    /// The `epx` executable that hosts isolated EPs (`epx serve-plugin`): plugins whose manifest
    /// says `isolate = true`, and EPs requested with [`ExecutionProvider::isolated`]. Without
    /// one, `EPX_PROBE_EXE` is used, and failing that such EPs cannot be set up.
    pub fn with_epx_executable(mut self, exe: impl Into<PathBuf>) -> Self {
        self.epx_exe = Some(exe.into());
        self
    }

    /// Every admitted library is first handed to `probe`, which opens it somewhere a crash
    /// cannot hurt (`epx` re-executes itself for each; libepx runs the `epx` beside it), before
    /// this process opens it. A probe's `Err` refuses the library with its refusal
    /// ([`PluginLoadErrorKind::Crashed`](crate::error::PluginLoadErrorKind::Crashed) when the
    /// child died or hung, the child's own reason when it could not load it); the library's code
    /// never runs here.
    pub fn with_load_probe(mut self, probe: LoadProbe) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Adds plugin folders searched before `EPX_PLUGIN_PATH` and the default location.
    pub fn with_plugin_dirs<P: Into<PathBuf>>(mut self, dirs: impl IntoIterator<Item = P>) -> Self {
        self.dirs.extend(dirs.into_iter().map(Into::into));
        self
    }

    /// Adds default plugin folders, searched after `EPX_PLUGIN_PATH` and before the folders next
    /// to the executable, when they exist (libepx adds `<its folder>/epx/plugins`).
    pub fn with_default_plugin_dirs<P: Into<PathBuf>>(
        mut self,
        dirs: impl IntoIterator<Item = P>,
    ) -> Self {
        self.default_dirs.extend(dirs.into_iter().map(Into::into));
        self
    }

    /// EPs every session of this environment tries, after the session's own.
    pub fn with_execution_providers(
        mut self,
        eps: impl IntoIterator<Item = ExecutionProvider>,
    ) -> Self {
        self.providers.extend(eps);
        self
    }

    /// Adds a plugin linked into the application: its entry function (as made by
    /// `epx_plugin_api::plugin_entry!`) is called like a loaded library's. Its EPs are found after
    /// those of plugin folders and before the built-in ones.
    ///
    /// # Safety
    /// `entry` must implement the plugin ABI; its code lives as long as the process.
    pub unsafe fn with_linked_plugin(mut self, entry: EpxPluginEntryFn) -> Self {
        self.linked.push(entry);
        self
    }

    pub fn commit(self) -> Result<Arc<Environment>> {
        // epx's ONNX Runtime adapter ships beside the default plugin folders.
        crate::plugin::hosted::add_adapter_dirs_for(&self.default_dirs);
        let search = discover::plugin_search_path(&self.dirs, &self.default_dirs);
        let mut discovery = discover::discover(&search);
        discovery.shadowed = discover::shadowed_providers(&discovery.plugins);
        warn_about(&discovery, 0, 0);
        let packages = crate::plugin::python_eps::find(PythonEps::from_env_or(self.python_eps));
        // SAFETY: the built-in entry function is linked into this binary (`BuiltinProviders`
        // comes from the layer that links it), so its code lives as long as the process.
        let builtin = unsafe { PluginLibrary::from_entry(self.builtin.entry, None) }?;
        let mut linked = Vec::with_capacity(self.linked.len());
        for entry in self.linked {
            // SAFETY: the caller of `with_linked_plugin` vouched for the entry function.
            linked.push(unsafe { PluginLibrary::from_entry(entry, None) }?);
        }
        Ok(Arc::new(Environment {
            search,
            folders: discovery,
            packages,
            with_packages: OnceLock::new(),
            loaded: Mutex::new(HashMap::new()),
            admitted: Mutex::new(HashMap::new()),
            probed: Mutex::new(std::collections::HashSet::new()),
            linked,
            builtin,
            builtin_providers: self.builtin,
            default_providers: self.providers,
            probe: self.probe,
            epx_exe: self.epx_exe,
            isolation_timeout: self.isolation_timeout,
            cache_dir: self.cache_dir,
            kernel_cache: self.kernel_cache,
            kernel_cache_limit: self.kernel_cache_limit,
        }))
    }
}

/// Logs what `d` found wrong, past the first `problems` problems and `shadowed` shadowings
/// (logged before).
fn warn_about(d: &Discovery, problems: usize, shadowed: usize) {
    for p in d.problems.iter().skip(problems) {
        tracing::warn!(path = %p.path.display(), "plugin skipped: {}", p.error);
    }
    for s in d.shadowed.iter().skip(shadowed) {
        tracing::warn!(ep = %s.provider, "{s}");
    }
}

impl Environment {
    /// A builder with the providers linked into the host library.
    pub fn builder() -> EnvironmentBuilder {
        EnvironmentBuilder::default()
    }

    /// The process-wide environment: `EPX_PLUGIN_PATH` and the default plugin folder.
    pub fn global() -> Result<Arc<Environment>> {
        static GLOBAL: OnceLock<Arc<Environment>> = OnceLock::new();
        if let Some(env) = GLOBAL.get() {
            return Ok(env.clone());
        }
        let env = Environment::builder().commit()?;
        Ok(GLOBAL.get_or_init(|| env).clone())
    }

    /// The cache folder ([`EnvironmentBuilder::with_cache_dir`]), if one can be named.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        self.cache_dir
            .clone()
            .or_else(|| var("EPX_CACHE_DIR"))
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("epx")))
            .or_else(|| var("HOME").map(|d| d.join(".cache").join("epx")))
    }

    /// The cache folder when it may be used: [`cache::check_folder`](crate::cache::check_folder)
    /// passes it (nobody else can write it, no symbolic link inside it). One that does not is
    /// not used, as if the cache were off, with one warning per process naming the folder and
    /// the fix.
    pub fn trusted_cache_dir(&self) -> Option<PathBuf> {
        let dir = self.cache_dir()?;
        match crate::cache::check_folder(&dir) {
            Ok(()) => Some(dir),
            Err(why) => {
                static WARNED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
                let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
                if !warned.contains(&dir) {
                    warned.push(dir);
                    tracing::warn!("{why}; sessions compile every kernel afresh");
                }
                None
            }
        }
    }

    /// The compiled-kernel cache sessions use, unless it is switched off
    /// ([`EnvironmentBuilder::with_kernel_cache`], `EPX_KERNEL_CACHE=off`), no cache folder
    /// can be named, or the folder is not trusted ([`Self::trusted_cache_dir`]).
    pub fn kernel_cache(&self) -> Option<crate::cache::KernelCache> {
        let from_env = std::env::var("EPX_KERNEL_CACHE").ok().map(|v| {
            !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "off" | "false" | "no"
            )
        });
        if !self.kernel_cache.or(from_env).unwrap_or(true) {
            return None;
        }
        let limit = self.kernel_cache_limit.or_else(|| {
            let v = std::env::var("EPX_KERNEL_CACHE_MAX_BYTES").ok()?;
            let parsed = v.trim().parse().ok();
            if parsed.is_none() {
                tracing::warn!(
                    "EPX_KERNEL_CACHE_MAX_BYTES={v:?} is not a number of bytes; the limit is the \
                     default 2 GiB"
                );
            }
            parsed
        });
        let dir = self.trusted_cache_dir()?;
        Some(crate::cache::KernelCache::new(
            &dir,
            limit.unwrap_or(crate::cache::DEFAULT_MAX_BYTES),
        ))
    }

    /// How isolated EPs are hosted: the executable given to the builder, else `EPX_PROBE_EXE`.
    pub fn isolation(&self) -> Option<Isolation> {
        let mut iso = self
            .epx_exe
            .clone()
            .or_else(|| std::env::var_os("EPX_PROBE_EXE").map(PathBuf::from))
            .map(Isolation::new)?;
        if let Some(t) = self.isolation_timeout {
            iso.timeout = t;
        }
        Some(iso)
    }

    /// The folders searched, in order.
    pub fn search_path(&self) -> &[SearchDir] {
        &self.search
    }

    /// Plugins found (not yet loaded) and the problems met while looking, the plugin-EP
    /// packages of the Python search included (asking them now, if the search found any).
    pub fn discovery(&self) -> &Discovery {
        if self.packages.is_empty() {
            return &self.folders;
        }
        self.with_packages.get_or_init(|| {
            let mut d = self.folders.clone();
            crate::plugin::python_eps::ask_all(&self.packages, &mut d);
            d.shadowed = discover::shadowed_providers(&d.plugins);
            warn_about(&d, self.folders.problems.len(), self.folders.shadowed.len());
            d
        })
    }

    /// The plugin-EP packages the Python search found, not asked yet (asking them is
    /// [`Self::discovery`]'s).
    pub fn python_packages(&self) -> &[PythonPackage] {
        &self.packages
    }

    pub fn default_providers(&self) -> &[ExecutionProvider] {
        &self.default_providers
    }

    /// The library holding the providers linked into the host.
    pub fn builtin(&self) -> &Arc<PluginLibrary> {
        &self.builtin
    }

    /// Which built-in EP is the fallback, and its thread option.
    pub fn builtin_providers(&self) -> &BuiltinProviders {
        &self.builtin_providers
    }

    /// Loads a discovered plugin (once; later calls return the same library or error).
    ///
    /// The library is opened only once [`admit`] passes it: its manifest's `abi`, its `sha256`
    /// pin and its dependencies are checked first, so a refused library runs none of its code.
    pub fn load(&self, candidate: &PluginCandidate) -> Result<Arc<PluginLibrary>> {
        self.outcome(candidate)
            .library
            .map_err(|r| r.into_error(&candidate.library))
    }

    /// The admission report a plugin was (or is now) loaded on, and the load's result: what
    /// `epx doctor` shows, from the same checks loading made.
    pub fn admission(
        &self,
        candidate: &PluginCandidate,
    ) -> (Arc<AdmissionReport>, Result<Arc<PluginLibrary>>) {
        let outcome = self.outcome(candidate);
        let library = outcome
            .library
            .map_err(|r| r.into_error(&candidate.library));
        (outcome.admission, library)
    }

    /// The admission report of `candidate`, made once per environment: the probe and the load
    /// work from the same sealed copies.
    fn admitted(&self, candidate: &PluginCandidate) -> Arc<AdmissionReport> {
        let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        admitted
            .entry(candidate.library.clone())
            .or_insert_with(|| Arc::new(admit(candidate)))
            .clone()
    }

    fn outcome(&self, candidate: &PluginCandidate) -> LoadOutcome {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        loaded
            .entry(candidate.library.clone())
            .or_insert_with(|| {
                let admission = self.admitted(candidate);
                let library = match (&admission.refusal, &admission.image) {
                    (Some(refusal), _) => Err(refusal.clone()),
                    (None, None) => Err(Refusal::new(
                        crate::error::PluginLoadErrorKind::Open,
                        "internal: admitted without a library image",
                    )),
                    (None, Some(image)) => {
                        self.open_admitted(candidate, image, &admission.preloads)
                    }
                };
                LoadOutcome { admission, library }
            })
            .clone()
    }

    /// Opens what admission passed: in a child only when its manifest says `isolate = true`,
    /// else in this process once the probe (if any) survived opening the same bytes.
    fn open_admitted(
        &self,
        candidate: &PluginCandidate,
        image: &LibraryImage,
        preloads: &[LibraryImage],
    ) -> std::result::Result<Arc<PluginLibrary>, Refusal> {
        if candidate.manifest.as_ref().is_some_and(|m| m.isolate) {
            return self.open_isolated(candidate, image, preloads);
        }
        if let Some(probe) = &self.probe
            && !self.was_probed(&candidate.library)
        {
            probe(candidate, image, preloads)?;
            self.mark_probed(&candidate.library);
        }
        PluginLibrary::open(image, preloads)
            .and_then(|lib| checked_against_manifest(candidate, lib))
    }

    /// A plugin whose manifest says `isolate = true`: opened in a child process, never here.
    fn open_isolated(
        &self,
        candidate: &PluginCandidate,
        image: &LibraryImage,
        preload: &[LibraryImage],
    ) -> std::result::Result<Arc<PluginLibrary>, Refusal> {
        let isolation = self.isolation().ok_or_else(|| {
            Refusal::new(
                crate::error::PluginLoadErrorKind::Open,
                "its manifest says `isolate = true`, but no epx executable is known to host it \
                 (the program did not name one, and EPX_PROBE_EXE is not set); it was not opened",
            )
        })?;
        let described = isolate::describe(&isolation, image, preload)?;
        let lib = PluginLibrary::isolated(image, preload, isolation, described);
        checked_against_manifest(candidate, lib)
    }

    /// Finds the library providing EP `name` (`ep` or `plugin/ep`): discovered plugins in search
    /// order, then the built-in providers. Plugins are loaded only as needed. When several
    /// discovered plugins claim the EP, the first in search order is the one used (the others are
    /// listed in [`Discovery::shadowed`]).
    pub fn find_provider(&self, name: &str) -> Result<(Arc<PluginLibrary>, usize)> {
        let (plugin, ep) = match name.split_once('/') {
            Some((p, e)) => (Some(p), e),
            None => (None, name),
        };
        if let Some(found) = self.find_among(&self.folders.plugins, plugin, ep)? {
            return Ok(found);
        }
        for lib in &self.linked {
            if plugin.is_none_or(|p| p == lib.name) {
                if let Some(i) = lib.providers.iter().position(|p| p.name == ep) {
                    return Ok((lib.clone(), i));
                }
            }
        }
        if plugin.is_none_or(|p| p == BUILTIN_PLUGIN) {
            if let Some(i) = self.builtin.providers.iter().position(|p| p.name == ep) {
                return Ok((self.builtin.clone(), i));
            }
        }
        // Last, the pip packages the Python search found: asked only now that nothing else has
        // the EP.
        if !self.packages.is_empty() {
            let asked = &self.discovery().plugins[self.folders.plugins.len()..];
            if let Some(found) = self.find_among(asked, plugin, ep)? {
                return Ok(found);
            }
        }
        let known: Vec<String> = self
            .discovery()
            .plugins
            .iter()
            .flat_map(|c| match &c.manifest {
                Some(m) => m.providers.clone(),
                None => vec![c.name.clone()],
            })
            .chain(
                self.linked
                    .iter()
                    .flat_map(|l| l.providers.iter().map(|p| p.name.clone())),
            )
            .chain(self.builtin.providers.iter().map(|p| p.name.clone()))
            .collect();
        let searched: Vec<String> = self
            .search
            .iter()
            .map(|d| d.path.display().to_string())
            .collect();
        Err(Error::ProviderSetup {
            name: name.to_string(),
            message: format!(
                "no plugin provides it; known EPs: {}; plugin folders searched: {}",
                known.join(", "),
                if searched.is_empty() {
                    "(none)".to_string()
                } else {
                    searched.join(", ")
                }
            ),
        })
    }

    /// The first of `candidates` providing `ep` (of plugin `plugin`, when named), loading
    /// those that may.
    fn find_among(
        &self,
        candidates: &[PluginCandidate],
        plugin: Option<&str>,
        ep: &str,
    ) -> Result<Option<(Arc<PluginLibrary>, usize)>> {
        for c in candidates {
            if plugin.is_some_and(|p| p != c.name) {
                continue;
            }
            let may_provide = match &c.manifest {
                Some(m) => m.providers.iter().any(|p| p == ep),
                // Without a manifest, only loading tells; a bare library is assumed to be
                // named after its EP.
                None => plugin.is_some() || c.name == ep,
            };
            if !may_provide {
                continue;
            }
            let lib = self.load(c)?;
            if let Some(i) = lib.providers.iter().position(|p| p.name == ep) {
                return Ok(Some((lib, i)));
            }
        }
        Ok(None)
    }

    /// Default options the manifest of `lib` gives EP `ep` (empty without a manifest).
    pub fn default_options(&self, lib: &PluginLibrary, ep: &str) -> Vec<(String, String)> {
        let Some(path) = &lib.path else {
            return Vec::new();
        };
        self.folders
            .plugins
            .iter()
            .find(|c| &c.library == path)
            .and_then(|c| c.manifest.as_ref())
            .and_then(|m| m.default_options.get(ep))
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Plugins linked into the application.
    pub fn linked(&self) -> &[Arc<PluginLibrary>] {
        &self.linked
    }

    /// Whether EP `name` can be found and runs on this machine (loading its plugin if needed).
    pub fn is_available(&self, name: &str) -> bool {
        self.find_provider(name)
            .is_ok_and(|(lib, i)| lib.providers[i].availability.is_ok())
    }

    /// Names of every EP that can run here: plugin folders (loading every plugin), linked
    /// plugins, then the built-in ones; each name once, in that order.
    pub fn available_providers(&self) -> Vec<String> {
        let loaded: Vec<Arc<PluginLibrary>> = self
            .load_all()
            .into_iter()
            .filter_map(|(_, l)| l.ok())
            .collect();
        let mut names: Vec<String> = Vec::new();
        for lib in loaded
            .iter()
            .chain(&self.linked)
            .chain(std::iter::once(&self.builtin))
        {
            for p in &lib.providers {
                if p.availability.is_ok() && !names.contains(&p.name) {
                    names.push(p.name.clone());
                }
            }
        }
        names
    }

    /// Runs `probe` on every discovered plugin not loaded (nor probed) yet that admission
    /// passes, all at once (a child each), and remembers the outcome: one it refuses is never
    /// opened here, one it loaded is opened later without probing it again.
    pub fn probe_unloaded(&self, probe: &LoadProbe) {
        self.probe_candidates(probe, &self.discovery().plugins);
    }

    /// [`Self::probe_unloaded`] with the environment's own load probe, if it has one: what a
    /// listing does first ([`Self::load_all`] does it itself).
    pub fn probe_all(&self) {
        if let Some(probe) = &self.probe {
            self.probe_candidates(probe, &self.discovery().plugins);
        }
    }

    fn probe_candidates(&self, probe: &LoadProbe, candidates: &[PluginCandidate]) {
        let pending: Vec<(&PluginCandidate, Arc<AdmissionReport>)> = candidates
            .iter()
            .filter(|c| self.loaded_outcome(&c.library).is_none() && !self.was_probed(&c.library))
            .map(|c| (c, self.admitted(c)))
            .filter(|(_, a)| a.refusal.is_none() && a.image.is_some())
            .collect();
        let outcomes: Vec<std::result::Result<(), Refusal>> = std::thread::scope(|s| {
            let running: Vec<_> = pending
                .iter()
                .map(|(c, a)| {
                    s.spawn(move || match &a.image {
                        Some(image) => probe(c, image, &a.preloads),
                        None => Ok(()),
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Refusal::new(
                            crate::error::PluginLoadErrorKind::Crashed,
                            "probing it failed",
                        ))
                    })
                })
                .collect()
        });
        for ((candidate, admission), outcome) in pending.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => self.mark_probed(&candidate.library),
                Err(refusal) => {
                    let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
                    loaded
                        .entry(candidate.library.clone())
                        .or_insert_with(|| LoadOutcome {
                            admission,
                            library: Err(refusal),
                        });
                }
            }
        }
    }

    fn was_probed(&self, library: &Path) -> bool {
        let probed = self.probed.lock().unwrap_or_else(|p| p.into_inner());
        probed.contains(library)
    }

    fn mark_probed(&self, library: &Path) {
        let mut probed = self.probed.lock().unwrap_or_else(|p| p.into_inner());
        probed.insert(library.to_path_buf());
    }

    fn loaded_outcome(&self, library: &Path) -> Option<LoadOutcome> {
        let loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        loaded.get(library).cloned()
    }

    /// Every device the EPs of this environment list (ABI 1.5), loading every discovered plugin:
    /// plugins in search order, then linked and built-in EPs. A plugin that fails to load, or an
    /// EP that lists no devices, adds none (`epx providers` says why).
    pub fn devices(&self) -> Vec<ProviderDevice> {
        let loaded = self
            .load_all()
            .into_iter()
            .filter_map(|(c, l)| Some((c.name, l.ok()?)));
        let libs: Vec<(String, Arc<PluginLibrary>)> = loaded
            .chain(self.linked.iter().map(|l| (l.name.clone(), l.clone())))
            .chain(std::iter::once((
                BUILTIN_PLUGIN.to_string(),
                self.builtin.clone(),
            )))
            .collect();
        let mut out = Vec::new();
        for (plugin, lib) in &libs {
            for p in &lib.providers {
                for d in &p.devices {
                    out.push(ProviderDevice {
                        selector: d.selector(&p.name),
                        provider: p.name.clone(),
                        plugin: plugin.clone(),
                        device: d.clone(),
                    });
                }
            }
        }
        out
    }

    /// Loads every discovered plugin, for listings: each candidate with its library or error.
    /// With a load probe, every library is probed first, all at once.
    pub fn load_all(&self) -> Vec<(PluginCandidate, Result<Arc<PluginLibrary>>)> {
        self.probe_all();
        self.discovery()
            .plugins
            .iter()
            .map(|c| (c.clone(), self.load(c)))
            .collect()
    }

    /// A plugin library given by path, outside the search path (for tools and tests).
    pub fn load_library(&self, path: &Path) -> Result<Arc<PluginLibrary>> {
        let candidate = PluginCandidate {
            name: path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            library: path.to_path_buf(),
            manifest: None,
            origin: discover::SearchOrigin::Explicit,
        };
        self.load(&candidate)
    }
}

impl ExecutionProvider {
    /// Whether this EP is found and can run on this machine, in the global environment
    /// (`EPX_PLUGIN_PATH` and the default plugin folder). See [`Environment::is_available`].
    pub fn is_available(&self) -> Result<bool> {
        Ok(Environment::global()?.is_available(&self.name))
    }
}
