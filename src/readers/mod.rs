//! One module per input format; each returns a [`Value`] tree.

pub mod aliases;
pub mod crash_bundle;
pub mod dump_jsonl;
pub mod events;
pub mod layout;
pub mod npy;
pub mod pt;
pub mod safetensors;
pub mod steps;
pub mod textlog;

use std::path::Path;

use crate::error::{Error, Result};
use crate::value::Value;

/// The on-disk formats a dump file may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    Pt,
    Jsonl,
    Safetensors,
    Npy,
    Npz,
}

impl FileFormat {
    /// The format implied by a file name's extension.
    pub fn from_path(path: &Path) -> Option<FileFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "pt" | "pth" => FileFormat::Pt,
            "jsonl" | "json" => FileFormat::Jsonl,
            "safetensors" => FileFormat::Safetensors,
            "npy" => FileFormat::Npy,
            "npz" => FileFormat::Npz,
            _ => return None,
        })
    }

    /// The usual extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Pt => "pt",
            FileFormat::Jsonl => "jsonl",
            FileFormat::Safetensors => "safetensors",
            FileFormat::Npy => "npy",
            FileFormat::Npz => "npz",
        }
    }
}

/// Read any supported dump file, choosing the reader by extension.
pub fn read_any(path: &Path) -> Result<Value> {
    match FileFormat::from_path(path) {
        Some(FileFormat::Pt) => pt::read_pt(path),
        Some(FileFormat::Jsonl) => dump_jsonl::read_dump_jsonl(path),
        Some(FileFormat::Safetensors) => safetensors::read_safetensors(path),
        Some(FileFormat::Npy) => npy::read_npy(path),
        Some(FileFormat::Npz) => npy::read_npz(path),
        None => Err(Error::format(
            path,
            crate::error::Position::File,
            "unknown extension: expected .pt, .jsonl, .safetensors, .npy or .npz",
        )),
    }
}
