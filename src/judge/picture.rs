//! Is our picture of a step right? Before a side's value is called wrong, the conventions
//! used to judge it must reproduce that side's own dumped values (issue 28): the row order
//! of NexRL's whole-batch `old_log_probs` is settled from the data, and a side whose cells
//! mostly do not follow under the conventions found is "cannot judge", not wrong.

use crate::judge::infer::{Convention, Source};
use crate::judge::self_hosted::SelfHostedStep;
use crate::judge::{Status, Verdict};
use crate::producers::layout::DumpTree;

/// The self-hosted step with its `old_log_probs` row order settled from the data, and that
/// order as a convention when it is NexRL's batch order rather than the file's.
pub(crate) fn settled(
    tree: &DumpTree,
    step: i64,
    batch: Option<SelfHostedStep>,
) -> (Option<SelfHostedStep>, Option<Convention>) {
    let Some(mut b) = batch else {
        return (None, None);
    };
    let conv = match b.settle_old_order(tree, step) {
        Some((true, evidence)) => Some(Convention::new(
            "old_log_probs_order",
            format!("nexrl-batch-order ({evidence})"),
            None,
            Source::Inferred,
        )),
        _ => None,
    };
    (Some(b), conv)
}

/// Check before judging (issue 28): when the conventions used reproduce fewer than half
/// of a side's own cells (of at least 3), the picture is wrong, not the data: each
/// inconsistent cell becomes [`Status::CannotJudge`], with what was tried (`tried`, the
/// conventions in words). With fewer cells nothing is changed (one or two faulty cells
/// cannot be told from a wrong picture). Returns the number of cells so changed.
pub fn check_before_judging(verdicts: &mut [Verdict], tried: &str) -> usize {
    let n = verdicts.len();
    let bad = verdicts
        .iter()
        .filter(|v| v.status == Status::Inconsistent)
        .count();
    if n < 3 || bad * 2 <= n {
        return 0;
    }
    for v in verdicts
        .iter_mut()
        .filter(|v| v.status == Status::Inconsistent)
    {
        v.status = Status::CannotJudge;
        v.notes.insert(
            0,
            format!(
                "cannot judge: the conventions used ({tried}) reproduce this side's own loss on \
                 only {} of {n} cells, so the recomputation is in doubt, not this cell",
                n - bad
            ),
        );
    }
    bad
}
