//! The Open Inference Protocol's tensors: its datatype names, inference requests as JSON with
//! the binary tensor data extension, and responses.
//!
//! A request is checked whole against the model before anything runs: every input named once and
//! declared by the model, its datatype the declared element type, its shape the declared rank and
//! fixed extents, its data exactly as many elements as the shape holds, each a value of the
//! datatype (an integer in range, a bool, a string); binary data exactly the bytes the shapes
//! need, no more and no fewer. Each refusal names the input and what is wrong.

use epx::{ElementType, Tensor, ValueSpec};
use half::{bf16, f16};
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

/// A request refused, or a failure while serving it: the HTTP status it maps to and the message
/// the client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeError {
    /// Malformed or inconsistent with the model (HTTP 400, gRPC `INVALID_ARGUMENT`).
    BadRequest(String),
    /// No such model or version (HTTP 404, gRPC `NOT_FOUND`).
    NotFound(String),
    /// The model's queue is full (HTTP 503, gRPC `RESOURCE_EXHAUSTED`).
    Busy(String),
    /// The body is larger than the server accepts (HTTP 413).
    TooLarge(String),
    /// No answer by the request's deadline (HTTP 504, gRPC `DEADLINE_EXCEEDED`).
    Timeout(String),
    /// The run failed (HTTP 500, gRPC `INTERNAL`).
    Internal(String),
    /// Not allowed on this server: a restricted API without its header, or a load or unload
    /// the model control mode refuses (HTTP 403, gRPC `PERMISSION_DENIED`).
    Forbidden(String),
}

impl ServeError {
    pub fn message(&self) -> &str {
        match self {
            ServeError::BadRequest(m)
            | ServeError::NotFound(m)
            | ServeError::Busy(m)
            | ServeError::TooLarge(m)
            | ServeError::Timeout(m)
            | ServeError::Internal(m)
            | ServeError::Forbidden(m) => m,
        }
    }
}

pub(crate) fn bad(msg: impl Into<String>) -> ServeError {
    ServeError::BadRequest(msg.into())
}

/// The protocol's name of an element type, where it has one.
pub fn datatype_of(t: ElementType) -> Option<&'static str> {
    Some(match t {
        ElementType::Bool => "BOOL",
        ElementType::Uint8 => "UINT8",
        ElementType::Uint16 => "UINT16",
        ElementType::Uint32 => "UINT32",
        ElementType::Uint64 => "UINT64",
        ElementType::Int8 => "INT8",
        ElementType::Int16 => "INT16",
        ElementType::Int32 => "INT32",
        ElementType::Int64 => "INT64",
        ElementType::Float16 => "FP16",
        ElementType::Float => "FP32",
        ElementType::Double => "FP64",
        ElementType::Bfloat16 => "BF16",
        ElementType::String => "BYTES",
        _ => return None,
    })
}

/// The element type the protocol's datatype name stands for.
pub fn element_of(datatype: &str) -> Option<ElementType> {
    Some(match datatype {
        "BOOL" => ElementType::Bool,
        "UINT8" => ElementType::Uint8,
        "UINT16" => ElementType::Uint16,
        "UINT32" => ElementType::Uint32,
        "UINT64" => ElementType::Uint64,
        "INT8" => ElementType::Int8,
        "INT16" => ElementType::Int16,
        "INT32" => ElementType::Int32,
        "INT64" => ElementType::Int64,
        "FP16" => ElementType::Float16,
        "FP32" => ElementType::Float,
        "FP64" => ElementType::Double,
        "BF16" => ElementType::Bfloat16,
        "BYTES" => ElementType::String,
        _ => return None,
    })
}

/// The protocol's metadata of a model input or output: `{"name", "datatype", "shape"}`, dynamic
/// extents as -1.
pub fn tensor_metadata(spec: &ValueSpec) -> Json {
    let (datatype, shape) = datatype_and_shape(spec);
    json!({"name": spec.name, "datatype": datatype, "shape": shape})
}

/// The datatype name and shape (dynamic extents as -1) the protocol gives a model's input or
/// output.
pub fn datatype_and_shape(spec: &ValueSpec) -> (&'static str, Vec<i64>) {
    let datatype = spec
        .elem_type
        .and_then(datatype_of)
        .unwrap_or("UNSUPPORTED");
    let shape: Vec<i64> = match &spec.shape {
        Some(dims) => dims
            .iter()
            .map(|d| d.and_then(|d| i64::try_from(d).ok()).unwrap_or(-1))
            .collect(),
        None => vec![-1],
    };
    (datatype, shape)
}

#[derive(Deserialize)]
struct RequestJson {
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Json>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Json>,
    data: Option<Json>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Json>,
}

/// An output a request asks for, and whether it comes back as binary data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedOutput {
    pub name: String,
    pub binary: bool,
}

/// An inference request, checked against the model.
#[derive(Debug)]
pub struct InferRequest {
    pub id: Option<String>,
    /// The inputs, in the request's order.
    pub inputs: Vec<(String, Tensor)>,
    /// The outputs to return, in the order to return them.
    pub outputs: Vec<RequestedOutput>,
    /// The request's `timeout` parameter (given in µs).
    pub timeout: Option<std::time::Duration>,
}

/// Parses an inference request's body: JSON, or (with `header_len`, the value of
/// `Inference-Header-Content-Length`) a JSON header of that many bytes followed by the inputs'
/// binary data. `inputs` and `outputs` are the model's.
pub fn parse_infer(
    body: &[u8],
    header_len: Option<usize>,
    inputs: &[ValueSpec],
    outputs: &[ValueSpec],
) -> Result<InferRequest, ServeError> {
    let (header, mut binary) = match header_len {
        Some(n) if n > body.len() => {
            return Err(bad(format!(
                "Inference-Header-Content-Length is {n} but the body holds {} bytes",
                body.len()
            )));
        }
        Some(n) => body.split_at(n),
        None => (body, &[][..]),
    };
    let req: RequestJson = serde_json::from_slice(header).map_err(|e| {
        bad(format!(
            "the request is not an inference request's JSON: {e}"
        ))
    })?;
    let mut parsed = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        let spec = input_spec(&input.name, inputs, &parsed)?;
        let tensor = parse_input(input, spec, &mut binary)?;
        parsed.push((input.name.clone(), tensor));
    }
    if !binary.is_empty() {
        return Err(bad(format!(
            "{} bytes of binary data follow the header that no input's binary_data_size accounts for",
            binary.len()
        )));
    }
    check_complete(inputs, &parsed)?;
    let all_binary = flag(&req.parameters, "binary_data_output")?.unwrap_or(false);
    let requested = match &req.outputs {
        None => outputs
            .iter()
            .map(|o| RequestedOutput {
                name: o.name.clone(),
                binary: all_binary,
            })
            .collect(),
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for o in list {
                check_output(
                    &o.name,
                    o.parameters.contains_key("classification"),
                    outputs,
                    &out,
                )?;
                let binary = flag(&o.parameters, "binary_data")?.unwrap_or(all_binary);
                out.push(RequestedOutput {
                    name: o.name.clone(),
                    binary,
                });
            }
            out
        }
    };
    let timeout = match req.parameters.get("timeout") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&us| us > 0)
                .map(std::time::Duration::from_micros)
                .ok_or_else(|| {
                    bad(format!(
                        "parameter timeout must be a positive count of microseconds, got {v}"
                    ))
                })?,
        ),
    };
    Ok(InferRequest {
        id: req.id,
        inputs: parsed,
        outputs: requested,
        timeout,
    })
}

/// The model's declaration of input `name`, refusing a name it lacks or one `parsed` already
/// holds.
pub(crate) fn input_spec<'a>(
    name: &str,
    inputs: &'a [ValueSpec],
    parsed: &[(String, Tensor)],
) -> Result<&'a ValueSpec, ServeError> {
    if parsed.iter().any(|(n, _)| n == name) {
        return Err(bad(format!("input `{name}` is given twice")));
    }
    inputs.iter().find(|s| s.name == name).ok_or_else(|| {
        bad(format!(
            "the model has no input `{name}` (its inputs: {})",
            names(inputs)
        ))
    })
}

/// Refuses a request that lacks one of the model's inputs.
pub(crate) fn check_complete(
    inputs: &[ValueSpec],
    parsed: &[(String, Tensor)],
) -> Result<(), ServeError> {
    let missing: Vec<&str> = inputs
        .iter()
        .filter(|s| !parsed.iter().any(|(n, _)| *n == s.name))
        .map(|s| s.name.as_str())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(bad(format!(
        "the request lacks the model's input(s) {}",
        missing.join(", ")
    )))
}

/// Refuses an output the model lacks, one asked for twice, or one asked for with the
/// classification extension's parameter (not served).
pub(crate) fn check_output(
    name: &str,
    classification: bool,
    outputs: &[ValueSpec],
    asked: &[RequestedOutput],
) -> Result<(), ServeError> {
    if classification {
        return Err(bad(format!(
            "output `{name}`: the classification extension is not served; ask for the output \
             itself"
        )));
    }
    if !outputs.iter().any(|s| s.name == name) {
        return Err(bad(format!(
            "the model has no output `{name}` (its outputs: {})",
            names(outputs)
        )));
    }
    if asked.iter().any(|r| r.name == name) {
        return Err(bad(format!("output `{name}` is asked for twice")));
    }
    Ok(())
}

fn names(specs: &[ValueSpec]) -> String {
    specs
        .iter()
        .map(|s| format!("`{}`", s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A bool parameter, if present.
fn flag(params: &Map<String, Json>, key: &str) -> Result<Option<bool>, ServeError> {
    match params.get(key) {
        None => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(format!(
            "parameter {key} must be true or false, got {other}"
        ))),
    }
}

/// One input: checked against its spec, its data from JSON or from the front of `binary`.
fn parse_input(
    input: &InputJson,
    spec: &ValueSpec,
    binary: &mut &[u8],
) -> Result<Tensor, ServeError> {
    let name = &input.name;
    let (elem, shape, count) = check_head(name, &input.datatype, &input.shape, spec)?;
    let binary_size = match input.parameters.get("binary_data_size") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    bad(format!(
                        "input `{name}`: binary_data_size must be a byte count, got {v}"
                    ))
                })?,
        ),
    };
    let tensor = match (binary_size, &input.data) {
        (Some(_), Some(_)) => {
            return Err(bad(format!(
                "input `{name}` has both data and binary_data_size"
            )));
        }
        (None, None) => return Err(bad(format!("input `{name}` has no data"))),
        (Some(size), None) => {
            if size > binary.len() {
                return Err(bad(format!(
                    "input `{name}`: binary_data_size is {size} but only {} bytes of binary data are left",
                    binary.len()
                )));
            }
            let (mine, rest) = binary.split_at(size);
            *binary = rest;
            from_binary(name, elem, &shape, count, mine)?
        }
        (None, Some(data)) => {
            let mut flat = Vec::with_capacity(count.min(1 << 20));
            flatten(data, &mut flat, name)?;
            if flat.len() != count {
                return Err(bad(format!(
                    "input `{name}`: shape {shape:?} holds {count} elements but data has {}",
                    flat.len()
                )));
            }
            from_json(name, elem, &shape, &flat)?
        }
    };
    Ok(tensor)
}

/// An input's datatype and shape checked against the model's declaration: its element type,
/// extents and element count.
pub(crate) fn check_head(
    name: &str,
    datatype: &str,
    shape_in: &[i64],
    spec: &ValueSpec,
) -> Result<(ElementType, Vec<usize>, usize), ServeError> {
    let elem = element_of(datatype).ok_or_else(|| {
        bad(format!(
            "input `{name}`: unknown datatype {:?} (the protocol's are BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BF16, BYTES)",
            datatype
        ))
    })?;
    let declared = spec.elem_type;
    if declared != Some(elem) {
        let want = declared
            .and_then(datatype_of)
            .unwrap_or("a type the protocol lacks");
        return Err(bad(format!(
            "input `{name}`: datatype {} but the model declares {want}",
            datatype
        )));
    }
    let shape = shape_in
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| {
            bad(format!(
                "input `{name}`: negative extent in shape {:?}",
                shape_in
            ))
        })?;
    if let Some(dims) = &spec.shape {
        let fits = dims.len() == shape.len()
            && dims
                .iter()
                .zip(&shape)
                .all(|(d, &s)| d.is_none_or(|d| d == s as u64));
        if !fits {
            return Err(bad(format!(
                "input `{name}`: shape {shape:?} does not fit the model's {}",
                tensor_metadata(spec)["shape"]
            )));
        }
    }
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("input `{name}`: shape {shape:?} overflows")))?;
    Ok((elem, shape, count))
}

/// The scalars of `data` in row-major order (nested arrays flattened).
fn flatten<'a>(data: &'a Json, out: &mut Vec<&'a Json>, name: &str) -> Result<(), ServeError> {
    match data {
        Json::Array(items) => {
            for item in items {
                flatten(item, out, name)?;
            }
            Ok(())
        }
        Json::Object(_) | Json::Null => Err(bad(format!(
            "input `{name}`: data holds {data}, not a value"
        ))),
        _ => {
            out.push(data);
            Ok(())
        }
    }
}

pub(crate) fn tensor_error(name: &str, e: epx::Error) -> ServeError {
    bad(format!("input `{name}`: {e}"))
}

/// A tensor from the binary tensor data extension's bytes: little-endian elements, or (BYTES)
/// each element's 4-byte little-endian length and its bytes.
pub(crate) fn from_binary(
    name: &str,
    elem: ElementType,
    shape: &[usize],
    count: usize,
    bytes: &[u8],
) -> Result<Tensor, ServeError> {
    if elem == ElementType::String {
        let mut strings = Vec::with_capacity(count.min(1 << 20));
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some((len, tail)) = rest.split_first_chunk::<4>() else {
                return Err(bad(format!(
                    "input `{name}`: BYTES element {} has a partial length prefix",
                    strings.len()
                )));
            };
            let len = u32::from_le_bytes(*len) as usize;
            if len > tail.len() {
                return Err(bad(format!(
                    "input `{name}`: BYTES element {} says {len} bytes but {} are left",
                    strings.len(),
                    tail.len()
                )));
            }
            if std::str::from_utf8(&tail[..len]).is_err() {
                return Err(bad(format!(
                    "input `{name}`: BYTES element {} is not UTF-8 (ONNX strings are UTF-8 text)",
                    strings.len()
                )));
            }
            strings.push(tail[..len].to_vec());
            rest = &tail[len..];
        }
        if strings.len() != count {
            return Err(bad(format!(
                "input `{name}`: shape {shape:?} holds {count} elements but the binary data has {}",
                strings.len()
            )));
        }
        return Tensor::from_strings(shape, strings).map_err(|e| tensor_error(name, e));
    }
    let size = elem.byte_size().unwrap_or(0);
    if Some(bytes.len()) != count.checked_mul(size) {
        return Err(bad(format!(
            "input `{name}`: shape {shape:?} of {} needs {} bytes but binary_data_size is {}",
            datatype_of(elem).unwrap_or("?"),
            count.saturating_mul(size),
            bytes.len()
        )));
    }
    if elem == ElementType::Bool
        && let Some(i) = bytes.iter().position(|&b| b > 1)
    {
        return Err(bad(format!(
            "input `{name}`: BOOL element {i} is byte {}, not 0 or 1",
            bytes[i]
        )));
    }
    Tensor::from_bytes(elem, shape, bytes).map_err(|e| tensor_error(name, e))
}

/// A tensor from JSON scalars, each checked to be a value of `elem`.
fn from_json(
    name: &str,
    elem: ElementType,
    shape: &[usize],
    flat: &[&Json],
) -> Result<Tensor, ServeError> {
    let wrong = |i: usize, v: &Json| {
        bad(format!(
            "input `{name}`: element {i} ({v}) is not a {} value",
            datatype_of(elem).unwrap_or("?")
        ))
    };
    if elem == ElementType::String {
        let strings = flat
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(|s| s.as_bytes().to_vec())
                    .ok_or_else(|| wrong(i, v))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Tensor::from_strings(shape, strings).map_err(|e| tensor_error(name, e));
    }
    let size = elem.byte_size().unwrap_or(0);
    let mut bytes = Vec::with_capacity(flat.len() * size);
    for (i, v) in flat.iter().enumerate() {
        macro_rules! int {
            ($t:ty) => {{
                let x = if let Some(x) = v.as_i64() {
                    <$t>::try_from(x).ok()
                } else {
                    v.as_u64().and_then(|x| <$t>::try_from(x).ok())
                };
                bytes.extend_from_slice(&x.ok_or_else(|| wrong(i, v))?.to_le_bytes());
            }};
        }
        match elem {
            ElementType::Bool => bytes.push(u8::from(v.as_bool().ok_or_else(|| wrong(i, v))?)),
            ElementType::Uint8 => int!(u8),
            ElementType::Uint16 => int!(u16),
            ElementType::Uint32 => int!(u32),
            ElementType::Uint64 => int!(u64),
            ElementType::Int8 => int!(i8),
            ElementType::Int16 => int!(i16),
            ElementType::Int32 => int!(i32),
            ElementType::Int64 => int!(i64),
            ElementType::Float16
            | ElementType::Bfloat16
            | ElementType::Float
            | ElementType::Double => {
                let x = v.as_f64().ok_or_else(|| wrong(i, v))?;
                match elem {
                    ElementType::Float16 => {
                        bytes.extend_from_slice(&f16::from_f64(x).to_le_bytes())
                    }
                    ElementType::Bfloat16 => {
                        bytes.extend_from_slice(&bf16::from_f64(x).to_le_bytes())
                    }
                    ElementType::Float => bytes.extend_from_slice(&(x as f32).to_le_bytes()),
                    _ => bytes.extend_from_slice(&x.to_le_bytes()),
                }
            }
            _ => return Err(wrong(i, v)),
        }
    }
    Tensor::from_bytes(elem, shape, &bytes).map_err(|e| tensor_error(name, e))
}

/// One output of a response: its metadata (with `data`, or `binary_data_size` and its bytes
/// appended to `binary`).
pub fn output_json(
    name: &str,
    tensor: &Tensor,
    binary: bool,
    out: &mut Vec<u8>,
) -> Result<Json, ServeError> {
    let elem = tensor.elem_type();
    let datatype = output_datatype(name, tensor)?;
    let mut entry = json!({"name": name, "datatype": datatype, "shape": tensor.shape()});
    if binary {
        let start = out.len();
        output_raw(name, tensor, out)?;
        entry["parameters"] = json!({"binary_data_size": out.len() - start});
        return Ok(entry);
    }
    let non_finite = || {
        ServeError::BadRequest(format!(
            "output `{name}` holds NaN or infinity, which JSON cannot carry: ask for it as binary \
             data (the output's parameter binary_data: true)"
        ))
    };
    let data: Vec<Json> = match elem {
        ElementType::String => tensor
            .strings()
            .unwrap_or(&[])
            .iter()
            .map(|s| match std::str::from_utf8(s) {
                Ok(text) => Ok(Json::from(text)),
                Err(_) => Err(ServeError::BadRequest(format!(
                    "output `{name}` holds a string that is not UTF-8, which JSON cannot carry: \
                     ask for it as binary data (the output's parameter binary_data: true)"
                ))),
            })
            .collect::<Result<_, _>>()?,
        ElementType::Float | ElementType::Double | ElementType::Float16 | ElementType::Bfloat16 => {
            let values: Vec<f64> = match elem {
                ElementType::Float => floats::<f32>(tensor).map(f64::from).collect(),
                ElementType::Double => floats::<f64>(tensor).collect(),
                ElementType::Float16 => floats::<f16>(tensor).map(f64::from).collect(),
                _ => floats::<bf16>(tensor).map(f64::from).collect(),
            };
            if values.iter().any(|v| !v.is_finite()) {
                return Err(non_finite());
            }
            values.into_iter().map(Json::from).collect()
        }
        ElementType::Bool => floats::<bool>(tensor).map(Json::from).collect(),
        ElementType::Uint8 => floats::<u8>(tensor).map(Json::from).collect(),
        ElementType::Uint16 => floats::<u16>(tensor).map(Json::from).collect(),
        ElementType::Uint32 => floats::<u32>(tensor).map(Json::from).collect(),
        ElementType::Uint64 => floats::<u64>(tensor).map(Json::from).collect(),
        ElementType::Int8 => floats::<i8>(tensor).map(Json::from).collect(),
        ElementType::Int16 => floats::<i16>(tensor).map(Json::from).collect(),
        ElementType::Int32 => floats::<i32>(tensor).map(Json::from).collect(),
        _ => floats::<i64>(tensor).map(Json::from).collect(),
    };
    entry["data"] = Json::Array(data);
    Ok(entry)
}

/// The protocol's datatype of output `name`, or why it has none.
pub(crate) fn output_datatype(name: &str, tensor: &Tensor) -> Result<&'static str, ServeError> {
    let elem = tensor.elem_type();
    datatype_of(elem).ok_or_else(|| {
        ServeError::Internal(format!(
            "output `{name}` has element type {}, which the protocol has no datatype for",
            elem.onnx_name()
        ))
    })
}

/// Appends the elements of output `name` to `out` as the binary tensor data extension lays them
/// out: little-endian, or (BYTES) each element's 4-byte little-endian length, then its bytes.
pub(crate) fn output_raw(name: &str, tensor: &Tensor, out: &mut Vec<u8>) -> Result<(), ServeError> {
    if let Some(strings) = tensor.strings() {
        for s in strings {
            let len = u32::try_from(s.len()).map_err(|_| {
                ServeError::Internal(format!("output `{name}`: a string over 4 GiB"))
            })?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(s);
        }
    } else {
        out.extend_from_slice(tensor.bytes().unwrap_or(&[]));
    }
    Ok(())
}

/// The elements of `tensor` as `T` (its element type), copied out.
fn floats<T: epx::TensorElement + Copy>(tensor: &Tensor) -> impl Iterator<Item = T> + '_ {
    tensor.as_slice::<T>().unwrap_or(&[]).iter().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_output_that_is_not_utf8_goes_only_as_binary_data() {
        let tensor = Tensor::from_strings(&[2], vec![b"ok".to_vec(), vec![0xff, 0x41]]).unwrap();
        let mut out = Vec::new();
        let refused = output_json("s", &tensor, false, &mut out).unwrap_err();
        let ServeError::BadRequest(message) = refused else {
            panic!("expected a 400, got {refused:?}")
        };
        assert!(
            message.contains("not UTF-8") && message.contains("binary_data: true"),
            "{message}"
        );
        let entry = output_json("s", &tensor, true, &mut out).unwrap();
        assert_eq!(entry["parameters"]["binary_data_size"], 4 + 2 + 4 + 2);
        assert_eq!(
            out,
            [
                &2u32.to_le_bytes()[..],
                b"ok",
                &2u32.to_le_bytes(),
                &[0xff, 0x41]
            ]
            .concat()
        );
        // UTF-8 text still goes as JSON strings.
        let text = Tensor::from_strings(&[1], vec!["ünï".as_bytes().to_vec()]).unwrap();
        assert_eq!(
            output_json("s", &text, false, &mut out).unwrap()["data"],
            json!(["ünï"])
        );
    }
}
