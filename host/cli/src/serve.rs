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
