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
use crate::plugin::{CompiledKernel, ProviderInstance};

/// Version of the key's layout: a change here is a change of every key.
const KEY_FORMAT: &str = "epx kernel key 1";

/// The key of a group's kernel: what it was compiled from (the group as standalone ONNX, with
/// the shapes the host knows and the initializers' contents), by what (the EP, its version, the
/// plugin's name, version and library digest), and for what (the EP's options, the device the
/// session chose, and every device the EP lists with its driver version).
pub(super) fn key(
    provider: &ProviderInstance,
    model: &Model,
    nodes: &[u32],
    inputs: &[u32],
    outputs: &[u32],
) -> Result<String> {
    let g = &model.graph;
    let onnx = crate::model::onnx::save::subgraph_model_bytes_with_shapes(
        model, g, nodes, inputs, outputs,
    )?;
    let lib = &provider.library;
    let d = &provider.description;
    let mut h = Sha256::new();
    let mut line = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    line(KEY_FORMAT);
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
    h.update(&onnx);
    Ok(hex(&h.finalize()))
}

/// Compiles one group, through `cache` where the EP can serialize kernels: a stored kernel is
/// rebuilt instead of compiled; a new one is stored. Returns the kernel and, for an EP that
/// caches kernels, what happened for the report.
pub(super) fn compile_group(
    cache: Option<&KernelCache>,
    abi: &AbiGraph<'_>,
    provider: &Arc<ProviderInstance>,
    nodes: &[u32],
    inputs: &[u32],
    outputs: &[u32],
) -> Result<(CompiledKernel, Option<KernelCacheUse>)> {
    let compile = || provider.compile(abi, nodes, inputs, outputs);
    let Some(cache) = cache.filter(|_| provider.caches_kernels()) else {
        return Ok((compile()?, None));
    };
    let name = provider.name();
    let key = match key(provider, abi.model, nodes, inputs, outputs) {
        Ok(k) => k,
        Err(e) => {
            let note = format!("compiled; no cache key: {e}");
            return Ok((compile()?, Some(KernelCacheUse::new(false, note))));
        }
    };
    let mut notes = Vec::new();
    match cache.get(&key) {
        Lookup::Hit(bytes) => {
            match provider.deserialize_kernel(abi, (nodes, inputs, outputs), &bytes) {
                Ok(k) => {
                    tracing::debug!(ep = name, key, bytes = bytes.len(), "kernel from the cache");
                    let note = format!("loaded ({} bytes, entry {})", bytes.len(), &key[..16]);
                    return Ok((k, Some(KernelCacheUse::new(true, note))));
                }
                Err(e) => {
                    tracing::warn!(ep = name, key, "the EP did not take its cached kernel: {e}");
                    notes.push(format!("the EP refused its stored kernel ({e})"));
                }
            }
        }
        Lookup::Damaged(why) => {
            tracing::warn!(ep = name, "a damaged kernel cache entry was ignored: {why}");
            notes.push(format!("a damaged entry was ignored ({why})"));
        }
        Lookup::Miss => {}
    }
    let kernel = compile()?;
    let stored = match provider.serialize_kernel(&kernel) {
        Ok(Some(bytes)) => {
            let meta = EntryMeta {
                provider: name.to_string(),
                plugin: format!("{} {}", provider.library.name, provider.library.version),
                nodes: nodes.len(),
            };
            match cache.put(&key, &meta, &bytes) {
                Ok(_) => format!(
                    "compiled and stored ({} bytes, entry {})",
                    bytes.len(),
                    &key[..16]
                ),
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
    Ok((kernel, Some(KernelCacheUse::new(false, notes.join("; ")))))
}
