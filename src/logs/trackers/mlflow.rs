//! MLflow file store (`mlruns/<experiment>/<run>/`): one text file per metric under
//! `metrics/` (the key's `/` become sub-folders), each line `<timestamp ms> <value>
//! <step>`, NaN written `nan`; parameters one file per key under `params/`. The SQLite
//! backend (`mlflow.db`) is read by [`super::sqlite`].

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::rows::RowWriter;
use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, SourceKind};

/// The run folder and the metric key of a file under `<run>/metrics/` (the run folder
/// holds `meta.yaml`), or `None` when `path` is not an MLflow metric file.
pub fn metric_key(path: &Path) -> Option<(PathBuf, String)> {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = path;
    while let Some(parent) = cur.parent() {
        parts.push(cur.file_name()?.to_string_lossy().to_string());
        if parent.file_name().is_some_and(|n| n == "metrics") {
            let run = parent.parent()?;
            if run.join("meta.yaml").is_file() {
                parts.reverse();
                return Some((run.to_path_buf(), parts.join("/")));
            }
            return None;
        }
        cur = parent;
    }
    None
}

/// Stream one metric file's lines into `w`, one row per line (the file's key interned
/// once, when its first row is handed on: no `String` per line).
pub fn read(path: &Path, input: impl Read, stats: &mut FileStats, w: &mut RowWriter) -> Result<()> {
    let (_, key) = metric_key(path).ok_or_else(|| {
        Error::format(
            path,
            Position::File,
            "not an MLflow metric file (expected <run>/metrics/<key> beside <run>/meta.yaml)",
        )
    })?;
    let mut r = BufReader::new(input);
    let mut line = String::new();
    let mut n: u64 = 0;
    let mut id = None;
    loop {
        line.clear();
        let got = r.read_line(&mut line).map_err(|e| Error::io(path, e))?;
        if got == 0 {
            break;
        }
        n += 1;
        stats.bytes += got as u64;
        // MLflow ends every line with a newline: a last line without one was cut by a
        // crash mid-write (its value or step may be partial) and is not read.
        if !line.ends_with('\n') {
            stats.truncated_last_line = true;
            stats.bad_line(n, format!("last line cut short: {:?}", line.trim()));
            continue;
        }
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let mut it = t.split_ascii_whitespace();
        let (Some(ts), Some(v), step) = (it.next(), it.next(), it.next()) else {
            stats.bad_line(n, format!("expected `timestamp value step`, found {t:?}"));
            continue;
        };
        let (Ok(ts), Ok(v)) = (ts.parse::<f64>(), v.parse::<f64>()) else {
            stats.bad_line(n, format!("expected numbers, found {t:?}"));
            continue;
        };
        // Files from MLflow before 1.0 have no step: the line order is the step.
        let step = match step.map(str::parse::<i64>) {
            Some(Ok(s)) => s,
            None => n as i64 - 1,
            Some(Err(_)) => {
                stats.bad_line(n, format!("step is not an integer in {t:?}"));
                continue;
            }
        };
        stats.records += 1;
        stats.non_finite += (!v.is_finite()) as u64;
        let id = *id.get_or_insert_with(|| w.keys.id_str(&key));
        w.uncounted_row(
            Some(step),
            Some(ts / 1000.0),
            SourceKind::Mlflow,
            n,
            &[(id, v)],
        );
    }
    stats.lines = n;
    Ok(())
}

/// The run's parameters (`params/<key>`, the file's text) as `key → value`.
pub fn params(run: &Path, out: &mut BTreeMap<String, String>) -> Result<()> {
    let root = run.join("params");
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
                let key = p
                    .strip_prefix(&root)
                    .map(|k| k.to_string_lossy().replace('\\', "/"))
                    .unwrap_or_default();
                out.insert(key, text.trim().to_string());
            }
        }
    }
    Ok(())
}
