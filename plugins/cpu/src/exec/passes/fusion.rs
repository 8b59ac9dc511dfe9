//! Runs of elementwise steps fused into one ([`crate::exec::fuse`]).

use std::collections::HashMap;

use epx_plugin_api::sdk;

use super::{Draft, DraftStep};
use crate::exec::fuse::{FusedChain, FusedOp, PostFused, classify};
use crate::exec::step::{Source, Step};
use crate::fast::chain::{Chain as Ops, ChainOp, EwOp, Operand};

/// Longest chain of elementwise operations fused into one step.
const MAX_CHAIN: usize = 24;

/// `fuse_chains` (fast levels): replaces runs of elementwise steps by fused chains, walked block
/// by block ([`crate::fast::chain`]). A run is consecutive steps, each reading a value of the
/// run before it; every value made inside the run except the last must be read inside it and
/// nowhere else (not by later steps, not as a program output). A run right after a Conv whose
/// output only the run reads becomes the Conv's post-op, applied as the Conv writes its output.
/// A single elementwise step is a chain too: the block walk splits it across the intra-op pool.
///
/// In: steps, `bound`. Out: steps with each run one fused step.
pub(crate) fn fuse_chains(d: &mut Draft<'_, '_>) -> sdk::Result<()> {
    let ew: Vec<Option<(EwOp, Vec<usize>)>> = d.steps.iter().map(|st| elementwise(d, st)).collect();
    let steps = std::mem::take(&mut d.steps);
    d.steps = fuse(steps, ew, &d.bound);
    Ok(())
}

/// What step `st` is to the fuser: its operation and operand inputs.
fn elementwise(d: &Draft<'_, '_>, st: &DraftStep<'_>) -> Option<(EwOp, Vec<usize>)> {
    let srcs = &st.step.inputs;
    classify(&st.node.as_ref()?.def, |i| match srcs.get(i) {
        Some(Some(Source::Constant(c))) => d.constants.get(*c),
        _ => None,
    })
    .filter(|(_, operands)| {
        operands
            .iter()
            .all(|&k| matches!(srcs.get(k), Some(Some(_))))
    })
}

fn fuse<'g>(
    steps: Vec<DraftStep<'g>>,
    mut ew: Vec<Option<(EwOp, Vec<usize>)>>,
    outputs: &[Source],
) -> Vec<DraftStep<'g>> {
    // Who reads each slot: step indices, and usize::MAX for a program output.
    let mut readers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, st) in steps.iter().enumerate() {
        for src in st.step.inputs.iter().flatten() {
            if let Source::Slot(s) = src {
                readers.entry(*s).or_default().push(i);
            }
        }
    }
    for src in outputs {
        if let Source::Slot(s) = src {
            readers.entry(*s).or_default().push(usize::MAX);
        }
    }
    let out_slot = |st: &DraftStep<'_>| match st.step.outputs.as_slice() {
        [Some(s)] => Some(*s),
        _ => None,
    };
    // Whether step `i` (fusable) reads an operand made by steps `start..i`.
    let continues = |start: usize, i: usize| -> bool {
        let Some((_, operands)) = &ew[i] else {
            return false;
        };
        operands.iter().any(|&k| {
            matches!(steps[i].step.inputs.get(k), Some(Some(Source::Slot(s)))
                if (start..i).any(|j| out_slot(&steps[j]) == Some(*s)))
        })
    };
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        if ew[i].is_none() || out_slot(&steps[i]).is_none() {
            i += 1;
            continue;
        }
        let mut end = i + 1;
        while end < steps.len()
            && end - i < MAX_CHAIN
            && out_slot(&steps[end]).is_some()
            && continues(i, end)
        {
            end += 1;
        }
        // Shrink until every value but the last stays inside and is used there.
        let inside = |e: usize| {
            (i..e - 1).all(|j| {
                let r = out_slot(&steps[j])
                    .and_then(|s| readers.get(&s))
                    .map_or(&[][..], Vec::as_slice);
                !r.is_empty() && r.iter().all(|&x| x > j && x < e)
            })
        };
        while end > i + 1 && !inside(end) {
            end -= 1;
        }
        // A Conv whose output only this run reads: the run becomes its post-op.
        let after_conv = i > 0
            && steps[i - 1].step.kind == "Conv"
            && out_slot(&steps[i - 1]).is_some_and(|s| {
                readers
                    .get(&s)
                    .is_some_and(|r| r.iter().all(|&x| x >= i && x < end))
            });
        runs.push((i, end, after_conv));
        i = end;
    }
    if runs.is_empty() {
        return steps;
    }
    let mut out = Vec::with_capacity(steps.len());
    let mut steps = steps
        .into_iter()
        .zip(ew.iter_mut().map(Option::take))
        .enumerate()
        .peekable();
    for (start, end, after_conv) in runs {
        while let Some((_, (s, _))) = steps.next_if(|(k, _)| *k < start) {
            out.push(s);
        }
        let run: Vec<(DraftStep<'g>, (EwOp, Vec<usize>))> = (start..end)
            .filter_map(|_| {
                let (_, (s, ew)) = steps.next()?;
                Some((s, ew?))
            })
            .collect();
        let chain = fused(run);
        match out.pop() {
            Some(conv) if after_conv => match with_post(conv, chain) {
                Ok(step) => out.push(step),
                Err(both) => {
                    let (conv, chain) = *both;
                    out.push(conv);
                    out.push(chain.into_step());
                }
            },
            prev => {
                out.extend(prev);
                out.push(chain.into_step());
            }
        }
    }
    out.extend(steps.map(|(_, (s, _))| s));
    out
}

/// A run of fusable steps as one chain, before it becomes a step.
struct Chain {
    chain: FusedChain,
    first: String,
    inputs: Vec<Source>,
    outputs: Vec<Option<usize>>,
}

impl Chain {
    fn into_step<'g>(self) -> DraftStep<'g> {
        let ops = self.chain.describe();
        // A chain of one op is that op, run by the chain's loop.
        let (label, kind) = if ops.contains('+') {
            (
                format!("{} (fused {ops})", self.first),
                format!("fused {ops}"),
            )
        } else {
            (self.first, ops)
        };
        DraftStep {
            step: Step::new(
                label,
                kind,
                Box::new(self.chain),
                self.inputs.into_iter().map(Some).collect(),
                self.outputs,
            ),
            node: None,
        }
    }
}

/// A Conv step with `chain` applied to its output as it is produced ([`PostFused`]); both
/// back when the chain does not read the Conv's output.
fn with_post<'g>(
    conv: DraftStep<'g>,
    chain: Chain,
) -> Result<DraftStep<'g>, Box<(DraftStep<'g>, Chain)>> {
    let made = conv.step.outputs.first().copied().flatten();
    let primary = chain
        .inputs
        .iter()
        .position(|s| matches!((s, made), (Source::Slot(x), Some(m)) if *x == m));
    let Some(primary) = primary else {
        return Err(Box::new((conv, chain)));
    };
    let ops = chain.chain.describe();
    let conv = conv.step;
    let mut inputs = conv.inputs.clone();
    // The Conv's output is never stored: the chain reads it from the Conv directly.
    inputs.extend(
        chain
            .inputs
            .iter()
            .enumerate()
            .map(|(i, s)| (i != primary).then_some(*s)),
    );
    Ok(DraftStep {
        step: Step::new(
            format!("{} (fused {ops})", conv.label),
            format!("Conv+{ops}"),
            Box::new(PostFused {
                first: conv.kernel,
                first_inputs: conv.inputs.len(),
                chain: chain.chain,
                primary,
            }),
            inputs,
            chain.outputs,
        ),
        node: None,
    })
}

/// One chain for a run of fusable steps.
fn fused(run: Vec<(DraftStep<'_>, (EwOp, Vec<usize>))>) -> Chain {
    let made: Vec<Option<usize>> = run
        .iter()
        .map(|(s, _)| s.step.outputs.first().copied().flatten())
        .collect();
    let mut ext: Vec<Source> = Vec::new();
    let mut operand = |src: Source| -> Operand {
        if let Source::Slot(s) = src
            && let Some(k) = made.iter().position(|m| *m == Some(s))
        {
            return Operand::Tmp(k);
        }
        let i = match ext.iter().position(|e| *e == src) {
            Some(i) => i,
            None => {
                ext.push(src);
                ext.len() - 1
            }
        };
        Operand::Ext(i)
    };
    let first = run[0].0.step.label.clone();
    let output = run[run.len() - 1].0.step.outputs.clone();
    let mut ops = Vec::with_capacity(run.len());
    let mut parts = Vec::with_capacity(run.len());
    for (st, (op, which)) in run {
        let st = st.step;
        let inputs: Vec<Option<Operand>> = st.inputs.iter().map(|s| s.map(&mut operand)).collect();
        let operands = which
            .iter()
            .map(|&k| inputs[k].expect("operands are present"))
            .collect();
        ops.push(ChainOp { op, operands });
        parts.push(FusedOp {
            label: st.label,
            kernel: st.kernel,
            inputs,
        });
    }
    Chain {
        chain: FusedChain {
            chain: Ops { ops },
            parts,
        },
        first,
        inputs: ext,
        outputs: output,
    }
}

#[cfg(test)]
mod tests {
    use epx_plugin_api::sdk::testing::TestGraph;

    use super::*;
    use crate::exec::passes::testing::{Unused, def, kernel, node_step};
    use crate::exec::passes::{CompileOptions, Draft};
    use crate::ops::testing::{t, vals};

    fn kinds(d: &Draft<'_, '_>) -> Vec<String> {
        d.steps.iter().map(|s| s.step.kind.clone()).collect()
    }

    #[test]
    fn a_run_of_elementwise_steps_is_one_step_with_the_same_result() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], &options).unwrap();
        let one = d.constant(t(&[1], vec![1.0]));
        let x = Some(Source::Input(0));
        let (add, relu, neg) = (def("Add", 2), def("Relu", 1), def("Neg", 1));
        d.steps.push(node_step(
            add.clone(),
            kernel(&add),
            vec![x, Some(one)],
            &[0],
        ));
        d.steps.push(node_step(
            relu.clone(),
            kernel(&relu),
            vec![Some(Source::Slot(0))],
            &[1],
        ));
        d.steps.push(node_step(
            neg.clone(),
            kernel(&neg),
            vec![Some(Source::Slot(1))],
            &[2],
        ));
        d.bound = vec![Source::Slot(2)];
        fuse_chains(&mut d).unwrap();
        assert_eq!(kinds(&d), ["fused Add+Relu+Neg"]);
        let st = &d.steps[0].step;
        assert_eq!(st.outputs, [Some(2)]);
        let input = t(&[3], vec![-3.0, 0.5, 2.0]);
        let c = d.constants[0].view();
        let args: Vec<_> = st
            .inputs
            .iter()
            .map(|s| match s {
                Some(Source::Input(0)) => Some(input.view()),
                Some(Source::Constant(0)) => Some(c.reborrow()),
                other => panic!("{other:?}"),
            })
            .collect();
        let y = st.kernel.run(&args).unwrap();
        assert_eq!(vals(&y[0]), [-0.0, -1.5, -3.0]);
    }

    #[test]
    fn a_value_read_outside_the_run_ends_it_and_a_conv_takes_a_post_op() {
        let g = TestGraph::new();
        let options = CompileOptions::default();
        let mut d = Draft::new(g.view(), &[], &[], &[], &[], &options).unwrap();
        let x = Some(Source::Input(0));
        let (relu, neg) = (def("Relu", 1), def("Neg", 1));
        let s = |i| Some(Source::Slot(i));
        d.steps.push(node_step(
            def("Conv", 2),
            Box::new(Unused),
            vec![x, x],
            &[0],
        ));
        d.steps
            .push(node_step(relu.clone(), kernel(&relu), vec![s(0)], &[1]));
        d.steps
            .push(node_step(neg.clone(), kernel(&neg), vec![s(1)], &[2]));
        // The Relu's output is returned too: Conv+Relu, then Neg alone.
        d.bound = vec![Source::Slot(1), Source::Slot(2)];
        fuse_chains(&mut d).unwrap();
        assert_eq!(kinds(&d), ["Conv+Relu", "Neg"]);
        assert_eq!(d.steps[0].step.inputs, [x, x, None]);
    }
}
