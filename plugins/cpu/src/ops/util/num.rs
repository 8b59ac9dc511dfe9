//! Arithmetic over every numeric element type ([`Num`], [`FloatElem`]), float values read as
//! `f64` and written back in any type, and half floats computed through f32 ([`via_f32`]).

use epx_plugin_api::ElementType;
use half::{bf16, f16};

use crate::bail;
use crate::error::OpResult;
use crate::tensor::{Elem, Tensor, TensorRef};

/// Arithmetic on every numeric element type. Integer arithmetic wraps; integer division by zero
/// is reported as `None`. f16/bf16 compute in f32.
pub trait Num: Elem {
    const IS_FLOAT: bool;
    const IS_SIGNED: bool;
    fn zero() -> Self;
    fn one() -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Division (integers truncate toward zero); `None` for integer division by zero.
    fn div(self, o: Self) -> Option<Self>;
    /// Remainder with the sign of the dividend (C `fmod`).
    fn rem_trunc(self, o: Self) -> Option<Self>;
    /// Remainder with the sign of the divisor (Python `%`).
    fn rem_floor(self, o: Self) -> Option<Self>;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn sign(self) -> Self;
    /// The lowest value (`-inf` for floats).
    fn lowest() -> Self;
    /// The highest value (`+inf` for floats).
    fn highest() -> Self;
    fn to_f64(self) -> f64;
    /// Converts like a C cast (truncating, saturating for floats to ints).
    fn from_f64(v: f64) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! impl_num_int {
    ($t:ty, $signed:expr) => {
        impl Num for $t {
            const IS_FLOAT: bool = false;
            const IS_SIGNED: bool = $signed;
            fn zero() -> Self {
                0
            }
            fn one() -> Self {
                1
            }
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn div(self, o: Self) -> Option<Self> {
                if o == 0 {
                    None
                } else {
                    Some(self.wrapping_div(o))
                }
            }
            fn rem_trunc(self, o: Self) -> Option<Self> {
                if o == 0 {
                    None
                } else {
                    Some(self.wrapping_rem(o))
                }
            }
            fn rem_floor(self, o: Self) -> Option<Self> {
                let r = self.rem_trunc(o)?;
                #[allow(unused_comparisons)]
                let fix = r != 0 && ((r < 0) != (o < 0));
                Some(if fix { r.wrapping_add(o) } else { r })
            }
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[allow(unused_comparisons)]
            fn abs(self) -> Self {
                if self < 0 { self.wrapping_neg() } else { self }
            }
            #[allow(unused_comparisons)]
            fn sign(self) -> Self {
                if self > 0 {
                    1
                } else if self < 0 {
                    (0 as $t).wrapping_sub(1)
                } else {
                    0
                }
            }
            fn lowest() -> Self {
                <$t>::MIN
            }
            fn highest() -> Self {
                <$t>::MAX
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn is_nan(self) -> bool {
                false
            }
        }
    };
}

impl_num_int!(i8, true);

impl_num_int!(i16, true);

impl_num_int!(i32, true);

impl_num_int!(i64, true);

impl_num_int!(u8, false);

impl_num_int!(u16, false);

impl_num_int!(u32, false);

impl_num_int!(u64, false);

macro_rules! impl_num_float {
    ($t:ty, $to:expr, $from:expr) => {
        impl Num for $t {
            const IS_FLOAT: bool = true;
            const IS_SIGNED: bool = true;
            fn zero() -> Self {
                $from(0.0)
            }
            fn one() -> Self {
                $from(1.0)
            }
            fn add(self, o: Self) -> Self {
                $from($to(self) + $to(o))
            }
            fn sub(self, o: Self) -> Self {
                $from($to(self) - $to(o))
            }
            fn mul(self, o: Self) -> Self {
                $from($to(self) * $to(o))
            }
            fn div(self, o: Self) -> Option<Self> {
                Some($from($to(self) / $to(o)))
            }
            fn rem_trunc(self, o: Self) -> Option<Self> {
                Some($from($to(self) % $to(o)))
            }
            fn rem_floor(self, o: Self) -> Option<Self> {
                let (a, b) = ($to(self), $to(o));
                let r = a % b;
                Some($from(if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                    r + b
                } else {
                    r
                }))
            }
            fn neg(self) -> Self {
                $from(-$to(self))
            }
            fn abs(self) -> Self {
                $from($to(self).abs())
            }
            fn sign(self) -> Self {
                let v = $to(self);
                $from(if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    v
                })
            }
            fn lowest() -> Self {
                $from(f32::NEG_INFINITY.into())
            }
            fn highest() -> Self {
                $from(f32::INFINITY.into())
            }
            fn to_f64(self) -> f64 {
                f64::from($to(self))
            }
            fn from_f64(v: f64) -> Self {
                <$t as Elem>::from_scalar(crate::tensor::Scalar::F(v))
            }
            fn is_nan(self) -> bool {
                $to(self).is_nan()
            }
        }
    };
}

impl_num_float!(f32, |x: f32| x, |x: f32| x);

impl_num_float!(f64, |x: f64| x, |x: f64| x);

impl_num_float!(f16, |x: f16| x.to_f32(), f16::from_f32);

impl_num_float!(bf16, |x: bf16| x.to_f32(), bf16::from_f32);

/// Float element types, computed in `Acc` (f32 for f16/bf16/f32, f64 for f64).
pub trait FloatElem: Num {
    type Acc: num_traits::Float
        + num_traits::FloatConst
        + std::iter::Sum
        + std::fmt::Debug
        + Default
        + Send
        + Sync
        + 'static;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(a: Self::Acc) -> Self;
    /// A constant in the accumulator type.
    fn lit(v: f64) -> Self::Acc;
    /// `len` zeros (f32: in a recycled buffer when one fits); an error when the memory is not
    /// there.
    fn zeroed(len: usize) -> OpResult<Vec<Self>> {
        crate::limits::zeros_checked(len, "a buffer")
    }
}

impl FloatElem for f32 {
    type Acc = f32;
    fn to_acc(self) -> f32 {
        self
    }
    fn from_acc(a: f32) -> Self {
        a
    }
    fn lit(v: f64) -> f32 {
        v as f32
    }
    fn zeroed(len: usize) -> OpResult<Vec<f32>> {
        crate::scratch::zeros(len)
    }
}

impl FloatElem for f64 {
    type Acc = f64;
    fn to_acc(self) -> f64 {
        self
    }
    fn from_acc(a: f64) -> Self {
        a
    }
    fn lit(v: f64) -> f64 {
        v
    }
}

impl FloatElem for f16 {
    type Acc = f32;
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    fn from_acc(a: f32) -> Self {
        f16::from_f32(a)
    }
    fn lit(v: f64) -> f32 {
        v as f32
    }
}

impl FloatElem for bf16 {
    type Acc = f32;
    fn to_acc(self) -> f32 {
        self.to_f32()
    }
    fn from_acc(a: f32) -> Self {
        bf16::from_f32(a)
    }
    fn lit(v: f64) -> f32 {
        v as f32
    }
}

/// Runs `f` with every f16/bf16 input up-cast to f32, and casts f32 outputs back to the half
/// type. Inputs of other types pass through unchanged.
pub fn via_f32(
    inputs: &[Option<TensorRef<'_>>],
    f: impl FnOnce(&[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>>,
) -> OpResult<Vec<Tensor>> {
    let is_half =
        |t: &TensorRef<'_>| matches!(t.elem_type(), ElementType::Float16 | ElementType::Bfloat16);
    let Some(half_ty) = inputs
        .iter()
        .flatten()
        .find(|t| is_half(t))
        .map(|t| t.elem_type())
    else {
        return f(inputs);
    };
    let owned: Vec<Option<Tensor>> = inputs
        .iter()
        .map(|t| match t {
            Some(t) if is_half(t) => t.cast(ElementType::Float).map(Some),
            _ => Ok(None),
        })
        .collect::<OpResult<_>>()?;
    let refs: Vec<Option<TensorRef<'_>>> = inputs
        .iter()
        .zip(&owned)
        .map(|(orig, o)| match o {
            Some(o) => Some(o.view()),
            None => orig.as_ref().map(TensorRef::reborrow),
        })
        .collect();
    let outs = f(&refs)?;
    outs.into_iter()
        .map(|t| {
            if t.elem_type() == ElementType::Float {
                t.view().cast(half_ty)
            } else {
                Ok(t)
            }
        })
        .collect()
}

/// Whether `ty` is one of the float element types (f32, f64, f16, bf16).
pub fn is_float_type(ty: ElementType) -> bool {
    matches!(
        ty,
        ElementType::Float | ElementType::Double | ElementType::Float16 | ElementType::Bfloat16
    )
}

/// The elements of a float tensor as `f64` in C order, with an error naming the op and input
/// when it is not a float tensor.
pub fn float_values(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<Vec<f64>> {
    if !is_float_type(t.elem_type()) {
        bail!("{op}: {what} must be a float tensor, got {}", t.elem_type());
    }
    Ok(t.to_f64_vec())
}

/// A tensor of element type `ty` from `f64` values in C order (cast like ONNX `Cast`).
pub fn tensor_from_f64(ty: ElementType, shape: &[usize], v: Vec<f64>) -> OpResult<Tensor> {
    let t = Tensor::from_vec(shape, v)?;
    if ty == ElementType::Double {
        Ok(t)
    } else {
        t.view().cast(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_arith() {
        assert_eq!(7i32.div(-2), Some(-3));
        assert_eq!(7i32.div(0), None);
        assert_eq!((-7i32).rem_floor(3), Some(2));
        assert_eq!((-7i32).rem_trunc(3), Some(-1));
        assert_eq!(5u8.rem_floor(3), Some(2));
        assert_eq!(Num::abs(i8::MIN), i8::MIN);
        assert_eq!((-5.5f32).rem_floor(2.0), Some(0.5));
    }
}
