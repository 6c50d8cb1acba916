//! One rank/micro of a dump tree, read once ([`gather_weaver`], [`gather_self_hosted`])
//! and judged under a loss configuration ([`judge`]): the recomputed loss and its terms
//! against what was dumped, each with a tolerance that carries the rounding of the
//! dumped inputs ([`super::terms`]), and a diagnosis naming the term that differs.

use std::path::{Path, PathBuf};

use super::self_hosted::SelfHostedStep;
use super::terms::{f32_compute, first_diff, masked_sum, reduce, stored_rounding, weights};
use super::{
    candle_of, kerr, required, Divergence, Layout, ScalarCheck, Status, Tolerance, Verdict,
};
use crate::conventions::rounding::LAMBDA;
use crate::error::{Error, Position, Result};
use crate::formats::read_any;
use crate::kernels::aggregate::AggMode;
use crate::kernels::loss::{compute, LossConfig, LossInputs, LossOutput};
use crate::kernels::{to_f64, to_f64_vec};
use crate::model::step::{LogProbSource, LossRecord};
use crate::producers::layout::{DumpTree, Kind};
use crate::producers::nexrl_self_hosted as keys;
use crate::producers::weaver;
use crate::tensor::DType;
use crate::value::Value;

/// The aggregated KL term: top-level in the `loss/` file, or in its `metrics`.
const KL_LOSS: &str = "kl_loss";

/// The conventions a cell's `loss/` file states (absent: `None`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stated {
    /// `extra_info.entropy_coeff`.
    pub entropy_coeff: Option<f64>,
    /// `extra_info.kl_coef` (or `kl_loss_coef`).
    pub kl_coef: Option<f64>,
    /// `extra_info.loss_agg_mode`.
    pub agg: Option<String>,
    /// `extra_info.kl_loss_type` (verl names: `kl`, `mse`, `low_var_kl`).
    pub kl_type: Option<String>,
    /// `extra_info.loss_scale_factor` (the horizon of `seq-mean-token-sum-norm`).
    pub scale: Option<f64>,
}

/// One rank/micro's inputs and dumped values.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The file holding the dumped loss (`is_loss_debug/` for weaver, `loss/` for
    /// self-hosted).
    pub file: PathBuf,
    /// Layout.
    pub layout: Layout,
    /// Step, rank, micro.
    pub step: i64,
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// Inputs of the recompute (f64).
    pub inputs: LossInputs,
    /// Stored dtype of the entropy (its rounding bounds the entropy term).
    pub entropy_dtype: Option<DType>,
    /// Stored dtype of the log-probs: a ratio and loss computed from finer values than
    /// were dumped (bf16/f16 dumps of an f32 computation) are recomputed only to within
    /// that rounding ([`crate::judge::terms::logprob_rounding`]).
    pub logprob_dtype: Option<DType>,
    /// The dumped loss of `file`.
    pub dumped_loss: f64,
    /// The `loss/` file's record, when there is one.
    pub record: Option<LossRecord>,
    /// The dumped aggregated KL term.
    pub kl_loss: Option<f64>,
    /// What the `loss/` file states about the composition.
    pub stated: Stated,
    /// Weaver's dumped `prob_ratio` and `elementwise_loss` (f64, `[B, T]`).
    pub ratio: Option<Vec<f64>>,
    /// See `ratio`.
    pub per_token: Option<Vec<f64>>,
    /// Notes from reading (rows matched to several trajectories, ...).
    pub notes: Vec<String>,
    /// Self-hosted: the trajectory of each row and whether the trainer held advantages
    /// in f32, so that the advantages of another epsilon can be put in without reading
    /// the cell again (`infer::inputs_with_advantages`); weaver: `None`.
    pub advantage_rows: Option<(Vec<usize>, bool)>,
}

impl Cell {
    /// `(rows, columns)` of the cell's matrices.
    pub fn dims(&self) -> (usize, usize) {
        match self.inputs.mask.dims() {
            [b, t] => (*b, *t),
            [b] => (*b, 1),
            _ => (0, 0),
        }
    }
}

fn stated_of(echo: &keys::LossEcho, rec: &LossRecord) -> Stated {
    Stated {
        entropy_coeff: rec.coefficients.get(keys::ENTROPY_COEFF).copied(),
        kl_coef: keys::kl_coef(&rec.coefficients),
        agg: echo.agg.clone(),
        kl_type: echo.kl_type.clone(),
        scale: echo.scale,
    }
}

/// The `loss/` file of a cell read as a record, its stated conventions and its KL term
/// (the top-level `kl_loss`, else the metric of that name).
pub(super) fn loss_file(
    path: &Path,
    record: impl Fn(&Path, &Value) -> Result<LossRecord>,
) -> Result<(LossRecord, Stated, Option<f64>)> {
    let v = read_any(path)?;
    let rec = record(path, &v)?;
    let echo = keys::loss_echo(&v);
    let stated = stated_of(&echo, &rec);
    let kl = echo.kl_loss.or_else(|| rec.metrics.get(KL_LOSS).copied());
    Ok((rec, stated, kl))
}

/// Read one weaver rank/micro: `is_loss_debug/` (log_probs, old_log_probs, advantages,
/// effective_valid, the intermediates, `ref_log_probs` when dumped), the entropy of
/// `forward_data/`, and the `loss/` file when present.
///
/// Errors: the is_loss_debug file absent, unreadable, or lacking an input.
pub fn gather_weaver(tree: &DumpTree, step: i64, rank: u32, micro: u32) -> Result<Cell> {
    let file = tree
        .get(Kind::IsLossDebug, step, Some(rank), Some(micro))
        .ok_or_else(|| {
            Error::input(
                &tree.root,
                format!("no is_loss_debug file for step {step} rank {rank} micro {micro}"),
            )
        })?;
    let path = file.path.as_path();
    let v = read_any(path)?;
    let tb = weaver::is_loss_debug(path, &v)?;
    let mask = required(tb.loss_mask.as_ref(), path, weaver::EFFECTIVE_VALID)?;
    let reference = tb
        .log_probs(LogProbSource::Reference)
        .map(candle_of)
        .transpose()?;
    let (entropy, entropy_dtype) = weaver_entropy(tree, step, rank, micro, mask.dims())?;
    let inputs = LossInputs {
        log_probs: required(
            tb.log_probs(LogProbSource::Current),
            path,
            weaver::LOG_PROBS,
        )?,
        old_log_probs: Some(required(
            tb.log_probs(LogProbSource::Old),
            path,
            weaver::OLD_LOG_PROBS,
        )?),
        ref_log_probs: reference,
        advantages: required(tb.advantages.as_ref(), path, weaver::ADVANTAGES)?,
        mask,
        entropy,
        rollout_log_probs: tb
            .log_probs(LogProbSource::Rollout)
            .map(candle_of)
            .transpose()?,
    };
    let vec_of = |t: Option<&crate::model::step::TokenTensor>| -> Result<Option<Vec<f64>>> {
        match t {
            Some(t) => Ok(Some(to_f64_vec(&candle_of(t)?).map_err(|e| kerr(path, e))?)),
            None => Ok(None),
        }
    };
    let (record, stated, kl_loss) = match tree.get(Kind::Loss, step, Some(rank), Some(micro)) {
        Some(lf) => {
            let (r, s, k) = loss_file(&lf.path, weaver::loss_record)?;
            (Some(r), s, k)
        }
        None => (None, Stated::default(), None),
    };
    Ok(Cell {
        file: file.path.clone(),
        layout: Layout::Weaver,
        step,
        rank,
        micro,
        logprob_dtype: tb
            .log_probs(LogProbSource::Current)
            .map(|t| t.tensor.dtype()),
        inputs,
        entropy_dtype,
        dumped_loss: weaver::is_loss_debug_loss(path, &v)?,
        record,
        kl_loss,
        stated,
        ratio: vec_of(tb.ratio.as_ref())?,
        per_token: vec_of(tb.per_token_loss.as_ref())?,
        notes: Vec::new(),
        advantage_rows: None,
    })
}

/// The per-token entropy of weaver's `forward_data/` file and its stored dtype, when it
/// has `shape` (weaver's `is_loss_debug/` holds none); `None` when absent or shaped
/// otherwise.
fn weaver_entropy(
    tree: &DumpTree,
    step: i64,
    rank: u32,
    micro: u32,
    shape: &[usize],
) -> Result<(Option<candle_core::Tensor>, Option<DType>)> {
    let Some(f) = tree.get(Kind::ForwardData, step, Some(rank), Some(micro)) else {
        return Ok((None, None));
    };
    let fb = weaver::forward_data(&f.path, &read_any(&f.path)?)?;
    let Some(e) = &fb.entropy else {
        return Ok((None, None));
    };
    let t = candle_of(e)?;
    Ok(if t.dims() == shape {
        (Some(t), e.dtype)
    } else {
        (None, None)
    })
}

/// Read one self-hosted rank/micro: its forward_data inputs matched to the step's
/// trajectories (`batch`) and its `loss/` file.
///
/// Errors: no loss file (nothing dumped to check); see
/// [`SelfHostedStep::micro_inputs`].
pub fn gather_self_hosted(
    tree: &DumpTree,
    batch: &SelfHostedStep,
    step: i64,
    rank: u32,
    micro: u32,
) -> Result<Cell> {
    let lf = tree
        .get(Kind::Loss, step, Some(rank), Some(micro))
        .ok_or_else(|| {
            Error::input(
                &tree.root,
                format!("no loss file for step {step} rank {rank} micro {micro} (nothing dumped to check)"),
            )
        })?;
    let mi = batch.micro_inputs(tree, step, rank, micro)?;
    let (rec, stated, kl_loss) = loss_file(&lf.path, keys::loss_record)?;
    let dumped_loss = rec.loss.ok_or_else(|| {
        Error::format(
            &lf.path,
            Position::Key(keys::LOSS.into()),
            "missing or not a number",
        )
    })?;
    Ok(Cell {
        file: lf.path.clone(),
        layout: Layout::SelfHosted,
        step,
        rank,
        micro,
        inputs: mi.inputs,
        entropy_dtype: mi.entropy_dtype,
        logprob_dtype: mi.logprob_dtype,
        dumped_loss,
        record: Some(rec),
        kl_loss,
        stated,
        ratio: None,
        per_token: None,
        notes: mi.notes,
        advantage_rows: Some((mi.trajectory_rows, mi.f32_trainer)),
    })
}

/// How uncertain the coefficients a cell is judged with are (standard errors of an
/// inferred value; 0 when read from the dump or given).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Uncertainty {
    /// Standard error of `entropy_coeff`.
    pub entropy_coeff: f64,
    /// Standard error of `kl_coef`.
    pub kl_coef: f64,
}

/// The recomputed terms of a cell and the tolerance each inherits.
struct Terms {
    loss: f64,
    pg: f64,
    entropy: Option<f64>,
    kl: Option<f64>,
    /// Extra allowed difference of each (rounding of stored inputs, f32 arithmetic of
    /// the producer, coefficient uncertainty).
    loss_extra: f64,
    pg_extra: f64,
    entropy_extra: f64,
    kl_extra: f64,
}

/// The verl modes an aggregation may be confused with, for the diagnosis.
const VERL_MODES: [AggMode; 3] = [
    AggMode::TokenMean,
    AggMode::SeqMeanTokenSum,
    AggMode::SeqMeanTokenMean,
];

fn mode_name(m: AggMode) -> String {
    m.name()
}

/// Recompute `cell` under `cfg` and compare with what it dumped: weaver's intermediates
/// (`prob_ratio`, `elementwise_loss`), the loss, and every scalar of the `loss/` file,
/// then name the term that differs.
///
/// Tolerances: `tol` (`atol + rtol·max(|a|,|b|)`) plus, per reduction `Σ wᵢxᵢ` (weights of
/// the aggregation mode, [`super::terms::weights`]): the rounding of the stored entropy
/// ([`super::terms::stored_rounding`]: a bf16 entropy dumped after the loss was computed
/// from f32 values), the producer's f32 arithmetic ([`super::terms::f32_compute`]), and
/// for the loss `|c|·(term's bound) + λ·σ_c·|term|` for each coefficient `c` of standard
/// error `σ_c` (inferred coefficients).
///
/// Errors: the kernels refuse the inputs (shapes; file named).
pub fn judge(cell: &Cell, cfg: &LossConfig, tol: &Tolerance, unc: Uncertainty) -> Result<Verdict> {
    let path = cell.file.as_path();
    // a KL term without reference log-probs in this cell: the dumped kl_loss stands in
    // for it (named in a note), when there is one
    let mut local;
    let mut kl_from_dump = None;
    let cfg = match (&cfg.kl, &cell.inputs.ref_log_probs, cell.kl_loss) {
        (Some(k), None, Some(d)) => {
            kl_from_dump = Some(k.coef * d);
            local = cfg.clone();
            local.kl = None;
            &local
        }
        _ => cfg,
    };
    let out = compute(&cell.inputs, cfg).map_err(|e| kerr(path, e))?;
    let (_, t) = cell.dims();
    let m = to_f64_vec(&cell.inputs.mask).map_err(|e| kerr(path, e))?;
    let mut terms = recomputed_terms(cell, cfg, &out, &m, unc)?;
    if let Some(k) = kl_from_dump {
        terms.loss += k;
        terms.loss_extra += 4.0 * 2f64.powi(-24) * k.abs();
    }
    let lp = to_f64_vec(&cell.inputs.log_probs).map_err(|e| kerr(path, e))?;
    let old = match &cell.inputs.old_log_probs {
        Some(o) => to_f64_vec(o).map_err(|e| kerr(path, e))?,
        None => vec![0.0; lp.len()],
    };
    let slack = crate::judge::terms::logprob_slack(&lp, &old, cell.logprob_dtype);
    let slack = match cfg.ratio_level {
        crate::kernels::loss::RatioLevel::Token => slack,
        _ => crate::judge::terms::sequence_slack(&slack, &m, t),
    };
    let mut first_divergence = None;
    if let Some(d) = &cell.ratio {
        let ours = to_f64_vec(&out.ratio).map_err(|e| kerr(path, e))?;
        first_divergence = first_diff(weaver::PROB_RATIO, d, &ours, &m, t, tol, &slack);
    }
    if first_divergence.is_none() {
        if let Some(d) = &cell.per_token {
            let ours = to_f64_vec(&out.per_token_loss).map_err(|e| kerr(path, e))?;
            first_divergence = first_diff(weaver::ELEMENTWISE_LOSS, d, &ours, &m, t, tol, &slack);
        }
    }
    let tokens = m.iter().filter(|x| **x != 0.0).count();
    let checks = match &cell.record {
        Some(rec) => loss_file_checks(rec, cell.kl_loss, &out, &terms, cfg, tokens, tol),
        None => Vec::new(),
    };
    // numbers alike at the dumped precision are never called different
    let loss_ok = tol.allows_with(cell.dumped_loss, terms.loss, terms.loss_extra)
        || crate::fmt::alike(cell.dumped_loss, terms.loss);
    let ok = loss_ok && first_divergence.is_none() && checks.iter().all(|c| c.ok);
    let mut notes = cell.notes.clone();
    if kl_from_dump.is_some() {
        notes.push(
            "no ref_log_probs in this cell: its dumped kl_loss stands in for the KL term".into(),
        );
    }
    let mut differs = Vec::new();
    if !ok {
        diagnose(cell, cfg, &out, &m, &terms, &checks, &first_divergence, tol)
            .into_iter()
            .for_each(|(term, note)| {
                if !differs.contains(&term) {
                    differs.push(term);
                }
                notes.extend(note);
            });
    }
    if let Some(c) = cell.stated.entropy_coeff {
        if c != cfg.entropy_coeff {
            notes.push(format!(
                "{} says entropy_coeff {c} but the check used {} (--entropy-coeff)",
                path.display(),
                cfg.entropy_coeff
            ));
        }
    }
    Ok(Verdict {
        file: cell.file.clone(),
        layout: cell.layout,
        step: cell.step,
        rank: cell.rank,
        micro: cell.micro,
        status: if ok {
            Status::Consistent
        } else {
            Status::Inconsistent
        },
        dumped_loss: cell.dumped_loss,
        recomputed_loss: terms.loss,
        first_divergence,
        checks,
        tokens,
        notes,
        differs,
        loss_ok,
        own_sum: false,
        own_shift: false,
    })
}

fn recomputed_terms(
    cell: &Cell,
    cfg: &LossConfig,
    out: &LossOutput,
    m: &[f64],
    unc: Uncertainty,
) -> Result<Terms> {
    let path = cell.file.as_path();
    let f = |x: &candle_core::Tensor| to_f64(x).map_err(|e| kerr(path, e));
    let (b, t) = cell.dims();
    let w = weights(m, b, t, cfg.agg);
    // the entropy's weights are the pg term's when both use one mode (the usual case)
    let we = if cfg.entropy_agg == cfg.agg {
        std::borrow::Cow::Borrowed(&w)
    } else {
        std::borrow::Cow::Owned(weights(m, b, t, cfg.entropy_agg))
    };
    let elem = to_f64_vec(&out.per_token_loss).map_err(|e| kerr(path, e))?;
    let lp = to_f64_vec(&cell.inputs.log_probs).map_err(|e| kerr(path, e))?;
    let old = match &cell.inputs.old_log_probs {
        Some(o) => to_f64_vec(o).map_err(|e| kerr(path, e))?,
        None => vec![0.0; lp.len()],
    };
    let pg_extra = f32_compute(&elem, &w, 4.0)
        + crate::judge::terms::logprob_rounding(&elem, &lp, &old, &w, cell.logprob_dtype);
    let (entropy, entropy_extra) = match (&out.entropy_loss, &cell.inputs.entropy) {
        (Some(el), Some(e)) => {
            let ev = to_f64_vec(e).map_err(|e| kerr(path, e))?;
            let extra = stored_rounding(&ev, &we, cell.entropy_dtype) + f32_compute(&ev, &we, 1.0);
            (Some(f(el)?), extra)
        }
        _ => (None, 0.0),
    };
    let (kl, kl_extra) = match (&out.kl_loss, &cfg.kl, &cell.inputs.ref_log_probs) {
        (Some(k), Some(term), Some(r)) => {
            let km = crate::kernels::kl::kl(&cell.inputs.log_probs, r, term.estimator)
                .map_err(|e| kerr(path, e))?;
            let kv = to_f64_vec(&km).map_err(|e| kerr(path, e))?;
            (Some(f(k)?), f32_compute(&kv, &w, 4.0))
        }
        _ => (None, 0.0),
    };
    let kc = cfg.kl.as_ref().map_or(0.0, |k| k.coef);
    let ec = if entropy.is_some() {
        cfg.entropy_coeff
    } else {
        0.0
    };
    let loss = f(&out.loss)?;
    // a scaled total (verl's loss_scale_factor) carries its terms' rounding scaled
    let scale = cfg.loss_scale.factor(b).unwrap_or(1.0).abs();
    let loss_extra = scale
        * (pg_extra
            + ec.abs() * entropy_extra
            + LAMBDA * unc.entropy_coeff * entropy.unwrap_or(0.0).abs()
            + kc.abs() * kl_extra
            + LAMBDA * unc.kl_coef * kl.unwrap_or(0.0).abs())
        + 4.0 * 2f64.powi(-24) * loss.abs();
    Ok(Terms {
        loss,
        pg: f(&out.pg_loss)?,
        entropy,
        kl,
        loss_extra,
        pg_extra,
        entropy_extra,
        kl_extra,
    })
}

/// Every scalar a `loss/` record holds (`loss`, `pg_loss`, `entropy_loss`, `kl_loss`,
/// `metrics.{pg_loss, approx_kl, avg_ratio, clip_frac, entropy, num_tokens}`) against the
/// recomputation; keys absent from the file (or not recomputable) are skipped.
/// `num_tokens` must match exactly; `metrics.entropy` is the entropy term under the
/// entropy aggregation (the token mean under `token-mean`).
fn loss_file_checks(
    rec: &LossRecord,
    kl_loss: Option<f64>,
    out: &LossOutput,
    terms: &Terms,
    cfg: &LossConfig,
    tokens: usize,
    tol: &Tolerance,
) -> Vec<ScalarCheck> {
    let m = &out.metrics;
    let metric = |k: &str| rec.metrics.get(k).copied();
    let entropy_metric = if cfg.entropy_agg == AggMode::TokenMean {
        m.entropy
    } else {
        terms.entropy
    };
    let wanted: [(String, Option<f64>, Option<f64>, f64); 10] = [
        (
            keys::LOSS.into(),
            Some(terms.loss),
            rec.loss,
            terms.loss_extra,
        ),
        (
            keys::PG_LOSS.into(),
            Some(terms.pg),
            rec.pg_loss,
            terms.pg_extra,
        ),
        (
            keys::ENTROPY_LOSS.into(),
            terms.entropy,
            rec.entropy_loss,
            terms.entropy_extra,
        ),
        (KL_LOSS.into(), terms.kl, kl_loss, terms.kl_extra),
        (
            format!("{}.pg_loss", keys::METRICS),
            Some(terms.pg),
            metric("pg_loss"),
            terms.pg_extra,
        ),
        (
            format!("{}.approx_kl", keys::METRICS),
            Some(m.approx_kl),
            metric("approx_kl"),
            0.0,
        ),
        (
            format!("{}.avg_ratio", keys::METRICS),
            Some(m.avg_ratio),
            metric("avg_ratio"),
            0.0,
        ),
        (
            format!("{}.clip_frac", keys::METRICS),
            Some(m.clip_frac),
            metric("clip_frac"),
            0.0,
        ),
        (
            format!("{}.entropy", keys::METRICS),
            entropy_metric,
            metric("entropy"),
            terms.entropy_extra,
        ),
        (
            format!("{}.num_tokens", keys::METRICS),
            Some(tokens as f64),
            metric("num_tokens"),
            0.0,
        ),
    ];
    let mut checks = Vec::new();
    for (name, ours, dumped, extra) in wanted {
        let (Some(ours), Some(dumped)) = (ours, dumped) else {
            continue;
        };
        let ok = if name.ends_with(".num_tokens") {
            dumped == ours
        } else {
            tol.allows_with(dumped, ours, extra) || crate::fmt::alike(dumped, ours)
        };
        checks.push(ScalarCheck {
            name,
            dumped,
            recomputed: ours,
            ok,
        });
    }
    checks
}

/// Why a cell is inconsistent: `(term, note)` pairs, the term one of `ratio`, `pg`,
/// `aggregation`, `entropy`, `kl`, `mask`, `composition`, `loss`.
#[allow(clippy::too_many_arguments)]
fn diagnose(
    cell: &Cell,
    cfg: &LossConfig,
    out: &LossOutput,
    m: &[f64],
    terms: &Terms,
    checks: &[ScalarCheck],
    div: &Option<Divergence>,
    tol: &Tolerance,
) -> Vec<(String, Option<String>)> {
    let mut found = Vec::new();
    if let Some(d) = div {
        let term = if d.name == weaver::PROB_RATIO {
            "ratio"
        } else {
            "pg"
        };
        found.push((term.to_string(), None));
    }
    let bad = |name: &str| checks.iter().find(|c| c.name == name && !c.ok);
    if let Some(c) = bad(&format!("{}.num_tokens", keys::METRICS)) {
        found.push((
            "mask".into(),
            Some(format!(
                "mask: the dumped num_tokens {} ≠ {} valid positions of the mask",
                c.dumped, c.recomputed
            )),
        ));
    }
    let (b, t) = cell.dims();
    let elem = to_f64_vec(&out.per_token_loss).unwrap_or_default();
    let mode = mode_name(cfg.agg);
    // what the dumped pg term is, when not the recomputed one
    // the stored log-probs' rounding moves each reduction of the per-token loss too
    let lp = to_f64_vec(&cell.inputs.log_probs).unwrap_or_default();
    let old = match &cell.inputs.old_log_probs {
        Some(o) => to_f64_vec(o).unwrap_or_default(),
        None => vec![0.0; lp.len()],
    };
    let open = |w: &[f64]| {
        f32_compute(&elem, w, 4.0)
            + crate::judge::terms::logprob_rounding(&elem, &lp, &old, w, cell.logprob_dtype)
    };
    let explain_pg = |dumped: f64, what: &str| -> (String, String) {
        let sum = masked_sum(&elem, m);
        let n = m.iter().filter(|x| **x != 0.0).count();
        if cfg.agg == AggMode::TokenMean && tol.allows(cell.dumped_loss, terms.loss * n as f64) {
            return (
                "aggregation".into(),
                format!("the dumped loss equals the recomputed token-mean × {n} valid tokens: a sum, not a mean"),
            );
        }
        if tol.allows_with(dumped, sum, open(m)) {
            return (
                "aggregation".into(),
                format!(
                    "aggregation: the dumped {what} is the sum of the elementwise loss over {} valid tokens, not its {mode}: a sum, not a mean",
                    m.iter().filter(|x| **x != 0.0).count()
                ),
            );
        }
        for other in VERL_MODES.iter().filter(|o| **o != cfg.agg) {
            let w = weights(m, b, t, *other);
            if tol.allows_with(dumped, reduce(&elem, &w), open(&w)) {
                return (
                    "aggregation".into(),
                    format!(
                        "aggregation: the dumped {what} is the {} of the elementwise loss, the check used {mode}",
                        mode_name(*other)
                    ),
                );
            }
        }
        let (d, r) = crate::fmt::pair(dumped, terms.pg);
        (
            "pg".into(),
            format!("pg term: dumped {what} {d} ≠ recomputed {r}"),
        )
    };
    let pg_bad = bad(keys::PG_LOSS).or_else(|| bad(&format!("{}.pg_loss", keys::METRICS)));
    if let (Some(c), None) = (pg_bad, div) {
        let (term, note) = explain_pg(c.dumped, "pg_loss");
        found.push((term, Some(note)));
    }
    // the dumped entropy term under another verl mode: the aggregation differs
    let entropy_other = |dumped: f64| -> Option<AggMode> {
        let x = to_f64_vec(cell.inputs.entropy.as_ref()?).ok()?;
        VERL_MODES
            .iter()
            .filter(|o| **o != cfg.entropy_agg)
            .find(|o| {
                let w = weights(m, b, t, **o);
                let extra = stored_rounding(&x, &w, cell.entropy_dtype) + f32_compute(&x, &w, 1.0);
                tol.allows_with(dumped, reduce(&x, &w), extra)
            })
            .copied()
    };
    if let Some(c) = bad(keys::ENTROPY_LOSS) {
        let (d, r) = crate::fmt::pair(c.dumped, c.recomputed);
        if let Some(o) = entropy_other(c.dumped) {
            found.push((
                "aggregation".into(),
                Some(format!(
                    "aggregation: the dumped entropy_loss {d} is the {} of the entropy, the check used {} ({r})",
                    mode_name(o),
                    mode_name(cfg.entropy_agg)
                )),
            ));
        } else {
            found.push((
            "entropy".into(),
            Some(format!(
                "entropy term: dumped entropy_loss {d} ≠ recomputed {r} ({} of the entropy, ±{:.1e} for its stored rounding)",
                mode_name(cfg.entropy_agg),
                terms.entropy_extra
            )),
        ));
        }
    }
    if let Some(c) = bad(KL_LOSS) {
        let (d, r) = crate::fmt::pair(c.dumped, c.recomputed);
        let est = cfg
            .kl
            .as_ref()
            .map(|k| format!("{:?}", k.estimator))
            .unwrap_or_default();
        found.push((
            "kl".into(),
            Some(format!(
                "KL term: dumped kl_loss {d} ≠ recomputed {r} ({est}, {mode})"
            )),
        ));
    }
    let loss_bad = !tol.allows_with(cell.dumped_loss, terms.loss, terms.loss_extra)
        || bad(keys::LOSS).is_some();
    if loss_bad && found.is_empty() {
        match &cell.record {
            Some(rec) => {
                // every dumped term matches: the composition of the loss differs
                let ec = cfg.entropy_coeff;
                let kc = cfg.kl.as_ref().map_or(0.0, |k| k.coef);
                let pg = rec.pg_loss.unwrap_or(terms.pg);
                let ent = rec.entropy_loss.or(terms.entropy).unwrap_or(0.0);
                let kl = cell.kl_loss.or(terms.kl).unwrap_or(0.0);
                let lhs = cell.dumped_loss - pg;
                let rhs = -ec * ent + kc * kl;
                let (a, b2) = crate::fmt::pair(lhs, rhs);
                let mut note = format!(
                    "composition: loss − pg_loss = {a} but −entropy_coeff·entropy_loss + kl_coef·kl_loss = {b2} (entropy_coeff {}, kl_coef {})",
                    crate::fmt::num(ec),
                    crate::fmt::num(kc)
                );
                if ent != 0.0 {
                    let implied = -(lhs - kc * kl) / ent;
                    note.push_str(&format!(
                        "; this cell implies entropy_coeff {}",
                        crate::fmt::num(implied)
                    ));
                }
                found.push(("composition".into(), Some(note)));
            }
            None => {
                // weaver without a loss/ file: only the total is dumped; is its pg term
                // aggregated otherwise?
                let rest = terms.loss - terms.pg;
                let (term, note) = explain_pg(cell.dumped_loss - rest, "loss's pg term");
                let term = if term == "pg" {
                    "loss".to_string()
                } else {
                    term
                };
                let note = if term == "loss" {
                    let (d, r) = crate::fmt::pair(cell.dumped_loss, terms.loss);
                    format!(
                        "the dumped loss {d} ≠ recomputed {r} and no loss/ file holds its terms"
                    )
                } else {
                    note
                };
                found.push((term, Some(note)));
            }
        }
    }
    found
}
