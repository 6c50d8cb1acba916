//! Streaming, parallel reading of log files: the file is read in fixed-size chunks cut at
//! line boundaries (memory constant in the file size), each chunk's lines are parsed in
//! parallel with rayon, then folded in order into the frame builder and the event list.
//! JSON step lines go through [`fastline`] (no `Value` tree, keys interned per batch of
//! lines); whatever it declines (events, escapes, bad or truncated lines) takes the general
//! `parse_value` path, so each line is read by exactly one of them.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::logscan::fastline::{self, Batch, FastRec, Scratch};
use crate::logscan::frame::FrameBuilder;
use crate::logscan::record::{FileStats, LogEvent, LogRecord, SourceKind, TypeTracker};
use crate::readers::events::{self, EventLine};
use crate::readers::steps::{self, LineQuality};
use crate::readers::textlog::{self, TextAssembler, TextItem};

/// Bytes read per chunk.
pub const CHUNK_BYTES: usize = 8 << 20;

/// How a file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// One JSON object per line (steps, events, verl, anything flat).
    Jsonl,
    /// Hugging Face `trainer_state.json`.
    TrainerState,
    /// A text log.
    Text,
}

/// Guess how to read `path` from its name and first bytes.
pub fn detect_kind(path: &Path) -> Result<FileKind> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if name == "trainer_state.json" {
        return Ok(FileKind::TrainerState);
    }
    let mut head = vec![0u8; 4096];
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let n = f.read(&mut head).map_err(|e| Error::io(path, e))?;
    head.truncate(n);
    let text = String::from_utf8_lossy(&head);
    if name.ends_with(".json") && text.contains("\"log_history\"") {
        return Ok(FileKind::TrainerState);
    }
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        return Ok(FileKind::Jsonl);
    }
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    Ok(match first {
        Some(l) if l.starts_with("{\"") => FileKind::Jsonl,
        _ => FileKind::Text,
    })
}

/// Everything one scan collected.
#[derive(Debug)]
pub struct Collected {
    /// The frame being built.
    pub builder: FrameBuilder,
    /// Events from every file, in file then line order.
    pub events: Vec<LogEvent>,
    /// Per-file statistics.
    pub files: Vec<FileStats>,
}

/// One parsed JSON line.
enum JsonLine {
    Blank,
    Bad(String),
    Step(LogRecord, LineQuality),
    Event(EventLine, LineQuality),
}

/// One line as the parallel stage leaves it: fast-parsed into the batch, or general.
enum Item {
    Fast(FastRec),
    Slow(Box<JsonLine>),
}

/// Lines per parallel batch (keys are interned per batch).
const BATCH_LINES: usize = 512;

fn parse_item(bytes: &[u8], file: usize, line: u64, sc: &mut Scratch, out: &mut Batch) -> Item {
    if let Some(r) = fastline::parse_line(bytes, sc, out) {
        return Item::Fast(r);
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t.trim(),
        Err(e) => {
            return Item::Slow(Box::new(JsonLine::Bad(format!(
                "not UTF-8 at byte {}",
                e.valid_up_to()
            ))))
        }
    };
    Item::Slow(Box::new(parse_json_text(text, file, line)))
}

/// The general path for one JSON line (a record and its quality, for tests and tools):
/// `None` for blank, bad and event lines.
pub fn general_record(text: &str, file: usize, line: u64) -> Option<(LogRecord, LineQuality)> {
    match parse_json_text(text.trim(), file, line) {
        JsonLine::Step(r, q) => Some((r, q)),
        _ => None,
    }
}

fn parse_json_text(text: &str, file: usize, line: u64) -> JsonLine {
    if text.is_empty() {
        return JsonLine::Blank;
    }
    let v = match crate::json::parse_value(text) {
        Ok(v) => v,
        Err(e) => return JsonLine::Bad(e.to_string()),
    };
    if v.as_dict().is_none() {
        return JsonLine::Bad(format!("expected a JSON object, found {}", v.type_name()));
    }
    let mut q = LineQuality::default();
    if events::is_event(&v) {
        let out = events::parse_event(&v, file, line, &mut q);
        return JsonLine::Event(out, q);
    }
    if steps::is_verl_line(&v) {
        let r = steps::parse_verl_object(&v, file, line, &mut q);
        return JsonLine::Step(r, q);
    }
    let source = if v.get("train_loss").is_some() || v.get("token_count_summary").is_some() {
        SourceKind::Steps
    } else {
        SourceKind::GenericJsonl
    };
    let r = steps::parse_step_object(&v, source, file, line, &mut q);
    JsonLine::Step(r, q)
}

/// Per-file state of the in-order fold.
struct FoldState {
    tracker: TypeTracker,
    last_iteration: Option<i64>,
    last_event: Option<LogEvent>,
    unnumbered: i64,
    kinds_seen: Vec<&'static str>,
    ids: Vec<(u32, f64)>,
}

impl Collected {
    /// An empty collection feeding `builder`.
    pub fn new(builder: FrameBuilder) -> Self {
        Collected {
            builder,
            events: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Read one file of any supported kind.
    pub fn read_file(&mut self, path: &Path) -> Result<()> {
        let idx = self.files.len();
        match detect_kind(path)? {
            FileKind::TrainerState => {
                let (records, stats) = steps::read_trainer_state(path, idx)?;
                for r in &records {
                    self.builder.push(r);
                }
                self.files.push(stats);
                Ok(())
            }
            FileKind::Jsonl => self.read_lines(path, idx, true),
            FileKind::Text => self.read_lines(path, idx, false),
        }
    }

    fn read_lines(&mut self, path: &Path, idx: usize, json: bool) -> Result<()> {
        let mut stats = FileStats {
            path: path.to_path_buf(),
            format: if json { "jsonl" } else { "text" }.to_string(),
            ..FileStats::default()
        };
        let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut buf: Vec<u8> = Vec::with_capacity(CHUNK_BYTES + 4096);
        let mut line_no: u64 = 0;
        let mut state = FoldState {
            tracker: TypeTracker::default(),
            last_iteration: None,
            last_event: None,
            unnumbered: 0,
            kinds_seen: Vec::new(),
            ids: Vec::new(),
        };
        let mut text = TextAssembler::new(idx);
        let mut eof = false;
        while !eof {
            // Fill the buffer up to CHUNK_BYTES past what is carried over.
            let target = buf.len() + CHUNK_BYTES;
            while buf.len() < target {
                let start = buf.len();
                buf.resize(target, 0);
                let n = f.read(&mut buf[start..]).map_err(|e| Error::io(path, e))?;
                buf.truncate(start + n);
                if n == 0 {
                    eof = true;
                    break;
                }
            }
            let cut = if eof {
                buf.len()
            } else {
                match memchr::memrchr(b'\n', &buf) {
                    Some(p) => p + 1,
                    None => continue, // a line longer than the chunk: read more
                }
            };
            let chunk = &buf[..cut];
            let mut lines: Vec<&[u8]> = chunk.split(|b| *b == b'\n').collect();
            if chunk.is_empty() || chunk.ends_with(b"\n") {
                lines.pop();
            }
            let unterminated_last = eof && !chunk.is_empty() && !chunk.ends_with(b"\n");
            let first = line_no;
            let nlines = lines.len() as u64;
            if json {
                let parsed: Vec<(Batch, Vec<Item>)> = lines
                    .par_chunks(BATCH_LINES)
                    .enumerate()
                    .map_init(Scratch::default, |sc, (ci, ls)| {
                        let mut batch = Batch::default();
                        let base = first + (ci * BATCH_LINES) as u64 + 1;
                        let items = ls
                            .iter()
                            .enumerate()
                            .map(|(i, l)| parse_item(l, idx, base + i as u64, sc, &mut batch))
                            .collect();
                        (batch, items)
                    })
                    .collect();
                let mut i: u64 = 0;
                for (batch, items) in parsed {
                    let gmap: Vec<u32> = batch
                        .keys
                        .names()
                        .iter()
                        .map(|n| self.builder.intern(n))
                        .collect();
                    for p in items {
                        let ln = first + i + 1;
                        let is_last = unterminated_last && i + 1 == nlines;
                        i += 1;
                        match p {
                            Item::Fast(r) => {
                                self.fold_fast(&r, &batch, &gmap, ln, &mut state, &mut stats)
                            }
                            Item::Slow(p) => {
                                self.fold_json(*p, ln, is_last, &mut state, &mut stats)
                            }
                        }
                    }
                }
            } else {
                let parsed: Vec<TextItem> = lines
                    .par_iter()
                    .with_min_len(256)
                    .map(|l| textlog::parse_text_line(&String::from_utf8_lossy(l)))
                    .collect();
                for (i, item) in parsed.into_iter().enumerate() {
                    text.push(first + i as u64 + 1, item);
                }
            }
            stats.bytes += cut as u64;
            line_no += nlines;
            buf.drain(..cut);
        }
        stats.lines = line_no;
        if !json {
            text.finish();
            stats.unrecognised_lines = text.unrecognised;
            let mut kinds: Vec<&str> = Vec::new();
            for r in &text.records {
                self.builder.push(r);
                stats.records += 1;
                if !kinds.contains(&r.source.name()) {
                    kinds.push(r.source.name());
                }
                stats.non_finite += r.fields.iter().filter(|(_, v)| !v.is_finite()).count() as u64;
            }
            if !kinds.is_empty() {
                stats.format = format!("text ({})", kinds.join(", "));
            }
            stats.events += text.events.len() as u64;
            self.events.append(&mut text.events);
        } else if !state.kinds_seen.is_empty() {
            stats.format = state.kinds_seen.join("+");
        }
        self.files.push(stats);
        Ok(())
    }

    fn fold_fast(
        &mut self,
        r: &FastRec,
        batch: &Batch,
        gmap: &[u32],
        line: u64,
        st: &mut FoldState,
        stats: &mut FileStats,
    ) {
        let k = r.source.name();
        if !st.kinds_seen.contains(&k) {
            st.kinds_seen.push(k);
        }
        let types = batch
            .types
            .get(r.types.0 as usize..r.types.1 as usize)
            .unwrap_or_default();
        let fields = batch
            .fields
            .get(r.fields.0 as usize..r.fields.1 as usize)
            .unwrap_or_default();
        stats.nulls += r.nulls as u64;
        stats.non_finite += r.non_finite as u64;
        let g = |k: u32| gmap.get(k as usize).copied().unwrap_or(u32::MAX);
        for &(k, ty) in types {
            let id = g(k);
            st.tracker
                .observe(id, self.builder.key_name(id), ty, line, stats);
        }
        st.ids.clear();
        for &(k, v) in fields {
            let id = g(k);
            if !types.iter().any(|(t, _)| *t == k) {
                st.tracker
                    .observe(id, self.builder.key_name(id), "number", line, stats);
            }
            st.ids.push((id, v));
        }
        let step = match r.step {
            Some(s) => s,
            None => {
                let s = st.unnumbered;
                st.unnumbered += 1;
                let id = self.builder.intern("step_inferred");
                st.ids.push((id, 1.0));
                s
            }
        };
        self.builder
            .push_ids(Some(step), r.timestamp, r.source, &st.ids);
        stats.records += 1;
    }

    fn fold_json(
        &mut self,
        p: JsonLine,
        line: u64,
        is_unterminated_last: bool,
        st: &mut FoldState,
        stats: &mut FileStats,
    ) {
        let note_kind = |st: &mut FoldState, k: &'static str| {
            if !st.kinds_seen.contains(&k) {
                st.kinds_seen.push(k);
            }
        };
        match p {
            JsonLine::Blank => {}
            JsonLine::Bad(msg) => {
                if is_unterminated_last {
                    stats.truncated_last_line = true;
                    stats.bad_line(line, format!("truncated last line (skipped): {msg}"));
                } else {
                    stats.bad_line(line, msg);
                }
            }
            JsonLine::Step(mut rec, q) => {
                note_kind(st, rec.source.name());
                self.quality(&rec, &q, line, st, stats);
                if rec.step.is_none() {
                    rec.step = Some(st.unnumbered);
                    st.unnumbered += 1;
                    rec.fields.push(("step_inferred".to_string(), 1.0));
                }
                self.builder.push(&rec);
                stats.records += 1;
            }
            JsonLine::Event(out, q) => {
                note_kind(st, "events");
                if let Some(rec) = &out.record {
                    self.quality(rec, &q, line, st, stats);
                    if let Some(s) = rec.step {
                        // Only report iterations say where training is; other events'
                        // steps may be stale.
                        if rec
                            .fields
                            .iter()
                            .any(|(k, _)| k != "grad_nan_count" && k != "grad_norm")
                        {
                            st.last_iteration = Some(st.last_iteration.map_or(s, |l| l.max(s)));
                        }
                    }
                    self.builder.push(rec);
                    stats.records += 1;
                } else {
                    stats.nulls += q.nulls as u64;
                    stats.non_finite += q.non_finite as u64;
                }
                if let Some(mut ev) = out.event {
                    if let Some(prev) = &st.last_event {
                        if events::is_duplicate(prev, &ev) {
                            stats.duplicate_events += 1;
                            return;
                        }
                    }
                    st.last_event = Some(ev.clone());
                    if let (Some(s), Some(last)) = (ev.step, st.last_iteration) {
                        if s < last {
                            ev.step = Some(last);
                            ev.step_inferred = true;
                            stats.inferred_steps += 1;
                        }
                    }
                    if ev.step.is_none() {
                        ev.step = st.last_iteration;
                        ev.step_inferred = ev.step.is_some();
                    }
                    stats.events += 1;
                    self.events.push(ev);
                }
            }
        }
    }

    fn quality(
        &mut self,
        rec: &LogRecord,
        q: &LineQuality,
        line: u64,
        st: &mut FoldState,
        stats: &mut FileStats,
    ) {
        stats.nulls += q.nulls as u64;
        stats.non_finite += q.non_finite as u64;
        for (k, ty) in &q.types {
            let id = self.builder.intern(k);
            st.tracker.observe(id, k, ty, line, stats);
        }
        for (k, _) in &rec.fields {
            if !q.types.iter().any(|(t, _)| t == k) {
                let id = self.builder.intern(k);
                st.tracker.observe(id, k, "number", line, stats);
            }
        }
    }
}

/// Expand the command-line paths: a directory means every log in it (`*.jsonl`, `*.log`,
/// `*.txt`, `*.out`, `trainer_state.json`), sorted by name; `run_metadata.json` is not a log.
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| Error::io(p, e))?;
        if !meta.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| Error::io(p, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.is_file() && is_log_name(f))
            .collect();
        found.sort();
        if found.is_empty() {
            return Err(Error::Usage(format!(
                "{}: directory holds no logs (*.jsonl, *.log, *.txt, *.out, trainer_state.json)",
                p.display()
            )));
        }
        out.extend(found);
    }
    Ok(out)
}

fn is_log_name(p: &Path) -> bool {
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    name == "trainer_state.json"
        || [".jsonl", ".ndjson", ".log", ".txt", ".out"]
            .iter()
            .any(|ext| name.ends_with(ext))
}
