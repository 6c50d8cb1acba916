//! verl's rollout correction: importance weights against the rollout engine's log-probs,
//! multiplied into the per-token policy loss before aggregation.
//!
//! Follows verl 0.9.1 `verl/trainer/ppo/rollout_corr_helper.py`
//! `compute_rollout_correction_weights(log_ratio, response_mask, rollout_is,
//! rollout_is_threshold)`, called by `compute_rollout_correction_and_rejection_mask` with
//! `log_ratio = old_log_prob - rollout_log_prob` (the OLD policy's log-probs, not the
//! current ones):
//! - `rollout_is="token"`: `raw = exp(clamp(log_ratio, -20, 20))` per token;
//! - `rollout_is="sequence"`: `raw = exp(clamp(masked_sum(log_ratio, response_mask, -1),
//!   -20, 20))`, one value per row broadcast over it (the sum runs over the response
//!   mask only);
//! - then `raw = raw * response_mask`;
//! - a single threshold (`"5"` / `5.0`): TIS, `w = raw.clamp(max=upper)`;
//!   a `"lower_upper"` string (`"0.5_2.0"`): IcePop, `w = raw` where
//!   `lower <= raw <= upper`, else 0 (both ends inclusive);
//! - `w.detach()`: no gradient flows through the weights (here they are constants).
//!
//! - `rollout_is_batch_normalize` (off by default): after the threshold, the weights are
//!   divided by their batch mean (token level: the masked mean of every token's weight;
//!   sequence level: the mean over rows of each row's weight), computed by verl in the
//!   trainer over the whole batch before it is split ([`RolloutIs::norm`]; read off the
//!   dumped values as one factor every kept token shares, [`read`]).
//!
//! Rejection sampling (`rollout_rs`) and the per-token veto zero the response mask itself
//! (`compute_rollout_rejection_mask`), which a side dumps as its loss mask: see
//! [`reject`].
//!
//! Shapes: `old`, `rollout`, `mask` are row-major `[rows, width]` f64 slices (any stored
//! dtype, read as f64; the mask non-zero = valid); the weights come back the same shape.

use serde::Serialize;

pub mod read;
pub mod reject;

/// verl's `SAFETY_BOUND`: the log-ratio (token) or its row sum (sequence) is clamped to
/// `±20` before `exp`.
pub const SAFETY_BOUND: f64 = 20.0;

/// The level a weight lives at (verl `rollout_is`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsLevel {
    /// One weight per token.
    Token,
    /// One weight per row: `exp` of the row's summed log-ratio.
    Sequence,
}

/// What is done with weights outside the threshold (verl `rollout_is_threshold`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum IsBound {
    /// Truncated importance sampling: `min(raw, cap)` (an infinite cap: no token
    /// reaches one, the raw weights).
    Cap {
        /// The upper threshold.
        cap: f64,
    },
    /// IcePop: `raw` inside `[lo, hi]`, 0 outside (`lo` 0 / `hi` infinite: a bound no
    /// token was seen beyond, when read off data).
    Band {
        /// Lower threshold (inclusive).
        lo: f64,
        /// Upper threshold (inclusive).
        hi: f64,
    },
}

/// One rollout-correction scheme: its level and its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RolloutIs {
    /// Token or sequence level.
    pub level: IsLevel,
    /// Cap or band.
    pub bound: IsBound,
    /// verl's `rollout_is_batch_normalize`: the bounded weights are divided by this
    /// (their batch mean, `rollout_is_batch_norm_factor`); 1 when not normalised.
    pub norm: f64,
}

impl RolloutIs {
    /// Token-level TIS with `cap` (verl's default scheme, cap 2 by default).
    pub fn token_cap(cap: f64) -> Self {
        RolloutIs {
            level: IsLevel::Token,
            bound: IsBound::Cap { cap },
            norm: 1.0,
        }
    }

    /// This scheme divided by `norm` (verl's `rollout_is_batch_normalize`).
    pub fn normalised(self, norm: f64) -> Self {
        RolloutIs { norm, ..self }
    }

    /// `", batch-normalised (÷ 0.93)"` when the weights are divided by a batch mean, else
    /// empty.
    pub fn norm_words(&self) -> String {
        if self.norm == 1.0 {
            String::new()
        } else {
            format!(
                ", batch-normalised (÷ {}, the weights' batch mean)",
                crate::fmt::num(self.norm)
            )
        }
    }

    /// The weight of each token (see the module notes), `[rows, width]`.
    pub fn weights(
        &self,
        old: &[f64],
        rollout: &[f64],
        mask: &[f64],
        rows: usize,
        width: usize,
    ) -> Vec<f64> {
        self.raw(old, rollout, mask, rows, width)
            .into_iter()
            .map(|r| self.bound.apply(r) / self.norm)
            .collect()
    }

    /// The untruncated weight `raw · mask` of each token, `[rows, width]`.
    pub fn raw(
        &self,
        old: &[f64],
        rollout: &[f64],
        mask: &[f64],
        rows: usize,
        width: usize,
    ) -> Vec<f64> {
        raw_weights(self.level, old, rollout, mask, rows, width)
    }

    /// The scheme in the words of the conventions record (`token TIS cap 5`,
    /// `sequence-level IcePop band 0.2–5`, then [`Self::norm_words`]).
    pub fn words(&self) -> String {
        self.bound_words() + &self.norm_words()
    }

    /// [`Self::words`] without the normalisation.
    fn bound_words(&self) -> String {
        let level = match self.level {
            IsLevel::Token => "token",
            IsLevel::Sequence => "sequence-level",
        };
        match self.bound {
            IsBound::Cap { cap } if cap.is_infinite() => format!("{level} TIS, no cap reached"),
            IsBound::Cap { cap } => format!("{level} TIS cap {}", crate::fmt::num(cap)),
            IsBound::Band { lo, hi } if lo <= 0.0 => format!(
                "{level} IcePop band up to {} (no token below a lower bound)",
                crate::fmt::num(hi)
            ),
            IsBound::Band { lo, hi } if hi.is_infinite() => format!(
                "{level} IcePop band from {} (no token above an upper bound)",
                crate::fmt::num(lo)
            ),
            IsBound::Band { lo, hi } => format!(
                "{level} IcePop band {}–{}",
                crate::fmt::num(lo),
                crate::fmt::num(hi)
            ),
        }
    }

    /// The weight as a formula (`min(exp(old − rollout), 5)`,
    /// `exp(Σ_row(old − rollout)) inside [0.2, 5], else 0`, `… / 0.93` when normalised).
    pub fn formula(&self) -> String {
        if self.norm == 1.0 {
            self.bound_formula()
        } else {
            format!(
                "({}) / {}",
                self.bound_formula(),
                crate::fmt::num(self.norm)
            )
        }
    }

    /// [`Self::formula`] without the normalisation.
    fn bound_formula(&self) -> String {
        let raw = match self.level {
            IsLevel::Token => "exp(old − rollout)",
            IsLevel::Sequence => "exp(Σ_row(old − rollout))",
        };
        match self.bound {
            IsBound::Cap { cap } if cap.is_infinite() => format!("{raw} (no cap reached)"),
            IsBound::Cap { cap } => format!("min({raw}, {})", crate::fmt::num(cap)),
            IsBound::Band { lo, hi } if lo <= 0.0 => {
                format!("{raw} where ≤ {}, else 0", crate::fmt::num(hi))
            }
            IsBound::Band { lo, hi } if hi.is_infinite() => {
                format!("{raw} where ≥ {}, else 0", crate::fmt::num(lo))
            }
            IsBound::Band { lo, hi } => format!(
                "{raw} inside [{}, {}], else 0",
                crate::fmt::num(lo),
                crate::fmt::num(hi)
            ),
        }
    }
}

impl IsBound {
    /// The weight of a raw weight `r` (`r · mask`, so 0 on padding).
    pub fn apply(&self, r: f64) -> f64 {
        match *self {
            IsBound::Cap { cap } => r.min(cap),
            IsBound::Band { lo, hi } => {
                if r >= lo && r <= hi {
                    r
                } else {
                    0.0
                }
            }
        }
    }
}

/// `raw · mask` at `level` (see the module notes), `[rows, width]`. Rows past the data
/// (short slices) are left 0.
pub fn raw_weights(
    level: IsLevel,
    old: &[f64],
    rollout: &[f64],
    mask: &[f64],
    rows: usize,
    width: usize,
) -> Vec<f64> {
    let n = (rows * width)
        .min(old.len())
        .min(rollout.len())
        .min(mask.len());
    let lr = |i: usize| old[i] - rollout[i];
    let mut out = vec![0.0; rows * width];
    match level {
        IsLevel::Token => {
            for (i, o) in out.iter_mut().enumerate().take(n) {
                *o = lr(i).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask[i];
            }
        }
        IsLevel::Sequence => {
            for row in 0..rows {
                let span = row * width..((row + 1) * width).min(n);
                // verl_F.masked_sum: (values * mask).sum(-1)
                let sum: f64 = span.clone().map(|i| lr(i) * mask[i]).sum();
                let w = sum.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();
                for i in span {
                    out[i] = w * mask[i];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: [f64; 6] = [-1.0, -0.5, -2.0, -0.3, -0.2, -0.1];
    const RO: [f64; 6] = [-2.0, -0.6, -1.0, -0.4, -0.2, 0.0];
    const MASK: [f64; 6] = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];

    #[test]
    fn token_tis_icepop_and_sequence_weights_follow_verls_formulas() {
        let e = f64::exp;
        // token TIS cap 2: exp(1) = 2.718 → 2; exp(0.1); exp(−1); exp(0.1); exp(0); pad 0
        let d = |i: usize| e(OLD[i] - RO[i]);
        let w = RolloutIs::token_cap(2.0).weights(&OLD, &RO, &MASK, 2, 3);
        assert_eq!(w, vec![2.0, d(1), e(-1.0), d(3), 1.0, 0.0]);
        // IcePop 0.5–2: exp(1) and exp(−1) outside, zeroed; the pad (raw 0) below lo
        let band = RolloutIs {
            level: IsLevel::Token,
            bound: IsBound::Band { lo: 0.5, hi: 2.0 },
            norm: 1.0,
        };
        assert_eq!(
            band.weights(&OLD, &RO, &MASK, 2, 3),
            vec![0.0, d(1), 0.0, d(3), 1.0, 0.0]
        );
        // sequence level, cap 5: row 0 sums 1 + 0.1 − 1 = 0.1; row 1 sums 0.1 + 0 (the
        // padded token's −0.1 is masked out of the sum)
        let seq = RolloutIs {
            level: IsLevel::Sequence,
            bound: IsBound::Cap { cap: 5.0 },
            norm: 1.0,
        };
        let s0 = e(1.0 + (-0.5 - -0.6) + -1.0);
        let s1 = e(-0.3 - -0.4);
        assert_eq!(
            seq.weights(&OLD, &RO, &MASK, 2, 3),
            vec![s0, s0, s0, s1, s1, 0.0]
        );
        // the safety clamp: a row sum of 30 gives exp(20), then the cap
        let big = RolloutIs {
            level: IsLevel::Sequence,
            bound: IsBound::Cap { cap: 1e12 },
            norm: 1.0,
        };
        assert_eq!(
            big.weights(&[15.0, 15.0], &[0.0, 0.0], &[1.0, 1.0], 1, 2),
            vec![e(20.0); 2]
        );
        assert_eq!(seq.words(), "sequence-level TIS cap 5");
        assert_eq!(band.words(), "token IcePop band 0.5–2");
        assert_eq!(band.formula(), "exp(old − rollout) inside [0.5, 2], else 0");
    }
}
