//! A compiled sequence of op kernels over a set of graph nodes: what a CPU EP kernel runs, and
//! what the bodies of `If`, `Loop` and `Scan` are compiled into.

use std::collections::HashMap;
use std::sync::OnceLock;

use epx_plugin_api::sdk::{self, Attribute, Error, GraphView};

use crate::control;
use crate::kernel::{AttrValue, NodeDef, OpError, OpKernel, Registry};
use crate::tensor::{Tensor, TensorRef};

pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::with_all_ops)
}

/// Ops the CPU EP runs with nested graphs, compiled here rather than through the registry.
/// Whether `op` is a control-flow op ([`control::CONTROL_FLOW_OPSETS`]).
pub(crate) fn is_control_flow(op: &str) -> bool {
    control::CONTROL_FLOW_OPSETS
        .iter()
        .any(|(name, _)| *name == op)
}

pub(crate) fn op_error(node: &str, e: OpError) -> Error {
    Error::runtime(format!("node `{node}`: {e}"))
}

/// Where a node input comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// Input `i` of the run.
    Input(usize),
    /// An initializer copied at compile time.
    Constant(usize),
    /// A value computed by an earlier node.
    Slot(usize),
}

struct Step {
    label: String,
    kernel: Box<dyn OpKernel>,
    inputs: Vec<Option<Source>>,
    outputs: Vec<Option<usize>>,
}

/// Nodes compiled once, run many times.
pub struct Program {
    steps: Vec<Step>,
    constants: Vec<Tensor>,
    num_slots: usize,
    outputs: Vec<Source>,
}

/// A shorter-lived view of a view (`TensorRef` is invariant in its lifetime).
pub(crate) fn reborrow<'b>(t: &'b TensorRef<'_>) -> TensorRef<'b> {
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
        Attribute::Graph(_) | Attribute::Unsupported(5 | 10) => AttrValue::Unsupported("graph"),
        Attribute::Unsupported(_) => AttrValue::Unsupported("unsupported attribute kind"),
    })
}

impl Program {
    /// Compiles `nodes` (in topological order) of `graph`. Run input `i` is bound to value
    /// `inputs[i]` (`None`: an input this program does not read); the run returns `outputs`.
    pub fn compile(
        graph: &GraphView<'_>,
        nodes: &[u32],
        inputs: &[Option<u32>],
        outputs: &[u32],
    ) -> sdk::Result<Program> {
        let reg = registry();
        let mut slot_of: HashMap<u32, Source> = HashMap::new();
        for (i, v) in inputs.iter().enumerate() {
            if let Some(v) = v {
                slot_of.insert(*v, Source::Input(i));
            }
        }
        let mut constants = Vec::new();
        let mut steps = Vec::with_capacity(nodes.len());
        let mut num_slots = 0;
        for &id in nodes {
            let node = graph.node(id)?;
            let label = if node.name.is_empty() {
                format!("{}#{id}", node.op_type)
            } else {
                node.name.to_string()
            };
            let mut attributes = HashMap::new();
            let mut graphs = HashMap::new();
            for (name, a) in graph.attributes(&node)? {
                if let Attribute::Graph(g) = a {
                    graphs.insert(name.to_string(), g);
                }
                attributes.insert(
                    name.to_string(),
                    attr_value(a).map_err(|e| op_error(&label, e))?,
                );
            }
            // Explicit inputs, then the values nested graphs read implicitly.
            let all_inputs: Vec<Option<u32>> = node
                .inputs
                .iter()
                .copied()
                .chain(node.implicit_inputs.iter().map(|&v| Some(v)))
                .collect();
            let mut input_types = Vec::with_capacity(all_inputs.len());
            let mut srcs = Vec::with_capacity(all_inputs.len());
            for v in &all_inputs {
                let Some(v) = *v else {
                    srcs.push(None);
                    input_types.push(None);
                    continue;
                };
                let info = graph.value(v)?;
                input_types.push(info.elem_type);
                let src = match slot_of.get(&v) {
                    Some(s) => *s,
                    None if info.is_initializer() => {
                        let t = graph.initializer(v)?;
                        let owned = Tensor::from_bytes(t.elem_type, &t.dims(), t.data)
                            .map_err(|e| op_error(&label, e))?;
                        constants.push(owned);
                        let s = Source::Constant(constants.len() - 1);
                        slot_of.insert(v, s);
                        s
                    }
                    None => {
                        return Err(Error::invalid_graph(format!(
                            "node `{label}` reads `{}`, which is neither an input, an initializer nor produced earlier",
                            info.name
                        )));
                    }
                };
                srcs.push(Some(src));
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
            let kernel: Box<dyn OpKernel> = if is_control_flow(node.op_type) {
                control::build(graph, &node, &def, &graphs)?
            } else {
                let schema = reg.lookup("", node.op_type, node.opset).ok_or_else(|| {
                    Error::not_implemented(format!(
                        "node `{label}`: op {} (opset {}) is not supported",
                        node.op_type, node.opset
                    ))
                })?;
                (schema.build)(&def).map_err(|e| op_error(&label, e))?
            };
            let mut outs = Vec::with_capacity(node.outputs.len());
            for v in &node.outputs {
                outs.push(v.map(|v| {
                    let s = num_slots;
                    num_slots += 1;
                    slot_of.insert(v, Source::Slot(s));
                    s
                }));
            }
            steps.push(Step {
                label,
                kernel,
                inputs: srcs,
                outputs: outs,
            });
        }
        let mut out_srcs = Vec::with_capacity(outputs.len());
        for &v in outputs {
            let src = match slot_of.get(&v) {
                Some(s) => *s,
                // A graph output that is an initializer of this graph.
                None if graph.value(v)?.is_initializer() => {
                    let t = graph.initializer(v)?;
                    constants.push(
                        Tensor::from_bytes(t.elem_type, &t.dims(), t.data)
                            .map_err(|e| op_error("output", e))?,
                    );
                    Source::Constant(constants.len() - 1)
                }
                None => {
                    return Err(Error::invalid_graph(format!(
                        "output `{}` is not produced by the compiled nodes",
                        graph.value(v)?.name
                    )));
                }
            };
            out_srcs.push(src);
        }
        Ok(Program {
            steps,
            constants,
            num_slots,
            outputs: out_srcs,
        })
    }

    /// Compiles a whole graph. Run inputs are its own inputs, then the values of `outer`
    /// (names of enclosing-graph values, in the order the caller passes them).
    pub fn compile_graph(graph: &GraphView<'_>, outer: &[&str]) -> sdk::Result<Program> {
        let mut inputs: Vec<Option<u32>> = graph.inputs()?.iter().map(|&v| Some(v)).collect();
        for name in outer {
            inputs.push(
                graph
                    .value_named(name)?
                    .filter(|&v| graph.value(v).is_ok_and(|i| i.producer.is_none())),
            );
        }
        let nodes: Vec<u32> = (0..graph.node_count() as u32).collect();
        Program::compile(graph, &nodes, &inputs, graph.outputs()?)
    }

    /// Number of values a run returns.
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    fn fetch<'r, 'c: 'r>(
        &'r self,
        src: Source,
        inputs: &'r [Option<TensorRef<'c>>],
        slots: &'r [Option<Tensor>],
    ) -> Result<TensorRef<'r>, OpError> {
        match src {
            Source::Input(i) => inputs
                .get(i)
                .and_then(Option::as_ref)
                .map(reborrow)
                .ok_or_else(|| OpError(format!("input {i} is missing"))),
            Source::Constant(i) => Ok(self.constants[i].view()),
            Source::Slot(i) => slots[i]
                .as_ref()
                .map(Tensor::view)
                .ok_or_else(|| OpError("value used before it was computed".into())),
        }
    }

    /// Runs the program; returns its outputs.
    pub fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Tensor>, OpError> {
        let mut slots: Vec<Option<Tensor>> = (0..self.num_slots).map(|_| None).collect();
        for step in &self.steps {
            let results = {
                let mut args = Vec::with_capacity(step.inputs.len());
                for src in &step.inputs {
                    args.push(match src {
                        Some(s) => Some(self.fetch(*s, inputs, &slots)?),
                        None => None,
                    });
                }
                step.kernel
                    .run(&args)
                    .map_err(|e| OpError(format!("node `{}`: {e}", step.label)))?
            };
            let mut results = results.into_iter();
            for out in &step.outputs {
                let t = results.next();
                if let Some(slot) = out {
                    slots[*slot] = Some(t.ok_or_else(|| {
                        OpError(format!("node `{}` produced too few outputs", step.label))
                    })?);
                }
            }
        }
        let mut outs = Vec::with_capacity(self.outputs.len());
        for (i, src) in self.outputs.iter().enumerate() {
            // Computed values move out of their slot (unless a later output reads it too).
            let again = self.outputs[i + 1..]
                .iter()
                .any(|s| matches!((s, src), (Source::Slot(a), Source::Slot(b)) if a == b));
            outs.push(match src {
                Source::Slot(s) if !again => slots[*s]
                    .take()
                    .ok_or_else(|| OpError("output was not computed".into()))?,
                _ => self.fetch(*src, inputs, &slots)?.to_owned(),
            });
        }
        Ok(outs)
    }
}
