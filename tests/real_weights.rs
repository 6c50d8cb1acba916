//! Per-token weights a side applies (truncated importance sampling against the rollout
//! engine's log-probs) in the "real" scenario family (issue 28), and every committed real
//! seed against its `truth.json`: both tools' exit codes, the cells dumpdiff fails and the
//! files losscheck calls inconsistent or "cannot judge".

use crate::support::losscheck_json as losscheck;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value as Json;

use crate::real_family::seed;

/// `truth.json` of the scenario folder `dir`.
pub(crate) fn truth_of(dir: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(dir.join("truth.json")).unwrap()).unwrap()
}

/// dumpdiff's JSON report of the scenario folder `dir` (its remote-API tree too, when it
/// has one), with its exit code.
pub(crate) fn dumpdiff(dir: &Path) -> (Option<i32>, Json) {
    let mut cmd = Command::cargo_bin("dumpdiff").unwrap();
    cmd.current_dir(dir)
        .args([
            "--self-hosted-dir",
            "self_hosted_pt",
            "--weaver-dir",
            "weaver_pt",
        ])
        .args(["--step", "0", "--format", "json"]);
    if dir.join("remote_api_pt").is_dir() {
        cmd.args(["--remote-api-dir", "remote_api_pt"]);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

/// The `is_loss_debug/…` files of a losscheck report with status `status`.
pub(crate) fn files_with(r: &Json, status: &str) -> BTreeSet<String> {
    r["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["status"] == status)
        .map(|v| {
            let f = v["file"].as_str().unwrap();
            f[f.find("is_loss_debug/")
                .or_else(|| f.find("loss/"))
                .unwrap()..]
                .to_string()
        })
        .collect()
}

pub(crate) fn strings(v: &Json) -> BTreeSet<String> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// `(rank, micro, status)` of every verdict.
pub(crate) fn statuses(r: &Json) -> Vec<(u64, u64, String)> {
    r["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["rank"].as_u64().unwrap(),
                v["micro"].as_u64().unwrap(),
                v["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The verdict of losscheck report `r` for the file ending in `name`.
pub(crate) fn verdict<'a>(r: &'a Json, name: &str) -> &'a Json {
    r["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["file"].as_str().unwrap().ends_with(name))
        .unwrap_or_else(|| panic!("no verdict for {name}"))
}

/// The coefficient line `name` (`entropy_coeff`, `kl_coef`) of dumpdiff report `r`.
pub(crate) fn coefficient<'a>(r: &'a Json, name: &str) -> &'a Json {
    r["coefficients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} coefficient in {r}"))
}

/// The convention `name` of a losscheck report.
pub(crate) fn convention<'a>(r: &'a Json, name: &str) -> &'a Json {
    r["conventions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} convention in {r}"))
}

/// The cell (rank, micro) of section `sec` of dumpdiff report `r`.
pub(crate) fn cell<'a>(r: &'a Json, sec: &str, rank: u64, micro: u64) -> &'a Json {
    r["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == sec)
        .and_then(|s| {
            s["cells"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["rank"] == rank && c["micro"] == micro)
        })
        .unwrap_or_else(|| panic!("no {sec} cell {rank}/{micro}"))
}

/// The comparison `name` of the cell (rank, micro) of section `sec`.
pub(crate) fn comparison<'a>(
    r: &'a Json,
    sec: &str,
    rank: u64,
    micro: u64,
    name: &str,
) -> &'a Json {
    let c = cell(r, sec, rank, micro);
    c["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {c}"))
}

/// The report's diagnosis line of cell (rank, micro), if any.
pub(crate) fn diagnosis(r: &Json, rank: u64, micro: u64) -> Option<String> {
    let head = format!("rank {rank} micro {micro}:");
    r["diagnosis"]
        .as_array()?
        .iter()
        .filter_map(|d| d.as_str())
        .find(|d| d.starts_with(&head))
        .map(str::to_string)
}

#[test]
fn every_committed_real_seed_gives_what_its_truth_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("real-")
        })
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 34, "{}", dirs.len());
    // where the tools knowingly depart from the truth, each with its reason and test
    let known: &[(&str, &str)] = &[
        // the ratio levels tie 2–2 at the inputs' precision: "cannot judge" is said of
        // the level (real_family::a_gspo_step_whose_ratio_levels_tie_is_said_not_blamed)
        (
            "real-seed-2038",
            "real-seed-2038: dumpdiff misses [(\"is_loss\", 0, 1), (\"is_loss\", 1, 0)], false alarms []",
        ),
        // one cell, sides at two ratio levels the step does not settle: a warning, exit 0
        // (real_family::sides_at_two_ratio_levels_in_a_one_cell_step_warn_not_fail)
        ("real-seed-3009", "real-seed-3009: dumpdiff exit Some(0)"),
        // the two cells that tell the pg aggregation apart show two modes alike (one by
        // its fault): losscheck cannot say which is wrong and says so of both
        // (two_cells_that_show_two_aggregations_alike_are_undetermined_not_blamed)
        (
            "real-novel-agg-tie-7447",
            "real-novel-agg-tie-7447 weaver_pt: losscheck exit 0",
        ),
        (
            "real-novel-agg-tie-7447",
            "real-novel-agg-tie-7447 weaver_pt: inconsistent {}, truth [\"is_loss_debug/step_000000_rank0_micro0.pt\"]",
        ),
        // the weaver's TIS moves rank 1 micro 3's pg_loss beyond the log-probs' rounding:
        // its pg_loss fails naming the importance weight, where truth calls the cell's
        // totals cannot judge for the unstated KL term (which its totals say, warned);
        // as before session 20 (real_causes::importance_weights_are_named_beside_a_term_no_file_states)
        (
            "real-novel-weight-beside-kl-7213",
            "real-novel-weight-beside-kl-7213: (\"loss\", 1, 3) fails where truth cannot judge",
        ),
    ];
    let mut problems = Vec::new();
    // as benches/score_scenarios.py scores the family: a cell is flagged when it fails or
    // warns; cells truth calls "cannot judge" or too close to call may be flagged, never
    // failed without saying so; an unreadable file's cell is not scored
    let cells = |v: &Json, required_only: bool| -> BTreeSet<(String, u64, u64)> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|c| !required_only || c["required"] == true)
            .map(|c| {
                let s = c["section"].as_str().unwrap_or("").to_string();
                (s, c["rank"].as_u64().unwrap(), c["micro"].as_u64().unwrap())
            })
            .collect()
    };
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_str().unwrap();
        let t = truth_of(dir);
        let dt = &t["dumpdiff"];
        let unread: BTreeSet<(u64, u64)> = cells(&dt["unreadable"], false)
            .into_iter()
            .map(|(_, r, m)| (r, m))
            .collect();
        let (required, allowed) = (
            cells(&dt["flag_cells"], true),
            cells(&dt["flag_cells"], false),
        );
        let cannot = cells(&dt["cannot_judge"], false);
        let mut optional: BTreeSet<(String, u64, u64)> = cells(&dt["cannot_judge_optional"], false)
            .into_iter()
            .flat_map(|(_, r, m)| [("is_loss".to_string(), r, m), ("loss".to_string(), r, m)])
            .collect();
        // (--novel) single cells a withheld term moves too little to require either reading
        if dt["cannot_judge_optional_cells"].is_array() {
            optional.extend(cells(&dt["cannot_judge_optional_cells"], false));
        }
        let (code, r) = dumpdiff(dir);
        let need = !required.is_empty()
            || dt["coefficients"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["required"] == true);
        let may = !allowed.is_empty() || !optional.is_empty();
        let code_ok = match (dt["exit_code"].as_i64(), code) {
            (Some(2), c) => c == Some(2),
            (_, Some(1)) => need || may,
            (_, Some(0)) => !need,
            _ => false,
        };
        if !code_ok {
            problems.push(format!("{name}: dumpdiff exit {code:?}"));
        }
        let mut flagged = BTreeSet::new();
        for s in r["sections"].as_array().unwrap() {
            for c in s["cells"].as_array().unwrap() {
                let key = (
                    s["name"].as_str().unwrap().to_string(),
                    c["rank"].as_u64().unwrap_or(0),
                    c["micro"].as_u64().unwrap_or(0),
                );
                if unread.contains(&(key.1, key.2)) {
                    continue;
                }
                if c["verdict"] == "fail" && cannot.contains(&key) {
                    problems.push(format!("{name}: {key:?} fails where truth cannot judge"));
                }
                if c["verdict"] == "pass" && cannot.contains(&key) {
                    problems.push(format!("{name}: {key:?} passes where truth cannot judge"));
                }
                if c["verdict"] == "fail" || c["verdict"] == "warn" {
                    flagged.insert(key);
                }
            }
        }
        let missed: Vec<_> = required
            .iter()
            .filter(|k| !unread.contains(&(k.1, k.2)) && !flagged.contains(*k))
            .collect();
        let extra: Vec<_> = flagged
            .iter()
            .filter(|k| !allowed.contains(*k) && !cannot.contains(*k) && !optional.contains(*k))
            .collect();
        if !missed.is_empty() || !extra.is_empty() {
            problems.push(format!(
                "{name}: dumpdiff misses {missed:?}, false alarms {extra:?}"
            ));
        }
        for tree in ["self_hosted_pt", "weaver_pt"] {
            let want = &t["losscheck"][tree];
            let (code, r) = losscheck(&dir.join(tree));
            if i64::from(code) != want["exit_code"].as_i64().unwrap() {
                problems.push(format!("{name} {tree}: losscheck exit {code}"));
            }
            let optional = strings(&want["cannot_judge_optional"]);
            let bad: BTreeSet<String> = files_with(&r, "inconsistent")
                .difference(&optional)
                .cloned()
                .collect();
            // (a cell truth makes optional may be anything, named inconsistent or not)
            let want_bad: BTreeSet<String> = strings(&want["inconsistent"])
                .difference(&optional)
                .cloned()
                .collect();
            if bad != want_bad {
                problems.push(format!(
                    "{name} {tree}: inconsistent {bad:?}, truth {}",
                    want["inconsistent"]
                ));
            }
            let cannot = strings(&want["cannot_judge"]);
            let said: BTreeSet<String> = files_with(&r, "cannot-judge")
                .union(&files_with(&r, "undetermined"))
                .cloned()
                .collect();
            if !said.is_superset(&cannot) {
                problems.push(format!(
                    "{name} {tree}: cannot judge {said:?}, truth {cannot:?}"
                ));
            }
        }
    }
    for (seed, line) in known {
        assert!(
            problems.iter().any(|p| p == line),
            "{seed} no longer departs as recorded: update the list"
        );
    }
    problems.retain(|p| !known.iter().any(|(_, line)| p == line));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_ratio_that_does_not_follow_stays_inconsistent_beside_unseen_weights() {
    // seed 1001: GSPO with truncated importance sampling against rollout log-probs the
    // weaver does not dump. In rank 0 micro 1 its prob_ratio was computed from old
    // log-probs shifted by one token: the ratio does not follow from its own log-probs,
    // which no weight explains (the weights enter after the ratio), so that cell is
    // inconsistent. In rank 0 micro 0 (a token ratio, the truth's other fault) the
    // per-token loss is the recomputed one times a weight in (0, 2]: cannot judge, under
    // the pg aggregation its own elementwise_loss shows (seq-mean-token-mean).
    let t = truth_of(&seed(1001));
    assert_eq!(t["conventions"]["rollout_log_probs_dumped"], false);
    let (code, r) = losscheck(&seed(1001).join("weaver_pt"));
    assert_eq!(code, 1, "{r}");
    let bad = verdict(&r, "rank0_micro1.pt");
    assert_eq!(bad["status"], "inconsistent");
    assert_eq!(bad["first_divergence"]["name"], "prob_ratio");
    let weighted = verdict(&r, "rank0_micro0.pt");
    assert_eq!(weighted["status"], "cannot-judge");
    let note = weighted["notes"][0].as_str().unwrap();
    assert!(
        note.starts_with("cannot judge the per-token loss: on 36 of 64 valid tokens")
            && note.contains("its pg term is the seq-mean-token-mean of that elementwise_loss")
            && note.contains("per-token weights the dump does not hold"),
        "{note}"
    );
}

#[test]
fn a_wrong_mask_under_unseen_weights_is_cannot_judge_not_inconsistent() {
    // seed 3023: the weaver drops the last response token of one row from its loss mask
    // (rank 0 micro 1; the dumped mask is the one it used, so its loss follows from it) and
    // applies weights it does not dump. That cell's per-token loss is the recomputed one
    // times factors in (0, 2] and its pg_loss the token-mean of it: cannot judge, exit 0
    // (it was "inconsistent", exit 1).
    let t = truth_of(&seed(3023));
    assert_eq!(
        strings(&t["losscheck"]["weaver_pt"]["cannot_judge"]),
        BTreeSet::from(["is_loss_debug/step_000000_rank0_micro1.pt".to_string()])
    );
    let (code, r) = losscheck(&seed(3023).join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert!(files_with(&r, "inconsistent").is_empty());
    assert_eq!(
        files_with(&r, "cannot-judge"),
        BTreeSet::from(["is_loss_debug/step_000000_rank0_micro1.pt".to_string()])
    );
    let note = verdict(&r, "rank0_micro1.pt")["notes"][0].as_str().unwrap();
    assert!(
        note.contains(
            "dumped elementwise_loss is the recomputed one times a factor between 0.678 and 1.998"
        ),
        "{note}"
    );
}

#[test]
fn weights_seen_in_other_cells_are_named_for_a_cell_whose_intermediates_were_not_read() {
    // seed 1021: the weaver dumps its rollout log-probs (its TIS weights are read in rank 0)
    // and its is_loss_debug of rank 1 micro 1 is truncated. That cell's loss totals differ
    // (TIS on the weaver's side only): they still fail, and the reason names the likely
    // cause and the cells that show it (before: "a weight or the inputs cannot be told
    // apart" only).
    let (code, r) = dumpdiff(&seed(1021));
    assert_eq!(code, Some(2));
    for name in ["loss.loss", "loss.pg_loss"] {
        let c = comparison(&r, "loss", 1, 1, name);
        assert_eq!(c["verdict"], "fail", "{c}");
        let reason = c["reason"].as_str().unwrap();
        assert!(
            reason.contains(
                "likely an importance weight: this cell's is_loss_debug was not read, and the weaver applies truncated importance sampling against its rollout_log_probs in rank 0 micro 0, rank 0 micro 1"
            ),
            "{reason}"
        );
    }
}

#[test]
fn weights_unseen_in_other_cells_make_an_unread_cells_totals_cannot_judge() {
    // seed 1035: weights the weaver does not dump, and its is_loss_debug of rank 1 micro 1
    // truncated. That cell's totals differ by the weights alone (no fault there): a
    // warning that cannot say which side is wrong, never a failure (it failed before).
    let (code, r) = dumpdiff(&seed(1035));
    assert_eq!(code, Some(2));
    for name in ["loss.loss", "loss.pg_loss"] {
        let c = comparison(&r, "loss", 1, 1, name);
        assert_eq!(c["verdict"], "warn", "{c}");
        let reason = c["reason"].as_str().unwrap();
        assert!(
            reason.contains(
                "cannot judge which side is wrong: this cell's is_loss_debug was not read, and the weaver's per-token loss carries weights it does not dump in rank 0 micro 0, rank 0 micro 2, rank 1 micro 0"
            ),
            "{reason}"
        );
    }
}

#[test]
fn a_summed_pg_loss_of_16_bit_log_probs_is_named_an_aggregation() {
    // seed 3016: the weaver sums its elementwise loss in rank 2 micros 0 and 2 (the truth's
    // faults), with float16 log-probs. Over micro 2's 20 tokens the sum is recomputed
    // from the rounded log-probs only to within their propagated rounding: with it
    // allowed, both cells are named "a sum, not a mean" (micro 2 was "pg term differs").
    let (code, r) = losscheck(&seed(3016).join("weaver_pt"));
    assert_eq!(code, 1);
    for (micro, tokens) in [(0, 9), (2, 20)] {
        let v = verdict(&r, &format!("rank2_micro{micro}.pt"));
        assert_eq!(v["status"], "inconsistent");
        let notes = v["notes"].to_string();
        assert!(
            notes.contains(&format!(
                "aggregation: the dumped pg_loss is the sum of the elementwise loss over {tokens} valid tokens, not its token-mean"
            )),
            "{notes}"
        );
    }
}

/// The committed scenario `fixtures/scenarios/real-novel-<name>`.
pub(crate) fn novel(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/scenarios/real-novel-{name}"))
}

#[test]
fn a_kl_loss_no_file_states_is_cannot_judge_not_an_entropy_coefficient() {
    // NexRL's use_kl_loss adds kl_coef · KL into the self-hosted `loss` and dumps no kl term
    // (`--easy --novel --novel-only use_kl_loss`, seed 2 with coefficients not echoed; seed
    // 0 echoed). Before, the KL term was fitted into the self-hosted entropy_coeff and
    // reported as differing, and the loss cells failed; now the coefficient has no value,
    // the totals warn, and losscheck calls every self-hosted file "cannot judge".
    let (code, r) = dumpdiff(&novel("kl-2"));
    assert_eq!(code, Some(0), "{r}");
    let c = coefficient(&r, "entropy_coeff");
    assert_eq!(c["differ"], false);
    assert!(c["self_hosted"].is_null(), "{c}");
    let why = c["self_hosted_from"].as_str().unwrap();
    assert!(
        why.starts_with("cannot judge: the loss holds a term no file states (a KL loss?)"),
        "{why}"
    );
    let x = comparison(&r, "loss", 0, 0, "loss.loss");
    assert_eq!(x["verdict"], "warn", "{x}");
    let (code, r) = losscheck(&novel("kl-2").join("self_hosted_pt"));
    assert_eq!(code, 0);
    assert_eq!(files_with(&r, "cannot-judge").len(), 6, "{r}");
    // echoed entropy_coeff: the composition leaves the KL term in every cell
    let (code, r) = dumpdiff(&novel("kl-echoed-0"));
    assert_eq!(code, Some(0), "{r}");
    let x = comparison(&r, "loss", 1, 2, "loss.loss");
    assert_eq!(x["verdict"], "warn", "{x}");
    let reason = x["reason"].as_str().unwrap();
    assert!(
        reason.contains("the self-hosted loss holds a term no file states (a KL loss?): loss − (pg_loss − entropy_coeff·entropy_loss) with its echoed entropy_coeff 0.001 leaves"),
        "{reason}"
    );
}

#[test]
fn nexrls_run_ids_give_the_self_hosted_advantages_their_two_stage_mean() {
    // several trajectories of a group share a run id (`--novel-only run_ids`, seed 1): NexRL
    // normalises by the mean and std of the run means. The self-hosted advantages derived
    // that way equal the weaver's dumped ones (they failed before), and nothing fails.
    let (code, r) = dumpdiff(&novel("run-ids-1"));
    assert_eq!(code, Some(0), "{r}");
    let is_loss = r["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "is_loss")
        .unwrap();
    let mut compared = 0;
    for c in is_loss["cells"].as_array().unwrap() {
        for x in c["comparisons"].as_array().unwrap() {
            if x["name"] == "is_loss.advantages" {
                assert_eq!(x["verdict"], "pass", "{x}");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 6);
}

#[test]
fn nexrls_remote_api_dump_compares_without_advantages_and_with_response_only_log_probs() {
    // NexRL's remote-API tree (`--novel-only remote_api`): prepared_trajectories hold
    // `advantages` as a list of empty lists, and the datums the rollout engine's log-probs,
    // full-length (seed 0) or response-only (seed 4). Before: every datum advantage was NaN
    // against the weaver's, trajectories were "lost", and response-only log-probs were
    // compared at the wrong positions. Now the datums' advantages are compared with the
    // self-hosted ones derived when there are any, nothing fails, and the log-probs are
    // placed on the loss mask and shown, not judged: a difference is the rollout↔trainer
    // mismatch.
    for seed in [0, 4] {
        let (code, r) = dumpdiff(&novel(&format!("remote-api-{seed}")));
        assert_eq!(code, Some(0), "{r}");
        let s = r["sections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "datums")
            .unwrap();
        let c = &s["cells"][0];
        let get = |name: &str| {
            c["comparisons"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == name)
                .unwrap()
                .clone()
        };
        assert_ne!(get("datums.advantages")["verdict"], "fail", "{c}");
        let lp = get("datums.logprobs");
        assert_eq!(lp["verdict"], "skipped", "{lp}");
        let reason = lp["reason"].as_str().unwrap();
        assert!(reason.starts_with("not judged: ") && reason.contains("rollout↔trainer mismatch"));
        // response-aligned: the log-probs agree up to the engine's noise
        let m = &lp["metrics"];
        assert!(m["pearson"].as_f64().unwrap() > 0.95, "{m}");
        assert!(!c["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "datums.rows"));
    }
}

#[test]
fn a_summed_pg_loss_beside_seen_weights_is_named_an_aggregation() {
    // seed 4019 (a fresh seed, run once: its one miss): one cell whose weaver applies TIS
    // against its dumped rollout log-probs and sums its elementwise loss. The per-token
    // loss differs from the recomputation on 11 positions, and its pg_loss is the plain sum
    // of its own elementwise_loss: losscheck names the aggregation, and dumpdiff's
    // adjudication of the cell carries it (before: "an importance weight" only).
    let (code, r) = losscheck(&seed(4019).join("weaver_pt"));
    assert_eq!(code, 1);
    let v = verdict(&r, "rank0_micro0.pt");
    assert_eq!(v["status"], "inconsistent");
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("aggregation: the dumped pg_loss is the sum of its own elementwise_loss over 24 valid tokens, not a mean"),
        "{notes}"
    );
    let (_, r) = dumpdiff(&seed(4019));
    assert!(
        r["adjudication"].to_string().contains("a sum, not a mean"),
        "{}",
        r["adjudication"]
    );
}

#[test]
fn a_self_hosted_tree_without_old_log_probs_is_judged_with_ratio_one() {
    // NexRL with do_old_log_prob_compute false dumps no old_log_probs and computes with
    // old_log_prob = log_prob.detach() (`--novel-only no_old_log_prob`, seed 0). losscheck
    // exited 2 with no report ("neither … layout"); now every cell is judged with old =
    // log_prob, says so, and follows.
    let dir = novel("no-old-0").join("self_hosted_pt");
    assert!(!dir.join("old_log_probs").exists());
    let (code, r) = losscheck(&dir);
    assert_eq!(code, 0, "{r}");
    let v = r["verdicts"].as_array().unwrap();
    assert_eq!(v.len(), 6);
    for x in v {
        assert_eq!(x["status"], "consistent", "{x}");
        assert!(
            x["notes"]
                .to_string()
                .contains("no old_log_probs dumped: judged with old = log_prob"),
            "{x}"
        );
    }
}

#[test]
fn an_echoed_aggregation_its_cells_do_not_follow_gives_way_to_theirs() {
    // seed 7115: NexRL echoes loss_agg_mode seq-mean-token-sum and reduces its pg term as
    // verl's seq-mean-token-mean, under GSPO's sequence ratio: the echoed name reproduced
    // none of the pg terms, so neither the policy nor the aggregation was found and
    // dumpdiff named no aggregation at all
    let (_, r) = losscheck(&novel("echoed-agg-gspo-7115").join("self_hosted_pt"));
    let conv = r["conventions"].to_string();
    assert!(
        conv.contains("seq-mean-token-mean (the dumped loss_agg_mode seq-mean-token-sum reproduces 0 of 3 pg terms, seq-mean-token-mean 3)"),
        "{conv}"
    );
    let policy = convention(&r, "policy");
    assert_eq!(
        policy["value"], "ppo-clip 0.2/0.2, GSPO sequence ratio",
        "{conv}"
    );
    assert_eq!(policy["explained"], 3, "{conv}");
    let (_, d) = dumpdiff(&novel("echoed-agg-gspo-7115"));
    assert!(
        d["adjudication"]
            .to_string()
            .contains("the dumped loss_agg_mode seq-mean-token-sum reproduces 0 of 3 pg terms"),
        "{d}"
    );
}

#[test]
fn a_temperature_whose_entropy_moves_nonlinearly_is_still_named() {
    // seed 6018: the weaver's log-probs from logits not divided by T = 0.6 correlate with
    // the self-hosted at pearson 0.989, their entropies at 0.876 (below the 0.9 a
    // systematic difference asks): "from log_probs" was said with no temperature
    let (_, r) = dumpdiff(&novel("temperature-6018"));
    let line = r["diagnosis"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .find(|d| d.starts_with("rank 1 micro 1:"))
        .unwrap_or_else(|| panic!("{}", r["diagnosis"]))
        .to_string();
    assert!(
        line.contains("the shape of logits divided by a sampling temperature on one side only"),
        "{line}"
    );
}

#[test]
fn a_one_cell_step_whose_total_is_scaled_cannot_be_judged_not_failed() {
    // one weaver cell (seed 7102): GSPO's sequence ratio, its total dumped times verl's
    // loss_scale_factor 4/6; one cell fits no scale, so losscheck called it inconsistent
    let (code, r) = losscheck(&novel("one-cell-scale-7102").join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    let v = &r["verdicts"][0];
    assert_eq!(v["status"], "cannot-judge", "{v}");
    let notes = v["notes"].to_string();
    assert!(notes.contains("GSPO sequence ratio"), "{notes}");
    assert!(notes.contains("≈ 4/6 (verl's loss_scale_factor"), "{notes}");
}

#[test]
fn a_truncated_loss_file_beside_a_lone_coefficient_is_cannot_judge() {
    // seed 7117: a weaver cell with unseen TIS weights whose loss/ file is truncated, the
    // entropy coefficient inferred from the step's one other cell alone: its total cannot
    // check this cell's (it was called inconsistent); the file is named unreadable, exit 2
    let (code, r) = losscheck(&novel("truncated-lone-coef-7117").join("weaver_pt"));
    assert_eq!(code, 2, "{r}");
    let v = verdict(&r, "is_loss_debug/step_000000_rank0_micro0.pt");
    assert_eq!(v["status"], "cannot-judge", "{v}");
    assert!(
        v["notes"]
            .to_string()
            .contains("inferred from one cell's total alone"),
        "{v}"
    );
}

#[test]
fn rows_without_ids_or_old_log_probs_are_placed_where_nexrl_deals_them() {
    // no input_ids and no old_log_probs (seed 6009: trajectories in arrival order, bf16):
    // nothing placed the rows, losscheck exited 2 with no report; now they are dealt in
    // NexRL's batch order over ranks and micros, checked against the response lengths
    let dir = novel("no-old-no-ids-6009").join("self_hosted_pt");
    assert!(!dir.join("old_log_probs").exists());
    let (code, r) = losscheck(&dir);
    assert_eq!(code, 0, "{r}");
    let v = r["verdicts"].as_array().unwrap();
    assert_eq!(v.len(), 4);
    for x in v {
        assert_eq!(x["status"], "consistent", "{x}");
        assert!(
            x["notes"].to_string().contains(
                "rows placed as NexRL deals them, NexRL's batch order over ranks then micros"
            ),
            "{x}"
        );
    }
}

#[test]
fn clip_fractions_that_differ_over_agreeing_ratios_name_the_clip_bound() {
    // seed 124: the weaver clips at 1 + 0.2 where clip_ratio_high is 0.28 (rank 0 micro 1);
    // the one band token moves the loss less than the self-hosted bf16 log-probs' rounding,
    // so only the clip fractions differ (0 vs 1/21) — with prob_ratio, advantages and mask
    // agreeing, the sides clipped different tokens of the same ratios: the is_loss cell
    // fails on is_loss.clip_bound and names it (before: is_loss passed, a miss)
    let (code, r) = dumpdiff(&seed(124));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "is_loss", 0, 1, "is_loss.clip_bound");
    assert_eq!(c["verdict"], "fail");
    assert!(
        c["reason"].as_str().unwrap().starts_with(
            "the clip bound differs: the sides' clip fractions differ (0 vs 0.04762) while their prob_ratio, advantages and mask agree"
        ),
        "{c}"
    );
    let f = comparison(&r, "loss", 0, 1, "loss.metrics.actor/pg_clipfrac");
    assert!(
        f["reason"]
            .as_str()
            .unwrap()
            .contains("the clip bound differs"),
        "{f}"
    );
}

#[test]
fn two_cells_that_show_two_aggregations_alike_are_undetermined_not_blamed() {
    // seed 7447: NexRL's pg term under seq-mean-token-mean, its entropy under token-mean;
    // the only two cells whose pg terms tell the modes apart are a 1-row cell summed by a
    // fault (seq-mean-token-sum) and a clean 3-row cell (seq-mean-token-mean). The order of
    // the candidates used to settle it, and the clean cell was called inconsistent.
    let (code, r) = losscheck(&novel("agg-tie-7447").join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    for cell in ["rank0_micro0.pt", "rank0_micro1.pt"] {
        let v = verdict(&r, cell);
        assert_eq!(v["status"], "undetermined", "{v}");
        let notes = v["notes"].to_string();
        assert!(
            notes.contains("cannot judge the aggregation: the step's pg terms show seq-mean-token-sum and seq-mean-token-mean alike (1 cell each where they differ)"),
            "{notes}"
        );
    }
    for cell in ["rank1_micro0.pt", "rank1_micro1.pt"] {
        assert_eq!(verdict(&r, cell)["status"], "consistent");
    }
    let agg = convention(&r, "agg");
    assert_eq!(
        agg["value"],
        "seq-mean-token-sum (or seq-mean-token-mean: the pg terms cannot tell)"
    );
    // dumpdiff has the other side: the summed cell still fails, the aggregation named
    let (code, r) = dumpdiff(&novel("agg-tie-7447"));
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(
        comparison(&r, "loss", 0, 0, "loss.pg_loss")["verdict"],
        "fail"
    );
}

#[test]
fn batch_normalised_weights_near_one_are_read_under_bf16_log_probs() {
    // seed 7430: GSPO, token TIS cap 2 divided by its batch mean 1.045, bf16 log-probs
    // (a factor's tolerance 1.6 %: the divisor was tried only beyond 3 of them), and one
    // cell computing the token ratio (its own policy loss, under no weights the step
    // reads). Before, a sequence-level cap 0.96 explained 1 of 14 cells and the token-ratio
    // cell was called inconsistent.
    let (code, r) = losscheck(&novel("is-batch-norm-near-one-7430").join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert_eq!(files_with(&r, "consistent").len(), 14, "{r}");
    let conv = r["conventions"].to_string();
    assert!(
        conv.contains("token TIS cap 2, batch-normalised (÷ 1.045, the weights' batch mean)"),
        "{conv}"
    );
    let notes = verdict(&r, "rank0_micro0.pt")["notes"].to_string();
    assert!(
        notes.contains("this cell computes its policy loss otherwise"),
        "{notes}"
    );
}

#[test]
fn a_pg_term_summed_under_unseen_weights_fails_naming_the_aggregation() {
    // seed 7427: token TIS whose rollout log-probs are not dumped, and one weaver cell whose
    // pg_loss is the plain sum of its own elementwise_loss. The unseen weights made every
    // loss total "cannot judge"; a sum no mean gives is wrong whatever the weights.
    let (code, r) = dumpdiff(&novel("own-sum-unseen-7427"));
    assert_eq!(code, Some(1), "{r}");
    for (sec, name) in [("loss", "loss.loss"), ("is_loss", "is_loss.loss")] {
        let x = comparison(&r, sec, 0, 3, name);
        assert_eq!(x["verdict"], "fail", "{x}");
        assert!(
            x["reason"]
                .as_str()
                .unwrap()
                .ends_with("yet weaver's own pg_loss is the plain sum of its own elementwise_loss (which holds the weights), which no mean gives: the aggregation differs"),
            "{x}"
        );
    }
    // the clean cells' totals stay warnings: their weights are unseen
    assert_eq!(comparison(&r, "loss", 0, 0, "loss.loss")["verdict"], "warn");
    let d = diagnosis(&r, 0, 3).unwrap();
    assert!(
        d.contains("yet weaver's own pg_loss is the plain sum"),
        "{d}"
    );
    assert!(!d.contains("cannot be judged"), "{d}");
}

#[test]
fn a_one_cell_step_whose_coefficients_fit_its_own_totals_is_not_called_consistent() {
    // seed 7466: one cell, nothing echoed, NexRL's KL loss in the self-hosted total (its
    // reference log-probs not dumped). Each side's entropy_coeff is fitted to its one total
    // (0.00212 with the KL term in it, 0.003): both tools passed it silently.
    let dir = novel("lone-kl-7466");
    let (code, r) = dumpdiff(&dir);
    assert_eq!(code, Some(0), "{r}");
    for (sec, name) in [("loss", "loss.loss"), ("is_loss", "is_loss.loss")] {
        let x = comparison(&r, sec, 0, 0, name);
        assert_eq!(x["verdict"], "warn", "{x}");
        assert!(
            x["reason"].as_str().unwrap().contains(
                "cannot judge which side is wrong: each side's entropy_coeff is fitted to its one cell's total (self-hosted 0.00212, weaver 0.003)"
            ),
            "{x}"
        );
    }
    for tree in ["self_hosted_pt", "weaver_pt"] {
        let (code, r) = losscheck(&dir.join(tree));
        assert_eq!(code, 0, "{r}");
        let v = &r["verdicts"][0];
        assert_eq!(v["status"], "undetermined", "{v}");
        assert!(
            v["notes"]
                .to_string()
                .contains("its terms follow, but its total is the one equation entropy_coeff"),
            "{v}"
        );
    }
}

#[test]
fn the_ratio_level_the_dumped_ratios_show_is_taken_when_unseen_weights_blur_every_pg_term() {
    // seed 7420: GSPO, sequence-level IcePop weights whose rollout log-probs are not dumped,
    // seq_max rejection leaving one row in a cell, a truncated loss file. No policy
    // reproduced more pg terms than the preset's token ratio (the weights blur them all),
    // so three rank-2 cells were called inconsistent at their prob_ratio.
    let (code, r) = losscheck(&novel("gspo-rs-unseen-7420").join("weaver_pt"));
    assert_eq!(code, 2, "{r}");
    let policy = convention(&r, "policy");
    assert_eq!(policy["value"], "ppo-clip 0.2/0.2, GSPO sequence ratio");
    assert_eq!(
        files_with(&r, "inconsistent"),
        BTreeSet::from(["is_loss_debug/step_000000_rank0_micro2.pt".to_string()])
    );
    // the cell rejection left one row: its constant factor is that row's weight
    let v = verdict(&r, "rank2_micro2.pt");
    assert_eq!(v["status"], "cannot-judge", "{v}");
    assert!(
        v["notes"].to_string().contains("on 7 of 7 valid tokens"),
        "{v}"
    );
}

#[test]
fn pg_terms_summed_from_their_own_per_token_loss_are_failed_beside_unseen_weights() {
    // seed 7564: three weaver cells, two summing their pg term, the third carrying weights
    // the dump does not hold. "The picture explains none of three cells" made all three
    // "cannot judge"; a sum no mean gives is a fault whatever the picture.
    let (code, r) = losscheck(&novel("sums-beside-unseen-weights-7564").join("weaver_pt"));
    assert_eq!(code, 1, "{r}");
    assert_eq!(
        files_with(&r, "inconsistent"),
        BTreeSet::from([
            "is_loss_debug/step_000000_rank0_micro0.pt".to_string(),
            "is_loss_debug/step_000000_rank0_micro2.pt".to_string()
        ])
    );
    assert_eq!(verdict(&r, "rank0_micro1.pt")["status"], "cannot-judge");
}

#[test]
fn an_on_policy_step_takes_the_ratio_level_its_dumped_ratios_show() {
    // seed 7524: GSPO on-policy (ratio ≈ 1: every level reproduces every pg term) and the
    // loss file of rank 1 micro 1 truncated: the preset's token ratio was kept, and that
    // cell, judged on its total alone, was called inconsistent at its prob_ratio
    let (code, r) = losscheck(&novel("gspo-on-policy-truncated-7524").join("weaver_pt"));
    assert_eq!(code, 2, "{r}");
    assert_eq!(
        convention(&r, "policy")["value"],
        "ppo-clip 0.2/0.2, GSPO sequence ratio"
    );
    assert!(files_with(&r, "inconsistent").is_empty(), "{r}");
}

#[test]
fn totals_where_the_loss_masks_differ_are_not_equal_within_the_log_probs_allowance() {
    // seed 7421: a wrong mask drops one token of rank 2 micro 0 on the weaver, whose totals
    // are scaled; unscaled they differ by 10 %, inside the allowance f16/bf16 log-probs
    // propagate, and were called "equal unscaled"
    let (code, r) = dumpdiff(&novel("mask-inside-allowance-7421"));
    assert_eq!(code, Some(1), "{r}");
    let x = comparison(&r, "loss", 2, 0, "loss.loss");
    assert_eq!(x["verdict"], "fail", "{x}");
    assert!(x["reason"].as_str().unwrap().contains("unscaled by"), "{x}");
    assert_eq!(
        comparison(&r, "is_loss", 2, 0, "is_loss.effective_valid")["verdict"],
        "fail"
    );
}

#[test]
fn a_clip_range_the_blurred_ratio_suggests_gives_way_to_the_f32_ratio() {
    // seed 7627: float16 log-probs on both sides; on rank 1 micro 0 the ratio re-derived
    // from them read a clip_ratio_high of 0.2 off the self-hosted pg_loss, which follows
    // 0.28 on the weaver's own f32 prob_ratio: a false "clip bound differs"
    let (code, r) = dumpdiff(&novel("clip-blurred-f16-both-7627"));
    assert_eq!(code, Some(1), "{r}");
    let x = comparison(&r, "is_loss", 1, 0, "is_loss.elementwise_loss");
    assert_eq!(x["verdict"], "pass", "{x}");
    // the real clip fault (rank 3 micro 2) still fails
    let f = comparison(&r, "is_loss", 3, 2, "is_loss.elementwise_loss");
    assert_eq!(f["verdict"], "fail", "{f}");
}

#[test]
fn a_ratio_of_old_log_probs_shifted_by_a_token_is_named_whatever_the_picture() {
    // seed 7637: three weaver cells, all faulty — one sums its pg term, two compute their
    // ratio from old_log_probs shifted right by one token. Two of three inconsistent cells
    // put the picture in doubt and made the shifts "cannot judge"; each shift is read off
    // the cell's own values
    let (code, r) = losscheck(&novel("shifts-and-sum-7637").join("weaver_pt"));
    assert_eq!(code, 1, "{r}");
    assert_eq!(files_with(&r, "inconsistent").len(), 3, "{r}");
    for cell in ["rank0_micro0.pt", "rank1_micro0.pt"] {
        let notes = verdict(&r, cell)["notes"].to_string();
        assert!(
            notes.contains("with old_log_probs shifted right by one token on")
                && notes.contains("old_log_probs shifted"),
            "{notes}"
        );
    }
}

#[test]
fn a_summed_pg_term_fails_beside_a_term_the_other_side_does_not_state() {
    // seed 7678: the weaver sums its pg term (weights it does not dump), the self-hosted
    // total holds NexRL's unechoed KL loss: every total warned "cannot judge which side is
    // wrong", and the sum passed as a warning (exit 0 where 1 is due)
    let (code, r) = dumpdiff(&novel("sum-beside-unstated-kl-7678"));
    assert_eq!(code, Some(1), "{r}");
    let x = comparison(&r, "loss", 0, 0, "loss.loss");
    assert_eq!(x["verdict"], "fail", "{x}");
    assert!(
        x["reason"]
            .as_str()
            .unwrap()
            .ends_with("which no mean gives: the aggregation differs"),
        "{x}"
    );
}
