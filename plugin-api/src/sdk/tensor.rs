//! Plain tensors in host memory as a plugin reads them: [`TensorView`] over a compact
//! `DLTensor`, and the Rust types ([`Element`]) its data is read and written as.

use crate::dlpack::{DLDeviceType, DLTensor};
use crate::dtype::ElementType;
use crate::status::{Error, Result};

/// A tensor in host memory, borrowed from the host for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub elem_type: ElementType,
    pub shape: &'a [i64],
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Views a compact DLTensor in host memory.
    ///
    /// # Safety
    /// The memory `t` points at (shape, strides, data) stays valid and unmodified for `'a`;
    /// `t` itself may be a short-lived copy.
    pub unsafe fn from_dl(t: &DLTensor) -> Result<Self> {
        let elem_type = ElementType::from_dlpack(t.dtype).ok_or_else(|| {
            Error::not_implemented(format!(
                "DLPack type (code {}, bits {}, lanes {}) has no ONNX equivalent",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ))
        })?;
        // SAFETY: the caller's contract.
        let (shape, count) = unsafe { host_layout(t) }?;
        let bytes = elem_type
            .storage_bytes(count)
            .ok_or_else(|| Error::invalid_argument("tensor size overflows"))?;
        let data: &[u8] = if bytes == 0 && t.data.is_null() {
            &[]
        } else if bytes == 0 {
            // Keep the tensor's own (aligned) address even when empty: typed views check it.
            // SAFETY: a non-null pointer with length 0 is a valid empty slice.
            unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), 0) }
        } else if t.data.is_null() {
            return Err(Error::invalid_argument("tensor data is NULL"));
        } else {
            let offset = usize::try_from(t.byte_offset)
                .map_err(|_| Error::invalid_argument("byte_offset too large"))?;
            // SAFETY: DLTensor contract: data + byte_offset points at `count` elements that
            // live for 'a (the caller's contract).
            unsafe { std::slice::from_raw_parts(t.data.cast::<u8>().add(offset), bytes) }
        };
        Ok(TensorView {
            elem_type,
            shape,
            data,
        })
    }

    /// The extents as `usize`.
    pub fn dims(&self) -> Vec<usize> {
        self.shape.iter().map(|&d| d as usize).collect()
    }

    /// The elements as `&[T]` (`view.as_slice::<f32>()?`); an error naming both types when the
    /// tensor holds another element type.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        check_type::<T>(self.elem_type)?;
        // SAFETY: `T` is a plain number type (sealed `Element`): every bit pattern is a value.
        let (head, body, tail) = unsafe { self.data.align_to::<T>() };
        if !head.is_empty() || !tail.is_empty() {
            return Err(Error::invalid_argument(format!(
                "tensor data is not aligned for {}",
                T::TYPE
            )));
        }
        Ok(body)
    }
}

/// A Rust type tensor elements are read and written as: `f32`, `f64`, `i8`, `u8`, `i16`,
/// `u16`, `i32`, `u32`, `i64`, `u64` (the ONNX types whose every bit pattern is a value).
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The element type a tensor of `Self` has.
    const TYPE: ElementType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($t:ty => $e:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const TYPE: ElementType = ElementType::$e;
        }
    )*};
}

elements!(
    f32 => Float, f64 => Double, i8 => Int8, u8 => Uint8, i16 => Int16, u16 => Uint16,
    i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64,
);

fn check_type<T: Element>(have: ElementType) -> Result<()> {
    if have == T::TYPE {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "the tensor holds {have}, read as {} (a {})",
        T::TYPE,
        std::any::type_name::<T>()
    )))
}

/// The shape and element count of a compact host-memory `DLTensor` (strides NULL or those of
/// the compact row-major layout).
///
/// # Safety
/// `t.shape` and `t.strides` point at `t.ndim` entries (or are NULL) living for `'a`.
pub(crate) unsafe fn host_layout<'a>(t: &DLTensor) -> Result<(&'a [i64], usize)> {
    if t.device.device_type != DLDeviceType::Cpu as i32 {
        return Err(Error::invalid_argument(format!(
            "tensor lives on device type {}, not in host memory",
            t.device.device_type
        )));
    }
    let ndim = usize::try_from(t.ndim)
        .map_err(|_| Error::invalid_argument(format!("negative ndim {}", t.ndim)))?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(Error::invalid_argument("tensor shape is NULL"));
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let mut count: usize = 1;
    for &d in shape {
        let d = usize::try_from(d)
            .map_err(|_| Error::invalid_argument(format!("negative extent {d}")))?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| Error::invalid_argument("tensor size overflows"))?;
    }
    if !t.strides.is_null() {
        // SAFETY: the caller's contract.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expect: i64 = 1;
        for (s, d) in strides.iter().zip(shape).rev() {
            if *d != 1 && *s != expect {
                return Err(Error::not_implemented(
                    "strided (non-compact) tensors are not supported",
                ));
            }
            expect = expect.saturating_mul(*d);
        }
    }
    Ok((shape, count))
}
