//! The `ai.onnx.ml` operators on numeric tensors: the preprocessing ops scikit-learn pipelines
//! convert to (Scaler, Normalizer, Binarizer, Imputer, OneHotEncoder, ArrayFeatureExtractor,
//! FeatureVectorizer, LabelEncoder on numbers) and the linear models. Tree ensembles live in
//! `trees.rs`, SVMs in `svm.rs`.
//!
//! Like ONNX Runtime, the models compute in f32 and return float32, whatever numeric type the
//! features come in.

use std::collections::HashMap;

use epx_plugin_api::ElementType;

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::one;
use crate::kernel::{AttrValue, NodeDef, OpKernel, Registry, add_ml, kernel};
use crate::ops::util::args::input;
use crate::tensor::{Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add_ml(reg, "Scaler", 1, build_scaler);
    add_ml(reg, "Normalizer", 1, build_normalizer);
    add_ml(reg, "Binarizer", 1, build_binarizer);
    add_ml(reg, "Imputer", 1, build_imputer);
    add_ml(reg, "OneHotEncoder", 1, build_one_hot_encoder);
    add_ml(
        reg,
        "ArrayFeatureExtractor",
        1,
        build_array_feature_extractor,
    );
    add_ml(reg, "FeatureVectorizer", 1, build_feature_vectorizer);
    add_ml(reg, "LinearRegressor", 1, build_linear_regressor);
    add_ml(reg, "LinearClassifier", 1, build_linear_classifier);
    add_ml(reg, "LabelEncoder", 1, build_label_encoder);
}

/// The features of an ML op's input as f32 (any numeric type), with its shape.
pub(crate) fn features(op: &str, t: &TensorRef<'_>) -> OpResult<Vec<f32>> {
    match t.elem_type() {
        ElementType::Float => Ok(t.as_f32()?.iter().copied().collect()),
        ElementType::Double
        | ElementType::Int64
        | ElementType::Int32
        | ElementType::Float16
        | ElementType::Bfloat16 => Ok(t.to_f64_vec().into_iter().map(|v| v as f32).collect()),
        other => bail!("{op}: features of type {other} are not numeric"),
    }
}

/// `(rows, columns)` of a 1-D (one row) or 2-D feature input.
pub(crate) fn rows_cols(op: &str, t: &TensorRef<'_>) -> OpResult<(usize, usize)> {
    match *t.shape() {
        [c] => Ok((1, c)),
        [n, c] => Ok((n, c)),
        ref s => bail!("{op}: features must be 1-D or 2-D, got shape {s:?}"),
    }
}

pub(crate) fn floats_attr(n: &NodeDef, name: &str) -> OpResult<Vec<f32>> {
    Ok(n.attr_floats(name)?.unwrap_or_default())
}

/// `post_transform` of the ML models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PostTransform {
    None,
    Softmax,
    Logistic,
    SoftmaxZero,
    Probit,
}

impl PostTransform {
    pub(crate) fn parse(n: &NodeDef) -> OpResult<Self> {
        Self::from_name(n, &n.attr_string_or("post_transform", "NONE")?)
    }

    pub(crate) fn from_name(n: &NodeDef, s: &str) -> OpResult<Self> {
        Ok(match s {
            "NONE" => PostTransform::None,
            "SOFTMAX" => PostTransform::Softmax,
            "LOGISTIC" => PostTransform::Logistic,
            "SOFTMAX_ZERO" => PostTransform::SoftmaxZero,
            "PROBIT" => PostTransform::Probit,
            other => {
                return Err(n.error(format_args!(
                    "post_transform `{other}` is not one of NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT"
                )));
            }
        })
    }

    /// Applies the transform to one row of scores, in place.
    pub(crate) fn apply(self, row: &mut [f32]) {
        match self {
            PostTransform::None => {}
            PostTransform::Logistic => row.iter_mut().for_each(|v| *v = logistic(*v)),
            PostTransform::Softmax => softmax(row, false),
            PostTransform::SoftmaxZero => softmax(row, true),
            PostTransform::Probit => row.iter_mut().for_each(|v| *v = probit(*v)),
        }
    }
}

/// 1 / (1 + e^-x), computed as ONNX Runtime does (on |x|, mirrored for negative x).
pub(crate) fn logistic(x: f32) -> f32 {
    let v = 1.0 / (1.0 + (-x.abs()).exp());
    if x < 0.0 { 1.0 - v } else { v }
}

/// Softmax of a row; with `zero`, entries that are exactly 0 stay 0 (SOFTMAX_ZERO).
pub(crate) fn softmax(row: &mut [f32], zero: bool) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        if zero && *v == 0.0 {
            continue;
        }
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        if !(zero && *v == 0.0) {
            *v = if sum == 0.0 { 0.0 } else { *v / sum };
        }
    }
}

/// √2 · erfinv(2x − 1): the quantile of the standard normal distribution.
pub(crate) fn probit(x: f32) -> f32 {
    std::f32::consts::SQRT_2 * erf_inv(2.0 * x - 1.0)
}

/// The inverse error function, by Winitzki's approximation refined as ONNX Runtime refines it.
fn erf_inv(x: f32) -> f32 {
    let sgn = if x < 0.0 { -1.0f32 } else { 1.0 };
    let x = (1.0 - x) * (1.0 + x);
    let log = x.ln();
    let v = 2.0 / (std::f32::consts::PI * 0.147) + 0.5 * log;
    let v2 = 1.0 / 0.147 * log;
    let v3 = -v + (v * v - v2).sqrt();
    sgn * v3.sqrt()
}

fn float_out(shape: &[usize], v: Vec<f32>) -> OpResult<Tensor> {
    Tensor::from_vec(shape, v)
}

/// One value for every column, or one value for all of them.
fn per_column(op: &str, what: &str, v: &[f32], cols: usize) -> OpResult<Vec<f32>> {
    match v.len() {
        1 => Ok(vec![v[0]; cols]),
        n if n == cols => Ok(v.to_vec()),
        n => bail!("{op}: {what} has {n} values for {cols} columns"),
    }
}

fn build_scaler(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let offset = floats_attr(n, "offset")?;
    let scale = floats_attr(n, "scale")?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let cols = x.shape().last().copied().unwrap_or(1);
        let off = if offset.is_empty() {
            vec![0.0; cols]
        } else {
            per_column(&op, "offset", &offset, cols)?
        };
        let sc = if scale.is_empty() {
            vec![1.0; cols]
        } else {
            per_column(&op, "scale", &scale, cols)?
        };
        let mut v = features(&op, x)?;
        for (i, e) in v.iter_mut().enumerate() {
            let c = i % cols.max(1);
            *e = (*e - off[c]) * sc[c];
        }
        one(float_out(x.shape(), v))
    }))
}

fn build_normalizer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let norm = n.attr_string_or("norm", "MAX")?;
    if !matches!(norm.as_str(), "MAX" | "L1" | "L2") {
        return Err(n.error(format_args!("norm `{norm}` is not one of MAX, L1, L2")));
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (_, cols) = rows_cols(&op, x)?;
        let mut v = features(&op, x)?;
        for row in v.chunks_mut(cols.max(1)) {
            match norm.as_str() {
                "MAX" => {
                    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if m != 0.0 {
                        row.iter_mut().for_each(|e| *e /= m);
                    }
                }
                "L1" => {
                    let s: f32 = row.iter().map(|e| e.abs()).sum();
                    if s != 0.0 {
                        row.iter_mut().for_each(|e| *e /= s);
                    }
                }
                _ => {
                    let s = row.iter().map(|e| e * e).sum::<f32>().sqrt();
                    if s != 0.0 {
                        row.iter_mut().for_each(|e| *e /= s);
                    }
                }
            }
        }
        one(float_out(x.shape(), v))
    }))
}

fn build_binarizer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let threshold = f64::from(n.attr_float_or("threshold", 0.0)?);
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let v: Vec<f64> = x
            .to_f64_vec()
            .into_iter()
            .map(|e| if e > threshold { 1.0 } else { 0.0 })
            .collect();
        one(crate::ops::util::num::tensor_from_f64(
            x.elem_type(),
            x.shape(),
            v,
        ))
    }))
}

fn build_imputer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let floats = floats_attr(n, "imputed_value_floats")?;
    let ints = n.attr_ints("imputed_value_int64s")?.unwrap_or_default();
    let replaced_f = n.attr_float_or("replaced_value_float", 0.0)?;
    let replaced_i = n.attr_int_or("replaced_value_int64", 0)?;
    if floats.is_empty() == ints.is_empty() {
        return Err(n.error("needs exactly one of imputed_value_floats, imputed_value_int64s"));
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let cols = x.shape().last().copied().unwrap_or(1).max(1);
        if x.elem_type() == ElementType::Int64 {
            if ints.is_empty() {
                bail!("{op}: int64 features need imputed_value_int64s");
            }
            let fill = if ints.len() == 1 {
                vec![ints[0]; cols]
            } else if ints.len() == cols {
                ints.clone()
            } else {
                bail!(
                    "{op}: imputed_value_int64s has {} values for {cols} columns",
                    ints.len()
                );
            };
            let mut v = x.as_i64()?.iter().copied().collect::<Vec<_>>();
            for (i, e) in v.iter_mut().enumerate() {
                if *e == replaced_i {
                    *e = fill[i % cols];
                }
            }
            return one(Tensor::from_vec(x.shape(), v));
        }
        if floats.is_empty() {
            bail!("{op}: {} features need imputed_value_floats", x.elem_type());
        }
        let fill = per_column(&op, "imputed_value_floats", &floats, cols)?;
        let mut v = features(&op, x)?;
        for (i, e) in v.iter_mut().enumerate() {
            let hole = if replaced_f.is_nan() {
                e.is_nan()
            } else {
                *e == replaced_f
            };
            if hole {
                *e = fill[i % cols];
            }
        }
        one(float_out(x.shape(), v))
    }))
}

fn build_one_hot_encoder(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let cats = n.attr_ints("cats_int64s")?.unwrap_or_default();
    let cat_strings = n.attr_strings("cats_strings")?.unwrap_or_default();
    if cats.is_empty() && cat_strings.is_empty() {
        return Err(n.error("needs cats_int64s or cats_strings"));
    }
    let zeros = n.attr_int_or("zeros", 1)? != 0;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        if let TensorRef::Str(a) = x {
            return one(one_hot_strings(&op, a, &cat_strings, zeros));
        }
        let values: Vec<f64> = match x.elem_type() {
            ElementType::Int64 | ElementType::Int32 | ElementType::Float | ElementType::Double => {
                x.to_f64_vec()
            }
            other => bail!("{op}: input of type {other} is not supported"),
        };
        let k = cats.len();
        let len = values
            .len()
            .checked_mul(k)
            .ok_or_else(|| OpError(format!("{op}: the output is too large")))?;
        let mut out: Vec<f32> = crate::limits::zeros_checked(len, &op)?;
        for (i, &v) in values.iter().enumerate() {
            let key = v as i64;
            // A category listed twice counts at its last place, as in ONNX Runtime.
            match cats.iter().rposition(|&c| c == key) {
                Some(j) => out[i * k + j] = 1.0,
                None if zeros => {}
                None => bail!("{op}: value {v} is not among the categories and zeros is 0"),
            }
        }
        let mut shape = x.shape().to_vec();
        shape.push(k);
        one(float_out(&shape, out))
    }))
}

fn build_array_feature_extractor(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let idx = input(&op, inputs, 1)?.to_i64_vec(&format!("{op}: indices"))?;
        if idx.is_empty() {
            bail!("{op}: no indices given");
        }
        let last = x.shape().last().copied().unwrap_or(0);
        let cols: Vec<usize> = idx
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .filter(|&i| i < last)
                    .ok_or_else(|| {
                        OpError(format!(
                            "{op}: index {i} is outside the last axis of size {last}"
                        ))
                    })
            })
            .collect::<OpResult<_>>()?;
        let mut shape = x.shape().to_vec();
        if shape.len() <= 1 {
            shape = vec![1, cols.len()];
        } else if let Some(l) = shape.last_mut() {
            *l = cols.len();
        }
        if let Ok(t) = crate::dispatch_all!(x.clone(), |v| pick_columns(&v, &cols, &shape), &op) {
            return one(Ok(t));
        }
        let owned = x.try_to_owned()?;
        let mut bytes = crate::limits::zeros_checked(owned.byte_len(), &op)?;
        owned.write_bytes(&mut bytes)?;
        let size = x
            .elem_type()
            .byte_size()
            .ok_or_else(|| OpError(format!("{op}: unsupported element type {}", x.elem_type())))?;
        let rows = x.len() / last.max(1);
        let mut out = Vec::with_capacity(rows * cols.len() * size);
        for r in 0..rows {
            for &c in &cols {
                let at = (r * last + c) * size;
                out.extend_from_slice(&bytes[at..at + size]);
            }
        }
        one(Tensor::from_bytes(x.elem_type(), &shape, &out))
    }))
}

/// The columns `cols` of each row of `x` (its last axis), as a tensor of `shape`.
fn pick_columns<T: crate::tensor::Elem>(
    x: &ndarray::ArrayViewD<'_, T>,
    cols: &[usize],
    shape: &[usize],
) -> OpResult<Tensor> {
    let xc = x.as_standard_layout();
    let xs = xc
        .as_slice()
        .ok_or_else(|| OpError("ArrayFeatureExtractor: input not contiguous".into()))?;
    let last = x.shape().last().copied().unwrap_or(1).max(1);
    let mut out = Vec::with_capacity(xs.len() / last * cols.len());
    for row in xs.chunks_exact(last) {
        out.extend(cols.iter().map(|&c| row[c]));
    }
    Tensor::from_vec(shape, out)
}

fn build_feature_vectorizer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let dims: Vec<usize> = n
        .attr_ints("inputdimensions")?
        .unwrap_or_default()
        .into_iter()
        .map(|d| {
            usize::try_from(d).map_err(|_| n.error(format_args!("negative input dimension {d}")))
        })
        .collect::<OpResult<_>>()?;
    Ok(kernel(move |inputs| {
        if inputs.len() != dims.len() {
            bail!(
                "{op}: {} inputs for {} inputdimensions",
                inputs.len(),
                dims.len()
            );
        }
        let total = dims
            .iter()
            .try_fold(0usize, |a, &d| a.checked_add(d))
            .ok_or_else(|| OpError(format!("{op}: inputdimensions add up past memory")))?;
        let mut rows = None;
        let mut parts = Vec::with_capacity(dims.len());
        for i in 0..dims.len() {
            let x = input(&op, inputs, i)?;
            let (n, c) = match *x.shape() {
                [] => (1, 1),
                [c] => (1, c),
                ref s => (s[..s.len() - 1].iter().product(), s[s.len() - 1]),
            };
            if *rows.get_or_insert(n) != n {
                bail!(
                    "{op}: input {i} has {n} rows, the first has {}",
                    rows.unwrap_or(0)
                );
            }
            parts.push((features(&op, x)?, c));
        }
        let n = rows.unwrap_or(1);
        let len = n
            .checked_mul(total)
            .ok_or_else(|| OpError(format!("{op}: the output is too large")))?;
        let mut out: Vec<f32> = crate::limits::zeros_checked(len, &op)?;
        for r in 0..n {
            let mut at = r * total;
            for ((v, c), &d) in parts.iter().zip(&dims) {
                // Each input is cut or zero-padded to its declared width.
                for j in 0..d.min(*c) {
                    out[at + j] = v[r * c + j];
                }
                at += d;
            }
        }
        one(float_out(&[n, total], out))
    }))
}

/// `scores[r][t] = intercept[t] + Σ_f x[r][f] · coef[t][f]`, in f32.
pub(crate) fn linear_scores(
    x: &[f32],
    rows: usize,
    cols: usize,
    coef: &[f32],
    intercepts: &[f32],
    targets: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; rows * targets];
    for r in 0..rows {
        let xr = &x[r * cols..(r + 1) * cols];
        for t in 0..targets {
            let w = &coef[t * cols..(t + 1) * cols];
            let dot: f32 = xr.iter().zip(w).map(|(a, b)| a * b).sum();
            out[r * targets + t] = dot + intercepts.get(t).copied().unwrap_or(0.0);
        }
    }
    out
}

fn build_linear_regressor(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let coef = floats_attr(n, "coefficients")?;
    let intercepts = floats_attr(n, "intercepts")?;
    let targets = n.attr_count_or("targets", 1)?;
    let post = PostTransform::parse(n)?;
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        crate::limits::checked_len(&[rows, targets], 4)?;
        if Some(coef.len()) != targets.checked_mul(cols) {
            bail!(
                "{op}: {} coefficients for {targets} targets of {cols} features",
                coef.len()
            );
        }
        let mut s = linear_scores(&features(&op, x)?, rows, cols, &coef, &intercepts, targets);
        for row in s.chunks_mut(targets) {
            post.apply(row);
        }
        one(float_out(&[rows, targets], s))
    }))
}

/// The class labels of a classifier: `classlabels_strings`, or the integer list `attr`
/// (`classlabels_ints`, or the tree ensembles' `classlabels_int64s`).
#[derive(Clone, Debug)]
pub(crate) enum ClassLabels {
    Ints(Vec<i64>),
    Strings(Vec<String>),
}

impl ClassLabels {
    pub(crate) fn len(&self) -> usize {
        match self {
            ClassLabels::Ints(v) => v.len(),
            ClassLabels::Strings(v) => v.len(),
        }
    }

    /// The label tensor (1-D) of the chosen classes; a class past the integer labels is its own
    /// index, as in ONNX Runtime.
    pub(crate) fn tensor(&self, picks: &[usize]) -> OpResult<Tensor> {
        match self {
            ClassLabels::Ints(v) => Tensor::from_vec(
                &[picks.len()],
                picks
                    .iter()
                    .map(|&i| v.get(i).copied().unwrap_or(i as i64))
                    .collect(),
            ),
            ClassLabels::Strings(v) => Tensor::strings(
                &[picks.len()],
                picks
                    .iter()
                    .map(|&i| {
                        v.get(i).cloned().ok_or_else(|| {
                            OpError(format!("class {i} has no label ({} labels)", v.len()))
                        })
                    })
                    .collect::<OpResult<_>>()?,
            ),
        }
    }
}

pub(crate) fn class_labels(n: &NodeDef, attr: &str) -> OpResult<ClassLabels> {
    match (n.attr_ints(attr)?, n.attr_strings("classlabels_strings")?) {
        (Some(v), _) if !v.is_empty() => Ok(ClassLabels::Ints(v)),
        (_, Some(v)) if !v.is_empty() => Ok(ClassLabels::Strings(v)),
        _ => Err(n.error(format_args!("needs {attr} or classlabels_strings"))),
    }
}

fn build_linear_classifier(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    let coef = floats_attr(n, "coefficients")?;
    let intercepts = floats_attr(n, "intercepts")?;
    let labels = class_labels(n, "classlabels_ints")?;
    let post = PostTransform::parse(n)?;
    let classes = if intercepts.is_empty() {
        labels.len()
    } else {
        intercepts.len()
    };
    if classes == 0 || coef.len() % classes != 0 {
        return Err(n.error(format_args!(
            "{} coefficients do not split into {classes} classes",
            coef.len()
        )));
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let (rows, cols) = rows_cols(&op, x)?;
        if coef.len() != classes * cols {
            bail!(
                "{op}: {} coefficients for {classes} classes of {cols} features",
                coef.len()
            );
        }
        let scores = linear_scores(&features(&op, x)?, rows, cols, &coef, &intercepts, classes);
        let (picks, scores_out, width) = classify(&scores, rows, classes, labels.len(), post, true);
        Ok(vec![
            labels.tensor(&picks)?,
            float_out(&[rows, width], scores_out)?,
        ])
    }))
}

/// Labels and output scores of a linear classifier from raw scores `[rows, classes]`: the
/// label of the highest score (the first on ties); with one score column and two labels, the
/// positive label when the score is above 0, and two output columns, the first the complement
/// of the second.
pub(crate) fn classify(
    scores: &[f32],
    rows: usize,
    classes: usize,
    num_labels: usize,
    post: PostTransform,
    binary_two_columns: bool,
) -> (Vec<usize>, Vec<f32>, usize) {
    let binary = classes == 1 && num_labels == 2;
    let width = if binary && binary_two_columns {
        2
    } else {
        classes
    };
    let mut out_labels = Vec::with_capacity(rows);
    let mut out = Vec::with_capacity(rows * width);
    for r in 0..rows {
        let mut row = scores[r * classes..(r + 1) * classes].to_vec();
        if binary {
            // The score (after LOGISTIC or PROBIT, which map it to a probability) and its
            // complement to 1, as ONNX Runtime lays them out. ONNX Runtime skips LOGISTIC on
            // a single score; the definition does not.
            let s = row[0];
            out_labels.push(usize::from(s > 0.0));
            let p = match post {
                PostTransform::Logistic => logistic(s),
                PostTransform::Probit => probit(s),
                _ => s,
            };
            let (neg, pos) = (1.0 - p, p);
            if width == 2 {
                out.extend([neg, pos]);
            } else {
                out.push(pos);
            }
            continue;
        }
        let best = row
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > row[b] { i } else { b });
        out_labels.push(best);
        post.apply(&mut row);
        out.extend(row);
    }
    (out_labels, out, width)
}

/// A LabelEncoder key or value: a number (int64 and float keys compare as f64, NaN equal to
/// NaN, -0 equal to 0) or a string.
#[derive(Clone, Debug, PartialEq)]
enum Label {
    Num(f64),
    Str(String),
}

impl Label {
    /// Hashable form: canonical f64 bits, or the string.
    fn key(&self) -> (u64, &str) {
        match self {
            Label::Num(x) if x.is_nan() => (f64::NAN.to_bits(), ""),
            Label::Num(x) if *x == 0.0 => (0, ""),
            Label::Num(x) => (x.to_bits(), ""),
            Label::Str(s) => (u64::MAX, s.as_str()),
        }
    }
}

/// The labels of a LabelEncoder attribute and their element type.
fn labels(n: &NodeDef, name: &str) -> OpResult<Option<(Vec<Label>, ElementType)>> {
    Ok(match n.attributes.get(name) {
        None => None,
        Some(AttrValue::Ints(v)) => Some((
            v.iter().map(|&x| Label::Num(x as f64)).collect(),
            ElementType::Int64,
        )),
        Some(AttrValue::Floats(v)) => Some((
            v.iter().map(|&x| Label::Num(f64::from(x))).collect(),
            ElementType::Float,
        )),
        Some(AttrValue::Strings(_)) => Some((
            n.attr_strings(name)?
                .unwrap_or_default()
                .into_iter()
                .map(Label::Str)
                .collect(),
            ElementType::String,
        )),
        Some(AttrValue::Tensor(t)) => Some((tensor_labels(&t.view()), t.elem_type())),
        Some(other) => {
            return Err(n.error(format_args!(
                "attribute '{name}' must be a list or a tensor, got {other:?}"
            )));
        }
    })
}

fn tensor_labels(t: &TensorRef<'_>) -> Vec<Label> {
    match t {
        TensorRef::Str(a) => a.iter().cloned().map(Label::Str).collect(),
        t => t.to_f64_vec().into_iter().map(Label::Num).collect(),
    }
}

fn build_label_encoder(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let op = n.op_type.clone();
    if n.opset < 2 {
        return build_label_encoder_1(n);
    }
    let pick = |names: [&str; 4], what: &str| -> OpResult<(Vec<Label>, ElementType)> {
        for name in names {
            if let Some(l) = labels(n, name)? {
                return Ok(l);
            }
        }
        Err(n.error(format_args!("needs {what} ({})", names.join(", "))))
    };
    let (keys, key_ty) = pick(
        ["keys_int64s", "keys_floats", "keys_strings", "keys_tensor"],
        "keys",
    )?;
    let (values, out_ty) = pick(
        [
            "values_int64s",
            "values_floats",
            "values_strings",
            "values_tensor",
        ],
        "values",
    )?;
    if keys.len() != values.len() {
        return Err(n.error(format_args!(
            "{} keys for {} values",
            keys.len(),
            values.len()
        )));
    }
    let default = match n.attributes.get("default_tensor") {
        Some(AttrValue::Tensor(t)) => tensor_labels(&t.view())
            .into_iter()
            .next()
            .ok_or_else(|| n.error("default_tensor is empty"))?,
        _ => match out_ty {
            ElementType::String => Label::Str(n.attr_string_or("default_string", "_Unused")?),
            ElementType::Int64 => Label::Num(n.attr_int_or("default_int64", -1)? as f64),
            _ => Label::Num(f64::from(n.attr_float_or("default_float", -0.0)?)),
        },
    };
    let mut table: HashMap<(u64, String), usize> = HashMap::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        let (bits, s) = k.key();
        // The first of repeated keys wins, as a linear search would find it.
        table.entry((bits, s.to_string())).or_insert(i);
    }
    Ok(kernel(move |inputs| {
        let x = input(&op, inputs, 0)?;
        let is_str = matches!(x, TensorRef::Str(_));
        if is_str != (key_ty == ElementType::String) {
            bail!(
                "{op}: the keys are {key_ty}, but the input is {}",
                x.type_name()
            );
        }
        let mut probe = (0u64, String::new());
        let out: Vec<&Label> = tensor_labels(x)
            .iter()
            .map(|l| {
                let (bits, s) = l.key();
                probe.0 = bits;
                probe.1.clear();
                probe.1.push_str(s);
                table.get(&probe).map_or(&default, |&i| &values[i])
            })
            .collect();
        one(labels_tensor(out_ty, x.shape(), out))
    }))
}

/// A tensor of `ty` from labels (numbers for numeric types, strings for strings).
fn labels_tensor(ty: ElementType, shape: &[usize], labels: Vec<&Label>) -> OpResult<Tensor> {
    if ty == ElementType::String {
        let v = labels
            .into_iter()
            .map(|l| match l {
                Label::Str(s) => Ok(s.clone()),
                Label::Num(x) => Err(OpError(format!("a number {x} where a string is expected"))),
            })
            .collect::<OpResult<_>>()?;
        return Tensor::strings(shape, v);
    }
    let v = labels
        .into_iter()
        .map(|l| match l {
            Label::Num(x) => Ok(*x),
            Label::Str(s) => Err(OpError(format!(
                "a string {s:?} where a number is expected"
            ))),
        })
        .collect::<OpResult<_>>()?;
    crate::ops::util::num::tensor_from_f64(ty, shape, v)
}

/// LabelEncoder 1: `classes_strings` maps int64 index ↔ string, in the input's direction.
fn build_label_encoder_1(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let classes = n
        .attr_strings("classes_strings")?
        .ok_or_else(|| n.error("needs classes_strings"))?;
    let default_int = n.attr_int_or("default_int64", -1)?;
    let default_string = n.attr_string_or("default_string", "_Unused")?;
    let index: HashMap<String, i64> = classes
        .iter()
        .enumerate()
        .rev()
        .map(|(i, s)| (s.clone(), i as i64))
        .collect();
    Ok(kernel(move |inputs| {
        let x = input("LabelEncoder", inputs, 0)?;
        match x {
            TensorRef::Str(a) => one(Ok(Tensor::I64(
                a.map(|s| index.get(s).copied().unwrap_or(default_int)),
            ))),
            t => {
                let v: Vec<String> = t
                    .to_i64_vec("LabelEncoder input")?
                    .into_iter()
                    .map(|i| {
                        usize::try_from(i)
                            .ok()
                            .and_then(|i| classes.get(i))
                            .cloned()
                            .unwrap_or_else(|| default_string.clone())
                    })
                    .collect();
                one(Tensor::strings(t.shape(), v))
            }
        }
    }))
}
/// String categories of OneHotEncoder: one column per category, 1 where the input equals it.
pub(crate) fn one_hot_strings(
    op: &str,
    a: &ndarray::ArrayViewD<'_, String>,
    cats: &[String],
    zeros: bool,
) -> OpResult<Tensor> {
    let index: HashMap<&str, usize> = cats
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i))
        .collect();
    let k = cats.len();
    let mut out: Vec<f32> = crate::limits::zeros_checked(
        a.len()
            .checked_mul(k)
            .ok_or_else(|| OpError(format!("{op}: the output is too large")))?,
        op,
    )?;
    for (i, s) in a.iter().enumerate() {
        match index.get(s.as_str()) {
            Some(&j) => out[i * k + j] = 1.0,
            None if zeros => {}
            None => bail!("{op}: {s:?} is not among the categories and zeros is 0"),
        }
    }
    let mut shape = a.shape().to_vec();
    shape.push(k);
    Ok(Tensor::F32(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&shape), out)
            .map_err(|e| OpError(e.to_string()))?,
    ))
}
