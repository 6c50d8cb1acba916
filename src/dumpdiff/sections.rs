//! The comparison sections: each turns the values read for one rank × micro cell (or the
//! whole batch) into typed [`Comparison`]s. Reference side = self-hosted ("a"), other = "b".

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;

use crate::compare::align::{match_rows, strip_pad, RowMatch};
use crate::compare::metrics::{effective_dtype, Accumulator, ElemLoc};
use crate::compare::propagate::{self, ChainElem, ChainStats};
use crate::compare::tolerance::{coarser, Tolerance, TolerancePolicy, Verdict};
use crate::dumpdiff::report::{Cell, Comparison, Origin, RowSummary};
use crate::dumpdiff::Progress;
use crate::error::Result;
use crate::frames::tokens_hash;
use crate::readers::layout::{DumpTree, Kind};
use crate::readers::read_any;
use crate::tensor::DType;
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
        }
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

/// A tensor as rows × width of f64 (1-d → one row, 0-d → 1 × 1), with its declared dtype.
/// Build one with [`Mat::new`]: the precision of its values is computed once, on first use.
#[derive(Debug, Clone)]
pub struct Mat {
    /// Original shape.
    pub shape: Vec<usize>,
    /// Number of rows.
    pub rows: usize,
    /// Elements per row.
    pub width: usize,
    /// Row-major values.
    pub data: Vec<f64>,
    /// Declared dtype (f64/i64 for `.jsonl` lists).
    pub dtype: DType,
    /// [`Mat::precision`], once computed (`data` and `dtype` never change after `new`).
    precision: OnceLock<DType>,
}

impl Mat {
    /// A matrix of `rows × width` row-major values (`shape` is the original tensor's).
    pub fn new(shape: Vec<usize>, rows: usize, width: usize, data: Vec<f64>, dtype: DType) -> Mat {
        Mat {
            shape,
            rows,
            width,
            data,
            dtype,
            precision: OnceLock::new(),
        }
    }

    /// A matrix of this one's layout holding `data` of `dtype`.
    pub fn with_data(&self, data: Vec<f64>, dtype: DType) -> Mat {
        Mat::new(self.shape.clone(), self.rows, self.width, data, dtype)
    }

    /// The tensor under `key` of a dict, as a matrix (None when absent or above 2-d).
    pub fn of(v: &Value, key: &str) -> Option<Mat> {
        let t = v.get(key)?.to_tensor()?;
        let shape = t.shape().to_vec();
        let (rows, width) = match shape.as_slice() {
            [] => (1, 1),
            [n] => (1, *n),
            [r, w] => (*r, *w),
            _ => return None,
        };
        Some(Mat::new(shape, rows, width, t.to_f64_vec(), t.dtype()))
    }

    /// Row `i` (empty when out of range).
    pub fn row(&self, i: usize) -> &[f64] {
        if i >= self.rows {
            return &[];
        }
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// The precision of the values (see [`effective_dtype`]), computed once.
    pub fn precision(&self) -> DType {
        *self
            .precision
            .get_or_init(|| effective_dtype(self.dtype, &self.data))
    }
}

/// One parsed file of a cell with its tensors decoded on first use, each once: a cell's
/// comparisons and its derived chain share the decoded matrices. Lives inside one cell's
/// task (not `Send`).
pub struct Tensors<'v> {
    value: &'v Value,
    mats: RefCell<HashMap<&'static str, Option<Rc<Mat>>>>,
    tokens: OnceCell<Option<Rc<Vec<Vec<i64>>>>>,
}

impl<'v> Tensors<'v> {
    /// Wrap a parsed file; nothing is decoded yet.
    pub fn new(value: &'v Value) -> Self {
        Tensors {
            value,
            mats: RefCell::new(HashMap::new()),
            tokens: OnceCell::new(),
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
    pub fn input_ids(&self) -> Option<Rc<Vec<Vec<i64>>>> {
        self.tokens
            .get_or_init(|| token_rows(self.value, "input_ids").map(Rc::new))
            .clone()
    }
}

/// The token rows of `key` (e.g. `input_ids`) with padding (0) stripped.
pub fn token_rows(v: &Value, key: &str) -> Option<Vec<Vec<i64>>> {
    let t = v.get(key)?.to_tensor()?;
    if t.ndim() != 2 {
        return None;
    }
    let w = t.shape()[1];
    let all = t.to_i64_vec();
    Some(
        all.chunks(w.max(1))
            .map(|r| strip_pad(r, 0).to_vec())
            .collect(),
    )
}

/// Pair rows of two per-micro dicts by their `input_ids` (by index when either lacks them).
pub fn pair_rows(a: Option<&[Vec<i64>]>, b: Option<&[Vec<i64>]>, na: usize, nb: usize) -> RowMatch {
    match (a, b) {
        (Some(a), Some(b)) => {
            let ar: Vec<&[i64]> = a.iter().map(Vec::as_slice).collect();
            let br: Vec<&[i64]> = b.iter().map(Vec::as_slice).collect();
            match_rows(&ar, &br)
        }
        _ => RowMatch::by_index(na, nb),
    }
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

/// Whether position `p` of `row` is valid: the mask is non-zero there (a position past
/// the mask's width is not), or, with no mask, `p` lies within the data's `width`.
#[inline]
fn valid_at(mask: Option<&[f64]>, width: usize, p: usize) -> bool {
    match mask {
        Some(m) => m.get(p).is_some_and(|&v| v != 0.0),
        None => p < width,
    }
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
        let mut acc = Accumulator::new(tol.clone(), ulp_dtype(a.dtype, b.dtype), logprob);
        for &(ra, rb) in &self.rows.pairs {
            let ma = self.mask_a.map(|m| m.row(ra));
            let mb = self.mask_b.map(|m| m.row(rb));
            let (xa, xb) = (a.row(ra), b.row(rb));
            let ex = extra.map(|e| e.row(ra));
            // Positions valid on both sides (the same walk as `split_positions(..).both`),
            // without a mask vector per row.
            for (p, (&x, &y)) in xa.iter().zip(xb).enumerate() {
                if valid_at(ma, a.width, p) && valid_at(mb, b.width, p) {
                    let e = ex.and_then(|e| e.get(p)).copied().unwrap_or(0.0);
                    acc.push_allowing(
                        x,
                        y,
                        e,
                        ElemLoc {
                            row: ra,
                            other_row: rb,
                            pos: p,
                        },
                    );
                }
            }
        }
        finish(name, acc, tol, precision, a, b, origin_a, origin_b)
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
        for &(ra, rb) in &self.rows.pairs {
            let (xa, xb) = (a.row(ra), b.row(rb));
            for p in 0..xa.len().max(xb.len()) {
                let x = xa.get(p).copied().unwrap_or(0.0);
                let y = xb.get(p).copied().unwrap_or(0.0);
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
                tol.source = format!("{} + {e:e} {how}", tol.source);
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
    let metrics = acc.finish();
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
    let (ta, tb) = (a.input_ids(), b.input_ids());
    let rows = pair_rows(
        ta.as_deref().map(Vec::as_slice),
        tb.as_deref().map(Vec::as_slice),
        na,
        nb,
    );
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
    for (key, logprob) in [("log_probs", true), ("entropy", false)] {
        match (a.mat(key), b.mat(key)) {
            (Some(x), Some(y)) => out.push(ctx.masked(
                key,
                &x,
                &y,
                Origin::dumped("forward_data", key),
                Origin::dumped("forward_data", key),
                false,
                logprob,
            )),
            _ => out.push(skipped("forward_data", key, "not dumped on both sides")),
        }
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
            let idx: Vec<Option<usize>> = tok
                .iter()
                .map(|t| inputs.traj_index.get(&tokens_hash(t)).copied())
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
            data.extend_from_slice(r);
        }
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
    let mut ratio = Vec::with_capacity(lp.data.len());
    let mut allowed = Vec::with_capacity(lp.data.len());
    for r in 0..lp.rows {
        let (x, old_row) = (lp.row(r), o.row(r));
        for (p, &l) in x.iter().enumerate() {
            let ol = old_row.get(p).copied().unwrap_or(f64::NAN);
            let rt = (l - ol).exp();
            ratio.push(rt);
            allowed.push(propagate::ratio_allowed(
                rt,
                propagate::log_ratio_allowed(tol_lp.allowed(l), tol_old.allowed(ol)),
            ));
        }
    }
    let ratio = lp.with_data(ratio, DType::F64);
    let ratio_allowed = ratio.with_data(allowed, DType::F64);
    // |A| per row: the remote-api advantages, else the other side's (paired by content).
    let abs_adv: Vec<Option<f64>> = match &adv {
        Some(a) => (0..na).map(|r| a.row(r).first().map(|v| v.abs())).collect(),
        None => {
            let b_adv = peer.is_loss.and_then(|v| v.mat("advantages"));
            let nb = b_adv.as_ref().map_or(0, |m| m.rows);
            let (ta, tb) = (a_fwd.input_ids(), peer.fwd.and_then(Tensors::input_ids));
            let rows = pair_rows(
                ta.as_deref().map(Vec::as_slice),
                tb.as_deref().map(Vec::as_slice),
                na,
                nb,
            );
            let mut out = vec![None; na];
            if let Some(b) = &b_adv {
                for &(ra, rb) in &rows.pairs {
                    out[ra] = Some(b.row(rb).iter().fold(0.0f64, |m, v| m.max(v.abs())));
                }
            }
            out
        }
    };
    let mut elems = Vec::new();
    for (r, &abs_advantage) in abs_adv.iter().enumerate() {
        let m = mask_a.as_deref().map(|m| m.row(r));
        for p in (0..m.map_or(lp.width, <[f64]>::len)).filter(|&p| valid_at(m, lp.width, p)) {
            if let (Some(&rt), Some(&al)) = (ratio.row(r).get(p), ratio_allowed.row(r).get(p)) {
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
    let (ta, tb) = (a_fwd.input_ids(), b_fwd.and_then(Tensors::input_ids));
    let rows = pair_rows(
        ta.as_deref().map(Vec::as_slice),
        tb.as_deref().map(Vec::as_slice),
        na,
        nb,
    );
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
        (Some(x), Some(y)) => out.push(ctx.masked(
            "log_probs",
            x,
            y,
            Origin::dumped("forward_data", "log_probs"),
            dumped_b("log_probs"),
            false,
            true,
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
        (Some(r), Some(e), Some(a)) => Some((
            r.with_data(
                r.data.iter().zip(&a.data).map(|(r, a)| -r * a).collect(),
                r.dtype,
            ),
            e.with_data(
                e.data
                    .iter()
                    .zip(&a.data)
                    .map(|(e, a)| propagate::product_allowed(*e, *a))
                    .collect(),
                e.dtype,
            ),
        )),
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
            loss_propagation("loss", ch.stats.as_ref(), a_loss),
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

/// The propagated tolerance of a loss-file scalar that is a masked aggregate of the
/// chain's elements, with how it was obtained (None: no rule for this key).
fn loss_propagation(
    key: &str,
    stats: Option<&ChainStats>,
    loss: Option<&Value>,
) -> Option<(f64, String)> {
    let stats = stats?;
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let n = stats.count();
    match leaf {
        "loss" | "pg_loss" => stats
            .mean_loss_allowed()
            .map(|e| (e, format!("= mean of |A|·r·(e^E−1) over {n} tokens"))),
        "avg_ratio" | "ratio_mean" => stats
            .mean_ratio_allowed()
            .map(|e| (e, format!("= mean of r·(e^E−1) over {n} tokens"))),
        l if l.contains("clip_frac") || l.contains("clipfrac") => {
            let (lo, hi) = clip_range(loss);
            let flips = stats.flips(lo, hi);
            stats.clip_fraction_allowed(lo, hi).map(|e| {
                (
                    e,
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
    for key in ["loss", "pg_loss", "entropy_loss"] {
        match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) => out.extend(ctx.scalar_with(
                key,
                x,
                y,
                Origin::dumped("loss", key),
                Origin::dumped("loss", key),
                true,
                loss_propagation(key, stats, Some(a)),
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
                        loss_propagation(&key, stats, Some(a)),
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
}
