//! The loss composition of one dump tree's step: aggregation mode, KL estimator, entropy
//! and KL coefficients — each taken from a flag, else from what the `loss/` files state
//! (`extra_info` config echoes), else inferred from all cells of the tree jointly, else the
//! preset's.
//!
//! Identifiability: a convention is one choice for the whole side, so it is inferred from
//! every cell at once and must explain most of them (more than half of the cells that
//! dump the terms it is judged on); the cells it does not explain are then judged under
//! it and called inconsistent. A fault in one cell cannot move the choice.
//!
//! - aggregation: the verl mode (`token-mean`, `seq-mean-token-sum`,
//!   `seq-mean-token-mean`, `seq-mean-token-sum-norm` with its horizon fitted) under which
//!   the recomputed `pg_loss`, `entropy_loss` and `kl_loss` terms (the KL term under the
//!   estimator that reproduces the most under that mode) equal the most dumped ones, by
//!   the majority rule dumpdiff uses too ([`crate::conventions::aggregation::settle`]);
//! - KL estimator: k1, k2 or verl's k3 (`low_var_kl`), the one that reproduces the dumped
//!   `kl_loss` in the most cells;
//! - coefficients: least squares over the cells' dumped `loss − pg_loss = −entropy_coeff ·
//!   entropy_loss + kl_coef · kl_loss` ([`crate::conventions::coefficients::infer`]); cells
//!   whose residual exceeds their f32 rounding are left out and the fit redone when they are
//!   a minority. A fitted value within [`DIFFER_SIGMAS`] standard errors of the preset's
//!   is the preset's. When the cells with terms cannot separate the two coefficients, the
//!   cells that dump only a total add their equations; when no cell dumps its terms at
//!   all, the mode and entropy coefficient that explain every total are taken (said to be
//!   underdetermined).
//!
//! The advantage epsilon of self-hosted trees (they dump rewards) is settled by
//! [`super::check_tree_inferred`], which runs this once per candidate.

mod convention;
mod fit;
mod prep;
mod scale;
pub(super) use scale::snap_int;

use super::cell::{Stated, Uncertainty};
use super::overrides::Overrides;
use super::Tolerance;
use crate::conventions::aggregation::settle;
use crate::conventions::coefficients::DIFFER_SIGMAS;
use crate::error::Result;
use crate::kernels::aggregate::AggMode;
use crate::kernels::kl::KlEstimator;
use crate::kernels::loss::{KlPlacement, KlTerm, LossConfig};
pub use convention::{mark_preset, Convention, Source};
use fit::fit;
use prep::{explains_agg, explains_term};

/// The step's conventions: the configuration to judge every cell with.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// `base` with the conventions applied.
    pub cfg: LossConfig,
    /// Each convention and its source.
    pub conventions: Vec<Convention>,
    /// Uncertainty of inferred coefficients for the cells the fit was judged on (their
    /// f32 rounding alone: a cell the fit misses cannot widen its own tolerance).
    pub uncertainty: Uncertainty,
    /// Uncertainty of inferred coefficients for a cell that dumps only its total (no
    /// equation of the fit): the fit's standard errors, which carry how badly the cells
    /// condition it (two cells for two coefficients fit exactly and say little).
    pub total_uncertainty: Uncertainty,
    /// The coefficients nothing settles: no flag, no `extra_info`, no fit over cells that
    /// dump their terms (an underdetermined fit does not settle them). A cell that dumps
    /// only its total cannot be judged on the terms they weigh.
    pub unstated: Unstated,
    /// The cells the conventions were settled from (one cannot fit a loss scale).
    pub cells: usize,
    /// A pg aggregation the cells cannot tell from the settled one ([`prep::pg_rival`]),
    /// with the pg terms each alone reproduces: a cell whose verdict the choice decides
    /// cannot be judged.
    pub agg_rival: Option<(AggMode, usize)>,
    /// The pg aggregation the cells' own dumped `pg_loss` shows against their own dumped
    /// per-token loss ([`prep::own_pg_mode`]), whatever weights that loss carries; `None`
    /// when fewer than two cells tell the modes apart or they disagree.
    pub own_pg_mode: Option<AggMode>,
}

/// Which loss-composition coefficients no evidence settles ([`Resolved::unstated`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unstated {
    /// `entropy_coeff`.
    pub entropy: bool,
    /// `kl_coef`.
    pub kl: bool,
}

/// A reduction of one cell's matrix under a mode: its value and the tolerance it
/// inherits (stored rounding and f32 arithmetic, [`super::terms`]).
#[derive(Debug, Clone, Copy, Default)]
struct Reduced {
    val: f64,
    tol: f64,
}

/// The three verl reductions every other verl mode derives from: `token-mean`,
/// `seq-mean-token-sum` (÷ h gives `seq-mean-token-sum-norm`), `seq-mean-token-mean`.
type Table = [Reduced; 3];

const BASE_MODES: [AggMode; 3] = [
    AggMode::TokenMean,
    AggMode::SeqMeanTokenSum,
    AggMode::SeqMeanTokenMean,
];

/// `mode`'s reduction from a cell's table (`t`: its width, the default horizon); `None`
/// for a mode that is not verl's.
fn at(table: &Table, mode: AggMode, t: usize) -> Option<Reduced> {
    Some(match mode {
        AggMode::TokenMean => table[0],
        AggMode::SeqMeanTokenSum => table[1],
        AggMode::SeqMeanTokenMean => table[2],
        AggMode::SeqMeanTokenSumNorm { horizon } => {
            let h = horizon.unwrap_or(t as f64);
            Reduced {
                val: table[1].val / h,
                tol: table[1].tol / h,
            }
        }
        _ => return None,
    })
}

/// Per cell, what inference needs, as scalars (a cell's matrices are not kept): the
/// recomputed pg, entropy and KL terms under each verl mode with their tolerances, and the
/// dumped terms and stated conventions.
#[derive(Clone)]
pub struct Prep {
    t: usize,
    /// Rows (sequences) of the cell: a scaled total's factor depends on them.
    rows: usize,
    pg_r: Table,
    ent_r: Option<Table>,
    kl_r: Vec<(KlEstimator, Table)>,
    stated: Stated,
    /// The dumped intermediates follow from the inputs: the pg term is evidence.
    pg_evidence: bool,
    pg: Option<f64>,
    ent: Option<f64>,
    kl_loss: Option<f64>,
    loss: Option<f64>,
    /// The dumped total of the cell's verdict file (`is_loss_debug/` or `loss/`).
    total: f64,
    /// The cell's own dumped per-token loss reduced under each base mode (weaver's
    /// `elementwise_loss`), with its f32 rounding.
    own_r: Option<Table>,
}

const KL_CANDIDATES: [KlEstimator; 3] = [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3Verl];

pub use prep::{inputs_with_advantages, prep, prep_each};

/// Whether the cell's dumped `kl_loss` is its KL term under estimator `est` and `mode`.
fn kl_reproduced(p: &Prep, est: KlEstimator, mode: AggMode, tol: &Tolerance) -> bool {
    p.kl_r.iter().any(|(e, k)| {
        *e == est
            && p.kl_loss
                .is_some_and(|d| at(k, mode, p.t).is_some_and(|r| tol.allows_with(d, r.val, r.tol)))
    })
}

/// How well the cells' dumped pg terms follow under `cfg`'s aggregation: the cells whose
/// `pg_loss` matches, and the sum of the squared relative misses (a tie-break).
pub fn pg_fit(preps: &[Prep], cfg: &LossConfig, tol: &Tolerance) -> (usize, f64) {
    let mut ok = 0;
    let mut miss = 0.0;
    for p in preps {
        if let (Some(d), Some(r)) = (p.pg, at(&p.pg_r, cfg.agg, p.t)) {
            ok += usize::from(tol.allows_with(d, r.val, r.tol));
            miss += ((d - r.val) / d.abs().max(1e-12)).powi(2);
        }
    }
    (ok, miss)
}

/// The horizon of `seq-mean-token-sum-norm` that fits the dumped entropy (else pg) terms
/// of every cell: `1/h = Σ sᵢdᵢ / Σ sᵢ²` with `sᵢ` the cell's seq-mean-token-sum and `dᵢ`
/// the dumped value; an integer (a response length) when within its relative uncertainty
/// of one: 10⁻³, or the rounding the recomputed sums inherit from their stored inputs
/// (`Σ tolᵢ|sᵢ| / Σ sᵢ²`: a bf16 entropy moves each sum by up to 2⁻⁸ of itself).
fn fit_horizon(preps: &[Prep]) -> Option<f64> {
    let (mut sd, mut ss, mut ts) = (0.0, 0.0, 0.0);
    for p in preps {
        let pair = match (p.ent, &p.ent_r) {
            (Some(d), Some(x)) => Some((x[1], d)),
            _ => p.pg.filter(|_| p.pg_evidence).map(|d| (p.pg_r[1], d)),
        };
        if let Some((s, d)) = pair {
            sd += s.val * d;
            ss += s.val * s.val;
            ts += s.tol * s.val.abs();
        }
    }
    if sd == 0.0 || ss == 0.0 {
        return None;
    }
    let h = ss / sd;
    if !(h.is_finite() && h > 0.0) {
        return None;
    }
    let r = h.round();
    let rel = (ts / ss).max(1e-3);
    Some(if r >= 1.0 && (h - r).abs() <= rel * h {
        r
    } else {
        h
    })
}

/// A cell that dumps only its total as an equation for the coefficient fit: its dumped
/// total with its pg, entropy and KL terms recomputed under `cfg` (`None` without an
/// entropy, or without the KL term `cfg` adds).
fn as_total_cell(p: &Prep, cfg: &LossConfig) -> Option<Prep> {
    let pg = at(&p.pg_r, cfg.agg, p.t)?.val;
    let ent = at(p.ent_r.as_ref()?, cfg.agg, p.t)?.val;
    let kl = match &cfg.kl {
        Some(k) => {
            let table = p.kl_r.iter().find(|(e, _)| *e == k.estimator)?.1;
            Some(at(&table, cfg.agg, p.t)?.val)
        }
        None => None,
    };
    Some(Prep {
        t: p.t,
        rows: p.rows,
        pg_r: p.pg_r,
        ent_r: p.ent_r,
        kl_r: Vec::new(),
        stated: Stated::default(),
        pg_evidence: false,
        pg: Some(pg),
        ent: Some(ent),
        kl_loss: kl,
        loss: Some(p.total),
        total: p.total,
        own_r: None,
    })
}

/// The conventions record's name for a KL term the loss holds but no file dumps.
pub const KL_TERM: &str = "kl_term";

const TOTALS_NOTE: &str = "underdetermined: no cell dumps its loss terms; the mode and \
     coefficient that explain every dumped total";

/// For cells that dump only their total loss: the verl mode under which one entropy
/// coefficient ≥ 0 (the stated or given one, else the least-squares one) explains every
/// total, the preset's mode first; `(mode, fitted coefficient, cells)`.
fn from_totals(
    preps: &[Prep],
    base: &LossConfig,
    cells: &[Prep],
    given: &Overrides,
    tol: &Tolerance,
) -> Option<(AggMode, Option<f64>, usize)> {
    let known = if given.entropy_coeff.is_some() {
        Some(base.entropy_coeff)
    } else {
        agreed(cells.iter().map(|c| c.stated.entropy_coeff))
    };
    let mut modes = vec![
        AggMode::TokenMean,
        AggMode::SeqMeanTokenSum,
        AggMode::SeqMeanTokenMean,
    ];
    modes.sort_by_key(|m| *m != base.agg);
    let u = 2f64.powi(-24);
    for m in modes {
        let terms: Vec<(f64, Reduced, Reduced)> = preps
            .iter()
            .filter_map(|p| {
                Some((
                    p.total,
                    at(&p.pg_r, m, p.t)?,
                    at(p.ent_r.as_ref()?, m, p.t)?,
                ))
            })
            .collect();
        if terms.is_empty() || terms.len() != preps.len() {
            return None;
        }
        let ee: f64 = terms.iter().map(|(_, _, e)| e.val * e.val).sum();
        let e = match known {
            Some(e) => e,
            None if ee > 0.0 => {
                terms
                    .iter()
                    .map(|(l, pg, e)| (pg.val - l) * e.val)
                    .sum::<f64>()
                    / ee
            }
            None => 0.0,
        };
        let all = terms.iter().all(|(l, pg, ent)| {
            let r = pg.val - e * ent.val;
            tol.allows_with(*l, r, pg.tol + e.abs() * ent.tol + 4.0 * u * r.abs())
        });
        if all && e >= 0.0 {
            return Some((m, known.is_none().then_some(e), terms.len()));
        }
    }
    None
}

/// The value every cell that states it agrees on (`None`: no cell states it or they
/// disagree).
fn agreed<T: PartialEq + Clone>(vals: impl Iterator<Item = Option<T>>) -> Option<T> {
    let mut out: Option<T> = None;
    for v in vals.flatten() {
        match &out {
            None => out = Some(v),
            Some(o) if *o == v => {}
            Some(_) => return None,
        }
    }
    out
}

/// Settle the step's conventions from `cells` (every cell of the tree's step), flags in
/// `given` first (see the module doc).
///
/// Errors: the kernels refuse a cell's inputs (file named).
pub fn resolve(
    preps: &[Prep],
    base: &LossConfig,
    given: &Overrides,
    tol: &Tolerance,
) -> Result<Resolved> {
    let cells = preps;
    let mut cfg = base.clone();
    let mut conventions = Vec::new();
    let mut unc = Uncertainty::default();
    let mut total_unc = Uncertainty::default();

    // aggregation
    let stated_agg = agreed(cells.iter().map(|c| c.stated.agg.clone()));
    let stated_scale = agreed(cells.iter().map(|c| c.stated.scale));
    let with_horizon = |m: AggMode, h: Option<f64>| match m {
        AggMode::SeqMeanTokenSumNorm { horizon: None } => {
            AggMode::SeqMeanTokenSumNorm { horizon: h }
        }
        m => m,
    };
    let mut totals_ec: Option<f64> = None;
    let informative = preps
        .iter()
        .filter(|p| explains_agg(p, AggMode::TokenMean, tol).1 > 0)
        .count();
    let terms_total: usize = preps
        .iter()
        .map(|p| explains_agg(p, AggMode::TokenMean, tol).1)
        .sum();
    // cells whose every dumped term the mode reproduces
    let count = |m: AggMode| {
        preps
            .iter()
            .filter(|p| {
                let (h, a) = explains_agg(p, m, tol);
                a > 0 && h == a
            })
            .count()
    };
    // the KL terms count too: a cell that dumps `kl_loss` and its reference log-probs
    // shows the mode under the side's one estimator (stated or flagged, else the one that
    // reproduces the most of them under that mode) — on a step whose pg and entropy terms
    // every mode reproduces (zero advantages, rows of one length) they decide it
    let stated_kl = agreed(cells.iter().map(|c| c.stated.kl_type.clone()))
        .as_deref()
        .and_then(KlEstimator::parse);
    let kl_fixed = if given.kl.is_some() || given.preset_fixes_composition {
        Some(base.kl.as_ref().map(|k| k.estimator))
    } else {
        stated_kl.map(Some)
    };
    // the cells that dump a KL term and the reference log-probs it is recomputed from
    let kl_cells: Vec<&Prep> = preps
        .iter()
        .filter(|p| p.kl_loss.is_some() && !p.kl_r.is_empty())
        .collect();
    let kl_terms = |m: AggMode| -> usize {
        let hits = |est: KlEstimator| {
            kl_cells
                .iter()
                .filter(|p| kl_reproduced(p, est, m, tol))
                .count()
        };
        match kl_fixed {
            Some(Some(e)) => hits(e),
            Some(None) => 0,
            None => KL_CANDIDATES.iter().map(|e| hits(*e)).max().unwrap_or(0),
        }
    };
    let kl_total = if kl_fixed == Some(None) {
        0
    } else {
        kl_cells.len()
    };
    // terms (pg, entropy, KL of each cell) the mode reproduces
    let count_terms = |m: AggMode| -> usize {
        preps
            .iter()
            .map(|p| explains_agg(p, m, tol).0)
            .sum::<usize>()
            + kl_terms(m)
    };
    let mut split_entropy: Option<AggMode> = None;
    let mut agg_rival = None;
    if given.agg.is_some() || given.preset_fixes_composition {
        cfg.agg = with_horizon(cfg.agg, stated_scale);
        conventions.push(Convention::new("agg", cfg.agg.name(), None, Source::Flag));
    } else if let Some(m) = stated_agg.as_deref().and_then(AggMode::parse) {
        let dumped = with_horizon(m, stated_scale.or_else(|| fit_horizon(preps)));
        cfg.agg = dumped;
        let mut c = match prep::echoed_gives_way(preps, dumped, tol) {
            Some((alt, why)) => {
                cfg.agg = alt;
                Convention::new(
                    "agg",
                    format!("{} ({why})", alt.name()),
                    None,
                    Source::Inferred,
                )
            }
            None => Convention::new("agg", dumped.name(), None, Source::Dumped),
        };
        c.explained = Some(count(cfg.agg));
        c.cells = Some(informative);
        conventions.push(c);
    } else if informative > 0 {
        let mut candidates = vec![
            AggMode::TokenMean,
            AggMode::SeqMeanTokenSum,
            AggMode::SeqMeanTokenMean,
        ];
        if let Some(h) = stated_scale.or_else(|| fit_horizon(preps)) {
            candidates.push(AggMode::SeqMeanTokenSumNorm { horizon: Some(h) });
        }
        // the preset's mode first: it wins ties
        candidates.sort_by_key(|m| *m != base.agg);
        let scored: Vec<(AggMode, usize)> =
            candidates.iter().map(|m| (*m, count_terms(*m))).collect();
        // the rule both tools share (`conventions::aggregation::settle`): most of the
        // dumped terms over every cell, or half of them and more than any other mode (a
        // fault in one cell's pg term leaves its entropy term); else the preset's
        // the pg and entropy terms may follow two modes: NexRL's actor reduces the pg
        // term with loss_agg_mode but the entropy with masked_mean (token-mean) whatever
        // the mode (nexrl/train_service_backend/fsdp_worker/fsdp_actor.py, update_policy,
        // nex-agi/NexRL@6860191); when no one mode settles the terms jointly, each term
        // settles its own
        let split = |entropy: bool| -> Option<AggMode> {
            let (scored, total) = prep::term_scores(preps, &candidates, tol, entropy);
            settle(&scored, total).map(|s| s.mode)
        };
        // a joint mode gives way to a split one that reproduces more terms (a mere tie)
        let joint = settle(&scored, terms_total + kl_total).filter(|s| {
            !matches!((split(false), split(true)), (Some(pg), Some(e))
                if e != pg && prep::hits(preps, (pg, e), tol) > prep::hits(preps, (s.mode, s.mode), tol))
        });
        let mut c = match joint {
            Some(s) => {
                cfg.agg = s.mode;
                Convention::new("agg", s.mode.name(), None, Source::Inferred)
            }
            None => match (split(false), split(true)) {
                (Some(pg), ent) if ent.is_some_and(|e| e != pg) => {
                    cfg.agg = pg;
                    split_entropy = ent;
                    Convention::new("agg", pg.name(), None, Source::Inferred)
                }
                _ => Convention::new("agg", cfg.agg.name(), None, Source::Preset),
            },
        };
        if c.source == Source::Inferred {
            // (a rival no pg or entropy term tells apart may still be told by the KL terms)
            agg_rival = prep::pg_rival(preps, cfg.agg, &candidates, tol)
                .filter(|(m, n)| *n > 0 || kl_terms(*m) == kl_terms(cfg.agg));
            if let Some((m, _)) = agg_rival.filter(|(_, n)| *n > 0) {
                c.value = format!("{} (or {}: the pg terms cannot tell)", c.value, m.name());
            }
        }
        c.explained = Some(count(cfg.agg));
        c.cells = Some(informative);
        conventions.push(c);
    } else if let Some((m, e, n)) = from_totals(preps, base, cells, given, tol) {
        // no cell dumps its terms, only totals: the mode (and entropy coefficient) that
        // explains every total, underdetermined
        cfg.agg = m;
        totals_ec = e;
        let mut c = Convention::new("agg", m.name(), None, Source::Inferred);
        c.explained = Some(n);
        c.cells = Some(preps.len());
        c.note = Some(TOTALS_NOTE.into());
        conventions.push(c);
    }
    if (cfg.agg != base.agg || given.agg.is_some()) && cfg.agg.is_verl() {
        // verl aggregates every term of the loss with the one loss_agg_mode
        cfg.entropy_agg = cfg.agg;
    }
    // the entropy terms by themselves: a mode that reproduces most of them, other than
    // the one the check would use, is NexRL's masked_mean beside another pg mode
    if split_entropy.is_none() && given.agg.is_none() && !given.preset_fixes_composition {
        split_entropy = prep::entropy_mode(preps, cfg.entropy_agg, tol);
    }
    if let Some(e) = split_entropy {
        cfg.entropy_agg = e;
        let mut c = Convention::new("entropy_agg", e.name(), None, Source::Inferred);
        c.explained = Some(preps.iter().map(|p| explains_term(p, e, tol, true).0).sum());
        c.cells = Some(informative);
        conventions.push(c);
    }

    // KL estimator: only when the cells dump a KL term and the reference log-probs
    let stated_kl_coef = agreed(cells.iter().map(|c| c.stated.kl_coef));
    let kl_explains = |est: KlEstimator| {
        kl_cells
            .iter()
            .filter(|p| kl_reproduced(p, est, cfg.agg, tol))
            .count()
    };
    if given.kl.is_some() || given.preset_fixes_composition {
        if let Some(k) = &cfg.kl {
            conventions.push(Convention::new(
                "kl_estimator",
                format!("{:?}", k.estimator),
                None,
                Source::Flag,
            ));
        }
    } else if !kl_cells.is_empty() {
        let (est, source) = match stated_kl {
            Some(e) => (e, Source::Dumped),
            None => {
                let best = KL_CANDIDATES.iter().map(|e| (*e, kl_explains(*e))).fold(
                    None::<(KlEstimator, usize)>,
                    |acc, x| match acc {
                        Some(a) if a.1 >= x.1 => Some(a),
                        _ => Some(x),
                    },
                );
                match best {
                    Some((e, _)) => (e, Source::Inferred),
                    None => (KlEstimator::K1, Source::Preset),
                }
            }
        };
        cfg.kl = Some(KlTerm {
            estimator: est,
            // a flag's coefficient, else the dump's (the estimator is settled here, the
            // coefficient below)
            coef: given.kl_coef.or(stated_kl_coef).unwrap_or(0.0),
            placement: KlPlacement::Separate,
        });
        let mut c = Convention::new("kl_estimator", format!("{est:?}"), None, source);
        c.explained = Some(kl_explains(est));
        c.cells = Some(kl_cells.len());
        conventions.push(c);
    }

    // a KL coefficient the dump echoes (NexRL's `kl_loss_coef` in `extra_info`) for a term
    // no cell dumps (no `kl_loss`, no reference log-probs): the loss holds
    // `kl_loss_coef · kl_loss` with `kl_loss` unknown — no total can be judged
    if let (None, None, Some(k)) = (&cfg.kl, given.kl_coef, stated_kl_coef) {
        if k != 0.0 && !given.preset_fixes_composition && cells.iter().all(|p| p.kl_loss.is_none())
        {
            conventions.push(Convention::new(
                KL_TERM,
                format!(
                    "kl_loss_coef {} echoed, no kl_loss or ref_log_probs dumped",
                    crate::fmt::num(k)
                ),
                Some(k),
                Source::Dumped,
            ));
        }
    }

    // coefficients
    let kl_active = cfg.kl.is_some();
    let ec_known = if given.entropy_coeff.is_some() {
        Some((cfg.entropy_coeff, Source::Flag))
    } else {
        agreed(cells.iter().map(|c| c.stated.entropy_coeff)).map(|v| (v, Source::Dumped))
    };
    let kc_known = if given.kl_coef.is_some() {
        cfg.kl.as_ref().map(|k| (k.coef, Source::Flag))
    } else {
        stated_kl_coef.map(|v| (v, Source::Dumped))
    };
    let with_terms = |p: &&Prep| {
        p.loss.is_some() && p.pg.is_some() && p.ent.is_some() && (!kl_active || p.kl_loss.is_some())
    };
    let mut ec = ec_known.map(|x| x.0);
    let mut kc = kc_known.map(|x| x.0);
    // the total's scale (verl's loss_scale_factor, `scale`), when the composition needs one
    let kc_in = if kl_active { kc } else { Some(0.0) };
    let scaled = scale::settle(preps, &with_terms, (ec, kc_in));
    if let Some((s, _, c)) = &scaled {
        cfg.loss_scale = *s;
        conventions.push(c.clone());
    }
    let preps: &[Prep] = scaled.as_ref().map_or(preps, |x| &x.1);
    let fit_cells: Vec<&Prep> = preps.iter().filter(with_terms).collect();
    let mut fit_info = None;
    let mut ec_known_total = false;
    if (ec.is_none() || (kl_active && kc.is_none())) && !fit_cells.is_empty() {
        let kc_in = if kl_active { kc } else { Some(0.0) };
        fit_info = fit(&fit_cells, ec, kc_in);
        if fit_info.as_ref().is_some_and(|f| f.underdetermined) {
            // the cells with terms cannot separate the coefficients: the cells that dump
            // only a total add their equations (terms recomputed under the settled mode)
            let totals: Vec<Prep> = preps
                .iter()
                .filter(|p| p.loss.is_none())
                .filter_map(|p| as_total_cell(p, &cfg))
                .collect();
            if !totals.is_empty() {
                let mut more: Vec<&Prep> = fit_cells.clone();
                more.extend(totals.iter());
                if let Some(f) = fit(&more, ec, kc_in).filter(|f| !f.underdetermined) {
                    fit_info = Some(f);
                }
            }
        }
        if let Some(f) = &fit_info {
            // the fitted values, and each snapped to the preset's when the fit cannot tell
            // them apart; a snap is kept only when the cells the fit explains are still
            // explained (with as many cells as unknowns the fit's own standard error says
            // nothing, and a snapped coefficient would leave the other one wrong)
            let fitted = (
                ec.unwrap_or(f.ec),
                if kl_active {
                    kc.or(f.kc.map(|x| x.0)).unwrap_or(0.0)
                } else {
                    0.0
                },
            );
            let snapped_ec = ec.unwrap_or(snap(f.ec, f.ec_se, base.entropy_coeff));
            let snapped_kc = match (kl_active, kc, f.kc) {
                (true, None, Some((v, se))) => {
                    snap(v, se, base.kl.as_ref().map_or(0.0, |k| k.coef))
                }
                _ => fitted.1,
            };
            let explained = |ek: (f64, f64)| {
                fit_cells
                    .iter()
                    .filter(|p| fit::cell_fits(p, ek, f.trusted_se))
                    .count()
            };
            let want = explained(fitted);
            let chosen = [
                (snapped_ec, snapped_kc),
                (snapped_ec, fitted.1),
                (fitted.0, snapped_kc),
            ]
            .into_iter()
            .find(|ek| explained(*ek) >= want)
            .unwrap_or(fitted);
            if ec.is_none() {
                ec = Some(chosen.0);
                unc.entropy_coeff = f.trusted_se.0;
                total_unc.entropy_coeff = f.trusted_se.0.max(f.ec_se);
            }
            if let (true, None, Some((_, se))) = (kl_active, kc, f.kc) {
                kc = Some(chosen.1);
                unc.kl_coef = f.trusted_se.1;
                total_unc.kl_coef = f.trusted_se.1.max(se);
            }
        }
    }
    if let (None, None, Some(e)) = (ec, &fit_info, totals_ec) {
        ec = Some(e);
        let mut c = Convention::new(
            "entropy_coeff",
            crate::fmt::num(e),
            Some(e),
            Source::Inferred,
        );
        c.note = Some(TOTALS_NOTE.into());
        c.explained = Some(preps.len());
        c.cells = Some(preps.len());
        conventions.push(c);
        ec_known_total = true;
    }
    let push_coef = |conventions: &mut Vec<Convention>,
                     name: &'static str,
                     v: Option<f64>,
                     known: Option<(f64, Source)>,
                     fitted: Option<(f64, f64)>| {
        let Some(v) = v else { return };
        let source = known.map_or(Source::Inferred, |k| k.1);
        let mut c = Convention::new(name, crate::fmt::num(v), Some(v), source);
        if let (Source::Inferred, Some((_, se)), Some(f)) = (source, fitted, &fit_info) {
            if f.underdetermined {
                c.note = Some(
                    "underdetermined: the cells cannot separate the entropy and KL coefficients; \
                     the better one-coefficient fit is used"
                        .into(),
                );
            } else if f.cells == 1 {
                c.note = Some(
                    "underdetermined: inferred from one cell's total alone, which any value fits"
                        .into(),
                );
            }
            c.std_err = Some(se);
            c.rms_residual = Some(f.rms);
            c.explained = Some(f.explained);
            c.cells = Some(f.cells);
        }
        conventions.push(c);
    };
    let determined = fit_info.as_ref().filter(|f| !f.underdetermined);
    let unstated = Unstated {
        entropy: !(given.preset_fixes_composition || ec_known.is_some() || determined.is_some()),
        kl: !(given.preset_fixes_composition
            || given.kl_coef.is_some()
            || kc_known.is_some()
            || stated_kl_coef.is_some()
            || (kl_active && determined.is_some_and(|f| f.kc.is_some()))),
    };
    let ec_fit = fit_info.as_ref().map(|f| (f.ec, f.ec_se));
    let kc_fit = fit_info.as_ref().and_then(|f| f.kc);
    if !ec_known_total {
        push_coef(&mut conventions, "entropy_coeff", ec, ec_known, ec_fit);
    }
    if kl_active {
        push_coef(&mut conventions, "kl_coef", kc, kc_known, kc_fit);
    }
    if let Some(e) = ec {
        cfg.entropy_coeff = e;
    }
    if let (Some(k), Some(term)) = (kc, cfg.kl.as_mut()) {
        term.coef = k;
    }
    mark_preset(&mut conventions, &cfg, base, false);
    Ok(Resolved {
        cfg,
        conventions,
        uncertainty: unc,
        total_uncertainty: total_unc,
        unstated,
        cells: preps.len(),
        agg_rival,
        own_pg_mode: prep::own_pg_mode(preps, tol),
    })
}

/// The advantage epsilon of a self-hosted tree's step as [`super::check_tree_inferred`]
/// settles it (the candidate under which most cells' pg terms follow), for a caller that
/// then judges cells one at a time ([`super::StepCheck::conventions`] does not search it).
/// `None` for a weaver tree (it dumps its advantages), an epsilon `given` by a flag, or a
/// step that cannot be checked.
pub fn self_hosted_adv_eps(
    tree: &crate::producers::layout::DumpTree,
    step: i64,
    cfg: &LossConfig,
    given: &Overrides,
    tol: &Tolerance,
) -> Option<f64> {
    if given.adv_eps.is_some() || super::layout_of(tree, step)? != super::Layout::SelfHosted {
        return None;
    }
    let checked = super::check_tree_inferred(tree, step, None, None, cfg, given, tol).ok()?;
    Some(checked.cfg.advantage.eps)
}

/// The preset's value when the fit cannot tell it apart from `v` (within
/// [`DIFFER_SIGMAS`] standard errors), else `v`.
fn snap(v: f64, se: f64, preset: f64) -> f64 {
    if (v - preset).abs() <= DIFFER_SIGMAS * se {
        preset
    } else {
        v
    }
}
