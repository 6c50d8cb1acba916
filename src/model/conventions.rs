//! The conventions record of one side of a step: each convention a tool needs to judge
//! the side's numbers (row order, padding, aggregation, coefficients, ratio level, clip
//! bounds, loss scale, dtypes, …), with its value and where the value came from.
//! Producers fill what their files state; the judge adds what it inferred (with its fit)
//! or what a flag gave; a tool reads conventions only here, once.

use std::collections::BTreeMap;

use crate::model::trajectory::Provenance;

/// A convention a side of a step follows. The names are the model's, not a producer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConventionKey {
    /// Order of the per-row tensors relative to the trajectories (batch / arrival order).
    RowOrder,
    /// Token id that pads rows.
    PadId,
    /// Left or right padding.
    PaddingSide,
    /// How per-token losses become a scalar (token-mean, seq-mean-token-sum, …).
    Aggregation,
    /// Token-level or sequence-level (GSPO) importance ratio.
    RatioLevel,
    /// Lower PPO clip bound ε_low.
    ClipLow,
    /// Upper PPO clip bound ε_high (DAPO clip-higher when ≠ ε_low).
    ClipHigh,
    /// Dual-clip constant c (PPO dual clip), when used.
    ClipDual,
    /// Coefficient of the entropy bonus.
    EntropyCoeff,
    /// Coefficient of the KL penalty.
    KlCoeff,
    /// KL estimator (k1, k2, k3, low-var-kl).
    KlEstimator,
    /// Factor the loss is scaled by before backward (rows / global batch, 1/grad-accum).
    LossScale,
    /// Importance-sampling correction against the engine's log-probs (none, TIS cap, mask band).
    ImportanceSampling,
    /// Temperature the log-probs' logits were divided by.
    Temperature,
    /// Advantage estimator / normalisation (GRPO group mean/std, Dr. GRPO no std, …).
    AdvantageNorm,
    /// Stored dtype of the log-probs.
    LogProbDtype,
    /// Micro-batch sizes (rows per micro, in order).
    MicroSizes,
}

/// Where a convention's value came from, strongest evidence first.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ConventionSource {
    /// Stated by the producer's files.
    Dumped {
        /// File and key that state it.
        at: Provenance,
    },
    /// Inferred from the data, with the fit that chose it.
    Inferred {
        /// What was compared and how well it fitted (e.g. "loss reproduced on 22/24 cells,
        /// max rel err 3e-7").
        fit: String,
        /// The alternatives tried and rejected, each with why.
        rejected: Vec<String>,
    },
    /// Given on the command line or in a mapping file.
    Flag {
        /// The flag or file that gave it.
        name: String,
    },
    /// The producer's documented default, not stated anywhere in this step.
    Default {
        /// Whose default (file and commit of the producer's code).
        whose: String,
    },
}

/// A convention's value: a number, or a named choice.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum ConventionValue {
    /// A coefficient, bound, pad id, scale.
    Number(f64),
    /// A named choice (`token-mean`, `left`, `sequence`, `bfloat16`).
    Name(String),
    /// A list of sizes (micro sizes).
    Sizes(Vec<usize>),
}

/// One convention: its value and its evidence.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Convention {
    /// The value.
    pub value: ConventionValue,
    /// Where it came from.
    pub source: ConventionSource,
}

/// Every convention known for one side of a step.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Conventions {
    /// By key; a key absent here is unknown (not dumped, not inferred yet).
    pub entries: BTreeMap<ConventionKey, Convention>,
}

impl Conventions {
    /// The convention `key`, when known.
    pub fn get(&self, key: ConventionKey) -> Option<&Convention> {
        self.entries.get(&key)
    }

    /// Its value as a number, when known and numeric.
    pub fn number(&self, key: ConventionKey) -> Option<f64> {
        match self.get(key)?.value {
            ConventionValue::Number(x) => Some(x),
            _ => None,
        }
    }

    /// Record `key`; stronger evidence is not overwritten by weaker (dumped beats flag
    /// beats inferred beats default), so producers and the judge may fill in any order.
    pub fn set(&mut self, key: ConventionKey, value: ConventionValue, source: ConventionSource) {
        let rank = |s: &ConventionSource| match s {
            ConventionSource::Dumped { .. } => 3,
            ConventionSource::Flag { .. } => 2,
            ConventionSource::Inferred { .. } => 1,
            ConventionSource::Default { .. } => 0,
        };
        if let Some(old) = self.entries.get(&key) {
            if rank(&old.source) > rank(&source) {
                return;
            }
        }
        self.entries.insert(key, Convention { value, source });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumped_value_is_not_overwritten_by_an_inferred_one() {
        let mut c = Conventions::default();
        let at = Provenance {
            file: "loss/rank_0.pt".into(),
            key: "extra_info.entropy_coeff".into(),
        };
        c.set(
            ConventionKey::EntropyCoeff,
            ConventionValue::Number(0.001),
            ConventionSource::Dumped { at },
        );
        c.set(
            ConventionKey::EntropyCoeff,
            ConventionValue::Number(0.0),
            ConventionSource::Inferred {
                fit: "x".into(),
                rejected: vec![],
            },
        );
        assert_eq!(c.number(ConventionKey::EntropyCoeff), Some(0.001));
        c.set(
            ConventionKey::ClipHigh,
            ConventionValue::Number(0.2),
            ConventionSource::Default {
                whose: "verl".into(),
            },
        );
        c.set(
            ConventionKey::ClipHigh,
            ConventionValue::Number(0.28),
            ConventionSource::Flag {
                name: "--clip-high".into(),
            },
        );
        assert_eq!(c.number(ConventionKey::ClipHigh), Some(0.28));
        assert_eq!(c.number(ConventionKey::PadId), None);
    }
}
