//! Isolated EPs: a plugin's EP running in a child process (`epx serve-plugin`), so a crash or a
//! hang of the plugin fails one call instead of killing the host.
//!
//! The host keeps a proxy ([`remote`]) where the EP instance would be: capability queries and
//! compiles send the graph as ONNX bytes (node ids mapped by output names), runs send tensors
//! through memory both processes map ([`shm`]), and small framed messages over pipes say what to
//! do ([`wire`]). A child that dies or stops answering within the call timeout is killed, the call
//! fails with an error saying how it ended, and the next call starts a new child and compiles the
//! session's kernels there again. Only EPs whose tensors live in host memory can be isolated.

pub mod config;
pub(crate) mod remote;
mod serve;
mod shm;
mod wire;

pub use config::Isolation;
pub use remote::describe;
pub use serve::serve;
