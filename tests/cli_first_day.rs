//! What a newcomer met on the first day (issue 27): a FAIL piped into `head` still exits 1,
//! `postmortem -o DIR` writes into DIR and `--format json|markdown` alone writes no folder,
//! losscheck's table starts with a count line and fits `COLUMNS`, every `--help` names a
//! user's own files and its fixture example runs, and losscheck's `--step` default skips a
//! validation-only step −1.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn exe(name: &str) -> PathBuf {
    PathBuf::from(match name {
        "dumpdiff" => env!("CARGO_BIN_EXE_dumpdiff"),
        "logscan" => env!("CARGO_BIN_EXE_logscan"),
        "losscheck" => env!("CARGO_BIN_EXE_losscheck"),
        "postmortem" => env!("CARGO_BIN_EXE_postmortem"),
        other => panic!("no binary {other}"),
    })
}

fn tool(name: &str) -> Command {
    let mut c = Command::new(exe(name));
    c.current_dir(ROOT);
    c.env_remove("COLUMNS");
    c
}

const COMPARE_FAIL: [&str; 6] = [
    "--self-hosted-dir",
    "fixtures/dumps/self_hosted_pt",
    "--weaver-dir",
    "fixtures/dumps/weaver_faulty_pt",
    "--step",
    "0",
];
const COMPARE_PASS: [&str; 6] = [
    "--self-hosted-dir",
    "fixtures/dumps/self_hosted_pt",
    "--remote-api-dir",
    "fixtures/dumps/remote_api_pt",
    "--step",
    "0",
];

/// `bash -c 'set -o pipefail; CMD | head -1'`: the pipeline's exit status (the command's
/// when it is not 0) and what the command wrote on stderr.
fn piped_into_head_1(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr.txt");
    let status = std::process::Command::new("bash")
        .current_dir(ROOT)
        .arg("-c")
        .arg(r#"set -o pipefail; err=$1; shift; "$@" 2>"$err" | head -1 >/dev/null"#)
        .arg("bash")
        .arg(&err)
        .arg(exe(bin))
        .args(args)
        .status()
        .unwrap();
    (status.code(), std::fs::read_to_string(&err).unwrap())
}

#[test]
fn a_fail_piped_into_head_still_exits_1() {
    fn json(args: [&'static str; 6]) -> Vec<&'static str> {
        let mut v = args.to_vec();
        v.extend(["--format", "json"]);
        v
    }
    // The JSON report of a FAIL is 0.9 MB: head -1 closes the pipe long before its end.
    let full = tool("dumpdiff").args(json(COMPARE_FAIL)).output().unwrap();
    assert!(full.stdout.len() > 256 << 10, "{}", full.stdout.len());
    assert_eq!(
        piped_into_head_1("dumpdiff", &json(COMPARE_FAIL)),
        (Some(1), String::new())
    );
    assert_eq!(
        piped_into_head_1("dumpdiff", &json(COMPARE_PASS)),
        (Some(0), String::new())
    );
    let faulty = [
        "--dump-dir",
        "fixtures/dumps/weaver_faulty_pt",
        "--step",
        "0",
    ];
    assert_eq!(
        piped_into_head_1("losscheck", &faulty),
        (Some(1), String::new())
    );
    assert_eq!(
        piped_into_head_1(
            "logscan",
            &["fixtures/logs/debug_faults", "--format", "json"]
        ),
        (Some(1), String::new())
    );
}

/// The names in a folder, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn postmortem_output_dir_is_written_into_itself() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report-0915");
    let o = out.to_str().unwrap();
    let run = "fixtures/runs/20251009-091500";
    let t = tool("postmortem").args([run, "-o", o]).output().unwrap();
    assert_eq!(t.status.code(), Some(1));
    let files = names(&out);
    for f in ["report.html", "report.md", "summary.json", "plot-loss.png"] {
        assert!(files.contains(&f.to_string()), "{f} in {files:?}");
    }
    assert!(!out.join("20251009-091500").exists());
    assert_eq!(
        String::from_utf8(t.stdout).unwrap(),
        format!(
            "Crashed at step 23: Zero-length completion reached a reduction (ValueError: \
             [logsumexp] Received empty array.). 1 finding(s) (worst: error) over the run.\n\
             report: {o}/report.html\n"
        )
    );
}

#[test]
fn postmortem_json_or_markdown_without_output_writes_no_folder() {
    let run = Path::new(ROOT).join("fixtures/runs/20251009-091500");
    let run = run.to_str().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let with = tempfile::tempdir().unwrap();
    let w = with.path().to_str().unwrap();
    let in_cwd = |args: &[&str]| {
        let mut c = Command::new(exe("postmortem"));
        c.current_dir(cwd.path()).args(args).output().unwrap()
    };
    let json = in_cwd(&[run, "--format", "json"]);
    let md = in_cwd(&[run, "--format", "markdown"]);
    assert_eq!((json.status.code(), md.status.code()), (Some(1), Some(1)));
    assert_eq!(names(cwd.path()), Vec::<String>::new(), "nothing written");
    // The same report as with a folder, less the plots it would have written.
    let json_o = in_cwd(&[run, "--format", "json", "-o", w]);
    let mut a: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let mut b: serde_json::Value = serde_json::from_slice(&json_o.stdout).unwrap();
    assert_eq!(a["plots"], serde_json::json!([]));
    assert_eq!(b["plots"].as_array().unwrap().len(), 7);
    a.as_object_mut().unwrap().remove("plots");
    b.as_object_mut().unwrap().remove("plots");
    assert_eq!(a, b);
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(md.starts_with("# "), "{md}");
    assert!(!md.contains("plot-"), "names a plot file it did not write");
    // Table output without -o still writes reports/<run-name>/ and says where.
    let t = in_cwd(&[run]);
    assert_eq!(t.status.code(), Some(1));
    assert_eq!(names(cwd.path()), ["reports"]);
    assert_eq!(names(&cwd.path().join("reports")), ["20251009-091500"]);
    let t = String::from_utf8(t.stdout).unwrap();
    assert!(
        t.ends_with("\nreport: reports/20251009-091500/report.html\n"),
        "{t}"
    );
}

#[test]
fn losscheck_table_starts_with_a_count_line_and_fits_columns() {
    let faulty = [
        "--dump-dir",
        "fixtures/dumps/weaver_faulty_pt",
        "--step",
        "0",
    ];
    for cols in [60usize, 80, 120] {
        let o = tool("losscheck")
            .args(faulty)
            .env("COLUMNS", cols.to_string())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        let text = String::from_utf8(o.stdout).unwrap();
        for l in text.lines() {
            assert!(l.chars().count() <= cols, "{cols}: {l:?}");
        }
        // 22 cells: one header row and one row per cell, two of them inconsistent.
        assert_eq!(text.lines().filter(|l| l.contains(" ┆ ")).count(), 23);
        assert_eq!(text.matches("┆ inconsistent ┆").count(), 2, "{text}");
    }
    let o = tool("losscheck").args(faulty).output().unwrap();
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "losscheck step 0: FAIL — 2 of 22 cells inconsistent with their own inputs, in ranks 3, 5"
    );
    assert_eq!(
        lines[1],
        "files: fixtures/dumps/weaver_faulty_pt/is_loss_debug/"
    );
    assert!(lines[lines.len() - 2].starts_with(
        "rank 3 micro 1 (step_000000_rank3_micro1.pt): dumped loss -1.388 ≠ recomputed -0.7835"
    ));
    assert!(lines[lines.len() - 1].starts_with(
        "rank 5 micro 0 (step_000000_rank5_micro0.pt): dumped loss 13.06 ≠ recomputed 0.5677"
    ));
    let clean = tool("losscheck")
        .args(["--dump-dir", "fixtures/dumps/self_hosted_pt", "--step", "0"])
        .output()
        .unwrap();
    assert_eq!(clean.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(clean.stdout).unwrap().lines().next(),
        Some("losscheck step 0: PASS — 24 cells consistent with their own inputs")
    );
}

/// The `Examples:` lines of `--help`.
fn examples(bin: &str) -> Vec<String> {
    let h = tool(bin).arg("--help").output().unwrap();
    let h = String::from_utf8(h.stdout).unwrap();
    let tail = h.rsplit_once("\nExamples:\n").unwrap().1;
    let ex = tail.split_once("\n\n").unwrap().0;
    ex.lines().map(|l| l.trim().to_string()).collect()
}

#[test]
fn every_help_names_a_users_files_and_its_fixture_example_runs() {
    for (bin, code) in [
        ("dumpdiff", 1),
        ("losscheck", 1),
        ("logscan", 1),
        ("postmortem", 1),
    ] {
        let ex = examples(bin);
        let (ours, users): (Vec<&String>, Vec<&String>) =
            ex.iter().partition(|e| e.contains("fixtures/"));
        assert!(users.len() >= 2, "{bin}: {ex:?}");
        assert_eq!(ours.len(), 1, "{bin}: {ex:?}");
        // The fixture example works as written, from the repository's root.
        let args: Vec<&str> = ours[0].split(' ').skip(1).collect();
        let out = tempfile::tempdir().unwrap();
        let mut c = tool(bin);
        c.args(&args);
        if bin == "postmortem" {
            c.args(["-o", out.path().to_str().unwrap()]);
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(code), "{}", ours[0]);
        assert_eq!(String::from_utf8_lossy(&o.stderr), "", "{}", ours[0]);
    }
}

/// Copy the files of `from` into `to`, folders included.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_tree(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn losscheck_step_default_skips_a_validation_only_step() {
    let h = tool("losscheck").arg("--help").output().unwrap();
    let h = String::from_utf8(h.stdout).unwrap();
    let step = h.split_once("--step <N>").unwrap().1;
    let step = step.split("\n\n").next().unwrap();
    assert!(step.contains("only step with a dumped loss"), "{step}");
    assert!(step.contains("validation-only step -1"), "{step}");

    // The shipped self-hosted tree: a validation pass before training (trajectories at
    // step -1, nothing else) and step 0.
    let shipped = "fixtures/dumps/self_hosted_pt";
    assert!(Path::new(ROOT)
        .join(shipped)
        .join("trajectory/step_-00001.pt")
        .is_file());
    let o = tool("losscheck")
        .args(["--dump-dir", shipped])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        String::from_utf8(o.stdout).unwrap().lines().next(),
        Some("losscheck step 0: PASS — 24 cells consistent with their own inputs")
    );
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    copy_tree(&Path::new(ROOT).join(shipped), &tree);
    let t = tree.to_str().unwrap();
    // A second step with a dumped loss: the step must be named.
    std::fs::copy(
        tree.join("loss/step_000000_rank0_micro0.pt"),
        tree.join("loss/step_000001_rank0_micro0.pt"),
    )
    .unwrap();
    tool("losscheck")
        .args(["--dump-dir", t])
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!(
            "losscheck: {t}: holds a dumped loss for steps 0, 1; pick one with --step N\n"
        ));
}
