//! Logs in a store read as a local folder (issue 33): a URL given where a log file, a run
//! folder, a folder of runs or a crash bundle is taken is *localised* — the prefix is
//! listed (one LIST per level, as a folder is walked), the objects a log reader could
//! read are fetched whole (one GET each, in parallel) into a private temporary folder
//! laid out as the prefix, and the tool scans that folder with its local rules, unchanged.
//! Every output is then given back with the temporary paths replaced by the URLs
//! ([`Localised::to_urls`], [`Localised::error_to_urls`]): the user never sees the copy.
//!
//! Why a copy rather than reading through the store: logs are read whole anyway (no
//! reader of a log seeks), SQLite needs a real file, TensorBoard/W&B/MLflow folders are
//! found by walking, and the completions and tracker sniffers open files by path. One
//! copy keeps every rule of the local scan (which file is a log, which folder is a run)
//! in one place.
//!
//! **What is fetched** ([`wanted`]): objects named as a log, tracker, completions, crash
//! bundle or run config file is named — `*.jsonl`, `*.ndjson`, `*.log`, `*.txt`, `*.out`,
//! `*.db`, `*.sqlite(3)`, `*.wandb`, `*tfevents*`, `*.csv` and `*.parquet` at a run's top
//! (the prefix's or a sub-prefix's) and `completions_*.parquet` anywhere, the JSON and YAML
//! files the readers name (`trainer_state.json`, `run_metadata.json`, `context.json`,
//! `extra.json`, `wandb-summary.json`, `wandb-metadata.json`, `*.table.json`,
//! `config.yaml`, `meta.yaml`) and MLflow's `metrics/`, `params/`, `tags/` files. The
//! name is decided from the listing, before any GET: a checkpoint, a dump or an image
//! under the prefix is never fetched, and is listed in [`Localised::skipped`] (the
//! commands print one line about them on stderr). Bytes fetched are counted by
//! [`crate::formats::source::stats`] (`--stats`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::formats::source;

/// Levels of sub-prefixes walked below a URL (a W&B run's `files/media/table/` is 4
/// below the run, a folder of runs adds one).
pub const MAX_DEPTH: usize = 8;

/// URL inputs copied into a private temporary folder, and how to speak of the copy in
/// terms of the URLs again. The folder is removed when this is dropped.
#[derive(Debug, Default)]
pub struct Localised {
    /// The inputs to hand the tool: local paths as given, URLs replaced by their copies.
    pub paths: Vec<PathBuf>,
    /// Objects under a prefix that were not fetched (not named as anything a log reader
    /// reads), as (URL, size in bytes).
    pub skipped: Vec<(String, u64)>,
    /// (copy's path, URL) per URL input, longest copy path first.
    roots: Vec<(String, String)>,
    /// The temporary folder (None when no input was a URL).
    tmp: Option<PathBuf>,
}

impl Drop for Localised {
    fn drop(&mut self) {
        if let Some(t) = &self.tmp {
            let _ = std::fs::remove_dir_all(t);
        }
    }
}

impl Localised {
    /// True when some input was a URL (outputs then need [`Localised::to_urls`]).
    pub fn is_remote(&self) -> bool {
        !self.roots.is_empty()
    }

    /// `text` with every copy's path written as its URL.
    pub fn to_urls(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (local, url) in &self.roots {
            if out.contains(local.as_str()) {
                out = out.replace(local.as_str(), url);
            }
        }
        out
    }

    /// `path` written as its URL when it lies in a copy (else unchanged).
    pub fn path_to_url(&self, path: &Path) -> PathBuf {
        match path.to_str() {
            Some(s) => PathBuf::from(self.to_urls(s)),
            None => path.to_path_buf(),
        }
    }

    /// The error with every copy's path written as its URL (its kind, and so its exit
    /// code, unchanged).
    pub fn error_to_urls(&self, e: Error) -> Error {
        if !self.is_remote() {
            return e;
        }
        match e {
            Error::Io { path, source } => Error::Io {
                path: self.path_to_url(&path),
                source: std::io::Error::new(source.kind(), self.to_urls(&source.to_string())),
            },
            Error::Format { path, pos, msg } => Error::Format {
                path: self.path_to_url(&path),
                pos,
                msg: self.to_urls(&msg),
            },
            Error::Usage(m) => Error::Usage(self.to_urls(&m)),
            Error::Input { path, msg } => Error::Input {
                path: self.path_to_url(&path),
                msg: self.to_urls(&msg),
            },
            Error::Export { path, msg } => Error::Export {
                path: self.path_to_url(&path),
                msg: self.to_urls(&msg),
            },
            Error::CannotJudge { path, msg } => Error::CannotJudge {
                path: self.path_to_url(&path),
                msg: self.to_urls(&msg),
            },
            Error::Internal(m) => Error::Internal(self.to_urls(&m)),
        }
    }

    /// The file `path` (written by the tool from the copy) with its copy paths written as
    /// URLs; nothing is rewritten when no input was a URL or the file is not UTF-8 text.
    pub fn rewrite_file(&self, path: &Path) -> Result<()> {
        if !self.is_remote() {
            return Ok(());
        }
        let Ok(text) = std::fs::read_to_string(path) else {
            return Ok(());
        };
        let new = self.to_urls(&text);
        if new != text {
            std::fs::write(path, new).map_err(|e| Error::io(path, e))?;
        }
        Ok(())
    }

    /// One line for stderr about the objects not fetched, or `None`.
    pub fn skipped_note(&self) -> Option<String> {
        if self.skipped.is_empty() {
            return None;
        }
        let bytes: u64 = self.skipped.iter().map(|s| s.1).sum();
        let first: Vec<&str> = self.skipped.iter().take(3).map(|s| s.0.as_str()).collect();
        let more = self.skipped.len().saturating_sub(first.len());
        Some(format!(
            "not fetched: {} object(s) of {bytes} bytes not named as a log, tracker, \
             completions or crash-bundle file ({}{})",
            self.skipped.len(),
            first.join(", "),
            if more > 0 {
                format!(", and {more} more")
            } else {
                String::new()
            }
        ))
    }
}

/// Whether an object at `rel` (its key below the prefix given, `/`-separated) is
/// named as something a log reader reads (see the module's list). Decided from the
/// name alone, before any GET.
pub fn wanted(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let Some(name) = parts.last().map(|n| n.to_ascii_lowercase()) else {
        return false;
    };
    let dirs = &parts[..parts.len() - 1];
    // A CSV or Parquet file is read at a run's top only (the prefix's, or a sub-prefix's
    // when the prefix holds runs), TRL's completions_*.parquet at any depth: a dataset's
    // shards deeper down are not fetched.
    if name.ends_with(".csv") || name.ends_with(".parquet") {
        return dirs.len() <= 1 || name.starts_with("completions_");
    }
    const EXTS: [&str; 9] = [
        ".jsonl", ".ndjson", ".log", ".txt", ".out", ".db", ".sqlite", ".sqlite3", ".wandb",
    ];
    const NAMES: [&str; 8] = [
        "trainer_state.json",
        "run_metadata.json",
        "context.json",
        "extra.json",
        "wandb-summary.json",
        "wandb-metadata.json",
        "config.yaml",
        "meta.yaml",
    ];
    EXTS.iter().any(|e| name.ends_with(e))
        || NAMES.contains(&name.as_str())
        || name.ends_with(".table.json")
        || name.contains("tfevents")
        || dirs
            .iter()
            .any(|d| matches!(*d, "metrics" | "params" | "tags"))
}

/// A unique, private folder under the system's temporary folder.
fn make_tmp() -> Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "rlf-fetch-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

/// The objects under the prefix `url`, as (key below it, size), walking one LIST per
/// level down to [`MAX_DEPTH`]; empty when nothing is under it.
fn walk(url: &str) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), 0usize)];
    while let Some((rel, depth)) = stack.pop() {
        let at = if rel.is_empty() {
            url.to_string()
        } else {
            format!("{url}/{rel}")
        };
        let listing = source::list_dir(Path::new(&at))?;
        let join = |n: &str| {
            if rel.is_empty() {
                n.to_string()
            } else {
                format!("{rel}/{n}")
            }
        };
        for (name, size) in &listing.files {
            out.push((join(name), *size));
        }
        if depth < MAX_DEPTH {
            for d in &listing.dirs {
                stack.push((join(d), depth + 1));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The last segment of a URL's path (the bucket or host when it has none).
fn last_segment(url: &str) -> String {
    let after = url.split_once("://").map_or(url, |(_, r)| r);
    after
        .rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("object")
        .to_string()
}

/// Copy the URL inputs among `paths` (see the module): a URL naming one object becomes
/// that object's copy, a prefix a folder holding the copies of its wanted objects. Local
/// paths are passed through untouched, and nothing is fetched when there is no URL.
/// A URL with neither an object nor anything under it is an error naming it.
pub fn localise(paths: &[PathBuf]) -> Result<Localised> {
    let mut out = Localised::default();
    for (i, p) in paths.iter().enumerate() {
        if !source::is_remote(p) {
            out.paths.push(p.clone());
            continue;
        }
        let text = p.to_str().unwrap_or_default();
        let url = text.trim_end_matches('/').to_string();
        let tmp = match &out.tmp {
            Some(t) => t.clone(),
            None => {
                let t = make_tmp()?;
                out.tmp = Some(t.clone());
                t
            }
        };
        let local = tmp.join(i.to_string()).join(last_segment(&url));
        let objects = match walk(&url) {
            Ok(o) => o,
            // A plain HTTP server lists nothing (object_store's HTTP store lists with
            // WebDAV's PROPFIND): the URL is then one object, its GET says if it is not.
            Err(_) if url.starts_with("http://") || url.starts_with("https://") => Vec::new(),
            Err(e) => return Err(e),
        };
        if objects.is_empty() {
            // One object (or nothing: the GET says so, naming the URL).
            let bytes = source::read_all(Path::new(&url))?;
            write(&local, &bytes)?;
        } else {
            let (keep, skip): (Vec<_>, Vec<_>) =
                objects.into_iter().partition(|(rel, _)| wanted(rel));
            out.skipped
                .extend(skip.into_iter().map(|(rel, n)| (format!("{url}/{rel}"), n)));
            std::fs::create_dir_all(&local).map_err(|e| Error::io(&local, e))?;
            keep.par_iter().try_for_each(|(rel, _)| {
                let bytes = source::read_all(Path::new(&format!("{url}/{rel}")))?;
                write(&local.join(rel), &bytes)
            })?;
        }
        out.roots
            .push((local.to_string_lossy().into_owned(), url.clone()));
        out.paths.push(local);
    }
    out.roots.sort_by_key(|r| std::cmp::Reverse(r.0.len()));
    Ok(out)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// Upload every file under the local folder `dir` to the prefix `url` (one PUT each, in
/// name order), for a report written locally first: nothing is put when the report could
/// not be made.
pub fn upload_dir(dir: &Path, url: &str) -> Result<Vec<String>> {
    let url = url.trim_end_matches('/');
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let p = e.map_err(|e| Error::io(&d, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut put = Vec::new();
    for f in files {
        let rel = f.strip_prefix(dir).unwrap_or(&f);
        let rel: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let target = format!("{url}/{}", rel.join("/"));
        let bytes = std::fs::read(&f).map_err(|e| Error::io(&f, e))?;
        source::write_object(Path::new(&target), bytes)?;
        put.push(target);
    }
    Ok(put)
}

/// A temporary folder of its own for a command that writes its output locally before
/// uploading it; removed when dropped.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new private folder.
    pub fn new() -> Result<Self> {
        make_tmp().map(Scratch)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_decide_what_is_fetched() {
        for rel in [
            "steps.jsonl",
            "train.log",
            "tb/events.out.tfevents.1700000000.host.1.0",
            "wandb/offline-run-1-abc/run-abc.wandb",
            "wandb/offline-run-1-abc/files/wandb-summary.json",
            "wandb/offline-run-1-abc/files/config.yaml",
            "wandb/offline-run-1-abc/files/media/table/samples_1_ab.table.json",
            "mlruns/1/0a1b/metrics/loss",
            "mlruns/1/0a1b/params/lr",
            "mlruns/1/0a1b/meta.yaml",
            "mlflow.db",
            "export.csv",
            "run_a/export.csv",
            "run_a/rlf_fixture.parquet",
            "completions/completions_00010.parquet",
            "a/b/completions/completions_00010.parquet",
            "failures/20251008-113012-step-0041/exception.txt",
            "failures/20251008-113012-step-0041/context.json",
            "run_metadata.json",
            "areal/3/12.txt",
        ] {
            assert!(wanted(rel), "{rel}");
        }
        for rel in [
            "checkpoint-500/model.safetensors",
            "global_step_10/actor/model.pt",
            "optimizer.bin",
            "tokenizer.json",
            "plots/loss.png",
            "data/train/part-0.parquet",
            "data/eval/scores.csv",
            "",
        ] {
            assert!(!wanted(rel), "{rel}");
        }
    }

    #[test]
    fn copies_are_spoken_of_as_urls() {
        let l = Localised {
            paths: vec![],
            skipped: vec![("s3://b/run/model.pt".into(), 10)],
            roots: vec![
                (
                    "/tmp/rlf-fetch-1/1/run-long".into(),
                    "s3://b/x/run-long".into(),
                ),
                ("/tmp/rlf-fetch-1/0/run".into(), "s3://b/run".into()),
            ],
            tmp: None,
        };
        assert_eq!(
            l.to_urls("/tmp/rlf-fetch-1/0/run/steps.jsonl and /tmp/rlf-fetch-1/1/run-long/a"),
            "s3://b/run/steps.jsonl and s3://b/x/run-long/a"
        );
        let e = l.error_to_urls(Error::Usage("/tmp/rlf-fetch-1/0/run: holds no logs".into()));
        assert_eq!(e.to_string(), "s3://b/run: holds no logs");
        let e = l.error_to_urls(Error::input(
            Path::new("/tmp/rlf-fetch-1/0/run/a.jsonl"),
            "bad",
        ));
        assert!(matches!(&e, Error::Input { path, .. } if path == Path::new("s3://b/run/a.jsonl")));
        assert_eq!(last_segment("s3://bucket/a/run/"), "run");
        assert_eq!(last_segment("s3://bucket"), "bucket");
        let note = l.skipped_note().unwrap();
        assert!(note.contains("1 object(s) of 10 bytes") && note.contains("s3://b/run/model.pt"));
    }
}
