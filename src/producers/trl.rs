//! TRL's completion logs mapped into the model ([`StepDump`]) — text rows, no tokens.
//!
//! What TRL writes (trl 1.16, `trl/trainer/grpo_trainer.py` `GRPOTrainer._log_completions`
//! with `log_completions=True`): `{output_dir}/completions/completions_{step:05d}.parquet`,
//! one row per generated completion of the logged batch, with `step`, `prompt`,
//! `completion` (text, or a list of chat messages), one column per reward function and
//! `advantage`. The file is read by logscan's completions reader
//! ([`crate::logs::completions`], which also diagnoses blank or garbled completions); here
//! each row becomes a [`RowMeta`]: prompt and completion text, the reward (the reward
//! functions' sum, as TRL's unweighted default adds them) and the advantage. A folder is
//! recognised by holding such files (directly or in `completions/`); the step is the file
//! name's.

use std::path::{Path, PathBuf};

use super::{walk, StepReader};
use crate::error::{Error, Result};
use crate::logs::completions::{read, CompletionsFormat};
use crate::model::step::{RowMeta, StepDump, TokenBatch};

/// The TRL producer.
pub struct Trl;

/// The step of a `completions_{step:05d}.parquet` name.
fn step_of(p: &Path) -> Option<i64> {
    let digits = p
        .file_name()?
        .to_str()?
        .strip_prefix("completions_")?
        .strip_suffix(".parquet")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// `(step, false, file)` of every TRL completions file under `root`.
fn files(root: &Path) -> Result<Vec<(i64, bool, PathBuf)>> {
    Ok(walk::files_under(root)?
        .into_iter()
        .filter_map(|p| step_of(&p).map(|s| (s, false, p)))
        .collect())
}

impl StepReader for Trl {
    fn name(&self) -> &'static str {
        "trl"
    }

    fn detect(&self, root: &Path) -> bool {
        files(root).map(|f| !f.is_empty()).unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        Ok(walk::steps_of(&files(root)?))
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let mine: Vec<PathBuf> = files(root)?
            .into_iter()
            .filter(|f| f.0 == step)
            .map(|f| f.2)
            .collect();
        if mine.is_empty() {
            return Err(Error::input(
                root,
                format!(
                    "no TRL completions_{step:05}.parquet (steps there: {:?})",
                    self.steps(root)?
                ),
            ));
        }
        let mut rows = Vec::new();
        for f in &mine {
            let file = read(f, CompletionsFormat::TrlParquet)?;
            rows.extend(file.items.into_iter().enumerate().map(|(i, c)| RowMeta {
                sample: Some(i.to_string()),
                reward: c.reward,
                advantage: c.advantage,
                prompt_text: c.prompt,
                response_text: Some(c.text),
                ..RowMeta::default()
            }));
        }
        Ok(StepDump::whole_batch(
            self.name(),
            root,
            step,
            TokenBatch {
                rows,
                ..TokenBatch::default()
            },
            mine,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_the_file_names() {
        assert_eq!(step_of(Path::new("c/completions_00012.parquet")), Some(12));
        assert_eq!(step_of(Path::new("completions_7.parquet")), Some(7));
        assert_eq!(step_of(Path::new("completions_x1.parquet")), None);
        assert_eq!(step_of(Path::new("completions_00012.jsonl")), None);
    }
}
