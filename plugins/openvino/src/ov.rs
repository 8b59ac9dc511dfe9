//! A small owned-handle layer over the OpenVINO C API (`openvino-sys`, runtime-linked).
//!
//! Why not the `openvino` crate's safe types: they cannot make or read rank-0 (scalar) tensors
//! (`Shape::new(&[])` is refused by `ov_shape_create`), cannot wrap host memory, and keep their
//! raw handles private, so one gap forces the whole path down to the C API. This module is
//! that path: each handle is owned by one struct and freed in its `Drop`, every call checks its
//! status, and all `unsafe` in the plugin is here.
//!
//! Threading (OpenVINO's rules): a core, a model and a compiled model may be used from several
//! threads; an infer request is used by one thread at a time (the kernel pools them).

use std::ffi::{CStr, CString, c_char, c_void};

use epx_plugin_api::ElementType;
use openvino_sys as sys;
use sys::ov_element_type_e as E;

pub type OvResult<T> = Result<T, String>;

/// A shape OpenVINO may only partly know: `None` = unknown rank; `-1` = unknown extent.
pub type PShape = Option<Vec<i64>>;

/// Turns a status into an error with OpenVINO's last message (the message is read at once:
/// OpenVINO keeps only the last one).
fn check(status: sys::ov_status_e, what: &str) -> OvResult<()> {
    if status == sys::ov_status_e::OK {
        return Ok(());
    }
    // SAFETY: both return NULL or a NUL-terminated string owned by OpenVINO, copied here.
    let (info, last) = unsafe {
        (
            text(sys::ov_get_error_info(status)),
            text(sys::ov_get_last_err_msg()),
        )
    };
    Err(format!("{what}: {info} ({status:?}): {}", last.trim_end()))
}

/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn c_string(s: &str) -> OvResult<CString> {
    CString::new(s).map_err(|_| format!("`{s}` holds a NUL byte"))
}

/// epx ↔ OpenVINO element types, for the types both sides hold.
pub fn to_ov(t: ElementType) -> Option<E> {
    Some(match t {
        ElementType::Float => E::F32,
        ElementType::Double => E::F64,
        ElementType::Float16 => E::F16,
        ElementType::Bfloat16 => E::BF16,
        ElementType::Int8 => E::I8,
        ElementType::Int16 => E::I16,
        ElementType::Int32 => E::I32,
        ElementType::Int64 => E::I64,
        ElementType::Uint8 => E::U8,
        ElementType::Uint16 => E::U16,
        ElementType::Uint32 => E::U32,
        ElementType::Uint64 => E::U64,
        ElementType::Bool => E::OV_BOOLEAN,
        _ => return None,
    })
}

/// The epx type of an OpenVINO element type code (read as a plain integer, so an unknown code
/// from a newer OpenVINO is `None`, never an invalid enum value).
pub fn from_ov(code: u32) -> Option<ElementType> {
    [
        ElementType::Float,
        ElementType::Double,
        ElementType::Float16,
        ElementType::Bfloat16,
        ElementType::Int8,
        ElementType::Int16,
        ElementType::Int32,
        ElementType::Int64,
        ElementType::Uint8,
        ElementType::Uint16,
        ElementType::Uint32,
        ElementType::Uint64,
        ElementType::Bool,
    ]
    .into_iter()
    .find(|t| to_ov(*t).is_some_and(|e| e as u32 == code))
}

/// OpenVINO's build number (`2026.4.1-22982-...`). The library must be loaded.
pub fn version() -> OvResult<String> {
    let mut v = sys::ov_version_t {
        buildNumber: std::ptr::null(),
        description: std::ptr::null(),
    };
    // SAFETY: `v` is a valid out-struct; freed below with the matching function.
    unsafe {
        check(sys::ov_get_openvino_version(&mut v), "reading the version")?;
        let s = text(v.buildNumber);
        sys::ov_version_free(&mut v);
        Ok(s)
    }
}

/// `ov_core_t`.
pub struct Core(*mut sys::ov_core_t);

// SAFETY: OpenVINO's core is thread-safe (its C++ `ov::Core` is documented as such).
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: made by `ov_core_create`, freed once.
        unsafe { sys::ov_core_free(self.0) }
    }
}

impl Core {
    pub fn new() -> OvResult<Core> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { sys::ov_core_create(&mut p) }, "creating a core")?;
        Ok(Core(p))
    }

    pub fn available_devices(&self) -> OvResult<Vec<String>> {
        let mut d = sys::ov_available_devices_t {
            devices: std::ptr::null_mut(),
            size: 0,
        };
        // SAFETY: valid handle and out-struct; the list is read, then freed once.
        unsafe {
            check(
                sys::ov_core_get_available_devices(self.0, &mut d),
                "listing devices",
            )?;
            let names = if d.devices.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(d.devices, d.size)
                    .iter()
                    .map(|&p| text(p))
                    .collect()
            };
            sys::ov_available_devices_free(&mut d);
            Ok(names)
        }
    }

    pub fn set_property(&self, device: &str, key: &str, value: &str) -> OvResult<()> {
        let (d, k, v) = (c_string(device)?, c_string(key)?, c_string(value)?);
        // SAFETY: valid handle; NUL-terminated strings borrowed for the call.
        let status =
            unsafe { sys::ov_core_set_property(self.0, d.as_ptr(), k.as_ptr(), v.as_ptr()) };
        check(status, &format!("setting {key}={value} on {device}"))
    }

    /// A device property as OpenVINO prints it (`OPTIMIZATION_CAPABILITIES` reads
    /// `FP32 INT8 BIN EXPORT_IMPORT` on a CPU without bf16).
    pub fn property(&self, device: &str, key: &str) -> OvResult<String> {
        let (d, k) = (c_string(device)?, c_string(key)?);
        let mut value: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid handle, NUL-terminated strings borrowed for the call, valid out-pointer.
        let status =
            unsafe { sys::ov_core_get_property(self.0, d.as_ptr(), k.as_ptr(), &mut value) };
        check(status, &format!("reading {key} of {device}"))?;
        // SAFETY: on success `value` is NULL or a string OpenVINO allocated for us; it is copied,
        // then freed once with OpenVINO's `ov_free`.
        unsafe {
            let s = text(value);
            if !value.is_null() {
                sys::ov_free(value);
            }
            Ok(s)
        }
    }

    /// Reads an ONNX model (all weights inside) through OpenVINO's ONNX frontend.
    pub fn read_onnx(&self, onnx: &[u8]) -> OvResult<Model> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid handle; the buffer is read during the call (weights are copied: the
        // weights tensor argument is NULL, so nothing refers to `onnx` afterwards).
        let status = unsafe {
            sys::ov_core_read_model_from_memory_buffer(
                self.0,
                onnx.as_ptr().cast::<c_char>(),
                onnx.len(),
                std::ptr::null(),
                &mut p,
            )
        };
        check(status, "reading the ONNX model")?;
        Ok(Model(p))
    }

    /// Rebuilds a compiled model from bytes [`CompiledModel::export`] wrote, for `device`
    /// (OpenVINO checks the blob and refuses one of another version or device). The compiled
    /// model keeps the blob: OpenVINO's CPU plugin reads a blob in memory in place, and its
    /// weights stay there for the model's life.
    pub fn import(&self, blob: Vec<u8>, device: &str) -> OvResult<CompiledModel> {
        let d = c_string(device)?;
        let blob = blob.into_boxed_slice();
        let mut p = std::ptr::null_mut();
        // SAFETY: valid handle; the blob lives as long as the compiled model (its `_blob`,
        // dropped after the model is freed), since OpenVINO may keep pointing into it.
        let status = unsafe {
            sys::ov_core_import_model(
                self.0,
                blob.as_ptr().cast::<c_char>(),
                blob.len(),
                d.as_ptr(),
                &mut p,
            )
        };
        check(status, &format!("importing a compiled model for {device}"))?;
        Ok(CompiledModel {
            raw: p,
            _blob: Some(blob),
        })
    }

    /// Compiles with the properties set on the core for `device`.
    pub fn compile(&self, model: &Model, device: &str) -> OvResult<CompiledModel> {
        let d = c_string(device)?;
        let mut p = std::ptr::null_mut();
        // SAFETY: valid handles; zero variadic property pairs follow.
        let status = unsafe { sys::ov_core_compile_model(self.0, model.0, d.as_ptr(), 0, &mut p) };
        check(status, &format!("compiling for {device}"))?;
        Ok(CompiledModel {
            raw: p,
            _blob: None,
        })
    }
}

/// `ov_model_t`.
pub struct Model(*mut sys::ov_model_t);

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: made by `ov_core_read_model_*`, freed once.
        unsafe { sys::ov_model_free(self.0) }
    }
}

impl Model {
    /// Gives input `name` the shape `shape` (which must have a known rank).
    pub fn reshape_input(&mut self, name: &str, shape: &[i64]) -> OvResult<()> {
        let n = c_string(name)?;
        let dims: Vec<sys::ov_dimension_t> = shape
            .iter()
            .map(|&d| sys::ov_dimension_t { min: d, max: d })
            .collect();
        let mut ps = sys::ov_partial_shape_t {
            rank: sys::ov_rank_t { min: 0, max: 0 },
            dims: std::ptr::null_mut(),
        };
        // SAFETY: `dims` holds `rank` entries ({-1,-1} is a dynamic extent); the partial shape
        // is freed once after the reshape, which copies it.
        unsafe {
            check(
                sys::ov_partial_shape_create(shape.len() as i64, dims.as_ptr(), &mut ps),
                "making a partial shape",
            )?;
            let r = check(
                sys::ov_model_reshape_input_by_name(self.0, n.as_ptr(), ps),
                &format!("reshaping input `{name}`"),
            );
            sys::ov_partial_shape_free(&mut ps);
            r
        }
    }

    /// The shapes OpenVINO inferred for the model's outputs, in order.
    pub fn output_shapes(&self) -> OvResult<Vec<PShape>> {
        let mut n = 0usize;
        // SAFETY: valid handle and out-pointer.
        let status = unsafe { sys::ov_model_outputs_size(self.0, &mut n) };
        check(status, "counting outputs")?;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut port = std::ptr::null_mut();
            let mut ps = sys::ov_partial_shape_t {
                rank: sys::ov_rank_t { min: 0, max: 0 },
                dims: std::ptr::null_mut(),
            };
            // SAFETY: valid handle; the port and partial shape are freed once each; `dims` has
            // `rank.max` entries when the rank is static.
            unsafe {
                check(
                    sys::ov_model_const_output_by_index(self.0, i, &mut port),
                    "reading an output",
                )?;
                let r = check(
                    sys::ov_port_get_partial_shape(port, &mut ps),
                    "reading an output shape",
                );
                sys::ov_output_const_port_free(port);
                r?;
                let shape = if sys::ov_rank_is_dynamic(ps.rank) || ps.rank.max < 0 {
                    None
                } else if ps.rank.max == 0 || ps.dims.is_null() {
                    Some(Vec::new())
                } else {
                    Some(
                        std::slice::from_raw_parts(ps.dims, ps.rank.max as usize)
                            .iter()
                            .map(|d| if d.min == d.max { d.min } else { -1 })
                            .collect(),
                    )
                };
                sys::ov_partial_shape_free(&mut ps);
                out.push(shape);
            }
        }
        Ok(out)
    }
}

/// `ov_compiled_model_t`.
pub struct CompiledModel {
    raw: *mut sys::ov_compiled_model_t,
    /// The bytes an imported model was read from, which OpenVINO may still point into; freed
    /// after the model (fields drop after `Drop::drop`).
    _blob: Option<Box<[u8]>>,
}

// SAFETY: a compiled model is thread-safe in OpenVINO (requests are made from any thread).
unsafe impl Send for CompiledModel {}
// SAFETY: as above.
unsafe impl Sync for CompiledModel {}

impl Drop for CompiledModel {
    fn drop(&mut self) {
        // SAFETY: made by `ov_core_compile_model`, freed once.
        unsafe { sys::ov_compiled_model_free(self.raw) }
    }
}

impl CompiledModel {
    /// The compiled model as bytes [`Core::import`] reads back. The C API exports to a file
    /// only: a file of our own (created new, mode 0600) in the temporary folder, read and
    /// removed.
    pub fn export(&self) -> OvResult<Vec<u8>> {
        use std::os::unix::fs::OpenOptionsExt;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "epx-openvino-export-{}-{n}.blob",
            std::process::id()
        ));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
        let result = (|| {
            let p = c_string(&path.to_string_lossy())?;
            // SAFETY: valid handle and path.
            let status = unsafe { sys::ov_compiled_model_export_model(self.raw, p.as_ptr()) };
            check(status, "exporting the compiled model")?;
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        })();
        let _ = std::fs::remove_file(&path);
        result
    }

    pub fn create_request(&self) -> OvResult<InferRequest> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        let status = unsafe { sys::ov_compiled_model_create_infer_request(self.raw, &mut p) };
        check(status, "creating an infer request")?;
        Ok(InferRequest(p))
    }
}

/// `ov_infer_request_t`: used by one thread at a time (`&mut self`).
pub struct InferRequest(*mut sys::ov_infer_request_t);

// SAFETY: a request may move between threads; `&mut self` keeps its use exclusive.
unsafe impl Send for InferRequest {}

impl Drop for InferRequest {
    fn drop(&mut self) {
        // SAFETY: made by `ov_compiled_model_create_infer_request`, freed once. OpenVINO keeps
        // the compiled model's internals alive for its requests.
        unsafe { sys::ov_infer_request_free(self.0) }
    }
}

impl InferRequest {
    /// Binds input `name` to host memory without copying.
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until the next [`infer`](Self::infer) on this
    /// request has returned; the request refers to it until another tensor replaces it, and
    /// must not be run again before that.
    pub unsafe fn set_input(
        &mut self,
        name: &str,
        elem: E,
        shape: &[i64],
        data: &[u8],
    ) -> OvResult<()> {
        let n = c_string(name)?;
        let mut dims = shape.to_vec();
        let s = sys::ov_shape_t {
            rank: dims.len() as i64,
            dims: if dims.is_empty() {
                std::ptr::null_mut()
            } else {
                dims.as_mut_ptr()
            },
        };
        // OpenVINO wants a non-NULL pointer even for an empty tensor.
        let mut one = 0u64;
        let ptr = if data.is_empty() {
            (&mut one as *mut u64).cast::<c_void>()
        } else {
            // OpenVINO only reads input tensors; the cast to `*mut` is what the C API takes.
            data.as_ptr().cast_mut().cast::<c_void>()
        };
        let mut t = std::ptr::null_mut();
        // SAFETY: `s` describes `data` (the caller checked the size); OpenVINO copies the
        // shape, wraps `ptr` without owning it, and the request keeps its own reference to the
        // tensor, so our handle is freed right after binding.
        unsafe {
            check(
                sys::ov_tensor_create_from_host_ptr(elem, s, ptr, &mut t),
                &format!("wrapping input `{name}`"),
            )?;
            let r = check(
                sys::ov_infer_request_set_tensor(self.0, n.as_ptr(), t),
                &format!("setting input `{name}`"),
            );
            sys::ov_tensor_free(t);
            r
        }
    }

    pub fn infer(&mut self) -> OvResult<()> {
        // SAFETY: valid handle, used by this thread only (`&mut self`).
        check(unsafe { sys::ov_infer_request_infer(self.0) }, "inference")
    }

    /// Output `name` of the last inference.
    pub fn output(&self, name: &str) -> OvResult<OvTensor<'_>> {
        let n = c_string(name)?;
        let mut t = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        let status = unsafe { sys::ov_infer_request_get_tensor(self.0, n.as_ptr(), &mut t) };
        check(status, &format!("reading output `{name}`"))?;
        Ok(OvTensor {
            raw: t,
            _request: std::marker::PhantomData,
        })
    }
}

/// A tensor handle borrowed from a request.
pub struct OvTensor<'a> {
    raw: *mut sys::ov_tensor_t,
    _request: std::marker::PhantomData<&'a InferRequest>,
}

impl Drop for OvTensor<'_> {
    fn drop(&mut self) {
        // SAFETY: made by `ov_infer_request_get_tensor`, freed once.
        unsafe { sys::ov_tensor_free(self.raw) }
    }
}

impl OvTensor<'_> {
    /// The element type code (see [`from_ov`]).
    pub fn elem_code(&self) -> OvResult<u32> {
        let mut code: u32 = u32::MAX;
        // SAFETY: valid handle; the out-value is written as a `u32` (the enum's repr) so an
        // unknown code is not an invalid Rust enum.
        let status = unsafe {
            sys::ov_tensor_get_element_type(
                self.raw,
                (&mut code as *mut u32).cast::<sys::ov_element_type_e>(),
            )
        };
        check(status, "reading an element type")?;
        Ok(code)
    }

    pub fn byte_size(&self) -> OvResult<usize> {
        let mut n = 0usize;
        // SAFETY: valid handle and out-pointer.
        let status = unsafe { sys::ov_tensor_get_byte_size(self.raw, &mut n) };
        check(status, "reading a tensor size")?;
        Ok(n)
    }

    /// The extents. `ov_tensor_get_shape` refuses rank 0 (it builds the result with
    /// `ov_shape_create`, which wants rank > 0), so a failure on a one-element tensor means a
    /// scalar.
    pub fn shape(&self) -> OvResult<Vec<i64>> {
        let mut s = sys::ov_shape_t {
            rank: 0,
            dims: std::ptr::null_mut(),
        };
        // SAFETY: valid handle; on success `dims` holds `rank` extents, freed once.
        let status = unsafe { sys::ov_tensor_get_shape(self.raw, &mut s) };
        if status == sys::ov_status_e::OK {
            // SAFETY: as above.
            unsafe {
                let dims = if s.dims.is_null() || s.rank <= 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(s.dims, s.rank as usize).to_vec()
                };
                sys::ov_shape_free(&mut s);
                return Ok(dims);
            }
        }
        let mut n = 0usize;
        // SAFETY: valid handle and out-pointer.
        let size_ok = unsafe { sys::ov_tensor_get_size(self.raw, &mut n) } == sys::ov_status_e::OK;
        if size_ok && n == 1 {
            return Ok(Vec::new());
        }
        check(status, "reading a tensor shape").map(|()| Vec::new())
    }

    /// The tensor's bytes.
    pub fn data(&self) -> OvResult<&[u8]> {
        let n = self.byte_size()?;
        if n == 0 {
            return Ok(&[]);
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        let status = unsafe { sys::ov_tensor_data(self.raw, &mut p) };
        check(status, "reading tensor memory")?;
        if p.is_null() {
            return Err("OpenVINO returned NULL tensor memory".into());
        }
        // SAFETY: the tensor owns `n` bytes at `p`, alive while the request (borrowed by
        // `self`) is neither run nor dropped.
        Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
    }
}
