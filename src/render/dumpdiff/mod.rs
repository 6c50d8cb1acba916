//! dumpdiff's [`Report`] in each format (one file per format), and the words they
//! share (count summary, coverage lines, finding lines, suggested next commands).

pub mod json;
pub mod markdown;
pub mod table;

use std::collections::{BTreeMap, BTreeSet};

use super::{Format, Rendered, Renderer, Style};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::report::Report;
pub use crate::dumpdiff::words::{cell_name, finding_line, location, verdict_word};
pub use crate::fmt::{plural, wrap};

impl Rendered for Report {
    fn renderer(format: Format, style: Style) -> Box<dyn Renderer<Self>> {
        match format {
            Format::Table => Box::new(table::TableRenderer {
                color: style.color,
                width: style.width,
            }),
            Format::Json => Box::new(json::JsonRenderer),
            Format::Markdown => Box::new(markdown::MarkdownRenderer),
        }
    }
}

/// `0-3,5,7-8` for a set of numbers.
pub fn ranges(xs: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = xs.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        out.push(if end == start {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// The distinct rank/micro cells (over every section) whose worst verdict is `v`.
fn cells_at(report: &Report, v: Verdict) -> BTreeSet<(Option<u32>, Option<u32>)> {
    let mut worst: BTreeMap<(Option<u32>, Option<u32>), Verdict> = BTreeMap::new();
    for c in report.sections.iter().flat_map(|s| &s.cells) {
        let e = worst.entry((c.rank, c.micro)).or_insert(c.verdict);
        *e = (*e).max(c.verdict);
    }
    worst
        .into_iter()
        .filter(|(_, w)| *w == v)
        .map(|(k, _)| k)
        .collect()
}

/// The one-line count summary under the headline: `2 cells fail in 2 ranks; 1 cell warns;
/// 8 files on one side only`, or `all 24 cells pass`.
pub fn summary_line(report: &Report) -> String {
    let mut parts = Vec::new();
    let fail = cells_at(report, Verdict::Fail);
    let warn = cells_at(report, Verdict::Warn);
    let describe = |cells: &BTreeSet<(Option<u32>, Option<u32>)>, verb_one: &str, verb: &str| {
        let ranks: BTreeSet<u32> = cells.iter().filter_map(|c| c.0).collect();
        let mut s = format!(
            "{} {}",
            plural(cells.len(), "cell"),
            if cells.len() == 1 { verb_one } else { verb }
        );
        if !ranks.is_empty() {
            s.push_str(&format!(" in {}", plural(ranks.len(), "rank")));
        }
        s
    };
    if !report.unreadable.is_empty() {
        parts.push(super::unreadable_count(&report.unreadable));
    }
    for c in report.coefficients.iter().filter(|c| c.differ) {
        parts.push(format!("{} differs between the sides", c.name));
    }
    if !fail.is_empty() {
        parts.push(describe(&fail, "fails", "fail"));
    }
    if !warn.is_empty() {
        parts.push(describe(&warn, "warns", "warn"));
    }
    if !report.coverage.is_empty() {
        parts.push(format!(
            "{} on one side only",
            plural(one_sided_files(report), "file")
        ));
    }
    if parts.is_empty() {
        let compared = report
            .sections
            .iter()
            .flat_map(|s| &s.cells)
            .map(|c| (c.rank, c.micro))
            .collect::<BTreeSet<_>>()
            .len();
        let any_pass = report
            .sections
            .iter()
            .flat_map(|s| &s.cells)
            .any(|c| c.verdict == Verdict::Pass);
        return if any_pass {
            format!("all {} pass", plural(compared, "cell"))
        } else {
            "nothing compared".into()
        };
    }
    parts.join("; ")
}

/// One line per file set aside as unreadable: side, path and the reader's reason.
pub fn unreadable_lines(report: &Report) -> Vec<String> {
    report
        .unreadable
        .iter()
        .map(|u| format!("unreadable ({}): {}", u.role, u.reason))
        .collect()
}

/// The loss coefficients and inferred conventions, differing coefficients first
/// (`entropy_coeff differs: self-hosted 1e-3 (read: …) vs weaver 1e-4 (inferred: …)`).
/// Values print with enough digits to tell them apart.
pub fn convention_lines(report: &Report) -> Vec<String> {
    let val = |v: Option<f64>, how: &Option<String>| match (v, how) {
        (Some(v), Some(h)) => format!("{} ({h})", coefficient_text(v)),
        (Some(v), None) => coefficient_text(v),
        (None, Some(h)) => h.clone(),
        _ => "unknown".into(),
    };
    let mut out: Vec<String> = report
        .coefficients
        .iter()
        .map(|c| {
            format!(
                "{} {}: self-hosted {} vs weaver {}",
                c.name,
                if c.differ {
                    "differs"
                } else if c.self_hosted.is_none() || c.weaver.is_none() {
                    "cannot be compared"
                } else if c.self_hosted_one_cell || c.weaver_one_cell {
                    "is not compared"
                } else {
                    "agrees"
                },
                val(c.self_hosted, &c.self_hosted_from),
                val(c.weaver, &c.weaver_from)
            )
        })
        .collect();
    out.extend(report.conventions.iter().cloned());
    out
}

/// A coefficient: as written when it is short (`0.001`), else 4 significant digits.
fn coefficient_text(v: f64) -> String {
    let plain = format!("{v}");
    if plain.len() <= 8 {
        plain
    } else {
        format!("{v:.3e}")
    }
}

/// How many files exist on one side only: the distinct files the report found behind its
/// coverage gaps, or (a report built without them) one per gap.
pub fn one_sided_files(report: &Report) -> usize {
    let found: BTreeSet<&std::path::Path> = report
        .offending_files
        .iter()
        .filter(|f| f.section == "coverage")
        .map(|f| f.path.as_path())
        .collect();
    if found.is_empty() {
        report.coverage.len()
    } else {
        found.len()
    }
}

/// Files on one side only, one line per rank and side, said from the side that lacks them
/// (`rank 11 missing on weaver: loss micro 1 — present on self-hosted (1 file)`), kinds
/// with the same micros together, so one missing `loss` file of one micro is not mistaken
/// for a whole missing rank.
pub fn coverage_lines(report: &Report) -> Vec<String> {
    type Key<'a> = (&'a str, &'a str, Option<u32>);
    let mut by: BTreeMap<Key<'_>, BTreeMap<&str, BTreeSet<u32>>> = BTreeMap::new();
    let mut order: Vec<Key<'_>> = Vec::new();
    for c in &report.coverage {
        let key = (c.present_on.as_str(), c.missing_on.as_str(), c.rank);
        if !by.contains_key(&key) {
            order.push(key);
        }
        let micros = by
            .entry(key)
            .or_default()
            .entry(c.kind.as_str())
            .or_default();
        if let Some(m) = c.micro {
            micros.insert(m);
        }
    }
    order
        .into_iter()
        .map(|key @ (present, missing, rank)| {
            let kinds = &by[&key];
            let micro_text = |m: &BTreeSet<u32>| match m.len() {
                0 => String::new(),
                1 => format!(" micro {}", ranges(m)),
                _ => format!(" micros {}", ranges(m)),
            };
            // Kinds grouped by their micro sets, groups in order of first appearance.
            let mut groups: Vec<(&BTreeSet<u32>, Vec<&str>)> = Vec::new();
            for (k, m) in kinds {
                match groups.iter_mut().find(|(gm, _)| *gm == m) {
                    Some((_, ks)) => ks.push(k),
                    None => groups.push((m, vec![k])),
                }
            }
            groups.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
            let what = groups
                .iter()
                .map(|(m, ks)| format!("{}{}", ks.join(", "), micro_text(m)))
                .collect::<Vec<_>>()
                .join("; ");
            let found = report
                .offending_files
                .iter()
                .filter(|f| f.section == "coverage" && f.role == present && f.rank == rank)
                .count();
            let files = if found > 0 {
                found
            } else {
                kinds.values().map(|m| m.len().max(1)).sum()
            };
            format!(
                "{} missing on {missing}: {what} — present on {present} ({})",
                rank.map_or("whole batch".into(), |r| format!("rank {r}")),
                plural(files, "file")
            )
        })
        .collect()
}

/// losscheck's verdict line without its `rank R micro M FILE: ` head (the caller names the
/// cell already).
pub fn verdict_detail(detail: &str) -> &str {
    detail
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("rank "))
        .map_or(detail, |(_, rest)| rest)
}

/// Commands worth running next: losscheck on the side whose loss disagrees with its own
/// inputs (or on the other side of each failing loss cell), `--inspect` of the first
/// failing file otherwise. At most `max`.
pub fn next_commands(report: &Report, max: usize) -> Vec<String> {
    let root_of = |role: &str| {
        report
            .sides
            .iter()
            .find(|s| s.role == role)
            .map(|s| s.root.display().to_string())
    };
    let mut out: Vec<String> = Vec::new();
    for a in &report.adjudication {
        let bad = a.sides.iter().find(|v| {
            v.status
                .as_ref()
                .is_some_and(|s| matches!(s, crate::losscheck::Status::Inconsistent))
        });
        if let Some(root) = bad.and_then(|v| root_of(&v.role)) {
            out.push(format!(
                "losscheck --dump-dir {} --step {} --rank {} --micro {} --preset {}",
                crate::postmortem::replay::shell_quote(&root),
                report.step,
                a.rank,
                a.micro,
                a.preset
            ));
        }
    }
    if out.is_empty() {
        let other = report.sides.get(1).map(|s| s.root.display().to_string());
        for sec in report
            .sections
            .iter()
            .filter(|s| s.name == "loss" || s.name == "is_loss")
        {
            for c in sec.cells.iter().filter(|c| c.verdict == Verdict::Fail) {
                if let (Some(root), Some(r), Some(m)) = (&other, c.rank, c.micro) {
                    let cmd = format!(
                        "losscheck --dump-dir {} --step {} --rank {r} --micro {m}",
                        crate::postmortem::replay::shell_quote(root),
                        report.step
                    );
                    if !out.contains(&cmd) {
                        out.push(cmd);
                    }
                }
            }
        }
    }
    if out.is_empty() {
        if let Some(f) = report
            .offending_files
            .iter()
            .find(|f| f.section != "coverage")
        {
            out.push(format!(
                "dumpdiff --inspect {}",
                crate::postmortem::replay::shell_quote(&f.path.display().to_string())
            ));
        }
    }
    out.truncate(max);
    out
}
