//! The one-line `.jsonl` dump of the self-hosted trainer (`dump_format: jsonl`):
//! `json.dumps(dict) + "\n"` with tensors `.tolist()`-ed into nested lists, and bare
//! `NaN`/`Infinity`/`-Infinity` where values were not finite.
//!
//! The reader returns the plain value tree, its lists of numbers packed as they are read
//! ([`Value::Packed`], a few bytes per number instead of a `Value` each);
//! [`Value::to_tensor`] turns the nested lists into tensors when a caller needs them.

use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::value::Value;

/// Read a one-line JSON dump into a value tree (a dict).
///
/// A trailing newline (and blank lines after it) are accepted, as is a pretty-printed
/// object over several lines; anything after the object is an error at its line and
/// column, since a dump holds exactly one object.
pub fn read_dump_jsonl(path: &Path) -> Result<Value> {
    let bytes = if crate::formats::source::is_remote(path) {
        crate::formats::source::read_cached(path)?.to_vec()
    } else {
        std::fs::read(path).map_err(|e| Error::io(path, e))?
    };
    parse_dump_jsonl(path, &bytes)
}

/// [`read_dump_jsonl`] on bytes already read from `path` (named in errors).
pub fn parse_dump_jsonl(path: &Path, bytes: &[u8]) -> Result<Value> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&c| c == b'\n')
            .count() as u64;
        Error::format(
            path,
            Position::Line(line),
            format!("not UTF-8 (byte {})", e.valid_up_to()),
        )
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(Error::format(
            path,
            Position::File,
            "empty dump: expected one JSON object on one line",
        ));
    }
    // The whole file is one document: a pretty-printed `.json` dump parses too, and
    // anything after the object is serde_json's "trailing characters" at its position.
    let value = crate::json::parse_value_packed(text).map_err(|e| {
        let msg = if e.msg.contains("trailing characters") {
            "a dump holds one JSON object, but more content follows it here".to_string()
        } else {
            e.msg
        };
        Error::format(path, e.pos, msg)
    })?;
    if !matches!(value, Value::Dict(_)) {
        return Err(Error::format(
            path,
            Position::File,
            format!("a dump is a JSON object, found a {}", value.type_name()),
        ));
    }
    Ok(value)
}
