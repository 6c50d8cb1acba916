//! Text training logs, one pattern per producer, recognised line by line (a console log
//! mixes them): verl console `step:N - key:value - …`, TRL dict lines `{'loss': 0.0, …}`,
//! mlx-lm-lora `Iter N: Train loss X, …`, nanoGPT-style `iter N: loss X (main X, critic X),
//! time Xms`, per-micro diagnostics `[Micro k] 3. Samples scored: mem=… MB, time=…s,
//! rewards=X±Y`, and the `WARNING: All advantages/sequence_log_probs are near zero!` lines; ms-swift dict
//! lines with or without their braces (`'loss': -0.0, …, 'global_step/max_steps': '5/3766'`);
//! notebook progress tables in markdown or text pipes (`Step | Training Loss | reward`);
//! Megatron ` iteration N/ M | lm loss: … | grad norm: nan |` lines; verl console lines
//! soft-wrapped onto a continuation line; nanoGPT `step N: train loss X, val loss Y`
//! evaluation lines (kept apart from training steps, marked [`EVAL_MARK`]).
//!
//! Units are normalised in keys: `…ms`/`…s` → `<name>_s` seconds, `MB`/`GB` → `<name>_gb`.

use crate::model::log::{LogEvent, LogRecord, SourceKind};
use crate::readers::steps::parse_number_text;

/// Field marking a record as evaluation/validation only (not a training step).
pub const EVAL_MARK: &str = "eval_record";

/// What one text line is.
#[derive(Debug, Clone, PartialEq)]
pub enum TextItem {
    /// A blank line (or one holding only a markdown quote `>`): not counted as unrecognised.
    Blank,
    /// A table header row (`Step | Training Loss | …`): column keys, normalised.
    TableHeader(Vec<String>),
    /// A table row of numbers, read against the last header.
    TableRow(Vec<Option<f64>>),
    /// A table rule (`-- | --`, `|---|:--:|`).
    TableRule,
    /// The rest of a soft-wrapped verl console line (` - key:value` pairs without `step:`).
    Continuation(String),
    /// A line carrying a step and its metrics.
    Step {
        /// Producer.
        source: SourceKind,
        /// Step, when the line names one.
        step: Option<i64>,
        /// Metrics.
        fields: Vec<(String, f64)>,
        /// A key cut by a soft wrap at the end of the line (verl: `… - critic`), to be
        /// joined with the continuation line's first key.
        tail: Option<String>,
    },
    /// A per-micro diagnostic, attached to the iteration reported next.
    Micro {
        /// `micro_` prefixed metrics.
        fields: Vec<(String, f64)>,
    },
    /// A warning line that is an event (`advantages_near_zero`, `logprobs_near_zero`).
    Warning(&'static str),
    /// Nothing we recognise.
    Other,
}

/// Recognise one line.
pub fn parse_text_line(line: &str) -> TextItem {
    // A progress bar redrawn with `\r` leaves every state on one pasted line: the last counts.
    let line = line
        .rsplit('\r')
        .find(|seg| !seg.trim().is_empty())
        .unwrap_or(line);
    let t = line.trim();
    if t.trim_start_matches('>').trim().is_empty() {
        return TextItem::Blank;
    }
    if t.contains("Saved adapter weights") || t.contains("saving checkpoint") {
        return TextItem::Warning("checkpoint");
    }
    if t.contains("All advantages are near zero") {
        return TextItem::Warning("advantages_near_zero");
    }
    if t.contains("All sequence_log_probs are near zero") {
        return TextItem::Warning("logprobs_near_zero");
    }
    if let Some(item) = parse_micro(t) {
        return item;
    }
    if let Some(item) = parse_megatron(t) {
        return item;
    }
    if let Some(item) = parse_tqdm_postfix(t) {
        return item;
    }
    if let Some(item) = parse_table(t) {
        return item;
    }
    if let Some(item) = parse_iter(t) {
        return item;
    }
    if let Some(item) = parse_eval_step(t) {
        return item;
    }
    if let Some(item) = parse_verl_console(t) {
        return item;
    }
    if let Some(item) = parse_py_dict(t) {
        return item;
    }
    if is_verl_continuation(t) {
        return TextItem::Continuation(t.to_string());
    }
    TextItem::Other
}

/// A table header cell as a key: lowercased, spaces as `_`, spaces around `/` dropped
/// (`rewards / match_format` → `rewards/match_format`).
fn table_key(cell: &str) -> String {
    let words: Vec<&str> = cell.split_whitespace().collect();
    words.join("_").replace("_/_", "/").to_ascii_lowercase()
}

/// The cells of a pipe (`a | b`, `| a | b |`) or tab separated line, trimmed; `None`
/// for a line with fewer than two cells.
fn table_cells(t: &str) -> Option<Vec<&str>> {
    let sep = if t.contains('|') {
        '|'
    } else if t.contains('\t') {
        '\t'
    } else {
        return None;
    };
    let mut cells: Vec<&str> = t.split(sep).map(str::trim).collect();
    if sep == '|' {
        if cells.first().is_some_and(|c| c.is_empty()) {
            cells.remove(0);
        }
        if cells.last().is_some_and(|c| c.is_empty()) {
            cells.pop();
        }
    }
    (cells.len() >= 2).then_some(cells)
}

/// A notebook progress table line (HF `Trainer` in Jupyter, pasted as markdown or text).
fn parse_table(t: &str) -> Option<TextItem> {
    let cells = table_cells(t)?;
    if cells
        .iter()
        .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | '=' | '+')))
    {
        return Some(TextItem::TableRule);
    }
    let nums: Vec<Option<f64>> = cells.iter().map(|c| parse_number_text(c)).collect();
    // HF notebook tables write `No log` where nothing was logged at that row.
    let placeholder = |c: &str| {
        matches!(
            c.to_ascii_lowercase().as_str(),
            "no log" | "none" | "n/a" | "-" | ""
        )
    };
    if nums.first().is_some_and(Option::is_some)
        && nums.iter().filter(|n| n.is_some()).count() >= 2
        && nums
            .iter()
            .zip(&cells)
            .all(|(n, c)| n.is_some() || placeholder(c))
    {
        return Some(TextItem::TableRow(nums));
    }
    // A header names its columns (no numbers) and has a step or epoch column.
    let keys: Vec<String> = cells.iter().map(|c| table_key(c)).collect();
    let named = nums.iter().all(Option::is_none) && cells.iter().all(|c| !c.is_empty());
    if named && keys.iter().any(|k| k == "step" || k == "epoch") {
        return Some(TextItem::TableHeader(keys));
    }
    None
}

/// Megatron-LM / Megatron-DeepSpeed ` iteration N/ M | key: value | … |` lines;
/// `(ms)` in a key converts the value to seconds (`elapsed_time_per_iteration_s`).
fn parse_megatron(t: &str) -> Option<TextItem> {
    let pos = t.find("iteration ")?;
    let rest = &t[pos + "iteration ".len()..];
    let (head, body) = rest.split_once('|')?;
    let step: i64 = head.split('/').next()?.trim().parse().ok()?;
    let mut fields = Vec::new();
    for part in body.split('|') {
        let Some((k, v)) = part.split_once(':') else {
            continue;
        };
        let Some(mut v) = parse_number_text(v) else {
            continue;
        };
        let mut key = k.trim().to_string();
        for (unit, scale) in [("(ms)", 1e-3), ("(s)", 1.0)] {
            if let Some(stem) = key.strip_suffix(unit) {
                key = format!("{}_s", stem.trim());
                v *= scale;
            }
        }
        fields.push((table_key(&key), v));
    }
    if fields.is_empty() {
        return None;
    }
    Some(TextItem::Step {
        source: SourceKind::Megatron,
        step: Some(step),
        fields,
        tail: None,
    })
}

/// OpenRLHF's short progress-bar names (`pbar.set_postfix(short_status)` in its PPO
/// trainers) and the metric each abbreviates.
const OPENRLHF_SHORT: &[(&str, &str)] = &[
    ("pg", "policy_loss"),
    ("rm", "reward"),
    ("ret", "return"),
    ("glen", "response_length"),
    ("tlen", "total_length"),
    ("ent", "entropy"),
    ("act_lr", "actor_lr"),
    ("cri", "critic_loss"),
    ("vals", "values"),
    ("ptx", "ptx_loss"),
];

/// A tqdm bar with a postfix, `… 8/8 [05:12<00:00, 39.06s/it, pg=-0.0019, rm=0.53, kl=1e-4]`
/// (OpenRLHF, HF accelerate loops): the `key=value` pairs, unnumbered (a bar restarts every
/// episode, so its counter is not a step).
fn parse_tqdm_postfix(t: &str) -> Option<TextItem> {
    if !t.contains("%|") && !t.contains("it/s") && !t.contains("s/it") {
        return None;
    }
    let open = t.rfind('[')?;
    let body = t[open + 1..].trim_end().strip_suffix(']')?;
    let mut fields = Vec::new();
    for part in body.split(", ") {
        let Some((k, v)) = part.split_once('=') else {
            continue;
        };
        let Some(v) = parse_number_text(v) else {
            continue;
        };
        let k = k.trim();
        let key = OPENRLHF_SHORT
            .iter()
            .find(|(short, _)| *short == k)
            .map_or(k, |(_, long)| long);
        fields.push((key.to_string(), v));
    }
    if fields.is_empty() {
        return None;
    }
    Some(TextItem::Step {
        source: SourceKind::TrlDict,
        step: None,
        fields,
        tail: None,
    })
}

/// nanoGPT's evaluation line `step 3000: train loss 4.0390, val loss 4.0427`: an eval
/// record, not a training step (its keys are `eval/…`, `val_loss` kept as is).
fn parse_eval_step(t: &str) -> Option<TextItem> {
    let pos = t.find("step ")?;
    if pos > 0 && t.as_bytes()[pos - 1].is_ascii_alphanumeric() {
        return None;
    }
    let rest = &t[pos + 5..];
    let (num, body) = rest.split_once(':')?;
    let step: i64 = num.trim().parse().ok()?;
    let mut fields = Vec::new();
    for part in split_top(body, ',') {
        parse_named_part(part, "", &mut fields);
    }
    if fields.is_empty() || !fields.iter().any(|(k, _)| k.starts_with("val")) {
        return None;
    }
    for (k, _) in &mut fields {
        if !k.starts_with("val") {
            *k = format!("eval/{k}");
        }
    }
    fields.push((EVAL_MARK.to_string(), 1.0));
    Some(TextItem::Step {
        source: SourceKind::NanoGpt,
        step: Some(step),
        fields,
        tail: None,
    })
}

/// The second half of a soft-wrapped verl console line: ` - `-separated `key:number`
/// pairs with no `step:` (the first key may be cut: `/rewards/min:-1.0 - critic/…`).
fn is_verl_continuation(t: &str) -> bool {
    let parts: Vec<&str> = t.split(" - ").collect();
    let pairs = parts
        .iter()
        .filter(|p| {
            p.rsplit_once(':').is_some_and(|(k, v)| {
                !k.trim().is_empty() && !k.contains(' ') && parse_number_text(v).is_some()
            })
        })
        .count();
    parts.len() >= 2 && pairs * 2 >= parts.len()
}

/// Split at `sep` outside (), [], {} and quotes.
fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => quote = Some(c),
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ if c == sep && depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + c.len_utf8();
                }
                _ => {}
            },
        }
    }
    out.push(&s[start..]);
    out
}

/// `name` lowercased with spaces as `_`.
fn key_of(words: &[&str]) -> String {
    words.join("_").to_ascii_lowercase()
}

/// A value with an optional unit glued or spaced: `21747.97ms`, `0.412s`, `812 MB`, `12.3%`.
/// Returns the value in canonical units and the key suffix.
fn value_with_unit(num: &str, unit_word: Option<&str>) -> Option<(f64, &'static str, bool)> {
    if let Some(v) = parse_number_text(num) {
        let unit = unit_word.unwrap_or("");
        return Some(match unit {
            "ms" => (v / 1000.0, "_s", true),
            "s" | "sec" => (v, "_s", true),
            "MB" | "MiB" => (v / 1024.0, "_gb", true),
            "GB" | "GiB" => (v, "_gb", true),
            _ => (v, "", false),
        });
    }
    let split = num
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_ascii_digit() || *c == '.')
        .map(|(i, _)| i + 1)?;
    let (n, unit) = num.split_at(split);
    let v = parse_number_text(n)?;
    match unit {
        "ms" => Some((v / 1000.0, "_s", true)),
        "s" => Some((v, "_s", true)),
        "MB" => Some((v / 1024.0, "_gb", true)),
        "GB" => Some((v, "_gb", true)),
        "%" => Some((v / 100.0, "_frac", true)),
        _ => None,
    }
}

/// `Name words 1.23[unit] [(sub 1, sub 2)]` → fields.
fn parse_named_part(part: &str, prefix: &str, out: &mut Vec<(String, f64)>) {
    let (main, paren) = match part.find('(') {
        Some(i) if part.trim_end().ends_with(')') => {
            let inner = part[i + 1..].trim_end();
            (&part[..i], Some(&inner[..inner.len() - 1]))
        }
        _ => (part, None),
    };
    let words: Vec<&str> = main.split_whitespace().collect();
    // Find the last word that is a number (possibly with a glued unit).
    for idx in (1..words.len()).rev() {
        let unit = words.get(idx + 1).copied();
        if let Some((v, suffix, used)) = value_with_unit(words[idx], unit) {
            let name = key_of(&words[..idx]);
            let key = if used {
                format!("{prefix}{name}{suffix}")
            } else {
                format!("{prefix}{name}")
            };
            out.push((key, v));
            if let Some(inner) = paren {
                for sub in split_top(inner, ',') {
                    parse_named_part(sub, &format!("{prefix}{name}_"), out);
                }
            }
            return;
        }
    }
}

/// `iter N: …` (nanoGPT) and `Iter N: …` (mlx-lm-lora), after any prefix.
fn parse_iter(t: &str) -> Option<TextItem> {
    let (pos, source) = match (t.find("Iter "), t.find("iter ")) {
        (Some(i), _) => (i, SourceKind::MlxReport),
        (None, Some(i)) => (i, SourceKind::NanoGpt),
        _ => return None,
    };
    if pos > 0 && t.as_bytes()[pos - 1].is_ascii_alphanumeric() {
        return None;
    }
    let rest = &t[pos + 5..];
    let colon = rest.find(':')?;
    let step: i64 = rest[..colon].trim().parse().ok()?;
    let mut fields = Vec::new();
    for part in split_top(&rest[colon + 1..], ',') {
        parse_named_part(part, "", &mut fields);
    }
    if fields.is_empty() {
        return None;
    }
    // `Iter 1: Val loss 2.480, Val took 0.732s` is a validation record.
    if fields.iter().all(|(k, _)| k.starts_with("val_")) {
        fields.push((EVAL_MARK.to_string(), 1.0));
    }
    Some(TextItem::Step {
        source,
        step: Some(step),
        fields,
        tail: None,
    })
}

/// `[Micro k] 3. Samples scored: mem=812 MB, time=0.412s, rewards=0.5±0.1` and the
/// unnumbered-micro `5. Optimizer step finished: mem=… MB, time=…s total`.
fn parse_micro(t: &str) -> Option<TextItem> {
    let body = if let Some(rest) = t.strip_prefix("[Micro") {
        rest.split_once(']')?.1
    } else if t.contains("Optimizer step finished:") {
        t
    } else {
        return None;
    };
    let (label, kv) = body.split_once(':')?;
    let label = label.trim();
    let mut fields = Vec::new();
    for part in split_top(kv, ',') {
        let Some((k, v)) = part.split_once('=') else {
            continue;
        };
        let k = k.trim();
        let v = v.trim();
        if let Some((m, s)) = v.split_once('±') {
            if let (Some(m), Some(s)) = (parse_number_text(m), parse_number_text(s)) {
                fields.push((format!("micro_{k}_mean"), m));
                fields.push((format!("micro_{k}_std"), s));
            }
            continue;
        }
        let mut words = v.split_whitespace();
        let num = words.next().unwrap_or("");
        let unit = words.next();
        if let Some((val, suffix, _)) = value_with_unit(num, unit) {
            if k == "time" && !label.contains("Optimizer step finished") {
                continue; // cumulative time inside the iteration, not a step time
            }
            let key = if k == "time" {
                "step_time_s".to_string()
            } else {
                format!("micro_{k}{suffix}")
            };
            fields.push((key, val));
        }
    }
    Some(TextItem::Micro { fields })
}

/// `step:34 - actor/pg_loss:0.0424 - actor/grad_norm:0.1296 - …` after any prefix.
fn parse_verl_console(t: &str) -> Option<TextItem> {
    let pos = t.find("step:")?;
    if pos > 0 && t.as_bytes()[pos - 1].is_ascii_alphanumeric() {
        return None;
    }
    let body = t[pos..].trim_end_matches([' ', '-']);
    let mut step = None;
    let mut fields = Vec::new();
    let mut tail = None;
    let parts: Vec<&str> = body.split(" - ").collect();
    for (i, part) in parts.iter().enumerate() {
        let Some((k, v)) = part.rsplit_once(':') else {
            if i + 1 == parts.len() && !part.trim().is_empty() {
                tail = Some(part.trim().to_string());
            }
            continue;
        };
        let k = k.trim();
        let v = v.trim();
        let v = v
            .strip_prefix("np.float64(")
            .or_else(|| v.strip_prefix("np.float32("))
            .and_then(|x| x.strip_suffix(')'))
            .unwrap_or(v);
        if k == "step" {
            step = v.parse::<i64>().ok();
        } else if let Some(f) = parse_number_text(v) {
            fields.push((k.to_string(), f));
        }
    }
    step?;
    // verl writes val-only metrics (`val-core/…`, `val-aux/…`) at step 0 before training.
    if !fields.is_empty() && fields.iter().all(|(k, _)| k.starts_with("val")) {
        fields.push((EVAL_MARK.to_string(), 1.0));
    }
    Some(TextItem::Step {
        source: SourceKind::VerlConsole,
        step,
        fields,
        tail,
    })
}

/// Pairs `key:value` of a verl continuation line, the first key prefixed by `head`.
fn verl_pairs(t: &str, head: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    // A wrapped line can end on its separator (`… - response_length/min:38.0 -`).
    let t = t.trim_end_matches([' ', '-']);
    for (i, part) in t.split(" - ").enumerate() {
        let Some((k, v)) = part.rsplit_once(':') else {
            continue;
        };
        let Some(v) = parse_number_text(v.trim()) else {
            continue;
        };
        let k = k.trim();
        let key = if i == 0 {
            format!("{head}{k}")
        } else {
            k.to_string()
        };
        out.push((key, v));
    }
    out
}

/// A Python dict repr line `{'loss': 0.0, 'grad_norm': nan, …}` (TRL/transformers stdout).
fn parse_py_dict(t: &str) -> Option<TextItem> {
    let body = match t.find("{'") {
        Some(start) => {
            let body = t[start..].strip_suffix('}').or_else(|| {
                // The last `}` may come before the `{'` (`0}:.{'loss': …`): then there is
                // no dict.
                let end = t.rfind('}').filter(|&end| end > start)?;
                Some(&t[start..end])
            })?;
            body.strip_prefix('{')?
        }
        // ms-swift lines pasted without their braces: `'loss': -0.0, 'grad_norm': 0.0, …`.
        None if t.starts_with('\'') && t.contains("': ") && !t.contains('{') => {
            t.strip_suffix('}').unwrap_or(t)
        }
        None => return None,
    };
    let mut fields = Vec::new();
    let mut step_text = None;
    for part in split_top(body, ',') {
        let Some((k, v)) = part.split_once(':') else {
            continue;
        };
        let k = k.trim().trim_matches(|c| c == '\'' || c == '"');
        let v = v.trim();
        // ms-swift: `'global_step/max_steps': '5/3766'`.
        if k == "global_step/max_steps" {
            step_text = v
                .trim_matches(|c| c == '\'' || c == '"')
                .split('/')
                .next()
                .and_then(|n| n.trim().parse::<i64>().ok());
            continue;
        }
        let v = v
            .strip_prefix("tensor(")
            .and_then(|x| x.split([',', ')']).next())
            .unwrap_or(v);
        let f = match v {
            "True" => Some(1.0),
            "False" => Some(0.0),
            _ => parse_number_text(v),
        };
        if let Some(f) = f {
            fields.push((k.to_string(), f));
        }
    }
    if fields.is_empty() {
        return None;
    }
    // TRL/HF write no step (numbered in order); TRL PPO counts `episode`s, LLaMA-Factory
    // `current_steps`, ms-swift `global_step/max_steps`.
    let step = step_text.or_else(|| {
        ["step", "global_step", "current_steps", "episode"]
            .iter()
            .find_map(|name| fields.iter().find(|(k, _)| k == name))
            .map(|(_, v)| *v as i64)
    });
    if fields.iter().any(|(k, _)| k.starts_with("eval_"))
        && !fields.iter().any(|(k, _)| k == "loss" || k == "grad_norm")
    {
        fields.push((EVAL_MARK.to_string(), 1.0));
    }
    // HF Trainer's closing summary (`train_runtime`, `train_loss` = the mean over the run):
    // kept under `summary/` so its mean loss never stands in for a step's loss.
    if fields.iter().any(|(k, _)| k == "train_runtime") {
        for (k, _) in &mut fields {
            *k = format!("summary/{k}");
        }
    }
    Some(TextItem::Step {
        source: SourceKind::TrlDict,
        step,
        fields,
        tail: None,
    })
}

/// Assembles parsed text lines in file order into records and events: micro diagnostics
/// and warnings attach to the next `iter N` line (they are printed before it), TRL dict
/// lines without a step are numbered in order.
#[derive(Debug, Default)]
pub struct TextAssembler {
    file: usize,
    pending_micro: Vec<(String, f64)>,
    pending_first_line: u64,
    pending_events: Vec<LogEvent>,
    last_step: Option<i64>,
    unnumbered: i64,
    /// The current table header's keys.
    table: Option<Vec<String>>,
    /// The last item was a verl console record (its index) with a key cut at the end.
    verl_tail: Option<(usize, String)>,
    /// Records ready for the frame.
    pub records: Vec<LogRecord>,
    /// Events ready for the detectors.
    pub events: Vec<LogEvent>,
    /// Lines that matched nothing.
    pub unrecognised: u64,
}

impl TextAssembler {
    /// An assembler for file index `file`.
    pub fn new(file: usize) -> Self {
        TextAssembler {
            file,
            ..TextAssembler::default()
        }
    }

    /// Feed the next line's item.
    pub fn push(&mut self, line: u64, item: TextItem) {
        let verl_tail = self.verl_tail.take();
        match item {
            TextItem::Blank => {
                self.verl_tail = verl_tail;
            }
            TextItem::Other => self.unrecognised += 1,
            TextItem::TableRule => {}
            TextItem::TableHeader(keys) => self.table = Some(keys),
            TextItem::TableRow(cells) => {
                let Some(keys) = &self.table else {
                    self.unrecognised += 1;
                    return;
                };
                // A row shorter than its header was cut: its last cell may be cut too.
                let n = if cells.len() < keys.len() {
                    cells.len().saturating_sub(1)
                } else {
                    keys.len()
                };
                let mut fields: Vec<(String, f64)> = keys
                    .iter()
                    .zip(&cells)
                    .take(n)
                    .filter_map(|(k, v)| v.map(|v| (k.clone(), v)))
                    .collect();
                let step = ["step", "epoch"].iter().find_map(|name| {
                    let i = fields.iter().position(|(k, _)| k == name)?;
                    let v = fields.get(i)?.1;
                    (v.fract() == 0.0 && v.is_finite()).then_some(v as i64)
                });
                fields.retain(|(k, _)| k != "step");
                if fields.is_empty() {
                    self.unrecognised += 1;
                    return;
                }
                self.push(
                    line,
                    TextItem::Step {
                        source: SourceKind::NotebookTable,
                        step,
                        fields,
                        tail: None,
                    },
                );
            }
            TextItem::Continuation(text) => match verl_tail {
                Some((idx, head)) => {
                    let pairs = verl_pairs(&text, &head);
                    if let Some(rec) = self.records.get_mut(idx) {
                        rec.fields.extend(pairs);
                    }
                }
                None => self.unrecognised += 1,
            },
            TextItem::Warning(kind) => {
                self.pending_events
                    .push(LogEvent::new(kind, self.file, line));
            }
            TextItem::Micro { fields } => {
                if self.pending_micro.is_empty() {
                    self.pending_first_line = line;
                }
                self.pending_micro.extend(fields);
            }
            TextItem::Step {
                source,
                step,
                fields,
                tail,
            } => {
                let (step, inferred) = match step {
                    Some(s) => (s, false),
                    None => {
                        self.unnumbered += 1;
                        (self.unnumbered - 1, true)
                    }
                };
                self.flush(step);
                let mut rec = LogRecord {
                    step: Some(step),
                    timestamp: None,
                    source,
                    file: self.file,
                    line,
                    fields,
                };
                if inferred {
                    rec.fields.push(("step_inferred".to_string(), 1.0));
                }
                self.last_step = Some(step);
                if source == SourceKind::VerlConsole {
                    self.verl_tail = Some((self.records.len(), tail.unwrap_or_default()));
                }
                self.records.push(rec);
            }
        }
    }

    /// Attach pending micro lines and warnings to `step`.
    fn flush(&mut self, step: i64) {
        for mut ev in self.pending_events.drain(..) {
            ev.step = Some(step);
            self.events.push(ev);
        }
        if self.pending_micro.is_empty() {
            return;
        }
        let fields = aggregate_micro(std::mem::take(&mut self.pending_micro));
        self.records.push(LogRecord {
            step: Some(step),
            timestamp: None,
            source: SourceKind::MicroDiag,
            file: self.file,
            line: self.pending_first_line,
            fields,
        });
    }

    /// Flush what is pending at end of file (to the step after the last one seen).
    pub fn finish(&mut self) {
        let next = self.last_step.map_or(0, |s| s.saturating_add(1));
        self.flush(next);
    }
}

/// Combine one iteration's micro diagnostics: stds and memory take the max (all-zero
/// std means every micro had identical rewards), everything else the mean.
fn aggregate_micro(fields: Vec<(String, f64)>) -> Vec<(String, f64)> {
    let mut keys: Vec<String> = Vec::new();
    let mut vals: Vec<Vec<f64>> = Vec::new();
    for (k, v) in fields {
        match keys.iter().position(|x| *x == k) {
            Some(i) => vals[i].push(v),
            None => {
                keys.push(k);
                vals.push(vec![v]);
            }
        }
    }
    keys.into_iter()
        .zip(vals)
        .map(|(k, vs)| {
            let take_max = k.ends_with("_std") || k.ends_with("_gb") || k == "step_time_s";
            let v = if take_max {
                vs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            } else {
                vs.iter().sum::<f64>() / vs.len() as f64
            };
            (k, v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(item: &TextItem) -> Vec<(String, f64)> {
        match item {
            TextItem::Step { fields, .. } | TextItem::Micro { fields } => fields.clone(),
            _ => vec![],
        }
    }

    #[test]
    fn nanogpt_line_with_parenthesised_parts() {
        let it =
            parse_text_line("iter 0: loss 0.1235 (main 0.1235, critic 0.0000), time 21747.97ms");
        assert!(matches!(
            it,
            TextItem::Step {
                source: SourceKind::NanoGpt,
                step: Some(0),
                ..
            }
        ));
        assert_eq!(
            fields(&it),
            vec![
                ("loss".to_string(), 0.1235),
                ("loss_main".to_string(), 0.1235),
                ("loss_critic".to_string(), 0.0),
                ("time_s".to_string(), 21747.97 / 1000.0),
            ]
        );
    }

    #[test]
    fn mlx_report_line() {
        let it = parse_text_line("Iter 10: Train loss 0.000, Learning Rate 1.000e-05, It/sec 5.343, Tokens/sec 1736.078, Trained Tokens 3249, Peak mem 5.040 GB");
        assert!(matches!(
            it,
            TextItem::Step {
                source: SourceKind::MlxReport,
                step: Some(10),
                ..
            }
        ));
        let f = fields(&it);
        assert_eq!(f[0], ("train_loss".to_string(), 0.0));
        assert_eq!(f[1], ("learning_rate".to_string(), 1e-5));
        assert_eq!(f[2], ("it/sec".to_string(), 5.343));
        assert_eq!(f[5], ("peak_mem_gb".to_string(), 5.04));
        let val = parse_text_line("Iter 1: Val loss 0.002, Val took 21.048s");
        assert_eq!(
            fields(&val),
            vec![
                ("val_loss".to_string(), 0.002),
                ("val_took_s".to_string(), 21.048),
                (EVAL_MARK.to_string(), 1.0),
            ]
        );
    }

    #[test]
    fn micro_and_warning_lines() {
        let it = parse_text_line(
            "[Micro 0] 3. Samples scored: mem=812 MB, time=0.412s, rewards=0.5000±0.1200",
        );
        assert_eq!(
            fields(&it),
            vec![
                ("micro_mem_gb".to_string(), 812.0 / 1024.0),
                ("micro_rewards_mean".to_string(), 0.5),
                ("micro_rewards_std".to_string(), 0.12),
            ]
        );
        assert_eq!(
            parse_text_line("WARNING: All advantages are near zero! rewards_grouped=[[0.0, 0.0]]"),
            TextItem::Warning("advantages_near_zero")
        );
    }

    #[test]
    fn verl_console_and_trl_dict() {
        let it = parse_text_line(
            "(TaskRunner pid=1) step:34 - actor/pg_loss:0.0424 - actor/grad_norm:nan",
        );
        assert!(matches!(
            it,
            TextItem::Step {
                source: SourceKind::VerlConsole,
                step: Some(34),
                ..
            }
        ));
        let f = fields(&it);
        assert_eq!(f[0], ("actor/pg_loss".to_string(), 0.0424));
        assert!(f[1].1.is_nan());
        let d = parse_text_line("{'loss': 0.0, 'grad_norm': nan, 'reward': 0.5, 'completions/mean_length': 12.0, 'epoch': 0.01}");
        assert!(matches!(
            d,
            TextItem::Step {
                source: SourceKind::TrlDict,
                step: None,
                ..
            }
        ));
        assert_eq!(fields(&d).len(), 5);
    }

    #[test]
    fn micro_lines_attach_to_next_iter() {
        let mut a = TextAssembler::new(0);
        let lines = [
            "[Micro 0] 3. Samples scored: mem=800 MB, time=0.4s, rewards=0.0000±0.0000",
            "[Micro 1] 3. Samples scored: mem=900 MB, time=0.4s, rewards=1.0000±0.0000",
            "WARNING: All advantages are near zero! rewards_grouped=[...]",
            "iter 1: loss 0.0000 (main 0.0000, critic 0.0000), time 103634.20ms",
        ];
        for (i, l) in lines.iter().enumerate() {
            a.push(i as u64 + 1, parse_text_line(l));
        }
        a.finish();
        assert_eq!(a.events.len(), 1);
        assert_eq!(a.events[0].step, Some(1));
        let micro = &a.records[0];
        assert_eq!(micro.step, Some(1));
        assert_eq!(
            micro.fields,
            vec![
                ("micro_mem_gb".to_string(), 900.0 / 1024.0),
                ("micro_rewards_mean".to_string(), 0.5),
                ("micro_rewards_std".to_string(), 0.0),
            ]
        );
    }

    fn step_of(item: &TextItem) -> Option<i64> {
        match item {
            TextItem::Step { step, .. } => *step,
            _ => None,
        }
    }

    #[test]
    fn megatron_pipe_line_units_and_step() {
        let it = parse_text_line(" iteration     5426/  250000 | consumed samples:        43408 | elapsed time per iteration (ms): 4247.9 | learning rate: 2.999E-04 | lm loss: 2.5E+00 | grad norm: nan |");
        assert_eq!(step_of(&it), Some(5426));
        let f = fields(&it);
        assert_eq!(f[0], ("consumed_samples".to_string(), 43408.0));
        assert_eq!(f[1], ("elapsed_time_per_iteration_s".to_string(), 4.2479));
        assert_eq!(f[2], ("learning_rate".to_string(), 2.999e-4));
        assert_eq!(f[3], ("lm_loss".to_string(), 2.5));
        assert_eq!(f[4].0, "grad_norm");
        assert!(f[4].1.is_nan());
        // A line cut before its first value is not a record.
        assert_eq!(
            parse_text_line(" iteration     5429/  250000 | consumed samples:"),
            TextItem::Other
        );
    }

    #[test]
    fn msswift_dict_without_braces_reads_its_step() {
        let it = parse_text_line("'loss': -0.0, 'grad_norm': 0.0, 'reward_std': 0.44, 'global_step/max_steps': '5/3766', 'percentage': '0.13%', 'memory(GiB)': 56.74");
        assert_eq!(step_of(&it), Some(5));
        assert_eq!(
            fields(&it),
            vec![
                ("loss".to_string(), -0.0),
                ("grad_norm".to_string(), 0.0),
                ("reward_std".to_string(), 0.44),
                ("memory(GiB)".to_string(), 56.74),
            ]
        );
    }

    #[test]
    fn notebook_table_rows_read_against_their_header_cut_row_drops_its_last_cell() {
        let mut a = TextAssembler::new(0);
        let lines = [
            "| Step | Training Loss | reward | rewards / match_format |",
            "|---|---|---|---|",
            "| 1 | 0.000000 | -17.25 | 0.0 |",
            "2 | 0.000100 | -10.5",
        ];
        for (i, l) in lines.iter().enumerate() {
            a.push(i as u64 + 1, parse_text_line(l));
        }
        a.finish();
        assert_eq!(a.unrecognised, 0);
        assert_eq!(a.records.len(), 2);
        assert_eq!(a.records[0].step, Some(1));
        assert_eq!(
            a.records[0].fields,
            vec![
                ("training_loss".to_string(), 0.0),
                ("reward".to_string(), -17.25),
                ("rewards/match_format".to_string(), 0.0),
            ]
        );
        // Row 2 has 3 of 4 cells: its last one (-10.5) may be cut, so it is dropped.
        assert_eq!(
            a.records[1].fields,
            vec![("training_loss".to_string(), 0.0001)]
        );
    }

    #[test]
    fn verl_soft_wrap_joins_the_cut_key() {
        let mut a = TextAssembler::new(0);
        a.push(
            1,
            parse_text_line("(TaskRunner pid=7) step:34 - critic/rewards/max:1.0 - critic"),
        );
        a.push(
            2,
            parse_text_line("/rewards/min:-1.0 - response_length/min:38.0 -"),
        );
        a.finish();
        assert_eq!(a.unrecognised, 0);
        assert_eq!(
            a.records[0].fields,
            vec![
                ("critic/rewards/max".to_string(), 1.0),
                ("critic/rewards/min".to_string(), -1.0),
                ("response_length/min".to_string(), 38.0),
            ]
        );
    }

    #[test]
    fn openrlhf_progress_bar_postfix_and_nanogpt_eval_line() {
        let it = parse_text_line("Train epoch [1/1]: 100%|##| 4/4 [00:30<00:00,  7.61s/it, pg=-0.0019, rm=0.53, glen=311, kl=0.000183]");
        assert_eq!(step_of(&it), None);
        assert_eq!(
            fields(&it),
            vec![
                ("policy_loss".to_string(), -0.0019),
                ("reward".to_string(), 0.53),
                ("response_length".to_string(), 311.0),
                ("kl".to_string(), 0.000183),
            ]
        );
        let ev =
            parse_text_line("> 2023-03-22 09:32:32 step 3000: train loss 4.0390, val loss 4.0427");
        assert_eq!(step_of(&ev), Some(3000));
        assert_eq!(
            fields(&ev),
            vec![
                ("eval/train_loss".to_string(), 4.039),
                ("val_loss".to_string(), 4.0427),
                (EVAL_MARK.to_string(), 1.0),
            ]
        );
        assert_eq!(parse_text_line("> "), TextItem::Blank);
        assert_eq!(
            parse_text_line("> saving checkpoint to out"),
            TextItem::Warning("checkpoint")
        );
    }

    #[test]
    fn hf_closing_summary_line_is_not_a_loss() {
        let it = parse_text_line("{'train_runtime': 812.5, 'train_samples_per_second': 2.1, 'train_loss': 0.93, 'epoch': 3.0}");
        assert!(fields(&it).iter().all(|(k, _)| k.starts_with("summary/")));
    }

    #[test]
    fn notebook_table_no_log_cells_are_missing_values() {
        let mut a = TextAssembler::new(0);
        for (i, l) in [
            "| Epoch | Training Loss | Validation Loss |",
            "| 1 | No log | 1.25 |",
            "| 2 | 0.9 | 1.1 |",
        ]
        .iter()
        .enumerate()
        {
            a.push(i as u64 + 1, parse_text_line(l));
        }
        a.finish();
        assert_eq!(a.unrecognised, 0);
        assert_eq!(a.records[0].step, Some(1));
        assert_eq!(
            a.records[0].fields,
            vec![
                ("epoch".to_string(), 1.0),
                ("validation_loss".to_string(), 1.25)
            ]
        );
        assert_eq!(a.records[1].fields.len(), 3);
    }
}
