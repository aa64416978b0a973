//! Element types. The set is ONNX's (IR version 14), so that every tensor a model can carry has a
//! name here; which of them the evaluator computes with is decided per op.

use std::fmt;

/// An element type. Sub-byte types (`I4`, `U4`, `F4E2M1`, `I2`, `U2`) pack two (four) elements per
/// byte, element 2k in the low bits, as ONNX stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F8E8M0,
    F4E2M1,
    F6E2M3,
    F6E3M2,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    I4,
    U4,
    I2,
    U2,
    Bool,
    Str,
    C64,
    C128,
}

impl DType {
    /// The ONNX `TensorProto.DataType` code of this type.
    pub fn onnx_code(self) -> i32 {
        use DType::*;
        match self {
            F32 => 1,
            U8 => 2,
            I8 => 3,
            U16 => 4,
            I16 => 5,
            I32 => 6,
            I64 => 7,
            Str => 8,
            Bool => 9,
            F16 => 10,
            F64 => 11,
            U32 => 12,
            U64 => 13,
            C64 => 14,
            C128 => 15,
            BF16 => 16,
            F8E4M3FN => 17,
            F8E4M3FNUZ => 18,
            F8E5M2 => 19,
            F8E5M2FNUZ => 20,
            U4 => 21,
            I4 => 22,
            F4E2M1 => 23,
            F8E8M0 => 24,
            U2 => 25,
            I2 => 26,
            F6E2M3 => 27,
            F6E3M2 => 28,
        }
    }

    /// The type for an ONNX `TensorProto.DataType` code; `None` for 0 (UNDEFINED) and unknown codes.
    pub fn from_onnx_code(code: i32) -> Option<DType> {
        use DType::*;
        Some(match code {
            1 => F32,
            2 => U8,
            3 => I8,
            4 => U16,
            5 => I16,
            6 => I32,
            7 => I64,
            8 => Str,
            9 => Bool,
            10 => F16,
            11 => F64,
            12 => U32,
            13 => U64,
            14 => C64,
            15 => C128,
            16 => BF16,
            17 => F8E4M3FN,
            18 => F8E4M3FNUZ,
            19 => F8E5M2,
            20 => F8E5M2FNUZ,
            21 => U4,
            22 => I4,
            23 => F4E2M1,
            24 => F8E8M0,
            25 => U2,
            26 => I2,
            27 => F6E2M3,
            28 => F6E3M2,
            _ => return None,
        })
    }

    /// Storage bits per element (sub-byte types pack several elements per byte).
    pub fn bits(self) -> u64 {
        use DType::*;
        match self {
            F64 | I64 | U64 | C64 => 64,
            C128 => 128,
            F32 | I32 | U32 => 32,
            F16 | BF16 | I16 | U16 => 16,
            F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | I8 | U8 | Bool => 8,
            F6E2M3 | F6E3M2 => 6,
            I4 | U4 | F4E2M1 => 4,
            I2 | U2 => 2,
            // Strings have no fixed size; callers never ask for their byte size.
            Str => 0,
        }
    }

    /// Bytes needed to store `numel` elements, rounding sub-byte packing up; `None` on overflow.
    pub fn storage_bytes(self, numel: u64) -> Option<u64> {
        numel.checked_mul(self.bits()).map(|b| b.div_ceil(8))
    }

    pub fn is_float(self) -> bool {
        use DType::*;
        matches!(
            self,
            F32 | F64 | F16 | BF16 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F4E2M1 | F6E2M3 | F6E3M2
        )
    }

    pub fn is_int(self) -> bool {
        use DType::*;
        matches!(self, I8 | U8 | I16 | U16 | I32 | U32 | I64 | U64 | I4 | U4 | I2 | U2)
    }

    pub fn is_signed_int(self) -> bool {
        use DType::*;
        matches!(self, I8 | I16 | I32 | I64 | I4 | I2)
    }

    /// Inclusive value range of an integer type (bool counts as 0..=1).
    pub fn int_range(self) -> Option<(i64, i64)> {
        use DType::*;
        Some(match self {
            I8 => (i8::MIN as i64, i8::MAX as i64),
            U8 => (0, u8::MAX as i64),
            I16 => (i16::MIN as i64, i16::MAX as i64),
            U16 => (0, u16::MAX as i64),
            I32 => (i32::MIN as i64, i32::MAX as i64),
            U32 => (0, u32::MAX as i64),
            I64 | U64 => (i64::MIN, i64::MAX),
            I4 => (-8, 7),
            U4 => (0, 15),
            I2 => (-2, 1),
            U2 => (0, 3),
            Bool => (0, 1),
            _ => return None,
        })
    }

    /// The short name the printer uses.
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "f32",
            F64 => "f64",
            F16 => "f16",
            BF16 => "bf16",
            F8E4M3FN => "f8e4m3fn",
            F8E4M3FNUZ => "f8e4m3fnuz",
            F8E5M2 => "f8e5m2",
            F8E5M2FNUZ => "f8e5m2fnuz",
            F8E8M0 => "f8e8m0",
            F4E2M1 => "f4e2m1",
            F6E2M3 => "f6e2m3",
            F6E3M2 => "f6e3m2",
            I8 => "i8",
            U8 => "u8",
            I16 => "i16",
            U16 => "u16",
            I32 => "i32",
            U32 => "u32",
            I64 => "i64",
            U64 => "u64",
            I4 => "i4",
            U4 => "u4",
            I2 => "i2",
            U2 => "u2",
            Bool => "bool",
            Str => "str",
            C64 => "c64",
            C128 => "c128",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
