//! The machine-readable JSON report (carries `schema_version`).

use super::Renderer;
use crate::error::{Error, Result};
use crate::logscan::ScanReport;

/// Pretty-printed JSON of the whole report.
pub struct JsonRenderer;

impl Renderer for JsonRenderer {
    fn render(&self, report: &ScanReport) -> Result<String> {
        serde_json::to_string_pretty(report)
            .map_err(|e| Error::Usage(format!("serialising report: {e}")))
    }
}

impl JsonRenderer {
    /// The JSON text of `report` (same as [`Renderer::render`]).
    pub fn render_report(&self, report: &ScanReport) -> Result<String> {
        self.render(report)
    }
}
