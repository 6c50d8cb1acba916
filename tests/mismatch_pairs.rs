//! mismatch across two trees of one step (trainer A vs trainer B, `mismatch A B`): the
//! planted steps of `fixtures/mismatch/trees/<kind>/` (`make_mismatch.py --trees`), A in
//! the SGLang dumper's layout (two ranks), B in NeMo-RL's (one whole-sequence cell), B's
//! rows reordered, one row on each side only. Rows pair by content; the metrics equal
//! the generator's float64 numpy values to 1e-12; the attribution names the planted
//! token ids / positions / rank; the unpaired rows are counted.

use std::path::{Path, PathBuf};

use rlforensics::mismatch::{analyse_pair, report::StepReport, Options};
use rlforensics::model::step::LogProbSource;
use serde_json::Value as J;

fn tree(kind: &str) -> (PathBuf, PathBuf, J) {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/mismatch/trees")
        .join(kind);
    let expected: J =
        serde_json::from_str(&std::fs::read_to_string(base.join("expected.json")).unwrap())
            .unwrap();
    (
        base.join("a/sglang_dumper"),
        base.join("b/nemo_rl"),
        expected,
    )
}

fn pair_report(kind: &str) -> (StepReport, J) {
    let (a, b, expected) = tree(kind);
    let (ra, rb) = (
        rlforensics::producers::step_reader_for(&a).unwrap(),
        rlforensics::producers::step_reader_for(&b).unwrap(),
    );
    assert_eq!((ra.name(), rb.name()), ("sglang-dumper", "nemo-rl"));
    let opts = Options {
        pair: (LogProbSource::Old, LogProbSource::Old),
        bucket_width: Some(8),
        ..Options::default()
    };
    let (sa, sb) = (ra.open_step(&a, 3).unwrap(), rb.open_step(&b, 3).unwrap());
    (
        analyse_pair(sa.as_ref(), sb.as_ref(), &opts).unwrap(),
        expected,
    )
}

fn check_counts_and_metrics(kind: &str, rep: &StepReport, expected: &J) {
    let p = rep.against.as_ref().expect("a pairing section");
    assert_eq!(p.producer_b, "nemo-rl");
    assert_eq!(
        p.rows_paired as u64,
        expected["rows_paired"].as_u64().unwrap()
    );
    assert_eq!((p.only_a, p.only_b), (1, 1), "{kind}");
    assert_eq!((p.without_ids_a, p.without_ids_b), (0, 0));
    // A's row 4 sits on rank 0 as its third row; B's extra row is its last.
    assert_eq!(
        (p.first_only_a[0].rank, p.first_only_a[0].row),
        (0, 2),
        "{kind}"
    );
    assert_eq!(p.first_only_b[0].row, 15, "{kind}");
    assert_eq!(rep.coverage.unmatched_rows, 2);
    assert_eq!(rep.coverage.rows, 15);
    assert_eq!(rep.coverage.tokens, expected["tokens"].as_u64().unwrap());
    assert_eq!(rep.coverage.cells, 2);
    let want = expected["expected_numpy"].as_object().unwrap();
    assert_eq!(want.len(), 25);
    for (name, v) in want {
        let (got, v) = (rep.metric(name).unwrap(), v.as_f64().unwrap());
        assert!(
            (got - v).abs() <= 1e-12 * v.abs().max(1.0),
            "{kind} {name}: {got} vs numpy {v}"
        );
    }
}

#[test]
fn planted_token_ids_across_two_trees() {
    let (rep, expected) = pair_report("tokens");
    check_counts_and_metrics("tokens", &rep, &expected);
    let mut top: Vec<&str> = rep.attribution.top_tokens[..2]
        .iter()
        .map(|s| s.key.as_str())
        .collect();
    top.sort();
    assert_eq!(top, ["42", "7"]);
    let flagged: Vec<&str> = rep.findings.iter().map(|f| f.detector.as_str()).collect();
    assert_eq!(flagged, ["mismatch-token", "mismatch-token"]);
}

#[test]
fn planted_positions_across_two_trees() {
    let (rep, expected) = pair_report("positions");
    check_counts_and_metrics("positions", &rep, &expected);
    assert_eq!(rep.findings.len(), 1, "{:?}", rep.findings);
    let f = &rep.findings[0];
    assert_eq!(f.detector, "mismatch-position");
    assert_eq!(
        (
            f.evidence["first_position"].as_u64(),
            f.evidence["last_position"].as_u64()
        ),
        (Some(40), Some(55))
    );
}

#[test]
fn planted_rank_across_two_trees() {
    let (rep, expected) = pair_report("rank");
    check_counts_and_metrics("rank", &rep, &expected);
    let ranks: Vec<_> = rep
        .findings
        .iter()
        .filter(|f| f.detector == "mismatch-rank")
        .collect();
    assert_eq!(ranks.len(), 1, "{:?}", rep.findings);
    assert_eq!(ranks[0].evidence["rank"], 1);
    assert_eq!(rep.findings.len(), 1, "{:?}", rep.findings);
}

#[test]
fn the_command_pairs_two_trees_and_names_a_role_one_lacks() {
    let (a, b, _) = tree("tokens");
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("r.json");
    let args = |pair: &str| {
        vec![
            "mismatch".to_string(),
            a.display().to_string(),
            b.display().to_string(),
            "--step".into(),
            "3".into(),
            "--pair".into(),
            pair.into(),
            "-q".into(),
            "--output".into(),
            json.display().to_string(),
        ]
    };
    assert_eq!(rlforensics::cli::mismatch::run_cli(args("old:old")), 0);
    let r: J = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let p = &r["steps"][0]["against"];
    assert_eq!(p["producer_b"], "nemo-rl");
    assert_eq!(
        (p["only_a"].as_u64(), p["only_b"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(r["steps"][0]["pair"], serde_json::json!(["old", "old"]));
    // B (NeMo-RL) holds no current log-probs: exit 2, naming what B holds.
    let err = rlforensics::mismatch::analyse_pair(
        rlforensics::producers::step_reader_for(&a)
            .unwrap()
            .open_step(&a, 3)
            .unwrap()
            .as_ref(),
        rlforensics::producers::step_reader_for(&b)
            .unwrap()
            .open_step(&b, 3)
            .unwrap()
            .as_ref(),
        &Options {
            pair: (LogProbSource::Old, LogProbSource::Current),
            ..Options::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("b/nemo_rl")
            && err.contains("holds the log-prob roles [rollout, old] in every cell")
            && err.contains("needs current in every cell of B"),
        "{err}"
    );
    assert_eq!(rlforensics::cli::mismatch::run_cli(args("old:current")), 2);
}
