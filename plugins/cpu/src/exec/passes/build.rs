//! From nodes to steps: QDQ planning, one step per node with its kernel, and the control-flow
//! kernels, whose bodies are programs of their own.

use std::collections::{HashMap, HashSet};

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk::{self, Attribute, Error};

use super::{Draft, DraftStep, NodeInfo, Pending};
use crate::error::OpError;
use crate::exec::step::{Source, Step, op_error};
use crate::exec::{control, lower, qdq};
use crate::kernel::{AttrValue, NodeDef, OpKernel, is_control_flow};
use crate::tensor::Tensor;

/// `plan_qdq` (fast levels): folds QDQ patterns into the quantized ops they stand for
/// ([`crate::exec::qdq`]).
///
/// In: `nodes`. Out: `nodes` with each folded pattern one node, its DequantizeLinear and
/// QuantizeLinear nodes gone.
pub(crate) fn plan_qdq(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let nodes = std::mem::take(&mut d.nodes);
    d.nodes = qdq::plan(&d.graph, nodes, d.outputs)?;
    Ok(())
}

/// `build_steps` (required): one step per node, its kernel made from the registry with the
/// node's attributes and input types, its inputs resolved (initializers copied into constants,
/// float16 ones widened to float32 but for tables only Gathers read), its outputs in new slots.
/// A node that reads or writes float16 runs on float32 ([`lower`]). Control-flow nodes get a
/// placeholder, built by [`build_control_flow`].
///
/// In: `nodes`, `at` holding the run inputs. Out: `steps`, one per node, each with its
/// [`NodeInfo`]; `at` holds every value read or made; `nodes` is empty.
pub(crate) fn build_steps(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let reg = crate::ops::registry();
    let gather_tables = gather_tables(d);
    for node in std::mem::take(&mut d.nodes) {
        let label = if node.name.is_empty() {
            format!("{}#{}", node.op_type, node.id)
        } else {
            node.name.to_string()
        };
        let mut attributes = HashMap::new();
        let mut graphs = HashMap::new();
        for (name, a) in d.graph.attributes(&node)? {
            if let Attribute::Graph(g) = a {
                graphs.insert(name.to_string(), g);
            }
            attributes.insert(
                name.to_string(),
                attr_value(a).map_err(|e| op_error(&label, e))?,
            );
        }
        // Explicit inputs, then the values nested graphs read implicitly.
        let all_inputs = node
            .inputs
            .iter()
            .copied()
            .chain(node.implicit_inputs.iter().map(|&v| Some(v)));
        let mut input_types = Vec::with_capacity(node.inputs.len());
        let mut srcs = Vec::with_capacity(node.inputs.len());
        for v in all_inputs {
            let Some(v) = v else {
                srcs.push(None);
                input_types.push(None);
                continue;
            };
            let info = d.graph.value(v)?;
            input_types.push(info.elem_type);
            let src = match d.at.get(&v) {
                Some(s) => *s,
                None if info.is_initializer() => {
                    let widen =
                        info.elem_type != Some(ElementType::Float16) || !gather_tables.contains(&v);
                    let owned = d
                        .initializer(v, info.elem_type, widen)
                        .map_err(|e| op_error(&label, e))?;
                    let s = d.constant(owned);
                    d.at.insert(v, s);
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
        let mut def = NodeDef {
            name: label.clone(),
            op_type: node.op_type.to_string(),
            domain: node.domain.to_string(),
            opset: node.opset,
            attributes,
            num_inputs: node.inputs.len(),
            num_outputs: node.outputs.len(),
            input_types,
        };
        let mut output_types = Vec::with_capacity(node.outputs.len());
        for v in &node.outputs {
            output_types.push(match v {
                Some(v) => d.graph.value(*v)?.elem_type,
                None => None,
            });
        }
        // float16 values are float32 here: the node runs on them as such, or rounds them
        // back first when its answer depends on it ([`lower`]).
        let round = lower::touches_float16(&def, &output_types).then(|| lower::prepare(&mut def));
        let (kernel, pending): (Box<dyn OpKernel>, _) = if is_control_flow(node.op_type) {
            let pending = Pending {
                node: node.clone(),
                graphs,
                round,
            };
            (Box::new(NotBuilt), Some(pending))
        } else {
            let schema = reg
                .lookup(node.domain, node.op_type, node.opset)
                .ok_or_else(|| {
                    Error::not_implemented(format!(
                        "node `{label}`: op {} (opset {}) is not supported",
                        node.op_type, node.opset
                    ))
                })?;
            let kernel = reg.make(schema, &def).map_err(|e| op_error(&label, e))?;
            (lower::widened(kernel, round), None)
        };
        let mut outs = Vec::with_capacity(node.outputs.len());
        for v in &node.outputs {
            outs.push(v.map(|v| {
                let s = d.slot();
                d.at.insert(v, Source::Slot(s));
                s
            }));
        }
        d.steps.push(DraftStep {
            step: Step::new(label, node.op_type.to_string(), kernel, srcs, outs),
            node: Some(NodeInfo {
                def,
                values: node.outputs.clone(),
                output_types,
                pending,
            }),
        });
    }
    Ok(())
}

/// float16 initializers that only Gathers read, as their data: they stay float16 and the
/// Gather's rows are widened (by [`lower::Widened`]), not the whole table, which is most of a
/// float16 transformer's weights (its word embedding).
fn gather_tables(d: &Draft<'_, '_>) -> HashSet<u32> {
    let mut only: HashMap<u32, bool> = HashMap::new();
    for n in &d.nodes {
        for (j, v) in n.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            let ok = j == 0 && n.op_type == "Gather" && n.domain.is_empty();
            *only.entry(v).or_insert(true) &= ok;
        }
        for v in &n.implicit_inputs {
            only.insert(*v, false);
        }
    }
    for v in d.outputs {
        only.insert(*v, false);
    }
    only.into_iter()
        .filter(|(_, g)| *g)
        .map(|(v, _)| v)
        .collect()
}

/// The kernel of a control-flow step until [`build_control_flow`] makes it.
struct NotBuilt;

impl OpKernel for NotBuilt {
    fn run(
        &self,
        _: &[Option<crate::tensor::TensorRef<'_>>],
    ) -> crate::error::OpResult<Vec<Tensor>> {
        Err(OpError(
            "the control-flow kernel was not built (the build_control_flow pass did not run)"
                .into(),
        ))
    }
}

/// `build_control_flow` (required): makes the kernels of `If`, `Loop`, `Scan` and
/// `SequenceMap`, compiling their bodies as programs; the values a body reads that are
/// constants here (after [`super::constants::fold_constants`]) are constants there too, and
/// folded inside.
///
/// In: steps whose [`NodeInfo::pending`] is set. Out: those steps with their kernels.
pub(crate) fn build_control_flow(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    for i in 0..d.steps.len() {
        let Some(p) = d.steps[i].node.as_mut().and_then(|n| n.pending.take()) else {
            continue;
        };
        let st = &d.steps[i];
        let def = &st.node.as_ref().expect("a pending node").def;
        let explicit = p.node.inputs.len().min(st.step.inputs.len());
        let known: Vec<Option<&Tensor>> = st
            .step
            .inputs
            .iter()
            .map(|s| s.and_then(|s| d.constant_value(s)))
            .collect();
        let (given, fixed) = known.split_at(explicit);
        let kernel = control::build(&d.graph, &p.node, def, &p.graphs, (given, fixed), d.options)?;
        d.steps[i].step.kernel = lower::widened(kernel, p.round);
    }
    Ok(())
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
        Attribute::StringTensor(t) => {
            AttrValue::Tensor(Tensor::strings_from_bytes(&t.dims(), t.iter())?)
        }
        Attribute::Graph(_) | Attribute::Unsupported(5 | 10) => AttrValue::Unsupported("graph"),
        Attribute::Unsupported(_) => AttrValue::Unsupported("unsupported attribute kind"),
    })
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;
    use crate::exec::passes::float16::bind_inputs;

    #[test]
    fn each_node_becomes_a_step_reading_inputs_constants_and_slots() {
        let mut g = TestGraph::new();
        let x = g.input("x", ElementType::Float, &[2]);
        g.initializer("w", &[2], &[1.0f32, 2.0]);
        g.node("Mul", &["x", "w"], &["y"]).name("mul");
        g.node("Relu", &["y"], &["z"]);
        let z = g.output("z", ElementType::Float, &[2]);
        let (inputs, outputs) = ([Some(x)], [z]);
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[0, 1], &inputs, &outputs, &[], &options).unwrap();
        bind_inputs(&mut d).unwrap();
        build_steps(&mut d).unwrap();
        assert!(d.nodes.is_empty());
        let labels: Vec<&str> = d.steps.iter().map(|s| s.step.label.as_str()).collect();
        assert_eq!(labels, ["mul", "Relu#1"]);
        let mul = &d.steps[0].step;
        assert_eq!(
            mul.inputs,
            [Some(Source::Input(0)), Some(Source::Constant(0))]
        );
        assert_eq!(mul.outputs, [Some(0)]);
        assert_eq!(d.steps[1].step.inputs, [Some(Source::Slot(0))]);
        assert_eq!(d.at[&z], Source::Slot(1));
        assert_eq!(d.constants.len(), 1);
    }

    #[test]
    fn a_float16_table_only_gathers_read_stays_float16() {
        let mut g = TestGraph::new();
        let i = g.input("i", ElementType::Int64, &[1]);
        let h = half::f16::from_f32(0.5).to_le_bytes();
        g.initializer_bytes("table", ElementType::Float16, &[2, 1], &[h, h].concat());
        g.initializer_bytes("bias", ElementType::Float16, &[1], &h);
        g.node("Gather", &["table", "i"], &["rows"]);
        g.typed("rows", ElementType::Float16, &[1, 1]);
        g.node("Add", &["rows", "bias"], &["y"]);
        let y = g.output("y", ElementType::Float16, &[1, 1]);
        let (inputs, outputs) = ([Some(i)], [y]);
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[0, 1], &inputs, &outputs, &[], &options).unwrap();
        bind_inputs(&mut d).unwrap();
        build_steps(&mut d).unwrap();
        assert!(matches!(d.constants[0], Tensor::F16(_)), "the table");
        assert!(
            matches!(d.constants[1], Tensor::F32(_)),
            "the bias, widened"
        );
    }

    #[test]
    fn an_unknown_op_and_an_unknown_value_are_errors_naming_the_node() {
        let mut g = TestGraph::new();
        let x = g.input("x", ElementType::Float, &[2]);
        g.node("NoSuchOp", &["x"], &["y"]).name("n");
        let y = g.output("y", ElementType::Float, &[2]);
        let options = CompileOptions::default();
        let (inputs, outputs) = ([Some(x)], [y]);
        let mut d = Draft::new(g.view(), &[0], &inputs, &outputs, &[], &options).unwrap();
        bind_inputs(&mut d).unwrap();
        let e = build_steps(&mut d).expect_err("unsupported");
        assert!(e.to_string().contains("node `n`: op NoSuchOp"), "{e}");
        let mut d = Draft::new(g.view(), &[0], &[], &outputs, &[], &options).unwrap();
        let e = build_steps(&mut d).expect_err("x is unbound");
        assert!(e.to_string().contains("reads `x`"), "{e}");
    }
}
