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

impl AggMode {
    /// The mode's name as verl and TRL spell it (`seq-mean-token-sum-norm/H` with its
    /// horizon, `dr_grpo`): what both tools print.
    pub fn name(self) -> String {
        match self {
            AggMode::TokenMean => "token-mean".into(),
            AggMode::SeqMeanTokenSum => "seq-mean-token-sum".into(),
            AggMode::SeqMeanTokenMean => "seq-mean-token-mean".into(),
            AggMode::SeqMeanTokenSumNorm { horizon: Some(h) } => {
                format!("seq-mean-token-sum-norm/{}", crate::fmt::num(h))
            }
            AggMode::SeqMeanTokenSumNorm { horizon: None } => "seq-mean-token-sum-norm".into(),
            AggMode::TrlGrpo => "grpo".into(),
            AggMode::TrlBnpo => "bnpo".into(),
            AggMode::TrlDrGrpo { .. } => "dr_grpo".into(),
            AggMode::TrlDapo { .. } => "dapo".into(),
        }
    }

    /// The weight [`aggregate`] gives each valid element (times its mask value) of a row
    /// with `n` valid elements (the row's mask sum): every mode is linear, `Σ wᵢ·mᵢ·xᵢ`.
    /// `total` is the micro's mask sum, `seqs` its rows with `n > 0`, `b` × `t` its shape
    /// (`t`, the padded width, is the default horizon).
    pub fn element_weight(self, n: f64, total: f64, seqs: f64, b: usize, t: usize) -> f64 {
        match self {
            AggMode::TokenMean => 1.0 / total,
            AggMode::SeqMeanTokenSum => 1.0 / seqs,
            AggMode::SeqMeanTokenMean => 1.0 / ((n + 1e-8) * seqs),
            AggMode::SeqMeanTokenSumNorm { horizon } => 1.0 / (seqs * horizon.unwrap_or(t as f64)),
            AggMode::TrlGrpo => 1.0 / (n.max(1.0) * b as f64),
            AggMode::TrlBnpo => 1.0 / total.max(1.0),
            AggMode::TrlDrGrpo {
                max_completion_length,
            } => 1.0 / (b as f64 * max_completion_length.unwrap_or(t as f64)),
            AggMode::TrlDapo { num_items_in_batch } => {
                1.0 / num_items_in_batch.unwrap_or(total).max(1.0)
            }
        }
    }

    /// The weight of each valid element listed row after row (`row_counts[r]` of row
    /// `r`, mask 1; `t` the padded width): [`AggMode::element_weight`] per row.
    pub fn row_weights(self, row_counts: &[usize], t: usize) -> Vec<f64> {
        let total = row_counts.iter().sum::<usize>() as f64;
        let seqs = row_counts.iter().filter(|&&c| c > 0).count() as f64;
        let b = row_counts.len();
        let mut out = Vec::with_capacity(total as usize);
        for &c in row_counts {
            let w = self.element_weight(c as f64, total, seqs, b, t);
            out.extend(std::iter::repeat_n(w, c));
        }
        out
    }

    /// Reduce `vals`, the valid elements row after row (`row_counts[r]` of row `r`, mask
    /// 1; `t` the padded width), as [`aggregate`] does: verl's modes row sums first, then
    /// the mean over non-empty rows. 0 without valid elements (or too few `vals`).
    pub fn reduce_rows(self, row_counts: &[usize], vals: &[f64], t: usize) -> f64 {
        let n: usize = row_counts.iter().sum();
        if n == 0 || vals.len() < n {
            return 0.0;
        }
        if self == AggMode::TokenMean {
            return vals[..n].iter().sum::<f64>() / n as f64;
        }
        let seqs = row_counts.iter().filter(|&&c| c > 0).count() as f64;
        let (mut acc, mut at) = (0.0, 0usize);
        for &c in row_counts {
            let s: f64 = vals[at..at + c].iter().sum();
            at += c;
            acc += match self {
                _ if c == 0 => 0.0,
                AggMode::SeqMeanTokenSum | AggMode::SeqMeanTokenSumNorm { .. } => s,
                AggMode::SeqMeanTokenMean => s / (c as f64 + 1e-8),
                // TRL: the per-element weight is the row's, applied to its sum
                m => m.element_weight(c as f64, n as f64, seqs, row_counts.len(), t) * s,
            };
        }
        match self {
            AggMode::SeqMeanTokenSum | AggMode::SeqMeanTokenMean => acc / seqs,
            AggMode::SeqMeanTokenSumNorm { horizon } => acc / seqs / horizon.unwrap_or(t as f64),
            _ => acc,
        }
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

#[cfg(test)]
mod row_tests {
    use super::*;

    #[test]
    fn row_reductions_match_the_weights_and_the_tensor_kernel() {
        // rows [1, 2, 3], [] and [4] of a [3, 4] micro
        let (rows, v) = ([3, 0, 1], [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(AggMode::TokenMean.reduce_rows(&rows, &v, 4), 2.5);
        assert_eq!(AggMode::SeqMeanTokenSum.reduce_rows(&rows, &v, 4), 5.0);
        let stm = AggMode::SeqMeanTokenMean.reduce_rows(&rows, &v, 4);
        // verl divides a row sum by its count + 1e-8
        assert!((stm - 3.0).abs() < 3e-8, "{stm}");
        let norm = |h| AggMode::SeqMeanTokenSumNorm { horizon: h };
        assert_eq!(norm(Some(10.0)).reduce_rows(&rows, &v, 4), 0.5);
        assert_eq!(norm(None).reduce_rows(&rows, &v, 4), 1.25);
        // TRL grpo: rows (2 + 0 + 4) / 3; bnpo 10 / 4; dr_grpo 10 / (3·4)
        assert!((AggMode::TrlGrpo.reduce_rows(&rows, &v, 4) - 2.0).abs() < 1e-15);
        assert_eq!(AggMode::TrlBnpo.reduce_rows(&rows, &v, 4), 2.5);
        let dr = AggMode::parse("dr_grpo").unwrap().reduce_rows(&rows, &v, 4);
        assert!((dr - 10.0 / 12.0).abs() < 1e-15);
        // every mode: Σ w·x = reduce_rows = the candle kernel on the padded matrix
        let mask = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let x = [1.0, 2.0, 3.0, 9.0, 9.0, 9.0, 9.0, 9.0, 4.0, 9.0, 9.0, 9.0];
        let dev = candle_core::Device::Cpu;
        let xt = Tensor::from_slice(&x, (3, 4), &dev).unwrap();
        let mt = Tensor::from_slice(&mask, (3, 4), &dev).unwrap();
        for name in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
            .into_iter()
            .chain(["seq-mean-token-sum-norm", "grpo", "bnpo", "dr_grpo", "dapo"])
        {
            let m = AggMode::parse(name).unwrap();
            let kernel = aggregate(&xt, &mt, m).unwrap().to_scalar::<f64>().unwrap();
            let by_rows = m.reduce_rows(&rows, &v, 4);
            let by_weights: f64 = m
                .row_weights(&rows, 4)
                .iter()
                .zip(&v)
                .map(|(w, x)| w * x)
                .sum();
            assert!(
                (kernel - by_rows).abs() < 1e-14,
                "{name}: {kernel} vs {by_rows}"
            );
            assert!(
                (kernel - by_weights).abs() < 1e-14,
                "{name}: {kernel} vs {by_weights}"
            );
        }
        assert_eq!(norm(Some(16.0)).name(), "seq-mean-token-sum-norm/16");
        assert_eq!(AggMode::parse("dr-grpo").unwrap().name(), "dr_grpo");
    }
}
