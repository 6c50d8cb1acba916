//! W&B transaction logs (`wandb/offline-run-*/run-*.wandb`): a 7-byte header (`:W&B`,
//! magic 0xBEE1, version 0), then the LevelDB log framing (32 KiB blocks of records with
//! a CRC-32 of type and data, a length and a FULL/FIRST/MIDDLE/LAST type) around
//! `Record` protobufs (wandb_internal.proto). History records become per-step records;
//! their values are JSON text that may hold bare `NaN`/`Infinity`. Config records give
//! the run's configuration.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use prost::Message;

use super::json_num::{fast_number, json_number};
use super::rows::{Keys, RowWriter};
use super::wire;
use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, SourceKind};

/// The first bytes of every `.wandb` file.
pub const MAGIC: &[u8] = b":W&B";
/// File header: ident, magic (u16 LE), version (u8).
const FILE_HEADER: usize = 7;
/// LevelDB log block size.
const BLOCK: usize = 32768;
/// Blocks read at a time.
const CHUNK_BLOCKS: usize = 128;
/// Record header: CRC (u32 LE), length (u16 LE), type (u8).
const REC_HEADER: usize = 7;

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

/// `RunRecord`, its config.
#[derive(Clone, PartialEq, Message)]
pub struct RunRecord {
    /// The config at `wandb.init`.
    #[prost(message, optional, tag = "4")]
    pub config: Option<ConfigRecord>,
}

/// The key of an item: `key`, or its `nested_key` parts joined with `.`.
fn item_key(key: &str, nested: &[String]) -> String {
    if key.is_empty() {
        nested.join(".")
    } else {
        key.to_string()
    }
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
struct Row {
    fields: Vec<(u32, f64)>,
    step: Option<i64>,
    trainer_step: Option<i64>,
    timestamp: Option<f64>,
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

    /// Hand the row to `w` (dropped when it kept no number).
    fn finish(&self, w: &mut RowWriter, line: u64, stats: &mut FileStats) {
        let step = self.trainer_step.or(self.step);
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
fn history_row(h: &HistoryRecord, keys: &mut Keys, row: &mut Row) {
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
fn fast_history(rec: &[u8], keys: &mut Keys, row: &mut Row) -> Option<bool> {
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

/// True when a `Record`'s top level is well formed and holds no config (5) or run (17)
/// and at most one history (2), as bytes: what [`fast_history`] walks, seen without
/// walking the history itself.
fn without_config(rec: &[u8]) -> bool {
    use wire::Payload;
    let mut pos = 0;
    let mut history = false;
    while pos < rec.len() {
        match wire::field(rec, &mut pos) {
            Some((2, Payload::Bytes(_))) if !history => history = true,
            Some((2 | 5 | 17, _)) | None => return false,
            Some(_) => {}
        }
    }
    true
}

/// Apply a config record's updates and removals to `out` (flattened `key → text`).
fn apply_config(c: &ConfigRecord, out: &mut BTreeMap<String, String>) {
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

/// Stream the history rows of one `.wandb` file into `w` (and its config into `config`
/// when asked). The file is read 4 MiB at a time; each chunk's records are framed and
/// CRC-checked in order, then parsed in parallel ([`parse_records`]).
pub fn read(
    path: &Path,
    mut input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    mut config: Option<&mut BTreeMap<String, String>>,
) -> Result<()> {
    let io = |e| Error::io(path, e);
    let mut chunk = vec![0u8; CHUNK_BLOCKS * BLOCK];
    // Whole records of the chunk, and the fragmented ones assembled.
    let mut recs: Vec<RecRef> = Vec::new();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    // Offset in the file of the record being assembled.
    let mut pending_at: u64 = 0;
    let mut in_record = false;
    let mut n_records: u64 = 0;
    let mut block_start: u64 = 0;
    let mut first = true;
    let mut ended = false;
    while !ended {
        let got_chunk = read_block(&mut input, &mut chunk).map_err(io)?;
        if got_chunk == 0 {
            break;
        }
        recs.clear();
        owned.clear();
        let mut framing: Result<()> = Ok(());
        let mut block_at = 0usize;
        'blocks: while block_at < got_chunk {
            let got = (got_chunk - block_at).min(BLOCK);
            let buf = &chunk[block_at..block_at + got];
            let mut pos = 0usize;
            if first {
                first = false;
                let ok = buf.len() >= FILE_HEADER
                    && buf.starts_with(MAGIC)
                    && buf.get(4..6) == Some(&[0xE1, 0xBE][..]);
                if !ok {
                    return Err(Error::format(
                        path,
                        Position::Byte(0),
                        "not a W&B transaction log: the file does not start with \":W&B\" and magic 0xBEE1",
                    ));
                }
                if buf.get(6) != Some(&0) {
                    return Err(Error::format(
                        path,
                        Position::Byte(6),
                        format!(
                            "W&B transaction log version {} (only version 0 is known)",
                            buf[6]
                        ),
                    ));
                }
                pos = FILE_HEADER;
            }
            while pos + REC_HEADER <= buf.len() {
                let h = &buf[pos..pos + REC_HEADER];
                let crc = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                let len = u16::from_le_bytes([h[4], h[5]]) as usize;
                let typ = h[6];
                let at = block_start + pos as u64;
                if typ == 0 && len == 0 && crc == 0 {
                    // Zero padding: the writer's preallocated or flushed tail.
                    if buf[pos..].iter().all(|b| *b == 0) {
                        if got < BLOCK {
                            ended = true;
                            break 'blocks;
                        }
                        break;
                    }
                }
                let Some(data) = buf.get(pos + REC_HEADER..pos + REC_HEADER + len) else {
                    if got < BLOCK {
                        truncated(stats, at, n_records);
                        block_start += got as u64;
                        ended = true;
                        break 'blocks;
                    }
                    framing = Err(Error::format(
                        path,
                        Position::Byte(at),
                        format!("W&B record length {len} runs past its 32 KiB block"),
                    ));
                    break 'blocks;
                };
                let mut hasher = crc32fast::Hasher::new();
                hasher.update(&[typ]);
                hasher.update(data);
                if hasher.finalize() != crc {
                    framing = Err(Error::format(
                        path,
                        Position::Byte(at),
                        format!("W&B record CRC mismatch (type {typ}, length {len})"),
                    ));
                    break 'blocks;
                }
                let start = block_at + pos + REC_HEADER;
                pos += REC_HEADER + len;
                // A whole record is read where it lies; a fragmented one is assembled.
                let span = match typ {
                    1 => {
                        pending_at = at;
                        in_record = false;
                        Span::Chunk(start, start + len)
                    }
                    2 => {
                        pending.clear();
                        pending.extend_from_slice(data);
                        pending_at = at;
                        in_record = true;
                        continue;
                    }
                    3 | 4 if in_record => {
                        pending.extend_from_slice(data);
                        if typ == 3 {
                            continue;
                        }
                        in_record = false;
                        owned.push(std::mem::take(&mut pending));
                        Span::Owned(owned.len() - 1)
                    }
                    _ => {
                        framing = Err(Error::format(
                            path,
                            Position::Byte(at),
                            format!("W&B record of unknown or misplaced type {typ}"),
                        ));
                        break 'blocks;
                    }
                };
                n_records += 1;
                recs.push(RecRef {
                    at: pending_at,
                    n: n_records,
                    span,
                });
            }
            block_start += got as u64;
            block_at += got;
            if got < BLOCK {
                ended = true;
            }
        }
        // The records before a framing error are read first: an earlier record's error
        // is the one reported.
        let bytes = |r: &RecRef| match r.span {
            Span::Chunk(a, b) => chunk.get(a..b).unwrap_or_default(),
            Span::Owned(i) => owned.get(i).map_or(&[][..], Vec::as_slice),
        };
        let whole: Vec<(u64, u64, &[u8])> = recs.iter().map(|r| (r.at, r.n, bytes(r))).collect();
        parse_records(path, &whole, stats, w, config.as_deref_mut())?;
        framing?;
    }
    if in_record {
        truncated(stats, pending_at, n_records);
    }
    stats.bytes = block_start;
    stats.lines = n_records;
    Ok(())
}

/// Where a framed record's bytes are: in the chunk, or assembled from fragments.
enum Span {
    Chunk(usize, usize),
    Owned(usize),
}

/// A framed, CRC-checked record: its file offset, its number (1-based), its bytes.
struct RecRef {
    at: u64,
    n: u64,
    span: Span,
}

/// The rows of a run of records with part-local key ids (parsed on a worker).
#[derive(Default)]
struct Part {
    names: Vec<String>,
    /// `(step, timestamp, record number, fields end)`.
    rows: Vec<(Option<i64>, Option<f64>, u64, usize)>,
    fields: Vec<(u32, f64)>,
}

/// Records per parallel part.
const PART_RECORDS: usize = 2048;

/// Parse `recs` (`(offset, number, bytes)`, in file order) into `w`: in parallel parts
/// with their own key ids, renumbered into the file's keys in order (so keys keep their
/// first-seen order); the first record that is not a `Record` protobuf is the error. With
/// `config` (a run's configuration is wanted, not its rows), one by one: history records
/// are only walked, and the others decoded to apply their config.
fn parse_records(
    path: &Path,
    recs: &[(u64, u64, &[u8])],
    stats: &mut FileStats,
    w: &mut RowWriter,
    config: Option<&mut BTreeMap<String, String>>,
) -> Result<()> {
    use rayon::prelude::*;
    let bad = |at: u64, n: u64, e: prost::DecodeError| {
        Error::format(
            path,
            Position::Byte(at),
            format!("record {n} is not a W&B Record protobuf: {e}"),
        )
    };
    if let Some(cfg) = config {
        let mut row = Row::default();
        for &(at, n, bytes) in recs {
            // A record whose top level holds no config or run (history, or nothing) has
            // no config, and its row is not wanted here: only the others are decoded.
            // (The scan that read the same file before has already refused a record
            // prost cannot decode.)
            if without_config(bytes) {
                continue;
            }
            let mut rec = Record::decode(bytes).map_err(|e| bad(at, n, e))?;
            if let Some(h) = rec.history.take() {
                history_row(&h, &mut w.keys, &mut row);
                row.finish(w, n, stats);
            }
            if let Some(c) = rec.run.as_ref().and_then(|r| r.config.as_ref()) {
                apply_config(c, cfg);
            }
            if let Some(c) = &rec.config {
                apply_config(c, cfg);
            }
        }
        return Ok(());
    }
    let parts: Vec<(Part, Option<Error>)> = recs
        .par_chunks(PART_RECORDS)
        .map(|part| {
            let mut keys = Keys::default();
            let mut row = Row::default();
            let mut out = Part::default();
            for &(at, n, bytes) in part {
                let got = match fast_history(bytes, &mut keys, &mut row) {
                    Some(got) => got,
                    None => match Record::decode(bytes) {
                        Ok(rec) => match &rec.history {
                            Some(h) => {
                                history_row(h, &mut keys, &mut row);
                                true
                            }
                            None => false,
                        },
                        Err(e) => {
                            out.names = keys.names().to_vec();
                            return (out, Some(bad(at, n, e)));
                        }
                    },
                };
                if got && !row.fields.is_empty() {
                    out.fields.extend_from_slice(&row.fields);
                    let step = row.trainer_step.or(row.step);
                    out.rows.push((step, row.timestamp, n, out.fields.len()));
                }
            }
            out.names = keys.names().to_vec();
            (out, None)
        })
        .collect();
    let mut ids: Vec<(u32, f64)> = Vec::new();
    for (part, err) in parts {
        let map: Vec<u32> = part.names.iter().map(|k| w.keys.id_str(k)).collect();
        let mut start = 0;
        for &(step, ts, n, end) in &part.rows {
            ids.clear();
            ids.extend(
                part.fields
                    .get(start..end)
                    .unwrap_or_default()
                    .iter()
                    .map(|&(k, v)| (map.get(k as usize).copied().unwrap_or(u32::MAX), v)),
            );
            start = end;
            w.row(step, ts, SourceKind::Wandb, n, &ids, stats);
        }
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

/// Fill `block` from `r`; returns the bytes read (short only at end of file).
fn read_block(r: &mut impl Read, block: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < block.len() {
        match r.read(&mut block[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A record cut by the end of the file (a run killed mid-write): a warning, the records
/// before it stand.
fn truncated(stats: &mut FileStats, at: u64, n: u64) {
    stats.truncated_last_line = true;
    stats.bad_line(
        n + 1,
        format!("truncated last record at byte {at}: the file ends inside it"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str, json: &str) -> HistoryItem {
        HistoryItem {
            key: String::new(),
            nested_key: vec![key.to_string()],
            boolean: None,
            integer: None,
            number: None,
            value_json: json.to_string(),
        }
    }

    #[test]
    fn history_values_bare_nan_strings_media_and_the_trainer_step() {
        let h = HistoryRecord {
            item: vec![
                item("_step", "7"),
                item("_timestamp", "1700000000.5"),
                item("train/global_step", "70"),
                item("a", "NaN"),
                item("b", "-Infinity"),
                item("c", "\"NaN\""),
                item("d", "true"),
                item(
                    "e",
                    "{\"x\": 1.5, \"img\": {\"_type\": \"image-file\", \"w\": 3}}",
                ),
                HistoryItem {
                    number: Some(2.5),
                    value_json: String::new(),
                    ..item("f", "")
                },
            ],
            step: Some(HistoryStep { num: 7 }),
        };
        // The allocation-free walk reads the same row from the encoded record.
        let bytes = Record {
            history: Some(h.clone()),
            config: None,
            run: None,
        }
        .encode_to_vec();
        // Both paths, each with its own keys, as the records a reader hands on.
        let rows = |fast: bool| {
            let mut batches = Vec::new();
            let mut sink = |b| {
                batches.push(b);
                None
            };
            let mut w = RowWriter::new(&mut sink);
            let mut row = Row::default();
            if fast {
                assert_eq!(fast_history(&bytes, &mut w.keys, &mut row), Some(true));
            } else {
                history_row(&h, &mut w.keys, &mut row);
            }
            row.finish(&mut w, 1, &mut FileStats::default());
            w.flush();
            drop(w);
            let mut out = Vec::new();
            let mut names = Vec::new();
            for b in &batches {
                super::super::rows::to_records(b, &mut names, 0, &mut |r| out.push(r.clone()));
            }
            out
        };
        let (fast, slow) = (rows(true), rows(false));
        // (Debug text: the row holds a NaN, which `==` never equals.)
        assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
        assert_eq!(slow.len(), 1);
        let r = &slow[0];
        assert_eq!(r.step, Some(70), "train/global_step wins over _step");
        assert_eq!(r.timestamp, Some(1_700_000_000.5));
        let keys: Vec<&str> = r.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["train/global_step", "a", "b", "d", "e.x", "f"]);
        assert!(r.fields[1].1.is_nan());
        assert_eq!(r.fields[2].1, f64::NEG_INFINITY);
        assert_eq!(r.fields[3].1, 1.0);
        assert_eq!(r.fields[4].1, 1.5);
        assert_eq!(r.fields[5].1, 2.5);
    }
}
