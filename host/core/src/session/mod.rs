//! Sessions: a model planned once across its EPs, run many times from any number of threads.
//!
//! The stage after the plugins are loaded. [`environment`] holds the plugins a session can use
//! and the EPs every session starts from; [`request`] is what a session asks for (an EP by
//! name, with options); [`builder`] collects the requests and hands them to [`compile`], the
//! pipeline of named steps that turns a model into a session: set up the EPs, [`partition`]
//! the graph, place what no EP claimed, compile the groups into kernels, [`plan`] the copies
//! and releases, report the [`placement`]. The result is a [`compiled`] session, which [`run`] executes.

pub mod builder;
mod compile;
mod compiled;
pub mod environment;
mod kernel_cache;
pub mod partition;
pub mod placement;
pub mod plan;
pub mod profile;
pub mod request;
mod run;
mod select;

pub use builder::SessionBuilder;
pub use compiled::{Session, ValueSpec};
pub use environment::{
    BUILTIN_PLUGIN, BuiltinProviders, Environment, EnvironmentBuilder, ProviderDevice,
};
pub use placement::{PlacementReport, Selection};
pub use profile::Profile;
pub use request::ExecutionProvider;
pub use run::{RunOptions, SessionOutputs};
pub use select::{SelectionFn, SelectionInput, SelectionPolicy};
