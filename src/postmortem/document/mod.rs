//! The postmortem as one document, built once from a [`Postmortem`] and written as
//! `report.md` and `report.html` by `render::postmortem`: a header (title, headline,
//! facts) and a list of blocks (headings, paragraphs, lists, tables, code, plots).
//!
//! Every number and word is decided here; the writers only lay blocks out. Where today's
//! two reports say a thing differently (the crash summary, the offending batch, the
//! findings' last column, the order of the header facts), the document holds one block per
//! format, marked [`Block::Only`], so both stay byte-identical to what they were.

mod build;
mod dumps;
mod words;

pub use words::{at_cell, cell, opt_num, stats, status_word, step_cells, GRID_LEGEND};

use super::{PlotRef, Postmortem};

/// The report's two output formats, for the few blocks only one of them shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// `report.md`.
    Markdown,
    /// `report.html`.
    Html,
}

/// A run of text with one style.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Inline {
    /// Plain text (markdown writes it as is).
    Text(String),
    /// The report's own fixed words, written as they are by both formats (HTML does not
    /// escape them: they hold no markup, and an apostrophe stays one).
    Fixed(String),
    /// Text that must stay on one line: markdown writes `|` as `\|` and line breaks as
    /// spaces (a table cell, a message quoted in a list).
    Flat(String),
    /// Code (`` `x` `` / `<code>`).
    Code(String),
    /// Bold text, on one line (markdown escapes it as [`Inline::Flat`]).
    Strong(String),
    /// Bold text with an HTML class (a verdict coloured by severity).
    Badge {
        /// The text.
        text: String,
        /// HTML class.
        class: String,
    },
    /// Text whose backtick pairs are code spans (markdown keeps them, HTML turns them into
    /// `<code>`).
    Marked(String),
    /// A break between two parts of one paragraph (` — ` in markdown, `<br />` in HTML).
    Break,
}

/// A list item, with an optional nested list.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Item {
    /// The item's text.
    pub text: Vec<Inline>,
    /// A nested list under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<Vec<Inline>>>,
}

/// A table cell.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cell {
    /// The cell's text.
    pub text: Vec<Inline>,
    /// A number: right-aligned, monospace in HTML.
    pub num: bool,
    /// A header cell in a body row (HTML `<th>`).
    pub head: bool,
    /// HTML class (`sev-error`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// A table row.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    /// HTML class of the row (`origin-trainer`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The cells.
    pub cells: Vec<Cell>,
}

/// A table: a header row (none for a key/value table) and body rows.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Table {
    /// HTML class (`steps`: header words may break after `_`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Scrolls sideways when wider than the page (HTML).
    pub wide: bool,
    /// Column names.
    pub header: Vec<String>,
    /// Body rows.
    pub rows: Vec<Row>,
}

/// One block of the document.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "block", rename_all = "snake_case")]
pub enum Block {
    /// A section heading (level 2) or sub-heading (3); `id` is the HTML anchor.
    Heading {
        /// 2 or 3.
        level: u8,
        /// HTML anchor.
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The heading text.
        text: Vec<Inline>,
    },
    /// A paragraph.
    Paragraph {
        /// Its text.
        text: Vec<Inline>,
    },
    /// A side remark (`(legend)` in markdown, `<small>` in HTML).
    Small {
        /// Its text.
        text: String,
    },
    /// A bulleted or numbered list (an empty one still opens and closes in HTML).
    List {
        /// Numbered.
        ordered: bool,
        /// The items.
        items: Vec<Item>,
    },
    /// A table.
    Table(Table),
    /// A block of code or a traceback (`sh` for a command line).
    Pre {
        /// Markdown fence language.
        #[serde(skip_serializing_if = "Option::is_none")]
        lang: Option<String>,
        /// The text.
        text: String,
    },
    /// One exception line `Type: message` (inline code in markdown, `<pre>` in HTML).
    ExceptionLine {
        /// The line.
        text: String,
    },
    /// Notes: markdown quotes, one per note; an HTML list (nothing when empty).
    Notes {
        /// One line each.
        notes: Vec<String>,
    },
    /// The plots written beside the report.
    Plots {
        /// Each plot's files.
        plots: Vec<PlotRef>,
    },
    /// Blocks only one format shows.
    Only {
        /// The format.
        target: Target,
        /// Its blocks.
        blocks: Vec<Block>,
    },
}

/// A fact of the header (`status: crashed`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fact {
    /// Name.
    pub key: String,
    /// Value.
    pub value: String,
    /// Written after the value (outside markdown's code span, inside HTML's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// How markdown shows the value (HTML shows every value as code).
    pub style: FactStyle,
    /// Shown by one format only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub only: Option<Target>,
}

/// How markdown shows a fact's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FactStyle {
    /// As is.
    Plain,
    /// Bold.
    Strong,
    /// Code.
    Code,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Document {
    /// The run's name (`Postmortem: NAME`).
    pub title: String,
    /// `crashed`, `completed`, … (the HTML page's class).
    pub status: String,
    /// One sentence: what happened.
    pub headline: String,
    /// Status, input, start, steps, config.
    pub facts: Vec<Fact>,
    /// The sections, in order.
    pub blocks: Vec<Block>,
}

impl Document {
    /// The document of `pm`.
    pub fn of(pm: &Postmortem) -> Document {
        build::document(pm)
    }
}

/// Plain text.
pub fn text(s: impl Into<String>) -> Inline {
    Inline::Text(s.into())
}

/// A paragraph of inlines.
pub fn para(text: Vec<Inline>) -> Block {
    Block::Paragraph { text }
}

/// A heading.
pub fn heading(level: u8, id: Option<&str>, text: Vec<Inline>) -> Block {
    Block::Heading {
        level,
        id: id.map(str::to_string),
        text,
    }
}

/// A list of one-inline-run items.
pub fn list(ordered: bool, items: Vec<Vec<Inline>>) -> Block {
    Block::List {
        ordered,
        items: items
            .into_iter()
            .map(|text| Item {
                text,
                children: None,
            })
            .collect(),
    }
}

impl Cell {
    /// A text cell.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::of(vec![Inline::Flat(s.into())])
    }

    /// A numeric cell.
    pub fn num(s: impl Into<String>) -> Cell {
        Cell {
            num: true,
            ..Cell::text(s)
        }
    }

    /// A cell of inlines.
    pub fn of(text: Vec<Inline>) -> Cell {
        Cell {
            text,
            num: false,
            head: false,
            class: None,
        }
    }

    /// The cell with an HTML class.
    pub fn class(self, class: impl Into<String>) -> Cell {
        Cell {
            class: Some(class.into()),
            ..self
        }
    }
}

impl Row {
    /// A row of cells.
    pub fn of(cells: Vec<Cell>) -> Row {
        Row { class: None, cells }
    }
}

impl Table {
    /// A plain table with `header`.
    pub fn new(header: &[&str], rows: Vec<Row>) -> Table {
        Table {
            class: None,
            wide: false,
            header: header.iter().map(|h| h.to_string()).collect(),
            rows,
        }
    }
}
