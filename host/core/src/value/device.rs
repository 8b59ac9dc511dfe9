//! Tensors in an EP's own memory.

use std::ffi::c_void;
use std::sync::Arc;

use epx_plugin_api::dlpack::{DLDevice, DLTensor};

use super::{DlView, ElementType, Tensor};
use crate::error::{Error, Result};

/// An EP's memory as a device tensor uses it. The plugin layer implements it over the EP's
/// data-transfer functions; values know nothing else of plugins.
pub(crate) trait DeviceMemory: Send + Sync {
    /// The EP's name, for messages.
    fn name(&self) -> &str;
    /// The device the memory is on.
    fn device(&self) -> DLDevice;
    /// `bytes` of uninitialized memory aligned to `alignment`.
    fn allocate(&self, bytes: usize, alignment: usize) -> Result<*mut c_void>;
    /// Frees memory from [`allocate`](Self::allocate); each pointer is freed once.
    fn free(&self, ptr: *mut c_void);
    /// Copies a host tensor into a device tensor of the same type and shape.
    fn copy_to_device(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()>;
    /// Copies a device tensor into a host tensor of the same type and shape.
    fn copy_to_host(&self, src: &DLTensor, dst: &mut DLTensor) -> Result<()>;
}

/// Alignment asked of device allocations.
const DEVICE_ALIGNMENT: usize = 64;

/// A tensor in the memory of a device EP, allocated and freed through its data transfer.
pub struct DeviceTensor {
    provider: Arc<dyn DeviceMemory>,
    ptr: *mut c_void,
    bytes: usize,
    elem_type: ElementType,
    shape: Vec<usize>,
    dims: Vec<i64>,
}

// SAFETY: the memory is owned by this value alone; the ABI requires the EP's data-transfer
// functions to be callable from any thread.
unsafe impl Send for DeviceTensor {}
// SAFETY: shared access only reads the descriptor; copies out go through the EP.
unsafe impl Sync for DeviceTensor {}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        self.provider.free(self.ptr);
    }
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceTensor<{}>{:?} on {}",
            self.elem_type,
            self.shape,
            self.provider.name()
        )
    }
}

impl DeviceTensor {
    /// Allocates an uninitialized tensor in `provider`'s memory.
    pub(crate) fn allocate(
        provider: &Arc<dyn DeviceMemory>,
        elem_type: ElementType,
        shape: &[usize],
    ) -> Result<Self> {
        if elem_type == ElementType::String || elem_type == ElementType::Undefined {
            return Err(Error::Run(format!(
                "{elem_type} tensors cannot be placed in {}'s memory",
                provider.name()
            )));
        }
        let bytes = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .and_then(|count| elem_type.storage_bytes(count))
            .ok_or_else(|| Error::Run(format!("tensor shape {shape:?} overflows")))?;
        let ptr = provider.allocate(bytes.max(1), DEVICE_ALIGNMENT)?;
        Ok(DeviceTensor {
            provider: provider.clone(),
            ptr,
            bytes,
            elem_type,
            shape: shape.to_vec(),
            dims: shape.iter().map(|&d| d as i64).collect(),
        })
    }

    pub fn elem_type(&self) -> ElementType {
        self.elem_type
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// The EP whose memory holds the tensor.
    pub fn provider_name(&self) -> &str {
        self.provider.name()
    }

    /// A DLPack description, valid while `self` is.
    pub(crate) fn dl(&self) -> DLTensor {
        DLTensor {
            data: self.ptr,
            device: self.provider.device(),
            ndim: self.dims.len() as i32,
            // `allocate` refused types without a DLPack form.
            dtype: self
                .elem_type
                .to_dlpack()
                .unwrap_or(epx_plugin_api::dlpack::DLDataType {
                    code: 0,
                    bits: 0,
                    lanes: 0,
                }),
            shape: self.dims.as_ptr().cast_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    /// Copies a host tensor into `provider`'s memory.
    pub(crate) fn from_host(provider: &Arc<dyn DeviceMemory>, t: &Tensor) -> Result<Self> {
        let dst = Self::allocate(provider, t.elem_type(), t.shape())?;
        let src = DlView::of(t).ok_or_else(|| {
            Error::Run(format!(
                "{} tensors cannot be copied to {}",
                t.elem_type(),
                provider.name()
            ))
        })?;
        let mut dst_dl = dst.dl();
        provider.copy_to_device(&src.dl, &mut dst_dl)?;
        Ok(dst)
    }

    /// Copies the tensor back into host memory.
    pub fn to_host(&self) -> Result<Tensor> {
        let host = Tensor::zeros(self.elem_type, &self.shape)?;
        let mut view = DlView::of(&host).ok_or_else(|| {
            Error::Run(format!(
                "{} tensors cannot be copied to the host",
                self.elem_type
            ))
        })?;
        view.dl.device = DLDevice::CPU;
        self.provider.copy_to_host(&self.dl(), &mut view.dl)?;
        drop(view);
        Ok(host)
    }
}
