//! Values as they flow through a session: tensors in host or device memory, and the non-tensor
//! values of ONNX — sequences, maps and optionals. The lowest layer of the host: it knows no
//! model and no plugin; a device tensor reaches its EP's memory through [`DeviceMemory`].

mod device;
mod dlpack;
pub(crate) mod tensor;

pub(crate) use device::DeviceMemory;
pub use device::DeviceTensor;
pub(crate) use dlpack::DlView;
pub use tensor::{ElementType, Tensor, TensorElement};

use crate::error::{Error, Result};

/// A model's input, output or intermediate value.
///
/// Tensors convert into it (`Tensor: Into<Value>`), so [`Session::run`](crate::Session::run)
/// takes plain tensors as well as sequences and maps.
#[derive(Debug)]
pub enum Value {
    /// A tensor in host memory (any element type, strings included).
    Host(Tensor),
    /// A tensor in a device EP's memory.
    Device(DeviceTensor),
    /// An ONNX `sequence`.
    Sequence(Sequence),
    /// An ONNX `map` (`ai.onnx.ml`).
    Map(Map),
    /// An ONNX `optional`: a value or none.
    Optional(Option<Box<Value>>),
}

/// An ONNX `sequence`: values of one type, in order. Items live in host memory.
#[derive(Debug)]
pub struct Sequence {
    elem_type: Option<ElementType>,
    items: Vec<Value>,
}

impl Sequence {
    /// A sequence of tensors, all of `elem_type` (checked; `elem_type` is what an empty
    /// sequence reports).
    pub fn of_tensors(elem_type: ElementType, tensors: Vec<Tensor>) -> Result<Self> {
        if let Some(t) = tensors.iter().find(|t| t.elem_type() != elem_type) {
            return Err(Error::InvalidInput(format!(
                "a sequence of {elem_type} tensors cannot hold a {} tensor",
                t.elem_type()
            )));
        }
        Ok(Sequence {
            elem_type: Some(elem_type),
            items: tensors.into_iter().map(Value::Host).collect(),
        })
    }

    /// A sequence of any host values (maps, for `ai.onnx.ml`'s `seq(map(K, V))`), with the
    /// element type of their tensors where known. Device tensors are refused.
    pub fn new(elem_type: Option<ElementType>, items: Vec<Value>) -> Result<Self> {
        if items.iter().any(|v| matches!(v, Value::Device(_))) {
            return Err(Error::InvalidInput(
                "sequence items live in host memory; copy device tensors to the host first".into(),
            ));
        }
        Ok(Sequence { elem_type, items })
    }

    /// The element type of the tensors it holds, where known.
    pub fn elem_type(&self) -> Option<ElementType> {
        self.elem_type
    }

    pub fn items(&self) -> &[Value] {
        &self.items
    }

    pub fn into_items(self) -> Vec<Value> {
        self.items
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items as host tensors, when every item is one.
    pub fn tensors(&self) -> Option<Vec<&Tensor>> {
        self.items
            .iter()
            .map(|v| match v {
                Value::Host(t) => Some(t),
                _ => None,
            })
            .collect()
    }
}

/// An ONNX `map`: 1-D keys (int64 or string) and 1-D values of one length, in order.
#[derive(Debug, PartialEq)]
pub struct Map {
    keys: Tensor,
    values: Tensor,
}

impl Map {
    /// Checks that keys are int64 or string, and both are 1-D of one length.
    pub fn new(keys: Tensor, values: Tensor) -> Result<Self> {
        Self::check(&keys, &values)?;
        Ok(Map { keys, values })
    }

    /// The checks of [`Map::new`].
    pub fn check(keys: &Tensor, values: &Tensor) -> Result<()> {
        if !matches!(keys.elem_type(), ElementType::Int64 | ElementType::String) {
            return Err(Error::InvalidInput(format!(
                "map keys must be int64 or string, got {}",
                keys.elem_type()
            )));
        }
        if keys.shape().len() != 1 || values.shape().len() != 1 || keys.shape() != values.shape() {
            return Err(Error::InvalidInput(format!(
                "map keys and values must be 1-D of one length, got shapes {:?} and {:?}",
                keys.shape(),
                values.shape()
            )));
        }
        Ok(())
    }

    pub fn keys(&self) -> &Tensor {
        &self.keys
    }

    pub fn values(&self) -> &Tensor {
        &self.values
    }

    pub fn len(&self) -> usize {
        self.keys.shape()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn into_parts(self) -> (Tensor, Tensor) {
        (self.keys, self.values)
    }

    /// A copy; an error, not an abort, when the memory is not there.
    pub fn try_clone(&self) -> Result<Map> {
        Ok(Map {
            keys: self.keys.try_clone()?,
            values: self.values.try_clone()?,
        })
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Host(t)
    }
}

impl From<Sequence> for Value {
    fn from(s: Sequence) -> Self {
        Value::Sequence(s)
    }
}

impl From<Map> for Value {
    fn from(m: Map) -> Self {
        Value::Map(m)
    }
}

impl PartialEq for Value {
    /// Host values compare by content; device tensors never compare equal.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Value::Host(a), Value::Host(b)) => a == b,
            (Value::Sequence(a), Value::Sequence(b)) => a.items == b.items,
            (Value::Map(a), Value::Map(b)) => a == b,
            (Value::Optional(a), Value::Optional(b)) => a == b,
            _ => false,
        }
    }
}

impl Value {
    /// A copy; a device tensor is copied into host memory.
    pub fn try_clone(&self) -> Result<Value> {
        Ok(match self {
            Value::Host(t) => Value::Host(t.try_clone()?),
            Value::Device(t) => Value::Host(t.to_host()?),
            Value::Sequence(s) => Value::Sequence(Sequence {
                elem_type: s.elem_type,
                items: s
                    .items
                    .iter()
                    .map(Value::try_clone)
                    .collect::<Result<_>>()?,
            }),
            Value::Map(m) => Value::Map(m.try_clone()?),
            Value::Optional(v) => Value::Optional(match v {
                Some(v) => Some(Box::new(v.try_clone()?)),
                None => None,
            }),
        })
    }

    /// The tensor's element type; `None` for a sequence, map or optional.
    pub fn elem_type(&self) -> Option<ElementType> {
        match self {
            Value::Host(t) => Some(t.elem_type()),
            Value::Device(t) => Some(t.elem_type()),
            _ => None,
        }
    }

    /// The tensor's shape; `None` for a sequence, map or optional.
    pub fn shape(&self) -> Option<&[usize]> {
        match self {
            Value::Host(t) => Some(t.shape()),
            Value::Device(t) => Some(t.shape()),
            _ => None,
        }
    }

    /// The host tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Host(t) => Some(t),
            _ => None,
        }
    }

    /// What the value is, as ONNX spells types: `tensor(float)`, `seq(tensor(int64))`,
    /// `map(string,tensor(float))`, `optional(...)`.
    pub fn type_name(&self) -> String {
        match self {
            Value::Host(_) | Value::Device(_) => match self.elem_type() {
                Some(t) => format!("tensor({})", t.onnx_name()),
                None => "tensor".into(),
            },
            Value::Sequence(s) => match (s.items.first(), s.elem_type) {
                (Some(v), _) => format!("seq({})", v.type_name()),
                (None, Some(t)) => format!("seq(tensor({}))", t.onnx_name()),
                (None, None) => "seq".into(),
            },
            Value::Map(m) => format!(
                "map({},tensor({}))",
                m.keys.elem_type().onnx_name(),
                m.values.elem_type().onnx_name()
            ),
            Value::Optional(Some(v)) => format!("optional({})", v.type_name()),
            Value::Optional(None) => "optional (empty)".into(),
        }
    }

    /// The value in host memory, copied there if it is a device tensor.
    pub fn into_host_value(self) -> Result<Value> {
        match self {
            Value::Device(t) => Ok(Value::Host(t.to_host()?)),
            other => Ok(other),
        }
    }

    /// The tensor in host memory, copied there if it lives on a device; an error for a
    /// sequence, map or optional.
    pub fn into_host(self) -> Result<Tensor> {
        match self {
            Value::Host(t) => Ok(t),
            Value::Device(t) => t.to_host(),
            other => Err(Error::InvalidInput(format!(
                "a {} is not a tensor",
                other.type_name()
            ))),
        }
    }

    /// Size of a tensor's data in bytes (the sum over the items of other values).
    pub fn byte_len(&self) -> usize {
        match self {
            Value::Host(t) => t.bytes().map_or(0, <[u8]>::len),
            Value::Device(t) => t.byte_len(),
            Value::Sequence(s) => s.items.iter().map(Value::byte_len).sum(),
            Value::Map(m) => {
                m.keys.bytes().map_or(0, <[u8]>::len) + m.values.bytes().map_or(0, <[u8]>::len)
            }
            Value::Optional(v) => v.as_ref().map_or(0, |v| v.byte_len()),
        }
    }
}
