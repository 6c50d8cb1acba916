//! losscheck on another stack's step (issue 29): verl, slime / Miles and NeMo-RL dump the
//! loss *inputs* of a step (log-probs, advantages, masks) but no loss. Where no loss is
//! dumped this says so plainly, and recomputes the loss the stack would have computed
//! under its documented defaults, so that it can be compared with the stack's logged
//! metric (`--logs steps.jsonl`). Where a loss is dumped (a cell's [`LossRecord`]) the
//! recomputed value is compared with it.
//!
//! The defaults, read from each stack's own code:
//! - **verl 0.9.1** (PyPI wheel): `verl/workers/utils/losses.py` `ppo_loss` (l.87–119)
//!   calls `compute_policy_loss_vanilla` (`verl/trainer/ppo/core_algos.py` l.1286–1376:
//!   clip 0.2/0.2, dual clip `clip_ratio_c` 3, log-ratio clamped to ±20) with the batch's
//!   `rollout_is_weights` when present (multiplied into the per-token loss), aggregated by
//!   `agg_loss` `token-mean` over the batch's tokens; `entropy_coeff: 0`, `use_kl_loss:
//!   false` (`trainer/config/actor/actor.yaml` l.93, l.103): the loss is `actor/pg_loss`.
//! - **slime** (THUDM/slime): `slime/utils/arguments.py` (stored version read in session
//!   14): `--eps-clip 0.2`, `--eps-clip-high` None (= eps-clip), `--eps-clip-c` None (no dual
//!   clip), `--entropy-coef 0`, `--use-kl-loss` off, `--use-tis` off, `--use-rollout-logprobs`
//!   off (the old policy is the trainer's `log_probs`); `compute_policy_loss`
//!   (`slime/utils/ppo_utils.py` 06787cf5798525d9af068135ade88dc795d75821):
//!   `max(−r·A, −clip(r)·A)`; reduced by `get_sum_of_sample_mean` (per-sample token mean,
//!   summed; `slime/backends/megatron_utils/cp_utils.py`) and logged as `train/pg_loss`
//!   divided by the number of samples: a mean over samples of per-sample token means.
//! - **NeMo-RL** (NVIDIA-NeMo/RL): `ClippedPGLossFn` (`nemo_rl/algorithms/loss_functions.py`
//!   3520fc0a92edfece955937619cf8f2bcae1845dc) with `examples/configs/grpo_math_1B.yaml`'s
//!   `ratio_clip_min 0.2`, `ratio_clip_max 0.2`, `ratio_clip_c null`, `token_level_loss
//!   true` (token mean over the global batch) and `reference_policy_kl_penalty 0.01` (k3).
//!   `train_data_step{N}.jsonl` holds no reference log-probs, so the KL term cannot be
//!   recomputed: only the clipped policy-gradient term is, and the report says so.
//!
//! A dump taken before the update holds no *current* log-probs. The loss recomputed is then
//! the one of the first micro-batch of the first PPO epoch, where the current policy is
//! still the old one (current = old, ratio 1): `−A` per token, times the importance
//! weights where the stack applies them. The report states this assumption.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::judge::candle_of;
use crate::kernels::aggregate::AggMode;
use crate::kernels::loss::{compute, LossConfig, LossInputs, PolicyKind};
use crate::kernels::policy_loss::ClipParams;
use crate::kernels::presets::preset;
use crate::kernels::to_f64_vec;
use crate::model::step::{LogProbSource, StepDump, TokenTensor};

/// Layout version of the JSON report.
pub const SCHEMA_VERSION: u32 = 1;

/// One stack's documented loss defaults: the configuration, where it was read, and what
/// cannot be recomputed from that stack's dumps.
#[derive(Debug, Clone)]
pub struct StackDefaults {
    /// The kernel configuration of the stack's default loss.
    pub cfg: LossConfig,
    /// The stack's source the defaults follow (file + version/commit).
    pub source: &'static str,
    /// Whether the stack multiplies its dumped importance weights into the per-token loss.
    pub applies_importance_weights: bool,
    /// The logged metric holding this loss (`actor/pg_loss`), when the stack logs it.
    pub logged_metric: Option<&'static str>,
    /// Terms of the stack's default loss that its dumps do not allow to recompute.
    pub not_recomputed: Option<&'static str>,
}

/// The documented defaults of `producer` (the name a [`crate::producers::StepReader`]
/// gives), or `None` for a producer without a trainer loss of its own.
pub fn defaults_for(producer: &str) -> Option<StackDefaults> {
    let clip = |lo: f64, hi: f64, c: Option<f64>| {
        PolicyKind::Clip(ClipParams {
            eps_low: lo,
            eps_high: hi,
            delta: None,
            clip_ratio_c: c,
        })
    };
    let base = preset("verl-vanilla").ok()?;
    match producer {
        "verl" => Some(StackDefaults {
            cfg: base,
            source: "verl 0.9.1 verl/workers/utils/losses.py ppo_loss + verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla (clip 0.2/0.2, clip_ratio_c 3, token-mean, entropy_coeff 0, use_kl_loss false)",
            applies_importance_weights: true,
            logged_metric: Some("actor/pg_loss"),
            not_recomputed: None,
        }),
        "slime" => Some(StackDefaults {
            cfg: LossConfig {
                preset: "slime-default".into(),
                log_ratio_clamp: None,
                policy: clip(0.2, 0.2, None),
                agg: AggMode::SeqMeanTokenMean,
                entropy_agg: AggMode::SeqMeanTokenMean,
                ..base
            },
            source: "THUDM/slime slime/utils/arguments.py defaults (--eps-clip 0.2, --eps-clip-high = eps-clip, no --eps-clip-c, --entropy-coef 0, no KL loss, no TIS) + slime/utils/ppo_utils.py compute_policy_loss @06787cf5 + cp_utils.py get_sum_of_sample_mean (mean over samples of per-sample token means)",
            applies_importance_weights: false,
            logged_metric: Some("train/pg_loss"),
            not_recomputed: None,
        }),
        "nemo-rl" => Some(StackDefaults {
            cfg: LossConfig {
                preset: "nemo-rl-default".into(),
                log_ratio_clamp: None,
                policy: clip(0.2, 0.2, None),
                agg: AggMode::TokenMean,
                entropy_agg: AggMode::TokenMean,
                ..base
            },
            source: "NVIDIA-NeMo/RL nemo_rl/algorithms/loss_functions.py ClippedPGLossFn @3520fc0a + examples/configs/grpo_math_1B.yaml (ratio_clip_min/max 0.2, ratio_clip_c null, token_level_loss true)",
            applies_importance_weights: false,
            logged_metric: None,
            not_recomputed: Some("the KL term (reference_policy_kl_penalty 0.01, k3): train_data_step{N}.jsonl holds no reference log-probs, so only the policy-gradient term is recomputed; NeMo-RL's logged train/loss includes the KL term and is not compared"),
        }),
        _ => None,
    }
}

/// The recomputed loss of one rank × micro cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellLoss {
    /// Data-parallel rank.
    pub rank: usize,
    /// Micro-batch, when the stack dumps per micro.
    pub micro: Option<usize>,
    /// Rows of the cell.
    pub rows: usize,
    /// Tokens under the mask.
    pub tokens: usize,
    /// The cell's own loss under the defaults (its tokens/rows only).
    pub pg_loss: f64,
    /// The loss the stack dumped for this cell, when it dumped one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dumped: Option<f64>,
    /// Whether the dumped loss equals the recomputed one within the tolerances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agrees: Option<bool>,
}

/// The logged metric compared with the recomputed loss.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoggedLoss {
    /// The log file.
    pub file: PathBuf,
    /// 1-based line of the record.
    pub line: usize,
    /// The metric's key (`actor/pg_loss`).
    pub key: String,
    /// The logged value.
    pub value: f64,
    /// Whether it agrees with the recomputed step loss within tolerance.
    pub agrees: bool,
}

/// losscheck's report on another stack's step.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StackLossReport {
    /// Layout version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// Absolute tolerance of the comparisons.
    pub atol: f64,
    /// Relative tolerance of the comparisons.
    pub rtol: f64,
    /// The producer (`verl`, `slime`, `nemo-rl`).
    pub producer: String,
    /// The dump read.
    pub root: PathBuf,
    /// The step.
    pub step: i64,
    /// True when the stack dumped a loss for this step (then it is checked).
    pub loss_dumped: bool,
    /// The plain statement of what was dumped and what was done ("verl dumps no loss for
    /// this step: …").
    pub statement: String,
    /// The configuration the loss was recomputed with.
    pub config: LossConfig,
    /// Where the defaults were read.
    pub defaults_source: String,
    /// The assumptions made (current log-probs taken equal to old, weights applied…).
    pub assumptions: Vec<String>,
    /// The step's loss over all its cells, when it could be recomputed.
    pub pg_loss: Option<f64>,
    /// Why the loss could not be recomputed, when it could not (missing inputs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cannot_recompute: Option<String>,
    /// Why the dumped losses are not judged, when no convention tried reproduces any of
    /// them (a warning, never a failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cannot_judge: Option<String>,
    /// Per-cell values.
    pub cells: Vec<CellLoss>,
    /// The logged metric, when `--logs` was given and holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logged: Option<LoggedLoss>,
    /// What the logs comparison could not do (no metric of that name, stack logs none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl StackLossReport {
    /// True when a dumped or logged loss disagrees with the recomputed one (exit 1).
    pub fn inconsistent(&self) -> bool {
        self.logged.as_ref().is_some_and(|l| !l.agrees)
            || self.cells.iter().any(|c| c.agrees == Some(false))
    }

    /// The report as plain text (the table format).
    pub fn render_text(&self) -> String {
        let mut s = format!(
            "losscheck: {} step {} ({})\n{}\n  defaults: {}\n",
            self.producer,
            self.step,
            self.root.display(),
            self.statement,
            self.defaults_source
        );
        for a in &self.assumptions {
            s += &format!("  assumed: {a}\n");
        }
        match (self.pg_loss, &self.cannot_recompute) {
            (Some(v), _) => s += &format!("pg_loss (recomputed, whole step)  {v:.9}\n"),
            (None, Some(why)) => s += &format!("cannot recompute: {why}\n"),
            (None, None) => {}
        }
        if let Some(why) = &self.cannot_judge {
            s += &format!("warning: {why}\n");
        }
        for c in &self.cells {
            let micro = c.micro.map(|m| format!(" micro {m}")).unwrap_or_default();
            s += &format!(
                "  rank {}{micro}: {} rows, {} tokens, pg_loss {:.9}",
                c.rank, c.rows, c.tokens, c.pg_loss
            );
            if let Some(d) = c.dumped {
                s += &format!(", dumped {d:.9}");
                if c.agrees == Some(false) {
                    s += ": DIFFERS from the recomputed loss";
                }
            }
            s += "\n";
        }
        if let Some(l) = &self.logged {
            s += &format!(
                "logged {} {:.9} ({} line {}): {}\n",
                l.key,
                l.value,
                l.file.display(),
                l.line,
                if l.agrees {
                    "agrees with the recomputed loss"
                } else {
                    "DIFFERS from the recomputed loss"
                }
            );
        }
        for n in &self.notes {
            s += &format!("note: {n}\n");
        }
        s
    }
}

fn close(a: f64, b: f64, (atol, rtol): (f64, f64)) -> bool {
    (a - b).abs() <= atol + rtol * b.abs()
}

/// One cell's inputs, as f64 rows.
struct CellInputs {
    per_token: Vec<f64>,
    mask: Vec<f64>,
    width: usize,
}

/// Recompute `dump`'s loss under `defaults` (or `cfg_override`, a `--preset`), compare
/// with a dumped loss and with `logs` (JSONL records with a `step` and the stack's logged
/// metric), within `atol + rtol·|x|`.
///
/// Errors: a logs file unreadable or not JSONL (named with its line); a tensor the kernels
/// refuse (named with its file and key).
pub fn check_stack(
    dump: &StepDump,
    defaults: &StackDefaults,
    logs: Option<&Path>,
    atol: f64,
    rtol: f64,
) -> Result<StackLossReport> {
    let cfg = defaults.cfg.clone();
    // What is recomputed is the policy-gradient term: a dumped `pg_loss` is compared, a
    // dumped total only when the configuration adds no KL or entropy term to it.
    let total_is_pg = cfg.kl.is_none() && cfg.entropy_coeff == 0.0;
    let dumped_of =
        |l: &crate::model::step::LossRecord| l.pg_loss.or(l.loss.filter(|_| total_is_pg));
    let loss_dumped = dump
        .cells
        .iter()
        .any(|c| c.loss.as_ref().and_then(dumped_of).is_some());
    let mut assumptions = Vec::new();
    let mut notes = Vec::new();
    if !loss_dumped
        && dump
            .cells
            .iter()
            .any(|c| c.loss.as_ref().is_some_and(|l| l.loss.is_some()))
    {
        notes.push("a total loss is dumped but no pg_loss, and the configuration adds a KL or entropy term the dump's inputs do not give: the total is not compared".into());
    }
    let mut parts = Vec::new();
    let mut cannot = None;
    for c in &dump.cells {
        let b = &c.batch;
        let old = b
            .log_probs(LogProbSource::Old)
            .or_else(|| b.log_probs(LogProbSource::Rollout));
        let mask = b.loss_mask.as_ref().or(b.response_mask.as_ref());
        let (Some(old), Some(adv), Some(mask)) = (old, b.advantages.as_ref(), mask) else {
            let missing: Vec<&str> = [
                (old.is_none(), "old or rollout log-probs"),
                (b.advantages.is_none(), "advantages"),
                (mask.is_none(), "a response/loss mask"),
            ]
            .iter()
            .filter(|(m, _)| *m)
            .map(|(_, n)| *n)
            .collect();
            cannot = Some(format!(
                "rank {} holds no {} (a dump taken before the advantages are computed)",
                c.rank,
                missing.join(", ")
            ));
            break;
        };
        let current = b.log_probs(LogProbSource::Current).unwrap_or(old);
        parts.push((c, current, old, adv, mask, b.importance_weights.as_ref()));
    }
    if cannot.is_some() {
        parts.clear();
    }
    let inputs_with = |weighted: bool| -> Result<Vec<CellInputs>> {
        parts
            .iter()
            .map(|(_, cur, old, adv, mask, w)| {
                cell_loss(cur, old, adv, mask, w.filter(|_| weighted), &cfg)
            })
            .collect()
    };
    let per_cell = |inp: &[CellInputs], agg: AggMode| -> Result<Vec<f64>> {
        inp.iter()
            .map(|i| step_loss(std::slice::from_ref(i), agg))
            .collect()
    };
    let dumped: Vec<Option<f64>> = parts
        .iter()
        .map(|p| p.0.loss.as_ref().and_then(dumped_of))
        .collect();
    let agreeing = |pgs: &[f64]| {
        dumped
            .iter()
            .zip(pgs)
            .filter(|(d, p)| d.is_some_and(|d| close(d, **p, (atol, rtol))))
            .count()
    };
    let mut weighted = defaults.applies_importance_weights;
    let mut agg = cfg.agg;
    let mut inputs = inputs_with(weighted)?;
    let mut pgs = per_cell(&inputs, agg)?;
    let mut cannot_judge = None;
    let n_dumped = dumped.iter().flatten().count();
    if n_dumped > 0 && agreeing(&pgs) < n_dumped {
        // Before calling a dumped loss wrong, the convention must reproduce the stack's
        // own values: the one reproducing the most cells is kept (the configuration's on
        // a tie), among the aggregations and with or without the dumped weights.
        let with_weights = parts.iter().any(|p| p.5.is_some());
        let mut best = (agreeing(&pgs), weighted, agg);
        // the other weighting's inputs, computed once (kept if adopted)
        let mut other = if with_weights {
            Some(inputs_with(!weighted)?)
        } else {
            None
        };
        let tried =
            std::iter::once((weighted, &inputs)).chain(other.as_ref().map(|o| (!weighted, o)));
        for (w, inp) in tried {
            for a in [
                AggMode::TokenMean,
                AggMode::SeqMeanTokenMean,
                AggMode::SeqMeanTokenSum,
            ] {
                let n = agreeing(&per_cell(inp, a)?);
                if n > best.0 {
                    best = (n, w, a);
                }
            }
        }
        if best.0 == 0 {
            cannot_judge = Some(format!(
                "cannot judge the dumped losses: neither the configuration ({} aggregation{}) nor token-mean, seq-mean-token-mean or seq-mean-token-sum, with or without the dumped importance weights, reproduces any of the {n_dumped} dumped values",
                cfg.agg.name(),
                if weighted { ", importance weights applied" } else { "" }
            ));
        } else if (best.1, best.2) != (weighted, agg) {
            assumptions.push(format!(
                "the dumped losses are reproduced with {} aggregation{} ({} of {n_dumped} cells), not with the configuration's {}{}: checked under it",
                best.2.name(),
                if best.1 { " and the dumped importance weights" } else { " and no importance weights" },
                best.0,
                agg.name(),
                if weighted { " with the weights" } else { "" },
            ));
            if best.1 != weighted {
                inputs = other.take().unwrap_or_default();
            }
            (weighted, agg) = (best.1, best.2);
            pgs = per_cell(&inputs, agg)?;
        }
    }
    let cfg = LossConfig { agg, ..cfg };
    let cells: Vec<CellLoss> = parts
        .iter()
        .zip(&inputs)
        .zip(pgs.iter().zip(&dumped))
        .map(|(((c, ..), one), (&pg, &dumped))| CellLoss {
            rank: c.rank,
            micro: c.micro,
            rows: one.mask.len().checked_div(one.width).unwrap_or(0),
            tokens: one.mask.iter().filter(|m| **m != 0.0).count(),
            pg_loss: pg,
            dumped,
            agrees: dumped
                .filter(|_| cannot_judge.is_none())
                .map(|d| close(d, pg, (atol, rtol))),
        })
        .collect();
    let any = |f: &dyn Fn(&crate::model::step::TokenBatch) -> bool| {
        dump.cells.iter().any(|c| f(&c.batch))
    };
    if cannot.is_none() {
        if any(&|b| b.log_probs(LogProbSource::Current).is_none()) {
            assumptions.push(
                "no current log-probs dumped: the loss of the first micro-batch of the first PPO epoch, current = old (ratio 1)".into(),
            );
        }
        if any(&|b| b.log_probs(LogProbSource::Old).is_none()) {
            assumptions.push("no trainer (old) log-probs dumped: the engine's (rollout) log-probs stand for them".into());
        }
        if weighted && any(&|b| b.importance_weights.is_some()) {
            assumptions.push("the dumped importance weights (rollout_is_weights) multiply the per-token loss, as the stack does".into());
        }
    }
    if let Some(n) = defaults.not_recomputed {
        notes.push(format!("not recomputed: {n}"));
    }
    let pg_loss = if cannot.is_none() && !inputs.is_empty() {
        Some(step_loss(&inputs, cfg.agg)?)
    } else {
        None
    };
    let statement = if loss_dumped {
        format!(
            "{} dumps a loss for this step: checked against the recomputed one",
            dump.producer
        )
    } else if pg_loss.is_some() {
        format!(
            "{} dumps no loss for this step: recomputed the loss it would have computed under its documented defaults",
            dump.producer
        )
    } else {
        format!(
            "{} dumps no loss for this step, and not the inputs to recompute it",
            dump.producer
        )
    };
    let logged = match (logs, defaults.logged_metric, pg_loss) {
        (Some(file), Some(key), Some(v)) => {
            let found = crate::logs::logged::metric_at_step(file, dump.step, key)?;
            if found.is_none() {
                notes.push(format!(
                    "{}: no record of step {} with {key}",
                    file.display(),
                    dump.step
                ));
            }
            found.map(|(line, value)| LoggedLoss {
                file: file.to_path_buf(),
                line,
                key: key.to_string(),
                value,
                agrees: close(value, v, (atol, rtol)),
            })
        }
        (Some(_), None, _) => {
            notes.push(format!(
                "{} logs no metric equal to this loss: --logs not compared",
                dump.producer
            ));
            None
        }
        _ => None,
    };
    Ok(StackLossReport {
        schema_version: SCHEMA_VERSION,
        atol,
        rtol,
        producer: dump.producer.clone(),
        root: dump.root.clone(),
        step: dump.step,
        loss_dumped,
        statement,
        config: cfg,
        defaults_source: defaults.source.to_string(),
        assumptions,
        pg_loss,
        cannot_recompute: cannot,
        cannot_judge,
        cells,
        logged,
        notes,
    })
}

/// One cell's per-token loss under `cfg` (the kernels' [`compute`]), times `weights`.
fn cell_loss(
    current: &TokenTensor,
    old: &TokenTensor,
    adv: &TokenTensor,
    mask: &TokenTensor,
    weights: Option<&TokenTensor>,
    cfg: &LossConfig,
) -> Result<CellInputs> {
    let kerr = |t: &TokenTensor, e: crate::kernels::KernelError| {
        Error::format(
            &t.source.file,
            crate::error::Position::Key(t.source.key.clone()),
            e.to_string(),
        )
    };
    let inp = LossInputs {
        log_probs: candle_of(current)?,
        old_log_probs: Some(candle_of(old)?),
        ref_log_probs: None,
        advantages: candle_of(adv)?,
        mask: candle_of(mask)?,
        entropy: None,
        rollout_log_probs: None,
    };
    let cfg = LossConfig {
        kl: None,
        entropy_coeff: 0.0,
        rollout_is: None,
        ..cfg.clone()
    };
    let out = compute(&inp, &cfg).map_err(|e| kerr(adv, e))?;
    let mut per_token = to_f64_vec(&out.per_token_loss).map_err(|e| kerr(adv, e))?;
    let shape = current.tensor.shape();
    let width = shape.get(1).copied().unwrap_or(0);
    let m = mask.tensor.to_f64_vec();
    if let Some(w) = weights {
        let w = w.tensor.to_f64_vec();
        if w.len() != per_token.len() {
            return Err(Error::format(
                &mask.source.file,
                crate::error::Position::Key("rollout_is_weights".into()),
                format!(
                    "{} importance weights for {} tokens",
                    w.len(),
                    per_token.len()
                ),
            ));
        }
        per_token.iter_mut().zip(&w).for_each(|(l, w)| *l *= w);
    }
    Ok(CellInputs {
        per_token,
        mask: m,
        width,
    })
}

/// The step's loss over `cells` aggregated as the stack does over its whole batch:
/// token-mean `Σ m·l / Σ m` (verl `agg_loss` with the global token count, NeMo-RL
/// `token_level_loss`), seq-mean-token-mean (slime's sum of per-sample means over the
/// number of samples), seq-mean-token-sum.
fn step_loss(cells: &[CellInputs], agg: AggMode) -> Result<f64> {
    let rows = || {
        cells.iter().flat_map(|c| {
            let w = c.width.max(1);
            c.per_token.chunks(w).zip(c.mask.chunks(w))
        })
    };
    let masked = |l: &[f64], m: &[f64]| -> (f64, f64) {
        l.iter()
            .zip(m)
            .filter(|(_, m)| **m != 0.0)
            .fold((0.0, 0.0), |(s, n), (l, m)| (s + l * m, n + m))
    };
    match agg {
        AggMode::TokenMean => {
            let (s, n) = rows().fold((0.0, 0.0), |(s, n), (l, m)| {
                let (a, b) = masked(l, m);
                (s + a, n + b)
            });
            Ok(s / n)
        }
        AggMode::SeqMeanTokenMean | AggMode::SeqMeanTokenSum => {
            let per_row: Vec<f64> = rows()
                .filter_map(|(l, m)| {
                    let (s, n) = masked(l, m);
                    (n > 0.0).then(|| {
                        if agg == AggMode::SeqMeanTokenMean {
                            s / n
                        } else {
                            s
                        }
                    })
                })
                .collect();
            Ok(per_row.iter().sum::<f64>() / per_row.len() as f64)
        }
        other => Err(Error::Usage(format!(
            "losscheck on a stack's step aggregates token-mean, seq-mean-token-mean or seq-mean-token-sum, not {}",
            other.name()
        ))),
    }
}
