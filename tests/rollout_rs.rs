//! verl 0.9.1's rejection sampling on the weaver (`rollout_rs`,
//! `rollout_corr_helper.py` `compute_rollout_rejection_mask`): rejected tokens leave the
//! loss mask the weaver dumps as `effective_valid`, the self-hosted side keeps them.
//! losscheck judges the weaver as dumped; dumpdiff reads which option explains the drops
//! from the weaver's own old and rollout log-probs and names it (issue 28), on steps the
//! generator wrote (`fixtures/scenarios/real-novel-rs-*`, recipes in fixtures/README.md).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::real_weights::{dumpdiff, files_with, strings, truth_of};
use crate::support::losscheck_json as losscheck;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/scenarios")
        .join(name)
}

/// The diagnosis line of a cell.
fn line(d: &Json, rank: u64, micro: u64) -> String {
    let head = format!("rank {rank} micro {micro}:");
    d["diagnosis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .find(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no diagnosis for {head}: {d}"))
        .to_string()
}

/// A section's cell reason.
fn reason(d: &Json, section: &str, rank: u64, micro: u64) -> String {
    d["sections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == section)
        .flat_map(|s| s["cells"].as_array().unwrap())
        .find(|c| c["rank"] == rank && c["micro"] == micro)
        .map(|c| c["reason"].as_str().unwrap().to_string())
        .unwrap()
}

#[test]
fn rows_rejected_by_the_weaver_are_named_rejection_sampling_in_every_cell() {
    // --easy seed 2: seq_max_k2 at 0.1 rejects whole rows in each of the six cells; one
    // cell cannot tell options that reject the same rows apart: the reading says "≈"
    let dir = fixture("real-novel-rs-seq-max-2");
    let t = truth_of(&dir);
    assert_eq!(t["conventions"]["rollout_rs"], "seq_max_k2");
    assert_eq!(t["dumpdiff"]["flag_cells"].as_array().unwrap().len(), 12);
    let (code, d) = dumpdiff(&dir);
    assert_eq!(code, Some(1));
    let rs = |n: u32, rows: u32| {
        format!(
            "verl's rejection sampling (rollout_rs=\"seq_sum_k1\", rollout_rs_threshold ≈ \"2\", \
             from the side's own old and rollout log-probs) rejects {n} tokens in {rows} rows \
             from the loss mask"
        )
    };
    assert!(
        line(&d, 0, 0).contains(&format!(
            "the pg term differs, from the mask (effective_valid): {}",
            rs(19, 2)
        )),
        "{}",
        line(&d, 0, 0)
    );
    // a cell whose rejected rows carry no advantage: the entropy mean moves
    assert!(
        line(&d, 1, 1).contains(&format!(
            "the entropy term differs (entropy_loss 1.78 vs 1.801); and the mask \
             (effective_valid): {}",
            rs(10, 2)
        )),
        "{}",
        line(&d, 1, 1)
    );
    for (rank, micro, n, rows) in [
        (0, 0, 19, 2),
        (0, 1, 18, 2),
        (0, 2, 8, 2),
        (1, 0, 12, 1),
        (1, 1, 10, 2),
        (1, 2, 22, 2),
    ] {
        let why = reason(&d, "loss", rank, micro);
        assert!(why.contains(&rs(n, rows)), "{why}");
        assert!(!why.contains("no rejection explains"), "{why}");
    }
    // the weaver's own loss follows from its dump; the self-hosted side from its own
    for tree in ["weaver_pt", "self_hosted_pt"] {
        let (code, r) = losscheck(&dir.join(tree));
        assert_eq!(code, 0, "{tree}: {r}");
        assert!(files_with(&r, "inconsistent").is_empty(), "{tree}");
    }
}

#[test]
fn a_temperature_fault_under_rejection_is_named_beside_it() {
    // --easy (temperature 0.7) seed 0: token_k2 at 0.3 and log-probs of logits not divided
    // by the temperature in r0 m0; before, the mask (first in data-flow order) hid it
    let (code, d) = dumpdiff(&fixture("real-novel-rs-temperature-0"));
    assert_eq!(code, Some(1));
    let l = line(&d, 0, 0);
    assert!(
        l.contains("the shape of logits divided by a sampling temperature on one side only"),
        "{l}"
    );
    assert!(
        l.contains(
            "; and the mask (effective_valid): verl's rejection sampling \
             (rollout_rs=\"token_k1\", rollout_rs_threshold ≈ \"2\""
        ),
        "{l}"
    );
}

#[test]
fn a_reduced_mask_without_rollout_log_probs_is_named_the_mask() {
    // seed 9010 (--novel): token_k2 on a bf16 weaver that dumps no rollout_log_probs; the
    // loss cells whose only failing check is a metric name the mask that differs
    let dir = fixture("real-novel-rs-unseen-9010");
    let t = truth_of(&dir);
    assert_eq!(t["conventions"]["rollout_log_probs_dumped"], false);
    let (_, d) = dumpdiff(&dir);
    let why = reason(&d, "loss", 2, 0);
    assert!(
        why.ends_with(
            "(the weaver's loss mask, effective_valid, is not the self-hosted response mask — \
             the loss mask differs)"
        ),
        "{why}"
    );
    assert!(!d.to_string().contains("verl's rejection sampling"));
}

#[test]
fn losscheck_says_of_each_rejection_step_what_its_truth_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with("real-novel-rs-")
        })
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 4);
    for dir in dirs {
        let t = truth_of(&dir);
        for tree in ["self_hosted_pt", "weaver_pt"] {
            let (_, r) = losscheck(&dir.join(tree));
            for status in ["inconsistent", "cannot_judge"] {
                let said = files_with(&r, &status.replace('_', "-"));
                let truth = strings(&t["losscheck"][tree][status]);
                assert_eq!(said, truth, "{} {tree} {status}", dir.display());
            }
        }
    }
}
