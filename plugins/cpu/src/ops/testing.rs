//! Helpers for the unit tests of the operator families.

use ndarray::{ArrayD, IxDyn};

use crate::kernel::NodeDef;

use crate::error::OpResult;
use crate::tensor::{Tensor, TensorRef};

/// Builds `n` from the full registry and runs it on `inputs`.
pub fn run(n: NodeDef, inputs: Vec<Tensor>) -> OpResult<Vec<Tensor>> {
    let k = crate::ops::registry().build(&n)?;
    let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| Some(t.view())).collect();
    k.run(&refs)
}

/// A float32 tensor.
pub fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

/// A float32 tensor's values in order.
pub fn vals(t: &Tensor) -> Vec<f32> {
    t.as_array::<f32>().unwrap().iter().copied().collect()
}
