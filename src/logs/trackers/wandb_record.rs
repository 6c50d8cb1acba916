//! The `Record` protobuf of a `.wandb` file (wandb_internal.proto, the members read here)
//! and its history row: walked straight from the bytes where it has the usual shape,
//! decoded with prost otherwise. Split from `wandb.rs`, which frames the file.

use prost::Message;

use super::json_num::{fast_number, json_number};
use super::rows::{Keys, RowWriter};
use super::wandb_config::item_key;
use super::wandb_config::ConfigRecord;
use super::wire;
use crate::model::log::{FileStats, SourceKind};

/// `Record`, the members read here (history, config, run).
#[derive(Clone, PartialEq, Message)]
pub struct Record {
    /// A history row.
    #[prost(message, optional, tag = "2")]
    pub history: Option<HistoryRecord>,
    /// A config update.
    #[prost(message, optional, tag = "5")]
    pub config: Option<ConfigRecord>,
    /// The run record (carries the initial config).
    #[prost(message, optional, tag = "17")]
    pub run: Option<RunRecord>,
}

/// `HistoryRecord`: one `wandb.log` row.
#[derive(Clone, PartialEq, Message)]
pub struct HistoryRecord {
    /// The row's items.
    #[prost(message, repeated, tag = "1")]
    pub item: Vec<HistoryItem>,
    /// The row's `_step`.
    #[prost(message, optional, tag = "2")]
    pub step: Option<HistoryStep>,
}

/// `HistoryStep`.
#[derive(Clone, PartialEq, Message)]
pub struct HistoryStep {
    /// The step number.
    #[prost(int64, tag = "1")]
    pub num: i64,
}

/// `HistoryItem`: a key and its value, as JSON text or (newer clients) typed.
#[derive(Clone, PartialEq, Message)]
pub struct HistoryItem {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The key as path parts (newer clients), joined with `.` here.
    #[prost(string, repeated, tag = "2")]
    pub nested_key: Vec<String>,
    /// A boolean value.
    #[prost(bool, optional, tag = "4")]
    pub boolean: Option<bool>,
    /// An integer value.
    #[prost(sint64, optional, tag = "5")]
    pub integer: Option<i64>,
    /// A float value.
    #[prost(double, optional, tag = "6")]
    pub number: Option<f64>,
    /// The value as JSON text.
    #[prost(string, tag = "16")]
    pub value_json: String,
}

/// `RunRecord`, its config.
#[derive(Clone, PartialEq, Message)]
pub struct RunRecord {
    /// The config at `wandb.init`.
    #[prost(message, optional, tag = "4")]
    pub config: Option<ConfigRecord>,
}

/// Numeric leaves of a JSON object value (`wandb.log({"a": {"b": 1}})`) as
/// `(key.sub, value)`, skipping media and tables (objects with a `_type`).
fn nested_numbers(key: &str, text: &str, out: &mut Vec<(String, f64)>) {
    let Ok(v) = crate::json::parse_value(text) else {
        return;
    };
    fn walk(prefix: &str, v: &crate::value::Value, out: &mut Vec<(String, f64)>) {
        if let Some(d) = v.as_dict() {
            if v.get("_type").is_some() {
                return;
            }
            for (k, child) in d {
                if let Some(k) = k.as_str() {
                    walk(&format!("{prefix}.{k}"), child, out);
                }
            }
        } else if let (Some(x), false) = (v.as_f64(), v.as_str().is_some()) {
            out.push((prefix.to_string(), x));
        }
    }
    walk(key, &v, out);
}

/// Keys whose value is the trainer's step, preferred to W&B's own `_step` (the HF/TRL
/// callback logs `train/global_step` and lets `_step` count log calls).
const STEP_KEYS: [&[u8]; 2] = [b"train/global_step", b"global_step"];

/// A history row being built: the numbers kept (interned keys), W&B's `_step`, the
/// trainer's step, the `_timestamp`. Reused from row to row.
#[derive(Default)]
pub(super) struct Row {
    pub(super) fields: Vec<(u32, f64)>,
    step: Option<i64>,
    trainer_step: Option<i64>,
    pub(super) timestamp: Option<f64>,
    nested: Vec<(String, f64)>,
}

/// An item's value as written: JSON text (as bytes, not yet checked for UTF-8), or a
/// typed member.
enum ItemValue<'a> {
    Json(&'a [u8]),
    Number(Option<f64>),
}

impl Row {
    fn clear(&mut self) {
        self.fields.clear();
        self.step = None;
        self.trainer_step = None;
        self.timestamp = None;
    }

    /// Add item `key` (W&B's `_…` keys other than `_step`/`_timestamp` are dropped);
    /// `None` when a new key is not UTF-8.
    fn add(&mut self, keys: &mut Keys, key: &[u8], value: ItemValue) -> Option<()> {
        if key.first() == Some(&b'_') && key != b"_step" && key != b"_timestamp" {
            return Some(());
        }
        let v = match value {
            ItemValue::Json(b) => {
                if let Some(v) = fast_number(b) {
                    return self.number(keys, key, v);
                }
                let t = std::str::from_utf8(b).ok()?.trim_start();
                if t.starts_with('{') {
                    let key = std::str::from_utf8(key).ok()?;
                    let mut nested = std::mem::take(&mut self.nested);
                    nested.clear();
                    nested_numbers(key, t, &mut nested);
                    for (k, x) in &nested {
                        self.fields.push((keys.id_str(k), *x));
                    }
                    self.nested = nested;
                    return Some(());
                }
                json_number(t)
            }
            ItemValue::Number(v) => v,
        };
        match v {
            Some(v) => self.number(keys, key, v),
            None => Some(()),
        }
    }

    /// Add number `v` of item `key`.
    fn number(&mut self, keys: &mut Keys, key: &[u8], v: f64) -> Option<()> {
        match key {
            b"_step" => self.step = Some(v as i64),
            b"_timestamp" => self.timestamp = Some(v),
            k => {
                if STEP_KEYS.contains(&k) && v.is_finite() {
                    self.trainer_step = Some(v as i64);
                }
                self.fields.push((keys.id(k)?, v));
            }
        }
        Some(())
    }

    /// The row's step: the trainer's, else W&B's `_step`.
    pub(super) fn step(&self) -> Option<i64> {
        self.trainer_step.or(self.step)
    }

    /// Hand the row to `w` (dropped when it kept no number).
    pub(super) fn finish(&self, w: &mut RowWriter, line: u64, stats: &mut FileStats) {
        let step = self.step();
        w.row(
            step,
            self.timestamp,
            SourceKind::Wandb,
            line,
            &self.fields,
            stats,
        );
    }
}

/// One history row (decoded by prost) into `row`.
pub(super) fn history_row(h: &HistoryRecord, keys: &mut Keys, row: &mut Row) {
    row.clear();
    row.step = h.step.as_ref().map(|s| s.num);
    for it in &h.item {
        let key = item_key(&it.key, &it.nested_key);
        let value = if !it.value_json.is_empty() {
            ItemValue::Json(it.value_json.as_bytes())
        } else {
            ItemValue::Number(
                it.number
                    .or(it.integer.map(|i| i as f64))
                    .or(it.boolean.map(|b| b as u8 as f64)),
            )
        };
        // A `String` key is UTF-8: `add` cannot refuse it.
        let _ = row.add(keys, key.as_bytes(), value);
    }
}

/// The history row of a `Record`'s bytes, walked without allocating its items, into
/// `row`: `Some(false)` when the record holds no history, `None` when the walk meets
/// anything unexpected (the caller then decodes with prost).
pub(super) fn fast_history(rec: &[u8], keys: &mut Keys, row: &mut Row) -> Option<bool> {
    use wire::Payload;
    let mut pos = 0;
    let mut history: Option<&[u8]> = None;
    while pos < rec.len() {
        let (num, p) = wire::field(rec, &mut pos)?;
        match (num, p) {
            (2, Payload::Bytes(h)) if history.is_none() => history = Some(h),
            // Config and run records go through prost (rare, and their config is kept);
            // so does a history field prost would merge or refuse.
            (2 | 5 | 17, _) => return None,
            _ => {}
        }
    }
    let Some(h) = history else {
        return Some(false);
    };
    row.clear();
    let mut pos = 0;
    while pos < h.len() {
        match wire::field(h, &mut pos)? {
            (1, Payload::Bytes(item)) => {
                let (mut key, mut nested, mut nested_n): (&[u8], &[u8], u32) = (b"", b"", 0);
                let mut json: &[u8] = b"";
                // `number`, else `integer`, else `boolean`, as the prost path takes them.
                let (mut number, mut integer, mut boolean) = (None, None, None);
                let mut ip = 0;
                while ip < item.len() {
                    match wire::field(item, &mut ip)? {
                        (1, Payload::Bytes(k)) => key = k,
                        (2, Payload::Bytes(k)) => {
                            nested = k;
                            nested_n += 1;
                        }
                        (4, Payload::Varint(v)) => boolean = Some((v != 0) as u8 as f64),
                        (5, Payload::Varint(v)) => {
                            let i = ((v >> 1) as i64) ^ -((v & 1) as i64);
                            integer = Some(i as f64);
                        }
                        (6, Payload::Fixed64(d)) => {
                            number = Some(f64::from_le_bytes(d.try_into().ok()?));
                        }
                        (16, Payload::Bytes(j)) => json = j,
                        (1 | 2 | 4 | 5 | 6 | 16, _) => return None,
                        _ => {}
                    }
                }
                // Several nested parts are joined with `.` by the prost path.
                if key.is_empty() && nested_n != 1 {
                    return None;
                }
                if key.is_empty() {
                    key = nested;
                } else if nested_n > 0 {
                    // prost checks the parts' UTF-8 too.
                    std::str::from_utf8(nested).ok()?;
                }
                let value = if json.is_empty() {
                    ItemValue::Number(number.or(integer).or(boolean))
                } else {
                    ItemValue::Json(json)
                };
                row.add(keys, key, value)?;
            }
            (1, _) => return None,
            (2, Payload::Bytes(st)) => {
                let mut sp = 0;
                while sp < st.len() {
                    match wire::field(st, &mut sp)? {
                        (1, Payload::Varint(n)) => row.step = Some(n as i64),
                        (1, _) => return None,
                        _ => {}
                    }
                }
            }
            (2, _) => return None,
            _ => {}
        }
    }
    Some(true)
}

/// Record `bytes` parsed: its history row into `row` (`Ok(true)` when it holds one), the
/// config of a run record then of a config record pushed on `configs`. The walk without
/// allocation first; prost for anything else, whose error says the bytes are no `Record`.
pub(super) fn parse_record(
    bytes: &[u8],
    keys: &mut Keys,
    row: &mut Row,
    configs: &mut Vec<ConfigRecord>,
) -> Result<bool, prost::DecodeError> {
    if let Some(got) = fast_history(bytes, keys, row) {
        return Ok(got);
    }
    let mut rec = Record::decode(bytes)?;
    if let Some(c) = rec.run.as_mut().and_then(|r| r.config.take()) {
        configs.push(c);
    }
    if let Some(c) = rec.config.take() {
        configs.push(c);
    }
    Ok(match &rec.history {
        Some(h) => {
            history_row(h, keys, row);
            true
        }
        None => false,
    })
}
