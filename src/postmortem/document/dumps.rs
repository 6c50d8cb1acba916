//! The "Training-step dumps" section (`--dumps DIR --step N`): dumpdiff's grid, first
//! divergence and adjudication when several trees were compared, losscheck's cells when
//! one tree was checked alone.

use super::words::{at_cell, cell, opt_num, status_word, GRID_LEGEND};
use super::{heading, list, para, text, Block, Cell, Inline, Item, Row, Table};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::words::{finding_line, verdict_word};
use crate::judge::Status;
use crate::postmortem::dumps::{DumpdiffSummary, Dumps};

/// The HTML class of a verdict (the severity colours).
fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Fail => "sev-error",
        Verdict::Warn | Verdict::Missing => "sev-warning",
        Verdict::Pass | Verdict::Skipped => "sev-info",
    }
}

/// The section's blocks.
pub fn section(d: &Dumps, b: &mut Vec<Block>) {
    b.push(heading(2, Some("dumps"), vec![text("Training-step dumps")]));
    b.push(para(vec![
        Inline::Badge {
            text: format!("Step {}: {}", d.step, verdict_word(d.verdict)),
            class: verdict_class(d.verdict).to_string(),
        },
        text(" — "),
        Inline::Flat(d.detail.clone()),
    ]));
    b.push(list(
        false,
        d.trees
            .iter()
            .map(|t| {
                vec![
                    Inline::Code(t.root.display().to_string()),
                    text(format!(" ({})", t.producer)),
                ]
            })
            .collect(),
    ));
    match &d.dumpdiff {
        Some(s) => compared(d, s, b),
        None => alone(d, b),
    }
    b.push(Block::Notes {
        notes: d.notes.clone(),
    });
    if d.verdict == Verdict::Fail {
        b.push(para(vec![
            text("This verdict makes "),
            Inline::Code("postmortem".into()),
            text(" exit 1."),
        ]));
    }
}

/// Several trees compared by dumpdiff, loss disagreements adjudicated by losscheck.
fn compared(d: &Dumps, s: &DumpdiffSummary, b: &mut Vec<Block>) {
    b.push(para(vec![
        text(
            "dumpdiff, self-hosted as the reference; loss disagreements recomputed by losscheck (",
        ),
        Inline::Code(d.preset.clone()),
        text(")."),
    ]));
    let batch = s.grid.iter().any(|g| g.batch.is_some());
    let mut header = vec!["section".to_string()];
    header.extend(s.ranks.iter().map(|r| format!("r{r}")));
    if batch {
        header.push("batch".into());
    }
    let rows = s
        .grid
        .iter()
        .map(|g| {
            let mut r =
                vec![Cell::text(format!("{} {}", g.id, g.name)).class(verdict_class(g.verdict))];
            r.extend(g.by_rank.iter().map(|c| Cell::num(c.clone())));
            if batch {
                r.push(Cell::num(g.batch.clone().unwrap_or_default()));
            }
            Row::of(r)
        })
        .collect();
    b.push(Block::Table(Table {
        class: None,
        wide: true,
        header,
        rows,
    }));
    b.push(Block::Small {
        text: GRID_LEGEND.to_string(),
    });
    b.push(match &s.first_divergence {
        Some(f) => para(vec![
            Inline::Strong("First divergence:".into()),
            text(" "),
            Inline::Flat(finding_line(f)),
            Inline::Break,
            Inline::Flat(f.reason.clone()),
        ]),
        None => para(vec![text("No divergence beyond tolerance.")]),
    });
    if !s.worst.is_empty() {
        b.push(para(vec![text("Worst offenders:")]));
        b.push(list(
            false,
            s.worst
                .iter()
                .map(|f| vec![Inline::Flat(finding_line(f))])
                .collect(),
        ));
    }
    if !s.adjudication.is_empty() {
        b.push(para(vec![text("Which side is right (losscheck):")]));
        b.push(Block::List {
            ordered: false,
            items: s
                .adjudication
                .iter()
                .map(|a| Item {
                    text: vec![
                        text(format!("rank {} micro {} (", a.rank, a.micro)),
                        Inline::Code(a.preset.clone()),
                        text("): "),
                        Inline::Strong(a.conclusion.clone()),
                    ],
                    children: Some(
                        a.sides
                            .iter()
                            .map(|v| {
                                vec![
                                    text(format!("{}: ", v.role)),
                                    Inline::Flat(v.detail.clone()),
                                ]
                            })
                            .collect(),
                    ),
                })
                .collect(),
        });
    }
    if !s.problems.is_empty() {
        let rows = s
            .problems
            .iter()
            .map(|p| {
                Row::of(vec![
                    Cell::text(&p.section),
                    Cell::num(opt_num(p.rank)),
                    Cell::num(opt_num(p.micro)),
                    Cell::text(p.verdict.symbol()).class(verdict_class(p.verdict)),
                    Cell::text(&p.reason),
                ])
            })
            .collect();
        b.push(Block::Table(Table::new(
            &["section", "rank", "micro", "verdict", "reason"],
            rows,
        )));
    }
    if !s.coverage.is_empty() {
        b.push(para(vec![text("Present on one side only:")]));
        b.push(list(
            false,
            s.coverage
                .iter()
                .map(|c| {
                    vec![
                        Inline::Code(c.kind.clone()),
                        text(format!(
                            " {}: on {} only, not on {}",
                            at_cell(c.rank, c.micro),
                            c.present_on,
                            c.missing_on
                        )),
                    ]
                })
                .collect(),
        ));
    }
    b.push(Block::Notes {
        notes: s.notes.clone(),
    });
}

/// One tree checked alone: each rank/micro's loss recomputed by losscheck.
fn alone(d: &Dumps, b: &mut Vec<Block>) {
    b.push(para(vec![
        Inline::Fixed(
            "Each rank/micro's loss recomputed from the tree's own inputs by losscheck (".into(),
        ),
        Inline::Code(d.preset.clone()),
        text(")."),
    ]));
    if d.cells.is_empty() {
        b.push(para(vec![text("No rank/micro cell to check.")]));
        return;
    }
    let rows = d
        .cells
        .iter()
        .map(|c| {
            let class = match c.status {
                Some(Status::Consistent) => "sev-info",
                Some(Status::Inconsistent) => "sev-error",
                Some(Status::Undetermined | Status::CannotJudge) | None => "sev-warning",
            };
            Row::of(vec![
                Cell::num(c.rank.to_string()),
                Cell::num(c.micro.to_string()),
                Cell::text(status_word(c.status)).class(class),
                Cell::num(cell(c.dumped_loss)),
                Cell::num(cell(c.recomputed_loss)),
                Cell::text(c.first_divergence.as_ref().map_or("-".into(), |v| {
                    format!("{} at row {} pos {}", v.name, v.row, v.pos)
                })),
            ])
        })
        .collect();
    b.push(Block::Table(Table::new(
        &[
            "rank",
            "micro",
            "status",
            "dumped loss",
            "recomputed",
            "first divergent intermediate",
        ],
        rows,
    )));
    let bad: Vec<Vec<Inline>> = d
        .cells
        .iter()
        .filter(|c| c.status != Some(Status::Consistent))
        .map(|c| vec![Inline::Flat(c.line.clone())])
        .collect();
    if !bad.is_empty() {
        b.push(para(vec![text("Not self-consistent or not recomputed:")]));
        b.push(list(false, bad));
    }
}
