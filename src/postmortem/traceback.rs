//! Python tracebacks as `traceback.format_exception` writes them: the frame chain, the
//! exception type and message, chained exceptions ("During handling of the above
//! exception…", "The above exception was the direct cause…"), and which frames are the
//! trainer's own code and which are library or standard-library code.

/// Who owns the code of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The trainer's own code (anything outside site-packages and the standard library).
    Trainer,
    /// An installed package (`site-packages`, `dist-packages`).
    Library,
    /// Python's standard library or interpreter internals (`<frozen …>`).
    Stdlib,
}

impl Origin {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Trainer => "trainer",
            Origin::Library => "library",
            Origin::Stdlib => "stdlib",
        }
    }

    /// Classify a frame's file path.
    pub fn of_path(path: &str) -> Origin {
        let p = path.replace('\\', "/");
        if p.contains("/site-packages/") || p.contains("/dist-packages/") {
            Origin::Library
        } else if p.starts_with('<')
            || p.contains("/lib/python3")
            || p.contains("/lib/python2")
            || p.contains("/Lib/")
        {
            Origin::Stdlib
        } else {
            Origin::Trainer
        }
    }
}

/// One `File "…", line N, in f` entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Frame {
    /// Source file as written in the traceback.
    pub file: String,
    /// 1-based line number.
    pub line: Option<u64>,
    /// Function name (`<module>`, `<lambda>` included).
    pub function: String,
    /// The source line shown under the frame, when shown.
    pub code: Option<String>,
    /// Trainer, library or standard library.
    pub origin: Origin,
}

/// One exception of a chain, with the frames that led to it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ExceptionBlock {
    /// Frames, outermost first (the order Python prints them).
    pub frames: Vec<Frame>,
    /// Exception type as printed (`ValueError`, `torch.OutOfMemoryError`).
    pub exc_type: String,
    /// The message (possibly several lines; empty when the exception had none).
    pub message: String,
    /// How this exception relates to the next one in the chain: `cause` ("direct cause"),
    /// `context` ("during handling"), or `None` for the last exception.
    pub leads_to: Option<String>,
}

impl ExceptionBlock {
    /// The innermost frame that is the trainer's own code.
    pub fn last_trainer_frame(&self) -> Option<&Frame> {
        self.frames
            .iter()
            .rev()
            .find(|f| f.origin == Origin::Trainer)
    }
}

/// A parsed traceback: every exception of the chain, the one that ended the process last.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Traceback {
    /// Exceptions in printed order; the last one is what the process died of.
    pub chain: Vec<ExceptionBlock>,
}

impl Traceback {
    /// The exception the process died of.
    pub fn last(&self) -> Option<&ExceptionBlock> {
        self.chain.last()
    }

    /// Every exception type and message of the chain, `Type: message` per line (what the
    /// classifier matches against).
    pub fn signature_text(&self) -> String {
        self.chain
            .iter()
            .map(|b| format!("{}: {}", b.exc_type, b.message))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

const HEADER: &str = "Traceback (most recent call last):";
const CAUSE: &str = "The above exception was the direct cause of the following exception:";
const CONTEXT: &str = "During handling of the above exception, another exception occurred:";

/// Parse `text` (the content of `exception.txt`). Returns `None` when no traceback header
/// or exception line can be found; never fails on odd input.
pub fn parse(text: &str) -> Option<Traceback> {
    let lines: Vec<&str> = text.lines().collect();
    let mut chain: Vec<ExceptionBlock> = Vec::new();
    let mut i = 0;
    // Text before the first header (a bare `Type: message` with no traceback) is one block.
    while i < lines.len() {
        let line = lines[i];
        if line.trim_end() == HEADER {
            i += 1;
            let mut frames = Vec::new();
            while i < lines.len() {
                let l = lines[i];
                if let Some(f) = parse_frame_line(l) {
                    let mut frame = f;
                    i += 1;
                    // Source line, then optional caret/tilde marker lines (Python ≥ 3.11).
                    if i < lines.len() && is_code_line(lines[i]) {
                        frame.code = Some(lines[i].trim().to_string());
                        i += 1;
                        while i < lines.len() && is_marker_line(lines[i]) {
                            i += 1;
                        }
                    }
                    frames.push(frame);
                } else if l.starts_with("    ")
                    || l.trim_start().starts_with("[Previous line repeated")
                {
                    i += 1; // stray indented line (locals, repeats)
                } else {
                    break;
                }
            }
            let (block, next) = parse_exception_lines(&lines, i, frames);
            chain.push(block);
            i = next;
        } else if line.trim() == CAUSE || line.trim() == CONTEXT {
            if let Some(prev) = chain.last_mut() {
                prev.leads_to = Some(
                    if line.trim() == CAUSE {
                        "cause"
                    } else {
                        "context"
                    }
                    .into(),
                );
            }
            i += 1;
        } else if chain.is_empty() && looks_like_exception_line(line) {
            let (block, next) = parse_exception_lines(&lines, i, Vec::new());
            chain.push(block);
            i = next;
        } else {
            i += 1;
        }
    }
    (!chain.is_empty()).then_some(Traceback { chain })
}

/// The exception line at `start` and its continuation lines, up to the next chain marker
/// or header. Returns the block and the index after it.
fn parse_exception_lines(
    lines: &[&str],
    start: usize,
    frames: Vec<Frame>,
) -> (ExceptionBlock, usize) {
    let mut i = start;
    let mut text: Vec<&str> = Vec::new();
    while i < lines.len() {
        let t = lines[i].trim_end();
        if t == HEADER || t.trim() == CAUSE || t.trim() == CONTEXT {
            break;
        }
        text.push(lines[i]);
        i += 1;
    }
    while text.last().is_some_and(|l| l.trim().is_empty()) {
        text.pop();
    }
    let first = text.first().copied().unwrap_or("");
    let (exc_type, first_msg) = match first.split_once(": ") {
        Some((t, m)) if is_type_name(t) => (t.to_string(), m.to_string()),
        _ if is_type_name(first.trim().trim_end_matches(':')) => (
            first.trim().trim_end_matches(':').to_string(),
            String::new(),
        ),
        _ => ("<unparsed>".to_string(), first.to_string()),
    };
    let mut message = first_msg;
    for l in text.iter().skip(1) {
        message.push('\n');
        message.push_str(l);
    }
    (
        ExceptionBlock {
            frames,
            exc_type,
            message,
            leads_to: None,
        },
        i,
    )
}

/// `  File "path", line 12, in func`.
fn parse_frame_line(l: &str) -> Option<Frame> {
    let rest = l.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once('"')?;
    let mut line = None;
    let mut function = String::new();
    for part in rest.split(", ").map(str::trim) {
        if let Some(n) = part.strip_prefix("line ") {
            line = n.trim().parse().ok();
        } else if let Some(f) = part.strip_prefix("in ") {
            function = f.trim().to_string();
        }
    }
    Some(Frame {
        file: file.to_string(),
        line,
        function,
        code: None,
        origin: Origin::of_path(file),
    })
}

fn is_code_line(l: &str) -> bool {
    l.starts_with("    ") && !l.trim_start().starts_with("File \"") && !is_marker_line(l)
}

fn is_marker_line(l: &str) -> bool {
    let t = l.trim();
    !t.is_empty() && t.chars().all(|c| matches!(c, '^' | '~' | ' '))
}

/// `ValueError`, `torch.OutOfMemoryError`, `mlx.core.ValueError`.
fn is_type_name(t: &str) -> bool {
    !t.is_empty()
        && t.split('.').all(|p| {
            let mut cs = p.chars();
            cs.next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && cs.all(|c| c.is_alphanumeric() || c == '_')
        })
}

fn looks_like_exception_line(l: &str) -> bool {
    l.split_once(": ").is_some_and(|(t, _)| {
        is_type_name(t)
            && t.rsplit('.')
                .next()
                .is_some_and(|n| n.ends_with("Error") || n.ends_with("Exception"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_type_and_message_are_read() {
        let t = "Traceback (most recent call last):\n  File \"/home/u/train.py\", line 10, in main\n    run()\n  File \"/v/lib/python3.11/site-packages/mlx/nn/layers/activations.py\", line 26, in log_softmax\n    return x - mx.logsumexp(x)\n               ^^^^^^^^^^^^^^^\nValueError: [logsumexp] Received empty array.\n";
        let tb = parse(t).unwrap();
        let b = tb.last().unwrap();
        assert_eq!(b.exc_type, "ValueError");
        assert_eq!(b.message, "[logsumexp] Received empty array.");
        assert_eq!(b.frames.len(), 2);
        assert_eq!(b.frames[0].origin, Origin::Trainer);
        assert_eq!(b.frames[0].line, Some(10));
        assert_eq!(b.frames[1].origin, Origin::Library);
        assert_eq!(
            b.frames[1].code.as_deref(),
            Some("return x - mx.logsumexp(x)")
        );
        assert_eq!(
            b.last_trainer_frame().map(|f| f.function.as_str()),
            Some("main")
        );
    }

    #[test]
    fn chained_exceptions_keep_order_and_relation() {
        let t = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    x[\"k\"]\nKeyError: 'k'\n\nThe above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n  File \"a.py\", line 3, in g\n    raise RuntimeError(\"bad\") from e\nRuntimeError: bad\nsecond line\n";
        let tb = parse(t).unwrap();
        assert_eq!(tb.chain.len(), 2);
        assert_eq!(tb.chain[0].exc_type, "KeyError");
        assert_eq!(tb.chain[0].leads_to.as_deref(), Some("cause"));
        assert_eq!(tb.chain[1].message, "bad\nsecond line");
    }

    #[test]
    fn garbage_is_none_and_bare_exception_line_is_read() {
        assert_eq!(parse("hello\nworld\n"), None);
        let tb = parse("torch.OutOfMemoryError: CUDA out of memory.\n").unwrap();
        assert_eq!(tb.chain[0].exc_type, "torch.OutOfMemoryError");
        assert!(tb.chain[0].frames.is_empty());
    }
}
