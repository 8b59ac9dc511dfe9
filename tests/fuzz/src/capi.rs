//! The `capi` target: `epx_session_run` of libepx.so, called through its C ABI as an
//! application calls it, with inputs whose names, element types, ranks, extents and buffer
//! lengths come from the fuzz input. The buffers are real memory of the stated length (the C
//! API's contract); everything else may be wrong, and the library must say so.

use std::ffi::{CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

#[repr(C)]
struct TensorRef {
    name: *const c_char,
    elem_type: i32,
    shape: *const i64,
    ndim: usize,
    data: *const c_void,
    byte_len: usize,
}

type Opaque = c_void;

/// The functions used, looked up once.
struct Api {
    _lib: Library,
    env_new: unsafe extern "C" fn(
        *const *const c_char,
        usize,
        *const Opaque,
        *mut *mut Opaque,
    ) -> *mut Opaque,
    session_new_from_bytes: unsafe extern "C" fn(
        *const Opaque,
        *const c_void,
        usize,
        *const Opaque,
        *mut *mut Opaque,
    ) -> *mut Opaque,
    session_run: unsafe extern "C" fn(
        *const Opaque,
        *const TensorRef,
        usize,
        *mut *mut Opaque,
    ) -> *mut Opaque,
    outputs_count: unsafe extern "C" fn(*const Opaque) -> usize,
    outputs_get: unsafe extern "C" fn(*const Opaque, usize, *mut TensorRef) -> *mut Opaque,
    outputs_free: unsafe extern "C" fn(*mut Opaque),
    error_free: unsafe extern "C" fn(*mut Opaque),
    set_max_tensor_bytes: unsafe extern "C" fn(u64) -> u64,
}

/// A session of libepx and what its inputs are called.
struct Model {
    session: *mut Opaque,
    /// Name, declared element type (ONNX number) and extents (dynamic ones as 1).
    inputs: Vec<(CString, i32, Vec<i64>)>,
}

struct State {
    api: Api,
    models: Vec<Model>,
}

// SAFETY: the sessions are only used through libepx's run entry, which the C API documents as
// callable from any thread; the pointers are never freed while the process lives.
unsafe impl Send for State {}
// SAFETY: as above; nothing here is mutated after setup.
unsafe impl Sync for State {}

/// libepx.so next to this executable (both are in cargo's target folder).
fn library_path() -> PathBuf {
    let exe = std::env::current_exe().expect("own executable");
    exe.parent().expect("executable folder").join("libepx.so")
}

fn setup(repo: &Path) -> State {
    let path = library_path();
    // SAFETY: libepx.so is this workspace's own C API library; loading it runs Rust static
    // constructors only.
    let lib = unsafe { Library::new(&path) }.unwrap_or_else(|e| {
        panic!(
            "cannot load {}: {e}; build it first (cargo build -p epx-capi)",
            path.display()
        )
    });
    // SAFETY: each symbol is looked up with the signature epx.h declares for it.
    let api = unsafe {
        Api {
            env_new: *lib.get(b"epx_env_new\0").expect("epx_env_new"),
            session_new_from_bytes: *lib
                .get(b"epx_session_new_from_bytes\0")
                .expect("epx_session_new_from_bytes"),
            session_run: *lib.get(b"epx_session_run\0").expect("epx_session_run"),
            outputs_count: *lib.get(b"epx_outputs_count\0").expect("epx_outputs_count"),
            outputs_get: *lib.get(b"epx_outputs_get\0").expect("epx_outputs_get"),
            outputs_free: *lib.get(b"epx_outputs_free\0").expect("epx_outputs_free"),
            error_free: *lib.get(b"epx_error_free\0").expect("epx_error_free"),
            set_max_tensor_bytes: *lib
                .get(b"epx_set_max_tensor_bytes\0")
                .expect("epx_set_max_tensor_bytes"),
            _lib: lib,
        }
    };
    // SAFETY: plain value in, plain value out.
    unsafe { (api.set_max_tensor_bytes)(crate::targets::TENSOR_LIMIT) };
    let mut env = std::ptr::null_mut();
    // SAFETY: no plugin folders (NULL, 0), no default providers; `env` is writable.
    let e = unsafe { (api.env_new)(std::ptr::null(), 0, std::ptr::null(), &mut env) };
    assert!(e.is_null() && !env.is_null(), "epx_env_new failed");
    let mut models = Vec::new();
    for name in ["add", "mlp-int", "mnist-cnn"] {
        let file = repo.join(format!("examples/models/{name}.onnx"));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut session = std::ptr::null_mut();
        // SAFETY: `bytes` is readable for its length; `session` is writable.
        let e = unsafe {
            (api.session_new_from_bytes)(
                env,
                bytes.as_ptr().cast(),
                bytes.len(),
                std::ptr::null(),
                &mut session,
            )
        };
        assert!(e.is_null(), "{name}: epx_session_new_from_bytes failed");
        // Names and shapes from the Rust API, which reads the same model.
        let spec = epx::onnx::load_model_bytes(&bytes, name, None).expect("model");
        let inputs = spec
            .graph
            .inputs
            .iter()
            .map(|&v| {
                let value = &spec.graph.values[v];
                let (elem, dims) = match &value.ty {
                    epx::ir::ValueType::Tensor { elem_type, shape } => (
                        elem_type.map_or(1, |t| t as i32),
                        shape
                            .iter()
                            .flatten()
                            .map(|d| match d {
                                epx::ir::Dim::Known(n) => *n as i64,
                                _ => 1,
                            })
                            .collect(),
                    ),
                    _ => (1, Vec::new()),
                };
                (
                    CString::new(value.name.clone()).expect("a name without NUL"),
                    elem,
                    dims,
                )
            })
            .collect();
        models.push(Model { session, inputs });
    }
    State { api, models }
}

/// Reads choices from the fuzz input; zeros once it is used up.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn extent(&mut self) -> i64 {
        match self.byte() % 12 {
            0 => 0,
            1 => -1,
            2 => 1 << 31,
            3 => 1 << 40,
            4 => i64::MAX,
            5 => 28,
            n => i64::from(n) - 5,
        }
    }
}

fn element_bytes(elem_type: i32) -> usize {
    match elem_type {
        1 | 6 | 12 => 4,
        7 | 11 | 13 | 14 => 8,
        4 | 5 | 10 | 16 => 2,
        15 => 16,
        _ => 1,
    }
}

/// The most bytes one fuzzed input buffer gets.
const MAX_BUFFER: usize = 1 << 20;

pub fn run(input: &[u8]) -> bool {
    static STATE: OnceLock<State> = OnceLock::new();
    let state = STATE.get_or_init(|| setup(&crate::repo()));
    let mut c = Choices(input);
    let model = &state.models[usize::from(c.byte()) % state.models.len()];
    // Half the inputs start from a valid call (every input, declared type and shape, exact
    // length) with one thing changed at most; the rest are made up from scratch.
    if c.byte() % 2 == 0 {
        return valid_then_changed(state, model, &mut c);
    }
    let n = usize::from(c.byte() % 4);
    let bad_name = CString::new("no such input").expect("no NUL");
    let empty = CString::default();
    let mut shapes: Vec<Vec<i64>> = Vec::with_capacity(n);
    let mut buffers: Vec<Vec<u8>> = Vec::with_capacity(n);
    let mut meta: Vec<(*const c_char, i32, bool)> = Vec::with_capacity(n);
    for _ in 0..n {
        let pick = usize::from(c.byte());
        let (name, declared) = match pick % 8 {
            6 => (bad_name.as_ptr(), Vec::new()),
            7 => (empty.as_ptr(), Vec::new()),
            _ => {
                let (name, _, dims) = &model.inputs[pick % model.inputs.len()];
                (name.as_ptr(), dims.clone())
            }
        };
        let elem_type = match c.byte() % 6 {
            0 => i32::from(c.byte() % 40),
            1 => 7,
            _ => 1,
        };
        let shape: Vec<i64> = if c.byte() % 3 == 0 {
            declared
        } else {
            (0..c.byte() % 9).map(|_| c.extent()).collect()
        };
        let exact = shape
            .iter()
            .try_fold(element_bytes(elem_type), |acc, &d| {
                acc.checked_mul(usize::try_from(d).ok()?)
            })
            .unwrap_or(usize::MAX);
        let len = match c.byte() % 4 {
            0 | 1 => exact.min(MAX_BUFFER),
            2 => exact.saturating_sub(1).min(MAX_BUFFER),
            _ => usize::from(c.byte()),
        };
        let fill = c.byte();
        buffers.push(vec![fill; len]);
        let null_data = len == 0 && c.byte() % 2 == 0;
        shapes.push(shape);
        meta.push((name, elem_type, null_data));
    }
    let refs: Vec<TensorRef> = meta
        .iter()
        .zip(&shapes)
        .zip(&buffers)
        .map(|((&(name, elem_type, null_data), shape), buf)| {
            tensor_ref(name, elem_type, shape, buf, null_data)
        })
        .collect();
    call(state, model, &refs)
}

/// Every input of `model` as declared, then (mostly) one change: a type, an extent, the rank,
/// a buffer length, a name, or an input left out.
fn valid_then_changed(state: &State, model: &Model, c: &mut Choices<'_>) -> bool {
    let mut shapes: Vec<Vec<i64>> = model.inputs.iter().map(|(_, _, d)| d.clone()).collect();
    let mut types: Vec<i32> = model.inputs.iter().map(|(_, t, _)| *t).collect();
    let mut names: Vec<*const c_char> = model.inputs.iter().map(|(n, _, _)| n.as_ptr()).collect();
    let bad_name = CString::new("no such input").expect("no NUL");
    let which = usize::from(c.byte()) % names.len().max(1);
    let mut short = false;
    let change = c.byte() % 8;
    if !names.is_empty() {
        match change {
            0 => types[which] = i32::from(c.byte() % 40),
            1 => {
                let n = shapes[which].len();
                if n > 0 {
                    let d = usize::from(c.byte()) % n;
                    shapes[which][d] = c.extent();
                }
            }
            2 => {
                if c.byte() % 2 == 0 {
                    shapes[which].push(c.extent());
                } else {
                    shapes[which].pop();
                }
            }
            3 => short = true,
            4 => names[which] = bad_name.as_ptr(),
            5 => {
                names.remove(which);
                shapes.remove(which);
                types.remove(which);
            }
            _ => {}
        }
    }
    let buffers: Vec<Vec<u8>> = shapes
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(i, (shape, &t))| {
            let exact = shape
                .iter()
                .try_fold(element_bytes(t), |acc, &d| {
                    acc.checked_mul(usize::try_from(d).ok()?)
                })
                .unwrap_or(usize::MAX)
                .min(MAX_BUFFER);
            let len = if short && i == which.min(shapes.len().saturating_sub(1)) {
                exact.saturating_sub(1)
            } else {
                exact
            };
            let fill = c.byte();
            (0..len).map(|j| fill.wrapping_add(j as u8)).collect()
        })
        .collect();
    let refs: Vec<TensorRef> = names
        .iter()
        .zip(&types)
        .zip(shapes.iter().zip(&buffers))
        .map(|((&name, &elem_type), (shape, buf))| tensor_ref(name, elem_type, shape, buf, false))
        .collect();
    call(state, model, &refs)
}

/// The C description of one input: `shape` and `buf` are borrowed (NULL when empty, or when
/// `null_data` asks for a NULL data pointer).
fn tensor_ref(
    name: *const c_char,
    elem_type: i32,
    shape: &[i64],
    buf: &[u8],
    null_data: bool,
) -> TensorRef {
    TensorRef {
        name,
        elem_type,
        shape: if shape.is_empty() {
            std::ptr::null()
        } else {
            shape.as_ptr()
        },
        ndim: shape.len(),
        data: if null_data {
            std::ptr::null()
        } else {
            buf.as_ptr().cast()
        },
        byte_len: buf.len(),
    }
}

/// One `epx_session_run`; reads every output it returns. Whether the run worked.
fn call(state: &State, model: &Model, refs: &[TensorRef]) -> bool {
    let api = &state.api;
    let mut outs = std::ptr::null_mut();
    // SAFETY: every name is a NUL-terminated string alive for the call, every shape has `ndim`
    // extents, every data pointer is readable for `byte_len` bytes (or NULL with 0 bytes), and
    // `outs` is writable: what the C API asks of its caller.
    let e = unsafe { (api.session_run)(model.session, refs.as_ptr(), refs.len(), &mut outs) };
    if !e.is_null() {
        // SAFETY: an error the library returned, freed once.
        unsafe { (api.error_free)(e) };
        return false;
    }
    // SAFETY: `outs` is the outputs object the run returned; each output is read within the
    // byte length the library reports, then the object is freed once.
    unsafe {
        for i in 0..(api.outputs_count)(outs) {
            let mut r = TensorRef {
                name: std::ptr::null(),
                elem_type: 0,
                shape: std::ptr::null(),
                ndim: 0,
                data: std::ptr::null(),
                byte_len: 0,
            };
            let e = (api.outputs_get)(outs, i, &mut r);
            if !e.is_null() {
                (api.error_free)(e);
                continue;
            }
            if r.byte_len > 0 && !r.data.is_null() {
                let data = std::slice::from_raw_parts(r.data.cast::<u8>(), r.byte_len);
                std::hint::black_box((data[0], data[r.byte_len - 1]));
            }
        }
        (api.outputs_free)(outs);
    }
    true
}
