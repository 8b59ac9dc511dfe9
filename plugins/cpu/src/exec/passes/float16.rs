//! Run inputs of float16: widened to float32 as the run starts ([`crate::exec::lower`]).

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use super::{Draft, DraftStep};
use crate::exec::lower;
use crate::exec::step::{Source, Step};

/// A step converting one value between float16 and float32.
pub(crate) fn convert_step<'g>(
    label: String,
    to_half: bool,
    from: Source,
    slot: usize,
) -> DraftStep<'g> {
    DraftStep {
        step: Step::new(
            label,
            "Cast".into(),
            Box::new(lower::Convert { to_half }),
            vec![Some(from)],
            vec![Some(slot)],
        ),
        node: None,
    }
}

/// `bind_inputs` (required): binds each run input to its graph value, through a float32 copy
/// made by a first conversion step where the input is float16.
///
/// In: the draft's `inputs`. Out: `at` holds every bound input; one conversion step per
/// float16 input.
pub(crate) fn bind_inputs(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    for (i, v) in d.inputs.iter().enumerate() {
        let Some(v) = *v else { continue };
        let info = d.graph.value(v)?;
        if info.elem_type == Some(ElementType::Float16) {
            let slot = d.slot();
            let label = format!("{} (float16 to float32)", info.name);
            d.steps
                .push(convert_step(label, false, Source::Input(i), slot));
            d.at.insert(v, Source::Slot(slot));
        } else {
            d.at.insert(v, Source::Input(i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;

    #[test]
    fn float16_inputs_get_a_conversion_and_others_are_read_directly() {
        let mut g = TestGraph::new();
        let a = g.input("a", ElementType::Float16, &[2]);
        let b = g.input("b", ElementType::Float, &[2]);
        let inputs = [Some(a), None, Some(b)];
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &inputs, &[], &[], &options).unwrap();
        bind_inputs(&mut d).unwrap();
        assert_eq!(d.at[&a], Source::Slot(0));
        assert_eq!(d.at[&b], Source::Input(2));
        assert_eq!(d.steps.len(), 1);
        let s = &d.steps[0].step;
        assert_eq!(
            (s.label.as_str(), s.inputs.as_slice()),
            ("a (float16 to float32)", &[Some(Source::Input(0))][..])
        );
    }
}
