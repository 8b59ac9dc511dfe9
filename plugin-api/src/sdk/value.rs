//! Values beyond numeric tensors (ABI 1.3): string tensors, sequences, maps and optionals, as a
//! kernel reads them ([`ValueRef`], borrowed from the host) and builds them ([`OwnedValue`]).

use std::ffi::c_void;

use crate::abi::*;
use crate::dlpack::{DLDataType, DLTensor};
use crate::dtype::ElementType;
use crate::sdk::tensor::{TensorView, host_layout};
use crate::status::{Error, Result, take_status};

/// The `DLDataType` of a string tensor ([`EPX_DLPACK_STRING_CODE`]).
pub const STRING_DTYPE: DLDataType = DLDataType {
    code: EPX_DLPACK_STRING_CODE,
    bits: (8 * std::mem::size_of::<EpxStr>()) as u8,
    lanes: 1,
};

/// Whether a DLPack type is the string form.
pub fn is_string_dtype(dtype: DLDataType) -> bool {
    dtype == STRING_DTYPE
}

/// A string tensor in host memory, borrowed for `'a`: one [`EpxStr`] per element, C order.
#[derive(Clone, Copy, Debug)]
pub struct StringTensorView<'a> {
    pub shape: &'a [i64],
    pub strings: &'a [EpxStr],
}

impl<'a> StringTensorView<'a> {
    /// Views a string `DLTensor`.
    ///
    /// # Safety
    /// As [`TensorView::from_dl`]; every `EpxStr` points at bytes living for `'a`.
    pub unsafe fn from_dl(t: &DLTensor) -> Result<Self> {
        if !is_string_dtype(t.dtype) {
            return Err(Error::invalid_argument("not a string tensor"));
        }
        // SAFETY: the caller's contract.
        let (shape, count) = unsafe { host_layout(t) }?;
        let offset = usize::try_from(t.byte_offset)
            .ok()
            .filter(|o| o % std::mem::size_of::<EpxStr>() == 0)
            .ok_or_else(|| Error::invalid_argument("byte_offset is not a whole EpxStr"))?;
        let strings: &[EpxStr] = if count == 0 {
            &[]
        } else if t.data.is_null() {
            return Err(Error::invalid_argument("tensor data is NULL"));
        } else {
            // SAFETY: the string form: data + byte_offset points at `count` EpxStr living for 'a.
            unsafe {
                std::slice::from_raw_parts(t.data.cast::<u8>().add(offset).cast::<EpxStr>(), count)
            }
        };
        Ok(StringTensorView { shape, strings })
    }

    /// Element `i`'s bytes.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        // SAFETY: every EpxStr lives for 'a (constructor contract).
        self.strings.get(i).map(|s| unsafe { s.as_bytes() })
    }

    /// The elements' bytes, in C order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        (0..self.strings.len()).filter_map(|i| self.get(i))
    }

    /// The extents as `usize`.
    pub fn dims(&self) -> Vec<usize> {
        self.shape.iter().map(|&d| d as usize).collect()
    }
}

fn element_count(shape: &[i64]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d))
            .ok_or_else(|| Error::invalid_argument(format!("bad shape {shape:?}")))
    })
}

/// A value a kernel reads, borrowed from the host for the call.
#[derive(Clone, Debug)]
pub enum ValueRef<'a> {
    Tensor(TensorView<'a>),
    Strings(StringTensorView<'a>),
    /// The items and the element type of their tensors (`Undefined` for a sequence of maps).
    Sequence {
        elem_type: ElementType,
        items: Vec<ValueRef<'a>>,
    },
    Map {
        keys: Box<ValueRef<'a>>,
        values: Box<ValueRef<'a>>,
    },
    Optional(Option<Box<ValueRef<'a>>>),
}

/// A value a kernel builds and hands to the host ([`crate::sdk::KernelContext::set_output`]).
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedValue {
    /// Little-endian bytes in C order (narrow types packed), as `ElementType::storage_bytes`.
    Tensor {
        elem_type: ElementType,
        shape: Vec<i64>,
        data: Vec<u8>,
    },
    Strings {
        shape: Vec<i64>,
        strings: Vec<Vec<u8>>,
    },
    Sequence {
        elem_type: ElementType,
        items: Vec<OwnedValue>,
    },
    Map {
        keys: Box<OwnedValue>,
        values: Box<OwnedValue>,
    },
    Optional(Option<Box<OwnedValue>>),
}

fn missing(name: &str) -> Error {
    Error::new(
        EpxStatusCode::AbiMismatch,
        format!("host API has no `{name}` function (it is older than ABI 1.3)"),
    )
}

macro_rules! value_fn {
    ($api:expr, $f:ident) => {
        if $api.struct_size >= $crate::epx_field_end!(EpxHostApi, $f) {
            $api.$f.ok_or_else(|| missing(stringify!($f)))
        } else {
            Err(missing(stringify!($f)))
        }
    };
}

/// Reads a host value.
///
/// # Safety
/// `v` is a value the host handed out, alive for `'a`.
pub(crate) unsafe fn read_value<'a>(api: &EpxHostApi, v: *const EpxValue) -> Result<ValueRef<'a>> {
    let kind = value_fn!(api, value_kind)?;
    // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
    let raw_kind = unsafe { kind(v) };
    match EpxValueKind::from_raw(raw_kind) {
        Some(EpxValueKind::Tensor) => {
            let f = value_fn!(api, value_tensor)?;
            let mut t: *const DLTensor = std::ptr::null();
            // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
            unsafe { take_status(f(v, &mut t)) }?;
            // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
            let t = unsafe { t.as_ref() }
                .ok_or_else(|| Error::runtime("host returned no tensor for a tensor value"))?;
            if is_string_dtype(t.dtype) {
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                Ok(ValueRef::Strings(unsafe { StringTensorView::from_dl(t) }?))
            } else {
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                Ok(ValueRef::Tensor(unsafe { TensorView::from_dl(t) }?))
            }
        }
        Some(EpxValueKind::Sequence) => {
            let f = value_fn!(api, value_sequence)?;
            let at = value_fn!(api, value_sequence_at)?;
            let (mut len, mut elem) = (0usize, 0i32);
            // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
            unsafe { take_status(f(v, &mut len, &mut elem)) }?;
            let mut items = Vec::with_capacity(len.min(1 << 16));
            for i in 0..len {
                let mut item: *const EpxValue = std::ptr::null();
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                unsafe { take_status(at(v, i, &mut item)) }?;
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                items.push(unsafe { read_value(api, item) }?);
            }
            Ok(ValueRef::Sequence {
                elem_type: ElementType::from_onnx(elem).unwrap_or(ElementType::Undefined),
                items,
            })
        }
        Some(EpxValueKind::Map) => {
            let f = value_fn!(api, value_map)?;
            let (mut k, mut vals): (*const EpxValue, *const EpxValue) =
                (std::ptr::null(), std::ptr::null());
            // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
            unsafe { take_status(f(v, &mut k, &mut vals)) }?;
            Ok(ValueRef::Map {
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                keys: Box::new(unsafe { read_value(api, k) }?),
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                values: Box::new(unsafe { read_value(api, vals) }?),
            })
        }
        Some(EpxValueKind::Optional) => {
            let f = value_fn!(api, value_optional)?;
            let mut inner: *const EpxValue = std::ptr::null();
            // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
            unsafe { take_status(f(v, &mut inner)) }?;
            if inner.is_null() {
                Ok(ValueRef::Optional(None))
            } else {
                // SAFETY: host values reached from `v` live for 'a; out-pointers point at locals.
                Ok(ValueRef::Optional(Some(Box::new(unsafe {
                    read_value(api, inner)
                }?))))
            }
        }
        _ => Err(Error::runtime(format!(
            "host value of unknown kind {raw_kind}"
        ))),
    }
}

/// A value made on the host's side, freed on drop unless handed over.
struct Made<'h> {
    api: &'h EpxHostApi,
    raw: *mut EpxValue,
}

impl Made<'_> {
    fn into_raw(self) -> *mut EpxValue {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        if let Ok(f) = value_fn!(self.api, value_release) {
            // SAFETY: a value we made and still own.
            unsafe { f(self.raw) };
        }
    }
}

fn shape_arg(shape: &[i64]) -> Result<i32> {
    i32::try_from(shape.len()).map_err(|_| Error::invalid_argument("rank too large"))
}

/// Builds `value` as a host value owned by the caller.
pub(crate) fn make_value(api: &EpxHostApi, value: &OwnedValue) -> Result<*mut EpxValue> {
    make(api, value).map(Made::into_raw)
}

fn make<'h>(api: &'h EpxHostApi, value: &OwnedValue) -> Result<Made<'h>> {
    let mut out: *mut EpxValue = std::ptr::null_mut();
    match value {
        OwnedValue::Tensor {
            elem_type,
            shape,
            data,
        } => {
            let dtype = elem_type.to_dlpack().ok_or_else(|| {
                Error::not_implemented(format!("{elem_type} tensors have no DLPack form"))
            })?;
            // The host reads as many bytes as the shape needs: they must be there.
            let need = element_count(shape)?;
            if elem_type.storage_bytes(need) != Some(data.len()) {
                return Err(Error::invalid_argument(format!(
                    "a {elem_type} tensor of shape {shape:?} needs {:?} bytes, the value holds {}",
                    elem_type.storage_bytes(need),
                    data.len()
                )));
            }
            let f = value_fn!(api, value_new_tensor)?;
            // SAFETY: arguments point at locals alive for the call; values passed over are ours.
            unsafe {
                take_status(f(
                    dtype,
                    shape_arg(shape)?,
                    shape.as_ptr(),
                    data.as_ptr().cast::<c_void>(),
                    &mut out,
                ))
            }?;
        }
        OwnedValue::Strings { shape, strings } => {
            let need = element_count(shape)?;
            if need != strings.len() {
                return Err(Error::invalid_argument(format!(
                    "a string tensor of shape {shape:?} needs {need} strings, the value holds {}",
                    strings.len()
                )));
            }
            let f = value_fn!(api, value_new_tensor)?;
            let strs: Vec<EpxStr> = strings.iter().map(|s| EpxStr::from_bytes(s)).collect();
            // SAFETY: arguments point at locals alive for the call; values passed over are ours.
            unsafe {
                take_status(f(
                    STRING_DTYPE,
                    shape_arg(shape)?,
                    shape.as_ptr(),
                    strs.as_ptr().cast::<c_void>(),
                    &mut out,
                ))
            }?;
        }
        OwnedValue::Sequence { elem_type, items } => {
            let f = value_fn!(api, value_new_sequence)?;
            let mut made = Vec::with_capacity(items.len());
            for item in items {
                made.push(make(api, item)?);
            }
            let raws: Vec<*mut EpxValue> = made.into_iter().map(Made::into_raw).collect();
            // SAFETY: arguments point at locals alive for the call; values passed over are ours.
            unsafe { take_status(f(*elem_type as i32, raws.as_ptr(), raws.len(), &mut out)) }?;
        }
        OwnedValue::Map { keys, values } => {
            let f = value_fn!(api, value_new_map)?;
            let k = make(api, keys)?;
            let v = make(api, values)?;
            // SAFETY: arguments point at locals alive for the call; values passed over are ours.
            unsafe { take_status(f(k.into_raw(), v.into_raw(), &mut out)) }?;
        }
        OwnedValue::Optional(inner) => {
            let f = value_fn!(api, value_new_optional)?;
            let raw = match inner {
                Some(v) => make(api, v)?.into_raw(),
                None => std::ptr::null_mut(),
            };
            // SAFETY: arguments point at locals alive for the call; values passed over are ours.
            unsafe { take_status(f(raw, &mut out)) }?;
        }
    }
    if out.is_null() {
        return Err(Error::runtime("host made no value"));
    }
    Ok(Made { api, raw: out })
}
