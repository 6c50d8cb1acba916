//! The `is_loss_debug`, `loss` and whole-tensor cells.

use super::elem_loss::clip_range;
use super::*;

/// Section 4: `is_loss_debug` intermediates, the self-hosted side sliced and derived;
/// rows pair through the token ids of `b_ids` (the weaver's forward_data or batch_inputs).
/// `memo` is `StatsMemo::new(Some(ch), a_loss)`, shared with the micro's [`loss_cell`]
/// (each of its aggregates is a pass over every valid element).
#[allow(clippy::too_many_arguments)]
pub fn is_loss_cell(
    policy: &TolerancePolicy,
    rank: u32,
    micro: u32,
    a_fwd: &Tensors<'_>,
    (a_loss, b_loss): (Option<&Record>, Option<&Record>),
    b_is: &Tensors<'_>,
    b_ids: Option<&Tensors<'_>>,
    ch: &Chain,
    memo: &StatsMemo<'_>,
) -> (Cell, Option<SequenceAlt>, Option<Weights>, Option<ClipBand>) {
    pub(super) const S: &str = "is_loss";
    let lp_a = a_fwd.mat(Field::LogProbs);
    let mask_a = a_fwd.mat(Field::ResponseMask);
    let lp_b = b_is.mat(Field::LogProbs);
    let mask_b = b_is.mat(Field::EffectiveMask);
    let na = lp_a.as_ref().map_or(0, |m| m.rows);
    let nb = lp_b.as_ref().map_or(0, |m| m.rows);
    let rows = pair_rows(a_fwd, b_ids, na, nb);
    let ctx = PairCtx {
        policy,
        section: S,
        rows: &rows,
        mask_a: mask_a.as_deref(),
        mask_b: mask_b.as_deref(),
        cell_precision: logprob_precision(lp_a.as_deref(), lp_b.as_deref()),
    };
    let mut out = Vec::new();
    let dumped_b = |k: &str| Origin::dumped("is_loss_debug", k);
    match (&mask_a, &mask_b) {
        (Some(x), Some(y)) => {
            let mut c = ctx.exact_rows(
                "effective_valid",
                x,
                y,
                Origin::dumped("forward_data", "response_mask"),
                dumped_b("effective_valid"),
            );
            // a loss mask reduced by verl's rejection sampling: named (issue 28)
            if c.verdict >= Verdict::Warn {
                if let Some(note) = super::tis::rejection_note(x, y, b_is, &rows) {
                    c.reason = format!("{}: {note}", c.reason);
                }
            }
            out.push(c)
        }
        _ => out.push(skipped(
            S,
            "effective_valid",
            "mask not dumped on both sides",
        )),
    }
    match (&lp_a, &lp_b) {
        (Some(x), Some(y)) => out.push(ctx.logprobs_memo(
            x,
            y,
            mask_b.as_ref(),
            &rows,
            Origin::dumped("forward_data", "log_probs"),
            dumped_b("log_probs"),
            &a_fwd.logprobs,
        )),
        _ => out.push(skipped(S, "log_probs", "not dumped on both sides")),
    }
    let rows_list: Vec<String> = ch
        .idx
        .iter()
        .map(|i| i.map_or("?".into(), |i| i.to_string()))
        .collect();
    let old_origin = if ch.per_micro_old {
        Origin::dumped("old_log_probs", "old_log_probs")
    } else {
        Origin::sliced(format!(
            "old_log_probs.old_log_probs rows [{}] ({})",
            rows_list.join(", "),
            ch.how
        ))
    };
    match (&ch.old, b_is.mat(Field::OldLogProbs)) {
        (Some(x), Some(y)) => out.push(ctx.masked(
            "old_log_probs",
            x,
            &y,
            old_origin,
            dumped_b("old_log_probs"),
            false,
            true,
        )),
        (None, _) => out.push(skipped(
            S,
            "old_log_probs",
            unplaced(
                ch,
                "self-hosted old_log_probs file missing or rows not found",
            ),
        )),
        (_, None) => out.push(skipped(S, "old_log_probs", "not dumped by weaver")),
    }
    match (&ch.adv, b_is.mat(Field::Advantages)) {
        (Some(x), Some(y)) => out.push(ctx.masked(
            "advantages",
            x,
            &y,
            Origin::derived(ch.adv_from.clone()),
            dumped_b("advantages"),
            false,
            false,
        )),
        (None, _) => out.push(skipped(
            S,
            "advantages",
            unplaced(
                ch,
                "self-hosted dumps no advantages and they could not be recomputed (no \
                 trajectory rewards/group ids, or --preset none); pass --remote-api-dir to \
                 take them from prepared_trajectories",
            ),
        )),
        (_, None) => out.push(skipped(S, "advantages", "not dumped by weaver")),
    }
    match (&ch.ratio, &ch.ratio_allowed, b_is.mat(Field::ProbRatio)) {
        (Some(x), Some(e), Some(y)) => out.push(ctx.propagated(
            "prob_ratio",
            x,
            &y,
            Origin::derived("exp(forward_data.log_probs − old_log_probs)"),
            dumped_b("prob_ratio"),
            e,
        )),
        _ => out.push(skipped(S, "prob_ratio", "inputs to derive it are missing")),
    }
    // The per-token loss as the other side's own dumped values compose it, unless this
    // side's own pg_loss follows another (then the comparison finds the difference).
    let fit = elem_convention(b_is, a_loss);
    // a weaver that dumps its rollout log-probs shows its weights: applied to this side's
    // derived per-token loss, and named for the loss totals; else "unseen"
    let tis = tis_fit(b_is, a_loss, fit.reproduced);
    let conv = tis.as_ref().map_or(fit.conv, |t| t.conv);
    let b_pg = b_loss
        .and_then(|l| l.number(Field::PgLoss))
        .map(|n| n.value);
    let agg = super::tis::agg_note(b_is, ch, (mask_a.as_deref(), conv), (a_loss, b_pg));
    let weights = match &tis {
        Some(t) => Some(Weights::Seen(t.why() + &agg)),
        None => fit
            .unseen()
            .filter(|_| !b_is.record().has(Field::RolloutLogProbs))
            .map(|w| Weights::Unseen(w + &agg)),
    };
    let pg_a = a_loss.and_then(|l| l.number(Field::PgLoss));
    let other_conv = conv;
    let mut blurred = None;
    let conv = match (&ch.ratio, &ch.adv, pg_a) {
        (Some(r), Some(a), Some(pg)) if conv != ElemLoss::Plain => {
            let own = (
                out.as_slice(),
                rows.only_a.is_empty() && rows.only_b.is_empty(),
            );
            match own_convention(conv, r, a, mask_a.as_deref(), ch.agg, pg.value, a_loss) {
                c if c != conv => {
                    // the band tokens may move the loss less than the log-probs' rounding
                    // (seed 7543): the f32 reading says so (`clip_bound_blurred`)
                    let c = confirmed(conv, c, b_is, own, ch.agg, pg.value);
                    blurred = own_convention_dumped(conv, b_is, own, ch.agg, pg.value, a_loss)
                        .filter(|b| b.0 == c);
                    c
                }
                _ => {
                    blurred = own_convention_dumped(conv, b_is, own, ch.agg, pg.value, a_loss);
                    blurred.as_ref().map_or(conv, |b| b.0)
                }
            }
        }
        _ => conv,
    };
    let el = match (&ch.ratio, &ch.ratio_allowed, &ch.adv) {
        (Some(r), Some(e), Some(a)) => {
            let av = a.values();
            let times_adv = |r: &[f64]| {
                r.iter()
                    .zip(av.iter())
                    .map(|(r, a)| conv.of(*r, *a))
                    .collect()
            };
            let mut el = r.with_data(times_adv(&r.values()), r.dtype);
            if let (Some(derive), Some(old)) = (&ch.partial, &ch.old) {
                // The ratio is known at valid positions only: enough for the loss's
                // precision when those are f64 data, else derive it everywhere.
                el = match derive.loss_if_decided(&el) {
                    Some(p) => el.with_precision(p),
                    None => {
                        let (full, _, _, _) = derive.ratio(old, false);
                        r.with_data(times_adv(&full.values()), r.dtype)
                    }
                };
            }
            let ev = e.values();
            let allowed = e.with_data(
                ev.iter()
                    .zip(av.iter())
                    .map(|(e, a)| propagate::product_allowed(*e, *a))
                    .collect(),
                e.dtype,
            );
            Some(match &tis {
                Some(t) => t.apply(&rows, &el, &allowed),
                None => (el, allowed),
            })
        }
        _ => None,
    };
    match (&el, b_is.mat(Field::ElementwiseLoss)) {
        (Some((x, e)), Some(y)) => out.push(ctx.propagated(
            "elementwise_loss",
            x,
            &y,
            Origin::derived(conv.words() + &tis.as_ref().map_or(String::new(), Tis::words)),
            dumped_b("elementwise_loss"),
            e,
        )),
        _ => out.push(skipped(
            S,
            "elementwise_loss",
            "advantages needed to derive it (see advantages)",
        )),
    }
    name_clip_bound(&mut out, other_conv, conv);
    let band = clip_band(b_is, conv, other_conv, ch.agg);
    clip_bound_blurred(&mut out, blurred.as_ref().map(|b| b.1.as_str()));
    match (a_loss.filter(|l| l.has(Field::Loss)), b_is.record()) {
        (Some(x), y) if y.has(Field::Loss) => out.extend(ctx.scalar_predicted(
            "loss",
            (x.number(Field::Loss), y.number(Field::Loss)),
            (Origin::dumped("loss", "loss"), dumped_b("loss")),
            true,
            (loss_propagation("loss", memo), loss_center("loss", memo)),
        )),
        _ => out.push(skipped(S, "loss", "not dumped on both sides")),
    }
    super::shift::note_shifted_old(&mut out, b_is);
    if !rows.only_a.is_empty() || !rows.only_b.is_empty() {
        out.push(row_coverage_fail(S, &rows));
    }
    unattributed(
        &mut out,
        &["is_loss.effective_valid"],
        "the loss mask differs: tokens one side counts in its loss and the other does not",
    );
    if weights.is_none() {
        super::tis::agg_beside_mask(&mut out, &agg);
        super::tis::agg_in_total(&mut out, &agg);
    }
    let unseen_agg = super::tis::agg_unseen(b_is);
    if let Some(w) = &weights {
        if let Weights::Unseen(why) = w {
            cannot_judge(&mut out, &["is_loss.elementwise_loss"], why);
        }
        w.apply_to_totals(&mut out, &["is_loss.loss"]);
    }
    // GSPO: the other side's ratio constant along its rows; the step decides
    // ([`settle_ratio_level`]), this cell offers its sequence-level comparisons.
    let alt = sequence_alt(
        &ctx,
        b_is,
        ch,
        (mask_a.as_deref(), mask_b.as_deref()),
        a_loss,
        conv,
        tis.as_ref(),
    )
    .map(|mut a| {
        super::shift::note_shifted_old(&mut a.comparisons, b_is);
        if let Some(Weights::Unseen(why)) = &weights {
            cannot_judge(&mut a.comparisons, &["is_loss.elementwise_loss"], why);
        }
        a
    });
    super::tis::note_agg_unseen(&mut out, unseen_agg.as_deref());
    (
        cell(Some(rank), Some(micro), Some(row_summary(&rows)), out),
        alt,
        weights,
        band,
    )
}

/// The chain aggregates the loss scalars' tolerances need, each computed once per cell
/// and loss file however many keys ask (each is a pass over every valid element).
pub struct StatsMemo<'a> {
    stats: Option<&'a ChainStats>,
    chain: Option<&'a Chain>,
    loss: Option<&'a Record>,
    mean_loss: OnceCell<Option<f64>>,
    mean_ratio: OnceCell<Option<f64>>,
    flips: OnceCell<(f64, f64, usize)>,
    predicted: OnceCell<Option<Predicted>>,
}

impl<'a> StatsMemo<'a> {
    /// The memo of `chain`'s aggregates for the side's loss file `loss`.
    pub fn new(chain: Option<&'a Chain>, loss: Option<&'a Record>) -> Self {
        StatsMemo {
            stats: chain.and_then(|c| c.stats.as_ref()),
            chain,
            loss,
            mean_loss: OnceCell::new(),
            mean_ratio: OnceCell::new(),
            flips: OnceCell::new(),
            predicted: OnceCell::new(),
        }
    }

    /// The chain's aggregation mode (token-mean unless read or inferred otherwise).
    fn mode(&self) -> AggMode {
        self.chain.map_or(AggMode::TokenMean, |c| c.agg)
    }

    /// The pg term's allowance in the chain's mode: `|A|·r·(e^E−1)` per element, reduced.
    fn pg_allowed(&self) -> Option<f64> {
        let stats = self.stats?;
        if self.mode() == AggMode::TokenMean {
            return *self.mean_loss.get_or_init(|| stats.mean_loss_allowed());
        }
        let mut vals = Vec::with_capacity(stats.count());
        for p in stats.pieces(usize::MAX) {
            let adv = p.abs_advantage?;
            vals.extend(
                p.allowed
                    .iter()
                    .map(|&a| propagate::product_allowed(a, adv)),
            );
        }
        Some(reduce_rows(
            self.mode(),
            &self.chain?.extra.row_counts,
            &vals,
        ))
    }

    /// The pg term's difference (this side's minus the other's) that the inputs' known
    /// differences predict: `A·r·(e^−δ − 1)` per element whose signed log-ratio difference
    /// `δ` and advantage are known and whose ratio stays inside the clip range by more
    /// than its allowance (both sides then computed the unclipped `−A·r`), reduced in the
    /// chain's mode; with the worst case `|A|·r·(e^E−1)` of every other element reduced
    /// beside it. None when no element is predicted (the worst case of all is used).
    fn pg_predicted(&self) -> Option<Predicted> {
        *self.predicted.get_or_init(|| self.pg_predicted_with(true))
    }

    /// [`StatsMemo::pg_predicted`], uncached. `fast` sums a token-mean chain's three
    /// per-element terms as they are computed (the same additions in the same order as
    /// [`reduce_rows`] over their vectors); `fast: false` keeps every mode on the vectors
    /// (the tests pin the two equal bit for bit).
    pub(super) fn pg_predicted_with(&self, fast: bool) -> Option<Predicted> {
        let (stats, ch) = (self.stats?, self.chain?);
        let x = &ch.extra;
        let n = stats.count();
        let rows = x.row_counts.len();
        // (A `delta` too short for the elements fails in `pg_terms`.)
        if x.pred_advantage.len() != rows || per_row_total(x) != n {
            return None;
        }
        let (lo, hi) = clip_range(self.loss);
        let m = self.mode();
        let len = match m {
            AggMode::TokenMean => x.row_counts.iter().sum::<usize>(),
            _ => x.row_counts.iter().copied().max().unwrap_or(0),
        };
        let (center, rest, magnitude, count) =
            if fast && m == AggMode::TokenMean && len == n && n > 0 {
                // `reduce_rows` of token-mean: `Iterator::sum` (a fold from −0.0) over all
                // `n` values, then `/ n`.
                let zero = std::iter::empty::<f64>().sum::<f64>();
                let (mut s, mut r, mut g) = (zero, zero, zero);
                let count = pg_terms(stats, x, lo, hi, |signed, rest, magnitude| {
                    s += signed;
                    r += rest;
                    g += magnitude;
                })?;
                let n = n as f64;
                (s / n, r / n, g / n, count)
            } else {
                let mut signed = Vec::with_capacity(n);
                let mut rest = Vec::with_capacity(n);
                let mut magnitude = Vec::with_capacity(n);
                let count = pg_terms(stats, x, lo, hi, |s, r, g| {
                    signed.push(s);
                    rest.push(r);
                    magnitude.push(g);
                })?;
                let reduce = |v: &[f64]| reduce_rows(m, &x.row_counts, v);
                (reduce(&signed), reduce(&rest), reduce(&magnitude), count)
            };
        // each side sums its elements in f32 (torch reduces pairwise: cascade sums on
        // CPU, `aten/src/ATen/native/cpu/SumKernel.cpp`; tree reductions on CUDA), an
        // error the prediction from dumped values cannot know:
        // λ·√⌈log₂ n⌉·u₃₂·Σ|wᵢ·Aᵢ·rᵢ| per side (probabilistic, Higham & Mary 2019), n the
        // longest sum (the batch under token-mean, a row otherwise)
        let levels = (len.max(2) as f64).log2().ceil();
        let arith = 2.0
            * crate::conventions::rounding::LAMBDA
            * levels.sqrt()
            * 2f64.powi(-24)
            * magnitude.abs();
        (count > 0).then_some(Predicted {
            center,
            rest,
            arith,
            count,
        })
    }

    /// The KL term's allowance in the chain's mode, from `logp − ref` and the log-ratio
    /// allowance `E` of each element, for any of k1/k2/k3:
    /// `max(1, |Δ|, |1 − e^−Δ|)·E + E²/2·max(1, e^(E−Δ))` (their first and second
    /// derivatives in `logp`). None without `ref_log_probs`.
    fn kl_allowed(&self) -> Option<f64> {
        let (stats, ch) = (self.stats?, self.chain?);
        if ch.extra.kl_delta.len() != stats.count() || stats.count() == 0 {
            return None;
        }
        let mut vals = Vec::with_capacity(stats.count());
        let mut deltas = ch.extra.kl_delta.iter();
        for p in stats.pieces(usize::MAX) {
            for ((&ratio, &allowed), &d) in p.ratio.iter().zip(p.allowed).zip(&mut deltas) {
                let el = log_allowed(ratio, allowed)?;
                let v = d.is_finite().then(|| {
                    let first = 1f64.max(d.abs()).max((-d).exp_m1().abs());
                    first * el + 0.5 * el * el * 1f64.max((el - d).exp())
                });
                vals.push(v?);
            }
        }
        Some(reduce_rows(self.mode(), &ch.extra.row_counts, &vals))
    }

    /// `approx_kl = mean(½·(logp − old)²)`: token mean of `|Δ|·E + E²/2`.
    fn approx_kl_allowed(&self) -> Option<f64> {
        let stats = self.stats?;
        let n = stats.count();
        let sum = approx_kl_sum(stats)?;
        (n > 0).then_some(sum / n as f64)
    }
}

/// The pg term's predicted difference ([`StatsMemo::pg_predicted`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Predicted {
    /// The predicted `pg_loss` difference, this side's minus the other's.
    center: f64,
    /// The worst case of the elements not predicted, reduced.
    rest: f64,
    /// Both sides' f32 arithmetic in reducing the elements (their dumped values cannot
    /// carry it).
    arith: f64,
    /// How many elements are predicted.
    count: usize,
}

#[cfg(test)]
impl Predicted {
    /// Every field, the floats as their bits (what a bit-for-bit test compares).
    pub(super) fn bits(&self) -> (u64, u64, u64, usize) {
        (
            self.center.to_bits(),
            self.rest.to_bits(),
            self.arith.to_bits(),
            self.count,
        )
    }
}

/// `mode`'s reduction of a chain's valid elements, row after row
/// ([`AggMode::reduce_rows`]); the chain keeps no padded width, so the longest row stands
/// for it (only a mode without its horizon would use it).
fn reduce_rows(mode: AggMode, row_counts: &[usize], vals: &[f64]) -> f64 {
    let t = row_counts.iter().copied().max().unwrap_or(0);
    mode.reduce_rows(row_counts, vals, t)
}

/// The pg term's three values of each valid element, in order, handed to `each`:
/// `A·r·(e^−δ − 1)` where it is predicted (`δ` and `A` known, the ratio inside the clip
/// range by more than its allowance) else 0; the worst case `|A|·r·(e^E−1)` where it is
/// not, else 0; `|A|·r` (0 for an unknown `A`), `A` the element's row's
/// [`ElemExtra::pred_advantage`]. The count of predicted elements; None when an element
/// neither predicted nor with a known `|A|` makes the prediction moot. Only the elements
/// the rows' counts cover are taken.
pub(super) fn pg_terms(
    stats: &ChainStats,
    x: &ElemExtra,
    lo: f64,
    hi: f64,
    mut each: impl FnMut(f64, f64, f64),
) -> Option<usize> {
    let mut count = 0;
    let n = stats.count().min(per_row_total(x));
    // Each element's row advantage, rows taken in turn by their counts.
    let mut rows = x.row_counts.iter().zip(&x.pred_advantage);
    let (mut left, mut row_adv) = (0usize, f64::NAN);
    // `e^−δ − 1` of a piece at once, then the piece's terms in element order.
    let (mut m, mut adv) = ([0f64; LIBM_BLOCK], [0f64; LIBM_BLOCK]);
    let mut start = 0;
    for p in stats.pieces(LIBM_BLOCK) {
        if start >= n {
            break;
        }
        let len = p.ratio.len().min(n - start);
        let (ratio, allowed) = (&p.ratio[..len], &p.allowed[..len]);
        // Each element's signed difference at its offset; None when `delta` lacks it.
        let delta = x.delta.get(p.at..p.at + len)?;
        start += len;
        let m = &mut m[..len];
        for (m, &d) in m.iter_mut().zip(delta) {
            *m = -d;
        }
        m.iter_mut().for_each(|v| *v = v.exp_m1());
        let adv = &mut adv[..len];
        for a in adv.iter_mut() {
            while left == 0 {
                // `n` is at most the counts' total, so a row is left for every element.
                let (&c, &v) = rows.next()?;
                (left, row_adv) = (c, v);
            }
            *a = row_adv;
            left -= 1;
        }
        let terms = ratio
            .iter()
            .zip(allowed)
            .zip(delta)
            .zip(adv.iter())
            .zip(m.iter());
        for ((((&r, &al), &d), &a), &m) in terms {
            let inside = r - al > 1.0 - lo && r + al < 1.0 + hi;
            let magnitude = if a.is_finite() { a.abs() * r } else { 0.0 };
            if d.is_finite() && a.is_finite() && inside {
                each(a * r * m, 0.0, magnitude);
                count += 1;
            } else {
                let worst = propagate::product_allowed(al, p.abs_advantage?);
                each(0.0, worst, magnitude);
            }
        }
    }
    Some(count)
}

/// The elements `x`'s rows hold: the total of their counts, over the rows that have a
/// [`ElemExtra::pred_advantage`].
fn per_row_total(x: &ElemExtra) -> usize {
    x.row_counts.iter().take(x.pred_advantage.len()).sum()
}

/// Elements a libm pass takes at a time (over a block, then the block's sums in element
/// order): a few KB that stay in the core's cache.
pub(super) const LIBM_BLOCK: usize = 512;

/// `Σ |ln r|·E + E²/2` over `elems` in order (an `f64` sum from `−0.0`, as
/// `Iterator::sum`), `E` each element's [`log_allowed`]; None when any `E` is unknown.
/// Each block's `ln_1p` and `ln` are taken at once.
pub(super) fn approx_kl_sum(stats: &ChainStats) -> Option<f64> {
    let (mut e_log, mut ln_r) = ([0f64; LIBM_BLOCK], [0f64; LIBM_BLOCK]);
    let mut sum = std::iter::empty::<f64>().sum::<f64>();
    for p in stats.pieces(LIBM_BLOCK) {
        let (e_log, ln_r) = (&mut e_log[..p.ratio.len()], &mut ln_r[..p.ratio.len()]);
        for (((el, l), &r), &a) in e_log
            .iter_mut()
            .zip(ln_r.iter_mut())
            .zip(p.ratio)
            .zip(p.allowed)
        {
            *el = a / r;
            *l = r;
        }
        e_log.iter_mut().for_each(|v| *v = v.ln_1p());
        ln_r.iter_mut().for_each(|v| *v = v.ln());
        for ((&r, &el), &l) in p.ratio.iter().zip(e_log.iter()).zip(ln_r.iter()) {
            let el = log_allowed_from(r, el)?;
            sum += l.abs() * el + 0.5 * el * el;
        }
    }
    Some(sum)
}

/// The log-ratio allowance `E` of an element, from its ratio and the ratio's allowance
/// `r·(e^E − 1)`.
fn log_allowed(ratio: f64, allowed: f64) -> Option<f64> {
    log_allowed_from(ratio, (allowed / ratio).ln_1p())
}

/// [`log_allowed`] from `ln_1p(allowed / ratio)` already computed: `x` when finite and
/// the ratio positive.
fn log_allowed_from(ratio: f64, x: f64) -> Option<f64> {
    (x.is_finite() && ratio > 0.0).then_some(x)
}

/// The propagated tolerance of a loss-file scalar that is an aggregate of the chain's
/// elements, with how it was obtained (None: no rule for this key). `loss` adds the KL
/// term's allowance times the side's `kl_coef` when both are known.
pub(super) fn loss_propagation(key: &str, memo: &StatsMemo<'_>) -> Option<(f64, String)> {
    let stats = memo.stats?;
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let n = stats.count();
    let mode = memo.mode();
    let how = |what: &str| match mode {
        AggMode::TokenMean => format!("= mean of {what} over {n} tokens"),
        m => format!("= {} of {what} over {n} tokens", m.name()),
    };
    match leaf {
        "pg_loss" => match memo.pg_predicted() {
            Some(p) => Some((p.rest + p.arith, predicted_how(&p, n, mode))),
            None => memo.pg_allowed().map(|e| (e, how("|A|·r·(e^E−1)"))),
        },
        "loss" => {
            let pred = memo.pg_predicted();
            let pg = match pred {
                Some(p) => p.rest + p.arith,
                None => memo.pg_allowed()?,
            };
            let how = |what: &str| match &pred {
                Some(p) => predicted_how(p, n, mode),
                None => how(what),
            };
            let kc = memo.chain.and_then(|c| c.kl_coef).filter(|k| *k != 0.0);
            match (kc, kc.and_then(|_| memo.kl_allowed())) {
                (Some(kc), Some(kl)) => Some((
                    pg + kc.abs() * kl,
                    format!(
                        "{} + kl_coef {kc} × the KL term's {}",
                        how("|A|·r·(e^E−1)"),
                        crate::fmt::num(kl)
                    ),
                )),
                _ => Some((pg, how("|A|·r·(e^E−1)"))),
            }
        }
        "kl_loss" | "kl" => memo
            .kl_allowed()
            .map(|e| (e, how("the k1/k2/k3 bound from E and logp − ref"))),
        "approx_kl" => memo.approx_kl_allowed().map(|e| {
            (
                e,
                format!("= mean of |logp − old|·E + E²/2 over {n} tokens"),
            )
        }),
        "avg_ratio" | "ratio_mean" => (*memo.mean_ratio.get_or_init(|| stats.mean_ratio_allowed()))
            .map(|e| (e, format!("= mean of r·(e^E−1) over {n} tokens"))),
        l if l.contains("clip_frac") || l.contains("clipfrac") => {
            let &(lo, hi, flips) = memo.flips.get_or_init(|| {
                let (lo, hi) = clip_range(memo.loss);
                (lo, hi, stats.flips(lo, hi))
            });
            // `clip_fraction_allowed`, from the flips already counted.
            (n > 0).then(|| {
                (
                    flips as f64 / n as f64,
                    format!("= {flips} of {n} tokens within tolerance of the clip boundary 1−{lo}/1+{hi}"),
                )
            })
        }
        _ => None,
    }
}

/// How a predicted pg allowance was obtained: the prediction the difference is judged
/// against, and the worst case of the elements not predicted.
fn predicted_how(p: &Predicted, n: usize, mode: AggMode) -> String {
    let mode = match mode {
        AggMode::TokenMean => "mean".to_string(),
        m => m.name(),
    };
    format!(
        "= {mode} of |A|·r·(e^E−1) over the {} of {n} tokens not predicted + {} for both sides' f32 sums; judged: a − b − ({}), the difference A·r·(e^−δ−1) predicts from the signed within-tolerance log-ratio differences δ of {} tokens",
        n - p.count,
        crate::fmt::num(p.arith),
        crate::fmt::num(p.center),
        p.count
    )
}

/// The difference a loss-file scalar's comparison is judged against: the predicted pg
/// difference for `pg_loss` and `loss` ([`StatsMemo::pg_predicted`]), else 0.
pub(super) fn loss_center(key: &str, memo: &StatsMemo<'_>) -> f64 {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    match leaf {
        "pg_loss" | "loss" => memo.pg_predicted().map_or(0.0, |p| p.center),
        _ => 0.0,
    }
}

/// Section 3: `loss` scalars and every shared key of `metrics`. `memo` is
/// `StatsMemo::new(chain, Some(a))`, shared with the micro's [`is_loss_cell`].
pub fn loss_cell(
    policy: &TolerancePolicy,
    rank: u32,
    micro: u32,
    a: &Record,
    b: &Record,
    precision: Option<DType>,
    memo: &StatsMemo<'_>,
) -> (Cell, Vec<String>) {
    let rows = RowMatch::by_index(0, 0);
    let ctx = PairCtx {
        policy,
        section: "loss",
        rows: &rows,
        mask_a: None,
        mask_b: None,
        cell_precision: precision,
    };
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for (key, field) in [
        ("loss", Field::Loss),
        ("pg_loss", Field::PgLoss),
        ("entropy_loss", Field::EntropyLoss),
    ] {
        match (a.has(field), b.has(field)) {
            (true, true) => out.extend(ctx.scalar_predicted(
                key,
                (a.number(field), b.number(field)),
                (Origin::dumped("loss", key), Origin::dumped("loss", key)),
                true,
                (loss_propagation(key, memo), loss_center(key, memo)),
            )),
            _ => out.push(skipped("loss", key, "not dumped on both sides")),
        }
    }
    if let (Some(ma), true) = (a.metrics(), b.metrics().is_some()) {
        for (k, va) in ma {
            match b.metric(k) {
                Some(vb) => {
                    let key = format!("metrics.{k}");
                    out.extend(ctx.scalar_predicted(
                        &key,
                        (va, vb),
                        (Origin::dumped("loss", &key), Origin::dumped("loss", &key)),
                        true,
                        (loss_propagation(&key, memo), loss_center(&key, memo)),
                    ));
                }
                None => notes.push(format!(
                    "rank {rank} micro {micro}: metrics.{k} on self-hosted only"
                )),
            }
        }
    }
    (cell(Some(rank), Some(micro), None, out), notes)
}
