//! Command-line overrides of a preset's knobs.

use crate::error::{Error, Result};
use crate::kernels::aggregate::AggMode;
use crate::kernels::kl::KlEstimator;
use crate::kernels::loss::{KlPlacement, KlTerm, LossConfig, PolicyKind, RatioLevel};
use crate::kernels::policy_loss::ClipParams;
use crate::kernels::Precision;

/// Each `Some` replaces the preset's value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Lower clip epsilon.
    pub eps_low: Option<f64>,
    /// Upper clip epsilon.
    pub eps_high: Option<f64>,
    /// TRL `delta`.
    pub delta: Option<f64>,
    /// verl dual clip `clip_ratio_c`.
    pub clip_ratio_c: Option<f64>,
    /// Aggregation mode name (`token-mean`, `grpo`, ...).
    pub agg: Option<String>,
    /// `token`, `sequence` or `gspo-token`.
    pub ratio_level: Option<String>,
    /// Symmetric log-ratio clamp (0 disables).
    pub log_ratio_clamp: Option<f64>,
    /// KL estimator name (`k1`, `k2`, `k3`, `abs`, `k3+`, `k3-trl`, `mlx`).
    pub kl: Option<String>,
    /// KL coefficient.
    pub kl_coef: Option<f64>,
    /// Entropy coefficient.
    pub entropy_coeff: Option<f64>,
    /// Advantage epsilon.
    pub adv_eps: Option<f64>,
    /// `f64` or `f32`.
    pub precision: Option<String>,
    /// The preset was chosen explicitly: its aggregation, KL term and advantage epsilon
    /// are given, not read from the dump or inferred (not used by [`apply`]).
    pub preset_fixes_composition: bool,
}

impl Overrides {
    /// True when any knob is given (the composition flag aside).
    pub fn any(&self) -> bool {
        self.eps_low.is_some()
            || self.eps_high.is_some()
            || self.delta.is_some()
            || self.clip_ratio_c.is_some()
            || self.agg.is_some()
            || self.ratio_level.is_some()
            || self.log_ratio_clamp.is_some()
            || self.kl.is_some()
            || self.kl_coef.is_some()
            || self.entropy_coeff.is_some()
            || self.adv_eps.is_some()
            || self.precision.is_some()
    }
}

/// The overrides a caller's coefficient flags give (dumpdiff's `--entropy-coeff`,
/// `--kl-coeff`, in `coefficients` under the names the producers echo them by in
/// `extra_info`) with an advantage epsilon: the key names stay with the producer.
pub fn of_coefficients(
    coefficients: &std::collections::BTreeMap<String, f64>,
    adv_eps: Option<f64>,
) -> Overrides {
    use crate::producers::nexrl_self_hosted::{kl_coef, ENTROPY_COEFF};
    Overrides {
        entropy_coeff: coefficients.get(ENTROPY_COEFF).copied(),
        kl_coef: kl_coef(coefficients),
        adv_eps,
        ..Default::default()
    }
}

/// Apply `o` to `cfg`; unknown names are usage errors listing the accepted ones.
pub fn apply(mut cfg: LossConfig, o: &Overrides) -> Result<LossConfig> {
    if o.eps_low.is_some() || o.eps_high.is_some() || o.delta.is_some() || o.clip_ratio_c.is_some()
    {
        let base = match cfg.policy {
            PolicyKind::Clip(p) => p,
            PolicyKind::ImportanceSampling => ClipParams {
                eps_low: 0.2,
                eps_high: 0.2,
                delta: None,
                clip_ratio_c: None,
            },
        };
        cfg.policy = PolicyKind::Clip(ClipParams {
            eps_low: o.eps_low.unwrap_or(base.eps_low),
            eps_high: o.eps_high.unwrap_or(base.eps_high),
            delta: o.delta.or(base.delta),
            clip_ratio_c: o.clip_ratio_c.or(base.clip_ratio_c),
        });
    }
    if let Some(a) = &o.agg {
        cfg.agg = AggMode::parse(a).ok_or_else(|| {
            Error::Usage(format!(
                "--agg {a:?}: expected token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, grpo, bnpo, dr_grpo or dapo"
            ))
        })?;
    }
    if let Some(r) = &o.ratio_level {
        cfg.ratio_level = match r.as_str() {
            "token" => RatioLevel::Token,
            "sequence" => RatioLevel::Sequence,
            "gspo-token" => RatioLevel::GspoToken,
            _ => {
                return Err(Error::Usage(format!(
                    "--ratio-level {r:?}: expected token, sequence or gspo-token"
                )))
            }
        };
    }
    if let Some(c) = o.log_ratio_clamp {
        cfg.log_ratio_clamp = (c > 0.0).then_some((-c, c));
    }
    if let Some(k) = &o.kl {
        let estimator = KlEstimator::parse(k).ok_or_else(|| {
            Error::Usage(format!(
                "--kl {k:?}: expected k1, abs, k2, k3, k3+, k3-trl or mlx"
            ))
        })?;
        cfg.kl = Some(KlTerm {
            estimator,
            coef: o.kl_coef.unwrap_or(0.0),
            placement: if cfg.agg.is_verl() {
                KlPlacement::Separate
            } else {
                KlPlacement::PerToken
            },
        });
    } else if let (Some(c), Some(kl)) = (o.kl_coef, cfg.kl.as_mut()) {
        kl.coef = c;
    }
    if let Some(e) = o.entropy_coeff {
        cfg.entropy_coeff = e;
    }
    if let Some(e) = o.adv_eps {
        cfg.advantage.eps = e;
    }
    if let Some(p) = &o.precision {
        cfg.precision = match p.as_str() {
            "f64" => Precision::F64,
            "f32" => Precision::F32,
            _ => {
                return Err(Error::Usage(format!(
                    "--precision {p:?}: expected f64 or f32"
                )))
            }
        };
    }
    Ok(cfg)
}
