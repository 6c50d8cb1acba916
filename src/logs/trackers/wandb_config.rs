//! A W&B run's `files/config.yaml` (what a synced run keeps; a run downloaded from the W&B
//! UI has it too): each top-level key maps to `{desc, value}` (or `{value}` in newer
//! clients), written by PyYAML in block style. Read here with a small reader of that
//! block-style subset (mappings, indentless sequences, plain and quoted scalars, `{}`/`[]`,
//! plain scalars folded over lines), so no YAML crate is built for one file.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::value::Value;
use prost::Message;

/// The config file's name under `<run>/files/`.
pub const CONFIG: &str = "config.yaml";

/// One significant line: its indent, its text (trimmed), its 1-based number.
struct Line<'a> {
    indent: usize,
    text: &'a str,
    no: usize,
}

/// Add the run configuration of W&B `config.yaml` at `path` to `out` (flattened
/// `key → text`, as the `.wandb` config records are); W&B's own `_wandb` and
/// `wandb_version` keys are left out.
pub fn read(path: &Path, out: &mut BTreeMap<String, String>) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let doc = parse(&text)
        .map_err(|(line, msg)| Error::format(path, Position::Line(line as u64), msg))?;
    let Value::Dict(items) = doc else {
        return Err(Error::format(
            path,
            Position::File,
            "W&B config.yaml is not a mapping of keys",
        ));
    };
    for (k, v) in items {
        let Value::Str(k) = k else { continue };
        if k == "wandb_version" || k.starts_with("_wandb") {
            continue;
        }
        let v = v.get("value").cloned().unwrap_or(v);
        super::flatten_value(&v, &k, out);
    }
    Ok(())
}

/// Parse a block-style YAML document; errors are `(line, reason)`.
fn parse(text: &str) -> std::result::Result<Value, (usize, String)> {
    let lines: Vec<Line> = text
        .lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let t = l.trim();
            if t.is_empty() || t.starts_with('#') || t == "---" {
                return None;
            }
            Some(Line {
                indent: l.len() - l.trim_start_matches(' ').len(),
                text: t,
                no: i + 1,
            })
        })
        .collect();
    let mut at = 0;
    let Some(first) = lines.first() else {
        return Ok(Value::Dict(Vec::new()));
    };
    let v = block(&lines, &mut at, first.indent)?;
    match lines.get(at) {
        Some(l) => Err((l.no, format!("unexpected indentation: {:?}", l.text))),
        None => Ok(v),
    }
}

/// The block (mapping or sequence) whose lines start at `*at` with indent `indent`.
fn block(
    lines: &[Line],
    at: &mut usize,
    indent: usize,
) -> std::result::Result<Value, (usize, String)> {
    let is_item = |l: &Line| l.text == "-" || l.text.starts_with("- ");
    if lines.get(*at).is_some_and(is_item) {
        let mut items = Vec::new();
        while let Some(l) = lines.get(*at).filter(|l| l.indent == indent && is_item(l)) {
            *at += 1;
            let rest = l.text.get(1..).unwrap_or_default().trim();
            if rest.is_empty() {
                items.push(nested(lines, at, indent, false)?);
            } else {
                items.push(scalar(&folded(lines, at, indent, rest)));
            }
        }
        return Ok(Value::List(items));
    }
    let mut items = Vec::new();
    while let Some(l) = lines.get(*at).filter(|l| l.indent == indent) {
        *at += 1;
        let Some((key, rest)) = split_key(l.text) else {
            return Err((l.no, format!("expected `key: value`, found {:?}", l.text)));
        };
        let v = if rest.is_empty() {
            nested(lines, at, indent, true)?
        } else {
            scalar(&folded(lines, at, indent, rest))
        };
        items.push((Value::Str(unquote(key)), v));
    }
    Ok(Value::Dict(items))
}

/// The value under a key (or `-`) with nothing after it: a deeper block, an indentless
/// sequence under a key, or null.
fn nested(
    lines: &[Line],
    at: &mut usize,
    indent: usize,
    under_key: bool,
) -> std::result::Result<Value, (usize, String)> {
    match lines.get(*at) {
        Some(n) if n.indent > indent => block(lines, at, n.indent),
        Some(n)
            if under_key && n.indent == indent && (n.text == "-" || n.text.starts_with("- ")) =>
        {
            block(lines, at, indent)
        }
        _ => Ok(Value::None),
    }
}

/// `rest` joined with the deeper lines that continue it (PyYAML folds long scalars).
fn folded(lines: &[Line], at: &mut usize, indent: usize, rest: &str) -> String {
    let mut s = rest.to_string();
    while let Some(n) = lines.get(*at).filter(|n| n.indent > indent) {
        s.push(' ');
        s.push_str(n.text);
        *at += 1;
    }
    s
}

/// `key: rest` of a mapping line (the key possibly quoted).
fn split_key(t: &str) -> Option<(&str, &str)> {
    let end = match t.chars().next()? {
        q @ ('\'' | '"') => t.get(1..)?.find(q)? + 2,
        _ => 0,
    };
    let colon = end
        + t.get(end..)?
            .find(": ")
            .or_else(|| t.ends_with(':').then(|| t.len() - 1 - end))?;
    Some((t.get(..colon)?.trim(), t.get(colon + 1..)?.trim()))
}

/// A quoted key or scalar's text.
fn unquote(s: &str) -> String {
    if s.len() >= 2 && s.starts_with('\'') && s.ends_with('\'') {
        return s[1..s.len() - 1].replace("''", "'");
    }
    if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') {
        if let Ok(Value::Str(v)) = crate::json::parse_value(s) {
            return v;
        }
        return s[1..s.len() - 1].to_string();
    }
    s.to_string()
}

/// A YAML 1.1 scalar as PyYAML's SafeDumper writes them.
fn scalar(s: &str) -> Value {
    match s {
        "null" | "~" | "Null" | "NULL" => return Value::None,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        "{}" => return Value::Dict(Vec::new()),
        "[]" => return Value::List(Vec::new()),
        ".nan" | ".NaN" | ".NAN" => return Value::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" => return Value::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Value::Float(f64::NEG_INFINITY),
        _ => {}
    }
    if s.starts_with('\'') || s.starts_with('"') {
        return Value::Str(unquote(s));
    }
    let digits = s.trim_start_matches(['-', '+']);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = s.parse::<i64>() {
            return Value::Int(i);
        }
    }
    // YAML floats need a digit and a dot or exponent (`1.0e-06`, `0.04`); `1e5` stays text
    // in YAML 1.1, as PyYAML reads it.
    let float_like = s.bytes().any(|b| b.is_ascii_digit())
        && s.contains('.')
        && s.bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
    if float_like {
        if let Ok(f) = s.parse::<f64>() {
            return Value::Float(f);
        }
    }
    Value::Str(s.to_string())
}

/// `ConfigRecord`.
#[derive(Clone, PartialEq, Message)]
pub struct ConfigRecord {
    /// Keys set.
    #[prost(message, repeated, tag = "1")]
    pub update: Vec<ConfigItem>,
    /// Keys removed.
    #[prost(message, repeated, tag = "2")]
    pub remove: Vec<ConfigItem>,
}

/// `ConfigItem`.
#[derive(Clone, PartialEq, Message)]
pub struct ConfigItem {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The key as path parts.
    #[prost(string, repeated, tag = "2")]
    pub nested_key: Vec<String>,
    /// The value as JSON text.
    #[prost(string, tag = "16")]
    pub value_json: String,
}

/// The key of an item: `key`, or its `nested_key` parts joined with `.`.
pub(super) fn item_key(key: &str, nested: &[String]) -> String {
    if key.is_empty() {
        nested.join(".")
    } else {
        key.to_string()
    }
}

// The config records of a `.wandb` file (`wandb.rs` reads the file).

/// True when a `Record`'s top level is well formed and holds no config (5) or run (17)
/// and at most one history (2), as bytes: what [`fast_history`] walks, seen without
/// walking the history itself.
pub(super) fn without_config(rec: &[u8]) -> bool {
    use super::wire::Payload;
    let mut pos = 0;
    let mut history = false;
    while pos < rec.len() {
        match super::wire::field(rec, &mut pos) {
            Some((2, Payload::Bytes(_))) if !history => history = true,
            Some((2 | 5 | 17, _)) | None => return false,
            Some(_) => {}
        }
    }
    true
}

/// Apply a config record's updates and removals to `out` (flattened `key → text`).
pub(super) fn apply_config(c: &ConfigRecord, out: &mut BTreeMap<String, String>) {
    for it in &c.update {
        let key = item_key(&it.key, &it.nested_key);
        if key.starts_with("_wandb") {
            continue;
        }
        match crate::json::parse_value(&it.value_json) {
            Ok(v) => super::flatten_value(&v, &key, out),
            Err(_) => {
                out.insert(key, it.value_json.clone());
            }
        }
    }
    for it in &c.remove {
        let key = item_key(&it.key, &it.nested_key);
        out.retain(|k, _| k != &key && !k.starts_with(&format!("{key}.")));
    }
}

/// Apply config records kept by `wandb::read_with_configs` to `out`, in order, as a config
/// pass over the file ([`read`] with a config) would.
pub fn apply_configs(configs: &[ConfigRecord], out: &mut BTreeMap<String, String>) {
    for c in configs {
        apply_config(c, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyyaml_block_style_config() {
        // What `wandb.sdk.lib.config_util.save_config_file_from_dict` writes (PyYAML
        // SafeDumper, block style), with nesting, an indentless list and a folded string.
        let text = "wandb_version: 1\n\n_wandb:\n  desc: null\n  value: {}\nlr:\n  desc: null\n  value: 1.0e-06\n\
model:\n  value:\n    name: Qwen2.5-0.5B\n    layers: 2\n    tags:\n    - a\n    - 'b c'\n\
note:\n  value: a long plain string that PyYAML\n    folds onto a second line\nflag:\n  value: true\n\
empty:\n  value: []\n";
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join(CONFIG);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
        let mut out = BTreeMap::new();
        read(&p, &mut out).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<(&str, &str)> = out.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("empty", "[]"),
                ("flag", "true"),
                ("lr", "0.000001"),
                ("model.layers", "2"),
                ("model.name", "Qwen2.5-0.5B"),
                ("model.tags", "[a, b c]"),
                (
                    "note",
                    "a long plain string that PyYAML folds onto a second line"
                ),
            ]
        );
        std::fs::write(&p, "lr:\n  value: 1\n bad: 2\n").unwrap_or_else(|e| panic!("{e}"));
        let err = read(&p, &mut BTreeMap::new())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
    }
}
