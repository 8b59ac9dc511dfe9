//! A node computed as a few of the CPU EP's own kernels in a row ([`Composite`]): the way
//! ONNX Runtime's `com.microsoft` operators that fuse ONNX operators are built here, from the
//! reference kernels of the operators they fuse, so the two cannot drift apart.

use crate::error::{OpError, OpResult};
use crate::kernel::{AttrValue, NodeDef, OpKernel};
use crate::ops::util::args::opt_input;
use crate::tensor::{Tensor, TensorRef};

/// An input of a composite step: an input of the node, the output of an earlier step, or a
/// constant made when the node was built.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    In(usize),
    Out(usize, usize),
    Const(usize),
}

struct Step {
    kernel: Box<dyn OpKernel>,
    args: Vec<Option<Arg>>,
    /// Runs only when this node input is present (optional inputs such as FastGelu's bias).
    when_present: Option<usize>,
}

/// A node computed as a few reference kernels in a row.
pub(crate) struct Composite<'n> {
    node: &'n NodeDef,
    steps: Vec<Step>,
    constants: Vec<Tensor>,
}

struct CompositeKernel {
    op: String,
    steps: Vec<Step>,
    constants: Vec<Tensor>,
    outputs: Vec<Option<Arg>>,
}

impl<'n> Composite<'n> {
    pub(crate) fn new(node: &'n NodeDef) -> Self {
        Composite {
            node,
            steps: Vec::new(),
            constants: Vec::new(),
        }
    }

    pub(crate) fn constant(&mut self, t: Tensor) -> Arg {
        self.constants.push(t);
        Arg::Const(self.constants.len() - 1)
    }

    /// Adds a step running the ONNX op `op_type` at `opset` with `attrs`; returns its output 0.
    pub(crate) fn step(
        &mut self,
        op_type: &str,
        opset: i64,
        attrs: &[(&str, AttrValue)],
        args: &[Option<Arg>],
    ) -> OpResult<Arg> {
        let s = self.step_n(op_type, opset, attrs, args, 1, None)?;
        Ok(Arg::Out(s, 0))
    }

    /// A one-input-dependent step: `Arg::In(0)` passes through when node input `present` is
    /// absent (an optional bias).
    pub(crate) fn step_if_present(
        &mut self,
        present: usize,
        op_type: &str,
        opset: i64,
        args: &[Option<Arg>],
    ) -> OpResult<Arg> {
        let s = self.step_n(op_type, opset, &[], args, 1, Some(present))?;
        Ok(Arg::Out(s, 0))
    }

    pub(crate) fn step_n(
        &mut self,
        op_type: &str,
        opset: i64,
        attrs: &[(&str, AttrValue)],
        args: &[Option<Arg>],
        outputs: usize,
        when_present: Option<usize>,
    ) -> OpResult<usize> {
        let attrs = attrs.iter().map(|(k, v)| (*k, v.clone())).collect();
        let kernel =
            crate::kernel::build_part(self.node, op_type, opset, attrs, args.len(), outputs)?;
        self.steps.push(Step {
            kernel,
            args: args.to_vec(),
            when_present,
        });
        Ok(self.steps.len() - 1)
    }

    pub(crate) fn finish(self, outputs: Vec<Option<Arg>>) -> OpResult<Box<dyn OpKernel>> {
        Ok(Box::new(CompositeKernel {
            op: self.node.op_type.clone(),
            steps: self.steps,
            constants: self.constants,
            outputs,
        }))
    }
}

impl CompositeKernel {
    fn resolve<'a>(
        &'a self,
        arg: Arg,
        inputs: &'a [Option<TensorRef<'_>>],
        done: &'a [Option<Vec<Tensor>>],
    ) -> OpResult<Option<TensorRef<'a>>> {
        Ok(match arg {
            Arg::In(i) => opt_input(inputs, i).map(TensorRef::reborrow),
            Arg::Const(c) => Some(self.constants[c].view()),
            Arg::Out(s, o) => match &done[s] {
                // A skipped optional step passes its first argument through.
                None => match self.steps[s].args.first().copied().flatten() {
                    Some(a) => self.resolve(a, inputs, done)?,
                    None => None,
                },
                Some(outs) => Some(
                    outs.get(o)
                        .ok_or_else(|| OpError(format!("{}: part {s} has no output {o}", self.op)))?
                        .view(),
                ),
            },
        })
    }
}

impl OpKernel for CompositeKernel {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let mut done: Vec<Option<Vec<Tensor>>> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            if step
                .when_present
                .is_some_and(|i| opt_input(inputs, i).is_none())
            {
                done.push(None);
                continue;
            }
            let out = {
                let mut args = Vec::with_capacity(step.args.len());
                for a in &step.args {
                    args.push(match a {
                        Some(a) => self.resolve(*a, inputs, &done)?,
                        None => None,
                    });
                }
                step.kernel.run(&args)?
            };
            done.push(Some(out));
        }
        let mut result = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            result.push(match o {
                None => Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[0]))),
                Some(a) => match self.resolve(*a, inputs, &done)? {
                    Some(t) => t.try_to_owned()?,
                    None => bail_missing(&self.op)?,
                },
            });
        }
        Ok(result)
    }
}

fn bail_missing(op: &str) -> OpResult<Tensor> {
    Err(OpError(format!(
        "{op}: an output depends on an absent input"
    )))
}
