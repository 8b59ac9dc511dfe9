//! Casts that change nothing.

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use super::Draft;
use crate::kernel::AttrValue;

/// `elide_casts`: a Cast from float to float (float16 included, as it is widened here) is the
/// identity; its readers read its input instead, as ONNX Runtime removes these Casts too. A Cast
/// whose output the program returns stays (the output is its own value). The kernel was made
/// all the same, so that its attributes were checked.
///
/// In: steps. Out: steps without those Casts; their readers read the Casts' inputs.
pub(crate) fn elide_casts(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let mut i = 0;
    while i < d.steps.len() {
        let st = &d.steps[i];
        if let Some(info) = &st.node
            && st.is_op("Cast")
            && info.def.input_types.first() == Some(&Some(ElementType::Float))
            && matches!(info.def.attributes.get("to"), Some(AttrValue::Int(1)))
            && let [Some(src)] = st.step.inputs.as_slice()
            && let [Some(out)] = st.step.outputs.as_slice()
            && let [Some(y)] = info.values.as_slice()
            && !d.outputs.contains(y)
        {
            let (src, out) = (*src, *out);
            d.steps.remove(i);
            d.replace(out, src);
            continue;
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;
    use crate::exec::passes::testing::{Unused, def, node_step};
    use crate::exec::step::Source;

    fn cast(to: i64) -> crate::kernel::NodeDef {
        let mut c = def("Cast", 1);
        c.attributes.insert("to".into(), AttrValue::Int(to));
        c
    }

    #[test]
    fn a_float_to_float_cast_is_read_through_unless_returned() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let outputs = [5];
        let mut d = Draft::new(g.view(), &[], &[], &outputs, &[], &options).unwrap();
        let x = Some(Source::Input(0));
        d.steps
            .push(node_step(cast(1), Box::new(Unused), vec![x], &[0]));
        d.steps
            .push(node_step(cast(7), Box::new(Unused), vec![x], &[1]));
        d.steps
            .push(node_step(cast(1), Box::new(Unused), vec![x], &[5]));
        let slots = [Some(Source::Slot(0)), Some(Source::Slot(1))];
        d.steps.push(node_step(
            def("Add", 2),
            Box::new(Unused),
            slots.to_vec(),
            &[2],
        ));
        elide_casts(&mut d).unwrap();
        let kinds: Vec<&str> = d.steps.iter().map(|s| s.step.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["Cast", "Cast", "Add"],
            "the cast to int64 and the returned one stay"
        );
        assert_eq!(d.steps[2].step.inputs, [x, Some(Source::Slot(1))]);
    }
}
