//! `losscheck DUMP --step N` on other stacks' dumps (issue 29): verl, slime and NeMo-RL
//! dump the loss inputs but no loss; losscheck says so and recomputes the loss under the
//! stack's documented defaults. Expected values come from fixtures/gen/make_stacks.py's
//! manifest: verl's from verl 0.9.1's own `compute_policy_loss_vanilla`, slime's and
//! NeMo-RL's from their formulas written out in torch.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value as J;

fn stacks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks")
}

fn manifest() -> J {
    let text = std::fs::read_to_string(stacks().join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `losscheck --format json TREE --step 3 [extra]`: exit code and report.
fn run(tree: &str, extra: &[&str]) -> (i32, J, String) {
    let out = Command::cargo_bin("losscheck")
        .unwrap()
        .args(["--format", "json"])
        .arg(stacks().join(tree))
        .args(["--step", "3"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(J::Null);
    (out.status.code().unwrap(), json, stderr)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-9)
}

#[test]
fn verl_no_loss_dumped_recomputed_as_verl_computes_it() {
    let want = manifest()["losses"]["verl"]["pg_loss"].as_f64().unwrap();
    for tree in ["verl", "verl_numpy"] {
        let (code, r, err) = run(tree, &[]);
        assert_eq!(code, 0, "{tree}: {err}");
        assert_eq!(r["producer"], "verl");
        assert_eq!(r["loss_dumped"], false);
        assert!(r["statement"]
            .as_str()
            .unwrap()
            .starts_with("verl dumps no loss for this step"));
        let got = r["pg_loss"].as_f64().unwrap();
        // verl computes in float32: agreement to ~1e-7 relative
        assert!(close(got, want), "{tree}: {got} vs verl's {want}");
        assert_eq!(r["cells"][0]["tokens"], 17);
        let assumed = r["assumptions"].to_string();
        assert!(assumed.contains("current = old"), "{assumed}");
        assert!(assumed.contains("rollout_is_weights"), "{assumed}");
    }
}

#[test]
fn verl_logged_pg_loss_agrees_and_a_different_one_exits_1() {
    let logs = stacks().join("logs");
    let ok = logs.join("verl_steps.jsonl");
    let (code, r, err) = run("verl", &["--logs", ok.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["logged"]["key"], "actor/pg_loss");
    assert_eq!(r["logged"]["line"], 3);
    assert_eq!(r["logged"]["agrees"], true);
    let bad = logs.join("verl_steps_planted.jsonl");
    let (code, r, _) = run("verl", &["--logs", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(r["logged"]["agrees"], false);
    let planted = manifest()["losses"]["planted_log_value"].as_f64().unwrap();
    assert_eq!(r["logged"]["value"].as_f64().unwrap(), planted);
}

#[test]
fn verl_rollout_skip_has_nothing_to_recompute_and_is_not_a_failure() {
    let (code, r, err) = run("verl_rollout_skip", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(r["pg_loss"].is_null());
    assert!(r["cannot_recompute"]
        .as_str()
        .unwrap()
        .contains("advantages"));
}

#[test]
fn slime_recomputed_per_rank_and_over_the_step() {
    let m = manifest();
    let want = &m["losses"]["slime"];
    let (code, r, err) = run("slime", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(r["statement"]
        .as_str()
        .unwrap()
        .starts_with("slime dumps no loss for this step"));
    let got = r["pg_loss"].as_f64().unwrap();
    assert!(
        (got - want["pg_loss"].as_f64().unwrap()).abs() < 1e-9,
        "{got}"
    );
    let cells = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for c in cells {
        let rank = c["rank"].to_string();
        let w = want["rank_pg_loss"][&rank].as_f64().unwrap();
        assert!(close(c["pg_loss"].as_f64().unwrap(), w), "rank {rank}: {c}");
    }
}

#[test]
fn nemo_rl_pg_term_recomputed_and_the_kl_term_named_as_not() {
    let want = manifest()["losses"]["nemo_rl"]["pg_loss"].as_f64().unwrap();
    let (code, r, err) = run("nemo_rl", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(close(r["pg_loss"].as_f64().unwrap(), want));
    assert!(r["notes"].to_string().contains("KL term"));
}

#[test]
fn a_producer_without_a_trainer_loss_needs_a_preset() {
    let (code, _, err) = run("sglang_dumper", &[]);
    assert_eq!(code, 2);
    assert!(err.contains("--preset"), "{err}");
    // with --preset verl-vanilla the SGLang dump of the same step gives verl's token-mean
    // of −A (no importance weights dumped there)
    let (code, r, err) = run("sglang_dumper", &["--preset", "verl-vanilla"]);
    assert_eq!(code, 0, "{err}");
    let want = manifest()["losses"]["nemo_rl"]["pg_loss"].as_f64().unwrap();
    assert!(close(r["pg_loss"].as_f64().unwrap(), want), "{r}");
}

#[test]
fn logs_without_a_dump_is_a_usage_error() {
    let out = Command::cargo_bin("losscheck")
        .unwrap()
        .args(["--dump-dir", "x", "--logs", "y"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_bad_log_line_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("steps.jsonl");
    std::fs::write(&f, "{\"step\": 1}\nnot json\n").unwrap();
    let (code, _, err) = run("verl", &["--logs", f.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("steps.jsonl") && err.contains("line 2"),
        "{err}"
    );
}

#[test]
fn a_nexrl_tree_given_as_dump_is_checked_as_with_dump_dir() {
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dumps/weaver_faulty_pt");
    let by = |args: &[&std::ffi::OsStr]| {
        let out = Command::cargo_bin("losscheck")
            .unwrap()
            .args(["--format", "json", "--step", "0"])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), out.stdout)
    };
    let positional = by(&[tree.as_os_str()]);
    let flag = by(&["--dump-dir".as_ref(), tree.as_os_str()]);
    assert_eq!(positional, flag);
    // the faulty tree is inconsistent: the positional door reaches the tree check
    assert_eq!(positional.0, Some(1));
}
