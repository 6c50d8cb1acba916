//! A dump file set aside because it could not be read: one bad file never sinks a run
//! (dumpdiff and losscheck judge every other cell and exit 2 with their report).

use std::path::PathBuf;

use serde::Serialize;

/// A dump file that could not be read, with the reader's reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    /// The side it belongs to (`self-hosted`, `weaver`, `remote-api`, or the tree's role).
    pub role: String,
    /// The file.
    pub path: PathBuf,
    /// Its kind folder (`loss`, `forward_data`, …).
    pub kind: String,
    /// Its rank, when per-rank.
    pub rank: Option<u32>,
    /// Its micro, when per-micro.
    pub micro: Option<u32>,
    /// Why it could not be read (the reader's error, naming file and position).
    pub reason: String,
    /// The file was read, but the tool's picture of the step cannot use it
    /// ([`crate::error::Error::CannotJudge`]): its cell is reported "cannot judge" (a
    /// warning), not unreadable.
    #[serde(skip)]
    pub cannot_judge: bool,
}
