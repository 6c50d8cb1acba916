//! NexRL in remote-API mode (SPEC §2): `prepared_trajectories/step_N` (NexRL
//! trajectories with batch-level `advantages`, read by
//! [`nexrl_self_hosted::trajectories`]), `datums/step_N` (the shifted datums sent to the
//! training service) and `training_metrics/step_N`.

use std::path::Path;

use crate::error::Result;
use crate::model::step::LossRecord;
use crate::model::trajectory::{Datum, DatumBatch, Provenance, TrajectoryBatch};
use crate::producers::layout::Kind;
use crate::producers::{
    field, nexrl_self_hosted, opt_f64, opt_floats, opt_ints, scalar_of, seq, unreadable,
    StepMapping,
};
use crate::value::Value;

/// `datums/`: the list of datums.
pub const DATUMS: &str = "datums";
/// A datum's `tokens[:-1]`.
pub const INPUT_TOKENS: &str = "input_tokens";
/// A datum's dict of per-token loss inputs.
pub const LOSS_FN_INPUTS: &str = "loss_fn_inputs";
/// `loss_fn_inputs`: `tokens[1:]`.
pub const TARGET_TOKENS: &str = "target_tokens";
/// `loss_fn_inputs`: the rollout engine's log-prob of each target token.
pub const LOGPROBS: &str = "logprobs";
/// `loss_fn_inputs`: the trajectory's advantage at each position.
pub const ADVANTAGES: &str = "advantages";
/// `loss_fn_inputs`: 1.0 on response targets.
pub const LOSS_MASK: &str = "loss_mask";

/// `training_metrics/`: the training service's metrics dict for the step.
pub const METRICS: &str = "metrics";

/// The loss record of a `training_metrics/` file: `metrics.loss`, `metrics.pg_loss`,
/// `metrics.entropy_loss` and every number of `metrics` (KL terms among them).
///
/// Errors: `metrics` present but not a dict; one of the loss terms not a number.
pub fn training_metrics(file: &Path, v: &Value) -> Result<LossRecord> {
    let mut rec = LossRecord {
        source: Some(Provenance {
            file: file.to_path_buf(),
            key: METRICS.into(),
        }),
        ..LossRecord::default()
    };
    let Some(m) = field(v, METRICS) else {
        return Ok(rec);
    };
    let items = m
        .as_dict()
        .ok_or_else(|| unreadable(file, METRICS, "a dict", m))?;
    let at = |k: &str| format!("{METRICS}.{k}");
    rec.loss = opt_f64(
        m,
        nexrl_self_hosted::LOSS,
        file,
        &at(nexrl_self_hosted::LOSS),
    )?;
    rec.pg_loss = opt_f64(
        m,
        nexrl_self_hosted::PG_LOSS,
        file,
        &at(nexrl_self_hosted::PG_LOSS),
    )?;
    rec.entropy_loss = opt_f64(
        m,
        nexrl_self_hosted::ENTROPY_LOSS,
        file,
        &at(nexrl_self_hosted::ENTROPY_LOSS),
    )?;
    for (k, x) in items {
        if let (Some(k), Some(x)) = (k.as_str(), scalar_of(x)) {
            if nexrl_self_hosted::KL_METRICS.contains(&k) {
                rec.kl.insert(k.to_string(), x);
            }
            rec.metrics.insert(k.to_string(), x);
        }
    }
    Ok(rec)
}

/// The trajectories of a `prepared_trajectories/` file (the NexRL trajectory format).
pub fn prepared_trajectories<'v>(file: &Path, v: &'v Value) -> Result<TrajectoryBatch<'v>> {
    nexrl_self_hosted::trajectories(file, v)
}

/// The datums of a `datums/` file read as `v`.
///
/// Errors: no `datums` list; a present field of the wrong type (named
/// `datums[i].loss_fn_inputs.key`).
pub fn datums<'v>(file: &Path, v: &'v Value) -> Result<DatumBatch<'v>> {
    let items = seq(v, DATUMS, file)?;
    let rows = items
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let inputs = field(d, LOSS_FN_INPUTS);
            let at = |k: &str| format!("{DATUMS}[{i}].{LOSS_FN_INPUTS}.{k}");
            let ints = |k: &str| match inputs {
                Some(f) => opt_ints(f, k, file, &at(k)),
                None => Ok(None),
            };
            let floats = |k: &str| match inputs {
                Some(f) => opt_floats(f, k, file, &at(k)),
                None => Ok(None),
            };
            Ok(Datum {
                index: i,
                input_tokens: opt_ints(
                    d,
                    INPUT_TOKENS,
                    file,
                    &format!("{DATUMS}[{i}].{INPUT_TOKENS}"),
                )?,
                target_tokens: ints(TARGET_TOKENS)?,
                logprobs: floats(LOGPROBS)?,
                advantages: floats(ADVANTAGES)?,
                loss_mask: floats(LOSS_MASK)?,
            })
        })
        .collect::<Result<_>>()?;
    Ok(DatumBatch {
        source: Provenance {
            file: file.to_path_buf(),
            key: DATUMS.into(),
        },
        rows,
    })
}

/// The remote-API mode's [`StepMapping`].
pub struct RemoteApi;

impl StepMapping for RemoteApi {
    fn trajectories<'v>(
        &self,
        kind: Kind,
        file: &Path,
        v: &'v Value,
    ) -> Result<Option<TrajectoryBatch<'v>>> {
        match kind {
            Kind::PreparedTrajectories => prepared_trajectories(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn datums<'v>(&self, kind: Kind, file: &Path, v: &'v Value) -> Result<Option<DatumBatch<'v>>> {
        match kind {
            Kind::Datums => datums(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn loss_record(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<LossRecord>> {
        match kind {
            Kind::TrainingMetrics => training_metrics(file, v).map(Some),
            _ => Ok(None),
        }
    }
}
