//! The fast kernels: f32 paths of the same ops the reference kernels in [`crate::ops`] define,
//! and the one table that picks the instruction set they run with.
//!
//! Each reference kernel is the definition: generic over element types, any rank, written for
//! clarity. A fast kernel here covers the common case of one op (the 2-D f32 convolution, the
//! f32 softmax, erf, layer normalization and broadcast arithmetic rows, fused elementwise
//! chains) and is tested against the reference. Which level runs is chosen once per process from
//! [`ISAS`]: the best one the CPU has, or the one [`ENV_KERNELS`] names, down to `reference`,
//! which runs the reference kernels alone. The ops reach fast kernels only through
//! [`FastKernels`] (by element type), the functions of [`conv2d`] and [`math`], and [`enabled`].

pub mod chain;
pub mod conv2d;
pub mod dots;
pub mod gemm;
pub mod geometry;
pub mod isa;
pub mod lstm;
pub mod math;
pub mod post;
pub mod qbytes;
pub mod qconv;
pub mod qgemm;
pub mod qmatmul;
pub mod round;
pub(crate) mod simd;

use crate::error::OpResult;

use crate::fast::post::PostOp;

pub use isa::{
    ENV_KERNELS, ENV_SIMD, ISAS, Isa, configured_isa, enabled, isa, process_isa, with_isa,
};

/// The fast kernels an element type has; the reference kernels run where it has none.
pub trait FastKernels: Sized {
    /// The 2-D convolution of [`conv2d::Conv2d`], with whether it applied `post`; `None` for
    /// no fast kernel of this type or level, an error when the memory is not there.
    fn conv2d(
        _conv: &conv2d::Conv2d<'_>,
        _x: &[Self],
        _w: &[Self],
        _b: Option<&[Self]>,
        _post: Option<&mut dyn PostOp>,
    ) -> Option<OpResult<(Vec<Self>, bool)>> {
        None
    }
}

impl FastKernels for f32 {
    fn conv2d(
        conv: &conv2d::Conv2d<'_>,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        post: Option<&mut dyn PostOp>,
    ) -> Option<OpResult<(Vec<f32>, bool)>> {
        enabled().then(|| conv.run_post(x, w, b, post))
    }
}

impl FastKernels for f64 {}
