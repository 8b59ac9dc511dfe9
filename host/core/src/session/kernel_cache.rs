//! Compiling a group through the kernel cache ([`crate::cache`]): the key a group's kernel is
//! stored under, and the lookup → rebuild → compile → store sequence, where every failure costs
//! only a compile and is said in the placement report.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::placement::KernelCacheUse;
use crate::cache::{EntryMeta, KernelCache, Lookup, hex};
use crate::error::Result;
use crate::model::ir::Model;
use crate::plugin::AbiGraph;
use crate::plugin::{CompiledKernel, Declined, ProviderInstance};

/// Version of the key's layout: a change here is a change of every key.
const KEY_FORMAT: &str = "epx kernel key 1";

/// What identifies the kernels an EP makes, besides the nodes: the EP, its version, the
/// plugin's name, version and library digest, the EP's options, the device the session chose,
/// and every device the EP lists with its driver version.
fn provider_hasher(provider: &ProviderInstance, what: &str) -> Sha256 {
    let lib = &provider.library;
    let d = &provider.description;
    let mut h = Sha256::new();
    let mut line = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    line(KEY_FORMAT);
    // The host's version too: what it hands an EP (graph views, inferred shapes) may change.
    line(env!("CARGO_PKG_VERSION"));
    line(what);
    line(&crate::plugin_abi_version());
    line(&d.name);
    line(&d.version);
    line(&lib.name);
    line(&lib.version);
    line(lib.file_sha256().unwrap_or("linked"));
    let mut options = provider.options().to_vec();
    options.sort();
    for (k, v) in &options {
        line(k);
        line(v);
    }
    line(provider.chosen_device().unwrap_or(""));
    for dev in &d.devices {
        line(&format!(
            "{}|{}|{:?}|{}|{}",
            dev.kind, dev.id, dev.id_name, dev.name, dev.driver_version
        ));
    }
    h
}

/// The key of a group's kernel: what it was compiled from (the whole graph's digest, which
/// covers the group's nodes, attributes, weights and the shapes the host knows, and the group's
/// node, input and output ids) and by what ([`provider_hasher`]).
pub(super) fn key(
    provider: &ProviderInstance,
    graph_digest: &str,
    nodes: &[u32],
    inputs: &[u32],
    outputs: &[u32],
) -> String {
    let mut h = provider_hasher(provider, "kernel");
    h.update(graph_digest.as_bytes());
    for ids in [nodes, inputs, outputs] {
        h.update((ids.len() as u64).to_le_bytes());
        for id in ids {
            h.update(id.to_le_bytes());
        }
    }
    hex(&h.finalize())
}

/// The digest of a whole main graph (nodes, attributes, weights, the shapes the host knows),
/// for the keys of capability answers.
pub(super) fn graph_digest(model: &Model) -> Result<String> {
    let g = &model.graph;
    let all: Vec<u32> = (0..g.nodes.len() as u32).collect();
    let ins: Vec<u32> = g.inputs.iter().map(|&v| v as u32).collect();
    let outs: Vec<u32> = g.outputs.iter().map(|&v| v as u32).collect();
    let onnx =
        crate::model::onnx::save::subgraph_model_bytes_with_shapes(model, g, &all, &ins, &outs)?;
    Ok(hex(&Sha256::digest(&onnx)))
}

/// Capability answers of EPs that cache kernels, kept beside their kernels: with every kernel
/// stored, a later session of the same model replays the answers instead of asking (an EP's
/// capability query can cost more than its compile: OpenVINO compiles each op to see whether it
/// runs), and rebuilds every kernel from the cache. A session that replays answers must find
/// every kernel of those EPs stored; otherwise it starts over asking those EPs (see
/// `session::compile`), so an EP never compiles a group it was not asked about.
pub(super) struct Capabilities<'a> {
    cache: &'a KernelCache,
    graph: String,
    /// Replay recorded answers (a missing one fails the pass) rather than ask and record.
    replay: bool,
    /// Per provider: its answer was replayed.
    pub(super) replayed: Vec<bool>,
    /// Answers asked for and not yet written: (provider, key, entry, text).
    pending: Vec<(usize, String, EntryMeta, Vec<u8>)>,
}

impl<'a> Capabilities<'a> {
    pub(super) fn new(
        cache: &'a KernelCache,
        graph: String,
        replay: bool,
        providers: usize,
    ) -> Self {
        Capabilities {
            cache,
            graph,
            replay,
            replayed: vec![false; providers],
            pending: Vec::new(),
        }
    }

    fn key(&self, provider: &ProviderInstance, unclaimed: &[u32]) -> String {
        let mut h = provider_hasher(provider, "capability");
        h.update(self.graph.as_bytes());
        for n in unclaimed {
            h.update(n.to_le_bytes());
        }
        hex(&h.finalize())
    }

    /// The answer of provider `index` (one that caches kernels) for `unclaimed`: replayed, or
    /// asked (and recorded).
    pub(super) fn answer(
        &mut self,
        index: usize,
        provider: &ProviderInstance,
        abi: &AbiGraph<'_>,
        unclaimed: &[u32],
    ) -> Result<(Vec<Vec<usize>>, Declined)> {
        let key = self.key(provider, unclaimed);
        if self.replay {
            let recorded = match self.cache.get(&key) {
                Lookup::Hit(bytes) => parse_answer(&bytes),
                _ => None,
            };
            return match recorded {
                Some((groups, declined)) => {
                    let checked =
                        provider.check_recorded_capability(abi, unclaimed, groups, declined)?;
                    self.replayed[index] = true;
                    Ok(checked)
                }
                // Ends this pass: the session asks the EPs instead.
                None => Err(crate::Error::Run(format!(
                    "no recorded capability answer of {}",
                    provider.name()
                ))),
            };
        }
        let (groups, declined) = provider.capability(abi, unclaimed)?;
        let meta = EntryMeta {
            kind: "partition".into(),
            provider: provider.name().to_string(),
            plugin: format!("{} {}", provider.library.name, provider.library.version),
            nodes: groups.iter().map(Vec::len).sum(),
        };
        self.pending
            .push((index, key, meta, answer_text(&groups, &declined)));
        Ok((groups, declined))
    }

    /// Writes the answers asked for of the providers `all_stored` accepts (every kernel of
    /// theirs is in the cache now).
    pub(super) fn commit(self, all_stored: impl Fn(usize) -> bool) {
        for (index, key, meta, text) in self.pending {
            if !all_stored(index) {
                continue;
            }
            if let Err(e) = self.cache.put(&key, &meta, &text) {
                tracing::debug!(ep = meta.provider, "cannot record a capability answer: {e}");
            }
        }
    }
}

/// A capability answer as text: `group <ids>` lines, then `declined <id> <reason>` lines.
fn answer_text(groups: &[Vec<usize>], declined: &Declined) -> Vec<u8> {
    let mut s = String::new();
    for g in groups {
        s.push_str("group");
        for n in g {
            s.push_str(&format!(" {n}"));
        }
        s.push('\n');
    }
    for (n, reason) in declined {
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        s.push_str(&format!("declined {n} {reason}\n"));
    }
    s.into_bytes()
}

fn parse_answer(bytes: &[u8]) -> Option<(Vec<Vec<usize>>, Declined)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut groups = Vec::new();
    let mut declined = Vec::new();
    for line in text.lines() {
        if let Some(ids) = line.strip_prefix("group") {
            // Node ids are u32 in the ABI; the checks a live answer gets follow.
            let g = ids
                .split_whitespace()
                .map(|n| n.parse::<u32>().ok().map(|n| n as usize))
                .collect::<Option<Vec<usize>>>()?;
            groups.push(g);
        } else if let Some(rest) = line.strip_prefix("declined ") {
            let (n, reason) = rest.split_once(' ').unwrap_or((rest, ""));
            declined.push((n.parse::<u32>().ok()? as usize, reason.to_string()));
        } else {
            return None;
        }
    }
    Some((groups, declined))
}

/// What [`compile_group`] made.
pub(super) enum Compiled {
    /// The kernel, and for an EP that caches kernels, what the cache did.
    Kernel(CompiledKernel, Option<KernelCacheUse>),
    /// `must_load` was set and the kernel could not be rebuilt from the cache.
    NotLoaded,
}

/// Notes on entries an earlier, abandoned pass found wrong (by key): the entry is gone by the
/// time the pass that compiles looks, so it says so itself.
pub(super) type EarlierNotes = std::collections::HashMap<String, Vec<String>>;

/// Compiles one group, through `cache` (with the graph's digest) where the EP can serialize kernels: a stored kernel is
/// rebuilt instead of compiled; a new one is stored. Returns the kernel and, for an EP that
/// caches kernels, what happened for the report.
///
/// `must_load`: the EP's capability answer was replayed, so it may not compile (it was not
/// asked about this graph): [`Compiled::NotLoaded`] unless the kernel is rebuilt from the cache.
pub(super) fn compile_group(
    cache: Option<(&KernelCache, &str)>,
    abi: &AbiGraph<'_>,
    provider: &Arc<ProviderInstance>,
    (nodes, inputs, outputs): (&[u32], &[u32], &[u32]),
    must_load: bool,
    earlier: &mut EarlierNotes,
) -> Result<Compiled> {
    let compile = || provider.compile(abi, nodes, inputs, outputs);
    let Some((cache, digest)) = cache.filter(|_| provider.caches_kernels()) else {
        return Ok(Compiled::Kernel(compile()?, None));
    };
    let name = provider.name();
    let key = key(provider, digest, nodes, inputs, outputs);
    let mut notes = earlier.remove(&key).unwrap_or_default();
    match cache.get(&key) {
        Lookup::Hit(bytes) => {
            match provider.deserialize_kernel(abi, (nodes, inputs, outputs), &bytes) {
                Ok(k) => {
                    tracing::debug!(ep = name, key, bytes = bytes.len(), "kernel from the cache");
                    let note = format!("loaded ({} bytes, entry {})", bytes.len(), &key[..16]);
                    return Ok(Compiled::Kernel(
                        k,
                        Some(KernelCacheUse::new(true, true, note)),
                    ));
                }
                Err(e) => {
                    tracing::warn!(ep = name, key, "the EP did not take its cached kernel: {e}");
                    notes.push(format!("the EP refused its stored kernel ({e})"));
                    // Not offered again, in this session or the next: a new one replaces it.
                    cache.remove(&key);
                }
            }
        }
        Lookup::Damaged(why) => {
            tracing::warn!(ep = name, "a damaged kernel cache entry was ignored: {why}");
            notes.push(format!("a damaged entry was ignored ({why})"));
        }
        Lookup::Miss => {}
    }
    if must_load {
        earlier.insert(key, notes);
        return Ok(Compiled::NotLoaded);
    }
    let kernel = compile()?;
    let mut in_cache = false;
    let stored = match provider.serialize_kernel(&kernel) {
        Ok(Some(bytes)) => {
            let meta = EntryMeta {
                kind: "kernel".into(),
                provider: name.to_string(),
                plugin: format!("{} {}", provider.library.name, provider.library.version),
                nodes: nodes.len(),
            };
            match cache.put(&key, &meta, &bytes) {
                Ok(_) => {
                    in_cache = true;
                    format!(
                        "compiled and stored ({} bytes, entry {})",
                        bytes.len(),
                        &key[..16]
                    )
                }
                Err(e) => {
                    tracing::warn!(ep = name, dir = %cache.dir().display(), "cannot store a compiled kernel: {e}");
                    format!("compiled; not stored: {} ({e})", cache.dir().display())
                }
            }
        }
        Ok(None) => "compiled; the EP cannot store this kernel".to_string(),
        Err(e) => {
            tracing::warn!(ep = name, "serializing a compiled kernel failed: {e}");
            format!("compiled; not stored: {e}")
        }
    };
    notes.push(stored);
    Ok(Compiled::Kernel(
        kernel,
        Some(KernelCacheUse::new(false, in_cache, notes.join("; "))),
    ))
}
