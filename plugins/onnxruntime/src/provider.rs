//! `ProviderFactory` / `Provider` / `Kernel` over ONNX Runtime sessions.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use epx_plugin_api::ElementType;
use epx_plugin_api::abi::{EpxLogLevel, EpxValueKind};
use epx_plugin_api::sdk::{
    self, Attribute, Capability, DataTransfer, Error, GraphView, Kernel, KernelContext, NodeView,
    Provider, ProviderFactory, ProviderInfo, ProviderOptions, SubgraphView, TensorView,
};
use ort::AsPointer;
use ort::ep::ExecutionProviderDispatch;
use ort::logging::LogLevel;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::sys::{ONNXTensorElementDataType, OrtValue};

use crate::device::{Binding, DeviceIo, MemInfo, Memory, OwnedValue, wrap};
use crate::ep::OrtEp;
use crate::patch::fill_unknown_types;
use crate::runtime::{Runtime, check, ort_type, runtime};

/// One ONNX Runtime EP as an epx provider factory.
#[derive(Debug, Clone, Copy)]
pub struct OrtFactory {
    ep: OrtEp,
    name: &'static str,
    memory: Memory,
}

impl OrtFactory {
    /// The EP under its epx name, in the memory it computes in ([`OrtEp::memory`]).
    pub fn new(ep: OrtEp) -> Self {
        OrtFactory {
            ep,
            name: ep.epx_name(),
            memory: ep.memory(),
        }
    }

    /// The EP under another epx name, keeping its tensors in `memory`. With
    /// [`Memory::OrtCpu`] this runs the device path (ORT allocator, IO binding, copies) on the
    /// CPU; the test plugin `ort_cpu_device` is made this way.
    pub fn with_memory(ep: OrtEp, name: &'static str, memory: Memory) -> Self {
        OrtFactory { ep, name, memory }
    }

    pub fn ep(&self) -> OrtEp {
        self.ep
    }

    fn check_platform(&self) -> sdk::Result<()> {
        let p = self.ep.platforms();
        let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
        if p.allows(os, arch) {
            Ok(())
        } else {
            Err(Error::unavailable(format!(
                "`{}` ({}) needs {}; this machine is {os}/{arch}",
                self.name,
                self.ep.ort_name(),
                p.needs
            )))
        }
    }

    fn check_runtime(&self, library: Option<&std::path::Path>) -> sdk::Result<Arc<Runtime>> {
        let rt = runtime(library)?;
        if !rt.providers.iter().any(|p| p == self.ep.ort_name()) {
            return Err(Error::unavailable(format!(
                "`{}`: the ONNX Runtime {} library at {} does not include {}; it has {}. \
                 Install a build with it (for CUDA and TensorRT: the onnxruntime-gpu wheel; for \
                 OpenVINO: onnxruntime-openvino) and point the `library` option, \
                 EPX_ORT_LIBRARY or EPX_ORT_SEARCH_PATH at it",
                self.name,
                rt.version,
                rt.path.display(),
                self.ep.ort_name(),
                rt.providers.join(", ")
            )));
        }
        Ok(rt)
    }
}

impl OrtFactory {
    /// Applies the options ONNX Runtime gives for device `d` of this EP (its `device_id`, as
    /// ONNX Runtime numbers devices, not their place in its list); an option the user gave that
    /// says otherwise is an error. Returns the device id set, if one was.
    fn select_device(
        &self,
        rt: &Runtime,
        d: u32,
        ep_options: &mut Vec<(String, String)>,
    ) -> sdk::Result<Option<i32>> {
        let listed = crate::runtime::ep_devices(rt, self.ep.ort_name())?;
        let device = listed.get(d as usize).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{}: ONNX Runtime lists {} device(s) for {}, not device {d}",
                self.name,
                listed.len(),
                self.ep.ort_name()
            ))
        })?;
        let mut id = None;
        let mut selected = false;
        for (k, v) in &device.options {
            let Some(&key) = self.ep.option_keys().iter().find(|o| **o == k.as_str()) else {
                continue;
            };
            selected = true;
            let same = |given: &str| match (given.trim().parse::<i64>(), v.trim().parse::<i64>()) {
                (Ok(a), Ok(b)) => a == b,
                _ => given.trim() == v.trim(),
            };
            match ep_options.iter().find(|(ek, _)| ek == key) {
                Some((_, given)) if !same(given) => {
                    return Err(Error::invalid_argument(format!(
                        "{}: option `{key}` says {given}, but the session chose device {d}, \
                         which ONNX Runtime selects with {key}={v}; give one of them",
                        self.name
                    )));
                }
                Some(_) => {}
                None => ep_options.push((key.to_string(), v.clone())),
            }
            if key == "device_id" {
                id = v.trim().parse::<i32>().ok();
            }
        }
        if !selected && d != 0 {
            return Err(Error::invalid_argument(format!(
                "{}: ONNX Runtime gives no option that selects device {d} of {}",
                self.name,
                self.ep.ort_name()
            )));
        }
        Ok(id)
    }
}

impl ProviderFactory for OrtFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: self.name.into(),
            vendor: self.ep.vendor().into(),
            version: env!("CARGO_PKG_VERSION").into(),
            // Host memory: ORT moves data to its device inside each kernel. Device memory: tensors
            // stay there between kernels (see `device`).
            device_type: self.memory.dl_device(),
            // `OrtApi::Run` is thread-safe on one session.
            concurrent_kernels: true,
        }
    }

    fn availability(&self) -> sdk::Result<()> {
        self.check_platform()?;
        self.check_runtime(None).map(|_| ())
    }

    /// ONNX Runtime's own list for this EP (`GetEpDevices`); none where the EP cannot run.
    fn devices(&self) -> sdk::Result<Vec<sdk::DeviceInfo>> {
        if self.check_platform().is_err() {
            return Ok(Vec::new());
        }
        match self.check_runtime(None) {
            Ok(rt) => Ok(crate::runtime::ep_devices(&rt, self.ep.ort_name())?
                .into_iter()
                .map(|d| d.info)
                .collect()),
            Err(_) => Ok(Vec::new()),
        }
    }

    fn create(&self, mut options: ProviderOptions) -> sdk::Result<Box<dyn Provider>> {
        let library = options.take("library").map(PathBuf::from);
        let ops: Option<HashSet<String>> = options.take("ops").map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        });
        // A device the session chose from the list: its place among the EP's devices, which is
        // the EP's `device_id` where it has one.
        let chosen = options.take_device()?;
        let mut intra_threads = None;
        let mut device_id = 0;
        let mut ep_options = Vec::new();
        for &key in self.ep.option_keys() {
            if self.ep.session_keys().contains(&key) {
                if key == "intra_op_num_threads" {
                    intra_threads = options.take_parsed::<usize>(key, "a thread count")?;
                }
                continue;
            }
            if let Some(v) = options.take(key) {
                if key == "device_id" {
                    device_id = v.trim().parse::<i32>().map_err(|_| {
                        Error::invalid_argument(format!(
                            "{}: option `device_id`: `{v}` is not a device number",
                            self.name
                        ))
                    })?;
                }
                ep_options.push((key.to_string(), v));
            }
        }
        options.finish()?;
        self.check_platform()?;
        let rt = self.check_runtime(library.as_deref())?;
        if let Some(d) = chosen {
            device_id = self
                .select_device(&rt, d, &mut ep_options)?
                .unwrap_or(device_id);
        }
        let dispatch = self
            .ep
            .dispatch(&ep_options)
            .map_err(|e| Error::invalid_argument(format!("{} {e}", self.name)))?;
        // Registering the EP loads its provider library (CUDA, TensorRT, ...) and its
        // dependencies: a failure here means the EP cannot run on this machine, which must be
        // said now rather than show up as every node being declined.
        let unavailable = |e: String| {
            Error::unavailable(format!(
                "{}: ONNX Runtime could not register {}: {e}",
                self.name,
                self.ep.ort_name()
            ))
        };
        Session::builder(&rt.env)
            .map_err(|e| unavailable(e.to_string()))?
            .with_execution_providers([dispatch.clone()])
            .map_err(|e| unavailable(e.to_string()))?;
        let mut provider = OrtProvider {
            cpu: self.ep == OrtEp::Cpu,
            backend: Backend::Builtin(self.ep, dispatch),
            name: self.name,
            rt,
            intra_threads,
            ops,
            probes: Mutex::new(HashMap::new()),
            writes_no_context: AtomicBool::new(false),
            device: None,
        };
        if self.memory != Memory::Host {
            let io = DeviceIo::new(self.memory, device_id, |model| {
                provider.session(model, SessionKind::Copy)
            })
            .map_err(|e| {
                unavailable(format!(
                    "its {:?} memory on device {device_id} is not usable: {e}",
                    self.memory
                ))
            })?;
            provider.device = Some(Arc::new(io));
        }
        Ok(Box::new(provider))
    }
}

/// The lines of a runtime's multi-line error that say what went wrong, for a one-line reason:
/// headers (lines ending in `:`) and assertion locations (`Check '...' failed at file:line:`)
/// are left out, and at most two lines kept (the first line when nothing else is left).
fn gist(error: &str) -> String {
    let lines: Vec<&str> = error
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let telling: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.ends_with(':') && !l.starts_with("Check '"))
        .take(2)
        .collect();
    let text = if telling.is_empty() {
        lines.first().copied().unwrap_or_default().to_owned()
    } else {
        telling.join("; ")
    };
    match text.char_indices().nth(400) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// Why a group has no EPContext model.
enum NoContext {
    /// The EP writes none (or this ONNX Runtime cannot compile): the same for every group.
    NotWritten(String),
    /// This group's compile failed.
    Failed(String),
}

/// What a session is made for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SessionKind {
    /// A one-node capability probe: one thread, quiet.
    Probe,
    /// A compiled group.
    Kernel,
    /// The copy session of [`DeviceIo`]: one thread, no graph optimization, and ORT's CPU EP
    /// allowed (a copy is correct wherever the `Identity` runs).
    Copy,
}

/// Which ONNX Runtime EP a provider's sessions get.
#[derive(Clone)]
pub(crate) enum Backend {
    /// One of ONNX Runtime's own EPs (built in, or a provider-bridge library of its build).
    Builtin(OrtEp, ExecutionProviderDispatch),
    /// An EP of a plugin-EP library registered with ONNX Runtime ([`crate::library`]):
    /// appended with the devices ONNX Runtime lists for it and the EP's options.
    Library {
        ort_name: Arc<str>,
        options: Arc<[(String, String)]>,
        /// The device a session chose (its place in ONNX Runtime's list for the EP); all of
        /// them when `None`.
        device: Option<usize>,
    },
}

impl Backend {
    /// ONNX Runtime's name of the EP.
    pub(crate) fn ort_name(&self) -> &str {
        match self {
            Backend::Builtin(ep, _) => ep.ort_name(),
            Backend::Library { ort_name, .. } => ort_name,
        }
    }

    /// Adds the EP to a session being built.
    pub(crate) fn append(
        &self,
        rt: &Runtime,
        b: ort::session::builder::SessionBuilder,
    ) -> Result<ort::session::builder::SessionBuilder, String> {
        match self {
            Backend::Builtin(_, dispatch) => b
                .with_execution_providers([dispatch.clone()])
                .map_err(|e| e.to_string()),
            Backend::Library {
                ort_name,
                options,
                device,
            } => {
                let devices: Vec<_> = rt
                    .env
                    .devices()
                    .filter(|d| d.ep().is_ok_and(|n| n == &**ort_name))
                    .enumerate()
                    .filter(|(i, _)| device.is_none_or(|d| d == *i))
                    .map(|(_, d)| d)
                    .collect();
                if devices.is_empty() {
                    return Err(format!("ONNX Runtime lists no device for {ort_name}"));
                }
                let keyed: Vec<(String, String)> = options
                    .iter()
                    .map(|(k, v)| (format!("{ort_name}.{k}"), v.clone()))
                    .collect();
                b.with_devices(devices, Some(&keyed))
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// A created EP: the runtime, the configured ORT EP, and the probe cache.
pub struct OrtProvider {
    /// ORT's CPU EP (whose sessions may fall back to nothing else anyway).
    cpu: bool,
    backend: Backend,
    name: &'static str,
    rt: Arc<Runtime>,
    intra_threads: Option<usize>,
    ops: Option<HashSet<String>>,
    /// Node signature → whether a one-node session with this EP could be created.
    /// Probe results by node signature: `Err` holds why ONNX Runtime refused it.
    probes: Mutex<HashMap<String, std::result::Result<(), String>>>,
    /// Set once a group compiled through ONNX Runtime's compile API came back without an
    /// EPContext node: later groups get a plain session, not a second compile each.
    writes_no_context: AtomicBool,
    /// Allocator, IO binding and copies, for EPs that keep tensors in their own memory.
    device: Option<Arc<DeviceIo>>,
}

impl OrtProvider {
    /// A provider over an EP of a plugin-EP library ([`crate::library`]).
    pub(crate) fn new(
        name: &'static str,
        rt: Arc<Runtime>,
        backend: Backend,
        intra_threads: Option<usize>,
        ops: Option<HashSet<String>>,
    ) -> OrtProvider {
        OrtProvider {
            cpu: false,
            backend,
            name,
            rt,
            intra_threads,
            ops,
            probes: Mutex::new(HashMap::new()),
            writes_no_context: AtomicBool::new(false),
            device: None,
        }
    }

    /// Makes a session of a one-node model with the EP (ONNX Runtime's CPU EP may take the
    /// node): the EP is created, and reads its options, as for any session.
    pub(crate) fn check_options(&self) -> Result<(), String> {
        self.session(&crate::device::identity_model(), SessionKind::Copy)
            .map(drop)
    }

    fn session(&self, model: &[u8], kind: SessionKind) -> Result<Session, String> {
        let text = |e: ort::Error<ort::session::builder::SessionBuilder>| e.to_string();
        let mut b = Session::builder(&self.rt.env).map_err(|e| e.to_string())?;
        if !self.cpu && kind != SessionKind::Copy {
            // Nothing may fall back to ORT's own CPU EP: a node this EP cannot run is not
            // claimed (probe) or fails loudly (compile), it is never silently run on the CPU.
            b = b
                .with_config_entry("session.disable_cpu_ep_fallback", "1")
                .map_err(text)?;
        }
        match kind {
            SessionKind::Probe => {
                b = b
                    .with_intra_threads(1)
                    .map_err(text)?
                    .with_log_level(LogLevel::Fatal)
                    .map_err(text)?;
            }
            SessionKind::Copy => {
                b = b
                    .with_intra_threads(1)
                    .map_err(text)?
                    .with_optimization_level(GraphOptimizationLevel::Disable)
                    .map_err(text)?;
            }
            SessionKind::Kernel => {
                if let Some(n) = self.intra_threads {
                    b = b.with_intra_threads(n).map_err(text)?;
                }
            }
        }
        b = self.backend.append(&self.rt, b)?;
        // A probe's notes and refusals are its answer (a decline reason), not the user's log.
        let _quiet = (kind == SessionKind::Probe).then(crate::logs::Quiet::new);
        b.commit_from_memory(model).map_err(|e| e.to_string())
    }

    /// Whether the node can run on this EP, from a cached or fresh one-node probe: `Err` with
    /// the reason when it cannot.
    fn supports(
        &self,
        graph: &GraphView<'_>,
        node: &NodeView<'_>,
    ) -> sdk::Result<std::result::Result<(), String>> {
        let attrs = graph.attributes(node)?;
        if attrs
            .iter()
            .any(|(_, a)| matches!(a, Attribute::Unsupported(_) | Attribute::Graph(_)))
        {
            // Control flow: the bodies read enclosing values by name, which a one-node model
            // cut out of the graph does not carry.
            return Ok(Err(
                "its nested graphs read values of the enclosing graph, which a one-node \
                 ONNX Runtime session cannot be given"
                    .into(),
            ));
        }
        let mut key = format!(
            "{}|{}|{}|{:?}|in:",
            node.domain, node.op_type, node.opset, attrs
        );
        let mut inputs = Vec::new();
        for v in node.inputs.iter().flatten() {
            let info = graph.value(*v)?;
            if let Some(kind) = non_tensor(info.kind) {
                return Ok(Err(format!(
                    "{kind} inputs do not cross this adapter, which passes tensors only"
                )));
            }
            if let Some(t) = info.elem_type {
                if t.to_dlpack().is_none() && !info.is_initializer() {
                    // Strings and other types that cannot cross the ABI as tensors.
                    return Ok(Err(format!(
                        "{t} inputs do not cross the plugin ABI as tensors"
                    )));
                }
            }
            key.push_str(&format!(
                "{:?}/{:?}/{};",
                info.elem_type,
                info.shape,
                info.is_initializer()
            ));
            if !info.is_initializer() && !inputs.contains(v) {
                inputs.push(*v);
            }
        }
        key.push_str("out:");
        let mut outputs = Vec::new();
        for v in node.outputs.iter().flatten() {
            let info = graph.value(*v)?;
            if let Some(kind) = non_tensor(info.kind) {
                // ZipMap's sequence of maps, say: ONNX Runtime would hand back a value the
                // adapter cannot read as a tensor.
                return Ok(Err(format!(
                    "{kind} outputs do not cross this adapter, which passes tensors only"
                )));
            }
            if let Some(t) = info.elem_type {
                if t.to_dlpack().is_none() {
                    return Ok(Err(format!(
                        "{t} outputs do not cross the plugin ABI as tensors"
                    )));
                }
            }
            key.push_str(&format!("{:?}/{:?};", info.elem_type, info.shape));
            outputs.push(*v);
        }
        if let Some(known) = self
            .probes
            .lock()
            .map_err(|_| Error::runtime("probe cache poisoned"))?
            .get(&key)
        {
            return Ok(known.clone());
        }
        let nodes = [node.id];
        let sub = SubgraphView {
            nodes: &nodes,
            inputs: &inputs,
            outputs: &outputs,
        };
        let bytes = graph.serialize_subgraph(&sub)?;
        let ok = match fill_unknown_types(&bytes, ElementType::Float.onnx_code())
            .and_then(|m| self.session(&m, SessionKind::Probe).map(|_| ()))
        {
            Ok(()) => Ok(()),
            Err(e) => {
                sdk::log(
                    EpxLogLevel::Debug,
                    &format!(
                        "{}: declines {} `{}` (opset {}): {e}",
                        self.name, node.op_type, node.name, node.opset
                    ),
                );
                let first = gist(&e);
                if first.contains("fallback to CPU EP has been explicitly disabled") {
                    // The session was refused because ONNX Runtime left the node to its CPU EP.
                    Err(format!(
                        "ONNX Runtime's {} does not take it (ONNX Runtime would run it on its \
                         own CPU EP)",
                        self.backend.ort_name()
                    ))
                } else {
                    Err(format!(
                        "ONNX Runtime's {} refused a session of this one node: {first}",
                        self.backend.ort_name()
                    ))
                }
            }
        };
        self.probes
            .lock()
            .map_err(|_| Error::runtime("probe cache poisoned"))?
            .insert(key, ok.clone());
        Ok(ok)
    }
}

impl Provider for OrtProvider {
    fn capability(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> sdk::Result<Vec<Vec<u32>>> {
        Ok(self.capability_explained(graph, unclaimed)?.groups)
    }

    fn capability_explained(
        &self,
        graph: &GraphView<'_>,
        unclaimed: &[u32],
    ) -> sdk::Result<Capability> {
        let mut claimed = Vec::new();
        let mut declined = Vec::new();
        for &id in unclaimed {
            let node = graph.node(id)?;
            if let Some(ops) = &self.ops {
                if !ops.contains(node.op_type) {
                    let reason = format!("`{}` is not in its `ops` option", node.op_type);
                    declined.push((id, reason));
                    continue;
                }
            }
            match self.supports(graph, &node)? {
                Ok(()) => claimed.push(id),
                Err(reason) => declined.push((id, reason)),
            }
        }
        // One group: the host splits it into convex pieces.
        let groups = if claimed.is_empty() {
            Vec::new()
        } else {
            vec![claimed]
        };
        Ok(Capability { groups, declined })
    }

    fn compile(
        &self,
        graph: &GraphView<'_>,
        sub: &SubgraphView<'_>,
    ) -> sdk::Result<Box<dyn Kernel>> {
        let bytes = graph.serialize_subgraph(sub)?;
        let model = fill_unknown_types(&bytes, ElementType::Float.onnx_code())
            .map_err(|e| Error::runtime(format!("serialized subgraph: {e}")))?;
        let could_not = |e: String| {
            Error::runtime(format!(
                "{} ({}): ONNX Runtime could not compile a group of {} node(s): {e}",
                self.name,
                self.backend.ort_name(),
                sub.nodes.len()
            ))
        };
        // A plugin-EP library that writes EPContext nodes: the group is compiled once, through
        // ONNX Runtime's compile API, into the EPContext model that both runs now and is what
        // epx's kernel cache stores.
        if self.caches_kernels() && !self.writes_no_context.load(Ordering::Relaxed) {
            match self.compile_context(&model) {
                Ok(context) => {
                    let session = self
                        .session(&context, SessionKind::Kernel)
                        .map_err(could_not)?;
                    return self.kernel(graph, sub, session, Some(context));
                }
                Err(NoContext::NotWritten(e)) => {
                    self.writes_no_context.store(true, Ordering::Relaxed);
                    sdk::log(
                        EpxLogLevel::Debug,
                        &format!("{}: its kernels are not stored: {e}", self.name),
                    );
                }
                Err(NoContext::Failed(e)) => sdk::log(
                    EpxLogLevel::Debug,
                    &format!("{}: this kernel is not stored: {e}", self.name),
                ),
            }
        }
        let session = self
            .session(&model, SessionKind::Kernel)
            .map_err(could_not)?;
        self.kernel(graph, sub, session, None)
    }

    fn caches_kernels(&self) -> bool {
        matches!(self.backend, Backend::Library { .. })
    }

    /// Rebuilds a kernel from the EPContext model [`OrtKernel::serialize`] gave: the EP loads
    /// its compiled form instead of compiling.
    fn deserialize(
        &self,
        graph: &GraphView<'_>,
        sub: &SubgraphView<'_>,
        bytes: &[u8],
    ) -> sdk::Result<Box<dyn Kernel>> {
        if !crate::patch::has_node_type(bytes, "EPContext") {
            return Err(Error::invalid_argument(
                "the stored kernel is not an EPContext model",
            ));
        }
        let session = self.session(bytes, SessionKind::Kernel).map_err(|e| {
            Error::runtime(format!(
                "{} ({}): ONNX Runtime could not load a stored EPContext model: {e}",
                self.name,
                self.backend.ort_name()
            ))
        })?;
        self.kernel(graph, sub, session, Some(bytes.to_vec()))
    }

    fn data_transfer(&self) -> Option<&dyn DataTransfer> {
        self.device.as_deref().map(|d| d as &dyn DataTransfer)
    }
}

impl OrtProvider {
    /// A kernel over `session` for the group `sub`.
    fn kernel(
        &self,
        graph: &GraphView<'_>,
        sub: &SubgraphView<'_>,
        session: Session,
        stored: Option<Vec<u8>>,
    ) -> sdk::Result<Box<dyn Kernel>> {
        let names = |ids: &[u32]| -> sdk::Result<Vec<CString>> {
            ids.iter()
                .map(|&v| {
                    let name = graph.value(v)?.name;
                    CString::new(name)
                        .map_err(|_| Error::invalid_graph(format!("value name `{name}` has NUL")))
                })
                .collect()
        };
        Ok(Box::new(OrtKernel {
            input_names: names(sub.inputs)?,
            output_names: names(sub.outputs)?,
            memory: MemInfo::cpu()?,
            session,
            ort_name: self.backend.ort_name().into(),
            device: self.device.clone(),
            stored,
        }))
    }

    /// The group's EPContext model, from ONNX Runtime's compile API with the EP (embedded
    /// context), or why there is none: an EP that writes no EPContext node cannot be stored.
    fn compile_context(&self, model: &[u8]) -> Result<Vec<u8>, NoContext> {
        let failed = |e: String| NoContext::Failed(e);
        let b = Session::builder(&self.rt.env).map_err(|e| failed(e.to_string()))?;
        let b = self.backend.append(&self.rt, b).map_err(failed)?;
        let api = ort::api();
        // SAFETY: C API calls on live objects (the environment, the builder's options, the
        // options made here and released at the end); the output buffer comes from ONNX
        // Runtime's default allocator, copied out and freed through it.
        let bytes = unsafe {
            let compile = (api.GetCompileApi)();
            if compile.is_null() {
                return Err(NoContext::NotWritten(
                    "this ONNX Runtime has no compile API".into(),
                ));
            }
            let compile = &*compile;
            let mut opts = std::ptr::null_mut();
            check(
                (compile.CreateModelCompilationOptionsFromSessionOptions)(
                    self.rt.env.ptr(),
                    b.ptr(),
                    &mut opts,
                ),
                "CreateModelCompilationOptionsFromSessionOptions",
            )
            .map_err(|e| failed(e.message))?;
            let mut alloc = std::ptr::null_mut();
            let mut out: *mut c_void = std::ptr::null_mut();
            let mut len = 0usize;
            let done = (|| -> sdk::Result<()> {
                check(
                    (compile.ModelCompilationOptions_SetInputModelFromBuffer)(
                        opts,
                        model.as_ptr().cast(),
                        model.len(),
                    ),
                    "SetInputModelFromBuffer",
                )?;
                check(
                    (compile.ModelCompilationOptions_SetEpContextEmbedMode)(opts, true),
                    "SetEpContextEmbedMode",
                )?;
                check(
                    (api.GetAllocatorWithDefaultOptions)(&mut alloc),
                    "GetAllocatorWithDefaultOptions",
                )?;
                check(
                    (compile.ModelCompilationOptions_SetOutputModelBuffer)(
                        opts, alloc, &mut out, &mut len,
                    ),
                    "SetOutputModelBuffer",
                )?;
                let _quiet = crate::logs::Quiet::new();
                check(
                    (compile.CompileModel)(self.rt.env.ptr(), opts),
                    "CompileModel",
                )
            })();
            (compile.ReleaseModelCompilationOptions)(opts);
            let bytes = if out.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(out.cast::<u8>(), len).to_vec()
            };
            if !out.is_null() && !alloc.is_null() {
                if let Some(free) = (*alloc).Free {
                    free(alloc, out);
                }
            }
            done.map_err(|e| failed(e.message))?;
            bytes
        };
        if !crate::patch::has_node_type(&bytes, "EPContext") {
            return Err(NoContext::NotWritten(format!(
                "{} wrote no EPContext node (it does not support ONNX Runtime's EPContext)",
                self.backend.ort_name()
            )));
        }
        Ok(bytes)
    }
}

/// A compiled group: one ORT session over the serialized subgraph.
pub struct OrtKernel {
    session: Session,
    input_names: Vec<CString>,
    output_names: Vec<CString>,
    /// Host memory, for host-memory EPs' inputs.
    memory: MemInfo,
    /// ONNX Runtime's name of the EP, for messages.
    ort_name: Arc<str>,
    device: Option<Arc<DeviceIo>>,
    /// The EPContext model the session was made from, for epx's kernel cache.
    stored: Option<Vec<u8>>,
}

impl OrtKernel {
    /// Wraps a host tensor as an OrtValue over the same memory (no copy).
    fn wrap(&self, view: &TensorView<'_>) -> sdk::Result<OwnedValue> {
        let ty = ort_type(view.elem_type).ok_or_else(|| {
            Error::not_implemented(format!("{} inputs for ONNX Runtime", view.elem_type))
        })?;
        // SAFETY: `view.data` outlives the value (the host keeps inputs alive until execute
        // returns, and the value is dropped before). ORT does not write to input tensors, so
        // handing it a `*mut` over read-only memory is sound.
        unsafe {
            wrap(
                &self.memory,
                view.data.as_ptr().cast_mut().cast::<c_void>(),
                view.data.len(),
                view.shape,
                ty,
            )
        }
    }

    /// Execution for EPs with their own memory: inputs bound where the host put them, outputs
    /// bound to the device, then copied on the device into the host's output tensors.
    fn execute_on_device(&self, io: &DeviceIo, ctx: &mut KernelContext<'_>) -> sdk::Result<()> {
        let binding = Binding::new(&self.session)?;
        let mut inputs = Vec::with_capacity(self.input_names.len());
        for (i, name) in self.input_names.iter().enumerate() {
            let t = ctx.input_raw(i)?.ok_or_else(|| {
                Error::invalid_argument(format!("input {i} of an ONNX Runtime kernel is absent"))
            })?;
            io.check_device(t, &format!("input {i}"))?;
            let value = io.wrap_dl(t)?;
            binding.input(name, &value)?;
            inputs.push(value);
        }
        for name in &self.output_names {
            binding.output_to(name, &io.info)?;
        }
        binding.run(&self.session, &format!("{} Run", self.ort_name))?;
        drop(inputs);
        let outputs = binding.outputs()?;
        if outputs.len() != self.output_names.len() {
            return Err(Error::runtime(format!(
                "ONNX Runtime returned {} outputs, expected {}",
                outputs.len(),
                self.output_names.len()
            )));
        }
        for (j, value) in outputs.iter().enumerate() {
            let (elem_type, shape) = output_type(value, j)?;
            let dst = ctx.output_raw(j, elem_type, &shape)?;
            io.check_device(dst, &format!("output {j}"))?;
            io.copy_value_into(value, dst)?;
        }
        Ok(())
    }
}

impl Kernel for OrtKernel {
    fn serialize(&self) -> sdk::Result<Option<Vec<u8>>> {
        Ok(self.stored.clone())
    }

    fn execute(&self, ctx: &mut KernelContext<'_>) -> sdk::Result<()> {
        if let Some(io) = &self.device {
            return self.execute_on_device(io, ctx);
        }
        let api = ort::api();
        let mut inputs = Vec::with_capacity(self.input_names.len());
        for i in 0..self.input_names.len() {
            let view = ctx.input(i)?;
            inputs.push(self.wrap(&view)?);
        }
        let input_ptrs: Vec<*const OrtValue> = inputs.iter().map(|v| v.0.cast_const()).collect();
        let input_names: Vec<_> = self.input_names.iter().map(|n| n.as_ptr()).collect();
        let output_names: Vec<_> = self.output_names.iter().map(|n| n.as_ptr()).collect();
        let mut raw_outputs: Vec<*mut OrtValue> = vec![std::ptr::null_mut(); output_names.len()];
        // SAFETY: all arrays hold the counts passed; `Run` is thread-safe on one session and
        // fills `raw_outputs` with values we own.
        let status = unsafe {
            (api.Run)(
                self.session.ptr().cast_mut(),
                std::ptr::null(),
                input_names.as_ptr(),
                input_ptrs.as_ptr(),
                input_ptrs.len(),
                output_names.as_ptr(),
                output_names.len(),
                raw_outputs.as_mut_ptr(),
            )
        };
        let outputs: Vec<OwnedValue> = raw_outputs.into_iter().map(OwnedValue).collect();
        // SAFETY: the status `Run` returned.
        unsafe { check(status, &format!("{} Run", self.ort_name)) }?;
        drop(inputs);
        for (j, value) in outputs.iter().enumerate() {
            if value.0.is_null() {
                return Err(Error::runtime(format!(
                    "ONNX Runtime returned no output {j}"
                )));
            }
            let (elem_type, shape) = output_type(value, j)?;
            let dst = ctx.output(j, elem_type, &shape)?;
            if dst.is_empty() {
                continue;
            }
            let mut src: *mut c_void = std::ptr::null_mut();
            // SAFETY: C API call on a tensor value we own.
            unsafe {
                check(
                    (api.GetTensorMutableData)(value.0, &mut src),
                    "GetTensorMutableData",
                )
            }?;
            if src.is_null() {
                return Err(Error::runtime(format!("output {j} has no data")));
            }
            // SAFETY: a CPU tensor of `shape` × `elem_type` holds exactly `dst.len()` bytes (the
            // host computed `dst` from the same shape and type). `Run` without an IO binding
            // returns outputs in host memory whatever EP produced them.
            let src = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), dst.len()) };
            dst.copy_from_slice(src);
        }
        Ok(())
    }
}

/// An output value's element type (one that can cross the ABI) and shape.
fn output_type(value: &OwnedValue, j: usize) -> sdk::Result<(ElementType, Vec<i64>)> {
    let (elem, shape) = tensor_type_and_shape(value)?;
    let elem_type = ElementType::from_onnx(elem)
        .filter(|t| ort_type(*t).is_some())
        .ok_or_else(|| {
            Error::not_implemented(format!(
                "output {j} has ONNX element type {elem}, which cannot cross the ABI"
            ))
        })?;
    Ok((elem_type, shape))
}

fn tensor_type_and_shape(value: &OwnedValue) -> sdk::Result<(i32, Vec<i64>)> {
    let api = ort::api();
    let mut info = std::ptr::null_mut();
    // SAFETY: C API calls on a value we own; `info` is released below.
    unsafe {
        check(
            (api.GetTensorTypeAndShape)(value.0, &mut info),
            "GetTensorTypeAndShape",
        )?;
        let result = (|| {
            // Read the element type as a plain i32: a code newer than ort-sys's enum must not
            // become an invalid enum value.
            let mut elem: i32 = 0;
            check(
                (api.GetTensorElementType)(
                    info,
                    (&mut elem as *mut i32).cast::<ONNXTensorElementDataType>(),
                ),
                "GetTensorElementType",
            )?;
            let mut n = 0usize;
            check((api.GetDimensionsCount)(info, &mut n), "GetDimensionsCount")?;
            let mut dims = vec![0i64; n];
            check(
                (api.GetDimensions)(info, dims.as_mut_ptr(), n),
                "GetDimensions",
            )?;
            Ok((elem, dims))
        })();
        (api.ReleaseTensorTypeAndShapeInfo)(info);
        result
    }
}

/// The name of a value kind other than a tensor (sequence, map, optional, sparse tensor).
fn non_tensor(kind: EpxValueKind) -> Option<&'static str> {
    match kind {
        EpxValueKind::Sequence => Some("sequence"),
        EpxValueKind::Map => Some("map"),
        EpxValueKind::Optional => Some("optional"),
        EpxValueKind::SparseTensor => Some("sparse tensor"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::gist;

    #[test]
    fn a_multi_line_error_is_told_by_its_telling_lines() {
        let ov = "Check 'false' failed at src/frontends/common/unconverted_ops_report.cpp:151:\n\
                  FrontEnd API failed with OpConversionFailure:\n\
                  Model wasn't fully converted. Failed operations detailed log:\n\
                  -- MaxPool-11 with a message:\n\
                  While validating node 'MaxPool' with friendly_name 'M':\n\
                  Expected a 3D, 4D or 5D tensor for the input. Got: []\n\n\
                  Summary:\n-- Conversion is failed for: MaxPool-11";
        assert_eq!(
            gist(ov),
            "Expected a 3D, 4D or 5D tensor for the input. Got: []; -- Conversion is failed for: MaxPool-11"
        );
        assert_eq!(gist("one line"), "one line");
        assert_eq!(gist("only a header:"), "only a header:");
        assert_eq!(gist(&"x".repeat(500)).len(), 403);
    }
}
