//! The binaries as a user meets them: `dumpdiff --inspect` on good and malformed inputs,
//! exit codes of SPEC §1, errors naming file and position, inputs never modified; and what
//! the four commands share: one flag vocabulary, `--help` ending with examples and exit
//! codes, `-` for stdin, a closed pipe ending quietly with the verdict's exit code, nothing
//! read being exit 2.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn dumpdiff() -> Command {
    Command::cargo_bin("dumpdiff").unwrap()
}

#[test]
fn inspect_prints_the_tree_of_a_pt_file() {
    let f = fixtures().join("dumps/self_hosted_pt/forward_data/step_000000_rank0_micro0.pt");
    dumpdiff()
        .arg("--inspect")
        .arg(&f)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("log_probs: tensor float32 [2, "))
        .stdout(predicate::str::contains("entropy: tensor bfloat16"))
        .stdout(predicate::str::contains("response_mask: tensor int32"))
        .stdout(predicate::str::contains("input_ids: tensor int64"));
}

#[test]
fn inspect_shows_a_strided_view_and_its_storage() {
    // The generator slices this file's log_probs out of a wider tensor (manifest:
    // strides [25, 1], storage offset 1, storage of 50 elements).
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("expected/manifest.json")).unwrap(),
    )
    .unwrap();
    let f = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["tree"] == "self_hosted_pt"
                && f["tensors"]["log_probs"]["storage_offset"].as_u64() == Some(1)
        })
        .expect("a view in the fixtures");
    let t = &f["tensors"]["log_probs"];
    let strides = format!(
        "strides [{}, {}] offset 1",
        t["strides"][0], t["strides"][1]
    );
    let storage = format!("with {} elements", t["storage_numel"]);
    dumpdiff()
        .arg("--inspect")
        .arg(fixtures().join("dumps").join(f["path"].as_str().unwrap()))
        .assert()
        .code(0)
        .stdout(predicate::str::contains(strides))
        .stdout(predicate::str::contains(storage));
}

#[test]
fn inspect_a_folder_shows_its_layout_and_holes() {
    dumpdiff()
        .arg("--inspect")
        .arg(fixtures().join("dumps/weaver_faulty_pt"))
        .assert()
        .code(0)
        .stdout(predicate::str::contains("producer: weaver"))
        .stdout(predicate::str::contains("0-9,11"));
}

#[test]
fn export_frames_writes_three_parquet_files() {
    let dir = tempfile::tempdir().unwrap();
    dumpdiff()
        .arg("--inspect")
        .arg(fixtures().join("dumps/self_hosted_pt"))
        .arg("--export-frames")
        .arg(dir.path())
        .arg("--step")
        .arg("0")
        .assert()
        .code(0);
    for name in ["scalars", "tokens", "trajectories"] {
        use polars::prelude::SerReader;
        let file = std::fs::File::open(dir.path().join(format!("{name}.parquet"))).unwrap();
        let df = polars::prelude::ParquetReader::new(file).finish().unwrap();
        assert!(df.height() > 0, "{name}");
    }
}

/// Each malformed input: exit 2, the file named, the exact position of the fault (a byte
/// offset, a line and column, a zip member's pickle opcode), nothing modified. Only two
/// faults have no offset to name and say `file:` — an empty file and a zip archive with no
/// end-of-central-directory record (cut short) — and those are spelled out in full.
#[test]
fn malformed_inputs_exit_2_naming_file_and_position() {
    // (file, the position exactly as printed after `PATH: `, other words the message needs)
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "corrupt/pt/truncated.pt",
            "file: unreadable zip archive",
            &["truncated"],
        ),
        (
            "corrupt/pt/missing_storage.pt",
            "zip member _real/data.pkl, pickle opcode at byte 110:",
            &["member _real/data/0 is missing"],
        ),
        (
            "corrupt/pt/os_system.pt",
            "zip member archive/data.pkl, pickle opcode at byte 2:",
            &["os.system"],
        ),
        (
            "corrupt/pt/builtins_eval.pt",
            "zip member archive/data.pkl, pickle opcode at byte 31:",
            &["builtins.eval"],
        ),
        (
            "corrupt/pt/subprocess_popen.pt",
            "zip member archive/data.pkl, pickle opcode at byte 2:",
            &["subprocess.Popen"],
        ),
        (
            "corrupt/pt/huge_shape.pt",
            "zip member archive/data.pkl, pickle opcode at byte 163:",
            &["1099511627776"],
        ),
        ("corrupt/pt/empty.pt", "file: empty file", &[]),
        ("corrupt/pt/not_zip.pt", "byte 0:", &["not a zip archive"]),
        (
            "corrupt/pt/deep_nested.pt",
            "zip member archive/data.pkl, pickle opcode at byte 20513:",
            &["nested deeper than 512"],
        ),
        (
            "corrupt/npy/forged_shape.npy",
            "byte 128:",
            &["shape [9999999, 4]"],
        ),
        (
            "corrupt/jsonl/truncated_line.jsonl",
            "line 1, column 406:",
            &["invalid JSON"],
        ),
    ];
    for (rel, position, needles) in cases {
        let path = fixtures().join(rel);
        let before = std::fs::read(&path).unwrap();
        let out = dumpdiff().arg("--inspect").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{rel}: {stderr}");
        let located = format!("{}: {position}", path.display());
        assert!(
            stderr.contains(&located),
            "{rel}: expected {located:?} in {stderr}"
        );
        for n in *needles {
            assert!(stderr.contains(n), "{rel}: {n:?} not in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{rel}: {stderr}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "{rel} was modified");
    }
}

#[test]
fn not_a_dump_folder_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    dumpdiff()
        .arg("--inspect")
        .arg(dir.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no dump folders found"));
    dumpdiff()
        .arg("--inspect")
        .arg(dir.path().join("absent.pt"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("absent.pt"));
}

// ---- what the four commands share (issue 17) ----------------------------------------

const TOOLS: [&str; 4] = ["dumpdiff", "logscan", "losscheck", "postmortem"];

/// The binary `name` built for these tests.
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
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c.env_remove("NO_COLOR");
    c
}

/// Every command with arguments that print something (most of them also find something:
/// exit 1 when stdout is read). `out` is a folder postmortem may write into.
fn printing_commands(out: &Path) -> Vec<(&'static str, Vec<String>)> {
    let o = out.to_str().unwrap().to_string();
    let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let compare = v(&[
        "--self-hosted-dir",
        "fixtures/dumps/self_hosted_pt",
        "--weaver-dir",
        "fixtures/dumps/weaver_faulty_pt",
        "--step",
        "0",
    ]);
    let mut json = compare.clone();
    json.extend(v(&["--format", "json"]));
    let mut cases = vec![
        ("dumpdiff", compare),
        ("dumpdiff", json),
        (
            "dumpdiff",
            v(&[
                "--inspect",
                "fixtures/dumps/self_hosted_pt/forward_data/step_000000_rank4_micro0.pt",
            ]),
        ),
        ("logscan", v(&["fixtures/logs/debug_faults"])),
        (
            "logscan",
            v(&["fixtures/logs/debug_faults", "--format", "json"]),
        ),
        (
            "losscheck",
            v(&[
                "--dump-dir",
                "fixtures/dumps/weaver_faulty_pt",
                "--step",
                "0",
            ]),
        ),
        (
            "losscheck",
            v(&[
                "--inputs",
                "fixtures/kernels/trl_grpo_normal.safetensors",
                "--preset",
                "trl-grpo",
                "--format",
                "json",
            ]),
        ),
        (
            "postmortem",
            v(&["fixtures/runs/20251009-091500", "--output", &o]),
        ),
        (
            "postmortem",
            v(&[
                "fixtures/runs/20251009-091500",
                "--output",
                &o,
                "--format",
                "markdown",
            ]),
        ),
    ];
    for t in TOOLS {
        cases.push((t, v(&["--help"])));
        cases.push((t, v(&["--version"])));
    }
    cases
}

/// The write end of a pipe whose reader has exited: `true` gets the read end as its stdin
/// and is waited for, so every write to the returned end fails with EPIPE.
fn closed_pipe() -> std::process::Stdio {
    let mut reader = std::process::Command::new("true")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let writer = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    writer.into()
}

/// stdout is a pipe nobody reads (its read end closed before the command starts): the
/// first write fails with EPIPE every time, however little the command prints. Nothing on
/// stderr, and the exit code is the command's verdict, as when stdout is read.
#[test]
fn a_closed_pipe_ends_every_command_quietly_with_its_verdict() {
    let out = tempfile::tempdir().unwrap();
    for (bin, args) in printing_commands(out.path()) {
        // The same command with stdout read: it prints, so the closed pipe is really hit.
        let full = tool(bin).args(&args).output().unwrap();
        assert!(!full.stdout.is_empty(), "{bin} {args:?} prints nothing");
        let o = std::process::Command::new(exe(bin))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(&args)
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            full.status.code(),
            "{bin} {args:?}: {stderr}"
        );
        assert_eq!(stderr, "", "{bin} {args:?}");
    }
}

/// The user's own pipeline: `COMMAND 2>err | head -c 1`, with pipefail so the command's
/// exit status is the pipeline's when it is not 0. Nothing on stderr, never a panic's 101,
/// and the command's own exit code whether it finished writing before `head` exited or
/// met the closed pipe (dumpdiff's 0.9 MB JSON report, beyond any pipe buffer, always does).
#[test]
fn every_command_piped_into_head_c_1_keeps_its_exit_code_and_says_nothing() {
    let out = tempfile::tempdir().unwrap();
    let err = out.path().join("stderr.txt");
    let mut big = 0;
    for (bin, args) in printing_commands(out.path()) {
        let full = tool(bin).args(&args).output().unwrap();
        let status = std::process::Command::new("bash")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .arg("-c")
            .arg(r#"set -o pipefail; err=$1; shift; "$@" 2>"$err" | head -c 1 >/dev/null"#)
            .arg("bash")
            .arg(&err)
            .arg(exe(bin))
            .args(&args)
            .status()
            .unwrap();
        let stderr = std::fs::read_to_string(&err).unwrap();
        assert_eq!(stderr, "", "{bin} {args:?}");
        if full.stdout.len() > 256 << 10 {
            big += 1;
        }
        assert_eq!(status.code(), full.status.code(), "{bin} {args:?}");
    }
    assert_eq!(
        big, 1,
        "the JSON report of dumpdiff is the one output beyond any pipe buffer"
    );
}

/// The lines of the `[possible values: …]` list on the `-h` line of `flag`.
fn possible_values(help: &str, flag: &str) -> Vec<String> {
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with(flag) || l.contains(&format!(", {flag}")))
        .unwrap_or_else(|| panic!("{flag} not in\n{help}"));
    let (_, list) = line
        .split_once("[possible values: ")
        .unwrap_or_else(|| panic!("no possible values on {line:?}"));
    list.trim_end_matches(']')
        .split(", ")
        .map(str::to_string)
        .collect()
}

fn help(bin: &str, flag: &str) -> String {
    let out = tool(bin).arg(flag).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{bin} {flag}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn one_flag_vocabulary_across_the_four_commands() {
    let mut fail_on = Vec::new();
    for bin in TOOLS {
        let h = help(bin, "-h");
        assert_eq!(
            possible_values(&h, "--format"),
            ["table", "json", "markdown"],
            "{bin}"
        );
        assert_eq!(
            possible_values(&h, "--color"),
            ["auto", "always", "never"],
            "{bin}"
        );
        fail_on.push(possible_values(&h, "--fail-on"));
        for f in ["--output <", "-q, --quiet", "-V, --version", "-h, --help"] {
            assert!(h.contains(f), "{bin}: no {f} in\n{h}");
        }
        let v = tool(bin).arg("--version").output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&v.stdout),
            format!("{bin} {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
    assert!(
        fail_on
            .iter()
            .all(|f| *f == ["info", "warning", "error", "critical"]),
        "{fail_on:?}"
    );
}

/// `-h` and `--help` of every command: every flag has a description, and the text ends
/// with 2–4 examples that start with the command itself and then the three exit codes.
#[test]
fn every_help_describes_every_flag_and_ends_with_examples_and_exit_codes() {
    for bin in TOOLS {
        for flag in ["-h", "--help"] {
            let h = help(bin, flag);
            let (_, tail) = h
                .rsplit_once("\nExamples:\n")
                .unwrap_or_else(|| panic!("{bin} {flag}: no examples\n{h}"));
            let (examples, codes) = tail
                .split_once("\n\nExit codes:\n")
                .unwrap_or_else(|| panic!("{bin} {flag}: no exit codes after the examples"));
            let n = examples.lines().count();
            assert!((2..=4).contains(&n), "{bin} {flag}: {n} examples");
            for e in examples.lines() {
                let e = e.trim();
                assert!(
                    e.starts_with(bin) || e.contains(&format!("| {bin} ")),
                    "{bin}: example {e:?}"
                );
            }
            let codes: Vec<&str> = codes.lines().map(str::trim_start).collect();
            assert_eq!(codes.len(), 3, "{bin} {flag}: {codes:?}");
            for (line, code) in codes.iter().zip(["0 ", "1 ", "2 "]) {
                assert!(line.starts_with(code), "{bin} {flag}: {line:?}");
            }
        }
        // In -h each option is one line: the flag, then its description after two spaces.
        let h = help(bin, "-h");
        let options = h.split_once("Options:\n").unwrap().1;
        let options = options.split("\n\n").next().unwrap();
        for line in options.lines() {
            let spec_and_help: Vec<&str> = line.trim().splitn(2, "  ").collect();
            assert!(
                spec_and_help.len() == 2 && !spec_and_help[1].trim().is_empty(),
                "{bin}: a flag without help: {line:?}"
            );
        }
    }
}

#[test]
fn dumpdiff_help_tells_the_truth_about_step() {
    let h = help("dumpdiff", "--help");
    let step = h.split_once("--step <STEP>").unwrap().1;
    let step = step.split("\n\n").next().unwrap();
    assert!(step.contains("required to compare"), "{step}");
    tool("dumpdiff")
        .args(["--self-hosted-dir", "fixtures/dumps/self_hosted_pt"])
        .args(["--weaver-dir", "fixtures/dumps/weaver_pt"])
        .assert()
        .code(2)
        .stderr("dumpdiff: --step N is required to compare\n");
}

#[test]
fn color_follows_the_flag_then_no_color_then_the_terminal() {
    let esc = |o: &std::process::Output| o.stdout.windows(2).any(|w| w == b"\x1b[");
    for (bin, args) in [
        ("logscan", vec!["fixtures/logs/debug_faults"]),
        (
            "dumpdiff",
            vec![
                "--self-hosted-dir",
                "fixtures/dumps/self_hosted_pt",
                "--weaver-dir",
                "fixtures/dumps/weaver_faulty_pt",
                "--step",
                "0",
            ],
        ),
    ] {
        let run = |extra: &[&str], no_color: Option<&str>| {
            let mut c = tool(bin);
            c.args(&args).args(extra);
            if let Some(v) = no_color {
                c.env("NO_COLOR", v);
            }
            c.output().unwrap()
        };
        assert!(esc(&run(&["--color", "always"], None)), "{bin} always");
        assert!(
            esc(&run(&["--color", "always"], Some("1"))),
            "{bin} always beats NO_COLOR"
        );
        assert!(!esc(&run(&["--color", "never"], None)), "{bin} never");
        // stdout is a pipe here: auto means no colour, with or without NO_COLOR.
        assert!(!esc(&run(&[], None)), "{bin} auto in a pipe");
        assert!(
            !esc(&run(&["--color", "auto"], Some("1"))),
            "{bin} NO_COLOR"
        );
    }
}

#[test]
fn quiet_prints_nothing_but_keeps_the_exit_code_and_the_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r.json");
    let r = report.to_str().unwrap();
    let o = dir.path().to_str().unwrap();
    let sh = "fixtures/dumps/self_hosted_pt";
    let faulty = "fixtures/dumps/weaver_faulty_pt";
    let cases: [(&str, Vec<&str>); 4] = [
        (
            "dumpdiff",
            vec![
                "--self-hosted-dir",
                sh,
                "--weaver-dir",
                faulty,
                "--step",
                "0",
                "--output",
                r,
                "-q",
            ],
        ),
        (
            "logscan",
            vec!["fixtures/logs/debug_faults", "--output", r, "-q"],
        ),
        (
            "losscheck",
            vec!["--dump-dir", faulty, "--step", "0", "--output", r, "-q"],
        ),
        (
            "postmortem",
            vec!["fixtures/runs/20251009-091500", "--output", o, "-q"],
        ),
    ];
    for (bin, args) in cases {
        let _ = std::fs::remove_file(&report);
        tool(bin).args(&args).assert().code(1).stdout("").stderr("");
        let written = if bin == "postmortem" {
            dir.path().join("summary.json")
        } else {
            report.clone()
        };
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&written).unwrap()).unwrap();
        assert_eq!(v["schema_version"], 1, "{bin}");
    }
}

#[test]
fn a_dash_reads_stdin_where_a_file_is_expected() {
    let f = fixtures().join("dumps/self_hosted_pt/forward_data/step_000000_rank4_micro0.pt");
    let by_path = tool("dumpdiff").arg("--inspect").arg(&f).output().unwrap();
    let by_stdin = tool("dumpdiff")
        .args(["--inspect", "-"])
        .pipe_stdin(&f)
        .unwrap()
        .output()
        .unwrap();
    assert_eq!(by_stdin.status.code(), Some(0));
    // Everything after the first line (the file name and size) is the same.
    let body = |o: &std::process::Output| {
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        s.split_once('\n').unwrap().1.to_string()
    };
    assert_eq!(body(&by_stdin), body(&by_path));
    assert!(body(&by_path).contains("log_probs: tensor float32"));

    let k = fixtures().join("kernels/trl_grpo_normal.safetensors");
    let loss = |o: std::process::Output| {
        assert_eq!(o.status.code(), Some(0));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["loss"].as_f64().unwrap()
    };
    let args = ["--preset", "trl-grpo", "--format", "json"];
    let a = loss(
        tool("losscheck")
            .arg("--inputs")
            .arg(&k)
            .args(args)
            .output()
            .unwrap(),
    );
    let b = loss(
        tool("losscheck")
            .args(["--inputs", "-"])
            .args(args)
            .pipe_stdin(&k)
            .unwrap()
            .output()
            .unwrap(),
    );
    assert_eq!(a.to_bits(), b.to_bits());

    let steps = fixtures().join("logs/debug_faults/steps.jsonl");
    let findings = |o: std::process::Output| {
        assert_eq!(o.status.code(), Some(1));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let f: Vec<(String, String)> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["detector"].to_string(), f["steps"].to_string()))
            .collect();
        assert!(!f.is_empty());
        f
    };
    let by_path = findings(
        tool("logscan")
            .arg(&steps)
            .args(["--format", "json"])
            .output()
            .unwrap(),
    );
    let by_stdin = findings(
        tool("logscan")
            .args(["-", "--format", "json"])
            .pipe_stdin(&steps)
            .unwrap()
            .output()
            .unwrap(),
    );
    assert_eq!(by_path, by_stdin);
}

// ---- nothing read is exit 2 with what was seen -------------------------------------

/// Copy a fixture folder tree (files and folders only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn postmortem_on_a_folder_without_a_run_says_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // The parent folder of two crashed runs.
    let parent = dir.path().join("debug_runs");
    for run in ["20251009-091500", "20251009-130000"] {
        copy_tree(&fixtures().join("runs").join(run), &parent.join(run));
        tool("postmortem")
            .arg(parent.join(run))
            .arg("--output")
            .arg(&out)
            .assert()
            .code(1);
    }
    std::fs::write(parent.join("notes.md"), "two runs\n").unwrap();
    tool("postmortem")
        .arg(&parent)
        .arg("--output")
        .arg(&out)
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!(
            "postmortem: no run found in {p}; it holds 2 run folder(s): 20251009-091500, \
             20251009-130000 (pass one of them, e.g. {p}/20251009-091500)\n",
            p = parent.display()
        ));
    // An empty folder, and one with an unrelated file.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    tool("postmortem")
        .arg(&empty)
        .arg("--output")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "no run found in {}: it holds 0 file(s) and 0 folder(s)",
            empty.display()
        )));
    std::fs::write(empty.join("config.yaml"), "lr: 1e-6\n").unwrap();
    tool("postmortem")
        .arg(&empty)
        .arg("--output")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "it holds 1 file(s) and 0 folder(s)",
        ));
    // Nothing was written for the refused folders.
    assert!(!out.join("debug_runs").exists() && !out.join("empty").exists());
}

#[test]
fn dumpdiff_and_losscheck_on_nothing_to_read_exit_2_saying_what_they_saw() {
    let dir = tempfile::tempdir().unwrap();
    let hollow = dir.path().join("hollow");
    for k in ["forward_data", "loss", "is_loss_debug"] {
        std::fs::create_dir_all(hollow.join(k)).unwrap();
    }
    tool("dumpdiff")
        .args([
            "--self-hosted-dir",
            "fixtures/dumps/self_hosted_pt",
            "--weaver-dir",
        ])
        .arg(&hollow)
        .args(["--step", "0"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!(
            "dumpdiff: --weaver-dir {}: no dump file found; the tree holds the folders \
             forward_data/, is_loss_debug/, loss/ but no step_NNNNNN… file in them\n",
            hollow.display()
        ));
    tool("dumpdiff")
        .args(["--self-hosted-dir", "fixtures/dumps/self_hosted_pt"])
        .args(["--weaver-dir", "fixtures/dumps/weaver_pt", "--step", "7"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--self-hosted-dir fixtures/dumps/self_hosted_pt: no file of step 7; the tree holds",
        ))
        .stderr(predicate::str::contains("of step(s) -1, 0\n"));
    // A rank filter that leaves one side nothing: not "NOTHING COMPARED" with exit 0.
    tool("dumpdiff")
        .args(["--self-hosted-dir", "fixtures/dumps/self_hosted_pt"])
        .args([
            "--weaver-dir",
            "fixtures/dumps/weaver_pt",
            "--step",
            "0",
            "--ranks",
            "99",
        ])
        .assert()
        .code(2)
        .stderr(
            "dumpdiff: --weaver-dir fixtures/dumps/weaver_pt: --ranks/--micros leave no file of \
             step 0; it holds ranks 0-11 and micros 0, 1\n",
        );
    tool("losscheck")
        .arg("--dump-dir")
        .arg(&hollow)
        .assert()
        .code(2)
        .stderr(format!(
            "losscheck: {}: no dump file (step_NNNNNN…) in this tree\n",
            hollow.display()
        ));
    // Steps -1 (validation trajectories only) and 0: step 0 is the only one with a loss to
    // check, so it is the default (several such steps: tests/cli_first_day.rs).
    let default = tool("losscheck")
        .args(["--dump-dir", "fixtures/dumps/self_hosted_pt"])
        .output()
        .unwrap();
    let step0 = tool("losscheck")
        .args(["--dump-dir", "fixtures/dumps/self_hosted_pt", "--step", "0"])
        .output()
        .unwrap();
    assert_eq!(default.status.code(), Some(0));
    assert_eq!(default.stdout, step0.stdout);
    assert_eq!(default.stderr, b"");
    // One step: it is the default.
    let one = tool("losscheck")
        .args([
            "--dump-dir",
            "fixtures/dumps/weaver_faulty_pt",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let with = tool("losscheck")
        .args([
            "--dump-dir",
            "fixtures/dumps/weaver_faulty_pt",
            "--step",
            "0",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(one.status.code(), Some(1));
    assert_eq!(one.stdout, with.stdout);
}

// ---- dumpdiff: a tree under the wrong flag ------------------------------------------

#[test]
fn dumpdiff_refuses_swapped_sides_and_names_the_right_flags() {
    tool("dumpdiff")
        .args(["--self-hosted-dir", "fixtures/dumps/weaver_pt"])
        .args([
            "--weaver-dir",
            "fixtures/dumps/self_hosted_pt",
            "--step",
            "0",
        ])
        .assert()
        .code(2)
        .stdout("")
        .stderr(
            "dumpdiff: --self-hosted-dir fixtures/dumps/weaver_pt holds a weaver dump, not a \
             self-hosted one; --weaver-dir fixtures/dumps/self_hosted_pt holds a self-hosted \
             dump, not a weaver one: the flags look swapped; run again with --weaver-dir \
             fixtures/dumps/weaver_pt --self-hosted-dir fixtures/dumps/self_hosted_pt (dumpdiff \
             takes each tree's role from its flag and does not guess)\n",
        );
    tool("dumpdiff")
        .args(["--self-hosted-dir", "fixtures/dumps/self_hosted_pt"])
        .args([
            "--weaver-dir",
            "fixtures/dumps/remote_api_pt",
            "--step",
            "0",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--weaver-dir fixtures/dumps/remote_api_pt holds a remote-api dump, not a weaver one",
        ))
        .stderr(predicate::str::contains(
            "run again with --remote-api-dir fixtures/dumps/remote_api_pt",
        ));
    // The same trees under the right flags compare cleanly.
    tool("dumpdiff")
        .args(["--self-hosted-dir", "fixtures/dumps/self_hosted_pt"])
        .args(["--weaver-dir", "fixtures/dumps/weaver_pt", "--step", "0"])
        .assert()
        .code(0);
}

// ---- losscheck's formats --------------------------------------------------------------

#[test]
fn losscheck_inputs_table_is_a_summary_and_json_holds_every_gradient_element() {
    let args = [
        "--inputs",
        "fixtures/kernels/trl_grpo_normal.safetensors",
        "--preset",
        "trl-grpo",
    ];
    let json = tool("losscheck")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["grad"].as_array().unwrap().len(), 80);
    let table = tool("losscheck").args(args).output().unwrap();
    assert_eq!(table.status.code(), Some(0));
    let t = String::from_utf8(table.stdout).unwrap();
    // 4 loss terms, 11 metrics, 1 gradient line.
    assert_eq!(t.lines().count(), 16, "{t}");
    let loss_line = t.lines().next().unwrap();
    let shown: f64 = loss_line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let exact = v["loss"].as_f64().unwrap();
    // Six significant digits: within half a unit of the sixth.
    let half_ulp = |x: f64| 0.5 * 10f64.powf(x.abs().log10().floor() - 5.0);
    assert!(
        (shown - exact).abs() <= half_ulp(exact),
        "{loss_line} vs {exact}"
    );
    let g: Vec<f64> = v["grad"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
    let grad_line = t.lines().last().unwrap();
    assert!(
        grad_line.starts_with("gradient") && grad_line.contains("[8, 10], L2 norm "),
        "{grad_line}"
    );
    let shown_norm: f64 = grad_line
        .split("L2 norm ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (shown_norm - norm).abs() <= half_ulp(norm),
        "{shown_norm} vs {norm}"
    );
}

#[test]
fn losscheck_markdown_output_file_and_fail_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.json");
    let base = [
        "--dump-dir",
        "fixtures/dumps/weaver_faulty_pt",
        "--step",
        "0",
    ];
    let md = tool("losscheck")
        .args(base)
        .args(["--format", "markdown", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(md.status.code(), Some(1));
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(
        md.starts_with("# losscheck\n\n2 of 22 cell(s) inconsistent with their own inputs.\n"),
        "{md}"
    );
    let bad: Vec<(String, String)> = md
        .lines()
        .filter(|l| l.contains("**inconsistent**"))
        .map(|l| {
            let c: Vec<&str> = l.split(" | ").collect();
            (c[0].trim_start_matches("| ").to_string(), c[1].to_string())
        })
        .collect();
    assert_eq!(bad, [("3".into(), "1".into()), ("5".into(), "0".into())]);
    assert!(md.contains("a sum, not a mean"));
    // --output holds the same verdicts as --format json prints.
    let json = tool("losscheck")
        .args(base)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), json.stdout);
    // An inconsistent loss is an error: --fail-on critical reports it with exit 0.
    tool("losscheck")
        .args(base)
        .args(["--fail-on", "critical"])
        .assert()
        .code(0);
    tool("losscheck")
        .args(base)
        .args(["--fail-on", "warning"])
        .assert()
        .code(1);
}

#[test]
fn postmortem_format_json_and_markdown_print_the_written_report() {
    let dir = tempfile::tempdir().unwrap();
    let run = "fixtures/runs/20251009-091500";
    let o = dir.path().to_str().unwrap();
    let json = tool("postmortem")
        .args([run, "--output", o, "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(json.status.code(), Some(1));
    let rd = dir.path(); // --output DIR is written into itself
    assert_eq!(json.stdout, std::fs::read(rd.join("summary.json")).unwrap());
    let md = tool("postmortem")
        .args([run, "--output", o, "--format", "markdown"])
        .output()
        .unwrap();
    assert_eq!(md.stdout, std::fs::read(rd.join("report.md")).unwrap());
    let table = tool("postmortem")
        .args([run, "--output", o])
        .output()
        .unwrap();
    let t = String::from_utf8(table.stdout).unwrap();
    assert_eq!(
        t.lines().last().unwrap(),
        format!("report: {}", rd.join("report.html").display())
    );
    assert!(t.starts_with("Crashed at step 23"), "{t}");
}

/// An unknown `--preset` was ignored (no advantages recomputed, no adjudication, exit 0 or
/// 1 as if it had not been given): it is a usage error naming the presets.
#[test]
fn dumpdiff_unknown_preset_exits_2_naming_the_presets() {
    let out = dumpdiff()
        .arg("--self-hosted-dir")
        .arg(fixtures().join("dumps/self_hosted_pt"))
        .arg("--weaver-dir")
        .arg(fixtures().join("dumps/weaver_faulty_pt"))
        .args(["--step", "0", "--preset", "nexrl-si"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains("--preset: unknown preset \"nexrl-si\"; known presets: trl-grpo, "),
        "{stderr}"
    );
    for p in ["nexrl-is", "verl-gspo", "mlx-grpo"] {
        assert!(stderr.contains(p), "{p} not in {stderr}");
    }
}

/// One `--fail-on` vocabulary: every command takes info/warning/error/critical and the old
/// words `warn`/`fail`, with the same meaning (a WARN-severity tolerance rule's verdict
/// fails dumpdiff at `warn`, not at `fail`).
#[test]
fn fail_on_takes_the_same_words_in_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let tol = dir.path().join("tol.toml");
    std::fs::write(&tol, "[[rule]]\nname = \"*\"\nseverity = \"warn\"\n").unwrap();
    let dd = |fail_on: &str| {
        dumpdiff()
            .arg("--self-hosted-dir")
            .arg(fixtures().join("dumps/self_hosted_pt"))
            .arg("--weaver-dir")
            .arg(fixtures().join("dumps/weaver_faulty_pt"))
            .args(["--step", "0", "-q", "--no-adjudicate", "--tol-file"])
            .arg(&tol)
            .args(["--fail-on", fail_on])
            .output()
            .unwrap()
            .status
            .code()
    };
    for (word, code) in [
        ("info", 1),
        ("warn", 1),
        ("warning", 1),
        ("fail", 0),
        ("error", 0),
        ("critical", 0),
    ] {
        assert_eq!(dd(word), Some(code), "dumpdiff --fail-on {word}");
    }
    // verl_console.log's worst finding is a warning.
    let logscan = |fail_on: &str| {
        Command::cargo_bin("logscan")
            .unwrap()
            .arg(fixtures().join("logs/text/verl_console.log"))
            .args(["-q", "--fail-on", fail_on])
            .output()
            .unwrap()
            .status
            .code()
    };
    // weaver_faulty_pt holds inconsistent losses: an error-level finding.
    let losscheck = |fail_on: &str| {
        Command::cargo_bin("losscheck")
            .unwrap()
            .arg("--dump-dir")
            .arg(fixtures().join("dumps/weaver_faulty_pt"))
            .args(["--step", "0", "-q", "--fail-on", fail_on])
            .output()
            .unwrap()
            .status
            .code()
    };
    for (word, at_warning, at_error) in [
        ("info", 1, 1),
        ("warn", 1, 1),
        ("warning", 1, 1),
        ("fail", 0, 1),
        ("error", 0, 1),
        ("critical", 0, 0),
    ] {
        assert_eq!(logscan(word), Some(at_warning), "logscan --fail-on {word}");
        assert_eq!(
            losscheck(word),
            Some(at_error),
            "losscheck --fail-on {word}"
        );
    }
}
