//! The narrow element types Rust has no type for: the 8-bit floats (E4M3FN, E4M3FNUZ, E5M2,
//! E5M2FNUZ, E8M0), the 4-bit float E2M1, and the 4- and 2-bit integers.
//!
//! In a [`crate::tensor::Tensor`] each element takes one byte: the float types hold their
//! bit pattern, the integers their value. Packing two or four elements to a byte happens only
//! where tensors cross the ABI ([`pack`], [`unpack`]).
//!
//! Conversions follow ONNX `Cast`: to a narrow float, round to nearest even; with `saturate`
//! (the default) values beyond the largest finite one, infinities included, become it; without,
//! they become infinity (E5M2) or NaN (the types without infinity). To E8M0, round as
//! `round_mode` says (`up`, the default, `down` or `nearest`) on the exponent of the float32
//! value. Integers convert like C casts: truncate toward zero, keep the low bits.

use epx_plugin_api::ElementType;

/// How a float rounds into a narrow float type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NarrowCast {
    pub saturate: bool,
    pub e8m0_round: E8m0Round,
}

impl Default for NarrowCast {
    fn default() -> Self {
        NarrowCast {
            saturate: true,
            e8m0_round: E8m0Round::Up,
        }
    }
}

/// `round_mode` of a cast to E8M0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E8m0Round {
    Up,
    Down,
    Nearest,
}

impl E8m0Round {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "up" => E8m0Round::Up,
            "down" => E8m0Round::Down,
            "nearest" => E8m0Round::Nearest,
            _ => return None,
        })
    }
}

/// What a bit pattern with all exponent bits set means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Special {
    /// IEEE-like: exponent all ones is infinity (mantissa 0) or NaN.
    Ieee,
    /// "Finite": no infinity; only exponent and mantissa all ones is NaN.
    Fn,
    /// "Finite, unsigned zero": no infinity, no negative zero; the pattern of -0 is NaN.
    Fnuz,
    /// No infinity and no NaN at all (E2M1).
    None,
}

/// A sign + exponent + mantissa format of at most 8 bits.
#[derive(Clone, Copy, Debug)]
struct Format {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    special: Special,
}

const E4M3FN: Format = Format {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    special: Special::Fn,
};
const E4M3FNUZ: Format = Format {
    exp_bits: 4,
    man_bits: 3,
    bias: 8,
    special: Special::Fnuz,
};
const E5M2: Format = Format {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    special: Special::Ieee,
};
const E5M2FNUZ: Format = Format {
    exp_bits: 5,
    man_bits: 2,
    bias: 16,
    special: Special::Fnuz,
};
const E2M1: Format = Format {
    exp_bits: 2,
    man_bits: 1,
    bias: 1,
    special: Special::None,
};

impl Format {
    fn sign_bit(self) -> u8 {
        1 << (self.exp_bits + self.man_bits)
    }

    fn max_exp_field(self) -> u32 {
        (1 << self.exp_bits) - 1
    }

    /// The NaN pattern, with the sign `sign` (0 or the sign bit) where the format has one.
    fn nan(self, sign: u8) -> u8 {
        match self.special {
            Special::Fnuz => 0x80,
            // E2M1 has no NaN; like ml_dtypes, NaN becomes -0.
            Special::None => self.sign_bit(),
            Special::Fn => sign | (self.sign_bit() - 1),
            // The quiet NaN: exponent all ones, top mantissa bit set.
            Special::Ieee => {
                sign | ((self.max_exp_field() as u8) << self.man_bits) | (1 << (self.man_bits - 1))
            }
        }
    }

    /// The largest finite value's pattern (positive).
    fn max_pattern(self) -> u8 {
        let all = self.sign_bit() - 1;
        match self.special {
            Special::Ieee => all - (1 << self.man_bits), // exponent all ones is reserved
            Special::Fn => all - 1,                      // all ones is NaN
            Special::Fnuz | Special::None => all,
        }
    }

    fn decode(self, code: u8) -> f32 {
        let sign = code & self.sign_bit() != 0;
        let field = code & (self.sign_bit() - 1);
        let e = u32::from(field) >> self.man_bits;
        let m = u32::from(field) & ((1 << self.man_bits) - 1);
        match self.special {
            Special::Fnuz if code == 0x80 => return f32::NAN,
            Special::Fn if field == self.sign_bit() - 1 => return f32::NAN,
            Special::Ieee if e == self.max_exp_field() => {
                let v = if m == 0 { f32::INFINITY } else { f32::NAN };
                return if sign { -v } else { v };
            }
            _ => {}
        }
        let scale = |p: i32| 2f32.powi(p);
        let mag = if e == 0 {
            m as f32 * scale(1 - self.bias - self.man_bits as i32)
        } else {
            (1.0 + m as f32 / (1 << self.man_bits) as f32) * scale(e as i32 - self.bias)
        };
        if sign { -mag } else { mag }
    }

    fn encode(self, x: f64, saturate: bool) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        if x.is_nan() {
            return self.nan(sign);
        }
        let max = self.max_pattern();
        let overflow = || match (saturate, self.special) {
            (true, _) | (false, Special::None) => sign | max,
            (false, Special::Ieee) => sign | (max + 1), // infinity
            (false, _) => self.nan(sign),
        };
        let a = x.abs();
        if a.is_infinite() {
            return overflow();
        }
        let max_value = f64::from(self.decode(max));
        // The value rounded to this format's precision at its exponent (RNE, exact in f64).
        let min_normal_exp = 1 - self.bias;
        let exp = if a == 0.0 {
            min_normal_exp
        } else {
            exponent_of(a).max(min_normal_exp)
        };
        let quantum = 2f64.powi(exp - self.man_bits as i32);
        let rounded = (a / quantum).round_ties_even() * quantum;
        if rounded > max_value {
            return overflow();
        }
        if rounded == 0.0 {
            return if self.special == Special::Fnuz {
                0
            } else {
                sign
            };
        }
        let e = exponent_of(rounded);
        let code = if e < min_normal_exp {
            (rounded / 2f64.powi(min_normal_exp - self.man_bits as i32)) as u8
        } else {
            let field = (e + self.bias) as u8;
            let man = ((rounded / 2f64.powi(e) - 1.0) * f64::from(1u32 << self.man_bits)) as u8;
            (field << self.man_bits) | man
        };
        sign | code
    }
}

/// floor(log2(a)) for a finite positive `a`.
fn exponent_of(a: f64) -> i32 {
    let bits = a.to_bits();
    let field = ((bits >> 52) & 0x7ff) as i32;
    if field == 0 {
        // f64 subnormal: far below any narrow format's range.
        -1075
    } else {
        field - 1023
    }
}

fn e8m0_decode(code: u8) -> f32 {
    if code == 0xff {
        f32::NAN
    } else {
        f32::from_bits(if code == 0 {
            1 << 22
        } else {
            u32::from(code) << 23
        })
    }
}

/// The exponent of the float32 value of `x`, rounded as `mode` says.
fn e8m0_encode(x: f64, cast: NarrowCast) -> u8 {
    let bits = (x as f32).to_bits();
    let exp = (bits >> 23) & 0xff;
    if exp == 0xff {
        return 0xff;
    }
    let frac = bits & 0x7f_ffff;
    let up = match cast.e8m0_round {
        E8m0Round::Down => false,
        E8m0Round::Up => frac != 0,
        E8m0Round::Nearest => {
            let guard = frac & 0x40_0000 != 0;
            let rest = frac & 0x3f_ffff != 0;
            guard && (rest || exp > 0)
        }
    };
    if up && exp == 0xfe {
        return if cast.saturate { 0xfe } else { 0xff };
    }
    (exp + u32::from(up)) as u8
}

macro_rules! narrow_float {
    ($name:ident, $ety:ident, $doc:expr, |$c:ident| $decode:expr, |$x:ident, $cast:ident| $encode:expr) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Default, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl $name {
            pub const TYPE: ElementType = ElementType::$ety;

            pub fn to_f32(self) -> f32 {
                let $c = self.0;
                $decode
            }

            pub fn from_f64_with($x: f64, $cast: NarrowCast) -> Self {
                $name($encode)
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                self.to_f32().partial_cmp(&other.to_f32())
            }
        }
    };
}

narrow_float!(
    F8E4M3FN,
    Float8E4M3FN,
    "An 8-bit float: 4 exponent bits, 3 mantissa bits, no infinity.",
    |c| E4M3FN.decode(c),
    |x, cast| E4M3FN.encode(x, cast.saturate)
);
narrow_float!(
    F8E4M3FNUZ,
    Float8E4M3FNUZ,
    "An 8-bit float: 4 exponent bits, 3 mantissa bits, no infinity, no negative zero.",
    |c| E4M3FNUZ.decode(c),
    |x, cast| E4M3FNUZ.encode(x, cast.saturate)
);
narrow_float!(
    F8E5M2,
    Float8E5M2,
    "An 8-bit float: 5 exponent bits, 2 mantissa bits, with infinities.",
    |c| E5M2.decode(c),
    |x, cast| E5M2.encode(x, cast.saturate)
);
narrow_float!(
    F8E5M2FNUZ,
    Float8E5M2FNUZ,
    "An 8-bit float: 5 exponent bits, 2 mantissa bits, no infinity, no negative zero.",
    |c| E5M2FNUZ.decode(c),
    |x, cast| E5M2FNUZ.encode(x, cast.saturate)
);
narrow_float!(
    F8E8M0,
    Float8E8M0,
    "An 8-bit power of two (the scale of microscaling formats): 2^(code - 127), 0xff is NaN.",
    |c| e8m0_decode(c),
    |x, cast| e8m0_encode(x, cast)
);
narrow_float!(
    F4E2M1,
    Float4E2M1,
    "A 4-bit float: 2 exponent bits, 1 mantissa bit, no infinity or NaN.",
    |c| E2M1.decode(c),
    |x, _cast| E2M1.encode(x, true)
);

macro_rules! narrow_int {
    ($name:ident, $ety:ident, $repr:ty, $bits:expr, $doc:expr) => {
        #[doc = $doc]
        #[derive(
            Clone, Copy, Default, Debug, PartialEq, PartialOrd, bytemuck::Pod, bytemuck::Zeroable,
        )]
        #[repr(transparent)]
        pub struct $name(pub $repr);

        impl $name {
            pub const TYPE: ElementType = ElementType::$ety;
            pub const MIN: i64 = if (<$repr>::MIN as i64) < 0 {
                -(1 << ($bits - 1))
            } else {
                0
            };
            pub const MAX: i64 = Self::MIN + (1 << $bits) - 1;

            /// Keeps the low bits of `v` (two's complement), like a C cast.
            pub fn wrapping(v: i64) -> Self {
                let low = v & ((1 << $bits) - 1);
                $name(if low > Self::MAX {
                    low - (1 << $bits)
                } else {
                    low
                } as $repr)
            }

            /// The bits of the value, as packed.
            pub fn code(self) -> u8 {
                (self.0 as u8) & ((1 << $bits) - 1)
            }

            pub fn from_code(c: u8) -> Self {
                Self::wrapping(i64::from(c))
            }
        }
    };
}

narrow_int!(I4, Int4, i8, 4, "A 4-bit signed integer, -8 to 7.");
narrow_int!(U4, Uint4, u8, 4, "A 4-bit unsigned integer, 0 to 15.");
narrow_int!(I2, Int2, i8, 2, "A 2-bit signed integer, -2 to 1.");
narrow_int!(U2, Uint2, u8, 2, "A 2-bit unsigned integer, 0 to 3.");

/// Unpacks `count` elements of `bits` bits each (2 or 4) into one code per byte.
pub fn unpack(bits: usize, count: usize, packed: &[u8]) -> Vec<u8> {
    let per = 8 / bits;
    let mask = (1u8 << bits) - 1;
    (0..count)
        .map(|i| (packed[i / per] >> ((i % per) * bits)) & mask)
        .collect()
}

/// Packs one code per byte into `bits`-bit elements (2 or 4), padding with zero bits.
pub fn pack(bits: usize, codes: impl Iterator<Item = u8>, out: &mut [u8]) {
    let per = 8 / bits;
    let mask = (1u8 << bits) - 1;
    out.fill(0);
    for (i, c) in codes.enumerate() {
        out[i / per] |= (c & mask) << ((i % per) * bits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip_all<F: Fn(u8) -> f32, G: Fn(f64) -> u8>(n: u32, decode: F, encode: G) {
        for c in 0..n {
            let c = c as u8;
            let v = decode(c);
            if v.is_nan() {
                assert!(decode(encode(f64::from(v))).is_nan(), "{c:#x}");
            } else {
                let back = encode(f64::from(v));
                assert_eq!(decode(back), v, "{c:#x} -> {v} -> {back:#x}");
            }
        }
    }

    #[test]
    fn every_pattern_round_trips() {
        let sat = NarrowCast::default();
        round_trip_all(
            256,
            |c| F8E4M3FN(c).to_f32(),
            |x| F8E4M3FN::from_f64_with(x, sat).0,
        );
        round_trip_all(
            256,
            |c| F8E4M3FNUZ(c).to_f32(),
            |x| F8E4M3FNUZ::from_f64_with(x, sat).0,
        );
        round_trip_all(
            256,
            |c| F8E5M2(c).to_f32(),
            |x| {
                F8E5M2::from_f64_with(
                    x,
                    NarrowCast {
                        saturate: false,
                        ..sat
                    },
                )
                .0
            },
        );
        round_trip_all(
            256,
            |c| F8E5M2FNUZ(c).to_f32(),
            |x| F8E5M2FNUZ::from_f64_with(x, sat).0,
        );
        round_trip_all(
            16,
            |c| F4E2M1(c).to_f32(),
            |x| F4E2M1::from_f64_with(x, sat).0,
        );
        // 2^-127 is a float32 subnormal, which rounding up takes to 2^-126.
        let down = NarrowCast {
            e8m0_round: E8m0Round::Down,
            ..sat
        };
        round_trip_all(
            256,
            |c| F8E8M0(c).to_f32(),
            |x| F8E8M0::from_f64_with(x, down).0,
        );
    }

    #[test]
    fn limits_and_special_values() {
        let sat = NarrowCast::default();
        let nosat = NarrowCast {
            saturate: false,
            ..sat
        };
        assert_eq!(F8E4M3FN(0x7e).to_f32(), 448.0);
        assert_eq!(F8E4M3FNUZ(0x7f).to_f32(), 240.0);
        assert_eq!(F8E5M2(0x7b).to_f32(), 57344.0);
        assert_eq!(F8E5M2FNUZ(0x7f).to_f32(), 57344.0);
        assert_eq!(F4E2M1(0x7).to_f32(), 6.0);
        assert_eq!(F8E4M3FN::from_f64_with(1e6, sat).to_f32(), 448.0);
        assert!(F8E4M3FN::from_f64_with(1e6, nosat).to_f32().is_nan());
        assert_eq!(F8E5M2::from_f64_with(f64::INFINITY, sat).to_f32(), 57344.0);
        assert_eq!(
            F8E5M2::from_f64_with(-1e6, nosat).to_f32(),
            f32::NEG_INFINITY
        );
        assert!(
            F8E5M2FNUZ::from_f64_with(f64::INFINITY, nosat)
                .to_f32()
                .is_nan()
        );
        // No negative zero in the FNUZ types.
        assert_eq!(F8E4M3FNUZ::from_f64_with(-1e-9, sat).0, 0);
        assert_eq!(F8E4M3FN::from_f64_with(-1e-9, sat).0, 0x80);
        // Ties go to the even mantissa: 464 lies halfway between 448 and 480.
        assert_eq!(F8E4M3FN::from_f64_with(464.0, nosat).to_f32(), 448.0);
        assert_eq!(F4E2M1::from_f64_with(0.25, sat).to_f32(), 0.0);
        assert_eq!(F4E2M1::from_f64_with(-3.5, sat).to_f32(), -4.0);
        // Subnormals.
        assert_eq!(F8E4M3FN(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3FN::from_f64_with(2f64.powi(-9), sat).0, 1);
        // E8M0 rounds the exponent.
        assert_eq!(F8E8M0::from_f64_with(1.1, sat).to_f32(), 2.0);
        let down = NarrowCast {
            e8m0_round: E8m0Round::Down,
            ..sat
        };
        assert_eq!(F8E8M0::from_f64_with(1.9, down).to_f32(), 1.0);
        assert_eq!(F8E8M0::from_f64_with(0.0, sat).0, 0);
    }

    #[test]
    fn integers_wrap_and_pack() {
        assert_eq!(I4::wrapping(-9), I4(7));
        assert_eq!(I4::wrapping(8), I4(-8));
        assert_eq!(U4::wrapping(-1), U4(15));
        assert_eq!(I2::wrapping(3), I2(-1));
        assert_eq!(I4(-1).code(), 0xf);
        assert_eq!(I4::from_code(0xf), I4(-1));
        let codes = [1u8, 2, 3, 0xf, 5];
        let mut out = [0u8; 3];
        pack(4, codes.iter().copied(), &mut out);
        assert_eq!(out, [0x21, 0xf3, 0x05]);
        assert_eq!(unpack(4, 5, &out), codes);
        let mut two = [0u8; 2];
        pack(2, [1u8, 2, 3, 0, 1].into_iter(), &mut two);
        assert_eq!(two, [0b00_11_10_01, 0b01]);
        assert_eq!(unpack(2, 5, &two), [1, 2, 3, 0, 1]);
    }
}
