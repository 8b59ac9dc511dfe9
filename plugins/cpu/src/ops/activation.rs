//! Activations beyond the elementwise family: ONNX Runtime's Gelu, BiasGelu, FastGelu,
//! QuickGelu and BiasAdd (`com.microsoft`), ONNX's Swish (opset 24), each a [`Composite`] of
//! ONNX kernels; and the `activation` attribute of the fused ops (FusedConv, FusedGemm), run
//! inside the producing kernel as a [`PostOp`] where it can be.

use crate::error::{OpError, OpResult};
use crate::fast::chain::EwOp;
use crate::fast::post::PostOp;
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, add_ms};
use crate::ops::composite::Arg;
use crate::ops::composite::Composite;
use crate::tensor::Tensor;

pub fn register(reg: &mut Registry) {
    add_ms(reg, "Gelu", |n| {
        let mut c = Composite::new(n);
        let y = c.step("Gelu", 20, &[], &[Some(Arg::In(0))])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "BiasGelu", |n| {
        let mut c = Composite::new(n);
        let sum = c.step("Add", 14, &[], &[Some(Arg::In(0)), Some(Arg::In(1))])?;
        let y = c.step("Gelu", 20, &[], &[Some(sum)])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "FastGelu", |n| {
        let mut c = Composite::new(n);
        let x = if n.num_inputs > 1 {
            c.step_if_present(1, "Add", 14, &[Some(Arg::In(0)), Some(Arg::In(1))])?
        } else {
            Arg::In(0)
        };
        let tanh = [("approximate", AttrValue::String(b"tanh".to_vec()))];
        let y = c.step("Gelu", 20, &tanh, &[Some(x)])?;
        c.finish(vec![Some(y)])
    });
    add_ms(reg, "QuickGelu", |n| build_swish(n, 1.702));
    // ONNX's own Swish (opset 24) is the same function with alpha 1 by default.
    crate::kernel::add(reg, "Swish", 24, |n| build_swish(n, 1.0));
    add_ms(reg, "BiasAdd", |n| {
        let mut c = Composite::new(n);
        let xb = c.step("Add", 14, &[], &[Some(Arg::In(0)), Some(Arg::In(1))])?;
        let y = c.step("Add", 14, &[], &[Some(xb), Some(Arg::In(2))])?;
        c.finish(vec![Some(y)])
    });
}

/// `x * sigmoid(alpha * x)`, computed in the input's type.
fn build_swish(n: &NodeDef, default_alpha: f32) -> OpResult<Box<dyn OpKernel>> {
    let alpha = n.attr_float_or("alpha", default_alpha)?;
    let mut c = Composite::new(n);
    let a = c.constant(Tensor::scalar(alpha));
    // alpha as the input's type: Mul needs both operands of one type.
    let a = c.step("CastLike", 19, &[], &[Some(a), Some(Arg::In(0))])?;
    let ax = c.step("Mul", 14, &[], &[Some(Arg::In(0)), Some(a)])?;
    let s = c.step("Sigmoid", 13, &[], &[Some(ax)])?;
    let y = c.step("Mul", 14, &[], &[Some(Arg::In(0)), Some(s)])?;
    c.finish(vec![Some(y)])
}

/// The activation of FusedConv / FusedGemm: `activation` and `activation_params`.
pub(crate) fn activation(n: &NodeDef) -> OpResult<Option<EwOp>> {
    let Some(name) = n.attr_string("activation")? else {
        return Ok(None);
    };
    let params = n.attr_floats("activation_params")?.unwrap_or_default();
    let p = |i: usize, default: f32| params.get(i).copied().unwrap_or(default);
    Ok(Some(match name.as_str() {
        "Relu" => EwOp::Relu,
        "Sigmoid" => EwOp::Sigmoid,
        "Tanh" => EwOp::Tanh,
        "LeakyRelu" => EwOp::LeakyRelu(p(0, 0.01)),
        "Clip" => EwOp::Clip(p(0, f32::MIN), p(1, f32::MAX)),
        "HardSigmoid" => EwOp::HardSigmoid(p(0, 0.2), p(1, 0.5)),
        other => {
            return Err(n.error(format_args!(
                "activation `{other}` is not one of Relu, Sigmoid, Tanh, LeakyRelu, Clip, \
                 HardSigmoid"
            )));
        }
    }))
}

/// The node's attributes less the activation ones, for the ONNX op it fuses.
pub(crate) fn base_attrs(n: &NodeDef) -> Vec<(&str, AttrValue)> {
    n.attributes
        .iter()
        .filter(|(k, _)| !k.starts_with("activation"))
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect()
}

/// Applies one activation to each element of an f32 output.
pub(crate) struct Activation(pub(crate) EwOp);

impl PostOp for Activation {
    fn accepts(&mut self, _shape: &[usize]) -> bool {
        true
    }
    fn work_len(&self) -> usize {
        0
    }
    fn apply(&self, seg: &mut [f32], _base: usize, _work: &mut [f32]) {
        for x in seg {
            *x = self.0.unary(*x);
        }
    }
}

/// Runs `act` over output 0 of `outs` (f32 only: the fused ops are float ops; other float types
/// go through f32, as their reference kernels do).
pub(crate) fn activate(op: &str, act: EwOp, outs: &mut [Tensor]) -> OpResult<()> {
    let Some(first) = outs.first_mut() else {
        return Err(OpError(format!("{op}: no output")));
    };
    match first {
        Tensor::F32(a) => a.mapv_inplace(|x| act.unary(x)),
        other => {
            let ty = other.elem_type();
            let f = other.view().cast(epx_plugin_api::ElementType::Float)?;
            let Tensor::F32(mut a) = f else {
                return Err(OpError(format!("{op}: cannot compute in f32")));
            };
            a.mapv_inplace(|x| act.unary(x));
            *other = Tensor::F32(a).view().cast(ty)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{close_within, f32s, ms, run_some};

    fn gelu(x: f32) -> f32 {
        0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2))
    }

    #[test]
    fn gelu_family() {
        let x = [-2.0, -0.5, 0.0, 1.0, 3.0];
        let b = [0.5, 0.5, -0.5, 0.0, 1.0];
        let y = run_some(
            ms("BiasGelu"),
            vec![Some(f32s(&[5], &x)), Some(f32s(&[5], &b))],
        );
        let want: Vec<f32> = x.iter().zip(&b).map(|(x, b)| gelu(x + b)).collect();
        close_within(&y[0], &want, 1e-6);
        // FastGelu: the tanh form, with and without its optional bias.
        let tanh_gelu = |x: f32| {
            0.5 * x
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        };
        let y = run_some(ms("FastGelu"), vec![Some(f32s(&[5], &x))]);
        close_within(&y[0], &x.map(tanh_gelu), 1e-6);
        let y = run_some(
            ms("FastGelu"),
            vec![Some(f32s(&[5], &x)), Some(f32s(&[5], &b))],
        );
        let want: Vec<f32> = x.iter().zip(&b).map(|(x, b)| tanh_gelu(x + b)).collect();
        close_within(&y[0], &want, 1e-6);
        let y = run_some(
            ms("QuickGelu").with_attr("alpha", AttrValue::Float(1.5)),
            vec![Some(f32s(&[5], &x))],
        );
        close_within(&y[0], &x.map(|x| x / (1.0 + (-1.5 * x).exp())), 1e-6);
    }
}
