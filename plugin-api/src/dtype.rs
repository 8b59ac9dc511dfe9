//! Element types: ONNX's `TensorProto.DataType` codes, and their DLPack equivalents.

use crate::dlpack::{DLDataType, DLDataTypeCode};

/// The element type of a tensor, numbered as ONNX numbers `TensorProto.DataType`.
///
/// The numbers are part of the ABI (they travel as `i32` in value infos) and never change.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElementType {
    Undefined = 0,
    Float = 1,
    Uint8 = 2,
    Int8 = 3,
    Uint16 = 4,
    Int16 = 5,
    Int32 = 6,
    Int64 = 7,
    String = 8,
    Bool = 9,
    Float16 = 10,
    Double = 11,
    Uint32 = 12,
    Uint64 = 13,
    Complex64 = 14,
    Complex128 = 15,
    Bfloat16 = 16,
    Float8E4M3FN = 17,
    Float8E4M3FNUZ = 18,
    Float8E5M2 = 19,
    Float8E5M2FNUZ = 20,
    Uint4 = 21,
    Int4 = 22,
    Float4E2M1 = 23,
    Float8E8M0 = 24,
    Uint2 = 25,
    Int2 = 26,
}

impl ElementType {
    /// Every element type, in code order.
    pub const ALL: [ElementType; 27] = [
        Self::Undefined,
        Self::Float,
        Self::Uint8,
        Self::Int8,
        Self::Uint16,
        Self::Int16,
        Self::Int32,
        Self::Int64,
        Self::String,
        Self::Bool,
        Self::Float16,
        Self::Double,
        Self::Uint32,
        Self::Uint64,
        Self::Complex64,
        Self::Complex128,
        Self::Bfloat16,
        Self::Float8E4M3FN,
        Self::Float8E4M3FNUZ,
        Self::Float8E5M2,
        Self::Float8E5M2FNUZ,
        Self::Uint4,
        Self::Int4,
        Self::Float4E2M1,
        Self::Float8E8M0,
        Self::Uint2,
        Self::Int2,
    ];

    /// The type for an ONNX `TensorProto.DataType` code, if the code is known.
    pub fn from_onnx(code: i32) -> Option<Self> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        self as i32
    }

    /// Size of one element in bytes, for types stored one element per whole byte count.
    /// `None` for strings, sub-byte types and `Undefined`.
    pub fn byte_size(self) -> Option<usize> {
        match self.bits()? {
            b if b >= 8 => Some(b / 8),
            _ => None,
        }
    }

    /// Bits of one element: 2 and 4 for the packed types, `None` for strings and `Undefined`.
    pub fn bits(self) -> Option<usize> {
        use ElementType::*;
        Some(match self {
            Uint2 | Int2 => 2,
            Uint4 | Int4 | Float4E2M1 => 4,
            Bool | Uint8 | Int8 | Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ
            | Float8E8M0 => 8,
            Uint16 | Int16 | Float16 | Bfloat16 => 16,
            Float | Int32 | Uint32 => 32,
            Double | Int64 | Uint64 | Complex64 => 64,
            Complex128 => 128,
            Undefined | String => return None,
        })
    }

    /// Bytes that `count` elements occupy. Types narrower than a byte are packed as ONNX and
    /// DLPack pack them: the first element in the lowest bits of the first byte, the last byte
    /// padded with zero bits. `None` for strings, `Undefined`, or on overflow.
    pub fn storage_bytes(self, count: usize) -> Option<usize> {
        let bits = self.bits()?;
        if bits >= 8 {
            count.checked_mul(bits / 8)
        } else {
            Some(count.div_ceil(8 / bits))
        }
    }

    /// The ABI minor version (of major 1) from which tensors of this type cross the ABI: the
    /// host does not offer nodes that touch such values to a plugin built for an older one.
    pub fn since_abi_minor(self) -> u32 {
        use ElementType::*;
        match self {
            Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ | Float8E8M0 | Uint4
            | Int4 | Float4E2M1 | Uint2 | Int2 => 2,
            String => 3,
            _ => 0,
        }
    }

    /// The name ONNX's type strings use (`float`, `double`, `int64`, `string`, ...), as in
    /// ONNX Runtime's `tensor(float)`.
    pub fn onnx_name(self) -> &'static str {
        match self {
            ElementType::Float => "float",
            ElementType::Double => "double",
            other => other.name(),
        }
    }

    /// The lower-case name ONNX and numpy users know (`float32`, `int64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        use ElementType::*;
        match self {
            Undefined => "undefined",
            Float => "float32",
            Uint8 => "uint8",
            Int8 => "int8",
            Uint16 => "uint16",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            String => "string",
            Bool => "bool",
            Float16 => "float16",
            Double => "float64",
            Uint32 => "uint32",
            Uint64 => "uint64",
            Complex64 => "complex64",
            Complex128 => "complex128",
            Bfloat16 => "bfloat16",
            Float8E4M3FN => "float8e4m3fn",
            Float8E4M3FNUZ => "float8e4m3fnuz",
            Float8E5M2 => "float8e5m2",
            Float8E5M2FNUZ => "float8e5m2fnuz",
            Uint4 => "uint4",
            Int4 => "int4",
            Float4E2M1 => "float4e2m1",
            Float8E8M0 => "float8e8m0",
            Uint2 => "uint2",
            Int2 => "int2",
        }
    }

    /// The DLPack data type for this element type, where DLPack has one.
    pub fn to_dlpack(self) -> Option<DLDataType> {
        use DLDataTypeCode as C;
        use ElementType::*;
        let (code, bits) = match self {
            Float => (C::Float, 32),
            Double => (C::Float, 64),
            Float16 => (C::Float, 16),
            Bfloat16 => (C::Bfloat, 16),
            Uint8 => (C::UInt, 8),
            Uint16 => (C::UInt, 16),
            Uint32 => (C::UInt, 32),
            Uint64 => (C::UInt, 64),
            Int8 => (C::Int, 8),
            Int16 => (C::Int, 16),
            Int32 => (C::Int, 32),
            Int64 => (C::Int, 64),
            Bool => (C::Bool, 8),
            Complex64 => (C::Complex, 64),
            Complex128 => (C::Complex, 128),
            Float8E4M3FN => (C::Float8E4M3FN, 8),
            Float8E4M3FNUZ => (C::Float8E4M3FNUZ, 8),
            Float8E5M2 => (C::Float8E5M2, 8),
            Float8E5M2FNUZ => (C::Float8E5M2FNUZ, 8),
            Float8E8M0 => (C::Float8E8M0FNU, 8),
            Float4E2M1 => (C::Float4E2M1FN, 4),
            Uint4 => (C::UInt, 4),
            Int4 => (C::Int, 4),
            Uint2 => (C::UInt, 2),
            Int2 => (C::Int, 2),
            Undefined | String => return None,
        };
        Some(DLDataType {
            code: code as u8,
            bits,
            lanes: 1,
        })
    }

    /// The element type a DLPack data type denotes, if any (vector lanes are not supported).
    pub fn from_dlpack(dt: DLDataType) -> Option<Self> {
        use ElementType::*;
        if dt.lanes != 1 {
            return None;
        }
        const INT: u8 = DLDataTypeCode::Int as u8;
        const UINT: u8 = DLDataTypeCode::UInt as u8;
        const FLOAT: u8 = DLDataTypeCode::Float as u8;
        const BFLOAT: u8 = DLDataTypeCode::Bfloat as u8;
        const BOOL: u8 = DLDataTypeCode::Bool as u8;
        const COMPLEX: u8 = DLDataTypeCode::Complex as u8;
        const E4M3FN: u8 = DLDataTypeCode::Float8E4M3FN as u8;
        const E4M3FNUZ: u8 = DLDataTypeCode::Float8E4M3FNUZ as u8;
        const E5M2: u8 = DLDataTypeCode::Float8E5M2 as u8;
        const E5M2FNUZ: u8 = DLDataTypeCode::Float8E5M2FNUZ as u8;
        const E8M0: u8 = DLDataTypeCode::Float8E8M0FNU as u8;
        const E2M1: u8 = DLDataTypeCode::Float4E2M1FN as u8;
        Some(match (dt.code, dt.bits) {
            (FLOAT, 32) => Float,
            (FLOAT, 64) => Double,
            (FLOAT, 16) => Float16,
            (BFLOAT, 16) => Bfloat16,
            (UINT, 8) => Uint8,
            (UINT, 16) => Uint16,
            (UINT, 32) => Uint32,
            (UINT, 64) => Uint64,
            (INT, 8) => Int8,
            (INT, 16) => Int16,
            (INT, 32) => Int32,
            (INT, 64) => Int64,
            (BOOL, 8) => Bool,
            (COMPLEX, 64) => Complex64,
            (COMPLEX, 128) => Complex128,
            (E4M3FN, 8) => Float8E4M3FN,
            (E4M3FNUZ, 8) => Float8E4M3FNUZ,
            (E5M2, 8) => Float8E5M2,
            (E5M2FNUZ, 8) => Float8E5M2FNUZ,
            (E8M0, 8) => Float8E8M0,
            (E2M1, 4) => Float4E2M1,
            (UINT, 4) => Uint4,
            (INT, 4) => Int4,
            (UINT, 2) => Uint2,
            (INT, 2) => Int2,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_codes_round_trip() {
        for (i, t) in ElementType::ALL.iter().enumerate() {
            assert_eq!(t.onnx_code() as usize, i);
            assert_eq!(ElementType::from_onnx(i as i32), Some(*t));
        }
        assert_eq!(ElementType::from_onnx(-1), None);
        assert_eq!(ElementType::from_onnx(27), None);
    }

    #[test]
    fn dlpack_round_trip() {
        for t in ElementType::ALL {
            if let Some(dl) = t.to_dlpack() {
                assert_eq!(ElementType::from_dlpack(dl), Some(t), "{t}");
                assert_eq!(Some(usize::from(dl.bits)), t.bits(), "{t}");
            }
        }
    }

    #[test]
    fn packed_types_round_up_to_whole_bytes() {
        assert_eq!(ElementType::Int4.storage_bytes(5), Some(3));
        assert_eq!(ElementType::Uint2.storage_bytes(5), Some(2));
        assert_eq!(ElementType::Uint2.storage_bytes(0), Some(0));
        assert_eq!(ElementType::Float.storage_bytes(3), Some(12));
        assert_eq!(ElementType::Double.storage_bytes(usize::MAX), None);
        assert_eq!(ElementType::String.storage_bytes(1), None);
        assert_eq!(ElementType::Int4.byte_size(), None);
        assert_eq!(ElementType::Float8E8M0.byte_size(), Some(1));
    }
}
