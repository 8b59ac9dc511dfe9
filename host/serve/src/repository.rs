//! The model repository: `DIR/<model>/<version>/model.onnx`, with an optional
//! `DIR/<model>/config.toml`. Each model's highest numbered version that holds a `model.onnx` is
//! loaded; a model that fails to load is kept with its error (listed, logged, refused by name)
//! and never stops the others or the server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use epx::{Environment, Session, ValueSpec};

use crate::config::{BatchingConfig, ModelConfig};
use crate::infer::{BatchQueue, Workers};
use crate::protocol::ServeError;
use tokio::sync::Semaphore;

/// A loaded model: its session, shapes and admission limits.
pub struct Model {
    pub name: String,
    pub version: String,
    pub session: Session,
    pub inputs: Vec<ValueSpec>,
    pub outputs: Vec<ValueSpec>,
    /// Permits for a request to wait or run: `max_queue` more than can run at once.
    pub admitted: Arc<Semaphore>,
    /// Permits to run: `instances`.
    pub running: Arc<Semaphore>,
    /// What its requests did.
    pub stats: crate::stats::ModelStats,
    /// The most rows a run takes along the first dimension (0: no batch dimension).
    pub max_batch_size: usize,
    /// The longest a request may take (`timeout_ms`).
    pub timeout: Option<Duration>,
    /// `[dynamic_batching]`, if set.
    batching: Option<BatchingConfig>,
    /// The batcher's queue, started with the first request.
    batcher: OnceLock<BatchQueue>,
    /// The threads that run it, one per instance.
    pub(crate) workers: Workers,
}

impl Model {
    /// The queue of the model's batcher, when it batches requests.
    pub(crate) fn batch_queue(self: &Arc<Self>) -> Option<&BatchQueue> {
        self.batching.as_ref()?;
        Some(
            self.batcher
                .get_or_init(|| crate::infer::start_batcher(self)),
        )
    }

    /// `max_batch_size`, the preferred sizes and the longest wait for a batch.
    pub(crate) fn batching(&self) -> (usize, Vec<usize>, Duration) {
        let b = self.batching.as_ref();
        (
            self.max_batch_size,
            b.map(|b| b.preferred_sizes.clone()).unwrap_or_default(),
            Duration::from_micros(b.map_or(0, |b| b.max_queue_delay_us)),
        )
    }
}

/// A model of the repository, loaded or not.
pub enum Entry {
    Ready(Arc<Model>),
    /// Its load failed, and why.
    Failed(String),
    /// Unloaded on request.
    Unloaded,
}

/// One model's line of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    /// The loaded version, if any.
    pub version: Option<String>,
    /// `READY` or `UNAVAILABLE`.
    pub state: &'static str,
    /// Why it is unavailable.
    pub reason: Option<String>,
}

/// Every model of a repository folder. Models load at start and on request (the repository
/// extension's load), each replacing the model of its name once loaded; a request already
/// running keeps the model it started with.
pub struct Repository {
    pub root: PathBuf,
    env: Arc<Environment>,
    models: RwLock<BTreeMap<String, Entry>>,
    /// Held through a load, so that two loads do not build the same model at once.
    loading: Mutex<()>,
    /// Each model folder's stamp when it was last loaded (`--model-control-mode poll` loads a
    /// folder again when its stamp changes).
    stamps: Mutex<BTreeMap<String, Stamp>>,
}

/// Which models load when the server starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    /// Every model folder.
    All,
    /// These folders only (each must exist).
    Named(Vec<String>),
}

/// What a model folder holds, to tell that it changed: every file's path, size and modification
/// time down to the version folders' files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stamp(Vec<(PathBuf, u64, Option<std::time::SystemTime>)>);

/// The most entries a stamp reads: a folder larger than that is compared on its first ones.
const STAMP_ENTRIES: usize = 4096;

impl Stamp {
    pub fn of(dir: &Path) -> Stamp {
        let mut seen = Vec::new();
        let mut todo = vec![(dir.to_path_buf(), 0)];
        while let Some((d, depth)) = todo.pop() {
            let Ok(items) = std::fs::read_dir(&d) else {
                continue;
            };
            for item in items.flatten() {
                if seen.len() >= STAMP_ENTRIES {
                    break;
                }
                // Not followed: a link is stamped as the link (its target's size and time).
                let path = item.path();
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                if meta.is_dir() {
                    if depth < 2 {
                        todo.push((path.clone(), depth + 1));
                    }
                    seen.push((path, 0, None));
                } else {
                    seen.push((path, meta.len(), meta.modified().ok()));
                }
            }
        }
        seen.sort();
        Stamp(seen)
    }
}

impl Repository {
    /// Loads the models `startup` names under `root` (an error only when `root` cannot be read
    /// or a named model has no folder).
    pub fn open(
        env: &Arc<Environment>,
        root: &Path,
        startup: &Startup,
    ) -> Result<Repository, String> {
        let repo = Repository {
            root: root.to_path_buf(),
            env: env.clone(),
            models: RwLock::new(BTreeMap::new()),
            loading: Mutex::new(()),
            stamps: Mutex::new(BTreeMap::new()),
        };
        let folders = repo.folders()?;
        let names = match startup {
            Startup::All => folders,
            Startup::Named(names) => {
                if let Some(missing) = names.iter().find(|n| !folders.contains(n)) {
                    return Err(format!(
                        "--load-model {missing}: the model repository has no model folder of \
                         that name (it has: {})",
                        folders.join(", ")
                    ));
                }
                names.clone()
            }
        };
        for name in names {
            // A failure is kept with the model and logged; it never stops the others.
            let _ = repo.load(&name);
        }
        Ok(repo)
    }

    /// Reads the repository again: loads each model folder that is new or changed since it was
    /// last loaded, and drops each model whose folder is gone. Returns the names loaded and
    /// dropped.
    pub fn poll(&self) -> Result<(Vec<String>, Vec<String>), String> {
        let folders = self.folders()?;
        let mut loaded = Vec::new();
        for name in &folders {
            let now = Stamp::of(&self.root.join(name));
            let changed = self.stamps().get(name) != Some(&now);
            if changed {
                // A failure is kept with the model (the index says why) until it changes again.
                let _ = self.load(name);
                loaded.push(name.clone());
            }
        }
        let gone: Vec<String> = self
            .read()
            .keys()
            .filter(|k| !folders.contains(k))
            .cloned()
            .collect();
        for name in &gone {
            self.write().remove(name);
            self.stamps().remove(name);
            tracing::info!("model {name}: its folder is gone; no longer served");
        }
        Ok((loaded, gone))
    }

    /// `text` with the repository's own location taken out: a client sees `add/1/model.onnx`,
    /// not where the server keeps it.
    fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        let canonical = std::fs::canonicalize(&self.root).ok();
        for root in std::iter::once(self.root.as_path()).chain(canonical.as_deref()) {
            let shown = root.display().to_string();
            if shown.is_empty() || shown == "." {
                continue;
            }
            let with_slash = format!("{}/", shown.trim_end_matches('/'));
            out = out.replace(&with_slash, "").replace(&shown, "<repository>");
        }
        out
    }

    fn stamps(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Stamp>> {
        self.stamps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The names of the model folders under the root.
    fn folders(&self) -> Result<Vec<String>, String> {
        let dir = std::fs::read_dir(&self.root)
            .map_err(|e| format!("model repository {}: {e}", self.root.display()))?;
        let mut names = Vec::new();
        for item in dir.flatten() {
            let path = item.path();
            if !path.is_dir() {
                continue;
            }
            match path.file_name().and_then(|n| n.to_str()) {
                Some(name) if valid_name(name) => names.push(name.to_owned()),
                _ => tracing::warn!(
                    "model repository: skipping {} (not a model name: UTF-8, no leading dot)",
                    path.display()
                ),
            }
        }
        names.sort();
        Ok(names)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        self.models.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.models.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads (or reloads) model `name` from its folder: the model of that name is replaced once
    /// the new one is ready, and kept as it was when the load fails. Blocks while it loads.
    pub fn load(&self, name: &str) -> Result<(), ServeError> {
        if !valid_name(name) {
            return Err(ServeError::BadRequest(format!(
                "`{name}` is not a model name (one folder name of the repository)"
            )));
        }
        let dir = self.root.join(name);
        if !dir.is_dir() {
            return Err(ServeError::NotFound(format!(
                "no model named `{name}`: the repository has no folder `{name}`"
            )));
        }
        let _one_at_a_time = self.loading.lock().unwrap_or_else(|p| p.into_inner());
        // Stamped before reading, so that a change made during the load is seen by the next poll.
        self.stamps().insert(name.to_owned(), Stamp::of(&dir));
        match load_model(&self.env, name, &dir) {
            Ok(model) => {
                tracing::info!("model {name}: version {} ready", model.version);
                self.write()
                    .insert(name.to_owned(), Entry::Ready(Arc::new(model)));
                Ok(())
            }
            Err(e) => {
                // The log has the server's paths; clients see them from the repository's root.
                tracing::error!("model {name}: not loaded: {e}");
                let e = self.redact(&e);
                let mut models = self.write();
                // A model that was serving keeps serving; otherwise the failure is what the
                // index and the requests report.
                if !matches!(models.get(name), Some(Entry::Ready(_))) {
                    models.insert(name.to_owned(), Entry::Failed(e.clone()));
                }
                Err(ServeError::BadRequest(format!(
                    "model `{name}` failed to load: {e}"
                )))
            }
        }
    }

    /// Unloads model `name`: new requests for it are refused; those running finish.
    pub fn unload(&self, name: &str) -> Result<(), ServeError> {
        let mut models = self.write();
        match models.get_mut(name) {
            Some(entry) => {
                *entry = Entry::Unloaded;
                tracing::info!("model {name}: unloaded");
                Ok(())
            }
            None => Err(ServeError::NotFound(format!("no model named `{name}`"))),
        }
    }

    /// Every model folder of the repository (read again now) with its state.
    pub fn index(&self) -> Result<Vec<IndexEntry>, ServeError> {
        let names = self.folders().map_err(ServeError::Internal)?;
        let models = self.read();
        let mut all: Vec<String> = names;
        // A model loaded earlier whose folder has since gone stays listed while it serves.
        all.extend(
            models
                .keys()
                .filter(|k| !all.contains(k))
                .cloned()
                .collect::<Vec<_>>(),
        );
        all.sort();
        Ok(all
            .into_iter()
            .map(|name| {
                let (version, state, reason) = match models.get(&name) {
                    Some(Entry::Ready(m)) => (Some(m.version.clone()), "READY", None),
                    Some(Entry::Failed(e)) => (None, "UNAVAILABLE", Some(e.clone())),
                    Some(Entry::Unloaded) => (None, "UNAVAILABLE", Some("unloaded".to_owned())),
                    None => (None, "UNAVAILABLE", Some("not loaded".to_owned())),
                };
                IndexEntry {
                    name,
                    version,
                    state,
                    reason,
                }
            })
            .collect())
    }

    /// The model `name` at `version` (the loaded one when `None`), or why not.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<Model>, ServeError> {
        match self.read().get(name) {
            None if valid_name(name) && self.root.join(name).is_dir() => {
                Err(ServeError::NotFound(format!(
                    "model `{name}` is not loaded (load it with POST \
                     /v2/repository/models/{name}/load)"
                )))
            }
            None => Err(ServeError::NotFound(format!("no model named `{name}`"))),
            Some(Entry::Failed(e)) => Err(ServeError::NotFound(format!(
                "model `{name}` is not loaded: {e}"
            ))),
            Some(Entry::Unloaded) => Err(ServeError::NotFound(format!(
                "model `{name}` is unloaded (load it with POST /v2/repository/models/{name}/load)"
            ))),
            Some(Entry::Ready(m)) => match version {
                Some(v) if !v.is_empty() && v != m.version => Err(ServeError::NotFound(format!(
                    "model `{name}` has no version {v} loaded (loaded: {})",
                    m.version
                ))),
                _ => Ok(m.clone()),
            },
        }
    }

    /// The loaded models.
    pub fn ready(&self) -> Vec<Arc<Model>> {
        self.read()
            .values()
            .filter_map(|e| match e {
                Entry::Ready(m) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    /// Whether no model failed to load (unloaded ones were asked to be).
    pub fn all_ready(&self) -> bool {
        !self.read().values().any(|e| matches!(e, Entry::Failed(_)))
    }
}

/// A model's name: one folder of the repository (no separators, no leading dot, so that a name
/// from a request never reaches outside the root).
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0'])
}

fn load_model(env: &Arc<Environment>, name: &str, dir: &Path) -> Result<Model, String> {
    let config_path = dir.join("config.toml");
    let config = match std::fs::read_to_string(&config_path) {
        Ok(text) => toml::from_str::<ModelConfig>(&text)
            .map_err(|e| format!("{}: {e}", config_path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ModelConfig::default(),
        Err(e) => return Err(format!("{}: {e}", config_path.display())),
    };
    config
        .check()
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    // The highest numbered version folder with a model.onnx.
    let version = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .filter_map(|v| {
            let n: u64 = v.file_name().to_str()?.parse().ok()?;
            v.path().join("model.onnx").is_file().then_some(n)
        })
        .max()
        .ok_or_else(|| {
            format!(
                "no version folder with a model.onnx under {} (expected {}/1/model.onnx)",
                dir.display(),
                dir.display()
            )
        })?;
    let file = dir.join(version.to_string()).join("model.onnx");
    let builder = Session::builder()
        .map_err(|e| e.to_string())?
        .with_environment(env.clone());
    let session = config
        .apply(builder)
        .map_err(|e| format!("{}: {e}", config_path.display()))?
        .commit_from_file(&file)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    config
        .check_model(&session.inputs(), &session.outputs())
        .map_err(|e| format!("{}: {e}", config_path.display()))?;
    let mut nodes: Vec<(String, usize)> = Vec::new();
    for provider in session.node_placement() {
        match nodes.iter_mut().find(|(p, _)| p == provider) {
            Some((_, n)) => *n += 1,
            None => nodes.push((provider.to_owned(), 1)),
        }
    }
    // A batch holds up to max_batch_size requests per instance, besides those queued.
    let at_once = config.instances * config.max_batch_size.max(1);
    Ok(Model {
        name: name.to_owned(),
        version: version.to_string(),
        inputs: session.inputs(),
        outputs: session.outputs(),
        session,
        admitted: Arc::new(Semaphore::new(config.max_queue + at_once)),
        running: Arc::new(Semaphore::new(config.instances)),
        stats: crate::stats::ModelStats::new(config.max_batch_size, nodes),
        max_batch_size: config.max_batch_size,
        timeout: config.timeout(),
        batching: config.dynamic_batching,
        batcher: OnceLock::new(),
        workers: Workers::start(name, config.instances)?,
    })
}
