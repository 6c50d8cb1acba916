//! Little-endian elements of every dtype to f64 / i64: contiguous runs and single
//! elements (fp8 formats included), exact for every float dtype.

use half::{bf16, f16};

use super::DType;

/// Decode a contiguous run of little-endian `dtype` elements to f64.
pub(super) fn decode_run_f64(dtype: DType, run: &[u8]) -> Vec<f64> {
    let mut out = Vec::new();
    decode_run_f64_into(dtype, run, &mut out);
    out
}

/// [`decode_run_f64`] into `out` (replacing its contents, reusing its allocation; the
/// exact-length iterators fill it without zeroing it first). Exact for every float dtype.
pub(crate) fn decode_run_f64_into(dtype: DType, run: &[u8], out: &mut Vec<f64>) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { decode_run_f64_avx2(dtype, run, out) };
    }
    decode_run_f64_body(dtype, run, out)
}

/// [`decode_run_f64_body`] compiled for AVX2 (the widening loops vectorise 4–8 lanes wide;
/// the same IEEE conversions, so the same values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_run_f64_avx2(dtype: DType, run: &[u8], out: &mut Vec<f64>) {
    decode_run_f64_body(dtype, run, out)
}

/// bf16 bits to f64: the bf16 is the upper half of an f32, widened exactly. The same bits
/// as `half::bf16::to_f64` for every input (a NaN keeps its payload and gets the quiet
/// bit either way), in a form that vectorises.
#[inline(always)]
fn bf16_bits_to_f64(bits: u16) -> f64 {
    f32::from_bits((bits as u32) << 16) as f64
}

#[inline(always)]
fn decode_run_f64_body(dtype: DType, run: &[u8], out: &mut Vec<f64>) {
    out.clear();
    macro_rules! conv {
        ($n:literal, $f:expr) => {
            out.extend(run.chunks_exact($n).map(|c| $f(arr::<$n>(c))))
        };
    }
    match dtype {
        DType::F64 => conv!(8, f64::from_le_bytes),
        DType::F32 => conv!(4, |b| f32::from_le_bytes(b) as f64),
        DType::F16 => conv!(2, |b| f16::from_le_bytes(b).to_f64()),
        DType::BF16 => conv!(2, |b| bf16_bits_to_f64(u16::from_le_bytes(b))),
        DType::I64 => conv!(8, |b| i64::from_le_bytes(b) as f64),
        DType::I32 => conv!(4, |b| i32::from_le_bytes(b) as f64),
        DType::I16 => conv!(2, |b| i16::from_le_bytes(b) as f64),
        DType::I8 => out.extend(run.iter().map(|&b| b as i8 as f64)),
        DType::U8 => out.extend(run.iter().map(|&b| b as f64)),
        DType::Bool => out.extend(run.iter().map(|&b| (b != 0) as u8 as f64)),
        d => {
            let n = run.len() / d.size() * if d.is_complex() { 2 } else { 1 };
            out.reserve(n);
            run.chunks_exact(d.size())
                .for_each(|c| push_elem_f64(d, c, out));
        }
    }
}

/// Append one element (its `dtype.size()` bytes) as f64: one value, or `re, im` for complex.
pub(super) fn push_elem_f64(dtype: DType, b: &[u8], out: &mut Vec<f64>) {
    let half = dtype.size() / 2;
    match dtype {
        DType::C32 | DType::C64 | DType::C128 => {
            let part = match dtype {
                DType::C32 => DType::F16,
                DType::C64 => DType::F32,
                _ => DType::F64,
            };
            out.push(elem_f64(part, &b[..half]));
            out.push(elem_f64(part, &b[half..]));
        }
        _ => out.push(elem_f64(dtype, b)),
    }
}

/// One element as f64: exact for real floats (float8 included); integers, raw bytes and
/// quantized integers as their value; the real part of a complex.
pub(super) fn elem_f64(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F64 => f64::from_le_bytes(arr(b)),
        DType::F32 => f32::from_le_bytes(arr(b)) as f64,
        DType::F16 => f16::from_le_bytes(arr(b)).to_f64(),
        DType::BF16 => bf16::from_le_bytes(arr(b)).to_f64(),
        DType::F8E4M3FN => f8_to_f64(b[0], 4, 3, 7, F8Special::FiniteOnly),
        DType::F8E4M3FNUZ => f8_to_f64(b[0], 4, 3, 8, F8Special::Unsigned0x80),
        DType::F8E5M2 => f8_to_f64(b[0], 5, 2, 15, F8Special::Ieee),
        DType::F8E5M2FNUZ => f8_to_f64(b[0], 5, 2, 16, F8Special::Unsigned0x80),
        DType::F8E8M0FNU => match b[0] {
            0xff => f64::NAN,
            e => 2f64.powi(e as i32 - 127),
        },
        DType::C32 => elem_f64(DType::F16, &b[..2]),
        DType::C64 => elem_f64(DType::F32, &b[..4]),
        DType::C128 => elem_f64(DType::F64, &b[..8]),
        DType::U64 => u64::from_le_bytes(arr(b)) as f64,
        d => elem_i64(d, b).unwrap_or_default() as f64,
    }
}

/// One element as i64 for integer, bool, raw and quantized dtypes (u64 above `i64::MAX`
/// saturates); `None` for float and complex dtypes.
pub(super) fn elem_i64(dtype: DType, b: &[u8]) -> Option<i64> {
    Some(match dtype {
        DType::I64 => i64::from_le_bytes(arr(b)),
        DType::I32 | DType::QInt32 => i32::from_le_bytes(arr(b)) as i64,
        DType::I16 => i16::from_le_bytes(arr(b)) as i64,
        DType::I8 | DType::QInt8 => b[0] as i8 as i64,
        DType::Bool => (b[0] != 0) as i64,
        DType::U16 | DType::Bits16 => u16::from_le_bytes(arr(b)) as i64,
        DType::U32 => u32::from_le_bytes(arr(b)) as i64,
        DType::U64 => i64::try_from(u64::from_le_bytes(arr(b))).unwrap_or(i64::MAX),
        DType::U8
        | DType::QUInt8
        | DType::QUInt4x2
        | DType::QUInt2x4
        | DType::F4E2M1FNX2
        | DType::Bits8
        | DType::Bits1x8
        | DType::Bits2x4
        | DType::Bits4x2 => b[0] as i64,
        _ => return None,
    })
}

/// Which codes of a float8 format are not ordinary numbers.
#[derive(Clone, Copy)]
enum F8Special {
    /// IEEE-like: all-ones exponent is ±inf (mantissa 0) or NaN (e5m2).
    Ieee,
    /// No infinities; only all-ones exponent and mantissa is NaN (e4m3fn).
    FiniteOnly,
    /// No infinities, no negative zero: 0x80 alone is NaN (the `fnuz` formats).
    Unsigned0x80,
}

/// Decode a float8 code exactly: 1 sign bit, `e` exponent bits, `m` mantissa bits, `bias`.
fn f8_to_f64(code: u8, e: u32, m: u32, bias: i32, special: F8Special) -> f64 {
    let exp_max = (1u32 << e) - 1;
    let man_max = (1u32 << m) - 1;
    let neg = code & 0x80 != 0;
    let exp = (code as u32 >> m) & exp_max;
    let man = code as u32 & man_max;
    match special {
        F8Special::Ieee if exp == exp_max => {
            return match (man, neg) {
                (0, false) => f64::INFINITY,
                (0, true) => f64::NEG_INFINITY,
                _ => f64::NAN,
            }
        }
        F8Special::FiniteOnly if exp == exp_max && man == man_max => return f64::NAN,
        F8Special::Unsigned0x80 if code == 0x80 => return f64::NAN,
        _ => {}
    }
    let mag = if exp == 0 {
        man as f64 * 2f64.powi(1 - bias - m as i32)
    } else {
        ((1u32 << m) + man) as f64 * 2f64.powi(exp as i32 - bias - m as i32)
    };
    if neg {
        -mag
    } else {
        mag
    }
}

/// Decode a contiguous run of storage bytes of `dtype` to i64 (floats truncate toward zero,
/// as [`Tensor::to_i64_vec`] documents).
pub(super) fn decode_run_i64(dtype: DType, run: &[u8]) -> Vec<i64> {
    macro_rules! conv {
        ($n:literal, $f:expr) => {
            run.chunks_exact($n).map(|c| $f(arr::<$n>(c))).collect()
        };
    }
    match dtype {
        DType::I64 => conv!(8, i64::from_le_bytes),
        DType::I32 => conv!(4, |b| i32::from_le_bytes(b) as i64),
        DType::I16 => conv!(2, |b| i16::from_le_bytes(b) as i64),
        DType::I8 => run.iter().map(|&b| b as i8 as i64).collect(),
        DType::U8 => run.iter().map(|&b| b as i64).collect(),
        DType::Bool => run.iter().map(|&b| (b != 0) as i64).collect(),
        d if elem_i64(d, &[0; 16][..d.size()]).is_some() => run
            .chunks_exact(d.size())
            .map(|c| elem_i64(d, c).unwrap_or_default())
            .collect(),
        _ => decode_run_f64(dtype, run)
            .into_iter()
            .map(|v| v as i64)
            .collect(),
    }
}

/// Copy a slice into a fixed-size array; callers slice exactly `N` bytes.
pub(super) fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_widening_matches_half_bit_for_bit() {
        // Every bf16: zeros, subnormals, normals, infinities, quiet and signalling NaNs.
        for bits in 0..=u16::MAX {
            let want = bf16::from_bits(bits).to_f64().to_bits();
            assert_eq!(bf16_bits_to_f64(bits).to_bits(), want, "{bits:#06x}");
        }
        let run: Vec<u8> = [0x3f80u16, 0x7fc1, 0x8001]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        let mut out = Vec::new();
        decode_run_f64_into(DType::BF16, &run, &mut out);
        let got: Vec<u64> = out.iter().map(|v| v.to_bits()).collect();
        let want: Vec<u64> = [0x3f80u16, 0x7fc1, 0x8001]
            .iter()
            .map(|&b| bf16::from_bits(b).to_f64().to_bits())
            .collect();
        assert_eq!(got, want);
    }
}
