//! Tensors as the host and its users hold them: an element type, a shape and host memory.

use std::fmt;

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn};

pub use epx_plugin_api::ElementType;

use crate::error::{Error, Result};

/// A dense tensor in host memory, C order.
///
/// Not `Clone`: a copy is as large as the tensor, which a model or an input sized, so it is made
/// with [`Tensor::try_clone`], an error (not an abort) when the memory is not there.
#[derive(PartialEq)]
pub struct Tensor {
    elem_type: ElementType,
    shape: Vec<usize>,
    data: Storage,
}

#[derive(PartialEq)]
enum Storage {
    /// Numeric and bool data; `u64` words keep every element type aligned.
    Bytes {
        words: Vec<u64>,
        len: usize,
    },
    Strings(Vec<Vec<u8>>),
}

/// Element types a tensor can be viewed as in Rust. Sealed: plain-old-data types, whose every
/// bit pattern is valid, and bool, whose bytes are checked to be 0 or 1.
pub trait TensorElement: Copy + Send + Sync + 'static + sealed::Sealed {
    const TYPE: ElementType;
}

mod sealed {
    /// Element slices over a tensor's bytes, through `bytemuck`: `None` when the bytes are not
    /// aligned for the type or are not valid values of it.
    pub trait Sealed: Sized {
        fn from_bytes(bytes: &[u8]) -> Option<&[Self]>;
        fn from_bytes_mut(bytes: &mut [u8]) -> Option<&mut [Self]>;
    }
}

macro_rules! elements {
    ($($t:ty => $e:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn from_bytes(bytes: &[u8]) -> Option<&[Self]> {
                bytemuck::try_cast_slice(bytes).ok()
            }
            fn from_bytes_mut(bytes: &mut [u8]) -> Option<&mut [Self]> {
                bytemuck::try_cast_slice_mut(bytes).ok()
            }
        }
        impl TensorElement for $t { const TYPE: ElementType = ElementType::$e; }
    )*};
}
elements!(f32 => Float, f64 => Double, f16 => Float16, bf16 => Bfloat16, i8 => Int8, i16 => Int16,
    i32 => Int32, i64 => Int64, u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64);

impl sealed::Sealed for bool {
    fn from_bytes(bytes: &[u8]) -> Option<&[Self]> {
        bytemuck::checked::try_cast_slice(bytes).ok()
    }
    fn from_bytes_mut(bytes: &mut [u8]) -> Option<&mut [Self]> {
        bytemuck::checked::try_cast_slice_mut(bytes).ok()
    }
}
impl TensorElement for bool {
    const TYPE: ElementType = ElementType::Bool;
}

fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The largest tensor epx allocates (shared with the CPU EP's kernels), and how to set it for
/// the process: `set_max_tensor_bytes`, else `EPX_MAX_TENSOR_BYTES`, else the machine's memory.
pub use epx_cpu::limits::{max_tensor_bytes, set_max_tensor_bytes, with_max_tensor_bytes};

/// An error when `bytes` are more than [`max_tensor_bytes`].
fn check_size(bytes: u64, what: &impl Fn() -> String) -> Result<()> {
    let limit = max_tensor_bytes();
    if bytes > limit {
        return Err(Error::InvalidInput(format!(
            "{} needs {bytes} bytes, more than the {limit} this host allocates for one tensor \
             (EPX_MAX_TENSOR_BYTES; default: the machine's memory)",
            what()
        )));
    }
    Ok(())
}

/// `words` zeroed `u64`s, or an error (over [`max_tensor_bytes`], or the allocator refused).
fn zeroed_words(words: usize, what: impl Fn() -> String) -> Result<Vec<u64>> {
    let bytes = (words as u64).saturating_mul(8);
    check_size(bytes, &what)?;
    let mut v = Vec::new();
    v.try_reserve_exact(words)
        .map_err(|_| Error::InvalidInput(format!("{}: cannot allocate {bytes} bytes", what())))?;
    v.resize(words, 0);
    Ok(v)
}

impl Tensor {
    /// A zero-filled tensor; an error (not an abort) when it is too big to allocate.
    pub fn zeros(elem_type: ElementType, shape: &[usize]) -> Result<Self> {
        let count = element_count(shape)
            .ok_or_else(|| Error::InvalidInput(format!("tensor shape {shape:?} overflows")))?;
        if elem_type == ElementType::String {
            // An empty string is three words of bookkeeping.
            let what = || format!("a string tensor of shape {shape:?}");
            check_size((count as u64).saturating_mul(24), &what)?;
            let mut strings = Vec::new();
            strings.try_reserve_exact(count).map_err(|_| {
                Error::InvalidInput(format!("a string tensor of shape {shape:?} is too big"))
            })?;
            strings.resize(count, Vec::new());
            return Ok(Tensor {
                elem_type,
                shape: shape.to_vec(),
                data: Storage::Strings(strings),
            });
        }
        let len = elem_type.storage_bytes(count).ok_or_else(|| {
            Error::InvalidInput(format!("{elem_type} tensor of shape {shape:?} overflows"))
        })?;
        let words = zeroed_words(len.div_ceil(8), || {
            format!("a {elem_type} tensor of shape {shape:?}")
        })?;
        Ok(Tensor {
            elem_type,
            shape: shape.to_vec(),
            data: Storage::Bytes { words, len },
        })
    }

    /// A tensor from little-endian, C-order bytes. Checks the length, and that bools are 0 or 1.
    pub fn from_bytes(elem_type: ElementType, shape: &[usize], bytes: &[u8]) -> Result<Self> {
        let mut t = Self::zeros(elem_type, shape)?;
        let dst = t
            .bytes_mut()
            .ok_or_else(|| Error::InvalidInput("string tensors have no bytes".into()))?;
        if dst.len() != bytes.len() {
            return Err(Error::InvalidInput(format!(
                "{elem_type} tensor of shape {shape:?} needs {} bytes, got {}",
                dst.len(),
                bytes.len()
            )));
        }
        if elem_type == ElementType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(Error::InvalidInput(
                "bool tensor holds a byte other than 0 or 1".into(),
            ));
        }
        dst.copy_from_slice(bytes);
        Ok(t)
    }

    /// A string tensor.
    pub fn from_strings(shape: &[usize], strings: Vec<Vec<u8>>) -> Result<Self> {
        if element_count(shape) != Some(strings.len()) {
            return Err(Error::InvalidInput(format!(
                "string tensor of shape {shape:?} given {} strings",
                strings.len()
            )));
        }
        Ok(Tensor {
            elem_type: ElementType::String,
            shape: shape.to_vec(),
            data: Storage::Strings(strings),
        })
    }

    /// A tensor owning a copy of an ndarray array (any layout).
    pub fn from_array<T: TensorElement, D: ndarray::Dimension>(
        array: ndarray::Array<T, D>,
    ) -> Self {
        let shape = array.shape().to_vec();
        let mut t = Self::zeros(T::TYPE, &shape).unwrap_or_else(|_| unreachable_shape());
        if let Some(dst) = t.as_mut_slice::<T>() {
            for (d, s) in dst.iter_mut().zip(array.iter()) {
                *d = *s;
            }
        }
        t
    }

    pub fn elem_type(&self) -> ElementType {
        self.elem_type
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn len(&self) -> usize {
        element_count(&self.shape).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw bytes (None for string tensors).
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.data {
            Storage::Bytes { words, len } => Some(&words_as_bytes(words)[..*len]),
            Storage::Strings(_) => None,
        }
    }

    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.data {
            Storage::Bytes { words, len } => Some(&mut words_as_bytes_mut(words)[..*len]),
            Storage::Strings(_) => None,
        }
    }

    /// The strings of a string tensor.
    pub fn strings(&self) -> Option<&[Vec<u8>]> {
        match &self.data {
            Storage::Strings(s) => Some(s),
            Storage::Bytes { .. } => None,
        }
    }

    /// The elements as a slice of `T`, if the element type is `T`.
    pub fn as_slice<T: TensorElement>(&self) -> Option<&[T]> {
        if self.elem_type != T::TYPE {
            return None;
        }
        let Storage::Bytes { words, .. } = &self.data else {
            return None;
        };
        // The words are allocated for this type and shape, so they hold every element.
        let bytes = words_as_bytes(words).get(..self.len() * std::mem::size_of::<T>())?;
        T::from_bytes(bytes)
    }

    pub fn as_mut_slice<T: TensorElement>(&mut self) -> Option<&mut [T]> {
        if self.elem_type != T::TYPE {
            return None;
        }
        let n = self.len() * std::mem::size_of::<T>();
        let Storage::Bytes { words, .. } = &mut self.data else {
            return None;
        };
        T::from_bytes_mut(words_as_bytes_mut(words).get_mut(..n)?)
    }

    /// A view as an ndarray array of `T`.
    pub fn view<T: TensorElement>(&self) -> Result<ArrayViewD<'_, T>> {
        let data = self
            .as_slice::<T>()
            .ok_or_else(|| self.type_mismatch(T::TYPE))?;
        ArrayViewD::from_shape(IxDyn(&self.shape), data)
            .map_err(|e| Error::InvalidInput(e.to_string()))
    }

    /// A copy as an owned ndarray array of `T`; an error, not an abort, when the memory for it
    /// cannot be had.
    pub fn to_array<T: TensorElement>(&self) -> Result<ArrayD<T>> {
        let data = self
            .as_slice::<T>()
            .ok_or_else(|| self.type_mismatch(T::TYPE))?;
        let mut v = Vec::new();
        v.try_reserve_exact(data.len())
            .map_err(|_| self.no_memory())?;
        v.extend_from_slice(data);
        ArrayD::from_shape_vec(IxDyn(&self.shape), v)
            .map_err(|e| Error::InvalidInput(e.to_string()))
    }

    /// A copy of the tensor: an error naming its size, not an abort, when the allocator
    /// refuses (an address-space limit, a container's memory limit).
    pub fn try_clone(&self) -> Result<Tensor> {
        let data = match &self.data {
            Storage::Bytes { words, len } => {
                let mut copy = Vec::new();
                copy.try_reserve_exact(words.len())
                    .map_err(|_| self.no_memory())?;
                copy.extend_from_slice(words);
                Storage::Bytes {
                    words: copy,
                    len: *len,
                }
            }
            Storage::Strings(strings) => {
                let mut copy = Vec::new();
                copy.try_reserve_exact(strings.len())
                    .map_err(|_| self.no_memory())?;
                for s in strings {
                    let mut c = Vec::new();
                    c.try_reserve_exact(s.len()).map_err(|_| self.no_memory())?;
                    c.extend_from_slice(s);
                    copy.push(c);
                }
                Storage::Strings(copy)
            }
        };
        Ok(Tensor {
            elem_type: self.elem_type,
            shape: self.shape.clone(),
            data,
        })
    }

    /// The error for a copy the allocator refused.
    fn no_memory(&self) -> Error {
        let bytes = match &self.data {
            Storage::Bytes { len, .. } => *len as u64,
            Storage::Strings(s) => s.iter().map(|x| x.len() as u64 + 24).sum(),
        };
        Error::Run(format!(
            "cannot allocate {bytes} bytes to copy a {} tensor of shape {:?}: the memory is not \
             there (an address-space or container limit)",
            self.elem_type, self.shape
        ))
    }

    fn type_mismatch(&self, wanted: ElementType) -> Error {
        Error::InvalidInput(format!("tensor holds {}, not {wanted}", self.elem_type))
    }

    /// Raw pointer to the first byte (host memory), for DLPack views.
    pub(crate) fn data_ptr(&self) -> *const u8 {
        match &self.data {
            Storage::Bytes { words, .. } => words.as_ptr().cast::<u8>(),
            Storage::Strings(s) => s.as_ptr().cast::<u8>(),
        }
    }
}

#[cold]
fn unreachable_shape() -> Tensor {
    // An ndarray array's shape never overflows usize element counts (ndarray checks), so
    // `zeros` cannot fail for one; an empty tensor is the harmless answer if it ever did.
    Tensor {
        elem_type: ElementType::Float,
        shape: vec![0],
        data: Storage::Bytes {
            words: Vec::new(),
            len: 0,
        },
    }
}

fn words_as_bytes(words: &[u64]) -> &[u8] {
    bytemuck::cast_slice(words)
}

fn words_as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    bytemuck::cast_slice_mut(words)
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}>{:?}", self.elem_type, self.shape)
    }
}

impl<T: TensorElement, D: ndarray::Dimension> From<ndarray::Array<T, D>> for Tensor {
    fn from(a: ndarray::Array<T, D>) -> Self {
        Tensor::from_array(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_round_trip() {
        let a = ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0]]);
        let t = Tensor::from_array(a.clone().reversed_axes());
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 3.0, 2.0, 4.0]);
        assert!(t.view::<i64>().is_err());
    }

    #[test]
    fn bytes_are_checked() {
        assert!(Tensor::from_bytes(ElementType::Bool, &[2], &[0, 2]).is_err());
        assert!(Tensor::from_bytes(ElementType::Float, &[2], &[0; 7]).is_err());
        let t = Tensor::from_bytes(ElementType::Int16, &[2], &[1, 0, 2, 0]).unwrap();
        assert_eq!(t.as_slice::<i16>().unwrap(), &[1, 2]);
    }
}
