//! [`Mat`]: one dumped (or derived) tensor seen as rows × width, read in f64 chunk by
//! chunk straight from its dtype, so a comparison never holds an f64 copy of a tensor.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::compare::metrics::{effective_dtype, GridScan};
use crate::model::record::{Field, Pages, Record};
use crate::tensor::{decode_run_f64_into, DType, Tensor};

/// Positions decoded at a time: a few rows' worth of f64 stays in the core's cache.
pub const CHUNK: usize = 4096;

/// Where a [`Mat`]'s values live.
#[derive(Debug, Clone)]
enum Values {
    /// Row-major f64 values (derived tensors, non-contiguous views, `.jsonl` lists),
    /// shared by the clones of the matrix and by what borrows them by offset (a chain's
    /// [`ChainStats`](crate::compare::propagate::ChainStats)).
    Owned(Arc<Vec<f64>>),
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
    /// A copy with row `r` moved `shifts[r]` positions left (zeros fill its end; rows past
    /// `shifts` unmoved): the reference's response-width tensors realigned to the other
    /// side's layout ([`crate::dumpdiff::sections::Tensors::realign`]).
    pub fn shifted_left(&self, shifts: &[usize]) -> Mat {
        let mut data = vec![0.0; self.rows * self.width];
        let mut buf = Vec::new();
        for r in 0..self.rows {
            let row = self.chunk(r, 0, self.width, &mut buf);
            let s = shifts.get(r).copied().unwrap_or(0).min(row.len());
            data[r * self.width..r * self.width + row.len() - s].copy_from_slice(&row[s..]);
        }
        Mat::new(self.shape.clone(), self.rows, self.width, data, self.dtype)
    }

    pub fn new(shape: Vec<usize>, rows: usize, width: usize, data: Vec<f64>, dtype: DType) -> Mat {
        Mat {
            shape,
            rows,
            width,
            dtype,
            values: Values::Owned(Arc::new(data)),
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

    /// Its row-major f64 values when it holds them itself (a derived matrix), shared: a
    /// reader of whole rows by offset needs no copy.
    pub fn owned_values(&self) -> Option<Arc<Vec<f64>>> {
        match &self.values {
            Values::Owned(d) => Some(d.clone()),
            Values::Stored(_) => None,
        }
    }

    /// Rows `first..first + n` of a stored 2-d matrix as a matrix of their own, reading
    /// the same stored values (nothing copied) and releasable as its rows are
    /// ([`Mat::release_rows`]); None when its values are not stored.
    pub fn row_window(&self, first: usize, n: usize) -> Option<Mat> {
        let Values::Stored(t) = &self.values else {
            return None;
        };
        let t = t.rows(first, n).filter(|_| self.shape.len() == 2)?;
        Some(Mat {
            shape: t.shape().to_vec(),
            rows: n,
            width: self.width,
            dtype: self.dtype,
            values: Values::Stored(t),
            precision: OnceLock::new(),
            nonzero: OnceLock::new(),
            zero_one: OnceLock::new(),
            pages: self.pages.clone(),
        })
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
            Values::Owned(Arc::new(t.to_f64_vec()))
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

    /// The tensor of `field` in a record, as a matrix (None when absent or above 2-d).
    pub fn of(r: &Record, field: Field) -> Option<Mat> {
        let t = r.tensor(field)?;
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
            (Values::Owned(x), Values::Owned(y)) => x
                .iter()
                .zip(y.iter())
                .all(|(p, q)| p.to_bits() == q.to_bits()),
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
mod tests;

/// A whole-batch file's rows read through [`Mat`] from released pages (the tests live here,
/// not in `pages`, so that `pages` never names `mat`).
#[cfg(test)]
mod paged_tests {
    use std::path::Path;

    use super::Mat;
    use crate::formats::read_any;
    use crate::model::record::{Field, Record};
    use crate::producers::nexrl_files::field_name;
    use crate::producers::nexrl_files::read_whole;

    #[test]
    fn a_released_whole_batch_file_reads_the_same() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/dumps/self_hosted_pt/old_log_probs/step_000000.pt");
        let want = read_any(&path).unwrap();
        let want = Mat::of(&Record::new(want, field_name), Field::OldLogProbs).unwrap();
        let (value, pages) = read_whole(&path).unwrap();
        let pages = pages.unwrap();
        let m = Mat::of(&Record::new(value, field_name), Field::OldLogProbs)
            .unwrap()
            .with_pages(pages);
        assert!(want.rows > 1);
        let bits = |m: &Mat| m.values().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&m), bits(&want));
        m.release_rows(0..m.rows);
        assert_eq!(bits(&m), bits(&want));
        // A window of its rows reads those rows, before and after its pages go, and has
        // the precision a copy of them has.
        let (first, n) = (1, want.rows - 1);
        let w = m.row_window(first, n).unwrap();
        let copy = Mat::new(
            vec![n, want.width],
            n,
            want.width,
            (first..first + n)
                .flat_map(|r| want.row(r).into_owned())
                .collect(),
            want.dtype,
        );
        assert_eq!((w.rows, w.width, &w.shape), (n, want.width, &copy.shape));
        assert_eq!(bits(&w), bits(&copy));
        assert_eq!(w.precision(), copy.precision());
        w.release_rows(0..w.rows);
        assert_eq!(bits(&w), bits(&copy));
        assert!(m.row_window(first, want.rows).is_none(), "past the end");
        assert!(copy.row_window(0, 1).is_none(), "not stored");
    }

    #[test]
    fn files_other_than_pt_are_read_without_a_map() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/dumps/self_hosted_jsonl/old_log_probs/step_000000.jsonl");
        let (v, pages) = read_whole(&path).unwrap();
        assert!(pages.is_none());
        assert!(Mat::of(&Record::new(v, field_name), Field::OldLogProbs).is_some());
        let missing = path.with_file_name("nope.pt");
        let err = read_whole(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.pt"), "{err}");
    }
}
