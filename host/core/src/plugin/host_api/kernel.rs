//! The per-call kernel context: a plugin kernel reads its inputs and makes its outputs
//! through these callbacks.
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::{DLDataType, DLTensor};
use epx_plugin_api::ffi_boundary;
use epx_plugin_api::sdk::Error as SdkError;

use super::args::{index, out_ptr, read_shape};
use super::values::{CallTensor, ValueHandle, take_handle};
use crate::value::{DeviceMemory, DeviceTensor, DlView, ElementType, Tensor, Value};

pub(super) struct CallInput<'t> {
    value: &'t Value,
    tensor: Option<CallTensor>,
    handle: Option<Box<ValueHandle>>,
}

/// One kernel call's inputs and the outputs the kernel produced.
pub(crate) struct KernelCall<'t> {
    inputs: Vec<Option<CallInput<'t>>>,
    pub(crate) outputs: Vec<Option<(Value, Option<CallTensor>)>>,
    /// Where outputs are allocated: `None` for host memory, else the device EP.
    device: Option<Arc<dyn DeviceMemory>>,
    /// The run's terminate flag, when the run can be cancelled.
    terminate: Option<&'t AtomicBool>,
}

impl<'t> KernelCall<'t> {
    /// Inputs borrow `inputs` for the call; outputs go to `device`'s memory, or the host's.
    /// `abi_minor` is the plugin's: strings and non-tensor values reach plugins of 1.3 on.
    pub(crate) fn new(
        inputs: &[Option<&'t Value>],
        num_outputs: usize,
        device: Option<Arc<dyn DeviceMemory>>,
        abi_minor: u32,
    ) -> Result<Self, String> {
        let mut call_inputs = Vec::with_capacity(inputs.len());
        for v in inputs {
            call_inputs.push(match v {
                None => None,
                Some(value) => {
                    let old = abi_minor < ElementType::String.since_abi_minor();
                    let tensor = match value {
                        Value::Host(t) if old && t.elem_type() == ElementType::String => {
                            return Err(format!(
                                "a string tensor cannot reach a plugin built for ABI 1.{abi_minor} \
                                 (strings cross from ABI 1.3)"
                            ));
                        }
                        Value::Host(t) => {
                            Some(CallTensor::Host(DlView::of(t).ok_or_else(|| {
                                format!("{} tensors cannot cross the plugin ABI", t.elem_type())
                            })?))
                        }
                        Value::Device(t) => Some(CallTensor::Device(Box::new(t.dl()))),
                        other if old => {
                            return Err(format!(
                                "a {} cannot reach a plugin built for ABI 1.{abi_minor} \
                                 (sequences, maps and optionals cross from ABI 1.3)",
                                other.type_name()
                            ));
                        }
                        _ => None,
                    };
                    Some(CallInput {
                        value,
                        tensor,
                        handle: None,
                    })
                }
            });
        }
        Ok(KernelCall {
            inputs: call_inputs,
            outputs: (0..num_outputs).map(|_| None).collect(),
            device,
            terminate: None,
        })
    }

    /// Lets the kernel see the run's terminate flag (ABI 1.8, `kernel_terminate_flag`).
    pub(crate) fn with_terminate(mut self, flag: Option<&'t AtomicBool>) -> Self {
        self.terminate = flag;
        self
    }

    pub(crate) fn as_raw(&mut self) -> *mut EpxKernelContext {
        (self as *mut Self).cast::<EpxKernelContext>()
    }

    /// Allocates output storage where this call's EP keeps its tensors.
    fn allocate(
        &self,
        elem: ElementType,
        shape: &[usize],
    ) -> Result<(Value, Option<CallTensor>), SdkError> {
        let oom = |e: crate::error::Error| SdkError::new(EpxStatusCode::OutOfMemory, e.to_string());
        match &self.device {
            None => {
                let tensor = Tensor::zeros(elem, shape).map_err(oom)?;
                let view = DlView::of(&tensor)
                    .ok_or_else(|| SdkError::not_implemented(format!("{elem} outputs")))?;
                Ok((Value::Host(tensor), Some(CallTensor::Host(view))))
            }
            Some(memory) => {
                let t = DeviceTensor::allocate(memory, elem, shape).map_err(oom)?;
                let dl = Box::new(t.dl());
                Ok((Value::Device(t), Some(CallTensor::Device(dl))))
            }
        }
    }

    fn free_output(&self, i: usize) -> Result<(), SdkError> {
        if self.outputs[i].is_some() {
            return Err(SdkError::invalid_argument(format!(
                "output {i} was already produced in this call"
            )));
        }
        Ok(())
    }
}

/// # Safety
/// `ctx` was made by [`KernelCall::as_raw`] for the call in progress.
pub(super) unsafe fn call<'a>(
    ctx: *const EpxKernelContext,
) -> Result<&'a mut KernelCall<'a>, SdkError> {
    // SAFETY: the caller's contract; the host does not touch the call while the kernel runs.
    unsafe { ctx.cast_mut().cast::<KernelCall<'a>>().as_mut() }
        .ok_or_else(|| SdkError::invalid_argument("NULL kernel context"))
}

pub(super) unsafe extern "C" fn kernel_terminate_flag(ctx: *const EpxKernelContext) -> *const u8 {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { call(ctx) }.map_or(std::ptr::null(), |c| {
        // An AtomicBool is one byte holding 0 or 1: what the ABI documents.
        c.terminate
            .map_or(std::ptr::null(), |f| f.as_ptr().cast_const().cast::<u8>())
    }))
}

pub(super) unsafe extern "C" fn kernel_input_count(ctx: *const EpxKernelContext) -> usize {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { call(ctx) }.map_or(0, |c| c.inputs.len()))
}

pub(super) unsafe extern "C" fn kernel_output_count(ctx: *const EpxKernelContext) -> usize {
    // SAFETY: host API contract.
    ffi_boundary!(unsafe { call(ctx) }.map_or(0, |c| c.outputs.len()))
}

pub(super) unsafe extern "C" fn kernel_input(
    ctx: *const EpxKernelContext,
    index_: usize,
    out: *mut *const DLTensor,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.inputs, index_, "input")?;
        let out = out_ptr(out)?;
        let p = match c.inputs[i].as_mut() {
            None => std::ptr::null(),
            Some(CallInput {
                tensor: Some(t), ..
            }) => t.dl_mut() as *const DLTensor,
            Some(input) => {
                return Err(SdkError::invalid_argument(format!(
                    "input {i} is a {}, not a tensor: read it with kernel_input_value",
                    input.value.type_name()
                )));
            }
        };
        // SAFETY: `out` checked non-null.
        unsafe { *out = p };
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn kernel_input_value(
    ctx: *const EpxKernelContext,
    index_: usize,
    out: *mut *const EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.inputs, index_, "input")?;
        let out = out_ptr(out)?;
        let p = match c.inputs[i].as_mut() {
            None => std::ptr::null(),
            Some(input) => {
                if input.handle.is_none() {
                    input.handle =
                        Some(ValueHandle::borrow(input.value).map_err(SdkError::invalid_argument)?);
                }
                input.handle.as_deref().map_or(std::ptr::null(), |h| {
                    (h as *const ValueHandle).cast::<EpxValue>()
                })
            }
        };
        // SAFETY: `out` checked non-null; the handle lives until the call ends.
        unsafe { *out = p };
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn kernel_output(
    ctx: *mut EpxKernelContext,
    index_: usize,
    dtype: DLDataType,
    ndim: i32,
    shape: *const i64,
    out: *mut *mut DLTensor,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.outputs, index_, "output")?;
        c.free_output(i)?;
        if epx_plugin_api::sdk::is_string_dtype(dtype) {
            return Err(SdkError::not_implemented(
                "string outputs are made with value_new_tensor and set with kernel_output_value",
            ));
        }
        let elem = ElementType::from_dlpack(dtype).ok_or_else(|| {
            SdkError::not_implemented(format!(
                "output dtype (code {}, bits {}, lanes {})",
                dtype.code, dtype.bits, dtype.lanes
            ))
        })?;
        // SAFETY: plugin contract: `shape` holds `ndim` extents.
        let ushape = unsafe { read_shape(ndim, shape) }?;
        let out = out_ptr(out)?;
        let (value, mut view) = c.allocate(elem, &ushape)?;
        let p: *mut DLTensor = view
            .as_mut()
            .map_or(std::ptr::null_mut(), |v| v.dl_mut() as *mut DLTensor);
        c.outputs[i] = Some((value, view));
        // SAFETY: `out` checked non-null; the DLTensor lives in the call until it ends.
        unsafe { *out = p };
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn kernel_output_value(
    ctx: *mut EpxKernelContext,
    index_: usize,
    value: *mut EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: plugin contract: `value` is a value it made and hands over.
        let v = unsafe { take_handle(value) }?;
        // SAFETY: host API contract.
        let c = unsafe { call(ctx) }?;
        let i = index(&c.outputs, index_, "output")?;
        c.free_output(i)?;
        if c.device.is_some() {
            return Err(SdkError::invalid_argument(
                "an EP with its own memory produces tensors with kernel_output",
            ));
        }
        c.outputs[i] = Some((v.into_value()?, None));
        Ok::<(), SdkError>(())
    })
}
