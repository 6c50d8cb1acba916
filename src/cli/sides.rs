//! Before dumpdiff compares anything: each `--*-dir` must hold a dump of the producer its
//! flag names, and a file of the step asked for. A tree given under the wrong flag is an
//! error that says which flags to swap, not a comparison that blames the wrong side.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::producers::layout::{DumpTree, Producer};

/// One side as given on the command line.
#[derive(Debug, Clone)]
pub struct Side {
    /// The flag it came in on, e.g. `--weaver-dir`.
    pub flag: &'static str,
    /// The folder given.
    pub dir: PathBuf,
    /// The producer that flag stands for.
    pub expected: Producer,
}

/// The flag that stands for `p` (`None` for [`Producer::Unknown`]).
fn flag_of(p: Producer) -> Option<&'static str> {
    match p {
        Producer::SelfHosted => Some("--self-hosted-dir"),
        Producer::Weaver => Some("--weaver-dir"),
        Producer::RemoteApi => Some("--remote-api-dir"),
        Producer::Unknown => None,
    }
}

/// `0, 3, 7` or `none`.
fn steps_text(tree: &DumpTree) -> String {
    let steps: Vec<String> = tree.steps().iter().map(i64::to_string).collect();
    if steps.is_empty() {
        "none".into()
    } else {
        steps.join(", ")
    }
}

/// `0-3, 7` for a set of numbers.
fn ranges(set: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = set.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b += 1;
            it.next();
        }
        out.push(match b - a {
            0 => a.to_string(),
            1 => format!("{a}, {b}"),
            _ => format!("{a}-{b}"),
        });
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// The rank and micro filters of `--ranks`/`--micros` (`None`: all).
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter<'a> {
    /// Only these ranks.
    pub ranks: Option<&'a BTreeSet<u32>>,
    /// Only these micro-batches.
    pub micros: Option<&'a BTreeSet<u32>>,
}

/// Discover every side and check it against its flag, `step` and `filter`: a tree whose
/// producer is known and differs from its flag's is a usage error naming the flag it belongs
/// to (both flags when two sides are swapped); a tree with no file of `step` is a usage error
/// listing the steps it holds, one whose files of `step` the filter leaves none of lists the
/// ranks and micros it has. A tree of unknown producer is accepted (nothing to tell it by).
pub fn check_sides(sides: &[Side], step: i64, filter: Filter) -> Result<()> {
    let mut trees = Vec::with_capacity(sides.len());
    for s in sides {
        trees.push(DumpTree::discover(&s.dir)?);
    }
    let wrong: Vec<(&Side, &DumpTree)> = sides
        .iter()
        .zip(&trees)
        .filter(|(s, t)| t.producer != Producer::Unknown && t.producer != s.expected)
        .collect();
    if !wrong.is_empty() {
        let mut msg = Vec::new();
        for (s, t) in &wrong {
            msg.push(format!(
                "{} {} holds a {} dump, not a {} one",
                s.flag,
                s.dir.display(),
                t.producer,
                s.expected
            ));
        }
        let fix: Vec<String> = wrong
            .iter()
            .filter_map(|(s, t)| flag_of(t.producer).map(|f| format!("{f} {}", s.dir.display())))
            .collect();
        let swapped = wrong.len() == 2 && wrong[0].1.producer == wrong[1].0.expected;
        return Err(Error::Usage(format!(
            "{}: {}; run again with {} (dumpdiff takes each tree's role from its flag and \
             does not guess)",
            msg.join("; "),
            if swapped {
                "the flags look swapped"
            } else {
                "the flag does not match the files"
            },
            fix.join(" ")
        )));
    }
    for (s, t) in sides.iter().zip(&trees) {
        if t.files().is_empty() {
            let mut kinds: Vec<String> = Vec::new();
            if crate::formats::source::is_remote(&t.root) {
                let l = crate::formats::source::list_dir(&t.root)?;
                kinds.extend(l.dirs.iter().map(|d| format!("{d}/")));
            } else {
                for e in std::fs::read_dir(&t.root).map_err(|e| Error::io(&t.root, e))? {
                    let e = e.map_err(|e| Error::io(&t.root, e))?;
                    if e.path().is_dir() {
                        kinds.push(format!("{}/", e.file_name().to_string_lossy()));
                    }
                }
            }
            kinds.sort();
            return Err(Error::Usage(format!(
                "{} {}: no dump file found; the tree holds the folders {} but no \
                 step_NNNNNN… file in them",
                s.flag,
                t.root.display(),
                if kinds.is_empty() {
                    "(none)".to_string()
                } else {
                    kinds.join(", ")
                }
            )));
        }
        if !t.steps().contains(&step) {
            return Err(Error::Usage(format!(
                "{} {}: no file of step {step}; the tree holds {} file(s) of step(s) {}",
                s.flag,
                t.root.display(),
                t.files().len(),
                steps_text(t)
            )));
        }
        let of_step: Vec<_> = t.files().iter().filter(|f| f.step == step).collect();
        let kept = of_step.iter().any(|f| {
            f.rank
                .is_none_or(|r| filter.ranks.is_none_or(|s| s.contains(&r)))
                && f.micro
                    .is_none_or(|m| filter.micros.is_none_or(|s| s.contains(&m)))
        });
        if !kept {
            let ranks: BTreeSet<u32> = of_step.iter().filter_map(|f| f.rank).collect();
            let micros: BTreeSet<u32> = of_step.iter().filter_map(|f| f.micro).collect();
            return Err(Error::Usage(format!(
                "{} {}: --ranks/--micros leave no file of step {step}; it holds ranks {} and \
                 micros {}",
                s.flag,
                t.root.display(),
                ranges(&ranks),
                ranges(&micros)
            )));
        }
    }
    Ok(())
}
