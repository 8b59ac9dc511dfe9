//! The fast kernels (level 1): f32 and 8-bit paths of the ops the reference kernels in
//! [`crate::ops`] define, and the one table that picks the instruction set they run with. A fast
//! kernel takes slices, shapes and geometry and names no op; the ops call it and keep their
//! reference path.
//!
//! Each reference kernel is the definition: generic over element types, any rank, written for
//! clarity. A fast kernel here covers the common case of one op and is tested against the
//! reference. Which level runs is chosen once per process from [`ISAS`]: the best one the CPU
//! has, or the one [`ENV_KERNELS`] names, down to `reference`, which runs the reference kernels
//! alone ([`enabled`] says whether a fast path may run).
//!
//! The modules, none of which names another's callers:
//!
//! - [`isa`]: the levels and the CPU features each needs; [`simd`]: `multiversion!`, a loop
//!   compiled per level;
//! - [`math`]: exp, erf, tanh, sigmoid and the row kernels (softmax, layer normalization,
//!   broadcast arithmetic) the elementwise, softmax and normalization families call;
//! - [`post`]: work applied to an output part while it is in cache (bias, activation, a fused
//!   chain); [`chain`]: elementwise f32 chains over slices, the kernel of fused chains;
//! - [`gemm`]: the f32 GEMM (the `gemm` crate's SGEMM, split across threads, and a row kernel
//!   for narrow products); [`dots`]: products with few columns as dot products;
//! - [`geometry`]: the resolved window geometry and a 2-D convolution's shapes; [`conv2d`]: the
//!   f32 2-D convolution (im2col or direct, on [`gemm`]); [`direct`]: small convolutions of
//!   stride 1 without im2col or a GEMM;
//! - [`pool2d`]: f32 MaxPool and AveragePool over 2-D planes;
//! - [`winograd`]: 3×3 convolutions of stride 1 as sixteen products on [`gemm`] (Winograd's
//!   F(2×2, 3×3));
//! - [`lstm`]: the LSTM recurrence on [`gemm`];
//! - [`round`]: rounding and requantization, one definition for every quantized kernel;
//!   [`qbytes`]: elementwise kernels on 8-bit tensors (QuantizeLinear, the QLinear binary ops);
//!   [`qgemm`]: the integer GEMM; [`qconv`] and [`qmatmul`]: the 8-bit convolution and matrix
//!   product on it, with their packed weights.
//!
//! The element-typed entry points are the [`FastKernels`] trait.

pub mod chain;
pub mod conv2d;
pub mod direct;
pub mod dots;
pub mod gemm;
pub mod geometry;
pub mod isa;
pub mod lstm;
pub mod math;
pub mod pool2d;
pub mod post;
pub mod qbytes;
pub mod qconv;
pub mod qgemm;
pub mod qmatmul;
pub mod round;
pub(crate) mod simd;
pub mod winograd;

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

    /// MaxPool over 2-D planes without dilation ([`pool2d::max_pool`]); `None` for no fast
    /// kernel of this type or level.
    fn max_pool2d(_p: &pool2d::Pool2d<'_>, _x: &[Self]) -> Option<OpResult<Vec<Self>>> {
        None
    }

    /// AveragePool over 2-D planes without dilation, summed down the columns first
    /// ([`pool2d::avg_pool`]); `None` for no fast kernel of this type or level.
    fn avg_pool2d(
        _p: &pool2d::Pool2d<'_>,
        _x: &[Self],
        _count_include_pad: bool,
    ) -> Option<OpResult<Vec<Self>>> {
        None
    }
}

impl FastKernels for f32 {
    fn max_pool2d(p: &pool2d::Pool2d<'_>, x: &[f32]) -> Option<OpResult<Vec<f32>>> {
        enabled().then(|| pool2d::max_pool(p, x))
    }

    fn avg_pool2d(
        p: &pool2d::Pool2d<'_>,
        x: &[f32],
        count_include_pad: bool,
    ) -> Option<OpResult<Vec<f32>>> {
        enabled().then(|| pool2d::avg_pool(p, x, count_include_pad))
    }

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
impl FastKernels for half::f16 {}
impl FastKernels for half::bf16 {}
impl FastKernels for i8 {}
impl FastKernels for u8 {}
