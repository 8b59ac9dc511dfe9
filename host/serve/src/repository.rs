//! The model repository: `DIR/<model>/<version>/model.onnx`, with an optional
//! `DIR/<model>/config.toml`. Each model's highest numbered version that holds a `model.onnx` is
//! loaded; a model that fails to load is kept with its error (listed, logged, refused by name)
//! and never stops the others or the server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use epx::{Environment, Session, ValueSpec};
use serde::Deserialize;
use tokio::sync::Semaphore;

/// `config.toml` of one model. Unknown keys are refused with the file's name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Threads the CPU EP shares each kernel's work across (absent: one per core).
    pub threads: Option<usize>,
    /// Runs of this model that may compute at once.
    #[serde(default = "one")]
    pub instances: usize,
    /// Requests that may wait for an instance; one more is refused (HTTP 503).
    #[serde(default = "default_queue")]
    pub max_queue: usize,
}

fn one() -> usize {
    1
}

fn default_queue() -> usize {
    64
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            threads: None,
            instances: 1,
            max_queue: default_queue(),
        }
    }
}

/// A loaded model: its session, shapes and admission limits.
pub struct Model {
    pub name: String,
    pub version: String,
    pub session: Session,
    pub inputs: Vec<ValueSpec>,
    pub outputs: Vec<ValueSpec>,
    /// Permits for a request to wait or run: `max_queue + instances`.
    pub admitted: Arc<Semaphore>,
    /// Permits to run: `instances`.
    pub running: Arc<Semaphore>,
    /// What its requests did.
    pub stats: crate::stats::ModelStats,
}

/// A model of the repository, loaded or not.
pub enum Entry {
    Ready(Arc<Model>),
    Failed(String),
}

/// Every model of a repository folder.
pub struct Repository {
    pub root: PathBuf,
    pub models: BTreeMap<String, Entry>,
}

impl Repository {
    /// Loads every model under `root` (an error only when `root` cannot be read).
    pub fn load(env: &Arc<Environment>, root: &Path) -> Result<Repository, String> {
        let dir = std::fs::read_dir(root)
            .map_err(|e| format!("model repository {}: {e}", root.display()))?;
        let mut models = BTreeMap::new();
        for item in dir.flatten() {
            let path = item.path();
            if !path.is_dir() {
                continue;
            }
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                tracing::warn!(
                    "model repository: skipping {} (not a UTF-8 name)",
                    path.display()
                );
                continue;
            };
            let entry = match load_model(env, &name, &path) {
                Ok(model) => {
                    tracing::info!("model {name}: version {} ready", model.version);
                    Entry::Ready(Arc::new(model))
                }
                Err(e) => {
                    tracing::error!("model {name}: not loaded: {e}");
                    Entry::Failed(e)
                }
            };
            models.insert(name, entry);
        }
        Ok(Repository {
            root: root.to_path_buf(),
            models,
        })
    }

    /// The model `name` at `version` (the loaded one when `None`), or why not.
    pub fn get(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<Model>, crate::protocol::ServeError> {
        use crate::protocol::ServeError;
        match self.models.get(name) {
            None => Err(ServeError::NotFound(format!("no model named `{name}`"))),
            Some(Entry::Failed(e)) => Err(ServeError::NotFound(format!(
                "model `{name}` is not loaded: {e}"
            ))),
            Some(Entry::Ready(m)) => match version {
                Some(v) if v != m.version => Err(ServeError::NotFound(format!(
                    "model `{name}` has no version {v} loaded (loaded: {})",
                    m.version
                ))),
                _ => Ok(m.clone()),
            },
        }
    }

    /// The loaded models.
    pub fn ready(&self) -> impl Iterator<Item = &Arc<Model>> {
        self.models.values().filter_map(|e| match e {
            Entry::Ready(m) => Some(m),
            Entry::Failed(_) => None,
        })
    }

    /// Whether every model loaded.
    pub fn all_ready(&self) -> bool {
        self.models.values().all(|e| matches!(e, Entry::Ready(_)))
    }
}

fn load_model(env: &Arc<Environment>, name: &str, dir: &Path) -> Result<Model, String> {
    let config_path = dir.join("config.toml");
    let config = match std::fs::read_to_string(&config_path) {
        Ok(text) => toml::from_str::<ModelConfig>(&text)
            .map_err(|e| format!("{}: {e}", config_path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ModelConfig::default(),
        Err(e) => return Err(format!("{}: {e}", config_path.display())),
    };
    if config.instances == 0 {
        return Err(format!(
            "{}: instances must be at least 1",
            config_path.display()
        ));
    }
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
    let mut builder = Session::builder()
        .map_err(|e| e.to_string())?
        .with_environment(env.clone());
    if let Some(n) = config.threads {
        builder = builder.with_intra_op_threads(n);
    }
    let session = builder
        .commit_from_file(&file)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(Model {
        name: name.to_owned(),
        version: version.to_string(),
        inputs: session.inputs(),
        outputs: session.outputs(),
        session,
        admitted: Arc::new(Semaphore::new(config.max_queue + config.instances)),
        running: Arc::new(Semaphore::new(config.instances)),
        stats: Default::default(),
    })
}
