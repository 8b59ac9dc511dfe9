//! The REST listener's connections, bounded: a deadline for each request's headers (which is
//! also how long a kept-alive connection may sit idle), a cap on open connections below the
//! process's file limit, and, at the cap, the longest-idle connection closed to make room, so
//! that idle or slow clients cannot lock a good one out.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::ServiceExt;

/// How long a client may take to send a request's headers, and stay idle between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(15);

/// The file descriptors kept free of client connections: the listeners, the metrics port's
/// clients, model files, plugin libraries and the runtime's own.
pub const FILE_RESERVE: usize = 128;

/// The most connections served at once when `--max-connections` is not given: the process's
/// file limit less [`FILE_RESERVE`], split between REST and gRPC.
pub fn default_max_connections() -> usize {
    let files = file_limit().unwrap_or(1024);
    (files.saturating_sub(FILE_RESERVE) / 2).max(16)
}

/// The soft limit on open files (`RLIMIT_NOFILE`).
pub fn file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    ok.then(|| usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX))
}

/// Raises the soft limit on open files to the hard one (what a server that holds a connection
/// per client needs; the hard limit is the administrator's).
pub fn raise_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit through a valid pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// One open connection, as the cap sees it.
struct Open {
    /// Requests being answered on it.
    busy: Arc<AtomicUsize>,
    /// When it last finished a request (or opened).
    idle_since: Arc<Mutex<Instant>>,
    /// Closes it.
    close: Arc<Notify>,
}

/// The open connections.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<u64, Open>>,
    next: AtomicUsize,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes room for one more under `cap`: closes the connection idle longest. False when every
    /// connection is answering a request.
    fn make_room(&self, cap: usize) -> bool {
        let open = self.lock();
        if open.len() < cap {
            return true;
        }
        let idle = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|c| *c.idle_since.lock().unwrap_or_else(|p| p.into_inner()));
        match idle {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Counts a request on its connection while it is answered.
struct Busy {
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
}

impl Busy {
    fn new(busy: &Arc<AtomicUsize>, idle_since: &Arc<Mutex<Instant>>) -> Busy {
        busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            busy: busy.clone(),
            idle_since: idle_since.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The answer to a connection past the cap when every open one is busy.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 66\r\n\r\n\
{\"error\":\"the server is at its connection limit: try again later\"}";

/// Serves `routes` on `listener` (HTTP/1.1) until `done` resolves; connections in flight then
/// finish their current request.
pub(crate) async fn serve(
    listener: TcpListener,
    routes: Router,
    max_connections: usize,
    header_timeout: Duration,
    done: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    let connections = Arc::new(Connections::default());
    let mut tasks = tokio::task::JoinSet::new();
    let mut done = std::pin::pin!(done);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    loop {
        let accepted = tokio::select! {
            () = &mut done => break,
            a = listener.accept() => a,
        };
        // Reap finished connection tasks so that the set does not grow.
        while tasks.try_join_next().is_some() {}
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors or a connection reset before it was taken: wait a moment
                // rather than spin, and go on.
                tracing::warn!("REST: accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if !connections.make_room(max_connections) {
            tasks.spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(FULL)).await;
            });
            continue;
        }
        let id = connections.next.fetch_add(1, Ordering::Relaxed) as u64;
        let busy = Arc::new(AtomicUsize::new(0));
        let idle_since = Arc::new(Mutex::new(Instant::now()));
        let close = Arc::new(Notify::new());
        connections.lock().insert(
            id,
            Open {
                busy: busy.clone(),
                idle_since: idle_since.clone(),
                close: close.clone(),
            },
        );
        let routes = routes.clone();
        let connections = connections.clone();
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let counted = Busy::new(&busy, &idle_since);
                let routes = routes.clone();
                async move {
                    let answer = routes.oneshot(request.map(axum::body::Body::new)).await;
                    drop(counted);
                    answer
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(64 << 10)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let stopping = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            tokio::select! {
                _ = connection.as_mut() => {}
                () = close.notified() => {}
                () = stopping => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            connections.lock().remove(&id);
        });
    }
    let _ = stop.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}
