//! mismatch's [`Report`] in each format. Table and Markdown print the same sections
//! ([`sections`]): per step the coverage, the producers' metrics under their logged
//! names, the attribution (positions, tokens, sequences, ranks, groups), the what-if
//! table; then the trends and the findings. Plots: [`plot`].

pub mod json;
pub mod markdown;
pub mod plot;
pub mod table;

use super::{Format, Rendered, Renderer, Style};
use crate::mismatch::report::{Report, StepReport};
use crate::mismatch::role_name;

impl Rendered for Report {
    fn renderer(format: Format, _style: Style) -> Box<dyn Renderer<Self>> {
        match format {
            Format::Table => Box::new(table::TableRenderer),
            Format::Json => Box::new(json::JsonRenderer),
            Format::Markdown => Box::new(markdown::MarkdownRenderer),
        }
    }
}

/// A number with 6 significant digits, plain where that stays short.
pub fn num(x: f64) -> String {
    crate::render::losscheck::num(x)
}

/// A share as a percentage.
pub fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.2}%", 100.0 * x)
    } else {
        "-".into()
    }
}

/// One titled table of a report.
pub struct Section {
    /// Title.
    pub title: String,
    /// Lines of prose before the table.
    pub notes: Vec<String>,
    /// Column names.
    pub header: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

fn section(title: impl Into<String>, header: &[&str]) -> Section {
    Section {
        title: title.into(),
        notes: vec![],
        header: header.iter().map(|h| h.to_string()).collect(),
        rows: vec![],
    }
}

fn share_rows(s: &mut Section, shares: &[crate::mismatch::attribution::Share]) {
    for x in shares {
        s.rows.push(vec![
            x.key.clone(),
            x.acc.count.to_string(),
            num(x.acc.sum_abs),
            num(x.mean_abs),
            pct(x.share),
            num(x.lift),
        ]);
    }
}

const SHARE_HEADER: &[&str] = &["part", "tokens", "Σ|Δ|", "mean |Δ|", "share", "lift"];

/// The sections of one step.
pub fn step_sections(s: &StepReport) -> Vec<Section> {
    let mut out = Vec::new();
    let c = &s.coverage;
    let mut head = section(
        format!(
            "step {} ({}, {}): {} vs {}",
            s.step,
            s.producer,
            s.root.display(),
            role_name(s.pair[0]),
            role_name(s.pair[1])
        ),
        &["metric", "value"],
    );
    head.notes.push(format!(
        "{} cells, {} rows, {} tokens compared (Δ = {} − {}); not compared: {} unmatched rows, {} unmatched tokens, {} unscored tokens",
        c.cells, c.rows, c.tokens, role_name(s.pair[1]), role_name(s.pair[0]), c.unmatched_rows, c.unmatched_tokens, c.unscored_tokens
    ));
    if let Some(p) = &s.against {
        let rows = |v: &[crate::mismatch::report::RowAt]| -> String {
            v.iter()
                .map(|r| match r.micro {
                    Some(m) => format!("rank {} micro {} row {}", r.rank, m, r.row),
                    None => format!("rank {} row {}", r.rank, r.row),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        head.notes.push(format!(
            "against {} ({}): {} from A, {} from B; {} rows paired by content (response token ids); only in A: {}{}; only in B: {}{}; without token ids: {} in A, {} in B",
            p.root_b.display(),
            p.producer_b,
            role_name(s.pair[0]),
            role_name(s.pair[1]),
            p.rows_paired,
            p.only_a,
            if p.first_only_a.is_empty() { String::new() } else { format!(" ({})", rows(&p.first_only_a)) },
            p.only_b,
            if p.first_only_b.is_empty() { String::new() } else { format!(" ({})", rows(&p.first_only_b)) },
            p.without_ids_a,
            p.without_ids_b
        ));
    }
    for m in &s.named {
        head.rows.push(vec![m.name.clone(), num(m.value)]);
    }
    out.push(head);
    let a = &s.attribution;
    let mut pos = section(
        format!(
            "step {}: by response position (buckets of {})",
            s.step, a.bucket_width
        ),
        SHARE_HEADER,
    );
    pos.notes.push(format!(
        "Σ|Δ| = {} over {} tokens; the top 1% ({} tokens) carry {}",
        num(a.total.sum_abs),
        a.total.count,
        a.top1pct_tokens,
        pct(a.top1pct_share)
    ));
    share_rows(&mut pos, &a.by_position);
    out.push(pos);
    if !a.top_tokens.is_empty() {
        let mut t = section(
            format!(
                "step {}: top token ids ({} distinct)",
                s.step, a.distinct_tokens
            ),
            SHARE_HEADER,
        );
        share_rows(&mut t, &a.top_tokens);
        out.push(t);
    }
    let mut seqs = section(
        format!("step {}: worst sequences", s.step),
        &[
            "rank",
            "micro",
            "row",
            "tokens",
            "reward",
            "group",
            "Σ|Δ|",
            "mean |Δ|",
            "Σ Δ",
            "max |Δ| at",
        ],
    );
    for q in &a.worst_sequences {
        seqs.rows.push(vec![
            q.rank.to_string(),
            q.micro.map(|m| m.to_string()).unwrap_or("-".into()),
            q.row.to_string(),
            q.tokens.to_string(),
            q.reward.map(num).unwrap_or("-".into()),
            q.group.clone().unwrap_or("-".into()),
            num(q.sum_abs),
            num(q.mean_abs),
            num(q.sum_delta),
            format!(
                "{} @{}",
                num(q.max_abs),
                q.max_at.map(|p| p.to_string()).unwrap_or("-".into())
            ),
        ]);
    }
    out.push(seqs);
    let mut ranks = section(format!("step {}: by rank", s.step), SHARE_HEADER);
    share_rows(&mut ranks, &a.by_rank);
    out.push(ranks);
    if a.by_cell.len() > a.by_rank.len() {
        let mut cells = section(format!("step {}: by rank × micro", s.step), SHARE_HEADER);
        share_rows(&mut cells, &a.by_cell);
        out.push(cells);
    }
    if !a.top_groups.is_empty() {
        let mut g = section(format!("step {}: top groups", s.step), SHARE_HEADER);
        share_rows(&mut g, &a.top_groups);
        out.push(g);
    }
    if !s.whatif.is_empty() {
        let mut w = section(
            format!(
                "step {}: what-if corrections (loss: {})",
                s.step, s.loss_preset
            ),
            &[
                "correction",
                "tokens masked",
                "tokens truncated",
                "seqs masked",
                "seqs truncated",
                "ESS",
                "loss",
                "grad norm",
            ],
        );
        if let Some(n) = &c.loss_note {
            w.notes.push(n.clone());
        }
        for x in &s.whatif {
            w.rows.push(vec![
                x.correction.name.clone(),
                pct(x.tokens_masked),
                pct(x.tokens_truncated),
                pct(x.seqs_masked),
                pct(x.seqs_truncated),
                num(x.ess),
                x.loss.map(num).unwrap_or("-".into()),
                x.grad_norm.map(num).unwrap_or("-".into()),
            ]);
        }
        out.push(w);
    }
    out
}

/// Every section of the report.
pub fn sections(r: &Report) -> Vec<Section> {
    let mut out: Vec<Section> = r.steps.iter().flat_map(step_sections).collect();
    for t in &r.trends {
        let mut s = section(
            format!("trend of {} ({})", t.metric, t.source),
            &["step", "value"],
        );
        s.notes.push(format!(
            "slope {} per step, last third / first third {}{}{}",
            num(t.slope),
            num(t.growth),
            t.growth_start
                .map(|s| format!(", growth from step {s}"))
                .unwrap_or_default(),
            if t.jumps.is_empty() {
                String::new()
            } else {
                format!(", jumps at {:?}", t.jumps)
            }
        ));
        for (st, v) in &t.points {
            s.rows.push(vec![st.to_string(), num(*v)]);
        }
        out.push(s);
    }
    let mut f = section("findings", &["severity", "detector", "steps", "what"]);
    for x in &r.findings {
        f.rows.push(vec![
            x.severity.name().to_string(),
            x.detector.clone(),
            match (x.first_step, x.last_step) {
                (Some(a), Some(b)) if a != b => format!("{a}..{b}"),
                (Some(a), _) => a.to_string(),
                _ => "-".into(),
            },
            x.explanation.clone(),
        ]);
    }
    if f.rows.is_empty() {
        f.notes.push("none".into());
    }
    out.push(f);
    out
}
