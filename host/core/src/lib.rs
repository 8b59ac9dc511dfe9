//! The epx host: loads ONNX models, discovers execution-provider plugins, partitions the graph
//! across them and runs it, with the CPU EP always there to run what is left.
//!
//! The modules are the stages a model and a plugin go through, each depending only on the ones
//! before it: [`value`] (tensors and the other values a session moves), [`model`] (ONNX loading,
//! the IR, inference), [`plugin`] (manifest → discover → resolve → admit → load, and the ABI),
//! [`session`] (EP requests, the compile pipeline, partition, plan, run, placement) and
//! [`doctor`] (the report over all of them); [`files`] opens every file the host reads. `docs/architecture.md` draws the pipeline.
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

mod builtin;
pub mod cache;
pub mod child;
pub mod doctor;
pub mod error;
pub mod files;
pub mod model;
pub mod plugin;
pub mod session;
pub mod value;

pub use builtin::CPU as BUILTIN_CPU;
pub use error::{Error, PluginLoadErrorKind, Result};
pub use model::{ir, onnx};
pub use plugin::Device;
pub use plugin::probe::LoadProbe;
pub use plugin::python_eps::PythonEps;
pub use session::placement::{self, PlacementReport};
pub use session::profile::{self, Profile};
pub use session::{
    BUILTIN_PLUGIN, BuiltinProviders, Environment, EnvironmentBuilder, ExecutionProvider,
    ProviderDevice, RunOptions, Selection, SelectionFn, SelectionInput, SelectionPolicy, Session,
    SessionBuilder, SessionOutputs, ValueSpec,
};
pub use value::tensor::{max_tensor_bytes, set_max_tensor_bytes, with_max_tensor_bytes};
pub use value::{DeviceTensor, ElementType, Map, Sequence, Tensor, TensorElement, Value};

/// The plugin ABI version this host speaks, as `major.minor` (`"1.3"`): plugins built for this
/// major and a minor up to this one load.
pub fn plugin_abi_version() -> String {
    use epx_plugin_api::abi::{EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR};
    format!("{EPX_ABI_VERSION_MAJOR}.{EPX_ABI_VERSION_MINOR}")
}

/// `s` safe to print on a terminal: control characters (escape sequences, carriage returns,
/// C1 codes; newlines too) are written as `\u{..}` escapes, so a name from a model or a plugin
/// cannot move the cursor, recolour the screen or hide text.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    printable_keeping(s, false)
}

/// [`printable`], keeping newlines: for multi-line reports.
pub fn printable_lines(s: &str) -> std::borrow::Cow<'_, str> {
    printable_keeping(s, true)
}

fn printable_keeping(s: &str, newlines: bool) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && !(newlines && c == '\n');
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod printable_tests {
    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(
            super::printable("logits"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            super::printable("a\u{1b}[31mb\r\n\u{9b}c"),
            "a\\u{1b}[31mb\\u{d}\\u{a}\\u{9b}c"
        );
        assert_eq!(super::printable_lines("a\u{7}\nb"), "a\\u{7}\nb");
    }
}
