//! The normalised frame: one row per step, canonical metric columns (through the alias
//! table), optional raw columns, and the `source` each row came from. Records from several
//! files merge by step; the first value seen for a metric at a step wins.

use std::sync::Arc;

use polars::prelude::*;

use crate::error::{Error, Result};
use crate::logscan::fastline::{FxMap, Interner};
use crate::logscan::record::{LogRecord, SourceKind};
use crate::readers::aliases::AliasTable;

/// A growable f64 column with missing cells: values plus a presence bitmap.
#[derive(Debug, Clone, Default)]
struct Col {
    values: Vec<f64>,
    present: Vec<u64>,
}

impl Col {
    fn set(&mut self, row: usize, v: f64) -> bool {
        if self.values.len() <= row {
            self.values.resize(row + 1, 0.0);
            self.present.resize(row / 64 + 1, 0);
        }
        let (w, bit) = (row / 64, 1u64 << (row % 64));
        if self.present[w] & bit != 0 {
            return false;
        }
        self.values[row] = v;
        self.present[w] |= bit;
        true
    }

    fn any(&self) -> bool {
        self.present.iter().any(|w| *w != 0)
    }

    fn get(&self, i: usize) -> Option<f64> {
        let w = *self.present.get(i / 64)?;
        if w & (1u64 << (i % 64)) == 0 {
            return None;
        }
        self.values.get(i).copied()
    }

    fn finish(self, order: &[usize]) -> Vec<Option<f64>> {
        order.iter().map(|&i| self.get(i)).collect()
    }
}

/// What the builder knows about one raw key.
#[derive(Debug, Clone, Copy)]
struct KeyInfo {
    /// Canonical metric (index, priority) the key resolves to.
    alias: Option<(usize, u32)>,
    /// Raw column index, once one was made.
    raw: u32,
}

/// Accumulates records into rows keyed by step.
#[derive(Debug)]
pub struct FrameBuilder {
    aliases: AliasTable,
    keep_raw: bool,
    rows: FxMap<i64, usize>,
    steps: Vec<i64>,
    timestamps: Vec<Option<f64>>,
    sources: Vec<u32>,
    canon: Vec<Col>,
    keys: Interner,
    key_info: Vec<KeyInfo>,
    raw: Vec<(String, Col)>,
    scratch: Vec<(u32, f64)>,
    touched: Vec<usize>,
    ids: Vec<(u32, f64)>,
}

impl FrameBuilder {
    /// A builder resolving keys through `aliases`; raw columns are kept when `keep_raw`.
    pub fn new(aliases: AliasTable, keep_raw: bool) -> Self {
        let n = aliases.canonical_names().len();
        FrameBuilder {
            aliases,
            keep_raw,
            rows: FxMap::default(),
            steps: Vec::new(),
            timestamps: Vec::new(),
            sources: Vec::new(),
            canon: vec![Col::default(); n],
            keys: Interner::default(),
            key_info: Vec::new(),
            raw: Vec::new(),
            scratch: vec![(u32::MAX, 0.0); n],
            touched: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// The alias table in use.
    pub fn aliases(&self) -> &AliasTable {
        &self.aliases
    }

    /// The id of raw key `k` (stable for the builder's life).
    pub fn intern(&mut self, k: &str) -> u32 {
        let id = self.keys.intern(k);
        if id as usize == self.key_info.len() {
            self.key_info.push(KeyInfo {
                alias: self.aliases.resolve(k),
                raw: u32::MAX,
            });
        }
        id
    }

    /// The raw key of id `id`.
    pub fn key_name(&self, id: u32) -> &str {
        self.keys.name(id)
    }

    /// Add one record (records without a step are ignored; callers number them first).
    pub fn push(&mut self, rec: &LogRecord) {
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        for (k, v) in &rec.fields {
            ids.push((self.intern(k), *v));
        }
        self.push_ids(rec.step, rec.timestamp, rec.source, &ids);
        self.ids = ids;
    }

    /// Add one record whose keys are ids from [`FrameBuilder::intern`].
    pub fn push_ids(
        &mut self,
        step: Option<i64>,
        timestamp: Option<f64>,
        source: SourceKind,
        fields: &[(u32, f64)],
    ) {
        let Some(step) = step else { return };
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
        self.sources[row] |= 1 << (source as u32);
        if self.timestamps[row].is_none() {
            self.timestamps[row] = timestamp;
        }
        // Best-priority value per canonical metric within this record.
        for &(k, v) in fields {
            let Some(info) = self.key_info.get(k as usize).copied() else {
                continue;
            };
            if let Some((idx, prio)) = info.alias {
                let slot = &mut self.scratch[idx];
                if slot.0 == u32::MAX {
                    self.touched.push(idx);
                }
                if prio < slot.0 {
                    *slot = (prio, v);
                }
            }
            if self.keep_raw {
                let ri = if info.raw == u32::MAX {
                    self.raw
                        .push((self.keys.name(k).to_string(), Col::default()));
                    let ri = (self.raw.len() - 1) as u32;
                    self.key_info[k as usize].raw = ri;
                    ri
                } else {
                    info.raw
                };
                self.raw[ri as usize].1.set(row, v);
            }
        }
        for idx in self.touched.drain(..) {
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
        drop(self.rows);
        // Rows share one string per combination of producers.
        let mut joined: FxMap<u32, Arc<str>> = FxMap::default();
        let sources = order
            .iter()
            .map(|&i| {
                let mask = self.sources[i];
                joined
                    .entry(mask)
                    .or_insert_with(|| {
                        kinds
                            .iter()
                            .filter(|k| mask & (1 << (**k as u32)) != 0)
                            .map(|k| k.name())
                            .collect::<Vec<_>>()
                            .join("+")
                            .into()
                    })
                    .clone()
            })
            .collect();
        let names = self.aliases.canonical_names().to_vec();
        let columns = names
            .into_iter()
            .zip(self.canon)
            .filter(|(_, c)| c.any())
            .map(|(name, c)| (name, c.finish(&order)))
            .collect();
        let raw = self
            .raw
            .into_iter()
            .map(|(name, c)| (name, c.finish(&order)))
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
    /// Producers that contributed to each row, `+`-joined (rows share the string).
    pub sources: Vec<Arc<str>>,
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
            Column::new(
                "source".into(),
                self.sources.iter().map(|s| &**s).collect::<Vec<&str>>(),
            ),
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
