//! Elementwise kernels on 8-bit quantized tensors: each output byte is
//! `saturate(round(v) + zy)`, `v` an affine form of the input bytes computed in f32 from
//! ratios of the scales prepared once per call ([`Form`]).
//!
//! Every level computes the same float32 operations in the same order and rounds half to even,
//! so the AVX2 and AVX-512 kernels and the portable loop give the same bytes. QLinearAdd's forms
//! ([`Form::Sum`], [`Form::Scaled`], made by [`Form::add`] and [`Form::add_scalar`]) are ONNX
//! Runtime's arithmetic exactly (its AVX2 kernel: fused multiply-adds on the element values with
//! the output zero point folded into a constant, then a conversion that saturates), so they give
//! its bytes; the others are a product, then a sum, with no fused multiply-add. Against the
//! composite `QuantizeLinear(op(DequantizeLinear(a), ...))`, which divides by the output scale
//! last, a result can differ by one step where the exact value falls within a rounding of a half.
//!
//! [`quantize`] is QuantizeLinear's float32 to 8 bits, the general path's bytes exactly.
//! [`requantize`] turns the exact sums of the integer convolutions and products into bytes
//! with one float32 scale, as ONNX Runtime's kernels do.

use std::mem::MaybeUninit;

/// What `v` is, for input bytes `a` (and `b`). The zero points of `Affine` and `Mul` are in
/// the kernel's unsigned domain; `Sum` and `Scaled` read the element values themselves (int8 or
/// uint8) and hold the output zero point in `fixed` ([`run`] is then called with `zy` 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    /// `alpha · (a - za) + gamma`: one operand and a constant (QLinearMul with a broadcast
    /// scalar, a requantization).
    Affine { za: i32, alpha: f32, gamma: f32 },
    /// `fma(a, ra, fma(b, rb, fixed))`: QLinearAdd of two tensors ([`Form::add`]).
    Sum { ra: f32, rb: f32, fixed: f32 },
    /// `fma(a, ra, fixed)`: QLinearAdd of a tensor and a broadcast scalar
    /// ([`Form::add_scalar`]).
    Scaled { ra: f32, fixed: f32 },
    /// `r · ((a - za) · (b - zb))`: QLinearMul (the integer product is exact in f32).
    Mul { za: i32, zb: i32, r: f32 },
}

/// The largest ratio magnitude the kernels take: every `v` stays finite (at most
/// `2 · 255 · 2^100`, or `255² · 2^100`), so no NaN can arise from bytes.
const MAX_RATIO: f32 = 1.267_650_6e30; // 2^100

impl Form {
    /// QLinearAdd of `a` and `b` (each a scale and a zero point) into `c`, as ONNX Runtime
    /// computes it (onnxruntime/core/mlas/lib/intrinsics/avx2/qladd_avx2.cpp, its kernel on
    /// every x86-64 CPU with AVX2): the ratios `sa / sc` and `sb / sc` in float32, the constant
    /// `zc - fma(ra, za, rb · zb)` (its compiler fuses the first product and the sum), and per
    /// element `fma(a, ra, fma(b, rb, constant))`, converted to an integer half to even (a
    /// value past the i32 range, or NaN, gives i32::MIN) and saturated.
    pub fn add(a: (f32, i32), b: (f32, i32), c: (f32, i32)) -> Form {
        let (ra, rb) = (a.0 / c.0, b.0 / c.0);
        let fixed = c.1 as f32 - ra.mul_add(a.1 as f32, rb * b.1 as f32);
        Form::Sum { ra, rb, fixed }
    }

    /// QLinearAdd of the tensor `a` and one element `value` of `b` repeated along it, as
    /// ONNX Runtime computes it: [`Form::add`]'s constant plus `value · rb`, fused, then
    /// `fma(a, ra, constant)` per element. ONNX Runtime hands its kernel the tensor first
    /// whichever input it is: a broadcast first input is `value` here, with its parameters as `b`.
    pub fn add_scalar(a: (f32, i32), b: (f32, i32), value: i32, c: (f32, i32)) -> Form {
        let Form::Sum { ra, rb, fixed } = Form::add(a, b, c) else {
            unreachable!("Form::add makes a Sum")
        };
        Form::Scaled {
            ra,
            fixed: (value as f32).mul_add(rb, fixed),
        }
    }

    /// Whether every ratio is finite and at most [`MAX_RATIO`] in magnitude, and the zero
    /// points are values of the element type (int8 when `signed`, else uint8): then [`run`] is
    /// defined for every input. `Sum` and `Scaled` take any finite ratios and constant: their
    /// conversion defines what a value past the i32 range gives.
    pub fn usable(self, signed: bool) -> bool {
        let ok = |r: f32| r.is_finite() && r.abs() <= MAX_RATIO;
        let range = if signed { -128..=127 } else { 0..=255 };
        let byte = |z: i32| range.contains(&z);
        match self {
            Form::Affine { za, alpha, gamma } => byte(za) && ok(alpha) && ok(gamma),
            Form::Sum { ra, rb, fixed } => ra.is_finite() && rb.is_finite() && fixed.is_finite(),
            Form::Scaled { ra, fixed } => ra.is_finite() && fixed.is_finite(),
            Form::Mul { za, zb, r } => byte(za) && byte(zb) && ok(r),
        }
    }

    /// Whether the form reads element values and saturates after converting (`Sum`, `Scaled`).
    fn folds_zero_point(self) -> bool {
        matches!(self, Form::Sum { .. } | Form::Scaled { .. })
    }

    /// `v` for the bytes `a` and `b` in the unsigned domain, whose element values are the
    /// bytes minus `base` (128 for int8 data, else 0).
    #[inline(always)]
    fn value(self, a: u8, b: u8, base: i32) -> f32 {
        let (x, y) = ((i32::from(a) - base) as f32, (i32::from(b) - base) as f32);
        match self {
            Form::Affine { za, alpha, gamma } => alpha * (i32::from(a) - za) as f32 + gamma,
            Form::Sum { ra, rb, fixed } => x.mul_add(ra, y.mul_add(rb, fixed)),
            Form::Scaled { ra, fixed } => x.mul_add(ra, fixed),
            Form::Mul { za, zb, r } => r * ((i32::from(a) - za) * (i32::from(b) - zb)) as f32,
        }
    }
}

/// `cvtps2dq`: `v` rounded half to even, or i32::MIN where that is not an i32 (NaN included).
#[inline(always)]
fn convert(v: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        crate::fast::round::round_even_f32(v) as i32
    } else {
        i32::MIN
    }
}

/// `out[i] = saturate(round(v(a[i], b[i])) + zy)` for each element, every one written (`b` is
/// read only by the two-operand forms, and must then be as long as `a`). With `signed`, the
/// bytes are int8 bits and `za`, `zb`, `zy` int8 values; else uint8. `form` must be
/// [`Form::usable`], and `zy` a value of the element type (0 for `Sum` and `Scaled`, which hold
/// it).
pub fn run(form: Form, a: &[u8], b: &[u8], zy: i32, signed: bool, out: &mut [MaybeUninit<u8>]) {
    let two = matches!(form, Form::Sum { .. } | Form::Mul { .. });
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
            Form::Mul { za, zb, r } => Form::Mul {
                za: za + 128,
                zb: zb + 128,
                r,
            },
            f @ (Form::Sum { .. } | Form::Scaled { .. }) => f,
        };
        (f, zy + 128, 0x80u8)
    } else {
        (form, zy, 0)
    };
    let b = if two { b } else { a };
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::isa::isa().vnni {
        // SAFETY: the level is VNNI only on a CPU with AVX-512F and BW (and FMA); `a`, `b` and
        // `out` have the same length (asserted).
        done = unsafe { x86::run512(form, a, b, zy, flip, out) };
    } else if super::isa::isa().wide {
        // SAFETY: the level is wide only on a CPU with AVX2 and FMA; lengths as above.
        done = unsafe { x86::run(form, a, b, zy, flip, out) };
    }
    portable(form, &a[done..], &b[done..], zy, flip, &mut out[done..]);
}

/// The same bytes as the AVX2 kernel, one element at a time.
fn portable(form: Form, a: &[u8], b: &[u8], zy: i32, flip: u8, out: &mut [MaybeUninit<u8>]) {
    let base = i32::from(flip);
    let pairs = out.iter_mut().zip(a).zip(b);
    if form.folds_zero_point() {
        for ((o, &x), &y) in pairs {
            let r = convert(form.value(x ^ flip, y ^ flip, base)).clamp(-zy, 255 - zy) + zy;
            o.write(r as u8 ^ flip);
        }
    } else {
        for ((o, &x), &y) in pairs {
            o.write(to_byte(form.value(x ^ flip, y ^ flip, base), zy) ^ flip);
        }
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
    /// `self + bias` as float32: the i32 sum converted once (as ONNX Runtime adds the bias
    /// before converting), an f32 sum plus the bias (exact below 2^24).
    fn biased(self, bias: i32, b32: f32) -> f32;
    /// The sum itself.
    fn int(self) -> i32;
    /// [`requantize`] on the whole blocks at the AVX2 or AVX-512 level; returns how many it
    /// wrote.
    ///
    /// # Safety
    /// The CPU has AVX2; `acc` and `out` have the same length.
    #[cfg(target_arch = "x86_64")]
    unsafe fn blocks(acc: &[Self], rq: &Requant, out: &mut [u8]) -> usize;
}

impl Acc for i32 {
    #[inline(always)]
    fn biased(self, bias: i32, _: f32) -> f32 {
        self.wrapping_add(bias) as f32
    }
    #[inline(always)]
    fn int(self) -> i32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn blocks(acc: &[i32], rq: &Requant, out: &mut [u8]) -> usize {
        // SAFETY: the caller's contract; the level is VNNI only on a CPU with AVX-512F and BW.
        unsafe {
            if super::isa::isa().vnni {
                x86::requantize512_i32(acc, rq, out)
            } else {
                x86::requantize_i32(acc, rq, out)
            }
        }
    }
}

impl Acc for f32 {
    #[inline(always)]
    fn biased(self, _: i32, b32: f32) -> f32 {
        self + b32
    }
    #[inline(always)]
    fn int(self) -> i32 {
        self as i32
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn blocks(acc: &[f32], rq: &Requant, out: &mut [u8]) -> usize {
        // SAFETY: the caller's contract; the level is VNNI only on a CPU with AVX-512F and BW.
        unsafe {
            if super::isa::isa().vnni {
                x86::requantize512_f32(acc, rq, out)
            } else {
                x86::requantize_f32(acc, rq, out)
            }
        }
    }
}

/// `out[i] = saturate(round(f32(acc[i] + bias) · f32(factor)) + zy)`, rounded half to even,
/// for uint8, or int8 bits with an int8 `zy` when `signed`: ONNX Runtime's requantization
/// (MlasRequantizeOutput, and the post-processing of its symmetric convolution kernels), whose
/// product is one float32 rounding. `None` (nothing written) when the factor is not finite in
/// f32 or the bias is not an i32.
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
    bias: i32,
    b32: f32,
    factor: f32,
    /// The zero point in the unsigned domain, and the bit flip back (int8: 0x80).
    zy: i32,
    flip: u8,
}

impl Requant {
    /// `None` when the factor is not finite in f32, the bias is not an i32, or `zy` is not a
    /// value of the type.
    pub fn new(bias: f64, factor: f64, zy: i32, signed: bool) -> Option<Requant> {
        let (zy, flip) = if signed { (zy + 128, 0x80u8) } else { (zy, 0) };
        let f = factor as f32;
        let integral = bias.fract() == 0.0 && (-2_147_483_648.0..2_147_483_648.0).contains(&bias);
        if !integral || !f.is_finite() || !(0..=255).contains(&zy) {
            return None;
        }
        Some(Requant {
            bias: bias as i32,
            b32: bias as f32,
            factor: f,
            zy,
            flip,
        })
    }

    /// One element at a time.
    fn each<A: Acc>(&self, acc: &[A], out: &mut [u8]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = to_byte(a.biased(self.bias, self.b32) * self.factor, self.zy) ^ self.flip;
        }
    }

    /// [`requantize`] of `acc` into `out` (the same length).
    pub fn run<A: Acc>(&self, acc: &[A], out: &mut [u8]) {
        assert_eq!(acc.len(), out.len());
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if super::isa::isa().wide {
            // SAFETY: the level is wide only on a CPU with AVX2; same lengths (asserted).
            done = unsafe { A::blocks(acc, self, out) };
        }
        self.each(&acc[done..], &mut out[done..]);
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

    /// The AVX2 blocks of [`super::requantize`] for accumulators loaded 8 at a time, with the
    /// bias, as float32 by `$load`.
    macro_rules! requantize_blocks {
        ($name:ident, $t:ty, |$p:ident, $rq:ident| $load:expr) => {
            /// # Safety
            /// The CPU has AVX2; `acc` and `out` have the same length.
            #[target_feature(enable = "avx2")]
            pub(super) unsafe fn $name(acc: &[$t], $rq: &super::Requant, out: &mut [u8]) -> usize {
                let n = acc.len() / 32 * 32;
                let zy = $rq.zy;
                let (lo, hi) = (
                    _mm256_set1_ps((-zy) as f32),
                    _mm256_set1_ps((255 - zy) as f32),
                );
                let (sv, zv) = (_mm256_set1_ps($rq.factor), _mm256_set1_epi32(zy));
                let fl = _mm256_set1_epi8($rq.flip as i8);
                let mut i = 0;
                while i < n {
                    let mut r = [_mm256_setzero_si256(); 4];
                    for (k, r) in r.iter_mut().enumerate() {
                        let src = &acc[i + 8 * k..][..8];
                        let $p = src.as_ptr();
                        // SAFETY: `src` holds the 8 accumulators loaded.
                        let a: __m256 = unsafe { $load };
                        let v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(a, sv), lo), hi);
                        // Rounds half to even (the default rounding mode), then the zero point.
                        *r = _mm256_add_epi32(_mm256_cvtps_epi32(v), zv);
                    }
                    // SAFETY: `out` has the block's 32 slots; a `u8` slot is a `MaybeUninit<u8>`.
                    let dst = unsafe {
                        &mut *(&mut out[i..i + 32] as *mut [u8] as *mut [MaybeUninit<u8>])
                    };
                    store_bytes(r, fl, dst);
                    i += 32;
                }
                n
            }
        };
    }

    requantize_blocks!(requantize_i32, i32, |p, rq| _mm256_cvtepi32_ps(
        _mm256_add_epi32(_mm256_loadu_si256(p.cast()), _mm256_set1_epi32(rq.bias))
    ));
    requantize_blocks!(requantize_f32, f32, |p, rq| _mm256_add_ps(
        _mm256_loadu_ps(p),
        _mm256_set1_ps(rq.b32)
    ));

    /// The AVX-512 blocks of [`super::requantize`] (16 accumulators, loaded with the bias by
    /// `$load`): the same float32 operations as the AVX2 blocks, narrowed by `vpmovdb`.
    macro_rules! requantize_blocks512 {
        ($name:ident, $t:ty, |$p:ident, $rq:ident| $load:expr) => {
            /// # Safety
            /// The CPU has AVX-512F and AVX-512BW; `acc` and `out` have the same length.
            #[target_feature(enable = "avx512f,avx512bw")]
            pub(super) unsafe fn $name(acc: &[$t], $rq: &super::Requant, out: &mut [u8]) -> usize {
                let n = acc.len() / 16 * 16;
                let zy = $rq.zy;
                let (lo, hi) = (
                    _mm512_set1_ps((-zy) as f32),
                    _mm512_set1_ps((255 - zy) as f32),
                );
                let (sv, zv) = (_mm512_set1_ps($rq.factor), _mm512_set1_epi32(zy));
                let fl = _mm_set1_epi8($rq.flip as i8);
                for i in (0..n).step_by(16) {
                    let src: &[$t; 16] = acc[i..i + 16].try_into().expect("a block");
                    let $p = src.as_ptr();
                    // SAFETY: `src` holds the 16 accumulators loaded.
                    let a: __m512 = unsafe { $load };
                    let v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(a, sv), lo), hi);
                    let r = _mm512_add_epi32(_mm512_cvtps_epi32(v), zv);
                    let bytes = _mm_xor_si128(_mm512_cvtepi32_epi8(r), fl);
                    let dst = &mut out[i..i + 16];
                    // SAFETY: `dst` has the block's 16 slots.
                    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), bytes) };
                }
                n
            }
        };
    }

    requantize_blocks512!(requantize512_i32, i32, |p, rq| _mm512_cvtepi32_ps(
        _mm512_add_epi32(_mm512_loadu_si512(p.cast()), _mm512_set1_epi32(rq.bias))
    ));
    requantize_blocks512!(requantize512_f32, f32, |p, rq| _mm512_add_ps(
        _mm512_loadu_ps(p),
        _mm512_set1_ps(rq.b32)
    ));

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
    /// The CPU has AVX2 and FMA; `a`, `b` and `out` have the same length.
    #[target_feature(enable = "avx2,fma")]
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
        let (lo_i, hi_i) = (_mm256_set1_epi32(-zy), _mm256_set1_epi32(255 - zy));
        let fl = _mm_set1_epi8(flip as i8);
        let (za, zb, p, q, f) = params(form, flip);
        let (zav, zbv) = (_mm256_set1_epi32(za), _mm256_set1_epi32(zb));
        let (pv, qv, fv) = (_mm256_set1_ps(p), _mm256_set1_ps(q), _mm256_set1_ps(f));
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
                    Form::Sum { .. } => {
                        let xb = widen!(bb, at, zbv);
                        let inner = _mm256_fmadd_ps(_mm256_cvtepi32_ps(xb), qv, fv);
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(xa), pv, inner)
                    }
                    Form::Scaled { .. } => _mm256_fmadd_ps(_mm256_cvtepi32_ps(xa), pv, fv),
                    Form::Mul { .. } => {
                        let xb = widen!(bb, at, zbv);
                        _mm256_mul_ps(pv, _mm256_cvtepi32_ps(_mm256_mullo_epi32(xa, xb)))
                    }
                };
                // Rounds half to even (the default rounding mode), then the zero point: the
                // forms that fold it saturate the integer, the others the float.
                *r = if form.folds_zero_point() {
                    let q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo_i), hi_i);
                    _mm256_add_epi32(q, zyv)
                } else {
                    let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
                    _mm256_add_epi32(_mm256_cvtps_epi32(v), zyv)
                };
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
    /// The CPU has AVX-512F, AVX-512BW and FMA; `a`, `b` and `out` have the same length.
    #[target_feature(enable = "avx512f,avx512bw,fma")]
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
        let (lo_i, hi_i) = (_mm512_set1_epi32(-zy), _mm512_set1_epi32(255 - zy));
        let fl = _mm_set1_epi8(flip as i8);
        let (za, zb, p, q, f) = params(form, flip);
        let (zav, zbv) = (_mm512_set1_epi32(za), _mm512_set1_epi32(zb));
        let (pv, qv, fv) = (_mm512_set1_ps(p), _mm512_set1_ps(q), _mm512_set1_ps(f));
        // Sixteen bytes of `s` from `at` minus `z`, as i32 lanes.
        macro_rules! widen {
            ($s:expr, $at:expr, $z:expr) => {{
                let x: &[u8; 16] = $s[$at..$at + 16].try_into().expect("a block");
                // SAFETY: `x` holds the 16 bytes read.
                let x = unsafe { _mm_loadu_si128(x.as_ptr().cast()) };
                _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_xor_si128(x, fl)), $z)
            }};
        }
        // One loop per form, so that none of them branches on it per block. Rounds half to
        // even (the default rounding mode), then the zero point: `float` saturates the float,
        // `int` the integer (the forms that fold the zero point).
        macro_rules! each_block {
            (float |$xa:ident, $at:ident| $v:expr) => {
                each_block!(|$xa, $at| $v, |v| _mm512_cvtps_epi32(_mm512_min_ps(
                    _mm512_max_ps(v, lo),
                    hi
                )))
            };
            (int |$xa:ident, $at:ident| $v:expr) => {
                each_block!(|$xa, $at| $v, |v| _mm512_min_epi32(
                    _mm512_max_epi32(_mm512_cvtps_epi32(v), lo_i),
                    hi_i
                ))
            };
            (|$xa:ident, $at:ident| $v:expr, |$w:ident| $q:expr) => {
                for $at in (0..n).step_by(16) {
                    let $xa = widen!(a, $at, zav);
                    let $w = $v;
                    let r = _mm512_add_epi32($q, zyv);
                    let bytes = _mm_xor_si128(_mm512_cvtepi32_epi8(r), fl);
                    let dst = &mut out[$at..$at + 16];
                    // SAFETY: `dst` has the block's 16 slots.
                    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), bytes) };
                }
            };
        }
        match form {
            Form::Affine { .. } => each_block!(
                float | xa,
                at | _mm512_add_ps(_mm512_mul_ps(pv, _mm512_cvtepi32_ps(xa)), qv)
            ),
            Form::Sum { .. } => each_block!(
                int | xa,
                at | {
                    let xb = widen!(b, at, zbv);
                    let inner = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xb), qv, fv);
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(xa), pv, inner)
                }
            ),
            Form::Scaled { .. } => {
                each_block!(
                    int | xa,
                    at | _mm512_fmadd_ps(_mm512_cvtepi32_ps(xa), pv, fv)
                )
            }
            Form::Mul { .. } => each_block!(
                float | xa,
                at | {
                    let xb = widen!(b, at, zbv);
                    _mm512_mul_ps(pv, _mm512_cvtepi32_ps(_mm512_mullo_epi32(xa, xb)))
                }
            ),
        }
        n
    }

    /// The kernels' constants for `form`: the zero points subtracted from the unsigned-domain
    /// bytes (`base`, 128 for int8 data and 0 for uint8, where the form reads element values),
    /// the two factors and the fused constant.
    fn params(form: Form, flip: u8) -> (i32, i32, f32, f32, f32) {
        let base = i32::from(flip);
        match form {
            Form::Affine { za, alpha, gamma } => (za, 0, alpha, gamma, 0.0),
            Form::Sum { ra, rb, fixed } => (base, base, ra, rb, fixed),
            Form::Scaled { ra, fixed } => (base, 0, ra, 0.0, fixed),
            Form::Mul { za, zb, r } => (za, zb, r, 0.0, 0.0),
        }
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
            Form::Mul { za, zb, r } => {
                f64::from(r) * f64::from((i32::from(a) - za) * (i32::from(b) - zb))
            }
            Form::Sum { .. } | Form::Scaled { .. } => unreachable!("tested apart"),
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
            Form::Mul { za, zb, r } => Form::Mul {
                za: za - 128,
                zb: zb - 128,
                r,
            },
            f => f,
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

    /// QLinearAdd's forms give ONNX Runtime's bytes: cases where they differ from the sum of
    /// two products rounded once (ONNX Runtime 1.31.1's outputs, scales as float32 bits), then
    /// the same bytes at every level for every pair of values, signed and unsigned, within one
    /// step of the exact value, saturated, and past the i32 range as `cvtps2dq` converts.
    #[test]
    fn qlinear_add_gives_onnx_runtimes_bytes() {
        // (signed, (sa, za), (sb, zb), (sc, zc), a, b, ONNX Runtime's c).
        type Case = (bool, (u32, i32), (u32, i32), (u32, i32), i32, i32, i32);
        let cases: [Case; 6] = [
            (
                false,
                (0x3d28_3cc4, 184),
                (0x3c7a_32d9, 65),
                (0x3c57_db49, 253),
                161,
                16,
                124,
            ),
            (
                false,
                (0x3e59_7a5b, 186),
                (0x3b8c_a30b, 129),
                (0x3d82_83a2, 156),
                189,
                181,
                170,
            ),
            (
                false,
                (0x3bc8_b99a, 13),
                (0x3d0e_8b21, 103),
                (0x3c2a_f667, 211),
                81,
                54,
                88,
            ),
            (
                true,
                (0x3f53_0f8a, -104),
                (0x3c13_89b1, -125),
                (0x3e0e_e364, -52),
                -95,
                -27,
                7,
            ),
            (
                false,
                (0x3f26_1a84, 96),
                (0x3d8b_9256, 226),
                (0x3bef_f8dc, 248),
                103,
                142,
                86,
            ),
            (
                true,
                (0x3e93_e3c2, 32),
                (0x3d5c_79ca, -69),
                (0x3e45_a9f8, -71),
                117,
                11,
                78,
            ),
        ];
        let param = |(bits, z): (u32, i32)| (f32::from_bits(bits), z);
        for (signed, a, b, c, x, y, want) in cases {
            let form = Form::add(param(a), param(b), param(c));
            for isa in &ISAS {
                // 40 copies: the vector kernels' blocks and the tail.
                let (xs, ys) = (vec![x as u8; 40], vec![y as u8; 40]);
                let got = with_isa(isa, || written(40, |o| run(form, &xs, &ys, 0, signed, o)));
                let Some(got) = got else { continue };
                for g in got {
                    let g = if signed {
                        i32::from(g as i8)
                    } else {
                        i32::from(g)
                    };
                    assert_eq!(g, want, "{}: {form:?} of {x} and {y}", isa.name);
                }
            }
        }

        let n = 256 * 256 + 7;
        let a: Vec<u8> = (0..n).map(|i| (i % 256) as u8).collect();
        let b: Vec<u8> = (0..n).map(|i| ((i / 256) % 256) as u8).collect();
        for signed in [false, true] {
            let z = |v: i32| if signed { v - 128 } else { v };
            let forms = [
                Form::add((0.031, z(120)), (0.07, z(7)), (0.05, z(77))),
                Form::add((0.5, z(0)), (0.5, z(255)), (1.0, z(128))),
                Form::add_scalar((0.02, z(3)), (0.9, z(200)), z(17), (0.013, z(250))),
                // Past the i32 range: i32::MIN, the lowest byte, for every input.
                Form::Scaled {
                    ra: 1e30,
                    fixed: 3e9,
                },
            ];
            for form in forms {
                let value = |g: u8| {
                    if signed {
                        i32::from(g as i8)
                    } else {
                        i32::from(g)
                    }
                };
                let exact = |x: u8, y: u8| {
                    let (x, y) = (f64::from(value(x)), f64::from(value(y)));
                    let v = match form {
                        Form::Sum { ra, rb, fixed } => {
                            x * f64::from(ra) + y * f64::from(rb) + f64::from(fixed)
                        }
                        Form::Scaled { ra, fixed } => x * f64::from(ra) + f64::from(fixed),
                        _ => unreachable!(),
                    };
                    let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
                    if v.abs() >= 2_147_483_648.0 {
                        lo
                    } else {
                        (crate::fast::round::round_even_f64(v) as i64).clamp(lo, hi)
                    }
                };
                let mut seen: Option<Vec<u8>> = None;
                for isa in &ISAS {
                    let ran = with_isa(isa, || written(n, |o| run(form, &a, &b, 0, signed, o)));
                    let Some(out) = ran else {
                        println!("qbytes: {} skipped (this CPU lacks it)", isa.name);
                        continue;
                    };
                    for i in 0..n {
                        let (got, want) = (i64::from(value(out[i])), exact(a[i], b[i]));
                        assert!(
                            (got - want).abs() <= 1,
                            "{} {form:?} signed {signed}: {} and {} gave {got}, exactly {want}",
                            isa.name,
                            value(a[i]),
                            value(b[i])
                        );
                    }
                    if let Some(s) = &seen {
                        assert!(s == &out, "{}: {form:?} signed {signed} differs", isa.name);
                    }
                    seen = Some(out);
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

    /// Requantization gives ONNX Runtime's bytes at every level, on i32 and f32 sums: one
    /// float32 product, rounded half to even (exact ties, values a hair off a tie, both ends,
    /// large sums), and a case where that differs from the exact product's rounding (ONNX
    /// Runtime 1.31.1's QLinearConv output).
    #[test]
    fn requantize_gives_onnx_runtimes_bytes() {
        // (15 - 600) · f32(0.1) is -58.50000087 exactly, -58.5 in float32: ONNX Runtime gives
        // 70 (-58 + 128) where the exact rounding gives 69.
        let mut golden = [0u8; 40];
        requantize(
            &[15i32; 40],
            -600.0,
            f64::from(0.1f32),
            128,
            false,
            &mut golden,
        )
        .unwrap();
        assert_eq!(golden, [70u8; 40]);

        let mut rnd = crate::fast::qgemm::tests::lcg(11);
        let mut acc: Vec<i32> = (-3000..3000).collect();
        acc.extend((0..4000).map(|_| (rnd() as i32) >> 8));
        acc.extend([
            i32::MAX - 20,
            i32::MIN + 20,
            1 << 24,
            (1 << 24) + 1,
            -(1 << 25) - 3,
        ]);
        let accf: Vec<f32> = acc.iter().map(|&a| a as f32).collect();
        let exactly_f32: Vec<bool> = acc.iter().map(|&a| a.unsigned_abs() < 1 << 23).collect();
        for (bias, factor) in [
            (0.0, 0.5),
            (3.0, 0.25),
            (-17.0, 0.1),
            (1e3, 1.0 / 3.0),
            (0.0, 0.0117),
            (0.0, 0.3),
            (5.0, -0.02),
        ] {
            let f = factor as f32;
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
                        let v = f64::from(a.wrapping_add(bias as i32) as f32 * f);
                        let q =
                            (crate::fast::round::round_even_f64(v) + f64::from(zy)).clamp(lo, hi);
                        ((q + off) as u8) ^ if signed { 0x80 } else { 0 }
                    })
                    .collect();
                for isa in &ISAS {
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
        assert!(requantize(&[1i32], 0.5, 1.0, 0, false, &mut out).is_none());
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
            !Form::Sum {
                ra: f32::INFINITY,
                rb: 1.0,
                fixed: 0.0
            }
            .usable(false)
        );
        // A value past the i32 range converts to i32::MIN, as `cvtps2dq` does.
        assert!(
            Form::Scaled {
                ra: 1e31,
                fixed: 0.0
            }
            .usable(true)
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
