//! The operator library: one file per operator family, each with a `register` function that adds
//! its schemas. Adding an operator is one entry in a family file (or one new file registered here).

pub mod attention;
pub mod bitwise;
pub mod contrib;
pub mod contrib_attention;
pub mod conv;
pub mod conv_transpose;
pub mod detection;
pub mod einsum;
pub mod elementwise;
pub mod grid;
pub mod index;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod ml;
pub mod ml_values;
pub mod normalization;
pub mod pool;
pub mod quant;
pub mod recurrent;
pub mod reduce;
pub mod resize;
pub mod rnn;
pub mod sequence;
pub mod shape;
pub mod signal;
pub mod softmax;
pub mod strings;
pub mod svm;
#[cfg(test)]
mod testing;
pub mod training;
pub mod trees;
pub mod util;

use crate::kernel::{BuildFn, OpResult, OpSchema, Registry};
use crate::tensor::Tensor;

/// Registers every operator of the CPU EP.
pub fn register_all(reg: &mut Registry) {
    elementwise::register(reg);
    matmul::register(reg);
    shape::register(reg);
    conv::register(reg);
    pool::register(reg);
    softmax::register(reg);
    reduce::register(reg);
    bitwise::register(reg);
    index::register(reg);
    layout::register(reg);
    resize::register(reg);
    loss::register(reg);
    attention::register(reg);
    signal::register(reg);
    rnn::register(reg);
    normalization::register(reg);
    conv_transpose::register(reg);
    einsum::register(reg);
    grid::register(reg);
    quant::register(reg);
    recurrent::register(reg);
    contrib::register(reg);
    contrib_attention::register(reg);
    ml::register(reg);
    ml_values::register(reg);
    trees::register(reg);
    svm::register(reg);
    detection::register(reg);
    training::register(reg);
    strings::register(reg);
    sequence::register(reg);
}

/// Adds an `ai.onnx` operator available from opset `since` on (the builder reads the node's
/// opset for older semantics it shares a schema with).
pub(crate) fn add(reg: &mut Registry, op_type: &'static str, since: i64, build: BuildFn) {
    add_range(reg, op_type, since, i64::MAX, build);
}

/// Adds an `ai.onnx` operator for opsets `since..=until` only: a version whose semantics differ
/// from the next one's gets its own builder, and the registry picks it by the node's opset.
pub(crate) fn add_range(
    reg: &mut Registry,
    op_type: &'static str,
    since: i64,
    until: i64,
    build: BuildFn,
) {
    reg.add(OpSchema {
        op_type,
        domain: "",
        since_version: since,
        until_version: until,
        build,
    });
}

/// Wraps a single output.
pub(crate) fn one(t: OpResult<Tensor>) -> OpResult<Vec<Tensor>> {
    t.map(|t| vec![t])
}
