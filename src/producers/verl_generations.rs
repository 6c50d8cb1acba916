//! verl's generation dumps (`trainer.rollout_data_dir`, `trainer.validation_data_dir`)
//! mapped into the model ([`StepDump`]) — text rows, no tokens.
//!
//! What verl writes (verl 0.9.1, PyPI wheel, `verl/trainer/ppo/ray_trainer.py`):
//! `RayPPOTrainer._write_generations` (l.454–477, a staticmethod run by
//! `_dump_generations` in a background thread) writes `{dump_path}/{global_steps}.jsonl`,
//! one `json.dumps(entry, ensure_ascii=False, default=str)` line per sample with `input`
//! (the decoded prompt), `output` (the decoded response), `gts` (the sample's
//! `reward_model.ground_truth`, any JSON value), `score` (`token_level_scores.sum(-1)`),
//! `step` (`global_steps`), then every reward extra whose list has one value per sample
//! (`acc`, `request_id`, …). `_log_rollout_data` (l.514) calls it for training rollouts
//! (`rollout_data_dir`), `_validate` (l.698) for validation (`validation_data_dir`).
//!
//! A file is recognised by its name (`{step}.jsonl`) and its first record's keys (`input`,
//! `output`, `score`, `step`): AReaL's `{task}.jsonl` records and NeMo-RL's
//! `train_data_step{N}.jsonl` have neither. A file under a folder whose name holds `val`
//! is a validation dump: its step is listed only when no training dump has it.
//!
//! The rows carry score, sample index and the decoded prompt and response ([`RowMeta`]);
//! `gts` and the extras are read by [`read_generations`] ([`GenerationRow`]), and
//! logscan's completions forensics (`src/logs/completions.rs`) reads the same files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value as J;

use super::{walk, StepReader};
use crate::error::{Error, Position, Result};
use crate::model::step::{RowMeta, StepDump, TokenBatch};

/// The keys every record of `_write_generations` holds.
pub const KEYS: [&str; 5] = ["input", "output", "gts", "score", "step"];

/// The verl generations producer.
pub struct VerlGenerations;

/// One sample of a generation dump, as verl wrote it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GenerationRow {
    /// 0-based index of the record in its file.
    pub index: usize,
    /// The decoded prompt.
    pub input: String,
    /// The decoded response.
    pub output: String,
    /// The ground truth: its text, or its JSON text when not a string; `None` when the
    /// dataset has none (`null`).
    pub gts: Option<String>,
    /// The sequence score (`token_level_scores.sum(-1)`).
    pub score: Option<f64>,
    /// `global_steps` at the dump.
    pub step: i64,
    /// Reward extras that are numbers (`acc`, …), by key.
    pub extras: BTreeMap<String, f64>,
    /// Reward extras that are not numbers (`request_id`, …), as JSON text, by key.
    pub text_extras: BTreeMap<String, String>,
}

/// `(step, validation)` of a verl generation file, by name and first record.
fn generation_file(p: &Path) -> Option<(i64, bool)> {
    let step: i64 = p
        .file_name()?
        .to_str()?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()?;
    let head = walk::head(p, 64 * 1024);
    let first = String::from_utf8_lossy(&head);
    let line = first.lines().find(|l| !l.trim().is_empty())?;
    // a first line longer than the head is still recognised by its leading keys
    let keys_seen = KEYS
        .iter()
        .filter(|k| line.contains(&format!("\"{k}\":")))
        .count();
    if !(line.trim_start().starts_with('{') && keys_seen >= 4) {
        return None;
    }
    let val = p
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.to_ascii_lowercase().contains("val"));
    Some((step, val))
}

fn files(root: &Path) -> Result<Vec<(i64, bool, PathBuf)>> {
    Ok(walk::files_under(root)?
        .into_iter()
        .filter_map(|p| generation_file(&p).map(|(s, v)| (s, v, p)))
        .collect())
}

/// The records of one generation file.
///
/// Errors: a line that is not a JSON object, or a key of the wrong type (`input`/`output`
/// not text, `score` not a number, `step` not an integer), named with file and line.
pub fn read_generations(file: &Path) -> Result<Vec<GenerationRow>> {
    let text = walk::read_to_string(file)?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = Position::Line(i as u64 + 1);
        let bad = |msg: String| Error::format(file, at.clone(), msg);
        let r: J = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let o = r
            .as_object()
            .ok_or_else(|| bad("expected a JSON object (a verl generation record)".into()))?;
        let text_of = |k: &str| -> Result<String> {
            match o.get(k) {
                Some(J::String(s)) => Ok(s.clone()),
                Some(J::Null) | None => Ok(String::new()),
                Some(x) => Err(bad(format!("key {k}: expected text, found {x}"))),
            }
        };
        let score = match o.get("score") {
            Some(J::Null) | None => None,
            Some(x) => Some(
                x.as_f64()
                    .ok_or_else(|| bad(format!("key score: expected a number, found {x}")))?,
            ),
        };
        let step = o
            .get("step")
            .and_then(J::as_i64)
            .ok_or_else(|| bad("key step: missing or not an integer".into()))?;
        let (mut extras, mut text_extras) = (BTreeMap::new(), BTreeMap::new());
        for (k, v) in o.iter().filter(|(k, _)| !KEYS.contains(&k.as_str())) {
            match v.as_f64() {
                Some(x) => {
                    extras.insert(k.clone(), x);
                }
                None => {
                    let t = v.as_str().map(str::to_string).unwrap_or(v.to_string());
                    text_extras.insert(k.clone(), t);
                }
            }
        }
        out.push(GenerationRow {
            index: out.len(),
            input: text_of("input")?,
            output: text_of("output")?,
            gts: o.get("gts").filter(|g| !g.is_null()).map(|g| {
                g.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| g.to_string())
            }),
            score,
            step,
            extras,
            text_extras,
        });
    }
    Ok(out)
}

impl StepReader for VerlGenerations {
    fn name(&self) -> &'static str {
        "verl-generations"
    }

    fn detect(&self, root: &Path) -> bool {
        files(root).map(|f| !f.is_empty()).unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        // the training steps; the validation ones when there are none
        let f = files(root)?;
        let train = walk::steps_of(&f);
        if !train.is_empty() {
            return Ok(train);
        }
        let s: BTreeSet<i64> = f.iter().map(|x| x.0).collect();
        Ok(s.into_iter().collect())
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let all = files(root)?;
        let of_step: Vec<&(i64, bool, PathBuf)> = all.iter().filter(|f| f.0 == step).collect();
        // training rollouts first; a validation dump only when the step has no other
        let train: Vec<&PathBuf> = of_step.iter().filter(|f| !f.1).map(|f| &f.2).collect();
        let mine: Vec<&PathBuf> = if train.is_empty() {
            of_step.iter().map(|f| &f.2).collect()
        } else {
            train
        };
        if mine.is_empty() {
            return Err(Error::input(
                root,
                format!(
                    "no verl generation dump {{step}}.jsonl of step {step} (steps there: {:?})",
                    self.steps(root)?
                ),
            ));
        }
        let mut rows = Vec::new();
        for f in &mine {
            for g in read_generations(f)? {
                if g.step != step {
                    return Err(Error::format(
                        f,
                        Position::Line(g.index as u64 + 1),
                        format!("record of step {} in the file of step {step}", g.step),
                    ));
                }
                rows.push(RowMeta {
                    sample: Some(g.index.to_string()),
                    reward: g.score,
                    prompt_text: Some(g.input),
                    response_text: Some(g.output),
                    ..RowMeta::default()
                });
            }
        }
        Ok(StepDump::whole_batch(
            self.name(),
            root,
            step,
            TokenBatch {
                rows,
                ..TokenBatch::default()
            },
            mine.into_iter().cloned().collect(),
        ))
    }
}
