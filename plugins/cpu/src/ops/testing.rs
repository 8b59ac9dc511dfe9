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

/// A node of `op` in ONNX Runtime's `com.microsoft` domain.
pub fn ms(op: &str) -> NodeDef {
    let mut n = NodeDef::new(op, 1);
    n.domain = crate::kernel::MS.into();
    n
}

/// A float32 tensor from a slice.
pub fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}

/// Builds `n` (with as many inputs as given, absent ones `None`) and runs it: every output as
/// float32 values.
pub fn run_some(n: NodeDef, inputs: Vec<Option<Tensor>>) -> Vec<Vec<f32>> {
    let outputs = n.num_outputs;
    let n = n.with_io(inputs.len(), outputs);
    let k = crate::ops::registry().build(&n).unwrap();
    let refs: Vec<Option<TensorRef<'_>>> = inputs
        .iter()
        .map(|t| t.as_ref().map(Tensor::view))
        .collect();
    k.run(&refs)
        .unwrap()
        .iter()
        .map(|t| t.as_array::<f32>().unwrap().iter().copied().collect())
        .collect()
}

/// Asserts `a` and `b` agree element by element within `tol`.
pub fn close_within(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}
