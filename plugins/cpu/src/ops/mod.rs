//! The operator library (level 3): one file or folder per operator family, each with a `register`
//! function that adds its schemas, over the kernel interface ([`crate::kernel`]) and the kernels
//! of [`crate::fast`]. This file owns the list of families and the process-wide registry; no
//! family names it. Adding an operator is one entry in a family (or one new family listed here).
//!
//! No unsafe code: what needs it (raw buffers, SIMD, the GEMM's pointers) lives in [`crate::fast`]
//! and [`crate::par`] behind safe functions; the one unsafe call expanded here is the CPU-level
//! dispatch of [`crate::multiversion!`], which checks the CPU first.
#![deny(unsafe_code)]

pub mod activation;
pub mod attention;
pub mod bitwise;
pub mod composite;
pub mod conv;
pub mod conv_transpose;
pub mod detection;
pub mod einsum;
pub mod elementwise;
pub mod gather;
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
pub(crate) mod testing;
pub mod training;
pub mod trees;
pub mod util;

use crate::kernel::Registry;

/// The registry of every operator, made once per process.
pub fn registry() -> &'static Registry {
    crate::kernel::global_registry(all)
}

/// A new registry of every operator.
pub fn all() -> Registry {
    let mut r = Registry::new();
    register_all(&mut r);
    r
}

/// Registers every operator of the CPU EP; every kernel built goes through [`strings::wrap`].
pub fn register_all(reg: &mut Registry) {
    reg.set_wrap(strings::wrap);
    elementwise::register(reg);
    matmul::register(reg);
    shape::register(reg);
    conv::register(reg);
    pool::register(reg);
    softmax::register(reg);
    reduce::register(reg);
    bitwise::register(reg);
    index::register(reg);
    gather::register(reg);
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
    activation::register(reg);
    ml::register(reg);
    ml_values::register(reg);
    trees::register(reg);
    svm::register(reg);
    detection::register(reg);
    training::register(reg);
    strings::register(reg);
    sequence::register(reg);
}
