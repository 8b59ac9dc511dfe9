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
use serde_json::value::RawValue;
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
struct RequestJson<'a> {
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Json>,
    #[serde(borrow)]
    inputs: Vec<InputJson<'a>>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
struct InputJson<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Json>,
    /// The data's text, decoded once the datatype and shape are known (straight into the
    /// tensor's bytes: a JSON request costs its body and its tensors, nothing per element).
    #[serde(borrow)]
    data: Option<&'a RawValue>,
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
    input: &InputJson<'_>,
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
            let mut elements = JsonElements::new(name, elem, count);
            let walked = serde::de::DeserializeSeed::deserialize(
                &mut elements,
                &mut serde_json::Deserializer::from_str(data.get()),
            );
            if let Some(e) = elements.failed.take() {
                return Err(e);
            }
            walked.map_err(|e| bad(format!("input `{name}`: data is not JSON: {e}")))?;
            if elements.seen != count {
                return Err(bad(format!(
                    "input `{name}`: shape {shape:?} holds {count} elements but data has {}",
                    elements.seen
                )));
            }
            elements.finish(&shape)?
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

/// A tensor built from JSON data as it is read: nested arrays of scalars, each checked to be a
/// value of `elem` and written to the tensor's bytes at once. Elements past `count` are counted,
/// not kept, so that the refusal can say how many there were.
struct JsonElements<'n> {
    name: &'n str,
    elem: ElementType,
    count: usize,
    /// Elements read so far.
    seen: usize,
    bytes: Vec<u8>,
    strings: Vec<Vec<u8>>,
    /// Why the data was refused (the walk stops with a placeholder error).
    failed: Option<ServeError>,
}

/// How deep arrays may nest in an input's data.
const MAX_DATA_DEPTH: usize = 64;

impl<'n> JsonElements<'n> {
    fn new(name: &'n str, elem: ElementType, count: usize) -> JsonElements<'n> {
        let size = elem.byte_size().unwrap_or(0);
        // Reserved up to 1 Mi elements: a shape's count is the client's claim until the data
        // bears it out.
        let reserve = count.min(1 << 20);
        JsonElements {
            name,
            elem,
            count,
            seen: 0,
            bytes: Vec::with_capacity(reserve * size),
            strings: if elem == ElementType::String {
                Vec::with_capacity(reserve)
            } else {
                Vec::new()
            },
            failed: None,
        }
    }

    /// Takes scalar `v`, the next element.
    fn push(&mut self, v: &Json) -> Result<(), ServeError> {
        let i = self.seen;
        self.seen += 1;
        if i >= self.count {
            return Ok(());
        }
        let (name, elem) = (self.name, self.elem);
        let wrong = || {
            bad(format!(
                "input `{name}`: element {i} ({v}) is not a {} value",
                datatype_of(elem).unwrap_or("?")
            ))
        };
        let bytes = &mut self.bytes;
        macro_rules! int {
            ($t:ty) => {{
                let x = if let Some(x) = v.as_i64() {
                    <$t>::try_from(x).ok()
                } else {
                    v.as_u64().and_then(|x| <$t>::try_from(x).ok())
                };
                bytes.extend_from_slice(&x.ok_or_else(wrong)?.to_le_bytes());
            }};
        }
        match elem {
            ElementType::String => {
                let text = v.as_str().ok_or_else(wrong)?;
                self.strings.push(text.as_bytes().to_vec());
            }
            ElementType::Bool => bytes.push(u8::from(v.as_bool().ok_or_else(wrong)?)),
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
                let x = v.as_f64().ok_or_else(wrong)?;
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
            _ => return Err(wrong()),
        }
        Ok(())
    }

    fn finish(self, shape: &[usize]) -> Result<Tensor, ServeError> {
        if self.elem == ElementType::String {
            return Tensor::from_strings(shape, self.strings)
                .map_err(|e| tensor_error(self.name, e));
        }
        Tensor::from_bytes(self.elem, shape, &self.bytes).map_err(|e| tensor_error(self.name, e))
    }

    /// Records why the data is refused and stops the walk.
    fn refuse<E: serde::de::Error>(&mut self, why: ServeError) -> E {
        self.failed = Some(why);
        E::custom("refused")
    }

    fn scalar<E: serde::de::Error>(&mut self, v: Json) -> Result<(), E> {
        self.push(&v).map_err(|why| self.refuse(why))
    }
}

/// The walk of one value of the data (a scalar, or an array at `depth`).
struct Level<'e, 'n> {
    elements: &'e mut JsonElements<'n>,
    depth: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for &mut JsonElements<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(Level {
            elements: self,
            depth: 0,
        })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Level<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Level<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("values, or arrays of them")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.elements.scalar(Json::from(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.elements.scalar(Json::from(v))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.elements.scalar(Json::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.elements.scalar(Json::from(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.elements.scalar(Json::from(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        let name = self.elements.name;
        Err(self
            .elements
            .refuse(bad(format!("input `{name}`: data holds null, not a value"))))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        let name = self.elements.name;
        Err(self.elements.refuse(bad(format!(
            "input `{name}`: data holds an object, not a value"
        ))))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= MAX_DATA_DEPTH {
            let name = self.elements.name;
            return Err(self.elements.refuse(bad(format!(
                "input `{name}`: data nests arrays deeper than {MAX_DATA_DEPTH}"
            ))));
        }
        while seq
            .next_element_seed(Level {
                elements: &mut *self.elements,
                depth: self.depth + 1,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// One output of a response: its metadata, and its data as JSON or its size as binary data
/// (the bytes appended to the response's binary part). Written straight from the tensor when
/// serialized: the text is the only copy a JSON answer makes.
#[derive(serde::Serialize)]
pub struct OutputEntry<'t> {
    name: &'t str,
    datatype: &'static str,
    shape: &'t [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Json>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonData<'t>>,
}

/// A tensor's elements as a JSON array, each written as it is serialized.
pub struct JsonData<'t>(&'t Tensor);

impl serde::Serialize for JsonData<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tensor = self.0;
        match tensor.elem_type() {
            // Checked UTF-8 by `output_json`.
            ElementType::String => s.collect_seq(
                tensor
                    .strings()
                    .unwrap_or(&[])
                    .iter()
                    .map(|b| std::str::from_utf8(b).unwrap_or("")),
            ),
            ElementType::Float => s.collect_seq(floats::<f32>(tensor).map(f64::from)),
            ElementType::Double => s.collect_seq(floats::<f64>(tensor)),
            ElementType::Float16 => s.collect_seq(floats::<f16>(tensor).map(f64::from)),
            ElementType::Bfloat16 => s.collect_seq(floats::<bf16>(tensor).map(f64::from)),
            ElementType::Bool => s.collect_seq(floats::<bool>(tensor)),
            ElementType::Uint8 => s.collect_seq(floats::<u8>(tensor)),
            ElementType::Uint16 => s.collect_seq(floats::<u16>(tensor)),
            ElementType::Uint32 => s.collect_seq(floats::<u32>(tensor)),
            ElementType::Uint64 => s.collect_seq(floats::<u64>(tensor)),
            ElementType::Int8 => s.collect_seq(floats::<i8>(tensor)),
            ElementType::Int16 => s.collect_seq(floats::<i16>(tensor)),
            ElementType::Int32 => s.collect_seq(floats::<i32>(tensor)),
            _ => s.collect_seq(floats::<i64>(tensor)),
        }
    }
}

/// One output of a response, checked to be expressible: with `binary`, its bytes appended to
/// `out`; otherwise its elements as JSON (refused when JSON cannot carry them).
pub fn output_json<'t>(
    name: &'t str,
    tensor: &'t Tensor,
    binary: bool,
    out: &mut Vec<u8>,
) -> Result<OutputEntry<'t>, ServeError> {
    let datatype = output_datatype(name, tensor)?;
    let mut entry = OutputEntry {
        name,
        datatype,
        shape: tensor.shape(),
        parameters: None,
        data: None,
    };
    if binary {
        let start = out.len();
        output_raw(name, tensor, out)?;
        entry.parameters = Some(json!({"binary_data_size": out.len() - start}));
        return Ok(entry);
    }
    let expressible = match tensor.elem_type() {
        ElementType::String => tensor
            .strings()
            .unwrap_or(&[])
            .iter()
            .all(|s| std::str::from_utf8(s).is_ok()),
        ElementType::Float => floats::<f32>(tensor).all(f32::is_finite),
        ElementType::Double => floats::<f64>(tensor).all(f64::is_finite),
        ElementType::Float16 => floats::<f16>(tensor).all(f16::is_finite),
        ElementType::Bfloat16 => floats::<bf16>(tensor).all(bf16::is_finite),
        _ => true,
    };
    if !expressible {
        let what = if tensor.elem_type() == ElementType::String {
            "a string that is not UTF-8"
        } else {
            "NaN or infinity"
        };
        return Err(ServeError::BadRequest(format!(
            "output `{name}` holds {what}, which JSON cannot carry: ask for it as binary data \
             (the output's parameter binary_data: true)"
        )));
    }
    entry.data = Some(JsonData(tensor));
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
        let Err(refused) = output_json("s", &tensor, false, &mut out) else {
            panic!("a string that is not UTF-8 went as JSON")
        };
        let ServeError::BadRequest(message) = refused else {
            panic!("expected a 400, got {refused:?}")
        };
        assert!(
            message.contains("not UTF-8") && message.contains("binary_data: true"),
            "{message}"
        );
        let entry = output_json("s", &tensor, true, &mut out).unwrap();
        let entry = serde_json::to_value(&entry).unwrap();
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
            serde_json::to_value(output_json("s", &text, false, &mut out).unwrap()).unwrap()["data"],
            json!(["ünï"])
        );
    }
}
