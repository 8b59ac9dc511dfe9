//! `EpxSessionOptions`: the ordered EP list (with options) a session or an environment asks
//! for.

use super::*;

/// An ordered list of EPs with their options, for sessions ([`epx_session_new`]) and as an
/// environment's default EPs ([`epx_env_new`]).
pub struct EpxSessionOptions {
    pub(crate) providers: Vec<ExecutionProvider>,
    pub(crate) strict: bool,
    /// The CPU EP's intra-op thread count; `None` for its default (one per core).
    pub(crate) intra_op_threads: Option<usize>,
    /// The sessions' own tensor limit; `None` for the process's.
    pub(crate) max_tensor_bytes: Option<u64>,
    /// Every EP of the list runs in a child process.
    pub(crate) isolated: bool,
}

/// A new, empty option set: no EPs (the CPU EP always runs what is left), not strict.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_new() -> *mut EpxSessionOptions {
    ffi_boundary!({
        Box::into_raw(Box::new(EpxSessionOptions {
            providers: Vec::new(),
            strict: false,
            intra_op_threads: None,
            max_tensor_bytes: None,
            isolated: false,
        }))
    })
}

/// Frees an option set. NULL is a no-op.
///
/// # Safety
/// `options` is NULL or from [`epx_session_options_new`], freed only once.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_free(options: Option<Box<EpxSessionOptions>>) {
    ffi_boundary!(drop(options))
}

/// Appends EP `name` (`ep` or `plugin/ep`, optionally followed by `:DEVICE` to run it on one of
/// the devices it lists, as [`epx_env_devices_json`](crate::epx_env_devices_json)'s `selector`
/// names it: `cuda:1`, `openvino:GPU.0`) with `n_options` options `keys[i] = values[i]`, after
/// the EPs added before it. With `error_on_failure`, a session fails when this EP cannot be set
/// up; without, the EP is skipped and the placement report says why. Unknown option keys are an
/// error when the session is made, naming the valid keys.
///
/// # Safety
/// `options` is a live option set; `name` a string; `keys` and `values` point at `n_options`
/// strings each (or are NULL when `n_options` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_options_add_provider(
    options: Option<&mut EpxSessionOptions>,
    name: *const c_char,
    keys: *const *const c_char,
    values: *const *const c_char,
    n_options: usize,
    error_on_failure: bool,
) -> *mut EpxError {
    ffi_boundary!({
        let options = options.ok_or_else(|| invalid("`options` is NULL"))?;
        // SAFETY: `name` is NULL or a NUL-terminated string, per this function's contract.
        let name = unsafe { text(name, "name") }?;
        if name.is_empty() {
            return Err(invalid("the EP name is empty"));
        }
        // SAFETY: `keys` is NULL or points at `n_options` elements, per this function's contract.
        let keys = unsafe { slice(keys, n_options, "keys") }?;
        // SAFETY: `values` is NULL or points at `n_options` elements, per this function's contract.
        let values = unsafe { slice(values, n_options, "values") }?;
        let mut ep = match name.split_once(':') {
            Some((ep, device)) if !ep.is_empty() && !device.is_empty() => {
                ExecutionProvider::new(ep).on_device(device)
            }
            Some(_) => return Err(invalid(format!("`{name}` is not EP or EP:DEVICE"))),
            None => ExecutionProvider::new(name),
        };
        for (i, (&k, &v)) in keys.iter().zip(values).enumerate() {
            // SAFETY: `k` is NULL or a NUL-terminated string, per this function's contract.
            let k = unsafe { text(k, &format!("keys[{i}]")) }?;
            // SAFETY: `v` is NULL or a NUL-terminated string, per this function's contract.
            let v = unsafe { text(v, &format!("values[{i}]")) }?;
            ep = ep.with_option(k, v);
        }
        if error_on_failure {
            ep = ep.error_on_failure();
        }
        options.providers.push(ep);
        Res::Ok(())
    })
}

/// Strict placement: making a session fails when any node would fall back to the CPU EP.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_strict(
    options: Option<&mut EpxSessionOptions>,
    strict: bool,
) -> *mut EpxError {
    ffi_boundary!({
        let options = options.ok_or_else(|| invalid("`options` is NULL"))?;
        options.strict = strict;
        Res::Ok(())
    })
}
/// The threads the CPU EP shares a kernel's work across, for sessions made with these options:
/// 1 runs everything on the calling thread; 0, the default, one per core. It applies to the
/// fallback CPU EP and to a requested `cpu` EP that does not set `intra_op_num_threads` itself.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_intra_op_threads(
    options: Option<&mut EpxSessionOptions>,
    threads: usize,
) -> *mut EpxError {
    ffi_boundary!({
        let options = options.ok_or_else(|| invalid("`options` is NULL"))?;
        options.intra_op_threads = (threads > 0).then_some(threads);
        Res::Ok(())
    })
}

/// The largest tensor (bytes) sessions made with these options allocate, in place of the
/// process's limit ([`epx_set_max_tensor_bytes`](crate::epx_set_max_tensor_bytes)): a model or
/// input asking for more is an error naming the node and the size. 0 goes back to the process's
/// limit.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_max_tensor_bytes(
    options: Option<&mut EpxSessionOptions>,
    bytes: u64,
) -> *mut EpxError {
    ffi_boundary!({
        let options = options.ok_or_else(|| invalid("`options` is NULL"))?;
        options.max_tensor_bytes = (bytes > 0).then_some(bytes);
        Res::Ok(())
    })
}
/// Runs every EP of the list in a child process (the `epx` executable beside libepx, at
/// `../bin/epx`, or named by `EPX_PROBE_EXE`, serving the plugin): a crash or hang of a plugin
/// then fails the run it happened in with an error, and the next run starts a new process,
/// instead of ending the calling program. Tensors pass through shared memory; only EPs of plugin
/// libraries whose tensors live in host memory can be isolated (others fail to set up, saying
/// why). A plugin whose `plugin.toml` says `isolate = true` is always isolated.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_isolated(
    options: Option<&mut EpxSessionOptions>,
    isolated: bool,
) -> *mut EpxError {
    ffi_boundary!({
        let options = options.ok_or_else(|| invalid("`options` is NULL"))?;
        options.isolated = isolated;
        Res::Ok(())
    })
}

impl PanicPointee for EpxSessionOptions {}
