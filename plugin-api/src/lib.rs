//! The epx plugin ABI and the Rust SDK for writing execution providers.
//!
//! [`abi`] is the C contract between host and plugin: `#[repr(C)]` structs that start with
//! their size, status objects, DLPack tensors and one entry symbol. It has no dependencies so
//! plugins in any language can mirror it (`include/epx_plugin.h` is generated from it).
//! [`sdk`] is the safe layer for Rust plugin authors: implement a few traits, call
//! [`export_plugin!`] once, and every boundary crossing is guarded against panics.

pub mod abi;
pub mod dlpack;
pub mod dtype;
pub mod ffi;
pub mod sdk;
mod status;

pub use dtype::ElementType;
