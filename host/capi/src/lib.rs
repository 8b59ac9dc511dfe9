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

use epx_host::{
    ElementType, Environment, ExecutionProvider, Map, Sequence, Session, Tensor, Value,
};
use epx_plugin_api::abi::EpxValueKind;
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
            E::PluginLoad { .. } => EpxErrorCode::PluginLoad,
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

/// The crate version, NUL-terminated, checked at compile time.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version holds a NUL byte"),
    };

/// The library version as text, e.g. `"0.1.0"`; static, never freed.
#[unsafe(no_mangle)]
pub extern "C" fn epx_version() -> *const c_char {
    VERSION.as_ptr()
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
    value: EpxHostValue,
    shape: Vec<i64>,
    /// For numeric tensor outputs, a DLTensor over the value's data.
    dl: Option<DLTensor>,
}

impl OutputRow {
    fn tensor(&self) -> Res<&Tensor> {
        match &self.value.node {
            HostNode::Tensor(t) if t.bytes().is_some() => Ok(t),
            _ => Err(invalid(format!(
                "output `{}` is not a numeric tensor: read it with epx_outputs_value",
                self.name.to_string_lossy()
            ))),
        }
    }
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
    inputs: Vec<(String, Value)>,
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
        let value = EpxHostValue::of(value)?;
        let (shape, dl) = match &value.node {
            HostNode::Tensor(t) if t.bytes().is_some() => {
                let dtype = t.elem_type().to_dlpack().ok_or_else(|| {
                    EpxError::new(
                        EpxErrorCode::Run,
                        format!(
                            "output `{name}` has type {}, which has no DLPack form",
                            t.elem_type()
                        ),
                    )
                })?;
                let dl = DLTensor {
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
                };
                (t.shape().iter().map(|&d| d as i64).collect(), Some(dl))
            }
            _ => (Vec::new(), None),
        };
        rows.push(OutputRow {
            name: c_string(&name),
            value,
            shape,
            dl,
        });
    }
    let mut boxed = Box::new(EpxOutputs { rows });
    // The rows no longer move: point each DLTensor at its own data and shape.
    for row in &mut boxed.rows {
        let data = match &row.value.node {
            HostNode::Tensor(t) => t
                .bytes()
                .map_or(std::ptr::null_mut(), |b| b.as_ptr().cast_mut().cast()),
            _ => std::ptr::null_mut(),
        };
        if let Some(dl) = row.dl.as_mut() {
            dl.ndim = row.shape.len() as i32;
            dl.shape = row.shape.as_mut_ptr();
            dl.data = data;
        }
    }
    // SAFETY: `out` is not NULL (checked above) and is the caller's out-parameter.
    unsafe { put(out, "out", Box::into_raw(boxed)) }
}

/// A tensor from an [`EpxTensorRef`] (data copied).
///
/// # Safety
/// The pointers in `r` are valid as [`EpxTensorRef`] describes.
unsafe fn tensor_from_ref(r: &EpxTensorRef, what: &str) -> Res<Tensor> {
    let elem = element_type(r.elem_type, what)?;
    if elem == ElementType::String {
        return Err(invalid(format!(
            "{what}: string tensors are made with epx_value_new_strings"
        )));
    }
    // SAFETY: the caller's contract.
    let dims = unsafe { slice(r.shape, r.ndim, &format!("{what} shape")) }?;
    let shape = shape_of(dims, what)?;
    // SAFETY: as above.
    let data = unsafe { slice(r.data.cast::<u8>(), r.byte_len, &format!("{what} data")) }?;
    Ok(Tensor::from_bytes(elem, &shape, data)?)
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
            // SAFETY: as above.
            let t = unsafe { tensor_from_ref(r, &format!("input `{name}`")) }?;
            tensors.push((name.to_string(), Value::Host(t)));
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
            tensors.push((name.to_string(), Value::Host(tensor_from_dl(t, name)?)));
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
        let tensor = row.tensor()?;
        let bytes = tensor.bytes().unwrap_or(&[]);
        let r = EpxTensorRef {
            name: row.name.as_ptr(),
            elem_type: tensor.elem_type() as i32,
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
        row.tensor()?;
        let dl = row
            .dl
            .as_ref()
            .ok_or_else(|| invalid("output has no DLPack form"))?;
        // SAFETY: the caller's contract.
        unsafe { put(tensor, "tensor", dl as *const DLTensor) }
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

/// A value owned by the application (ABI-independent): a host tensor (strings included), a
/// sequence, a map or an optional. Made with the `epx_value_new_*` functions and freed with
/// [`epx_value_free`]; values read from a run's outputs belong to the outputs.
pub struct EpxHostValue {
    node: HostNode,
    /// A tensor's extents as `int64`, made when first asked for (they live as long as the value).
    dims: std::sync::OnceLock<Vec<i64>>,
    /// Made by an `epx_value_new_*` function and not yet handed to another: the caller may
    /// pass it on or free it. Values inside others and values of outputs are not the caller's.
    caller_owns: bool,
}

enum HostNode {
    Tensor(Tensor),
    Sequence(Option<ElementType>, Vec<EpxHostValue>),
    Map(Box<EpxHostValue>, Box<EpxHostValue>),
    Optional(Option<Box<EpxHostValue>>),
}

impl EpxHostValue {
    fn of(v: Value) -> Res<EpxHostValue> {
        Ok(EpxHostValue {
            dims: std::sync::OnceLock::new(),
            caller_owns: false,
            node: match v {
                Value::Host(t) => HostNode::Tensor(t),
                Value::Device(t) => HostNode::Tensor(t.to_host()?),
                Value::Sequence(s) => {
                    let elem = s.elem_type();
                    HostNode::Sequence(
                        elem,
                        s.into_items()
                            .into_iter()
                            .map(EpxHostValue::of)
                            .collect::<Res<_>>()?,
                    )
                }
                Value::Map(m) => {
                    let (k, v) = m.into_parts();
                    HostNode::Map(
                        Box::new(EpxHostValue {
                            dims: std::sync::OnceLock::new(),
                            caller_owns: false,
                            node: HostNode::Tensor(k),
                        }),
                        Box::new(EpxHostValue {
                            dims: std::sync::OnceLock::new(),
                            caller_owns: false,
                            node: HostNode::Tensor(v),
                        }),
                    )
                }
                Value::Optional(v) => HostNode::Optional(match v {
                    Some(v) => Some(Box::new(EpxHostValue::of(*v)?)),
                    None => None,
                }),
            },
        })
    }

    /// A copy as a session value.
    fn to_value(&self) -> Res<Value> {
        Ok(match &self.node {
            HostNode::Tensor(t) => Value::Host(t.clone()),
            HostNode::Sequence(elem, items) => Value::Sequence(Sequence::new(
                *elem,
                items
                    .iter()
                    .map(EpxHostValue::to_value)
                    .collect::<Res<_>>()?,
            )?),
            HostNode::Map(k, v) => Value::Map(Map::new(k.tensor()?.clone(), v.tensor()?.clone())?),
            HostNode::Optional(v) => Value::Optional(match v {
                Some(v) => Some(Box::new(v.to_value()?)),
                None => None,
            }),
        })
    }

    fn tensor(&self) -> Res<&Tensor> {
        match &self.node {
            HostNode::Tensor(t) => Ok(t),
            _ => Err(invalid("the value is not a tensor")),
        }
    }

    fn kind(&self) -> EpxValueKind {
        match self.node {
            HostNode::Tensor(_) => EpxValueKind::Tensor,
            HostNode::Sequence(..) => EpxValueKind::Sequence,
            HostNode::Map(..) => EpxValueKind::Map,
            HostNode::Optional(_) => EpxValueKind::Optional,
        }
    }
}

fn give_value(mut v: EpxHostValue, out: *mut *mut EpxHostValue) -> Res<()> {
    v.caller_owns = true;
    // SAFETY: the caller's out-parameter (checked for NULL by `put`).
    unsafe { put(out, "out", Box::into_raw(Box::new(v))) }
}

/// Takes over values passed by the caller: every non-NULL pointer is freed whatever the
/// outcome, so the caller never frees them.
///
/// # Safety
/// Each pointer is NULL or a live value the caller owns and stops using.
unsafe fn take_values(ptrs: &[*mut EpxHostValue]) -> Res<Vec<EpxHostValue>> {
    let mut seen = std::collections::HashSet::with_capacity(ptrs.len());
    let mut taken = Vec::with_capacity(ptrs.len());
    let mut problem = None;
    for (i, &p) in ptrs.iter().enumerate() {
        if p.is_null() {
            problem.get_or_insert_with(|| invalid(format!("value {i} is NULL")));
        } else if !seen.insert(p) {
            // Taken once already: freeing it again would be a double free.
            problem.get_or_insert_with(|| invalid(format!("value {i} is given twice")));
        // SAFETY: the caller's contract: a live value.
        } else if !unsafe { &*p }.caller_owns {
            problem.get_or_insert_with(|| {
                invalid(format!(
                    "value {i} belongs to another value or to a run's outputs; only values \
                     made with epx_value_new_* can be handed over"
                ))
            });
        } else {
            // SAFETY: the caller's contract: a value it owns, seen here for the first time.
            let mut v = *unsafe { Box::from_raw(p) };
            v.caller_owns = false;
            taken.push(v);
        }
    }
    match problem {
        Some(e) => Err(e),
        None => Ok(taken),
    }
}

/// A new tensor value: a copy of `tensor`'s data (numeric and bool types; `name` is ignored).
///
/// # Safety
/// `tensor` points at a valid [`EpxTensorRef`]; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_tensor(
    tensor: *const EpxTensorRef,
    out: *mut *mut EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_new_tensor", || {
        // SAFETY: the caller's contract.
        let r = unsafe { object(tensor, "tensor") }?;
        // SAFETY: as above.
        let t = unsafe { tensor_from_ref(r, "tensor") }?;
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Tensor(t),
            },
            out,
        )
    })
}

/// A new string tensor value of `ndim` extents `shape`, from one NUL-terminated UTF-8 string
/// per element (C order), copied.
///
/// # Safety
/// `strings` holds as many valid C strings as the shape has elements; `shape` holds `ndim`
/// extents; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_strings(
    strings: *const *const c_char,
    shape: *const i64,
    ndim: usize,
    out: *mut *mut EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_new_strings", || {
        // SAFETY: the caller's contract.
        let dims = unsafe { slice(shape, ndim, "shape") }?;
        let shape = shape_of(dims, "strings")?;
        let count = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| invalid(format!("shape {shape:?} is too large")))?;
        // SAFETY: as above.
        let ptrs = unsafe { slice(strings, count, "strings") }?;
        let mut v = Vec::with_capacity(count);
        for (i, &p) in ptrs.iter().enumerate() {
            // SAFETY: as above.
            v.push(
                unsafe { text(p, &format!("strings[{i}]")) }?
                    .as_bytes()
                    .to_vec(),
            );
        }
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Tensor(Tensor::from_strings(&shape, v)?),
            },
            out,
        )
    })
}

/// A new sequence of `n_items` values, taken over (freed by it, whatever the outcome).
/// `elem_type` is the `EpxElementType` of its tensors (needed for an empty sequence; 0 for a
/// sequence of maps).
///
/// # Safety
/// `items` holds `n_items` live values the caller owns; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_sequence(
    elem_type: i32,
    items: *const *mut EpxHostValue,
    n_items: usize,
    out: *mut *mut EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_new_sequence", || {
        // SAFETY: the caller's contract.
        let ptrs = unsafe { slice(items, n_items, "items") }?;
        // SAFETY: as above.
        let items = unsafe { take_values(ptrs) }?;
        let elem = match elem_type {
            0 => None,
            code => Some(element_type(code, "elem_type")?),
        };
        if let Some(first) = items.first() {
            if items.iter().any(|v| v.kind() != first.kind()) {
                return Err(invalid("sequence items must all be of one kind"));
            }
        }
        if let Some(want) = elem {
            if let Some(bad) = items
                .iter()
                .filter_map(|v| v.tensor().ok())
                .find(|t| t.elem_type() != want)
            {
                return Err(invalid(format!(
                    "a sequence of {want} tensors cannot hold a {} tensor",
                    bad.elem_type()
                )));
            }
        }
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Sequence(elem, items),
            },
            out,
        )
    })
}

/// A new map from 1-D `keys` (int64 or string) to 1-D `values` of the same length, both taken
/// over.
///
/// # Safety
/// `keys` and `values` are live tensor values the caller owns; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_map(
    keys: *mut EpxHostValue,
    values: *mut EpxHostValue,
    out: *mut *mut EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_new_map", || {
        // SAFETY: the caller's contract.
        let mut taken = unsafe { take_values(&[keys, values]) }?.into_iter();
        let (Some(k), Some(v)) = (taken.next(), taken.next()) else {
            return Err(invalid("a map needs keys and values"));
        };
        Map::check(k.tensor()?, v.tensor()?)?;
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Map(Box::new(k), Box::new(v)),
            },
            out,
        )
    })
}

/// A new optional holding `value` (taken over), or none when `value` is NULL.
///
/// # Safety
/// `value` is NULL or a live value the caller owns; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_optional(
    value: *mut EpxHostValue,
    out: *mut *mut EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_new_optional", || {
        // SAFETY: the caller's contract.
        let inner = if value.is_null() {
            None
        } else {
            // SAFETY: the caller's contract.
            unsafe { take_values(&[value]) }?.pop()
        };
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Optional(inner.map(Box::new)),
            },
            out,
        )
    })
}

/// Frees a value made with an `epx_value_new_*` function and not handed to another. NULL is a
/// no-op. Values read from outputs belong to the outputs; do not free them.
///
/// # Safety
/// `value` is NULL or a value the caller owns, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_free(value: *mut EpxHostValue) {
    if !value.is_null() {
        guard_value((), || {
            // SAFETY: the caller's contract: a live value. One it does not own (inside another
            // value, or an output's) is left alone rather than freed under its owner.
            if unsafe { &*value }.caller_owns {
                // SAFETY: made by `give_value`, owned by the caller, freed once.
                drop(unsafe { Box::from_raw(value) });
            }
        });
    }
}

/// What a value is (an `EpxValueKind` of epx_plugin.h); 0 for NULL.
///
/// # Safety
/// `value` is NULL or a live value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_kind(value: *const EpxHostValue) -> u32 {
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { value.as_ref() }.map_or(0, |v| v.kind() as u32)
    })
}

/// A tensor value as element type, shape and data, valid as long as the value (`name` is
/// NULL). For a string tensor `data` is NULL and `byte_len` 0: read its elements with
/// [`epx_value_string`].
///
/// # Safety
/// `value` is a live value; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_tensor(
    value: *const EpxHostValue,
    out: *mut EpxTensorRef,
) -> *mut EpxError {
    guard("epx_value_tensor", || {
        // SAFETY: the caller's contract.
        let v = unsafe { object(value, "value") }?;
        let t = v.tensor()?;
        let bytes = t.bytes();
        let shape = value_shape(v)?;
        // SAFETY: as above.
        unsafe {
            put(
                out,
                "out",
                EpxTensorRef {
                    name: std::ptr::null(),
                    elem_type: t.elem_type() as i32,
                    shape: if shape.is_empty() {
                        std::ptr::null()
                    } else {
                        shape.as_ptr()
                    },
                    ndim: shape.len(),
                    data: bytes.map_or(std::ptr::null(), |b| b.as_ptr().cast()),
                    byte_len: bytes.map_or(0, <[u8]>::len),
                },
            )
        }
    })
}

/// A tensor value's extents as `int64`, kept in the value.
fn value_shape(v: &EpxHostValue) -> Res<&[i64]> {
    let t = v.tensor()?;
    Ok(v.dims
        .get_or_init(|| t.shape().iter().map(|&d| d as i64).collect()))
}

/// Element `index` (C order) of a string tensor value: `*data` and `*len` receive its bytes
/// (UTF-8, not NUL-terminated), valid as long as the value. `*count` (may be NULL) receives the
/// number of elements.
///
/// # Safety
/// `value` is a live value; `data` and `len` writable; `count` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_string(
    value: *const EpxHostValue,
    index: usize,
    data: *mut *const c_char,
    len: *mut usize,
    count: *mut usize,
) -> *mut EpxError {
    guard("epx_value_string", || {
        // SAFETY: the caller's contract.
        let t = unsafe { object(value, "value") }?.tensor()?;
        let strings = t
            .strings()
            .ok_or_else(|| invalid("not a string tensor: read it with epx_value_tensor"))?;
        if !count.is_null() {
            // SAFETY: the caller's contract; not NULL.
            unsafe { count.write(strings.len()) };
        }
        // Only the count asked for.
        if data.is_null() && len.is_null() {
            return Ok(());
        }
        let s = strings.get(index).ok_or_else(|| {
            invalid(format!(
                "index {index} out of range ({} strings)",
                strings.len()
            ))
        })?;
        // SAFETY: the caller's contract.
        unsafe { put(data, "data", s.as_ptr().cast::<c_char>()) }?;
        // SAFETY: as above.
        unsafe { put(len, "len", s.len()) }
    })
}

/// The number of items of a sequence value (0 for NULL or another kind).
///
/// # Safety
/// `value` is NULL or a live value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_sequence_len(value: *const EpxHostValue) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract.
        match unsafe { value.as_ref() }.map(|v| &v.node) {
            Some(HostNode::Sequence(_, items)) => items.len(),
            _ => 0,
        }
    })
}

/// Item `index` of a sequence value, borrowed from it.
///
/// # Safety
/// `value` is a live value; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_sequence_at(
    value: *const EpxHostValue,
    index: usize,
    out: *mut *const EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_sequence_at", || {
        // SAFETY: the caller's contract.
        let HostNode::Sequence(_, items) = &unsafe { object(value, "value") }?.node else {
            return Err(invalid("the value is not a sequence"));
        };
        let item = items.get(index).ok_or_else(|| {
            invalid(format!(
                "index {index} out of range ({} items)",
                items.len()
            ))
        })?;
        // SAFETY: as above.
        unsafe { put(out, "out", item as *const EpxHostValue) }
    })
}

/// A map value's keys and values (two 1-D tensor values of one length), borrowed from it.
///
/// # Safety
/// `value` is a live value; `keys` and `values` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_map(
    value: *const EpxHostValue,
    keys: *mut *const EpxHostValue,
    values: *mut *const EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_map", || {
        // SAFETY: the caller's contract.
        let HostNode::Map(k, v) = &unsafe { object(value, "value") }?.node else {
            return Err(invalid("the value is not a map"));
        };
        // SAFETY: as above.
        unsafe { put(keys, "keys", &**k as *const EpxHostValue) }?;
        // SAFETY: as above.
        unsafe { put(values, "values", &**v as *const EpxHostValue) }
    })
}

/// An optional value's content, borrowed from it: `*out` is NULL when it holds none.
///
/// # Safety
/// `value` is a live value; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_optional(
    value: *const EpxHostValue,
    out: *mut *const EpxHostValue,
) -> *mut EpxError {
    guard("epx_value_optional", || {
        // SAFETY: the caller's contract.
        let HostNode::Optional(inner) = &unsafe { object(value, "value") }?.node else {
            return Err(invalid("the value is not an optional"));
        };
        let p = inner
            .as_deref()
            .map_or(std::ptr::null(), |v| v as *const EpxHostValue);
        // SAFETY: as above.
        unsafe { put(out, "out", p) }
    })
}

/// Runs the model on `n_inputs` values of any kind named `input_names[i]` (copied; the caller
/// keeps them). Read the outputs with [`epx_outputs_value`] (every kind) or the tensor getters.
///
/// # Safety
/// `session` is a live session; `input_names` and `inputs` hold `n_inputs` C strings and live
/// values; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_run_values(
    session: *const EpxSession,
    input_names: *const *const c_char,
    inputs: *const *const EpxHostValue,
    n_inputs: usize,
    out: *mut *mut EpxOutputs,
) -> *mut EpxError {
    guard("epx_session_run_values", || {
        // SAFETY: the caller's contract for every pointer below.
        let names = unsafe { slice(input_names, n_inputs, "input_names") }?;
        // SAFETY: as above.
        let values = unsafe { slice(inputs, n_inputs, "inputs") }?;
        let mut feed = Vec::with_capacity(n_inputs);
        for (i, (&n, &v)) in names.iter().zip(values).enumerate() {
            // SAFETY: as above.
            let name = unsafe { text(n, &format!("input_names[{i}]")) }?;
            // SAFETY: as above.
            let v = unsafe { object(v, &format!("inputs[{i}]")) }?;
            feed.push((name.to_string(), v.to_value()?));
        }
        run_session(session, feed, out)
    })
}

/// Output `index` as a value of any kind (borrowed from `outputs`); `*name` (may be NULL)
/// receives its name.
///
/// # Safety
/// `outputs` is live outputs; `value` writable; `name` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_value(
    outputs: *const EpxOutputs,
    index: usize,
    name: *mut *const c_char,
    value: *mut *const EpxHostValue,
) -> *mut EpxError {
    guard("epx_outputs_value", || {
        let row = output_row(outputs, index)?;
        if !name.is_null() {
            // SAFETY: the caller's contract; not NULL.
            unsafe { name.write(row.name.as_ptr()) };
        }
        // SAFETY: the caller's contract.
        unsafe { put(value, "value", &row.value as *const EpxHostValue) }
    })
}

/// The declared type of model input `index` as ONNX spells it (`tensor(float)`,
/// `seq(tensor(int64))`, `map(string,tensor(float))`, `optional(...)`). Free `*type_name` with
/// [`epx_string_free`].
///
/// # Safety
/// `session` is a live session; `type_name` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_input_type(
    session: *const EpxSession,
    index: usize,
    type_name: *mut *mut c_char,
) -> *mut EpxError {
    guard("epx_session_input_type", || {
        // SAFETY: the caller's contract.
        let s = unsafe { object(session, "session") }?;
        declared_type(&s.session.inputs(), index, "input", type_name)
    })
}

/// As [`epx_session_input_type`], for model output `index`.
///
/// # Safety
/// `session` is a live session; `type_name` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_output_type(
    session: *const EpxSession,
    index: usize,
    type_name: *mut *mut c_char,
) -> *mut EpxError {
    guard("epx_session_output_type", || {
        // SAFETY: the caller's contract.
        let s = unsafe { object(session, "session") }?;
        declared_type(&s.session.outputs(), index, "output", type_name)
    })
}

fn declared_type(
    specs: &[epx_host::ValueSpec],
    index: usize,
    kind: &str,
    out: *mut *mut c_char,
) -> Res<()> {
    let spec = specs.get(index).ok_or_else(|| {
        invalid(format!(
            "{kind} index {index} out of range (the model has {})",
            specs.len()
        ))
    })?;
    // SAFETY: the caller's out-parameter.
    unsafe { put(out, "type_name", c_string(&spec.ty.to_string()).into_raw()) }
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
