//! What the fused-vs-candle tests share: comparators with their bounds, the grid of
//! input cases (boundaries, overflow, NaN, empty rows) and of configurations.

use candle_core::{Device, Tensor};

use crate::kernels::aggregate::AggMode;
use crate::kernels::config::{
    KlPlacement, KlTerm, LossConfig, LossInputs, LossOutput, PolicyKind, RatioLevel,
};
use crate::kernels::fused::{compute_fused, compute_fused_with_grad};
use crate::kernels::kl::KlEstimator;
use crate::kernels::loss::compute_with_grad_candle;
use crate::kernels::policy_loss::ClipParams;
use crate::kernels::presets::{preset, PRESETS};
use crate::kernels::{to_f64, to_f64_vec, Precision};

pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Largest relative difference seen per quantity, for the bounds the asserts use.
#[derive(Default)]
pub(super) struct Worst {
    pub(super) scalar: f64,
    pub(super) token: f64,
    pub(super) grad: f64,
}

/// `a` and `b` agree: both NaN, equal (infinities included), or finite within `tol`
/// relative to max(|a|, |b|, `scale`); zero only where the other is zero. Returns the
/// relative difference.
pub(super) fn agree(what: &str, a: f64, b: f64, tol: f64, scale: f64) -> Result<f64, String> {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            Ok(0.0)
        } else {
            Err(format!("{what}: fused {a:e} vs candle {b:e} (NaN pattern)"))
        };
    }
    if a == b {
        return Ok(0.0);
    }
    if a == 0.0 || b == 0.0 || !a.is_finite() || !b.is_finite() {
        return Err(format!(
            "{what}: fused {a:e} vs candle {b:e} (zero/inf pattern)"
        ));
    }
    let rel = (a - b).abs() / a.abs().max(b.abs()).max(scale);
    if rel > tol {
        return Err(format!("{what}: fused {a:e} vs candle {b:e} (rel {rel:e})"));
    }
    Ok(rel)
}

/// Scalars may differ by the order of whole-batch sums: relative to max(|a|, |b|, 1).
pub(super) fn agree_sum(what: &str, a: f64, b: f64, tol: f64) -> Result<f64, String> {
    if a.is_nan() || b.is_nan() || !a.is_finite() || !b.is_finite() {
        return agree(what, a, b, 0.0, 0.0);
    }
    let rel = (a - b).abs() / a.abs().max(b.abs()).max(1.0);
    if rel > tol {
        return Err(format!("{what}: fused {a:e} vs candle {b:e} (rel {rel:e})"));
    }
    Ok(rel)
}

pub(super) fn vals(t: &Tensor) -> Result<Vec<f64>, String> {
    to_f64_vec(t).map_err(|e| e.to_string())
}

/// Forward outputs: per-token tensors element by element (`tok` relative), scalars and
/// metrics within `sum` relative.
pub(super) fn same_forward(
    ctx: &str,
    f: &LossOutput,
    c: &LossOutput,
    tok: f64,
    sum: f64,
    w: &mut Worst,
) -> Result<(), String> {
    let s = |t: &Tensor| to_f64(t).unwrap_or(f64::NAN);
    let o = |x: &Option<Tensor>| x.as_ref().map(s);
    if o(&f.kl_loss).is_some() != o(&c.kl_loss).is_some()
        || o(&f.entropy_loss).is_some() != o(&c.entropy_loss).is_some()
        || f.metrics.kl.is_some() != c.metrics.kl.is_some()
        || f.metrics.entropy.is_some() != c.metrics.entropy.is_some()
    {
        return Err(format!("{ctx}: optional outputs differ"));
    }
    if f.loss.dtype() != c.loss.dtype() || f.ratio.dtype() != c.ratio.dtype() {
        return Err(format!("{ctx}: dtypes differ"));
    }
    let (m, n) = (&f.metrics, &c.metrics);
    for (name, a, b) in [
        ("loss", s(&f.loss), s(&c.loss)),
        ("pg_loss", s(&f.pg_loss), s(&c.pg_loss)),
        (
            "kl_loss",
            o(&f.kl_loss).unwrap_or(0.0),
            o(&c.kl_loss).unwrap_or(0.0),
        ),
        (
            "entropy_loss",
            o(&f.entropy_loss).unwrap_or(0.0),
            o(&c.entropy_loss).unwrap_or(0.0),
        ),
        ("clip_ratio_low", m.clip_ratio_low, n.clip_ratio_low),
        ("clip_ratio_high", m.clip_ratio_high, n.clip_ratio_high),
        (
            "clip_ratio_region",
            m.clip_ratio_region,
            n.clip_ratio_region,
        ),
        ("pg_clipfrac", m.pg_clipfrac, n.pg_clipfrac),
        (
            "pg_clipfrac_lower",
            m.pg_clipfrac_lower,
            n.pg_clipfrac_lower,
        ),
        ("ppo_kl", m.ppo_kl, n.ppo_kl),
        ("approx_kl", m.approx_kl, n.approx_kl),
        ("avg_ratio", m.avg_ratio, n.avg_ratio),
        ("clip_frac", m.clip_frac, n.clip_frac),
        ("kl", m.kl.unwrap_or(0.0), n.kl.unwrap_or(0.0)),
        (
            "entropy",
            m.entropy.unwrap_or(0.0),
            n.entropy.unwrap_or(0.0),
        ),
    ] {
        w.scalar = w
            .scalar
            .max(agree_sum(&format!("{ctx} {name}"), a, b, sum)?);
    }
    for (name, x, y) in [
        ("ratio", &f.ratio, &c.ratio),
        ("per_token", &f.per_token_loss, &c.per_token_loss),
    ] {
        if x.dims() != y.dims() {
            return Err(format!("{ctx} {name}: {:?} vs {:?}", x.dims(), y.dims()));
        }
        for (k, (a, b)) in vals(x)?.iter().zip(&vals(y)?).enumerate() {
            w.token = w
                .token
                .max(agree(&format!("{ctx} {name}[{k}]"), *a, *b, tok, 0.0)?);
        }
    }
    Ok(())
}

/// Gradients: same shape and dtype, same zero/NaN/inf pattern, finite values within
/// `tol` relative (`scaled`: relative to the tensor's largest finite |value| at least,
/// for f32, where a GSPO token's KL and sequence parts may cancel).
pub(super) fn same_grad(
    ctx: &str,
    f: &Tensor,
    c: &Tensor,
    tol: f64,
    scaled: bool,
    w: &mut Worst,
) -> Result<(), String> {
    if f.dims() != c.dims() || f.dtype() != c.dtype() {
        return Err(format!(
            "{ctx} grad: {:?} {:?} vs {:?} {:?}",
            f.dims(),
            f.dtype(),
            c.dims(),
            c.dtype()
        ));
    }
    let (fv, cv) = (vals(f)?, vals(c)?);
    let scale = if scaled {
        cv.iter()
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()))
    } else {
        0.0
    };
    for (k, (a, b)) in fv.iter().zip(&cv).enumerate() {
        w.grad = w
            .grad
            .max(agree(&format!("{ctx} grad[{k}]"), *a, *b, tol, scale)?);
    }
    Ok(())
}

/// Deterministic pseudo-random values in [0, 1).
pub(super) fn lcg(seed: &mut u64) -> f64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 11) as f64 / (1u64 << 53) as f64
}

/// A log-ratio `d`, exactly representable in the precision's dtype, whose `exp` in that
/// dtype is exactly `target` cast to it: `logp = d`, `old = 0` puts a ratio exactly on a
/// clip bound.
pub(super) fn exact_log(target: f64, p: Precision) -> Result<f64, String> {
    for k in 0..4096i64 {
        for s in [1i64, -1] {
            let hit = match p {
                Precision::F64 => {
                    let d = f64::from_bits((target.ln().to_bits() as i64 + s * k) as u64);
                    (d.exp() == target).then_some(d)
                }
                Precision::F32 => {
                    let base = (target as f32).ln().to_bits() as i64;
                    let d = f32::from_bits((base + s * k) as u32);
                    (d.exp() == target as f32).then_some(d as f64)
                }
            };
            if let Some(d) = hit {
                return Ok(d);
            }
        }
    }
    Err(format!("no {p:?} log-ratio with exp = {target}"))
}

/// One input set, f64 values exactly representable in the case's precision.
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) b: usize,
    pub(super) t: usize,
    pub(super) lp: Vec<f64>,
    pub(super) old: Vec<f64>,
    /// `b` values (per row) or `b·t` (per token).
    pub(super) adv: Vec<f64>,
    pub(super) mask: Vec<f64>,
}

pub(super) fn round_to(p: Precision, v: Vec<f64>) -> Vec<f64> {
    match p {
        Precision::F64 => v,
        Precision::F32 => v.into_iter().map(|x| x as f32 as f64).collect(),
    }
}

pub(super) fn random_case(b: usize, t: usize, seed: &mut u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut lp = Vec::new();
    let mut old = Vec::new();
    for _ in 0..b * t {
        let o = -3.0 * lcg(seed) - 1e-3;
        old.push(o);
        lp.push(o + 0.6 * (lcg(seed) - 0.5));
    }
    let adv: Vec<f64> = (0..b).map(|_| 2.0 * lcg(seed) - 1.0).collect();
    (lp, old, adv)
}

/// Random rows, exact clip/clamp boundaries for every preset's epsilons (both advantage
/// signs), overflowing ratios, GSPO rows whose sequence ratio sits on a bound, NaN and
/// ±inf inputs, empty rows, empty micro-batches.
pub(super) fn cases(p: Precision) -> Result<Vec<Case>, String> {
    let mut out = Vec::new();
    let mut seed = 7u64;
    let (b, t) = (6, 37);
    let (lp, old, adv) = random_case(b, t, &mut seed);
    let mut mask = vec![1.0; b * t];
    mask[2 * t..3 * t].iter_mut().for_each(|m| *m = 0.0);
    mask[4 * t + 10..5 * t].iter_mut().for_each(|m| *m = 0.0);
    let mut adv0 = adv.clone();
    adv0[5] = 0.0;
    out.push(Case {
        name: "random+empty-row",
        b,
        t,
        lp: lp.clone(),
        old: old.clone(),
        adv: adv0,
        mask: mask.clone(),
    });
    out.push(Case {
        name: "all-masked",
        b,
        t,
        lp: lp.clone(),
        old: old.clone(),
        adv: adv.clone(),
        mask: vec![0.0; b * t],
    });
    // Rows longer than a chunk (CHUNK = 256), not a multiple of the lane count.
    let (b, t) = (3, 601);
    let (mut lp_l, old_l, adv_l) = random_case(b, t, &mut seed);
    let mut mask_l = vec![1.0; b * t];
    mask_l[t + 300..2 * t].iter_mut().for_each(|m| *m = 0.0);
    mask_l[2 * t..2 * t + 17].iter_mut().for_each(|m| *m = 0.0);
    for j in [0, 255, 256, 257, 512, 600] {
        lp_l[j] = old_l[j] + exact_log(1.2, p)?;
    }
    out.push(Case {
        name: "long-rows",
        b,
        t,
        lp: lp_l,
        old: old_l,
        adv: adv_l,
        mask: mask_l,
    });

    // Exact bounds: 1 ± eps of trl/verl (0.2), dapo (0.28), gspo (3e-4/4e-4), mlx
    // (1e-4), dual clip c = 2.5 (exp never lands on 3.0 in f64, nor 3.5 in f32), delta 1.5; log-ratios exactly ±20 (verl clamp), 10
    // (GSPO-token clamp), overflow ±800, ±25.
    let mut bounds = Vec::new();
    for target in [
        1.0 - 0.2,
        1.0 + 0.2,
        1.0 + 0.28,
        1.0 - 3e-4,
        1.0 + 4e-4,
        1.0 - 1e-4,
        1.0 + 1e-4,
        2.5,
        1.5,
    ] {
        bounds.push(exact_log(target, p)?);
    }
    bounds.extend([0.0, 20.0, -20.0, 10.0, 800.0, -800.0, 25.0, -25.0, 19.5]);
    let (b, t) = (9, 24);
    let (mut lp, mut old, _) = random_case(b, t, &mut seed);
    let mut mask = vec![1.0; b * t];
    for i in 0..4 {
        for (j, d) in bounds.iter().enumerate() {
            lp[i * t + j] = *d;
            old[i * t + j] = 0.0;
        }
        mask[i * t + t - 3..(i + 1) * t]
            .iter_mut()
            .for_each(|m| *m = 0.0);
    }
    lp[t - 1] = f64::NEG_INFINITY;
    // Rows 4-7: every valid token at one GSPO bound (2 or 4 valid tokens, so that the
    // sequence mean is exactly that log-ratio); row 8 empty.
    for (i, (d, n)) in [
        (exact_log(1.0 + 4e-4, p)?, 2),
        (exact_log(1.0 - 3e-4, p)?, 4),
        (10.0, 4),
        (exact_log(1.0 + 0.2, p)?, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let i = i + 4;
        mask[i * t..(i + 1) * t]
            .iter_mut()
            .enumerate()
            .for_each(|(j, m)| *m = if j < n { 1.0 } else { 0.0 });
        for j in 0..n {
            lp[i * t + j] = d;
            old[i * t + j] = 0.0;
        }
    }
    mask[8 * t..9 * t].iter_mut().for_each(|m| *m = 0.0);
    let adv_row = vec![0.7, -0.9, 1.0, -1.0, 0.5, -0.5, 0.3, 2.0, -0.2];
    let adv_tok: Vec<f64> = (0..b * t)
        .map(|k| match k % 3 {
            0 => -1.0,
            1 => 0.5,
            _ => 2.0,
        })
        .collect();
    out.push(Case {
        name: "boundaries",
        b,
        t,
        lp: lp.clone(),
        old: old.clone(),
        adv: adv_row.clone(),
        mask: mask.clone(),
    });
    out.push(Case {
        name: "boundaries+per-token-adv",
        b,
        t,
        lp: lp.clone(),
        old: old.clone(),
        adv: adv_tok,
        mask: mask.clone(),
    });

    // Non-finite inputs under the mask only (verl modes must not leak them) and at
    // valid tokens.
    let (b, t) = (5, 16);
    let (lp, old, adv) = random_case(b, t, &mut seed);
    let mut mask = vec![1.0; b * t];
    for i in 0..b {
        mask[i * t + 12..(i + 1) * t]
            .iter_mut()
            .for_each(|m| *m = 0.0);
    }
    let mut lp_m = lp.clone();
    let mut old_m = old.clone();
    lp_m[13] = f64::INFINITY;
    lp_m[t + 14] = f64::NAN;
    old_m[2 * t + 15] = f64::NEG_INFINITY;
    lp_m[3 * t + 12] = f64::NEG_INFINITY;
    out.push(Case {
        name: "nonfinite-masked",
        b,
        t,
        lp: lp_m,
        old: old_m,
        adv: adv.clone(),
        mask: mask.clone(),
    });
    let mut lp_v = lp.clone();
    let mut old_v = old.clone();
    lp_v[3] = f64::INFINITY;
    lp_v[t + 5] = f64::NAN;
    old_v[2 * t + 7] = f64::NEG_INFINITY;
    lp_v[3 * t + 1] = f64::NEG_INFINITY;
    let mut adv_v = adv.clone();
    adv_v[4] = f64::NAN;
    out.push(Case {
        name: "nonfinite-valid",
        b,
        t,
        lp: lp_v,
        old: old_v,
        adv: adv_v,
        mask,
    });
    out.push(Case {
        name: "t=0",
        b: 3,
        t: 0,
        lp: vec![],
        old: vec![],
        adv: vec![0.5, -0.5, 1.0],
        mask: vec![],
    });
    out.push(Case {
        name: "b=0",
        b: 0,
        t: 5,
        lp: vec![],
        old: vec![],
        adv: vec![],
        mask: vec![],
    });
    Ok(out
        .into_iter()
        .map(|c| Case {
            lp: round_to(p, c.lp),
            old: round_to(p, c.old),
            adv: round_to(p, c.adv),
            ..c
        })
        .collect())
}

pub(super) const ESTIMATORS: [KlEstimator; 7] = [
    KlEstimator::K1,
    KlEstimator::Abs,
    KlEstimator::K2,
    KlEstimator::K3,
    KlEstimator::K3Verl,
    KlEstimator::K3VerlStraightThrough,
    KlEstimator::MlxRatio,
];

/// Every preset, and around it each aggregation mode, ratio level (with and without a
/// log-ratio clamp), dual clip, TRL delta; with `extras`, every KL estimator in both
/// placements with an entropy bonus.
pub(super) fn configs(p: Precision, extras: bool) -> Result<Vec<LossConfig>, String> {
    let mut out = Vec::new();
    for name in PRESETS {
        let mut cfg = preset(name).map_err(|e| e.to_string())?;
        cfg.precision = p;
        out.push(cfg.clone());
        if extras {
            for (n, est) in ESTIMATORS.into_iter().enumerate() {
                for placement in [KlPlacement::PerToken, KlPlacement::Separate] {
                    let mut c = cfg.clone();
                    c.entropy_coeff = 0.01;
                    if n % 2 == 1 {
                        c.entropy_agg = cfg.agg;
                    }
                    c.kl = Some(KlTerm {
                        estimator: est,
                        coef: 0.1,
                        placement,
                    });
                    out.push(c);
                }
            }
            continue;
        }
        for agg in [
            AggMode::TokenMean,
            AggMode::SeqMeanTokenMean,
            AggMode::SeqMeanTokenSum,
            AggMode::SeqMeanTokenSumNorm { horizon: None },
            AggMode::SeqMeanTokenSumNorm {
                horizon: Some(16.0),
            },
            AggMode::TrlGrpo,
            AggMode::TrlBnpo,
            AggMode::TrlDrGrpo {
                max_completion_length: None,
            },
            AggMode::TrlDrGrpo {
                max_completion_length: Some(30.0),
            },
            AggMode::TrlDapo {
                num_items_in_batch: None,
            },
            AggMode::TrlDapo {
                num_items_in_batch: Some(7.0),
            },
        ] {
            if agg != cfg.agg {
                out.push(LossConfig { agg, ..cfg.clone() });
            }
        }
        for level in [
            RatioLevel::Token,
            RatioLevel::Sequence,
            RatioLevel::GspoToken,
        ] {
            for clamp in [None, Some((-20.0, 10.0)), Some((f64::NEG_INFINITY, 10.0))] {
                if (level, clamp) != (cfg.ratio_level, cfg.log_ratio_clamp) {
                    out.push(LossConfig {
                        ratio_level: level,
                        log_ratio_clamp: clamp,
                        ..cfg.clone()
                    });
                }
            }
        }
        if let PolicyKind::Clip(cp) = cfg.policy {
            for (delta, c) in [(None, Some(2.5)), (Some(1.5), None), (Some(1.5), Some(2.5))] {
                out.push(LossConfig {
                    policy: PolicyKind::Clip(ClipParams {
                        delta,
                        clip_ratio_c: c,
                        ..cp
                    }),
                    ..cfg.clone()
                });
            }
        }
    }
    Ok(out)
}

/// Runs the whole grid in precision `p`: fused forward vs [`crate::kernels::loss::compute_candle`], fused
/// gradient vs candle autograd ([`compute_with_grad_candle`]).
pub(super) fn grid(
    p: Precision,
    tok: f64,
    sum: f64,
    grad: f64,
) -> Result<Worst, Box<dyn std::error::Error>> {
    let dev = &Device::Cpu;
    let dt = p.dtype();
    let mut worst = Worst::default();
    let mut runs = 0;
    for case in cases(p)? {
        let (b, t) = (case.b, case.t);
        let ent: Vec<f64> = (0..b * t).map(|k| (k % 11) as f64 * 0.3).collect();
        let refp: Vec<f64> = round_to(
            p,
            case.lp
                .iter()
                .enumerate()
                .map(|(k, v)| match k % 5 {
                    4 => v - 21.0,
                    3 => v + 20.0,
                    _ => v - 0.05 * (k % 7) as f64,
                })
                .collect(),
        );
        let mk = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), dev)?.to_dtype(dt);
        let adv_t = if case.adv.len() == b * t && t != 1 && b * t != b {
            mk(&case.adv)?
        } else {
            Tensor::from_vec(case.adv.clone(), b, dev)?.to_dtype(dt)?
        };
        for with_old in [true, false] {
            for extras in [false, true] {
                let inp = LossInputs {
                    log_probs: mk(&case.lp)?,
                    old_log_probs: with_old.then(|| mk(&case.old)).transpose()?,
                    ref_log_probs: extras.then(|| mk(&refp)).transpose()?,
                    advantages: adv_t.clone(),
                    mask: mk(&case.mask)?,
                    entropy: extras.then(|| mk(&ent)).transpose()?,
                    rollout_log_probs: None,
                };
                for cfg in configs(p, extras)? {
                    let ctx = format!(
                        "{} {} {:?} {:?} {:?} kl={:?} old={with_old}",
                        case.name, cfg.preset, cfg.ratio_level, cfg.agg, cfg.policy, cfg.kl
                    );
                    let fwd = compute_fused(&inp, &cfg)?.ok_or("the fused path declined")?;
                    let (fo, fg) =
                        compute_fused_with_grad(&inp, &cfg)?.ok_or("the fused path declined")?;
                    let (co, cg) = compute_with_grad_candle(&inp, &cfg)?;
                    same_forward(&ctx, &fwd, &co, tok, sum, &mut worst)?;
                    same_forward(&ctx, &fo, &co, tok, sum, &mut worst)?;
                    same_grad(&ctx, &fg, &cg, grad, p == Precision::F32, &mut worst)?;
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 1000, "only {runs} runs");
    Ok(worst)
}
