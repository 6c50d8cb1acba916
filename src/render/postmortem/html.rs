//! `report.html`: the postmortem [`Document`] as one self-contained page (inline CSS, plots
//! embedded as base64 PNG data URIs, no script, no external resource), so it opens offline.

use base64::Engine as _;

use crate::error::Result;
use crate::postmortem::document::{Block, Cell, Document, Inline, Table, Target};
use crate::postmortem::{PlotRef, Postmortem};
use crate::render::Renderer;

/// `report.html`: one self-contained page with the plots' PNG bytes embedded in order.
pub struct HtmlRenderer<'a> {
    /// Each plot written beside the report and its PNG bytes (none: a page without plots).
    pub pngs: &'a [(PlotRef, Vec<u8>)],
}

impl Renderer<Postmortem> for HtmlRenderer<'_> {
    fn render(&self, pm: &Postmortem) -> Result<String> {
        Ok(write(&Document::of(pm), self.pngs))
    }
}

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

/// Inline text, escaped.
fn inlines(xs: &[Inline]) -> String {
    xs.iter()
        .map(|x| match x {
            Inline::Text(s) | Inline::Flat(s) => esc(s),
            Inline::Fixed(s) => s.clone(),
            Inline::Code(s) => format!("<code>{}</code>", esc(s)),
            Inline::Strong(s) => format!("<b>{}</b>", esc(s)),
            Inline::Badge { text, class } => format!("<b class=\"{class}\">{}</b>", esc(text)),
            Inline::Marked(s) => esc_code(s),
            Inline::Break => "<br />".to_string(),
        })
        .collect()
}

/// The page; `pngs` are the plots' PNG bytes, embedded in order.
pub fn write(doc: &Document, pngs: &[(PlotRef, Vec<u8>)]) -> String {
    let mut o = String::new();
    o.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\" />\n");
    o.push_str(&format!(
        "<title>Postmortem: {}</title>\n<style>{CSS}</style>\n</head>\n",
        esc(&doc.title)
    ));
    o.push_str(&format!(
        "<body class=\"{}\">\n<h1>Postmortem: {} {}</h1>\n<p class=\"headline\">{}</p>\n",
        esc(&doc.status),
        esc(&doc.title),
        if doc.status == "crashed" {
            "<span class=\"badge\">crashed</span>"
        } else {
            ""
        },
        esc(&doc.headline)
    ));
    o.push_str("<ul class=\"kv\">\n");
    for f in doc
        .facts
        .iter()
        .filter(|f| f.only != Some(Target::Markdown))
    {
        let v = format!("{}{}", f.value, f.suffix.as_deref().unwrap_or(""));
        o.push_str(&format!(
            "<li><b>{}</b>: <code>{}</code></li>\n",
            esc(&f.key),
            esc(&v)
        ));
    }
    o.push_str("</ul>\n");
    blocks(&doc.blocks, pngs, &mut o);
    o.push_str("</body>\n</html>\n");
    o
}

/// The blocks HTML shows, in order.
fn blocks(bs: &[Block], pngs: &[(PlotRef, Vec<u8>)], o: &mut String) {
    for b in bs {
        match b {
            Block::Only {
                target,
                blocks: inner,
            } => {
                if *target == Target::Html {
                    blocks(inner, pngs, o);
                }
            }
            b => block(b, pngs, o),
        }
    }
}

/// A `<td>`/`<th>` with its class.
fn cell(c: &Cell) -> String {
    if c.head {
        return format!("<th>{}</th>", inlines(&c.text));
    }
    let class = match (&c.class, c.num) {
        (Some(class), _) => format!(" class=\"{class}\""),
        (None, true) => " class=\"num\"".to_string(),
        (None, false) => String::new(),
    };
    format!("<td{class}>{}</td>", inlines(&c.text))
}

/// A table; `steps` tables let header words break after `_`.
fn table(t: &Table, o: &mut String) {
    let class = t
        .class
        .as_ref()
        .map_or(String::new(), |c| format!(" class=\"{c}\""));
    if t.wide {
        o.push_str("<div class=\"wide\">");
    }
    o.push_str(&format!("<table{class}>\n"));
    if !t.header.is_empty() {
        let breaks = t.class.as_deref() == Some("steps");
        o.push_str("<tr>");
        for h in &t.header {
            let h = if breaks {
                esc(h).replace('_', "_<wbr />")
            } else {
                esc(h)
            };
            o.push_str(&format!("<th>{h}</th>"));
        }
        o.push_str("</tr>\n");
    }
    for r in &t.rows {
        let class = r
            .class
            .as_ref()
            .map_or(String::new(), |c| format!(" class=\"{c}\""));
        let cells: String = r.cells.iter().map(cell).collect();
        o.push_str(&format!("<tr{class}>{cells}</tr>\n"));
    }
    o.push_str("</table>");
    if t.wide {
        o.push_str("</div>");
    }
    o.push('\n');
}

/// One block.
fn block(b: &Block, pngs: &[(PlotRef, Vec<u8>)], o: &mut String) {
    match b {
        Block::Heading { level, id, text } => {
            let id = id
                .as_ref()
                .map_or(String::new(), |i| format!(" id=\"{i}\""));
            o.push_str(&format!("<h{level}{id}>{}</h{level}>\n", inlines(text)));
        }
        Block::Paragraph { text } => o.push_str(&format!("<p>{}</p>\n", inlines(text))),
        Block::Small { text } => o.push_str(&format!("<p><small>{}</small></p>\n", esc(text))),
        Block::List { ordered, items } => {
            let tag = if *ordered { "ol" } else { "ul" };
            o.push_str(&format!("<{tag}>\n"));
            for item in items {
                match &item.children {
                    None => o.push_str(&format!("<li>{}</li>\n", inlines(&item.text))),
                    Some(children) => {
                        o.push_str(&format!("<li>{}\n<ul>\n", inlines(&item.text)));
                        for c in children {
                            o.push_str(&format!("<li>{}</li>\n", inlines(c)));
                        }
                        o.push_str("</ul></li>\n");
                    }
                }
            }
            o.push_str(&format!("</{tag}>\n"));
        }
        Block::Table(t) => table(t, o),
        Block::Pre { text, .. } | Block::ExceptionLine { text } => {
            o.push_str(&format!("<pre>{}</pre>\n", esc(text)));
        }
        Block::Notes { notes } => {
            if !notes.is_empty() {
                o.push_str("<ul>\n");
                for n in notes {
                    o.push_str(&format!("<li>{}</li>\n", esc(n)));
                }
                o.push_str("</ul>\n");
            }
        }
        Block::Plots { .. } => plots(pngs, o),
        Block::Only { .. } => blocks(std::slice::from_ref(b), pngs, o),
    }
}

/// The plots as a grid of figures, each PNG embedded as a data URI.
fn plots(pngs: &[(PlotRef, Vec<u8>)], o: &mut String) {
    if pngs.is_empty() {
        o.push_str("<p>No plottable metric.</p>\n");
        return;
    }
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
