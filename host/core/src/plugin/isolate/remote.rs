//! The host's side of an isolated EP: the child process, the calls made through it, and the
//! restart after it dies.

use std::collections::BTreeMap;
use std::io::Read;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;

use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use epx_plugin_api::abi::{EpxStatusCode, EpxVersion};

use super::config::Isolation;
use super::shm::{Shared, align_up};
use super::wire::{self, Reader, Writer, ask, reply};
use crate::error::{Error, PluginLoadErrorKind as Kind, Result};
use crate::model::ir::{Graph, Model};
use crate::model::onnx::save::subgraph_model_bytes_with_shapes as subgraph_model_bytes;
use crate::plugin::library::{Described, Device, ProviderDescription};
use crate::plugin::probe::{exit_signal, signal_name};
use crate::plugin::refusal::Refusal;
use crate::plugin::sealed::LibraryImage;
use crate::value::{ElementType, Tensor, Value};

/// The descriptor number the shared memory has in the child.
pub(super) const CHILD_SHM_FD: i32 = 3;

/// A running child: its pipes and the memory it shares with this process.
struct Process {
    child: Child,
    /// The child's stdin: one end of a socket pair, written with [`NoSigPipe`] under the call
    /// timeout.
    to: UnixStream,
    from: ChildStdout,
    shm: Shared,
}

impl Drop for Process {
    fn drop(&mut self) {
        // The EP's process and whatever it started in its group.
        crate::child::kill_group(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why the child stopped answering.
enum Lost {
    Died(String),
    Hung,
}

/// Reads from the child's pipe, failing once `deadline` passes.
struct Deadline<'a> {
    from: &'a mut ChildStdout,
    deadline: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            let mut p = libc::pollfd {
                fd: self.from.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd for the call.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n > 0 {
                return self.from.read(buf);
            }
        }
    }
}

/// Writes to the child without SIGPIPE: a child that died makes the write an error on this call,
/// not a signal ending the host (a C program hosting libepx keeps SIGPIPE's default action).
struct NoSigPipe<'a>(&'a UnixStream);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            // SAFETY: a valid socket, and a buffer of `buf.len()` bytes for the call.
            let n = unsafe {
                libc::send(
                    self.0.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Process {
    fn spawn(
        iso: &Isolation,
        library: &LibraryImage,
        preloads: &[LibraryImage],
    ) -> std::io::Result<Self> {
        let shm = Shared::create()?;
        let fd = shm.raw_fd();
        let mut cmd = Command::new(&iso.exe);
        // A group of its own: a timeout or a restart ends everything the EP started.
        crate::child::own_group(&mut cmd);
        cmd.arg("serve-plugin");
        crate::plugin::probe::library_args(&mut cmd, library, preloads);
        cmd.arg("--shm-fd").arg(CHILD_SHM_FD.to_string());
        // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) run.
        unsafe {
            cmd.pre_exec(move || {
                if fd == CHILD_SHM_FD {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, CHILD_SHM_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (to, theirs) = UnixStream::pair()?;
        to.set_write_timeout(Some(iso.timeout))?;
        let mut child = cmd
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let Some(from) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("the child's pipes are missing"));
        };
        Ok(Process {
            child,
            to,
            from,
            shm,
        })
    }

    /// One request and its reply, within `timeout`.
    fn exchange(
        &mut self,
        tag: u8,
        payload: &[u8],
        timeout: Duration,
    ) -> std::result::Result<(u8, Vec<u8>), Lost> {
        if tag != 0 {
            match wire::send(&mut NoSigPipe(&self.to), tag, payload) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(Lost::Hung),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(Lost::Hung),
                Err(_) => return Err(Lost::Died(self.how_it_ended())),
            }
        }
        let mut from = Deadline {
            from: &mut self.from,
            deadline: Instant::now() + timeout,
        };
        match wire::receive(&mut from) {
            Ok(Some(frame)) => Ok(frame),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(Lost::Hung),
            Ok(None) | Err(_) => Err(Lost::Died(self.how_it_ended())),
        }
    }

    /// The child's end, once its pipe closed: killed by a signal, or exited.
    fn how_it_ended(&mut self) -> String {
        let started = Instant::now();
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if started.elapsed() < Duration::from_secs(2) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                _ => break None,
            }
        };
        match status {
            Some(s) => match exit_signal(&s) {
                Some(sig) => format!("was killed by signal {sig} ({})", signal_name(sig)),
                None => format!("ended with {s}"),
            },
            None => "closed its pipe and did not exit".into(),
        }
    }
}

/// The child's first frame: the library's ABI version and EPs, or why it was refused.
fn hello(p: &mut Process, iso: &Isolation) -> std::result::Result<Described, Refusal> {
    let crashed = |why: String| {
        Refusal::new(
            Kind::Crashed,
            format!("the isolated EP process opening it {why}"),
        )
    };
    let (tag, body) = p.exchange(0, &[], iso.timeout).map_err(|l| match l {
        Lost::Died(how) => crashed(how),
        Lost::Hung => crashed(format!(
            "did not finish within {:.0} s (hung; EPX_ISOLATE_TIMEOUT_S sets the limit)",
            iso.timeout.as_secs_f64()
        )),
    })?;
    let bad = |e: String| Refusal::new(Kind::BadDescriptor, format!("isolated EP process: {e}"));
    let mut r = Reader::new(&body);
    match tag {
        reply::HELLO => {
            let name = r.str().map_err(bad)?;
            let lib_version = r.str().map_err(bad)?;
            let abi_version = EpxVersion {
                major: r.u32().map_err(bad)?,
                minor: r.u32().map_err(bad)?,
                patch: r.u32().map_err(bad)?,
            };
            let n = r.count(16).map_err(bad)?;
            let mut providers = Vec::with_capacity(n);
            for _ in 0..n {
                let name = r.str().map_err(bad)?;
                let vendor = r.str().map_err(bad)?;
                let version = r.str().map_err(bad)?;
                let device_type = r.i32().map_err(bad)?;
                let concurrent_kernels = r.u8().map_err(bad)? != 0;
                let availability = match r.u8().map_err(bad)? {
                    0 => Ok(()),
                    _ => Err(r.str().map_err(bad)?),
                };
                let (devices, devices_error) = read_devices(&mut r).map_err(bad)?;
                providers.push(ProviderDescription {
                    name,
                    vendor,
                    version,
                    device_type,
                    concurrent_kernels,
                    availability,
                    devices,
                    devices_error,
                });
            }
            Ok(Described {
                name,
                version: lib_version,
                abi_version,
                providers,
            })
        }
        reply::REFUSED => {
            let kind = kind_from_code(r.u8().map_err(bad)?);
            Err(Refusal::new(kind, r.str().map_err(bad)?))
        }
        other => Err(bad(format!("unexpected first message {other:#x}"))),
    }
}

fn optional(r: &mut Reader<'_>) -> wire::WireResult<Option<String>> {
    Ok(match r.u8()? {
        0 => None,
        _ => Some(r.str()?),
    })
}

pub(super) fn put_optional(w: &mut Writer, s: Option<&str>) {
    match s {
        None => w.u8(0),
        Some(s) => w.u8(1).str(s),
    };
}

/// An EP's devices as the child read them from the library.
fn read_devices(r: &mut Reader<'_>) -> wire::WireResult<(Vec<Device>, Option<String>)> {
    let n = r.count(27)?;
    let mut devices = Vec::with_capacity(n);
    for _ in 0..n {
        let kind = match r.u8()? {
            1 => "cpu",
            2 => "gpu",
            3 => "npu",
            _ => "other",
        };
        devices.push(Device {
            kind,
            id: r.u32()?,
            id_name: optional(r)?,
            vendor: r.str()?,
            name: r.str()?,
            memory_bytes: Some(r.u64()?).filter(|&m| m > 0),
            driver_version: r.str()?,
            unusable: optional(r)?,
        });
    }
    Ok((devices, optional(r)?))
}

pub(super) fn put_devices(w: &mut Writer, d: &ProviderDescription) {
    w.u32(d.devices.len() as u32);
    for dev in &d.devices {
        let kind = match dev.kind {
            "cpu" => 1,
            "gpu" => 2,
            "npu" => 3,
            _ => 0,
        };
        w.u8(kind).u32(dev.id);
        put_optional(w, dev.id_name.as_deref());
        w.str(&dev.vendor)
            .str(&dev.name)
            .u64(dev.memory_bytes.unwrap_or(0))
            .str(&dev.driver_version);
        put_optional(w, dev.unusable.as_deref());
    }
    put_optional(w, d.devices_error.as_deref());
}

const KINDS: [Kind; 11] = [
    Kind::Open,
    Kind::MissingDependency,
    Kind::MissingEntry,
    Kind::AbiMismatch,
    Kind::EntryFailed,
    Kind::EntryPanicked,
    Kind::BadDescriptor,
    Kind::Refused,
    Kind::ChecksumMismatch,
    Kind::ManifestMismatch,
    Kind::Crashed,
];

pub(super) fn kind_code(k: Kind) -> u8 {
    KINDS.iter().position(|&x| x == k).unwrap_or(0) as u8
}

fn kind_from_code(c: u8) -> Kind {
    KINDS.get(c as usize).copied().unwrap_or(Kind::Open)
}

/// Opens `library` in a child process and returns what its entry function described, without
/// opening it here (plugins whose manifest says `isolate = true`).
pub fn describe(
    iso: &Isolation,
    library: &LibraryImage,
    preloads: &[LibraryImage],
) -> std::result::Result<Described, Refusal> {
    let mut p = Process::spawn(iso, library, preloads).map_err(|e| {
        Refusal::new(
            Kind::Crashed,
            format!(
                "cannot start {} to host the isolated EP: {e}",
                iso.exe.display()
            ),
        )
    })?;
    hello(&mut p, iso)
}

/// An EP instance living in a child process.
pub(crate) struct Remote {
    name: String,
    iso: Isolation,
    library: LibraryImage,
    preloads: Vec<LibraryImage>,
    index: usize,
    options: Vec<(String, String)>,
    state: Mutex<State>,
}

/// A compiled kernel's subgraph (ONNX bytes) and its input and output counts.
struct Stored {
    model: Vec<u8>,
    inputs: usize,
    outputs: usize,
}

/// Groups of claimed node ids, and (node id, reason) of the declined ones.
pub(crate) type Claims = (Vec<Vec<usize>>, Vec<(usize, String)>);

#[derive(Default)]
struct State {
    process: Option<Process>,
    /// Each compiled kernel's subgraph, to compile again in a restarted child.
    kernels: BTreeMap<u64, Stored>,
    next_kernel: u64,
    /// Children started after the first.
    restarts: u32,
}

fn provider_error(name: &str, call: &'static str, code: EpxStatusCode, message: String) -> Error {
    Error::Provider {
        provider: name.to_string(),
        call,
        code,
        message,
    }
}

impl Remote {
    /// Starts the child, checks it hosts EP `index` as `description`, and creates the EP there.
    pub(crate) fn start(
        iso: Isolation,
        library: LibraryImage,
        preloads: Vec<LibraryImage>,
        index: usize,
        description: &ProviderDescription,
        options: &[(String, String)],
    ) -> Result<Self> {
        if !description.uses_host_memory() {
            return Err(Error::ProviderSetup {
                name: description.name.clone(),
                message: format!(
                    "cannot run isolated: its tensors live in device memory (DLPack device type \
                     {}), and only host-memory EPs can share tensors with a child process",
                    description.device_type
                ),
            });
        }
        let remote = Remote {
            name: description.name.clone(),
            iso,
            library,
            preloads,
            index,
            options: options.to_vec(),
            state: Mutex::new(State::default()),
        };
        let mut st = remote.lock();
        remote.process(&mut st, "create")?;
        drop(st);
        Ok(remote)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running child, started (and its EP created, its kernels compiled again) if there is
    /// none: the first call, or the first after a crash.
    fn process<'s>(&self, st: &'s mut State, call: &'static str) -> Result<&'s mut Process> {
        if st.process.is_none() {
            let setup = |m: String| {
                provider_error(
                    &self.name,
                    call,
                    EpxStatusCode::Unavailable,
                    format!("starting its isolated process: {m}"),
                )
            };
            let mut p = Process::spawn(&self.iso, &self.library, &self.preloads)
                .map_err(|e| setup(format!("cannot run {}: {e}", self.iso.exe.display())))?;
            let providers = hello(&mut p, &self.iso)
                .map_err(|r| setup(r.message))?
                .providers;
            if providers.get(self.index).map(|d| &d.name) != Some(&self.name) {
                return Err(setup(format!(
                    "the library no longer has EP `{}` at position {}",
                    self.name, self.index
                )));
            }
            let mut w = Writer::default();
            w.u32(self.index as u32).u32(self.options.len() as u32);
            for (k, v) in &self.options {
                w.str(k).str(v);
            }
            st.process = Some(p);
            if call != "create" {
                st.restarts += 1;
                tracing::warn!(
                    provider = %self.name,
                    restarts = st.restarts,
                    "restarting the isolated EP process"
                );
            }
            let created = self.exchange(st, ask::CREATE, &w.0, call);
            if let Err(e) = created {
                st.process = None;
                return Err(match e {
                    Error::Provider { message, code, .. } if call == "create" => {
                        Error::ProviderSetup {
                            name: self.name.clone(),
                            message: format!("{message} ({code:?})"),
                        }
                    }
                    e => e,
                });
            }
            // Taken out while they are sent (no copy of their weights), then put back.
            let kernels = std::mem::take(&mut st.kernels);
            let mut failed = None;
            for (&id, k) in &kernels {
                if let Err(e) = self.compile_in_child(st, id, &k.model, k.inputs, k.outputs, call) {
                    failed = Some(e);
                    break;
                }
            }
            st.kernels = kernels;
            if let Some(e) = failed {
                // A child missing some of the session's kernels must not serve the next call:
                // it starts over then.
                st.process = None;
                return Err(e);
            }
        }
        st.process
            .as_mut()
            .ok_or_else(|| setup_lost(&self.name, call))
    }

    /// Sends a request and returns the reply's body; an error reply becomes the EP's error, a
    /// dead or hung child an error saying so (the child is gone; the next call starts another).
    fn exchange(
        &self,
        st: &mut State,
        tag: u8,
        payload: &[u8],
        call: &'static str,
    ) -> Result<Vec<u8>> {
        let p = st
            .process
            .as_mut()
            .ok_or_else(|| setup_lost(&self.name, call))?;
        let got = p.exchange(tag, payload, self.iso.timeout);
        let lost = |what: String| {
            provider_error(
                &self.name,
                call,
                EpxStatusCode::RuntimeError,
                format!(
                    "its isolated process {what}; this call failed, and the next one starts a new \
                     process (compiling the session's kernels for it again)"
                ),
            )
        };
        match got {
            Ok((reply::OK, body)) => Ok(body),
            Ok((reply::ERR, body)) => {
                let mut r = Reader::new(&body);
                let code = EpxStatusCode::from_raw(r.u32().unwrap_or(1));
                let message = r.str().unwrap_or_else(|e| e);
                Err(provider_error(&self.name, call, code, message))
            }
            Ok((other, _)) => {
                st.process = None;
                Err(lost(format!("answered with unknown message {other:#x}")))
            }
            Err(Lost::Died(how)) => {
                st.process = None;
                Err(lost(how))
            }
            Err(Lost::Hung) => {
                st.process = None;
                Err(lost(format!(
                    "did not answer within {:.0} s and was killed (EPX_ISOLATE_TIMEOUT_S sets \
                     the limit)",
                    self.iso.timeout.as_secs_f64()
                )))
            }
        }
    }

    /// Asks the child which of `unclaimed` (ids of `g`'s nodes) its EP runs.
    pub(crate) fn capability(&self, model: &Model, g: &Graph, unclaimed: &[u32]) -> Result<Claims> {
        let call = "get_capability";
        let all: Vec<u32> = (0..g.nodes.len() as u32).collect();
        let inputs: Vec<u32> = g.inputs.iter().map(|&v| v as u32).collect();
        let outputs: Vec<u32> = g.outputs.iter().map(|&v| v as u32).collect();
        let bytes = subgraph_model_bytes(model, g, &all, &inputs, &outputs)?;
        let mut w = Writer::default();
        w.u64(bytes.len() as u64).u32(g.nodes.len() as u32);
        for n in &g.nodes {
            w.str(&node_key(g, n));
        }
        w.u32s(unclaimed);
        let mut st = self.lock();
        let p = self.process(&mut st, call)?;
        put_model(p, &bytes)?;
        let body = self.exchange(&mut st, ask::CAPABILITY, &w.0, call)?;
        let bad = |e: String| {
            provider_error(&self.name, call, EpxStatusCode::InvalidGraph, e.to_string())
        };
        let mut r = Reader::new(&body);
        let ng = r.count(4).map_err(bad)?;
        let mut groups = Vec::with_capacity(ng);
        for _ in 0..ng {
            groups.push(
                r.u32s()
                    .map_err(bad)?
                    .into_iter()
                    .map(|n| n as usize)
                    .collect(),
            );
        }
        let nd = r.count(8).map_err(bad)?;
        let mut declined = Vec::with_capacity(nd);
        for _ in 0..nd {
            declined.push((r.u32().map_err(bad)? as usize, r.str().map_err(bad)?));
        }
        Ok((groups, declined))
    }

    /// Compiles nodes `nodes` of `g` in the child; returns the kernel's id there.
    pub(crate) fn compile(
        &self,
        model: &Model,
        g: &Graph,
        nodes: &[u32],
        inputs: &[u32],
        outputs: &[u32],
    ) -> Result<u64> {
        let bytes = subgraph_model_bytes(model, g, nodes, inputs, outputs)?;
        let mut st = self.lock();
        let id = st.next_kernel;
        st.next_kernel += 1;
        self.process(&mut st, "compile")?;
        self.compile_in_child(&mut st, id, &bytes, inputs.len(), outputs.len(), "compile")?;
        st.kernels.insert(
            id,
            Stored {
                model: bytes,
                inputs: inputs.len(),
                outputs: outputs.len(),
            },
        );
        Ok(id)
    }

    fn compile_in_child(
        &self,
        st: &mut State,
        id: u64,
        model: &[u8],
        num_inputs: usize,
        num_outputs: usize,
        call: &'static str,
    ) -> Result<()> {
        let p = st
            .process
            .as_mut()
            .ok_or_else(|| setup_lost(&self.name, call))?;
        put_model(p, model)?;
        let mut w = Writer::default();
        w.u64(id)
            .u64(model.len() as u64)
            .u32(num_inputs as u32)
            .u32(num_outputs as u32);
        self.exchange(st, ask::COMPILE, &w.0, call).map(drop)
    }

    /// Runs kernel `id` on host tensors; returns its outputs.
    pub(crate) fn execute(
        &self,
        id: u64,
        inputs: &[Option<&Value>],
        num_outputs: usize,
    ) -> Result<Vec<Value>> {
        let call = "execute";
        let bad = |m: String| provider_error(&self.name, call, EpxStatusCode::InvalidArgument, m);
        let mut tensors = Vec::with_capacity(inputs.len());
        let mut end = 0usize;
        for (i, v) in inputs.iter().enumerate() {
            let Some(v) = v else {
                tensors.push(None);
                continue;
            };
            let Value::Host(t) = v else {
                return Err(bad(format!(
                    "input {i} is a {}: an isolated EP takes host tensors",
                    v.type_name()
                )));
            };
            let bytes = t.bytes().ok_or_else(|| {
                bad(format!(
                    "input {i} is a string tensor: an isolated EP takes numeric tensors"
                ))
            })?;
            tensors.push(Some((t, end)));
            end = align_up(end + bytes.len()).ok_or_else(|| bad("inputs too large".into()))?;
        }
        let mut st = self.lock();
        let p = self.process(&mut st, call)?;
        p.shm
            .ensure(end)
            .map_err(|e| bad(format!("shared memory of {end} bytes: {e}")))?;
        let mut w = Writer::default();
        w.u64(id).u64(p.shm.len() as u64).u32(tensors.len() as u32);
        for t in &tensors {
            match t {
                None => {
                    w.u8(0);
                }
                Some((t, at)) => {
                    let bytes = t.bytes().unwrap_or_default();
                    p.shm
                        .bytes_mut(*at, bytes.len())
                        .ok_or_else(|| bad("shared memory too small".into()))?
                        .copy_from_slice(bytes);
                    w.u8(1);
                    put_tensor_header(&mut w, t.elem_type(), t.shape(), *at, bytes.len());
                }
            }
        }
        let body = self.exchange(&mut st, ask::EXECUTE, &w.0, call)?;
        let nonsense = |m: String| provider_error(&self.name, call, EpxStatusCode::InvalidGraph, m);
        let p = st
            .process
            .as_mut()
            .ok_or_else(|| setup_lost(&self.name, call))?;
        let mut r = Reader::new(&body);
        let size = r.usize().map_err(nonsense)?;
        if size > p.shm.len() {
            p.shm
                .remap()
                .map_err(|e| nonsense(format!("shared memory: {e}")))?;
        }
        let n = r.count(1).map_err(nonsense)?;
        if n != num_outputs {
            return Err(nonsense(format!(
                "returned {n} outputs, the subgraph has {num_outputs}"
            )));
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let (elem, shape, at, len) = read_tensor_header(&mut r).map_err(nonsense)?;
            let bytes = p.shm.bytes(at, len).ok_or_else(|| {
                nonsense(format!(
                    "output {i} lies outside the shared memory ({at}+{len} of {} bytes)",
                    p.shm.len()
                ))
            })?;
            let t = Tensor::from_bytes(elem, &shape, bytes)
                .map_err(|e| nonsense(format!("output {i}: {e}")))?;
            out.push(Value::Host(t));
        }
        Ok(out)
    }

    /// Forgets kernel `id` (its session dropped it).
    pub(crate) fn release(&self, id: u64) {
        let mut st = self.lock();
        st.kernels.remove(&id);
        if let Some(p) = st.process.as_mut() {
            let mut w = Writer::default();
            w.u64(id);
            // No reply: a dead child has nothing to release.
            let _ = wire::send(&mut NoSigPipe(&p.to), ask::RELEASE, &w.0);
        }
    }

    /// How many times the child was started again after dying or hanging.
    pub(crate) fn restarts(&self) -> u32 {
        self.lock().restarts
    }
}

fn setup_lost(name: &str, call: &'static str) -> Error {
    provider_error(
        name,
        call,
        EpxStatusCode::Fail,
        "its isolated process is gone".into(),
    )
}

/// A node as both processes can name it: its output names.
pub(super) fn node_key(g: &Graph, n: &crate::model::ir::Node) -> String {
    let names: Vec<&str> = n
        .outputs
        .iter()
        .map(|v| v.map_or("", |v| g.values[v].name.as_str()))
        .collect();
    names.join("\n")
}

/// Writes a model's bytes at the start of the shared memory.
fn put_model(p: &mut Process, bytes: &[u8]) -> Result<()> {
    let err = |m: String| Error::InvalidInput(format!("isolated EP: {m}"));
    p.shm
        .ensure(bytes.len())
        .map_err(|e| err(format!("shared memory of {} bytes: {e}", bytes.len())))?;
    p.shm
        .bytes_mut(0, bytes.len())
        .ok_or_else(|| err("shared memory too small".into()))?
        .copy_from_slice(bytes);
    Ok(())
}

pub(super) fn put_tensor_header(
    w: &mut Writer,
    elem: ElementType,
    shape: &[usize],
    at: usize,
    len: usize,
) {
    w.i32(elem.onnx_code()).u32(shape.len() as u32);
    for &d in shape {
        w.u64(d as u64);
    }
    w.u64(at as u64).u64(len as u64);
}

pub(super) fn read_tensor_header(
    r: &mut Reader<'_>,
) -> wire::WireResult<(ElementType, Vec<usize>, usize, usize)> {
    let code = r.i32()?;
    let elem =
        ElementType::from_onnx(code).ok_or_else(|| format!("unknown element type {code}"))?;
    let rank = r.count(8)?;
    let shape = (0..rank)
        .map(|_| r.usize())
        .collect::<wire::WireResult<_>>()?;
    Ok((elem, shape, r.usize()?, r.usize()?))
}
