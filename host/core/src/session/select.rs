//! Choosing EPs by policy instead of by name: the devices the environment's EPs list
//! ([`Environment::devices`]) ranked by what the policy prefers, or ordered by the application's
//! own function.

use std::sync::Arc;

use super::environment::{Environment, ProviderDevice};
use super::placement::Selection;
use super::request::ExecutionProvider;
use crate::error::{Error, Result};
use crate::model::ir::Model;

/// What the application hands its own policy: every device listed, and the model.
pub struct SelectionInput<'a> {
    pub devices: &'a [ProviderDevice],
    pub model: &'a Model,
}

/// An application's policy: the EPs to try, in order (the CPU EP still takes what is left), or
/// why it cannot choose (which fails the session with that message).
pub type SelectionFn = Arc<
    dyn Fn(&SelectionInput<'_>) -> std::result::Result<Vec<ExecutionProvider>, String>
        + Send
        + Sync,
>;

/// How a session picks its EPs when none are named ([`crate::SessionBuilder::with_selection_policy`]).
#[derive(Clone)]
pub enum SelectionPolicy {
    /// The built-in CPU EP alone, or a plugin EP on a CPU device first.
    PreferCpu,
    /// An EP on a usable GPU first, then NPU, then CPU devices.
    PreferGpu,
    /// An EP on a usable NPU first, then GPU, then CPU devices.
    PreferNpu,
    /// What is usually fastest: GPU, then NPU, then CPU.
    MaxPerformance,
    /// What usually draws least power: NPU, then CPU, then GPU.
    MinPower,
    /// Times the candidates on the model itself: each EP the max-performance policy would pick,
    /// alone, and the built-in CPU EP alone, `runs` timed runs each on zero inputs (within
    /// about ten seconds in all), and keeps the fastest. The choice is remembered in the
    /// environment's cache folder per model, device and plugin version, so the next session
    /// of the same model skips the measurement.
    Measure { runs: usize },
    /// The application's own ordering.
    Custom(SelectionFn),
}

impl std::fmt::Debug for SelectionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl SelectionPolicy {
    /// The policy's name, as `epx run --policy` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            SelectionPolicy::PreferCpu => "prefer-cpu",
            SelectionPolicy::PreferGpu => "prefer-gpu",
            SelectionPolicy::PreferNpu => "prefer-npu",
            SelectionPolicy::MaxPerformance => "max-performance",
            SelectionPolicy::MinPower => "min-power",
            SelectionPolicy::Measure { .. } => "measure",
            SelectionPolicy::Custom(_) => "custom",
        }
    }

    /// Every named policy.
    pub const NAMES: [&'static str; 6] = [
        "prefer-cpu",
        "prefer-gpu",
        "prefer-npu",
        "max-performance",
        "min-power",
        "measure",
    ];

    /// A policy by name; the error lists the names.
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "prefer-cpu" => SelectionPolicy::PreferCpu,
            "prefer-gpu" => SelectionPolicy::PreferGpu,
            "prefer-npu" => SelectionPolicy::PreferNpu,
            "max-performance" => SelectionPolicy::MaxPerformance,
            "min-power" => SelectionPolicy::MinPower,
            "measure" => SelectionPolicy::Measure { runs: 3 },
            other => {
                return Err(Error::InvalidInput(format!(
                    "no selection policy `{other}`; the policies are {}",
                    Self::NAMES.join(", ")
                )));
            }
        })
    }

    /// The rank of a device kind, highest first; 0 is never chosen.
    fn rank(&self, kind: &str) -> u8 {
        let order: &[&str] = match self {
            SelectionPolicy::PreferCpu => &["cpu"],
            SelectionPolicy::PreferGpu
            | SelectionPolicy::MaxPerformance
            | SelectionPolicy::Measure { .. } => &["gpu", "npu", "cpu"],
            SelectionPolicy::PreferNpu => &["npu", "gpu", "cpu"],
            SelectionPolicy::MinPower => &["npu", "cpu", "gpu"],
            SelectionPolicy::Custom(_) => &[],
        };
        order
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| (order.len() - i) as u8)
    }
}

/// The EPs `policy` asks for, in order, with its reasons. The built-in fallback EP is not a
/// candidate (it always runs what is left).
pub(super) fn select(
    env: &Environment,
    policy: &SelectionPolicy,
    model: &Model,
) -> Result<(Vec<ExecutionProvider>, Selection)> {
    let devices = env.devices();
    let mut selection = Selection {
        policy: policy.name().to_string(),
        ..Default::default()
    };
    if let SelectionPolicy::Custom(f) = policy {
        let eps = f(&SelectionInput {
            devices: &devices,
            model,
        })
        .map_err(|why| Error::InvalidInput(format!("the selection function failed: {why}")))?;
        selection.chosen = eps
            .iter()
            .map(|e| match e.device() {
                Some(d) => format!("{}:{d}", e.name()),
                None => e.name().to_string(),
            })
            .collect();
        selection
            .reasons
            .push("ordered by the application's function".into());
        return Ok((eps, selection));
    }
    let fallback = env.builtin_providers().fallback;
    let mut ranked: Vec<(u8, &ProviderDevice)> = Vec::new();
    for d in &devices {
        let what = format!("{} ({} {})", d.selector, d.device.kind, d.device.name);
        if d.plugin == crate::BUILTIN_PLUGIN && d.provider == fallback {
            continue;
        }
        if let Some(why) = &d.device.unusable {
            selection.reasons.push(format!("{what}: unusable: {why}"));
            continue;
        }
        match env.find_provider(&format!("{}/{}", d.plugin, d.provider)) {
            Ok((lib, i)) => {
                if let Err(why) = &lib.providers[i].availability {
                    selection
                        .reasons
                        .push(format!("{what}: EP not available: {why}"));
                    continue;
                }
            }
            Err(e) => {
                selection.reasons.push(format!("{what}: {e}"));
                continue;
            }
        }
        let rank = policy.rank(d.device.kind);
        if rank == 0 {
            selection
                .reasons
                .push(format!("{what}: not a kind {} uses", policy.name()));
            continue;
        }
        ranked.push((rank, d));
    }
    // Highest rank first; among equals, search order. One device per EP: its best.
    ranked.sort_by_key(|(rank, _)| std::cmp::Reverse(*rank));
    let mut eps = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (_, d) in ranked {
        let what = format!("{} ({} {})", d.selector, d.device.kind, d.device.name);
        if !seen.insert((d.plugin.clone(), d.provider.clone())) {
            selection.reasons.push(format!(
                "{what}: passed over, its EP is already chosen on a better device"
            ));
            continue;
        }
        let device = d
            .device
            .id_name
            .clone()
            .unwrap_or_else(|| d.device.id.to_string());
        eps.push(ExecutionProvider::new(format!("{}/{}", d.plugin, d.provider)).on_device(device));
        selection.chosen.push(d.selector.clone());
        selection.reasons.push(format!("{what}: chosen"));
    }
    if let SelectionPolicy::Measure { runs } = policy {
        return measure::choose(env, model, eps, selection, &devices, *runs);
    }
    if eps.is_empty() {
        selection.reasons.push(format!(
            "no device fits {}: the built-in {fallback} EP runs everything",
            policy.name()
        ));
    }
    Ok((eps, selection))
}

/// The `measure` policy: time each candidate on the model, remember the fastest.
mod measure {
    use std::time::{Duration, Instant};

    use sha2::{Digest, Sha256};

    use super::{Environment, ExecutionProvider, ProviderDevice, Selection};
    use crate::error::Result;
    use crate::model::ir::Model;
    use crate::session::compile;
    use crate::session::compiled::Session;
    use crate::value::Tensor;

    /// The whole measurement stops once this much time went by (each candidate started runs).
    const BUDGET: Duration = Duration::from_secs(10);

    pub(super) fn choose(
        env: &Environment,
        model: &Model,
        ranked: Vec<ExecutionProvider>,
        mut selection: Selection,
        devices: &[ProviderDevice],
        runs: usize,
    ) -> Result<(Vec<ExecutionProvider>, Selection)> {
        let runs = runs.max(1);
        // Candidates: each ranked EP alone, then the built-in CPU EP alone.
        let mut candidates: Vec<Vec<ExecutionProvider>> =
            ranked.into_iter().map(|ep| vec![ep]).collect();
        candidates.push(Vec::new());
        let label = |c: &[ExecutionProvider]| match c.first() {
            Some(ep) => {
                let name = ep.name().rsplit('/').next().unwrap_or(ep.name());
                format!("{name}:{}", ep.device().unwrap_or(""))
            }
            None => format!("{} alone", env.builtin_providers().fallback),
        };
        selection.chosen.clear();
        selection.reasons.retain(|r| !r.ends_with(": chosen"));
        let key = cache_key(env, model, devices);
        let file = env
            .trusted_cache_dir()
            .map(|d| d.join("selection").join(format!("{key}.txt")));
        let read = |f: &std::path::PathBuf| crate::files::read_regular(f, 4096, "4 KiB").ok();
        if let Some(remembered) = file
            .as_ref()
            .and_then(read)
            .and_then(|b| String::from_utf8(b).ok())
        {
            let remembered = remembered.trim();
            if let Some(c) = candidates.iter().find(|c| label(c) == remembered) {
                selection.reasons = vec![format!(
                    "{remembered}: remembered as the fastest from an earlier measurement of this \
                     model on these devices and plugin versions"
                )];
                selection.chosen = c
                    .first()
                    .map(|_| remembered.to_string())
                    .into_iter()
                    .collect();
                return Ok((c.clone(), selection));
            }
        }
        if candidates.len() == 1 {
            selection.reasons.push(format!(
                "{}: the only candidate, chosen without measuring",
                label(&candidates[0])
            ));
            return Ok((Vec::new(), selection));
        }
        let started = Instant::now();
        let mut best: Option<(Duration, usize)> = None;
        let mut all_measured = true;
        for (i, c) in candidates.iter().enumerate() {
            if started.elapsed() > BUDGET {
                all_measured = false;
                selection.reasons.push(format!(
                    "{}: not measured, the time for measuring ran out",
                    label(c)
                ));
                continue;
            }
            match time_candidate(env, model, c, runs) {
                Ok(t) => {
                    selection.reasons.push(format!(
                        "{}: {:.3} ms a run (median of {runs})",
                        label(c),
                        t.as_secs_f64() * 1e3
                    ));
                    if best.is_none_or(|(b, _)| t < b) {
                        best = Some((t, i));
                    }
                }
                Err(e) => {
                    all_measured = false;
                    selection.reasons.push(format!("{}: failed: {e}", label(c)));
                }
            }
        }
        let Some((_, chosen)) = best else {
            selection.reasons.push(format!(
                "no candidate could be measured: the built-in {} EP runs everything",
                env.builtin_providers().fallback
            ));
            return Ok((Vec::new(), selection));
        };
        let winner = candidates.swap_remove(chosen);
        let name = label(&winner);
        selection.reasons.push(format!("{name}: fastest, chosen"));
        selection.chosen = winner.first().map(|_| name.clone()).into_iter().collect();
        // Only a full measurement is remembered: a candidate that failed or was not timed this
        // time (out of memory, a slow first compile) gets another chance next time.
        match file {
            Some(f) if all_measured => remember(&f, &name),
            _ => {}
        }
        Ok((winner, selection))
    }

    /// The median of `runs` runs of a session on the candidate, after one warm-up run, on zero
    /// inputs (dynamic extents 1).
    fn time_candidate(
        env: &Environment,
        model: &Model,
        eps: &[ExecutionProvider],
        runs: usize,
    ) -> Result<Duration> {
        let request = compile::Request {
            providers: eps
                .iter()
                .cloned()
                .map(ExecutionProvider::error_on_failure)
                .collect(),
            strict: false,
            device_outputs: Vec::new(),
            intra_op_threads: None,
            selection: None,
            kernel_cache: true,
            profiling: false,
            cancel: None,
        };
        let session: Session = compile::compile(env, request, model.clone())?;
        let mut inputs = Vec::new();
        for spec in session.inputs() {
            let elem = spec.elem_type.ok_or_else(|| {
                crate::Error::InvalidInput(format!("input `{}` has no element type", spec.name))
            })?;
            let shape: Vec<usize> = spec
                .shape
                .unwrap_or_default()
                .iter()
                .map(|d| d.map_or(1, |d| d as usize))
                .collect();
            inputs.push((spec.name, Tensor::zeros(elem, &shape)?));
        }
        let mut times = Vec::with_capacity(runs);
        for i in 0..=runs {
            let t = Instant::now();
            let feed = inputs
                .iter()
                .map(|(n, t)| Ok((n.as_str(), t.try_clone()?)))
                .collect::<Result<Vec<_>>>()?;
            session.run(feed)?;
            if i > 0 {
                times.push(t.elapsed());
            }
        }
        times.sort();
        Ok(times[times.len() / 2])
    }

    /// Model contents (graph and weights, as ONNX), devices and plugin versions, hashed.
    fn cache_key(env: &Environment, model: &Model, devices: &[ProviderDevice]) -> String {
        let g = &model.graph;
        let all: Vec<u32> = (0..g.nodes.len() as u32).collect();
        let ins: Vec<u32> = g.inputs.iter().map(|&v| v as u32).collect();
        let outs: Vec<u32> = g.outputs.iter().map(|&v| v as u32).collect();
        let mut h = Sha256::new();
        match crate::model::onnx::save::subgraph_model_bytes(model, g, &all, &ins, &outs) {
            Ok(bytes) => h.update(&bytes),
            Err(_) => h.update(model.source.as_bytes()),
        }
        for d in devices {
            h.update(format!("{}|{}|{:?}\n", d.selector, d.plugin, d.device).as_bytes());
            // The plugin's version and library: an upgraded plugin is measured again.
            if let Ok((lib, i)) = env.find_provider(&format!("{}/{}", d.plugin, d.provider)) {
                let version = &lib.providers[i].version;
                h.update(
                    format!("{}|{}|{version}|{:?}\n", lib.name, lib.version, lib.path).as_bytes(),
                );
            }
        }
        h.update(crate::plugin_abi_version().as_bytes());
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Writes the choice atomically (a temporary file renamed); a failure only costs a
    /// measurement next time, and is logged.
    fn remember(file: &std::path::Path, choice: &str) {
        let write = || -> std::io::Result<()> {
            let dir = file
                .parent()
                .ok_or_else(|| std::io::Error::other("no folder"))?;
            std::fs::create_dir_all(dir)?;
            let tmp = dir.join(format!(
                ".{}-{:?}.tmp",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::write(&tmp, choice)?;
            std::fs::rename(&tmp, file)
        };
        if let Err(e) = write() {
            tracing::warn!(file = %file.display(), "cannot remember the measured EP choice: {e}");
        }
    }
}
