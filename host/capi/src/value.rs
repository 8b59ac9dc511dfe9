//! `EpxHostValue`: a tensor (strings included), sequence, map or optional owned by the
//! application or read from a run's outputs.

use super::*;

/// A value owned by the application (ABI-independent): a host tensor (strings included), a
/// sequence, a map or an optional. Made with the `epx_value_new_*` functions and freed with
/// [`epx_value_free`]; values read from a run's outputs belong to the outputs.
pub struct EpxHostValue {
    pub(crate) node: HostNode,
    /// A tensor's extents as `int64`, made when first asked for (they live as long as the value).
    pub(crate) dims: std::sync::OnceLock<Vec<i64>>,
    /// Made by an `epx_value_new_*` function and not yet handed to another: the caller may
    /// pass it on or free it. Values inside others and values of outputs are not the caller's.
    pub(crate) caller_owns: bool,
}

pub(crate) enum HostNode {
    Tensor(Tensor),
    Sequence(Option<ElementType>, Vec<EpxHostValue>),
    Map(Box<EpxHostValue>, Box<EpxHostValue>),
    Optional(Option<Box<EpxHostValue>>),
}

impl EpxHostValue {
    pub(crate) fn of(v: Value) -> Res<EpxHostValue> {
        Ok(EpxHostValue {
            dims: std::sync::OnceLock::new(),
            caller_owns: false,
            node: match v {
                Value::Host(t) => HostNode::Tensor(t),
                Value::Device(t) => HostNode::Tensor(t.to_host()?),
                Value::Sequence(s) => {
                    let elem = s.elem_type();
                    HostNode::Sequence(
                        elem,
                        s.into_items()
                            .into_iter()
                            .map(EpxHostValue::of)
                            .collect::<Res<_>>()?,
                    )
                }
                Value::Map(m) => {
                    let (k, v) = m.into_parts();
                    HostNode::Map(
                        Box::new(EpxHostValue {
                            dims: std::sync::OnceLock::new(),
                            caller_owns: false,
                            node: HostNode::Tensor(k),
                        }),
                        Box::new(EpxHostValue {
                            dims: std::sync::OnceLock::new(),
                            caller_owns: false,
                            node: HostNode::Tensor(v),
                        }),
                    )
                }
                Value::Optional(v) => HostNode::Optional(match v {
                    Some(v) => Some(Box::new(EpxHostValue::of(*v)?)),
                    None => None,
                }),
            },
        })
    }

    /// A copy as a session value.
    pub(crate) fn to_value(&self) -> Res<Value> {
        Ok(match &self.node {
            HostNode::Tensor(t) => Value::Host(t.try_clone()?),
            HostNode::Sequence(elem, items) => Value::Sequence(Sequence::new(
                *elem,
                items
                    .iter()
                    .map(EpxHostValue::to_value)
                    .collect::<Res<_>>()?,
            )?),
            HostNode::Map(k, v) => Value::Map(Map::new(
                k.tensor()?.try_clone()?,
                v.tensor()?.try_clone()?,
            )?),
            HostNode::Optional(v) => Value::Optional(match v {
                Some(v) => Some(Box::new(v.to_value()?)),
                None => None,
            }),
        })
    }

    fn tensor(&self) -> Res<&Tensor> {
        match &self.node {
            HostNode::Tensor(t) => Ok(t),
            _ => Err(invalid("the value is not a tensor")),
        }
    }

    fn kind(&self) -> EpxValueKind {
        match self.node {
            HostNode::Tensor(_) => EpxValueKind::Tensor,
            HostNode::Sequence(..) => EpxValueKind::Sequence,
            HostNode::Map(..) => EpxValueKind::Map,
            HostNode::Optional(_) => EpxValueKind::Optional,
        }
    }
}

pub(crate) fn give_value(
    mut v: EpxHostValue,
    out: Option<&mut MaybeUninit<*mut EpxHostValue>>,
) -> Res<()> {
    v.caller_owns = true;
    put(out, "out", Box::into_raw(Box::new(v)))
}

/// Takes over values passed by the caller: every non-NULL pointer is freed whatever the
/// outcome, so the caller never frees them.
///
/// # Safety
/// Each pointer is NULL or a live value the caller owns and stops using.
pub(crate) unsafe fn take_values(ptrs: &[*mut EpxHostValue]) -> Res<Vec<EpxHostValue>> {
    // bounded: one per value the caller passed (its array holds that many).
    let mut seen = std::collections::HashSet::with_capacity(ptrs.len());
    let mut taken = Vec::with_capacity(ptrs.len());
    let mut problem = None;
    for (i, &p) in ptrs.iter().enumerate() {
        if p.is_null() {
            problem.get_or_insert_with(|| invalid(format!("value {i} is NULL")));
        } else if !seen.insert(p) {
            // Taken once already: freeing it again would be a double free.
            problem.get_or_insert_with(|| invalid(format!("value {i} is given twice")));
        // SAFETY: the caller's contract: a live value.
        } else if !unsafe { &*p }.caller_owns {
            problem.get_or_insert_with(|| {
                invalid(format!(
                    "value {i} belongs to another value or to a run's outputs; only values \
                     made with epx_value_new_* can be handed over"
                ))
            });
        } else {
            // SAFETY: the caller's contract: a value it owns, seen here for the first time.
            let mut v = *unsafe { Box::from_raw(p) };
            v.caller_owns = false;
            taken.push(v);
        }
    }
    match problem {
        Some(e) => Err(e),
        None => Ok(taken),
    }
}

/// A new tensor value: a copy of `tensor`'s data (numeric and bool types; `name` is ignored).
///
/// # Safety
/// `tensor` points at a valid [`EpxTensorRef`]; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_tensor(
    tensor: *const EpxTensorRef,
    out: Option<&mut MaybeUninit<*mut EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: the caller's contract for `tensor` and the pointers in it.
        let r = object(unsafe { tensor.as_ref() }, "tensor")?;
        // SAFETY: the pointers in `r` are valid as `EpxTensorRef` documents, per this function's
        // contract.
        let t = unsafe { tensor_from_ref(r, "tensor") }?;
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Tensor(t),
            },
            out,
        )
    })
}

/// A new string tensor value of `ndim` extents `shape`, from one NUL-terminated UTF-8 string
/// per element (C order), copied.
///
/// # Safety
/// `strings` holds as many valid C strings as the shape has elements; `shape` holds `ndim`
/// extents; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_strings(
    strings: *const *const c_char,
    shape: *const i64,
    ndim: usize,
    out: Option<&mut MaybeUninit<*mut EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: `shape` is NULL or points at `ndim` elements, per this function's contract.
        let dims = unsafe { slice(shape, ndim, "shape") }?;
        let shape = shape_of(dims, "strings")?;
        let count = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| invalid(format!("shape {shape:?} is too large")))?;
        // SAFETY: `strings` is NULL or points at `count` elements, per this function's contract.
        let ptrs = unsafe { slice(strings, count, "strings") }?;
        let mut v = Vec::new();
        // bounded: one entry per string the caller passed, reserved fallibly.
        v.try_reserve_exact(count)
            .map_err(|_| invalid(format!("{count} strings: the memory is not there")))?;
        for (i, &p) in ptrs.iter().enumerate() {
            // SAFETY: `p` is NULL or a NUL-terminated string, per this function's contract.
            v.push(
                unsafe { text(p, &format!("strings[{i}]")) }?
                    .as_bytes()
                    .to_vec(),
            );
        }
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Tensor(Tensor::from_strings(&shape, v)?),
            },
            out,
        )
    })
}

/// A new sequence of `n_items` values, taken over (freed by it, whatever the outcome).
/// `elem_type` is the `EpxElementType` of its tensors (needed for an empty sequence; 0 for a
/// sequence of maps).
///
/// # Safety
/// `items` holds `n_items` live values the caller owns; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_sequence(
    elem_type: i32,
    items: *const *mut EpxHostValue,
    n_items: usize,
    out: Option<&mut MaybeUninit<*mut EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: `items` is NULL or points at `n_items` elements, per this function's contract.
        let ptrs = unsafe { slice(items, n_items, "items") }?;
        // SAFETY: each pointer is NULL or a value the caller owns and hands over, per this
        // function's contract.
        let items = unsafe { take_values(ptrs) }?;
        let elem = match elem_type {
            0 => None,
            code => Some(element_type(code, "elem_type")?),
        };
        if let Some(first) = items.first() {
            if items.iter().any(|v| v.kind() != first.kind()) {
                return Err(invalid("sequence items must all be of one kind"));
            }
        }
        if let Some(want) = elem {
            if let Some(bad) = items
                .iter()
                .filter_map(|v| v.tensor().ok())
                .find(|t| t.elem_type() != want)
            {
                return Err(invalid(format!(
                    "a sequence of {want} tensors cannot hold a {} tensor",
                    bad.elem_type()
                )));
            }
        }
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Sequence(elem, items),
            },
            out,
        )
    })
}

/// A new map from 1-D `keys` (int64 or string) to 1-D `values` of the same length, both taken
/// over.
///
/// # Safety
/// `keys` and `values` are live tensor values the caller owns; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_map(
    keys: *mut EpxHostValue,
    values: *mut EpxHostValue,
    out: Option<&mut MaybeUninit<*mut EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        // SAFETY: each pointer is NULL or a value the caller owns and hands over, per this
        // function's contract.
        let mut taken = unsafe { take_values(&[keys, values]) }?.into_iter();
        let (Some(k), Some(v)) = (taken.next(), taken.next()) else {
            return Err(invalid("a map needs keys and values"));
        };
        Map::check(k.tensor()?, v.tensor()?)?;
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Map(Box::new(k), Box::new(v)),
            },
            out,
        )
    })
}

/// A new optional holding `value` (taken over), or none when `value` is NULL.
///
/// # Safety
/// `value` is NULL or a live value the caller owns; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_new_optional(
    value: *mut EpxHostValue,
    out: Option<&mut MaybeUninit<*mut EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        let inner = if value.is_null() {
            None
        } else {
            // SAFETY: each pointer is NULL or a value the caller owns and hands over, per this
            // function's contract.
            unsafe { take_values(&[value]) }?.pop()
        };
        give_value(
            EpxHostValue {
                dims: std::sync::OnceLock::new(),
                caller_owns: false,
                node: HostNode::Optional(inner.map(Box::new)),
            },
            out,
        )
    })
}

/// Frees a value made with an `epx_value_new_*` function and not handed to another. NULL is a
/// no-op. Values read from outputs belong to the outputs; do not free them.
///
/// # Safety
/// `value` is NULL or a value the caller owns, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_free(value: *mut EpxHostValue) {
    if !value.is_null() {
        ffi_boundary!({
            // SAFETY: the caller's contract: a live value. One it does not own (inside another
            // value, or an output's) is left alone rather than freed under its owner.
            if unsafe { &*value }.caller_owns {
                // SAFETY: made by `give_value`, owned by the caller, freed once.
                drop(unsafe { Box::from_raw(value) });
            }
        });
    }
}

/// What a value is (an `EpxValueKind` of epx_plugin.h); 0 for NULL.
///
/// Pointers: `value` is NULL or a live value.
#[unsafe(no_mangle)]
pub extern "C" fn epx_value_kind(value: Option<&EpxHostValue>) -> u32 {
    ffi_boundary!(value.map_or(0, |v| v.kind() as u32))
}

/// A tensor value as element type, shape and data, valid as long as the value (`name` is
/// NULL). For a string tensor `data` is NULL and `byte_len` 0: read its elements with
/// [`epx_value_string`].
///
/// Pointers: `value` is a live value; `out` writable.
#[unsafe(no_mangle)]
pub extern "C" fn epx_value_tensor(
    value: Option<&EpxHostValue>,
    out: Option<&mut MaybeUninit<EpxTensorRef>>,
) -> *mut EpxError {
    ffi_boundary!({
        let v = object(value, "value")?;
        let t = v.tensor()?;
        let bytes = t.bytes();
        let shape = value_shape(v)?;
        put(
            out,
            "out",
            EpxTensorRef {
                name: std::ptr::null(),
                elem_type: t.elem_type() as i32,
                shape: if shape.is_empty() {
                    std::ptr::null()
                } else {
                    shape.as_ptr()
                },
                ndim: shape.len(),
                data: bytes.map_or(std::ptr::null(), |b| b.as_ptr().cast()),
                byte_len: bytes.map_or(0, <[u8]>::len),
            },
        )
    })
}

/// A tensor value's extents as `int64`, kept in the value.
pub(crate) fn value_shape(v: &EpxHostValue) -> Res<&[i64]> {
    let t = v.tensor()?;
    Ok(v.dims
        .get_or_init(|| t.shape().iter().map(|&d| d as i64).collect()))
}

/// Element `index` (C order) of a string tensor value: `*data` and `*len` receive its bytes
/// (UTF-8, not NUL-terminated), valid as long as the value. `*count` (may be NULL) receives the
/// number of elements.
///
/// # Safety
/// `value` is a live value; `data` and `len` writable; `count` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_string(
    value: Option<&EpxHostValue>,
    index: usize,
    data: Option<&mut MaybeUninit<*const c_char>>,
    len: Option<&mut MaybeUninit<usize>>,
    count: Option<&mut MaybeUninit<usize>>,
) -> *mut EpxError {
    ffi_boundary!({
        let t = object(value, "value")?.tensor()?;
        let strings = t
            .strings()
            .ok_or_else(|| invalid("not a string tensor: read it with epx_value_tensor"))?;
        if let Some(count) = count {
            count.write(strings.len());
        }
        // Only the count asked for.
        if data.is_none() && len.is_none() {
            return Ok(());
        }
        let s = strings.get(index).ok_or_else(|| {
            invalid(format!(
                "index {index} out of range ({} strings)",
                strings.len()
            ))
        })?;
        put(data, "data", s.as_ptr().cast::<c_char>())?;
        put(len, "len", s.len())
    })
}

/// The number of items of a sequence value (0 for NULL or another kind).
///
/// Pointers: `value` is NULL or a live value.
#[unsafe(no_mangle)]
pub extern "C" fn epx_value_sequence_len(value: Option<&EpxHostValue>) -> usize {
    ffi_boundary!({
        match value.map(|v| &v.node) {
            Some(HostNode::Sequence(_, items)) => items.len(),
            _ => 0,
        }
    })
}

/// Item `index` of a sequence value, borrowed from it.
///
/// # Safety
/// `value` is a live value; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_sequence_at(
    value: Option<&EpxHostValue>,
    index: usize,
    out: Option<&mut MaybeUninit<*const EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        let HostNode::Sequence(_, items) = &object(value, "value")?.node else {
            return Err(invalid("the value is not a sequence"));
        };
        let item = items.get(index).ok_or_else(|| {
            invalid(format!(
                "index {index} out of range ({} items)",
                items.len()
            ))
        })?;
        put(out, "out", item as *const EpxHostValue)
    })
}

/// A map value's keys and values (two 1-D tensor values of one length), borrowed from it.
///
/// # Safety
/// `value` is a live value; `keys` and `values` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_map(
    value: Option<&EpxHostValue>,
    keys: Option<&mut MaybeUninit<*const EpxHostValue>>,
    values: Option<&mut MaybeUninit<*const EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        let HostNode::Map(k, v) = &object(value, "value")?.node else {
            return Err(invalid("the value is not a map"));
        };
        put(keys, "keys", &**k as *const EpxHostValue)?;
        put(values, "values", &**v as *const EpxHostValue)
    })
}

/// An optional value's content, borrowed from it: `*out` is NULL when it holds none.
///
/// # Safety
/// `value` is a live value; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_value_optional(
    value: Option<&EpxHostValue>,
    out: Option<&mut MaybeUninit<*const EpxHostValue>>,
) -> *mut EpxError {
    ffi_boundary!({
        let HostNode::Optional(inner) = &object(value, "value")?.node else {
            return Err(invalid("the value is not an optional"));
        };
        let p = inner
            .as_deref()
            .map_or(std::ptr::null(), |v| v as *const EpxHostValue);
        put(out, "out", p)
    })
}
impl PanicPointee for EpxHostValue {}
