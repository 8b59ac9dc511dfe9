//! The LSTM recurrence in float32: each step's gates are `W·xₜ + R·hₜ₋₁ + Wb + Rb` for every
//! batch row at once, then the cell update with ONNX's default activations (Sigmoid, Tanh,
//! Tanh) and the optional peepholes. The input's products `W·xₜ` do not depend on the
//! recurrence: they are one GEMM over a block of steps ([`Projection`]); `R·hₜ₋₁` is dot
//! products over the rows of R ([`super::dots`]: contiguous in ONNX's layout, so no weight is
//! transposed or copied). The logistic function
//! and tanh are ONNX Runtime's rational forms ([`super::math`]).
//!
//! The reference kernel (`ops::rnn`) computes every LSTM and GRU in f64; this one takes the
//! common case: float32 data, layout 0, no clip, no input_forget, the default activations, and
//! every batch row running the whole sequence. [`gru_direction`] is the GRU's recurrence on the
//! same dot products.

use super::dots::row_dots;
use super::math::{sigmoid_f32, tanh_f32, tanh_unclamped_f32};

/// Sizes of one LSTM: steps, batch rows, input features, hidden units.
#[derive(Clone, Copy, Debug)]
pub struct LstmDims {
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
}

/// One direction's parameters: `w` `[4h, input]`, `r` `[4h, h]`, `bias` `[8h]` (Wb then Rb),
/// `peep` `[3h]` (i, o, f), gate order i, o, f, c as in ONNX.
pub struct LstmWeights<'a> {
    pub w: &'a [f32],
    pub r: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub peep: Option<&'a [f32]>,
}

crate::multiversion! {
#[allow(clippy::too_many_arguments)]
/// Runs one direction over `x` (`[seq, batch, input]`), updating `h` and `c` (`[batch, h]`,
/// the initial state on entry) and writing each step's hidden state into `y` at
/// `y[(t · y_stride) + b · h ..]` (`y_stride`: the elements between steps in Y).
pub fn lstm_direction(
    dims: LstmDims,
    x: &[f32],
    wt: &LstmWeights<'_>,
    reverse: bool,
    h: &mut [f32],
    c: &mut [f32],
    y: &mut [f32],
    y_stride: usize,
) {
    let LstmDims { seq, batch, input: _, hidden: hs } = dims;
    if batch == 0 || hs == 0 {
        return;
    }
    // Gate j of batch row b at `gates[j · batch + b]`; one row's gates together in `row`.
    let mut gates = vec![0f32; 4 * hs * batch];
    let mut row = vec![0f32; if batch > 1 { 4 * hs } else { 0 }];
    let bias = |j: usize| wt.bias.map_or(0.0, |bias| bias[j] + bias[4 * hs + j]);
    let mut xw = Projection::new(dims, 4 * hs);
    for step in 0..seq {
        let t = if reverse { seq - 1 - step } else { step };
        // W·xₜ + Wb + Rb, from the products of a block of steps made at once, then + R·hₜ₋₁.
        let xwt = xw.step(t, reverse, x, wt.w, &bias);
        interleave(xwt, batch, &mut gates);
        row_dots(4 * hs, batch, hs, wt.r, h, &mut gates, batch);
        for b in 0..batch {
            let g = gathered(&gates, b, batch, &mut row);
            lstm_update_row(hs, g, wt.peep, &mut c[b * hs..][..hs], &mut h[b * hs..][..hs]);
            y[t * y_stride + b * hs..][..hs].copy_from_slice(&h[b * hs..][..hs]);
        }
    }
}
}

/// `dst[j · batch + b] = rows[b · len + j]` (`len = dst.len() / batch`): rows laid out value
/// by value, as [`row_dots`] writes its columns.
fn interleave(rows: &[f32], batch: usize, dst: &mut [f32]) {
    if batch == 1 {
        dst.copy_from_slice(&rows[..dst.len()]);
        return;
    }
    let len = dst.len() / batch;
    for (j, g) in dst.chunks_exact_mut(batch).enumerate() {
        for (b, v) in g.iter_mut().enumerate() {
            *v = rows[b * len + j];
        }
    }
}

/// Row `b` of values laid out as [`interleave`] makes them: `src` itself for one row, else
/// gathered into `row`.
fn gathered<'a>(src: &'a [f32], b: usize, batch: usize, row: &'a mut [f32]) -> &'a [f32] {
    if batch == 1 {
        return src;
    }
    for (j, v) in row.iter_mut().enumerate() {
        *v = src[j * batch + b];
    }
    row
}

/// The input's products `W·xₜ + bias` of a block of steps, made by one GEMM over all of them
/// (the recurrence needs them one step at a time, but they do not depend on it): at most
/// [`Projection::BUDGET`] values at a time, whatever the sequence's length.
struct Projection {
    dims: LstmDims,
    /// Gates per batch row.
    gates: usize,
    /// Steps a block holds.
    block: usize,
    /// The first step of the block held (`usize::MAX`: none yet).
    first: usize,
    /// `[step, batch, gates]` of the block.
    values: Vec<f32>,
}

impl Projection {
    const BUDGET: usize = 1 << 18;

    fn new(dims: LstmDims, gates: usize) -> Projection {
        Self::with_budget(dims, gates, Self::BUDGET)
    }

    fn with_budget(dims: LstmDims, gates: usize, budget: usize) -> Projection {
        let per_step = (dims.batch * gates).max(1);
        let block = (budget / per_step).clamp(1, dims.seq.max(1));
        Projection {
            dims,
            gates,
            block,
            first: usize::MAX,
            values: Vec::new(),
        }
    }

    /// Step `t`'s `[batch, gates]` products; a new block is made when `t` is outside the one
    /// held (the one that ends at `t` when the recurrence runs in `reverse`).
    fn step(
        &mut self,
        t: usize,
        reverse: bool,
        x: &[f32],
        w: &[f32],
        bias: &dyn Fn(usize) -> f32,
    ) -> &[f32] {
        let LstmDims {
            seq, batch, input, ..
        } = self.dims;
        let per_step = batch * self.gates;
        if self.first == usize::MAX || t < self.first || t >= self.first + self.block {
            self.first = if reverse {
                (t + 1).saturating_sub(self.block)
            } else {
                t
            };
            let steps = self.block.min(seq - self.first);
            let rows = steps * batch;
            self.values.clear();
            self.values
                .extend((0..rows * self.gates).map(|i| bias(i % self.gates)));
            let xs = &x[self.first * batch * input..][..rows * input];
            super::gemm::sgemm_nt(
                (rows, input, self.gates),
                (xs, input),
                (w, input),
                (&mut self.values, self.gates),
                true,
            );
        }
        &self.values[(t - self.first) * per_step..][..per_step]
    }
}

crate::multiversion! {
/// DynamicQuantizeLSTM's cell update of one batch row, each operation as ONNX Runtime's LSTM
/// does it (`ops::rnn`'s quantized recurrence says which): `g` the gates' products (`[4h]`,
/// ONNX's order i, o, f, c), `bias` their `Wb + Rb`, `peep` the peepholes (`[3h]`: i, o, f);
/// `c` and `h` (`[h]`) updated. With `input_forget`, `f = 1 - i`. Products are rounded apart
/// (no fused multiply-add); the logistic and tanh are MLAS's forms.
pub fn quantized_cell(
    g: &[f32],
    bias: &[f32],
    peep: &[f32],
    input_forget: bool,
    c: &mut [f32],
    h: &mut [f32],
) {
    let hs = h.len();
    let (g, bias, peep) = (&g[..4 * hs], &bias[..4 * hs], &peep[..3 * hs]);
    let c = &mut c[..hs];
    for k in 0..hs {
        let cp = c[k];
        let i = sigmoid_f32(g[k] + cp * peep[k] + bias[k]);
        let f = if input_forget {
            1.0 - i
        } else {
            sigmoid_f32(g[2 * hs + k] + cp * peep[2 * hs + k] + bias[2 * hs + k])
        };
        let cell = tanh_unclamped_f32(g[3 * hs + k] + bias[3 * hs + k]);
        let cn = cp * f + i * cell;
        let o = sigmoid_f32(g[hs + k] + cn * peep[hs + k] + bias[hs + k]);
        c[k] = cn;
        h[k] = tanh_unclamped_f32(cn) * o;
    }
}
}

/// One GRU direction's parameters: `w` `[3h, input]`, `r` `[3h, h]`, `bias` `[6h]` (Wb then
/// Rb), gate order z, r, h as in ONNX.
pub struct GruWeights<'a> {
    pub w: &'a [f32],
    pub r: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub linear_before_reset: bool,
}

crate::multiversion! {
#[allow(clippy::too_many_arguments)]
/// The GRU recurrence with ONNX's default activations (Sigmoid, Tanh) over `x`
/// (`[seq, batch, input]`), updating `h` (`[batch, h]`, the initial state on entry) and writing
/// each step's hidden state into `y` at `y[t · y_stride + b · h ..]`:
/// `z = σ(W_z·x + R_z·h + Wb_z + Rb_z)`, `r` likewise, the candidate
/// `tanh(W_h·x + R_h·(r ⊙ h) + Rb_h + Wb_h)` (or `tanh(W_h·x + r ⊙ (R_h·h + Rb_h) + Wb_h)` with
/// `linear_before_reset`), and `h = (1 - z) ⊙ candidate + z ⊙ h`. The input's products come
/// from a GEMM over a block of steps ([`Projection`]); the state's are dot products over the
/// rows of R where they lie ([`row_dots`]).
pub fn gru_direction(
    dims: LstmDims,
    x: &[f32],
    wt: &GruWeights<'_>,
    reverse: bool,
    h: &mut [f32],
    y: &mut [f32],
    y_stride: usize,
) {
    let LstmDims { seq, batch, input: _, hidden: hs } = dims;
    if batch == 0 || hs == 0 {
        return;
    }
    let bias = |j: usize| wt.bias.map_or(0.0, |b| b[j]);
    // R·h (+ Rb) for z and r and, when it is linear before the reset, the candidate: row j,
    // batch b at `[j · batch + b]`; one row's together in `row`.
    let mut rh = vec![0f32; 3 * hs * batch];
    let mut row = vec![0f32; if batch > 1 { 3 * hs } else { 0 }];
    let (mut reset, mut reset_h) = (vec![0f32; hs], vec![0f32; hs]);
    let mut xw = Projection::new(dims, 3 * hs);
    let state_rows = if wt.linear_before_reset { 3 * hs } else { 2 * hs };
    for step in 0..seq {
        let t = if reverse { seq - 1 - step } else { step };
        // W·xₜ + Wb, from the products of a block of steps made at once.
        let xwt = xw.step(t, reverse, x, wt.w, &bias);
        for (j, g) in rh.chunks_exact_mut(batch).enumerate() {
            g.fill(bias(3 * hs + j));
        }
        row_dots(state_rows, batch, hs, wt.r, h, &mut rh[..state_rows * batch], batch);
        for b in 0..batch {
            let wx = &xwt[b * 3 * hs..][..3 * hs];
            let hb = &mut h[b * hs..][..hs];
            let rows = if batch == 1 {
                &mut rh[..]
            } else {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = rh[j * batch + b];
                }
                &mut row[..]
            };
            gru_update_row(hs, wx, rows, wt, (&mut reset, &mut reset_h), hb);
            y[t * y_stride + b * hs..][..hs].copy_from_slice(hb);
        }
    }
}
}

/// The LSTM's cell update of one batch row from its gates' sums `g` (`[4h]`, order i, o, f, c)
/// and the optional peepholes (`[3h]`: i, o, f).
#[inline(always)]
fn lstm_update_row(hs: usize, g: &[f32], peep: Option<&[f32]>, c: &mut [f32], h: &mut [f32]) {
    let (gi, go, gf, gc) = (
        &g[..hs],
        &g[hs..2 * hs],
        &g[2 * hs..3 * hs],
        &g[3 * hs..4 * hs],
    );
    let (c, h) = (&mut c[..hs], &mut h[..hs]);
    for k in 0..hs {
        let (pik, pok, pfk) = match peep {
            Some(p) => (p[k], p[hs + k], p[2 * hs + k]),
            None => (0.0, 0.0, 0.0),
        };
        let i = sigmoid_f32(pik.mul_add(c[k], gi[k]));
        let f = sigmoid_f32(pfk.mul_add(c[k], gf[k]));
        let cell = tanh_f32(gc[k]);
        let cn = f.mul_add(c[k], i * cell);
        let o = sigmoid_f32(pok.mul_add(cn, go[k]));
        c[k] = cn;
        h[k] = o * tanh_f32(cn);
    }
}

/// The GRU's update of one batch row after its products: `wx` (`W·x + Wb`) and `rh` (`R·h`
/// plus Rb, for z and r, and for the candidate when it is linear before the reset; the
/// candidate's `R_h · (r ⊙ h)` is made here otherwise), each `[3h]` in gate order z, r, h.
#[inline(always)]
fn gru_update_row(
    hs: usize,
    wx: &[f32],
    rh: &mut [f32],
    wt: &GruWeights<'_>,
    (reset, reset_h): (&mut [f32], &mut [f32]),
    h: &mut [f32],
) {
    let (wz, wr, wn) = (&wx[..hs], &wx[hs..2 * hs], &wx[2 * hs..3 * hs]);
    let (reset, reset_h, h) = (&mut reset[..hs], &mut reset_h[..hs], &mut h[..hs]);
    for (((r, rhk), (&a, &b)), &hk) in reset
        .iter_mut()
        .zip(reset_h.iter_mut())
        .zip(wr.iter().zip(&rh[hs..2 * hs]))
        .zip(h.iter())
    {
        *r = sigmoid_f32(a + b);
        *rhk = *r * hk;
    }
    let zr = 2 * hs;
    if !wt.linear_before_reset {
        row_dots(hs, 1, hs, &wt.r[zr * hs..], reset_h, &mut rh[zr..], 1);
    }
    let (rz, rn) = (&rh[..hs], &rh[zr..zr + hs]);
    for ((((hk, &z_in), &r_z), (&n_in, &r_n)), &r) in h
        .iter_mut()
        .zip(wz)
        .zip(rz)
        .zip(wn.iter().zip(rn))
        .zip(reset.iter())
    {
        let z = sigmoid_f32(z_in + r_z);
        let pre = if wt.linear_before_reset {
            n_in + r * r_n
        } else {
            n_in + r_n
        };
        let cand = tanh_f32(pre);
        *hk = (1.0 - z) * cand + z * *hk;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of steps made ahead, forward and in reverse, blocks that do not divide the
    /// sequence: each step's products are `W·xₜ + bias`.
    #[test]
    fn the_input_products_of_each_step_come_from_their_block() {
        let dims = LstmDims {
            seq: 7,
            batch: 2,
            input: 3,
            hidden: 1,
        };
        let gates = 4;
        let x: Vec<f32> = (0..7 * 2 * 3).map(|i| (i % 5) as f32 - 2.0).collect();
        let w: Vec<f32> = (0..gates * 3)
            .map(|i| (i % 3) as f32 * 0.5 - 0.25)
            .collect();
        let bias = |j: usize| j as f32 * 0.125;
        for reverse in [false, true] {
            // Three steps a block.
            let mut p = Projection::with_budget(dims, gates, 3 * 2 * gates);
            for step in 0..7 {
                let t = if reverse { 6 - step } else { step };
                let got = p.step(t, reverse, &x, &w, &bias).to_vec();
                for b in 0..2 {
                    for j in 0..gates {
                        let want = bias(j)
                            + (0..3)
                                .map(|i| w[j * 3 + i] * x[(t * 2 + b) * 3 + i])
                                .sum::<f32>();
                        let v = got[b * gates + j];
                        assert!((v - want).abs() < 1e-6, "t {t} b {b} j {j}: {v} vs {want}");
                    }
                }
            }
        }
    }

    /// The cell update as the CPU's widest level runs it (vectorized, hardware FMA inside the
    /// logistic and tanh) gives the bits of the same operations one element at a time.
    #[test]
    fn the_quantized_cell_matches_its_scalar_form_bit_for_bit() {
        let hs = 37;
        let mut seed = 11u32;
        let mut next = |scale: f32| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
        };
        let g: Vec<f32> = (0..4 * hs).map(|_| next(12.0)).collect();
        let bias: Vec<f32> = (0..4 * hs).map(|_| next(1.0)).collect();
        let peep: Vec<f32> = (0..3 * hs).map(|_| next(0.5)).collect();
        let c0: Vec<f32> = (0..hs).map(|_| next(3.0)).collect();
        for input_forget in [false, true] {
            let (mut c, mut h) = (c0.clone(), vec![0.0f32; hs]);
            quantized_cell(&g, &bias, &peep, input_forget, &mut c, &mut h);
            for k in 0..hs {
                let cp = c0[k];
                let i = sigmoid_f32(g[k] + cp * peep[k] + bias[k]);
                let f = if input_forget {
                    1.0 - i
                } else {
                    sigmoid_f32(g[2 * hs + k] + cp * peep[2 * hs + k] + bias[2 * hs + k])
                };
                let cn = cp * f + i * tanh_unclamped_f32(g[3 * hs + k] + bias[3 * hs + k]);
                let o = sigmoid_f32(g[hs + k] + cn * peep[hs + k] + bias[hs + k]);
                let want = tanh_unclamped_f32(cn) * o;
                assert_eq!(
                    (c[k].to_bits(), h[k].to_bits()),
                    (cn.to_bits(), want.to_bits()),
                    "unit {k}, input_forget {input_forget}"
                );
            }
        }
    }
}
