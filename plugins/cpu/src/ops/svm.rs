//! Support vector machines: SVMClassifier and SVMRegressor (ai.onnx.ml 1), in libsvm's form:
//! one-vs-one decision values and votes, Platt-scaled pairwise probabilities coupled into class
//! probabilities, or a linear model when there are no support vectors. Computed in f32 like
//! ONNX Runtime, decision values summed in f64.

use crate::bail;
use crate::error::OpResult;
use crate::kernel::add_ml;
use crate::kernel::one;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::ops::ml::{PostTransform, class_labels, features, floats_attr, logistic, rows_cols};
use crate::ops::util::args::input;
use crate::tensor::Tensor;

pub fn register(reg: &mut Registry) {
    add_ml(reg, "SVMClassifier", 1, build_classifier);
    add_ml(reg, "SVMRegressor", 1, build_regressor);
}

#[derive(Clone, Copy, Debug)]
enum Kernel {
    Linear,
    Poly { gamma: f32, coef0: f32, degree: f32 },
    Rbf { gamma: f32 },
    Sigmoid { gamma: f32, coef0: f32 },
}

impl Kernel {
    fn parse(n: &NodeDef) -> OpResult<Self> {
        let p = floats_attr(n, "kernel_params")?;
        let (gamma, coef0, degree) = match p.as_slice() {
            [] => (0.0, 0.0, 0.0),
            [g, c, d, ..] => (*g, *c, *d),
            _ => return Err(n.error("kernel_params must hold gamma, coef0 and degree")),
        };
        Ok(match n.attr_string_or("kernel_type", "LINEAR")?.as_str() {
            "LINEAR" => Kernel::Linear,
            "POLY" => Kernel::Poly {
                gamma,
                coef0,
                degree,
            },
            "RBF" => Kernel::Rbf { gamma },
            "SIGMOID" => Kernel::Sigmoid { gamma, coef0 },
            other => {
                return Err(n.error(format_args!(
                    "kernel_type `{other}` is not one of LINEAR, POLY, RBF, SIGMOID"
                )));
            }
        })
    }

    fn eval(self, a: &[f32], b: &[f32]) -> f32 {
        let dot = || a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        match self {
            Kernel::Linear => dot(),
            Kernel::Poly {
                gamma,
                coef0,
                degree,
            } => {
                let v = gamma * dot() + coef0;
                if degree == 2.0 {
                    v * v
                } else if degree == 3.0 {
                    v * v * v
                } else {
                    v.powf(degree)
                }
            }
            Kernel::Rbf { gamma } => {
                let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
                (-gamma * d).exp()
            }
            Kernel::Sigmoid { gamma, coef0 } => (gamma * dot() + coef0).tanh(),
        }
    }
}

/// Support vectors (`[count, features]`), or none for the linear form.
struct Vectors {
    data: Vec<f32>,
    /// The same values transposed, `[features, count]`, for [`Kernel::eval_all`].
    by_feature: Vec<f32>,
    count: usize,
    features: usize,
}

impl Kernel {
    /// The kernel of row `x` with every support vector, into `ker` (`sv.count` values): RBF's
    /// distances are summed feature by feature across all vectors at once, in the order
    /// [`Kernel::eval`] sums them (so the same distances), then raised through the vectorized
    /// exp; the other kernels vector by vector.
    fn eval_all(self, x: &[f32], sv: &Vectors, ker: &mut [f32]) {
        match self {
            Kernel::Rbf { gamma } => rbf_row(x, &sv.by_feature, gamma, ker),
            _ => {
                for (v, kv) in ker.iter_mut().enumerate() {
                    *kv = self.eval(x, &sv.data[v * sv.features..(v + 1) * sv.features]);
                }
            }
        }
    }
}

crate::multiversion! {
/// `ker[v] = exp(-gamma · Σ_f (x[f] - svt[f][v])²)`, `svt` holding `ker.len()` values a feature.
fn rbf_row(x: &[f32], svt: &[f32], gamma: f32, ker: &mut [f32]) {
    let count = ker.len();
    ker.fill(0.0);
    for (&xf, col) in x.iter().zip(svt.chunks_exact(count.max(1))) {
        for (k, &s) in ker.iter_mut().zip(col) {
            *k += (xf - s) * (xf - s);
        }
    }
    for k in ker.iter_mut() {
        *k = crate::fast::math::exp_f32(-gamma * *k);
    }
}
}

fn vectors(n: &NodeDef, count: usize) -> OpResult<Vectors> {
    let data = floats_attr(n, "support_vectors")?;
    if count == 0 {
        return Ok(Vectors {
            data,
            by_feature: Vec::new(),
            count,
            features: 0,
        });
    }
    if data.len() % count != 0 {
        return Err(n.error(format_args!(
            "{} support vector values do not split into {count} vectors",
            data.len()
        )));
    }
    let features = data.len() / count;
    let by_feature = (0..features * count)
        .map(|i| data[(i % count) * features + i / count])
        .collect();
    Ok(Vectors {
        features,
        by_feature,
        data,
        count,
    })
}

/// libsvm's pairwise coupling: class probabilities from the pairwise ones `r[i][j]`.
fn couple(k: usize, r: &[f32]) -> Vec<f32> {
    let mut q = vec![0f32; k * k];
    let mut p = vec![1.0 / k as f32; k];
    for i in 0..k {
        for j in 0..i {
            q[i * k + i] += r[j * k + i] * r[j * k + i];
            q[i * k + j] = q[j * k + i];
        }
        for j in i + 1..k {
            q[i * k + i] += r[j * k + i] * r[j * k + i];
            q[i * k + j] = -r[j * k + i] * r[i * k + j];
        }
    }
    let eps = 0.005 / k as f32;
    let mut qp = vec![0f32; k];
    for _ in 0..100 {
        let mut pqp = 0f32;
        for t in 0..k {
            qp[t] = (0..k).map(|j| q[t * k + j] * p[j]).sum();
            pqp += p[t] * qp[t];
        }
        if qp.iter().all(|&v| (v - pqp).abs() < eps) {
            break;
        }
        for t in 0..k {
            let diff = (-qp[t] + pqp) / q[t * k + t];
            p[t] += diff;
            pqp = (pqp + diff * (diff * q[t * k + t] + 2.0 * qp[t])) / (1.0 + diff) / (1.0 + diff);
            for j in 0..k {
                qp[j] = (qp[j] + diff * q[t * k + j]) / (1.0 + diff);
                p[j] /= 1.0 + diff;
            }
        }
    }
    p
}

fn build_classifier(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let labels = class_labels(n, "classlabels_ints")?;
    let k = labels.len();
    let coef = floats_attr(n, "coefficients")?;
    let rho = floats_attr(n, "rho")?;
    let prob_a = floats_attr(n, "prob_a")?;
    let prob_b = floats_attr(n, "prob_b")?;
    let per_class: Vec<usize> = n
        .attr_ints("vectors_per_class")?
        .unwrap_or_default()
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| n.error("vectors_per_class must not be negative")))
        .collect::<OpResult<_>>()?;
    let sv = vectors(n, per_class.iter().sum())?;
    let post = PostTransform::parse(n)?;
    let mut kern = Kernel::parse(n)?;
    if rho.is_empty() {
        return Err(n.error("needs rho"));
    }
    if prob_a.len() != prob_b.len() {
        return Err(n.error("prob_a and prob_b differ in length"));
    }
    let svc = sv.count > 0;
    let pairs = k * k.saturating_sub(1) / 2;
    if svc {
        if per_class.len() != k {
            return Err(n.error(format_args!(
                "vectors_per_class has {} entries for {k} classes",
                per_class.len()
            )));
        }
        if coef.len() != k.saturating_sub(1) * sv.count || rho.len() < pairs {
            return Err(n.error(format_args!(
                "{} coefficients and {} rho values do not fit {k} classes of {} support vectors",
                coef.len(),
                rho.len(),
                sv.count
            )));
        }
        if !prob_a.is_empty() && prob_a.len() < pairs {
            return Err(n.error("prob_a needs one value per pair of classes"));
        }
    } else {
        kern = Kernel::Linear;
        if k == 0 || coef.len() % k != 0 {
            return Err(n.error(format_args!(
                "{} coefficients do not split into {k} classes",
                coef.len()
            )));
        }
    }
    let starts: Vec<usize> = per_class
        .iter()
        .scan(0, |s, &c| {
            let at = *s;
            *s += c;
            Some(at)
        })
        .collect();
    let all_positive = coef.iter().all(|&c| c >= 0.0);
    let proba = svc && !prob_a.is_empty();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        let xv = features(&op, x)?;
        let need = if svc { sv.features } else { coef.len() / k };
        if cols != need {
            bail!("{op}: the model has {need} features, the input {cols}");
        }
        let width = if svc && !proba {
            if k > 2 { pairs } else { 2 }
        } else {
            k
        };
        // One row: its scores into `dst` (`width` values), its label returned.
        let row = |r: usize, ker: &mut [f32], dst: &mut [f32]| -> usize {
            let xr = &xv[r * cols..(r + 1) * cols];
            if !svc {
                // Linear form: one score per class, rho[0] added to each.
                let scores: Vec<f32> = (0..k)
                    .map(|c| {
                        let w = &coef[c * cols..(c + 1) * cols];
                        xr.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() + rho[0]
                    })
                    .collect();
                let best = scores
                    .iter()
                    .enumerate()
                    .fold(0, |b, (i, &v)| if v > scores[b] { i } else { b });
                let top = scores[best];
                let label =
                    if k == 2 && ((all_positive && top >= 0.5) || (top > 0.0 && !all_positive)) {
                        1
                    } else {
                        best
                    };
                let mut scores = scores;
                post.apply(&mut scores);
                dst.copy_from_slice(&scores);
                return label;
            }
            kern.eval_all(xr, &sv, ker);
            let mut votes = vec![0usize; k];
            let mut decisions = Vec::with_capacity(pairs);
            let mut pair = 0;
            for i in 0..k {
                for j in i + 1..k {
                    let mut d = 0f64;
                    for v in starts[i]..starts[i] + per_class[i] {
                        d += f64::from(coef[(j - 1) * sv.count + v] * ker[v]);
                    }
                    for v in starts[j]..starts[j] + per_class[j] {
                        d += f64::from(coef[i * sv.count + v] * ker[v]);
                    }
                    d += f64::from(rho[pair]);
                    votes[if d > 0.0 { i } else { j }] += 1;
                    decisions.push(d as f32);
                    pair += 1;
                }
            }
            let winner = votes
                .iter()
                .enumerate()
                .fold(0, |b, (i, &v)| if v > votes[b] { i } else { b });
            if proba {
                let mut pr = vec![0f32; k * k];
                let mut pair = 0;
                for i in 0..k {
                    for j in i + 1..k {
                        let v = 1.0 - logistic(decisions[pair] * prob_a[pair] + prob_b[pair]);
                        let v = v.clamp(1e-7, 1.0 - 1e-7);
                        pr[i * k + j] = v;
                        pr[j * k + i] = 1.0 - v;
                        pair += 1;
                    }
                }
                let mut p = couple(k, &pr);
                post.apply(&mut p);
                dst.copy_from_slice(&p);
            } else if k <= 2 {
                let d = decisions.first().copied().unwrap_or(0.0);
                dst.copy_from_slice(&match post {
                    PostTransform::None => [-d, d],
                    _ => [1.0 - d, d],
                });
            } else {
                post.apply(&mut decisions);
                dst.copy_from_slice(&decisions);
            }
            winner
        };
        // Runs of rows shared across the intra-op pool. Each row's slot holds its `width`
        // scores and then its label (a class index, exact in f32).
        let slot = width + 1;
        let mut rows_out = vec![0f32; rows * slot];
        let run = crate::par::chunk_len(rows, 16, 1);
        crate::par::for_each_chunk(&mut rows_out, run * slot, |i, o| {
            let mut ker = vec![0f32; sv.count];
            for (j, s) in o.chunks_exact_mut(slot).enumerate() {
                let (dst, label) = s.split_at_mut(width);
                label[0] = row(i * run + j, &mut ker, dst) as f32;
            }
        });
        let out_labels: Vec<usize> = rows_out
            .chunks_exact(slot)
            .map(|s| s[width] as usize)
            .collect();
        let out: Vec<f32> = rows_out
            .chunks_exact(slot)
            .flat_map(|s| s[..width].iter().copied())
            .collect();
        Ok(vec![
            labels.tensor(&out_labels)?,
            Tensor::from_vec(&[rows, width], out)?,
        ])
    }))
}

fn build_regressor(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let coef = floats_attr(n, "coefficients")?;
    let rho = floats_attr(n, "rho")?;
    let count = usize::try_from(n.attr_int_or("n_supports", 0)?)
        .map_err(|_| n.error("n_supports must not be negative"))?;
    let sv = vectors(n, count)?;
    let one_class = n.attr_int_or("one_class", 0)? != 0;
    let kern = if count > 0 {
        Kernel::parse(n)?
    } else {
        Kernel::Linear
    };
    if count > 0 && coef.len() != count {
        return Err(n.error(format_args!(
            "{} coefficients for {count} support vectors",
            coef.len()
        )));
    }
    let bias = rho.first().copied().unwrap_or(0.0);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        let xv = features(&op, x)?;
        let need = if count > 0 { sv.features } else { coef.len() };
        if cols != need {
            bail!("{op}: the model has {need} features, the input {cols}");
        }
        let mut out = Vec::with_capacity(rows);
        for r in 0..rows {
            let xr = &xv[r * cols..(r + 1) * cols];
            let y = if count > 0 {
                (0..count)
                    .map(|v| {
                        coef[v] * kern.eval(xr, &sv.data[v * sv.features..(v + 1) * sv.features])
                    })
                    .sum::<f32>()
                    + bias
            } else {
                xr.iter().zip(&coef).map(|(a, b)| a * b).sum::<f32>() + bias
            };
            out.push(if one_class {
                if y > 0.0 { 1.0 } else { -1.0 }
            } else {
                y
            });
        }
        one(Tensor::from_vec(&[rows, 1], out))
    }))
}
