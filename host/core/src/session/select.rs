//! Choosing EPs by policy instead of by name: the devices the environment's EPs list
//! ([`Environment::devices`]) ranked by what the policy prefers, or ordered by the application's
//! own function.

use std::sync::Arc;

use super::{Environment, ExecutionProvider, ProviderDevice};
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
            SelectionPolicy::Custom(_) => "custom",
        }
    }

    /// Every named policy.
    pub const NAMES: [&'static str; 5] = [
        "prefer-cpu",
        "prefer-gpu",
        "prefer-npu",
        "max-performance",
        "min-power",
    ];

    /// A policy by name; the error lists the names.
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "prefer-cpu" => SelectionPolicy::PreferCpu,
            "prefer-gpu" => SelectionPolicy::PreferGpu,
            "prefer-npu" => SelectionPolicy::PreferNpu,
            "max-performance" => SelectionPolicy::MaxPerformance,
            "min-power" => SelectionPolicy::MinPower,
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
            SelectionPolicy::PreferGpu | SelectionPolicy::MaxPerformance => &["gpu", "npu", "cpu"],
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

/// What a policy chose, and why, for the placement report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Selection {
    pub policy: String,
    /// The EPs it asked for, in order (`adversarial:0`, or the EP's name for a custom policy).
    pub chosen: Vec<String>,
    /// One line per device considered: chosen, passed over, or unusable, and why.
    pub reasons: Vec<String>,
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
    if eps.is_empty() {
        selection.reasons.push(format!(
            "no device fits {}: the built-in {fallback} EP runs everything",
            policy.name()
        ));
    }
    Ok((eps, selection))
}
