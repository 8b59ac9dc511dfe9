//! The compile pipeline: how a model and a request become a [`Session`], as named steps run in
//! order by [`compile`]. Each step is a function of what the ones before it produced, so a
//! change to (say) how fallbacks are reported touches one step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use super::compiled::{Declared, Kernel, Session};
use super::environment::Environment;
use super::kernel_cache;
use super::partition::{Declines, Group, partition};
use super::placement::{
    CopyPlacement, Fallback, GroupPlacement, KernelCacheUse, NodePlacement, PlacementReport,
    Selection, SkippedProvider,
};
use super::plan::{self, Action, Plan, Source, Space};
use super::profile::Profiler;
use super::request::ExecutionProvider;
use crate::error::{Error, Result};
use crate::model::ir::{Dim, Graph, Model, ValueId};
use crate::plugin::AbiGraph;
use crate::plugin::ProviderInstance;
use epx_plugin_api::abi::EPX_DEVICE_OPTION;

/// What the builder asks for.
pub(crate) struct Request {
    pub(crate) providers: Vec<ExecutionProvider>,
    pub(crate) strict: bool,
    pub(crate) device_outputs: Vec<String>,
    pub(crate) intra_op_threads: Option<usize>,
    /// What a selection policy chose, when one chose `providers` (for the placement report).
    pub(crate) selection: Option<Selection>,
    /// Whether the environment's kernel cache is used.
    pub(crate) kernel_cache: bool,
    /// Whether runs are profiled ([`super::SessionBuilder::with_profiling`]).
    pub(crate) profiling: bool,
    /// Set from another thread to cancel the creation ([`super::SessionBuilder::with_cancellation`]).
    pub(crate) cancel: Option<super::RunOptions>,
}

/// The pipeline.
pub(crate) fn compile(env: &Environment, request: Request, model: Model) -> Result<Session> {
    let _span = tracing::debug_span!("session", model = %model.source).entered();
    let threads = threads_option(env, request.intra_op_threads);
    let (asked, selection) = (request.providers, request.selection);
    let requested = requested_providers(env, asked, threads.as_ref());
    let cancel = request.cancel.as_ref().map(super::RunOptions::flag);
    super::run::check_cancelled(cancel, "before its EPs were set up")?;
    let (mut providers, skipped) = set_up_providers(env, &requested)?;
    providers.push(fallback_provider(env, threads)?);
    let fallback = providers.len() - 1;

    let mut model = model;
    let g = &model.graph;
    let abi = AbiGraph::new(&model);
    let keep_on_device = device_outputs(g, &request.device_outputs)?;
    let cache = request.kernel_cache.then(|| env.kernel_cache()).flatten();
    let strict = |groups: &[Group], declines: &Declines| {
        check_strict(
            request.strict,
            &place_fallbacks(g, groups, &providers, declines, env).1,
        )
    };
    super::run::check_cancelled(cancel, "before the graph was partitioned")?;
    let built = partition_and_compile(&abi, &providers, fallback, cache.as_ref(), &strict, cancel)?;
    let (node_provider, fallbacks) =
        place_fallbacks(g, &built.groups, &providers, &built.declines, env);
    drop(abi);
    let Built {
        groups,
        kernels,
        cache_uses,
        replayed,
        ..
    } = built;
    let plan = plan_copies(g, &groups, &providers, &keep_on_device);
    let mut placement = report(&model, &providers, &groups, &plan, fallbacks, skipped);
    placement.selection = selection;
    for mut u in cache_uses {
        u.kernel = placement.groups[u.group].kernel.clone();
        placement.kernel_cache.push(u);
    }
    placement.replayed_capabilities = replayed;
    tracing::debug!("placement of {}:\n{}", model.source, placement.table());
    let copy_bytes = plan
        .copies
        .iter()
        .map(|_| AtomicU64::new(u64::MAX))
        .collect();
    release_initializer_data(&mut model.graph);
    let profiler = request
        .profiling
        .then(|| start_profiling(&kernels, plan.copies.len()))
        .transpose()?;
    Ok(Session {
        model: Arc::new(model),
        providers,
        kernels,
        plan,
        copy_bytes,
        placement,
        node_provider,
        max_tensor_bytes: None,
        profiler,
    })
}

/// A profiler for a session of `kernels` and `copies`, each kernel's EP asked to record its
/// parts (those that cannot are timed whole, and the profile says why).
fn start_profiling(kernels: &[Kernel], copies: usize) -> Result<Profiler> {
    let mut p = Profiler::new(kernels.len(), copies);
    for (k, whole) in kernels.iter().zip(&mut p.whole) {
        *whole = k.compiled.profile_start()?.err();
    }
    Ok(p)
}

/// Last step: drops the data of the initializers the kernels copied at compile time (the ABI's
/// contract: a plugin copies what it keeps), so a session does not hold its weights twice.
/// Kept: an initializer that is also a graph output, which the session returns itself. Names,
/// types and shapes stay.
fn release_initializer_data(g: &mut Graph) {
    let mut released = 0usize;
    for v in g.values.iter_mut().filter(|v| !v.is_graph_output) {
        if let Some(t) = v.initializer.take() {
            released += t.bytes().map_or(0, <[u8]>::len);
        }
    }
    tracing::debug!("released {released} bytes of initializer data held by the kernels");
}

/// Step 1: the fallback EP's thread-count option, when the builder set a thread count.
fn threads_option(env: &Environment, threads: Option<usize>) -> Option<(String, String)> {
    threads.map(|n| {
        (
            env.builtin_providers().threads_option.to_string(),
            n.to_string(),
        )
    })
}

/// Step 2: the EPs to set up, in priority order: the session's own (a requested fallback EP
/// gets the thread count unless it sets one), then the environment's defaults not already there.
fn requested_providers(
    env: &Environment,
    mut requested: Vec<ExecutionProvider>,
    threads: Option<&(String, String)>,
) -> Vec<ExecutionProvider> {
    let fallback = env.builtin_providers().fallback;
    if let Some(opt) = threads {
        for ep in requested.iter_mut().filter(|ep| ep.name == fallback) {
            if !ep.options.iter().any(|(k, _)| k == &opt.0) {
                ep.options.insert(0, opt.clone());
            }
        }
    }
    for d in env.default_providers() {
        if !requested.iter().any(|r| r.name == d.name) {
            requested.push(d.clone());
        }
    }
    requested
}

/// Step 3: an instance of each requested EP; one that cannot be set up is skipped (and
/// reported) unless it was asked to fail the session.
fn set_up_providers(
    env: &Environment,
    requested: &[ExecutionProvider],
) -> Result<(Vec<Arc<ProviderInstance>>, Vec<SkippedProvider>)> {
    let mut providers = Vec::new();
    let mut skipped = Vec::new();
    for ep in requested {
        match setup_provider(env, ep) {
            Ok(p) => providers.push(p),
            Err(e) if ep.error_on_failure => return Err(e),
            Err(e) => {
                tracing::warn!(provider = %ep.name, "continuing without this EP: {e}");
                skipped.push(SkippedProvider {
                    name: ep.name.clone(),
                    reason: e.to_string(),
                });
            }
        }
    }
    Ok((providers, skipped))
}

fn setup_provider(env: &Environment, ep: &ExecutionProvider) -> Result<Arc<ProviderInstance>> {
    let (lib, index) = env.find_provider(&ep.name)?;
    let desc = &lib.providers[index];
    if let Err(reason) = &desc.availability {
        return Err(Error::ProviderSetup {
            name: ep.name.clone(),
            message: format!("not available: {reason}"),
        });
    }
    // Manifest defaults first: the user's options come later and win.
    let mut options = env.default_options(&lib, &desc.name);
    options.extend(ep.options.iter().cloned());
    let device = match &ep.device {
        Some(asked) => {
            let d = choose_device(desc, asked).map_err(|message| Error::ProviderSetup {
                name: ep.name.clone(),
                message,
            })?;
            options.retain(|(k, _)| k != EPX_DEVICE_OPTION);
            options.push((EPX_DEVICE_OPTION.to_string(), d.id.to_string()));
            Some(d.selector(&desc.name))
        }
        None => None,
    };
    let instance = create_provider(env, ep, &lib, index, &options)?;
    Ok(match device {
        Some(d) => instance.with_device(d),
        None => instance,
    })
}

/// The listed device of `desc` that `asked` names (by id or by name), if it is usable.
fn choose_device<'d>(
    desc: &'d crate::plugin::ProviderDescription,
    asked: &str,
) -> std::result::Result<&'d crate::plugin::Device, String> {
    if let Some(e) = &desc.devices_error {
        return Err(format!(
            "cannot choose device `{asked}`: its devices could not be listed: {e}"
        ));
    }
    if desc.devices.is_empty() {
        return Err(format!(
            "cannot run on device `{asked}`: the EP lists no devices (a plugin built for ABI \
             1.5 or later lists them)"
        ));
    }
    let found = desc
        .devices
        .iter()
        .find(|d| d.id_name.as_deref() == Some(asked) || d.id.to_string() == asked);
    let Some(d) = found else {
        let names: Vec<String> = desc
            .devices
            .iter()
            .map(|d| d.selector(&desc.name))
            .collect();
        return Err(format!(
            "has no device `{asked}`; its devices: {}",
            names.join(", ")
        ));
    };
    if let Some(why) = &d.unusable {
        return Err(format!(
            "device {} ({}) is present but unusable: {why}",
            d.selector(&desc.name),
            d.name
        ));
    }
    Ok(d)
}

fn create_provider(
    env: &Environment,
    ep: &ExecutionProvider,
    lib: &Arc<crate::plugin::PluginLibrary>,
    index: usize,
    options: &[(String, String)],
) -> Result<Arc<ProviderInstance>> {
    if ep.isolated && lib.isolation.is_none() {
        let isolation = env.isolation().ok_or_else(|| Error::ProviderSetup {
            name: ep.name.clone(),
            message: "cannot run isolated: no epx executable is known to host it (the program \
                      did not name one, and EPX_PROBE_EXE is not set)"
                .into(),
        })?;
        return ProviderInstance::create_isolated(lib, index, options, isolation);
    }
    ProviderInstance::create(lib, index, options)
}

/// Step 4: the built-in fallback EP, always last.
fn fallback_provider(
    env: &Environment,
    threads: Option<(String, String)>,
) -> Result<Arc<ProviderInstance>> {
    let builtin = env.builtin();
    let name = env.builtin_providers().fallback;
    let index = builtin
        .providers
        .iter()
        .position(|p| p.name == name)
        .ok_or_else(|| Error::ProviderSetup {
            name: name.into(),
            message: "the built-in fallback EP is missing".into(),
        })?;
    let options: Vec<(String, String)> = threads.into_iter().collect();
    ProviderInstance::create(builtin, index, &options)
}

/// Step 5 (after partitioning): the EP of every node, and the nodes that fell back to the
/// built-in EP although other EPs were asked for (none when the fallback EP was requested).
fn place_fallbacks(
    g: &Graph,
    groups: &[Group],
    providers: &[Arc<ProviderInstance>],
    declines: &Declines,
    env: &Environment,
) -> (Vec<usize>, Vec<Fallback>) {
    let fallback = providers.len() - 1;
    let fallback_name = env.builtin_providers().fallback;
    let fallback_requested = providers[..fallback]
        .iter()
        .any(|p| p.name() == fallback_name);
    let mut node_provider = vec![0; g.nodes.len()];
    let mut fallbacks = Vec::new();
    for group in groups {
        for &n in &group.nodes {
            node_provider[n] = group.provider;
            if group.provider == fallback && fallback > 0 && !fallback_requested {
                fallbacks.push(Fallback {
                    node: n,
                    name: g.nodes[n].display_name(n),
                    op_type: g.nodes[n].op_type.clone(),
                    reason: fallback_reason(&providers[..fallback], declines.get(&n)),
                });
            }
        }
    }
    fallbacks.sort_by_key(|f| f.node);
    (node_provider, fallbacks)
}

/// Why a node fell back: each EP asked, with the reason it gave (ABI 1.4) or that it did not
/// claim the node: `cuda: Gelu needs CUDA 12; not claimed by ort_cpu`.
fn fallback_reason(asked: &[Arc<ProviderInstance>], said: Option<&Vec<(usize, String)>>) -> String {
    let mut silent = Vec::new();
    let mut parts = Vec::new();
    for (i, p) in asked.iter().enumerate() {
        match said.and_then(|s| s.iter().find(|(pi, _)| *pi == i)) {
            Some((_, reason)) => parts.push(format!("{} declined it: {reason}", p.name())),
            None => silent.push(p.name()),
        }
    }
    if !silent.is_empty() {
        parts.push(format!("not claimed by {}", silent.join(", ")));
    }
    parts.join("; ")
}

/// Step 6: strict placement refuses any fallback, naming each node.
fn check_strict(strict: bool, fallbacks: &[Fallback]) -> Result<()> {
    if !strict || fallbacks.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = fallbacks
        .iter()
        .map(|f| format!("`{}` ({})", f.name, f.op_type))
        .collect();
    Err(Error::Unsupported(format!(
        "strict placement: {} node{} would fall back to the CPU EP: {}",
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        list.join(", ")
    )))
}

/// Step 7: the graph outputs to leave in their EP's memory.
fn device_outputs(g: &Graph, names: &[String]) -> Result<Vec<ValueId>> {
    names
        .iter()
        .map(|name| {
            g.value_id(name)
                .filter(|&v| g.values[v].is_graph_output)
                .ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "`{name}` given to with_device_outputs is not an output of the model"
                    ))
                })
        })
        .collect()
}

/// Steps 7 and 8, partition and compile, and what the kernel cache did.
struct Built {
    groups: Vec<Group>,
    declines: Declines,
    kernels: Vec<Kernel>,
    cache_uses: Vec<KernelCacheUse>,
    /// EPs whose capability answers were replayed from the kernel cache.
    replayed: Vec<String>,
}

/// Partitions the graph and compiles the groups. With a kernel cache and an EP that stores its
/// kernels, first tries the recorded capability answers of those EPs with every one of their
/// kernels rebuilt from the cache (no query, no compile); anything missing, and it starts over
/// asking those EPs (the others' answers for the same offer are reused), recording the answers
/// and storing the kernels.
/// `check` runs on each partition before anything is compiled (strict placement).
fn partition_and_compile(
    abi: &AbiGraph<'_>,
    providers: &[Arc<ProviderInstance>],
    fallback: usize,
    cache: Option<&crate::cache::KernelCache>,
    check: &dyn Fn(&[Group], &Declines) -> Result<()>,
    cancel: Option<&AtomicBool>,
) -> Result<Built> {
    let g = abi.graph;
    let digest = cache
        .filter(|_| providers.iter().any(|p| p.caches_kernels()))
        .and_then(|_| {
            kernel_cache::graph_digest(abi.model)
                .map_err(|e| tracing::debug!("no graph digest for the kernel cache: {e}"))
                .ok()
        });
    let mut earlier = kernel_cache::EarlierNotes::new();
    // Answers of EPs that do not cache kernels, asked once for both passes.
    type Answer = (Vec<Vec<usize>>, crate::plugin::Declined);
    let mut live: HashMap<(usize, Vec<u32>), Answer> = HashMap::new();
    let mut ask_live = |i: usize, unclaimed: &[u32]| -> Result<Answer> {
        if let Some(a) = live.get(&(i, unclaimed.to_vec())) {
            return Ok(a.clone());
        }
        let a = providers[i].capability(abi, unclaimed)?;
        live.insert((i, unclaimed.to_vec()), a.clone());
        Ok(a)
    };
    if let (Some(c), Some(d)) = (cache, &digest) {
        let mut caps = kernel_cache::Capabilities::new(c, d.clone(), true, providers.len());
        let replay = (|| -> Result<Option<Built>> {
            let (groups, declines) = partition(abi, providers, &mut |i, unclaimed| {
                if providers[i].caches_kernels() {
                    caps.answer(i, &providers[i], abi, unclaimed)
                } else {
                    ask_live(i, unclaimed)
                }
            })?;
            check(&groups, &declines)?;
            let must_load = caps.replayed.clone();
            let compiled = compile_kernels(
                abi,
                g,
                &groups,
                providers,
                fallback,
                Some((c, d.as_str())),
                &must_load,
                &mut earlier,
                cancel,
            )?;
            Ok(compiled.map(|(kernels, cache_uses)| Built {
                groups,
                declines,
                kernels,
                cache_uses,
                replayed: providers
                    .iter()
                    .zip(&must_load)
                    .filter(|(_, r)| **r)
                    .map(|(p, _)| p.name().to_string())
                    .collect(),
            }))
        })();
        match replay {
            Ok(Some(built)) => return Ok(built),
            Ok(None) => tracing::debug!("kernel cache: not every answer and kernel is stored"),
            Err(e) => tracing::debug!("kernel cache: replaying recorded answers failed: {e}"),
        }
    }
    let with_digest = cache.zip(digest.as_deref());
    let mut caps = with_digest
        .map(|(c, d)| kernel_cache::Capabilities::new(c, d.to_string(), false, providers.len()));
    let (groups, declines) = partition(abi, providers, &mut |i, unclaimed| match caps.as_mut() {
        Some(caps) if providers[i].caches_kernels() => {
            caps.answer(i, &providers[i], abi, unclaimed)
        }
        _ => ask_live(i, unclaimed),
    })?;
    check(&groups, &declines)?;
    let none = vec![false; providers.len()];
    let (kernels, cache_uses) = compile_kernels(
        abi,
        g,
        &groups,
        providers,
        fallback,
        with_digest,
        &none,
        &mut earlier,
        cancel,
    )?
    .ok_or_else(|| Error::Run("internal: a kernel had to come from the cache".into()))?;
    // An EP's answer is kept only when every one of its kernels is in the cache now: replaying
    // it could not succeed otherwise, and would cost a query and an import for nothing.
    if let Some(caps) = caps {
        caps.commit(|p| {
            groups
                .iter()
                .enumerate()
                .filter(|(_, grp)| grp.provider == p)
                .all(|(i, _)| cache_uses.iter().any(|u| u.group == i && u.in_cache))
        });
    }
    Ok(Built {
        groups,
        declines,
        kernels,
        cache_uses,
        replayed: Vec::new(),
    })
}

/// Step 8: each group compiled by its EP (or rebuilt from the kernel cache), with what the
/// model declares about its outputs, and what the cache did for each group of an EP that uses it.
#[allow(clippy::too_many_arguments)]
fn compile_kernels(
    abi: &AbiGraph<'_>,
    g: &Graph,
    groups: &[Group],
    providers: &[Arc<ProviderInstance>],
    fallback: usize,
    cache: Option<(&crate::cache::KernelCache, &str)>,
    must_load: &[bool],
    earlier: &mut kernel_cache::EarlierNotes,
    cancel: Option<&AtomicBool>,
) -> Result<Option<(Vec<Kernel>, Vec<KernelCacheUse>)>> {
    // Groups that must come from the cache first: if one cannot, nothing else was compiled
    // for nothing.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&i| !must_load[groups[i].provider]);
    let mut made: Vec<Option<Kernel>> = (0..groups.len()).map(|_| None).collect();
    let mut uses = Vec::new();
    for i in order {
        super::run::check_cancelled(cancel, "while its kernels were compiled")?;
        let group = &groups[i];
        let ids = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        let compiled = kernel_cache::compile_group(
            cache,
            abi,
            &providers[group.provider],
            (
                &ids(&group.nodes),
                &ids(&group.inputs),
                &ids(&group.outputs),
            ),
            must_load[group.provider],
            earlier,
        )?;
        let kernel_cache::Compiled::Kernel(compiled, used) = compiled else {
            return Ok(None);
        };
        if let Some(mut u) = used {
            u.group = i;
            uses.push(u);
        }
        made[i] = Some(Kernel {
            compiled,
            group: group.clone(),
            // The built-in CPU EP, whether the session named it or it took what was left: one
            // rule for the reference.
            lenient_shapes: providers[group.provider].name() == providers[fallback].name(),
            shape_warned: group
                .outputs
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            expected: group.outputs.iter().map(|&v| declared(g, v)).collect(),
        });
    }
    uses.sort_by_key(|u| u.group);
    let kernels = made.into_iter().flatten().collect();
    Ok(Some((kernels, uses)))
}

/// What the host knows about a value, declared by the model or inferred from it. Both are held
/// against a plugin's kernel (a wrong shape must stop at the kernel that made it, not broadcast
/// downstream) where the host's inference stands behind them; the CPU EP is not (see
/// `Kernel::lenient_shapes`).
fn declared(g: &Graph, v: ValueId) -> Declared {
    let val = &g.values[v];
    let dims = val.shape().map(|s| s.iter().map(Dim::known).collect());
    (
        val.elem_type(),
        dims,
        val.shape_inferred,
        val.shape_confirmed,
    )
}

/// Step 9: the order of kernels and copies, and when each value is released.
fn plan_copies(
    g: &Graph,
    groups: &[Group],
    providers: &[Arc<ProviderInstance>],
    keep_on_device: &[ValueId],
) -> Plan {
    let space_of: Vec<Space> = providers
        .iter()
        .enumerate()
        .map(|(i, p)| (!p.description.uses_host_memory()).then_some(i))
        .collect();
    plan::plan(g, groups, &space_of, keep_on_device)
}

fn space_name(providers: &[Arc<ProviderInstance>], s: Space) -> String {
    s.map_or_else(|| "host".to_string(), |p| providers[p].name().to_string())
}

/// Step 10: the placement report of the planned session.
fn report(
    model: &Model,
    providers: &[Arc<ProviderInstance>],
    groups: &[Group],
    plan: &Plan,
    fallbacks: Vec<Fallback>,
    skipped_providers: Vec<SkippedProvider>,
) -> PlacementReport {
    let g = &model.graph;
    let mut per_provider = vec![0usize; providers.len()];
    let mut group_of = vec![0usize; g.nodes.len()];
    let names = |vs: &[ValueId]| {
        vs.iter()
            .map(|&v| g.values[v].name.clone())
            .collect::<Vec<_>>()
    };
    let groups_out: Vec<GroupPlacement> = groups
        .iter()
        .enumerate()
        .map(|(i, grp)| {
            for &n in &grp.nodes {
                group_of[n] = i;
            }
            let kernel = format!(
                "{}#{}",
                providers[grp.provider].name(),
                per_provider[grp.provider]
            );
            per_provider[grp.provider] += 1;
            GroupPlacement {
                id: i,
                provider: providers[grp.provider].name().to_string(),
                nodes: grp.nodes.clone(),
                kernel,
                inputs: names(&grp.inputs),
                outputs: names(&grp.outputs),
            }
        })
        .collect();
    let nodes = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodePlacement {
            id: i,
            name: n.display_name(i),
            op_type: n.op_type.clone(),
            provider: groups_out[group_of[i]].provider.clone(),
            group: group_of[i],
        })
        .collect();
    // The kernel each copy feeds: the first kernel after it in the plan that reads it.
    let mut before_group = vec![None; plan.copies.len()];
    for (i, a) in plan.actions.iter().enumerate() {
        if let Action::Copy(c) = *a {
            before_group[c] = plan.actions[i..].iter().find_map(|a| match *a {
                Action::Kernel(k) if plan.kernel_inputs[k].contains(&Source::Copy(c)) => Some(k),
                _ => None,
            });
        }
    }
    let copies = plan
        .copies
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let v = &g.values[c.value];
            let bytes = v.shape().and_then(|s| {
                let count = s.iter().try_fold(1usize, |acc, d| match d {
                    Dim::Known(k) => acc.checked_mul(usize::try_from(*k).ok()?),
                    _ => None,
                })?;
                v.elem_type()?.storage_bytes(count).map(|b| b as u64)
            });
            CopyPlacement {
                value: v.name.clone(),
                from: space_name(providers, c.from),
                to: space_name(providers, c.to),
                before_group: before_group[i],
                bytes,
                last_run_bytes: None,
            }
        })
        .collect();
    PlacementReport {
        nodes,
        groups: groups_out,
        copies,
        fallbacks,
        skipped_providers,
        isolated_providers: providers
            .iter()
            .filter(|p| p.is_isolated())
            .map(|p| p.name().to_string())
            .collect(),
        devices: providers
            .iter()
            .filter_map(|p| {
                p.chosen_device()
                    .map(|d| (p.name().to_string(), d.to_string()))
            })
            .collect(),
        selection: None,
        kernel_cache: Vec::new(),
        replayed_capabilities: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::model::onnx::testing::{graph, model, node};
    use crate::value::ElementType;

    fn env_with_default(ep: ExecutionProvider) -> Arc<Environment> {
        Environment::builder()
            .with_execution_providers([ep])
            .commit()
            .expect("environment")
    }

    /// A session's own tensor limit holds for its runs and nothing else: another session on
    /// the same thread, and the thread after the run, keep the process's limit.
    #[test]
    fn a_session_limit_holds_for_that_session_alone() {
        let m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
        let bytes = m.encode_to_vec();
        let x = || crate::Tensor::zeros(crate::ElementType::Float, &[1000]).expect("x");
        let limited = crate::Session::builder()
            .expect("builder")
            .with_max_tensor_bytes(100)
            .commit_from_memory(&bytes)
            .expect("session");
        let open = crate::Session::builder()
            .expect("builder")
            .commit_from_memory(&bytes)
            .expect("session");
        let process = crate::max_tensor_bytes();
        let e = limited
            .run([("x", x())])
            .expect_err("4000 bytes over a 100-byte limit");
        assert!(e.to_string().contains("more than the 100"), "{e}");
        assert_eq!(crate::max_tensor_bytes(), process);
        let y = open.run([("x", x())]).expect("the other session");
        assert_eq!(y["y"].len(), 1000);
        assert_eq!(limited.within_limits(crate::max_tensor_bytes), 100);
    }

    #[test]
    fn the_thread_count_goes_to_a_requested_fallback_ep_that_does_not_set_it() {
        let env = env_with_default(ExecutionProvider::new("vendor"));
        let threads = threads_option(&env, Some(2));
        assert_eq!(
            threads,
            Some(("intra_op_num_threads".to_string(), "2".to_string()))
        );
        let asked = vec![
            ExecutionProvider::new("cpu").with_option("x", "1"),
            ExecutionProvider::new("other"),
        ];
        let got = requested_providers(&env, asked, threads.as_ref());
        let names: Vec<&str> = got.iter().map(|e| e.name()).collect();
        assert_eq!(names, ["cpu", "other", "vendor"], "defaults come last");
        assert_eq!(
            got[0].options(),
            [
                ("intra_op_num_threads".to_string(), "2".to_string()),
                ("x".to_string(), "1".to_string())
            ]
        );
        assert!(got[1].options().is_empty(), "only the fallback EP takes it");

        let own = vec![ExecutionProvider::new("cpu").with_option("intra_op_num_threads", "1")];
        let got = requested_providers(&env, own, threads.as_ref());
        assert_eq!(
            got[0].options(),
            [("intra_op_num_threads".to_string(), "1".to_string())],
            "an EP's own setting wins"
        );
        assert_eq!(threads_option(&env, None), None);
    }

    #[test]
    fn a_default_ep_the_session_names_itself_is_not_added_twice() {
        let env = env_with_default(ExecutionProvider::new("cuda").with_option("a", "1"));
        let got = requested_providers(&env, vec![ExecutionProvider::new("cuda")], None);
        assert_eq!(got.len(), 1);
        assert!(
            got[0].options().is_empty(),
            "the session's own request is kept"
        );
    }

    #[test]
    fn strict_placement_names_every_node_that_would_fall_back() {
        let f = |node: usize, name: &str, op: &str| Fallback {
            node,
            name: name.into(),
            op_type: op.into(),
            reason: "not claimed by x".into(),
        };
        assert!(check_strict(false, &[f(0, "a", "Relu")]).is_ok());
        assert!(check_strict(true, &[]).is_ok());
        let one = check_strict(true, &[f(0, "a", "Relu")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            one,
            "strict placement: 1 node would fall back to the CPU EP: `a` (Relu)"
        );
        let two = check_strict(true, &[f(0, "a", "Relu"), f(3, "b", "Add")])
            .unwrap_err()
            .to_string();
        assert!(
            two.contains("2 nodes") && two.contains("`b` (Add)"),
            "{two}"
        );
    }

    #[test]
    fn device_outputs_must_be_graph_outputs() {
        let g = graph(&model(
            vec![node("Relu", &["x"], &["h"]), node("Neg", &["h"], &["y"])],
            &["x"],
            &["y"],
        ));
        let y = g.value_id("y").expect("y");
        assert_eq!(device_outputs(&g, &["y".to_string()]).unwrap(), [y]);
        for bad in ["h", "x", "nope"] {
            let e = device_outputs(&g, &[bad.to_string()])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("`{bad}`")) && e.contains("not an output"),
                "{e}"
            );
        }
    }

    #[test]
    fn declared_and_inferred_shapes_are_told_apart() {
        let mut m = model(vec![node("Relu", &["x"], &["y"])], &["x"], &["y"]);
        // Declare x as [2, N]; y's shape is only inferred.
        let dims = |d: &[Option<i64>]| {
            crate::model::onnx::proto::TensorShapeProto {
            dim: d
                .iter()
                .map(|v| crate::model::onnx::proto::tensor_shape_proto::Dimension {
                    value: Some(match v {
                        Some(k) => {
                            crate::model::onnx::proto::tensor_shape_proto::dimension::Value::DimValue(*k)
                        }
                        None => crate::model::onnx::proto::tensor_shape_proto::dimension::Value::DimParam(
                            "N".into(),
                        ),
                    }),
                    denotation: None,
                })
                .collect(),
        }
        };
        let graph_proto = m.graph.as_mut().expect("graph");
        if let Some(crate::model::onnx::proto::type_proto::Value::TensorType(t)) = graph_proto.input
            [0]
        .r#type
        .as_mut()
        .and_then(|t| t.value.as_mut())
        {
            t.shape = Some(dims(&[Some(2), None]));
        }
        let g = graph(&m);
        let x = g.value_id("x").expect("x");
        let y = g.value_id("y").expect("y");
        assert_eq!(
            declared(&g, x),
            (
                Some(ElementType::Float),
                Some(vec![Some(2), None]),
                false,
                false
            )
        );
        // y's shape is the host's inference, marked so: held against plugin kernels only.
        assert_eq!(declared(&g, y).1, Some(vec![Some(2), None]));
        assert!(declared(&g, y).2, "y's shape is inferred");
    }

    /// The session of model `m` on `env`, one intra-op thread.
    fn compile_one_thread(
        env: &Environment,
        m: &crate::model::onnx::proto::ModelProto,
        strict: bool,
    ) -> Session {
        let loaded = crate::model::onnx::load_model_bytes(&m.encode_to_vec(), "t.onnx", None)
            .expect("model");
        let request = Request {
            providers: Vec::new(),
            strict,
            device_outputs: Vec::new(),
            intra_op_threads: Some(1),
            selection: None,
            kernel_cache: true,
            profiling: false,
            cancel: None,
        };
        compile(env, request, loaded).expect("compiles")
    }

    #[test]
    fn a_model_compiles_onto_the_fallback_ep_without_reporting_fallbacks() {
        let env = env_with_default(ExecutionProvider::new("cpu"));
        let m = model(
            vec![node("Relu", &["x"], &["h"]), node("Neg", &["h"], &["y"])],
            &["x"],
            &["y"],
        );
        let session = compile_one_thread(&env, &m, true);
        assert_eq!(session.node_placement(), ["cpu", "cpu"]);
        assert!(session.placement().fallbacks.is_empty());
        assert_eq!(
            session.kernel_count(),
            1,
            "both nodes fuse into one CPU kernel"
        );
    }

    #[test]
    fn a_session_keeps_only_the_initializers_it_returns_itself() {
        use crate::model::onnx::proto::{TensorProto, tensor_proto::DataType};
        let env = env_with_default(ExecutionProvider::new("cpu"));
        let init = |name: &str, v: f32| TensorProto {
            name: Some(name.into()),
            dims: vec![2],
            data_type: Some(DataType::Float as i32),
            raw_data: Some([v, v].iter().flat_map(|f| f.to_le_bytes()).collect()),
            ..Default::default()
        };
        // y = x + w; w is read by the Add only, k is also a graph output.
        let mut m = model(vec![node("Add", &["x", "w"], &["y"])], &["x"], &["y", "k"]);
        let g = m.graph.as_mut().expect("graph");
        g.initializer = vec![init("w", 2.0), init("k", 7.0)];
        let session = compile_one_thread(&env, &m, false);
        let values = &session.model().graph.values;
        let held = |name: &str| {
            values
                .iter()
                .find(|v| v.name == name)
                .expect("value")
                .initializer
                .is_some()
        };
        assert!(
            !held("w"),
            "the CPU EP holds w's data; the session does not"
        );
        assert!(held("k"), "a graph output the session returns itself stays");
        let x = crate::value::Tensor::from_array(ndarray::arr1(&[1.0f32, -1.0]));
        let out = session.run([("x", x)]).expect("runs");
        let f = |name: &str| {
            out.get(name)
                .and_then(|t| t.as_slice::<f32>())
                .expect("float output")
                .to_vec()
        };
        assert_eq!(f("y"), [3.0, 1.0], "the kernel kept w");
        assert_eq!(f("k"), [7.0, 7.0]);
    }
}
