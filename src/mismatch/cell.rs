//! One rank × micro cell of a [`StepDump`](crate::model::step::StepDump) decoded into the
//! flat `[rows, T]` f64 arrays the mismatch scan reads: the two log-prob roles compared,
//! the current policy's log-probs (for the what-if loss), the mask, token ids and
//! advantages. What cannot be paired (a row one role lacks, a column past the shorter
//! role) is counted here, never dropped silently.

use crate::model::step::{Cell, LogProbSource, RowMeta, TokenPositions, TokenTensor};

/// Which mask a cell's tokens were selected with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskSource {
    /// `response_mask`.
    Response,
    /// `loss_mask` (weaver's `effective_valid`).
    Loss,
    /// The last `T` columns of `attention_mask`.
    Attention,
    /// No mask dumped: every column of every row counted.
    None,
}

/// A cell decoded for the scan. Arrays are row-major `[rows, t]`.
#[derive(Debug, Clone)]
pub struct CellData {
    /// Data-parallel rank.
    pub rank: usize,
    /// Micro-batch index, `None` for a whole-batch cell.
    pub micro: Option<usize>,
    /// Rows paired (both roles hold them).
    pub rows: usize,
    /// Columns paired.
    pub t: usize,
    /// Log-probs of the reference side of the pair (`a`, the engine by default).
    pub a: Vec<f64>,
    /// Log-probs of the compared side (`b`, the trainer's old policy by default).
    pub b: Vec<f64>,
    /// The current policy's log-probs, when dumped (the what-if loss's `log_probs`).
    pub current: Option<Vec<f64>>,
    /// 1 on tokens compared, 0 elsewhere.
    pub mask: Vec<f64>,
    /// Which mask that is.
    pub mask_source: MaskSource,
    /// Token id of each column, when dumped.
    pub ids: Option<Vec<i64>>,
    /// Per-token advantages, when dumped (a per-row advantage broadcast over the row).
    pub advantages: Option<Vec<f64>>,
    /// Response position of column 0 of each row (non-zero for whole-sequence layouts,
    /// where the response starts after the prompt).
    pub first_col: Vec<usize>,
    /// Per-row records, one per paired row (default where not dumped).
    pub meta: Vec<RowMeta>,
    /// Each row's index in its cell when rows were selected (two trees paired by
    /// content: the paired rows of side A's cell); `None`: row `r` is row `r`.
    pub row_index: Option<Vec<usize>>,
    /// Rows one role holds and the other does not.
    pub unmatched_rows: usize,
    /// Masked tokens past the shorter role's columns (not compared).
    pub unmatched_tokens: usize,
}

/// `[rows, cols]` of a 2-d tensor (a 1-d tensor is one row).
fn dims(t: &TokenTensor) -> (usize, usize) {
    match t.tensor.shape() {
        [r, c] => (*r, *c),
        [c] => (1, *c),
        _ => (0, 0),
    }
}

/// The `[rows, t]` window (top-left) of a `[r, c]` row-major array, or of its last `t`
/// columns when `tail`.
fn window<T: Copy>(v: Vec<T>, c: usize, rows: usize, t: usize, tail: bool) -> Vec<T> {
    if c == t && v.len() == rows * t {
        return v;
    }
    let start = if tail { c - t } else { 0 };
    let mut out = Vec::with_capacity(rows * t);
    for r in 0..rows {
        out.extend_from_slice(&v[r * c + start..r * c + start + t]);
    }
    out
}

/// A per-token tensor as `[rows, t]` f64, when it has at least that many rows and columns
/// (`tail`: its last `t` columns).
fn f64_window(x: &TokenTensor, rows: usize, t: usize, tail: bool) -> Option<Vec<f64>> {
    let (r, c) = dims(x);
    (r >= rows && c >= t).then(|| window(x.tensor.to_f64_vec(), c, rows, t, tail))
}

/// A per-token tensor as `[rows, t]` i64 ([`f64_window`]).
fn i64_window(x: &TokenTensor, rows: usize, t: usize, tail: bool) -> Option<Vec<i64>> {
    let (r, c) = dims(x);
    (r >= rows && c >= t).then(|| window(x.tensor.to_i64_vec(), c, rows, t, tail))
}

/// Decode `cell` for the pair `(a, b)`. `None` when the cell lacks one of the roles (the
/// caller has checked the step holds both; a cell without them is reported there).
pub fn decode(cell: &Cell, a: LogProbSource, b: LogProbSource) -> Option<CellData> {
    let batch = &cell.batch;
    let (ta, tb) = (batch.log_probs(a)?, batch.log_probs(b)?);
    let ((ra, ca), (rb, cb)) = (dims(ta), dims(tb));
    let (rows, t) = (ra.min(rb), ca.min(cb));
    let (va, vb) = (ta.tensor.to_f64_vec(), tb.tensor.to_f64_vec());
    let seq = batch.positions == TokenPositions::Sequence;

    let (mask, mask_source) = if let Some(m) = batch
        .response_mask
        .as_ref()
        .and_then(|m| f64_window(m, rows, t, false))
    {
        (m, MaskSource::Response)
    } else if let Some(m) = batch
        .loss_mask
        .as_ref()
        .and_then(|m| f64_window(m, rows, t, false))
    {
        (m, MaskSource::Loss)
    } else if let Some(m) = batch
        .attention_mask
        .as_ref()
        .and_then(|m| f64_window(m, rows, t, !seq))
    {
        (m, MaskSource::Attention)
    } else {
        (vec![1.0; rows * t], MaskSource::None)
    };
    let mask: Vec<f64> = mask
        .into_iter()
        .map(|m| if m != 0.0 && !m.is_nan() { 1.0 } else { 0.0 })
        .collect();

    // Masked tokens one role has and the other lacks (never compared, counted).
    let mut unmatched_tokens = 0usize;
    let c = ca.max(cb);
    if c > t {
        let full = batch
            .response_mask
            .as_ref()
            .or(batch.loss_mask.as_ref())
            .filter(|m| dims(m).0 >= rows && dims(m).1 >= c)
            .map(|m| (m.tensor.to_f64_vec(), dims(m).1));
        for r in 0..rows {
            for col in t..c {
                let on = match &full {
                    Some((m, mc)) => m[r * mc + col] != 0.0,
                    None => true,
                };
                unmatched_tokens += usize::from(on);
            }
        }
    }
    let unmatched_rows = ra.max(rb) - rows;

    let ids = if let Some(x) = batch.response_ids.as_ref().filter(|_| !seq) {
        i64_window(x, rows, t, false)
    } else {
        batch
            .input_ids
            .as_ref()
            .and_then(|x| i64_window(x, rows, t, !seq))
    };
    let current = if a != LogProbSource::Current && b != LogProbSource::Current {
        batch
            .log_probs(LogProbSource::Current)
            .and_then(|x| f64_window(x, rows, t, false))
    } else {
        None
    };
    let advantages = batch
        .advantages
        .as_ref()
        .and_then(|x| match x.tensor.shape() {
            [r, c] if *r >= rows && *c >= t => f64_window(x, rows, t, false),
            [r, 1] | [r] if *r >= rows => {
                let v = x.tensor.to_f64_vec();
                Some((0..rows * t).map(|i| v[i / t]).collect())
            }
            _ => None,
        });
    let advantages = advantages.or_else(|| {
        let per_row: Option<Vec<f64>> = (batch.rows.len() >= rows)
            .then(|| batch.rows[..rows].iter().map(|m| m.advantage).collect())
            .flatten();
        per_row.map(|v| (0..rows * t).map(|i| v[i / t]).collect())
    });

    let first_col = (0..rows)
        .map(|r| {
            if seq {
                (0..t).find(|&c| mask[r * t + c] != 0.0).unwrap_or(0)
            } else {
                0
            }
        })
        .collect();
    let meta = (0..rows)
        .map(|r| batch.rows.get(r).cloned().unwrap_or_default())
        .collect();
    Some(CellData {
        rank: cell.rank,
        micro: cell.micro,
        rows,
        t,
        a: window(va, ca, rows, t, false),
        b: window(vb, cb, rows, t, false),
        current,
        mask,
        mask_source,
        ids,
        advantages,
        first_col,
        meta,
        row_index: None,
        unmatched_rows,
        unmatched_tokens,
    })
}
