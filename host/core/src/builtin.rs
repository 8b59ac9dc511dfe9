//! The providers linked into the host library: the CPU EP. This is the one module that names
//! `epx_cpu`; it hands the CPU EP to every environment builder, and nothing below it knows which
//! EP is built in.

use crate::session::{BuiltinProviders, EnvironmentBuilder};

/// The CPU EP, as linked into this library.
pub const CPU: BuiltinProviders = BuiltinProviders {
    entry: epx_cpu::builtin_plugin_entry,
    fallback: "cpu",
    threads_option: "intra_op_num_threads",
};

impl Default for EnvironmentBuilder {
    fn default() -> Self {
        EnvironmentBuilder::with_builtin(CPU)
    }
}
