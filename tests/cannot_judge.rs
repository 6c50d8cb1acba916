//! Check before judging (issue 28): when the conventions the tools find do not reproduce a
//! side's own dumped values on most cells, the picture is wrong, not the data: losscheck
//! says "cannot judge" (a warning, exit 0 at the default `--fail-on`) and dumpdiff's
//! adjudication blames no side. One test per kind of convention withheld; the trees are
//! the JSONL fixtures edited here (no generator needed).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value as Json;

fn dumps(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dumps")
        .join(name)
}

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

/// Rewrite every `.jsonl` file of `dir` (one JSON record each) with `edit`.
fn edit_all(dir: &Path, edit: impl Fn(&mut Json)) {
    for f in std::fs::read_dir(dir).unwrap() {
        let f = f.unwrap().path();
        let mut v: Json = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&f, serde_json::to_string(&v).unwrap() + "\n").unwrap();
    }
}

fn losscheck(tree: &Path) -> (i32, Json, String) {
    let run = |json: bool| {
        let mut c = Command::cargo_bin("losscheck").unwrap();
        c.arg("--dump-dir").arg(tree);
        if json {
            c.args(["--format", "json"]);
        }
        c.output().unwrap()
    };
    let (j, t) = (run(true), run(false));
    assert_eq!(j.status.code(), t.status.code());
    (
        j.status.code().unwrap(),
        serde_json::from_slice(&j.stdout).unwrap(),
        String::from_utf8(t.stdout).unwrap(),
    )
}

fn adjudication(s: &Path) -> Json {
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .args(["--step", "0", "--format", "json", "--self-hosted-dir"])
        .arg(s)
        .arg("--weaver-dir")
        .arg(dumps("weaver_jsonl"))
        .output()
        .unwrap();
    let v: Json = serde_json::from_slice(&out.stdout).unwrap();
    v["adjudication"].clone()
}

/// Every cell "cannot judge", none inconsistent, exit 0; the count line says why; dumpdiff
/// blames neither side.
fn assert_cannot_judge(tree: &Path) {
    let (code, report, table) = losscheck(tree);
    assert_eq!(code, 0, "{table}");
    let statuses: Vec<&str> = report["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.len(), 24);
    assert!(
        statuses.iter().all(|s| *s == "cannot-judge"),
        "{statuses:?}"
    );
    assert_eq!(
        table.lines().next().unwrap(),
        "losscheck step 0: WARN — cannot judge 24 of 24 cells: the conventions found reproduce only 0 of this tree's own losses"
    );
    // a warning: --fail-on warning makes it exit 1
    let strict = Command::cargo_bin("losscheck")
        .unwrap()
        .arg("--dump-dir")
        .arg(tree)
        .args(["--fail-on", "warning"])
        .output()
        .unwrap();
    assert_eq!(strict.status.code(), Some(1));
    let adj = adjudication(tree);
    let adj = adj.as_array().unwrap();
    assert!(!adj.is_empty());
    for a in adj {
        let c = a["conclusion"].as_str().unwrap();
        assert!(c.contains("cannot judge self-hosted"), "{c}");
        assert!(!c.contains("disagrees with its own inputs"), "{c}");
        let sh = &a["sides"][0];
        assert_eq!(sh["role"], "self-hosted");
        assert_eq!(sh["status"], "cannot-judge");
    }
}

#[test]
fn old_log_probs_rows_in_an_order_nothing_explains_cannot_be_judged() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    copy_tree(&dumps("self_hosted_jsonl"), &t);
    // the rows rotated by 7: neither the trajectory file's order nor NexRL's batch order
    edit_all(&t.join("old_log_probs"), |v| {
        v["old_log_probs"].as_array_mut().unwrap().rotate_left(7);
    });
    assert_cannot_judge(&t);
}

#[test]
fn a_loss_scale_nothing_states_cannot_be_judged() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    copy_tree(&dumps("self_hosted_jsonl"), &t);
    // every dumped loss scaled by a factor no extra_info states (loss_scale_factor)
    edit_all(&t.join("loss"), |v| {
        for k in ["loss", "pg_loss"] {
            let x = v[k].as_f64().unwrap();
            v[k] = Json::from(x * 0.37);
        }
        let x = v["metrics"]["pg_loss"].as_f64().unwrap();
        v["metrics"]["pg_loss"] = Json::from(x * 0.37);
    });
    assert_cannot_judge(&t);
}

#[test]
fn one_faulty_cell_among_many_is_still_called_inconsistent() {
    // the gate needs most cells to fail: one cell's fault stays a failure
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    copy_tree(&dumps("self_hosted_jsonl"), &t);
    let f = t.join("loss/step_000000_rank4_micro1.jsonl");
    let mut v: Json = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let x = v["loss"].as_f64().unwrap();
    v["loss"] = Json::from(x * 2.0 + 0.5);
    std::fs::write(&f, serde_json::to_string(&v).unwrap() + "\n").unwrap();
    let (code, report, _) = losscheck(&t);
    assert_eq!(code, 1);
    let bad: Vec<(u64, u64)> = report["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["status"] == "inconsistent")
        .map(|v| (v["rank"].as_u64().unwrap(), v["micro"].as_u64().unwrap()))
        .collect();
    assert_eq!(bad, [(4, 1)]);
}
