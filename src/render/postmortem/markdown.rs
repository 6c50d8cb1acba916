//! `report.md`: the postmortem as GitHub-flavoured markdown, plots linked as PNG files.

use crate::compare::tolerance::Verdict;
use crate::dumpdiff::words::finding_line;
use crate::error::Result;
use crate::fmt::evidence;
use crate::losscheck::Status;
use crate::postmortem::dumps::{verdict_word, Dumps};
use crate::postmortem::{Postmortem, StepTable};
use crate::render::Renderer;

fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A table cell: the shared formatter's 4 significant digits, NaN/inf spelled out, `-`
/// when absent.
pub fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), crate::fmt::num)
}

/// The last-steps table's cells, row by row: one notation per column (never `-0.0031`
/// above `6.973e-4`), `-` where a step has no value.
pub fn step_cells(t: &StepTable) -> Vec<Vec<String>> {
    let n = t.columns.len();
    let mut cols: Vec<Vec<String>> = Vec::with_capacity(n);
    for j in 0..n {
        let present: Vec<f64> = t
            .rows
            .iter()
            .filter_map(|(_, c)| c.get(j).copied().flatten())
            .collect();
        let mut texts = crate::fmt::column(&present).into_iter();
        cols.push(
            t.rows
                .iter()
                .map(|(_, c)| match c.get(j).copied().flatten() {
                    Some(_) => texts.next().unwrap_or_default(),
                    None => "-".to_string(),
                })
                .collect(),
        );
    }
    (0..t.rows.len())
        .map(|i| cols.iter().map(|c| c[i].clone()).collect())
        .collect()
}

/// The last-steps table as markdown (`No steps logged.` when empty).
pub fn step_table(t: &StepTable) -> String {
    if t.rows.is_empty() {
        return "No steps logged.\n".to_string();
    }
    let mut o = format!("| step | {} |\n|---|", t.columns.join(" | "));
    o.push_str(&"---|".repeat(t.columns.len()));
    o.push('\n');
    for ((s, _), c) in t.rows.iter().zip(step_cells(t)) {
        o.push_str(&format!("| {s} | {} |\n", c.join(" | ")));
    }
    o
}

/// `report.md`: GitHub-flavoured markdown, plots linked as the PNG files beside it.
pub struct MarkdownRenderer;

impl Renderer<Postmortem> for MarkdownRenderer {
    fn render(&self, pm: &Postmortem) -> Result<String> {
        Ok(render(pm))
    }
}

/// Render the whole report.
fn render(pm: &Postmortem) -> String {
    let mut o = format!("# Postmortem: {}\n\n**{}**\n\n", pm.run.name, pm.headline);
    o.push_str(&format!(
        "- status: **{}**\n- input: `{}` ({})\n",
        pm.status,
        pm.run.path.display(),
        pm.run.kind
    ));
    if let Some(t) = &pm.run.started {
        o.push_str(&format!("- started: {t}\n"));
    }
    o.push_str(&format!(
        "- logged steps: {} ({}..{})\n",
        pm.logged_steps,
        pm.first_step.map_or("-".into(), |s| s.to_string()),
        pm.last_step.map_or("-".into(), |s| s.to_string())
    ));
    for (k, v) in &pm.run.config {
        o.push_str(&format!("- {k}: `{}`\n", v.to_string().trim_matches('"')));
    }

    o.push_str("\n## What to do\n\n");
    if pm.recommendations.is_empty() {
        o.push_str("Nothing stands out.\n");
    }
    for (i, r) in pm.recommendations.iter().enumerate() {
        o.push_str(&format!("{}. {r}\n", i + 1));
    }

    o.push_str("\n## Crash\n\n");
    match &pm.crash {
        None => o.push_str("No crash bundle and no crash event: the run did not crash (or left no record of it).\n"),
        Some(c) => {
            o.push_str(&format!(
                "- step: **{}**\n- exception: `{}`: {}\n- signature: **{}** (`{}`)\n- source: {}{}\n\n{}\n",
                c.step.map_or("unknown".into(), |s| s.to_string()),
                c.exception_type,
                esc(c.message.lines().next().unwrap_or("")),
                c.classification.title,
                c.classification.id,
                c.source,
                c.bundle.as_ref().map_or(String::new(), |b| format!(" `failures/{b}`")),
                c.classification.explanation
            ));
            if !c.missing_files.is_empty() {
                o.push_str(&format!("\nMissing from the bundle: {}\n", c.missing_files.join(", ")));
            }
            for (bi, b) in c.chain.iter().enumerate() {
                o.push_str(&format!(
                    "\n### Exception {} of {}: `{}`\n\n",
                    bi + 1,
                    c.chain.len(),
                    b.exc_type
                ));
                if !b.frames.is_empty() {
                    o.push_str("| # | origin | file:line | function | code |\n|---|---|---|---|---|\n");
                    for (i, f) in b.frames.iter().enumerate() {
                        o.push_str(&format!(
                            "| {} | {} | `{}:{}` | `{}` | `{}` |\n",
                            i,
                            f.origin.name(),
                            f.file,
                            f.line.map_or("?".into(), |l| l.to_string()),
                            f.function,
                            esc(f.code.as_deref().unwrap_or(""))
                        ));
                    }
                }
                o.push_str(&format!("\n`{}: {}`\n", b.exc_type, esc(&b.message)));
                match b.leads_to.as_deref() {
                    Some("cause") => o.push_str("\nwhich was the direct cause of:\n"),
                    Some(_) => o.push_str("\nwhile handling it, another exception occurred:\n"),
                    None => {}
                }
            }
            if let Some(f) = &c.trainer_frame {
                o.push_str(&format!(
                    "\nLast frame in the trainer's own code: `{}:{}` in `{}`.\n",
                    f.file,
                    f.line.map_or("?".into(), |l| l.to_string()),
                    f.function
                ));
            }
            if c.chain.is_empty() {
                if let Some(t) = &c.exception_text {
                    o.push_str(&format!("\n```\n{}\n```\n", t.trim_end()));
                }
            }
            o.push_str("\n## Offending batch\n\n");
            match &c.context {
                None => o.push_str("No context.json.\n"),
                Some(ctx) => {
                    o.push_str(&format!(
                        "- token_counts: `{:?}`\n- empty_indices: `{:?}`\n- batch_indices: `{:?}`\n- raw_loss: {}\n- grad_norm: {}\n- grad_nan_count: {}\n- learning_rate: {}\n- val_loss: {}\n",
                        ctx.token_counts,
                        ctx.empty_indices,
                        ctx.batch_indices,
                        cell(ctx.raw_loss),
                        cell(ctx.grad_norm),
                        ctx.grad_nan_count.map_or("-".into(), |n| n.to_string()),
                        cell(ctx.learning_rate),
                        cell(ctx.val_loss)
                    ));
                    if !ctx.metrics.is_empty() {
                        let m: Vec<String> = ctx.metrics.iter().map(|(k, v)| format!("{k}={}", cell(Some(*v)))).collect();
                        o.push_str(&format!("- metrics: {}\n", m.join(", ")));
                    }
                    if !ctx.prompts_preview.is_empty() {
                        o.push_str("\n| prompt | prompt preview | answer preview |\n|---|---|---|\n");
                        for (i, p) in ctx.prompts_preview.iter().enumerate() {
                            let a = ctx.answers_preview.get(i).map(String::as_str).unwrap_or("");
                            o.push_str(&format!("| {i} | {} | {} |\n", esc(p), esc(a)));
                        }
                    }
                }
            }
        }
    }

    for d in &pm.diagnoses {
        o.push_str(&format!(
            "\n## Diagnosis: {}\n\n{}\n",
            d.title, d.explanation
        ));
    }

    o.push_str(&format!(
        "\n## Last steps{}\n\nFrom {}.\n\n",
        if pm.crash.is_some() {
            " before the crash"
        } else {
            ""
        },
        pm.last_steps.source
    ));
    o.push_str(&step_table(&pm.last_steps));

    o.push_str("\n## Findings over the whole run\n\n");
    if pm.findings.is_empty() {
        o.push_str("No findings.\n");
    } else {
        o.push_str(
            "| severity | detector | steps | n | finding | evidence |\n|---|---|---|---|---|---|\n",
        );
        for f in &pm.findings {
            o.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                f.severity.name(),
                f.detector,
                f.step_range(),
                f.count,
                esc(&f.explanation),
                esc(&evidence(&f.evidence, 4))
            ));
        }
    }

    if let Some(d) = &pm.dumps {
        o.push_str(&dumps_section(d));
    }

    o.push_str("\n## Pre-flight\n\n");
    if pm.preflight.is_empty() {
        o.push_str("No pre-flight summary was logged.\n");
    } else {
        o.push_str("| split | inspected | prompt p50/p95/p99/max | answer p50/p95/p99/max | empty prompts | empty answers |\n|---|---|---|---|---|---|\n");
        for p in &pm.preflight {
            o.push_str(&format!(
                "| {} | {} | {} | {} | {:?} | {:?} |\n",
                p.split,
                p.inspected.map_or("-".into(), |n| n.to_string()),
                stats(&p.prompt_token_stats),
                stats(&p.answer_token_stats),
                p.empty_prompt_indices,
                p.empty_answer_indices
            ));
        }
    }

    o.push_str("\n## Replay\n\n");
    match &pm.replay {
        None => o.push_str("No run_metadata.json: no command line to replay.\n"),
        Some(r) => {
            o.push_str(&format!("```sh\n{}\n```\n\n", r.command));
            for n in &r.notes {
                o.push_str(&format!("- {n}\n"));
            }
            if let Some(f) = &r.fix_command {
                o.push_str(&format!(
                    "\nWith the usual fix applied:\n\n```sh\n{f}\n```\n"
                ));
            }
        }
    }

    o.push_str("\n## Plots\n\n");
    if pm.plots.is_empty() {
        o.push_str("No plottable metric.\n");
    }
    for p in &pm.plots {
        o.push_str(&format!("![{}]({}) ([svg]({}))\n\n", p.title, p.png, p.svg));
    }

    if !pm.data_notes.is_empty() {
        o.push_str("\n## Data notes\n\n");
        for n in &pm.data_notes {
            o.push_str(&format!("- {}\n", esc(n)));
        }
    }
    o
}

/// `p50/p95/p99/max` of a stats object.
pub fn stats(v: &serde_json::Value) -> String {
    ["p50", "p95", "p99", "max"]
        .iter()
        .map(|k| {
            v.get(k)
                .and_then(|x| x.as_f64())
                .map_or("-".into(), |x| cell(Some(x)))
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `consistent`, `inconsistent` or `not recomputed`.
pub fn status_word(s: Option<Status>) -> &'static str {
    match s {
        Some(Status::Consistent) => "consistent",
        Some(Status::Inconsistent) => "inconsistent",
        None => "not recomputed",
    }
}

/// `0`, `1`, … or `-` for an absent rank/micro.
pub fn opt_num(n: Option<u32>) -> String {
    n.map_or("-".into(), |n| n.to_string())
}

/// `rank 10 micro 1`, `rank 10` (per-rank files) or `whole batch`.
pub fn at_cell(rank: Option<u32>, micro: Option<u32>) -> String {
    match (rank, micro) {
        (Some(r), Some(m)) => format!("rank {r} micro {m}"),
        (Some(r), None) => format!("rank {r}"),
        (None, Some(m)) => format!("micro {m}"),
        (None, None) => "whole batch".into(),
    }
}

/// The legend of the sections × ranks grid.
pub const GRID_LEGEND: &str =
    "one symbol per micro: ✓ pass, ! warn, ✗ fail, – one side only, · not compared";

/// The "Training-step dumps" section.
pub fn dumps_section(d: &Dumps) -> String {
    let mut o = format!(
        "\n## Training-step dumps\n\n**Step {}: {}** — {}\n\n",
        d.step,
        verdict_word(d.verdict),
        esc(&d.detail)
    );
    for t in &d.trees {
        o.push_str(&format!("- `{}` ({})\n", t.root.display(), t.producer));
    }
    if let Some(s) = &d.dumpdiff {
        o.push_str(&format!(
            "\ndumpdiff, self-hosted as the reference; loss disagreements recomputed by losscheck (`{}`).\n\n",
            d.preset
        ));
        let batch = s.grid.iter().any(|g| g.batch.is_some());
        let mut head = vec!["section".to_string()];
        head.extend(s.ranks.iter().map(|r| format!("r{r}")));
        if batch {
            head.push("batch".into());
        }
        o.push_str(&format!(
            "| {} |\n|{}\n",
            head.join(" | "),
            "---|".repeat(head.len())
        ));
        for g in &s.grid {
            let mut cells = vec![format!("{} {}", g.id, g.name)];
            cells.extend(g.by_rank.iter().cloned());
            if batch {
                cells.push(g.batch.clone().unwrap_or_default());
            }
            o.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        o.push_str(&format!("\n({GRID_LEGEND})\n"));
        match &s.first_divergence {
            Some(f) => o.push_str(&format!(
                "\n**First divergence:** {} — {}\n",
                esc(&finding_line(f)),
                esc(&f.reason)
            )),
            None => o.push_str("\nNo divergence beyond tolerance.\n"),
        }
        if !s.worst.is_empty() {
            o.push_str("\nWorst offenders:\n\n");
            for f in &s.worst {
                o.push_str(&format!("- {}\n", esc(&finding_line(f))));
            }
        }
        if !s.adjudication.is_empty() {
            o.push_str("\nWhich side is right (losscheck):\n\n");
            for a in &s.adjudication {
                o.push_str(&format!(
                    "- rank {} micro {} (`{}`): **{}**\n",
                    a.rank,
                    a.micro,
                    a.preset,
                    esc(&a.conclusion)
                ));
                for v in &a.sides {
                    o.push_str(&format!("  - {}: {}\n", v.role, esc(&v.detail)));
                }
            }
        }
        if !s.problems.is_empty() {
            o.push_str("\n| section | rank | micro | verdict | reason |\n|---|---|---|---|---|\n");
            for p in &s.problems {
                o.push_str(&format!(
                    "| {} | {} | {} | {} | {} |\n",
                    p.section,
                    opt_num(p.rank),
                    opt_num(p.micro),
                    p.verdict.symbol(),
                    esc(&p.reason)
                ));
            }
        }
        if !s.coverage.is_empty() {
            o.push_str("\nPresent on one side only:\n\n");
            for c in &s.coverage {
                o.push_str(&format!(
                    "- `{}` {}: on {} only, not on {}\n",
                    c.kind,
                    at_cell(c.rank, c.micro),
                    c.present_on,
                    c.missing_on
                ));
            }
        }
        for n in &s.notes {
            o.push_str(&format!("\n> {}\n", esc(n)));
        }
    } else {
        o.push_str(&format!(
            "\nEach rank/micro's loss recomputed from the tree's own inputs by losscheck (`{}`).\n\n",
            d.preset
        ));
        if d.cells.is_empty() {
            o.push_str("No rank/micro cell to check.\n");
        } else {
            o.push_str("| rank | micro | status | dumped loss | recomputed | first divergent intermediate |\n|---|---|---|---|---|---|\n");
            for c in &d.cells {
                o.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} |\n",
                    c.rank,
                    c.micro,
                    status_word(c.status),
                    cell(c.dumped_loss),
                    cell(c.recomputed_loss),
                    c.first_divergence.as_ref().map_or("-".into(), |v| format!(
                        "{} at row {} pos {}",
                        v.name, v.row, v.pos
                    ))
                ));
            }
            let bad: Vec<_> = d
                .cells
                .iter()
                .filter(|c| c.status != Some(Status::Consistent))
                .collect();
            if !bad.is_empty() {
                o.push_str("\nNot self-consistent or not recomputed:\n\n");
                for c in bad {
                    o.push_str(&format!("- {}\n", esc(&c.line)));
                }
            }
        }
    }
    for n in &d.notes {
        o.push_str(&format!("\n> {}\n", esc(n)));
    }
    if d.verdict == Verdict::Fail {
        o.push_str("\nThis verdict makes `postmortem` exit 1.\n");
    }
    o
}
