//! The CPU execution provider: pure Rust on `ndarray`. It is the reference for correctness and the
//! fallback that runs whatever no other EP claims; the host links it in, and `cdylib/` builds the
//! same code as a plugin library that loads through the ABI.

pub mod error;
pub mod exec;
pub mod fast;
pub mod kernel;
pub mod limits;
pub mod narrow;
pub mod ops;
mod par;
pub mod provider;
pub mod scratch;
mod strided;
pub mod tensor;

pub use provider::{CPU_PROVIDER_NAME, CpuFactory, CpuProvider, builtin_plugin_entry};
