//! What dependency resolution found: each library, where it is or every folder searched.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use super::search::LIBRARY_PATH_ENV;

/// Which rule of the search order found a library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SearchPlace {
    /// The plugin's own folder.
    PluginDir,
    /// A `hints` folder from the manifest's `[[dependencies]]`.
    ManifestHint,
    /// `DT_RUNPATH`/`DT_RPATH` of the library that needs it.
    RunPath,
    /// `EPX_LIBRARY_PATH`.
    EnvLibraryPath,
    /// `LD_LIBRARY_PATH`, `/etc/ld.so.conf` or the default system folders; the system loader
    /// finds these on its own, so they are neither preloaded nor scanned further.
    SystemLoader,
    /// A Python `site-packages` folder of a vendor wheel.
    PythonPackage,
}

impl fmt::Display for SearchPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SearchPlace::PluginDir => "plugin folder",
            SearchPlace::ManifestHint => "manifest hint",
            SearchPlace::RunPath => "run path",
            SearchPlace::EnvLibraryPath => LIBRARY_PATH_ENV,
            SearchPlace::SystemLoader => "system loader path",
            SearchPlace::PythonPackage => "Python package",
        })
    }
}

/// The outcome for one needed library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyStatus {
    /// Found at `path` by rule `place`.
    Found { path: PathBuf, place: SearchPlace },
    /// Provided by the system and already loaded in the host process (glibc, libstdc++,
    /// libgcc_s, the dynamic loader…); `path` is where it is, when found in the system folders.
    System { path: Option<PathBuf> },
    /// Not found; `searched` lists the folders looked in, in order.
    Missing { searched: Vec<PathBuf> },
}

/// One needed library and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyEntry {
    /// The name asked for (`DT_NEEDED` or the manifest's `name`).
    pub name: String,
    /// The library that needs it (the plugin library for manifest-only dependencies).
    pub needed_by: PathBuf,
    pub status: DependencyStatus,
    /// A manifest dependency marked `optional = true` that no library lists in `DT_NEEDED`;
    /// when missing it does not make the report incomplete.
    pub optional: bool,
}

/// Everything a plugin library needs, transitively, and where each piece was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyReport {
    /// The plugin library.
    pub library: PathBuf,
    /// One entry per library name, in discovery order (breadth first).
    pub entries: Vec<DependencyEntry>,
    /// For the plugin library and each scanned dependency: the names it needs. Kept so that
    /// [`DependencyReport::preload_order`] respects every edge, not only the first one that
    /// found a library.
    pub(super) needs: BTreeMap<PathBuf, Vec<String>>,
}

/// The error for a plugin whose required libraries are missing; its `Display` lists each
/// missing library with every folder searched, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingDependencies {
    pub library: PathBuf,
    pub missing: Vec<DependencyEntry>,
}

/// Why dependencies could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    NotElf { path: PathBuf, reason: String },
}

impl ResolveError {
    /// The same error naming `shown` where it named `read` (a sealed copy read in place of the
    /// file the user knows).
    pub(crate) fn naming(self, read: &std::path::Path, shown: &std::path::Path) -> Self {
        let rename = |p: PathBuf| if p == read { shown.to_path_buf() } else { p };
        match self {
            ResolveError::Io { path, source } => ResolveError::Io {
                path: rename(path),
                source,
            },
            ResolveError::NotElf { path, reason } => ResolveError::NotElf {
                path: rename(path),
                reason,
            },
        }
    }
}

impl DependencyReport {
    /// Required libraries that were not found (optional manifest dependencies excluded).
    pub fn missing(&self) -> Vec<&DependencyEntry> {
        self.entries
            .iter()
            .filter(|e| !e.optional && matches!(e.status, DependencyStatus::Missing { .. }))
            .collect()
    }

    /// Every required library was found.
    pub fn is_complete(&self) -> bool {
        self.missing().is_empty()
    }

    /// `Ok` when complete, otherwise the error to show the operator.
    pub fn check(&self) -> Result<(), MissingDependencies> {
        let missing: Vec<DependencyEntry> = self.missing().into_iter().cloned().collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(MissingDependencies {
                library: self.library.clone(),
                missing,
            })
        }
    }

    /// Libraries to `dlopen` by absolute path before the plugin library: every found library
    /// the system loader would not find on its own (not [`DependencyStatus::System`], not
    /// [`SearchPlace::SystemLoader`]), each after the libraries it needs.
    pub fn preload_order(&self) -> Vec<PathBuf> {
        let by_name: HashMap<&str, &Path> = self
            .entries
            .iter()
            .filter_map(|e| match &e.status {
                DependencyStatus::Found { path, place } if *place != SearchPlace::SystemLoader => {
                    Some((e.name.as_str(), path.as_path()))
                }
                _ => None,
            })
            .collect();

        let mut order = Vec::new();
        let mut done: HashSet<&Path> = HashSet::new();
        // Iterative post-order walk; `in_progress` breaks cycles (which the loader tolerates).
        let mut in_progress: HashSet<&Path> = HashSet::new();
        let roots: Vec<&Path> = self
            .needs
            .get(&self.library)
            .into_iter()
            .flatten()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .chain(
                self.entries
                    .iter()
                    .filter_map(|e| by_name.get(e.name.as_str()).copied()),
            )
            .collect();
        for root in roots {
            let mut stack: Vec<(&Path, usize)> = vec![(root, 0)];
            while let Some((node, child)) = stack.pop() {
                if child == 0 && (done.contains(node) || !in_progress.insert(node)) {
                    continue;
                }
                let children: Vec<&Path> = self
                    .needs
                    .get(node)
                    .into_iter()
                    .flatten()
                    .filter_map(|n| by_name.get(n.as_str()).copied())
                    .collect();
                if let Some(next) = children.get(child) {
                    stack.push((node, child + 1));
                    if !done.contains(next) && !in_progress.contains(next) {
                        stack.push((next, 0));
                    }
                } else {
                    in_progress.remove(node);
                    if done.insert(node) {
                        order.push(node.to_path_buf());
                    }
                }
            }
        }
        order
    }
}

impl fmt::Display for DependencyReport {
    /// A listing of every entry, for `epx plugins --check`-style output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.library.display())?;
        for e in &self.entries {
            match &e.status {
                DependencyStatus::Found { path, place } => {
                    writeln!(f, "  {}: {} ({place})", e.name, path.display())?;
                }
                DependencyStatus::System { path: Some(path) } => {
                    writeln!(f, "  {}: system ({})", e.name, path.display())?;
                }
                DependencyStatus::System { path: None } => writeln!(f, "  {}: system", e.name)?,
                DependencyStatus::Missing { searched } => {
                    let what = if e.optional {
                        "not found (optional)"
                    } else {
                        "NOT FOUND"
                    };
                    writeln!(
                        f,
                        "  {}: {what}, needed by {}; searched:",
                        e.name,
                        e.needed_by.display()
                    )?;
                    for dir in searched {
                        writeln!(f, "      {}", dir.display())?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for MissingDependencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.missing.len();
        writeln!(
            f,
            "{} cannot be loaded: {n} required librar{} not found",
            self.library.display(),
            if n == 1 { "y is" } else { "ies are" }
        )?;
        for e in &self.missing {
            write!(
                f,
                "  {} (needed by {}): not found; searched:",
                e.name,
                e.needed_by.display()
            )?;
            match &e.status {
                DependencyStatus::Missing { searched } if !searched.is_empty() => {
                    for dir in searched {
                        write!(f, "\n    {}", dir.display())?;
                    }
                }
                _ => write!(f, " nothing")?,
            }
            writeln!(f)?;
        }
        write!(
            f,
            "Put each missing library in one of the folders above, add its folder to \
             {LIBRARY_PATH_ENV}, or name its folder in `hints` under [[dependencies]] in plugin.toml."
        )
    }
}

impl std::error::Error for MissingDependencies {}
