//! The loaded ONNX Runtime: one per plugin library (each thin plugin links its own copy of `ort`,
//! whose loaded-library and environment are process-wide statics of that copy).

use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use epx_plugin_api::ElementType;
use epx_plugin_api::abi::EpxLogLevel;
use epx_plugin_api::sdk::{self, DeviceInfo, DeviceKind, Error};
use ort::environment::Environment;
use ort::logging::LogLevel;
use ort::sys::ONNXTensorElementDataType;

use crate::locate::{SearchEnv, locate};

/// The lowest ONNX Runtime minor version (1.x) this adapter can use: `ort`'s `api-23` feature
/// asks ORT for the version-23 C API table (the plugin-EP libraries' level; 22 was the first
/// with `GetEpDevices`), which ORT 1.23 and newer provide.
pub const MIN_ORT_MINOR: u32 = ort::MINOR_VERSION;

/// The ONNX Runtime element type of an ONNX element type; `None` for those ORT has no tensors of.
pub(crate) fn ort_type(t: ElementType) -> Option<ONNXTensorElementDataType> {
    use ONNXTensorElementDataType as O;
    Some(match t {
        ElementType::Float => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        ElementType::Uint8 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
        ElementType::Int8 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
        ElementType::Uint16 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16,
        ElementType::Int16 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16,
        ElementType::Int32 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
        ElementType::Int64 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
        ElementType::Bool => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL,
        ElementType::Float16 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
        ElementType::Double => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE,
        ElementType::Uint32 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32,
        ElementType::Uint64 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64,
        ElementType::Complex64 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64,
        ElementType::Complex128 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128,
        ElementType::Bfloat16 => O::ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16,
        _ => return None,
    })
}

/// A loaded ONNX Runtime library.
pub struct Runtime {
    pub path: PathBuf,
    pub version: String,
    /// `GetAvailableProviders`: the EPs this build of ORT was compiled with.
    pub providers: Vec<String>,
    pub env: Environment,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("providers", &self.providers)
            .finish_non_exhaustive()
    }
}

static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// The loaded runtime, loading it on first use. Failures are not cached: a later call (say, with
/// the `library` option) searches again. Once loaded, the library cannot change in this process.
pub fn runtime(library_option: Option<&Path>) -> sdk::Result<Arc<Runtime>> {
    if let Some(want) = library_option {
        if !want.is_file() {
            // An explicit path that is wrong is an error even when another copy is loaded.
            let env = SearchEnv::from_process(Some(want.to_path_buf()));
            if let Err(e) = locate(&env) {
                return Err(Error::unavailable(e.to_string()));
            }
        }
    }
    let mut slot = RUNTIME
        .lock()
        .map_err(|_| Error::runtime("ONNX Runtime loader lock poisoned"))?;
    if let Some(rt) = slot.as_ref() {
        if let Some(want) = library_option {
            if !same_file(want, &rt.path) {
                return Err(Error::invalid_argument(format!(
                    "option `library` = {}: this process already loaded ONNX Runtime from {}; \
                     one plugin library can use only one ONNX Runtime",
                    want.display(),
                    rt.path.display()
                )));
            }
        }
        return Ok(rt.clone());
    }
    let path = locate(&SearchEnv::from_process(
        library_option.map(Path::to_path_buf),
    ))
    .map_err(|e| Error::unavailable(e.to_string()))?;
    let rt = Arc::new(load(&path)?);
    sdk::log(
        EpxLogLevel::Info,
        &format!(
            "loaded ONNX Runtime {} from {} (providers: {})",
            rt.version,
            rt.path.display(),
            rt.providers.join(", ")
        ),
    );
    *slot = Some(rt.clone());
    Ok(rt)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Checks a version string against what the adapter needs; `Err` names both versions.
pub fn check_version(version: &str, path: &Path) -> Result<(), String> {
    let mut parts = version.trim().split('.');
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (major, minor) {
        (Some(1), Some(minor)) if minor >= MIN_ORT_MINOR => Ok(()),
        _ => Err(format!(
            "ONNX Runtime {version} at {} cannot be used: this adapter (ort {}, C API level {}) \
             needs ONNX Runtime 1.{MIN_ORT_MINOR} or newer 1.x",
            path.display(),
            ORT_CRATE_VERSION,
            MIN_ORT_MINOR
        )),
    }
}

/// The `ort` crate version this adapter is built on.
pub const ORT_CRATE_VERSION: &str = "2.0.0-rc.15";

/// Reads `OrtGetApiBase()->GetVersionString()` of the library at `path` without handing it to
/// `ort` (whose own check would only refuse, not explain).
pub fn library_version(path: &Path) -> sdk::Result<String> {
    // SAFETY: loading ONNX Runtime runs its initializers, which is what the user asked for by
    // pointing us at it; the symbol is ORT's documented entry point with this signature.
    unsafe {
        let lib = libloading::Library::new(path)
            .map_err(|e| Error::unavailable(format!("cannot load {}: {e}", path.display())))?;
        let base: libloading::Symbol<'_, unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
            lib.get(b"OrtGetApiBase\0").map_err(|_| {
                Error::unavailable(format!(
                    "{} does not export OrtGetApiBase: not an ONNX Runtime library",
                    path.display()
                ))
            })?;
        let base = base();
        if base.is_null() {
            return Err(Error::unavailable(format!(
                "{}: OrtGetApiBase returned NULL",
                path.display()
            )));
        }
        let v = ((*base).GetVersionString)();
        if v.is_null() {
            return Err(Error::unavailable(format!(
                "{}: GetVersionString returned NULL",
                path.display()
            )));
        }
        // The library stays loaded: `ort` opens it again right after, and ORT does not support
        // being unloaded and reloaded in one process.
        let version = CStr::from_ptr(v).to_string_lossy().into_owned();
        std::mem::forget(lib);
        Ok(version)
    }
}

fn load(path: &Path) -> sdk::Result<Runtime> {
    let version = library_version(path)?;
    check_version(&version, path).map_err(Error::unavailable)?;
    let builder = ort::init_from(path)
        .map_err(|e| Error::unavailable(format!("loading ONNX Runtime: {e}")))?;
    let logger: ort::logging::LoggerFunction =
        Arc::new(|level, category, _id, location, message| {
            sdk::log(
                crate::logs::level(level, location),
                &format!("onnxruntime [{category}] {location}: {message}"),
            );
        });
    let env = builder
        .with_name("epx")
        .with_logger(logger)
        .build()
        .map_err(|e| Error::runtime(format!("creating the ONNX Runtime environment: {e}")))?;
    env.set_log_level(LogLevel::Warning);
    let providers = available_providers()?;
    Ok(Runtime {
        path: path.to_path_buf(),
        version,
        providers,
        env,
    })
}

/// One device ONNX Runtime lists for one of its EPs.
pub struct OrtDevice {
    pub info: DeviceInfo,
    /// The EP options ONNX Runtime says select this device (`device_id`, `deviceId`, ...).
    pub options: Vec<(String, String)>,
}

/// The devices ONNX Runtime lists for its EP `ort_ep` (`GetEpDevices`, C API 22): kind,
/// vendor, and the name and driver version where its metadata says them. Their ids are their
/// order among that EP's devices; the options select each one. ONNX Runtime lists its built-in
/// EPs (CPU; DirectML and WebGPU in builds with them) and EP libraries registered with it, not the
/// EPs of its provider-bridge libraries (CUDA, TensorRT, OpenVINO, ...), which then list none.
pub fn ep_devices(rt: &Runtime, ort_ep: &str) -> sdk::Result<Vec<OrtDevice>> {
    use ort::AsPointer;
    use ort::sys::OrtHardwareDeviceType as T;
    let api = ort::api();
    let mut list: *const *const ort::sys::OrtEpDevice = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: a live environment; the list and the devices in it are ONNX Runtime's, valid until
    // an EP library is registered with the environment (the adapter registers none); everything
    // is copied out here.
    unsafe {
        check(
            (api.GetEpDevices)(rt.env.ptr(), &mut list, &mut n),
            "GetEpDevices",
        )?;
        if list.is_null() {
            return Ok(Vec::new());
        }
        let text = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let mut out = Vec::new();
        for i in 0..n.min(1024) {
            let d = *list.add(i);
            if d.is_null() || text((api.EpDevice_EpName)(d)) != ort_ep {
                continue;
            }
            let hw = (api.EpDevice_Device)(d);
            if hw.is_null() {
                continue;
            }
            // Read as the `int` it is in C: a kind newer than this build knows must not become an
            // invalid Rust enum value.
            let device_type: unsafe extern "system" fn(*const ort::sys::OrtHardwareDevice) -> i32 =
                std::mem::transmute(api.HardwareDevice_Type);
            let kind = match device_type(hw) {
                k if k == T::OrtHardwareDeviceType_CPU as i32 => DeviceKind::Cpu,
                k if k == T::OrtHardwareDeviceType_GPU as i32 => DeviceKind::Gpu,
                k if k == T::OrtHardwareDeviceType_NPU as i32 => DeviceKind::Npu,
                _ => DeviceKind::Other,
            };
            let pairs = |kv: *const ort::sys::OrtKeyValuePairs| {
                let mut out = Vec::new();
                if kv.is_null() {
                    return out;
                }
                let (mut keys, mut values, mut count) = (std::ptr::null(), std::ptr::null(), 0);
                (api.GetKeyValuePairs)(kv, &mut keys, &mut values, &mut count);
                if !keys.is_null() && !values.is_null() {
                    for j in 0..count.min(256) {
                        out.push((text(*keys.add(j)), text(*values.add(j))));
                    }
                }
                out
            };
            let mut meta = pairs((api.HardwareDevice_Metadata)(hw));
            meta.extend(pairs((api.EpDevice_EpMetadata)(d)));
            let options = pairs((api.EpDevice_EpOptions)(d));
            let get = |k: &str| {
                meta.iter()
                    .find(|(key, v)| key.eq_ignore_ascii_case(k) && !v.is_empty())
                    .map(|(_, v)| v.clone())
            };
            let vendor = text((api.HardwareDevice_Vendor)(hw));
            let name = get("Description").unwrap_or_else(|| {
                let what = match kind {
                    DeviceKind::Cpu => "CPU",
                    DeviceKind::Gpu => "GPU",
                    DeviceKind::Npu => "NPU",
                    DeviceKind::Other => "device",
                };
                let (v, id) = (
                    (api.HardwareDevice_VendorId)(hw),
                    (api.HardwareDevice_DeviceId)(hw),
                );
                if id == 0 {
                    format!("{vendor} {what}")
                } else {
                    format!("{vendor} {what} (PCI {v:04x}:{id:04x})")
                }
            });
            let info = DeviceInfo {
                kind,
                device_id: out.len() as u32,
                id_name: String::new(),
                vendor,
                name,
                memory_bytes: 0,
                driver_version: get("DriverVersion")
                    .unwrap_or_else(|| format!("ONNX Runtime {}", rt.version)),
                unusable: None,
            };
            out.push(OrtDevice { info, options });
        }
        Ok(out)
    }
}

/// ORT's status as a Result.
///
/// # Safety
/// `status` is NULL or a status ORT returned, not yet released.
pub unsafe fn check(status: ort::sys::OrtStatusPtr, what: &str) -> sdk::Result<()> {
    // SAFETY: the caller's contract; `result_from_status` releases the status.
    unsafe { ort::Error::result_from_status(status) }
        .map_err(|e| Error::runtime(format!("{what}: {e}")))
}

fn available_providers() -> sdk::Result<Vec<String>> {
    let api = ort::api();
    let mut list: *mut *mut c_char = std::ptr::null_mut();
    let mut n: c_int = 0;
    // SAFETY: C API call with valid out-pointers; the list is released below.
    unsafe {
        check(
            (api.GetAvailableProviders)(&mut list, &mut n),
            "GetAvailableProviders",
        )
    }?;
    let mut out = Vec::new();
    if !list.is_null() {
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: ORT returned `n` NUL-terminated strings.
            let s = unsafe { *list.add(i) };
            if !s.is_null() {
                // SAFETY: as above.
                out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
            }
        }
        // SAFETY: releasing the list ORT gave us, once.
        unsafe {
            check(
                (api.ReleaseAvailableProviders)(list, n),
                "ReleaseAvailableProviders",
            )
        }?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_checked() {
        let p = Path::new("/x/libonnxruntime.so");
        assert!(check_version("1.31.1", p).is_ok());
        assert!(check_version("1.23.0", p).is_ok());
        assert!(check_version("1.22.1", p).is_err());
        let e = check_version("1.17.3", p).unwrap_err();
        assert!(e.contains("1.17.3") && e.contains("1.23"), "{e}");
        assert!(check_version("2.0.0", p).is_err());
        assert!(check_version("garbage", p).is_err());
    }
}
