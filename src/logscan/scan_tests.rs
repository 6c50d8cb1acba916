//! Tests of the streaming reader (`scan.rs`).

use super::*;
use crate::logs::aliases::AliasTable;

/// Everything a read produced, as text: file statistics, steps, every canonical and
/// raw column, events.
fn read_all(paths: &[PathBuf], chunk: usize) -> String {
    let Ok(aliases) = AliasTable::builtin() else {
        panic!("built-in alias table");
    };
    let mut c = Collected::new(FrameBuilder::new(aliases, true));
    c.chunk_bytes = chunk;
    for p in paths {
        if let Err(e) = c.read_file(p) {
            panic!("{}: {e}", p.display());
        }
    }
    let files = serde_json::to_string(&c.files).unwrap_or_default();
    let f = c.builder.finish();
    let cols: Vec<_> = f.metrics().iter().map(|m| (m, f.series(m))).collect();
    let raw: Vec<_> = f
        .raw_names()
        .map(|n| (n, f.raw(n).map(|c| c.iter().collect::<Vec<_>>())))
        .collect();
    format!(
        "{files}\n{:?}\n{cols:?}\n{raw:?}\n{:?}",
        f.steps().to_vec(),
        c.events
    )
}

#[test]
fn chunk_size_changes_nothing_long_lines_and_cut_last_line_included() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let long = format!(
        "{{\"step\": 3, \"train_loss\": 0.5, \"note\": \"{}\"}}",
        "x".repeat(300)
    );
    let jsonl = dir.path().join("steps.jsonl");
    let body = [
        r#"{"step": 1, "train_loss": 0.25, "grad_norm": NaN, "metrics": {"kl": 0.1}}"#,
        "",
        r#"{"event": "nan_gradient", "step": 2, "nan_count": 3, "grad_norm": NaN}"#,
        &long,
        "not json",
        r#"{"step": 2, "train_loss": 0.0, "lr": "1e-05", "x": "caf\u00e9"}"#,
        r#"{"step": 4, "train_loss": 0.1, "grad_norm": 1.5}"#,
        r#"{"step": 5, "train_lo"#,
    ]
    .join("\n");
    std::fs::write(&jsonl, body).unwrap_or_else(|e| panic!("write: {e}"));
    let logs = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs");
    let inputs = [
        vec![jsonl],
        vec![
            logs.join("debug_faults/events.jsonl"),
            logs.join("debug_faults/steps.jsonl"),
        ],
        vec![logs.join("text/nanogpt_seed.log")],
        vec![logs.join("text/verl_console.log")],
    ];
    for paths in &inputs {
        let whole = read_all(paths, CHUNK_BYTES);
        for chunk in [1, 2, 7, 64, 300, 4096] {
            assert_eq!(
                read_all(paths, chunk),
                whole,
                "{paths:?} in {chunk}-byte chunks"
            );
        }
    }
    let first = read_all(&inputs[0], 5);
    assert!(first.contains("\"truncated_last_line\":true"), "{first}");
    assert!(first.contains("[1, 2, 3, 4]"), "{first}");
}

#[test]
fn lines_split_like_the_file_reads() {
    assert_eq!(split_lines(b""), Vec::<&[u8]>::new());
    assert_eq!(split_lines(b"a\n\nb"), vec![&b"a"[..], b"", b"b"]);
    assert_eq!(split_lines(b"a\n"), vec![&b"a"[..]]);
    assert_eq!(split_lines(b"\n"), vec![&b""[..]]);
}
