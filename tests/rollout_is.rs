//! The importance weights the weaver applies against the rollout engine's log-probs
//! (verl 0.9.1 `rollout_corr_helper.py` `compute_rollout_correction_weights`: token-level
//! TIS with any cap, IcePop bands, sequence-level weights), read off its own dumped values
//! (issue 28), on steps the generator wrote (`fixtures/scenarios/real-novel-is-*`, each
//! `make_real_scenarios.py --seed N --easy --novel --novel-only rollout_is`, and one
//! `--novel` step with two faults).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::real_weights::{dumpdiff, files_with, statuses, strings, truth_of};
use crate::support::losscheck_json as losscheck;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/scenarios")
        .join(name)
}

/// The `rollout_is` convention of a losscheck report: its value and `explained/cells`.
fn rollout_is(r: &Json) -> Option<(String, String)> {
    r["conventions"].as_array()?.iter().find_map(|c| {
        (c["name"] == "rollout_is").then(|| {
            (
                c["value"].as_str().unwrap().to_string(),
                format!("{}/{}", c["explained"], c["cells"]),
            )
        })
    })
}

/// The scheme the generator drew (truth `rollout_is`, `tis_cap`) in the words of the
/// conventions record: `token TIS cap 1.5`, `sequence-level TIS cap 5`, and for a band
/// its upper bound (`IcePop band up to 2`: the steps here zero no token below the lower).
fn drawn(t: &Json) -> String {
    let c = &t["conventions"];
    let level = match c["rollout_is"].as_str().unwrap() {
        "token" => "token",
        "sequence" => "sequence-level",
        other => panic!("{other}"),
    };
    match &c["tis_cap"] {
        Json::String(band) => {
            let hi: f64 = band.split('_').nth(1).unwrap().parse().unwrap();
            format!("{level} IcePop band up to {hi}")
        }
        cap => format!("{level} TIS cap {}", cap.as_f64().unwrap()),
    }
}

#[test]
fn each_rollout_is_variant_is_read_off_the_weavers_own_values() {
    // (fixture, the full conventions record value: the scheme, then its evidence)
    let cases = [
        (
            "real-novel-is-token-cap-8010",
            "token TIS cap 1.5 (the cap read off 7 saturated tokens, the other tokens keep exp(old − rollout))",
        ),
        (
            "real-novel-is-seq-cap-8006",
            "sequence-level TIS cap 5 (the cap read off 12 saturated tokens, the other tokens keep their row's exp(Σ(old − rollout)))",
        ),
        (
            "real-novel-is-icepop-8000",
            "token IcePop band up to 2 (no token below a lower bound) (9 tokens zeroed, the others keep exp(old − rollout): lo in (0, 0.9145], hi in [1.096, 2.731))",
        ),
        (
            "real-novel-is-seq-icepop-8023",
            "sequence-level IcePop band up to 5 (no token below a lower bound) (11 tokens zeroed, the others keep their row's exp(Σ(old − rollout)): lo in (0, 0.8671], hi in [3.126, 6.201))",
        ),
    ];
    for (name, want) in cases {
        let dir = fixture(name);
        let t = truth_of(&dir);
        assert_eq!(t["conventions"]["rollout_log_probs_dumped"], true, "{name}");
        assert_eq!(t["faults"], Json::Array(vec![]), "{name}");
        // the scheme the generator drew, in the record's words
        assert!(
            want.starts_with(&drawn(&t)),
            "{name}: {want} vs {}",
            drawn(&t)
        );
        let (code, r) = losscheck(&dir.join("weaver_pt"));
        assert_eq!(code, 0, "{name}: {r}");
        assert_eq!(
            rollout_is(&r),
            Some((want.to_string(), "6/6".to_string())),
            "{name}"
        );
        for (rank, micro, s) in statuses(&r) {
            assert_eq!(s, "consistent", "{name} rank {rank} micro {micro}");
        }
        // the self-hosted side applies no weights and records none
        let (code, r) = losscheck(&dir.join("self_hosted_pt"));
        assert_eq!(code, 0, "{name}: {r}");
        assert_eq!(rollout_is(&r), None, "{name}");
    }
}

#[test]
fn faults_under_inferred_sequence_weights_stay_inconsistent_and_the_rest_follow() {
    // seed 7014 (--novel): sequence-level weights capped at 5 on the weaver, and two
    // faulty weaver cells (a sum for a mean in r0 m1, shifted old log-probs in r1 m1).
    // Before: "cannot judge" in 4 cells, the weights not named.
    let dir = fixture("real-novel-is-seq-faults-7014");
    let t = truth_of(&dir);
    assert_eq!(t["conventions"]["rollout_is"], "sequence");
    assert_eq!(t["conventions"]["tis_cap"], 5.0);
    let (code, r) = losscheck(&dir.join("weaver_pt"));
    assert_eq!(code, 1, "{r}");
    assert_eq!(
        rollout_is(&r),
        Some((
            "sequence-level TIS cap 5 (the cap read off 10 saturated tokens, the other tokens keep their row's exp(Σ(old − rollout)))".to_string(),
            "4/6".to_string()
        ))
    );
    let bad: Vec<(u64, u64)> = statuses(&r)
        .into_iter()
        .filter(|(_, _, s)| s != "consistent")
        .map(|(rank, micro, s)| {
            assert_eq!(s, "inconsistent");
            (rank, micro)
        })
        .collect();
    assert_eq!(bad, vec![(0, 1), (1, 1)]);
    // dumpdiff: every weighted cell without a fault of its own is named an importance
    // weight at the sequence level
    let (_, d) = dumpdiff(&dir);
    let diagnosis: Vec<&str> = d["diagnosis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    for micro in [(0, 0), (0, 2), (1, 0), (1, 2)] {
        let head = format!("rank {} micro {}:", micro.0, micro.1);
        let line = diagnosis.iter().find(|l| l.starts_with(&head)).unwrap();
        assert!(
            line.contains("an importance weight (sequence-level TIS"),
            "{line}"
        );
    }
    let r0m1 = diagnosis
        .iter()
        .find(|l| l.starts_with("rank 0 micro 1:"))
        .unwrap();
    assert!(
        r0m1.contains("an importance weight (sequence-level TIS cap 5, against rollout_log_probs"),
        "{r0m1}"
    );
}

#[test]
fn dumpdiff_names_the_scheme_of_each_variant() {
    for (name, words) in [
        (
            "real-novel-is-token-cap-8010",
            "an importance weight (TIS cap 1.5, ",
        ),
        (
            "real-novel-is-seq-cap-8006",
            "an importance weight (sequence-level TIS cap 5, ",
        ),
        (
            "real-novel-is-icepop-8000",
            "an importance weight (token IcePop band up to 2 ",
        ),
        (
            "real-novel-is-seq-icepop-8023",
            "an importance weight (sequence-level IcePop band up to 5 ",
        ),
    ] {
        let (code, d) = dumpdiff(&fixture(name));
        assert_eq!(code, Some(1), "{name}");
        let lines = d["diagnosis"].as_array().unwrap();
        assert_eq!(lines.len(), 6, "{name}");
        // every cell names an importance weight; at least one (with the cap or band
        // reached) names the scheme the step draws
        for l in lines {
            assert!(
                l.as_str().unwrap().contains("an importance weight ("),
                "{l}"
            );
        }
        assert!(
            lines.iter().any(|l| l.as_str().unwrap().contains(words)),
            "{name}: {lines:?}"
        );
    }
}

#[test]
fn weights_whose_rollout_log_probs_are_not_dumped_are_cannot_judge_with_their_shape() {
    // seed 8007: sequence-level weights (cap 10) and no rollout_log_probs dumped
    let dir = fixture("real-novel-is-unseen-8007");
    let t = truth_of(&dir);
    assert_eq!(t["conventions"]["rollout_log_probs_dumped"], false);
    assert_eq!(t["conventions"]["rollout_is"], "sequence");
    let (code, r) = losscheck(&dir.join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert_eq!(rollout_is(&r), None);
    for v in r["verdicts"].as_array().unwrap() {
        assert_eq!(v["status"], "cannot-judge", "{v}");
        let note = v["notes"][0].as_str().unwrap();
        assert!(
            note.starts_with("cannot judge the per-token loss:"),
            "{note}"
        );
        assert!(
            note.contains("the factors' shape: one factor per row on "),
            "{note}"
        );
    }
    // r0 m1 has a row at the cap (10 in f32): it was "inconsistent" before (a factor
    // just above 10 was no weight), now it is among the six above
    assert_eq!(r["verdicts"].as_array().unwrap().len(), 6);
    // dumpdiff: an importance weight or the aggregation, which it cannot tell apart
    let (code, d) = dumpdiff(&dir);
    assert_eq!(code, Some(0));
    for l in d["diagnosis"].as_array().unwrap() {
        let l = l.as_str().unwrap();
        assert!(
            l.contains(
                "carries per-token weights it does not dump: an importance weight (against \
                 rollout log-probs not dumped) or the aggregation differs; which side is wrong \
                 cannot be judged"
            ),
            "{l}"
        );
    }
}

#[test]
fn a_correct_side_is_never_called_inconsistent_under_rollout_weights() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with("real-novel-is-") || n == "real-novel-tis-cap-5"
        })
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 12);
    for dir in dirs {
        let t = truth_of(&dir);
        for tree in ["self_hosted_pt", "weaver_pt"] {
            let (_, r) = losscheck(&dir.join(tree));
            let said = files_with(&r, "inconsistent");
            let truth = strings(&t["losscheck"][tree]["inconsistent"]);
            assert_eq!(said, truth, "{} {tree}", dir.display());
        }
    }
}

#[test]
fn batch_normalised_weights_are_read_as_one_divisor_and_named() {
    // verl 0.9.1 rollout_is_batch_normalize: token TIS cap 2, every weight divided by the
    // step's batch mean (1.0276 as verl computed it on the whole batch); seed 0 of
    // --easy --novel --novel-only is_batch_norm, and seed 9019 (--novel, a bf16 weaver with
    // a wrong mask and wrong advantages: its factors carry 1 % of ratio rounding)
    for (name, want, cells) in [
        (
            "real-novel-is-batch-norm-0",
            "token TIS cap 2, batch-normalised (÷ 1.028, the weights' batch mean) (the cap read \
             off 4 saturated tokens, the other tokens keep exp(old − rollout); every kept weight \
             divided by 1.028 (verl's rollout_is_batch_normalize: the weights' batch mean))",
            "6/6",
        ),
        (
            "real-novel-is-batch-norm-bf16-9019",
            "token TIS cap 2, batch-normalised (÷ 1.065, the weights' batch mean) (the cap read \
             off 2 saturated tokens, the other tokens keep exp(old − rollout); every kept weight \
             divided by 1.065 (verl's rollout_is_batch_normalize: the weights' batch mean))",
            "2/2",
        ),
    ] {
        let dir = fixture(name);
        let t = truth_of(&dir);
        assert_eq!(
            t["conventions"]["rollout_is_batch_normalize"], true,
            "{name}"
        );
        let (code, r) = losscheck(&dir.join("weaver_pt"));
        assert_eq!(code, 0, "{name}: {r}");
        assert_eq!(
            rollout_is(&r),
            Some((want.to_string(), cells.to_string())),
            "{name}"
        );
        for (rank, micro, s) in statuses(&r) {
            assert_eq!(s, "consistent", "{name} rank {rank} micro {micro}");
        }
    }
    // dumpdiff names the normalised scheme as the cause of every differing total
    let (code, d) = dumpdiff(&fixture("real-novel-is-batch-norm-0"));
    assert_eq!(code, Some(1));
    let lines = d["diagnosis"].as_array().unwrap();
    assert_eq!(lines.len(), 5);
    // (a cell where no token reaches the cap reads "token TIS, no cap reached")
    for l in lines {
        let l = l.as_str().unwrap();
        assert!(
            l.contains("an importance weight (")
                && l.contains(
                    "batch-normalised (÷ 1.028, the weights' batch mean), against \
                     rollout_log_probs on the weaver's side only)"
                ),
            "{l}"
        );
    }
    assert!(lines.iter().any(|l| l.as_str().unwrap().contains(
        "an importance weight (TIS cap 2, batch-normalised (÷ 1.028, the weights' batch mean)"
    )));
}

#[test]
fn batch_normalised_weights_without_rollout_log_probs_are_cannot_judge() {
    // seed 11 of --easy --novel --novel-only is_batch_norm: no rollout_log_probs dumped
    let dir = fixture("real-novel-is-batch-norm-unseen-11");
    let t = truth_of(&dir);
    assert_eq!(t["conventions"]["rollout_log_probs_dumped"], false);
    let (code, r) = losscheck(&dir.join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert_eq!(
        files_with(&r, "cannot-judge"),
        strings(&t["losscheck"]["weaver_pt"]["cannot_judge"])
    );
    assert_eq!(files_with(&r, "cannot-judge").len(), 6);
}
