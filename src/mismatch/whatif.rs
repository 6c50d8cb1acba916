//! What each rollout correction would have done to this step: the importance weights and
//! rejection masks of verl's rollout correction (token TIS, sequence IS, IcePop, and the
//! rejection options `token_k1/k2/k3`, `seq_sum_k*`, `seq_mean_k*` ("Geo-RS" for k1),
//! `seq_max_k2/k3`), the fraction of tokens and sequences each truncates or masks, the
//! effective sample size, and the step's loss and gradient norm with respect to the
//! log-probs recomputed with the crate's loss kernels under each correction.
//!
//! Source: verl 0.9.1 (PyPI wheel), `verl/trainer/ppo/rollout_corr_helper.py`
//! (`compute_rollout_correction_weights`: `exp(clamp(Δ, ±20))` per token or of the row's
//! masked sum, truncated at the upper threshold (TIS) or zeroed outside `[lower, upper]`
//! (IcePop); `compute_rollout_rejection_mask`: `k1 = −clamp(Δ)`, `k2 = ½ clamp(Δ)²`,
//! `k3 = exp(clamp Δ) − 1 − clamp Δ`, k1 options kept inside `[log lower, log upper]`,
//! k2/k3 kept at or below `upper`; a single k1 threshold `u` means `[1/u, u]`
//! (`_parse_rollout_rs_thresholds`)); presets from
//! `verl/trainer/config/algorithm.py` (`RolloutCorrectionConfig.decoupled_*`, default
//! arguments). The weights are detached and multiply the per-token policy loss; rejection
//! multiplies the response mask the loss aggregates over.
//!
//! The loss: the preset's per-token loss `l` and its derivative come from one fused
//! kernel pass per cell ([`crate::kernels::loss::compute_with_grad`] under a plain-sum
//! aggregation); each correction's loss is then the preset's aggregation of `w·l` under
//! the corrected mask, `Σ c_t w_t l_t` with the aggregation's coefficients `c` (linear in
//! `l` for every mode), and its gradient `c_t w_t ∂l_t`. The step's loss is the mean over
//! cells; the gradient norm is that of the mean's gradient.

use candle_core::{Device, Tensor as CTensor};

use super::metrics::SAFETY_BOUND;
use crate::kernels::aggregate::AggMode;
use crate::kernels::config::{LossConfig, LossInputs};

/// Level of an importance weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    /// One weight per token.
    Token,
    /// One weight per sequence: the product of its tokens' ratios.
    Sequence,
}

/// An importance weight: truncated at `upper` (TIS), or zeroed outside `[lower, upper]`
/// (IcePop) when `lower` is set.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct IsSpec {
    /// Token or sequence.
    pub level: IsLevel,
    /// Upper threshold.
    pub upper: f64,
    /// IcePop's lower threshold.
    pub lower: Option<f64>,
}

/// A rejection statistic (verl `rollout_rs` options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RsOption {
    /// Per token `k1`.
    TokenK1,
    /// Per token `k2`.
    TokenK2,
    /// Per token `k3`.
    TokenK3,
    /// Row sum of `k1`.
    SeqSumK1,
    /// Row sum of `k2`.
    SeqSumK2,
    /// Row sum of `k3`.
    SeqSumK3,
    /// Row mean of `k1` (Geo-RS).
    SeqMeanK1,
    /// Row mean of `k2`.
    SeqMeanK2,
    /// Row mean of `k3`.
    SeqMeanK3,
    /// Row max of `k2`.
    SeqMaxK2,
    /// Row max of `k3`.
    SeqMaxK3,
}

impl RsOption {
    /// Every option with its verl spelling.
    pub const ALL: [(&'static str, RsOption); 11] = [
        ("token_k1", RsOption::TokenK1),
        ("token_k2", RsOption::TokenK2),
        ("token_k3", RsOption::TokenK3),
        ("seq_sum_k1", RsOption::SeqSumK1),
        ("seq_sum_k2", RsOption::SeqSumK2),
        ("seq_sum_k3", RsOption::SeqSumK3),
        ("seq_mean_k1", RsOption::SeqMeanK1),
        ("seq_mean_k2", RsOption::SeqMeanK2),
        ("seq_mean_k3", RsOption::SeqMeanK3),
        ("seq_max_k2", RsOption::SeqMaxK2),
        ("seq_max_k3", RsOption::SeqMaxK3),
    ];
    fn k(self) -> u8 {
        use RsOption::*;
        match self {
            TokenK1 | SeqSumK1 | SeqMeanK1 => 1,
            TokenK2 | SeqSumK2 | SeqMeanK2 | SeqMaxK2 => 2,
            _ => 3,
        }
    }
}

/// A rejection criterion: keep a token (or its whole row) when the statistic is within
/// bounds. For k1 the bounds are ratios (`lower`, `upper`), compared in log space.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RsSpec {
    /// The statistic.
    pub option: RsOption,
    /// Lower bound (k1 only).
    pub lower: Option<f64>,
    /// Upper bound.
    pub upper: f64,
}

/// A correction: an optional importance weight and any number of rejection criteria
/// (all must pass).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Correction {
    /// Name as reports print it.
    pub name: String,
    /// Importance weight.
    pub is: Option<IsSpec>,
    /// Rejection criteria.
    pub rs: Vec<RsSpec>,
}

/// verl's presets (`RolloutCorrectionConfig.decoupled_*` with their default arguments)
/// and `none`, the names `--correction` takes.
pub fn preset(name: &str) -> Option<Correction> {
    let is = |level, upper, lower| {
        Some(IsSpec {
            level,
            upper,
            lower,
        })
    };
    let rs = |option, lower, upper| RsSpec {
        option,
        lower,
        upper,
    };
    let geo = rs(RsOption::SeqMeanK1, Some(0.999), 1.001);
    let (is, rs) = match name {
        "none" => (None, vec![]),
        "token-tis" => (is(IsLevel::Token, 2.0, None), vec![]),
        "seq-is" => (is(IsLevel::Sequence, 2.0, None), vec![]),
        "token-icepop" => (is(IsLevel::Token, 5.0, Some(0.5)), vec![]),
        "seq-is-rs" => (
            is(IsLevel::Sequence, 2.0, None),
            vec![rs(RsOption::SeqSumK1, Some(0.5), 2.0)],
        ),
        "geo-rs" => (None, vec![geo]),
        "geo-rs-token-tis" => (is(IsLevel::Token, 2.0, None), vec![geo]),
        "geo-rs-seq-tis" => (is(IsLevel::Sequence, 2.0, None), vec![geo]),
        "k3-rs" => (None, vec![rs(RsOption::SeqMeanK3, None, 0.01)]),
        "k3-rs-token-tis" => (
            is(IsLevel::Token, 2.0, None),
            vec![rs(RsOption::SeqMeanK3, None, 0.01)],
        ),
        _ => return None,
    };
    Some(Correction {
        name: name.to_string(),
        is,
        rs,
    })
}

/// The presets run when none is asked for, in report order.
pub const DEFAULT_PRESETS: &[&str] = &[
    "none",
    "token-tis",
    "seq-is",
    "token-icepop",
    "seq-is-rs",
    "geo-rs",
    "geo-rs-token-tis",
    "k3-rs",
];

/// Every preset name.
pub const PRESETS: &[&str] = &[
    "none",
    "token-tis",
    "seq-is",
    "token-icepop",
    "seq-is-rs",
    "geo-rs",
    "geo-rs-token-tis",
    "geo-rs-seq-tis",
    "k3-rs",
    "k3-rs-token-tis",
];

/// Parse `--correction`: a preset name, or a spec `is=token:C`, `is=sequence:C`,
/// `is=token:LO_HI` (IcePop), `rs=OPTION:THRESHOLD` (`OPTION` a verl `rollout_rs`
/// spelling, `THRESHOLD` `U` or for k1 `LO_HI`), joined with `+`.
///
/// Errors: an unknown preset, option or a threshold that is not a positive number.
pub fn parse(spec: &str) -> Result<Correction, String> {
    if let Some(c) = preset(spec) {
        return Ok(c);
    }
    let bounds = |s: &str| -> Result<(Option<f64>, f64), String> {
        let num = |x: &str| {
            x.parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0)
                .ok_or_else(|| format!("`{x}` is not a positive number in `{spec}`"))
        };
        match s.split_once('_') {
            Some((lo, hi)) => Ok((Some(num(lo)?), num(hi)?)),
            None => Ok((None, num(s)?)),
        }
    };
    let mut c = Correction {
        name: spec.to_string(),
        is: None,
        rs: vec![],
    };
    for part in spec.split('+') {
        let (kind, rest) = part.split_once('=').ok_or_else(|| {
            format!(
                "unknown correction `{spec}` (presets: {})",
                PRESETS.join(", ")
            )
        })?;
        let (what, thr) = rest
            .split_once(':')
            .ok_or_else(|| format!("`{part}` needs a threshold after `:`"))?;
        let (lower, upper) = bounds(thr)?;
        match kind {
            "is" => {
                let level = match what {
                    "token" => IsLevel::Token,
                    "sequence" | "seq" => IsLevel::Sequence,
                    _ => return Err(format!("`{what}`: is level is token or sequence")),
                };
                c.is = Some(IsSpec {
                    level,
                    upper,
                    lower,
                });
            }
            "rs" => {
                let option = RsOption::ALL
                    .iter()
                    .find(|(n, _)| *n == what)
                    .map(|(_, o)| *o)
                    .ok_or_else(|| format!("unknown rejection option `{what}`"))?;
                let lower = match (option.k(), lower) {
                    (1, None) => Some(1.0 / upper),
                    (1, l) => l,
                    (_, Some(_)) => return Err(format!("`{what}` takes one upper bound")),
                    (_, None) => None,
                };
                c.rs.push(RsSpec {
                    option,
                    lower,
                    upper,
                });
            }
            _ => return Err(format!("unknown correction `{spec}`")),
        }
    }
    Ok(c)
}

/// One correction's effect, summed over cells.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WhatIfSums {
    /// Tokens under the original mask.
    pub tokens: f64,
    /// Tokens the rejection masked.
    pub tokens_masked: f64,
    /// Tokens whose weight was truncated (TIS, raw > upper) or zeroed (IcePop).
    pub tokens_truncated: f64,
    /// Rows.
    pub seqs: f64,
    /// Rows with a masked token.
    pub seqs_masked: f64,
    /// Rows with a truncated or zeroed weight (on any token).
    pub seqs_truncated: f64,
    /// `Σ e`, `Σ e²` of the effective weight `e = w · keep` over the original mask.
    pub s_e: f64,
    /// See [`WhatIfSums::s_e`].
    pub s_e2: f64,
    /// Sum over cells of each cell's corrected loss.
    pub loss: f64,
    /// Sum over cells of each cell's squared gradient norm.
    pub grad_sq: f64,
    /// Cells whose loss was computed.
    pub cells: f64,
}

impl WhatIfSums {
    /// Merge another cell's.
    pub fn merge(&mut self, o: &WhatIfSums) {
        self.tokens += o.tokens;
        self.tokens_masked += o.tokens_masked;
        self.tokens_truncated += o.tokens_truncated;
        self.seqs += o.seqs;
        self.seqs_masked += o.seqs_masked;
        self.seqs_truncated += o.seqs_truncated;
        self.s_e += o.s_e;
        self.s_e2 += o.s_e2;
        self.loss += o.loss;
        self.grad_sq += o.grad_sq;
        self.cells += o.cells;
    }
}

/// One correction's effect on the step, as reported.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WhatIf {
    /// The correction.
    pub correction: Correction,
    /// Fraction of tokens masked by rejection (verl `rollout_rs_masked_fraction`:
    /// `masked_mean(1 − keep, m)`, with its 1e-8).
    pub tokens_masked: f64,
    /// Fraction of tokens whose weight was truncated / zeroed (verl
    /// `rollout_is_ratio_fraction_high` for TIS, `rollout_is_oob_ratio` for IcePop).
    pub tokens_truncated: f64,
    /// Fraction of sequences with a masked token.
    pub seqs_masked: f64,
    /// Fraction of sequences with a truncated / zeroed weight.
    pub seqs_truncated: f64,
    /// verl's effective sample size `1 / masked_mean((e / mean e)²)` of the effective
    /// weights `e = w · keep` (1 = uniform weights).
    pub ess: f64,
    /// The step's loss under the correction (mean over cells), when advantages were dumped.
    pub loss: Option<f64>,
    /// The gradient norm of that loss with respect to the log-probs.
    pub grad_norm: Option<f64>,
}

impl WhatIfSums {
    /// The reported figures.
    pub fn finish(&self, correction: Correction, with_loss: bool) -> WhatIf {
        let eps = super::metrics::VERL_EPS;
        let mean_e = self.s_e / (self.tokens + eps);
        let ess = 1.0 / ((self.s_e2 / (mean_e + eps).powi(2)) / (self.tokens + eps));
        WhatIf {
            correction,
            tokens_masked: self.tokens_masked / (self.tokens + eps),
            tokens_truncated: self.tokens_truncated / (self.tokens + eps),
            seqs_masked: self.seqs_masked / self.seqs,
            seqs_truncated: self.seqs_truncated / self.seqs,
            ess,
            loss: (with_loss && self.cells > 0.0).then(|| self.loss / self.cells),
            grad_norm: (with_loss && self.cells > 0.0).then(|| self.grad_sq.sqrt() / self.cells),
        }
    }
}

/// The per-token loss and its derivative of one cell (`[rows, t]`, zero off the mask).
pub struct CellLoss {
    /// Per-token loss `l` (the preset's, before aggregation).
    pub l: Vec<f64>,
    /// `∂l_t / ∂logp_t` on masked tokens.
    pub dl: Vec<f64>,
}

/// One fused kernel pass: the preset's per-token loss and derivative of a cell (the
/// log-prob and advantage arrays are taken over by the kernel's tensors).
/// `current`: the log-probs the loss differentiates (the trainer's old ones when no
/// current pass was dumped: the first micro of an on-policy step).
pub fn cell_loss(
    current: Vec<f64>,
    old: Vec<f64>,
    adv: Vec<f64>,
    mask: &[f64],
    rows: usize,
    t: usize,
    cfg: &LossConfig,
) -> Result<CellLoss, String> {
    let dev = Device::Cpu;
    // The owned arrays become the kernel's tensors without a copy.
    let mk = |v: Vec<f64>| CTensor::from_vec(v, (rows, t), &dev).map_err(|e| e.to_string());
    let inputs = LossInputs {
        log_probs: mk(current)?,
        old_log_probs: Some(mk(old)?),
        ref_log_probs: None,
        advantages: mk(adv)?,
        mask: CTensor::from_slice(mask, (rows, t), &dev).map_err(|e| e.to_string())?,
        entropy: None,
        rollout_log_probs: None,
    };
    let mut sum_cfg = cfg.clone();
    // A plain sum: its gradient is each masked token's own derivative.
    sum_cfg.agg = AggMode::TrlDapo {
        num_items_in_batch: Some(1.0),
    };
    sum_cfg.kl = None;
    sum_cfg.entropy_coeff = 0.0;
    let (out, grad) =
        crate::kernels::loss::compute_with_grad(&inputs, &sum_cfg).map_err(|e| e.to_string())?;
    let flat = |x: &CTensor| -> Result<Vec<f64>, String> {
        x.to_dtype(candle_core::DType::F64)
            .and_then(|x| x.flatten_all())
            .and_then(|x| x.to_vec1::<f64>())
            .map_err(|e| e.to_string())
    };
    Ok(CellLoss {
        l: flat(&out.per_token_loss)?,
        dl: flat(&grad)?,
    })
}

/// Aggregation coefficient of each row's tokens under `mode` for a `[rows, t]` cell whose
/// rows hold `counts` tokens (the kernels' [`crate::kernels::aggregate::aggregate`] as a
/// weighted sum; a mode that divides by zero gives 0: an emptied cell adds nothing).
pub fn agg_coefficients(mode: AggMode, counts: &[f64], t: usize) -> Vec<f64> {
    let b = counts.len() as f64;
    let total: f64 = counts.iter().sum();
    let nonempty = counts.iter().filter(|c| **c > 0.0).count() as f64;
    let safe = |x: f64| {
        if x > 0.0 && x.is_finite() {
            1.0 / x
        } else {
            0.0
        }
    };
    counts
        .iter()
        .map(|&n| match mode {
            AggMode::TokenMean => safe(total),
            AggMode::SeqMeanTokenMean => safe(n + 1e-8) * safe(nonempty) * f64::from(n > 0.0),
            AggMode::SeqMeanTokenSum => safe(nonempty),
            AggMode::SeqMeanTokenSumNorm { horizon } => {
                safe(nonempty) * safe(horizon.unwrap_or(t as f64))
            }
            AggMode::TrlGrpo => safe(n.max(1.0)) / b,
            AggMode::TrlBnpo => safe(total.max(1.0)),
            AggMode::TrlDrGrpo {
                max_completion_length,
            } => safe(b * max_completion_length.unwrap_or(t as f64)),
            AggMode::TrlDapo { num_items_in_batch } => {
                safe(num_items_in_batch.unwrap_or(total).max(1.0))
            }
        })
        .collect()
}

/// What every correction of a cell reads, computed once per cell: the clamped token
/// weights `exp(clamp(Δ, ±20))` and, per row, the token count and the sums and maxima of
/// `Δ`, `k1`, `k2`, `k3` over the mask.
pub struct CellStats {
    /// `exp(clamp(Δ, ±20))` per token (0 off the mask).
    pub ew: Vec<f64>,
    /// Per row: tokens.
    pub n: Vec<f64>,
    /// Per row: `Σ Δ`.
    pub sum_d: Vec<f64>,
    /// Per row: `Σ k1`, `Σ k2`, `Σ k3`.
    pub sum_k: Vec<[f64; 3]>,
    /// Per row: `max k2`, `max k3` (−∞ for an empty row).
    pub max_k: Vec<[f64; 2]>,
}

/// `k1`, `k2`, `k3` of a clamped log-ratio `dc` with `ew = exp(dc)`.
#[inline]
fn ks(dc: f64, ew: f64) -> [f64; 3] {
    [-dc, 0.5 * dc * dc, ew - 1.0 - dc]
}

impl CellStats {
    /// The statistics of a `[rows, t]` cell (`d`: Δ, `mask`: the scored mask).
    pub fn new(d: &[f64], mask: &[f64], rows: usize, t: usize) -> Self {
        let mut st = CellStats {
            ew: vec![0.0; rows * t],
            n: vec![0.0; rows],
            sum_d: vec![0.0; rows],
            sum_k: vec![[0.0; 3]; rows],
            max_k: vec![[f64::NEG_INFINITY; 2]; rows],
        };
        for r in 0..rows {
            for c in 0..t {
                let i = r * t + c;
                if mask[i] == 0.0 {
                    continue;
                }
                let dc = d[i].clamp(-SAFETY_BOUND, SAFETY_BOUND);
                let ew = dc.exp();
                st.ew[i] = ew;
                let k = ks(dc, ew);
                st.n[r] += 1.0;
                st.sum_d[r] += d[i];
                for (acc, kj) in st.sum_k[r].iter_mut().zip(k) {
                    *acc += kj;
                }
                st.max_k[r][0] = st.max_k[r][0].max(k[1]);
                st.max_k[r][1] = st.max_k[r][1].max(k[2]);
            }
        }
        st
    }
}

/// Whether statistic `s` of option `spec` passes.
#[inline]
fn inside(spec: &RsSpec, s: f64) -> bool {
    if spec.option.k() == 1 {
        let lo = spec.lower.unwrap_or(1.0 / spec.upper).ln();
        s >= lo && s <= spec.upper.ln()
    } else {
        s <= spec.upper
    }
}

/// Whether row `r` passes every sequence-level criterion of `corr`.
fn row_keep(corr: &Correction, st: &CellStats, r: usize) -> bool {
    use RsOption::*;
    corr.rs.iter().all(|spec| {
        let k = spec.option.k() as usize - 1;
        let stat = match spec.option {
            TokenK1 | TokenK2 | TokenK3 => return true,
            SeqSumK1 | SeqSumK2 | SeqSumK3 => st.sum_k[r][k],
            SeqMeanK1 | SeqMeanK2 | SeqMeanK3 => {
                st.sum_k[r][k] / (st.n[r] + super::metrics::VERL_EPS)
            }
            _ => {
                let m = st.max_k[r][k - 1];
                if m == f64::NEG_INFINITY {
                    0.0
                } else {
                    m
                }
            }
        };
        inside(spec, stat)
    })
}

/// One correction applied to one cell: its sums ([`apply_all`] of that one).
pub fn apply(
    corr: &Correction,
    d: &[f64],
    mask: &[f64],
    st: &CellStats,
    rows: usize,
    t: usize,
    loss: Option<(&CellLoss, AggMode)>,
) -> WhatIfSums {
    apply_all(std::slice::from_ref(corr), d, mask, st, rows, t, loss)
        .pop()
        .unwrap_or_default()
}

/// A correction's state along one cell: its token criteria, the current row's verdicts
/// and, per row, the kept tokens' count and sums of `w·l` and `(w·∂l)²` (the
/// aggregation's coefficient is per row, applied once the kept counts are known).
struct Along<'c> {
    corr: &'c Correction,
    token_rs: Vec<&'c RsSpec>,
    row_ok: bool,
    seq_w: Option<f64>,
    any_masked: bool,
    any_trunc: bool,
    counts: Vec<f64>,
    row_wl: Vec<f64>,
    row_g2: Vec<f64>,
    out: WhatIfSums,
}

/// Every correction applied to one cell in **one pass** over its tokens (each token's
/// Δ, weight and loss read once for all corrections): their sums, in order. `d`:
/// `Δ = L − R` `[rows, t]`; `mask`: the scored mask; `st`: the cell's [`CellStats`];
/// `loss`: the cell's per-token loss, when advantages were dumped. Each correction's sums
/// accumulate in token order, as one pass per correction would.
pub fn apply_all(
    corrs: &[Correction],
    d: &[f64],
    mask: &[f64],
    st: &CellStats,
    rows: usize,
    t: usize,
    loss: Option<(&CellLoss, AggMode)>,
) -> Vec<WhatIfSums> {
    use RsOption::*;
    let mut al: Vec<Along<'_>> = corrs
        .iter()
        .map(|corr| Along {
            corr,
            token_rs: corr
                .rs
                .iter()
                .filter(|s| matches!(s.option, TokenK1 | TokenK2 | TokenK3))
                .collect(),
            row_ok: true,
            seq_w: None,
            any_masked: false,
            any_trunc: false,
            counts: vec![0.0; rows],
            row_wl: vec![0.0; rows],
            row_g2: vec![0.0; rows],
            out: WhatIfSums::default(),
        })
        .collect();
    let any_token_rs = al.iter().any(|a| !a.token_rs.is_empty());
    for r in 0..rows {
        for a in al.iter_mut() {
            a.row_ok = row_keep(a.corr, st, r);
            a.seq_w = a
                .corr
                .is
                .filter(|s| s.level == IsLevel::Sequence)
                .map(|_| st.sum_d[r].clamp(-SAFETY_BOUND, SAFETY_BOUND).exp());
            (a.any_masked, a.any_trunc) = (false, false);
        }
        for c in 0..t {
            let i = r * t + c;
            if mask[i] == 0.0 {
                continue;
            }
            let ew = st.ew[i];
            let kk = if any_token_rs {
                ks(d[i].clamp(-SAFETY_BOUND, SAFETY_BOUND), ew)
            } else {
                [0.0; 3]
            };
            let ld = loss.map(|(cl, _)| (cl.l[i], cl.dl[i]));
            for a in al.iter_mut() {
                a.out.tokens += 1.0;
                let mut k = a.row_ok;
                if k && !a.token_rs.is_empty() {
                    k = a
                        .token_rs
                        .iter()
                        .all(|spec| inside(spec, kk[spec.option.k() as usize - 1]));
                }
                let (w, truncated) = match a.corr.is {
                    None => (1.0, false),
                    Some(spec) => {
                        let raw = a.seq_w.unwrap_or(ew);
                        match spec.lower {
                            None => (raw.min(spec.upper), raw > spec.upper),
                            Some(lo) => {
                                let ok = raw >= lo && raw <= spec.upper;
                                (if ok { raw } else { 0.0 }, !ok)
                            }
                        }
                    }
                };
                a.out.tokens_masked += f64::from(!k);
                a.out.tokens_truncated += f64::from(truncated);
                a.any_masked |= !k;
                a.any_trunc |= truncated;
                if k {
                    a.out.s_e += w;
                    a.out.s_e2 += w * w;
                    a.counts[r] += 1.0;
                    if let Some((l, dl)) = ld {
                        a.row_wl[r] += w * l;
                        let g = w * dl;
                        a.row_g2[r] += g * g;
                    }
                }
            }
        }
        for a in al.iter_mut() {
            a.out.seqs += 1.0;
            a.out.seqs_masked += f64::from(a.any_masked);
            a.out.seqs_truncated += f64::from(a.any_trunc);
        }
    }
    al.into_iter()
        .map(|mut a| {
            if let Some((_, mode)) = loss {
                let coef = agg_coefficients(mode, &a.counts, t);
                for ((c, wl), g2) in coef.iter().zip(&a.row_wl).zip(&a.row_g2) {
                    a.out.loss += c * wl;
                    a.out.grad_sq += c * c * g2;
                }
                a.out.cells = 1.0;
            }
            a.out
        })
        .collect()
}
