//! Reduce a `[B, T]` per-token loss to a scalar under a `[B, T]` float mask, each mode with
//! its framework's handling of empty rows and empty micro-batches.

use candle_core::Tensor;

use super::{clamp_torch, dims2, full_like, mask_bool, same_shape, scalar, KResult};

/// How a per-token loss matrix becomes a scalar.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum AggMode {
    /// verl `token-mean`: `Σ m·l / Σ m`; an empty micro gives 0/0 = NaN. Values under
    /// `m = 0` never leak (verl `masked_sum` zeroes them, NaN included).
    TokenMean,
    /// verl `seq-mean-token-mean`: mean over non-empty rows of `Σ m·l / (Σ m + 1e-8)`;
    /// empty rows excluded, all rows empty gives NaN.
    SeqMeanTokenMean,
    /// verl `seq-mean-token-sum`: mean over non-empty rows of `Σ m·l`.
    SeqMeanTokenSum,
    /// verl `seq-mean-token-sum-norm`: `seq-mean-token-sum / horizon` (`loss_scale_factor`,
    /// default the padded width T).
    SeqMeanTokenSumNorm {
        /// verl `loss_scale_factor`; `None` = T.
        horizon: Option<f64>,
    },
    /// TRL `grpo`: `mean_rows(Σ m·l / max(Σ m, 1))` — empty rows count as 0 in the mean.
    TrlGrpo,
    /// TRL `bnpo`: `Σ m·l / max(Σ m, 1)` — an empty micro gives 0.
    TrlBnpo,
    /// TRL `dr_grpo`: `Σ m·l / (B · max_completion_length)`.
    TrlDrGrpo {
        /// `max_completion_length`; `None` = T.
        max_completion_length: Option<f64>,
    },
    /// TRL `dapo`: `Σ m·l / max(num_items_in_batch, 1)` (one process, no accumulation).
    TrlDapo {
        /// Valid tokens of the generation batch; `None` = `Σ m` of this micro.
        num_items_in_batch: Option<f64>,
    },
}

impl AggMode {
    /// Parse a mode name as the frameworks spell it (`token-mean`, `seq-mean-token-mean`,
    /// `seq-mean-token-sum`, `seq-mean-token-sum-norm`, `grpo`, `bnpo`, `dr_grpo`, `dapo`).
    pub fn parse(name: &str) -> Option<AggMode> {
        Some(match name.replace('_', "-").as_str() {
            "token-mean" => AggMode::TokenMean,
            "seq-mean-token-mean" => AggMode::SeqMeanTokenMean,
            "seq-mean-token-sum" => AggMode::SeqMeanTokenSum,
            "seq-mean-token-sum-norm" => AggMode::SeqMeanTokenSumNorm { horizon: None },
            "grpo" | "trl-grpo" => AggMode::TrlGrpo,
            "bnpo" | "trl-bnpo" => AggMode::TrlBnpo,
            "dr-grpo" | "trl-dr-grpo" => AggMode::TrlDrGrpo {
                max_completion_length: None,
            },
            "dapo" | "trl-dapo" => AggMode::TrlDapo {
                num_items_in_batch: None,
            },
            _ => return None,
        })
    }

    /// True for the verl modes, whose masked sums zero out padding (NaN included).
    pub fn is_verl(self) -> bool {
        matches!(
            self,
            AggMode::TokenMean
                | AggMode::SeqMeanTokenMean
                | AggMode::SeqMeanTokenSum
                | AggMode::SeqMeanTokenSumNorm { .. }
        )
    }
}

/// verl `masked_sum` without reduction: `where(m != 0, x, 0) · m`. `[B, T]`.
pub fn masked_verl(x: &Tensor, mask: &Tensor) -> KResult<Tensor> {
    let zeros = full_like(x, 0.0)?;
    Ok((mask_bool(mask)?.where_cond(x, &zeros)? * mask)?)
}

/// Aggregate `loss_mat` `[B, T]` under `mask` `[B, T]` (same float dtype). 0-d result.
pub fn aggregate(loss_mat: &Tensor, mask: &Tensor, mode: AggMode) -> KResult<Tensor> {
    let (b, t) = dims2("loss_mat", loss_mat)?;
    same_shape("loss_mat", loss_mat, "mask", mask)?;
    let masked = if mode.is_verl() {
        masked_verl(loss_mat, mask)?
    } else {
        (loss_mat * mask)?
    };
    let out = match mode {
        AggMode::TokenMean => (masked.sum_all()? / mask.sum_all()?)?,
        AggMode::SeqMeanTokenMean
        | AggMode::SeqMeanTokenSum
        | AggMode::SeqMeanTokenSumNorm { .. } => {
            let count = mask.sum(1)?;
            let seq = masked.sum(1)?;
            let seq = if mode == AggMode::SeqMeanTokenMean {
                (seq / count.affine(1.0, 1e-8)?)?
            } else {
                seq
            };
            let seq_mask = count.gt(0.0)?.to_dtype(loss_mat.dtype())?;
            let seq = masked_verl(&seq.unsqueeze(0)?, &seq_mask.unsqueeze(0)?)?;
            let loss = (seq.sum_all()? / seq_mask.sum_all()?)?;
            match mode {
                AggMode::SeqMeanTokenSumNorm { horizon } => {
                    loss.broadcast_div(&scalar(horizon.unwrap_or(t as f64), loss.dtype())?)?
                }
                _ => loss,
            }
        }
        AggMode::TrlGrpo => {
            let per_row = (masked.sum(1)? / clamp_torch(&mask.sum(1)?, Some(1.0), None)?)?;
            per_row.mean_all()?
        }
        AggMode::TrlBnpo => (masked.sum_all()? / clamp_torch(&mask.sum_all()?, Some(1.0), None)?)?,
        AggMode::TrlDrGrpo {
            max_completion_length,
        } => {
            let l = max_completion_length.unwrap_or(t as f64);
            let sum = masked.sum_all()?;
            sum.broadcast_div(&scalar(b as f64 * l, sum.dtype())?)?
        }
        AggMode::TrlDapo { num_items_in_batch } => {
            let n = match num_items_in_batch {
                Some(n) => n.max(1.0),
                None => super::to_f64(&mask.sum_all()?)?.max(1.0),
            };
            let sum = masked.sum_all()?;
            sum.broadcast_div(&scalar(n, sum.dtype())?)?
        }
    };
    Ok(out)
}

/// verl `masked_mean`: `Σ where(m, x, 0)·m / (Σ m + 1e-8)`; used for verl's metrics. 0-d.
pub fn masked_mean_verl(x: &Tensor, mask: &Tensor) -> KResult<Tensor> {
    same_shape("values", x, "mask", mask)?;
    Ok((masked_verl(x, mask)?.sum_all()? / mask.sum_all()?.affine(1.0, 1e-8)?)?)
}

/// TRL `global_masked_mean` on one process: `Σ x·m / max(Σ m, 1)`. 0-d.
pub fn masked_mean_trl(x: &Tensor, mask: &Tensor) -> KResult<Tensor> {
    same_shape("values", x, "mask", mask)?;
    Ok(((x * mask)?.sum_all()? / clamp_torch(&mask.sum_all()?, Some(1.0), None)?)?)
}
