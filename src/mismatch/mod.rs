//! `mismatch`: offline rollout ↔ trainer log-prob mismatch analysis of dumped steps.
//!
//! Over any [`StepDump`] holding two log-prob roles for the same tokens (the engine's
//! and the trainer's old policy by default; old vs current, …), it recomputes the
//! mismatch metrics the producers log ([`metrics`]), says where the mismatch sits
//! ([`attribution`]), what each rollout correction would have done to the step
//! ([`whatif`]) and, over several steps or a log, whether it grows or jumps ([`trend`]).
//! It reads only the model ([`crate::model::step`]): never a file, a key or a `Value`.
//! A tool: it returns a [`report::Report`] and never prints.

pub mod attribution;
pub mod cell;
pub mod frames;
pub mod metrics;
pub mod pairs;
pub mod report;
pub mod scan;
pub mod trend;
pub mod whatif;

use std::collections::BTreeMap;

use rayon::prelude::*;

use crate::error::{Error, Position, Result};
use crate::kernels::config::LossConfig;
use crate::model::finding::Finding;
use crate::model::step::{LogProbSource, StepCells, StepDump};
use attribution::Gathered;
use metrics::{ProducerMetrics, Sums};
use report::{Coverage, NamedMetric, Report, StepReport, SCHEMA_VERSION};
use scan::{CellOut, Histogram, ScanParams, TokenTable};
use whatif::{Correction, WhatIfSums};

/// How a step is analysed.
#[derive(Debug, Clone)]
pub struct Options {
    /// The roles compared: `(a, b)`, `Δ = b − a` (default engine vs trainer-old).
    pub pair: (LogProbSource, LogProbSource),
    /// Width of a response-position bucket; `None`: the widest row / 16, rounded up to a
    /// power of two.
    pub bucket_width: Option<usize>,
    /// Entries kept in each "top" list.
    pub top_n: usize,
    /// The corrections of the what-if section.
    pub corrections: Vec<Correction>,
    /// The loss preset (a [`crate::kernels::presets`] name) of the what-if loss.
    pub loss_preset: String,
    /// Keep the per-token table (for `--export-frames`).
    pub keep_tokens: bool,
    /// The metric whose trend across steps is judged.
    pub trend_metric: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pair: (LogProbSource::Rollout, LogProbSource::Old),
            bucket_width: None,
            top_n: 10,
            corrections: whatif::DEFAULT_PRESETS
                .iter()
                .filter_map(|n| whatif::preset(n))
                .collect(),
            loss_preset: "verl-vanilla".into(),
            keep_tokens: false,
            trend_metric: "sampling/sampling_logp_difference/mean".into(),
        }
    }
}

/// The model's name of a role, as `--pair` spells it.
pub fn role_name(r: LogProbSource) -> &'static str {
    match r {
        LogProbSource::Rollout => "rollout",
        LogProbSource::Old => "old",
        LogProbSource::Current => "current",
        LogProbSource::Reference => "reference",
    }
}

/// Parse a role (`rollout`/`engine`, `old`, `current`, `reference`/`ref`).
pub fn parse_role(s: &str) -> Option<LogProbSource> {
    Some(match s {
        "rollout" | "engine" => LogProbSource::Rollout,
        "old" => LogProbSource::Old,
        "current" => LogProbSource::Current,
        "reference" | "ref" => LogProbSource::Reference,
        _ => return None,
    })
}

/// Cells scanned at once: one per thread of rayon's pool (one per core), so a step costs
/// that many cells of memory (two on the 2-core benchmark machine; dumpdiff reads a cell
/// at a time).
fn chunk() -> usize {
    rayon::current_num_threads().max(1)
}

pub use pairs::analyse_pair;

/// Analyse one step held in memory ([`analyse_cells`] over its cells).
///
/// Errors: as [`analyse_cells`].
pub fn analyse(step: &StepDump, opts: &Options) -> Result<StepReport> {
    analyse_cells(step, opts)
}

/// The error of a step whose cells do not all hold both roles of the pair, naming the
/// roles every cell holds and those only some hold (with how many).
fn missing_roles(step: &dyn StepCells, held_by: &[Vec<LogProbSource>], need: &str) -> Error {
    let mut roles: Option<Vec<LogProbSource>> = None;
    let mut some: BTreeMap<LogProbSource, usize> = BTreeMap::new();
    for here in held_by {
        for r in here {
            *some.entry(*r).or_default() += 1;
        }
        roles = Some(match roles {
            None => here.clone(),
            Some(r) => r.into_iter().filter(|x| here.contains(x)).collect(),
        });
    }
    let roles = roles.unwrap_or_default();
    let held: Vec<&str> = roles.iter().map(|r| role_name(*r)).collect();
    let partial: Vec<String> = some
        .iter()
        .filter(|(r, _)| !roles.contains(r))
        .map(|(r, n)| format!("{} in {n} of {} cells", role_name(*r), held_by.len()))
        .collect();
    Error::format(
        step.root(),
        Position::File,
        format!(
            "step {} holds {} in every cell{}; {need} (choose with --pair)",
            step.step(),
            if held.is_empty() {
                "no log-prob role".to_string()
            } else {
                format!("the log-prob roles [{}]", held.join(", "))
            },
            if partial.is_empty() {
                String::new()
            } else {
                format!(" ({})", partial.join(", "))
            },
        ),
    )
}

/// A cell's roles, and the width and size of its `a` log-probs.
type CellHead = (Vec<LogProbSource>, Option<(usize, usize)>);

/// Analyse one step cell by cell: a first pass reads each cell's roles and shapes only
/// (the bucket width and the top-1 % bound need the widest row and the step's size), the
/// second reads one cell per thread ([`chunk`]) at a time, scans them in parallel, folds them into the
/// step's sums in (rank, micro) order and drops them. Memory: the cells in flight plus
/// the sums (see docs/mismatch.md, "Speed and memory").
///
/// Errors: a cell unreadable; the step does not hold both roles of the pair in every
/// cell (naming the roles it holds); an unknown loss preset.
pub fn analyse_cells(step: &dyn StepCells, opts: &Options) -> Result<StepReport> {
    let (a, b) = opts.pair;
    let n = step.keys().len();
    // Pass 1: each cell's roles, and the width and size of its `a` log-probs.
    let heads: Vec<CellHead> = (0..n)
        .into_par_iter()
        .map(|i| {
            let c = step.cell(i)?;
            let roles = c.batch.log_probs.keys().copied().collect();
            let shape = c.batch.log_probs(a).map(|x| {
                (
                    x.tensor.shape().last().copied().unwrap_or(0),
                    x.tensor.numel(),
                )
            });
            Ok((roles, shape))
        })
        .collect::<Result<_>>()?;
    let held_by: Vec<Vec<LogProbSource>> = heads.iter().map(|h| h.0.clone()).collect();
    if n == 0 || held_by.iter().any(|h| !h.contains(&a) || !h.contains(&b)) {
        let need = format!(
            "comparing {} with {} needs both",
            role_name(a),
            role_name(b)
        );
        return Err(missing_roles(step, &held_by, &need));
    }
    let max_t = heads
        .iter()
        .filter_map(|h| h.1.map(|s| s.0))
        .max()
        .unwrap_or(1);
    let bound: usize = heads.iter().filter_map(|h| h.1.map(|s| s.1)).sum();
    let head = Head {
        step: step.step(),
        producer: step.producer().to_string(),
        root: step.root().to_path_buf(),
        pair: [a, b],
        against: None,
    };
    fold(head, n, max_t, bound, opts, &|i| {
        let c = step.cell(i)?;
        Ok(cell::decode(&c, a, b))
    })
}

/// What a step report says about where its data came from.
pub(crate) struct Head {
    step: i64,
    producer: String,
    root: std::path::PathBuf,
    pair: [LogProbSource; 2],
    against: Option<report::Pairing>,
}

/// Decode cell `i` (read it, pair its rows, drop it); `None` when it holds no pair.
pub(crate) type DecodeCell<'a> = dyn Fn(usize) -> Result<Option<cell::CellData>> + Sync + 'a;

/// Scan `n` cells, one per thread ([`chunk`]) at a time in parallel (each decoded, scanned and dropped
/// inside its task), folding them into the step's sums in cell order; then the report.
/// `max_t`: the widest row (the default bucket width); `bound`: at least the number of
/// tokens (the top-1 % selection's size).
///
/// Errors: a cell unreadable; an unknown loss preset.
pub(crate) fn fold(
    head: Head,
    n: usize,
    max_t: usize,
    bound: usize,
    opts: &Options,
    decode: &DecodeCell<'_>,
) -> Result<StepReport> {
    let loss_cfg: Option<LossConfig> = Some(
        crate::kernels::presets::preset(&opts.loss_preset)
            .map_err(|e| Error::Usage(format!("--loss-preset: {e}")))?,
    );
    let width = opts
        .bucket_width
        .unwrap_or_else(|| max_t.max(1).div_ceil(16).next_power_of_two())
        .max(1);
    let floor = std::sync::atomic::AtomicU64::new(0f64.to_bits());
    let params = ScanParams {
        floor: &floor,
        width,
        top_k: bound.div_ceil(100).max(1),
        corrections: &opts.corrections,
        loss: loss_cfg.as_ref(),
        keep_tokens: opts.keep_tokens,
    };

    let mut all = Sums::default();
    let mut ranks: BTreeMap<usize, Sums> = BTreeMap::new();
    let mut cell_sums: Vec<Sums> = Vec::new();
    let mut gathered = Gathered {
        top: attribution::TopK::new(params.top_k),
        ..Gathered::default()
    };
    let mut whatif_sums = vec![WhatIfSums::default(); opts.corrections.len()];
    let mut hist = Histogram::new();
    let mut table = opts.keep_tokens.then(TokenTable::default);
    let mut cov = Coverage::default();
    let idx: Vec<usize> = (0..n).collect();
    for chunk in idx.chunks(chunk()) {
        // Each cell read, scanned and dropped inside its task: chunk() cells in flight.
        let outs: Vec<Option<CellOut>> = chunk
            .par_iter()
            .map(|&i| Ok(decode(i)?.map(|cd| scan::scan_cell(cd, &params))))
            .collect::<Result<_>>()?;
        for out in outs.into_iter().flatten() {
            all.merge(&out.sums);
            ranks.entry(out.key.0).or_default().merge(&out.sums);
            cov.cells += 1;
            cov.rows += out.sums.rows as u64;
            cov.tokens += out.sums.n as u64;
            cov.unscored_tokens += out.sums.unscored;
            cov.unmatched_rows += out.unmatched_rows;
            cov.unmatched_tokens += out.unmatched_tokens;
            if !cov.masks.contains(&out.mask_source) {
                cov.masks.push(out.mask_source);
            }
            cov.token_ids |= out.has_ids;
            cov.loss_cells += usize::from(out.has_loss);
            if cov.loss_note.is_none() {
                cov.loss_note = out.loss_note.clone();
            }
            cell_sums.push(out.sums);
            gathered.merge(out.gathered);
            floor.store(
                gathered.top.floor().to_bits(),
                std::sync::atomic::Ordering::Relaxed,
            );
            for (s, o) in whatif_sums.iter_mut().zip(&out.whatif) {
                s.merge(o);
            }
            hist.merge(&out.hist);
            if let (Some(t), Some(o)) = (table.as_mut(), out.tokens) {
                t.extend(o);
            }
        }
    }
    let metrics = ProducerMetrics::from_sums(&all, &ranks, &cell_sums);
    let named = metrics
        .named()
        .into_iter()
        .map(|(n, v)| NamedMetric {
            name: n.to_string(),
            value: v,
        })
        .collect();
    let seq_table = opts.keep_tokens.then(|| gathered.seqs.clone());
    let (attribution, findings) = gathered.finish(width, opts.top_n, head.step);
    let with_loss = cov.loss_cells == cov.cells && cov.cells > 0;
    if !with_loss && cov.loss_note.is_none() && cov.loss_cells > 0 {
        cov.loss_note = Some(format!(
            "loss computed on {} of {} cells only: not reported",
            cov.loss_cells, cov.cells
        ));
    }
    let whatif = opts
        .corrections
        .iter()
        .zip(&whatif_sums)
        .map(|(c, s)| s.finish(c.clone(), with_loss))
        .collect();
    Ok(StepReport {
        step: head.step,
        producer: head.producer,
        root: head.root,
        pair: head.pair,
        against: head.against,
        coverage: cov,
        metrics,
        named,
        histogram: hist,
        attribution,
        loss_preset: opts.loss_preset.clone(),
        whatif,
        findings,
        token_table: table,
        seq_table,
    })
}

/// A logged metric series to judge alongside the dumped steps: `(source, metric, points)`.
pub type LoggedSeries = (String, String, Vec<(i64, f64)>);

/// The report of analysed steps and logged series: each step's section, the trend of
/// `opts.trend_metric` over the steps (when there are several), the trend of each logged
/// series, and every finding.
pub fn build_report(
    mut steps: Vec<StepReport>,
    logged: Vec<LoggedSeries>,
    opts: &Options,
) -> Report {
    steps.sort_by_key(|s| s.step);
    let mut trends = Vec::new();
    let mut findings: Vec<Finding> = steps.iter().flat_map(|s| s.findings.clone()).collect();
    if steps.len() >= 2 {
        let points = steps
            .iter()
            .filter_map(|s| s.metric(&opts.trend_metric).map(|v| (s.step, v)))
            .collect();
        let (t, f) = trend::trend(&opts.trend_metric, "dumps", points);
        trends.push(t);
        findings.extend(f);
    }
    for (source, metric, points) in logged {
        let (t, f) = trend::trend(&metric, &source, points);
        trends.push(t);
        findings.extend(f);
    }
    Report {
        schema_version: SCHEMA_VERSION,
        tool: "mismatch",
        steps,
        trends,
        findings,
    }
}
