//! The environment: where plugins are searched, which were found, which are loaded, and the
//! execution providers every session starts from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::discover::{self, Discovery, PluginCandidate, SearchDir};
use crate::error::{Error, PluginLoadErrorKind, Result};
use crate::plugin::PluginLibrary;
use crate::session::ExecutionProvider;
use epx_plugin_api::abi::EpxPluginEntryFn;

/// Name of the plugin that holds the providers linked into the host (the CPU EP).
pub const BUILTIN_PLUGIN: &str = "builtin";

type LoadOutcome = std::result::Result<Arc<PluginLibrary>, (PluginLoadErrorKind, String)>;

/// Plugin search path, discovery results, loaded libraries and default EPs.
pub struct Environment {
    search: Vec<SearchDir>,
    discovery: Discovery,
    /// Load results by library path; failures are kept so a broken plugin is tried once.
    loaded: Mutex<HashMap<PathBuf, LoadOutcome>>,
    /// Plugins linked into the application ([`EnvironmentBuilder::with_linked_plugin`]).
    linked: Vec<Arc<PluginLibrary>>,
    builtin: Arc<PluginLibrary>,
    default_providers: Vec<ExecutionProvider>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("search", &self.search)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Environment`].
#[derive(Default)]
pub struct EnvironmentBuilder {
    dirs: Vec<PathBuf>,
    default_dirs: Vec<PathBuf>,
    providers: Vec<ExecutionProvider>,
    linked: Vec<EpxPluginEntryFn>,
}

impl EnvironmentBuilder {
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
        let search = discover::plugin_search_path(&self.dirs, &self.default_dirs);
        let discovery = discover::discover(&search);
        for p in &discovery.problems {
            tracing::warn!(path = %p.path.display(), "plugin skipped: {}", p.error);
        }
        for s in &discovery.shadowed {
            tracing::warn!(ep = %s.provider, "{s}");
        }
        // SAFETY: the CPU EP's entry function is linked into this binary, so its code lives as
        // long as the process.
        let builtin = unsafe { PluginLibrary::from_entry(epx_cpu::builtin_plugin_entry, None) }?;
        let mut linked = Vec::with_capacity(self.linked.len());
        for entry in self.linked {
            // SAFETY: the caller of `with_linked_plugin` vouched for the entry function.
            linked.push(unsafe { PluginLibrary::from_entry(entry, None) }?);
        }
        Ok(Arc::new(Environment {
            search,
            discovery,
            loaded: Mutex::new(HashMap::new()),
            linked,
            builtin,
            default_providers: self.providers,
        }))
    }
}

impl Environment {
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

    /// The folders searched, in order.
    pub fn search_path(&self) -> &[SearchDir] {
        &self.search
    }

    /// Plugins found (not yet loaded) and the problems met while looking.
    pub fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    pub fn default_providers(&self) -> &[ExecutionProvider] {
        &self.default_providers
    }

    /// The library holding the providers linked into the host.
    pub fn builtin(&self) -> &Arc<PluginLibrary> {
        &self.builtin
    }

    /// Loads a discovered plugin (once; later calls return the same library or error).
    ///
    /// Before the library is opened, its manifest's `abi` is checked and, when the manifest pins
    /// `sha256`, the file is hashed: a mismatch is
    /// [`PluginLoadErrorKind::ChecksumMismatch`] and none of the library's code runs.
    pub fn load(&self, candidate: &PluginCandidate) -> Result<Arc<PluginLibrary>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let entry = loaded.entry(candidate.library.clone()).or_insert_with(|| {
            if let Some(m) = &candidate.manifest {
                // The manifest says which ABI the library was built for: refuse a wrong major
                // without running any of the library's code.
                if m.abi.major != u64::from(epx_plugin_api::abi::EPX_ABI_VERSION_MAJOR) {
                    return Err((
                        PluginLoadErrorKind::AbiMismatch,
                        format!(
                            "its plugin.toml declares epx plugin ABI {}, but this host speaks ABI {}.{}",
                            m.abi,
                            epx_plugin_api::abi::EPX_ABI_VERSION_MAJOR,
                            epx_plugin_api::abi::EPX_ABI_VERSION_MINOR
                        ),
                    ));
                }
            }
            // A pinned library is hashed before it is opened: a file that is not the one the
            // plugin was packaged with never runs.
            let to_kind = |e: Error| match e {
                Error::PluginLoad { kind, message, .. } => (kind, message),
                other => (PluginLoadErrorKind::Open, other.to_string()),
            };
            if let Some(digest) = candidate.verify_sha256().map_err(to_kind)? {
                tracing::debug!(
                    library = %candidate.library.display(),
                    sha256 = %digest,
                    "library matches its sha256 pin"
                );
            }
            PluginLibrary::load(&candidate.library, candidate.manifest.as_ref()).map_err(to_kind)
        });
        match entry {
            Ok(lib) => Ok(lib.clone()),
            Err((kind, message)) => Err(Error::PluginLoad {
                path: candidate.library.clone(),
                kind: *kind,
                message: message.clone(),
            }),
        }
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
        for c in &self.discovery.plugins {
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
                return Ok((lib, i));
            }
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
        let known: Vec<String> = self
            .discovery
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

    /// Default options the manifest of `lib` gives EP `ep` (empty without a manifest).
    pub fn default_options(&self, lib: &PluginLibrary, ep: &str) -> Vec<(String, String)> {
        let Some(path) = &lib.path else {
            return Vec::new();
        };
        self.discovery
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

    /// Loads every discovered plugin, for listings: each candidate with its library or error.
    pub fn load_all(&self) -> Vec<(PluginCandidate, Result<Arc<PluginLibrary>>)> {
        self.discovery
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
