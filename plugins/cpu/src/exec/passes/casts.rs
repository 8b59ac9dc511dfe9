//! Nodes that change nothing: float-to-float Casts, Identity, inference Dropout.

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use super::{Draft, DraftStep, Verdict};
use crate::kernel::AttrValue;

/// `elide_casts`: a Cast from float to float (float16 included, as it is widened here) is the
/// identity; its readers read its input instead, as ONNX Runtime removes these Casts too. A Cast
/// whose output the program returns stays (the output is its own value). The kernel was made
/// all the same, so that its attributes were checked.
///
/// In: steps. Out: steps without those Casts; their readers read the Casts' inputs.
pub(crate) fn elide_casts(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    read_through(d, |_, st| {
        st.is_op("Cast")
            && st.step.inputs.len() == 1
            && st.node.as_ref().is_some_and(|info| {
                info.def.input_types.first() == Some(&Some(ElementType::Float))
                    && matches!(info.def.attributes.get("to"), Some(AttrValue::Int(1)))
            })
    });
    Ok(())
}

/// `elide_identities`: an Identity, and a Dropout whose mask nobody reads and that does not
/// train (no `training_mode`, or a constant false), pass their input through; their readers read
/// the input instead, as ONNX Runtime's Identity and Dropout eliminations do. A node whose output
/// the program returns stays.
///
/// In: steps. Out: steps without those nodes; their readers read the nodes' inputs.
pub(crate) fn elide_identities(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    read_through(d, |d, st| {
        st.is_op("Identity")
            || (st.is_op("Dropout")
                && st.step.outputs.get(1).is_none_or(Option::is_none)
                && st.step.inputs.get(2).copied().flatten().is_none_or(|t| {
                    d.constant_value(t)
                        .and_then(|v| v.view().get::<bool>())
                        .is_some_and(|v| v.iter().eq([&false]))
                }))
    });
    Ok(())
}

/// Removes each node step that `passes` says hands its input 0 through as its output 0, unless
/// the program returns that output; its readers read the input instead. One pass over the
/// steps ([`Draft::rewrite_steps`]).
fn read_through(d: &mut Draft<'_, '_>, passes: impl Fn(&Draft<'_, '_>, &DraftStep<'_>) -> bool) {
    let returned: std::collections::HashSet<u32> = d.outputs.iter().copied().collect();
    d.rewrite_steps(|d, st| {
        if passes(d, st)
            && let Some(info) = &st.node
            && let Some(Some(src)) = st.step.inputs.first()
            && let Some(Some(out)) = st.step.outputs.first()
            && let Some(Some(y)) = info.values.first()
            && !returned.contains(y)
        {
            return Verdict::Remove(vec![(*out, *src)]);
        }
        Verdict::Keep
    });
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;
    use crate::exec::passes::testing::{Unused, def, node_step};
    use crate::exec::step::Source;
    use crate::tensor::Tensor;

    fn cast(to: i64) -> crate::kernel::NodeDef {
        let mut c = def("Cast", 1);
        c.attributes.insert("to".into(), AttrValue::Int(to));
        c
    }

    #[test]
    fn identities_and_inference_dropouts_are_read_through() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let outputs = [7];
        let mut d = Draft::new(g.view(), &[], &[], &outputs, &[], &options).unwrap();
        let x = Some(Source::Input(0));
        let s = |i| Some(Source::Slot(i));
        let no = d.constant(Tensor::from_vec(&[], vec![false]).unwrap());
        let yes = d.constant(Tensor::from_vec(&[], vec![true]).unwrap());
        // 0 = Identity(x); 1 = Dropout(0); 2 = Dropout(1, 0.5, false);
        // 3 = Dropout(2, 0.5, true) (trains: stays); 4, 5 = Dropout(3) with its mask read (stays);
        // 7 = Identity(4) returned (stays); 6 = Add(5, 7).
        d.steps.push(node_step(
            def("Identity", 1),
            Box::new(Unused),
            vec![x],
            &[0],
        ));
        d.steps.push(node_step(
            def("Dropout", 1),
            Box::new(Unused),
            vec![s(0)],
            &[1],
        ));
        d.steps.push(node_step(
            def("Dropout", 3),
            Box::new(Unused),
            vec![s(1), None, Some(no)],
            &[2],
        ));
        d.steps.push(node_step(
            def("Dropout", 3),
            Box::new(Unused),
            vec![s(2), None, Some(yes)],
            &[3],
        ));
        d.steps.push(node_step(
            def("Dropout", 1),
            Box::new(Unused),
            vec![s(3)],
            &[4, 5],
        ));
        d.steps.push(node_step(
            def("Identity", 1),
            Box::new(Unused),
            vec![s(4)],
            &[7],
        ));
        d.steps.push(node_step(
            def("Add", 2),
            Box::new(Unused),
            vec![s(5), s(7)],
            &[6],
        ));
        elide_identities(&mut d).unwrap();
        let kinds: Vec<&str> = d.steps.iter().map(|s| s.step.kind.as_str()).collect();
        assert_eq!(kinds, ["Dropout", "Dropout", "Identity", "Add"]);
        assert_eq!(d.steps[0].step.inputs, [x, None, Some(yes)]);
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
