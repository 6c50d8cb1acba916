//! What the four binaries share on the command line: one flag vocabulary (`--format`,
//! `--color`, `--fail-on`, `-q`), the exit-code paragraph every `--help` ends with, `-` for
//! stdin, and stdout writing that ends quietly when the reader went away (`| head`), keeping
//! the command's verdict as its exit code.

pub mod dumpdiff;
pub mod logscan;
pub mod losscheck;
pub mod mismatch;
pub mod model_compare;
pub mod postmortem;
pub mod sides;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use crate::model::finding::Severity;

/// The last paragraph of every `--help`: the exit codes of SPEC §1.
pub const EXIT_CODES_HELP: &str = "Exit codes:\n  0  checked, nothing at or above --fail-on\n  1  checked, something beyond tolerance or a finding at or above --fail-on\n  2  usage error, unreadable input, or nothing could be read (the message says what was seen)";

/// `Examples:` followed by the given command lines, then [`EXIT_CODES_HELP`]: the text every
/// `--help` ends with.
pub fn help_tail(examples: &[&str]) -> String {
    let mut s = String::from("Examples:\n");
    for e in examples {
        s.push_str("  ");
        s.push_str(e);
        s.push('\n');
    }
    s.push('\n');
    s.push_str(EXIT_CODES_HELP);
    s
}

pub use crate::render::Format;

/// When to colour stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Color {
    /// When stdout is a terminal and `NO_COLOR` is unset or empty.
    #[default]
    Auto,
    /// Always, even in a pipe or with `NO_COLOR` set.
    Always,
    /// Never.
    Never,
}

impl Color {
    /// Whether to colour stdout now: `auto` follows the terminal and `NO_COLOR`
    /// (<https://no-color.org>: set and not empty turns colour off).
    pub fn enabled(self) -> bool {
        match self {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => {
                let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
                !no_color && std::io::stdout().is_terminal()
            }
        }
    }
}

/// The lowest severity that makes the exit code 1; the same words in every command
/// (`warn` and `fail` are accepted for `warning` and `error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum FailOn {
    /// Any finding, even one only worth knowing.
    Info,
    /// A warning or worse.
    #[value(alias = "warn")]
    Warning,
    /// An error or worse: a divergence beyond tolerance, an inconsistent loss.
    #[value(alias = "fail")]
    Error,
    /// Only broken numbers (NaN/inf).
    Critical,
}

impl FailOn {
    /// The finding severity with the same name, the one scale every tool compares
    /// against (dumpdiff: `warning` and below stop on a WARN verdict, `error` and above
    /// on a FAIL).
    pub fn severity(self) -> Severity {
        match self {
            FailOn::Info => Severity::Info,
            FailOn::Warning => Severity::Warning,
            FailOn::Error => Severity::Error,
            FailOn::Critical => Severity::Critical,
        }
    }
}

/// Flags every command has besides `--format`, `--output` and `--fail-on` (whose help and
/// defaults differ per command): `--color` and `-q`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CommonFlags {
    /// Colour stdout: auto (a terminal without NO_COLOR), always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value = "auto")]
    pub color: Color,
    /// Print nothing on stdout: the exit code (and any --output file) says it all.
    /// Errors still go to stderr.
    #[arg(short, long)]
    pub quiet: bool,
}

/// The width tables must fit: `COLUMNS` when set to a number, else the terminal's width
/// when stdout is one, else `None` (a pipe or file gets the full table).
pub fn terminal_width() -> Option<usize> {
    if let Some(c) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return Some(c);
    }
    comfy_table::Table::new().width().map(usize::from)
}

/// `-` means standard input: the path to open for it (`/dev/stdin`, which the readers
/// treat as a pipe); any other path is returned unchanged.
pub fn stdin_path(p: &Path) -> PathBuf {
    if p.as_os_str() == "-" {
        PathBuf::from("/dev/stdin")
    } else {
        p.to_path_buf()
    }
}

/// What writing to stdout came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Everything was written.
    All,
    /// The reader closed the pipe (`| head -c 1`): stop quietly, keep the verdict's exit code.
    ReaderGone,
}

/// Write `text` to stdout and flush. A closed pipe is [`Written::ReaderGone`], not an error;
/// any other failure (a full disk behind `>`) is returned.
pub fn write_stdout(text: &str) -> std::io::Result<Written> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(Written::All),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Written::ReaderGone),
        Err(e) => Err(e),
    }
}

/// Print `text` (unless `quiet`) and return `code`. A closed pipe (`| head -1`) ends quietly
/// with the same `code`: the verdict was reached, and `set -o pipefail` scripts must still
/// see a FAIL as exit 1. A failed write (a full disk behind `>`) is exit 2 with the reason on
/// stderr.
pub fn finish(tool: &str, text: &str, quiet: bool, code: u8) -> u8 {
    if quiet || text.is_empty() {
        return code;
    }
    match write_stdout(text) {
        Ok(Written::All) => code,
        Ok(Written::ReaderGone) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{tool}: writing to stdout: {e}");
            crate::exit_codes::EXIT_BAD_INPUT
        }
    }
}

/// Report an error on stderr as `tool: message` and return exit 2.
pub fn fail(tool: &str, err: &dyn std::fmt::Display) -> u8 {
    let _ = writeln!(std::io::stderr(), "{tool}: {err}");
    crate::exit_codes::EXIT_BAD_INPUT
}

/// Parse `args` (the first item is the program name, as in `std::env::args_os`); on
/// `--help`/`--version` print clap's text (a closed pipe is fine) and return its exit code 0,
/// on a usage error print clap's message and return its exit code 2.
pub fn parse_from<P, I, T>(args: I) -> Result<P, u8>
where
    P: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    P::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        u8::try_from(e.exit_code()).unwrap_or(crate::exit_codes::EXIT_BAD_INPUT)
    })
}
