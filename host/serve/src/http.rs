//! The REST endpoints of the Open Inference Protocol:
//!
//! `GET /v2`, `/v2/health/live`, `/v2/health/ready`, `/v2/models/{m}[/versions/{v}]`,
//! `.../ready`, and `POST .../infer` (JSON, or a JSON header then binary tensor data, its length
//! in `Inference-Header-Content-Length`). Errors are `{"error": "..."}` with 400 (malformed or
//! not what the model takes), 404 (no such model or version), 413 (body over the limit), 503
//! (the model's queue is full) or 500 (the run failed). The statistics extension:
//! `GET /v2/models[/{m}[/versions/{v}]]/stats`. On the metrics listener: `GET /metrics`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use epx::{Environment, Value};
use serde_json::{Value as Json, json};

use crate::ServeOptions;
use crate::protocol::{self, ServeError};
use crate::repository::{Model, Repository};

/// The header that gives the JSON part's length in a request or response with binary data.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// The protocol extensions served.
const EXTENSIONS: [&str; 2] = ["binary_tensor_data", "statistics"];

struct Shared {
    repo: Repository,
}

/// A bound, loaded server.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    /// The Prometheus listener and its routes.
    metrics: Option<(tokio::net::TcpListener, Router)>,
}

impl Server {
    /// Loads the repository and binds the REST listener.
    pub async fn bind(env: Arc<Environment>, options: &ServeOptions) -> Result<Server, String> {
        let root = options.repository.clone();
        let repo = tokio::task::spawn_blocking(move || Repository::load(&env, &root))
            .await
            .map_err(|e| format!("loading the repository failed: {e}"))??;
        let listener = tokio::net::TcpListener::bind(options.http)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", options.http))?;
        let shared = Arc::new(Shared { repo });
        let metrics = match options.metrics {
            None => None,
            Some(at) => {
                let l = tokio::net::TcpListener::bind(at)
                    .await
                    .map_err(|e| format!("cannot listen on {at} for metrics: {e}"))?;
                let routes = Router::new()
                    .route("/metrics", get(prometheus))
                    .with_state(shared.clone());
                Some((l, routes))
            }
        };
        Ok(Server {
            listener,
            router: router(shared, options.max_body_bytes),
            metrics,
        })
    }

    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    pub fn address(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then lets the requests in flight finish.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let metrics = self.metrics.map(|(l, routes)| {
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                axum::serve(l, routes)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            })
        });
        let result = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(async move {
                shutdown.await;
                let _ = stop.send(true);
            })
            .await
            .map_err(|e| format!("the server stopped: {e}"));
        if let Some(task) = metrics {
            let _ = task.await;
        }
        result
    }
}

fn router(shared: Arc<Shared>, max_body: usize) -> Router {
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
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer_v))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(shared)
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status = match &self {
            ServeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServeError::NotFound(_) => StatusCode::NOT_FOUND,
            ServeError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServeError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ServeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
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
        "extensions": EXTENSIONS,
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
    match &result {
        Ok(_) => model.stats.success.add(arrived.elapsed()),
        Err(e) => {
            if matches!(e, ServeError::Busy(_)) {
                model.stats.rejected.fetch_add(1, Ordering::Relaxed);
            }
            model.stats.fail.add(arrived.elapsed());
        }
    }
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
    // Admission: a bounded number of requests wait or run per model; the next is refused.
    let _admitted = model.admitted.clone().try_acquire_owned().map_err(|_| {
        ServeError::Busy(format!(
            "model `{}` is at its limit of queued requests; retry later",
            model.name
        ))
    })?;
    let waiting = Instant::now();
    let _running = model
        .running
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ServeError::Internal("the model is shutting down".into()))?;
    model.stats.queue.add(waiting.elapsed());
    let runner = model.clone();
    let (id, wanted) = (request.id.clone(), request.outputs.clone());
    let outputs = tokio::task::spawn_blocking(move || {
        let inputs = request.inputs.into_iter().map(|(n, t)| (n, Value::Host(t)));
        let start = Instant::now();
        let out = runner.session.run(inputs);
        runner.stats.compute.add(start.elapsed());
        runner.stats.ran();
        out
    })
    .await
    .map_err(|e| ServeError::Internal(format!("the run stopped: {e}")))?
    .map_err(|e| ServeError::Internal(format!("model `{}`: {e}", model.name)))?;
    let mut binary = Vec::new();
    let mut entries = Vec::with_capacity(wanted.len());
    for o in &wanted {
        let tensor = outputs.get(&o.name).ok_or_else(|| {
            ServeError::Internal(format!(
                "output `{}` is not a tensor in host memory",
                o.name
            ))
        })?;
        entries.push(protocol::output_json(
            &o.name,
            tensor,
            o.binary,
            &mut binary,
        )?);
    }
    let mut answer = json!({
        "model_name": model.name,
        "model_version": model.version,
        "outputs": entries,
    });
    if let Some(id) = id {
        answer["id"] = Json::from(id);
    }
    let text = serde_json::to_vec(&answer)
        .map_err(|e| ServeError::Internal(format!("cannot write the response: {e}")))?;
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
