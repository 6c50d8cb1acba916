//! The fused path's driver: checks that the inputs are its to take, borrows them in the
//! compute dtype, runs the rows in parallel and turns the row sums into a [`LossOutput`].

use candle_core::{Device, Layout, Storage, Tensor};
use rayon::prelude::*;

use super::aggregate::{aggregate, aggregate_grad, lane_sum, Row};
use super::row::{Clip, Kernel, RowW};
use super::scalar::{clamp, Float};
use crate::kernels::config::{
    KlPlacement, LossConfig, LossInputs, LossOutput, Metrics, PolicyKind, RatioLevel,
};
use crate::kernels::KResult;

/// The values of a contiguous CPU storage window, borrowed (`None` off the CPU).
fn cpu_slice<'g, T: Float>(storage: &'g Storage, layout: &Layout) -> KResult<Option<&'g [T]>> {
    let Storage::Cpu(cpu) = storage else {
        return Ok(None);
    };
    let all: &[T] = T::cpu_storage_as_slice(cpu)?;
    Ok(layout.contiguous_offsets().and_then(|(a, b)| all.get(a..b)))
}

/// One fused pass in `T` (with `GRAD`, the gradient too), or `None` when the inputs are
/// not the fused path's to take (see [`super::compute_fused`]).
pub(super) fn run<T: Float, const GRAD: bool>(
    inp: &LossInputs,
    cfg: &LossConfig,
) -> KResult<Option<(LossOutput, Option<Tensor>)>> {
    let [b, t] = *inp.log_probs.dims() else {
        return Ok(None);
    };
    let same = |x: &Tensor| x.dims() == [b, t] && matches!(x.device(), Device::Cpu);
    if !same(&inp.log_probs) || !same(&inp.mask) {
        return Ok(None);
    }
    for x in [&inp.old_log_probs, &inp.ref_log_probs, &inp.entropy]
        .into_iter()
        .flatten()
    {
        if !same(x) {
            return Ok(None);
        }
    }
    let adv_per_token = match inp.advantages.dims() {
        [n] if *n == b => false,
        [n, 1] if *n == b => false,
        [n, m] if *n == b && *m == t => true,
        _ => return Ok(None),
    };
    if cfg.kl.is_some() && inp.ref_log_probs.is_none() {
        return Ok(None);
    }
    if let PolicyKind::Clip(cp) = &cfg.policy {
        if cp.clip_ratio_c.is_some_and(|c| c <= 1.0) {
            return Ok(None);
        }
    }
    // Inputs in `T`, contiguous: the same storage when they already are (no copy).
    let conv = |x: &Tensor| -> KResult<Tensor> { Ok(x.to_dtype(T::DTYPE)?.contiguous()?) };
    let opt = |x: &Option<Tensor>| x.as_ref().map(conv).transpose();
    let held: [Option<Tensor>; 6] = [
        Some(conv(&inp.log_probs)?),
        opt(&inp.old_log_probs)?,
        Some(conv(&inp.mask)?),
        Some(conv(&inp.advantages)?),
        if cfg.kl.is_some() {
            opt(&inp.ref_log_probs)?
        } else {
            None
        },
        opt(&inp.entropy)?,
    ];
    let guards: Vec<_> = held
        .iter()
        .map(|x| x.as_ref().map(|x| x.storage_and_layout()))
        .collect();
    let mut slices: Vec<Option<&[T]>> = Vec::with_capacity(guards.len());
    for g in &guards {
        match g {
            Some((storage, layout)) => match cpu_slice::<T>(storage, layout)? {
                Some(s) => slices.push(Some(s)),
                None => return Ok(None),
            },
            None => slices.push(None),
        }
    }
    let (Some(lp), old, Some(mask), Some(adv), refp, ent) = (
        slices[0], slices[1], slices[2], slices[3], slices[4], slices[5],
    ) else {
        return Ok(None);
    };
    let f = |x: f64| T::from_f64(x);
    let kern = Kernel {
        t,
        lp,
        old,
        mask,
        adv,
        adv_per_token,
        refp,
        ent,
        level: cfg.ratio_level,
        token_clamp: match cfg.ratio_level {
            RatioLevel::Token => cfg.log_ratio_clamp.map(|(lo, hi)| (f(lo), f(hi))),
            _ => None,
        },
        seq_clamp: cfg.log_ratio_clamp.map(|(lo, hi)| (f(lo), f(hi))),
        clip: match &cfg.policy {
            PolicyKind::Clip(cp) => Some(Clip {
                lo: f(1.0 - cp.eps_low),
                hi: f(1.0 + cp.eps_high),
                delta: cp.delta.map(f),
                c: cp.clip_ratio_c.map(f),
            }),
            PolicyKind::ImportanceSampling => None,
        },
        kl: cfg.kl.map(|k| (k.estimator, f(k.coef), k.placement)),
        verl: cfg.agg.is_verl(),
    };
    let zero = T::zero();
    let one = T::one();

    // Backward needs the whole-batch denominators first: a pass over the mask.
    let weights: Vec<RowW<T>> = if GRAD {
        let counts: Vec<T> = if t == 0 {
            vec![zero; b]
        } else {
            mask.par_chunks(t).map(lane_sum).collect()
        };
        let pt = aggregate_grad(cfg.agg, one, &counts, t);
        let k = match &kern.kl {
            Some((_, coef, KlPlacement::Separate)) => {
                aggregate_grad(cfg.agg, one * *coef + zero, &counts, t)
            }
            _ => vec![zero; b],
        };
        pt.into_iter()
            .zip(k)
            .map(|(pt, k)| RowW { pt, k })
            .collect()
    } else {
        Vec::new()
    };
    let w_at = |i: usize| {
        weights
            .get(i)
            .copied()
            .unwrap_or(RowW { pt: zero, k: zero })
    };

    // Outputs without a zero-fill pass: the row pass writes every element once.
    let n = b * t;
    let mut ratio: Vec<T> = Vec::with_capacity(n);
    let mut per_token: Vec<T> = Vec::with_capacity(n);
    let mut grad: Vec<T> = Vec::with_capacity(if GRAD { n } else { 0 });
    let rows: Vec<Row<T>> = {
        let rr = &mut ratio.spare_capacity_mut()[..n];
        let pp = &mut per_token.spare_capacity_mut()[..n];
        if t == 0 {
            (0..b)
                .map(|i| kern.row::<GRAD>(i, &mut [], &mut [], &mut [], w_at(i)))
                .collect()
        } else if GRAD {
            rr.par_chunks_mut(t)
                .zip(pp.par_chunks_mut(t))
                .zip(grad.spare_capacity_mut()[..n].par_chunks_mut(t))
                .enumerate()
                .map(|(i, ((rr, pp), gg))| kern.row_dispatch::<true>(i, rr, pp, gg, w_at(i)))
                .collect()
        } else {
            rr.par_chunks_mut(t)
                .zip(pp.par_chunks_mut(t))
                .enumerate()
                .map(|(i, (rr, pp))| kern.row_dispatch::<false>(i, rr, pp, &mut [], w_at(i)))
                .collect()
        }
    };
    // SAFETY: `Kernel::row` writes every element of its row's `rr`, `pp` and (with
    // `GRAD`) `gg` slices (phase 1 covers each chunk of 0..t for the ratios, the groups of
    // each chunk cover it for the per-token loss and gradient, GSPO's last sweep covers
    // 0..t), and the rows above cover 0..b: the first `n` elements of each capacity are
    // initialised. A panic in the pass unwinds before this point, leaving them empty.
    unsafe {
        ratio.set_len(n);
        per_token.set_len(n);
        if GRAD {
            grad.set_len(n);
        }
    }

    let total = |g: &dyn Fn(&Row<T>) -> T| {
        let mut s = zero;
        for r in &rows {
            s += g(r);
        }
        s
    };
    let cnt = total(&|r| r.cnt);
    let mean_trl = |x: T| (x / clamp(cnt, Some(one), None)).to_f64();
    let mean_verl = |x: T| (x / (cnt * one + f(1e-8))).to_f64();
    let mut metrics = Metrics::default();
    if let PolicyKind::Clip(cp) = &cfg.policy {
        let trl = |k: usize, g: &dyn Fn(&Row<T>) -> T| {
            if cfg.ratio_level == RatioLevel::Sequence {
                let n = b.max(1) as f64;
                total(&|r| r.first[k]).to_f64() / n
            } else {
                mean_trl(total(g))
            }
        };
        metrics.clip_ratio_low = trl(0, &|r| r.low);
        metrics.clip_ratio_high = trl(1, &|r| r.high);
        metrics.clip_ratio_region = trl(2, &|r| r.region);
        metrics.pg_clipfrac = mean_verl(total(&|r| r.frac));
        metrics.pg_clipfrac_lower = match cp.clip_ratio_c {
            Some(_) => mean_verl(total(&|r| r.lower)),
            None => 0.0,
        };
    }
    metrics.ppo_kl = mean_verl(total(&|r| r.ppo_kl));
    metrics.approx_kl = mean_trl(total(&|r| r.approx));
    metrics.avg_ratio = mean_trl(total(&|r| r.avg));
    metrics.clip_frac = mean_trl(total(&|r| r.clip));

    let mut kl_loss = None;
    if let Some(term) = &cfg.kl {
        metrics.kl = Some(mean_trl(total(&|r| r.k.trl)));
        if term.placement == KlPlacement::Separate {
            kl_loss = Some(aggregate(&rows, |r| r.k, cfg.agg, t));
        }
    }
    let pg_loss = aggregate(&rows, |r| r.pt, cfg.agg, t);
    let mut loss = pg_loss;
    if let (Some(kl_loss), Some(term)) = (kl_loss, &cfg.kl) {
        loss += kl_loss * f(term.coef) + zero;
    }
    let mut entropy_loss = None;
    if inp.entropy.is_some() {
        let el = aggregate(&rows, |r| r.e, cfg.entropy_agg, t);
        metrics.entropy = Some(mean_trl(total(&|r| r.e.trl)));
        if cfg.entropy_coeff != 0.0 {
            loss -= el * f(cfg.entropy_coeff) + zero;
        }
        entropy_loss = Some(el);
    }
    let dev = &Device::Cpu;
    let scalar = |v: T| Tensor::new(v, dev);
    let grad = if GRAD {
        Some(Tensor::from_vec(grad, (b, t), dev)?)
    } else {
        None
    };
    Ok(Some((
        LossOutput {
            loss: scalar(loss)?,
            pg_loss: scalar(pg_loss)?,
            kl_loss: kl_loss.map(scalar).transpose()?,
            entropy_loss: entropy_loss.map(scalar).transpose()?,
            ratio: Tensor::from_vec(ratio, (b, t), dev)?,
            per_token_loss: Tensor::from_vec(per_token, (b, t), dev)?,
            metrics,
        },
        grad,
    )))
}
