//! The sliding-window median behind the spike detectors (grad-spike, kl-explosion,
//! slowdown): each value against the median of the finite values before it. A long series
//! is judged in parts on the rayon pool; a part starts from the window the values before
//! it leave, so the hits are those of one pass over the whole series, in series order.

use rayon::prelude::*;

use crate::frames::log::series::Series;

/// Points per part judged on one worker: a 2.5 M-step log is ~40 parts, so the last
/// detector of a scan (kl-explosion, often) no longer runs alone on one core.
const PART_POINTS: usize = 1 << 16;

/// A finite `f64` as a `u64` whose unsigned order is `f64::total_cmp`'s (and back): the
/// sliding window below compares integers, without branches.
#[inline]
fn order_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | (1 << 63)
    }
}

/// The inverse of [`order_key`].
#[inline]
fn from_order_key(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// Values ≥ `factor` × median of the previous `window` finite values (with at least
/// `min_history` of them) and above `floor`: `(series index, value, median)`.
///
/// The window is kept sorted as [`order_key`]s (`total_cmp` order): a value's place is
/// the count of smaller keys, a branch-free pass over at most `window` integers, so a long
/// series costs a few nanoseconds per point; parts of [`PART_POINTS`] run in parallel.
pub(crate) fn spikes(
    series: &Series,
    factor: f64,
    window: usize,
    min_history: usize,
    floor: f64,
) -> Vec<(usize, f64, f64)> {
    spikes_in_parts(series, factor, window, min_history, floor, PART_POINTS)
}

/// [`spikes`] judged in parts of `part` points (small in tests, to cut the series at
/// every place).
fn spikes_in_parts(
    series: &Series,
    factor: f64,
    window: usize,
    min_history: usize,
    floor: f64,
    part: usize,
) -> Vec<(usize, f64, f64)> {
    let part = part.max(1);
    let window = window.max(1);
    let n = series.len();
    if n <= part {
        return spikes_from(series, 0, n, &[], factor, window, min_history, floor);
    }
    let starts: Vec<usize> = (0..n).step_by(part).collect();
    // The last `window` finite values of each part (oldest first), read backwards from
    // its end: a part's window starts as the newest of those before it.
    let tails: Vec<Vec<u64>> = starts
        .par_iter()
        .map(|&a| {
            let b = (a + part).min(n);
            let mut t: Vec<u64> = (a..b)
                .rev()
                .filter_map(|i| series.get(i))
                .filter(|(_, v)| v.is_finite())
                .take(window)
                .map(|(_, v)| order_key(v))
                .collect();
            t.reverse();
            t
        })
        .collect();
    let inits: Vec<Vec<u64>> = (0..starts.len())
        .map(|p| {
            let mut newest_first: Vec<u64> = tails
                .get(..p)
                .unwrap_or_default()
                .iter()
                .rev()
                .flat_map(|t| t.iter().rev().copied())
                .take(window)
                .collect();
            newest_first.reverse();
            newest_first
        })
        .collect();
    let parts: Vec<Vec<(usize, f64, f64)>> = starts
        .par_iter()
        .zip(&inits)
        .map(|(&a, init)| {
            let b = (a + part).min(n);
            spikes_from(series, a, b, init, factor, window, min_history, floor)
        })
        .collect();
    parts.concat()
}

/// The hits of [`spikes`] among points `from..to` of `series`, the window starting as
/// `init` (the last `window` finite values before `from`, oldest first, as [`order_key`]s,
/// as a pass from the start leaves it).
#[allow(clippy::too_many_arguments)]
fn spikes_from(
    series: &Series,
    from: usize,
    to: usize,
    init: &[u64],
    factor: f64,
    window: usize,
    min_history: usize,
    floor: f64,
) -> Vec<(usize, f64, f64)> {
    let mut out = Vec::new();
    let window = window.max(1);
    // The window in arrival order, and the same values kept sorted for the median.
    let mut hist: std::collections::VecDeque<u64> = init.iter().copied().collect();
    let mut sorted: Vec<u64> = hist.iter().copied().collect();
    sorted.reserve((window + 1).saturating_sub(sorted.len()));
    sorted.sort_unstable();
    let pos = |sorted: &[u64], k: u64| sorted.iter().map(|&y| usize::from(y < k)).sum::<usize>();
    let need = min_history.max(1);
    for (i, (_, v)) in (from..).zip(series.range(from, to)) {
        if !v.is_finite() {
            continue;
        }
        if hist.len() >= need {
            let n = sorted.len();
            let m = if n % 2 == 1 {
                sorted.get(n / 2).map(|&k| from_order_key(k))
            } else {
                let below = (n / 2).checked_sub(1).and_then(|j| sorted.get(j));
                match (below, sorted.get(n / 2)) {
                    (Some(&a), Some(&b)) => Some((from_order_key(a) + from_order_key(b)) / 2.0),
                    _ => None,
                }
            };
            if let Some(m) = m {
                if v > factor * m && v > floor {
                    out.push((i, v, m));
                }
            }
        }
        let k = order_key(v);
        let leaving = if hist.len() >= window {
            hist.pop_front()
        } else {
            None
        };
        hist.push_back(k);
        match leaving {
            // The oldest value leaves as this one enters: one shift between their places
            // (the oldest is in the window, at the first place not below it).
            Some(old) => {
                let (r, p) = (pos(&sorted, old), pos(&sorted, k));
                debug_assert_eq!(sorted.get(r), Some(&old));
                if p <= r {
                    sorted.copy_within(p..r, p + 1);
                    sorted[p] = k;
                } else {
                    sorted.copy_within(r + 1..p, r);
                    sorted[p - 1] = k;
                }
            }
            None => sorted.insert(pos(&sorted, k), k),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::median;
    use crate::frames::log::column::{Column, Steps};

    #[test]
    fn order_keys_sort_like_total_cmp() {
        let xs: [f64; 8] = [-1e300, -1.0, -1e-300, -0.0, 0.0, 1e-300, 1.0, 1e300];
        for w in xs.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{} < {}", w[0], w[1]);
        }
        for x in xs {
            assert_eq!(from_order_key(order_key(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn spikes_match_the_median_of_each_window() {
        // Ties, signed zeros, NaN (skipped) and a window sliding over repeated values.
        let xs = [
            1.0,
            1.0,
            0.0,
            -0.0,
            2.0,
            30.0,
            1.0,
            f64::NAN,
            1.0,
            5.0,
            0.5,
            50.0,
            0.5,
            0.5,
            9.0,
            -0.0,
            0.0,
            100.0,
            3.0,
            3.0,
        ];
        let series = Series::owned(xs.iter().enumerate().map(|(i, v)| (i as i64, *v)).collect());
        for window in 1..6 {
            for min_history in 0..4 {
                // The obvious way: the median of a copy of the last `window` finite values.
                let mut want = Vec::new();
                let mut hist: Vec<f64> = Vec::new();
                for (i, &v) in xs.iter().enumerate() {
                    if !v.is_finite() {
                        continue;
                    }
                    if hist.len() >= min_history.max(1) {
                        let m = median(&hist).unwrap();
                        if v > 2.0 * m && v > 0.1 {
                            want.push((i, v.to_bits(), m.to_bits()));
                        }
                    }
                    hist.push(v);
                    if hist.len() > window {
                        hist.remove(0);
                    }
                }
                let got: Vec<_> = spikes(&series, 2.0, window, min_history, 0.1)
                    .into_iter()
                    .map(|(i, v, m)| (i, v.to_bits(), m.to_bits()))
                    .collect();
                assert_eq!(got, want, "window {window}, min_history {min_history}");
                // Judged in parts cut at every place: the same hits, in the same order.
                for part in 1..=xs.len() + 1 {
                    let got: Vec<_> = spikes_in_parts(&series, 2.0, window, min_history, 0.1, part)
                        .into_iter()
                        .map(|(i, v, m)| (i, v.to_bits(), m.to_bits()))
                        .collect();
                    assert_eq!(
                        got, want,
                        "window {window}, min_history {min_history}, part {part}"
                    );
                }
                // Never judged when the window cannot hold `min_history` values.
                assert_eq!(want.is_empty(), min_history > window);
            }
        }
    }

    #[test]
    fn a_long_series_in_parallel_parts_gives_the_hits_of_one_pass() {
        // 300,000 points (several parts): noise with ties, NaN stretches longer than the
        // window across part boundaries, and spikes.
        let mut x: u64 = 7;
        let points: Vec<(i64, f64)> = (0..300_000i64)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = (x >> 40) % 1000;
                let v = if (65_530..65_600).contains(&i) || r == 0 {
                    f64::NAN
                } else if r < 3 {
                    50.0
                } else {
                    (r % 17) as f64 / 16.0
                };
                (i, v)
            })
            .collect();
        let series = Series::owned(points.clone());
        let one_pass = spikes_from(&series, 0, series.len(), &[], 3.0, 20, 5, 0.1);
        assert!(one_pass.len() > 100, "{}", one_pass.len());
        let bits = |h: Vec<(usize, f64, f64)>| -> Vec<(usize, u64, u64)> {
            h.into_iter()
                .map(|(i, v, m)| (i, v.to_bits(), m.to_bits()))
                .collect()
        };
        assert_eq!(bits(spikes(&series, 3.0, 20, 5, 0.1)), bits(one_pass));
        // Read in place from a column with holes (every 11th row missing, a stretch of
        // missing rows across a part's edge): the hits of the copied points, in parts of
        // every size.
        let cells: Vec<Option<f64>> = points
            .iter()
            .map(|&(i, v)| (i % 11 != 5 && !(131_000..131_300).contains(&i)).then_some(v))
            .collect();
        let col = Column::from_cells(cells.iter().copied());
        let steps: Steps = (0..cells.len() as i64).collect();
        let view = Series::cells(&col, &steps);
        let copied = Series::owned(view.to_vec());
        let want = bits(spikes_from(&copied, 0, copied.len(), &[], 3.0, 20, 5, 0.1));
        for part in [1 << 16, 4096, 1000, 37] {
            assert_eq!(
                bits(spikes_in_parts(&view, 3.0, 20, 5, 0.1, part)),
                want,
                "part {part}"
            );
        }
    }
}
