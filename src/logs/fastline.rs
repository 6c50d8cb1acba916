//! The fast path for JSON step lines: a borrowed scanner over one line's bytes that pulls
//! the flattened `key → number` pairs of a DebugTrainer `steps.jsonl`, verl
//! `{"step", "data"}` or flat JSONL line without building a [`Value`](crate::value::Value)
//! tree, with keys interned per batch of lines.
//!
//! It accepts only a strict subset of JSON (no escapes in strings, integers of at most 18
//! digits, no `event` key, no repeated special key, nesting under 64 levels) and gives up
//! (`None`) on anything else, so the caller falls back to [`crate::json::parse_value`] and
//! the readers in [`crate::logs::steps`]; on what it accepts it yields exactly the record
//! and [`LineQuality`] that path yields (tests check both on tricky lines).

use crate::logs::steps::{
    parse_number_text, progress_step, LineQuality, EXTRA_STEP_KEY, PROGRESS_STEP_KEY, STEP_KEYS,
    TIME_KEYS,
};
use crate::model::log::{LogRecord, SourceKind};

/// One fast-parsed step line; its fields and types live in the [`Batch`].
#[derive(Debug, Clone)]
pub struct FastRec {
    /// Training step.
    pub step: Option<i64>,
    /// Unix time.
    pub timestamp: Option<f64>,
    /// Producer.
    pub source: SourceKind,
    /// Range of `Batch::fields`.
    pub fields: (u32, u32),
    /// Range of `Batch::types`.
    pub types: (u32, u32),
    /// Null fields.
    pub nulls: u32,
    /// NaN/±inf fields.
    pub non_finite: u32,
}

/// Fast-parsed records of a run of lines, keys interned batch-locally.
#[derive(Debug, Default)]
pub struct Batch {
    /// Batch-local key ids.
    pub keys: Interner,
    /// `(key id, value)` of every record, back to back.
    pub fields: Vec<(u32, f64)>,
    /// `(key id, type)` of every non-number leaf, back to back.
    pub types: Vec<(u32, &'static str)>,
    /// The key ids of the previous line's leaves, in order: lines of one file mostly
    /// repeat their keys, so a name compare usually replaces a hash lookup.
    hint: Vec<u32>,
    /// The id of each leaf of the scratch's current shape (`u32::MAX`: not looked up yet in
    /// this batch), for the shape generation `shape_gen`.
    shape_ids: Vec<u32>,
    shape_gen: u64,
}

impl Batch {
    /// The id of the `n`-th key of the current line.
    #[inline]
    fn key_id(&mut self, n: usize, key: &str) -> u32 {
        if let Some(&id) = self.hint.get(n) {
            if self.keys.name(id) == key {
                return id;
            }
        }
        let id = self.keys.intern(key);
        match self.hint.get_mut(n) {
            Some(h) => *h = id,
            None => self.hint.push(id),
        }
        id
    }
}

/// A leaf's value as the scanner saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaf {
    Num(f64),
    Bool(bool),
    Null,
    /// Byte range of the string's contents in the line.
    Str(u32, u32),
    List,
}

/// A top-level (or `data`-level) value, for step/timestamp lookups.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Top {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(u32, u32),
    Other,
    Dict,
}

/// Special top-level keys tracked by slot ([`special_slot`] gives the position; a test
/// checks the two agree).
#[cfg(test)]
const SPECIAL: &[&str] = &[
    "step",
    "iteration",
    "global_step",
    "iter",
    "_step",
    "timestamp",
    "_timestamp",
    "wall_time",
    "data",
    "train_loss",
    "token_count_summary",
    EXTRA_STEP_KEY,
    PROGRESS_STEP_KEY,
];
/// The slot of `key` in `SPECIAL` (the test list): one `match` (length then bytes)
/// instead of 13 string compares per top-level key.
#[inline]
fn special_slot(key: &str) -> Option<usize> {
    Some(match key {
        "step" => 0,
        "iteration" => 1,
        "global_step" => 2,
        "iter" => 3,
        "_step" => 4,
        "timestamp" => 5,
        "_timestamp" => 6,
        "wall_time" => 7,
        "data" => DATA,
        "train_loss" => TRAIN_LOSS,
        "token_count_summary" => TCS,
        EXTRA_STEP_KEY => CURRENT_STEPS,
        PROGRESS_STEP_KEY => PROGRESS_STEP,
        _ => return None,
    })
}

const DATA: usize = 8;
const TRAIN_LOSS: usize = 9;
const TCS: usize = 10;
/// LLaMA-Factory `trainer_log.jsonl`'s step key ([`EXTRA_STEP_KEY`]).
const CURRENT_STEPS: usize = 11;
/// ms-swift `logging.jsonl`'s `"global_step/max_steps": "5/3766"` ([`PROGRESS_STEP_KEY`]).
const PROGRESS_STEP: usize = 12;
const MAX_DEPTH: u32 = 64;

/// Reusable per-worker scratch.
#[derive(Debug, Default)]
pub struct Scratch {
    paths: String,
    all: String,
    /// `(path range in all, start of the part below the top-level key, offset of the part below the top-level key, top special slot
    /// or u8::MAX, leaf)`.
    leaves: Vec<(u32, u32, u32, u8, Leaf)>,
    top: [Option<Top>; 13],
    data_time: [Option<Top>; 3],
    /// Per leaf, as the full scan saw it: what [`shape::Shape`] needs to replay it.
    meta: Vec<shape::LeafMeta>,
    /// Top-level special slots whose value was an object.
    top_dicts: Vec<u8>,
    /// The line cannot be a shape (an object under a `data` time key).
    no_shape: bool,
    /// The last line's shape, replayed on the next lines while they match it.
    shape: shape::Shape,
}

struct Scan<'a> {
    /// The line, checked UTF-8 once, so keys and numbers are sliced, not re-validated.
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if c == b' ' || c == b'\t' || c == b'\n' || c == b'\r' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// A string without escapes or control characters; `i` is at the opening quote.
    #[inline]
    fn string(&mut self) -> Option<(usize, usize)> {
        let start = self.i + 1;
        let rest = self.b.get(start..)?;
        let n = rest
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if rest[n] != b'"' {
            return None;
        }
        self.i = start + n + 1;
        Some((start, start + n))
    }

    #[inline]
    fn lit(&mut self, word: &[u8]) -> bool {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    /// A JSON number (or a bare NaN/±Infinity) → (value, is an integer literal).
    #[inline(always)]
    fn number(&mut self) -> Option<Top> {
        let b = self.b;
        let start = self.i;
        let mut j = start;
        let neg = b.get(j) == Some(&b'-');
        if neg {
            j += 1;
        }
        match b.get(j) {
            Some(b'I') if b[j..].starts_with(b"Infinity") => {
                self.i = j + 8;
                return Some(Top::Float(if neg {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }));
            }
            Some(b'N') if !neg && b[j..].starts_with(b"NaN") => {
                self.i = j + 3;
                return Some(Top::Float(f64::NAN));
            }
            Some(b'0') => j += 1,
            Some(b'1'..=b'9') => {
                while b.get(j).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
            }
            _ => return None,
        }
        let int_end = j;
        if !matches!(b.get(j), Some(b'.' | b'e' | b'E')) {
            self.i = j;
            let digits = &b[if neg { start + 1 } else { start }..int_end];
            if digits.len() > 18 {
                return None; // big ints: the slow path knows serde_json's rules
            }
            let mut v: i64 = 0;
            for &d in digits {
                v = v * 10 + (d - b'0') as i64;
            }
            if neg {
                // serde_json reads `-0` as the float -0.0.
                return Some(if v == 0 {
                    Top::Float(-0.0)
                } else {
                    Top::Int(-v)
                });
            }
            return Some(Top::Int(v));
        }
        // JSON wants a digit after `.`; fast-float2 would also take `1.` and `1.e5`.
        if b.get(j) == Some(&b'.') && !b.get(j + 1).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        // fast-float2 (Eisel-Lemire, correctly rounded like `str::parse`, so the same f64)
        // reads the fraction and exponent in the same pass that converts them. An exponent
        // without digits (`1e`, `1e+`) it leaves unread, and the object scan then fails on
        // the `e`, so such a number still goes to the general path, as before.
        let (f, n) = fast_float2::parse_partial::<f64, _>(b.get(start..)?).ok()?;
        let j = start + n;
        self.i = j;
        // serde_json rejects overflow; leave underflow to it as well.
        if f.is_infinite() {
            return None;
        }
        if f == 0.0 {
            let m = &b[start..j];
            let m_end = m
                .iter()
                .position(|c| *c == b'e' || *c == b'E')
                .unwrap_or(m.len());
            if m[..m_end].iter().any(|c| (b'1'..=b'9').contains(c)) {
                return None;
            }
        }
        Some(Top::Float(f))
    }

    /// Skip any value (validating it), used for arrays.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => {
                self.i += 1;
                self.ws();
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    if self.peek()? != b'"' {
                        return None;
                    }
                    self.string()?;
                    self.ws();
                    if self.peek()? != b':' {
                        return None;
                    }
                    self.i += 1;
                    self.ws();
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => {
                            self.i += 1;
                            self.ws();
                        }
                        b'}' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => {
                            self.i += 1;
                            self.ws();
                        }
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b't' => self.lit(b"true").then_some(()),
            b'f' => self.lit(b"false").then_some(()),
            b'n' => self.lit(b"null").then_some(()),
            _ => self.number().map(|_| ()),
        }
    }
}

/// Where an object sits: the top level, the top-level `data` object, or deeper.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Top,
    Data,
    Deeper,
}

fn object(
    s: &mut Scan<'_>,
    sc: &mut Scratch,
    level: Level,
    rel: u32,
    special: u8,
    depth: u32,
) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    // `i` is at '{'.
    s.i += 1;
    s.ws();
    if s.peek()? == b'}' {
        s.i += 1;
        return Some(());
    }
    let prefix_len = sc.paths.len();
    loop {
        if s.peek()? != b'"' {
            return None;
        }
        let (ks, ke) = s.string()?;
        let key = s.text.get(ks..ke)?;
        s.ws();
        if s.peek()? != b':' {
            return None;
        }
        s.i += 1;
        s.ws();
        // Path of this entry.
        sc.paths.truncate(prefix_len);
        if level != Level::Top {
            sc.paths.push('.');
        }
        sc.paths.push_str(key);
        let (slot, rel_here) = if level == Level::Top {
            if key == "event" {
                return None;
            }
            let slot = special_slot(key);
            if let Some(p) = slot {
                if sc.top[p].is_some() {
                    return None; // repeated special key: leave it to the slow path
                }
            }
            (
                slot.map_or(u8::MAX, |p| p as u8),
                (sc.paths.len() + 1) as u32,
            )
        } else {
            (special, rel)
        };
        let c = s.peek()?;
        let vstart = s.i as u32;
        let (val, top) = if c == b'{' {
            if level == Level::Top && slot != u8::MAX {
                sc.top_dicts.push(slot);
            }
            if level == Level::Data && TIME_KEYS.contains(&key) {
                sc.no_shape = true;
            }
            let path_end = sc.paths.len();
            let lvl = if level == Level::Top && slot == DATA as u8 {
                Level::Data
            } else {
                Level::Deeper
            };
            object(s, sc, lvl, rel_here, slot, depth + 1)?;
            sc.paths.truncate(path_end);
            (None, Top::Dict)
        } else {
            let (leaf, top) = leaf_value(s, c, depth)?;
            (Some(leaf), top)
        };
        let is_top = level == Level::Top && slot != u8::MAX;
        if is_top {
            sc.top[slot as usize] = Some(top);
        }
        let mut dtime = u8::MAX;
        if level == Level::Data {
            if let Some(p) = TIME_KEYS.iter().position(|k| *k == key) {
                dtime = p as u8;
                if sc.data_time[p].is_none() {
                    sc.data_time[p] = Some(top);
                }
            }
        }
        if let Some(leaf) = val {
            let a = sc.all.len() as u32;
            sc.all.push_str(&sc.paths);
            let z = sc.all.len() as u32;
            sc.leaves.push((a, z, a + rel_here, slot, leaf));
            sc.meta.push(shape::LeafMeta {
                span: (vstart, s.i as u32),
                depth,
                is_top,
                dtime,
            });
        }
        s.ws();
        match s.peek()? {
            b',' => {
                s.i += 1;
                s.ws();
            }
            b'}' => {
                s.i += 1;
                sc.paths.truncate(prefix_len);
                return Some(());
            }
            _ => return None,
        }
    }
}

/// A value that is not an object (`c`: its first byte, at `s.i`): the leaf and the
/// top-level view of it. The full scan and [`shape::Shape::replay`] both read values here,
/// so they cannot disagree on one.
#[inline(always)]
fn leaf_value(s: &mut Scan<'_>, c: u8, depth: u32) -> Option<(Leaf, Top)> {
    Some(match c {
        b'"' => {
            let (a, z) = s.string()?;
            (Leaf::Str(a as u32, z as u32), Top::Str(a as u32, z as u32))
        }
        b'[' => {
            s.skip_value(depth + 1)?;
            (Leaf::List, Top::Other)
        }
        b't' => s
            .lit(b"true")
            .then_some((Leaf::Bool(true), Top::Bool(true)))?,
        b'f' => s
            .lit(b"false")
            .then_some((Leaf::Bool(false), Top::Bool(false)))?,
        b'n' => s.lit(b"null").then_some((Leaf::Null, Top::Other))?,
        b'{' => return None,
        _ => match s.number()? {
            Top::Int(i) => (Leaf::Num(i as f64), Top::Int(i)),
            Top::Float(f) => (Leaf::Num(f), Top::Float(f)),
            _ => return None,
        },
    })
}

/// The text of a string the scanner validated.
fn text_at(line: &str, a: u32, z: u32) -> &str {
    line.get(a as usize..z as usize).unwrap_or_default()
}

fn step_from(t: Option<Top>, line: &str) -> Option<i64> {
    match t? {
        Top::Int(i) => Some(i),
        Top::Float(f) if f.is_finite() && f.fract() == 0.0 => Some(f as i64),
        Top::Str(a, z) => progress_step(text_at(line, a, z)),
        _ => None,
    }
}

fn time_from(t: Option<Top>) -> Option<f64> {
    match t? {
        Top::Int(i) => Some(i as f64),
        Top::Float(f) => Some(f),
        Top::Bool(b) => Some(b as u8 as f64),
        _ => None,
    }
}

/// Fast-parse one JSON line (ASCII whitespace around it allowed) into `out` (keys interned
/// there); `None` when the line needs the general path (nothing is then added to `out`).
/// A line that is not UTF-8 is declined (JSON allows other bytes nowhere).
pub fn parse_line(line: &[u8], sc: &mut Scratch, out: &mut Batch) -> Option<FastRec> {
    let b = line.trim_ascii();
    if b.first() != Some(&b'{') {
        return None;
    }
    let b = std::str::from_utf8(b).ok()?;
    // A line with the previous line's shape (its bytes between the values) has its keys:
    // only the values are read. Otherwise the full scan, whose line becomes the shape.
    let replayed = shape::replay(b, sc);
    if !replayed {
        sc.paths.clear();
        sc.all.clear();
        sc.leaves.clear();
        sc.meta.clear();
        sc.top_dicts.clear();
        sc.no_shape = false;
        sc.top = [None; 13];
        sc.data_time = [None; 3];
        let mut s = Scan {
            text: b,
            b: b.as_bytes(),
            i: 0,
        };
        object(&mut s, sc, Level::Top, 0, u8::MAX, 0)?;
        s.ws();
        if s.i != b.len() {
            return None;
        }
        shape::record(b, sc);
    }
    let all = if replayed {
        sc.shape.all.as_str()
    } else {
        sc.all.as_str()
    };
    // Batch ids of the shape's leaves, valid for this batch and shape.
    if out.shape_gen != sc.shape.gen {
        out.shape_gen = sc.shape.gen;
        out.shape_ids.clear();
        out.shape_ids.resize(sc.leaves.len(), u32::MAX);
    }
    let verl = sc.top[DATA] == Some(Top::Dict) && sc.top[0].is_some();
    let step = (0..STEP_KEYS.len())
        .find_map(|p| step_from(sc.top[p], b))
        .or_else(|| step_from(sc.top[CURRENT_STEPS], b))
        .or_else(|| step_from(sc.top[PROGRESS_STEP], b));
    let mut timestamp = (0..TIME_KEYS.len()).find_map(|p| time_from(sc.top[5 + p]));
    let source = if verl {
        if timestamp.is_none() {
            timestamp = (0..TIME_KEYS.len()).find_map(|p| time_from(sc.data_time[p]));
        }
        SourceKind::VerlJsonl
    } else if sc.top[TRAIN_LOSS].is_some() || sc.top[TCS].is_some() {
        SourceKind::Steps
    } else {
        SourceKind::GenericJsonl
    };
    let f0 = out.fields.len() as u32;
    let t0 = out.types.len() as u32;
    let mut nulls = 0u32;
    let mut non_finite = 0u32;
    let mut n = 0usize;
    for (li, &(a, z, rel, slot, leaf)) in sc.leaves.iter().enumerate() {
        let key = if verl {
            if slot != DATA as u8 {
                continue;
            }
            all.get(rel as usize..z as usize)
        } else {
            if (slot as usize) < 8 {
                continue; // top-level step and time keys are not metrics
            }
            all.get(a as usize..z as usize)
        };
        let Some(key) = key else {
            // Not reachable (ranges come from the scan), but leave `out` as it was.
            out.fields.truncate(f0 as usize);
            out.types.truncate(t0 as usize);
            return None;
        };
        let mut id = |out: &mut Batch| {
            n += 1;
            match out.shape_ids.get(li) {
                Some(&k) if k != u32::MAX => k,
                _ => {
                    let k = out.key_id(n - 1, key);
                    if let Some(c) = out.shape_ids.get_mut(li) {
                        *c = k;
                    }
                    k
                }
            }
        };
        match leaf {
            Leaf::Null => {
                nulls += 1;
                if verl {
                    non_finite += 1;
                    let k = id(out);
                    out.fields.push((k, f64::NAN));
                }
            }
            Leaf::List => {
                let k = id(out);
                out.types.push((k, "list"));
            }
            Leaf::Num(f) => {
                if !f.is_finite() {
                    non_finite += 1;
                }
                let k = id(out);
                out.fields.push((k, f));
            }
            Leaf::Bool(v) => {
                let k = id(out);
                out.types.push((k, "bool"));
                out.fields.push((k, v as u8 as f64));
            }
            Leaf::Str(sa, sz) => {
                let k = id(out);
                out.types.push((k, "str"));
                if let Some(f) = parse_number_text(text_at(b, sa, sz)) {
                    if !f.is_finite() {
                        non_finite += 1;
                    }
                    out.fields.push((k, f));
                }
            }
        }
    }
    Some(FastRec {
        step,
        timestamp,
        source,
        fields: (f0, out.fields.len() as u32),
        types: (t0, out.types.len() as u32),
        nulls,
        non_finite,
    })
}

/// The fast path on one line as a plain record (for tests and tools): `None` when the line
/// needs the general path.
pub fn fast_record(text: &str, file: usize, line: u64) -> Option<(LogRecord, LineQuality)> {
    let mut sc = Scratch::default();
    let mut b = Batch::default();
    let r = parse_line(text.as_bytes(), &mut sc, &mut b)?;
    let fields = b.fields[r.fields.0 as usize..r.fields.1 as usize]
        .iter()
        .map(|&(k, v)| (b.keys.name(k).to_string(), v))
        .collect();
    let types = b.types[r.types.0 as usize..r.types.1 as usize]
        .iter()
        .map(|&(k, t)| (b.keys.name(k).to_string(), t))
        .collect();
    Some((
        LogRecord {
            step: r.step,
            timestamp: r.timestamp,
            source: r.source,
            file,
            line,
            fields,
        },
        LineQuality {
            nulls: r.nulls,
            non_finite: r.non_finite,
            types,
        },
    ))
}

#[path = "fastline_intern.rs"]
mod intern;
pub use intern::{FxHasher, FxMap, Interner};

#[path = "fastline_shape.rs"]
mod shape;

#[cfg(test)]
#[path = "fastline_tests.rs"]
mod tests;
