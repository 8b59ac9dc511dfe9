//! The host's error type: what failed, where, and what to do about it.
//!
//! Every message shows what a model or a plugin named (nodes, values, EPs, paths, a plugin's own
//! words) through [`printable`]: a control character is written as an escape (`\u{1b}`), so an
//! error printed on a terminal or written to a log cannot recolour it, move the cursor, erase
//! text or forge a line. Messages are one line; only two keep their newlines
//! ([`printable_lines`]): a plugin load refusal (the dependency report lists every folder
//! searched, one per line) and an EP's own error text, whose names are escaped all the same.

use std::path::PathBuf;

use crate::{printable, printable_lines};

use epx_plugin_api::abi::EpxStatusCode;

/// Everything the host library can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A model file could not be read or decoded.
    #[error("{}: {}", printable(source_name), printable(message))]
    Model {
        source_name: String,
        message: String,
    },

    /// A model is well-formed protobuf but not a graph the host can run.
    #[error("{}: invalid graph: {}", printable(source_name), printable(message))]
    InvalidGraph {
        source_name: String,
        message: String,
    },

    /// I/O on a named file failed.
    #[error("{}: {}", printable(&path.display().to_string()), printable(&source.to_string()))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A plugin library could not be loaded or does not honour the ABI.
    #[error("plugin {}: {}", printable(&path.display().to_string()), printable_lines(message))]
    PluginLoad {
        path: PathBuf,
        kind: PluginLoadErrorKind,
        message: String,
    },

    /// A plugin or EP returned an error status (or panicked) during a call.
    #[error("{}: {call} failed: {}", printable(provider), printable_lines(message))]
    Provider {
        provider: String,
        call: &'static str,
        code: EpxStatusCode,
        message: String,
    },

    /// A requested EP is not known, not available, or rejected its options.
    #[error("execution provider `{}`: {}", printable(name), printable(message))]
    ProviderSetup { name: String, message: String },

    /// No EP claimed a node.
    #[error("{}", printable(.0))]
    Unsupported(String),

    /// Inputs given to `run` do not match the model.
    #[error("{}", printable(.0))]
    InvalidInput(String),

    /// Running the session failed.
    #[error("{}", printable(.0))]
    Run(String),

    /// A run or a session creation was cancelled by the application (a terminate flag, a load
    /// cancellation flag).
    #[error("{}", printable(.0))]
    Cancelled(String),
}

/// What went wrong loading a plugin library, as a kind tests and tools can match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginLoadErrorKind {
    /// `dlopen` failed.
    Open,
    /// A library the plugin needs was not found (see the message for every place searched).
    MissingDependency,
    /// The library does not export `epx_plugin_entry`.
    MissingEntry,
    /// The plugin was built for an incompatible ABI version.
    AbiMismatch,
    /// The entry function returned an error (the plugin's reason is in the message).
    EntryFailed,
    /// The entry function panicked (caught by the plugin's SDK boundary).
    EntryPanicked,
    /// The descriptor the plugin returned is malformed.
    BadDescriptor,
    /// Discovery refused the plugin (manifest, permissions).
    Refused,
    /// The library file's SHA-256 is not the one its `plugin.toml` pins (`sha256`). Found by
    /// hashing the file before it is opened, so none of its code ran.
    ChecksumMismatch,
    /// The library registers other EPs than its `plugin.toml` lists.
    ManifestMismatch,
    /// Opening the library in a child process first ([`EnvironmentBuilder::with_load_probe`](crate::EnvironmentBuilder::with_load_probe))
    /// killed or hung that process, so it was not opened in this one.
    Crashed,
}

impl PluginLoadErrorKind {
    /// Every kind, for [`Self::from_name`].
    pub const ALL: [PluginLoadErrorKind; 11] = [
        Self::Open,
        Self::MissingDependency,
        Self::MissingEntry,
        Self::AbiMismatch,
        Self::EntryFailed,
        Self::EntryPanicked,
        Self::BadDescriptor,
        Self::Refused,
        Self::ChecksumMismatch,
        Self::ManifestMismatch,
        Self::Crashed,
    ];

    /// The kind's name (`MissingEntry`), as a child process reports it.
    pub fn name(self) -> String {
        format!("{self:?}")
    }

    /// The kind named `name` ([`Self::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The host library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
