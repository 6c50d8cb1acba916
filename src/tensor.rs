//! The one in-memory tensor type every reader returns: a typed, strided view over
//! little-endian storage bytes that may be shared (views of one `torch` storage) and may
//! be memory-mapped (no copy of a `.pt` member or `.safetensors` payload).
//!
//! Conversions to f64 are exact for every float dtype and for integers up to 2^53; use
//! [`Tensor::to_i64_vec`] for integer tensors (token ids, masks) to keep them exact.

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

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
    /// Values above `i64::MAX` saturate in [`Tensor::to_i64_vec`]; [`Tensor::element_bytes`]
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
    /// scale and zero point are in [`Tensor::quantization`].
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

/// Immutable bytes shared between tensors: an owned buffer or a memory map, plus a window.
#[derive(Clone)]
pub struct Bytes {
    buf: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl Bytes {
    /// Own a buffer.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Bytes {
            buf: Arc::new(v),
            start: 0,
            len,
        }
    }

    /// A window `[start, start+len)` of a shared buffer (e.g. a memory-mapped file);
    /// `None` when the window does not fit in the buffer.
    pub fn window(
        buf: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        len: usize,
    ) -> Option<Self> {
        let total = (*buf).as_ref().len();
        let end = start.checked_add(len)?;
        (end <= total).then_some(Bytes { buf, start, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.buf).as_ref()[self.start..self.start + self.len]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-window `[start, start+len)` of these bytes; `None` when it does not fit.
    pub fn slice(&self, start: usize, len: usize) -> Option<Bytes> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| Bytes {
            buf: self.buf.clone(),
            start: self.start + start,
            len,
        })
    }

    /// True when `self` and `other` are windows of the same buffer (one torch storage).
    pub fn same_buffer(&self, other: &Bytes) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.buf), Arc::as_ptr(&other.buf))
            && self.start == other.start
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.len)
    }
}

/// Expanded views (stride 0) may have more elements than their storage; this many bytes
/// of f64 is the most such a view may claim, so a forged shape cannot make us allocate.
const MAX_EXPANDED_F64_BYTES: usize = 256 << 20;

/// Why a tensor could not be built from a header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("shape {shape:?} and strides {strides:?} have different ranks")]
    RankMismatch {
        shape: Vec<usize>,
        strides: Vec<usize>,
    },
    #[error("shape {shape:?} overflows the address space")]
    Overflow { shape: Vec<usize> },
    #[error(
        "view (shape {shape:?}, strides {strides:?}, offset {offset}) reaches element {needed} \
         but the storage holds {available} elements"
    )]
    OutOfBounds {
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        needed: usize,
        available: usize,
    },
    #[error(
        "view of {numel} elements over a storage of {available} elements is too large to expand"
    )]
    TooLarge { numel: usize, available: usize },
    #[error("storage of {bytes} bytes is not a whole number of {dtype} elements")]
    Ragged { bytes: usize, dtype: DType },
    #[error("{0}")]
    Other(String),
}

/// A strided view of typed, little-endian storage.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
    storage: Bytes,
    storage_key: Option<String>,
    quant: Option<Arc<Quantization>>,
}

/// How a quantized tensor's integers map to real values (`torch.q_scale()` and friends).
#[derive(Debug, Clone, PartialEq)]
pub struct Quantization {
    /// The qscheme name, e.g. `per_tensor_affine`, `per_channel_affine`.
    pub scheme: String,
    /// One scale (per tensor) or one per channel along `axis`.
    pub scales: Vec<f64>,
    /// One zero point (per tensor) or one per channel along `axis` (integers, except
    /// for `per_channel_affine_float_qparams`).
    pub zero_points: Vec<f64>,
    /// The channel axis of per-channel schemes.
    pub axis: Option<usize>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("storage_key", &self.storage_key)
            .finish()
    }
}

/// Row-major (C-contiguous) strides for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

impl Tensor {
    /// A view over `storage` (little-endian `dtype` elements) with element `strides` and
    /// element `offset`. Refuses any view that reaches past the storage, and expanded
    /// views whose element count would make conversions allocate without bound.
    pub fn from_parts(
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        storage: Bytes,
        storage_key: Option<String>,
    ) -> Result<Tensor, TensorError> {
        if shape.len() != strides.len() {
            return Err(TensorError::RankMismatch { shape, strides });
        }
        if !storage.len().is_multiple_of(dtype.size()) {
            return Err(TensorError::Ragged {
                bytes: storage.len(),
                dtype,
            });
        }
        let available = storage.len() / dtype.size();
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| TensorError::Overflow {
                shape: shape.clone(),
            })?;
        if numel == 0 {
            if offset > available {
                return Err(TensorError::OutOfBounds {
                    shape,
                    strides,
                    offset,
                    needed: offset,
                    available,
                });
            }
        } else {
            let mut last = offset;
            for (&d, &s) in shape.iter().zip(&strides) {
                let step = (d - 1).checked_mul(s).and_then(|x| last.checked_add(x));
                last = step.ok_or_else(|| TensorError::Overflow {
                    shape: shape.clone(),
                })?;
            }
            if last >= available {
                return Err(TensorError::OutOfBounds {
                    shape,
                    strides,
                    offset,
                    needed: last + 1,
                    available,
                });
            }
            if numel > available && numel.saturating_mul(8) > MAX_EXPANDED_F64_BYTES {
                return Err(TensorError::TooLarge { numel, available });
            }
        }
        Ok(Tensor {
            dtype,
            shape,
            strides,
            offset,
            storage,
            storage_key,
            quant: None,
        })
    }

    /// The same tensor marked as quantized with `q` (its elements stay the integers).
    pub fn with_quantization(mut self, q: Quantization) -> Tensor {
        self.quant = Some(Arc::new(q));
        self
    }

    /// Scale and zero point(s) of a quantized tensor.
    pub fn quantization(&self) -> Option<&Quantization> {
        self.quant.as_deref()
    }

    /// The same elements seen as `dtype` of the same size (a bit reinterpretation, as
    /// `_rebuild_tensor_v3` gives an untyped storage its dtype); `None` on a size mismatch.
    pub fn reinterpret(mut self, dtype: DType) -> Option<Tensor> {
        (dtype.size() == self.dtype.size()).then(|| {
            self.dtype = dtype;
            self
        })
    }

    /// A contiguous tensor owning `bytes` (little-endian elements of `dtype`).
    pub fn from_le_bytes(
        dtype: DType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    ) -> Result<Tensor, TensorError> {
        let strides = contiguous_strides(&shape);
        Tensor::from_parts(dtype, shape, strides, 0, Bytes::from_vec(bytes), None)
    }

    /// A contiguous f64 tensor.
    pub fn from_f64(shape: Vec<usize>, values: &[f64]) -> Result<Tensor, TensorError> {
        check_len(&shape, values.len())?;
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_le_bytes(DType::F64, shape, bytes)
    }

    /// A contiguous i64 tensor.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Result<Tensor, TensorError> {
        check_len(&shape, values.len())?;
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_le_bytes(DType::I64, shape, bytes)
    }

    /// A contiguous bool tensor.
    pub fn from_bool(shape: Vec<usize>, values: &[bool]) -> Result<Tensor, TensorError> {
        check_len(&shape, values.len())?;
        let bytes = values.iter().map(|&b| b as u8).collect();
        Tensor::from_le_bytes(DType::Bool, shape, bytes)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Offset of the first element into the storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The storage's name in its file (`data/3` key of a `.pt`), when it has one.
    pub fn storage_key(&self) -> Option<&str> {
        self.storage_key.as_deref()
    }

    /// Number of elements in the whole storage this view looks into.
    pub fn storage_numel(&self) -> usize {
        self.storage.len() / self.dtype.size()
    }

    /// True when `self` and `other` look into the same storage bytes.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        self.storage.same_buffer(&other.storage)
    }

    /// Number of elements in the view.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// True when the view is row-major contiguous (its elements are one run of storage).
    pub fn is_contiguous(&self) -> bool {
        let want = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(self.strides.iter().zip(&want))
            .all(|(&d, (&s, &w))| d <= 1 || s == w)
    }

    /// Bytes of the whole storage.
    pub fn storage_bytes(&self) -> &[u8] {
        self.storage.as_slice()
    }

    /// Storage indices of the view's elements, in row-major logical order.
    fn for_each_index(&self, mut f: impl FnMut(usize)) {
        let n = self.numel();
        if n == 0 {
            return;
        }
        if self.is_contiguous() {
            (self.offset..self.offset + n).for_each(f);
            return;
        }
        let nd = self.shape.len();
        let mut idx = vec![0usize; nd];
        let mut pos = self.offset;
        for _ in 0..n {
            f(pos);
            for d in (0..nd).rev() {
                idx[d] += 1;
                pos += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                pos -= self.strides[d] * self.shape[d];
                idx[d] = 0;
            }
        }
    }

    /// The element at storage index `i`, widened to f64 (exact for all real float dtypes;
    /// a complex element gives its real part, callers wanting both use [`push_elem_f64`]).
    fn load_f64(&self, bytes: &[u8], i: usize) -> f64 {
        let s = self.dtype.size();
        elem_f64(self.dtype, &bytes[i * s..i * s + s])
    }

    /// The element at storage index `i` as i64 (floats truncate toward zero).
    fn load_i64(&self, bytes: &[u8], i: usize) -> i64 {
        let s = self.dtype.size();
        let b = &bytes[i * s..i * s + s];
        elem_i64(self.dtype, b).unwrap_or_else(|| elem_f64(self.dtype, b) as i64)
    }

    /// The view's elements' bytes in row-major order (little-endian, exactly as stored).
    pub fn element_bytes(&self) -> Vec<u8> {
        let bytes = self.storage.as_slice();
        let s = self.dtype.size();
        let mut out = Vec::with_capacity(self.numel() * s);
        self.for_each_index(|i| out.extend_from_slice(&bytes[i * s..i * s + s]));
        out
    }

    /// All elements in row-major order, widened to f64 (two per element, `re, im`, for
    /// complex dtypes).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let bytes = self.storage.as_slice();
        if self.is_contiguous() {
            // One dtype dispatch for the whole run of storage: the loops vectorise.
            let s = self.dtype.size();
            let run = &bytes[self.offset * s..(self.offset + self.numel()) * s];
            return decode_run_f64(self.dtype, run);
        }
        let (s, dtype) = (self.dtype.size(), self.dtype);
        let mut out = Vec::with_capacity(self.numel());
        self.for_each_index(|i| push_elem_f64(dtype, &bytes[i * s..i * s + s], &mut out));
        out
    }

    /// All elements in row-major order as i64 (exact for integer and bool dtypes; two per
    /// element for complex dtypes).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        if self.dtype.is_complex() {
            // Two per element, as `to_f64_vec`.
            return self.to_f64_vec().into_iter().map(|v| v as i64).collect();
        }
        let bytes = self.storage.as_slice();
        if self.is_contiguous() {
            // One dtype dispatch for the whole run, as in `to_f64_vec`.
            let s = self.dtype.size();
            let run = &bytes[self.offset * s..(self.offset + self.numel()) * s];
            return decode_run_i64(self.dtype, run);
        }
        let mut out = Vec::with_capacity(self.numel());
        self.for_each_index(|i| out.push(self.load_i64(bytes, i)));
        out
    }

    /// The single element of a 0-d or one-element tensor.
    pub fn scalar_f64(&self) -> Option<f64> {
        (self.numel() == 1 && !self.dtype.is_complex())
            .then(|| self.load_f64(self.storage.as_slice(), self.offset))
    }

    /// Row-major f64 ndarray with the tensor's shape (plus a last axis of 2, `re, im`, for
    /// complex dtypes, as `torch.view_as_real`).
    pub fn to_ndarray_f64(&self) -> ArrayD<f64> {
        let mut shape = self.shape.clone();
        if self.dtype.is_complex() {
            shape.push(2);
        }
        ArrayD::from_shape_vec(IxDyn(&shape), self.to_f64_vec())
            .expect("to_f64_vec returns numel (×2 for complex) elements in row-major order")
    }

    /// A candle tensor holding the same values. Float dtypes keep their dtype; dtypes
    /// candle lacks are widened losslessly (i8 → i16, bool → u8, u16 → u32, float8 → f32,
    /// raw and quantized bytes → their integers); complex and u64 are refused.
    pub fn to_candle(
        &self,
        device: &candle_core::Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        use candle_core::Tensor as CT;
        let shape = self.shape.clone();
        let bytes = self.storage.as_slice();
        let s = self.dtype.size();
        macro_rules! collect {
            ($conv:expr) => {{
                let mut v = Vec::with_capacity(self.numel());
                self.for_each_index(|i| v.push($conv(&bytes[i * s..i * s + s])));
                CT::from_vec(v, shape, device)
            }};
        }
        match self.dtype {
            DType::F64 => collect!(|b: &[u8]| f64::from_le_bytes(arr(b))),
            DType::F32 => collect!(|b: &[u8]| f32::from_le_bytes(arr(b))),
            DType::F16 => collect!(|b: &[u8]| f16::from_le_bytes(arr(b))),
            DType::BF16 => collect!(|b: &[u8]| bf16::from_le_bytes(arr(b))),
            DType::I64 => collect!(|b: &[u8]| i64::from_le_bytes(arr(b))),
            DType::I32 => collect!(|b: &[u8]| i32::from_le_bytes(arr(b))),
            DType::I16 => collect!(|b: &[u8]| i16::from_le_bytes(arr(b))),
            DType::I8 => collect!(|b: &[u8]| b[0] as i8 as i16),
            DType::U8 => collect!(|b: &[u8]| b[0]),
            DType::Bool => collect!(|b: &[u8]| (b[0] != 0) as u8),
            DType::U16 => collect!(|b: &[u8]| u16::from_le_bytes(arr(b)) as u32),
            DType::U32 => collect!(|b: &[u8]| u32::from_le_bytes(arr(b))),
            DType::QInt32 => collect!(|b: &[u8]| i32::from_le_bytes(arr(b))),
            DType::Bits16 => collect!(|b: &[u8]| u16::from_le_bytes(arr(b)) as u32),
            DType::QInt8 => collect!(|b: &[u8]| b[0] as i8 as i16),
            d if d.is_float() => collect!(|b: &[u8]| elem_f64(d, b) as f32),
            d if d.size() == 1 => collect!(|b: &[u8]| b[0]),
            d => candle_core::bail!("{d} has no exact candle dtype"),
        }
    }

    /// A copy with every element's bytes reversed (each part of a complex), for storages
    /// written big-endian.
    pub fn byteswapped_storage(bytes: &[u8], dtype: DType) -> Vec<u8> {
        // A complex number is two floats, each swapped on its own.
        let s = dtype.size() / if dtype.is_complex() { 2 } else { 1 };
        let mut out = bytes.to_vec();
        if s > 1 {
            out.chunks_exact_mut(s).for_each(|c| c.reverse());
        }
        out
    }
}

/// Decode a contiguous run of little-endian `dtype` elements to f64.
fn decode_run_f64(dtype: DType, run: &[u8]) -> Vec<f64> {
    let mut out = Vec::new();
    decode_run_f64_into(dtype, run, &mut out);
    out
}

/// [`decode_run_f64`] into `out` (replacing its contents, reusing its allocation; the
/// exact-length iterators fill it without zeroing it first). Exact for every float dtype.
pub(crate) fn decode_run_f64_into(dtype: DType, run: &[u8], out: &mut Vec<f64>) {
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
        DType::BF16 => conv!(2, |b| bf16::from_le_bytes(b).to_f64()),
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
fn push_elem_f64(dtype: DType, b: &[u8], out: &mut Vec<f64>) {
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
fn elem_f64(dtype: DType, b: &[u8]) -> f64 {
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
fn elem_i64(dtype: DType, b: &[u8]) -> Option<i64> {
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
fn decode_run_i64(dtype: DType, run: &[u8]) -> Vec<i64> {
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

fn check_len(shape: &[usize], len: usize) -> Result<(), TensorError> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(TensorError::Other(format!(
            "shape {shape:?} needs {n} elements, got {len}"
        )));
    }
    Ok(())
}

/// Copy a slice into a fixed-size array; callers slice exactly `N` bytes.
fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_view_reads_in_logical_order() {
        let t = Tensor::from_i64(vec![2, 3], &[0, 1, 2, 3, 4, 5]).unwrap();
        let v = Tensor::from_parts(
            DType::I64,
            vec![3, 2],
            vec![1, 3],
            0,
            t.storage.clone(),
            None,
        )
        .unwrap();
        assert!(!v.is_contiguous());
        assert_eq!(v.to_i64_vec(), vec![0, 3, 1, 4, 2, 5]);
        assert!(v.shares_storage(&t));
    }

    #[test]
    fn forged_shape_is_refused_without_allocating() {
        let t = Tensor::from_f64(vec![4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        let err = Tensor::from_parts(
            DType::F64,
            vec![1 << 40],
            vec![1],
            0,
            t.storage.clone(),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, TensorError::OutOfBounds { available: 4, .. }));
        let err = Tensor::from_parts(
            DType::F64,
            vec![1 << 40],
            vec![0],
            0,
            t.storage.clone(),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, TensorError::TooLarge { .. }));
        let err = Tensor::from_parts(
            DType::F64,
            vec![usize::MAX, 3],
            vec![1, 1],
            0,
            t.storage,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, TensorError::Overflow { .. }));
    }

    #[test]
    fn bf16_widens_exactly() {
        let bytes: Vec<u8> = [1.5f32, -0.0078125, 3.0e38]
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        let t = Tensor::from_le_bytes(DType::BF16, vec![3], bytes).unwrap();
        assert_eq!(
            t.to_f64_vec(),
            vec![1.5, -0.0078125, bf16::from_f32(3.0e38).to_f64()]
        );
        let c = t.to_candle(&candle_core::Device::Cpu).unwrap();
        assert_eq!(c.dtype(), candle_core::DType::BF16);
    }
}
