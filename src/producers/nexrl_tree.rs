//! A NexRL dump tree's step read into the model ([`StepDump`]): the three layouts NexRL
//! writes (self-hosted, weaver, remote-API; `readers::layout` tells them apart by their
//! folders) share one walk — every file of the step is read once and handed to its
//! producer's [`StepMapping`], and the records land in the rank × micro cell the file's
//! name gives. What the files state about the loss's conventions (`extra_info`'s
//! coefficients, `loss_agg_mode`, `loss_scale_factor`, `kl_loss_type`) goes into the
//! conventions record with the file and key that state it.
//!
//! Layouts: NexRL `nexrl/trainer/self_hosted_trainer.py` and the weaver / remote-API
//! trainers' dump hooks write `DIR/<kind>/step_N[_rankR][_microM].<ext>` (see
//! [`super::layout`] and [`super::nexrl_self_hosted`] for the keys and the commit read).

use std::collections::BTreeMap;
use std::path::Path;

use super::layout::{DumpFile, DumpTree, Kind, Producer};
use super::nexrl_self_hosted as keys;
use super::{mapping, StepMapping};
use crate::error::{Error, Position, Result};
use crate::formats::read_any;
use crate::model::conventions::{ConventionKey, ConventionSource, ConventionValue, Conventions};
use crate::model::step::{
    Cell, LogProbSource, RowMeta, StepDump, TokenBatch, TokenPositions, TokenTensor,
};
use crate::model::trajectory::{Datum, DatumBatch, Provenance};
use crate::tensor::Tensor;
use crate::value::Value;

/// Whether `root` is a NexRL dump folder whose layout is `producer`.
pub(crate) fn detect(root: &Path, producer: Producer) -> bool {
    root.is_dir() && DumpTree::discover(root).is_ok_and(|t| t.producer == producer)
}

/// The steps of the NexRL dump folder `root`, ascending.
///
/// Errors: `root` not a dump folder.
pub(crate) fn steps(root: &Path) -> Result<Vec<i64>> {
    Ok(DumpTree::discover(root)?.steps().into_iter().collect())
}

/// Step `step` of the NexRL dump folder `root` in the model, read by `name`'s mapping.
///
/// Errors: `root` not a dump folder; no file of `step` (naming the steps there are); a
/// file unreadable or a key of the wrong type (named with file and key).
pub(crate) fn read_step(root: &Path, step: i64, name: &str) -> Result<StepDump> {
    let tree = DumpTree::discover(root)?;
    let files: Vec<&DumpFile> = tree.files().iter().filter(|f| f.step == step).collect();
    if files.is_empty() {
        return Err(Error::input(
            &tree.root,
            format!(
                "no files of step {step} (steps there: {:?})",
                tree.steps().into_iter().collect::<Vec<_>>()
            ),
        ));
    }
    let map = mapping(tree.producer);
    let mut cells: BTreeMap<(usize, Option<usize>), Cell> = BTreeMap::new();
    let mut conventions = Conventions::default();
    let mut unplaced: Vec<String> = tree
        .unrecognised
        .iter()
        .map(|u| format!("{}: {}", u.path.display(), u.reason))
        .collect();
    for f in files {
        if matches!(f.kind, Kind::Param | Kind::Gradient) {
            // A step's cells hold what the loss saw; parameters are read by `inspect`.
            unplaced.push(format!(
                "{}: a {} file (parameters are not part of a step's cells)",
                f.path.display(),
                f.kind
            ));
            continue;
        }
        let v = read_any(&f.path)?;
        let at = (f.rank.unwrap_or(0) as usize, f.micro.map(|m| m as usize));
        let cell = cells.entry(at).or_insert_with(|| Cell {
            rank: at.0,
            micro: at.1,
            ..Cell::default()
        });
        cell.files.push(f.path.clone());
        if !place(map, f, &v, cell, &mut conventions)? {
            unplaced.push(format!(
                "{}: a {} file its producer's mapping holds nothing of",
                f.path.display(),
                f.kind
            ));
        }
    }
    Ok(StepDump {
        producer: name.to_string(),
        root: tree.root.clone(),
        step,
        cells: cells.into_values().collect(),
        conventions,
        unplaced,
    })
}

/// Put what file `f` (read as `v`) holds into `cell` (and its stated conventions into
/// `conventions`); false when the mapping has no record of it.
fn place(
    map: &dyn StepMapping,
    f: &DumpFile,
    v: &Value,
    cell: &mut Cell,
    conventions: &mut Conventions,
) -> Result<bool> {
    if let Some(b) = map.token_batch(f.kind, &f.path, v)? {
        merge(&mut cell.batch, b);
        return Ok(true);
    }
    if let Some(rec) = map.loss_record(f.kind, &f.path, v)? {
        stated(&f.path, v, &rec.coefficients, conventions);
        cell.loss = Some(rec);
        return Ok(true);
    }
    if let Some(t) = map.trajectories(f.kind, &f.path, v)? {
        cell.batch.rows.extend(t.rows.iter().map(|r| RowMeta {
            group: r.group.clone(),
            sample: Some(r.index.to_string()),
            reward: r.reward,
            advantage: r.advantage,
            response_len: r.tokens.as_ref().map(|t| t.len()),
            ..RowMeta::default()
        }));
        return Ok(true);
    }
    if let Some(d) = map.datums(f.kind, &f.path, v)? {
        datums(&f.path, &d, &mut cell.batch)?;
        return Ok(true);
    }
    Ok(false)
}

/// `from`'s tensors into `into` where `into` has none (a cell's files each hold some).
fn merge(into: &mut TokenBatch, from: TokenBatch) {
    for (k, t) in from.log_probs {
        into.log_probs.entry(k).or_insert(t);
    }
    let fill = |a: &mut Option<TokenTensor>, b: Option<TokenTensor>| {
        if a.is_none() {
            *a = b;
        }
    };
    fill(&mut into.entropy, from.entropy);
    fill(&mut into.response_mask, from.response_mask);
    fill(&mut into.input_ids, from.input_ids);
    fill(&mut into.attention_mask, from.attention_mask);
    fill(&mut into.advantages, from.advantages);
    fill(&mut into.loss_mask, from.loss_mask);
    fill(&mut into.ratio, from.ratio);
    fill(&mut into.per_token_loss, from.per_token_loss);
    fill(&mut into.token_rewards, from.token_rewards);
    fill(&mut into.importance_weights, from.importance_weights);
    fill(&mut into.response_ids, from.response_ids);
    into.rows.extend(from.rows);
}

/// A remote-API `datums/` file's per-datum lists (engine log-probs, advantages, loss mask,
/// `loss_fn_inputs` of NexRL's remote-API trainer) as `[rows, T]` tensors right-padded
/// with 0 to the longest datum (the mask is 0 there).
///
/// Errors: a tensor that cannot be built (never for lists of numbers).
fn datums(file: &Path, d: &DatumBatch, b: &mut TokenBatch) -> Result<()> {
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
    use super::remote_api::{ADVANTAGES, LOGPROBS, LOSS_MASK};
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
    Ok(())
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
            key: format!("{}[*].{key}", super::remote_api::DATUMS),
        },
    }))
}

/// The conventions a loss file states in its `extra_info`: the coefficients the mapping
/// read (`coefficients`), `loss_agg_mode` with `loss_scale_factor`, `kl_loss_type`.
/// The first file that states one wins; the others state the same in every NexRL dump
/// (the trainer's config), and a later difference is the judge's to find per cell.
fn stated(
    file: &Path,
    v: &Value,
    coefficients: &BTreeMap<String, f64>,
    conventions: &mut Conventions,
) {
    let mut set = |key: ConventionKey, value: ConventionValue, k: &str| {
        if conventions.get(key).is_none() {
            conventions.set(
                key,
                value,
                ConventionSource::Dumped {
                    at: Provenance {
                        file: file.to_path_buf(),
                        key: format!("{}.{k}", keys::EXTRA_INFO),
                    },
                },
            );
        }
    };
    if let Some(c) = coefficients.get(keys::ENTROPY_COEFF) {
        set(
            ConventionKey::EntropyCoeff,
            ConventionValue::Number(*c),
            keys::ENTROPY_COEFF,
        );
    }
    for k in [keys::KL_COEF, keys::KL_LOSS_COEF] {
        if let Some(c) = coefficients.get(k) {
            set(ConventionKey::KlCoeff, ConventionValue::Number(*c), k);
        }
    }
    if let Some((mode, scale)) = keys::loss_agg_mode(v) {
        set(
            ConventionKey::Aggregation,
            ConventionValue::Name(mode),
            keys::LOSS_AGG_MODE,
        );
        if let Some(s) = scale {
            set(
                ConventionKey::LossScale,
                ConventionValue::Number(s),
                keys::LOSS_SCALE_FACTOR,
            );
        }
    }
    if let Some(t) = v
        .get(keys::EXTRA_INFO)
        .and_then(|e| e.get(keys::KL_LOSS_TYPE))
        .and_then(Value::as_str)
    {
        set(
            ConventionKey::KlEstimator,
            ConventionValue::Name(t.to_string()),
            keys::KL_LOSS_TYPE,
        );
    }
}
