//! Comparing a computed value with an expected one, as the ONNX node tests do: element types and
//! shapes exactly, floating-point elements within `atol + rtol * |expected|` (NaN equals NaN),
//! every other element type exactly; sequences, maps and optionals item by item.

use epx::{ElementType, Tensor, Value};

/// The tolerances of a comparison.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    /// The node tests' tolerance (as ONNX's own backend tests use).
    pub const NODE_TESTS: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1e-3,
    };
}

/// The elements of a floating-point tensor as f64; `None` for other element types.
pub fn float_elements(t: &Tensor) -> Option<Vec<f64>> {
    Some(match t.elem_type() {
        ElementType::Float => t.as_slice::<f32>()?.iter().map(|&x| f64::from(x)).collect(),
        ElementType::Double => t.as_slice::<f64>()?.to_vec(),
        ElementType::Float16 => t
            .as_slice::<half::f16>()?
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        ElementType::Bfloat16 => t
            .as_slice::<half::bf16>()?
            .iter()
            .map(|x| x.to_f64())
            .collect(),
        _ => return None,
    })
}

/// `Ok(max absolute error)` when `have` matches `want` within `tol`, else a one-line reason
/// naming the output (`name`) and the first element off.
pub fn check_value(name: &str, have: &Value, want: &Value, tol: Tolerance) -> Result<f64, String> {
    match (have, want) {
        (Value::Host(h), Value::Host(w)) => check_tensor(name, h, w, tol),
        (Value::Sequence(h), Value::Sequence(w)) => {
            if h.len() != w.len() {
                return Err(format!(
                    "output `{name}`: a sequence of {} items instead of {}",
                    h.len(),
                    w.len()
                ));
            }
            let mut max = 0.0f64;
            for (i, (a, b)) in h.items().iter().zip(w.items()).enumerate() {
                max = max.max(check_value(&format!("{name}[{i}]"), a, b, tol)?);
            }
            Ok(max)
        }
        (Value::Map(h), Value::Map(w)) => {
            let k = check_tensor(&format!("{name} keys"), h.keys(), w.keys(), tol)?;
            Ok(k.max(check_tensor(
                &format!("{name} values"),
                h.values(),
                w.values(),
                tol,
            )?))
        }
        (Value::Optional(h), Value::Optional(w)) => match (h, w) {
            (Some(a), Some(b)) => check_value(name, a, b, tol),
            (None, None) => Ok(0.0),
            _ => Err(format!(
                "output `{name}`: {} instead of {}",
                have.type_name(),
                want.type_name()
            )),
        },
        // ONNX test data stores an optional's value without its wrapper at times.
        (Value::Optional(Some(a)), b) => check_value(name, a, b, tol),
        (a, Value::Optional(Some(b))) => check_value(name, a, b, tol),
        _ => Err(format!(
            "output `{name}`: {} instead of {}",
            have.type_name(),
            want.type_name()
        )),
    }
}

/// [`check_value`] for two tensors.
pub fn check_tensor(
    name: &str,
    have: &Tensor,
    want: &Tensor,
    tol: Tolerance,
) -> Result<f64, String> {
    if have.elem_type() != want.elem_type() {
        return Err(format!(
            "output `{name}`: type {} instead of {}",
            have.elem_type(),
            want.elem_type()
        ));
    }
    if have.shape() != want.shape() {
        return Err(format!(
            "output `{name}`: shape {:?} instead of {:?}",
            have.shape(),
            want.shape()
        ));
    }
    if let (Some(h), Some(w)) = (float_elements(have), float_elements(want)) {
        let mut max = 0.0f64;
        let mut first_off = None;
        for (i, (a, b)) in h.iter().zip(&w).enumerate() {
            if (a.is_nan() && b.is_nan()) || a == b {
                continue;
            }
            let err = (a - b).abs();
            max = max.max(if err.is_nan() { f64::INFINITY } else { err });
            // A NaN on one side only is off too (the error is NaN, within no tolerance).
            let within = err <= tol.atol + tol.rtol * b.abs();
            if first_off.is_none() && !within {
                first_off = Some((i, *a, *b));
            }
        }
        return match first_off {
            None => Ok(max),
            Some((i, a, b)) => Err(format!("output `{name}`: element {i} is {a}, expected {b}")),
        };
    }
    if have != want {
        return Err(format!("output `{name}`: values differ"));
    }
    Ok(0.0)
}

/// The largest absolute difference between the floating-point elements of two tensors of one
/// type and shape (infinite where one is NaN and the other is not); `None` when they are not
/// such tensors.
pub fn max_abs_error(have: &Value, want: &Value) -> Option<f64> {
    let (Value::Host(h), Value::Host(w)) = (have, want) else {
        return None;
    };
    if h.elem_type() != w.elem_type() || h.shape() != w.shape() {
        return None;
    }
    let (a, b) = (float_elements(h)?, float_elements(w)?);
    Some(a.iter().zip(&b).fold(0.0f64, |max, (x, y)| {
        if (x.is_nan() && y.is_nan()) || x == y {
            max
        } else {
            let e = (x - y).abs();
            max.max(if e.is_nan() { f64::INFINITY } else { e })
        }
    }))
}
