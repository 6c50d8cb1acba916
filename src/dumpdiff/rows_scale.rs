//! A side whose every pg term is 0 (no advantage signal) and whose totals verl scaled by
//! `loss_scale_factor = micro rows / ppo_mini_batch_size` (`dp_actor.py` `update_policy`,
//! volcengine/verl@cc62eca): its totals are `−entropy_coeff · rows/n · entropy_loss`, so
//! its own fit scatters (read as a term no file states) and only `entropy_coeff / n` is
//! told. A mini-batch holds at least the largest micro and at most the rank's rows, which
//! bounds `entropy_coeff`; the other side's coefficient outside that bound differs (seed
//! 7631: the weaver's 0.01 at rows / 8 against the self-hosted 0.02, which would need a
//! mini-batch of 16 rows in a rank of 8).

use std::collections::{BTreeMap, BTreeSet};

use super::conventions::{self, SideLosses};
use super::report::{Coefficient, Section};
use crate::model::step::ENTROPY_COEFF;

/// The rows of each (rank, micro) cell of the weaver, as its `is_loss` (else
/// `forward_data`) cell paired them: its paired rows and its rows without partner.
fn weaver_rows(sections: &[Section]) -> BTreeMap<(u32, u32), usize> {
    let mut out = BTreeMap::new();
    for name in ["forward_data", "is_loss"] {
        for c in sections
            .iter()
            .filter(|s| s.name == name)
            .flat_map(|s| &s.cells)
        {
            if let (Some(r), Some(m), Some(rows)) = (c.rank, c.micro, &c.rows) {
                out.insert((r, m), rows.pairs.len() + rows.only_other.len());
            }
        }
    }
    out
}

/// The weaver's `entropy_coeff` read through its rows-scaled totals when they differ from
/// the self-hosted one ([`read_scaled`]): its coefficient line takes the value with how it
/// was read, `differ` set, and the weaver is no longer said to hold a term no file states.
pub fn read(
    coefficients: &mut [Coefficient],
    unstated: &mut Option<(&'static str, String)>,
    (a, b): (&SideLosses, &SideLosses),
    sections: &[Section],
    overrides: &BTreeMap<String, f64>,
) {
    if overrides.contains_key(ENTROPY_COEFF) {
        return;
    }
    let Some((value, how)) = read_scaled(b, a, &weaver_rows(sections)) else {
        return;
    };
    for c in coefficients.iter_mut().filter(|c| c.name == ENTROPY_COEFF) {
        if c.weaver.is_none() && c.self_hosted.is_some() {
            (c.weaver, c.weaver_from, c.differ) = (Some(value), Some(how.clone()), true);
            if unstated.as_ref().is_some_and(|u| u.0 == "weaver") {
                *unstated = None;
            }
        }
    }
}

/// `(entropy_coeff, how)` of `side` (nothing echoed, no KL term, every pg term 0, at least
/// two cells of differing rows, `rows` giving each cell's) when its totals are
/// `−q · rows · entropy_loss` with one `q` on every cell (within 10⁻⁴) and `other`'s own
/// coefficient `c` (echoed, or fitted over two cells or more) needs a mini-batch
/// `n = c / q` of more rows than a rank holds: the value at one mini-batch of the rank's
/// rows (any smaller mini-batch gives less), else `None`.
fn read_scaled(
    side: &SideLosses,
    other: &SideLosses,
    rows: &BTreeMap<(u32, u32), usize>,
) -> Option<(f64, String)> {
    let t = &side.terms;
    if t.len() < 2 || t.len() != side.keys.len() || side.echoed.contains_key(ENTROPY_COEFF) {
        return None;
    }
    let mut q = Vec::new();
    let mut per_rank: BTreeMap<u32, usize> = BTreeMap::new();
    for (c, (r, m)) in t.iter().zip(&side.keys) {
        let n = *rows.get(&(*r, (*m)?))?;
        let pg_free = c.pg_loss.abs() <= 1e-7 * c.loss.abs().max(1e-30);
        if c.kl_loss.is_some() || !pg_free || n == 0 || c.entropy_loss <= 0.0 {
            return None;
        }
        q.push((c.loss / (-c.entropy_loss * n as f64), n));
        *per_rank.entry(*r).or_default() += n;
    }
    let q0 = q[0].0;
    let sizes: BTreeSet<usize> = q.iter().map(|x| x.1).collect();
    if q0 <= 0.0 || sizes.len() < 2 || q.iter().any(|x| ((x.0 - q0) / q0).abs() > 1e-4) {
        return None;
    }
    let c = conventions::value(ENTROPY_COEFF, other, &BTreeMap::new())?;
    let fitted_to_one = !other.echoed.contains_key(ENTROPY_COEFF) && other.terms.len() < 2;
    if c <= 0.0 || fitted_to_one {
        return None;
    }
    let (largest, rank_rows) = (*sizes.last()?, *per_rank.values().min()?);
    let n = c / q0;
    if n <= rank_rows as f64 * (1.0 + 1e-3) {
        return None;
    }
    let value = q0 * rank_rows as f64;
    let num = crate::fmt::num;
    let how = format!(
        "inferred with the loss scale micro rows / {rank_rows} (verl's loss_scale_factor, one \
         mini-batch of the rank's rows): every pg term is 0, so the totals are \
         −entropy_coeff·rows/n·entropy_loss, entropy_coeff/n = {} on {} cells; the \
         other side's {} would need a mini-batch of {} rows, more than the rank's \
         {rank_rows} (a mini-batch of {largest} to {rank_rows} rows gives at most {})",
        num(q0),
        t.len(),
        num(c),
        num(n),
        num(value)
    );
    Some((value, how))
}
