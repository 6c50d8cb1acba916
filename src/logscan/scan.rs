//! Streaming, parallel reading of log files: the file is read in fixed-size chunks cut at
//! line boundaries (memory constant in the file size), each chunk's lines are parsed in
//! parallel with rayon while the previous chunk is folded, in order, into the frame builder
//! and the event list, and the next chunk is read.
//! JSON step lines go through [`fastline`] (no `Value` tree, keys interned per batch of
//! lines); whatever it declines (events, escapes, bad or truncated lines) takes the general
//! `parse_value` path, so each line is read by exactly one of them.

use std::fs::File;

use crate::logs::input::Input;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::frames::log::frame::FrameBuilder;
use crate::logs::events::{self, EventLine};
use crate::logs::fastline::{self, Batch, FastRec, Scratch};
use crate::logs::steps::{self, LineQuality};
use crate::logs::textlog::{self, TextAssembler, TextItem};
use crate::logs::trackers::TrackerKind;
use crate::model::log::{
    preview, FileStats, LogEvent, LogRecord, RunTracker, SourceKind, TypeTracker,
};

/// Bytes read per chunk (two are held: one parsed while the next is read).
pub const CHUNK_BYTES: usize = 4 << 20;

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

/// Refuse what is not a file or a pipe by name (`/dev/zero` would be read forever,
/// growing one endless line), with the check the dump readers use.
fn refuse_non_files(path: &Path) -> Result<()> {
    let ft = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .file_type();
    match crate::error::not_a_file(ft) {
        Some(what) => Err(Error::format(
            path,
            crate::error::Position::File,
            format!("is {what}, not a log file"),
        )),
        None => Ok(()),
    }
}

/// Bytes of a file's beginning that [`kind_of`] looks at.
const HEAD_BYTES: u64 = 4096;

/// The file name of `path`, lowercased ("" when it has none).
fn lower_name(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// How to read a file named `name` (lowercased) that starts with `head`.
fn kind_of(name: &str, head: &[u8]) -> FileKind {
    if name == "trainer_state.json" {
        return FileKind::TrainerState;
    }
    let text = String::from_utf8_lossy(head);
    if name.ends_with(".json") && text.contains("\"log_history\"") {
        return FileKind::TrainerState;
    }
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        return FileKind::Jsonl;
    }
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    match first {
        // A pretty-printed trainer_state.json under another name (a pipe, a copy).
        Some("{") if text.contains("\"log_history\"") => FileKind::TrainerState,
        Some(l) if l.starts_with("{\"") => FileKind::Jsonl,
        _ => FileKind::Text,
    }
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
    /// Bytes read per chunk ([`CHUNK_BYTES`]; tests make it tiny).
    chunk_bytes: usize,
    /// Where an appended run starts: `(file index, line, first step)` of every run after
    /// a file's first.
    pub run_starts: Vec<(usize, u64, i64)>,
    /// The run to take from files that hold several ([`crate::logs::trackers::read_run`]).
    pub run: Option<String>,
    /// A file that can hold several runs was read with [`Collected::run`].
    pub run_used: bool,
    /// Each `.wandb` file read and its config records ([`crate::logs::trackers::run_config_known`]).
    pub wandb_configs: Vec<(PathBuf, Vec<crate::logs::trackers::wandb::ConfigRecord>)>,
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

/// Refill `buf` with `carry` (the previous chunk's unfinished line) and about `chunk`
/// more bytes of `f`, reading on until a newline arrives (a line longer than a chunk is
/// read whole) or the file ends. Returns whether it ended.
fn fill(f: &mut Input, buf: &mut Vec<u8>, carry: &[u8], chunk: usize) -> std::io::Result<bool> {
    buf.clear();
    buf.extend_from_slice(carry);
    let mut want = chunk.saturating_sub(carry.len()).max(chunk / 2).max(1);
    loop {
        let before = buf.len();
        // `read_to_end` reads into the spare capacity without zeroing it first.
        let n = f.take(want as u64).read_to_end(buf)?;
        if n < want {
            return Ok(true);
        }
        if buf
            .get(before..)
            .is_some_and(|new| memchr::memrchr(b'\n', new).is_some())
        {
            return Ok(false);
        }
        want = chunk.max(1);
    }
}

/// The lines of `chunk` (without their newlines; no empty last line after a final newline).
fn split_lines(chunk: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::with_capacity(chunk.len() / 256 + 1);
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', chunk) {
        lines.push(chunk.get(start..end).unwrap_or_default());
        start = end + 1;
    }
    if start < chunk.len() {
        lines.push(chunk.get(start..).unwrap_or_default());
    }
    lines
}

/// One chunk of JSON lines, parsed, waiting for the in-order fold.
struct ParsedChunk {
    /// Lines of the file before the chunk.
    first: u64,
    /// Lines in the chunk.
    nlines: u64,
    /// The chunk ends the file without a newline.
    unterminated_last: bool,
    batches: Vec<(Batch, Vec<Item>)>,
}

/// Parse a chunk's lines in parallel, in batches of [`BATCH_LINES`].
fn parse_chunk(lines: &[&[u8]], file: usize, first: u64) -> Vec<(Batch, Vec<Item>)> {
    lines
        .par_chunks(BATCH_LINES)
        .enumerate()
        .map_init(Scratch::default, |sc, (ci, ls)| {
            let mut batch = Batch::default();
            let base = first + (ci * BATCH_LINES) as u64 + 1;
            let items = ls
                .iter()
                .enumerate()
                .map(|(i, l)| parse_item(l, file, base + i as u64, sc, &mut batch))
                .collect();
            (batch, items)
        })
        .collect()
}

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
    runs: RunTracker,
}

impl Collected {
    /// An empty collection feeding `builder`.
    pub fn new(builder: FrameBuilder) -> Self {
        Collected {
            builder,
            events: Vec::new(),
            files: Vec::new(),
            chunk_bytes: CHUNK_BYTES,
            run_starts: Vec::new(),
            run: None,
            run_used: false,
            wandb_configs: Vec::new(),
        }
    }

    /// Read one file of any supported kind.
    /// The file is opened once and its first bytes, read to tell its kind, are the start
    /// of what is parsed: a pipe (`logscan <(zcat steps.jsonl.gz)`) cannot be read twice.
    pub fn read_file(&mut self, path: &Path) -> Result<()> {
        let idx = self.files.len();
        let mut f: Input = if crate::logs::input::is_remote(path) {
            crate::logs::input::open_remote(path)?
        } else {
            refuse_non_files(path)?;
            Box::new(File::open(path).map_err(|e| Error::io(path, e))?)
        };
        let mut head = Vec::new();
        (&mut f)
            .take(HEAD_BYTES)
            .read_to_end(&mut head)
            .map_err(|e| Error::io(path, e))?;
        if let Some(kind) = crate::logs::trackers::sniff(path, &head) {
            let input = std::io::Cursor::new(head).chain(f);
            let run = self.run.as_deref();
            self.run_used |= run.is_some() && crate::logs::trackers::holds_runs(kind);
            let (wandb, mut configs) = (kind == TrackerKind::Wandb, Vec::new());
            let keep = wandb.then_some(&mut configs);
            let stats =
                super::tracker::read_tracker(&mut self.builder, kind, path, input, run, keep)?;
            if wandb {
                self.wandb_configs.push((path.to_path_buf(), configs));
            }
            self.files.push(stats);
            return Ok(());
        }
        match kind_of(&lower_name(path), &head) {
            FileKind::TrainerState => {
                f.read_to_end(&mut head).map_err(|e| Error::io(path, e))?;
                let text = String::from_utf8(head).map_err(|e| {
                    Error::format(
                        path,
                        crate::error::Position::Byte(e.utf8_error().valid_up_to() as u64),
                        "not UTF-8",
                    )
                })?;
                let (records, mut stats) = steps::parse_trainer_state(path, &text, idx)?;
                let mut runs = RunTracker::default();
                for r in &records {
                    if let Some(s) = r.step {
                        let run = runs.observe(s, r.line);
                        self.builder.set_run(run);
                    }
                    self.builder.push(r);
                }
                self.end_runs(idx, &runs, &mut stats);
                self.files.push(stats);
                Ok(())
            }
            FileKind::Jsonl => self.read_lines(path, f, &head, idx, true),
            FileKind::Text => self.read_lines(path, f, &head, idx, false),
        }
    }

    /// Parse the lines of `f`, whose first bytes `head` were already read from it.
    fn read_lines(
        &mut self,
        path: &Path,
        mut f: Input,
        head: &[u8],
        idx: usize,
        json: bool,
    ) -> Result<()> {
        let mut stats = FileStats {
            path: path.to_path_buf(),
            format: if json { "jsonl" } else { "text" }.to_string(),
            first_line: preview(head),
            ..FileStats::default()
        };
        // Two buffers: one chunk is parsed while the next is read into the other.
        let chunk_bytes = self.chunk_bytes;
        let mut cur: Vec<u8> = Vec::with_capacity(chunk_bytes);
        let mut next: Vec<u8> = Vec::with_capacity(chunk_bytes);
        let mut eof = fill(&mut f, &mut cur, head, chunk_bytes).map_err(|e| Error::io(path, e))?;
        let mut line_no: u64 = 0;
        let mut state = FoldState {
            tracker: TypeTracker::default(),
            last_iteration: None,
            last_event: None,
            unnumbered: 0,
            kinds_seen: Vec::new(),
            ids: Vec::new(),
            runs: RunTracker::default(),
        };
        let mut text = TextAssembler::new(idx);
        let mut pending: Option<ParsedChunk> = None;
        loop {
            // Whole lines only; `fill` read past a newline unless the file ended.
            let cut = if eof {
                cur.len()
            } else {
                memchr::memrchr(b'\n', &cur).map_or(cur.len(), |p| p + 1)
            };
            let chunk = &cur[..cut];
            let lines = split_lines(chunk);
            let unterminated_last = eof && !chunk.is_empty() && !chunk.ends_with(b"\n");
            let first = line_no;
            let nlines = lines.len() as u64;
            let refill = |f: &mut Input, next: &mut Vec<u8>| {
                if eof {
                    next.clear();
                    Ok(true)
                } else {
                    fill(f, next, cur.get(cut..).unwrap_or_default(), chunk_bytes)
                }
            };
            let next_eof = if json {
                // Parse this chunk while the previous one is folded and the next is read.
                let prev = pending.take();
                let (parsed, next_eof) = rayon::join(
                    || ParsedChunk {
                        first,
                        nlines,
                        unterminated_last,
                        batches: parse_chunk(&lines, idx, first),
                    },
                    || {
                        if let Some(p) = prev {
                            self.fold_chunk(p, &mut state, &mut stats);
                        }
                        refill(&mut f, &mut next)
                    },
                );
                pending = Some(parsed);
                next_eof
            } else {
                let parsed: Vec<TextItem> = lines
                    .par_iter()
                    .with_min_len(256)
                    .map(|l| textlog::parse_text_line(&String::from_utf8_lossy(l)))
                    .collect();
                for (i, item) in parsed.into_iter().enumerate() {
                    text.push(first + i as u64 + 1, item);
                }
                refill(&mut f, &mut next)
            }
            .map_err(|e| Error::io(path, e))?;
            stats.bytes += cut as u64;
            line_no += nlines;
            if eof {
                break;
            }
            std::mem::swap(&mut cur, &mut next);
            eof = next_eof;
        }
        if let Some(p) = pending.take() {
            self.fold_chunk(p, &mut state, &mut stats);
        }
        stats.lines = line_no;
        if !json {
            text.finish();
            stats.unrecognised_lines = text.unrecognised;
            stats.progress_bars = text.bars;
            let mut kinds: Vec<&str> = Vec::new();
            for r in &text.records {
                let inferred = r.fields.iter().any(|(k, _)| k == "step_inferred");
                if let (Some(s), false) = (r.step, inferred) {
                    let run = state.runs.observe(s, r.line);
                    self.builder.set_run(run);
                }
                if r.fields.iter().any(|(k, _)| k == textlog::EVAL_MARK) {
                    stats.eval_records += 1;
                }
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
            for ev in &mut text.events {
                ev.run = state.runs.run_at_line(ev.line);
            }
            self.events.append(&mut text.events);
        } else if !state.kinds_seen.is_empty() {
            stats.format = state.kinds_seen.join("+");
        }
        self.end_runs(idx, &state.runs, &mut stats);
        self.files.push(stats);
        Ok(())
    }

    /// Record a file's run starts and put the builder back on run 0 for the next file.
    fn end_runs(&mut self, idx: usize, runs: &RunTracker, stats: &mut FileStats) {
        if stats.records > 0 {
            stats.runs = runs.run + 1;
        }
        self.run_starts
            .extend(runs.starts.iter().map(|&(line, step)| (idx, line, step)));
        self.builder.set_run(0);
    }

    /// Fold a parsed chunk's records and events, in line order.
    fn fold_chunk(&mut self, p: ParsedChunk, state: &mut FoldState, stats: &mut FileStats) {
        let mut i: u64 = 0;
        for (batch, items) in p.batches {
            let gmap: Vec<u32> = batch
                .keys
                .names()
                .iter()
                .map(|n| self.builder.intern(n))
                .collect();
            for item in items {
                let ln = p.first + i + 1;
                let is_last = p.unterminated_last && i + 1 == p.nlines;
                i += 1;
                match item {
                    Item::Fast(r) => self.fold_fast(&r, &batch, &gmap, ln, state, stats),
                    Item::Slow(j) => self.fold_json(*j, ln, is_last, state, stats),
                }
            }
        }
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
            Some(s) => {
                let run = st.runs.observe(s, line);
                self.builder.set_run(run);
                s
            }
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
                match rec.step {
                    Some(s) => {
                        let run = st.runs.observe(s, line);
                        self.builder.set_run(run);
                    }
                    None => {
                        rec.step = Some(st.unnumbered);
                        st.unnumbered += 1;
                        rec.fields.push(("step_inferred".to_string(), 1.0));
                    }
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
                            let run = st.runs.observe(s, line);
                            if st.runs.starts.last().is_some_and(|(l, _)| *l == line) {
                                st.last_iteration = None;
                            }
                            self.builder.set_run(run);
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
                    ev.run = st.runs.run;
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
        if crate::logs::input::is_remote(p) {
            match crate::logs::input::expand_remote(p, is_log_name)? {
                Some(found) => out.extend(found),
                None => out.push(p.clone()),
            }
            continue;
        }
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
        found.extend(crate::logs::trackers::find_in_dir(p)?);
        found.sort();
        found.dedup();
        crate::logs::trackers::sort_for_reading(&mut found);
        if found.is_empty() {
            return Err(Error::Usage(format!(
                "{}: directory holds no logs (*.jsonl, *.log, *.txt, *.out, trainer_state.json) or tracker files (events.out.tfevents.*, run-*.wandb, *.csv)",
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

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
