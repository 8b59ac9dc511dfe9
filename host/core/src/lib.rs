//! The epx host: loads ONNX models, discovers execution-provider plugins, partitions the graph
//! across them and runs it, with the CPU EP always there to run what is left.
//!
//! The modules follow the data's path: [`onnx`] loads a model into the [`ir`]; [`manifest`],
//! [`discover`] and [`resolve`] find plugins and their dependencies; [`plugin`] loads them and
//! speaks the ABI; [`partition`] assigns nodes to EPs; [`session`] compiles and runs.
//!
//! ```no_run
//! use epx::{ExecutionProvider, Session, Tensor};
//! let session = Session::builder()?
//!     .with_execution_providers([ExecutionProvider::new("cuda").with_option("device_id", "0")])?
//!     .commit_from_file("model.onnx")?;
//! let x = Tensor::from_array(ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[1, 4])));
//! let outputs = session.run([("x", x)])?;
//! println!("{:?}", outputs["y"]);
//! # Ok::<(), epx::Error>(())
//! ```
//!
//! Values other than tensors (ONNX's sequences, maps and optionals, as scikit-learn models and
//! text pipelines use them) are [`Value`]s, in and out:
//!
//! ```no_run
//! use epx::{ElementType, Session, Tensor, Value};
//! let session = Session::builder()?.commit_from_file("text-classifier.onnx")?;
//! let text = Tensor::from_strings(&[2], vec![b"a good day".to_vec(), b"rain again".to_vec()])?;
//! let outputs = session.run([("text", text)])?;
//! if let Some(Value::Sequence(rows)) = outputs.value("output_probability") {
//!     for row in rows.items() {
//!         if let Value::Map(m) = row {
//!             println!("{:?} -> {:?}", m.keys(), m.values());
//!         }
//!     }
//! }
//! # let _ = ElementType::Float;
//! # Ok::<(), epx::Error>(())
//! ```

pub mod device;
pub mod discover;
pub mod doctor;
pub mod environment;
pub mod error;
pub mod infer;
pub mod ir;
pub mod manifest;
pub mod onnx;
pub mod partition;
pub mod placement;
pub mod plan;
pub mod plugin;
pub mod resolve;
pub mod session;
pub mod tensor;
pub mod value;

pub use device::DeviceTensor;
pub use environment::{BUILTIN_PLUGIN, Environment, EnvironmentBuilder};
pub use error::{Error, PluginLoadErrorKind, Result};
pub use placement::PlacementReport;
pub use session::{ExecutionProvider, Session, SessionBuilder, SessionOutputs, ValueSpec};
pub use tensor::{ElementType, Tensor, TensorElement};
pub use value::{Map, Sequence, Value};
