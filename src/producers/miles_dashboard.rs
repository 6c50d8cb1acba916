//! Miles' dashboard parquet (`--dump-details`: `dashboard_columns/rollout_{id}.parquet`)
//! mapped into the model ([`StepDump`]).
//!
//! What Miles writes (radixark/miles 21b3552828a0d650b4c6c45cd85e8e0b7b1834f9,
//! `miles/ray/rollout/debug_data.py`, `save_dashboard_columns`, called by
//! `save_debug_rollout_data` beside `rollout_data/{id}.pt` at
//! `{details}/dashboard_columns/rollout_{id}.parquet`, `rollout_eval_{id}.parquet` for
//! evaluation): one row per `Sample`, polars schema `sample_index: Int32`,
//! `response_length: Int32`, `total_length: Int32` (`len(tokens)`), `tokens: List(Int32)`
//! (prompt ++ response), `loss_mask: List(Int8)` and `rollout_log_probs: List(Float32)`
//! (one per response token), written with `write_parquet(row_group_size=8)`. The
//! dashboard reads it back by these names (`miles/dashboard/dump_reader.py`
//! 05e3741460b27d3975b93b25047fee55a3deaea7, `ROLLOUT_COLUMNS`).
//!
//! Model: one cell (rank 0), response-aligned: `rollout_log_probs` is the engine's
//! ([`LogProbSource::Rollout`]), `loss_mask` the response mask, `tokens` the input ids,
//! their last `response_length` the response ids; rows carry `sample_index`, prompt and
//! response lengths. The parquet mirrors `rollout_data/{id}.pt`: a details folder holding
//! both is read by the slime producer (from the `.pt`, which has more); this producer
//! reads a folder holding only the parquet mirror (the `dashboard_columns/` folder, or
//! the file).

use std::path::{Path, PathBuf};

use polars::prelude::{AnyValue, DataFrame, ParquetReader, SerReader};

use super::columns::{listed, padded_f64, padded_i64};
use super::{walk, StepReader};
use crate::error::{Error, Position, Result};
use crate::model::step::{LogProbSource, RowMeta, StepDump, TokenBatch};

/// The columns `save_dashboard_columns` writes, in its order.
pub const COLUMNS: [&str; 6] = [
    "sample_index",
    "response_length",
    "total_length",
    "tokens",
    "loss_mask",
    "rollout_log_probs",
];

/// The Miles dashboard-columns producer.
pub struct MilesDashboard;

/// `(rollout id, evaluation)` of a `rollout_{id}.parquet` / `rollout_eval_{id}.parquet`.
fn id_of(p: &Path) -> Option<(i64, bool)> {
    let stem = p
        .file_name()?
        .to_str()?
        .strip_suffix(".parquet")?
        .strip_prefix("rollout_")?;
    match stem.strip_prefix("eval_") {
        Some(id) => Some((id.parse().ok()?, true)),
        None => Some((stem.parse().ok()?, false)),
    }
}

fn files(root: &Path) -> Result<Vec<(i64, bool, PathBuf)>> {
    Ok(walk::files_under(root)?
        .into_iter()
        .filter_map(|p| id_of(&p).map(|(i, e)| (i, e, p)))
        .collect())
}

fn frame(path: &Path) -> Result<DataFrame> {
    // through the source layer, so a store URL reads as a local path does
    let bytes = walk::read(path)?;
    let df = ParquetReader::new(std::io::Cursor::new(bytes))
        .finish()
        .map_err(|e| Error::format(path, Position::File, format!("Parquet: {e}")))?;
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|n| n.to_string())
        .collect();
    let missing: Vec<&str> = COLUMNS
        .iter()
        .filter(|c| !names.iter().any(|n| n == *c))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(Error::format(
            path,
            Position::File,
            format!(
                "not Miles' dashboard columns: missing {} (columns: {})",
                missing.join(", "),
                names.join(", ")
            ),
        ));
    }
    Ok(df)
}

/// Cell `(row, column)` as numbers (a list) or one number.
fn cell_values(df: &DataFrame, path: &Path, col: &str, row: usize) -> Result<Vec<f64>> {
    let bad = |msg: String| Error::format(path, Position::Key(format!("{col}[{row}]")), msg);
    let c = df.column(col).map_err(|e| bad(e.to_string()))?;
    let v = c.get(row).map_err(|e| bad(e.to_string()))?;
    match v {
        AnyValue::Null => Ok(Vec::new()),
        AnyValue::List(s) => s
            .iter()
            .map(|x| {
                x.extract::<f64>()
                    .ok_or_else(|| bad(format!("expected numbers, found {x}")))
            })
            .collect(),
        other => other
            .extract::<f64>()
            .map(|x| vec![x])
            .ok_or_else(|| bad(format!("expected a number or a list, found {other}"))),
    }
}

impl StepReader for MilesDashboard {
    fn name(&self) -> &'static str {
        "miles-dashboard"
    }

    /// Dashboard parquet files and no slime `.pt` dump beside them (a details folder with
    /// both is slime's).
    fn detect(&self, root: &Path) -> bool {
        let ours = files(root).map(|f| !f.is_empty()).unwrap_or(false);
        ours && !walk::files_under(root)
            .map(|fs| fs.iter().any(|p| super::slime::is_slime_dump(p)))
            .unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        Ok(walk::steps_of(&files(root)?))
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let all = files(root)?;
        let Some((_, _, path)) = all.iter().find(|f| f.0 == step && !f.1) else {
            return Err(Error::input(
                root,
                format!(
                    "no Miles dashboard_columns/rollout_{step}.parquet (rollout ids there: {:?})",
                    self.steps(root)?
                ),
            ));
        };
        let df = frame(path)?;
        let (mut tokens, mut resp, mut mask, mut lp, mut rows) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..df.height() {
            let one = |c: &str| -> Result<i64> {
                cell_values(&df, path, c, i)?
                    .first()
                    .map(|x| *x as i64)
                    .ok_or_else(|| Error::format(path, Position::Key(format!("{c}[{i}]")), "null"))
            };
            let (idx, rl, total) = (
                one("sample_index")?,
                one("response_length")?.max(0) as usize,
                one("total_length")?,
            );
            let toks: Vec<i64> = cell_values(&df, path, "tokens", i)?
                .iter()
                .map(|x| *x as i64)
                .collect();
            if toks.len() as i64 != total || rl > toks.len() {
                return Err(Error::format(
                    path,
                    Position::Key(format!("tokens[{i}]")),
                    format!(
                        "{} tokens for total_length {total}, response_length {rl}",
                        toks.len()
                    ),
                ));
            }
            let m: Vec<i64> = cell_values(&df, path, "loss_mask", i)?
                .iter()
                .map(|x| *x as i64)
                .collect();
            lp.push(cell_values(&df, path, "rollout_log_probs", i)?);
            rows.push(RowMeta {
                sample: Some(idx.to_string()),
                prompt_len: Some(toks.len() - rl),
                response_len: Some(rl),
                ..RowMeta::default()
            });
            resp.push(toks[toks.len() - rl..].to_vec());
            mask.push(m);
            tokens.push(toks);
        }
        let mut b = TokenBatch {
            rows,
            ..TokenBatch::default()
        };
        let mut t = listed(padded_f64(&lp), path, "rollout_log_probs");
        t.dtype = Some(crate::tensor::DType::F32);
        b.log_probs.insert(LogProbSource::Rollout, t);
        b.input_ids = Some(listed(padded_i64(&tokens), path, "tokens"));
        b.response_ids = Some(listed(padded_i64(&resp), path, "tokens"));
        b.response_mask = Some(listed(padded_i64(&mask), path, "loss_mask"));
        let unplaced = df
            .get_column_names()
            .iter()
            .filter(|n| !COLUMNS.contains(&n.as_str()))
            .map(|n| format!("{}: {n}", path.display()))
            .collect();
        Ok(StepDump {
            unplaced,
            ..StepDump::whole_batch(self.name(), root, step, b, vec![path.clone()])
        })
    }
}
