//! One inference, whatever the transport: admission against the model's limits, the wait for a
//! free instance (or a place in a batch), the run on a blocking thread with the request's
//! deadline, and the statistics of each.
//!
//! **Dynamic batching.** A model with `max_batch_size` > 0 and `[dynamic_batching]` has a
//! batcher task. Requests queue to it; it takes the first, then the next ones whose inputs
//! stack with it (the same extents past the first) until the batch holds `max_batch_size` rows,
//! reaches a preferred size with nothing more queued, or the first request has waited
//! `max_queue_delay_us`. It then waits for a free instance, adds what queued meanwhile (up to
//! the limit), runs the stacked inputs once and hands each request its own rows of every
//! output. A request whose client left (deadline passed, connection closed) before its batch
//! formed is dropped from it.
//!
//! **Deadlines.** A request's deadline is the model's `timeout_ms` or the request's `timeout`
//! parameter (µs), whichever is sooner. Past it, the request is answered with a timeout error
//! and its run, if it was running alone, is cancelled through the run's terminate flag; a batch
//! runs on for its other requests. A request whose client goes away cancels its run the same
//! way.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use epx::{ElementType, RunOptions, SessionOutputs, Tensor, Value};
use tokio::sync::{mpsc, oneshot};

use crate::protocol::{ServeError, bad};
use crate::repository::Model;

/// A request's outputs: the whole run's (alone) or its own rows of a batch's.
pub(crate) enum Answer {
    Whole(SessionOutputs),
    Rows(Vec<(String, Tensor)>),
}

impl Answer {
    /// The output `name`, which must be a tensor in host memory.
    pub(crate) fn get(&self, name: &str) -> Result<&Tensor, ServeError> {
        let found = match self {
            Answer::Whole(out) => out.get(name),
            Answer::Rows(rows) => rows.iter().find(|(n, _)| n == name).map(|(_, t)| t),
        };
        found.ok_or_else(|| {
            ServeError::Internal(format!("output `{name}` is not a tensor in host memory"))
        })
    }
}

/// A request waiting for its batch.
pub(crate) struct Pending {
    /// The inputs in the model's order.
    inputs: Vec<(String, Tensor)>,
    rows: usize,
    queued: Instant,
    reply: oneshot::Sender<Result<Answer, ServeError>>,
}

/// The batcher's queue of a model.
pub(crate) type BatchQueue = mpsc::UnboundedSender<Pending>;

/// Runs `inputs` (checked against the model) once the model admits the request and has a free
/// instance, by `deadline` if given. A model at its limit of queued requests refuses at once
/// with [`ServeError::Busy`]: what waits is bounded by the limits, not by the load.
pub(crate) async fn run(
    model: &Arc<Model>,
    mut inputs: Vec<(String, Tensor)>,
    timeout: Option<Duration>,
) -> Result<Answer, ServeError> {
    let rows = batch_rows(model, &inputs)?;
    let _admitted = model.admitted.clone().try_acquire_owned().map_err(|_| {
        ServeError::Busy(format!(
            "model `{}` is at its limit of queued requests; retry later",
            model.name
        ))
    })?;
    let timeout = match (timeout, model.timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let work = async {
        if let Some(rows) = rows
            && let Some(queue) = model.batch_queue()
        {
            // The model's order, so that requests stack input by input.
            inputs.sort_by_key(|(n, _)| model.inputs.iter().position(|s| s.name == *n));
            let (reply, answer) = oneshot::channel();
            let queued = Instant::now();
            queue
                .send(Pending {
                    inputs,
                    rows,
                    queued,
                    reply,
                })
                .map_err(|_| ServeError::Internal("the model's batcher stopped".into()))?;
            return answer
                .await
                .map_err(|_| ServeError::Internal("the model's batcher stopped".into()))?;
        }
        alone(model, inputs, rows.unwrap_or(1)).await
    };
    match deadline {
        None => work.await,
        Some(at) => tokio::time::timeout_at(at, work).await.unwrap_or_else(|_| {
            Err(ServeError::Timeout(format!(
                "model `{}`: no answer within {} ms",
                model.name,
                timeout.unwrap_or_default().as_millis()
            )))
        }),
    }
}

/// Cancels a run when dropped before [`Cancel::done`]: the request's future was dropped (its
/// deadline passed, or its client went away).
struct Cancel(Option<RunOptions>);

impl Cancel {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if let Some(o) = &self.0 {
            o.set_terminate(true);
        }
    }
}

/// One request's own run.
async fn alone(
    model: &Arc<Model>,
    inputs: Vec<(String, Tensor)>,
    rows: usize,
) -> Result<Answer, ServeError> {
    let waiting = Instant::now();
    let _running = model
        .running
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ServeError::Internal("the model is shutting down".into()))?;
    model.stats.queue.add(waiting.elapsed());
    let options = RunOptions::new();
    let cancel = Cancel(Some(options.clone()));
    let runner = model.clone();
    let out = model
        .workers
        .run(move || {
            let inputs = inputs.into_iter().map(|(n, t)| (n, Value::Host(t)));
            let start = Instant::now();
            let out = runner.session.run_with_options(inputs, Some(&options));
            runner.stats.computed(rows, start.elapsed());
            out
        })
        .await;
    cancel.done();
    out?.map(Answer::Whole).map_err(|e| run_error(model, e))
}

/// A failed run: 400 / `INVALID_ARGUMENT` when the request caused it (inputs the model refuses,
/// a tensor over the server's per-tensor limit that the request's shapes ask for: an EP's
/// `OutOfMemory`), else 500.
fn run_error(model: &Model, e: epx::Error) -> ServeError {
    use epx_plugin_api::abi::EpxStatusCode;
    let theirs = matches!(
        e,
        epx::Error::InvalidInput(_)
            | epx::Error::Provider {
                code: EpxStatusCode::OutOfMemory,
                ..
            }
    );
    let message = format!("model `{}`: {e}", model.name);
    if theirs {
        ServeError::BadRequest(message)
    } else {
        ServeError::Internal(message)
    }
}

/// The request's rows along the batch dimension when the model has one (`max_batch_size` >
/// 0): every input's first extent, the same for all, at most `max_batch_size`.
fn batch_rows(model: &Model, inputs: &[(String, Tensor)]) -> Result<Option<usize>, ServeError> {
    if model.max_batch_size == 0 {
        return Ok(None);
    }
    let mut rows = None;
    for (name, t) in inputs {
        let Some(&n) = t.shape().first() else {
            return Err(bad(format!(
                "input `{name}` is a scalar, but model `{}` takes a batch dimension first",
                model.name
            )));
        };
        match rows {
            None => rows = Some((name, n)),
            Some((first, m)) if m != n => {
                return Err(bad(format!(
                    "inputs `{first}` and `{name}` have {m} and {n} rows: every input's first \
                     extent is the batch size"
                )));
            }
            Some(_) => {}
        }
    }
    let rows = rows.map_or(0, |(_, n)| n);
    if rows > model.max_batch_size {
        return Err(bad(format!(
            "a batch of {rows} rows is over model `{}`'s max_batch_size of {}",
            model.name, model.max_batch_size
        )));
    }
    Ok(Some(rows))
}

/// Whether `b`'s inputs stack under `a`'s: the same names, element types and extents past the
/// first.
fn stacks(a: &Pending, b: &Pending) -> bool {
    a.inputs.len() == b.inputs.len()
        && a.inputs.iter().zip(&b.inputs).all(|((na, ta), (nb, tb))| {
            na == nb && ta.elem_type() == tb.elem_type() && ta.shape()[1..] == tb.shape()[1..]
        })
}

/// Starts the batcher of `model`, which lives while the model does.
pub(crate) fn start_batcher(model: &Arc<Model>) -> BatchQueue {
    let (queue, waiting) = mpsc::unbounded_channel();
    tokio::spawn(batcher(Arc::downgrade(model), waiting));
    queue
}

async fn batcher(model: Weak<Model>, mut waiting: mpsc::UnboundedReceiver<Pending>) {
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(p) => p,
            None => match waiting.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        if first.reply.is_closed() {
            continue;
        }
        let Some(m) = model.upgrade() else { return };
        let (max, preferred, delay) = m.batching();
        drop(m);
        let mut batch = vec![first];
        let mut rows = batch[0].rows;
        let until = tokio::time::Instant::now() + delay;
        // Gather: up to `max` rows, a preferred size with nothing more queued, or the delay.
        while rows < max && !(preferred.contains(&rows) && waiting.is_empty()) {
            let next = match tokio::time::timeout_at(until, waiting.recv()).await {
                Ok(Some(p)) => p,
                Ok(None) | Err(_) => break,
            };
            if !join(&mut batch, &mut rows, max, next, &mut carried) {
                break;
            }
        }
        let Some(m) = model.upgrade() else { return };
        let Ok(running) = m.running.clone().acquire_owned().await else {
            return;
        };
        // What queued while every instance was busy joins, up to the limit.
        while carried.is_none() && rows < max {
            let Ok(next) = waiting.try_recv() else { break };
            if !join(&mut batch, &mut rows, max, next, &mut carried) {
                break;
            }
        }
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        for p in &batch {
            m.stats.queue.add(p.queued.elapsed());
        }
        tokio::spawn(async move {
            let _running = running;
            run_batch(m, batch).await;
        });
    }
}

/// Adds `next` to `batch` (of `rows` rows) when it fits under `max` and stacks with it, drops
/// it when its client left, or else keeps it in `carried` for the next batch. Whether the
/// batch may take more.
fn join(
    batch: &mut Vec<Pending>,
    rows: &mut usize,
    max: usize,
    next: Pending,
    carried: &mut Option<Pending>,
) -> bool {
    if next.reply.is_closed() {
        return true;
    }
    if *rows + next.rows > max || !stacks(&batch[0], &next) {
        *carried = Some(next);
        return false;
    }
    *rows += next.rows;
    batch.push(next);
    true
}

/// Runs a batch and answers each of its requests with its rows.
async fn run_batch(model: Arc<Model>, batch: Vec<Pending>) {
    let runner = model.clone();
    let counts: Vec<usize> = batch.iter().map(|p| p.rows).collect();
    let stacked = stack(&batch);
    let replies: Vec<_> = batch.into_iter().map(|p| p.reply).collect();
    let result = match stacked {
        Err(e) => Err(e),
        Ok(inputs) => {
            let rows: usize = counts.iter().sum();
            let out = model
                .workers
                .run(move || {
                    let inputs = inputs.into_iter().map(|(n, t)| (n, Value::Host(t)));
                    let start = Instant::now();
                    let out = runner.session.run(inputs);
                    runner.stats.computed(rows, start.elapsed());
                    out
                })
                .await;
            match out {
                Err(e) => Err(e),
                Ok(Err(e)) => Err(run_error(&model, e)),
                Ok(Ok(out)) => split(&model, &out, &counts),
            }
        }
    };
    match result {
        Ok(parts) => {
            for (reply, part) in replies.into_iter().zip(parts) {
                let _ = reply.send(Ok(Answer::Rows(part)));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// The batch's inputs stacked along the first dimension, input by input.
fn stack(batch: &[Pending]) -> Result<Vec<(String, Tensor)>, ServeError> {
    let first = &batch[0];
    let mut stacked = Vec::with_capacity(first.inputs.len());
    for (i, (name, t0)) in first.inputs.iter().enumerate() {
        let parts: Vec<&Tensor> = batch.iter().map(|p| &p.inputs[i].1).collect();
        let rows: usize = parts.iter().map(|t| t.shape()[0]).sum();
        let mut shape = t0.shape().to_vec();
        shape[0] = rows;
        let tensor = if t0.elem_type() == ElementType::String {
            let strings = parts
                .iter()
                .flat_map(|t| t.strings().unwrap_or(&[]).iter().cloned())
                .collect();
            Tensor::from_strings(&shape, strings)
        } else {
            let mut bytes =
                Vec::with_capacity(parts.iter().map(|t| t.bytes().map_or(0, <[u8]>::len)).sum());
            for t in &parts {
                bytes.extend_from_slice(t.bytes().unwrap_or(&[]));
            }
            Tensor::from_bytes(t0.elem_type(), &shape, &bytes)
        };
        stacked.push((
            name.clone(),
            tensor.map_err(|e| ServeError::Internal(format!("stacking input `{name}`: {e}")))?,
        ));
    }
    Ok(stacked)
}

/// Each request's rows of every output.
fn split(
    model: &Model,
    out: &SessionOutputs,
    counts: &[usize],
) -> Result<Vec<Vec<(String, Tensor)>>, ServeError> {
    let rows: usize = counts.iter().sum();
    let mut parts: Vec<Vec<(String, Tensor)>> = counts.iter().map(|_| Vec::new()).collect();
    for spec in &model.outputs {
        let t = out.get(&spec.name).ok_or_else(|| {
            ServeError::Internal(format!(
                "output `{}` is not a tensor in host memory",
                spec.name
            ))
        })?;
        if t.shape().first() != Some(&rows) {
            return Err(ServeError::Internal(format!(
                "model `{}`: output `{}` has shape {:?} for a batch of {rows} rows: its first \
                 dimension is not the batch (set max_batch_size = 0 in its config.toml)",
                model.name,
                spec.name,
                t.shape()
            )));
        }
        let row_len: usize = t.shape()[1..].iter().product();
        let mut shape = t.shape().to_vec();
        let mut start = 0;
        for (part, &n) in parts.iter_mut().zip(counts) {
            shape[0] = n;
            let piece = if let Some(strings) = t.strings() {
                Tensor::from_strings(
                    &shape,
                    strings[start * row_len..(start + n) * row_len].to_vec(),
                )
            } else {
                let size = t.elem_type().byte_size().unwrap_or(0) * row_len;
                let bytes = t.bytes().unwrap_or(&[]);
                Tensor::from_bytes(
                    t.elem_type(),
                    &shape,
                    &bytes[start * size..(start + n) * size],
                )
            };
            part.push((
                spec.name.clone(),
                piece
                    .map_err(|e| ServeError::Internal(format!("splitting `{}`: {e}", spec.name)))?,
            ));
            start += n;
        }
    }
    Ok(parts)
}

/// The threads that run a model: one per instance, for the model's life. The same threads run
/// every run, so the CPU EP's per-thread buffers stay warm from one run to the next (on a
/// blocking pool, runs land on whichever thread is free and each thread's buffers are built
/// again: a 95 ms model took 147 ms that way).
pub(crate) struct Workers {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Workers {
    /// Starts `n` threads named after `model`; they end when the workers are dropped.
    pub(crate) fn start(model: &str, n: usize) -> Result<Workers, String> {
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let queue = Arc::new(std::sync::Mutex::new(queue));
        for i in 0..n {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("epx-run-{i}-{model}"))
                .spawn(move || {
                    loop {
                        let job = {
                            let Ok(q) = queue.lock() else { return };
                            q.recv()
                        };
                        let Ok(job) = job else { return };
                        // A panic ends the job (its caller gets an error), not the thread.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|e| format!("cannot start a run thread: {e}"))?;
        }
        Ok(Workers { jobs })
    }

    /// Runs `f` on one of the threads (the caller holds an instance permit, so one is free).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ServeError> {
        let (done, result) = oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = done.send(f());
            }))
            .map_err(|_| ServeError::Internal("the model's run threads stopped".into()))?;
        result
            .await
            .map_err(|_| ServeError::Internal("the run stopped (a panic in the run thread)".into()))
    }
}

/// Counts a request that arrived at `arrived` and ended with `result` in the model's
/// statistics.
pub(crate) fn count<T>(model: &Model, arrived: Instant, result: &Result<T, ServeError>) {
    if let Err(ServeError::Busy(_)) = result {
        model.stats.rejected.fetch_add(1, Ordering::Relaxed);
    }
    model.stats.answered(arrived.elapsed(), result.is_ok());
}
