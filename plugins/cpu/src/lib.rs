//! The CPU execution provider: pure Rust on `ndarray`. It is the reference for correctness and the
//! fallback that runs whatever no other EP claims; the host links it in, and `cdylib/` builds the
//! same code as a plugin library that loads through the ABI.

pub mod control;
pub mod fast;
mod fuse;
pub mod kernel;
mod lower;
pub mod narrow;
pub mod ops;
mod par;
pub mod program;
pub mod provider;
mod qdq;
pub mod scratch;
pub mod tensor;

pub use provider::{CPU_PROVIDER_NAME, CpuFactory, CpuProvider, builtin_plugin_entry};
