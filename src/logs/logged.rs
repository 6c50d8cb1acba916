//! A metric a run logged at a step (losscheck's `--logs FILE`), here with the log
//! readers so that the tool sees only numbers: a JSONL metrics
//! file (flat records, verl's file-logger lines) or a console log in any of the text
//! formats logscan reads (slime's `step N: {'train/pg_loss': …}`, verl's
//! `step:N - actor/pg_loss:…`, TRL dicts), so the stack's own console can be checked.

use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::logs::textlog::{parse_text_line, TextAssembler};

/// The last value of `key` logged at `step` in `path`, with its 1-based line.
///
/// A file whose first non-blank line is a JSON object is read as JSONL
/// ([`crate::logs::steps::metric_at_step`]: a line that is not JSON is an error naming
/// it); any other file as a text log, line by line, lines that are not step records
/// skipped. Errors: the file unreadable; a text log in which no line is a step record.
pub fn metric_at_step(path: &Path, step: i64, key: &str) -> Result<Option<(usize, f64)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    if first.is_none_or(|l| l.starts_with('{') && crate::json::parse_value(l).is_ok()) {
        return crate::logs::steps::metric_at_step(path, step, key);
    }
    let mut asm = TextAssembler::new(0);
    for (i, line) in text.lines().enumerate() {
        asm.push(i as u64 + 1, parse_text_line(line));
    }
    asm.finish();
    if !asm.records.iter().any(|r| r.step.is_some()) {
        return Err(Error::format(
            path,
            Position::File,
            "neither JSONL nor a console log with step records (`step N: {…}`, `step:N - key:value`)",
        ));
    }
    Ok(asm
        .records
        .iter()
        .rev()
        .filter(|r| r.step == Some(step))
        .filter_map(|r| {
            let v = r.fields.iter().find(|(k, _)| k == key)?.1;
            Some((r.line as usize, v))
        })
        .next())
}
