//! A total loss dumped scaled (verl's `loss_scale_factor`): the factor is read from the
//! cells themselves before their composition is judged.
//!
//! verl's actor (`verl/workers/actor/dp_actor.py`, `update_policy`, volcengine/verl@cc62eca)
//! backpropagates `loss = policy_loss * loss_scale_factor`, `response_mask.shape[0] /
//! ppo_mini_batch_size` under dynamic batch size (rows of the micro-batch over the
//! mini-batch's) and `1 / gradient_accumulation` otherwise, while `pg_loss` and
//! `entropy_loss` stay unscaled. A side that dumps that `loss` beside its terms breaks
//! `loss − pg_loss = −entropy_coeff·entropy_loss + kl_coef·kl_loss` on every cell; with
//! the factor it holds. Per cell `pg = loss/s + e·entropy − k·kl`; with `s = rows/n` that
//! is linear in `(n, e, k)` (`pg = n·loss/rows + …`), with one `s` linear in `(1/s, e, k)`:
//! both are fitted by least squares, `n` snapped to the step's rows (or an integer) and
//! `1/s` to an integer (micros accumulated) when the fit cannot tell them apart.

use super::{Convention, Prep, Source};
use crate::kernels::loss::LossScale;

/// The scale candidates the cells' dumped scalars allow (at most two: rows-proportional
/// and constant), each fitted with the coefficients left unknown (`None`) or known.
pub(super) fn candidates(
    cells: &[&Prep],
    ec: Option<f64>,
    kc: Option<f64>,
    step_rows: usize,
) -> Vec<LossScale> {
    let mut out = Vec::new();
    if cells.len() < 2 {
        return out;
    }
    for rows_prop in [true, false] {
        let x = |p: &Prep| {
            let l = p.loss.unwrap_or(0.0);
            if rows_prop {
                l / p.rows.max(1) as f64
            } else {
                l
            }
        };
        // unknowns: the inverse scale, then e and k when not known
        let mut a: Vec<Vec<f64>> = Vec::new();
        let mut y: Vec<f64> = Vec::new();
        for p in cells {
            let (pg, ent, kl) = (
                p.pg.unwrap_or(0.0),
                p.ent.unwrap_or(0.0),
                p.kl_loss.unwrap_or(0.0),
            );
            let mut row = vec![x(p)];
            let mut rhs = pg;
            match ec {
                Some(e) => rhs -= e * ent,
                None => row.push(ent),
            }
            match kc {
                Some(k) => rhs += k * kl,
                None => row.push(-kl),
            }
            a.push(row);
            y.push(rhs);
        }
        let Some(sol) = least_squares(&a, &y) else {
            continue;
        };
        let inv = sol[0];
        if !(inv.is_finite() && inv > 0.0) {
            continue;
        }
        // a producer's scale is rows over an integer mini-batch size, or one over an
        // integer number of accumulated micros: a fit that snaps to neither is no
        // producer's convention (two cells and a free coefficient fit "rows / 1.244")
        let (n, max_rows) = (
            snap_rows(inv, step_rows),
            cells.iter().map(|p| p.rows).max(),
        );
        match rows_prop {
            true if n.fract() == 0.0 && max_rows.is_some_and(|m| n >= m as f64) => {
                out.push(LossScale::RowsOver(n))
            }
            false if snap_int(inv).fract() == 0.0 => {
                out.push(LossScale::Constant(1.0 / snap_int(inv)))
            }
            _ => {}
        }
    }
    out
}

/// `n` as the step's rows, else the nearest integer, when within 1 %; else as fitted.
fn snap_rows(n: f64, step_rows: usize) -> f64 {
    let s = step_rows as f64;
    if step_rows > 0 && ((n - s) / s).abs() < 0.01 {
        s
    } else {
        snap_int(n)
    }
}

/// The nearest integer (≥ 1) when within 1 % of it, else `v`.
pub(in crate::judge) fn snap_int(v: f64) -> f64 {
    let r = v.round().max(1.0);
    if ((v - r) / r).abs() < 0.01 {
        r
    } else {
        v
    }
}

/// The cells with their dumped totals divided by `scale`'s factor: what an unscaled
/// producer would have dumped.
pub(super) fn unscaled(preps: &[Prep], scale: LossScale) -> Vec<Prep> {
    preps
        .iter()
        .map(|p| {
            let mut q = p.clone();
            if let Some(f) = scale.factor(p.rows) {
                q.loss = p.loss.map(|l| l / f);
                q.total = p.total / f;
            }
            q
        })
        .collect()
}

/// The conventions record's entry for an inferred scale: explained `(cells, of)`.
fn convention(s: LossScale, step_rows: usize, (explained, of): (usize, usize)) -> Convention {
    let n = match s {
        LossScale::RowsOver(n) => Some(n),
        LossScale::Constant(v) => Some(v),
        LossScale::One => None,
    };
    let mut c = Convention::new("loss_scale", describe(s, step_rows), n, Source::Inferred);
    c.explained = Some(explained);
    c.cells = Some(of);
    c
}

/// The scale in words, for the conventions record.
fn describe(scale: LossScale, step_rows: usize) -> String {
    match scale {
        LossScale::One => "1".into(),
        LossScale::RowsOver(n) if n == step_rows as f64 => format!(
            "rows / {} (the step's rows: verl's loss_scale_factor = micro rows / ppo_mini_batch_size)",
            crate::fmt::num(n)
        ),
        LossScale::RowsOver(n) => format!(
            "rows / {} (verl's loss_scale_factor = micro rows / ppo_mini_batch_size)",
            crate::fmt::num(n)
        ),
        LossScale::Constant(s) => format!(
            "{} (verl's loss_scale_factor = 1 / gradient_accumulation)",
            crate::fmt::num(s)
        ),
    }
}

/// The scale of the dumped totals when the cells' composition needs one: `(scale, the
/// cells with their totals unscaled, its conventions record)`; `None` when the
/// totals as dumped follow on more than half of the cells, or no scale does better.
/// `known`: the coefficients already settled (entropy, KL; `None` = to fit).
pub(super) fn settle(
    preps: &[Prep],
    with_terms: &dyn Fn(&&Prep) -> bool,
    (ec, kc): (Option<f64>, Option<f64>),
) -> Option<(LossScale, Vec<Prep>, Convention)> {
    let explained = |cells: &[&Prep]| -> usize {
        match (ec, kc) {
            (Some(e), Some(k)) => cells
                .iter()
                .filter(|p| super::fit::cell_fits(p, (e, k), (0.0, 0.0)))
                .count(),
            _ => super::fit::fit(cells, ec, kc).map_or(0, |f| f.explained),
        }
    };
    // a cell whose total and pg term are both 0 fits every scale: it says nothing, unless
    // a term of unknown coefficient is not 0 there (its coefficient is then 0: seed 3023)
    let open = |x: Option<f64>, known: Option<f64>| known.is_none() && x.is_some_and(|x| x != 0.0);
    let telling = |p: &&Prep| {
        with_terms(p)
            && (p.loss != Some(0.0) || p.pg != Some(0.0) || open(p.ent, ec) || open(p.kl_loss, kc))
    };
    let cells: Vec<&Prep> = preps.iter().filter(telling).collect();
    let mut best = explained(&cells);
    let step_rows = preps.iter().map(|p| p.rows).sum();
    // one cell with terms and both coefficients stated: nothing to fit, but verl's rows /
    // the step's rows is fixed by the step itself — taken when it alone makes the cell's
    // composition hold (seed 8172: one micro of four with advantages)
    let one_stated = cells.len() == 1 && ec.is_some() && kc.is_some();
    if (cells.len() < 2 && !one_stated) || best * 2 > cells.len() {
        return None;
    }
    let tried = if one_stated {
        vec![LossScale::RowsOver(step_rows as f64)]
    } else {
        candidates(&cells, ec, kc, step_rows)
    };
    let mut out = None;
    for s in tried {
        let store = unscaled(preps, s);
        let refs: Vec<&Prep> = store.iter().filter(telling).collect();
        let (n, of) = (explained(&refs), refs.len());
        if n * 2 > of && n > best {
            best = n;
            out = Some((s, store, convention(s, step_rows, (n, of))));
        }
    }
    out
}

/// Least squares `min |A·x − y|` by the normal equations (at most 3 unknowns here),
/// `None` when they are singular.
fn least_squares(a: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let n = a.first()?.len();
    if a.len() < n {
        return None;
    }
    let mut m = vec![vec![0.0; n + 1]; n];
    for (row, yi) in a.iter().zip(y) {
        for i in 0..n {
            for j in 0..n {
                m[i][j] += row[i] * row[j];
            }
            m[i][n] += row[i] * yi;
        }
    }
    // Gauss-Jordan with partial pivoting
    for c in 0..n {
        let p = (c..n).max_by(|i, j| m[*i][c].abs().total_cmp(&m[*j][c].abs()))?;
        if m[p][c].abs() < 1e-300 {
            return None;
        }
        m.swap(c, p);
        let pivot = m[c].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot[c];
                for (x, pv) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= f * pv;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_solves_an_exact_system() {
        // 2x + 3y = 8, x − y = −1, x + y = 3 → (1, 2)
        let a = vec![vec![2.0, 3.0], vec![1.0, -1.0], vec![1.0, 1.0]];
        let x = least_squares(&a, &[8.0, -1.0, 3.0]).unwrap();
        assert!(
            (x[0] - 1.0).abs() < 1e-12 && (x[1] - 2.0).abs() < 1e-12,
            "{x:?}"
        );
        assert!(least_squares(&[vec![1.0, 2.0], vec![2.0, 4.0]], &[1.0, 2.0]).is_none());
    }

    #[test]
    fn snapping_prefers_the_steps_rows_then_integers() {
        assert_eq!(snap_rows(24.1, 24), 24.0);
        assert_eq!(snap_rows(16.05, 24), 16.0);
        assert_eq!(snap_rows(16.5, 24), 16.5);
        assert_eq!(snap_int(3.99), 4.0);
    }
}
