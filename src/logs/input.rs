//! Where a log's bytes come from: a local path, or an object in a store named by URL
//! (`s3://bucket/run/steps.jsonl`), read through [`crate::formats::source`] (issue 33).
//! The tools reach object storage for logs through this module only.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A log's bytes as a reader: a local file or pipe, read as it goes, or an object fetched
/// whole in one GET (text logs are read once, front to back).
pub type Input = Box<dyn Read + Send>;

/// Whether `path` names an object in a store rather than a local file.
pub fn is_remote(path: &Path) -> bool {
    crate::formats::source::is_remote(path)
}

/// `path.is_dir()` that also answers for a URL: a prefix with something under it.
pub fn is_dir(path: &Path) -> bool {
    crate::formats::source::is_dir(path)
}

/// The object `path` as a log input (one GET); a missing object is an error naming it.
pub fn open_remote(path: &Path) -> Result<Input> {
    let bytes = crate::formats::source::read_all(path)?;
    Ok(Box::new(std::io::Cursor::new(bytes)))
}

/// A URL on the command line expanded as a folder is: `None` when `path` names one object
/// (or nothing: its read says so), else the objects directly under the prefix whose names
/// `is_log` accepts, sorted (tracker files in a store are not searched for).
pub fn expand_remote(path: &Path, is_log: impl Fn(&Path) -> bool) -> Result<Option<Vec<PathBuf>>> {
    let listing = crate::formats::source::list_dir(path)?;
    if listing.is_empty() {
        return Ok(None);
    }
    let mut found: Vec<PathBuf> = listing
        .files
        .iter()
        .map(|(name, _)| path.join(name))
        .filter(|f| is_log(f))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(Error::Usage(format!(
            "{}: prefix holds no logs (*.jsonl, *.log, *.txt, *.out, trainer_state.json)",
            path.display()
        )));
    }
    Ok(Some(found))
}

/// The sub-prefixes (folders) directly under the prefix `path`, sorted; a prefix with
/// nothing under it is an error naming it ("no such object or prefix").
pub fn sub_prefixes(path: &Path) -> Result<Vec<PathBuf>> {
    let listing = crate::formats::source::list_dir(path)?;
    if listing.is_empty() {
        return Err(Error::input(path, "no such object or prefix in the store"));
    }
    Ok(listing.dirs.iter().map(|d| path.join(d)).collect())
}
