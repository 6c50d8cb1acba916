//! Per-token policy losses. Inputs `ratio`, `advantages` are `[B, T]` of one float dtype
//! (advantages already broadcast over the row); outputs are `[B, T]` unmasked per-token
//! losses (aggregate them with [`super::aggregate`]).

use candle_core::Tensor;

use super::{clamp_torch, full_like, same_shape, KResult, KernelError};

/// PPO clip parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClipParams {
    /// Lower clip `1 − eps_low`.
    pub eps_low: f64,
    /// Upper clip `1 + eps_high` (DAPO "clip-higher" uses a larger one).
    pub eps_high: f64,
    /// TRL `delta`: the unclipped ratio is additionally capped at `delta` (two-sided clip).
    pub delta: Option<f64>,
    /// verl dual clip `clip_ratio_c` (> 1): for negative advantages the loss is capped at
    /// `−A·c`.
    pub clip_ratio_c: Option<f64>,
}

/// PPO clipped surrogate per token:
/// `max(−A·r', −A·clip(r, 1−eps_low, 1+eps_high))` with `r' = min(r, delta)` when TRL's
/// `delta` is set (TRL computes the clipped term from the uncapped ratio), and, with
/// verl's dual clip, `where(A < 0, min(−A·c, that), that)`.
/// Matches TRL `_compute_loss` (`-min(coef_1*A, coef_2*A)`) and verl
/// `compute_policy_loss_vanilla` bit for bit in value and gradient (ties split like torch).
/// `ratio`, `advantages`: `[B, T]`. Returns `[B, T]`.
pub fn ppo_clip(ratio: &Tensor, advantages: &Tensor, p: &ClipParams) -> KResult<Tensor> {
    same_shape("ratio", ratio, "advantages", advantages)?;
    if let Some(c) = p.clip_ratio_c {
        if c <= 1.0 {
            return Err(KernelError::Invalid(format!(
                "clip_ratio_c must be > 1.0 for dual-clip PPO, got {c}"
            )));
        }
    }
    let clipped = clamp_torch(ratio, Some(1.0 - p.eps_low), Some(1.0 + p.eps_high))?;
    let r1 = match p.delta {
        Some(d) => clamp_torch(ratio, None, Some(d))?,
        None => ratio.clone(),
    };
    let neg_a = advantages.neg()?;
    let l1 = (&neg_a * &r1)?;
    let l2 = (&neg_a * &clipped)?;
    let clip1 = l1.maximum(&l2)?;
    match p.clip_ratio_c {
        None => Ok(clip1),
        Some(c) => {
            let l3 = neg_a.affine(c, 0.0)?;
            let clip2 = l3.minimum(&clip1)?;
            let neg = advantages.lt(0.0)?;
            Ok(neg.where_cond(&clip2, &clip1)?)
        }
    }
}

/// Importance-sampling policy gradient without clipping, `−r·A` per token (NexRL
/// `importance_sampling` loss; weaver's `elementwise_loss` before masking).
/// `ratio`, `advantages`: `[B, T]`. Returns `[B, T]`.
pub fn importance_sampling(ratio: &Tensor, advantages: &Tensor) -> KResult<Tensor> {
    same_shape("ratio", ratio, "advantages", advantages)?;
    Ok((advantages.neg()? * ratio)?)
}

/// Plain REINFORCE-style surrogate with the ratio fixed at 1 in value: `−A` per token,
/// shaped like `ratio`. Used when a preset has no old log-probs.
pub fn constant_advantage(ratio: &Tensor, advantages: &Tensor) -> KResult<Tensor> {
    same_shape("ratio", ratio, "advantages", advantages)?;
    Ok((advantages.neg()? * full_like(ratio, 1.0)?)?)
}

/// The dual clip constant `c` (verl `clip_ratio_c`) a dumped per-token loss shows, from
/// its valid tokens' `(ratio, advantage, loss)`: with `A < 0` PPO's clipped surrogate is
/// never below `−A·r`, so a token whose loss is was capped at `−A·c` (verl
/// `compute_policy_loss_vanilla`: `clip_pg_losses2 = -advantages * clip_ratio_c`). `c` is
/// those tokens' `loss / −A` when every one gives the same value to f32 and it is above
/// 1 (a per-token importance weight below 1 gives scattered values instead), rounded to
/// the four significant digits a config states when that is within f32 of it. `None`
/// when no token is capped. All in f64.
pub fn dual_clip_shown(tokens: impl IntoIterator<Item = (f64, f64, f64)>) -> Option<f64> {
    let (mut lo, mut hi, mut n) = (f64::INFINITY, f64::NEG_INFINITY, 0usize);
    for (r, a, l) in tokens {
        if a < -1e-12 && l.is_finite() && r.is_finite() && l < -a * r * (1.0 - 1e-5) {
            let c = l / -a;
            (lo, hi, n) = (lo.min(c), hi.max(c), n + 1);
        }
    }
    if n == 0 || lo <= 1.0 || hi - lo > 1e-5 * hi {
        return None;
    }
    let c = (lo + hi) / 2.0;
    let k = 10f64.powi(3 - c.log10().floor() as i32);
    let round = (c * k).round() / k;
    Some(if (round - c).abs() <= 1e-5 * c {
        round
    } else {
        c
    })
}

#[cfg(test)]
mod dual_tests {
    use super::dual_clip_shown;

    #[test]
    fn a_capped_token_gives_its_constant_and_weights_give_none() {
        // A = −0.866, r = 2.8: PPO's clip gives −A·r = 2.425; capped at c = 2.5: 2.165
        let capped = (2.8, -0.866, 0.866 * 2.5 * (1.0 + 3e-8));
        let plain = (1.1, -0.5, 0.55); // −A·r itself: not capped
        assert_eq!(dual_clip_shown([capped, plain]), Some(2.5));
        assert_eq!(dual_clip_shown([plain]), None);
        // two tokens below −A·r by different factors: per-token weights, not a cap
        let w1 = (1.5, -1.0, 1.5 * 0.9);
        let w2 = (1.6, -1.0, 1.6 * 0.8);
        assert_eq!(dual_clip_shown([w1, w2]), None);
        // a factor below 1: no dual clip (c ≥ 1 in verl, asserted > 1.0)
        assert_eq!(dual_clip_shown([(0.5, -1.0, 0.3)]), None);
    }
}
