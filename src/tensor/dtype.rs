//! The element types found in RL dumps, their sizes and torch names.

use std::fmt;

/// Element types found in RL dumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
    U16,
    U32,
    /// Values above `i64::MAX` saturate in [`super::Tensor::to_i64_vec`]; [`super::Tensor::element_bytes`]
    /// keeps them exactly.
    U64,
    /// The float8 formats, decoded to f64 exactly.
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F8E8M0FNU,
    /// Two float4 (e2m1) values packed in a byte; kept as raw bytes (read as the byte).
    F4E2M1FNX2,
    /// Complex numbers of two f16 / f32 / f64 parts: conversions yield `re, im` pairs.
    C32,
    C64,
    C128,
    /// Untyped bit containers, read as the unsigned integer of their bits.
    Bits8,
    Bits16,
    Bits1x8,
    Bits2x4,
    Bits4x2,
    /// Quantized integers, read as their integer representation (`int_repr()`); the
    /// scale and zero point are in [`super::Tensor::quantization`].
    QInt8,
    QUInt8,
    QInt32,
    QUInt4x2,
    QUInt2x4,
}

/// Every dtype, for name lookups.
const ALL_DTYPES: [DType; 32] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U8,
    DType::Bool,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::F8E4M3FN,
    DType::F8E4M3FNUZ,
    DType::F8E5M2,
    DType::F8E5M2FNUZ,
    DType::F8E8M0FNU,
    DType::F4E2M1FNX2,
    DType::C32,
    DType::C64,
    DType::C128,
    DType::Bits8,
    DType::Bits16,
    DType::Bits1x8,
    DType::Bits2x4,
    DType::Bits4x2,
    DType::QInt8,
    DType::QUInt8,
    DType::QInt32,
    DType::QUInt4x2,
    DType::QUInt2x4,
];

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 | DType::C64 => 8,
            DType::F32 | DType::I32 | DType::U32 | DType::C32 | DType::QInt32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 | DType::Bits16 => 2,
            DType::C128 => 16,
            DType::I8
            | DType::U8
            | DType::Bool
            | DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0FNU
            | DType::F4E2M1FNX2
            | DType::Bits8
            | DType::Bits1x8
            | DType::Bits2x4
            | DType::Bits4x2
            | DType::QInt8
            | DType::QUInt8
            | DType::QUInt4x2
            | DType::QUInt2x4 => 1,
        }
    }

    /// True for real floating-point dtypes (float8 included: they decode exactly).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64
                | DType::F32
                | DType::F16
                | DType::BF16
                | DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F8E8M0FNU
        )
    }

    /// True for complex dtypes, whose conversions yield two f64 (re, im) per element.
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C32 | DType::C64 | DType::C128)
    }

    /// True for dtypes whose elements are not numbers of their own (packed float4, bit
    /// containers): they read as the unsigned integer of their bytes.
    pub fn is_raw(self) -> bool {
        matches!(
            self,
            DType::F4E2M1FNX2
                | DType::Bits8
                | DType::Bits16
                | DType::Bits1x8
                | DType::Bits2x4
                | DType::Bits4x2
        )
    }

    /// True for quantized dtypes (read as their integer representation).
    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            DType::QInt8 | DType::QUInt8 | DType::QInt32 | DType::QUInt4x2 | DType::QUInt2x4
        )
    }

    /// The name torch prints (`torch.bfloat16` without the prefix).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::Bool => "bool",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E4M3FNUZ => "float8_e4m3fnuz",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E5M2FNUZ => "float8_e5m2fnuz",
            DType::F8E8M0FNU => "float8_e8m0fnu",
            DType::F4E2M1FNX2 => "float4_e2m1fn_x2",
            DType::C32 => "complex32",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
            DType::Bits8 => "bits8",
            DType::Bits16 => "bits16",
            DType::Bits1x8 => "bits1x8",
            DType::Bits2x4 => "bits2x4",
            DType::Bits4x2 => "bits4x2",
            DType::QInt8 => "qint8",
            DType::QUInt8 => "quint8",
            DType::QInt32 => "qint32",
            DType::QUInt4x2 => "quint4x2",
            DType::QUInt2x4 => "quint2x4",
        }
    }

    /// Parse a torch dtype name, with or without the `torch.` prefix (`"torch.bfloat16"`).
    pub fn from_torch_name(name: &str) -> Option<DType> {
        let n = name.strip_prefix("torch.").unwrap_or(name);
        Some(match n {
            "float64" | "double" => DType::F64,
            "float32" | "float" => DType::F32,
            "float16" | "half" => DType::F16,
            "bfloat16" => DType::BF16,
            "int64" | "long" => DType::I64,
            "int32" | "int" => DType::I32,
            "int16" | "short" => DType::I16,
            "int8" => DType::I8,
            "uint8" => DType::U8,
            "bool" => DType::Bool,
            "complex64" | "cfloat" => DType::C64,
            "complex128" | "cdouble" => DType::C128,
            "complex32" | "chalf" => DType::C32,
            _ => return ALL_DTYPES.into_iter().find(|d| d.torch_name() == n),
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}
