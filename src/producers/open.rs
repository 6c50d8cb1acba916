//! A path opened for inspection (`dumpdiff --inspect`): a NexRL dump tree, a whole-step
//! producer's tree or file, or any one file's own values ([`Inspected`]).

use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::formats::{outline::outline, read_any, FileFormat};
use crate::model::outline::{Inspected, StackView};
use crate::model::tree::DumpTree;

/// Steps of a whole-step producer read for the view.
const SHOWN_STEPS: usize = 4;

/// A tree (or file) of one of the whole-step producers ([`crate::producers::step_readers`]:
/// verl, NeMo-RL, slime/Miles, SGLang's dumper, AReaL): its producer, steps, and its first
/// steps read. `None` when no such producer recognises it (or several do, or a step cannot
/// be read: the caller's own error is the better message).
fn stack_view(path: &Path) -> Option<Inspected> {
    let reader = crate::producers::step_reader_for(path).ok()?;
    let steps = reader.steps(path).ok()?;
    let mut read = Vec::new();
    for &step in steps.iter().take(SHOWN_STEPS) {
        read.push((step, reader.read_step(path, step).ok()?));
    }
    Some(Inspected::Stack {
        path: path.to_path_buf(),
        view: StackView {
            producer: reader.name().to_string(),
            steps,
            read,
        },
    })
}

/// Open `path` for inspection: a folder as a dump tree (else a whole-step producer's),
/// a file as its own values (else a whole-step producer's file).
///
/// Errors: a folder no producer recognises, a file that cannot be decoded (each named).
pub fn inspect(path: &Path) -> Result<Inspected> {
    if crate::formats::source::is_dir(path) {
        return DumpTree::discover(path)
            .map(Inspected::Tree)
            .or_else(|e| stack_view(path).ok_or(e))
            .map_err(|e| {
                // A folder named like a file (`x.pt/`, e.g. an unzipped archive) is most likely
                // not meant as a dump tree: say what it is rather than only what is missing.
                match (FileFormat::from_path(path), e) {
                    (Some(f), Error::Format { .. }) => Error::format(
                        path,
                        Position::File,
                        format!(
                            "is a directory, not a .{} file, and holds no dump folders \
                         (trajectory/, forward_data/, loss/ …)",
                            f.extension()
                        ),
                    ),
                    (_, e) => e,
                }
            });
    }
    let value = match read_any(path) {
        Ok(v) => v,
        Err(e) => return stack_view(path).ok_or(e),
    };
    let size = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Some(m.len()),
        _ => None,
    };
    Ok(Inspected::File {
        path: path.to_path_buf(),
        size,
        outline: outline(&value),
    })
}
