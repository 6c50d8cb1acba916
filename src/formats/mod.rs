//! Byte formats: one module per on-disk format of a dump file (`.pt`, `.safetensors`,
//! `.npy`/`.npz`, one-line `.jsonl`), each turning bytes into a [`Value`] tree of
//! [`Tensor`](crate::Tensor)s; what the keys mean is the producers' business
//! ([`crate::producers`]).

pub mod dump_jsonl;
pub mod npy;
pub mod outline;
pub mod pt;
pub mod safetensors;
pub mod source;

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Position, Result};
use crate::value::Value;

pub use crate::model::tree::FileFormat;

/// Shared input bytes: a read-only memory map of a regular file, or the whole content of
/// a pipe.
pub(crate) type Buf = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// The bytes of `path` for a reader. Regular files are memory-mapped (an empty one is
/// refused: a map of nothing is never a dump); a FIFO or pipe (`--inspect <(ssh host cat
/// x.pt)`) is read to its end, since it cannot be mapped or read twice; directories,
/// sockets and devices are refused by name before anything blocks on them. A URL
/// ([`source::is_remote`]) is fetched whole into memory (one GET).
pub(crate) fn open_input(path: &Path) -> Result<Buf> {
    use std::io::Read as _;
    use std::os::unix::fs::FileTypeExt as _;
    if source::is_remote(path) {
        let bytes = source::read_cached(path)?;
        if bytes.is_empty() {
            return Err(Error::format(path, Position::File, "empty object"));
        }
        return Ok(bytes);
    }
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let ft = meta.file_type();
    if let Some(what) = crate::error::not_a_file(ft) {
        return Err(Error::format(
            path,
            Position::File,
            format!("is {what}, not a file: expected a dump file here"),
        ));
    }
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    if ft.is_fifo() {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| Error::io(path, e))?;
        if bytes.is_empty() {
            return Err(Error::format(path, Position::File, "empty input"));
        }
        return Ok(Arc::new(bytes));
    }
    if meta.len() == 0 {
        return Err(Error::format(path, Position::File, "empty file"));
    }
    // SAFETY: the map is read-only and this crate never writes input files; as with every
    // memory map, another process truncating the file while we read it is not defended.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Arc::new(map))
}

/// The format of dump bytes judged by their first bytes, for a file whose name says
/// nothing (a pipe, a `.bin`): zip with a `data.pkl` member or torch's legacy magic
/// number → `.pt`, other zip → `.npz`,
/// `\x93NUMPY` → `.npy`, an 8-byte length followed by `{` → `.safetensors`, `{` → JSON.
pub fn sniff_format(bytes: &[u8]) -> Option<FileFormat> {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        let has_pickle = memchr::memmem::rfind(bytes, b"data.pkl").is_some();
        return Some(if has_pickle {
            FileFormat::Pt
        } else {
            FileFormat::Npz
        });
    }
    if pt::legacy::is_legacy(bytes) {
        return Some(FileFormat::Pt);
    }
    if bytes.starts_with(b"\x93NUMPY") {
        return Some(FileFormat::Npy);
    }
    if let Some(head) = bytes.get(..9) {
        let mut n = [0u8; 8];
        n.copy_from_slice(&head[..8]);
        let n = u64::from_le_bytes(n);
        if head[8] == b'{' && n >= 2 && n <= (bytes.len() - 8) as u64 {
            return Some(FileFormat::Safetensors);
        }
    }
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match text.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Some(FileFormat::Jsonl),
        _ => None,
    }
}

/// Read any supported dump file, choosing the reader by extension, or by the first bytes
/// ([`sniff_format`]) when the name has none of the known extensions.
pub fn read_any(path: &Path) -> Result<Value> {
    match FileFormat::from_path(path) {
        Some(FileFormat::Pt) => pt::read_pt(path),
        Some(FileFormat::Jsonl) => dump_jsonl::read_dump_jsonl(path),
        Some(FileFormat::Safetensors) => safetensors::read_safetensors(path),
        Some(FileFormat::Npy) => npy::read_npy(path),
        Some(FileFormat::Npz) => npy::read_npz(path),
        None => {
            let buf = open_input(path)?;
            let bytes: &[u8] = (*buf).as_ref();
            match sniff_format(bytes) {
                Some(FileFormat::Pt) => pt::read_pt_bytes(buf.clone()).map_err(|e| e.in_file(path)),
                Some(FileFormat::Npz) => npy::read_npz_bytes(bytes).map_err(|e| e.in_file(path)),
                Some(FileFormat::Npy) => {
                    npy::read_npy_bytes(buf.clone()).map_err(|e| e.in_file(path))
                }
                Some(FileFormat::Safetensors) => {
                    safetensors::read_safetensors_bytes(buf.clone()).map_err(|e| e.in_file(path))
                }
                Some(FileFormat::Jsonl) => dump_jsonl::parse_dump_jsonl(path, bytes),
                None => Err(Error::format(
                    path,
                    Position::File,
                    "unknown format: the name has none of .pt, .jsonl, .safetensors, .npy, .npz \
                     and the content starts like none of them",
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_tells_the_formats_apart_by_their_first_bytes() {
        assert_eq!(
            sniff_format(b"PK\x03\x04....archive/data.pkl"),
            Some(FileFormat::Pt)
        );
        assert_eq!(sniff_format(b"PK\x03\x04....x.npy"), Some(FileFormat::Npz));
        assert_eq!(sniff_format(b"\x93NUMPY\x01\x00"), Some(FileFormat::Npy));
        let mut st = 4u64.to_le_bytes().to_vec();
        st.extend_from_slice(b"{}  ");
        assert_eq!(sniff_format(&st), Some(FileFormat::Safetensors));
        // A header length past the end is not safetensors.
        let mut bad = 400u64.to_le_bytes().to_vec();
        bad.extend_from_slice(b"{}  ");
        assert_eq!(sniff_format(&bad), None);
        assert_eq!(
            sniff_format(b"\xef\xbb\xbf \n{\"loss\": 1}"),
            Some(FileFormat::Jsonl)
        );
        assert_eq!(sniff_format(b"step 1 loss 0.5"), None);
        assert_eq!(sniff_format(b""), None);
    }
}
