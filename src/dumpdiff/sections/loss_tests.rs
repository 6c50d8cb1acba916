//! The loss scalars' allowances over a chain's valid elements, laid out in rows as the
//! chain lays them out: against the element-by-element rules, bit for bit.

use super::tests::noise;
use super::*;
use crate::compare::propagate::ChainElem;

/// `elems` laid out as a chain lays out its rows: row `r`'s `counts[r]` elements from
/// position 5 of rows of `width`, one run each (its |A| its first element's), with `flat`
/// (one value per element) at the same offsets of a vector of that layout; every other
/// position holds values that would show if read.
fn in_rows(
    elems: &[ChainElem],
    counts: &[usize],
    width: usize,
    flat: &[f64],
) -> (ChainStats, Vec<f64>) {
    let size = counts.len() * width;
    let (mut ratio, mut allowed, mut laid) = (vec![3.0; size], vec![0.5; size], vec![0.125; size]);
    let mut runs = Vec::new();
    let mut k = 0;
    for (r, &c) in counts.iter().enumerate() {
        let start = r * width + 5;
        for i in 0..c {
            ratio[start + i] = elems[k + i].ratio;
            allowed[start + i] = elems[k + i].ratio_allowed;
            laid[start + i] = flat[k + i];
        }
        if c > 0 {
            let abs_advantage = elems[k].abs_advantage;
            runs.push(propagate::ElemRun {
                start,
                len: c,
                abs_advantage,
            });
        }
        k += c;
    }
    let stats = ChainStats::new(
        std::sync::Arc::new(ratio),
        std::sync::Arc::new(allowed),
        runs,
    );
    (stats, laid)
}

#[test]
fn pg_prediction_summed_as_computed_is_the_reduction_of_its_vectors() {
    // A chain of 600 valid elements over rows of uneven lengths (one empty), with unknown
    // signed differences and advantages here and there, ratios on both sides of the clip
    // range and elements predicted or not: the token-mean prediction summed as its terms
    // are computed equals `reduce_rows` over the three vectors, bit for bit; the other
    // modes take the vectors either way.
    let n = 600;
    let u = noise(0x5eed, 5 * n);
    let elems: Vec<ChainElem> = (0..n)
        .map(|i| ChainElem {
            ratio: 0.6 + 0.8 * u[i],
            ratio_allowed: 0.04 * u[n + i],
            abs_advantage: Some(2.0 * u[2 * n + i]),
        })
        .collect();
    let delta: Vec<f64> = (0..n)
        .map(|i| match i % 13 {
            0 => f64::NAN,
            _ => (u[3 * n + i] - 0.5) * 1e-2,
        })
        .collect();
    // One advantage per row (the fourth unknown).
    let pred_advantage = vec![4.0 * u[4 * n] - 2.0, 0.7, -1.3, f64::NAN, 1.9];
    let row_counts = vec![123, 0, 200, 177, 100];
    let (stats, delta) = in_rows(&elems, &row_counts, 256, &delta);
    let mut ch = Chain::of_stats(stats);
    ch.extra = ElemExtra {
        delta,
        pred_advantage,
        row_counts,
        ..ElemExtra::default()
    };
    let modes = [
        AggMode::TokenMean,
        AggMode::SeqMeanTokenMean,
        AggMode::SeqMeanTokenSum,
    ];
    for mode in modes {
        ch.agg = mode;
        let memo = StatsMemo::new(Some(&ch), None);
        let fast = memo.pg_predicted_with(true).unwrap().bits();
        let general = memo.pg_predicted_with(false).unwrap().bits();
        assert_eq!(fast, general, "{mode:?}");
        // Not vacuous: some elements predicted, some not, every sum non-zero.
        assert!(fast.3 > n / 4 && fast.3 < n, "{fast:?}");
        assert!(fast.0 != 0 && fast.1 != 0 && fast.2 != 0, "{fast:?}");
    }
    // An element neither predicted nor with a known |A|: no prediction, either way.
    ch.agg = AggMode::TokenMean;
    let mut elems = elems;
    elems[0].abs_advantage = None;
    ch.stats = Some(ChainStats::from_elems(&elems));
    let memo = StatsMemo::new(Some(&ch), None);
    assert!(memo.pg_predicted_with(true).is_none());
    assert!(memo.pg_predicted_with(false).is_none());
}

#[test]
fn loss_allowances_by_blocks_equal_the_element_rules() {
    // Over more than two blocks of elements, with unknown values here and there: the
    // pg terms and approx_kl's sum, whose libm calls are taken a block at a time, equal
    // the element-by-element rules (`exp_m1`, `ln`, `ln_1p` on each element), bit for bit.
    let n = 2 * LIBM_BLOCK + 77;
    let u = noise(0xb10c, 5 * n);
    // One advantage per row, rows across the blocks' edges (one longer than a block,
    // one empty, one unknown): each element takes its row's.
    let row_counts = vec![600, 0, 450, 1, 50];
    assert_eq!(row_counts.iter().sum::<usize>(), n);
    let row_of: Vec<usize> = (0..row_counts.len())
        .flat_map(|r| std::iter::repeat_n(r, row_counts[r]))
        .collect();
    let mut elems: Vec<ChainElem> = (0..n)
        .map(|i| ChainElem {
            ratio: 0.5 + u[i],
            ratio_allowed: 1e-6 + 0.03 * u[n + i],
            abs_advantage: Some(2.0 * u[2 * n + row_of[i]]),
        })
        .collect();
    let delta: Vec<f64> = (0..n)
        .map(|i| match i % 11 {
            0 => f64::NAN,
            1 => f64::INFINITY,
            _ => (u[3 * n + i] - 0.5) * 2e-2,
        })
        .collect();
    let per_row = vec![1.2, 0.5, f64::NAN, -1.7, 4.0 * u[4 * n] - 2.0];
    let adv: Vec<f64> = row_counts
        .iter()
        .zip(&per_row)
        .flat_map(|(&c, &a)| std::iter::repeat_n(a, c))
        .collect();
    let (stats, laid) = in_rows(&elems, &row_counts, 700, &delta);
    let x = ElemExtra {
        delta: laid,
        pred_advantage: per_row,
        row_counts: row_counts.clone(),
        ..ElemExtra::default()
    };
    let (lo, hi) = (0.2, 0.28);
    let mut got = Vec::new();
    let count = pg_terms(&stats, &x, lo, hi, |s, r, g| {
        got.push([s, r, g].map(f64::to_bits))
    });
    let mut want = Vec::new();
    let mut want_count = 0;
    for ((e, &d), &a) in elems.iter().zip(&delta).zip(&adv) {
        let inside = e.ratio - e.ratio_allowed > 1.0 - lo && e.ratio + e.ratio_allowed < 1.0 + hi;
        let magnitude = if a.is_finite() {
            a.abs() * e.ratio
        } else {
            0.0
        };
        let terms = if d.is_finite() && a.is_finite() && inside {
            want_count += 1;
            [a * e.ratio * (-d).exp_m1(), 0.0, magnitude]
        } else {
            let worst = propagate::product_allowed(e.ratio_allowed, e.abs_advantage.unwrap());
            [0.0, worst, magnitude]
        };
        want.push(terms.map(f64::to_bits));
    }
    assert_eq!(count, Some(want_count));
    assert_eq!(got, want);
    // Not vacuous: predicted and unpredicted elements in every block.
    assert!(want_count > n / 5 && want_count < n / 2, "{want_count}");

    let element_rules = |elems: &[ChainElem]| -> Option<f64> {
        elems
            .iter()
            .map(|e| {
                let el = (e.ratio_allowed / e.ratio).ln_1p();
                let el = (el.is_finite() && e.ratio > 0.0).then_some(el)?;
                Some(e.ratio.ln().abs() * el + 0.5 * el * el)
            })
            .sum()
    };
    let sum = approx_kl_sum(&stats);
    assert_eq!(
        sum.map(f64::to_bits),
        element_rules(&elems).map(f64::to_bits)
    );
    assert!(sum.is_some_and(|s| s > 0.0));
    // An unknown allowance in the last block (a zero ratio): None, both ways.
    elems[n - 3].ratio = 0.0;
    assert_eq!(
        approx_kl_sum(&in_rows(&elems, &row_counts, 700, &delta).0),
        None
    );
    assert_eq!(element_rules(&elems), None);
}
