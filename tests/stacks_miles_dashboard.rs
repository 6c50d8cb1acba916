//! Miles' `--dump-details` dashboard mirror (`dashboard_columns/rollout_{id}.parquet`,
//! `save_dashboard_columns`' schema reproduced by fixtures/gen/make_stacks.py) in the
//! model (issue 29): rows, token ids, loss mask and engine log-probs checked against the
//! generator's manifest; the details folder holding both the `.pt` and the parquet stays
//! slime's; the two compare clean.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use rlforensics::model::step::LogProbSource;
use rlforensics::producers::step_reader_for;
use serde_json::Value as J;

fn stacks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks")
}

fn manifest() -> J {
    let text = std::fs::read_to_string(stacks().join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn dashboard_parquet_read_into_the_model() {
    let m = manifest();
    let dir = stacks().join("miles_dashboard");
    let r = step_reader_for(&dir).unwrap();
    assert_eq!(r.name(), "miles-dashboard");
    assert_eq!(r.steps(&dir).unwrap(), vec![3]);
    let d = r.read_step(&dir, 3).unwrap();
    assert!(d.unplaced.is_empty(), "{:?}", d.unplaced);
    let b = &d.cells[0].batch;
    let lp = b.log_probs(LogProbSource::Rollout).unwrap();
    assert_eq!(lp.tensor.shape(), &[4, 6]);
    let lp = lp.tensor.to_f64_vec();
    let ids = b.input_ids.as_ref().unwrap().tensor.to_f64_vec();
    let iw = b.input_ids.as_ref().unwrap().tensor.shape()[1];
    let mask = b.response_mask.as_ref().unwrap().tensor.to_f64_vec();
    for (i, row) in m["rows"].as_array().unwrap().iter().enumerate() {
        let want: Vec<f64> = row["rollout"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let n = want.len();
        assert_eq!(&lp[i * 6..i * 6 + n], want.as_slice(), "row {i}");
        assert!(lp[i * 6 + n..(i + 1) * 6].iter().all(|x| *x == 0.0));
        assert!(mask[i * 6..i * 6 + n].iter().all(|x| *x == 1.0));
        let toks: Vec<f64> = row["prompt"]
            .as_array()
            .unwrap()
            .iter()
            .chain(row["response"].as_array().unwrap())
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(&ids[i * iw..i * iw + toks.len()], toks.as_slice());
        let meta = &b.rows[i];
        assert_eq!(meta.sample.as_deref(), Some(i.to_string().as_str()));
        assert_eq!(meta.response_len, Some(n));
        assert_eq!(
            meta.prompt_len,
            Some(row["prompt"].as_array().unwrap().len())
        );
    }
}

#[test]
fn details_folder_stays_slime_and_compares_clean_with_its_mirror() {
    let details = stacks().join("miles");
    assert_eq!(step_reader_for(&details).unwrap().name(), "slime");
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg(&details)
        .arg(details.join("details/dashboard_columns"))
        .args(["--step", "3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("4 matched"), "{text}");
}

#[test]
fn a_parquet_without_the_columns_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    // any parquet named like the mirror: the reference fixture's TRL completions table
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let some = walk(&src)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "parquet") && !p.starts_with(stacks()))
        .expect("a parquet fixture");
    std::fs::copy(&some, dir.path().join("rollout_3.parquet")).unwrap();
    let r = step_reader_for(dir.path()).unwrap();
    let e = r.read_step(dir.path(), 3).unwrap_err().to_string();
    assert!(
        e.contains("rollout_3.parquet") && e.contains("missing") && e.contains("rollout_log_probs"),
        "{e}"
    );
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
