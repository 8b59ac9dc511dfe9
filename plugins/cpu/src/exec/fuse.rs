//! Fused elementwise chains as one step of a program: the chain's block walk
//! ([`crate::fast::chain`]) when its inputs are f32 and line up, else the original kernels one
//! after the other, with the same results.

use crate::error::{OpError, OpResult};
use crate::fast::chain::{Chain, ChainPost, EwOp, Operand};
use crate::kernel::{NodeDef, OpKernel};
use crate::tensor::{Tensor, TensorRef};

/// What a node is to the fuser: its operation and which of its inputs are operands (the others
/// are constant parameters already folded into the operation). `constant(i)` gives input `i`'s
/// value when it is a compile-time constant.
pub(crate) fn classify<'c>(
    def: &NodeDef,
    constant: impl Fn(usize) -> Option<&'c Tensor>,
) -> Option<(EwOp, Vec<usize>)> {
    if !(def.domain.is_empty() || def.domain == "ai.onnx") {
        return None;
    }
    // Inputs whose type is known must be f32 (the run checks again).
    if def
        .input_types
        .iter()
        .flatten()
        .any(|&t| t != epx_plugin_api::ElementType::Float)
    {
        return None;
    }
    let float = |name: &str, default: f32| def.attr_float_or(name, default).ok();
    let scalar = |i: usize| -> Option<Option<f32>> {
        if def.input_types.get(i).is_none_or(Option::is_none) {
            return Some(None);
        }
        match constant(i)?.view() {
            TensorRef::F32(a) if a.len() == 1 => a.iter().next().map(|&v| Some(v)),
            _ => None,
        }
    };
    let op = match def.op_type.as_str() {
        // Before opset 7 these had their own broadcast rules.
        "Add" if def.opset >= 7 => EwOp::Add,
        "Sub" if def.opset >= 7 => EwOp::Sub,
        "Mul" if def.opset >= 7 => EwOp::Mul,
        "Div" if def.opset >= 7 => EwOp::Div,
        "Relu" => EwOp::Relu,
        "Sigmoid" => EwOp::Sigmoid,
        "Tanh" => EwOp::Tanh,
        "Exp" => EwOp::Exp,
        "Sqrt" => EwOp::Sqrt,
        "Neg" => EwOp::Neg,
        "Abs" => EwOp::Abs,
        "Erf" => EwOp::Erf,
        "Identity" => EwOp::Identity,
        "HardSwish" => EwOp::HardSwish,
        "HardSigmoid" => EwOp::HardSigmoid(float("alpha", 0.2)?, float("beta", 0.5)?),
        "LeakyRelu" => EwOp::LeakyRelu(float("alpha", 0.01)?),
        "Clip" if def.opset < 11 => EwOp::Clip(
            float("min", f32::NEG_INFINITY)?,
            float("max", f32::INFINITY)?,
        ),
        "Clip" => EwOp::Clip(
            scalar(1)?.unwrap_or(f32::NEG_INFINITY),
            scalar(2)?.unwrap_or(f32::INFINITY),
        ),
        // Max and Min of a value and a constant scalar (in that order) are Clip to one side:
        // the same comparisons, NaN and signed zeros included.
        "Max" | "Min" if def.opset >= 8 && def.num_inputs == 2 => {
            let c = scalar(1)?.filter(|c| !c.is_nan())?;
            if def.op_type == "Max" {
                EwOp::Clip(c, f32::INFINITY)
            } else {
                EwOp::Clip(f32::NEG_INFINITY, c)
            }
        }
        _ => return None,
    };
    let arity = if op.is_binary() { 2 } else { 1 };
    if def.num_inputs < arity || def.num_outputs != 1 {
        return None;
    }
    Some((op, (0..arity).collect()))
}

/// The node behind one operation of a chain, run when the block walk does not apply.
pub(crate) struct FusedOp {
    pub label: String,
    pub kernel: Box<dyn OpKernel>,
    /// The original node's inputs (the operands and its constant parameters).
    pub inputs: Vec<Option<Operand>>,
}

/// A chain of elementwise operations run as one step; its output is the last operation's.
pub(crate) struct FusedChain {
    pub chain: Chain,
    /// The nodes, one per operation of `chain`.
    pub parts: Vec<FusedOp>,
}

impl FusedChain {
    /// A name for the fused step: its operations.
    pub(crate) fn describe(&self) -> String {
        self.chain.describe()
    }

    /// Runs the chain with input `primary` taken from `value`, a tensor computed separately.
    pub(crate) fn run_with(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        primary: usize,
        value: &Tensor,
    ) -> OpResult<Tensor> {
        let mut all: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(TensorRef::reborrow))
            .collect();
        all[primary] = Some(value.view());
        let mut out = self.run(&all)?;
        out.pop().ok_or_else(|| OpError("empty chain".into()))
    }

    /// The original kernels one after the other.
    fn run_each(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Tensor> {
        let mut results: Vec<Tensor> = Vec::with_capacity(self.parts.len());
        for op in &self.parts {
            let args: Vec<Option<TensorRef<'_>>> = op
                .inputs
                .iter()
                .map(|o| match o {
                    None => None,
                    Some(Operand::Ext(i)) => inputs[*i].as_ref().map(TensorRef::reborrow),
                    Some(Operand::Tmp(k)) => Some(results[*k].view()),
                })
                .collect();
            let mut out = op
                .kernel
                .run(&args)
                .map_err(|e| OpError(format!("node `{}`: {e}", op.label)))?;
            if out.is_empty() {
                return Err(OpError(format!("node `{}` produced no output", op.label)));
            }
            results.push(out.swap_remove(0));
        }
        let last = results.pop().ok_or_else(|| OpError("empty chain".into()))?;
        results.into_iter().for_each(Tensor::recycle);
        Ok(last)
    }
}

impl OpKernel for FusedChain {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![match self.chain.walk(inputs) {
            Some(t) => t,
            None => self.run_each(inputs)?,
        }])
    }
}

/// A kernel followed by an elementwise chain over its output 0, applied inside the kernel
/// where it can ([`OpKernel::run_with_post`]), else afterwards.
pub(crate) struct PostFused {
    pub first: Box<dyn OpKernel>,
    /// How many of the step's inputs are the first kernel's.
    pub first_inputs: usize,
    pub chain: FusedChain,
    /// The chain input that is the first kernel's output.
    pub primary: usize,
}

impl OpKernel for PostFused {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Tensor>, OpError> {
        let (a, b) = inputs.split_at(self.first_inputs.min(inputs.len()));
        let mut post = ChainPost::new(&self.chain.chain, b, self.primary);
        let (outs, applied) = self.first.run_with_post(a, &mut post)?;
        let mut outs = outs.into_iter();
        let y = outs
            .next()
            .ok_or_else(|| OpError("the fused kernel produced no output".into()))?;
        outs.for_each(Tensor::recycle);
        if applied {
            return Ok(vec![y]);
        }
        let r = self.chain.run_with(b, self.primary, &y);
        Tensor::recycle(y);
        Ok(vec![r?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epx_plugin_api::ElementType;

    /// Max and Min of a value and a scalar constant fuse as Clip to one side, and give the
    /// kernels' results bit for bit: NaN, signed zeros, infinities, ties.
    #[test]
    fn max_and_min_by_a_scalar_are_one_sided_clips() {
        let xs = [
            f32::NAN,
            -0.0,
            0.0,
            0.25,
            -0.25,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for c in [0.0f32, -0.0, 0.25, -3.0] {
            let constant = Tensor::from_vec(&[1, 1, 1, 1], vec![c]).unwrap();
            for op in ["Max", "Min"] {
                let def = NodeDef {
                    num_inputs: 2,
                    input_types: vec![Some(ElementType::Float); 2],
                    ..NodeDef::new(op, 13)
                };
                let (ew, operands) =
                    classify(&def, |i| (i == 1).then_some(&constant)).expect("fused");
                assert_eq!(operands, [0]);
                let kernel = crate::ops::registry().build(&def).unwrap();
                let x = Tensor::from_vec(&[xs.len()], xs.to_vec()).unwrap();
                let out = kernel
                    .run(&[Some(x.view()), Some(constant.view())])
                    .unwrap();
                let want = out[0].as_array::<f32>().unwrap();
                for (&x, &w) in xs.iter().zip(want.iter()) {
                    assert_eq!(ew.unary(x).to_bits(), w.to_bits(), "{op}({x}, {c})");
                }
            }
        }
        // A constant first, or a NaN constant, is not fused.
        let def = NodeDef {
            num_inputs: 2,
            input_types: vec![Some(ElementType::Float); 2],
            ..NodeDef::new("Max", 13)
        };
        let nan = Tensor::from_vec(&[1], vec![f32::NAN]).unwrap();
        assert!(classify(&def, |i| (i == 0).then_some(&nan)).is_none());
        assert!(classify(&def, |i| (i == 1).then_some(&nan)).is_none());
    }
}
