//! postmortem over the crash fixtures (fixtures/gen/make_crashes.py: an empty-array crash,
//! a NaN-gradient crash, a Metal OOM, a lone partial bundle) and the real corpus runs,
//! which did not crash.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use clap::Parser;
use rlforensics::cli::postmortem::{run, PostmortemArgs};
use rlforensics::postmortem::traceback::Origin;
use rlforensics::postmortem::{analyze, Options, Postmortem};
use rlforensics::render::postmortem::write_report;

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/runs")
        .join(p)
}

fn corpus(run: &str) -> Option<PathBuf> {
    crate::corpus::corpus(&format!("droid-finetuning/{run}"))
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
    let rd = dir.path(); // --output DIR is written into itself
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
    let rd = dir.path(); // --output DIR is written into itself
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

// ---- --dumps DIR --step N -------------------------------------------------------------

fn dumps(tree: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dumps")
        .join(tree)
        .to_str()
        .unwrap()
        .to_string()
}

/// Run the CLI into a fresh folder; the exit code, summary.json, report.md, report.html.
fn run_dumps(run_dir: &Path, extra: &[&str]) -> (u8, serde_json::Value, String, String) {
    let out = tempfile::tempdir().unwrap();
    let mut v = vec![
        run_dir.to_str().unwrap(),
        "--output",
        out.path().to_str().unwrap(),
    ];
    v.extend_from_slice(extra);
    let r = run(&args(&v)).unwrap();
    let rd = out.path(); // --output DIR is written into itself
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rd.join("summary.json")).unwrap()).unwrap();
    let md = std::fs::read_to_string(rd.join("report.md")).unwrap();
    let html = std::fs::read_to_string(rd.join("report.html")).unwrap();
    (r.code, summary, md, html)
}

/// A run folder that did not crash: three healthy steps, nothing else.
fn healthy_run(dir: &Path) -> PathBuf {
    let run = dir.join("20251010-080000");
    std::fs::create_dir(&run).unwrap();
    let lines: String = (1..=3)
        .map(|s| format!("{{\"step\": {s}, \"train_loss\": 0.5, \"grad_norm\": 1.0}}\n"))
        .collect();
    std::fs::write(run.join("steps.jsonl"), lines).unwrap();
    run
}

#[test]
fn dumps_faulty_weaver_names_both_cells_in_the_report() {
    let sh = dumps("self_hosted_pt");
    let wf = dumps("weaver_faulty_pt");
    let (code, s, md, html) = run_dumps(
        &fixture("20251009-091500"),
        &["--dumps", &sh, "--dumps", &wf, "--step", "0"],
    );
    assert_eq!(code, 1);
    assert_eq!(s["schema_version"], 1);
    assert_eq!(s["status"], "crashed");
    let d = &s["dumps"];
    assert_eq!(d["mode"], "dumpdiff");
    assert_eq!(d["step"], 0);
    assert_eq!(d["preset"], "nexrl-is");
    assert_eq!(d["verdict"], "fail");
    assert_eq!(d["failed"], true);
    let producers: Vec<&str> = d["trees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["producer"].as_str().unwrap())
        .collect();
    assert_eq!(producers, ["self-hosted", "weaver"]);
    let dd = &d["dumpdiff"];
    let adj: Vec<(u64, u64, &str)> = dd["adjudication"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["rank"].as_u64().unwrap(),
                a["micro"].as_u64().unwrap(),
                a["conclusion"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(adj.len(), 2, "{adj:?}");
    assert_eq!((adj[0].0, adj[0].1), (3, 1));
    assert_eq!((adj[1].0, adj[1].1), (5, 0));
    for (_, _, c) in &adj {
        assert!(
            c.starts_with("weaver loss disagrees with its own inputs"),
            "{c}"
        );
    }
    let first = &dd["first_divergence"];
    assert_eq!(first["name"], "is_loss.prob_ratio");
    assert_eq!(
        (first["rank"].as_u64(), first["micro"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(
        (first["row"].as_u64(), first["pos"].as_u64()),
        (Some(0), Some(1))
    );
    assert!(!dd["worst"].as_array().unwrap().is_empty());
    // Rank 10 is missing on the weaver side: one side only, and a column of the grid.
    let cov = dd["coverage"].as_array().unwrap();
    assert!(!cov.is_empty());
    assert!(cov
        .iter()
        .all(|c| c["rank"] == 10 && c["present_on"] == "self-hosted"));
    assert_eq!(dd["ranks"].as_array().unwrap().len(), 12);
    let loss_row = dd["grid"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "loss")
        .unwrap();
    assert_eq!(loss_row["by_rank"][3], "✓✗");
    assert_eq!(loss_row["by_rank"][5], "✗✓");
    // The report says it, in markdown and HTML.
    assert!(md.contains("## Training-step dumps"), "{md}");
    assert!(md.contains("**Step 0: FAIL**"));
    for cell in ["rank 3 micro 1", "rank 5 micro 0"] {
        assert!(
            md.contains(&format!(
                "{cell} (`nexrl-is`): **weaver loss disagrees with its own inputs"
            )),
            "{cell}\n{md}"
        );
        assert!(html.contains(cell));
    }
    assert!(md.contains("| 3 loss |"));
    assert!(md.contains("**First divergence:** is_loss.prob_ratio at rank 3 micro 1 row 0 pos 1"));
    assert!(md.contains("`forward_data` rank 10 micro 0: on self-hosted only"));
    assert!(md.contains("exit 1"));
    check_well_formed(&html).unwrap();
    assert!(html.contains("<h2 id=\"dumps\">Training-step dumps</h2>"));
    assert!(html.contains("weaver loss disagrees with its own inputs"));
    // What to do names the cells too.
    let recs: Vec<&str> = s["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        recs.iter()
            .any(|r| r.contains("rank 3 micro 1") && r.contains("rank 5 micro 0")),
        "{recs:?}"
    );
}

#[test]
fn dumps_clean_weaver_passes_and_leaves_the_exit_code_alone() {
    let sh = dumps("self_hosted_pt");
    let clean = dumps("weaver_pt");
    let faulty = dumps("weaver_faulty_pt");
    // A crashed run stays exit 1, with a PASS for its dumps.
    let (code, s, md, _) = run_dumps(
        &fixture("20251009-091500"),
        &["--dumps", &sh, "--dumps", &clean, "--step", "0"],
    );
    assert_eq!(code, 1);
    assert_eq!(s["dumps"]["verdict"], "pass");
    assert_eq!(s["dumps"]["failed"], false);
    assert!(s["dumps"]["dumpdiff"]["adjudication"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(s["dumps"]["dumpdiff"]["first_divergence"].is_null());
    assert!(md.contains("**Step 0: PASS**"), "{md}");
    assert!(!md.contains("exit 1"));
    // A run that did not crash: 0 without dumps, 0 with clean dumps, 1 with faulty ones.
    let tmp = tempfile::tempdir().unwrap();
    let healthy = healthy_run(tmp.path());
    let (code, s, md, html) = run_dumps(&healthy, &[]);
    assert_eq!(code, 0);
    assert!(s.get("dumps").is_none(), "no dumps object without --dumps");
    assert!(!md.contains("Training-step dumps") && !html.contains("Training-step dumps"));
    let (code, s, _, _) = run_dumps(
        &healthy,
        &["--dumps", &sh, "--dumps", &clean, "--step", "0"],
    );
    assert_eq!(code, 0);
    assert_eq!(s["dumps"]["verdict"], "pass");
    let (code, s, _, _) = run_dumps(
        &healthy,
        &["--dumps", &sh, "--dumps", &faulty, "--step", "0"],
    );
    assert_eq!(code, 1);
    assert_eq!(s["dumps"]["verdict"], "fail");
}

#[test]
fn dumps_single_tree_is_checked_by_losscheck() {
    let tmp = tempfile::tempdir().unwrap();
    let healthy = healthy_run(tmp.path());
    let wf = dumps("weaver_faulty_pt");
    let (code, s, md, html) = run_dumps(&healthy, &["--dumps", &wf, "--step", "0"]);
    assert_eq!(code, 1);
    let d = &s["dumps"];
    assert_eq!(d["mode"], "losscheck");
    assert_eq!(d["verdict"], "fail");
    assert!(d["dumpdiff"].is_null());
    let cells = d["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 22, "12 ranks x 2 micros, rank 10 missing");
    let bad: Vec<(u64, u64)> = cells
        .iter()
        .filter(|c| c["status"] != "consistent")
        .map(|c| (c["rank"].as_u64().unwrap(), c["micro"].as_u64().unwrap()))
        .collect();
    assert_eq!(bad, [(3, 1), (5, 0)]);
    let r3 = cells
        .iter()
        .find(|c| c["rank"] == 3 && c["micro"] == 1)
        .unwrap();
    assert_eq!(r3["status"], "inconsistent");
    assert_eq!(r3["first_divergence"]["name"], "prob_ratio");
    assert_eq!(
        (
            r3["first_divergence"]["row"].as_u64(),
            r3["first_divergence"]["pos"].as_u64()
        ),
        (Some(0), Some(1))
    );
    let r5 = cells
        .iter()
        .find(|c| c["rank"] == 5 && c["micro"] == 0)
        .unwrap();
    assert!(
        r5["line"].as_str().unwrap().contains("a sum, not a mean"),
        "{}",
        r5["line"]
    );
    // The verdict lines: exactly those two cells are listed as not self-consistent.
    let listed: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("- rank ") && l.contains("≠ recomputed"))
        .collect();
    assert_eq!(listed.len(), 2, "{md}");
    assert!(
        listed[0].starts_with("- rank 3 micro 1 ")
            && listed[0].contains("first divergent intermediate: prob_ratio at row 0 pos 1")
    );
    assert!(listed[1].starts_with("- rank 5 micro 0 "));
    assert!(md.contains("| 0 | 0 | consistent |"));
    assert!(d["headline"]
        .as_str()
        .unwrap()
        .contains("2 of 22 rank/micro cells are not self-consistent"));
    check_well_formed(&html).unwrap();
    assert!(html.contains("<td class=\"sev-error\">inconsistent</td>"));
    // A self-hosted tree alone is checked in its own layout, and is consistent.
    let (code, s, _, _) = run_dumps(
        &healthy,
        &["--dumps", &dumps("self_hosted_pt"), "--step", "0"],
    );
    assert_eq!(code, 0);
    assert_eq!(s["dumps"]["verdict"], "pass");
    assert_eq!(s["dumps"]["cells"].as_array().unwrap().len(), 24);
}

#[cfg(unix)]
#[test]
fn dumps_folder_of_trees_is_compared() {
    // One --dumps folder holding self_hosted/ and weaver/ children.
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("debug_dumps");
    std::fs::create_dir(&parent).unwrap();
    std::os::unix::fs::symlink(dumps("self_hosted_pt"), parent.join("self_hosted")).unwrap();
    std::os::unix::fs::symlink(dumps("weaver_faulty_pt"), parent.join("weaver")).unwrap();
    let healthy = healthy_run(tmp.path());
    let (code, s, _, _) = run_dumps(
        &healthy,
        &["--dumps", parent.to_str().unwrap(), "--step", "0"],
    );
    assert_eq!(code, 1);
    assert_eq!(s["dumps"]["mode"], "dumpdiff");
    assert_eq!(
        s["dumps"]["dumpdiff"]["adjudication"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn dumps_bad_input_exits_2_naming_the_path() {
    let out = tempfile::tempdir().unwrap();
    let out = out.path().to_str().unwrap();
    let crash = fixture("20251009-091500");
    let crash = crash.to_str().unwrap();
    let cmd = |extra: &[&str]| {
        let mut c = assert_cmd::Command::cargo_bin("postmortem").unwrap();
        c.args([crash, "--output", out]).args(extra);
        c.assert().code(2)
    };
    cmd(&["--dumps", "/nonexistent/dumps", "--step", "0"])
        .stderr(predicates::str::contains("/nonexistent/dumps"));
    // A folder with no dump tree in it or below it.
    let runs = fixture("");
    cmd(&["--dumps", runs.to_str().unwrap(), "--step", "0"])
        .stderr(predicates::str::contains("no dump tree here"));
    // fixtures/dumps holds two self-hosted and three weaver trees: ambiguous, not guessed.
    let all = dumps("");
    cmd(&["--dumps", &all, "--step", "0"])
        .stderr(predicates::str::contains("self-hosted dump trees"))
        .stderr(predicates::str::contains("ambiguous"));
    // No self-hosted reference among several trees.
    cmd(&[
        "--dumps",
        &dumps("weaver_pt"),
        "--dumps",
        &dumps("weaver_faulty_pt"),
        "--step",
        "0",
    ])
    .stderr(predicates::str::contains("no self-hosted one"));
    // A step the tree does not have.
    cmd(&["--dumps", &dumps("weaver_faulty_pt"), "--step", "7"])
        .stderr(predicates::str::contains("weaver_faulty_pt"))
        .stderr(predicates::str::contains("no files for step 7"));
    // A remote-api tree cannot be checked alone.
    cmd(&["--dumps", &dumps("remote_api_pt"), "--step", "0"])
        .stderr(predicates::str::contains("remote_api_pt"));
    cmd(&[
        "--dumps",
        &dumps("weaver_pt"),
        "--step",
        "0",
        "--preset",
        "nope",
    ])
    .stderr(predicates::str::contains("--preset nope"));
    // --step needs --dumps and --dumps needs --step.
    cmd(&["--step", "0"]);
    cmd(&["--dumps", &dumps("weaver_pt")]);
}

#[test]
fn help_documents_dumps() {
    assert_cmd::Command::cargo_bin("postmortem")
        .unwrap()
        .arg("--help")
        .assert()
        .code(0)
        .stdout(predicates::str::contains("--dumps <DIR>"))
        .stdout(predicates::str::contains("One tree in all: losscheck"))
        .stdout(predicates::str::contains("Several trees"))
        .stdout(predicates::str::contains("or the --dumps verdict is FAIL"));
}

#[test]
fn dumps_cell_cut_short_by_the_crash_is_reported_not_fatal() {
    // A copy of weaver_pt's is_loss_debug/ and loss/ with rank 2 micro 1 cut in half.
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("debug_dump");
    for kind in ["is_loss_debug", "loss"] {
        let (from, to) = (Path::new(&dumps("weaver_pt")).join(kind), tree.join(kind));
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    let cut = tree.join("is_loss_debug/step_000000_rank2_micro1.pt");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let healthy = healthy_run(tmp.path());
    // The experiment folder holding debug_dump/ is accepted as the tree.
    let (code, s, md, _) = run_dumps(
        &healthy,
        &["--dumps", tmp.path().to_str().unwrap(), "--step", "0"],
    );
    let d = &s["dumps"];
    assert_eq!(d["verdict"], "warn", "{d}");
    assert_eq!(code, 0, "a cell that cannot be recomputed is not a FAIL");
    let cells = d["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 24);
    let c = cells.iter().find(|c| c["status"].is_null()).unwrap();
    assert_eq!(
        (c["rank"].as_u64(), c["micro"].as_u64()),
        (Some(2), Some(1))
    );
    let line = c["line"].as_str().unwrap();
    assert!(
        line.contains("could not recompute") && line.contains("step_000000_rank2_micro1.pt"),
        "{line}"
    );
    assert_eq!(
        cells.iter().filter(|c| c["status"] == "consistent").count(),
        23
    );
    assert!(
        md.contains("**Step 0: WARN** — 23 of 24 rank/micro cells are self-consistent; 1 could not be recomputed"),
        "{md}"
    );
}
