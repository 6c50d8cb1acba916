//! The inspector behind `dumpdiff --inspect`: "what is in this file?" answered as a tree
//! of keys, dtypes, shapes, views and small stats; for a folder, the discovered layout.
//! Renders what the model says of a path ([`Inspected`]); opening it is the producers'
//! (`crate::producers::open::inspect`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::model::outline::{Inspected, Outline, StackView};
use crate::model::tree::{DumpTree, Kind};

/// The text of what a path holds.
pub fn render(i: &Inspected) -> String {
    match i {
        Inspected::Tree(tree) => render_layout(tree),
        Inspected::Stack { path, view } => render_stack(path, view),
        Inspected::File {
            path,
            size,
            outline,
        } => {
            let size = size.map_or_else(|| "stream".to_string(), human_bytes);
            let mut out = format!("{}  ({size})\n", path.display());
            render_outline(outline, "", &mut out);
            out
        }
    }
}

/// A whole-step producer's tree: its producer, steps, and per step read its ranks,
/// cells and log-prob roles.
fn render_stack(path: &Path, view: &StackView) -> String {
    let mut out = format!("{}  (producer: {})\n", path.display(), view.producer);
    let steps = &view.steps;
    let _ = writeln!(out, "steps: {steps:?}");
    for (step, d) in &view.read {
        let ranks: BTreeSet<usize> = d.cells.iter().map(|c| c.rank).collect();
        let micros = d.cells.iter().filter(|c| c.micro.is_some()).count();
        let rows: usize = d.cells.iter().map(|c| c.batch.row_count()).sum();
        let roles: Vec<&str> = d.roles().into_iter().map(|r| r.name()).collect();
        let _ = writeln!(
            out,
            "step {step}: ranks {ranks:?}, {} cells ({micros} micro-batch), {rows} rows, \
             log-prob roles [{}]{}",
            d.cells.len(),
            roles.join(", "),
            if d.unplaced.is_empty() {
                String::new()
            } else {
                format!(", {} keys not in the model", d.unplaced.len())
            }
        );
    }
    if steps.len() > view.read.len() {
        let _ = writeln!(out, "… {} more steps", steps.len() - view.read.len());
    }
    out
}

/// One value's line, then its children as a tree under `indent`.
fn render_outline(o: &Outline, indent: &str, out: &mut String) {
    let _ = writeln!(out, "{}", o.line);
    let n = o.children.len();
    for (i, (k, c)) in o.children.iter().enumerate() {
        let last = i + 1 == n && o.hidden == 0;
        let (branch, cont) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let _ = write!(out, "{indent}{branch}{k}: ");
        render_outline(c, &format!("{indent}{cont}"), out);
    }
    if o.hidden > 0 {
        let _ = writeln!(out, "{indent}└─ … {} more items", o.hidden);
    }
}

/// Compress a set of numbers into ranges: `0-11`, `0,2,5-7`.
pub fn ranges(set: &BTreeSet<u32>) -> String {
    let mut parts = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join(",")
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Ranks with no file of `kind` at `step` that lie within the ranks any kind of that step
/// has (a hole at rank 10 of ranks 0-11 is missing, not "—"), for per-rank kinds only.
fn absent_ranks(tree: &DumpTree, kind: Kind, step: i64) -> Vec<u32> {
    let own = tree.ranks(kind, step);
    if own.is_empty() {
        return Vec::new();
    }
    let all: BTreeSet<u32> = Kind::ALL
        .iter()
        .flat_map(|k| tree.ranks(*k, step))
        .collect();
    let (Some(&lo), Some(&hi)) = (all.first(), all.last()) else {
        return Vec::new();
    };
    (lo..=hi).filter(|r| !own.contains(r)).collect()
}

/// The layout of a dump tree: producer, steps, and per kind and step the files, formats,
/// ranks, micros and holes in the rank × micro grid.
pub fn render_layout(tree: &DumpTree) -> String {
    let mut out = format!(
        "dump tree {}\nproducer: {}   files: {}   size: {}\n",
        tree.root.display(),
        tree.producer,
        tree.files().len(),
        human_bytes(tree.total_bytes())
    );
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "kind", "step", "files", "format", "ranks", "micros", "missing",
    ]);
    for kind in Kind::ALL {
        for step in tree.steps() {
            let files: Vec<_> = tree.files_of(kind, step).collect();
            if files.is_empty() {
                continue;
            }
            let formats: BTreeSet<&str> = files.iter().map(|f| f.format.extension()).collect();
            let missing = tree.missing_cells(kind, step);
            let mut holes: Vec<String> = absent_ranks(tree, kind, step)
                .into_iter()
                .map(|r| format!("rank{r}"))
                .collect();
            holes.extend(missing.iter().map(|(r, m)| format!("rank{r}/micro{m}")));
            let missing_text = if holes.is_empty() {
                "—".to_string()
            } else {
                holes.join(" ")
            };
            table.add_row(vec![
                kind.dir_name().to_string(),
                step.to_string(),
                files.len().to_string(),
                formats.into_iter().collect::<Vec<_>>().join(","),
                ranges(&tree.ranks(kind, step)),
                ranges(&tree.micros(kind, step)),
                missing_text,
            ]);
        }
    }
    let _ = writeln!(out, "{table}");
    if !tree.unrecognised.is_empty() {
        let _ = writeln!(out, "not placed ({} files):", tree.unrecognised.len());
        for u in &tree.unrecognised {
            let _ = writeln!(out, "  {}: {}", u.path.display(), u.reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compress_runs() {
        let s: BTreeSet<u32> = [0, 1, 2, 3, 5, 7, 8, 10, 11].into_iter().collect();
        assert_eq!(ranges(&s), "0-3,5,7-8,10-11");
        assert_eq!(ranges(&BTreeSet::new()), "—");
    }
}
