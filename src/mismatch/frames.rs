//! The per-token and per-sequence tables of an analysed step as polars frames
//! (`--export-frames`): one row per compared token (`step, rank, micro, row, position,
//! token_id, logp_a, logp_b, delta, abs_delta`) and one per sequence of the attribution's
//! sequence records (all of them when the step was analysed with `top_n` ≥ its rows).

use polars::prelude::{Column, DataFrame};

use super::attribution::SeqRecord;
use super::scan::TokenTable;
use crate::error::{Error, Result};

fn frame(cols: Vec<Column>) -> Result<DataFrame> {
    DataFrame::new_infer_height(cols).map_err(|e| Error::Usage(format!("building frame: {e}")))
}

/// The per-token frame of step `step`.
///
/// Errors: polars refusing the columns (never for a table built by the scan).
pub fn tokens_frame(step: i64, t: &TokenTable) -> Result<DataFrame> {
    let n = t.rank.len();
    let delta: Vec<f64> = t.logp_b.iter().zip(&t.logp_a).map(|(b, a)| b - a).collect();
    let abs: Vec<f64> = delta.iter().map(|d| d.abs()).collect();
    frame(vec![
        Column::new("step".into(), vec![step; n]),
        Column::new("rank".into(), t.rank.clone()),
        Column::new("micro".into(), t.micro.clone()),
        Column::new("row".into(), t.row.clone()),
        Column::new("position".into(), t.position.clone()),
        Column::new("token_id".into(), t.token_id.clone()),
        Column::new("logp_a".into(), t.logp_a.clone()),
        Column::new("logp_b".into(), t.logp_b.clone()),
        Column::new("delta".into(), delta),
        Column::new("abs_delta".into(), abs),
    ])
}

/// The per-sequence frame of step `step`.
///
/// Errors: as [`tokens_frame`].
pub fn sequences_frame(step: i64, seqs: &[SeqRecord]) -> Result<DataFrame> {
    let n = seqs.len();
    frame(vec![
        Column::new("step".into(), vec![step; n]),
        Column::new(
            "rank".into(),
            seqs.iter().map(|s| s.rank as u32).collect::<Vec<_>>(),
        ),
        Column::new(
            "micro".into(),
            seqs.iter()
                .map(|s| s.micro.map(|m| m as u32))
                .collect::<Vec<_>>(),
        ),
        Column::new(
            "row".into(),
            seqs.iter().map(|s| s.row as u32).collect::<Vec<_>>(),
        ),
        Column::new(
            "tokens".into(),
            seqs.iter().map(|s| s.tokens).collect::<Vec<_>>(),
        ),
        Column::new(
            "reward".into(),
            seqs.iter().map(|s| s.reward).collect::<Vec<_>>(),
        ),
        Column::new(
            "group".into(),
            seqs.iter().map(|s| s.group.clone()).collect::<Vec<_>>(),
        ),
        Column::new(
            "sum_abs_delta".into(),
            seqs.iter().map(|s| s.sum_abs).collect::<Vec<_>>(),
        ),
        Column::new(
            "mean_abs_delta".into(),
            seqs.iter().map(|s| s.mean_abs).collect::<Vec<_>>(),
        ),
        Column::new(
            "sum_delta".into(),
            seqs.iter().map(|s| s.sum_delta).collect::<Vec<_>>(),
        ),
        Column::new(
            "max_abs_delta".into(),
            seqs.iter().map(|s| s.max_abs).collect::<Vec<_>>(),
        ),
    ])
}
