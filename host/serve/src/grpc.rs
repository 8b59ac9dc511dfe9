//! The gRPC side of the Open Inference Protocol: `inference.GRPCInferenceService` with the
//! protocol's calls (ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
//! ModelInfer) and those of the statistics and model repository extensions.
//!
//! A request's inputs come as typed lists (`contents`) or as raw little-endian bytes
//! (`raw_input_contents`), checked as strictly as REST's; outputs always go back as raw bytes,
//! which every datatype has (FP16 and BF16 have no typed list). Refusals map onto gRPC codes:
//! `INVALID_ARGUMENT` (malformed or not what the model takes), `NOT_FOUND` (no such model or
//! version), `RESOURCE_EXHAUSTED` (the model's queue is full), `INTERNAL` (the run failed); a
//! message over the size limit is refused by the transport before it is decoded.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use epx::{ElementType, Tensor, ValueSpec};
use tonic::{Request, Response, Status};

use crate::access::ApiGroup;
use crate::infer;
use crate::protocol::{self, ServeError, bad, datatype_of};
use crate::repository::Model;
use crate::server::Shared;

/// The protocol's messages and service, compiled from `proto/inference.proto`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("inference");
}

use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};

/// prost's codec, except that a message that does not decode is the client's error
/// (`INVALID_ARGUMENT`, naming what is wrong), not the server's (`INTERNAL`).
pub mod codec {
    use prost::Message;
    use tonic::codec::{BufferSettings, DecodeBuf};
    use tonic::{Code, Status};
    use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

    #[derive(Debug, Clone)]
    pub struct Codec<T, U>(ProstCodec<T, U>);

    impl<T, U> Default for Codec<T, U> {
        fn default() -> Self {
            Codec(ProstCodec::default())
        }
    }

    impl<T, U> tonic::codec::Codec for Codec<T, U>
    where
        T: Message + Send + 'static,
        U: Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ProstEncoder<T>;
        type Decoder = Decoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            self.0.encoder()
        }

        fn decoder(&mut self) -> Self::Decoder {
            Decoder(self.0.decoder())
        }
    }

    #[derive(Debug)]
    pub struct Decoder<U>(ProstDecoder<U>);

    impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
        type Item = U;
        type Error = Status;

        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
            self.0.decode(buf).map_err(|s| {
                if s.code() == Code::Internal {
                    Status::invalid_argument(format!(
                        "the message is not a valid protobuf message of this call: {}",
                        s.message()
                    ))
                } else {
                    s
                }
            })
        }

        fn buffer_settings(&self) -> BufferSettings {
            self.0.buffer_settings()
        }
    }
}

/// The calls one HTTP/2 connection may have open at once.
const STREAMS_PER_CONNECTION: u32 = 128;

/// Serves the gRPC service on `listener` until `done` resolves.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    done: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    let max = shared.max_body;
    let service = GrpcInferenceServiceServer::new(Service { shared })
        .max_decoding_message_size(max)
        .max_encoding_message_size(usize::MAX);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        // HTTP/2's own bounds: streams per connection, header block size, resets a client may
        // leave pending (the rapid-reset flood), and pings that find a peer gone.
        .max_concurrent_streams(STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(STREAMS_PER_CONNECTION as usize)
        .http2_max_header_list_size(16u32 << 10)
        .http2_max_pending_accept_reset_streams(Some(32))
        .http2_max_local_error_reset_streams(Some(256))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(60)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .serve_with_incoming_shutdown(service, incoming, done)
        .await
        .map_err(|e| format!("the gRPC listener stopped: {e}"))
}

struct Service {
    shared: Arc<Shared>,
}

impl Service {
    /// Refuses a call to a restricted API group that lacks the group's metadata key.
    fn allowed<T>(&self, group: ApiGroup, request: &Request<T>) -> Result<(), Status> {
        let metadata = request.metadata();
        self.shared
            .grpc_restricted
            .check(group, |k| metadata.get(k).and_then(|v| v.to_str().ok()))
            .map_err(status)
    }
}

fn status(e: ServeError) -> Status {
    match e {
        ServeError::BadRequest(m) => Status::invalid_argument(m),
        ServeError::NotFound(m) => Status::not_found(m),
        ServeError::Busy(m) => Status::resource_exhausted(m),
        ServeError::TooLarge(m) => Status::out_of_range(m),
        ServeError::Timeout(m) => Status::deadline_exceeded(m),
        ServeError::Internal(m) => Status::internal(m),
        ServeError::Forbidden(m) => Status::permission_denied(m),
    }
}

fn tensor_metadata(spec: &ValueSpec) -> pb::model_metadata_response::TensorMetadata {
    let (datatype, shape) = protocol::datatype_and_shape(spec);
    pb::model_metadata_response::TensorMetadata {
        name: spec.name.clone(),
        datatype: datatype.to_owned(),
        shape,
    }
}

fn duration(t: &crate::stats::Timed) -> Option<pb::StatisticDuration> {
    let (count, ns) = t.read();
    Some(pb::StatisticDuration { count, ns })
}

fn statistics(m: &Model) -> pb::ModelStatistics {
    let s = &m.stats;
    let (runs, _) = s.compute.read();
    pb::ModelStatistics {
        name: m.name.clone(),
        version: m.version.clone(),
        last_inference: s.last_inference_ms(),
        inference_count: s.inferences(),
        execution_count: runs,
        inference_stats: Some(pb::InferStatistics {
            success: duration(&s.success),
            fail: duration(&s.fail),
            queue: duration(&s.queue),
            compute_input: None,
            compute_infer: duration(&s.compute),
            compute_output: None,
        }),
        batch_stats: s
            .batch_sizes()
            .into_iter()
            .map(|(size, count, ns)| pb::InferBatchStatistics {
                batch_size: size as u64,
                compute_infer: Some(pb::StatisticDuration { count, ns }),
                ..Default::default()
            })
            .collect(),
    }
}

/// Refuses load or unload parameters other than `allowed`: a model loads from its folder as
/// it is.
fn no_parameters(
    repository: &str,
    parameters: &std::collections::HashMap<String, pb::ModelRepositoryParameter>,
    allowed: &[&str],
) -> Result<(), Status> {
    if !repository.is_empty() {
        return Err(Status::invalid_argument(format!(
            "epx serves one repository; leave repository_name empty (got `{repository}`)"
        )));
    }
    if let Some(key) = parameters.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(Status::invalid_argument(format!(
            "epx loads a model from its folder as it is; parameter `{key}` (a configuration or \
             files given with the request) is not taken"
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(
        &self,
        request: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        self.allowed(ApiGroup::Health, &request)?;
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        request: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        self.allowed(ApiGroup::Health, &request)?;
        let ready = self.shared.repo.all_ready();
        Ok(Response::new(pb::ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        self.allowed(ApiGroup::Health, &request)?;
        let r = request.into_inner();
        let ready = self.shared.repo.get(&r.name, Some(&r.version)).is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        request: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        self.allowed(ApiGroup::Metadata, &request)?;
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "epx".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: crate::server::EXTENSIONS.map(String::from).to_vec(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        self.allowed(ApiGroup::Metadata, &request)?;
        let r = request.into_inner();
        let m = self
            .shared
            .repo
            .get(&r.name, Some(&r.version))
            .map_err(status)?;
        Ok(Response::new(pb::ModelMetadataResponse {
            name: m.name.clone(),
            versions: vec![m.version.clone()],
            platform: "onnx".into(),
            inputs: m.inputs.iter().map(tensor_metadata).collect(),
            outputs: m.outputs.iter().map(tensor_metadata).collect(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        self.allowed(ApiGroup::Inference, &request)?;
        let r = request.into_inner();
        let model = self
            .shared
            .repo
            .get(&r.model_name, Some(&r.model_version))
            .map_err(status)?;
        // The message and the tensors it decodes to, from the in-flight budget, held while it
        // runs.
        let units =
            u32::try_from((2 * prost::Message::encoded_len(&r)).div_ceil(1024)).unwrap_or(u32::MAX);
        let _reserved = self
            .shared
            .inflight
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| {
                Status::resource_exhausted(
                    "the server holds as many request bytes as its --max-inflight-bytes allows: \
                     try again later",
                )
            })?;
        let arrived = Instant::now();
        let result = answer(&model, r).await;
        infer::count(&model, arrived, &result);
        result.map(Response::new).map_err(status)
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        self.allowed(ApiGroup::Statistics, &request)?;
        let r = request.into_inner();
        let model_stats = if r.name.is_empty() {
            self.shared
                .repo
                .ready()
                .iter()
                .map(|m| statistics(m))
                .collect()
        } else {
            let m = self
                .shared
                .repo
                .get(&r.name, Some(&r.version))
                .map_err(status)?;
            vec![statistics(&m)]
        };
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        self.allowed(ApiGroup::ModelRepository, &request)?;
        let r = request.into_inner();
        no_parameters(&r.repository_name, &Default::default(), &[])?;
        let models = self
            .shared
            .repo
            .index()
            .map_err(status)?
            .into_iter()
            .filter(|e| !r.ready || e.state == "READY")
            .map(|e| pb::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version.unwrap_or_default(),
                state: e.state.into(),
                reason: e.reason.unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        self.allowed(ApiGroup::ModelRepository, &request)?;
        self.shared.control.allow_change("load").map_err(status)?;
        let r = request.into_inner();
        no_parameters(&r.repository_name, &r.parameters, &[])?;
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.repo.load(&r.model_name))
            .await
            .map_err(|e| Status::internal(format!("the load stopped: {e}")))?
            .map_err(status)?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        self.allowed(ApiGroup::ModelRepository, &request)?;
        self.shared.control.allow_change("unload").map_err(status)?;
        let r = request.into_inner();
        // epx has no ensembles: a model has no dependents to unload with it.
        no_parameters(&r.repository_name, &r.parameters, &["unload_dependents"])?;
        self.shared.repo.unload(&r.model_name).map_err(status)?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }
}

/// Checks, runs and answers one ModelInfer request.
async fn answer(
    model: &Arc<Model>,
    r: pb::ModelInferRequest,
) -> Result<pb::ModelInferResponse, ServeError> {
    let timeout = timeout(&r.parameters)?;
    let (inputs, wanted) = parse(
        r.inputs,
        r.raw_input_contents,
        &r.outputs,
        &model.inputs,
        &model.outputs,
    )?;
    let outputs = infer::run(model, inputs, timeout).await?;
    let mut answer = pb::ModelInferResponse {
        model_name: model.name.clone(),
        model_version: model.version.clone(),
        id: r.id,
        ..Default::default()
    };
    for name in wanted {
        let tensor = outputs.get(&name)?;
        let datatype = protocol::output_datatype(&name, tensor)?;
        let mut raw = Vec::with_capacity(tensor.bytes().map_or(0, <[u8]>::len));
        protocol::output_raw(&name, tensor, &mut raw)?;
        answer
            .outputs
            .push(pb::model_infer_response::InferOutputTensor {
                shape: tensor.shape().iter().map(|&d| d as i64).collect(),
                name,
                datatype: datatype.into(),
                ..Default::default()
            });
        answer.raw_output_contents.push(raw);
    }
    Ok(answer)
}

/// The request's `timeout` parameter (µs), if given.
fn timeout(
    parameters: &std::collections::HashMap<String, pb::InferParameter>,
) -> Result<Option<std::time::Duration>, ServeError> {
    use pb::infer_parameter::ParameterChoice;
    match parameters
        .get("timeout")
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => Ok(None),
        Some(ParameterChoice::Int64Param(us)) if *us > 0 => {
            Ok(Some(std::time::Duration::from_micros(*us as u64)))
        }
        Some(ParameterChoice::Uint64Param(us)) if *us > 0 => {
            Ok(Some(std::time::Duration::from_micros(*us)))
        }
        Some(other) => Err(bad(format!(
            "parameter timeout must be a positive count of microseconds, got {other:?}"
        ))),
    }
}

/// Decodes a ModelInferRequest message and checks it against a model's inputs and outputs,
/// as the server does: the inputs as tensors and the outputs asked for. For fuzzing and tests.
#[allow(clippy::type_complexity)]
pub fn parse_request(
    message: &[u8],
    inputs: &[ValueSpec],
    outputs: &[ValueSpec],
) -> Result<(Vec<(String, Tensor)>, Vec<String>), ServeError> {
    use prost::Message as _;
    let r = pb::ModelInferRequest::decode(message)
        .map_err(|e| bad(format!("not a ModelInferRequest: {e}")))?;
    timeout(&r.parameters)?;
    parse(r.inputs, r.raw_input_contents, &r.outputs, inputs, outputs)
}

/// A ModelInfer request's inputs checked against the model's `specs`, and the outputs it asks
/// for (of `declared`).
#[allow(clippy::type_complexity)]
fn parse(
    inputs: Vec<pb::model_infer_request::InferInputTensor>,
    raw: Vec<Vec<u8>>,
    outputs: &[pb::model_infer_request::InferRequestedOutputTensor],
    specs: &[ValueSpec],
    declared: &[ValueSpec],
) -> Result<(Vec<(String, Tensor)>, Vec<String>), ServeError> {
    if !raw.is_empty() && raw.len() != inputs.len() {
        return Err(bad(format!(
            "raw_input_contents has {} entries for {} inputs: give every input's data there, in \
             the order of the inputs, or none",
            raw.len(),
            inputs.len()
        )));
    }
    let mut parsed: Vec<(String, Tensor)> = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.into_iter().enumerate() {
        let name = input.name;
        let spec = protocol::input_spec(&name, specs, &parsed)?;
        let (elem, shape, count) =
            protocol::check_head(&name, &input.datatype, &input.shape, spec)?;
        let tensor = match raw.get(i) {
            Some(bytes) => {
                if input
                    .contents
                    .as_ref()
                    .is_some_and(|c| typed_lists(c).iter().any(|(_, n)| *n > 0))
                {
                    return Err(bad(format!(
                        "input `{name}` has both contents and raw_input_contents"
                    )));
                }
                protocol::from_binary(&name, elem, &shape, count, bytes)?
            }
            None => from_contents(
                &name,
                elem,
                &shape,
                count,
                input.contents.unwrap_or_default(),
            )?,
        };
        parsed.push((name, tensor));
    }
    protocol::check_complete(specs, &parsed)?;
    let mut asked: Vec<protocol::RequestedOutput> = Vec::with_capacity(outputs.len());
    for o in outputs {
        let classification = o.parameters.contains_key("classification");
        protocol::check_output(&o.name, classification, declared, &asked)?;
        asked.push(protocol::RequestedOutput {
            name: o.name.clone(),
            binary: true,
        });
    }
    let wanted = if asked.is_empty() {
        declared.iter().map(|o| o.name.clone()).collect()
    } else {
        asked.into_iter().map(|o| o.name).collect()
    };
    Ok((parsed, wanted))
}

/// The typed lists of `c` by name, with their lengths.
fn typed_lists(c: &pb::InferTensorContents) -> [(&'static str, usize); 8] {
    [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ]
}

/// A tensor from the typed list its datatype uses: exactly `count` values, each in the
/// datatype's range, and every other list empty.
fn from_contents(
    name: &str,
    elem: ElementType,
    shape: &[usize],
    count: usize,
    c: pb::InferTensorContents,
) -> Result<Tensor, ServeError> {
    let datatype = datatype_of(elem).unwrap_or("?");
    let field = match elem {
        ElementType::Bool => "bool_contents",
        ElementType::Int8 | ElementType::Int16 | ElementType::Int32 => "int_contents",
        ElementType::Int64 => "int64_contents",
        ElementType::Uint8 | ElementType::Uint16 | ElementType::Uint32 => "uint_contents",
        ElementType::Uint64 => "uint64_contents",
        ElementType::Float => "fp32_contents",
        ElementType::Double => "fp64_contents",
        ElementType::String => "bytes_contents",
        _ => {
            return Err(bad(format!(
                "input `{name}`: {datatype} has no typed contents in the protocol; send its \
                 little-endian bytes in raw_input_contents"
            )));
        }
    };
    let mut given = 0;
    for (list, n) in typed_lists(&c) {
        if list == field {
            given = n;
        } else if n > 0 {
            return Err(bad(format!(
                "input `{name}`: {datatype} values go in {field}, but {list} holds {n}"
            )));
        }
    }
    if given != count {
        return Err(bad(format!(
            "input `{name}`: shape {shape:?} holds {count} elements but {field} has {given}"
        )));
    }
    if elem == ElementType::String {
        if let Some(i) = c
            .bytes_contents
            .iter()
            .position(|s| std::str::from_utf8(s).is_err())
        {
            return Err(bad(format!(
                "input `{name}`: BYTES element {i} is not UTF-8 (ONNX strings are UTF-8 text)"
            )));
        }
        return Tensor::from_strings(shape, c.bytes_contents)
            .map_err(|e| protocol::tensor_error(name, e));
    }
    let mut bytes = Vec::with_capacity(count * elem.byte_size().unwrap_or(0));
    macro_rules! narrow {
        ($list:expr, $t:ty) => {
            for (i, &v) in $list.iter().enumerate() {
                let x = <$t>::try_from(v).map_err(|_| {
                    bad(format!(
                        "input `{name}`: element {i} ({v}) is out of {datatype}'s range"
                    ))
                })?;
                bytes.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match elem {
        ElementType::Bool => bytes.extend(c.bool_contents.iter().map(|&b| u8::from(b))),
        ElementType::Int8 => narrow!(c.int_contents, i8),
        ElementType::Int16 => narrow!(c.int_contents, i16),
        ElementType::Int32 => narrow!(c.int_contents, i32),
        ElementType::Int64 => narrow!(c.int64_contents, i64),
        ElementType::Uint8 => narrow!(c.uint_contents, u8),
        ElementType::Uint16 => narrow!(c.uint_contents, u16),
        ElementType::Uint32 => narrow!(c.uint_contents, u32),
        ElementType::Uint64 => narrow!(c.uint64_contents, u64),
        ElementType::Float => narrow!(c.fp32_contents, f32),
        _ => narrow!(c.fp64_contents, f64),
    }
    Tensor::from_bytes(elem, shape, &bytes).map_err(|e| protocol::tensor_error(name, e))
}
