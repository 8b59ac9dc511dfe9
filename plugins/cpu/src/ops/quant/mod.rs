//! The quantization family: every operator that takes or makes quantized integers, in one
//! folder by kind:
//!
//! - [`linear`]: QuantizeLinear / DequantizeLinear (per-tensor, per-axis and blocked, with the
//!   8-, 16- and 32-bit integer types) and DynamicQuantizeLinear; the float8 / int4 / int2 types
//!   are not supported;
//! - [`integer`]: MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, computed exactly,
//!   or with unsigned activations by signed weights summed as ONNX Runtime's kernels for the
//!   level sum them ([`pairs`] for the shapes the fast paths do not take);
//! - [`pack`]: their 8-bit fast paths on the integer GEMM of [`crate::fast::qgemm`] (through
//!   [`crate::fast::qconv`] and [`crate::fast::qmatmul`]), with the weights packed once, at
//!   [`crate::kernel::OpKernel::prepare`], by the kernel that owns them;
//! - [`qoperator`]: ONNX Runtime's QOperator-format ops (QLinearAdd, QLinearConcat, ...);
//! - [`dynamic`]: ONNX Runtime's DynamicQuantizeMatMul, MatMulIntegerToFloat, MatMulNBits.
//!
//! The rounding and requantization arithmetic they share is in [`crate::fast::round`]; the QDQ
//! planning that turns DequantizeLinear → op → QuantizeLinear into these ops is in
//! [`crate::exec::qdq`]. All fast paths compute what the general code computes: at the
//! reference kernel level the general code runs.

pub mod dynamic;
pub mod integer;
pub mod linear;
pub mod pack;
pub(crate) mod pairs;
pub mod qoperator;

use crate::kernel::Registry;

pub fn register(reg: &mut Registry) {
    linear::register(reg);
    integer::register(reg);
    qoperator::register(reg);
    dynamic::register(reg);
}

/// Helpers for the unit tests of the family.
#[cfg(test)]
mod tests {
    use crate::error::OpResult;
    use crate::kernel::NodeDef;
    use crate::tensor::{Tensor, TensorRef};

    pub(super) fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    pub(super) fn t<T: crate::tensor::Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    /// A stream of pseudo-random bytes.
    pub(super) fn byte_rng(seed: u64) -> impl FnMut() -> u8 {
        let mut words = crate::fast::qgemm::tests::lcg(seed);
        move || words() as u8
    }

    /// `v` as a uint8 tensor, or as int8 bits.
    pub(super) fn bytes_tensor(v: &[u8], shape: &[usize], signed: bool) -> Tensor {
        if signed {
            t(shape, v.iter().map(|&b| b as i8).collect::<Vec<i8>>())
        } else {
            t(shape, v.to_vec())
        }
    }

    /// `node` on `inputs` gives the reference level's output at every fast level this CPU
    /// has (it says which it skipped), all summing exactly (the reference's rule; summing as
    /// ONNX Runtime does has its own test).
    pub(super) fn assert_levels_agree(node: &NodeDef, inputs: &[Option<Tensor>], case: &str) {
        crate::fast::qgemm::with_sums(crate::fast::qgemm::Sums::Exact, || {
            levels_agree(node, inputs, case);
        });
    }

    fn levels_agree(node: &NodeDef, inputs: &[Option<Tensor>], case: &str) {
        let reference = crate::fast::ISAS
            .iter()
            .find(|i| !i.fast)
            .expect("a reference level");
        let op = &node.op_type;
        let want = crate::fast::with_isa(reference, || run(node.clone(), inputs.to_vec()))
            .expect("the reference level")
            .unwrap();
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            let Some(got) = crate::fast::with_isa(isa, || run(node.clone(), inputs.to_vec()))
            else {
                println!("{op}: {} skipped (this CPU lacks it)", isa.name);
                continue;
            };
            let got = got.unwrap();
            assert_eq!(got[0].shape(), want[0].shape(), "{op} {case}");
            assert_eq!(got[0].elem_type(), want[0].elem_type(), "{op} {case}");
            assert_eq!(
                got[0].view().to_f64_vec(),
                want[0].view().to_f64_vec(),
                "{op} {case} on {}",
                isa.name
            );
        }
    }
}
