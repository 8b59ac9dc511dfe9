//! Handles of the values that are not plain tensors (sequences, maps, optionals), with the
//! ownership rules of ABI 1.3, and the callbacks over them.
use std::ffi::c_void;

use epx_plugin_api::abi::*;
use epx_plugin_api::dlpack::{DLDataType, DLTensor};
use epx_plugin_api::ffi_boundary;
use epx_plugin_api::sdk::Error as SdkError;

use super::args::{index, out_ptr, read_shape};
use crate::value::{DlView, ElementType, Map, Sequence, Tensor, Value};

/// A tensor handed to a plugin for one call: a host tensor's view (owning its shape array) or
/// a device tensor's descriptor.
pub(crate) enum CallTensor {
    Host(Box<DlView>),
    Device(Box<DLTensor>),
}

impl CallTensor {
    pub(super) fn dl_mut(&mut self) -> &mut DLTensor {
        match self {
            CallTensor::Host(v) => &mut v.dl,
            CallTensor::Device(d) => d,
        }
    }
}

/// What an `EpxValue *` points at. Handles the host hands out borrow the session's values;
/// handles a plugin makes (`value_new_*`) own theirs until handed over.
pub(crate) struct ValueHandle {
    made_by_plugin: bool,
    node: HandleNode,
}

pub(super) enum HandleNode {
    /// `view` points into `owned` or into a session value that outlives the handle.
    Tensor {
        view: Box<DlView>,
        owned: Option<Tensor>,
    },
    Sequence {
        elem_type: Option<ElementType>,
        items: Vec<ValueHandle>,
    },
    Map {
        keys: Box<ValueHandle>,
        values: Box<ValueHandle>,
    },
    Optional(Option<Box<ValueHandle>>),
}

impl ValueHandle {
    /// Describes a host value for a plugin to read; the value must outlive the handle.
    pub(super) fn borrow(v: &Value) -> Result<Box<ValueHandle>, String> {
        let node = match v {
            Value::Host(t) => HandleNode::Tensor {
                view: DlView::of(t)
                    .ok_or_else(|| format!("{} tensors cannot cross the ABI", t.elem_type()))?,
                owned: None,
            },
            Value::Device(_) => {
                return Err("a device tensor is read with kernel_input, not as a value".into());
            }
            Value::Sequence(s) => HandleNode::Sequence {
                elem_type: s.elem_type(),
                items: s
                    .items()
                    .iter()
                    .map(|v| ValueHandle::borrow(v).map(|h| *h))
                    .collect::<Result<_, _>>()?,
            },
            Value::Map(m) => HandleNode::Map {
                keys: ValueHandle::borrow_tensor(m.keys())?,
                values: ValueHandle::borrow_tensor(m.values())?,
            },
            Value::Optional(v) => HandleNode::Optional(match v {
                Some(v) => Some(ValueHandle::borrow(v)?),
                None => None,
            }),
        };
        Ok(Box::new(ValueHandle {
            made_by_plugin: false,
            node,
        }))
    }

    pub(super) fn borrow_tensor(t: &Tensor) -> Result<Box<ValueHandle>, String> {
        Ok(Box::new(ValueHandle {
            made_by_plugin: false,
            node: HandleNode::Tensor {
                view: DlView::of(t)
                    .ok_or_else(|| format!("{} tensors cannot cross the ABI", t.elem_type()))?,
                owned: None,
            },
        }))
    }

    pub(super) fn owned_tensor(t: Tensor) -> Result<Box<ValueHandle>, SdkError> {
        let view = DlView::of(&t)
            .ok_or_else(|| SdkError::not_implemented(format!("{} values", t.elem_type())))?;
        Ok(Box::new(ValueHandle {
            made_by_plugin: true,
            node: HandleNode::Tensor {
                view,
                owned: Some(t),
            },
        }))
    }

    /// The handle as part of another value: the plugin may still read it (through the value
    /// holding it) but no longer hand it over or release it.
    pub(super) fn into_part(self) -> ValueHandle {
        ValueHandle {
            made_by_plugin: false,
            node: self.node,
        }
    }

    pub(super) fn kind(&self) -> EpxValueKind {
        match self.node {
            HandleNode::Tensor { .. } => EpxValueKind::Tensor,
            HandleNode::Sequence { .. } => EpxValueKind::Sequence,
            HandleNode::Map { .. } => EpxValueKind::Map,
            HandleNode::Optional(_) => EpxValueKind::Optional,
        }
    }

    /// The host value a plugin built.
    pub(super) fn into_value(self) -> Result<Value, SdkError> {
        let bad = |m: &str| SdkError::invalid_argument(m.to_string());
        Ok(match self.node {
            HandleNode::Tensor { owned: Some(t), .. } => Value::Host(t),
            HandleNode::Tensor { owned: None, .. } => {
                return Err(bad(
                    "a value the host lent cannot be handed back as an output",
                ));
            }
            HandleNode::Sequence { elem_type, items } => {
                let items = items
                    .into_iter()
                    .map(ValueHandle::into_value)
                    .collect::<Result<Vec<_>, _>>()?;
                Value::Sequence(
                    Sequence::new(elem_type, items)
                        .map_err(|e| SdkError::invalid_argument(e.to_string()))?,
                )
            }
            HandleNode::Map { keys, values } => {
                let tensor = |h: Box<ValueHandle>| match h.into_value()? {
                    Value::Host(t) => Ok(t),
                    _ => Err(bad("map keys and values must be tensors")),
                };
                Value::Map(
                    Map::new(tensor(keys)?, tensor(values)?)
                        .map_err(|e| SdkError::invalid_argument(e.to_string()))?,
                )
            }
            HandleNode::Optional(v) => Value::Optional(match v {
                Some(v) => Some(Box::new(v.into_value()?)),
                None => None,
            }),
        })
    }
}

/// # Safety
/// `v` is NULL or a live handle.
pub(super) unsafe fn handle<'a>(v: *const EpxValue) -> Result<&'a ValueHandle, SdkError> {
    // SAFETY: the caller's contract.
    unsafe { v.cast::<ValueHandle>().as_ref() }
        .ok_or_else(|| SdkError::invalid_argument("NULL value"))
}

/// Takes over a value a plugin made.
///
/// # Safety
/// `v` is NULL or a live handle, not used by the caller afterwards.
pub(super) unsafe fn take_handle(v: *mut EpxValue) -> Result<Box<ValueHandle>, SdkError> {
    // SAFETY: the caller's contract.
    let h = unsafe { handle(v) }?;
    if !h.made_by_plugin {
        return Err(SdkError::invalid_argument(
            "this value belongs to the host (it was lent for the call); only values made with \
             value_new_* can be handed over",
        ));
    }
    // SAFETY: made by `Box::into_raw` in a `value_new_*` function and owned by the caller.
    Ok(unsafe { Box::from_raw(v.cast::<ValueHandle>()) })
}

/// One input of a kernel call: the session's value, its tensor view when it is a tensor, and
/// (made when a plugin first asks) its value handle.
pub(super) unsafe extern "C" fn value_kind(value: *const EpxValue) -> u32 {
    ffi_boundary!({
        // SAFETY: host API contract: `value` is NULL or a live handle.
        unsafe { handle(value) }.map_or(0, |h| h.kind() as u32)
    })
}

pub(super) unsafe extern "C" fn value_tensor(
    value: *const EpxValue,
    out: *mut *const DLTensor,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let out = out_ptr(out)?;
        let HandleNode::Tensor { view, .. } = &h.node else {
            return Err(SdkError::invalid_argument("the value is not a tensor"));
        };
        // SAFETY: `out` checked non-null; the view lives as long as the handle.
        unsafe { *out = &view.dl };
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn value_sequence(
    value: *const EpxValue,
    len: *mut usize,
    elem_type: *mut i32,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Sequence {
            elem_type: ty,
            items,
        } = &h.node
        else {
            return Err(SdkError::invalid_argument("the value is not a sequence"));
        };
        let (len, elem_type) = (out_ptr(len)?, out_ptr(elem_type)?);
        // SAFETY: both checked non-null.
        unsafe {
            *len = items.len();
            *elem_type = ty.map_or(0, ElementType::onnx_code);
        }
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn value_sequence_at(
    value: *const EpxValue,
    index_: usize,
    out: *mut *const EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Sequence { items, .. } = &h.node else {
            return Err(SdkError::invalid_argument("the value is not a sequence"));
        };
        let i = index(items, index_, "sequence item")?;
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-null; the item lives as long as the sequence.
        unsafe { *out = (&items[i] as *const ValueHandle).cast::<EpxValue>() };
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn value_map(
    value: *const EpxValue,
    keys: *mut *const EpxValue,
    values: *mut *const EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Map { keys: k, values: v } = &h.node else {
            return Err(SdkError::invalid_argument("the value is not a map"));
        };
        let (keys, values) = (out_ptr(keys)?, out_ptr(values)?);
        // SAFETY: both checked non-null; the parts live as long as the map.
        unsafe {
            *keys = (&**k as *const ValueHandle).cast::<EpxValue>();
            *values = (&**v as *const ValueHandle).cast::<EpxValue>();
        }
        Ok::<(), SdkError>(())
    })
}

pub(super) unsafe extern "C" fn value_optional(
    value: *const EpxValue,
    out: *mut *const EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: host API contract.
        let h = unsafe { handle(value) }?;
        let HandleNode::Optional(inner) = &h.node else {
            return Err(SdkError::invalid_argument("the value is not an optional"));
        };
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-null; the inner value lives as long as the optional.
        unsafe {
            *out = inner.as_deref().map_or(std::ptr::null(), |v| {
                (v as *const ValueHandle).cast::<EpxValue>()
            })
        };
        Ok::<(), SdkError>(())
    })
}

/// Hands a new handle to the plugin.
pub(super) fn give(h: Box<ValueHandle>, out: *mut *mut EpxValue) -> Result<(), SdkError> {
    let out = out_ptr(out)?;
    // SAFETY: `out` checked non-null.
    unsafe { *out = Box::into_raw(h).cast::<EpxValue>() };
    Ok(())
}

pub(super) unsafe extern "C" fn value_new_tensor(
    dtype: DLDataType,
    ndim: i32,
    shape: *const i64,
    data: *const c_void,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        // SAFETY: plugin contract: `shape` holds `ndim` extents.
        let ushape = unsafe { read_shape(ndim, shape) }?;
        let count = ushape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| SdkError::invalid_argument(format!("shape {ushape:?} overflows")))?;
        let bad = |e: crate::error::Error| SdkError::invalid_argument(e.to_string());
        let tensor = if epx_plugin_api::sdk::is_string_dtype(dtype) {
            let strings = if count == 0 || data.is_null() {
                let mut v = Vec::new();
                v.try_reserve_exact(count).map_err(|_| {
                    SdkError::new(
                        EpxStatusCode::OutOfMemory,
                        format!("{count} strings do not fit in memory"),
                    )
                })?;
                v.resize(count, Vec::new());
                v
            } else {
                // SAFETY: plugin contract: `data` points at `count` EpxStr, each valid.
                unsafe {
                    std::slice::from_raw_parts(data.cast::<EpxStr>(), count)
                        .iter()
                        .map(|s| s.as_bytes().to_vec())
                        .collect()
                }
            };
            Tensor::from_strings(&ushape, strings).map_err(bad)?
        } else {
            let elem = ElementType::from_dlpack(dtype).ok_or_else(|| {
                SdkError::not_implemented(format!(
                    "dtype (code {}, bits {}, lanes {})",
                    dtype.code, dtype.bits, dtype.lanes
                ))
            })?;
            let mut t = Tensor::zeros(elem, &ushape)
                .map_err(|e| SdkError::new(EpxStatusCode::OutOfMemory, e.to_string()))?;
            if !data.is_null() {
                let bytes = t
                    .bytes_mut()
                    .ok_or_else(|| SdkError::not_implemented(format!("{elem} values")))?;
                // SAFETY: plugin contract: `data` holds the tensor's bytes, C order.
                let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), bytes.len()) };
                if elem == ElementType::Bool && src.iter().any(|&b| b > 1) {
                    return Err(SdkError::invalid_argument(
                        "a bool tensor holds a byte other than 0 or 1",
                    ));
                }
                bytes.copy_from_slice(src);
            }
            t
        };
        give(ValueHandle::owned_tensor(tensor)?, out)
    })
}

pub(super) unsafe extern "C" fn value_new_sequence(
    elem_type: i32,
    items: *const *mut EpxValue,
    num_items: usize,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        let raw: &[*mut EpxValue] = if num_items == 0 {
            &[]
        } else if items.is_null() {
            return Err(SdkError::invalid_argument("NULL items"));
        } else {
            // SAFETY: plugin contract: `items` holds `num_items` values.
            unsafe { std::slice::from_raw_parts(items, num_items) }
        };
        // Every item is taken over, also when one of them is refused; one given twice is taken
        // once (freeing it twice would corrupt the heap).
        let mut taken = Vec::with_capacity(raw.len());
        let mut refused = None;
        let mut seen = std::collections::HashSet::with_capacity(raw.len());
        for &v in raw {
            if !seen.insert(v) {
                refused = refused.or(Some(SdkError::invalid_argument(
                    "a value is given twice in one sequence",
                )));
                continue;
            }
            // SAFETY: plugin contract: each is a value it made and hands over.
            match unsafe { take_handle(v) } {
                Ok(h) => taken.push((*h).into_part()),
                Err(e) => refused = refused.or(Some(e)),
            }
        }
        if let Some(e) = refused {
            return Err(e);
        }
        let elem = match elem_type {
            0 => None,
            code => Some(ElementType::from_onnx(code).ok_or_else(|| {
                SdkError::invalid_argument(format!("unknown element type {code}"))
            })?),
        };
        for h in &taken {
            if let (HandleNode::Tensor { view, .. }, Some(want)) = (&h.node, elem) {
                let have = if epx_plugin_api::sdk::is_string_dtype(view.dl.dtype) {
                    Some(ElementType::String)
                } else {
                    ElementType::from_dlpack(view.dl.dtype)
                };
                if have != Some(want) {
                    return Err(SdkError::invalid_argument(format!(
                        "a sequence of {want} tensors cannot hold a {} tensor",
                        have.map_or("?".into(), |t| t.to_string())
                    )));
                }
            }
        }
        give(
            Box::new(ValueHandle {
                made_by_plugin: true,
                node: HandleNode::Sequence {
                    elem_type: elem,
                    items: taken,
                },
            }),
            out,
        )
    })
}

pub(super) unsafe extern "C" fn value_new_map(
    keys: *mut EpxValue,
    values: *mut EpxValue,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        if keys == values {
            // SAFETY: plugin contract: a value it made and hands over (taken once).
            drop(unsafe { take_handle(keys) });
            return Err(SdkError::invalid_argument(
                "a map's keys and values must be two values",
            ));
        }
        // SAFETY: plugin contract: both are values it made and hands over.
        let (k, v) = unsafe { (take_handle(keys), take_handle(values)) };
        let (k, v) = (Box::new((*k?).into_part()), Box::new((*v?).into_part()));
        // Checked here, where the plugin can be told, rather than at the output.
        fn tensor(h: &ValueHandle) -> Result<&Tensor, SdkError> {
            match &h.node {
                HandleNode::Tensor { owned: Some(t), .. } => Ok(t),
                _ => Err(SdkError::invalid_argument(
                    "map keys and values must be tensors",
                )),
            }
        }
        Map::check(tensor(&k)?, tensor(&v)?)
            .map_err(|e| SdkError::invalid_argument(e.to_string()))?;
        give(
            Box::new(ValueHandle {
                made_by_plugin: true,
                node: HandleNode::Map { keys: k, values: v },
            }),
            out,
        )
    })
}

pub(super) unsafe extern "C" fn value_new_optional(
    value: *mut EpxValue,
    out: *mut *mut EpxValue,
) -> *mut EpxStatus {
    ffi_boundary!({
        let inner = if value.is_null() {
            None
        } else {
            // SAFETY: plugin contract: a value it made and hands over.
            Some(Box::new((*unsafe { take_handle(value) }?).into_part()))
        };
        give(
            Box::new(ValueHandle {
                made_by_plugin: true,
                node: HandleNode::Optional(inner),
            }),
            out,
        )
    })
}

pub(super) unsafe extern "C" fn value_release(value: *mut EpxValue) {
    ffi_boundary!({
        if value.is_null() {
            return;
        }
        // SAFETY: plugin contract: a value it made and has not handed over.
        match unsafe { take_handle(value) } {
            Ok(h) => drop(h),
            Err(e) => tracing::warn!(target: "epx::plugin", "value_release: {e}"),
        }
    })
}
