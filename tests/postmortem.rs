//! postmortem over the crash fixtures (fixtures/gen/make_crashes.py: an empty-array crash,
//! a NaN-gradient crash, a Metal OOM, a lone partial bundle) and the real corpus runs,
//! which did not crash.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use clap::Parser;
use rlforensics::postmortem::cli::{run, PostmortemArgs};
use rlforensics::postmortem::traceback::Origin;
use rlforensics::postmortem::{analyze, write_report, Options, Postmortem};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/runs")
        .join(p)
}

fn corpus(run: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/corpus/droid-finetuning")
        .join(run);
    p.is_dir().then_some(p)
}

fn pm(p: &str) -> Postmortem {
    analyze(&fixture(p), &Options::default()).unwrap()
}

fn args(v: &[&str]) -> PostmortemArgs {
    PostmortemArgs::try_parse_from(std::iter::once("postmortem").chain(v.iter().copied())).unwrap()
}

#[test]
fn empty_array_crash_is_classified_with_offending_rows() {
    let r = pm("20251009-091500");
    assert_eq!(r.status, "crashed");
    let c = r.crash.as_ref().unwrap();
    assert_eq!(c.classification.id, "empty-array");
    assert_eq!(c.step, Some(23));
    assert_eq!(c.bundle.as_deref(), Some("20251009-091612-step-0023"));
    assert_eq!(c.exception_type, "ValueError");
    assert_eq!(c.message, "[logsumexp] Received empty array.");
    let ctx = c.context.as_ref().unwrap();
    assert_eq!(ctx.empty_indices, vec![0, 2]);
    assert_eq!(ctx.token_counts, vec![0, 14, 0, 9]);
    assert_eq!(ctx.batch_indices, vec![0, 0, 1, 1]);
    let frames = &c.chain[0].frames;
    assert_eq!(frames.len(), 10);
    assert_eq!(frames[0].origin, Origin::Trainer);
    assert_eq!(frames[9].origin, Origin::Library);
    assert_eq!(frames[9].function, "log_softmax");
    let tf = c.trainer_frame.as_ref().unwrap();
    assert_eq!(
        (tf.function.as_str(), tf.line),
        ("debug_train_grpo", Some(731))
    );
    // logscan's findings over the whole run: empty completions from step 15 on.
    let empty = r
        .findings
        .iter()
        .find(|f| f.detector == "empty-completions")
        .unwrap();
    assert_eq!(empty.first_step, Some(15));
    let replay = r.replay.as_ref().unwrap();
    assert!(
        replay.command.contains(" --iters 23 "),
        "{}",
        replay.command
    );
    let fix = replay.fix_command.as_ref().unwrap();
    assert!(fix.contains("--importance-sampling-level sequence"));
    assert!(fix.contains("--debug-min-new-tokens 2"));
    assert!(!fix.contains("--debug-no-sequence-fallback"));
    assert_eq!(r.preflight.len(), 2);
    assert_eq!(r.preflight[0].empty_answer_indices, vec![17, 804]);
    assert!(r.diagnoses.is_empty(), "{:?}", r.diagnoses);
}

#[test]
fn nan_gradient_crash_keeps_nan_context_and_skips_cut_last_line() {
    let r = pm("20251009-130000");
    let c = r.crash.as_ref().unwrap();
    assert_eq!(c.classification.id, "nan-gradient");
    assert_eq!(c.step, Some(41));
    let ctx = c.context.as_ref().unwrap();
    assert!(ctx.grad_norm.unwrap().is_nan());
    assert!(ctx.raw_loss.unwrap().is_nan());
    assert_eq!(ctx.grad_nan_count, Some(1536));
    assert!(ctx.empty_indices.is_empty());
    assert_eq!(c.extra.as_ref().unwrap()["optimizer_state_nan"], true);
    // recent_steps.jsonl: steps 9..=40, the line of step 40 cut mid-write.
    assert_eq!(r.last_steps.source, "recent_steps.jsonl");
    let steps: Vec<i64> = r.last_steps.rows.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (30..=39).collect::<Vec<_>>());
    assert!(
        r.data_notes
            .iter()
            .any(|n| n.contains("recent_steps.jsonl: line 32: truncated last line")),
        "{:?}",
        r.data_notes
    );
    let nan = r
        .findings
        .iter()
        .find(|f| f.detector == "nan-grad")
        .unwrap();
    assert_eq!(nan.steps, vec![41]);
    // NaN survives into summary.json as a string, JSON has no NaN.
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["crash"]["context"]["grad_norm"], "NaN");
    assert_eq!(v["crash"]["context"]["metrics"]["kl"], "NaN");
}

#[test]
fn oom_crash_is_classified_and_memory_growth_found() {
    let r = pm("20251009-160000");
    let c = r.crash.as_ref().unwrap();
    assert_eq!(c.classification.id, "oom");
    assert_eq!(c.step, Some(57));
    assert_eq!(c.missing_files, vec!["extra.json"]);
    assert_eq!(c.context.as_ref().unwrap().batch_indices.len(), 64);
    let mem = r
        .findings
        .iter()
        .find(|f| f.detector == "mem-growth")
        .unwrap();
    assert_eq!((mem.first_step, mem.last_step), (Some(1), Some(56)));
    assert!(r
        .replay
        .as_ref()
        .unwrap()
        .fix_command
        .as_ref()
        .unwrap()
        .contains("--batch-size 4"));
}

#[test]
fn partial_bundle_alone_is_shown_plainly_as_unknown() {
    let r = pm("partial_bundle/20251009-170000-step-0005");
    assert_eq!(r.run.kind, "bundle");
    let c = r.crash.as_ref().unwrap();
    assert_eq!(c.classification.id, "unknown");
    assert!(c.classification.fixes.is_empty());
    assert_eq!(c.step, Some(5)); // from the folder name: no context.json
    assert_eq!(c.chain.len(), 2);
    assert_eq!(c.chain[0].exc_type, "KeyError");
    assert_eq!(c.chain[0].leads_to.as_deref(), Some("cause"));
    assert_eq!(c.exception_type, "RuntimeError");
    assert_eq!(
        c.missing_files,
        vec!["context.json", "recent_steps.jsonl", "extra.json"]
    );
    assert!(c.context.is_none());
    assert!(r.findings.is_empty());
    assert!(r.replay.is_none());
    let dir = tempfile::tempdir().unwrap();
    let w = write_report(&r, dir.path()).unwrap();
    assert!(w.dir.join("report.html").is_file());
    let md = std::fs::read_to_string(w.dir.join("report.md")).unwrap();
    assert!(md.contains("Unrecognised exception"));
}

/// Tag balance of the generated HTML: every opened element is closed in order.
fn check_well_formed(html: &str) -> Result<usize, String> {
    const VOID: &[&str] = &["meta", "img", "br", "hr", "link", "input"];
    let mut stack: Vec<String> = Vec::new();
    let mut count = 0;
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        let after = &rest[i + 1..];
        let end = after.find('>').ok_or("unclosed <")?;
        let tag = &after[..end];
        rest = &after[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        count += 1;
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if tag.starts_with('/') {
            let top = stack.pop().ok_or(format!("</{name}> with nothing open"))?;
            if top != name {
                return Err(format!("</{name}> closes <{top}>"));
            }
        } else if !VOID.contains(&name.as_str()) && !tag.ends_with('/') {
            stack.push(name);
        }
    }
    if stack.is_empty() {
        Ok(count)
    } else {
        Err(format!("left open: {stack:?}"))
    }
}

#[test]
fn html_parses_and_embeds_every_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&args(&[
        fixture("20251009-130000").to_str().unwrap(),
        "--output",
        dir.path().to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(out.code, 1);
    let rd = dir.path().join("20251009-130000");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rd.join("summary.json")).unwrap()).unwrap();
    let keys: Vec<&str> = summary["plots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "loss",
            "reward",
            "grad_norm",
            "kl",
            "completion_len",
            "step_time",
            "memory"
        ]
    );
    let html = std::fs::read_to_string(rd.join("report.html")).unwrap();
    check_well_formed(&html).unwrap();
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(!html.contains("<script"));
    let b64 = base64::engine::general_purpose::STANDARD;
    for p in summary["plots"].as_array().unwrap() {
        let png = std::fs::read(rd.join(p["png"].as_str().unwrap())).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(rd.join(p["svg"].as_str().unwrap())).unwrap();
        assert!(svg.contains("<svg"));
        assert!(html.contains(&format!("id=\"plot-{}\"", p["key"].as_str().unwrap())));
        assert!(html.contains(&format!("data:image/png;base64,{}", b64.encode(&png))));
    }
    // The crash is marked on the plots, and the grad-norm panel marks the nan-grad finding.
    let g = std::fs::read_to_string(rd.join("plot-grad_norm.svg")).unwrap();
    assert!(g.contains("crash (step 41)") && g.contains("nan-grad"));
    let md = std::fs::read_to_string(rd.join("report.md")).unwrap();
    for p in &keys {
        assert!(md.contains(&format!("(plot-{p}.png)")));
    }
}

#[test]
fn corpus_run_without_failures_still_gets_a_report() {
    let Some(p) = corpus("20251008-110028") else {
        eprintln!("corpus not present: skipped");
        return;
    };
    let r = analyze(&p, &Options::default()).unwrap();
    assert_eq!(r.status, "completed");
    assert!(r.crash.is_none());
    assert_eq!(r.last_step, Some(200));
    assert_eq!(r.diagnoses.len(), 1);
    assert_eq!(r.diagnoses[0].id, "chat-template");
    let dets: Vec<&str> = r.findings.iter().map(|f| f.detector.as_str()).collect();
    assert_eq!(
        dets,
        ["empty-completions", "zero-loss", "dead-groups", "plateau"]
    );
    let dir = tempfile::tempdir().unwrap();
    let ps = p.to_str().unwrap();
    let out = run(&args(&[ps, "--output", dir.path().to_str().unwrap()])).unwrap();
    assert_eq!(out.code, 0);
    let rd = dir.path().join("20251008-110028");
    for f in [
        "report.md",
        "report.html",
        "summary.json",
        "plot-loss.png",
        "plot-reward.svg",
    ] {
        assert!(rd.join(f).is_file(), "{f}");
    }
    let fail = run(&args(&[
        ps,
        "--output",
        dir.path().to_str().unwrap(),
        "--fail-on",
        "error",
    ]))
    .unwrap();
    assert_eq!(fail.code, 1);
    if let Some(p2) = corpus("20251008-102227") {
        let r2 = analyze(&p2, &Options::default()).unwrap();
        assert_eq!((r2.status, r2.last_step), ("incomplete", Some(20)));
    }
}

#[test]
fn corrupt_context_json_names_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("20251009-000000-step-0003");
    std::fs::create_dir(&b).unwrap();
    std::fs::write(b.join("exception.txt"), "ValueError: x\n").unwrap();
    std::fs::write(
        b.join("context.json"),
        "{\n  \"current_step\": 3,\n  \"token_counts\": [1, \n",
    )
    .unwrap();
    let e = analyze(&b, &Options::default()).unwrap_err().to_string();
    assert!(e.contains("context.json") && e.contains("line 4"), "{e}");
}

#[test]
fn binary_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    assert_cmd::Command::cargo_bin("postmortem")
        .unwrap()
        .args([
            fixture("20251009-091500").to_str().unwrap(),
            "--output",
            out,
        ])
        .assert()
        .code(1)
        .stdout(predicates::str::contains("Crashed at step 23"));
    assert_cmd::Command::cargo_bin("postmortem")
        .unwrap()
        .args(["/nonexistent/run", "--output", out])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("/nonexistent/run"));
}
