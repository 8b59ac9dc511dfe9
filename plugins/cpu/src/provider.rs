//! The CPU EP behind the plugin ABI: capability from the op registry, compile into a small
//! program of op kernels, execute on host memory.

use epx_plugin_api::ElementType;
use epx_plugin_api::dlpack::DLDeviceType;
use epx_plugin_api::sdk::{
    self, Attribute, Error, GraphView, Kernel, KernelContext, OwnedValue, Provider,
    ProviderFactory, ProviderInfo, ProviderOptions, SubgraphView, TensorView, ValueRef,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::error::OpError;
use crate::exec::passes::CompileOptions;
use crate::exec::program::{Program, compile_options};
use crate::kernel::is_control_flow;
use crate::ops::registry;
use crate::tensor::{MapValue, Sequence, Tensor, TensorRef, packed_bits};

/// Name the CPU EP registers under.
pub const CPU_PROVIDER_NAME: &str = "cpu";

/// Makes CPU EP instances.
#[derive(Debug, Default)]
pub struct CpuFactory;

impl ProviderFactory for CpuFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: CPU_PROVIDER_NAME.into(),
            vendor: "epx".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            device_type: DLDeviceType::Cpu,
            concurrent_kernels: true,
        }
    }

    /// The one device: this machine's processor, named as `/proc/cpuinfo` names it, with the
    /// kernel level the EP runs (or why the level asked for cannot run here).
    fn devices(&self) -> sdk::Result<Vec<sdk::DeviceInfo>> {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |key: &str| {
            info.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == key).then(|| v.trim().to_string())
                })
                .unwrap_or_default()
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (kernels, unusable) = match crate::fast::configured_isa() {
            Ok(isa) => (isa.name.to_string(), None),
            Err(e) => (String::new(), Some(e)),
        };
        Ok(vec![sdk::DeviceInfo {
            kind: sdk::DeviceKind::Cpu,
            device_id: 0,
            id_name: String::new(),
            vendor: field("vendor_id"),
            name: format!("{} ({cores} cores)", field("model name")),
            memory_bytes: 0,
            driver_version: format!("epx-cpu {}, kernels: {kernels}", env!("CARGO_PKG_VERSION")),
            unusable,
        }])
    }

    fn create(&self, mut options: ProviderOptions) -> sdk::Result<Box<dyn Provider>> {
        // A kernel level the environment asks for but this CPU cannot run is an error here,
        // not a silent fall back to another level.
        crate::fast::configured_isa().map_err(Error::invalid_argument)?;
        let threads = options
            .take_parsed::<usize>("intra_op_num_threads", "a thread count (0: one per core)")?;
        let passes = options.take("disable_passes");
        let compile = compile_options(passes.as_deref()).map_err(Error::invalid_argument)?;
        // The one device it lists is this processor.
        if let Some(d) = options.take_device()?
            && d != 0
        {
            return Err(Error::invalid_argument(format!(
                "cpu has no device {d}; its one device is 0"
            )));
        }
        options.finish()?;
        let threads = match threads {
            None | Some(0) => std::thread::available_parallelism().map_or(1, |n| n.get()),
            Some(n) if n > MAX_THREADS => {
                return Err(Error::invalid_argument(format!(
                    "cpu option `intra_op_num_threads`: {n} is more than {MAX_THREADS}"
                )));
            }
            Some(n) => n,
        };
        let mut provider = CpuProvider::with_threads(threads)?;
        provider.compile = compile;
        Ok(Box::new(provider))
    }
}

/// The most intra-op threads a CPU EP instance starts.
pub const MAX_THREADS: usize = 1024;

/// A CPU EP instance. Its `compile` fuses any group of supported nodes into one kernel, so other
/// host-memory EPs built on these kernels can reuse it with their own capability answers.
///
/// With more than one intra-op thread it owns a thread pool, shared by its kernels: a kernel
/// whose program has convolutions or matrix products, or large inputs, runs on the pool, and
/// its kernels split their loops across it. [`CpuProvider::default`] runs everything on the
/// caller's thread.
#[derive(Debug, Default)]
pub struct CpuProvider {
    pool: Option<Arc<crate::par::Pool>>,
    /// The compile passes turned off (option `disable_passes`, `EPX_CPU_DISABLE_PASSES`).
    compile: CompileOptions,
}

impl CpuProvider {
    /// An instance with `threads` intra-op threads (1: none of its own).
    pub fn with_threads(threads: usize) -> sdk::Result<Self> {
        let pool = if threads > 1 {
            Some(Arc::new(
                crate::par::Pool::new(threads).map_err(Error::runtime)?,
            ))
        } else {
            None
        };
        Ok(CpuProvider {
            pool,
            compile: CompileOptions::default(),
        })
    }
}

/// Element types the CPU kernels hold: every ONNX type but the complex ones.
fn runnable_type(t: ElementType) -> bool {
    use ElementType::*;
    !matches!(t, Undefined | Complex64 | Complex128)
}

impl Provider for CpuProvider {
    /// Everything it supports, as one group: the host splits it into convex pieces, and each
    /// piece runs as one program, its intermediate values never leaving the EP.
    fn capability(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> sdk::Result<Vec<Vec<u32>>> {
        let mut group = Vec::new();
        for &id in unclaimed {
            if supported(graph, id)? {
                group.push(id);
            }
        }
        Ok(if group.is_empty() {
            Vec::new()
        } else {
            vec![group]
        })
    }

    fn compile(
        &self,
        graph: &GraphView<'_>,
        sub: &SubgraphView<'_>,
    ) -> sdk::Result<Box<dyn Kernel>> {
        let inputs: Vec<Option<u32>> = sub.inputs.iter().map(|&v| Some(v)).collect();
        let program = Program::compile(graph, sub.nodes, &inputs, sub.outputs, &[], &self.compile)?;
        let heavy = program.has_heavy_steps();
        let row_model = program.has_row_model_steps();
        // A small program (a few MiB of weights) may turn out too quick for the pool: its first
        // runs on small inputs are timed on the calling thread and on the pool, to find out.
        let trial = heavy && program.constant_bytes() < TRIAL_MAX_CONSTANT_BYTES;
        Ok(Box::new(CpuKernel {
            program,
            pool: self.pool.clone(),
            heavy,
            row_model,
            serial_below: AtomicUsize::new(if trial { 0 } else { 1 }),
            trial_runs: AtomicUsize::new(0),
            trial_best: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
        }))
    }
}

/// Whether the CPU EP runs node `id`: a registered op (or control flow whose bodies it runs
/// entirely) on element types its kernels hold.
fn supported(graph: &GraphView<'_>, id: u32) -> sdk::Result<bool> {
    let node = graph.node(id)?;
    // Values of a type the kernels cannot hold (complex numbers) stay unclaimed.
    for v in node.inputs.iter().chain(&node.outputs).flatten() {
        if graph
            .value(*v)?
            .elem_type
            .is_some_and(|t| !runnable_type(t))
        {
            return Ok(false);
        }
    }
    if is_control_flow(node.op_type) {
        let mut bodies = 0;
        for (_, a) in graph.attributes(&node)? {
            if let Attribute::Graph(body) = a {
                bodies += 1;
                for n in 0..body.node_count() as u32 {
                    if !supported(&body, n)? {
                        return Ok(false);
                    }
                }
            }
        }
        // No body visible: a host older than ABI 1.1 does not show nested graphs.
        return Ok(bodies > 0);
    }
    Ok(registry()
        .lookup(node.domain, node.op_type, node.opset)
        .is_some())
}

struct CpuKernel {
    program: Program,
    pool: Option<Arc<crate::par::Pool>>,
    /// Whether the program has steps that split across the pool whatever the input size.
    heavy: bool,
    /// It has a step that scores rows against a fixed model ([`Program::has_row_model_steps`]).
    row_model: bool,
    /// Runs whose inputs hold fewer elements than this stay on the calling thread: the trial
    /// runs, of half as many, were not clearly faster on the pool. 0: runs on small inputs are
    /// still being tried ([`TRIAL_RUNS`]); 1: every run goes to the pool.
    serial_below: AtomicUsize,
    /// Trial runs so far.
    trial_runs: AtomicUsize,
    /// The fastest trial run on the calling thread and on the pool, in nanoseconds.
    trial_best: [AtomicU64; 2],
}

/// The weights below which a heavy program's first runs are tried on the calling thread
/// ([`CpuKernel::serial_below`]).
const TRIAL_MAX_CONSTANT_BYTES: usize = 8 << 20;

/// Input elements from which a program without heavy steps still runs on the pool.
const POOL_MIN_ELEMENTS: usize = 64 << 10;

/// Input elements from which a program that scores rows against a fixed model runs on the pool
/// (a random forest's 1024 rows of 6 features: 0.11 ms on one thread, 0.07 on two).
const ROW_MODEL_MIN_ELEMENTS: usize = 4 << 10;

/// The trial runs of a small heavy program: the first on the calling thread (cold, not timed),
/// then in turn on the calling thread and on the pool, each timed. Handing a short program to the
/// workers, and each kernel's split and join, can cost as much as the second thread saves; a
/// timing of one run each is at the mercy of one page fault or preemption, so the fastest of
/// two each decides.
const TRIAL_RUNS: usize = 5;

/// How much faster than the calling thread alone the pool must have been in the trial runs
/// for a small program to use it.
const POOL_MIN_GAIN: f64 = 0.9;

/// What [`CpuKernel::serial_below`] becomes after the trial runs on inputs of `elements`,
/// given the fastest run on the calling thread alone and on the pool (nanoseconds): 1 (all runs
/// on the pool) when the pool was clearly faster, else twice the trial's elements.
fn serial_below_after_trials([alone, shared]: [u64; 2], elements: usize) -> usize {
    if (shared as f64) < POOL_MIN_GAIN * alone as f64 {
        1
    } else {
        elements.saturating_mul(2).max(2)
    }
}

impl Kernel for CpuKernel {
    fn execute(&self, ctx: &mut KernelContext<'_>) -> sdk::Result<()> {
        // Numeric tensors are borrowed; strings, types packed several to a byte, and
        // sequences, maps and optionals are copied into the EP's own form.
        let n = ctx.input_count();
        let mut owned: Vec<Option<Tensor>> = Vec::with_capacity(n);
        let mut borrowed: Vec<Option<TensorView<'_>>> = Vec::with_capacity(n);
        let values = ctx.supports_values();
        for i in 0..n {
            let bad = |e: OpError| Error::invalid_argument(format!("input {i}: {e}"));
            let (o, b) = match if values {
                ctx.input_value(i)?
            } else {
                ctx.optional_input(i)?.map(ValueRef::Tensor)
            } {
                None => (None, None),
                Some(ValueRef::Tensor(t)) if packed_bits(t.elem_type).is_none() => (None, Some(t)),
                Some(v) => (Some(from_value(&v).map_err(bad)?), None),
            };
            owned.push(o);
            borrowed.push(b);
        }
        let mut inputs = Vec::with_capacity(n);
        for (i, (o, b)) in owned.iter().zip(&borrowed).enumerate() {
            inputs.push(match (o, b) {
                (Some(t), _) => Some(t.view()),
                (None, Some(t)) => Some(
                    TensorRef::from_bytes(t.elem_type, &t.dims(), t.data)
                        .map_err(|e| Error::invalid_argument(format!("input {i}: {e}")))?,
                ),
                (None, None) => None,
            });
        }
        // Programs on this thread stop at their next node once the run is cancelled.
        let _terminate = crate::exec::program::watch_terminate(ctx.terminate_flag());
        // On the pool only when there is work to share: handing a tiny program to another
        // thread costs more than running it.
        let elements: usize = inputs.iter().flatten().map(|t| t.len()).sum();
        let pool = self
            .pool
            .as_ref()
            .filter(|_| {
                self.heavy
                    || elements >= POOL_MIN_ELEMENTS
                    || (self.row_model && elements >= ROW_MODEL_MIN_ELEMENTS)
            })
            .filter(|_| elements >= self.serial_below.load(Ordering::Relaxed));
        let outputs = match pool {
            // The trial runs of a small heavy program on small inputs ([`TRIAL_RUNS`]): when
            // the pool was not clearly faster, runs on inputs of less than twice its elements
            // stay on this thread; else they, and all larger ones, use the pool.
            Some(pool)
                if self.serial_below.load(Ordering::Relaxed) == 0
                    && elements < POOL_MIN_ELEMENTS =>
            {
                let run = self.trial_runs.fetch_add(1, Ordering::Relaxed);
                let on_pool = run.is_multiple_of(2) && run > 0;
                let start = std::time::Instant::now();
                let out = if on_pool {
                    pool.enter(|| self.program.run(&inputs))
                } else {
                    self.program.run(&inputs)
                };
                if run > 0 {
                    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.trial_best[usize::from(on_pool)].fetch_min(ns, Ordering::Relaxed);
                }
                if run + 1 == TRIAL_RUNS {
                    let best = self
                        .trial_best
                        .each_ref()
                        .map(|b| b.load(Ordering::Relaxed));
                    let below = serial_below_after_trials(best, elements);
                    self.serial_below.store(below, Ordering::Relaxed);
                }
                out
            }
            Some(pool) => pool.enter(|| self.program.run(&inputs)),
            None => self.program.run(&inputs),
        }
        .map_err(|e| {
            if crate::limits::is_over_limit(&e.0) {
                Error::new(epx_plugin_api::abi::EpxStatusCode::OutOfMemory, e.0)
            } else {
                Error::runtime(e.0)
            }
        })?;
        for (i, t) in outputs.iter().enumerate() {
            if !t.is_numeric_tensor() {
                ctx.set_output(i, &to_value(t).map_err(|e| Error::runtime(e.0))?)?;
                continue;
            }
            let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            let out = ctx.output(i, t.elem_type(), &shape)?;
            t.write_bytes(out)
                .map_err(|e| Error::runtime(e.to_string()))?;
        }
        // The host has its copies: the float buffers go back for the next kernels.
        outputs.into_iter().for_each(Tensor::recycle);
        Ok(())
    }

    fn profile_start(&self) -> sdk::Result<()> {
        self.program.profile_start();
        Ok(())
    }

    fn profile(&self) -> sdk::Result<sdk::KernelProfile> {
        Ok(self.program.profile())
    }
}

/// A host value in the CPU EP's form (a copy).
fn from_value(v: &ValueRef<'_>) -> Result<Tensor, OpError> {
    Ok(match v {
        ValueRef::Tensor(t) => Tensor::from_bytes(t.elem_type, &t.dims(), t.data)?,
        ValueRef::Strings(s) => Tensor::strings_from_bytes(&s.dims(), s.iter())?,
        ValueRef::Sequence { elem_type, items } => Tensor::Seq(Arc::new(Sequence {
            elem_type: *elem_type,
            items: items.iter().map(from_value).collect::<Result<_, _>>()?,
        })),
        ValueRef::Map { keys, values } => Tensor::Map(Arc::new(MapValue {
            keys: from_value(keys)?,
            values: from_value(values)?,
        })),
        ValueRef::Optional(v) => Tensor::Opt(match v {
            Some(v) => Some(Arc::new(from_value(v)?)),
            None => None,
        }),
    })
}

/// A CPU EP value in the ABI's form.
fn to_value(t: &Tensor) -> Result<OwnedValue, OpError> {
    Ok(match t {
        Tensor::Str(a) => OwnedValue::Strings {
            shape: a.shape().iter().map(|&d| d as i64).collect(),
            strings: a.iter().map(|s| s.as_bytes().to_vec()).collect(),
        },
        Tensor::Seq(s) => OwnedValue::Sequence {
            elem_type: s.elem_type,
            items: s.items.iter().map(to_value).collect::<Result<_, _>>()?,
        },
        Tensor::Map(m) => OwnedValue::Map {
            keys: Box::new(to_value(&m.keys)?),
            values: Box::new(to_value(&m.values)?),
        },
        Tensor::Opt(v) => OwnedValue::Optional(match v {
            Some(v) => Some(Box::new(to_value(v)?)),
            None => None,
        }),
        t => {
            let mut data = vec![0u8; t.byte_len()];
            t.write_bytes(&mut data)?;
            OwnedValue::Tensor {
                elem_type: t.elem_type(),
                shape: t.shape().iter().map(|&d| d as i64).collect(),
                data,
            }
        }
    })
}

epx_plugin_api::plugin_entry! {
    pub fn builtin_plugin_entry;
    name: "builtin",
    version: env!("CARGO_PKG_VERSION"),
    providers: [CpuFactory],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the trial runs, a small program uses the pool only where it was clearly faster
    /// there; a pool that was never timed (runs overlapping the trial) does not count as faster.
    #[test]
    fn the_pool_is_kept_only_where_the_trials_found_it_faster() {
        assert_eq!(serial_below_after_trials([1_380_000, 930_000], 1000), 1);
        assert_eq!(serial_below_after_trials([1_000_000, 950_000], 1000), 2000);
        assert_eq!(serial_below_after_trials([60_000, 90_000], 0), 2);
        assert_eq!(serial_below_after_trials([60_000, u64::MAX], 10), 20);
    }
}
