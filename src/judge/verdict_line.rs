//! A verdict in one line of words (losscheck's table notes, dumpdiff's adjudication).

use super::{Layout, Status, Verdict};

impl Verdict {
    /// The loss is what its terms give (see [`Verdict::loss_ok`]).
    fn loss_alike(&self) -> bool {
        self.loss_ok
    }

    /// One line: `rank R micro M FILE: consistent (loss X)` or `... dumped loss X ≠
    /// recomputed Y — first divergent intermediate: NAME at row R pos P`, followed by the
    /// notes (the diagnosis) and the `loss/` scalars that disagree. Each pair is printed
    /// with the digits that show its difference.
    pub fn line(&self) -> String {
        let head = format!(
            "rank {} micro {} {}",
            self.rank,
            self.micro,
            self.file.display()
        );
        let mut s = match self.status {
            Status::Consistent => format!(
                "{head}: consistent (loss {})",
                crate::fmt::num(self.recomputed_loss)
            ),
            // nothing recomputed: the rows could not be placed (`cannot_judge_verdict`)
            Status::CannotJudge if self.recomputed_loss.is_nan() => format!(
                "{head}: cannot judge (dumped loss {}, nothing recomputed)",
                crate::fmt::num(self.dumped_loss)
            ),
            Status::CannotJudge => {
                let (d, r) = crate::fmt::pair(self.dumped_loss, self.recomputed_loss);
                format!("{head}: cannot judge (dumped loss {d}, recomputed {r})")
            }
            Status::Undetermined => {
                let (d, r) = crate::fmt::pair(self.dumped_loss, self.recomputed_loss);
                format!("{head}: undetermined (dumped loss {d}, recomputed {r})")
            }
            // a loss recomputed alike is not called different: what differs follows
            Status::Inconsistent if self.loss_alike() => format!(
                "{head}: inconsistent, though its loss {} is recomputed alike",
                crate::fmt::num(self.dumped_loss)
            ),
            Status::Inconsistent => {
                let (d, r) = crate::fmt::pair(self.dumped_loss, self.recomputed_loss);
                let mut s = format!("{head}: dumped loss {d} ≠ recomputed {r}");
                match &self.first_divergence {
                    Some(d) => {
                        let (a, b) = crate::fmt::pair(d.dumped, d.recomputed);
                        s.push_str(&format!(
                            " — first divergent intermediate: {} at row {} pos {} (dumped {a}, recomputed {b}; {} positions differ)",
                            d.name, d.row, d.pos, d.count
                        ))
                    }
                    // weaver dumps every intermediate: they all follow, the reduction not
                    None if self.layout == Layout::Weaver && self.differs == ["aggregation"] => {
                        s.push_str(" — every intermediate matches: the aggregation differs")
                    }
                    None => {}
                }
                s
            }
        };
        // The diagnosis first (e.g. "a sum, not a mean"), then the scalars that disagree.
        for n in &self.notes {
            s.push_str("; ");
            s.push_str(n);
        }
        // The loss itself is in the head already; the other scalars that disagree follow.
        let loss_in_head = self.status == Status::Inconsistent && !self.loss_alike();
        for c in self
            .checks
            .iter()
            .filter(|c| !(c.ok || loss_in_head && c.name == "loss"))
        {
            let (d, r) = crate::fmt::pair(c.dumped, c.recomputed);
            s.push_str(&format!("; {} {d} ≠ recomputed {r}", c.name));
        }
        s
    }
}
