//! Tensors that stay in an EP's own memory between kernels.
//!
//! A device EP (CUDA, TensorRT) declares its memory space to the host and implements
//! [`DataTransfer`] with ONNX Runtime's own machinery:
//! - **allocation** through the allocator ONNX Runtime's session hands out for that memory
//!   (`CreateAllocator` with a `Cuda` memory info and the EP's `device_id`);
//! - **kernel inputs and outputs** through IO binding: inputs are bound as values over the host's
//!   device buffers, outputs are bound to the device (`BindOutputToDevice`), so nothing goes
//!   through host memory;
//! - **copies** (host→device, device→host, device→device) as a run of a one-node `Identity`
//!   session over bound buffers, so ONNX Runtime's data transfer for that EP does the move.
//!
//! [`Memory::OrtCpu`] runs the same path with ONNX Runtime's CPU allocator, declared to the host
//! as a separate memory space (`kDLExtDev`), so it is exercised on machines without a GPU.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use epx_plugin_api::ElementType;
use epx_plugin_api::dlpack::{DLDeviceType, DLTensor};
use epx_plugin_api::sdk::{self, DataTransfer, Error};
use ort::AsPointer;
use ort::session::Session;
use ort::sys::{
    ONNXTensorElementDataType, OrtAllocator, OrtAllocatorType, OrtIoBinding, OrtMemType,
    OrtMemoryInfo, OrtValue,
};

use crate::runtime::check;

/// Where an adapter EP keeps its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory: ONNX Runtime moves data to and from its device inside each kernel.
    Host,
    /// CUDA device memory from ONNX Runtime's CUDA allocator (the `device_id` option).
    Cuda,
    /// ONNX Runtime's CPU allocator, declared to the host as its own memory space
    /// (`kDLExtDev`): the device path (allocator, IO binding, copies) without a GPU.
    OrtCpu,
}

impl Memory {
    /// The memory space the host sees.
    pub fn dl_device(self) -> DLDeviceType {
        match self {
            Memory::Host => DLDeviceType::Cpu,
            Memory::Cuda => DLDeviceType::Cuda,
            Memory::OrtCpu => DLDeviceType::ExtDev,
        }
    }

    /// ONNX Runtime's name for the memory (`OrtMemoryInfo`), `None` for plain host memory.
    fn ort_name(self) -> Option<&'static CStr> {
        match self {
            Memory::Host => None,
            Memory::Cuda => Some(c"Cuda"),
            Memory::OrtCpu => Some(c"Cpu"),
        }
    }
}

/// An `OrtMemoryInfo`, released on drop.
pub(crate) struct MemInfo(NonNull<OrtMemoryInfo>);

// SAFETY: an OrtMemoryInfo is immutable after creation; ORT only reads it.
unsafe impl Send for MemInfo {}
// SAFETY: as above.
unsafe impl Sync for MemInfo {}

impl MemInfo {
    /// Host memory.
    pub(crate) fn cpu() -> sdk::Result<Self> {
        let mut p: *mut OrtMemoryInfo = std::ptr::null_mut();
        // SAFETY: C API call with a valid out-pointer.
        unsafe {
            check(
                (ort::api().CreateCpuMemoryInfo)(
                    OrtAllocatorType::OrtArenaAllocator,
                    OrtMemType::OrtMemTypeDefault,
                    &mut p,
                ),
                "CreateCpuMemoryInfo",
            )
        }?;
        NonNull::new(p)
            .map(MemInfo)
            .ok_or_else(|| Error::runtime("CreateCpuMemoryInfo returned NULL"))
    }

    /// Memory named `name` (`Cuda`, `Cpu`, ...) on device `id`.
    fn device(name: &CStr, id: i32) -> sdk::Result<Self> {
        let mut p: *mut OrtMemoryInfo = std::ptr::null_mut();
        // SAFETY: C API call with a NUL-terminated name and a valid out-pointer.
        unsafe {
            check(
                (ort::api().CreateMemoryInfo)(
                    name.as_ptr(),
                    OrtAllocatorType::OrtDeviceAllocator,
                    id,
                    OrtMemType::OrtMemTypeDefault,
                    &mut p,
                ),
                "CreateMemoryInfo",
            )
        }?;
        NonNull::new(p)
            .map(MemInfo)
            .ok_or_else(|| Error::runtime("CreateMemoryInfo returned NULL"))
    }

    pub(crate) fn as_ptr(&self) -> *const OrtMemoryInfo {
        self.0.as_ptr()
    }
}

impl Drop for MemInfo {
    fn drop(&mut self) {
        // SAFETY: made by CreateCpuMemoryInfo/CreateMemoryInfo, released once.
        unsafe { (ort::api().ReleaseMemoryInfo)(self.0.as_ptr()) };
    }
}

/// An OrtValue released on drop.
pub(crate) struct OwnedValue(pub(crate) *mut OrtValue);

impl Drop for OwnedValue {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a value ORT created for us, released once.
            unsafe { (ort::api().ReleaseValue)(self.0) };
        }
    }
}

/// Wraps `bytes` bytes at `data` (in the memory `info` describes) as an OrtValue of `shape` ×
/// `ty`, without copying.
///
/// # Safety
/// `data` points at `bytes` bytes in that memory which outlive the value.
pub(crate) unsafe fn wrap(
    info: &MemInfo,
    data: *mut c_void,
    bytes: usize,
    shape: &[i64],
    ty: ONNXTensorElementDataType,
) -> sdk::Result<OwnedValue> {
    // ORT rejects a NULL data pointer even for an empty tensor: use an aligned dangling one.
    let data = if bytes == 0 || data.is_null() {
        NonNull::<u64>::dangling().as_ptr().cast::<c_void>()
    } else {
        data
    };
    let mut v: *mut OrtValue = std::ptr::null_mut();
    // SAFETY: the caller's contract; all pointers are valid for the call.
    unsafe {
        check(
            (ort::api().CreateTensorWithDataAsOrtValue)(
                info.as_ptr(),
                data,
                bytes,
                shape.as_ptr(),
                shape.len(),
                ty,
                &mut v,
            ),
            "CreateTensorWithDataAsOrtValue",
        )
    }?;
    Ok(OwnedValue(v))
}

/// A compact DLTensor's element type, shape, data pointer and byte size.
pub(crate) fn dl_parts(t: &DLTensor) -> sdk::Result<(ElementType, Vec<i64>, *mut c_void, usize)> {
    let elem = ElementType::from_dlpack(t.dtype).ok_or_else(|| {
        Error::not_implemented(format!("DLPack dtype {:?} for ONNX Runtime", t.dtype))
    })?;
    let ndim = usize::try_from(t.ndim).map_err(|_| Error::invalid_argument("negative ndim"))?;
    let shape = if ndim == 0 {
        Vec::new()
    } else if t.shape.is_null() {
        return Err(Error::invalid_argument("tensor has ndim > 0 and no shape"));
    } else {
        // SAFETY: DLTensor contract: `shape` points at `ndim` extents.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    if !t.strides.is_null() {
        // SAFETY: as above, `strides` has `ndim` entries when not NULL.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expect = 1i64;
        for (s, d) in strides.iter().zip(&shape).rev() {
            if *d > 1 && *s != expect {
                return Err(Error::invalid_argument(
                    "ONNX Runtime kernels take compact tensors only",
                ));
            }
            expect = expect.saturating_mul(*d);
        }
    }
    let count = shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    let bytes = count
        .and_then(|c| elem.storage_bytes(c))
        .ok_or_else(|| Error::invalid_argument("bad tensor shape"))?;
    let offset = usize::try_from(t.byte_offset)
        .map_err(|_| Error::invalid_argument("byte_offset too large"))?;
    let data = if t.data.is_null() {
        std::ptr::null_mut()
    } else {
        t.data.cast::<u8>().wrapping_add(offset).cast::<c_void>()
    };
    Ok((elem, shape, data, bytes))
}

/// An OrtAllocator from `CreateAllocator`, released on drop.
struct RawAllocator(NonNull<OrtAllocator>);

// SAFETY: only used under the `DeviceIo::allocator` mutex (ONNX Runtime's device allocators are
// not documented as thread-safe).
unsafe impl Send for RawAllocator {}

impl Drop for RawAllocator {
    fn drop(&mut self) {
        // SAFETY: made by CreateAllocator, released once.
        unsafe { (ort::api().ReleaseAllocator)(self.0.as_ptr()) };
    }
}

/// An OrtIoBinding for one run, released on drop.
pub(crate) struct Binding(NonNull<OrtIoBinding>);

impl Binding {
    pub(crate) fn new(session: &Session) -> sdk::Result<Self> {
        let mut p: *mut OrtIoBinding = std::ptr::null_mut();
        // SAFETY: C API call on a live session with a valid out-pointer.
        unsafe {
            check(
                (ort::api().CreateIoBinding)(session.ptr().cast_mut(), &mut p),
                "CreateIoBinding",
            )
        }?;
        NonNull::new(p)
            .map(Binding)
            .ok_or_else(|| Error::runtime("CreateIoBinding returned NULL"))
    }

    /// Binds input `name` to `value` (which must outlive the run).
    pub(crate) fn input(&self, name: &CStr, value: &OwnedValue) -> sdk::Result<()> {
        // SAFETY: live binding, NUL-terminated name, live value.
        unsafe {
            check(
                (ort::api().BindInput)(self.0.as_ptr(), name.as_ptr(), value.0),
                "BindInput",
            )
        }
    }

    /// Binds output `name` to the preallocated `value`.
    pub(crate) fn output(&self, name: &CStr, value: &OwnedValue) -> sdk::Result<()> {
        // SAFETY: as above.
        unsafe {
            check(
                (ort::api().BindOutput)(self.0.as_ptr(), name.as_ptr(), value.0),
                "BindOutput",
            )
        }
    }

    /// Lets ONNX Runtime allocate output `name` in the memory `info` describes.
    pub(crate) fn output_to(&self, name: &CStr, info: &MemInfo) -> sdk::Result<()> {
        // SAFETY: as above.
        unsafe {
            check(
                (ort::api().BindOutputToDevice)(self.0.as_ptr(), name.as_ptr(), info.as_ptr()),
                "BindOutputToDevice",
            )
        }
    }

    /// Runs `session` over the bound values. ONNX Runtime synchronizes the EP's stream before
    /// returning, so bound outputs are complete.
    pub(crate) fn run(&self, session: &Session, what: &str) -> sdk::Result<()> {
        // SAFETY: live session and binding; default run options.
        unsafe {
            check(
                (ort::api().RunWithBinding)(
                    session.ptr().cast_mut(),
                    std::ptr::null(),
                    self.0.as_ptr(),
                ),
                what,
            )
        }
    }

    /// The output values, in binding order, owned by the caller.
    pub(crate) fn outputs(&self) -> sdk::Result<Vec<OwnedValue>> {
        let api = ort::api();
        let mut alloc: *mut OrtAllocator = std::ptr::null_mut();
        // SAFETY: C API calls with valid out-pointers; the array is freed with the allocator that
        // made it, each value is owned by the returned `OwnedValue`s.
        unsafe {
            check(
                (api.GetAllocatorWithDefaultOptions)(&mut alloc),
                "GetAllocatorWithDefaultOptions",
            )?;
            let mut values: *mut *mut OrtValue = std::ptr::null_mut();
            let mut n = 0usize;
            check(
                (api.GetBoundOutputValues)(self.0.as_ptr(), alloc, &mut values, &mut n),
                "GetBoundOutputValues",
            )?;
            if values.is_null() {
                return Ok(Vec::new());
            }
            let out = std::slice::from_raw_parts(values, n)
                .iter()
                .map(|&v| OwnedValue(v))
                .collect();
            check((api.AllocatorFree)(alloc, values.cast()), "AllocatorFree")?;
            Ok(out)
        }
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        // SAFETY: made by CreateIoBinding, released once.
        unsafe { (ort::api().ReleaseIoBinding)(self.0.as_ptr()) };
    }
}

/// One-node model `y = Identity(x)` over 1-D `uint8` tensors: every copy is a run of it with `x`
/// and `y` bound to the source and destination buffers.
pub(crate) fn identity_model() -> Vec<u8> {
    use crate::patch::{write_len_field, write_varint_field};
    let uint8 = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 as u64;
    let value_info = |name: &str| {
        let mut tensor = Vec::new();
        write_varint_field(&mut tensor, 1, uint8); // TypeProto.Tensor.elem_type
        let mut ty = Vec::new();
        write_len_field(&mut ty, 1, &tensor); // TypeProto.tensor_type
        let mut vi = Vec::new();
        write_len_field(&mut vi, 1, name.as_bytes()); // ValueInfoProto.name
        write_len_field(&mut vi, 2, &ty); // ValueInfoProto.type
        vi
    };
    let mut node = Vec::new();
    write_len_field(&mut node, 1, b"x"); // NodeProto.input
    write_len_field(&mut node, 2, b"y"); // NodeProto.output
    write_len_field(&mut node, 4, b"Identity"); // NodeProto.op_type
    let mut graph = Vec::new();
    write_len_field(&mut graph, 1, &node); // GraphProto.node
    write_len_field(&mut graph, 2, b"epx_copy"); // GraphProto.name
    write_len_field(&mut graph, 11, &value_info("x")); // GraphProto.input
    write_len_field(&mut graph, 12, &value_info("y")); // GraphProto.output
    let mut opset = Vec::new();
    write_varint_field(&mut opset, 2, 13); // OperatorSetIdProto.version (default domain)
    let mut model = Vec::new();
    write_varint_field(&mut model, 1, 8); // ModelProto.ir_version
    write_len_field(&mut model, 7, &graph); // ModelProto.graph
    write_len_field(&mut model, 8, &opset); // ModelProto.opset_import
    model
}

/// An EP's memory as ONNX Runtime manages it: allocator, memory info and the copy session.
pub(crate) struct DeviceIo {
    memory: Memory,
    device_id: i32,
    pub(crate) info: MemInfo,
    host: MemInfo,
    allocator: Mutex<RawAllocator>,
    copier: Session,
    /// Allocations not yet freed, reported when the EP is released with some still live.
    live: AtomicUsize,
}

impl DeviceIo {
    /// Builds the copy session with `make_session` (the EP's own session options) and takes the
    /// allocator for `memory` from it.
    pub(crate) fn new(
        memory: Memory,
        device_id: i32,
        make_session: impl FnOnce(&[u8]) -> Result<Session, String>,
    ) -> sdk::Result<Self> {
        let name = memory
            .ort_name()
            .ok_or_else(|| Error::runtime("host memory needs no device I/O"))?;
        let copier = make_session(&identity_model())
            .map_err(|e| Error::runtime(format!("copy session: {e}")))?;
        let info = MemInfo::device(name, device_id)?;
        let mut p: *mut OrtAllocator = std::ptr::null_mut();
        // SAFETY: C API call on a live session and memory info with a valid out-pointer.
        unsafe {
            check(
                (ort::api().CreateAllocator)(copier.ptr(), info.as_ptr(), &mut p),
                "CreateAllocator",
            )
        }?;
        let allocator = NonNull::new(p)
            .map(RawAllocator)
            .ok_or_else(|| Error::runtime("CreateAllocator returned NULL"))?;
        Ok(DeviceIo {
            memory,
            device_id,
            info,
            host: MemInfo::cpu()?,
            allocator: Mutex::new(allocator),
            copier,
            live: AtomicUsize::new(0),
        })
    }

    /// Checks that `t` is in this EP's memory space.
    pub(crate) fn check_device(&self, t: &DLTensor, what: &str) -> sdk::Result<()> {
        if t.device.device_type != self.memory.dl_device() as i32 {
            return Err(Error::invalid_argument(format!(
                "{what} is in memory space {} but this EP keeps tensors in {:?} memory",
                t.device.device_type,
                self.memory.dl_device()
            )));
        }
        Ok(())
    }

    /// Wraps a compact tensor in this EP's memory as an OrtValue over the same buffer.
    pub(crate) fn wrap_dl(&self, t: &DLTensor) -> sdk::Result<OwnedValue> {
        let (elem, shape, data, bytes) = dl_parts(t)?;
        let ty = crate::runtime::ort_type(elem)
            .ok_or_else(|| Error::not_implemented(format!("{elem} tensors for ONNX Runtime")))?;
        // SAFETY: the host keeps `t`'s buffer alive and unmoved for the call the value is used in.
        unsafe { wrap(&self.info, data, bytes, &shape, ty) }
    }

    /// Copies `bytes` bytes from `src` (in memory `src_info`) to `dst` (in `dst_info`).
    ///
    /// # Safety
    /// Both pointers are valid for `bytes` bytes in their memory and do not overlap.
    pub(crate) unsafe fn copy_raw(
        &self,
        src: (*mut c_void, &MemInfo),
        dst: (*mut c_void, &MemInfo),
        bytes: usize,
    ) -> sdk::Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if src.0.is_null() || dst.0.is_null() {
            return Err(Error::invalid_argument("copy with a NULL buffer"));
        }
        let n = i64::try_from(bytes).map_err(|_| Error::invalid_argument("copy too large"))?;
        let uint8 = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
        // SAFETY: the caller's contract.
        let x = unsafe { wrap(src.1, src.0, bytes, &[n], uint8) }?;
        // SAFETY: as above.
        let y = unsafe { wrap(dst.1, dst.0, bytes, &[n], uint8) }?;
        let binding = Binding::new(&self.copier)?;
        binding.input(c"x", &x)?;
        binding.output(c"y", &y)?;
        binding.run(&self.copier, "copy (Identity run)")
    }

    /// Copies between two tensors of equal type and shape, `src` in `src_info`'s memory and
    /// `dst` in `dst_info`'s.
    fn copy_dl(
        &self,
        src: &DLTensor,
        src_info: &MemInfo,
        dst: &DLTensor,
        dst_info: &MemInfo,
    ) -> sdk::Result<()> {
        let (se, ss, sp, sb) = dl_parts(src)?;
        let (de, ds, dp, db) = dl_parts(dst)?;
        if se != de || ss != ds || sb != db {
            return Err(Error::invalid_argument(format!(
                "copy between {se} {ss:?} and {de} {ds:?}"
            )));
        }
        // SAFETY: the host hands over two live, distinct buffers of `sb` bytes each.
        unsafe { self.copy_raw((sp, src_info), (dp, dst_info), sb) }
    }

    /// Copies an ORT output value (in this EP's memory) into the host's output tensor (also in
    /// this EP's memory).
    pub(crate) fn copy_value_into(&self, value: &OwnedValue, dst: &DLTensor) -> sdk::Result<()> {
        let (_, _, dp, bytes) = dl_parts(dst)?;
        if bytes == 0 {
            return Ok(());
        }
        let mut src: *mut c_void = std::ptr::null_mut();
        // SAFETY: C API call on a tensor value we own.
        unsafe {
            check(
                (ort::api().GetTensorMutableData)(value.0, &mut src),
                "GetTensorMutableData",
            )
        }?;
        // SAFETY: `value` holds `bytes` bytes (same type and shape as `dst`, which the host made
        // from them); `dst` is the host's fresh buffer.
        unsafe { self.copy_raw((src, &self.info), (dp, &self.info), bytes) }
    }
}

impl DataTransfer for DeviceIo {
    fn allocate(&self, bytes: usize, alignment: usize) -> sdk::Result<*mut c_void> {
        let alloc = self
            .allocator
            .lock()
            .map_err(|_| Error::runtime("allocator lock poisoned"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: C API call on a live allocator; a zero-byte request asks for one byte so every
        // allocation has a distinct, freeable pointer.
        unsafe {
            check(
                (ort::api().AllocatorAlloc)(alloc.0.as_ptr(), bytes.max(1), &mut p),
                "AllocatorAlloc",
            )
        }
        .map_err(|e| {
            Error::runtime(format!(
                "allocating {bytes} bytes of {:?} memory on device {}: {e}",
                self.memory, self.device_id
            ))
        })?;
        if p.is_null() {
            return Err(Error::runtime(format!(
                "ONNX Runtime returned no memory for {bytes} bytes"
            )));
        }
        if alignment > 1 && (p as usize) % alignment != 0 {
            // SAFETY: just allocated by this allocator; a failed free only leaks.
            let _ = unsafe {
                check(
                    (ort::api().AllocatorFree)(alloc.0.as_ptr(), p),
                    "AllocatorFree",
                )
            };
            return Err(Error::runtime(format!(
                "ONNX Runtime's allocator gave {p:p}, not aligned to {alignment} bytes"
            )));
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    unsafe fn free(&self, ptr: *mut c_void) {
        if ptr.is_null() {
            return;
        }
        let Ok(alloc) = self.allocator.lock() else {
            sdk::log(
                epx_plugin_api::abi::EpxLogLevel::Error,
                "allocator lock poisoned: device memory leaked",
            );
            return;
        };
        // SAFETY: the caller's contract: `ptr` came from `allocate` of this EP.
        let status = unsafe { (ort::api().AllocatorFree)(alloc.0.as_ptr(), ptr) };
        // SAFETY: the status AllocatorFree returned.
        if let Err(e) = unsafe { check(status, "AllocatorFree") } {
            sdk::log(epx_plugin_api::abi::EpxLogLevel::Error, &e.to_string());
            return;
        }
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    fn copy_to_device(&self, src: &DLTensor, dst: &mut DLTensor) -> sdk::Result<()> {
        self.check_device(dst, "copy destination")?;
        self.copy_dl(src, &self.host, dst, &self.info)
    }

    fn copy_to_host(&self, src: &DLTensor, dst: &mut DLTensor) -> sdk::Result<()> {
        self.check_device(src, "copy source")?;
        self.copy_dl(src, &self.info, dst, &self.host)
    }

    fn copy_on_device(&self, src: &DLTensor, dst: &mut DLTensor) -> sdk::Result<()> {
        self.check_device(src, "copy source")?;
        self.check_device(dst, "copy destination")?;
        self.copy_dl(src, &self.info, dst, &self.info)
    }
}

impl Drop for DeviceIo {
    fn drop(&mut self) {
        let live = self.live.load(Ordering::Relaxed);
        if live != 0 {
            sdk::log(
                epx_plugin_api::abi::EpxLogLevel::Warn,
                &format!(
                    "{live} {:?} allocation(s) still live at EP release",
                    self.memory
                ),
            );
        }
    }
}
