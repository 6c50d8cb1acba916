//! Decoding helpers for opcode arguments: long integers, protocol 0 text, numpy scalars.

use half::f16;

use super::{FormatError, Node, Unpickler, MAX_LONG_DIGITS};

pub(super) fn refused_opcode(op: u8) -> String {
    let name = match op {
        b'i' => "INST",
        b'o' => "OBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x92 => "NEWOBJ_EX",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return format!("unknown pickle opcode 0x{op:02x} (not a pickle, or corrupt)"),
    };
    format!("refused pickle opcode {name}: not used by torch.save for data")
}

/// A little-endian two's complement integer of any length.
pub(super) fn long_from_le(b: &[u8]) -> Node {
    if b.is_empty() {
        return Node::Int(0);
    }
    let neg = b[b.len() - 1] & 0x80 != 0;
    let fill = if neg { 0xff } else { 0 };
    if b.len() <= 8 || b[8..].iter().all(|&x| x == fill) && (b[7] & 0x80 != 0) == neg {
        let mut a = [fill; 8];
        let n = b.len().min(8);
        a[..n].copy_from_slice(&b[..n]);
        return Node::Int(i64::from_le_bytes(a));
    }
    // Magnitude, little-endian: negate two's complement when negative.
    let mut mag: Vec<u8> = b.to_vec();
    if neg {
        let mut carry = true;
        for x in mag.iter_mut() {
            let (v, c) = (!*x).overflowing_add(carry as u8);
            *x = v;
            carry = c;
        }
    }
    // Base 2^32 limbs, most significant first, divided repeatedly by 10^9.
    let mut limbs: Vec<u32> = mag
        .chunks(4)
        .rev()
        .map(|c| {
            let mut a = [0u8; 4];
            a[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(a)
        })
        .collect();
    let mut chunks: Vec<u32> = Vec::new();
    while limbs.iter().any(|&l| l != 0) {
        let mut rem: u64 = 0;
        for l in limbs.iter_mut() {
            let cur = (rem << 32) | *l as u64;
            *l = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        chunks.push(rem as u32);
        let lead = limbs.iter().position(|&l| l != 0).unwrap_or(limbs.len());
        limbs.drain(..lead);
    }
    let mut s = String::with_capacity(chunks.len() * 9 + 1);
    if neg {
        s.push('-');
    }
    for (i, c) in chunks.iter().rev().enumerate() {
        if i == 0 {
            s.push_str(&c.to_string());
        } else {
            s.push_str(&format!("{c:09}"));
        }
    }
    Node::BigInt(s)
}

/// Decode a Python `repr` of a byte string (protocol 0 STRING): quotes and escapes.
pub(super) fn unquote_repr(l: &[u8]) -> Option<Vec<u8>> {
    let l = l.strip_suffix(b"\r").unwrap_or(l);
    if l.len() < 2 || l[0] != l[l.len() - 1] || !matches!(l[0], b'\'' | b'"') {
        return None;
    }
    let body = &l[1..l.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'\\' | b'\'' | b'"' => out.push(e),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\n' => {}
            b'x' => {
                let h = std::str::from_utf8(body.get(i..i + 2)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                for _ in 0..2 {
                    match body.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + (d - b'0') as u32;
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// Decode Python's `raw-unicode-escape` (protocol 0 UNICODE): latin-1 bytes plus
/// `\uXXXX` and `\UXXXXXXXX` escapes.
pub(super) fn raw_unicode_escape(l: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(l.len());
    let mut i = 0;
    while i < l.len() {
        let c = l[i];
        if c == b'\\' && matches!(l.get(i + 1), Some(b'u' | b'U')) {
            let n = if l[i + 1] == b'u' { 4 } else { 8 };
            let h = std::str::from_utf8(l.get(i + 2..i + 2 + n)?).ok()?;
            out.push(char::from_u32(u32::from_str_radix(h, 16).ok()?)?);
            i += 2 + n;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    Some(out)
}

/// `(kind, size, big_endian)` of a numpy dtype string such as `f8`, `<i4`, `b1`.
pub(super) fn parse_numpy_dtype(spec: &str) -> Option<(u8, usize, bool)> {
    let (big, rest) = match spec.as_bytes().first()? {
        b'>' => (true, &spec[1..]),
        b'<' | b'=' | b'|' => (false, &spec[1..]),
        _ => (false, spec),
    };
    let kind = *rest.as_bytes().first()?;
    let size: usize = rest[1..].parse().ok()?;
    let ok = match kind {
        b'f' => matches!(size, 2 | 4 | 8),
        b'i' | b'u' => matches!(size, 1 | 2 | 4 | 8),
        b'b' => size == 1,
        // Object arrays (`|O8`): their data is a list of Python values (verl's `uid`).
        b'O' => size == 8,
        _ => false,
    };
    ok.then_some((kind, size, big))
}

/// The Python number a numpy scalar of `kind` holds in `raw` (its exact size).
pub(super) fn numpy_scalar(kind: u8, raw: &[u8], big: bool) -> Option<Node> {
    let mut b = raw.to_vec();
    if big {
        b.reverse();
    }
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    Some(match (kind, b.len()) {
        (b'b', 1) => Node::Bool(b[0] != 0),
        (b'f', 2) => Node::Float(f16::from_le_bytes([b[0], b[1]]).to_f64()),
        (b'f', 4) => Node::Float(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
        (b'f', 8) => Node::Float(f64::from_le_bytes(a)),
        (b'i', n @ (1 | 2 | 4 | 8)) => {
            if b[n - 1] & 0x80 != 0 {
                a[n..].fill(0xff);
            }
            Node::Int(i64::from_le_bytes(a))
        }
        (b'u', 1 | 2 | 4 | 8) => {
            let v = u64::from_le_bytes(a);
            match i64::try_from(v) {
                Ok(i) => Node::Int(i),
                Err(_) => Node::BigInt(v.to_string()),
            }
        }
        _ => return None,
    })
}

impl Unpickler<'_, '_, '_> {
    /// The decimal argument of INT/LONG as an int node (a big int beyond i64).
    pub(super) fn parse_decimal(&self, s: &str) -> Result<Node, FormatError> {
        let t = s.trim();
        if let Ok(v) = t.parse::<i64>() {
            return Ok(Node::Int(v));
        }
        let (neg, digits) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        if digits.is_empty()
            || digits.len() > MAX_LONG_DIGITS
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(self.err(format!("integer argument {s:?} is not a decimal number")));
        }
        let digits = digits.trim_start_matches('0');
        // i64 parsing failed and the digits are valid, so the value is outside i64.
        Ok(Node::BigInt(if neg {
            format!("-{digits}")
        } else {
            digits.to_string()
        }))
    }
}
