//! What a program is made of: steps, each one kernel reading values from run inputs, constants
//! or the slots earlier steps wrote. The compile passes ([`crate::exec::passes`]) build and
//! rewrite steps; [`crate::exec::program::Program`] runs them.

use epx_plugin_api::sdk::Error;

use crate::error::OpError;
use crate::kernel::OpKernel;

/// Where a step input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// Input `i` of the run.
    Input(usize),
    /// Constant `i` of the program: an initializer, or a value computed at compile time.
    Constant(usize),
    /// A value computed by an earlier step.
    Slot(usize),
}

/// One kernel of a program and where its inputs and outputs live.
pub(crate) struct Step {
    /// The node's name (or `op#id`), with what the passes did to it: for messages.
    pub label: String,
    /// The op type, or the fused operations (`fused Add+Relu`, `Conv+Relu`): what the
    /// profiler sums by, and what [`crate::exec::program::Program::has_heavy_steps`] reads.
    pub kind: String,
    pub kernel: Box<dyn OpKernel>,
    pub inputs: Vec<Option<Source>>,
    /// The slot each output goes to (`None`: an output nobody reads).
    pub outputs: Vec<Option<usize>>,
    /// Slots no later step reads and that are not program outputs: freed after this step.
    pub frees: Vec<usize>,
    /// Whether the kernel reshapes input 0 (see [`crate::kernel::OpKernel::reshaped_shape`])
    /// from a slot this step frees: its buffer then moves to the output.
    pub moves_input: bool,
}

impl Step {
    /// A step of one kernel with no slot freed yet.
    pub(crate) fn new(
        label: String,
        kind: String,
        kernel: Box<dyn OpKernel>,
        inputs: Vec<Option<Source>>,
        outputs: Vec<Option<usize>>,
    ) -> Step {
        Step {
            label,
            kind,
            kernel,
            inputs,
            outputs,
            frees: Vec::new(),
            moves_input: false,
        }
    }
}

/// An op error of node `node`, as the plugin API reports it.
pub(crate) fn op_error(node: &str, e: OpError) -> Error {
    Error::runtime(format!("node `{node}`: {e}"))
}
