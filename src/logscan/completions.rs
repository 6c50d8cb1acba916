//! The completions inputs of a scan: which of the given paths (and of the files in given
//! folders) hold generated completions rather than metrics, read them, and judge them
//! with [`crate::detect::completions_text`] next to the metrics of the same scan.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::detect::{completions_text, Finding};
use crate::error::{Error, Position, Result};
use crate::frames::log::frame::LogFrame;
use crate::logs::completions::{self, CompletionFile, CompletionsFormat};
use crate::model::log::FileStats;

/// A completions file and its layout.
pub type CompletionPath = (PathBuf, CompletionsFormat);

/// The layout of a regular file that holds completions (a pipe is never sniffed: its
/// first bytes could not be read twice).
fn sniff_file(path: &Path) -> Result<Option<CompletionsFormat>> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let mut head = Vec::new();
    std::fs::File::open(path)
        .map_err(|e| Error::io(path, e))?
        .take(4096)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    Ok(completions::sniff(path, &head))
}

/// Split the command-line paths into metric logs (expanded as
/// [`super::scan::expand_paths`] does) and completions files. A folder holding only
/// completions (TRL's `completions/`, W&B's `media/table/`) is not "a folder without logs".
pub fn split_paths(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<CompletionPath>)> {
    let mut logs = Vec::new();
    let mut found: Vec<PathBuf> = Vec::new();
    for p in paths {
        if crate::logs::input::is_dir(p) {
            let inside = completions::find_in_dir(p);
            match super::scan::expand_paths(std::slice::from_ref(p)) {
                Ok(v) => logs.extend(v),
                Err(Error::Usage(_)) if !inside.is_empty() => {}
                Err(e) => return Err(e),
            }
            found.extend(inside);
        } else {
            logs.push(p.clone());
        }
    }
    let mut out = Vec::new();
    let mut kept = Vec::new();
    for f in logs {
        match sniff_file(&f)? {
            Some(fmt) => out.push((f, fmt)),
            None => kept.push(f),
        }
    }
    for f in found {
        if out.iter().any(|(p, _)| *p == f) {
            continue;
        }
        match sniff_file(&f)? {
            Some(fmt) => out.push((f, fmt)),
            None => {
                return Err(Error::format(
                    &f,
                    Position::File,
                    "named like a completions table but not one (no completion column)",
                ))
            }
        }
    }
    Ok((kept, out))
}

/// Read every completions file. A file that yields no completion is an error naming it:
/// a scan must not answer "no findings" about text it never saw.
pub fn read_all(files: &[CompletionPath]) -> Result<Vec<CompletionFile>> {
    let mut out = Vec::with_capacity(files.len());
    for (p, fmt) in files {
        let f = completions::read(p, *fmt)?;
        if f.items.is_empty() {
            return Err(Error::format(
                p,
                Position::File,
                format!("{}: 0 completions read: nothing to judge", fmt.name()),
            ));
        }
        out.push(f);
    }
    Ok(out)
}

/// The completions in the text summaries of the event files read (verl logs its
/// validation generations with `add_text`): a file whose texts hold none adds nothing.
pub fn from_text_summaries(files: &[FileStats]) -> Result<Vec<CompletionFile>> {
    let mut out = Vec::new();
    for st in files.iter().filter(|f| f.text_summaries > 0) {
        let f = completions::read(&st.path, CompletionsFormat::TensorboardText)?;
        if !f.items.is_empty() {
            out.push(f);
        }
    }
    Ok(out)
}

/// Each completions file as a line of the report's file list.
pub fn file_stats(files: &[CompletionFile]) -> Vec<FileStats> {
    files
        .iter()
        .map(|f| FileStats {
            path: f.path.clone(),
            format: format!("{} ({} completions)", f.format.name(), f.items.len()),
            bytes: std::fs::metadata(&f.path).map(|m| m.len()).unwrap_or(0),
            records: f.items.len() as u64,
            ..FileStats::default()
        })
        .collect()
}

/// The completions findings, judged with the metrics of `frame` (empty when only
/// completions were given).
pub fn findings(files: &[CompletionFile], frame: &LogFrame) -> Vec<Finding> {
    let frame = (!frame.is_empty()).then_some(frame);
    completions_text::detect(files, frame)
}

/// Add the completions findings of `files` to `findings` (worst first again) and make
/// the metric findings' causes agree with them. They have no flag of their own: they run
/// with every detector, or with `--empty-completions` / `--truncation` (`selected`), the
/// metric families they extend.
pub fn merge(
    findings: &mut Vec<Finding>,
    files: &[CompletionFile],
    frame: &LogFrame,
    selected: &[String],
) {
    let wanted = selected.is_empty()
        || selected
            .iter()
            .any(|d| d == "empty-completions" || d == "truncation");
    if !wanted {
        return;
    }
    findings.extend(self::findings(files, frame));
    completions_text::reconcile(findings);
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.run.cmp(&b.run))
            .then(a.first_step.cmp(&b.first_step))
    });
}

/// With `--why`, keep the metrics the hypothesis table reads even when detector flags
/// narrow the frame.
pub fn keep_for_why(mut opts: super::ScanOptions) -> super::ScanOptions {
    if opts.why {
        for m in crate::detect::hypotheses::TABLE_METRICS {
            if !opts.also_keep.iter().any(|k| k == m) {
                opts.also_keep.push(m.to_string());
            }
        }
    }
    opts
}

/// For serde: a zero count is left out of the JSON report.
pub fn is_zero(n: &usize) -> bool {
    *n == 0
}
