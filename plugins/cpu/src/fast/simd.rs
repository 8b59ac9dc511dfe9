//! Hot f32 loops compiled twice: for the baseline x86-64 the binary targets, and for AVX2 with FMA,
//! chosen at run time by the row of [`super::ISAS`] this CPU runs. The loops are written plainly;
//! the compiler vectorizes them to the width the enabled features give (4 lanes baseline, 8 with
//! AVX2).

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

/// `multiversion! { pub fn name(args) -> R { body } }` defines `name` so that `body` runs
/// compiled with AVX2 and FMA enabled where the active row of [`super::ISAS`] is wide, and as
/// baseline code elsewhere.
/// Everything `body` calls that should benefit must be `#[inline(always)]`.
#[macro_export]
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident ($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        $(#[$m])* $vis fn $name($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            fn body($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn wide($($a: $t),*) $(-> $r)? {
                    body($($a),*)
                }
                if $crate::fast::isa().wide {
                    // SAFETY: the CPU has AVX2 and FMA, checked just above.
                    return unsafe { wide($($a),*) };
                }
            }
            body($($a),*)
        }
    };
}
