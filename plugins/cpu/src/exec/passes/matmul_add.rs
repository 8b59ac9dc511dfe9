//! A MatMul followed by the Add of a bias row, as one product.

use epx_plugin_api::ElementType;
use epx_plugin_api::sdk;

use super::{Draft, DraftStep, Reads};
use crate::exec::step::{Source, Step};
use crate::tensor::Tensor;

/// `fuse_matmul_add` (fast levels): a MatMul whose output only an Add reads, that Add adding a
/// constant row as long as the product's rows (`[N]` or `[1, .., 1, N]`, `N` the last dim of a
/// constant B of rank 2 or more), becomes one step whose GEMM accumulates onto rows that start
/// as the bias ([`crate::ops::matmul::build_matmul_add`]): one pass over the output instead of
/// two, and no second output buffer. ONNX Runtime fuses MatMul and Add into its Gemm the same
/// way.
///
/// In: steps. Out: each such pair one `MatMul+Add` step, where the Add was.
pub(crate) fn fuse_matmul_add(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    // The pairs, found on the steps as they are (a fusion changes no other pair's readers),
    // then made in one rebuild.
    let reads = d.reads();
    let pairs: Vec<(usize, usize, Source)> = (0..d.steps.len())
        .filter_map(|i| bias_add_after(d, &reads, i).map(|(j, bias)| (i, j, bias)))
        .collect();
    if pairs.is_empty() {
        return Ok(());
    }
    let mut steps: Vec<Option<DraftStep<'_>>> =
        std::mem::take(&mut d.steps).into_iter().map(Some).collect();
    for (i, j, bias) in pairs {
        let (Some(matmul), Some(add)) = (steps[i].take(), steps[j].as_mut()) else {
            continue;
        };
        let label = format!("{} (fused Add)", matmul.step.label);
        let mut inputs = matmul.step.inputs;
        inputs.push(Some(bias));
        let outputs = std::mem::take(&mut add.step.outputs);
        *add = DraftStep {
            step: Step::new(
                label.clone(),
                "MatMul+Add".into(),
                crate::ops::matmul::build_matmul_add(label),
                inputs,
                outputs,
            ),
            node: None,
        };
    }
    d.steps = steps.into_iter().flatten().collect();
    Ok(())
}

/// For a MatMul step `i`: the step that adds a bias row to its output, and the bias.
fn bias_add_after(d: &Draft<'_, '_>, reads: &Reads, i: usize) -> Option<(usize, Source)> {
    // Both on float32 or float64 inputs as their kernels were made (float16 already widened),
    // or on values the graph leaves untyped (B and the bias are float constants; the kernel
    // checks A's type against them).
    let wide = |st: &DraftStep<'_>| {
        st.node.as_ref().is_some_and(|n| {
            n.def
                .input_types
                .iter()
                .all(|t| matches!(t, None | Some(ElementType::Float | ElementType::Double)))
        }) && st.step.outputs.len() == 1
    };
    let st = &d.steps[i];
    if !st.is_op("MatMul") || !wide(st) {
        return None;
    }
    let [Some(_), Some(b)] = st.step.inputs.as_slice() else {
        return None;
    };
    let b = d.constant_value(*b)?;
    let [Some(made)] = st.step.outputs.as_slice() else {
        return None;
    };
    let n = *b.shape().last()?;
    if b.shape().len() < 2 || reads.count(*made) != 1 {
        return None;
    }
    let j = reads.first(*made).filter(|&j| j > i)?;
    let add = &d.steps[j];
    if !add.is_op("Add") || !wide(add) {
        return None;
    }
    let bias = match add.step.inputs.as_slice() {
        [Some(Source::Slot(s)), Some(c)] | [Some(c), Some(Source::Slot(s))] if s == made => *c,
        _ => return None,
    };
    let row = |t: &Tensor| {
        let shape = t.shape();
        shape.last() == Some(&n)
            && shape[..shape.len() - 1].iter().all(|&d| d == 1)
            && t.elem_type() == b.elem_type()
            && matches!(t, Tensor::F32(_) | Tensor::F64(_))
    };
    d.constant_value(bias).is_some_and(row).then_some((j, bias))
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::ElementType;
    use epx_plugin_api::sdk::testing::TestGraph;

    use crate::exec::passes::CompileOptions;
    use crate::exec::program::{Program, compile_options};
    use crate::ops::testing::{t, vals};

    /// `y = x @ w + b` (and `+ b` written first), batched, against the same graph with the
    /// pass off; a bias that is not a row, and a product read twice, are left alone.
    #[test]
    fn a_bias_row_added_to_a_product_joins_the_product() {
        let mut g = TestGraph::new();
        let x = g.input("x", ElementType::Float, &[2, 3, 4]);
        let w: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
        g.initializer("w", &[4, 5], &w);
        g.initializer("b", &[1, 1, 1, 5], &[0.5f32, -1.0, 2.0, 0.25, -0.75]);
        g.initializer("col", &[3, 1], &[1.0f32, 2.0, 3.0]);
        g.node("MatMul", &["x", "w"], &["p"]);
        g.node("Add", &["b", "p"], &["y"]);
        g.node("MatMul", &["x", "w"], &["q"]);
        g.node("Add", &["q", "col"], &["z"]);
        g.node("MatMul", &["x", "w"], &["r"]);
        g.node("Add", &["r", "b"], &["u"]);
        g.node("Neg", &["r"], &["v"]);
        let outs: Vec<u32> = ["y", "z", "u", "v"]
            .iter()
            .map(|n| g.output(n, ElementType::Float, &[]))
            .collect();
        let nodes: Vec<u32> = (0..7).collect();
        let all = CompileOptions::default();
        let p = Program::compile(&g.view(), &nodes, &[Some(x)], &outs, &[], &all).unwrap();
        let kinds: Vec<&str> = p.steps.iter().map(|s| s.kind.as_str()).collect();
        if crate::fast::enabled() {
            assert_eq!(
                kinds.iter().filter(|k| **k == "MatMul+Add").count(),
                1,
                "{kinds:?}"
            );
        }
        let off = compile_options(Some("fuse_matmul_add")).unwrap();
        let q = Program::compile(&g.view(), &nodes, &[Some(x)], &outs, &[], &off).unwrap();
        assert!(q.steps.iter().all(|s| s.kind != "MatMul+Add"));
        let xv: Vec<f32> = (0..24).map(|i| (i as f32 * 0.11).cos()).collect();
        let xt = t(&[2, 3, 4], xv);
        let (a, b) = (
            p.run(&[Some(xt.view())]).unwrap(),
            q.run(&[Some(xt.view())]).unwrap(),
        );
        assert_eq!(a[0].shape(), [1, 2, 3, 5]);
        for (u, v) in a.iter().zip(&b) {
            assert_eq!(u.shape(), v.shape());
            for (p, q) in vals(u).iter().zip(vals(v)) {
                assert!((p - q).abs() <= 1e-6 * (1.0 + q.abs()), "{p} vs {q}");
            }
        }
    }
}
