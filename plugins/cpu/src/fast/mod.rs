//! The fast kernels: f32 paths of the same ops the reference kernels in [`crate::ops`] define,
//! and the one table that picks the instruction set they run with.
//!
//! Each reference kernel is the definition: generic over element types, any rank, written for
//! clarity. A fast kernel here covers the common case of one op (the 2-D f32 convolution, the
//! f32 softmax, erf, layer normalization and broadcast arithmetic rows) and is tested against the
//! reference. Which instruction set the hot loops use is chosen once per process from [`ISAS`]:
//! the first row whose features the CPU has (`EPX_CPU_SIMD=baseline` forces the last row). The
//! ops reach fast kernels only through [`FastKernels`] (by element type) and the functions of
//! [`conv2d`] and [`math`].

pub mod conv2d;
pub mod math;
pub(crate) mod simd;

use std::cell::Cell;
use std::sync::OnceLock;

use crate::kernel::PostOp;

/// The environment variable that forces the baseline row of [`ISAS`] even where the CPU has
/// more: `EPX_CPU_SIMD=baseline`. Any other value, or none, uses what the CPU has. Read once per
/// process; tests run both rows on one machine with it, or with [`with_isa`].
pub const ENV_SIMD: &str = "EPX_CPU_SIMD";

/// One instruction-set level the fast kernels are compiled for.
#[derive(Debug)]
pub struct Isa {
    /// For messages and tests.
    pub name: &'static str,
    /// Whether this CPU has the features.
    pub available: fn() -> bool,
    /// The hot loops run their AVX2+FMA copies.
    pub wide: bool,
}

/// The instruction-set levels, best first; the last is always available.
pub static ISAS: [Isa; 2] = [
    Isa {
        name: "x86-64 AVX2+FMA",
        available: simd::cpu_has_avx2_fma,
        wide: true,
    },
    Isa {
        name: "baseline",
        available: || true,
        wide: false,
    },
];

thread_local! {
    /// A row forced on this thread by [`with_isa`].
    static FORCED: Cell<Option<&'static Isa>> = const { Cell::new(None) };
}

/// The row this process runs: the first available one, or the baseline when [`ENV_SIMD`] says
/// so.
pub fn process_isa() -> &'static Isa {
    static CHOSEN: OnceLock<&'static Isa> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let baseline = &ISAS[ISAS.len() - 1];
        if std::env::var(ENV_SIMD).as_deref() == Ok("baseline") {
            return baseline;
        }
        ISAS.iter().find(|i| (i.available)()).unwrap_or(baseline)
    })
}

/// The row the calling thread runs ([`process_isa`] unless [`with_isa`] forced one).
#[inline]
pub fn isa() -> &'static Isa {
    FORCED.with(Cell::get).unwrap_or_else(process_isa)
}

/// Runs `f` with the hot loops of this thread on `isa`, for tests that check every row on one
/// machine (a kernel run outside an intra-op pool does all its work on the calling thread).
/// `None` (and `f` is not run) when the CPU lacks the row's features.
pub fn with_isa<R>(isa: &'static Isa, f: impl FnOnce() -> R) -> Option<R> {
    if !(isa.available)() {
        return None;
    }
    struct Restore(Option<&'static Isa>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FORCED.with(|c| c.replace(Some(isa))));
    Some(f())
}

/// The fast kernels an element type has; the reference kernels run where it has none.
pub trait FastKernels: Sized {
    /// The 2-D convolution of [`conv2d::Conv2d`], with whether it applied `post`.
    fn conv2d(
        _conv: &conv2d::Conv2d<'_>,
        _x: &[Self],
        _w: &[Self],
        _b: Option<&[Self]>,
        _post: Option<&mut dyn PostOp>,
    ) -> Option<(Vec<Self>, bool)> {
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
    ) -> Option<(Vec<f32>, bool)> {
        Some(conv.run_post(x, w, b, post))
    }
}

impl FastKernels for f64 {}
