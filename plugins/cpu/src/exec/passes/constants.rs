//! Nodes of constants, evaluated once.

use epx_plugin_api::sdk;

use super::{Draft, Verdict};
use crate::kernel::is_control_flow;
use crate::tensor::TensorRef;

/// Ops whose result is not a function of their inputs alone: never evaluated at compile time.
const NOT_FOLDABLE: &[&str] = &[
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
];

/// `fold_constants`: a node whose every input is known at compile time (a constant, or a run
/// input the enclosing graph fixes) is run here, once, and its outputs become constants. Random
/// ops and control flow are not folded. A node that fails is left to fail at run time, where
/// the error names the run.
///
/// In: steps, in order (a folded node's outputs may make the next one foldable). Out: steps
/// without the folded nodes; their readers read the new constants.
pub(crate) fn fold_constants(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    // One pass ([`Draft::rewrite_steps`]): each step sees its inputs already renamed to the
    // constants folded before it.
    d.rewrite_steps(|d, st| {
        let Some(info) = &st.node else {
            return Verdict::Keep;
        };
        let op = info.def.op_type.as_str();
        if NOT_FOLDABLE.contains(&op) || is_control_flow(op) {
            return Verdict::Keep;
        }
        let args: Option<Vec<Option<TensorRef<'_>>>> = st
            .step
            .inputs
            .iter()
            .map(|s| match s {
                None => Some(None),
                Some(s) => d.constant_value(*s).map(|t| Some(t.view())),
            })
            .collect();
        let made = args.and_then(|args| st.step.kernel.run(&args).ok());
        let wanted = st.step.outputs.iter().flatten().count();
        let Some(values) = made.filter(|v| v.len() >= wanted) else {
            return Verdict::Keep;
        };
        let mut renames = Vec::new();
        for (slot, t) in st.step.outputs.iter().zip(values) {
            if let Some(slot) = slot {
                renames.push((*slot, d.constant(t)));
            }
        }
        Verdict::Remove(renames)
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::testing::{def, kernel, node_step};
    use crate::exec::passes::{CompileOptions, Draft};
    use crate::exec::step::Source;
    use crate::ops::testing::{t, vals};

    #[test]
    fn a_chain_of_constant_nodes_folds_and_a_node_of_a_run_input_stays() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let four = t(&[1], vec![4.0]);
        let known = [None, Some(&four)];
        let mut d = Draft::new(g.view(), &[], &[], &[], &known, &options).unwrap();
        let two = d.constant(t(&[1], vec![2.0]));
        let (neg, add, mul) = (def("Neg", 1), def("Add", 2), def("Mul", 2));
        d.steps
            .push(node_step(neg.clone(), kernel(&neg), vec![Some(two)], &[0]));
        let fixed = Some(Source::Input(1));
        d.steps.push(node_step(
            add.clone(),
            kernel(&add),
            vec![Some(Source::Slot(0)), fixed],
            &[1],
        ));
        let run = Some(Source::Input(0));
        d.steps.push(node_step(
            mul.clone(),
            kernel(&mul),
            vec![Some(Source::Slot(1)), run],
            &[2],
        ));
        fold_constants(&mut d).unwrap();
        assert_eq!(d.steps.len(), 1, "Neg and Add fold; Mul reads a run input");
        let Some(Some(Source::Constant(c))) = d.steps[0].step.inputs.first().copied() else {
            panic!("Mul reads a constant")
        };
        assert_eq!(vals(&d.constants[c]), [2.0]);
    }

    /// A kernel that succeeds with one value: only the op's name keeps it from folding.
    struct Draw;

    impl crate::kernel::OpKernel for Draw {
        fn run(
            &self,
            _: &[Option<TensorRef<'_>>],
        ) -> crate::error::OpResult<Vec<crate::tensor::Tensor>> {
            Ok(vec![t(&[1], vec![0.25])])
        }
    }

    #[test]
    fn random_ops_are_not_folded() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], &options).unwrap();
        d.steps.push(node_step(
            def("RandomUniform", 0),
            Box::new(Draw),
            vec![],
            &[0],
        ));
        d.steps
            .push(node_step(def("Identity", 0), Box::new(Draw), vec![], &[1]));
        fold_constants(&mut d).unwrap();
        let kinds: Vec<&str> = d.steps.iter().map(|s| s.step.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["RandomUniform"],
            "the same kernel under another op folds"
        );
    }
}
