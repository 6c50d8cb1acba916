//! The per-token loss conventions a side's own dumped values are matched against: the
//! plain importance-sampling loss, PPO's clipped surrogate under the clip ranges tried,
//! with verl's dual clip at its default or at the constant the data show.

use super::*;

/// How a side turns its ratio `r` and advantage `A` into its per-token loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum ElemLoss {
    /// The plain importance-sampling loss `−A·r` (NexRL's weaver `is_loss_debug`).
    Plain,
    /// PPO's clipped surrogate `max(−A·r, −A·clip(r, 1−lo, 1+hi))`, capped at `−A·c` for
    /// `A < 0` with dual clip (verl `compute_policy_loss_vanilla`, `core_algos.py`,
    /// volcengine/verl@cc62eca).
    Clipped { lo: f64, hi: f64, dual: Option<f64> },
}

impl ElemLoss {
    /// The per-token loss of ratio `r` and advantage `a` (f64; NaN stays NaN).
    pub(super) fn of(self, r: f64, a: f64) -> f64 {
        match self {
            ElemLoss::Plain => -r * a,
            ElemLoss::Clipped { lo, hi, dual } => {
                let l = (-a * r).max(-a * r.clamp(1.0 - lo, 1.0 + hi));
                match dual {
                    Some(c) if a < 0.0 => l.min(-a * c),
                    _ => l,
                }
            }
        }
    }

    /// How the derived per-token loss was computed, for its origin.
    pub(super) fn words(self) -> String {
        match self {
            ElemLoss::Plain => "−prob_ratio · advantages".to_string(),
            ElemLoss::Clipped { lo, hi, dual } => format!(
                "max(−A·r, −A·clip(r, 1−{lo}, 1+{hi})){} (PPO clip, as the sides' own \
                 dumped values compose their per-token loss)",
                dual.map_or(String::new(), |c| format!(", A<0 capped at −A·{c}"))
            ),
        }
    }
}

/// The per-token loss conventions tried, the plain loss first: PPO's clipped surrogate
/// under the clip range the reference loss file echoes and the customary ones (0.2/0.2,
/// DAPO's 0.2/0.28), each without and with dual clip 3 (verl's default `clip_ratio_c`)
/// and `dual` (a dual clip the data show, [`super::clip_fraction::dual_read`]).
pub(super) fn candidates(a_loss: Option<&Record>, dual: Option<f64>) -> Vec<ElemLoss> {
    let mut ranges = vec![clip_range(a_loss), (0.2, 0.2), (0.2, 0.28)];
    ranges.dedup();
    let mut duals = vec![None, Some(3.0)];
    if let Some(c) = dual.filter(|c| *c != 3.0) {
        duals.push(Some(c));
    }
    let mut out = vec![ElemLoss::Plain];
    for (lo, hi) in ranges {
        for &dual in &duals {
            out.push(ElemLoss::Clipped { lo, hi, dual });
        }
    }
    out
}

/// The dual clip constant of a convention, to try it beside the customary ones.
pub(super) fn dual_of(conv: ElemLoss) -> Option<f64> {
    match conv {
        ElemLoss::Clipped { dual, .. } => dual,
        ElemLoss::Plain => None,
    }
}

/// The valid positions of row `row` of a `[rows, width]` matrix: the non-zero ones of
/// `mask` (clipped to the width) when it has those rows, every position otherwise.
pub(super) fn valid_positions(
    mask: Option<&Mat>,
    rows: usize,
    width: usize,
    row: usize,
) -> Vec<usize> {
    match mask {
        Some(m) if m.rows == rows => m
            .nonzero(row)
            .iter()
            .flat_map(|v| v.start.min(width)..v.end.min(width))
            .collect(),
        _ => (0..width).collect(),
    }
}

/// The clip range of a loss file's `extra_info` (`clip_ratio`, `clip_ratio_low/high`,
/// `clip_eps`, `cliprange`), else PPO's customary 0.2 on both sides.
pub(super) fn clip_range(loss: Option<&Record>) -> (f64, f64) {
    let num = |k: &str| loss.and_then(|l| l.setting(k));
    let sym = ["clip_ratio", "clip_eps", "cliprange", "clip_range"]
        .iter()
        .find_map(|k| num(k))
        .unwrap_or(0.2);
    (
        num("clip_ratio_low").unwrap_or(sym),
        num("clip_ratio_high").unwrap_or(sym),
    )
}
