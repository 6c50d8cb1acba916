//! `.safetensors` files: an 8-byte little-endian header length, a JSON header
//! (`name → {dtype, shape, data_offsets}` plus an optional `__metadata__` of str → str),
//! then the payload. The file is memory-mapped and every tensor is a window of the map
//! (no copy). Validation is the `safetensors` crate's; positions and names are ours.

use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};

use crate::error::{FormatError, Position, Result};
use crate::tensor::{contiguous_strides, Bytes, DType, Tensor};
use crate::value::Value;

/// Bytes of the little-endian u64 header length.
const N_LEN: usize = 8;

/// Read a `.safetensors` file into a dict of name → tensor, in the order of the JSON
/// header (for files written by the safetensors library that is also data-offset order),
/// plus `"__metadata__"` → dict of str → str (header order) at its place in the header
/// (first, in files the safetensors library writes) when present.
pub fn read_safetensors(path: &Path) -> Result<Value> {
    let map = crate::formats::open_input(path)?;
    read_safetensors_bytes(map).map_err(|e| e.in_file(path))
}

/// [`read_safetensors`] keeping only the tensors named in `keys` (and `__metadata__`).
/// Locally the same as reading it all (the map faults in only what is read); from object
/// storage the 8-byte length and the header are fetched first (one GET of [`HEAD`] bytes
/// holds both for most files), then only those tensors' byte ranges, adjacent ones in one
/// GET. The unfetched payload is zeros in the buffer the reader validates and is dropped.
pub fn read_safetensors_keys(path: &Path, keys: &[&str]) -> Result<Value> {
    let keep = |v: Value| {
        match v {
        Value::Dict(items) => Value::Dict(
            items
                .into_iter()
                .filter(|(k, _)| {
                    matches!(k, Value::Str(s) if s == "__metadata__" || keys.contains(&s.as_str()))
                })
                .collect(),
        ),
        other => other,
    }
    };
    if crate::formats::source::is_remote(path) {
        if let Ok(Some(buf)) = ranged(path, keys) {
            return read_safetensors_bytes(Arc::new(buf))
                .map(keep)
                .map_err(|e| e.in_file(path));
        }
    }
    read_safetensors(path).map(keep)
}

/// Bytes first fetched from a `.safetensors` object: the length and, usually, the header.
pub const HEAD: u64 = 64 << 10;

/// The object `path` as a buffer of its size holding the length, the header and the data of
/// the tensors `keys`, the rest zeros; `None` (read it whole) when the header does not parse.
fn ranged(path: &Path, keys: &[&str]) -> Result<Option<Vec<u8>>> {
    use crate::formats::source;
    let (head, size) = source::read_head(path, HEAD)?;
    let Some(n) = head
        .get(..N_LEN)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    else {
        return Ok(None);
    };
    let Some(data_start) = n.checked_add(N_LEN as u64).filter(|&d| d <= size) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; size as usize]; // allocated zeroed: unfetched pages never touched
    buf[..head.len()].copy_from_slice(&head);
    let mut want = Vec::new();
    if data_start > head.len() as u64 {
        want.push(head.len() as u64..data_start);
    }
    let fetch = |want: &mut Vec<std::ops::Range<u64>>, buf: &mut Vec<u8>| -> Result<()> {
        want.sort_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<u64>> = Vec::new();
        for r in want.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        for (r, b) in merged.iter().zip(source::read_ranges(path, &merged)?) {
            let at = r.start as usize;
            buf[at..at + b.len()].copy_from_slice(&b);
        }
        Ok(())
    };
    fetch(&mut want, &mut buf)?;
    let Ok(text) = std::str::from_utf8(&buf[N_LEN..data_start as usize]) else {
        return Ok(None);
    };
    let Ok(header) = crate::json::parse_value(text) else {
        return Ok(None);
    };
    let Some(entries) = header.as_dict() else {
        return Ok(None);
    };
    for (key, meta) in entries {
        let wanted = key.as_str().is_some_and(|k| keys.contains(&k));
        let offsets = meta.get("data_offsets").and_then(Value::as_seq);
        if let (true, Some([b, e])) = (wanted, offsets) {
            let (Some(b), Some(e)) = (b.as_i64(), e.as_i64()) else {
                return Ok(None);
            };
            let r = (data_start + b as u64)..(data_start + e as u64);
            if b < 0 || e < b || r.end > size {
                return Ok(None);
            }
            // Within the bytes fetched first already: nothing more to fetch.
            if r.end > head.len() as u64 {
                want.push(r.start.max(head.len() as u64)..r.end);
            }
        }
    }
    fetch(&mut want, &mut buf)?;
    Ok(Some(buf))
}

/// Same, from bytes in memory (for fuzzing and tests); errors carry no file name.
pub fn read_safetensors_bytes(
    map: Arc<dyn AsRef<[u8]> + Send + Sync>,
) -> Result<Value, FormatError> {
    let bytes: &[u8] = (*map).as_ref();
    let fail = |pos: Position, msg: String| FormatError::new(pos, msg);
    if bytes.len() < N_LEN {
        return Err(fail(
            Position::Byte(0),
            format!(
                "file of {} bytes is too short for the 8-byte header length",
                bytes.len()
            ),
        ));
    }
    let mut len8 = [0u8; N_LEN];
    len8.copy_from_slice(&bytes[..N_LEN]);
    let header_len = u64::from_le_bytes(len8);
    if header_len > (bytes.len() - N_LEN) as u64 {
        return Err(fail(
            Position::Byte(0),
            format!(
                "header length {header_len} reaches past the end of the file ({} bytes): \
                 truncated file or not a .safetensors",
                bytes.len()
            ),
        ));
    }
    // Checked just above: header_len <= bytes.len() - 8, so it fits in usize.
    let n = header_len as usize;
    let data_start = N_LEN + n;
    let header_bytes = &bytes[N_LEN..data_start];
    let header_text = std::str::from_utf8(header_bytes).map_err(|e| {
        fail(
            Position::Byte((N_LEN + e.valid_up_to()) as u64),
            "header is not UTF-8: truncated file or not a .safetensors".to_string(),
        )
    })?;
    // Our own order-preserving parse first: it keeps the header order and names positions.
    let header = crate::json::parse_value(header_text).map_err(|e| {
        let pos = match e.pos {
            Position::LineColumn(l, c) => header_byte(header_bytes, l as usize, c as usize),
            _ => N_LEN as u64,
        };
        fail(Position::Byte(pos), format!("header: {}", e.msg))
    })?;
    let entries = header.as_dict().ok_or_else(|| {
        fail(
            Position::Byte(N_LEN as u64),
            "header is not a JSON object".to_string(),
        )
    })?;
    let payload_len = bytes.len() - data_start;
    for (key, meta) in entries {
        let offsets = meta.get("data_offsets").and_then(Value::as_seq);
        let (Some(name), Some([b, e])) = (key.as_str(), offsets) else {
            continue;
        };
        if let (Some(b), Some(e)) = (b.as_i64(), e.as_i64()) {
            if b < 0 || e < b || e as u64 > payload_len as u64 {
                return Err(fail(
                    Position::Byte(N_LEN as u64),
                    format!(
                        "tensor '{name}' has data_offsets [{b}, {e}] outside the \
                         {payload_len}-byte payload (truncated file or forged header)"
                    ),
                ));
            }
        }
    }
    let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(|e| st_error(bytes, n, e))?;

    let buf = map.clone();
    let mut items = Vec::with_capacity(entries.len());
    for (key, meta) in entries {
        let Some(name) = key.as_str() else { continue };
        if name == "__metadata__" {
            let pairs = meta
                .as_dict()
                .unwrap_or(&[])
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::Str(s) => Value::Str(s.clone()),
                        other => Value::Str(format!("{other:?}")),
                    };
                    (k.clone(), v)
                })
                .collect();
            items.push((Value::Str(name.to_string()), Value::Dict(pairs)));
            continue;
        }
        let info = metadata.info(name).ok_or_else(|| {
            fail(
                Position::Byte(N_LEN as u64),
                format!("tensor '{name}' is missing from the validated header"),
            )
        })?;
        let (begin, end) = info.data_offsets;
        let at = Position::Byte((data_start + begin) as u64);
        let dtype = map_dtype(info.dtype).ok_or_else(|| {
            fail(
                Position::Byte(N_LEN as u64),
                format!(
                    "tensor '{name}' has dtype {:?}, which is not supported \
                     (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL are)",
                    info.dtype
                ),
            )
        })?;
        let window =
            Bytes::window(buf.clone(), data_start + begin, end - begin).ok_or_else(|| {
                fail(
                    at.clone(),
                    format!("tensor '{name}' data [{begin}, {end}) lies outside the file"),
                )
            })?;
        let shape = info.shape.clone();
        let strides = contiguous_strides(&shape);
        let tensor = Tensor::from_parts(dtype, shape, strides, 0, window, Some(name.to_string()))
            .map_err(|e| fail(at, format!("tensor '{name}': {e}")))?;
        items.push((Value::Str(name.to_string()), Value::Tensor(tensor)));
    }
    Ok(Value::Dict(items))
}

/// Our dtype for a safetensors dtype; `None` for the ones RL dumps never hold (fp8, u16…).
fn map_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F64 => DType::F64,
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I16 => DType::I16,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// A safetensors validation error with the position it concerns.
fn st_error(bytes: &[u8], n: usize, e: SafeTensorError) -> FormatError {
    let header = Position::Byte(N_LEN as u64);
    let (pos, msg) = match &e {
        SafeTensorError::InvalidHeaderDeserialization(je) | SafeTensorError::JsonError(je) => {
            let pos = header_byte(&bytes[N_LEN..N_LEN + n], je.line(), je.column());
            (Position::Byte(pos), format!("invalid JSON header: {je}"))
        }
        SafeTensorError::InvalidHeader(u) => (
            Position::Byte((N_LEN + u.valid_up_to()) as u64),
            "header is not UTF-8".to_string(),
        ),
        SafeTensorError::HeaderTooLarge | SafeTensorError::InvalidHeaderLength => {
            (Position::Byte(0), format!("bad header length: {e}"))
        }
        SafeTensorError::MetadataIncompleteBuffer => (
            Position::Byte((N_LEN + n) as u64),
            format!(
                "the header's data offsets do not cover exactly the {} payload bytes after the \
                 header (offsets past the end, or a truncated file)",
                bytes.len() - N_LEN - n
            ),
        ),
        _ => (header, e.to_string()),
    };
    FormatError::new(pos, msg)
}

/// File offset of 1-based (line, column) in the header text.
fn header_byte(header: &[u8], line: usize, column: usize) -> u64 {
    let mut off = 0usize;
    for _ in 1..line {
        match header[off..].iter().position(|&c| c == b'\n') {
            Some(p) => off += p + 1,
            None => break,
        }
    }
    (N_LEN + (off + column.saturating_sub(1)).min(header.len())) as u64
}
