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
use super::wandb_config::item_key;
pub use super::wandb_config::{ConfigItem, ConfigRecord};
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

/// Stream the history rows of one `.wandb` file into `w` (and its config into `config`
/// when asked). The file is read 4 MiB at a time; each chunk's records are framed and
/// CRC-checked in order, then parsed in parallel ([`parse_records`]).
pub fn read(
    path: &Path,
    input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    config: Option<&mut BTreeMap<String, String>>,
) -> Result<()> {
    match config {
        Some(cfg) => read_mode(path, input, stats, w, Mode::Config(cfg)),
        None => read_mode(path, input, stats, w, Mode::Rows(None)),
    }
}

/// Stream the history rows of one `.wandb` file into `w` and keep its config records,
/// in file order, in `configs` (applied with [`super::wandb_config::apply_configs`]): the rows and the config
/// of a run in one pass over the file.
pub fn read_with_configs(
    path: &Path,
    input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    configs: &mut Vec<ConfigRecord>,
) -> Result<()> {
    read_mode(path, input, stats, w, Mode::Rows(Some(configs)))
}

/// What a pass over a `.wandb` file is for.
enum Mode<'a> {
    /// The rows, in parallel parts (and the config records, kept, when given).
    Rows(Option<&'a mut Vec<ConfigRecord>>),
    /// The run's configuration, applied to the map (rows of config records only).
    Config(&'a mut BTreeMap<String, String>),
}

/// [`read`] for `mode`.
fn read_mode(
    path: &Path,
    mut input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    mut mode: Mode,
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
                // A whole record's CRC is checked where it is parsed, in parallel
                // ([`parse_records`]); fragments and anything refused here, now.
                if typ != 1 && record_crc(typ, data) != crc {
                    framing = Err(crc_error(path, at, typ, len));
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
                    crc: (typ == 1).then_some(crc),
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
        let whole: Vec<Framed> = recs.iter().map(|r| (r.at, r.n, bytes(r), r.crc)).collect();
        parse_records(path, &whole, stats, w, &mut mode)?;
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

/// A framed record: its file offset, its number (1-based), its bytes, and the CRC a
/// whole record (type 1) states, checked when it is parsed (fragments are checked as
/// they are framed).
struct RecRef {
    at: u64,
    n: u64,
    span: Span,
    crc: Option<u32>,
}

/// A framed record as [`parse_records`] takes it: offset, number, bytes, CRC to check.
type Framed<'a> = (u64, u64, &'a [u8], Option<u32>);

/// The CRC-32 of a LevelDB-style log record: over its type byte and its data.
fn record_crc(typ: u8, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[typ]);
    hasher.update(data);
    hasher.finalize()
}

/// The error of a record whose CRC does not match.
fn crc_error(path: &Path, at: u64, typ: u8, len: usize) -> Error {
    Error::format(
        path,
        Position::Byte(at),
        format!("W&B record CRC mismatch (type {typ}, length {len})"),
    )
}

/// A whole record's CRC, when it has one to check, as an error when it does not match.
fn check_crc(path: &Path, at: u64, bytes: &[u8], crc: Option<u32>) -> Result<()> {
    match crc {
        Some(c) if record_crc(1, bytes) != c => Err(crc_error(path, at, 1, bytes.len())),
        _ => Ok(()),
    }
}

/// The rows of a run of records with part-local key ids (parsed on a worker).
#[derive(Default)]
struct Part {
    names: Vec<String>,
    /// `(step, timestamp, record number, fields end)`.
    rows: Vec<(Option<i64>, Option<f64>, u64, usize)>,
    fields: Vec<(u32, f64)>,
    /// Config records (a run record's first), in record order.
    configs: Vec<ConfigRecord>,
}

/// Records per parallel part.
const PART_RECORDS: usize = 2048;

/// The error of record `n` at byte `at` of `path` that is no W&B `Record` protobuf.
fn not_a_record(path: &Path, at: u64, n: u64, e: prost::DecodeError) -> Error {
    Error::format(
        path,
        Position::Byte(at),
        format!("record {n} is not a W&B Record protobuf: {e}"),
    )
}

/// Parse `recs` (`(offset, number, bytes)`, in file order) into `w`: in parallel parts
/// with their own key ids, renumbered into the file's keys in order (so keys keep their
/// first-seen order); the first record that is not a `Record` protobuf is the error. With
/// `config` (a run's configuration is wanted, not its rows), one by one: history records
/// are only walked, and the others decoded to apply their config.
fn parse_records(
    path: &Path,
    recs: &[Framed],
    stats: &mut FileStats,
    w: &mut RowWriter,
    mode: &mut Mode,
) -> Result<()> {
    use rayon::prelude::*;
    let bad = |at: u64, n: u64, e: prost::DecodeError| not_a_record(path, at, n, e);
    let keep = match mode {
        Mode::Config(cfg) => return config_records(path, recs, stats, w, cfg),
        Mode::Rows(keep) => keep,
    };
    let parts: Vec<(Part, Option<Error>)> = recs
        .par_chunks(PART_RECORDS)
        .map(|part| {
            let mut keys = Keys::default();
            let mut row = Row::default();
            let mut out = Part::default();
            for &(at, n, bytes, crc) in part {
                if let Err(e) = check_crc(path, at, bytes, crc) {
                    out.names = keys.names().to_vec();
                    return (out, Some(e));
                }
                let got = match fast_history(bytes, &mut keys, &mut row) {
                    Some(got) => got,
                    None => match Record::decode(bytes) {
                        Ok(mut rec) => {
                            if let Some(c) = rec.run.as_mut().and_then(|r| r.config.take()) {
                                out.configs.push(c);
                            }
                            if let Some(c) = rec.config.take() {
                                out.configs.push(c);
                            }
                            match &rec.history {
                                Some(h) => {
                                    history_row(h, &mut keys, &mut row);
                                    true
                                }
                                None => false,
                            }
                        }
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
        if let Some(keep) = keep.as_deref_mut() {
            keep.extend(part.configs);
        }
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

/// [`parse_records`] for a config pass: history records are only walked, the others
/// decoded one by one to apply their config to `cfg`.
fn config_records(
    path: &Path,
    recs: &[Framed],
    stats: &mut FileStats,
    w: &mut RowWriter,
    cfg: &mut BTreeMap<String, String>,
) -> Result<()> {
    let bad = |at: u64, n: u64, e: prost::DecodeError| not_a_record(path, at, n, e);
    {
        let mut row = Row::default();
        for &(at, n, bytes, crc) in recs {
            check_crc(path, at, bytes, crc)?;
            // A record whose top level holds no config or run (history, or nothing) has
            // no config, and its row is not wanted here: only the others are decoded.
            // (The scan that read the same file before has already refused a record
            // prost cannot decode.)
            if super::wandb_config::without_config(bytes) {
                continue;
            }
            let mut rec = Record::decode(bytes).map_err(|e| bad(at, n, e))?;
            if let Some(h) = rec.history.take() {
                history_row(&h, &mut w.keys, &mut row);
                row.finish(w, n, stats);
            }
            if let Some(c) = rec.run.as_ref().and_then(|r| r.config.as_ref()) {
                super::wandb_config::apply_config(c, cfg);
            }
            if let Some(c) = &rec.config {
                super::wandb_config::apply_config(c, cfg);
            }
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
#[path = "wandb_tests.rs"]
mod tests;
