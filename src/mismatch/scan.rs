//! The one pass over a cell: every scored token feeds the producer metrics' sums, the
//! attribution's parts, the Δ histogram and (on request) the per-token table; each row
//! closes into a sequence record; then the what-if corrections run over the cell's Δ.

use super::attribution::{Acc, Gathered, SeqRecord, TokenAccs, TopK};
use super::cell::{CellData, MaskSource};
use super::metrics::{RowSums, Sums};
use super::whatif::{self, Correction, WhatIfSums};
use crate::kernels::config::LossConfig;

/// Bins of the Δ histogram: `log10 |Δ|` from [`HIST_LO`] to [`HIST_HI`] in steps of
/// [`HIST_STEP`], for each sign, plus exact zeros.
pub const HIST_LO: f64 = -8.0;
/// See [`HIST_LO`].
pub const HIST_HI: f64 = 2.0;
/// See [`HIST_LO`].
pub const HIST_STEP: f64 = 0.25;

/// Number of magnitude bins per sign.
pub fn hist_bins() -> usize {
    ((HIST_HI - HIST_LO) / HIST_STEP).round() as usize
}

/// The Δ histogram: counts by sign and magnitude bin (the first bin takes everything
/// below [`HIST_LO`], the last everything above [`HIST_HI`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Histogram {
    /// Lower `log10 |Δ|` edge of each bin.
    pub log10_edges: Vec<f64>,
    /// Tokens with `Δ < 0` (the trainer less confident than the engine), by bin.
    pub negative: Vec<u64>,
    /// Tokens with `Δ > 0`, by bin.
    pub positive: Vec<u64>,
    /// Tokens with `Δ = 0` exactly.
    pub zero: u64,
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        let n = hist_bins();
        Histogram {
            log10_edges: (0..n).map(|i| HIST_LO + i as f64 * HIST_STEP).collect(),
            negative: vec![0; n],
            positive: vec![0; n],
            zero: 0,
        }
    }
    #[inline]
    fn push(&mut self, d: f64) {
        if d == 0.0 {
            self.zero += 1;
            return;
        }
        let n = self.positive.len();
        let i = ((d.abs().log10() - HIST_LO) / HIST_STEP).floor();
        let i = if i < 0.0 { 0 } else { (i as usize).min(n - 1) };
        if d > 0.0 {
            self.positive[i] += 1;
        } else {
            self.negative[i] += 1;
        }
    }
    /// Merge another.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.negative.iter_mut().zip(&o.negative) {
            *a += b;
        }
        for (a, b) in self.positive.iter_mut().zip(&o.positive) {
            *a += b;
        }
        self.zero += o.zero;
    }
}

/// The per-token table (`--export-frames`), column-wise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenTable {
    /// Rank.
    pub rank: Vec<u32>,
    /// Micro (-1: whole batch).
    pub micro: Vec<i32>,
    /// Row within the cell.
    pub row: Vec<u32>,
    /// Response position.
    pub position: Vec<u32>,
    /// Token id, when dumped.
    pub token_id: Vec<Option<i64>>,
    /// Engine-side (`a`) log-prob.
    pub logp_a: Vec<f64>,
    /// Trainer-side (`b`) log-prob.
    pub logp_b: Vec<f64>,
}

impl TokenTable {
    /// Append another.
    pub fn extend(&mut self, o: TokenTable) {
        self.rank.extend(o.rank);
        self.micro.extend(o.micro);
        self.row.extend(o.row);
        self.position.extend(o.position);
        self.token_id.extend(o.token_id);
        self.logp_a.extend(o.logp_a);
        self.logp_b.extend(o.logp_b);
    }
}

/// What the scan of one cell gives.
#[derive(Debug, Clone)]
pub struct CellOut {
    /// `(rank, micro)`.
    pub key: (usize, Option<usize>),
    /// Metric sums.
    pub sums: Sums,
    /// Attribution parts.
    pub gathered: Gathered,
    /// One per correction, in order.
    pub whatif: Vec<WhatIfSums>,
    /// Δ histogram.
    pub hist: Histogram,
    /// Per-token table, when asked for.
    pub tokens: Option<TokenTable>,
    /// Rows only one role holds.
    pub unmatched_rows: usize,
    /// Masked tokens past the shorter role.
    pub unmatched_tokens: usize,
    /// The mask used.
    pub mask_source: MaskSource,
    /// Token ids were dumped.
    pub has_ids: bool,
    /// The what-if loss could be computed (advantages dumped).
    pub has_loss: bool,
    /// Why the what-if loss could not be computed, when it could not.
    pub loss_note: Option<String>,
}

/// What the scan needs besides the cell.
pub struct ScanParams<'a> {
    /// Position bucket width.
    pub width: usize,
    /// Number of top `|Δ|` values to keep.
    pub top_k: usize,
    /// Corrections.
    pub corrections: &'a [Correction],
    /// The loss preset for the what-if loss.
    pub loss: Option<&'a LossConfig>,
    /// Keep the per-token table.
    pub keep_tokens: bool,
    /// Bits of the smallest `|Δ|` that can still enter the top 1 % (raised as cells are
    /// merged; values below it are not kept).
    pub floor: &'a std::sync::atomic::AtomicU64,
}

/// Scan one decoded cell.
pub fn scan_cell(cd: CellData, p: &ScanParams) -> CellOut {
    let (rows, t) = (cd.rows, cd.t);
    let mut sums = Sums::default();
    let mut g = Gathered::default();
    let mut hist = Histogram::new();
    let mut cell_acc = Acc::default();
    let mut tokens = TokenAccs::for_tokens(rows * t);
    let floor = f64::from_bits(p.floor.load(std::sync::atomic::Ordering::Relaxed));
    let mut abs_vals: Vec<f64> = Vec::new();
    let mut d = vec![0.0; rows * t];
    let mut scored = vec![0.0; rows * t];
    let mut table = p.keep_tokens.then(TokenTable::default);
    let micro_i = cd.micro.map(|m| m as i32).unwrap_or(-1);
    for r in 0..rows {
        let row_at = cd.row_index.as_ref().map_or(r, |v| v[r]);
        let mut rs = RowSums::default();
        let mut seq = Acc::default();
        let mut max_at = None;
        for c in 0..t {
            let i = r * t + c;
            if cd.mask[i] == 0.0 {
                continue;
            }
            let (ra, lb) = (cd.a[i], cd.b[i]);
            if !ra.is_finite() || !lb.is_finite() {
                sums.unscored += 1;
                continue;
            }
            scored[i] = 1.0;
            let di = lb - ra;
            d[i] = di;
            sums.push(&mut rs, ra, lb);
            let pos = c.saturating_sub(cd.first_col[r]);
            let bucket = pos / p.width;
            if g.buckets.len() <= bucket {
                g.buckets.resize(bucket + 1, Acc::default());
            }
            g.buckets[bucket].push(di);
            if let Some(ids) = &cd.ids {
                tokens.push(ids[i], di);
            }
            cell_acc.push(di);
            if di.abs() > seq.max_abs || max_at.is_none() {
                max_at = Some(pos);
            }
            seq.push(di);
            if di.abs() >= floor {
                abs_vals.push(di.abs());
            }
            hist.push(di);
            if let Some(tb) = table.as_mut() {
                tb.rank.push(cd.rank as u32);
                tb.micro.push(micro_i);
                tb.row.push(row_at as u32);
                tb.position.push(pos as u32);
                tb.token_id.push(cd.ids.as_ref().map(|ids| ids[i]));
                tb.logp_a.push(ra);
                tb.logp_b.push(lb);
            }
        }
        sums.end_row(&rs);
        let meta = &cd.meta[r];
        g.seqs.push(SeqRecord {
            rank: cd.rank,
            micro: cd.micro,
            row: row_at,
            tokens: seq.count,
            reward: meta.reward,
            group: meta.group.clone(),
            sample: meta.sample.clone(),
            sum_abs: seq.sum_abs,
            mean_abs: if seq.count > 0 {
                seq.sum_abs / seq.count as f64
            } else {
                0.0
            },
            sum_delta: seq.sum_delta,
            max_abs: seq.max_abs,
            max_at,
        });
    }
    g.cells.push(((cd.rank, cd.micro), cell_acc));
    g.tokens = tokens;
    g.top = TopK::new(p.top_k);
    g.top.extend(&abs_vals);
    drop(abs_vals);

    // What-if: one fused kernel pass for the per-token loss, then each correction.
    let mut loss_note = None;
    let cell_loss = match (p.loss, &cd.advantages) {
        (Some(cfg), Some(adv)) if !p.corrections.is_empty() => {
            let cur = cd.current.as_ref().unwrap_or(&cd.b);
            let z = |v: &[f64]| -> Vec<f64> {
                v.iter()
                    .zip(&scored)
                    .map(|(x, m)| if *m != 0.0 { *x } else { 0.0 })
                    .collect()
            };
            match whatif::cell_loss(z(cur), z(&cd.b), z(adv), &scored, rows, t, cfg) {
                Ok(l) => Some((l, cfg.agg)),
                Err(e) => {
                    loss_note = Some(format!("loss kernel: {e}"));
                    None
                }
            }
        }
        (Some(_), None) => {
            loss_note = Some("no advantages dumped: the what-if loss needs them".into());
            None
        }
        _ => None,
    };
    let stats = (!p.corrections.is_empty()).then(|| whatif::CellStats::new(&d, &scored, rows, t));
    let loss = cell_loss.as_ref().map(|(l, m)| (l, *m));
    let whatif = match &stats {
        Some(st) => whatif::apply_all(p.corrections, &d, &scored, st, rows, t, loss),
        None => vec![],
    };
    CellOut {
        key: (cd.rank, cd.micro),
        sums,
        gathered: g,
        whatif,
        hist,
        tokens: table,
        unmatched_rows: cd.unmatched_rows,
        unmatched_tokens: cd.unmatched_tokens,
        mask_source: cd.mask_source,
        has_ids: cd.ids.is_some(),
        has_loss: cell_loss.is_some(),
        loss_note,
    }
}
