//! Tensors of the CPU EP: an owned [`Tensor`] and a borrowed [`TensorRef`] over `ndarray`, one
//! variant per supported element type, the [`Elem`] trait tying Rust types to variants, raw byte
//! conversion, casting, and the `dispatch_*!` macros that call one generic function per dtype.

use epx_plugin_api::ElementType;
use half::{bf16, f16};
use std::sync::Arc;

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::error::{OpError, OpResult};
use crate::limits::checked_numel;
use crate::narrow::{
    F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, F8E8M0, I2, I4, NarrowCast, U2, U4,
};

/// An owned tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    I8(ArrayD<i8>),
    I16(ArrayD<i16>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    U8(ArrayD<u8>),
    U16(ArrayD<u16>),
    U32(ArrayD<u32>),
    U64(ArrayD<u64>),
    Bool(ArrayD<bool>),
    F8E4M3FN(ArrayD<F8E4M3FN>),
    F8E4M3FNUZ(ArrayD<F8E4M3FNUZ>),
    F8E5M2(ArrayD<F8E5M2>),
    F8E5M2FNUZ(ArrayD<F8E5M2FNUZ>),
    F8E8M0(ArrayD<F8E8M0>),
    F4E2M1(ArrayD<F4E2M1>),
    I4(ArrayD<I4>),
    U4(ArrayD<U4>),
    I2(ArrayD<I2>),
    U2(ArrayD<U2>),
    /// A string tensor (ONNX strings are UTF-8 here; other bytes are refused at the boundary).
    Str(ArrayD<String>),
    /// A sequence of tensors: not a tensor, but a value that flows along an edge like one.
    Seq(Arc<Sequence>),
    /// A map (`ai.onnx.ml`): parallel 1-D key and value tensors.
    Map(Arc<MapValue>),
    /// An optional: a tensor or sequence, or nothing.
    Opt(Option<Arc<Tensor>>),
}

/// The value of an ONNX `sequence(T)`: its items (tensors, or maps for `ai.onnx.ml`'s
/// `seq(map(K, V))`) and the element type of `T`, known even when the sequence is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub elem_type: ElementType,
    pub items: Vec<Tensor>,
}

/// The value of an ONNX `map(K, V)`: keys (int64 or string) and values, both 1-D and of one
/// length, in insertion order.
#[derive(Debug, Clone, PartialEq)]
pub struct MapValue {
    pub keys: Tensor,
    pub values: Tensor,
}

/// A borrowed tensor.
#[derive(Debug, Clone)]
pub enum TensorRef<'a> {
    F32(ArrayViewD<'a, f32>),
    F64(ArrayViewD<'a, f64>),
    F16(ArrayViewD<'a, f16>),
    BF16(ArrayViewD<'a, bf16>),
    I8(ArrayViewD<'a, i8>),
    I16(ArrayViewD<'a, i16>),
    I32(ArrayViewD<'a, i32>),
    I64(ArrayViewD<'a, i64>),
    U8(ArrayViewD<'a, u8>),
    U16(ArrayViewD<'a, u16>),
    U32(ArrayViewD<'a, u32>),
    U64(ArrayViewD<'a, u64>),
    Bool(ArrayViewD<'a, bool>),
    F8E4M3FN(ArrayViewD<'a, F8E4M3FN>),
    F8E4M3FNUZ(ArrayViewD<'a, F8E4M3FNUZ>),
    F8E5M2(ArrayViewD<'a, F8E5M2>),
    F8E5M2FNUZ(ArrayViewD<'a, F8E5M2FNUZ>),
    F8E8M0(ArrayViewD<'a, F8E8M0>),
    F4E2M1(ArrayViewD<'a, F4E2M1>),
    I4(ArrayViewD<'a, I4>),
    U4(ArrayViewD<'a, U4>),
    I2(ArrayViewD<'a, I2>),
    U2(ArrayViewD<'a, U2>),
    Str(ArrayViewD<'a, String>),
    Seq(&'a Arc<Sequence>),
    Map(&'a Arc<MapValue>),
    Opt(Option<&'a Arc<Tensor>>),
}

/// A scalar in a wide form, the pivot of [`Elem`] casts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    F(f64),
    I(i64),
    U(u64),
    B(bool),
}

impl Scalar {
    /// Truth as a condition: non-zero numbers (NaN included) and `true`.
    pub fn is_nonzero(self) -> bool {
        match self {
            Scalar::F(f) => f != 0.0,
            Scalar::I(i) => i != 0,
            Scalar::U(u) => u != 0,
            Scalar::B(b) => b,
        }
    }
}

/// A Rust element type that has a [`Tensor`] variant.
pub trait Elem:
    Copy
    + Default
    + std::fmt::Debug
    + PartialEq
    + PartialOrd
    + Send
    + Sync
    + 'static
    + bytemuck::NoUninit
{
    const TYPE: ElementType;
    const SIZE: usize;
    /// The elements stored in `bytes` (their in-memory form, aligned, whole elements), through
    /// `bytemuck`; `None` when the bytes are misaligned or not valid values (`bool`: 0 or 1).
    fn from_byte_slice(bytes: &[u8]) -> Option<&[Self]>;
    /// An empty vector with room for `len` elements (f32, uint8, int8: a recycled buffer when
    /// one fits); an error when the memory is not there.
    fn buffer(len: usize) -> OpResult<Vec<Self>> {
        crate::scratch::take_any(len)
    }
    fn wrap(a: ArrayD<Self>) -> Tensor;
    fn wrap_ref(a: ArrayViewD<'_, Self>) -> TensorRef<'_>;
    fn unwrap_ref<'a>(t: &TensorRef<'a>) -> Option<ArrayViewD<'a, Self>>;
    fn to_scalar(self) -> Scalar;
    /// Converts like a C cast / numpy `astype` (floats to ints truncate, ints wrap).
    fn from_scalar(s: Scalar) -> Self;
    /// As [`Elem::from_scalar`], with the rounding of a cast into a narrow float spelled out.
    fn from_scalar_with(s: Scalar, _cast: NarrowCast) -> Self {
        Self::from_scalar(s)
    }
    /// Reads from exactly `SIZE` little-endian bytes.
    fn read_le(b: &[u8]) -> Self;
    /// Writes into exactly `SIZE` bytes, little-endian.
    fn write_le(self, out: &mut [u8]);
}

macro_rules! impl_elem_num {
    ($t:ty, $var:ident, $ety:ident, $kind:ident, $n:expr) => {
        impl Elem for $t {
            const TYPE: ElementType = ElementType::$ety;
            const SIZE: usize = $n;
            fn from_byte_slice(bytes: &[u8]) -> Option<&[Self]> {
                bytemuck::try_cast_slice(bytes).ok()
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$var(a)
            }
            fn wrap_ref(a: ArrayViewD<'_, Self>) -> TensorRef<'_> {
                TensorRef::$var(a)
            }
            fn unwrap_ref<'a>(t: &TensorRef<'a>) -> Option<ArrayViewD<'a, Self>> {
                match t {
                    TensorRef::$var(a) => Some(a.clone()),
                    _ => None,
                }
            }
            fn to_scalar(self) -> Scalar {
                impl_elem_num!(@to $kind, self)
            }
            fn from_scalar(s: Scalar) -> Self {
                match s {
                    Scalar::F(v) => v as $t,
                    Scalar::I(v) => v as $t,
                    Scalar::U(v) => v as $t,
                    Scalar::B(v) => u8::from(v) as $t,
                }
            }
            fn read_le(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn write_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
        }
    };
    (@to F, $x:expr) => { Scalar::F($x as f64) };
    (@to I, $x:expr) => { Scalar::I($x as i64) };
    (@to U, $x:expr) => { Scalar::U($x as u64) };
}

impl_elem_num!(f32, F32, Float, F, 4);
impl_elem_num!(f64, F64, Double, F, 8);
impl_elem_num!(i8, I8, Int8, I, 1);
impl_elem_num!(i16, I16, Int16, I, 2);
impl_elem_num!(i32, I32, Int32, I, 4);
impl_elem_num!(i64, I64, Int64, I, 8);
impl_elem_num!(u8, U8, Uint8, U, 1);
impl_elem_num!(u16, U16, Uint16, U, 2);
impl_elem_num!(u32, U32, Uint32, U, 4);
impl_elem_num!(u64, U64, Uint64, U, 8);

macro_rules! impl_elem_half {
    ($t:ty, $var:ident, $ety:ident) => {
        impl Elem for $t {
            const TYPE: ElementType = ElementType::$ety;
            const SIZE: usize = 2;
            fn from_byte_slice(bytes: &[u8]) -> Option<&[Self]> {
                bytemuck::try_cast_slice(bytes).ok()
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$var(a)
            }
            fn wrap_ref(a: ArrayViewD<'_, Self>) -> TensorRef<'_> {
                TensorRef::$var(a)
            }
            fn unwrap_ref<'a>(t: &TensorRef<'a>) -> Option<ArrayViewD<'a, Self>> {
                match t {
                    TensorRef::$var(a) => Some(a.clone()),
                    _ => None,
                }
            }
            fn to_scalar(self) -> Scalar {
                Scalar::F(self.to_f64())
            }
            fn from_scalar(s: Scalar) -> Self {
                match s {
                    Scalar::F(v) => <$t>::from_f64(v),
                    Scalar::I(v) => <$t>::from_f64(v as f64),
                    Scalar::U(v) => <$t>::from_f64(v as f64),
                    Scalar::B(v) => <$t>::from_f64(if v { 1.0 } else { 0.0 }),
                }
            }
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_bits(u16::read_le(b))
            }
            fn write_le(self, out: &mut [u8]) {
                self.to_bits().write_le(out)
            }
        }
    };
}

impl_elem_half!(f16, F16, Float16);
impl_elem_half!(bf16, BF16, Bfloat16);

impl Elem for bool {
    const TYPE: ElementType = ElementType::Bool;
    const SIZE: usize = 1;
    fn from_byte_slice(bytes: &[u8]) -> Option<&[Self]> {
        bytemuck::checked::try_cast_slice(bytes).ok()
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::Bool(a)
    }
    fn wrap_ref(a: ArrayViewD<'_, Self>) -> TensorRef<'_> {
        TensorRef::Bool(a)
    }
    fn unwrap_ref<'a>(t: &TensorRef<'a>) -> Option<ArrayViewD<'a, Self>> {
        match t {
            TensorRef::Bool(a) => Some(a.clone()),
            _ => None,
        }
    }
    fn to_scalar(self) -> Scalar {
        Scalar::B(self)
    }
    fn from_scalar(s: Scalar) -> Self {
        match s {
            Scalar::F(v) => v != 0.0,
            Scalar::I(v) => v != 0,
            Scalar::U(v) => v != 0,
            Scalar::B(v) => v,
        }
    }
    fn read_le(b: &[u8]) -> Self {
        b.first().is_some_and(|&x| x != 0)
    }
    fn write_le(self, out: &mut [u8]) {
        if let Some(o) = out.first_mut() {
            *o = u8::from(self);
        }
    }
}

fn scalar_as_f64(s: Scalar) -> f64 {
    match s {
        Scalar::F(v) => v,
        Scalar::I(v) => v as f64,
        Scalar::U(v) => v as f64,
        Scalar::B(v) => f64::from(u8::from(v)),
    }
}

fn scalar_as_i64(s: Scalar) -> i64 {
    match s {
        Scalar::F(v) => v as i64,
        Scalar::I(v) => v,
        Scalar::U(v) => v as i64,
        Scalar::B(v) => i64::from(v),
    }
}

/// The `Elem` plumbing every narrow type shares: one byte per element in memory.
macro_rules! impl_elem_narrow {
    ($t:ident, |$x:ident| $to:expr, |$s:ident, $cast:ident| $from:expr, |$c:ident| $read:expr, |$y:ident| $code:expr) => {
        impl Elem for $t {
            const TYPE: ElementType = $t::TYPE;
            const SIZE: usize = 1;
            fn from_byte_slice(bytes: &[u8]) -> Option<&[Self]> {
                bytemuck::try_cast_slice(bytes).ok()
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$t(a)
            }
            fn wrap_ref(a: ArrayViewD<'_, Self>) -> TensorRef<'_> {
                TensorRef::$t(a)
            }
            fn unwrap_ref<'a>(t: &TensorRef<'a>) -> Option<ArrayViewD<'a, Self>> {
                match t {
                    TensorRef::$t(a) => Some(a.clone()),
                    _ => None,
                }
            }
            fn to_scalar(self) -> Scalar {
                let $x = self;
                $to
            }
            fn from_scalar(s: Scalar) -> Self {
                Self::from_scalar_with(s, NarrowCast::default())
            }
            fn from_scalar_with($s: Scalar, $cast: NarrowCast) -> Self {
                $from
            }
            /// Reads the element's code (its bits, unpacked) from one byte.
            fn read_le(b: &[u8]) -> Self {
                let $c = b.first().copied().unwrap_or_default();
                $read
            }
            fn write_le(self, out: &mut [u8]) {
                let $y = self;
                if let Some(o) = out.first_mut() {
                    *o = $code;
                }
            }
        }
    };
}

macro_rules! impl_elem_narrow_float {
    ($($t:ident),+) => {$(
        impl_elem_narrow!(
            $t,
            |x| Scalar::F(f64::from(x.to_f32())),
            |s, cast| $t::from_f64_with(scalar_as_f64(s), cast),
            |c| $t(c),
            |x| x.0
        );
    )+};
}

impl_elem_narrow_float!(F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, F8E8M0, F4E2M1);

macro_rules! impl_elem_narrow_int {
    ($($t:ident => $kind:ident),+) => {$(
        impl_elem_narrow!(
            $t,
            |x| impl_elem_num!(@to $kind, x.0),
            |s, _cast| $t::wrapping(scalar_as_i64(s)),
            |c| $t::from_code(c),
            |x| x.code()
        );
    )+};
}

impl_elem_narrow_int!(I4 => I, U4 => U, I2 => I, U2 => U);

impl<T: Elem> From<ArrayD<T>> for Tensor {
    fn from(a: ArrayD<T>) -> Tensor {
        T::wrap(a)
    }
}

/// `with_types!(tensor_ref, |v| body, [F32, I64, ..], "Op")`: matches the variants listed, binds
/// the typed view to `v` and evaluates `body` (an `OpResult<_>`); other variants give an
/// "unsupported element type" error naming the op.
#[macro_export]
macro_rules! with_types {
    ($t:expr, |$v:ident| $body:expr, [$($var:ident),+ $(,)?], $op:expr) => {{
        let __t: $crate::tensor::TensorRef<'_> = $t;
        #[allow(unreachable_patterns)]
        let __r = match __t {
            $( $crate::tensor::TensorRef::$var($v) => $body, )+
            __other => Err($crate::error::OpError(format!(
                "{}: unsupported element type {}",
                $op,
                __other.type_name()
            ))),
        };
        __r
    }};
}

/// Dispatch over every element type (see [`with_types!`]).
#[macro_export]
macro_rules! dispatch_all {
    ($t:expr, |$v:ident| $body:expr, $op:expr) => {
        $crate::with_types!(
            $t,
            |$v| $body,
            [
                F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64, Bool
            ],
            $op
        )
    };
}

/// Dispatch over every element type, the narrow ones (8-bit floats, 4- and 2-bit types) too:
/// for the ops that only move elements (reshapes, transposes, control flow).
#[macro_export]
macro_rules! dispatch_any {
    ($t:expr, |$v:ident| $body:expr, $op:expr) => {
        $crate::with_types!(
            $t,
            |$v| $body,
            [
                F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64, Bool, F8E4M3FN,
                F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, F8E8M0, F4E2M1, I4, U4, I2, U2
            ],
            $op
        )
    };
}

/// Dispatch over every numeric (non-bool) element type.
#[macro_export]
macro_rules! dispatch_numeric {
    ($t:expr, |$v:ident| $body:expr, $op:expr) => {
        $crate::with_types!(
            $t,
            |$v| $body,
            [F32, F64, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64],
            $op
        )
    };
}

/// Dispatch over signed numeric types (floats and signed ints).
#[macro_export]
macro_rules! dispatch_signed {
    ($t:expr, |$v:ident| $body:expr, $op:expr) => {
        $crate::with_types!(
            $t,
            |$v| $body,
            [F32, F64, F16, BF16, I8, I16, I32, I64],
            $op
        )
    };
}

/// Dispatch over the float types (f32, f64, f16, bf16).
#[macro_export]
macro_rules! dispatch_float {
    ($t:expr, |$v:ident| $body:expr, $op:expr) => {
        $crate::with_types!($t, |$v| $body, [F32, F64, F16, BF16], $op)
    };
}

/// Dispatch over the integer types.
#[macro_export]
macro_rules! dispatch_int {
    ($t:expr, |$v:ident| $body:expr, $op:expr) => {
        $crate::with_types!($t, |$v| $body, [I8, I16, I32, I64, U8, U16, U32, U64], $op)
    };
}

/// Dispatch over an owned tensor's variants (every type), binding `&ArrayD<T>`.
macro_rules! owned_all {
    ($t:expr, |$v:ident| $body:expr, |$o:ident| $other:expr) => {
        match $t {
            Tensor::F32($v) => $body,
            Tensor::F64($v) => $body,
            Tensor::F16($v) => $body,
            Tensor::BF16($v) => $body,
            Tensor::I8($v) => $body,
            Tensor::I16($v) => $body,
            Tensor::I32($v) => $body,
            Tensor::I64($v) => $body,
            Tensor::U8($v) => $body,
            Tensor::U16($v) => $body,
            Tensor::U32($v) => $body,
            Tensor::U64($v) => $body,
            Tensor::Bool($v) => $body,
            Tensor::F8E4M3FN($v) => $body,
            Tensor::F8E4M3FNUZ($v) => $body,
            Tensor::F8E5M2($v) => $body,
            Tensor::F8E5M2FNUZ($v) => $body,
            Tensor::F8E8M0($v) => $body,
            Tensor::F4E2M1($v) => $body,
            Tensor::I4($v) => $body,
            Tensor::U4($v) => $body,
            Tensor::I2($v) => $body,
            Tensor::U2($v) => $body,
            $o => $other,
        }
    };
}

macro_rules! ref_all {
    ($t:expr, |$v:ident| $body:expr, |$o:ident| $other:expr) => {
        match $t {
            TensorRef::F32($v) => $body,
            TensorRef::F64($v) => $body,
            TensorRef::F16($v) => $body,
            TensorRef::BF16($v) => $body,
            TensorRef::I8($v) => $body,
            TensorRef::I16($v) => $body,
            TensorRef::I32($v) => $body,
            TensorRef::I64($v) => $body,
            TensorRef::U8($v) => $body,
            TensorRef::U16($v) => $body,
            TensorRef::U32($v) => $body,
            TensorRef::U64($v) => $body,
            TensorRef::Bool($v) => $body,
            TensorRef::F8E4M3FN($v) => $body,
            TensorRef::F8E4M3FNUZ($v) => $body,
            TensorRef::F8E5M2($v) => $body,
            TensorRef::F8E5M2FNUZ($v) => $body,
            TensorRef::F8E8M0($v) => $body,
            TensorRef::F4E2M1($v) => $body,
            TensorRef::I4($v) => $body,
            TensorRef::U4($v) => $body,
            TensorRef::I2($v) => $body,
            TensorRef::U2($v) => $body,
            $o => $other,
        }
    };
}

/// Calls `$f::<T>($args..)` with `T` the Rust type of element type `$ty`.
macro_rules! by_type {
    ($ty:expr, $f:ident, ($($args:expr),*)) => {
        match $ty {
            ElementType::Float => $f::<f32>($($args),*),
            ElementType::Double => $f::<f64>($($args),*),
            ElementType::Float16 => $f::<f16>($($args),*),
            ElementType::Bfloat16 => $f::<bf16>($($args),*),
            ElementType::Int8 => $f::<i8>($($args),*),
            ElementType::Int16 => $f::<i16>($($args),*),
            ElementType::Int32 => $f::<i32>($($args),*),
            ElementType::Int64 => $f::<i64>($($args),*),
            ElementType::Uint8 => $f::<u8>($($args),*),
            ElementType::Uint16 => $f::<u16>($($args),*),
            ElementType::Uint32 => $f::<u32>($($args),*),
            ElementType::Uint64 => $f::<u64>($($args),*),
            ElementType::Bool => $f::<bool>($($args),*),
            ElementType::Float8E4M3FN => $f::<F8E4M3FN>($($args),*),
            ElementType::Float8E4M3FNUZ => $f::<F8E4M3FNUZ>($($args),*),
            ElementType::Float8E5M2 => $f::<F8E5M2>($($args),*),
            ElementType::Float8E5M2FNUZ => $f::<F8E5M2FNUZ>($($args),*),
            ElementType::Float8E8M0 => $f::<F8E8M0>($($args),*),
            ElementType::Float4E2M1 => $f::<F4E2M1>($($args),*),
            ElementType::Int4 => $f::<I4>($($args),*),
            ElementType::Uint4 => $f::<U4>($($args),*),
            ElementType::Int2 => $f::<I2>($($args),*),
            ElementType::Uint2 => $f::<U2>($($args),*),
            other => Err(OpError(format!("unsupported element type {other}"))),
        }
    };
}

fn expected_len(ty: ElementType, shape: &[usize], got: usize) -> OpResult<usize> {
    let want = ty
        .storage_bytes(checked_numel(shape)?)
        .ok_or_else(|| OpError(format!("{ty} tensor of shape {shape:?} has no byte form")))?;
    if want != got {
        return Err(OpError(format!(
            "{ty} tensor of shape {shape:?} needs {want} bytes, got {got}"
        )));
    }
    Ok(want)
}

/// The bits of one element of a type packed several to a byte (2 or 4), else `None`.
pub fn packed_bits(ty: ElementType) -> Option<usize> {
    ty.bits().filter(|&b| b < 8)
}

fn check_bools(bytes: &[u8]) -> OpResult<()> {
    match bytes.iter().position(|&b| b > 1) {
        Some(i) => Err(OpError(format!(
            "bool tensor byte {i} is {}, not 0 or 1",
            bytes.get(i).copied().unwrap_or_default()
        ))),
        None => Ok(()),
    }
}

fn copy_from_bytes<T: Elem>(shape: &[usize], bytes: &[u8]) -> OpResult<Tensor> {
    let v: Vec<T> = match packed_bits(T::TYPE) {
        Some(bits) => crate::narrow::unpack(bits, checked_numel(shape)?, bytes)
            .into_iter()
            .map(|c| T::read_le(&[c]))
            .collect(),
        None => bytes.chunks_exact(T::SIZE).map(T::read_le).collect(),
    };
    ArrayD::from_shape_vec(IxDyn(shape), v)
        .map(T::wrap)
        .map_err(|e| OpError(format!("bad shape {shape:?}: {e}")))
}

fn view_from_bytes<'a, T: Elem>(shape: &[usize], bytes: &'a [u8]) -> OpResult<TensorRef<'a>> {
    if cfg!(target_endian = "big") {
        return Err(OpError(
            "zero-copy tensor views need a little-endian host".into(),
        ));
    }
    if bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return Err(OpError(format!(
            "{} tensor data is not aligned to {} bytes",
            T::TYPE,
            std::mem::align_of::<T>()
        )));
    }
    let n = bytes.len() / T::SIZE;
    let data: &'a [T] = T::from_byte_slice(&bytes[..n * T::SIZE]).ok_or_else(|| {
        OpError(format!(
            "{} tensor data holds values that are not {}",
            T::TYPE,
            T::TYPE
        ))
    })?;
    ArrayViewD::from_shape(IxDyn(shape), data)
        .map(T::wrap_ref)
        .map_err(|e| OpError(format!("bad shape {shape:?}: {e}")))
}

fn write_elems<T: Elem>(a: &ArrayD<T>, out: &mut [u8]) {
    if let Some(bits) = packed_bits(T::TYPE) {
        let codes = a.iter().map(|x| {
            let mut b = [0u8];
            x.write_le(&mut b);
            b[0]
        });
        crate::narrow::pack(bits, codes, out);
        return;
    }
    if cfg!(target_endian = "little")
        && T::SIZE == std::mem::size_of::<T>()
        && let Some(s) = a.as_slice()
    {
        // On a little-endian machine an element's bytes are its little-endian form.
        out.copy_from_slice(bytemuck::cast_slice(s));
        return;
    }
    for (x, o) in a.iter().zip(out.chunks_exact_mut(T::SIZE)) {
        x.write_le(o);
    }
}

/// ONNX's Cast from strings: decimal numbers, `NaN`, `INF`/`inf`/`infinity` (signed), and for
/// bool the numbers (non-zero is true) as well as `true`/`false`.
fn parse_strings<D: Elem>(a: &ArrayViewD<'_, String>) -> OpResult<Tensor> {
    let parse = |s: &String| -> OpResult<D> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        let float = |x: f64| Ok(D::from_scalar(Scalar::F(x)));
        match lower.trim_start_matches(['+', '-']) {
            "nan" => return float(f64::NAN),
            "inf" | "infinity" => {
                return float(if lower.starts_with('-') {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                });
            }
            _ => {}
        }
        if D::TYPE == ElementType::Bool {
            match lower.as_str() {
                "true" => return Ok(D::from_scalar(Scalar::B(true))),
                "false" => return Ok(D::from_scalar(Scalar::B(false))),
                _ => {}
            }
        }
        let integral = !matches!(
            D::TYPE,
            ElementType::Float | ElementType::Double | ElementType::Float16 | ElementType::Bfloat16
        ) && D::TYPE != ElementType::Bool;
        if integral {
            if let Ok(i) = t.parse::<i64>() {
                return Ok(D::from_scalar(Scalar::I(i)));
            }
            if let Ok(u) = t.parse::<u64>() {
                return Ok(D::from_scalar(Scalar::U(u)));
            }
        }
        t.parse::<f64>()
            .map(|x| D::from_scalar(Scalar::F(x)))
            .map_err(|_| OpError(format!("cannot cast the string {s:?} to {}", D::TYPE)))
    };
    let v: Vec<D> = a.iter().map(parse).collect::<OpResult<_>>()?;
    Tensor::from_vec(a.shape(), v)
}

/// ONNX's Cast to strings: integers in decimal, floats in their shortest exact form (`NaN`,
/// `INF`, `-INF` for the special values), bools as `0`/`1`... as ONNX Runtime writes them.
fn format_strings(t: &TensorRef<'_>) -> OpResult<Tensor> {
    fn float(x: f64, single: bool) -> String {
        if x.is_nan() {
            "NaN".into()
        } else if x.is_infinite() {
            if x > 0.0 { "INF".into() } else { "-INF".into() }
        } else if single {
            format!("{}", x as f32)
        } else {
            format!("{x}")
        }
    }
    let single = t.elem_type() != ElementType::Double;
    let v: Vec<String> = match t {
        TensorRef::Str(a) => a.iter().cloned().collect(),
        TensorRef::Seq(_) | TensorRef::Map(_) | TensorRef::Opt(_) => {
            return Err(OpError(format!(
                "{} cannot be cast to string",
                t.type_name()
            )));
        }
        _ => ref_all!(
            t,
            |a| a
                .iter()
                .map(|x| match x.to_scalar() {
                    Scalar::I(i) => i.to_string(),
                    Scalar::U(u) => u.to_string(),
                    Scalar::B(b) => u8::from(b).to_string(),
                    Scalar::F(f) => float(f, single),
                })
                .collect(),
            |_o| Vec::new()
        ),
    };
    Tensor::strings(t.shape(), v)
}

fn cast_view<S: Elem, D: Elem>(a: &ArrayViewD<'_, S>, cast: NarrowCast) -> ArrayD<D> {
    a.mapv(|x| D::from_scalar_with(x.to_scalar(), cast))
}

fn cast_to<D: Elem>(t: &TensorRef<'_>, cast: NarrowCast) -> OpResult<Tensor> {
    ref_all!(
        t,
        |a| Ok(D::wrap(cast_view::<_, D>(a, cast))),
        |o| match o {
            TensorRef::Str(a) => parse_strings::<D>(a),
            other => Err(OpError(format!(
                "{} cannot be cast to {}",
                other.type_name(),
                D::TYPE
            ))),
        }
    )
}

impl Tensor {
    /// Gives a dead value's large float or byte buffer back for the next kernels
    /// ([`crate::scratch`]).
    pub fn recycle(self) {
        match self {
            Tensor::F32(a) => crate::scratch::give(a.into_raw_vec_and_offset().0),
            Tensor::U8(a) => crate::scratch::give(a.into_raw_vec_and_offset().0),
            Tensor::I8(a) => crate::scratch::give(a.into_raw_vec_and_offset().0),
            _ => {}
        }
    }

    /// Whether [`into_shape`](Self::into_shape) takes `shape`: a tensor (of any element type)
    /// whose elements lie in C order, as many as `shape` holds.
    pub fn reshapes_in_place(&self, shape: &[usize]) -> bool {
        let c_order = owned_all!(self, |a| a.is_standard_layout(), |o| match o {
            Tensor::Str(a) => a.is_standard_layout(),
            _ => false,
        });
        c_order && self.shape().iter().product::<usize>() == shape.iter().product::<usize>()
    }

    /// The same elements under `shape`, their buffer moved, not copied; an error when
    /// [`reshapes_in_place`](Self::reshapes_in_place) does not hold.
    pub fn into_shape(self, shape: &[usize]) -> OpResult<Tensor> {
        if !self.reshapes_in_place(shape) {
            return Err(OpError(format!(
                "cannot reshape a {} in place to {shape:?}",
                self.type_name()
            )));
        }
        let e = |e: ndarray::ShapeError| OpError(format!("reshaping in place to {shape:?}: {e}"));
        Ok(owned_all!(
            self,
            |a| Elem::wrap(a.into_shape_with_order(IxDyn(shape)).map_err(e)?),
            |o| match o {
                Tensor::Str(a) => Tensor::Str(a.into_shape_with_order(IxDyn(shape)).map_err(e)?),
                other => other,
            }
        ))
    }

    pub fn elem_type(&self) -> ElementType {
        self.view().elem_type()
    }

    /// Whether this is a tensor of a numeric (or bool) element type: one with a byte form.
    pub fn is_numeric_tensor(&self) -> bool {
        !matches!(
            self,
            Tensor::Str(_) | Tensor::Seq(_) | Tensor::Map(_) | Tensor::Opt(_)
        )
    }

    /// What the value is, for messages (see [`TensorRef::type_name`]).
    pub fn type_name(&self) -> String {
        self.view().type_name()
    }

    /// A string tensor from raw bytes, which must be UTF-8 (ONNX strings are; refusing other
    /// bytes beats changing them).
    pub fn strings_from_bytes<'b>(
        shape: &[usize],
        items: impl Iterator<Item = &'b [u8]>,
    ) -> OpResult<Tensor> {
        let v = items
            .enumerate()
            .map(|(i, b)| {
                String::from_utf8(b.to_vec()).map_err(|_| {
                    OpError(format!(
                        "string element {i} is not UTF-8: {:?}",
                        String::from_utf8_lossy(b)
                    ))
                })
            })
            .collect::<OpResult<Vec<_>>>()?;
        Tensor::strings(shape, v)
    }

    /// A string tensor.
    pub fn strings(shape: &[usize], v: Vec<String>) -> OpResult<Tensor> {
        ArrayD::from_shape_vec(IxDyn(shape), v)
            .map(Tensor::Str)
            .map_err(|e| OpError(format!("bad shape {shape:?}: {e}")))
    }

    pub fn shape(&self) -> &[usize] {
        owned_all!(self, |a| a.shape(), |o| match o {
            Tensor::Str(a) => a.shape(),
            _ => &[],
        })
    }

    pub fn view(&self) -> TensorRef<'_> {
        owned_all!(self, |a| Elem::wrap_ref(a.view()), |o| match o {
            Tensor::Str(a) => TensorRef::Str(a.view()),
            Tensor::Seq(s) => TensorRef::Seq(s),
            Tensor::Map(m) => TensorRef::Map(m),
            Tensor::Opt(v) => TensorRef::Opt(v.as_ref()),
            _ => unreachable!("numeric variants are matched above"),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        owned_all!(self, |a| a.len(), |o| match o {
            Tensor::Str(a) => a.len(),
            _ => 0,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies raw little-endian C-order bytes into an owned tensor (works for unaligned input);
    /// checks len == product(shape)*size; bool bytes must be 0 or 1 else error.
    pub fn from_bytes(ty: ElementType, shape: &[usize], bytes: &[u8]) -> OpResult<Tensor> {
        expected_len(ty, shape, bytes.len())?;
        if ty == ElementType::Bool {
            check_bools(bytes)?;
        }
        by_type!(ty, copy_from_bytes, (shape, bytes))
    }

    /// Writes the elements in logical C order into `out` (len must equal byte size, else error).
    pub fn write_bytes(&self, out: &mut [u8]) -> OpResult<()> {
        if out.len() != self.byte_len() {
            return Err(OpError(format!(
                "{} tensor of shape {:?} has {} bytes, output buffer has {}",
                self.elem_type(),
                self.shape(),
                self.byte_len(),
                out.len()
            )));
        }
        owned_all!(self, |a| write_elems(a, out), |o| {
            return Err(OpError(format!("{} has no byte form", o.type_name())));
        });
        Ok(())
    }

    /// Bytes of the tensor's little-endian form (narrow types packed as ONNX packs them).
    pub fn byte_len(&self) -> usize {
        self.elem_type().storage_bytes(self.len()).unwrap_or(0)
    }

    /// A scalar (0-d) tensor.
    pub fn scalar<T: Elem>(v: T) -> Tensor {
        T::wrap(ndarray::arr0(v).into_dyn())
    }

    /// A tensor from a shape and C-order data.
    pub fn from_vec<T: Elem>(shape: &[usize], v: Vec<T>) -> OpResult<Tensor> {
        ArrayD::from_shape_vec(IxDyn(shape), v)
            .map(T::wrap)
            .map_err(|e| OpError(format!("bad shape {shape:?}: {e}")))
    }

    /// The typed array, if the tensor holds `T`.
    pub fn as_array<T: Elem>(&self) -> Option<ArrayViewD<'_, T>> {
        T::unwrap_ref(&self.view())
    }
}

impl<'a> TensorRef<'a> {
    pub fn elem_type(&self) -> ElementType {
        match self {
            TensorRef::F32(_) => ElementType::Float,
            TensorRef::F64(_) => ElementType::Double,
            TensorRef::F16(_) => ElementType::Float16,
            TensorRef::BF16(_) => ElementType::Bfloat16,
            TensorRef::I8(_) => ElementType::Int8,
            TensorRef::I16(_) => ElementType::Int16,
            TensorRef::I32(_) => ElementType::Int32,
            TensorRef::I64(_) => ElementType::Int64,
            TensorRef::U8(_) => ElementType::Uint8,
            TensorRef::U16(_) => ElementType::Uint16,
            TensorRef::U32(_) => ElementType::Uint32,
            TensorRef::U64(_) => ElementType::Uint64,
            TensorRef::Bool(_) => ElementType::Bool,
            TensorRef::F8E4M3FN(_) => ElementType::Float8E4M3FN,
            TensorRef::F8E4M3FNUZ(_) => ElementType::Float8E4M3FNUZ,
            TensorRef::F8E5M2(_) => ElementType::Float8E5M2,
            TensorRef::F8E5M2FNUZ(_) => ElementType::Float8E5M2FNUZ,
            TensorRef::F8E8M0(_) => ElementType::Float8E8M0,
            TensorRef::F4E2M1(_) => ElementType::Float4E2M1,
            TensorRef::I4(_) => ElementType::Int4,
            TensorRef::U4(_) => ElementType::Uint4,
            TensorRef::I2(_) => ElementType::Int2,
            TensorRef::U2(_) => ElementType::Uint2,
            TensorRef::Str(_) => ElementType::String,
            TensorRef::Seq(_) | TensorRef::Map(_) | TensorRef::Opt(_) => ElementType::Undefined,
        }
    }

    /// What the value is, for messages: its element type, or `sequence`, `map`, `optional`.
    pub fn type_name(&self) -> String {
        match self {
            TensorRef::Seq(s) => format!("a sequence of {}", s.elem_type),
            TensorRef::Map(m) => format!(
                "a map from {} to {}",
                m.keys.elem_type(),
                m.values.elem_type()
            ),
            TensorRef::Opt(_) => "an optional".to_string(),
            t => t.elem_type().to_string(),
        }
    }

    /// Whether this is a tensor (of any element type), not a sequence, map or optional.
    pub fn is_tensor(&self) -> bool {
        !matches!(
            self,
            TensorRef::Seq(_) | TensorRef::Map(_) | TensorRef::Opt(_)
        )
    }

    /// The strings of a string tensor.
    pub fn as_strings(&self, what: &str) -> OpResult<ArrayViewD<'a, String>> {
        match self {
            TensorRef::Str(a) => Ok(a.clone()),
            other => Err(OpError(format!(
                "{what} must be a string tensor, got {}",
                other.type_name()
            ))),
        }
    }

    /// The sequence this value is.
    pub fn as_sequence(&self, what: &str) -> OpResult<&'a Arc<Sequence>> {
        match self {
            TensorRef::Seq(s) => Ok(s),
            other => Err(OpError(format!(
                "{what} must be a sequence, got {}",
                other.type_name()
            ))),
        }
    }

    pub fn shape(&self) -> &[usize] {
        ref_all!(self, |a| a.shape(), |o| match o {
            TensorRef::Str(a) => a.shape(),
            _ => &[],
        })
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        ref_all!(self, |a| a.len(), |o| match o {
            TensorRef::Str(a) => a.len(),
            _ => 0,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Zero-copy view over bytes when they are aligned for the type; error when misaligned,
    /// wrong length, or (bool) a byte not 0/1.
    pub fn from_bytes(
        ty: ElementType,
        shape: &[usize],
        bytes: &'a [u8],
    ) -> OpResult<TensorRef<'a>> {
        expected_len(ty, shape, bytes.len())?;
        if ty == ElementType::Bool {
            check_bools(bytes)?;
        }
        if packed_bits(ty).is_some() {
            return Err(OpError(format!(
                "{ty} elements are packed several to a byte: copy them with Tensor::from_bytes"
            )));
        }
        by_type!(ty, view_from_bytes, (shape, bytes))
    }

    /// An owned copy; an error, not an abort, when the memory for it is not there.
    pub fn try_to_owned(&self) -> OpResult<Tensor> {
        /// A numeric view's elements copied into memory reserved fallibly.
        fn copy<T: Clone>(a: &ArrayViewD<'_, T>) -> OpResult<ArrayD<T>> {
            let mut v = crate::scratch::reserve::<T>(a.len())?;
            match a.as_slice() {
                // C order in memory: one copy of the block.
                Some(s) => v.extend_from_slice(s),
                None => v.extend(a.iter().cloned()),
            }
            ArrayD::from_shape_vec(a.raw_dim(), v).map_err(|e| OpError(e.to_string()))
        }
        Ok(ref_all!(self, |a| Elem::wrap(copy(a)?), |o| match o {
            TensorRef::Str(a) => Tensor::Str(copy(a)?),
            TensorRef::Seq(s) => Tensor::Seq(Arc::clone(s)),
            TensorRef::Map(m) => Tensor::Map(Arc::clone(m)),
            TensorRef::Opt(v) => Tensor::Opt(v.cloned()),
            _ => unreachable!("numeric variants are matched above"),
        }))
    }

    /// A view with a shorter lifetime.
    pub fn reborrow(&self) -> TensorRef<'_> {
        ref_all!(self, |a| Elem::wrap_ref(a.view()), |o| match o {
            TensorRef::Str(a) => TensorRef::Str(a.view()),
            TensorRef::Seq(s) => TensorRef::Seq(s),
            TensorRef::Map(m) => TensorRef::Map(m),
            TensorRef::Opt(v) => TensorRef::Opt(*v),
            _ => unreachable!("numeric variants are matched above"),
        })
    }

    /// The typed view, if the tensor holds `T`.
    pub fn get<T: Elem>(&self) -> Option<ArrayViewD<'a, T>> {
        T::unwrap_ref(self)
    }

    /// The typed view, or an error naming `what` and the actual type.
    pub fn expect_type<T: Elem>(&self, what: &str) -> OpResult<ArrayViewD<'a, T>> {
        self.get::<T>().ok_or_else(|| {
            OpError(format!(
                "{what} must be {}, got {}",
                T::TYPE,
                self.elem_type()
            ))
        })
    }

    pub fn as_f32(&self) -> OpResult<ArrayViewD<'a, f32>> {
        self.expect_type("tensor")
    }

    pub fn as_i64(&self) -> OpResult<ArrayViewD<'a, i64>> {
        self.expect_type("tensor")
    }

    pub fn as_bool(&self) -> OpResult<ArrayViewD<'a, bool>> {
        self.expect_type("tensor")
    }

    /// Converts to `ty` like ONNX `Cast` (floats to ints truncate toward zero, ints wrap, nonzero
    /// to bool is true).
    pub fn cast(&self, ty: ElementType) -> OpResult<Tensor> {
        self.cast_with(ty, NarrowCast::default())
    }

    /// [`TensorRef::cast`] with the saturation and rounding of casts into narrow floats given.
    pub fn cast_with(&self, ty: ElementType, cast: NarrowCast) -> OpResult<Tensor> {
        if ty == self.elem_type() && self.is_tensor() {
            return self.try_to_owned();
        }
        if ty == ElementType::String {
            return format_strings(self);
        }
        by_type!(ty, cast_to, (self, cast))
    }

    /// The elements of an integer tensor as `i64` (for shapes, axes, indices).
    pub fn to_i64_vec(&self, what: &str) -> OpResult<Vec<i64>> {
        match self {
            TensorRef::I64(a) => Ok(a.iter().copied().collect()),
            TensorRef::I32(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            TensorRef::I16(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            TensorRef::I8(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            TensorRef::U8(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            TensorRef::U16(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            TensorRef::U32(a) => Ok(a.iter().map(|&x| i64::from(x)).collect()),
            TensorRef::I4(a) => Ok(a.iter().map(|x| i64::from(x.0)).collect()),
            TensorRef::U4(a) => Ok(a.iter().map(|x| i64::from(x.0)).collect()),
            TensorRef::I2(a) => Ok(a.iter().map(|x| i64::from(x.0)).collect()),
            TensorRef::U2(a) => Ok(a.iter().map(|x| i64::from(x.0)).collect()),
            other => Err(OpError(format!(
                "{what} must be an int32 or int64 tensor, got {}",
                other.elem_type()
            ))),
        }
    }

    /// The elements as `f64` (any numeric type).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        ref_all!(
            self,
            |a| a
                .iter()
                .map(|x| match x.to_scalar() {
                    Scalar::F(v) => v,
                    Scalar::I(v) => v as f64,
                    Scalar::U(v) => v as f64,
                    Scalar::B(v) => f64::from(u8::from(v)),
                })
                .collect(),
            |_o| Vec::new()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn bytes_round_trip_all_types() {
        for ty in [
            ElementType::Float,
            ElementType::Double,
            ElementType::Float16,
            ElementType::Bfloat16,
            ElementType::Int8,
            ElementType::Int16,
            ElementType::Int32,
            ElementType::Int64,
            ElementType::Uint8,
            ElementType::Uint16,
            ElementType::Uint32,
            ElementType::Uint64,
        ] {
            let size = ty.byte_size().unwrap();
            let bytes: Vec<u8> = (0..6 * size).map(|i| (i % 7) as u8).collect();
            let t = Tensor::from_bytes(ty, &[2, 3], &bytes).unwrap();
            assert_eq!(t.elem_type(), ty);
            assert_eq!(t.shape(), &[2, 3]);
            assert_eq!(t.byte_len(), bytes.len());
            let mut out = vec![0u8; bytes.len()];
            t.write_bytes(&mut out).unwrap();
            assert_eq!(out, bytes, "{ty}");
        }
    }

    #[test]
    fn from_bytes_values_and_errors() {
        let bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let t = Tensor::from_bytes(ElementType::Float, &[2], &bytes).unwrap();
        assert_eq!(t, Tensor::F32(array![1.5f32, -2.0].into_dyn()));
        let e = Tensor::from_bytes(ElementType::Float, &[3], &bytes).unwrap_err();
        assert!(e.0.contains("needs 12 bytes, got 8"), "{e}");
        let e = Tensor::from_bytes(ElementType::Bool, &[2], &[1, 2]).unwrap_err();
        assert!(e.0.contains("not 0 or 1"), "{e}");
        assert!(Tensor::from_bytes(ElementType::String, &[1], &[0]).is_err());
        // Unaligned input is fine for the copying constructor.
        let mut buf = [0u8; 9];
        buf[1..].copy_from_slice(&bytes);
        assert_eq!(
            Tensor::from_bytes(ElementType::Float, &[2], &buf[1..]).unwrap(),
            t
        );
        // The zero-copy view rejects it.
        let e = TensorRef::from_bytes(ElementType::Float, &[2], &buf[1..]).unwrap_err();
        assert!(e.0.contains("not aligned"), "{e}");
    }

    #[test]
    fn zero_copy_view() {
        let data = vec![1i64, 2, 3, 4];
        let bytes: &[u8] = unsafe_free_bytes(&data);
        let v = TensorRef::from_bytes(ElementType::Int64, &[2, 2], bytes).unwrap();
        assert_eq!(v.as_i64().unwrap(), array![[1i64, 2], [3, 4]].into_dyn());
        let b = TensorRef::from_bytes(ElementType::Bool, &[3], &[1, 0, 1]).unwrap();
        assert_eq!(b.as_bool().unwrap(), array![true, false, true].into_dyn());
        assert!(TensorRef::from_bytes(ElementType::Bool, &[1], &[3]).is_err());
        assert_eq!(v.to_owned().shape(), &[2, 2]);
    }

    /// Copies `i64`s into an 8-aligned byte buffer without unsafe code.
    fn unsafe_free_bytes(data: &[i64]) -> &'static [u8] {
        let words: Vec<u64> = data.iter().map(|&x| x as u64).collect();
        let leaked: &'static [u64] = Box::leak(words.into_boxed_slice());
        let bytes: Vec<u8> = leaked.iter().flat_map(|x| x.to_le_bytes()).collect();
        // Find an 8-aligned start inside a leaked buffer with slack.
        let mut slack = bytes.clone();
        slack.extend_from_slice(&[0; 8]);
        let slack: &'static mut [u8] = Box::leak(slack.into_boxed_slice());
        let off = slack.as_ptr().align_offset(8);
        let n = bytes.len();
        slack.copy_within(0..n, off);
        &slack[off..off + n]
    }

    #[test]
    fn cast_rules() {
        let t = Tensor::F32(array![-1.7f32, 0.0, 2.9, 300.0].into_dyn());
        let v = t.view();
        assert_eq!(
            v.cast(ElementType::Int32).unwrap(),
            Tensor::I32(array![-1, 0, 2, 300].into_dyn())
        );
        assert_eq!(
            v.cast(ElementType::Bool).unwrap(),
            Tensor::Bool(array![true, false, true, true].into_dyn())
        );
        let h = v.cast(ElementType::Float16).unwrap();
        let back = h.view().cast(ElementType::Float).unwrap();
        assert_eq!(
            back,
            Tensor::F32(array![-1.7001953f32, 0.0, 2.9003906, 300.0].into_dyn())
        );
        let b = Tensor::Bool(array![true, false].into_dyn());
        assert_eq!(
            b.view().cast(ElementType::Double).unwrap(),
            Tensor::F64(array![1.0, 0.0].into_dyn())
        );
        assert_eq!(
            v.to_i64_vec("x").unwrap_err().0,
            "x must be an int32 or int64 tensor, got float32"
        );
    }
}
