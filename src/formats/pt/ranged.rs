//! A `.pt` in object storage read with ranged GETs: the zip's tail (end-of-central-directory
//! records, zip64 included, and usually the central directory), then the spans of the
//! members the caller needs — `data.pkl`, `byteorder` when present, and the storages the
//! pickle (or, for [`read_pt_remote`] with keys, the requested root keys) uses — adjacent
//! spans coalesced into one GET. `.data/version`, `.format_version`, storages no requested
//! key uses and the like are never fetched. Every member read is still checked against its
//! CRC-32, as locally.
//!
//! The zip records are parsed here (APPNOTE.TXT 6.3.10 §4.3.6–4.3.16: local header,
//! central directory header, zip64 end-of-central-directory record and locator, end of
//! central directory), since the zip crate wants the whole archive behind a `Read + Seek`.
//! torch's writer (caffe2/serialize/inline_container.cc, `PyTorchStreamWriter`, torch
//! v2.5.0) stores members uncompressed, one after another, with local headers padded to
//! 64-byte alignment, then the central directory: a member's span is from its local header
//! to the next member's (or the directory). Anything this parser does not expect (no end
//! record in the tail, a compressed or encrypted member, a span that does not hold its
//! data) falls back to fetching the object whole and reading it as a local file is read,
//! so that errors say what they say locally.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{FormatError, Result};
use crate::formats::source;
use crate::tensor::{Bytes, Tensor};
use crate::value::Value;

use super::pickle::{self, StorageRequest};

/// Bytes fetched first from the end of the object: the end records and, for the dumps and
/// checkpoints of a few hundred members, the whole central directory; an object this size
/// or smaller is fetched whole in this one GET.
pub const TAIL: u64 = 64 << 10;

/// Pieces of one object already fetched: `(offset in the object, bytes)`.
#[derive(Default)]
struct Pieces(Vec<(u64, Arc<Vec<u8>>)>);

impl Pieces {
    /// The piece holding all of `r`, with `r`'s start within it.
    fn holding(&self, r: &Range<u64>) -> Option<(Arc<Vec<u8>>, usize)> {
        self.0.iter().find_map(|(at, b)| {
            (r.start >= *at && r.end <= at + b.len() as u64)
                .then(|| (b.clone(), (r.start - at) as usize))
        })
    }

    /// The parts of `r` no piece holds.
    fn missing(&self, r: &Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut pos = r.start;
        while pos < r.end {
            if let Some((at, b)) = self
                .0
                .iter()
                .find(|(at, b)| pos >= *at && pos < at + b.len() as u64)
            {
                pos = at + b.len() as u64;
                continue;
            }
            let next = self
                .0
                .iter()
                .map(|(at, _)| *at)
                .filter(|&at| at > pos)
                .min()
                .unwrap_or(r.end)
                .min(r.end);
            out.push(pos..next);
            pos = next;
        }
        out
    }

    /// Bytes `r`, contiguous: a piece holding them, or a copy gathered from several (kept
    /// as a piece of its own). Every byte of `r` must have been fetched.
    fn get(&mut self, r: &Range<u64>) -> Option<(Arc<Vec<u8>>, usize)> {
        if let Some(found) = self.holding(r) {
            return Some(found);
        }
        let mut out = Vec::with_capacity((r.end - r.start) as usize);
        let mut pos = r.start;
        while pos < r.end {
            let (at, b) = self
                .0
                .iter()
                .find(|(at, b)| pos >= *at && pos < at + b.len() as u64)?;
            let from = (pos - at) as usize;
            let to = ((r.end - at) as usize).min(b.len());
            out.extend_from_slice(&b[from..to]);
            pos = at + to as u64;
        }
        let b = Arc::new(out);
        self.0.push((r.start, b.clone()));
        Some((b, 0))
    }

    fn bytes(&self) -> usize {
        self.0.iter().map(|(_, b)| b.len()).sum()
    }
}

/// Fetch the parts of `ranges` not yet held, adjacent parts coalesced into one GET.
fn fetch(path: &Path, pieces: &mut Pieces, ranges: &[Range<u64>]) -> Result<()> {
    let mut want: Vec<Range<u64>> = ranges.iter().flat_map(|r| pieces.missing(r)).collect();
    want.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in want {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    if merged.is_empty() {
        return Ok(());
    }
    for (r, b) in merged.iter().zip(source::read_ranges(path, &merged)?) {
        pieces.0.push((r.start, Arc::new(b)));
    }
    Ok(())
}

/// Fetched pieces kept for a second read of the same object (a tool may read a
/// whole-batch file twice), at most [`source::CACHE_BYTES`] in all, oldest dropped first.
type PieceCache = Mutex<Vec<(PathBuf, Arc<Mutex<Pieces>>)>>;

fn piece_cache() -> &'static PieceCache {
    static C: OnceLock<PieceCache> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The pieces of `path` (new and empty the first time). An entry being read by another
/// thread counts as empty in the total (`try_lock`): the cache never waits for a fetch.
fn pieces_of(path: &Path) -> Arc<Mutex<Pieces>> {
    let mut c = piece_cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = c.iter().find(|(p, _)| p == path) {
        return p.clone();
    }
    let p = Arc::new(Mutex::new(Pieces::default()));
    c.push((path.to_path_buf(), p.clone()));
    let mut total: usize = c
        .iter()
        .map(|(_, p)| p.try_lock().map(|p| p.bytes()).unwrap_or(0))
        .sum();
    while total > source::CACHE_BYTES && c.len() > 1 {
        let (_, old) = c.remove(0);
        total = total.saturating_sub(old.try_lock().map(|p| p.bytes()).unwrap_or(0));
    }
    p
}

/// One central-directory entry: what a member's span and data are.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    header: u64,
    size: u64,
    csize: u64,
    crc: u32,
    method: u16,
    flags: u16,
    /// From the local header to the next member's (or the central directory).
    span: Range<u64>,
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
}

/// The central directory's `(offset, size)` from the end records in `tail` (the object's
/// bytes from `tail_at` to its end); `None` when they are not there.
fn directory(
    path: &Path,
    pieces: &mut Pieces,
    tail_at: u64,
    size: u64,
) -> Result<Option<(u64, u64)>> {
    let (tail, off) = match pieces.get(&(tail_at..size)) {
        Some(t) => t,
        None => return Ok(None),
    };
    let tail = &tail[off..];
    let Some(i) = (0..=tail.len().saturating_sub(22))
        .rev()
        .find(|&i| tail[i..].starts_with(b"PK\x05\x06"))
    else {
        return Ok(None);
    };
    let (Some(s), Some(a)) = (u32_at(tail, i + 12), u32_at(tail, i + 16)) else {
        return Ok(None);
    };
    let (mut cd_size64, mut cd_at64) = (s as u64, a as u64);
    // A zip64 locator just before the end record points at the zip64 end record.
    if i >= 20 && tail[i - 20..].starts_with(b"PK\x06\x07") {
        let Some(z) = u64_at(tail, i - 20 + 8) else {
            return Ok(None);
        };
        if z.checked_add(56).is_none_or(|end| end > size) {
            return Ok(None);
        }
        fetch(path, pieces, std::slice::from_ref(&(z..z + 56)))?;
        let Some((rec, o)) = pieces.get(&(z..z + 56)) else {
            return Ok(None);
        };
        if !rec[o..].starts_with(b"PK\x06\x06") {
            return Ok(None);
        }
        cd_size64 = u64_at(&rec, o + 40).unwrap_or(u64::MAX);
        cd_at64 = u64_at(&rec, o + 48).unwrap_or(u64::MAX);
    }
    match cd_at64.checked_add(cd_size64) {
        Some(end) if end <= size => Ok(Some((cd_at64, cd_size64))),
        _ => Ok(None),
    }
}

/// The central directory's entries, each with its span; `None` when it does not parse.
fn entries(cd: &[u8], cd_at: u64) -> Option<Vec<Entry>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cd.len() {
        if !cd[i..].starts_with(b"PK\x01\x02") {
            return None;
        }
        let flags = u16_at(cd, i + 8)?;
        let method = u16_at(cd, i + 10)?;
        let crc = u32_at(cd, i + 16)?;
        let mut csize = u32_at(cd, i + 20)? as u64;
        let mut size = u32_at(cd, i + 24)? as u64;
        let (n, e, c) = (
            u16_at(cd, i + 28)? as usize,
            u16_at(cd, i + 30)? as usize,
            u16_at(cd, i + 32)? as usize,
        );
        let mut header = u32_at(cd, i + 42)? as u64;
        let name = String::from_utf8(cd.get(i + 46..i + 46 + n)?.to_vec()).ok()?;
        // The zip64 extra field holds, in this order, the 64-bit values of the fields
        // whose 32-bit slot says 0xFFFFFFFF (APPNOTE 4.5.3).
        let extra = cd.get(i + 46 + n..i + 46 + n + e)?;
        let mut j = 0;
        while j + 4 <= extra.len() {
            let (id, len) = (u16_at(extra, j)?, u16_at(extra, j + 2)? as usize);
            if id == 1 {
                let mut k = j + 4;
                for f in [&mut size, &mut csize, &mut header] {
                    if *f == u32::MAX as u64 {
                        *f = u64_at(extra, k)?;
                        k += 8;
                    }
                }
            }
            j += 4 + len;
        }
        out.push(Entry {
            name,
            header,
            size,
            csize,
            crc,
            method,
            flags,
            span: 0..0,
        });
        i += 46 + n + e + c;
    }
    let mut starts: Vec<u64> = out.iter().map(|e| e.header).collect();
    starts.sort_unstable();
    for e in &mut out {
        let k = starts.partition_point(|&s| s <= e.header);
        e.span = e.header..starts.get(k).copied().unwrap_or(cd_at);
    }
    Some(out)
}

/// A fetched buffer and where a member's data starts in it.
type Located = (Arc<Vec<u8>>, usize);

/// A member's data `(buffer, start)` in its fetched span, CRC-checked; `None` when the span
/// does not look as torch writes it (the whole-object read then says why).
fn member(pieces: &mut Pieces, e: &Entry) -> Option<Result<Located, FormatError>> {
    if e.method != 0 || e.flags & 1 != 0 || e.size != e.csize {
        return None;
    }
    let (buf, off) = pieces.get(&e.span)?;
    let local = &buf[off..off + (e.span.end - e.span.start) as usize];
    if !local.starts_with(b"PK\x03\x04") {
        return None;
    }
    let start = 30 + u16_at(local, 26)? as usize + u16_at(local, 28)? as usize;
    let end = start.checked_add(usize::try_from(e.size).ok()?)?;
    let data = local.get(start..end)?;
    Some(super::check_crc(&e.name, e.crc, crc32fast::hash(data)).map(|()| (buf, off + start)))
}

/// The storage keys the tensors anywhere in `v` use.
fn storage_keys(v: &Value, out: &mut HashSet<String>) {
    match v {
        Value::Tensor(t) => {
            if let Some(k) = t.storage_key() {
                out.insert(k.to_string());
            }
        }
        Value::List(xs) | Value::Tuple(xs) => xs.iter().for_each(|x| storage_keys(x, out)),
        Value::Dict(items) => items.iter().for_each(|(k, x)| {
            storage_keys(k, out);
            storage_keys(x, out);
        }),
        _ => {}
    }
}

/// Whether `k` is one of `keys` (a root dict key given as a string).
fn wanted(k: &Value, keys: &[&str]) -> bool {
    matches!(k, Value::Str(s) if keys.contains(&s.as_str()))
}

/// Read the `.pt` object `path` with ranged GETs (see the module). With `keys`, a root
/// dict keeps only those keys and only their storages are fetched (a root that is not a
/// dict is read whole).
pub fn read_pt_remote(path: &Path, keys: Option<&[&str]>) -> Result<Value> {
    let cell = pieces_of(path);
    let mut pieces = cell.lock().unwrap_or_else(|p| p.into_inner());
    match ranged(path, &mut pieces, keys)? {
        Some(v) => Ok(v),
        None => {
            drop(pieces);
            let buf = crate::formats::open_input(path)?;
            let v = super::read_pt_bytes(buf).map_err(|e| e.in_file(path))?;
            Ok(match keys {
                Some(keys) => only(v, keys),
                None => v,
            })
        }
    }
}

/// A root dict cut down to `keys`; any other value as it is.
pub(crate) fn only(v: Value, keys: &[&str]) -> Value {
    match v {
        Value::Dict(items) => {
            Value::Dict(items.into_iter().filter(|(k, _)| wanted(k, keys)).collect())
        }
        other => other,
    }
}

/// The ranged read; `Ok(None)` when the object is to be read whole instead.
fn ranged(path: &Path, pieces: &mut Pieces, keys: Option<&[&str]>) -> Result<Option<Value>> {
    // The object's size and tail: from the pieces of an earlier read, or one suffix GET.
    let size = match pieces.0.iter().map(|(at, b)| at + b.len() as u64).max() {
        Some(end) => end,
        None => {
            // An empty object refuses a suffix range (416): the whole read says "empty";
            // a missing one or refused credentials fail there again, naming the URL.
            let Ok((tail, size)) = source::read_tail(path, TAIL) else {
                return Ok(None);
            };
            pieces.0.push((size - tail.len() as u64, Arc::new(tail)));
            size
        }
    };
    let tail_at = size.saturating_sub(TAIL);
    let Some((cd_at, cd_size)) = directory(path, pieces, tail_at, size)? else {
        return Ok(None);
    };
    fetch(
        path,
        pieces,
        std::slice::from_ref(&(cd_at..cd_at + cd_size)),
    )?;
    let Some((cd, o)) = pieces.get(&(cd_at..cd_at + cd_size)) else {
        return Ok(None);
    };
    let Some(list) = entries(&cd[o..o + cd_size as usize], cd_at) else {
        return Ok(None);
    };
    let by_name: HashMap<&str, &Entry> = list.iter().map(|e| (e.name.as_str(), e)).collect();
    let pkls: Vec<&Entry> = list
        .iter()
        .filter(|e| {
            e.name
                .strip_suffix("data.pkl")
                .is_some_and(|p| p.is_empty() || (p.ends_with('/') && p.matches('/').count() == 1))
        })
        .collect();
    let [pkl] = pkls.as_slice() else {
        return Ok(None); // no or several data.pkl: the whole read says so
    };
    let prefix = &pkl.name[..pkl.name.len() - "data.pkl".len()];
    let order = by_name.get(format!("{prefix}byteorder").as_str()).copied();
    let first: Vec<Range<u64>> = [Some(*pkl), order]
        .iter()
        .flatten()
        .map(|e| e.span.clone())
        .collect();
    fetch(path, pieces, &first)?;
    let in_file = |e: FormatError| e.in_file(path);
    let Some(pkl_at) = member(pieces, pkl) else {
        return Ok(None);
    };
    let (pkl_buf, pkl_start) = pkl_at.map_err(in_file)?;
    let pkl_data = &pkl_buf[pkl_start..pkl_start + pkl.size as usize];
    let big_endian = match order {
        None => false,
        Some(e) => {
            let Some(at) = member(pieces, e) else {
                return Ok(None);
            };
            let (b, s) = at.map_err(in_file)?;
            match b[s..s + e.size as usize].trim_ascii() {
                b"little" => false,
                b"big" => true,
                _ => return Ok(None),
            }
        }
    };
    let storage = |key: &str| by_name.get(format!("{prefix}data/{key}").as_str()).copied();
    let claim = |req: &StorageRequest<'_>, len: u64| -> Result<usize, String> {
        let name = format!("{prefix}data/{}", req.key);
        req.numel
            .checked_mul(req.dtype.size() as u64)
            .filter(|&n| n <= len)
            .map(|n| n as usize)
            .ok_or_else(|| {
                format!(
                    "storage member {name} holds {len} bytes but the pickle claims {} {} \
                     elements",
                    req.numel, req.dtype
                )
            })
    };
    // Pass 1, on the pickle alone: which storages does the value (or the keys asked) use?
    // Storages are zero-filled stand-ins here (allocated zeroed, so never resident).
    let mut asked: Vec<String> = Vec::new();
    let mut stand_in = |req: &StorageRequest<'_>| -> Result<Bytes, String> {
        let e = storage(req.key)
            .ok_or_else(|| format!("member {prefix}data/{} is missing", req.key))?;
        let need = claim(req, e.size)?;
        asked.push(req.key.to_string());
        Ok(Bytes::from_vec(vec![0u8; need]))
    };
    let first_pass = pickle::unpickle_each(pkl_data, &pkl.name, &mut stand_in, &mut |_| {}, None);
    let needed: HashSet<String> = match (&first_pass, keys) {
        (Ok((Value::Dict(items), _)), Some(keys)) => {
            let mut out = HashSet::new();
            for (_, v) in items.iter().filter(|(k, _)| wanted(k, keys)) {
                storage_keys(v, &mut out);
            }
            out
        }
        _ => asked.iter().cloned().collect(),
    };
    drop(first_pass);
    let mut spans = Vec::new();
    for key in &needed {
        match storage(key) {
            Some(e) => spans.push(e.span.clone()),
            None => return Ok(None),
        }
    }
    fetch(path, pieces, &spans)?;
    // Pass 2: the value, each needed storage a window of its fetched span, CRC-checked.
    let mut loaded: HashMap<String, Bytes> = HashMap::new();
    let mut fallback = false;
    let mut load = |req: &StorageRequest<'_>| -> Result<Bytes, String> {
        if let Some(b) = loaded.get(req.key) {
            return Ok(b.clone());
        }
        let name = format!("{prefix}data/{}", req.key);
        let e = storage(req.key).ok_or_else(|| format!("member {name} is missing"))?;
        let need = claim(req, e.size)?;
        if !needed.contains(req.key) {
            return Ok(Bytes::from_vec(vec![0u8; need])); // a key not asked for: dropped below
        }
        let Some(at) = member(pieces, e) else {
            fallback = true;
            return Err("read whole".into());
        };
        let (buf, start) = at.map_err(|e| e.msg)?;
        let buf: Arc<dyn AsRef<[u8]> + Send + Sync> = buf;
        let mut b = Bytes::window(buf, start, need)
            .ok_or_else(|| format!("storage member {name} reaches past the end of the file"))?;
        if big_endian && req.dtype.size() > 1 && !req.dtype.is_raw() {
            b = Bytes::from_vec(Tensor::byteswapped_storage(b.as_slice(), req.dtype));
        }
        loaded.insert(req.key.to_string(), b.clone());
        Ok(b)
    };
    let read = pickle::unpickle_each(pkl_data, &pkl.name, &mut load, &mut |_| {}, None);
    if fallback {
        return Ok(None);
    }
    let v = read.map_err(in_file)?.0;
    Ok(Some(match keys {
        Some(keys) => only(v, keys),
        None => v,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_tell_what_is_missing_and_gather_across_pieces() {
        let mut p = Pieces(vec![
            (10, Arc::new(vec![1; 10])),
            (25, Arc::new(vec![2; 5])),
        ]);
        assert_eq!(p.missing(&(0..40)), vec![0..10, 20..25, 30..40]);
        assert_eq!(p.missing(&(12..18)), Vec::<Range<u64>>::new());
        assert!(p.get(&(15..27)).is_none()); // 20..25 was never fetched
        p.0.push((20, Arc::new(vec![3; 5])));
        let (b, o) = p.get(&(18..27)).unwrap();
        assert_eq!(&b[o..o + 9], &[1, 1, 3, 3, 3, 3, 3, 2, 2]);
    }
}
