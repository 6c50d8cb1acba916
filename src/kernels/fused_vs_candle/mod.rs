//! The fused path against the candle kernels and their autograd, over a grid of presets,
//! configurations and edge cases; the tie/boundary convention pinned by value.

mod support;

use candle_core::{DType, Device, Tensor};

use crate::kernels::config::{LossInputs, LossOutput, PolicyKind, RatioLevel};
use crate::kernels::fused::{compute_fused, compute_fused_with_grad, BASELINE_ONLY};
use crate::kernels::loss::{compute_candle, compute_with_grad_candle};
use crate::kernels::policy_loss::ClipParams;
use crate::kernels::presets::preset;
use crate::kernels::{to_f64, to_f64_vec, Precision};
use support::*;

/// f64: per-token values bit-identical, sums and every gradient entry within 1e-12
/// relative of candle (observed: sums ~1e-16, gradients bit-identical).
#[test]
fn fused_forward_and_gradient_match_candle_autograd_f64() -> TestResult {
    let w = grid(Precision::F64, 0.0, 1e-12, 1e-12)?;
    eprintln!("f64 worst: sums {:e}, gradient {:e}", w.scalar, w.grad);
    assert!(w.scalar <= 1e-12 && w.token == 0.0 && w.grad <= 1e-12);
    Ok(())
}

/// f32: per-token values bit-identical; whole-batch sums within 1e-5 of max(|x|, 1)
/// (blocked partial sums vs candle's vectorized ones; observed 3e-6); gradients within
/// 1e-5 of max(|x|, largest |gradient|) (observed ~1e-6: only GSPO's row sum of up to
/// 601 terms is ordered differently, everything else is bit-identical).
#[test]
fn fused_forward_and_gradient_match_candle_autograd_f32() -> TestResult {
    let w = grid(Precision::F32, 0.0, 1e-5, 1e-5)?;
    eprintln!("f32 worst: sums {:e}, gradient {:e}", w.scalar, w.grad);
    assert!(w.token == 0.0);
    Ok(())
}

/// The tie and boundary convention, pinned by value in both implementations (torch
/// 2.x gives the same: `torch.clamp` passes no gradient at a bound, `torch.min`/`max`
/// split a tie 0.5/0.5). One row, verl-vanilla with dual clip c = 2.5, token mean over 7
/// valid tokens (w = 1/7):
/// a ratio exactly at `1 ± eps` is a tie of the clipped and unclipped terms whose
/// clipped branch is at its bound, so it gets half the unclipped gradient `−A·r·w`;
/// inside the bounds both branches pass (0.5 + 0.5); a ratio exactly at the dual-clip
/// `c` ties `−A·c` (constant) with the unclipped term: half again.
#[test]
fn ratios_exactly_on_a_clip_bound_get_half_the_gradient() -> TestResult {
    for p in [Precision::F64, Precision::F32] {
        let dev = &Device::Cpu;
        let e = 0.5f64.exp();
        // (log-ratio, advantage, mask, expected gradient / w).
        let toks = [
            (exact_log(1.2, p)?, 1.0, 1.0, -0.5 * 1.2),
            (exact_log(0.8, p)?, -1.0, 1.0, 0.5 * 0.8),
            (0.0, 1.0, 1.0, -1.0),
            (exact_log(1.2, p)?, -1.0, 1.0, 0.5 * 1.2),
            (0.5, 1.0, 1.0, 0.0),
            (0.5, -1.0, 1.0, e),
            (exact_log(2.5, p)?, -1.0, 1.0, 0.5 * 2.5),
            (1.5, -1.0, 0.0, 0.0),
        ];
        let t = toks.len();
        let mk = |k: usize| {
            let v: Vec<f64> = toks.iter().map(|x| [x.0, x.1, x.2][k]).collect::<Vec<_>>();
            Tensor::from_vec(v, (1, t), dev)?.to_dtype(p.dtype())
        };
        let inp = LossInputs {
            log_probs: mk(0)?,
            old_log_probs: Some(Tensor::zeros((1, t), p.dtype(), dev)?),
            ref_log_probs: None,
            advantages: mk(1)?,
            mask: mk(2)?,
            entropy: None,
            rollout_log_probs: None,
        };
        let mut cfg = preset("verl-vanilla")?;
        cfg.precision = p;
        cfg.policy = PolicyKind::Clip(ClipParams {
            eps_low: 0.2,
            eps_high: 0.2,
            delta: None,
            clip_ratio_c: Some(2.5),
        });
        let w = 1.0 / 7.0;
        for (name, g) in [
            (
                "fused",
                compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?.1,
            ),
            ("candle", compute_with_grad_candle(&inp, &cfg)?.1),
        ] {
            let g = to_f64_vec(&g)?;
            for (j, (x, want)) in g.iter().zip(toks.iter().map(|x| x.3 * w)).enumerate() {
                let tol = if p == Precision::F64 { 1e-15 } else { 1e-6 };
                let ok = if want == 0.0 {
                    *x == 0.0
                } else {
                    ((x - want) / want).abs() <= tol
                };
                assert!(ok, "{p:?} {name} token {j}: {x:e}, want {want:e}");
            }
        }
    }
    Ok(())
}

/// verl's log-ratio clamp ±20 and GSPO-token's cap 10: a log-ratio exactly at the
/// bound gets no gradient, one just inside does.
#[test]
fn log_ratio_exactly_on_its_clamp_gets_no_gradient() -> TestResult {
    let dev = &Device::Cpu;
    let lp = Tensor::new(&[[20.0f64, -20.0, 19.5, -19.5]], dev)?;
    let inp = LossInputs {
        log_probs: lp.clone(),
        old_log_probs: Some(lp.zeros_like()?),
        ref_log_probs: None,
        advantages: Tensor::new(&[1.0f64], dev)?,
        mask: lp.ones_like()?,
        entropy: None,
        rollout_log_probs: None,
    };
    let mut cfg = preset("nexrl-is")?;
    cfg.log_ratio_clamp = Some((-20.0, 20.0));
    let g = to_f64_vec(&compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?.1)?;
    let want = [0.0, 0.0, -19.5f64.exp() / 4.0, -(-19.5f64).exp() / 4.0];
    assert_eq!(g[..2], want[..2]);
    for k in 2..4 {
        assert!(((g[k] - want[k]) / want[k]).abs() < 1e-15, "{g:?}");
    }
    // GSPO-token: row 0's sequence log-ratio is exactly 10 (the cap), row 1's 9.5.
    let lp = Tensor::new(&[[10.0f64, 10.0], [9.5, 9.5]], dev)?;
    let inp = LossInputs {
        log_probs: lp.clone(),
        old_log_probs: Some(lp.zeros_like()?),
        mask: lp.ones_like()?,
        advantages: Tensor::new(&[1.0f64, 1.0], dev)?,
        ..inp
    };
    cfg.ratio_level = RatioLevel::GspoToken;
    cfg.log_ratio_clamp = Some((f64::NEG_INFINITY, 10.0));
    let (_, g) = compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?;
    let (_, c) = compute_with_grad_candle(&inp, &cfg)?;
    let (g, c) = (to_f64_vec(&g)?, to_f64_vec(&c)?);
    assert_eq!(g, c);
    assert_eq!(g[..2], [0.0, 0.0]);
    assert!(g[2] < 0.0 && g[3] < 0.0);
    Ok(())
}

/// The row kernel compiled for AVX2 (what runs on this machine when it has AVX2) and
/// for the x86-64 baseline give the same bits: loss, metrics, ratio, per-token loss and
/// gradient, for every preset and KL estimator on the boundary and long-row cases.
#[test]
fn avx2_and_baseline_builds_give_identical_bits() -> TestResult {
    use std::sync::atomic::Ordering;
    let dev = &Device::Cpu;
    let bits = |o: &LossOutput, g: &Tensor| -> Result<Vec<u64>, String> {
        let mut v: Vec<u64> = [&o.loss, &o.pg_loss, &o.ratio, &o.per_token_loss, g]
            .iter()
            .map(|t| vals(t))
            .collect::<Result<Vec<_>, _>>()?
            .concat()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let m = &o.metrics;
        v.extend(
            [
                m.clip_ratio_low,
                m.pg_clipfrac,
                m.ppo_kl,
                m.approx_kl,
                m.avg_ratio,
            ]
            .map(f64::to_bits),
        );
        Ok(v)
    };
    let mut runs = 0;
    for p in [Precision::F64, Precision::F32] {
        for case in cases(p)?
            .into_iter()
            .filter(|c| c.name.starts_with("boundaries") || c.name == "long-rows")
        {
            let (b, t) = (case.b, case.t);
            let mk = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), dev)?.to_dtype(p.dtype());
            let adv = if case.adv.len() == b * t {
                mk(&case.adv)?
            } else {
                Tensor::from_vec(case.adv.clone(), b, dev)?.to_dtype(p.dtype())?
            };
            let inp = LossInputs {
                log_probs: mk(&case.lp)?,
                old_log_probs: Some(mk(&case.old)?),
                ref_log_probs: Some(mk(&case.old)?),
                advantages: adv,
                mask: mk(&case.mask)?,
                entropy: Some(mk(&case.mask)?),
                rollout_log_probs: None,
            };
            for cfg in configs(p, true)? {
                BASELINE_ONLY.store(false, Ordering::Relaxed);
                let (o1, g1) = compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?;
                BASELINE_ONLY.store(true, Ordering::Relaxed);
                let (o2, g2) = compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?;
                BASELINE_ONLY.store(false, Ordering::Relaxed);
                assert!(
                    bits(&o1, &g1)? == bits(&o2, &g2)?,
                    "{} {}",
                    case.name,
                    cfg.preset
                );
                runs += 1;
            }
        }
    }
    assert!(runs > 100);
    Ok(())
}

#[test]
fn fused_declines_what_candle_refuses() -> TestResult {
    let dev = &Device::Cpu;
    let x = Tensor::zeros((2, 3), DType::F64, dev)?;
    let inp = LossInputs {
        log_probs: x.clone(),
        old_log_probs: Some(Tensor::zeros((2, 4), DType::F64, dev)?),
        ref_log_probs: None,
        advantages: Tensor::zeros(2, DType::F64, dev)?,
        mask: x,
        entropy: None,
        rollout_log_probs: None,
    };
    let cfg = preset("trl-grpo")?;
    assert!(compute_fused(&inp, &cfg)?.is_none());
    assert!(compute_fused_with_grad(&inp, &cfg)?.is_none());
    assert!(crate::kernels::loss::compute(&inp, &cfg).is_err());
    assert!(crate::kernels::loss::compute_with_grad(&inp, &cfg).is_err());
    Ok(())
}

/// Inputs already in the compute dtype and contiguous are read in place; others
/// (another dtype, a strided view) are converted first, with the same results.
#[test]
fn strided_and_other_dtype_inputs_give_the_same_results() -> TestResult {
    let dev = &Device::Cpu;
    let (b, t) = (4, 9);
    let mut seed = 3u64;
    let (lp, old, adv) = random_case(b, t, &mut seed);
    let mk = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), dev);
    let mask = Tensor::ones((b, t), DType::U8, dev)?;
    let base = LossInputs {
        log_probs: mk(&lp)?,
        old_log_probs: Some(mk(&old)?),
        ref_log_probs: None,
        advantages: Tensor::from_vec(adv, b, dev)?,
        mask: mask.to_dtype(DType::F64)?,
        entropy: None,
        rollout_log_probs: None,
    };
    let strided = LossInputs {
        log_probs: mk(&lp)?.t()?.contiguous()?.t()?,
        old_log_probs: Some(mk(&old)?.to_dtype(DType::F32)?.to_dtype(DType::F64)?),
        mask,
        ..base.clone()
    };
    assert!(!strided.log_probs.is_contiguous());
    let cfg = preset("verl-vanilla")?;
    let (a, ga) = compute_fused_with_grad(&base, &cfg)?.ok_or("declined")?;
    let (s, gs) = compute_fused_with_grad(&strided, &cfg)?.ok_or("declined")?;
    let (_, gc) = compute_with_grad_candle(&strided, &cfg)?;
    let (x, y) = (
        to_f64(&a.loss)?,
        to_f64(&compute_candle(&base, &cfg)?.loss)?,
    );
    assert!((x - y).abs() <= 1e-12 * y.abs(), "{x} vs {y}");
    assert_eq!(to_f64_vec(&gs)?, to_f64_vec(&gc)?);
    // old rounded through f32 changes the values: the strided run is not the base run.
    assert_ne!(to_f64(&a.loss)?, to_f64(&s.loss)?);
    assert_eq!(ga.dims(), gs.dims());
    Ok(())
}
