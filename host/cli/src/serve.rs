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
}

pub fn serve(env: Arc<Environment>, args: ServeArgs) -> Result<()> {
    let options = epx_serve::ServeOptions {
        repository: args.model_repository,
        http: SocketAddr::new(args.host, args.http_port),
        grpc: Some(SocketAddr::new(args.host, args.grpc_port)),
        metrics: Some(SocketAddr::new(args.host, args.metrics_port)),
        max_body_bytes: args.max_body_bytes,
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
