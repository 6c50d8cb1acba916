//! Seeded scenarios (`fixtures/scenarios/seed-NNN`, written by
//! `fixtures/gen/make_scenarios.py`): dumpdiff and losscheck on each, checked against its
//! `truth.json` with the definitions of `benches/score_scenarios.py`.
//!
//! dumpdiff must pass every truth check on every seed: exactly the required cells flagged
//! (and nothing beyond the cells a fault may move), faults at their row and position, the
//! files on one side only, the coefficients that differ, and its exit code. The seeds after
//! 018 are the ones the conventions issue (15) fixed, each with a test of its own below.
//! losscheck's checks are asserted where it passes them (the `Expect` table).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

/// The folder of committed scenario seed `seed` (`fixtures/scenarios/seed-NNN`).
pub(crate) fn seed_dir(seed: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/scenarios/seed-{seed:03}"))
}

/// The seed's `truth.json` (what the generator injected and drew).
pub(crate) fn truth(seed: u32) -> Value {
    let text = std::fs::read_to_string(seed_dir(seed).join("truth.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Runs a tool in the scenario's folder; returns its exit code and JSON report.
pub(crate) fn run(seed: u32, bin: &str, args: &[&str]) -> (i32, Value) {
    let out = Command::cargo_bin(bin)
        .unwrap()
        .current_dir(seed_dir(seed))
        .args(args)
        .args(["--step", "0", "--format", "json"])
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert_ne!(
        code,
        2,
        "{bin} {args:?} on seed {seed}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, serde_json::from_slice(&out.stdout).unwrap())
}

/// dumpdiff on a seed (exit code, JSON report), with its remote-api tree when it has one.
pub(crate) fn dumpdiff(seed: u32, t: &Value) -> (i32, Value) {
    let mut args = vec![
        "--self-hosted-dir",
        "self_hosted_pt",
        "--weaver-dir",
        "weaver_pt",
    ];
    if t["trees"]["remote-api"].is_string() {
        args.extend(["--remote-api-dir", "remote_api_pt"]);
    }
    run(seed, "dumpdiff", &args)
}

type Cell = (String, Option<u64>, Option<u64>);

fn cell_key(section: &str, c: &Value) -> Cell {
    (section.to_string(), c["rank"].as_u64(), c["micro"].as_u64())
}

/// The (section, rank, micro) cells a dumpdiff report flags (verdict fail or warn).
fn flagged(rep: &Value) -> BTreeSet<Cell> {
    let mut out = BTreeSet::new();
    for sec in rep["sections"].as_array().unwrap() {
        let name = sec["name"].as_str().unwrap();
        for c in sec["cells"].as_array().unwrap() {
            if matches!(c["verdict"].as_str(), Some("fail" | "warn")) {
                out.insert(cell_key(name, c));
            }
        }
    }
    out
}

fn truth_cells(t: &Value, required_only: bool) -> BTreeSet<Cell> {
    t["dumpdiff"]["flag_cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !required_only || c["required"].as_bool().unwrap())
        .map(|c| cell_key(c["section"].as_str().unwrap(), c))
        .collect()
}

fn coverage(v: &Value) -> BTreeSet<(String, Option<u64>, Option<u64>, String)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let kind = c["kind"].as_str().unwrap().to_string();
            (
                kind,
                c["rank"].as_u64(),
                c["micro"].as_u64(),
                c["missing_on"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The report's coverage, with a rank-level param/gradient entry (micro null: the
/// self-hosted file is per rank) standing for truth's missing per-micro weaver file of
/// that rank, as benches/score_scenarios.py counts it.
fn report_coverage(rep: &Value, t: &Value) -> BTreeSet<(String, Option<u64>, Option<u64>, String)> {
    let want = coverage(&t["dumpdiff"]["coverage"]);
    coverage(&rep["coverage"])
        .into_iter()
        .map(|k| {
            if k.2.is_none() && (k.0 == "param" || k.0 == "gradient") {
                if let Some(e) = want.iter().find(|e| e.0 == k.0 && e.1 == k.1 && e.3 == k.3) {
                    return e.clone();
                }
            }
            k
        })
        .collect()
}

/// Faults whose named tensor's first value beyond tolerance is not one of the fault's
/// (row, other_row, pos), or that the tensor's comparison does not flag.
fn misplaced(t: &Value, rep: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    for f in t["faults"].as_array().unwrap() {
        let Some(pos) = f["positions"].as_array().filter(|p| !p.is_empty()) else {
            continue;
        };
        let want: BTreeSet<(u64, u64, u64)> = pos
            .iter()
            .map(|p| {
                (
                    p["row"].as_u64().unwrap(),
                    p["other_row"].as_u64().unwrap(),
                    p["pos"].as_u64().unwrap(),
                )
            })
            .collect();
        for dc in f["dumpdiff_cells"].as_array().unwrap() {
            if dc["section"] != "is_loss" || !dc["required"].as_bool().unwrap() {
                continue;
            }
            let sec = rep["sections"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == "is_loss");
            let cell = sec.and_then(|s| {
                s["cells"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["rank"] == dc["rank"] && c["micro"] == dc["micro"])
            });
            let cmp = cell.and_then(|c| {
                c["comparisons"]
                    .as_array()?
                    .iter()
                    .find(|x| x["name"] == dc["tensor"])
            });
            let first = cmp.map(|x| &x["metrics"]["first_beyond"]);
            let ok = match first {
                Some(fb)
                    if fb.is_object()
                        && matches!(cmp.unwrap()["verdict"].as_str(), Some("fail" | "warn")) =>
                {
                    let got = (
                        fb["row"].as_u64(),
                        fb["other_row"].as_u64(),
                        fb["pos"].as_u64(),
                    );
                    matches!(got, (Some(r), Some(o), Some(p)) if want.contains(&(r, o, p)))
                }
                _ => false,
            };
            if !ok {
                bad.push(format!("{} at {}", f["kind"], dc["tensor"]));
            }
        }
    }
    bad
}

/// The files a losscheck report calls anything but consistent, relative to the tree.
fn inconsistent(rep: &Value, tree: &str) -> BTreeSet<String> {
    rep["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["status"] != "consistent")
        .map(|v| {
            let p = v["file"].as_str().unwrap();
            p.split_once(&format!("{tree}/"))
                .map_or(p, |(_, rest)| rest)
                .to_string()
        })
        .collect()
}

fn truth_inconsistent(t: &Value, tree: &str) -> BTreeSet<String> {
    t["losscheck"][tree]["inconsistent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Which losscheck checks a seed passes today (`self_hosted_readable: false`: losscheck
/// cannot read a self-hosted tree with per-micro old_log_probs yet; not asserted).
struct Expect {
    seed: u32,
    /// losscheck reads the self-hosted tree (per-micro old_log_probs: not yet).
    self_hosted_readable: bool,
}

const EXPECT: &[Expect] = &[
    Expect {
        seed: 2,
        self_hosted_readable: true,
    },
    Expect {
        seed: 3,
        self_hosted_readable: true,
    },
    Expect {
        seed: 4,
        self_hosted_readable: false,
    },
    Expect {
        seed: 5,
        self_hosted_readable: true,
    },
    Expect {
        seed: 6,
        self_hosted_readable: true,
    },
    Expect {
        seed: 7,
        self_hosted_readable: false,
    },
    Expect {
        seed: 8,
        self_hosted_readable: true,
    },
    Expect {
        seed: 11,
        self_hosted_readable: false,
    },
    Expect {
        seed: 12,
        self_hosted_readable: true,
    },
    Expect {
        seed: 13,
        self_hosted_readable: true,
    },
    Expect {
        seed: 18,
        self_hosted_readable: true,
    },
    Expect {
        seed: 22,
        self_hosted_readable: true,
    },
    Expect {
        seed: 40,
        self_hosted_readable: false,
    },
    Expect {
        seed: 53,
        self_hosted_readable: true,
    },
    Expect {
        seed: 66,
        self_hosted_readable: true,
    },
    Expect {
        seed: 120,
        self_hosted_readable: false,
    },
    Expect {
        seed: 150,
        self_hosted_readable: true,
    },
    Expect {
        seed: 165,
        self_hosted_readable: true,
    },
];

/// Every committed seed (`fixtures/scenarios/seed-N`), ascending.
pub(crate) fn committed_seeds() -> Vec<u32> {
    let mut seeds: Vec<u32> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios"))
            .unwrap()
            .filter_map(|e| {
                e.unwrap()
                    .file_name()
                    .to_str()?
                    .strip_prefix("seed-")?
                    .parse()
                    .ok()
            })
            .collect();
    seeds.sort();
    seeds
}

#[test]
fn every_committed_seed_has_an_expectation() {
    let mut seeds = committed_seeds();
    // seeds 500 and up are losscheck's regression seeds (tests/scenarios_losscheck.rs) or
    // dumpdiff's with a test of their own below (3064, 9641, 10160, 19327)
    seeds.retain(|s| *s < 500);
    assert_eq!(seeds, EXPECT.iter().map(|e| e.seed).collect::<Vec<_>>());
}

/// The coefficients a report says differ (names split at `/`: one cell cannot tell
/// `entropy_coeff/kl_coef` apart, and names both).
fn differing_coefficients(rep: &Value) -> BTreeSet<String> {
    rep["coefficients"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|c| c["differ"] == true)
        .flat_map(|c| {
            c["name"]
                .as_str()
                .unwrap()
                .split('/')
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn dumpdiff_flags_exactly_the_injected_faults() {
    for e in EXPECT {
        let t = truth(e.seed);
        let (code, rep) = dumpdiff(e.seed, &t);
        let got = flagged(&rep);
        let missed: Vec<_> = truth_cells(&t, true).difference(&got).cloned().collect();
        assert!(
            missed.is_empty(),
            "seed {}: faults not flagged in {missed:?}",
            e.seed
        );
        let extra: Vec<_> = got.difference(&truth_cells(&t, false)).cloned().collect();
        assert!(extra.is_empty(), "seed {}: false alarms {extra:?}", e.seed);
        let bad = misplaced(&t, &rep);
        assert!(bad.is_empty(), "seed {}: misplaced {bad:?}", e.seed);
        assert_eq!(
            report_coverage(&rep, &t),
            coverage(&t["dumpdiff"]["coverage"]),
            "seed {}",
            e.seed
        );
        // A differing coefficient reported where truth has one, and only there.
        let all_coef: BTreeSet<String> = t["dumpdiff"]["coefficients"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        // `required: false`: no cell keeps its loss on both sides, nothing to compare.
        let want_coef: BTreeSet<String> = t["dumpdiff"]["coefficients"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["required"] != false)
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        let got_coef = differing_coefficients(&rep);
        assert!(
            want_coef.is_subset(&got_coef),
            "seed {}: coefficients {got_coef:?}, truth {want_coef:?}",
            e.seed
        );
        if all_coef.is_empty() {
            assert!(got_coef.is_empty(), "seed {}: {got_coef:?}", e.seed);
        }
        // Exit 1 when a required cell or a coefficient must be flagged; 0 when nothing
        // may be (files on one side only are warnings at the default --fail-on error).
        let required = !truth_cells(&t, true).is_empty() || !want_coef.is_empty();
        let optional = !truth_cells(&t, false).is_empty() || !all_coef.is_empty();
        match (required, optional) {
            (true, _) => assert_eq!(code, 1, "seed {}", e.seed),
            (false, false) => assert_eq!(code, 0, "seed {}", e.seed),
            (false, true) => assert!(code == 0 || code == 1, "seed {}", e.seed),
        }
    }
}

/// The comparison `name` of the cell (section, rank, micro).
fn comparison<'a>(rep: &'a Value, section: &str, rank: u64, micro: u64, name: &str) -> &'a Value {
    rep["sections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == section)
        .flat_map(|s| s["cells"].as_array().unwrap())
        .find(|c| c["rank"] == rank && c["micro"] == micro)
        .and_then(|c| {
            c["comparisons"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == name)
        })
        .unwrap_or_else(|| panic!("{section} r{rank} m{micro} {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Seed 005: the weaver's advantages use ε = 1e-6 (verl), the preset 1e-4 (TRL): dumpdiff
/// recomputed the self-hosted advantages with 1e-4 and failed 6 clean cells. The epsilon
/// is now inferred from the weaver's dumped advantages, said, and used.
#[test]
fn seed_005_advantage_epsilon_is_inferred_from_the_weaver() {
    let t = truth(5);
    let (code, rep) = dumpdiff(5, &t);
    assert_eq!(code, 0);
    assert!(flagged(&rep).is_empty());
    let conv = strings(&rep["conventions"]);
    assert_eq!(conv.len(), 1, "{conv:?}");
    assert!(
        conv[0].starts_with("advantage epsilon 1e-6 inferred from 10 weaver is_loss_debug advantage rows (the preset's is 1e-4)"),
        "{conv:?}"
    );
    let adv = comparison(&rep, "is_loss", 1, 1, "is_loss.advantages");
    assert_eq!(adv["verdict"], "pass");
    assert!(adv["origin_a"]["from"]
        .as_str()
        .unwrap()
        .contains("epsilon 1e-6"));
    // A flag overrides the inference: the preset's 1e-4 fails the cells again.
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .current_dir(seed_dir(5))
        .args([
            "--self-hosted-dir",
            "self_hosted_pt",
            "--weaver-dir",
            "weaver_pt",
        ])
        .args(["--step", "0", "--format", "json", "--advantage-eps", "1e-4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(rep.get("conventions").is_none());
    assert!(flagged(&rep).contains(&("is_loss".to_string(), Some(1), Some(1))));
}

/// Seed 011: per-micro `old_log_probs` on the self-hosted side were not read, so the
/// weaver's stale old log-probs went uncompared (a miss). They are compared from the
/// micro's own file now, flagged at the fault's first position.
#[test]
fn seed_011_per_micro_old_log_probs_are_compared() {
    let t = truth(11);
    let (_, rep) = dumpdiff(11, &t);
    let old = comparison(&rep, "is_loss", 0, 1, "is_loss.old_log_probs");
    assert_eq!(old["verdict"], "fail");
    assert_eq!(old["origin_a"]["how"], "dumped");
    assert_eq!(old["origin_a"]["from"], "old_log_probs.old_log_probs");
    let clean = comparison(&rep, "is_loss", 1, 0, "is_loss.old_log_probs");
    assert_eq!(clean["verdict"], "pass");
}

/// Seed 022: entropy_coeff 1e-3 on the self-hosted side, 1e-4 on the weaver (both echoed
/// in `extra_info`): the loss cells moved by less than their tolerance and nothing was
/// reported. The differing coefficient is the first thing the report says now.
#[test]
fn seed_022_a_differing_coefficient_is_a_finding() {
    let t = truth(22);
    let (code, rep) = dumpdiff(22, &t);
    assert_eq!(code, 1);
    let c = &rep["coefficients"][0];
    assert_eq!(c["name"], "entropy_coeff");
    assert_eq!(c["self_hosted"], 0.001);
    assert_eq!(c["weaver"], 0.0001);
    assert_eq!(c["differ"], true);
    assert_eq!(c["self_hosted_from"], "read: loss extra_info.entropy_coeff");
    assert_eq!(rep["verdict"], "fail");
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .current_dir(seed_dir(22))
        .args([
            "--self-hosted-dir",
            "self_hosted_pt",
            "--weaver-dir",
            "weaver_pt",
        ])
        .args(["--step", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "dumpdiff step 0: FAIL — entropy_coeff differs between the sides; 2 cells fail in 2 ranks"
    );
    assert_eq!(
        lines[3],
        "entropy_coeff differs: self-hosted 0.001 (read: loss extra_info.entropy_coeff) vs weaver 0.0001 (read: loss extra_info.entropy_coeff)"
    );
}

/// Seed 040: `seq-mean-token-sum` loss (inferred: not echoed). The loss tolerance was a
/// token mean of the elements' allowances while the loss sums each row: 0.052 allowed for
/// the wrong advantages' 0.036. The allowances follow the mode now, and are what the
/// inputs actually differ by (within their tolerance).
#[test]
fn seed_040_loss_tolerance_follows_the_aggregation_mode() {
    let t = truth(40);
    let (_, rep) = dumpdiff(40, &t);
    let loss = comparison(&rep, "loss", 2, 0, "loss.loss");
    assert_eq!(loss["verdict"], "fail");
    assert!(loss["tolerance"]["source"]
        .as_str()
        .unwrap()
        .contains("= seq-mean-token-sum of |A|·r·(e^E−1)"));
    let diag = strings(&rep["diagnosis"]);
    assert_eq!(diag.len(), 1, "{diag:?}");
    assert!(
        diag[0].starts_with("rank 2 micro 0: loss 0.1643 (self-hosted) vs 0.2001 (weaver), Δ 3.58e-2: the pg term differs, from the advantages"),
        "{diag:?}"
    );
}

/// Seed 053: the KL terms (`kl_loss`, `approx_kl`) of clean cells differ through the
/// weaver's bf16-rounded log-probs; they carry a propagated tolerance now (k1/k2/k3 bound
/// from `logp − ref`), in the loss's mode (named as losscheck names it). The two summed
/// losses are still flagged.
#[test]
fn seed_053_kl_terms_carry_their_propagated_tolerance() {
    let t = truth(53);
    let (_, rep) = dumpdiff(53, &t);
    let kl = comparison(&rep, "loss", 1, 1, "loss.metrics.kl_loss");
    assert_eq!(kl["verdict"], "pass");
    assert!(kl["tolerance"]["source"]
        .as_str()
        .unwrap()
        .contains("seq-mean-token-sum-norm/12 of the k1/k2/k3 bound"));
    for (r, m) in [(0, 1), (1, 0)] {
        assert_eq!(
            comparison(&rep, "loss", r, m, "loss.loss")["verdict"],
            "fail"
        );
    }
}

/// Seed 066: one cell with an entropy and a KL term, no echo: the fit cannot tell the two
/// coefficients apart, but `loss − pg_loss` differs where both terms agree, so the
/// composition is reported as differing.
#[test]
fn seed_066_one_cell_composition_difference_is_reported() {
    let t = truth(66);
    let (code, rep) = dumpdiff(66, &t);
    assert_eq!(code, 1);
    let c = &rep["coefficients"][0];
    assert_eq!(c["name"], "entropy_coeff/kl_coef");
    assert_eq!(c["differ"], true);
    assert!(c["self_hosted_from"]
        .as_str()
        .unwrap()
        .starts_with("loss − pg_loss at rank 0 micro 0"));
}

/// Seed 120: a summed pg loss under `seq-mean-token-sum-norm` (÷ 16) was within the
/// token-mean tolerance; the mode's allowance flags it, and the diagnosis names the
/// aggregation.
#[test]
fn seed_120_summed_loss_under_the_norm_mode_is_flagged() {
    let t = truth(120);
    let (code, rep) = dumpdiff(120, &t);
    assert_eq!(code, 1);
    assert_eq!(
        comparison(&rep, "loss", 0, 0, "loss.loss")["verdict"],
        "fail"
    );
    let diag = strings(&rep["diagnosis"]);
    assert!(diag[0].contains("the aggregation differs"), "{diag:?}");
}

/// Seed 150: a coefficient change and a wrong mask in the only cell: the mask is flagged
/// at its position and the composition difference reported.
#[test]
fn seed_150_mask_and_composition_in_one_cell() {
    let t = truth(150);
    let (code, rep) = dumpdiff(150, &t);
    assert_eq!(code, 1);
    assert_eq!(
        comparison(&rep, "is_loss", 0, 0, "is_loss.effective_valid")["verdict"],
        "fail"
    );
    assert!(differing_coefficients(&rep).contains("entropy_coeff"));
}

/// Seed 165: clean, one cell, kl_coef 0.05 not echoed: the loss tolerance takes the KL
/// term's allowance with the coefficient bounded from the cell (`|loss − pg| / |kl|`).
#[test]
fn seed_165_clean_cell_with_an_unknown_kl_coefficient() {
    let t = truth(165);
    let (code, rep) = dumpdiff(165, &t);
    assert_eq!(code, 0);
    assert!(flagged(&rep).is_empty());
    let loss = comparison(&rep, "loss", 0, 0, "loss.loss");
    assert!(loss["tolerance"]["source"]
        .as_str()
        .unwrap()
        .contains("× the KL term's"));
}

#[test]
fn losscheck_names_every_self_inconsistent_file() {
    for e in EXPECT {
        let t = truth(e.seed);
        for tree in ["self_hosted_pt", "weaver_pt"] {
            if tree == "self_hosted_pt" && !e.self_hosted_readable {
                continue;
            }
            let (code, rep) = run(e.seed, "losscheck", &["--dump-dir", tree]);
            let want = truth_inconsistent(&t, tree);
            let got = inconsistent(&rep, tree);
            let missed: Vec<_> = want.difference(&got).collect();
            assert!(
                missed.is_empty(),
                "seed {} {tree}: not named {missed:?}",
                e.seed
            );
            if !want.is_empty() {
                assert_eq!(code, 1, "seed {} {tree}", e.seed);
            }
        }
    }
}

#[test]
fn seeds_cover_every_fault_kind_and_convention() {
    let mut kinds = BTreeSet::new();
    let mut modes = BTreeSet::new();
    let (mut permuted, mut per_micro, mut remote, mut missing) = (false, false, false, false);
    for e in EXPECT {
        let t = truth(e.seed);
        for f in t["faults"].as_array().unwrap() {
            kinds.insert(f["kind"].as_str().unwrap().to_string());
        }
        let c = &t["conventions"];
        modes.insert(c["loss_agg_mode"].as_str().unwrap().to_string());
        permuted |= !c["permuted_micros"].as_array().unwrap().is_empty();
        per_micro |= c["self_hosted_old_log_probs"] == "per-micro";
        remote |= c["remote_api"].as_bool().unwrap();
        missing |= c["missing"].is_object();
    }
    let all = [
        "coeff_changed",
        "loss_sum",
        "shift",
        "stale_old",
        "wrong_adv",
        "wrong_mask",
    ];
    assert_eq!(kinds, all.iter().map(|s| s.to_string()).collect());
    assert_eq!(modes.len(), 4, "{modes:?}");
    assert!(permuted && per_micro && remote && missing);
}

/// `--entropy-coeff` / `--kl-coef` replace what both sides echo or imply: the
/// coefficients then agree by construction and are reported as given by the flag.
#[test]
fn coefficient_flags_override_both_sides() {
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .current_dir(seed_dir(22))
        .args([
            "--self-hosted-dir",
            "self_hosted_pt",
            "--weaver-dir",
            "weaver_pt",
        ])
        .args(["--step", "0", "--format", "json"])
        .args(["--entropy-coeff", "0.001", "--kl-coef", "0.01"])
        .output()
        .unwrap();
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    let coef = rep["coefficients"].as_array().unwrap();
    assert_eq!(coef.len(), 2);
    let want = [
        ("entropy_coeff", 0.001, "flag --entropy-coeff"),
        ("kl_coef", 0.01, "flag --kl-coef"),
    ];
    for (c, (name, v, how)) in coef.iter().zip(want) {
        assert_eq!(c["name"], name);
        assert_eq!(
            (c["self_hosted"].as_f64(), c["weaver"].as_f64()),
            (Some(v), Some(v))
        );
        assert_eq!(c["differ"], false);
        assert_eq!(c["weaver_from"], how);
    }
}

/// Seed 7007: entropy and KL coefficients not echoed, two cells whose entropy and KL terms
/// are nearly proportional, so the weaver's fit cannot tell its entropy coefficient
/// (1e-4, ± 3.6e-4) from the self-hosted one (1e-3): the compositions are compared cell by
/// cell and the change is named (it was reported as agreeing).
#[test]
fn seed_7007_a_coefficient_change_the_fits_cannot_resolve_is_named() {
    let t = truth(7007);
    let (code, rep) = dumpdiff(7007, &t);
    assert_eq!(code, 1);
    assert!(
        differing_coefficients(&rep).contains("entropy_coeff"),
        "{:?}",
        differing_coefficients(&rep)
    );
    // the shift at rank 0 micro 1 is still flagged at its position
    assert_eq!(
        comparison(&rep, "is_loss", 0, 1, "is_loss.prob_ratio")["verdict"],
        "fail"
    );
}

/// Seeds 3064, 10160 (`--shape ci`) and 9641 (`--shape large`): a wrong advantage
/// normalisation on a weaver whose log-probs are bf16-rounded. Its effect on the near-zero
/// `pg_loss` nearly cancels the rounding's, so the difference of the two sides is smaller
/// than the rounding's worst case and the loss cell was missed. The loss scalars are now
/// judged against the difference the signed log-ratio differences predict: the loss cell
/// fails at the fault's rank and micro, and nothing else beyond truth is flagged.
#[test]
fn seeds_3064_10160_9641_wrong_advantages_fail_the_loss_cell_against_the_prediction() {
    for seed in [3064, 10160, 9641] {
        let t = truth(seed);
        let (code, rep) = dumpdiff(seed, &t);
        assert_eq!(code, 1, "seed {seed}");
        let got = flagged(&rep);
        assert_eq!(got, truth_cells(&t, true), "seed {seed}");
        let f = &t["faults"][0];
        assert_eq!(f["kind"], "wrong_adv");
        let (rank, micro) = (f["rank"].as_u64().unwrap(), f["micro"].as_u64().unwrap());
        assert!(got.contains(&("loss".to_string(), Some(rank), Some(micro))));
        let pg = comparison(&rep, "loss", rank, micro, "loss.pg_loss");
        assert_eq!(pg["verdict"], "fail", "seed {seed}");
        assert!(
            pg["tolerance"]["source"]
                .as_str()
                .unwrap()
                .contains("judged: a − b − ("),
            "seed {seed}: {}",
            pg["tolerance"]["source"]
        );
    }
    // Seed 3064 by hand (torch, f64): one group of 3 rows, rewards [1, 0, 0], unbiased
    // std, eps 1e-4: A = [1.1545, −0.5773, −0.5773]; Σ A·r·(e^−δ−1) per row over its
    // tokens, seq-mean-token-mean: −3.5942340506546657e-4. The dumped pg_loss differ by
    // 1.804e-5 only; what the prediction leaves unexplained is |a − b − P| (to 1e-9: the
    // tool's advantages are the recomputed ones, not these f64 values).
    let t = truth(3064);
    let (_, rep) = dumpdiff(3064, &t);
    let m = &comparison(&rep, "loss", 0, 0, "loss.pg_loss")["metrics"]["max_abs"];
    let (a, b) = (m["a"].as_f64().unwrap(), m["b"].as_f64().unwrap());
    let p = -3.594_234_050_654_665_7e-4;
    assert!((a - b).abs() < 2e-5, "{a} {b}");
    let unexplained = m["abs_diff"].as_f64().unwrap();
    assert!(
        (unexplained - (a - b - p).abs()).abs() < 1e-9,
        "{unexplained} vs {}",
        (a - b - p).abs()
    );
}

/// Seed 19327 (`--shape large`, seq-mean-token-sum over rows of up to 454 tokens, weaver
/// log-probs bf16-rounded, no fault): at rank 2 micro 0 the two sides' pg_loss differ by
/// 8.69e-3, which the signed log-ratio differences predict to 1.56e-5, more than f32's
/// default allowance (atol 1e-5 + rtol 1.3e-6·|a| = 1.36e-5) — the rest is each side's
/// f32 summation of ~300 terms per row of sums near 200, which the dumped values cannot
/// show. The loss cell was failed; now the tolerance adds both sides' f32 sums and the step
/// passes, the allowance two orders of magnitude below the difference it judges.
#[test]
fn seed_19327_the_prediction_allows_both_sides_f32_sums() {
    let t = truth(19327);
    assert!(t["faults"].as_array().unwrap().is_empty());
    assert_eq!(t["conventions"]["loss_agg_mode"], "seq-mean-token-sum");
    let (code, rep) = dumpdiff(19327, &t);
    assert_eq!(code, 0);
    assert!(flagged(&rep).is_empty(), "{:?}", flagged(&rep));
    let pg = comparison(&rep, "loss", 2, 0, "loss.pg_loss");
    let m = &pg["metrics"]["max_abs"];
    let (a, b) = (m["a"].as_f64().unwrap(), m["b"].as_f64().unwrap());
    let unexplained = m["abs_diff"].as_f64().unwrap();
    let base = 1e-5 + 1.3e-6 * a.abs().max(b.abs());
    assert!(unexplained > base, "{unexplained} {base}");
    let src = pg["tolerance"]["source"].as_str().unwrap();
    let arith: f64 = src
        .split(" for both sides' f32 sums")
        .next()
        .and_then(|s| s.rsplit("+ ").next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(unexplained <= base + arith, "{unexplained} {base} {arith}");
    assert!(arith < 0.1 * (a - b).abs(), "{arith} vs {}", a - b);
}
