//! The document of a postmortem, section by section (the dump section is in `dumps.rs`;
//! the words and numbers their tables share are in `words.rs`).

use super::words::{cell, stats, step_cells};
use super::{
    heading, list, para, text, Block, Cell, Document, Fact, FactStyle, Inline, Item, Row, Table,
    Target,
};
use crate::fmt::evidence;
use crate::postmortem::{CrashSummary, Postmortem, StepTable};

/// A fact of the header.
fn fact(key: &str, value: String, style: FactStyle, only: Option<Target>) -> Fact {
    Fact {
        key: key.to_string(),
        value,
        suffix: None,
        style,
        only,
    }
}

/// Status, input, start, logged steps, config: markdown names the start before the steps,
/// HTML after them.
fn facts(pm: &Postmortem) -> Vec<Fact> {
    let mut out = vec![
        fact("status", pm.status.to_string(), FactStyle::Strong, None),
        Fact {
            suffix: Some(format!(" ({})", pm.run.kind)),
            ..fact(
                "input",
                pm.run.path.display().to_string(),
                FactStyle::Code,
                None,
            )
        },
    ];
    let started = |only| {
        pm.run
            .started
            .as_ref()
            .map(|t| fact("started", t.clone(), FactStyle::Plain, Some(only)))
    };
    out.extend(started(Target::Markdown));
    out.push(fact(
        "logged steps",
        format!(
            "{} ({}..{})",
            pm.logged_steps,
            pm.first_step.map_or("-".into(), |s| s.to_string()),
            pm.last_step.map_or("-".into(), |s| s.to_string())
        ),
        FactStyle::Plain,
        None,
    ));
    out.extend(started(Target::Html));
    for (k, v) in &pm.run.config {
        out.push(fact(
            k,
            v.to_string().trim_matches('"').to_string(),
            FactStyle::Code,
            None,
        ));
    }
    out
}

/// The whole document.
pub fn document(pm: &Postmortem) -> Document {
    let mut b: Vec<Block> = Vec::new();
    b.push(heading(2, Some("todo"), vec![text("What to do")]));
    if pm.recommendations.is_empty() {
        b.push(para(vec![text("Nothing stands out.")]));
    } else {
        b.push(list(
            true,
            pm.recommendations
                .iter()
                .map(|r| vec![Inline::Marked(r.clone())])
                .collect(),
        ));
    }
    b.push(heading(2, Some("crash"), vec![text("Crash")]));
    match &pm.crash {
        None => b.push(para(vec![text(
            "No crash bundle and no crash event: the run did not crash (or left no record of it).",
        )])),
        Some(c) => crash(c, &mut b),
    }
    for d in &pm.diagnoses {
        b.push(heading(
            2,
            None,
            vec![text(format!("Diagnosis: {}", d.title))],
        ));
        b.push(para(vec![text(d.explanation.clone())]));
    }
    b.push(heading(
        2,
        Some("steps"),
        vec![text(format!(
            "Last steps{}",
            if pm.crash.is_some() {
                " before the crash"
            } else {
                ""
            }
        ))],
    ));
    b.push(para(vec![text(format!("From {}.", pm.last_steps.source))]));
    b.push(last_steps(&pm.last_steps));
    findings(pm, &mut b);
    if let Some(d) = &pm.dumps {
        super::dumps::section(d, &mut b);
    }
    preflight(pm, &mut b);
    replay(pm, &mut b);
    b.push(heading(2, Some("plots"), vec![text("Plots")]));
    b.push(Block::Plots {
        plots: pm.plots.clone(),
    });
    if !pm.data_notes.is_empty() {
        b.push(heading(2, Some("notes"), vec![text("Data notes")]));
        b.push(list(
            false,
            pm.data_notes
                .iter()
                .map(|n| vec![Inline::Flat(n.clone())])
                .collect(),
        ));
    }
    Document {
        title: pm.run.name.clone(),
        status: pm.status.to_string(),
        headline: pm.headline.clone(),
        facts: facts(pm),
        blocks: b,
    }
}

/// `file:line` of a frame (`?` when the line is unknown).
fn file_line(file: &str, line: Option<u64>) -> String {
    format!("{file}:{}", line.map_or("?".into(), |l| l.to_string()))
}

/// The crash: its summary, the exception chain, the offending batch.
fn crash(c: &CrashSummary, b: &mut Vec<Block>) {
    let step = c.step.map_or("unknown".into(), |s| s.to_string());
    let message = c.message.lines().next().unwrap_or("").to_string();
    let mut source = vec![text(format!("source: {}", c.source))];
    if let Some(bundle) = &c.bundle {
        source.push(text(" "));
        source.push(Inline::Code(format!("failures/{bundle}")));
    }
    b.push(Block::Only {
        target: Target::Markdown,
        blocks: vec![
            list(
                false,
                vec![
                    vec![text("step: "), Inline::Strong(step.clone())],
                    vec![
                        text("exception: "),
                        Inline::Code(c.exception_type.clone()),
                        text(": "),
                        Inline::Flat(message.clone()),
                    ],
                    vec![
                        text("signature: "),
                        Inline::Strong(c.classification.title.to_string()),
                        text(" ("),
                        Inline::Code(c.classification.id.to_string()),
                        text(")"),
                    ],
                    source,
                ],
            ),
            para(vec![text(c.classification.explanation.clone())]),
        ],
    });
    let mut html = vec![
        para(vec![
            Inline::Strong(format!("Step {step}")),
            text(" — "),
            Inline::Code(c.exception_type.clone()),
            text(": "),
            text(message),
        ]),
        para(vec![
            text("Signature: "),
            Inline::Strong(c.classification.title.to_string()),
            text(" ("),
            Inline::Code(c.classification.id.to_string()),
            text("). "),
            Inline::Marked(c.classification.explanation.clone()),
        ]),
    ];
    if let Some(bundle) = &c.bundle {
        html.push(para(vec![
            text("Bundle: "),
            Inline::Code(format!("failures/{bundle}")),
            text(format!(" (from {})", c.source)),
        ]));
    }
    b.push(Block::Only {
        target: Target::Html,
        blocks: html,
    });
    if !c.missing_files.is_empty() {
        b.push(para(vec![text(format!(
            "Missing from the bundle: {}",
            c.missing_files.join(", ")
        ))]));
    }
    for (bi, e) in c.chain.iter().enumerate() {
        b.push(heading(
            3,
            None,
            vec![
                text(format!("Exception {} of {}: ", bi + 1, c.chain.len())),
                Inline::Code(e.exc_type.clone()),
            ],
        ));
        if !e.frames.is_empty() {
            let rows = e
                .frames
                .iter()
                .enumerate()
                .map(|(i, f)| Row {
                    class: Some(format!("origin-{}", f.origin.name())),
                    cells: vec![
                        Cell::text(i.to_string()),
                        Cell::text(f.origin.name()),
                        Cell::of(vec![Inline::Code(file_line(&f.file, f.line))]),
                        Cell::of(vec![Inline::Code(f.function.clone())]),
                        Cell::of(vec![Inline::Code(
                            f.code.as_deref().unwrap_or("").to_string(),
                        )]),
                    ],
                })
                .collect();
            b.push(Block::Table(Table::new(
                &["#", "origin", "file:line", "function", "code"],
                rows,
            )));
        }
        b.push(Block::ExceptionLine {
            text: format!("{}: {}", e.exc_type, e.message),
        });
        match e.leads_to.as_deref() {
            Some("cause") => b.push(para(vec![text("which was the direct cause of:")])),
            Some(_) => b.push(para(vec![text(
                "while handling it, another exception occurred:",
            )])),
            None => {}
        }
    }
    if let Some(f) = &c.trainer_frame {
        b.push(Block::Only {
            target: Target::Markdown,
            blocks: vec![para(vec![
                text("Last frame in the trainer's own code: "),
                Inline::Code(file_line(&f.file, f.line)),
                text(" in "),
                Inline::Code(f.function.clone()),
                text("."),
            ])],
        });
    }
    if c.chain.is_empty() {
        if let Some(t) = &c.exception_text {
            b.push(Block::Pre {
                lang: None,
                text: t.trim_end().to_string(),
            });
        }
    }
    b.push(heading(2, Some("batch"), vec![text("Offending batch")]));
    let Some(ctx) = &c.context else {
        b.push(para(vec![text("No context.json.")]));
        return;
    };
    let metrics = ctx
        .metrics
        .iter()
        .map(|(k, v)| format!("{k}={}", cell(Some(*v))))
        .collect::<Vec<_>>()
        .join(", ");
    let kvs = [
        ("token_counts", format!("{:?}", ctx.token_counts), true),
        ("empty_indices", format!("{:?}", ctx.empty_indices), true),
        ("batch_indices", format!("{:?}", ctx.batch_indices), true),
        ("raw_loss", cell(ctx.raw_loss), false),
        ("grad_norm", cell(ctx.grad_norm), false),
        (
            "grad_nan_count",
            ctx.grad_nan_count.map_or("-".into(), |n| n.to_string()),
            false,
        ),
        ("learning_rate", cell(ctx.learning_rate), false),
        ("val_loss", cell(ctx.val_loss), false),
    ];
    let mut items: Vec<Vec<Inline>> = kvs
        .iter()
        .map(|(k, v, code)| {
            if *code {
                vec![text(format!("{k}: ")), Inline::Code(v.clone())]
            } else {
                vec![text(format!("{k}: {v}"))]
            }
        })
        .collect();
    if !ctx.metrics.is_empty() {
        items.push(vec![text(format!("metrics: {metrics}"))]);
    }
    b.push(Block::Only {
        target: Target::Markdown,
        blocks: vec![list(false, items)],
    });
    let rows = kvs
        .iter()
        .map(|(k, v, _)| (k.to_string(), v.clone()))
        .chain([("metrics".to_string(), metrics)])
        .map(|(k, v)| {
            Row::of(vec![
                Cell {
                    head: true,
                    ..Cell::text(k)
                },
                Cell::of(vec![Inline::Code(v)]),
            ])
        })
        .collect();
    b.push(Block::Only {
        target: Target::Html,
        blocks: vec![Block::Table(Table::new(&[], rows))],
    });
    if !ctx.prompts_preview.is_empty() {
        let rows = ctx
            .prompts_preview
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let a = ctx.answers_preview.get(i).map(String::as_str).unwrap_or("");
                Row::of(vec![Cell::num(i.to_string()), Cell::text(p), Cell::text(a)])
            })
            .collect();
        b.push(Block::Table(Table::new(
            &["prompt", "prompt preview", "answer preview"],
            rows,
        )));
    }
}

/// The last-steps table (`No steps logged.` when empty): one notation per column.
fn last_steps(t: &StepTable) -> Block {
    if t.rows.is_empty() {
        return para(vec![text("No steps logged.")]);
    }
    let mut header = vec!["step".to_string()];
    header.extend(t.columns.iter().cloned());
    let rows = t
        .rows
        .iter()
        .zip(step_cells(t))
        .map(|((s, _), cells)| {
            let mut r = vec![Cell::num(s.to_string())];
            r.extend(cells.into_iter().map(Cell::num));
            Row::of(r)
        })
        .collect();
    Block::Table(Table {
        class: Some("steps".into()),
        wide: true,
        header,
        rows,
    })
}

/// logscan's findings: markdown shows each one's evidence, HTML its likeliest cause.
fn findings(pm: &Postmortem, b: &mut Vec<Block>) {
    b.push(heading(
        2,
        Some("findings"),
        vec![text("Findings over the whole run")],
    ));
    if pm.findings.is_empty() {
        b.push(para(vec![text("No findings.")]));
        return;
    }
    let head = |f: &crate::model::finding::Finding, sev: Cell| {
        vec![
            sev,
            Cell::text(&f.detector),
            Cell::text(f.step_range()),
            Cell::num(f.count.to_string()),
            Cell::text(&f.explanation),
        ]
    };
    let md = pm
        .findings
        .iter()
        .map(|f| {
            let mut r = head(f, Cell::text(f.severity.name()));
            r.push(Cell::text(evidence(&f.evidence, 4)));
            Row::of(r)
        })
        .collect();
    let html = pm
        .findings
        .iter()
        .map(|f| {
            let sev = Cell::text(f.severity.name()).class(format!("sev-{}", f.severity.name()));
            let mut r = head(f, sev);
            r.push(Cell::text(
                f.likely_causes.first().map(String::as_str).unwrap_or(""),
            ));
            Row::of(r)
        })
        .collect();
    let cols = ["severity", "detector", "steps", "n", "finding"];
    b.push(Block::Only {
        target: Target::Markdown,
        blocks: vec![Block::Table(Table::new(
            &[&cols[..], &["evidence"]].concat(),
            md,
        ))],
    });
    b.push(Block::Only {
        target: Target::Html,
        blocks: vec![Block::Table(Table::new(
            &[&cols[..], &["likely cause"]].concat(),
            html,
        ))],
    });
}

/// Pre-flight token statistics per split.
fn preflight(pm: &Postmortem, b: &mut Vec<Block>) {
    b.push(heading(2, Some("preflight"), vec![text("Pre-flight")]));
    if pm.preflight.is_empty() {
        b.push(para(vec![text("No pre-flight summary was logged.")]));
        return;
    }
    let rows = pm
        .preflight
        .iter()
        .map(|p| {
            Row::of(vec![
                Cell::text(&p.split),
                Cell::num(p.inspected.map_or("-".into(), |n| n.to_string())),
                Cell::text(stats(&p.prompt_token_stats)),
                Cell::text(stats(&p.answer_token_stats)),
                Cell::text(format!("{:?}", p.empty_prompt_indices)),
                Cell::text(format!("{:?}", p.empty_answer_indices)),
            ])
        })
        .collect();
    b.push(Block::Table(Table::new(
        &[
            "split",
            "inspected",
            "prompt p50/p95/p99/max",
            "answer p50/p95/p99/max",
            "empty prompts",
            "empty answers",
        ],
        rows,
    )));
}

/// The replay command, what to look at, and the command with the usual fix.
fn replay(pm: &Postmortem, b: &mut Vec<Block>) {
    b.push(heading(2, Some("replay"), vec![text("Replay")]));
    let Some(r) = &pm.replay else {
        b.push(para(vec![text(
            "No run_metadata.json: no command line to replay.",
        )]));
        return;
    };
    b.push(Block::Pre {
        lang: Some("sh".into()),
        text: r.command.clone(),
    });
    // Always a list, even an empty one: HTML opens and closes it, markdown leaves a blank.
    b.push(Block::List {
        ordered: false,
        items: r
            .notes
            .iter()
            .map(|n| Item {
                text: vec![text(n.clone())],
                children: None,
            })
            .collect(),
    });
    if let Some(f) = &r.fix_command {
        b.push(para(vec![text("With the usual fix applied:")]));
        b.push(Block::Pre {
            lang: Some("sh".into()),
            text: f.clone(),
        });
    }
}
