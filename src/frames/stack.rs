//! Frames of a whole-step producer's dump (verl, slime/Miles, NeMo-RL, SGLang's dumper,
//! AReaL, verl generations, Miles' dashboard), built from the model's [`StepDump`] the
//! producer maps its files into: the same three tables as a NexRL tree's
//! ([`super::Frames`]), so a notebook reads every stack alike.
//!
//! - `tokens`: `kind` (`batch`), `step`, `rank`, `micro` (null for a whole-batch cell),
//!   `row`, `pos`, then one column per per-token tensor of the response's shape, named by
//!   meaning: `log_probs_rollout`, `log_probs_old`, `log_probs_current`,
//!   `log_probs_reference` (the model's roles, whatever the stack calls them: AReaL's
//!   `old_logprobs` is the engine's), `entropy`, `response_mask`, `loss_mask`,
//!   `advantages`, `ratio`, `per_token_loss`, `token_rewards`, `importance_weights`,
//!   `response_ids`.
//! - `scalars`: each cell's loss record (`loss`, `pg_loss`, `entropy_loss`, KL terms,
//!   coefficients, metrics), `kind` `loss`.
//! - `trajectories`: one row per batch row of each cell (`kind` `batch`, `index` the row, `reward`,
//!   `advantage`, `length` the response length, `group_id`, `uid` the producer's sample
//!   id, `prompt` and `response` the decoded text where the stack dumps it: verl
//!   generations, slime, AReaL); columns a stack does not dump are null.

use polars::prelude::*;

use super::{polars_err, Frames};
use crate::error::Result;
use crate::model::step::{StepDump, TokenTensor};

const KIND: &str = "batch";

/// A cell's per-token columns: rows, width, and `(name, row-major values)`.
type Block = (usize, usize, Vec<(String, Vec<f64>)>);

/// The frames of `steps` (one producer's, any number of steps).
///
/// Errors: a frame polars refuses (column lengths; not expected from the model).
pub fn frames_of_steps(steps: &[StepDump]) -> Result<Frames> {
    Ok(Frames {
        scalars: scalars(steps)?,
        tokens: tokens(steps)?,
        trajectories: rows(steps)?,
    })
}

/// The per-token tensors of a cell sharing the response shape `[rows, T]` (that of its
/// first log-prob role, else its response mask), by column name.
fn columns(b: &crate::model::step::TokenBatch) -> Option<Block> {
    let reference = b
        .log_probs
        .values()
        .next()
        .or(b.response_mask.as_ref())
        .or(b.per_token_loss.as_ref())?;
    let shape = reference.tensor.shape().to_vec();
    let [rows, width] = shape[..] else {
        return None;
    };
    let mut out: Vec<(String, &TokenTensor)> = b
        .log_probs
        .iter()
        .map(|(role, t)| (format!("log_probs_{}", role.name()), t))
        .collect();
    let named = [
        ("entropy", &b.entropy),
        ("response_mask", &b.response_mask),
        ("loss_mask", &b.loss_mask),
        ("advantages", &b.advantages),
        ("ratio", &b.ratio),
        ("per_token_loss", &b.per_token_loss),
        ("token_rewards", &b.token_rewards),
        ("importance_weights", &b.importance_weights),
        ("response_ids", &b.response_ids),
    ];
    out.extend(
        named
            .into_iter()
            .filter_map(|(n, t)| Some((n.to_string(), t.as_ref()?))),
    );
    let cols = out
        .into_iter()
        .filter(|(_, t)| t.tensor.shape() == shape.as_slice())
        .map(|(n, t)| (n, t.tensor.to_f64_vec()))
        .collect();
    Some((rows, width, cols))
}

fn tokens(steps: &[StepDump]) -> Result<DataFrame> {
    let cells: Vec<(i64, usize, Option<usize>, Block)> = steps
        .iter()
        .flat_map(|s| {
            s.cells
                .iter()
                .filter_map(move |c| Some((s.step, c.rank, c.micro, columns(&c.batch)?)))
        })
        .collect();
    let mut names: Vec<String> = Vec::new();
    for (_, _, _, (_, _, cols)) in &cells {
        for (n, _) in cols {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    let height: usize = cells.iter().map(|(_, _, _, (r, w, _))| r * w).sum();
    let (mut step, mut rank, mut micro, mut row, mut pos) = (
        Vec::with_capacity(height),
        Vec::with_capacity(height),
        Vec::with_capacity(height),
        Vec::with_capacity(height),
        Vec::with_capacity(height),
    );
    let mut data: Vec<Vec<Option<f64>>> =
        names.iter().map(|_| Vec::with_capacity(height)).collect();
    for (s, rk, mc, (rows, width, cols)) in &cells {
        let n = rows * width;
        step.extend(std::iter::repeat_n(*s, n));
        rank.extend(std::iter::repeat_n(Some(*rk as i64), n));
        micro.extend(std::iter::repeat_n(mc.map(|m| m as i64), n));
        for r in 0..*rows {
            for p in 0..*width {
                row.push(r as i64);
                pos.push(p as i64);
            }
        }
        for (name, col) in names.iter().zip(data.iter_mut()) {
            match cols.iter().find(|(n2, _)| n2 == name) {
                Some((_, vals)) => col.extend(vals.iter().map(|&x| Some(x))),
                None => col.extend(std::iter::repeat_n(None, n)),
            }
        }
    }
    let mut out = vec![
        Column::new("kind".into(), vec![KIND; height]),
        Column::new("step".into(), step),
        Column::new("rank".into(), rank),
        Column::new("micro".into(), micro),
        Column::new("row".into(), row),
        Column::new("pos".into(), pos),
    ];
    for (name, col) in names.iter().zip(data) {
        out.push(Column::new(name.as_str().into(), col));
    }
    DataFrame::new(height, out).map_err(polars_err)
}

fn scalars(steps: &[StepDump]) -> Result<DataFrame> {
    let (mut step, mut rank, mut micro, mut key, mut value) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in steps {
        for c in &s.cells {
            let Some(l) = &c.loss else { continue };
            let named = [
                ("loss", l.loss),
                ("pg_loss", l.pg_loss),
                ("entropy_loss", l.entropy_loss),
            ];
            let all = named
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_string(), v?)))
                .chain(l.kl.iter().map(|(k, v)| (k.clone(), *v)))
                .chain(l.coefficients.iter().map(|(k, v)| (k.clone(), *v)))
                .chain(l.metrics.iter().map(|(k, v)| (format!("metrics.{k}"), *v)));
            for (k, v) in all {
                step.push(s.step);
                rank.push(Some(c.rank as i64));
                micro.push(c.micro.map(|m| m as i64));
                key.push(k);
                value.push(v);
            }
        }
    }
    let height = step.len();
    DataFrame::new(
        height,
        vec![
            Column::new("step".into(), step),
            Column::new("rank".into(), rank),
            Column::new("micro".into(), micro),
            Column::new("kind".into(), vec!["loss"; height]),
            Column::new("key".into(), key),
            Column::new("value".into(), value),
        ],
    )
    .map_err(polars_err)
}

fn rows(steps: &[StepDump]) -> Result<DataFrame> {
    let (mut step, mut index, mut length, mut reward, mut advantage, mut group, mut uid) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let (mut prompt, mut response) = (Vec::new(), Vec::new());
    for s in steps {
        for c in &s.cells {
            // every row of the batch, its metadata where the producer dumps some
            let b = &c.batch;
            let tensor_rows = b
                .log_probs
                .values()
                .chain(&b.response_mask)
                .map(|t| t.tensor.shape().first().copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            for i in 0..b.rows.len().max(tensor_rows) {
                let m = b.rows.get(i).cloned().unwrap_or_default();
                step.push(s.step);
                index.push(i as i64);
                length.push(m.response_len.map(|n| n as i64));
                reward.push(m.reward);
                advantage.push(m.advantage);
                group.push(m.group);
                uid.push(m.sample);
                prompt.push(m.prompt_text);
                response.push(m.response_text);
            }
        }
    }
    let height = step.len();
    DataFrame::new(
        height,
        vec![
            Column::new("kind".into(), vec![KIND; height]),
            Column::new("step".into(), step),
            Column::new("index".into(), index),
            Column::new("length".into(), length),
            Column::new("reward".into(), reward),
            Column::new("advantage".into(), advantage),
            Column::new("group_id".into(), group),
            Column::new("uid".into(), uid),
            Column::new("prompt".into(), prompt),
            Column::new("response".into(), response),
        ],
    )
    .map_err(polars_err)
}
