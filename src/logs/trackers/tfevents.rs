//! TensorBoard event files (`events.out.tfevents.*`): TFRecord framing (length, masked
//! CRC-32C of the length, data, masked CRC-32C of the data) around `Event` protobufs
//! whose `Summary` values are scalars either as `simple_value` (TF1, torch's
//! `SummaryWriter`) or as one-element tensors (TF2 `tf.summary.scalar`, torch
//! `new_style=True`). Images, histograms and graphs are skipped; text summaries are
//! counted here and read by [`texts`] (completions logged with `add_text`).

use std::io::Read;
use std::path::Path;

use prost::Message;

use super::rows::{Keys, RowWriter};
use super::wire;
use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, SourceKind};

/// `Event` (tensorflow/core/util/event.proto), the fields read here.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Wall time in seconds.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// Global step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// Set on the first event of a file (`brain.Event:2`).
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// The summary values of this step.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `Summary`: a list of tagged values.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `Summary.Value`: one tagged value (scalar, tensor, or a kind skipped here).
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    /// The tag (`train/loss`).
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A float32 scalar (the `simple_value` member of the value oneof).
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    /// Which plugin wrote the value.
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
    /// A tensor value (boxed: the message is large and values are moved per event).
    #[prost(message, optional, boxed, tag = "8")]
    pub tensor: Option<Box<TensorProto>>,
}

/// `SummaryMetadata`: the writing plugin and the data class.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryMetadata {
    /// The plugin (`scalars`, `histograms`, `images`, `text`, …).
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
    /// 1 scalar, 2 tensor, 3 blob sequence.
    #[prost(int32, tag = "4")]
    pub data_class: i32,
}

/// `SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    /// The plugin's name.
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

/// `TensorProto`, the numeric members.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// `DataType` enum value.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// The shape.
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
    /// Raw little-endian element bytes.
    #[prost(bytes = "vec", tag = "4")]
    pub tensor_content: Vec<u8>,
    /// DT_HALF / DT_BFLOAT16 elements as their 16 bits.
    #[prost(int32, repeated, tag = "13")]
    pub half_val: Vec<i32>,
    /// DT_FLOAT elements.
    #[prost(float, repeated, tag = "5")]
    pub float_val: Vec<f32>,
    /// DT_DOUBLE elements.
    #[prost(double, repeated, tag = "6")]
    pub double_val: Vec<f64>,
    /// DT_STRING elements (TensorBoard's text plugin: one string, or a table of them).
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
    /// DT_INT32 / INT16 / INT8 / UINT8 elements.
    #[prost(int32, repeated, tag = "7")]
    pub int_val: Vec<i32>,
    /// DT_INT64 elements.
    #[prost(int64, repeated, tag = "10")]
    pub int64_val: Vec<i64>,
    /// DT_BOOL elements.
    #[prost(bool, repeated, tag = "11")]
    pub bool_val: Vec<bool>,
    /// DT_UINT32 elements.
    #[prost(uint32, repeated, tag = "16")]
    pub uint32_val: Vec<u32>,
    /// DT_UINT64 elements.
    #[prost(uint64, repeated, tag = "17")]
    pub uint64_val: Vec<u64>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShape {
    /// The dimensions.
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<TensorDim>,
}

/// `TensorShapeProto.Dim`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorDim {
    /// The size.
    #[prost(int64, tag = "1")]
    pub size: i64,
}

/// TensorFlow `DataType` values read as scalars.
mod dt {
    pub const FLOAT: i32 = 1;
    pub const DOUBLE: i32 = 2;
    pub const INT32: i32 = 3;
    pub const UINT8: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT8: i32 = 6;
    pub const INT64: i32 = 9;
    pub const BOOL: i32 = 10;
    pub const BFLOAT16: i32 = 14;
    pub const UINT16: i32 = 17;
    pub const HALF: i32 = 19;
    pub const UINT32: i32 = 22;
    pub const UINT64: i32 = 23;
}

impl TensorProto {
    /// The value of a one-element numeric tensor, as TensorBoard's `make_ndarray` reads it
    /// (raw `tensor_content` first, then the typed repeated field); `None` for anything
    /// else (histograms, text, images).
    pub fn scalar(&self) -> Option<f64> {
        let elems: i64 = self
            .tensor_shape
            .as_ref()
            .map_or(1, |s| s.dim.iter().map(|d| d.size).product());
        if elems != 1 {
            return None;
        }
        let c = self.tensor_content.as_slice();
        if !c.is_empty() {
            let b = |n: usize| -> Option<&[u8]> { c.get(..n) };
            return Some(match self.dtype {
                dt::FLOAT => f32::from_le_bytes(b(4)?.try_into().ok()?) as f64,
                dt::DOUBLE => f64::from_le_bytes(b(8)?.try_into().ok()?),
                dt::INT32 => i32::from_le_bytes(b(4)?.try_into().ok()?) as f64,
                dt::INT64 => i64::from_le_bytes(b(8)?.try_into().ok()?) as f64,
                dt::UINT32 => u32::from_le_bytes(b(4)?.try_into().ok()?) as f64,
                dt::UINT64 => u64::from_le_bytes(b(8)?.try_into().ok()?) as f64,
                dt::INT16 => i16::from_le_bytes(b(2)?.try_into().ok()?) as f64,
                dt::UINT16 => u16::from_le_bytes(b(2)?.try_into().ok()?) as f64,
                dt::INT8 => *b(1)?.first()? as i8 as f64,
                dt::UINT8 | dt::BOOL => *b(1)?.first()? as f64,
                dt::HALF => half::f16::from_le_bytes(b(2)?.try_into().ok()?).to_f64(),
                dt::BFLOAT16 => half::bf16::from_le_bytes(b(2)?.try_into().ok()?).to_f64(),
                _ => return None,
            });
        }
        match self.dtype {
            dt::FLOAT => self.float_val.first().map(|v| *v as f64),
            dt::DOUBLE => self.double_val.first().copied(),
            dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT8 | dt::UINT16 => {
                self.int_val.first().map(|v| *v as f64)
            }
            dt::INT64 => self.int64_val.first().map(|v| *v as f64),
            dt::UINT32 => self.uint32_val.first().map(|v| *v as f64),
            dt::UINT64 => self.uint64_val.first().map(|v| *v as f64),
            dt::BOOL => self.bool_val.first().map(|v| *v as u8 as f64),
            dt::HALF => self
                .half_val
                .first()
                .map(|v| half::f16::from_bits(*v as u16).to_f64()),
            dt::BFLOAT16 => self
                .half_val
                .first()
                .map(|v| half::bf16::from_bits(*v as u16).to_f64()),
            _ => None,
        }
    }
}

impl SummaryValue {
    /// The scalar this value holds, if it is one: `simple_value`, or a one-element numeric
    /// tensor not written by a plugin other than `scalars`.
    pub fn scalar(&self) -> Option<f64> {
        if let Some(v) = self.simple_value {
            return Some(v as f64);
        }
        let t = self.tensor.as_ref()?;
        let plugin = self
            .metadata
            .as_ref()
            .and_then(|m| m.plugin_data.as_ref())
            .map_or("", |p| p.plugin_name.as_str());
        if !plugin.is_empty() && plugin != "scalars" {
            return None;
        }
        t.scalar()
    }
}

/// TFRecord's masked CRC-32C (`(crc >> 15 | crc << 17) + 0xa282ead8`).
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Largest record accepted: a length past it is a corrupt header, not a 4 GB allocation.
const MAX_RECORD: u64 = 1 << 30;

/// Bytes read from the file at a time; records are parsed where they lie in the buffer.
const CHUNK: usize = 1 << 22;

/// A read buffer over `r`: the unparsed bytes are `buf[start..]`.
struct Chunks<R> {
    r: R,
    buf: Vec<u8>,
    start: usize,
    eof: bool,
    /// Bytes read at a time ([`CHUNK`]; small in tests, to cut records at every byte).
    chunk: usize,
}

impl<R: Read> Chunks<R> {
    /// Make at least `n` unparsed bytes available (fewer only at end of file); returns how
    /// many are.
    fn want(&mut self, n: usize) -> std::io::Result<usize> {
        while self.buf.len() - self.start < n && !self.eof {
            // Move the unparsed tail to the front, then read a chunk (or the rest of a
            // longer record) more.
            self.buf.drain(..self.start);
            self.start = 0;
            let more = (n - self.buf.len()).max(self.chunk);
            let got = (&mut self.r).take(more as u64).read_to_end(&mut self.buf)?;
            self.eof = got < more;
        }
        Ok((self.buf.len() - self.start).min(n))
    }
}

/// A TFRecord lying whole in the read buffer: its file offset, its number (1-based), where
/// its data is in the buffer, and the data's masked CRC as the record states it.
struct Framed {
    offset: u64,
    n: u64,
    body: (usize, usize),
    crc: u32,
}

/// What ended [`frame`]: the buffer holds fewer than this many bytes of the next record
/// (its header, or header + data + CRC), or the next header is not a TFRecord's.
enum Stop {
    Need(usize),
    BadHeader(u64),
}

/// Frame the TFRecords lying whole at the front of `buf` (file offset `offset`, after
/// `n` records) into `recs`, checking each length field's CRC (the data's CRC is checked
/// where the record is decoded, [`decode_part`]). Returns the bytes framed and what
/// stopped the walk.
fn frame(buf: &[u8], offset: u64, n: u64, recs: &mut Vec<Framed>) -> (usize, Stop) {
    let mut pos = 0usize;
    loop {
        let Some(head) = buf.get(pos..pos + 12) else {
            return (pos, Stop::Need(12));
        };
        let (len_bytes, crc_bytes) = head.split_at(8);
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(crc_bytes.try_into().unwrap_or_default());
        if masked_crc(len_bytes) != crc || len > MAX_RECORD {
            return (pos, Stop::BadHeader(len));
        }
        let total = 12 + len as usize + 4;
        let Some(tail) = buf.get(pos + 12 + len as usize..pos + total) else {
            return (pos, Stop::Need(total));
        };
        recs.push(Framed {
            offset: offset + pos as u64,
            n: n + recs.len() as u64 + 1,
            body: (pos + 12, pos + 12 + len as usize),
            crc: u32::from_le_bytes(tail.try_into().unwrap_or_default()),
        });
        pos += total;
    }
}

/// Records per part decoded on one worker ([`read`]).
const PART_RECORDS: usize = 1024;

/// The events of a run of records with part-local key ids (decoded on a worker).
#[derive(Default)]
struct Part {
    names: Vec<String>,
    /// `(step, wall time, record number, values end)`.
    events: Vec<(i64, f64, u64, usize)>,
    values: Vec<(u32, f64)>,
    text_summaries: u64,
}

/// Check and decode records `recs` of `buf` in order; the first bad one (data CRC, not
/// an `Event`) ends the part with its error.
fn decode_part(path: &Path, buf: &[u8], recs: &[Framed]) -> (Part, Option<Error>) {
    let mut keys = Keys::default();
    let mut out = Part {
        events: Vec::with_capacity(recs.len()),
        values: Vec::with_capacity(recs.len()),
        ..Part::default()
    };
    let mut err = None;
    for r in recs {
        let body = buf.get(r.body.0..r.body.1).unwrap_or_default();
        if masked_crc(body) != r.crc {
            err = Some(Error::format(
                path,
                Position::Byte(r.offset + 12),
                format!("TFRecord data CRC-32C mismatch (record {})", r.n),
            ));
            break;
        }
        let mark = out.values.len();
        let ev = match fast_event(body, &mut keys, &mut out.values) {
            Some(ev) => ev,
            None => match Event::decode(body) {
                Ok(ev) => {
                    // What the fast walk added before it gave up goes.
                    out.values.truncate(mark);
                    for v in ev.summary.map(|s| s.value).unwrap_or_default() {
                        if v.is_text() {
                            out.text_summaries += 1;
                        }
                        let Some(x) = v.scalar() else { continue };
                        out.values.push((keys.id_str(&v.tag), x));
                    }
                    FastEvent {
                        step: ev.step,
                        wall_time: ev.wall_time,
                    }
                }
                Err(e) => {
                    err = Some(Error::format(
                        path,
                        Position::Byte(r.offset + 12),
                        format!("record {} is not an Event protobuf: {e}", r.n),
                    ));
                    break;
                }
            },
        };
        out.events
            .push((ev.step, ev.wall_time, r.n, out.values.len()));
    }
    out.names = keys.names().to_vec();
    (out, err)
}

/// Check and decode framed records `recs` of `buf` in parallel parts of `part` records,
/// each with its own key ids, in file order.
fn decode_parts(
    path: &Path,
    buf: &[u8],
    recs: &[Framed],
    part: usize,
) -> Vec<(Part, Option<Error>)> {
    use rayon::prelude::*;
    recs.par_chunks(part.max(1))
        .map(|part| decode_part(path, buf, part))
        .collect()
}

/// Add the scalars of decoded `parts` to `w` in file order (keys renumbered into the
/// file's, so they keep their first-seen order); the first bad record's error is
/// returned after the records before it were added.
fn add_parts(
    parts: Vec<(Part, Option<Error>)>,
    stats: &mut FileStats,
    w: &mut RowWriter,
) -> Result<()> {
    let mut map: Vec<u32> = Vec::new();
    for (part, err) in parts {
        map.clear();
        map.extend(part.names.iter().map(|k| w.keys.id_str(k)));
        stats.text_summaries += part.text_summaries;
        let mut start = 0;
        for &(step, wall, n, end) in &part.events {
            for &(k, x) in part.values.get(start..end).unwrap_or_default() {
                let id = map.get(k as usize).copied().unwrap_or(u32::MAX);
                add(w, step, wall, n, stats, id, x);
            }
            start = end;
        }
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

/// Stream the events of one file into `w`, one row per run of events of one step. Each
/// read buffer's whole records are framed in order, then CRC-checked and decoded in
/// parallel parts ([`decode_parts`]) while this thread adds the previous buffer's
/// scalars, reads the next buffer and frames it ([`read_with`]); errors and a record cut
/// by the file's end are reported as a record-by-record reader would (the first in file
/// order, after the rows before it).
pub fn read(path: &Path, input: impl Read, stats: &mut FileStats, w: &mut RowWriter) -> Result<()> {
    read_with(path, input, stats, w, CHUNK, PART_RECORDS)
}

/// How the framing of a file ended, acted on once the rows before it are added.
enum End {
    /// At the end of the file, after whole records.
    Eof,
    /// Inside a record's header or data (offset, records before it, which, bytes left).
    Truncated(u64, u64, &'static str, usize),
    /// At a header that is no TFRecord's (offset, its record number, its length).
    BadHeader(u64, u64, u64),
    /// A read failed.
    Io(std::io::Error),
}

/// What one framing step left: records framed into the caller's list, the bytes they
/// take at the front of the buffer, and what stopped the walk.
struct Step {
    used: usize,
    stop: Stop,
}

/// Frame the next whole records of `r` into `recs` (after `n` records); `Err` when the
/// file ended (or failed) first.
fn frame_step<R: Read>(
    r: &mut Chunks<R>,
    offset: u64,
    n: u64,
    recs: &mut Vec<Framed>,
) -> std::result::Result<Step, End> {
    recs.clear();
    match r.want(12) {
        Ok(0) => return Err(End::Eof),
        Ok(_) => {}
        Err(e) => return Err(End::Io(e)),
    }
    let avail = r.buf.get(r.start..).unwrap_or_default();
    let (used, stop) = frame(avail, offset, n, recs);
    Ok(Step { used, stop })
}

/// After a framing step's records (ending at `offset`, `n` records in all): what
/// stopped it, acted on; `Ok` when the next step may frame more.
fn after_step<R: Read>(
    r: &mut Chunks<R>,
    stop: Stop,
    offset: u64,
    n: u64,
) -> std::result::Result<(), End> {
    let need = match stop {
        Stop::Need(k) => k,
        Stop::BadHeader(len) => return Err(End::BadHeader(offset, n + 1, len)),
    };
    let got = r.want(need).map_err(End::Io)?;
    if got < need {
        if got > 0 {
            let what = if need == 12 {
                "record header"
            } else {
                "record data"
            };
            return Err(End::Truncated(offset, n, what, got));
        }
        return Err(End::Eof);
    }
    Ok(())
}

/// [`read`] with `chunk` bytes read at a time and `part` records per parallel part:
/// buffer `k` is decoded on the pool while this thread adds buffer `k - 1`'s scalars and
/// reads and frames buffer `k + 1` (which starts with buffer `k`'s unframed tail).
fn read_with(
    path: &Path,
    input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    chunk: usize,
    part: usize,
) -> Result<()> {
    let mut r = Chunks {
        r: input,
        buf: Vec::with_capacity(chunk),
        start: 0,
        eof: false,
        chunk: chunk.max(1),
    };
    let mut spare: Vec<u8> = Vec::with_capacity(chunk);
    let (mut recs, mut next_recs): (Vec<Framed>, Vec<Framed>) = (Vec::new(), Vec::new());
    let mut offset: u64 = 0;
    let mut n_records: u64 = 0;
    let mut parts: Vec<(Part, Option<Error>)> = Vec::new();
    let mut step = frame_step(&mut r, offset, n_records, &mut recs);
    let end = loop {
        let Ok(Step { used, stop }) = step else {
            // Nothing more framed: the last buffer's scalars, then how it ended.
            add_parts(std::mem::take(&mut parts), stats, w)?;
            break step.err().unwrap_or(End::Eof);
        };
        // The framed buffer is decoded while a fresh one takes its unframed tail.
        let data = std::mem::replace(&mut r.buf, std::mem::take(&mut spare));
        r.buf.clear();
        r.buf
            .extend_from_slice(data.get(r.start + used..).unwrap_or_default());
        let body = data.get(r.start..).unwrap_or_default();
        r.start = 0;
        offset += used as u64;
        n_records += recs.len() as u64;
        let mut decoded = Vec::new();
        let mut added = Ok(());
        let mut next = Err(End::Eof);
        rayon::in_place_scope(|s| {
            let (decoded, recs) = (&mut decoded, &recs);
            s.spawn(move |_| *decoded = decode_parts(path, body, recs, part));
            added = add_parts(std::mem::take(&mut parts), stats, w);
            if added.is_ok() {
                next = after_step(&mut r, stop, offset, n_records)
                    .and_then(|()| frame_step(&mut r, offset, n_records, &mut next_recs));
            }
        });
        added?;
        parts = decoded;
        spare = data;
        std::mem::swap(&mut recs, &mut next_recs);
        step = next;
    };
    match end {
        End::Eof => {}
        End::Truncated(at, n, what, got) => {
            truncated(stats, at, n, what);
            offset = at + got as u64;
        }
        End::BadHeader(at, n, len) => {
            return Err(Error::format(
                path,
                Position::Byte(at),
                format!("not a TFRecord: length field CRC-32C mismatch (record {n}, length {len})"),
            ))
        }
        End::Io(e) => return Err(Error::io(path, e)),
    }
    w.end(stats);
    stats.bytes = offset;
    stats.lines = n_records;
    if n_records == 0 {
        return Err(Error::format(
            path,
            Position::File,
            format!("not a TensorBoard event file: {offset} byte(s), no whole TFRecord"),
        ));
    }
    Ok(())
}

impl SummaryValue {
    /// Written by TensorBoard's text plugin (`SummaryWriter.add_text`).
    pub fn is_text(&self) -> bool {
        self.metadata
            .as_ref()
            .and_then(|m| m.plugin_data.as_ref())
            .is_some_and(|p| p.plugin_name == "text")
    }
}

/// One text summary (`add_text(tag, text, step)`): its strings joined by newlines.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSummary {
    /// The event's step.
    pub step: i64,
    /// The tag (`val/generations`).
    pub tag: String,
    /// The text (UTF-8, invalid bytes replaced).
    pub text: String,
}

/// Every text summary of an event file, in file order: what `add_text` wrote (verl logs
/// its validation generations so). Records are framed as [`read`] frames them; a record
/// cut by the file's end ends the list; a record that is not an `Event` is an error
/// naming its byte offset.
pub fn texts(path: &Path) -> Result<Vec<TextSummary>> {
    let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 12 <= data.len() {
        let len = u64::from_le_bytes(data[pos..pos + 8].try_into().unwrap_or_default());
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|l| (pos + 12).checked_add(l))
            .filter(|e| e + 4 <= data.len())
        else {
            break;
        };
        let ev = Event::decode(&data[pos + 12..end]).map_err(|e| {
            Error::format(
                path,
                Position::Byte(pos as u64 + 12),
                format!("not an Event protobuf: {e}"),
            )
        })?;
        for v in ev.summary.map(|s| s.value).unwrap_or_default() {
            if !v.is_text() {
                continue;
            }
            let Some(t) = &v.tensor else { continue };
            let parts: Vec<String> = t
                .string_val
                .iter()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .collect();
            out.push(TextSummary {
                step: ev.step,
                tag: v.tag.clone(),
                text: parts.join("\n"),
            });
        }
        pos = end + 4;
    }
    Ok(out)
}

/// Add scalar `x` of key `id` at `step` to the open row, or to a new row when the step
/// changed (the row's time and record number are its first scalar's event's).
fn add(w: &mut RowWriter, step: i64, wall: f64, line: u64, stats: &mut FileStats, id: u32, x: f64) {
    if w.is_open() && w.open_step() != Some(step) {
        w.end(stats);
    }
    if !w.is_open() {
        w.begin(Some(step), Some(wall), SourceKind::Tensorboard, line);
    }
    w.field(id, x);
}

/// An `Event`'s step and time, read without allocating.
struct FastEvent {
    step: i64,
    wall_time: f64,
}

/// `body` as an `Event` whose summary values are plain `simple_value` scalars (or none),
/// every field of the wire type prost expects: its step and time, the scalars appended
/// to `values` as `(key id, value)`. `None` for anything else (tensors, plugin metadata,
/// a repeated summary, odd wire types, a tag not UTF-8; some scalars may have been
/// appended): prost then decodes the record.
fn fast_event(body: &[u8], keys: &mut Keys, values: &mut Vec<(u32, f64)>) -> Option<FastEvent> {
    use wire::Payload;
    let mut ev = FastEvent {
        step: 0,
        wall_time: 0.0,
    };
    let mut summaries = 0;
    let mut pos = 0;
    while pos < body.len() {
        match wire::field(body, &mut pos)? {
            (1, Payload::Fixed64(b)) => ev.wall_time = f64::from_le_bytes(b.try_into().ok()?),
            (2, Payload::Varint(v)) => ev.step = v as i64,
            (3, Payload::Bytes(b)) => {
                std::str::from_utf8(b).ok()?;
            }
            (5, Payload::Bytes(s)) if summaries == 0 => {
                summaries += 1;
                summary_values(s, keys, values)?;
            }
            (1 | 2 | 3 | 5, _) => return None,
            _ => {}
        }
    }
    Some(ev)
}

/// The `simple_value` scalars of a `Summary`'s bytes into `values`.
fn summary_values(s: &[u8], keys: &mut Keys, values: &mut Vec<(u32, f64)>) -> Option<()> {
    use wire::Payload;
    let mut pos = 0;
    while pos < s.len() {
        match wire::field(s, &mut pos)? {
            (1, Payload::Bytes(v)) => {
                let (mut tag, mut x): (&[u8], Option<f32>) = (b"", None);
                let mut vp = 0;
                while vp < v.len() {
                    match wire::field(v, &mut vp)? {
                        (1, Payload::Bytes(t)) => tag = t,
                        (2, Payload::Fixed32(b)) => {
                            x = Some(f32::from_le_bytes(b.try_into().ok()?))
                        }
                        (1 | 2 | 8 | 9, _) => return None,
                        _ => {}
                    }
                }
                if let Some(x) = x {
                    values.push((keys.id(tag)?, x as f64));
                }
            }
            (1, _) => return None,
            _ => {}
        }
    }
    Some(())
}

/// Note a record cut by the end of the file (a writer killed mid-write): kept as a
/// warning, the records before it stand.
fn truncated(stats: &mut FileStats, offset: u64, n: u64, what: &str) {
    stats.truncated_last_line = true;
    stats.bad_line(
        n + 1,
        format!("truncated last record at byte {offset}: the file ends inside its {what}"),
    );
}

#[cfg(test)]
#[path = "tfevents_tests.rs"]
mod tests;
