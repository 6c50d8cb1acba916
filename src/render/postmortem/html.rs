//! `report.html`: the postmortem as one self-contained page (inline CSS, plots embedded as
//! base64 PNG data URIs, no script, no external resource), so it opens offline.

use base64::Engine as _;

use super::markdown::{at_cell, cell, opt_num, stats, status_word, GRID_LEGEND};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::words::finding_line;
use crate::error::Result;
use crate::losscheck::Status;
use crate::postmortem::dumps::{verdict_word, Dumps};
use crate::postmortem::{PlotRef, Postmortem};
use crate::render::Renderer;

/// Escape text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Escape `s` and turn `code` spans (backtick pairs) into `<code>` elements.
fn esc_code(s: &str) -> String {
    let mut o = String::new();
    for (i, part) in s.split('`').enumerate() {
        if i % 2 == 1 {
            o.push_str(&format!("<code>{}</code>", esc(part)));
        } else {
            o.push_str(&esc(part));
        }
    }
    if s.matches('`').count() % 2 == 1 {
        return esc(s);
    }
    o
}

const CSS: &str = "body{font-family:-apple-system,'DejaVu Sans',Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;padding:16px 24px;color:#222;line-height:1.4}
h1{font-size:24px;margin:8px 0}h2{font-size:19px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}h3{font-size:16px}
.headline{font-size:17px;padding:10px 14px;border-radius:6px;background:#eef5ff;border-left:6px solid #1f77b4}
.crashed .headline{background:#fdecea;border-left-color:#c62828}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.num{text-align:right;font-family:'DejaVu Sans Mono',monospace;white-space:nowrap}
.wide{overflow-x:auto;max-width:100%}table.steps{width:100%;font-size:12px}table.steps th{font-size:11px;padding:3px 4px}table.steps td{padding:2px 4px}
code,pre{font-family:'DejaVu Sans Mono',Menlo,monospace;font-size:12px}pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap}
.sev-critical{color:#8c003c;font-weight:bold}.sev-error{color:#c62828;font-weight:bold}.sev-warning{color:#b07800}.sev-info{color:#666}
.origin-trainer{background:#fff7d6}.origin-library,.origin-stdlib{color:#777}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#c62828;color:#fff;font-size:12px}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:10px}.plots figure{margin:0}.plots img{width:100%;border:1px solid #eee}
figcaption{font-size:13px;color:#555}ul.kv{list-style:none;padding-left:0;columns:2}ul.kv li{margin:1px 0}";

fn row(cells: &[String]) -> String {
    format!("<tr>{}</tr>\n", cells.concat())
}

fn td(s: &str) -> String {
    format!("<td>{}</td>", esc(s))
}

fn td_num(s: &str) -> String {
    format!("<td class=\"num\">{}</td>", esc(s))
}

fn th(cols: &[&str]) -> String {
    format!(
        "<tr>{}</tr>\n",
        cols.iter()
            .map(|c| format!("<th>{}</th>", esc(c)))
            .collect::<String>()
    )
}

/// `report.html`: one self-contained page with the plots' PNG bytes embedded in order.
pub struct HtmlRenderer<'a> {
    /// Each plot written beside the report and its PNG bytes (none: a page without plots).
    pub pngs: &'a [(PlotRef, Vec<u8>)],
}

impl Renderer<Postmortem> for HtmlRenderer<'_> {
    fn render(&self, pm: &Postmortem) -> Result<String> {
        Ok(render(pm, self.pngs))
    }
}

/// Render the page; `pngs` are the plots' PNG bytes, embedded in order.
fn render(pm: &Postmortem, pngs: &[(PlotRef, Vec<u8>)]) -> String {
    let mut o = String::new();
    o.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\" />\n");
    o.push_str(&format!(
        "<title>Postmortem: {}</title>\n<style>{CSS}</style>\n</head>\n",
        esc(&pm.run.name)
    ));
    o.push_str(&format!(
        "<body class=\"{}\">\n<h1>Postmortem: {} {}</h1>\n<p class=\"headline\">{}</p>\n",
        esc(pm.status),
        esc(&pm.run.name),
        if pm.status == "crashed" {
            "<span class=\"badge\">crashed</span>"
        } else {
            ""
        },
        esc(&pm.headline)
    ));
    o.push_str("<ul class=\"kv\">\n");
    let mut kv = vec![
        ("status".to_string(), pm.status.to_string()),
        (
            "input".to_string(),
            format!("{} ({})", pm.run.path.display(), pm.run.kind),
        ),
        (
            "logged steps".to_string(),
            format!(
                "{} ({}..{})",
                pm.logged_steps,
                pm.first_step.map_or("-".into(), |s| s.to_string()),
                pm.last_step.map_or("-".into(), |s| s.to_string())
            ),
        ),
    ];
    if let Some(t) = &pm.run.started {
        kv.push(("started".to_string(), t.clone()));
    }
    for (k, v) in &pm.run.config {
        kv.push((k.clone(), v.to_string().trim_matches('"').to_string()));
    }
    for (k, v) in kv {
        o.push_str(&format!(
            "<li><b>{}</b>: <code>{}</code></li>\n",
            esc(&k),
            esc(&v)
        ));
    }
    o.push_str("</ul>\n");

    o.push_str("<h2 id=\"todo\">What to do</h2>\n");
    if pm.recommendations.is_empty() {
        o.push_str("<p>Nothing stands out.</p>\n");
    } else {
        o.push_str("<ol>\n");
        for r in &pm.recommendations {
            o.push_str(&format!("<li>{}</li>\n", esc_code(r)));
        }
        o.push_str("</ol>\n");
    }

    o.push_str("<h2 id=\"crash\">Crash</h2>\n");
    match &pm.crash {
        None => o.push_str("<p>No crash bundle and no crash event: the run did not crash (or left no record of it).</p>\n"),
        Some(c) => {
            o.push_str(&format!(
                "<p><b>Step {}</b> — <code>{}</code>: {}</p>\n<p>Signature: <b>{}</b> (<code>{}</code>). {}</p>\n",
                esc(&c.step.map_or("unknown".into(), |s| s.to_string())),
                esc(&c.exception_type),
                esc(c.message.lines().next().unwrap_or("")),
                esc(c.classification.title),
                esc(c.classification.id),
                esc_code(&c.classification.explanation)
            ));
            if let Some(b) = &c.bundle {
                o.push_str(&format!("<p>Bundle: <code>failures/{}</code> (from {})</p>\n", esc(b), c.source));
            }
            if !c.missing_files.is_empty() {
                o.push_str(&format!("<p>Missing from the bundle: {}</p>\n", esc(&c.missing_files.join(", "))));
            }
            for (bi, b) in c.chain.iter().enumerate() {
                o.push_str(&format!(
                    "<h3>Exception {} of {}: <code>{}</code></h3>\n",
                    bi + 1,
                    c.chain.len(),
                    esc(&b.exc_type)
                ));
                if !b.frames.is_empty() {
                    o.push_str("<table>\n");
                    o.push_str(&th(&["#", "origin", "file:line", "function", "code"]));
                    for (i, f) in b.frames.iter().enumerate() {
                        o.push_str(&format!(
                            "<tr class=\"origin-{}\"><td>{}</td><td>{}</td><td><code>{}:{}</code></td><td><code>{}</code></td><td><code>{}</code></td></tr>\n",
                            f.origin.name(),
                            i,
                            f.origin.name(),
                            esc(&f.file),
                            f.line.map_or("?".into(), |l| l.to_string()),
                            esc(&f.function),
                            esc(f.code.as_deref().unwrap_or(""))
                        ));
                    }
                    o.push_str("</table>\n");
                }
                o.push_str(&format!("<pre>{}: {}</pre>\n", esc(&b.exc_type), esc(&b.message)));
                match b.leads_to.as_deref() {
                    Some("cause") => o.push_str("<p>which was the direct cause of:</p>\n"),
                    Some(_) => o.push_str("<p>while handling it, another exception occurred:</p>\n"),
                    None => {}
                }
            }
            if c.chain.is_empty() {
                if let Some(t) = &c.exception_text {
                    o.push_str(&format!("<pre>{}</pre>\n", esc(t.trim_end())));
                }
            }
            o.push_str("<h2 id=\"batch\">Offending batch</h2>\n");
            match &c.context {
                None => o.push_str("<p>No context.json.</p>\n"),
                Some(ctx) => {
                    o.push_str("<table>\n");
                    let kvs = [
                        ("token_counts", format!("{:?}", ctx.token_counts)),
                        ("empty_indices", format!("{:?}", ctx.empty_indices)),
                        ("batch_indices", format!("{:?}", ctx.batch_indices)),
                        ("raw_loss", cell(ctx.raw_loss)),
                        ("grad_norm", cell(ctx.grad_norm)),
                        ("grad_nan_count", ctx.grad_nan_count.map_or("-".into(), |n| n.to_string())),
                        ("learning_rate", cell(ctx.learning_rate)),
                        ("val_loss", cell(ctx.val_loss)),
                        (
                            "metrics",
                            ctx.metrics
                                .iter()
                                .map(|(k, v)| format!("{k}={}", cell(Some(*v))))
                                .collect::<Vec<_>>()
                                .join(", "),
                        ),
                    ];
                    for (k, v) in kvs {
                        o.push_str(&row(&[format!("<th>{}</th>", esc(k)), format!("<td><code>{}</code></td>", esc(&v))]));
                    }
                    o.push_str("</table>\n");
                    if !ctx.prompts_preview.is_empty() {
                        o.push_str("<table>\n");
                        o.push_str(&th(&["prompt", "prompt preview", "answer preview"]));
                        for (i, p) in ctx.prompts_preview.iter().enumerate() {
                            let a = ctx.answers_preview.get(i).map(String::as_str).unwrap_or("");
                            o.push_str(&row(&[td_num(&i.to_string()), td(p), td(a)]));
                        }
                        o.push_str("</table>\n");
                    }
                }
            }
        }
    }

    for d in &pm.diagnoses {
        o.push_str(&format!(
            "<h2>Diagnosis: {}</h2>\n<p>{}</p>\n",
            esc(d.title),
            esc(&d.explanation)
        ));
    }

    o.push_str(&format!(
        "<h2 id=\"steps\">Last steps{}</h2>\n<p>From {}.</p>\n",
        if pm.crash.is_some() {
            " before the crash"
        } else {
            ""
        },
        esc(&pm.last_steps.source)
    ));
    if pm.last_steps.rows.is_empty() {
        o.push_str("<p>No steps logged.</p>\n");
    } else {
        // Fits the page: headers may break after `_`, numbers use one notation per column.
        o.push_str("<div class=\"wide\"><table class=\"steps\">\n<tr><th>step</th>");
        for c in &pm.last_steps.columns {
            o.push_str(&format!("<th>{}</th>", esc(c).replace('_', "_<wbr />")));
        }
        o.push_str("</tr>\n");
        let texts = super::markdown::step_cells(&pm.last_steps);
        for ((s, _), cells) in pm.last_steps.rows.iter().zip(texts) {
            let mut r = vec![td_num(&s.to_string())];
            r.extend(cells.iter().map(|v| td_num(v)));
            o.push_str(&row(&r));
        }
        o.push_str("</table></div>\n");
    }

    o.push_str("<h2 id=\"findings\">Findings over the whole run</h2>\n");
    if pm.findings.is_empty() {
        o.push_str("<p>No findings.</p>\n");
    } else {
        o.push_str("<table>\n");
        o.push_str(&th(&[
            "severity",
            "detector",
            "steps",
            "n",
            "finding",
            "likely cause",
        ]));
        for f in &pm.findings {
            o.push_str(&row(&[
                format!("<td class=\"sev-{0}\">{0}</td>", f.severity.name()),
                td(&f.detector),
                td(&f.step_range()),
                td_num(&f.count.to_string()),
                td(&f.explanation),
                td(f.likely_causes.first().map(String::as_str).unwrap_or("")),
            ]));
        }
        o.push_str("</table>\n");
    }

    if let Some(d) = &pm.dumps {
        o.push_str(&dumps_section(d));
    }

    o.push_str("<h2 id=\"preflight\">Pre-flight</h2>\n");
    if pm.preflight.is_empty() {
        o.push_str("<p>No pre-flight summary was logged.</p>\n");
    } else {
        o.push_str("<table>\n");
        o.push_str(&th(&[
            "split",
            "inspected",
            "prompt p50/p95/p99/max",
            "answer p50/p95/p99/max",
            "empty prompts",
            "empty answers",
        ]));
        for p in &pm.preflight {
            o.push_str(&row(&[
                td(&p.split),
                td_num(&p.inspected.map_or("-".into(), |n| n.to_string())),
                td(&stats(&p.prompt_token_stats)),
                td(&stats(&p.answer_token_stats)),
                td(&format!("{:?}", p.empty_prompt_indices)),
                td(&format!("{:?}", p.empty_answer_indices)),
            ]));
        }
        o.push_str("</table>\n");
    }

    o.push_str("<h2 id=\"replay\">Replay</h2>\n");
    match &pm.replay {
        None => o.push_str("<p>No run_metadata.json: no command line to replay.</p>\n"),
        Some(r) => {
            o.push_str(&format!("<pre>{}</pre>\n<ul>\n", esc(&r.command)));
            for n in &r.notes {
                o.push_str(&format!("<li>{}</li>\n", esc(n)));
            }
            o.push_str("</ul>\n");
            if let Some(f) = &r.fix_command {
                o.push_str(&format!(
                    "<p>With the usual fix applied:</p>\n<pre>{}</pre>\n",
                    esc(f)
                ));
            }
        }
    }

    o.push_str("<h2 id=\"plots\">Plots</h2>\n");
    if pngs.is_empty() {
        o.push_str("<p>No plottable metric.</p>\n");
    } else {
        o.push_str("<div class=\"plots\">\n");
        let b64 = base64::engine::general_purpose::STANDARD;
        for (p, bytes) in pngs {
            o.push_str(&format!(
                "<figure id=\"plot-{}\"><img alt=\"{}\" src=\"data:image/png;base64,{}\" /><figcaption>{} ({})</figcaption></figure>\n",
                esc(&p.key),
                esc(&p.title),
                b64.encode(bytes),
                esc(&p.title),
                esc(&p.png)
            ));
        }
        o.push_str("</div>\n");
    }

    if !pm.data_notes.is_empty() {
        o.push_str("<h2 id=\"notes\">Data notes</h2>\n<ul>\n");
        for n in &pm.data_notes {
            o.push_str(&format!("<li>{}</li>\n", esc(n)));
        }
        o.push_str("</ul>\n");
    }
    o.push_str("</body>\n</html>\n");
    o
}

/// The CSS class of a verdict symbol (existing severity colours).
fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Fail => "sev-error",
        Verdict::Warn | Verdict::Missing => "sev-warning",
        Verdict::Pass | Verdict::Skipped => "sev-info",
    }
}

/// The "Training-step dumps" section (`--dumps DIR --step N`).
fn dumps_section(d: &Dumps) -> String {
    let mut o = format!(
        "<h2 id=\"dumps\">Training-step dumps</h2>\n<p><b class=\"{}\">Step {}: {}</b> — {}</p>\n<ul>\n",
        verdict_class(d.verdict),
        d.step,
        verdict_word(d.verdict),
        esc(&d.detail)
    );
    for t in &d.trees {
        o.push_str(&format!(
            "<li><code>{}</code> ({})</li>\n",
            esc(&t.root.display().to_string()),
            t.producer
        ));
    }
    o.push_str("</ul>\n");
    if let Some(s) = &d.dumpdiff {
        o.push_str(&format!(
            "<p>dumpdiff, self-hosted as the reference; loss disagreements recomputed by losscheck (<code>{}</code>).</p>\n",
            esc(&d.preset)
        ));
        let batch = s.grid.iter().any(|g| g.batch.is_some());
        let mut head = vec!["section".to_string()];
        head.extend(s.ranks.iter().map(|r| format!("r{r}")));
        if batch {
            head.push("batch".into());
        }
        o.push_str("<div class=\"wide\"><table>\n");
        o.push_str(&th(&head.iter().map(String::as_str).collect::<Vec<_>>()));
        for g in &s.grid {
            let mut r = vec![format!(
                "<td class=\"{}\">{} {}</td>",
                verdict_class(g.verdict),
                g.id,
                esc(&g.name)
            )];
            r.extend(g.by_rank.iter().map(|c| td_num(c)));
            if batch {
                r.push(td_num(g.batch.as_deref().unwrap_or("")));
            }
            o.push_str(&row(&r));
        }
        o.push_str(&format!(
            "</table></div>\n<p><small>{}</small></p>\n",
            esc(GRID_LEGEND)
        ));
        match &s.first_divergence {
            Some(f) => o.push_str(&format!(
                "<p><b>First divergence:</b> {}<br />{}</p>\n",
                esc(&finding_line(f)),
                esc(&f.reason)
            )),
            None => o.push_str("<p>No divergence beyond tolerance.</p>\n"),
        }
        if !s.worst.is_empty() {
            o.push_str("<p>Worst offenders:</p>\n<ul>\n");
            for f in &s.worst {
                o.push_str(&format!("<li>{}</li>\n", esc(&finding_line(f))));
            }
            o.push_str("</ul>\n");
        }
        if !s.adjudication.is_empty() {
            o.push_str("<p>Which side is right (losscheck):</p>\n<ul>\n");
            for a in &s.adjudication {
                o.push_str(&format!(
                    "<li>rank {} micro {} (<code>{}</code>): <b>{}</b>\n<ul>\n",
                    a.rank,
                    a.micro,
                    esc(&a.preset),
                    esc(&a.conclusion)
                ));
                for v in &a.sides {
                    o.push_str(&format!("<li>{}: {}</li>\n", esc(&v.role), esc(&v.detail)));
                }
                o.push_str("</ul></li>\n");
            }
            o.push_str("</ul>\n");
        }
        if !s.problems.is_empty() {
            o.push_str("<table>\n");
            o.push_str(&th(&["section", "rank", "micro", "verdict", "reason"]));
            for p in &s.problems {
                o.push_str(&row(&[
                    td(&p.section),
                    td_num(&opt_num(p.rank)),
                    td_num(&opt_num(p.micro)),
                    format!(
                        "<td class=\"{}\">{}</td>",
                        verdict_class(p.verdict),
                        p.verdict.symbol()
                    ),
                    td(&p.reason),
                ]));
            }
            o.push_str("</table>\n");
        }
        if !s.coverage.is_empty() {
            o.push_str("<p>Present on one side only:</p>\n<ul>\n");
            for c in &s.coverage {
                o.push_str(&format!(
                    "<li><code>{}</code> {}: on {} only, not on {}</li>\n",
                    esc(&c.kind),
                    at_cell(c.rank, c.micro),
                    esc(&c.present_on),
                    esc(&c.missing_on)
                ));
            }
            o.push_str("</ul>\n");
        }
        if !s.notes.is_empty() {
            o.push_str("<ul>\n");
            for n in &s.notes {
                o.push_str(&format!("<li>{}</li>\n", esc(n)));
            }
            o.push_str("</ul>\n");
        }
    } else {
        o.push_str(&format!(
            "<p>Each rank/micro's loss recomputed from the tree's own inputs by losscheck (<code>{}</code>).</p>\n",
            esc(&d.preset)
        ));
        if d.cells.is_empty() {
            o.push_str("<p>No rank/micro cell to check.</p>\n");
        } else {
            o.push_str("<table>\n");
            o.push_str(&th(&[
                "rank",
                "micro",
                "status",
                "dumped loss",
                "recomputed",
                "first divergent intermediate",
            ]));
            for c in &d.cells {
                let class = match c.status {
                    Some(Status::Consistent) => "sev-info",
                    Some(Status::Inconsistent) => "sev-error",
                    None => "sev-warning",
                };
                o.push_str(&row(&[
                    td_num(&c.rank.to_string()),
                    td_num(&c.micro.to_string()),
                    format!("<td class=\"{class}\">{}</td>", status_word(c.status)),
                    td_num(&cell(c.dumped_loss)),
                    td_num(&cell(c.recomputed_loss)),
                    td(&c.first_divergence.as_ref().map_or("-".into(), |v| {
                        format!("{} at row {} pos {}", v.name, v.row, v.pos)
                    })),
                ]));
            }
            o.push_str("</table>\n");
            let bad: Vec<_> = d
                .cells
                .iter()
                .filter(|c| c.status != Some(Status::Consistent))
                .collect();
            if !bad.is_empty() {
                o.push_str("<p>Not self-consistent or not recomputed:</p>\n<ul>\n");
                for c in bad {
                    o.push_str(&format!("<li>{}</li>\n", esc(&c.line)));
                }
                o.push_str("</ul>\n");
            }
        }
    }
    if !d.notes.is_empty() {
        o.push_str("<ul>\n");
        for n in &d.notes {
            o.push_str(&format!("<li>{}</li>\n", esc(n)));
        }
        o.push_str("</ul>\n");
    }
    if d.verdict == Verdict::Fail {
        o.push_str("<p>This verdict makes <code>postmortem</code> exit 1.</p>\n");
    }
    o
}
