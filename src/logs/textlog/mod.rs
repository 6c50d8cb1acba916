//! Text training logs, one pattern per producer, recognised line by line (a console log
//! mixes them): verl console `step:N - key:value - …`, TRL dict lines `{'loss': 0.0, …}`,
//! mlx-lm-lora `Iter N: Train loss X, …`, nanoGPT-style `iter N: loss X (main X, critic X),
//! time Xms`, per-micro diagnostics `[Micro k] 3. Samples scored: mem=… MB, time=…s,
//! rewards=X±Y`, and the `WARNING: All advantages/sequence_log_probs are near zero!` lines; ms-swift dict
//! lines with or without their braces (`'loss': -0.0, …, 'global_step/max_steps': '5/3766'`);
//! notebook progress tables in markdown or text pipes (`Step | Training Loss | reward`);
//! Megatron ` iteration N/ M | lm loss: … | grad norm: nan |` lines; verl console lines
//! soft-wrapped onto a continuation line; nanoGPT `step N: train loss X, val loss Y`
//! evaluation lines (kept apart from training steps, marked [`EVAL_MARK`]); generic
//! `key: value` / `key=value` step lines with a step key anywhere (DeepSpeed-Chat, minimind:
//! [`kv`]); `step N:` / `iteration N` prefixes name the step of the record they precede;
//! step banners (`===== Step 3/100 =====`, NeMo-RL) and the `• Key: value` lines under them.
//!
//! Units are normalised in keys: `…ms`/`…s` → `<name>_s` seconds, `MB`/`GB` → `<name>_gb`.

mod assemble;
mod exceptions;
mod kv;
mod lines;
mod step_prefix;
mod tables;
#[cfg(test)]
mod tests;

pub use assemble::TextAssembler;

use crate::model::log::SourceKind;
use lines::{
    is_verl_continuation, parse_eval_step, parse_iter, parse_micro, parse_py_dict,
    parse_verl_console,
};
use tables::{parse_megatron, parse_table, parse_tqdm_postfix};

pub use crate::model::log::EVAL_MARK;

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
        /// The micro-batch index (`[Micro k]`), when the line names one.
        micro: Option<u32>,
        /// The stage (`samples_generated`) and the micro's clock at its end (`time=…s`,
        /// counted from the micro's first stage).
        stage: Option<(String, f64)>,
        /// The line ends an iteration (`Optimizer step finished`).
        ends_iteration: bool,
    },
    /// A line naming only a step (NeMo-RL's `===== Step 3/100 =====` banner): the field
    /// lines after it are that step's.
    StepHeader(i64),
    /// `• Key: value` lines and `│ key │ value │ key │ value │` box rows: fields of the
    /// step whose banner came last.
    Fields(Vec<(String, f64)>),
    /// A section title (`📊 Training Results:`): field lines right after it with no banner
    /// before them are one record, numbered in order, until the same title comes again.
    /// Counted as unrecognised.
    Title(String),
    /// Metrics for the step reported next (DeepSpeed-Chat's timing line).
    Pending(Vec<(String, f64)>),
    /// Metrics of the step reported last (DeepSpeed-Chat's `average reward score:`).
    Attach(Vec<(String, f64)>),
    /// A warning line that is an event (`advantages_near_zero`, `logprobs_near_zero`).
    Warning(&'static str),
    /// `Traceback (most recent call last):` ([`exceptions`]).
    TracebackStart,
    /// A line shaped like a traceback's last (`RuntimeError: …`): an `exception` event
    /// when it ends a traceback, else unrecognised.
    Exception(String),
    /// A message that ends a process with no Python traceback (an NCCL watchdog timeout,
    /// `terminate called after throwing …`): an `exception` event by itself.
    Fatal(String),
    /// A line holding only a tqdm bar (`  1%|▏    | 22/1752 [01:02<1:21:36,  2.83s/it]`): its
    /// count. An HF Trainer record printed on its own line between two such bars is step
    /// `count` of the run.
    Bar(i64),
    /// Nothing we recognise.
    Other,
}

/// Recognise one line (ANSI colour codes, as colorlog writes them into AReaL's
/// `main.log`, removed first).
pub fn parse_text_line(line: &str) -> TextItem {
    if memchr::memchr(0x1b, line.as_bytes()).is_some() {
        return parse_plain_line(&strip_ansi(line));
    }
    parse_plain_line(line)
}

/// `line` without its ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.clone().next() == Some('[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out
}

/// `line` without the line number a log viewer or a numbered paste puts first (`[1757] {'loss':
/// …}`; the first line of a paste may have lost its `[`: `1743] {…}`).
/// The number itself comes back too: a line of stepless `key value` pairs behind it is that
/// step's record (Dreamer's `[5000] model_loss 5864.5 / value_loss 6.4 / …`).
fn without_line_number(line: &str) -> (&str, Option<i64>) {
    let body = line.strip_prefix('[').unwrap_or(line);
    let digits = body.bytes().take_while(u8::is_ascii_digit).count();
    match body[digits..].strip_prefix(']') {
        Some(rest) if digits > 0 && (rest.is_empty() || rest.starts_with(' ')) => (
            rest.strip_prefix(' ').unwrap_or(rest),
            body[..digits].parse().ok(),
        ),
        _ => (line, None),
    }
}

/// Recognise one line free of ANSI codes.
fn parse_plain_line(line: &str) -> TextItem {
    // A progress bar redrawn with `\r` leaves every state on one pasted line: the last counts.
    let line = line
        .rsplit('\r')
        .find(|seg| !seg.trim().is_empty())
        .unwrap_or(line);
    let (line, number) = without_line_number(line);
    match (parse_unnumbered(line), number) {
        (TextItem::Fields(fields), Some(step)) if fields.len() >= 2 => TextItem::Step {
            source: SourceKind::KvText,
            step: Some(step),
            fields,
            tail: None,
        },
        (item, _) => item,
    }
}

/// [`parse_plain_line`] after the line number.
fn parse_unnumbered(line: &str) -> TextItem {
    if let Some(text) = exceptions::parse_fatal(line) {
        return TextItem::Fatal(text);
    }
    let t = line.trim();
    if t.trim_start_matches('>').trim().is_empty() {
        return TextItem::Blank;
    }
    // A rule between records (`-----`, `=====`), a box table's border (`╒═══╤═══╕`).
    if t.len() >= 3 && t.bytes().all(|b| matches!(b, b'-' | b'=' | b'*' | b'#')) {
        return TextItem::Blank;
    }
    // Box-drawing characters (U+2500–U+257F) all start with the byte 0xE2.
    if memchr::memchr(0xE2, t.as_bytes()).is_some() {
        if tables::is_box_border(t) {
            return TextItem::Blank;
        }
        if let Some(fields) = tables::parse_box_row(t) {
            return TextItem::Fields(fields);
        }
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
    if let Some(body) = kv::dllogger_body(t) {
        return kv::parse_kv_line(&body).unwrap_or(TextItem::Other);
    }
    if let Some(n) = step_prefix::bar_only(t) {
        return TextItem::Bar(n);
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
    if let Some(item) = kv::parse_kv_line(t) {
        return item;
    }
    if let Some(step) = kv::parse_step_header(t).or_else(|| kv::train_step_done(t)) {
        return TextItem::StepHeader(step);
    }
    if let Some(item) = exceptions::parse_traceback(line) {
        return item;
    }
    if let Some((k, v)) = kv::parse_field_line(t) {
        return TextItem::Fields(vec![(k, v)]);
    }
    if kv::is_section_title(t) {
        return TextItem::Title(t.to_string());
    }
    TextItem::Other
}
