//! Plugins at run time: the host API table plugins call back into, loading a library and
//! validating its descriptor, and the checked calls into EP instances and their kernels.

pub(crate) mod host_api;
mod library;
mod provider;

pub use library::{PluginLibrary, ProviderDescription};
pub use provider::{CompiledKernel, ProviderInstance};
