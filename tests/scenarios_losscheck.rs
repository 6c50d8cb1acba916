//! losscheck on seeded scenarios that today's conventions work fixed
//! (`fixtures/scenarios/seed-N`, N ≥ 500, written by `python3 fixtures/gen/make_scenarios.py
//! --seed N --out fixtures/scenarios/seed-N`; each one failed before: false alarms from
//! non-zero entropy/KL coefficients, non-token-mean aggregation, verl's advantage epsilon,
//! or exit 2 on per-micro `old_log_probs`). Each test checks losscheck's JSON report
//! against the seed's `truth.json`: exactly the files it names, the exit code, the cells it
//! skips, and the conventions it settles (values from the generator's draws).

use std::collections::BTreeSet;

use assert_cmd::Command;
use serde_json::Value;

use crate::scenarios::{run, seed_dir, truth};

/// The regression seeds of this file.
/// 6050 and 6124 are `--shape large` steps (64-512 tokens): with as many cells as unknown
/// coefficients the fit's own standard error is meaningless, and snapping one coefficient
/// to the preset's value left the other wrong (a composition false alarm on a sound cell).
/// 7069: the weaver's one cell with terms is faulty (a summed loss) and the other dumps only
/// its total; no evidence settles the aggregation, and the total (seq-mean-token-sum) was
/// judged under token-mean.
/// 13141: the weaver's total-only cell was judged with coefficients fitted exactly from two
/// cells (one faulty in its pg term), without the fit's standard errors.
/// 13177: zero advantages and rows of one length: every mode reproduces the pg and entropy
/// terms, only the KL terms (k2) tell seq-mean-token-mean from the preset's token-mean.
/// 18474: seq-mean-token-sum-norm/12 with a bf16 entropy on the weaver's one cell with
/// terms: the horizon fitted from it (11.98) was not taken for the response length 12 and
/// the mode was left unsettled (garbage coefficients followed).
const SEEDS: [u32; 15] = [
    504, 522, 528, 530, 534, 549, 2038, 2189, 3123, 6050, 6124, 7069, 13141, 13177, 18474,
];
/// Seeds whose weaver side has one cell, its loss/ file missing: a total holding a KL term
/// whose coefficient nothing states was called inconsistent.
const UNDETERMINED: [u32; 2] = [9154, 11038];
const TREES: [&str; 2] = ["self_hosted_pt", "weaver_pt"];

/// losscheck on one tree of a seed: exit code and JSON report.
fn losscheck(seed: u32, tree: &str, extra: &[&str]) -> (i32, Value) {
    run(seed, "losscheck", &[&["--dump-dir", tree], extra].concat())
}

/// Files (relative to the tree) the report calls inconsistent.
fn named(rep: &Value, tree: &str) -> BTreeSet<String> {
    rep["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["status"] == "inconsistent")
        .map(|v| {
            let f = v["file"].as_str().unwrap();
            f.split_once(&format!("{tree}/")).unwrap().1.to_string()
        })
        .collect()
}

fn convention<'a>(rep: &'a Value, name: &str) -> Option<&'a Value> {
    rep["conventions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
}

/// The entropy coefficient a side of the scenario used.
fn entropy_coeff(t: &Value, tree: &str) -> f64 {
    let changed = t["faults"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "coeff_changed");
    match (tree, changed) {
        ("weaver_pt", Some(f)) => f["weaver"].as_f64().unwrap(),
        _ => t["conventions"]["entropy_coeff"].as_f64().unwrap(),
    }
}

#[test]
fn names_exactly_the_self_inconsistent_files_with_the_right_exit_code() {
    for seed in SEEDS.into_iter().chain(UNDETERMINED) {
        let t = truth(seed);
        for tree in TREES {
            let want: BTreeSet<String> = t["losscheck"][tree]["inconsistent"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            let (code, rep) = losscheck(seed, tree, &[]);
            assert_eq!(named(&rep, tree), want, "seed {seed} {tree}");
            assert_eq!(code, i32::from(!want.is_empty()), "seed {seed} {tree}");
        }
    }
}

#[test]
fn a_self_hosted_cell_without_its_loss_file_is_skipped_not_an_error() {
    for seed in SEEDS {
        let t = truth(seed);
        let m = &t["conventions"]["missing"];
        let (_, rep) = losscheck(seed, "self_hosted_pt", &[]);
        let skipped: Vec<String> = rep["skipped"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        let want: Vec<String> = if m["side"] == "self-hosted" && m["kind"] == "loss" {
            vec![format!("rank {} micro {}", m["rank"], m["micro"])]
        } else {
            vec![]
        };
        assert_eq!(skipped, want, "seed {seed}");
        let cells = t["conventions"]["ranks"].as_u64().unwrap()
            * t["conventions"]["micros"].as_u64().unwrap();
        assert_eq!(
            rep["verdicts"].as_array().unwrap().len() as u64,
            cells - want.len() as u64,
            "seed {seed}"
        );
    }
}

#[test]
fn aggregation_and_kl_estimator_are_the_scenarios() {
    for seed in SEEDS {
        let t = truth(seed);
        let c = &t["conventions"];
        let mode = c["loss_agg_mode"].as_str().unwrap();
        let want_agg = if mode == "seq-mean-token-sum-norm" {
            // the horizon (loss_scale_factor = the batch's max response) is fitted
            format!("{mode}/{}", c["max_response"])
        } else {
            mode.to_string()
        };
        let want_source = if c["coeffs_dumped"] == true {
            "dumped"
        } else {
            "inferred"
        };
        for tree in TREES {
            let (_, rep) = losscheck(seed, tree, &[]);
            let agg = convention(&rep, "agg").unwrap();
            if (seed, tree) == (7069, "weaver_pt") {
                // its only cell with terms is faulty: nothing settles the mode, and the
                // total-only cell is judged under each mode instead
                assert_eq!(agg["source"], "preset");
                let v = &rep["verdicts"][1];
                assert_eq!(v["status"], "consistent");
                assert!(
                    v["notes"].to_string().contains("seq-mean-token-sum's"),
                    "{v}"
                );
                continue;
            }
            assert_eq!(agg["value"], want_agg.as_str(), "seed {seed} {tree}");
            if mode != "token-mean" {
                assert_eq!(agg["source"], want_source, "seed {seed} {tree}");
            }
            let kl = convention(&rep, "kl_estimator");
            match c["kl_estimator"].as_str() {
                Some(k) => {
                    let want = match k {
                        "k1" => "K1",
                        "k2" => "K2",
                        _ => "K3Verl",
                    };
                    assert_eq!(kl.unwrap()["value"], want, "seed {seed} {tree}");
                }
                None => assert!(kl.is_none(), "seed {seed} {tree}: {kl:?}"),
            }
        }
    }
}

#[test]
fn coefficients_are_read_or_inferred_within_their_error_bars() {
    for seed in SEEDS {
        let t = truth(seed);
        let c = &t["conventions"];
        for tree in TREES {
            let (_, rep) = losscheck(seed, tree, &[]);
            for (name, want) in [
                ("entropy_coeff", entropy_coeff(&t, tree)),
                ("kl_coef", c["kl_coef"].as_f64().unwrap()),
            ] {
                let Some(got) = convention(&rep, name) else {
                    // no KL term: no kl_coef; entropy_coeff is always settled
                    assert!(
                        name == "kl_coef" && want == 0.0,
                        "seed {seed} {tree} {name}"
                    );
                    continue;
                };
                if got.get("note").is_some() {
                    // one cell with both terms: the pair is underdetermined, only the
                    // composition is checked; or a coefficient fitted to one cell's total
                    // (the step's other cells dump only theirs)
                    assert!(
                        rep["verdicts"].as_array().unwrap().len() == 1 || got["cells"] == 1,
                        "seed {seed} {tree} {name}: {got}"
                    );
                    continue;
                }
                let v = got["number"].as_f64().unwrap();
                let se = got["std_err"].as_f64().unwrap_or(0.0);
                assert!(
                    (v - want).abs() <= 6.0 * se,
                    "seed {seed} {tree} {name}: {v} ± {se} vs truth {want}"
                );
                let src = if c["coeffs_dumped"] == true {
                    "dumped"
                } else {
                    "inferred"
                };
                assert_eq!(got["source"], src, "seed {seed} {tree} {name}");
            }
        }
    }
}

#[test]
fn self_hosted_advantage_epsilon_is_the_scenarios() {
    // self-hosted trees dump rewards only: TRL's 1e-4 or verl's 1e-6, the one that fits
    for seed in SEEDS {
        let want = truth(seed)["conventions"]["adv_eps"].as_f64().unwrap();
        let (_, rep) = losscheck(seed, "self_hosted_pt", &[]);
        let got = convention(&rep, "adv_eps").unwrap();
        assert_eq!(got["number"].as_f64(), Some(want), "seed {seed}");
        let src = if want == 1e-4 { "preset" } else { "inferred" };
        assert_eq!(got["source"], src, "seed {seed}");
    }
}

#[test]
fn per_micro_old_log_probs_are_read() {
    // these seeds dump old_log_probs per micro (exit 2 before)
    for seed in [504, 528, 534, 2038, 2189] {
        let t = truth(seed);
        assert_eq!(t["conventions"]["self_hosted_old_log_probs"], "per-micro");
        let (code, rep) = losscheck(seed, "self_hosted_pt", &[]);
        assert_eq!(code, 0, "seed {seed}");
        assert!(
            rep["verdicts"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v["status"] == "consistent"
                    // seed 528 is one cell: its total fitted its own coefficient
                    || v["status"] == "undetermined"
                        && v["notes"].to_string().contains("its total is the one equation")),
            "seed {seed}"
        );
    }
}

#[test]
fn a_faulty_cell_does_not_move_the_inferred_aggregation() {
    // seed 504 weaver: seq-mean-token-sum-norm over 6 cells, rank 1 micro 1 summed its pg
    // term; the mode is still inferred (from the other cells' pg and every entropy term)
    // and that cell alone is named, as an aggregation fault
    let (code, rep) = losscheck(504, "weaver_pt", &[]);
    assert_eq!(code, 1);
    let agg = convention(&rep, "agg").unwrap();
    assert_eq!(agg["value"], "seq-mean-token-sum-norm/12");
    assert_eq!(agg["source"], "inferred");
    assert_eq!(
        (agg["explained"].as_u64(), agg["cells"].as_u64()),
        (Some(5), Some(6))
    );
    let d = rep["diagnoses"].as_array().unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0]["rank"].as_u64(), d[0]["micro"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(d[0]["differs"], serde_json::json!(["aggregation"]));
    let v = rep["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["status"] == "inconsistent")
        .unwrap();
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("the dumped pg_loss is the sum of the elementwise loss over 8 valid tokens, not its seq-mean-token-sum-norm/12"),
        "{notes}"
    );
}

#[test]
fn diagnosis_names_the_term_that_differs() {
    // seed 528 weaver rank 0 micro 0: ratio from old_log_probs shifted by a token
    let (_, rep) = losscheck(528, "weaver_pt", &[]);
    let d = rep["diagnoses"].as_array().unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["differs"], serde_json::json!(["ratio"]));
    // seed 522 weaver rank 0 micro 0: pg summed under seq-mean-token-mean
    let (_, rep) = losscheck(522, "weaver_pt", &[]);
    let d = rep["diagnoses"].as_array().unwrap();
    assert_eq!(
        (d.len(), d[0]["rank"].as_u64(), d[0]["micro"].as_u64()),
        (1, Some(0), Some(0))
    );
    assert_eq!(d[0]["differs"], serde_json::json!(["aggregation"]));
}

#[test]
fn a_flag_overrides_the_inferred_coefficient_and_the_composition_is_named() {
    // seed 530 self-hosted: entropy_coeff 1e-4 and kl_coef 0.01, neither dumped; forcing
    // --entropy-coeff 0 leaves the entropy term unexplained in every cell
    let (code, rep) = losscheck(530, "self_hosted_pt", &["--entropy-coeff", "0"]);
    assert_eq!(code, 1);
    let ec = convention(&rep, "entropy_coeff").unwrap();
    assert_eq!(
        (ec["number"].as_f64(), &ec["source"]),
        (Some(0.0), &Value::from("flag"))
    );
    let d = rep["diagnoses"].as_array().unwrap();
    assert_eq!(d.len(), 2);
    // kl_coef fitted alone explains neither cell: each is named a composition fault, and
    // the entropy coefficient its terms imply is printed
    for x in d {
        assert_eq!(x["differs"], serde_json::json!(["composition"]), "{x}");
    }
    let kc = convention(&rep, "kl_coef").unwrap();
    assert_eq!(
        (kc["explained"].as_u64(), kc["cells"].as_u64()),
        (Some(0), Some(2))
    );
    for v in rep["verdicts"].as_array().unwrap() {
        let notes = v["notes"].to_string();
        assert!(notes.contains("this cell implies entropy_coeff"), "{notes}");
    }
    let (code, rep) = losscheck(530, "self_hosted_pt", &[]);
    assert_eq!(code, 0);
    let ec = convention(&rep, "entropy_coeff").unwrap();
    assert_eq!(ec["source"], "inferred");
}

#[test]
fn the_table_names_the_conventions_that_differ_from_the_preset() {
    let out = Command::cargo_bin("losscheck")
        .unwrap()
        .current_dir(seed_dir(530))
        .env_remove("COLUMNS")
        .args(["--dump-dir", "weaver_pt", "--step", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    // The count line, then the conventions.
    assert_eq!(
        text.lines().next().unwrap(),
        "losscheck step 0: PASS — 2 cells consistent with their own inputs"
    );
    let first = text.lines().nth(1).unwrap();
    assert!(
        first.starts_with("conventions: agg seq-mean-token-sum-norm/14 (inferred, explains 2/2 cells), kl_estimator K1 (inferred, explains 2/2 cells), entropy_coeff 1e-4 (inferred, explains 2/2 cells, ±"),
        "{first}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains("┆ consistent ")).count(),
        2
    );
}

#[test]
fn bf16_entropy_is_judged_with_its_rounding_not_1e_4() {
    // seed 504 weaver: entropy computed in f32, its loss term from those, dumped in bf16.
    // The recomputed entropy_loss (from the bf16 values) misses the dumped one by more than
    // the default rtol 1e-4, but by less than bf16's worst case for a weighted mean of
    // positive values, r·mean with r = 2⁻⁸/(1 − 2⁻⁸), and the cell is consistent.
    let t = truth(504);
    assert_eq!(t["conventions"]["weaver_entropy_dtype"], "bfloat16");
    let (_, rep) = losscheck(504, "weaver_pt", &[]);
    let r = 2f64.powi(-8) / (1.0 - 2f64.powi(-8));
    let v = rep["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["rank"] == 1 && v["micro"] == 0)
        .unwrap();
    assert_eq!(v["status"], "consistent");
    let c = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "entropy_loss")
        .unwrap();
    let (d, x) = (
        c["dumped"].as_f64().unwrap(),
        c["recomputed"].as_f64().unwrap(),
    );
    assert!((d - x).abs() > 1e-4 * d.abs(), "{d} {x}");
    assert!((d - x).abs() <= r * x, "{d} {x}");
    assert_eq!(c["ok"], true);
}

#[test]
fn step_check_settles_conventions_for_callers_that_judge_one_cell_at_a_time() {
    // the library path dumpdiff's adjudication can take: seed 530 weaver (norm/14, k1,
    // entropy_coeff 1e-4, kl_coef 0.01, none dumped) is inconsistent under the preset and
    // consistent under the settled conventions
    use rlforensics::kernels::aggregate::AggMode;
    use rlforensics::kernels::presets::preset;
    use rlforensics::losscheck::overrides::Overrides;
    use rlforensics::losscheck::{Status, StepCheck, Tolerance};
    use rlforensics::producers::layout::DumpTree;
    let tree = DumpTree::discover(&seed_dir(530).join("weaver_pt")).unwrap();
    let cfg = preset("nexrl-is").unwrap();
    let tol = Tolerance::default();
    let check = StepCheck::new(&tree, 0, &cfg).unwrap();
    let resolved = check
        .conventions(&cfg, &Overrides::default(), &tol)
        .unwrap();
    assert_eq!(
        resolved.cfg.agg,
        AggMode::SeqMeanTokenSumNorm {
            horizon: Some(14.0)
        }
    );
    assert!(
        (resolved.cfg.entropy_coeff - 1e-4).abs() < 1e-6,
        "{:?}",
        resolved.cfg
    );
    let kl = resolved.cfg.kl.as_ref().unwrap();
    assert!((kl.coef - 0.01).abs() < 1e-4, "{kl:?}");
    for (rank, micro) in [(0, 0), (1, 0)] {
        let under = check.check_under(rank, micro, &resolved, &tol).unwrap();
        assert_eq!(under.status, Status::Consistent, "{}", under.line());
        let plain = check.check(rank, micro, &cfg, &tol).unwrap();
        assert_eq!(plain.status, Status::Inconsistent, "{}", plain.line());
    }
}

#[test]
fn cells_that_dump_only_their_total_are_judged_under_the_mode_that_explains_them() {
    // seed 2189 weaver: one cell, its loss/ file missing (only is_loss_debug's total):
    // the mode and entropy coefficient that explain the total are taken, said to be
    // underdetermined, and the cell is consistent
    let (code, rep) = losscheck(2189, "weaver_pt", &[]);
    assert_eq!(code, 0);
    let agg = convention(&rep, "agg").unwrap();
    assert_eq!(agg["value"], "seq-mean-token-mean");
    assert!(agg["note"].as_str().unwrap().starts_with("underdetermined"));
    let ec = convention(&rep, "entropy_coeff").unwrap();
    assert!((ec["number"].as_f64().unwrap() - 1e-3).abs() < 1e-6, "{ec}");
    // seed 2038 weaver: rank 0 micro 0 has only its total, rank 1 micro 0 summed its pg
    // term; the entropy term of rank 1 settles the mode (half the terms, no other mode
    // explains any), so rank 0 is consistent and rank 1 alone is named
    let (code, rep) = losscheck(2038, "weaver_pt", &[]);
    assert_eq!(code, 1);
    assert_eq!(
        convention(&rep, "agg").unwrap()["value"],
        "seq-mean-token-sum-norm/15"
    );
    assert_eq!(
        named(&rep, "weaver_pt"),
        BTreeSet::from(["is_loss_debug/step_000000_rank1_micro0.pt".to_string()])
    );
}

#[test]
fn an_aggregation_flag_overrides_and_the_diagnosis_names_the_dumped_mode() {
    // seed 522 self-hosted is seq-mean-token-mean (not dumped); --agg token-mean forces the
    // preset's mode: both cells are inconsistent and each term is named an aggregation
    // fault, with the mode the dump follows
    let (code, rep) = losscheck(522, "self_hosted_pt", &["--agg", "token-mean"]);
    assert_eq!(code, 1);
    assert_eq!(convention(&rep, "agg").unwrap()["source"], "flag");
    let d = rep["diagnoses"].as_array().unwrap();
    assert_eq!(d.len(), 2);
    for x in d {
        assert_eq!(x["differs"], serde_json::json!(["aggregation"]), "{x}");
    }
    for v in rep["verdicts"].as_array().unwrap() {
        let notes = v["notes"].to_string();
        assert!(
            notes.contains("the dumped pg_loss is the seq-mean-token-mean of the elementwise loss, the check used token-mean")
                && notes.contains("is the seq-mean-token-mean of the entropy, the check used token-mean"),
            "{notes}"
        );
    }
}

#[test]
fn a_total_that_an_unstated_coefficient_would_explain_is_undetermined_not_inconsistent() {
    // seeds 9154 and 11038 weaver: one cell, only is_loss_debug's total (its loss/ file
    // missing), a KL term in the loss (k1; kl_coef 0.001 and 0.01, 11038 also
    // entropy_coeff 1e-4) and no file stating a coefficient. The total is one equation in
    // two unknown coefficients: it cannot be checked, and says so.
    for seed in UNDETERMINED {
        let t = truth(seed);
        let c = &t["conventions"];
        assert_eq!(c["missing"]["kind"], "loss", "seed {seed}");
        assert_eq!(c["kl_estimator"], "k1", "seed {seed}");
        let (code, rep) = losscheck(seed, "weaver_pt", &[]);
        assert_eq!(code, 0, "seed {seed}");
        let v = &rep["verdicts"][0];
        assert_eq!(v["status"], "undetermined", "seed {seed}");
        assert!(rep.get("diagnoses").is_none(), "seed {seed}: {rep}");
        let notes = v["notes"].to_string();
        assert!(
            notes.contains("nothing states its entropy and KL coefficients")
                && notes.contains("give --entropy-coeff and --kl-coef"),
            "seed {seed}: {notes}"
        );
        // a warning: --fail-on warning makes it exit 1
        let (code, _) = losscheck(seed, "weaver_pt", &["--fail-on", "warning"]);
        assert_eq!(code, 1, "seed {seed}");
        // with the coefficients given the total is judged: the generator's are consistent,
        // ten times its KL coefficient is not
        let ec = c["entropy_coeff"].as_f64().unwrap().to_string();
        let kc = c["kl_coef"].as_f64().unwrap();
        let given = |k: f64| {
            let k = k.to_string();
            losscheck(
                seed,
                "weaver_pt",
                &["--entropy-coeff", &ec, "--kl", "k1", "--kl-coef", &k],
            )
        };
        let (code, rep) = given(kc);
        assert_eq!(
            (code, &rep["verdicts"][0]["status"]),
            (0, &Value::from("consistent")),
            "seed {seed}: {rep}"
        );
        let (code, rep) = given(10.0 * kc);
        assert_eq!(
            (code, &rep["verdicts"][0]["status"]),
            (1, &Value::from("inconsistent")),
            "seed {seed}: {rep}"
        );
    }
    // 9154's entropy coefficient is 0: its KL coefficient alone explains the total, and
    // the note names it under the generator's estimator: (loss − pg)/kl_loss
    let t = truth(9154);
    let cell = &t["cells"][0];
    let (loss, pg, kl) = (
        cell["weaver_loss"].as_f64().unwrap(),
        cell["weaver_pg_loss"].as_f64().unwrap(),
        cell["weaver_kl_loss"].as_f64().unwrap(),
    );
    let k = (loss - pg) / kl;
    assert!((k - 0.001).abs() < 1e-5, "{k}");
    let (_, rep) = losscheck(9154, "weaver_pt", &[]);
    let notes = rep["verdicts"][0]["notes"].to_string();
    assert!(notes.contains("kl_coef 0.001 (K1)"), "{notes}");
}

#[test]
fn the_kl_terms_settle_the_aggregation_when_pg_and_entropy_cannot() {
    // seed 13177: every advantage is zero and the rows are of one length, so token-mean
    // and seq-mean-token-mean reproduce every pg and entropy term alike; the k2 terms only
    // follow under seq-mean-token-mean (the preset's token-mean was kept before, and both
    // trees' KL terms called inconsistent)
    let t = truth(13177);
    assert_eq!(t["conventions"]["kl_estimator"], "k2");
    for tree in TREES {
        let (code, rep) = losscheck(13177, tree, &[]);
        assert_eq!(code, 0, "{tree}");
        let agg = convention(&rep, "agg").unwrap();
        assert_eq!(
            (&agg["value"], &agg["source"]),
            (
                &Value::from("seq-mean-token-mean"),
                &Value::from("inferred")
            ),
            "{tree}"
        );
        assert_eq!(convention(&rep, "kl_estimator").unwrap()["value"], "K2");
    }
}

#[test]
fn a_total_only_cell_is_judged_with_the_fits_standard_errors() {
    // seed 13141 weaver: three cells, rank 1's loss/ file missing; the two others fit the
    // two coefficients exactly (entropy_coeff 5e-5 ± 2.8e-4, kl_coef 0.024 ± 0.077 for
    // the generator's 0 and 0.01). Rank 1's total misses the fitted composition by 1e-4,
    // well inside what those errors allow on its terms: consistent; rank 0 (old_log_probs
    // shifted by a token) is the one fault.
    let (code, rep) = losscheck(13141, "weaver_pt", &[]);
    assert_eq!(code, 1);
    let status: Vec<(u64, &str)> = rep["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["rank"].as_u64().unwrap(), v["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        status,
        [(0, "inconsistent"), (1, "consistent"), (2, "consistent")]
    );
    let kc = convention(&rep, "kl_coef").unwrap();
    let (v, se) = (
        kc["number"].as_f64().unwrap(),
        kc["std_err"].as_f64().unwrap(),
    );
    assert!((v - 0.01).abs() <= 6.0 * se && se > 0.01, "{v} ± {se}");
}

#[test]
fn dumpdiffs_adjudication_says_which_side_cannot_be_judged() {
    // seed 9154 with every tolerance at 0: the loss cell fails and each side is
    // recomputed; the self-hosted side states its coefficients (consistent), the weaver's
    // only cell dumps just its total (undetermined), and the conclusion says both
    let t = truth(9154);
    let (code, rep) = run(
        9154,
        "dumpdiff",
        &[
            "--self-hosted-dir",
            "self_hosted_pt",
            "--weaver-dir",
            "weaver_pt",
            "--atol",
            "0",
            "--rtol",
            "0",
        ],
    );
    assert_eq!(code, 1);
    assert!(t["faults"].as_array().unwrap().is_empty());
    let adj = &rep["adjudication"][0];
    let status: Vec<(&str, &str)> = adj["sides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["role"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        status,
        [("self-hosted", "consistent"), ("weaver", "undetermined")]
    );
    assert_eq!(
        adj["conclusion"],
        "self-hosted matches; weaver loss cannot be judged: only its total is dumped and \
         nothing states its coefficients (--entropy-coeff, --kl-coef)"
    );
}
