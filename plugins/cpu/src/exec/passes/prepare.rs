//! Kernels readied for their constant inputs.

use epx_plugin_api::sdk;

use super::Draft;
use crate::tensor::TensorRef;

/// `prepare_kernels`: hands each kernel the inputs that are constants (after folding, so the
/// weights are final) through [`crate::kernel::OpKernel::prepare`], where a kernel packs its
/// weights once for every run. Without it a kernel packs them as it runs.
///
/// In: steps. Out: the same steps, their kernels prepared.
pub(crate) fn prepare_kernels(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    for st in &d.steps {
        let fixed: Vec<Option<TensorRef<'_>>> = st
            .step
            .inputs
            .iter()
            .map(|s| s.and_then(|s| d.constant_value(s)).map(|t| t.view()))
            .collect();
        st.step.kernel.prepare(&fixed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::CompileOptions;
    use crate::exec::passes::testing::{def, node_step};
    use crate::exec::step::Source;
    use crate::kernel::OpKernel;
    use crate::ops::testing::{t, vals};
    use crate::tensor::Tensor;

    /// Records what `prepare` saw.
    struct Seen(Arc<Mutex<Vec<Option<Vec<f32>>>>>);

    impl OpKernel for Seen {
        fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
            let got = constants
                .iter()
                .map(|c| c.as_ref().map(|c| vals(&c.try_to_owned().unwrap())))
                .collect();
            *self.0.lock().unwrap() = got;
        }

        fn run(&self, _: &[Option<TensorRef<'_>>]) -> crate::error::OpResult<Vec<Tensor>> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_kernel_sees_its_constant_inputs_only() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], &options).unwrap();
        let w = d.constant(t(&[2], vec![1.0, 2.0]));
        let inputs = vec![Some(Source::Input(0)), Some(w), None];
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kernel = Box::new(Seen(Arc::clone(&seen)));
        d.steps
            .push(node_step(def("MatMul", 2), kernel, inputs, &[0]));
        prepare_kernels(&mut d).unwrap();
        assert_eq!(*seen.lock().unwrap(), [None, Some(vec![1.0, 2.0]), None]);
    }
}
