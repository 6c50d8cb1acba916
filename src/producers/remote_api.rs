//! NexRL in remote-API mode (SPEC §2): `prepared_trajectories/step_N` (NexRL
//! trajectories with batch-level `advantages`, read by
//! [`nexrl_self_hosted::trajectories`]), `datums/step_N` (the shifted datums sent to the
//! training service) and `training_metrics/step_N`.

use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::model::step::{
    LogProbSource, LossRecord, RowMeta, TokenBatch, TokenPositions, TokenTensor,
};
use crate::model::trajectory::{Datum, DatumBatch, Provenance, TrajectoryBatch};
use crate::model::tree::Kind;
use crate::producers::{
    field, nexrl_self_hosted, opt_f64, opt_floats, opt_ints, scalar_of, seq, unreadable,
    StepMapping,
};
use crate::tensor::Tensor;
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

/// A remote-API `datums/` file's per-datum lists (engine log-probs, advantages, loss mask,
/// `loss_fn_inputs` of NexRL's remote-API trainer) as `[rows, T]` tensors right-padded
/// with 0 to the longest datum (the mask is 0 there): a cell of the step model.
///
/// Errors: a tensor that cannot be built (never for lists of numbers).
pub fn datum_batch(file: &Path, d: &DatumBatch) -> Result<TokenBatch> {
    let mut b = TokenBatch::default();
    let width = d
        .rows
        .iter()
        .map(|r| {
            r.loss_mask
                .as_ref()
                .or(r.logprobs.as_ref())
                .map_or(0, Vec::len)
        })
        .max()
        .unwrap_or(0);
    if let Some(t) = padded(file, d, width, |r| r.logprobs.as_ref(), LOGPROBS)? {
        b.log_probs.insert(LogProbSource::Rollout, t);
    }
    b.advantages = padded(file, d, width, |r| r.advantages.as_ref(), ADVANTAGES)?;
    b.loss_mask = padded(file, d, width, |r| r.loss_mask.as_ref(), LOSS_MASK)?;
    // A datum's lists run over the whole sequence (prompt positions masked out).
    b.positions = TokenPositions::Sequence;
    b.rows.extend(d.rows.iter().map(|r| RowMeta {
        sample: Some(r.index.to_string()),
        ..RowMeta::default()
    }));
    Ok(b)
}

/// One per-datum list of `d` (`get`, key `key`) as a `[rows, width]` tensor, 0 past a
/// datum's end; `None` when no datum has it.
fn padded(
    file: &Path,
    d: &DatumBatch,
    width: usize,
    get: for<'a, 'v> fn(&'a Datum<'v>) -> Option<&'a Vec<f64>>,
    key: &str,
) -> Result<Option<TokenTensor>> {
    if !d.rows.iter().any(|r| get(r).is_some()) {
        return Ok(None);
    }
    let mut values = vec![0.0; d.rows.len() * width];
    for (i, r) in d.rows.iter().enumerate() {
        for (j, x) in get(r).into_iter().flatten().take(width).enumerate() {
            values[i * width + j] = *x;
        }
    }
    let tensor = Tensor::from_f64(vec![d.rows.len(), width], &values)
        .map_err(|e| Error::format(file, Position::Key(key.into()), e.to_string()))?;
    Ok(Some(TokenTensor {
        tensor,
        dtype: None,
        source: Provenance {
            file: file.to_path_buf(),
            key: format!("{DATUMS}[*].{key}"),
        },
    }))
}

impl StepMapping for RemoteApi {
    fn cell_batch(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<TokenBatch>> {
        match kind {
            Kind::Datums => datum_batch(file, &datums(file, v)?).map(Some),
            _ => Ok(None),
        }
    }

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

impl super::StepReader for RemoteApi {
    fn name(&self) -> &'static str {
        "nexrl-remote-api"
    }

    fn detect(&self, root: &Path) -> bool {
        super::nexrl_tree::detect(root, crate::model::tree::Producer::RemoteApi)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        super::nexrl_tree::steps(root)
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<crate::model::step::StepDump> {
        super::nexrl_tree::read_step(root, step, self.name())
    }

    fn open_step(&self, root: &Path, step: i64) -> Result<Box<dyn crate::model::step::StepCells>> {
        Ok(Box::new(super::nexrl_tree::open_step(
            root,
            step,
            self.name(),
        )?))
    }
}
