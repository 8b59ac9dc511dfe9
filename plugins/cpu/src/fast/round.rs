//! Rounding and requantization of quantized arithmetic, one definition for every kernel and op:
//! round half to even (ONNX's and ONNX Runtime's rounding of `x / scale`), quantize one value
//! with saturation, the low byte of an integer-valued float.

/// `x` rounded half to even, for |x| < 2^22 (larger values are returned clamped to ±2^22, which
/// every caller saturates anyway; NaN stays NaN). Adding and subtracting 1.5·2^23 rounds in the
/// FPU's default mode without a call to `rintf`: baseline x86-64 has no `roundss`.
#[inline]
pub fn round_even_f32(x: f32) -> f32 {
    const M: f32 = 12_582_912.0;
    let x = x.clamp(-4_194_304.0, 4_194_304.0);
    (x + M) - M
}

/// [`round_even_f32`] for f64, exact for |x| < 2^51.
#[inline]
pub fn round_even_f64(x: f64) -> f64 {
    const M: f64 = 6_755_399_441_055_744.0;
    let x = x.clamp(-2_251_799_813_685_248.0, 2_251_799_813_685_248.0);
    (x + M) - M
}

/// `round(v / s) + z`, saturated to `lo..=hi`; NaN gives `z` (the general path's rule), as
/// [`crate::fast::qbytes::quantize`] computes it.
pub fn quantize_one(v: f32, s: f32, z: f32, lo: f32, hi: f32) -> f32 {
    let r = round_even_f32(v / s);
    let r = if r.is_nan() { 0.0 } else { r };
    (r + z).max(lo).min(hi)
}

/// The low byte of an integer-valued float in 0..=255: `2^23 + q` holds `q` in its low mantissa
/// bits. A plain `as` cast would be a saturating conversion, which does not vectorize.
#[inline(always)]
pub fn low_byte(q: f32) -> u8 {
    (q + 8_388_608.0).to_bits() as u8
}
