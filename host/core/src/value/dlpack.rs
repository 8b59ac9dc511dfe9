//! Host tensors described as DLPack tensors, for the plugin ABI and for copies to and from
//! device memory.

use std::ffi::c_void;

use epx_plugin_api::abi::EpxStr;
use epx_plugin_api::dlpack::{DLDevice, DLTensor};

use super::Tensor;

/// A host tensor described as a DLTensor; owns the shape array (and, for strings, the
/// `EpxStr` array) the DLTensor points at.
pub(crate) struct DlView {
    pub(crate) dl: DLTensor,
    _shape: Vec<i64>,
    _strings: Vec<EpxStr>,
}

impl DlView {
    /// Describes `t` (which must outlive the view and not move its buffers). A string tensor
    /// comes in the ABI 1.3 string form; `None` for a type with no form at all.
    pub(crate) fn of(t: &Tensor) -> Option<Box<DlView>> {
        let (dtype, strings) = match t.strings() {
            Some(s) => (
                epx_plugin_api::sdk::STRING_DTYPE,
                s.iter().map(|b| EpxStr::from_bytes(b)).collect::<Vec<_>>(),
            ),
            None => (t.elem_type().to_dlpack()?, Vec::new()),
        };
        let mut shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        let data = if t.strings().is_some() {
            strings.as_ptr().cast_mut().cast::<c_void>()
        } else {
            t.data_ptr().cast_mut().cast::<c_void>()
        };
        let dl = DLTensor {
            data,
            device: DLDevice::CPU,
            ndim: shape.len() as i32,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        Some(Box::new(DlView {
            dl,
            _shape: shape,
            _strings: strings,
        }))
    }
}
