//! Values as files, for the CLI and for test data: the form `epx run --input` reads and
//! `--output-dir` writes.
//!
//! - a **tensor** is a `.npy` file (string tensors as numpy unicode arrays, `<U`);
//! - a **sequence** is a folder whose items are `0.npy`, `1.npy`, ... (or `0.json`, ... for a
//!   sequence of maps), in order;
//! - a **map** is a `.json` object, `{"key": value, ...}`, in order (int64 keys written as JSON
//!   strings of their digits, as JSON requires);
//! - an **optional** is its value; an empty optional is written as nothing (and an input
//!   given as the word `none`).

use std::path::{Path, PathBuf};

use epx::ir::ValueType;
use epx::{ElementType, Error, Map, Result, Sequence, Tensor, Value};

use crate::npy;

/// Most items read from one sequence folder.
const MAX_ITEMS: usize = 1 << 20;

fn bad(path: &Path, m: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("{}: {m}", path.display()))
}

/// Reads a tensor from a `.npy` file, as `elem_type` when the model declares one (ml_dtypes'
/// raw-byte arrays need it).
pub fn read_tensor(path: &Path, elem_type: Option<ElementType>) -> Result<Tensor> {
    let mut arr = npy::read_npy(path).map_err(|e| Error::InvalidInput(e.to_string()))?;
    if arr.elem_type == ElementType::String {
        return Tensor::from_strings(&arr.shape, arr.strings).map_err(|e| bad(path, e));
    }
    if let Some(ty) = elem_type {
        arr = arr.as_type(ty).map_err(|e| bad(path, e))?;
    }
    Tensor::from_bytes(arr.elem_type, &arr.shape, &arr.data).map_err(|e| bad(path, e))
}

/// Reads a value of declared type `ty` from `path` (see the module docs for the forms).
pub fn read_value(path: &Path, ty: &ValueType) -> Result<Value> {
    match ty {
        ValueType::Optional(inner) => {
            if path.as_os_str() == "none" {
                return Ok(Value::Optional(None));
            }
            Ok(Value::Optional(Some(Box::new(read_value(path, inner)?))))
        }
        ValueType::Sequence(inner) => {
            let mut items: Vec<(usize, PathBuf)> = Vec::new();
            let entries = std::fs::read_dir(path).map_err(|e| {
                bad(
                    path,
                    format!("a sequence is a folder of 0.npy, 1.npy, ... ({e})"),
                )
            })?;
            for e in entries {
                let p = e.map_err(|e| bad(path, e))?.path();
                let index = p
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.parse::<usize>().ok());
                match index {
                    Some(i) => items.push((i, p)),
                    None => return Err(bad(&p, "sequence items are named 0.npy, 1.npy, ...")),
                }
                if items.len() > MAX_ITEMS {
                    return Err(bad(path, format!("more than {MAX_ITEMS} items")));
                }
            }
            items.sort();
            if let Some((k, (i, p))) = items.iter().enumerate().find(|(k, (i, _))| k != i) {
                return Err(bad(p, format!("item {i} where item {k} is expected")));
            }
            let values = items
                .iter()
                .map(|(_, p)| read_value(p, inner))
                .collect::<Result<Vec<_>>>()?;
            let elem = inner.innermost_elem_type().or_else(|| {
                values
                    .first()
                    .and_then(|v| v.as_tensor().map(Tensor::elem_type))
            });
            Sequence::new(elem, values).map(Value::Sequence)
        }
        ValueType::Map { key, value } => {
            let bytes = crate::read_regular_file(path).map_err(|e| bad(path, e))?;
            let text = String::from_utf8(bytes).map_err(|e| bad(path, e))?;
            read_map(path, &text, *key, value.innermost_elem_type())
        }
        _ => {
            let elem = match ty {
                ValueType::Tensor { elem_type, .. } => *elem_type,
                _ => None,
            };
            read_tensor(path, elem).map(Value::Host)
        }
    }
}

/// A map from a JSON object, keys of `key` type (int64 keys written as strings of digits),
/// values of `value` type (float when not declared).
fn read_map(
    path: &Path,
    text: &str,
    key: ElementType,
    value: Option<ElementType>,
) -> Result<Value> {
    let parsed: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(path, e))?;
    let serde_json::Value::Object(obj) = parsed else {
        return Err(bad(path, "a map is a JSON object"));
    };
    let n = obj.len();
    let keys = match key {
        ElementType::String => {
            Tensor::from_strings(&[n], obj.keys().map(|k| k.as_bytes().to_vec()).collect())?
        }
        _ => {
            let ks = obj
                .keys()
                .map(|k| {
                    k.parse::<i64>()
                        .map_err(|_| bad(path, format!("map key {k:?} is not an int64")))
                })
                .collect::<Result<Vec<i64>>>()?;
            Tensor::from_array(ndarray::Array1::from(ks))
        }
    };
    let value = value.unwrap_or(ElementType::Float);
    let values = if value == ElementType::String {
        let v = obj
            .values()
            .map(|v| match v {
                serde_json::Value::String(s) => Ok(s.as_bytes().to_vec()),
                other => Err(bad(path, format!("map value {other} is not a string"))),
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::from_strings(&[n], v)?
    } else {
        let v = obj
            .values()
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| bad(path, format!("map value {v} is not a number")))
            })
            .collect::<Result<Vec<f64>>>()?;
        numbers(value, v).map_err(|e| bad(path, e))?
    };
    Map::new(keys, values).map(Value::Map)
}

/// A 1-D tensor of `ty` from numbers.
fn numbers(ty: ElementType, v: Vec<f64>) -> Result<Tensor> {
    Ok(match ty {
        ElementType::Float => {
            Tensor::from_array(ndarray::Array1::from_iter(v.iter().map(|&x| x as f32)))
        }
        ElementType::Double => Tensor::from_array(ndarray::Array1::from(v)),
        ElementType::Int64 => {
            Tensor::from_array(ndarray::Array1::from_iter(v.iter().map(|&x| x as i64)))
        }
        ElementType::Int32 => {
            Tensor::from_array(ndarray::Array1::from_iter(v.iter().map(|&x| x as i32)))
        }
        other => {
            return Err(Error::InvalidInput(format!(
                "map values of type {other} are not read from JSON"
            )));
        }
    })
}

/// JSON for a map: an object with its keys in order.
pub fn map_json(m: &Map) -> Result<String> {
    let keys: Vec<String> = match m.keys().strings() {
        Some(s) => s
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect(),
        None => m
            .keys()
            .as_slice::<i64>()
            .ok_or_else(|| Error::InvalidInput("map keys must be int64 or string".into()))?
            .iter()
            .map(i64::to_string)
            .collect(),
    };
    let values: Vec<serde_json::Value> = tensor_json_items(m.values())?;
    let mut out = String::from("{");
    for (i, (k, v)) in keys.iter().zip(values).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&serde_json::Value::String(k.clone()).to_string());
        out.push_str(": ");
        out.push_str(&v.to_string());
    }
    out.push('}');
    Ok(out)
}

/// The elements of a 1-D tensor as JSON values.
fn tensor_json_items(t: &Tensor) -> Result<Vec<serde_json::Value>> {
    use serde_json::Value as J;
    let num = |x: f64| serde_json::Number::from_f64(x).map_or(J::Null, J::Number);
    Ok(match t.elem_type() {
        ElementType::String => t
            .strings()
            .unwrap_or_default()
            .iter()
            .map(|s| J::String(String::from_utf8_lossy(s).into_owned()))
            .collect(),
        ElementType::Float => t
            .as_slice::<f32>()
            .unwrap_or_default()
            .iter()
            .map(|&x| num(f64::from(x)))
            .collect(),
        ElementType::Double => t
            .as_slice::<f64>()
            .unwrap_or_default()
            .iter()
            .map(|&x| num(x))
            .collect(),
        ElementType::Int64 => t
            .as_slice::<i64>()
            .unwrap_or_default()
            .iter()
            .map(|&x| J::from(x))
            .collect(),
        ElementType::Int32 => t
            .as_slice::<i32>()
            .unwrap_or_default()
            .iter()
            .map(|&x| J::from(x))
            .collect(),
        other => {
            return Err(Error::InvalidInput(format!(
                "map values of type {other} are not written as JSON"
            )));
        }
    })
}

/// A value name as a file name: characters other than letters, digits, `.`, `_` and `-` become
/// `_`; an empty or all-dots name gets a leading `_`.
pub fn safe_file_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        format!("_{s}")
    } else {
        s
    }
}

/// A file name per value name, each [`safe_file_name`], made unique: a name whose safe form an
/// earlier one already took (`a/b` and `a_b` both give `a_b`) gets `~1`, `~2`, ... so no output
/// overwrites another.
pub fn unique_file_names(names: &[&str]) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    names
        .iter()
        .map(|name| {
            let base = safe_file_name(name);
            let mut candidate = base.clone();
            let mut k = 1;
            while !taken.insert(candidate.clone()) {
                candidate = format!("{base}~{k}");
                k += 1;
            }
            candidate
        })
        .collect()
}

/// `base` with `suffix` appended (not replacing an extension: `logits.1` becomes `logits.1.npy`).
fn suffixed(base: &Path, suffix: &str) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The file [`write_value`] wrote for `base`: `base.npy`, `base.json` or the folder `base`.
pub fn find(base: &Path) -> Option<PathBuf> {
    [suffixed(base, ".npy"), suffixed(base, ".json")]
        .into_iter()
        .find(|p| p.is_file())
        .or_else(|| base.is_dir().then(|| base.to_owned()))
}

/// Writes `value` under `base` (a path without extension: `.npy`, `.json` or a folder is
/// added); returns the paths written (none for an empty optional).
pub fn write_value(base: &Path, value: &Value) -> Result<Vec<PathBuf>> {
    let io = |path: &Path, e: std::io::Error| Error::Io {
        path: path.to_owned(),
        source: e,
    };
    match value {
        Value::Host(t) => {
            let path = suffixed(base, ".npy");
            let bytes = match t.strings() {
                Some(s) => npy::encode_npy_strings(t.shape(), s),
                None => npy::encode_npy(t.elem_type(), t.shape(), t.bytes().unwrap_or_default()),
            }
            .map_err(|e| bad(&path, e))?;
            std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
            Ok(vec![path])
        }
        Value::Device(_) => Err(Error::InvalidInput(format!(
            "{}: a device tensor is copied to the host before it is written",
            base.display()
        ))),
        Value::Sequence(s) => {
            std::fs::create_dir_all(base).map_err(|e| io(base, e))?;
            let mut written = Vec::new();
            for (i, item) in s.items().iter().enumerate() {
                written.extend(write_value(&base.join(i.to_string()), item)?);
            }
            if written.is_empty() {
                written.push(base.to_owned());
            }
            Ok(written)
        }
        Value::Map(m) => {
            let path = suffixed(base, ".json");
            std::fs::write(&path, map_json(m)? + "\n").map_err(|e| io(&path, e))?;
            Ok(vec![path])
        }
        Value::Optional(Some(v)) => write_value(base, v),
        Value::Optional(None) => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_characters_are_replaced() {
        assert_eq!(safe_file_name("out/put:0"), "out_put_0");
        assert_eq!(safe_file_name("logits.1"), "logits.1");
        assert_eq!(safe_file_name(".."), "_..");
        assert_eq!(safe_file_name(""), "_");
    }

    #[test]
    fn values_round_trip_through_files() {
        let dir = std::env::temp_dir().join(format!("epx-valuefile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let words =
            Tensor::from_strings(&[2], vec![b"caf\xc3\xa9".to_vec(), b"".to_vec()]).unwrap();
        let scores = Tensor::from_array(ndarray::arr1(&[0.25f32, 0.75]));
        let labels = Tensor::from_array(ndarray::arr1(&[10i64, 2]));
        let map = Value::Map(Map::new(labels, scores.try_clone().unwrap()).unwrap());
        let seq = Value::Sequence(
            Sequence::of_tensors(ElementType::String, vec![words.try_clone().unwrap()]).unwrap(),
        );

        let f32_t = ValueType::Tensor {
            elem_type: Some(ElementType::Float),
            shape: None,
        };
        let str_t = ValueType::Tensor {
            elem_type: Some(ElementType::String),
            shape: None,
        };
        let map_t = ValueType::Map {
            key: ElementType::Int64,
            value: Box::new(f32_t),
        };
        let seq_t = ValueType::Sequence(Box::new(str_t.clone()));

        for (name, v, ty) in [
            ("words", Value::Host(words), str_t),
            ("map", map, map_t),
            ("seq", seq, seq_t),
        ] {
            let written = write_value(&dir.join(name), &v).unwrap();
            let path = if name == "seq" {
                dir.join(name)
            } else {
                written[0].clone()
            };
            assert_eq!(read_value(&path, &ty).unwrap(), v, "{name}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("map.json")).unwrap(),
            "{\"10\": 0.25, \"2\": 0.75}\n",
            "keys keep their order"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
