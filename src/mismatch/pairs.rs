//! Trainer A vs trainer B across two trees of one step (`mismatch A B`): the same role
//! (the trainer's old log-probs by default) read from two dumps of one step — FSDP vs
//! Megatron, micro-batch 4 vs 8 (verl#6280) — whatever each producer's layout.
//!
//! Rows are paired **by content**, never by index: each row's response token ids (the
//! model's row view, [`TokenBatch::response_tokens`], so response columns and
//! whole-sequence columns line up) hashed with the model's [`tokens_hash`] and paired by
//! [`match_rows_by`] (the alignment dumpdiff's sections use; exact matches only, equal
//! responses paired in order), then checked token by token when both rows are read.
//! Rows without a partner, or without token ids, are counted and named
//! ([`Pairing`]), never dropped silently.
//!
//! Each of A's cells becomes one scanned cell: its paired rows, A's role as `a`, the
//! partner rows' role (read from whichever of B's cells hold them) as `b`, over each
//! row's response window; a token is compared where both trees' masks hold it (a token
//! one mask holds and the other does not is counted in `unmatched_tokens`). Ranks, micros
//! and rows in the report are A's; advantages (for the what-if loss) and row records are
//! A's. Everything after the pairing is the one-tree analysis ([`super::fold`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use rayon::prelude::*;

use super::cell::{CellData, MaskSource};
use super::report::{Pairing, RowAt, StepReport};
use super::{fold, missing_roles, role_name, Head, Options};
use crate::compare::align::match_rows_by;
use crate::error::Result;
use crate::model::step::{Cell, LogProbSource, StepCells, TokenBatch};
use crate::model::tokens::tokens_hash;

/// A row as the first pass sees it: its cell, index, content hash and response length.
#[derive(Debug, Clone, Copy)]
struct RowHead {
    cell: usize,
    row: usize,
    hash: Option<u64>,
    len: usize,
}

/// The first pass over one tree: each cell's roles and each row's [`RowHead`] (cells are
/// read in parallel and dropped).
fn heads(side: &dyn StepCells) -> Result<(Vec<Vec<LogProbSource>>, Vec<RowHead>)> {
    let n = side.keys().len();
    let per: Vec<(Vec<LogProbSource>, Vec<RowHead>)> = (0..n)
        .into_par_iter()
        .map(|i| {
            let c = side.cell(i)?;
            let roles = c.batch.log_probs.keys().copied().collect();
            let rows = (0..c.batch.row_count())
                .map(|r| {
                    let t = c.batch.response_tokens(r);
                    RowHead {
                        cell: i,
                        row: r,
                        hash: t.as_deref().map(tokens_hash),
                        len: t.map_or(0, |t| t.len()),
                    }
                })
                .collect();
            Ok((roles, rows))
        })
        .collect::<Result<_>>()?;
    let (roles, rows): (Vec<_>, Vec<_>) = per.into_iter().unzip();
    Ok((roles, rows.into_iter().flatten().collect()))
}

/// Where a row is, as the report names it.
fn at(keys: &[(usize, Option<usize>)], h: &RowHead) -> RowAt {
    RowAt {
        rank: keys[h.cell].0,
        micro: keys[h.cell].1,
        row: h.row,
    }
}

/// Analyse role `opts.pair.0` of tree `a` against role `opts.pair.1` of tree `b`, two
/// dumps of one step, rows paired by content (see the module documentation).
///
/// Errors: a cell unreadable; a tree whose cells do not all hold its role (naming the
/// roles it holds); an unknown loss preset.
pub fn analyse_pair(a: &dyn StepCells, b: &dyn StepCells, opts: &Options) -> Result<StepReport> {
    let (ra, rb) = opts.pair;
    let (roles_a, rows_a) = heads(a)?;
    let (roles_b, rows_b) = heads(b)?;
    for (side, roles, role, name) in [(a, &roles_a, ra, "A"), (b, &roles_b, rb, "B")] {
        if roles.is_empty() || roles.iter().any(|h| !h.contains(&role)) {
            let need = format!(
                "comparing A's {} with B's {} needs {} in every cell of {name}",
                role_name(ra),
                role_name(rb),
                role_name(role)
            );
            return Err(missing_roles(side, roles, &need));
        }
    }
    let m = match_rows_by(
        rows_a.len(),
        rows_b.len(),
        |i, minus_last| (!minus_last).then_some(rows_a[i].hash).flatten(),
        |j, minus_last| (!minus_last).then_some(rows_b[j].hash).flatten(),
    );
    let (keys_a, keys_b) = (a.keys(), b.keys());
    let mut pairing = Pairing {
        root_b: b.root().to_path_buf(),
        producer_b: b.producer().to_string(),
        rows_paired: m.pairs.len(),
        ..Pairing::default()
    };
    for (only, rows, keys, without, count, first) in [
        (
            &m.only_a,
            &rows_a,
            &keys_a,
            &mut pairing.without_ids_a,
            &mut pairing.only_a,
            &mut pairing.first_only_a,
        ),
        (
            &m.only_b,
            &rows_b,
            &keys_b,
            &mut pairing.without_ids_b,
            &mut pairing.only_b,
            &mut pairing.first_only_b,
        ),
    ] {
        for &i in only {
            if rows[i].hash.is_none() {
                *without += 1;
            } else {
                *count += 1;
                if first.len() < Pairing::EXAMPLES {
                    first.push(at(keys, &rows[i]));
                }
            }
        }
    }
    // Each of A's cells: its paired rows, in A's order, with their partners.
    let mut by_cell: Vec<Vec<(RowHead, RowHead)>> = vec![Vec::new(); keys_a.len()];
    for &(i, j) in &m.pairs {
        by_cell[rows_a[i].cell].push((rows_a[i], rows_b[j]));
    }
    let max_t = m
        .pairs
        .iter()
        .map(|&(i, _)| rows_a[i].len)
        .max()
        .unwrap_or(1);
    let bound: usize = m.pairs.iter().map(|&(i, _)| rows_a[i].len).sum();
    let unpaired = pairing.only_a + pairing.only_b + pairing.without_ids_a + pairing.without_ids_b;
    let head = Head {
        step: a.step(),
        producer: a.producer().to_string(),
        root: a.root().to_path_buf(),
        pair: [ra, rb],
        against: Some(pairing),
    };
    let mut rep = fold(head, keys_a.len(), max_t, bound, opts, &|i| {
        let pairs = &by_cell[i];
        if pairs.is_empty() {
            return Ok(None);
        }
        let ca = a.cell(i)?;
        let mut cb: BTreeMap<usize, Cow<'_, Cell>> = BTreeMap::new();
        for (_, hb) in pairs {
            if let std::collections::btree_map::Entry::Vacant(e) = cb.entry(hb.cell) {
                e.insert(b.cell(hb.cell)?);
            }
        }
        Ok(Some(paired_cell(&ca, &cb, pairs, (ra, rb))))
    })?;
    rep.coverage.unmatched_rows += unpaired;
    Ok(rep)
}

/// Row `r`'s mask over its response window (`n` tokens): the response mask, else the
/// loss mask, else every token; 1 or 0.
fn row_mask(batch: &TokenBatch, r: usize, n: usize) -> Option<Vec<bool>> {
    match batch.response_mask.as_ref().or(batch.loss_mask.as_ref()) {
        Some(m) => batch
            .response_values(m, r)
            .map(|v| v.iter().map(|x| *x != 0.0 && !x.is_nan()).collect()),
        None => Some(vec![true; n]),
    }
}

/// Row `r`'s advantages over its response window: per token, a per-row tensor
/// broadcast, else the row record's.
fn row_advantages(batch: &TokenBatch, r: usize, n: usize) -> Option<Vec<f64>> {
    let per_row = |v: f64| Some(vec![v; n]);
    match batch.advantages.as_ref() {
        Some(x) => match x.tensor.shape() {
            [_, c] if *c > 1 => batch.response_values(x, r),
            [rows, 1] | [rows] if r < *rows => per_row(x.tensor.to_f64_vec()[r]),
            _ => None,
        },
        None => batch.rows.get(r)?.advantage.and_then(per_row),
    }
}

/// The scanned cell of A's cell `ca`: its rows paired with B's (`pairs`, read from the
/// B cells `cb`), each over its response window, `a` and `b` the two trees' roles.
fn paired_cell(
    ca: &Cell,
    cb: &BTreeMap<usize, Cow<'_, Cell>>,
    pairs: &[(RowHead, RowHead)],
    (ra, rb): (LogProbSource, LogProbSource),
) -> CellData {
    let (ba, ta) = (&ca.batch, ca.batch.log_probs(ra));
    let t = pairs.iter().map(|p| p.0.len).max().unwrap_or(0);
    let mut cd = CellData {
        rank: ca.rank,
        micro: ca.micro,
        rows: 0,
        t,
        a: Vec::new(),
        b: Vec::new(),
        current: None,
        mask: Vec::new(),
        mask_source: if ba.response_mask.is_some() {
            MaskSource::Response
        } else if ba.loss_mask.is_some() {
            MaskSource::Loss
        } else {
            MaskSource::None
        },
        ids: Some(Vec::new()),
        advantages: Some(Vec::new()),
        first_col: Vec::new(),
        meta: Vec::new(),
        row_index: Some(Vec::new()),
        unmatched_rows: 0,
        unmatched_tokens: 0,
    };
    for (ha, hb) in pairs {
        let bb = &cb[&hb.cell].batch;
        let tb = bb.log_probs(rb);
        let (n, ia, ib) = (
            ha.len,
            ba.response_tokens(ha.row),
            bb.response_tokens(hb.row),
        );
        let row = (|| {
            // The hashes matched: the tokens must too (else a collision, not a pair).
            if ia.is_none() || ia != ib {
                return None;
            }
            let va = ba.response_values(ta?, ha.row)?;
            let vb = bb.response_values(tb?, hb.row)?;
            let (ma, mb) = (row_mask(ba, ha.row, n)?, row_mask(bb, hb.row, n)?);
            (va.len() == n && vb.len() == n && ma.len() == n && mb.len() == n)
                .then_some((va, vb, ma, mb))
        })();
        let Some((va, vb, ma, mb)) = row else {
            cd.unmatched_rows += 2;
            continue;
        };
        let pad = t - n;
        cd.a.extend(va.iter().chain(std::iter::repeat_n(&0.0, pad)));
        cd.b.extend(vb.iter().chain(std::iter::repeat_n(&0.0, pad)));
        for (x, y) in ma.iter().zip(&mb) {
            cd.mask.push(f64::from(u8::from(*x && *y)));
            cd.unmatched_tokens += usize::from(x != y);
        }
        cd.mask.extend(std::iter::repeat_n(0.0, pad));
        if let Some(ids) = cd.ids.as_mut() {
            ids.extend(
                ia.unwrap_or_default()
                    .into_iter()
                    .chain(std::iter::repeat_n(0, pad)),
            );
        }
        cd.advantages = match (cd.advantages.take(), row_advantages(ba, ha.row, n)) {
            (Some(mut all), Some(v)) => {
                all.extend(v.into_iter().chain(std::iter::repeat_n(0.0, pad)));
                Some(all)
            }
            _ => None,
        };
        cd.first_col.push(0);
        cd.meta
            .push(ba.rows.get(ha.row).cloned().unwrap_or_default());
        if let Some(ix) = cd.row_index.as_mut() {
            ix.push(ha.row);
        }
        cd.rows += 1;
    }
    cd
}
