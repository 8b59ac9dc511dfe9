//! ONNX Runtime's dynamically quantized products (`com.microsoft`): DynamicQuantizeMatMul and
//! MatMulIntegerToFloat (8-bit integer products scaled back to float), and MatMulNBits (blocked
//! 2- to 8-bit weights dequantized to float).

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, add_ms};
use crate::ops::composite::Arg;
use crate::ops::composite::Composite;
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add_ms(reg, "DynamicQuantizeMatMul", build_dynamic_quantize_matmul);
    add_ms(reg, "MatMulIntegerToFloat", build_matmul_integer_to_float);
    add_ms(reg, "MatMulNBits", build_matmul_nbits);
}

/// `MatMulInteger(a, b, a_zp, b_zp)` as float, times `a_scale · b_scale`, plus an optional
/// bias: the unfused graph `quantize_dynamic` writes, in its order of operations.
fn integer_matmul_to_float(
    c: &mut Composite<'_>,
    a: Arg,
    a_scale: Arg,
    a_zp: Option<Arg>,
    b: (usize, usize, usize),
    bias: usize,
) -> OpResult<Arg> {
    let (b, b_scale, b_zp) = b;
    let prod = c.step(
        "MatMulInteger",
        10,
        &[],
        &[Some(a), Some(Arg::In(b)), a_zp, Some(Arg::In(b_zp))],
    )?;
    let float = c.step("Cast", 19, &[("to", AttrValue::Int(1))], &[Some(prod)])?;
    let scale = c.step("Mul", 14, &[], &[Some(a_scale), Some(Arg::In(b_scale))])?;
    let y = c.step("Mul", 14, &[], &[Some(float), Some(scale)])?;
    c.step_if_present(bias, "Add", 14, &[Some(y), Some(Arg::In(bias))])
}

/// DynamicQuantizeMatMul `(A, B, b_scale, b_zero_point, bias)`: A quantized to uint8 from its
/// own range, then an integer product scaled back to float.
fn build_dynamic_quantize_matmul(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let q = c.step_n(
        "DynamicQuantizeLinear",
        11,
        &[],
        &[Some(Arg::In(0))],
        3,
        None,
    )?;
    let y = integer_matmul_to_float(
        &mut c,
        Arg::Out(q, 0),
        Arg::Out(q, 1),
        Some(Arg::Out(q, 2)),
        (1, 2, 3),
        4,
    )?;
    c.finish(vec![Some(y)])
}

/// MatMulIntegerToFloat `(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias)`.
fn build_matmul_integer_to_float(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let mut c = Composite::new(n);
    let y = integer_matmul_to_float(
        &mut c,
        Arg::In(0),
        Arg::In(2),
        Some(Arg::In(4)),
        (1, 3, 5),
        6,
    )?;
    c.finish(vec![Some(y)])
}

/// MatMulNBits `(A, B, scales, zero_points, g_idx, bias)`: `A · Wᵀ` with `W [N, K]` stored in
/// blocks of `block_size` values along K, `bits` (2, 4 or 8) per value packed low bits first:
/// `B [N, blocks, block_size·bits/8]`, one scale per block, zero points packed the same way
/// (or as floats), `2^(bits-1)` when absent. Dequantized to f32, multiplied in f32.
fn build_matmul_nbits(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let k = usize::try_from(n.req_int("K")?).map_err(|_| n.error("K must not be negative"))?;
    let cols = usize::try_from(n.req_int("N")?).map_err(|_| n.error("N must not be negative"))?;
    let bits = n.attr_int_or("bits", 4)?;
    if !matches!(bits, 2 | 4 | 8) {
        return Err(n.error(format_args!("bits={bits} is not supported (2, 4 or 8)")));
    }
    let bits = bits as usize;
    let block = usize::try_from(n.req_int("block_size")?)
        .ok()
        .filter(|b| *b >= 16 && b.is_power_of_two())
        .ok_or_else(|| n.error("block_size must be a power of two of at least 16"))?;
    let blocks = k.div_ceil(block);
    let matmul = crate::kernel::build_part(n, "MatMul", 13, Vec::new(), 2, 1)?;
    Ok(Box::new(MatMulNBits {
        op,
        k,
        cols,
        bits,
        block,
        blocks,
        matmul,
    }))
}

struct MatMulNBits {
    op: String,
    k: usize,
    cols: usize,
    bits: usize,
    block: usize,
    blocks: usize,
    matmul: Box<dyn OpKernel>,
}

impl MatMulNBits {
    /// `W` dequantized and transposed, `[K, N]`.
    fn weights(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<f32>> {
        let op = &self.op;
        let (k, cols, bits, block, blocks) =
            (self.k, self.cols, self.bits, self.block, self.blocks);
        let per = 8 / bits;
        let mask = (1u8 << bits) - 1;
        let blob = block * bits / 8;
        let b = input(op, inputs, 1)?;
        let b = b
            .get::<u8>()
            .ok_or_else(|| OpError(format!("{op}: B must be uint8, got {}", b.elem_type())))?;
        let need = cols.checked_mul(blocks).and_then(|v| v.checked_mul(blob));
        if need != Some(b.len()) {
            bail!(
                "{op}: B has {} bytes, [N={cols}, {blocks} blocks, {blob}] needs {}",
                b.len(),
                need.map_or("more than memory holds".to_string(), |v| v.to_string())
            );
        }
        let b: Vec<u8> = b.iter().copied().collect();
        let scales = input(op, inputs, 2)?.to_f64_vec();
        if scales.len() != cols * blocks {
            bail!("{op}: {} scales for {cols}×{blocks} blocks", scales.len());
        }
        let default_zp = f64::from(1u32 << (bits - 1));
        let zp: Box<dyn Fn(usize, usize) -> f64> = match opt_input(inputs, 3) {
            None => Box::new(move |_, _| default_zp),
            Some(z) if z.elem_type() == epx_plugin_api::ElementType::Uint8 => {
                let row = blocks.div_ceil(per);
                let zv: Vec<u8> = z.get::<u8>().into_iter().flatten().copied().collect();
                if zv.len() != cols * row {
                    bail!("{op}: {} packed zero points, N×{row} needed", zv.len());
                }
                Box::new(move |c, blk| {
                    f64::from((zv[c * row + blk / per] >> ((blk % per) * bits)) & mask)
                })
            }
            Some(z) => {
                let zv = z.to_f64_vec();
                if zv.len() != cols * blocks {
                    bail!("{op}: {} zero points for {cols}×{blocks} blocks", zv.len());
                }
                Box::new(move |c, blk| zv[c * blocks + blk])
            }
        };
        let g_idx = match opt_input(inputs, 4) {
            Some(g) => {
                let g = g.to_i64_vec(&format!("{op}: g_idx"))?;
                if g.len() != k || g.iter().any(|&v| v < 0 || v as usize >= blocks) {
                    bail!("{op}: g_idx must give a block below {blocks} for each of {k} rows");
                }
                Some(g)
            }
            None => None,
        };
        let mut w = vec![0f32; k * cols];
        for c in 0..cols {
            for kk in 0..k {
                let blk = g_idx.as_ref().map_or(kk / block, |g| g[kk] as usize);
                // The value's place in its own block of storage.
                let (sb, i) = (kk / block, kk % block);
                let byte = b[(c * blocks + sb) * blob + i / per];
                let q = f64::from((byte >> ((i % per) * bits)) & mask);
                w[kk * cols + c] = ((q - zp(c, blk)) * scales[c * blocks + blk]) as f32;
            }
        }
        Ok(w)
    }
}

impl OpKernel for MatMulNBits {
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let a = input(&self.op, inputs, 0)?;
        if a.shape().last() != Some(&self.k) {
            bail!(
                "{}: A of shape {:?} does not end in K={}",
                self.op,
                a.shape(),
                self.k
            );
        }
        let w = Tensor::from_vec(&[self.k, self.cols], self.weights(inputs)?)?;
        let ty = a.elem_type();
        let a32 = a.cast(epx_plugin_api::ElementType::Float)?;
        let mut y = self.matmul.run(&[Some(a32.view()), Some(w.view())])?;
        let mut out = y.remove(0);
        if let Some(bias) = opt_input(inputs, 5) {
            let bv = bias.to_f64_vec();
            if bv.len() != self.cols {
                bail!(
                    "{}: bias has {} values for N={}",
                    self.op,
                    bv.len(),
                    self.cols
                );
            }
            if let Tensor::F32(a) = &mut out {
                for row in a
                    .as_slice_mut()
                    .into_iter()
                    .flat_map(|s| s.chunks_mut(self.cols))
                {
                    for (v, b) in row.iter_mut().zip(&bv) {
                        *v += *b as f32;
                    }
                }
            }
        }
        Ok(vec![out.view().cast(ty)?])
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{close_within, f32s, ms, run_some};
    use crate::tensor::Tensor;

    /// MatMulIntegerToFloat: the exact integer product with its zero points, scaled by
    /// `a_scale · b_scale`, plus the bias.
    #[test]
    fn matmul_integer_to_float_scales_the_exact_product() {
        // [1, 2] u8 (zero point 1) times [2, 2] i8, scaled by 0.5 · 0.25, plus a bias.
        let a = Tensor::from_vec(&[1, 2], vec![3u8, 5]).unwrap();
        let b = Tensor::from_vec(&[2, 2], vec![1i8, -2, 4, 3]).unwrap();
        let n = ms("MatMulIntegerToFloat");
        let y = run_some(
            n,
            vec![
                Some(a),
                Some(b),
                Some(Tensor::scalar(0.5f32)),
                Some(Tensor::scalar(0.25f32)),
                Some(Tensor::scalar(1u8)),
                None,
                Some(f32s(&[2], &[1.0, -1.0])),
            ],
        );
        // (3-1)·1 + (5-1)·4 = 18, (3-1)·-2 + (5-1)·3 = 8.
        close_within(&y[0], &[18.0 * 0.125 + 1.0, 8.0 * 0.125 - 1.0], 0.0);
    }
}
