//! float16 runs as float32 inside a program.
//!
//! Every float16 value a [`crate::exec::program::Program`] computes or holds is a float32 tensor
//! there: float16 initializers widen once at compile time (but for a table that only Gathers
//! read, as their data: it stays float16 and the gathered rows widen, so a float16
//! transformer's word embedding is not held at twice its size), float16 run inputs widen as
//! the run starts, and float16 program outputs round back to float16 as it ends. In between, the float32
//! kernels (and their fast paths and fused chains) do the work, and nothing rounds to float16:
//! a `Cast` between float and float16 inside the program is the identity.
//!
//! This is what ONNX Runtime's CPU EP computes for a float16 model: it has float32 kernels only
//! for most ops, puts `Cast` nodes around them, and then removes every float32 → float16 →
//! float32 pair of Casts, the model's own included. A model converted to float16 (for instance
//! by `onnxconverter_common.float16`, keeping float32 inputs) then gives the same answer here as
//! there, instead of one rounded to float16 after every node.
//!
//! A few ops keep their float16 inputs as such, rounded from float32 first ([`keeps_float16`]):
//! a `Cast` from float16 to a type other than float or float16 (its answer depends on the
//! rounding), the control-flow ops (their bodies are programs of their own, with float16 edges),
//! and the sequence and optional ops, whose values may leave the program.

use epx_plugin_api::ElementType;
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::kernel::{AttrValue, NodeDef, OpKernel};

use crate::error::OpResult;

use crate::fast::post::PostOp;
use crate::tensor::{Tensor, TensorRef};

const FLOAT: i64 = 1;
const FLOAT16: i64 = 10;

/// Whether a node sees float16 inputs as float16 (rounded) rather than as float32.
fn keeps_float16(def: &NodeDef) -> bool {
    match def.op_type.as_str() {
        "Cast" => !matches!(
            def.attributes.get("to"),
            Some(AttrValue::Int(FLOAT | FLOAT16))
        ),
        "If" | "Loop" | "Scan" => true,
        op => {
            op.starts_with("Sequence")
                || op.starts_with("Optional")
                || op == "SplitToSequence"
                || op == "ConcatFromSequence"
        }
    }
}

/// Whether a node reads or writes float16 values.
pub(crate) fn touches_float16(def: &NodeDef, output_types: &[Option<ElementType>]) -> bool {
    def.input_types
        .iter()
        .chain(output_types)
        .any(|t| *t == Some(ElementType::Float16))
}

/// Readies a node that reads or writes float16 for a program holding float32: a node that
/// [keeps float16](keeps_float16) is left as it is and the inputs to round for it are returned;
/// any other is [widened](widen), with none to round.
pub(crate) fn prepare(def: &mut NodeDef) -> Vec<usize> {
    if keeps_float16(def) {
        return def
            .input_types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == Some(ElementType::Float16))
            .map(|(i, _)| i)
            .collect();
    }
    widen(def);
    Vec::new()
}

/// The node as its kernel is made when it runs on float32 data: float16 inputs are float32 and
/// a `Cast` to float16 casts to float32.
fn widen(def: &mut NodeDef) {
    for t in &mut def.input_types {
        if *t == Some(ElementType::Float16) {
            *t = Some(ElementType::Float);
        }
    }
    if def.op_type == "Cast"
        && let Some(AttrValue::Int(to)) = def.attributes.get_mut("to")
        && *to == FLOAT16
    {
        *to = FLOAT;
    }
}

/// A float16 tensor widened to float32; any other value as it is.
pub(crate) fn to_f32(t: Tensor) -> Tensor {
    match t {
        Tensor::F16(a) => {
            let mut out = ndarray::ArrayD::<f32>::zeros(a.raw_dim());
            match (a.as_slice(), out.as_slice_mut()) {
                // Contiguous: the slice conversion, F16C where the CPU has it.
                (Some(src), Some(dst)) => src.convert_to_f32_slice(dst),
                _ => out.zip_mut_with(&a, |o, h| *o = h.to_f32()),
            }
            Tensor::F32(out)
        }
        t => t,
    }
}

/// A float32 tensor rounded to float16 (to nearest even); any other value as it is (copied: an
/// error when the memory is not there).
pub(crate) fn to_f16(t: &TensorRef<'_>) -> crate::error::OpResult<Tensor> {
    match t {
        TensorRef::F32(a) => {
            let mut out = ndarray::ArrayD::<f16>::from_elem(a.raw_dim(), f16::ZERO);
            match (a.as_slice(), out.as_slice_mut()) {
                (Some(src), Some(dst)) => dst.convert_from_f32_slice(src),
                _ => out.zip_mut_with(a, |o, x| *o = f16::from_f32(*x)),
            }
            Ok(Tensor::F16(out))
        }
        t => t.try_to_owned(),
    }
}

/// A node's kernel inside a program that holds float16 values as float32: its float16 outputs
/// come back widened, and for a node that [keeps float16](keeps_float16) the inputs declared
/// float16 are rounded to it first.
pub(crate) struct Widened {
    pub inner: Box<dyn OpKernel>,
    /// Inputs to round to float16 before the kernel runs.
    pub round: Vec<usize>,
}

/// `kernel` as it runs inside a program when its node reads or writes float16 (`round`: the
/// inputs to round first, from [`prepare`]); as it is otherwise.
pub(crate) fn widened(kernel: Box<dyn OpKernel>, round: Option<Vec<usize>>) -> Box<dyn OpKernel> {
    match round {
        Some(round) => Box::new(Widened {
            inner: kernel,
            round,
        }),
        None => kernel,
    }
}

impl OpKernel for Widened {
    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        // Rounded inputs reach the kernel as float16, not as the float32 constants here.
        if self.round.is_empty() {
            self.inner.prepare(constants);
        }
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let out = if self.round.is_empty() {
            self.inner.run(inputs)?
        } else {
            let rounded: Vec<(usize, Tensor)> = self
                .round
                .iter()
                .filter_map(|&i| Some((i, inputs.get(i)?.as_ref()?)))
                .map(|(i, t)| Ok((i, to_f16(t)?)))
                .collect::<OpResult<_>>()?;
            let args: Vec<Option<TensorRef<'_>>> = inputs
                .iter()
                .enumerate()
                .map(|(i, t)| match rounded.iter().find(|(j, _)| *j == i) {
                    Some((_, r)) => Some(r.view()),
                    None => t.as_ref().map(TensorRef::reborrow),
                })
                .collect();
            self.inner.run(&args)?
        };
        Ok(out.into_iter().map(to_f32).collect())
    }

    fn run_with_post(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        post: &mut dyn PostOp,
    ) -> OpResult<(Vec<Tensor>, bool)> {
        if !self.round.is_empty() {
            return Ok((self.run(inputs)?, false));
        }
        let (out, applied) = self.inner.run_with_post(inputs, post)?;
        Ok((out.into_iter().map(to_f32).collect(), applied))
    }
}

/// The kernel of the steps that widen a float16 run input and round a float16 program output.
pub(crate) struct Convert {
    pub to_half: bool,
}

impl OpKernel for Convert {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let t = inputs
            .first()
            .and_then(Option::as_ref)
            .ok_or_else(|| crate::error::OpError("float16 conversion: no input".into()))?;
        Ok(vec![if self.to_half {
            to_f16(t)?
        } else {
            to_f32(t.try_to_owned()?)
        }])
    }
}
