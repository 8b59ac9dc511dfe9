//! `EpxEnv`: plugin folders, default EPs, the EP listing and the doctor report.

use super::*;
use crate::handle::Handles;

/// One EP as [`epx_env_provider`] describes it. Strings belong to the environment.
#[repr(C)]
pub struct EpxProviderDesc {
    /// The EP name, as sessions ask for it.
    pub name: *const c_char,
    /// The plugin that provides it (`builtin` for the CPU EP linked into libepx).
    pub plugin: *const c_char,
    /// The EP's version ("" when its plugin failed to load).
    pub version: *const c_char,
    /// The plugin library's path; NULL for the built-in EPs.
    pub library: *const c_char,
    /// Whether the EP can run on this machine.
    pub available: bool,
    /// Why it cannot (or why its plugin failed to load); NULL when available.
    pub reason: *const c_char,
}

pub(crate) struct ProviderRow {
    pub(crate) name: CString,
    pub(crate) plugin: CString,
    pub(crate) version: CString,
    pub(crate) library: Option<CString>,
    pub(crate) reason: Option<CString>,
}

/// The plugin directories, default EPs and loaded plugins every session starts from. A handle,
/// not an address: freeing it while another thread uses it is safe, and a call made with it
/// after [`epx_env_free`] is an error.
pub struct EpxEnv {
    _opaque: [u8; 0],
}

/// What an environment handle holds.
pub(crate) struct EnvData {
    pub(crate) env: Arc<Environment>,
    /// The EP list, made at the first call that reads it (it loads every plugin).
    providers: std::sync::OnceLock<Vec<ProviderRow>>,
}

/// The live environments.
pub(crate) static ENVS: Handles<EnvData, EpxEnv> = Handles::new(1, "environment", "epx_env_free");

impl EnvData {
    /// The EP list; listing loads every plugin, each opened first in a child process (the
    /// environment's load probe, [`epx_env_new`]), all at once.
    fn providers(&self) -> &[ProviderRow] {
        self.providers.get_or_init(|| provider_rows(&self.env))
    }
}

/// The folder holding this library (`<prefix>/lib` once installed), for the default plugin
/// folder `<that>/epx/plugins`.
pub(crate) fn own_dir() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain old data (pointers and integers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address of a function of this library and fills `info`.
    let found = unsafe { libc::dladdr(epx_version as *const c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a NUL-terminated path that lives as long as the library.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(std::ffi::OsStr::new(&*path.to_string_lossy()));
    path.canonicalize().ok()?.parent().map(PathBuf::from)
}

pub(crate) fn provider_rows(env: &Environment) -> Vec<ProviderRow> {
    let mut rows = Vec::new();
    let mut push = |name: &str,
                    plugin: &str,
                    version: &str,
                    library: Option<String>,
                    reason: Option<String>| {
        rows.push(ProviderRow {
            name: c_string(name),
            plugin: c_string(plugin),
            version: c_string(version),
            library: library.map(|l| c_string(&l)),
            reason: reason.map(|r| c_string(&r)),
        })
    };
    for (candidate, lib) in env.load_all() {
        match lib {
            Ok(lib) => {
                for p in &lib.providers {
                    push(
                        &p.name,
                        &lib.name,
                        &p.version,
                        lib.path.as_ref().map(|p| p.display().to_string()),
                        p.availability.clone().err(),
                    );
                }
            }
            Err(e) => {
                let eps = candidate
                    .manifest
                    .as_ref()
                    .map_or_else(|| vec![candidate.name.clone()], |m| m.providers.clone());
                for ep in eps {
                    push(
                        &ep,
                        &candidate.name,
                        "",
                        Some(candidate.library.display().to_string()),
                        Some(e.to_string()),
                    );
                }
            }
        }
    }
    for lib in env.linked().iter().chain(std::iter::once(env.builtin())) {
        for p in &lib.providers {
            push(
                &p.name,
                &lib.name,
                &p.version,
                None,
                p.availability.clone().err(),
            );
        }
    }
    rows
}

/// Makes an environment: plugins are searched in `plugin_dirs` (absolute, or relative to the
/// current folder), then in each absolute folder of `EPX_PLUGIN_PATH`, then in the default
/// folder next to libepx (`<prefix>/lib/epx/plugins` when installed) and next to the program.
/// `default_providers` (may be NULL) lists EPs every session tries after its own; its strict flag
/// is ignored. Plugins are loaded when first needed, each opened first in a child process (the
/// `epx` executable beside libepx, when there is one). No Python package is imported unless
/// `EPX_PYTHON_EPS` asks for the search (`1`: every Python environment epx sees, `own`: the one
/// libepx is installed in). Free with [`epx_env_free`].
///
/// # Safety
/// `plugin_dirs` points at `n_dirs` strings (or is NULL when `n_dirs` is 0);
/// `default_providers` is NULL or a live option set; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_new(
    plugin_dirs: *const *const c_char,
    n_dirs: usize,
    default_providers: *const EpxSessionOptions,
    out: Option<&mut MaybeUninit<*mut EpxEnv>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: `plugin_dirs` is NULL or points at `n_dirs` elements, per this function's
        // contract.
        let dirs = unsafe { slice(plugin_dirs, n_dirs, "plugin_dirs") }?;
        let mut paths = Vec::with_capacity(dirs.len());
        for (i, &d) in dirs.iter().enumerate() {
            // SAFETY: `d` is NULL or a NUL-terminated string, per this function's contract.
            paths.push(PathBuf::from(unsafe {
                text(d, &format!("plugin_dirs[{i}]"))
            }?));
        }
        let mut builder = Environment::builder().with_plugin_dirs(paths);
        if let Some(dir) = own_dir() {
            builder = builder.with_default_plugin_dirs([dir.join("epx").join("plugins")]);
            // Isolated EPs run in the epx executable shipped beside libepx, and every plugin
            // library is opened there first, so one that would crash the loader or its entry
            // is refused instead of ending the program.
            if let Some(exe) = epx_host::plugin::probe::find_epx(&dir) {
                builder = builder
                    .with_epx_executable(exe.clone())
                    .with_load_probe(epx_host::plugin::probe::child_process(exe));
            }
        }
        if !default_providers.is_null() {
            let defaults = OPTIONS.get(default_providers, "default_providers")?;
            let defaults = defaults.lock().unwrap_or_else(|p| p.into_inner());
            builder = builder.with_execution_providers(defaults.providers.iter().cloned());
        }
        let env = builder.commit()?;
        let Some(out) = out else {
            return Err(invalid("`out` is NULL"));
        };
        out.write(ENVS.insert(EnvData {
            env,
            providers: std::sync::OnceLock::new(),
        }));
        Ok(())
    })
}

/// Frees an environment. Sessions made from it keep what they need and stay usable; a call
/// in flight on it finishes. NULL, or an environment freed already, is a no-op.
///
/// Pointers: `env` is NULL or from [`epx_env_new`].
#[unsafe(no_mangle)]
pub extern "C" fn epx_env_free(env: *mut EpxEnv) {
    ffi_boundary!(drop(ENVS.remove(env)))
}

/// How many EPs [`epx_env_provider`] lists: those of every plugin found (loading each, after
/// opening it in a child process when an `epx` executable is beside libepx, `../bin/epx` or
/// `EPX_PROBE_EXE`, so that a library that crashes the loader is listed as broken), then the
/// built-in ones. 0 for NULL.
///
/// Pointers: `env` is NULL or a live environment.
#[unsafe(no_mangle)]
pub extern "C" fn epx_env_provider_count(env: *const EpxEnv) -> usize {
    ffi_boundary!(ENVS.get(env, "env").map_or(0, |e| e.providers().len()))
}

/// Describes EP `index` (see [`epx_env_provider_count`]), with its availability and the reason
/// when it is not available. Strings live until `env` is freed.
///
/// Pointers: `env` is a live environment; `out` is writable.
#[unsafe(no_mangle)]
pub extern "C" fn epx_env_provider(
    env: *const EpxEnv,
    index: usize,
    out: Option<&mut MaybeUninit<EpxProviderDesc>>,
) -> *mut EpxError {
    ffi_boundary!({
        let env = ENVS.get(env, "env")?;
        let rows = env.providers();
        let row = rows.get(index).ok_or_else(|| {
            invalid(format!(
                "EP index {index} out of range (there are {})",
                rows.len()
            ))
        })?;
        let desc = EpxProviderDesc {
            name: row.name.as_ptr(),
            plugin: row.plugin.as_ptr(),
            version: row.version.as_ptr(),
            library: row
                .library
                .as_ref()
                .map_or(std::ptr::null(), |l| l.as_ptr()),
            available: row.reason.is_none(),
            reason: row.reason.as_ref().map_or(std::ptr::null(), |r| r.as_ptr()),
        };
        put(out, "out", desc)
    })
}

/// The doctor report (what `epx doctor` prints): every plugin folder searched, every plugin found
/// with its manifest, ABI and each library it depends on, found or not and where it was looked
/// for. `*all_ok` (may be NULL) says whether every plugin is usable. Plugins are opened in a
/// child process first, as for [`epx_env_provider_count`]. Free `*report` with
/// [`epx_string_free`].
///
/// # Safety
/// `env` is a live environment; `report` is writable; `all_ok` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_doctor(
    env: *const EpxEnv,
    all_ok: Option<&mut MaybeUninit<bool>>,
    report: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let env = ENVS.get(env, "env")?;
        let (text, ok) = epx_host::doctor::report(&env.env);
        if let Some(all_ok) = all_ok {
            all_ok.write(ok);
        }
        out_string(report, "report", &text)
    })
}
/// Every device the environment's EPs can run on (ABI 1.5), as JSON: an array of `selector`
/// (how a session names the EP on that device: `cuda:1`, `openvino:GPU.0`), `provider`,
/// `plugin`, and `device` (`kind`: cpu, gpu, npu or other; `id`; `id_name`; `vendor`; `name`;
/// `memory_bytes`, null when unknown; `driver_version`; `unusable`, null or why the EP cannot
/// use it). Plugins are opened in a child process first, as for [`epx_env_provider_count`].
/// Free `*json` with [`epx_string_free`].
///
/// # Safety
/// `env` is a live environment; `json` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_devices_json(
    env: *const EpxEnv,
    json: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let env = ENVS.get(env, "env")?;
        let text = serde_json::to_string(&env.env.devices())
            .map_err(|e| EpxError::new(EpxErrorCode::Internal, format!("devices JSON: {e}")))?;
        out_string(json, "json", &text)
    })
}

impl PanicPointee for EpxEnv {}
