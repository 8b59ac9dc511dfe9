//! Signal processing: DFT (forward / inverse, one-sided, dft_length, axis as attribute or input),
//! STFT, and the HannWindow / HammingWindow / BlackmanWindow generators.
//!
//! Transforms are direct O(n^2) sums in f64, cast back to the input's float type.

use epx_plugin_api::ElementType;

use crate::ops::util::num::{float_values, is_float_type, tensor_from_f64};

use crate::bail;
use crate::error::OpResult;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::limits::checked_len;
use crate::ops::util::args::{input, opt_input, scalar_f64, scalar_i64};
use crate::tensor::TensorRef;

pub fn register(reg: &mut Registry) {
    add(reg, "DFT", 17, build_dft);
    add(reg, "STFT", 17, build_stft);
    add(reg, "HannWindow", 17, |n| build_window(n, Window::Hann));
    add(reg, "HammingWindow", 17, |n| {
        build_window(n, Window::Hamming)
    });
    add(reg, "BlackmanWindow", 17, |n| {
        build_window(n, Window::Blackman)
    });
    add(reg, "MelWeightMatrix", 17, build_mel_weight_matrix);
}

/// Triangular filters evenly spaced on the mel scale (`mel = 2595 log10(1 + f / 700)`), as
/// ONNX defines them: `num_mel_bins + 2` edges from the lower to the upper frequency, each
/// mapped to the spectrogram bin `floor((dft_length + 1) * f / sample_rate)`; output
/// `[dft_length / 2 + 1, num_mel_bins]`.
fn build_mel_weight_matrix(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    const OP: &str = "MelWeightMatrix";
    let code = n.attr_int_or("output_datatype", 1)?;
    let ty = i32::try_from(code)
        .ok()
        .and_then(ElementType::from_onnx)
        .filter(|t| *t != ElementType::Undefined && *t != ElementType::String)
        .ok_or_else(|| n.error(format_args!("unsupported output_datatype {code}")))?;
    Ok(kernel(move |inputs: &[Option<TensorRef<'_>>]| {
        let count = |i: usize, what: &str| -> OpResult<usize> {
            let v = scalar_i64(OP, what, input(OP, inputs, i)?)?;
            usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
                crate::error::OpError(format!("{OP}: {what} must be positive, got {v}"))
            })
        };
        let mels = count(0, "num_mel_bins")?;
        let dft = count(1, "dft_length")?;
        let rate = count(2, "sample_rate")? as f64;
        let lo = scalar_f64(OP, "lower_edge_hertz", input(OP, inputs, 3)?)?;
        let hi = scalar_f64(OP, "upper_edge_hertz", input(OP, inputs, 4)?)?;
        if !(0.0..=hi).contains(&lo) || hi > rate / 2.0 + f64::EPSILON * rate {
            bail!(
                "{OP}: need 0 <= lower_edge_hertz ({lo}) <= upper_edge_hertz ({hi}) <= sample_rate / 2 ({})",
                rate / 2.0
            );
        }
        let bins = dft / 2 + 1;
        let mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
        let (mlo, mhi) = (mel(lo), mel(hi));
        let step = (mhi - mlo) / (mels + 2) as f64;
        checked_len(&[mels.saturating_add(2)], 8)?;
        let edges: Vec<usize> = (0..mels + 2)
            .map(|i| {
                let hz = 700.0 * (10f64.powf((i as f64 * step + mlo) / 2595.0) - 1.0);
                (((dft + 1) as f64 * hz) / rate).floor().max(0.0) as usize
            })
            .collect();
        if edges.iter().any(|&e| e >= bins) {
            bail!("{OP}: a filter edge falls past the {bins} spectrogram bins");
        }
        let mut out = crate::limits::zeros_checked::<f64>(
            bins.checked_mul(mels)
                .ok_or_else(|| crate::error::OpError(format!("{OP}: too large")))?,
            OP,
        )?;
        for m in 0..mels {
            let (left, center, right) = (edges[m], edges[m + 1], edges[m + 2]);
            if center == left {
                out[center * mels + m] = 1.0;
            } else {
                for j in left..=center {
                    out[j * mels + m] = (j - left) as f64 / (center - left) as f64;
                }
            }
            for j in center..right {
                out[j * mels + m] = (right - j) as f64 / (right - center) as f64;
            }
        }
        one(tensor_from_f64(ty, &[bins, mels], out))
    }))
}

/// The DFT of `x` (complex, as (re, im) pairs) with `n` output bins (`x` is zero-padded or
/// truncated to `n`); `sign` is -1 forward, +1 inverse (unnormalized).
fn dft(x: &[(f64, f64)], n: usize, bins: usize, sign: f64) -> Vec<(f64, f64)> {
    if n >= 2 && n.is_power_of_two() && x.len() == n {
        let mut out = fft_pow2(x, sign);
        out.truncate(bins);
        return out;
    }
    let tau = std::f64::consts::TAU;
    (0..bins)
        .map(|k| {
            let mut acc = (0.0, 0.0);
            for (j, &(re, im)) in x.iter().take(n).enumerate() {
                // Reduce k*j mod n first for accuracy.
                let ph = sign * tau * ((k * j) % n.max(1)) as f64 / n as f64;
                let (s, c) = ph.sin_cos();
                acc.0 += re * c - im * s;
                acc.1 += re * s + im * c;
            }
            acc
        })
        .collect()
}

/// The DFT of a power-of-two length in O(n log n) (iterative radix-2 Cooley-Tukey), as ONNX
/// Runtime computes those lengths; the direct sum is O(n²), which a 65536-point transform turns
/// into hours.
fn fft_pow2(x: &[(f64, f64)], sign: f64) -> Vec<(f64, f64)> {
    let n = x.len();
    let bits = n.trailing_zeros();
    let mut a = x.to_vec();
    for i in 0..n {
        let j = i.reverse_bits() >> (usize::BITS - bits);
        if j > i {
            a.swap(i, j);
        }
    }
    // Twiddles from their own angles (not by repeated multiplication), for accuracy.
    let twiddles: Vec<(f64, f64)> = (0..n / 2)
        .map(|k| {
            let (s, c) = (sign * std::f64::consts::TAU * k as f64 / n as f64).sin_cos();
            (c, s)
        })
        .collect();
    let mut len = 2;
    while len <= n {
        let (half, step) = (len / 2, n / len);
        for start in (0..n).step_by(len) {
            for k in 0..half {
                let (wr, wi) = twiddles[k * step];
                let (ur, ui) = a[start + k];
                let (xr, xi) = a[start + k + half];
                let (vr, vi) = (xr * wr - xi * wi, xr * wi + xi * wr);
                a[start + k] = (ur + vr, ui + vi);
                a[start + k + half] = (ur - vr, ui - vi);
            }
        }
        len *= 2;
    }
    a
}

fn build_dft(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let opset = n.opset;
    let axis_attr = n.attr_int_or("axis", 1)?;
    let inverse = n.attr_int_or("inverse", 0)? != 0;
    let onesided = n.attr_int_or("onesided", 0)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape().to_vec();
        let r = xs.len();
        if r < 2 || !matches!(xs.last(), Some(1 | 2)) {
            bail!("{op}: input must have rank >= 2 and a last dim of 1 or 2, got shape {xs:?}");
        }
        let axis = if opset >= 20 {
            match opt_input(inputs, 2) {
                Some(a) => scalar_i64(&op, "axis", a)?,
                None => -2,
            }
        } else {
            axis_attr
        };
        let ri = r as i64;
        if axis < -ri || axis >= ri - 1 || (axis < 0 && axis + ri == ri - 1) {
            bail!("{op}: axis {axis} is out of range for input shape {xs:?}");
        }
        let ax = axis.rem_euclid(ri) as usize;
        let m = xs[ax];
        let len = match opt_input(inputs, 1) {
            Some(l) => {
                let l = scalar_i64(&op, "dft_length", l)?;
                usize::try_from(l).ok().filter(|&l| l > 0).ok_or_else(|| {
                    crate::error::OpError(format!("{op}: dft_length must be positive, got {l}"))
                })?
            }
            None if inverse && onesided => 2 * m.saturating_sub(1),
            None => m,
        };
        if len == 0 {
            bail!("{op}: empty transform along axis {ax}");
        }
        let complex_in = xs[r - 1] == 2;
        let xv = float_values(&op, "input", x)?;
        let outer: usize = xs[..ax].iter().product();
        let inner: usize = xs[ax + 1..r - 1].iter().product();
        let get = |o: usize, j: usize, i: usize| -> (f64, f64) {
            let base = ((o * m + j) * inner + i) * xs[r - 1];
            let re = xv.get(base).copied().unwrap_or(0.0);
            let im = if complex_in {
                xv.get(base + 1).copied().unwrap_or(0.0)
            } else {
                0.0
            };
            (re, im)
        };
        let (bins, out_last) = match (inverse, onesided) {
            (false, true) => (len / 2 + 1, 2),
            (true, true) => (len, 1),
            _ => (len, 2),
        };
        let mut out = vec![0.0f64; checked_len(&[outer, bins, inner, out_last], 8)?];
        let mut sig = vec![(0.0, 0.0); checked_len(&[len], 16)?];
        for o in 0..outer {
            for i in 0..inner {
                for (j, s) in sig.iter_mut().enumerate() {
                    *s = if inverse && onesided {
                        // Rebuild the Hermitian spectrum from the first len/2+1 bins.
                        let h = len / 2;
                        let (k, conj) = if j <= h { (j, false) } else { (len - j, true) };
                        let mut v = if k < m { get(o, k, i) } else { (0.0, 0.0) };
                        if k == 0 || (len % 2 == 0 && k == h) {
                            v.1 = 0.0;
                        }
                        if conj {
                            v.1 = -v.1;
                        }
                        v
                    } else if j < m {
                        get(o, j, i)
                    } else {
                        (0.0, 0.0)
                    };
                }
                let res = dft(&sig, len, bins, if inverse { 1.0 } else { -1.0 });
                for (k, (re, im)) in res.into_iter().enumerate() {
                    let base = ((o * bins + k) * inner + i) * out_last;
                    let scale = if inverse { 1.0 / len as f64 } else { 1.0 };
                    if let Some(slot) = out.get_mut(base) {
                        *slot = re * scale;
                    }
                    if out_last == 2
                        && let Some(slot) = out.get_mut(base + 1)
                    {
                        *slot = im * scale;
                    }
                }
            }
        }
        let mut shape = xs.clone();
        shape[ax] = bins;
        shape[r - 1] = out_last;
        one(tensor_from_f64(x.elem_type(), &shape, out))
    }))
}

fn build_stft(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let onesided = n.attr_int_or("onesided", 1)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let xs = x.shape().to_vec();
        // A 2-D signal is real, as ONNX Runtime takes it (its STFT kernel, `dft.cc`): the
        // specification's `[batch, length, 1]` without the last axis.
        let (b, len, c) = match *xs.as_slice() {
            [b, len] => (b, len, 1),
            [b, len, c @ (1 | 2)] => (b, len, c),
            _ => bail!(
                "{op}: signal must have shape [batch, length] or [batch, length, 1] (real), or \
                 [batch, length, 2] (complex), got {xs:?}"
            ),
        };
        let step = scalar_i64(&op, "frame_step", input(&op, inputs, 1)?)?;
        let window = match opt_input(inputs, 2) {
            Some(w) => {
                if w.ndim() != 1 {
                    bail!("{op}: window must be 1-D, got shape {:?}", w.shape());
                }
                Some(float_values(&op, "window", w)?)
            }
            None => None,
        };
        let flen = match opt_input(inputs, 3) {
            Some(l) => Some(scalar_i64(&op, "frame_length", l)?),
            None => None,
        };
        let flen = match (flen, &window) {
            (Some(l), Some(w)) if l != w.len() as i64 => {
                bail!(
                    "{op}: frame_length {l} differs from the window length {}",
                    w.len()
                )
            }
            (Some(l), _) => l,
            (None, Some(w)) => w.len() as i64,
            (None, None) => bail!("{op}: needs a window or a frame_length"),
        };
        if step <= 0 || flen <= 0 || flen as usize > len {
            bail!(
                "{op}: frame_step {step} and frame_length {flen} must be positive with frame_length <= {len}"
            );
        }
        let (step, flen) = (step as usize, flen as usize);
        let frames = 1 + (len - flen) / step;
        let bins = if onesided { flen / 2 + 1 } else { flen };
        let xv = float_values(&op, "signal", x)?;
        let mut out = Vec::with_capacity(checked_len(&[b, frames, bins, 2], 8)?);
        for bi in 0..b {
            for f in 0..frames {
                let sig: Vec<(f64, f64)> = (0..flen)
                    .map(|j| {
                        let base = (bi * len + f * step + j) * c;
                        let w = window
                            .as_ref()
                            .map_or(1.0, |w| w.get(j).copied().unwrap_or(0.0));
                        let re = xv.get(base).copied().unwrap_or(0.0);
                        let im = if c == 2 {
                            xv.get(base + 1).copied().unwrap_or(0.0)
                        } else {
                            0.0
                        };
                        (re * w, im * w)
                    })
                    .collect();
                for (re, im) in dft(&sig, flen, bins, -1.0) {
                    out.push(re);
                    out.push(im);
                }
            }
        }
        one(tensor_from_f64(x.elem_type(), &[b, frames, bins, 2], out))
    }))
}

#[derive(Debug, Clone, Copy)]
enum Window {
    Hann,
    Hamming,
    Blackman,
}

fn build_window(n: &NodeDef, kind: Window) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let periodic = n.attr_int_or("periodic", 1)? != 0;
    let code = n.attr_int_or("output_datatype", 1)?;
    let ty = ElementType::from_onnx(code as i32)
        .filter(|t| {
            is_float_type(*t)
                || matches!(
                    t,
                    ElementType::Int8
                        | ElementType::Int16
                        | ElementType::Int32
                        | ElementType::Int64
                        | ElementType::Uint8
                        | ElementType::Uint16
                        | ElementType::Uint32
                        | ElementType::Uint64
                )
        })
        .ok_or_else(|| n.error(format_args!("unsupported output_datatype {code}")))?;
    Ok(kernel(move |inputs: &[Option<TensorRef<'_>>]| {
        let size = scalar_i64(&op, "size", input(&op, inputs, 0)?)?;
        let size = usize::try_from(size)
            .map_err(|_| crate::error::OpError(format!("{op}: size must be >= 0, got {size}")))?;
        checked_len(&[size], 8)?;
        let denom = if periodic {
            size
        } else {
            size.saturating_sub(1)
        } as f64;
        let tau = std::f64::consts::TAU;
        let v: Vec<f64> = (0..size)
            .map(|i| {
                let x = if denom == 0.0 {
                    0.0
                } else {
                    tau * i as f64 / denom
                };
                match kind {
                    Window::Hann => 0.5 - 0.5 * x.cos(),
                    Window::Hamming => 25.0 / 46.0 - (21.0 / 46.0) * x.cos(),
                    Window::Blackman => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
                }
            })
            .collect();
        one(tensor_from_f64(ty, &[size], v))
    }))
}

#[cfg(test)]
mod fft_tests {
    use super::*;

    /// The radix-2 path agrees with the direct sum, forward and inverse, on every power of two
    /// up to 1024.
    #[test]
    fn fft_matches_the_direct_sum() {
        let direct = |x: &[(f64, f64)], sign: f64| -> Vec<(f64, f64)> {
            let n = x.len();
            (0..n)
                .map(|k| {
                    x.iter()
                        .enumerate()
                        .fold((0.0, 0.0), |acc, (j, &(re, im))| {
                            let ph = sign * std::f64::consts::TAU * ((k * j) % n) as f64 / n as f64;
                            let (s, c) = ph.sin_cos();
                            (acc.0 + re * c - im * s, acc.1 + re * s + im * c)
                        })
                })
                .collect()
        };
        for bits in 1..=10 {
            let n = 1usize << bits;
            let x: Vec<(f64, f64)> = (0..n)
                .map(|i| {
                    (
                        ((i * 7919) % 101) as f64 - 50.0,
                        ((i * 104_729) % 37) as f64 - 18.0,
                    )
                })
                .collect();
            for sign in [-1.0, 1.0] {
                let (fast, slow) = (fft_pow2(&x, sign), direct(&x, sign));
                for (k, (a, b)) in fast.iter().zip(&slow).enumerate() {
                    let tol = 1e-9 * (1.0 + b.0.abs().max(b.1.abs()));
                    assert!(
                        (a.0 - b.0).abs() <= tol && (a.1 - b.1).abs() <= tol,
                        "n {n}, sign {sign}, bin {k}: {a:?} vs {b:?}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::AttrValue;
    use crate::tensor::Tensor;

    fn run(n: NodeDef, inputs: Vec<Option<Tensor>>) -> OpResult<Vec<Tensor>> {
        let k = crate::ops::registry().build(&n)?;
        let refs: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::view))
            .collect();
        k.run(&refs)
    }

    fn close(t: &Tensor, want: &[f32]) {
        let a = t.as_array::<f32>().unwrap();
        assert_eq!(a.len(), want.len(), "{a:?} vs {want:?}");
        for (x, y) in a.iter().zip(want) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {want:?}");
        }
    }

    #[test]
    fn dft_round_trip_and_errors() {
        let x = Tensor::from_vec(&[1, 4, 1], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let n = NodeDef::new("DFT", 20);
        let o = run(n.clone(), vec![Some(x.clone())]).unwrap();
        close(&o[0], &[10.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0]);
        let inv = NodeDef::new("DFT", 20).with_attr("inverse", AttrValue::Int(1));
        let back = run(inv, vec![Some(o[0].clone())]).unwrap();
        close(&back[0], &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0]);
        let rf = n.clone().with_attr("onesided", AttrValue::Int(1));
        let o = run(rf, vec![Some(x.clone())]).unwrap();
        assert_eq!(o[0].shape(), &[1, 3, 2]);
        let irf = NodeDef::new("DFT", 20)
            .with_attr("inverse", AttrValue::Int(1))
            .with_attr("onesided", AttrValue::Int(1));
        let back = run(irf, vec![Some(o[0].clone())]).unwrap();
        close(&back[0], &[1.0, 2.0, 3.0, 4.0]);
        let e = run(
            n.clone(),
            vec![Some(Tensor::from_vec(&[4], vec![0.0f32; 4]).unwrap())],
        )
        .unwrap_err();
        assert!(e.0.contains("rank >= 2"), "{e}");
        let e = run(n, vec![Some(x), None, Some(Tensor::scalar(2i64))]).unwrap_err();
        assert!(e.0.contains("axis 2 is out of range"), "{e}");
    }

    #[test]
    fn stft_and_windows() {
        let x = Tensor::from_vec(&[1, 4, 1], vec![1.0f32, 1.0, 1.0, 1.0]).unwrap();
        let o = run(
            NodeDef::new("STFT", 17),
            vec![
                Some(x.clone()),
                Some(Tensor::scalar(2i64)),
                None,
                Some(Tensor::scalar(2i64)),
            ],
        )
        .unwrap();
        assert_eq!(o[0].shape(), &[1, 2, 2, 2]);
        close(&o[0], &[2.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]);
        // A 2-D signal is the same real signal; a 1-D or 4-D one is refused, as ONNX Runtime does.
        let stft = |x: Tensor| {
            run(
                NodeDef::new("STFT", 17),
                vec![
                    Some(x),
                    Some(Tensor::scalar(2i64)),
                    None,
                    Some(Tensor::scalar(2i64)),
                ],
            )
        };
        let x2 = Tensor::from_vec(&[1, 4], vec![1.0f32, 1.0, 1.0, 1.0]).unwrap();
        let o2 = stft(x2).unwrap();
        assert_eq!(o2[0].shape(), o[0].shape());
        close(&o2[0], &[2.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]);
        for shape in [&[4][..], &[1, 4, 1, 1], &[1, 4, 3]] {
            let n: usize = shape.iter().product();
            let bad = Tensor::from_vec(shape, vec![1.0f32; n]).unwrap();
            let e = stft(bad).unwrap_err();
            assert!(e.0.contains("signal must have shape"), "{e}");
        }
        let e = run(
            NodeDef::new("STFT", 17),
            vec![
                Some(x),
                Some(Tensor::scalar(2i64)),
                None,
                Some(Tensor::scalar(9i64)),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("frame_length <= 4"), "{e}");
        let o = run(
            NodeDef::new("HannWindow", 17),
            vec![Some(Tensor::scalar(4i32))],
        )
        .unwrap();
        close(&o[0], &[0.0, 0.5, 1.0, 0.5]);
        let o = run(
            NodeDef::new("HammingWindow", 17).with_attr("periodic", AttrValue::Int(0)),
            vec![Some(Tensor::scalar(3i64))],
        )
        .unwrap();
        close(&o[0], &[4.0 / 46.0, 1.0, 4.0 / 46.0]);
        let o = run(
            NodeDef::new("BlackmanWindow", 17),
            vec![Some(Tensor::scalar(2i64))],
        )
        .unwrap();
        close(&o[0], &[0.0, 1.0]);
    }
}
