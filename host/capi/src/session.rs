//! `EpxSession`: a model compiled across its EPs, its inputs and outputs, and the placement
//! report.

use super::*;
use crate::handle::Handles;

/// A model input or output as [`epx_session_input`] / [`epx_session_output`] describe it. Strings
/// and arrays belong to the session: valid until it is freed.
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

pub(crate) struct ValueRow {
    pub(crate) name: CString,
    pub(crate) elem_type: i32,
    pub(crate) shape: Option<Vec<i64>>,
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

/// A model partitioned across EPs and compiled, ready to run (from several threads at once). A
/// handle, not an address: each run holds its own reference, so [`epx_session_free`] while
/// other threads run it lets those runs finish, and a run started after it fails with "the
/// session is closed".
pub struct EpxSession {
    _opaque: [u8; 0],
}

/// What a session handle holds.
pub(crate) struct SessionData {
    pub(crate) session: Session,
    pub(crate) inputs: Vec<ValueRow>,
    pub(crate) outputs: Vec<ValueRow>,
}

/// The live sessions.
pub(crate) static SESSIONS: Handles<SessionData, EpxSession> =
    Handles::new(3, "session", "epx_session_free");

pub(crate) fn make_session(
    env: *const EpxEnv,
    options: *const EpxSessionOptions,
    out: Option<&mut MaybeUninit<*mut EpxSession>>,
    commit: impl FnOnce(epx_host::SessionBuilder) -> epx_host::Result<Session>,
) -> Res<()> {
    let Some(out) = out else {
        return Err(invalid("`out` is NULL"));
    };
    let env = ENVS.get(env, "env")?;
    let mut builder = Session::builder()?.with_environment(env.env.clone());
    let options = if options.is_null() {
        None
    } else {
        Some(OPTIONS.get(options, "options")?)
    };
    let options = options
        .as_ref()
        .map(|o| o.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some(o) = options.as_deref() {
        builder = builder
            .with_execution_providers(o.providers.iter().map(|ep| {
                if o.isolated {
                    ep.clone().isolated()
                } else {
                    ep.clone()
                }
            }))?
            .with_strict_placement(o.strict)
            .with_kernel_cache(o.kernel_cache)
            .with_profiling(o.profiling);
        if let Some(n) = o.max_tensor_bytes {
            builder = builder.with_max_tensor_bytes(n);
        }
        if let Some(p) = &o.policy {
            if o.isolated {
                return Err(invalid(
                    "isolation applies to EPs added by name; a selection policy chooses its own",
                ));
            }
            // A policy loads every plugin to read its devices (each opened in a child first,
            // all at once: `Environment::load_all`).
            builder = builder.with_selection_policy(p.clone());
        }
        if let Some(n) = o.intra_op_threads {
            builder = builder.with_intra_op_threads(n);
        }
        if let Some(flag) = &o.cancel {
            builder = builder.with_cancellation(flag);
        }
    }
    drop(options);
    let session = commit(builder)?;
    let inputs = session.inputs().iter().map(ValueRow::of).collect();
    let outputs = session.outputs().iter().map(ValueRow::of).collect();
    out.write(SESSIONS.insert(SessionData {
        session,
        inputs,
        outputs,
    }));
    Ok(())
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
    out: Option<&mut MaybeUninit<*mut EpxSession>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: `model_path` is NULL or a NUL-terminated string, per this function's contract.
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
    out: Option<&mut MaybeUninit<*mut EpxSession>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: `data` is NULL or points at `len` elements, per this function's contract.
        let bytes = unsafe { slice(data.cast::<u8>(), len, "data") }?;
        make_session(env, options, out, |b| b.commit_from_memory(bytes))
    })
}

/// Releases the caller's session. Runs in flight on other threads finish on their own
/// reference (the session is dropped when the last one ends); any call made with the handle
/// afterwards fails with "the session is closed". NULL, or a session freed already, is a no-op.
///
/// Pointers: `session` is NULL or from this library.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_free(session: *mut EpxSession) {
    ffi_boundary!(drop(SESSIONS.remove(session)))
}

/// The number of model inputs (0 for NULL).
///
/// Pointers: `session` is NULL or a live session.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_input_count(session: *const EpxSession) -> usize {
    ffi_boundary!(
        SESSIONS
            .get(session, "session")
            .map_or(0, |s| s.inputs.len())
    )
}

/// The number of model outputs (0 for NULL).
///
/// Pointers: `session` is NULL or a live session.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_output_count(session: *const EpxSession) -> usize {
    ffi_boundary!(
        SESSIONS
            .get(session, "session")
            .map_or(0, |s| s.outputs.len())
    )
}

pub(crate) fn describe(
    rows: &[ValueRow],
    index: usize,
    kind: &str,
    out: Option<&mut MaybeUninit<EpxValueDesc>>,
) -> Res<()> {
    let row = rows.get(index).ok_or_else(|| {
        invalid(format!(
            "{kind} index {index} out of range (the model has {})",
            rows.len()
        ))
    })?;
    put(out, "out", row.desc())
}

/// Describes model input `index`: name, element type and shape.
///
/// Pointers: `session` is a live session; `out` writable.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_input(
    session: *const EpxSession,
    index: usize,
    out: Option<&mut MaybeUninit<EpxValueDesc>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
        describe(&s.inputs, index, "input", out)
    })
}

/// Describes model output `index`: name, element type and shape.
///
/// Pointers: `session` is a live session; `out` writable.
#[unsafe(no_mangle)]
pub extern "C" fn epx_session_output(
    session: *const EpxSession,
    index: usize,
    out: Option<&mut MaybeUninit<EpxValueDesc>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
        describe(&s.outputs, index, "output", out)
    })
}

/// The placement report as JSON: `nodes` (id, name, op_type, provider, group), `groups` (id,
/// provider, nodes, kernel, inputs, outputs), `copies` (value, from, to, before_group, bytes,
/// last_run_bytes), `fallbacks` (node, name, op_type, reason), `skipped_providers` (name,
/// reason), `isolated_providers` (names of the EPs running in a child process), `devices` (EP,
/// device for EPs on a chosen device), `selection` (null, or the policy, the EPs it `chosen`
/// and its `reasons`), `kernel_cache` (group, kernel, `loaded`, `note`: what the compiled-kernel
/// cache did per kernel of an EP that stores its kernels) and `replayed_capabilities` (EPs whose
/// capability answers came from that cache). Free `*json` with [`epx_string_free`].
///
/// # Safety
/// `session` is a live session; `json` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_placement_json(
    session: *const EpxSession,
    json: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
        let text = serde_json::to_string(&s.session.placement())
            .map_err(|e| EpxError::new(EpxErrorCode::Internal, format!("placement JSON: {e}")))?;
        out_string(json, "json", &text)
    })
}

/// The profile of a session made with profiling on
/// ([`epx_session_options_set_profiling`](crate::epx_session_options_set_profiling)), as JSON:
/// `runs`, `run_ns` (time in `epx_session_run`, all runs), `kernels` (per kernel: `kernel`,
/// `provider`, `nodes`, `calls`, `ns`, `parts` (`name`, `op`, `calls`, `ns` per node or fused
/// node), `passes` (`name`, `changed`, `note` per compile pass of its EP) and `whole` (null, or
/// why the kernel is timed only whole)) and `copies` (`value`, `from`, `to`, `calls`, `ns`).
/// With `restart` true, the profile then starts again from zero. An `InvalidArgument` error
/// for a session made without profiling. Free `*json` with [`epx_string_free`].
///
/// # Safety
/// `session` is a live session; `json` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_profile_json(
    session: *const EpxSession,
    restart: bool,
    json: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
        let profile = s.session.profile()?;
        let text = serde_json::to_string(&profile)
            .map_err(|e| EpxError::new(EpxErrorCode::Internal, format!("profile JSON: {e}")))?;
        if restart {
            s.session.restart_profile()?;
        }
        out_string(json, "json", &text)
    })
}

/// The model's metadata as JSON: `producer_name`, `producer_version`, `domain`,
/// `model_version` (null when the file has none), `description` (the model's doc_string), `graph_name`, `graph_description`,
/// `custom` (metadata_props as an object), `ir_version`, `opsets` (domain to version; `""` is
/// the ONNX domain), `overridable_initializers` (graph inputs with an initializer, constants
/// here), and `inputs` / `outputs`: name and `dims`, each extent a number, its symbol, or null.
/// Free `*json` with [`epx_string_free`].
///
/// # Safety
/// `session` is a live session; `json` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_metadata_json(
    session: *const EpxSession,
    json: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
        let model = s.session.model();
        let m = &model.metadata;
        let dims = |specs: Vec<epx_host::ValueSpec>| {
            specs
                .iter()
                .map(|v| {
                    let dims = v.shape.as_ref().map(|shape| {
                        shape
                            .iter()
                            .enumerate()
                            .map(
                                |(i, d)| match (d, v.symbols.get(i).and_then(Option::as_ref)) {
                                    (Some(n), _) => serde_json::json!(n),
                                    (None, Some(sym)) => serde_json::json!(sym),
                                    (None, None) => serde_json::Value::Null,
                                },
                            )
                            .collect::<Vec<_>>()
                    });
                    serde_json::json!({ "name": v.name, "dims": dims })
                })
                .collect::<Vec<_>>()
        };
        let overridable: Vec<_> = m
            .overridable_initializers
            .iter()
            .map(|name| {
                let ty = model
                    .graph
                    .value_id(name)
                    .map(|v| &model.graph.values[v].ty);
                let dims = ty.and_then(|t| match t {
                    epx_host::ir::ValueType::Tensor { shape, .. } => shape.as_ref(),
                    _ => None,
                });
                let dims = dims.map(|d| d.iter().map(dim_json).collect::<Vec<_>>());
                serde_json::json!({
                    "name": name,
                    "type": ty.map(ToString::to_string),
                    "dims": dims,
                })
            })
            .collect();
        let value = serde_json::json!({
            "producer_name": model.producer,
            "producer_version": m.producer_version,
            "domain": m.domain,
            "model_version": m.model_version,
            "description": m.description,
            "graph_name": m.graph_name,
            "graph_description": m.graph_description,
            "custom": m.custom,
            "ir_version": model.ir_version,
            "opsets": model.opsets,
            "overridable_initializers": overridable,
            "inputs": dims(s.session.inputs()),
            "outputs": dims(s.session.outputs()),
        });
        out_string(json, "json", &value.to_string())
    })
}

/// An extent as JSON: its number, its symbol, or null.
fn dim_json(d: &epx_host::ir::Dim) -> serde_json::Value {
    match d {
        epx_host::ir::Dim::Known(n) => serde_json::json!(n),
        epx_host::ir::Dim::Symbolic(s) => serde_json::json!(s),
        epx_host::ir::Dim::Unknown => serde_json::Value::Null,
    }
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
    type_name: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
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
    type_name: Option<&mut MaybeUninit<*mut c_char>>,
) -> *mut EpxError {
    ffi_boundary!({
        let s = SESSIONS.get(session, "session")?;
        declared_type(&s.session.outputs(), index, "output", type_name)
    })
}

pub(crate) fn declared_type(
    specs: &[epx_host::ValueSpec],
    index: usize,
    kind: &str,
    out: Option<&mut MaybeUninit<*mut c_char>>,
) -> Res<()> {
    let spec = specs.get(index).ok_or_else(|| {
        invalid(format!(
            "{kind} index {index} out of range (the model has {})",
            specs.len()
        ))
    })?;
    put(out, "type_name", c_string(&spec.ty.to_string()).into_raw())
}
impl PanicPointee for EpxSession {}
