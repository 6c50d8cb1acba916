//! `dumpdiff` comparisons on the generated fixtures: the injected faults of
//! `fixtures/expected/faults.json` are flagged exactly where the generator put them, and
//! nothing else; the clean twin passes; the canonical CLI invocation works as written.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;
use rlforensics::compare::tolerance::Verdict;
use rlforensics::dumpdiff::report::Report;
use rlforensics::dumpdiff::{exit_code, run, Options};
use rlforensics::model::finding::Severity;
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn dumps(tree: &str) -> PathBuf {
    fixtures().join("dumps").join(tree)
}

fn faults() -> Json {
    let text = std::fs::read_to_string(fixtures().join("expected/faults.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn fault(id: &str) -> Json {
    faults()["faults"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap()
        .clone()
}

fn compare(a: &str, b: &str, remote: Option<&str>) -> Report {
    run(&Options {
        self_hosted: dumps(a),
        weaver: Some(dumps(b)),
        remote_api: remote.map(dumps),
        step: 0,
        ..Default::default()
    })
    .unwrap()
}

/// (section, rank, micro) of every cell at `verdict` (whole-batch cells as rank/micro
/// `u32::MAX`, so that they never pass for a per-rank cell).
fn cells_at(report: &Report, verdict: Verdict) -> BTreeSet<(String, u32, u32)> {
    report
        .sections
        .iter()
        .flat_map(|s| {
            s.cells
                .iter()
                .filter(move |c| c.verdict == verdict)
                .map(move |c| {
                    (
                        s.name.clone(),
                        c.rank.unwrap_or(u32::MAX),
                        c.micro
                            .unwrap_or(if c.rank.is_some() { 0 } else { u32::MAX }),
                    )
                })
        })
        .collect()
}

/// The failing cells faults.json predicts: each value fault's rank/micro in each kind it
/// affects that has a section (is_loss_debug → is_loss, loss → loss).
fn expected_failing_cells() -> BTreeSet<(String, u32, u32)> {
    let mut set = BTreeSet::new();
    for f in faults()["faults"].as_array().unwrap() {
        if f["is_value_fault"] != true {
            continue;
        }
        for kind in f["kinds_affected"].as_array().unwrap() {
            let section = match kind.as_str().unwrap() {
                "is_loss_debug" => "is_loss",
                other => other,
            };
            set.insert((
                section.to_string(),
                f["rank"].as_u64().unwrap() as u32,
                f["micro"].as_u64().unwrap() as u32,
            ));
        }
    }
    set
}

fn assert_exactly_injected_faults(report: &Report) {
    assert_eq!(cells_at(report, Verdict::Fail), expected_failing_cells());
    assert!(cells_at(report, Verdict::Warn).is_empty());
    // Coverage: rank 10 on the self-hosted side only, every comparable kind, both micros.
    let missing = fault("rank_missing");
    let rank = missing["rank"].as_u64().unwrap() as u32;
    let kinds: BTreeSet<String> = report.coverage.iter().map(|c| c.kind.clone()).collect();
    let affected: BTreeSet<String> = missing["kinds_affected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .filter(|k| k != "batch_inputs") // self-hosted has no batch_inputs to miss
        .collect();
    assert_eq!(kinds, affected);
    assert!(report
        .coverage
        .iter()
        .all(|c| c.rank == Some(rank) && c.present_on == "self-hosted"));
    let missing_cells: BTreeSet<_> = cells_at(report, Verdict::Missing)
        .into_iter()
        .map(|(_, r, _)| r)
        .collect();
    assert_eq!(missing_cells, BTreeSet::from([rank]));
}

#[test]
fn faulty_tree_flags_exactly_the_injected_faults() {
    let report = compare("self_hosted_pt", "weaver_faulty_pt", None);
    assert_exactly_injected_faults(&report);
    assert_eq!(report.verdict, Verdict::Fail);
    assert_eq!(exit_code(&report, Severity::Error), 1);
}

#[test]
fn first_divergence_is_the_shifted_old_log_probs_position() {
    let report = compare("self_hosted_pt", "weaver_faulty_pt", None);
    let f = fault("shifted_old_log_probs");
    let first = report.first_divergence.unwrap();
    assert_eq!(first.name, "is_loss.prob_ratio");
    assert_eq!(first.rank, Some(f["rank"].as_u64().unwrap() as u32));
    assert_eq!(first.micro, Some(f["micro"].as_u64().unwrap() as u32));
    let at = &f["first_differing_valid"];
    assert_eq!(first.row, Some(at["row"].as_u64().unwrap() as usize));
    assert_eq!(first.pos, Some(at["pos"].as_u64().unwrap() as usize));
    let faulty: f64 = at["faulty_prob_ratio"].as_str().unwrap().parse().unwrap();
    let correct: f64 = at["correct_prob_ratio"].as_str().unwrap().parse().unwrap();
    assert_eq!(first.b, faulty);
    // faults.json's correct ratio is weaver's (from bf16-rounded log_probs); ours is derived
    // from self-hosted f32 inputs, so they differ by at most the recorded bf16 noise.
    let noise: f64 = faults()["not_faults"]["bf16_noise"]["max_abs_diff_prob_ratio_valid"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (first.a - correct).abs() <= noise,
        "{} vs {correct}",
        first.a
    );
    assert!((first.a - faulty).abs() > 10.0 * noise);
}

#[test]
fn loss_sum_not_mean_values_are_reported() {
    let report = compare("self_hosted_pt", "weaver_faulty_pt", None);
    let f = fault("loss_sum_not_mean");
    let (rank, micro) = (
        f["rank"].as_u64().unwrap() as u32,
        f["micro"].as_u64().unwrap() as u32,
    );
    let cell = report
        .sections
        .iter()
        .find(|s| s.name == "is_loss")
        .unwrap()
        .cells
        .iter()
        .find(|c| c.rank == Some(rank) && c.micro == Some(micro))
        .unwrap();
    let loss = cell
        .comparisons
        .iter()
        .find(|c| c.name == "is_loss.loss")
        .unwrap();
    assert_eq!(loss.verdict, Verdict::Fail);
    let m = loss.metrics.as_ref().unwrap().max_abs.unwrap();
    assert_eq!(
        m.a,
        f["correct_loss"].as_str().unwrap().parse::<f64>().unwrap()
    );
    assert_eq!(
        m.b,
        f["faulty_loss"].as_str().unwrap().parse::<f64>().unwrap()
    );
}

#[test]
fn swapped_rows_are_paired_by_content() {
    let report = compare("self_hosted_pt", "weaver_faulty_pt", None);
    let f = fault("rows_swapped");
    let (rank, micro) = (
        f["rank"].as_u64().unwrap() as u32,
        f["micro"].as_u64().unwrap() as u32,
    );
    let map: Vec<usize> = f["row_map_weaver_to_self_hosted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let mut expected: Vec<(usize, usize)> = map.iter().enumerate().map(|(w, &s)| (s, w)).collect();
    expected.sort();
    for name in ["forward_data", "is_loss"] {
        let cell = report
            .sections
            .iter()
            .find(|s| s.name == name)
            .unwrap()
            .cells
            .iter()
            .find(|c| c.rank == Some(rank) && c.micro == Some(micro))
            .unwrap();
        assert_eq!(cell.verdict, Verdict::Pass, "{name}: {}", cell.reason);
        assert_eq!(cell.rows.as_ref().unwrap().pairs, expected, "{name}");
    }
}

#[test]
fn clean_twin_passes_with_bf16_noise() {
    let report = compare("self_hosted_pt", "weaver_pt", None);
    assert_eq!(report.verdict, Verdict::Pass);
    assert!(report.coverage.is_empty() && report.first_divergence.is_none());
    assert_eq!(exit_code(&report, Severity::Warning), 0);
    // The noise is there (weaver log_probs are bf16-rounded): compared, not ignored.
    let noise: f64 = faults()["not_faults"]["bf16_noise"]["max_abs_diff_log_probs_valid"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let max_lp = report
        .sections
        .iter()
        .find(|s| s.name == "forward_data")
        .unwrap()
        .cells
        .iter()
        .flat_map(|c| &c.comparisons)
        .filter(|c| c.name == "forward_data.log_probs")
        .map(|c| c.metrics.as_ref().unwrap().max_abs.unwrap().abs_diff)
        .fold(0.0, f64::max);
    assert_eq!(max_lp, noise);
}

#[test]
fn jsonl_trees_and_remote_advantages_give_the_same_verdicts() {
    let report = compare(
        "self_hosted_jsonl",
        "weaver_faulty_pt",
        Some("remote_api_jsonl"),
    );
    assert_exactly_injected_faults(&report);
    let clean = compare("self_hosted_jsonl", "weaver_jsonl", Some("remote_api_pt"));
    assert_eq!(clean.verdict, Verdict::Pass);
    // With prepared_trajectories, advantages and elementwise_loss are derived and compared.
    let is_loss = clean.sections.iter().find(|s| s.name == "is_loss").unwrap();
    for c in is_loss.cells.iter().flat_map(|c| &c.comparisons) {
        assert_ne!(c.verdict, Verdict::Skipped, "{}", c.name);
    }
}

#[test]
fn nan_in_padding_is_ignored() {
    let report = compare("self_hosted_pt", "weaver_pt", None);
    let trap = &faults()["not_faults"]["nan_in_padding"];
    let (rank, micro) = (
        trap["rank"].as_u64().unwrap() as u32,
        trap["micro"].as_u64().unwrap() as u32,
    );
    let cell = report.sections[0]
        .cells
        .iter()
        .find(|c| c.rank == Some(rank) && c.micro == Some(micro))
        .unwrap();
    let lp = cell
        .comparisons
        .iter()
        .find(|c| c.name == "forward_data.log_probs")
        .unwrap();
    assert_eq!(lp.metrics.as_ref().unwrap().nan_a, 0);
    assert_eq!(lp.verdict, Verdict::Pass);
}

#[test]
fn canonical_invocation_works_as_written() {
    let dir = tempfile::tempdir().unwrap();
    for (weaver, code) in [("weaver_faulty_pt", 1), ("weaver_pt", 0)] {
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        Command::cargo_bin("dumpdiff")
            .unwrap()
            .current_dir(dir.path())
            .args(["--self-hosted-dir"])
            .arg(dumps("self_hosted_pt"))
            .arg("--weaver-dir")
            .arg(dumps(weaver))
            .args(["--step", "0", "--output", "report.json"])
            .assert()
            .code(code);
        let json: Json =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
                .unwrap();
        assert_eq!(json["schema_version"], 1);
        assert_eq!(json["verdict"], if code == 1 { "fail" } else { "pass" });
    }
}

#[test]
fn python_style_aliases_and_rank_filter() {
    Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--self_hosted_dir")
        .arg(dumps("self_hosted_pt"))
        .arg("--weaver_dir")
        .arg(dumps("weaver_faulty_pt"))
        .args(["--step", "0", "--num_ranks", "3", "--format", "json"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("\"schema_version\": 1"));
}

#[test]
fn tolerance_file_error_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let tol = dir.path().join("tol.toml");
    std::fs::write(&tol, "[[rule]]\nname = \"x\"\nrtol = \"big\"\n").unwrap();
    Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--self-hosted-dir")
        .arg(dumps("self_hosted_pt"))
        .arg("--weaver-dir")
        .arg(dumps("weaver_pt"))
        .args(["--step", "0", "--tol-file"])
        .arg(&tol)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("tol.toml: line 3"));
}

#[test]
fn tolerance_rule_severity_decides_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let tol = dir.path().join("tol.toml");
    std::fs::write(
        &tol,
        "[[rule]]\nname = \"forward_data.log_probs\"\natol = 0.0\nrtol = 0.0\nseverity = \"warn\"\n",
    )
    .unwrap();
    let run = |fail_on: &str| {
        Command::cargo_bin("dumpdiff")
            .unwrap()
            .arg("--self-hosted-dir")
            .arg(dumps("self_hosted_pt"))
            .arg("--weaver-dir")
            .arg(dumps("weaver_pt"))
            .args(["--step", "0", "--fail-on", fail_on, "--tol-file"])
            .arg(&tol)
            .assert()
    };
    // bf16 noise in log_probs is beyond a zero tolerance: a warning, exit 1 only on --fail-on warn.
    // (The rule names forward_data's pair only: a zero tolerance on is_loss.log_probs would
    // also leave the ratios derived from them no room, and they would fail.)
    run("fail").code(0).stdout(predicate::str::contains("WARN"));
    run("warn").code(1);
}

fn ground_truth() -> Json {
    let text = std::fs::read_to_string(fixtures().join("expected/ground_truth.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn remote_only(a: &Path, remote: &Path) -> Report {
    run(&Options {
        self_hosted: a.to_path_buf(),
        remote_api: Some(remote.to_path_buf()),
        step: 0,
        ..Default::default()
    })
    .unwrap()
}

fn section<'a>(report: &'a Report, name: &str) -> &'a rlforensics::dumpdiff::report::Section {
    report.sections.iter().find(|s| s.name == name).unwrap()
}

#[test]
fn trajectories_and_datums_pair_by_content_with_the_shift() {
    let gt = ground_truth();
    let rows = gt["rows"].as_array().unwrap();
    // trajectory i ↔ datum ground_truth.rows[i].datum_index; the rest have no datum.
    let expected_pairs: Vec<(usize, usize)> = rows
        .iter()
        .filter_map(|r| {
            Some((
                r["trajectory_index"].as_u64()? as usize,
                r["datum_index"].as_u64()? as usize,
            ))
        })
        .collect();
    let dropped: Vec<usize> = rows
        .iter()
        .filter(|r| r["datum_index"].is_null())
        .map(|r| r["trajectory_index"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!((expected_pairs.len(), dropped.len()), (40, 8));
    for (a, remote) in [
        ("self_hosted_pt", "remote_api_pt"),
        ("self_hosted_jsonl", "remote_api_jsonl"),
    ] {
        let report = remote_only(&dumps(a), &dumps(remote));
        assert_eq!(report.verdict, Verdict::Pass, "{a} vs {remote}");
        assert_eq!(exit_code(&report, Severity::Warning), 0);
        let traj = section(&report, "trajectories");
        assert_eq!(traj.id, 1);
        let rs = traj.cells[0].rows.as_ref().unwrap();
        assert_eq!(rs.pairs, (0..48).map(|i| (i, i)).collect::<Vec<_>>());
        assert!(rs.only_reference.is_empty() && rs.only_other.is_empty());
        let count = |sec: &rlforensics::dumpdiff::report::Section, name: &str| {
            let c = sec.cells[0]
                .comparisons
                .iter()
                .find(|c| c.name == name)
                .unwrap();
            (c.verdict, c.metrics.as_ref().map(|m| m.count))
        };
        let tokens: u64 = rows
            .iter()
            .map(|r| r["prompt_len"].as_u64().unwrap() + r["response_len"].as_u64().unwrap())
            .sum();
        assert_eq!(
            count(traj, "trajectories.tokens"),
            (Verdict::Pass, Some(tokens))
        );
        assert_eq!(
            count(traj, "trajectories.reward"),
            (Verdict::Pass, Some(48))
        );
        assert_eq!(count(traj, "trajectories.advantages").0, Verdict::Skipped);
        let datums = section(&report, "datums");
        assert_eq!(datums.id, 5);
        let rs = datums.cells[0].rows.as_ref().unwrap();
        let mut pairs = expected_pairs.clone();
        pairs.sort_unstable();
        assert_eq!(rs.pairs, pairs);
        assert_eq!(rs.only_reference, dropped);
        assert!(rs.only_other.is_empty());
        assert!(datums.notes.contains(&format!(
            "8 trajectories have all-zero advantages (groups with identical rewards) → no datum: expected (trajectories {dropped:?})"
        )));
        // Every valid (response) position of every datum: Σ response_len over datums.
        let valid: u64 = rows
            .iter()
            .filter(|r| !r["datum_index"].is_null())
            .map(|r| r["response_len"].as_u64().unwrap())
            .sum();
        for name in ["datums.advantages", "datums.logprobs"] {
            assert_eq!(count(datums, name), (Verdict::Pass, Some(valid)), "{name}");
        }
        let shifted: u64 = rows
            .iter()
            .filter(|r| !r["datum_index"].is_null())
            .map(|r| r["prompt_len"].as_u64().unwrap() + r["response_len"].as_u64().unwrap() - 1)
            .sum();
        assert_eq!(
            count(datums, "datums.input_tokens"),
            (Verdict::Pass, Some(shifted))
        );
    }
}

/// Copy `tree` into a temp dir and let `edit` change its datums (jsonl) file.
fn edited_remote(mut edit: impl FnMut(&mut Json)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["prepared_trajectories", "datums", "training_metrics"] {
        let from = dumps("remote_api_jsonl")
            .join(kind)
            .join("step_000000.jsonl");
        std::fs::create_dir_all(dir.path().join(kind)).unwrap();
        let mut text = std::fs::read_to_string(&from).unwrap();
        if kind == "datums" {
            let mut v: Json = serde_json::from_str(&text).unwrap();
            edit(&mut v);
            text = serde_json::to_string(&v).unwrap() + "\n";
        }
        std::fs::write(dir.path().join(kind).join("step_000000.jsonl"), text).unwrap();
    }
    dir
}

#[test]
fn a_changed_datum_token_is_flagged_at_that_datum() {
    let (datum, pos) = (17usize, 5usize);
    let dir = edited_remote(|v| {
        let t = &mut v["datums"][datum]["input_tokens"][pos];
        *t = Json::from(t.as_i64().unwrap() + 1);
    });
    let report = remote_only(&dumps("self_hosted_pt"), dir.path());
    assert_eq!(report.verdict, Verdict::Fail);
    assert_eq!(
        cells_at(&report, Verdict::Fail),
        BTreeSet::from([("datums".to_string(), u32::MAX, u32::MAX)])
    );
    let traj = ground_truth()["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["datum_index"] == datum)
        .unwrap()["trajectory_index"]
        .as_u64()
        .unwrap() as usize;
    let first = report.first_divergence.clone().unwrap();
    assert_eq!(first.name, "datums.input_tokens");
    assert_eq!(
        (first.row, first.other_row, first.pos),
        (Some(traj), Some(datum), Some(pos))
    );
    assert_eq!(first.b, first.a + 1.0);
    // The datum still found its trajectory (by target_tokens): nothing reported unpaired.
    let rs = section(&report, "datums").cells[0].rows.clone().unwrap();
    assert_eq!((rs.pairs.len(), rs.only_other.len()), (40, 0));
}

#[test]
fn a_datum_with_a_wrong_advantage_is_flagged() {
    let datum = 3usize;
    let dir = edited_remote(|v| {
        let mask = v["datums"][datum]["loss_fn_inputs"]["loss_mask"].clone();
        let p = mask
            .as_array()
            .unwrap()
            .iter()
            .position(|m| m.as_f64() == Some(1.0))
            .unwrap();
        v["datums"][datum]["loss_fn_inputs"]["advantages"][p] = Json::from(5.0);
    });
    let report = remote_only(&dumps("self_hosted_pt"), dir.path());
    let first = report.first_divergence.unwrap();
    assert_eq!(
        (first.name.as_str(), first.other_row),
        ("datums.advantages", Some(datum))
    );
    assert_eq!(first.b, 5.0);
}

#[test]
fn no_progress_bar_when_stderr_is_a_pipe() {
    Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--self-hosted-dir")
        .arg(dumps("self_hosted_pt"))
        .arg("--weaver-dir")
        .arg(dumps("weaver_pt"))
        .args(["--step", "0"])
        .assert()
        .code(0)
        .stderr(predicate::str::is_empty());
}

/// Each side of a loss disagreement recomputed from its own inputs (losscheck): the two
/// value faults are the weaver's, and nothing else is adjudicated.
#[test]
fn disagreeing_losses_are_adjudicated_to_the_faulty_side() {
    let faults = faults();
    let with = |b: &str| {
        run(&Options {
            self_hosted: dumps("self_hosted_pt"),
            weaver: Some(dumps(b)),
            step: 0,
            adjudicate_with: Some("nexrl-is".into()),
            ..Default::default()
        })
        .unwrap()
    };
    let report = with("weaver_faulty_pt");
    let got: BTreeSet<(u32, u32)> = report
        .adjudication
        .iter()
        .map(|a| (a.rank, a.micro))
        .collect();
    let want: BTreeSet<(u32, u32)> = faults["faults"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["is_value_fault"] == true)
        .map(|f| {
            (
                f["rank"].as_u64().unwrap() as u32,
                f["micro"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    assert_eq!(got, want);
    for a in &report.adjudication {
        assert_eq!(
            a.conclusion,
            "weaver loss disagrees with its own inputs; self-hosted matches"
        );
        let fault = faults["faults"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["rank"] == a.rank && f["micro"] == a.micro)
            .unwrap();
        let weaver = a.sides.iter().find(|s| s.role == "weaver").unwrap();
        let faulty: f64 = fault["faulty_loss"].as_str().unwrap().parse().unwrap();
        assert_eq!(weaver.dumped_loss, Some(faulty));
        let correct: f64 = fault["correct_loss"].as_str().unwrap().parse().unwrap();
        let recomputed = weaver.recomputed_loss.unwrap();
        assert!(
            (recomputed - correct).abs() < 2e-3 * correct.abs(),
            "{recomputed} vs {correct}"
        );
    }
    assert!(with("weaver_pt").adjudication.is_empty());
    let off = run(&Options {
        self_hosted: dumps("self_hosted_pt"),
        weaver: Some(dumps("weaver_faulty_pt")),
        step: 0,
        ..Default::default()
    })
    .unwrap();
    assert!(off.adjudication.is_empty());
}

/// Without remote-api trajectories, the self-hosted advantages are recomputed from the
/// trajectories' rewards and group ids (the preset's convention) and match weaver's dump;
/// elementwise_loss is then derived too. Without a preset they are skipped, not guessed.
#[test]
fn self_hosted_advantages_are_recomputed_from_trajectories() {
    let with = |preset: Option<&str>| {
        run(&Options {
            self_hosted: dumps("self_hosted_pt"),
            weaver: Some(dumps("weaver_pt")),
            step: 0,
            advantage_preset: preset.map(str::to_string),
            ..Default::default()
        })
        .unwrap()
    };
    let is_loss = |r: &Report, name: &str| -> Vec<(Verdict, String)> {
        r.sections
            .iter()
            .find(|s| s.name == "is_loss")
            .unwrap()
            .cells
            .iter()
            .flat_map(|c| &c.comparisons)
            .filter(|c| c.name == format!("is_loss.{name}"))
            .map(|c| (c.verdict, c.origin_a.how.clone()))
            .collect()
    };
    let r = with(Some("nexrl-is"));
    for name in ["advantages", "elementwise_loss"] {
        let got = is_loss(&r, name);
        assert_eq!(got.len(), 24, "{name}: one per rank × micro");
        assert!(
            got.iter()
                .all(|(v, how)| *v == Verdict::Pass && how == "derived"),
            "{name}: {got:?}"
        );
    }
    let r = with(None);
    assert!(is_loss(&r, "advantages")
        .iter()
        .all(|(v, _)| *v == Verdict::Skipped));
}

/// A cell's coordinates and one of its comparisons.
type CellComparison<'r> = (
    (Option<u32>, Option<u32>),
    &'r rlforensics::dumpdiff::report::Comparison,
);

/// The comparisons of `name` in `section`, by (rank, micro).
fn comparisons_of<'r>(report: &'r Report, section: &str, name: &str) -> Vec<CellComparison<'r>> {
    report
        .sections
        .iter()
        .filter(|s| s.name == section)
        .flat_map(|s| &s.cells)
        .flat_map(|c| {
            c.comparisons
                .iter()
                .filter(move |x| x.name == name)
                .map(move |x| ((c.rank, c.micro), x))
        })
        .collect()
}

/// Weaver dumps one log-prob tensor twice (forward_data and is_loss_debug): equal copies
/// give equal metrics, and a copy changed in one place is compared on its own, the change
/// reported at its position in is_loss only.
#[test]
fn is_loss_log_probs_are_compared_on_their_own_when_they_differ() {
    let dir = tempfile::tempdir().unwrap();
    let (rank, micro, pos) = (2u32, 1u32, 3usize);
    for kind in ["forward_data", "loss", "is_loss_debug"] {
        let from = dumps("weaver_jsonl").join(kind);
        std::fs::create_dir_all(dir.path().join(kind)).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_str().unwrap().to_string();
            let mut text = std::fs::read_to_string(&f).unwrap();
            if kind == "is_loss_debug"
                && name == format!("step_000000_rank{rank}_micro{micro}.jsonl")
            {
                let mut v: Json = serde_json::from_str(&text).unwrap();
                v["log_probs"][0][pos] = Json::from(-9.5);
                text = serde_json::to_string(&v).unwrap() + "\n";
            }
            std::fs::write(dir.path().join(kind).join(name), text).unwrap();
        }
    }
    let with = |weaver: &Path| {
        run(&Options {
            self_hosted: dumps("self_hosted_jsonl"),
            weaver: Some(weaver.to_path_buf()),
            step: 0,
            ..Default::default()
        })
        .unwrap()
    };
    let metrics = |c: &rlforensics::dumpdiff::report::Comparison| {
        serde_json::to_string(c.metrics.as_ref().unwrap()).unwrap()
    };
    let (clean, edited) = (with(&dumps("weaver_jsonl")), with(dir.path()));
    let fwd = comparisons_of(&clean, "forward_data", "forward_data.log_probs");
    let is = comparisons_of(&clean, "is_loss", "is_loss.log_probs");
    assert_eq!(fwd.len(), 24);
    for ((k1, a), (k2, b)) in fwd.iter().zip(&is) {
        assert_eq!(k1, k2);
        assert_eq!(metrics(a), metrics(b), "{k1:?}");
    }
    let cell = (Some(rank), Some(micro));
    for (k, c) in comparisons_of(&edited, "forward_data", "forward_data.log_probs") {
        let before = fwd.iter().find(|(key, _)| *key == k).unwrap().1;
        assert_eq!(metrics(c), metrics(before), "{k:?}");
    }
    for (k, c) in comparisons_of(&edited, "is_loss", "is_loss.log_probs") {
        let before = is.iter().find(|(key, _)| *key == k).unwrap().1;
        if k != cell {
            assert_eq!(metrics(c), metrics(before), "{k:?}");
            continue;
        }
        assert_eq!(c.verdict, Verdict::Fail);
        let m = c.metrics.as_ref().unwrap();
        let first = m.first_beyond.unwrap();
        assert_eq!(
            (first.loc.other_row, first.loc.pos, first.b),
            (0, pos, -9.5)
        );
        assert_eq!(m.beyond, 1);
    }
}

/// dumpdiff of step 0 of `self_hosted` against `other` (given with `side_flag`), which must
/// exit 2 (the bad file set aside, the rest reported on stdout); its stderr.
fn stderr_of_bad_input(self_hosted: &Path, side_flag: &str, other: &Path) -> String {
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--self-hosted-dir")
        .arg(self_hosted)
        .arg(side_flag)
        .arg(other)
        .args(["--step", "0"])
        .assert()
        .code(2)
        .get_output()
        .clone();
    assert!(String::from_utf8_lossy(&out.stdout).contains("could not be read"));
    String::from_utf8(out.stderr).unwrap()
}

/// A datum field of the wrong type is not read as an empty list: dumpdiff exits 2 naming
/// the file and the key path, with no report.
#[test]
fn an_unreadable_datum_field_exits_2_naming_file_and_key() {
    let dir = edited_remote(|v| v["datums"][3]["loss_fn_inputs"]["logprobs"] = Json::from("n/a"));
    // the file is set aside (issue 28: one bad file never sinks the run): the report of
    // the rest is printed, the file named with its key, and the exit code is 2
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--self-hosted-dir")
        .arg(dumps("self_hosted_pt"))
        .arg("--remote-api-dir")
        .arg(dir.path())
        .args(["--step", "0"])
        .assert()
        .code(2)
        .get_output()
        .clone();
    let err = String::from_utf8(out.stdout).unwrap();
    assert!(
        err.lines()
            .next()
            .unwrap()
            .contains("— 1 whole-batch file could not be read (1 file, exit 2)"),
        "{err}"
    );
    let file = dir.path().join("datums/step_000000.jsonl");
    assert!(
        err.contains(&format!(
            "{}: key datums[3].loss_fn_inputs.logprobs: expected a list of numbers, found str",
            file.display()
        )),
        "{err}"
    );
}

/// An unknown `--preset` is a usage error (exit 2), not silently ignored by the
/// advantage recomputation.
#[test]
fn an_unknown_preset_is_a_usage_error() {
    let err = run(&Options {
        self_hosted: dumps("self_hosted_pt"),
        weaver: Some(dumps("weaver_pt")),
        step: 0,
        advantage_preset: Some("no-such-preset".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        matches!(&err, rlforensics::Error::Usage(m) if m.starts_with("--preset no-such-preset: ")),
        "{err:?}"
    );
}

/// Copy a fixture tree into a temp dir.
fn copied_tree(tree: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for kind in std::fs::read_dir(dumps(tree)).unwrap() {
        let kind = kind.unwrap().path();
        let to = dir.path().join(kind.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&kind).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// A per-token key holding something that is no tensor (a string where weaver's
/// `entropy` belongs) is an error naming the file and key, not "not dumped on both sides".
#[test]
fn a_per_token_key_of_the_wrong_type_exits_2_naming_file_and_key() {
    let dir = copied_tree("weaver_jsonl");
    let file = dir
        .path()
        .join("forward_data/step_000000_rank1_micro0.jsonl");
    let mut v: Json = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    v["entropy"] = Json::from("bf16");
    std::fs::write(&file, serde_json::to_string(&v).unwrap() + "\n").unwrap();
    let err = stderr_of_bad_input(&dumps("self_hosted_jsonl"), "--weaver-dir", dir.path());
    let want = format!(
        "{}: key entropy: expected a tensor or a rectangular nested list, found str",
        file.display()
    );
    assert!(err.contains(&want), "{err}");
}
