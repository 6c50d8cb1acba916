//! Column storage of the log frame: rows in blocks of [`BLOCK_ROWS`], each block either
//! empty, dense, sparse (few present cells), or one line `first + k·step` checked bit for
//! bit (constants, counters, clock ticks), so that a metric column costs at most 8 bytes a
//! row plus a presence bit, and much less when it is constant or rare. A present NaN is a
//! value; a missing cell is not.

/// Rows per block.
pub const BLOCK_ROWS: usize = 4096;
const WORDS: usize = BLOCK_ROWS / 64;

/// Which cells of a block are present.
#[derive(Debug, Clone)]
enum Bits {
    /// None of them.
    None,
    /// All rows of the block (the frame's rows, for its last block).
    All,
    /// One bit per row.
    Some(Box<[u64; WORDS]>),
}

/// A block's values; only the present cells' values mean anything.
#[derive(Debug, Clone)]
enum Vals {
    /// Nothing stored (the block has no present cell).
    Empty,
    /// Cell `k` is [`on_line`]`(first, step, k)`, verified bit for bit when the block was
    /// compressed.
    Line { first: f64, step: f64 },
    /// [`BLOCK_ROWS`] values.
    Dense(Box<[f64]>),
    /// The present cells' values in offset order, and how many cells are present before
    /// each bitmap word (blocks with few cells; only with `Bits::Some`).
    Sparse {
        before: Box<[u16; WORDS]>,
        values: Box<[f64]>,
    },
}

/// A sparse block is kept when it takes under half of a dense one.
const SPARSE_MAX: usize = (BLOCK_ROWS * 8 / 2 - WORDS * 2) / 8;

/// Cell `k` of a line block; `step == 0` is a constant (kept exact for NaN and -0.0).
#[inline]
fn on_line(first: f64, step: f64, k: usize) -> f64 {
    if step == 0.0 {
        first
    } else {
        first + k as f64 * step
    }
}

#[inline]
fn bit(w: &[u64; WORDS], k: usize) -> bool {
    w.get(k / 64).is_some_and(|x| x >> (k % 64) & 1 == 1)
}

/// Present offsets below `n` of a bitmap, ascending.
fn offsets(w: &[u64; WORDS], n: usize) -> impl Iterator<Item = usize> + '_ {
    w.iter().enumerate().flat_map(move |(wi, &word)| {
        let mut x = word;
        std::iter::from_fn(move || {
            if x == 0 {
                return None;
            }
            let k = wi * 64 + x.trailing_zeros() as usize;
            x &= x - 1;
            Some(k)
        })
        .take_while(move |&k| k < n)
    })
}

#[derive(Debug, Clone)]
struct Block {
    bits: Bits,
    vals: Vals,
}

impl Block {
    const EMPTY: Block = Block {
        bits: Bits::None,
        vals: Vals::Empty,
    };

    /// The value at present offset `k`.
    #[inline]
    fn value(&self, k: usize) -> Option<f64> {
        match &self.vals {
            Vals::Empty => None,
            Vals::Line { first, step } => Some(on_line(*first, *step, k)),
            Vals::Dense(d) => d.get(k).copied(),
            Vals::Sparse { before, values } => {
                let Bits::Some(w) = &self.bits else {
                    return None;
                };
                let wi = k / 64;
                let below = w.get(wi)? & ((1u64 << (k % 64)) - 1);
                values
                    .get(*before.get(wi)? as usize + below.count_ones() as usize)
                    .copied()
            }
        }
    }

    /// Every value at its offset (a write is coming into a compressed block).
    fn densify(&mut self) {
        let d: Box<[f64]> = match &self.vals {
            Vals::Dense(_) => return,
            Vals::Line { first, step } => {
                (0..BLOCK_ROWS).map(|k| on_line(*first, *step, k)).collect()
            }
            Vals::Empty | Vals::Sparse { .. } => {
                let mut d = vec![0.0; BLOCK_ROWS].into_boxed_slice();
                if let Bits::Some(w) = &self.bits {
                    for k in offsets(w, BLOCK_ROWS) {
                        if let (Some(x), Some(v)) = (d.get_mut(k), self.value(k)) {
                            *x = v;
                        }
                    }
                }
                d
            }
        };
        self.vals = Vals::Dense(d);
    }

    #[inline]
    fn get(&self, k: usize) -> Option<f64> {
        let present = match &self.bits {
            Bits::None => false,
            Bits::All => true,
            Bits::Some(w) => bit(w, k),
        };
        if present {
            self.value(k)
        } else {
            None
        }
    }

    /// Store `v` at offset `k` unless a value is there already (the first one wins).
    fn set(&mut self, k: usize, v: f64) -> bool {
        match &self.bits {
            Bits::All => return false,
            Bits::Some(w) if bit(w, k) => return false,
            Bits::Some(_) => {}
            Bits::None => {
                self.bits = Bits::Some(Box::new([0; WORDS]));
                self.vals = Vals::Dense(vec![0.0; BLOCK_ROWS].into_boxed_slice());
            }
        }
        match self.vals {
            Vals::Line { first, step } if on_line(first, step, k).to_bits() == v.to_bits() => {}
            _ => self.densify(),
        }
        if let Vals::Dense(d) = &mut self.vals {
            if let Some(x) = d.get_mut(k) {
                *x = v;
            }
        }
        if let Bits::Some(w) = &mut self.bits {
            if let Some(x) = w.get_mut(k / 64) {
                *x |= 1 << (k % 64);
            }
        }
        true
    }

    /// Compress a block whose rows are the first `n` offsets: no cell → empty, every cell
    /// present → no bitmap, values on one line (bit for bit) → two numbers, few cells →
    /// only theirs.
    fn seal(&mut self, n: usize) {
        let Bits::Some(w) = &self.bits else {
            return;
        };
        let count = offsets(w, n).count();
        if count == 0 {
            *self = Block::EMPTY;
            return;
        }
        if let Vals::Dense(d) = &self.vals {
            if let Some((first, step)) = fit_line(d, w, n) {
                self.vals = Vals::Line { first, step };
            } else if count < n && count <= SPARSE_MAX {
                let mut before = Box::new([0u16; WORDS]);
                let mut total = 0u16;
                for (b, word) in before.iter_mut().zip(w.iter()) {
                    *b = total;
                    total += word.count_ones() as u16;
                }
                let values = offsets(w, BLOCK_ROWS)
                    .filter_map(|k| d.get(k).copied())
                    .collect();
                self.vals = Vals::Sparse { before, values };
            }
        }
        if count == n && !matches!(self.vals, Vals::Sparse { .. }) {
            self.bits = Bits::All;
        }
    }

    fn heap_bytes(&self) -> usize {
        let bits = match self.bits {
            Bits::Some(_) => WORDS * 8,
            _ => 0,
        };
        let vals = match &self.vals {
            Vals::Dense(d) => d.len() * 8,
            Vals::Sparse { values, .. } => WORDS * 2 + values.len() * 8,
            _ => 0,
        };
        bits + vals
    }
}

/// The line through the block's present values, when every one of them lies on it exactly.
fn fit_line(d: &[f64], w: &[u64; WORDS], n: usize) -> Option<(f64, f64)> {
    let mut present = offsets(w, n);
    let k0 = present.next()?;
    let v0 = *d.get(k0)?;
    let (first, step) = match present.next() {
        None => (v0, 0.0),
        Some(k1) => {
            let v1 = *d.get(k1)?;
            if v1.to_bits() == v0.to_bits() {
                (v0, 0.0)
            } else {
                let step = (v1 - v0) / (k1 - k0) as f64;
                (v0 - k0 as f64 * step, step)
            }
        }
    };
    offsets(w, n)
        .all(|k| d.get(k).map(|v| v.to_bits()) == Some(on_line(first, step, k).to_bits()))
        .then_some((first, step))
}

/// One metric over the frame's rows: `Some(v)` where the logs gave a value (NaN and ±inf
/// included), `None` where they did not.
#[derive(Debug, Clone, Default)]
pub struct Column {
    blocks: Vec<Block>,
    len: usize,
}

impl Column {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cell at row `i`: `None` when missing or past the end.
    #[inline]
    pub fn get(&self, i: usize) -> Option<f64> {
        if i >= self.len {
            return None;
        }
        self.blocks.get(i / BLOCK_ROWS)?.get(i % BLOCK_ROWS)
    }

    /// Every row's cell, in row order.
    pub fn iter(&self) -> impl Iterator<Item = Option<f64>> + '_ {
        (0..self.len).map(|i| self.get(i))
    }

    /// `(row, value)` of the present cells, in row order.
    pub fn present(&self) -> Present<'_> {
        self.present_from(0)
    }

    /// [`Column::present`] from row `row` on.
    pub fn present_from(&self, row: usize) -> Present<'_> {
        Present {
            blocks: &self.blocks,
            len: self.len,
            b: row / BLOCK_ROWS,
            k: row % BLOCK_ROWS,
            run: &[],
            run_row: 0,
        }
    }

    /// Present cells in the blocks before each block, then the column's total: cell `j`
    /// (in row order) lies in the block `b` with `counts[b] <= j < counts[b + 1]`.
    pub(crate) fn present_counts(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.blocks.len() + 1);
        let mut total = 0;
        out.push(0);
        for (b, blk) in self.blocks.iter().enumerate() {
            let n = self.len.saturating_sub(b * BLOCK_ROWS).min(BLOCK_ROWS);
            total += match &blk.bits {
                Bits::None => 0,
                Bits::All => n,
                Bits::Some(w) => w
                    .iter()
                    .enumerate()
                    .map(|(wi, &x)| {
                        let below = n.saturating_sub(wi * 64).min(64);
                        let mask = if below == 64 { !0 } else { (1u64 << below) - 1 };
                        (x & mask).count_ones() as usize
                    })
                    .sum(),
            };
            out.push(total);
        }
        out
    }

    /// The row of the `k`-th present cell (from 0) of block `b`.
    pub(crate) fn nth_present_row(&self, b: usize, k: usize) -> Option<usize> {
        let base = b * BLOCK_ROWS;
        let n = self.len.checked_sub(base)?.min(BLOCK_ROWS);
        let off = match &self.blocks.get(b)?.bits {
            Bits::None => None,
            Bits::All => (k < n).then_some(k),
            Bits::Some(w) => {
                let mut left = k;
                let mut found = None;
                for (wi, &x) in w.iter().enumerate() {
                    let c = x.count_ones() as usize;
                    if left < c {
                        let mut x = x;
                        for _ in 0..left {
                            x &= x - 1;
                        }
                        found = Some(wi * 64 + x.trailing_zeros() as usize);
                        break;
                    }
                    left -= c;
                }
                found.filter(|&o| o < n)
            }
        };
        off.map(|o| base + o)
    }

    /// True when at least one cell is present.
    pub fn any(&self) -> bool {
        self.present().next().is_some()
    }

    /// A column of `cells`, compressed as it is filled.
    pub fn from_cells(cells: impl IntoIterator<Item = Option<f64>>) -> Column {
        let mut c = Column::default();
        for v in cells {
            c.push(v);
        }
        c.seal_all();
        c
    }

    /// Bytes held on the heap (blocks and bitmaps), to measure what the storage costs.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<Block>()
            + self.blocks.iter().map(Block::heap_bytes).sum::<usize>()
    }

    /// Store `v` at `row` unless a value is there already (the first one wins); grows the
    /// column to `row + 1` rows. Returns whether it was stored.
    pub(crate) fn set(&mut self, row: usize, v: f64) -> bool {
        let b = row / BLOCK_ROWS;
        if self.blocks.len() <= b {
            self.blocks.resize(b + 1, Block::EMPTY);
        }
        self.len = self.len.max(row + 1);
        self.blocks
            .get_mut(b)
            .is_some_and(|blk| blk.set(row % BLOCK_ROWS, v))
    }

    /// Append one cell, compressing each block once it is full.
    pub(crate) fn push(&mut self, v: Option<f64>) {
        let row = self.len;
        match v {
            Some(v) => {
                self.set(row, v);
            }
            None => {
                self.len += 1;
                if self.blocks.len() <= row / BLOCK_ROWS {
                    self.blocks.push(Block::EMPTY);
                }
            }
        }
        if self.len.is_multiple_of(BLOCK_ROWS) {
            self.seal_block(row / BLOCK_ROWS, BLOCK_ROWS);
        }
    }

    /// Compress block `b`, whose rows are its first `n` offsets.
    pub(crate) fn seal_block(&mut self, b: usize, n: usize) {
        if let Some(blk) = self.blocks.get_mut(b) {
            blk.seal(n);
        }
    }

    /// Give the column exactly `rows` rows (missing past what was set) and compress every
    /// block: the column is final.
    pub(crate) fn finish_rows(&mut self, rows: usize) {
        self.len = rows;
        let nb = rows.div_ceil(BLOCK_ROWS);
        self.blocks.resize(nb, Block::EMPTY);
        self.seal_all();
        self.blocks.shrink_to_fit();
    }

    fn seal_all(&mut self) {
        let len = self.len;
        for (b, blk) in self.blocks.iter_mut().enumerate() {
            blk.seal(len.saturating_sub(b * BLOCK_ROWS).min(BLOCK_ROWS));
        }
    }

    /// The rows `order` of this column, in that order.
    pub(crate) fn gather(&self, order: &[usize]) -> Column {
        Column::from_cells(order.iter().map(|&i| self.get(i)))
    }
}

/// The present cells of a [`Column`]: `(row, value)` in row order.
#[derive(Debug, Clone)]
pub struct Present<'a> {
    blocks: &'a [Block],
    len: usize,
    b: usize,
    k: usize,
    /// The rest of a dense block whose cells are all present, handed out one by one
    /// before block `b` (a long log's metric is mostly such blocks).
    run: &'a [f64],
    /// The row of `run`'s first value.
    run_row: usize,
}

/// The first set bit at or after `from` and below `n`.
#[inline]
fn next_set(w: &[u64; WORDS], from: usize, n: usize) -> Option<usize> {
    let mut wi = from / 64;
    let mut x = *w.get(wi)? & (!0u64 << (from % 64));
    loop {
        if x != 0 {
            let k = wi * 64 + x.trailing_zeros() as usize;
            return (k < n).then_some(k);
        }
        wi += 1;
        if wi * 64 >= n {
            return None;
        }
        x = *w.get(wi)?;
    }
}

impl Iterator for Present<'_> {
    type Item = (usize, f64);

    #[inline]
    fn next(&mut self) -> Option<(usize, f64)> {
        if let Some((&v, rest)) = self.run.split_first() {
            self.run = rest;
            self.run_row += 1;
            return Some((self.run_row - 1, v));
        }
        self.next_block_cell()
    }
}

impl<'a> Present<'a> {
    /// The next present cell from block `b`, offset `k` on; a dense block with every cell
    /// present becomes the `run` after its first cell.
    fn next_block_cell(&mut self) -> Option<(usize, f64)> {
        loop {
            let base = self.b * BLOCK_ROWS;
            if base >= self.len {
                return None;
            }
            let blk: &'a Block = self.blocks.get(self.b)?;
            let n = (self.len - base).min(BLOCK_ROWS);
            if let (Bits::All, Vals::Dense(d)) = (&blk.bits, &blk.vals) {
                let first = self.k;
                self.b += 1;
                self.k = 0;
                if let Some((&v, rest)) = d.get(first..n).and_then(<[f64]>::split_first) {
                    self.run = rest;
                    self.run_row = base + first + 1;
                    return Some((base + first, v));
                }
                continue;
            }
            let found = match &blk.bits {
                Bits::None => None,
                Bits::All => (self.k < n).then_some(self.k),
                Bits::Some(w) => next_set(w, self.k, n),
            };
            match found {
                Some(k) => {
                    self.k = k + 1;
                    if let Some(v) = blk.value(k) {
                        return Some((base + k, v));
                    }
                }
                None => {
                    self.b += 1;
                    self.k = 0;
                }
            }
        }
    }
}

/// The frame's steps, one per row: blocks of consecutive steps with a constant stride are
/// two numbers, others are stored as they are.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    blocks: Vec<StepBlock>,
    len: usize,
}

#[derive(Debug, Clone)]
enum StepBlock {
    /// Row `k` of the block is `first + k·step`.
    Line { first: i64, step: i64 },
    /// The steps as they are (up to [`BLOCK_ROWS`]).
    Dense(Vec<i64>),
}

impl Steps {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The step of row `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<i64> {
        if i >= self.len {
            return None;
        }
        let k = i % BLOCK_ROWS;
        match self.blocks.get(i / BLOCK_ROWS)? {
            StepBlock::Line { first, step } => {
                Some(first.wrapping_add(step.wrapping_mul(k as i64)))
            }
            StepBlock::Dense(d) => d.get(k).copied(),
        }
    }

    /// The first row's step.
    pub fn first(&self) -> Option<i64> {
        self.get(0)
    }

    /// The last row's step.
    pub fn last(&self) -> Option<i64> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }

    /// Every row's step, in row order.
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.len).filter_map(|i| self.get(i))
    }

    /// The steps as a vector.
    pub fn to_vec(&self) -> Vec<i64> {
        self.iter().collect()
    }

    /// The row of `step`, by binary search: the steps must be ascending (a finished
    /// frame's are).
    pub fn position(&self, step: i64) -> Option<usize> {
        let (mut lo, mut hi) = (0usize, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid)?.cmp(&step) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<StepBlock>()
            + self
                .blocks
                .iter()
                .map(|b| match b {
                    StepBlock::Dense(d) => d.capacity() * 8,
                    StepBlock::Line { .. } => 0,
                })
                .sum::<usize>()
    }

    /// Append the step of a new row; a full block becomes a line when it is one.
    pub(crate) fn push(&mut self, s: i64) {
        if self.len.is_multiple_of(BLOCK_ROWS) {
            self.blocks
                .push(StepBlock::Dense(Vec::with_capacity(BLOCK_ROWS)));
        }
        if let Some(StepBlock::Dense(d)) = self.blocks.last_mut() {
            d.push(s);
        }
        self.len += 1;
        if self.len.is_multiple_of(BLOCK_ROWS) {
            if let Some(last) = self.blocks.last_mut() {
                compress_steps(last);
            }
        }
    }
}

impl FromIterator<i64> for Steps {
    fn from_iter<I: IntoIterator<Item = i64>>(iter: I) -> Steps {
        let mut s = Steps::default();
        for x in iter {
            s.push(x);
        }
        s
    }
}

fn compress_steps(b: &mut StepBlock) {
    let StepBlock::Dense(d) = b else { return };
    let (Some(&first), Some(&second)) = (d.first(), d.get(1)) else {
        return;
    };
    let step = second.wrapping_sub(first);
    if d.iter()
        .enumerate()
        .all(|(k, &x)| x == first.wrapping_add(step.wrapping_mul(k as i64)))
    {
        *b = StepBlock::Line { first, step };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_nan_stay_apart_through_every_block_kind() {
        // Block 0 dense, block 1 all NaN (one constant), block 2 NaN with holes,
        // a partial last block with -0.0 next to a missing cell.
        let n = 3 * BLOCK_ROWS + 10;
        let cell = |i: usize| -> Option<f64> {
            match i / BLOCK_ROWS {
                0 if i % 7 == 3 => None,
                0 if i.is_multiple_of(5) => Some(f64::NAN),
                0 => Some(i as f64 * 0.37),
                1 => Some(f64::NAN),
                2 if i % 2 == 1 => None,
                2 => Some(f64::NAN),
                _ if i % 2 == 1 => None,
                _ => Some(-0.0),
            }
        };
        let c = Column::from_cells((0..n).map(cell));
        assert_eq!(c.len(), n);
        for i in 0..n {
            let got = c.get(i);
            match cell(i) {
                None => assert_eq!(got, None, "row {i} must be missing"),
                Some(v) => {
                    let g = got.unwrap_or_else(|| panic!("row {i} must be present"));
                    assert_eq!(g.to_bits(), v.to_bits(), "row {i}");
                }
            }
        }
        assert_eq!(c.get(n), None);
        // The all-NaN block is one constant: no values array, no bitmap.
        assert_eq!(c.blocks[1].heap_bytes(), 0);
        assert!(matches!(c.blocks[1].vals, Vals::Line { .. }));
        let present: Vec<usize> = c.present().map(|(i, _)| i).collect();
        let expect: Vec<usize> = (0..n).filter(|&i| cell(i).is_some()).collect();
        assert_eq!(present, expect);
    }

    #[test]
    fn present_cells_of_dense_full_blocks_come_in_row_order() {
        // Dense blocks with every cell present (handed out as runs) around a block with
        // holes, a constant block and a partial last block.
        let n = 4 * BLOCK_ROWS + 3;
        let cell = |i: usize| -> Option<f64> {
            match i / BLOCK_ROWS {
                1 if i.is_multiple_of(3) => None,
                2 => Some(4.0),
                _ => Some((i * i) as f64 * 0.1),
            }
        };
        let c = Column::from_cells((0..n).map(cell));
        assert!(matches!(c.blocks[0].bits, Bits::All));
        assert!(matches!(c.blocks[0].vals, Vals::Dense(_)));
        let got: Vec<(usize, u64)> = c.present().map(|(i, v)| (i, v.to_bits())).collect();
        let want: Vec<(usize, u64)> = (0..n)
            .filter_map(|i| cell(i).map(|v| (i, v.to_bits())))
            .collect();
        assert_eq!(got, want);
        let short = Column::from_cells((0..5).map(|i| Some(i as f64 * 0.3)));
        assert_eq!(short.present().count(), 5);
    }

    #[test]
    fn lines_compress_exactly_and_a_later_write_off_the_line_densifies() {
        let ts = |i: usize| 1_759_944_000.0 + i as f64;
        let mut c = Column::from_cells((0..2 * BLOCK_ROWS).map(|i| Some(ts(i))));
        assert_eq!(
            c.heap_bytes(),
            c.blocks.capacity() * std::mem::size_of::<Block>()
        );
        assert!((0..2 * BLOCK_ROWS).all(|i| c.get(i) == Some(ts(i))));
        // Values that are not on a line stay dense, bit for bit.
        let r = Column::from_cells((0..BLOCK_ROWS).map(|i| Some(0.1 * (i * i) as f64)));
        assert!(matches!(r.blocks[0].vals, Vals::Dense(_)));
        assert!((0..BLOCK_ROWS).all(|i| r.get(i) == Some(0.1 * (i * i) as f64)));
        // First value wins; a new cell off the line turns the block dense.
        let mut h = Column::from_cells((0..BLOCK_ROWS).map(|i| (i != 9).then_some(2.5)));
        assert!(matches!(h.blocks[0].vals, Vals::Line { .. }));
        assert!(!h.set(3, 7.0));
        assert!(h.set(9, 7.0));
        assert!(matches!(h.blocks[0].vals, Vals::Dense(_)));
        assert_eq!(
            (h.get(3), h.get(9), h.get(10)),
            (Some(2.5), Some(7.0), Some(2.5))
        );
        assert!(!c.set(5, 0.0));
    }

    #[test]
    fn rare_cells_are_stored_sparse_and_stay_exact() {
        // A value every 97 rows (val_loss-like), NaN among them, then a merge write.
        let cell = |i: usize| {
            (i % 97 == 5).then(|| {
                if i.is_multiple_of(3) {
                    f64::NAN
                } else {
                    (i as f64).sqrt()
                }
            })
        };
        let n = 2 * BLOCK_ROWS + 300;
        let mut c = Column::from_cells((0..n).map(cell));
        assert!(matches!(c.blocks[0].vals, Vals::Sparse { .. }));
        let present = (0..n).filter(|&i| cell(i).is_some()).count();
        assert!(
            c.heap_bytes() < present * 8 + 3 * (WORDS * 10) + 256,
            "{}",
            c.heap_bytes()
        );
        let same = |c: &Column, i: usize, want: Option<f64>| {
            assert_eq!(
                c.get(i).map(f64::to_bits),
                want.map(f64::to_bits),
                "row {i}"
            );
        };
        for i in 0..n {
            same(&c, i, cell(i));
        }
        let listed: Vec<(usize, u64)> = c.present().map(|(i, v)| (i, v.to_bits())).collect();
        let want: Vec<(usize, u64)> = (0..n)
            .filter_map(|i| cell(i).map(|v| (i, v.to_bits())))
            .collect();
        assert_eq!(listed, want);
        assert!(c.set(7, -1.0));
        assert!(!c.set(5, 0.0));
        assert!(matches!(c.blocks[0].vals, Vals::Dense(_)));
        for i in 0..n {
            same(&c, i, if i == 7 { Some(-1.0) } else { cell(i) });
        }
    }

    #[test]
    fn steps_compress_and_search() {
        let s: Steps = (0..3 * BLOCK_ROWS as i64 + 5).map(|i| 10 * i - 7).collect();
        assert!(s.heap_bytes() < 2 * BLOCK_ROWS * 8);
        assert_eq!(
            s.get(BLOCK_ROWS + 1),
            Some(10 * (BLOCK_ROWS as i64 + 1) - 7)
        );
        assert_eq!(s.last(), Some(10 * (3 * BLOCK_ROWS as i64 + 4) - 7));
        assert_eq!(s.position(10 * 5000 - 7), Some(5000));
        assert_eq!(s.position(10 * 5000 - 6), None);
        let odd: Steps = [5, 1, 9].into_iter().collect();
        assert_eq!(odd.to_vec(), vec![5, 1, 9]);
        assert_eq!(odd.get(3), None);
    }
}
