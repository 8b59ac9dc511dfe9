//! Why a plugin library is not loaded: what every check of loading and admission returns.

use std::path::Path;

use crate::error::{Error, PluginLoadErrorKind as Kind};

/// Why a plugin library is not loaded: a kind to match on and a message a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: Kind,
    pub message: String,
}

impl Refusal {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Refusal {
            kind,
            message: message.into(),
        }
    }

    /// The host error naming the library.
    pub fn into_error(self, library: &Path) -> Error {
        Error::PluginLoad {
            path: library.to_path_buf(),
            kind: self.kind,
            message: self.message,
        }
    }
}
