//! [`Mat`]: one dumped (or derived) tensor seen as rows × width, read in f64 chunk by
//! chunk straight from its dtype, so a comparison never holds an f64 copy of a tensor.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::OnceLock;

use crate::compare::metrics::{effective_dtype, GridScan};
use crate::dumpdiff::pages::Pages;
use crate::tensor::{decode_run_f64_into, DType, Tensor};
use crate::value::Value;

/// Positions decoded at a time: a few rows' worth of f64 stays in the core's cache.
pub const CHUNK: usize = 4096;

/// Where a [`Mat`]'s values live.
#[derive(Debug, Clone)]
enum Values {
    /// Row-major f64 values (derived tensors, non-contiguous views, `.jsonl` lists).
    Owned(Vec<f64>),
    /// A contiguous tensor: row-major little-endian elements of its dtype in its storage
    /// (often a window of the memory-mapped file), widened to f64 when read.
    Stored(Tensor),
}

/// A tensor as rows × width of f64 (1-d → one row, 0-d → 1 × 1), with its declared dtype.
/// The precision of its values is computed once, on first use.
#[derive(Debug, Clone)]
pub struct Mat {
    /// Original shape.
    pub shape: Vec<usize>,
    /// Number of rows.
    pub rows: usize,
    /// Elements per row.
    pub width: usize,
    /// Declared dtype (f64/i64 for `.jsonl` lists).
    pub dtype: DType,
    values: Values,
    /// [`Mat::precision`], once computed (values and dtype never change after building).
    precision: OnceLock<DType>,
    /// [`Mat::nonzero`], once computed.
    nonzero: OnceLock<Runs>,
    /// [`Mat::zero_one`], once computed.
    zero_one: OnceLock<bool>,
    /// The map stored values live in, when they may be released ([`Mat::release_rows`]).
    pages: Option<Pages>,
}

/// The positions of each row whose value is non-zero, as ascending ranges.
#[derive(Debug, Clone, Default)]
struct Runs {
    spans: Vec<Range<usize>>,
    /// Row `r`'s spans are `spans[first[r]..first[r + 1]]`.
    first: Vec<usize>,
}

impl Mat {
    /// A matrix of `rows × width` row-major values (`shape` is the original tensor's).
    pub fn new(shape: Vec<usize>, rows: usize, width: usize, data: Vec<f64>, dtype: DType) -> Mat {
        Mat {
            shape,
            rows,
            width,
            dtype,
            values: Values::Owned(data),
            precision: OnceLock::new(),
            nonzero: OnceLock::new(),
            zero_one: OnceLock::new(),
            pages: None,
        }
    }

    /// A matrix of this one's layout holding `data` of `dtype`.
    pub fn with_data(&self, data: Vec<f64>, dtype: DType) -> Mat {
        Mat::new(self.shape.clone(), self.rows, self.width, data, dtype)
    }

    /// This matrix with its [`Mat::precision`] already known (the caller computed it over
    /// exactly the values [`effective_dtype`] would see).
    pub fn with_precision(self, precision: DType) -> Mat {
        let _ = self.precision.set(precision);
        self
    }

    /// This matrix, its stored values lying in `pages` (a whole-batch file's map).
    pub fn with_pages(mut self, pages: Pages) -> Mat {
        self.pages = Some(pages);
        self
    }

    /// Let the memory of these rows' stored values go (a no-op unless they lie in a map
    /// given by [`Mat::with_pages`]); a later read brings them back.
    pub fn release_rows(&self, rows: impl Iterator<Item = usize>) {
        let (Some(pages), Values::Stored(t)) = (&self.pages, &self.values) else {
            return;
        };
        let mut rows: Vec<usize> = rows.filter(|&r| r < self.rows).collect();
        rows.sort_unstable();
        rows.dedup();
        // Consecutive rows are one range of bytes: one call each.
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            let w = self.width;
            pages.release(Mat::stored_bytes(t, rows[i] * w, (rows[j - 1] + 1) * w));
            i = j;
        }
    }

    /// A tensor as a matrix of `rows × width` (its element count), read in place when
    /// contiguous, else copied to f64 in row-major order.
    fn from_tensor(t: &Tensor, rows: usize, width: usize) -> Mat {
        let values = if t.is_contiguous() && t.numel() <= t.storage_numel() {
            Values::Stored(t.clone())
        } else {
            Values::Owned(t.to_f64_vec())
        };
        Mat {
            shape: t.shape().to_vec(),
            rows,
            width,
            dtype: t.dtype(),
            values,
            precision: OnceLock::new(),
            nonzero: OnceLock::new(),
            zero_one: OnceLock::new(),
            pages: None,
        }
    }

    /// The tensor under `key` of a dict, as a matrix (None when absent or above 2-d).
    pub fn of(v: &Value, key: &str) -> Option<Mat> {
        let t = v.get(key)?.to_tensor()?;
        let (rows, width) = match t.shape() {
            [] => (1, 1),
            [n] => (1, *n),
            [r, w] => (*r, *w),
            _ => return None,
        };
        Some(Mat::from_tensor(&t, rows, width))
    }

    /// A tensor of any rank as one flat row.
    pub fn flat(t: &Tensor) -> Mat {
        Mat::from_tensor(t, 1, t.numel())
    }

    /// The stored elements of `[start, end)` (element indices), as bytes.
    fn stored_bytes(t: &Tensor, start: usize, end: usize) -> &[u8] {
        let s = t.dtype().size();
        let base = t.offset();
        &t.storage_bytes()[(base + start) * s..(base + end) * s]
    }

    /// Positions `[p0, p1)` of row `r`, clipped to the width (empty when `r` is out of
    /// range): borrowed when the values are f64 already, else decoded into `buf`.
    pub fn chunk<'s>(&'s self, r: usize, p0: usize, p1: usize, buf: &'s mut Vec<f64>) -> &'s [f64] {
        let p1 = p1.min(self.width);
        if r >= self.rows || p0 >= p1 {
            return &[];
        }
        let (start, end) = (r * self.width + p0, r * self.width + p1);
        match &self.values {
            Values::Owned(d) => &d[start..end],
            Values::Stored(t) => {
                decode_run_f64_into(t.dtype(), Mat::stored_bytes(t, start, end), buf);
                buf
            }
        }
    }

    /// True when positions `[p0, p1)` of row `r` here and of row `ro` of `other` are
    /// stored elements of one dtype with equal bytes, so that they decode to the same f64
    /// values bit for bit: a comparison reads one side only. False when either side is
    /// not stored, the rows are out of range or the positions reach past either width.
    pub fn same_stored(&self, r: usize, other: &Mat, ro: usize, p0: usize, p1: usize) -> bool {
        let (Values::Stored(x), Values::Stored(y)) = (&self.values, &other.values) else {
            return false;
        };
        if self.dtype != other.dtype
            || r >= self.rows
            || ro >= other.rows
            || p1 > self.width
            || p1 > other.width
            || p0 >= p1
        {
            return false;
        }
        let bx = Mat::stored_bytes(x, r * self.width + p0, r * self.width + p1);
        let by = Mat::stored_bytes(y, ro * other.width + p0, ro * other.width + p1);
        bx == by
    }

    /// Row `i` (empty when out of range).
    pub fn row(&self, i: usize) -> Cow<'_, [f64]> {
        if i >= self.rows {
            return Cow::Borrowed(&[]);
        }
        self.span(i * self.width, (i + 1) * self.width)
    }

    /// Every value, row-major.
    pub fn values(&self) -> Cow<'_, [f64]> {
        self.span(0, self.rows * self.width)
    }

    /// Elements `[start, end)` in row-major order.
    fn span(&self, start: usize, end: usize) -> Cow<'_, [f64]> {
        match &self.values {
            Values::Owned(d) => Cow::Borrowed(&d[start..end]),
            Values::Stored(t) => {
                let mut out = Vec::new();
                decode_run_f64_into(t.dtype(), Mat::stored_bytes(t, start, end), &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// The value at row `r`, position `p` (None outside the matrix).
    pub fn get(&self, r: usize, p: usize) -> Option<f64> {
        if r >= self.rows || p >= self.width {
            return None;
        }
        let i = r * self.width + p;
        match &self.values {
            Values::Owned(d) => d.get(i).copied(),
            Values::Stored(t) => {
                let mut one = Vec::with_capacity(1);
                decode_run_f64_into(t.dtype(), Mat::stored_bytes(t, i, i + 1), &mut one);
                one.first().copied()
            }
        }
    }

    /// The ranges of row `r`'s positions holding a non-zero value (NaN included): where
    /// a mask marks its row valid. Empty when `r` is out of range. Computed once.
    pub fn nonzero(&self, r: usize) -> &[Range<usize>] {
        let runs = self.nonzero.get_or_init(|| self.nonzero_runs());
        match (runs.first.get(r), runs.first.get(r + 1)) {
            (Some(&s), Some(&e)) => &runs.spans[s..e],
            _ => &[],
        }
    }

    fn nonzero_runs(&self) -> Runs {
        let mut runs = Runs {
            spans: Vec::new(),
            first: vec![0],
        };
        let stored = match &self.values {
            Values::Stored(t) => Some(t),
            Values::Owned(_) => None,
        };
        // A stored element is zero when its bits are, the sign bit of a float aside.
        let sign = if self.dtype.is_float() {
            1u64 << (8 * self.dtype.size() - 1)
        } else {
            0
        };
        let mask = (u64::MAX >> (64 - 8 * self.dtype.size())) & !sign;
        let w = self.width;
        for r in 0..self.rows {
            let (start, end) = (r * w, (r + 1) * w);
            match (stored, &self.values) {
                (Some(t), _) => {
                    let bytes = Mat::stored_bytes(t, start, end);
                    // A word's flags as one byte each (a loop the compiler vectorises),
                    // then packed eight at a time into bits.
                    macro_rules! runs {
                        ($n:literal, $u:ty) => {
                            push_runs(w, &mut runs.spans, |base, m| {
                                let words = bytes[base * $n..(base + m) * $n].chunks_exact($n);
                                let mut flags = [0u8; 64];
                                for (f, c) in flags.iter_mut().zip(words) {
                                    let mut b = [0u8; $n];
                                    b.copy_from_slice(c);
                                    *f = (<$u>::from_le_bytes(b) & (mask as $u) != 0) as u8;
                                }
                                pack_flags(&flags)
                            })
                        };
                    }
                    match self.dtype.size() {
                        8 => runs!(8, u64),
                        4 => runs!(4, u32),
                        2 => runs!(2, u16),
                        _ => runs!(1, u8),
                    }
                }
                (None, Values::Owned(d)) => {
                    let d = &d[start..end];
                    push_runs(w, &mut runs.spans, |base, m| {
                        let block = d[base..base + m].iter().enumerate();
                        block.fold(0u64, |bits, (k, &x)| bits | ((x != 0.0) as u64) << k)
                    })
                }
                (None, Values::Stored(_)) => {}
            }
            runs.first.push(runs.spans.len());
        }
        runs
    }

    /// True when `other` holds the same values in the same layout and dtype (bit for bit).
    pub fn same_values(&self, other: &Mat) -> bool {
        if (self.dtype, self.rows, self.width) != (other.dtype, other.rows, other.width) {
            return false;
        }
        let n = self.rows * self.width;
        match (&self.values, &other.values) {
            (Values::Stored(x), Values::Stored(y)) => {
                Mat::stored_bytes(x, 0, n) == Mat::stored_bytes(y, 0, n)
            }
            (Values::Owned(x), Values::Owned(y)) => {
                x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            _ => false,
        }
    }

    /// Whether every value is exactly +0 or 1 (a 0/1 mask: −0, NaN and every other value
    /// say no), so that [`Mat::nonzero`] holds its ones. Computed once.
    pub fn zero_one(&self) -> bool {
        *self.zero_one.get_or_init(|| {
            let n = self.rows * self.width;
            let t = match &self.values {
                Values::Owned(d) => {
                    let one = 1f64.to_bits();
                    return d[..n]
                        .iter()
                        .all(|x| x.to_bits() == 0 || x.to_bits() == one);
                }
                Values::Stored(t) => t,
            };
            // The stored bits of 1 in each dtype (bool and integers: the value 1).
            let one: u64 = match self.dtype {
                DType::F64 => 1f64.to_bits(),
                DType::F32 => 1f32.to_bits() as u64,
                DType::BF16 => 0x3f80,
                DType::F16 => 0x3c00,
                DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8 | DType::Bool => 1,
                _ => return false,
            };
            let bytes = Mat::stored_bytes(t, 0, n);
            macro_rules! all_zero_one {
                ($n:literal, $u:ty) => {
                    bytes.chunks_exact($n).fold(true, |ok, c| {
                        let mut b = [0u8; $n];
                        b.copy_from_slice(c);
                        let v = <$u>::from_le_bytes(b);
                        ok & ((v == 0) | (v == one as $u))
                    })
                };
            }
            match self.dtype.size() {
                8 => all_zero_one!(8, u64),
                4 => all_zero_one!(4, u32),
                2 => all_zero_one!(2, u16),
                _ => all_zero_one!(1, u8),
            }
        })
    }

    /// True when `other`'s rows have the same non-zero positions ([`Mat::nonzero`]).
    pub fn same_nonzero(&self, other: &Mat) -> bool {
        self.rows == other.rows && (0..self.rows).all(|r| self.nonzero(r) == other.nonzero(r))
    }

    /// The precision of the values (see [`effective_dtype`]), computed once.
    pub fn precision(&self) -> DType {
        *self.precision.get_or_init(|| match &self.values {
            Values::Owned(d) => effective_dtype(self.dtype, d),
            Values::Stored(_) => self.stored_precision(),
        })
    }

    /// [`effective_dtype`] of stored values, decoded chunk by chunk.
    fn stored_precision(&self) -> DType {
        let mut scan = GridScan::new(self.dtype);
        let n = self.rows * self.width;
        if let (DType::F32, Values::Stored(t)) = (self.dtype, &self.values) {
            // Every f32 is on the f32 grid, and on the bf16 grid when its low 16 bits are
            // zero: the bf16 test straight on the stored bits (non-finite values aside).
            if f32_bits_on_bf16_grid(Mat::stored_bytes(t, 0, n)) {
                return DType::BF16;
            }
            // Not all on the bf16 grid: what is left is the f16 test.
            scan.saw_off_bf16();
        }
        let mut buf = Vec::new();
        // Each pass stops as soon as the rest cannot change its answer.
        for start in (0..n).step_by(CHUNK) {
            if scan.settled() {
                break;
            }
            scan.feed(self.span_into(start, (start + CHUNK).min(n), &mut buf));
        }
        for start in (0..n).step_by(CHUNK) {
            if !scan.needs_f16() {
                break;
            }
            scan.feed_f16(self.span_into(start, (start + CHUNK).min(n), &mut buf));
        }
        scan.finish()
    }

    /// Elements `[start, end)` decoded into `buf` (or borrowed).
    fn span_into<'s>(&'s self, start: usize, end: usize, buf: &'s mut Vec<f64>) -> &'s [f64] {
        match &self.values {
            Values::Owned(d) => &d[start..end],
            Values::Stored(t) => {
                decode_run_f64_into(t.dtype(), Mat::stored_bytes(t, start, end), buf);
                buf
            }
        }
    }
}

/// Append to `spans` the ascending ranges of `[0, n)` holding non-zero values, from
/// `block(base, m)`: the flags of positions `base..base + m` (m ≤ 64) as the low bits of
/// a word (a branch-free loop). Runs are found by counting trailing bits, so a long run
/// of ones or zeros costs a few operations per 64 positions.
#[inline(always)]
fn push_runs(n: usize, spans: &mut Vec<Range<usize>>, block: impl Fn(usize, usize) -> u64) {
    let mut open: Option<usize> = None;
    for base in (0..n).step_by(64) {
        let m = (n - base).min(64);
        let bits = block(base, m);
        let mut k = 0;
        while k < m {
            let rest = bits >> k;
            match open {
                // Inside a run: it ends at the next zero flag (or goes on past the word).
                Some(s) => {
                    let ones = (!rest).trailing_zeros() as usize;
                    if k + ones >= m {
                        break;
                    }
                    spans.push(s..base + k + ones);
                    open = None;
                    k += ones;
                }
                // Between runs: the next one starts at the next set flag.
                None => {
                    let zeros = rest.trailing_zeros() as usize;
                    if k + zeros >= m {
                        break;
                    }
                    open = Some(base + k + zeros);
                    k += zeros;
                }
            }
        }
    }
    if let Some(s) = open {
        spans.push(s..n);
    }
}

/// 64 flags of 0 or 1 as the bits of a word, flag `k` at bit `k`: eight at a time, a
/// multiply gathering each byte's low bit into the top byte (no carries cross bytes).
#[inline(always)]
fn pack_flags(flags: &[u8; 64]) -> u64 {
    let mut bits = 0u64;
    for (j, c) in flags.chunks_exact(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        let gathered = u64::from_le_bytes(b).wrapping_mul(0x0102_0408_1020_4080) >> 56;
        bits |= gathered << (8 * j);
    }
    bits
}

/// True when every finite little-endian f32 in `bytes` has its low 16 bits zero (AVX2
/// where the CPU has it: integer tests, the same answer).
fn f32_bits_on_bf16_grid(bytes: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { f32_bits_on_bf16_grid_avx2(bytes) };
    }
    f32_bits_on_bf16_grid_body(bytes)
}

/// [`f32_bits_on_bf16_grid_body`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn f32_bits_on_bf16_grid_avx2(bytes: &[u8]) -> bool {
    f32_bits_on_bf16_grid_body(bytes)
}

#[inline(always)]
fn f32_bits_on_bf16_grid_body(bytes: &[u8]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    bytes.chunks(4096).all(|block| {
        block.chunks_exact(4).fold(true, |ok, c| {
            let bits = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            ok & ((bits & EXP == EXP) | (bits & 0xFFFF == 0))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs of non-zero values of `row`, by a plain scan (what `Mat::nonzero` must
    /// give).
    fn scan_runs(row: &[f64]) -> Vec<std::ops::Range<usize>> {
        let (w, mut want, mut i) = (row.len(), Vec::new(), 0);
        while i < w {
            if row[i] != 0.0 {
                let s = i;
                while i < w && row[i] != 0.0 {
                    i += 1;
                }
                want.push(s..i);
            } else {
                i += 1;
            }
        }
        want
    }

    fn stored(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Mat {
        let t = Tensor::from_le_bytes(dtype, shape, bytes).unwrap();
        let m = Mat::flat(&t);
        assert!(matches!(m.values, Values::Stored(_)));
        m
    }

    #[test]
    fn stored_values_read_as_to_f64_vec_does() {
        for (dtype, bytes) in [
            (
                DType::BF16,
                vec![0x80, 0x3f, 0x00, 0xc0, 0x01, 0x7f, 0xc0, 0x7f],
            ),
            (
                DType::F16,
                vec![0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x7e],
            ),
            (DType::I8, vec![0xff, 0x7f, 0x80, 0x00]),
            (DType::Bool, vec![0, 1, 2, 255]),
            (
                DType::I32,
                (-3i32..5).flat_map(|v| v.to_le_bytes()).collect(),
            ),
        ] {
            let t = Tensor::from_le_bytes(dtype, vec![bytes.len() / dtype.size()], bytes).unwrap();
            let want = t.to_f64_vec();
            let m = Mat::flat(&t);
            let got = m.values();
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{dtype}");
            let mut buf = Vec::new();
            let n = want.len();
            assert_eq!(
                format!("{:?}", m.chunk(0, 1, n + 5, &mut buf)),
                format!("{:?}", &want[1..])
            );
            assert_eq!(
                m.get(0, n - 1).map(f64::to_bits),
                Some(want[n - 1].to_bits())
            );
            assert_eq!(m.get(0, n), None);
        }
    }

    #[test]
    fn rows_chunks_and_gets_of_a_stored_matrix() {
        let vals: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::from_le_bytes(
            DType::F32,
            vec![3, 4],
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .unwrap();
        let v = Value::Dict(vec![(Value::Str("x".into()), Value::Tensor(t))]);
        let m = Mat::of(&v, "x").unwrap();
        assert_eq!((m.rows, m.width, m.dtype), (3, 4, DType::F32));
        assert_eq!(&*m.row(1), &[2.0, 2.5, 3.0, 3.5]);
        assert!(m.row(3).is_empty());
        let mut buf = Vec::new();
        assert_eq!(m.chunk(2, 1, 3, &mut buf), &[4.5, 5.0]);
        assert!(m.chunk(5, 0, 4, &mut buf).is_empty());
        assert_eq!(m.get(2, 3), Some(5.5));
        assert_eq!(m.get(1, 4), None);
    }

    #[test]
    fn nonzero_runs_per_row() {
        let nan = f64::NAN;
        let m = Mat::new(
            vec![3, 5],
            3,
            5,
            vec![
                1.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, nan, 0.0, -1.0, 1.0, 0.0,
            ],
            DType::F64,
        );
        assert_eq!(m.nonzero(0), &[0..2, 4..5]);
        assert!(m.nonzero(1).is_empty());
        assert_eq!(m.nonzero(2), &[0..1, 2..4]);
        assert!(m.nonzero(3).is_empty());
        let wide = Mat::new(
            vec![CHUNK + 3],
            1,
            CHUNK + 3,
            vec![1.0; CHUNK + 3],
            DType::F64,
        );
        assert_eq!(wide.nonzero(0), std::slice::from_ref(&(0..CHUNK + 3)));
    }

    #[test]
    fn nonzero_runs_across_words_equal_a_scan() {
        // Runs that start, end or span the 64-position words, against a plain scan.
        let mut seed = 5u64;
        for w in [1, 63, 64, 65, 127, 128, 129, 300] {
            for density in [0u64, 1, 3, 7, 8] {
                let vals: Vec<f64> = (0..3 * w)
                    .map(|i| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let keep = (seed >> 40) % 8 < density || (i / 37) % 2 == 1;
                        if keep {
                            1.0
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let m = Mat::new(vec![3, w], 3, w, vals.clone(), DType::F64);
                for r in 0..3 {
                    let row = &vals[r * w..(r + 1) * w];
                    let want = scan_runs(row);
                    assert_eq!(m.nonzero(r), &want[..], "w {w} density {density} row {r}");
                }
            }
        }
    }

    #[test]
    fn stored_nonzero_runs_across_words_equal_a_scan() {
        // Every stored width (1, 2, 4, 8 bytes), runs starting, ending and spanning the
        // 64-position words, float signs (±0 zero, NaN not), against a scan of the
        // widened values.
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            seed >> 33
        };
        for dtype in [DType::Bool, DType::BF16, DType::I32, DType::F32, DType::I64] {
            for w in [1, 7, 63, 64, 65, 129, 200] {
                let vals: Vec<f64> = (0..3 * w)
                    .map(|i| match (next() % 8, (i / 23) % 3) {
                        (_, 1) => 0.0,
                        (0, _) if dtype.is_float() => -0.0,
                        (1, _) if dtype.is_float() => f64::NAN,
                        (2 | 3, _) => 0.0,
                        _ => 1.0,
                    })
                    .collect();
                let bytes: Vec<u8> = vals
                    .iter()
                    .flat_map(|&v| match dtype {
                        DType::Bool => vec![v as u8],
                        DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                        DType::I32 => (v as i32).to_le_bytes().to_vec(),
                        DType::F32 => (v as f32).to_le_bytes().to_vec(),
                        _ => (v as i64).to_le_bytes().to_vec(),
                    })
                    .collect();
                let t = Tensor::from_le_bytes(dtype, vec![3, w], bytes).unwrap();
                let m = Mat::from_tensor(&t, 3, w);
                assert!(matches!(m.values, Values::Stored(_)));
                for r in 0..3 {
                    let row = &vals[r * w..(r + 1) * w];
                    let want = scan_runs(row);
                    assert_eq!(m.nonzero(r), &want[..], "{dtype} w {w} row {r}");
                }
            }
        }
    }

    #[test]
    fn stored_nonzero_runs_read_the_bits() {
        // Floats: ±0 are zero, NaN is not (as `v != 0.0` on the widened value).
        let f: Vec<u8> = [1.0f32, -0.0, 0.0, f32::NAN, 2.0, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(stored(DType::F32, vec![6], f).nonzero(0), &[0..1, 3..5]);
        let h: Vec<u8> = [0.0f64, -0.0, 1.0]
            .iter()
            .flat_map(|&v| half::bf16::from_f64(v).to_le_bytes())
            .collect();
        assert_eq!(
            stored(DType::BF16, vec![3], h).nonzero(0),
            std::slice::from_ref(&(2..3))
        );
        let b = stored(DType::Bool, vec![2, 3], vec![0, 2, 1, 0, 0, 0]);
        assert_eq!(b.nonzero(0), std::slice::from_ref(&(1..3)));
        assert!(b.nonzero(1).is_empty());
        let i: Vec<u8> = [0i64, -1, 0, 1 << 40]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(stored(DType::I64, vec![4], i).nonzero(0), &[1..2, 3..4]);
    }

    #[test]
    fn same_values_compares_bits_dtype_and_layout() {
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let a = stored(DType::F32, vec![2, 2], f(&[1.0, 2.0, 3.0, 4.0]));
        assert!(a.same_values(&stored(DType::F32, vec![2, 2], f(&[1.0, 2.0, 3.0, 4.0]))));
        assert!(!a.same_values(&stored(DType::F32, vec![2, 2], f(&[1.0, 2.0, 3.0, 4.5]))));
        assert!(!a.same_values(&stored(DType::F32, vec![3], f(&[1.0, 2.0, 3.0]))));
        let i: Vec<u8> = [1i32, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(!a.same_values(&stored(DType::I32, vec![2, 2], i)));
        let o = Mat::new(vec![2], 1, 2, vec![0.0, 1.0], DType::F64);
        assert!(o.same_values(&Mat::new(vec![2], 1, 2, vec![0.0, 1.0], DType::F64)));
        assert!(!o.same_values(&Mat::new(vec![2], 1, 2, vec![-0.0, 1.0], DType::F64)));
    }

    #[test]
    fn stored_precision_equals_effective_dtype_of_all_values() {
        let cases: Vec<Vec<f32>> = vec![
            vec![1.0, -2.5, 0.0],                             // bf16 grid
            vec![1.0, 0.1, 2.0],                              // f32
            vec![1.0, 1.0 + 1.0 / 1024.0, 3.0],               // f16 grid, not bf16
            vec![f32::NAN, 1.0, f32::INFINITY],               // non-finite ignored
            (0..3 * CHUNK).map(|i| i as f32 / 8.0).collect(), // f16 until it is not
            (0..3 * CHUNK)
                .map(|i| if i == 3 * CHUNK - 1 { 0.1 } else { 1.0 })
                .collect(), // the last chunk decides
        ];
        for vals in cases {
            let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            let m = stored(DType::F32, vec![vals.len()], bytes);
            let all: Vec<f64> = vals.iter().map(|&v| v as f64).collect();
            assert_eq!(
                m.precision(),
                effective_dtype(DType::F32, &all),
                "{:?}",
                &vals[..3]
            );
        }
    }
}

/// A whole-batch file's rows read through [`Mat`] from released pages (the tests live here,
/// not in `pages`, so that `pages` never names `mat`).
#[cfg(test)]
mod paged_tests {
    use std::path::Path;

    use super::Mat;
    use crate::dumpdiff::pages::read_whole;
    use crate::readers::read_any;

    #[test]
    fn a_released_whole_batch_file_reads_the_same() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/dumps/self_hosted_pt/old_log_probs/step_000000.pt");
        let want = read_any(&path).unwrap();
        let want = Mat::of(&want, "old_log_probs").unwrap();
        let (value, pages) = read_whole(&path).unwrap();
        let pages = pages.unwrap();
        let m = Mat::of(&value, "old_log_probs").unwrap().with_pages(pages);
        assert!(want.rows > 1);
        let bits = |m: &Mat| m.values().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&m), bits(&want));
        m.release_rows(0..m.rows);
        assert_eq!(bits(&m), bits(&want));
    }

    #[test]
    fn files_other_than_pt_are_read_without_a_map() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/dumps/self_hosted_jsonl/old_log_probs/step_000000.jsonl");
        let (v, pages) = read_whole(&path).unwrap();
        assert!(pages.is_none());
        assert!(Mat::of(&v, "old_log_probs").is_some());
        let missing = path.with_file_name("nope.pt");
        let err = read_whole(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.pt"), "{err}");
    }
}
