//! KL estimators between the current and the reference policy (Schulman's k1/k2/k3).
//! `log_probs`, `ref_log_probs`: `[B, T]` same float dtype; results `[B, T]`.

use candle_core::Tensor;

use super::{clamp_torch, same_shape, KResult};

/// A per-token KL estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlEstimator {
    /// `logp − ref` (verl `kl`/`k1`).
    K1,
    /// `|logp − ref|` (verl `abs`).
    Abs,
    /// `½(logp − ref)²` (verl `mse`/`k2`).
    K2,
    /// `exp(ref − logp) − (ref − logp) − 1`, no clamp (TRL `beta` term).
    K3,
    /// verl `low_var_kl`/`k3`: `kl = clamp(ref − logp, ±20)`, `clamp(exp(kl) − kl − 1, ±10)`.
    K3Verl,
    /// verl `k3+`: the value of [`KlEstimator::K3Verl`] with the gradient of k2
    /// (straight-through).
    K3VerlStraightThrough,
    /// mlx-lm-lora GRPO (`grpo_trainer.py` l.491–501): `coef_1·exp(logp − ref) − (logp −
    /// ref) − 1` with `coef_1 = exp(logp − sg(ref))`, its ratio against the reference; at
    /// token level that is `exp(d)·exp(d) − d − 1`, `d = logp − ref` (value and gradient).
    MlxRatio,
}

impl KlEstimator {
    /// Parse verl's names (`kl`, `k1`, `abs`, `mse`, `k2`, `low_var_kl`, `k3`, `k3+`) and
    /// `k3-trl` (TRL's unclamped k3) and `mlx` (mlx-lm-lora's).
    pub fn parse(name: &str) -> Option<KlEstimator> {
        Some(match name {
            "kl" | "k1" => KlEstimator::K1,
            "abs" => KlEstimator::Abs,
            "mse" | "k2" => KlEstimator::K2,
            "low_var_kl" | "k3" => KlEstimator::K3Verl,
            "k3+" | "low_var_kl+" => KlEstimator::K3VerlStraightThrough,
            "k3-trl" | "trl" => KlEstimator::K3,
            "mlx" => KlEstimator::MlxRatio,
            _ => return None,
        })
    }
}

/// Per-token KL estimate, `[B, T]`, convention per [`KlEstimator`] (verl `kl_penalty`, TRL
/// `_compute_loss` for [`KlEstimator::K3`]).
pub fn kl(log_probs: &Tensor, ref_log_probs: &Tensor, est: KlEstimator) -> KResult<Tensor> {
    same_shape("log_probs", log_probs, "ref_log_probs", ref_log_probs)?;
    let d = (log_probs - ref_log_probs)?;
    Ok(match est {
        KlEstimator::K1 => d,
        KlEstimator::Abs => d.abs()?,
        KlEstimator::K2 => d.sqr()?.affine(0.5, 0.0)?,
        KlEstimator::K3 => {
            let r = (ref_log_probs - log_probs)?;
            ((r.exp()? - &r)?.affine(1.0, -1.0))?
        }
        KlEstimator::K3Verl => k3_verl(log_probs, ref_log_probs)?,
        KlEstimator::K3VerlStraightThrough => {
            let fwd = k3_verl(log_probs, ref_log_probs)?.detach();
            let back = d.sqr()?.affine(0.5, 0.0)?;
            ((&back - back.detach())? + fwd)?
        }
        KlEstimator::MlxRatio => {
            let e = d.exp()?;
            (((&e * &e)? - &d)?.affine(1.0, -1.0))?
        }
    })
}

fn k3_verl(log_probs: &Tensor, ref_log_probs: &Tensor) -> KResult<Tensor> {
    let k = clamp_torch(&(ref_log_probs - log_probs)?, Some(-20.0), Some(20.0))?;
    let kld = ((k.exp()? - &k)?.affine(1.0, -1.0))?;
    clamp_torch(&kld, Some(-10.0), Some(10.0))
}
