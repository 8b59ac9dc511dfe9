//! Elementwise f32 chains over slices: a run of Add/Mul/Clip/HardSigmoid/... operations whose
//! intermediate values nobody else reads, computed in one walk over the output, in blocks small
//! enough to stay in L1, instead of one full pass (and one full-size buffer) per operation. The
//! executor fuses nodes into chains ([`crate::exec`]); a chain also runs as the post-op of the
//! kernel before it ([`ChainPost`]).

use crate::fast::math::{erf_f32, sigmoid_f32, tanh_f32};
use crate::tensor::{Tensor, TensorRef};

/// Elements per block: a few block registers per operator stay in L1.
const BLOCK: usize = 512;
/// Elements below which a chain is not split across the intra-op pool.
const PAR_MIN: usize = 32 << 10;

/// An elementwise f32 operation the block walk computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EwOp {
    Add,
    Sub,
    Mul,
    Div,
    Relu,
    Sigmoid,
    Tanh,
    Exp,
    Sqrt,
    Neg,
    Abs,
    Erf,
    Identity,
    HardSwish,
    Clip(f32, f32),
    HardSigmoid(f32, f32),
    LeakyRelu(f32),
}

impl EwOp {
    pub fn is_binary(self) -> bool {
        matches!(self, EwOp::Add | EwOp::Sub | EwOp::Mul | EwOp::Div)
    }

    fn name(self) -> &'static str {
        match self {
            EwOp::Add => "Add",
            EwOp::Sub => "Sub",
            EwOp::Mul => "Mul",
            EwOp::Div => "Div",
            EwOp::Relu => "Relu",
            EwOp::Sigmoid => "Sigmoid",
            EwOp::Tanh => "Tanh",
            EwOp::Exp => "Exp",
            EwOp::Sqrt => "Sqrt",
            EwOp::Neg => "Neg",
            EwOp::Abs => "Abs",
            EwOp::Erf => "Erf",
            EwOp::Identity => "Identity",
            EwOp::HardSwish => "HardSwish",
            EwOp::Clip(..) => "Clip",
            EwOp::HardSigmoid(..) => "HardSigmoid",
            EwOp::LeakyRelu(_) => "LeakyRelu",
        }
    }

    /// The operation on one element, as the unfused kernels compute it (Erf: [`erf_f32`]), except
    /// Tanh: [`tanh_f32`], within a few ulp of their `f32::tanh`.
    /// `max(0).min(1)` rather than `clamp`: like the unfused kernels, NaN becomes 0 there.
    #[inline(always)]
    #[allow(clippy::manual_clamp)]
    pub fn unary(self, x: f32) -> f32 {
        match self {
            EwOp::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            EwOp::Sigmoid => sigmoid_f32(x),
            EwOp::Tanh => tanh_f32(x),
            EwOp::Exp => x.exp(),
            EwOp::Sqrt => x.sqrt(),
            EwOp::Neg => -x,
            EwOp::Abs => x.abs(),
            EwOp::Erf => erf_f32(x),
            EwOp::HardSwish => x * (x * (1.0 / 6.0) + 0.5).max(0.0).min(1.0),
            EwOp::Clip(lo, hi) => {
                let v = if x < lo { lo } else { x };
                if v > hi { hi } else { v }
            }
            EwOp::HardSigmoid(a, b) => (a * x + b).max(0.0).min(1.0),
            EwOp::LeakyRelu(a) => {
                if x < 0.0 {
                    a * x
                } else {
                    x
                }
            }
            EwOp::Identity | EwOp::Add | EwOp::Sub | EwOp::Mul | EwOp::Div => x,
        }
    }
}

/// Where an operand of a fused operation comes from.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    /// Input `i` of the fused step.
    Ext(usize),
    /// The result of operation `k` of the chain.
    Tmp(usize),
}

/// One operation of a chain, over the chain's inputs and earlier results.
#[derive(Clone, Debug)]
pub struct ChainOp {
    pub op: EwOp,
    pub operands: Vec<Operand>,
}

/// A chain of elementwise operations; its output is the last operation's.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    pub ops: Vec<ChainOp>,
}

impl Chain {
    /// A name for the fused step: its operations.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.ops.iter().map(|o| o.op.name()).collect();
        names.join("+")
    }

    /// How the walk reads each input: the output shape, each used input's layout and data.
    /// `primary` is an input given by shape only (the output of the kernel this chain is fused
    /// into), which must have the output's shape. `None` when an input is not f32 or does not
    /// line up with the output.
    fn plan<'a>(
        &self,
        inputs: &'a [Option<TensorRef<'_>>],
        primary: Option<(usize, &[usize])>,
    ) -> Option<Plan<'a>> {
        let mut used = vec![false; inputs.len()];
        for op in &self.ops {
            for o in &op.operands {
                if let Operand::Ext(i) = o {
                    used[*i] = true;
                }
            }
        }
        let mut arrays = Vec::with_capacity(inputs.len());
        let mut shapes: Vec<&[usize]> = Vec::with_capacity(inputs.len());
        for (i, t) in inputs.iter().enumerate() {
            if !used[i] {
                arrays.push(None);
            } else if let Some((_, shape)) = primary.filter(|(p, _)| *p == i) {
                arrays.push(None);
                shapes.push(shape);
            } else if let Some(TensorRef::F32(a)) = t {
                arrays.push(Some(a.as_slice()?));
                shapes.push(a.shape());
            } else {
                return None;
            }
        }
        let out_shape = broadcast(&shapes)?;
        if primary.is_some_and(|(_, s)| s != out_shape.as_slice()) {
            return None;
        }
        let mut layouts = Vec::with_capacity(inputs.len());
        for (i, t) in inputs.iter().enumerate() {
            layouts.push(match (primary, t) {
                _ if !used[i] => None,
                (Some((p, _)), _) if p == i => Some(Layout::Full),
                (_, Some(t)) => Some(layout(t.shape(), &out_shape)?),
                _ => None,
            });
        }
        Some(Plan {
            out_shape,
            layouts,
            arrays,
        })
    }

    /// The block walk, when every input is f32 and lines up with the output; `None` otherwise
    /// (and when the memory for the output is not there: the op-by-op path then reports it).
    pub fn walk(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<Tensor> {
        let plan = self.plan(inputs, None)?;
        // Over the size limit: the op-by-op path reports it.
        let total = crate::limits::checked_numel(&plan.out_shape).ok()?;
        let work_len = plan.work_len(self.ops.len());
        let chunk = crate::par::chunk_len(total, PAR_MIN, BLOCK);
        // Memory that is not there: the op-by-op path reports it.
        if chunk >= total {
            let mut out = crate::scratch::take(total).ok()?;
            let mut work = vec![0f32; work_len];
            walk_blocks(&self.ops, &plan, 0, total, Dst::Append(&mut out), &mut work);
            return Tensor::from_vec(&plan.out_shape, out).ok();
        }
        // Across the pool: each piece written in place (every input is read from its own
        // array, none from the destination).
        let mut out = crate::scratch::zeros(total).ok()?;
        crate::par::for_each_chunk(&mut out, chunk, |i, piece| {
            let len = piece.len();
            crate::par::with_work(work_len, |work| {
                walk_blocks(&self.ops, &plan, i * chunk, len, Dst::InPlace(piece), work);
            });
        });
        Tensor::from_vec(&plan.out_shape, out).ok()
    }
}

/// How an input of the chain lines up with the output, flattened in C order.
#[derive(Clone, Copy)]
enum Layout {
    /// Same shape: element `p` is element `p`.
    Full,
    /// One element for all.
    Scalar,
    /// Constant over runs of `inner` elements: element `p` is `(p / inner) % period`
    /// (a per-channel `[1, C, 1, 1]` against `[N, C, H, W]`).
    Outer { inner: usize, period: usize },
    /// Repeats every `period` elements: element `p` is `p % period` (a bias over the last axes).
    Inner { period: usize },
}

/// The broadcast of all `shapes`, right-aligned; `None` when they do not broadcast.
fn broadcast(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (o, &d) in out[rank - s.len()..].iter_mut().zip(s.iter()) {
            match (*o, d) {
                (a, b) if a == b => {}
                (1, b) => *o = b,
                (_, 1) => {}
                _ => return None,
            }
        }
    }
    Some(out)
}

fn layout(shape: &[usize], out: &[usize]) -> Option<Layout> {
    let n: usize = shape.iter().product();
    let total: usize = out.iter().product();
    if n == total {
        return Some(Layout::Full);
    }
    if n == 1 {
        return Some(Layout::Scalar);
    }
    let rank = out.len();
    let mut s = vec![1usize; rank - shape.len()];
    s.extend_from_slice(shape);
    // Trailing ones: constant over the inner block.
    let k = s.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
    let inner: usize = out[k..].iter().product();
    // Leading ones: repeats over the outer block.
    let j = s.iter().position(|&d| d != 1).unwrap_or(rank);
    if s[j..k] != out[j..k] {
        return None;
    }
    let period: usize = s[j..k].iter().product();
    Some(if inner == 1 {
        Layout::Inner { period }
    } else {
        Layout::Outer { inner, period }
    })
}

/// Fills `dst` with elements `p0..p0 + dst.len()` of a broadcast input.
fn gather(src: &[f32], how: Layout, p0: usize, dst: &mut [f32]) {
    match how {
        Layout::Full => dst.copy_from_slice(&src[p0..p0 + dst.len()]),
        Layout::Scalar => dst.fill(src[0]),
        Layout::Outer { inner, period } => {
            let mut p = p0;
            let mut rest = dst;
            while !rest.is_empty() {
                let run = (inner - p % inner).min(rest.len());
                let (head, tail) = rest.split_at_mut(run);
                head.fill(src[(p / inner) % period]);
                rest = tail;
                p += run;
            }
        }
        Layout::Inner { period } => {
            // One period (from `p0`'s phase), then the filled part doubled: every copy starts
            // at a multiple of the period, so a short period (a bias of 3 or 8 per row) costs
            // a few copies per block, not one per period.
            let at = p0 % period;
            let first = (period - at).min(dst.len());
            dst[..first].copy_from_slice(&src[at..at + first]);
            let second = (dst.len() - first).min(at);
            dst[first..first + second].copy_from_slice(&src[..second]);
            let mut filled = first + second;
            while filled < dst.len() {
                let n = filled.min(dst.len() - filled);
                dst.copy_within(..n, filled);
                filled += n;
            }
        }
    }
}

/// An operand's values for one block.
#[derive(Clone, Copy)]
enum Val<'a> {
    Slice(&'a [f32]),
    Scalar(f32),
}

#[inline(always)]
fn apply(op: EwOp, args: &[Val<'_>], out: &mut [f32]) {
    macro_rules! bin {
        ($f:expr) => {{
            let f = $f;
            match (args[0], args[1]) {
                (Val::Slice(a), Val::Slice(b)) => {
                    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                        *o = f(x, y);
                    }
                }
                (Val::Slice(a), Val::Scalar(y)) => {
                    for (o, &x) in out.iter_mut().zip(a) {
                        *o = f(x, y);
                    }
                }
                (Val::Scalar(x), Val::Slice(b)) => {
                    for (o, &y) in out.iter_mut().zip(b) {
                        *o = f(x, y);
                    }
                }
                (Val::Scalar(x), Val::Scalar(y)) => out.fill(f(x, y)),
            }
        }};
    }
    match op {
        EwOp::Add => bin!(|x: f32, y: f32| x + y),
        EwOp::Sub => bin!(|x: f32, y: f32| x - y),
        EwOp::Mul => bin!(|x: f32, y: f32| x * y),
        EwOp::Div => bin!(|x: f32, y: f32| x / y),
        _ => match args[0] {
            Val::Slice(a) => {
                // One monomorphic loop per operation, so each vectorizes.
                macro_rules! un {
                    ($($p:pat),*) => {
                        match op {
                            $($p => {
                                for (o, &x) in out.iter_mut().zip(a) {
                                    *o = op.unary(x);
                                }
                            })*
                        }
                    };
                }
                un!(
                    EwOp::Relu,
                    EwOp::Sigmoid,
                    EwOp::Tanh,
                    EwOp::Exp,
                    EwOp::Sqrt,
                    EwOp::Neg,
                    EwOp::Abs,
                    EwOp::Erf,
                    EwOp::Identity,
                    EwOp::HardSwish,
                    EwOp::Clip(..),
                    EwOp::HardSigmoid(..),
                    EwOp::LeakyRelu(_),
                    EwOp::Add | EwOp::Sub | EwOp::Mul | EwOp::Div
                )
            }
            Val::Scalar(x) => out.fill(op.unary(x)),
        },
    }
}

/// What [`Chain::plan`] found: the output shape and how each input is read.
struct Plan<'a> {
    out_shape: Vec<usize>,
    layouts: Vec<Option<Layout>>,
    /// The data of each used input; `None` for the primary input, read from [`Dst::InPlace`].
    arrays: Vec<Option<&'a [f32]>>,
}

impl Plan<'_> {
    /// Scratch elements [`walk_blocks`] needs: a block per operation and per input.
    fn work_len(&self, ops: usize) -> usize {
        (ops + self.arrays.len()) * BLOCK
    }
}

/// Where the walk puts its results.
enum Dst<'a> {
    /// Appended to a vector.
    Append(&'a mut Vec<f32>),
    /// Over the primary input's own elements, which the chain reads first.
    InPlace(&'a mut [f32]),
}

crate::multiversion! {
/// The chain over output elements `base..base + total`, block by block, into `dst`.
/// `work` is scratch space of at least [`Plan::work_len`] elements. In place, the primary
/// input is read where it lies, and the last operation writes there directly unless it reads
/// the primary input itself.
fn walk_blocks(
    ops: &[ChainOp],
    plan: &Plan<'_>,
    base: usize,
    total: usize,
    dst: Dst<'_>,
    work: &mut [f32],
) {
    let mut dst = dst;
    let (layouts, arrays) = (&plan.layouts, &plan.arrays);
    let n = ops.len();
    let (regs, staged) = work.split_at_mut(n * BLOCK);
    let is_own = |o: &Operand| {
        matches!(*o, Operand::Ext(i) if matches!(layouts[i], Some(Layout::Full)) && arrays[i].is_none())
    };
    let last_direct =
        matches!(dst, Dst::InPlace(_)) && !ops[n - 1].operands.iter().any(is_own);
    let mut q0 = 0;
    while q0 < total {
        let len = BLOCK.min(total - q0);
        let p0 = base + q0;
        for (i, l) in layouts.iter().enumerate() {
            if let (Some(l @ (Layout::Outer { .. } | Layout::Inner { .. })), Some(a)) =
                (l, arrays[i])
            {
                gather(a, *l, p0, &mut staged[i * BLOCK..i * BLOCK + len]);
            }
        }
        let through = if last_direct { n - 1 } else { n };
        {
            let own = match &dst {
                Dst::InPlace(seg) => Some(&seg[q0..q0 + len]),
                Dst::Append(_) => None,
            };
            for (k, op) in ops[..through].iter().enumerate() {
                let (done, rest) = regs.split_at_mut(k * BLOCK);
                let args = block_args(op, (layouts, arrays), (staged, done, own), p0, len);
                apply(op.op, &args[..op.operands.len()], &mut rest[..len]);
            }
        }
        match &mut dst {
            Dst::InPlace(seg) if last_direct => {
                let op = &ops[n - 1];
                let args = block_args(op, (layouts, arrays), (staged, regs, None), p0, len);
                apply(op.op, &args[..op.operands.len()], &mut seg[q0..q0 + len]);
            }
            Dst::InPlace(seg) => {
                seg[q0..q0 + len].copy_from_slice(&regs[(n - 1) * BLOCK..(n - 1) * BLOCK + len]);
            }
            Dst::Append(out) => {
                out.extend_from_slice(&regs[(n - 1) * BLOCK..(n - 1) * BLOCK + len]);
            }
        }
        q0 += len;
    }
}
}

/// The operands of `op` for the block at output element `p0` of `len` elements: its earlier
/// results in `done`, inputs read where they lie or gathered into `staged`, and the primary
/// input `own` (in place).
#[inline(always)]
fn block_args<'v>(
    op: &ChainOp,
    (layouts, arrays): (&[Option<Layout>], &[Option<&'v [f32]>]),
    (staged, done, own): (&'v [f32], &'v [f32], Option<&'v [f32]>),
    p0: usize,
    len: usize,
) -> [Val<'v>; 2] {
    let mut args = [Val::Scalar(0.0); 2];
    for (a, o) in args.iter_mut().zip(&op.operands) {
        *a = match *o {
            Operand::Tmp(j) => Val::Slice(&done[j * BLOCK..j * BLOCK + len]),
            Operand::Ext(i) => match (layouts[i], arrays[i], own) {
                (Some(Layout::Full), Some(x), _) => Val::Slice(&x[p0..p0 + len]),
                (Some(Layout::Scalar), Some(x), _) => Val::Scalar(x[0]),
                (Some(Layout::Full), None, Some(own)) => Val::Slice(own),
                _ => Val::Slice(&staged[i * BLOCK..i * BLOCK + len]),
            },
        };
    }
    args
}

/// A chain applied to the output of the kernel it follows, segment by segment, while that
/// output is still in cache ([`crate::fast::post::PostOp`]).
pub struct ChainPost<'c, 'a, 'b> {
    chain: &'c Chain,
    inputs: &'a [Option<TensorRef<'b>>],
    /// The chain input that is the kernel's output.
    primary: usize,
    plan: Option<Plan<'a>>,
}

impl<'c, 'a, 'b> ChainPost<'c, 'a, 'b> {
    pub fn new(chain: &'c Chain, inputs: &'a [Option<TensorRef<'b>>], primary: usize) -> Self {
        ChainPost {
            chain,
            inputs,
            primary,
            plan: None,
        }
    }
}

impl crate::fast::post::PostOp for ChainPost<'_, '_, '_> {
    fn accepts(&mut self, shape: &[usize]) -> bool {
        self.plan = self.chain.plan(self.inputs, Some((self.primary, shape)));
        self.plan.is_some()
    }

    fn work_len(&self) -> usize {
        self.plan
            .as_ref()
            .map_or(0, |p| p.work_len(self.chain.ops.len()))
    }

    fn apply(&self, seg: &mut [f32], base: usize, work: &mut [f32]) {
        if let Some(plan) = &self.plan {
            let len = seg.len();
            walk_blocks(&self.chain.ops, plan, base, len, Dst::InPlace(seg), work);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_of_broadcast_inputs() {
        let out = [2, 3, 4, 5];
        assert!(matches!(layout(&[2, 3, 4, 5], &out), Some(Layout::Full)));
        assert!(matches!(layout(&[1], &out), Some(Layout::Scalar)));
        assert!(matches!(
            layout(&[1, 3, 1, 1], &out),
            Some(Layout::Outer {
                inner: 20,
                period: 3
            })
        ));
        assert!(matches!(
            layout(&[4, 5], &out),
            Some(Layout::Inner { period: 20 })
        ));
        assert!(matches!(
            layout(&[2, 1, 1, 1], &out),
            Some(Layout::Outer {
                inner: 60,
                period: 2
            })
        ));
        // Broadcast in the middle: not a block pattern.
        assert!(layout(&[2, 1, 4, 5], &out).is_none());
        assert!(layout(&[3, 1, 5], &out).is_none());
    }

    #[test]
    fn gather_repeats_and_spreads() {
        let mut d = [0f32; 7];
        gather(
            &[1., 2., 3.],
            Layout::Outer {
                inner: 2,
                period: 3,
            },
            3,
            &mut d,
        );
        assert_eq!(d, [2., 3., 3., 1., 1., 2., 2.]);
        gather(&[1., 2., 3.], Layout::Inner { period: 3 }, 1, &mut d);
        assert_eq!(d, [2., 3., 1., 2., 3., 1., 2.]);
        // Longer than a few periods, from every phase, and shorter than one.
        let src: Vec<f32> = (0..5).map(|i| i as f32).collect();
        for p0 in 0..7 {
            for len in [0, 2, 4, 5, 23, 64] {
                let mut d = vec![-1f32; len];
                gather(&src, Layout::Inner { period: 5 }, p0, &mut d);
                let want: Vec<f32> = (p0..p0 + len).map(|p| (p % 5) as f32).collect();
                assert_eq!(d, want, "p0 {p0}, len {len}");
            }
        }
    }
}
