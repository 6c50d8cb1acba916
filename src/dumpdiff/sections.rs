//! The comparison sections: each turns the values read for one rank × micro cell (or the
//! whole batch) into typed [`Comparison`]s. Reference side = self-hosted ("a"), other = "b".

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Mutex;

use rayon::prelude::*;

use crate::compare::align::{match_rows_by, strip_pad_range, RowMatch};
use crate::compare::metrics::{
    effective_dtype, Accumulator, ElemLoc, GridScan, PairMetrics, Positions,
};
use crate::compare::propagate::{self, ChainElem, ChainStats};
use crate::compare::tolerance::{coarser, Tolerance, TolerancePolicy, Verdict};
pub use crate::dumpdiff::mat::Mat;
use crate::dumpdiff::mat::CHUNK;
use crate::dumpdiff::pages::Pages;
use crate::dumpdiff::report::{Cell, Comparison, Origin, RowSummary};
use crate::dumpdiff::Progress;
use crate::error::Result;
use crate::frames::tokens_hash;
use crate::readers::layout::{DumpTree, Kind};
use crate::readers::read_any;
use crate::tensor::{DType, Tensor};
use crate::value::Value;

/// One side's tree and its files at the compared step. Whole-batch files are parsed up
/// front and kept; per-rank files are only listed, and read by the cell that compares them
/// ([`SideData::fetch`]) and dropped with it, so memory follows one cell, not the tree.
pub struct SideData {
    /// The flag it came from: `self-hosted`, `remote-api`, `weaver`.
    pub role: &'static str,
    /// Its discovered layout.
    pub tree: DumpTree,
    /// Parsed whole-batch files (no rank in the name) by path.
    pub values: HashMap<PathBuf, Value>,
    /// Per-rank files of the step (after the rank/micro filters), read on demand: path → size.
    pub streamed: HashMap<PathBuf, u64>,
    /// The compared step.
    pub step: i64,
    /// Streamed files read so far.
    read: Mutex<HashSet<PathBuf>>,
    /// The file at each (kind, rank, micro) of the step, as [`DumpTree::get`] picks it.
    index: HashMap<(Kind, Option<u32>, Option<u32>), usize>,
    /// The maps whole-batch `.pt` files were read from, by path.
    pages: HashMap<PathBuf, Pages>,
}

impl SideData {
    /// A side whose `values` are read and whose `streamed` files will be.
    pub fn new(
        role: &'static str,
        tree: DumpTree,
        values: HashMap<PathBuf, Value>,
        streamed: HashMap<PathBuf, u64>,
        step: i64,
    ) -> Self {
        let mut index = HashMap::new();
        for (i, f) in tree.files().iter().enumerate() {
            if f.step == step {
                // The first file of a coordinate wins, as in `DumpTree::get`.
                index.entry((f.kind, f.rank, f.micro)).or_insert(i);
            }
        }
        SideData {
            role,
            tree,
            values,
            streamed,
            step,
            read: Mutex::new(HashSet::new()),
            index,
            pages: HashMap::new(),
        }
    }

    /// This side with the maps its whole-batch files were read from (see
    /// [`crate::dumpdiff::pages::read_whole`]).
    pub fn with_pages(mut self, pages: HashMap<PathBuf, Pages>) -> Self {
        self.pages = pages;
        self
    }

    /// The map of the whole-batch file of `kind` at (rank, micro), if it was read from one.
    pub fn pages(&self, kind: Kind, rank: Option<u32>, micro: Option<u32>) -> Option<&Pages> {
        let f = self.file(kind, rank, micro)?;
        self.pages.get(&f.path)
    }

    /// The file of `kind` at (rank, micro) of the compared step (what `tree.get` finds).
    fn file(
        &self,
        kind: Kind,
        rank: Option<u32>,
        micro: Option<u32>,
    ) -> Option<&crate::readers::layout::DumpFile> {
        let &i = self.index.get(&(kind, rank, micro))?;
        self.tree.files().get(i)
    }

    /// The parsed whole-batch file of `kind` at (rank, micro), if that file exists.
    pub fn get(&self, kind: Kind, rank: Option<u32>, micro: Option<u32>) -> Option<&Value> {
        let f = self.file(kind, rank, micro)?;
        self.values.get(&f.path)
    }

    /// Whether `path` is one of this side's files at the compared step.
    pub fn has(&self, path: &Path) -> bool {
        self.values.contains_key(path) || self.streamed.contains_key(path)
    }

    /// The file of `kind` at (rank, micro): borrowed when read up front, else read now
    /// (the caller drops it when its cell is done). `None` when there is no such file.
    pub fn fetch(
        &self,
        kind: Kind,
        rank: Option<u32>,
        micro: Option<u32>,
        progress: &dyn Progress,
    ) -> Result<Option<Cow<'_, Value>>> {
        let Some(f) = self.file(kind, rank, micro) else {
            return Ok(None);
        };
        if let Some(v) = self.values.get(&f.path) {
            return Ok(Some(Cow::Borrowed(v)));
        }
        let Some(&size) = self.streamed.get(&f.path) else {
            return Ok(None);
        };
        let v = read_any(&f.path)?;
        progress.file_done(size);
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(f.path.clone());
        Ok(Some(Cow::Owned(v)))
    }

    /// Read (and drop) every streamed file no cell has read, so that an unreadable file
    /// fails the run whether or not a section needed it.
    pub fn check_unread(&self, progress: &dyn Progress) -> Result<()> {
        let unread: Vec<(&PathBuf, u64)> = {
            let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            self.streamed
                .iter()
                .filter(|(p, _)| !read.contains(*p))
                .map(|(p, &s)| (p, s))
                .collect()
        };
        unread.par_iter().try_for_each(|(path, size)| {
            read_any(path)?;
            progress.file_done(*size);
            Ok(())
        })
    }

    /// Files of the compared step (read up front or streamed).
    pub fn files_read(&self) -> usize {
        self.values.len() + self.streamed.len()
    }

    /// Their bytes.
    pub fn bytes_read(&self) -> u64 {
        self.tree
            .files()
            .iter()
            .filter(|f| self.has(&f.path))
            .map(|f| f.size)
            .sum()
    }
}

/// One parsed file of a cell with its tensors decoded on first use, each once: a cell's
/// comparisons and its derived chain share the decoded matrices, token rows and row
/// pairings. Lives inside one cell's task (not `Send`).
pub struct Tensors<'v> {
    value: &'v Value,
    mats: RefCell<HashMap<&'static str, Option<Rc<Mat>>>>,
    tokens: OnceCell<Option<Rc<TokenRows>>>,
    /// Content pairings with other files of the cell, by the other file's address.
    pairings: RefCell<Vec<(*const Value, Rc<RowMatch>)>>,
    /// The last comparison of this file's `log_probs` (see [`PairCtx::logprobs_memo`]).
    logprobs: RefCell<Option<LogprobMemo>>,
}

/// A comparison of a reference file's `log_probs` (under its `response_mask`): what it
/// was compared with, and the result.
struct LogprobMemo {
    b: Rc<Mat>,
    mask_b: Option<Rc<Mat>>,
    rows: Rc<RowMatch>,
    /// atol and rtol, bit for bit.
    tol: (u64, u64),
    metrics: PairMetrics,
}

impl<'v> Tensors<'v> {
    /// Wrap a parsed file; nothing is decoded yet.
    pub fn new(value: &'v Value) -> Self {
        Tensors {
            value,
            mats: RefCell::new(HashMap::new()),
            tokens: OnceCell::new(),
            pairings: RefCell::new(Vec::new()),
            logprobs: RefCell::new(None),
        }
    }

    /// The parsed file.
    pub fn value(&self) -> &'v Value {
        self.value
    }

    /// [`Mat::of`] the tensor under `key`, decoded on the first call.
    pub fn mat(&self, key: &'static str) -> Option<Rc<Mat>> {
        if let Some(m) = self.mats.borrow().get(key) {
            return m.clone();
        }
        let m = Mat::of(self.value, key).map(Rc::new);
        self.mats.borrow_mut().insert(key, m.clone());
        m
    }

    /// [`token_rows`] of `input_ids`, decoded on the first call.
    pub fn input_ids(&self) -> Option<Rc<TokenRows>> {
        self.tokens
            .get_or_init(|| token_rows(self.value, "input_ids").map(Rc::new))
            .clone()
    }

    /// [`match_rows`] of this file's `input_ids` against `other`'s, computed once per pair
    /// of files; None when either lacks them.
    fn content_rows(&self, other: &Tensors<'_>) -> Option<Rc<RowMatch>> {
        let key: *const Value = other.value;
        if let Some((_, m)) = self.pairings.borrow().iter().find(|(k, _)| *k == key) {
            return Some(m.clone());
        }
        let (a, b) = (self.input_ids()?, other.input_ids()?);
        let m = Rc::new(match_rows_by(
            a.len(),
            b.len(),
            |i, m| a.hash(i, m),
            |j, m| b.hash(j, m),
        ));
        self.pairings.borrow_mut().push((key, m.clone()));
        Some(m)
    }
}

/// Token rows with padding stripped: the ids (read in place when stored as
/// little-endian i64, else widened once) and each row's span of them.
#[derive(Debug, Clone)]
pub struct TokenRows {
    ids: TokenIds,
    spans: Vec<std::ops::Range<usize>>,
}

#[derive(Debug, Clone)]
enum TokenIds {
    /// Widened to i64.
    Owned(Vec<i64>),
    /// A contiguous i64 tensor: its elements are the little-endian bytes
    /// [`tokens_hash`] hashes.
    Stored(Tensor),
}

impl TokenRows {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// [`tokens_hash`] of row `i`, or of row `i` without its last token (None when the
    /// row is empty).
    pub fn hash(&self, i: usize, minus_last: bool) -> Option<u64> {
        let s = self.spans.get(i)?;
        let end = if minus_last {
            s.end.checked_sub(1).filter(|&e| e >= s.start)?
        } else {
            s.end
        };
        Some(match &self.ids {
            TokenIds::Owned(ids) => tokens_hash(&ids[s.start..end]),
            TokenIds::Stored(t) => {
                let base = t.offset() * 8;
                xxhash_rust::xxh3::xxh3_64(&t.storage_bytes()[base + s.start * 8..base + end * 8])
            }
        })
    }
}

/// The token rows of `key` (e.g. `input_ids`) with padding (0) stripped.
pub fn token_rows(v: &Value, key: &str) -> Option<TokenRows> {
    let t = v.get(key)?.to_tensor()?;
    if t.ndim() != 2 {
        return None;
    }
    let w = t.shape()[1].max(1);
    let row_spans = |zero: &dyn Fn(usize) -> bool, n: usize| -> Vec<std::ops::Range<usize>> {
        (0..n.div_ceil(w))
            .map(|r| {
                let (s, e) = (r * w, ((r + 1) * w).min(n));
                // `strip_pad_range`: past the leading and trailing zeros.
                let start = (s..e).find(|&i| !zero(i)).unwrap_or(e);
                let end = (start..e)
                    .rev()
                    .find(|&i| !zero(i))
                    .map_or(start, |i| i + 1);
                start..end
            })
            .collect()
    };
    let n = t.numel();
    if t.dtype() == DType::I64 && t.is_contiguous() && n <= t.storage_numel() {
        let bytes = &t.storage_bytes()[t.offset() * 8..(t.offset() + n) * 8];
        let zero = |i: usize| bytes[i * 8..i * 8 + 8] == [0u8; 8];
        let spans = row_spans(&zero, n);
        return Some(TokenRows {
            ids: TokenIds::Stored(t),
            spans,
        });
    }
    let ids = t.to_i64_vec();
    let spans = ids
        .chunks(w)
        .enumerate()
        .map(|(i, r)| {
            let kept = strip_pad_range(r, 0);
            i * w + kept.start..i * w + kept.end
        })
        .collect();
    Some(TokenRows {
        ids: TokenIds::Owned(ids),
        spans,
    })
}

/// Pair the rows of a reference file with another file's by their `input_ids` (by index
/// when either lacks them, or there is no other file).
pub fn pair_rows(a: &Tensors<'_>, b: Option<&Tensors<'_>>, na: usize, nb: usize) -> Rc<RowMatch> {
    b.and_then(|b| a.content_rows(b))
        .unwrap_or_else(|| Rc::new(RowMatch::by_index(na, nb)))
}

/// The row summary the report shows.
pub fn row_summary(rm: &RowMatch) -> RowSummary {
    RowSummary {
        method: rm.method,
        pairs: rm.pairs.clone(),
        only_reference: rm.only_a.clone(),
        only_other: rm.only_b.clone(),
    }
}

/// Shared inputs of one cell's comparisons.
pub struct PairCtx<'a> {
    /// Tolerance policy.
    pub policy: &'a TolerancePolicy,
    /// Section prefix of names (`forward_data`).
    pub section: &'a str,
    /// Row pairing.
    pub rows: &'a RowMatch,
    /// Validity mask, reference side (None: every position of the data is valid).
    pub mask_a: Option<&'a Mat>,
    /// Validity mask, other side.
    pub mask_b: Option<&'a Mat>,
    /// The precision of the cell's log-prob inputs, which bounds derived quantities.
    pub cell_precision: Option<DType>,
}

/// Reusable buffers of one comparison: decoded chunks of each input, and the pairs kept.
#[derive(Default)]
struct Bufs {
    a: Vec<f64>,
    b: Vec<f64>,
    extra: Vec<f64>,
    extra_padded: Vec<f64>,
    ranges: Vec<Range<usize>>,
    kept: Kept,
}

/// The pairs of a chunk valid on both sides, with their positions.
#[derive(Default)]
struct Kept {
    a: Vec<f64>,
    b: Vec<f64>,
    extra: Vec<f64>,
    pos: Vec<usize>,
}

impl Kept {
    /// Gather the pairs at `ranges` (absolute positions, within a chunk read from `lo`).
    fn gather(
        &mut self,
        ranges: &[Range<usize>],
        lo: usize,
        xa: &[f64],
        xb: &[f64],
        ex: Option<&[f64]>,
    ) {
        self.a.clear();
        self.b.clear();
        self.extra.clear();
        self.pos.clear();
        for r in ranges {
            let local = r.start - lo..r.end - lo;
            self.a.extend_from_slice(&xa[local.clone()]);
            self.b.extend_from_slice(&xb[local.clone()]);
            if let Some(e) = ex {
                self.extra.extend_from_slice(&e[local]);
            }
            self.pos.extend(r.clone());
        }
    }
}

/// The positions of `[0, n)` in both `a` and `b` (ascending ranges each), as ascending
/// ranges of at most [`CHUNK`] positions, into `out`.
fn intersect(a: &[Range<usize>], b: &[Range<usize>], n: usize, out: &mut Vec<Range<usize>>) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end).min(n);
        let mut s = start;
        while s < end {
            let e = (s + CHUNK).min(end);
            out.push(s..e);
            s = e;
        }
        if a[i].end < b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
}

/// `v` padded with zeros to `len` (copied into `buf` only when short).
fn padded<'s>(v: &'s [f64], len: usize, buf: &'s mut Vec<f64>) -> &'s [f64] {
    if v.len() >= len {
        return v;
    }
    buf.clear();
    buf.extend_from_slice(v);
    buf.resize(len, 0.0);
    buf
}

fn ulp_dtype(a: DType, b: DType) -> Option<DType> {
    (a == b && a.is_float()).then_some(a)
}

impl PairCtx<'_> {
    fn tolerance(&self, name: &str, precision: DType, derived: bool) -> (Tolerance, DType) {
        let p = match (derived, self.cell_precision) {
            (true, Some(c)) if precision.is_float() => coarser(precision, c),
            _ => precision,
        };
        (self.policy.resolve(name, p, derived), p)
    }

    /// Compare two row-wise tensors at positions valid on both sides.
    #[allow(clippy::too_many_arguments)]
    pub fn masked(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        derived: bool,
        logprob: bool,
    ) -> Comparison {
        self.masked_with(key, a, b, origin_a, origin_b, derived, logprob, None)
    }

    /// [`PairCtx::masked`] for a derived tensor whose elements carry the error propagated
    /// from their inputs (`extra`, same layout as `a`): judged at the values' own precision
    /// plus that error (see [`crate::compare::propagate`]).
    pub fn propagated(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        extra: &Mat,
    ) -> Comparison {
        self.masked_with(key, a, b, origin_a, origin_b, false, false, Some(extra))
    }

    #[allow(clippy::too_many_arguments)]
    fn masked_with(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        derived: bool,
        logprob: bool,
        extra: Option<&Mat>,
    ) -> Comparison {
        let name = format!("{}.{key}", self.section);
        let (mut tol, precision) =
            self.tolerance(&name, coarser(a.precision(), b.precision()), derived);
        let extra = extra.filter(|_| !self.policy.overridden());
        if extra.is_some() {
            tol.source = format!("{} + error propagated from log-prob inputs", tol.source);
        }
        let metrics = self.measure(a, b, &tol, logprob, extra);
        comparison(name, metrics, tol, precision, a, b, origin_a, origin_b)
    }

    /// The metrics of `a` against `b` at the positions valid on both sides, each element
    /// allowed `tol` plus its `extra`.
    fn measure(
        &self,
        a: &Mat,
        b: &Mat,
        tol: &Tolerance,
        logprob: bool,
        extra: Option<&Mat>,
    ) -> PairMetrics {
        let mut acc = Accumulator::new(tol.clone(), ulp_dtype(a.dtype, b.dtype), logprob);
        let mut buf = Bufs::default();
        for &(ra, rb) in &self.rows.pairs {
            // Positions of both rows (none when either row is missing) valid on both sides.
            let n = if ra < a.rows && rb < b.rows {
                a.width.min(b.width)
            } else {
                0
            };
            let all = 0..n;
            let full = std::slice::from_ref(&all);
            let va = self.mask_a.map_or(full, |m| m.nonzero(ra));
            let vb = self.mask_b.map_or(full, |m| m.nonzero(rb));
            let mut ranges = std::mem::take(&mut buf.ranges);
            intersect(va, vb, n, &mut ranges);
            // Batches of ranges spanning at most CHUNK positions (every range is at most
            // that long): read once, then fed straight (one range) or gathered (several).
            let mut rest = &ranges[..];
            while let Some(first) = rest.first() {
                let lo = first.start;
                let k = rest
                    .iter()
                    .take_while(|r| r.end <= lo + CHUNK)
                    .count()
                    .max(1);
                let (batch, tail) = rest.split_at(k);
                rest = tail;
                let hi = batch[k - 1].end;
                let xa = a.chunk(ra, lo, hi, &mut buf.a);
                let xb = b.chunk(rb, lo, hi, &mut buf.b);
                // An extra narrower than the data adds 0 past its end.
                let ex = extra.map(|e| {
                    let v = e.chunk(ra, lo, hi, &mut buf.extra);
                    padded(v, hi - lo, &mut buf.extra_padded)
                });
                if let [only] = batch {
                    let r = only.start - lo..only.end - lo;
                    let ex = ex.map(|e| &e[r.clone()]);
                    acc.push_run(
                        &xa[r.clone()],
                        &xb[r],
                        ex,
                        Positions::From(only.start),
                        ra,
                        rb,
                    );
                } else {
                    let c = &mut buf.kept;
                    c.gather(batch, lo, xa, xb, ex);
                    let ex = ex.map(|_| &c.extra[..]);
                    acc.push_run(&c.a, &c.b, ex, Positions::At(&c.pos), ra, rb);
                }
            }
            buf.ranges = ranges;
        }
        acc.finish()
    }

    /// [`PairCtx::masked`] of the reference's log-probs against the other side's, reusing
    /// `memo` (a comparison of the same pairs made earlier in the cell) when the inputs
    /// are the same values at the same positions under the same tolerance: weaver dumps
    /// one log-prob tensor in both `forward_data` and `is_loss_debug`.
    #[allow(clippy::too_many_arguments)]
    fn logprobs_memo(
        &self,
        a: &Mat,
        b: &Rc<Mat>,
        mask_b: Option<&Rc<Mat>>,
        rows: &Rc<RowMatch>,
        origin_a: Origin,
        origin_b: Origin,
        memo: &RefCell<Option<LogprobMemo>>,
    ) -> Comparison {
        let name = format!("{}.log_probs", self.section);
        let (tol, precision) = self.tolerance(&name, coarser(a.precision(), b.precision()), false);
        let key = (tol.atol.to_bits(), tol.rtol.to_bits());
        let reused = memo.borrow().as_ref().and_then(|m| {
            let same_mask = match (&m.mask_b, mask_b) {
                (None, None) => true,
                (Some(x), Some(y)) => x.same_nonzero(y),
                _ => false,
            };
            (m.tol == key && m.rows.pairs == rows.pairs && same_mask && m.b.same_values(b))
                .then(|| m.metrics.clone())
        });
        let metrics = reused.unwrap_or_else(|| self.measure(a, b, &tol, true, None));
        *memo.borrow_mut() = Some(LogprobMemo {
            b: b.clone(),
            mask_b: mask_b.cloned(),
            rows: rows.clone(),
            tol: key,
            metrics: metrics.clone(),
        });
        comparison(name, metrics, tol, precision, a, b, origin_a, origin_b)
    }

    /// Compare two masks (or other 0/1 tensors) exactly over every position, a position
    /// past a trimmed side's width counting as 0.
    pub fn exact_rows(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
    ) -> Comparison {
        let name = format!("{}.{key}", self.section);
        let tol = self.policy.resolve(&name, DType::I64, false);
        let mut acc = Accumulator::new(tol.clone(), None, false);
        let mut buf = Bufs::default();
        let width = |m: &Mat, r: usize| if r < m.rows { m.width } else { 0 };
        for &(ra, rb) in &self.rows.pairs {
            let n = width(a, ra).max(width(b, rb));
            for p0 in (0..n).step_by(CHUNK) {
                let p1 = (p0 + CHUNK).min(n);
                let xa = padded(a.chunk(ra, p0, p1, &mut buf.a), p1 - p0, &mut buf.kept.a);
                let xb = padded(b.chunk(rb, p0, p1, &mut buf.b), p1 - p0, &mut buf.kept.b);
                acc.push_run(xa, xb, None, Positions::From(p0), ra, rb);
            }
        }
        finish(name, acc, tol, DType::I64, a, b, origin_a, origin_b)
    }

    /// Compare two scalars.
    pub fn scalar(
        &self,
        key: &str,
        a: &Value,
        b: &Value,
        origin_a: Origin,
        origin_b: Origin,
        derived: bool,
    ) -> Option<Comparison> {
        self.scalar_with(key, a, b, origin_a, origin_b, derived, None)
    }

    /// Compare two scalars; `propagated` (the error a masked aggregate inherits from its
    /// elements, with how it was obtained) replaces the derived-precision rule when known.
    #[allow(clippy::too_many_arguments)]
    pub fn scalar_with(
        &self,
        key: &str,
        a: &Value,
        b: &Value,
        origin_a: Origin,
        origin_b: Origin,
        derived: bool,
        propagated: Option<(f64, String)>,
    ) -> Option<Comparison> {
        let propagated = propagated.filter(|_| !self.policy.overridden());
        let derived = derived && propagated.is_none();
        let (x, y) = (a.as_f64()?, b.as_f64()?);
        let dt = |v: &Value| match v {
            Value::Int(_) | Value::Bool(_) => DType::I64,
            Value::Tensor(t) => t.dtype(),
            _ => DType::F64,
        };
        let (da, db) = (dt(a), dt(b));
        let prec = coarser(effective_dtype(da, &[x]), effective_dtype(db, &[y]));
        let prec = if da.is_float() || db.is_float() {
            prec
        } else {
            DType::I64
        };
        let name = format!("{}.{key}", self.section);
        let (mut tol, precision) = self.tolerance(&name, prec, derived);
        let extra = match &propagated {
            Some((e, how)) => {
                tol.source = format!("{} + {} {how}", tol.source, crate::fmt::num(*e));
                *e
            }
            None => 0.0,
        };
        let mut acc = Accumulator::new(tol.clone(), None, false);
        acc.push_allowing(x, y, extra, ElemLoc::default());
        let metrics = acc.finish();
        let (verdict, reason) = tol.verdict(metrics.beyond, metrics.count);
        Some(Comparison {
            name,
            origin_a,
            origin_b,
            dtype_a: Some(da),
            dtype_b: Some(db),
            precision: Some(precision),
            shape_a: vec![],
            shape_b: vec![],
            tolerance: tol,
            metrics: Some(metrics),
            verdict,
            reason,
        })
    }
}

/// Turn an accumulator into a [`Comparison`] judged by `tol`.
#[allow(clippy::too_many_arguments)]
pub fn finish(
    name: String,
    acc: Accumulator,
    tol: Tolerance,
    precision: DType,
    a: &Mat,
    b: &Mat,
    origin_a: Origin,
    origin_b: Origin,
) -> Comparison {
    comparison(name, acc.finish(), tol, precision, a, b, origin_a, origin_b)
}

/// A [`Comparison`] of `metrics` judged by `tol`.
#[allow(clippy::too_many_arguments)]
fn comparison(
    name: String,
    metrics: PairMetrics,
    tol: Tolerance,
    precision: DType,
    a: &Mat,
    b: &Mat,
    origin_a: Origin,
    origin_b: Origin,
) -> Comparison {
    let (verdict, reason) = tol.verdict(metrics.beyond, metrics.count);
    Comparison {
        name,
        origin_a,
        origin_b,
        dtype_a: Some(a.dtype),
        dtype_b: Some(b.dtype),
        precision: Some(precision),
        shape_a: a.shape.clone(),
        shape_b: b.shape.clone(),
        tolerance: tol,
        metrics: Some(metrics),
        verdict,
        reason,
    }
}

/// A comparison that could not be made, with the reason (verdict Skipped).
pub fn skipped(section: &str, key: &str, reason: impl Into<String>) -> Comparison {
    Comparison {
        name: format!("{section}.{key}"),
        origin_a: Origin::dumped("-", key),
        origin_b: Origin::dumped("-", key),
        dtype_a: None,
        dtype_b: None,
        precision: None,
        shape_a: vec![],
        shape_b: vec![],
        tolerance: Tolerance::new(0.0, 0.0, "n/a"),
        metrics: None,
        verdict: Verdict::Skipped,
        reason: reason.into(),
    }
}

/// Build a cell from its comparisons: the verdict is the worst, the reason the worst one's.
pub fn cell(
    rank: Option<u32>,
    micro: Option<u32>,
    rows: Option<RowSummary>,
    comparisons: Vec<Comparison>,
) -> Cell {
    let worst = comparisons.iter().max_by_key(|c| c.verdict);
    let (verdict, reason) = match worst {
        Some(c) if c.verdict > Verdict::Pass => (c.verdict, format!("{}: {}", c.name, c.reason)),
        Some(_) => (
            Verdict::Pass,
            format!(
                "{} compared, all within tolerance",
                comparisons
                    .iter()
                    .filter(|c| c.verdict == Verdict::Pass)
                    .count()
            ),
        ),
        None => (Verdict::Skipped, "nothing to compare".into()),
    };
    let verdict =
        if comparisons.iter().all(|c| c.verdict == Verdict::Skipped) && !comparisons.is_empty() {
            Verdict::Skipped
        } else {
            verdict
        };
    Cell {
        rank,
        micro,
        verdict,
        reason,
        rows,
        comparisons,
    }
}

/// A cell present on one side only.
pub fn missing_cell(rank: Option<u32>, micro: Option<u32>, present: &str, missing: &str) -> Cell {
    Cell {
        rank,
        micro,
        verdict: Verdict::Missing,
        reason: format!("present on {present} only, missing on {missing}"),
        rows: None,
        comparisons: vec![],
    }
}

/// The coarser precision of two log-prob tensors, when both are there.
pub fn logprob_precision(a: Option<&Mat>, b: Option<&Mat>) -> Option<DType> {
    Some(coarser(a?.precision(), b?.precision()))
}

/// Section 2: `forward_data` — response_mask exactly, log_probs and entropy mask-aware.
pub fn forward_data_cell(
    policy: &TolerancePolicy,
    rank: u32,
    micro: u32,
    a: &Tensors<'_>,
    b: &Tensors<'_>,
) -> Cell {
    let (lp_a, lp_b) = (a.mat("log_probs"), b.mat("log_probs"));
    let (ma, mb) = (a.mat("response_mask"), b.mat("response_mask"));
    let na = lp_a.as_ref().map_or(0, |m| m.rows);
    let nb = lp_b.as_ref().map_or(0, |m| m.rows);
    let rows = pair_rows(a, Some(b), na, nb);
    let ctx = PairCtx {
        policy,
        section: "forward_data",
        rows: &rows,
        mask_a: ma.as_deref(),
        mask_b: mb.as_deref(),
        cell_precision: None,
    };
    let mut out = Vec::new();
    match (&ma, &mb) {
        (Some(x), Some(y)) => out.push(ctx.exact_rows(
            "response_mask",
            x,
            y,
            Origin::dumped("forward_data", "response_mask"),
            Origin::dumped("forward_data", "response_mask"),
        )),
        _ => out.push(skipped(
            "forward_data",
            "response_mask",
            "not dumped on both sides",
        )),
    }
    match (&lp_a, &lp_b) {
        (Some(x), Some(y)) => out.push(ctx.logprobs_memo(
            x,
            y,
            mb.as_ref(),
            &rows,
            Origin::dumped("forward_data", "log_probs"),
            Origin::dumped("forward_data", "log_probs"),
            &a.logprobs,
        )),
        _ => out.push(skipped(
            "forward_data",
            "log_probs",
            "not dumped on both sides",
        )),
    }
    match (a.mat("entropy"), b.mat("entropy")) {
        (Some(x), Some(y)) => out.push(ctx.masked(
            "entropy",
            &x,
            &y,
            Origin::dumped("forward_data", "entropy"),
            Origin::dumped("forward_data", "entropy"),
            false,
            false,
        )),
        _ => out.push(skipped(
            "forward_data",
            "entropy",
            "not dumped on both sides",
        )),
    }
    if !rows.only_a.is_empty() || !rows.only_b.is_empty() {
        out.push(row_coverage_fail("forward_data", &rows));
    }
    cell(Some(rank), Some(micro), Some(row_summary(&rows)), out)
}

/// A failing pseudo-comparison for rows that found no partner by content.
fn row_coverage_fail(section: &str, rows: &RowMatch) -> Comparison {
    let mut c = skipped(section, "rows", "");
    c.verdict = Verdict::Fail;
    c.reason = format!(
        "rows without a content match: reference {:?}, other {:?}",
        rows.only_a, rows.only_b
    );
    c
}

/// Whole-batch inputs the self-hosted side needs to mirror weaver's `is_loss_debug`.
pub struct BatchInputs {
    /// `old_log_probs` `[B, R]` from `old_log_probs/step_N`.
    pub old_log_probs: Option<Mat>,
    /// Token hash of each trajectory → its batch index.
    pub traj_index: HashMap<u64, usize>,
    /// Per-trajectory advantages by batch index: remote-api `prepared_trajectories`, else
    /// recomputed from the trajectories' rewards and groups with the preset's convention.
    pub advantages: Option<Vec<f64>>,
    /// Where `advantages` came from, for the report's origin labels.
    pub advantages_from: String,
    /// Micros per rank on the self-hosted side (for contiguous slicing without trajectories).
    pub micros_per_rank: usize,
}

/// The batch indices of a self-hosted micro's rows: by token content through the
/// trajectory file, else contiguous (`(rank·micros + micro)·rows + row`).
fn batch_indices(
    inputs: &BatchInputs,
    fwd: &Tensors<'_>,
    rank: u32,
    micro: u32,
    nrows: usize,
) -> (Vec<Option<usize>>, String) {
    if let Some(tok) = fwd.input_ids() {
        if !inputs.traj_index.is_empty() {
            let idx: Vec<Option<usize>> = (0..tok.len())
                .map(|i| {
                    tok.hash(i, false)
                        .and_then(|h| inputs.traj_index.get(&h).copied())
                })
                .collect();
            if idx.iter().all(Option::is_some) {
                return (idx, "rows located in the batch by token hash".into());
            }
        }
    }
    let base = (rank as usize * inputs.micros_per_rank + micro as usize) * nrows;
    (
        (0..nrows).map(|r| Some(base + r)).collect(),
        "rows located in the batch contiguously".into(),
    )
}

/// The reference side's importance-sampling chain for one micro, derived from its dumped
/// inputs, with every element's propagated tolerance ([`crate::compare::propagate`]).
pub struct Chain {
    /// Batch index of each row (None where not found).
    pub idx: Vec<Option<usize>>,
    /// How the rows were located in the batch.
    pub how: String,
    /// `old_log_probs` sliced to this micro's rows.
    pub old: Option<Mat>,
    /// `exp(log_probs − old_log_probs)`.
    pub ratio: Option<Mat>,
    /// Allowed error of each ratio element: `r·(e^E − 1)`, `E` the inputs' tolerances.
    pub ratio_allowed: Option<Mat>,
    /// Advantages broadcast over the row (remote-api `prepared_trajectories`).
    pub adv: Option<Mat>,
    /// Where `adv` came from (see [`BatchInputs::advantages_from`]).
    pub adv_from: String,
    /// The valid elements, for the tolerances of masked means and clip fractions.
    pub stats: Option<ChainStats>,
    /// Set when `ratio` and `ratio_allowed` hold only the valid positions (NaN elsewhere).
    partial: Option<Derive>,
}

/// The other side's dumps a [`Chain`] borrows precisions and advantages from.
#[derive(Clone, Copy, Default)]
pub struct ChainPeer<'a> {
    /// The other side's `forward_data` (its `input_ids` pair rows, its log-prob precision).
    pub fwd: Option<&'a Tensors<'a>>,
    /// The other side's `is_loss_debug` (old_log_probs precision, advantages).
    pub is_loss: Option<&'a Tensors<'a>>,
}

/// Derive one micro's chain from the reference `forward_data` and the batch inputs.
/// The log-prob inputs' tolerances are those their own comparisons use (the coarser
/// precision of both sides), so a ratio is allowed what its inputs are allowed.
pub fn chain(
    policy: &TolerancePolicy,
    inputs: &BatchInputs,
    a_fwd: &Tensors<'_>,
    peer: ChainPeer<'_>,
    rank: u32,
    micro: u32,
) -> Chain {
    let lp_a = a_fwd.mat("log_probs");
    let mask_a = a_fwd.mat("response_mask");
    let na = lp_a.as_ref().map_or(0, |m| m.rows);
    let (idx, how) = batch_indices(inputs, a_fwd, rank, micro, na);
    let old = inputs.old_log_probs.as_ref().and_then(|old| {
        let mut data = Vec::with_capacity(na * old.width);
        for i in &idx {
            let r = old.row((*i)?);
            if r.len() != old.width {
                return None;
            }
            data.extend_from_slice(&r);
        }
        // This micro's rows are copied: let their pages go.
        old.release_rows(idx.iter().flatten().copied());
        Some(Mat::new(
            vec![na, old.width],
            na,
            old.width,
            data,
            old.dtype,
        ))
    });
    let adv = inputs.advantages.as_ref().and_then(|adv| {
        let w = lp_a.as_ref()?.width;
        let mut data = Vec::with_capacity(na * w);
        for i in &idx {
            let v = *adv.get((*i)?)?;
            data.extend(std::iter::repeat_n(v, w));
        }
        Some(Mat::new(vec![na, w], na, w, data, DType::F64))
    });
    let (Some(lp), Some(o)) = (&lp_a, &old) else {
        return Chain {
            idx,
            how,
            old,
            ratio: None,
            ratio_allowed: None,
            adv,
            adv_from: inputs.advantages_from.clone(),
            stats: None,
            partial: None,
        };
    };
    let peer_prec = |v: Option<&Tensors<'_>>, key: &'static str| {
        v.and_then(|v| v.mat(key)).map(|m| m.precision())
    };
    let with_peer = |own: DType, other: Option<DType>| other.map_or(own, |p| coarser(own, p));
    let tol_lp = policy.resolve(
        "is_loss.log_probs",
        with_peer(
            lp.precision(),
            peer_prec(peer.fwd, "log_probs").or_else(|| peer_prec(peer.is_loss, "log_probs")),
        ),
        false,
    );
    let tol_old = policy.resolve(
        "is_loss.old_log_probs",
        with_peer(o.precision(), peer_prec(peer.is_loss, "old_log_probs")),
        false,
    );
    let derive = Derive {
        lp: lp.clone(),
        mask: mask_a.clone(),
        tol_lp,
        tol_old,
    };
    // The ratio where anything reads it (valid reference positions) when that already
    // shows it is f64 data; else everywhere, as its precision then needs every value.
    let first = derive.mask.is_some().then(|| derive.ratio(o, true));
    let (ratio, ratio_allowed, partial) = match first {
        Some((r, e, true)) => (r, e, true),
        _ => {
            let (r, e, _) = derive.ratio(o, false);
            (r, e, false)
        }
    };
    // |A| per row: the remote-api advantages, else the other side's (paired by content).
    let abs_adv: Vec<Option<f64>> = match &adv {
        Some(a) => (0..na).map(|r| a.row(r).first().map(|v| v.abs())).collect(),
        None => {
            let b_adv = peer.is_loss.and_then(|v| v.mat("advantages"));
            let nb = b_adv.as_ref().map_or(0, |m| m.rows);
            let rows = pair_rows(a_fwd, peer.fwd, na, nb);
            let mut out = vec![None; na];
            if let Some(b) = &b_adv {
                for &(ra, rb) in &rows.pairs {
                    if let Some(slot) = out.get_mut(ra) {
                        *slot = Some(b.row(rb).iter().fold(0.0f64, |m, v| m.max(v.abs())));
                    }
                }
            }
            out
        }
    };
    let all = 0..lp.width;
    let valid = |r: usize| {
        mask_a
            .as_deref()
            .map_or(std::slice::from_ref(&all), |m| m.nonzero(r))
    };
    let n_valid = (0..abs_adv.len())
        .flat_map(|r| valid(r).iter().map(|v| v.len()))
        .sum();
    let mut elems = Vec::with_capacity(n_valid);
    for (r, &abs_advantage) in abs_adv.iter().enumerate() {
        let (ratio_r, allowed_r) = (ratio.row(r), ratio_allowed.row(r));
        for p in valid(r).iter().flat_map(Range::clone) {
            if let (Some(&rt), Some(&al)) = (ratio_r.get(p), allowed_r.get(p)) {
                elems.push(ChainElem {
                    ratio: rt,
                    ratio_allowed: al,
                    abs_advantage,
                });
            }
        }
    }
    Chain {
        idx,
        how,
        old,
        ratio: Some(ratio),
        ratio_allowed: Some(ratio_allowed),
        adv,
        adv_from: inputs.advantages_from.clone(),
        stats: Some(ChainStats { elems }),
        partial: partial.then_some(derive),
    }
}

/// How a chain's ratio is derived, kept when it was computed at valid positions only, so
/// that a quantity whose precision needs every position can have them.
struct Derive {
    lp: Rc<Mat>,
    mask: Option<Rc<Mat>>,
    tol_lp: Tolerance,
    tol_old: Tolerance,
}

impl Derive {
    /// The positions of row `r` anything reads (the reference mask's non-zero ones, all
    /// without a mask), clipped to the width.
    fn valid(&self, r: usize) -> Vec<Range<usize>> {
        let w = self.lp.width;
        match &self.mask {
            None => std::iter::once(0..w).collect(),
            Some(m) => m
                .nonzero(r)
                .iter()
                .filter(|v| v.start < w)
                .map(|v| v.start..v.end.min(w))
                .collect(),
        }
    }

    /// `exp(logp − old)` and its allowance `r·(e^E − 1)` as matrices of the log-probs'
    /// layout. With `valid_only`, only at valid positions (NaN elsewhere), and the third
    /// value says whether those already make it f64 data (its precision is then set);
    /// else everywhere (third value false).
    fn ratio(&self, o: &Mat, valid_only: bool) -> (Mat, Mat, bool) {
        let lp = &self.lp;
        let n = lp.rows * lp.width;
        let (mut ratio, mut allowed) = (vec![f64::NAN; n], vec![f64::NAN; n]);
        let mut scan = GridScan::new(DType::F64);
        let mut buf = Vec::new();
        for r in 0..lp.rows {
            let old_row = o.row(r);
            let ranges = if valid_only {
                self.valid(r)
            } else {
                std::iter::once(0..lp.width).collect()
            };
            let base = r * lp.width;
            for v in ranges {
                let x = lp.chunk(r, v.start, v.end, &mut buf);
                for (p, &l) in v.clone().zip(x) {
                    let ol = old_row.get(p).copied().unwrap_or(f64::NAN);
                    let rt = (l - ol).exp();
                    ratio[base + p] = rt;
                    allowed[base + p] = propagate::ratio_allowed(
                        rt,
                        propagate::log_ratio_allowed(
                            self.tol_lp.allowed(l),
                            self.tol_old.allowed(ol),
                        ),
                    );
                }
                scan.feed(&ratio[base + v.start..base + v.end]);
            }
        }
        let decided = valid_only && scan.settled();
        let ratio = lp.with_data(ratio, DType::F64);
        let ratio = if decided {
            ratio.with_precision(DType::F64)
        } else {
            ratio
        };
        let allowed = ratio.with_data(allowed, DType::F64);
        (ratio, allowed, decided)
    }

    /// `−ratio·A` at valid positions and its precision when those decide it (f64 data),
    /// else None.
    fn loss_if_decided(&self, el: &Mat) -> Option<DType> {
        let mut scan = GridScan::new(DType::F64);
        for r in 0..el.rows {
            let row = el.row(r);
            for v in self.valid(r) {
                scan.feed(&row[v]);
            }
        }
        scan.settled().then_some(DType::F64)
    }
}

/// Section 4: `is_loss_debug` intermediates, the self-hosted side sliced and derived.
#[allow(clippy::too_many_arguments)]
pub fn is_loss_cell(
    policy: &TolerancePolicy,
    rank: u32,
    micro: u32,
    a_fwd: &Tensors<'_>,
    a_loss: Option<&Value>,
    b_is: &Tensors<'_>,
    b_fwd: Option<&Tensors<'_>>,
    ch: &Chain,
) -> Cell {
    const S: &str = "is_loss";
    let lp_a = a_fwd.mat("log_probs");
    let mask_a = a_fwd.mat("response_mask");
    let lp_b = b_is.mat("log_probs");
    let mask_b = b_is.mat("effective_valid");
    let na = lp_a.as_ref().map_or(0, |m| m.rows);
    let nb = lp_b.as_ref().map_or(0, |m| m.rows);
    let rows = pair_rows(a_fwd, b_fwd, na, nb);
    let ctx = PairCtx {
        policy,
        section: S,
        rows: &rows,
        mask_a: mask_a.as_deref(),
        mask_b: mask_b.as_deref(),
        cell_precision: logprob_precision(lp_a.as_deref(), lp_b.as_deref()),
    };
    let mut out = Vec::new();
    let dumped_b = |k: &str| Origin::dumped("is_loss_debug", k);
    match (&mask_a, &mask_b) {
        (Some(x), Some(y)) => out.push(ctx.exact_rows(
            "effective_valid",
            x,
            y,
            Origin::dumped("forward_data", "response_mask"),
            dumped_b("effective_valid"),
        )),
        _ => out.push(skipped(
            S,
            "effective_valid",
            "mask not dumped on both sides",
        )),
    }
    match (&lp_a, &lp_b) {
        (Some(x), Some(y)) => out.push(ctx.logprobs_memo(
            x,
            y,
            mask_b.as_ref(),
            &rows,
            Origin::dumped("forward_data", "log_probs"),
            dumped_b("log_probs"),
            &a_fwd.logprobs,
        )),
        _ => out.push(skipped(S, "log_probs", "not dumped on both sides")),
    }
    let rows_list: Vec<String> = ch
        .idx
        .iter()
        .map(|i| i.map_or("?".into(), |i| i.to_string()))
        .collect();
    let old_origin = Origin::sliced(format!(
        "old_log_probs.old_log_probs rows [{}] ({})",
        rows_list.join(", "),
        ch.how
    ));
    match (&ch.old, b_is.mat("old_log_probs")) {
        (Some(x), Some(y)) => out.push(ctx.masked(
            "old_log_probs",
            x,
            &y,
            old_origin,
            dumped_b("old_log_probs"),
            false,
            true,
        )),
        (None, _) => out.push(skipped(
            S,
            "old_log_probs",
            "self-hosted old_log_probs file missing or rows not found",
        )),
        (_, None) => out.push(skipped(S, "old_log_probs", "not dumped by weaver")),
    }
    match (&ch.adv, b_is.mat("advantages")) {
        (Some(x), Some(y)) => out.push(ctx.masked(
            "advantages",
            x,
            &y,
            Origin::derived(ch.adv_from.clone()),
            dumped_b("advantages"),
            false,
            false,
        )),
        (None, _) => out.push(skipped(
            S,
            "advantages",
            "self-hosted dumps no advantages and they could not be recomputed (no trajectory \
             rewards/group ids, or --preset none); pass --remote-api-dir to take them from \
             prepared_trajectories",
        )),
        (_, None) => out.push(skipped(S, "advantages", "not dumped by weaver")),
    }
    match (&ch.ratio, &ch.ratio_allowed, b_is.mat("prob_ratio")) {
        (Some(x), Some(e), Some(y)) => out.push(ctx.propagated(
            "prob_ratio",
            x,
            &y,
            Origin::derived("exp(forward_data.log_probs − old_log_probs)"),
            dumped_b("prob_ratio"),
            e,
        )),
        _ => out.push(skipped(S, "prob_ratio", "inputs to derive it are missing")),
    }
    let el = match (&ch.ratio, &ch.ratio_allowed, &ch.adv) {
        (Some(r), Some(e), Some(a)) => {
            let av = a.values();
            let times_adv = |r: &[f64]| r.iter().zip(av.iter()).map(|(r, a)| -r * a).collect();
            let mut el = r.with_data(times_adv(&r.values()), r.dtype);
            if let (Some(derive), Some(old)) = (&ch.partial, &ch.old) {
                // The ratio is known at valid positions only: enough for the loss's
                // precision when those are f64 data, else derive it everywhere.
                el = match derive.loss_if_decided(&el) {
                    Some(p) => el.with_precision(p),
                    None => {
                        let (full, _, _) = derive.ratio(old, false);
                        r.with_data(times_adv(&full.values()), r.dtype)
                    }
                };
            }
            let ev = e.values();
            Some((
                el,
                e.with_data(
                    ev.iter()
                        .zip(av.iter())
                        .map(|(e, a)| propagate::product_allowed(*e, *a))
                        .collect(),
                    e.dtype,
                ),
            ))
        }
        _ => None,
    };
    match (&el, b_is.mat("elementwise_loss")) {
        (Some((x, e)), Some(y)) => out.push(ctx.propagated(
            "elementwise_loss",
            x,
            &y,
            Origin::derived("−prob_ratio · advantages"),
            dumped_b("elementwise_loss"),
            e,
        )),
        _ => out.push(skipped(
            S,
            "elementwise_loss",
            "advantages needed to derive it (see advantages)",
        )),
    }
    match (a_loss.and_then(|l| l.get("loss")), b_is.value().get("loss")) {
        (Some(x), Some(y)) => out.extend(ctx.scalar_with(
            "loss",
            x,
            y,
            Origin::dumped("loss", "loss"),
            dumped_b("loss"),
            true,
            loss_propagation("loss", &StatsMemo::new(ch.stats.as_ref(), a_loss)),
        )),
        _ => out.push(skipped(S, "loss", "not dumped on both sides")),
    }
    if !rows.only_a.is_empty() || !rows.only_b.is_empty() {
        out.push(row_coverage_fail(S, &rows));
    }
    cell(Some(rank), Some(micro), Some(row_summary(&rows)), out)
}

/// The clip range of a loss file's `extra_info` (`clip_ratio`, `clip_ratio_low/high`,
/// `clip_eps`, `cliprange`), else PPO's customary 0.2 on both sides.
fn clip_range(loss: Option<&Value>) -> (f64, f64) {
    let info = loss.and_then(|l| l.get("extra_info"));
    let num = |k: &str| info.and_then(|i| i.get(k)).and_then(Value::as_f64);
    let sym = ["clip_ratio", "clip_eps", "cliprange", "clip_range"]
        .iter()
        .find_map(|k| num(k))
        .unwrap_or(0.2);
    (
        num("clip_ratio_low").unwrap_or(sym),
        num("clip_ratio_high").unwrap_or(sym),
    )
}

/// The chain aggregates the loss scalars' tolerances need, each computed once per cell
/// and loss file however many keys ask (each is a pass over every valid element).
struct StatsMemo<'a> {
    stats: Option<&'a ChainStats>,
    loss: Option<&'a Value>,
    mean_loss: OnceCell<Option<f64>>,
    mean_ratio: OnceCell<Option<f64>>,
    flips: OnceCell<(f64, f64, usize)>,
}

impl<'a> StatsMemo<'a> {
    fn new(stats: Option<&'a ChainStats>, loss: Option<&'a Value>) -> Self {
        StatsMemo {
            stats,
            loss,
            mean_loss: OnceCell::new(),
            mean_ratio: OnceCell::new(),
            flips: OnceCell::new(),
        }
    }
}

/// The propagated tolerance of a loss-file scalar that is a masked aggregate of the
/// chain's elements, with how it was obtained (None: no rule for this key).
fn loss_propagation(key: &str, memo: &StatsMemo<'_>) -> Option<(f64, String)> {
    let stats = memo.stats?;
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let n = stats.count();
    match leaf {
        "loss" | "pg_loss" => (*memo.mean_loss.get_or_init(|| stats.mean_loss_allowed()))
            .map(|e| (e, format!("= mean of |A|·r·(e^E−1) over {n} tokens"))),
        "avg_ratio" | "ratio_mean" => (*memo.mean_ratio.get_or_init(|| stats.mean_ratio_allowed()))
            .map(|e| (e, format!("= mean of r·(e^E−1) over {n} tokens"))),
        l if l.contains("clip_frac") || l.contains("clipfrac") => {
            let &(lo, hi, flips) = memo.flips.get_or_init(|| {
                let (lo, hi) = clip_range(memo.loss);
                (lo, hi, stats.flips(lo, hi))
            });
            // `clip_fraction_allowed`, from the flips already counted.
            (n > 0).then(|| {
                (
                    flips as f64 / n as f64,
                    format!("= {flips} of {n} tokens within tolerance of the clip boundary 1−{lo}/1+{hi}"),
                )
            })
        }
        _ => None,
    }
}

/// Section 3: `loss` scalars and every shared key of `metrics`.
pub fn loss_cell(
    policy: &TolerancePolicy,
    rank: u32,
    micro: u32,
    a: &Value,
    b: &Value,
    precision: Option<DType>,
    stats: Option<&ChainStats>,
) -> (Cell, Vec<String>) {
    let rows = RowMatch::by_index(0, 0);
    let ctx = PairCtx {
        policy,
        section: "loss",
        rows: &rows,
        mask_a: None,
        mask_b: None,
        cell_precision: precision,
    };
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let memo = StatsMemo::new(stats, Some(a));
    for key in ["loss", "pg_loss", "entropy_loss"] {
        match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) => out.extend(ctx.scalar_with(
                key,
                x,
                y,
                Origin::dumped("loss", key),
                Origin::dumped("loss", key),
                true,
                loss_propagation(key, &memo),
            )),
            _ => out.push(skipped("loss", key, "not dumped on both sides")),
        }
    }
    if let (Some(ma), Some(mb)) = (a.get("metrics").and_then(Value::as_dict), b.get("metrics")) {
        for (k, va) in ma {
            let Some(k) = k.as_str() else { continue };
            match mb.get(k) {
                Some(vb) => {
                    let key = format!("metrics.{k}");
                    out.extend(ctx.scalar_with(
                        &key,
                        va,
                        vb,
                        Origin::dumped("loss", &key),
                        Origin::dumped("loss", &key),
                        true,
                        loss_propagation(&key, &memo),
                    ));
                }
                None => notes.push(format!(
                    "rank {rank} micro {micro}: metrics.{k} on self-hosted only"
                )),
            }
        }
    }
    (cell(Some(rank), Some(micro), None, out), notes)
}

/// Section 6: one param or gradient tensor, flat, at its dtype's tolerance.
pub fn tensor_cell(
    policy: &TolerancePolicy,
    section: &str,
    key: &str,
    rank: u32,
    micro: Option<u32>,
    a: &Value,
    b: &Value,
) -> Cell {
    let rows = RowMatch::by_index(1, 1);
    let ctx = PairCtx {
        policy,
        section,
        rows: &rows,
        mask_a: None,
        mask_b: None,
        cell_precision: None,
    };
    let flat = |v: &Value| {
        let t = v.get(key)?.to_tensor()?;
        let data = t.to_f64_vec();
        Some(Mat::new(t.shape().to_vec(), 1, data.len(), data, t.dtype()))
    };
    let c = match (flat(a), flat(b)) {
        (Some(x), Some(y)) if x.shape == y.shape => ctx.masked(
            key,
            &x,
            &y,
            Origin::dumped(section, key),
            Origin::dumped(section, key),
            false,
            false,
        ),
        (Some(x), Some(y)) => {
            let mut c = skipped(
                section,
                key,
                format!("shape {:?} vs {:?}", x.shape, y.shape),
            );
            c.verdict = Verdict::Fail;
            c
        }
        _ => skipped(section, key, "not dumped on both sides"),
    };
    cell(Some(rank), micro, None, vec![c])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: &[&[f64]]) -> Value {
        Value::List(
            v.iter()
                .map(|r| Value::List(r.iter().map(|&x| Value::Float(x)).collect()))
                .collect(),
        )
    }

    fn dict(items: Vec<(&str, Value)>) -> Value {
        Value::Dict(
            items
                .into_iter()
                .map(|(k, v)| (Value::Str(k.into()), v))
                .collect(),
        )
    }

    fn f32r(x: f64) -> f64 {
        x as f32 as f64
    }

    fn bf16r(x: f64) -> f64 {
        half::bf16::from_f64(x).to_f64()
    }

    /// One micro of one row: self-hosted f32 log-probs, the other side's bf16-rounded.
    /// Position 0 sits at log p ≈ −20 where bf16 rounding moves log p by 0.06, so the
    /// ratio moves by 6 % — beyond any fixed bf16 rtol, within its inputs' tolerance.
    fn is_loss_case(ratio_b1: Option<f64>) -> (Cell, Chain) {
        let lp = [f32r(-20.06), f32r(-2.3)];
        let old = [f32r(-20.05), f32r(-2.31)];
        let lp_b = [bf16r(lp[0]), bf16r(lp[1])];
        let ratio_b = [
            f32r((lp_b[0] - old[0]).exp()),
            ratio_b1.unwrap_or_else(|| f32r((lp_b[1] - old[1]).exp())),
        ];
        let a_fwd = dict(vec![
            ("log_probs", rows(&[&lp])),
            ("response_mask", rows(&[&[1.0, 1.0]])),
        ]);
        let b_is = dict(vec![
            ("log_probs", rows(&[&lp_b])),
            ("old_log_probs", rows(&[&old])),
            ("effective_valid", rows(&[&[1.0, 1.0]])),
            ("prob_ratio", rows(&[&ratio_b])),
        ]);
        let inputs = BatchInputs {
            old_log_probs: Mat::of(&dict(vec![("o", rows(&[&old]))]), "o"),
            traj_index: HashMap::new(),
            advantages: None,
            advantages_from: String::new(),
            micros_per_rank: 1,
        };
        let policy = TolerancePolicy::default();
        let (a_fwd, b_is) = (Tensors::new(&a_fwd), Tensors::new(&b_is));
        let peer = ChainPeer {
            fwd: None,
            is_loss: Some(&b_is),
        };
        let ch = chain(&policy, &inputs, &a_fwd, peer, 0, 0);
        let cell = is_loss_cell(&policy, 0, 0, &a_fwd, None, &b_is, None, &ch);
        (cell, ch)
    }

    fn comparison<'a>(cell: &'a Cell, name: &str) -> &'a Comparison {
        cell.comparisons.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn ratio_tolerance_is_propagated_from_log_prob_inputs() {
        let (cell, ch) = is_loss_case(None);
        let ratio = comparison(&cell, "is_loss.prob_ratio");
        let m = ratio.metrics.as_ref().unwrap();
        let worst = m.max_abs.unwrap();
        // The bf16 noise: 6 % of the ratio, twice the old blanket "bf16 × 2" rtol (3.2e-2).
        assert_eq!(worst.loc.pos, 0);
        assert!(worst.abs_diff > 0.05 * worst.a, "{worst:?}");
        assert_eq!(ratio.verdict, Verdict::Pass, "{}", ratio.reason);
        assert_eq!(
            comparison(&cell, "is_loss.log_probs").verdict,
            Verdict::Pass
        );
        // The allowance at pos 0: r·(e^E − 1), E = bf16 tol of log p + f32 tol of old.
        let e = (1e-5 + 1.6e-2 * f32r(20.06)) + (1e-5 + 1.3e-6 * f32r(20.05));
        let r = (f32r(-20.06) - f32r(-20.05)).exp();
        let allowed = ch.ratio_allowed.as_ref().unwrap().row(0)[0];
        assert!((allowed - r * e.exp_m1()).abs() < 1e-12, "{allowed}");
        assert_eq!(ch.stats.as_ref().unwrap().count(), 2);
    }

    #[test]
    fn a_wrong_ratio_is_still_flagged_at_its_position() {
        let (cell, _) = is_loss_case(Some(0.6));
        let ratio = comparison(&cell, "is_loss.prob_ratio");
        assert_eq!(ratio.verdict, Verdict::Fail);
        let m = ratio.metrics.as_ref().unwrap();
        assert_eq!(m.beyond, 1);
        let first = m.first_beyond.unwrap();
        assert_eq!((first.loc.row, first.loc.pos, first.b), (0, 1, 0.6));
    }

    fn loss_with_clip_frac(frac: f64) -> Value {
        dict(vec![(
            "metrics",
            dict(vec![("clip_frac", Value::Float(frac))]),
        )])
    }

    #[test]
    fn clip_fraction_may_move_by_the_tokens_near_the_boundary() {
        // 4 valid tokens, one (1.19 ± 0.02) within tolerance of the 1.2 boundary.
        let e = |ratio, ratio_allowed| ChainElem {
            ratio,
            ratio_allowed,
            abs_advantage: Some(1.0),
        };
        let stats = ChainStats {
            elems: vec![e(1.19, 0.02), e(1.0, 0.02), e(0.9, 0.02), e(1.5, 0.02)],
        };
        let policy = TolerancePolicy::default();
        let verdict = |b: f64| {
            let (cell, _) = loss_cell(
                &policy,
                0,
                0,
                &loss_with_clip_frac(0.25),
                &loss_with_clip_frac(b),
                Some(DType::BF16),
                Some(&stats),
            );
            comparison(&cell, "loss.metrics.clip_frac").verdict
        };
        assert_eq!(verdict(0.5), Verdict::Pass); // one token flipped: allowed
        assert_eq!(verdict(0.75), Verdict::Fail); // two flipped: only one could
        assert_eq!(verdict(0.25), Verdict::Pass);
    }

    /// A stored (little-endian, in place) matrix of `dtype` holding `vals` rounded to it.
    fn stored(dtype: DType, rows: usize, width: usize, vals: &[f64]) -> Mat {
        let bytes: Vec<u8> = vals
            .iter()
            .flat_map(|&v| match dtype {
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                DType::I32 => (v as i32).to_le_bytes().to_vec(),
                _ => v.to_le_bytes().to_vec(),
            })
            .collect();
        let t = Tensor::from_le_bytes(dtype, vec![rows, width], bytes).unwrap();
        Mat::of(&dict(vec![("x", Value::Tensor(t))]), "x").unwrap()
    }

    /// Deterministic pseudo-random numbers in [0, 1).
    fn noise(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    /// The comparison loop as it was before chunks and runs: whole rows, one element at
    /// a time, a mask position valid when non-zero (and within the mask's width).
    fn reference(
        ctx: &PairCtx<'_>,
        a: &Mat,
        b: &Mat,
        extra: Option<&Mat>,
        tol: Tolerance,
        logprob: bool,
    ) -> String {
        let valid =
            |m: Option<&[f64]>, p: usize| m.is_none_or(|m| m.get(p).is_some_and(|&v| v != 0.0));
        let mut acc = Accumulator::new(tol, ulp_dtype(a.dtype, b.dtype), logprob);
        for &(ra, rb) in &ctx.rows.pairs {
            let ma = ctx.mask_a.map(|m| m.row(ra));
            let mb = ctx.mask_b.map(|m| m.row(rb));
            let (xa, xb) = (a.row(ra), b.row(rb));
            let ex = extra.map(|e| e.row(ra));
            for (p, (&x, &y)) in xa.iter().zip(xb.iter()).enumerate() {
                if valid(ma.as_deref(), p) && valid(mb.as_deref(), p) {
                    let e = ex.as_ref().and_then(|e| e.get(p)).copied().unwrap_or(0.0);
                    let loc = ElemLoc {
                        row: ra,
                        other_row: rb,
                        pos: p,
                    };
                    acc.push_allowing(x, y, e, loc);
                }
            }
        }
        format!("{:?}", acc.finish())
    }

    #[test]
    fn chunked_masked_comparison_equals_the_element_loop() {
        let (r, w) = (4, CHUNK + 37);
        let n = r * w;
        let base = noise(1, n);
        let a_vals: Vec<f64> = base.iter().map(|v| -8.0 * v).collect();
        // b: mostly a rounded to bf16, some equal, one NaN in a valid place and a few in
        // invalid places, one far off.
        let mut b_vals: Vec<f64> = a_vals
            .iter()
            .zip(noise(2, n))
            .map(|(&x, u)| {
                if u < 0.3 {
                    x as f32 as f64
                } else {
                    half::bf16::from_f64(x).to_f64()
                }
            })
            .collect();
        b_vals[w + 5] = f64::NAN;
        b_vals[2 * w + CHUNK + 3] = 4.0;
        b_vals[3 * w - 1] = f64::NAN;
        let a = stored(DType::F32, r, w, &a_vals);
        let b_owned = Mat::new(vec![r, w], r, w, b_vals.clone(), DType::F64);
        let b_stored = stored(DType::F32, r, w, &b_vals);
        // Masks: a prefix per row on one side; holes and a narrower width on the other.
        let lens = [w, CHUNK - 1, 17, CHUNK + 10];
        let ma_vals: Vec<f64> = (0..n)
            .map(|i| ((i % w) < lens[i / w]) as u8 as f64)
            .collect();
        let mask_a = stored(DType::I32, r, w, &ma_vals);
        let wb = w - 20;
        let mb_vals: Vec<f64> = noise(3, r * wb)
            .iter()
            .map(|&u| (u > 0.1) as u8 as f64)
            .collect();
        let mask_b = stored(DType::I32, r, wb, &mb_vals);
        let extra = Mat::new(
            vec![r - 1, w - 5],
            r - 1,
            w - 5,
            noise(4, (r - 1) * (w - 5))
                .iter()
                .map(|v| 1e-3 * v)
                .collect(),
            DType::F64,
        );
        let rows = RowMatch {
            pairs: vec![(0, 1), (1, 0), (2, 2), (3, 3), (5, 0)],
            only_a: vec![],
            only_b: vec![],
            method: crate::compare::align::MatchMethod::Index,
        };
        let policy = TolerancePolicy::default();
        for (ma, mb) in [
            (None, None),
            (Some(&mask_a), Some(&mask_b)),
            (None, Some(&mask_b)),
        ] {
            let ctx = PairCtx {
                policy: &policy,
                section: "t",
                rows: &rows,
                mask_a: ma,
                mask_b: mb,
                cell_precision: None,
            };
            for b in [&b_owned, &b_stored] {
                for logprob in [false, true] {
                    let o = || Origin::dumped("t", "x");
                    let got = ctx.masked("x", &a, b, o(), o(), false, logprob);
                    let want = reference(&ctx, &a, b, None, got.tolerance.clone(), logprob);
                    assert_eq!(format!("{:?}", got.metrics.unwrap()), want);
                }
                let o = || Origin::dumped("t", "x");
                let got = ctx.propagated("x", &a, b, o(), o(), &extra);
                let want = reference(&ctx, &a, b, Some(&extra), got.tolerance.clone(), false);
                let m = got.metrics.as_ref();
                assert_eq!(format!("{:?}", m.unwrap()), want);
                // The comparison saw something: elements, and the far-off one beyond.
                assert!(m.is_some_and(|m| m.count > 0 && m.beyond > 0));
            }
            // Masks compared exactly, a narrower side padded with zeros.
            let o = || Origin::dumped("t", "m");
            let got = ctx.exact_rows("m", &mask_a, &mask_b, o(), o());
            let mut acc = Accumulator::new(got.tolerance.clone(), None, false);
            for &(ra, rb) in &rows.pairs {
                let (xa, xb) = (mask_a.row(ra), mask_b.row(rb));
                for p in 0..xa.len().max(xb.len()) {
                    let (x, y) = (
                        xa.get(p).copied().unwrap_or(0.0),
                        xb.get(p).copied().unwrap_or(0.0),
                    );
                    acc.push(
                        x,
                        y,
                        ElemLoc {
                            row: ra,
                            other_row: rb,
                            pos: p,
                        },
                    );
                }
            }
            assert_eq!(
                format!("{:?}", got.metrics.unwrap()),
                format!("{:?}", acc.finish())
            );
        }
    }

    #[test]
    fn ranges_valid_on_both_sides_are_cut_at_chunks() {
        let r = |s: usize, e: usize| s..e;
        let mut out = Vec::new();
        intersect(&[r(0, 10), r(20, 30)], &[r(5, 25)], 100, &mut out);
        assert_eq!(out, vec![r(5, 10), r(20, 25)]);
        intersect(
            &[r(0, 3 * CHUNK)],
            &[r(1, 3 * CHUNK)],
            2 * CHUNK + 5,
            &mut out,
        );
        let cuts = [1, CHUNK + 1, 2 * CHUNK + 1, 2 * CHUNK + 5];
        assert_eq!(
            out,
            cuts.windows(2).map(|w| r(w[0], w[1])).collect::<Vec<_>>()
        );
        intersect(&[r(0, 5)], &[r(5, 9)], 100, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn stored_token_rows_hash_as_decoded_ones() {
        let ids: [[i64; 6]; 3] = [[0, 0, 5, 6, 7, 0], [0, 0, 0, 0, 0, 0], [9, 1, 2, 3, 4, 8]];
        let flat: Vec<i64> = ids.iter().flatten().copied().collect();
        let t = Tensor::from_i64(vec![3, 6], &flat).unwrap();
        let stored = token_rows(&dict(vec![("ids", Value::Tensor(t))]), "ids").unwrap();
        assert!(matches!(stored.ids, TokenIds::Stored(_)));
        let listed = dict(vec![(
            "ids",
            Value::List(
                ids.iter()
                    .map(|r| Value::List(r.iter().map(|&v| Value::Int(v)).collect()))
                    .collect(),
            ),
        )]);
        let stripped: [&[i64]; 3] = [&[5, 6, 7], &[], &[9, 1, 2, 3, 4, 8]];
        for (i, want) in stripped.iter().enumerate() {
            assert_eq!(stored.hash(i, false), Some(tokens_hash(want)));
            let head = want.split_last().map(|(_, h)| tokens_hash(h));
            assert_eq!(stored.hash(i, true), head);
        }
        // A list of ints is a tensor built in memory: the same hashes.
        let listed = token_rows(&listed, "ids").unwrap();
        assert_eq!(listed.len(), 3);
        for i in 0..3 {
            for m in [false, true] {
                assert_eq!(listed.hash(i, m), stored.hash(i, m));
            }
        }
        assert_eq!(stored.hash(3, false), None);
    }
}
