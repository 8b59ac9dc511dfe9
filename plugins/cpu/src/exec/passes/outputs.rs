//! The values the run returns.

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk::{self, Error};

use super::Draft;
use super::float16::convert_step;
use crate::exec::step::{Source, op_error};

/// `bind_outputs` (required): finds where each program output is. An output that is an
/// initializer of the graph is copied into a constant; a float16 output leaves the program
/// rounded back to float16 by a last conversion step.
///
/// In: `outputs`, `at`. Out: `bound`, one source per output; the conversion steps.
pub(crate) fn bind_outputs(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let mut bound = Vec::with_capacity(d.outputs.len());
    for &v in d.outputs {
        let info = d.graph.value(v)?;
        let src = match d.at.get(&v) {
            Some(s) => *s,
            None if info.is_initializer() => {
                let t = d
                    .initializer(v, info.elem_type, true)
                    .map_err(|e| op_error("output", e))?;
                d.constant(t)
            }
            None => {
                return Err(Error::invalid_graph(format!(
                    "output `{}` is not produced by the compiled nodes",
                    info.name
                )));
            }
        };
        let src = if info.elem_type == Some(ElementType::Float16) {
            let slot = d.slot();
            let label = format!("{} (float32 to float16)", info.name);
            d.steps.push(convert_step(label, true, src, slot));
            Source::Slot(slot)
        } else {
            src
        };
        bound.push(src);
    }
    d.bound = bound;
    Ok(())
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;

    #[test]
    fn outputs_bind_to_slots_constants_and_float16_conversions() {
        let mut g = TestGraph::new();
        let a = g.output("a", ElementType::Float, &[1]);
        let w = g.initializer("w", &[1], &[3.0f32]);
        g.output("w", ElementType::Float, &[1]);
        let h = g.output("h", ElementType::Float16, &[1]);
        let outputs = [a, w, h];
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &outputs, &[], &options).unwrap();
        d.at.insert(a, Source::Slot(0));
        d.at.insert(h, Source::Input(0));
        d.num_slots = 1;
        bind_outputs(&mut d).unwrap();
        assert_eq!(
            d.bound,
            [Source::Slot(0), Source::Constant(0), Source::Slot(1)]
        );
        assert_eq!(d.steps[0].step.label, "h (float32 to float16)");
        let missing = g.output_untyped("missing");
        let outputs = [missing];
        let mut d = Draft::new(g.view(), &[], &[], &outputs, &[], &options).unwrap();
        let e = bind_outputs(&mut d).expect_err("not produced");
        assert!(e.to_string().contains("`missing` is not produced"), "{e}");
    }
}
