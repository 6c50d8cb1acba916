//! `report.md`: the postmortem [`Document`] as GitHub-flavoured markdown, plots linked as
//! the PNG files beside it. Blocks are separated by one blank line; table cells and
//! one-line texts escape `|` and line breaks.

use crate::error::Result;
use crate::postmortem::document::{Block, Document, FactStyle, Inline, Target};
use crate::postmortem::Postmortem;
use crate::render::Renderer;

/// GitHub-flavoured markdown.
pub struct MarkdownRenderer;

impl Renderer<Postmortem> for MarkdownRenderer {
    fn render(&self, pm: &Postmortem) -> Result<String> {
        Ok(write(&Document::of(pm)))
    }
}

/// `|` and line breaks would end a table cell or a one-line text.
fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Inline text; `flat` (table cells) escapes every run.
fn inlines(xs: &[Inline], flat: bool) -> String {
    let e = |s: &str| if flat { esc(s) } else { s.to_string() };
    xs.iter()
        .map(|x| match x {
            Inline::Text(s) | Inline::Marked(s) => e(s),
            Inline::Fixed(s) => s.clone(),
            Inline::Flat(s) => esc(s),
            Inline::Code(s) => format!("`{}`", e(s)),
            Inline::Strong(s) | Inline::Badge { text: s, .. } => format!("**{}**", esc(s)),
            Inline::Break => " — ".to_string(),
        })
        .collect()
}

/// The whole document.
pub fn write(doc: &Document) -> String {
    let mut o = format!("# Postmortem: {}\n\n**{}**\n\n", doc.title, doc.headline);
    for f in doc.facts.iter().filter(|f| f.only != Some(Target::Html)) {
        let suffix = f.suffix.as_deref().unwrap_or("");
        let v = match f.style {
            FactStyle::Plain => f.value.clone(),
            FactStyle::Strong => format!("**{}**", f.value),
            FactStyle::Code => format!("`{}`", f.value),
        };
        o.push_str(&format!("- {}: {v}{suffix}\n", f.key));
    }
    blocks(&doc.blocks, &mut o);
    o
}

/// Each block after a blank line (empty notes leave nothing, not even the blank).
fn blocks(bs: &[Block], o: &mut String) {
    for b in bs {
        match b {
            Block::Only {
                target,
                blocks: inner,
            } => {
                if *target == Target::Markdown {
                    blocks(inner, o);
                }
            }
            Block::Notes { notes } => {
                for n in notes {
                    o.push_str(&format!("\n> {}\n", esc(n)));
                }
            }
            b => {
                o.push('\n');
                block(b, o);
            }
        }
    }
}

/// One block, ending with a line break.
fn block(b: &Block, o: &mut String) {
    match b {
        Block::Heading { level, text, .. } => {
            o.push_str(&format!(
                "{} {}\n",
                "#".repeat(usize::from(*level)),
                inlines(text, false)
            ));
        }
        Block::Paragraph { text } => {
            o.push_str(&inlines(text, false));
            o.push('\n');
        }
        Block::Small { text } => o.push_str(&format!("({text})\n")),
        Block::List { ordered, items } => {
            for (i, item) in items.iter().enumerate() {
                let mark = if *ordered {
                    format!("{}.", i + 1)
                } else {
                    "-".to_string()
                };
                o.push_str(&format!("{mark} {}\n", inlines(&item.text, false)));
                for c in item.children.iter().flatten() {
                    o.push_str(&format!("  - {}\n", inlines(c, false)));
                }
            }
        }
        Block::Table(t) => {
            o.push_str(&format!(
                "| {} |\n|{}\n",
                t.header.join(" | "),
                "---|".repeat(t.header.len())
            ));
            for r in &t.rows {
                let cells: Vec<String> = r.cells.iter().map(|c| inlines(&c.text, true)).collect();
                o.push_str(&format!("| {} |\n", cells.join(" | ")));
            }
        }
        Block::Pre { lang, text } => {
            o.push_str(&format!(
                "```{}\n{text}\n```\n",
                lang.as_deref().unwrap_or("")
            ));
        }
        Block::ExceptionLine { text } => o.push_str(&format!("`{}`\n", esc(text))),
        Block::Plots { plots } => {
            if plots.is_empty() {
                o.push_str("No plottable metric.\n");
            }
            for p in plots {
                o.push_str(&format!("![{}]({}) ([svg]({}))\n\n", p.title, p.png, p.svg));
            }
        }
        Block::Notes { .. } | Block::Only { .. } => blocks(std::slice::from_ref(b), o),
    }
}
