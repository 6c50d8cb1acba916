//! verl's rejection sampling, read off a loss mask: which tokens a side's loss mask
//! (`effective_valid`) drops from its response mask, and whether verl 0.9.1
//! `verl/trainer/ppo/rollout_corr_helper.py` `compute_rollout_rejection_mask` explains
//! them. There, with `lr = clamp(old_log_prob − rollout_log_prob, ±20)` per token:
//! - the divergences `k1 = −lr`, `k2 = lr²/2`, `k3 = exp(lr) − 1 − lr`;
//! - an option (`SUPPORTED_ROLLOUT_RS_OPTIONS`) is a divergence at a level: `token_k*`
//!   per token, `seq_sum_k*` / `seq_mean_k*` the row's masked sum / mean, `seq_max_k2|3`
//!   the row's max (a row-level option keeps or rejects whole rows);
//! - a `k1` option keeps a unit inside `[log lower, log upper]` (`rollout_rs_threshold`
//!   `"lower_upper"`, or `"upper"` with `lower = 1/upper`), the others below `upper`;
//! - several comma-separated options: a unit is kept only when every option keeps it;
//! - `modified_response_mask = response_mask * keep`, which the trainer writes back into
//!   the batch (`compute_rollout_correction_and_add_to_batch`): the loss (pg and entropy
//!   alike) is aggregated over the reduced mask, which the weaver dumps as its
//!   `effective_valid`.
//!
//! Reading: every kept unit bounds the threshold from the inside, a rejected one lies
//! outside; an option explains the drops beyond its kept units' range; one option, else a
//! pair, explaining the most drops is kept. Slices row-major `[rows, width]`, masks
//! non-zero = valid.

use super::read::simplest;
use super::SAFETY_BOUND;

/// The level of a verl `rollout_rs` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RsLevel {
    /// `token_k*`: per token.
    Token,
    /// `seq_sum_k*`: the row's masked sum.
    SeqSum,
    /// `seq_mean_k*`: the row's masked mean.
    SeqMean,
    /// `seq_max_k*`: the row's max.
    SeqMax,
}

/// One verl `rollout_rs` option: a level and a divergence (`k` 1, 2 or 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RsOption {
    /// Token or row level.
    pub level: RsLevel,
    /// The divergence estimator, 1–3.
    pub k: u8,
}

impl RsOption {
    /// verl's 11 options (`SUPPORTED_ROLLOUT_RS_OPTIONS`).
    pub fn all() -> Vec<RsOption> {
        let mut out = Vec::new();
        for level in [
            RsLevel::Token,
            RsLevel::SeqSum,
            RsLevel::SeqMean,
            RsLevel::SeqMax,
        ] {
            for k in 1..=3u8 {
                if !(level == RsLevel::SeqMax && k == 1) {
                    out.push(RsOption { level, k });
                }
            }
        }
        out
    }

    /// verl's name (`seq_sum_k3`).
    pub fn name(&self) -> String {
        let level = match self.level {
            RsLevel::Token => "token",
            RsLevel::SeqSum => "seq_sum",
            RsLevel::SeqMean => "seq_mean",
            RsLevel::SeqMax => "seq_max",
        };
        format!("{level}_k{}", self.k)
    }

    /// The divergence of one clamped log-ratio.
    fn div(&self, lr: f64) -> f64 {
        match self.k {
            1 => -lr,
            2 => 0.5 * lr * lr,
            _ => lr.exp() - 1.0 - lr,
        }
    }
}

/// How one option accounts for the drops: its threshold read and the dropped tokens it
/// explains.
#[derive(Debug, Clone, PartialEq)]
pub struct RsReading {
    /// The option.
    pub option: RsOption,
    /// verl's `rollout_rs_threshold` for it, as read (`"0.5_2"` for a `k1` band, `"0.3"`).
    pub threshold: String,
    /// Dropped tokens it explains, and their rows.
    pub dropped: (usize, usize),
}

/// What explains the tokens a loss mask drops from its response mask.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// One option, or two (a comma-separated `rollout_rs`), explaining drops.
    pub options: Vec<RsReading>,
    /// Dropped tokens no option explains (a mask that differs for another reason).
    pub unexplained: usize,
}

impl Rejection {
    /// The finding in words: the option(s) and threshold(s) read, what they drop, and any
    /// drop left unexplained.
    pub fn words(&self) -> String {
        let names: Vec<String> = self.options.iter().map(|o| o.option.name()).collect();
        let ths: Vec<&str> = self.options.iter().map(|o| o.threshold.as_str()).collect();
        let drops: Vec<String> = self
            .options
            .iter()
            .map(|o| format!("{} tokens in {} rows", o.dropped.0, o.dropped.1))
            .collect();
        let mut s = format!(
            "verl's rejection sampling (rollout_rs=\"{}\", rollout_rs_threshold ≈ \"{}\", \
             from the side's own old and rollout log-probs) rejects {} from the loss mask",
            names.join(","),
            ths.join(","),
            drops.join(" and ")
        );
        if self.unexplained > 0 {
            s += &format!(
                "; {} dropped tokens no rejection explains: the mask differs",
                self.unexplained
            );
        }
        s
    }
}

/// What explains the valid tokens of `full` that `kept` drops, read from the side's own
/// `old` and `rollout` log-probs (see the module notes); `None` when nothing is dropped,
/// shapes differ, or no option explains any drop.
pub fn explain(
    full: &[f64],
    kept: &[f64],
    old: &[f64],
    rollout: &[f64],
    rows: usize,
    width: usize,
) -> Option<Rejection> {
    let n = rows * width;
    if [full.len(), kept.len(), old.len(), rollout.len()]
        .iter()
        .any(|l| *l != n)
    {
        return None;
    }
    let valid = |i: usize| full[i] != 0.0;
    let dropped = |i: usize| full[i] != 0.0 && kept[i] == 0.0;
    let drops: Vec<usize> = (0..n).filter(|&i| dropped(i)).collect();
    if drops.is_empty() {
        return None;
    }
    let lr: Vec<f64> = (0..n)
        .map(|i| (old[i] - rollout[i]).clamp(-SAFETY_BOUND, SAFETY_BOUND))
        .collect();
    let span = |r: usize| r * width..(r + 1) * width;
    let whole = |r: usize| span(r).any(valid) && span(r).filter(|&i| valid(i)).all(dropped);
    let readings: Vec<(RsReading, Vec<usize>)> = RsOption::all()
        .into_iter()
        .filter_map(|o| read_option(o, &lr, &valid, &dropped, &whole, rows, width))
        .collect();
    // one option explaining the most, else the pair explaining the most (a single one
    // on a tie); the list order (verl's) breaks ties
    let unexplained = |sets: &[&Vec<usize>]| {
        drops
            .iter()
            .filter(|i| !sets.iter().any(|s| s.contains(i)))
            .count()
    };
    let mut best: Option<(usize, Vec<usize>)> = None;
    for (a, (_, sa)) in readings.iter().enumerate() {
        let u = unexplained(&[sa]);
        if best.as_ref().is_none_or(|b| u < b.0) {
            best = Some((u, vec![a]));
        }
    }
    for (a, (_, sa)) in readings.iter().enumerate() {
        for (b, (_, sb)) in readings.iter().enumerate().skip(a + 1) {
            let u = unexplained(&[sa, sb]);
            if best.as_ref().is_none_or(|x| u < x.0)
                && u < unexplained(&[sa]).min(unexplained(&[sb]))
            {
                best = Some((u, vec![a, b]));
            }
        }
    }
    let (u, picked) = best?;
    Some(Rejection {
        options: picked.into_iter().map(|k| readings[k].0.clone()).collect(),
        unexplained: u,
    })
}

/// One option's reading: the threshold its kept units allow and the dropped tokens beyond
/// it; `None` when it explains no drop.
fn read_option(
    o: RsOption,
    lr: &[f64],
    valid: &dyn Fn(usize) -> bool,
    dropped: &dyn Fn(usize) -> bool,
    whole: &dyn Fn(usize) -> bool,
    rows: usize,
    width: usize,
) -> Option<(RsReading, Vec<usize>)> {
    // (statistic, its tokens, kept?) per unit
    let mut units: Vec<(f64, Vec<usize>, bool)> = Vec::new();
    for r in 0..rows {
        let toks: Vec<usize> = (r * width..(r + 1) * width).filter(|&i| valid(i)).collect();
        if toks.is_empty() {
            continue;
        }
        match o.level {
            RsLevel::Token => {
                for &i in &toks {
                    units.push((o.div(lr[i]), vec![i], !dropped(i)));
                }
            }
            _ => {
                let d: Vec<f64> = toks.iter().map(|&i| o.div(lr[i])).collect();
                let stat = match o.level {
                    RsLevel::SeqSum => d.iter().sum(),
                    RsLevel::SeqMean => d.iter().sum::<f64>() / d.len() as f64,
                    _ => d.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                };
                let keep = toks.iter().all(|&i| !dropped(i));
                // a row partly dropped is no row-level rejection: its drops stay unexplained
                if keep || whole(r) {
                    units.push((stat, toks, keep));
                }
            }
        }
    }
    let (mut kmin, mut kmax) = (f64::INFINITY, f64::NEG_INFINITY);
    for u in units.iter().filter(|u| u.2) {
        kmin = kmin.min(u.0);
        kmax = kmax.max(u.0);
    }
    if !kmax.is_finite() {
        return None;
    }
    let (mut below, mut above) = (f64::NEG_INFINITY, f64::INFINITY);
    let mut explained = Vec::new();
    let mut rows_hit = 0;
    for u in units.iter().filter(|u| !u.2) {
        let out_high = u.0 > kmax;
        let out_low = o.k == 1 && u.0 < kmin;
        if out_high {
            above = above.min(u.0);
        } else if out_low {
            below = below.max(u.0);
        } else {
            continue;
        }
        explained.extend(u.1.iter().copied());
    }
    if explained.is_empty() {
        return None;
    }
    let mut seen_rows: Vec<usize> = explained.iter().map(|i| i / width).collect();
    seen_rows.dedup();
    rows_hit += seen_rows.len();
    let threshold = if o.k == 1 {
        // the band on k1 = rollout − old, in verl's ratio terms: lower_upper
        let upper = if above.is_finite() {
            simplest(kmax.exp(), above.exp() * (1.0 - 1e-9))
        } else {
            f64::INFINITY
        };
        let lower = if below.is_finite() {
            simplest(below.exp() * (1.0 + 1e-9), kmin.exp())
        } else {
            0.0
        };
        match (lower > 0.0, upper.is_finite()) {
            // the default lower 1/upper, when the kept units allow it
            (false, true) if 1.0 / upper <= kmin.exp() => crate::fmt::num(upper),
            (true, false) if 1.0 / lower >= kmax.exp() => crate::fmt::num(1.0 / lower),
            _ => format!("{}_{}", crate::fmt::num(lower), crate::fmt::num(upper)),
        }
    } else {
        crate::fmt::num(simplest(kmax.max(f64::MIN_POSITIVE), above * (1.0 - 1e-9)))
    };
    Some((
        RsReading {
            option: o,
            threshold,
            dropped: (explained.len(), rows_hit),
        },
        explained,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_and_row_rejection_are_read_off_the_dropped_tokens() {
        // two rows of three; lr = old − rollout = 1, 0.05, −0.05 | 0, 0.1 | pad
        let full = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
        let old = [-1.0, -1.0, -1.0, -1.0, -1.0, 0.0];
        let ro = [-2.0, -1.05, -0.95, -1.0, -1.1, 0.0];
        // the lr-1 token dropped: token_k1 (k1 = −1 below every kept one), verl's "2"
        // (band [0.5, 2]: 0.5 inside (e^−1, e^−0.1])
        let kept = [0.0, 1.0, 1.0, 1.0, 1.0, 0.0];
        let got = explain(&full, &kept, &old, &ro, 2, 3).unwrap();
        assert_eq!(got.unexplained, 0);
        assert_eq!(got.options.len(), 1);
        assert_eq!(got.options[0].option.name(), "token_k1");
        assert_eq!(got.options[0].threshold, "2");
        assert_eq!(got.options[0].dropped, (1, 1));
        assert_eq!(
            got.words(),
            "verl's rejection sampling (rollout_rs=\"token_k1\", rollout_rs_threshold ≈ \"2\", \
             from the side's own old and rollout log-probs) rejects 1 tokens in 1 rows from the \
             loss mask"
        );
        // row 0 dropped whole: its sum of k1 (−1) below row 1's (−0.1): seq_sum_k1, where
        // token_k1 leaves the 0.05 token inside the kept range
        let kept = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        let got = explain(&full, &kept, &old, &ro, 2, 3).unwrap();
        assert_eq!(got.unexplained, 0);
        assert_eq!(got.options[0].option.name(), "seq_sum_k1");
        assert_eq!(got.options[0].dropped, (3, 1));
        // a row partly dropped at a token inside every range: unexplained
        let ro2 = [-2.0, -1.05, -1.0, -1.0, -1.1, 0.0];
        let kept = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0];
        let got = explain(&full, &kept, &old, &ro2, 2, 3).unwrap();
        assert_eq!(got.unexplained, 1);
        assert!(got
            .words()
            .ends_with("1 dropped tokens no rejection explains: the mask differs"));
        // nothing dropped
        assert_eq!(explain(&full, &full, &old, &ro, 2, 3), None);
        assert_eq!(RsOption::all().len(), 11);
    }
}
