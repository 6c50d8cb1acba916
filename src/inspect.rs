//! The inspector behind `dumpdiff --inspect`: "what is in this file?" answered as a tree
//! of keys, dtypes, shapes, views and small stats; for a folder, the discovered layout.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::error::{Error, Position, Result};
use crate::formats::{read_any, FileFormat};
use crate::producers::layout::{DumpTree, Kind};
use crate::tensor::Tensor;
use crate::value::Value;

/// A tree (or file) of one of the whole-step producers ([`crate::producers::step_readers`]:
/// verl, NeMo-RL, slime/Miles, SGLang's dumper, AReaL): its producer, steps, and per step
/// its ranks, cells and log-prob roles. `None` when no such producer recognises it (or
/// several do, or a step cannot be read: the caller's own error is the better message).
fn stack_layout(path: &Path) -> Option<String> {
    let reader = crate::producers::step_reader_for(path).ok()?;
    let steps = reader.steps(path).ok()?;
    let mut out = format!("{}  (producer: {})\n", path.display(), reader.name());
    let _ = writeln!(out, "steps: {steps:?}");
    for &step in steps.iter().take(SHOWN_ITEMS) {
        let d = reader.read_step(path, step).ok()?;
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
    if steps.len() > SHOWN_ITEMS {
        let _ = writeln!(out, "… {} more steps", steps.len() - SHOWN_ITEMS);
    }
    Some(out)
}

/// Items of a list shown before the rest is summarised.
const SHOWN_ITEMS: usize = 4;
/// Tensors with at most this many elements are printed in full.
const SHOWN_VALUES: usize = 8;
/// Tensors larger than this many elements get no stats (inspection stays instant).
const STATS_LIMIT: usize = 50_000_000;

/// Describe a dump file (value tree) or a dump folder (layout), as text for a terminal.
pub fn inspect_path(path: &Path) -> Result<String> {
    if crate::formats::source::is_dir(path) {
        return DumpTree::discover(path)
            .map(|t| render_layout(&t))
            .or_else(|e| stack_layout(path).ok_or(e))
            .map_err(|e| {
                // A folder named like a file (`x.pt/`, e.g. an unzipped archive) is most likely
                // not meant as a dump tree: say what it is rather than only what is missing.
                match (FileFormat::from_path(path), e) {
                    (Some(f), Error::Format { .. }) => Error::format(
                        path,
                        Position::File,
                        format!(
                            "is a directory, not a .{} file, and holds no dump folders \
                         (trajectory/, forward_data/, loss/ …)",
                            f.extension()
                        ),
                    ),
                    (_, e) => e,
                }
            });
    }
    let value = match read_any(path) {
        Ok(v) => v,
        Err(e) => return stack_layout(path).ok_or(e),
    };
    let size = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => human_bytes(m.len()),
        _ => "stream".to_string(),
    };
    let mut out = format!("{}  ({size})\n", path.display());
    render_value(&value, "", &mut out);
    Ok(out)
}

/// The Parquet frames of a dump folder, or of one dump file inside a kind folder
/// (`forward_data/step_000003_rank1_micro0.pt`), for `--inspect PATH --export-frames DIR`.
pub fn frames_for_path(path: &Path, step: Option<i64>) -> Result<crate::frames::Frames> {
    if crate::formats::source::is_dir(path) {
        let tree = DumpTree::discover(path)?;
        return crate::frames::build_frames(&tree, step);
    }
    let kind = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(Kind::from_dir_name);
    let coords = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(crate::producers::layout::parse_stem);
    let (Some(kind), Some((file_step, rank, micro))) = (kind, coords) else {
        return Err(Error::format(
            path,
            Position::File,
            "frames need the file's kind, step, rank and micro: it must sit in a kind folder \
             (trajectory/, forward_data/, loss/ …) and be named step_<N>[_rank<R>][_micro<M>]",
        ));
    };
    let value = read_any(path)?;
    let file = crate::producers::layout::DumpFile {
        path: path.to_path_buf(),
        kind,
        step: file_step,
        rank,
        micro,
        format: FileFormat::from_path(path).unwrap_or(FileFormat::Pt),
        size: crate::formats::source::size(path)?,
    };
    let pairs: Vec<(&crate::producers::layout::DumpFile, &Value)> =
        if step.is_none_or(|s| s == file_step) {
            vec![(&file, &value)]
        } else {
            Vec::new()
        };
    crate::frames::frames_of(&pairs)
}

/// Summary statistics of a numeric tensor, computed in f64.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Smallest finite value.
    pub min: f64,
    /// Largest finite value.
    pub max: f64,
    /// Mean of the finite values.
    pub mean: f64,
    /// Number of NaN elements.
    pub nan: usize,
    /// Number of ±inf elements.
    pub inf: usize,
}

/// Stats over the finite values of `t` (min/max/mean are NaN when there are none).
pub fn tensor_stats(t: &Tensor) -> Stats {
    let (mut min, mut max, mut sum, mut n, mut nan, mut inf) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        0usize,
        0usize,
        0usize,
    );
    for x in t.to_f64_vec() {
        if x.is_nan() {
            nan += 1;
        } else if x.is_infinite() {
            inf += 1;
        } else {
            min = min.min(x);
            max = max.max(x);
            sum += x;
            n += 1;
        }
    }
    if n == 0 {
        (min, max) = (f64::NAN, f64::NAN);
    }
    Stats {
        min,
        max,
        mean: if n == 0 { f64::NAN } else { sum / n as f64 },
        nan,
        inf,
    }
}

fn tensor_line(t: &Tensor, from_list: bool) -> String {
    let mut s = if from_list {
        format!(
            "list {} {:?}",
            if t.dtype().is_float() { "float" } else { "int" },
            t.shape()
        )
    } else {
        format!("tensor {} {:?}", t.dtype(), t.shape())
    };
    if !from_list && !t.is_contiguous() || t.offset() != 0 {
        let _ = write!(s, " strides {:?} offset {}", t.strides(), t.offset());
    }
    if !from_list && t.storage_numel() != t.numel() {
        let _ = write!(
            s,
            " (view of storage {} with {} elements)",
            t.storage_key().unwrap_or("?"),
            t.storage_numel()
        );
    }
    if let Some(q) = t.quantization() {
        match (q.scales.as_slice(), q.zero_points.as_slice(), q.axis) {
            ([s1], [z], None) => {
                let _ = write!(s, " ({} scale {s1} zero_point {z}; int_repr", q.scheme);
            }
            (sc, _, axis) => {
                let _ = write!(
                    s,
                    " ({} axis {} with {} scales; int_repr",
                    q.scheme,
                    axis.unwrap_or(0),
                    sc.len()
                );
            }
        }
        s.push(')');
    } else if t.dtype().is_raw() {
        s.push_str(" (raw bits, shown as unsigned integers)");
    }
    if t.dtype().is_complex() {
        if t.numel() <= SHOWN_VALUES {
            let v = t.to_f64_vec();
            let pairs: Vec<String> = v
                .chunks_exact(2)
                .map(|c| {
                    format!(
                        "({}{}{}j)",
                        fmt_num(c[0]),
                        if c[1] < 0.0 || c[1].is_nan() { "" } else { "+" },
                        fmt_num(c[1])
                    )
                })
                .collect();
            let _ = write!(s, " = [{}]", pairs.join(", "));
        }
        return s;
    }
    if t.numel() <= SHOWN_VALUES {
        let vals: Vec<String> = if t.dtype().is_float() {
            t.to_f64_vec().iter().map(|x| fmt_num(*x)).collect()
        } else if t.dtype() == crate::tensor::DType::U64 {
            // Exactly, above i64::MAX too.
            t.element_bytes()
                .chunks_exact(8)
                .map(|c| {
                    // `chunks_exact(8)`: every chunk is 8 bytes.
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    u64::from_le_bytes(b).to_string()
                })
                .collect()
        } else {
            t.to_i64_vec().iter().map(i64::to_string).collect()
        };
        let _ = write!(s, " = [{}]", vals.join(", "));
    } else if t.numel() > 0 && t.numel() <= STATS_LIMIT {
        let st = tensor_stats(t);
        let _ = write!(
            s,
            "  min {} max {} mean {}",
            fmt_num(st.min),
            fmt_num(st.max),
            fmt_num(st.mean)
        );
        if st.nan > 0 || st.inf > 0 {
            let _ = write!(s, "  nan {} inf {}", st.nan, st.inf);
        }
    }
    s
}

/// A number for people: integers plain, moderate values with 6 decimals, the rest in
/// scientific notation (used by the inspector and dumpdiff's findings).
pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() || (x == x.trunc() && x.abs() < 1e15) {
        format!("{x}")
    } else if (1e-3..1e6).contains(&x.abs()) {
        format!("{x:.6}")
    } else {
        format!("{x:.4e}")
    }
}

/// One line describing `v` (without children).
fn headline(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => format!("bool {}", if *b { "True" } else { "False" }),
        Value::Int(i) => format!("int {i}"),
        Value::BigInt(s) => format!("int {s}"),
        Value::Float(f) => format!("float {f:?}"),
        Value::Str(s) => {
            let short: String = s.chars().take(60).collect();
            let ell = if short.len() < s.len() { "…" } else { "" };
            format!("str {short:?}{ell}")
        }
        Value::Bytes(b) => format!("bytes ({} bytes)", b.len()),
        Value::Tensor(t) => tensor_line(t, false),
        Value::Dict(items) => format!("dict ({} keys)", items.len()),
        Value::List(items) | Value::Tuple(items) => match v.to_tensor() {
            Some(t) if !items.is_empty() => tensor_line(&t, true),
            _ => format!("{} ({} items)", v.type_name(), items.len()),
        },
        // Never empty, always numeric: the same line as the list of values it stands for.
        Value::Packed(p) => match v.to_tensor() {
            Some(t) => tensor_line(&t, true),
            None => format!("list ({} items)", p.len()),
        },
    }
}

fn render_value(v: &Value, indent: &str, out: &mut String) {
    let _ = writeln!(out, "{}", headline(v));
    render_children(v, indent, out);
}

fn render_children(v: &Value, indent: &str, out: &mut String) {
    let children: Vec<(String, &Value)> = match v {
        Value::Dict(items) => items.iter().map(|(k, val)| (key_text(k), val)).collect(),
        Value::List(items) | Value::Tuple(items) if v.to_tensor().is_none() => items
            .iter()
            .take(shown(items))
            .enumerate()
            .map(|(i, val)| (format!("[{i}]"), val))
            .collect(),
        _ => return,
    };
    let hidden = match v {
        Value::List(items) | Value::Tuple(items) => items.len().saturating_sub(shown(items)),
        _ => 0,
    };
    let n = children.len();
    for (i, (k, val)) in children.into_iter().enumerate() {
        let last = i + 1 == n && hidden == 0;
        let (branch, cont) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let _ = write!(out, "{indent}{branch}{k}: ");
        render_value(val, &format!("{indent}{cont}"), out);
    }
    if hidden > 0 {
        let _ = writeln!(out, "{indent}└─ … {hidden} more items");
    }
}

/// How many items of a list to expand: one when they are dicts (trajectories, datums:
/// the first shows the shape of all), a few otherwise.
fn shown(items: &[Value]) -> usize {
    if items.first().is_some_and(|v| matches!(v, Value::Dict(_))) {
        1
    } else {
        SHOWN_ITEMS
    }
}

fn key_text(k: &Value) -> String {
    match k {
        Value::Str(s) => s.clone(),
        other => headline(other),
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
