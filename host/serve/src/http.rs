//! The REST endpoints of the Open Inference Protocol:
//!
//! `GET /v2`, `/v2/health/live`, `/v2/health/ready`, `/v2/models/{m}[/versions/{v}]`,
//! `.../ready`, and `POST .../infer` (JSON, or a JSON header then binary tensor data, its length
//! in `Inference-Header-Content-Length`). Errors are `{"error": "..."}` with 400 (malformed or
//! not what the model takes), 403 (a restricted API group without its header, a load or unload
//! the model control mode refuses), 404 (no such model or version), 413 (body over the limit),
//! 503 (the model's queue is full) or 500 (the run failed). The statistics extension:
//! `GET /v2/models[/{m}[/versions/{v}]]/stats`. On the metrics listener: `GET /metrics`.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value as Json, json};

use crate::access::ApiGroup;
use crate::infer;
use crate::protocol::{self, ServeError};
use crate::repository::Model;
use crate::server::Shared;

/// The header that gives the JSON part's length in a request or response with binary data.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// The Prometheus listener's routes.
pub(crate) fn metrics_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(prometheus))
        .with_state(shared)
}

/// The REST routes.
pub(crate) fn router(shared: Arc<Shared>, max_body: usize) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{model}", get(model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(model_metadata_v),
        )
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready_v),
        )
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/models/{model}/stats", get(model_stats))
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(model_stats_v),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{model}/load", post(load))
        .route("/v2/repository/models/{model}/unload", post(unload))
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer_v))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            bounded_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            restricted,
        ))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(shared)
}

/// Every error as `{"error": "..."}`: the router's own refusals (a path whose parameters are not
/// UTF-8, a method the path does not take) come as plain text and are wrapped here.
async fn json_errors(answer: Response) -> Response {
    let status = answer.status();
    let is_json = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let mut message = String::from_utf8_lossy(&text).trim().to_owned();
    if message.is_empty() {
        message = status
            .canonical_reason()
            .unwrap_or("the request was refused")
            .to_owned();
    }
    let mut wrapped = (status, axum::Json(json!({"error": message}))).into_response();
    for (k, v) in &parts.headers {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            wrapped.headers_mut().insert(k, v.clone());
        }
    }
    wrapped
}

/// Bytes of the in-flight budget per permit (a semaphore takes at most `u32::MAX` at once).
const BUDGET_UNIT: usize = 1024;

/// Reads a request's body before any handler sees it, within bounds: a declared length over
/// `--max-body-bytes` is refused (413) before a byte of it is read; the body (twice over: the
/// bytes and what they decode to) is reserved from the server's in-flight budget, refused with
/// 503 when the budget is spent; a body that is not complete by the body deadline gets 408.
/// The reservation is held until the answer is made.
async fn bounded_body(
    State(s): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use http_body_util::BodyExt;
    let (parts, mut body) = request.into_parts();
    let declared = match parts.headers.get(header::CONTENT_LENGTH) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|t| t.trim().parse::<usize>().ok()) {
            Some(n) => Some(n),
            None => {
                return ServeError::BadRequest(format!("Content-Length {v:?} is not a byte count"))
                    .into_response();
            }
        },
    };
    let too_large = |n: usize| {
        ServeError::TooLarge(format!(
            "the body is {n} bytes or more, over this server's --max-body-bytes {}",
            s.max_body
        ))
        .into_response()
    };
    if let Some(n) = declared.filter(|&n| n > s.max_body) {
        return too_large(n);
    }
    let units = |bytes: usize| u32::try_from((2 * bytes).div_ceil(BUDGET_UNIT)).unwrap_or(u32::MAX);
    let spent = || {
        ServeError::Busy(
            "the server holds as many request bytes as its --max-inflight-bytes allows: try \
             again later"
                .into(),
        )
        .into_response()
    };
    let mut reserved = match s
        .inflight
        .clone()
        .try_acquire_many_owned(units(declared.unwrap_or(0)))
    {
        Ok(p) => p,
        Err(_) => return spent(),
    };
    let deadline = tokio::time::Instant::now() + s.body_timeout;
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return (
                    StatusCode::REQUEST_TIMEOUT,
                    axum::Json(json!({"error": format!(
                        "the body did not arrive within {} s",
                        s.body_timeout.as_secs_f64()
                    )})),
                )
                    .into_response();
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return ServeError::BadRequest(format!("reading the body failed: {e}"))
                    .into_response();
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if bytes.len() + data.len() > s.max_body {
            return too_large(bytes.len() + data.len());
        }
        bytes.extend_from_slice(&data);
        // A body longer than it said, or of no stated length, reserves as it grows.
        let want = units(bytes.len());
        let have = reserved.num_permits() as u32;
        if want > have {
            match s.inflight.clone().try_acquire_many_owned(want - have) {
                Ok(more) => reserved.merge(more),
                Err(_) => return spent(),
            }
        }
    }
    let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
    let answer = next.run(request).await;
    drop(reserved);
    answer
}

/// The API group of a REST path, `None` for a path of none (answered 404).
fn group_of(path: &str) -> Option<ApiGroup> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // What follows a model (and its version): nothing, `ready`, `stats` or `infer`.
    let tail = |rest: &[&str]| match rest {
        [] => Some(ApiGroup::Metadata),
        ["ready"] => Some(ApiGroup::Health),
        ["stats"] => Some(ApiGroup::Statistics),
        ["infer"] => Some(ApiGroup::Inference),
        _ => None,
    };
    match parts.as_slice() {
        ["v2"] => Some(ApiGroup::Metadata),
        ["v2", "health", ..] => Some(ApiGroup::Health),
        ["v2", "repository", ..] => Some(ApiGroup::ModelRepository),
        ["v2", "models", "stats"] => Some(ApiGroup::Statistics),
        ["v2", "models", _, "versions", _, rest @ ..] => tail(rest),
        ["v2", "models", _, rest @ ..] => tail(rest),
        _ => None,
    }
}

/// Refuses a request to a restricted API group that lacks the group's header, before its body
/// is read.
async fn restricted(
    State(s): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(group) = group_of(request.uri().path()) {
        let headers = request.headers();
        if let Err(e) = s
            .http_restricted
            .check(group, |k| headers.get(k).and_then(|v| v.to_str().ok()))
        {
            return e.into_response();
        }
    }
    next.run(request).await
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status = match &self {
            ServeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServeError::NotFound(_) => StatusCode::NOT_FOUND,
            ServeError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServeError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ServeError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ServeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ServeError::Forbidden(_) => StatusCode::FORBIDDEN,
        };
        (status, axum::Json(json!({"error": self.message()}))).into_response()
    }
}

async fn not_found() -> ServeError {
    ServeError::NotFound("no such endpoint of the Open Inference Protocol".into())
}

async fn server_metadata() -> axum::Json<Json> {
    axum::Json(json!({
        "name": "epx",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": crate::server::EXTENSIONS,
    }))
}

async fn live() -> StatusCode {
    StatusCode::OK
}

/// Ready when every model of the repository loaded.
async fn ready(State(s): State<Arc<Shared>>) -> StatusCode {
    if s.repo.all_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn metadata(model: &Model) -> Json {
    json!({
        "name": model.name,
        "versions": [model.version],
        "platform": "onnx",
        "inputs": model.inputs.iter().map(protocol::tensor_metadata).collect::<Vec<_>>(),
        "outputs": model.outputs.iter().map(protocol::tensor_metadata).collect::<Vec<_>>(),
    })
}

async fn model_metadata(
    State(s): State<Arc<Shared>>,
    Path(model): Path<String>,
) -> Result<axum::Json<Json>, ServeError> {
    let model = s.repo.get(&model, None)?;
    Ok(axum::Json(metadata(&model)))
}

async fn model_metadata_v(
    State(s): State<Arc<Shared>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<axum::Json<Json>, ServeError> {
    let model = s.repo.get(&model, Some(&version))?;
    Ok(axum::Json(metadata(&model)))
}

async fn model_ready(
    State(s): State<Arc<Shared>>,
    Path(model): Path<String>,
) -> Result<StatusCode, ServeError> {
    s.repo.get(&model, None).map(|_| StatusCode::OK)
}

async fn model_ready_v(
    State(s): State<Arc<Shared>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<StatusCode, ServeError> {
    s.repo.get(&model, Some(&version)).map(|_| StatusCode::OK)
}

/// Prometheus' text format: every loaded model's counters.
async fn prometheus(State(s): State<Arc<Shared>>) -> Response {
    let mut text = String::new();
    crate::stats::prometheus_header(&mut text);
    for m in s.repo.ready() {
        m.stats.prometheus(&m.name, &m.version, &mut text);
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

async fn all_stats(State(s): State<Arc<Shared>>) -> axum::Json<Json> {
    let stats: Vec<Json> = s
        .repo
        .ready()
        .iter()
        .map(|m| m.stats.json(&m.name, &m.version))
        .collect();
    axum::Json(json!({"model_stats": stats}))
}

async fn model_stats(
    State(s): State<Arc<Shared>>,
    Path(model): Path<String>,
) -> Result<axum::Json<Json>, ServeError> {
    let m = s.repo.get(&model, None)?;
    Ok(axum::Json(
        json!({"model_stats": [m.stats.json(&m.name, &m.version)]}),
    ))
}

async fn model_stats_v(
    State(s): State<Arc<Shared>>,
    Path((model, version)): Path<(String, String)>,
) -> Result<axum::Json<Json>, ServeError> {
    let m = s.repo.get(&model, Some(&version))?;
    Ok(axum::Json(
        json!({"model_stats": [m.stats.json(&m.name, &m.version)]}),
    ))
}

/// A repository request's body: empty, or JSON with the given keys and `parameters`, of which
/// only `allowed` are taken.
fn repository_body(body: &[u8], keys: &[&str], allowed: &[&str]) -> Result<Json, ServeError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let value: Json = serde_json::from_slice(body)
        .map_err(|e| ServeError::BadRequest(format!("the body is not JSON: {e}")))?;
    let Json::Object(fields) = &value else {
        return Err(ServeError::BadRequest(format!(
            "the body must be a JSON object, got {value}"
        )));
    };
    for (key, v) in fields {
        if key == "parameters" {
            let given = v.as_object().ok_or_else(|| {
                ServeError::BadRequest(format!("`parameters` must be an object, got {v}"))
            })?;
            if let Some(first) = given.keys().find(|k| !allowed.contains(&k.as_str())) {
                return Err(ServeError::BadRequest(format!(
                    "epx loads a model from its folder as it is; parameter `{first}` (a \
                     configuration or files given with the request) is not taken"
                )));
            }
        } else if !keys.contains(&key.as_str()) {
            return Err(ServeError::BadRequest(format!(
                "unknown key `{key}` (this request takes {})",
                keys.iter()
                    .chain(&["parameters"])
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(value)
}

/// The repository extension's index: every model folder with its state.
async fn repository_index(
    State(s): State<Arc<Shared>>,
    body: Bytes,
) -> Result<axum::Json<Json>, ServeError> {
    let request = repository_body(&body, &["ready"], &[])?;
    let only_ready = match request.get("ready") {
        None => false,
        Some(Json::Bool(b)) => *b,
        Some(other) => {
            return Err(ServeError::BadRequest(format!(
                "`ready` must be true or false, got {other}"
            )));
        }
    };
    let index: Vec<Json> = s
        .repo
        .index()?
        .into_iter()
        .filter(|e| !only_ready || e.state == "READY")
        .map(|e| {
            let mut j = json!({"name": e.name, "state": e.state});
            if let Some(v) = e.version {
                j["version"] = Json::from(v);
            }
            if let Some(r) = e.reason {
                j["reason"] = Json::from(r);
            }
            j
        })
        .collect();
    Ok(axum::Json(Json::Array(index)))
}

/// Loads (or reloads) a model from its folder.
async fn load(
    State(s): State<Arc<Shared>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Json>, ServeError> {
    s.control.allow_change("load")?;
    repository_body(&body, &[], &[])?;
    tokio::task::spawn_blocking(move || s.repo.load(&model))
        .await
        .map_err(|e| ServeError::Internal(format!("the load stopped: {e}")))??;
    Ok(axum::Json(json!({})))
}

async fn unload(
    State(s): State<Arc<Shared>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Json>, ServeError> {
    s.control.allow_change("unload")?;
    // epx has no ensembles: a model has no dependents to unload with it.
    repository_body(&body, &[], &["unload_dependents"])?;
    s.repo.unload(&model)?;
    Ok(axum::Json(json!({})))
}

async fn infer(
    State(s): State<Arc<Shared>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServeError> {
    let model = s.repo.get(&model, None)?;
    run_infer(model, &headers, body).await
}

async fn infer_v(
    State(s): State<Arc<Shared>>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServeError> {
    let model = s.repo.get(&model, Some(&version))?;
    run_infer(model, &headers, body).await
}

/// [`answer`], counted in the model's statistics.
async fn run_infer(
    model: Arc<Model>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ServeError> {
    let arrived = Instant::now();
    let result = answer(&model, headers, body).await;
    infer::count(&model, arrived, &result);
    result
}

/// Parses, admits, runs and answers one inference request.
async fn answer(
    model: &Arc<Model>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ServeError> {
    let header_len = match headers.get(HEADER_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    ServeError::BadRequest(format!(
                        "Inference-Header-Content-Length must be a byte count, got {v:?}"
                    ))
                })?,
        ),
    };
    let request = protocol::parse_infer(&body, header_len, &model.inputs, &model.outputs)?;
    drop(body);
    let (id, wanted) = (request.id, request.outputs);
    let outputs = infer::run(model, request.inputs, request.timeout).await?;
    let mut binary = Vec::new();
    let mut entries = Vec::with_capacity(wanted.len());
    for o in &wanted {
        let tensor = outputs.get(&o.name)?;
        entries.push(protocol::output_json(
            &o.name,
            tensor,
            o.binary,
            &mut binary,
        )?);
    }
    #[derive(serde::Serialize)]
    struct Answer<'a> {
        model_name: &'a str,
        model_version: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        outputs: Vec<protocol::OutputEntry<'a>>,
    }
    let answer = Answer {
        model_name: &model.name,
        model_version: &model.version,
        id,
        outputs: entries,
    };
    let text = serde_json::to_vec(&answer)
        .map_err(|e| ServeError::Internal(format!("cannot write the response: {e}")))?;
    drop(answer);
    if binary.is_empty() {
        return Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            text,
        )
            .into_response());
    }
    let json_len = text.len();
    let mut body = text;
    body.extend_from_slice(&binary);
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::HeaderName::from_static(HEADER_LENGTH),
                HeaderValue::from(json_len),
            ),
        ],
        body,
    )
        .into_response())
}
