//! AReaL's rollout dumps (`dump_to_file: true`) mapped into the model ([`StepDump`]).
//!
//! What AReaL writes (inclusionAI/AReaL 4aef98d8d818af55b43621aaadba047ae10f4e77,
//! `areal/infra/workflow_executor.py`, `WorkflowExecutor._dump_trajectory`):
//! `{log_path}/rollout/{tail_version}/{task_id}.jsonl` (`eval-rollout/` for evaluation),
//! one record per sample: `task_id`, `sample_idx`, `seqlen`, `prompt_len`,
//! `head_version`, `tail_version` (the oldest and newest weight versions that generated
//! the trajectory), `reward`, `prompt`, `completion` (text). No token ids or per-token
//! values: the model gets the rows (reward, lengths, staleness) and no log-probs.
//!
//! Role names, for readers of AReaL's in-memory batches (`areal/trainer/ppo/actor.py`):
//! `logprobs` is the ENGINE's (the behaviour policy, `old_logp` in its loss),
//! `prox_logp` the trainer's recompute (the proximal policy) — the opposite of verl's
//! `old_log_probs`. The step is the `tail_version` folder.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value as J;

use super::{walk, StepReader};
use crate::error::{Error, Position, Result};
use crate::model::step::{RowMeta, StepDump, TokenBatch};

/// The folder of training rollouts.
pub const ROLLOUT_DIR: &str = "rollout";
/// The folder of evaluation rollouts (not training steps).
pub const EVAL_DIR: &str = "eval-rollout";

/// The AReaL producer.
pub struct Areal;

/// `(tail_version, is_eval)` of a `{rollout|eval-rollout}/{version}/{task}.jsonl` path.
fn version_of(p: &Path) -> Option<(i64, bool)> {
    let stem = p.file_name()?.to_str()?.strip_suffix(".jsonl")?;
    stem.parse::<i64>().ok()?;
    let vdir = p.parent()?;
    let v: i64 = vdir.file_name()?.to_str()?.parse().ok()?;
    match vdir.parent()?.file_name()?.to_str()? {
        ROLLOUT_DIR => Some((v, false)),
        EVAL_DIR => Some((v, true)),
        _ => None,
    }
}

fn files(root: &Path) -> Result<Vec<(i64, bool, PathBuf)>> {
    Ok(walk::files_under(root)?
        .into_iter()
        .filter_map(|p| version_of(&p).map(|(v, e)| (v, e, p)))
        .collect())
}

impl StepReader for Areal {
    fn name(&self) -> &'static str {
        "areal"
    }

    fn detect(&self, root: &Path) -> bool {
        files(root).map(|f| !f.is_empty()).unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        Ok(walk::steps_of(&files(root)?))
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let all = files(root)?;
        let mine: Vec<&PathBuf> = all
            .iter()
            .filter(|f| f.0 == step && !f.1)
            .map(|f| &f.2)
            .collect();
        if mine.is_empty() {
            return Err(Error::input(
                root,
                format!(
                    "no AReaL rollout of version {step} (versions there: {:?})",
                    self.steps(root)?
                ),
            ));
        }
        let mut rows = Vec::new();
        let mut unplaced = BTreeSet::new();
        for f in &mine {
            let text = super::walk::read_to_string(f)?;
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let at = Position::Line(i as u64 + 1);
                let r: J = serde_json::from_str(line)
                    .map_err(|e| Error::format(f, at.clone(), format!("not JSON: {e}")))?;
                let int = |k: &str| -> Result<Option<i64>> {
                    r.get(k)
                        .filter(|v| !v.is_null())
                        .map(|v| {
                            v.as_i64().ok_or_else(|| {
                                Error::format(
                                    f,
                                    at.clone(),
                                    format!("key {k}: expected an integer"),
                                )
                            })
                        })
                        .transpose()
                };
                let (seqlen, prompt_len) = (int("seqlen")?, int("prompt_len")?);
                rows.push(RowMeta {
                    group: int("task_id")?.map(|t| t.to_string()),
                    sample: match (int("task_id")?, int("sample_idx")?) {
                        (Some(t), Some(s)) => Some(format!("{t}/{s}")),
                        _ => None,
                    },
                    reward: r.get("reward").and_then(J::as_f64),
                    prompt_len: prompt_len.map(|x| x.max(0) as usize),
                    response_len: seqlen.zip(prompt_len).map(|(s, p)| (s - p).max(0) as usize),
                    version: int("head_version")?,
                    prompt_text: r.get("prompt").and_then(J::as_str).map(str::to_string),
                    response_text: r.get("completion").and_then(J::as_str).map(str::to_string),
                    ..RowMeta::default()
                });
                for k in r.as_object().map(|o| o.keys()).into_iter().flatten() {
                    if ![
                        "task_id",
                        "sample_idx",
                        "seqlen",
                        "prompt_len",
                        "head_version",
                        "tail_version",
                        "reward",
                    ]
                    .contains(&k.as_str())
                    {
                        unplaced.insert(format!("{}: {k}", f.display()));
                    }
                }
            }
        }
        Ok(StepDump {
            unplaced: unplaced.into_iter().collect(),
            ..StepDump::whole_batch(
                "areal",
                root,
                step,
                TokenBatch {
                    rows,
                    ..TokenBatch::default()
                },
                mine.into_iter().cloned().collect(),
            )
        })
    }
}
