//! `torch.save` zip archives (torch ≥ 1.6): `<prefix>/data.pkl` read by our restricted
//! unpickler, `<prefix>/data/<key>` storages as zero-copy windows of the memory-mapped
//! file, and the optional `<prefix>/byteorder` member; and the legacy format (see
//! [`legacy`]).

pub mod legacy;
pub mod pickle;

use std::collections::HashMap;
use std::io::Cursor;
use std::path::Path;

use ::zip::read::{ArchiveOffset, Config};
use ::zip::{CompressionMethod, ZipArchive};

use crate::error::{FormatError, Position, Result};
use crate::tensor::{Bytes, Tensor};
use crate::value::Value;

use self::pickle::StorageRequest;

use crate::readers::Buf;

/// Read a torch.save file into a value tree.
pub fn read_pt(path: &Path) -> Result<Value> {
    let buf = crate::readers::open_input(path)?;
    read_pt_bytes(buf).map_err(|e| e.in_file(path))
}

/// Same, from bytes in memory (for fuzzing and tests); errors carry no file name.
pub fn read_pt_bytes(bytes: Buf) -> Result<Value, FormatError> {
    let data: &[u8] = (*bytes).as_ref();
    if data.is_empty() {
        return Err(FormatError::new(
            Position::File,
            "empty file: not a torch.save archive",
        ));
    }
    if legacy::is_legacy(data) {
        return legacy::read_legacy(&bytes);
    }
    if !data.starts_with(b"PK") {
        let msg = if legacy::is_tar(data) {
            "tar archive: the torch < 0.4 tar format of torch.save is not supported; re-save \
             it with a recent torch"
        } else if data.starts_with(b"\x80") {
            "a pickle that does not start with torch's legacy magic number: not a torch.save \
             file"
        } else {
            "not a zip archive, so not a torch.save file (torch >= 1.6 writes zip archives)"
        };
        return Err(FormatError::new(Position::Byte(0), msg));
    }
    // torch.save's archives start at byte 0; the zip crate's default guess of where the
    // archive starts is fooled by the zip64 records torch writes (21-byte file stems).
    let config = Config {
        archive_offset: ArchiveOffset::Known(0),
    };
    let mut archive = ZipArchive::with_config(config, Cursor::new(data)).map_err(|e| {
        FormatError::new(
            Position::File,
            format!("unreadable zip archive ({e}); the file may be truncated"),
        )
    })?;
    let pkl_name = find_data_pkl(&archive)?;
    let prefix = pkl_name[..pkl_name.len() - "data.pkl".len()].to_string();
    let big_endian = read_byteorder(&mut archive, &bytes, &prefix)?;
    let pkl = member_window(&mut archive, &bytes, &pkl_name)?;

    let mut cache: HashMap<String, Bytes> = HashMap::new();
    let mut load = |req: &StorageRequest<'_>| -> Result<Bytes, String> {
        if let Some(b) = cache.get(req.key) {
            return Ok(b.clone());
        }
        let name = format!("{prefix}data/{}", req.key);
        let (start, len) = member_range(&mut archive, data, &name).map_err(|e| e.msg)?;
        let need = req
            .numel
            .checked_mul(req.dtype.size() as u64)
            .filter(|&n| n <= len as u64)
            .ok_or_else(|| {
                format!(
                    "storage member {name} holds {len} bytes but the pickle claims {} {} \
                     elements",
                    req.numel, req.dtype
                )
            })? as usize;
        let mut b = Bytes::window(bytes.clone(), start, need)
            .ok_or_else(|| format!("storage member {name} reaches past the end of the file"))?;
        if big_endian && req.dtype.size() > 1 && !req.dtype.is_raw() {
            b = Bytes::from_vec(Tensor::byteswapped_storage(b.as_slice(), req.dtype));
        }
        cache.insert(req.key.to_string(), b.clone());
        Ok(b)
    };
    pickle::unpickle(pkl.as_slice(), &pkl_name, &mut load)
}

/// The single `data.pkl` member, at the top or under one prefix folder.
fn find_data_pkl(archive: &ZipArchive<Cursor<&[u8]>>) -> Result<String, FormatError> {
    let found: Vec<String> = archive
        .file_names()
        .filter_map(|n| n.ok())
        .filter(|n| {
            n.strip_suffix("data.pkl")
                .is_some_and(|p| p.is_empty() || (p.ends_with('/') && p.matches('/').count() == 1))
        })
        .map(|n| n.into_owned())
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(FormatError::new(
            Position::File,
            "zip archive has no <archive>/data.pkl member: not a torch.save file",
        )),
        many => Err(FormatError::new(
            Position::File,
            format!(
                "zip archive has several data.pkl members: {}",
                many.join(", ")
            ),
        )),
    }
}

/// Where stored member `name`'s data lies in `data`: `(start, len)`, checked to fit and
/// checked against the CRC-32 the archive records for it (torch's miniz reader checks it
/// too, so a flipped byte fails here as it would in `torch.load`).
fn member_range(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    data: &[u8],
    name: &str,
) -> Result<(usize, usize), FormatError> {
    let total = data.len();
    let pos = || Position::Member(name.to_string());
    let idx = archive
        .index_for_name(name)
        .ok_or_else(|| FormatError::new(pos(), format!("member {name} is missing")))?;
    let f = archive
        .by_index_raw(idx)
        .map_err(|e| FormatError::new(pos(), format!("member {name} is unreadable: {e}")))?;
    if f.compression() != CompressionMethod::Stored {
        return Err(FormatError::new(
            pos(),
            format!(
                "member {name} is compressed ({}); torch.save writes stored (uncompressed) \
                 members: re-zip without compression",
                f.compression()
            ),
        ));
    }
    if f.encrypted() {
        return Err(FormatError::new(
            pos(),
            format!("member {name} is encrypted"),
        ));
    }
    let start = f
        .data_start()
        .ok_or_else(|| FormatError::new(pos(), format!("member {name} has no data offset")))?;
    let (size, csize) = (f.size(), f.compressed_size());
    let fits = start
        .checked_add(size)
        .is_some_and(|end| end <= total as u64 && size == csize);
    if !fits {
        return Err(FormatError::new(
            pos(),
            format!(
                "member {name} claims {size} bytes at offset {start} but the file has \
                 {total} bytes (truncated?)"
            ),
        ));
    }
    // Both fit in `total`, a usize, as checked just above.
    let (start, len) = (start as usize, size as usize);
    let expected = f.crc32();
    let actual = crc32fast::hash(&data[start..start + len]);
    // Fuzzers cannot forge CRCs; skipping the check there lets them reach the unpickler.
    // A recorded CRC of 0 is what `torch.serialization.set_crc32_options(False)` writes:
    // no checksum, not a corrupt member.
    if actual != expected && expected != 0 && !cfg!(fuzzing) {
        return Err(FormatError::new(
            pos(),
            format!(
                "member {name} fails its CRC-32 check (archive says {expected:08x}, data \
                 hashes to {actual:08x}): the file is corrupt"
            ),
        ));
    }
    Ok((start, len))
}

/// The bytes of stored member `name`, without copying.
fn member_window(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    bytes: &Buf,
    name: &str,
) -> Result<Bytes, FormatError> {
    let (start, len) = member_range(archive, (**bytes).as_ref(), name)?;
    Bytes::window(bytes.clone(), start, len).ok_or_else(|| {
        FormatError::new(
            Position::Member(name.to_string()),
            format!("member {name} reaches past the end of the file"),
        )
    })
}

/// True when the optional `byteorder` member says `big`.
fn read_byteorder(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    bytes: &Buf,
    prefix: &str,
) -> Result<bool, FormatError> {
    let name = format!("{prefix}byteorder");
    if archive.index_for_name(&name).is_none() {
        return Ok(false);
    }
    let w = member_window(archive, bytes, &name)?;
    match w.as_slice().trim_ascii() {
        b"little" => Ok(false),
        b"big" => Ok(true),
        other => Err(FormatError::new(
            Position::Member(name.clone()),
            format!(
                "member {name} says {:?}; expected \"little\" or \"big\"",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}
