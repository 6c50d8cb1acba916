//! mismatch's JSON report (`schema_version` 1), as `--format json` prints it: the report
//! model serialised as is (non-finite numbers as `null`, serde_json's rule).

use crate::error::Result;
use crate::mismatch::report::Report;
use crate::render::Renderer;

/// Pretty-printed JSON, newline-terminated.
pub struct JsonRenderer;

impl Renderer<Report> for JsonRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        Ok(crate::render::pretty_json(report)? + "\n")
    }
}
