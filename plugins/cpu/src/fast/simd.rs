//! Hot f32 loops compiled three times: for the baseline x86-64 the binary targets, for AVX2 with
//! FMA, and for AVX-512, chosen at run time by the row of [`super::isa::ISAS`] this CPU runs. The loops
//! are written plainly; the compiler vectorizes them to the width the enabled features give (4
//! lanes baseline, 8 with AVX2, 16 with AVX-512), with the same operations in the same order.

/// `multiversion! { pub fn name(args) -> R { body } }` defines `name` so that `body` runs
/// compiled with AVX-512F/BW on the VNNI row of [`super::isa::ISAS`], with AVX2 and FMA on the other
/// wide rows, and as baseline code elsewhere.
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
                #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
                fn wide512($($a: $t),*) $(-> $r)? {
                    body($($a),*)
                }
                let isa = $crate::fast::isa::isa();
                // The macro's own dispatch, allowed where it is expanded (the operator library
                // denies unsafe code of its own).
                if isa.vnni {
                    // SAFETY: the VNNI level is chosen only on a CPU with AVX-512F/BW, AVX2
                    // and FMA.
                    #[allow(unsafe_code)]
                    return unsafe { wide512($($a),*) };
                }
                if isa.wide {
                    // SAFETY: the CPU has AVX2 and FMA, checked just above.
                    #[allow(unsafe_code)]
                    return unsafe { wide($($a),*) };
                }
            }
            body($($a),*)
        }
    };
}
