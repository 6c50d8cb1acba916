//! W&B transaction logs (`wandb/offline-run-*/run-*.wandb`): a 7-byte header (`:W&B`,
//! magic 0xBEE1, version 0), then the LevelDB log framing (32 KiB blocks of records with
//! a CRC-32 of type and data, a length and a FULL/FIRST/MIDDLE/LAST type) around
//! `Record` protobufs (wandb_internal.proto, [`super::wandb_record`]). History records
//! become per-step records; their values are JSON text that may hold bare
//! `NaN`/`Infinity`. Config records give the run's configuration.
//!
//! The blocks have a fixed size and no record header starts in the last six bytes of one
//! (wandb `wandb/sdk/internal/datastore.py`: `LEVELDBLOG_BLOCK_LEN = 32768`,
//! `LEVELDBLOG_HEADER_LEN = 7`, a block tail shorter than a header zero-filled; the same
//! framing as LevelDB's `doc/log_format.md`), so every block starts with a record header
//! and a file can be framed in parts of whole blocks independently: only a record whose
//! fragments (FIRST … LAST) cross a part boundary is joined afterwards, in order.

use std::collections::BTreeMap;
use std::io::Read;
use std::ops::Range;
use std::path::Path;

use prost::Message;

use super::rows::{Keys, RowHead, RowWriter};
pub use super::wandb_config::{ConfigItem, ConfigRecord};
use super::wandb_record::{history_row, parse_record, Row};
pub use super::wandb_record::{HistoryItem, HistoryRecord, HistoryStep, Record, RunRecord};
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
/// Blocks per part framed and parsed on one worker (256 KiB, ~600 history rows of a
/// usual run: 16 parts per chunk for the pool to balance).
const PART_BLOCKS: usize = 8;
/// Record header: CRC (u32 LE), length (u16 LE), type (u8).
const REC_HEADER: usize = 7;

/// Stream the history rows of one `.wandb` file into `w` (and its config into `config`
/// when asked). The file is read 4 MiB at a time; each chunk is framed, CRC-checked and
/// parsed in parallel parts of whole blocks while the next chunk is read, and the parts'
/// rows are handed on in order ([`read_mode`]).
pub fn read(
    path: &Path,
    input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    config: Option<&mut BTreeMap<String, String>>,
) -> Result<()> {
    let mode = match config {
        Some(cfg) => Mode::Config(cfg),
        None => Mode::Rows(None),
    };
    read_mode(path, input, stats, w, mode, Layout::FILE)
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
    read_mode(
        path,
        input,
        stats,
        w,
        Mode::Rows(Some(configs)),
        Layout::FILE,
    )
}

/// What a pass over a `.wandb` file is for.
enum Mode<'a> {
    /// The rows (and the config records, kept, when given).
    Rows(Option<&'a mut Vec<ConfigRecord>>),
    /// The run's configuration, applied to the map (rows of config records only).
    Config(&'a mut BTreeMap<String, String>),
}

/// How a pass cuts the file: blocks per read chunk and per parallel part (tests try
/// every size; the reader uses [`Layout::FILE`]).
#[derive(Clone, Copy)]
struct Layout {
    chunk_blocks: usize,
    part_blocks: usize,
}

impl Layout {
    const FILE: Layout = Layout {
        chunk_blocks: CHUNK_BLOCKS,
        part_blocks: PART_BLOCKS,
    };
}

/// Why a part's framing stopped early: an error, or a record that is no `Record`
/// protobuf (its number is the part's own until the parts before it are counted).
enum Stop {
    Err(Error),
    NotRecord(u64, u64, prost::DecodeError),
}

/// A part of a chunk once framed, and parsed as the pass wants.
#[derive(Default)]
struct PartOut {
    /// MIDDLE/LAST fragments before the part's first FULL or FIRST: the rest of a record
    /// begun in an earlier part, up to its LAST (offset, type, bytes in the chunk).
    lead: Vec<(u64, u8, Range<usize>)>,
    /// A FULL or FIRST was seen: a record left unfinished before it is dropped, as a
    /// reader going front to back drops it.
    starts: bool,
    /// Records completed in the part (its own numbers count from 1).
    records: u64,
    /// The record still open at the part's end: the offset of its FIRST, its bytes so far.
    trail: Option<(u64, Vec<u8>)>,
    /// The data ended in the part: the zero tail of the file's last block (starting at
    /// that offset: the bytes counted as read stop there, as they always have), or a
    /// record cut by the end of the file (at that offset).
    ended: bool,
    zero_tail: Option<u64>,
    cut: Option<u64>,
    /// The first error, after everything above.
    stop: Option<Stop>,
    /// Reading rows: the part's rows, with part-local key ids and record numbers.
    names: Vec<String>,
    heads: Vec<RowHead>,
    fields: Vec<(u32, f64)>,
    non_finite: u64,
    /// Config records in record order (a run record's first); for a config pass, the
    /// records that may hold one, to be decoded in order (offset, number, bytes).
    configs: Vec<ConfigRecord>,
    kept: Vec<(u64, u64, Vec<u8>)>,
}

/// [`read`] for `mode`: chunk `k` is framed and parsed in parts on the rayon pool while
/// this thread hands on chunk `k - 1`'s rows and reads chunk `k + 1` (three buffers in
/// turn), so the reading thread's serial work is the read and the hand-on only.
fn read_mode(
    path: &Path,
    mut input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    mut mode: Mode,
    layout: Layout,
) -> Result<()> {
    let io = |e| Error::io(path, e);
    let size = layout.chunk_blocks * BLOCK;
    let mut bufs = [vec![0u8; size], vec![0u8; size], vec![0u8; size]];
    let got = read_block(&mut input, &mut bufs[0]).map_err(io)?;
    if got > 0 {
        check_header(path, &bufs[0][..got])?;
    }
    let config_pass = matches!(mode, Mode::Config(_));
    let mut st = Stitch::default();
    // (chunk index, bytes) of the chunk to parse; (bytes, parts) of the one parsed before.
    let mut cur = (0usize, got);
    let mut done: Option<(usize, Vec<PartOut>)> = None;
    let mut file_at = 0u64;
    let mut read_err = None;
    loop {
        let (k, got) = cur;
        let [b0, b1, b2] = &mut bufs;
        let (chunk, prev, next) = match k % 3 {
            0 => (&*b0, &*b2, b1),
            1 => (&*b1, &*b0, b2),
            _ => (&*b2, &*b1, b0),
        };
        let mut outs = Vec::new();
        let mut next_got = 0;
        let mut handed = Ok(());
        rayon::in_place_scope(|s| {
            if got > 0 && !st.ended {
                let skip = if k == 0 { FILE_HEADER } else { 0 };
                let outs = &mut outs;
                s.spawn(move |_| {
                    *outs = frame_chunk(path, &chunk[..got], skip, file_at, layout, config_pass);
                });
            }
            if let Some((n, parts)) = done.take() {
                handed = st.hand_on(path, &prev[..n], parts, stats, w, &mut mode);
            }
            if got == size && read_err.is_none() && handed.is_ok() {
                match read_block(&mut input, next) {
                    Ok(n) => next_got = n,
                    Err(e) => read_err = Some(e),
                }
            }
        });
        handed?;
        if got == 0 || st.ended {
            break;
        }
        file_at += got as u64;
        done = Some((got, outs));
        cur = (k + 1, next_got);
    }
    if let Some(e) = read_err {
        return Err(io(e));
    }
    if st.in_record {
        truncated(stats, st.pending_at, st.n_records);
    }
    stats.bytes = st.zero_tail.unwrap_or(file_at);
    stats.lines = st.n_records;
    Ok(())
}

/// The file header at the start of `first` (the first chunk), as an error when it is
/// not a version-0 W&B transaction log.
fn check_header(path: &Path, first: &[u8]) -> Result<()> {
    let ok = first.len() >= FILE_HEADER
        && first.starts_with(MAGIC)
        && first.get(4..6) == Some(&[0xE1, 0xBE][..]);
    if !ok {
        return Err(Error::format(
            path,
            Position::Byte(0),
            "not a W&B transaction log: the file does not start with \":W&B\" and magic 0xBEE1",
        ));
    }
    if first.get(6) != Some(&0) {
        return Err(Error::format(
            path,
            Position::Byte(6),
            format!(
                "W&B transaction log version {} (only version 0 is known)",
                first[6]
            ),
        ));
    }
    Ok(())
}

/// Chunk `chunk` (at file offset `file_at`; its first `skip` bytes are the file header)
/// framed and parsed in parts of `layout.part_blocks` blocks on the pool, in order.
fn frame_chunk(
    path: &Path,
    chunk: &[u8],
    skip: usize,
    file_at: u64,
    layout: Layout,
    config_pass: bool,
) -> Vec<PartOut> {
    use rayon::prelude::*;
    let part = layout.part_blocks * BLOCK;
    let starts: Vec<usize> = (0..chunk.len()).step_by(part).collect();
    starts
        .par_iter()
        .map(|&a| {
            let r = a..(a + part).min(chunk.len());
            let skip = if a == 0 { skip } else { 0 };
            if config_pass {
                config_part(path, chunk, r, skip, file_at)
            } else {
                rows_part(path, chunk, r, skip, file_at)
            }
        })
        .collect()
}

/// A part framed for its rows: each whole record parsed as it is framed, with the
/// part's own key ids.
fn rows_part(path: &Path, chunk: &[u8], r: Range<usize>, skip: usize, at0: u64) -> PartOut {
    let mut out = PartOut::default();
    let mut keys = Keys::default();
    let mut row = Row::default();
    let (mut heads, mut fields, mut configs) = (Vec::new(), Vec::new(), Vec::new());
    let mut non_finite = 0u64;
    frame_part(path, chunk, r, skip, at0, &mut out, &mut |at, n, bytes| {
        let got = parse_record(bytes, &mut keys, &mut row, &mut configs)
            .map_err(|e| Stop::NotRecord(at, n, e))?;
        if got && !row.fields.is_empty() {
            fields.extend_from_slice(&row.fields);
            non_finite += row.fields.iter().filter(|(_, v)| !v.is_finite()).count() as u64;
            heads.push(RowHead {
                step: row.step(),
                timestamp: row.timestamp,
                source: SourceKind::Wandb,
                line: n,
                fields: row.fields.len() as u32,
            });
        }
        Ok(())
    });
    out.names = keys.names().to_vec();
    (out.heads, out.fields, out.configs, out.non_finite) = (heads, fields, configs, non_finite);
    out
}

/// A part framed for a config pass: the records that may hold a config kept, to be
/// decoded in order (history records hold none and are only walked).
fn config_part(path: &Path, chunk: &[u8], r: Range<usize>, skip: usize, at0: u64) -> PartOut {
    let mut out = PartOut::default();
    let mut kept = Vec::new();
    frame_part(path, chunk, r, skip, at0, &mut out, &mut |at, n, bytes| {
        if !super::wandb_config::without_config(bytes) {
            kept.push((at, n, bytes.to_vec()));
        }
        Ok(())
    });
    out.kept = kept;
    out
}

/// What [`frame_part`] hands each record to: offset, the part's own number, bytes.
type OnRecord<'a> = dyn FnMut(u64, u64, &[u8]) -> std::result::Result<(), Stop> + 'a;

/// Where a part is in the record sequence: before its first FULL or FIRST (what comes
/// continues an earlier part's record), between records, or inside a FIRST … LAST.
#[derive(PartialEq)]
enum At {
    Lead,
    Between,
    InRecord,
}

/// Frame bytes `r` of `chunk` (whole blocks; the first at file offset `at0 + r.start`,
/// `skip` bytes into it), each fragment's CRC checked, handing each record completed in
/// the part to `record` (offset, the part's own number from 1, bytes) in order, into `out`.
fn frame_part(
    path: &Path,
    chunk: &[u8],
    r: Range<usize>,
    skip: usize,
    at0: u64,
    out: &mut PartOut,
    record: &mut OnRecord,
) {
    let mut state = At::Lead;
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_at = 0u64;
    let mut n = 0u64;
    let mut block_at = r.start;
    'blocks: while block_at < r.end {
        let got = (r.end - block_at).min(BLOCK);
        let buf = &chunk[block_at..block_at + got];
        let mut pos = if block_at == r.start { skip } else { 0 };
        while pos + REC_HEADER <= buf.len() {
            let h = &buf[pos..pos + REC_HEADER];
            let crc = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let len = u16::from_le_bytes([h[4], h[5]]) as usize;
            let typ = h[6];
            let at = at0 + (block_at + pos) as u64;
            // Zero padding: the writer's preallocated or flushed tail.
            if typ == 0 && len == 0 && crc == 0 && buf[pos..].iter().all(|b| *b == 0) {
                if got < BLOCK {
                    out.ended = true;
                    out.zero_tail = Some(at0 + block_at as u64);
                    break 'blocks;
                }
                break;
            }
            let Some(data) = buf.get(pos + REC_HEADER..pos + REC_HEADER + len) else {
                if got < BLOCK {
                    out.cut = Some(at);
                    out.ended = true;
                } else {
                    out.stop = Some(Stop::Err(Error::format(
                        path,
                        Position::Byte(at),
                        format!("W&B record length {len} runs past its 32 KiB block"),
                    )));
                }
                break 'blocks;
            };
            if record_crc(typ, data) != crc {
                out.stop = Some(Stop::Err(crc_error(path, at, typ, len)));
                break 'blocks;
            }
            let start = block_at + pos + REC_HEADER;
            pos += REC_HEADER + len;
            let done = match (typ, &state) {
                (1, _) => {
                    out.starts = true;
                    state = At::Between;
                    n += 1;
                    record(at, n, data)
                }
                (2, _) => {
                    out.starts = true;
                    state = At::InRecord;
                    pending.clear();
                    pending.extend_from_slice(data);
                    pending_at = at;
                    Ok(())
                }
                (3 | 4, At::Lead) => {
                    out.lead.push((at, typ, start..start + len));
                    if typ == 4 {
                        state = At::Between;
                    }
                    Ok(())
                }
                (3 | 4, At::InRecord) => {
                    pending.extend_from_slice(data);
                    if typ == 4 {
                        state = At::Between;
                        n += 1;
                        record(pending_at, n, &pending)
                    } else {
                        Ok(())
                    }
                }
                _ => Err(Stop::Err(misplaced(path, at, typ))),
            };
            if let Err(e) = done {
                out.stop = Some(e);
                break 'blocks;
            }
        }
        block_at += got;
    }
    out.records = n;
    if state == At::InRecord {
        out.trail = Some((pending_at, pending));
    }
}

/// The error of a fragment whose type is unknown, or that continues no record.
fn misplaced(path: &Path, at: u64, typ: u8) -> Error {
    Error::format(
        path,
        Position::Byte(at),
        format!("W&B record of unknown or misplaced type {typ}"),
    )
}

/// The framing state carried from part to part, in file order: the record being
/// assembled across part boundaries, and the records counted so far.
#[derive(Default)]
struct Stitch {
    pending: Vec<u8>,
    pending_at: u64,
    in_record: bool,
    n_records: u64,
    ended: bool,
    zero_tail: Option<u64>,
    row: Row,
    ids: Vec<u32>,
}

impl Stitch {
    /// Hand on the parts of one chunk (`chunk`, what their ranges index) in order: a
    /// record continued into a part is completed and parsed here, then the part's own
    /// rows (or config records) follow; the first error stops the pass.
    fn hand_on(
        &mut self,
        path: &Path,
        chunk: &[u8],
        parts: Vec<PartOut>,
        stats: &mut FileStats,
        w: &mut RowWriter,
        mode: &mut Mode,
    ) -> Result<()> {
        for part in parts {
            for (at, typ, r) in &part.lead {
                if !self.in_record {
                    return Err(misplaced(path, *at, *typ));
                }
                self.pending
                    .extend_from_slice(chunk.get(r.clone()).unwrap_or_default());
                if *typ == 4 {
                    self.in_record = false;
                    self.n_records += 1;
                    let pending = std::mem::take(&mut self.pending);
                    let (at, n) = (self.pending_at, self.n_records);
                    let res = self.one(path, at, n, &pending, stats, w, mode);
                    self.pending = pending;
                    res?;
                }
            }
            if part.starts {
                self.in_record = false;
            }
            let base = self.n_records;
            self.n_records += part.records;
            match mode {
                Mode::Rows(keep) => {
                    self.ids.clear();
                    self.ids.extend(part.names.iter().map(|k| w.keys.id_str(k)));
                    let same = self.ids.iter().enumerate().all(|(i, &id)| id as usize == i);
                    let ids = (!same).then_some(&self.ids[..]);
                    w.rows_built(&part.heads, &part.fields, ids, base);
                    stats.records += part.heads.len() as u64;
                    stats.non_finite += part.non_finite;
                    if let Some(keep) = keep.as_deref_mut() {
                        keep.extend(part.configs);
                    }
                }
                Mode::Config(_) => {
                    for (at, n, bytes) in &part.kept {
                        self.one(path, *at, base + n, bytes, stats, w, mode)?;
                    }
                }
            }
            match part.stop {
                Some(Stop::Err(e)) => return Err(e),
                Some(Stop::NotRecord(at, n, e)) => return Err(not_a_record(path, at, base + n, e)),
                None => {}
            }
            if let Some((at, bytes)) = part.trail {
                self.pending = bytes;
                self.pending_at = at;
                self.in_record = true;
            }
            if let Some(at) = part.cut {
                truncated(stats, at, self.n_records);
            }
            if part.ended {
                self.ended = true;
                self.zero_tail = part.zero_tail;
                break;
            }
        }
        Ok(())
    }

    /// Record number `n`, at `at`, parsed here (a record continued from one part into
    /// the next, or a config pass's record).
    #[allow(clippy::too_many_arguments)]
    fn one(
        &mut self,
        path: &Path,
        at: u64,
        n: u64,
        bytes: &[u8],
        stats: &mut FileStats,
        w: &mut RowWriter,
        mode: &mut Mode,
    ) -> Result<()> {
        let bad = |e| not_a_record(path, at, n, e);
        match mode {
            Mode::Rows(keep) => {
                let mut configs = Vec::new();
                let got =
                    parse_record(bytes, &mut w.keys, &mut self.row, &mut configs).map_err(bad)?;
                if got {
                    self.row.finish(w, n, stats);
                }
                if let Some(keep) = keep.as_deref_mut() {
                    keep.extend(configs);
                }
            }
            Mode::Config(cfg) => {
                // A record whose top level holds no config or run (history, or nothing)
                // has no config, and its row is not wanted here: only the others are
                // decoded. (The scan that read the same file before has already refused
                // a record prost cannot decode.)
                if super::wandb_config::without_config(bytes) {
                    return Ok(());
                }
                let mut rec = Record::decode(bytes).map_err(bad)?;
                if let Some(h) = rec.history.take() {
                    history_row(&h, &mut w.keys, &mut self.row);
                    self.row.finish(w, n, stats);
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
}

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

/// The error of record `n` at byte `at` of `path` that is no W&B `Record` protobuf.
fn not_a_record(path: &Path, at: u64, n: u64, e: prost::DecodeError) -> Error {
    Error::format(
        path,
        Position::Byte(at),
        format!("record {n} is not a W&B Record protobuf: {e}"),
    )
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
