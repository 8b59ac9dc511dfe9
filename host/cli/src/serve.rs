//! `epx serve`: the Open Inference Protocol over a model repository (crate `epx-serve`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use epx::{Environment, Error, Result};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The model repository: DIR/<model>/<version>/model.onnx, with an optional
    /// DIR/<model>/config.toml (EPs or a policy, threads, instances, queue, batching, timeout;
    /// docs/serving.md).
    #[arg(long, value_name = "DIR")]
    model_repository: PathBuf,
    /// The REST port (0: any free port; the one taken is printed).
    #[arg(long, default_value_t = 8000)]
    http_port: u16,
    /// The gRPC port (`inference.GRPCInferenceService`; 0: any free port).
    #[arg(long, default_value_t = 8001)]
    grpc_port: u16,
    /// The Prometheus metrics port (`GET /metrics`; 0: any free port).
    #[arg(long, default_value_t = 8002)]
    metrics_port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: IpAddr,
    /// The largest request accepted, in bytes (larger: HTTP 413, gRPC OUT_OF_RANGE).
    #[arg(long, default_value_t = 64 << 20)]
    max_body_bytes: usize,
    /// Who loads and unloads models: `none` (every model loads at start; load and unload
    /// requests are refused), `explicit` (clients load and unload; only --load-model models
    /// load at start) or `poll` (the repository is read again every --repository-poll-secs).
    #[arg(long, default_value = "none", value_name = "MODE")]
    model_control_mode: epx_serve::access::ControlMode,
    /// With --model-control-mode explicit: a model to load at start (repeatable; `*`: all).
    #[arg(long = "load-model", value_name = "MODEL")]
    load_models: Vec<String>,
    /// With --model-control-mode poll: seconds between two reads of the repository.
    #[arg(long, default_value_t = 15, value_name = "S")]
    repository_poll_secs: u64,
    /// REST API groups answered only to requests with a header:
    /// `GROUP[,GROUP...]:KEY=VALUE`, groups health, metadata, inference, model-repository,
    /// statistics (repeatable; a group in one restriction only).
    #[arg(long = "http-restricted-api", value_name = "GROUPS:KEY=VALUE")]
    http_restricted: Vec<epx_serve::access::Restriction>,
    /// gRPC API groups answered only to calls with a metadata key, as --http-restricted-api.
    #[arg(long = "grpc-restricted-protocol", value_name = "GROUPS:KEY=VALUE")]
    grpc_restricted: Vec<epx_serve::access::Restriction>,
    /// The request bytes held at once over every request (bodies and what they decode to;
    /// past it: HTTP 503, gRPC RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 1 << 30, value_name = "BYTES")]
    max_inflight_bytes: usize,
    /// Seconds a client may take to send a request's headers, or stay idle between requests.
    #[arg(long, default_value_t = 15.0, value_name = "S")]
    header_timeout_secs: f64,
    /// Seconds a request's body may take to arrive (past it: HTTP 408).
    #[arg(long, default_value_t = 60.0, value_name = "S")]
    body_timeout_secs: f64,
    /// The most REST connections open at once (default: half the open-file limit less a
    /// reserve); at the cap the longest-idle connection is closed for a new one.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// The largest tensor a run may allocate (larger: HTTP 400, gRPC INVALID_ARGUMENT);
    /// EPX_MAX_TENSOR_BYTES, when set, wins.
    #[arg(long, default_value_t = 4 << 30, value_name = "BYTES")]
    max_tensor_bytes: u64,
}

fn seconds(flag: &str, s: f64) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "--{flag} must be a positive number of seconds, got {s}"
            ))
        })
}

pub fn serve(env: Arc<Environment>, args: ServeArgs) -> Result<()> {
    let options = epx_serve::ServeOptions {
        grpc: Some(SocketAddr::new(args.host, args.grpc_port)),
        metrics: Some(SocketAddr::new(args.host, args.metrics_port)),
        max_body_bytes: args.max_body_bytes,
        control: args.model_control_mode,
        load_models: args.load_models,
        poll_interval: std::time::Duration::from_secs(args.repository_poll_secs),
        http_restricted: args.http_restricted,
        grpc_restricted: args.grpc_restricted,
        max_inflight_bytes: args.max_inflight_bytes,
        header_timeout: seconds("header-timeout-secs", args.header_timeout_secs)?,
        body_timeout: seconds("body-timeout-secs", args.body_timeout_secs)?,
        max_connections: args.max_connections,
        max_tensor_bytes: args.max_tensor_bytes,
        ..epx_serve::ServeOptions::new(
            args.model_repository,
            SocketAddr::new(args.host, args.http_port),
        )
    };
    epx_serve::run(env, &options, |at| {
        println!(
            "epx serve: the Open Inference Protocol over HTTP at http://{}",
            at.http
        );
        if let Some(g) = at.grpc {
            println!("epx serve: the Open Inference Protocol over gRPC at {g}");
        }
        if let Some(m) = at.metrics {
            println!("epx serve: Prometheus metrics at http://{m}/metrics");
        }
    })
    .map_err(Error::InvalidInput)
}
