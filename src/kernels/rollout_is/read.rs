//! Reading a rollout-correction scheme off a side's own dumped values (issue 28): the
//! factor `dumped / ours` of each valid token (its dumped per-token loss over the one
//! recomputed without weights) against verl's raw weights (see [`super`], verl 0.9.1
//! `rollout_corr_helper.py` `compute_rollout_correction_weights`):
//! - TIS cap `C`: `factor = raw` where `raw ≤ C`, `= C` above (the cap is read off the
//!   saturated tokens and bounded below by the unsaturated ones);
//! - IcePop band `[lo, hi]`: `factor = raw` inside, `0` outside (the band is bracketed by
//!   the kept and the zeroed tokens).
//!
//! Each cell gives, per level and bound kind, the interval of thresholds its tokens allow
//! (none when a token fits neither branch); the proposal is the intersection over the
//! cells that fit, its value the simplest number inside. Proposals are candidates only:
//! the caller verifies each on every cell. All values f64; slices row-major `[rows, width]`.

use super::{raw_weights, IsBound, IsLevel, RolloutIs};

/// What one cell's tokens allow of one scheme: the thresholds' intervals.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Allowed {
    /// TIS cap in `[.0, .1]` (`.1` infinite when no token saturates), and the number of
    /// saturated tokens.
    cap: Option<(f64, f64, usize)>,
    /// IcePop `lo` in `(.0, .1]`, `hi` in `[.2, .3)`, and the number of zeroed tokens.
    band: Option<(f64, f64, f64, f64, usize)>,
}

/// What the tokens allow at `level` (`raw` = index 2 or 3 of each token).
fn allowed(toks: &[IsToken], level: IsLevel, rel: f64) -> Allowed {
    let raw_of = |t: &IsToken| match level {
        IsLevel::Token => t.2,
        IsLevel::Sequence => t.3,
    };
    // TIS: every token keeps its raw weight or is saturated at one common factor below it
    let mut cap = Some((0.0f64, f64::INFINITY, 0usize));
    // IcePop: every token keeps its raw weight or is zeroed
    let (mut kmin, mut kmax) = (f64::INFINITY, 0.0f64);
    let mut zeroed = Vec::new();
    let mut band_ok = true;
    for t in toks {
        let (d, o, raw) = (t.0, t.1, raw_of(t));
        // a sequence weight carries its row's summed rounding of the dumped log-probs
        let rel = match level {
            IsLevel::Token => rel,
            IsLevel::Sequence => rel + t.4,
        };
        let fits =
            |d: f64, o: f64, w: f64| (d - w * o).abs() <= rel * d.abs().max((w * o).abs()) + 1e-12;
        if fits(d, o, raw) {
            if let Some(c) = cap.as_mut() {
                c.0 = c.0.max(raw * (1.0 - rel));
            }
            kmin = kmin.min(raw);
            kmax = kmax.max(raw);
            continue;
        }
        if d == 0.0 || d.abs() <= 1e-12 * o.abs() {
            zeroed.push(raw);
            cap = None;
            continue;
        }
        band_ok = false;
        let f = d / o;
        match cap.as_mut() {
            Some(c) if f < raw * (1.0 + rel) && f > 0.0 => {
                c.0 = c.0.max(f * (1.0 - rel));
                c.1 = c.1.min(f * (1.0 + rel));
                c.2 += 1;
            }
            _ => cap = None,
        }
    }
    let cap = cap.filter(|c| c.0 <= c.1);
    // a cell whose tokens all keep their raw weight fits any band holding them (0 zeroed)
    let band = if band_ok && zeroed.is_empty() {
        (kmin <= kmax).then_some((0.0, kmin, kmax, f64::INFINITY, 0))
    } else if band_ok {
        let below = zeroed
            .iter()
            .filter(|r| **r < kmin)
            .fold(0.0f64, |a, b| a.max(*b));
        let above = zeroed
            .iter()
            .filter(|r| **r > kmax)
            .fold(f64::INFINITY, |a, b| a.min(*b));
        let inside = zeroed.iter().any(|r| *r >= kmin && *r <= kmax);
        (!inside).then_some((below, kmin.min(f64::MAX), kmax, above, zeroed.len()))
    } else {
        None
    };
    Allowed { cap, band }
}

/// The threshold in `[a, b]` a config most likely holds: the first of the 1–2–5 series
/// (…, 0.5, 1, 2, 5, 10, …) inside, else the simplest decimal ([`simplest_decimal`]).
pub(super) fn simplest(a: f64, b: f64) -> f64 {
    if a > 0.0 && b.is_finite() {
        let e = a.log10().floor() as i32;
        for k in e..=e + 1 {
            for m in [1.0, 2.0, 5.0] {
                let c = format!("{}e{k}", m).parse::<f64>().unwrap_or(f64::NAN);
                if c >= a && c <= b {
                    return c;
                }
            }
        }
    }
    simplest_decimal(a, b)
}

/// The simplest decimal (fewest significant digits) in `[a, b]` (`a ≤ b`, `b` may be
/// infinite: then the simplest at or above `a`).
fn simplest_decimal(a: f64, b: f64) -> f64 {
    if a.is_nan() || a <= 0.0 {
        return if b >= 1.0 { 1.0 } else { b };
    }
    let top = if b.is_finite() { b } else { a };
    let e = top.log10().floor();
    for digits in 0..15 {
        let step = 10f64.powf(e - digits as f64);
        let c = (a / step).ceil() * step;
        // round the candidate's representation to its digits
        let c = format!("{:.*e}", digits, c).parse::<f64>().unwrap_or(c);
        if c >= a && c <= b {
            return c;
        }
    }
    a
}

/// A token's evidence: `(dumped, ours, raw_token, raw_sequence, sequence_slack)` — its
/// dumped per-token loss, the loss recomputed without weights, its raw weight at each
/// level ([`super::raw_weights`]), and the relative error of the sequence weight that the
/// rounding of the row's dumped log-probs allows (`Σ_row u·(|old| + |rollout|)`, `u` their
/// unit roundoff: a bf16 dump of weights computed in f32 moves `exp(Σ(old − rollout))` by
/// a few per cent over a row).
pub type IsToken = (f64, f64, f64, f64, f64);

/// The valid tokens of a cell with a recomputed loss clear of 0, as [`IsToken`]s, from
/// row-major `[rows, width]` slices of equal length (`None` otherwise); `u`: the unit
/// roundoff of the dumped log-probs (0 when they are what the weights were computed from).
#[allow(clippy::too_many_arguments)]
pub fn tokens_of(
    dumped: &[f64],
    ours: &[f64],
    old: &[f64],
    rollout: &[f64],
    mask: &[f64],
    rows: usize,
    width: usize,
    u: f64,
) -> Option<Vec<IsToken>> {
    let n = rows * width;
    if [
        dumped.len(),
        ours.len(),
        old.len(),
        rollout.len(),
        mask.len(),
    ]
    .iter()
    .any(|l| *l != n)
    {
        return None;
    }
    let tok = raw_weights(IsLevel::Token, old, rollout, mask, rows, width);
    let seq = raw_weights(IsLevel::Sequence, old, rollout, mask, rows, width);
    let scale = ours.iter().fold(0.0f64, |a, b| a.max(b.abs()));
    let slack: Vec<f64> = (0..rows)
        .map(|r| {
            (r * width..(r + 1) * width)
                .filter(|&i| mask[i] != 0.0)
                .map(|i| u * (old[i].abs() + rollout[i].abs()))
                .sum()
        })
        .collect();
    Some(
        (0..n)
            .filter(|&i| mask[i] != 0.0 && ours[i].abs() > 1e-6 * scale.max(1e-12))
            .map(|i| (dumped[i], ours[i], tok[i], seq[i], slack[i / width.max(1)]))
            .collect(),
    )
}

/// The schemes the cells' tokens allow (`cells`: each cell's tokens and the relative
/// tolerance of its factors), best supported first, each with the evidence in words and
/// the number of cells that fit it: for each level, TIS with the intersection of the caps
/// its fitting cells allow, and IcePop with the intersection of their bands (each only
/// when at least one cell fits and the intersection is not empty).
pub fn read_off(cells: &[(Vec<IsToken>, f64)]) -> Vec<(RolloutIs, String, usize)> {
    let mut out: Vec<(RolloutIs, String, usize)> = Vec::new();
    for level in [IsLevel::Token, IsLevel::Sequence] {
        read_level(cells, level, 1.0, &mut out);
        // verl's rollout_is_batch_normalize: every kept weight divided by one batch mean,
        // read as the factor the cells' unsaturated tokens share (their median), the
        // dumped values multiplied back by it; tried once the divisor is clear of one
        // token's rounding (the cluster's median is steadier than any token's: a mean of
        // 1.045 under bf16 log-probs is read, a proposal the policy search then judges)
        let norms: Vec<f64> = cells
            .iter()
            .filter_map(|(t, rel)| shared_factor(t, level, *rel))
            .collect();
        let rel = cells.iter().map(|c| c.1).fold(0.0f64, f64::max);
        if let Some(k) = median(&norms).filter(|k| (k - 1.0).abs() > rel) {
            let scaled: Vec<(Vec<IsToken>, f64)> = cells
                .iter()
                .map(|(t, rel)| {
                    let t = t.iter().map(|x| (x.0 * k, x.1, x.2, x.3, x.4)).collect();
                    (t, *rel)
                })
                .collect();
            read_level(&scaled, level, k, &mut out);
        }
    }
    out.sort_by_key(|x| std::cmp::Reverse(x.2));
    out
}

/// The median of `v` (`None` when empty).
fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// The divisor a cell's weights at `level` share when batch-normalised: each kept
/// token's factor over its raw weight, `q = dumped / (ours · raw)`, is `1/K` unsaturated
/// (a capped token's is smaller, a zeroed one's 0): `K = 1 / median` of the factors
/// within the tolerance of the largest. `None` when no token is kept.
fn shared_factor(toks: &[IsToken], level: IsLevel, rel: f64) -> Option<f64> {
    let q: Vec<(f64, f64)> = toks
        .iter()
        .filter_map(|t| {
            let (raw, slack) = match level {
                IsLevel::Token => (t.2, 0.0),
                IsLevel::Sequence => (t.3, t.4),
            };
            let q = t.0 / (t.1 * raw);
            (t.0 != 0.0 && raw > 0.0 && q.is_finite() && q > 0.0).then_some((q, rel + slack))
        })
        .collect();
    let top = q.iter().map(|x| x.0).fold(0.0f64, f64::max);
    let cluster: Vec<f64> = q
        .iter()
        .filter(|x| x.0 >= top * (1.0 - 3.0 * x.1))
        .map(|x| x.0)
        .collect();
    median(&cluster).map(|m| 1.0 / m)
}

/// [`read_off`] at one level, the weights divided by `norm` (1: not normalised; the
/// tokens' dumped values already multiplied back by it).
fn read_level(
    cells: &[(Vec<IsToken>, f64)],
    level: IsLevel,
    norm: f64,
    out: &mut Vec<(RolloutIs, String, usize)>,
) {
    {
        let fits: Vec<Allowed> = cells
            .iter()
            .map(|(t, rel)| allowed(t, level, *rel))
            .collect();
        // TIS
        let caps: Vec<_> = fits.iter().filter_map(|a| a.cap).collect();
        if !caps.is_empty() {
            let lo = caps.iter().fold(0.0f64, |a, c| a.max(c.0));
            let hi = caps.iter().fold(f64::INFINITY, |a, c| a.min(c.1));
            let sat: usize = caps.iter().map(|c| c.2).sum();
            if lo <= hi {
                // no token saturates: no cap reached (infinite: the raw weights); the
                // caller may try verl's default beside it
                let cap = if sat > 0 {
                    simplest(lo.max(f64::MIN_POSITIVE), hi)
                } else {
                    f64::INFINITY
                };
                let why = if sat > 0 {
                    format!(
                        "the cap read off {sat} saturated tokens, the other tokens keep {}",
                        raw_words(level)
                    )
                } else {
                    format!(
                        "no token reaches its cap: any cap ≥ {} explains them{}",
                        crate::fmt::num(lo),
                        if cap.is_finite() {
                            ", verl's default 2 taken"
                        } else {
                            ""
                        }
                    )
                };
                let is = RolloutIs {
                    level,
                    bound: IsBound::Cap { cap },
                    norm,
                };
                push(out, is, why + &norm_why(norm), caps.len());
            }
        }
        // IcePop
        let bands: Vec<_> = fits.iter().filter_map(|a| a.band).collect();
        if !bands.is_empty() {
            let lo_a = bands.iter().fold(0.0f64, |a, b| a.max(b.0));
            let lo_b = bands.iter().fold(f64::INFINITY, |a, b| a.min(b.1));
            let hi_a = bands.iter().fold(0.0f64, |a, b| a.max(b.2));
            let hi_b = bands.iter().fold(f64::INFINITY, |a, b| a.min(b.3));
            let zeroed: usize = bands.iter().map(|b| b.4).sum();
            if zeroed > 0 && lo_a < lo_b && hi_a < hi_b {
                // open ends: lo above the highest zeroed-below raw, hi below the
                // lowest zeroed-above
                // a bound no zeroed token shows is not read: 0 / infinite (no token
                // beyond it)
                let lo = if lo_a > 0.0 {
                    simplest(lo_a * (1.0 + 1e-9), lo_b)
                } else {
                    0.0
                };
                let hi = if hi_b.is_finite() {
                    simplest(hi_a, hi_b * (1.0 - 1e-9))
                } else {
                    f64::INFINITY
                };
                let is = RolloutIs {
                    level,
                    bound: IsBound::Band { lo, hi },
                    norm,
                };
                let why = format!(
                    "{zeroed} tokens zeroed, the others keep {}: lo in ({}, {}], hi in [{}, {})",
                    raw_words(level),
                    crate::fmt::num(lo_a),
                    crate::fmt::num(lo_b),
                    crate::fmt::num(hi_a),
                    crate::fmt::num(hi_b)
                );
                push(out, is, why + &norm_why(norm), bands.len());
            }
        }
    }
}

/// The evidence of a normalisation in words (empty for none).
fn norm_why(norm: f64) -> String {
    if norm == 1.0 {
        String::new()
    } else {
        format!(
            "; every kept weight divided by {} (verl's rollout_is_batch_normalize: the \
             weights' batch mean)",
            crate::fmt::num(norm)
        )
    }
}

fn raw_words(level: IsLevel) -> &'static str {
    match level {
        IsLevel::Token => "exp(old − rollout)",
        IsLevel::Sequence => "their row's exp(Σ(old − rollout))",
    }
}

/// `is` into `out` with its evidence, or the evidence of more cells when it is there.
pub fn push(out: &mut Vec<(RolloutIs, String, usize)>, is: RolloutIs, why: String, n: usize) {
    match out.iter_mut().find(|x| x.0 == is) {
        Some(x) if x.2 < n => {
            x.1 = why;
            x.2 = n;
        }
        Some(_) => {}
        None => out.push((is, why, n)),
    }
}

/// What the factors `dumped / ours` of a cell's valid tokens (row-major `[rows, width]`,
/// `mask` non-zero = valid) look like, when the weights themselves cannot be computed
/// (no rollout log-probs dumped): one factor per row (verl's sequence-level weights),
/// tokens zeroed (an IcePop band), a largest factor several tokens or rows share (a
/// cap). `None` when nothing is telling.
pub fn unseen_shape(
    dumped: &[f64],
    ours: &[f64],
    mask: &[f64],
    rows: usize,
    width: usize,
) -> Option<String> {
    let rel = 1e-4;
    let same = |a: f64, b: f64| (a - b).abs() <= rel * a.abs().max(b.abs());
    let mut per_row: Vec<Vec<f64>> = vec![Vec::new(); rows];
    let mut zeroed = 0usize;
    for (row, factors) in per_row.iter_mut().enumerate() {
        for p in 0..width {
            let i = row * width + p;
            if i >= dumped.len() || i >= ours.len() || i >= mask.len() || mask[i] == 0.0 {
                continue;
            }
            if ours[i].abs() <= 1e-12 {
                continue;
            }
            let f = dumped[i] / ours[i];
            if f == 0.0 {
                zeroed += 1;
            }
            factors.push(f);
        }
    }
    let rows_seen: Vec<&Vec<f64>> = per_row.iter().filter(|r| !r.is_empty()).collect();
    let sequence = rows_seen.iter().filter(|r| r.len() > 1).count() > 0
        && rows_seen.iter().all(|r| r.iter().all(|f| same(*f, r[0])));
    let all: Vec<f64> = per_row.iter().flatten().copied().collect();
    let top = all.iter().copied().fold(0.0f64, f64::max);
    let at_top = if sequence {
        rows_seen.iter().filter(|r| same(r[0], top)).count()
    } else {
        all.iter().filter(|f| same(**f, top)).count()
    };
    let mut words = Vec::new();
    if sequence {
        words.push(format!("one factor per row on {} rows", rows_seen.len()));
    }
    if zeroed > 0 {
        words.push(format!("{zeroed} tokens zeroed"));
    }
    if at_top >= 2 && zeroed == 0 && top > 1.0 {
        words.push(format!(
            "{at_top} {} share the largest factor {}",
            if sequence { "rows" } else { "tokens" },
            crate::fmt::num(top)
        ));
    }
    if words.is_empty() {
        return None;
    }
    let level = if sequence { "sequence-level" } else { "token" };
    let guess = if zeroed > 0 {
        format!("{level} IcePop band?")
    } else if at_top >= 2 && top > 1.0 {
        format!(
            "{level} TIS cap {}?",
            crate::fmt::num(simplest(top * (1.0 - rel), top * (1.0 + rel)))
        )
    } else {
        format!("{level} weights?")
    };
    Some(format!("{}: {guess}", words.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unseen_weights_are_described_by_their_shape() {
        let ours = [1.0, 2.0, -1.0, 4.0, 1.0, 1.0];
        let mask = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
        // one factor per row, two rows at 10: sequence-level TIS cap 10
        let d: Vec<f64> = [10.0, 10.0, 10.0, 10.0, 10.0, 3.0]
            .iter()
            .zip(&ours)
            .map(|(f, o)| f * o)
            .collect();
        assert_eq!(
            unseen_shape(&d, &ours, &mask, 2, 3).unwrap(),
            "one factor per row on 2 rows, 2 rows share the largest factor 10: sequence-level TIS cap 10?"
        );
        // tokens zeroed, factors varying: a token IcePop band
        let d = [0.0, 2.0 * 1.2, -0.8, 0.0, 1.1, 0.0];
        assert_eq!(
            unseen_shape(&d, &ours, &mask, 2, 3).unwrap(),
            "2 tokens zeroed: token IcePop band?"
        );
        // factors varying, none shared, none zero: nothing telling
        let d = [1.1, 2.0 * 1.2, -0.8, 4.0 * 0.9, 1.3, 0.0];
        assert_eq!(unseen_shape(&d, &ours, &mask, 2, 3), None);
    }

    #[test]
    fn the_simplest_number_in_an_interval_is_the_one_with_fewest_digits() {
        assert_eq!(simplest(4.9996, 5.0004), 5.0);
        assert_eq!(simplest(1.83, f64::INFINITY), 2.0);
        assert_eq!(simplest(0.43, 0.52), 0.5);
        assert_eq!(simplest(1.9, 2.3), 2.0);
        assert_eq!(simplest(1.4999, 1.5001), 1.5);
        assert_eq!(simplest(0.2, 0.2), 0.2);
        assert_eq!(simplest(7.0, 12.0), 10.0);
        // the 1–2–5 series before other one-digit numbers: [3.126, 6.2) holds 5, not 4
        assert_eq!(simplest(3.126, 6.2), 5.0);
        assert_eq!(simplest(2.6, 2.9), 2.6);
    }

    fn toks(level: IsLevel, list: &[(f64, f64)]) -> Vec<IsToken> {
        // (factor applied, raw): ours = −1 on every token
        list.iter()
            .map(|&(f, raw)| {
                let (t, s) = match level {
                    IsLevel::Token => (raw, 1.0),
                    IsLevel::Sequence => (1.0, raw),
                };
                (-f, -1.0, t, s, 0.0)
            })
            .collect()
    }

    #[test]
    fn a_cap_is_read_off_saturated_tokens_and_a_band_off_zeroed_ones() {
        // cap 5: raw 7 and 9 saturate at 5, raw 0.8 and 3 kept
        let t = toks(
            IsLevel::Token,
            &[(5.0, 7.0), (5.0, 9.0), (0.8, 0.8), (3.0, 3.0)],
        );
        let a = allowed(&t, IsLevel::Token, 1e-4);
        let (lo, hi, n) = a.cap.unwrap();
        assert_eq!(n, 2);
        assert!(lo <= 5.0 && hi >= 5.0 && hi - lo < 1e-3, "{lo} {hi}");
        assert_eq!(a.band, None);
        // a factor above its raw weight: no cap gives it
        let t = toks(IsLevel::Token, &[(5.0, 4.0), (0.8, 0.8)]);
        assert_eq!(allowed(&t, IsLevel::Token, 1e-4).cap, None);
        // band 0.5–2: raw 0.3 and 2.5 zeroed, 0.6 and 1.9 kept
        let t = toks(
            IsLevel::Sequence,
            &[(0.0, 0.3), (0.0, 2.5), (0.6, 0.6), (1.9, 1.9)],
        );
        let a = allowed(&t, IsLevel::Sequence, 1e-4);
        assert_eq!(a.cap, None);
        assert_eq!(a.band, Some((0.3, 0.6, 1.9, 2.5, 2)));
        // the token level sees raw 1 everywhere there: nothing fits
        let a = allowed(&t, IsLevel::Token, 1e-4);
        assert_eq!((a.cap, a.band), (None, None));
        // a zeroed token inside the kept range is no band
        let t = toks(IsLevel::Token, &[(0.0, 1.0), (0.6, 0.6), (1.9, 1.9)]);
        assert_eq!(allowed(&t, IsLevel::Token, 1e-4).band, None);
    }

    #[test]
    fn batch_normalised_weights_are_read_as_one_shared_divisor() {
        // token TIS cap 2, every weight divided by 1.25: raw 3 and 4 saturate at 2/1.25,
        // raw 0.8 and 1.5 keep raw/1.25
        let k = 1.25;
        let t = toks(
            IsLevel::Token,
            &[
                (2.0 / k, 3.0),
                (2.0 / k, 4.0),
                (0.8 / k, 0.8),
                (1.5 / k, 1.5),
            ],
        );
        let got = read_off(&[(t, 1e-4)]);
        let norm = got
            .iter()
            .find(|x| x.0.norm != 1.0)
            .expect("a normalised reading");
        assert_eq!(norm.0.level, IsLevel::Token);
        assert_eq!(norm.0.bound, IsBound::Cap { cap: 2.0 });
        assert!((norm.0.norm - k).abs() < 1e-9, "{}", norm.0.norm);
        assert!(norm.1.contains("rollout_is_batch_normalize"), "{}", norm.1);
        assert_eq!(
            norm.0.words(),
            "token TIS cap 2, batch-normalised (÷ 1.25, the weights' batch mean)"
        );
        assert_eq!(norm.0.formula(), "(min(exp(old − rollout), 2)) / 1.25");
        // the weights of the reading are the dumped factors
        let w = norm
            .0
            .weights(&[0.0, 0.0], &[-1.5f64.ln(), -3f64.ln()], &[1.0, 1.0], 1, 2);
        assert!((w[0] - 1.5 / k).abs() < 1e-12 && (w[1] - 2.0 / k).abs() < 1e-12);
        // unnormalised weights give no normalised reading
        let t = toks(IsLevel::Token, &[(2.0, 3.0), (0.8, 0.8), (1.5, 1.5)]);
        assert!(read_off(&[(t, 1e-4)]).iter().all(|x| x.0.norm == 1.0));
    }

    #[test]
    fn a_sequence_weight_is_allowed_its_rows_rounding() {
        // raw sequence weights recomputed from bf16-dumped log-probs, 3 % off the ones
        // applied: kept only with the row's rounding slack
        let mut t = toks(IsLevel::Sequence, &[(2.06, 2.0), (0.97, 1.0), (10.0, 20.0)]);
        assert_eq!(allowed(&t, IsLevel::Sequence, 8e-3).cap, None);
        for x in &mut t {
            x.4 = 0.04;
        }
        let (lo, hi, n) = allowed(&t, IsLevel::Sequence, 8e-3).cap.unwrap();
        assert_eq!(n, 1);
        assert!(lo <= 10.0 && hi >= 10.0, "{lo} {hi}");
        // the slack is the row's Σ u·(|old| + |rollout|)
        let (old, ro, mask) = (
            [-1.0, -2.0, -0.5, 0.0],
            [-1.5, -1.0, -0.5, 0.0],
            [1.0, 1.0, 1.0, 0.0],
        );
        let ours = [-1.0, -1.0, -1.0, -1.0];
        let got = tokens_of(&ours, &ours, &old, &ro, &mask, 2, 2, 0.5).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].4, got[1].4, got[2].4), (2.75, 2.75, 0.5));
    }
}
