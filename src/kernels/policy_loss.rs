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
/// each row's valid tokens `(ratio, advantage, loss)`: with `A < 0` PPO's clipped
/// surrogate is never below `−A·r`, so a token whose loss is below it was capped at
/// `−A·c` (verl `compute_policy_loss_vanilla`: `clip_pg_losses2 = -advantages *
/// clip_ratio_c`). A row may carry one sequence-level importance weight `w` on every
/// token ([`row_weight`]; verl's sequence TIS, seed 7642): a capped token then shows
/// `loss = −A·c·w`. `c` is the capped tokens' `loss / (−A·w)` when every one gives the
/// same value within 10⁻⁵ and it is above 1 and below the token's own ratio (scattered
/// values are per-token weights, not a cap), rounded to the four significant digits a
/// config states when that is within 10⁻⁵ of it. `None` when no token is capped or they
/// disagree. All in f64. Both tools read it here: losscheck's policy search
/// (`judge::picture::dual_shown`) and dumpdiff's clip bounds (`clip_fraction::dual_read`).
pub fn dual_clip_shown<R>(rows: impl IntoIterator<Item = R>) -> Option<f64>
where
    R: IntoIterator<Item = (f64, f64, f64)>,
{
    let (mut lo, mut hi, mut n) = (f64::INFINITY, f64::NEG_INFINITY, 0usize);
    for row in rows {
        let tokens: Vec<(f64, f64, f64)> = row.into_iter().collect();
        let w = row_weight(&tokens);
        for &(r, a, l) in &tokens {
            if a >= -1e-12 || !(l.is_finite() && r.is_finite()) || r <= 1.0 {
                continue;
            }
            let c = l / (-a * w);
            if c > 1.0 && c < r * (1.0 - 1e-5) {
                (lo, hi, n) = (lo.min(c), hi.max(c), n + 1);
            }
        }
    }
    if n == 0 || hi - lo > 1e-5 * hi {
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

/// The weight a row's per-token loss carries when more of its tokens share one factor
/// `loss / (−A·r)` (within 10⁻⁵, at least two) than any other cluster apart from it (the
/// clipped ones each have their own): a sequence-level importance weight; else 1 (no
/// weights, or per-token ones). `tokens`: `(ratio, advantage, loss)`.
pub fn row_weight(tokens: &[(f64, f64, f64)]) -> f64 {
    let mut q: Vec<f64> = tokens
        .iter()
        .filter(|(r, a, _)| a.abs() > 1e-6 && *r > 0.0)
        .map(|(r, a, l)| l / (-a * r))
        .filter(|q| q.is_finite() && *q > 0.0)
        .collect();
    q.sort_by(f64::total_cmp);
    let clusters: Vec<(usize, f64)> = (0..q.len())
        .map(|i| {
            let k = q[i..]
                .iter()
                .take_while(|x| (*x - q[i]) <= 1e-5 * q[i])
                .count();
            (k, q[i])
        })
        .collect();
    let Some(&(k, w)) = clusters.iter().max_by_key(|x| x.0) else {
        return 1.0;
    };
    let apart = |x: &&(usize, f64)| (x.1 - w).abs() > 1e-5 * w;
    let unique = clusters.iter().filter(apart).all(|x| x.0 < k);
    if k >= 2 && unique {
        w
    } else {
        1.0
    }
}

#[cfg(test)]
mod dual_tests {
    use super::dual_clip_shown;

    #[test]
    fn a_capped_token_gives_its_constant_and_weights_give_none() {
        // A = −0.866, r = 2.8: PPO's clip gives −A·r = 2.425; capped at c = 2.5: 2.165
        let capped = (2.8, -0.866, 0.866 * 2.5 * (1.0 + 3e-8));
        let plain = (1.1, -0.5, 0.55); // −A·r itself: not capped
        assert_eq!(dual_clip_shown([vec![capped, plain]]), Some(2.5));
        assert_eq!(dual_clip_shown([[plain]]), None);
        // two tokens below −A·r by different factors in two rows: per-token weights
        let w1 = (1.5, -1.0, 1.5 * 0.9);
        let w2 = (1.6, -1.0, 1.6 * 0.8);
        assert_eq!(dual_clip_shown([[w1], [w2]]), None);
        // a factor below 1: no dual clip (c ≥ 1 in verl, asserted > 1.0)
        assert_eq!(dual_clip_shown([[(0.5, -1.0, 0.3)]]), None);
        // capped in two rows at 3, one row under a sequence weight 0.8 on every token
        let row = |w: f64| {
            vec![
                (1.1, -0.5, 0.55 * w),
                (0.9, 0.4, -0.36 * w),
                (4.0, -1.0, 3.0 * w),
            ]
        };
        assert_eq!(dual_clip_shown([row(1.0), row(0.8)]), Some(3.0));
        assert!((super::row_weight(&row(0.8)) - 0.8).abs() < 1e-12);
        assert!((super::row_weight(&row(1.0)) - 1.0).abs() < 1e-12);
    }
}
