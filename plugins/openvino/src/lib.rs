//! The OpenVINO execution provider as an epx plugin (`libepx_openvino.so`, EP `openvino`).
//!
//! Groups of ONNX nodes are serialized by the host (`GraphView::serialize_subgraph`), read by
//! OpenVINO's ONNX frontend and compiled for an OpenVINO device (`CPU` by default). Tensors live
//! in host memory: inputs are handed to OpenVINO without copying (tensors wrapping the host's
//! buffers), outputs are copied from OpenVINO's buffers into the host's.
//!
//! OpenVINO itself is not linked: its C library is found and opened at run time (see
//! [`library`]), so the plugin builds without OpenVINO and reports, when it is missing, every
//! place it looked.
//!
//! Options (all optional):
//!
//! | key | values | default |
//! | --- | --- | --- |
//! | `device_type` | an OpenVINO device name: `CPU`, `GPU`, `GPU.1`, `AUTO:GPU,CPU`, ... | `CPU` |
//! | `precision` | `f32`, `bf16`, `f16`: OpenVINO's `INFERENCE_PRECISION_HINT` | `f32` |
//! | `num_of_threads` | threads for one inference (`INFERENCE_NUM_THREADS`); `0`: OpenVINO's choice | `0` |
//! | `library` | the `libopenvino_c.so*` file, or a folder holding it | searched |
//!
//! `precision` defaults to `f32` on purpose: OpenVINO's own CPU default on processors with
//! bf16 support is bf16, which changes results noticeably against every other EP.

pub mod library;
mod ov;

use std::collections::HashMap;
use std::sync::Mutex;

use epx_plugin_api::ElementType;
use epx_plugin_api::abi::EpxLogLevel;
use epx_plugin_api::dlpack::DLDeviceType;
use epx_plugin_api::sdk::{
    self, Attribute, Error, GraphView, Kernel, KernelContext, Provider, ProviderFactory,
    ProviderInfo, ProviderOptions, SubgraphView,
};

use ov::{CompiledModel, Core, InferRequest, PShape, from_ov, to_ov};

/// Name the EP registers under.
pub const PROVIDER_NAME: &str = "openvino";

/// The device OpenVINO must offer for the EP to count as available.
const REQUIRED_DEVICE: &str = "CPU";

epx_plugin_api::export_plugin!(name: "openvino", version: env!("CARGO_PKG_VERSION"), providers: [OpenVinoFactory]);

/// Makes `openvino` EP instances.
#[derive(Debug, Default)]
pub struct OpenVinoFactory;

/// The device names `devices()` listed when the host loaded the plugin, in order: a session's
/// device id (`epx.device`) indexes this list, the one the host checked the choice against, not
/// a new listing whose order might differ.
static LISTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

impl ProviderFactory for OpenVinoFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: PROVIDER_NAME.into(),
            vendor: "epx (Intel OpenVINO)".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            device_type: DLDeviceType::Cpu,
            // The compiled model is shared (OpenVINO's compiled models are thread-safe); each
            // execute takes its own infer request from a pool.
            concurrent_kernels: true,
        }
    }

    /// Available when the C library is found and opens, and OpenVINO lists a `CPU` device.
    fn availability(&self) -> sdk::Result<()> {
        let loaded = library::ensure_loaded(None).map_err(Error::unavailable)?;
        let at = format!("OpenVINO {} at {}", loaded.version, loaded.path.display());
        let devices = Core::new()
            .and_then(|core| core.available_devices())
            .map_err(|e| Error::unavailable(format!("{at}: {e}")))?;
        if !devices.iter().any(|d| d == REQUIRED_DEVICE) {
            return Err(Error::unavailable(format!(
                "{at} offers no {REQUIRED_DEVICE} device (devices: {}); its CPU plugin \
                 (libopenvino_intel_cpu_plugin.so) must be next to libopenvino.so",
                list(&devices)
            )));
        }
        sdk::log(
            EpxLogLevel::Info,
            &format!("{at}; devices: {}", list(&devices)),
        );
        Ok(())
    }

    /// Every device OpenVINO lists (`ov_core_get_available_devices`), with its full name,
    /// kind, and memory where the device reports it; a session names one as `openvino:GPU.0`.
    fn devices(&self) -> sdk::Result<Vec<sdk::DeviceInfo>> {
        let loaded = library::ensure_loaded(None).map_err(Error::unavailable)?;
        let core = Core::new().map_err(|e| Error::unavailable(e.to_string()))?;
        let names = core
            .available_devices()
            .map_err(|e| Error::unavailable(e.to_string()))?;
        *LISTED.lock().unwrap_or_else(|p| p.into_inner()) = names.clone();
        Ok(names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let prop = |key: &str| core.property(name, key).unwrap_or_default();
                let kind = match name.split('.').next().unwrap_or_default() {
                    "CPU" => sdk::DeviceKind::Cpu,
                    "GPU" => sdk::DeviceKind::Gpu,
                    "NPU" => sdk::DeviceKind::Npu,
                    _ => sdk::DeviceKind::Other,
                };
                let full = prop("FULL_DEVICE_NAME");
                let (vendor, product) = match full.split_once(' ') {
                    Some((v, rest)) if matches!(v, "Intel(R)" | "AMD" | "Intel") => {
                        (v.to_string(), rest.to_string())
                    }
                    _ => (String::new(), full),
                };
                sdk::DeviceInfo {
                    kind,
                    device_id: i as u32,
                    id_name: name.clone(),
                    vendor,
                    name: product,
                    // Reported by GPUs; a CPU shares the host's memory.
                    memory_bytes: prop("GPU_DEVICE_TOTAL_MEM_SIZE").parse().unwrap_or(0),
                    driver_version: format!("OpenVINO {}", loaded.version),
                    unusable: None,
                }
            })
            .collect())
    }

    fn create(&self, mut options: ProviderOptions) -> sdk::Result<Box<dyn Provider>> {
        let device_type = options
            .take("device_type")
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty());
        // A device the session chose from the list (`openvino:GPU.0`): its OpenVINO name.
        let chosen = match options.take_device()? {
            None => None,
            Some(id) => {
                let names = LISTED.lock().unwrap_or_else(|p| p.into_inner()).clone();
                Some(names.get(id as usize).cloned().ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "{PROVIDER_NAME} has no device {id} (devices: {})",
                        list(&names)
                    ))
                })?)
            }
        };
        let device = match (device_type, chosen) {
            (Some(t), Some(c)) if t != c => {
                return Err(Error::invalid_argument(format!(
                    "{PROVIDER_NAME}: option `device_type` says {t}, but the session chose \
                     device {c}; give one of them"
                )));
            }
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) => REQUIRED_DEVICE.to_string(),
        };
        let precision = match options.take("precision") {
            None => "f32",
            Some(p) => parse_precision(&p).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{PROVIDER_NAME} option `precision`: `{p}` is not one of f32, bf16, f16"
                ))
            })?,
        };
        let threads: Option<usize> = options.take_parsed("num_of_threads", "a thread count")?;
        let library = options.take("library").filter(|l| !l.trim().is_empty());
        options.finish()?;

        let loaded = library::ensure_loaded(library.as_deref()).map_err(Error::unavailable)?;
        let at = format!("OpenVINO {} at {}", loaded.version, loaded.path.display());
        let core = Core::new().map_err(|e| Error::unavailable(format!("{at}: {e}")))?;
        check_device(&core, &device, &at)?;
        core.set_property(&device, "INFERENCE_PRECISION_HINT", precision)
            .map_err(|e| Error::invalid_argument(format!("{PROVIDER_NAME}: {e}")))?;
        warn_without_native_precision(&core, &device, precision);
        if let Some(n) = threads.filter(|&n| n > 0) {
            core.set_property(&device, "INFERENCE_NUM_THREADS", &n.to_string())
                .map_err(|e| Error::invalid_argument(format!("{PROVIDER_NAME}: {e}")))?;
        }
        sdk::log(
            EpxLogLevel::Debug,
            &format!(
                "openvino EP: {at}, device {device}, precision {precision}, threads {}",
                threads.map_or("default".to_string(), |n| n.to_string())
            ),
        );
        Ok(Box::new(OpenVinoProvider {
            core,
            device,
            probes: Mutex::new(HashMap::new()),
            inferred: Mutex::new(HashMap::new()),
        }))
    }
}

/// The `INFERENCE_PRECISION_HINT` value for the option `precision`.
fn parse_precision(s: &str) -> Option<&'static str> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "fp32" => Some("f32"),
        "bf16" => Some("bf16"),
        "f16" | "fp16" => Some("f16"),
        _ => None,
    }
}

/// OpenVINO takes a bf16 or f16 precision hint on a device that cannot compute in it, and runs
/// in f32 without a word (a CPU without AVX-512 BF16 or AMX has no `BF16` in its
/// `OPTIMIZATION_CAPABILITIES`). Say so, so that nobody reads f32 results as bf16 ones.
fn warn_without_native_precision(core: &Core, device: &str, precision: &str) {
    let wanted = match precision {
        "bf16" => "BF16",
        "f16" => "FP16",
        _ => return,
    };
    match core.property(device, "OPTIMIZATION_CAPABILITIES") {
        Ok(caps) if caps.split_whitespace().any(|c| c == wanted) => {}
        Ok(caps) => sdk::log(
            EpxLogLevel::Warn,
            &format!(
                "{PROVIDER_NAME}: precision={precision} asked, but device {device} lists no \
                 {wanted} in OPTIMIZATION_CAPABILITIES ({caps}); OpenVINO computes in f32 there"
            ),
        ),
        Err(e) => sdk::log(
            EpxLogLevel::Warn,
            &format!("{PROVIDER_NAME}: cannot tell whether {device} computes in {precision}: {e}"),
        ),
    }
}

/// A plain device name (`CPU`, `GPU`, `GPU.1`) must be among OpenVINO's devices; virtual ones
/// (`AUTO`, `HETERO:...`, `MULTI:...`) are left to OpenVINO to check when compiling.
fn check_device(core: &Core, device: &str, at: &str) -> sdk::Result<()> {
    let is_virtual = device.contains(':')
        || ["AUTO", "HETERO", "MULTI", "BATCH"]
            .iter()
            .any(|v| device.eq_ignore_ascii_case(v));
    if is_virtual {
        return Ok(());
    }
    let devices = core
        .available_devices()
        .map_err(|e| Error::unavailable(format!("{at}: {e}")))?;
    let found = devices
        .iter()
        .any(|d| d == device || d.strip_prefix(device).is_some_and(|r| r.starts_with('.')));
    if found {
        Ok(())
    } else {
        Err(Error::unavailable(format!(
            "{PROVIDER_NAME} option `device_type`: {at} has no device `{device}` (devices: {})",
            list(&devices)
        )))
    }
}

/// What probing one op signature found.
#[derive(Clone, Debug)]
struct Probe {
    supported: bool,
    /// Output shapes OpenVINO inferred, in node output order.
    outputs: Vec<PShape>,
}

/// An `openvino` EP instance: one OpenVINO core configured for one device.
pub struct OpenVinoProvider {
    core: Core,
    device: String,
    /// Op signature → what compiling a one-node model of it gave.
    probes: Mutex<HashMap<String, Probe>>,
    /// Shapes OpenVINO inferred for values the model gives no rank, by value name: the host runs
    /// no shape inference, and OpenVINO's CPU plugin refuses inputs of unknown rank.
    inferred: Mutex<HashMap<String, Vec<i64>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl OpenVinoProvider {
    /// Reads `onnx`, gives inputs of unknown rank the shapes in `reshape`, compiles.
    fn compile_onnx(
        &self,
        onnx: &[u8],
        reshape: &[(String, Vec<i64>)],
    ) -> Result<(CompiledModel, Vec<PShape>), String> {
        let mut model = self.core.read_onnx(onnx)?;
        for (name, shape) in reshape {
            model.reshape_input(name, shape)?;
        }
        let outputs = model.output_shapes().unwrap_or_default();
        let compiled = self.core.compile(&model, &self.device)?;
        Ok((compiled, outputs))
    }

    /// Whether OpenVINO runs this node, by compiling a one-node model of it once per signature
    /// (op, opset, input types and shapes, constant inputs, output types, attributes).
    /// `shapes` carries the shapes OpenVINO inferred for earlier nodes' outputs. Declined
    /// without probing: a value of unknown or unsupported element type (not guessed).
    fn supports(
        &self,
        graph: &GraphView<'_>,
        id: u32,
        shapes: &mut HashMap<u32, PShape>,
    ) -> sdk::Result<bool> {
        let node = graph.node(id)?;
        let mut key = format!("{}|{}|{}|in:", node.domain, node.op_type, node.opset);
        let mut inputs: Vec<u32> = Vec::new();
        let mut reshape: Vec<(String, Vec<i64>)> = Vec::new();
        for v in &node.inputs {
            let Some(v) = *v else {
                key.push_str("-,");
                continue;
            };
            let value = graph.value(v)?;
            let Some(t) = value.elem_type.filter(|t| to_ov(*t).is_some()) else {
                return Ok(false);
            };
            if value.is_initializer() {
                key.push_str(&format!("{}#const{:?},", t.name(), value.shape));
                continue;
            }
            let shape: PShape = match value.shape {
                Some(s) => Some(s.to_vec()),
                None => shapes.get(&v).cloned().flatten(),
            };
            key.push_str(&format!("{}{shape:?},", t.name()));
            if !inputs.contains(&v) {
                inputs.push(v);
                if value.shape.is_none()
                    && let Some(s) = shape
                {
                    lock(&self.inferred).insert(value.name.to_string(), s.clone());
                    reshape.push((value.name.to_string(), s));
                }
            }
        }
        key.push_str("|out:");
        let mut outputs: Vec<u32> = Vec::new();
        for v in node.outputs.iter().flatten() {
            let value = graph.value(*v)?;
            let Some(t) = value.elem_type.filter(|t| to_ov(*t).is_some()) else {
                return Ok(false);
            };
            key.push_str(&format!("{},", t.name()));
            outputs.push(*v);
        }
        if outputs.is_empty() {
            return Ok(false);
        }
        key.push_str("|attrs:");
        for (name, a) in graph.attributes(&node)? {
            match a {
                // Tensor attributes (Constant values) can be large; type and shape decide.
                Attribute::Tensor(t) => {
                    key.push_str(&format!("{name}=tensor({}{:?});", t.elem_type, t.shape));
                }
                other => key.push_str(&format!("{name}={other:?};")),
            }
        }
        let cached = lock(&self.probes).get(&key).cloned();
        let probe = match cached {
            Some(p) => p,
            None => {
                let nodes = [id];
                let sub = SubgraphView {
                    nodes: &nodes,
                    inputs: &inputs,
                    outputs: &outputs,
                };
                let onnx = graph.serialize_subgraph(&sub)?;
                let probe = match self.compile_onnx(&onnx, &reshape) {
                    Ok((_, outputs)) => Probe {
                        supported: true,
                        outputs,
                    },
                    Err(e) => {
                        sdk::log(
                            EpxLogLevel::Debug,
                            &format!(
                                "openvino EP declines node `{}` ({}): {e}",
                                node.name, node.op_type
                            ),
                        );
                        Probe {
                            supported: false,
                            outputs: Vec::new(),
                        }
                    }
                };
                lock(&self.probes).insert(key, probe.clone());
                probe
            }
        };
        for (v, s) in outputs.iter().zip(&probe.outputs) {
            shapes.insert(*v, s.clone());
        }
        Ok(probe.supported)
    }
}

impl Provider for OpenVinoProvider {
    /// Every node OpenVINO compiles on its own, as one group (the host splits it where it is not
    /// convex).
    fn capability(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> sdk::Result<Vec<Vec<u32>>> {
        let mut shapes = HashMap::new();
        let mut group = Vec::new();
        // Node ids are topological, so inferred shapes flow forward.
        let mut ids = unclaimed.to_vec();
        ids.sort_unstable();
        for id in ids {
            if self.supports(graph, id, &mut shapes)? {
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
        subgraph: &SubgraphView<'_>,
    ) -> sdk::Result<Box<dyn Kernel>> {
        let (inputs, reshape, outputs) = self.binding(graph, subgraph)?;
        let onnx = graph.serialize_subgraph(subgraph)?;
        let (compiled, _) = self.compile_onnx(&onnx, &reshape).map_err(|e| {
            Error::not_implemented(format!(
                "{PROVIDER_NAME}: group of {} nodes: {e}",
                subgraph.nodes.len()
            ))
        })?;
        Ok(Box::new(OpenVinoKernel {
            requests: Mutex::new(Vec::new()),
            compiled,
            inputs,
            outputs,
            blob_header: self.blob_header(),
        }))
    }

    /// Compiled models go in the host's kernel cache: exported, and imported by later sessions.
    fn caches_kernels(&self) -> bool {
        true
    }

    fn deserialize(
        &self,
        graph: &GraphView<'_>,
        subgraph: &SubgraphView<'_>,
        bytes: &[u8],
    ) -> sdk::Result<Box<dyn Kernel>> {
        let header = self.blob_header();
        let blob = bytes.strip_prefix(header.as_bytes()).ok_or_else(|| {
            let end = bytes
                .iter()
                .position(|&b| b == b'\n')
                .unwrap_or(bytes.len())
                .min(120);
            Error::invalid_argument(format!(
                "{PROVIDER_NAME}: the stored kernel was made for `{}`, this EP is `{}`",
                String::from_utf8_lossy(&bytes[..end]),
                header.trim_end()
            ))
        })?;
        let (inputs, _, outputs) = self.binding(graph, subgraph)?;
        let compiled = self
            .core
            .import(blob.to_vec(), &self.device)
            .map_err(|e| Error::invalid_argument(format!("{PROVIDER_NAME}: {e}")))?;
        Ok(Box::new(OpenVinoKernel {
            requests: Mutex::new(Vec::new()),
            compiled,
            inputs,
            outputs,
            blob_header: header,
        }))
    }
}

/// A group's tensor names: inputs (with the shapes given to those of unknown rank) and outputs
/// (with the element type the model declares).
type Binding = (
    Vec<String>,
    Vec<(String, Vec<i64>)>,
    Vec<(String, Option<ElementType>)>,
);

impl OpenVinoProvider {
    fn binding(&self, graph: &GraphView<'_>, subgraph: &SubgraphView<'_>) -> sdk::Result<Binding> {
        let mut inputs = Vec::new();
        let mut reshape = Vec::new();
        for &v in subgraph.inputs {
            let value = graph.value(v)?;
            if value.shape.is_none()
                && let Some(s) = lock(&self.inferred).get(value.name)
            {
                reshape.push((value.name.to_string(), s.clone()));
            }
            inputs.push(value.name.to_string());
        }
        let outputs = subgraph
            .outputs
            .iter()
            .map(|&v| graph.value(v).map(|x| (x.name.to_string(), x.elem_type)))
            .collect::<sdk::Result<Vec<_>>>()?;
        Ok((inputs, reshape, outputs))
    }

    /// The first line of every stored kernel: the OpenVINO build and the device it was
    /// compiled for. A blob of another build or device is refused before OpenVINO reads it.
    fn blob_header(&self) -> String {
        let version = ov::version().unwrap_or_default();
        format!(
            "epx openvino kernel 1; OpenVINO {version}; device {}\n",
            self.device
        )
    }
}

/// A compiled group. Field order matters: pooled requests are dropped before the model.
struct OpenVinoKernel {
    /// Idle infer requests; an execute takes one (or makes one) and puts it back.
    requests: Mutex<Vec<InferRequest>>,
    compiled: CompiledModel,
    /// Tensor names of the group's inputs, in the host's order.
    inputs: Vec<String>,
    /// Tensor names of the group's outputs with the element type the model declares.
    outputs: Vec<(String, Option<ElementType>)>,
    /// What [`Kernel::serialize`] writes before OpenVINO's blob.
    blob_header: String,
}

fn rt(e: String) -> Error {
    Error::runtime(format!("{PROVIDER_NAME}: {e}"))
}

impl OpenVinoKernel {
    fn run(&self, request: &mut InferRequest, ctx: &mut KernelContext<'_>) -> sdk::Result<()> {
        for (i, name) in self.inputs.iter().enumerate() {
            let t = ctx.input(i).map_err(|e| {
                Error::invalid_argument(format!("{PROVIDER_NAME}: input `{name}`: {}", e.message))
            })?;
            let ty = to_ov(t.elem_type).ok_or_else(|| {
                Error::not_implemented(format!(
                    "{PROVIDER_NAME}: input `{name}`: {} tensors",
                    t.elem_type
                ))
            })?;
            // SAFETY: `t.data` is the host's input (already checked against its shape by
            // `TensorView`), alive and unchanged until this execute returns, which is after
            // `infer` below. Every execute binds all inputs before it infers, so the request
            // never runs on memory of an earlier call.
            unsafe { request.set_input(name, ty, t.shape, t.data) }.map_err(rt)?;
        }
        request.infer().map_err(rt)?;
        for (i, (name, declared)) in self.outputs.iter().enumerate() {
            let out = request.output(name).map_err(rt)?;
            let code = out.elem_code().map_err(rt)?;
            let ty = from_ov(code).ok_or_else(|| {
                Error::runtime(format!(
                    "{PROVIDER_NAME}: output `{name}` has OpenVINO element type {code}, which \
                     epx does not hold"
                ))
            })?;
            if let Some(d) = declared
                && *d != ty
            {
                return Err(Error::runtime(format!(
                    "{PROVIDER_NAME}: output `{name}`: OpenVINO returned {ty}, the model \
                     declares {d}"
                )));
            }
            let dims = out.shape().map_err(rt)?;
            let src = out.data().map_err(rt)?;
            let dst = ctx.output(i, ty, &dims)?;
            if src.len() != dst.len() {
                return Err(Error::runtime(format!(
                    "{PROVIDER_NAME}: output `{name}`: OpenVINO holds {} bytes, the host \
                     expects {}",
                    src.len(),
                    dst.len()
                )));
            }
            dst.copy_from_slice(src);
        }
        Ok(())
    }
}

impl Kernel for OpenVinoKernel {
    fn serialize(&self) -> sdk::Result<Option<Vec<u8>>> {
        let blob = self.compiled.export().map_err(rt)?;
        let mut bytes = Vec::with_capacity(self.blob_header.len() + blob.len());
        bytes.extend_from_slice(self.blob_header.as_bytes());
        bytes.extend_from_slice(&blob);
        Ok(Some(bytes))
    }

    fn execute(&self, ctx: &mut KernelContext<'_>) -> sdk::Result<()> {
        let pooled = lock(&self.requests).pop();
        let mut request = match pooled {
            Some(r) => r,
            None => self.compiled.create_request().map_err(rt)?,
        };
        let result = self.run(&mut request, ctx);
        // A request stays usable after a failed inference.
        lock(&self.requests).push(request);
        result
    }
}
