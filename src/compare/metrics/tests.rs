//! The accumulator against hand-computed values and against its element-by-element path;
//! ULP distances and grid detection.

use super::*;

fn tol(atol: f64, rtol: f64) -> Tolerance {
    Tolerance::new(atol, rtol, "test")
}

fn loc(row: usize, pos: usize) -> ElemLoc {
    ElemLoc {
        row,
        other_row: row,
        pos,
    }
}

#[test]
fn metrics_match_hand_computation() {
    let a = [1.0, 2.0, 3.0, 4.0];
    let b = [1.0, 2.5, 3.0, 3.0];
    let mut acc = Accumulator::new(tol(0.1, 0.0), None, false);
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        acc.push(x, y, loc(i / 2, i % 2));
    }
    let m = acc.finish();
    assert_eq!(m.count, 4);
    let max = m.max_abs.unwrap();
    assert_eq!(
        (max.loc.row, max.loc.pos, max.a, max.b, max.abs_diff),
        (1, 1, 4.0, 3.0, 1.0)
    );
    assert_eq!(m.mean_abs, 1.5 / 4.0);
    assert_eq!(m.max_rel, 0.25);
    assert_eq!(m.rmse, (1.25f64 / 4.0).sqrt());
    // cosine: a·b = 1 + 5 + 9 + 12 = 27; |a|² = 30; |b|² = 1 + 6.25 + 9 + 9 = 25.25
    assert_eq!(m.cosine.unwrap(), 27.0 / (30.0f64 * 25.25).sqrt());
    assert_eq!(m.beyond, 2);
    assert_eq!(m.beyond_fraction, 0.5);
    let first = m.first_beyond.unwrap();
    assert_eq!((first.loc.row, first.loc.pos), (0, 1));
    assert!(m.max_ulp.is_none() && m.logprob.is_none());
}

#[test]
fn pearson_of_affine_pair_is_one() {
    let mut acc = Accumulator::new(tol(1e9, 0.0), None, false);
    for i in 0..10 {
        acc.push(i as f64, 2.0 * i as f64 + 1.0, loc(0, i));
    }
    let p = acc.finish().pearson.unwrap();
    assert!((p - 1.0).abs() < 1e-12, "{p}");
}

#[test]
fn nan_on_one_side_is_beyond_and_counted() {
    let mut acc = Accumulator::new(tol(1.0, 1.0), Some(DType::F32), false);
    acc.push(f64::NAN, 1.0, loc(0, 0));
    acc.push(f64::NAN, f64::NAN, loc(0, 1));
    acc.push(f64::INFINITY, f64::INFINITY, loc(0, 2));
    let m = acc.finish();
    assert_eq!(
        (m.nan_a, m.nan_b, m.inf_a, m.inf_b, m.beyond),
        (2, 1, 1, 1, 1)
    );
    assert_eq!(m.max_abs.unwrap().abs_diff, f64::INFINITY);
    assert_eq!(m.max_ulp, Some(u64::MAX));
}

#[test]
fn logprob_measures() {
    let mut acc = Accumulator::new(tol(1.0, 0.0), None, true);
    acc.push(-1.0, -1.5, loc(0, 0));
    acc.push(-2.0, -2.0, loc(0, 1));
    let lp = acc.finish().logprob.unwrap();
    assert_eq!(lp.mean_k1, 0.25);
    let d: f64 = -0.5;
    assert_eq!(lp.mean_k3, (d.exp() - d - 1.0) / 2.0);
    let pd = ((-1.0f64).exp() - (-1.5f64).exp()).abs();
    assert_eq!(lp.max_prob_diff, pd);
    assert_eq!(lp.mean_prob_diff, pd / 2.0);
}

#[test]
fn ulp_distances_per_dtype() {
    let one = 1.0f64;
    let next_f32 = f32::from_bits(1.0f32.to_bits() + 3) as f64;
    assert_eq!(ulp_distance(one, next_f32, DType::F32), 3);
    let next_bf16 = half::bf16::from_bits(half::bf16::ONE.to_bits() + 2).to_f64();
    assert_eq!(ulp_distance(next_bf16, one, DType::BF16), 2);
    // across zero: the smallest negative and positive subnormals are 2 apart
    let tiny = f32::from_bits(1) as f64;
    assert_eq!(ulp_distance(-tiny, tiny, DType::F32), 2);
    assert_eq!(ulp_distance(0.0, -0.0, DType::F64), 0);
}

#[test]
fn effective_dtype_sees_bf16_inside_f32() {
    let bf = [half::bf16::from_f64(-2.3).to_f64(), 0.0, 1.0];
    assert_eq!(effective_dtype(DType::F32, &bf), DType::BF16);
    let f32s = [(-2.3f32) as f64, 0.1f32 as f64];
    assert_eq!(effective_dtype(DType::F32, &f32s), DType::F32);
    assert_eq!(effective_dtype(DType::F64, &f32s), DType::F32);
    assert_eq!(effective_dtype(DType::F64, &[0.1]), DType::F64);
    assert_eq!(effective_dtype(DType::I64, &[1.0]), DType::I64);
}

#[test]
fn bf16_grid_test_matches_a_round_trip() {
    let probe = [
        0.0,
        -0.0,
        1.0,
        -2.3,
        1e-40,
        -1e-42,
        3.0e38,
        1e39,
        0.1,
        65504.0,
        1.0e-5,
        f32::MIN_POSITIVE as f64,
        f32::MAX as f64,
    ];
    for &x in &probe {
        for v in [x, half::bf16::from_f64(x).to_f64(), (x as f32) as f64] {
            let want = if half::bf16::from_f64(v).to_f64() == v {
                DType::BF16
            } else {
                DType::F32
            };
            let got = effective_dtype(DType::F32, &[v]);
            let got = if got == DType::F16 { DType::F32 } else { got };
            assert_eq!(got, want, "{v:e}");
        }
    }
}

/// A small deterministic generator (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 31) as f64
    }

    /// A value from the palette runs are made of: ordinary numbers on the f32 and
    /// bf16 grids, signed zeros, non-finite values, huge and ≥ 700 log-probs.
    fn value(&mut self) -> f64 {
        match self.below(20) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => -0.0,
            4 => 0.0,
            5 => 1.0,
            6 => 1.0e308,
            7 => 700.5,
            8 => half::bf16::from_f64(-5.0 * self.unit()).to_f64(),
            _ => (-10.0 * self.unit()) as f32 as f64,
        }
    }
}

/// One run of pairs: identical, 0/1 identical, close, or anything.
fn run(g: &mut Lcg, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mode = g.below(5);
    let mut a = Vec::with_capacity(n);
    let mut b = Vec::with_capacity(n);
    for _ in 0..n {
        let x = match mode {
            0 => g.below(2) as f64,
            1 | 2 => (-10.0 * g.unit()) as f32 as f64,
            _ => g.value(),
        };
        let y = match mode {
            0 | 1 => x,
            2 => x + 1e-4 * (g.unit() - 0.5),
            _ if g.below(3) == 0 => x,
            _ => g.value(),
        };
        a.push(x);
        b.push(y);
    }
    (a, b)
}

#[test]
fn push_run_equals_push_allowing_element_by_element() {
    let mut g = Lcg(7);
    let tols = [(1e-5, 1.6e-2), (0.0, 0.0), (1e-3, 0.0), (-1e-3, 1e-3)];
    let ulps = [
        None,
        Some(DType::F32),
        Some(DType::BF16),
        Some(DType::F16),
        Some(DType::F64),
    ];
    for case in 0..400 {
        let (atol, rtol) = tols[case % tols.len()];
        let ulp = ulps[(case / tols.len()) % ulps.len()];
        let logprob = case % 3 == 0;
        let with_extra = case % 4 == 1;
        let t = Tolerance::new(atol, rtol, "test");
        let mut one = Accumulator::new(t.clone(), ulp, logprob);
        let mut runs = Accumulator::new(t, ulp, logprob);
        for r in 0..1 + g.below(6) as usize {
            let n = g.below(40) as usize;
            let (a, b) = run(&mut g, n);
            let extra: Vec<f64> = (0..n)
                .map(|_| match g.below(10) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => -1e-3,
                    _ => 1e-3 * g.unit(),
                })
                .collect();
            // Ascending positions, with gaps or consecutive.
            let gaps = g.below(2) == 0;
            let start = g.below(5) as usize;
            let pos: Vec<usize> = (0..n)
                .map(|i| start + if gaps { 3 * i } else { i })
                .collect();
            let (row, other_row) = (g.below(4) as usize, r);
            for i in 0..n {
                let e = if with_extra { extra[i] } else { 0.0 };
                let loc = ElemLoc {
                    row,
                    other_row,
                    pos: pos[i],
                };
                one.push_allowing(a[i], b[i], e, loc);
            }
            let ex = with_extra.then_some(&extra[..]);
            let at = if gaps {
                Positions::At(&pos)
            } else {
                Positions::From(start)
            };
            runs.push_run(&a, &b, ex, at, row, other_row);
        }
        // Every internal sum and extreme, then the metrics.
        assert_eq!(format!("{one:?}"), format!("{runs:?}"), "case {case}");
        let (x, y) = (one.finish(), runs.finish());
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "case {case}");
    }
}

#[test]
fn long_runs_of_masks_and_identical_values_equal_the_element_path() {
    // Identical 0/1 runs take the counting path, other identical runs only feed the
    // reference sums; both must leave every sum as the element-by-element path does.
    let mut g = Lcg(11);
    for case in 0..40 {
        let t = Tolerance::new(0.0, 0.0, "test");
        let mut one = Accumulator::new(t.clone(), None, case % 2 == 0);
        let mut runs = Accumulator::new(t, None, case % 2 == 0);
        for r in 0..6 {
            let n = 5000 + g.below(3000) as usize;
            let ones = g.below(2) == 0;
            let a: Vec<f64> = (0..n)
                .map(|_| {
                    if ones {
                        g.below(2) as f64
                    } else {
                        (-3.0 * g.unit()) as f32 as f64
                    }
                })
                .collect();
            let mut b = a.clone();
            if g.below(4) == 0 {
                let i = g.below(n as u64) as usize;
                b[i] += 0.5;
            }
            for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
                one.push(
                    x,
                    y,
                    ElemLoc {
                        row: r,
                        other_row: r,
                        pos: i,
                    },
                );
            }
            runs.push_run(&a, &b, None, Positions::From(0), r, r);
        }
        // Every internal sum and extreme, then the metrics.
        assert_eq!(format!("{one:?}"), format!("{runs:?}"), "case {case}");
        let (x, y) = (one.finish(), runs.finish());
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "case {case}");
    }
}

#[test]
fn ones_are_counted_only_onto_whole_sums() {
    // Near 2^53 (or after a fraction) adding 1.0 one at a time rounds: counting at once
    // would not.
    let two53 = (1u64 << 53) as f64;
    for first in [1.0 / 3.0, 1.0e-17, two53 - 10.0, two53 + 2.0] {
        let t = Tolerance::new(0.0, 0.0, "test");
        let mut one = Accumulator::new(t.clone(), None, false);
        let mut runs = Accumulator::new(t, None, false);
        let ones = vec![1.0; 1000];
        let loc = |pos| ElemLoc {
            row: 0,
            other_row: 0,
            pos,
        };
        one.push(first, first, loc(0));
        for (i, &x) in ones.iter().enumerate() {
            one.push(x, x, loc(i + 1));
        }
        runs.push_run(&[first], &[first], None, Positions::From(0), 0, 0);
        runs.push_run(&ones, &ones, None, Positions::From(1), 0, 0);
        // Then a differing pair, so that the sums show in cosine and Pearson.
        let (p, q) = (-3.0 * first - 7.5, 2.0 * first + 0.25);
        one.push(p, q, loc(2000));
        runs.push_run(&[p], &[q], None, Positions::From(2000), 0, 0);
        assert_eq!(format!("{one:?}"), format!("{runs:?}"), "{first}");
        let (x, y) = (one.finish(), runs.finish());
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "{first}");
    }
}

#[test]
fn grid_scan_in_pieces_equals_effective_dtype() {
    let mut g = Lcg(3);
    for case in 0..200 {
        let declared = [DType::F64, DType::F32, DType::BF16, DType::I64][case % 4];
        let n = 1 + g.below(50) as usize;
        let kind = g.below(4);
        let v: Vec<f64> = (0..n)
            .map(|_| match (kind, g.below(8)) {
                (_, 0) => f64::NAN,
                (0, _) => half::bf16::from_f64(g.unit()).to_f64(),
                (1, _) => half::f16::from_f64(g.unit()).to_f64(),
                (2, _) => g.unit() as f32 as f64,
                _ => g.unit(),
            })
            .collect();
        let cut = g.below(n as u64) as usize;
        let mut scan = GridScan::new(declared);
        scan.feed(&v[..cut]);
        scan.feed(&v[cut..]);
        if scan.needs_f16() {
            scan.feed_f16(&v[..cut]);
            scan.feed_f16(&v[cut..]);
        }
        assert_eq!(scan.finish(), effective_dtype(declared, &v), "case {case}");
    }
}

/// A symmetric tolerance is honoured by the run path too (the lane folds scale by the
/// reference side, so such runs take the element path): |1 − 1.105| = 0.105 is beyond
/// 0.1·|1| but within 0.1·max(1, 1.105) = 0.1105.
#[test]
fn push_run_honours_a_symmetric_tolerance() {
    let (a, b) = ([1.0, 1.0, 2.0], [1.105, 1.105, 2.0]);
    let beyond = |t: Tolerance| {
        let mut acc = Accumulator::new(t, None, false);
        acc.push_run(&a, &b, None, Positions::From(0), 0, 0);
        let m = acc.finish();
        (m.beyond, m.first_beyond.map(|d| d.loc.pos))
    };
    assert_eq!(beyond(tol(0.0, 0.1)), (2, Some(0)));
    assert_eq!(beyond(Tolerance::self_consistency(0.0, 0.1)), (0, None));
}

#[test]
fn push_run_same_equals_push_run_of_a_run_with_itself() {
    // Runs equal on both sides (NaN, infinities, ≥ 700 log-probs and 0/1 masks among
    // them), fed after differing runs (sums no longer tied) or not.
    let mut g = Lcg(19);
    for case in 0..300 {
        let t = Tolerance::new(1e-5, 1e-3, "test");
        let ulp = [None, Some(DType::F32), Some(DType::BF16)][case % 3];
        let logprob = case % 2 == 0;
        let mut one = Accumulator::new(t.clone(), ulp, logprob);
        let mut same = Accumulator::new(t, ulp, logprob);
        for r in 0..1 + g.below(5) as usize {
            let n = g.below(60) as usize;
            let (a, b) = run(&mut g, n);
            let pos = Positions::From(g.below(9) as usize);
            if g.below(3) == 0 {
                one.push_run(&a, &b, None, pos, r, r);
                same.push_run(&a, &b, None, pos, r, r);
            } else {
                let extra: Vec<f64> = (0..n).map(|_| 1e-3 * g.unit()).collect();
                let ex = (case % 4 == 1).then_some(&extra[..]);
                one.push_run(&a, &a, ex, pos, r, r);
                same.push_run_same(&a, ex, pos, r, r);
            }
        }
        assert_eq!(format!("{one:?}"), format!("{same:?}"), "case {case}");
        let (x, y) = (one.finish(), same.finish());
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "case {case}");
    }
}

#[test]
fn f32_ulp_distances_across_the_whole_grid_equal_the_element_path() {
    // The run path keeps f32 distances in u32 lanes: the widest ones (the largest finite
    // f64 against its negation, beyond f32 range on both sides; the largest f32 values;
    // zero against the smallest subnormal) come out as `ulp_distance` gives them.
    let big = f32::MAX as f64;
    let a = [-1.0e308, big, 0.0, -big, 1.0, -1.0e-45, 3.5];
    let b = [1.0e308, -big, 1.0e-45, 1.0e308, -1.0, 0.0, 3.5];
    let t = Tolerance::new(1e-5, 1e-5, "test");
    let mut one = Accumulator::new(t.clone(), Some(DType::F32), false);
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        one.push(x, y, loc(0, i));
    }
    let mut runs = Accumulator::new(t, Some(DType::F32), false);
    runs.push_run(&a, &b, None, Positions::From(0), 0, 0);
    let (x, y) = (one.finish(), runs.finish());
    assert_eq!(format!("{x:?}"), format!("{y:?}"));
    // ±inf on the f32 grid: 2 × 0x7f80_0000 apart (above 2^31, below 2^32).
    assert_eq!(y.max_ulp, Some(2 * 0x7f80_0000));
}

#[test]
fn logprob_sums_by_the_memo_equal_direct_exponentials() {
    // Runs of log-prob pairs: bf16-grid and f32 values, equal pairs, pairs ≥ 700, large
    // differences. The sums and the maximum through the memo (grid values looked up) are
    // those of every exponential computed by `f64::exp`, bit for bit.
    let mut g = Lcg(11);
    let bits = |s: &LogProbSums| [s.k1, s.k3, s.max_pd, s.sum_pd].map(f64::to_bits);
    for case in 0..60 {
        let n = [0, 1, 3, 255, 256, 261, 785][case % 7];
        let (a, b): (Vec<f64>, Vec<f64>) = (0..n)
            .map(|_| {
                let x = match g.below(6) {
                    0 => half::bf16::from_f64(-8.0 * g.unit()).to_f64(),
                    1 => 700.25,
                    _ => (-12.0 * g.unit()) as f32 as f64,
                };
                let y = match g.below(5) {
                    0 => x,
                    1 => (-30.0 * g.unit()) as f32 as f64,
                    _ => (x + 0.05 * (g.unit() - 0.5)) as f32 as f64,
                };
                (x, y)
            })
            .unzip();
        let start = LogProbSums {
            k1: 0.25 * case as f64,
            k3: 1e-3,
            max_pd: 0.0,
            sum_pd: -0.0,
        };
        let (mut memo, mut direct) = (start, start);
        memo.add_memo(&a, &b);
        for (&x, &y) in a.iter().zip(&b) {
            direct.add(x, y, || ((y - x).exp(), x.exp(), y.exp()));
        }
        assert_eq!(bits(&memo), bits(&direct), "case {case}, n {n}");
        // Not vacuous: the longer runs move every sum.
        if n > 256 {
            assert!(
                memo.k3 != start.k3 && memo.sum_pd != start.sum_pd,
                "case {case}"
            );
        }
    }
}

#[test]
fn fold_skipping_divisions_equals_every_quotient() {
    // Long runs whose maxima settle early, then meet quotients a few ulps below, equal to
    // and above them (so the block test that skips the divisions must be exact), with
    // allowances and references near 0, subnormal, huge and zero: the fold's maxima equal
    // those of every element's excess and relative difference computed one by one.
    let mut g = Lcg(23);
    let up = |v: f64, k: i64| f64::from_bits((v.to_bits() as i64 + k) as u64);
    for case in 0..48 {
        let n = 997 + 31 * case;
        let (atol, rtol) = [(3e-5, 0.0), (1e-5, 1.6e-2), (0.0, 1e-6), (1e-310, 0.0)][case % 4];
        let (mut a, mut b, mut e) = (Vec::new(), Vec::new(), Vec::new());
        let d0 = 0.3 + g.unit();
        for i in 0..n {
            let x = match g.below(9) {
                0 => 0.0,
                1 => 1e-300,
                2 => 1e300,
                3 => -(1.0 + g.unit()),
                _ => 1.0 + g.unit(),
            };
            // Differences clustered round d0 (ties and neighbours of the running maxima).
            let d = match g.below(4) {
                0 => up(d0, g.below(5) as i64 - 2),
                1 => d0 * g.unit(),
                2 => 0.0,
                _ => up(d0, -(g.below(3) as i64)),
            };
            let d = if x.abs() > 1e299 { d * 1e290 } else { d };
            a.push(x);
            b.push(x - d);
            e.push(if i % 7 == 3 { 1e-320 } else { 0.0 });
        }
        let folded = fold_finite(&a, &b, &e, atol, rtol, None);
        let (mut exc_max, mut rel_max) = (0.0f64, 0.0f64);
        for i in 0..n {
            let (x, y) = (a[i], b[i]);
            let d = (x - y).abs();
            let allowed = atol + rtol * x.abs() + e[i];
            let exc = if d == 0.0 {
                0.0
            } else if allowed > 0.0 {
                d / allowed
            } else {
                f64::INFINITY
            };
            let exc = if exc.is_nan() { f64::INFINITY } else { exc };
            let rel = if x != 0.0 { d / x.abs() } else { 0.0 };
            exc_max = exc_max.max(exc);
            rel_max = rel_max.max(rel);
        }
        assert_eq!(
            folded.max_excess.to_bits(),
            exc_max.to_bits(),
            "case {case}"
        );
        assert_eq!(folded.max_rel.to_bits(), rel_max.to_bits(), "case {case}");
    }
}
