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
}

impl ElementType {
    /// Every element type, in code order.
    pub const ALL: [ElementType; 24] = [
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
        use ElementType::*;
        Some(match self {
            Bool | Uint8 | Int8 | Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ => 1,
            Uint16 | Int16 | Float16 | Bfloat16 => 2,
            Float | Int32 | Uint32 => 4,
            Double | Int64 | Uint64 | Complex64 => 8,
            Complex128 => 16,
            Undefined | String | Uint4 | Int4 | Float4E2M1 => return None,
        })
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
            _ => return None,
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
        assert_eq!(ElementType::from_onnx(24), None);
    }

    #[test]
    fn dlpack_round_trip() {
        for t in ElementType::ALL {
            if let Some(dl) = t.to_dlpack() {
                assert_eq!(ElementType::from_dlpack(dl), Some(t), "{t}");
                assert_eq!(usize::from(dl.bits) / 8, t.byte_size().unwrap(), "{t}");
            }
        }
    }
}
