//! NeMo-RL's `train_data_step{N}.jsonl` mapped into the model ([`StepDump`]).
//!
//! What NeMo-RL writes (NVIDIA-NeMo/RL 7ea279abfbeb698b092856d0dab61e7cf39bc909,
//! `nemo_rl/algorithms/grpo.py` ~3630 builds `log_data`; `nemo_rl/utils/logger.py`
//! `Logger.log_batched_dict_as_jsonl` writes it): the training batch cut in micro-batches
//! of one row, so every value is a length-1 list, plus the row's `idx`; per-token lists
//! are the padded batch's rows (right-padded to the longest sequence). Keys:
//! `token_ids` (prompt ++ response), `token_loss_mask` (1 on generated assistant tokens),
//! `generation_logprobs` (the engine's), `prev_logprobs` (the trainer's before the
//! update), `advantages` (expanded over the whole row, `advantage_estimator.py`),
//! `rewards`, `input_lengths` (unpadded length), `sample_loss_mask`, `content` (text).
//! Column t is sequence token t and holds `log p(token t | tokens < t)`, prompt positions
//! 0 (the loss reads `[:, 1:]`, `loss/loss_functions.py`): [`TokenPositions::Sequence`].
//! The step is the file name's `N` (`total_steps + 1`); the file sits in
//! `{log_dir}/exp_{k}/`.

use std::path::{Path, PathBuf};

use serde_json::Value as J;

use super::columns::{listed, padded_f64, padded_i64};
use super::walk;
use super::StepReader;
use crate::error::{Error, Position, Result};
use crate::model::step::{LogProbSource, RowMeta, StepDump, TokenBatch, TokenPositions};

/// The file name's prefix and suffix.
pub const PREFIX: &str = "train_data_step";
/// Per-token keys and their role.
pub const GENERATION_LOGPROBS: &str = "generation_logprobs";
/// The trainer's log-probs before the update.
pub const PREV_LOGPROBS: &str = "prev_logprobs";
/// The reference policy's log-probs (dumped by some NeMo-RL versions' loss inputs).
pub const REFERENCE_LOGPROBS: &str = "reference_policy_logprobs";
const TOKEN_IDS: &str = "token_ids";
const TOKEN_LOSS_MASK: &str = "token_loss_mask";
const ADVANTAGES: &str = "advantages";
const REWARDS: &str = "rewards";
const INPUT_LENGTHS: &str = "input_lengths";
const IDX: &str = "idx";

/// The NeMo-RL producer.
pub struct NemoRl;

/// The step of a `train_data_step{N}.jsonl` name.
fn step_of_name(p: &Path) -> Option<i64> {
    let name = p.file_name()?.to_str()?;
    name.strip_prefix(PREFIX)?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

fn step_files(root: &Path) -> Result<Vec<(i64, PathBuf)>> {
    Ok(walk::files_under(root)?
        .into_iter()
        .filter_map(|p| Some((step_of_name(&p)?, p)))
        .collect())
}

/// `v`, unwrapped from the length-1 list every value is written in.
fn unwrap1<'a>(v: &'a J, file: &Path, line: usize, key: &str) -> Result<&'a J> {
    match v {
        J::Array(a) if a.len() == 1 => Ok(&a[0]),
        _ => Err(Error::format(
            file,
            Position::Line(line as u64),
            format!("key {key}: expected a length-1 list (one row per line)"),
        )),
    }
}

fn nums(v: &J, file: &Path, line: usize, key: &str) -> Result<Vec<f64>> {
    v.as_array()
        .and_then(|a| a.iter().map(J::as_f64).collect::<Option<Vec<f64>>>())
        .ok_or_else(|| {
            Error::format(
                file,
                Position::Line(line as u64),
                format!("key {key}: expected a list of numbers"),
            )
        })
}

impl StepReader for NemoRl {
    fn name(&self) -> &'static str {
        "nemo-rl"
    }

    fn detect(&self, root: &Path) -> bool {
        step_files(root).map(|f| !f.is_empty()).unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        let mut s: Vec<i64> = step_files(root)?.into_iter().map(|(s, _)| s).collect();
        s.sort_unstable();
        s.dedup();
        Ok(s)
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let all = step_files(root)?;
        let files: Vec<PathBuf> = all
            .iter()
            .filter(|(s, _)| *s == step)
            .map(|(_, p)| p.clone())
            .collect();
        let file = match files.as_slice() {
            [one] => one.clone(),
            [] => {
                let steps: Vec<i64> = all.iter().map(|(s, _)| *s).collect();
                return Err(Error::input(root, format!("no {PREFIX}{step}.jsonl (steps there: {steps:?})")));
            }
            many => {
                return Err(Error::input(
                    root,
                    format!("{} files {PREFIX}{step}.jsonl (one per experiment folder): point at one exp_* folder", many.len()),
                ))
            }
        };
        read_file(root, step, &file)
    }
}

fn read_file(root: &Path, step: i64, file: &Path) -> Result<StepDump> {
    let text = super::walk::read_to_string(file)?;
    let keys = [
        GENERATION_LOGPROBS,
        PREV_LOGPROBS,
        REFERENCE_LOGPROBS,
        TOKEN_IDS,
        TOKEN_LOSS_MASK,
        ADVANTAGES,
    ];
    let mut cols: Vec<Vec<Vec<f64>>> = vec![Vec::new(); keys.len()];
    let mut present = [false; 6];
    let mut rows = Vec::new();
    let mut unplaced = std::collections::BTreeSet::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let ln = i + 1;
        let rec: J = serde_json::from_str(line).map_err(|e| {
            Error::format(
                file,
                Position::LineColumn(ln as u64, e.column() as u64),
                format!("not JSON: {e}"),
            )
        })?;
        let obj = rec.as_object().ok_or_else(|| {
            Error::format(
                file,
                Position::Line(ln as u64),
                "expected a JSON object per line",
            )
        })?;
        for (k, key) in keys.iter().enumerate() {
            match obj.get(*key) {
                Some(v) => {
                    present[k] = true;
                    cols[k].push(nums(unwrap1(v, file, ln, key)?, file, ln, key)?);
                }
                None => cols[k].push(Vec::new()),
            }
        }
        let scalar = |key: &str| -> Result<Option<f64>> {
            obj.get(key)
                .map(|v| {
                    unwrap1(v, file, ln, key)?.as_f64().ok_or_else(|| {
                        Error::format(
                            file,
                            Position::Line(ln as u64),
                            format!("key {key}: expected a number"),
                        )
                    })
                })
                .transpose()
        };
        let mask = &cols[4][cols[4].len() - 1];
        let first = mask.iter().position(|&m| m != 0.0);
        rows.push(RowMeta {
            sample: obj.get(IDX).map(|v| v.to_string()),
            reward: scalar(REWARDS)?,
            prompt_len: first,
            response_len: present[4].then(|| mask.iter().filter(|&&m| m != 0.0).count()),
            ..RowMeta::default()
        });
        if let Some(len) = scalar(INPUT_LENGTHS)? {
            if len as usize > cols[3].last().map_or(0, Vec::len) && present[3] {
                return Err(Error::format(
                    file,
                    Position::Line(ln as u64),
                    "input_lengths longer than token_ids",
                ));
            }
        }
        for k in obj.keys() {
            if !keys.contains(&k.as_str()) && ![REWARDS, INPUT_LENGTHS, IDX].contains(&k.as_str()) {
                unplaced.insert(format!("{}: {k}", file.display()));
            }
        }
    }
    let mut b = TokenBatch {
        positions: TokenPositions::Sequence,
        rows,
        ..TokenBatch::default()
    };
    let f = |k: usize| present[k].then(|| listed(padded_f64(&cols[k]), file, keys[k]));
    let ints = |k: usize| {
        present[k].then(|| {
            let r: Vec<Vec<i64>> = cols[k]
                .iter()
                .map(|r| r.iter().map(|&x| x as i64).collect())
                .collect();
            listed(padded_i64(&r), file, keys[k])
        })
    };
    for (k, role) in [
        (0, LogProbSource::Rollout),
        (1, LogProbSource::Old),
        (2, LogProbSource::Reference),
    ] {
        if let Some(t) = f(k) {
            b.log_probs.insert(role, t);
        }
    }
    b.input_ids = ints(3);
    b.response_mask = ints(4);
    b.advantages = f(5);
    Ok(StepDump {
        unplaced: unplaced.into_iter().collect(),
        ..StepDump::whole_batch("nemo-rl", root, step, b, vec![file.to_path_buf()])
    })
}
