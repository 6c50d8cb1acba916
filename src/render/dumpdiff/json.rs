//! The JSON report (`schema_version`, every metric): the report model serialised as is.

use crate::dumpdiff::report::Report;
use crate::error::Result;
use crate::render::Renderer;

/// Pretty-printed JSON of the whole report, newline-terminated.
pub struct JsonRenderer;

impl Renderer<Report> for JsonRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        Ok(crate::render::pretty_json(report)? + "\n")
    }
}
