//! `epx._native`: the per-call path of `epx.Session.run` and `epx.onnxruntime`'s
//! `InferenceSession.run` in native code, for the calls where it is all there is to do: every
//! input a C-contiguous numpy array of exactly the declared element type, every output a numeric
//! tensor. Anything else (a list to convert, a wrong dtype, a strided view, strings, sequences,
//! an input missing) returns `None` and Python takes its own path, which converts or refuses as
//! ONNX Runtime does.
//!
//! The module does not link libepx: Python hands it the addresses of libepx's C functions from
//! the copy it loaded with ctypes, so both work on the same library, its handles and its
//! sessions. Inputs are read in place through the buffer protocol; the GIL is released while
//! libepx runs; outputs become numpy arrays over libepx's own buffers (no copy), which keep the
//! run's outputs alive as long as any of them lives.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

/// `EpxTensorRef` (epx.h).
#[repr(C)]
struct TensorRef {
    name: *const c_char,
    elem_type: i32,
    shape: *const i64,
    ndim: usize,
    data: *const c_void,
    byte_len: usize,
}

type RunFn = unsafe extern "C" fn(
    session: usize,
    inputs: *const TensorRef,
    n_inputs: usize,
    run_options: usize,
    out: *mut usize,
) -> usize;
type OutputsCountFn = unsafe extern "C" fn(outputs: usize) -> usize;
type OutputsGetFn =
    unsafe extern "C" fn(outputs: usize, index: usize, out: *mut TensorRef) -> usize;
type OutputsFreeFn = unsafe extern "C" fn(outputs: usize);
type ErrorCodeFn = unsafe extern "C" fn(error: usize) -> c_int;
type ErrorMessageFn = unsafe extern "C" fn(error: usize) -> *const c_char;
type ErrorFreeFn = unsafe extern "C" fn(error: usize);

/// The libepx functions this module calls.
#[derive(Clone, Copy)]
struct Api {
    run: RunFn,
    outputs_count: OutputsCountFn,
    outputs_get: OutputsGetFn,
    outputs_free: OutputsFreeFn,
    error_code: ErrorCodeFn,
    error_message: ErrorMessageFn,
    error_free: ErrorFreeFn,
}

impl Api {
    /// The functions at the addresses `addresses` names (`{"epx_session_run_with_options": int,
    /// ...}`, from ctypes).
    ///
    /// # Safety
    /// Each address is the named function of one loaded libepx, which stays loaded.
    unsafe fn from_addresses(addresses: &Bound<'_, PyDict>) -> PyResult<Self> {
        let address = |name: &str| -> PyResult<usize> {
            let a: usize = addresses
                .get_item(name)?
                .ok_or_else(|| PyValueError::new_err(format!("no address for `{name}`")))?
                .extract()?;
            if a == 0 {
                return Err(PyValueError::new_err(format!("`{name}` is at address 0")));
            }
            Ok(a)
        };
        // SAFETY: the caller's contract: each address is that function of libepx, whose C
        // signature is the type it is turned into (epx.h).
        unsafe {
            Ok(Api {
                run: std::mem::transmute::<usize, RunFn>(address("epx_session_run_with_options")?),
                outputs_count: std::mem::transmute::<usize, OutputsCountFn>(address(
                    "epx_outputs_count",
                )?),
                outputs_get: std::mem::transmute::<usize, OutputsGetFn>(address(
                    "epx_outputs_get",
                )?),
                outputs_free: std::mem::transmute::<usize, OutputsFreeFn>(address(
                    "epx_outputs_free",
                )?),
                error_code: std::mem::transmute::<usize, ErrorCodeFn>(address("epx_error_code")?),
                error_message: std::mem::transmute::<usize, ErrorMessageFn>(address(
                    "epx_error_message",
                )?),
                error_free: std::mem::transmute::<usize, ErrorFreeFn>(address("epx_error_free")?),
            })
        }
    }

    /// `(code, message)` of a libepx error, which is freed.
    fn take_error<'py>(&self, py: Python<'py>, error: usize) -> PyResult<Bound<'py, PyTuple>> {
        // SAFETY: `error` is a live error libepx returned; read, then freed once.
        let (code, message) = unsafe {
            let code = (self.error_code)(error);
            let text = (self.error_message)(error);
            let message = if text.is_null() {
                String::new()
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            };
            (self.error_free)(error);
            (code, message)
        };
        PyTuple::new(
            py,
            [
                code.into_pyobject(py)?.into_any(),
                message.into_pyobject(py)?.into_any(),
            ],
        )
    }
}

/// The element type (`EpxElementType`) of a buffer's struct-module format in native byte order,
/// with its item size; `None` for any other.
fn element_of_format(format: &[u8], itemsize: isize) -> Option<i32> {
    let code = match format {
        [b'@' | b'=' | b'<', c] if cfg!(target_endian = "little") => *c,
        [b'@' | b'=', c] => *c,
        [c] => *c,
        _ => return None,
    };
    let (elem, size) = match code {
        b'f' => (1, 4),
        b'B' => (2, 1),
        b'b' => (3, 1),
        b'H' => (4, 2),
        b'h' => (5, 2),
        b'i' => (6, 4),
        b'l' | b'q' => (7, 8),
        b'?' => (9, 1),
        b'e' => (10, 2),
        b'd' => (11, 8),
        b'I' => (12, 4),
        b'L' | b'Q' => (13, 8),
        _ => return None,
    };
    (itemsize == size).then_some(elem)
}

/// The struct-module format and item size of an element type's outputs.
fn format_of_element(elem: i32) -> Option<(&'static CStr, isize)> {
    Some(match elem {
        1 => (c"f", 4),
        2 => (c"B", 1),
        3 => (c"b", 1),
        4 => (c"H", 2),
        5 => (c"h", 2),
        6 => (c"i", 4),
        7 => (c"q", 8),
        9 => (c"?", 1),
        10 => (c"e", 2),
        11 => (c"d", 8),
        12 => (c"I", 4),
        13 => (c"Q", 8),
        _ => return None,
    })
}

/// A buffer-protocol view of an input, released when dropped (with the GIL held: it is dropped
/// in `run`, which holds it).
struct InputBuffer(ffi::Py_buffer);

impl Drop for InputBuffer {
    fn drop(&mut self) {
        // SAFETY: filled by a successful PyObject_GetBuffer, released once, under the GIL.
        unsafe { ffi::PyBuffer_Release(&mut self.0) };
    }
}

/// A weak reference to the array that owns `value`'s memory (the end of its `base` chain of
/// arrays), held while libepx reads the buffer: numpy refuses to resize (realloc) an array that
/// has a weak reference, even with `refcheck=False`, while an exported buffer does not stop it.
fn pin<'py>(value: &Bound<'py, PyAny>, ndarray: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    let mut owner = value.clone();
    loop {
        let base = owner.getattr(pyo3::intern!(py, "base"))?;
        if base.is_none() || !base.is_instance(ndarray)? {
            break;
        }
        owner = base;
    }
    // SAFETY: `owner` is live; a new reference or NULL with an exception set.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyWeakref_NewRef(owner.as_ptr(), std::ptr::null_mut()),
        )
    }
}

/// The outputs of one run; freed when the last array over them goes.
struct Outputs {
    api: Api,
    ptr: usize,
}

impl Drop for Outputs {
    fn drop(&mut self) {
        // SAFETY: a live EpxOutputs this value owns; freed once.
        unsafe { (self.api.outputs_free)(self.ptr) };
    }
}

/// One output tensor, exported through the buffer protocol; numpy arrays made from it keep it
/// (and the run's outputs) alive.
#[pyclass(frozen)]
struct OutputBuffer {
    _owner: Arc<Outputs>,
    data: usize,
    len: isize,
    itemsize: isize,
    format: &'static CStr,
    shape: Vec<isize>,
    strides: Vec<isize>,
}

#[pymethods]
impl OutputBuffer {
    /// # Safety
    /// Called by the interpreter with a writable `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyValueError::new_err("NULL Py_buffer"));
        }
        let me = slf.get();
        // SAFETY: `view` is the interpreter's to fill; every pointer put in it (shape, strides,
        // format, data) lives as long as `slf`, which the view holds a reference to.
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = me.data as *mut c_void;
            (*view).len = me.len;
            (*view).readonly = 0;
            (*view).itemsize = me.itemsize;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
                me.format.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = me.shape.len() as c_int;
            (*view).shape = me.shape.as_ptr().cast_mut();
            (*view).strides = me.strides.as_ptr().cast_mut();
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// # Safety
    /// Called by the interpreter.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Raw pointers handed to the thread that runs without the GIL.
struct Call {
    session: usize,
    refs: *const TensorRef,
    n: usize,
    run_options: usize,
}
// SAFETY: the pointers are into buffers `run` keeps alive (and does not touch) until the call
// returns; libepx may be called from any thread.
unsafe impl Send for Call {}

/// The per-call path of one session.
#[pyclass(frozen)]
struct Runner {
    api: Api,
    session: usize,
    /// Per input, in the model's order: its name (C string) and element type.
    inputs: Vec<(CString, i32)>,
    input_index: HashMap<String, usize>,
    output_names: Vec<Py<PyString>>,
    output_index: HashMap<String, usize>,
    /// `numpy.ndarray`, `numpy.asarray`, and `numpy.zeros` (for outputs with no elements).
    ndarray: Py<PyAny>,
    asarray: Py<PyAny>,
    zeros: Py<PyAny>,
    /// Whether a run may keep the GIL when it is short ([`GilRule`]).
    gil: GilRule,
}

/// When a run keeps the GIL. Releasing it and taking it back costs two thread hand-offs when
/// another Python thread waits for it, which can be more than a small model's whole run; like
/// numpy below its size threshold, such a run keeps the GIL. A run of a session that may hold
/// it (every node on the CPU EP in this process, no control flow: its time follows its inputs'
/// size, and nothing in it waits) keeps it while the previous run took under `below_ns` (10 µs
/// from `epx._fast`) and its inputs are no larger than that run's. Any other run releases it, and the first.
struct GilRule {
    may_hold: bool,
    /// The longest previous run (ns) after which a run may keep the GIL.
    below_ns: u64,
    /// The previous run's compute time (ns) and input bytes; `u64::MAX` before any.
    last_ns: AtomicU64,
    last_bytes: AtomicU64,
}

impl GilRule {
    fn new(may_hold: bool, below_ns: u64) -> GilRule {
        GilRule {
            may_hold,
            below_ns,
            last_ns: AtomicU64::new(u64::MAX),
            last_bytes: AtomicU64::new(0),
        }
    }

    /// Whether a run on inputs of `bytes` keeps the GIL.
    fn holds(&self, bytes: u64) -> bool {
        self.may_hold
            && self.last_ns.load(Ordering::Relaxed) < self.below_ns
            && bytes <= self.last_bytes.load(Ordering::Relaxed)
    }

    fn record(&self, ns: u64, bytes: u64) {
        self.last_ns.store(ns, Ordering::Relaxed);
        self.last_bytes.store(bytes, Ordering::Relaxed);
    }
}

#[pymethods]
impl Runner {
    /// `addresses`: libepx's functions (see `Api`); `session`: the session's handle;
    /// `inputs`: `[(name, element type)]` in the model's order; `outputs`: the output names in
    /// the model's order; `numpy`: the numpy module.
    ///
    /// `may_hold_gil`: whether a short run may keep the GIL, and `hold_below_ns` how short
    /// ([`GilRule`]).
    ///
    /// The addresses must be those of the libepx that made `session` and stays loaded.
    #[new]
    #[pyo3(signature = (addresses, session, inputs, outputs, numpy, may_hold_gil=false, hold_below_ns=10_000))]
    fn new(
        addresses: &Bound<'_, PyDict>,
        session: usize,
        inputs: Vec<(String, i32)>,
        outputs: Vec<Bound<'_, PyString>>,
        numpy: &Bound<'_, PyAny>,
        may_hold_gil: bool,
        hold_below_ns: u64,
    ) -> PyResult<Self> {
        // SAFETY: the constructor's documented contract (epx._fast is its one caller).
        let api = unsafe { Api::from_addresses(addresses) }?;
        let mut input_index = HashMap::with_capacity(inputs.len());
        let mut named = Vec::with_capacity(inputs.len());
        for (i, (name, elem)) in inputs.into_iter().enumerate() {
            let c = CString::new(name.clone())
                .map_err(|_| PyValueError::new_err(format!("input name {name:?} holds NUL")))?;
            input_index.insert(name, i);
            named.push((c, elem));
        }
        let mut output_index = HashMap::with_capacity(outputs.len());
        for (i, name) in outputs.iter().enumerate() {
            output_index.insert(name.to_str()?.to_owned(), i);
        }
        Ok(Runner {
            api,
            session,
            inputs: named,
            input_index,
            output_names: outputs.into_iter().map(Bound::unbind).collect(),
            output_index,
            ndarray: numpy.getattr("ndarray")?.unbind(),
            asarray: numpy.getattr("asarray")?.unbind(),
            zeros: numpy.getattr("zeros")?.unbind(),
            gil: GilRule::new(may_hold_gil, hold_below_ns),
        })
    }

    /// Whether the next run on inputs of `bytes` keeps the GIL ([`GilRule`]).
    fn keeps_gil(&self, bytes: u64) -> bool {
        self.gil.holds(bytes)
    }

    /// Runs on `feed` and returns the outputs `output_names` names (all, in the model's order,
    /// for None) as a list of numpy arrays; `(code, message)` when libepx fails; None when this
    /// path does not apply (Python's handles the call).
    #[pyo3(signature = (feed, output_names=None, run_options=0))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        feed: &Bound<'py, PyDict>,
        output_names: Option<&Bound<'py, PyAny>>,
        run_options: usize,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let n = self.inputs.len();
        if feed.len() != n {
            return Ok(None);
        }
        let wanted = match output_names {
            None => None,
            Some(o) if o.is_none() => None,
            Some(o) => {
                let list = o.cast::<PyList>().map_err(PyErr::from);
                let Ok(list) = list else { return Ok(None) };
                if list.is_empty() {
                    None
                } else {
                    let mut idx = Vec::with_capacity(list.len());
                    for name in list.iter() {
                        let Ok(s) = name.cast::<PyString>() else {
                            return Ok(None);
                        };
                        match self.output_index.get(s.to_str()?) {
                            Some(&i) => idx.push(i),
                            None => return Ok(None),
                        }
                    }
                    Some(idx)
                }
            }
        };
        let ndarray = self.ndarray.bind(py);
        let mut buffers: Vec<InputBuffer> = Vec::with_capacity(n);
        let mut pins: Vec<Bound<'py, PyAny>> = Vec::with_capacity(n);
        let mut shapes: Vec<Vec<i64>> = Vec::with_capacity(n);
        let mut order: Vec<usize> = Vec::with_capacity(n);
        for (key, value) in feed.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Ok(None);
            };
            let Some(&i) = self.input_index.get(key.to_str()?) else {
                return Ok(None);
            };
            if !value.get_type().is(ndarray) {
                return Ok(None);
            }
            // Before the buffer is taken: from here to the end of the run, no resize.
            pins.push(pin(&value, ndarray)?);
            // SAFETY: a zeroed Py_buffer is what PyObject_GetBuffer fills.
            let mut view: ffi::Py_buffer = unsafe { std::mem::zeroed() };
            let flags = ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT;
            // SAFETY: `value` is a live object; `view` is writable.
            if unsafe { ffi::PyObject_GetBuffer(value.as_ptr(), &mut view, flags) } != 0 {
                PyErr::take(py); // not C-contiguous: Python's path copies it
                return Ok(None);
            }
            let view = InputBuffer(view);
            // SAFETY: filled by PyObject_GetBuffer with PyBUF_FORMAT: a C string or NULL.
            let format = unsafe { view.0.format.as_ref() }
                .map(|f| unsafe { CStr::from_ptr(f) }.to_bytes())
                .unwrap_or(b"B");
            if element_of_format(format, view.0.itemsize) != Some(self.inputs[i].1) {
                return Ok(None);
            }
            let ndim = usize::try_from(view.0.ndim).unwrap_or(0);
            let shape: Vec<i64> = if ndim == 0 {
                Vec::new()
            } else {
                // SAFETY: PyBUF_C_CONTIGUOUS fills `shape` with `ndim` extents.
                unsafe { std::slice::from_raw_parts(view.0.shape, ndim) }
                    .iter()
                    .map(|&d| d as i64)
                    .collect()
            };
            order.push(i);
            shapes.push(shape);
            buffers.push(view);
        }
        let refs: Vec<TensorRef> = order
            .iter()
            .zip(&buffers)
            .zip(&shapes)
            .map(|((&i, b), shape)| TensorRef {
                name: self.inputs[i].0.as_ptr(),
                elem_type: self.inputs[i].1,
                shape: shape.as_ptr(),
                ndim: shape.len(),
                data: b.0.buf,
                byte_len: usize::try_from(b.0.len).unwrap_or(0),
            })
            .collect();
        let call = Call {
            session: self.session,
            refs: refs.as_ptr(),
            n: refs.len(),
            run_options,
        };
        let run = self.api.run;
        let bytes: u64 = refs.iter().map(|r| r.byte_len as u64).sum();
        let compute = move || {
            let call = call;
            let mut out = 0usize;
            let start = Instant::now();
            // SAFETY: `refs`, the names, shapes and input buffers they point into stay alive and
            // unchanged here until this returns; the handles are libepx's to check.
            let error = unsafe { run(call.session, call.refs, call.n, call.run_options, &mut out) };
            (error, out, start.elapsed())
        };
        let (error, out, took) = if self.gil.holds(bytes) {
            compute()
        } else {
            py.detach(compute)
        };
        // A failed run says nothing about how long a run takes (a refusal is fast whatever
        // the inputs): the next run releases the GIL.
        let took_ns = if error == 0 {
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        self.gil.record(took_ns, bytes);
        drop(refs);
        drop(buffers);
        drop(pins);
        if error != 0 {
            return Ok(Some(self.api.take_error(py, error)?.into_any()));
        }
        let owner = Arc::new(Outputs {
            api: self.api,
            ptr: out,
        });
        // SAFETY: live outputs.
        let count = unsafe { (self.api.outputs_count)(out) };
        let picks: Vec<usize> = wanted.unwrap_or_else(|| (0..count).collect());
        let result = PyList::empty(py);
        for i in picks {
            // SAFETY: a zeroed TensorRef is what epx_outputs_get fills.
            let mut t: TensorRef = unsafe { std::mem::zeroed() };
            // SAFETY: live outputs; `t` writable.
            let error = unsafe { (self.api.outputs_get)(out, i, &mut t) };
            if error != 0 {
                return Ok(Some(self.api.take_error(py, error)?.into_any()));
            }
            let Some((format, itemsize)) = format_of_element(t.elem_type) else {
                return Err(PyValueError::new_err(format!(
                    "output `{}` has element type {}, which has no numpy dtype here",
                    self.output_names[i].bind(py),
                    t.elem_type
                )));
            };
            let shape: Vec<isize> = if t.ndim == 0 {
                Vec::new()
            } else {
                // SAFETY: `ndim` extents, valid while the outputs live.
                unsafe { std::slice::from_raw_parts(t.shape, t.ndim) }
                    .iter()
                    .map(|&d| d as isize)
                    .collect()
            };
            if t.byte_len == 0 || t.data.is_null() {
                let dims = PyTuple::new(py, &shape)?;
                let dtype = format.to_str().unwrap_or("B");
                result.append(self.zeros.bind(py).call1((dims, dtype))?)?;
                continue;
            }
            let mut strides = vec![itemsize; shape.len()];
            for k in (0..shape.len().saturating_sub(1)).rev() {
                strides[k] = strides[k + 1] * shape[k + 1].max(1);
            }
            let view = OutputBuffer {
                _owner: Arc::clone(&owner),
                data: t.data as usize,
                len: t.byte_len as isize,
                itemsize,
                format,
                shape,
                strides,
            };
            let array = self.asarray.bind(py).call1((Bound::new(py, view)?,))?;
            result.append(array)?;
        }
        Ok(Some(result.into_any()))
    }
}

// SAFETY: `Outputs` holds a handle of libepx outputs, which may be read and freed from any
// thread; nothing mutates it after construction.
unsafe impl Send for Outputs {}
// SAFETY: as above.
unsafe impl Sync for Outputs {}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Runner>()?;
    m.add_class::<OutputBuffer>()?;
    Ok(())
}
