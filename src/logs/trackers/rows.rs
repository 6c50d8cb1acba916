//! Per-step rows of a tracker file with interned keys, handed on in batches: a tracker
//! file repeats a few keys millions of times (one TensorBoard event per scalar), so keys
//! become ids once, values never carry a `String`, and the consumer (the frame builder)
//! maps each new name once. Batches are `Send`, so a file can be read on one thread while
//! another builds the frame.

use crate::logs::fastline::FxMap;
use crate::model::log::{FileStats, LogRecord, SourceKind};

/// Fields per batch before it is handed on (at the next row boundary).
const BATCH_FIELDS: usize = 1 << 16;

/// One row of a batch: its step axis, time and producer, and how many of the batch's
/// fields (back to back, in row order) are its own.
#[derive(Debug, Clone, Copy)]
pub struct RowHead {
    /// The step the tracker records.
    pub step: Option<i64>,
    /// Unix time.
    pub timestamp: Option<f64>,
    /// The producer.
    pub source: SourceKind,
    /// The file's record number the row starts at.
    pub line: u64,
    /// Number of fields.
    pub fields: u32,
}

/// Rows with file-local key ids: names of ids first seen in this batch come with it.
#[derive(Debug, Default)]
pub struct RowBatch {
    /// Names of the ids first seen in this batch (ids continue from the previous batch's).
    pub new_keys: Vec<String>,
    /// The rows.
    pub rows: Vec<RowHead>,
    /// `(key id, value)` of every row, back to back.
    pub fields: Vec<(u32, f64)>,
}

/// Key names interned to dense ids in first-seen order, by their bytes. The id of the key
/// that followed each key last time is tried first (a file repeats its keys in the same
/// order), so most lookups are one compare.
#[derive(Debug, Default)]
pub struct Keys {
    map: FxMap<Box<[u8]>, u32>,
    names: Vec<String>,
    next: Vec<u32>,
    last: Option<u32>,
}

impl Keys {
    /// The id of key `k`; `None` when it is new and not UTF-8.
    pub fn id(&mut self, k: &[u8]) -> Option<u32> {
        let guess = self
            .last
            .and_then(|l| self.next.get(l as usize))
            .copied()
            .filter(|&g| {
                self.names
                    .get(g as usize)
                    .is_some_and(|n| n.as_bytes() == k)
            });
        let id = match guess {
            Some(g) => g,
            None => match self.map.get(k) {
                Some(&i) => i,
                None => {
                    let name = std::str::from_utf8(k).ok()?;
                    let i = self.names.len() as u32;
                    self.names.push(name.to_string());
                    self.next.push(u32::MAX);
                    self.map.insert(k.into(), i);
                    i
                }
            },
        };
        if let Some(slot) = self.last.and_then(|l| self.next.get_mut(l as usize)) {
            *slot = id;
        }
        self.last = Some(id);
        Some(id)
    }

    /// The id of key `k`.
    pub fn id_str(&mut self, k: &str) -> u32 {
        // A `&str` is UTF-8, so the lookup cannot refuse it.
        self.id(k.as_bytes()).unwrap_or(u32::MAX)
    }

    /// Every name, by id.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The name of id `i`.
    pub fn name(&self, i: u32) -> &str {
        self.names.get(i as usize).map_or("", String::as_str)
    }
}

/// Builds the rows of one file into batches and hands each full batch to the sink, which
/// may give back a used, emptied batch whose memory the next one reuses (fresh pages cost
/// a fault and a clear each); counts records and non-finite values into the file's
/// statistics as rows close.
pub struct RowWriter<'a> {
    /// The file's keys.
    pub keys: Keys,
    batch: RowBatch,
    /// Names already handed on.
    sent: usize,
    /// The last row of the batch is still taking fields.
    open: bool,
    sink: &'a mut dyn FnMut(RowBatch) -> Option<RowBatch>,
}

impl<'a> RowWriter<'a> {
    /// A writer handing batches to `sink`.
    pub fn new(sink: &'a mut dyn FnMut(RowBatch) -> Option<RowBatch>) -> Self {
        RowWriter {
            keys: Keys::default(),
            batch: RowBatch::default(),
            sent: 0,
            open: false,
            sink,
        }
    }

    /// Start a row that takes fields with [`RowWriter::field`] until [`RowWriter::end`].
    pub fn begin(
        &mut self,
        step: Option<i64>,
        timestamp: Option<f64>,
        source: SourceKind,
        line: u64,
    ) {
        self.batch.rows.push(RowHead {
            step,
            timestamp,
            source,
            line,
            fields: 0,
        });
        self.open = true;
    }

    /// True while a row is open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The open row's step.
    pub fn open_step(&self) -> Option<i64> {
        self.batch
            .rows
            .last()
            .filter(|_| self.open)
            .and_then(|h| h.step)
    }

    /// Add a field to the open row.
    pub fn field(&mut self, id: u32, v: f64) {
        self.batch.fields.push((id, v));
        if let Some(h) = self.batch.rows.last_mut() {
            h.fields += 1;
        }
    }

    /// Close the open row, counting it (a row without fields is dropped).
    pub fn end(&mut self, stats: &mut FileStats) {
        if !self.open {
            return;
        }
        self.open = false;
        let n = self.batch.rows.last().map_or(0, |h| h.fields as usize);
        if n == 0 {
            self.batch.rows.pop();
            return;
        }
        stats.records += 1;
        let start = self.batch.fields.len() - n;
        stats.non_finite += self.batch.fields[start..]
            .iter()
            .filter(|(_, v)| !v.is_finite())
            .count() as u64;
        if self.batch.fields.len() >= BATCH_FIELDS {
            self.flush();
        }
    }

    /// One whole row.
    pub fn row(
        &mut self,
        step: Option<i64>,
        timestamp: Option<f64>,
        source: SourceKind,
        line: u64,
        fields: &[(u32, f64)],
        stats: &mut FileStats,
    ) {
        self.begin(step, timestamp, source, line);
        for &(k, v) in fields {
            self.field(k, v);
        }
        self.end(stats);
    }

    /// Whole rows built elsewhere (a reader's parallel part), counted by the caller:
    /// `heads` with their fields back to back in `fields`, key ids the part's own and
    /// turned into this writer's through `ids` (`None`: they are already), record numbers
    /// the part's own plus `line_base`. One copy of the part where adding its rows one
    /// by one would push each field and head separately.
    pub fn rows_built(
        &mut self,
        heads: &[RowHead],
        fields: &[(u32, f64)],
        ids: Option<&[u32]>,
        line_base: u64,
    ) {
        self.open = false;
        let b = &mut self.batch;
        b.rows.extend(heads.iter().map(|h| RowHead {
            line: h.line + line_base,
            ..*h
        }));
        match ids {
            None => b.fields.extend_from_slice(fields),
            Some(ids) => b.fields.extend(
                fields
                    .iter()
                    .map(|&(k, v)| (ids.get(k as usize).copied().unwrap_or(u32::MAX), v)),
            ),
        }
        if self.batch.fields.len() >= BATCH_FIELDS {
            self.flush();
        }
    }

    /// A [`LogRecord`] as a row (the counts are the reader's own: not counted here).
    pub fn record(&mut self, rec: &LogRecord) {
        self.begin(rec.step, rec.timestamp, rec.source, rec.line);
        for (k, v) in &rec.fields {
            let id = self.keys.id_str(k);
            self.field(id, *v);
        }
        self.close_uncounted();
    }

    /// A row of ids the reader has counted itself (as [`RowWriter::record`] does, without
    /// a `String` per field: readers that intern each column's key once).
    pub fn uncounted_row(
        &mut self,
        step: Option<i64>,
        timestamp: Option<f64>,
        source: SourceKind,
        line: u64,
        fields: &[(u32, f64)],
    ) {
        self.begin(step, timestamp, source, line);
        for &(k, v) in fields {
            self.field(k, v);
        }
        self.close_uncounted();
    }

    /// Close a row the reader counts itself (no [`FileStats`] here), handing the batch on
    /// once it is full.
    fn close_uncounted(&mut self) {
        self.open = false;
        if self.batch.fields.len() >= BATCH_FIELDS {
            self.flush();
        }
    }

    /// Hand on what is built (the open row is closed first by the caller).
    pub fn flush(&mut self) {
        if self.batch.rows.is_empty() && self.keys.names.len() == self.sent {
            return;
        }
        let mut b = std::mem::take(&mut self.batch);
        b.new_keys.clear();
        b.new_keys.extend_from_slice(&self.keys.names[self.sent..]);
        self.sent = self.keys.names.len();
        if let Some(mut back) = (self.sink)(b) {
            back.new_keys.clear();
            back.rows.clear();
            back.fields.clear();
            self.batch = back;
        }
    }
}

/// The rows of `batch` as [`LogRecord`]s of file `file`, keys named through `names`
/// (extended with the batch's new keys): for callers that want records.
pub fn to_records(
    batch: &RowBatch,
    names: &mut Vec<String>,
    file: usize,
    push: &mut dyn FnMut(&mut LogRecord),
) {
    names.extend(batch.new_keys.iter().cloned());
    let mut at = 0usize;
    for h in &batch.rows {
        let n = h.fields as usize;
        let fields = batch
            .fields
            .get(at..at + n)
            .unwrap_or_default()
            .iter()
            .map(|&(k, v)| (names.get(k as usize).cloned().unwrap_or_default(), v))
            .collect();
        at += n;
        push(&mut LogRecord {
            step: h.step,
            timestamp: h.timestamp,
            source: h.source,
            file,
            line: h.line,
            fields,
        });
    }
}

/// A row as the frame sees it, for tests: `(step, time bits, line, (key, value bits))`.
#[cfg(test)]
pub(crate) type BitRow = (Option<i64>, Option<u64>, u64, Vec<(String, u64)>);

/// Test support: run `read` into a [`RowWriter`] that keeps every batch, then give its
/// result, the keys in interning order and the rows as [`BitRow`]s.
#[cfg(test)]
pub(crate) fn read_bit_rows<T>(
    read: impl FnOnce(&mut RowWriter<'_>) -> T,
) -> (T, Vec<String>, Vec<BitRow>) {
    let mut batches: Vec<RowBatch> = Vec::new();
    let mut sink = |b: RowBatch| {
        batches.push(b);
        None
    };
    let mut w = RowWriter::new(&mut sink);
    let res = read(&mut w);
    w.flush();
    drop(w);
    let (mut names, mut out) = (Vec::new(), Vec::new());
    for b in &batches {
        to_records(b, &mut names, 0, &mut |r| {
            let fields = r.fields.iter().map(|(k, v)| (k.clone(), v.to_bits()));
            out.push((
                r.step,
                r.timestamp.map(f64::to_bits),
                r.line,
                fields.collect(),
            ))
        });
    }
    (res, names, out)
}
