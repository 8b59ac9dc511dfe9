//! The executor (level 4): a CPU EP kernel is a [`program::Program`], a sequence of op kernels
//! compiled once and run many times. Compiling is a pipeline of named passes over the graph the
//! host hands over; control flow (`If`, `Loop`, `Scan`) compiles its bodies into programs of
//! their own, the one recursion of this crate.

pub mod control;
pub(crate) mod fuse;
pub(crate) mod lower;
pub mod program;
pub(crate) mod qdq;
