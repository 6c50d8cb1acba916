use super::*;
use crate::compare::propagate::ChainElem;
use crate::value::Value;

fn rows(v: &[&[f64]]) -> Value {
    Value::List(
        v.iter()
            .map(|r| Value::List(r.iter().map(|&x| Value::Float(x)).collect()))
            .collect(),
    )
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        items
            .into_iter()
            .map(|(k, v)| (Value::Str(k.into()), v))
            .collect(),
    )
}

/// A test dict read as NexRL names its fields.
fn rec_of(v: Value) -> Record {
    Record::new(v, crate::producers::nexrl_files::field_name)
}

fn f32r(x: f64) -> f64 {
    x as f32 as f64
}

fn bf16r(x: f64) -> f64 {
    half::bf16::from_f64(x).to_f64()
}

/// The ratio chain of one micro (no trajectory, one micro per rank) against the weaver's
/// `is_loss_debug` tensors `b_is`, the self-hosted old log-probs `old` (`[rows, T]`).
fn chain_with_old(
    policy: &TolerancePolicy,
    old: Value,
    a_fwd: &Tensors<'_>,
    b_is: &Tensors<'_>,
) -> Chain {
    let inputs = BatchInputs {
        old_log_probs: Mat::of(
            &rec_of(dict(vec![("old_log_probs", old)])),
            Field::OldLogProbs,
        ),
        traj_index: HashMap::new(),
        traj_short: HashMap::new(),
        advantages: None,
        advantages_from: String::new(),
        micros_per_rank: 1,
        adv_parts: None,
        adv_eps: None,
        old_of_traj: None,
        response_lens: Vec::new(),
        dealer: None,
    };
    let peer = ChainPeer {
        fwd: None,
        ids: None,
        is_loss: Some(b_is),
    };
    chain(policy, &inputs, a_fwd, peer, None, (0, 0))
}

/// One micro of one row: self-hosted f32 log-probs, the other side's bf16-rounded.
/// Position 0 sits at log p ≈ −20 where bf16 rounding moves log p by 0.06, so the
/// ratio moves by 6 % — beyond any fixed bf16 rtol, within its inputs' tolerance.
fn is_loss_case(ratio_b1: Option<f64>) -> (Cell, Chain) {
    let lp = [f32r(-20.06), f32r(-2.3)];
    let old = [f32r(-20.05), f32r(-2.31)];
    let lp_b = [bf16r(lp[0]), bf16r(lp[1])];
    let ratio_b = [
        f32r((lp_b[0] - old[0]).exp()),
        ratio_b1.unwrap_or_else(|| f32r((lp_b[1] - old[1]).exp())),
    ];
    let a_fwd = dict(vec![
        ("log_probs", rows(&[&lp])),
        ("response_mask", rows(&[&[1.0, 1.0]])),
    ]);
    let b_is = dict(vec![
        ("log_probs", rows(&[&lp_b])),
        ("old_log_probs", rows(&[&old])),
        ("effective_valid", rows(&[&[1.0, 1.0]])),
        ("prob_ratio", rows(&[&ratio_b])),
    ]);
    let policy = TolerancePolicy::default();
    let a_fwd = rec_of(a_fwd);
    let b_is = rec_of(b_is);
    let (a_fwd, b_is) = (Tensors::new(&a_fwd), Tensors::new(&b_is));
    let ch = chain_with_old(&policy, rows(&[&old]), &a_fwd, &b_is);
    let memo = StatsMemo::new(Some(&ch), None);
    let (cell, _, _, _) =
        is_loss_cell(&policy, 0, 0, &a_fwd, (None, None), &b_is, None, &ch, &memo);
    (cell, ch)
}

fn comparison<'a>(cell: &'a Cell, name: &str) -> &'a Comparison {
    cell.comparisons.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn ratio_tolerance_is_propagated_from_log_prob_inputs() {
    let (cell, ch) = is_loss_case(None);
    let ratio = comparison(&cell, "is_loss.prob_ratio");
    let m = ratio.metrics.as_ref().unwrap();
    let worst = m.max_abs.unwrap();
    // The bf16 noise: 6 % of the ratio, twice the old blanket "bf16 × 2" rtol (3.2e-2).
    assert_eq!(worst.loc.pos, 0);
    assert!(worst.abs_diff > 0.05 * worst.a, "{worst:?}");
    assert_eq!(ratio.verdict, Verdict::Pass, "{}", ratio.reason);
    assert_eq!(
        comparison(&cell, "is_loss.log_probs").verdict,
        Verdict::Pass
    );
    // The allowance at pos 0: r·(e^E − 1), E = what each input differs from the other
    // side's, capped at its tolerance: log p by its bf16 rounding (0.06, within the bf16
    // tol 0.32), old not at all.
    let e = (f32r(-20.06) - bf16r(f32r(-20.06)))
        .abs()
        .min(1e-5 + 1.6e-2 * f32r(20.06));
    let r = (f32r(-20.06) - f32r(-20.05)).exp();
    let allowed = ch.ratio_allowed.as_ref().unwrap().row(0)[0];
    assert!((allowed - r * e.exp_m1()).abs() < 1e-12, "{allowed}");
    assert_eq!(ch.stats.as_ref().unwrap().count(), 2);
}

#[test]
fn a_wrong_ratio_is_still_flagged_at_its_position() {
    let (cell, _) = is_loss_case(Some(0.6));
    let ratio = comparison(&cell, "is_loss.prob_ratio");
    assert_eq!(ratio.verdict, Verdict::Fail);
    let m = ratio.metrics.as_ref().unwrap();
    assert_eq!(m.beyond, 1);
    let first = m.first_beyond.unwrap();
    assert_eq!((first.loc.row, first.loc.pos, first.b), (0, 1, 0.6));
}

fn loss_with_clip_frac(frac: f64) -> Value {
    dict(vec![(
        "metrics",
        dict(vec![("clip_frac", Value::Float(frac))]),
    )])
}

#[test]
fn clip_fraction_may_move_by_the_tokens_near_the_boundary() {
    // 4 valid tokens, one (1.19 ± 0.02) within tolerance of the 1.2 boundary.
    let e = |ratio, ratio_allowed| ChainElem {
        ratio,
        ratio_allowed,
        abs_advantage: Some(1.0),
    };
    let chain = Chain::of_stats(ChainStats::from_elems(&[
        e(1.19, 0.02),
        e(1.0, 0.02),
        e(0.9, 0.02),
        e(1.5, 0.02),
    ]));
    let policy = TolerancePolicy::default();
    let verdict = |b: f64| {
        let a = rec_of(loss_with_clip_frac(0.25));
        let memo = StatsMemo::new(Some(&chain), Some(&a));
        let (cell, _) = loss_cell(
            &policy,
            0,
            0,
            &a,
            &rec_of(loss_with_clip_frac(b)),
            Some(DType::BF16),
            &memo,
        );
        comparison(&cell, "loss.metrics.clip_frac").verdict
    };
    assert_eq!(verdict(0.5), Verdict::Pass); // one token flipped: allowed
    assert_eq!(verdict(0.75), Verdict::Fail); // two flipped: only one could
    assert_eq!(verdict(0.25), Verdict::Pass);
}

/// A stored (little-endian, in place) matrix of `dtype` holding `vals` rounded to it.
fn stored(dtype: DType, rows: usize, width: usize, vals: &[f64]) -> Mat {
    let bytes: Vec<u8> = vals
        .iter()
        .flat_map(|&v| match dtype {
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        })
        .collect();
    let t = Tensor::from_le_bytes(dtype, vec![rows, width], bytes).unwrap();
    Mat::of(
        &rec_of(dict(vec![("log_probs", Value::Tensor(t))])),
        Field::LogProbs,
    )
    .unwrap()
}

/// Deterministic pseudo-random numbers in [0, 1).
pub(super) fn noise(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

/// The comparison loop as it was before chunks and runs: whole rows, one element at
/// a time, a mask position valid when non-zero (and within the mask's width).
fn reference(
    ctx: &PairCtx<'_>,
    a: &Mat,
    b: &Mat,
    extra: Option<&Mat>,
    tol: Tolerance,
    logprob: bool,
) -> String {
    let valid = |m: Option<&[f64]>, p: usize| m.is_none_or(|m| m.get(p).is_some_and(|&v| v != 0.0));
    let mut acc = Accumulator::new(tol, ulp_dtype(a.dtype, b.dtype), logprob);
    for &(ra, rb) in &ctx.rows.pairs {
        let ma = ctx.mask_a.map(|m| m.row(ra));
        let mb = ctx.mask_b.map(|m| m.row(rb));
        let (xa, xb) = (a.row(ra), b.row(rb));
        let ex = extra.map(|e| e.row(ra));
        for (p, (&x, &y)) in xa.iter().zip(xb.iter()).enumerate() {
            if valid(ma.as_deref(), p) && valid(mb.as_deref(), p) {
                let e = ex.as_ref().and_then(|e| e.get(p)).copied().unwrap_or(0.0);
                let loc = ElemLoc {
                    row: ra,
                    other_row: rb,
                    pos: p,
                };
                acc.push_allowing(x, y, e, loc);
            }
        }
    }
    format!("{:?}", acc.finish())
}

#[test]
fn chunked_masked_comparison_equals_the_element_loop() {
    let (r, w) = (4, CHUNK + 37);
    let n = r * w;
    let base = noise(1, n);
    let a_vals: Vec<f64> = base.iter().map(|v| -8.0 * v).collect();
    // b: mostly a rounded to bf16, some equal, one NaN in a valid place and a few in
    // invalid places, one far off.
    let mut b_vals: Vec<f64> = a_vals
        .iter()
        .zip(noise(2, n))
        .map(|(&x, u)| {
            if u < 0.3 {
                x as f32 as f64
            } else {
                half::bf16::from_f64(x).to_f64()
            }
        })
        .collect();
    b_vals[w + 5] = f64::NAN;
    b_vals[2 * w + CHUNK + 3] = 4.0;
    b_vals[3 * w - 1] = f64::NAN;
    let a = stored(DType::F32, r, w, &a_vals);
    let b_owned = Mat::new(vec![r, w], r, w, b_vals.clone(), DType::F64);
    let b_stored = stored(DType::F32, r, w, &b_vals);
    // Masks: a prefix per row on one side; holes and a narrower width on the other.
    let lens = [w, CHUNK - 1, 17, CHUNK + 10];
    let ma_vals: Vec<f64> = (0..n)
        .map(|i| ((i % w) < lens[i / w]) as u8 as f64)
        .collect();
    let mask_a = stored(DType::I32, r, w, &ma_vals);
    let wb = w - 20;
    let mb_vals: Vec<f64> = noise(3, r * wb)
        .iter()
        .map(|&u| (u > 0.1) as u8 as f64)
        .collect();
    let mask_b = stored(DType::I32, r, wb, &mb_vals);
    let extra = Mat::new(
        vec![r - 1, w - 5],
        r - 1,
        w - 5,
        noise(4, (r - 1) * (w - 5))
            .iter()
            .map(|v| 1e-3 * v)
            .collect(),
        DType::F64,
    );
    let rows = RowMatch {
        pairs: vec![(0, 1), (1, 0), (2, 2), (3, 3), (5, 0)],
        only_a: vec![],
        only_b: vec![],
        method: crate::compare::align::MatchMethod::Index,
    };
    let policy = TolerancePolicy::default();
    for (ma, mb) in [
        (None, None),
        (Some(&mask_a), Some(&mask_b)),
        (None, Some(&mask_b)),
    ] {
        let ctx = PairCtx {
            policy: &policy,
            section: "t",
            rows: &rows,
            mask_a: ma,
            mask_b: mb,
            cell_precision: None,
        };
        for b in [&b_owned, &b_stored] {
            for logprob in [false, true] {
                let o = || Origin::dumped("t", "x");
                let got = ctx.masked("x", &a, b, o(), o(), false, logprob);
                let want = reference(&ctx, &a, b, None, got.tolerance.clone(), logprob);
                assert_eq!(format!("{:?}", got.metrics.unwrap()), want);
            }
            let o = || Origin::dumped("t", "x");
            let got = ctx.propagated("x", &a, b, o(), o(), &extra);
            let want = reference(&ctx, &a, b, Some(&extra), got.tolerance.clone(), false);
            let m = got.metrics.as_ref();
            assert_eq!(format!("{:?}", m.unwrap()), want);
            // The comparison saw something: elements, and the far-off one beyond.
            assert!(m.is_some_and(|m| m.count > 0 && m.beyond > 0));
        }
        // Masks compared exactly, a narrower side padded with zeros.
        let o = || Origin::dumped("t", "m");
        let got = ctx.exact_rows("m", &mask_a, &mask_b, o(), o());
        let mut acc = Accumulator::new(got.tolerance.clone(), None, false);
        for &(ra, rb) in &rows.pairs {
            let (xa, xb) = (mask_a.row(ra), mask_b.row(rb));
            for p in 0..xa.len().max(xb.len()) {
                let (x, y) = (
                    xa.get(p).copied().unwrap_or(0.0),
                    xb.get(p).copied().unwrap_or(0.0),
                );
                acc.push(
                    x,
                    y,
                    ElemLoc {
                        row: ra,
                        other_row: rb,
                        pos: p,
                    },
                );
            }
        }
        assert_eq!(
            format!("{:?}", got.metrics.unwrap()),
            format!("{:?}", acc.finish())
        );
    }
}

#[test]
fn ranges_valid_on_both_sides_are_cut_at_chunks() {
    let r = |s: usize, e: usize| s..e;
    let mut out = Vec::new();
    intersect(&[r(0, 10), r(20, 30)], &[r(5, 25)], 100, &mut out);
    assert_eq!(out, vec![r(5, 10), r(20, 25)]);
    intersect(
        &[r(0, 3 * CHUNK)],
        &[r(1, 3 * CHUNK)],
        2 * CHUNK + 5,
        &mut out,
    );
    let cuts = [1, CHUNK + 1, 2 * CHUNK + 1, 2 * CHUNK + 5];
    assert_eq!(
        out,
        cuts.windows(2).map(|w| r(w[0], w[1])).collect::<Vec<_>>()
    );
    intersect(&[r(0, 5)], &[r(5, 9)], 100, &mut out);
    assert!(out.is_empty());
}

#[test]
fn stored_token_rows_hash_as_decoded_ones() {
    let ids: [[i64; 6]; 3] = [[0, 0, 5, 6, 7, 0], [0, 0, 0, 0, 0, 0], [9, 1, 2, 3, 4, 8]];
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let t = Tensor::from_i64(vec![3, 6], &flat).unwrap();
    let stored = token_rows(
        &rec_of(dict(vec![("input_ids", Value::Tensor(t))])),
        Field::InputIds,
    )
    .unwrap();
    assert!(matches!(stored.ids, TokenIds::Stored(_)));
    let listed = dict(vec![(
        "input_ids",
        Value::List(
            ids.iter()
                .map(|r| Value::List(r.iter().map(|&v| Value::Int(v)).collect()))
                .collect(),
        ),
    )]);
    let stripped: [&[i64]; 3] = [&[5, 6, 7], &[], &[9, 1, 2, 3, 4, 8]];
    for (i, want) in stripped.iter().enumerate() {
        assert_eq!(stored.hash(i, false), Some(tokens_hash(want)));
        let head = want.split_last().map(|(_, h)| tokens_hash(h));
        assert_eq!(stored.hash(i, true), head);
    }
    // A list of ints is a tensor built in memory: the same hashes.
    let listed = token_rows(&rec_of(listed), Field::InputIds).unwrap();
    assert_eq!(listed.len(), 3);
    for i in 0..3 {
        for m in [false, true] {
            assert_eq!(listed.hash(i, m), stored.hash(i, m));
        }
    }
    assert_eq!(stored.hash(3, false), None);
}

/// Weaver `batch_inputs/`: ids in the datum layout (`tokens[:-1]`) padded with a non-zero
/// pad id (here 7) and an `attention_mask`: the mask strips the padding, so rows in
/// another order still pair with the self-hosted rows by content.
#[test]
fn batch_inputs_rows_pair_through_their_attention_mask() {
    let ids =
        |v: &[i64], shape: [usize; 2]| Value::Tensor(Tensor::from_i64(shape.to_vec(), v).unwrap());
    // Self-hosted: two rows, prompt+response, zero-padded on the right.
    let a = dict(vec![(
        "input_ids",
        ids(&[11, 12, 13, 14, 0, 21, 22, 23, 24, 25], [2, 5]),
    )]);
    // Weaver: the same rows swapped, each without its last token, padded with 7.
    let b = dict(vec![
        ("input_ids", ids(&[21, 22, 23, 24, 11, 12, 13, 7], [2, 4])),
        ("attention_mask", ids(&[1, 1, 1, 1, 1, 1, 1, 0], [2, 4])),
    ]);
    let a = rec_of(a);
    let b = rec_of(b);
    let (ta, tb) = (Tensors::new(&a), Tensors::new(&b));
    let m = pair_rows(&ta, Some(&tb), 2, 2);
    assert_eq!(m.pairs, vec![(0, 1), (1, 0)]);
    assert!(m.only_a.is_empty() && m.only_b.is_empty());
    // Without the mask the pad 7 shows in no run, only at a row's edge: tried as a pad
    // there, it pairs both rows.
    let b_nomask = dict(vec![(
        "input_ids",
        ids(&[21, 22, 23, 24, 11, 12, 13, 7], [2, 4]),
    )]);
    let b_nomask = rec_of(b_nomask);
    let tb = Tensors::new(&b_nomask);
    let m = pair_rows(&ta, Some(&tb), 2, 2);
    assert_eq!(m.pairs, vec![(0, 1), (1, 0)]);
    // A row whose content differs stays unpaired whatever edge token is stripped.
    let b_other = rec_of(dict(vec![(
        "input_ids",
        ids(&[21, 22, 23, 24, 11, 12, 99, 7], [2, 4]),
    )]));
    let tb = Tensors::new(&b_other);
    let m = pair_rows(&ta, Some(&tb), 2, 2);
    assert_eq!(m.only_a, vec![0]);
}

/// Bits of every value, NaN payloads included.
fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn ratio_fast_loop_is_the_general_loop_bit_for_bit() {
    // Rows of f64 log-probs with masked holes, NaN and ±inf on either side, differences
    // within and far beyond tolerance, rows the other side lacks and rows shorter than
    // the reference: the tight loop of `Derive::ratio` and the general one agree on
    // every ratio, allowance and signed difference, bit for bit.
    let (rows_n, width) = (9, 70);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 800.0];
    let mut val = |lo: f64| {
        let u = next();
        if u < 0.03 {
            special[(u * 200.0) as usize % special.len()]
        } else {
            lo * next()
        }
    };
    let mat = |val: &mut dyn FnMut(f64) -> f64, n: usize, w: usize| -> Vec<Vec<f64>> {
        (0..n)
            .map(|_| (0..w).map(|_| val(-25.0)).collect())
            .collect()
    };
    let lp = mat(&mut val, rows_n, width);
    let old = mat(&mut val, rows_n, width);
    // The other side: the same values nudged (within or beyond tolerance), its rows
    // shorter than the reference's, one row fewer (the last reference row unpaired).
    let nudge = |x: &[Vec<f64>], val: &mut dyn FnMut(f64) -> f64| -> Vec<Vec<f64>> {
        x.iter()
            .take(rows_n - 1)
            .map(|row| {
                row[..width - 9]
                    .iter()
                    .map(|&v| {
                        let u = val(1.0);
                        if u.is_nan() || u.is_infinite() {
                            u
                        } else if u < 0.5 {
                            v + u * 1e-6
                        } else {
                            v - u * 0.5
                        }
                    })
                    .collect()
            })
            .collect()
    };
    let lp_b = nudge(&lp, &mut val);
    let old_b = nudge(&old, &mut val);
    let mask: Vec<Vec<f64>> = (0..rows_n)
        .map(|r| {
            (0..width)
                .map(|p| ((p * 7 + r * 3) % 11 > 2) as u8 as f64)
                .collect()
        })
        .collect();
    let as_rows = |m: &[Vec<f64>]| {
        let refs: Vec<&[f64]> = m.iter().map(|r| r.as_slice()).collect();
        rows(&refs)
    };
    let a_fwd = dict(vec![
        ("log_probs", as_rows(&lp)),
        ("response_mask", as_rows(&mask)),
    ]);
    let b_is = dict(vec![
        ("log_probs", as_rows(&lp_b)),
        ("old_log_probs", as_rows(&old_b)),
    ]);
    let policy = TolerancePolicy::default();
    let a_fwd = rec_of(a_fwd);
    let b_is = rec_of(b_is);
    let (a_fwd, b_is) = (Tensors::new(&a_fwd), Tensors::new(&b_is));
    let ch = chain_with_old(&policy, as_rows(&old), &a_fwd, &b_is);
    let (derive, old) = (ch.partial.as_ref().unwrap(), ch.old.as_ref().unwrap());
    for valid_only in [true, false] {
        let (r1, e1, s1, d1) = derive.ratio_with(old, valid_only, true);
        let (r2, e2, s2, d2) = derive.ratio_with(old, valid_only, false);
        assert_eq!(bits(&r1.values()), bits(&r2.values()));
        assert_eq!(bits(&e1.values()), bits(&e2.values()));
        assert_eq!(bits(&d1), bits(&d2));
        assert_eq!(s1, s2);
        // Not vacuous: signed differences, NaN and finite ratios all occur.
        assert!(d1.iter().any(|d| d.is_finite() && *d != 0.0));
        assert!(r1.values().iter().any(|r| r.is_nan()));
        assert!(r1.values().iter().filter(|r| r.is_finite()).count() > 300);
    }
}

#[test]
fn mask_chunks_counted_by_runs_equal_the_decoded_path() {
    // Two 0/1 masks of every stored kind, the reference wider than a chunk and the other
    // trimmed (its missing positions count as 0), rows paired out of order and past either
    // side's rows: a chunk whose ones lie in the same places, added from its count of ones,
    // gives the comparison the decoded path gives, field for field; so do a differing row
    // (after which the sums are no longer tied and every chunk is decoded) and values that
    // are not 0/1 (−0, 2, NaN: never counted by runs).
    let (wa, wb) = (CHUNK + 904, 3000);
    let (ra, rb) = (5, 4);
    let u = noise(0x0a5c, ra * wa);
    // Row r holds ones on a prefix of random length (a response mask) with a few holes;
    // rows 3 and 4 none (they meet missing rows: compared with 0).
    let len = |r: usize| {
        if r < 3 {
            (u[r] * wb as f64) as usize
        } else {
            0
        }
    };
    let mask = |rows: usize, w: usize| -> Vec<f64> {
        (0..rows * w)
            .map(|i| {
                let (r, p) = (i / w, i % w);
                (p < len(r) && p % 97 != 5) as u8 as f64
            })
            .collect()
    };
    let policy = TolerancePolicy::default();
    let pairs = vec![(0, 1), (1, 0), (2, 2), (3, 3), (4, 9), (7, 3)];
    let rm = RowMatch {
        pairs,
        only_a: vec![],
        only_b: vec![],
        method: crate::compare::align::MatchMethod::Index,
    };
    let ctx = PairCtx {
        policy: &policy,
        section: "t",
        rows: &rm,
        mask_a: None,
        mask_b: None,
        cell_precision: None,
    };
    let origin = || Origin::dumped("t", "m");
    let both = |a: &Mat, b: &Mat| {
        let fast = ctx.exact_rows_with("m", a, b, origin(), origin(), true);
        let slow = ctx.exact_rows_with("m", a, b, origin(), origin(), false);
        assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
        fast.metrics.unwrap()
    };
    // Rows 0 and 1 swapped on the other side (paired (0, 1), (1, 0)).
    let (a_vals, mut b_vals) = (mask(ra, wa), mask(rb, wb));
    for p in 0..wb {
        b_vals.swap(p, wb + p);
    }
    for (da, db) in [
        (DType::I32, DType::I32),
        (DType::I32, DType::F32),
        (DType::F32, DType::BF16),
        (DType::F64, DType::I32),
    ] {
        let a = stored(da, ra, wa, &a_vals);
        let b = stored(db, rb, wb, &b_vals);
        assert!(a.zero_one() && b.zero_one());
        let m = both(&a, &b);
        // Rows 0/1 are swapped back by the pairing; row 4 is paired with a missing row
        // (all of it compared with 0) and a missing row 7 with row 3: all equal.
        assert_eq!((m.count, m.beyond), ((3 * wa + 2 * wa + wb) as u64, 0));
        let owned = Mat::new(vec![ra, wa], ra, wa, a_vals.clone(), DType::F64);
        assert!(owned.zero_one());
        both(&owned, &b);
        // One differing position in the first pair: found, and the rest still equal.
        let mut c = b_vals.clone();
        c[wb + 2] = 1.0 - c[wb + 2];
        let m = both(&a, &stored(db, rb, wb, &c));
        assert_eq!(m.beyond, 1, "{da:?} {db:?}");
        // A differing position in the other side's row 3 (paired twice, last): after
        // chunks counted by runs, the sums those left (pearson) are the decoded path's.
        let mut c = b_vals.clone();
        c[3 * wb + 5] = 1.0;
        let m = both(&a, &stored(db, rb, wb, &c));
        assert_eq!(m.beyond, 2, "{da:?} {db:?}");
        assert!(m.pearson.is_some_and(|p| p < 1.0));
        // Values that are not 0/1 keep every chunk on the decoded path.
        for odd in [-0.0, 2.0, f64::NAN] {
            let mut c = b_vals.clone();
            c[3 * wb + 1] = odd;
            let b = stored(db, rb, wb, &c);
            if db != DType::I32 {
                assert!(!b.zero_one(), "{odd}");
            }
            both(&a, &b);
        }
    }
}

#[test]
fn mode_inputs_follow_the_chains_runs_element_for_element() {
    // Three rows of width 6: row 0 valid at 1..3 and 4..6, row 1 nowhere, row 2 at 0..5;
    // the entropy only 4 wide (a row holds a prefix of the positions). Each element gets
    // its row's advantage and the entropy at its own position where the row holds one.
    let lp: Vec<Vec<f64>> = (0..3)
        .map(|r| (0..6).map(|p| -1.0 - (r * 6 + p) as f64 / 10.0).collect())
        .collect();
    let old: Vec<Vec<f64>> = lp
        .iter()
        .map(|r| r.iter().map(|x| x + 0.01).collect())
        .collect();
    let ent: Vec<Vec<f64>> = (0..3)
        .map(|r| (0..4).map(|p| 0.1 + (r * 4 + p) as f64 / 1000.0).collect())
        .collect();
    let mask = [
        [0.0, 1.0, 1.0, 0.0, 1.0, 1.0],
        [0.0; 6],
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    ];
    let as_rows = |v: &[Vec<f64>]| rows(&v.iter().map(|r| &r[..]).collect::<Vec<_>>());
    let a_fwd = dict(vec![
        ("log_probs", as_rows(&lp)),
        ("response_mask", rows(&[&mask[0], &mask[1], &mask[2]])),
        ("entropy", as_rows(&ent)),
    ]);
    let a_fwd = rec_of(a_fwd);
    let a_fwd = Tensors::new(&a_fwd);
    let inputs = BatchInputs {
        old_log_probs: Mat::of(
            &rec_of(dict(vec![("old_log_probs", as_rows(&old))])),
            Field::OldLogProbs,
        ),
        traj_index: HashMap::new(),
        traj_short: HashMap::new(),
        advantages: Some(vec![0.5, -1.0, 2.0]),
        advantages_from: String::new(),
        micros_per_rank: 1,
        adv_parts: None,
        adv_eps: None,
        old_of_traj: None,
        response_lens: Vec::new(),
        dealer: None,
    };
    let policy = TolerancePolicy::default();
    let ch = chain(&policy, &inputs, &a_fwd, ChainPeer::default(), None, (0, 0));
    assert_eq!(ch.extra.row_counts, vec![4, 0, 5]);
    let x = ModeInputs::of(&ch, &a_fwd);
    assert_eq!(x.advantage, [0.5, 0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0, 2.0]);
    let (e0, e2) = (&ent[0], &ent[2]);
    assert_eq!(x.entropy, [e0[1], e0[2], e2[0], e2[1], e2[2], e2[3]]);
    assert_eq!(x.entropy_u, Some(2f64.powi(-53)));
    // Beside the chain's own elements, in order.
    let ratios: Vec<f64> = ch.stats.as_ref().unwrap().iter().map(|e| e.ratio).collect();
    let at = |r: usize, p: usize| (lp[r][p] - old[r][p]).exp();
    let want = [at(0, 1), at(0, 2), at(0, 4), at(0, 5), at(2, 0), at(2, 1)];
    assert_eq!(&ratios[..6], &want);
    assert_eq!(ratios.len(), 9);
}
