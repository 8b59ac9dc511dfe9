//! When each computed value dies.

use epx_plugin_api::sdk;

use std::collections::HashMap;

use super::{Draft, DraftStep};
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

/// `hoist_shape_reads`: a Shape or Size node runs right after the step that computes its input,
/// not where the node order put it: it reads only the dims, so the value itself can die at its
/// last real reader (a Reshape that then moves it, [`move_reshapes`]) instead of living on for a
/// shape computation further down.
///
/// In: steps. Out: the same steps, Shape and Size steps moved up.
pub(crate) fn hoist_shape_reads(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    // The step making each slot, then the Shape and Size steps to run after each step; the
    // order is rebuilt once (each kept step followed by what it hoists, depth first).
    let mut producer: HashMap<usize, usize> = HashMap::new();
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); d.steps.len()];
    let mut hoisted = vec![false; d.steps.len()];
    for (i, st) in d.steps.iter().enumerate() {
        if let Some(Some(Source::Slot(s))) = st.step.inputs.first()
            && (st.is_op("Shape") || st.is_op("Size"))
            && st.step.inputs.len() == 1
            && let Some(&p) = producer.get(s)
            && p + 1 < i
        {
            after[p].push(i);
            hoisted[i] = true;
        }
        for s in st.step.outputs.iter().flatten() {
            producer.insert(*s, i);
        }
    }
    let moved = hoisted.iter().filter(|h| **h).count();
    if moved == 0 {
        return Ok(());
    }
    let mut order = Vec::with_capacity(d.steps.len());
    let mut stack = Vec::new();
    for i in (0..d.steps.len()).filter(|&i| !hoisted[i]) {
        stack.push(i);
        while let Some(j) = stack.pop() {
            order.push(j);
            stack.extend(after[j].iter().rev());
        }
    }
    let mut steps: Vec<Option<DraftStep<'_>>> =
        std::mem::take(&mut d.steps).into_iter().map(Some).collect();
    d.steps = order.into_iter().filter_map(|i| steps[i].take()).collect();
    d.changed += moved;
    Ok(())
}

/// `move_reshapes`: a Reshape, Flatten, Squeeze or Unsqueeze that is the last reader of its
/// data input (which [`plan_frees`] frees after it, and which the step reads only once) moves the
/// input's buffer to its output under the new shape instead of copying it, as ONNX Runtime's
/// reshapes alias their input. Needs `plan_frees`: without it no value dies.
///
/// In: steps with their frees. Out: `moves_input` set on those steps.
pub(crate) fn move_reshapes(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    for st in &mut d.steps {
        let reshapes = ["Reshape", "Flatten", "Squeeze", "Unsqueeze"]
            .iter()
            .any(|op| st.is_op(op));
        st.step.moves_input = reshapes
            && match st.step.inputs.first() {
                Some(Some(Source::Slot(s))) => {
                    st.step.frees.contains(s)
                        && st.step.inputs[1..]
                            .iter()
                            .all(|i| *i != Some(Source::Slot(*s)))
                }
                _ => false,
            };
        d.changed += usize::from(st.step.moves_input);
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
    fn a_shape_read_runs_right_after_its_input_is_made() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], &options).unwrap();
        let s = |i| Some(Source::Slot(i));
        let x = Some(Source::Input(0));
        // 0 = Relu(x); 1 = Neg(x); 2 = Reshape(0, c); 3 = Shape(0); 4 = Size(1).
        d.steps
            .push(node_step(def("Relu", 1), Box::new(Unused), vec![x], &[0]));
        d.steps
            .push(node_step(def("Neg", 1), Box::new(Unused), vec![x], &[1]));
        d.steps.push(node_step(
            def("Reshape", 2),
            Box::new(Unused),
            vec![s(0), Some(Source::Constant(0))],
            &[2],
        ));
        d.steps.push(node_step(
            def("Shape", 1),
            Box::new(Unused),
            vec![s(0)],
            &[3],
        ));
        d.steps.push(node_step(
            def("Size", 1),
            Box::new(Unused),
            vec![s(1)],
            &[4],
        ));
        hoist_shape_reads(&mut d).unwrap();
        let kinds: Vec<&str> = d.steps.iter().map(|s| s.step.kind.as_str()).collect();
        assert_eq!(kinds, ["Relu", "Shape", "Neg", "Size", "Reshape"]);
    }

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
