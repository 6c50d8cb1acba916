//! Several inputs are several runs: which inputs belong together (the files of one folder,
//! one run folder) and which folders a parent folder holds (`logscan debug_runs/` lists
//! its run folders, as postmortem does). Each run is scanned on its own, so the findings of
//! one never depend on another or on the order of the arguments.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One run to scan: a label (its folder or file) and its inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInputs {
    /// What the report calls it (the folder, or the file when alone).
    pub label: String,
    /// The files or folders scanned together.
    pub paths: Vec<PathBuf>,
}

/// True when `dir` directly holds a log or tracker file logscan reads.
fn holds_logs(dir: &Path) -> bool {
    super::scan::expand_paths(&[dir.to_path_buf()]).is_ok()
}

/// A folder named by a number (a weight version, a step): one step's dump of a run.
fn is_version_dir(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The runs among `paths`: a folder with logs is one run; a folder without logs whose
/// sub-folders hold some is one run per such sub-folder (sorted by name); files are grouped
/// by their folder (a run's `steps.jsonl` and `events.jsonl` are one run), in argument order.
pub fn group_runs(paths: &[PathBuf]) -> Result<Vec<RunInputs>> {
    let mut out: Vec<RunInputs> = Vec::new();
    for p in paths {
        // A prefix in a store is one run (its sub-prefixes are not searched for runs).
        let remote_dir = crate::logs::input::is_remote(p) && crate::logs::input::is_dir(p);
        if p.is_dir() || remote_dir {
            if remote_dir || holds_logs(p) {
                out.push(RunInputs {
                    label: p.display().to_string(),
                    paths: vec![p.clone()],
                });
                continue;
            }
            let mut subs: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| Error::io(p, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|s| s.is_dir() && holds_logs(s))
                .collect();
            subs.sort();
            // AReaL's `rollout/` folder itself (`WorkflowExecutor._dump_trajectory`,
            // areal/infra/workflow_executor.py @ inclusionAI/AReaL 4aef98d8 = areal 1.0.4,
            // writes `<log path>/rollout/<tail_version>/<task_id>.jsonl`): its folders
            // named by a version are the steps of one run, not runs.
            if !subs.is_empty() && subs.iter().all(|s| is_version_dir(s)) {
                out.push(RunInputs {
                    label: p.display().to_string(),
                    paths: vec![p.clone()],
                });
                continue;
            }
            if subs.is_empty() {
                // The scan names what the folder lacks.
                out.push(RunInputs {
                    label: p.display().to_string(),
                    paths: vec![p.clone()],
                });
            }
            out.extend(subs.into_iter().map(|s| RunInputs {
                label: s.display().to_string(),
                paths: vec![s],
            }));
            continue;
        }
        let folder = p.parent().map(Path::to_path_buf).unwrap_or_default();
        let same = out.iter_mut().find(|r| {
            r.paths.iter().all(|q| {
                !q.is_dir() && q.parent().map(Path::to_path_buf).unwrap_or_default() == folder
            })
        });
        match same {
            Some(r) => {
                r.paths.push(p.clone());
                r.label = if folder.as_os_str().is_empty() {
                    ".".to_string()
                } else {
                    folder.display().to_string()
                };
            }
            None => out.push(RunInputs {
                label: p.display().to_string(),
                paths: vec![p.clone()],
            }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_files_and_parents() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, parent) = (
            d.path().join("a"),
            d.path().join("b"),
            d.path().join("runs"),
        );
        for dir in [
            &a,
            &b,
            &parent.join("r2"),
            &parent.join("r1"),
            &parent.join("empty"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        for f in [
            a.join("steps.jsonl"),
            a.join("events.jsonl"),
            b.join("train.log"),
            parent.join("r1/train.log"),
            parent.join("r2/steps.jsonl"),
        ] {
            std::fs::write(f, "{}\n").unwrap();
        }
        // Two files of one folder: one run; a file elsewhere: another.
        let g = group_runs(&[
            a.join("steps.jsonl"),
            b.join("train.log"),
            a.join("events.jsonl"),
        ])
        .unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(
            g[0].paths,
            vec![a.join("steps.jsonl"), a.join("events.jsonl")]
        );
        assert_eq!(g[1].paths, vec![b.join("train.log")]);
        // A parent folder: its run folders, sorted; the empty one left out.
        let g = group_runs(std::slice::from_ref(&parent)).unwrap();
        let labels: Vec<PathBuf> = g.iter().map(|r| r.paths[0].clone()).collect();
        assert_eq!(labels, vec![parent.join("r1"), parent.join("r2")]);
        // Two run folders: two runs.
        assert_eq!(group_runs(&[a.clone(), b.clone()]).unwrap().len(), 2);
        // AReaL's `rollout/` given itself: its version folders are one run's steps.
        let rollout = d.path().join("rollout");
        for v in ["1", "2"] {
            std::fs::create_dir_all(rollout.join(v)).unwrap();
            std::fs::write(rollout.join(v).join("0.jsonl"), "{}\n").unwrap();
        }
        let g = group_runs(std::slice::from_ref(&rollout)).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].paths, vec![rollout]);
    }
}
