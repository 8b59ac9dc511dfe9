//! `epx serve`: the Open Inference Protocol (KServe v2) over a model repository, so that epx runs
//! behind the engines that scale model servers across machines.
//!
//! - [`protocol`]: datatypes, inference requests as JSON and binary tensor data, responses;
//! - [`repository`]: the model folder and loading;
//! - [`config`]: each model's `config.toml`;
//! - [`http`]: the REST endpoints, and Prometheus metrics on a port of their own;
//! - [`grpc`]: the gRPC service (`inference.GRPCInferenceService`);
//! - [`infer`]: one inference whatever the transport (admission, queue, run);
//! - [`server`]: the listeners;
//! - [`access`]: the model control mode and the restricted API groups;
//! - [`stats`]: per-model counters.
//!
//! A request is parsed and checked on the runtime's threads; the run itself goes to a blocking
//! thread once the model has a free instance. Each model admits at most `max_queue + instances`
//! requests at a time and refuses the next (HTTP 503, gRPC `RESOURCE_EXHAUSTED`), so memory is bounded by the limits, not by
//! the load.

pub mod access;
pub mod config;
pub mod grpc;
pub mod http;
mod infer;
mod listen;
pub mod protocol;
pub mod repository;
pub mod server;
pub mod stats;

pub use server::{Listening, Server};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use epx::Environment;

/// What `epx serve` is asked to do.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub repository: PathBuf,
    /// The REST listener (port 0: any free port).
    pub http: SocketAddr,
    /// The gRPC listener, if any.
    pub grpc: Option<SocketAddr>,
    /// The Prometheus listener (`GET /metrics`), if any.
    pub metrics: Option<SocketAddr>,
    /// The largest request accepted, in bytes (above: HTTP 413, gRPC `OUT_OF_RANGE`).
    pub max_body_bytes: usize,
    /// Who loads and unloads models (default: nobody; the models of the start are served).
    pub control: access::ControlMode,
    /// With [`ControlMode::Explicit`](access::ControlMode::Explicit): the models loaded at
    /// start (`*`: all); ignored otherwise, where every model loads.
    pub load_models: Vec<String>,
    /// With [`ControlMode::Poll`](access::ControlMode::Poll): how often the repository is read.
    pub poll_interval: std::time::Duration,
    /// REST API groups answered only to requests with a given header.
    pub http_restricted: Vec<access::Restriction>,
    /// gRPC API groups answered only to requests with given metadata.
    pub grpc_restricted: Vec<access::Restriction>,
    /// The request bytes held at once, over every request and connection (past it: HTTP 503,
    /// gRPC `RESOURCE_EXHAUSTED`).
    pub max_inflight_bytes: usize,
    /// How long a client may take to send a request's headers, or stay idle between requests.
    pub header_timeout: std::time::Duration,
    /// How long a request's body may take to arrive (past it: HTTP 408).
    pub body_timeout: std::time::Duration,
    /// The most REST connections open at once (default: half the file limit less a reserve);
    /// at the cap the longest-idle one is closed for a new one.
    pub max_connections: Option<usize>,
    /// The largest tensor a run may allocate (`run` sets it for the process unless
    /// `EPX_MAX_TENSOR_BYTES` is set); larger: 400 / `INVALID_ARGUMENT`.
    pub max_tensor_bytes: u64,
}

impl ServeOptions {
    /// Serves `repository` on `http` (REST only) with the defaults `epx serve` has.
    pub fn new(repository: PathBuf, http: SocketAddr) -> ServeOptions {
        ServeOptions {
            repository,
            http,
            grpc: None,
            metrics: None,
            max_body_bytes: 64 << 20,
            control: access::ControlMode::None,
            load_models: Vec::new(),
            poll_interval: std::time::Duration::from_secs(15),
            http_restricted: Vec::new(),
            grpc_restricted: Vec::new(),
            max_inflight_bytes: 1 << 30,
            header_timeout: listen::HEADER_TIMEOUT,
            body_timeout: std::time::Duration::from_secs(60),
            max_connections: None,
            max_tensor_bytes: 4 << 30,
        }
    }

    /// The models to load at start.
    pub fn startup(&self) -> repository::Startup {
        if self.control == access::ControlMode::Explicit
            && !self.load_models.iter().any(|m| m == "*")
        {
            repository::Startup::Named(self.load_models.clone())
        } else {
            repository::Startup::All
        }
    }
}

/// Loads the repository and serves it until SIGTERM or Ctrl-C, after which requests in flight
/// finish and new connections are refused; `started` gets the listeners' addresses first.
pub fn run(
    env: Arc<Environment>,
    options: &ServeOptions,
    started: impl FnOnce(Listening),
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("epx-serve")
        .build()
        .map_err(|e| format!("cannot start the server's runtime: {e}"))?;
    listen::raise_file_limit();
    if std::env::var_os("EPX_MAX_TENSOR_BYTES").is_none() {
        epx::set_max_tensor_bytes(options.max_tensor_bytes);
    }
    runtime.block_on(async {
        let server = Server::bind(env, options).await?;
        started(server.listening());
        server.serve(shutdown_signal()).await
    })
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down: finishing the requests in flight");
}
