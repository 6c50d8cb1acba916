//! `summary.json`: the whole [`Postmortem`] serialised (`schema_version`), newline-terminated.

use crate::error::Result;
use crate::postmortem::Postmortem;
use crate::render::Renderer;

/// Pretty-printed JSON of the postmortem.
pub struct JsonRenderer;

impl Renderer<Postmortem> for JsonRenderer {
    fn render(&self, pm: &Postmortem) -> Result<String> {
        Ok(crate::render::pretty_json(pm)? + "\n")
    }
}
