//! The `ai.onnx.ml` ops over strings and maps: ZipMap, DictVectorizer, CastMap and
//! CategoryMapper (OneHotEncoder's string categories and LabelEncoder live in `ml`).

use std::collections::HashMap;
use std::sync::Arc;

use epx_plugin_api::ElementType;

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::add_ml;
use crate::kernel::one;
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::ops::ml::class_labels;
use crate::ops::util::args::input;
use crate::tensor::{MapValue, Sequence, Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add_ml(reg, "ZipMap", 1, build_zipmap);
    add_ml(reg, "DictVectorizer", 1, build_dict_vectorizer);
    add_ml(reg, "CastMap", 1, build_cast_map);
    add_ml(reg, "CategoryMapper", 1, build_category_mapper);
}

/// One map per row of scores: class label → score, as skl2onnx's classifiers end.
fn build_zipmap(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let labels = class_labels(n, "classlabels_int64s")?;
    let keys = labels.tensor(&(0..labels.len()).collect::<Vec<_>>())?;
    Ok(kernel(move |inputs| {
        let x = input("ZipMap", inputs, 0)?.expect_type::<f32>("ZipMap input")?;
        let (rows, cols) = match x.shape() {
            [c] => (1, *c),
            [r, c] => (*r, *c),
            s => bail!("ZipMap: input must be 1-D or 2-D, got shape {s:?}"),
        };
        if cols != labels.len() {
            bail!("ZipMap: {cols} scores per row for {} labels", labels.len());
        }
        let flat: Vec<f32> = x.iter().copied().collect();
        let items = (0..rows)
            .map(|r| {
                Ok(Tensor::Map(Arc::new(MapValue {
                    keys: keys.clone(),
                    values: Tensor::from_vec(&[cols], flat[r * cols..(r + 1) * cols].to_vec())?,
                })))
            })
            .collect::<OpResult<Vec<_>>>()?;
        one(Ok(Tensor::Seq(Arc::new(Sequence {
            elem_type: ElementType::Undefined,
            items,
        }))))
    }))
}

fn map_input<'a>(op: &str, t: &TensorRef<'a>) -> OpResult<&'a MapValue> {
    match t {
        TensorRef::Map(m) => Ok(m),
        other => bail!("{op}: the input must be a map, got {}", other.type_name()),
    }
}

/// A key of a map or vocabulary.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Int(i64),
    Str(String),
}

fn keys_of(op: &str, t: &Tensor) -> OpResult<Vec<Key>> {
    match t {
        Tensor::I64(a) => Ok(a.iter().map(|&k| Key::Int(k)).collect()),
        Tensor::Str(a) => Ok(a.iter().cloned().map(Key::Str).collect()),
        other => bail!(
            "{op}: map keys must be int64 or string, got {}",
            other.type_name()
        ),
    }
}

/// Takes the values of `src` at `picks` (`None`: the default), for any element type.
fn gather(op: &str, src: &Tensor, picks: &[Option<usize>], shape: &[usize]) -> OpResult<Tensor> {
    match src {
        Tensor::Str(a) => {
            let v: Vec<String> = picks
                .iter()
                .map(|p| p.map_or_else(String::new, |i| a[i].clone()))
                .collect();
            Tensor::strings(shape, v)
        }
        t => {
            let vals = t.view().to_f64_vec();
            let v: Vec<f64> = picks.iter().map(|p| p.map_or(0.0, |i| vals[i])).collect();
            crate::ops::util::num::tensor_from_f64(t.elem_type(), shape, v)
                .map_err(|e| OpError(format!("{op}: {e}")))
        }
    }
}

fn build_dict_vectorizer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let vocab: Vec<Key> = match (
        n.attr_ints("int64_vocabulary")?,
        n.attr_strings("string_vocabulary")?,
    ) {
        (Some(v), None) => v.into_iter().map(Key::Int).collect(),
        (None, Some(v)) => v.into_iter().map(Key::Str).collect(),
        _ => bail!(
            "DictVectorizer: exactly one of int64_vocabulary and string_vocabulary must be given"
        ),
    };
    let index: HashMap<Key, usize> = vocab
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, k)| (k, i))
        .collect();
    let width = vocab.len();
    Ok(kernel(move |inputs| {
        let m = map_input("DictVectorizer", input("DictVectorizer", inputs, 0)?)?;
        let mut picks = vec![None; width];
        for (i, k) in keys_of("DictVectorizer", &m.keys)?.iter().enumerate() {
            if let Some(&col) = index.get(k) {
                picks[col] = Some(i);
            }
        }
        one(gather("DictVectorizer", &m.values, &picks, &[1, width]))
    }))
}

fn build_cast_map(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let to = match n.attr_string_or("cast_to", "TO_FLOAT")?.as_str() {
        "TO_FLOAT" => ElementType::Float,
        "TO_STRING" => ElementType::String,
        "TO_INT64" => ElementType::Int64,
        other => bail!("CastMap: cast_to must be TO_FLOAT, TO_STRING or TO_INT64, not {other:?}"),
    };
    let sparse = match n.attr_string_or("map_form", "DENSE")?.as_str() {
        "DENSE" => false,
        "SPARSE" => true,
        other => bail!("CastMap: map_form must be DENSE or SPARSE, not {other:?}"),
    };
    let max_map = n.attr_count_or("max_map", 1)?;
    Ok(kernel(move |inputs| {
        let m = map_input("CastMap", input("CastMap", inputs, 0)?)?;
        let keys = m.keys.view().to_i64_vec("CastMap keys")?;
        // Values in key order (ONNX maps are ordered by key).
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        let picks: Vec<Option<usize>> = if sparse {
            let mut p = vec![None; max_map];
            for &i in &order {
                let k = usize::try_from(keys[i])
                    .ok()
                    .filter(|&k| k < max_map)
                    .ok_or_else(|| {
                        OpError(format!(
                            "CastMap: key {} is outside [0, max_map = {max_map})",
                            keys[i]
                        ))
                    })?;
                p[k] = Some(i);
            }
            p
        } else {
            order.into_iter().map(Some).collect()
        };
        let width = picks.len();
        let values = gather("CastMap", &m.values, &picks, &[1, width])?;
        if to == ElementType::String && values.elem_type() != ElementType::String {
            // As ONNX Runtime writes them (C++'s std::to_string): six decimals for floats.
            let text: Vec<String> = match &values {
                Tensor::F32(a) => a.iter().map(|x| format!("{x:.6}")).collect(),
                t => t
                    .view()
                    .to_f64_vec()
                    .iter()
                    .map(|x| format!("{x:.6}"))
                    .collect(),
            };
            return one(Tensor::strings(&[1, width], text));
        }
        one(values.view().cast(to))
    }))
}

fn build_category_mapper(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let ints = n.attr_ints("cats_int64s")?.unwrap_or_default();
    let strings = n.attr_strings("cats_strings")?.unwrap_or_default();
    if ints.len() != strings.len() {
        bail!(
            "CategoryMapper: {} cats_int64s for {} cats_strings",
            ints.len(),
            strings.len()
        );
    }
    let default_int = n.attr_int_or("default_int64", -1)?;
    let default_string = n.attr_string_or("default_string", "_Unused")?;
    let to_int: HashMap<String, i64> = strings.iter().cloned().zip(ints.iter().copied()).collect();
    let to_str: HashMap<i64, String> = ints.into_iter().zip(strings).collect();
    Ok(kernel(move |inputs| {
        match input("CategoryMapper", inputs, 0)? {
            TensorRef::Str(a) => one(Ok(Tensor::I64(
                a.map(|s| to_int.get(s).copied().unwrap_or(default_int)),
            ))),
            TensorRef::I64(a) => one(Ok(Tensor::Str(a.map(|k| {
                to_str
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| default_string.clone())
            })))),
            other => bail!(
                "CategoryMapper: the input must be int64 or string, got {}",
                other.type_name()
            ),
        }
    }))
}
