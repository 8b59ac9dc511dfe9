//! When each computed value dies.

use epx_plugin_api::sdk;

use super::Draft;
use crate::exec::step::Source;

/// `plan_frees`: each slot is freed after the last step that reads it (a value nobody reads,
/// right after the step that made it), unless the run returns it; its buffer goes back to the
/// pool for the next steps. Without it every value lives to the end of the run.
///
/// In: steps, `bound`. Out: each step's `frees`.
pub(crate) fn plan_frees(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let mut last_read: Vec<Option<usize>> = vec![None; d.num_slots];
    for (i, st) in d.steps.iter().enumerate() {
        for src in st.step.inputs.iter().flatten() {
            if let Source::Slot(s) = src {
                last_read[*s] = Some(i);
            }
        }
        for s in st.step.outputs.iter().flatten() {
            last_read[*s].get_or_insert(i);
        }
    }
    for src in &d.bound {
        if let Source::Slot(s) = src {
            last_read[*s] = None;
        }
    }
    for st in &mut d.steps {
        st.step.frees.clear();
    }
    for (s, last) in last_read.into_iter().enumerate() {
        if let Some(i) = last {
            d.steps[i].step.frees.push(s);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;
    use crate::exec::passes::testing::{Unused, def, node_step};

    #[test]
    fn a_value_dies_after_its_last_reader_unless_returned() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], &options).unwrap();
        d.num_slots = 4;
        let s = |i| Some(Source::Slot(i));
        let x = Some(Source::Input(0));
        // 0 = f(x); 1 = g(0) and 3 (unread); 2 = h(0, 1); the run returns 2.
        d.steps
            .push(node_step(def("Neg", 1), Box::new(Unused), vec![x], &[0]));
        d.steps.push(node_step(
            def("Split", 1),
            Box::new(Unused),
            vec![s(0)],
            &[1, 3],
        ));
        d.steps.push(node_step(
            def("Add", 2),
            Box::new(Unused),
            vec![s(0), s(1)],
            &[2],
        ));
        d.bound = vec![Source::Slot(2)];
        plan_frees(&mut d).unwrap();
        let frees: Vec<&[usize]> = d.steps.iter().map(|st| st.step.frees.as_slice()).collect();
        assert_eq!(frees, [&[][..], &[3], &[0, 1]]);
    }
}
