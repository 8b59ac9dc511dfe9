//! Models: the first stage. [`onnx`] decodes an ONNX file (protobuf, external data, opset
//! checks) into the [`ir`], the host's graph of nodes and values; [`infer`] fills in element
//! types and shapes the file leaves out, so EPs can decide what they claim.

pub mod infer;
pub mod ir;
pub mod onnx;
