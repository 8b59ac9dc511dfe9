//! The Rust SDK for plugin authors: implement [`ProviderFactory`], [`Provider`] and [`Kernel`],
//! invoke [`export_plugin!`](crate::export_plugin) once, and the library is a plugin.
//!
//! The SDK owns every C struct it hands to the host and frees it in the matching `release`;
//! every function it exports runs inside [`ffi_boundary!`](crate::ffi_boundary), so a panic in
//! plugin code becomes a `Panic` status naming the function, never an unwind across the
//! boundary.

mod graph;
mod location;
mod options;
mod profile;
mod tensor;
pub mod testing;
mod value;

use std::ffi::{CString, c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

pub use crate::ffi::guard;
pub use crate::status::{
    Error, Result, cstr_or_empty, into_raw_status, panic_message, take_status,
};
pub use graph::{Attribute, GraphView, KernelContext, NodeView, SubgraphView, ValueView};
pub use location::{library_folder_of, library_path_of, site_packages_above};
pub use options::ProviderOptions;
pub use profile::{KernelProfile, PassNote, ProfilePart};
pub use tensor::{Element, TensorView};
pub use value::{OwnedValue, STRING_DTYPE, StringTensorView, ValueRef, is_string_dtype};

use crate::abi::*;
use crate::dlpack::{DLDeviceType, DLTensor};

/// What an EP says about itself.
#[derive(Clone, Debug)]
pub struct ProviderInfo {
    /// Unique EP name, e.g. `cpu`, `cuda`.
    pub name: String,
    pub vendor: String,
    /// Semver.
    pub version: String,
    /// Memory space of the EP's tensors.
    pub device_type: DLDeviceType,
    /// Whether one kernel may run on several threads at once.
    pub concurrent_kernels: bool,
}

impl ProviderInfo {
    /// An EP whose tensors are in host memory and whose kernels may run on several threads at
    /// once (the common case for a CPU EP).
    pub fn host_memory(name: &str, vendor: &str, version: &str) -> Self {
        ProviderInfo {
            name: name.into(),
            vendor: vendor.into(),
            version: version.into(),
            device_type: DLDeviceType::Cpu,
            concurrent_kernels: true,
        }
    }
}

/// One device an EP can run on (ABI 1.5), as `epx providers --devices` lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    /// The EP's number for the device (`cuda:1`).
    pub device_id: u32,
    /// The name users ask for it by when that is not the number (OpenVINO's `GPU.0`).
    pub id_name: String,
    pub vendor: String,
    pub name: String,
    /// Bytes of memory; 0 when unknown or shared with the host.
    pub memory_bytes: u64,
    pub driver_version: String,
    /// Why a device that is present cannot be used (driver too old, library missing).
    pub unusable: Option<String>,
}

/// What kind of hardware a device is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceKind {
    #[default]
    Other,
    Cpu,
    Gpu,
    Npu,
}

impl DeviceKind {
    fn raw(self) -> EpxDeviceKind {
        match self {
            DeviceKind::Other => EpxDeviceKind::Other,
            DeviceKind::Cpu => EpxDeviceKind::Cpu,
            DeviceKind::Gpu => EpxDeviceKind::Gpu,
            DeviceKind::Npu => EpxDeviceKind::Npu,
        }
    }
}

/// One EP a plugin library offers.
pub trait ProviderFactory: Send + Sync + 'static {
    fn info(&self) -> ProviderInfo;
    /// `Err(reason)` when the EP cannot run on this machine; the reason is shown to the user.
    fn availability(&self) -> Result<()> {
        Ok(())
    }
    /// (ABI 1.5) The devices the EP can run on, present ones it cannot use included. The
    /// default lists none, which says nothing about devices.
    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok(Vec::new())
    }
    /// Makes an EP instance. Call [`ProviderOptions::finish`] after taking the keys you know, so
    /// unknown keys are an error naming the valid ones.
    fn create(&self, options: ProviderOptions) -> Result<Box<dyn Provider>>;
}

/// A capability answer that also says why nodes were declined (ABI 1.4; an older host does not
/// read the reasons).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capability {
    /// Groups of node ids to claim, as [`Provider::capability`] returns them.
    pub groups: Vec<Vec<u32>>,
    /// Nodes of `unclaimed` the EP looked at and declined, with a reason a user can act on.
    pub declined: Vec<(u32, String)>,
}

impl From<Vec<Vec<u32>>> for Capability {
    fn from(groups: Vec<Vec<u32>>) -> Self {
        Capability {
            groups,
            declined: Vec::new(),
        }
    }
}

/// An EP instance.
pub trait Provider: Send + Sync + 'static {
    /// Groups of node ids to claim, each fused into one kernel. Only ids in `unclaimed` may be
    /// returned.
    fn capability(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> Result<Vec<Vec<u32>>>;
    /// (ABI 1.4) The answer with a reason for each node declined, shown in the placement
    /// report. The default is [`Self::capability`] with no reasons; an EP that says why
    /// overrides this one and has `capability` return its groups.
    fn capability_explained(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> Result<Capability> {
        Ok(self.capability(graph, unclaimed)?.into())
    }
    /// Compiles one group into a kernel. Copy what the kernel needs: `graph` is borrowed.
    fn compile(
        &self,
        graph: &GraphView<'_>,
        subgraph: &SubgraphView<'_>,
    ) -> Result<Box<dyn Kernel>>;
    /// Device memory management, for EPs whose memory is not host memory.
    fn data_transfer(&self) -> Option<&dyn DataTransfer> {
        None
    }
    /// (ABI 1.6) Whether this EP's kernels can be stored in the host's kernel cache: when
    /// `true`, the host asks each compiled kernel for [`Kernel::serialize`] and, on a later
    /// session of the same group, calls [`Self::deserialize`] instead of [`Self::compile`].
    fn caches_kernels(&self) -> bool {
        false
    }
    /// (ABI 1.6) Rebuilds a kernel from the bytes [`Kernel::serialize`] gave, for the same
    /// group (`graph` and `subgraph` are what `compile` would get). The bytes come from a file:
    /// check them, and fail on anything not recognised (another version, another device,
    /// damage); the host then compiles instead and stores the new kernel.
    fn deserialize(
        &self,
        _graph: &GraphView<'_>,
        _subgraph: &SubgraphView<'_>,
        _bytes: &[u8],
    ) -> Result<Box<dyn Kernel>> {
        Err(Error::not_implemented(
            "this EP does not rebuild kernels from bytes",
        ))
    }
}

/// A compiled group of nodes.
pub trait Kernel: Send + Sync + 'static {
    fn execute(&self, ctx: &mut KernelContext<'_>) -> Result<()>;
    /// (ABI 1.6) Bytes from which [`Provider::deserialize`] rebuilds this kernel, when its EP
    /// [caches kernels](Provider::caches_kernels); `Ok(None)` when this one cannot be stored.
    fn serialize(&self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    /// (ABI 1.7) Starts recording where runs spend their time, part by part, from zero again
    /// if it was recording. The default records nothing: the host then times the kernel as a
    /// whole. A kernel that overrides this also overrides [`Self::profile`].
    fn profile_start(&self) -> Result<()> {
        Err(Error::not_implemented(
            "this kernel does not record its parts",
        ))
    }
    /// (ABI 1.7) What was recorded since [`Self::profile_start`], and what compiling did.
    fn profile(&self) -> Result<KernelProfile> {
        Err(Error::not_implemented(
            "this kernel does not record its parts",
        ))
    }
}

/// Allocation and copies for EPs with their own memory space.
pub trait DataTransfer: Send + Sync {
    fn allocate(&self, bytes: usize, alignment: usize) -> Result<*mut c_void>;
    /// # Safety
    /// `ptr` came from `allocate` of this EP and is not used afterwards.
    unsafe fn free(&self, ptr: *mut c_void);
    fn copy_to_device(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()>;
    fn copy_to_host(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()>;
    fn copy_on_device(&self, _src: &DLTensor, _dst: &mut DLTensor) -> Result<()> {
        Err(Error::not_implemented("device-to-device copy"))
    }
}

/// The host API this library was given at entry. Valid until the library is unloaded.
static HOST_API: AtomicPtr<EpxHostApi> = AtomicPtr::new(std::ptr::null_mut());

/// The host API table, once the entry function ran.
pub fn host_api() -> Option<&'static EpxHostApi> {
    // SAFETY: set once from the entry call; the host keeps the table alive while we are loaded.
    unsafe { HOST_API.load(Ordering::Acquire).as_ref() }
}

/// Logs through the host's `tracing`, under the plugin's name.
pub fn log(level: EpxLogLevel, message: &str) {
    let log = host_api().and_then(|api| {
        if api.struct_size >= crate::epx_field_end!(EpxHostApi, log) {
            api.log
        } else {
            None
        }
    });
    if let Some(f) = log {
        let target = LOG_NAME.get().map_or(std::ptr::null(), |n| n.as_ptr());
        // SAFETY: host contract; the target (static) and message are valid for the call.
        unsafe { f(level as u32, target, EpxStr::new(message)) };
    }
}

/// Logs at error level through the host, under this plugin's name.
pub fn error(message: &str) {
    log(EpxLogLevel::Error, message)
}

/// Logs at warning level through the host, under this plugin's name.
pub fn warn(message: &str) {
    log(EpxLogLevel::Warn, message)
}

/// Logs at info level through the host, under this plugin's name.
pub fn info(message: &str) {
    log(EpxLogLevel::Info, message)
}

/// Logs at debug level through the host, under this plugin's name.
pub fn debug(message: &str) {
    log(EpxLogLevel::Debug, message)
}

/// The name [`log`] reports this library's messages under.
static LOG_NAME: std::sync::OnceLock<CString> = std::sync::OnceLock::new();

/// Sets the name this library's log messages carry (the plugin's name). Done by
/// [`export_plugin!`](crate::export_plugin); a provider linked into a host logs as `plugin`.
pub fn set_log_name(name: &str) {
    let _ = LOG_NAME.set(c_string(name));
}

/// Sends panic messages of this library to the host's log instead of stderr. A plugin library
/// has its own copy of the standard library, so this hook covers the plugin's code only; the
/// panic itself is still caught at the boundary and returned as a `Panic` status.
/// [`export_plugin!`](crate::export_plugin) installs it; providers linked into a host do not.
pub fn route_panics_to_host_log() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            log(
                EpxLogLevel::Error,
                &format!("panic{at}: {}", panic_message(info.payload())),
            );
        }));
    });
}

fn api() -> Result<&'static EpxHostApi> {
    host_api().ok_or_else(|| Error::runtime("plugin used before its entry function ran"))
}

// ---------------------------------------------------------------------------------------------
// Entry and descriptor

struct FactoryState {
    raw: EpxProviderFactory,
    factory: Box<dyn ProviderFactory>,
    _strings: [CString; 3],
}

/// `raw` comes first (repr(C)) so the descriptor pointer the host holds is the state pointer.
#[repr(C)]
struct PluginState {
    raw: EpxPluginDescriptor,
    // Boxed: the factory structs handed to the host must not move when the Vec grows.
    #[allow(clippy::vec_box)]
    factories: Vec<Box<FactoryState>>,
    factory_ptrs: Vec<*const EpxProviderFactory>,
    _strings: [CString; 2],
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

/// The body of every SDK plugin's entry function: checks the host's ABI, then builds the
/// descriptor. Use [`export_plugin!`](crate::export_plugin) rather than calling this.
///
/// # Safety
/// `host` and `out` are the arguments the host passed to the entry function.
pub unsafe fn plugin_entry(
    host: *const EpxHostApi,
    out: *mut *mut EpxPluginDescriptor,
    name: &str,
    version: &str,
    factories: impl FnOnce() -> Vec<Box<dyn ProviderFactory>>,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        if out.is_null() || host.is_null() {
            return Err(Error::invalid_argument("entry called with a NULL argument"));
        }
        // SAFETY: `out` is a valid out-pointer (checked non-null; host contract).
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: `host` is non-null and points at the host's table (host contract); fields are
        // read only after checking the size covers them.
        let api = unsafe { &*host };
        // An older host of the same major may have a shorter table: every read of a function
        // from it checks `struct_size` first (`host_fn!`), so only the major matters here.
        if api.struct_size < crate::epx_field_end!(EpxHostApi, abi_version) {
            return Err(Error::new(
                EpxStatusCode::AbiMismatch,
                "host API table too small to hold its ABI version",
            ));
        }
        if api.abi_version.major != EPX_ABI_VERSION_MAJOR {
            return Err(Error::new(
                EpxStatusCode::AbiMismatch,
                format!(
                    "plugin `{name}` was built for epx ABI {}.{}, the host speaks {}.{}",
                    EPX_ABI_VERSION_MAJOR,
                    EPX_ABI_VERSION_MINOR,
                    api.abi_version.major,
                    api.abi_version.minor
                ),
            ));
        }
        HOST_API.store(host.cast_mut(), Ordering::Release);
        let mut state = Box::new(PluginState {
            raw: EpxPluginDescriptor {
                struct_size: std::mem::size_of::<EpxPluginDescriptor>(),
                abi_version: EpxVersion::CURRENT,
                name: std::ptr::null(),
                version: std::ptr::null(),
                num_providers: 0,
                providers: std::ptr::null(),
                release: Some(release_descriptor),
            },
            factories: factories().into_iter().map(factory_state).collect(),
            factory_ptrs: Vec::new(),
            _strings: [c_string(name), c_string(version)],
        });
        state.factory_ptrs = state
            .factories
            .iter()
            .map(|f| &f.raw as *const EpxProviderFactory)
            .collect();
        state.raw.name = state._strings[0].as_ptr();
        state.raw.version = state._strings[1].as_ptr();
        state.raw.num_providers = state.factory_ptrs.len();
        state.raw.providers = state.factory_ptrs.as_ptr();
        // SAFETY: `out` checked non-null; the state is leaked until `release_descriptor`.
        unsafe { *out = Box::into_raw(state).cast::<EpxPluginDescriptor>() };
        Ok::<(), Error>(())
    })
}

fn factory_state(factory: Box<dyn ProviderFactory>) -> Box<FactoryState> {
    let info = factory.info();
    let strings = [
        c_string(&info.name),
        c_string(&info.vendor),
        c_string(&info.version),
    ];
    let mut st = Box::new(FactoryState {
        raw: EpxProviderFactory {
            struct_size: std::mem::size_of::<EpxProviderFactory>(),
            state: std::ptr::null_mut(),
            name: strings[0].as_ptr(),
            vendor: strings[1].as_ptr(),
            version: strings[2].as_ptr(),
            device_type: info.device_type as i32,
            flags: if info.concurrent_kernels {
                EPX_PROVIDER_CONCURRENT_KERNELS
            } else {
                0
            },
            is_available: Some(factory_is_available),
            create: Some(factory_create),
            get_devices: Some(factory_get_devices),
        },
        factory,
        _strings: strings,
    });
    st.raw.state = (&*st as *const FactoryState).cast_mut().cast::<c_void>();
    st
}

unsafe extern "C" fn release_descriptor(descriptor: *mut EpxPluginDescriptor) {
    crate::ffi_boundary!({
        if !descriptor.is_null() {
            // SAFETY: descriptors we hand out are leaked `PluginState` boxes whose first field
            // is the descriptor (repr(C)); the host releases each exactly once.
            drop(unsafe { Box::from_raw(descriptor.cast::<PluginState>()) });
        }
    })
}

unsafe extern "C" fn factory_is_available(state: *mut c_void) -> *mut EpxStatus {
    crate::ffi_boundary!({
        // SAFETY: `state` is the FactoryState pointer we put in the factory struct.
        let st = unsafe { &*state.cast::<FactoryState>() };
        st.factory.availability()
    })
}

/// The device array handed to the host and the strings it points into; freed by `release`.
struct DeviceListState {
    devices: Vec<EpxDevice>,
    _strings: Vec<String>,
}

unsafe extern "C" fn factory_get_devices(
    state: *mut c_void,
    out: *mut EpxDeviceList,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        if out.is_null() {
            return Err(Error::invalid_argument("get_devices: NULL out-pointer"));
        }
        // SAFETY: `state` is the FactoryState pointer we put in the factory struct.
        let st = unsafe { &*state.cast::<FactoryState>() };
        let list = st.factory.devices()?;
        if list.is_empty() {
            return Ok(());
        }
        let mut strings: Vec<String> = Vec::with_capacity(list.len() * 5);
        let mut text = |s: &str| {
            // A String's heap buffer does not move when the Vec holding it grows.
            strings.push(s.to_string());
            let last = strings.last().map_or("", String::as_str);
            EpxStr {
                data: last.as_ptr(),
                len: last.len(),
            }
        };
        let devices: Vec<EpxDevice> = list
            .iter()
            .map(|d| EpxDevice {
                struct_size: std::mem::size_of::<EpxDevice>(),
                kind: d.kind.raw() as u32,
                device_id: d.device_id,
                id_name: text(&d.id_name),
                vendor: text(&d.vendor),
                name: text(&d.name),
                memory_bytes: d.memory_bytes,
                driver_version: text(&d.driver_version),
                unusable_reason: text(d.unusable.as_deref().unwrap_or("")),
            })
            .collect();
        let state = Box::new(DeviceListState {
            devices,
            _strings: strings,
        });
        // SAFETY: `out` checked non-null; the host gave a list of at least the 1.5 size.
        unsafe {
            (*out).num_devices = state.devices.len();
            (*out).devices = state.devices.as_ptr();
            (*out).device_size = std::mem::size_of::<EpxDevice>();
            (*out).release = Some(release_devices);
            (*out).private_data = Box::into_raw(state).cast::<c_void>();
        }
        Ok::<(), Error>(())
    })
}

unsafe extern "C" fn release_devices(list: *mut EpxDeviceList) {
    crate::ffi_boundary!({
        // SAFETY: the host calls this once on the list `factory_get_devices` filled.
        unsafe {
            if !list.is_null() && !(*list).private_data.is_null() {
                drop(Box::from_raw(
                    (*list).private_data.cast::<DeviceListState>(),
                ));
                (*list).private_data = std::ptr::null_mut();
            }
        }
    })
}

unsafe extern "C" fn factory_create(
    state: *mut c_void,
    num_options: usize,
    keys: *const EpxStr,
    values: *const EpxStr,
    out: *mut *mut EpxProvider,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        if out.is_null() {
            return Err(Error::invalid_argument("create: NULL out-pointer"));
        }
        // SAFETY: `state` is our FactoryState; option arrays hold `num_options` strings borrowed
        // for the call (host contract).
        let (st, options) = unsafe {
            let st = &*state.cast::<FactoryState>();
            let mut pairs = Vec::with_capacity(num_options);
            if num_options > 0 {
                if keys.is_null() || values.is_null() {
                    return Err(Error::invalid_argument("create: NULL option arrays"));
                }
                for i in 0..num_options {
                    let k = String::from_utf8_lossy((*keys.add(i)).as_bytes()).into_owned();
                    let v = String::from_utf8_lossy((*values.add(i)).as_bytes()).into_owned();
                    pairs.push((k, v));
                }
            }
            (st, pairs)
        };
        let name = st.factory.info().name;
        let provider = st.factory.create(ProviderOptions::new(&name, options))?;
        let has_transfer = provider.data_transfer().is_some();
        let caches = provider.caches_kernels();
        let boxed = Box::new(EpxProvider {
            struct_size: std::mem::size_of::<EpxProvider>(),
            state: Box::into_raw(Box::new(provider)).cast::<c_void>(),
            get_capability: Some(provider_get_capability),
            compile: Some(provider_compile),
            allocate: has_transfer.then_some(provider_allocate as _),
            free: has_transfer.then_some(provider_free as _),
            copy_to_device: has_transfer.then_some(provider_copy_to_device as _),
            copy_to_host: has_transfer.then_some(provider_copy_to_host as _),
            copy_on_device: has_transfer.then_some(provider_copy_on_device as _),
            release: Some(provider_release),
            kernel_serialize: caches.then_some(provider_kernel_serialize as _),
            kernel_deserialize: caches.then_some(provider_kernel_deserialize as _),
            kernel_profile_start: Some(provider_kernel_profile_start),
            kernel_profile_read: Some(provider_kernel_profile_read),
        });
        // SAFETY: `out` checked non-null.
        unsafe { *out = Box::into_raw(boxed) };
        Ok::<(), Error>(())
    })
}

type DynProvider = Box<dyn Provider>;

/// # Safety
/// `state` is the provider state made by `factory_create`.
unsafe fn provider<'a>(state: *mut c_void) -> &'a dyn Provider {
    // SAFETY: the caller's contract.
    unsafe { &**state.cast::<DynProvider>() }
}

struct CapabilityArrays {
    sizes: Vec<usize>,
    nodes: Vec<u32>,
    declined_nodes: Vec<u32>,
    reason_texts: Vec<String>,
    /// Borrows `reason_texts`.
    reasons: Vec<EpxStr>,
}

unsafe extern "C" fn release_capability(cap: *mut EpxCapability) {
    crate::ffi_boundary!({
        // SAFETY: `cap` is the struct we filled; `private_data` is our leaked arrays box.
        unsafe {
            if !cap.is_null() && !(*cap).private_data.is_null() {
                drop(Box::from_raw(
                    (*cap).private_data.cast::<CapabilityArrays>(),
                ));
                (*cap).private_data = std::ptr::null_mut();
            }
        }
    })
}

unsafe extern "C" fn provider_get_capability(
    state: *mut c_void,
    graph: *const EpxGraph,
    unclaimed: *const u32,
    num_unclaimed: usize,
    out: *mut EpxCapability,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        let api = api()?;
        if out.is_null() {
            return Err(Error::invalid_argument("get_capability: NULL out-pointer"));
        }
        // SAFETY: host contract: graph and the unclaimed list are borrowed for this call.
        let (p, view, unclaimed) = unsafe {
            let unclaimed = if num_unclaimed == 0 || unclaimed.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(unclaimed, num_unclaimed)
            };
            (provider(state), GraphView::from_raw(api, graph), unclaimed)
        };
        let Capability { groups, declined } = p.capability_explained(&view, unclaimed)?;
        let mut arrays = Box::new(CapabilityArrays {
            sizes: groups.iter().map(Vec::len).collect(),
            nodes: groups.into_iter().flatten().collect(),
            declined_nodes: declined.iter().map(|(n, _)| *n).collect(),
            reason_texts: declined.into_iter().map(|(_, r)| r).collect(),
            reasons: Vec::new(),
        });
        // The strings do not move again: `reasons` borrows them until release.
        arrays.reasons = arrays.reason_texts.iter().map(|r| EpxStr::new(r)).collect();
        // SAFETY: `out` checked non-null; the arrays live until `release_capability`. The
        // reasons are written only where the host's struct has room for them (ABI 1.4).
        unsafe {
            (*out).num_groups = arrays.sizes.len();
            (*out).group_sizes = arrays.sizes.as_ptr();
            (*out).nodes = arrays.nodes.as_ptr();
            if (*out).struct_size >= crate::epx_field_end!(EpxCapability, declined_reasons) {
                (*out).num_declined = arrays.declined_nodes.len();
                (*out).declined_nodes = arrays.declined_nodes.as_ptr();
                (*out).declined_reasons = arrays.reasons.as_ptr();
            }
            (*out).release = Some(release_capability);
            (*out).private_data = Box::into_raw(arrays).cast::<c_void>();
        }
        Ok::<(), Error>(())
    })
}

unsafe extern "C" fn provider_compile(
    state: *mut c_void,
    graph: *const EpxGraph,
    subgraph: *const EpxSubgraph,
    out: *mut *mut EpxKernel,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        let api = api()?;
        if out.is_null() || subgraph.is_null() {
            return Err(Error::invalid_argument("compile: NULL argument"));
        }
        // SAFETY: host contract: graph and subgraph are borrowed for this call.
        let (p, view, sub) = unsafe {
            (
                provider(state),
                GraphView::from_raw(api, graph),
                SubgraphView::from_raw(&*subgraph),
            )
        };
        let kernel = p.compile(&view, &sub)?;
        // SAFETY: `out` checked non-null.
        unsafe { *out = raw_kernel(kernel) };
        Ok::<(), Error>(())
    })
}

/// The C struct handed to the host for a kernel; freed by `kernel_release`.
fn raw_kernel(kernel: Box<dyn Kernel>) -> *mut EpxKernel {
    Box::into_raw(Box::new(EpxKernel {
        struct_size: std::mem::size_of::<EpxKernel>(),
        state: Box::into_raw(Box::new(kernel)).cast::<c_void>(),
        execute: Some(kernel_execute),
        release: Some(kernel_release),
    }))
}

unsafe extern "C" fn provider_kernel_serialize(
    _state: *mut c_void,
    kernel: *const EpxKernel,
    out: *mut EpxBuffer,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        if out.is_null() || kernel.is_null() {
            return Err(Error::invalid_argument("kernel_serialize: NULL argument"));
        }
        // SAFETY: host contract: `kernel` is one this provider compiled (made by `raw_kernel`),
        // alive for the call.
        let bytes = unsafe { kernel_of(kernel, "kernel_serialize") }?
            .serialize()?
            .ok_or_else(|| Error::not_implemented("this kernel cannot be stored"))?;
        // SAFETY: `out` checked non-null.
        unsafe { fill_buffer(out, bytes) };
        Ok::<(), Error>(())
    })
}

/// # Safety
/// `kernel` is NULL or a kernel made by `raw_kernel`, alive for the call.
unsafe fn kernel_of<'a>(kernel: *const EpxKernel, call: &str) -> Result<&'a dyn Kernel> {
    if kernel.is_null() {
        return Err(Error::invalid_argument(format!("{call}: NULL kernel")));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { &**(*kernel).state.cast::<Box<dyn Kernel>>() })
}

unsafe extern "C" fn provider_kernel_profile_start(
    _state: *mut c_void,
    kernel: *const EpxKernel,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        // SAFETY: host contract: `kernel` is one this provider compiled, alive for the call.
        unsafe { kernel_of(kernel, "kernel_profile_start") }?.profile_start()
    })
}

unsafe extern "C" fn provider_kernel_profile_read(
    _state: *mut c_void,
    kernel: *const EpxKernel,
    out: *mut EpxBuffer,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        if out.is_null() {
            return Err(Error::invalid_argument(
                "kernel_profile_read: NULL out-pointer",
            ));
        }
        // SAFETY: host contract: `kernel` is one this provider compiled, alive for the call.
        let json = unsafe { kernel_of(kernel, "kernel_profile_read") }?
            .profile()?
            .to_json();
        // SAFETY: `out` checked non-null.
        unsafe { fill_buffer(out, json.into_bytes()) };
        Ok::<(), Error>(())
    })
}

/// Hands `bytes` over in `out`; the host frees them with `release_buffer`.
///
/// # Safety
/// `out` is a valid buffer struct.
unsafe fn fill_buffer(out: *mut EpxBuffer, bytes: Vec<u8>) {
    let mut bytes = Box::new(bytes.into_boxed_slice());
    // SAFETY: the caller's contract; the bytes live until `release_buffer`.
    unsafe {
        (*out).data = bytes.as_mut_ptr();
        (*out).len = bytes.len();
        (*out).release = Some(release_buffer);
        (*out).private_data = Box::into_raw(bytes).cast::<c_void>();
    }
}

unsafe extern "C" fn release_buffer(buffer: *mut EpxBuffer) {
    crate::ffi_boundary!({
        // SAFETY: the host calls this once on a buffer `fill_buffer` filled.
        unsafe {
            if !buffer.is_null() && !(*buffer).private_data.is_null() {
                drop(Box::from_raw((*buffer).private_data.cast::<Box<[u8]>>()));
                (*buffer).private_data = std::ptr::null_mut();
                (*buffer).data = std::ptr::null_mut();
            }
        }
    })
}

unsafe extern "C" fn provider_kernel_deserialize(
    state: *mut c_void,
    graph: *const EpxGraph,
    subgraph: *const EpxSubgraph,
    data: *const u8,
    len: usize,
    out: *mut *mut EpxKernel,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        let api = api()?;
        if out.is_null() || subgraph.is_null() || (data.is_null() && len > 0) {
            return Err(Error::invalid_argument("kernel_deserialize: NULL argument"));
        }
        // SAFETY: host contract: graph, subgraph and the `len` bytes at `data` are borrowed for
        // this call.
        let (p, view, sub, bytes) = unsafe {
            (
                provider(state),
                GraphView::from_raw(api, graph),
                SubgraphView::from_raw(&*subgraph),
                if len == 0 {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(data, len)
                },
            )
        };
        let kernel = p.deserialize(&view, &sub, bytes)?;
        // SAFETY: `out` checked non-null.
        unsafe { *out = raw_kernel(kernel) };
        Ok::<(), Error>(())
    })
}

unsafe extern "C" fn kernel_execute(
    state: *mut c_void,
    ctx: *mut EpxKernelContext,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        let api = api()?;
        // SAFETY: `state` is the boxed kernel made by `provider_compile`; `ctx` is the host's
        // context for this call.
        let (kernel, mut ctx) = unsafe {
            (
                &**state.cast::<Box<dyn Kernel>>(),
                KernelContext::from_raw(api, ctx),
            )
        };
        kernel.execute(&mut ctx)
    })
}

unsafe extern "C" fn kernel_release(kernel: *mut EpxKernel) {
    crate::ffi_boundary!({
        if kernel.is_null() {
            return;
        }
        // SAFETY: both boxes were leaked by `provider_compile`; released exactly once.
        unsafe {
            let raw = Box::from_raw(kernel);
            drop(Box::from_raw(raw.state.cast::<Box<dyn Kernel>>()));
        }
    })
}

unsafe extern "C" fn provider_release(p: *mut EpxProvider) {
    crate::ffi_boundary!({
        if p.is_null() {
            return;
        }
        // SAFETY: both boxes were leaked by `factory_create`; released exactly once.
        unsafe {
            let raw = Box::from_raw(p);
            drop(Box::from_raw(raw.state.cast::<DynProvider>()));
        }
    })
}

fn transfer<'a>(state: *mut c_void) -> Result<&'a dyn DataTransfer> {
    // SAFETY: `state` is a provider state (these functions are only installed on providers).
    unsafe { provider(state) }
        .data_transfer()
        .ok_or_else(|| Error::not_implemented("provider has no data transfer"))
}

unsafe extern "C" fn provider_allocate(
    state: *mut c_void,
    bytes: usize,
    alignment: usize,
    out: *mut *mut c_void,
) -> *mut EpxStatus {
    crate::ffi_boundary!({
        if out.is_null() {
            return Err(Error::invalid_argument("allocate: NULL out-pointer"));
        }
        let ptr = transfer(state)?.allocate(bytes, alignment)?;
        // SAFETY: checked non-null.
        unsafe { *out = ptr };
        Ok::<(), Error>(())
    })
}

unsafe extern "C" fn provider_free(state: *mut c_void, ptr: *mut c_void) {
    crate::ffi_boundary!({
        if let Ok(t) = transfer(state) {
            // SAFETY: host contract: `ptr` came from `allocate` and is not used again.
            unsafe { t.free(ptr) }
        }
    })
}

macro_rules! copy_fn {
    ($name:ident, $method:ident) => {
        unsafe extern "C" fn $name(
            state: *mut c_void,
            src: *const DLTensor,
            dst: *mut DLTensor,
        ) -> *mut EpxStatus {
            crate::ffi_boundary!({
                // SAFETY: host contract: both tensors are valid for the call.
                let (src, dst) = unsafe { (src.as_ref(), dst.as_mut()) };
                match (src, dst) {
                    (Some(s), Some(d)) => transfer(state)?.$method(s, d),
                    _ => Err(Error::invalid_argument(concat!(
                        stringify!($method),
                        ": NULL tensor"
                    ))),
                }
            })
        }
    };
}
copy_fn!(provider_copy_to_device, copy_to_device);
copy_fn!(provider_copy_to_host, copy_to_host);
copy_fn!(provider_copy_on_device, copy_on_device);

/// Defines an `extern "C"` plugin entry function with the given name. Plugins normally use
/// [`export_plugin!`](crate::export_plugin); this form lets a crate that is also linked into a
/// host (like the CPU EP) define its entry without exporting a global symbol.
#[macro_export]
macro_rules! plugin_entry {
    ($vis:vis fn $fn_name:ident; name: $name:expr, version: $version:expr, providers: [$($factory:expr),* $(,)?] $(,)?) => {
        /// The plugin's entry function (see `EpxPluginEntryFn`).
        ///
        /// # Safety
        /// Called by the host as the ABI says: a valid host table and out-pointer.
        $vis unsafe extern "C" fn $fn_name(
            host: *const $crate::abi::EpxHostApi,
            out: *mut *mut $crate::abi::EpxPluginDescriptor,
        ) -> *mut $crate::abi::EpxStatus {
            // SAFETY: forwarded unchanged from the host.
            unsafe {
                $crate::sdk::plugin_entry(host, out, $name, $version, || {
                    vec![$(Box::new($factory) as Box<dyn $crate::sdk::ProviderFactory>),*]
                })
            }
        }
    };
}

/// Exports `epx_plugin_entry` from this library, offering the given provider factories.
///
/// ```ignore
/// epx_plugin_api::export_plugin!(name: "myplugin", version: env!("CARGO_PKG_VERSION"), providers: [MyFactory]);
/// ```
#[macro_export]
macro_rules! export_plugin {
    (name: $name:expr, version: $version:expr, providers: [$($factory:expr),* $(,)?] $(,)?) => {
        $crate::plugin_entry!(fn __epx_plugin_entry_impl; name: $name, version: $version, providers: [$($factory),*]);

        /// The one symbol an epx plugin library exports.
        ///
        /// # Safety
        /// Called by the host as the ABI says.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn epx_plugin_entry(
            host: *const $crate::abi::EpxHostApi,
            out: *mut *mut $crate::abi::EpxPluginDescriptor,
        ) -> *mut $crate::abi::EpxStatus {
            $crate::ffi_boundary!({
                $crate::sdk::set_log_name($name);
                $crate::sdk::route_panics_to_host_log()
            });
            // SAFETY: forwarded unchanged from the host.
            unsafe { __epx_plugin_entry_impl(host, out) }
        }
    };
}

/// Reads a C string the host or plugin handed over (for diagnostics).
///
/// # Safety
/// As [`cstr_or_empty`].
pub unsafe fn c_text(p: *const c_char) -> String {
    // SAFETY: the caller's contract.
    unsafe { cstr_or_empty(p) }.into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<(u32, String, String)>> = Mutex::new(Vec::new());

    unsafe extern "C" fn record(level: u32, target: *const c_char, message: EpxStr) {
        // SAFETY: the SDK passes a static C string or NULL, and a message valid for the call.
        let (target, message) = unsafe { (c_text(target), message.as_bytes()) };
        let message = String::from_utf8_lossy(message).into_owned();
        SEEN.lock().unwrap().push((level, target, message));
    }

    #[test]
    fn log_messages_carry_the_plugin_name() {
        // SAFETY: all-zero is a valid table (every function absent); the fields read are set.
        let mut api: EpxHostApi = unsafe { std::mem::zeroed() };
        api.struct_size = std::mem::size_of::<EpxHostApi>();
        api.log = Some(record);
        let api: &'static EpxHostApi = Box::leak(Box::new(api));
        HOST_API.store((api as *const EpxHostApi).cast_mut(), Ordering::Release);
        set_log_name("toy");
        warn("disk is full");
        info("compiled 3 kernels");
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (
                    EpxLogLevel::Warn as u32,
                    "toy".into(),
                    "disk is full".into()
                ),
                (
                    EpxLogLevel::Info as u32,
                    "toy".into(),
                    "compiled 3 kernels".into()
                ),
            ]
        );
    }
}
