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
        "the clip bound differs: the sides' clip fractions differ{values} while their \
         prob_ratio, advantages and mask agree, so they clipped different tokens of the same \
         ratios (clip_ratio_high / clip_ratio_low)"
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
