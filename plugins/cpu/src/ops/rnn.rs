//! Recurrent layers: RNN, GRU and LSTM (forward / reverse / bidirectional, activation lists with
//! alpha/beta, clip, sequence_lens, initial states, LSTM peepholes and input_forget, GRU
//! linear_before_reset, layout 0 and 1).
//!
//! Values are computed in f64 and cast back to X's float type; a float32 LSTM in the common
//! configuration runs on the float32 kernel of [`crate::fast::lstm`] instead (above the
//! reference level).

use crate::ops::util::num::{float_values, tensor_from_f64};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::add;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::ops::util::args::{input, opt_input};
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "RNN", 7, |n| build(n, Cell::Rnn));
    add(reg, "GRU", 7, |n| build(n, Cell::Gru));
    add(reg, "LSTM", 7, |n| build(n, Cell::Lstm));
    crate::kernel::add_ms(reg, "DynamicQuantizeLSTM", build_dynamic_quantize_lstm);
}

/// ONNX Runtime's DynamicQuantizeLSTM: an LSTM whose W (`[dirs, input, 4h]`) and R
/// (`[dirs, h, 4h]`) are int8 or uint8 with per-direction or per-column scales and zero points
/// (inputs 8–11), and whose products take X and the hidden state quantized to uint8 from their
/// own range (X over all its steps, the state of every batch row together at each step, as ONNX
/// Runtime does with one intra-op thread: with more, it quantizes each thread's share of a
/// batch of more than four rows, or of two or more with at most 256 hidden units, apart).
fn build_dynamic_quantize_lstm(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let lstm = Rnn {
        fake_quant: true,
        ..build_rnn(n, Cell::Lstm)?
    };
    Ok(Box::new(DynamicQuantizeLstm {
        lstm,
        outputs: n.num_outputs,
        prepared: std::sync::OnceLock::new(),
    }))
}

/// The DynamicQuantizeLSTM kernel: W and R (with their scales and zero points) turned into the
/// float tensors and integer matrices the recurrence reads once, at [`OpKernel::prepare`], when
/// they are constants (every run otherwise).
struct DynamicQuantizeLstm {
    lstm: Rnn,
    outputs: usize,
    prepared: std::sync::OnceLock<[(Tensor, QMat); 2]>,
}

/// The inputs a side of the products reads: the matrix, its scale and its zero point.
const QUANT_SIDES: [(usize, usize, &str); 2] = [(1, 8, "W"), (2, 10, "R")];

impl DynamicQuantizeLstm {
    /// W or R as the recurrence reads it: dequantized and transposed to ONNX's
    /// `[dirs, 4h, rows]`, and as integers in the same order with their zero points, scales and
    /// column sums.
    fn weights(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        (i, scale_i, what): (usize, usize, &str),
    ) -> OpResult<(Tensor, QMat)> {
        let op = "DynamicQuantizeLSTM";
        let (dirs, h, g) = (self.lstm.dirs, self.lstm.hidden, 4);
        let q = input(op, inputs, i)?;
        let &[d, rows, cols] = q.shape() else {
            bail!("{op}: {what} must have rank 3, got {:?}", q.shape());
        };
        if d != dirs || cols != g * h {
            bail!(
                "{op}: {what} must have shape [{dirs}, ?, {}], got {:?}",
                g * h,
                q.shape()
            );
        }
        let qv = q.to_i64_vec(&format!("{op}: {what}"))?;
        let per = |t: Option<&TensorRef<'_>>, name: &str, default: f64| -> OpResult<Vec<f64>> {
            let v = match t {
                None => return Ok(vec![default; dirs * cols]),
                Some(t) => t.to_f64_vec(),
            };
            match v.len() {
                l if l == dirs => Ok(v
                    .iter()
                    .flat_map(|&x| std::iter::repeat_n(x, cols))
                    .collect()),
                l if l == dirs * cols => Ok(v),
                l => bail!(
                    "{op}: {name} has {l} values; it needs {dirs} or {}",
                    dirs * cols
                ),
            }
        };
        let scale = per(
            Some(input(op, inputs, scale_i)?),
            &format!("{what}_scale"),
            1.0,
        )?;
        let zp = per(
            opt_input(inputs, scale_i + 1),
            &format!("{what}_zero_point"),
            0.0,
        )?;
        // Dequantized and transposed to ONNX's [dirs, 4h, rows]; and as integers in the
        // same order, for the products.
        let mut out = crate::limits::zeros_checked::<f32>(dirs * cols * rows, op)?;
        let mut ints = crate::limits::zeros_checked::<i32>(dirs * cols * rows, op)?;
        for dd in 0..dirs {
            for r in 0..rows {
                for c in 0..cols {
                    let k = dd * cols + c;
                    let q = qv[(dd * rows + r) * cols + c];
                    let v = (q as f64 - zp[k]) * scale[k];
                    out[(dd * cols + c) * rows + r] = v as f32;
                    ints[(dd * cols + c) * rows + r] = q as i32;
                }
            }
        }
        let sums = ints.chunks(rows.max(1)).map(|r| r.iter().sum()).collect();
        // Signed weights by uint8 activations sum as ONNX Runtime's u8·s8 GEMM does on the
        // CPUs of this level; unsigned ones exactly (its u8·u8 GEMM).
        let signed = q.elem_type() == epx_plugin_api::ElementType::Int8;
        let saturate = signed
            && crate::fast::enabled()
            && crate::fast::qgemm::Sums::like_onnxruntime()
                == crate::fast::qgemm::Sums::PairsSaturated;
        let zero: Vec<i32> = zp.iter().map(|&z| z as i32).collect();
        // Each direction's `[rows, 4h]` bytes packed for the 8-bit matrix product, which sums
        // as `saturate` says (ONNX Runtime's way at this level).
        let packed = if crate::fast::enabled() {
            (0..dirs)
                .map(|dd| {
                    let bytes: Vec<u8> = qv[dd * rows * cols..][..rows * cols]
                        .iter()
                        .map(|&v| v as u8)
                        .collect();
                    let zb = &zero[dd * cols..][..cols];
                    crate::fast::qmatmul::PackedB::new(&bytes, signed, (rows, cols), zb)
                })
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let qmat = QMat {
            k: rows,
            cols,
            w: ints,
            zero,
            scale: scale.iter().map(|&s| s as f32).collect(),
            sums,
            saturate,
            packed,
        };
        Ok((Tensor::from_vec(&[dirs, cols, rows], out)?, qmat))
    }
}

impl OpKernel for DynamicQuantizeLstm {
    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        let known = |i: usize| constants.get(i).is_some_and(Option::is_some);
        let zero_known = |i: usize| known(i) || constants.len() <= i;
        let constant = QUANT_SIDES
            .iter()
            .all(|&(i, s, _)| known(i) && known(s) && zero_known(s + 1));
        if constant
            && let (Ok(w), Ok(r)) = (
                self.weights(constants, QUANT_SIDES[0]),
                self.weights(constants, QUANT_SIDES[1]),
            )
        {
            let _ = self.prepared.set([w, r]);
        }
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        let owned;
        let [(w, qw), (r, qr)] = match self.prepared.get() {
            Some(p) => p,
            None => {
                owned = [
                    self.weights(inputs, QUANT_SIDES[0])?,
                    self.weights(inputs, QUANT_SIDES[1])?,
                ];
                &owned
            }
        };
        let mut args: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .take(8)
            .map(|t| t.as_ref().map(TensorRef::reborrow))
            .collect();
        args.resize(8, None);
        args[1] = Some(w.view());
        args[2] = Some(r.view());
        self.lstm.run_quant(&args, self.outputs, Some([qw, qr]))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    fn default_acts(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Act {
    Relu,
    Tanh,
    Sigmoid,
    Affine(f64, f64),
    LeakyRelu(f64),
    ThresholdedRelu(f64),
    ScaledTanh(f64, f64),
    HardSigmoid(f64, f64),
    Elu(f64),
    Softsign,
    Softplus,
}

impl Act {
    fn apply(self, x: f64) -> f64 {
        match self {
            Act::Relu => x.max(0.0),
            Act::Tanh => x.tanh(),
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Affine(a, b) => a * x + b,
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * (b * x).tanh(),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => (1.0 + x.exp()).ln(),
        }
    }
}

/// Parses the activation list; alpha/beta values are consumed in order by the activations that
/// take them.
fn parse_acts(n: &NodeDef, cell: Cell, dirs: usize) -> OpResult<Vec<Act>> {
    let names: Vec<String> = match n.attributes.get("activations") {
        Some(crate::kernel::AttrValue::Strings(v)) => v
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        Some(_) => return Err(n.error("attribute 'activations' must be a list of strings")),
        None => (0..dirs)
            .flat_map(|_| cell.default_acts().iter().map(|s| s.to_string()))
            .collect(),
    };
    let want = cell.default_acts().len() * dirs;
    if names.len() != want {
        return Err(n.error(format_args!(
            "activations {names:?} must list {want} functions"
        )));
    }
    let alphas = n.attr_floats("activation_alpha")?.unwrap_or_default();
    let betas = n.attr_floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0usize, 0usize);
    let next = |v: &[f32], i: &mut usize, d: f64| {
        let r = v.get(*i).map_or(d, |&x| f64::from(x));
        *i += 1;
        r
    };
    names
        .iter()
        .map(|name| {
            Ok(match name.to_ascii_lowercase().as_str() {
                "relu" => Act::Relu,
                "tanh" => Act::Tanh,
                "sigmoid" => Act::Sigmoid,
                "affine" => Act::Affine(next(&alphas, &mut ai, 1.0), next(&betas, &mut bi, 0.0)),
                "leakyrelu" => Act::LeakyRelu(next(&alphas, &mut ai, 0.01)),
                "thresholdedrelu" => Act::ThresholdedRelu(next(&alphas, &mut ai, 1.0)),
                "scaledtanh" => {
                    Act::ScaledTanh(next(&alphas, &mut ai, 1.0), next(&betas, &mut bi, 1.0))
                }
                "hardsigmoid" => {
                    Act::HardSigmoid(next(&alphas, &mut ai, 0.2), next(&betas, &mut bi, 0.5))
                }
                "elu" => Act::Elu(next(&alphas, &mut ai, 1.0)),
                "softsign" => Act::Softsign,
                "softplus" => Act::Softplus,
                other => return Err(n.error(format_args!("unknown activation '{other}'"))),
            })
        })
        .collect()
}

struct Rnn {
    op: String,
    cell: Cell,
    hidden: usize,
    dirs: usize,
    reverse_only: bool,
    acts: Vec<Act>,
    clip: Option<f64>,
    layout: i64,
    linear_before_reset: bool,
    input_forget: bool,
    /// Products see X and the hidden state quantized to uint8 and back (DynamicQuantizeLSTM).
    fake_quant: bool,
}

fn build(n: &NodeDef, cell: Cell) -> OpResult<Box<dyn OpKernel>> {
    let r = build_rnn(n, cell)?;
    let outputs = n.num_outputs;
    Ok(kernel(move |inputs| r.run(inputs, outputs)))
}

fn build_rnn(n: &NodeDef, cell: Cell) -> OpResult<Rnn> {
    let direction = n.attr_string_or("direction", "forward")?;
    let (dirs, reverse_only) = match direction.as_str() {
        "forward" => (1, false),
        "reverse" => (1, true),
        "bidirectional" => (2, false),
        other => return Err(n.error(format_args!("unknown direction '{other}'"))),
    };
    let hidden = n.req_int("hidden_size")?;
    let hidden = usize::try_from(hidden)
        .ok()
        .filter(|&h| h > 0)
        .ok_or_else(|| n.error(format_args!("hidden_size must be positive, got {hidden}")))?;
    let layout = n.attr_int_or("layout", 0)?;
    if layout != 0 && layout != 1 {
        return Err(n.error(format_args!("layout must be 0 or 1, got {layout}")));
    }
    let r = Rnn {
        op: n.op_type.clone(),
        cell,
        hidden,
        dirs,
        reverse_only,
        acts: parse_acts(n, cell, dirs)?,
        clip: n.attr_float("clip")?.map(f64::from).filter(|c| *c > 0.0),
        layout,
        linear_before_reset: n.attr_int_or("linear_before_reset", 0)? != 0,
        input_forget: n.attr_int_or("input_forget", 0)? != 0,
        fake_quant: false,
    };
    Ok(r)
}

/// DynamicQuantizeLSTM's integer weights of W or R: `[dirs][4h][k]` (rows of ONNX's gates),
/// their per-column zero points and scales, and how ONNX Runtime sums their products.
struct QMat {
    k: usize,
    cols: usize,
    w: Vec<i32>,
    zero: Vec<i32>,
    scale: Vec<f32>,
    /// Each column's `Σ_k w`.
    sums: Vec<i32>,
    saturate: bool,
    /// Per direction, the weights packed for the 8-bit matrix product (`k × cols`), which sums
    /// as [`QMat::product`] does; empty where the fast kernels are off.
    packed: Vec<crate::fast::qmatmul::PackedB>,
}

impl QMat {
    /// The integer sums `Σ_k (x[k] - zx)(w[c][k] - zw[c])` of every row `x` of `rows` (rows of
    /// `k` bytes, one after another) by every column `c` of direction `d`, as [`Self::product`]
    /// sums them, from the 8-bit matrix product: `None` where the weights are not packed.
    fn sums_of_rows(&self, d: usize, rows: &[u8], zx: i32) -> Option<Vec<i32>> {
        use crate::fast::qmatmul::{Dst, Output, run};
        let packed = self.packed.get(d)?;
        let n = rows.len().checked_div(self.k)?;
        let mut out = crate::limits::zeros_checked::<i32>(n * self.cols, "an LSTM product").ok()?;
        run(
            rows,
            false,
            zx,
            packed,
            &Output::Int32,
            Dst::Int32(&mut out),
        )?;
        Some(out)
    }

    /// Sum `sum` of column `c` of direction `d` scaled as [`Self::product`] scales it.
    fn scaled(&self, d: usize, c: usize, sum: i32, sx: f32) -> f32 {
        let scale = self.scale.get(d * self.cols + c).copied().unwrap_or(0.0);
        sum as f32 * (sx * scale)
    }

    /// `out[c] = (Σ_k (x[k] - zx)(w[c][k] - zw[c])) · (sx · sw[c])` for direction `d`, the sum
    /// taken as ONNX Runtime's 8-bit GEMM takes it (raw products in i16-saturated pairs on a
    /// CPU without VNNI, then the zero-point terms) and scaled in f32.
    fn product(&self, d: usize, x: &[u8], (sx, zx): (f32, i32), out: &mut [f64]) {
        let xsum: i32 = x.iter().map(|&v| i32::from(v)).sum();
        let k = self.k as i32;
        for (c, o) in out.iter_mut().enumerate().take(self.cols) {
            let idx = d * self.cols + c;
            let row = self.w.get(idx * self.k..(idx + 1) * self.k).unwrap_or(&[]);
            let raw: i32 = if self.saturate {
                row.chunks(2)
                    .zip(x.chunks(2))
                    .map(|(w, x)| {
                        let s: i32 = w.iter().zip(x).map(|(&w, &x)| w * i32::from(x)).sum();
                        s.clamp(i32::from(i16::MIN), i32::from(i16::MAX))
                    })
                    .sum()
            } else {
                row.iter().zip(x).map(|(&w, &x)| w * i32::from(x)).sum()
            };
            let zw = self.zero.get(idx).copied().unwrap_or(0);
            let sum = raw - zw * xsum - zx * self.sums.get(idx).copied().unwrap_or(0) + k * zx * zw;
            *o = f64::from(sum as f32 * (sx * self.scale.get(idx).copied().unwrap_or(0.0)));
        }
    }
}

/// What [`Rnn::quantized_lstm`] reads besides the weights: X quantized to uint8 (bytes, scale,
/// zero point), where row `(t, b)` of X starts, the batch, each row's sequence length, and the
/// float B and P as the node has them.
struct QSteps<'a> {
    x: (&'a [u8], f32, i32),
    x_row: &'a dyn Fn(usize, usize) -> usize,
    batch: usize,
    lens: &'a [usize],
    b: &'a [f64],
    p: &'a [f64],
}

impl Rnn {
    /// Whether [`Rnn::quantized_lstm`] computes this node: an LSTM with the default
    /// activations and no clip (what ONNX Runtime's fused LSTM cell computes).
    fn exact_quantized_lstm(&self) -> bool {
        self.cell == Cell::Lstm
            && self.clip.is_none()
            && self
                .acts
                .chunks(3)
                .all(|a| matches!(a, [Act::Sigmoid, Act::Tanh, Act::Tanh]))
    }

    /// DynamicQuantizeLSTM in float32, each operation as ONNX Runtime's LSTM does it
    /// (`uni_directional_lstm.cc`, `rnn_helpers.cc`), so that the hidden state it quantizes at
    /// every step has ONNX Runtime's bits and rounds to the same bytes:
    /// - the gates are X's product plus the hidden state's product (each an integer sum times
    ///   one f32 scale, [`QMat::product`]), the hidden state of every batch row quantized
    ///   together once a step; then the peephole term, then `Wb + Rb` (summed in f32 once);
    /// - `i`, `f`, `o` are MLAS's logistic ([`crate::fast::math::sigmoid_f32`]), `g` and the
    ///   output's tanh MLAS's tanh ([`crate::fast::math::tanh_unclamped_f32`]);
    /// - `C = C_prev · f + i · g` and `H = tanh(C) · o`, products rounded apart (no fused
    ///   multiply-add);
    /// - a reverse direction reads each row's steps backwards within its length; a row past its
    ///   length is 0 in Y and in the next step's quantized state.
    ///
    /// `y` is `[seq, dirs, batch, h]`; `yh` and `yc` hold the initial states `[dirs, batch, h]`
    /// and receive the final ones.
    fn quantized_lstm(
        &self,
        [qw, qr]: [&QMat; 2],
        st: &QSteps<'_>,
        y: &mut [f64],
        yh: &mut [f64],
        yc: &mut [f64],
    ) {
        let (h, dirs, batch) = (self.hidden, self.dirs, st.batch);
        let (xb, sx, zx) = st.x;
        let isz = qw.k;
        let max_len = st.lens.iter().copied().max().unwrap_or(0);
        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0) as f32;
        let mut wx = vec![0.0f64; 4 * h];
        let mut rh = vec![0.0f64; 4 * h];
        let mut gates = vec![0.0f32; 4 * h];
        for d in 0..dirs {
            let rev = self.reverse_only || d == 1;
            let bd = st.b.get(d * 8 * h..(d + 1) * 8 * h).unwrap_or(&[]);
            // Wb + Rb, summed once in float32.
            let bias: Vec<f32> = (0..4 * h).map(|j| at(bd, j) + at(bd, 4 * h + j)).collect();
            let pd = st.p.get(d * 3 * h..(d + 1) * 3 * h).unwrap_or(&[]);
            let peep: Vec<f32> = (0..3 * h).map(|j| at(pd, j)).collect();
            let s0 = d * batch * h;
            let mut hs: Vec<f32> = (0..batch * h).map(|j| at(yh, s0 + j)).collect();
            let mut cs: Vec<f32> = (0..batch * h).map(|j| at(yc, s0 + j)).collect();
            // X's products for every step at once, where its rows lie in step order.
            let rows = xb.len().checked_div(isz).unwrap_or(0);
            let in_order = batch > 0
                && rows % batch == 0
                && (0..rows).all(|r| (st.x_row)(r / batch, r % batch) == r * isz);
            let x_sums = in_order.then(|| qw.sums_of_rows(d, xb, zx)).flatten();
            for step in 0..max_len {
                // The hidden state of every row, quantized together, as ONNX Runtime's one
                // product per step takes it.
                let hq: Vec<f64> = hs.iter().map(|&v| f64::from(v)).collect();
                let (hb, sh, zh) = quantize_u8(&hq);
                let h_sums = qr.sums_of_rows(d, &hb, zh);
                for bb in 0..batch {
                    let len = st.lens.get(bb).copied().unwrap_or(0);
                    let row = bb * h..(bb + 1) * h;
                    if step >= len {
                        hs[row].fill(0.0);
                        continue;
                    }
                    let t = if rev { len - 1 - step } else { step };
                    let lo = (st.x_row)(t, bb);
                    let g4 = 4 * h;
                    match &x_sums {
                        Some(s) => {
                            let sums = &s[(t * batch + bb) * g4..][..g4];
                            for (c, (o, &v)) in wx.iter_mut().zip(sums).enumerate() {
                                *o = f64::from(qw.scaled(d, c, v, sx));
                            }
                        }
                        None => {
                            qw.product(d, xb.get(lo..lo + isz).unwrap_or(&[]), (sx, zx), &mut wx)
                        }
                    }
                    match &h_sums {
                        Some(s) => {
                            for (c, (o, &v)) in rh.iter_mut().zip(&s[bb * g4..][..g4]).enumerate() {
                                *o = f64::from(qr.scaled(d, c, v, sh));
                            }
                        }
                        None => {
                            qr.product(d, hb.get(row.clone()).unwrap_or(&[]), (sh, zh), &mut rh)
                        }
                    }
                    for (g, (&a, &b)) in gates.iter_mut().zip(wx.iter().zip(&rh)) {
                        *g = a as f32 + b as f32;
                    }
                    crate::fast::lstm::quantized_cell(
                        &gates,
                        &bias,
                        &peep,
                        self.input_forget,
                        &mut cs[row.clone()],
                        &mut hs[row.clone()],
                    );
                    for (k, &out) in hs[row.clone()].iter().enumerate() {
                        if let Some(v) = y.get_mut(((t * dirs + d) * batch + bb) * h + k) {
                            *v = f64::from(out);
                        }
                    }
                    if step + 1 == len {
                        for k in 0..h {
                            yh[s0 + bb * h + k] = f64::from(hs[bb * h + k]);
                            yc[s0 + bb * h + k] = f64::from(cs[bb * h + k]);
                        }
                    }
                }
            }
            for bb in 0..batch {
                if st.lens.get(bb).copied().unwrap_or(0) == 0 {
                    yh[s0 + bb * h..s0 + (bb + 1) * h].fill(0.0);
                    yc[s0 + bb * h..s0 + (bb + 1) * h].fill(0.0);
                }
            }
        }
    }
}

/// `v` quantized to uint8 from its own range, as DynamicQuantizeLinear does: the bytes, the
/// scale and the zero point.
fn quantize_u8(v: &[f64]) -> (Vec<u8>, f32, i32) {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    let (q, scale, zp) = crate::ops::quant::linear::quantize_dynamic_u8(&f);
    (q, scale, i32::from(zp))
}

/// `out[r] = sum_k m[r, k] * v[k]` for a row-major `rows x v.len()` matrix `m`.
fn matvec(m: &[f64], v: &[f64], out: &mut [f64]) {
    let k = v.len();
    for (r, o) in out.iter_mut().enumerate() {
        *o = m
            .get(r * k..(r + 1) * k)
            .unwrap_or(&[])
            .iter()
            .zip(v)
            .map(|(a, b)| a * b)
            .sum();
    }
}

impl Rnn {
    fn param(
        &self,
        what: &str,
        t: Option<&TensorRef<'_>>,
        shape: &[usize],
    ) -> OpResult<Option<Vec<f64>>> {
        let op = &self.op;
        match t {
            None => Ok(None),
            Some(t) => {
                if t.shape() != shape {
                    bail!(
                        "{op}: {what} must have shape {shape:?}, got {:?}",
                        t.shape()
                    );
                }
                float_values(op, what, t).map(Some)
            }
        }
    }

    /// The float32 LSTM or GRU ([`crate::fast::lstm`]) where it applies; `None` sends the node
    /// to the f64 reference below.
    fn fast_lstm(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: usize,
    ) -> Option<OpResult<Vec<Tensor>>> {
        use crate::fast::lstm::{GruWeights, LstmDims, LstmWeights, gru_direction, lstm_direction};
        let plain = matches!(self.cell, Cell::Lstm | Cell::Gru)
            && !self.fake_quant
            && self.layout == 0
            && self.clip.is_none()
            && !self.input_forget
            && self
                .acts
                .iter()
                .zip(self.cell.default_acts().iter().cycle())
                .all(|(a, d)| matches!((a, *d), (Act::Sigmoid, "Sigmoid") | (Act::Tanh, "Tanh")));
        if !plain || !crate::fast::enabled() {
            return None;
        }
        let f32_of = |i: usize| match inputs.get(i).and_then(Option::as_ref) {
            Some(TensorRef::F32(a)) => Some(a.as_slice()),
            _ => None,
        };
        let present = |i: usize| inputs.get(i).is_some_and(Option::is_some);
        let (x, w, r) = (f32_of(0)??, f32_of(1)??, f32_of(2)??);
        let xs = inputs.first()?.as_ref()?.shape();
        let &[seq, batch, isz] = xs else { return None };
        let (h, dirs, g) = (self.hidden, self.dirs, self.cell.gates());
        let shape_of = |i: usize| inputs.get(i).and_then(Option::as_ref).map(|t| t.shape());
        if shape_of(1)? != [dirs, g * h, isz] || shape_of(2)? != [dirs, g * h, h] {
            return None;
        }
        // Optional inputs: float32 of the right shape, or absent.
        let opt = |i: usize, shape: &[usize]| -> Option<Option<&[f32]>> {
            if !present(i) {
                return Some(None);
            }
            (shape_of(i)? == shape).then_some(())?;
            Some(Some(f32_of(i)??))
        };
        let bias = opt(3, &[dirs, 2 * g * h])?;
        let h0 = opt(5, &[dirs, batch, h])?;
        let lstm = self.cell == Cell::Lstm;
        let c0 = if lstm {
            opt(6, &[dirs, batch, h])?
        } else {
            None
        };
        let peep = if lstm { opt(7, &[dirs, 3 * h])? } else { None };
        if present(4) {
            // Only sequence lengths that all run the whole sequence.
            let l = inputs.get(4)?.as_ref()?;
            let lens = l.to_i64_vec("sequence_lens").ok()?;
            if l.shape() != [batch] || lens.iter().any(|&v| v != seq as i64) {
                return None;
            }
        }
        let dims = LstmDims {
            seq,
            batch,
            input: isz,
            hidden: h,
        };
        let mut hs = h0.map_or_else(|| vec![0f32; dirs * batch * h], <[f32]>::to_vec);
        let mut cs = c0.map_or_else(|| vec![0f32; dirs * batch * h], <[f32]>::to_vec);
        // Y as [seq, dirs, batch, h]: direction d writes at offset d · batch · h of each step.
        let mut y = vec![0f32; seq * dirs * batch * h];
        for d in 0..dirs {
            if lstm {
                let wt = LstmWeights {
                    w: &w[d * 4 * h * isz..][..4 * h * isz],
                    r: &r[d * 4 * h * h..][..4 * h * h],
                    bias: bias.map(|b| &b[d * 8 * h..][..8 * h]),
                    peep: peep.map(|p| &p[d * 3 * h..][..3 * h]),
                };
                let state = d * batch * h..(d + 1) * batch * h;
                lstm_direction(
                    dims,
                    x,
                    &wt,
                    self.reverse_only || d == 1,
                    &mut hs[state.clone()],
                    &mut cs[state],
                    &mut y[d * batch * h..],
                    dirs * batch * h,
                );
            } else {
                let wt = GruWeights {
                    w: &w[d * 3 * h * isz..][..3 * h * isz],
                    r: &r[d * 3 * h * h..][..3 * h * h],
                    bias: bias.map(|b| &b[d * 6 * h..][..6 * h]),
                    linear_before_reset: self.linear_before_reset,
                };
                let state = d * batch * h..(d + 1) * batch * h;
                gru_direction(
                    dims,
                    x,
                    &wt,
                    self.reverse_only || d == 1,
                    &mut hs[state],
                    &mut y[d * batch * h..],
                    dirs * batch * h,
                );
            }
        }
        let mut outs = Vec::with_capacity(outputs.max(1));
        let tensors = [
            (y, vec![seq, dirs, batch, h]),
            (hs, vec![dirs, batch, h]),
            (cs, vec![dirs, batch, h]),
        ];
        // A GRU has two outputs.
        let outputs = if lstm { outputs } else { outputs.min(2) };
        for (v, shape) in tensors.into_iter().take(outputs.max(1)) {
            outs.push(match Tensor::from_vec(&shape, v) {
                Ok(t) => t,
                Err(e) => return Some(Err(e)),
            });
        }
        Some(Ok(outs))
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>], outputs: usize) -> OpResult<Vec<Tensor>> {
        self.run_quant(inputs, outputs, None)
    }

    /// [`Rnn::run`]; with `quant` (DynamicQuantizeLSTM), the products are those of the integer
    /// weights by X and the hidden state quantized to uint8, as ONNX Runtime computes them.
    fn run_quant(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: usize,
        quant: Option<[&QMat; 2]>,
    ) -> OpResult<Vec<Tensor>> {
        if quant.is_none()
            && let Some(r) = self.fast_lstm(inputs, outputs)
        {
            return r;
        }
        let op = &self.op;
        let x = input(op, inputs, 0)?;
        let ty = x.elem_type();
        let &[d0, d1, isz] = x.shape() else {
            bail!("{op}: X must have rank 3, got shape {:?}", x.shape());
        };
        let (seq, batch) = if self.layout == 0 { (d0, d1) } else { (d1, d0) };
        let (h, g, dirs) = (self.hidden, self.cell.gates(), self.dirs);
        let lstm = self.cell == Cell::Lstm;
        // The float W and R, read by every path but the integer products of a
        // DynamicQuantizeLSTM, which has its own (and made these, of the right shapes).
        let integer = quant.is_some() && self.exact_quantized_lstm();
        let (w, r) = if integer {
            (Vec::new(), Vec::new())
        } else {
            (
                self.param("W", Some(input(op, inputs, 1)?), &[dirs, g * h, isz])?
                    .unwrap_or_default(),
                self.param("R", Some(input(op, inputs, 2)?), &[dirs, g * h, h])?
                    .unwrap_or_default(),
            )
        };
        let b = self
            .param("B", opt_input(inputs, 3), &[dirs, 2 * g * h])?
            .unwrap_or_else(|| vec![0.0; dirs * 2 * g * h]);
        let lens: Vec<usize> = match opt_input(inputs, 4) {
            Some(l) => {
                if l.shape() != [batch] {
                    bail!(
                        "{op}: sequence_lens must have shape [{batch}], got {:?}",
                        l.shape()
                    );
                }
                l.to_i64_vec(&format!("{op}: sequence_lens"))?
                    .into_iter()
                    .map(|v| {
                        usize::try_from(v)
                            .ok()
                            .filter(|&v| v <= seq)
                            .ok_or_else(|| {
                                OpError(format!("{op}: sequence length {v} is outside 0..={seq}"))
                            })
                    })
                    .collect::<OpResult<_>>()?
            }
            None => vec![seq; batch],
        };
        let state_shape = if self.layout == 0 {
            [dirs, batch, h]
        } else {
            [batch, dirs, h]
        };
        // States are kept as [dirs, batch, h].
        let to_dbh = |v: Vec<f64>| -> Vec<f64> {
            if self.layout == 0 {
                return v;
            }
            let mut o = vec![0.0; v.len()];
            for d in 0..dirs {
                for bb in 0..batch {
                    for k in 0..h {
                        if let (Some(dst), Some(src)) = (
                            o.get_mut((d * batch + bb) * h + k),
                            v.get((bb * dirs + d) * h + k),
                        ) {
                            *dst = *src;
                        }
                    }
                }
            }
            o
        };
        let h0 = self
            .param("initial_h", opt_input(inputs, 5), &state_shape)?
            .map(to_dbh)
            .unwrap_or_else(|| vec![0.0; dirs * batch * h]);
        let c0 = if lstm {
            self.param("initial_c", opt_input(inputs, 6), &state_shape)?
                .map(to_dbh)
                .unwrap_or_else(|| vec![0.0; dirs * batch * h])
        } else {
            Vec::new()
        };
        let p = if lstm {
            self.param("P", opt_input(inputs, 7), &[dirs, 3 * h])?
                .unwrap_or_else(|| vec![0.0; dirs * 3 * h])
        } else {
            Vec::new()
        };
        let mut xv = float_values(op, "X", x)?;
        // X quantized to uint8 once over all its rows, as ONNX Runtime quantizes the input of
        // its one product of every step: the bytes, their zero point and scale.
        let xq = quant.map(|_| quantize_u8(&xv));
        if self.fake_quant && quant.is_none() {
            // X is quantized once over all its steps, one batch row at a time.
            for bb in 0..batch {
                let idx: Vec<usize> = (0..seq)
                    .flat_map(|t| {
                        let lo = if self.layout == 0 {
                            (t * batch + bb) * isz
                        } else {
                            (bb * seq + t) * isz
                        };
                        lo..lo + isz
                    })
                    .collect();
                let mut row: Vec<f64> = idx.iter().map(|&i| xv[i]).collect();
                crate::ops::quant::linear::fake_quantize_u8(&mut row);
                for (&i, v) in idx.iter().zip(row) {
                    xv[i] = v;
                }
            }
        }
        let x_row = |t: usize, bb: usize| -> usize {
            if self.layout == 0 {
                (t * batch + bb) * isz
            } else {
                (bb * seq + t) * isz
            }
        };
        let xat = |t: usize, bb: usize| -> &[f64] {
            let lo = if self.layout == 0 {
                (t * batch + bb) * isz
            } else {
                (bb * seq + t) * isz
            };
            xv.get(lo..lo + isz).unwrap_or(&[])
        };
        // Y as [seq, dirs, batch, h].
        let mut y = vec![0.0f64; seq * dirs * batch * h];
        let mut yh = h0.clone();
        let mut yc = c0.clone();
        let na = self.cell.default_acts().len();
        let clip = |v: f64| self.clip.map_or(v, |c| v.clamp(-c, c));
        let mut wx = vec![0.0; g * h];
        let mut rh = vec![0.0; g * h];
        if let (Some(qm), Some((xb, sx, zx)), true) = (quant, &xq, self.exact_quantized_lstm()) {
            let steps = QSteps {
                x: (xb, *sx, *zx),
                x_row: &x_row,
                batch,
                lens: &lens,
                b: &b,
                p: &p,
            };
            self.quantized_lstm(qm, &steps, &mut y, &mut yh, &mut yc);
        } else {
            for d in 0..dirs {
                let rev = self.reverse_only || d == 1;
                let acts = self.acts.get(d * na..(d + 1) * na).unwrap_or(&[]);
                let (f, gg, hh) = (
                    acts.first().copied().unwrap_or(Act::Sigmoid),
                    acts.get(1).copied().unwrap_or(Act::Tanh),
                    acts.get(2).copied().unwrap_or(Act::Tanh),
                );
                let wd = w.get(d * g * h * isz..(d + 1) * g * h * isz).unwrap_or(&[]);
                let rd = r.get(d * g * h * h..(d + 1) * g * h * h).unwrap_or(&[]);
                let wb = b.get(d * 2 * g * h..(d * 2 + 1) * g * h).unwrap_or(&[]);
                let rb = b
                    .get((d * 2 + 1) * g * h..(d * 2 + 2) * g * h)
                    .unwrap_or(&[]);
                let pd = p.get(d * 3 * h..(d + 1) * 3 * h).unwrap_or(&[]);
                for bb in 0..batch {
                    let len = lens.get(bb).copied().unwrap_or(0);
                    let s0 = (d * batch + bb) * h;
                    let mut hs: Vec<f64> = h0.get(s0..s0 + h).unwrap_or(&[]).to_vec();
                    let mut cs: Vec<f64> = if lstm {
                        c0.get(s0..s0 + h).unwrap_or(&[]).to_vec()
                    } else {
                        Vec::new()
                    };
                    for step in 0..len {
                        let t = if rev { len - 1 - step } else { step };
                        if let (Some([qw, qr]), Some((xb, sx, zx))) = (quant, &xq) {
                            let lo = x_row(t, bb);
                            let row = xb.get(lo..lo + isz).unwrap_or(&[]);
                            qw.product(d, row, (*sx, *zx), &mut wx);
                            let (hb, sh, zh) = quantize_u8(&hs);
                            qr.product(d, &hb, (sh, zh), &mut rh);
                        } else if self.fake_quant {
                            matvec(wd, xat(t, bb), &mut wx);
                            let mut q = hs.clone();
                            crate::ops::quant::linear::fake_quantize_u8(&mut q);
                            matvec(rd, &q, &mut rh);
                        } else {
                            matvec(wd, xat(t, bb), &mut wx);
                            matvec(rd, &hs, &mut rh);
                        }
                        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
                        let mut nh = vec![0.0; h];
                        match self.cell {
                            Cell::Rnn => {
                                for (k, o) in nh.iter_mut().enumerate() {
                                    *o = f.apply(clip(
                                        at(&wx, k) + at(&rh, k) + at(wb, k) + at(rb, k),
                                    ));
                                }
                            }
                            Cell::Gru => {
                                let mut rhr = vec![0.0; h];
                                let gate =
                                    |i: usize| at(&wx, i) + at(&rh, i) + at(wb, i) + at(rb, i);
                                let z: Vec<f64> = (0..h).map(|k| f.apply(clip(gate(k)))).collect();
                                let rr: Vec<f64> =
                                    (0..h).map(|k| f.apply(clip(gate(h + k)))).collect();
                                if !self.linear_before_reset {
                                    let rhs: Vec<f64> =
                                        hs.iter().zip(&rr).map(|(a, b)| a * b).collect();
                                    matvec(
                                        rd.get(2 * h * h..3 * h * h).unwrap_or(&[]),
                                        &rhs,
                                        &mut rhr,
                                    );
                                }
                                for (k, o) in nh.iter_mut().enumerate() {
                                    let i = 2 * h + k;
                                    let pre = if self.linear_before_reset {
                                        at(&wx, i)
                                            + at(&rr, k) * (at(&rh, i) + at(rb, i))
                                            + at(wb, i)
                                    } else {
                                        at(&wx, i) + at(&rhr, k) + at(rb, i) + at(wb, i)
                                    };
                                    let ht = gg.apply(clip(pre));
                                    let zk = at(&z, k);
                                    *o = (1.0 - zk) * ht + zk * at(&hs, k);
                                }
                            }
                            Cell::Lstm => {
                                let gate =
                                    |i: usize| at(&wx, i) + at(&rh, i) + at(wb, i) + at(rb, i);
                                for (k, o) in nh.iter_mut().enumerate() {
                                    let cp = at(&cs, k);
                                    let it = f.apply(clip(gate(k) + at(pd, k) * cp));
                                    let ft = if self.input_forget {
                                        1.0 - it
                                    } else {
                                        f.apply(clip(gate(2 * h + k) + at(pd, 2 * h + k) * cp))
                                    };
                                    let ct = gg.apply(clip(gate(3 * h + k)));
                                    let c = ft * cp + it * ct;
                                    let ot = f.apply(clip(gate(h + k) + at(pd, h + k) * c));
                                    if let Some(s) = cs.get_mut(k) {
                                        *s = c;
                                    }
                                    *o = ot * hh.apply(c);
                                }
                            }
                        }
                        hs = nh;
                        let lo = ((t * dirs + d) * batch + bb) * h;
                        if let Some(dst) = y.get_mut(lo..lo + h) {
                            dst.copy_from_slice(&hs);
                        }
                    }
                    if let Some(dst) = yh.get_mut(s0..s0 + h) {
                        dst.copy_from_slice(&hs);
                    }
                    if lstm && let Some(dst) = yc.get_mut(s0..s0 + h) {
                        dst.copy_from_slice(&cs);
                    }
                }
            }
        }
        // Back to the output layout.
        let (y, yshape) = if self.layout == 0 {
            (y, vec![seq, dirs, batch, h])
        } else {
            let mut o = vec![0.0; y.len()];
            for t in 0..seq {
                for d in 0..dirs {
                    for bb in 0..batch {
                        for k in 0..h {
                            if let (Some(dst), Some(src)) = (
                                o.get_mut(((bb * seq + t) * dirs + d) * h + k),
                                y.get(((t * dirs + d) * batch + bb) * h + k),
                            ) {
                                *dst = *src;
                            }
                        }
                    }
                }
            }
            (o, vec![batch, seq, dirs, h])
        };
        let from_dbh = |v: Vec<f64>| -> Vec<f64> {
            if self.layout == 0 {
                return v;
            }
            let mut o = vec![0.0; v.len()];
            for d in 0..dirs {
                for bb in 0..batch {
                    for k in 0..h {
                        if let (Some(dst), Some(src)) = (
                            o.get_mut((bb * dirs + d) * h + k),
                            v.get((d * batch + bb) * h + k),
                        ) {
                            *dst = *src;
                        }
                    }
                }
            }
            o
        };
        let mut outs = vec![tensor_from_f64(ty, &yshape, y)?];
        if outputs > 1 {
            outs.push(tensor_from_f64(ty, &state_shape, from_dbh(yh))?);
        }
        if lstm && outputs > 2 {
            outs.push(tensor_from_f64(ty, &state_shape, from_dbh(yc))?);
        }
        Ok(outs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-bit matrix product of many rows at once gives each row's sums as the per-row
    /// product does, scaled the same: int8 and uint8 weights, per-column zero points, and (for
    /// int8 at the `avx2` level) pairs saturated where ONNX Runtime saturates them; at every
    /// fast level this CPU has.
    #[test]
    fn the_matrix_product_of_all_rows_sums_as_the_row_product() {
        for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
            if crate::fast::with_isa(isa, all_rows_sum_as_the_row_product).is_none() {
                println!("{}: skipped (this CPU lacks it)", isa.name);
            }
        }
    }

    fn all_rows_sum_as_the_row_product() {
        eprintln!(
            "{}: int8 products summed {:?}",
            crate::fast::isa::isa().name,
            crate::fast::qgemm::Sums::like_onnxruntime(),
        );
        let (k, cols, n) = (37, 12, 5);
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 24) as u8
        };
        let x: Vec<u8> = (0..n * k).map(|_| next()).collect();
        for signed in [true, false] {
            // `[k, cols]` bytes, as the node's W of one direction; extremes included.
            let mut bytes: Vec<u8> = (0..k * cols).map(|_| next()).collect();
            bytes[..4].copy_from_slice(&[0x7f, 0x7f, 0x80, 0xff]);
            let value = |b: u8| {
                if signed {
                    i32::from(b as i8)
                } else {
                    i32::from(b)
                }
            };
            let zero: Vec<i32> = (0..cols as i32)
                .map(|c| if signed { c - 6 } else { 120 + c })
                .collect();
            let mut w = vec![0i32; cols * k];
            for r in 0..k {
                for c in 0..cols {
                    w[c * k + r] = value(bytes[r * cols + c]);
                }
            }
            let saturate = signed
                && crate::fast::qgemm::Sums::like_onnxruntime()
                    == crate::fast::qgemm::Sums::PairsSaturated;
            let q = QMat {
                k,
                cols,
                sums: w.chunks(k).map(|r| r.iter().sum()).collect(),
                w,
                zero: zero.clone(),
                scale: (0..cols).map(|c| 0.01 * (c + 1) as f32).collect(),
                saturate,
                packed: vec![
                    crate::fast::qmatmul::PackedB::new(&bytes, signed, (k, cols), &zero)
                        .expect("packs"),
                ],
            };
            let sums = q.sums_of_rows(0, &x, 3).expect("packed");
            for row in 0..n {
                let mut want = vec![0.0f64; cols];
                q.product(0, &x[row * k..][..k], (0.5, 3), &mut want);
                for c in 0..cols {
                    let got = f64::from(q.scaled(0, c, sums[row * cols + c], 0.5));
                    assert_eq!(got, want[c], "signed {signed}, row {row}, column {c}");
                }
            }
        }
    }

    /// DynamicQuantizeLSTM's products: raw u8 · s8 pairs saturated to i16 where ONNX Runtime
    /// saturates them, then the zero-point terms, then the f32 scale.
    #[test]
    fn quantized_lstm_products_sum_like_onnxruntime() {
        let mat = |saturate| QMat {
            k: 3,
            cols: 1,
            w: vec![127, 127, -2],
            zero: vec![0],
            scale: vec![0.5],
            sums: vec![252],
            saturate,
            packed: Vec::new(),
        };
        let x = [255u8, 255, 10];
        let mut out = [0.0];
        // Exact: 255·127·2 - 2·10 = 64750; less zx · Σw = 1 · 252; times 0.25.
        mat(false).product(0, &x, (0.5, 1), &mut out);
        assert_eq!(out[0], f64::from((64750 - 252) as f32 * 0.25));
        // Saturated pairs: 32767 - 20.
        mat(true).product(0, &x, (0.5, 1), &mut out);
        assert_eq!(out[0], f64::from((32767 - 20 - 252) as f32 * 0.25));
        let (q, scale, zp) = quantize_u8(&[0.0, 1.0, -1.0]);
        // 1 / scale is 127.49999 in f32: the zero point is 127, as ONNX Runtime's f32 gives.
        assert_eq!((scale, zp), (2.0 / 255.0, 127));
        assert_eq!(q, [127, 254, 0]);
    }
    /// DynamicQuantizeLSTM gives ONNX Runtime 1.31.1's bits (its outputs below, from a CPU
    /// that sums exactly, with one intra-op thread): two batch rows whose hidden state is
    /// quantized together each step, peepholes, initial states, biases, int8 weights.
    #[test]
    fn quantized_lstm_gives_onnx_runtimes_bits() {
        const W: [i8; 48] = [
            44, 78, -122, 79, -8, 4, 33, -55, 122, -114, -57, -30, 18, -23, -94, -116, -127, -115,
            -90, 127, -79, 39, 64, -68, -56, -17, -60, 121, -82, 101, 76, 88, -98, -27, 33, -2, 42,
            45, 42, -112, 117, 14, 103, -58, -35, 97, -80, -111,
        ];
        const R: [i8; 64] = [
            -32, 46, -96, 94, -41, -70, 11, 101, 98, 95, -49, -123, 71, 53, 69, -127, -118, 1, -42,
            -16, 110, -76, 7, -45, -52, 78, -88, -47, -97, -89, -56, 51, 20, -13, -84, 76, 76, -67,
            -112, -46, -90, 76, 5, 2, -53, 2, 119, -67, 68, -124, -47, 110, 95, -106, 87, 88, -12,
            -34, 122, 115, 45, -26, -74, 111,
        ];
        const B: [u32; 32] = [
            0x3de607cb, 0xbf050cfb, 0x3ef7373e, 0x3eb29338, 0x3ebca04b, 0xbd942ce8, 0xbf0e649f,
            0x3e90529d, 0xbf492b91, 0x3ec4d5ea, 0x3e8aa2d6, 0xbe7ce700, 0x3f18d80d, 0xbf1ca8b1,
            0xbe605714, 0x3f188aca, 0xbe74c954, 0x3eda6045, 0x3e666fbc, 0x3f61cae1, 0x3f7bbd0d,
            0x3ee50b63, 0x3f1e20c7, 0xbf31bbad, 0x3ed9ffe8, 0x3f31fbd3, 0xbe4a4a28, 0x3dda1cb7,
            0xbd28094d, 0x3f6ac387, 0xbebb1b85, 0xbe4887e8,
        ];
        const P: [u32; 12] = [
            0xbeff8771, 0xbda3764a, 0x3e069730, 0x3edeb338, 0x3ed8ec23, 0xbe30cb36, 0x3efa4bfe,
            0xbe9fe912, 0x3ea5814a, 0xbeaf7baf, 0xbdc25ba3, 0xbeda61b5,
        ];
        const X: [u32; 42] = [
            0x40097ca9, 0x3ffc8455, 0xc00a5227, 0x3e268acd, 0xbfb9bf51, 0xbd4a1ed2, 0x3ea372e8,
            0xc0173204, 0x400beb93, 0xbfa9f613, 0xbea26fe9, 0xc02a0340, 0xc03ef223, 0xbfea1e14,
            0xbf732fda, 0x40246543, 0x4015a7da, 0xbdef9a7f, 0xbe8afa54, 0x3f80402b, 0x4009c30b,
            0xbf79e939, 0x3fe186d4, 0xbf1b27d4, 0x3f10777e, 0x3fb65fe9, 0x3c056b2b, 0x3f92840b,
            0x3f978969, 0xc03dce6b, 0xc030ffb4, 0xc006c4f0, 0xbfdbeda0, 0xbfe3ee62, 0xc02d327d,
            0xbfd92e80, 0x3f1b0e1f, 0x401440bc, 0xbf672983, 0xbf4d33c5, 0xbeffc4f7, 0x3f8a80a3,
        ];
        const H0: [u32; 8] = [
            0x3f120f6d, 0x3f61c542, 0xbe7e90fa, 0x3ed3bc9e, 0xbea22ab2, 0x3f25e390, 0xbf09e863,
            0x3f3df582,
        ];
        const C0: [u32; 8] = [
            0x3c2749f8, 0x3ee6c096, 0x3d8f54d6, 0xbebc4aaf, 0xbc3ab722, 0xbf662b5d, 0xbf69fce1,
            0x3d7575a6,
        ];
        const Y: [u32; 56] = [
            0xbb46ec4b, 0xb9f28852, 0x320f32b9, 0x3eff9add, 0x3f40b395, 0xbc0be958, 0xbf5da30b,
            0x3ce6e07a, 0x3f3da352, 0xbdf3304f, 0xbecb0934, 0xbafc930d, 0x3ba42ef9, 0xbcf785c6,
            0x3eca4a41, 0x3d9e2954, 0x3f300adb, 0xbc929d1d, 0x385a92e3, 0xb5efd246, 0x3cfddac2,
            0x3d6b4f74, 0x393c332e, 0xb8643b14, 0x3f04f470, 0xbf65ae3a, 0xbd42d0a5, 0xbb026207,
            0xb7967ba3, 0x3d4ebaa0, 0x3e303e45, 0x3d03c05b, 0x39e0e114, 0xbdf122f7, 0xbc15fcb9,
            0xbf25b17d, 0x3bf5c6b9, 0xbce97053, 0x36b6593b, 0x3f49179b, 0x3f289fc9, 0xbe55ea98,
            0x37196838, 0xbc85a8c1, 0x3f42f899, 0xb8e17276, 0xb9b46aea, 0x3e248b8e, 0x388c5a40,
            0xbea5edda, 0x390dfb96, 0x3ebef6c9, 0x3f40ebc6, 0xbdd5a494, 0xbe5d3f2c, 0xbf21d12e,
        ];
        const YH: [u32; 8] = [
            0x388c5a40, 0xbea5edda, 0x390dfb96, 0x3ebef6c9, 0x3f40ebc6, 0xbdd5a494, 0xbe5d3f2c,
            0xbf21d12e,
        ];
        const YC: [u32; 8] = [
            0x3e450efe, 0xbf054e72, 0x390fe346, 0x3f7ab7e6, 0x3f825e45, 0xbf916edf, 0xbeb6e590,
            0xbf506c71,
        ];
        let f = |bits: &[u32], shape: &[usize]| {
            t(shape, bits.iter().map(|&b| f32::from_bits(b)).collect())
        };
        let i8s = |v: &[i8], shape: &[usize]| Tensor::from_vec(shape, v.to_vec()).unwrap();
        let mut n = NodeDef::new("DynamicQuantizeLSTM", 1)
            .with_attr("hidden_size", AttrValue::Int(4))
            .with_io(12, 3);
        n.domain = crate::kernel::MS.into();
        let inputs = vec![
            Some(f(&X, &[7, 2, 3])),
            Some(i8s(&W, &[1, 3, 16])),
            Some(i8s(&R, &[1, 4, 16])),
            Some(f(&B, &[1, 32])),
            None,
            Some(f(&H0, &[1, 2, 4])),
            Some(f(&C0, &[1, 2, 4])),
            Some(f(&P, &[1, 12])),
            Some(f(&[0x3cfd_f3b6], &[1])),
            Some(i8s(&[0], &[1])),
            Some(f(&[0x3d40_8312], &[1])),
            Some(i8s(&[0], &[1])),
        ];
        // Weights converted at each run, and once at `prepare` (constants W, R, scales and zero
        // points), give the same bits.
        let (out, prepared) =
            crate::fast::qgemm::with_sums(crate::fast::qgemm::Sums::Exact, || {
                let k = crate::ops::registry().build(&n).unwrap();
                let refs: Vec<Option<TensorRef<'_>>> = inputs
                    .iter()
                    .map(|t| t.as_ref().map(Tensor::view))
                    .collect();
                let fixed: Vec<Option<TensorRef<'_>>> = refs
                    .iter()
                    .enumerate()
                    .map(|(i, t)| t.clone().filter(|_| matches!(i, 1 | 2 | 8..=11)))
                    .collect();
                let unprepared = run(n.clone(), inputs.clone()).unwrap();
                k.prepare(&fixed);
                (unprepared, k.run(&refs).unwrap())
            });
        for (i, (got, want, name)) in [
            (&out[0], &Y[..], "Y"),
            (&out[1], &YH[..], "Y_h"),
            (&out[2], &YC[..], "Y_c"),
        ]
        .into_iter()
        .enumerate()
        {
            let bits: Vec<u32> = vals(got).iter().map(|v| v.to_bits()).collect();
            assert_eq!(bits, want, "{name}");
            let bits: Vec<u32> = vals(&prepared[i]).iter().map(|v| v.to_bits()).collect();
            assert_eq!(bits, want, "{name}, weights prepared once");
        }
    }

    use crate::kernel::AttrValue;

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    fn vals(t: &Tensor) -> Vec<f32> {
        t.as_array::<f32>().unwrap().iter().copied().collect()
    }

    /// Values in [-0.5, 0.5) from a linear congruential sequence seeded with `seed`, `n` a call.
    fn uniform(mut seed: u32) -> impl FnMut(usize) -> Vec<f32> {
        move |n| {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        }
    }

    /// The float32 GRU (both placements of the reset gate, each direction, with and without
    /// bias and initial state) gives the f64 reference's values within float32 rounding.
    #[test]
    fn fast_gru_matches_the_reference() {
        // One batch row (the update over slices) and several.
        for batch in [1usize, 3] {
            let (seq, input, h) = (4, 5, 6);
            let mut rnd = uniform(7);
            let reference = crate::fast::ISAS
                .iter()
                .find(|i| !i.fast)
                .expect("a reference level");
            for (direction, dirs) in [("forward", 1), ("reverse", 1), ("bidirectional", 2)] {
                for (full, lbr) in [(false, 0), (true, 0), (true, 1), (false, 1)] {
                    let n = NodeDef::new("GRU", 14)
                        .with_attr("hidden_size", AttrValue::Int(h as i64))
                        .with_attr("direction", AttrValue::String(direction.into()))
                        .with_attr("linear_before_reset", AttrValue::Int(lbr))
                        .with_io(6, 2);
                    let mut ins = vec![
                        Some(t(&[seq, batch, input], rnd(seq * batch * input))),
                        Some(t(&[dirs, 3 * h, input], rnd(dirs * 3 * h * input))),
                        Some(t(&[dirs, 3 * h, h], rnd(dirs * 3 * h * h))),
                    ];
                    if full {
                        ins.push(Some(t(&[dirs, 6 * h], rnd(dirs * 6 * h))));
                        ins.push(None);
                        ins.push(Some(t(&[dirs, batch, h], rnd(dirs * batch * h))));
                    }
                    let want = crate::fast::with_isa(reference, || run(n.clone(), ins.clone()))
                        .expect("the reference level runs")
                        .unwrap();
                    let cell = build_rnn(&n, Cell::Gru).unwrap();
                    let refs: Vec<Option<TensorRef<'_>>> =
                        ins.iter().map(|t| t.as_ref().map(Tensor::view)).collect();
                    for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
                        let Some(got) = crate::fast::with_isa(isa, || cell.fast_lstm(&refs, 2))
                        else {
                            continue;
                        };
                        let case = format!(
                            "batch {batch}, {direction}, full {full}, lbr {lbr}, {}",
                            isa.name
                        );
                        let got = got
                            .unwrap_or_else(|| panic!("{case}: the fast GRU declined"))
                            .unwrap();
                        assert_eq!(got.len(), 2, "{case}");
                        for (g, w) in got.iter().zip(&want) {
                            assert_eq!(g.shape(), w.shape(), "{case}");
                            for (a, b) in vals(g).iter().zip(vals(w)) {
                                assert!((a - b).abs() < 1e-5, "{case}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The float32 LSTM against the f64 reference (forced with the reference level), on each
    /// fast level: forward, reverse and bidirectional, with and without biases, peepholes and
    /// initial states, batch 2, three steps.
    #[test]
    fn fast_lstm_matches_the_reference() {
        // One batch row (the update over slices) and several.
        for batch in [1usize, 2] {
            let (seq, input, h) = (3, 5, 4);
            let mut rnd = uniform(1);
            let reference = crate::fast::ISAS
                .iter()
                .find(|i| !i.fast)
                .expect("a reference level");
            for (direction, dirs) in [("forward", 1), ("reverse", 1), ("bidirectional", 2)] {
                for full in [false, true] {
                    let n = NodeDef::new("LSTM", 14)
                        .with_attr("hidden_size", AttrValue::Int(h as i64))
                        .with_attr("direction", AttrValue::String(direction.into()))
                        .with_io(8, 3);
                    let mut ins = vec![
                        Some(t(&[seq, batch, input], rnd(seq * batch * input))),
                        Some(t(&[dirs, 4 * h, input], rnd(dirs * 4 * h * input))),
                        Some(t(&[dirs, 4 * h, h], rnd(dirs * 4 * h * h))),
                    ];
                    if full {
                        ins.push(Some(t(&[dirs, 8 * h], rnd(dirs * 8 * h))));
                        ins.push(None);
                        ins.push(Some(t(&[dirs, batch, h], rnd(dirs * batch * h))));
                        ins.push(Some(t(&[dirs, batch, h], rnd(dirs * batch * h))));
                        ins.push(Some(t(&[dirs, 3 * h], rnd(dirs * 3 * h))));
                    }
                    let want = crate::fast::with_isa(reference, || run(n.clone(), ins.clone()))
                        .expect("the reference level runs")
                        .unwrap();
                    let cell = build_rnn(&n, Cell::Lstm).unwrap();
                    let refs: Vec<Option<TensorRef<'_>>> =
                        ins.iter().map(|t| t.as_ref().map(Tensor::view)).collect();
                    for isa in crate::fast::ISAS.iter().filter(|i| i.fast) {
                        let Some(got) = crate::fast::with_isa(isa, || cell.fast_lstm(&refs, 3))
                        else {
                            eprintln!(
                                "fast LSTM, {direction}: level {} skipped (not this CPU)",
                                isa.name
                            );
                            continue;
                        };
                        eprintln!(
                            "fast LSTM, {direction}, full {full}: checked at level {}",
                            isa.name
                        );
                        let got = got
                            .unwrap_or_else(|| panic!("{direction}: the fast LSTM declined"))
                            .unwrap();
                        for (g, w) in got.iter().zip(&want) {
                            assert_eq!(g.shape(), w.shape());
                            for (a, b) in vals(g).iter().zip(vals(w)) {
                                assert!(
                                    (a - b).abs() < 2e-6,
                                    "batch {batch}, {direction}, full {full}, {}: {a} vs {b}",
                                    isa.name
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rnn_gru_lstm_scalar() {
        // One hidden unit, one input: h1 = tanh(x), h2 = tanh(x + h1) with W = R = 1.
        let x = t(&[2, 1, 1], vec![0.5, 0.25]);
        let one = t(&[1, 1, 1], vec![1.0]);
        let n = NodeDef::new("RNN", 14)
            .with_attr("hidden_size", AttrValue::Int(1))
            .with_io(3, 2);
        let o = run(
            n.clone(),
            vec![Some(x.clone()), Some(one.clone()), Some(one.clone())],
        )
        .unwrap();
        let h1 = 0.5f32.tanh();
        let h2 = (0.25 + h1).tanh();
        let y = vals(&o[0]);
        assert!(
            (y[0] - h1).abs() < 1e-6 && (y[1] - h2).abs() < 1e-6,
            "{y:?}"
        );
        assert_eq!(o[1].shape(), &[1, 1, 1]);
        // sequence_lens 1: the second step is skipped (zero output), Y_h is h1.
        let o = run(
            n.clone(),
            vec![
                Some(x.clone()),
                Some(one.clone()),
                Some(one.clone()),
                None,
                Some(Tensor::from_vec(&[1], vec![1i32]).unwrap()),
            ],
        )
        .unwrap();
        assert_eq!(vals(&o[0])[1], 0.0);
        assert!((vals(&o[1])[0] - h1).abs() < 1e-6);
        let e = run(
            n.clone(),
            vec![
                Some(x.clone()),
                Some(t(&[1, 2, 1], vec![1.0; 2])),
                Some(one.clone()),
            ],
        )
        .unwrap_err();
        assert_eq!(e.0, "RNN: W must have shape [1, 1, 1], got [1, 2, 1]");
        let e = run(
            n,
            vec![
                Some(x.clone()),
                Some(one.clone()),
                Some(one.clone()),
                None,
                Some(Tensor::from_vec(&[1], vec![5i32]).unwrap()),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("sequence length 5 is outside 0..=2"), "{e}");

        // GRU with zero weights: z = r = 0.5, h~ = 0, so h = 0.5 * h_prev.
        let z3 = t(&[1, 3, 1], vec![0.0; 3]);
        let g = NodeDef::new("GRU", 14)
            .with_attr("hidden_size", AttrValue::Int(1))
            .with_io(6, 2);
        let h0 = t(&[1, 1, 1], vec![1.0]);
        let o = run(
            g,
            vec![
                Some(x.clone()),
                Some(z3.clone()),
                Some(z3),
                None,
                None,
                Some(h0.clone()),
            ],
        )
        .unwrap();
        assert_eq!(vals(&o[1]), vec![0.25]);

        // LSTM with zero weights: i = f = o = 0.5, c~ = 0: c = 0.5 c_prev, h = 0.5 tanh(c).
        let z4 = t(&[1, 4, 1], vec![0.0; 4]);
        let l = NodeDef::new("LSTM", 14)
            .with_attr("hidden_size", AttrValue::Int(1))
            .with_io(7, 3);
        let o = run(
            l.clone(),
            vec![
                Some(x.clone()),
                Some(z4.clone()),
                Some(z4.clone()),
                None,
                None,
                Some(h0.clone()),
                Some(h0.clone()),
            ],
        )
        .unwrap();
        assert_eq!(vals(&o[2]), vec![0.25]);
        assert!((vals(&o[1])[0] - 0.5 * 0.25f32.tanh()).abs() < 1e-6);
        let bad = l.with_attr("activations", AttrValue::Strings(vec![b"Tanh".to_vec()]));
        let e = crate::ops::registry().build(&bad).err().unwrap();
        assert!(e.0.contains("must list 3 functions"), "{e}");
    }
}
