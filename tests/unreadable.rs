//! One bad file never sinks the run (issue 28): a truncated or corrupt dump file among many
//! is set aside, named with its reason, every other cell is judged exactly as without it,
//! the first line says how many cells could not be read, and the exit code is 2.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn bin(name: &str) -> Command {
    Command::cargo_bin(name).unwrap()
}

/// Copy a dump tree (kind folders, files).
fn copy_tree(src: &Path, dst: &Path) {
    for kind in std::fs::read_dir(src).unwrap() {
        let kind = kind.unwrap().path();
        let out = dst.join(kind.file_name().unwrap());
        std::fs::create_dir_all(&out).unwrap();
        for f in std::fs::read_dir(&kind).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, out.join(f.file_name().unwrap())).unwrap();
        }
    }
}

/// Cut `file` to a third of its size (a copy interrupted mid-write).
fn truncate(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.set_len(len / 3).unwrap();
}

/// (section, rank, micro) → (verdict, reason) of every cell of a dumpdiff JSON report.
fn cells(report: &Json) -> std::collections::BTreeMap<(String, u64, u64), (String, String)> {
    let mut out = std::collections::BTreeMap::new();
    for s in report["sections"].as_array().unwrap() {
        for c in s["cells"].as_array().unwrap() {
            out.insert(
                (
                    s["name"].as_str().unwrap().to_string(),
                    c["rank"].as_u64().unwrap_or(u64::MAX),
                    c["micro"].as_u64().unwrap_or(u64::MAX),
                ),
                (
                    c["verdict"].as_str().unwrap().to_string(),
                    c["reason"].as_str().unwrap().to_string(),
                ),
            );
        }
    }
    out
}

fn dumpdiff_json(s: &Path, w: &Path) -> (i32, Json, String) {
    let out = bin("dumpdiff")
        .args(["--step", "0", "--format", "json", "--self-hosted-dir"])
        .arg(s)
        .arg("--weaver-dir")
        .arg(w)
        .output()
        .unwrap();
    let json: Json = serde_json::from_slice(&out.stdout).unwrap();
    let table = bin("dumpdiff")
        .args(["--step", "0", "--self-hosted-dir"])
        .arg(s)
        .arg("--weaver-dir")
        .arg(w)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), table.status.code());
    (
        out.status.code().unwrap(),
        json,
        String::from_utf8(table.stdout).unwrap(),
    )
}

#[test]
fn dumpdiff_judges_every_other_cell_when_two_files_are_bad() {
    let dir = tempfile::tempdir().unwrap();
    let (s, w) = (dir.path().join("s"), dir.path().join("w"));
    copy_tree(&fixtures().join("dumps/self_hosted_pt"), &s);
    // the weaver tree with four injected faults: they must still be found
    copy_tree(&fixtures().join("dumps/weaver_faulty_pt"), &w);
    let (clean_code, clean, _) = dumpdiff_json(&s, &w);
    assert_eq!(clean_code, 1);
    let bad_loss = s.join("loss/step_000000_rank3_micro1.pt");
    let bad_fwd = w.join("forward_data/step_000000_rank5_micro0.pt");
    truncate(&bad_loss);
    // a corrupt file: the right size, garbage inside
    let len = std::fs::metadata(&bad_fwd).unwrap().len() as usize;
    std::fs::write(&bad_fwd, vec![0x5au8; len]).unwrap();
    let (code, broken, table) = dumpdiff_json(&s, &w);
    assert_eq!(code, 2, "{table}");
    let first = table.lines().next().unwrap();
    assert!(
        first.contains("2 cells could not be read (2 files, exit 2)"),
        "{first}"
    );
    let unreadable = broken["unreadable"].as_array().unwrap();
    let named: Vec<(&str, &str, u64, u64)> = unreadable
        .iter()
        .map(|u| {
            (
                u["role"].as_str().unwrap(),
                u["kind"].as_str().unwrap(),
                u["rank"].as_u64().unwrap(),
                u["micro"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            ("self-hosted", "loss", 3, 1),
            ("weaver", "forward_data", 5, 0)
        ]
    );
    assert!(unreadable[0]["reason"]
        .as_str()
        .unwrap()
        .contains("step_000000_rank3_micro1.pt"));
    // every other cell exactly as in the run without bad files; the two cells not compared
    let (a, b) = (cells(&clean), cells(&broken));
    assert_eq!(a.len(), b.len());
    let mut not_compared = Vec::new();
    for (k, v) in &a {
        let got = &b[k];
        if got.1.starts_with("not compared:") {
            assert_eq!(got.0, "skipped");
            not_compared.push(k.clone());
        } else if [(3, 1), (5, 0)].contains(&(k.1, k.2)) {
            // a cell beside a set-aside file: judged, its reason may say less
            assert_eq!(got.0, v.0, "{k:?}");
        } else {
            assert_eq!(got, v, "{k:?}");
        }
    }
    assert_eq!(
        not_compared,
        [
            ("forward_data".to_string(), 5, 0),
            ("loss".to_string(), 3, 1)
        ]
    );
    // the injected faults are still flagged
    assert_eq!(broken["verdict"], "fail");
    assert_eq!(broken["first_divergence"], clean["first_divergence"]);
    // the files on one side only are the clean run's: the set-aside ones are not among them
    assert_eq!(broken["coverage"], clean["coverage"]);
}

#[test]
fn losscheck_judges_every_other_cell_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    copy_tree(&fixtures().join("dumps/weaver_pt"), &t);
    let run = || {
        let out = bin("losscheck")
            .args(["--step", "0", "--format", "json", "--dump-dir"])
            .arg(&t)
            .output()
            .unwrap();
        let json: Json = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code().unwrap(), json)
    };
    let (code, clean) = run();
    assert_eq!(code, 0);
    truncate(&t.join("is_loss_debug/step_000000_rank7_micro1.pt"));
    let (code, broken) = run();
    assert_eq!(code, 2);
    let u = &broken["unreadable"][0];
    assert_eq!(
        (u["kind"].as_str(), u["rank"].as_u64(), u["micro"].as_u64()),
        (Some("is_loss_debug"), Some(7), Some(1))
    );
    let key = |v: &Json| (v["rank"].as_u64().unwrap(), v["micro"].as_u64().unwrap());
    let before: Vec<&Json> = clean["verdicts"].as_array().unwrap().iter().collect();
    let after: Vec<&Json> = broken["verdicts"].as_array().unwrap().iter().collect();
    assert_eq!(after.len(), before.len() - 1);
    for v in &after {
        let same = before.iter().find(|b| key(b) == key(v)).unwrap();
        assert_eq!(v, same);
    }
    assert!(!after.iter().any(|v| key(v) == (7, 1)));
    let table = bin("losscheck")
        .args(["--step", "0", "--dump-dir"])
        .arg(&t)
        .output()
        .unwrap();
    assert_eq!(table.status.code(), Some(2));
    let text = String::from_utf8(table.stdout).unwrap();
    assert_eq!(
        text.lines().next().unwrap(),
        "losscheck step 0: PASS — 23 cells consistent with their own inputs; 1 cell could not be read (1 file, exit 2)"
    );
}

#[test]
fn a_whole_batch_file_unreadable_says_what_it_left_unjudgeable() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    copy_tree(&fixtures().join("dumps/self_hosted_pt"), &t);
    truncate(&t.join("trajectory/step_000000.pt"));
    let out = bin("losscheck")
        .args(["--step", "0", "--dump-dir"])
        .arg(&t)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("set aside as unreadable"), "{err}");
    assert!(err.contains("trajectory/step_000000.pt"), "{err}");
    assert!(!err.contains("panicked"));
}
