//! What two sides' clip fractions say when their ratios agree (issue 28: "the clip bound
//! (tokens in the band between the two bounds explain the whole difference)").

use super::*;

/// When a cell's `pg_clipfrac` (verl's and NexRL's `actor/pg_clipfrac`: the share of
/// tokens whose clipped term was taken) fails while its `is_loss` ratios, advantages and
/// mask all pass, the sides clipped different tokens of the same ratios: a clip bound
/// differs (`clip_ratio_high` / `clip_ratio_low`), even where the bounds' few band
/// tokens move the loss less than the inputs' rounding. The `pg_clipfrac` reason says so
/// and the `is_loss` cell gains a failing `is_loss.clip_bound`.
pub fn clip_fractions(loss: &mut Cell, is_loss: &mut Cell) {
    let verdict_of = |c: &Cell, name: &str| {
        c.comparisons
            .iter()
            .find(|x| x.name == name)
            .map(|x| x.verdict)
    };
    let agree = [
        "is_loss.prob_ratio",
        "is_loss.advantages",
        "is_loss.effective_valid",
    ]
    .iter()
    .all(|n| verdict_of(is_loss, n) == Some(Verdict::Pass));
    // the failing clip fraction of the `loss/` file's metrics (not `pg_clipfrac_lower`)
    let failing_frac = |x: &Comparison| {
        x.name.ends_with("pg_clipfrac")
            && x.name.starts_with("loss.metrics.")
            && x.verdict == Verdict::Fail
    };
    let Some(frac) = loss.comparisons.iter().find(|x| failing_frac(x)) else {
        return;
    };
    if !agree
        || is_loss
            .comparisons
            .iter()
            .any(|x| x.name == "is_loss.clip_bound")
    {
        return;
    }
    let values = frac
        .metrics
        .as_ref()
        .and_then(|m| m.max_abs.as_ref())
        .map(|d| format!(" ({} vs {})", crate::fmt::num(d.a), crate::fmt::num(d.b)))
        .unwrap_or_default();
    let why = format!(
        "{BOUND}{values} while their prob_ratio, advantages and mask agree, so they clipped \
         different tokens of the same ratios (clip_ratio_high / clip_ratio_low)"
    );
    rework(loss, |out| {
        for x in out.iter_mut().filter(|x| failing_frac(x)) {
            x.reason = format!("{} — {why}", x.reason);
        }
    });
    rework(is_loss, |out| {
        let mut c = skipped("is_loss", "clip_bound", why.clone());
        c.verdict = Verdict::Fail;
        out.push(c);
    });
}

/// [`clip_fractions`] again on every cell once the step's ratio level is settled: a GSPO
/// step's `is_loss.prob_ratio` is compared at the token level per cell and replaced by
/// its sequence-level comparison only then, so a clip bound differing under GSPO's
/// sequence ratio was never named (seeds 8106, 8113: `pg_clipfrac` failed, the diagnosis
/// blamed the aggregation). Cells already read are left as they are.
pub fn clip_fractions_settled(sections: &mut [crate::dumpdiff::Section]) {
    let at = |name: &str| sections.iter().position(|s| s.name == name);
    let (Some(l), Some(i)) = (at("loss"), at("is_loss")) else {
        return;
    };
    let (loss, is_loss) = if l < i {
        let (a, b) = sections.split_at_mut(i);
        (&mut a[l], &mut b[0])
    } else {
        let (a, b) = sections.split_at_mut(l);
        (&mut b[0], &mut a[i])
    };
    for c in is_loss.cells.iter_mut() {
        if let Some(lc) = loss
            .cells
            .iter_mut()
            .find(|x| (x.rank, x.micro) == (c.rank, c.micro) && c.rank.is_some())
        {
            clip_fractions(lc, c);
        }
    }
    loss.verdict = loss.worst();
    is_loss.verdict = is_loss.worst();
}

/// How [`clip_fractions`] names a clip bound, up to the two fractions.
const BOUND: &str = "the clip bound differs: the sides' clip fractions differ";

/// A cell whose clip fractions [`clip_fractions`] read as a clip bound, once the step's
/// ratio level is settled: when its `is_loss.ratio_level` fails or warns (the weaver clips
/// its token ratio where the step's cells clip GSPO's sequence ratio, or the reverse), the
/// sides clipped different ratios, not the same ones at two bounds — the level explains
/// the fractions and no bound is told apart (seeds 7130, 7221). The `is_loss.clip_bound`
/// is dropped and the `pg_clipfrac` reason names the ratio level.
pub fn clip_fractions_by_level(sections: &mut [crate::dumpdiff::Section]) {
    let by_rule = |x: &Comparison| x.name == "is_loss.clip_bound" && x.reason.starts_with(BOUND);
    let mut moved = Vec::new();
    for c in sections
        .iter_mut()
        .filter(|s| s.name == "is_loss")
        .flat_map(|s| s.cells.iter_mut())
    {
        let level = c
            .comparisons
            .iter()
            .any(|x| x.name == "is_loss.ratio_level" && x.verdict >= Verdict::Warn);
        if level && c.comparisons.iter().any(by_rule) {
            rework(c, |out| out.retain(|x| !by_rule(x)));
            moved.extend(c.rank.zip(c.micro));
        }
    }
    for c in sections
        .iter_mut()
        .filter(|s| s.name == "loss")
        .flat_map(|s| s.cells.iter_mut())
        .filter(|c| c.rank.zip(c.micro).is_some_and(|k| moved.contains(&k)))
    {
        rework(c, |out| {
            for x in out.iter_mut() {
                if let Some(i) = x.reason.find(&format!(" — {BOUND}")) {
                    let values = x.reason[i + BOUND.len() + 5..]
                        .split(" while")
                        .next()
                        .unwrap_or("")
                        .to_string();
                    x.reason = format!(
                        "{} — the ratio level differs: the sides' clip fractions differ{values} \
                         because they clip ratios at two levels (is_loss.ratio_level: a token \
                         ratio against GSPO's sequence ratio), not the same ratios at two clip \
                         bounds",
                        &x.reason[..i]
                    );
                }
            }
        });
    }
}

/// A convention's clip range in words: `clip 1−0.2/1+0.28` (and its dual clip), or the
/// plain loss.
pub(super) fn range_words(c: ElemLoss) -> String {
    match c {
        ElemLoss::Plain => "the unclipped −A·r".into(),
        ElemLoss::Clipped { lo, hi, dual } => format!(
            "clip 1−{}/1+{}{}",
            crate::fmt::num(lo),
            crate::fmt::num(hi),
            dual.map_or(String::new(), |d| format!(
                ", dual clip {}",
                crate::fmt::num(d)
            ))
        ),
    }
}

/// The dual clip (verl's `clip_ratio_c`) the other side's own values show: its valid
/// tokens' `(prob_ratio, advantages, elementwise_loss)` row by row, read by the one
/// reader both tools share ([`crate::kernels::policy_loss::dual_clip_shown`]: a capped
/// token's `−A·c`, under its row's sequence weight; verl takes any `clip_ratio_c > 1`,
/// seeds 7743, 7779: 2; 7642: beside a sequence TIS). `None` when no token is capped or
/// they disagree (weights, another convention).
pub(super) fn dual_read(b_is: &Tensors<'_>) -> Option<f64> {
    let (r, a, el) = (
        b_is.mat(Field::ProbRatio)?,
        b_is.mat(Field::Advantages)?,
        b_is.mat(Field::ElementwiseLoss)?,
    );
    let mask = b_is.mat(Field::EffectiveMask);
    if (r.rows, r.width) != (el.rows, el.width) || (a.rows, a.width) != (el.rows, el.width) {
        return None;
    }
    crate::kernels::policy_loss::dual_clip_shown((0..el.rows).map(|row| {
        let (rr, ar, er) = (r.row(row), a.row(row), el.row(row));
        super::surrogate::valid_positions(mask.as_deref(), el.rows, el.width, row)
            .into_iter()
            .map(|p| (rr[p], ar[p], er[p]))
            .collect::<Vec<_>>()
    }))
}
