//! The rollout-correction weights the weaver applies against its own dumped
//! `rollout_log_probs` (verl 0.9.1 `rollout_corr_helper.py`
//! `compute_rollout_correction_weights`: token or sequence level, TIS cap or IcePop band),
//! read from its `is_loss_debug` values so that the self-hosted per-token loss is derived
//! with them and a difference of totals is named "an importance weight".

use super::elem_loss::{candidates, valid_positions};
use super::*;
use crate::kernels::aggregate::AggMode;

/// verl's rollout-correction weights the other side applied to its per-token loss, read
/// from its own dumped values: token-level TIS `min(exp(old_log_probs −
/// rollout_log_probs), cap)`, an IcePop band, or one weight per row (verl 0.9.1
/// `rollout_corr_helper.py` `compute_rollout_correction_weights`,
/// [`crate::kernels::rollout_is`]; cap 2 is its default `rollout_is_threshold`).
pub(super) struct Tis {
    /// The weights, the other side's rows and positions.
    pub w: Mat,
    /// The scheme.
    pub is: crate::kernels::rollout_is::RolloutIs,
    /// The per-token loss convention they multiply.
    pub conv: ElemLoss,
}

/// The [`Tis`] under which the other side's `elementwise_loss` is `conv(r, A) · w` on at
/// least 90 % of its valid elements (to f32, 32 ulps: the weight is computed in f32) and
/// on more of them than the convention alone (`plain`), when it dumps its
/// `rollout_log_probs` and `old_log_probs`: the schemes read off its own factors
/// ([`crate::kernels::rollout_is::read::read_off`]: token or sequence level, TIS cap or
/// IcePop band) and token TIS caps 2 (verl's default), 1.5, 3, 5, 10 tried.
pub(super) fn tis_fit(b_is: &Tensors<'_>, a_loss: Option<&Record>, plain: usize) -> Option<Tis> {
    use crate::kernels::rollout_is::{read, RolloutIs};
    let get = |f: Field| b_is.mat(f);
    let (r, a, el) = (
        get(Field::ProbRatio)?,
        get(Field::Advantages)?,
        get(Field::ElementwiseLoss)?,
    );
    let (old, ro) = (get(Field::OldLogProbs)?, get(Field::RolloutLogProbs)?);
    let dims = (el.rows, el.width);
    if [&r, &a, &old, &ro]
        .iter()
        .any(|m| (m.rows, m.width) != dims)
    {
        return None;
    }
    let mask = get(Field::EffectiveMask);
    let (ov, rv) = (old.values(), ro.values());
    let (rows, width) = dims;
    let valid: Vec<usize> = (0..rows)
        .flat_map(|row| {
            valid_positions(mask.as_deref(), rows, width, row)
                .into_iter()
                .map(move |p| row * width + p)
        })
        .collect();
    let mut m = vec![0.0; rows * width];
    for &i in &valid {
        m[i] = 1.0;
    }
    let (rv2, av, ev) = (r.values(), a.values(), el.values());
    let mut best: Option<(usize, ElemLoss, RolloutIs, Vec<f64>)> = None;
    for conv in candidates(a_loss, dual_read(b_is)) {
        let ours: Vec<f64> = (0..rows * width).map(|i| conv.of(rv2[i], av[i])).collect();
        // verl's default first (named on a tie), then what the factors show
        let mut schemes = vec![RolloutIs::token_cap(2.0)];
        let read = read::tokens_of(&ev, &ours, &ov, &rv, &m, rows, width, 0.0)
            .map(|t| read::read_off(&[(t, 1e-4)]))
            .unwrap_or_default();
        for (is, _, _) in read {
            if !schemes.contains(&is) {
                schemes.push(is);
            }
        }
        for cap in [1.5, 3.0, 5.0, 10.0] {
            let is = RolloutIs::token_cap(cap);
            if !schemes.contains(&is) {
                schemes.push(is);
            }
        }
        for is in schemes {
            let w = is.weights(&ov, &rv, &m, rows, width);
            let n = valid
                .iter()
                .filter(|&&i| {
                    let want = ours[i] * w[i];
                    (ev[i] - want).abs() <= 32.0 * 2f64.powi(-24) * want.abs().max(ev[i].abs())
                })
                .count();
            if best.as_ref().is_none_or(|(b, ..)| n > *b) {
                best = Some((n, conv, is, w));
            }
        }
    }
    let (n, conv, is, w) = best?;
    if n <= plain || n * 10 < valid.len() * 9 {
        return None;
    }
    Some(Tis {
        w: old.with_data(w, DType::F64),
        is,
        conv,
    })
}

impl Tis {
    /// The reference's derived per-token loss `el` and its allowance times the weights of
    /// the other side's row each reference row pairs with (`rows`), position by position.
    pub(super) fn apply(&self, rows: &RowMatch, el: &Mat, allowed: &Mat) -> (Mat, Mat) {
        let (mut x, mut e) = (el.values().into_owned(), allowed.values().into_owned());
        let wv = self.w.values();
        for &(ra, rb) in &rows.pairs {
            for p in 0..el.width.min(self.w.width) {
                let w = wv[rb * self.w.width + p];
                if let (Some(xi), Some(ei)) =
                    (x.get_mut(ra * el.width + p), e.get_mut(ra * el.width + p))
                {
                    *xi *= w;
                    *ei *= w;
                }
            }
        }
        (
            el.with_data(x, el.dtype),
            allowed.with_data(e, allowed.dtype),
        )
    }

    /// The weights in words, for a derived value's origin.
    pub(super) fn words(&self) -> String {
        format!(
            " · {} (the weaver's {}, from its own rollout_log_probs)",
            self.is
                .formula()
                .replace("(old − rollout)", "(old_log_probs − rollout_log_probs)"),
            self.kind()
        )
    }

    /// The scheme in words: verl's default kind as before ("truncated importance
    /// weights"), the others by name.
    fn kind(&self) -> String {
        use crate::kernels::rollout_is::{IsBound, IsLevel};
        match (self.is.level, self.is.bound) {
            (IsLevel::Token, IsBound::Cap { cap }) if cap.is_finite() => {
                format!(
                    "truncated importance weights, TIS cap {}{}",
                    crate::fmt::num(cap),
                    self.is.norm_words()
                )
            }
            _ => format!("importance weights, {}", self.is.words()),
        }
    }

    /// What a loss total's difference then comes from.
    pub(super) fn why(&self) -> String {
        use crate::kernels::rollout_is::{IsBound, IsLevel};
        let scheme = match (self.is.level, self.is.bound) {
            (IsLevel::Token, IsBound::Cap { cap }) if cap.is_finite() && self.is.norm == 1.0 => {
                format!(
                    "truncated importance sampling (TIS, min(exp(old − rollout_log_probs), {}))",
                    crate::fmt::num(cap)
                )
            }
            _ => format!(
                "importance weights ({}: {})",
                self.is.words(),
                self.is
                    .formula()
                    .replace("− rollout)", "− rollout_log_probs)")
            ),
        };
        format!(
            "an importance weight: the weaver applies {scheme} against its rollout log-probs, \
             which the self-hosted side does not dump or apply"
        )
    }
}

/// `"; and the aggregation differs: …"` when the other side's dumped `loss`
/// (`is_loss_debug`) — else the `pg_loss` of its `loss/` file, `b_pg` (its entropy term
/// can be more than 2·10⁻³ of a total near zero: seeds 7573, 7626) — is its own
/// `elementwise_loss` over its own loss mask reduced in one
/// verl mode (or summed) and the reference's `pg_loss` in another: `own`, the mode its own
/// derived per-token loss gives it in ([`super::surrogate::self_mode`]), else — when that
/// cannot be told — `agg`, the mode the cell is compared in, and only a sum for a mean.
/// Each reduction is taken within 2·10⁻³ of the loss (its entropy or KL term, a few 1e-4
/// of it) or 10⁻⁵ of a mean term, and only when no other reduction comes within 100
/// times that; a loss scaled by `loss_scale_factor` or a cell whose terms every
/// reduction gives alike (zero advantages) says nothing. Named beside the importance
/// weights the cell shows, seen or unseen (seeds 9203, 7414), else empty.
pub(super) fn agg_note(
    b_is: &Tensors<'_>,
    ch: &Chain,
    (mask_a, conv): (Option<&Mat>, super::surrogate::ElemLoss),
    (a_loss, b_pg): (Option<&Record>, Option<f64>),
) -> String {
    let own = super::surrogate::self_mode(ch, mask_a, conv, a_loss);
    let loss = b_is.record().number(Field::Loss).map(|n| n.value);
    [("loss", loss), ("pg_loss", b_pg)]
        .into_iter()
        .find_map(|(what, v)| own_aggregation(b_is, ch.agg, own, (what, v?)))
        .unwrap_or_default()
}

/// [`agg_note`]'s reading of one dumped scalar (`what`, `loss`): the note, `None` when the
/// values say nothing of the aggregation.
fn own_aggregation(
    b_is: &Tensors<'_>,
    agg: AggMode,
    own: Option<AggMode>,
    (what, loss): (&str, f64),
) -> Option<String> {
    let el = b_is.mat(Field::ElementwiseLoss)?;
    let mask = b_is.mat(Field::EffectiveMask);
    let (mut vals, mut counts) = (Vec::new(), Vec::new());
    for row in 0..el.rows {
        let valid = valid_positions(mask.as_deref(), el.rows, el.width, row);
        counts.push(valid.len());
        vals.extend(valid.iter().filter_map(|&p| el.get(row, p)));
    }
    if vals.len() != counts.iter().sum::<usize>() || vals.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mean = vals.iter().map(|v| v.abs()).sum::<f64>() / vals.len().max(1) as f64;
    let tol = (1e-5 * mean).max(2e-3 * loss.abs());
    let of = |m: Option<AggMode>| match m {
        Some(m) => m.reduce_rows(&counts, &vals, el.width),
        None => vals.iter().sum(),
    };
    let name = |m: Option<AggMode>| m.map_or("sum (no mean)".to_string(), AggMode::name);
    let modes = [
        Some(AggMode::TokenMean),
        Some(AggMode::SeqMeanTokenMean),
        Some(AggMode::SeqMeanTokenSum),
        None,
    ];
    // the weaver's own mode: the reductions within tol (alike when they coincide: one
    // row's seq-mean-token-sum is its sum), every other 100·tol away; the first named
    let close: Vec<Option<AggMode>> = modes
        .iter()
        .copied()
        .filter(|m| (of(*m) - loss).abs() <= tol)
        .collect();
    let &w = close.first()?;
    // a `pg_loss` holds no other term: an f32 reduction of the same f32 values lands within
    // a few 1e-7 of a term, so a mode 10·tol and 1000 times its own error away is apart
    // (seed 7947: verl's seq-mean-token-sum to 1e-8, NexRL's mean 6.5e-5 away); the `loss`
    // carries its entropy or KL term, up to tol, and keeps 100·tol
    let best = (of(w) - loss).abs();
    let apart = match what {
        "pg_loss" => (10.0 * tol).max(1000.0 * best),
        _ => 100.0 * tol,
    };
    if modes
        .iter()
        .any(|m| !close.contains(m) && (of(*m) - loss).abs() <= apart)
    {
        return None;
    }
    let means = [AggMode::TokenMean, AggMode::SeqMeanTokenMean];
    let (s, how) = match own {
        Some(s) => (
            s,
            "the mode the self-hosted pg_loss follows on its own terms",
        ),
        None if means.contains(&agg)
            && !close.iter().any(|m| m.is_some_and(|m| means.contains(&m))) =>
        {
            (agg, "the mode the self-hosted loss is compared in")
        }
        None => return None,
    };
    (!close.contains(&Some(s))).then(|| {
        format!(
            "; and the aggregation differs: the weaver's {what} {} is the {} of its own \
             elementwise_loss, not their {} ({}), {how}",
            crate::fmt::num(loss),
            name(w),
            s.name(),
            crate::fmt::num(of(Some(s)))
        )
    })
}

/// A failing `is_loss.effective_valid` in a cell without importance weights, whose other
/// side's own total is another reduction of its own per-token loss ([`agg_note`], `agg`):
/// the mask is not the totals' only difference, and the comparison says both (seed 7669:
/// verl's rejection sampling beside NexRL's mean).
pub(super) fn agg_beside_mask(out: &mut [Comparison], agg: &str) {
    for c in out.iter_mut() {
        if !agg.is_empty() && c.name == "is_loss.effective_valid" && c.verdict == Verdict::Fail {
            c.reason.push_str(agg);
        }
    }
}

/// What [`agg_in_total`] writes before the aggregation's words on a total it fails.
const AGG_IN_TOTAL: &str = " (the log-probs' rounding allows the totals' difference), but ";

/// The words of an aggregation read off the weaver's own pg term and per-token loss
/// ([`agg_note`]): a later pass that rescales the totals leaves a total naming it alone
/// (no scale moves that reduction: seed 7947).
pub const OWN_AGG: &str = "the aggregation differs: the weaver's ";

/// A `loss` cell (section 3) whose `is_loss` total names the weaver's own aggregation
/// ([`agg_in_total`], [`agg_note`]): the same words join its flagged totals (`loss.loss`,
/// `loss.pg_loss`) that do not say it yet — the weaver's `pg_loss` is this cell's file.
pub fn agg_in_loss(loss: &mut Cell, is_loss: &Cell) {
    const TOTALS: [&str; 2] = ["loss.loss", "loss.pg_loss"];
    let wants = |c: &Comparison| {
        c.verdict >= Verdict::Warn
            && TOTALS.contains(&c.name.as_str())
            && !c.reason.contains(OWN_AGG)
    };
    if !loss.comparisons.iter().any(wants) {
        return;
    }
    let Some(note) = is_loss.comparisons.iter().find_map(|c| {
        let why = &c.reason[c.reason.find(OWN_AGG)?..];
        let end = ["; unscaled", " — "]
            .iter()
            .filter_map(|k| why.find(k))
            .min()
            .unwrap_or(why.len());
        (c.name == "is_loss.loss").then(|| why[..end].to_string())
    }) else {
        return;
    };
    rework(loss, |out| {
        for c in out.iter_mut().filter(|c| wants(c)) {
            c.reason = format!("{}; and {note}", c.reason);
        }
    });
}

/// `is_loss.loss` in a cell without importance weights whose other side's own total is
/// another reduction of its own per-token loss ([`agg_note`], `agg`): failed with it even
/// when the totals' difference is within the allowance the log-probs' rounding gives
/// (seed 7865: a summed pg term of two rows inside a bf16 allowance twice its size) — the
/// reduction is read from that side's own dumped values, which no rounding moves.
pub(super) fn agg_in_total(out: &mut [Comparison], agg: &str) {
    let Some(why) = agg.strip_prefix("; and ") else {
        return;
    };
    for c in out.iter_mut() {
        if c.name != "is_loss.loss" || c.reason.contains(why) {
            continue;
        }
        if c.verdict == Verdict::Pass {
            c.verdict = Verdict::Fail;
            c.reason = format!("{}{AGG_IN_TOTAL}{why}", c.reason);
        } else if c.verdict >= Verdict::Warn {
            c.reason.push_str(agg);
        }
    }
}

/// The words a flagged cell gains when the other side's own dumped `elementwise_loss` is 0
/// on every token its own loss mask keeps (all advantages zero, or no token kept): every
/// reduction of its pg term gives 0, so the aggregation leaves no trace there to judge
/// (seeds 7414, 7626, 7654: NexRL's mean beside verl's seq-mean-token-sum; 9227: a summed
/// pg term of a cell whose kept tokens carry no advantage). `None` otherwise.
pub(super) fn agg_unseen(b_is: &Tensors<'_>) -> Option<String> {
    let el = b_is.mat(Field::ElementwiseLoss)?;
    let mask = b_is.mat(Field::EffectiveMask);
    let mut kept = 0usize;
    for row in 0..el.rows {
        for p in valid_positions(mask.as_deref(), el.rows, el.width, row) {
            if el.get(row, p)? != 0.0 {
                return None;
            }
            kept += 1;
        }
    }
    let what = if kept == 0 {
        "the weaver's loss mask keeps no token of this cell".to_string()
    } else {
        format!(
            "the weaver's own elementwise_loss is 0 on all {} its loss mask keeps (zero \
             advantages)",
            crate::fmt::plural(kept, "token")
        )
    };
    Some(format!(
        "; cannot judge the aggregation (loss_agg_mode) on this cell: {what}, and every \
         reduction of its pg term gives 0"
    ))
}

/// [`agg_unseen`]'s words (`note`) on each flagged comparison of `out`.
pub(super) fn note_agg_unseen(out: &mut [Comparison], note: Option<&str>) {
    let Some(note) = note else { return };
    for c in out.iter_mut().filter(|c| c.verdict >= Verdict::Warn) {
        c.reason.push_str(note);
    }
}

/// A flagged `loss` cell (section 3) whose `is_loss` cell found the aggregation left no
/// trace ([`agg_unseen`]): the same words join its reason.
pub fn agg_unseen_in_loss(loss: &mut Cell, is_loss: &Cell) {
    if loss.verdict < Verdict::Warn || loss.reason.contains(AGG_UNSEEN) {
        return;
    }
    let note = is_loss
        .comparisons
        .iter()
        .find_map(|c| agg_unseen_words(&c.reason));
    if let Some(note) = note {
        append_note(loss, note);
    }
}

/// The opening of [`agg_unseen`]'s words.
const AGG_UNSEEN: &str = "; cannot judge the aggregation (loss_agg_mode) on this cell";

/// [`agg_unseen`]'s words inside a comparison's `reason`, if there.
pub fn agg_unseen_words(reason: &str) -> Option<&str> {
    const END: &str = "gives 0";
    let at = &reason[reason.find(AGG_UNSEEN)?..];
    Some(&at[..at.find(END)? + END.len()])
}

/// What explains the tokens the other side's loss mask (`effective_valid`, `mask_b`)
/// drops from the reference's response mask (`mask_a`, paired row by row, position by
/// position as the mask comparison pairs them): verl's rejection sampling read from the
/// other side's own `old_log_probs` and `rollout_log_probs`
/// ([`crate::kernels::rollout_is::reject::explain`]), in words; `None` when it does not
/// dump both, or no rejection explains a drop.
pub(super) fn rejection_note(
    mask_a: &Mat,
    mask_b: &Mat,
    b_is: &Tensors<'_>,
    rows: &RowMatch,
) -> Option<String> {
    let (old, ro) = (
        b_is.mat(Field::OldLogProbs)?,
        b_is.mat(Field::RolloutLogProbs)?,
    );
    let (n, w) = (mask_b.rows, mask_b.width);
    if (old.rows, old.width) != (n, w) || (ro.rows, ro.width) != (n, w) {
        return None;
    }
    // the reference's mask in the other side's rows; an unpaired row keeps its own
    let mut full = mask_b.values().into_owned();
    for &(ra, rb) in &rows.pairs {
        if ra >= mask_a.rows || rb >= n {
            continue;
        }
        for p in 0..w {
            full[rb * w + p] = mask_a.get(ra, p).unwrap_or(0.0);
        }
    }
    let kept = mask_b.values();
    crate::kernels::rollout_is::reject::explain(&full, &kept, &old.values(), &ro.values(), n, w)
        .map(|r| r.words())
}

/// A failing `loss` cell (section 3) whose `is_loss` cell found the weaver's loss mask
/// (`effective_valid`) different from the self-hosted response mask: the finding joins its
/// reason (every masked mean of the weaver — its pg, entropy and KL metrics — runs over
/// that mask), naming verl's rejection sampling when [`rejection_note`] read one; an
/// aggregation [`agg_beside_mask`] named joins the totals' (`loss.loss`, `loss.pg_loss`).
pub fn note_rejection(loss: &mut Cell, is_loss: &Cell) {
    const KEY: &str = "verl's rejection sampling";
    const AGG: &str = "; and the aggregation differs";
    if loss.verdict < Verdict::Warn || loss.reason.contains("effective_valid") {
        return;
    }
    let Some(why) = is_loss.comparisons.iter().find_map(|x| {
        (x.name == "is_loss.effective_valid" && x.verdict >= Verdict::Warn).then_some(&x.reason)
    }) else {
        return;
    };
    let (why, agg) = why.split_at(why.find(AGG).unwrap_or(why.len()));
    let note = why.find(KEY).map_or("the loss mask differs", |i| &why[i..]);
    // on the cell and on each failing comparison (a later pass may rebuild the cell's
    // reason from them)
    let note = format!(
        " (the weaver's loss mask, effective_valid, is not the self-hosted response mask — \
         {note})"
    );
    append_note(loss, &note);
    for c in loss.comparisons.iter_mut().filter(|c| {
        c.verdict >= Verdict::Warn && ["loss.loss", "loss.pg_loss"].contains(&c.name.as_str())
    }) {
        c.reason += agg;
    }
}

/// Failing `loss` cells whose loss mask was not compared (a file of their cell could not be
/// read), on a step where other cells' weaver masks are reduced by verl's rejection
/// sampling: the likely cause joins their reasons (and each failing comparison's: a later
/// pass may rebuild a cell's reason from them), said as such. `cells`: each cell's
/// `(rank, micro)`, `loss` cell and `is_loss` cell.
pub fn rejection_elsewhere<'a>(
    cells: impl Iterator<Item = ((u32, Option<u32>), Option<&'a mut Cell>, Option<&'a Cell>)>,
) {
    let cells: Vec<_> = cells.collect();
    fn mask_of(is_loss: Option<&Cell>) -> Option<&Comparison> {
        is_loss.and_then(|c| {
            c.comparisons
                .iter()
                .find(|x| x.name == "is_loss.effective_valid")
        })
    }
    let seen: Vec<String> = cells
        .iter()
        .filter(|(_, _, is)| {
            mask_of(*is).is_some_and(|x| {
                x.verdict >= Verdict::Warn && x.reason.contains("verl's rejection sampling")
            })
        })
        .map(|((r, m), _, _)| format!("rank {r} micro {}", m.unwrap_or(0)))
        .collect();
    if seen.is_empty() {
        return;
    }
    let note = format!(
        " (likely also verl's rejection sampling, which reduces the weaver's loss mask in {}: \
         this cell's mask was not compared)",
        seen.join(", ")
    );
    for (_, loss, is) in cells {
        let Some(loss) = loss.filter(|l| mask_of(is).is_none() && l.verdict >= Verdict::Warn)
        else {
            continue;
        };
        if loss.reason.contains("rejection") {
            continue;
        }
        append_note(loss, &note);
    }
}

/// `note` appended to a failing cell's reason and to each of its failing comparisons' (a
/// later pass may rebuild the cell's reason from them).
fn append_note(loss: &mut Cell, note: &str) {
    loss.reason += note;
    for c in loss
        .comparisons
        .iter_mut()
        .filter(|c| c.verdict >= Verdict::Warn)
    {
        c.reason += note;
    }
}
