//! The LSTM recurrence in float32: each step's gates are `W·xₜ + R·hₜ₋₁ + Wb + Rb` as dot
//! products over the rows of W and R (contiguous in ONNX's layout, so no weight is transposed
//! or copied), then the cell update with ONNX's default activations (Sigmoid, Tanh, Tanh) and
//! the optional peepholes. The logistic function is ONNX Runtime's ([`super::math::sigmoid_f32`]).
//!
//! The reference kernel (`ops::rnn`) computes every LSTM in f64; this one takes the common case:
//! float32 data, layout 0, no clip, no input_forget, the default activations, and every batch
//! row running the whole sequence.

use super::math::sigmoid_f32;

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

/// `Σ a[k]·b[k]` with eight independent partial sums, so that it vectorizes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] = x[k].mul_add(y[k], acc[k]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s = x.mul_add(*y, s);
    }
    s
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
    let LstmDims { seq, batch, input, hidden: hs } = dims;
    let mut gates = vec![0f32; 4 * hs];
    for step in 0..seq {
        let t = if reverse { seq - 1 - step } else { step };
        for b in 0..batch {
            let xt = &x[(t * batch + b) * input..][..input];
            let hb = &mut h[b * hs..][..hs];
            let cb = &mut c[b * hs..][..hs];
            for (j, g) in gates.iter_mut().enumerate() {
                let mut v = dot(&wt.w[j * input..][..input], xt) + dot(&wt.r[j * hs..][..hs], hb);
                if let Some(bias) = wt.bias {
                    v += bias[j] + bias[4 * hs + j];
                }
                *g = v;
            }
            let (gi, rest) = gates.split_at(hs);
            let (go, rest) = rest.split_at(hs);
            let (gf, gc) = rest.split_at(hs);
            for k in 0..hs {
                let (pi, po, pf) = match wt.peep {
                    Some(p) => (p[k], p[hs + k], p[2 * hs + k]),
                    None => (0.0, 0.0, 0.0),
                };
                let i = sigmoid_f32(pi.mul_add(cb[k], gi[k]));
                let f = sigmoid_f32(pf.mul_add(cb[k], gf[k]));
                let cell = gc[k].tanh();
                let cn = f.mul_add(cb[k], i * cell);
                let o = sigmoid_f32(po.mul_add(cn, go[k]));
                cb[k] = cn;
                hb[k] = o * cn.tanh();
            }
            y[t * y_stride + b * hs..][..hs].copy_from_slice(hb);
        }
    }
}
}
