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
//! [`requantize`] turns the exact sums of the integer convolutions and products into bytes
//! with one float32 scale, as ONNX Runtime's kernels do.

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
    if super::isa::isa().vnni {
        // SAFETY: the level is VNNI only on a CPU with AVX-512F and BW; `a`, `b` and `out`
        // have the same length (asserted).
        done = unsafe { x86::run512(form, a, b, zy, flip, out) };
    } else if super::isa::isa().wide {
        // SAFETY: the level is wide only on a CPU with AVX2 and FMA; lengths as above.
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
    (crate::fast::round::round_even_f32(v) as i32 + zy) as u8
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
    if super::isa::isa().wide {
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

/// Accumulators [`requantize`] reads: exact integer sums, as i32 or as integer-valued f32.
pub trait Acc: Copy {
    fn value(self) -> f32;
    /// The sum itself.
    fn int(self) -> i32;
    /// [`requantize`] on the whole 32-element blocks at the AVX2 level, a block with a value
    /// near a tie rewritten by `redo`; returns how many it wrote.
    ///
    /// # Safety
    /// The CPU has AVX2; `acc` and `out` have the same length.
    #[cfg(target_arch = "x86_64")]
    unsafe fn blocks(
        acc: &[Self],
        bs: (f32, f32),
        zy: i32,
        flip: u8,
        out: &mut [u8],
        redo: &dyn Fn(&[Self], &mut [u8]),
    ) -> usize;
}

impl Acc for i32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn int(self) -> i32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn blocks(
        acc: &[i32],
        bs: (f32, f32),
        zy: i32,
        flip: u8,
        out: &mut [u8],
        redo: &dyn Fn(&[i32], &mut [u8]),
    ) -> usize {
        // SAFETY: the caller's contract; the level is VNNI only on a CPU with AVX-512F and BW.
        unsafe {
            if super::isa::isa().vnni {
                x86::requantize512_i32(acc, bs, zy, flip, out, redo)
            } else {
                x86::requantize_i32(acc, bs, zy, flip, out, redo)
            }
        }
    }
}

impl Acc for f32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
    #[inline(always)]
    fn int(self) -> i32 {
        self as i32
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn blocks(
        acc: &[f32],
        bs: (f32, f32),
        zy: i32,
        flip: u8,
        out: &mut [u8],
        redo: &dyn Fn(&[f32], &mut [u8]),
    ) -> usize {
        // SAFETY: the caller's contract; the level is VNNI only on a CPU with AVX-512F and BW.
        unsafe {
            if super::isa::isa().vnni {
                x86::requantize512_f32(acc, bs, zy, flip, out, redo)
            } else {
                x86::requantize_f32(acc, bs, zy, flip, out, redo)
            }
        }
    }
}

/// `out[i] = saturate(round((acc[i] + bias) · factor + zy))` rounded half to even, as the
/// general path computes it in f64, for uint8, or int8 bits with an int8 `zy` when `signed`;
/// `None` (nothing written) when the factor or the bias is not finite in f32.
///
/// The product is taken in float32 (eight lanes), whose result is within [`TIE_BAND`] of the
/// f64 one wherever it matters (`|v| ≤ 1024`); a value that close to a half between two
/// integers is recomputed in f64, so the bytes are the general path's exactly.
pub fn requantize<A: Acc>(
    acc: &[A],
    bias: f64,
    factor: f64,
    zy: i32,
    signed: bool,
    out: &mut [u8],
) -> Option<()> {
    Requant::new(bias, factor, zy, signed)?.run(acc, out);
    Some(())
}

/// The parameters of [`requantize`] for one output channel, checked and converted once.
#[derive(Clone, Copy, Debug)]
pub struct Requant {
    b32: f32,
    f32_: f32,
    exact: Exact,
    /// The zero point in the unsigned domain, and the bit flip back (int8: 0x80).
    zy: i32,
    flip: u8,
}

impl Requant {
    /// `None` when the factor or the bias is not finite in f32, or `zy` is not a value of
    /// the type.
    pub fn new(bias: f64, factor: f64, zy: i32, signed: bool) -> Option<Requant> {
        let (zy, flip) = if signed { (zy + 128, 0x80u8) } else { (zy, 0) };
        let (b32, f32_) = (bias as f32, factor as f32);
        if !b32.is_finite() || !f32_.is_finite() || !(0..=255).contains(&zy) {
            return None;
        }
        Some(Requant {
            b32,
            f32_,
            exact: Exact {
                bias,
                factor,
                zy: f64::from(zy),
            },
            zy,
            flip,
        })
    }

    /// Each element in float32, unless it comes near a tie.
    fn each<A: Acc>(&self, acc: &[A], out: &mut [u8]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            let v = (a.value() + self.b32) * self.f32_;
            *o = if near_tie(v) {
                self.exact.byte(a.value())
            } else {
                to_byte(v, self.zy)
            } ^ self.flip;
        }
    }

    /// [`requantize`] of `acc` into `out` (the same length).
    pub fn run<A: Acc>(&self, acc: &[A], out: &mut [u8]) {
        assert_eq!(acc.len(), out.len());
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if super::isa::isa().wide {
            let redo = |acc: &[A], out: &mut [u8]| self.each(acc, out);
            // SAFETY: the level is wide only on a CPU with AVX2; same lengths (asserted).
            done = unsafe { A::blocks(acc, (self.b32, self.f32_), self.zy, self.flip, out, &redo) };
        }
        self.each(&acc[done..], &mut out[done..]);
    }
}

/// How far a float32 requantized value can lie from the f64 one where rounding matters: three
/// roundings of a value up to 1024 in magnitude (`3 · 2^-24 · 2^10 < 2^-12`). Past 1024 the
/// byte saturates either way.
pub const TIE_BAND: f32 = 1.0 / 4096.0;

/// Whether `v` lies within [`TIE_BAND`] of a half between two integers.
#[inline(always)]
fn near_tie(v: f32) -> bool {
    let d = (v - crate::fast::round::round_even_f32(v)).abs();
    d > 0.5 - TIE_BAND && v.abs() <= 1024.0
}

/// The general path's f64 requantization, for the values near a tie.
#[derive(Clone, Copy, Debug)]
struct Exact {
    bias: f64,
    factor: f64,
    zy: f64,
}

impl Exact {
    #[inline(never)]
    fn byte(&self, a: f32) -> u8 {
        let v = (f64::from(a) + self.bias) * self.factor + self.zy;
        crate::fast::round::round_even_f64(v).clamp(0.0, 255.0) as u8
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

    /// The AVX2 blocks of [`super::requantize`] for accumulators loaded 8 at a time by `$load`.
    macro_rules! requantize_blocks {
        ($name:ident, $t:ty, $load:expr) => {
            /// # Safety
            /// The CPU has AVX2; `acc` and `out` have the same length.
            #[target_feature(enable = "avx2")]
            pub(super) unsafe fn $name(
                acc: &[$t],
                (bias, scale): (f32, f32),
                zy: i32,
                flip: u8,
                out: &mut [u8],
                redo: &dyn Fn(&[$t], &mut [u8]),
            ) -> usize {
                let n = acc.len() / 32 * 32;
                let (lo, hi) = (
                    _mm256_set1_ps((-zy) as f32),
                    _mm256_set1_ps((255 - zy) as f32),
                );
                let (bv, sv, zv) = (
                    _mm256_set1_ps(bias),
                    _mm256_set1_ps(scale),
                    _mm256_set1_epi32(zy),
                );
                let fl = _mm256_set1_epi8(flip as i8);
                let band = _mm256_set1_ps(0.5 - super::TIE_BAND);
                let (big, sign) = (_mm256_set1_ps(1024.0), _mm256_set1_ps(-0.0));
                let mut i = 0;
                while i < n {
                    let mut r = [_mm256_setzero_si256(); 4];
                    let mut near = _mm256_setzero_ps();
                    for (k, r) in r.iter_mut().enumerate() {
                        let src = &acc[i + 8 * k..][..8];
                        // SAFETY: `src` holds the 8 accumulators loaded.
                        let a: __m256 = unsafe { $load(src.as_ptr()) };
                        let v = _mm256_mul_ps(_mm256_add_ps(a, bv), sv);
                        // |v - round(v)| past the band, for |v| up to 1024 (as `near_tie`).
                        let round =
                            _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                        let d = _mm256_andnot_ps(sign, _mm256_sub_ps(v, round));
                        let small = _mm256_cmp_ps::<_CMP_LE_OQ>(_mm256_andnot_ps(sign, v), big);
                        let tie = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(d, band), small);
                        near = _mm256_or_ps(near, tie);
                        let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
                        *r = _mm256_add_epi32(_mm256_cvtps_epi32(v), zv);
                    }
                    // SAFETY: `out` has the block's 32 slots; a `u8` slot is a `MaybeUninit<u8>`.
                    let dst = unsafe {
                        &mut *(&mut out[i..i + 32] as *mut [u8] as *mut [MaybeUninit<u8>])
                    };
                    store_bytes(r, fl, dst);
                    if _mm256_movemask_ps(near) != 0 {
                        redo(&acc[i..i + 32], &mut out[i..i + 32]);
                    }
                    i += 32;
                }
                n
            }
        };
    }

    requantize_blocks!(requantize_i32, i32, |p: *const i32| _mm256_cvtepi32_ps(
        _mm256_loadu_si256(p.cast())
    ));
    requantize_blocks!(requantize_f32, f32, |p: *const f32| _mm256_loadu_ps(p));

    /// The AVX-512 blocks of [`super::requantize`] (16 accumulators, loaded by `$load`): the
    /// same float32 operations and tie test as the AVX2 blocks, narrowed by `vpmovdb`.
    macro_rules! requantize_blocks512 {
        ($name:ident, $t:ty, $load:expr) => {
            /// # Safety
            /// The CPU has AVX-512F and AVX-512BW; `acc` and `out` have the same length.
            #[target_feature(enable = "avx512f,avx512bw")]
            pub(super) unsafe fn $name(
                acc: &[$t],
                (bias, scale): (f32, f32),
                zy: i32,
                flip: u8,
                out: &mut [u8],
                redo: &dyn Fn(&[$t], &mut [u8]),
            ) -> usize {
                let n = acc.len() / 16 * 16;
                let (lo, hi) = (
                    _mm512_set1_ps((-zy) as f32),
                    _mm512_set1_ps((255 - zy) as f32),
                );
                let (bv, sv, zv) = (
                    _mm512_set1_ps(bias),
                    _mm512_set1_ps(scale),
                    _mm512_set1_epi32(zy),
                );
                let fl = _mm_set1_epi8(flip as i8);
                let band = _mm512_set1_ps(0.5 - super::TIE_BAND);
                let big = _mm512_set1_ps(1024.0);
                for i in (0..n).step_by(16) {
                    let src: &[$t; 16] = acc[i..i + 16].try_into().expect("a block");
                    // SAFETY: `src` holds the 16 accumulators loaded.
                    let a: __m512 = unsafe { $load(src.as_ptr()) };
                    let v = _mm512_mul_ps(_mm512_add_ps(a, bv), sv);
                    // |v - round(v)| past the band, for |v| up to 1024 (as `near_tie`).
                    let round = _mm512_roundscale_ps::<
                        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                    >(v);
                    let d = _mm512_abs_ps(_mm512_sub_ps(v, round));
                    let small = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(v), big);
                    let tie = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(small, d, band);
                    let v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                    let r = _mm512_add_epi32(_mm512_cvtps_epi32(v), zv);
                    let bytes = _mm_xor_si128(_mm512_cvtepi32_epi8(r), fl);
                    let dst = &mut out[i..i + 16];
                    // SAFETY: `dst` has the block's 16 slots.
                    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), bytes) };
                    if tie != 0 {
                        redo(&acc[i..i + 16], dst);
                    }
                }
                n
            }
        };
    }

    requantize_blocks512!(requantize512_i32, i32, |p: *const i32| _mm512_cvtepi32_ps(
        _mm512_loadu_si512(p.cast())
    ));
    requantize_blocks512!(requantize512_f32, f32, |p: *const f32| _mm512_loadu_ps(p));

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
            // The block's bytes, sliced once: the loads below need no bounds checks.
            let (ab, bb): (&[u8; 32], &[u8; 32]) = (
                a[i..i + 32].try_into().expect("a block"),
                b[i..i + 32].try_into().expect("a block"),
            );
            let mut r = [_mm256_setzero_si256(); 4];
            for (k, r) in r.iter_mut().enumerate() {
                let at = 8 * k;
                let xa = widen!(ab, at, zav);
                let v = match form {
                    Form::Affine { .. } => {
                        _mm256_add_ps(_mm256_mul_ps(pv, _mm256_cvtepi32_ps(xa)), qv)
                    }
                    Form::Add { .. } => {
                        let xb = widen!(bb, at, zbv);
                        _mm256_add_ps(
                            _mm256_mul_ps(pv, _mm256_cvtepi32_ps(xa)),
                            _mm256_mul_ps(qv, _mm256_cvtepi32_ps(xb)),
                        )
                    }
                    Form::Mul { .. } => {
                        let xb = widen!(bb, at, zbv);
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

    /// [`run`] at the AVX-512 level: 16 elements a vector, the same float32 operations in the
    /// same order as the AVX2 kernel (so the same bytes), narrowed by `vpmovdb` instead of
    /// packs and a permute. Returns how many elements it wrote (the whole 16-byte blocks).
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX-512BW; `a`, `b` and `out` have the same length.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn run512(
        form: Form,
        a: &[u8],
        b: &[u8],
        zy: i32,
        flip: u8,
        out: &mut [MaybeUninit<u8>],
    ) -> usize {
        let n = a.len() / 16 * 16;
        let (b, out) = (&b[..n], &mut out[..n]);
        let (lo, hi) = (
            _mm512_set1_ps((-zy) as f32),
            _mm512_set1_ps((255 - zy) as f32),
        );
        let zyv = _mm512_set1_epi32(zy);
        let fl = _mm_set1_epi8(flip as i8);
        let (za, zb, p, q) = match form {
            Form::Affine { za, alpha, gamma } => (za, 0, alpha, gamma),
            Form::Add { za, ra, zb, rb } => (za, zb, ra, rb),
            Form::Mul { za, zb, r } => (za, zb, r, 0.0),
        };
        let (zav, zbv) = (_mm512_set1_epi32(za), _mm512_set1_epi32(zb));
        let (pv, qv) = (_mm512_set1_ps(p), _mm512_set1_ps(q));
        // Sixteen bytes of `s` from `at` minus `z`, as i32 lanes.
        macro_rules! widen {
            ($s:expr, $at:expr, $z:expr) => {{
                let x: &[u8; 16] = $s[$at..$at + 16].try_into().expect("a block");
                // SAFETY: `x` holds the 16 bytes read.
                let x = unsafe { _mm_loadu_si128(x.as_ptr().cast()) };
                _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_xor_si128(x, fl)), $z)
            }};
        }
        // One loop per form, so that none of them branches on it per block.
        macro_rules! each_block {
            (|$xa:ident, $at:ident| $v:expr) => {
                for $at in (0..n).step_by(16) {
                    let $xa = widen!(a, $at, zav);
                    let v = _mm512_min_ps(_mm512_max_ps($v, lo), hi);
                    // Rounds half to even (the default rounding mode), then the zero point.
                    let r = _mm512_add_epi32(_mm512_cvtps_epi32(v), zyv);
                    let bytes = _mm_xor_si128(_mm512_cvtepi32_epi8(r), fl);
                    let dst = &mut out[$at..$at + 16];
                    // SAFETY: `dst` has the block's 16 slots.
                    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), bytes) };
                }
            };
        }
        match form {
            Form::Affine { .. } => {
                each_block!(|xa, at| _mm512_add_ps(_mm512_mul_ps(pv, _mm512_cvtepi32_ps(xa)), qv))
            }
            Form::Add { .. } => each_block!(|xa, at| {
                let xb = widen!(b, at, zbv);
                _mm512_add_ps(
                    _mm512_mul_ps(pv, _mm512_cvtepi32_ps(xa)),
                    _mm512_mul_ps(qv, _mm512_cvtepi32_ps(xb)),
                )
            }),
            Form::Mul { .. } => each_block!(|xa, at| {
                let xb = widen!(b, at, zbv);
                _mm512_mul_ps(pv, _mm512_cvtepi32_ps(_mm512_mullo_epi32(xa, xb)))
            }),
        }
        n
    }
}

/// [`run`] appended to `out`: one element per element of `a`.
pub fn run_append(
    form: Form,
    (a, b): (&[u8], &[u8]),
    zy: i32,
    signed: bool,
    out: &mut crate::par::Filler<'_, u8>,
) {
    // SAFETY: `run` writes every slot it is handed.
    unsafe { out.extend_raw(a.len(), |o| run(form, a, b, zy, signed, o)) };
}

/// [`quantize`] appended to `out`: one element per element of `x`.
pub fn quantize_append(
    x: &[f32],
    (s, z): (f32, i32),
    signed: bool,
    out: &mut crate::par::Filler<'_, u8>,
) {
    // SAFETY: `quantize` writes every slot it is handed.
    unsafe { out.extend_raw(x.len(), |o| quantize(x, s, z, signed, o)) };
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
        (crate::fast::round::round_even_f64(v) as i64 + i64::from(zy)).clamp(0, 255) as i32
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
        use crate::fast::round::quantize_one;
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

    /// Requantization gives the f64 bytes exactly at every level, on i32 and f32 sums: exact
    /// ties (factor 0.5 or 0.25 on odd sums), values a hair off a tie, both ends, large sums.
    #[test]
    fn requantize_gives_the_f64_bytes() {
        let mut rnd = crate::fast::qgemm::tests::lcg(11);
        let mut acc: Vec<i32> = (-3000..3000).collect();
        acc.extend((0..4000).map(|_| (rnd() as i32) >> 8));
        acc.extend([i32::MAX, i32::MIN, 1 << 24, (1 << 24) + 1, -(1 << 25) - 3]);
        let accf: Vec<f32> = acc.iter().map(|&a| a as f32).collect();
        let exactly_f32: Vec<bool> = acc.iter().map(|&a| a.unsigned_abs() < 1 << 24).collect();
        for (bias, factor) in [
            (0.0, 0.5),
            (3.0, 0.25),
            (-17.0, 0.1),
            (1e3, 1.0 / 3.0),
            (0.0, 0.0117),
            // f32(0.3) is above 0.3, f64(0.3) below: 5 · 0.3 rounds to 2 and to 1.
            (0.0, 0.3),
            (5.0, -0.02),
        ] {
            for (zy, signed) in [
                (0, false),
                (128, false),
                (255, false),
                (-128, true),
                (3, true),
            ] {
                let (lo, hi, off) = if signed {
                    (-128.0, 127.0, 128.0)
                } else {
                    (0.0, 255.0, 0.0)
                };
                let want: Vec<u8> = acc
                    .iter()
                    .map(|&a| {
                        let v = (f64::from(a) + bias) * factor + f64::from(zy);
                        let q = crate::fast::round::round_even_f64(v).clamp(lo, hi);
                        ((q + off) as u8) ^ if signed { 0x80 } else { 0 }
                    })
                    .collect();
                for isa in ISAS.iter().filter(|i| i.fast) {
                    let got = with_isa(isa, || {
                        let mut a = vec![0u8; acc.len()];
                        let mut b = vec![0u8; acc.len()];
                        requantize(&acc, bias, factor, zy, signed, &mut a).unwrap();
                        requantize(&accf, bias, factor, zy, signed, &mut b).unwrap();
                        (a, b)
                    });
                    let Some((a, b)) = got else { continue };
                    for i in 0..acc.len() {
                        let case = format!("{}: ({} + {bias}) * {factor} + {zy}", isa.name, acc[i]);
                        assert_eq!(a[i], want[i], "i32 {case}");
                        if exactly_f32[i] {
                            assert_eq!(b[i], want[i], "f32 {case}");
                        }
                    }
                }
            }
        }
        let mut out = [0u8; 1];
        assert!(requantize(&[1i32], 0.0, f64::NAN, 0, false, &mut out).is_none());
        assert!(requantize(&[1i32], 0.0, 1e300, 0, false, &mut out).is_none());
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
