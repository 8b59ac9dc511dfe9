//! `EpxSessionOptions`: the ordered EP list (with options) a session or an environment asks
//! for.

use std::sync::Mutex;

use super::*;
use crate::handle::Handles;

/// An ordered list of EPs with their options, for sessions ([`epx_session_new`]) and as an
/// environment's default EPs ([`epx_env_new`]). A handle, not an address: freeing it while
/// another thread makes a session from it is safe (that call keeps its own reference), and a
/// call made with it after [`epx_session_options_free`] is an error.
pub struct EpxSessionOptions {
    _opaque: [u8; 0],
}

/// What an option set holds.
pub(crate) struct OptionsData {
    pub(crate) providers: Vec<ExecutionProvider>,
    pub(crate) strict: bool,
    /// The CPU EP's intra-op thread count; `None` for its default (one per core).
    pub(crate) intra_op_threads: Option<usize>,
    /// The sessions' own tensor limit; `None` for the process's.
    pub(crate) max_tensor_bytes: Option<u64>,
    /// Every EP of the list runs in a child process.
    pub(crate) isolated: bool,
    /// EPs chosen by policy instead of by name.
    pub(crate) policy: Option<epx_host::SelectionPolicy>,
    /// Whether sessions use the compiled-kernel cache.
    pub(crate) kernel_cache: bool,
    /// Whether sessions profile their runs.
    pub(crate) profiling: bool,
    /// Run options whose terminate flag cancels the creation of sessions.
    pub(crate) cancel: Option<Arc<epx_host::RunOptions>>,
}

/// The live option sets.
pub(crate) static OPTIONS: Handles<Mutex<OptionsData>, EpxSessionOptions> =
    Handles::new(2, "option set", "epx_session_options_free");

/// Changes the option set `options` with `f`.
fn update(options: *mut EpxSessionOptions, f: impl FnOnce(&mut OptionsData)) -> Res<()> {
    let options = OPTIONS.get(options, "options")?;
    f(&mut options.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(())
}

/// A new, empty option set: no EPs (the CPU EP always runs what is left), not strict.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_new() -> *mut EpxSessionOptions {
    ffi_boundary!(OPTIONS.insert(Mutex::new(OptionsData {
        providers: Vec::new(),
        strict: false,
        intra_op_threads: None,
        max_tensor_bytes: None,
        isolated: false,
        policy: None,
        kernel_cache: true,
        profiling: false,
        cancel: None,
    })))
}

/// Makes the creation of sessions with these options cancellable: once `run_options`' terminate
/// flag is set ([`epx_run_options_set_terminate`](crate::epx_run_options_set_terminate), from
/// any thread), creation stops at its next step and fails with `EPX_ERROR_CODE_CANCELLED`
/// (ONNX Runtime's load cancellation flag). NULL stops watching.
///
/// Pointers: `options` is a live option set; `run_options` NULL or live run options.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_cancellation(
    options: *mut EpxSessionOptions,
    run_options: *const EpxRunOptions,
) -> *mut EpxError {
    ffi_boundary!({
        let flag = if run_options.is_null() {
            None
        } else {
            Some(RUN_OPTIONS.get(run_options, "run_options")?)
        };
        update(options, |o| o.cancel = flag)
    })
}

/// Frees an option set. NULL, or a set freed already, is a no-op.
///
/// Pointers: `options` is NULL or from [`epx_session_options_new`].
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_free(options: *mut EpxSessionOptions) {
    ffi_boundary!(drop(OPTIONS.remove(options)))
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
    options: *mut EpxSessionOptions,
    name: *const c_char,
    keys: *const *const c_char,
    values: *const *const c_char,
    n_options: usize,
    error_on_failure: bool,
) -> *mut EpxError {
    ffi_boundary!({
        let options = OPTIONS.get(options, "options")?;
        let mut options = options.lock().unwrap_or_else(|p| p.into_inner());
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
    options: *mut EpxSessionOptions,
    strict: bool,
) -> *mut EpxError {
    ffi_boundary!(update(options, |o| o.strict = strict))
}
/// The threads the CPU EP shares a kernel's work across, for sessions made with these options:
/// 1 runs everything on the calling thread; 0, the default, one per core. It applies to the
/// fallback CPU EP and to a requested `cpu` EP that does not set `intra_op_num_threads` itself.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_intra_op_threads(
    options: *mut EpxSessionOptions,
    threads: usize,
) -> *mut EpxError {
    ffi_boundary!(update(options, |o| o.intra_op_threads =
        (threads > 0).then_some(threads)))
}

/// The largest tensor (bytes) sessions made with these options allocate, in place of the
/// process's limit ([`epx_set_max_tensor_bytes`](crate::epx_set_max_tensor_bytes)): a model or
/// input asking for more is an error naming the node and the size. 0 goes back to the process's
/// limit.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_max_tensor_bytes(
    options: *mut EpxSessionOptions,
    bytes: u64,
) -> *mut EpxError {
    ffi_boundary!(update(options, |o| o.max_tensor_bytes =
        (bytes > 0).then_some(bytes)))
}
/// Whether sessions made with these options use the compiled-kernel cache (default: yes, unless
/// `EPX_KERNEL_CACHE=off`): kernels of EPs that can serialize them (ABI 1.6, e.g. OpenVINO) are
/// rebuilt from `<cache dir>/kernels` (`EPX_CACHE_DIR`, else `$XDG_CACHE_HOME/epx`, else
/// `$HOME/.cache/epx`) instead of compiled, and new ones stored there. The placement JSON's
/// `kernel_cache` says what happened per kernel.
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_kernel_cache(
    options: *mut EpxSessionOptions,
    enabled: bool,
) -> *mut EpxError {
    ffi_boundary!(update(options, |o| o.kernel_cache = enabled))
}

/// Whether sessions made with these options profile their runs (default: no): the time of
/// each kernel and copy, of each node in EPs that record their kernels' parts (the CPU EP
/// does), and what the EPs' compile passes did. Read it with [`epx_session_profile_json`].
///
/// Pointers: `options` is a live option set.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_profiling(
    options: *mut EpxSessionOptions,
    enabled: bool,
) -> *mut EpxError {
    ffi_boundary!(update(options, |o| o.profiling = enabled))
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
    options: *mut EpxSessionOptions,
    isolated: bool,
) -> *mut EpxError {
    ffi_boundary!(update(options, |o| o.isolated = isolated))
}

/// Chooses the EPs of sessions made with these options by policy, from the devices the
/// environment's EPs list ([`epx_env_devices_json`](crate::epx_env_devices_json)): `prefer-cpu`,
/// `prefer-gpu`, `prefer-npu`, `max-performance`, `min-power`, or `measure` (times the candidates
/// on the model and remembers the fastest); NULL goes back to the EPs added
/// by name. Naming EPs as well fails the session. The placement JSON's `selection` says what the
/// policy chose and why.
///
/// # Safety
/// `options` is a live option set; `policy` is NULL or a string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_options_set_selection_policy(
    options: *mut EpxSessionOptions,
    policy: *const c_char,
) -> *mut EpxError {
    ffi_boundary!({
        let options = OPTIONS.get(options, "options")?;
        let mut options = options.lock().unwrap_or_else(|p| p.into_inner());
        options.policy = if policy.is_null() {
            None
        } else {
            // SAFETY: a NUL-terminated string, per this function's contract.
            let name = unsafe { text(policy, "policy") }?;
            Some(epx_host::SelectionPolicy::from_name(name)?)
        };
        Res::Ok(())
    })
}

/// The application's own selection policy: `select(devices_json, model_json, eps, capacity,
/// user_data)` gets the devices (as [`epx_env_devices_json`](crate::epx_env_devices_json)) and
/// the model (`graph_name`, `producer_name`, `op_types`: the distinct `domain:op` of its nodes,
/// `inputs`, `outputs`), writes the EPs to use, in order, into `eps` as a NUL-terminated,
/// comma-separated list of `EP` or `EP:DEVICE` when `capacity` holds it, and returns the list's
/// length without the NUL (it is called again with a larger buffer when that does not fit).
/// Returning `SIZE_MAX` fails the session: the function could not choose. Called on the thread
/// that makes the session, during `epx_session_new`; `user_data` is passed through.
///
/// Pointers: `options` is a live option set; `select` NULL clears the function.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_options_set_selection_function(
    options: *mut EpxSessionOptions,
    select: EpxSelectionFn,
    user_data: *mut c_void,
) -> *mut EpxError {
    ffi_boundary!({
        let options = OPTIONS.get(options, "options")?;
        let mut options = options.lock().unwrap_or_else(|p| p.into_inner());
        options.policy = select.map(|f| {
            let call = ForeignSelect { f, user_data };
            epx_host::SelectionPolicy::Custom(std::sync::Arc::new(move |input| call.call(input)))
        });
        Res::Ok(())
    })
}

/// See [`epx_session_options_set_selection_function`].
pub type EpxSelectionFn = Option<
    unsafe extern "C" fn(
        devices_json: *const c_char,
        model_json: *const c_char,
        eps: *mut c_char,
        capacity: usize,
        user_data: *mut c_void,
    ) -> usize,
>;

/// An application's C selection function and its data.
struct ForeignSelect {
    f: unsafe extern "C" fn(
        devices_json: *const c_char,
        model_json: *const c_char,
        eps: *mut c_char,
        capacity: usize,
        user_data: *mut c_void,
    ) -> usize,
    user_data: *mut c_void,
}

// SAFETY: the function is called only while a session is being made, on the thread making it
// (the contract of `epx_session_options_set_selection_function`); the pointer is passed through.
unsafe impl Send for ForeignSelect {}
// SAFETY: as above.
unsafe impl Sync for ForeignSelect {}

/// The longest EP list a selection function may write.
const MAX_SELECTION_LIST: usize = 1 << 16;

impl ForeignSelect {
    fn call(
        &self,
        input: &epx_host::SelectionInput<'_>,
    ) -> std::result::Result<Vec<ExecutionProvider>, String> {
        let g = &input.model.graph;
        let mut ops: Vec<String> = g
            .nodes
            .iter()
            .map(|n| format!("{}:{}", n.domain, n.op_type))
            .collect();
        ops.sort();
        ops.dedup();
        let names = |ids: &[usize]| -> Vec<String> {
            ids.iter().map(|&v| g.values[v].name.clone()).collect()
        };
        let model = serde_json::json!({
            "graph_name": input.model.metadata.graph_name,
            "producer_name": input.model.producer,
            "op_types": ops,
            "inputs": names(&g.inputs),
            "outputs": names(&g.outputs),
        });
        let devices = serde_json::to_string(input.devices).map_err(|e| e.to_string())?;
        let c = |s: String| std::ffi::CString::new(s).map_err(|e| e.to_string());
        let (devices, model) = (c(devices)?, c(model.to_string())?);
        let mut buf = vec![0u8; 1024];
        for _ in 0..2 {
            // SAFETY: the application's function, with NUL-terminated strings and a buffer of
            // `buf.len()` bytes, all live for the call.
            let n = unsafe {
                (self.f)(
                    devices.as_ptr(),
                    model.as_ptr(),
                    buf.as_mut_ptr().cast::<c_char>(),
                    buf.len(),
                    self.user_data,
                )
            };
            if n == usize::MAX {
                return Err("it returned SIZE_MAX".into());
            }
            if n >= buf.len() {
                if n >= MAX_SELECTION_LIST {
                    return Err(format!("it asked for {n} bytes for the EP list"));
                }
                buf = vec![0u8; n + 1];
                continue;
            }
            let list = std::str::from_utf8(&buf[..n])
                .map_err(|_| "its EP list is not UTF-8".to_string())?;
            return list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|spec| match spec.split_once(':') {
                    Some((ep, d)) if !ep.is_empty() && !d.is_empty() => {
                        Ok(ExecutionProvider::new(ep).on_device(d).error_on_failure())
                    }
                    Some(_) => Err(format!("`{spec}` is not EP or EP:DEVICE")),
                    None => Ok(ExecutionProvider::new(spec).error_on_failure()),
                })
                .collect();
        }
        Err("its EP list did not fit the buffer it asked for".into())
    }
}

impl PanicPointee for EpxSessionOptions {}
