//! The listeners of `epx serve` and what they share: REST, gRPC and Prometheus metrics, each on
//! its own port, over one model repository.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use epx::Environment;
use tokio::net::TcpListener;

use crate::ServeOptions;
use crate::access::{ControlMode, Restrictions};
use crate::repository::Repository;

/// The protocol extensions served, over REST and gRPC alike.
pub const EXTENSIONS: [&str; 3] = ["binary_tensor_data", "statistics", "model_repository"];

/// What every endpoint reads.
pub(crate) struct Shared {
    pub repo: Repository,
    /// The largest request accepted, in bytes.
    pub max_body: usize,
    /// Who loads and unloads models.
    pub control: ControlMode,
    pub http_restricted: Restrictions,
    pub grpc_restricted: Restrictions,
    /// The in-flight budget, in units of 1 KiB: request bodies and what they decode to.
    pub inflight: Arc<tokio::sync::Semaphore>,
    /// How long a request's body may take to arrive.
    pub body_timeout: std::time::Duration,
}

/// The addresses a server listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub http: SocketAddr,
    pub grpc: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

/// A bound, loaded server.
pub struct Server {
    shared: Arc<Shared>,
    http: TcpListener,
    grpc: Option<TcpListener>,
    metrics: Option<TcpListener>,
    poll_interval: std::time::Duration,
    max_connections: usize,
    header_timeout: std::time::Duration,
}

async fn bind(at: SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(at)
        .await
        .map_err(|e| format!("cannot listen on {at} for {what}: {e}"))
}

fn address(l: &TcpListener) -> SocketAddr {
    l.local_addr().expect("a bound listener has an address")
}

impl Server {
    /// Loads the repository and binds the listeners.
    pub async fn bind(env: Arc<Environment>, options: &ServeOptions) -> Result<Server, String> {
        let http_restricted = Restrictions::new(options.http_restricted.clone())
            .map_err(|e| format!("--http-restricted-api: {e}"))?;
        let grpc_restricted = Restrictions::new(options.grpc_restricted.clone())
            .map_err(|e| format!("--grpc-restricted-protocol: {e}"))?;
        if options.control != ControlMode::Explicit && !options.load_models.is_empty() {
            return Err(format!(
                "--load-model needs --model-control-mode explicit (with `{}` every model \
                 of the repository loads at start)",
                options.control
            ));
        }
        if options.control == ControlMode::Poll && options.poll_interval.is_zero() {
            return Err("--repository-poll-secs must be at least 1".into());
        }
        let root = options.repository.clone();
        let startup = options.startup();
        let repo = tokio::task::spawn_blocking(move || Repository::open(&env, &root, &startup))
            .await
            .map_err(|e| format!("loading the repository failed: {e}"))??;
        let http = bind(options.http, "REST").await?;
        let grpc = match options.grpc {
            Some(at) => Some(bind(at, "gRPC").await?),
            None => None,
        };
        let metrics = match options.metrics {
            Some(at) => Some(bind(at, "metrics").await?),
            None => None,
        };
        Ok(Server {
            shared: Arc::new(Shared {
                repo,
                max_body: options.max_body_bytes,
                control: options.control,
                http_restricted,
                grpc_restricted,
                inflight: Arc::new(tokio::sync::Semaphore::new(
                    options.max_inflight_bytes.div_ceil(1024).max(1),
                )),
                body_timeout: options.body_timeout,
            }),
            http,
            grpc,
            metrics,
            poll_interval: options.poll_interval,
            max_connections: options
                .max_connections
                .unwrap_or_else(crate::listen::default_max_connections),
            header_timeout: options.header_timeout,
        })
    }

    pub fn listening(&self) -> Listening {
        Listening {
            http: address(&self.http),
            grpc: self.grpc.as_ref().map(address),
            metrics: self.metrics.as_ref().map(address),
        }
    }

    /// Serves until `shutdown` resolves; then every listener stops taking requests and those in
    /// flight finish.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let stopping = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let mut tasks = tokio::task::JoinSet::new();
        if self.shared.control == ControlMode::Poll {
            let shared = self.shared.clone();
            let (every, mut done) = (self.poll_interval, Box::pin(stopping()));
            tasks.spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticks.tick().await; // the first tick is now: the start just loaded everything
                loop {
                    tokio::select! {
                        () = &mut done => return Ok(()),
                        _ = ticks.tick() => {}
                    }
                    let shared = shared.clone();
                    match tokio::task::spawn_blocking(move || shared.repo.poll()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::error!("polling the model repository: {e}"),
                        Err(e) => tracing::error!("polling the model repository stopped: {e}"),
                    }
                }
            });
        }
        if let Some(l) = self.metrics {
            let routes = crate::http::metrics_router(self.shared.clone());
            let done = stopping();
            tasks.spawn(async move {
                axum::serve(l, routes)
                    .with_graceful_shutdown(done)
                    .await
                    .map_err(|e| format!("the metrics listener stopped: {e}"))
            });
        }
        if let Some(l) = self.grpc {
            let shared = self.shared.clone();
            let done = stopping();
            tasks.spawn(async move { crate::grpc::serve(shared, l, done).await });
        }
        let routes = crate::http::router(self.shared.clone(), self.shared.max_body);
        let done = stopping();
        let (cap, header_timeout) = (self.max_connections, self.header_timeout);
        tasks.spawn(async move {
            crate::listen::serve(self.http, routes, cap, header_timeout, done)
                .await
                .map_err(|e| format!("the REST listener stopped: {e}"))
        });
        // A listener that fails stops the others too.
        let mut result = tokio::select! {
            () = shutdown => Ok(()),
            Some(first) = tasks.join_next() => first.map_err(|e| e.to_string()).and_then(|r| r),
        };
        let _ = stop.send(true);
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done.map_err(|e| e.to_string()).and_then(|r| r) {
                result = result.and(Err(e));
            }
        }
        result
    }
}
