//! The machine-readable JSON report (carries `schema_version`).

use crate::error::Result;
use crate::logscan::ScanReport;
use crate::render::Renderer;

/// Pretty-printed JSON of the whole report.
pub struct JsonRenderer;

impl Renderer<ScanReport> for JsonRenderer {
    fn render(&self, report: &ScanReport) -> Result<String> {
        crate::render::pretty_json(report)
    }
}
