//! Plugins, from a folder on disk to EP instances a session calls: the stage between the model
//! and the session.
//!
//! In the order a plugin meets them: [`manifest`] reads a `plugin.toml`; [`discover`] walks the
//! search path and lists candidates without opening anything; [`resolve`] finds the libraries a
//! candidate needs; [`admit`] runs every trust check (permissions, ABI, `sha256` pin,
//! dependencies) in one place for loading and `epx doctor` alike, on a [`sealed`] copy of the
//! library that is then the one opened; [`library`](PluginLibrary)
//! opens an admitted library and validates its descriptor; [`provider`](ProviderInstance) makes
//! EP instances and makes the checked calls into them and their kernels; [`host_api`] is the
//! table of callbacks plugins call back into.

pub mod admit;
pub mod discover;
pub(crate) mod host_api;
pub mod hosted;
pub mod isolate;
mod library;
pub mod manifest;
pub mod probe;
mod provider;
pub mod python_eps;
pub mod refusal;
pub mod resolve;
pub mod sealed;
pub mod trust;

pub use admit::{AdmissionReport, admit};
/// The model as plugins read it (nodes, values, attributes in the ABI's form): built once per
/// session and handed to every capability query and compile.
pub(crate) use host_api::AbiGraph;
pub use library::{Device, PluginLibrary, ProviderDescription};
pub(crate) use provider::Declined;
pub use provider::{CompiledKernel, KernelDetail, PartDetail, PassDetail, ProviderInstance};
pub use refusal::Refusal;
