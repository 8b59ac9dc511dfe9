//! EP instances and compiled kernels: the calls a session makes into a plugin, each checked.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use std::ffi::c_void;

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::{DLDevice, DLTensor};
use epx_plugin_api::sdk::take_status;

use super::host_api::{AbiGraph, KernelCall};
use super::isolate::config::Isolation;
use super::isolate::remote::Remote;
use super::library::{PluginLibrary, ProviderDescription};
use crate::error::{Error, Result};
use crate::value::{DeviceMemory, Value};

type CopyFn = unsafe extern "C" fn(*mut c_void, *const DLTensor, *mut DLTensor) -> *mut EpxStatus;

/// An EP instance made with the user's options.
pub struct ProviderInstance {
    pub library: Arc<PluginLibrary>,
    pub description: ProviderDescription,
    backend: Backend,
    /// The device a session chose for it (`cuda:1`), if one was.
    device: Option<String>,
    /// The options it was made with.
    options: Vec<(String, String)>,
}

/// Where the EP runs.
enum Backend {
    /// In this process: the plugin's provider.
    Local(*mut EpxProvider),
    /// In a child process ([`super::isolate`]).
    Isolated(Box<Remote>),
}

// SAFETY: the ABI requires providers' functions to be callable from any thread; the raw
// pointer is only released once, in Drop.
unsafe impl Send for ProviderInstance {}
// SAFETY: as above.
unsafe impl Sync for ProviderInstance {}

impl Drop for ProviderInstance {
    fn drop(&mut self) {
        if let Backend::Local(raw) = self.backend {
            // SAFETY: made by the plugin's `create`, released once; every kernel holds an Arc
            // to this instance, so none is alive any more.
            unsafe {
                if let Some(release) = (*raw).release {
                    release(raw);
                }
            }
        }
    }
}

fn provider_error(name: &str, call: &'static str, e: epx_plugin_api::sdk::Error) -> Error {
    Error::Provider {
        provider: name.to_string(),
        call,
        code: e.code,
        message: e.message,
    }
}

fn nonsense(name: &str, call: &'static str, message: String) -> Error {
    Error::Provider {
        provider: name.to_string(),
        call,
        code: EpxStatusCode::InvalidGraph,
        message,
    }
}

impl ProviderInstance {
    /// Creates EP `index` of `library` with string options: in this process, or in a child
    /// process when the library was opened only there.
    pub fn create(
        library: &Arc<PluginLibrary>,
        index: usize,
        options: &[(String, String)],
    ) -> Result<Arc<Self>> {
        if let Some(iso) = &library.isolation {
            return Self::create_isolated(library, index, options, iso.clone());
        }
        let description =
            library
                .providers
                .get(index)
                .cloned()
                .ok_or_else(|| Error::ProviderSetup {
                    name: library.name.clone(),
                    message: format!("no provider #{index}"),
                })?;
        let name = description.name.clone();
        let factory = library.factory(index).ok_or_else(|| Error::ProviderSetup {
            name: name.clone(),
            message: "factory missing".into(),
        })?;
        let keys: Vec<EpxStr> = options.iter().map(|(k, _)| EpxStr::new(k)).collect();
        let values: Vec<EpxStr> = options.iter().map(|(_, v)| EpxStr::new(v)).collect();
        let mut raw: *mut EpxProvider = std::ptr::null_mut();
        // SAFETY: the factory was validated at load (non-null `create`); option arrays borrow
        // `options` for the call.
        let status = unsafe {
            let f = &*factory;
            let create = f
                .create
                .ok_or_else(|| nonsense(&name, "create", "create is NULL".into()))?;
            create(
                f.state,
                keys.len(),
                keys.as_ptr(),
                values.as_ptr(),
                &mut raw,
            )
        };
        // SAFETY: plugin status, released through its own function.
        unsafe { take_status(status) }.map_err(|e| Error::ProviderSetup {
            name: name.clone(),
            message: e.message,
        })?;
        if raw.is_null() {
            return Err(nonsense(
                &name,
                "create",
                "returned success but no provider".into(),
            ));
        }
        // SAFETY: non-null provider from `create`; checked before use.
        let ok = unsafe {
            (*raw).struct_size >= EPX_PROVIDER_SIZE_1_0
                && (*raw).get_capability.is_some()
                && (*raw).compile.is_some()
        };
        let instance = Arc::new(ProviderInstance {
            library: library.clone(),
            description,
            backend: Backend::Local(raw),
            device: None,
            options: options.to_vec(),
        });
        if !ok {
            return Err(nonsense(
                &name,
                "create",
                "provider struct is too small or lacks get_capability/compile".into(),
            ));
        }
        if !instance.description.uses_host_memory() {
            // SAFETY: validated size above covers the data-transfer fields of ABI 1.0.
            let has_transfer = unsafe {
                (*raw).allocate.is_some()
                    && (*raw).free.is_some()
                    && (*raw).copy_to_device.is_some()
                    && (*raw).copy_to_host.is_some()
            };
            if !has_transfer {
                return Err(nonsense(
                    &instance.description.name,
                    "create",
                    format!(
                        "declares device memory (DLPack device type {}) but not the data-transfer \
                         functions allocate, free, copy_to_device and copy_to_host",
                        instance.description.device_type
                    ),
                ));
            }
        }
        Ok(instance)
    }

    /// Creates EP `index` of `library` in a child process (`isolation.exe serve-plugin`), which
    /// opens the library itself: a crash or hang there fails a call, not this process.
    pub fn create_isolated(
        library: &Arc<PluginLibrary>,
        index: usize,
        options: &[(String, String)],
        isolation: Isolation,
    ) -> Result<Arc<Self>> {
        let setup = |message: String| Error::ProviderSetup {
            name: library.name.clone(),
            message,
        };
        let description = library
            .providers
            .get(index)
            .cloned()
            .ok_or_else(|| setup(format!("no provider #{index}")))?;
        let (image, preloads) = library.images().ok_or_else(|| {
            setup(format!(
                "EP `{}` is linked into the program, not a plugin library; only a plugin \
                 library can run in a child process",
                description.name
            ))
        })?;
        let remote = Remote::start(isolation, image, preloads, index, &description, options)?;
        Ok(Arc::new(ProviderInstance {
            library: library.clone(),
            description,
            backend: Backend::Isolated(Box::new(remote)),
            device: None,
            options: options.to_vec(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.description.name
    }

    /// Records the device the session chose (the instance was just made, so it is not shared).
    pub(crate) fn with_device(self: Arc<Self>, device: String) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut p) => {
                p.device = Some(device);
                Arc::new(p)
            }
            Err(shared) => shared,
        }
    }

    /// The device a session chose for this EP (`cuda:1`), if it chose one.
    pub fn chosen_device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// The options the EP was made with.
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }

    /// Whether this EP runs in a child process.
    pub fn is_isolated(&self) -> bool {
        matches!(self.backend, Backend::Isolated(_))
    }

    /// How many times its child process was started again after dying or hanging (0 for an EP
    /// in this process).
    pub fn restarts(&self) -> u32 {
        match &self.backend {
            Backend::Isolated(r) => r.restarts(),
            Backend::Local(_) => 0,
        }
    }

    /// The plugin's provider, for the calls made in this process.
    fn raw(&self, call: &'static str) -> Result<*mut EpxProvider> {
        match self.backend {
            Backend::Local(raw) => Ok(raw),
            Backend::Isolated(_) => Err(nonsense(
                self.name(),
                call,
                "an isolated EP has no device memory in this process".into(),
            )),
        }
    }

    /// The DLPack device of this EP's tensors.
    pub fn device(&self) -> DLDevice {
        DLDevice {
            device_type: self.description.device_type,
            device_id: 0,
        }
    }

    /// Allocates device memory through the EP's data transfer.
    pub(crate) fn allocate(&self, bytes: usize, alignment: usize) -> Result<*mut c_void> {
        let name = self.name();
        let raw = self.raw("allocate")?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `allocate` was checked non-NULL at creation for device EPs; `ptr` is a valid
        // out-pointer.
        let status = unsafe {
            let f = (*raw)
                .allocate
                .ok_or_else(|| nonsense(name, "allocate", "NULL".into()))?;
            f((*raw).state, bytes, alignment, &mut ptr)
        };
        // SAFETY: plugin status.
        unsafe { take_status(status) }.map_err(|e| provider_error(name, "allocate", e))?;
        if ptr.is_null() {
            return Err(nonsense(
                name,
                "allocate",
                format!("returned success but no memory for {bytes} bytes"),
            ));
        }
        Ok(ptr)
    }

    /// Frees memory from [`allocate`](Self::allocate).
    pub(crate) fn free(&self, ptr: *mut c_void) {
        let Ok(raw) = self.raw("free") else { return };
        // SAFETY: `ptr` came from this EP's `allocate` and is freed once (DeviceTensor::drop).
        unsafe {
            if let Some(f) = (*raw).free {
                f((*raw).state, ptr);
            }
        }
    }

    /// Copies a host tensor into a device tensor of the same type and shape.
    pub(crate) fn copy_to_device(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()> {
        let raw = self.raw("copy_to_device")?;
        // SAFETY: checked non-NULL at creation for device EPs.
        let f = unsafe { (*raw).copy_to_device };
        self.copy("copy_to_device", f, src, dst)
    }

    /// Copies a device tensor into a host tensor of the same type and shape.
    pub(crate) fn copy_to_host(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()> {
        let raw = self.raw("copy_to_host")?;
        // SAFETY: checked non-NULL at creation for device EPs.
        let f = unsafe { (*raw).copy_to_host };
        self.copy("copy_to_host", f, src, dst)
    }

    fn copy(
        &self,
        call: &'static str,
        f: Option<CopyFn>,
        src: &DLTensor,
        dst: &mut DLTensor,
    ) -> Result<()> {
        let name = self.name();
        let f = f.ok_or_else(|| nonsense(name, call, "NULL".into()))?;
        let raw = self.raw(call)?;
        // SAFETY: both tensors describe live buffers of the same type and shape for the call.
        let status = unsafe { f((*raw).state, src, dst) };
        // SAFETY: plugin status.
        unsafe { take_status(status) }.map_err(|e| provider_error(name, call, e))
    }

    /// Asks which of the `unclaimed` nodes this EP runs; validates the answer. Returns the
    /// groups and, from a 1.4 plugin, the reasons it gave for nodes it declined.
    pub(crate) fn capability(
        &self,
        graph: &AbiGraph<'_>,
        unclaimed: &[u32],
    ) -> Result<(Vec<Vec<usize>>, Declined)> {
        let name = self.name();
        let (groups, declined) = match &self.backend {
            Backend::Local(raw) => self.local_capability(*raw, graph, unclaimed)?,
            Backend::Isolated(remote) => {
                if !std::ptr::eq(graph.graph, &graph.model.graph) {
                    // A nested body reads values of the graph around it, which the child does
                    // not have; it runs with its If/Loop/Scan node instead.
                    return Ok((Vec::new(), Vec::new()));
                }
                remote.capability(graph.model, graph.graph, unclaimed)?
            }
        };
        check_claims(name, graph, unclaimed, groups, declined)
    }

    /// Checks a capability answer recorded earlier (the kernel cache) as a live one is checked.
    pub(crate) fn check_recorded_capability(
        &self,
        graph: &AbiGraph<'_>,
        unclaimed: &[u32],
        groups: Vec<Vec<usize>>,
        declined: Declined,
    ) -> Result<(Vec<Vec<usize>>, Declined)> {
        check_claims(self.name(), graph, unclaimed, groups, declined)
    }

    /// The capability query in this process: the plugin's arrays read and released.
    fn local_capability(
        &self,
        raw: *mut EpxProvider,
        graph: &AbiGraph<'_>,
        unclaimed: &[u32],
    ) -> Result<(Vec<Vec<usize>>, Declined)> {
        let name = self.name();
        let mut cap = EpxCapability::empty();
        // SAFETY: validated provider; graph and list are borrowed for the call.
        let status = unsafe {
            let get = (*raw)
                .get_capability
                .ok_or_else(|| nonsense(name, "get_capability", "NULL".into()))?;
            get(
                (*raw).state,
                graph.as_raw(),
                unclaimed.as_ptr(),
                unclaimed.len(),
                &mut cap,
            )
        };
        // SAFETY: plugin status.
        let result =
            unsafe { take_status(status) }.map_err(|e| provider_error(name, "get_capability", e));
        // Read the groups and reasons (if any), then release them whatever happened.
        let read = result.and_then(|()| {
            let groups = read_groups(name, &cap, graph.graph.nodes.len())?;
            Ok((groups, read_declined(name, &cap, unclaimed)?))
        });
        if let Some(release) = cap.release {
            // SAFETY: the plugin's release for the arrays it filled, called once.
            unsafe { release(&mut cap) };
        }
        read
    }
}

/// Checks an EP's answer to a capability query: every claimed node offered and claimed once,
/// none both claimed and declined.
fn check_claims(
    name: &str,
    graph: &AbiGraph<'_>,
    unclaimed: &[u32],
    groups: Vec<Vec<usize>>,
    declined: Declined,
) -> Result<(Vec<Vec<usize>>, Declined)> {
    {
        let unclaimed_set: std::collections::HashSet<u32> = unclaimed.iter().copied().collect();
        let mut seen = std::collections::HashSet::new();
        for g in &groups {
            if g.is_empty() {
                return Err(nonsense(
                    name,
                    "get_capability",
                    "returned an empty group".into(),
                ));
            }
            for &n in g {
                if !u32::try_from(n).is_ok_and(|n| unclaimed_set.contains(&n)) {
                    let op = graph
                        .graph
                        .nodes
                        .get(n)
                        .map_or("out of range", |node| node.op_type.as_str());
                    return Err(nonsense(
                        name,
                        "get_capability",
                        format!(
                            "claimed node {n} ({op}), which is not among the unclaimed nodes it was offered",
                        ),
                    ));
                }
                if !seen.insert(n) {
                    return Err(nonsense(
                        name,
                        "get_capability",
                        format!("claimed node {n} twice"),
                    ));
                }
            }
        }
        if let Some((n, _)) = declined
            .iter()
            .find(|(n, _)| !u32::try_from(*n).is_ok_and(|n| unclaimed_set.contains(&n)))
        {
            return Err(nonsense(
                name,
                "get_capability",
                format!("declined node {n}, which was not offered"),
            ));
        }
        if let Some((n, _)) = declined
            .iter()
            .find(|(n, _)| groups.iter().any(|g| g.contains(n)))
        {
            return Err(nonsense(
                name,
                "get_capability",
                format!("declined node {n}, which it also claimed"),
            ));
        }
        Ok((groups, declined))
    }
}

impl ProviderInstance {
    /// Compiles one group.
    pub(crate) fn compile(
        self: &Arc<Self>,
        graph: &AbiGraph<'_>,
        nodes: &[u32],
        inputs: &[u32],
        outputs: &[u32],
    ) -> Result<CompiledKernel> {
        let name = self.name();
        let _span = tracing::debug_span!("compile", provider = name, nodes = nodes.len()).entered();
        let sub = EpxSubgraph::borrowing(nodes, inputs, outputs);
        let provider = match &self.backend {
            Backend::Local(raw) => *raw,
            Backend::Isolated(remote) => {
                if !std::ptr::eq(graph.graph, &graph.model.graph) {
                    return Err(nonsense(
                        name,
                        "compile",
                        "an isolated EP compiles nodes of the main graph only".into(),
                    ));
                }
                let id = remote.compile(graph.model, graph.graph, nodes, inputs, outputs)?;
                return Ok(CompiledKernel {
                    provider: self.clone(),
                    kernel: KernelBackend::Isolated(id),
                    serialize: None,
                    num_outputs: outputs.len(),
                });
            }
        };
        let mut raw: *mut EpxKernel = std::ptr::null_mut();
        // SAFETY: validated provider; everything passed is borrowed for the call.
        let status = unsafe {
            let compile = (*provider)
                .compile
                .ok_or_else(|| nonsense(name, "compile", "NULL".into()))?;
            compile((*provider).state, graph.as_raw(), &sub, &mut raw)
        };
        // SAFETY: plugin status.
        unsafe { take_status(status) }.map_err(|e| provider_error(name, "compile", e))?;
        self.checked_kernel(raw, "compile", outputs.len())
    }

    /// Wraps a kernel the plugin returned as success (released on every path), after checking it.
    fn checked_kernel(
        self: &Arc<Self>,
        raw: *mut EpxKernel,
        call: &'static str,
        num_outputs: usize,
    ) -> Result<CompiledKernel> {
        let name = self.name();
        if raw.is_null() {
            return Err(nonsense(
                name,
                call,
                "returned success but no kernel".into(),
            ));
        }
        // SAFETY: non-null kernel from the plugin.
        let valid =
            unsafe { (*raw).struct_size >= EPX_KERNEL_SIZE_1_0 && (*raw).execute.is_some() };
        let kernel = CompiledKernel {
            provider: self.clone(),
            kernel: KernelBackend::Local(raw),
            serialize: (!self.description.concurrent_kernels).then(|| Mutex::new(())),
            num_outputs,
        };
        if !valid {
            return Err(nonsense(
                name,
                call,
                "kernel struct is too small or has no execute".into(),
            ));
        }
        Ok(kernel)
    }

    /// The plugin's (ABI 1.6) kernel cache functions, when it has both.
    fn cache_fns(&self) -> Option<(KernelSerializeFn, KernelDeserializeFn)> {
        let Backend::Local(raw) = self.backend else {
            return None;
        };
        // SAFETY: validated provider; the fields are read only where its size covers them.
        unsafe {
            if (*raw).struct_size < EPX_PROVIDER_SIZE_1_6 {
                return None;
            }
            Some(((*raw).kernel_serialize?, (*raw).kernel_deserialize?))
        }
    }

    /// Whether this EP's kernels can go in the kernel cache: ABI 1.6 functions, in this process,
    /// and a library file whose digest is the loaded code's (see
    /// [`PluginLibrary::file_sha256`]).
    pub fn caches_kernels(&self) -> bool {
        self.cache_fns().is_some()
            && (self.library.path.is_none() || self.library.file_sha256().is_some())
    }

    /// The bytes from which [`Self::deserialize_kernel`] rebuilds `kernel`: `Ok(None)` when
    /// the EP does not cache kernels or says this one cannot be stored.
    pub(crate) fn serialize_kernel(&self, kernel: &CompiledKernel) -> Result<Option<Vec<u8>>> {
        let name = self.name();
        let (Some((serialize, _)), KernelBackend::Local(k), Backend::Local(raw)) =
            (self.cache_fns(), &kernel.kernel, &self.backend)
        else {
            return Ok(None);
        };
        let mut buf = EpxBuffer::empty();
        // SAFETY: a kernel this provider made, alive for the call; `buf` is a valid out-struct.
        let status = unsafe { serialize((**raw).state, *k, &mut buf) };
        // SAFETY: plugin status.
        let result = match unsafe { take_status(status) } {
            Ok(()) if buf.len > 0 && buf.data.is_null() => Err(nonsense(
                name,
                "kernel_serialize",
                format!("returned {} bytes at NULL", buf.len),
            )),
            Ok(()) if buf.len as u64 > MAX_KERNEL_BYTES => Err(nonsense(
                name,
                "kernel_serialize",
                format!(
                    "returned {} bytes, more than the {MAX_KERNEL_BYTES} a cached kernel may hold",
                    buf.len
                ),
            )),
            // SAFETY: the plugin wrote `len` bytes at `data`, valid until `release`.
            Ok(()) if buf.len > 0 => Ok(Some(
                unsafe { std::slice::from_raw_parts(buf.data, buf.len) }.to_vec(),
            )),
            Ok(()) => Err(nonsense(
                name,
                "kernel_serialize",
                "returned success but no bytes".into(),
            )),
            Err(e) if e.code == EpxStatusCode::NotImplemented => Ok(None),
            Err(e) => Err(provider_error(name, "kernel_serialize", e)),
        };
        if let Some(release) = buf.release {
            // SAFETY: the plugin's release for the buffer it filled, called once.
            unsafe { release(&mut buf) };
        }
        result
    }

    /// Rebuilds a kernel from bytes [`Self::serialize_kernel`] gave, for the group `compile`
    /// would get.
    pub(crate) fn deserialize_kernel(
        self: &Arc<Self>,
        graph: &AbiGraph<'_>,
        group: (&[u32], &[u32], &[u32]),
        bytes: &[u8],
    ) -> Result<CompiledKernel> {
        let name = self.name();
        let (Some((_, deserialize)), Backend::Local(raw)) = (self.cache_fns(), &self.backend)
        else {
            return Err(nonsense(
                name,
                "kernel_deserialize",
                "the EP does not rebuild kernels".into(),
            ));
        };
        let (nodes, inputs, outputs) = group;
        let sub = EpxSubgraph::borrowing(nodes, inputs, outputs);
        let mut k: *mut EpxKernel = std::ptr::null_mut();
        // SAFETY: validated provider; everything passed is borrowed for the call.
        let status = unsafe {
            deserialize(
                (**raw).state,
                graph.as_raw(),
                &sub,
                bytes.as_ptr(),
                bytes.len(),
                &mut k,
            )
        };
        // SAFETY: plugin status.
        unsafe { take_status(status) }
            .map_err(|e| provider_error(name, "kernel_deserialize", e))?;
        self.checked_kernel(k, "kernel_deserialize", outputs.len())
    }
}

/// The most bytes of profile JSON the host reads from a kernel.
const MAX_PROFILE_BYTES: usize = 64 << 20;

/// The most parts and pass notes the host keeps from one kernel's profile.
const MAX_PROFILE_ENTRIES: usize = 1 << 20;

/// A kernel's own profile (ABI 1.7), as the host read it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct KernelDetail {
    #[serde(default)]
    pub parts: Vec<PartDetail>,
    #[serde(default)]
    pub passes: Vec<PassDetail>,
}

/// One part of a kernel (a node, or nodes the EP runs as one) and the time it took.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct PartDetail {
    pub name: String,
    pub op: String,
    pub calls: u64,
    pub ns: u64,
}

/// What one of the EP's compile passes did to the kernel's nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct PassDetail {
    pub name: String,
    #[serde(default)]
    pub changed: u64,
    #[serde(default)]
    pub note: String,
}

impl ProviderInstance {
    /// The plugin's (ABI 1.7) profiling functions, when it has both.
    fn profile_fns(&self) -> Option<(KernelProfileStartFn, KernelSerializeFn)> {
        let Backend::Local(raw) = self.backend else {
            return None;
        };
        // SAFETY: validated provider; the fields are read only where its size covers them.
        unsafe {
            if (*raw).struct_size < EPX_PROVIDER_SIZE_1_7 {
                return None;
            }
            Some(((*raw).kernel_profile_start?, (*raw).kernel_profile_read?))
        }
    }
}

impl CompiledKernel {
    /// Asks the EP to record this kernel's parts from now on. `Ok(Err(why))` when it does not:
    /// an EP of an older ABI, one in a child process, or one that says it does not record.
    pub(crate) fn profile_start(&self) -> Result<std::result::Result<(), String>> {
        let name = self.provider.name();
        if self.provider.is_isolated() {
            return Ok(Err(
                "runs in a child process: its kernels are timed whole".into()
            ));
        }
        let (Some((start, _)), KernelBackend::Local(k), Backend::Local(raw)) = (
            self.provider.profile_fns(),
            &self.kernel,
            &self.provider.backend,
        ) else {
            return Ok(Err(
                "its plugin does not record parts (ABI 1.7): its kernels are timed whole".into(),
            ));
        };
        // SAFETY: a kernel this provider made, alive for the call.
        let status = unsafe { start((**raw).state, *k) };
        // SAFETY: plugin status.
        match unsafe { take_status(status) } {
            Ok(()) => Ok(Ok(())),
            Err(e) if e.code == EpxStatusCode::NotImplemented => {
                Ok(Err(format!("{}: its kernels are timed whole", e.message)))
            }
            Err(e) => Err(provider_error(name, "kernel_profile_start", e)),
        }
    }

    /// What the EP recorded since [`Self::profile_start`], checked: JSON of the documented
    /// form, at most [`MAX_PROFILE_BYTES`].
    pub(crate) fn profile_read(&self) -> Result<KernelDetail> {
        let name = self.provider.name();
        let (Some((_, read)), KernelBackend::Local(k), Backend::Local(raw)) = (
            self.provider.profile_fns(),
            &self.kernel,
            &self.provider.backend,
        ) else {
            return Err(nonsense(
                name,
                "kernel_profile_read",
                "the EP does not record parts".into(),
            ));
        };
        let mut buf = EpxBuffer::empty();
        // SAFETY: a kernel this provider made, alive for the call; `buf` is a valid out-struct.
        let status = unsafe { read((**raw).state, *k, &mut buf) };
        // SAFETY: plugin status.
        let result = match unsafe { take_status(status) } {
            Ok(()) if buf.len > MAX_PROFILE_BYTES => Err(format!(
                "returned {} bytes, more than the {MAX_PROFILE_BYTES} a profile may hold",
                buf.len
            )),
            Ok(()) if buf.data.is_null() => Err("returned no bytes".into()),
            Ok(()) => {
                // SAFETY: the plugin wrote `len` bytes at `data`, valid until `release`.
                parse_profile(unsafe { std::slice::from_raw_parts(buf.data, buf.len) })
            }
            Err(e) => {
                if let Some(release) = buf.release {
                    // SAFETY: the plugin's release for the buffer it filled, called once.
                    unsafe { release(&mut buf) };
                }
                return Err(provider_error(name, "kernel_profile_read", e));
            }
        };
        if let Some(release) = buf.release {
            // SAFETY: the plugin's release for the buffer it filled, called once.
            unsafe { release(&mut buf) };
        }
        result.map_err(|m| nonsense(name, "kernel_profile_read", m))
    }
}

/// A kernel's profile from the JSON its EP wrote, or what is wrong with it.
fn parse_profile(bytes: &[u8]) -> std::result::Result<KernelDetail, String> {
    let d: KernelDetail = serde_json::from_slice(bytes)
        .map_err(|e| format!("returned a profile that is not of the documented form: {e}"))?;
    if d.parts.len() + d.passes.len() > MAX_PROFILE_ENTRIES {
        return Err(format!(
            "returned more than {MAX_PROFILE_ENTRIES} parts and pass notes"
        ));
    }
    Ok(d)
}

type KernelProfileStartFn = unsafe extern "C" fn(*mut c_void, *const EpxKernel) -> *mut EpxStatus;

type KernelSerializeFn =
    unsafe extern "C" fn(*mut c_void, *const EpxKernel, *mut EpxBuffer) -> *mut EpxStatus;
type KernelDeserializeFn = unsafe extern "C" fn(
    *mut c_void,
    *const EpxGraph,
    *const EpxSubgraph,
    *const u8,
    usize,
    *mut *mut EpxKernel,
) -> *mut EpxStatus;

/// The largest serialized kernel the host takes (a compiled model with its weights).
const MAX_KERNEL_BYTES: u64 = 4 << 30;

/// Nodes an EP declined, with its reason for each (ABI 1.4).
pub(crate) type Declined = Vec<(usize, String)>;

/// The longest decline reason kept (a reason is a line in a report, not a log).
const MAX_REASON_CHARS: usize = 500;

/// The (ABI 1.4) reasons a plugin gave for the nodes it declined: each node one of `unclaimed`,
/// each reason UTF-8 (invalid bytes replaced), cut to [`MAX_REASON_CHARS`].
fn read_declined(name: &str, cap: &EpxCapability, unclaimed: &[u32]) -> Result<Declined> {
    if cap.num_declined == 0 {
        return Ok(Vec::new());
    }
    if cap.declined_nodes.is_null() || cap.declined_reasons.is_null() {
        return Err(nonsense(
            name,
            "get_capability",
            "declined nodes with NULL arrays".into(),
        ));
    }
    if cap.num_declined > unclaimed.len() {
        return Err(nonsense(
            name,
            "get_capability",
            format!(
                "declined {} nodes, but only {} were offered",
                cap.num_declined,
                unclaimed.len()
            ),
        ));
    }
    // SAFETY: the plugin filled `num_declined` ids and reasons (bounded above), valid until
    // `release`; each reason points at `len` bytes.
    let (ids, reasons) = unsafe {
        (
            std::slice::from_raw_parts(cap.declined_nodes, cap.num_declined),
            std::slice::from_raw_parts(cap.declined_reasons, cap.num_declined),
        )
    };
    let mut out = Vec::with_capacity(ids.len());
    for (&id, reason) in ids.iter().zip(reasons) {
        if unclaimed.binary_search(&id).is_err() {
            return Err(nonsense(
                name,
                "get_capability",
                format!("declined node {id}, which was not offered"),
            ));
        }
        // Bounded: a reason is read no further than the longest one kept could reach.
        let bounded = EpxStr {
            data: reason.data,
            len: reason.len.min(4 * MAX_REASON_CHARS),
        };
        // SAFETY: as above (a prefix of the reason's bytes).
        let text = String::from_utf8_lossy(unsafe { bounded.as_bytes() });
        let text: String = text.chars().take(MAX_REASON_CHARS).collect();
        out.push((id as usize, text));
    }
    Ok(out)
}

fn read_groups(name: &str, cap: &EpxCapability, num_nodes: usize) -> Result<Vec<Vec<usize>>> {
    if cap.num_groups == 0 {
        return Ok(Vec::new());
    }
    if cap.group_sizes.is_null() || cap.nodes.is_null() {
        return Err(nonsense(
            name,
            "get_capability",
            "returned groups with NULL arrays".into(),
        ));
    }
    if cap.num_groups > num_nodes {
        return Err(nonsense(
            name,
            "get_capability",
            format!("returned {} groups for {num_nodes} nodes", cap.num_groups),
        ));
    }
    // SAFETY: the plugin filled `num_groups` sizes (bounded above).
    let sizes = unsafe { std::slice::from_raw_parts(cap.group_sizes, cap.num_groups) };
    let total = sizes
        .iter()
        .try_fold(0usize, |a, &s| a.checked_add(s))
        .filter(|&t| t <= num_nodes)
        .ok_or_else(|| {
            nonsense(
                name,
                "get_capability",
                format!("group sizes {sizes:?} add up to more than the graph's {num_nodes} nodes"),
            )
        })?;
    // SAFETY: `nodes` holds the sum of the sizes (bounded above).
    let ids = unsafe { std::slice::from_raw_parts(cap.nodes, total) };
    let mut groups = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for &s in sizes {
        if s == 0 {
            return Err(nonsense(
                name,
                "get_capability",
                "returned an empty group".into(),
            ));
        }
        let mut g = Vec::with_capacity(s);
        for &id in &ids[at..at + s] {
            if id as usize >= num_nodes {
                return Err(nonsense(
                    name,
                    "get_capability",
                    format!("returned node id {id}, but the graph has {num_nodes} nodes"),
                ));
            }
            g.push(id as usize);
        }
        at += s;
        groups.push(g);
    }
    Ok(groups)
}

/// A compiled group, ready to run many times.
pub struct CompiledKernel {
    provider: Arc<ProviderInstance>,
    kernel: KernelBackend,
    /// Held around `execute` for EPs that did not declare concurrent kernels.
    serialize: Option<Mutex<()>>,
    num_outputs: usize,
}

// SAFETY: execution is serialized unless the EP declared its kernels concurrent; release runs
// once, in Drop.
unsafe impl Send for CompiledKernel {}
// SAFETY: as above.
unsafe impl Sync for CompiledKernel {}

/// A kernel in this process, or the id of one in an isolated EP's child process.
enum KernelBackend {
    Local(*mut EpxKernel),
    Isolated(u64),
}

impl Drop for CompiledKernel {
    fn drop(&mut self) {
        match (&self.kernel, &self.provider.backend) {
            (KernelBackend::Local(raw), _) => {
                // SAFETY: made by `compile`, released once, before its provider (we hold an
                // Arc to it).
                unsafe {
                    if let Some(release) = (**raw).release {
                        release(*raw);
                    }
                }
            }
            (KernelBackend::Isolated(id), Backend::Isolated(remote)) => remote.release(*id),
            (KernelBackend::Isolated(_), Backend::Local(_)) => {}
        }
    }
}

impl CompiledKernel {
    pub fn provider(&self) -> &Arc<ProviderInstance> {
        &self.provider
    }

    /// Runs the kernel on `inputs` (in its EP's memory space); returns one value per subgraph
    /// output, in that space.
    pub(crate) fn execute(
        &self,
        inputs: &[Option<&Value>],
        terminate: Option<&AtomicBool>,
    ) -> Result<Vec<Value>> {
        let name = self.provider.name();
        let raw = match (&self.kernel, &self.provider.backend) {
            (KernelBackend::Local(raw), _) => *raw,
            (KernelBackend::Isolated(id), Backend::Isolated(remote)) => {
                return remote.execute(*id, inputs, self.num_outputs);
            }
            (KernelBackend::Isolated(_), Backend::Local(_)) => {
                return Err(nonsense(
                    name,
                    "execute",
                    "kernel of another process".into(),
                ));
            }
        };
        let device = (!self.provider.description.uses_host_memory())
            .then(|| Arc::clone(&self.provider) as Arc<dyn DeviceMemory>);
        let minor = self.provider.library.abi_version.minor;
        let mut call = KernelCall::new(inputs, self.num_outputs, device, minor)
            .map_err(|m| nonsense(name, "execute", m))?
            .with_terminate(terminate);
        let _guard = self
            .serialize
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: validated kernel; `call` lives across the call and is only touched by the
        // plugin through the host API meanwhile.
        let status = unsafe {
            let exec = (*raw)
                .execute
                .ok_or_else(|| nonsense(name, "execute", "NULL".into()))?;
            exec((*raw).state, call.as_raw())
        };
        // SAFETY: plugin status.
        unsafe { take_status(status) }.map_err(|e| provider_error(name, "execute", e))?;
        let mut out = Vec::with_capacity(self.num_outputs);
        for (i, o) in call.outputs.drain(..).enumerate() {
            match o {
                Some((t, _)) => out.push(t),
                None => {
                    return Err(nonsense(
                        name,
                        "execute",
                        format!("returned success without producing output {i}"),
                    ));
                }
            }
        }
        Ok(out)
    }
}

impl DeviceMemory for ProviderInstance {
    fn name(&self) -> &str {
        ProviderInstance::name(self)
    }
    fn device(&self) -> DLDevice {
        ProviderInstance::device(self)
    }
    fn allocate(&self, bytes: usize, alignment: usize) -> Result<*mut c_void> {
        ProviderInstance::allocate(self, bytes, alignment)
    }
    fn free(&self, ptr: *mut c_void) {
        ProviderInstance::free(self, ptr)
    }
    fn copy_to_device(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()> {
        ProviderInstance::copy_to_device(self, src, dst)
    }
    fn copy_to_host(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()> {
        ProviderInstance::copy_to_host(self, src, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_of_the_documented_form_is_read_and_anything_else_is_refused() {
        let d = parse_profile(
            br#"{"parts":[{"name":"n","op":"Relu","calls":2,"ns":50}],"passes":[{"name":"p"}]}"#,
        )
        .expect("documented form");
        assert_eq!(d.parts[0].calls, 2);
        assert_eq!(d.passes[0].note, "");
        // Members may be left out; unknown ones are ignored (a newer EP may add some).
        assert_eq!(parse_profile(b"{\"extra\":1}"), Ok(KernelDetail::default()));
        for bad in [
            &b"not json"[..],
            br#"{"parts":[{"name":"n","op":"Relu","calls":-1,"ns":0}]}"#,
            br#"{"parts":[{"name":"n"}]}"#,
            br#"{"parts":"all"}"#,
            b"\xff\xfe",
        ] {
            let e = parse_profile(bad).expect_err("refused");
            assert!(
                e.starts_with("returned a profile that is not of the documented form"),
                "{e}"
            );
        }
    }
}
