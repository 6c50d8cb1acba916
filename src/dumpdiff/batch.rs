//! Whole-batch sections: 1 (self-hosted `trajectory/` vs remote-api
//! `prepared_trajectories/`) and 5 (remote-api `datums/` vs its `prepared_trajectories/`).
//!
//! Rows pair by content (token hash), never by index. Datums hold the trajectory shifted
//! by one token (`input_tokens = tokens[:-1]`, `target_tokens[t] = tokens[t+1]`, and the
//! per-token `loss_mask`/`advantages`/`logprobs` at `t` describe `tokens[t+1]`), and
//! trajectories whose advantages are all zero get no datum: such a count difference is
//! explained, not failed.

use crate::compare::align::{match_rows, MatchMethod, RowMatch};
use crate::compare::metrics::{Accumulator, ElemLoc};
use crate::compare::tolerance::{TolerancePolicy, Verdict};
use crate::dumpdiff::report::{Cell, Comparison, Origin};
use crate::dumpdiff::sections::{self, BatchInputs, Mat, PairCtx};
use crate::model::tokens::{tokens_hash, TokenSeq};
use crate::model::trajectory::{DatumBatch, TrajectoryBatch};
use crate::tensor::DType;

/// One trajectory as either producer writes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traj {
    /// Prompt + response token ids.
    pub tokens: Vec<i64>,
    /// 1 on response tokens.
    pub loss_mask: Vec<i64>,
    /// Scalar reward.
    pub reward: Option<f64>,
    /// The trajectory's advantage (remote-api only).
    pub advantage: Option<f64>,
}

/// One remote-api datum, in its shifted layout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Datum {
    /// `tokens[:-1]`.
    pub input_tokens: Vec<i64>,
    /// `tokens[1:]`.
    pub target_tokens: Vec<i64>,
    /// Log-prob of `target_tokens[t]` under the sampling policy.
    pub logprobs: Vec<f64>,
    /// The trajectory's advantage at each position.
    pub advantages: Vec<f64>,
    /// 1.0 where `target_tokens[t]` is a response token.
    pub loss_mask: Vec<f64>,
}

/// The trajectories of a `trajectory/` or `prepared_trajectories/` file as the model
/// holds them; missing token lists are empty.
pub fn trajectories(batch: &TrajectoryBatch<'_>) -> Vec<Traj> {
    let seq = |s: &Option<TokenSeq<'_>>| s.as_ref().map(TokenSeq::to_vec).unwrap_or_default();
    batch
        .rows
        .iter()
        .map(|t| Traj {
            tokens: seq(&t.tokens),
            loss_mask: seq(&t.loss_mask),
            reward: t.reward,
            advantage: t.advantage,
        })
        .collect()
}

/// The datums of a `datums/` file as the model holds them; missing lists are empty.
pub fn datums(batch: DatumBatch<'_>) -> Vec<Datum> {
    let seq = |s: &Option<TokenSeq<'_>>| s.as_ref().map(TokenSeq::to_vec).unwrap_or_default();
    batch
        .rows
        .into_iter()
        .map(|d| Datum {
            input_tokens: seq(&d.input_tokens),
            target_tokens: seq(&d.target_tokens),
            logprobs: d.logprobs.unwrap_or_default(),
            advantages: d.advantages.unwrap_or_default(),
            loss_mask: d.loss_mask.unwrap_or_default(),
        })
        .collect()
}

/// Ragged rows as a zero-padded matrix.
fn ragged(rows: &[Vec<f64>], dtype: DType) -> Mat {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut data = vec![0.0; rows.len() * width];
    for (i, r) in rows.iter().enumerate() {
        data[i * width..i * width + r.len()].copy_from_slice(r);
    }
    Mat::new(vec![rows.len(), width], rows.len(), width, data, dtype)
}

/// Compare ragged integer rows exactly over each pair's full length; a position past one
/// side's end counts as NaN there, so a length difference is beyond tolerance.
fn exact_ragged(
    ctx: &PairCtx<'_>,
    key: &str,
    a: &[Vec<f64>],
    b: &[Vec<f64>],
    origin_a: Origin,
    origin_b: Origin,
) -> Comparison {
    let name = format!("{}.{key}", ctx.section);
    let tol = ctx.policy.resolve(&name, DType::I64, false);
    let mut acc = Accumulator::new(tol.clone(), None, false);
    let empty = Vec::new();
    for &(ra, rb) in &ctx.rows.pairs {
        let (xa, xb) = (a.get(ra).unwrap_or(&empty), b.get(rb).unwrap_or(&empty));
        for p in 0..xa.len().max(xb.len()) {
            let x = xa.get(p).copied().unwrap_or(f64::NAN);
            let y = xb.get(p).copied().unwrap_or(f64::NAN);
            let loc = ElemLoc {
                row: ra,
                other_row: rb,
                pos: p,
            };
            acc.push(x, y, loc);
        }
    }
    let (ma, mb) = (ragged(a, DType::I64), ragged(b, DType::I64));
    sections::finish(name, acc, tol, DType::I64, &ma, &mb, origin_a, origin_b)
}

fn as_f64(v: &[i64]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// A failing pseudo-comparison (`name`, `reason`).
fn failed(section: &str, key: &str, reason: String) -> Comparison {
    let mut c = sections::skipped(section, key, reason);
    c.verdict = Verdict::Fail;
    c
}

/// Section 1: self-hosted trajectories (`a`) vs remote-api prepared_trajectories (`b`),
/// paired by token content. Returns the cell and the notes explaining counts.
pub fn trajectories_cell(policy: &TolerancePolicy, a: &[Traj], b: &[Traj]) -> (Cell, Vec<String>) {
    const S: &str = "trajectories";
    let ta: Vec<&[i64]> = a.iter().map(|t| t.tokens.as_slice()).collect();
    let tb: Vec<&[i64]> = b.iter().map(|t| t.tokens.as_slice()).collect();
    let rows = exact_only(match_rows(&ta, &tb), &ta, &tb);
    let mut notes = vec![format!(
        "{} self-hosted vs {} remote-api trajectories, {} paired by token content{}",
        a.len(),
        b.len(),
        rows.pairs.len(),
        if rows.reordered() {
            " (order differs)"
        } else {
            ""
        }
    )];
    let ctx = PairCtx {
        policy,
        section: S,
        rows: &rows,
        mask_a: None,
        mask_b: None,
        cell_precision: None,
    };
    let tok = |t: &[Traj]| t.iter().map(|x| as_f64(&x.tokens)).collect::<Vec<_>>();
    let mask = |t: &[Traj]| t.iter().map(|x| as_f64(&x.loss_mask)).collect::<Vec<_>>();
    let rew = |t: &[Traj]| {
        ragged(
            &t.iter()
                .map(|x| vec![x.reward.unwrap_or(f64::NAN)])
                .collect::<Vec<_>>(),
            DType::F64,
        )
    };
    let o = |k: &str, kind: &str| Origin::dumped(kind, k);
    let mut out = vec![
        exact_ragged(
            &ctx,
            "tokens",
            &tok(a),
            &tok(b),
            o("tokens", "trajectory"),
            o("tokens", "prepared_trajectories"),
        ),
        exact_ragged(
            &ctx,
            "loss_mask",
            &mask(a),
            &mask(b),
            o("loss_mask", "trajectory"),
            o("loss_mask", "prepared_trajectories"),
        ),
        ctx.masked(
            "reward",
            &rew(a),
            &rew(b),
            o("reward", "trajectory"),
            o("reward", "prepared_trajectories"),
            false,
            false,
        ),
    ];
    let adv_a = a.iter().filter(|t| t.advantage.is_some()).count();
    let adv_b = b.iter().filter(|t| t.advantage.is_some()).count();
    if adv_a == 0 || adv_b == 0 {
        let only = match (adv_a, adv_b) {
            (0, 0) => "neither side",
            (0, _) => "remote-api only",
            _ => "self-hosted only",
        };
        out.push(sections::skipped(
            S,
            "advantages",
            format!("advantages on {only}: not compared here (section 4 and 5 use them)"),
        ));
        notes.push(format!("advantages: on {only}"));
    } else {
        let adv = |t: &[Traj]| {
            ragged(
                &t.iter()
                    .map(|x| vec![x.advantage.unwrap_or(f64::NAN)])
                    .collect::<Vec<_>>(),
                DType::F64,
            )
        };
        out.push(ctx.masked(
            "advantages",
            &adv(a),
            &adv(b),
            o("advantages", "trajectory"),
            o("advantages", "prepared_trajectories"),
            false,
            false,
        ));
    }
    if !rows.only_a.is_empty() || !rows.only_b.is_empty() {
        out.push(failed(
            S,
            "rows",
            format!(
                "trajectories without a content match: self-hosted {:?}, remote-api {:?}",
                rows.only_a, rows.only_b
            ),
        ));
    }
    let summary = sections::row_summary(&rows);
    (sections::cell(None, None, Some(summary), out), notes)
}

/// Keep only exact (unshifted) pairs: trajectories hold whole sequences on both sides.
fn exact_only(m: RowMatch, a: &[&[i64]], b: &[&[i64]]) -> RowMatch {
    if m.method != MatchMethod::ContentShifted {
        return m;
    }
    let mut out = RowMatch {
        pairs: vec![],
        only_a: m.only_a,
        only_b: m.only_b,
        method: MatchMethod::Content,
    };
    for (i, j) in m.pairs {
        if a[i] == b[j] {
            out.pairs.push((i, j));
        } else {
            out.only_a.push(i);
            out.only_b.push(j);
        }
    }
    out.only_a.sort_unstable();
    out.only_b.sort_unstable();
    out
}

/// Pair trajectories (`a`) with datums (`b`): by `input_tokens == tokens[:-1]`, then,
/// for leftovers, by `target_tokens == tokens[1:]` (so a datum with one corrupted input
/// token still finds its trajectory and is flagged at that token).
pub fn pair_datums(trajs: &[Traj], datums: &[Datum]) -> RowMatch {
    use std::collections::HashMap;
    let mut by_input: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut by_target: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, t) in trajs.iter().enumerate().rev() {
        if let Some((_, head)) = t.tokens.split_last() {
            by_input.entry(tokens_hash(head)).or_default().push(i);
            by_target
                .entry(tokens_hash(&t.tokens[1..]))
                .or_default()
                .push(i);
        }
    }
    let mut used = vec![false; trajs.len()];
    let mut pairs = Vec::new();
    let mut pending = Vec::new();
    let take = |map: &mut HashMap<u64, Vec<usize>>, key: u64, used: &mut [bool]| {
        let list = map.get_mut(&key)?;
        while let Some(i) = list.pop() {
            if !used[i] {
                used[i] = true;
                return Some(i);
            }
        }
        None
    };
    for (j, d) in datums.iter().enumerate() {
        match take(&mut by_input, tokens_hash(&d.input_tokens), &mut used) {
            Some(i) => pairs.push((i, j)),
            None => pending.push(j),
        }
    }
    let mut only_b = Vec::new();
    for j in pending {
        match take(
            &mut by_target,
            tokens_hash(&datums[j].target_tokens),
            &mut used,
        ) {
            Some(i) => pairs.push((i, j)),
            None => only_b.push(j),
        }
    }
    pairs.sort_unstable();
    RowMatch {
        pairs,
        only_a: (0..trajs.len()).filter(|&i| !used[i]).collect(),
        only_b,
        method: MatchMethod::ContentShifted,
    }
}

/// Section 5: remote-api datums (`b`) against its trajectories (`a`) with the one-token
/// shift: `input_tokens[t] = tokens[t]`, `target_tokens[t] = tokens[t+1]`,
/// `loss_mask[t] = loss_mask[t+1]`, `advantages[t] = A` and `logprobs[t]` = the
/// self-hosted `old_log_probs` of `tokens[t+1]` (when given), on positions valid on both.
pub fn datums_cell(
    policy: &TolerancePolicy,
    trajs: &[Traj],
    datums: &[Datum],
    inputs: &BatchInputs,
) -> (Cell, Vec<String>) {
    const S: &str = "datums";
    let rows = pair_datums(trajs, datums);
    let shifted = |f: &dyn Fn(&Traj) -> Vec<f64>| -> Mat {
        ragged(&trajs.iter().map(f).collect::<Vec<_>>(), DType::F64)
    };
    let a_input: Vec<Vec<f64>> = trajs
        .iter()
        .map(|t| as_f64(t.tokens.split_last().map_or(&[][..], |(_, h)| h)))
        .collect();
    let a_target: Vec<Vec<f64>> = trajs
        .iter()
        .map(|t| as_f64(t.tokens.get(1..).unwrap_or_default()))
        .collect();
    let a_mask_rows: Vec<Vec<f64>> = trajs
        .iter()
        .map(|t| as_f64(t.loss_mask.get(1..).unwrap_or_default()))
        .collect();
    let a_mask = ragged(&a_mask_rows, DType::F64);
    // the trajectories' own advantages, else (NexRL's remote-API dump holds none) the
    // self-hosted ones the comparison derived, by token content
    let own = trajs.iter().any(|t| t.advantage.is_some());
    let adv_of = |t: &Traj| match (own, &inputs.advantages) {
        (true, _) => t.advantage,
        (false, Some(a)) => inputs
            .traj_index
            .get(&tokens_hash(&t.tokens))
            .and_then(|i| a.get(*i).copied()),
        (false, None) => None,
    };
    let a_adv = shifted(&|t| vec![adv_of(t).unwrap_or(f64::NAN); t.tokens.len().saturating_sub(1)]);
    // Old log-probs of tokens[t+1]: the self-hosted batch row found by token hash, the
    // response position counted from the first loss-mask 1.
    let mut found = 0usize;
    let a_logp = inputs.old_log_probs.as_ref().map(|old| {
        shifted(&|t| {
            let n = t.tokens.len().saturating_sub(1);
            let Some(&row) = inputs.traj_index.get(&tokens_hash(&t.tokens)) else {
                return vec![f64::NAN; n];
            };
            let start = t
                .loss_mask
                .iter()
                .position(|&m| m != 0)
                .unwrap_or(t.loss_mask.len());
            (0..n)
                .map(|p| {
                    (p + 1)
                        .checked_sub(start)
                        .and_then(|q| old.get(row, q))
                        .unwrap_or(0.0)
                })
                .collect()
        })
    });
    if a_logp.is_some() {
        found = trajs
            .iter()
            .filter(|t| inputs.traj_index.contains_key(&tokens_hash(&t.tokens)))
            .count();
    }
    let from = |f: &dyn Fn(&Datum) -> Vec<f64>| -> Mat {
        ragged(&datums.iter().map(f).collect::<Vec<_>>(), DType::F64)
    };
    let b_input: Vec<Vec<f64>> = datums.iter().map(|d| as_f64(&d.input_tokens)).collect();
    let b_target: Vec<Vec<f64>> = datums.iter().map(|d| as_f64(&d.target_tokens)).collect();
    let b_mask_rows: Vec<Vec<f64>> = datums.iter().map(|d| d.loss_mask.clone()).collect();
    let b_mask = ragged(&b_mask_rows, DType::F64);
    let ctx = PairCtx {
        policy,
        section: S,
        rows: &rows,
        mask_a: Some(&a_mask),
        mask_b: Some(&b_mask),
        cell_precision: None,
    };
    let traj = |k: &str| Origin::derived(format!("prepared_trajectories.{k} shifted by one token"));
    let datum = |k: &str| Origin::dumped("datums", k);
    let mut out = vec![
        exact_ragged(
            &ctx,
            "input_tokens",
            &a_input,
            &b_input,
            traj("tokens[:-1]"),
            datum("input_tokens"),
        ),
        exact_ragged(
            &ctx,
            "target_tokens",
            &a_target,
            &b_target,
            traj("tokens[1:]"),
            datum("loss_fn_inputs.target_tokens"),
        ),
        exact_ragged(
            &ctx,
            "loss_mask",
            &a_mask_rows,
            &b_mask_rows,
            traj("loss_mask[1:]"),
            datum("loss_fn_inputs.loss_mask"),
        ),
    ];
    let b_adv = from(&|d| d.advantages.clone());
    if own || inputs.advantages.is_some() {
        let origin = match own {
            true => "prepared_trajectories.advantages broadcast over the shifted mask".to_string(),
            false => format!("{} broadcast over the shifted mask", inputs.advantages_from),
        };
        out.push(ctx.masked(
            "advantages",
            &a_adv,
            &b_adv,
            Origin::derived(origin),
            datum("loss_fn_inputs.advantages"),
            false,
            false,
        ));
    } else {
        out.push(sections::skipped(
            S,
            "advantages",
            "prepared_trajectories hold no advantages (NexRL dumps them as empty lists) and none were derived",
        ));
    }
    // response-only log-probs (NexRL passes the engine's as they are when their length is
    // not the tokens'): placed on the datum's loss-mask positions, in order
    let b_logp = from(&|d| {
        let valid = d.loss_mask.iter().filter(|m| **m != 0.0).count();
        if d.logprobs.len() == d.input_tokens.len() || d.logprobs.len() != valid {
            return d.logprobs.clone();
        }
        let mut it = d.logprobs.iter();
        d.loss_mask
            .iter()
            .map(|m| {
                if *m != 0.0 {
                    *it.next().unwrap_or(&0.0)
                } else {
                    0.0
                }
            })
            .collect()
    });
    match &a_logp {
        Some(x) => {
            let mut c = ctx.masked(
                "logprobs",
                x,
                &b_logp,
                Origin::sliced(
                    "self-hosted old_log_probs of tokens[t+1] (row by token hash, position from the first loss-mask 1)",
                ),
                datum("loss_fn_inputs.logprobs"),
                false,
                true,
            );
            // NexRL's datums carry the rollout engine's log-probs
            // (utils/finetune_service_utils.convert_trajectories_to_datums), the self-hosted
            // old_log_probs the trainer's: what differs is the rollout↔trainer mismatch
            // (shown with its numbers, not judged)
            if c.verdict >= Verdict::Warn {
                c.verdict = Verdict::Skipped;
                c.reason = format!(
                    "not judged: {} — the datums hold the rollout engine's log-probs and \
                     old_log_probs the trainer's: their difference is the rollout↔trainer \
                     mismatch (see `mismatch`), not a fault of either",
                    c.reason
                );
            }
            out.push(c);
        }
        None => out.push(sections::skipped(
            S,
            "logprobs",
            "no self-hosted old_log_probs to compare datum logprobs with",
        )),
    }
    // Counts: trajectories without a datum are expected exactly when all their
    // advantages are zero; anything else is a loss of data.
    let zero_adv = |t: &Traj| adv_of(t) == Some(0.0);
    // without any advantage a missing datum cannot be told dropped or lost
    let (dropped, lost): (Vec<usize>, Vec<usize>) = rows
        .only_a
        .iter()
        .filter(|&&i| adv_of(&trajs[i]).is_some())
        .partition(|&&i| zero_adv(&trajs[i]));
    let mut notes = vec![format!(
        "{} trajectories vs {} datums, {} paired by content (tokens[:-1] = input_tokens)",
        trajs.len(),
        datums.len(),
        rows.pairs.len()
    )];
    if !dropped.is_empty() {
        notes.push(format!(
            "{} trajectories have all-zero advantages (groups with identical rewards) → no datum: expected (trajectories {:?})",
            dropped.len(),
            dropped
        ));
    }
    if a_logp.is_some() && found < trajs.len() {
        notes.push(format!(
            "{} of {} trajectories not found in the self-hosted trajectory file: their logprobs are not compared",
            trajs.len() - found,
            trajs.len()
        ));
    }
    let paired_zero: Vec<usize> = rows
        .pairs
        .iter()
        .filter(|(i, _)| zero_adv(&trajs[*i]))
        .map(|(_, j)| *j)
        .collect();
    if !paired_zero.is_empty() {
        notes.push(format!(
            "datums {paired_zero:?} have all-zero advantages (usually dropped)"
        ));
    }
    if !lost.is_empty() {
        out.push(failed(
            S,
            "rows",
            format!("trajectories with non-zero advantages but no datum: {lost:?}"),
        ));
    }
    if !rows.only_b.is_empty() {
        out.push(failed(
            S,
            "rows",
            format!(
                "datums matching no trajectory by content: {:?}",
                rows.only_b
            ),
        ));
    }
    let summary = sections::row_summary(&rows);
    (sections::cell(None, None, Some(summary), out), notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traj(tokens: &[i64], prompt: usize, adv: f64) -> Traj {
        Traj {
            tokens: tokens.to_vec(),
            loss_mask: (0..tokens.len()).map(|i| (i >= prompt) as i64).collect(),
            reward: Some(1.0),
            advantage: Some(adv),
        }
    }

    fn datum_of(t: &Traj, old: &[f64]) -> Datum {
        let n = t.tokens.len() - 1;
        let start = t.loss_mask.iter().position(|&m| m != 0).unwrap();
        Datum {
            input_tokens: t.tokens[..n].to_vec(),
            target_tokens: t.tokens[1..].to_vec(),
            logprobs: (0..n)
                .map(|p| {
                    if p + 1 >= start {
                        old[p + 1 - start]
                    } else {
                        0.0
                    }
                })
                .collect(),
            advantages: (0..n)
                .map(|p| {
                    if t.loss_mask[p + 1] != 0 {
                        t.advantage.unwrap()
                    } else {
                        0.0
                    }
                })
                .collect(),
            loss_mask: t.loss_mask[1..].iter().map(|&m| m as f64).collect(),
        }
    }

    fn inputs(trajs: &[Traj], old: &[&[f64]]) -> BatchInputs {
        let width = old.iter().map(|r| r.len()).max().unwrap();
        let mut data = Vec::new();
        for r in old {
            data.extend(r.iter().copied());
            data.extend(std::iter::repeat_n(0.0, width - r.len()));
        }
        BatchInputs {
            old_log_probs: Some(Mat::new(
                vec![old.len(), width],
                old.len(),
                width,
                data,
                DType::F32,
            )),
            traj_index: trajs
                .iter()
                .enumerate()
                .map(|(i, t)| (tokens_hash(&t.tokens), i))
                .collect(),
            traj_short: std::collections::HashMap::new(),
            advantages: None,
            advantages_from: String::new(),
            micros_per_rank: 1,
            adv_parts: None,
            adv_eps: None,
            old_of_traj: None,
            response_lens: Vec::new(),
            dealer: None,
        }
    }

    #[test]
    fn shifted_datums_pair_and_zero_advantage_drops_are_explained() {
        let t = [
            traj(&[5, 6, 7, 8], 2, 0.5),
            traj(&[9, 10, 11], 1, 0.0),
            traj(&[12, 13, 14, 15, 16], 3, -0.5),
        ];
        let old: [&[f64]; 3] = [&[-0.5, -1.0], &[-0.1, -0.2], &[-2.0, -3.0]];
        // Datums in another order, the zero-advantage trajectory dropped.
        let d = [datum_of(&t[2], old[2]), datum_of(&t[0], old[0])];
        let (cell, notes) = datums_cell(&TolerancePolicy::default(), &t, &d, &inputs(&t, &old));
        assert_eq!(cell.verdict, Verdict::Pass, "{}", cell.reason);
        assert_eq!(cell.rows.as_ref().unwrap().pairs, vec![(0, 1), (2, 0)]);
        assert_eq!(cell.rows.as_ref().unwrap().only_reference, vec![1]);
        assert!(
            notes[1].starts_with("1 trajectories have all-zero advantages"),
            "{notes:?}"
        );
        let lp = cell
            .comparisons
            .iter()
            .find(|c| c.name == "datums.logprobs")
            .unwrap();
        assert_eq!(lp.metrics.as_ref().unwrap().count, 2 + 2);
    }

    #[test]
    fn corrupted_datum_token_is_flagged_at_its_position() {
        let t = [traj(&[5, 6, 7, 8], 2, 0.5), traj(&[1, 2, 3], 1, 1.0)];
        let old: [&[f64]; 2] = [&[-0.5, -1.0], &[-0.1, -0.2]];
        let mut d = [datum_of(&t[0], old[0]), datum_of(&t[1], old[1])];
        d[1].input_tokens[1] = 99;
        d[0].logprobs[2] = -0.7;
        let (cell, _) = datums_cell(&TolerancePolicy::default(), &t, &d, &inputs(&t, &old));
        assert_eq!(cell.verdict, Verdict::Fail);
        let get = |n: &str| cell.comparisons.iter().find(|c| c.name == n).unwrap();
        let first = get("datums.input_tokens")
            .metrics
            .as_ref()
            .unwrap()
            .first_beyond
            .unwrap();
        assert_eq!(
            (first.loc.row, first.loc.other_row, first.loc.pos),
            (1, 1, 1)
        );
        assert_eq!((first.a, first.b), (2.0, 99.0));
        let lp = get("datums.logprobs")
            .metrics
            .as_ref()
            .unwrap()
            .first_beyond
            .unwrap();
        assert_eq!(
            (lp.loc.other_row, lp.loc.pos, lp.a, lp.b),
            (0, 2, -1.0, -0.7)
        );
        assert_eq!(get("datums.target_tokens").verdict, Verdict::Pass);
    }

    #[test]
    fn lost_trajectory_with_advantage_fails() {
        let t = [traj(&[5, 6, 7], 1, 0.5)];
        let (cell, _) = datums_cell(
            &TolerancePolicy::default(),
            &t,
            &[],
            &inputs(&t, &[&[0.0, 0.0]]),
        );
        assert_eq!(cell.verdict, Verdict::Fail);
        assert!(cell.reason.contains("no datum: [0]"), "{}", cell.reason);
    }

    #[test]
    fn trajectories_pair_by_content_not_index() {
        let a = [traj(&[1, 2, 3], 1, 0.0), traj(&[4, 5], 1, 0.0)];
        let mut b = [a[1].clone(), a[0].clone()];
        b[0].advantage = Some(0.3);
        let strip = |t: &Traj| Traj {
            advantage: None,
            ..t.clone()
        };
        let a: Vec<Traj> = a.iter().map(strip).collect();
        let (cell, notes) = trajectories_cell(&TolerancePolicy::default(), &a, &b);
        assert_eq!(cell.verdict, Verdict::Pass, "{}", cell.reason);
        assert_eq!(cell.rows.as_ref().unwrap().pairs, vec![(0, 1), (1, 0)]);
        assert!(notes.iter().any(|n| n == "advantages: on remote-api only"));
        b[1].reward = Some(0.0);
        let (cell, _) = trajectories_cell(&TolerancePolicy::default(), &a, &b);
        assert_eq!(cell.verdict, Verdict::Fail);
    }
}
