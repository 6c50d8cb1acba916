//! The one in-memory tensor type every reader returns: a typed, strided view over
//! little-endian storage bytes that may be shared (views of one `torch` storage) and may
//! be memory-mapped (no copy of a `.pt` member or `.safetensors` payload).
//!
//! Conversions to f64 are exact for every float dtype and for integers up to 2^53; use
//! [`Tensor::to_i64_vec`] for integer tensors (token ids, masks) to keep them exact.

mod bytes;
mod decode;
mod dtype;

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

pub use bytes::Bytes;
pub(crate) use decode::decode_run_f64_into;
use decode::{arr, decode_run_f64, decode_run_i64, elem_f64, elem_i64, push_elem_f64};
pub use dtype::DType;

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

    /// Rows `first..first + n` of a contiguous, unquantized 2-d tensor: a view of the
    /// same storage (nothing copied); None for any other tensor or rows past its end.
    pub fn rows(&self, first: usize, n: usize) -> Option<Tensor> {
        let [rows, width] = self.shape[..] else {
            return None;
        };
        let fits = first.checked_add(n).is_some_and(|end| end <= rows);
        if !fits || !self.is_contiguous() || self.quant.is_some() {
            return None;
        }
        Some(Tensor {
            shape: vec![n, width],
            strides: contiguous_strides(&[n, width]),
            offset: self.offset + first * width,
            ..self.clone()
        })
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

fn check_len(shape: &[usize], len: usize) -> Result<(), TensorError> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(TensorError::Other(format!(
            "shape {shape:?} needs {n} elements, got {len}"
        )));
    }
    Ok(())
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
