//! `torch.save` zip archives (torch ≥ 1.6): `<prefix>/data.pkl` read by our restricted
//! unpickler, `<prefix>/data/<key>` storages as zero-copy windows of the memory-mapped
//! file, and the optional `<prefix>/byteorder` member; and the legacy format (see
//! [`legacy`]).

pub mod legacy;
pub mod pickle;
pub mod ranged;

use std::collections::HashMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Mmap, UncheckedAdvice};

use ::zip::read::{ArchiveOffset, Config};
use ::zip::{CompressionMethod, ZipArchive};

use crate::error::{FormatError, Position, Result};
use crate::tensor::{Bytes, Tensor};
use crate::value::Value;

use self::pickle::StorageRequest;

use crate::formats::Buf;

/// Read a torch.save file into a value tree.
///
/// A regular file is memory-mapped and its pickle's pages are handed back to the kernel
/// as the unpickler moves past them (see [`read_pt_map`]); a pipe is read whole.
pub fn read_pt(path: &Path) -> Result<Value> {
    if crate::formats::source::is_remote(path) {
        return ranged::read_pt_remote(path, None);
    }
    let meta = std::fs::metadata(path).map_err(|e| crate::error::Error::io(path, e))?;
    if meta.is_file() && meta.len() > 0 {
        let file = std::fs::File::open(path).map_err(|e| crate::error::Error::io(path, e))?;
        // SAFETY: as in `formats::open_input`: the map is read-only and this crate never
        // writes input files; another process truncating the file while we read it is not
        // defended, as with every memory map.
        if let Ok(map) = unsafe { Mmap::map(&file) } {
            return read_pt_map_pickle(Arc::new(map)).map_err(|e| e.in_file(path));
        }
    }
    let buf = crate::formats::open_input(path)?;
    read_pt_bytes(buf).map_err(|e| e.in_file(path))
}

/// [`read_pt`] keeping only the root dict's entries named in `keys` (a root that is not a
/// dict is returned whole). Locally the same as reading it all (the map faults in only what
/// is read); from object storage only the storages those entries use are fetched (see
/// [`ranged`]), e.g. one tensor of a large checkpoint.
pub fn read_pt_keys(path: &Path, keys: &[&str]) -> Result<Value> {
    if crate::formats::source::is_remote(path) {
        return ranged::read_pt_remote(path, Some(keys));
    }
    read_pt(path).map(|v| ranged::only(v, keys))
}

/// Same, from bytes in memory (for fuzzing and tests); errors carry no file name.
pub fn read_pt_bytes(bytes: Buf) -> Result<Value, FormatError> {
    read_pt_released(bytes, None, None, None)
}

/// The streaming hook applied after the fact, to a value read whole: every item of the
/// list under the root dict's key `each.key` replaced by what `each.each` returns.
fn hand_over_whole(v: &mut Value, e: pickle::Each<'_>) -> Result<(), String> {
    let Value::Dict(items) = v else {
        return Ok(());
    };
    for (k, val) in items.iter_mut() {
        if let (Value::Str(s), Value::List(xs)) = (&*k, val) {
            if s == e.key {
                for (i, x) in xs.iter_mut().enumerate() {
                    let item = std::mem::replace(x, Value::None);
                    *x = (e.each)(i, item)?;
                }
            }
        }
    }
    Ok(())
}

/// [`read_pt_bytes`] of a memory map whose pages are released (MADV_DONTNEED) once read:
/// `data.pkl`'s once the unpickler and the CRC-32 pass, done together, have read them (the
/// pickle of a trajectory file is never resident whole, only the values built from it);
/// each storage's once checksummed (its tensor, a zero-copy window of the map, faults back
/// what is read of it). For whole-batch files read once and sliced later.
pub fn read_pt_map(map: Arc<Mmap>) -> Result<Value, FormatError> {
    let release = |part: &[u8]| release_pages(&map, part);
    read_pt_released(map.clone(), Some(&release), Some(&release), None)
}

/// [`read_pt_bytes`] of a memory map whose `data.pkl` pages are released as the unpickler
/// reads them; storages stay resident after their CRC pass (the caller reads them next).
fn read_pt_map_pickle(map: Arc<Mmap>) -> Result<Value, FormatError> {
    let release = |part: &[u8]| release_pages(&map, part);
    read_pt_released(map.clone(), Some(&release), None, None)
}

/// [`read_pt_map`] handing each item of the list under the root dict's key `each.key` to
/// `each.each` as soon as the unpickler has built it, and keeping only what that returns
/// (see [`pickle::Each`]): a trajectory file digested this way never holds all its token
/// lists. Legacy (pre-zip) files are read whole, their items handed over afterwards.
pub fn read_pt_map_each(map: Arc<Mmap>, each: pickle::Each<'_>) -> Result<Value, FormatError> {
    let release = |part: &[u8]| release_pages(&map, part);
    read_pt_released(map.clone(), Some(&release), Some(&release), Some(each))
}

/// Let the kernel drop `part` (a window of `map`) from this process's memory; a later read
/// faults the same file bytes back in from the page cache.
pub fn release_pages(map: &Mmap, part: &[u8]) {
    let base = map.as_ptr() as usize;
    let Some(offset) = (part.as_ptr() as usize).checked_sub(base) else {
        return;
    };
    if part.is_empty() || offset + part.len() > map.len() {
        return;
    }
    // SAFETY: the map is a read-only mapping of a file this crate never writes:
    // MADV_DONTNEED only drops page-table entries, and the next read of any slice of it
    // sees the same file bytes again. A failure (it is only advice) changes nothing.
    let _ = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, offset, part.len()) };
}

/// Told each part of the input once it is read and checksummed (to release its pages).
type Release<'a> = &'a dyn Fn(&[u8]);

/// The reader behind [`read_pt_bytes`] and [`read_pt_map`]; `release`, when given, is
/// handed each part of `data.pkl` once it is read and checksummed, `release_storages`
/// each part of a storage member once checksummed.
fn read_pt_released(
    bytes: Buf,
    release: Option<Release<'_>>,
    release_storages: Option<Release<'_>>,
    each: Option<pickle::Each<'_>>,
) -> Result<Value, FormatError> {
    let data: &[u8] = (*bytes).as_ref();
    if data.is_empty() {
        return Err(FormatError::new(
            Position::File,
            "empty file: not a torch.save archive",
        ));
    }
    if legacy::is_legacy(data) {
        let mut v = legacy::read_legacy(&bytes)?;
        if let Some(e) = each {
            hand_over_whole(&mut v, e).map_err(|m| FormatError::new(Position::File, m))?;
        }
        return Ok(v);
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
    let pkl = member_located(&mut archive, data, &pkl_name)?;
    let pkl_data = &data[pkl.start..pkl.start + pkl.len];

    let mut cache: HashMap<String, Bytes> = HashMap::new();
    let mut load = |req: &StorageRequest<'_>| -> Result<Bytes, String> {
        if let Some(b) = cache.get(req.key) {
            return Ok(b.clone());
        }
        let name = format!("{prefix}data/{}", req.key);
        let (start, len) = match release_storages {
            None => member_range(&mut archive, data, &name).map_err(|e| e.msg)?,
            Some(r) => {
                // Checksummed a chunk at a time, each released behind the hash: a large
                // storage is never resident whole here (its reader faults back what it reads).
                let m = member_located(&mut archive, data, &name).map_err(|e| e.msg)?;
                let mut crc = crc32fast::Hasher::new();
                for part in data[m.start..m.start + m.len].chunks(4 << 20) {
                    crc.update(part);
                    r(part);
                }
                check_crc(&name, m.crc, crc.finalize()).map_err(|e| e.msg)?;
                (m.start, m.len)
            }
        };
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
    // One pass over data.pkl: the unpickler reads it and each part it is done with is
    // checksummed, then released. Its CRC is judged before the unpickler's verdict, as
    // when it was checked first: a corrupt pickle reports the CRC, not what it broke.
    let mut crc = crc32fast::Hasher::new();
    let seen = std::cell::Cell::new(0usize);
    let mut consumed = |part: &[u8]| {
        crc.update(part);
        seen.set(seen.get() + part.len());
        if let Some(r) = release {
            r(part);
        }
    };
    let read = pickle::unpickle_each(pkl_data, &pkl_name, &mut load, &mut consumed, each);
    // The unpickler handed over what it read, in order; the rest (after its STOP, or
    // after the opcode it failed at) is hashed here.
    consumed(&pkl_data[seen.get().min(pkl_data.len())..]);
    check_crc(&pkl_name, pkl.crc, crc.finalize())?;
    read.map(|(v, _)| v)
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
    let m = member_located(archive, data, name)?;
    check_crc(
        name,
        m.crc,
        crc32fast::hash(&data[m.start..m.start + m.len]),
    )?;
    Ok((m.start, m.len))
}

/// A stored member's place in the file and the CRC-32 the archive records for it.
struct Located {
    start: usize,
    len: usize,
    crc: u32,
}

/// Where stored member `name`'s data lies in `data`, checked to fit (not yet checksummed).
fn member_located(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    data: &[u8],
    name: &str,
) -> Result<Located, FormatError> {
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
    Ok(Located {
        start: start as usize,
        len: size as usize,
        crc: f.crc32(),
    })
}

/// Compare member `name`'s recorded CRC-32 with the hash of its data.
fn check_crc(name: &str, expected: u32, actual: u32) -> Result<(), FormatError> {
    // Fuzzers cannot forge CRCs; skipping the check there lets them reach the unpickler.
    // A recorded CRC of 0 is what `torch.serialization.set_crc32_options(False)` writes:
    // no checksum, not a corrupt member.
    if actual != expected && expected != 0 && !cfg!(fuzzing) {
        return Err(FormatError::new(
            Position::Member(name.to_string()),
            format!(
                "member {name} fails its CRC-32 check (archive says {expected:08x}, data \
                 hashes to {actual:08x}): the file is corrupt"
            ),
        ));
    }
    Ok(())
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
