//! CSV metric tables: the W&B UI's chart export (`Step`, `<run> - <key>`, and the
//! smoothing band's `<run> - <key>__MIN` / `__MAX`, which are skipped) and plain tables with
//! a step column (`step`, `global_step`, `_step`, `iteration`, …). Empty cells are
//! missing values; `nan`/`NaN`/`inf` are kept as non-finite numbers.

use std::io::Read;
use std::path::Path;

use super::lines::{self, Ended, Flow};
use super::rows::{Keys, RowHead, RowWriter};
use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, SourceKind};

/// Column names taken as the step axis, in order of preference (compared lowercased).
const STEP_COLUMNS: [&str; 7] = [
    "step",
    "global_step",
    "train/global_step",
    "_step",
    "iteration",
    "iter",
    "epoch",
];

/// Column names taken as a Unix timestamp in seconds.
const TIME_COLUMNS: [&str; 4] = ["_timestamp", "timestamp", "wall_time", "time"];

/// What a column holds.
#[derive(Debug, Clone, PartialEq)]
enum Col {
    Step,
    Time,
    Metric(String),
    Skip,
}

/// True when the CSV file at `path` has a step column in its header: a directory scan
/// takes only such CSVs (a data set's CSV beside the logs is not a metric table).
pub fn has_step_column(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut rdr = ::csv::ReaderBuilder::new().flexible(true).from_reader(f);
    rdr.headers().is_ok_and(|h| {
        h.iter()
            .any(|n| STEP_COLUMNS.contains(&n.trim().to_ascii_lowercase().as_str()))
    })
}

/// Read one CSV table into `w`, one row per table row. Each column's key is interned
/// once, when a row first hands it on (the order a record-by-record reader interns them,
/// so the frame sees the same keys in the same order), and a row's values go to `w` with
/// their ids: no `String` per cell. A table whose lines are plain (no quote, no carriage
/// return, no empty line, UTF-8) is parsed in parallel parts cut at newlines
/// ([`super::lines`]); from the first chunk that is not, the `csv` crate reads the rest
/// on this thread, with the same rows, line numbers and errors.
pub fn read(path: &Path, input: impl Read, stats: &mut FileStats, w: &mut RowWriter) -> Result<()> {
    read_with(path, input, stats, w, (lines::CHUNK, lines::PART))
}

/// [`read`] with `sizes` (chunk, part) bytes for the parallel parse (small in tests; a
/// chunk of 0 reads the whole table serially).
pub(crate) fn read_with(
    path: &Path,
    mut input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    sizes: (usize, usize),
) -> Result<()> {
    let mut head = Vec::new();
    (&mut input)
        .take(sizes.0 as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    // The header alone, when it is a plain line: the rest may be read in parallel.
    let header_end = memchr::memchr(b'\n', &head)
        .map(|i| i + 1)
        .filter(|&n| n > 1 && plain(head.get(..n).unwrap_or_default()));
    let Some(header_end) = header_end else {
        let mut rdr = ::csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(true)
            .from_reader(std::io::Cursor::new(head).chain(input));
        let cols = columns(path, &mut rdr, stats)?;
        return serial(path, rdr, &cols, Base::default(), 1, stats, w);
    };
    let mut hdr = ::csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(head.get(..header_end).unwrap_or_default());
    let cols = columns(path, &mut hdr, stats)?;
    let mut at = Base {
        byte: header_end as u64,
        newlines: 1,
        record: 1,
    };
    let mut line: u64 = 1;
    let mut map: Vec<u32> = Vec::new();
    let parse = |b: &[u8]| parse_part(&cols, b);
    let ended = lines::parse_parts(
        input,
        head.get(header_end..).unwrap_or_default().to_vec(),
        sizes,
        &parse,
        &mut |p: CsvPart| {
            if p.unfit {
                return Ok(Flow::Stop);
            }
            map.clear();
            map.extend(p.names.iter().map(|k| w.keys.id_str(k)));
            w.rows_built(&p.heads, &p.fields, Some(&map[..]), at.newlines);
            for (l, m) in p.bad {
                stats.bad_line(at.newlines + l, m);
            }
            stats.records += p.heads.len() as u64;
            stats.non_finite += p.non_finite;
            if p.last_line > 0 {
                line = at.newlines + p.last_line;
            }
            at.byte += p.bytes;
            at.newlines += p.lines;
            at.record += p.records;
            Ok(Flow::Go)
        },
    )
    .map_err(|e| Error::io(path, e))??;
    match ended {
        Ended::Eof => {
            stats.lines = line;
            stats.bytes = at.byte;
            Ok(())
        }
        Ended::Stopped(rest, input) => {
            let rdr = ::csv::ReaderBuilder::new()
                .has_headers(false)
                .flexible(true)
                .from_reader(std::io::Cursor::new(rest).chain(input));
            serial(path, rdr, &cols, at, line, stats, w)
        }
    }
}

/// True for bytes the parallel parse reads as the `csv` crate does: no quote (a quoted
/// field may hold a newline or a comma) and no carriage return (a lone one ends a record).
fn plain(b: &[u8]) -> bool {
    memchr::memchr2(b'"', b'\r', b).is_none()
}

/// The columns of the table's header (read from `rdr`), refusing a table with no step
/// column or a W&B export of several runs.
fn columns<R: Read>(
    path: &Path,
    rdr: &mut ::csv::Reader<R>,
    stats: &mut FileStats,
) -> Result<Vec<Col>> {
    let headers = rdr
        .headers()
        .map_err(|e| Error::format(path, Position::Line(1), format!("CSV header: {e}")))?
        .clone();
    let names: Vec<String> = headers.iter().map(|h| h.trim().to_string()).collect();
    let lower: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
    let step_col = STEP_COLUMNS
        .iter()
        .find_map(|s| lower.iter().position(|n| n == s))
        .ok_or_else(|| {
            Error::format(
                path,
                Position::Line(1),
                format!(
                    "CSV has no step column (looked for {}); header: {}",
                    STEP_COLUMNS.join(", "),
                    names.join(",")
                ),
            )
        })?;
    // A W&B chart export: every other column is `<run> - <key>`.
    let wandb_export = names
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != step_col)
        .all(|(_, n)| n.contains(" - "));
    let mut runs: Vec<&str> = Vec::new();
    let mut cols: Vec<Col> = Vec::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        let l = &lower[i];
        let col = if i == step_col {
            Col::Step
        } else if TIME_COLUMNS.contains(&l.as_str()) {
            Col::Time
        } else if wandb_export {
            match n.split_once(" - ") {
                Some((_, k)) if k.ends_with("__MIN") || k.ends_with("__MAX") => Col::Skip,
                Some((run, k)) => {
                    if !runs.contains(&run) {
                        runs.push(run);
                    }
                    Col::Metric(k.to_string())
                }
                None => Col::Skip,
            }
        } else if n.is_empty() {
            Col::Skip
        } else {
            Col::Metric(n.clone())
        };
        cols.push(col);
    }
    if runs.len() > 1 {
        return Err(Error::format(
            path,
            Position::Line(1),
            format!(
                "W&B export holds {} runs ({}); export one run per file to scan or compare them",
                runs.len(),
                runs.join(", ")
            ),
        ));
    }
    if wandb_export {
        stats.format = "wandb_csv".to_string();
    }
    Ok(cols)
}

/// Where a part or the serial rest starts: its byte offset, the newlines before it, and
/// the `csv` crate's records before it (the header is one).
#[derive(Debug, Default, Clone, Copy)]
struct Base {
    byte: u64,
    newlines: u64,
    record: u64,
}

/// One row's cells: its step and time, and its `(column, value)` metric cells; the step
/// cell's complaint goes to `bad`.
fn row_cells<'a>(
    cells: impl Iterator<Item = &'a str>,
    cols: &[Col],
    out: &mut Vec<(usize, f64)>,
    bad: &mut dyn FnMut(String),
) -> (Option<i64>, Option<f64>) {
    let mut row = (None, None);
    out.clear();
    for (i, (cell, col)) in cells.zip(cols).enumerate() {
        take_cell(i, cell, col, &mut row, out, bad);
    }
    row
}

/// Cell `cell` of column `i` (kind `col`) into the row's (step, time) or its metric cells.
#[inline]
fn take_cell(
    i: usize,
    cell: &str,
    col: &Col,
    (step, timestamp): &mut (Option<i64>, Option<f64>),
    out: &mut Vec<(usize, f64)>,
    bad: &mut dyn FnMut(String),
) {
    let cell = cell.trim();
    if cell.is_empty() {
        return;
    }
    match col {
        Col::Step => match parse_step(cell) {
            Some(s) => *step = Some(s),
            None => bad(format!("step {cell:?} is not an integer")),
        },
        Col::Time => *timestamp = number(cell),
        Col::Metric(_) => match number(cell) {
            Some(v) => out.push((i, v)),
            None if cell.eq_ignore_ascii_case("true") => out.push((i, 1.0)),
            None if cell.eq_ignore_ascii_case("false") => out.push((i, 0.0)),
            None => {}
        },
        Col::Skip => {}
    }
}

/// [`row_cells`] of a plain line (no quote, no newline): one pass over its bytes. A cell
/// that starts as a plain number is read by the number parse itself, which must end at the
/// cell's end (a comma or the line's end): the cell is then that number untrimmed, as
/// [`take_cell`] reads it; any other cell is cut at its comma and goes to [`take_cell`].
fn plain_row_cells(
    line: &str,
    cols: &[Col],
    out: &mut Vec<(usize, f64)>,
    bad: &mut dyn FnMut(String),
) -> (Option<i64>, Option<f64>) {
    let mut row = (None, None);
    out.clear();
    let b = line.as_bytes();
    let mut at = 0usize;
    for (i, col) in cols.iter().enumerate() {
        let rest = b.get(at..).unwrap_or_default();
        let fast = match col {
            Col::Metric(_) => plain_number(rest).map(|(v, n)| {
                out.push((i, v));
                n
            }),
            Col::Time => plain_number(rest).map(|(v, n)| {
                row.1 = Some(v);
                n
            }),
            Col::Step => plain_step(rest).map(|(s, n)| {
                row.0 = Some(s);
                n
            }),
            Col::Skip => None,
        };
        let end = match fast {
            Some(n) => at + n,
            None => {
                let end = rest
                    .iter()
                    .position(|&c| c == b',')
                    .map_or(b.len(), |k| at + k);
                let cell = line.get(at..end).unwrap_or_default();
                take_cell(i, cell, col, &mut row, out, bad);
                end
            }
        };
        if end >= b.len() {
            break;
        }
        at = end + 1;
    }
    row
}

/// A plain number cell at the start of `rest` ([`super::json_num::number_prefix`]) ending
/// at a comma or at the end of `rest`: the value and the cell's length.
#[inline]
fn plain_number(rest: &[u8]) -> Option<(f64, usize)> {
    super::json_num::number_prefix(rest).filter(|&(_, n)| matches!(rest.get(n), None | Some(b',')))
}

/// A step cell of plain digits at the start of `rest` ([`super::json_num::digits_prefix`])
/// ending at a comma or at the end of `rest`: the step and the cell's length.
#[inline]
fn plain_step(rest: &[u8]) -> Option<(i64, usize)> {
    super::json_num::digits_prefix(rest).filter(|&(_, n)| matches!(rest.get(n), None | Some(b',')))
}

/// A cell as a number, as `str::parse` reads it (plain decimals straight from the bytes,
/// [`super::json_num::fast_number`]; the rest, `inf`, `+1`, `.5`, by `str::parse`).
fn number(cell: &str) -> Option<f64> {
    super::json_num::fast_number(cell.as_bytes()).or_else(|| cell.parse().ok())
}

/// The rows of plain lines parsed on a worker: line numbers 1-based within the part, key
/// ids the part's own (`names`), in the order its rows first hand them on.
#[derive(Default)]
struct CsvPart {
    /// Not plain ([`plain`], an empty line, not UTF-8): the `csv` crate reads from here.
    unfit: bool,
    bytes: u64,
    lines: u64,
    records: u64,
    /// The part's line of its last record (0: none).
    last_line: u64,
    names: Vec<String>,
    heads: Vec<RowHead>,
    fields: Vec<(u32, f64)>,
    bad: Vec<(u64, String)>,
    non_finite: u64,
}

/// Parse plain CSV lines `b` (whole lines; the input's last may lack its newline).
fn parse_part(cols: &[Col], b: &[u8]) -> CsvPart {
    let unfit = CsvPart {
        unfit: true,
        ..CsvPart::default()
    };
    if !plain(b) {
        return unfit;
    }
    let Ok(text) = std::str::from_utf8(b) else {
        return unfit;
    };
    let mut p = CsvPart {
        bytes: b.len() as u64,
        heads: Vec::with_capacity(b.len() / 64),
        fields: Vec::with_capacity(b.len() / 8),
        ..CsvPart::default()
    };
    let mut keys = Keys::default();
    let mut ids: Vec<Option<u32>> = vec![None; cols.len()];
    let mut cells: Vec<(usize, f64)> = Vec::with_capacity(cols.len());
    let mut at = 0usize;
    while at < b.len() {
        let end = memchr::memchr(b'\n', b.get(at..).unwrap_or_default()).map(|i| at + i);
        let l = text.get(at..end.unwrap_or(b.len())).unwrap_or_default();
        at = end.map_or(b.len(), |e| e + 1);
        // An empty line is no record: the `csv` crate's line numbers then follow rules
        // the serial read keeps.
        if l.is_empty() {
            return unfit;
        }
        // The input's last line may lack its newline.
        p.lines += end.is_some() as u64;
        let n = p.lines + end.is_none() as u64;
        p.records += 1;
        p.last_line = n;
        let bad = &mut p.bad;
        let (step, timestamp) = plain_row_cells(l, cols, &mut cells, &mut |m| bad.push((n, m)));
        if step.is_none() || cells.is_empty() {
            continue;
        }
        let mut k = 0u32;
        for &(i, v) in &cells {
            let id = match (ids.get(i).copied().flatten(), cols.get(i)) {
                (Some(id), _) => id,
                (None, Some(Col::Metric(name))) => {
                    let id = keys.id_str(name);
                    if let Some(slot) = ids.get_mut(i) {
                        *slot = Some(id);
                    }
                    id
                }
                (None, _) => continue,
            };
            p.non_finite += (!v.is_finite()) as u64;
            p.fields.push((id, v));
            k += 1;
        }
        p.heads.push(RowHead {
            step,
            timestamp,
            source: SourceKind::Csv,
            line: n,
            fields: k,
        });
    }
    p.names = keys.names().to_vec();
    p
}

/// Read the rest of the table from `rdr` (header read, or starting at `at` after the
/// lines already read, the last record on line `line`) on this thread, positions and
/// error messages as one reader of the whole file gives them.
fn serial<R: Read>(
    path: &Path,
    mut rdr: ::csv::Reader<R>,
    cols: &[Col],
    at: Base,
    mut line: u64,
    stats: &mut FileStats,
    w: &mut RowWriter,
) -> Result<()> {
    let mut rec = ::csv::StringRecord::new();
    // The row's `(column, value)` pairs, and each column's key id once handed on.
    let mut cells: Vec<(usize, f64)> = Vec::with_capacity(cols.len());
    let mut ids: Vec<Option<u32>> = vec![None; cols.len()];
    let mut fields: Vec<(u32, f64)> = Vec::with_capacity(cols.len());
    loop {
        match rdr.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(serial_error(path, e, at, line)),
        }
        line = rec.position().map_or(line + 1, |p| at.newlines + p.line());
        let (step, timestamp) = row_cells(rec.iter(), cols, &mut cells, &mut |m| {
            stats.bad_line(line, m)
        });
        if step.is_some() && !cells.is_empty() {
            stats.records += 1;
            stats.non_finite += cells.iter().filter(|(_, v)| !v.is_finite()).count() as u64;
            fields.clear();
            for &(i, v) in &cells {
                let id = match (ids.get(i).copied().flatten(), cols.get(i)) {
                    (Some(id), _) => id,
                    (None, Some(Col::Metric(k))) => {
                        let id = w.keys.id_str(k);
                        if let Some(slot) = ids.get_mut(i) {
                            *slot = Some(id);
                        }
                        id
                    }
                    (None, _) => continue,
                };
                fields.push((id, v));
            }
            w.uncounted_row(step, timestamp, SourceKind::Csv, line, &fields);
        }
    }
    stats.lines = line;
    stats.bytes = at.byte + rdr.position().byte();
    Ok(())
}

/// A `csv` crate error of a read starting at `at`, its position moved to the file's.
fn serial_error(path: &Path, e: ::csv::Error, at: Base, line: u64) -> Error {
    let l = e.position().map_or(line + 1, |p| at.newlines + p.line());
    let msg = match e.kind() {
        ::csv::ErrorKind::Utf8 { pos: Some(p), err } => format!(
            "CSV parse error: record {} (line {}, field: {}, byte: {}): {}",
            at.record + p.record(),
            at.newlines + p.line(),
            err.field(),
            at.byte + p.byte(),
            err
        ),
        _ => e.to_string(),
    };
    Error::format(path, Position::Line(l), msg)
}

/// A step cell: an integer, or an integral float (`12.0`, as pandas writes them).
fn parse_step(cell: &str) -> Option<i64> {
    if let Ok(i) = cell.parse::<i64>() {
        return Some(i);
    }
    let f = cell.parse::<f64>().ok()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
}

#[cfg(test)]
#[path = "csv_tests.rs"]
mod tests;
