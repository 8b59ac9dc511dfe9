//! `libepx`: the C API of the epx host.
//!
//! Every function is `extern "C"`, checks its pointer arguments, and runs inside [`guard`], so a
//! panic anywhere below becomes an [`EpxError`] with code [`EpxErrorCode::Panic`] (or, for the few
//! functions that cannot return an error, a neutral value), never an unwind into C.
//!
//! Ownership: every object a `*_new` function or an out-parameter hands out has one matching
//! `*_free`, and every `*_free` accepts NULL. Strings and arrays reached through a descriptor
//! (`EpxProviderDesc`, `EpxValueDesc`, `EpxTensorRef`) belong to the object they were read from and
//! live as long as it does. Strings returned as `char **` are freed with [`epx_string_free`].
//!
//! The header `include/epx.h` is generated from this file by cbindgen (`tests/headers.rs`).

use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

use epx_host::{ElementType, Environment, ExecutionProvider, Session, Tensor};
use epx_plugin_api::dlpack::{DLDevice, DLDeviceType, DLTensor};

/// The version of libepx: the `epx` crates' version.
pub const EPX_VERSION_MAJOR: u32 = 0;
/// See [`EPX_VERSION_MAJOR`].
pub const EPX_VERSION_MINOR: u32 = 1;
/// See [`EPX_VERSION_MAJOR`].
pub const EPX_VERSION_PATCH: u32 = 0;

/// What kind of failure an [`EpxError`] reports. Values are fixed; new codes are only appended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpxErrorCode {
    /// A NULL or malformed argument, an unknown option, or a value that is not valid UTF-8.
    InvalidArgument = 1,
    /// A model file or buffer that is not a readable ONNX model, or not a valid graph.
    Model = 2,
    /// A file could not be read.
    Io = 3,
    /// A plugin library could not be loaded (missing dependency, wrong ABI, refused, ...).
    PluginLoad = 4,
    /// An EP is unknown, unavailable on this machine, or rejected its options.
    ProviderSetup = 5,
    /// An EP failed (or panicked) during a call.
    Provider = 6,
    /// No EP can run some node.
    Unsupported = 7,
    /// Inputs given to a run do not match the model.
    InvalidInput = 8,
    /// A run failed.
    Run = 9,
    /// A panic was caught at the C API boundary (a bug in epx; the message says where).
    Panic = 10,
    /// Anything else.
    Internal = 11,
}

/// A failure: a code and a message. NULL means success wherever an `EpxError *` is returned.
/// Free with [`epx_error_free`].
pub struct EpxError {
    code: EpxErrorCode,
    message: CString,
}

impl EpxError {
    fn new(code: EpxErrorCode, message: impl Into<String>) -> Box<Self> {
        let message = message.into().replace('\0', "\\0");
        Box::new(EpxError {
            code,
            message: CString::new(message).unwrap_or_default(),
        })
    }
}

type Res<T> = Result<T, Box<EpxError>>;

fn invalid(message: impl Into<String>) -> Box<EpxError> {
    EpxError::new(EpxErrorCode::InvalidArgument, message)
}

impl From<epx_host::Error> for Box<EpxError> {
    fn from(e: epx_host::Error) -> Self {
        use epx_host::Error as E;
        let code = match &e {
            E::Model { .. } | E::InvalidGraph { .. } => EpxErrorCode::Model,
            E::Io { .. } => EpxErrorCode::Io,
            E::PluginLoad { .. } | E::Manifest(_) => EpxErrorCode::PluginLoad,
            E::ProviderSetup { .. } => EpxErrorCode::ProviderSetup,
            E::Provider { .. } => EpxErrorCode::Provider,
            E::Unsupported(_) => EpxErrorCode::Unsupported,
            E::InvalidInput(_) => EpxErrorCode::InvalidInput,
            E::Run(_) => EpxErrorCode::Run,
            _ => EpxErrorCode::Internal,
        };
        EpxError::new(code, e.to_string())
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}

/// The panic boundary of every function returning `EpxError *`.
fn guard(call: &str, f: impl FnOnce() -> Res<()>) -> *mut EpxError {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => Box::into_raw(e),
        Err(payload) => Box::into_raw(EpxError::new(
            EpxErrorCode::Panic,
            format!("{call} panicked: {}", panic_text(&*payload)),
        )),
    }
}

/// The panic boundary of functions that return a plain value: `fallback` on a panic.
fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// `*out = value`, refusing a NULL `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, what: &str, value: T) -> Res<()> {
    if out.is_null() {
        return Err(invalid(format!("`{what}` is NULL")));
    }
    // SAFETY: the caller's contract; not NULL.
    unsafe { out.write(value) };
    Ok(())
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(invalid(format!("`{what}` is NULL")));
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("`{what}` is not valid UTF-8")))
}

/// A C array argument; NULL is allowed when `n` is 0.
///
/// # Safety
/// `p` points at `n` elements (or `n` is 0).
unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Res<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("`{what}` is NULL but its count is {n}")));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A C string for a descriptor, with NUL bytes escaped.
fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// Borrows an object argument.
///
/// # Safety
/// `p` is NULL or a live object of this type made by this library.
unsafe fn object<'a, T>(p: *const T, what: &str) -> Res<&'a T> {
    // SAFETY: the caller's contract.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(format!("`{what}` is NULL")))
}

// ---- errors and strings ----------------------------------------------------------------------

/// The library version as text, e.g. `"0.1.0"`; static, never freed.
#[unsafe(no_mangle)]
pub extern "C" fn epx_version() -> *const c_char {
    c"0.1.0".as_ptr()
}

/// The code of `error` ([`EpxErrorCode::Internal`] for NULL).
///
/// # Safety
/// `error` is NULL or an error from this library, not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_error_code(error: *const EpxError) -> EpxErrorCode {
    // SAFETY: the caller's contract.
    guard_value(EpxErrorCode::Internal, || {
        // SAFETY: the caller's contract.
        unsafe { error.as_ref() }.map_or(EpxErrorCode::Internal, |e| e.code)
    })
}

/// The message of `error`, valid until the error is freed ("" for NULL).
///
/// # Safety
/// `error` is NULL or an error from this library, not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_error_message(error: *const EpxError) -> *const c_char {
    // SAFETY: the caller's contract.
    guard_value(c"".as_ptr(), || {
        // SAFETY: the caller's contract.
        unsafe { error.as_ref() }.map_or(c"".as_ptr(), |e| e.message.as_ptr())
    })
}

/// Frees an error. NULL is a no-op.
///
/// # Safety
/// `error` is NULL or an error from this library, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_error_free(error: *mut EpxError) {
    if !error.is_null() {
        // SAFETY: the caller's contract: made by Box::into_raw here, freed once.
        guard_value((), || drop(unsafe { Box::from_raw(error) }));
    }
}

/// Frees a string this library returned through a `char **`. NULL is a no-op.
///
/// # Safety
/// `s` is NULL or such a string, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: the caller's contract: made by CString::into_raw here, freed once.
        guard_value((), || drop(unsafe { CString::from_raw(s) }));
    }
}

fn out_string(out: *mut *mut c_char, what: &str, s: &str) -> Res<()> {
    // SAFETY: `out` is the caller's out-parameter (checked for NULL by `put`).
    unsafe { put(out, what, c_string(s).into_raw()) }
}

// ---- EP lists ---------------------------------------------------------------------------------

/// An ordered list of EPs with their options, for sessions ([`epx_session_new`]) and as an
/// environment's default EPs ([`epx_env_new`]).
pub struct EpxSessionOptions {
    providers: Vec<ExecutionProvider>,
    strict: bool,
}

/// A new, empty option set: no EPs (the CPU EP always runs what is left), not strict.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_new() -> *mut EpxSessionOptions {
    guard_value(std::ptr::null_mut(), || {
        Box::into_raw(Box::new(EpxSessionOptions {
            providers: Vec::new(),
            strict: false,
        }))
    })
}

/// Frees an option set. NULL is a no-op.
///
/// # Safety
/// `options` is NULL or from [`epx_session_options_new`], freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_options_free(options: *mut EpxSessionOptions) {
    if !options.is_null() {
        // SAFETY: the caller's contract.
        guard_value((), || drop(unsafe { Box::from_raw(options) }));
    }
}

/// Appends EP `name` (`ep` or `plugin/ep`) with `n_options` options `keys[i] = values[i]`, after
/// the EPs added before it. With `error_on_failure`, a session fails when this EP cannot be set
/// up; without, the EP is skipped and the placement report says why. Unknown option keys are an
/// error when the session is made, naming the valid keys.
///
/// # Safety
/// `options` is a live option set; `name` a string; `keys` and `values` point at `n_options`
/// strings each (or are NULL when `n_options` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_options_add_provider(
    options: *mut EpxSessionOptions,
    name: *const c_char,
    keys: *const *const c_char,
    values: *const *const c_char,
    n_options: usize,
    error_on_failure: bool,
) -> *mut EpxError {
    guard("epx_session_options_add_provider", || {
        // SAFETY: the caller's contract for every pointer below.
        let options = unsafe { options.as_mut() }.ok_or_else(|| invalid("`options` is NULL"))?;
        // SAFETY: as above.
        let name = unsafe { text(name, "name") }?;
        if name.is_empty() {
            return Err(invalid("the EP name is empty"));
        }
        // SAFETY: as above.
        let keys = unsafe { slice(keys, n_options, "keys") }?;
        // SAFETY: as above.
        let values = unsafe { slice(values, n_options, "values") }?;
        let mut ep = ExecutionProvider::new(name);
        for (i, (&k, &v)) in keys.iter().zip(values).enumerate() {
            // SAFETY: as above.
            let k = unsafe { text(k, &format!("keys[{i}]")) }?;
            // SAFETY: as above.
            let v = unsafe { text(v, &format!("values[{i}]")) }?;
            ep = ep.with_option(k, v);
        }
        if error_on_failure {
            ep = ep.error_on_failure();
        }
        options.providers.push(ep);
        Ok(())
    })
}

/// Strict placement: making a session fails when any node would fall back to the CPU EP.
///
/// # Safety
/// `options` is a live option set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_options_set_strict(
    options: *mut EpxSessionOptions,
    strict: bool,
) -> *mut EpxError {
    guard("epx_session_options_set_strict", || {
        // SAFETY: the caller's contract.
        let options = unsafe { options.as_mut() }.ok_or_else(|| invalid("`options` is NULL"))?;
        options.strict = strict;
        Ok(())
    })
}

// ---- environments -----------------------------------------------------------------------------

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

struct ProviderRow {
    name: CString,
    plugin: CString,
    version: CString,
    library: Option<CString>,
    reason: Option<CString>,
}

/// The plugin directories, default EPs and loaded plugins every session starts from.
pub struct EpxEnv {
    env: Arc<Environment>,
    providers: Vec<ProviderRow>,
}

/// The folder holding this library (`<prefix>/lib` once installed), for the default plugin
/// folder `<that>/epx/plugins`.
fn own_dir() -> Option<PathBuf> {
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

fn provider_rows(env: &Environment) -> Vec<ProviderRow> {
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
/// is ignored. Plugins are loaded when first needed. Free with [`epx_env_free`].
///
/// # Safety
/// `plugin_dirs` points at `n_dirs` strings (or is NULL when `n_dirs` is 0);
/// `default_providers` is NULL or a live option set; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_new(
    plugin_dirs: *const *const c_char,
    n_dirs: usize,
    default_providers: *const EpxSessionOptions,
    out: *mut *mut EpxEnv,
) -> *mut EpxError {
    guard("epx_env_new", || {
        // SAFETY: the caller's contract for every pointer below.
        let dirs = unsafe { slice(plugin_dirs, n_dirs, "plugin_dirs") }?;
        let mut paths = Vec::with_capacity(dirs.len());
        for (i, &d) in dirs.iter().enumerate() {
            // SAFETY: as above.
            paths.push(PathBuf::from(unsafe {
                text(d, &format!("plugin_dirs[{i}]"))
            }?));
        }
        let mut builder = Environment::builder().with_plugin_dirs(paths);
        if let Some(dir) = own_dir() {
            builder = builder.with_default_plugin_dirs([dir.join("epx").join("plugins")]);
        }
        // SAFETY: as above.
        if let Some(defaults) = unsafe { default_providers.as_ref() } {
            builder = builder.with_execution_providers(defaults.providers.iter().cloned());
        }
        let env = builder.commit()?;
        let providers = provider_rows(&env);
        // SAFETY: as above.
        unsafe {
            put(
                out,
                "out",
                Box::into_raw(Box::new(EpxEnv { env, providers })),
            )
        }
    })
}

/// Frees an environment. Sessions made from it keep what they need and stay usable. NULL is a
/// no-op.
///
/// # Safety
/// `env` is NULL or from [`epx_env_new`], freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_free(env: *mut EpxEnv) {
    if !env.is_null() {
        // SAFETY: the caller's contract.
        guard_value((), || drop(unsafe { Box::from_raw(env) }));
    }
}

/// How many EPs [`epx_env_provider`] lists: those of every plugin found (loading each), then the
/// built-in ones. 0 for NULL.
///
/// # Safety
/// `env` is NULL or a live environment.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_provider_count(env: *const EpxEnv) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { env.as_ref() }.map_or(0, |e| e.providers.len())
    })
}

/// Describes EP `index` (see [`epx_env_provider_count`]), with its availability and the reason
/// when it is not available. Strings live as long as `env`.
///
/// # Safety
/// `env` is a live environment; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_provider(
    env: *const EpxEnv,
    index: usize,
    out: *mut EpxProviderDesc,
) -> *mut EpxError {
    guard("epx_env_provider", || {
        // SAFETY: the caller's contract.
        let env = unsafe { object(env, "env") }?;
        let row = env.providers.get(index).ok_or_else(|| {
            invalid(format!(
                "EP index {index} out of range (there are {})",
                env.providers.len()
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
        // SAFETY: as above.
        unsafe { put(out, "out", desc) }
    })
}

/// The doctor report (what `epx doctor` prints): every plugin folder searched, every plugin found
/// with its manifest, ABI and each library it depends on, found or not and where it was looked
/// for. `*all_ok` (may be NULL) says whether every plugin is usable. Free `*report` with
/// [`epx_string_free`].
///
/// # Safety
/// `env` is a live environment; `report` is writable; `all_ok` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_env_doctor(
    env: *const EpxEnv,
    all_ok: *mut bool,
    report: *mut *mut c_char,
) -> *mut EpxError {
    guard("epx_env_doctor", || {
        // SAFETY: the caller's contract.
        let env = unsafe { object(env, "env") }?;
        let (text, ok) = epx_host::doctor::report(&env.env);
        if !all_ok.is_null() {
            // SAFETY: as above; not NULL.
            unsafe { all_ok.write(ok) };
        }
        out_string(report, "report", &text)
    })
}

// ---- sessions ---------------------------------------------------------------------------------

/// A model input or output as [`epx_session_input`] / [`epx_session_output`] describe it. Strings
/// and arrays belong to the session.
#[repr(C)]
pub struct EpxValueDesc {
    pub name: *const c_char,
    /// An `EpxElementType` value (epx_plugin.h); 0 (`EPX_ELEMENT_TYPE_UNDEFINED`) when unknown.
    pub elem_type: i32,
    /// The rank; -1 when the model does not give it.
    pub ndim: i64,
    /// `ndim` extents, -1 for a dynamic one; NULL when `ndim` is -1 or 0.
    pub shape: *const i64,
}

struct ValueRow {
    name: CString,
    elem_type: i32,
    shape: Option<Vec<i64>>,
}

impl ValueRow {
    fn of(spec: &epx_host::ValueSpec) -> Self {
        ValueRow {
            name: c_string(&spec.name),
            elem_type: spec.elem_type.map_or(0, |t| t as i32),
            shape: spec.shape.as_ref().map(|s| {
                s.iter()
                    .map(|d| d.and_then(|d| i64::try_from(d).ok()).unwrap_or(-1))
                    .collect()
            }),
        }
    }

    fn desc(&self) -> EpxValueDesc {
        EpxValueDesc {
            name: self.name.as_ptr(),
            elem_type: self.elem_type,
            ndim: self.shape.as_ref().map_or(-1, |s| s.len() as i64),
            shape: match &self.shape {
                Some(s) if !s.is_empty() => s.as_ptr(),
                _ => std::ptr::null(),
            },
        }
    }
}

/// A model partitioned across EPs and compiled, ready to run (from several threads at once).
pub struct EpxSession {
    session: Session,
    inputs: Vec<ValueRow>,
    outputs: Vec<ValueRow>,
}

fn make_session(
    env: *const EpxEnv,
    options: *const EpxSessionOptions,
    out: *mut *mut EpxSession,
    commit: impl FnOnce(epx_host::SessionBuilder) -> epx_host::Result<Session>,
) -> Res<()> {
    // SAFETY: the caller's contract (the public functions below pass theirs on).
    let env = unsafe { object(env, "env") }?;
    let mut builder = Session::builder()?.with_environment(env.env.clone());
    // SAFETY: as above.
    if let Some(o) = unsafe { options.as_ref() } {
        builder = builder
            .with_execution_providers(o.providers.iter().cloned())?
            .with_strict_placement(o.strict);
    }
    let session = commit(builder)?;
    let inputs = session.inputs().iter().map(ValueRow::of).collect();
    let outputs = session.outputs().iter().map(ValueRow::of).collect();
    let s = Box::new(EpxSession {
        session,
        inputs,
        outputs,
    });
    // SAFETY: as above.
    unsafe { put(out, "out", Box::into_raw(s)) }
}

/// Loads the ONNX model at `model_path`, asks the EPs of `options` (may be NULL: the CPU EP
/// alone), then the environment's default EPs, for the nodes they can run, in that order, and
/// compiles the result. Free with [`epx_session_free`].
///
/// # Safety
/// `env` is a live environment; `model_path` a string; `options` NULL or a live option set;
/// `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_new(
    env: *const EpxEnv,
    model_path: *const c_char,
    options: *const EpxSessionOptions,
    out: *mut *mut EpxSession,
) -> *mut EpxError {
    guard("epx_session_new", || {
        // SAFETY: the caller's contract.
        let path = PathBuf::from(unsafe { text(model_path, "model_path") }?);
        make_session(env, options, out, |b| b.commit_from_file(&path))
    })
}

/// As [`epx_session_new`], with the model's bytes in memory (copied; the buffer may be freed
/// when this returns).
///
/// # Safety
/// `data` points at `len` bytes; the other arguments as for [`epx_session_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_new_from_bytes(
    env: *const EpxEnv,
    data: *const c_void,
    len: usize,
    options: *const EpxSessionOptions,
    out: *mut *mut EpxSession,
) -> *mut EpxError {
    guard("epx_session_new_from_bytes", || {
        // SAFETY: the caller's contract.
        let bytes = unsafe { slice(data.cast::<u8>(), len, "data") }?;
        make_session(env, options, out, |b| b.commit_from_memory(bytes))
    })
}

/// Frees a session. NULL is a no-op.
///
/// # Safety
/// `session` is NULL or from this library, freed only once, and not running.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_free(session: *mut EpxSession) {
    if !session.is_null() {
        // SAFETY: the caller's contract.
        guard_value((), || drop(unsafe { Box::from_raw(session) }));
    }
}

/// The number of model inputs (0 for NULL).
///
/// # Safety
/// `session` is NULL or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_input_count(session: *const EpxSession) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { session.as_ref() }.map_or(0, |s| s.inputs.len())
    })
}

/// The number of model outputs (0 for NULL).
///
/// # Safety
/// `session` is NULL or a live session.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_output_count(session: *const EpxSession) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { session.as_ref() }.map_or(0, |s| s.outputs.len())
    })
}

fn describe(rows: &[ValueRow], index: usize, kind: &str, out: *mut EpxValueDesc) -> Res<()> {
    let row = rows.get(index).ok_or_else(|| {
        invalid(format!(
            "{kind} index {index} out of range (the model has {})",
            rows.len()
        ))
    })?;
    // SAFETY: `out` is the caller's out-parameter.
    unsafe { put(out, "out", row.desc()) }
}

/// Describes model input `index`: name, element type and shape.
///
/// # Safety
/// `session` is a live session; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_input(
    session: *const EpxSession,
    index: usize,
    out: *mut EpxValueDesc,
) -> *mut EpxError {
    guard("epx_session_input", || {
        // SAFETY: the caller's contract.
        let s = unsafe { object(session, "session") }?;
        describe(&s.inputs, index, "input", out)
    })
}

/// Describes model output `index`: name, element type and shape.
///
/// # Safety
/// `session` is a live session; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_output(
    session: *const EpxSession,
    index: usize,
    out: *mut EpxValueDesc,
) -> *mut EpxError {
    guard("epx_session_output", || {
        // SAFETY: the caller's contract.
        let s = unsafe { object(session, "session") }?;
        describe(&s.outputs, index, "output", out)
    })
}

/// The placement report as JSON: `nodes` (id, name, op_type, provider, group), `groups` (id,
/// provider, nodes, kernel, inputs, outputs), `copies` (value, from, to, before_group, bytes,
/// last_run_bytes), `fallbacks` (node, name, op_type, reason) and `skipped_providers` (name,
/// reason). Free `*json` with [`epx_string_free`].
///
/// # Safety
/// `session` is a live session; `json` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_placement_json(
    session: *const EpxSession,
    json: *mut *mut c_char,
) -> *mut EpxError {
    guard("epx_session_placement_json", || {
        // SAFETY: the caller's contract.
        let s = unsafe { object(session, "session") }?;
        let text = serde_json::to_string(&s.session.placement())
            .map_err(|e| EpxError::new(EpxErrorCode::Internal, format!("placement JSON: {e}")))?;
        out_string(json, "json", &text)
    })
}

// ---- running ----------------------------------------------------------------------------------

/// A tensor in host memory as a plain pointer, shape and element type: an input to
/// [`epx_session_run`], or an output read with [`epx_outputs_get`].
#[repr(C)]
pub struct EpxTensorRef {
    /// The model input or output name.
    pub name: *const c_char,
    /// An `EpxElementType` value (epx_plugin.h).
    pub elem_type: i32,
    /// `ndim` extents (NULL when `ndim` is 0).
    pub shape: *const i64,
    pub ndim: usize,
    /// The elements, densely packed in row-major order (NULL only when `byte_len` is 0).
    pub data: *const c_void,
    /// Bytes at `data`: the element count times the element size.
    pub byte_len: usize,
}

struct OutputRow {
    name: CString,
    tensor: Tensor,
    shape: Vec<i64>,
    dl: DLTensor,
}

/// The outputs of one run, in host memory, in the model's output order. Free with
/// [`epx_outputs_free`].
pub struct EpxOutputs {
    rows: Vec<OutputRow>,
}

// SAFETY: the raw pointers in each `DLTensor` point into the same row's tensor and shape, which
// the row owns and never mutates after construction.
unsafe impl Send for EpxOutputs {}

fn shape_of(dims: &[i64], what: &str) -> Res<Vec<usize>> {
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| invalid(format!("{what}: negative extent {d}"))))
        .collect()
}

fn element_type(code: i32, what: &str) -> Res<ElementType> {
    ElementType::from_onnx(code)
        .filter(|t| *t != ElementType::Undefined)
        .ok_or_else(|| invalid(format!("{what}: {code} is not an EpxElementType")))
}

fn run_session(
    session: *const EpxSession,
    inputs: Vec<(String, Tensor)>,
    out: *mut *mut EpxOutputs,
) -> Res<()> {
    if out.is_null() {
        return Err(invalid("`out` is NULL"));
    }
    // SAFETY: the caller's contract (the public functions below pass theirs on).
    let s = unsafe { object(session, "session") }?;
    let outputs = s.session.run(inputs)?;
    let mut rows = Vec::with_capacity(outputs.len());
    for (name, value) in outputs {
        let tensor = value.into_host()?;
        if tensor.bytes().is_none() {
            return Err(EpxError::new(
                EpxErrorCode::Run,
                format!("output `{name}` is a string tensor, which the C API cannot return"),
            ));
        }
        let shape: Vec<i64> = tensor.shape().iter().map(|&d| d as i64).collect();
        let dtype = tensor.elem_type().to_dlpack().ok_or_else(|| {
            EpxError::new(
                EpxErrorCode::Run,
                format!(
                    "output `{name}` has type {}, which has no DLPack form",
                    tensor.elem_type()
                ),
            )
        })?;
        rows.push(OutputRow {
            name: c_string(&name),
            tensor,
            shape,
            dl: DLTensor {
                data: std::ptr::null_mut(),
                device: DLDevice {
                    device_type: DLDeviceType::Cpu as i32,
                    device_id: 0,
                },
                ndim: 0,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        });
    }
    let mut boxed = Box::new(EpxOutputs { rows });
    // The rows no longer move: point each DLTensor at its own data and shape.
    for row in &mut boxed.rows {
        row.dl.ndim = row.shape.len() as i32;
        row.dl.shape = row.shape.as_mut_ptr();
        row.dl.data = row
            .tensor
            .bytes()
            .map_or(std::ptr::null_mut(), |b| b.as_ptr().cast_mut().cast());
    }
    // SAFETY: `out` is not NULL (checked above) and is the caller's out-parameter.
    unsafe { put(out, "out", Box::into_raw(boxed)) }
}

/// Runs the model on `n_inputs` inputs given as plain buffers ([`EpxTensorRef`]; the data is
/// copied). `*out` receives every model output in host memory. Sessions may run from several
/// threads at once.
///
/// # Safety
/// `session` is a live session; `inputs` points at `n_inputs` tensor refs whose pointers are
/// valid as described there; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_run(
    session: *const EpxSession,
    inputs: *const EpxTensorRef,
    n_inputs: usize,
    out: *mut *mut EpxOutputs,
) -> *mut EpxError {
    guard("epx_session_run", || {
        // SAFETY: the caller's contract for every pointer below.
        let refs = unsafe { slice(inputs, n_inputs, "inputs") }?;
        let mut tensors = Vec::with_capacity(refs.len());
        for (i, r) in refs.iter().enumerate() {
            // SAFETY: as above.
            let name = unsafe { text(r.name, &format!("inputs[{i}].name")) }?;
            let what = format!("input `{name}`");
            let elem = element_type(r.elem_type, &what)?;
            // SAFETY: as above.
            let dims = unsafe { slice(r.shape, r.ndim, &format!("{what} shape")) }?;
            let shape = shape_of(dims, &what)?;
            // SAFETY: as above.
            let data = unsafe { slice(r.data.cast::<u8>(), r.byte_len, &format!("{what} data")) }?;
            tensors.push((name.to_string(), Tensor::from_bytes(elem, &shape, data)?));
        }
        run_session(session, tensors, out)
    })
}

/// Runs the model on `n_inputs` DLPack tensors named `input_names[i]`. Each must be in host
/// memory (`kDLCPU`), compact and row-major (`strides` NULL or equal to the compact strides); the
/// data is copied. Read the outputs with [`epx_outputs_dltensor`] or [`epx_outputs_get`].
///
/// # Safety
/// `session` is a live session; `input_names` and `inputs` point at `n_inputs` strings and
/// DLTensor pointers, each tensor valid per DLPack; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_run_dlpack(
    session: *const EpxSession,
    input_names: *const *const c_char,
    inputs: *const *const DLTensor,
    n_inputs: usize,
    out: *mut *mut EpxOutputs,
) -> *mut EpxError {
    guard("epx_session_run_dlpack", || {
        // SAFETY: the caller's contract for every pointer below.
        let names = unsafe { slice(input_names, n_inputs, "input_names") }?;
        // SAFETY: as above.
        let dls = unsafe { slice(inputs, n_inputs, "inputs") }?;
        let mut tensors = Vec::with_capacity(n_inputs);
        for (i, (&n, &t)) in names.iter().zip(dls).enumerate() {
            // SAFETY: as above.
            let name = unsafe { text(n, &format!("input_names[{i}]")) }?;
            // SAFETY: as above.
            let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(format!("inputs[{i}] is NULL")))?;
            tensors.push((name.to_string(), tensor_from_dl(t, name)?));
        }
        run_session(session, tensors, out)
    })
}

fn tensor_from_dl(t: &DLTensor, name: &str) -> Res<Tensor> {
    let what = format!("input `{name}`");
    if t.device.device_type != DLDeviceType::Cpu as i32 {
        return Err(invalid(format!(
            "{what} is in DLPack device type {}, not host memory (kDLCPU = 1)",
            t.device.device_type
        )));
    }
    let elem = ElementType::from_dlpack(t.dtype).ok_or_else(|| {
        invalid(format!(
            "{what}: DLPack dtype {:?} is not supported",
            t.dtype
        ))
    })?;
    let ndim = usize::try_from(t.ndim).map_err(|_| invalid(format!("{what}: negative ndim")))?;
    // SAFETY: DLPack contract: `shape` holds `ndim` extents.
    let dims = unsafe { slice(t.shape.cast_const(), ndim, &format!("{what} shape")) }?;
    let shape = shape_of(dims, &what)?;
    if !t.strides.is_null() {
        // SAFETY: DLPack contract: `strides` holds `ndim` entries when not NULL.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expect = 1i64;
        for (&s, &d) in strides.iter().zip(dims).rev() {
            if d > 1 && s != expect {
                return Err(invalid(format!(
                    "{what} has strides {strides:?}; only compact row-major tensors are accepted"
                )));
            }
            expect = expect.saturating_mul(d);
        }
    }
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let bytes = count
        .and_then(|c| elem.storage_bytes(c))
        .ok_or_else(|| invalid(format!("{what}: shape {shape:?} is too large")))?;
    let offset = usize::try_from(t.byte_offset)
        .map_err(|_| invalid(format!("{what}: byte_offset too large")))?;
    let data = if bytes == 0 {
        &[][..]
    } else if t.data.is_null() {
        return Err(invalid(format!("{what}: data is NULL")));
    } else {
        // SAFETY: DLPack contract: data + byte_offset holds the tensor's `bytes` bytes.
        unsafe { std::slice::from_raw_parts(t.data.cast::<u8>().add(offset), bytes) }
    };
    Ok(Tensor::from_bytes(elem, &shape, data)?)
}

/// The number of outputs (0 for NULL).
///
/// # Safety
/// `outputs` is NULL or live outputs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_count(outputs: *const EpxOutputs) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { outputs.as_ref() }.map_or(0, |o| o.rows.len())
    })
}

fn output_row<'a>(outputs: *const EpxOutputs, index: usize) -> Res<&'a OutputRow> {
    // SAFETY: the caller's contract (the public functions below pass theirs on).
    let o = unsafe { object(outputs, "outputs") }?;
    o.rows.get(index).ok_or_else(|| {
        invalid(format!(
            "output index {index} out of range (there are {})",
            o.rows.len()
        ))
    })
}

/// Output `index` as name, element type, shape and data (valid until `outputs` is freed).
///
/// # Safety
/// `outputs` is live outputs; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_get(
    outputs: *const EpxOutputs,
    index: usize,
    out: *mut EpxTensorRef,
) -> *mut EpxError {
    guard("epx_outputs_get", || {
        let row = output_row(outputs, index)?;
        let bytes = row.tensor.bytes().unwrap_or(&[]);
        let r = EpxTensorRef {
            name: row.name.as_ptr(),
            elem_type: row.tensor.elem_type() as i32,
            shape: if row.shape.is_empty() {
                std::ptr::null()
            } else {
                row.shape.as_ptr()
            },
            ndim: row.shape.len(),
            data: bytes.as_ptr().cast(),
            byte_len: bytes.len(),
        };
        // SAFETY: the caller's contract.
        unsafe { put(out, "out", r) }
    })
}

/// Output `index` as a DLPack tensor in host memory (valid until `outputs` is freed; do not
/// modify it). `*name` (may be NULL) receives the output's name.
///
/// # Safety
/// `outputs` is live outputs; `tensor` writable; `name` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_dltensor(
    outputs: *const EpxOutputs,
    index: usize,
    name: *mut *const c_char,
    tensor: *mut *const DLTensor,
) -> *mut EpxError {
    guard("epx_outputs_dltensor", || {
        let row = output_row(outputs, index)?;
        if !name.is_null() {
            // SAFETY: the caller's contract; not NULL.
            unsafe { name.write(row.name.as_ptr()) };
        }
        // SAFETY: the caller's contract.
        unsafe { put(tensor, "tensor", &row.dl as *const DLTensor) }
    })
}

/// Frees the outputs of a run. NULL is a no-op.
///
/// # Safety
/// `outputs` is NULL or from a run, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_free(outputs: *mut EpxOutputs) {
    if !outputs.is_null() {
        // SAFETY: the caller's contract.
        guard_value((), || drop(unsafe { Box::from_raw(outputs) }));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_constants_match_the_crate() {
        // SAFETY: a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(super::epx_version()) };
        assert_eq!(text.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
        assert_eq!(
            super::EPX_VERSION_MAJOR.to_string(),
            env!("CARGO_PKG_VERSION_MAJOR")
        );
        assert_eq!(
            super::EPX_VERSION_MINOR.to_string(),
            env!("CARGO_PKG_VERSION_MINOR")
        );
        assert_eq!(
            super::EPX_VERSION_PATCH.to_string(),
            env!("CARGO_PKG_VERSION_PATCH")
        );
    }
}
