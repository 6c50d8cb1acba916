//! One convention of a step as the judge settled it, and where it came from (the
//! conventions record every report prints).

use crate::kernels::loss::LossConfig;

/// Where a convention came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// The `loss/` files' `extra_info`.
    Dumped,
    /// Inferred from the dumped values of every cell.
    Inferred,
    /// The preset's value (nothing in the dump says otherwise).
    Preset,
}

/// One convention of the step and how it was settled.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Convention {
    /// `agg`, `kl_estimator`, `entropy_coeff`, `kl_coef`.
    pub name: &'static str,
    /// The value used, in words (`seq-mean-token-mean`, `0.0001`).
    pub value: String,
    /// The value used, when a number.
    pub number: Option<f64>,
    /// Where it came from.
    pub source: Source,
    /// Cells the value explains, of `cells` judged on it (inferred values).
    pub explained: Option<usize>,
    /// Cells that dump what the value is judged on.
    pub cells: Option<usize>,
    /// Standard error of an inferred coefficient.
    pub std_err: Option<f64>,
    /// Root mean square residual of the coefficient fit.
    pub rms_residual: Option<f64>,
    /// A caveat (an underdetermined fit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The value is the preset's (the text renderers name only the others).
    #[serde(skip)]
    pub matches_preset: bool,
}

impl Convention {
    /// A convention without fit statistics.
    pub fn new(name: &'static str, value: String, number: Option<f64>, source: Source) -> Self {
        Convention {
            name,
            value,
            number,
            source,
            explained: None,
            cells: None,
            std_err: None,
            rms_residual: None,
            matches_preset: false,
            note: None,
        }
    }

    /// `name value (source[, n/m cells][, ±se])`.
    pub fn line(&self) -> String {
        let src = match self.source {
            Source::Flag => "flag",
            Source::Dumped => "dumped",
            Source::Inferred => "inferred",
            Source::Preset => "preset",
        };
        let mut s = format!("{} {} ({src}", self.name, self.value);
        if let (Some(e), Some(c)) = (self.explained, self.cells) {
            s.push_str(&format!(", explains {e}/{c} cells"));
        }
        if let Some(se) = self.std_err {
            s.push_str(&format!(", ±{se:.1e}"));
        }
        if self.note.is_some() {
            s.push_str(", underdetermined");
        }
        s.push(')');
        s
    }
}

/// Mark each convention that `cfg` settles at `base`'s value (`matches_preset`). A caller
/// that settles again from an already settled `cfg` (the policy search) marks them against
/// the preset it started from.
/// `coefficients_only`: only `entropy_coeff` and `kl_coef` are marked again (the search's
/// own conventions, `policy` among them, keep their marks).
pub fn mark_preset(
    conventions: &mut [Convention],
    cfg: &LossConfig,
    base: &LossConfig,
    coefficients_only: bool,
) {
    for c in conventions
        .iter_mut()
        .filter(|c| !coefficients_only || matches!(c.name, "entropy_coeff" | "kl_coef"))
    {
        c.matches_preset = match c.name {
            "agg" => cfg.agg == base.agg,
            "kl_estimator" => {
                cfg.kl.as_ref().map(|k| k.estimator) == base.kl.as_ref().map(|k| k.estimator)
            }
            "entropy_coeff" => cfg.entropy_coeff == base.entropy_coeff,
            "loss_scale" => cfg.loss_scale == base.loss_scale,
            super::KL_TERM => false,
            _ => cfg.kl.as_ref().map(|k| k.coef) == base.kl.as_ref().map(|k| k.coef),
        };
    }
}
