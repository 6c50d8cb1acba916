//! `.npy` and `.npz` files as numpy writes them (`np.save`, `np.savez`,
//! `np.savez_compressed`).
//!
//! The header is a Python dict literal (`{'descr': '<f4', 'fortran_order': False,
//! 'shape': (3, 4), }`) parsed by a small literal parser here: nothing is ever unpickled,
//! so object arrays (`|O`) are refused. `.npy` payloads are memory-mapped and viewed in
//! place (Fortran order is a strided view); big-endian payloads are byte-swapped into a copy.
//! `.npz` members are decompressed (STORED or DEFLATE) into memory.

use std::io::{Read, Seek};
use std::path::Path;
use std::sync::Arc;

use crate::error::{FormatError, Position, Result};
use crate::tensor::{contiguous_strides, Bytes, DType, Tensor};
use crate::value::Value;

/// The magic string every `.npy` starts with.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Read a `.npy` file into a tensor (no copy unless the payload is big-endian).
pub fn read_npy(path: &Path) -> Result<Value> {
    let map = crate::formats::open_input(path)?;
    read_npy_bytes(map).map_err(|e| e.in_file(path))
}

/// Same, from bytes in memory (for fuzzing and tests); errors carry no file name.
pub fn read_npy_bytes(buf: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Result<Value, FormatError> {
    Ok(Value::Tensor(npy_tensor(buf, 0)?))
}

/// Read a `.npz` file into a dict of member name (without `.npy`) → tensor, in archive order.
pub fn read_npz(path: &Path) -> Result<Value> {
    let buf = crate::formats::open_input(path)?;
    read_npz_bytes((*buf).as_ref()).map_err(|e| e.in_file(path))
}

/// Same, from bytes in memory (for fuzzing and tests); errors carry no file name.
pub fn read_npz_bytes(bytes: &[u8]) -> Result<Value, FormatError> {
    npz_from(std::io::Cursor::new(bytes), bytes.len() as u64)
}

/// The members of the `.npz` archive read from `reader` (`file_len` bytes long).
fn npz_from<R: Read + Seek>(reader: R, file_len: u64) -> Result<Value, FormatError> {
    if file_len == 0 {
        return Err(FormatError::new(Position::File, "empty file"));
    }
    let mut archive = ::zip::ZipArchive::new(reader)
        .map_err(|e| FormatError::new(Position::File, format!("not a zip archive (.npz): {e}")))?;
    let mut items = Vec::with_capacity(archive.len());
    for i in 0..archive.len() {
        let mut member = archive.by_index(i).map_err(|e| {
            FormatError::new(
                Position::Member(format!("#{i}")),
                format!("unreadable zip member: {e}"),
            )
        })?;
        let name = String::from_utf8_lossy(member.name_raw()).into_owned();
        if member.is_dir() {
            continue;
        }
        let at = |msg: String| FormatError::new(Position::Member(name.clone()), msg);
        let size = member.size();
        // The declared size is checked against what decompression actually yields, and a
        // DEFLATE member cannot expand beyond ~1032:1, so this bounds the allocation.
        let bound = file_len.saturating_mul(1032);
        if size > bound {
            return Err(at(format!(
                "declares {size} uncompressed bytes, impossible for a {file_len}-byte archive"
            )));
        }
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 30));
        (&mut member)
            .take(size.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| at(format!("cannot decompress: {e}")))?;
        if data.len() as u64 != size {
            return Err(at(format!(
                "decompressed to {} bytes but the archive declares {size}",
                data.len()
            )));
        }
        let buf: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(data);
        let tensor = npy_tensor(buf, 0).map_err(|e| {
            let pos = match e.pos {
                Position::Byte(b) => format!("{name}, byte {b}"),
                other => format!("{name}, {other}"),
            };
            FormatError::new(Position::Member(pos), e.msg)
        })?;
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        items.push((Value::Str(key), Value::Tensor(tensor)));
    }
    Ok(Value::Dict(items))
}

/// The parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    dtype: DType,
    big_endian: bool,
    fortran_order: bool,
    shape: Vec<usize>,
    /// Offset of the payload from the start of the `.npy` bytes.
    data_start: usize,
}

/// Decode the `.npy` held in `buf` (starting at `base`, for error positions) into a tensor.
fn npy_tensor(buf: Arc<dyn AsRef<[u8]> + Send + Sync>, base: u64) -> Result<Tensor, FormatError> {
    let bytes: &[u8] = (*buf).as_ref();
    let h = parse_header(bytes, base)?;
    let at_data = Position::Byte(base + h.data_start as u64);
    let numel = h.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let needed = numel.and_then(|n| n.checked_mul(h.dtype.size()));
    let available = bytes.len() - h.data_start;
    let needed = match needed {
        Some(n) if n <= available => n,
        _ => {
            return Err(FormatError::new(
                at_data,
                format!(
                    "shape {:?} of {} needs {} bytes but only {available} follow the header",
                    h.shape,
                    h.dtype,
                    needed.map_or("more than 2^64".to_string(), |n| n.to_string()),
                ),
            ))
        }
    };
    let storage = if h.big_endian && h.dtype.size() > 1 {
        let window = &bytes[h.data_start..h.data_start + needed];
        Bytes::from_vec(Tensor::byteswapped_storage(window, h.dtype))
    } else {
        let window = Bytes::window(buf.clone(), h.data_start, needed);
        // `needed <= available` was checked above, so the window fits.
        window.ok_or_else(|| FormatError::new(at_data.clone(), "payload window out of range"))?
    };
    let strides = if h.fortran_order {
        fortran_strides(&h.shape)
    } else {
        contiguous_strides(&h.shape)
    };
    Tensor::from_parts(h.dtype, h.shape, strides, 0, storage, None)
        .map_err(|e| FormatError::new(at_data, e.to_string()))
}

/// Column-major (Fortran) strides for `shape`, in elements.
fn fortran_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = Vec::with_capacity(shape.len());
    let mut acc = 1usize;
    for &d in shape {
        strides.push(acc);
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// Parse the magic, version, header length and header dict of a `.npy`.
fn parse_header(b: &[u8], base: u64) -> Result<Header, FormatError> {
    let at = |off: usize| Position::Byte(base + off as u64);
    if b.len() < 10 || &b[..6] != MAGIC {
        let msg = if b.len() >= 6 && &b[..6] == MAGIC {
            "truncated .npy preamble".to_string()
        } else {
            "not a .npy file: missing the \\x93NUMPY magic".to_string()
        };
        return Err(FormatError::new(at(0), msg));
    }
    let (major, minor) = (b[6], b[7]);
    let (len, start) = match major {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10usize),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        2 | 3 => return Err(FormatError::new(at(8), "truncated .npy preamble")),
        _ => {
            return Err(FormatError::new(
                at(6),
                format!("unsupported .npy format version {major}.{minor}"),
            ))
        }
    };
    let end = start
        .checked_add(len)
        .filter(|&e| e <= b.len())
        .ok_or_else(|| {
            FormatError::new(
                at(8),
                format!(
                    "header length {len} reaches past the end of the data ({} bytes)",
                    b.len()
                ),
            )
        })?;
    let raw = &b[start..end];
    // v1/v2 headers are latin-1, v3 UTF-8; every valid dict literal is ASCII either way.
    let text: String = if major == 3 {
        std::str::from_utf8(raw)
            .map_err(|e| FormatError::new(at(start + e.valid_up_to()), "header is not UTF-8"))?
            .to_string()
    } else {
        raw.iter().map(|&c| c as char).collect()
    };
    let dict = DictParser {
        s: text.as_bytes(),
        i: 0,
        base: base + start as u64,
    }
    .parse()?;
    let field = |k: &str| dict.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let missing = |k: &str| FormatError::new(at(start), format!("header has no '{k}' key"));
    let descr = match field("descr").ok_or_else(|| missing("descr"))? {
        Lit::Str(s) => s.clone(),
        other => {
            return Err(FormatError::new(
                at(start),
                format!("structured dtype {other:?} is not supported (only plain numeric arrays)"),
            ))
        }
    };
    let fortran_order = match field("fortran_order").ok_or_else(|| missing("fortran_order"))? {
        Lit::Bool(v) => *v,
        other => {
            return Err(FormatError::new(
                at(start),
                format!("'fortran_order' must be True or False, not {other:?}"),
            ))
        }
    };
    let shape = match field("shape").ok_or_else(|| missing("shape"))? {
        Lit::Tuple(v) => v.clone(),
        other => {
            return Err(FormatError::new(
                at(start),
                format!("'shape' must be a tuple of ints, not {other:?}"),
            ))
        }
    };
    let (dtype, big_endian) = parse_descr(&descr).ok_or_else(|| {
        FormatError::new(
            at(start),
            format!(
                "unsupported dtype '{descr}': only f8 f4 f2 i8 i4 i2 i1 u1 b1 arrays are read \
                 (object, string, unicode and structured arrays are refused, never unpickled)"
            ),
        )
    })?;
    Ok(Header {
        dtype,
        big_endian,
        fortran_order,
        shape,
        data_start: end,
    })
}

/// Map a numpy `descr` (`'<f4'`, `'|b1'`, `'>i8'`) to a dtype and whether it is big-endian.
fn parse_descr(descr: &str) -> Option<(DType, bool)> {
    let (order, code) = match descr.as_bytes().first()? {
        b'<' | b'>' | b'|' | b'=' => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'=', descr),
    };
    let dtype = match code {
        "f8" => DType::F64,
        "f4" => DType::F32,
        "f2" => DType::F16,
        "i8" => DType::I64,
        "i4" => DType::I32,
        "i2" => DType::I16,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "b1" | "?" => DType::Bool,
        _ => return None,
    };
    // '=' is native order; every platform we build for is little-endian.
    let big = order == b'>' && dtype.size() > 1;
    if order == b'|' && dtype.size() > 1 {
        return None;
    }
    Some((dtype, big))
}

/// A value in the header dict literal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lit {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    /// Anything else (a list-valued structured `descr`, a number…), kept as its text.
    Other(String),
}

/// A parser for the Python dict literal numpy writes as the `.npy` header.
struct DictParser<'a> {
    s: &'a [u8],
    i: usize,
    /// File offset of `s[0]`, for error positions.
    base: u64,
}

impl DictParser<'_> {
    fn err(&self, msg: impl Into<String>) -> FormatError {
        FormatError::new(
            Position::Byte(self.base + self.i as u64),
            format!("malformed .npy header: {}", msg.into()),
        )
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn parse(mut self) -> Result<Vec<(String, Lit)>, FormatError> {
        if !self.eat(b'{') {
            return Err(self.err("expected '{'"));
        }
        let mut out = Vec::new();
        loop {
            if self.eat(b'}') {
                return Ok(out);
            }
            self.ws();
            let key = self.string()?;
            if !self.eat(b':') {
                return Err(self.err("expected ':' after a key"));
            }
            let value = self.value()?;
            out.push((key, value));
            if !self.eat(b',') {
                if self.eat(b'}') {
                    return Ok(out);
                }
                return Err(self.err("expected ',' or '}'"));
            }
        }
    }

    fn string(&mut self) -> Result<String, FormatError> {
        let q = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(self.err("expected a quoted string")),
        };
        self.i += 1;
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i] != q {
            if self.s[self.i] == b'\\' {
                return Err(self.err("escapes in header strings are not supported"));
            }
            self.i += 1;
        }
        if self.i >= self.s.len() {
            return Err(self.err("unterminated string"));
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.i += 1;
        Ok(text)
    }

    fn value(&mut self) -> Result<Lit, FormatError> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'\'' | b'"') => Ok(Lit::Str(self.string()?)),
            Some(b'(') => {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    if self.eat(b')') {
                        return Ok(Lit::Tuple(dims));
                    }
                    self.ws();
                    let start = self.i;
                    while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                        self.i += 1;
                    }
                    // Python 2 era headers may write `3L`.
                    let digits = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                    if self.s.get(self.i) == Some(&b'L') {
                        self.i += 1;
                    }
                    let d: usize = digits.parse().map_err(|_| {
                        self.i = start;
                        self.err("shape entries must be non-negative integers that fit in usize")
                    })?;
                    dims.push(d);
                    if !self.eat(b',') {
                        if self.eat(b')') {
                            return Ok(Lit::Tuple(dims));
                        }
                        return Err(self.err("expected ',' or ')' in the shape"));
                    }
                }
            }
            _ => {
                // True/False, or an unsupported value kept as text up to the next key.
                let start = self.i;
                let mut depth = 0i32;
                while self.i < self.s.len() {
                    match self.s[self.i] {
                        b'[' | b'(' | b'{' => depth += 1,
                        b']' | b')' => depth -= 1,
                        b'}' if depth == 0 => break,
                        b'}' => depth -= 1,
                        b',' if depth == 0 => break,
                        _ => {}
                    }
                    self.i += 1;
                }
                let text = String::from_utf8_lossy(&self.s[start..self.i])
                    .trim()
                    .to_string();
                Ok(match text.as_str() {
                    "True" => Lit::Bool(true),
                    "False" => Lit::Bool(false),
                    "" => return Err(self.err("expected a value")),
                    _ => Lit::Other(text),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(text: &str) -> Result<Header, FormatError> {
        let mut b = MAGIC.to_vec();
        b.extend([1, 0]);
        b.extend((text.len() as u16).to_le_bytes());
        b.extend(text.as_bytes());
        parse_header(&b, 0)
    }

    #[test]
    fn header_dict_literal() {
        let text = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }  \n";
        let h = header(text).unwrap();
        assert_eq!(h.dtype, DType::F32);
        assert!(!h.big_endian && !h.fortran_order);
        assert_eq!(h.shape, vec![3, 4]);
        assert_eq!(h.data_start, 10 + text.len());
        let h = header("{'descr': '>i8', 'fortran_order': True, 'shape': (5,), }").unwrap();
        assert!(h.big_endian && h.fortran_order);
        assert_eq!(h.shape, vec![5]);
        let h = header("{'descr': '|b1', 'fortran_order': False, 'shape': (), }").unwrap();
        assert_eq!((h.dtype, h.shape.len()), (DType::Bool, 0));
    }

    #[test]
    fn refused_headers_say_why() {
        let e = header("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }").unwrap_err();
        assert!(e.msg.contains("'|O'"), "{}", e.msg);
        let e = header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }")
            .unwrap_err();
        assert!(e.msg.contains("structured"), "{}", e.msg);
        let e = header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }").unwrap_err();
        // The `-` is at index 51 of the header, which starts at byte 10.
        assert_eq!(e.pos, Position::Byte(10 + 51));
        let e = header("{'descr': '<f4', 'shape': (2,), }").unwrap_err();
        assert!(e.msg.contains("fortran_order"), "{}", e.msg);
        let e = header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)").unwrap_err();
        assert!(e.msg.contains("malformed"), "{}", e.msg);
    }

    #[test]
    fn fortran_strides_are_column_major() {
        assert_eq!(fortran_strides(&[2, 3, 4]), vec![1, 2, 6]);
        assert_eq!(fortran_strides(&[]), Vec::<usize>::new());
    }
}
