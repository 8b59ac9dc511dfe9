//! ONNX Runtime plugin-EP libraries (`CreateEpFactories`, ONNX Runtime 1.23 and newer: the form
//! vendors ship in `onnxruntime-ep-*` wheels) as epx EPs.
//!
//! The host opens this adapter for a manifest with `[onnxruntime_ep]` and gives it settings
//! ([`factories`]): the vendor library's path (the host's sealed copy of it, which passed every
//! check an epx plugin does), ONNX Runtime's names of its EPs, epx's names for them, and the
//! oldest ONNX Runtime the library works with. Then:
//!
//! - **registration**: the first time an EP is asked about, the library is registered with
//!   ONNX Runtime (`RegisterExecutionProviderLibrary`), once per process; what ONNX Runtime says
//!   when it cannot (a missing CUDA runtime, a library without `CreateEpFactories`) is the EP's
//!   reason to be unavailable;
//! - **devices**: ONNX Runtime's list for the EP (`GetEpDevices`), as for its built-in EPs. An EP
//!   that lists none is unavailable, and says which hardware ONNX Runtime found (a GPU EP on a
//!   machine without a GPU lists nothing and ONNX Runtime does not say why);
//! - **sessions**: the EP is appended with its devices (all of them, or the one a session
//!   chose) and its options (`SessionOptionsAppendExecutionProvider_V2`), with no fallback to
//!   ONNX Runtime's CPU EP: capability is what ONNX Runtime assigns to the EP, probed node by
//!   node as for every adapter EP, and a compiled group runs on it or fails.
//!
//! Options: `ops` (comma-separated op types: claim only these), `intra_op_num_threads`; every
//! other option goes to the EP as its own (`<ORT name>.<key>`), and one the EP refuses fails
//! `create` with the EP's message.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use epx_plugin_api::sdk::{
    self, DeviceInfo, Error, Provider, ProviderFactory, ProviderInfo, ProviderOptions,
};

use crate::provider::{Backend, OrtProvider};
use crate::runtime::{Runtime, ep_devices, runtime};

/// The settings the host gives ([`hosted`](../../epx/plugin/hosted/index.html)).
const KEYS: [&str; 7] = [
    "library",
    "library_file",
    "ep_names",
    "providers",
    "onnxruntime",
    "name",
    "version",
];

/// The hosted plugin's name and version, from the settings (what listings show).
pub fn plugin_name(settings: &[(String, String)]) -> (String, String) {
    let get = |k: &str| {
        settings
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    (
        get("name").unwrap_or_else(|| "onnxruntime-ep".to_owned()),
        get("version").unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned()),
    )
}

/// One registered (or refused) vendor library, shared by its EPs.
struct Hosted {
    /// What ONNX Runtime opens: the host's sealed copy.
    load_path: PathBuf,
    /// The vendor's file, for messages.
    file: PathBuf,
    /// The oldest ONNX Runtime it works with: (major, minor, patch).
    min_ort: (u64, u64, u64),
    /// The name it is registered under.
    registration: String,
    registered: OnceLock<Result<Arc<Runtime>, String>>,
}

/// One EP of a hosted library.
pub struct LibraryFactory {
    hosted: Arc<Hosted>,
    name: &'static str,
    ort_name: Arc<str>,
    /// The plugin's version (its manifest's or its package's).
    version: String,
}

fn version_triple(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
        parts.next().flatten().unwrap_or(0),
    ))
}

/// The EP factories for the host's settings; an unknown or missing setting is an error.
pub fn factories(settings: &[(String, String)]) -> sdk::Result<Vec<LibraryFactory>> {
    let get = |k: &str| {
        settings
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| Error::invalid_argument(format!("the host gave no `{k}` setting")))
    };
    if let Some((k, _)) = settings.iter().find(|(k, _)| !KEYS.contains(&k.as_str())) {
        return Err(Error::invalid_argument(format!(
            "unknown setting `{k}` (this adapter takes {})",
            KEYS.join(", ")
        )));
    }
    let list = |k: &str| -> sdk::Result<Vec<String>> {
        Ok(get(k)?
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect())
    };
    let (ep_names, providers) = (list("ep_names")?, list("providers")?);
    if ep_names.is_empty() || ep_names.len() != providers.len() {
        return Err(Error::invalid_argument(format!(
            "settings `ep_names` ({}) and `providers` ({}) must name the same EPs",
            ep_names.join(","),
            providers.join(",")
        )));
    }
    let min = get("onnxruntime")?;
    let version = plugin_name(settings).1;
    let hosted = Arc::new(Hosted {
        load_path: PathBuf::from(get("library")?),
        file: PathBuf::from(get("library_file")?),
        min_ort: version_triple(min).ok_or_else(|| {
            Error::invalid_argument(format!("setting `onnxruntime`: `{min}` is not a version"))
        })?,
        // Registered under its first EP's name, as ONNX Runtime's documentation does it (QNN's
        // factory names its EP after the registration); once per process (ONNX Runtime's
        // environment is one per process, and a session's devices must come from one factory):
        // another epx environment (another copy of this adapter) hosting the same plugin finds
        // it registered under this name already.
        registration: ep_names[0].clone(),
        registered: OnceLock::new(),
    });
    Ok(ep_names
        .into_iter()
        .zip(providers)
        .map(|(ort, epx)| LibraryFactory {
            hosted: hosted.clone(),
            // One per EP of a loaded plugin, for the life of the process.
            name: Box::leak(epx.into_boxed_str()),
            ort_name: ort.into(),
            version: version.clone(),
        })
        .collect())
}

/// Registrations made by this copy of the adapter (ONNX Runtime refuses a name twice).
static REGISTERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

impl Hosted {
    /// ONNX Runtime with the library registered, or why not.
    fn runtime(&self) -> sdk::Result<Arc<Runtime>> {
        self.registered
            .get_or_init(|| self.register())
            .clone()
            .map_err(Error::unavailable)
    }

    fn register(&self) -> Result<Arc<Runtime>, String> {
        let rt = runtime(None).map_err(|e| e.message)?;
        let have = version_triple(&rt.version).unwrap_or((0, 0, 0));
        let (a, b, c) = self.min_ort;
        if have < self.min_ort {
            return Err(format!(
                "{} needs ONNX Runtime {a}.{b}.{c} or newer; the one found is {} ({})",
                self.file.display(),
                rt.version,
                rt.path.display()
            ));
        }
        let mut done = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        if !done.contains(&self.registration) {
            match rt
                .env
                .register_ep_library(&self.registration, &self.load_path)
            {
                Ok(()) => {}
                // ONNX Runtime's environment is one per process: another copy of this adapter
                // (another epx environment hosting a plugin with these EPs) registered it; the
                // first library registered for an EP name serves it in this process.
                Err(e) if e.to_string().contains("already registered") => {}
                Err(e) => {
                    return Err(format!(
                        "ONNX Runtime {} could not register {}: {e}",
                        rt.version,
                        self.file.display()
                    ));
                }
            }
            done.push(self.registration.clone());
        }
        Ok(rt)
    }
}

/// The hardware ONNX Runtime found that some EP of it uses, for a message: `CPU (Intel)`, ...
fn hardware_seen(rt: &Runtime) -> String {
    let mut seen: Vec<String> = Vec::new();
    for d in rt.env.devices() {
        let hw = d.hardware_device();
        let kind = format!("{:?}", hw.ty());
        let text = match hw.vendor() {
            Ok(v) if !v.is_empty() => format!("{kind} ({v})"),
            _ => kind,
        };
        if !seen.contains(&text) {
            seen.push(text);
        }
    }
    if seen.is_empty() {
        "none".to_owned()
    } else {
        seen.join(", ")
    }
}

impl LibraryFactory {
    fn devices_of(&self, rt: &Runtime) -> sdk::Result<Vec<crate::runtime::OrtDevice>> {
        ep_devices(rt, &self.ort_name)
    }

    /// ONNX Runtime with the library registered and at least one device for this EP.
    fn usable(&self) -> sdk::Result<Arc<Runtime>> {
        let rt = self.hosted.runtime()?;
        if self.devices_of(&rt)?.is_empty() {
            return Err(Error::unavailable(format!(
                "{}: ONNX Runtime {} registered {}, and it lists no device for {}: the \
                 library's factory took none of the hardware ONNX Runtime found here ({}), or \
                 has no EP of that name. ONNX Runtime gives no reason; a GPU or NPU EP lists \
                 nothing on a machine without one",
                self.name,
                rt.version,
                self.hosted.file.display(),
                self.ort_name,
                hardware_seen(&rt)
            )));
        }
        Ok(rt)
    }
}

impl ProviderFactory for LibraryFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: self.name.into(),
            vendor: format!("{} (ONNX Runtime plugin-EP library)", self.ort_name),
            version: self.version.clone(),
            // Host memory: the EP moves data to its device inside each kernel.
            device_type: crate::Memory::Host.dl_device(),
            // `OrtApi::Run` is thread-safe on one session.
            concurrent_kernels: true,
        }
    }

    fn availability(&self) -> sdk::Result<()> {
        self.usable().map(|_| ())
    }

    fn devices(&self) -> sdk::Result<Vec<DeviceInfo>> {
        match self.hosted.runtime() {
            Ok(rt) => Ok(self.devices_of(&rt)?.into_iter().map(|d| d.info).collect()),
            Err(_) => Ok(Vec::new()),
        }
    }

    fn create(&self, mut options: ProviderOptions) -> sdk::Result<Box<dyn Provider>> {
        let ops: Option<HashSet<String>> = options.take("ops").map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        });
        let intra_threads =
            options.take_parsed::<usize>("intra_op_num_threads", "a thread count")?;
        let chosen = options.take_device()?;
        // Every other option is the EP's own.
        let ep_options = options.take_rest();
        let given: Vec<String> = ep_options.iter().map(|(k, _)| k.clone()).collect();
        let rt = self.usable()?;
        if let Some(d) = chosen {
            let n = self.devices_of(&rt)?.len();
            if d as usize >= n {
                return Err(Error::invalid_argument(format!(
                    "{}: ONNX Runtime lists {n} device(s) for {}, not device {d}",
                    self.name, self.ort_name
                )));
            }
        }
        let backend = Backend::Library {
            ort_name: self.ort_name.clone(),
            options: ep_options.into(),
            device: chosen.map(|d| d as usize),
        };
        let provider = OrtProvider::new(self.name, rt, backend, intra_threads, ops);
        // The EP reads its options when a session is made: make one now (a one-node model it
        // may or may not take), so an option it refuses fails here, with its message.
        provider.check_options().map_err(|e| {
            // ONNX Runtime wraps the EP's own message after its source location.
            let said = e
                .rsplit("Error creating execution provider: ")
                .next()
                .unwrap_or(&e)
                .trim();
            let options = if given.is_empty() {
                "none".to_owned()
            } else {
                given.join(", ")
            };
            Error::invalid_argument(format!(
                "{}: ONNX Runtime could not set up {} for a session (options given: {options}): \
                 {said}",
                self.name, self.ort_name
            ))
        })?;
        Ok(Box::new(provider))
    }
}
