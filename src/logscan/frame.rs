//! The normalised frame: one row per step, canonical metric columns (through the alias
//! table), optional raw columns, and the `source` each row came from. Records from several
//! files merge by step; the first value seen for a metric at a step wins.

use std::collections::HashMap;

use polars::prelude::*;

use crate::error::{Error, Result};
use crate::logscan::record::{LogRecord, SourceKind};
use crate::readers::aliases::AliasTable;

/// A growable f64 column with missing cells.
#[derive(Debug, Clone, Default)]
struct Col {
    values: Vec<f64>,
    present: Vec<bool>,
}

impl Col {
    fn set(&mut self, row: usize, v: f64) -> bool {
        if self.values.len() <= row {
            self.values.resize(row + 1, 0.0);
            self.present.resize(row + 1, false);
        }
        if self.present[row] {
            return false;
        }
        self.values[row] = v;
        self.present[row] = true;
        true
    }

    fn finish(mut self, n: usize, order: &[usize]) -> Vec<Option<f64>> {
        self.values.resize(n, 0.0);
        self.present.resize(n, false);
        order
            .iter()
            .map(|&i| self.present[i].then_some(self.values[i]))
            .collect()
    }
}

/// Accumulates records into rows keyed by step.
#[derive(Debug)]
pub struct FrameBuilder {
    aliases: AliasTable,
    keep_raw: bool,
    rows: HashMap<i64, usize>,
    steps: Vec<i64>,
    timestamps: Vec<Option<f64>>,
    sources: Vec<u32>,
    canon: Vec<Col>,
    raw_index: HashMap<String, usize>,
    raw: Vec<(String, Col)>,
    scratch: Vec<(u32, f64)>,
}

impl FrameBuilder {
    /// A builder resolving keys through `aliases`; raw columns are kept when `keep_raw`.
    pub fn new(aliases: AliasTable, keep_raw: bool) -> Self {
        let n = aliases.canonical_names().len();
        FrameBuilder {
            aliases,
            keep_raw,
            rows: HashMap::new(),
            steps: Vec::new(),
            timestamps: Vec::new(),
            sources: Vec::new(),
            canon: vec![Col::default(); n],
            raw_index: HashMap::new(),
            raw: Vec::new(),
            scratch: vec![(u32::MAX, 0.0); n],
        }
    }

    /// The alias table in use.
    pub fn aliases(&self) -> &AliasTable {
        &self.aliases
    }

    /// Add one record (records without a step are ignored; callers number them first).
    pub fn push(&mut self, rec: &LogRecord) {
        let Some(step) = rec.step else { return };
        let row = match self.rows.get(&step) {
            Some(&r) => r,
            None => {
                let r = self.steps.len();
                self.rows.insert(step, r);
                self.steps.push(step);
                self.timestamps.push(None);
                self.sources.push(0);
                r
            }
        };
        self.sources[row] |= 1 << (rec.source as u32);
        if self.timestamps[row].is_none() {
            self.timestamps[row] = rec.timestamp;
        }
        // Best-priority value per canonical metric within this record.
        let mut touched: Vec<usize> = Vec::new();
        for (k, v) in &rec.fields {
            if let Some((idx, prio)) = self.aliases.resolve(k) {
                let slot = &mut self.scratch[idx];
                if slot.0 == u32::MAX {
                    touched.push(idx);
                }
                if prio < slot.0 {
                    *slot = (prio, *v);
                }
            }
            if self.keep_raw {
                let ri = match self.raw_index.get(k.as_str()) {
                    Some(&i) => i,
                    None => {
                        self.raw.push((k.clone(), Col::default()));
                        self.raw_index.insert(k.clone(), self.raw.len() - 1);
                        self.raw.len() - 1
                    }
                };
                self.raw[ri].1.set(row, *v);
            }
        }
        for idx in touched {
            let (_, v) = self.scratch[idx];
            self.canon[idx].set(row, v);
            self.scratch[idx] = (u32::MAX, 0.0);
        }
    }

    /// Sort rows by step and freeze.
    pub fn finish(self) -> LogFrame {
        let n = self.steps.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| self.steps[i]);
        let kinds = [
            SourceKind::Steps,
            SourceKind::Events,
            SourceKind::VerlJsonl,
            SourceKind::HfTrainerState,
            SourceKind::VerlConsole,
            SourceKind::TrlDict,
            SourceKind::MlxReport,
            SourceKind::NanoGpt,
            SourceKind::MicroDiag,
            SourceKind::GenericJsonl,
        ];
        let sources = order
            .iter()
            .map(|&i| {
                kinds
                    .iter()
                    .filter(|k| self.sources[i] & (1 << (**k as u32)) != 0)
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join("+")
            })
            .collect();
        let names = self.aliases.canonical_names().to_vec();
        let columns = names
            .into_iter()
            .zip(self.canon)
            .filter(|(_, c)| c.present.iter().any(|p| *p))
            .map(|(name, c)| (name, c.finish(n, &order)))
            .collect();
        let raw = self
            .raw
            .into_iter()
            .map(|(name, c)| (name, c.finish(n, &order)))
            .collect();
        LogFrame {
            steps: order.iter().map(|&i| self.steps[i]).collect(),
            timestamps: order.iter().map(|&i| self.timestamps[i]).collect(),
            sources,
            columns,
            raw,
        }
    }
}

/// Canonical metrics per step, sorted by step: what every detector reads.
#[derive(Debug, Clone, Default)]
pub struct LogFrame {
    /// Step of each row, ascending, unique.
    pub steps: Vec<i64>,
    /// Unix time of each row, when known.
    pub timestamps: Vec<Option<f64>>,
    /// Producers that contributed to each row, `+`-joined.
    pub sources: Vec<String>,
    /// Canonical metric columns present in the logs.
    pub columns: Vec<(String, Vec<Option<f64>>)>,
    /// Raw columns under their original (flattened) keys, when kept.
    pub raw: Vec<(String, Vec<Option<f64>>)>,
}

impl LogFrame {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True when no step was read.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The canonical column `name`.
    pub fn col(&self, name: &str) -> Option<&[Option<f64>]> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.as_slice())
    }

    /// `(step, value)` pairs of the present cells of column `name`.
    pub fn series(&self, name: &str) -> Vec<(i64, f64)> {
        self.col(name)
            .map(|c| {
                self.steps
                    .iter()
                    .zip(c)
                    .filter_map(|(s, v)| v.map(|v| (*s, v)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The value of column `name` at row `i`.
    pub fn at(&self, name: &str, i: usize) -> Option<f64> {
        self.col(name).and_then(|c| c.get(i).copied().flatten())
    }

    /// As a polars frame: `step`, `timestamp`, `source`, canonical columns, then raw
    /// columns prefixed `raw:`.
    pub fn to_polars(&self) -> Result<DataFrame> {
        let mut cols: Vec<Column> = vec![
            Column::new("step".into(), &self.steps),
            Column::new("timestamp".into(), &self.timestamps),
            Column::new("source".into(), &self.sources),
        ];
        for (name, c) in &self.columns {
            cols.push(Column::new(name.as_str().into(), c));
        }
        for (name, c) in &self.raw {
            cols.push(Column::new(format!("raw:{name}").into(), c));
        }
        DataFrame::new_infer_height(cols).map_err(|e| Error::Usage(format!("building frame: {e}")))
    }

    /// Write the frame as Parquet (zstd) to `path`.
    pub fn write_parquet(&self, path: &std::path::Path) -> Result<()> {
        let mut df = self.to_polars()?;
        let f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
        ParquetWriter::new(f)
            .finish(&mut df)
            .map_err(|e| Error::Export {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })?;
        Ok(())
    }
}
