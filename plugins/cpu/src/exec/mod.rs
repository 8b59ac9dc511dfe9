//! The executor (level 4): a CPU EP kernel is a [`program::Program`], a sequence of op kernels
//! ([`step`]) compiled once and run many times. Compiling is a pipeline of named [`passes`] over
//! the graph the host hands over ([`program::PASSES`]); control flow (`If`, `Loop`, `Scan`)
//! compiles its bodies into programs of their own, the one recursion of this crate (program →
//! the `build_control_flow` pass → [`control`] → program). The kernels the passes make besides
//! the registry's: float16 conversions ([`lower`]), folded QDQ patterns ([`qdq`]) and fused
//! elementwise chains ([`fuse`]). [`profile`] times the steps as they run.

pub mod control;
pub(crate) mod fuse;
pub(crate) mod lower;
pub(crate) mod passes;
pub(crate) mod profile;
pub mod program;
pub(crate) mod qdq;
pub(crate) mod step;
