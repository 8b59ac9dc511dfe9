//! Elementwise operators: unary math and activations, binary arithmetic with numpy
//! broadcasting (plus the pre-opset-7 `broadcast`/`axis` form), variadic Max/Min/Sum/Mean,
//! comparisons, logic, bit shifts, Where, Clip and PRelu.

use ndarray::{ArrayD, ArrayViewD, Axis, Zip};

use crate::ops::util::num::{FloatElem, Num};

use crate::ops::util::broadcast::{binary_map, broadcast_all, broadcast_to};

use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, opt_input, same_type, typed_like};
use crate::tensor::{Elem, Tensor, TensorRef};
use crate::{bail, dispatch_all, dispatch_float, dispatch_numeric, with_types};

pub fn register(reg: &mut Registry) {
    use Unary as U;
    // Float-only unary math and activations.
    add(reg, "Exp", 1, |n| float_unary(n, U::Exp));
    add(reg, "Log", 1, |n| float_unary(n, U::Log));
    add(reg, "Sqrt", 1, |n| float_unary(n, U::Sqrt));
    add(reg, "Reciprocal", 1, |n| float_unary(n, U::Reciprocal));
    add(reg, "Floor", 1, |n| float_unary(n, U::Floor));
    add(reg, "Ceil", 1, |n| float_unary(n, U::Ceil));
    add(reg, "Round", 11, |n| float_unary(n, U::Round));
    add(reg, "Erf", 9, |n| float_unary(n, U::Erf));
    add(reg, "Sin", 7, |n| float_unary(n, U::Sin));
    add(reg, "Cos", 7, |n| float_unary(n, U::Cos));
    add(reg, "Tan", 7, |n| float_unary(n, U::Tan));
    add(reg, "Asin", 7, |n| float_unary(n, U::Asin));
    add(reg, "Acos", 7, |n| float_unary(n, U::Acos));
    add(reg, "Atan", 7, |n| float_unary(n, U::Atan));
    add(reg, "Sinh", 9, |n| float_unary(n, U::Sinh));
    add(reg, "Cosh", 9, |n| float_unary(n, U::Cosh));
    add(reg, "Asinh", 9, |n| float_unary(n, U::Asinh));
    add(reg, "Acosh", 9, |n| float_unary(n, U::Acosh));
    add(reg, "Atanh", 9, |n| float_unary(n, U::Atanh));
    add(reg, "Sigmoid", 1, |n| float_unary(n, U::Sigmoid));
    add(reg, "Tanh", 1, |n| float_unary(n, U::Tanh));
    add(reg, "Softplus", 1, |n| float_unary(n, U::Softplus));
    add(reg, "Softsign", 1, |n| float_unary(n, U::Softsign));
    add(reg, "Mish", 18, |n| float_unary(n, U::Mish));
    add(reg, "HardSwish", 14, |n| float_unary(n, U::HardSwish));
    add(reg, "LeakyRelu", 1, |n| {
        let a = n.attr_float_or("alpha", 0.01)?;
        float_unary(n, U::LeakyRelu(a))
    });
    add(reg, "Elu", 1, |n| {
        let a = n.attr_float_or("alpha", 1.0)?;
        float_unary(n, U::Elu(a))
    });
    add(reg, "Celu", 12, |n| {
        let a = n.attr_float_or("alpha", 1.0)?;
        float_unary(n, U::Celu(a))
    });
    add(reg, "Selu", 1, |n| {
        let a = n.attr_float_or("alpha", 1.673_263_2)?;
        let g = n.attr_float_or("gamma", 1.050_701)?;
        float_unary(n, U::Selu(a, g))
    });
    add(reg, "HardSigmoid", 1, |n| {
        let a = n.attr_float_or("alpha", 0.2)?;
        let b = n.attr_float_or("beta", 0.5)?;
        float_unary(n, U::HardSigmoid(a, b))
    });
    add(reg, "ThresholdedRelu", 10, |n| {
        let a = n.attr_float_or("alpha", 1.0)?;
        float_unary(n, U::ThresholdedRelu(a))
    });
    add(reg, "Gelu", 20, |n| {
        match n.attr_string_or("approximate", "none")?.as_str() {
            "none" => float_unary(n, U::Gelu),
            "tanh" => float_unary(n, U::GeluTanh),
            other => Err(n.error(format_args!("unknown approximate '{other}'"))),
        }
    });
    add(reg, "IsNaN", 9, |n| {
        let op = n.op_type.clone();
        Ok(kernel(move |inputs| {
            let x = input(&op, inputs, 0)?;
            one(dispatch_float!(
                x.clone(),
                |a| Ok(a.mapv(|v| v.is_nan()).into()),
                &op
            ))
        }))
    });
    add(reg, "IsInf", 10, |n| {
        let op = n.op_type.clone();
        let neg = n.attr_int_or("detect_negative", 1)? != 0;
        let pos = n.attr_int_or("detect_positive", 1)? != 0;
        Ok(kernel(move |inputs| {
            let x = input(&op, inputs, 0)?;
            one(dispatch_float!(
                x.clone(),
                |a| Ok(a
                    .mapv(|v| {
                        let f = v.to_f64();
                        (pos && f == f64::INFINITY) || (neg && f == f64::NEG_INFINITY)
                    })
                    .into()),
                &op
            ))
        }))
    });

    // Numeric unary ops.
    add(reg, "Relu", 1, |n| numeric_unary(n, NumUnary::Relu));
    add(reg, "Abs", 1, |n| numeric_unary(n, NumUnary::Abs));
    add(reg, "Neg", 1, |n| numeric_unary(n, NumUnary::Neg));
    add(reg, "Sign", 9, |n| numeric_unary(n, NumUnary::Sign));
    add(reg, "Not", 1, |n| {
        let op = n.op_type.clone();
        Ok(kernel(move |inputs| {
            let x = input(&op, inputs, 0)?;
            let a = x.expect_type::<bool>(&format!("{op}: input"))?;
            one(Ok(a.mapv(|v| !v).into()))
        }))
    });

    // Binary arithmetic.
    add(reg, "Add", 1, |n| binary(n, Bin::Add));
    add(reg, "Sub", 1, |n| binary(n, Bin::Sub));
    add(reg, "Mul", 1, |n| binary(n, Bin::Mul));
    add(reg, "Div", 1, |n| binary(n, Bin::Div));
    add(reg, "Pow", 1, |n| binary(n, Bin::Pow));
    add(reg, "Mod", 10, |n| {
        let fmod = n.attr_int_or("fmod", 0)? != 0;
        binary(n, Bin::Mod(fmod))
    });
    add(reg, "BitShift", 11, |n| {
        match n.attr_string("direction")?.as_deref() {
            Some("LEFT") => binary(n, Bin::Shl),
            Some("RIGHT") => binary(n, Bin::Shr),
            other => Err(n.error(format_args!(
                "direction must be LEFT or RIGHT, got {other:?}"
            ))),
        }
    });
    add(reg, "Equal", 1, |n| binary(n, Bin::Cmp(Cmp::Eq)));
    add(reg, "Less", 1, |n| binary(n, Bin::Cmp(Cmp::Lt)));
    add(reg, "Greater", 1, |n| binary(n, Bin::Cmp(Cmp::Gt)));
    add(reg, "LessOrEqual", 12, |n| binary(n, Bin::Cmp(Cmp::Le)));
    add(reg, "GreaterOrEqual", 12, |n| binary(n, Bin::Cmp(Cmp::Ge)));
    add(reg, "And", 1, |n| binary(n, Bin::Logic(Logic::And)));
    add(reg, "Or", 1, |n| binary(n, Bin::Logic(Logic::Or)));
    add(reg, "Xor", 1, |n| binary(n, Bin::Logic(Logic::Xor)));
    add(reg, "PRelu", 1, |n| binary(n, Bin::PRelu));

    // Variadic.
    add(reg, "Max", 1, |n| variadic(n, Variadic::Max));
    add(reg, "Min", 1, |n| variadic(n, Variadic::Min));
    add(reg, "Sum", 1, |n| variadic(n, Variadic::Sum));
    add(reg, "Mean", 1, |n| variadic(n, Variadic::Mean));

    add(reg, "Where", 9, build_where);
    add(reg, "Clip", 1, build_clip);
}

/// Float unary operators, with their attributes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Floor,
    Ceil,
    Round,
    Erf,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Sigmoid,
    Tanh,
    Softplus,
    Softsign,
    Mish,
    HardSwish,
    Gelu,
    GeluTanh,
    LeakyRelu(f32),
    Elu(f32),
    Celu(f32),
    Selu(f32, f32),
    HardSigmoid(f32, f32),
    ThresholdedRelu(f32),
}

/// The error function (`libm`'s, accurate to about 1 ulp).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

fn round_half_even<A: num_traits::Float>(x: A, half: A, two: A) -> A {
    let r = x.round();
    if (r - x).abs() == half {
        two * (x / two).round()
    } else {
        r
    }
}

/// Applies a float unary operator elementwise, computing in `T::Acc`.
pub fn apply_unary<T: FloatElem>(u: Unary, a: &ArrayViewD<'_, T>) -> ArrayD<T> {
    use num_traits::{Float, ToPrimitive};
    let l = T::lit;
    let (zero, one_, half, two) = (l(0.0), l(1.0), l(0.5), l(2.0));
    macro_rules! m {
        (|$x:ident| $e:expr) => {
            a.mapv(|v| {
                let $x = v.to_acc();
                T::from_acc($e)
            })
        };
    }
    match u {
        Unary::Exp => m!(|x| x.exp()),
        Unary::Log => m!(|x| x.ln()),
        Unary::Sqrt => m!(|x| x.sqrt()),
        Unary::Reciprocal => m!(|x| x.recip()),
        Unary::Floor => m!(|x| x.floor()),
        Unary::Ceil => m!(|x| x.ceil()),
        Unary::Round => m!(|x| round_half_even(x, half, two)),
        Unary::Erf => m!(|x| l(erf(x.to_f64().unwrap_or(f64::NAN)))),
        Unary::Sin => m!(|x| x.sin()),
        Unary::Cos => m!(|x| x.cos()),
        Unary::Tan => m!(|x| x.tan()),
        Unary::Asin => m!(|x| x.asin()),
        Unary::Acos => m!(|x| x.acos()),
        Unary::Atan => m!(|x| x.atan()),
        Unary::Sinh => m!(|x| x.sinh()),
        Unary::Cosh => m!(|x| x.cosh()),
        Unary::Asinh => m!(|x| x.asinh()),
        Unary::Acosh => m!(|x| x.acosh()),
        Unary::Atanh => m!(|x| x.atanh()),
        Unary::Sigmoid => m!(|x| sigmoid(x)),
        Unary::Tanh => m!(|x| x.tanh()),
        Unary::Softplus => m!(|x| softplus(x)),
        Unary::Softsign => m!(|x| x / (one_ + x.abs())),
        Unary::Mish => m!(|x| x * softplus(x).tanh()),
        Unary::HardSwish => {
            let sixth = l(1.0 / 6.0);
            m!(|x| x * (x * sixth + half).max(zero).min(one_))
        }
        Unary::Gelu => {
            let s = l(std::f64::consts::FRAC_1_SQRT_2);
            m!(|x| half * x * (one_ + l(erf((x * s).to_f64().unwrap_or(f64::NAN)))))
        }
        Unary::GeluTanh => {
            let c = l((2.0 / std::f64::consts::PI).sqrt());
            let k = l(0.044715);
            m!(|x| half * x * (one_ + (c * (x + k * x * x * x)).tanh()))
        }
        Unary::LeakyRelu(alpha) => {
            let al = l(alpha.into());
            m!(|x| if x < zero { al * x } else { x })
        }
        Unary::Elu(alpha) => {
            let al = l(alpha.into());
            m!(|x| if x < zero { al * (x.exp() - one_) } else { x })
        }
        Unary::Celu(alpha) => {
            let al = l(alpha.into());
            m!(|x| x.max(zero) + zero.min(al * ((x / al).exp() - one_)))
        }
        Unary::Selu(alpha, gamma) => {
            let (al, g) = (l(alpha.into()), l(gamma.into()));
            m!(|x| if x > zero {
                g * x
            } else {
                g * al * (x.exp() - one_)
            })
        }
        Unary::HardSigmoid(alpha, beta) => {
            let (al, b) = (l(alpha.into()), l(beta.into()));
            m!(|x| (al * x + b).max(zero).min(one_))
        }
        Unary::ThresholdedRelu(alpha) => {
            let al = l(alpha.into());
            m!(|x| if x > al { x } else { zero })
        }
    }
}

fn sigmoid<A: num_traits::Float>(x: A) -> A {
    if x >= A::zero() {
        A::one() / (A::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (A::one() + e)
    }
}

fn softplus<A: num_traits::Float>(x: A) -> A {
    if x > A::zero() {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn float_unary(n: &NodeDef, u: Unary) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        if let (Unary::Sigmoid | Unary::Erf, TensorRef::F32(a)) = (u, x)
            && crate::fast::enabled()
        {
            let ac = a.as_standard_layout();
            if let Some(xs) = ac.as_slice() {
                let y = if u == Unary::Sigmoid {
                    crate::fast::math::sigmoid(xs)?
                } else {
                    let mut y = crate::scratch::take(xs.len())?;
                    crate::fast::math::erf_slice(xs, &mut y);
                    y
                };
                return one(Tensor::from_vec(a.shape(), y));
            }
        }
        // f32 Sigmoid is defined as ONNX Runtime rounds it (see `sigmoid_f32`) at every level;
        // the reference level evaluates it one element at a time.
        if let (Unary::Sigmoid, TensorRef::F32(a)) = (u, x) {
            return one(Ok(Tensor::from(a.mapv(crate::fast::math::sigmoid_f32))));
        }
        one(dispatch_float!(
            x.clone(),
            |a| Ok(apply_unary(u, &a).into()),
            &op
        ))
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumUnary {
    Relu,
    Abs,
    Neg,
    Sign,
}

fn apply_num_unary<T: Num>(u: NumUnary, a: &ArrayViewD<'_, T>) -> ArrayD<T> {
    match u {
        NumUnary::Relu => a.mapv(|x| if x < T::zero() { T::zero() } else { x }),
        NumUnary::Abs => a.mapv(Num::abs),
        NumUnary::Neg => a.mapv(Num::neg),
        NumUnary::Sign => a.mapv(Num::sign),
    }
}

fn numeric_unary(n: &NodeDef, u: NumUnary) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        one(dispatch_numeric!(
            x.clone(),
            |a| Ok(apply_num_unary(u, &a).into()),
            &op
        ))
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logic {
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Mod(bool),
    Shl,
    Shr,
    Cmp(Cmp),
    Logic(Logic),
    PRelu,
}

/// The f32 fast path of Add, Sub, Mul and Div ([`crate::fast::math::broadcast_binary`]).
fn arith_f32(
    kind: Bin,
    a: &ArrayViewD<'_, f32>,
    b: &ArrayViewD<'_, f32>,
) -> Option<OpResult<Tensor>> {
    let (ac, bc) = (a.as_standard_layout(), b.as_standard_layout());
    let (xs, ys) = (ac.as_slice()?, bc.as_slice()?);
    use crate::fast::math::broadcast_binary as bb;
    let (out, shape) = match kind {
        Bin::Add => bb(xs, a.shape(), ys, b.shape(), |x, y| x + y),
        Bin::Sub => bb(xs, a.shape(), ys, b.shape(), |x, y| x - y),
        Bin::Mul => bb(xs, a.shape(), ys, b.shape(), |x, y| x * y),
        Bin::Div => bb(xs, a.shape(), ys, b.shape(), |x, y| x / y),
        _ => None,
    }?;
    Some(Tensor::from_vec(&shape, out))
}

fn arith<T: Num>(
    op: &str,
    kind: Bin,
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
) -> OpResult<ArrayD<T>> {
    let mut div_zero = false;
    let mut checked = |r: Option<T>| {
        r.unwrap_or_else(|| {
            div_zero = true;
            T::zero()
        })
    };
    let out = match kind {
        Bin::Add => binary_map(op, a, b, T::add)?,
        Bin::Sub => binary_map(op, a, b, T::sub)?,
        Bin::Mul => binary_map(op, a, b, T::mul)?,
        Bin::Div => binary_map(op, a, b, |x, y| checked(x.div(y)))?,
        Bin::Mod(true) => binary_map(op, a, b, |x, y| checked(x.rem_trunc(y)))?,
        Bin::Mod(false) => binary_map(op, a, b, |x, y| checked(x.rem_floor(y)))?,
        Bin::PRelu => binary_map(op, a, b, |x, s| if x < T::zero() { x.mul(s) } else { x })?,
        _ => bail!("{op}: not an arithmetic operator"),
    };
    if div_zero {
        bail!("{op}: integer division by zero");
    }
    Ok(out)
}

fn compare<T: Elem>(
    op: &str,
    c: Cmp,
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
) -> OpResult<Tensor> {
    let out = match c {
        Cmp::Eq => binary_map(op, a, b, |x, y| x == y)?,
        Cmp::Lt => binary_map(op, a, b, |x, y| x < y)?,
        Cmp::Gt => binary_map(op, a, b, |x, y| x > y)?,
        Cmp::Le => binary_map(op, a, b, |x, y| x <= y)?,
        Cmp::Ge => binary_map(op, a, b, |x, y| x >= y)?,
    };
    Ok(out.into())
}

fn pow<T: Num>(op: &str, a: &ArrayViewD<'_, T>, e: &TensorRef<'_>) -> OpResult<Tensor> {
    let e = e.cast(epx_plugin_api::ElementType::Double)?;
    let ev = e.view().expect_type::<f64>(op)?;
    if T::IS_FLOAT
        && ev.len() == 1
        && ev.ndim() <= a.ndim()
        && let Some(&y) = ev.iter().next()
    {
        // One exponent for every element (the output has X's shape): no broadcasting.
        if y == 2.0 {
            // A square is exact in f64, so x·x rounds to what powf's result rounds to.
            return Ok(a.mapv(|x| x.mul(x)).into());
        }
        if y == 3.0 {
            // A cube in f64 (one rounding of the exact x³), within an f64 ulp of powf's:
            // the same float32 result but where the two straddle a rounding boundary.
            return Ok(a
                .mapv(|x| {
                    let v = x.to_f64();
                    T::from_f64(v * v * v)
                })
                .into());
        }
        return Ok(a.mapv(|x| T::from_f64(x.to_f64().powf(y))).into());
    }
    let out = if T::IS_FLOAT {
        binary_map(op, a, &ev, |x, y| T::from_f64(x.to_f64().powf(y)))?
    } else {
        binary_map(op, a, &ev, |x, y| {
            // Integer powers with an integer exponent: exact, wrapping.
            if y >= 0.0 && y.fract() == 0.0 && y <= u32::MAX as f64 {
                let mut acc = T::one();
                let mut base = x;
                let mut k = y as u64;
                while k > 0 {
                    if k & 1 == 1 {
                        acc = acc.mul(base);
                    }
                    base = base.mul(base);
                    k >>= 1;
                }
                acc
            } else {
                T::from_f64(x.to_f64().powf(y))
            }
        })?
    };
    Ok(out.into())
}

fn shift<T: Elem>(
    op: &str,
    left: bool,
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
) -> OpResult<Tensor> {
    use crate::tensor::Scalar;
    let as_u64 = |x: T| match x.to_scalar() {
        Scalar::U(v) => v,
        Scalar::I(v) => v as u64,
        _ => 0,
    };
    let out = binary_map(op, a, b, |x, s| {
        let (x, s) = (as_u64(x), as_u64(s));
        let s = u32::try_from(s).unwrap_or(u32::MAX);
        let r = if left {
            x.checked_shl(s)
        } else {
            x.checked_shr(s)
        };
        let r = if (s as usize) >= T::SIZE * 8 {
            0
        } else {
            r.unwrap_or(0)
        };
        T::from_scalar(Scalar::U(r))
    })?;
    Ok(out.into())
}

/// Applies the pre-opset-7 `broadcast`/`axis` rule: B's dims align with A's starting at `axis`.
fn legacy_broadcast<'a>(
    op: &str,
    axis: Option<i64>,
    a_rank: usize,
    b: TensorRef<'a>,
) -> OpResult<TensorRef<'a>> {
    let Some(axis) = axis else { return Ok(b) };
    let axis = crate::ops::util::args::normalize_axis(op, axis, a_rank.max(1))?;
    let trailing = a_rank.checked_sub(axis + b.ndim()).ok_or_else(|| {
        OpError(format!(
            "{op}: B of rank {} does not fit at axis {axis}",
            b.ndim()
        ))
    })?;
    fn extend<T: Elem>(v: ArrayViewD<'_, T>, k: usize) -> TensorRef<'_> {
        let mut v = v;
        for _ in 0..k {
            let nd = v.ndim();
            v = v.insert_axis(Axis(nd));
        }
        T::wrap_ref(v)
    }
    dispatch_all!(b, |v| Ok(extend(v, trailing)), op)
}

fn binary(n: &NodeDef, kind: Bin) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let legacy_axis = if n.opset < 7 && n.attr_int_or("broadcast", 0)? != 0 {
        n.attr_int("axis")?
    } else {
        None
    };
    Ok(kernel(move |inputs| {
        let a = input(&op, inputs, 0)?;
        let b = legacy_broadcast(&op, legacy_axis, a.ndim(), input(&op, inputs, 1)?.clone())?;
        let op = op.as_str();
        if kind != Bin::Pow {
            same_type(op, a, &b)?;
        }
        if let (TensorRef::F32(x), TensorRef::F32(y)) = (a, &b)
            && crate::fast::enabled()
            && let Some(out) = arith_f32(kind, x, y)
        {
            return one(out);
        }
        let out = match kind {
            Bin::Add | Bin::Sub | Bin::Mul | Bin::Div | Bin::Mod(_) | Bin::PRelu => {
                dispatch_numeric!(
                    a.clone(),
                    |x| arith(op, kind, &x, &typed_like(op, &b)?).map(Tensor::from),
                    op
                )?
            }
            Bin::Pow => dispatch_numeric!(a.clone(), |x| pow(op, &x, &b), op)?,
            Bin::Shl | Bin::Shr => with_types!(
                a.clone(),
                |x| shift(op, kind == Bin::Shl, &x, &typed_like(op, &b)?),
                [U8, U16, U32, U64],
                op
            )?,
            Bin::Cmp(c) => {
                dispatch_all!(a.clone(), |x| compare(op, c, &x, &typed_like(op, &b)?), op)?
            }
            Bin::Logic(l) => {
                let x = a.expect_type::<bool>(&format!("{op}: input A"))?;
                let y = b.expect_type::<bool>(&format!("{op}: input B"))?;
                let f = match l {
                    Logic::And => |p: bool, q: bool| p && q,
                    Logic::Or => |p: bool, q: bool| p || q,
                    Logic::Xor => |p: bool, q: bool| p != q,
                };
                binary_map(op, &x, &y, f)?.into()
            }
        };
        Ok(vec![out])
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variadic {
    Max,
    Min,
    Sum,
    Mean,
}

fn fold<T: Num>(
    op: &str,
    v: Variadic,
    first: ArrayViewD<'_, T>,
    rest: &[&TensorRef<'_>],
) -> OpResult<Tensor> {
    let mut acc = first.to_owned();
    for t in rest {
        let b = typed_like::<T>(op, t)?;
        acc = match v {
            Variadic::Max => {
                binary_map(
                    op,
                    &acc.view(),
                    &b,
                    |x, y| if y > x || y.is_nan() { y } else { x },
                )?
            }
            Variadic::Min => {
                binary_map(
                    op,
                    &acc.view(),
                    &b,
                    |x, y| if y < x || y.is_nan() { y } else { x },
                )?
            }
            Variadic::Sum | Variadic::Mean => binary_map(op, &acc.view(), &b, T::add)?,
        };
    }
    if v == Variadic::Mean {
        let n = T::from_f64((rest.len() + 1) as f64);
        acc.mapv_inplace(|x| x.div(n).unwrap_or(x));
    }
    Ok(acc.into())
}

fn variadic(n: &NodeDef, v: Variadic) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let present: Vec<&TensorRef<'_>> = inputs.iter().flatten().collect();
        let Some((first, rest)) = present.split_first() else {
            bail!("{op}: needs at least one input");
        };
        one(dispatch_numeric!(
            (*first).clone(),
            |a| fold(&op, v, a, rest),
            &op
        ))
    }))
}

fn where_typed<T: Elem>(
    op: &str,
    c: &ArrayViewD<'_, bool>,
    x: &ArrayViewD<'_, T>,
    y: &TensorRef<'_>,
) -> OpResult<Tensor> {
    let y = typed_like::<T>(op, y)?;
    let shape = broadcast_all(op, &[c.shape(), x.shape(), y.shape()])?;
    let (cv, xv, yv) = (
        broadcast_to(op, c, &shape)?,
        broadcast_to(op, x, &shape)?,
        broadcast_to(op, &y, &shape)?,
    );
    Ok(Zip::from(&cv)
        .and(&xv)
        .and(&yv)
        .map_collect(|&c, &x, &y| if c { x } else { y })
        .into())
}

fn build_where(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let c = input(&op, inputs, 0)?.expect_type::<bool>(&format!("{op}: condition"))?;
        let x = input(&op, inputs, 1)?;
        let y = input(&op, inputs, 2)?;
        one(dispatch_all!(
            x.clone(),
            |xv| where_typed(&op, &c, &xv, y),
            &op
        ))
    }))
}

fn clip_typed<T: Num>(
    op: &str,
    x: &ArrayViewD<'_, T>,
    lo: Option<&TensorRef<'_>>,
    hi: Option<&TensorRef<'_>>,
    attr: (f32, f32),
) -> OpResult<Tensor> {
    // An absent bound is the attribute value (before opset 11) or no bound at all.
    let bound = |t: Option<&TensorRef<'_>>, what: &str, default: f32| -> OpResult<T> {
        match t {
            None if default == f32::NEG_INFINITY => Ok(T::lowest()),
            None if default == f32::INFINITY => Ok(T::highest()),
            None => Ok(T::from_f64(default.into())),
            Some(t) => {
                let v = typed_like::<T>(op, t)?;
                match (v.len(), v.iter().next()) {
                    (1, Some(&b)) => Ok(b),
                    _ => Err(OpError(format!(
                        "{op}: {what} must be a scalar, got shape {:?}",
                        v.shape()
                    ))),
                }
            }
        }
    };
    let lo = bound(lo, "min", attr.0)?;
    let hi = bound(hi, "max", attr.1)?;
    Ok(x.mapv(|v| {
        let v = if v < lo { lo } else { v };
        if v > hi { hi } else { v }
    })
    .into())
}

fn build_clip(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let legacy = n.opset < 11;
    let attr = if legacy {
        (
            n.attr_float_or("min", f32::NEG_INFINITY)?,
            n.attr_float_or("max", f32::INFINITY)?,
        )
    } else {
        (f32::NEG_INFINITY, f32::INFINITY)
    };
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (lo, hi) = if legacy {
            (None, None)
        } else {
            (opt_input(inputs, 1), opt_input(inputs, 2))
        };
        one(dispatch_numeric!(
            x.clone(),
            |a| clip_typed(&op, &a, lo, hi, attr),
            &op
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
        let reg = crate::ops::registry();
        let k = reg.build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
        k.run(&refs)
    }

    fn f32t(a: ArrayD<f32>) -> Tensor {
        Tensor::F32(a)
    }

    #[test]
    fn add_broadcasts() {
        let a = f32t(array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]].into_dyn());
        let b = f32t(array![10.0, 20.0, 30.0].into_dyn());
        let out = run(NodeDef::new("Add", 14), vec![a, b]).unwrap();
        assert_eq!(
            out[0],
            f32t(array![[11.0, 22.0, 33.0], [14.0, 25.0, 36.0]].into_dyn())
        );
    }

    #[test]
    fn sub_mul_ints_and_legacy_axis() {
        let a = Tensor::I32(array![[1, 2], [3, 4], [5, 6]].into_dyn());
        let b = Tensor::I32(array![10, 20, 30].into_dyn());
        let n = NodeDef::new("Mul", 6)
            .with_attr("broadcast", AttrValue::Int(1))
            .with_attr("axis", AttrValue::Int(0));
        let out = run(n, vec![a.clone(), b]).unwrap();
        assert_eq!(
            out[0],
            Tensor::I32(array![[10, 20], [60, 80], [150, 180]].into_dyn())
        );
        let out = run(
            NodeDef::new("Sub", 14),
            vec![a.clone(), Tensor::scalar(1i32)],
        )
        .unwrap();
        assert_eq!(
            out[0],
            Tensor::I32(array![[0, 1], [2, 3], [4, 5]].into_dyn())
        );
    }

    #[test]
    fn div_truncates_and_rejects_zero() {
        let a = Tensor::I64(array![7, -7, 9].into_dyn());
        let b = Tensor::I64(array![2, 2, -4].into_dyn());
        let out = run(NodeDef::new("Div", 14), vec![a.clone(), b]).unwrap();
        assert_eq!(out[0], Tensor::I64(array![3, -3, -2].into_dyn()));
        let e = run(
            NodeDef::new("Div", 14),
            vec![a, Tensor::I64(array![0, 1, 1].into_dyn())],
        )
        .unwrap_err();
        assert_eq!(e.0, "Div: integer division by zero");
    }

    #[test]
    fn binary_errors() {
        let a = f32t(array![1.0, 2.0].into_dyn());
        let b = f32t(array![1.0, 2.0, 3.0].into_dyn());
        let e = run(NodeDef::new("Add", 14), vec![a.clone(), b]).unwrap_err();
        assert!(
            e.0.contains("Add: shapes [[2], [3]] cannot be broadcast"),
            "{e}"
        );
        let e = run(
            NodeDef::new("Add", 14),
            vec![a.clone(), Tensor::scalar(1i32)],
        )
        .unwrap_err();
        assert!(
            e.0.contains("Add: inputs must have the same element type"),
            "{e}"
        );
        let e = run(NodeDef::new("Add", 14), vec![a]).unwrap_err();
        assert_eq!(e.0, "Add: missing required input 1");
        let e = run(
            NodeDef::new("Add", 14),
            vec![Tensor::scalar(true), Tensor::scalar(true)],
        )
        .unwrap_err();
        assert_eq!(e.0, "Add: unsupported element type bool");
    }

    #[test]
    fn activations() {
        let x = f32t(array![-1.0, 0.0, 2.0].into_dyn());
        let relu = run(NodeDef::new("Relu", 14), vec![x.clone()]).unwrap();
        assert_eq!(relu[0], f32t(array![0.0, 0.0, 2.0].into_dyn()));
        let sig = run(NodeDef::new("Sigmoid", 13), vec![x.clone()]).unwrap();
        let s = sig[0].as_array::<f32>().unwrap();
        assert!((s[0] - 0.268_941_43).abs() < 1e-6 && (s[1] - 0.5).abs() < 1e-7);
        let t = run(NodeDef::new("Tanh", 13), vec![x.clone()]).unwrap();
        assert!((t[0].as_array::<f32>().unwrap()[2] - 0.964_027_6).abs() < 1e-6);
        let e = run(NodeDef::new("Sigmoid", 13), vec![Tensor::scalar(1i32)]).unwrap_err();
        assert_eq!(e.0, "Sigmoid: unsupported element type int32");
        let e = run(NodeDef::new("Relu", 14), vec![]).unwrap_err();
        assert_eq!(e.0, "Relu: missing required input 0");
        let h = run(
            NodeDef::new("Relu", 14),
            vec![Tensor::F16(array![half::f16::from_f32(-3.0)].into_dyn())],
        )
        .unwrap();
        assert_eq!(h[0], Tensor::F16(array![half::f16::ZERO].into_dyn()));
    }

    #[test]
    fn erf_and_round() {
        assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-14);
        assert!((erf(-2.0) + 0.995_322_265_018_952_7).abs() < 1e-14);
        assert!((erf(3.5) - 0.999_999_256_901_627_7).abs() < 1e-14);
        let x = f32t(array![0.5, 1.5, 2.5, -2.5, 2.4].into_dyn());
        let r = run(NodeDef::new("Round", 11), vec![x]).unwrap();
        assert_eq!(r[0], f32t(array![0.0, 2.0, 2.0, -2.0, 2.0].into_dyn()));
    }

    #[test]
    fn compare_logic_where_clip() {
        let a = Tensor::I32(array![1, 5, 3].into_dyn());
        let b = Tensor::I32(array![2, 5, 1].into_dyn());
        let lt = run(NodeDef::new("Less", 13), vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(lt[0], Tensor::Bool(array![true, false, false].into_dyn()));
        let eq = run(NodeDef::new("Equal", 13), vec![a.clone(), b.clone()]).unwrap();
        let xor = run(NodeDef::new("Xor", 7), vec![lt[0].clone(), eq[0].clone()]).unwrap();
        assert_eq!(xor[0], Tensor::Bool(array![true, true, false].into_dyn()));
        let w = run(
            NodeDef::new("Where", 16),
            vec![lt[0].clone(), a.clone(), b.clone()],
        )
        .unwrap();
        assert_eq!(w[0], Tensor::I32(array![1, 5, 1].into_dyn()));
        let c = run(
            NodeDef::new("Clip", 13),
            vec![a.clone(), Tensor::scalar(2i32)],
        )
        .unwrap();
        assert_eq!(c[0], Tensor::I32(array![2, 5, 3].into_dyn()));
        let c6 = NodeDef::new("Clip", 6).with_attr("max", AttrValue::Float(0.5));
        let c = run(c6, vec![f32t(array![-1.0, 1.0].into_dyn())]).unwrap();
        assert_eq!(c[0], f32t(array![-1.0, 0.5].into_dyn()));
        let e = run(
            NodeDef::new("Clip", 13),
            vec![a, Tensor::I32(array![1, 2].into_dyn())],
        )
        .unwrap_err();
        assert!(e.0.contains("Clip: min must be a scalar"), "{e}");
    }

    /// Pow by one exponent for every element (the fast forms for 2 and 3, powf for others)
    /// gives what powf in f64 rounds to, signed zeros, infinities and NaN included, and the
    /// same as the broadcasting path (an exponent per element).
    #[test]
    fn pow_by_one_exponent() {
        let xs = [
            -2.5f32,
            -0.0,
            0.0,
            1.5,
            3.0,
            7.1,
            1e-20,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for y in [2.0f32, 3.0, 0.5, -1.5, 0.0, 1.0] {
            let x = Tensor::from_vec(&[2, 5], xs.to_vec()).unwrap();
            let one = run(NodeDef::new("Pow", 15), vec![x.clone(), Tensor::scalar(y)]).unwrap();
            let each = Tensor::from_vec(&[2, 5], vec![y; 10]).unwrap();
            let per = run(NodeDef::new("Pow", 15), vec![x, each]).unwrap();
            let (one, per) = (
                one[0].as_array::<f32>().unwrap(),
                per[0].as_array::<f32>().unwrap(),
            );
            for ((&o, &p), &x) in one.iter().zip(per.iter()).zip(&xs) {
                let want = f64::from(x).powf(f64::from(y)) as f32;
                assert!(
                    same(o, want) && same(p, want),
                    "{x}^{y}: {o}, {p}, want {want}"
                );
            }
        }
    }

    #[test]
    fn variadic_pow_mod_shift() {
        let a = f32t(array![1.0, 4.0].into_dyn());
        let b = f32t(array![3.0].into_dyn());
        let m = run(
            NodeDef::new("Max", 13).with_io(3, 1),
            vec![a.clone(), b.clone(), Tensor::scalar(2.0f32)],
        )
        .unwrap();
        assert_eq!(m[0], f32t(array![3.0, 4.0].into_dyn()));
        let mean = run(NodeDef::new("Mean", 13), vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(mean[0], f32t(array![2.0, 3.5].into_dyn()));
        let p = run(NodeDef::new("Pow", 15), vec![a, Tensor::scalar(2i64)]).unwrap();
        assert_eq!(p[0], f32t(array![1.0, 16.0].into_dyn()));
        let md = run(
            NodeDef::new("Mod", 13),
            vec![Tensor::I32(array![-7, 7].into_dyn()), Tensor::scalar(3i32)],
        )
        .unwrap();
        assert_eq!(md[0], Tensor::I32(array![2, 1].into_dyn()));
        let sh = NodeDef::new("BitShift", 11)
            .with_attr("direction", AttrValue::String(b"LEFT".to_vec()));
        let s = run(
            sh,
            vec![
                Tensor::U8(array![1, 200].into_dyn()),
                Tensor::U8(array![3, 8].into_dyn()),
            ],
        )
        .unwrap();
        assert_eq!(s[0], Tensor::U8(array![8, 0].into_dyn()));
    }

    #[test]
    fn arrays_with_zero_dims() {
        let a = f32t(ArrayD::zeros(ndarray::IxDyn(&[0, 3])));
        let out = run(
            NodeDef::new("Add", 14),
            vec![a.clone(), f32t(array![1.0, 2.0, 3.0].into_dyn())],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[0, 3]);
    }
}
