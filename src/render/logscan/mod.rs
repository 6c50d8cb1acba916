//! logscan's [`ScanReport`] in each format: the terminal table, JSON, markdown.

pub mod compare;
pub mod hypotheses;
pub mod json;
pub mod markdown;
pub mod table;

use super::{Format, Rendered, Renderer, Style};
use crate::logscan::ScanReport;

impl Rendered for ScanReport {
    fn renderer(format: Format, style: Style) -> Box<dyn Renderer<Self>> {
        match format {
            Format::Table => Box::new(hypotheses::WithWhy {
                inner: table::TableRenderer {
                    color: style.color,
                    width: style.width,
                },
                markdown: false,
            }),
            Format::Json => Box::new(json::JsonRenderer),
            Format::Markdown => Box::new(hypotheses::WithWhy {
                inner: markdown::MarkdownRenderer,
                markdown: true,
            }),
        }
    }
}
