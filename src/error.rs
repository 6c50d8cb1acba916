//! One error type for the library: every message names the file and the position
//! (byte offset, line, zip member, pickle opcode offset) so a user knows where to look.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in an input a problem was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Nowhere more precise than the file itself.
    File,
    /// A byte offset from the start of the file.
    Byte(u64),
    /// A 1-based line number (JSONL, text logs).
    Line(u64),
    /// A 1-based line and a 1-based column inside it.
    LineColumn(u64, u64),
    /// A member of a zip archive (`.pt`, `.npz`).
    Member(String),
    /// A pickle opcode at a byte offset inside a zip member (`data.pkl`).
    PickleOp { member: String, offset: u64 },
    /// A key path inside a nested value, e.g. `trajectories[3].tokens`.
    Key(String),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::File => write!(f, "file"),
            Position::Byte(b) => write!(f, "byte {b}"),
            Position::Line(l) => write!(f, "line {l}"),
            Position::LineColumn(l, c) => write!(f, "line {l}, column {c}"),
            Position::Member(m) => write!(f, "zip member {m}"),
            Position::PickleOp { member, offset } => {
                write!(f, "zip member {member}, pickle opcode at byte {offset}")
            }
            Position::Key(k) => write!(f, "key {k}"),
        }
    }
}

/// A problem in the bytes of an input, before the file name is attached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pos}: {msg}")]
pub struct FormatError {
    /// Where the problem is.
    pub pos: Position,
    /// What is wrong, in words a user can act on.
    pub msg: String,
}

impl FormatError {
    /// A format error at `pos`.
    pub fn new(pos: Position, msg: impl Into<String>) -> Self {
        FormatError {
            pos,
            msg: msg.into(),
        }
    }

    /// Attach the file this error was found in.
    pub fn in_file(self, path: &Path) -> Error {
        Error::Format {
            path: path.to_path_buf(),
            pos: self.pos,
            msg: self.msg,
        }
    }
}

/// Every error the library returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but its content is not what its format promises.
    #[error("{path}: {pos}: {msg}", path = path.display())]
    Format {
        path: PathBuf,
        pos: Position,
        msg: String,
    },
    /// The arguments do not make sense together (a flag's value, a missing flag, two flags
    /// that exclude each other). Never for input that exists but cannot be used: that is
    /// [`Error::Input`].
    #[error("{0}")]
    Usage(String),
    /// An input path is missing, empty, or holds nothing the tool can use (no dump file of
    /// the step, only empty logs); `path` names it, `msg` says what was seen.
    #[error("{path}: {msg}", path = path.display())]
    Input { path: PathBuf, msg: String },
    /// The file was read, but the tool's picture of the step cannot use it (rows that
    /// neither ids, log-probs nor order place): its cell is "cannot judge", a warning,
    /// never a failure nor an input error (issue 28).
    #[error("{path}: cannot judge: {msg}", path = path.display())]
    CannotJudge { path: PathBuf, msg: String },
    /// A Parquet/polars export failed.
    #[error("{path}: {msg}", path = path.display())]
    Export { path: PathBuf, msg: String },
    /// A failure that is not the input's fault (a library call on data already checked,
    /// serialising a report): a bug to report, still exit 2 and never a panic.
    #[error("internal error: {0} (please report it)")]
    Internal(String),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// An unusable input at `path`.
    pub fn input(path: &Path, msg: impl Into<String>) -> Self {
        Error::Input {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }

    /// A failure that is not the input's fault.
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        Error::Internal(msg.to_string())
    }

    /// A format error in `path` at `pos`.
    pub fn format(path: &Path, pos: Position, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.to_path_buf(),
            pos,
            msg: msg.into(),
        }
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a path of type `ft` is when it holds no bytes to read to an end ("a directory",
/// "a socket", "a device": `/dev/zero` never ends), or `None` for a file or a FIFO: the
/// one refusal the dump readers and the log readers share, named in their errors.
pub fn not_a_file(ft: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    if ft.is_dir() {
        Some("a directory")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_block_device() || ft.is_char_device() {
        Some("a device")
    } else {
        None
    }
}
