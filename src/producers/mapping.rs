//! A declarative mapping (TOML) for an in-house dump layout: which files hold which step,
//! rank and micro-batch, and which key of a file is which model field — read into the
//! model ([`StepDump`]) without writing Rust. docs/stacks.md has a worked example.
//!
//! ```toml
//! producer = "my-trainer"
//! pattern = "step_{step}/rank_{rank}/micro_{micro}.pt"  # relative to the dump folder
//! positions = "response"                                # or "sequence"
//!
//! [[key]]
//! key = "old_log_probs"   # path in the file's value (dots for nesting; "" = the root)
//! field = "log_probs"     # see FIELDS
//! role = "old"            # rollout | old | current | reference (log_probs only)
//! dtype = "float32"       # optional: the stored dtype required
//! ```
//!
//! Placeholders: `{step}`, `{rank}`, `{micro}` (integers), `{name}` (text: a key with
//! `name = "…"` applies only to files whose `{name}` is that), `{_}` (anything). A file
//! that matches no pattern is ignored; a key absent from a file is `None`; a key present
//! with the wrong type or dtype is an error naming the file and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::sglang::{place, Field};
use super::{walk, StepReader};
use crate::error::{Error, Position, Result};
use crate::model::conventions::{ConventionKey, ConventionSource, ConventionValue};
use crate::model::step::{Cell, LogProbSource, LossRecord, StepDump, TokenPositions};
use crate::model::trajectory::Provenance;
use crate::value::Value;

/// The field names a mapping may use: per-token tensors, then the scalars of the cell's
/// loss record (`loss`, `pg_loss`, `entropy_loss`: a number or a one-element tensor).
pub const FIELDS: [&str; 13] = [
    "log_probs",
    "input_ids",
    "response_ids",
    "response_mask",
    "attention_mask",
    "advantages",
    "entropy",
    "loss_mask",
    "importance_weights",
    "per_token_loss",
    "loss",
    "pg_loss",
    "entropy_loss",
];

/// The scalar fields of a cell's [`LossRecord`] a mapping may fill.
const LOSS_FIELDS: [&str; 3] = ["loss", "pg_loss", "entropy_loss"];

/// A mapping file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    /// The producer's name as reports print it.
    pub producer: String,
    /// File pattern relative to the dump folder.
    pub pattern: String,
    /// `response` (default) or `sequence` columns.
    #[serde(default)]
    pub positions: Option<String>,
    /// The keys read.
    #[serde(rename = "key", default)]
    pub keys: Vec<KeySpec>,
    /// Where the mapping was loaded from (for conventions' evidence).
    #[serde(skip)]
    pub source: PathBuf,
}

/// One key of a mapping.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    /// Path in the file's value.
    pub key: String,
    /// Only for files whose `{name}` placeholder is this.
    #[serde(default)]
    pub name: Option<String>,
    /// The model field.
    pub field: String,
    /// The role, for `log_probs`.
    #[serde(default)]
    pub role: Option<String>,
    /// The stored dtype required (`float32`, `bfloat16`, …).
    #[serde(default)]
    pub dtype: Option<String>,
}

/// One piece of a pattern.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Lit(String),
    Hole(String),
}

fn pieces(pattern: &str) -> std::result::Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            out.push(Piece::Lit(rest[..open].to_string()));
        }
        let close = rest[open..].find('}').ok_or("a '{' without its '}'")? + open;
        let name = &rest[open + 1..close];
        if !["step", "rank", "micro", "name", "_"].contains(&name) {
            return Err(format!(
                "unknown placeholder {{{name}}} (step, rank, micro, name, _)"
            ));
        }
        if matches!(out.last(), Some(Piece::Hole(_))) {
            return Err("two placeholders must be separated by text".into());
        }
        out.push(Piece::Hole(name.to_string()));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Lit(rest.to_string()));
    }
    Ok(out)
}

/// The placeholders' values when `text` matches `pieces` (each hole takes the shortest
/// text up to the next literal; the last one takes the rest).
fn matches(pieces: &[Piece], text: &str) -> Option<BTreeMap<String, String>> {
    let mut vals = BTreeMap::new();
    let mut pos = 0;
    for (i, p) in pieces.iter().enumerate() {
        match p {
            Piece::Lit(l) => {
                if !text[pos..].starts_with(l.as_str()) {
                    return None;
                }
                pos += l.len();
            }
            Piece::Hole(h) => {
                let end = match pieces.get(i + 1) {
                    Some(Piece::Lit(next)) => pos + text[pos..].find(next.as_str())?,
                    _ => text.len(),
                };
                if end == pos || text[pos..end].contains('/') {
                    return None;
                }
                vals.insert(h.clone(), text[pos..end].to_string());
                pos = end;
            }
        }
    }
    (pos == text.len()).then_some(vals)
}

fn field_of(k: &KeySpec) -> std::result::Result<Field, String> {
    let role = |r: &Option<String>| match r.as_deref() {
        Some("rollout") => Ok(LogProbSource::Rollout),
        Some("old") => Ok(LogProbSource::Old),
        Some("current") => Ok(LogProbSource::Current),
        Some("reference") => Ok(LogProbSource::Reference),
        other => Err(format!(
            "key {}: role {other:?} (rollout, old, current, reference)",
            k.key
        )),
    };
    Ok(match k.field.as_str() {
        "log_probs" => Field::LogProbs(role(&k.role)?),
        "input_ids" => Field::InputIds,
        "response_ids" => Field::ResponseIds,
        "response_mask" => Field::ResponseMask,
        "attention_mask" => Field::AttentionMask,
        "advantages" => Field::Advantages,
        "entropy" => Field::Entropy,
        "loss_mask" => Field::LossMask,
        "importance_weights" => Field::ImportanceWeights,
        "per_token_loss" => Field::PerTokenLoss,
        other => {
            return Err(format!(
                "key {}: field {other:?} (one of {})",
                k.key,
                FIELDS.join(", ")
            ))
        }
    })
}

impl Mapping {
    /// Read and check a mapping file.
    ///
    /// Errors: unreadable, not TOML of this shape, an unknown placeholder, field or role
    /// (naming the file).
    pub fn load(path: &Path) -> Result<Mapping> {
        let text = super::walk::read_to_string(path)?;
        let mut m: Mapping = toml::from_str(&text)
            .map_err(|e| Error::format(path, Position::File, format!("not a mapping: {e}")))?;
        m.source = path.to_path_buf();
        pieces(&m.pattern).map_err(|e| Error::format(path, Position::Key("pattern".into()), e))?;
        for k in m
            .keys
            .iter()
            .filter(|k| !LOSS_FIELDS.contains(&k.field.as_str()))
        {
            field_of(k).map_err(|e| Error::format(path, Position::Key("key".into()), e))?;
        }
        match m.positions.as_deref() {
            None | Some("response") | Some("sequence") => Ok(m),
            Some(p) => Err(Error::format(
                path,
                Position::Key("positions".into()),
                format!("{p:?}: response or sequence"),
            )),
        }
    }

    /// Each file under `root` the pattern matches, with its placeholders.
    fn files(&self, root: &Path) -> Result<Vec<(PathBuf, BTreeMap<String, String>)>> {
        let pieces = pieces(&self.pattern)
            .map_err(|e| Error::format(&self.source, Position::Key("pattern".into()), e))?;
        let mut out = Vec::new();
        for p in walk::files_under(root)? {
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace('\\', "/");
            if let Some(v) = matches(&pieces, &rel) {
                for k in ["step", "rank", "micro"] {
                    if v.get(k).is_some_and(|x| x.parse::<i64>().is_err()) {
                        return Err(Error::format(
                            &p,
                            Position::File,
                            format!("{{{k}}} in the name is not an integer"),
                        ));
                    }
                }
                out.push((p, v));
            }
        }
        Ok(out)
    }
}

fn num(v: &BTreeMap<String, String>, k: &str) -> Option<i64> {
    v.get(k).and_then(|x| x.parse().ok())
}

/// The value at a dotted path (`""` = the root).
fn at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    if path.is_empty() || path == "." {
        return Some(v);
    }
    path.split('.').try_fold(v, |v, k| super::field(v, k))
}

impl StepReader for Mapping {
    fn name(&self) -> &'static str {
        "mapping"
    }

    fn detect(&self, root: &Path) -> bool {
        self.files(root).map(|f| !f.is_empty()).unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        let s: std::collections::BTreeSet<i64> = self
            .files(root)?
            .iter()
            .filter_map(|(_, v)| num(v, "step"))
            .collect();
        Ok(s.into_iter().collect())
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let files: Vec<_> = self
            .files(root)?
            .into_iter()
            .filter(|(_, v)| num(v, "step").is_none_or(|s| s == step))
            .collect();
        if files.is_empty() {
            return Err(Error::input(
                root,
                format!(
                    "no file matching {} for step {step} (steps there: {:?})",
                    self.pattern,
                    self.steps(root)?
                ),
            ));
        }
        let positions = match self.positions.as_deref() {
            Some("sequence") => TokenPositions::Sequence,
            _ => TokenPositions::Response,
        };
        let mut cells: BTreeMap<(usize, Option<usize>), Cell> = BTreeMap::new();
        let mut unplaced = Vec::new();
        for (path, vals) in &files {
            let name = vals.get("name");
            let keys: Vec<&KeySpec> = self
                .keys
                .iter()
                .filter(|k| k.name.is_none() || k.name.as_ref() == name)
                .collect();
            if keys.is_empty() {
                unplaced.push(format!("{}: no key of the mapping applies", path.display()));
                continue;
            }
            let v = crate::formats::read_any(path)?;
            let rank = num(vals, "rank").unwrap_or(0).max(0) as usize;
            let micro = num(vals, "micro").map(|m| m.max(0) as usize);
            let cell = cells.entry((rank, micro)).or_insert_with(|| Cell {
                rank,
                micro,
                ..Cell::default()
            });
            cell.batch.positions = positions;
            cell.files.push(path.clone());
            for k in keys {
                let Some(x) = at(&v, &k.key) else { continue };
                if LOSS_FIELDS.contains(&k.field.as_str()) {
                    let n = super::scalar_of(x)
                        .ok_or_else(|| super::unreadable(path, &k.key, "a number", x))?;
                    let rec = cell.loss.get_or_insert_with(|| LossRecord {
                        source: Some(Provenance {
                            file: path.clone(),
                            key: k.key.clone(),
                        }),
                        ..LossRecord::default()
                    });
                    match k.field.as_str() {
                        "loss" => rec.loss = Some(n),
                        "pg_loss" => rec.pg_loss = Some(n),
                        _ => rec.entropy_loss = Some(n),
                    }
                    continue;
                }
                let field = field_of(k)
                    .map_err(|e| Error::format(&self.source, Position::Key("key".into()), e))?;
                let mut t = super::opt_tensor(
                    &Value::Dict(vec![(Value::Str("k".into()), x.clone())]),
                    "k",
                    path,
                )
                .map_err(|_| {
                    super::unreadable(path, &k.key, "a tensor or a rectangular nested list", x)
                })?
                .expect("present");
                t.source.key = k.key.clone();
                if let Some(want) = &k.dtype {
                    let got = t
                        .dtype
                        .map(|d| d.torch_name())
                        .unwrap_or("a list (no dtype)");
                    if got != want.trim_start_matches("torch.") {
                        return Err(Error::format(
                            path,
                            Position::Key(k.key.clone()),
                            format!("stored as {got}, the mapping requires {want}"),
                        ));
                    }
                }
                place(&mut cell.batch, field, t);
            }
        }
        let mut conventions = crate::model::conventions::Conventions::default();
        if let Some(k) = self
            .keys
            .iter()
            .find(|k| k.field == "log_probs" && k.dtype.is_some())
        {
            conventions.set(
                ConventionKey::LogProbDtype,
                ConventionValue::Name(k.dtype.clone().unwrap_or_default()),
                ConventionSource::Flag {
                    name: self.source.display().to_string(),
                },
            );
        }
        Ok(StepDump {
            producer: self.producer.clone(),
            root: root.to_path_buf(),
            step,
            cells: cells.into_values().collect(),
            conventions,
            unplaced,
        })
    }
}
