//! DLPack's tensor layout (`dlpack.h`, version 1.x), the form in which tensors cross the ABI.
//!
//! Only the plain `DLTensor` is used: ownership is never transferred through DLPack's managed
//! tensor here; the ABI says who owns each tensor instead.

use std::ffi::c_void;

/// Where a tensor's memory lives. Values are DLPack's `DLDeviceType` and never change.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DLDeviceType {
    Cpu = 1,
    Cuda = 2,
    CudaHost = 3,
    OpenCL = 4,
    Vulkan = 7,
    Metal = 8,
    Vpi = 9,
    Rocm = 10,
    RocmHost = 11,
    ExtDev = 12,
    CudaManaged = 13,
    OneApi = 14,
    WebGpu = 15,
    Hexagon = 16,
    Maia = 17,
}

impl DLDeviceType {
    /// The device type for a raw DLPack code, if known.
    pub fn from_raw(code: i32) -> Option<Self> {
        use DLDeviceType::*;
        Some(match code {
            1 => Cpu,
            2 => Cuda,
            3 => CudaHost,
            4 => OpenCL,
            7 => Vulkan,
            8 => Metal,
            9 => Vpi,
            10 => Rocm,
            11 => RocmHost,
            12 => ExtDev,
            13 => CudaManaged,
            14 => OneApi,
            15 => WebGpu,
            16 => Hexagon,
            17 => Maia,
            _ => return None,
        })
    }
}

/// A device: its type (a `DLDeviceType` value) and ordinal.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// A `DLDeviceType` value.
    pub device_type: i32,
    pub device_id: i32,
}

impl DLDevice {
    /// Host memory, device 0.
    ///
    /// cbindgen:ignore
    pub const CPU: DLDevice = DLDevice {
        device_type: DLDeviceType::Cpu as i32,
        device_id: 0,
    };
}

/// Type codes of [`DLDataType::code`]. Values are DLPack's and never change.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DLDataTypeCode {
    Int = 0,
    UInt = 1,
    Float = 2,
    OpaqueHandle = 3,
    Bfloat = 4,
    Complex = 5,
    Bool = 6,
    /// The 8-bit and 4-bit floats of DLPack 1.1 (codes 7–9, 15 and 16 have no ONNX type).
    Float8E4M3FN = 10,
    Float8E4M3FNUZ = 11,
    Float8E5M2 = 12,
    Float8E5M2FNUZ = 13,
    Float8E8M0FNU = 14,
    Float4E2M1FN = 17,
}

/// An element type: a `DLDataTypeCode` value, the bits of one lane, and the number of lanes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// A tensor, laid out as DLPack's `DLTensor`.
///
/// `data + byte_offset` is the first element. `shape` points at `ndim` extents. `strides` is
/// either NULL (compact row-major) or points at `ndim` strides counted in elements. None of the
/// pointers is owned by the `DLTensor` itself: the ABI function that hands one out says who owns
/// the memory and how long it lives.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}
