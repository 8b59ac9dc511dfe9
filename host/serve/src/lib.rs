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
//! - [`stats`]: per-model counters.
//!
//! A request is parsed and checked on the runtime's threads; the run itself goes to a blocking
//! thread once the model has a free instance. Each model admits at most `max_queue + instances`
//! requests at a time and refuses the next (HTTP 503, gRPC `RESOURCE_EXHAUSTED`), so memory is bounded by the limits, not by
//! the load.

pub mod config;
pub mod grpc;
pub mod http;
mod infer;
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
