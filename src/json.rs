//! Lenient JSON as Python's `json.dump` writes it: standard JSON plus the bare tokens
//! `NaN`, `Infinity` and `-Infinity` outside strings.
//!
//! serde_json parses straight into [`Value`] (no intermediate tree). When a document holds
//! none of the bare tokens it is parsed in place without a copy. Otherwise a pre-pass
//! rewrites each bare token into a sentinel string of the *same byte length* (so error
//! lines and columns stay right) and the visitor maps those sentinels back to floats; a
//! genuine string that happens to equal a sentinel is recognised by the pre-pass and kept.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::{FormatError, Position};
use crate::value::{Packed, Value};

/// Sentinel for `NaN` (3 bytes, like the token it replaces).
const NAN_SENTINEL: &str = "~";
/// Sentinel for `Infinity` (8 bytes with its quotes).
const INF_SENTINEL: &str = "~~~~~~";
/// Sentinel for `-Infinity` (9 bytes with its quotes).
const NEG_INF_SENTINEL: &str = "~~~~~~~";

/// Parse one JSON document as Python's json.dump writes it: bare NaN, Infinity, -Infinity allowed.
///
/// Objects keep their key order (duplicate keys are all kept, in order), integers that fit
/// in i64 are `Int`, larger non-negative ones up to u64::MAX are `BigInt`; integers outside
/// i64::MIN..=u64::MAX arrive as `Float` (serde_json's limit). Errors carry `Position::LineColumn`
/// (1-based, relative to `text`).
pub fn parse_value(text: &str) -> Result<Value, FormatError> {
    parse_value_as(text, false)
}

/// [`parse_value`], with every non-empty list of only ints, only floats or only bools
/// built as one [`Value::Packed`] array as it is read (a dump's token lists and nested
/// log-prob rows), instead of one `Value` per number.
pub fn parse_value_packed(text: &str) -> Result<Value, FormatError> {
    parse_value_as(text, true)
}

fn parse_value_as(text: &str, pack: bool) -> Result<Value, FormatError> {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return parse_with(text, None, pack);
    }
    match rewrite_nonfinite(text) {
        Some((rewritten, flags)) => parse_with(&rewritten, Some(&flags), pack),
        None => parse_with(text, None, pack),
    }
}

/// Parse `text`; `flags` (when the text was rewritten) says, for each string equal to a
/// sentinel in document order, whether it stands for a bare token (`true`) or is genuine.
fn parse_with(text: &str, flags: Option<&[bool]>, pack: bool) -> Result<Value, FormatError> {
    let counter = Cell::new(0usize);
    let seed = Seed {
        flags,
        counter: &counter,
        pack,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let value = seed.deserialize(&mut de).map_err(to_format_error)?;
    de.end().map_err(to_format_error)?;
    Ok(value)
}

/// A serde_json error as a format error at its line and column.
fn to_format_error(e: serde_json::Error) -> FormatError {
    let msg = e.to_string();
    // serde_json appends " at line L column C"; the position is carried separately.
    let msg = match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    FormatError::new(
        Position::LineColumn(e.line() as u64, e.column() as u64),
        format!("invalid JSON: {msg}"),
    )
}

/// Rewrite bare `NaN`/`Infinity`/`-Infinity` outside strings into same-length sentinel
/// strings. Returns `None` when there is nothing to rewrite (the tokens only occur inside
/// strings), else the new text and the sentinel flags in document order.
fn rewrite_nonfinite(text: &str) -> Option<(String, Vec<bool>)> {
    let b = text.as_bytes();
    // (start, token length, sentinel) of each bare token, and the flags in order.
    let mut edits: Vec<(usize, usize, &'static str)> = Vec::new();
    let mut flags: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let start = i;
                let mut has_escape = false;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        has_escape = true;
                        i += 1;
                    }
                    i += 1;
                }
                let end = i.min(b.len());
                let inner = &text.as_bytes()[start + 1..end];
                if i < b.len() && string_is_sentinel(text, start, end, inner, has_escape) {
                    flags.push(false);
                }
                i += 1;
            }
            b'N' if b[i..].starts_with(b"NaN") => {
                edits.push((i, 3, NAN_SENTINEL));
                flags.push(true);
                i += 3;
            }
            b'I' if b[i..].starts_with(b"Infinity") => {
                edits.push((i, 8, INF_SENTINEL));
                flags.push(true);
                i += 8;
            }
            b'-' if b[i..].starts_with(b"-Infinity") => {
                edits.push((i, 9, NEG_INF_SENTINEL));
                flags.push(true);
                i += 9;
            }
            _ => i += 1,
        }
    }
    if edits.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, len, sentinel) in edits {
        out.push_str(&text[last..start]);
        out.push('"');
        out.push_str(sentinel);
        out.push('"');
        last = start + len;
    }
    out.push_str(&text[last..]);
    Some((out, flags))
}

/// True when the JSON string literal `text[start..=end]` (quotes included) decodes to a
/// sentinel. Only short literals can; escaped ones are decoded to be sure.
fn string_is_sentinel(text: &str, start: usize, end: usize, inner: &[u8], escaped: bool) -> bool {
    if !escaped {
        return is_sentinel_bytes(inner);
    }
    // A `~` takes at most 6 bytes escaped (`\u007e`); sentinels have at most 7 of them.
    if inner.len() > 6 * NEG_INF_SENTINEL.len() {
        return false;
    }
    text.get(start..=end)
        .and_then(|lit| serde_json::from_str::<String>(lit).ok())
        .is_some_and(|s| is_sentinel_bytes(s.as_bytes()))
}

fn is_sentinel_bytes(s: &[u8]) -> bool {
    s == NAN_SENTINEL.as_bytes() || s == INF_SENTINEL.as_bytes() || s == NEG_INF_SENTINEL.as_bytes()
}

/// Deserializes one JSON value into a [`Value`], mapping sentinels back to floats.
#[derive(Clone, Copy)]
struct Seed<'f> {
    flags: Option<&'f [bool]>,
    counter: &'f Cell<usize>,
    /// Build homogeneous lists of numbers as [`Value::Packed`].
    pack: bool,
}

impl Seed<'_> {
    /// The value a decoded string stands for: a float for a rewritten bare token.
    fn string(self, s: &str) -> Option<f64> {
        let flags = self.flags?;
        let x = match s {
            NAN_SENTINEL => f64::NAN,
            INF_SENTINEL => f64::INFINITY,
            NEG_INF_SENTINEL => f64::NEG_INFINITY,
            _ => return None,
        };
        let k = self.counter.get();
        self.counter.set(k + 1);
        // Every sentinel-equal string was flagged by the pre-pass, in document order.
        flags.get(k).copied().unwrap_or(false).then_some(x)
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Value::Int(i),
            Err(_) => Value::BigInt(v.to_string()),
        })
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(match self.string(v) {
            Some(x) => Value::Float(x),
            None => Value::Str(v.to_owned()),
        })
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(match self.string(&v) {
            Some(x) => Value::Float(x),
            None => Value::Str(v),
        })
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.pack {
            return packed_seq(self, seq);
        }
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(self)? {
            items.push(v);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
        while let Some(k) = map.next_key_seed(self)? {
            let v = map.next_value_seed(self)?;
            items.push((k, v));
        }
        Ok(Value::Dict(items))
    }
}

/// A JSON value from a [`Value`] (NaN/inf as strings, as in every report).
pub fn to_serde(v: &Value) -> serde_json::Value {
    match v {
        Value::None => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::BigInt(s) => s.clone().into(),
        Value::Float(f) => json_num(*f),
        Value::Str(s) => s.clone().into(),
        Value::Bytes(b) => format!("<{} bytes>", b.len()).into(),
        Value::List(xs) | Value::Tuple(xs) => xs.iter().map(to_serde).collect(),
        Value::Packed(p) => p.to_values().iter().map(to_serde).collect(),
        Value::Dict(items) => items
            .iter()
            .map(|(k, v)| {
                let key = match k {
                    Value::Str(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                (key, to_serde(v))
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Value::Tensor(t) => format!("<tensor {:?} {:?}>", t.dtype(), t.shape()).into(),
    }
}

/// A number for JSON evidence: finite as a number, NaN/inf as `"NaN"`, `"inf"`, `"-inf"`.
pub fn json_num(v: f64) -> serde_json::Value {
    if v.is_finite() {
        serde_json::Number::from_f64(v)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null)
    } else if v.is_nan() {
        "NaN".into()
    } else if v > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// A list read packed while its items are numbers of one kind, as values from the first
/// item that is not.
fn packed_seq<'de, A: SeqAccess<'de>>(seed: Seed<'_>, mut seq: A) -> Result<Value, A::Error> {
    let mut packed: Option<Packed> = None;
    while let Some(v) = seq.next_element_seed(seed)? {
        let fits = match &mut packed {
            Some(p) => p.push_scalar(&v),
            None => match Packed::of_scalar(&v) {
                Some(p) => {
                    packed = Some(p);
                    true
                }
                None => false,
            },
        };
        if !fits {
            let mut items = packed.map(|p| p.to_values()).unwrap_or_default();
            items.push(v);
            while let Some(v) = seq.next_element_seed(seed)? {
                items.push(v);
            }
            return Ok(Value::List(items));
        }
    }
    Ok(match packed {
        Some(mut p) => {
            p.shrink_to_fit();
            Value::Packed(std::sync::Arc::new(p))
        }
        None => Value::List(Vec::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(v: &Value) -> f64 {
        match v {
            Value::Float(x) => *x,
            other => panic!("not a float: {other:?}"),
        }
    }

    #[test]
    fn nan_in_nested_lists() {
        let v = parse_value(r#"{"a": [[1.5, NaN], [Infinity, -Infinity]], "b": NaN}"#).unwrap();
        let a = v.get("a").unwrap().as_seq().unwrap();
        let r0 = a[0].as_seq().unwrap();
        let r1 = a[1].as_seq().unwrap();
        assert_eq!(f(&r0[0]), 1.5);
        assert!(f(&r0[1]).is_nan());
        assert_eq!(f(&r1[0]), f64::INFINITY);
        assert_eq!(f(&r1[1]), f64::NEG_INFINITY);
        assert!(f(v.get("b").unwrap()).is_nan());
    }

    #[test]
    fn nan_inside_a_string_stays_a_string() {
        let v = parse_value(r#"{"msg": "NaN at -Infinity", "x": 1}"#).unwrap();
        assert_eq!(v.get("msg").unwrap().as_str(), Some("NaN at -Infinity"));
        let v = parse_value(r#"["say \"NaN\"", NaN]"#).unwrap();
        let items = v.as_seq().unwrap();
        assert_eq!(items[0].as_str(), Some("say \"NaN\""));
        assert!(f(&items[1]).is_nan());
    }

    #[test]
    fn genuine_sentinel_strings_survive_rewriting() {
        let v = parse_value(r#"["~", NaN, "\u007e", "~~~~~~", -Infinity, {"~~~~~~~": Infinity}]"#)
            .unwrap();
        let items = v.as_seq().unwrap();
        assert_eq!(items[0].as_str(), Some("~"));
        assert!(f(&items[1]).is_nan());
        assert_eq!(items[2].as_str(), Some("~"));
        assert_eq!(items[3].as_str(), Some("~~~~~~"));
        assert_eq!(f(&items[4]), f64::NEG_INFINITY);
        let d = items[5].as_dict().unwrap();
        assert_eq!(d[0].0.as_str(), Some("~~~~~~~"));
        assert_eq!(f(&d[0].1), f64::INFINITY);
    }

    #[test]
    fn big_ints_and_order() {
        let v = parse_value(
            r#"{"z": 9223372036854775807, "a": 9223372036854775808, "m": -9223372036854775808, "n": null, "t": true}"#,
        )
        .unwrap();
        let d = v.as_dict().unwrap();
        let keys: Vec<_> = d.iter().map(|(k, _)| k.as_str().unwrap()).collect();
        assert_eq!(keys, ["z", "a", "m", "n", "t"]);
        assert!(matches!(d[0].1, Value::Int(i64::MAX)));
        assert!(matches!(&d[1].1, Value::BigInt(s) if s == "9223372036854775808"));
        assert!(matches!(d[2].1, Value::Int(i64::MIN)));
        assert!(matches!(d[3].1, Value::None));
        assert!(matches!(d[4].1, Value::Bool(true)));
    }

    #[test]
    fn floats_round_trip_exactly() {
        let v = parse_value("[0.1, 1e-05, -2.5e+300, 5e-324]").unwrap();
        let xs: Vec<f64> = v.as_seq().unwrap().iter().map(f).collect();
        assert_eq!(xs, [0.1, 1e-05, -2.5e300, 5e-324]);
    }

    #[test]
    fn truncated_input_is_an_error_with_position() {
        let e = parse_value("{\"a\": [1, 2,\n 3").unwrap_err();
        assert_eq!(e.pos, Position::LineColumn(2, 2));
        assert!(e.msg.contains("EOF"), "{}", e.msg);
        // Positions are unchanged by the NaN rewriting.
        let e = parse_value("[NaN, Infinity, -Infinity, x]").unwrap_err();
        assert_eq!(e.pos, Position::LineColumn(1, 28));
        let e = parse_value("[1] 2").unwrap_err();
        assert_eq!(e.pos, Position::LineColumn(1, 5));
        assert!(parse_value("").is_err());
    }
}
