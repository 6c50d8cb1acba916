//! The completions themselves (the generated text, not its metrics), as the producers
//! write them:
//!
//! - TRL `completions/completions_{step:05d}.parquet`: `GRPOTrainer.log` writes one
//!   table per logging step with columns `step`, `prompt`, `completion`, one column per
//!   reward function, the user's extra columns and `advantage`; `prompt`/`completion` are
//!   strings, or lists of `{role, content}` messages for conversational data
//!   (trl/trainer/grpo_trainer.py, huggingface/trl@d2b69d769dab6f77acbfd33252bcd7d22765571b,
//!   the same in trl 1.16.0 that wrote `fixtures/completions/`).
//! - The same table logged to W&B (`wandb.Table(dataframe=df)`), saved by wandb as
//!   `files/media/table/completions_<n>_<hash>.table.json`: `{"columns": [...], "data":
//!   [[...], ...]}` (fixtures written by wandb 0.31 offline).
//! - verl `trainer.rollout_data_dir` / `validation_data_dir`: `{global_step}.jsonl`, one
//!   object per sample with `input`, `output`, `gts`, `score`, `step` and the reward's
//!   extra infos (`RayPPOTrainer._dump_generations`, verl/trainer/ppo/ray_trainer.py,
//!   volcengine/verl@3d9df73353a546a98235b38653c2c163efb51420). Any JSONL whose objects hold
//!   a prompt (`input`/`prompt`) and a completion (`output`/`completion`/`response`) is
//!   read the same way.
//! - AReaL's RLVR workflow dump (`dump_dir/<version>/<qid>.txt`): blocks of
//!   `idx: i / n, seqlen: L, reward is R.` / `prompt is` / `sequence is:` with colorama
//!   escapes around the text (areal/workflow/rlvr.py,
//!   inclusionAI/AReaL@072480e26a1dc2ac1692164e504315d7e508478b).
//!
//! - verl's validation generations in TensorBoard (`trainer.logger` with `tensorboard`):
//!   `add_text("val/generations", …)`, per sample a markdown block `### Sample i` /
//!   `**Input:** …` / `**Output:** …` / `**Score:** …` (`ValidationGenerationsLogger.
//!   log_generations_to_tensorboard`, verl/utils/tracking.py, verl 0.9.1 from PyPI that
//!   wrote `fixtures/completions/verl_tb_*`). Another text summary whose tag names
//!   completions, generations, samples or responses is one completion.
//!
//! A reader returns the records; it never judges (`detect::completions_text` does).

use std::path::{Path, PathBuf};

use polars::prelude::{AnyValue, DataType, ParquetReader, SerReader};

use crate::error::{Error, Position, Result};

/// One generated completion.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Completion {
    /// The training step it was generated at (the file's step when rows carry none).
    pub step: Option<i64>,
    /// The prompt as text (messages' contents joined), when the file has it.
    pub prompt: Option<String>,
    /// The completion as text (messages' contents joined).
    pub text: String,
    /// The reward: the `score`/`reward` column, or the sum of the reward-function columns.
    pub reward: Option<f64>,
    /// The advantage, when logged (TRL).
    pub advantage: Option<f64>,
    /// True when the prompt was given as chat messages (`{role, content}` list, TRL's
    /// conversational data): the trainer applies the chat template to it, so template
    /// tokens inside a message's content mean the prompt is templated twice.
    pub prompt_is_chat: bool,
}

/// Which producer's layout a completions file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionsFormat {
    /// TRL `completions_*.parquet`.
    TrlParquet,
    /// A W&B `*.table.json`.
    WandbTable,
    /// verl rollout/validation JSONL (or any JSONL with prompt and completion keys).
    RolloutJsonl,
    /// AReaL RLVR text dump.
    ArealText,
    /// TensorBoard text summaries (`add_text`) in an event file.
    TensorboardText,
}

impl CompletionsFormat {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            CompletionsFormat::TrlParquet => "trl completions parquet",
            CompletionsFormat::WandbTable => "wandb table",
            CompletionsFormat::RolloutJsonl => "rollout jsonl",
            CompletionsFormat::ArealText => "areal rollout dump",
            CompletionsFormat::TensorboardText => "tensorboard text",
        }
    }
}

/// The completions of one file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompletionFile {
    /// The file.
    pub path: PathBuf,
    /// Its layout.
    pub format: CompletionsFormat,
    /// Reward columns found (TRL: one per reward function).
    pub reward_columns: Vec<String>,
    /// The completions, in file order.
    #[serde(skip)]
    pub items: Vec<Completion>,
}

/// Keys that hold the completion text, in order of preference.
const TEXT_KEYS: [&str; 5] = [
    "completion",
    "output",
    "response",
    "completions",
    "sequence",
];
/// Keys that hold the prompt.
const PROMPT_KEYS: [&str; 3] = ["prompt", "input", "query"];
/// Keys that hold one reward.
const REWARD_KEYS: [&str; 4] = ["reward", "score", "rewards", "acc"];
/// Columns that are neither text nor rewards (TRL's table, verl's dump).
const NOT_REWARDS: [&str; 6] = ["step", "advantage", "gts", "mode", "data_source", "image"];

/// The layout of `path` when it is a completions file (`head`: its first bytes).
pub fn sniff(path: &Path, head: &[u8]) -> Option<CompletionsFormat> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if name.ends_with(".parquet") || head.starts_with(b"PAR1") {
        let trl_name = name.starts_with("completions_") && name.ends_with(".parquet");
        return (trl_name || parquet_has_text_column(path))
            .then_some(CompletionsFormat::TrlParquet);
    }
    let text = String::from_utf8_lossy(head);
    if name.ends_with(".table.json") {
        // Only a table with a completion column (a run logs other tables too).
        let cols = text.split("\"data\"").next().unwrap_or_default();
        return TEXT_KEYS
            .iter()
            .any(|k| cols.contains(&format!("\"{k}\"")))
            .then_some(CompletionsFormat::WandbTable);
    }
    if text.starts_with("idx: ") && text.contains(", seqlen: ") && text.contains("reward is ") {
        return Some(CompletionsFormat::ArealText);
    }
    let first = text.lines().next().unwrap_or_default().trim_start();
    if first.starts_with('{') && jsonl_head_is_completion(first) {
        return Some(CompletionsFormat::RolloutJsonl);
    }
    None
}

/// True when a JSONL's first line (maybe cut at the head's end) is an object with a
/// prompt key and a completion key holding text, and no `event`/metric layout.
fn jsonl_head_is_completion(first: &str) -> bool {
    if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(first) {
        let texty = |k: &&str| m.get(*k).is_some_and(|v| v.is_string() || v.is_array());
        // A step record that also logs a sample (loss, grad_norm, lr next to it) is a
        // metrics line, not a rollout dump.
        let metrics = ["event", "loss", "grad_norm", "learning_rate", "lr", "kl"]
            .iter()
            .any(|k| m.contains_key(*k));
        return TEXT_KEYS.iter().any(texty) && PROMPT_KEYS.iter().any(texty) && !metrics;
    }
    // A line longer than the head: the keys verl writes first, with string values.
    let has =
        |k: &str| first.contains(&format!("\"{k}\": \"")) || first.contains(&format!("\"{k}\":\""));
    PROMPT_KEYS.iter().any(|k| has(k)) && TEXT_KEYS.iter().any(|k| has(k))
}

fn parquet_has_text_column(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(schema) = ParquetReader::new(f).schema() else {
        return false;
    };
    let names: Vec<String> = schema.iter_names().map(|n| n.to_string()).collect();
    names.iter().any(|n| n == "completion") && names.iter().any(|n| n == "prompt")
}

/// Completion files under `dir` (its sub-folders too, four levels deep): TRL's
/// `completions/completions_*.parquet`, W&B `media/table/*.table.json` with a completion
/// column, AReaL's `<version>/<qid>.txt` dumps (its RLVR workflow) and
/// `rollout/<tail_version>/<task_id>.jsonl` (its `WorkflowExecutor._dump_trajectory`, areal
/// 1.0.4). verl's rollout JSONL at the top level is found by the log walk and told apart by
/// [`sniff`].
pub fn find_in_dir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let name = e.file_name().to_string_lossy().to_ascii_lowercase();
            if ft.is_dir() && depth < 4 {
                stack.push((e.path(), depth + 1));
            } else if ft.is_file()
                && ((name.starts_with("completions_") && name.ends_with(".parquet"))
                    || (name.ends_with(".table.json") && sniffs(&e.path()))
                    || ((name.ends_with(".txt") || name.ends_with(".jsonl"))
                        && numeric_parent(&e.path())
                        && sniffs(&e.path())))
            {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// The file's first bytes say it is a completions file.
fn sniffs(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(4096).read_to_end(&mut head))
        .is_ok()
        && sniff(path, &head).is_some()
}

/// The file lies in a folder named by a number (AReaL's `dump_dir/<version>/`).
fn numeric_parent(path: &Path) -> bool {
    path.parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Read a completions file of layout `format`. Errors name the file and where.
pub fn read(path: &Path, format: CompletionsFormat) -> Result<CompletionFile> {
    let (items, reward_columns) = match format {
        CompletionsFormat::TrlParquet => read_parquet(path)?,
        CompletionsFormat::WandbTable => read_wandb_table(path)?,
        CompletionsFormat::RolloutJsonl => read_jsonl(path)?,
        CompletionsFormat::ArealText => (read_areal(path)?, vec!["reward".to_string()]),
        CompletionsFormat::TensorboardText => (read_tensorboard(path)?, vec!["score".to_string()]),
    };
    Ok(CompletionFile {
        path: path.to_path_buf(),
        format,
        reward_columns,
        items,
    })
}

/// The completions in an event file's text summaries (see the module docs).
fn read_tensorboard(path: &Path) -> Result<Vec<Completion>> {
    let mut out = Vec::new();
    for t in crate::logs::trackers::tfevents::texts(path)? {
        let blocks = verl_generation_blocks(&t.text);
        if blocks.is_empty() {
            let tag = t.tag.to_ascii_lowercase();
            if ["completion", "generation", "sample", "response"]
                .iter()
                .any(|w| tag.contains(w))
            {
                out.push(Completion {
                    step: Some(t.step),
                    text: t.text,
                    ..Completion::default()
                });
            }
            continue;
        }
        out.extend(blocks.into_iter().map(|(prompt, text, reward)| Completion {
            step: Some(t.step),
            prompt: Some(prompt),
            text,
            reward,
            ..Completion::default()
        }));
    }
    Ok(out)
}

/// verl's markdown of one step's generations: per `### Sample i` block its input, output
/// and score (`**Input:** x\n\n**Output:** y\n\n**Score:** z\n\n---`).
fn verl_generation_blocks(text: &str) -> Vec<(String, String, Option<f64>)> {
    const INPUT: &str = "**Input:** ";
    const OUTPUT: &str = "\n\n**Output:** ";
    const SCORE: &str = "\n\n**Score:** ";
    text.split("### Sample ")
        .skip(1)
        .filter_map(|b| {
            let b = b.trim_end();
            let b = b.strip_suffix("---").unwrap_or(b).trim_end();
            let i = b.find(INPUT)? + INPUT.len();
            let o = i + b[i..].find(OUTPUT)?;
            let sc = b.rfind(SCORE).filter(|sc| *sc >= o + OUTPUT.len())?;
            let score = b[sc + SCORE.len()..].trim().parse::<f64>().ok();
            Some((
                b[i..o].to_string(),
                b[o + OUTPUT.len()..sc].to_string(),
                score,
            ))
        })
        .collect()
}

/// The step in a file name: TRL's `completions_00012.parquet`, verl's `12.jsonl`.
fn step_of_name(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_str()?;
    let digits: String = stem
        .trim_start_matches("completions_")
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    (!digits.is_empty() && digits.len() == stem.trim_start_matches("completions_").len())
        .then(|| digits.parse().ok())
        .flatten()
}

/// Text of a JSON cell: a string, or the `content` of each message of a list joined by
/// newlines (TRL's conversational prompts and completions), or nested lists of those.
pub fn json_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(a) => {
            let parts: Vec<String> = a.iter().filter_map(json_text).collect();
            (!a.is_empty() && parts.len() == a.len()).then(|| parts.join("\n"))
        }
        serde_json::Value::Object(m) => m.get("content").and_then(json_text),
        _ => None,
    }
}

fn json_f64(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// One row given as `(column, cell)` pairs into a [`Completion`]; `None` when it has no
/// completion text. Reward: the first [`REWARD_KEYS`] column, else the sum of the other
/// numeric columns (TRL's reward functions, weights not logged).
fn row_to_completion(
    cells: &[(&str, &serde_json::Value)],
    file_step: Option<i64>,
    rewards: &mut Vec<String>,
) -> Option<Completion> {
    let get = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| cells.iter().find(|(c, _)| c == k).map(|(_, v)| *v))
    };
    let text = json_text(get(&TEXT_KEYS)?)?;
    let prompt_cell = get(&PROMPT_KEYS);
    let prompt = prompt_cell.and_then(json_text);
    let prompt_is_chat = prompt_cell.is_some_and(is_messages);
    // AReaL's `tail_version`: the policy version that wrote the sample's last token (its
    // file is named after the task, not the step).
    let step = get(&["step", "global_step", "tail_version"])
        .and_then(json_f64)
        .map(|s| s as i64)
        .or(file_step);
    let advantage = get(&["advantage"]).and_then(json_f64);
    let reward = match get(&REWARD_KEYS).and_then(json_f64) {
        Some(r) => {
            if rewards.is_empty() {
                if let Some(k) = REWARD_KEYS
                    .iter()
                    .find(|k| cells.iter().any(|(c, _)| c == *k))
                {
                    rewards.push(k.to_string());
                }
            }
            Some(r)
        }
        None => {
            let mut sum = None;
            for (c, v) in cells {
                if NOT_REWARDS.contains(c) || TEXT_KEYS.contains(c) || PROMPT_KEYS.contains(c) {
                    continue;
                }
                if let Some(x) = v.as_f64() {
                    sum = Some(sum.unwrap_or(0.0) + x);
                    if !rewards.iter().any(|r| r == c) {
                        rewards.push(c.to_string());
                    }
                }
            }
            sum
        }
    };
    Some(Completion {
        step,
        prompt,
        text,
        reward,
        advantage,
        prompt_is_chat,
    })
}

/// True for a list of chat messages (objects with a `role`), as TRL logs conversational
/// prompts.
fn is_messages(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Array(a) => {
            !a.is_empty()
                && a.iter()
                    .all(|m| m.as_object().is_some_and(|o| o.contains_key("role")))
        }
        _ => false,
    }
}

/// A polars cell as JSON (strings, numbers, lists, structs of messages).
fn any_to_json(v: &AnyValue) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        AnyValue::Null => J::Null,
        AnyValue::Boolean(b) => J::Bool(*b),
        AnyValue::String(s) => J::String(s.to_string()),
        AnyValue::StringOwned(s) => J::String(s.to_string()),
        AnyValue::List(s) => J::Array(s.iter().map(|x| any_to_json(&x)).collect()),
        AnyValue::Struct(..) | AnyValue::StructOwned(..) => {
            let mut m = serde_json::Map::new();
            for (x, name) in v._iter_struct_av().zip(struct_fields(v)) {
                m.insert(name, any_to_json(&x));
            }
            J::Object(m)
        }
        other => match other.extract::<f64>() {
            Some(x) => serde_json::Number::from_f64(x).map_or(J::Null, J::Number),
            None => J::Null,
        },
    }
}

fn struct_fields(v: &AnyValue) -> Vec<String> {
    match v {
        AnyValue::Struct(_, _, fields) => fields.iter().map(|f| f.name().to_string()).collect(),
        AnyValue::StructOwned(b) => b.1.iter().map(|f| f.name().to_string()).collect(),
        _ => Vec::new(),
    }
}

fn read_parquet(path: &Path) -> Result<(Vec<Completion>, Vec<String>)> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let df = ParquetReader::new(f)
        .finish()
        .map_err(|e| Error::format(path, Position::File, format!("Parquet: {e}")))?;
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|n| n.to_string())
        .collect();
    if !names.iter().any(|n| TEXT_KEYS.contains(&n.as_str())) {
        return Err(Error::format(
            path,
            Position::File,
            format!(
                "completions table has no completion column (looked for {}); columns: {}",
                TEXT_KEYS.join(", "),
                names.join(", ")
            ),
        ));
    }
    let cols: Vec<_> = df.columns().iter().collect();
    let file_step = step_of_name(path);
    let mut rewards = Vec::new();
    let mut out = Vec::with_capacity(df.height());
    for i in 0..df.height() {
        let mut cells: Vec<(String, serde_json::Value)> = Vec::with_capacity(cols.len());
        for (c, n) in cols.iter().zip(&names) {
            if matches!(c.dtype(), DataType::Binary) {
                continue;
            }
            let v = c
                .get(i)
                .map_err(|e| Error::format(path, Position::File, format!("row {i}: {e}")))?;
            cells.push((n.clone(), any_to_json(&v)));
        }
        let refs: Vec<(&str, &serde_json::Value)> =
            cells.iter().map(|(k, v)| (k.as_str(), v)).collect();
        if let Some(c) = row_to_completion(&refs, file_step, &mut rewards) {
            out.push(c);
        }
    }
    Ok((out, rewards))
}

fn read_wandb_table(path: &Path) -> Result<(Vec<Completion>, Vec<String>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::format(
            path,
            Position::LineColumn(e.line() as u64, e.column() as u64),
            format!("W&B table: {e}"),
        )
    })?;
    let (Some(cols), Some(rows)) = (
        v.get("columns").and_then(|c| c.as_array()),
        v.get("data").and_then(|d| d.as_array()),
    ) else {
        return Err(Error::format(
            path,
            Position::File,
            "W&B table without \"columns\" and \"data\" arrays",
        ));
    };
    let names: Vec<String> = cols
        .iter()
        .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string))
        .collect();
    if !names.iter().any(|n| TEXT_KEYS.contains(&n.as_str())) {
        return Err(Error::format(
            path,
            Position::File,
            format!(
                "W&B table has no completion column (looked for {}); columns: {}",
                TEXT_KEYS.join(", "),
                names.join(", ")
            ),
        ));
    }
    let mut rewards = Vec::new();
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let Some(cells) = row.as_array() else {
            return Err(Error::format(
                path,
                Position::File,
                format!("W&B table row {i} is not an array"),
            ));
        };
        let refs: Vec<(&str, &serde_json::Value)> =
            names.iter().map(String::as_str).zip(cells.iter()).collect();
        if let Some(c) = row_to_completion(&refs, None, &mut rewards) {
            out.push(c);
        }
    }
    Ok((out, rewards))
}

fn read_jsonl(path: &Path) -> Result<(Vec<Completion>, Vec<String>)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let file_step = step_of_name(path);
    let mut rewards = Vec::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            Error::format(
                path,
                Position::LineColumn(i as u64 + 1, e.column() as u64),
                format!("rollout JSONL: {e}"),
            )
        })?;
        let Some(m) = v.as_object() else {
            return Err(Error::format(
                path,
                Position::Line(i as u64 + 1),
                "rollout JSONL line is not an object",
            ));
        };
        let refs: Vec<(&str, &serde_json::Value)> =
            m.iter().map(|(k, v)| (k.as_str(), v)).collect();
        match row_to_completion(&refs, file_step, &mut rewards) {
            Some(c) => out.push(c),
            None => {
                return Err(Error::format(
                    path,
                    Position::Line(i as u64 + 1),
                    format!(
                        "rollout JSONL line has no completion text (looked for {})",
                        TEXT_KEYS.join(", ")
                    ),
                ))
            }
        }
    }
    Ok((out, rewards))
}

/// Remove ANSI escapes (`ESC [ ... m`, colorama's colours) from `s`.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' && it.peek() == Some(&'[') {
            it.next();
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn read_areal(path: &Path) -> Result<Vec<Completion>> {
    let raw = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let text = strip_ansi(&String::from_utf8_lossy(&raw));
    // The version folder (`dump_dir/<version>/<qid>.txt`) is the step.
    let step = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse::<i64>().ok());
    let mut out = Vec::new();
    let lines: Vec<&str> = text.split('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if !l.starts_with("idx: ") {
            if out.is_empty() && !l.trim().is_empty() {
                return Err(Error::format(
                    path,
                    Position::Line(i as u64 + 1),
                    "AReaL dump: expected \"idx: i / n, seqlen: L, reward is R.\"",
                ));
            }
            i += 1;
            continue;
        }
        let reward = l
            .split("reward is ")
            .nth(1)
            .map(|r| r.trim_end().trim_end_matches('.'))
            .and_then(|r| r.parse::<f64>().ok());
        // "prompt is " + newline + prompt lines, "sequence is: " + newline + completion lines.
        let mut j = i + 1;
        let mut prompt = Vec::new();
        let mut seq = Vec::new();
        let mut in_seq = false;
        if lines.get(j).is_some_and(|x| x.starts_with("prompt is")) {
            j += 1;
        }
        while j < lines.len() && !lines[j].starts_with("idx: ") {
            if !in_seq && lines[j].starts_with("sequence is:") {
                in_seq = true;
            } else if in_seq {
                seq.push(lines[j]);
            } else {
                prompt.push(lines[j]);
            }
            j += 1;
        }
        if !in_seq {
            return Err(Error::format(
                path,
                Position::Line(i as u64 + 1),
                "AReaL dump: a sample without \"sequence is:\"",
            ));
        }
        while seq.last().is_some_and(|s| s.is_empty()) {
            seq.pop();
        }
        out.push(Completion {
            step,
            prompt: Some(prompt.join("\n")),
            text: seq.join("\n"),
            reward,
            ..Completion::default()
        });
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_lists_join_their_contents() {
        let v = serde_json::json!([{"role": "assistant", "content": "hi"}]);
        assert_eq!(json_text(&v).as_deref(), Some("hi"));
        assert_eq!(json_text(&serde_json::json!(3)), None);
    }

    #[test]
    fn steps_come_from_trl_and_verl_names() {
        assert_eq!(
            step_of_name(Path::new("completions_00012.parquet")),
            Some(12)
        );
        assert_eq!(step_of_name(Path::new("7.jsonl")), Some(7));
        assert_eq!(step_of_name(Path::new("steps.jsonl")), None);
    }

    #[test]
    fn step_records_with_a_sample_are_not_rollouts() {
        let p = Path::new("steps.jsonl");
        let line = br#"{"step": 3, "loss": 0.1, "prompt": "q", "completion": "a"}"#;
        assert_eq!(sniff(p, line), None);
        let line = br#"{"input": "q", "output": "a", "gts": "1", "score": 0.0, "step": 3}"#;
        assert_eq!(sniff(p, line), Some(CompletionsFormat::RolloutJsonl));
        // A first line longer than the head: verl's key order, string values.
        assert_eq!(sniff(p, br#"{"input": "<|im_start|>system\nYou are"#), None);
        assert_eq!(
            sniff(p, br#"{"input": "q", "output": "a very long answer"#),
            Some(CompletionsFormat::RolloutJsonl)
        );
    }

    #[test]
    fn ansi_escapes_are_removed() {
        assert_eq!(strip_ansi("a\u{1b}[33m\u{1b}[2mb\u{1b}[0mc"), "abc");
    }
}
