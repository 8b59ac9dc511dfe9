//! Bit-level and threshold elementwise operators: BitwiseAnd, BitwiseOr, BitwiseXor (numpy
//! broadcasting, integer types), BitwiseNot, and Shrink (every numeric type).

use std::ops::{BitAnd, BitOr, BitXor, Not};

use ndarray::ArrayViewD;

use crate::ops::util::num::Num;

use crate::ops::util::broadcast::binary_map;

use crate::dispatch_int;
use crate::dispatch_numeric;
use crate::error::OpResult;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, same_type, typed_like};
use crate::tensor::{Elem, Tensor};

pub fn register(reg: &mut Registry) {
    add(reg, "BitwiseAnd", 18, build_and);
    add(reg, "BitwiseOr", 18, build_or);
    add(reg, "BitwiseXor", 18, build_xor);
    add(reg, "BitwiseNot", 18, build_not);
    add(reg, "Shrink", 9, build_shrink);
}

/// Integer element types with the bit operators.
trait Bits:
    Elem + BitAnd<Output = Self> + BitOr<Output = Self> + BitXor<Output = Self> + Not<Output = Self>
{
}

impl<T> Bits for T where
    T: Elem + BitAnd<Output = T> + BitOr<Output = T> + BitXor<Output = T> + Not<Output = T>
{
}

#[derive(Clone, Copy)]
enum BitOp {
    And,
    Or,
    Xor,
}

fn binary_typed<T: Bits>(
    op: &str,
    which: BitOp,
    a: ArrayViewD<'_, T>,
    b: &crate::tensor::TensorRef<'_>,
) -> OpResult<Tensor> {
    let b = typed_like::<T>(op, b)?;
    let out = binary_map(op, &a, &b, |x, y| match which {
        BitOp::And => x & y,
        BitOp::Or => x | y,
        BitOp::Xor => x ^ y,
    })?;
    Ok(out.into())
}

fn build_binary(n: &NodeDef, which: BitOp) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let a = input(&op, inputs, 0)?;
        let b = input(&op, inputs, 1)?;
        same_type(&op, a, b)?;
        one(dispatch_int!(
            a.clone(),
            |x| binary_typed(&op, which, x, b),
            &op
        ))
    }))
}

fn build_and(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    build_binary(n, BitOp::And)
}

fn build_or(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    build_binary(n, BitOp::Or)
}

fn build_xor(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    build_binary(n, BitOp::Xor)
}

fn not_typed<T: Bits>(a: ArrayViewD<'_, T>) -> OpResult<Tensor> {
    Ok(a.mapv(|x| !x).into())
}

fn build_not(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        one(dispatch_int!(x.clone(), |a| not_typed(a), &op))
    }))
}

fn shrink_typed<T: Num>(a: ArrayViewD<'_, T>, lambd: f64, bias: f64) -> OpResult<Tensor> {
    Ok(a.mapv(|x| {
        let v = x.to_f64();
        if v < -lambd {
            T::from_f64(v + bias)
        } else if v > lambd {
            T::from_f64(v - bias)
        } else {
            T::zero()
        }
    })
    .into())
}

fn build_shrink(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let lambd = f64::from(n.attr_float_or("lambd", 0.5)?);
    let bias = f64::from(n.attr_float_or("bias", 0.0)?);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        one(dispatch_numeric!(
            x.clone(),
            |a| shrink_typed(a, lambd, bias),
            &op
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::tensor::TensorRef;
    use ndarray::array;

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    #[test]
    fn bitwise_binary_broadcasts() {
        let a = Tensor::U8(array![[0b1100u8, 0b1010], [0xff, 0]].into_dyn());
        let b = Tensor::U8(array![0b1010u8, 0b0110].into_dyn());
        let and = run(
            NodeDef::new("BitwiseAnd", 18),
            vec![Some(a.clone()), Some(b.clone())],
        )
        .unwrap();
        assert_eq!(
            and[0],
            Tensor::U8(array![[0b1000u8, 0b0010], [0b1010, 0]].into_dyn())
        );
        let or = run(
            NodeDef::new("BitwiseOr", 18),
            vec![Some(a.clone()), Some(b.clone())],
        )
        .unwrap();
        assert_eq!(
            or[0],
            Tensor::U8(array![[0b1110u8, 0b1110], [0xff, 0b0110]].into_dyn())
        );
        let xor = run(NodeDef::new("BitwiseXor", 18), vec![Some(a), Some(b)]).unwrap();
        assert_eq!(
            xor[0],
            Tensor::U8(array![[0b0110u8, 0b1100], [0xf5, 0b0110]].into_dyn())
        );
        let not = run(
            NodeDef::new("BitwiseNot", 18),
            vec![Some(Tensor::I32(array![0, -1, 5].into_dyn()))],
        )
        .unwrap();
        assert_eq!(not[0], Tensor::I32(array![-1, 0, -6].into_dyn()));
    }

    #[test]
    fn bitwise_errors() {
        let e = run(
            NodeDef::new("BitwiseAnd", 18),
            vec![
                Some(Tensor::I32(array![1, 2].into_dyn())),
                Some(Tensor::I32(array![1, 2, 3].into_dyn())),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("cannot be broadcast"), "{e}");
        let e = run(
            NodeDef::new("BitwiseOr", 18),
            vec![
                Some(Tensor::I32(array![1].into_dyn())),
                Some(Tensor::I64(array![1].into_dyn())),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("same element type"), "{e}");
        let e = run(
            NodeDef::new("BitwiseNot", 18),
            vec![Some(Tensor::F32(array![1.0].into_dyn()))],
        )
        .unwrap_err();
        assert_eq!(e.0, "BitwiseNot: unsupported element type float32");
        let e = run(NodeDef::new("BitwiseXor", 18), vec![None, None]).unwrap_err();
        assert_eq!(e.0, "BitwiseXor: missing required input 0");
    }

    #[test]
    fn shrink_modes() {
        let x = Tensor::F32(array![-2.0f32, -1.0, 0.0, 1.0, 2.0].into_dyn());
        let hard = NodeDef::new("Shrink", 9).with_attr("lambd", AttrValue::Float(1.5));
        assert_eq!(
            run(hard, vec![Some(x.clone())]).unwrap()[0],
            Tensor::F32(array![-2.0f32, 0.0, 0.0, 0.0, 2.0].into_dyn())
        );
        let soft = NodeDef::new("Shrink", 9)
            .with_attr("lambd", AttrValue::Float(1.5))
            .with_attr("bias", AttrValue::Float(1.5));
        assert_eq!(
            run(soft, vec![Some(x)]).unwrap()[0],
            Tensor::F32(array![-0.5f32, 0.0, 0.0, 0.0, 0.5].into_dyn())
        );
        let ints = run(
            NodeDef::new("Shrink", 9),
            vec![Some(Tensor::I8(array![-3i8, 0, 3].into_dyn()))],
        )
        .unwrap();
        assert_eq!(ints[0], Tensor::I8(array![-3i8, 0, 3].into_dyn()));
        let e = run(
            NodeDef::new("Shrink", 9),
            vec![Some(Tensor::Bool(array![true].into_dyn()))],
        )
        .unwrap_err();
        assert_eq!(e.0, "Shrink: unsupported element type bool");
    }
}
