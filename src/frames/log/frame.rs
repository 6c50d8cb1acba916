//! The normalised frame: one row per step, canonical metric columns (through the alias
//! table), optional raw columns, and the `source` each row came from. Records from several
//! files merge by step; the first value seen for a metric at a step wins. Columns are
//! [`Column`]s (blocks, compressed as rows arrive); a [`Projection`] keeps only the
//! metrics the caller will read, so memory follows steps × kept metrics.

use polars::prelude::*;

use crate::error::{Error, Result};
use crate::frames::log::column::{Column, Steps, BLOCK_ROWS};
use crate::frames::log::series::Series;
use crate::logs::aliases::{
    is_bookkeeping_key, is_zero_std_count, stage_metric, FRAC_ZERO_STD, STAGES, STAGE_PREFIX,
    ZERO_STD_GROUPS,
};
use crate::logs::aliases::{
    is_eval_key, reward_component, AliasTable, EVAL_ACTIVITY, REWARD_COMPONENTS,
    REWARD_COMPONENT_PREFIX,
};
use crate::logs::fastline::{FxMap, Interner};
use crate::model::log::{LogRecord, SourceKind};

/// What the builder knows about one raw key.
#[derive(Debug, Clone, Copy)]
struct KeyInfo {
    /// Canonical metric (index, priority) the key resolves to.
    alias: Option<(usize, u32)>,
    /// Raw column index, once one was made.
    raw: u32,
}

/// Which metric columns a frame keeps (every metric name is still listed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Projection {
    /// Every canonical metric and the timestamps.
    #[default]
    All,
    /// Only these canonical metrics, and the timestamps when `timestamps`.
    Only {
        /// Canonical metric names.
        metrics: Vec<String>,
        /// Keep the per-row timestamps.
        timestamps: bool,
    },
}

impl Projection {
    /// True when metric `name` is kept.
    pub fn keeps(&self, name: &str) -> bool {
        match self {
            Projection::All => true,
            Projection::Only { metrics, .. } => {
                metrics.iter().any(|m| m == name)
                    || (name.starts_with(REWARD_COMPONENT_PREFIX)
                        && metrics.iter().any(|m| m == REWARD_COMPONENTS))
                    || (name.starts_with(STAGE_PREFIX) && metrics.iter().any(|m| m == STAGES))
            }
        }
    }

    /// True when the timestamps are kept.
    pub fn keeps_timestamps(&self) -> bool {
        match self {
            Projection::All => true,
            Projection::Only { timestamps, .. } => *timestamps,
        }
    }
}

/// Every producer kind, by bit of a row's source mask.
const SOURCE_KINDS: [SourceKind; 21] = [
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
    SourceKind::NotebookTable,
    SourceKind::Megatron,
    SourceKind::Tensorboard,
    SourceKind::Wandb,
    SourceKind::Csv,
    SourceKind::Mlflow,
    SourceKind::MlflowDb,
    SourceKind::Trackio,
    SourceKind::WandbSummary,
    SourceKind::Parquet,
    SourceKind::KvText,
];

// Each kind owns one bit of a row's `u32` source mask.
const _: () = assert!(SOURCE_KINDS.len() <= u32::BITS as usize);

/// The `+`-joined names of the producers in source mask `mask`.
fn source_names(mask: u32) -> String {
    SOURCE_KINDS
        .iter()
        .filter(|k| mask & (1 << (**k as u32)) != 0)
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join("+")
}

/// Accumulates records into rows keyed by step.
#[derive(Debug)]
pub struct FrameBuilder {
    aliases: AliasTable,
    keep_raw: bool,
    projection: Projection,
    /// Per canonical metric: its values are stored.
    keep: Vec<bool>,
    /// Per canonical metric: a value was seen (stored or not).
    seen: Vec<bool>,
    steps: Steps,
    /// Run of each row (empty while every row is run 0): an appended log whose step
    /// restarts holds several runs, kept apart rather than merged by step.
    runs: Vec<u32>,
    /// The run records are pushed into now ([`FrameBuilder::set_run`]).
    run: u32,
    /// (run, step) → row, made once a row arrives below the last one; until then rows are
    /// in ascending (run, step) order and found by binary search.
    rows: Option<FxMap<(u32, i64), usize>>,
    /// The row a step below the last was last found at: a second file over the same
    /// ascending steps (an MLflow run's next metric file) asks for the row after it.
    revisit: usize,
    /// (run, step) of the last row made (read per record; the steps are compressed).
    last: Option<(u32, i64)>,
    timestamps: Column,
    /// Bit `SourceKind as u32` set for each producer that contributed to the row.
    sources: Vec<u32>,
    canon: Vec<Column>,
    keys: Interner,
    key_info: Vec<KeyInfo>,
    raw: Vec<(String, Column)>,
    scratch: Vec<(u32, f64)>,
    touched: Vec<usize>,
    ids: Vec<(u32, f64)>,
    /// Prompt groups per step (slime's `--rollout-batch-size`), when known: a record's
    /// dead-group count ([`ZERO_STD_GROUPS`]) divided by it is its [`FRAC_ZERO_STD`].
    groups: Option<f64>,
    /// Canonical indices of ([`ZERO_STD_GROUPS`], [`FRAC_ZERO_STD`]) once a count key came.
    dead_cols: Option<(usize, usize)>,
}

/// Priority marking a canonical metric whose raw keys are summed within a record, not
/// picked by priority (slime's per-reward dead-group counts).
const SUM_PRIO: u32 = u32::MAX - 1;

impl FrameBuilder {
    /// A builder resolving keys through `aliases`, keeping every metric; raw columns are
    /// kept when `keep_raw`.
    pub fn new(aliases: AliasTable, keep_raw: bool) -> Self {
        let n = aliases.canonical_names().len();
        FrameBuilder {
            aliases,
            keep_raw,
            projection: Projection::All,
            keep: vec![true; n],
            seen: vec![false; n],
            steps: Steps::default(),
            runs: Vec::new(),
            run: 0,
            rows: None,
            revisit: 0,
            last: None,
            timestamps: Column::default(),
            sources: Vec::new(),
            canon: vec![Column::default(); n],
            keys: Interner::default(),
            key_info: Vec::new(),
            raw: Vec::new(),
            scratch: vec![(u32::MAX, 0.0); n],
            touched: Vec::new(),
            ids: Vec::new(),
            groups: None,
            dead_cols: None,
        }
    }

    /// The number of prompt groups per step (slime's rollout batch size), so that slime's
    /// dead-group counts become the share the dead-group detector reads.
    pub fn with_group_count(mut self, groups: Option<u32>) -> Self {
        self.groups = groups.filter(|g| *g > 0).map(f64::from);
        self
    }

    /// Keep only the columns `projection` names (call before the first record).
    pub fn with_projection(mut self, projection: Projection) -> Self {
        for (k, name) in self.keep.iter_mut().zip(self.aliases.canonical_names()) {
            *k = projection.keeps(name);
        }
        self.projection = projection;
        self
    }

    /// The alias table in use.
    pub fn aliases(&self) -> &AliasTable {
        &self.aliases
    }

    /// The id of raw key `k` (stable for the builder's life).
    pub fn intern(&mut self, k: &str) -> u32 {
        let id = self.keys.intern(k);
        if id as usize == self.key_info.len() {
            let mut alias = self.aliases.resolve(k);
            if alias.is_none() && is_zero_std_count(k) {
                let zi = self.family_column(ZERO_STD_GROUPS);
                let fi = self.family_column(FRAC_ZERO_STD);
                self.dead_cols = Some((zi, fi));
                alias = Some((zi, SUM_PRIO));
            }
            if alias.is_none() {
                if let Some(name) = reward_component(k) {
                    alias = Some((self.reward_column(&name), 0));
                } else if let Some(name) = stage_metric(k) {
                    alias = Some((self.family_column(&name), 0));
                } else if is_eval_key(k) {
                    alias = self.aliases.resolve(EVAL_ACTIVITY);
                }
            }
            self.key_info.push(KeyInfo {
                alias,
                raw: u32::MAX,
            });
        }
        id
    }

    /// The canonical index of reward component `name` (`reward/<name>`), made when new.
    fn reward_column(&mut self, name: &str) -> usize {
        self.family_column(&format!("{REWARD_COMPONENT_PREFIX}{name}"))
    }

    /// The canonical index of a family's metric (`reward/…`, `stage/…`), made when new.
    fn family_column(&mut self, canonical: &str) -> usize {
        let canonical = canonical.to_string();
        let idx = self.aliases.add_canonical(&canonical);
        while self.keep.len() <= idx {
            self.keep.push(self.projection.keeps(&canonical));
            self.seen.push(false);
            self.canon.push(Column::default());
            self.scratch.push((u32::MAX, 0.0));
        }
        idx
    }

    /// Push the next records into run `run` (0-based; an appended log's step restart starts
    /// the next run).
    pub fn set_run(&mut self, run: u32) {
        self.run = run;
    }

    /// The run of row `r`.
    fn run_at(&self, r: usize) -> u32 {
        self.runs.get(r).copied().unwrap_or(0)
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

    /// A new row for `step`; full blocks of every column are compressed as rows pass them.
    fn new_row(&mut self, step: i64) -> usize {
        let r = self.steps.len();
        self.steps.push(step);
        self.last = Some((self.run, step));
        self.sources.push(0);
        if self.run > 0 && self.runs.is_empty() {
            self.runs.resize(r, 0);
        }
        if !self.runs.is_empty() {
            self.runs.push(self.run);
        }
        if r > 0 && r.is_multiple_of(BLOCK_ROWS) {
            let b = r / BLOCK_ROWS - 1;
            for c in &mut self.canon {
                c.seal_block(b, BLOCK_ROWS);
            }
            for (_, c) in &mut self.raw {
                c.seal_block(b, BLOCK_ROWS);
            }
            self.timestamps.seal_block(b, BLOCK_ROWS);
        }
        r
    }

    /// The row of `step`, made when new.
    fn row_of(&mut self, step: i64) -> usize {
        let run = self.run;
        if let Some(map) = &self.rows {
            if let Some(&r) = map.get(&(run, step)) {
                return r;
            }
            let r = self.new_row(step);
            if let Some(map) = &mut self.rows {
                map.insert((run, step), r);
            }
            return r;
        }
        let n = self.steps.len();
        match self.last {
            Some(l) if (run, step) == l => n - 1,
            Some(l) if (run, step) < l => {
                // Binary search while every row is run 0 (one ascending step list).
                let found = if self.runs.is_empty() && run == 0 {
                    let next = self.revisit + 1;
                    match self.steps.get(next) {
                        Some(s) if s == step => Some(next),
                        _ => self.steps.position(step),
                    }
                } else {
                    None
                };
                match found {
                    Some(r) => {
                        self.revisit = r;
                        r
                    }
                    None => {
                        let mut map: FxMap<(u32, i64), usize> = FxMap::default();
                        map.reserve(n + 1);
                        for (r, s) in self.steps.iter().enumerate() {
                            map.insert((self.run_at(r), s), r);
                        }
                        let r = self.new_row(step);
                        map.insert((run, step), r);
                        self.rows = Some(map);
                        r
                    }
                }
            }
            _ => self.new_row(step),
        }
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
        let row = self.row_of(step);
        if let Some(m) = self.sources.get_mut(row) {
            *m |= 1 << (source as u32);
        }
        if let Some(t) = timestamp {
            if self.projection.keeps_timestamps() {
                self.timestamps.set(row, t);
            }
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
                if prio == SUM_PRIO {
                    let sum = if slot.0 == u32::MAX { 0.0 } else { slot.1 };
                    *slot = (SUM_PRIO, sum + v);
                } else if prio < slot.0 {
                    *slot = (prio, v);
                }
            }
            if self.keep_raw {
                let ri = if info.raw == u32::MAX {
                    self.raw
                        .push((self.keys.name(k).to_string(), Column::default()));
                    let ri = (self.raw.len() - 1) as u32;
                    self.key_info[k as usize].raw = ri;
                    ri
                } else {
                    info.raw
                };
                self.raw[ri as usize].1.set(row, v);
            }
        }
        if let Some(g) = self.groups {
            self.share_of_dead_groups(g);
        }
        for idx in self.touched.drain(..) {
            let (_, v) = self.scratch[idx];
            self.scratch[idx] = (u32::MAX, 0.0);
            self.seen[idx] = true;
            if self.keep[idx] {
                self.canon[idx].set(row, v);
            }
        }
    }

    /// True once a slime dead-group count key (`rollout/zero_std/count_*`) was read.
    pub fn has_dead_group_counts(&self) -> bool {
        self.dead_cols.is_some()
    }

    /// The record's dead-group share from its summed dead-group count and `groups` per
    /// step, unless the record logged the share itself.
    fn share_of_dead_groups(&mut self, groups: f64) {
        let Some((zi, fi)) = self.dead_cols else {
            return;
        };
        if self.scratch[zi].0 == u32::MAX {
            return;
        }
        let dead = self.scratch[zi].1;
        let slot = &mut self.scratch[fi];
        if slot.0 == u32::MAX {
            self.touched.push(fi);
            *slot = (SUM_PRIO, dead / groups);
        }
    }

    /// Sort rows by step and freeze.
    pub fn finish(self) -> LogFrame {
        let n = self.steps.len();
        // Rows arrived in ascending step order unless the step map was needed.
        let order: Option<Vec<usize>> = self.rows.map(|map| {
            drop(map);
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| (self.runs.get(i).copied().unwrap_or(0), self.steps.get(i)));
            order
        });
        let arrange = |mut c: Column| -> Column {
            c.finish_rows(n);
            match &order {
                Some(o) => c.gather(o),
                None => c,
            }
        };
        let names = self.aliases.canonical_names();
        let metrics: Vec<String> = names
            .iter()
            .zip(&self.seen)
            .filter(|(_, seen)| **seen)
            .map(|(n, _)| n.clone())
            .collect();
        let columns = names
            .iter()
            .zip(self.canon)
            .zip(&self.keep)
            .zip(&self.seen)
            .filter(|(((_, _), keep), seen)| **keep && **seen)
            .map(|(((name, c), _), _)| (name.clone(), arrange(c)))
            .collect();
        let raw = self
            .raw
            .into_iter()
            .map(|(name, c)| (name, arrange(c)))
            .collect();
        let timestamps = arrange(self.timestamps);
        let mut unmapped: Vec<String> = self
            .keys
            .names()
            .iter()
            .zip(&self.key_info)
            .filter(|(k, info)| info.alias.is_none() && !is_bookkeeping_key(k))
            .map(|(k, _)| k.clone())
            .collect();
        unmapped.sort();
        let (steps, sources, runs) = match &order {
            Some(o) => (
                o.iter().filter_map(|&i| self.steps.get(i)).collect(),
                o.iter()
                    .map(|&i| self.sources.get(i).copied().unwrap_or(0))
                    .collect(),
                if self.runs.is_empty() {
                    Vec::new()
                } else {
                    o.iter()
                        .map(|&i| self.runs.get(i).copied().unwrap_or(0))
                        .collect()
                },
            ),
            None => (self.steps, self.sources, self.runs),
        };
        LogFrame {
            steps,
            runs,
            timestamps,
            sources,
            metrics,
            columns,
            raw,
            projection: self.projection,
            unmapped,
        }
    }
}

/// Canonical metrics per step, sorted by step: what every detector reads.
#[derive(Debug, Clone, Default)]
pub struct LogFrame {
    steps: Steps,
    /// Run of each row (empty when the frame holds one run).
    runs: Vec<u32>,
    timestamps: Column,
    sources: Vec<u32>,
    metrics: Vec<String>,
    columns: Vec<(String, Column)>,
    raw: Vec<(String, Column)>,
    projection: Projection,
    /// Raw keys read that map to no canonical metric (bookkeeping keys left out), sorted.
    unmapped: Vec<String>,
}

impl LogFrame {
    /// Raw keys read that no canonical metric (so no detector) uses, sorted: what a scan
    /// read but did not understand.
    pub fn unmapped_keys(&self) -> &[String] {
        &self.unmapped
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True when no step was read.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Number of runs (appended logs whose step restarted): 1 for an ordinary log.
    pub fn run_count(&self) -> u32 {
        self.runs.iter().max().map_or(1, |m| m + 1)
    }

    /// The run of row `i`.
    pub fn run_of(&self, i: usize) -> u32 {
        self.runs.get(i).copied().unwrap_or(0)
    }

    /// One frame per run, each with the rows of that run (rows are grouped by run).
    pub fn split_runs(&self) -> Vec<LogFrame> {
        let n = self.run_count();
        (0..n)
            .map(|r| {
                let rows: Vec<usize> = (0..self.len()).filter(|&i| self.run_of(i) == r).collect();
                let pick = |cols: &[(String, Column)]| -> Vec<(String, Column)> {
                    cols.iter()
                        .map(|(name, c)| (name.clone(), c.gather(&rows)))
                        .collect()
                };
                let columns = pick(&self.columns);
                let metrics = self
                    .metrics
                    .iter()
                    .filter(|m| {
                        columns
                            .iter()
                            .find(|(n, _)| n == *m)
                            .is_none_or(|(_, c)| c.any())
                    })
                    .cloned()
                    .collect();
                LogFrame {
                    steps: rows.iter().filter_map(|&i| self.steps.get(i)).collect(),
                    runs: Vec::new(),
                    timestamps: self.timestamps.gather(&rows),
                    sources: rows
                        .iter()
                        .map(|&i| self.sources.get(i).copied().unwrap_or(0))
                        .collect(),
                    metrics,
                    columns,
                    raw: pick(&self.raw),
                    projection: self.projection.clone(),
                    unmapped: self.unmapped.clone(),
                }
            })
            .collect()
    }

    /// Step of each row, ascending within each run.
    pub fn steps(&self) -> &Steps {
        &self.steps
    }

    /// The step of row `i` (`i64::MIN` past the end).
    #[inline]
    pub fn step(&self, i: usize) -> i64 {
        self.steps.get(i).unwrap_or(i64::MIN)
    }

    /// Unix time of each row, when known (empty when the projection dropped it).
    pub fn timestamps(&self) -> &Column {
        debug_assert!(
            self.projection.keeps_timestamps(),
            "timestamps read but not kept by the frame's projection"
        );
        &self.timestamps
    }

    /// Producers that contributed to row `i`, `+`-joined (`steps+events`).
    pub fn source(&self, i: usize) -> String {
        source_names(self.sources.get(i).copied().unwrap_or(0))
    }

    /// Canonical metrics present in the logs, in alias-table order (kept or not).
    pub fn metrics(&self) -> &[String] {
        &self.metrics
    }

    /// Which columns this frame kept.
    pub fn projection(&self) -> &Projection {
        &self.projection
    }

    /// The canonical column `name` (`None` when the logs have no value for it). Reading a
    /// metric the projection dropped is a bug in the caller's declared needs.
    pub fn col(&self, name: &str) -> Option<&Column> {
        debug_assert!(
            self.projection.keeps(name),
            "metric {name:?} read but not kept by the frame's projection"
        );
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// Names of the raw columns (kept when the scan asked for them).
    pub fn raw_names(&self) -> impl Iterator<Item = &str> {
        self.raw.iter().map(|(n, _)| n.as_str())
    }

    /// The raw column under its original (flattened) key.
    pub fn raw(&self, name: &str) -> Option<&Column> {
        self.raw.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// `(step, value)` of the present cells of column `name`, in step order.
    pub fn points(&self, name: &str) -> impl Iterator<Item = (i64, f64)> + '_ {
        self.col(name)
            .into_iter()
            .flat_map(|c| c.present().map(|(i, v)| (self.step(i), v)))
    }

    /// `(step, value)` pairs of the present cells of column `name`.
    pub fn series(&self, name: &str) -> Vec<(i64, f64)> {
        self.series_where(name, |_| true)
    }

    /// `(step, value)` pairs of the present cells of column `name` whose value `keep`
    /// accepts. The list is sized for every row up front: collected from
    /// [`LogFrame::points`] it grew by doubling, copying a 2.5 M-step log's pairs ~20
    /// times into fresh pages (untouched capacity costs no page).
    pub fn series_where(&self, name: &str, keep: impl Fn(f64) -> bool) -> Vec<(i64, f64)> {
        let mut out = Vec::with_capacity(self.col(name).map_or(0, Column::len));
        out.extend(self.points(name).filter(|&(_, v)| keep(v)));
        out
    }

    /// The present cells of column `name` as a [`Series`] read in place (no copy).
    pub fn view(&self, name: &str) -> Series<'_> {
        match self.col(name) {
            Some(c) => Series::cells(c, &self.steps),
            None => Series::empty(),
        }
    }

    /// [`LogFrame::series_where`] as a [`Series`]: read in place when `keep` accepts every
    /// present value (one pass to check), else the kept points as a list.
    pub fn view_where(&self, name: &str, keep: impl Fn(f64) -> bool) -> Series<'_> {
        if self.points(name).all(|(_, v)| keep(v)) {
            self.view(name)
        } else {
            Series::owned(self.series_where(name, keep))
        }
    }

    /// The value of column `name` at row `i`.
    pub fn at(&self, name: &str, i: usize) -> Option<f64> {
        self.col(name).and_then(|c| c.get(i))
    }

    /// Bytes the frame's columns hold on the heap (steps, timestamps, sources, metrics).
    pub fn heap_bytes(&self) -> usize {
        self.steps.heap_bytes()
            + self.timestamps.heap_bytes()
            + self.sources.capacity() * 4
            + self
                .columns
                .iter()
                .chain(&self.raw)
                .map(|(_, c)| c.heap_bytes())
                .sum::<usize>()
    }

    /// As a polars frame: `step`, `timestamp`, `source`, canonical columns, then raw
    /// columns prefixed `raw:`.
    pub fn to_polars(&self) -> Result<DataFrame> {
        let cells = |c: &Column| c.iter().collect::<Vec<Option<f64>>>();
        let mut names: FxMap<u32, String> = FxMap::default();
        for &m in &self.sources {
            names.entry(m).or_insert_with(|| source_names(m));
        }
        let sources: Vec<&str> = self
            .sources
            .iter()
            .map(|m| names.get(m).map_or("", String::as_str))
            .collect();
        let mut cols: Vec<polars::prelude::Column> = vec![
            polars::prelude::Column::new("step".into(), self.steps.to_vec()),
            polars::prelude::Column::new("timestamp".into(), cells(&self.timestamps)),
            polars::prelude::Column::new("source".into(), sources),
        ];
        for (name, c) in &self.columns {
            cols.push(polars::prelude::Column::new(name.as_str().into(), cells(c)));
        }
        for (name, c) in &self.raw {
            cols.push(polars::prelude::Column::new(
                format!("raw:{name}").into(),
                cells(c),
            ));
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

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
