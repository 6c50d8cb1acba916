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
    run_at(&stacks().join(tree), extra)
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

/// `losscheck --format json DUMP --step 3 [extra]` on a tree outside fixtures/stacks.
fn run_at(tree: &Path, extra: &[&str]) -> (i32, J, String) {
    let out = Command::cargo_bin("losscheck")
        .unwrap()
        .args(["--format", "json"])
        .arg(tree)
        .args(["--step", "3"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(J::Null);
    (out.status.code().unwrap(), json, stderr)
}

#[test]
fn slime_console_log_read_for_its_logged_pg_loss() {
    // slime logs `step N: {'train/pg_loss': …}` through Python's logging (Ray-prefixed)
    let logs = stacks().join("logs");
    let want = manifest()["losses"]["slime"]["pg_loss"].as_f64().unwrap();
    let good = logs.join("slime_console.log");
    let (code, r, err) = run("slime", &["--logs", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["logged"]["key"], "train/pg_loss");
    assert_eq!(r["logged"]["line"], 4);
    assert_eq!(r["logged"]["value"].as_f64().unwrap(), want);
    assert_eq!(r["logged"]["agrees"], true);
    // the planted console logged the token-mean value (NeMo-RL's aggregation) at step 3
    let planted = logs.join("slime_console_planted.log");
    let (code, r, err) = run("slime", &["--logs", planted.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    let other = manifest()["losses"]["nemo_rl"]["pg_loss"].as_f64().unwrap();
    assert!(close(r["logged"]["value"].as_f64().unwrap(), other), "{r}");
    assert_eq!(r["logged"]["agrees"], false);
    // a text file with no step record is refused, naming the file
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("notes.txt");
    std::fs::write(&junk, "hello\nno metrics here\n").unwrap();
    let (code, _, err) = run("slime", &["--logs", junk.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("notes.txt") && err.contains("step records"),
        "{err}"
    );
}

fn inhouse() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/inhouse")
}

fn inhouse_run(tree: &str, extra: &[&str]) -> (i32, J, String) {
    let mapping = inhouse().join("mapping.toml");
    let mut args = vec!["--mapping", mapping.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, r, err) = run_at(&inhouse().join(tree), &args);
    (code, r, err)
}

fn inhouse_manifest() -> J {
    serde_json::from_str(&std::fs::read_to_string(inhouse().join("manifest.json")).unwrap())
        .unwrap()
}

#[test]
fn an_in_house_layout_that_dumps_its_loss_is_checked_cell_by_cell() {
    // each cell's pg_loss is verl 0.9.1's own compute_policy_loss_vanilla (float32) of the
    // micro, with current ≠ old (clipping and the dual clip engaged) and TIS weights
    let m = inhouse_manifest();
    let (code, r, err) = inhouse_run("run", &["--preset", "verl-vanilla"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["producer"], "inhouse-trainer");
    assert_eq!(r["loss_dumped"], true);
    assert!(r["statement"]
        .as_str()
        .unwrap()
        .starts_with("inhouse-trainer dumps a loss for this step: checked"));
    let cells = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    for (c, w) in cells.iter().zip(m["cells"].as_array().unwrap()) {
        assert_eq!((&c["rank"], &c["micro"]), (&w["rank"], &w["micro"]));
        assert_eq!(c["tokens"], w["tokens"]);
        let want = w["pg_loss"].as_f64().unwrap();
        // dumped: the f32 verl wrote (rank 0 micro 1 as a Python float of it)
        assert_eq!(c["dumped"].as_f64().unwrap() as f32, want as f32, "{c}");
        // recomputed in f64 from the f32 inputs: verl's f32 arithmetic to ~1e-7
        let got = c["pg_loss"].as_f64().unwrap();
        assert!(
            (got - want).abs() <= 2e-7 * want.abs().max(1.0),
            "{got} vs {want}"
        );
        assert_eq!(c["agrees"], true);
    }
    assert!(r.get("cannot_judge").is_none());
    // without --preset a mapped layout has no defaults to recompute with
    let (code, _, err) = inhouse_run("run", &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("inhouse-trainer") && err.contains("--preset"),
        "{err}"
    );
}

#[test]
fn a_planted_dumped_loss_fails_only_its_cell() {
    let p = &inhouse_manifest()["planted"];
    let (code, r, err) = inhouse_run("planted", &["--preset", "verl-vanilla"]);
    assert_eq!(code, 1, "{err}");
    for c in r["cells"].as_array().unwrap() {
        let planted = c["rank"] == p["rank"] && c["micro"] == p["micro"];
        assert_eq!(c["agrees"], !planted, "{c}");
        if planted {
            assert_eq!(
                c["dumped"].as_f64().unwrap() as f32,
                p["dumped"].as_f64().unwrap() as f32
            );
        }
    }
}

#[test]
fn a_convention_that_reproduces_no_dumped_loss_is_replaced_or_cannot_judge() {
    // --agg seq-mean-token-sum reproduces none of the four; token-mean reproduces all:
    // it is adopted, said, and nothing fails
    let (code, r, err) = inhouse_run(
        "run",
        &["--preset", "verl-vanilla", "--agg", "seq-mean-token-sum"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["config"]["agg"]["mode"], "token-mean");
    let assumed = r["assumptions"].to_string();
    assert!(
        assumed.contains("reproduced with token-mean aggregation")
            && assumed.contains("4 of 4")
            && assumed.contains("seq-mean-token-sum"),
        "{assumed}"
    );
    assert!(r["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["agrees"] == true));
    // clip 0.01 reproduces none under any aggregation: cannot judge, exit 0, no verdicts
    let (code, r, err) = inhouse_run(
        "run",
        &[
            "--preset",
            "verl-vanilla",
            "--eps-low",
            "0.01",
            "--eps-high",
            "0.01",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(r["cannot_judge"]
        .as_str()
        .unwrap()
        .contains("reproduces any of the 4 dumped values"));
    assert!(r["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c.get("agrees").is_none() && c["dumped"].is_f64()));
    // the planted tree under the same wrong flags: still cannot judge, never a failure
    let (code, _, err) = inhouse_run(
        "planted",
        &[
            "--preset",
            "verl-vanilla",
            "--eps-low",
            "0.01",
            "--eps-high",
            "0.01",
        ],
    );
    assert_eq!(code, 0, "{err}");
}
