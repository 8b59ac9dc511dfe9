//! Opening a plugin library that [`admit`](super::admit) passed: preload its dependencies,
//! `dlopen` it, call the entry function, and check what the plugin hands back before anything
//! else trusts it.

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::DLDeviceType;
use epx_plugin_api::sdk::take_status;

use super::host_api::host_api;
use super::isolate::config::Isolation;
use super::refusal::Refusal;
use super::sealed::LibraryImage;
use crate::error::{PluginLoadErrorKind as Kind, Result};

/// What one EP of a loaded library says about itself.
#[derive(Clone, Debug)]
pub struct ProviderDescription {
    pub name: String,
    pub vendor: String,
    pub version: String,
    /// The memory space of its tensors.
    pub device_type: i32,
    pub concurrent_kernels: bool,
    /// `Err(reason)` when it cannot run on this machine.
    pub availability: std::result::Result<(), String>,
    /// The devices it can run on (ABI 1.5), present ones it cannot use included; empty when
    /// the plugin says nothing about devices.
    pub devices: Vec<Device>,
    /// Why asking the plugin for its devices failed, when it did.
    pub devices_error: Option<String>,
}

/// One device an EP can run on, as its plugin describes it (ABI 1.5).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Device {
    /// `cpu`, `gpu`, `npu` or `other`.
    pub kind: &'static str,
    /// The EP's number for the device.
    pub id: u32,
    /// The name a user asks for it by when that is not the number (OpenVINO's `GPU.0`).
    pub id_name: Option<String>,
    pub vendor: String,
    pub name: String,
    /// Bytes of memory, when known.
    pub memory_bytes: Option<u64>,
    pub driver_version: String,
    /// Why the EP cannot use this device, when it cannot.
    pub unusable: Option<String>,
}

impl Device {
    /// How a session names the device after its EP: `cuda:1`, `openvino:GPU.0`.
    pub fn selector(&self, provider: &str) -> String {
        match &self.id_name {
            Some(n) => format!("{provider}:{n}"),
            None => format!("{provider}:{}", self.id),
        }
    }
}

/// The most devices read from one EP, and the longest string kept of each field.
const MAX_DEVICES: usize = 1024;
const MAX_DEVICE_TEXT: usize = 512;

/// Reads an EP's device list (ABI 1.5): bounded, validated, released.
///
/// # Safety
/// `f` is a validated factory whose `struct_size` covers `get_devices`.
unsafe fn read_devices(f: &EpxProviderFactory) -> std::result::Result<Vec<Device>, String> {
    let Some(get) = f.get_devices else {
        return Ok(Vec::new());
    };
    let mut list = EpxDeviceList::empty();
    // SAFETY: the caller's contract; `list` is a valid out-parameter.
    let status = unsafe { get(f.state, &mut list) };
    // SAFETY: plugin status, released through its own function.
    let result = unsafe { take_status(status) }.map_err(|e| e.message);
    let read = result.and_then(|()| {
        if list.num_devices == 0 {
            return Ok(Vec::new());
        }
        if list.num_devices > MAX_DEVICES {
            return Err(format!("lists {} devices", list.num_devices));
        }
        if list.devices.is_null() || list.device_size < EPX_DEVICE_SIZE_1_5 {
            return Err(format!(
                "device array is NULL or its entries are {} bytes, fewer than ABI 1.5's {}",
                list.device_size, EPX_DEVICE_SIZE_1_5
            ));
        }
        let align = std::mem::align_of::<EpxDevice>();
        if list.device_size > 4096
            || list.device_size % align != 0
            || (list.devices as usize) % align != 0
        {
            return Err(format!(
                "device entries of {} bytes at {:p} are not a plausible, aligned array",
                list.device_size, list.devices
            ));
        }
        let text = |s: &EpxStr| {
            let bounded = EpxStr {
                data: s.data,
                len: s.len.min(4 * MAX_DEVICE_TEXT),
            };
            if bounded.data.is_null() {
                return String::new();
            }
            // SAFETY: a plugin string valid until `release`, read no further than its length.
            let t = String::from_utf8_lossy(unsafe { bounded.as_bytes() });
            t.chars().take(MAX_DEVICE_TEXT).collect::<String>()
        };
        let mut out = Vec::with_capacity(list.num_devices);
        for i in 0..list.num_devices {
            // SAFETY: `num_devices` entries `device_size` bytes apart (bounded above), each at
            // least ABI 1.5's size.
            let d = unsafe {
                &*list
                    .devices
                    .cast::<u8>()
                    .add(i * list.device_size)
                    .cast::<EpxDevice>()
            };
            if d.struct_size < EPX_DEVICE_SIZE_1_5 {
                return Err(format!(
                    "device {i}: struct_size {} is too small",
                    d.struct_size
                ));
            }
            let id_name = Some(text(&d.id_name)).filter(|n| !n.is_empty());
            let unusable = Some(text(&d.unusable_reason)).filter(|n| !n.is_empty());
            let device = Device {
                kind: match EpxDeviceKind::from_raw(d.kind) {
                    EpxDeviceKind::Cpu => "cpu",
                    EpxDeviceKind::Gpu => "gpu",
                    EpxDeviceKind::Npu => "npu",
                    EpxDeviceKind::Other => "other",
                },
                id: d.device_id,
                id_name,
                vendor: text(&d.vendor),
                name: text(&d.name),
                memory_bytes: (d.memory_bytes > 0).then_some(d.memory_bytes),
                driver_version: text(&d.driver_version),
                unusable,
            };
            if out.iter().any(|o: &Device| {
                o.id == device.id || (o.id_name.is_some() && o.id_name == device.id_name)
            }) {
                return Err(format!("device {i}: its id is listed twice"));
            }
            out.push(device);
        }
        Ok(out)
    });
    if let Some(release) = list.release {
        // SAFETY: the plugin's release for the list it filled, called once.
        unsafe { release(&mut list) };
    }
    read
}

impl ProviderDescription {
    pub fn uses_host_memory(&self) -> bool {
        self.device_type == DLDeviceType::Cpu as i32
    }
}

/// What a library says about itself (here, or in the child process that opened it).
#[derive(Clone, Debug)]
pub struct Described {
    pub name: String,
    pub version: String,
    pub abi_version: EpxVersion,
    pub providers: Vec<ProviderDescription>,
}

/// A loaded plugin library and the descriptor its entry function returned.
pub struct PluginLibrary {
    pub name: String,
    pub version: String,
    /// `None` for providers linked into the host.
    pub path: Option<PathBuf>,
    pub abi_version: EpxVersion,
    pub providers: Vec<ProviderDescription>,
    /// The dependencies preloaded before the library, in order.
    pub preloads: Vec<PathBuf>,
    /// What was opened (the sealed copies admission checked), for a child process to open the
    /// same bytes: the library and its preloads.
    pub(crate) image: Option<LibraryImage>,
    pub(crate) preload_images: Vec<LibraryImage>,
    /// Set when the library was opened only in a child process (its manifest says `isolate =
    /// true`): its EPs can run only there.
    pub isolation: Option<Isolation>,
    /// The library file's SHA-256, once asked for ([`Self::file_sha256`]).
    file_sha256: std::sync::OnceLock<Option<String>>,
    /// Size, modification time and inode of the file when it was opened, to tell whether the
    /// file hashed later is still the one loaded.
    file_stamp: Option<FileStamp>,
    descriptor: *mut EpxPluginDescriptor,
    factories: Vec<*const EpxProviderFactory>,
    // Dropped after the descriptor is released (see Drop), dependencies last.
    library: Option<Loaded>,
    _preloaded: Vec<Loaded>,
}

/// A library `dlopen`ed from `image`: on drop it is closed, and its sealed copy is kept for the
/// life of the process if the loader could not unload it (see [`super::sealed`]).
struct Loaded {
    library: Option<libloading::Library>,
    image: LibraryImage,
    /// The load address of a library loaded from its sealed copy (see
    /// [`super::sealed::mark_ours`]).
    ours_at: Option<usize>,
}

impl Loaded {
    /// Opens `image` (its sealed copy where there is one) with `RTLD_NOW`.
    ///
    /// # Safety
    /// Runs the library's initializers.
    unsafe fn open(image: &LibraryImage) -> std::result::Result<Loaded, String> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if image.sealed.is_some() {
            if let Some(name) = super::sealed::loaded_elsewhere(&image.path) {
                tracing::debug!(
                    library = %image.path.display(),
                    "the program has this library loaded already: its instance is used"
                );
                use libloading::os::unix::{Library, RTLD_NOW};
                let name = std::ffi::OsStr::new(&*name.to_string_lossy()).to_os_string();
                // SAFETY: RTLD_NOLOAD takes a reference to an object already loaded; no code
                // runs.
                let library = unsafe { Library::open(Some(&name), RTLD_NOW | libc::RTLD_NOLOAD) }
                    .map_err(|e| e.to_string())?;
                return Ok(Loaded {
                    library: Some(library.into()),
                    // Not the sealed copy: the bytes that run are the program's.
                    image: LibraryImage::unsealed(&image.path),
                    ours_at: None,
                });
            }
        }
        let load = image.load_path();
        // SAFETY: the caller's contract.
        let library = unsafe { open_now(&load) }.map_err(|e| {
            // The loader names the sealed copy (/proc/self/fd/N): name the file instead.
            e.to_string().replace(
                &load.display().to_string(),
                &image.path.display().to_string(),
            )
        })?;
        #[allow(unused_mut)]
        let mut ours_at = None;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        let library = if image.sealed.is_some() {
            let raw = libloading::os::unix::Library::from(library).into_raw();
            // SAFETY: `raw` is the live handle just opened.
            unsafe {
                super::sealed::name_as_file(raw, &image.path);
                ours_at = super::sealed::mark_ours(raw);
            }
            // SAFETY: the same handle, given back to its owner.
            libloading::Library::from(unsafe { libloading::os::unix::Library::from_raw(raw) })
        } else {
            library
        };
        Ok(Loaded {
            library: Some(library),
            image: image.clone(),
            ours_at,
        })
    }

    fn library(&self) -> Option<&libloading::Library> {
        self.library.as_ref()
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        drop(self.library.take());
        #[cfg(target_os = "linux")]
        if let Some(sealed) = self.image.sealed.take() {
            if sealed.still_loaded() {
                super::sealed::pin(sealed);
            } else {
                #[cfg(target_env = "gnu")]
                if let Some(addr) = self.ours_at {
                    super::sealed::forget_ours(addr);
                }
            }
        }
    }
}

// SAFETY: the descriptor and factories are immutable after the entry call, and the ABI requires
// every plugin function to be callable from any thread.
unsafe impl Send for PluginLibrary {}
// SAFETY: as above.
unsafe impl Sync for PluginLibrary {}

impl std::fmt::Debug for PluginLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginLibrary")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("path", &self.path)
            .field(
                "sha256",
                &self.image.as_ref().and_then(LibraryImage::sha256),
            )
            .field("providers", &self.providers)
            .finish()
    }
}

impl Drop for PluginLibrary {
    fn drop(&mut self) {
        // SAFETY: the descriptor came from this library's entry function and is released once,
        // before the library is unloaded (fields drop after this body).
        unsafe { release_descriptor(self.descriptor) };
    }
}

/// # Safety
/// `d` is NULL or a descriptor returned by an entry function and not yet released.
unsafe fn release_descriptor(d: *mut EpxPluginDescriptor) {
    if d.is_null() {
        return;
    }
    // SAFETY: the caller's contract; `release` is read only if the struct is large enough.
    unsafe {
        if (*d).struct_size >= EPX_PLUGIN_DESCRIPTOR_SIZE_1_0 {
            if let Some(release) = (*d).release {
                release(d);
            }
        }
    }
}

fn load_error(kind: Kind, message: impl Into<String>) -> Refusal {
    Refusal::new(kind, message)
}

/// Reads a C string from the plugin, refusing NULL and invalid UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that lives as long as the descriptor.
unsafe fn plugin_str(
    p: *const std::ffi::c_char,
    what: &str,
) -> std::result::Result<String, String> {
    if p.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map(str::to_string)
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// What tells one version of a file from the next without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    #[cfg(unix)]
    inode: u64,
}

impl FileStamp {
    /// The stamp of `path` when this process first opened it: opening a library that is still
    /// loaded gives the code loaded then, whatever the file holds now.
    fn at_first_load(path: &Path) -> Option<FileStamp> {
        static FIRST: Mutex<Option<HashMap<PathBuf, Option<FileStamp>>>> = Mutex::new(None);
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
        *first
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_insert_with(|| FileStamp::of(path))
    }

    fn of(path: &Path) -> Option<FileStamp> {
        let md = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            len: md.len(),
            modified: md.modified().ok(),
            #[cfg(unix)]
            inode: std::os::unix::fs::MetadataExt::ino(&md),
        })
    }
}

impl PluginLibrary {
    /// The SHA-256 of the library file, read once per process; `None` for providers linked
    /// into the program or a file that cannot be read.
    /// `None` too when the file changed since it was opened (a plugin upgraded under a running
    /// process): its digest would not be the loaded code's.
    pub fn file_sha256(&self) -> Option<&str> {
        self.file_sha256
            .get_or_init(|| {
                // Loaded from a sealed copy: its digest is exactly the loaded code's.
                if let Some(d) = self.image.as_ref().and_then(LibraryImage::sha256) {
                    return Some(d.to_string());
                }
                let path = self.path.as_deref()?;
                if self.file_stamp.is_some() && FileStamp::of(path) != self.file_stamp {
                    tracing::warn!(
                        path = %path.display(),
                        "the plugin library changed since it was loaded; its kernels are not cached"
                    );
                    return None;
                }
                super::manifest::sha256_file(path)
                    .map_err(|e| tracing::debug!(path = %path.display(), "cannot hash: {e}"))
                    .ok()
            })
            .as_deref()
    }

    /// The SHA-256 of the sealed copy this library was loaded from (or, isolated, that its
    /// child must load); `None` when it was opened by path or is linked into the program.
    pub fn loaded_sha256(&self) -> Option<&str> {
        self.image.as_ref().and_then(LibraryImage::sha256)
    }

    /// Opens a plugin library admitted by [`admit`](super::admit::admit): preloads `preload`
    /// (its dependencies, in order), `dlopen`s it, calls its entry function and validates the
    /// descriptor. Each is opened from its sealed copy where there is one, so the bytes
    /// admission checked are the bytes that run. When `image` is hosted (an ONNX Runtime
    /// plugin-EP library, [`hosted`](super::hosted)), it is the vendor's library, opened first, and
    /// the entry called is the adapter's, with settings naming that copy.
    pub fn open(
        image: &LibraryImage,
        preload: &[LibraryImage],
    ) -> std::result::Result<Arc<PluginLibrary>, Refusal> {
        let hosting = image.hosted_by.as_deref();
        let path = image.path.as_path();
        let _span = tracing::debug_span!("load", plugin = %path.display()).entered();
        let mut preloaded = Vec::new();
        for dep in preload {
            tracing::debug!(dependency = %dep.path.display(), sha256 = ?dep.sha256(), "preloading");
            // SAFETY: loading a library runs its initializers; the operator configured this
            // plugin folder and the preflight found this file among the plugin's dependencies.
            let lib = unsafe { Loaded::open(dep) }.map_err(|e| {
                load_error(
                    Kind::Open,
                    format!("preloading dependency {}: {e}", dep.path.display()),
                )
            })?;
            preloaded.push(lib);
        }
        let stamp = match image.sealed {
            Some(_) => None,
            None => FileStamp::at_first_load(path),
        };
        // SAFETY: as above. RTLD_NOW makes unresolved symbols fail here, not mid-run.
        let loaded = unsafe { Loaded::open(image) }.map_err(|e| load_error(Kind::Open, e))?;
        let (loaded, mut lib) = match hosting {
            None => {
                let library = loaded.library().ok_or_else(|| {
                    load_error(Kind::Open, "internal: the library closed at once")
                })?;
                // SAFETY: the symbol's type is fixed by the ABI (`EpxPluginEntryFn`).
                let entry: EpxPluginEntryFn = unsafe {
                    *library.get::<EpxPluginEntryFn>(EPX_PLUGIN_ENTRY_SYMBOL.as_bytes()).map_err(|_| {
                        load_error(
                            Kind::MissingEntry,
                            format!("does not export `{EPX_PLUGIN_ENTRY_SYMBOL}`; it is not an epx plugin, or was built without the export"),
                        )
                    })?
                };
                // SAFETY: `entry` has the ABI's signature; the library stays loaded while we use
                // it.
                let lib = unsafe { Self::checked_entry(|out| entry(host_api(), out), Some(path)) }?;
                (loaded, lib)
            }
            Some(hosting) => {
                // The vendor's library stays loaded (ONNX Runtime registers this same copy: it
                // finds it loaded already); what answers as the plugin is the adapter.
                preloaded.push(loaded);
                // SAFETY: epx's own adapter, checked and sealed by admission like a plugin.
                let adapter = unsafe { Loaded::open(&hosting.adapter) }.map_err(|e| {
                    load_error(Kind::Open, format!("epx's ONNX Runtime adapter: {e}"))
                })?;
                let library = adapter.library().ok_or_else(|| {
                    load_error(Kind::Open, "internal: the adapter closed at once")
                })?;
                // SAFETY: the symbol's type is fixed by the ABI.
                let entry: EpxPluginEntryWithSettingsFn = unsafe {
                    *library
                        .get::<EpxPluginEntryWithSettingsFn>(
                            EPX_PLUGIN_ENTRY_WITH_SETTINGS_SYMBOL.as_bytes(),
                        )
                        .map_err(|_| {
                            load_error(
                                Kind::MissingEntry,
                                format!(
                                    "{} does not export `{EPX_PLUGIN_ENTRY_WITH_SETTINGS_SYMBOL}`: \
                                     not epx's ONNX Runtime adapter",
                                    hosting.adapter.path.display()
                                ),
                            )
                        })?
                };
                let settings = hosting.settings(image);
                let keys: Vec<EpxStr> = settings.iter().map(|(k, _)| EpxStr::new(k)).collect();
                let values: Vec<EpxStr> = settings.iter().map(|(_, v)| EpxStr::new(v)).collect();
                // SAFETY: `entry` has the ABI's signature; the settings live for the call.
                let lib = unsafe {
                    Self::checked_entry(
                        |out| entry(host_api(), keys.len(), keys.as_ptr(), values.as_ptr(), out),
                        Some(path),
                    )
                }?;
                (adapter, lib)
            }
        };
        let lib_mut = Arc::get_mut(&mut lib)
            .ok_or_else(|| load_error(Kind::BadDescriptor, "internal: shared too early"))?;
        lib_mut.library = Some(loaded);
        lib_mut.file_stamp = stamp;
        lib_mut._preloaded = preloaded;
        lib_mut.preloads = preload.iter().map(|p| p.path.clone()).collect();
        lib_mut.image = Some(image.clone());
        lib_mut.preload_images = preload.to_vec();
        Ok(lib)
    }

    /// Calls an entry function (of a loaded library, or of a provider linked into the host)
    /// and validates the descriptor.
    ///
    /// # Safety
    /// `entry` is a plugin entry function whose code stays loaded while the result lives.
    pub unsafe fn from_entry(
        entry: EpxPluginEntryFn,
        path: Option<&Path>,
    ) -> Result<Arc<PluginLibrary>> {
        let shown = path.map_or_else(|| PathBuf::from("<built-in>"), Path::to_path_buf);
        // SAFETY: the caller's contract, passed on.
        unsafe { Self::checked_entry(|out| entry(host_api(), out), path) }
            .map_err(|r| r.into_error(&shown))
    }

    /// Calls an entry function through `call` (which passes it the out-pointer) and validates
    /// the descriptor.
    ///
    /// # Safety
    /// As [`from_entry`](Self::from_entry): `call` calls an entry function with the host's table.
    unsafe fn checked_entry(
        call: impl FnOnce(*mut *mut EpxPluginDescriptor) -> *mut EpxStatus,
        path: Option<&Path>,
    ) -> std::result::Result<Arc<PluginLibrary>, Refusal> {
        let mut descriptor: *mut EpxPluginDescriptor = std::ptr::null_mut();
        // SAFETY: the ABI's entry contract: our table lives for the process; `descriptor` is a
        // valid out-pointer.
        let status = call(&mut descriptor);
        // SAFETY: the status comes from the plugin and is released through its own function.
        if let Err(e) = unsafe { take_status(status) } {
            // SAFETY: a failing entry should leave it NULL; release anything it left anyway.
            unsafe { release_descriptor(descriptor) };
            let kind = match e.code {
                EpxStatusCode::Panic => Kind::EntryPanicked,
                EpxStatusCode::AbiMismatch => Kind::AbiMismatch,
                _ => Kind::EntryFailed,
            };
            return Err(load_error(
                kind,
                format!("the plugin refused to load: {}", e.message),
            ));
        }
        if descriptor.is_null() {
            return Err(load_error(
                Kind::BadDescriptor,
                "entry function returned success but no descriptor",
            ));
        }
        // SAFETY: non-null descriptor from the entry function; validated before use, released
        // on every failure path.
        match unsafe { Self::read_descriptor(descriptor) } {
            Ok(mut lib) => {
                lib.path = path.map(Path::to_path_buf);
                Ok(Arc::new(lib))
            }
            Err(e) => {
                // SAFETY: not yet released.
                unsafe { release_descriptor(descriptor) };
                Err(e)
            }
        }
    }

    /// # Safety
    /// `d` is a non-null descriptor from an entry function.
    unsafe fn read_descriptor(
        d: *mut EpxPluginDescriptor,
    ) -> std::result::Result<PluginLibrary, Refusal> {
        let bad = |m: String| load_error(Kind::BadDescriptor, m);
        // SAFETY: the caller's contract; `struct_size` is the first field of every version.
        let size = unsafe { (*d).struct_size };
        let v1_size = EPX_PLUGIN_DESCRIPTOR_SIZE_1_0;
        if size
            < std::mem::offset_of!(EpxPluginDescriptor, abi_version)
                + std::mem::size_of::<EpxVersion>()
        {
            return Err(bad(format!(
                "descriptor struct_size {size} is too small to hold an ABI version"
            )));
        }
        // SAFETY: the size covers `abi_version`.
        let abi = unsafe { (*d).abi_version };
        if abi.major != EPX_ABI_VERSION_MAJOR {
            return Err(load_error(
                Kind::AbiMismatch,
                format!(
                    "built for epx plugin ABI {}.{}, but this host speaks ABI {}.{}; rebuild the plugin against ABI {}.x",
                    abi.major,
                    abi.minor,
                    EPX_ABI_VERSION_MAJOR,
                    EPX_ABI_VERSION_MINOR,
                    EPX_ABI_VERSION_MAJOR
                ),
            ));
        }
        if abi.minor > EPX_ABI_VERSION_MINOR {
            return Err(load_error(
                Kind::AbiMismatch,
                format!(
                    "built for epx plugin ABI {}.{}, newer than this host's {}.{}; upgrade the host",
                    abi.major, abi.minor, EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR
                ),
            ));
        }
        if size < v1_size {
            return Err(bad(format!(
                "descriptor struct_size {size} is smaller than ABI 1.0's {v1_size}"
            )));
        }
        // SAFETY: the size covers every field read below; strings live as long as the descriptor.
        let (name, version, n, list) = unsafe {
            let r = &*d;
            (
                plugin_str(r.name, "plugin name").map_err(&bad)?,
                plugin_str(r.version, "plugin version").map_err(&bad)?,
                r.num_providers,
                r.providers,
            )
        };
        if n > 0 && list.is_null() {
            return Err(bad(format!(
                "descriptor lists {n} providers but the array is NULL"
            )));
        }
        if n > 4096 {
            return Err(bad(format!("descriptor claims {n} providers")));
        }
        let mut factories = Vec::with_capacity(n);
        let mut providers = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `list` holds `n` pointers (checked non-null above).
            let f = unsafe { *list.add(i) };
            // SAFETY: checked for NULL and size before reading fields.
            let desc = unsafe {
                if f.is_null() {
                    return Err(bad(format!("provider {i} is NULL")));
                }
                let r = &*f;
                if r.struct_size < EPX_PROVIDER_FACTORY_SIZE_1_0 {
                    return Err(bad(format!(
                        "provider {i}: struct_size {} is too small",
                        r.struct_size
                    )));
                }
                if r.create.is_none() {
                    return Err(bad(format!("provider {i}: `create` is NULL")));
                }
                let name = plugin_str(r.name, "provider name").map_err(&bad)?;
                if name.is_empty()
                    || name.contains(['/', ' '])
                    || name.chars().any(char::is_control)
                {
                    return Err(bad(format!(
                        "provider name `{}` must be non-empty, without spaces, '/' or control \
                         characters",
                        crate::printable(&name)
                    )));
                }
                let availability = match r.is_available {
                    None => Ok(()),
                    Some(f) => take_status(f(r.state)).map_err(|e| e.message),
                };
                let (devices, devices_error) =
                    if abi.minor >= 5 && r.struct_size >= EPX_PROVIDER_FACTORY_SIZE_1_5 {
                        match read_devices(r) {
                            Ok(d) => (d, None),
                            Err(e) => (Vec::new(), Some(e)),
                        }
                    } else {
                        (Vec::new(), None)
                    };
                ProviderDescription {
                    name,
                    vendor: plugin_str(r.vendor, "vendor").unwrap_or_default(),
                    version: plugin_str(r.version, "provider version").unwrap_or_default(),
                    device_type: r.device_type,
                    concurrent_kernels: r.flags & EPX_PROVIDER_CONCURRENT_KERNELS != 0,
                    availability,
                    devices,
                    devices_error,
                }
            };
            factories.push(f);
            providers.push(desc);
        }
        Ok(PluginLibrary {
            name,
            version,
            path: None,
            abi_version: abi,
            providers,
            preloads: Vec::new(),
            image: None,
            preload_images: Vec::new(),
            isolation: None,
            file_sha256: std::sync::OnceLock::new(),
            file_stamp: None,
            descriptor: d,
            factories,
            library: None,
            _preloaded: Vec::new(),
        })
    }

    /// A library opened in a child process only, as that process described it.
    pub fn isolated(
        image: &LibraryImage,
        preloads: &[LibraryImage],
        isolation: Isolation,
        described: Described,
    ) -> Arc<PluginLibrary> {
        let path = image.path.as_path();
        Arc::new(PluginLibrary {
            name: described.name,
            version: described.version,
            path: Some(path.to_path_buf()),
            abi_version: described.abi_version,
            providers: described.providers,
            preloads: preloads.iter().map(|p| p.path.clone()).collect(),
            image: Some(image.clone()),
            preload_images: preloads.to_vec(),
            isolation: Some(isolation),
            file_sha256: std::sync::OnceLock::new(),
            file_stamp: match image.sealed {
                Some(_) => None,
                None => FileStamp::of(path),
            },
            descriptor: std::ptr::null_mut(),
            factories: Vec::new(),
            library: None,
            _preloaded: Vec::new(),
        })
    }

    /// What a child process must open to run this library's EPs: the checked copies of the
    /// library and its preloads (`None` for providers linked into the program).
    pub(crate) fn images(&self) -> Option<(LibraryImage, Vec<LibraryImage>)> {
        let path = self.path.as_deref()?;
        let image = self
            .image
            .clone()
            .unwrap_or_else(|| LibraryImage::unsealed(path));
        let preloads = if self.preload_images.len() == self.preloads.len() {
            self.preload_images.clone()
        } else {
            self.preloads
                .iter()
                .map(|p| LibraryImage::unsealed(p))
                .collect()
        };
        Some((image, preloads))
    }

    pub(crate) fn factory(&self, index: usize) -> Option<*const EpxProviderFactory> {
        self.factories.get(index).copied()
    }

    /// Where the plugin came from, for messages.
    pub fn origin(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(|| "built-in".to_string(), |p| p.display().to_string())
    }
}

/// `dlopen` with `RTLD_NOW | RTLD_LOCAL` where the platform has them.
///
/// # Safety
/// Runs the library's initializers.
unsafe fn open_now(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: the caller's contract.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: the caller's contract.
        unsafe { libloading::Library::new(path) }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;

    use super::*;

    /// Lists released so far. Device arrays a plugin might hand back, by the factory's
    /// `state`: 0 good, 1 an id twice, 2 entries smaller than ABI 1.5's, 3 a NULL array with a
    /// count, 4 a huge count, 5 misaligned entries, 6 an error.
    static RELEASED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn device(id: u32, name: &'static str) -> EpxDevice {
        EpxDevice {
            struct_size: std::mem::size_of::<EpxDevice>(),
            kind: 2,
            device_id: id,
            id_name: EpxStr::new(""),
            vendor: EpxStr::new("v"),
            name: EpxStr::new(name),
            memory_bytes: 0,
            driver_version: EpxStr::new(""),
            unusable_reason: EpxStr::new(""),
        }
    }

    unsafe extern "C" fn release(_: *mut EpxDeviceList) {
        RELEASED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    unsafe extern "C" fn get_devices(
        state: *mut c_void,
        out: *mut EpxDeviceList,
    ) -> *mut EpxStatus {
        let devices: &'static [EpxDevice] = Box::leak(Box::new([device(0, "a"), device(0, "b")]));
        let case = state as usize;
        // SAFETY: the host's out-parameter.
        let out = unsafe { &mut *out };
        out.release = Some(release);
        match case {
            0 => {
                out.num_devices = 1;
                out.devices = devices.as_ptr();
                out.device_size = std::mem::size_of::<EpxDevice>();
            }
            1 => {
                out.num_devices = 2;
                out.devices = devices.as_ptr();
                out.device_size = std::mem::size_of::<EpxDevice>();
            }
            2 => {
                out.num_devices = 1;
                out.devices = devices.as_ptr();
                out.device_size = 8;
            }
            3 => {
                out.num_devices = 3;
                out.devices = std::ptr::null();
                out.device_size = std::mem::size_of::<EpxDevice>();
            }
            4 => {
                out.num_devices = usize::MAX;
                out.devices = devices.as_ptr();
                out.device_size = std::mem::size_of::<EpxDevice>();
            }
            5 => {
                out.num_devices = 1;
                out.devices = devices.as_ptr();
                out.device_size = std::mem::size_of::<EpxDevice>() + 1;
            }
            _ => {
                return epx_plugin_api::sdk::into_raw_status(
                    epx_plugin_api::sdk::Error::unavailable("no driver"),
                );
            }
        }
        std::ptr::null_mut()
    }

    fn factory(case: usize) -> EpxProviderFactory {
        EpxProviderFactory {
            struct_size: std::mem::size_of::<EpxProviderFactory>(),
            state: case as *mut c_void,
            name: c"t".as_ptr(),
            vendor: c"t".as_ptr(),
            version: c"0".as_ptr(),
            device_type: 1,
            flags: 0,
            is_available: None,
            create: None,
            get_devices: Some(get_devices),
        }
    }

    #[test]
    fn nonsense_device_lists_are_refused_and_always_released() {
        // SAFETY: the factory is valid for the call; cases are read one at a time.
        let read = |case| unsafe { read_devices(&factory(case)) };
        let ok = read(0).expect("a good list");
        assert_eq!((ok.len(), ok[0].kind, ok[0].name.as_str()), (1, "gpu", "a"));
        assert_eq!(read(1).unwrap_err(), "device 1: its id is listed twice");
        assert!(read(2).unwrap_err().contains("fewer than ABI 1.5's 104"));
        assert!(read(3).unwrap_err().contains("NULL"));
        assert_eq!(
            read(4).unwrap_err(),
            format!("lists {} devices", usize::MAX)
        );
        assert!(
            read(5)
                .unwrap_err()
                .contains("not a plausible, aligned array")
        );
        assert_eq!(read(6).unwrap_err(), "no driver");
        assert_eq!(
            RELEASED.load(std::sync::atomic::Ordering::Relaxed),
            7,
            "every list was released, good or not"
        );
    }
}
