//! ONNX protobuf messages and model loading.
mod load;
pub mod proto;
pub mod save;
pub(crate) mod schema;
#[cfg(test)]
pub(crate) mod testing;

pub use load::{
    MAX_IR_VERSION, MIN_IR_VERSION, load_model_bytes, load_model_file, load_tensor_bytes,
    load_value_bytes,
};
