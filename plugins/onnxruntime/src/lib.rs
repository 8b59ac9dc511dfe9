//! The epx adapter over ONNX Runtime: every ORT execution provider (CPU, CUDA, TensorRT,
//! OpenVINO, DirectML, CoreML, QNN, ...) as an epx EP, one thin plugin crate each
//! (`plugins/onnxruntime/eps/<name>/`, a single [`export_plugin!`](epx_plugin_api::export_plugin)
//! over [`OrtFactory`]).
//!
//! - **Loading**: ONNX Runtime is loaded at run time through the `ort` crate's `load-dynamic`
//!   feature — never linked or downloaded at build time. Where the library is looked for:
//!   [`locate`]. Its version is read (`OrtGetApiBase()->GetVersionString()`) and checked before
//!   `ort` uses it.
//! - **API level**: `ort` is built with `api-23`, so ONNX Runtime 1.23 or newer loads (an older
//!   one is refused, naming both versions): the first with plugin-EP libraries. Sessions need no
//!   more than the version-18 table; level 22 brought `GetEpDevices`, ONNX Runtime's own list of the devices each of its EPs can
//!   use, which the adapter hands on as the EP's devices (ABI 1.5): kind, vendor, the name and
//!   driver version where ONNX Runtime's metadata has them, ids in ONNX Runtime's order. Only
//!   ONNX Runtime's built-in EPs (and EP libraries registered with it) are listed there; the
//!   provider-bridge EPs (CUDA, TensorRT, OpenVINO, ...) list no devices.
//! - **Availability** is truthful: the OS/architecture must be one ORT builds the EP for, the
//!   library must be found, and the EP must be in the library's `GetAvailableProviders` list.
//! - **Capability** is probed: each distinct node signature is serialized alone
//!   (`GraphView::serialize_subgraph`) and an ORT session is created with only this EP
//!   (`session.disable_cpu_ep_fallback = 1` for non-CPU EPs); success means supported. Results
//!   are cached per provider. All supported nodes are claimed as one group.
//! - **Compile** builds one ORT session per group; **execute** wraps the host's input tensors as
//!   ORT values over the same memory, calls `Run` (thread-safe, so kernels are declared
//!   concurrent) and copies each output once into the host's output tensor.
//! - **Memory** ([`Memory`]): CUDA and TensorRT keep tensors in CUDA memory between kernels,
//!   allocated by ORT's CUDA allocator, with kernel inputs and outputs bound through IO binding
//!   and copies made by ORT (see `device`). The other EPs declare host memory: ORT moves data to
//!   and from their device inside each kernel.
//!
//! Options (all EPs): `library` (path of the ONNX Runtime library to load), `ops` (comma-separated
//! op types: claim only these), plus the EP's own ORT options ([`OrtEp::option_keys`]).

mod device;
mod ep;
pub mod library;
pub mod locate;
mod logs;
mod patch;
mod provider;
pub mod runtime;

pub use device::Memory;
pub use ep::{ADAPTER_KEYS, OrtEp, Platforms};
pub use library::LibraryFactory;
pub use provider::{OrtFactory, OrtKernel, OrtProvider};
