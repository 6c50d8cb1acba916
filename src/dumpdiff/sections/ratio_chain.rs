//! The reference side's importance-sampling chain, derived from its dumped inputs with
//! propagated tolerances.

use super::*;

/// The reference side's importance-sampling chain for one micro, derived from its dumped
/// inputs, with every element's propagated tolerance ([`crate::compare::propagate`]).
pub struct Chain {
    /// Batch index of each row (None where not found).
    pub idx: Vec<Option<usize>>,
    /// How the rows were located in the batch.
    pub how: String,
    /// `old_log_probs` sliced to this micro's rows.
    pub old: Option<Mat>,
    /// True when `old` is the micro's own `old_log_probs` file (not sliced from the batch).
    pub per_micro_old: bool,
    /// `exp(log_probs − old_log_probs)`.
    pub ratio: Option<Mat>,
    /// Allowed error of each ratio element: `r·(e^E − 1)`, `E` the inputs' tolerances.
    pub ratio_allowed: Option<Mat>,
    /// Advantages broadcast over the row (remote-api `prepared_trajectories`).
    pub adv: Option<Mat>,
    /// Where `adv` came from (see [`BatchInputs::advantages_from`]).
    pub adv_from: String,
    /// The valid elements, for the tolerances of masked means and clip fractions.
    pub stats: Option<ChainStats>,
    /// Per valid element what the aggregation modes and KL tolerances need.
    pub extra: ElemExtra,
    /// How the side's loss reduces its tokens (read from its loss file, or inferred by
    /// the caller; token-mean until then).
    pub agg: AggMode,
    /// The side's KL coefficient, when read or inferred (its loss's KL allowance).
    pub kl_coef: Option<f64>,
    /// Set when `ratio` and `ratio_allowed` hold only the valid positions (NaN elsewhere).
    pub(super) partial: Option<Derive>,
}

impl Chain {
    /// Let the pages of the whole-batch rows `old` reads in place go, once the cell is
    /// done with them (nothing to do for a copy or a per-micro file).
    pub fn release_old(&self) {
        if let (Some(o), false) = (&self.old, self.per_micro_old) {
            o.release_rows(0..o.rows);
        }
    }

    /// A chain of only its valid elements (token-mean, no KL coefficient): what the loss
    /// scalars' tolerances read, for tests.
    #[cfg(test)]
    pub(super) fn of_stats(stats: ChainStats) -> Chain {
        Chain {
            idx: vec![],
            how: String::new(),
            old: None,
            per_micro_old: false,
            ratio: None,
            ratio_allowed: None,
            adv: None,
            adv_from: String::new(),
            stats: Some(stats),
            extra: ElemExtra::default(),
            agg: AggMode::TokenMean,
            kl_coef: None,
            partial: None,
        }
    }
}

/// The other side's dumps a [`Chain`] borrows precisions and advantages from.
#[derive(Clone, Copy, Default)]
pub struct ChainPeer<'a> {
    /// The other side's `forward_data` (its log-prob precision).
    pub fwd: Option<&'a Tensors<'a>>,
    /// The other side's file holding its rows' token ids (`forward_data` or
    /// `batch_inputs`): they pair rows by content.
    pub ids: Option<&'a Tensors<'a>>,
    /// The other side's `is_loss_debug` (old_log_probs precision, advantages).
    pub is_loss: Option<&'a Tensors<'a>>,
}

/// Derive one micro's chain from the reference `forward_data`, its own `old_log_probs`
/// file when the side writes one per micro (`micro_old`), and the batch inputs.
/// The log-prob inputs' tolerances are those their own comparisons use (the coarser
/// precision of both sides), so a ratio is allowed what its inputs are allowed.
pub fn chain(
    policy: &TolerancePolicy,
    inputs: &BatchInputs,
    a_fwd: &Tensors<'_>,
    peer: ChainPeer<'_>,
    micro_old: Option<&Tensors<'_>>,
    (rank, micro): (u32, u32),
) -> Chain {
    let lp_a = a_fwd.mat(Field::LogProbs);
    let mask_a = a_fwd.mat(Field::ResponseMask);
    let na = lp_a.as_ref().map_or(0, |m| m.rows);
    let (idx, mut how) = batch_indices(inputs, a_fwd, rank, micro, na);
    // A per-micro `old_log_probs` file holds this micro's rows in its forward_data's
    // order; else the micro's rows are sliced from the whole-batch file.
    let own_old = micro_old
        .and_then(|t| t.mat(Field::OldLogProbs))
        .filter(|m| m.rows == na);
    let per_micro_old = own_old.is_some();
    if per_micro_old {
        how = "per-micro old_log_probs file, rows in forward_data order".into();
    }
    // Consecutive rows of the whole-batch file (the usual layout) are read where they
    // lie; others are copied.
    // the old_log_probs row of each micro row (its trajectory's, through NexRL's batch
    // order when the step's rows follow it)
    let old_idx: Vec<Option<usize>> = idx
        .iter()
        .map(|i| i.and_then(|i| inputs.old_row(i)))
        .collect();
    let window = || {
        let old = inputs.old_log_probs.as_ref()?;
        let first = (*old_idx.first()?)?;
        let consecutive = old_idx
            .iter()
            .enumerate()
            .all(|(k, i)| *i == Some(first + k));
        consecutive.then(|| old.row_window(first, na)).flatten()
    };
    let old = own_old.map(|m| (*m).clone()).or_else(window).or_else(|| {
        inputs.old_log_probs.as_ref().and_then(|old| {
            let mut data = Vec::with_capacity(na * old.width);
            let mut buf = Vec::new();
            for i in &old_idx {
                let r = old.chunk((*i)?, 0, old.width, &mut buf);
                if r.len() != old.width {
                    return None;
                }
                data.extend_from_slice(r);
            }
            // This micro's rows are copied: let their pages go.
            old.release_rows(old_idx.iter().flatten().copied());
            Some(Mat::new(
                vec![na, old.width],
                na,
                old.width,
                data,
                old.dtype,
            ))
        })
    });
    // rows of the reference realigned to the other side's layout: its old rows too
    let old = match (old, a_fwd.shifts()) {
        (Some(o), Some(sh)) => Some(o.shifted_left(&sh)),
        (o, _) => o,
    };
    let adv = inputs.advantages.as_ref().and_then(|adv| {
        let w = lp_a.as_ref()?.width;
        let mut data = Vec::with_capacity(na * w);
        for i in &idx {
            let v = *adv.get((*i)?)?;
            data.extend(std::iter::repeat_n(v, w));
        }
        Some(Mat::new(vec![na, w], na, w, data, DType::F64))
    });
    let (Some(lp), Some(o)) = (&lp_a, &old) else {
        return Chain {
            idx,
            how,
            old,
            per_micro_old,
            ratio: None,
            ratio_allowed: None,
            adv,
            adv_from: inputs.advantages_from.clone(),
            stats: None,
            extra: ElemExtra::default(),
            agg: AggMode::TokenMean,
            kl_coef: None,
            partial: None,
        };
    };
    let peer_prec =
        |v: Option<&Tensors<'_>>, field: Field| v.and_then(|v| v.mat(field)).map(|m| m.precision());
    let with_peer = |own: DType, other: Option<DType>| other.map_or(own, |p| coarser(own, p));
    let tol_lp = policy.resolve(
        "is_loss.log_probs",
        with_peer(
            lp.precision(),
            peer_prec(peer.fwd, Field::LogProbs)
                .or_else(|| peer_prec(peer.is_loss, Field::LogProbs)),
        ),
        false,
    );
    let tol_old = policy.resolve(
        "is_loss.old_log_probs",
        with_peer(o.precision(), peer_prec(peer.is_loss, Field::OldLogProbs)),
        false,
    );
    // The other side's inputs, rows paired by content.
    let peer_inputs = peer.is_loss.map(|b| {
        let b_lp = b.mat(Field::LogProbs);
        let b_old = b.mat(Field::OldLogProbs);
        let nb = b_lp.as_ref().or(b_old.as_ref()).map_or(0, |m| m.rows);
        let rows = pair_rows(a_fwd, peer.ids, na, nb);
        let mut row = vec![None; na];
        for &(ra, rb) in &rows.pairs {
            if let Some(slot) = row.get_mut(ra) {
                *slot = Some(rb);
            }
        }
        PeerInputs {
            lp: b_lp,
            old: b_old,
            ratio: b.mat(Field::ProbRatio),
            row,
        }
    });
    let derive = Derive {
        lp: lp.clone(),
        mask: mask_a.clone(),
        tol_lp,
        tol_old,
        peer: peer_inputs,
    };
    // The ratio where anything reads it (valid reference positions) when that already
    // shows it is f64 data; else everywhere, as its precision then needs every value.
    let first = derive.mask.is_some().then(|| derive.ratio(o, true));
    let (ratio, ratio_allowed, partial, delta) = match first {
        Some((r, e, true, d)) => (r, e, true, d),
        _ => {
            let (r, e, _, d) = derive.ratio(o, false);
            (r, e, false, d)
        }
    };
    // |A| per row: the remote-api advantages, else the other side's (paired by content);
    // beside it the row's signed advantage when the other side's row holds one value
    // (what the loss scalars' predicted difference needs; NaN otherwise).
    let mut row_adv = vec![f64::NAN; na];
    let abs_adv: Vec<Option<f64>> = match &adv {
        Some(a) => (0..na).map(|r| a.row(r).first().map(|v| v.abs())).collect(),
        None => {
            let b_adv = peer.is_loss.and_then(|v| v.mat(Field::Advantages));
            let nb = b_adv.as_ref().map_or(0, |m| m.rows);
            let rows = pair_rows(a_fwd, peer.ids, na, nb);
            let mut out = vec![None; na];
            if let Some(b) = &b_adv {
                for &(ra, rb) in &rows.pairs {
                    if let Some(slot) = out.get_mut(ra) {
                        let row = b.row(rb);
                        *slot = Some(row.iter().fold(0.0f64, |m, v| m.max(v.abs())));
                        if let Some(s) = row_adv.get_mut(ra) {
                            *s = one_value(&row);
                        }
                    }
                }
            }
            out
        }
    };
    let all = 0..lp.width;
    let valid = |r: usize| {
        mask_a
            .as_deref()
            .map_or(std::slice::from_ref(&all), |m| m.nonzero(r))
    };
    let n_valid = (0..abs_adv.len())
        .flat_map(|r| valid(r).iter().map(|v| v.len()))
        .sum();
    let mut runs = Vec::with_capacity(abs_adv.len());
    let mut counted = 0;
    // Per valid element, beside its run: its `logp − ref` (NaN when unknown) and signed
    // log-ratio difference; per row its count and the advantage its loss difference is
    // predicted from: what the aggregation modes and the KL and pg terms' tolerances need.
    let ref_lp = a_fwd.mat(Field::RefLogProbs).filter(|m| m.rows == na);
    let mut extra = ElemExtra {
        kl_delta: Vec::with_capacity(if ref_lp.is_some() { n_valid } else { 0 }),
        row_counts: Vec::with_capacity(abs_adv.len()),
        pred_advantage: Vec::with_capacity(abs_adv.len()),
        delta: Vec::new(),
    };
    for (r, &abs_advantage) in abs_adv.iter().enumerate() {
        let (ratio_r, allowed_r) = (ratio.row(r), ratio_allowed.row(r));
        let ref_r = ref_lp.as_ref().map(|m| m.row(r));
        let lp_r = ref_r.as_ref().map(|_| lp.row(r));
        let signed = adv.as_ref().and_then(|a| a.row(r).first().copied());
        let before = counted;
        // Each run of valid positions at once (the positions past the ratio's width
        // have no element); every vector gets the values the element-wise rule gives.
        let width = ratio_r.len().min(allowed_r.len());
        for span in clipped(valid(r), width) {
            // Without `ref_log_probs` (no row has one) the vector stays empty.
            if let (Some(l), Some(rf)) = (&lp_r, &ref_r) {
                extra
                    .kl_delta
                    .extend(span.clone().map(|p| match (l.get(p), rf.get(p)) {
                        (Some(l), Some(rf)) => l - rf,
                        _ => f64::NAN,
                    }))
            }
            // The run's elements are the ratio's own values there (its rows are
            // `ratio.width` apart in its row-major values).
            if !span.is_empty() {
                counted += span.len();
                runs.push(ElemRun {
                    start: r * ratio.width + span.start,
                    len: span.len(),
                    abs_advantage,
                });
            }
        }
        extra.row_counts.push(counted - before);
        extra.pred_advantage.push(signed.unwrap_or(row_adv[r]));
    }
    // Each element's signed difference lies at its run's offsets too (`delta` has the
    // ratio's layout).
    extra.delta = delta;
    // (Derived above, so both are owned f64 of one layout.)
    let stats = match (ratio.owned_values(), ratio_allowed.owned_values()) {
        (Some(r), Some(a)) if ratio.width == ratio_allowed.width => {
            Some(ChainStats::new(r, a, runs))
        }
        _ => None,
    };
    Chain {
        idx,
        how,
        old,
        per_micro_old,
        ratio: Some(ratio),
        ratio_allowed: Some(ratio_allowed),
        adv,
        adv_from: inputs.advantages_from.clone(),
        stats,
        extra,
        agg: AggMode::TokenMean,
        kl_coef: None,
        partial: partial.then_some(derive),
    }
}

/// Beside a chain's valid elements: each one's `logp − ref_log_probs` (same order) and
/// signed log-ratio difference (at its offset); per row, its count and its advantage.
#[derive(Debug, Clone, Default)]
pub struct ElemExtra {
    /// `logp − ref` per element, NaN where a row lacks a value; empty without
    /// `ref_log_probs` (then no KL allowance, as from all-NaN differences).
    pub kl_delta: Vec<f64>,
    /// Valid elements per row, in row order.
    pub row_counts: Vec<usize>,
    /// Signed advantage per row (beside `row_counts`) for the predicted loss difference:
    /// the remote-api one, else the other side's row when it holds one value (NaN
    /// otherwise). Kept per row, not per element: it is constant along a row.
    pub pred_advantage: Vec<f64>,
    /// Per position of the ratio's row-major layout (where the chain's runs index its
    /// elements), `(logp − logp') − (old − old')` against the other side's paired
    /// inputs: the signed log-ratio difference, NaN when an input is unpaired or differs
    /// beyond its tolerance, or when a side may have computed its loss from values finer
    /// than those it stored (then only the worst case is allowed).
    pub delta: Vec<f64>,
}

/// What inferring a chain's aggregation mode reads beside its valid elements (same
/// order): each one's signed advantage (NaN when unknown) and the side's dumped entropy
/// at the positions its row holds, with the entropy's unit roundoff (bf16 2⁻⁸, f32 2⁻²⁴).
/// Built only then ([`ModeInputs::of`]): a cell whose loss file names its mode never
/// needs them.
#[derive(Debug, Clone, Default)]
pub struct ModeInputs {
    /// Signed advantage per element (NaN when unknown).
    pub advantage: Vec<f64>,
    /// The side's dumped `entropy` per element (empty when not dumped).
    pub entropy: Vec<f64>,
    /// The unit roundoff of the entropy's stored precision.
    pub entropy_u: Option<f64>,
}

impl ModeInputs {
    /// `ch`'s, its entropy from `a_fwd`, the reference `forward_data` it was derived
    /// from: element for element those of the chain's runs.
    pub fn of(ch: &Chain, a_fwd: &Tensors<'_>) -> ModeInputs {
        let (Some(stats), Some(ratio)) = (&ch.stats, &ch.ratio) else {
            return ModeInputs::default();
        };
        let na = ch.extra.row_counts.len();
        let ent = a_fwd.mat(Field::Entropy).filter(|m| m.rows == na);
        let n = stats.count();
        let mut out = ModeInputs {
            advantage: Vec::with_capacity(n),
            entropy: Vec::with_capacity(if ent.is_some() { n } else { 0 }),
            entropy_u: ent
                .as_ref()
                .and_then(|m| crate::conventions::rounding::unit_roundoff(m.precision())),
        };
        // A run lies within one row: its offset says which, and where in it.
        let mut ent_row: Option<(usize, Vec<f64>)> = None;
        for p in stats.pieces(usize::MAX) {
            let (r, start) = (p.at / ratio.width, p.at % ratio.width);
            let n = p.ratio.len();
            let signed = ch.adv.as_ref().and_then(|a| a.row(r).first().copied());
            out.advantage
                .extend(std::iter::repeat_n(signed.unwrap_or(f64::NAN), n));
            if let Some(m) = &ent {
                if ent_row.as_ref().is_none_or(|(at, _)| *at != r) {
                    ent_row = Some((r, m.row(r).into_owned()));
                }
                if let Some((_, x)) = &ent_row {
                    // The positions of the run the row holds (a prefix: they ascend).
                    let held = start.min(x.len())..(start + n).min(x.len());
                    out.entropy.extend_from_slice(&x[held]);
                }
            }
        }
        out
    }
}

/// `runs` cut at `width` (the positions past a row's ratio have no element).
fn clipped(runs: &[Range<usize>], width: usize) -> impl Iterator<Item = Range<usize>> + '_ {
    runs.iter()
        .map(move |v| v.start.min(width)..v.end.min(width))
}

/// The signed log-ratio difference of one element, `(l − l') − (o − o')`, from each
/// input `(value, tolerance, other side's row)`; NaN when an input has no paired value
/// or differs beyond its tolerance (that input's finding: nothing is predicted from it).
fn signed_log_ratio_delta(
    (l, tl, peer_l): (f64, f64, Option<&[f64]>),
    (o, to, peer_o): (f64, f64, Option<&[f64]>),
    p: usize,
) -> f64 {
    let diff = |x: f64, tol: f64, peer: Option<&[f64]>| {
        let d = x - peer?.get(p)?;
        within(d, tol).then_some(d)
    };
    match (diff(l, tl, peer_l), diff(o, to, peer_o)) {
        (Some(dl), Some(dol)) => dl - dol,
        _ => f64::NAN,
    }
}

/// The one value of a row of advantages (zeros are padding unless the row is all zero),
/// NaN when its non-zero values differ.
fn one_value(row: &[f64]) -> f64 {
    let mut nz = row.iter().copied().filter(|v| *v != 0.0);
    let Some(first) = nz.next() else {
        return if row.iter().all(|v| *v == 0.0) {
            0.0
        } else {
            f64::NAN
        };
    };
    if first.is_finite() && nz.all(|v| v == first) {
        first
    } else {
        f64::NAN
    }
}

/// How a chain's ratio is derived, kept when it was computed at valid positions only, so
/// that a quantity whose precision needs every position can have them.
pub(super) struct Derive {
    lp: Rc<Mat>,
    mask: Option<Rc<Mat>>,
    tol_lp: Tolerance,
    tol_old: Tolerance,
    /// The other side's log-probs and old log-probs with, per reference row, its paired
    /// row: an input contributes what it actually differs from the other side's, capped
    /// at its tolerance (see [`Derive::ratio`]).
    peer: Option<PeerInputs>,
}

/// The other side's inputs of a chain, row-paired with the reference.
pub(super) struct PeerInputs {
    lp: Option<Rc<Mat>>,
    old: Option<Rc<Mat>>,
    /// The other side's dumped `prob_ratio`: where its log-probs are stored coarser
    /// than f32, it shows whether its loss was computed from the stored values.
    ratio: Option<Rc<Mat>>,
    /// Per reference row, the other side's row.
    row: Vec<Option<usize>>,
}

impl Derive {
    /// The positions of row `r` anything reads (the reference mask's non-zero ones, all
    /// without a mask), clipped to the width.
    pub(super) fn valid(&self, r: usize) -> Vec<Range<usize>> {
        let w = self.lp.width;
        match &self.mask {
            None => std::iter::once(0..w).collect(),
            Some(m) => m
                .nonzero(r)
                .iter()
                .filter(|v| v.start < w)
                .map(|v| v.start..v.end.min(w))
                .collect(),
        }
    }

    /// `exp(logp − old)` and its allowance `r·(e^E − 1)` as matrices of the log-probs'
    /// layout. With `valid_only`, only at valid positions (NaN elsewhere), and the third
    /// value says whether those already make it f64 data (its precision is then set);
    /// else everywhere (third value false).
    pub(super) fn ratio(&self, o: &Mat, valid_only: bool) -> (Mat, Mat, bool, Vec<f64>) {
        self.ratio_with(o, valid_only, true)
    }

    /// [`Derive::ratio`]; `fast: false` keeps every element on the general loop (the
    /// tests pin the fast loop to it bit for bit).
    pub(super) fn ratio_with(
        &self,
        o: &Mat,
        valid_only: bool,
        fast: bool,
    ) -> (Mat, Mat, bool, Vec<f64>) {
        let lp = &self.lp;
        let n = lp.rows * lp.width;
        let (mut ratio, mut allowed) = (vec![f64::NAN; n], vec![f64::NAN; n]);
        let mut delta = vec![f64::NAN; n];
        let mut scan = GridScan::new(DType::F64);
        let mut buf = Vec::new();
        // The other side's rows of each input, decoded into these when stored.
        let (mut buf_lp, mut buf_old, mut buf_ratio) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..lp.rows {
            let old_row = o.row(r);
            let peer = self.peer.as_ref();
            let (peer_lp, peer_old) = match peer {
                Some(p) => (
                    peer_row(p, r, &p.lp, &mut buf_lp),
                    peer_row(p, r, &p.old, &mut buf_old),
                ),
                None => (None, None),
            };
            // A signed difference is only known where both sides computed their loss
            // from the values they dumped: inputs stored in f32 or f64, or (the other
            // side) a dumped prob_ratio that its stored log-probs reproduce to f32.
            let fine =
                |m: Option<&Mat>| m.is_some_and(|m| matches!(m.dtype, DType::F32 | DType::F64));
            let own_fine = fine(Some(lp)) && fine(Some(o));
            let peer_fine = self
                .peer
                .as_ref()
                .is_some_and(|p| fine(p.lp.as_deref()) && fine(p.old.as_deref()));
            // Read only where it decides something: when the other side's inputs are
            // coarser than f32 (below, `peer_fine ||` never looks at it otherwise).
            let peer_ratio = match peer {
                Some(p) if !peer_fine => peer_row(p, r, &p.ratio, &mut buf_ratio),
                _ => None,
            };
            let ranges = if valid_only {
                self.valid(r)
            } else {
                std::iter::once(0..lp.width).collect()
            };
            let base = r * lp.width;
            for v in ranges {
                let x = lp.chunk(r, v.start, v.end, &mut buf);
                // The common case in one tight loop: both of the other side's input rows
                // and the old row cover the run, and no per-element check of the other
                // side's dumped ratio is needed. Same arithmetic as the loop below.
                let quick = match (peer_lp, peer_old) {
                    (Some(pl), Some(po)) if fast => {
                        let end = v.start + x.len();
                        let covered = pl.len() >= end && po.len() >= end && old_row.len() >= end;
                        covered.then(|| (&pl[v.start..end], &po[v.start..end]))
                    }
                    _ => None,
                };
                // (With a dumped ratio of coarse inputs to check, each element is checked
                // below: the quick loop caps every allowance by the other side's inputs.)
                if let (Some((pl, po)), true) =
                    (quick, peer_fine || (!own_fine && peer_ratio.is_none()))
                {
                    let old_r = &old_row[v.start..v.start + x.len()];
                    let at = base + v.start..base + v.start + x.len();
                    let (ratio_v, allowed_v) = (&mut ratio[at.clone()], &mut allowed[at.clone()]);
                    let run = QuickRun {
                        lp: x,
                        old: old_r,
                        peer_lp: pl,
                        peer_old: po,
                        tol_lp: &self.tol_lp,
                        tol_old: &self.tol_old,
                        own_fine,
                    };
                    run.fill(ratio_v, allowed_v, &mut delta[at]);
                    scan.feed(&ratio[base + v.start..base + v.end]);
                    continue;
                }
                for (p, &l) in v.clone().zip(x) {
                    let ol = old_row.get(p).copied().unwrap_or(f64::NAN);
                    let rt = (l - ol).exp();
                    ratio[base + p] = rt;
                    // Whether the other side's dumped ratio is what its stored inputs give
                    // (to f32), when it dumped one to check against.
                    let reproduced = match (peer_lp, peer_old, peer_ratio) {
                        (Some(pl), Some(po), Some(pr)) => match (pl.get(p), po.get(p), pr.get(p)) {
                            (Some(pl), Some(po), Some(pr)) => Some(
                                (pr - (pl - po).exp()).abs() <= 8.0 * 2f64.powi(-24) * pr.abs(),
                            ),
                            _ => None,
                        },
                        _ => None,
                    };
                    let computed_from_dump = peer_fine || reproduced == Some(true);
                    // An input's allowance is what it differs from the other side's only
                    // when that side computed from what it stored: one that computed its
                    // ratio from finer values than it dumped (f32 log-probs stored as
                    // bf16) differs from this side's by this side's whole rounding,
                    // whatever the stored inputs say.
                    let capped = peer_fine || reproduced != Some(false);
                    let own = |tol: f64, x: f64, peer: Option<&[f64]>| {
                        peer.and_then(|row| row.get(p))
                            .filter(|_| capped)
                            .map_or(tol, |y| own_difference(tol, x - y))
                    };
                    let (tl, to) = (self.tol_lp.allowed(l), self.tol_old.allowed(ol));
                    allowed[base + p] = propagate::ratio_allowed(
                        rt,
                        propagate::log_ratio_allowed(own(tl, l, peer_lp), own(to, ol, peer_old)),
                    );
                    delta[base + p] = if own_fine && computed_from_dump {
                        signed_log_ratio_delta((l, tl, peer_lp), (ol, to, peer_old), p)
                    } else {
                        f64::NAN
                    };
                }
                scan.feed(&ratio[base + v.start..base + v.end]);
            }
        }
        let decided = valid_only && scan.settled();
        let ratio = lp.with_data(ratio, DType::F64);
        let ratio = if decided {
            ratio.with_precision(DType::F64)
        } else {
            ratio
        };
        let allowed = ratio.with_data(allowed, DType::F64);
        (ratio, allowed, decided, delta)
    }

    /// `−ratio·A` at valid positions and its precision when those decide it (f64 data),
    /// else None.
    pub(super) fn loss_if_decided(&self, el: &Mat) -> Option<DType> {
        let mut scan = GridScan::new(DType::F64);
        for r in 0..el.rows {
            let row = el.row(r);
            for v in self.valid(r) {
                scan.feed(&row[v]);
            }
        }
        scan.settled().then_some(DType::F64)
    }
}

/// What an input differs from the other side's (`d`, signed), capped at its tolerance
/// `tol`: a difference beyond it is that input's finding and must not excuse the derived
/// values; an unknown (non-finite) difference counts as the whole tolerance. The general
/// loop and the quick one of [`Derive::ratio_with`] both use it.
#[inline(always)]
fn own_difference(tol: f64, d: f64) -> f64 {
    let d = d.abs();
    if d.is_finite() {
        d.min(tol)
    } else {
        tol
    }
}

/// Whether a signed input difference `d` is known and within its tolerance `tol`, so that
/// it enters the signed log-ratio difference ([`signed_log_ratio_delta`], and the quick
/// loop's). Non-short-circuit `&`: no branch in the vectorised loop.
#[inline(always)]
fn within(d: f64, tol: f64) -> bool {
    d.is_finite() & (d.abs() <= tol)
}

/// The other side's row paired with reference row `r` of the input `m` (borrowed, or
/// decoded into `buf`), when paired and present.
fn peer_row<'m>(
    p: &'m PeerInputs,
    r: usize,
    m: &'m Option<Rc<Mat>>,
    buf: &'m mut Vec<f64>,
) -> Option<&'m [f64]> {
    let rb = (*p.row.get(r)?)?;
    let m = m.as_ref().filter(|m| rb < m.rows)?;
    Some(m.chunk(rb, 0, m.width, buf))
}

/// One run of [`Derive::ratio_with`]'s common case: the other side's input rows and the
/// old row cover the run, and no per-element check of the other side's dumped ratio is
/// needed.
struct QuickRun<'r> {
    lp: &'r [f64],
    old: &'r [f64],
    peer_lp: &'r [f64],
    peer_old: &'r [f64],
    tol_lp: &'r Tolerance,
    tol_old: &'r Tolerance,
    /// Both of this side's inputs are stored in f32 or f64 (a signed difference is known).
    own_fine: bool,
}

impl QuickRun<'_> {
    /// `ratio`, `allowed` and `delta` of the run, each element with the arithmetic of the
    /// general loop. In two passes: first everything without a libm call (the log-ratio,
    /// its allowance `E` and the signed difference: branch-free, so it vectorises; AVX2
    /// where the CPU has it, the same IEEE operations), then `exp` and `expm1`.
    fn fill(&self, ratio: &mut [f64], allowed: &mut [f64], delta: &mut [f64]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked on the line above.
            unsafe { self.inputs_avx2(ratio, allowed, delta) };
            Self::exp_pass(ratio, allowed);
            return;
        }
        self.inputs(ratio, allowed, delta);
        Self::exp_pass(ratio, allowed);
    }

    /// [`QuickRun::inputs`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn inputs_avx2(&self, ratio: &mut [f64], allowed: &mut [f64], delta: &mut [f64]) {
        self.inputs(ratio, allowed, delta)
    }

    /// Into `ratio` the log-ratio `l − o`, into `allowed` its allowance `E` (each input's
    /// difference from the other side's, capped at its tolerance), into `delta` the signed
    /// difference `(l − l') − (o − o')` where both inputs are within tolerance.
    #[inline(always)]
    fn inputs(&self, ratio: &mut [f64], allowed: &mut [f64], delta: &mut [f64]) {
        let n = self.lp.len();
        let (lp, old) = (&self.lp[..n], &self.old[..n]);
        let (pl, po) = (&self.peer_lp[..n], &self.peer_old[..n]);
        let (ratio, allowed, delta) = (&mut ratio[..n], &mut allowed[..n], &mut delta[..n]);
        for k in 0..n {
            let (l, ol) = (lp[k], old[k]);
            let (tl, to) = (self.tol_lp.allowed(l), self.tol_old.allowed(ol));
            let (dl, dol) = (l - pl[k], ol - po[k]);
            ratio[k] = l - ol;
            allowed[k] =
                propagate::log_ratio_allowed(own_difference(tl, dl), own_difference(to, dol));
            delta[k] = if self.own_fine & within(dl, tl) & within(dol, to) {
                dl - dol
            } else {
                f64::NAN
            };
        }
    }

    /// `ratio = exp(log-ratio)` and `allowed = r·(e^E − 1)` in place: every `exp`, then
    /// every `exp_m1`, then the products
    /// ([`propagate::ratio_allowed`]'s arithmetic).
    fn exp_pass(ratio: &mut [f64], allowed: &mut [f64]) {
        let n = ratio.len().min(allowed.len());
        let (ratio, allowed) = (&mut ratio[..n], &mut allowed[..n]);
        ratio.iter_mut().for_each(|v| *v = v.exp());
        allowed.iter_mut().for_each(|v| *v = v.exp_m1());
        for (&r, e) in ratio.iter().zip(allowed.iter_mut()) {
            *e = propagate::ratio_allowed_from_exp_m1(r, *e);
        }
    }
}
