//! Per-row sums and the aggregations built from them: [`crate::kernels::aggregate::aggregate`]
//! and its backward, from the sums one row pass returns.

use super::scalar::{b2f, clamp, Float};
use crate::kernels::aggregate::AggMode;

/// Row sums: `trl` = Σ x·m, `verl` = Σ where(m≠0, x, 0)·m.
#[derive(Clone, Copy)]
pub(super) struct Pair<T> {
    pub(super) trl: T,
    pub(super) verl: T,
}

impl<T: Float> Pair<T> {
    pub(super) fn zero() -> Self {
        Pair {
            trl: T::zero(),
            verl: T::zero(),
        }
    }
}

/// One row's sums: everything the aggregations and the metrics need (`first`: TRL's
/// low/high/region clip indicators at the row's first token, GSPO's per-sequence value).
#[derive(Clone, Copy)]
pub(super) struct Row<T> {
    pub(super) cnt: T,
    pub(super) pt: Pair<T>,
    pub(super) k: Pair<T>,
    pub(super) e: Pair<T>,
    pub(super) low: T,
    pub(super) high: T,
    pub(super) region: T,
    pub(super) first: [T; 3],
    pub(super) frac: T,
    pub(super) lower: T,
    pub(super) ppo_kl: T,
    pub(super) approx: T,
    pub(super) avg: T,
    pub(super) clip: T,
}

impl<T: Float> Row<T> {
    pub(super) fn zero() -> Self {
        let z = T::zero();
        Row {
            cnt: z,
            pt: Pair::zero(),
            k: Pair::zero(),
            e: Pair::zero(),
            low: z,
            high: z,
            region: z,
            first: [z; 3],
            frac: z,
            lower: z,
            ppo_kl: z,
            approx: z,
            avg: z,
            clip: z,
        }
    }
}

/// [`crate::kernels::aggregate::aggregate`] from per-row sums.
pub(super) fn aggregate<T: Float>(
    rows: &[Row<T>],
    pick: impl Fn(&Row<T>) -> Pair<T>,
    mode: AggMode,
    t: usize,
) -> T {
    let b = rows.len();
    let sum = |f: &dyn Fn(&Row<T>) -> T| {
        let mut s = T::zero();
        for r in rows {
            s += f(r);
        }
        s
    };
    let one = T::one();
    match mode {
        AggMode::TokenMean => sum(&|r| pick(r).verl) / sum(&|r| r.cnt),
        AggMode::SeqMeanTokenMean
        | AggMode::SeqMeanTokenSum
        | AggMode::SeqMeanTokenSumNorm { .. } => {
            let mut num = T::zero();
            let mut den = T::zero();
            for r in rows {
                let mut seq = pick(r).verl;
                if mode == AggMode::SeqMeanTokenMean {
                    seq /= r.cnt * one + T::from_f64(1e-8);
                }
                let sm: T = b2f(r.cnt > T::zero());
                num += if sm != T::zero() { seq } else { T::zero() } * sm;
                den += sm;
            }
            let loss = num / den;
            match mode {
                AggMode::SeqMeanTokenSumNorm { horizon } => {
                    loss / T::from_f64(horizon.unwrap_or(t as f64))
                }
                _ => loss,
            }
        }
        AggMode::TrlGrpo => {
            let mut s = T::zero();
            for r in rows {
                s += pick(r).trl / clamp(r.cnt, Some(one), None);
            }
            s * T::from_f64(1.0 / b as f64) + T::zero()
        }
        AggMode::TrlBnpo => sum(&|r| pick(r).trl) / clamp(sum(&|r| r.cnt), Some(one), None),
        AggMode::TrlDrGrpo {
            max_completion_length,
        } => {
            let l = max_completion_length.unwrap_or(t as f64);
            sum(&|r| pick(r).trl) / T::from_f64(b as f64 * l)
        }
        AggMode::TrlDapo { num_items_in_batch } => {
            let n = match num_items_in_batch {
                Some(n) => n.max(1.0),
                None => sum(&|r| r.cnt).to_f64().max(1.0),
            };
            sum(&|r| pick(r).trl) / T::from_f64(n)
        }
    }
}

/// Backward of [`aggregate`]: for an upstream gradient `g` on the aggregate, what each
/// row's masked entries receive (then [`super::scalar::agg_entry`] per token), from the rows' mask
/// counts — candle's autograd of [`crate::kernels::aggregate::aggregate`] step by step.
pub(super) fn aggregate_grad<T: Float>(mode: AggMode, g: T, counts: &[T], t: usize) -> Vec<T> {
    let b = counts.len();
    let zero = T::zero();
    let one = T::one();
    let mut total = zero;
    for c in counts {
        total += *c;
    }
    let same = |w: T| vec![w; b];
    match mode {
        AggMode::TokenMean => same(g / total),
        AggMode::SeqMeanTokenMean
        | AggMode::SeqMeanTokenSum
        | AggMode::SeqMeanTokenSumNorm { .. } => {
            let g1 = match mode {
                AggMode::SeqMeanTokenSumNorm { horizon } => {
                    g / T::from_f64(horizon.unwrap_or(t as f64))
                }
                _ => g,
            };
            let mut den = zero;
            for c in counts {
                den += b2f(*c > zero);
            }
            let g2 = g1 / den;
            counts
                .iter()
                .map(|&c| {
                    let sm: T = b2f(c > zero);
                    let gs = if sm != zero { g2 * sm } else { zero };
                    if mode == AggMode::SeqMeanTokenMean {
                        gs / (c * one + T::from_f64(1e-8))
                    } else {
                        gs
                    }
                })
                .collect()
        }
        AggMode::TrlGrpo => {
            // mean_all = sum_all.affine(1/B, 0).
            let g1 = g * T::from_f64(1.0 / b as f64) + zero;
            counts
                .iter()
                .map(|&c| g1 / clamp(c, Some(one), None))
                .collect()
        }
        AggMode::TrlBnpo => same(g / clamp(total, Some(one), None)),
        AggMode::TrlDrGrpo {
            max_completion_length,
        } => {
            let l = max_completion_length.unwrap_or(t as f64);
            same(g / T::from_f64(b as f64 * l))
        }
        AggMode::TrlDapo { num_items_in_batch } => {
            let n = match num_items_in_batch {
                Some(n) => n.max(1.0),
                None => total.to_f64().max(1.0),
            };
            same(g / T::from_f64(n))
        }
    }
}

/// Σ x in 8 interleaved partial sums (vectorizable; the order of a masked count does not
/// matter, 0/1 masks sum exactly).
pub(super) fn lane_sum<T: Float>(x: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let mut s = T::zero();
    for v in acc.into_iter().chain(chunks.remainder().iter().copied()) {
        s += v;
    }
    s
}
