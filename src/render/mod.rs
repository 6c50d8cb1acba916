//! The one output layer: every tool's report model turned into text of one format.
//!
//! One [`Renderer`] trait generic over the report type, one [`Format`] vocabulary, one
//! [`by_name`]; a folder per tool (`logscan/`, `dumpdiff/`, `losscheck/`, `postmortem/`)
//! holding one file per format. Tools never import this module: the binaries call
//! tool → report → renderer. Plots (`plot`, `axis`) are drawn here too.

pub mod axis;
pub mod dumpdiff;
pub mod logscan;
pub mod losscheck;
pub mod mismatch;
pub mod plot;
pub mod postmortem;

use crate::error::Result;

/// Turns a report of type `R` into text of one format.
pub trait Renderer<R: ?Sized> {
    /// The report rendered in this format.
    fn render(&self, report: &R) -> Result<String>;
}

/// Format of what goes to stdout; the same three words in every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable text for a terminal.
    Table,
    /// The JSON report (with `schema_version`), as `--output` writes it.
    Json,
    /// A Markdown document, for a PR comment or an issue.
    #[value(alias = "md")]
    Markdown,
}

impl Format {
    /// The format's name as `--format` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Json => "json",
            Format::Markdown => "markdown",
        }
    }
}

/// How the terminal table looks: colour, and the width to fit (`None`: a pipe or file gets
/// the full table). The caller (the command line) decides both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Style {
    /// Colour severities and verdicts.
    pub color: bool,
    /// Columns the table must fit.
    pub width: Option<usize>,
}

/// A report type with a renderer for each [`Format`].
pub trait Rendered {
    /// This report's renderer for `format`.
    fn renderer(format: Format, style: Style) -> Box<dyn Renderer<Self>>;
}

/// The renderer of report type `R` for `format`.
pub fn by_name<R: Rendered>(format: Format, style: Style) -> Box<dyn Renderer<R>> {
    R::renderer(format, style)
}

/// The widest line of `text` in characters (every glyph the tables use is one column wide).
pub fn text_width(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// Pretty-printed JSON of a Serialize report (no trailing newline), shared by every
/// `json.rs`.
fn pretty_json<R: serde::Serialize + ?Sized>(report: &R) -> Result<String> {
    serde_json::to_string_pretty(report)
        .map_err(|e| crate::error::Error::Internal(format!("serialising report: {e}")))
}

/// `2 cells could not be read (2 files, exit 2)`, for the first line of dumpdiff's and
/// losscheck's reports: a per-rank file stands for its cell, a whole-batch file (trajectory,
/// old_log_probs, datums) is counted apart.
pub fn unreadable_count(unreadable: &[crate::model::unreadable::Unreadable]) -> String {
    use crate::fmt::plural;
    let cells: std::collections::BTreeSet<(Option<u32>, Option<u32>)> = unreadable
        .iter()
        .filter(|u| u.rank.is_some())
        .map(|u| (u.rank, u.micro))
        .collect();
    let whole = unreadable.iter().filter(|u| u.rank.is_none()).count();
    let mut what = Vec::new();
    if !cells.is_empty() {
        what.push(format!("{} could not be read", plural(cells.len(), "cell")));
    }
    if whole > 0 {
        what.push(format!(
            "{} could not be read",
            plural(whole, "whole-batch file")
        ));
    }
    format!(
        "{} ({}, exit 2)",
        what.join(", "),
        plural(unreadable.len(), "file")
    )
}
