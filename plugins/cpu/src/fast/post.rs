//! The elementwise work a kernel applies to its f32 output while each part is still in cache
//! (a fused activation, a BatchNormalization folded in, an elementwise chain).

/// Elementwise work on a kernel's f32 output 0, done segment by segment while each segment is
/// still in cache ([`OpKernel::run_with_post`]). Segments may be applied from several threads at
/// once (a kernel that splits its output across the intra-op pool applies each part where it is
/// computed).
pub trait PostOp: Sync {
    /// Whether it applies to an output of this shape; asked once, before any segment.
    fn accepts(&mut self, shape: &[usize]) -> bool;
    /// Scratch elements [`apply`](Self::apply) needs (asked after `accepts`).
    fn work_len(&self) -> usize;
    /// Transforms, in place, the output elements `base..base + seg.len()` (flat, C order),
    /// using `work` (at least [`work_len`](Self::work_len) elements, contents unspecified) as
    /// scratch. Each element is passed exactly once.
    fn apply(&self, seg: &mut [f32], base: usize, work: &mut [f32]);
}
