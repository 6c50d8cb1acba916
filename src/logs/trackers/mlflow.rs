//! MLflow file store (`mlruns/<experiment>/<run>/`): one text file per metric under
//! `metrics/` (the key's `/` become sub-folders), each line `<timestamp ms> <value>
//! <step>`, NaN written `nan`; parameters one file per key under `params/`. The SQLite
//! backend (`mlflow.db`) is read by [`super::sqlite`].

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::lines::{self, Ended, Flow};
use super::rows::{RowHead, RowWriter};
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
/// once, when its first row is handed on: no `String` per line). The lines are parsed in
/// parallel parts cut at newlines ([`super::lines`]) and added in file order.
pub fn read(path: &Path, input: impl Read, stats: &mut FileStats, w: &mut RowWriter) -> Result<()> {
    read_with(path, input, stats, w, (lines::CHUNK, lines::PART))
}

/// [`read`] with `sizes` (chunk, part) bytes for the parallel parse (small in tests).
pub(crate) fn read_with(
    path: &Path,
    input: impl Read,
    stats: &mut FileStats,
    w: &mut RowWriter,
    sizes: (usize, usize),
) -> Result<()> {
    let (_, key) = metric_key(path).ok_or_else(|| {
        Error::format(
            path,
            Position::File,
            "not an MLflow metric file (expected <run>/metrics/<key> beside <run>/meta.yaml)",
        )
    })?;
    let mut n: u64 = 0;
    let mut id = None;
    let mut map = [0u32];
    let ended = lines::parse_parts(input, Vec::new(), sizes, &parse_part, &mut |mut p: Part| {
        if p.has_row {
            map[0] = *id.get_or_insert_with(|| w.keys.id_str(&key));
        }
        // Files from MLflow before 1.0 have no step: the line order is the step.
        for &r in &p.stepless {
            if let Some(h) = p.heads.get_mut(r) {
                h.step = h.step.map(|s| s + n as i64);
            }
        }
        w.rows_built(&p.heads, &p.fields, Some(&map[..]), n);
        for (l, m) in p.bad {
            stats.bad_line(n + l, m);
        }
        stats.truncated_last_line |= p.truncated;
        stats.records += p.heads.len() as u64;
        stats.non_finite += p.non_finite;
        stats.bytes += p.bytes;
        n += p.lines;
        if p.not_utf8 {
            // What `BufRead::read_line` says of such a line.
            let e = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            );
            return Err(Error::io(path, e));
        }
        Ok(Flow::Go)
    })
    .map_err(|e| Error::io(path, e))??;
    debug_assert!(matches!(ended, Ended::Eof));
    stats.lines = n;
    Ok(())
}

/// The rows of a part's lines, parsed on a worker: line numbers 1-based within the part,
/// the one key's id 0.
#[derive(Default)]
struct Part {
    bytes: u64,
    lines: u64,
    heads: Vec<RowHead>,
    fields: Vec<(u32, f64)>,
    /// Rows whose step is their line's number in the part less one (no step written).
    stepless: Vec<usize>,
    has_row: bool,
    bad: Vec<(u64, String)>,
    truncated: bool,
    non_finite: u64,
    /// The part stopped at a line that is not UTF-8 (the lines before it are read).
    not_utf8: bool,
}

/// Parse whole lines `b` (the input's last may lack its newline: cut short by a crash).
fn parse_part(b: &[u8]) -> Part {
    let mut p = Part {
        heads: Vec::with_capacity(b.len() / 24),
        fields: Vec::with_capacity(b.len() / 24),
        ..Part::default()
    };
    let mut rest = b;
    while !rest.is_empty() {
        let (raw, after) = match memchr::memchr(b'\n', rest) {
            Some(i) => rest.split_at(i + 1),
            None => (rest, &b""[..]),
        };
        rest = after;
        if let Some((ts, v, step)) = plain_line(raw) {
            p.lines += 1;
            p.bytes += raw.len() as u64;
            p.non_finite += (!v.is_finite()) as u64;
            p.fields.push((0, v));
            p.heads.push(RowHead {
                step: Some(step),
                timestamp: Some(ts / 1000.0),
                source: SourceKind::Mlflow,
                line: p.lines,
                fields: 1,
            });
            p.has_row = true;
            continue;
        }
        let Ok(line) = std::str::from_utf8(raw) else {
            p.not_utf8 = true;
            break;
        };
        p.lines += 1;
        p.bytes += raw.len() as u64;
        let n = p.lines;
        // MLflow ends every line with a newline: a last line without one was cut by a
        // crash mid-write (its value or step may be partial) and is not read.
        if !line.ends_with('\n') {
            p.truncated = true;
            p.bad
                .push((n, format!("last line cut short: {:?}", line.trim())));
            continue;
        }
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let mut it = t.split_ascii_whitespace();
        let (Some(ts), Some(v), step) = (it.next(), it.next(), it.next()) else {
            p.bad
                .push((n, format!("expected `timestamp value step`, found {t:?}")));
            continue;
        };
        let (Ok(ts), Ok(v)) = (ts.parse::<f64>(), v.parse::<f64>()) else {
            p.bad.push((n, format!("expected numbers, found {t:?}")));
            continue;
        };
        let step = match step.map(str::parse::<i64>) {
            Some(Ok(s)) => s,
            None => {
                p.stepless.push(p.heads.len());
                n as i64 - 1
            }
            Some(Err(_)) => {
                p.bad.push((n, format!("step is not an integer in {t:?}")));
                continue;
            }
        };
        p.non_finite += (!v.is_finite()) as u64;
        p.fields.push((0, v));
        p.heads.push(RowHead {
            step: Some(step),
            timestamp: Some(ts / 1000.0),
            source: SourceKind::Mlflow,
            line: n,
            fields: 1,
        });
        p.has_row = true;
    }
    p
}

/// A whole line `timestamp value step\n` of plain numbers, one space apart (nearly every
/// line MLflow writes): its numbers as the general parse in [`parse_part`] reads them, from
/// the bytes ([`super::json_num::number_prefix`], plain digits for the step); `None` for
/// any other line, which the general parse then reads.
#[inline]
fn plain_line(raw: &[u8]) -> Option<(f64, f64, i64)> {
    use super::json_num::{digits_prefix, number_prefix};
    let (ts, a) = number_prefix(raw)?;
    let rest = raw.get(a..)?.strip_prefix(b" ")?;
    let (v, b) = number_prefix(rest)?;
    let rest = rest.get(b..)?.strip_prefix(b" ")?;
    let (step, c) = digits_prefix(rest)?;
    (rest.get(c..)? == b"\n").then_some((ts, v, step))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::trackers::rows::{read_bit_rows, BitRow as Row};

    /// A metric file `train/loss` of a run folder holding `text`, read with `sizes`: the
    /// result (its message), the statistics (as `Debug`) and the rows.
    fn read_metric(text: &[u8], sizes: (usize, usize)) -> (String, String, Vec<Row>) {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("0").join("abc");
        std::fs::create_dir_all(run.join("metrics").join("train")).unwrap();
        std::fs::write(run.join("meta.yaml"), "run_id: abc\n").unwrap();
        let path = run.join("metrics").join("train").join("loss");
        let mut stats = FileStats::default();
        let (res, _, out) = read_bit_rows(|w| read_with(&path, text, &mut stats, w, sizes));
        let res = match res {
            Ok(()) => "ok".to_string(),
            Err(e) => e
                .to_string()
                .replace(&dir.path().display().to_string(), "DIR"),
        };
        let stats = format!("{stats:?}").replace(&dir.path().display().to_string(), "DIR");
        (res, stats, out)
    }

    /// Every chunk and part size reads `text` as one piece does.
    fn same_at_every_size(text: &[u8]) -> (String, String, Vec<Row>) {
        let whole = read_metric(text, (1 << 20, 1 << 20));
        for chunk in 1..text.len() + 2 {
            for part in [1, 2, 3, 5, 8, 13, 21, 34, text.len() + 1] {
                assert_eq!(
                    read_metric(text, (chunk, part)),
                    whole,
                    "chunk {chunk} part {part}"
                );
            }
        }
        whole
    }

    /// The plain-line path reads what the general parse reads, and declines the rest.
    #[test]
    fn plain_lines_read_as_the_general_parse() {
        let general = |l: &str| -> Option<(u64, u64, i64)> {
            let mut it = l.trim().split_ascii_whitespace();
            let (ts, v, step) = (it.next()?, it.next()?, it.next()?);
            let (ts, v) = (ts.parse::<f64>().ok()?, v.parse::<f64>().ok()?);
            Some((ts.to_bits(), v.to_bits(), step.parse().ok()?))
        };
        let mut lines: Vec<String> = [
            "1700000000000 0.5 0\n",
            "1700000000000 0.5720000000000001 12\n",
            "1700000000000 0.9970000000000001 12\n",
            "1700000000000 -0.0 3\n",
            "1700000000000 1e-3 4\n",
            "1700000000000 1.5E+300 4\n",
            "1700000000000 12345678901234567890123 5\n",
            "1700000000000.5 2 007\n",
            "-1 2 3\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for i in 0..2000u64 {
            let v = (i * 7919 % 1000) as f64 / 7.0 - 50.0;
            lines.push(format!("{} {v} {i}\n", 1_700_000_000_000u64 + i * 997));
        }
        let mut taken = 0;
        for l in &lines {
            if let Some((ts, v, step)) = plain_line(l.as_bytes()) {
                taken += 1;
                assert_eq!(Some((ts.to_bits(), v.to_bits(), step)), general(l), "{l:?}");
            }
        }
        assert!(taken > 2000, "{taken}");
        for l in [
            "1700000000000 nan 1\n",
            "1700000000000 0.5 1",
            "1700000000000  0.5 1\n",
            "1700000000000 0.5 1 extra\n",
            "1700000000000 0.5 -1\n",
            "1700000000000 0.5\n",
            "1700000000000 0.5 1\r\n",
            "+1 0.5 1\n",
        ] {
            assert!(plain_line(l.as_bytes()).is_none(), "{l:?}");
        }
    }

    #[test]
    fn every_part_size_gives_the_one_piece_rows() {
        let text = b"1700000000000 0.5 0\n1700000001000 nan 1\n\n  \n1700000002000 x 2\n\
            1700000003000 0.25\n1700000004000 1e-3 4 extra\n1700000005000 2 five\n1700000006000 -inf 6\n";
        let (res, stats, rows) = same_at_every_size(text);
        assert_eq!(res, "ok");
        let got: Vec<(Option<i64>, u64)> = rows.iter().map(|r| (r.0, r.2)).collect();
        // The line without a step takes its line's number less one.
        assert_eq!(
            got,
            [
                (Some(0), 1),
                (Some(1), 2),
                (Some(5), 6),
                (Some(4), 7),
                (Some(6), 9)
            ]
        );
        assert!(rows
            .iter()
            .all(|r| r.3.len() == 1 && r.3[0].0 == "train/loss"));
        assert!(
            stats.contains(
                "line: 5, message: \"expected numbers, found \\\"1700000002000 x 2\\\"\""
            ),
            "{stats}"
        );
        assert!(
            stats.contains("line: 8, message: \"step is not an integer"),
            "{stats}"
        );
        assert!(
            stats.contains("lines: 9,") && stats.contains("non_finite: 2,"),
            "{stats}"
        );
    }

    #[test]
    fn cut_last_line_is_skipped_with_its_line() {
        let text = b"1700000000000 0.5 0\n1700000001000 0.75 1\n1700000002000 0.1";
        let (res, stats, rows) = same_at_every_size(text);
        assert_eq!(res, "ok");
        assert_eq!(rows.len(), 2);
        assert!(stats.contains("truncated_last_line: true"), "{stats}");
        assert!(
            stats.contains("line: 3, message: \"last line cut short: \\\"1700000002000 0.1\\\"\""),
            "{stats}"
        );
        assert!(stats.contains(&format!("bytes: {}", text.len())), "{stats}");
    }

    #[test]
    fn not_utf8_line_is_an_error_naming_the_file_after_the_lines_before() {
        let text =
            b"1700000000000 0.5 0\n1700000001000 0.75 1\n17000\xff 0.1 2\n1700000003000 1 3\n";
        let (res, _, rows) = same_at_every_size(text);
        assert_eq!(
            res,
            "DIR/0/abc/metrics/train/loss: stream did not contain valid UTF-8"
        );
        assert_eq!(rows.len(), 2);
    }
}
