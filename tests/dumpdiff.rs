//! `dumpdiff` comparisons on the generated fixtures: the injected faults of
//! `fixtures/expected/faults.json` are flagged exactly where the generator put them, and
//! nothing else; the clean twin passes; the canonical CLI invocation works as written.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;
use rlforensics::compare::tolerance::{Severity, Verdict};
use rlforensics::dumpdiff::report::Report;
use rlforensics::dumpdiff::{exit_code, run, Options};
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

/// (section, rank, micro) of every cell at `verdict`.
fn cells_at(report: &Report, verdict: Verdict) -> BTreeSet<(String, u32, u32)> {
    report
        .sections
        .iter()
        .flat_map(|s| {
            s.cells
                .iter()
                .filter(move |c| c.verdict == verdict)
                .map(move |c| (s.name.clone(), c.rank.unwrap(), c.micro.unwrap_or(0)))
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
    assert_eq!(exit_code(&report, Severity::Fail), 1);
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
    assert_eq!(exit_code(&report, Severity::Warn), 0);
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
        "[[rule]]\nname = \"log_probs\"\natol = 0.0\nrtol = 0.0\nseverity = \"warn\"\n",
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
    run("fail").code(0).stdout(predicate::str::contains("WARN"));
    run("warn").code(1);
}
