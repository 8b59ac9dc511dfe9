//! Running a session: inputs as plain buffers, DLPack tensors or values, and `EpxOutputs`,
//! the outputs of one run.

use super::*;
use crate::handle::Handles;

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

pub(crate) struct OutputRow {
    pub(crate) name: CString,
    pub(crate) value: EpxHostValue,
    pub(crate) shape: Vec<i64>,
    /// For numeric tensor outputs, a DLTensor over the value's data.
    pub(crate) dl: Option<DLTensor>,
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

/// A run's options: its terminate flag, which another thread sets to cancel the runs made with
/// them (ONNX Runtime's `RunOptions.terminate`), and which a session's creation can watch too
/// ([`epx_session_options_set_cancellation`](crate::epx_session_options_set_cancellation)). A
/// handle, not an address: freeing it while a run uses it is safe.
pub struct EpxRunOptions {
    _private: [u8; 0],
}

/// The live run option sets.
pub(crate) static RUN_OPTIONS: Handles<epx_host::RunOptions, EpxRunOptions> =
    Handles::new(4, "run option set", "epx_run_options_free");

/// New run options, the terminate flag clear.
#[unsafe(no_mangle)]
pub extern "C" fn epx_run_options_new() -> *mut EpxRunOptions {
    ffi_boundary!(RUN_OPTIONS.insert(epx_host::RunOptions::new()))
}

/// Frees run options. NULL, or options freed already, is a no-op; a run in progress with them
/// keeps its own reference.
///
/// Pointers: `options` is NULL or from [`epx_run_options_new`].
#[unsafe(no_mangle)]
pub extern "C" fn epx_run_options_free(options: *mut EpxRunOptions) {
    ffi_boundary!(drop(RUN_OPTIONS.remove(options)))
}

/// Sets (`true`) or clears the terminate flag, from any thread. Runs in progress with these
/// options stop at their next check (before each kernel; inside EPs that read the flag, such as
/// the CPU EP, before each node and at each loop iteration) and fail with
/// `EPX_ERROR_CODE_CANCELLED`; so does a session creation watching them. While set, runs made
/// with these options fail at once.
///
/// Pointers: `options` is live run options.
#[unsafe(no_mangle)]
pub extern "C" fn epx_run_options_set_terminate(
    options: *const EpxRunOptions,
    terminate: bool,
) -> *mut EpxError {
    ffi_boundary!(
        RUN_OPTIONS
            .get(options, "options")
            .map(|o| o.set_terminate(terminate))
    )
}

/// The outputs of one run, in host memory, in the model's output order. Free with
/// [`epx_outputs_free`].
pub struct EpxOutputs {
    pub(crate) rows: Vec<OutputRow>,
}

// SAFETY: the raw pointers in each `DLTensor` point into the same row's tensor and shape, which
// the row owns and never mutates after construction.
unsafe impl Send for EpxOutputs {}

pub(crate) fn shape_of(dims: &[i64], what: &str) -> Res<Vec<usize>> {
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| invalid(format!("{what}: negative extent {d}"))))
        .collect()
}

pub(crate) fn element_type(code: i32, what: &str) -> Res<ElementType> {
    ElementType::from_onnx(code)
        .filter(|t| *t != ElementType::Undefined)
        .ok_or_else(|| invalid(format!("{what}: {code} is not an EpxElementType")))
}

/// Runs `f` under the session's tensor limit (the process's for a NULL session), so that the
/// input tensors made from the caller's buffers are held to it too.
fn within_limits<R>(session: *const EpxSession, f: impl FnOnce() -> R) -> R {
    match SESSIONS.get(session, "session") {
        Ok(s) => s.session.within_limits(f),
        Err(_) => f(),
    }
}

pub(crate) fn run_session(
    session: *const EpxSession,
    inputs: Vec<(String, Value)>,
    run_options: *const EpxRunOptions,
    out: Option<&mut MaybeUninit<*mut EpxOutputs>>,
) -> Res<()> {
    let Some(out) = out else {
        return Err(invalid("`out` is NULL"));
    };
    // This run's own reference: epx_session_free on another thread cannot drop the session
    // under it.
    let s = SESSIONS.get(session, "session")?;
    let options = if run_options.is_null() {
        None
    } else {
        Some(RUN_OPTIONS.get(run_options, "run_options")?)
    };
    let outputs = s.session.run_with_options(inputs, options.as_deref())?;
    // bounded: one per model output.
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
    put(Some(out), "out", Box::into_raw(boxed))
}

/// A tensor from an [`EpxTensorRef`] (data copied).
///
/// # Safety
/// The pointers in `r` are valid as [`EpxTensorRef`] describes.
pub(crate) unsafe fn tensor_from_ref(r: &EpxTensorRef, what: &str) -> Res<Tensor> {
    let elem = element_type(r.elem_type, what)?;
    if elem == ElementType::String {
        return Err(invalid(format!(
            "{what}: string tensors are made with epx_value_new_strings"
        )));
    }
    // SAFETY: `r.shape` is NULL or points at `r.ndim` elements, per this function's contract.
    let dims = unsafe { slice(r.shape, r.ndim, &format!("{what} shape")) }?;
    let shape = shape_of(dims, what)?;
    // SAFETY: `r.data` is NULL or points at `r.byte_len` elements, per this function's contract.
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
    out: Option<&mut MaybeUninit<*mut EpxOutputs>>,
) -> *mut EpxError {
    // SAFETY: this function's contract is the one below, with no run options.
    unsafe { epx_session_run_with_options(session, inputs, n_inputs, std::ptr::null(), out) }
}

/// [`epx_session_run`] with run options: `run_options` (NULL for none) lets another thread
/// cancel the run ([`epx_run_options_set_terminate`]).
///
/// # Safety
/// As for [`epx_session_run`]; `run_options` is NULL or live run options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_run_with_options(
    session: *const EpxSession,
    inputs: *const EpxTensorRef,
    n_inputs: usize,
    run_options: *const EpxRunOptions,
    out: Option<&mut MaybeUninit<*mut EpxOutputs>>,
) -> *mut EpxError {
    ffi_boundary!(within_limits(session, || {
        // SAFETY: `inputs` is NULL or points at `n_inputs` elements, per this function's contract.
        let refs = unsafe { slice(inputs, n_inputs, "inputs") }?;
        // bounded: one per input the caller passed (its array holds that many).
        let mut tensors = Vec::with_capacity(refs.len());
        for (i, r) in refs.iter().enumerate() {
            // SAFETY: `r.name` is NULL or a NUL-terminated string, per this function's contract.
            let name = unsafe { text(r.name, &format!("inputs[{i}].name")) }?;
            // SAFETY: the pointers in `r` are valid as `EpxTensorRef` documents, per this
            // function's contract.
            let t = unsafe { tensor_from_ref(r, &format!("input `{name}`")) }?;
            tensors.push((name.to_string(), Value::Host(t)));
        }
        run_session(session, tensors, run_options, out)
    }))
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
    out: Option<&mut MaybeUninit<*mut EpxOutputs>>,
) -> *mut EpxError {
    ffi_boundary!(within_limits(session, || {
        // SAFETY: `input_names` is NULL or points at `n_inputs` elements, per this function's
        // contract.
        let names = unsafe { slice(input_names, n_inputs, "input_names") }?;
        // SAFETY: `inputs` is NULL or points at `n_inputs` elements, per this function's contract.
        let dls = unsafe { slice(inputs, n_inputs, "inputs") }?;
        // bounded: one per input the caller passed (its arrays hold that many).
        let mut tensors = Vec::with_capacity(n_inputs);
        for (i, (&n, &t)) in names.iter().zip(dls).enumerate() {
            // SAFETY: `n` is NULL or a NUL-terminated string, per this function's contract.
            let name = unsafe { text(n, &format!("input_names[{i}]")) }?;
            // SAFETY: `t` is NULL or a live object of its type, per this function's contract.
            let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(format!("inputs[{i}] is NULL")))?;
            tensors.push((name.to_string(), Value::Host(tensor_from_dl(t, name)?)));
        }
        run_session(session, tensors, std::ptr::null(), out)
    }))
}

pub(crate) fn tensor_from_dl(t: &DLTensor, name: &str) -> Res<Tensor> {
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
/// Pointers: `outputs` is NULL or live outputs.
#[unsafe(no_mangle)]
pub extern "C" fn epx_outputs_count(outputs: Option<&EpxOutputs>) -> usize {
    ffi_boundary!(outputs.map_or(0, |o| o.rows.len()))
}

pub(crate) fn output_row(outputs: Option<&EpxOutputs>, index: usize) -> Res<&OutputRow> {
    let o = object(outputs, "outputs")?;
    o.rows.get(index).ok_or_else(|| {
        invalid(format!(
            "output index {index} out of range (there are {})",
            o.rows.len()
        ))
    })
}

/// Output `index` as name, element type, shape and data (valid until `outputs` is freed).
///
/// Pointers: `outputs` is live outputs; `out` writable.
#[unsafe(no_mangle)]
pub extern "C" fn epx_outputs_get(
    outputs: Option<&EpxOutputs>,
    index: usize,
    out: Option<&mut MaybeUninit<EpxTensorRef>>,
) -> *mut EpxError {
    ffi_boundary!({
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
        put(out, "out", r)
    })
}

/// Output `index` as a DLPack tensor in host memory (valid until `outputs` is freed; do not
/// modify it). `*name` (may be NULL) receives the output's name.
///
/// # Safety
/// `outputs` is live outputs; `tensor` writable; `name` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_dltensor(
    outputs: Option<&EpxOutputs>,
    index: usize,
    name: Option<&mut MaybeUninit<*const c_char>>,
    tensor: Option<&mut MaybeUninit<*const DLTensor>>,
) -> *mut EpxError {
    ffi_boundary!({
        let row = output_row(outputs, index)?;
        if let Some(name) = name {
            name.write(row.name.as_ptr());
        }
        row.tensor()?;
        let dl = row
            .dl
            .as_ref()
            .ok_or_else(|| invalid("output has no DLPack form"))?;
        put(tensor, "tensor", dl as *const DLTensor)
    })
}

/// Frees the outputs of a run. NULL is a no-op.
///
/// # Safety
/// `outputs` is NULL or from a run, freed only once.
#[unsafe(no_mangle)]
pub extern "C" fn epx_outputs_free(outputs: Option<Box<EpxOutputs>>) {
    ffi_boundary!(drop(outputs))
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
    out: Option<&mut MaybeUninit<*mut EpxOutputs>>,
) -> *mut EpxError {
    // SAFETY: this function's contract is the one below, with no run options.
    unsafe {
        epx_session_run_values_with_options(
            session,
            input_names,
            inputs,
            n_inputs,
            std::ptr::null(),
            out,
        )
    }
}

/// [`epx_session_run_values`] with run options: `run_options` (NULL for none) lets another
/// thread cancel the run ([`epx_run_options_set_terminate`]).
///
/// # Safety
/// As for [`epx_session_run_values`]; `run_options` is NULL or live run options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_session_run_values_with_options(
    session: *const EpxSession,
    input_names: *const *const c_char,
    inputs: *const *const EpxHostValue,
    n_inputs: usize,
    run_options: *const EpxRunOptions,
    out: Option<&mut MaybeUninit<*mut EpxOutputs>>,
) -> *mut EpxError {
    ffi_boundary!(within_limits(session, || {
        // SAFETY: `input_names` is NULL or points at `n_inputs` elements, per this function's
        // contract.
        let names = unsafe { slice(input_names, n_inputs, "input_names") }?;
        // SAFETY: `inputs` is NULL or points at `n_inputs` elements, per this function's contract.
        let values = unsafe { slice(inputs, n_inputs, "inputs") }?;
        // bounded: one per input the caller passed (its arrays hold that many).
        let mut feed = Vec::with_capacity(n_inputs);
        for (i, (&n, &v)) in names.iter().zip(values).enumerate() {
            // SAFETY: `n` is NULL or a NUL-terminated string, per this function's contract.
            let name = unsafe { text(n, &format!("input_names[{i}]")) }?;
            // SAFETY: `v` is NULL or a live object of its type, per this function's contract.
            let v = object(unsafe { v.as_ref() }, &format!("inputs[{i}]"))?;
            feed.push((name.to_string(), v.to_value()?));
        }
        run_session(session, feed, run_options, out)
    }))
}

/// Output `index` as a value of any kind (borrowed from `outputs`); `*name` (may be NULL)
/// receives its name.
///
/// # Safety
/// `outputs` is live outputs; `value` writable; `name` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_outputs_value(
    outputs: Option<&EpxOutputs>,
    index: usize,
    name: Option<&mut MaybeUninit<*const c_char>>,
    value: Option<&mut MaybeUninit<*const EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        let row = output_row(outputs, index)?;
        if let Some(name) = name {
            name.write(row.name.as_ptr());
        }
        put(value, "value", &row.value as *const EpxHostValue)
    })
}
impl PanicPointee for EpxOutputs {}
impl PanicPointee for EpxRunOptions {}
