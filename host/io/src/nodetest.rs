//! The ONNX node tests' data sets: `test_data_set_N/input_K.pb` and `output_K.pb` next to a
//! case's `model.onnx`, each a `TensorProto` (or `SequenceProto`, `MapProto`, `OptionalProto`).

use std::path::{Path, PathBuf};

use epx::Value;
use epx::ir::ValueType;
use epx::onnx::load_value_bytes;

/// The data set folders of a case, in name order.
pub fn data_sets(case: &Path) -> Vec<PathBuf> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(case)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    sets.sort();
    sets
}

/// `input_K.pb` (or `output_K.pb`, per `prefix`) of a data set, named after the model's K-th
/// input (output) and read as its type; files that are not there are left out. An error is
/// one line.
pub fn read_data_set(
    set: &Path,
    prefix: &str,
    names: &[(String, ValueType)],
) -> Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
    for (k, (name, ty)) in names.iter().enumerate() {
        let path = set.join(format!("{prefix}_{k}.pb"));
        if !path.exists() {
            continue;
        }
        let bytes =
            crate::read_regular_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (_, v) = load_value_bytes(&bytes, ty, &format!("test data {prefix}_{k}.pb"))
            .map_err(|e| e.to_string().lines().next().unwrap_or("").to_string())?;
        out.push((name.clone(), v));
    }
    Ok(out)
}
