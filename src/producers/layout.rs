//! Dump-tree discovery: find every kind folder under a dump root, parse each file's
//! step/rank/micro from its name (numbers, never name order: `rank10` comes after `rank2`;
//! `step_-00001` is step −1), and tell which producer wrote the tree (SPEC §2).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::error::{Error, Position, Result};
use crate::formats::FileFormat;
pub use crate::model::tree::{DumpFile, DumpTree, FileReader, Kind, Producer, Unrecognised};

/// Parse `step_000000_rank10_micro1` (the stem, without extension) into (step, rank, micro).
pub fn parse_stem(stem: &str) -> Option<(i64, Option<u32>, Option<u32>)> {
    let rest = stem.strip_prefix("step_")?;
    let (step_str, mut rest) = split_number(rest, true)?;
    let step: i64 = step_str.parse().ok()?;
    let mut rank = None;
    let mut micro = None;
    if let Some(r) = rest.strip_prefix("_rank") {
        let (n, tail) = split_number(r, false)?;
        rank = Some(n.parse().ok()?);
        rest = tail;
    }
    if let Some(m) = rest.strip_prefix("_micro") {
        let (n, tail) = split_number(m, false)?;
        micro = Some(n.parse().ok()?);
        rest = tail;
    }
    rest.is_empty().then_some((step, rank, micro))
}

/// Split a leading (optionally signed) run of ASCII digits off `s`.
fn split_number(s: &str, signed: bool) -> Option<(&str, &str)> {
    let sign = usize::from(signed && s.starts_with('-'));
    let digits = s[sign..].bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0).then(|| s.split_at(sign + digits))
}

impl DumpTree {
    /// Walk `root` and place every file. `root` may be the dump folder itself or a folder
    /// holding exactly one such folder (e.g. an experiment folder with `debug_dump/` inside).
    ///
    /// A URL (`s3://bucket/run/self_hosted`, [`crate::formats::source`]) is listed as a
    /// folder: one LIST per level, nothing fetched.
    pub fn discover(root: &Path) -> Result<DumpTree> {
        if crate::formats::source::is_remote(root) {
            return Self::discover_remote(root);
        }
        let meta = std::fs::metadata(root).map_err(|e| Error::io(root, e))?;
        if !meta.is_dir() {
            return Err(Error::format(
                root,
                Position::File,
                "expected a dump folder (holding trajectory/, forward_data/, loss/ …), found a file",
            ));
        }
        let dump_root = find_dump_root(root)?;
        let mut files = Vec::new();
        let mut unrecognised = Vec::new();
        for kind in Kind::ALL {
            let dir = dump_root.join(kind.dir_name());
            if !dir.is_dir() {
                continue;
            }
            let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&dir, e))?;
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let ft = entry.file_type().map_err(|e| Error::io(&path, e))?;
                if !(ft.is_file() || (ft.is_symlink() && path.is_file())) {
                    unrecognised.push(Unrecognised {
                        path,
                        reason: "not a regular file".into(),
                    });
                    continue;
                }
                let size = || {
                    std::fs::metadata(&path)
                        .map(|m| m.len())
                        .map_err(|e| Error::io(&path, e))
                };
                place(
                    kind,
                    &name,
                    path.clone(),
                    size,
                    &mut files,
                    &mut unrecognised,
                )?;
            }
        }
        Ok(assemble(dump_root, files, unrecognised))
    }

    /// [`DumpTree::discover`] of a prefix in an object store: the same placing rules, the
    /// listings of [`crate::formats::source::list_dir`] for `read_dir`.
    fn discover_remote(root: &Path) -> Result<DumpTree> {
        use crate::formats::source;
        let top = source::list_dir(root)?;
        if top.is_empty() {
            return Err(match source::head_size(root)? {
                Some(_) => Error::format(
                    root,
                    Position::File,
                    "expected a dump folder (holding trajectory/, forward_data/, loss/ …), \
                     found an object",
                ),
                None => Error::input(root, "no such object or prefix in the store"),
            });
        }
        let is_kind = |d: &String| Kind::from_dir_name(d).is_some();
        let (dump_root, listing) = if top.dirs.iter().any(is_kind) {
            (root.to_path_buf(), top)
        } else {
            let mut candidates = Vec::new();
            for d in &top.dirs {
                let p = root.join(d);
                let l = source::list_dir(&p)?;
                if l.dirs.iter().any(is_kind) {
                    candidates.push((p, l));
                }
            }
            match candidates.len() {
                1 => candidates.remove(0),
                0 => return Err(no_dump_folders(root)),
                _ => {
                    let paths: Vec<PathBuf> = candidates.into_iter().map(|c| c.0).collect();
                    return Err(several_trees(root, &paths));
                }
            }
        };
        let mut files = Vec::new();
        let mut unrecognised = Vec::new();
        for kind in Kind::ALL {
            if !listing.dirs.iter().any(|d| d == kind.dir_name()) {
                continue;
            }
            let dir = dump_root.join(kind.dir_name());
            let l = source::list_dir(&dir)?;
            for d in l.dirs.iter().filter(|d| !d.starts_with('.')) {
                unrecognised.push(Unrecognised {
                    path: dir.join(d),
                    reason: "not a regular file".into(),
                });
            }
            for (name, size) in l.files.into_iter().filter(|f| !f.0.starts_with('.')) {
                let path = dir.join(&name);
                place(
                    kind,
                    &name,
                    path,
                    || Ok(size),
                    &mut files,
                    &mut unrecognised,
                )?;
            }
        }
        Ok(assemble(dump_root, files, unrecognised))
    }
}

/// The tree of the files placed under `root`, its producer told from them; its files
/// are read by [`crate::producers::nexrl_files::NexrlFiles`].
fn assemble(root: PathBuf, files: Vec<DumpFile>, unrecognised: Vec<Unrecognised>) -> DumpTree {
    let producer = identify_producer(&files);
    DumpTree::new(
        root,
        producer,
        files,
        unrecognised,
        &crate::producers::nexrl_files::NexrlFiles,
    )
}

/// Tell the producer from the distinctive kinds present (files, not folders: NexRL's
/// dumper creates every folder, empty or not).
fn identify_producer(files: &[DumpFile]) -> Producer {
    let has = |k: Kind| files.iter().any(|f| f.kind == k);
    let per_micro_param = files
        .iter()
        .any(|f| matches!(f.kind, Kind::Param | Kind::Gradient) && f.micro.is_some());
    let weaver = has(Kind::IsLossDebug) || has(Kind::BatchInputs) || per_micro_param;
    let remote = has(Kind::PreparedTrajectories) || has(Kind::Datums) || has(Kind::TrainingMetrics);
    let self_hosted = has(Kind::Trajectory) || has(Kind::OldLogProbs);
    match (weaver, remote, self_hosted) {
        (true, false, false) => Producer::Weaver,
        (false, true, _) if !has(Kind::ForwardData) => Producer::RemoteApi,
        (false, false, true) => Producer::SelfHosted,
        _ => Producer::Unknown,
    }
}

/// `root` itself when it holds a kind folder, else its single child that does.
fn find_dump_root(root: &Path) -> Result<PathBuf> {
    let has_kind_dir = |p: &Path| Kind::ALL.iter().any(|k| p.join(k.dir_name()).is_dir());
    if has_kind_dir(root) {
        return Ok(root.to_path_buf());
    }
    let mut candidates = Vec::new();
    for entry in std::fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let p = entry.map_err(|e| Error::io(root, e))?.path();
        if p.is_dir() && has_kind_dir(&p) {
            candidates.push(p);
        }
    }
    match candidates.len() {
        1 => Ok(candidates.remove(0)),
        0 => Err(no_dump_folders(root)),
        _ => Err(several_trees(root, &candidates)),
    }
}

/// `root` holds no kind folder, nor does any folder one level below.
fn no_dump_folders(root: &Path) -> Error {
    Error::format(
        root,
        Position::File,
        format!(
            "no dump folders found: expected one of {} here or one level below",
            Kind::ALL.map(Kind::dir_name).join(", ")
        ),
    )
}

/// Several folders below `root` hold kind folders.
fn several_trees(root: &Path, candidates: &[PathBuf]) -> Error {
    Error::format(
        root,
        Position::File,
        format!(
            "several dump trees below this folder ({}); pass one of them",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// Place the file `name` (at `path`, in `kind`'s folder) by its extension and stem, or set
/// it aside with the reason; `size` is asked only of a placed file.
fn place(
    kind: Kind,
    name: &str,
    path: PathBuf,
    size: impl FnOnce() -> Result<u64>,
    files: &mut Vec<DumpFile>,
    unrecognised: &mut Vec<Unrecognised>,
) -> Result<()> {
    let Some(format) = FileFormat::from_path(&path) else {
        unrecognised.push(Unrecognised {
            path,
            reason: "unknown extension".into(),
        });
        return Ok(());
    };
    let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
    let Some((step, rank, micro)) = parse_stem(stem) else {
        unrecognised.push(Unrecognised {
            path,
            reason: "name is not step_N[_rankR][_microM]".into(),
        });
        return Ok(());
    };
    let size = size()?;
    files.push(DumpFile {
        path,
        kind,
        step,
        rank,
        micro,
        format,
        size,
    });
    Ok(())
}

impl DumpTree {
    /// [`without_unreadable`] as the model's door offers it to tools: run `f` on trees
    /// without the files found unreadable so far, setting aside each file `f` fails on.
    pub fn without_unreadable<T>(
        roots: &[(&str, &Path)],
        f: impl FnMut(&(dyn Fn(&Path) -> bool + Sync)) -> Result<T>,
    ) -> Result<(T, Vec<crate::model::unreadable::Unreadable>)> {
        without_unreadable(roots, f)
    }
}

/// Run `f` on trees from which the files found unreadable so far are left out: when `f`
/// fails on a placed file of one of `roots` (`(role, root)`), that file is set aside with
/// the error as its reason and `f` runs again, so one bad file never hides the results of
/// the good ones. An error that names no such file (a root that cannot be listed, a usage
/// error, a file set aside already) is returned as it is. `f` is given the set-aside test.
pub fn without_unreadable<T>(
    roots: &[(&str, &Path)],
    mut f: impl FnMut(&(dyn Fn(&Path) -> bool + Sync)) -> Result<T>,
) -> Result<(T, Vec<crate::model::unreadable::Unreadable>)> {
    let mut unreadable: Vec<crate::model::unreadable::Unreadable> = Vec::new();
    loop {
        let aside: BTreeSet<PathBuf> = unreadable.iter().map(|u| u.path.clone()).collect();
        let set_aside = |p: &Path| aside.contains(p);
        let e = match f(&set_aside) {
            Ok(t) => return Ok((t, unreadable)),
            Err(e) => e,
        };
        // What could not be read so far explains an error that follows from it (no
        // trajectory file left, nothing of the step left): say so with the error.
        let explained = |e: Error| match e {
            Error::Input { path, msg } if !unreadable.is_empty() => Error::Input {
                path,
                msg: format!(
                    "{msg} (set aside as unreadable: {})",
                    unreadable
                        .iter()
                        .map(|u| u.reason.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            },
            e => e,
        };
        let path = match &e {
            Error::Io { path, .. }
            | Error::Format { path, .. }
            | Error::Input { path, .. }
            | Error::CannotJudge { path, .. } => path.clone(),
            _ => return Err(explained(e)),
        };
        // An object in a store is set aside for what its bytes say (a format error); a
        // failure of the store itself (credentials, the network after the retries) says
        // nothing about the file and stops the run, as a root that cannot be listed does.
        let settable = if crate::formats::source::is_remote(&path) {
            matches!(e, Error::Format { .. })
        } else {
            path.is_file()
        };
        if aside.contains(&path) || !settable {
            return Err(explained(e));
        }
        let found = roots.iter().find_map(|(role, root)| {
            let tree = DumpTree::discover(root).ok()?;
            let f = tree.files().iter().find(|f| f.path == path)?.clone();
            Some(crate::model::unreadable::Unreadable {
                role: (*role).to_string(),
                path: path.clone(),
                kind: f.kind.dir_name().to_string(),
                rank: f.rank,
                micro: f.micro,
                reason: e.to_string(),
                cannot_judge: matches!(e, Error::CannotJudge { .. }),
            })
        });
        match found {
            Some(u) => unreadable.push(u),
            None => return Err(explained(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_parse_numbers_not_names() {
        assert_eq!(parse_stem("step_000000"), Some((0, None, None)));
        assert_eq!(parse_stem("step_-00001"), Some((-1, None, None)));
        assert_eq!(
            parse_stem("step_000012_rank10_micro1"),
            Some((12, Some(10), Some(1)))
        );
        assert_eq!(parse_stem("step_000003_rank2"), Some((3, Some(2), None)));
        assert_eq!(parse_stem("step_x"), None);
        assert_eq!(parse_stem("step_1_rank"), None);
        assert_eq!(parse_stem("step_1_rank2_extra"), None);
        assert_eq!(parse_stem("step_99999999999999999999"), None);
    }
}
