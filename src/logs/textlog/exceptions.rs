//! Python tracebacks in a console log, as CPython's `traceback.print_exception` writes
//! them: a `Traceback (most recent call last):` line, frames indented by two spaces, and
//! the exception line at column 0 that ends the block (`torch.OutOfMemoryError: CUDA out
//! of memory. …`). Lines may carry a Ray actor prefix (`(TaskRunner pid=1) `) or torchrun's
//! rank prefix (`[rank0]: `); the exception line is recognised only when its name is a
//! dotted identifier ending like Python's exception classes, and is an event only right
//! after a traceback (the assembler keeps that state).

use super::TextItem;

/// Messages that end a process by themselves, with no Python traceback before them:
/// torch's NCCL watchdog (`ProcessGroupNCCL.cpp`: `[Rank 3] Watchdog caught collective
/// operation timeout: WorkNCCL(…) ran for 600021 milliseconds before timing out.`),
/// libstdc++'s `terminate called after throwing an instance of 'c10::DistBackendError'`,
/// CPython's faulthandler (`Fatal Python error: Segmentation fault`) and Ray's `(raylet) A
/// worker died or was killed while executing a task by an unexpected system error`.
const FATAL: &[&str] = &[
    "Watchdog caught collective operation timeout",
    "Watchdog caught collective operati",
    "terminate called after throwing an instance of",
    "Fatal Python error:",
    "A worker died or was killed while executing a task",
];

/// A line holding one of the [`FATAL`] messages: the text from the message on (the log
/// header before it, `[rank5]:[E602 11:17:52.185 ProcessGroupNCCL.cpp:632] [Rank 5] `,
/// dropped), else `None`.
pub(super) fn parse_fatal(line: &str) -> Option<String> {
    let at = FATAL.iter().find_map(|m| line.find(m))?;
    Some(line[at..].trim_end().chars().take(MAX_TEXT).collect())
}

/// CPython's first line of a traceback.
const TRACEBACK: &str = "Traceback (most recent call last):";

/// Longest exception text kept (the first line of the message).
const MAX_TEXT: usize = 300;

/// `line` without a Ray actor prefix `(Name pid=N) ` or a torchrun prefix `[rankN]: `.
fn without_prefix(line: &str) -> &str {
    if let Some(rest) = line.strip_prefix('(') {
        if let Some(end) = rest.find(") ") {
            if rest[..end].contains("pid=") {
                return &rest[end + 2..];
            }
        }
    }
    if let Some(rest) = line.strip_prefix("[rank") {
        if let Some(end) = rest.find("]:") {
            if rest[..end].bytes().all(|b| b.is_ascii_digit()) {
                let body = &rest[end + 2..];
                return body.strip_prefix(' ').unwrap_or(body);
            }
        }
    }
    line
}

/// A dotted Python identifier whose last part is named like an exception class
/// (`RuntimeError`, `torch.OutOfMemoryError`, `KeyboardInterrupt`, `SystemExit`, …).
fn is_exception_name(name: &str) -> bool {
    let ident = |p: &str| {
        p.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let last = name.rsplit('.').next().unwrap_or(name);
    let suffixes = ["Error", "Exception", "Interrupt", "Exit", "Failure"];
    name.split('.').all(ident)
        && (suffixes.iter().any(|s| last.ends_with(s)) || last == "StopIteration")
        // a bare `Error:` is how many tools start a message; Python's base class is
        // `Exception`
        && !(suffixes.contains(&last) && last != "Exception")
}

/// The traceback start or an exception line, else `None`. `line` is untrimmed: the
/// exception line must start at column 0 (after a prefix), frames are indented.
pub(super) fn parse_traceback(line: &str) -> Option<TextItem> {
    let body = without_prefix(line.trim_end());
    if body.trim() == TRACEBACK {
        return Some(TextItem::TracebackStart);
    }
    if body.starts_with(char::is_whitespace) {
        return None;
    }
    let name = body.split_once(':').map_or(body, |(n, _)| n);
    is_exception_name(name).then(|| TextItem::Exception(body.chars().take(MAX_TEXT).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatal_messages_without_a_traceback() {
        let nccl = "[rank5]:[E602 11:17:52.185053341 ProcessGroupNCCL.cpp:632] [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1892, OpType=ALLREDUCE) ran for 600034 milliseconds before timing out.";
        assert!(parse_fatal(nccl)
            .unwrap()
            .starts_with("Watchdog caught collective operation timeout: WorkNCCL"));
        assert_eq!(
            parse_fatal("(raylet) A worker died or was killed while executing a task by an unexpected system error.").as_deref(),
            Some("A worker died or was killed while executing a task by an unexpected system error.")
        );
        for l in [
            "step:3 - actor/pg_loss:0.1",
            "NCCL INFO Channel 00/02",
            "watchdog thread started",
        ] {
            assert_eq!(parse_fatal(l), None, "{l}");
        }
    }

    #[test]
    fn traceback_lines_with_and_without_prefixes() {
        for l in [
            "Traceback (most recent call last):",
            "(TaskRunner pid=2841) Traceback (most recent call last):",
            "[rank3]: Traceback (most recent call last):",
        ] {
            assert_eq!(parse_traceback(l), Some(TextItem::TracebackStart), "{l}");
        }
        let oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert_eq!(
            parse_traceback(&format!("[rank0]: {oom}")),
            Some(TextItem::Exception(oom.into()))
        );
        assert_eq!(
            parse_traceback("(WorkerDict pid=77) RuntimeError: NCCL error"),
            Some(TextItem::Exception("RuntimeError: NCCL error".into()))
        );
        assert_eq!(
            parse_traceback("KeyboardInterrupt"),
            Some(TextItem::Exception("KeyboardInterrupt".into()))
        );
        // frames, code, other text: not exception lines
        for l in [
            "  File \"train.py\", line 3, in <module>",
            "    raise RuntimeError(\"x\")",
            "  RuntimeError: indented",
            "Error: something",
            "ValueErrors are common: no",
            "step:3 - actor/pg_loss:0.1",
            "WARNING: All advantages are near zero!",
        ] {
            assert_eq!(parse_traceback(l), None, "{l}");
        }
    }
}
