//! Tracker databases in SQLite, read with rusqlite (SQLite compiled in) and told apart by
//! their tables:
//! - MLflow's SQLite backend (`mlflow.db`): `metrics(key, value, timestamp ms, run_uuid,
//!   step, is_nan)` where a NaN is stored as 0 with `is_nan = 1` and ±inf as ±`f64::MAX`;
//!   `params(key, value, run_uuid)`, `runs(run_uuid, name, lifecycle_stage, …)`;
//! - Trackio's project database (`<project>.db`): `metrics(id, run_id, timestamp ISO-8601,
//!   run_name, step, metrics JSON)` where NaN and ±inf are the strings `"NaN"`,
//!   `"Infinity"`, `"-Infinity"`; `configs(run_name, config JSON)`.
//!
//! One input is one run: a database holding several runs is refused with their names
//! unless the run is named (`logscan --run NAME`, a name or an id).

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, LogRecord, SourceKind};

/// The first bytes of every SQLite 3 database file.
pub const MAGIC: &[u8] = b"SQLite format 3\0";

/// Which tracker wrote a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// MLflow's tracking store.
    Mlflow,
    /// A Trackio project.
    Trackio,
}

impl Schema {
    /// The format name shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            Schema::Mlflow => "mlflow_db",
            Schema::Trackio => "trackio",
        }
    }
}

/// An error about database `path` (no byte position: SQLite reports none).
fn db_error(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::format(path, Position::File, format!("SQLite: {what}"))
}

/// Open `path` read-only. SQLite needs a file it can seek in: a pipe is refused.
fn open(path: &Path) -> Result<Connection> {
    if !path.is_file() {
        return Err(Error::format(
            path,
            Position::File,
            "a tracker database must be a regular file (SQLite cannot read a pipe)",
        ));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| db_error(path, e))?;
    Ok(conn)
}

/// The columns of `table`, lowercased (empty when there is no such table).
fn columns(path: &Path, conn: &Connection, table: &str) -> Result<Vec<String>> {
    let mut st = conn
        .prepare("SELECT name FROM pragma_table_info(?1)")
        .map_err(|e| db_error(path, e))?;
    let rows = st
        .query_map([table], |r| r.get::<_, String>(0))
        .map_err(|e| db_error(path, e))?;
    let mut out = Vec::new();
    for r in rows {
        out.push(r.map_err(|e| db_error(path, e))?.to_ascii_lowercase());
    }
    Ok(out)
}

/// Which tracker's tables `conn` holds; an error naming what was found otherwise.
fn schema(path: &Path, conn: &Connection) -> Result<Schema> {
    let metrics = columns(path, conn, "metrics")?;
    let has = |c: &str| metrics.iter().any(|m| m == c);
    if has("run_uuid") && has("is_nan") && has("key") && has("value") && has("step") {
        return Ok(Schema::Mlflow);
    }
    if has("run_name") && has("metrics") && has("step") {
        return Ok(Schema::Trackio);
    }
    let mut st = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .map_err(|e| db_error(path, e))?;
    let tables: Vec<String> = st
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(|e| db_error(path, e))?
        .collect::<rusqlite::Result<_>>()
        .map_err(|e| db_error(path, e))?;
    Err(Error::format(
        path,
        Position::File,
        format!(
            "SQLite database of no known tracker (neither MLflow's `metrics(run_uuid, is_nan, …)` nor Trackio's `metrics(run_name, metrics, …)`); tables: {}",
            if tables.is_empty() {
                "none".to_string()
            } else {
                tables.join(", ")
            }
        ),
    ))
}

/// The tracker that wrote the database at `path`.
pub fn detect(path: &Path) -> Result<Schema> {
    schema(path, &open(path)?)
}

/// The one run of an MLflow database, or the one `want` names: `(run_uuid, name)`.
fn mlflow_run(path: &Path, conn: &Connection, want: Option<&str>) -> Result<(String, String)> {
    let mut st = conn
        .prepare(
            "SELECT run_uuid, COALESCE(name, '') FROM runs \
             WHERE COALESCE(lifecycle_stage, 'active') != 'deleted' ORDER BY start_time, run_uuid",
        )
        .map_err(|e| db_error(path, e))?;
    let runs: Vec<(String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(|e| db_error(path, e))?
        .collect::<rusqlite::Result<_>>()
        .map_err(|e| db_error(path, e))?;
    one_run(path, "MLflow", runs, want)
}

/// The one Trackio run of the database, or the one `want` names: `(run_name, run_name)`
/// (`want` may also be a run id).
fn trackio_run(path: &Path, conn: &Connection, want: Option<&str>) -> Result<(String, String)> {
    let mut st = conn
        .prepare("SELECT run_name, MIN(run_id) FROM metrics GROUP BY run_name ORDER BY MIN(id)")
        .map_err(|e| db_error(path, e))?;
    let runs: Vec<(String, String)> = st
        .query_map([], |r| {
            let n: String = r.get(0)?;
            let id: String = r.get(1)?;
            Ok((id, n))
        })
        .map_err(|e| db_error(path, e))?
        .collect::<rusqlite::Result<_>>()
        .map_err(|e| db_error(path, e))?;
    let (_, name) = one_run(path, "Trackio", runs, want)?;
    Ok((name.clone(), name))
}

/// The run of `runs` (`(id, name)` pairs) that `want` names by name or id, or the single
/// run when `want` is `None`; otherwise an error listing them.
fn one_run(
    path: &Path,
    what: &str,
    runs: Vec<(String, String)>,
    want: Option<&str>,
) -> Result<(String, String)> {
    let list = |runs: &[(String, String)]| -> String {
        runs.iter()
            .map(|(a, b)| {
                if a == b {
                    a.clone()
                } else {
                    format!("{b} ({a})")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(w) = want {
        let hits: Vec<&(String, String)> = runs.iter().filter(|(a, b)| a == w || b == w).collect();
        return match hits.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(Error::format(
                path,
                Position::File,
                format!(
                    "{what} database has no run named {w:?} (runs: {})",
                    list(&runs)
                ),
            )),
            _ => Err(Error::format(
                path,
                Position::File,
                format!(
                    "{what} database has {} runs named {w:?}; pass an id: {}",
                    hits.len(),
                    hits.iter()
                        .map(|(a, _)| a.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        };
    }
    match runs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::format(
            path,
            Position::File,
            format!("{what} database holds no run"),
        )),
        _ => Err(Error::format(
            path,
            Position::File,
            format!(
                "{what} database holds {} runs ({}); logscan reads one run per input: pick one with --run NAME",
                runs.len(),
                list(&runs)
            ),
        )),
    }
}

/// Stream the database's one run into `push`, one record per step (MLflow) or per logged
/// row (Trackio), in step order. Returns which tracker wrote it.
pub fn read(
    path: &Path,
    file: usize,
    run: Option<&str>,
    stats: &mut FileStats,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<Schema> {
    let conn = open(path)?;
    let schema = schema(path, &conn)?;
    stats.bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    stats.format = schema.name().to_string();
    match schema {
        Schema::Mlflow => read_mlflow(path, &conn, file, run, stats, push)?,
        Schema::Trackio => read_trackio(path, &conn, file, run, stats, push)?,
    }
    Ok(schema)
}

/// MLflow metric rows, grouped into one record per (step, timestamp).
fn read_mlflow(
    path: &Path,
    conn: &Connection,
    file: usize,
    want: Option<&str>,
    stats: &mut FileStats,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<()> {
    let (run, _) = mlflow_run(path, conn, want)?;
    let (rows, keys) = if plain_metrics_table(path, conn)? {
        mlflow_rows_sorted(path, conn, &run)?
    } else {
        mlflow_rows_sql(path, conn, &run)?
    };
    let mut cur: Option<LogRecord> = None;
    let mut n: u64 = 0;
    for row in &rows {
        n += 1;
        let (step, v) = (row.step, row.value);
        let ts = row.ts as f64 / 1000.0;
        let same = cur
            .as_ref()
            .is_some_and(|r| r.step == Some(step) && r.timestamp == Some(ts));
        if !same {
            if let Some(mut r) = cur.take() {
                stats.records += 1;
                push(&mut r);
            }
            cur = Some(LogRecord {
                step: Some(step),
                timestamp: Some(ts),
                source: SourceKind::MlflowDb,
                file,
                line: n,
                fields: Vec::new(),
            });
        }
        stats.non_finite += (!v.is_finite()) as u64;
        if let (Some(r), Some(key)) = (cur.as_mut(), keys.get(row.key as usize)) {
            r.fields.push((key.clone(), v));
        }
    }
    if let Some(mut r) = cur.take() {
        stats.records += 1;
        push(&mut r);
    }
    stats.lines = n;
    Ok(())
}

/// One MLflow metric row: `key` indexes the run's key list.
#[derive(Debug, Clone, Copy)]
struct MetricRow {
    step: i64,
    ts: i64,
    key: u32,
    value: f64,
}

/// True when `metrics` is a rowid table whose keys compare as bytes (no `COLLATE`, not
/// `WITHOUT ROWID`, as MLflow creates it): then sorting its rows in Rust gives SQLite's
/// `ORDER BY step, timestamp, key`.
fn plain_metrics_table(path: &Path, conn: &Connection) -> Result<bool> {
    let sql: Option<String> = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'metrics'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| db_error(path, e))?;
    let sql = sql.unwrap_or_default().to_ascii_lowercase();
    Ok(!sql.contains("collate") && !sql.contains("without rowid"))
}

/// Read one row's columns `step, timestamp, key, value, is_nan`; `keys`/`ids` intern the key.
fn metric_row(
    path: &Path,
    row: &rusqlite::Row,
    keys: &mut Vec<String>,
    ids: &mut crate::logs::fastline::FxMap<Vec<u8>, u32>,
) -> Result<MetricRow> {
    let step: i64 = row.get(0).map_err(|e| db_error(path, e))?;
    let ts: i64 = row.get(1).map_err(|e| db_error(path, e))?;
    // A key seen before is found by its bytes; a new one is read as `String` (its
    // errors, a BLOB or bad UTF-8, are those of the plain read).
    let known = match row.get_ref(2) {
        Ok(ValueRef::Text(b)) => ids.get(b).copied(),
        _ => None,
    };
    let key = match known {
        Some(k) => k,
        None => {
            let k: String = row.get(2).map_err(|e| db_error(path, e))?;
            let id = keys.len() as u32;
            ids.insert(k.as_bytes().to_vec(), id);
            keys.push(k);
            id
        }
    };
    let raw: f64 = row.get(3).map_err(|e| db_error(path, e))?;
    let is_nan: bool = row.get(4).map_err(|e| db_error(path, e))?;
    Ok(MetricRow {
        step,
        ts,
        key,
        value: mlflow_value(raw, is_nan),
    })
}

/// The run's rows in table order (SQLite reads the run's index in rowid order, which is
/// the order its sort receives them in), then sorted by `(step, timestamp, key bytes)`
/// with a stable sort: SQLite's sorter keeps rows with equal sort keys in the order it
/// received them (its merges take the earlier list first on ties), so this is the order
/// of `ORDER BY step, timestamp, key` without SQLite's one-threaded sort (a test compares
/// the two on ties).
fn mlflow_rows_sorted(
    path: &Path,
    conn: &Connection,
    run: &str,
) -> Result<(Vec<MetricRow>, Vec<String>)> {
    // A database of one run is read straight through the table (its leaf pages in rowid
    // order) rather than by the run index, a table lookup per row; both give rowid order.
    let runs: i64 = conn
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .map_err(|e| db_error(path, e))?;
    let sql = if runs == 1 {
        "SELECT step, timestamp, key, value, is_nan FROM metrics NOT INDEXED \
         WHERE run_uuid = ?1 ORDER BY rowid"
    } else {
        "SELECT step, timestamp, key, value, is_nan FROM metrics WHERE run_uuid = ?1 \
         ORDER BY rowid"
    };
    let mut st = conn.prepare(sql).map_err(|e| db_error(path, e))?;
    let mut rows = st.query([run]).map_err(|e| db_error(path, e))?;
    let (mut keys, mut ids) = (Vec::new(), Default::default());
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| db_error(path, e))? {
        out.push(metric_row(path, row, &mut keys, &mut ids)?);
    }
    // Each key's place in byte order (SQLite's BINARY collation).
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_by(|a, b| {
        keys[*a as usize]
            .as_bytes()
            .cmp(keys[*b as usize].as_bytes())
    });
    let mut rank = vec![0u32; keys.len()];
    for (r, k) in order.iter().enumerate() {
        rank[*k as usize] = r as u32;
    }
    let sort_key = |r: &MetricRow| (r.step, r.ts, rank[r.key as usize]);
    if !out.is_sorted_by_key(sort_key) {
        out.sort_by_key(sort_key);
    }
    Ok((out, keys))
}

/// The run's rows as SQLite sorts them (a `metrics` table this reader does not sort
/// itself).
fn mlflow_rows_sql(
    path: &Path,
    conn: &Connection,
    run: &str,
) -> Result<(Vec<MetricRow>, Vec<String>)> {
    let mut st = conn
        .prepare(
            "SELECT step, timestamp, key, value, is_nan FROM metrics WHERE run_uuid = ?1 \
             ORDER BY step, timestamp, key",
        )
        .map_err(|e| db_error(path, e))?;
    let mut rows = st.query([run]).map_err(|e| db_error(path, e))?;
    let (mut keys, mut ids) = (Vec::new(), Default::default());
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| db_error(path, e))? {
        out.push(metric_row(path, row, &mut keys, &mut ids)?);
    }
    Ok((out, keys))
}

/// A metric value as MLflow meant it: `is_nan` rows are NaN, and the largest finite
/// doubles, which MLflow stores for ±inf (SQL has no infinity), are ±inf again.
fn mlflow_value(raw: f64, is_nan: bool) -> f64 {
    if is_nan {
        f64::NAN
    } else if raw == f64::MAX {
        f64::INFINITY
    } else if raw == f64::MIN {
        f64::NEG_INFINITY
    } else {
        raw
    }
}

/// The text of a TEXT or BLOB cell (Trackio stores its JSON as either).
fn cell_text<'a>(path: &Path, v: ValueRef<'a>, row: u64) -> Result<&'a str> {
    let bytes = match v {
        ValueRef::Text(b) | ValueRef::Blob(b) => b,
        other => {
            return Err(Error::format(
                path,
                Position::Line(row),
                format!("metrics JSON is {:?}, not text", other.data_type()),
            ))
        }
    };
    std::str::from_utf8(bytes)
        .map_err(|_| Error::format(path, Position::Line(row), "metrics JSON is not UTF-8"))
}

/// Trackio rows: one record per logged row, numeric values of its JSON as fields.
fn read_trackio(
    path: &Path,
    conn: &Connection,
    file: usize,
    want: Option<&str>,
    stats: &mut FileStats,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<()> {
    let (run, _) = trackio_run(path, conn, want)?;
    let mut st = conn
        .prepare("SELECT id, step, timestamp, metrics FROM metrics WHERE run_name = ?1 ORDER BY id")
        .map_err(|e| db_error(path, e))?;
    let mut rows = st.query([&run]).map_err(|e| db_error(path, e))?;
    let mut n: u64 = 0;
    while let Some(row) = rows.next().map_err(|e| db_error(path, e))? {
        n += 1;
        let id: i64 = row.get(0).map_err(|e| db_error(path, e))?;
        let step: i64 = row.get(1).map_err(|e| db_error(path, e))?;
        let ts: Option<String> = row.get(2).ok();
        let text = cell_text(path, row.get_ref(3).map_err(|e| db_error(path, e))?, n)?;
        let json: serde_json::Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                stats.bad_line(n, format!("metrics row id {id}: {e}"));
                continue;
            }
        };
        let mut rec = LogRecord {
            step: Some(step),
            timestamp: ts.as_deref().and_then(iso8601_seconds),
            source: SourceKind::Trackio,
            file,
            line: n,
            fields: Vec::new(),
        };
        if let serde_json::Value::Object(map) = json {
            for (k, v) in map {
                if let Some(x) = trackio_number(&v) {
                    stats.non_finite += (!x.is_finite()) as u64;
                    rec.fields.push((k, x));
                }
            }
        }
        stats.records += 1;
        push(&mut rec);
    }
    stats.lines = n;
    Ok(())
}

/// A Trackio metric value: a JSON number, or the strings Trackio writes for non-finite
/// floats. Other values (text, media) are not metrics.
pub fn trackio_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        serde_json::Value::Bool(_) => None,
        _ => None,
    }
}

/// Unix seconds of an ISO-8601 time `YYYY-MM-DDTHH:MM:SS[.frac][Z|±HH:MM]` (Trackio's
/// `datetime.isoformat()`), or `None` when it is not one.
pub fn iso8601_seconds(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse().ok() };
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut frac = 0.0;
    if let Some(r) = rest.strip_prefix('.') {
        let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        frac = format!("0.{}", &r[..end]).parse().ok()?;
        rest = &r[end..];
    }
    let offset = match rest {
        "" | "Z" => 0,
        _ => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60 + sec - offset) as f64 + frac)
}

/// The run's configuration as `key → text`: MLflow params, Trackio's config JSON (keys
/// starting `_`, Trackio's own bookkeeping, left out).
pub fn config(path: &Path, want: Option<&str>, out: &mut BTreeMap<String, String>) -> Result<()> {
    let conn = open(path)?;
    match schema(path, &conn)? {
        Schema::Mlflow => {
            let (run, _) = mlflow_run(path, &conn, want)?;
            let mut st = conn
                .prepare("SELECT key, value FROM params WHERE run_uuid = ?1")
                .map_err(|e| db_error(path, e))?;
            let rows = st
                .query_map([&run], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(|e| db_error(path, e))?;
            for r in rows {
                let (k, v) = r.map_err(|e| db_error(path, e))?;
                out.insert(k, v);
            }
        }
        Schema::Trackio => {
            let (run, _) = trackio_run(path, &conn, want)?;
            let mut st = conn
                .prepare("SELECT config FROM configs WHERE run_name = ?1")
                .map_err(|e| db_error(path, e))?;
            let mut rows = st.query([&run]).map_err(|e| db_error(path, e))?;
            while let Some(row) = rows.next().map_err(|e| db_error(path, e))? {
                let text = cell_text(path, row.get_ref(0).map_err(|e| db_error(path, e))?, 1)?;
                let v: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| db_error(path, format!("config JSON: {e}")))?;
                if let serde_json::Value::Object(map) = v {
                    for (k, v) in map {
                        if k.starts_with('_') {
                            continue;
                        }
                        let text = match v {
                            serde_json::Value::String(s) => s,
                            other => other.to_string(),
                        };
                        out.insert(k, text);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_matches_known_unix_times() {
        assert_eq!(iso8601_seconds("1970-01-01T00:00:00"), Some(0.0));
        // 2023-11-14T22:13:20Z is 1_700_000_000.
        assert_eq!(
            iso8601_seconds("2023-11-14T22:13:20+00:00"),
            Some(1_700_000_000.0)
        );
        assert_eq!(
            iso8601_seconds("2023-11-15T00:13:20.5+02:00"),
            Some(1_700_000_000.5)
        );
        assert_eq!(
            iso8601_seconds("2024-02-29T00:00:00Z"),
            Some(1_709_164_800.0)
        );
        assert_eq!(iso8601_seconds("yesterday"), None);
    }

    #[test]
    fn mlflow_values_restore_nan_and_infinities() {
        assert!(mlflow_value(0.0, true).is_nan());
        assert_eq!(mlflow_value(f64::MAX, false), f64::INFINITY);
        assert_eq!(mlflow_value(f64::MIN, false), f64::NEG_INFINITY);
        assert_eq!(mlflow_value(0.25, false), 0.25);
    }

    /// Rows as `(step, timestamp, key, value bits)`.
    fn listed(rows: &[MetricRow], keys: &[String]) -> Vec<(i64, i64, String, u64)> {
        rows.iter()
            .map(|r| {
                (
                    r.step,
                    r.ts,
                    keys[r.key as usize].clone(),
                    r.value.to_bits(),
                )
            })
            .collect()
    }

    /// The stable sort in Rust gives SQLite's `ORDER BY step, timestamp, key` row for row,
    /// ties included (same step, timestamp and key, values apart), on MLflow's schema with
    /// rows written out of order, keys that are prefixes of others or differ in case, a
    /// second run interleaved, and a sort large enough for SQLite to spill to disk.
    #[test]
    fn rows_sorted_in_rust_equal_sqlites_order_by_on_ties() {
        let dir = std::env::temp_dir().join(format!("rlf-sqlite-ties-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("mlflow.db");
        let _ = std::fs::remove_file(&db);
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE runs (run_uuid VARCHAR(32) PRIMARY KEY, name VARCHAR(250), \
               lifecycle_stage VARCHAR(20), start_time BIGINT);
             CREATE TABLE metrics (\"key\" VARCHAR(250) NOT NULL, value FLOAT NOT NULL, \
               timestamp BIGINT NOT NULL, run_uuid VARCHAR(32) NOT NULL, \
               step BIGINT DEFAULT '0' NOT NULL, is_nan BOOLEAN DEFAULT '0' NOT NULL, \
               CONSTRAINT metric_pk PRIMARY KEY (\"key\", timestamp, step, run_uuid, value, is_nan));
             CREATE INDEX index_metrics_run_uuid ON metrics (run_uuid);
             CREATE INDEX index_metrics_run_uuid_key_step ON metrics (run_uuid, \"key\", step);",
        )
        .unwrap();
        let keys = ["loss", "loss/x", "Loss", "a", "ab", "a b", "é", "train/kl"];
        let mut x: u64 = 11;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let tx = conn.unchecked_transaction().unwrap();
        for i in 0..40_000u64 {
            let run = if next(5) == 0 { "other" } else { "r1" };
            let step = next(300) as i64 - 20;
            let ts = 1_000 + next(3) as i64;
            let key = keys[next(keys.len() as u64) as usize];
            // Ties: the same (step, ts, key) with values apart (the PK keeps them distinct).
            let value = (i % 7) as f64 * 0.5 + i as f64 * 1e-9;
            let is_nan = next(50) == 0;
            tx.execute(
                "INSERT OR IGNORE INTO metrics VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![key, value, ts, run, step, is_nan],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        // A sorter with little memory: SQLite sorts in runs merged from disk.
        conn.execute_batch("PRAGMA cache_size = 8; PRAGMA temp_store = FILE;")
            .unwrap();
        let path = db.as_path();
        for runs in [1, 2] {
            conn.execute("DELETE FROM runs", []).unwrap();
            for r in ["r1", "other"].iter().take(runs) {
                conn.execute("INSERT INTO runs VALUES (?1, ?1, 'active', 0)", [r])
                    .unwrap();
            }
            assert!(plain_metrics_table(path, &conn).unwrap());
            let (a, ka) = mlflow_rows_sorted(path, &conn, "r1").unwrap();
            let (b, kb) = mlflow_rows_sql(path, &conn, "r1").unwrap();
            let (a, b) = (listed(&a, &ka), listed(&b, &kb));
            assert!(a.len() > 25_000, "{}", a.len());
            let ties = b
                .windows(2)
                .filter(|w| (w[0].0, w[0].1, &w[0].2) == (w[1].0, w[1].1, &w[1].2))
                .count();
            assert!(ties > 1_000, "{ties} ties");
            assert_eq!(a, b, "runs {runs}");
        }
        drop(conn);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn trackio_strings_are_non_finite_numbers() {
        use serde_json::json;
        assert!(trackio_number(&json!("NaN")).is_some_and(f64::is_nan));
        assert_eq!(trackio_number(&json!("-Infinity")), Some(f64::NEG_INFINITY));
        assert_eq!(trackio_number(&json!(1.5)), Some(1.5));
        assert_eq!(trackio_number(&json!("text")), None);
    }
}
