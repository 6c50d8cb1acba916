//! The postmortem written out: `report.md`, `report.html`, `summary.json` and the plots in
//! one folder (`--output DIR` itself, or `reports/<run-name>/` by default).

pub mod html;
pub mod json;
pub mod markdown;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::postmortem::{PlotRef, Postmortem};
use crate::render::Renderer;

/// Files written by [`write_report`].
#[derive(Debug, Clone)]
pub struct Written {
    /// The folder written into.
    pub dir: PathBuf,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
}

/// Write `report.md`, `report.html`, `summary.json` and the plots into `dir` itself
/// (created if absent; files of the same name are replaced), and return the paths.
pub fn write_report(pm: &Postmortem, dir: &Path) -> Result<Written> {
    let dir = dir.to_path_buf();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut pm = pm.clone();
    let mut files = Vec::new();
    let panels = super::plot::panels(&pm.frame, &pm.findings);
    let crash = pm.crash_step();
    let mut pngs: Vec<(PlotRef, Vec<u8>)> = Vec::new();
    for p in &panels {
        let png = format!("plot-{}.png", p.key);
        let svg = format!("plot-{}.svg", p.key);
        let png_path = dir.join(&png);
        super::plot::write_panel(&png_path, p, crash)?;
        super::plot::write_panel(&dir.join(&svg), p, crash)?;
        let bytes = std::fs::read(&png_path).map_err(|e| Error::io(&png_path, e))?;
        files.push(png_path);
        files.push(dir.join(&svg));
        let r = PlotRef {
            key: p.key.to_string(),
            title: p.title.clone(),
            png,
            svg,
        };
        pm.plots.push(r.clone());
        pngs.push((r, bytes));
    }
    let write = |name: &str, text: &str, files: &mut Vec<PathBuf>| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| Error::io(&p, e))?;
        files.push(p);
        Ok(())
    };
    write("summary.json", &json::JsonRenderer.render(&pm)?, &mut files)?;
    write(
        "report.md",
        &markdown::MarkdownRenderer.render(&pm)?,
        &mut files,
    )?;
    let page = html::HtmlRenderer { pngs: &pngs }.render(&pm)?;
    write("report.html", &page, &mut files)?;
    Ok(Written { dir, files })
}
