//! The legacy `torch.save` format (torch < 1.6, or `_use_new_zipfile_serialization=False`):
//! five pickles in a row — magic number, protocol version 1001, system info, the data,
//! the list of storage keys — then each storage's raw bytes in that key order, each
//! after an 8-byte little-endian element count. Every pickle goes through the same
//! restricted unpickler as the zip format; storages are windows of the input.

use std::collections::HashMap;

use crate::error::{FormatError, Position};
use crate::formats::Buf;
use crate::tensor::{Bytes, DType};
use crate::value::Value;

use super::pickle::{unpickle_prefix, StorageRequest};

/// `pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2)`: torch's legacy magic number.
const MAGIC: &[u8] = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.";

/// The magic number as Python prints it.
const MAGIC_DECIMAL: &str = "119547037146038801333356";

/// The only legacy protocol version torch reads.
const PROTOCOL_VERSION: i64 = 1001;

/// True when `data` starts with the legacy magic number pickle (any protocol ≥ 2 torch wrote).
pub fn is_legacy(data: &[u8]) -> bool {
    data.starts_with(MAGIC)
        || (data.len() > 2 && data[0] == 0x80 && data[2..].starts_with(&MAGIC[2..]))
}

/// True for a POSIX tar archive (torch < 0.4 wrote `torch.save` files as tar).
pub fn is_tar(data: &[u8]) -> bool {
    data.get(257..262) == Some(b"ustar")
}

/// Read a legacy `torch.save` file.
pub fn read_legacy(buf: &Buf) -> Result<Value, FormatError> {
    let data: &[u8] = (**buf).as_ref();
    let mut none = |_: &StorageRequest<'_>| -> Result<Bytes, String> {
        Err("a header pickle of the legacy format refers to a storage".into())
    };
    let mut at = 0usize;
    let next = |at: &mut usize,
                what: &str,
                load: &mut dyn FnMut(&StorageRequest<'_>) -> Result<Bytes, String>| {
        let name = format!("legacy {what} pickle at byte {at}");
        let (v, len) = unpickle_prefix(&data[*at..], &name, load)?;
        *at += len;
        Ok::<Value, FormatError>(v)
    };
    let magic = next(&mut at, "magic number", &mut none)?;
    if !matches!(&magic, Value::BigInt(s) if s == MAGIC_DECIMAL) {
        return Err(FormatError::new(
            Position::Byte(0),
            "legacy torch.save file with a wrong magic number (corrupt?)",
        ));
    }
    let version_at = at;
    let version = next(&mut at, "protocol version", &mut none)?;
    if !matches!(version, Value::Int(PROTOCOL_VERSION)) {
        return Err(FormatError::new(
            Position::Byte(version_at as u64),
            format!("legacy torch.save protocol version {version:?}; torch reads only {PROTOCOL_VERSION}"),
        ));
    }
    next(&mut at, "system info", &mut none)?;
    let main_at = at;
    let main_name = format!("legacy data pickle at byte {main_at}");

    // First pass: learn each storage's dtype and element count. Every storage must fit
    // in the file, so the placeholder bytes are a window of the input (no allocation).
    let mut claimed: HashMap<String, (DType, u64)> = HashMap::new();
    let mut claim_err: Option<String> = None;
    let mut record = |req: &StorageRequest<'_>| -> Result<Bytes, String> {
        let n = req
            .numel
            .checked_mul(req.dtype.size() as u64)
            .filter(|&n| n <= data.len() as u64)
            .ok_or_else(|| {
                format!(
                    "storage {} claims {} {} elements, more than the file holds",
                    req.key, req.numel, req.dtype
                )
            })?;
        match claimed.get(req.key) {
            Some(&(d, m)) if d.size() != req.dtype.size() || m != req.numel => {
                claim_err = Some(format!("storage {} is claimed with two sizes", req.key));
            }
            _ => {
                claimed.insert(req.key.to_string(), (req.dtype, req.numel));
            }
        }
        Bytes::window(buf.clone(), 0, n as usize)
            .ok_or_else(|| "storage larger than the file".into())
    };
    let (_, main_len) = unpickle_prefix(&data[main_at..], &main_name, &mut record)?;
    if let Some(m) = claim_err {
        return Err(FormatError::new(Position::Byte(main_at as u64), m));
    }
    at = main_at + main_len;
    let keys_at = at;
    let keys = next(&mut at, "storage keys", &mut none)?;
    let keys: Vec<String> = match keys.as_seq() {
        Some(items) => items
            .iter()
            .map(|k| match k {
                Value::Str(s) => Some(s.clone()),
                Value::Int(i) => Some(i.to_string()),
                Value::Bytes(b) if b.is_ascii() => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                FormatError::new(
                    Position::Byte(keys_at as u64),
                    "storage keys are not strings",
                )
            })?,
        None => {
            return Err(FormatError::new(
                Position::Byte(keys_at as u64),
                "the storage key list is not a list",
            ))
        }
    };

    // The raw storages, in key order.
    let mut windows: HashMap<String, Bytes> = HashMap::new();
    for key in &keys {
        let pos = Position::Byte(at as u64);
        let &(dtype, numel) = claimed.get(key).ok_or_else(|| {
            FormatError::new(
                pos.clone(),
                format!("storage {key} is listed but never used"),
            )
        })?;
        let head = data.get(at..at + 8).ok_or_else(|| {
            FormatError::new(
                pos.clone(),
                format!("file ends before storage {key} (truncated?)"),
            )
        })?;
        let mut n = [0u8; 8];
        n.copy_from_slice(head);
        let count = i64::from_le_bytes(n);
        if u64::try_from(count).ok() != Some(numel) {
            return Err(FormatError::new(
                pos,
                format!("storage {key} holds {count} elements but the pickle says {numel}"),
            ));
        }
        at += 8;
        // numel * size fits in the file length, as checked by `record`.
        let len = numel as usize * dtype.size();
        // Legacy storages are little-endian, as the `Tensor` type keeps them.
        let w = Bytes::window(buf.clone(), at, len).ok_or_else(|| {
            FormatError::new(
                Position::Byte(at as u64),
                format!(
                    "storage {key} of {len} bytes reaches past the end of the file (truncated?)"
                ),
            )
        })?;
        windows.insert(key.clone(), w);
        at += len;
    }

    // Second pass: the same pickle over the real bytes.
    let mut load = |req: &StorageRequest<'_>| -> Result<Bytes, String> {
        windows
            .get(req.key)
            .cloned()
            .ok_or_else(|| format!("storage {} is not in the file's storage list", req.key))
    };
    let (v, _) = unpickle_prefix(&data[main_at..], &main_name, &mut load)?;
    Ok(v)
}
