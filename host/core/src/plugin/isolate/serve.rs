//! The child's side of an isolated EP (`epx serve-plugin`, hidden): opens the library, then
//! answers the host's requests with the real plugin until the host closes the pipe.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use epx_plugin_api::abi::EpxStatusCode;

use super::remote::{kind_code, node_key, put_devices, put_tensor_header, read_tensor_header};
use super::shm::{Shared, align_up};
use super::wire::{self, Reader, Writer, ask, reply};
use crate::error::Error;
use crate::error::PluginLoadErrorKind as Kind;
use crate::model::onnx::load_model_bytes;
use crate::plugin::host_api::AbiGraph;
use crate::plugin::library::PluginLibrary;
use crate::plugin::provider::{CompiledKernel, ProviderInstance};
use crate::plugin::refusal::Refusal;
use crate::plugin::sealed::LibraryImage;
use crate::value::{Tensor, Value};

/// A failed request: the status code and message sent back.
struct Failure(EpxStatusCode, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Provider { code, message, .. } => Failure(code, message),
            e => Failure(EpxStatusCode::Fail, e.to_string()),
        }
    }
}

impl From<String> for Failure {
    fn from(m: String) -> Self {
        Failure(EpxStatusCode::InvalidArgument, m)
    }
}

struct Server {
    library: Arc<PluginLibrary>,
    provider: Option<Arc<ProviderInstance>>,
    kernels: HashMap<u64, CompiledKernel>,
    shm: Shared,
}

/// Serves the host on stdin/stdout until it closes stdin; returns the exit code. `library` and
/// `preloads` are this process's own sealed copies, checked against the digests the host gave
/// ([`crate::plugin::probe::images_from_args`]); `shm_fd` is the shared memory the host passed
/// down.
pub fn serve(library: Result<(LibraryImage, Vec<LibraryImage>), String>, shm_fd: i32) -> i32 {
    // The protocol gets a private copy of stdout; whatever the plugin prints goes to stderr.
    // SAFETY: plain descriptor calls on this process's own standard streams.
    let proto = unsafe {
        let fd = libc::dup(1);
        if fd < 0 || libc::dup2(2, 1) < 0 {
            eprintln!("epx serve-plugin: cannot set up its pipes");
            return 2;
        }
        File::from_raw_fd(fd)
    };
    let mut out = std::io::BufWriter::new(proto);
    watch_parent();
    // SAFETY: the host's spawn put the shared memory at `shm_fd` for this process alone.
    let shm = match unsafe { Shared::inherit(shm_fd) } {
        Ok(s) => s,
        Err(e) => {
            eprintln!("epx serve-plugin: no shared memory at descriptor {shm_fd}: {e}");
            return 2;
        }
    };
    let opened = library
        .map_err(|why| Refusal::new(Kind::Open, why))
        .and_then(|(library, preloads)| PluginLibrary::open(&library, &preloads));
    let library = match opened {
        Ok(l) => l,
        Err(refusal) => {
            let mut w = Writer::default();
            w.u8(kind_code(refusal.kind)).str(&refusal.message);
            let _ = wire::send(&mut out, reply::REFUSED, &w.0);
            return 0;
        }
    };
    let mut w = Writer::default();
    w.str(&library.name)
        .str(&library.version)
        .u32(library.abi_version.major)
        .u32(library.abi_version.minor)
        .u32(library.abi_version.patch)
        .u32(library.providers.len() as u32);
    for d in &library.providers {
        w.str(&d.name)
            .str(&d.vendor)
            .str(&d.version)
            .i32(d.device_type)
            .u8(d.concurrent_kernels as u8);
        match &d.availability {
            Ok(()) => w.u8(0),
            Err(why) => w.u8(1).str(why),
        };
        put_devices(&mut w, d);
    }
    if wire::send(&mut out, reply::HELLO, &w.0).is_err() {
        return 0;
    }
    let mut server = Server {
        library,
        provider: None,
        kernels: HashMap::new(),
        shm,
    };
    let mut input = std::io::stdin().lock();
    loop {
        let (tag, body) = match wire::receive(&mut input) {
            Ok(Some(f)) => f,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("epx serve-plugin: reading a request: {e}");
                return 2;
            }
        };
        if tag == ask::RELEASE {
            if let Ok(id) = Reader::new(&body).u64() {
                server.kernels.remove(&id);
            }
            continue;
        }
        let answer = server.handle(tag, &body);
        let sent = match answer {
            Ok(w) => wire::send(&mut out, reply::OK, &w.0),
            Err(Failure(code, message)) => {
                let mut w = Writer::default();
                w.u32(code as u32).str(&message);
                wire::send(&mut out, reply::ERR, &w.0)
            }
        };
        if sent.and_then(|()| out.flush()).is_err() {
            return 0;
        }
    }
}

/// Ends this process when its parent is gone: a plugin stuck in a call never reads the closed
/// pipe, and must not outlive the host as an orphan.
fn watch_parent() {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(250));
            // SAFETY: as above.
            if unsafe { libc::getppid() } != parent {
                // SAFETY: _exit ends the process without running handlers a stuck plugin
                // might hold locks for.
                unsafe { libc::_exit(0) };
            }
        }
    });
}

impl Server {
    fn handle(&mut self, tag: u8, body: &[u8]) -> Result<Writer, Failure> {
        let mut r = Reader::new(body);
        match tag {
            ask::CREATE => self.create(&mut r),
            ask::CAPABILITY => self.capability(&mut r),
            ask::COMPILE => self.compile(&mut r),
            ask::EXECUTE => self.execute(&mut r),
            other => Err(format!("unknown request {other:#x}").into()),
        }
    }

    fn provider(&self) -> Result<&Arc<ProviderInstance>, Failure> {
        self.provider
            .as_ref()
            .ok_or_else(|| "no EP was created in this process".to_string().into())
    }

    fn create(&mut self, r: &mut Reader<'_>) -> Result<Writer, Failure> {
        let index = r.u32()? as usize;
        let n = r.count(8)?;
        let mut options = Vec::with_capacity(n);
        for _ in 0..n {
            options.push((r.str()?, r.str()?));
        }
        let p = ProviderInstance::create(&self.library, index, &options).map_err(|e| match e {
            Error::ProviderSetup { message, .. } => {
                Failure(EpxStatusCode::InvalidArgument, message)
            }
            e => e.into(),
        })?;
        self.provider = Some(p);
        Ok(Writer::default())
    }

    /// The model the host wrote at the start of the shared memory.
    fn model(&mut self, len: usize) -> Result<crate::model::ir::Model, Failure> {
        if len > self.shm.len() {
            self.shm
                .remap()
                .map_err(|e| format!("shared memory: {e}"))?;
        }
        let bytes = self
            .shm
            .bytes(0, len)
            .ok_or_else(|| format!("a model of {len} bytes does not fit the shared memory"))?;
        Ok(load_model_bytes(bytes, "the host's graph", None)?)
    }

    fn capability(&mut self, r: &mut Reader<'_>) -> Result<Writer, Failure> {
        let len = r.usize()?;
        let n = r.count(4)?;
        let keys: Vec<String> = (0..n).map(|_| r.str()).collect::<Result<_, _>>()?;
        let unclaimed = r.u32s()?;
        let model = self.model(len)?;
        let g = &model.graph;
        // Node ids are the host's; the loaded graph may order nodes differently, so nodes are
        // matched by their output names.
        let here: HashMap<String, u32> = g
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node_key(g, node), i as u32))
            .collect();
        if g.nodes.len() != keys.len() {
            return Err(format!(
                "the graph has {} nodes here and {} in the host",
                g.nodes.len(),
                keys.len()
            )
            .into());
        }
        if here.len() != keys.len() {
            return Err(
                "nodes of the graph share their output names; they cannot be matched \
                        with the host's"
                    .to_string()
                    .into(),
            );
        }
        let mut to_host = vec![u32::MAX; keys.len()];
        for (host_id, k) in keys.iter().enumerate() {
            let &mine = here
                .get(k)
                .ok_or_else(|| format!("node {host_id} of the host's graph is not here"))?;
            to_host[mine as usize] = host_id as u32;
        }
        let to_mine: HashMap<u32, u32> = to_host
            .iter()
            .enumerate()
            .map(|(mine, &h)| (h, mine as u32))
            .collect();
        let mut offered = unclaimed
            .iter()
            .map(|h| {
                to_mine
                    .get(h)
                    .copied()
                    .ok_or_else(|| format!("unclaimed node {h} is out of range"))
            })
            .collect::<Result<Vec<u32>, String>>()?;
        offered.sort_unstable();
        let abi = AbiGraph::new(&model);
        let (groups, declined) = self.provider()?.capability(&abi, &offered)?;
        let mut w = Writer::default();
        w.u32(groups.len() as u32);
        for grp in &groups {
            let ids: Vec<u32> = grp.iter().map(|&n| to_host[n]).collect();
            w.u32s(&ids);
        }
        w.u32(declined.len() as u32);
        for (n, why) in &declined {
            w.u32(to_host[*n]).str(why);
        }
        Ok(w)
    }

    fn compile(&mut self, r: &mut Reader<'_>) -> Result<Writer, Failure> {
        let id = r.u64()?;
        let len = r.usize()?;
        let (num_inputs, num_outputs) = (r.u32()? as usize, r.u32()? as usize);
        let model = self.model(len)?;
        let g = &model.graph;
        if g.inputs.len() != num_inputs || g.outputs.len() != num_outputs {
            return Err(format!(
                "the subgraph has {} inputs and {} outputs here, {num_inputs} and {num_outputs} \
                 in the host",
                g.inputs.len(),
                g.outputs.len()
            )
            .into());
        }
        let ids = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        let nodes: Vec<u32> = (0..g.nodes.len() as u32).collect();
        let abi = AbiGraph::new(&model);
        let kernel = self
            .provider()?
            .compile(&abi, &nodes, &ids(&g.inputs), &ids(&g.outputs))?;
        self.kernels.insert(id, kernel);
        Ok(Writer::default())
    }

    fn execute(&mut self, r: &mut Reader<'_>) -> Result<Writer, Failure> {
        let id = r.u64()?;
        let size = r.usize()?;
        if size > self.shm.len() {
            self.shm
                .remap()
                .map_err(|e| format!("shared memory: {e}"))?;
        }
        let n = r.count(1)?;
        let mut inputs = Vec::with_capacity(n);
        let mut end = 0usize;
        for i in 0..n {
            if r.u8()? == 0 {
                inputs.push(None);
                continue;
            }
            let (elem, shape, at, len) = read_tensor_header(r)?;
            let bytes = self
                .shm
                .bytes(at, len)
                .ok_or_else(|| format!("input {i} lies outside the shared memory"))?;
            end = end.max(align_up(at + len).unwrap_or(usize::MAX));
            inputs.push(Some(Value::Host(Tensor::from_bytes(elem, &shape, bytes)?)));
        }
        let kernel = self
            .kernels
            .get(&id)
            .ok_or_else(|| format!("no kernel {id} in this process"))?;
        let refs: Vec<Option<&Value>> = inputs.iter().map(Option::as_ref).collect();
        let outputs = kernel.execute(&refs, None)?;
        drop(inputs);
        let mut placed = Vec::with_capacity(outputs.len());
        for (i, v) in outputs.iter().enumerate() {
            let t = match v {
                Value::Host(t) if t.bytes().is_some() => t,
                v => {
                    return Err(Failure(
                        EpxStatusCode::NotImplemented,
                        format!(
                            "output {i} is a {}: an isolated EP returns numeric host tensors",
                            v.type_name()
                        ),
                    ));
                }
            };
            let len = t.bytes().map_or(0, <[u8]>::len);
            placed.push((t, end));
            end = align_up(end + len).ok_or_else(|| "outputs too large".to_string())?;
        }
        self.shm
            .ensure(end)
            .map_err(|e| Failure(EpxStatusCode::OutOfMemory, format!("shared memory: {e}")))?;
        let mut w = Writer::default();
        w.u64(self.shm.len() as u64).u32(placed.len() as u32);
        for (t, at) in placed {
            let bytes = t.bytes().unwrap_or_default();
            self.shm
                .bytes_mut(at, bytes.len())
                .ok_or_else(|| "shared memory too small".to_string())?
                .copy_from_slice(bytes);
            put_tensor_header(&mut w, t.elem_type(), t.shape(), at, bytes.len());
        }
        Ok(w)
    }
}
