//! Helpers shared by the operator families: numeric traits over element types, numpy
//! broadcasting, axis normalization, input access, f16/bf16 up-casting, and the spatial geometry
//! (kernel, strides, pads, dilations) that Conv and the pools share.

use epx_plugin_api::ElementType;
use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::fast::geometry::Spatial;
use crate::kernel::NodeDef;
use crate::tensor::{Elem, Tensor, TensorRef};

pub use crate::limits::checked_numel;

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

/// The numpy broadcast of two shapes, or `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a.get(i + a.len() - n).copied().unwrap_or(1)
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b.get(i + b.len() - n).copied().unwrap_or(1)
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// The numpy broadcast of several shapes, with an error naming the op.
pub fn broadcast_all(op: &str, shapes: &[&[usize]]) -> OpResult<Vec<usize>> {
    let mut out: Vec<usize> = Vec::new();
    for s in shapes {
        out = broadcast_shapes(&out, s).ok_or_else(|| {
            OpError(format!(
                "{op}: shapes {shapes:?} cannot be broadcast together"
            ))
        })?;
    }
    checked_numel(&out).map_err(|e| OpError(format!("{op}: broadcast result: {}", e.0)))?;
    Ok(out)
}

/// A view broadcast to `shape`, with an error naming the op.
pub fn broadcast_to<'a, T>(
    op: &str,
    a: &'a ArrayViewD<'_, T>,
    shape: &[usize],
) -> OpResult<ArrayViewD<'a, T>> {
    a.broadcast(IxDyn(shape)).ok_or_else(|| {
        OpError(format!(
            "{op}: shape {:?} cannot be broadcast to {:?}",
            a.shape(),
            shape
        ))
    })
}

/// Applies `f` elementwise over two broadcast arrays.
pub fn binary_map<A: Copy, B: Copy, O>(
    op: &str,
    a: &ArrayViewD<'_, A>,
    b: &ArrayViewD<'_, B>,
    mut f: impl FnMut(A, B) -> O,
) -> OpResult<ArrayD<O>> {
    if a.shape() == b.shape() {
        return Ok(Zip::from(a).and(b).map_collect(|&x, &y| f(x, y)));
    }
    let shape = broadcast_all(op, &[a.shape(), b.shape()])?;
    let av = broadcast_to(op, a, &shape)?;
    let bv = broadcast_to(op, b, &shape)?;
    Ok(Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)))
}

/// Normalizes an axis in `[-rank, rank)` to `[0, rank)`.
pub fn normalize_axis(op: &str, axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(OpError(format!(
            "{op}: axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// Normalizes a list of axes; duplicates are an error.
pub fn normalize_axes(op: &str, axes: &[i64], rank: usize) -> OpResult<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(OpError(format!("{op}: axis {a} is repeated in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// The `i`-th input, which must be present.
pub fn input<'b, 'a>(
    op: &str,
    inputs: &'b [Option<TensorRef<'a>>],
    i: usize,
) -> OpResult<&'b TensorRef<'a>> {
    inputs
        .get(i)
        .and_then(Option::as_ref)
        .ok_or_else(|| OpError(format!("{op}: missing required input {i}")))
}

/// The `i`-th input if present.
pub fn opt_input<'b, 'a>(
    inputs: &'b [Option<TensorRef<'a>>],
    i: usize,
) -> Option<&'b TensorRef<'a>> {
    inputs.get(i).and_then(Option::as_ref)
}

/// Checks that two inputs have the same element type.
pub fn same_type(op: &str, a: &TensorRef<'_>, b: &TensorRef<'_>) -> OpResult<()> {
    if a.elem_type() != b.elem_type() {
        return Err(OpError(format!(
            "{op}: inputs must have the same element type, got {} and {}",
            a.elem_type(),
            b.elem_type()
        )));
    }
    Ok(())
}

/// The typed view of `t`, which must have the same element type as `like`.
pub fn typed_like<'a, T: Elem>(op: &str, t: &TensorRef<'a>) -> OpResult<ArrayViewD<'a, T>> {
    t.get::<T>().ok_or_else(|| {
        OpError(format!(
            "{op}: inputs must have the same element type, got {} and {}",
            T::TYPE,
            t.elem_type()
        ))
    })
}

/// A scalar-or-1-element input as i64.
pub fn scalar_i64(op: &str, what: &str, t: &TensorRef<'_>) -> OpResult<i64> {
    let v = t.to_i64_vec(&format!("{op}: {what}"))?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(OpError(format!(
            "{op}: {what} must have one element, got shape {:?}",
            t.shape()
        ))),
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

/// The `auto_pad` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Spatial attributes shared by Conv and the pools, as written on the node.
#[derive(Debug, Clone)]
pub struct SpatialAttrs {
    pub auto_pad: AutoPad,
    pub kernel_shape: Option<Vec<i64>>,
    pub strides: Option<Vec<i64>>,
    pub dilations: Option<Vec<i64>>,
    pub pads: Option<Vec<i64>>,
    pub ceil_mode: bool,
}

fn positive(op: &str, what: &str, v: &[i64]) -> OpResult<Vec<usize>> {
    v.iter()
        .map(|&x| {
            usize::try_from(x)
                .ok()
                .filter(|&u| u > 0)
                .ok_or_else(|| OpError(format!("{op}: {what} must be positive, got {v:?}")))
        })
        .collect()
}

impl SpatialAttrs {
    pub fn parse(node: &NodeDef) -> OpResult<Self> {
        let auto_pad = match node.attr_string_or("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            other => return Err(node.error(format_args!("unknown auto_pad '{other}'"))),
        };
        Ok(SpatialAttrs {
            auto_pad,
            kernel_shape: node.attr_ints("kernel_shape")?,
            strides: node.attr_ints("strides")?,
            dilations: node.attr_ints("dilations")?,
            pads: node.attr_ints("pads")?,
            ceil_mode: node.attr_int_or("ceil_mode", 0)? != 0,
        })
    }

    /// Resolves the geometry for input spatial dims `input` and kernel dims `kernel`.
    pub fn resolve(&self, op: &str, input: &[usize], kernel: &[usize]) -> OpResult<Spatial> {
        let n = input.len();
        if kernel.len() != n {
            bail!(
                "{op}: kernel has {} spatial dims, input has {n}",
                kernel.len()
            );
        }
        let kernel = positive(
            op,
            "kernel_shape",
            &kernel.iter().map(|&k| k as i64).collect::<Vec<_>>(),
        )?;
        let per_dim = |what: &str, v: &Option<Vec<i64>>| -> OpResult<Vec<usize>> {
            match v {
                None => Ok(vec![1; n]),
                Some(v) if v.len() == n => positive(op, what, v),
                Some(v) => Err(OpError(format!("{op}: {what} {v:?} must have {n} values"))),
            }
        };
        let strides = per_dim("strides", &self.strides)?;
        let dilations = per_dim("dilations", &self.dilations)?;
        let mut pad_begin = vec![0usize; n];
        let mut pad_end = vec![0usize; n];
        let mut out = vec![0usize; n];
        let pads = match &self.pads {
            Some(p) if self.auto_pad == AutoPad::NotSet => {
                if p.len() != 2 * n {
                    bail!("{op}: pads {p:?} must have {} values", 2 * n);
                }
                if p.iter().any(|&x| !(0..=i64::from(i32::MAX)).contains(&x)) {
                    bail!("{op}: pads {p:?} must be in 0..=2^31-1");
                }
                p.iter().map(|&x| x as usize).collect()
            }
            _ => vec![0usize; 2 * n],
        };
        for d in 0..n {
            let (i, k, s, dl) = (input[d], kernel[d], strides[d], dilations[d]);
            let eff = dl
                .checked_mul(k - 1)
                .and_then(|x| x.checked_add(1))
                .ok_or_else(|| OpError(format!("{op}: kernel too large")))?;
            match self.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => {
                    let o = i.div_ceil(s);
                    let total =
                        ((o.max(1) - 1).saturating_mul(s).saturating_add(eff)).saturating_sub(i);
                    let small = total / 2;
                    let big = total - small;
                    (pad_begin[d], pad_end[d]) = if self.auto_pad == AutoPad::SameUpper {
                        (small, big)
                    } else {
                        (big, small)
                    };
                    out[d] = o;
                }
                AutoPad::NotSet | AutoPad::Valid => {
                    pad_begin[d] = pads[d];
                    pad_end[d] = pads[d + n];
                    let padded = i.saturating_add(pad_begin[d]).saturating_add(pad_end[d]);
                    if padded < eff {
                        bail!(
                            "{op}: kernel extent {eff} is larger than the padded input {padded} in spatial dim {d}"
                        );
                    }
                    let span = padded - eff;
                    let mut o = if self.ceil_mode {
                        span.div_ceil(s)
                    } else {
                        span / s
                    } + 1;
                    if self.ceil_mode && (o - 1).saturating_mul(s) >= i.saturating_add(pad_begin[d])
                    {
                        o -= 1;
                    }
                    out[d] = o;
                }
            }
        }
        checked_numel(&out)?;
        // A stride past the padded input leaves one window in that dim: the same output as a
        // stride of the padded extent + 1, which keeps layouts sized by the stride (the
        // depthwise kernels' phase split) as small as the input.
        let mut strides = strides;
        for d in 0..n {
            if out[d] <= 1 {
                let reach = input[d]
                    .saturating_add(pad_begin[d])
                    .saturating_add(pad_end[d])
                    .saturating_add(1);
                strides[d] = strides[d].min(reach);
            }
        }
        Ok(Spatial {
            kernel,
            strides,
            dilations,
            pad_begin,
            pad_end,
            out,
        })
    }
}

/// Dims from a `kernel_shape` attribute.
pub fn kernel_dims(op: &str, v: &[i64]) -> OpResult<Vec<usize>> {
    positive(op, "kernel_shape", v)
}

/// Iterates over all multi-indices of `shape` in C order, calling `f` with each.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// C-order strides of a shape.
pub fn c_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
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

/// A per-spatial-dim attribute: `n` values (default `dflt` each).
pub fn per_dim(
    op: &str,
    what: &str,
    v: &Option<Vec<i64>>,
    n: usize,
    dflt: i64,
) -> OpResult<Vec<i64>> {
    match v {
        None => Ok(vec![dflt; n]),
        Some(v) if v.len() == n => Ok(v.clone()),
        Some(v) => Err(OpError(format!("{op}: {what} {v:?} must have {n} values"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shapes(&[], &[3]), Some(vec![3]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 5]), Some(vec![0, 5]));
        let e = broadcast_all("Add", &[&[2], &[3]]).unwrap_err();
        assert!(e.0.starts_with("Add: shapes"), "{e}");
    }

    #[test]
    fn axes() {
        assert_eq!(normalize_axis("X", -1, 3), Ok(2));
        assert!(
            normalize_axis("X", 3, 3)
                .unwrap_err()
                .0
                .contains("axis 3 is out of range for rank 3")
        );
        assert!(
            normalize_axes("X", &[0, -3], 3)
                .unwrap_err()
                .0
                .contains("repeated")
        );
    }

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

    #[test]
    fn spatial_geometry() {
        let attrs = SpatialAttrs {
            auto_pad: AutoPad::SameUpper,
            kernel_shape: None,
            strides: Some(vec![2, 2]),
            dilations: None,
            pads: None,
            ceil_mode: false,
        };
        let s = attrs.resolve("Conv", &[5, 6], &[3, 3]).unwrap();
        assert_eq!(s.out, vec![3, 3]);
        assert_eq!(s.pad_begin, vec![1, 0]);
        assert_eq!(s.pad_end, vec![1, 1]);
        let ceil = SpatialAttrs {
            auto_pad: AutoPad::NotSet,
            ceil_mode: true,
            ..attrs
        };
        let s = ceil.resolve("MaxPool", &[4, 4], &[3, 3]).unwrap();
        assert_eq!(s.out, vec![2, 2]);
        let e = ceil.resolve("MaxPool", &[1, 1], &[3, 3]).unwrap_err();
        assert!(e.0.contains("larger than the padded input"), "{e}");
    }

    /// A stride past the padded input gives one window, as the same stride clamped to the
    /// padded extent + 1 does, in floor and ceil mode alike; the clamp keeps stride-sized
    /// layouts small.
    #[test]
    fn strides_past_the_input_are_clamped_without_changing_the_output() {
        for ceil_mode in [false, true] {
            let attrs = |s: i64| SpatialAttrs {
                auto_pad: AutoPad::NotSet,
                kernel_shape: None,
                strides: Some(vec![s, 2]),
                dilations: None,
                pads: Some(vec![1, 0, 2, 0]),
                ceil_mode,
            };
            let huge = attrs(1 << 40).resolve("Conv", &[3, 5], &[2, 1]).unwrap();
            let small = attrs(7).resolve("Conv", &[3, 5], &[2, 1]).unwrap();
            assert_eq!(huge.out, vec![1, 3]);
            assert_eq!(huge, small, "ceil_mode {ceil_mode}");
            assert_eq!(huge.strides, vec![7, 2]);
        }
    }
}
