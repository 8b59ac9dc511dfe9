//! The kernel levels: which instruction set the fast kernels run with, or none. Chosen once
//! per process from [`ISAS`] (the best level the CPU has, or the one [`ENV_KERNELS`] names),
//! and forced per thread by tests ([`with_isa`]). Names no other module.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The environment variable that picks the level of [`ISAS`] the CPU EP runs:
/// `EPX_CPU_KERNELS=avx512-vnni`, `avx-vnni`, `avx2`, `portable` or `reference` (the reference kernels alone: no fast
/// kernels, no fused chains). Unset, the best level the CPU has. Read once per process; a level
/// that is unknown, or needs features this CPU lacks, makes creating a CPU EP fail with the
/// reason ([`configured_isa`]).
pub const ENV_KERNELS: &str = "EPX_CPU_KERNELS";

/// The older spelling of `EPX_CPU_KERNELS=portable`: `EPX_CPU_SIMD=baseline`.
pub const ENV_SIMD: &str = "EPX_CPU_SIMD";

/// One level of kernels: the instruction set the fast kernels are compiled for, or none.
#[derive(Debug)]
pub struct Isa {
    /// The value of [`ENV_KERNELS`] that picks it.
    pub key: &'static str,
    /// For messages and tests.
    pub name: &'static str,
    /// Whether this CPU has the features.
    pub available: fn() -> bool,
    /// The fast kernels run (false: the reference kernels alone).
    pub fast: bool,
    /// The hot loops run their AVX2+FMA copies.
    pub wide: bool,
    /// The integer GEMM runs its AVX-512 VNNI kernel ([`qgemm`](super::qgemm)), and the
    /// multiversioned loops their AVX-512 copies.
    pub vnni: bool,
    /// The integer GEMM runs its AVX-VNNI kernel (256-bit `vpdpbusd`).
    pub avx_vnni: bool,
    /// Unsigned activations by signed weights are summed in pairs of products saturated to
    /// i16, as ONNX Runtime's kernels for the CPUs of this level sum them (MLAS's AVX2 and
    /// AVX-512BW u8·s8 kernels: `vpmaddubsw`); every other level sums exactly, as ONNX
    /// Runtime's do there (VNNI's `vpdpbusd`, the SSE kernels' 16-bit widening). Which ops
    /// follow it is [`super::qgemm::Sums`]'s to say.
    pub saturating_pairs: bool,
}

/// The levels, best first; the last two are always available. Each models the CPUs ONNX
/// Runtime's kernels are chosen for: AVX-512 with VNNI; AVX2 with AVX-VNNI (and no AVX-512:
/// Alder Lake and later client cores); AVX2 without VNNI (and AVX-512 without VNNI, whose
/// 8-bit kernels sum as AVX2's do); baseline x86-64.
pub static ISAS: [Isa; 5] = [
    Isa {
        key: "avx512-vnni",
        name: "x86-64 AVX-512 VNNI (+AVX2+FMA)",
        available: cpu_has_avx512_vnni,
        fast: true,
        wide: true,
        vnni: true,
        avx_vnni: false,
        saturating_pairs: false,
    },
    Isa {
        key: "avx-vnni",
        name: "x86-64 AVX2+FMA with AVX-VNNI",
        available: cpu_has_avx_vnni,
        fast: true,
        wide: true,
        vnni: false,
        avx_vnni: true,
        saturating_pairs: false,
    },
    Isa {
        key: "avx2",
        name: "x86-64 AVX2+FMA",
        available: cpu_has_avx2_fma,
        fast: true,
        wide: true,
        vnni: false,
        avx_vnni: false,
        saturating_pairs: true,
    },
    Isa {
        key: "portable",
        name: "portable (baseline x86-64)",
        available: || true,
        fast: true,
        wide: false,
        vnni: false,
        avx_vnni: false,
        saturating_pairs: false,
    },
    Isa {
        key: "reference",
        name: "reference kernels only",
        available: || true,
        fast: false,
        wide: false,
        vnni: false,
        avx_vnni: false,
        saturating_pairs: false,
    },
];

thread_local! {
    /// A row forced on this thread by [`with_isa`].
    static FORCED: Cell<Option<&'static Isa>> = const { Cell::new(None) };
}

/// The level the environment asks for: [`ENV_KERNELS`], else [`ENV_SIMD`], else the best one
/// this CPU has. `Err` says why an asked-for level cannot run.
pub fn configured_isa() -> Result<&'static Isa, String> {
    let asked = match std::env::var(ENV_KERNELS) {
        Ok(v) if !v.is_empty() => v,
        _ if std::env::var(ENV_SIMD).as_deref() == Ok("baseline") => "portable".to_string(),
        _ => return Ok(best_isa()),
    };
    let keys: Vec<&str> = ISAS.iter().map(|i| i.key).collect();
    let isa = ISAS.iter().find(|i| i.key == asked).ok_or_else(|| {
        format!(
            "{ENV_KERNELS}={asked} is not a kernel level; the levels are {}",
            keys.join(", ")
        )
    })?;
    if !(isa.available)() {
        return Err(format!(
            "{ENV_KERNELS}={asked} asks for {}, which this CPU does not have; the best level \
             it runs is {}",
            isa.name,
            best_isa().key
        ));
    }
    Ok(isa)
}

/// The best level this CPU has (the last row is always available).
fn best_isa() -> &'static Isa {
    ISAS.iter()
        .find(|i| (i.available)())
        .unwrap_or(&ISAS[ISAS.len() - 1])
}

/// The level this process runs ([`configured_isa`]; the best one when that is an error, which
/// creating a CPU EP reports first).
pub fn process_isa() -> &'static Isa {
    static CHOSEN: OnceLock<&'static Isa> = OnceLock::new();
    CHOSEN.get_or_init(|| configured_isa().unwrap_or_else(|_| best_isa()))
}

/// How many threads are inside [`with_isa`]: while none is, [`isa`] skips the thread-local.
static FORCING: AtomicUsize = AtomicUsize::new(0);

/// The level the calling thread runs ([`process_isa`] unless [`with_isa`] forced one).
#[inline]
pub fn isa() -> &'static Isa {
    if FORCING.load(Ordering::Relaxed) == 0 {
        return process_isa();
    }
    FORCED.with(Cell::get).unwrap_or_else(process_isa)
}

/// Whether the fast kernels run on this thread (every level but `reference`).
#[inline]
pub fn enabled() -> bool {
    isa().fast
}

/// Runs `f` with the kernels of this thread on `isa`, for tests that check every level on one
/// machine (a kernel run outside an intra-op pool does all its work on the calling thread).
/// `None` (and `f` is not run) when the CPU lacks the level's features.
pub fn with_isa<R>(isa: &'static Isa, f: impl FnOnce() -> R) -> Option<R> {
    if !(isa.available)() {
        return None;
    }
    struct Restore(Option<&'static Isa>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
            FORCING.fetch_sub(1, Ordering::Relaxed);
        }
    }
    FORCING.fetch_add(1, Ordering::Relaxed);
    let _restore = Restore(FORCED.with(|c| c.replace(Some(isa))));
    Some(f())
}

/// Whether the CPU itself has AVX2 and FMA.
pub(crate) fn cpu_has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-VNNI (the VEX-encoded `vpdpbusd`), besides AVX2 and FMA, and is
/// not one whose AVX-512 lacks VNNI: ONNX Runtime runs its AVX-512BW 8-bit kernels there,
/// which sum as the AVX2 ones do.
pub(crate) fn cpu_has_avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx512_core =
            has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl");
        cpu_has_avx2_fma() && has!("avxvnni") && (!avx512_core || has!("avx512vnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512F/BW with VNNI, besides AVX2 and FMA.
pub(crate) fn cpu_has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        cpu_has_avx2_fma()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
