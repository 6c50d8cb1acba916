//! File listing shared by the whole-step producers ([`super::StepReader`]s): the files of
//! a tree in a stable order, a file's first bytes for detection by content, and the step
//! number a file or folder name spells.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::formats::source;

/// [`files_under`] for a URL: the objects under the prefix, one LIST per level (an object
/// itself when the prefix is one), hidden names skipped, the same limits.
fn objects_under(root: &Path) -> Result<Vec<PathBuf>> {
    let top = source::list_dir(root)?;
    if top.is_empty() {
        return match source::head_size(root)? {
            Some(_) => Ok(vec![root.to_path_buf()]),
            None => Err(Error::input(root, "no such object or prefix in the store")),
        };
    }
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize, top)];
    while let Some((dir, depth, listing)) = stack.pop() {
        for (name, _) in &listing.files {
            if !name.starts_with('.') {
                out.push(dir.join(name));
            }
        }
        if out.len() > MAX_FILES {
            return Err(Error::input(
                root,
                format!("more than {MAX_FILES} files: point at one run's dump folder"),
            ));
        }
        for name in listing.dirs.iter().filter(|n| !n.starts_with('.')) {
            if depth < MAX_DEPTH {
                let p = dir.join(name);
                let l = source::list_dir(&p)?;
                stack.push((p, depth + 1, l));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The whole file or object `path` (an object fetched once and kept, see
/// [`source::read_cached`]).
pub fn read(path: &Path) -> Result<Vec<u8>> {
    if source::is_remote(path) {
        return source::read_cached(path).map(|b| b.to_vec());
    }
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// The whole file or object `path` as UTF-8 text.
pub fn read_to_string(path: &Path) -> Result<String> {
    if !source::is_remote(path) {
        return std::fs::read_to_string(path).map_err(|e| Error::io(path, e));
    }
    String::from_utf8(read(path)?).map_err(|e| {
        Error::format(
            path,
            crate::error::Position::Byte(e.utf8_error().valid_up_to() as u64),
            "not UTF-8",
        )
    })
}

/// Deepest folder level listed under a root (verl's RolloutSkip nests four).
const MAX_DEPTH: usize = 8;

/// Most files listed under a root, so that pointing at `/` fails fast instead of walking.
const MAX_FILES: usize = 200_000;

/// Every regular file under `root` (or `root` itself when it is a file), sorted by path;
/// hidden entries (`.name`) are skipped.
///
/// Errors: `root` unreadable, or more than [`MAX_FILES`] files under it.
pub fn files_under(root: &Path) -> Result<Vec<PathBuf>> {
    if source::is_remote(root) {
        return objects_under(root);
    }
    let meta = std::fs::metadata(root).map_err(|e| Error::io(root, e))?;
    if meta.is_file() {
        return Ok(vec![root.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let p = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let ft = match std::fs::metadata(&p) {
                Ok(m) => m,
                Err(_) => continue,
            };
            if ft.is_dir() {
                if depth < MAX_DEPTH {
                    stack.push((p, depth + 1));
                }
            } else if ft.is_file() {
                out.push(p);
                if out.len() > MAX_FILES {
                    return Err(Error::input(
                        root,
                        format!("more than {MAX_FILES} files: point at one run's dump folder"),
                    ));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The first `n` bytes of `path` (fewer when it is shorter); empty when unreadable.
pub fn head(path: &Path, n: usize) -> Vec<u8> {
    if source::is_remote(path) {
        // One ranged GET of the first bytes (the reader that claims it reads it next).
        return source::read_head(path, n as u64)
            .map(|(b, _)| b)
            .unwrap_or_default();
    }
    let mut buf = Vec::with_capacity(n);
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(n as u64).read_to_end(&mut buf);
    }
    buf
}

/// Whether `hay` contains `needle`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// The last run of decimal digits in `name` (`batch_step12.pkl` → 12, `step_3` → 3,
/// `train_data_step7.jsonl` → 7), `None` when it has none.
pub fn last_number(name: &str) -> Option<i64> {
    let b = name.as_bytes();
    let end = b.iter().rposition(|c| c.is_ascii_digit())? + 1;
    let start = b[..end]
        .iter()
        .rposition(|c| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    name[start..end].parse().ok()
}

/// The step a file's name (its stem) or, failing that, its folder's name spells.
pub fn step_from_path(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_string_lossy();
    last_number(&stem).or_else(|| {
        let parent = path.parent()?.file_name()?.to_string_lossy().into_owned();
        last_number(&parent)
    })
}

/// The steps, ascending and distinct, of a producer's `(step, set_aside, path)` files whose
/// flag is false (AReaL's and Miles' per-step files, verl's training generations).
pub fn steps_of(files: &[(i64, bool, PathBuf)]) -> Vec<i64> {
    let s: std::collections::BTreeSet<i64> = files.iter().filter(|f| !f.1).map(|f| f.0).collect();
    s.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_names() {
        assert_eq!(last_number("batch_step12.pkl"), Some(12));
        assert_eq!(last_number("step_3"), Some(3));
        assert_eq!(last_number("gen_batch"), None);
        assert_eq!(
            step_from_path(Path::new("x/GBS2_N2_in5_out6/7/gen_batch.dp")),
            Some(7)
        );
        assert_eq!(
            step_from_path(Path::new("train_data_step10.jsonl")),
            Some(10)
        );
    }
}
