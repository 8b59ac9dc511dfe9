//! Elementwise kernels on 8-bit quantized tensors: each output byte is
//! `saturate(round(v) + zy)`, `v` an affine form of the input bytes computed in f32 from
//! ratios of the scales prepared once per call ([`Form`]).
//!
//! Both levels compute the same float32 operations in the same order (a product, then a sum;
//! no fused multiply-add) and round half to even, so the AVX2 kernel and the portable loop give
//! the same bytes. Against the composite `QuantizeLinear(op(DequantizeLinear(a), ...))`, which
//! divides by the output scale last, a result can differ by one step where the exact value falls
//! within a rounding of a half (ONNX Runtime's kernels round these differently again).
//!
//! [`quantize`] is QuantizeLinear's float32 to 8 bits, the general path's bytes exactly.

use std::mem::MaybeUninit;

/// What `v` is, for input bytes `a` (and `b`), in the kernel's unsigned domain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    /// `alpha · (a - za) + gamma`: one operand and a constant (QLinearAdd / QLinearMul with a
    /// broadcast scalar, a requantization).
    Affine { za: i32, alpha: f32, gamma: f32 },
    /// `ra · (a - za) + rb · (b - zb)`: QLinearAdd.
    Add { za: i32, ra: f32, zb: i32, rb: f32 },
    /// `r · ((a - za) · (b - zb))`: QLinearMul (the integer product is exact in f32).
    Mul { za: i32, zb: i32, r: f32 },
}

/// The largest ratio magnitude the kernels take: every `v` stays finite (at most
/// `2 · 255 · 2^100`, or `255² · 2^100`), so no NaN can arise from bytes.
const MAX_RATIO: f32 = 1.267_650_6e30; // 2^100

impl Form {
    /// Whether every ratio is finite and at most [`MAX_RATIO`] in magnitude, and the zero
    /// points are values of the element type (int8 when `signed`, else uint8): then [`run`] is
    /// defined for every input.
    pub fn usable(self, signed: bool) -> bool {
        let ok = |r: f32| r.is_finite() && r.abs() <= MAX_RATIO;
        let range = if signed { -128..=127 } else { 0..=255 };
        let byte = |z: i32| range.contains(&z);
        match self {
            Form::Affine { za, alpha, gamma } => byte(za) && ok(alpha) && ok(gamma),
            Form::Add { za, ra, zb, rb } => byte(za) && byte(zb) && ok(ra) && ok(rb),
            Form::Mul { za, zb, r } => byte(za) && byte(zb) && ok(r),
        }
    }

    #[inline(always)]
    fn value(self, a: u8, b: u8) -> f32 {
        match self {
            Form::Affine { za, alpha, gamma } => alpha * (i32::from(a) - za) as f32 + gamma,
            Form::Add { za, ra, zb, rb } => {
                ra * (i32::from(a) - za) as f32 + rb * (i32::from(b) - zb) as f32
            }
            Form::Mul { za, zb, r } => r * ((i32::from(a) - za) * (i32::from(b) - zb)) as f32,
        }
    }
}

/// `out[i] = saturate(round(v(a[i], b[i])) + zy)` for each element, every one written (`b` is
/// read only by the two-operand forms, and must then be as long as `a`). With `signed`, the
/// bytes are int8 bits and `za`, `zb`, `zy` int8 values; else uint8. `form` must be
/// [`Form::usable`], and `zy` a value of the element type.
pub fn run(form: Form, a: &[u8], b: &[u8], zy: i32, signed: bool, out: &mut [MaybeUninit<u8>]) {
    let two = !matches!(form, Form::Affine { .. });
    assert!(
        form.usable(signed)
            && Form::Affine {
                za: zy,
                alpha: 0.0,
                gamma: 0.0
            }
            .usable(signed),
        "{form:?} (zy {zy}) is outside the kernels' range"
    );
    assert_eq!(a.len(), out.len());
    if two {
        assert_eq!(a.len(), b.len());
    }
    // The unsigned domain: int8 bits plus 128 (`^ 0x80`), zero points likewise.
    let (form, zy, flip) = if signed {
        let f = match form {
            Form::Affine { za, alpha, gamma } => Form::Affine {
                za: za + 128,
                alpha,
                gamma,
            },
            Form::Add { za, ra, zb, rb } => Form::Add {
                za: za + 128,
                ra,
                zb: zb + 128,
                rb,
            },
            Form::Mul { za, zb, r } => Form::Mul {
                za: za + 128,
                zb: zb + 128,
                r,
            },
        };
        (f, zy + 128, 0x80u8)
    } else {
        (form, zy, 0)
    };
    let b = if two { b } else { a };
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::isa().wide {
        // SAFETY: the level is wide only on a CPU with AVX2 and FMA; `a`, `b` and `out` have
        // the same length (asserted).
        done = unsafe { x86::run(form, a, b, zy, flip, out) };
    }
    portable(form, &a[done..], &b[done..], zy, flip, &mut out[done..]);
}

/// The same bytes as the AVX2 kernel, one element at a time.
fn portable(form: Form, a: &[u8], b: &[u8], zy: i32, flip: u8, out: &mut [MaybeUninit<u8>]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        o.write(to_byte(form.value(x ^ flip, y ^ flip), zy) ^ flip);
    }
}

/// `saturate(round(v) + zy)` in 0..=255, rounding half to even; NaN gives 0 (the order of
/// `max_ps` and `min_ps`).
#[inline(always)]
fn to_byte(v: f32, zy: i32) -> u8 {
    let (lo, hi) = ((-zy) as f32, (255 - zy) as f32);
    let v = if v > lo { v } else { lo };
    let v = if v < hi { v } else { hi };
    (crate::ops::quant::round_even_f32(v) as i32 + zy) as u8
}

/// QuantizeLinear of float32 to 8 bits with one scale: `saturate(round(x / s) + z)`, rounding
/// half to even, NaN giving `z`, every element of `out` written: the general path's bytes.
/// With `signed`, int8 bits and an int8 `z`; else uint8.
pub fn quantize(x: &[f32], s: f32, z: i32, signed: bool, out: &mut [MaybeUninit<u8>]) {
    assert_eq!(x.len(), out.len());
    let (z, flip) = if signed { (z + 128, 0x80u8) } else { (z, 0) };
    assert!((0..=255).contains(&z), "zero point {z} is outside the type");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::isa().wide {
        // SAFETY: the level is wide only on a CPU with AVX2; `x` and `out` have the same
        // length (asserted).
        done = unsafe { x86::quantize(x, s, z, flip, out) };
    }
    for (o, &v) in out[done..].iter_mut().zip(&x[done..]) {
        let v = v / s;
        let v = if v.is_nan() { 0.0 } else { v };
        o.write(to_byte(v, z) ^ flip);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Form;
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Four vectors of 8 i32 lanes (elements 0..8, 8..16, 16..24, 24..32) in 0..=255, as 32
    /// bytes in order, each XORed with `flip`, stored at `out`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn store_bytes(r: [__m256i; 4], flip: __m256i, out: &mut [MaybeUninit<u8>]) {
        let out = &mut out[..32];
        let w = _mm256_packs_epi32(r[0], r[1]);
        let x = _mm256_packs_epi32(r[2], r[3]);
        // The packs interleave 128-bit lanes: put the 4-byte groups back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w, x), order);
        // SAFETY: `out` holds 32 bytes.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_xor_si256(bytes, flip)) };
    }

    /// The whole 32-element blocks of [`super::quantize`]; returns how many it wrote.
    ///
    /// # Safety
    /// The CPU has AVX2; `x` and `out` have the same length.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize(
        x: &[f32],
        s: f32,
        z: i32,
        flip: u8,
        out: &mut [MaybeUninit<u8>],
    ) -> usize {
        let n = x.len() / 32 * 32;
        let (lo, hi) = (
            _mm256_set1_ps((-z) as f32),
            _mm256_set1_ps((255 - z) as f32),
        );
        let (sv, zv) = (_mm256_set1_ps(s), _mm256_set1_epi32(z));
        let fl = _mm256_set1_epi8(flip as i8);
        let mut i = 0;
        while i < n {
            let mut r = [_mm256_setzero_si256(); 4];
            for (k, r) in r.iter_mut().enumerate() {
                // SAFETY: the block's 32 floats lie inside `x`.
                let v = unsafe { _mm256_loadu_ps(x[i + 8 * k..][..8].as_ptr()) };
                let v = _mm256_div_ps(v, sv);
                // NaN to 0, then as `to_byte`.
                let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
                let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
                *r = _mm256_add_epi32(_mm256_cvtps_epi32(v), zv);
            }
            store_bytes(r, fl, &mut out[i..]);
            i += 32;
        }
        n
    }

    /// The whole 32-byte blocks of `a`; returns how many elements it wrote.
    ///
    /// # Safety
    /// The CPU has AVX2; `a`, `b` and `out` have the same length.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn run(
        form: Form,
        a: &[u8],
        b: &[u8],
        zy: i32,
        flip: u8,
        out: &mut [MaybeUninit<u8>],
    ) -> usize {
        let n = a.len() / 32 * 32;
        let (lo, hi) = (
            _mm256_set1_ps((-zy) as f32),
            _mm256_set1_ps((255 - zy) as f32),
        );
        let zyv = _mm256_set1_epi32(zy);
        let fl = _mm_set1_epi8(flip as i8);
        let (za, zb, p, q) = match form {
            Form::Affine { za, alpha, gamma } => (za, 0, alpha, gamma),
            Form::Add { za, ra, zb, rb } => (za, zb, ra, rb),
            Form::Mul { za, zb, r } => (za, zb, r, 0.0),
        };
        let (zav, zbv) = (_mm256_set1_epi32(za), _mm256_set1_epi32(zb));
        let (pv, qv) = (_mm256_set1_ps(p), _mm256_set1_ps(q));
        // Eight bytes of `s` from `at` minus `z`, as i32 lanes (a macro, not a closure, so
        // that it is compiled with this function's features).
        macro_rules! widen {
            ($s:expr, $at:expr, $z:expr) => {{
                // SAFETY: the slice holds the 8 bytes read.
                let x = unsafe { _mm_loadl_epi64($s[$at..][..8].as_ptr().cast()) };
                _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_xor_si128(x, fl)), $z)
            }};
        }
        let mut i = 0;
        while i < n {
            let mut r = [_mm256_setzero_si256(); 4];
            for (k, r) in r.iter_mut().enumerate() {
                let at = i + 8 * k;
                let xa = widen!(a, at, zav);
                let v = match form {
                    Form::Affine { .. } => {
                        _mm256_add_ps(_mm256_mul_ps(pv, _mm256_cvtepi32_ps(xa)), qv)
                    }
                    Form::Add { .. } => {
                        let xb = widen!(b, at, zbv);
                        _mm256_add_ps(
                            _mm256_mul_ps(pv, _mm256_cvtepi32_ps(xa)),
                            _mm256_mul_ps(qv, _mm256_cvtepi32_ps(xb)),
                        )
                    }
                    Form::Mul { .. } => {
                        let xb = widen!(b, at, zbv);
                        _mm256_mul_ps(pv, _mm256_cvtepi32_ps(_mm256_mullo_epi32(xa, xb)))
                    }
                };
                let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
                // Rounds half to even (the default rounding mode), then the zero point.
                *r = _mm256_add_epi32(_mm256_cvtps_epi32(v), zyv);
            }
            store_bytes(r, _mm256_set1_epi8(flip as i8), &mut out[i..]);
            i += 32;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::{ISAS, with_isa};

    /// What `f` writes into `n` fresh slots.
    fn written(n: usize, f: impl FnOnce(&mut [MaybeUninit<u8>])) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        f(&mut v.spare_capacity_mut()[..n]);
        // SAFETY: the kernels write every slot they are handed.
        unsafe { v.set_len(n) };
        v
    }

    /// The exact value, rounded half to even, for the forms' definitions in f64.
    fn exact(form: Form, a: u8, b: u8, zy: i32) -> i32 {
        let v = match form {
            Form::Affine { za, alpha, gamma } => {
                f64::from(alpha) * f64::from(i32::from(a) - za) + f64::from(gamma)
            }
            Form::Add { za, ra, zb, rb } => {
                f64::from(ra) * f64::from(i32::from(a) - za)
                    + f64::from(rb) * f64::from(i32::from(b) - zb)
            }
            Form::Mul { za, zb, r } => {
                f64::from(r) * f64::from((i32::from(a) - za) * (i32::from(b) - zb))
            }
        };
        (crate::ops::quant::round_even_f64(v) as i64 + i64::from(zy)).clamp(0, 255) as i32
    }

    /// Every level gives the same bytes, for every pair of byte values (and tails shorter than
    /// a block), within one step of the exact value, and saturated at both ends.
    #[test]
    fn every_level_gives_the_same_bytes_within_a_step_of_the_exact_value() {
        let forms = [
            Form::Affine {
                za: 3,
                alpha: 0.731,
                gamma: 12.25,
            },
            Form::Affine {
                za: 128,
                alpha: 1.0,
                gamma: 0.0,
            },
            Form::Add {
                za: 120,
                ra: 0.61,
                zb: 7,
                rb: 1.37,
            },
            Form::Add {
                za: 0,
                ra: 0.5,
                zb: 0,
                rb: 0.5,
            },
            Form::Mul {
                za: 128,
                zb: 0,
                r: 0.003_21,
            },
            Form::Mul {
                za: 10,
                zb: 250,
                r: -0.07,
            },
        ];
        // Every (a, b) pair, plus 5 bytes so the last block is partial.
        let n = 256 * 256 + 5;
        let a: Vec<u8> = (0..n).map(|i| (i % 256) as u8).collect();
        let b: Vec<u8> = (0..n).map(|i| ((i / 256) % 256) as u8).collect();
        let shift = |f: Form| match f {
            Form::Affine { za, alpha, gamma } => Form::Affine {
                za: za - 128,
                alpha,
                gamma,
            },
            Form::Add { za, ra, zb, rb } => Form::Add {
                za: za - 128,
                ra,
                zb: zb - 128,
                rb,
            },
            Form::Mul { za, zb, r } => Form::Mul {
                za: za - 128,
                zb: zb - 128,
                r,
            },
        };
        let flipped = |v: &[u8]| v.iter().map(|&x| x ^ 0x80).collect::<Vec<u8>>();
        let (sa, sb) = (flipped(&a), flipped(&b));
        for form in forms {
            for zy in [0, 77, 255] {
                let mut seen: Option<Vec<u8>> = None;
                for isa in ISAS.iter().filter(|i| i.fast) {
                    for signed in [false, true] {
                        let ran = with_isa(isa, || {
                            if signed {
                                flipped(&written(n, |o| {
                                    run(shift(form), &sa, &sb, zy - 128, true, o)
                                }))
                            } else {
                                written(n, |o| run(form, &a, &b, zy, false, o))
                            }
                        });
                        let Some(out) = ran else {
                            println!("qbytes: {} skipped (this CPU lacks it)", isa.name);
                            continue;
                        };
                        for i in 0..n {
                            let (got, want) = (i32::from(out[i]), exact(form, a[i], b[i], zy));
                            assert!(
                                (got - want).abs() <= 1,
                                "{} {form:?} zy {zy} signed {signed}: a {} b {} gave {got}, \
                                 exactly {want}",
                                isa.name,
                                a[i],
                                b[i]
                            );
                        }
                        if let Some(s) = &seen {
                            assert!(s == &out, "{}: {form:?} differs", isa.name);
                        }
                        seen = Some(out);
                    }
                }
            }
        }
    }

    /// QuantizeLinear's bytes are the general path's at every level, for values around every
    /// rounding boundary, past both ends, infinities and NaN.
    #[test]
    fn quantize_gives_the_general_paths_bytes() {
        use crate::ops::quant::quantize_one;
        let mut x: Vec<f32> = (-700..700).map(|i| i as f32 * 0.25).collect();
        x.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            1e30,
            -1e30,
            0.1,
            3.7,
        ]);
        for s in [0.5f32, 0.37, 1.0, 3.0] {
            for (z, signed) in [
                (0, false),
                (128, false),
                (255, false),
                (-128, true),
                (5, true),
            ] {
                let (lo, hi) = if signed {
                    (-128.0, 127.0)
                } else {
                    (0.0, 255.0)
                };
                let want: Vec<u8> = x
                    .iter()
                    .map(|&v| quantize_one(v, s, z as f32, lo, hi) as i32 as u8)
                    .collect();
                for isa in ISAS.iter().filter(|i| i.fast) {
                    let got = with_isa(isa, || written(x.len(), |o| quantize(&x, s, z, signed, o)));
                    if let Some(got) = got {
                        for i in 0..x.len() {
                            assert_eq!(got[i], want[i], "{}: {} / {s} + {z}", isa.name, x[i]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ratios_that_could_overflow_are_refused() {
        assert!(
            !Form::Mul {
                za: 0,
                zb: 0,
                r: f32::INFINITY
            }
            .usable(false)
        );
        assert!(
            !Form::Add {
                za: 0,
                ra: 1e31,
                zb: 0,
                rb: 1.0
            }
            .usable(false)
        );
        assert!(
            !Form::Affine {
                za: 200,
                alpha: 1.0,
                gamma: 0.0
            }
            .usable(true)
        );
        assert!(
            !Form::Affine {
                za: -1,
                alpha: 1.0,
                gamma: 0.0
            }
            .usable(false)
        );
        assert!(
            Form::Affine {
                za: -128,
                alpha: -1e30,
                gamma: 1e30
            }
            .usable(true)
        );
    }
}
