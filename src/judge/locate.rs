//! A micro's rows placed in the whole batch without `input_ids`, from the values.
//!
//! NexRL's self-hosted `forward_data` need not hold the token ids (the dumper writes
//! what the forward pass returned: `log_probs`, `entropy`, `response_mask`), so nothing
//! names the trajectory of a row. The whole-batch `old_log_probs` row computed for the
//! same tokens differs from the row's current log-probs only by the policy's change
//! since it was computed (none on a first PPO epoch, a few hundredths after an update);
//! any other row's differ by O(1) on most positions (other tokens, other contexts). So a
//! row is placed at the old row closest to it (mean `|log_probs − old_log_probs|` over
//! its first [`PROBE`] valid positions) when that one is clearly the closest: at most
//! half as far as the next, or equal to it value for value (trajectories with the same
//! tokens). Each old row takes one row at most. A row that cannot be placed so stays
//! unplaced; the caller says so instead of guessing.

use std::path::Path;

use super::self_hosted::{dense, SelfHostedStep};
use crate::error::Result;
use crate::formats::read_any;
use crate::model::step::LogProbSource;
use crate::producers::layout::{DumpTree, Kind};
use crate::producers::nexrl_self_hosted;

/// How many valid positions of a row are compared (enough to tell rows apart: the
/// gaps of other rows are O(1) per position).
pub const PROBE: usize = 64;

/// Where one row was placed, and the evidence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    /// The whole-batch old row.
    pub old_row: usize,
    /// Its mean absolute gap to the row's log-probs.
    pub gap: f64,
    /// The next closest free old row's gap (`None`: no other candidate).
    pub runner_up: Option<f64>,
}

/// The first [`PROBE`] valid `(column, value)` pairs of each row of `lp`/`mask` (`[b, t]`
/// row-major), columns moved right by `shift[r]` (a row realigned left by that much).
pub fn probes(
    lp: &[f64],
    mask: &[f64],
    t: usize,
    shift: Option<&[usize]>,
) -> Vec<Vec<(usize, f64)>> {
    let b = lp.len().checked_div(t).unwrap_or(0);
    (0..b)
        .map(|r| {
            let sh = shift.and_then(|s| s.get(r)).copied().unwrap_or(0);
            (0..t)
                .filter(|c| mask[r * t + c] != 0.0 && lp[r * t + c].is_finite())
                .take(PROBE)
                .map(|c| (c + sh, lp[r * t + c]))
                .collect()
        })
        .collect()
}

/// Place each row (its [`probes`]) among `n_old` old rows (`old_row(j)`: row `j`'s values,
/// read once here whatever the number of rows). `fits(r, j)`: whether old row `j` may
/// hold row `r` at all (e.g. its trajectory's response length equals the row's valid
/// count); `None` for a row with no valid position or no clear closest old row.
pub fn locate<'a>(
    rows: &[Vec<(usize, f64)>],
    n_old: usize,
    old_row: impl Fn(usize) -> std::borrow::Cow<'a, [f64]>,
    fits: impl Fn(usize, usize) -> bool,
) -> Vec<Option<Placed>> {
    let b = rows.len();
    // every row's candidates, closest first
    let mut cands: Vec<Vec<(f64, usize)>> = vec![Vec::new(); b];
    for j in 0..n_old {
        let want: Vec<usize> = (0..b)
            .filter(|r| !rows[*r].is_empty() && fits(*r, j))
            .collect();
        if want.is_empty() {
            continue;
        }
        let old = old_row(j);
        for r in want {
            let (mut sum, mut ok) = (0.0, true);
            for &(c, v) in &rows[r] {
                match old.get(c) {
                    Some(o) if o.is_finite() => sum += (v - o).abs(),
                    _ => ok = false,
                }
            }
            if ok {
                cands[r].push((sum / rows[r].len() as f64, j));
            }
        }
    }
    for c in &mut cands {
        c.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    }
    // rows placed closest first, each old row once
    let mut order: Vec<usize> = (0..b).filter(|r| !cands[*r].is_empty()).collect();
    order.sort_by(|x, y| cands[*x][0].0.total_cmp(&cands[*y][0].0));
    let mut taken = vec![false; n_old];
    let mut out = vec![None; b];
    for r in order {
        let mut free = cands[r].iter().filter(|(_, j)| !taken[*j]);
        let Some(&(gap, j)) = free.next() else {
            continue;
        };
        let runner_up = free.next().map(|(g, _)| *g);
        // a tie is the same values (duplicate trajectories): either row is the row
        let clear = runner_up.is_none_or(|next| gap <= 0.5 * next || next == gap);
        if clear {
            taken[j] = true;
            out[r] = Some(Placed {
                old_row: j,
                gap,
                runner_up,
            });
        }
    }
    out
}

/// Rows [`locate`] left unplaced, placed where the micro's placed rows say it lies: when
/// every placed row `r` sits at old row `j0 + r` for one `j0` (a micro sliced from the
/// batch in order, as fixed micro sizes give), an unplaced row `r` is taken to be old row
/// `j0 + r` if that row fits it and is free (two near rows a short response cannot tell
/// apart). Returns how many rows were so placed.
pub fn fill_in_order(
    placed: &mut [Option<Placed>],
    n_old: usize,
    fits: impl Fn(usize, usize) -> bool,
) -> usize {
    let mut j0 = None;
    for (r, p) in placed.iter().enumerate() {
        if let Some(p) = p {
            let Some(base) = p.old_row.checked_sub(r) else {
                return 0;
            };
            if j0.is_some_and(|j| j != base) {
                return 0;
            }
            j0 = Some(base);
        }
    }
    let Some(j0) = j0 else {
        return 0;
    };
    let taken: Vec<usize> = placed.iter().flatten().map(|p| p.old_row).collect();
    let mut n = 0;
    for (r, p) in placed.iter_mut().enumerate() {
        let j = j0 + r;
        if p.is_none() && j < n_old && fits(r, j) && !taken.contains(&j) {
            *p = Some(Placed {
                old_row: j,
                gap: f64::NAN,
                runner_up: None,
            });
            n += 1;
        }
    }
    n
}

/// The rows of `lp`/`mask` (`[b, t]`, realigned left by `shift` when given) placed among
/// `n_old` old rows: [`locate`] among the old rows whose trajectory's response length
/// (`row_len(j)`; `None`: not known) equals the row's valid count, then
/// [`fill_in_order`]. Returns the placements and how many the order placed.
pub fn locate_rows<'a>(
    (lp, mask, t): (&[f64], &[f64], usize),
    shift: Option<&[usize]>,
    n_old: usize,
    old_row: impl Fn(usize) -> std::borrow::Cow<'a, [f64]>,
    row_len: impl Fn(usize) -> Option<usize>,
) -> (Vec<Option<Placed>>, usize) {
    let valid: Vec<usize> = mask
        .chunks(t.max(1))
        .map(|row| row.iter().filter(|m| **m != 0.0).count())
        .collect();
    let rows = probes(lp, mask, t, shift);
    let fits = |r: usize, j: usize| row_len(j).is_none_or(|n| n == valid[r]);
    let mut placed = locate(&rows, n_old, old_row, fits);
    let in_order = fill_in_order(&mut placed, n_old, fits);
    (placed, in_order)
}

/// Place a micro's rows (`lp`, `mask`: `[b, t]`) read from forward_data file `ff` among
/// `n_old` whole-batch old rows and say how: the old row of each, or an error naming
/// the rows no old row clearly holds. `row_len(j)`: the response length of the
/// trajectory old row `j` holds (`None`: not known), which a row's valid count must equal.
pub fn place<'a>(
    ff: &std::path::Path,
    (lp, mask, t): (&[f64], &[f64], usize),
    n_old: usize,
    old_row: impl Fn(usize) -> std::borrow::Cow<'a, [f64]>,
    row_len: impl Fn(usize) -> Option<usize>,
) -> crate::error::Result<(Vec<usize>, String)> {
    let (placed, in_order) = locate_rows((lp, mask, t), None, n_old, old_row, row_len);
    let lost: Vec<usize> = (0..placed.len()).filter(|r| placed[*r].is_none()).collect();
    if !lost.is_empty() {
        return Err(crate::error::Error::CannotJudge {
            path: ff.to_path_buf(),
            msg: format!(
                "no input_ids, and rows {lost:?} could not be placed among the old_log_probs \
                 rows by their log-probs (no old row clearly closest) nor by the micro's order \
                 in the batch (no run of old rows in order fits them)"
            ),
        });
    }
    let placed: Vec<Placed> = placed.into_iter().flatten().collect();
    let worst = placed
        .iter()
        .map(|p| p.gap)
        .filter(|g| g.is_finite())
        .fold(0.0, f64::max);
    let next = placed
        .iter()
        .filter_map(|p| p.runner_up)
        .fold(f64::INFINITY, f64::min);
    let note = format!(
        "no input_ids: rows placed among the old_log_probs rows by their log-probs (mean \
         |log_probs − old_log_probs| ≤ {}, next closest row ≥ {})",
        crate::fmt::num(worst),
        if next.is_finite() {
            crate::fmt::num(next)
        } else {
            "none: no other row of their lengths".into()
        }
    ) + &if in_order > 0 {
        format!("; {in_order} row(s) too near another placed by the micro's order in the batch")
    } else {
        String::new()
    };
    Ok((placed.iter().map(|p| p.old_row).collect(), note))
}

impl SelfHostedStep {
    /// [`SelfHostedStep::settle_old_order`] for forward_data without `input_ids`: each
    /// row placed by its values ([`super::locate`]), the order kept is the one under
    /// which the placed rows' valid counts equal their trajectories' response lengths
    /// (NexRL's batch order, the producer's, when both fit as well). `None` when the
    /// cells hold ids or cannot be read.
    pub(super) fn settle_by_lengths(
        &mut self,
        tree: &DumpTree,
        step: i64,
        cells: &[(u32, u32)],
        perm: &[usize],
        sorted: &[usize],
    ) -> Option<(bool, String)> {
        let mut fit = [0usize; 2];
        let mut rows = 0;
        for (r, m) in cells {
            let ff = tree
                .get(Kind::ForwardData, step, Some(*r), Some(*m))?
                .path
                .clone();
            let fv = read_any(&ff).ok()?;
            let fb = nexrl_self_hosted::forward_data(&ff, &fv).ok()?;
            if fb.input_ids.is_some() {
                return None;
            }
            let (shape, lp, _) = dense(fb.log_probs(LogProbSource::Current), &ff, "").ok()?;
            let (_, mask, _) = dense(fb.response_mask.as_ref(), &ff, "").ok()?;
            let t = *shape.last()?;
            let probes = probes(&lp, &mask, t, None);
            let placed = locate(
                &probes,
                self.rewards.len(),
                |j| self.old.row(j, self.cols),
                |_, _| true,
            );
            for (row, p) in placed.iter().enumerate() {
                let Some(p) = p else { continue };
                let valid = mask[row * t..(row + 1) * t]
                    .iter()
                    .filter(|x| **x != 0.0)
                    .count();
                let len = |i: Option<&usize>| {
                    i.and_then(|i| self.response_lens.get(*i)?.as_ref()) == Some(&valid)
                };
                fit[0] += usize::from(len(Some(&p.old_row)));
                fit[1] += usize::from(len(perm.get(p.old_row)));
                rows += 1;
            }
        }
        let batch_wins = fit[1] >= fit[0];
        self.old_of_traj = batch_wins.then(|| sorted.to_vec());
        Some((
            batch_wins,
            format!(
                "no input_ids: {rows} rows placed by their log-probs; their valid counts equal \
                 their trajectories' response lengths for {} in NexRL's batch order, {} in \
                 trajectory-file order",
                fit[1], fit[0]
            ),
        ))
    }

    /// The trajectory of each row of a forward_data without `input_ids`
    /// ([`super::locate`]), with a note saying how they were placed (a step with
    /// whole-batch old log-probs; otherwise `place_by_order`).
    pub(super) fn place_rows(
        &self,
        ff: &Path,
        lp: &[f64],
        mask: &[f64],
        t: usize,
    ) -> Result<(Vec<usize>, String)> {
        let (old_rows, note) = place(
            ff,
            (lp, mask, t),
            self.rewards.len(),
            |j| self.old.row(j, self.cols),
            |j| {
                self.response_lens
                    .get(self.traj_of_old(j))
                    .copied()
                    .flatten()
            },
        )?;
        Ok((
            old_rows.into_iter().map(|j| self.traj_of_old(j)).collect(),
            note,
        ))
    }

    /// The trajectory whose old log-probs are whole-batch row `j` (the inverse of
    /// [`SelfHostedStep::old_row`]).
    fn traj_of_old(&self, j: usize) -> usize {
        match (&self.old_of_traj, &self.batch_order) {
            (Some(_), Some(perm)) => perm.get(j).copied().unwrap_or(j),
            _ => j,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn old() -> Vec<Vec<f64>> {
        (0..6)
            .map(|j| {
                (0..8)
                    .map(|c| -((j * 7 + c * 3) % 11) as f64 / 3.0 - 0.1)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn rows_are_placed_at_their_old_rows_despite_a_policy_change() {
        let o = old();
        // micro rows are old rows 4, 1, 3 after a small update (+0.03), right padding
        let want = [4usize, 1, 3];
        let t = 8;
        let mut lp = vec![0.0; 3 * t];
        let mut mask = vec![0.0; 3 * t];
        for (r, j) in want.iter().enumerate() {
            for c in 0..6 - r {
                lp[r * t + c] = o[*j][c] + 0.03;
                mask[r * t + c] = 1.0;
            }
        }
        let got = locate(
            &probes(&lp, &mask, t, None),
            6,
            |j| Cow::Borrowed(&o[j][..]),
            |_, _| true,
        );
        for (r, j) in want.iter().enumerate() {
            let g = got[r].expect("placed");
            assert_eq!(g.old_row, *j);
            assert!((g.gap - 0.03).abs() < 1e-12);
        }
        // realigned rows (moved left by 2) are compared at their columns before the move
        let moved = |v: &[f64]| -> Vec<f64> {
            v.chunks(t)
                .flat_map(|row| row[2..].iter().copied().chain([0.0, 0.0]))
                .collect()
        };
        let (shifted, smask) = (moved(&lp), moved(&mask));
        let rows = probes(&shifted, &smask, t, Some(&[2, 2, 2]));
        let got = locate(&rows, 6, |j| Cow::Borrowed(&o[j][..]), |_, _| true);
        assert_eq!(
            got.iter().map(|g| g.unwrap().old_row).collect::<Vec<_>>(),
            want
        );
    }

    #[test]
    fn a_row_between_two_old_rows_is_not_placed() {
        let o = [vec![-1.0, -2.0], vec![-1.2, -2.2]];
        let rows = probes(&[-1.1, -2.1], &[1.0, 1.0], 2, None);
        let got = locate(&rows, 2, |j| Cow::Borrowed(&o[j][..]), |_, _| true);
        assert_eq!(got, vec![None]);
        // the fit test leaves one candidate: placed
        let got = locate(&rows, 2, |j| Cow::Borrowed(&o[j][..]), |_, j| j == 1);
        assert_eq!(got[0].map(|g| g.old_row), Some(1));
    }

    #[test]
    fn duplicate_old_rows_take_one_row_each() {
        let o = [vec![-1.0, -2.0], vec![-1.0, -2.0], vec![-3.0, -0.5]];
        let rows = probes(&[-1.0, -2.0, -1.0, -2.0], &[1.0; 4], 2, None);
        let got = locate(&rows, 3, |j| Cow::Borrowed(&o[j][..]), |_, _| true);
        let mut placed: Vec<usize> = got.iter().map(|g| g.unwrap().old_row).collect();
        placed.sort();
        assert_eq!(placed, vec![0, 1]);
    }

    #[test]
    fn an_unplaced_row_follows_the_order_of_the_placed_ones() {
        let p = |j| {
            Some(Placed {
                old_row: j,
                gap: 0.0,
                runner_up: None,
            })
        };
        // rows 0, 1, 3 at old rows 5, 6, 8: row 2 is old row 7
        let mut placed = vec![p(5), p(6), None, p(8)];
        assert_eq!(fill_in_order(&mut placed, 10, |_, _| true), 1);
        assert_eq!(placed[2].map(|x| x.old_row), Some(7));
        // not in order, or the row does not fit: left unplaced
        let mut placed = vec![p(5), p(9), None];
        assert_eq!(fill_in_order(&mut placed, 10, |_, _| true), 0);
        let mut placed = vec![p(5), None];
        assert_eq!(fill_in_order(&mut placed, 10, |_, j| j != 6), 0);
        assert_eq!(placed[1], None);
    }

    #[test]
    fn unplaced_rows_are_an_error_naming_them() {
        let o = [vec![-1.0, -2.0], vec![-1.2, -2.2]];
        let e = place(
            std::path::Path::new("fd.pt"),
            (&[-1.1, -2.1], &[1.0, 1.0], 2),
            2,
            |j| Cow::Borrowed(&o[j][..]),
            |_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("fd.pt") && e.contains("rows [0]"), "{e}");
        let (rows, note) = place(
            std::path::Path::new("fd.pt"),
            (&[-1.0, -2.0], &[1.0, 1.0], 2),
            2,
            |j| Cow::Borrowed(&o[j][..]),
            |_| None,
        )
        .unwrap();
        assert_eq!(rows, vec![0]);
        assert!(note.contains("next closest row ≥ 0.2"), "{note}");
    }
}
