//! The CPU EP behind the plugin ABI: capability from the op registry, compile into a small
//! program of op kernels, execute on host memory.

use std::collections::HashMap;
use std::sync::OnceLock;

use epx_plugin_api::ElementType;
use epx_plugin_api::dlpack::DLDeviceType;
use epx_plugin_api::sdk::{
    self, Attribute, Error, GraphView, Kernel, KernelContext, Provider, ProviderFactory,
    ProviderInfo, ProviderOptions, SubgraphView,
};

use crate::kernel::{AttrValue, NodeDef, OpError, OpKernel, Registry};
use crate::tensor::{Tensor, TensorRef};

/// Name the CPU EP registers under.
pub const CPU_PROVIDER_NAME: &str = "cpu";

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::with_all_ops)
}

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

    fn create(&self, options: ProviderOptions) -> sdk::Result<Box<dyn Provider>> {
        options.finish()?;
        Ok(Box::new(CpuProvider))
    }
}

/// A CPU EP instance. Its `compile` fuses any group of supported nodes into one kernel, so other
/// host-memory EPs built on these kernels can reuse it with their own capability answers.
#[derive(Debug, Default)]
pub struct CpuProvider;

fn op_error(node: &str, e: OpError) -> Error {
    Error::runtime(format!("node `{node}`: {e}"))
}

fn is_default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

/// Element types that can cross the ABI as DLPack tensors and that the CPU kernels hold.
fn runnable_type(t: ElementType) -> bool {
    use ElementType::*;
    matches!(
        t,
        Float
            | Double
            | Float16
            | Bfloat16
            | Int8
            | Int16
            | Int32
            | Int64
            | Uint8
            | Uint16
            | Uint32
            | Uint64
            | Bool
    )
}

impl Provider for CpuProvider {
    fn capability(&self, graph: &GraphView<'_>, unclaimed: &[u32]) -> sdk::Result<Vec<Vec<u32>>> {
        let reg = registry();
        let mut groups = Vec::new();
        'nodes: for &id in unclaimed {
            let node = graph.node(id)?;
            if !is_default_domain(node.domain) || reg.lookup("", node.op_type, node.opset).is_none()
            {
                continue;
            }
            // Values of a type the kernels cannot hold (strings, sequences) stay unclaimed.
            for v in node.inputs.iter().chain(&node.outputs).flatten() {
                let info = graph.value(*v)?;
                if let Some(t) = info.elem_type {
                    if !runnable_type(t) {
                        continue 'nodes;
                    }
                }
            }
            groups.push(vec![id]);
        }
        Ok(groups)
    }

    fn compile(
        &self,
        graph: &GraphView<'_>,
        sub: &SubgraphView<'_>,
    ) -> sdk::Result<Box<dyn Kernel>> {
        let reg = registry();
        let mut slot_of: HashMap<u32, Source> = HashMap::new();
        for (i, &v) in sub.inputs.iter().enumerate() {
            slot_of.insert(v, Source::Input(i));
        }
        let mut constants = Vec::new();
        let mut steps = Vec::with_capacity(sub.nodes.len());
        let mut num_slots = 0;
        for &id in sub.nodes {
            let node = graph.node(id)?;
            let label = if node.name.is_empty() {
                format!("{}#{id}", node.op_type)
            } else {
                node.name.to_string()
            };
            let mut attributes = HashMap::new();
            for (name, a) in graph.attributes(&node)? {
                attributes.insert(
                    name.to_string(),
                    attr_value(a).map_err(|e| op_error(&label, e))?,
                );
            }
            let mut input_types = Vec::with_capacity(node.inputs.len());
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for v in &node.inputs {
                let Some(v) = *v else {
                    inputs.push(None);
                    input_types.push(None);
                    continue;
                };
                let info = graph.value(v)?;
                input_types.push(info.elem_type);
                let src = match slot_of.get(&v) {
                    Some(s) => *s,
                    None if info.is_initializer() => {
                        let t = graph.initializer(v)?;
                        let dims = t.dims();
                        let owned = Tensor::from_bytes(t.elem_type, &dims, t.data)
                            .map_err(|e| op_error(&label, e))?;
                        constants.push(owned);
                        let s = Source::Constant(constants.len() - 1);
                        slot_of.insert(v, s);
                        s
                    }
                    None => {
                        return Err(Error::invalid_graph(format!(
                            "node `{label}` reads `{}`, which is neither a subgraph input, an initializer nor produced earlier in the group",
                            info.name
                        )));
                    }
                };
                inputs.push(Some(src));
            }
            let def = NodeDef {
                name: label.clone(),
                op_type: node.op_type.to_string(),
                domain: node.domain.to_string(),
                opset: node.opset,
                attributes,
                num_inputs: node.inputs.len(),
                num_outputs: node.outputs.len(),
                input_types,
            };
            let schema = reg.lookup("", node.op_type, node.opset).ok_or_else(|| {
                Error::not_implemented(format!(
                    "node `{label}`: op {} (opset {}) is not supported",
                    node.op_type, node.opset
                ))
            })?;
            let kernel = (schema.build)(&def).map_err(|e| op_error(&label, e))?;
            let mut outputs = Vec::with_capacity(node.outputs.len());
            for v in &node.outputs {
                outputs.push(v.map(|v| {
                    let s = num_slots;
                    num_slots += 1;
                    slot_of.insert(v, Source::Slot(s));
                    s
                }));
            }
            steps.push(Step {
                label,
                kernel,
                inputs,
                outputs,
            });
        }
        let mut outputs = Vec::with_capacity(sub.outputs.len());
        for &v in sub.outputs {
            outputs.push(*slot_of.get(&v).ok_or_else(|| {
                Error::invalid_graph(format!(
                    "subgraph output value {v} is not produced by the subgraph"
                ))
            })?);
        }
        Ok(Box::new(CpuKernel {
            steps,
            constants,
            num_slots,
            outputs,
        }))
    }
}

fn attr_value(a: Attribute<'_>) -> Result<AttrValue, OpError> {
    Ok(match a {
        Attribute::Float(f) => AttrValue::Float(f),
        Attribute::Int(i) => AttrValue::Int(i),
        Attribute::String(s) => AttrValue::String(s.to_vec()),
        Attribute::Floats(v) => AttrValue::Floats(v.to_vec()),
        Attribute::Ints(v) => AttrValue::Ints(v.to_vec()),
        Attribute::Strings(v) => AttrValue::Strings(v.into_iter().map(<[u8]>::to_vec).collect()),
        Attribute::Tensor(t) => {
            AttrValue::Tensor(Tensor::from_bytes(t.elem_type, &t.dims(), t.data)?)
        }
        Attribute::Unsupported(5 | 10) => AttrValue::Unsupported("graph"),
        Attribute::Unsupported(_) => AttrValue::Unsupported("unsupported attribute kind"),
    })
}

/// Where a node input comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Input `i` of the kernel call.
    Input(usize),
    /// An initializer copied at compile time.
    Constant(usize),
    /// A value computed by an earlier node of the group.
    Slot(usize),
}

/// A shorter-lived view of a view (`TensorRef` is invariant in its lifetime).
fn reborrow<'b>(t: &'b TensorRef<'_>) -> TensorRef<'b> {
    match t {
        TensorRef::F32(a) => TensorRef::F32(a.view()),
        TensorRef::F64(a) => TensorRef::F64(a.view()),
        TensorRef::F16(a) => TensorRef::F16(a.view()),
        TensorRef::BF16(a) => TensorRef::BF16(a.view()),
        TensorRef::I8(a) => TensorRef::I8(a.view()),
        TensorRef::I16(a) => TensorRef::I16(a.view()),
        TensorRef::I32(a) => TensorRef::I32(a.view()),
        TensorRef::I64(a) => TensorRef::I64(a.view()),
        TensorRef::U8(a) => TensorRef::U8(a.view()),
        TensorRef::U16(a) => TensorRef::U16(a.view()),
        TensorRef::U32(a) => TensorRef::U32(a.view()),
        TensorRef::U64(a) => TensorRef::U64(a.view()),
        TensorRef::Bool(a) => TensorRef::Bool(a.view()),
    }
}

struct Step {
    label: String,
    kernel: Box<dyn OpKernel>,
    inputs: Vec<Option<Source>>,
    outputs: Vec<Option<usize>>,
}

struct CpuKernel {
    steps: Vec<Step>,
    constants: Vec<Tensor>,
    num_slots: usize,
    outputs: Vec<Source>,
}

impl CpuKernel {
    fn fetch<'r, 'c: 'r>(
        &'r self,
        src: Source,
        inputs: &'r [Option<TensorRef<'c>>],
        slots: &'r [Option<Tensor>],
    ) -> sdk::Result<TensorRef<'r>> {
        match src {
            Source::Input(i) => inputs
                .get(i)
                .and_then(Option::as_ref)
                .map(reborrow)
                .ok_or_else(|| Error::invalid_argument(format!("kernel input {i} is missing"))),
            Source::Constant(i) => Ok(self.constants[i].view()),
            Source::Slot(i) => slots[i]
                .as_ref()
                .map(Tensor::view)
                .ok_or_else(|| Error::runtime("value used before it was computed")),
        }
    }
}

impl Kernel for CpuKernel {
    fn execute(&self, ctx: &mut KernelContext<'_>) -> sdk::Result<()> {
        let mut inputs = Vec::with_capacity(ctx.input_count());
        for i in 0..ctx.input_count() {
            inputs.push(match ctx.input(i)? {
                Some(t) => {
                    let dims = t.dims();
                    Some(
                        TensorRef::from_bytes(t.elem_type, &dims, t.data)
                            .map_err(|e| Error::invalid_argument(format!("input {i}: {e}")))?,
                    )
                }
                None => None,
            });
        }
        let mut slots: Vec<Option<Tensor>> = (0..self.num_slots).map(|_| None).collect();
        for step in &self.steps {
            let results = {
                let mut args = Vec::with_capacity(step.inputs.len());
                for src in &step.inputs {
                    args.push(match src {
                        Some(s) => Some(self.fetch(*s, &inputs, &slots)?),
                        None => None,
                    });
                }
                step.kernel
                    .run(&args)
                    .map_err(|e| op_error(&step.label, e))?
            };
            let mut results = results.into_iter();
            for out in &step.outputs {
                let t = results.next();
                if let Some(slot) = out {
                    let t = t.ok_or_else(|| {
                        Error::runtime(format!("node `{}` produced too few outputs", step.label))
                    })?;
                    slots[*slot] = Some(t);
                }
            }
        }
        for (i, src) in self.outputs.iter().enumerate() {
            // Computed values are written straight from their slot; inputs and constants passed
            // through unchanged need an owned copy first.
            let copied;
            let t = match src {
                Source::Slot(s) => slots[*s]
                    .as_ref()
                    .ok_or_else(|| Error::runtime("output was not computed"))?,
                _ => {
                    copied = self.fetch(*src, &inputs, &slots)?.to_owned();
                    &copied
                }
            };
            let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            let out = ctx.output(i, t.elem_type(), &shape)?;
            t.write_bytes(out)
                .map_err(|e| Error::runtime(e.to_string()))?;
        }
        Ok(())
    }
}

epx_plugin_api::plugin_entry! {
    pub fn builtin_plugin_entry;
    name: "builtin",
    version: env!("CARGO_PKG_VERSION"),
    providers: [CpuFactory],
}
