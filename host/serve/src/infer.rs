//! One inference, whatever the transport: admission against the model's limits, the wait for a
//! free instance, the run on a blocking thread, and the statistics of each.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use epx::{SessionOutputs, Tensor, Value};

use crate::protocol::ServeError;
use crate::repository::Model;

/// Runs `inputs` (checked against the model) once the model admits the request and has a free
/// instance. A model at its limit of queued requests refuses at once with
/// [`ServeError::Busy`]: what waits is bounded by the limits, not by the load.
pub(crate) async fn run(
    model: &Arc<Model>,
    inputs: Vec<(String, Tensor)>,
) -> Result<SessionOutputs, ServeError> {
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
    tokio::task::spawn_blocking(move || {
        let inputs = inputs.into_iter().map(|(n, t)| (n, Value::Host(t)));
        let start = Instant::now();
        let out = runner.session.run(inputs);
        runner.stats.compute.add(start.elapsed());
        runner.stats.ran();
        out
    })
    .await
    .map_err(|e| ServeError::Internal(format!("the run stopped: {e}")))?
    .map_err(|e| ServeError::Internal(format!("model `{}`: {e}", model.name)))
}

/// Counts a request that arrived at `arrived` and ended with `result` in the model's
/// statistics.
pub(crate) fn count<T>(model: &Model, arrived: Instant, result: &Result<T, ServeError>) {
    match result {
        Ok(_) => model.stats.success.add(arrived.elapsed()),
        Err(e) => {
            if matches!(e, ServeError::Busy(_)) {
                model.stats.rejected.fetch_add(1, Ordering::Relaxed);
            }
            model.stats.fail.add(arrived.elapsed());
        }
    }
}

/// The output `name` of a run, which must be a tensor in host memory.
pub(crate) fn output<'a>(
    outputs: &'a SessionOutputs,
    name: &str,
) -> Result<&'a Tensor, ServeError> {
    outputs.get(name).ok_or_else(|| {
        ServeError::Internal(format!("output `{name}` is not a tensor in host memory"))
    })
}
