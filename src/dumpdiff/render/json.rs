//! The JSON report (`schema_version`, every metric): the report model serialised as is.

use super::Renderer;
use crate::dumpdiff::report::Report;
use crate::error::{Error, Result};

/// Pretty-printed JSON of the whole report.
pub struct JsonRenderer;

impl Renderer for JsonRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut s = serde_json::to_string_pretty(report)
            .map_err(|e| Error::Usage(format!("cannot serialise the report: {e}")))?;
        s.push('\n');
        Ok(s)
    }
}
