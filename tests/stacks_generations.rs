//! verl's `rollout_data_dir` / `validation_data_dir` generation dumps (`{step}.jsonl`) in
//! the model (issue 29): written by verl 0.9.1's own `RayPPOTrainer._write_generations`
//! in fixtures/gen/make_stacks.py, read through `StepReader` (rows: score, index) and
//! `read_generations` (text), named by `dumpdiff --inspect`, and still read by logscan
//! as completions.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use rlforensics::producers::step_reader_for;
use rlforensics::producers::verl_generations::read_generations;
use serde_json::Value as J;

fn tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks/verl_generations")
}

fn spec() -> J {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks/manifest.json");
    let m: J = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    m["trees"]["verl_generations"].clone()
}

#[test]
fn rollout_dump_read_into_rows_with_scores_and_text() {
    let s = spec();
    let r = step_reader_for(&tree()).unwrap();
    assert_eq!(r.name(), "verl-generations");
    // the validation dump of the same step does not add a step
    assert_eq!(r.steps(&tree()).unwrap(), vec![3]);
    let d = r.read_step(&tree(), 3).unwrap();
    assert_eq!(d.cells.len(), 1);
    let rows = &d.cells[0].batch.rows;
    let scores: Vec<f64> = rows.iter().map(|x| x.reward.unwrap()).collect();
    let want: Vec<f64> = s["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(scores, want);
    assert_eq!(d.cells[0].files, vec![tree().join("rollout/3.jsonl")]);
    assert!(d.cells[0].batch.log_probs.is_empty());

    let g = read_generations(&tree().join("rollout/3.jsonl")).unwrap();
    assert_eq!(g.len(), 4);
    for (i, row) in g.iter().enumerate() {
        assert_eq!(row.input, s["inputs"][i].as_str().unwrap());
        assert_eq!(row.output, s["outputs"][i].as_str().unwrap());
        assert_eq!(row.gts.as_deref(), s["gts"][i].as_str());
        assert_eq!(row.extras["acc"], s["acc"][i].as_f64().unwrap());
        assert_eq!(
            row.text_extras["request_id"],
            s["request_id"][i].as_str().unwrap()
        );
        // verl drops an extra without one value per sample
        assert!(!row.extras.contains_key("too_short"));
        assert_eq!(row.step, 3);
    }
}

#[test]
fn validation_dump_alone_is_read_with_null_ground_truth() {
    let v = tree().join("validation");
    let d = step_reader_for(&v).unwrap().read_step(&v, 3).unwrap();
    let scores: Vec<f64> = d.cells[0]
        .batch
        .rows
        .iter()
        .map(|x| x.reward.unwrap())
        .collect();
    assert_eq!(scores, vec![0.5, 0.0]);
    let g = read_generations(&v.join("3.jsonl")).unwrap();
    assert_eq!(g[0].gts, None);
}

#[test]
fn inspect_names_the_producer_and_logscan_reads_completions() {
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--inspect")
        .arg(tree())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("producer: verl-generations"), "{text}");
    assert!(text.contains("4 rows"), "{text}");
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg(tree().join("rollout"))
        .args(["--format", "json"])
        .output()
        .unwrap();
    let j: J = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["files"][0]["format"], "rollout jsonl (4 completions)");
}

#[test]
fn a_bad_record_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("7.jsonl");
    std::fs::write(
        &f,
        "{\"input\": \"a\", \"output\": \"b\", \"gts\": null, \"score\": 1.0, \"step\": 7}\n{\"input\": \"a\", \"output\": \"b\", \"gts\": null, \"score\": \"high\", \"step\": 7}\n",
    )
    .unwrap();
    let r = step_reader_for(dir.path()).unwrap();
    let e = r.read_step(dir.path(), 7).unwrap_err().to_string();
    assert!(
        e.contains("7.jsonl") && e.contains("line 2") && e.contains("score"),
        "{e}"
    );
}
