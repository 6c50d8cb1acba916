//! Fresh real-convention seeds of sessions 21 and 22 (issue 28): each was a false alarm
//! the first time the tools met it, and is checked here for the behaviour that removed it (the truth
//! files themselves are checked by `real_weights::every_committed_real_seed_gives_what_its_truth_says`).

use crate::real_weights::{
    cell, coefficient, comparison, convention, dumpdiff, files_with, novel, statuses, verdict,
};
use crate::support::losscheck_json as losscheck;

#[test]
fn a_dual_clip_other_than_three_is_read_off_the_sides_own_values() {
    // seed 7779: verl's dual clip with clip_ratio_c 2 (not its default 3, nothing echoes
    // it); one token of rank 1 micro 0 has A < 0 and a ratio of 2.18, so the weaver's own
    // per-token loss is −A·2 there. The self-hosted per-token loss was derived under PPO's
    // clip alone (or dual clip 3) and the clean cell failed.
    let (code, r) = dumpdiff(&novel("dual-clip-2-7779"));
    assert_eq!(code, Some(1), "{r}");
    let x = comparison(&r, "is_loss", 1, 0, "is_loss.elementwise_loss");
    assert_eq!(x["verdict"], "pass", "{x}");
    let from = x["origin_a"]["from"].as_str().unwrap();
    assert!(from.contains("A<0 capped at −A·2 "), "{from}");
    // the rejection-sampled cells still fail, on the mask
    let x = comparison(&r, "is_loss", 0, 0, "is_loss.effective_valid");
    assert_eq!(x["verdict"], "fail", "{x}");
}

#[test]
fn an_unstated_term_over_two_cells_is_no_coefficient_difference() {
    // seed 7764: the self-hosted loss holds an MSE KL loss no file states; fitted over two
    // cells it moves the self-hosted entropy_coeff to 9.28e-5 (1e-4 configured on both
    // sides) with residuals above the totals' rounding. It was reported as differing.
    let (code, r) = dumpdiff(&novel("unstated-mse-kl-two-cells-7764"));
    assert_eq!(code, Some(1), "{r}");
    let c = coefficient(&r, "entropy_coeff");
    assert_eq!(c["differ"], false, "{c}");
    let (a, b) = (
        c["self_hosted"].as_f64().unwrap(),
        c["weaver"].as_f64().unwrap(),
    );
    assert!(
        (a - 9.281e-5).abs() < 1e-8 && (b - 1e-4).abs() < 1e-8,
        "{c}"
    );
    // the real fault (a token dropped from the mask) still fails its cells
    for sec in ["loss", "is_loss"] {
        assert_eq!(cell(&r, sec, 0, 0)["verdict"], "fail", "{r}");
    }
}

#[test]
fn huge_totals_do_not_let_an_unstated_term_pass_as_rounding() {
    // seed 7768: two self-hosted cells with totals near ±2e4 beside four near 1, and an
    // unstated low_var_kl loss (coefficient 0.1). The coefficient fit's tolerance took the
    // mean square of every cell's rounding, so the big cells' made the KL term's scatter
    // look like rounding: entropy_coeff 0.00604 "explained" 5 of 6 cells and one clean
    // cell was called inconsistent (exit 1).
    let dir = novel("huge-totals-unstated-kl-7768");
    let (code, r) = losscheck(&dir.join("self_hosted_pt"));
    assert_eq!(code, 0, "{r}");
    assert!(files_with(&r, "inconsistent").is_empty(), "{r}");
    assert_eq!(
        statuses(&r)
            .iter()
            .filter(|(_, _, s)| s == "cannot-judge")
            .count(),
        6,
        "{r}"
    );
    // the weaver's rank 1 micro 1 has no readable loss/ file: only its total is dumped,
    // under per-token weights it does not dump; its entropy_coeff (0.01) is fitted on the
    // four other cells' totals, the two huge ones weighted by their rounding (it was pulled
    // to 0.00973 and missed three of five)
    let (code, r) = losscheck(&dir.join("weaver_pt"));
    assert_eq!(code, 2, "{r}");
    assert!(files_with(&r, "inconsistent").is_empty(), "{r}");
    let c = convention(&r, "entropy_coeff");
    assert!((c["number"].as_f64().unwrap() - 0.01).abs() < 1e-6, "{c}");
    assert_eq!(
        (c["explained"].as_u64(), c["cells"].as_u64()),
        (Some(5), Some(5)),
        "{c}"
    );
    let v = verdict(&r, "is_loss_debug/step_000000_rank1_micro1.pt");
    assert_eq!(v["status"], "cannot-judge", "{v}");
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("per-token weights the dump does not hold"),
        "{notes}"
    );
}

#[test]
fn rows_no_placement_holds_are_not_compared_as_if_contiguous() {
    // seed 7937 (--multi-turn): a self-hosted side without input_ids under dynamic micros;
    // rank 2 micro 0's rows are clearly placed neither by their log-probs nor by position,
    // and the contiguous guess holds trajectories of other response lengths. Its old
    // log-probs were sliced from rows 8-9 anyway and the clean cell failed.
    let (code, r) = dumpdiff(&novel("multi-turn-unplaced-rows-7937"));
    assert_eq!(code, Some(0), "{r}");
    let c = cell(&r, "is_loss", 2, 0);
    assert_eq!(c["verdict"], "pass", "{c}");
    for name in ["is_loss.old_log_probs", "is_loss.advantages"] {
        let x = comparison(&r, "is_loss", 2, 0, name);
        assert_eq!(x["verdict"], "skipped", "{x}");
        assert!(
            x["reason"]
                .as_str()
                .unwrap()
                .starts_with("rows not placed in the batch: no input_ids"),
            "{x}"
        );
    }
    // the other cells' rows are placed and compared
    let x = comparison(&r, "is_loss", 0, 0, "is_loss.old_log_probs");
    assert_eq!(x["verdict"], "pass", "{x}");
}

#[test]
fn rows_no_placement_holds_are_cannot_judge_in_losscheck_not_unreadable() {
    // seed 7937: losscheck set rank 2 micro 0 aside as an unreadable file (exit 2) though
    // the file reads; rows nothing places are the picture's limit: "cannot judge" (a
    // warning, exit 0), its dumped loss shown, nothing recomputed, every other cell judged
    let tree = novel("multi-turn-unplaced-rows-7937").join("self_hosted_pt");
    let (code, r) = losscheck(&tree);
    assert_eq!(code, 0, "{r}");
    assert!(r.get("unreadable").is_none(), "{r}");
    let v = r["verdicts"].as_array().unwrap();
    let cells: Vec<(u64, u64, &str)> = v
        .iter()
        .map(|v| {
            (
                v["rank"].as_u64().unwrap(),
                v["micro"].as_u64().unwrap(),
                v["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            (0, 0, "consistent"),
            (0, 1, "consistent"),
            (1, 0, "consistent"),
            (1, 1, "consistent"),
            (2, 0, "cannot-judge"),
            (2, 1, "consistent"),
        ]
    );
    let c = &v[4];
    assert!(c["recomputed_loss"].is_null(), "{c}");
    assert!(
        (c["dumped_loss"].as_f64().unwrap() - 1.079).abs() < 1e-3,
        "{c}"
    );
    let note = c["notes"][0].as_str().unwrap();
    assert!(
        note.contains("cannot judge: no input_ids, and rows [0, 1] could not be placed"),
        "{note}"
    );
    // the text says why in its first line
    let out = assert_cmd::Command::cargo_bin("losscheck")
        .unwrap()
        .args(["--dump-dir"])
        .arg(&tree)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().next().unwrap().ends_with(
            "WARN — cannot judge 1 of 6 cells: their rows could not be placed (see each cell)"
        ),
        "{text}"
    );
    // at --fail-on warning the cell is a finding (exit 1), still not an input error
    let out = assert_cmd::Command::cargo_bin("losscheck")
        .unwrap()
        .args(["--fail-on", "warning", "--dump-dir"])
        .arg(&tree)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_coefficient_no_loss_scale_explains_differs_when_every_pg_term_is_0() {
    // seed 7828 (fresh, run once at the end): every self-hosted pg term is 0, so its totals
    // are −entropy_coeff·entropy_loss; they were read as the weaver's 1e-2 under a loss
    // scale of 1/100 and the changed coefficient (1e-4) was missed. A scale of one 1/k on
    // every cell is 1/GA or rows/mini-batch: k is at most the side's cells (2 here).
    let (code, r) = dumpdiff(&novel("pg-free-coef-not-scale-7828"));
    assert_eq!(code, Some(1), "{r}");
    let c = coefficient(&r, "entropy_coeff");
    assert_eq!(c["differ"], true, "{c}");
    let (a, b) = (
        c["self_hosted"].as_f64().unwrap(),
        c["weaver"].as_f64().unwrap(),
    );
    assert!((a - 1e-4).abs() < 1e-9 && (b - 1e-2).abs() < 1e-8, "{c}");
}

/// Every comparison named `name` in dumpdiff report `r`, any section or cell.
fn comparisons_named<'a>(r: &'a serde_json::Value, name: &str) -> Vec<&'a serde_json::Value> {
    r["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["cells"].as_array().unwrap())
        .flat_map(|c| c["comparisons"].as_array().into_iter().flatten())
        .filter(|x| x["name"] == name)
        .collect()
}

#[test]
fn float16_rounding_the_sequence_mean_cancels_is_no_ratio_level_evidence() {
    // seed 8025 (fresh set 8000, run once): on-policy, the self-hosted log-probs dumped in
    // float16. The sequence ratio's mean cancels their rounding, so it fitted the
    // self-hosted pg_loss of rank 0 micro 0 11x closer than the token ratio — within the
    // inputs' allowance both — and the cell warned "the sides differ in ratio level".
    let (code, r) = dumpdiff(&novel("float16-on-policy-level-8025"));
    assert_eq!(code, Some(1), "{r}");
    assert!(
        comparisons_named(&r, "is_loss.ratio_level").is_empty(),
        "{r}"
    );
    assert_eq!(cell(&r, "is_loss", 0, 0)["verdict"], "pass");
    // the step's one fault (a summed pg term, rank 2 micro 0) is still found and named
    assert_eq!(cell(&r, "is_loss", 2, 0)["verdict"], "fail");
    let d = crate::real_weights::diagnosis(&r, 2, 0).unwrap();
    assert!(d.contains("the aggregation differs"), "{d}");
}

#[test]
fn weights_that_fit_no_more_cells_than_none_are_not_read_into_a_step() {
    // seed 8017: float16 weaver log-probs, the engine's log-probs dumped, rejection sampling
    // and no importance weights. A batch-normalised sequence cap 0.85 (weights 0.996)
    // explained as many pg terms as no weights, a little closer (it fits rounding), and
    // was taken: two clean cells then failed or could not be judged.
    let (code, r) = losscheck(&novel("float16-no-weights-8017").join("weaver_pt"));
    assert_eq!(code, 1, "{r}");
    let policy = convention(&r, "policy")["value"].as_str().unwrap();
    assert_eq!(policy, "ppo-clip 0.2/0.2, token ratio");
    assert!(
        r["conventions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "rollout_is"),
        "{r}"
    );
    let want: Vec<(u64, u64, String)> = [
        (0, 0, "consistent"),
        (0, 1, "consistent"),
        (0, 2, "consistent"),
        (1, 0, "consistent"),
        (1, 1, "inconsistent"), // old_log_probs shifted: the truth's fault
    ]
    .iter()
    .map(|(a, b, c)| (*a, *b, c.to_string()))
    .collect();
    assert_eq!(statuses(&r), want);
}

#[test]
fn one_telling_cell_takes_the_steps_rows_as_its_loss_scale() {
    // seed 8172 (--multi-turn): one micro of four carries advantages, the coefficients are
    // echoed (0), and the weaver's total is pg_loss x rows / 12 (verl's loss_scale_factor).
    // The three all-zero cells fitted every scale: none was inferred and the clean cell
    // failed "composition".
    let (code, r) = losscheck(&novel("multi-turn-one-cell-scale-8172").join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert!(statuses(&r).iter().all(|s| s.2 == "consistent"), "{r}");
    let scale = convention(&r, "loss_scale");
    assert_eq!(
        scale["value"]
            .as_str()
            .unwrap()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>(),
        ["rows", "/", "12"]
    );
    assert_eq!(scale["explained"], 1);
    assert_eq!(scale["cells"], 1);
}

#[test]
fn one_row_carrying_the_loss_under_unseen_weights_is_cannot_judge() {
    // seed 8162 (--multi-turn): batch-normalised sequence TIS, the engine's log-probs not
    // dumped. In rank 1 micro 1 only row 0 has a non-zero advantage, so every token with a
    // loss shares one factor (0.438): a sequence weight as much as a scale. The cell was
    // failed as inconsistent beside three "cannot judge" cells of the same weights.
    let (code, r) = losscheck(&novel("multi-turn-one-row-unseen-weights-8162").join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert!(files_with(&r, "inconsistent").is_empty(), "{r}");
    let v = verdict(&r, "rank1_micro1.pt");
    assert_eq!(v["status"], "cannot-judge");
    let note = v["notes"][0].as_str().unwrap();
    assert!(
        note.starts_with("cannot judge the per-token loss: on 6 of 21 valid tokens")
            && note.contains("per-token weights the dump does not hold"),
        "{note}"
    );
}

#[test]
fn totals_a_rejection_mask_moves_name_the_rejection_sampling() {
    // seed 8159 (--multi-turn): the weaver applies verl's token TIS and token_k1 rejection
    // sampling. In rank 1 micro 1 the totals pass within the rounding allowance but fail
    // because the loss masks differ; they said only "the loss mask differs", the mask
    // comparison alone naming its cause.
    let (code, r) = dumpdiff(&novel("multi-turn-rejection-totals-8159"));
    assert_eq!(code, Some(1), "{r}");
    let x = comparison(&r, "loss", 1, 1, "loss.loss");
    assert_eq!(x["verdict"], "fail", "{x}");
    let why = x["reason"].as_str().unwrap();
    assert!(
        why.contains("but the loss mask differs in this cell (is_loss.effective_valid: verl's rejection sampling (rollout_rs=\"token_k1\"")
            && why.ends_with("the totals differ by the masked tokens, not by rounding"),
        "{why}"
    );
}

#[test]
fn a_pg_aggregation_no_pg_term_tells_is_tried_in_every_mode() {
    // seed 8372 (--multi-turn): two weaver cells. Rank 1's advantages are all 0 (its pg
    // term 0 under every mode) and its entropy term, reduced by token-mean as NexRL always
    // does, "settled" token-mean for the pg term too; rank 0's loss file is truncated and
    // its total follows seq-mean-token-mean. It was failed "the aggregation differs".
    let tree = novel("multi-turn-agg-no-pg-tells-8372").join("weaver_pt");
    let (code, r) = losscheck(&tree);
    assert_eq!(code, 2, "the truncated loss file: {r}");
    assert!(statuses(&r).iter().all(|s| s.2 == "consistent"), "{r}");
    let note = verdict(&r, "rank0_micro0.pt")["notes"].to_string();
    assert!(note.contains("seq-mean-token-mean"), "{note}");
}

#[test]
fn a_total_only_cells_unseen_weights_allow_its_coefficients_error() {
    // seed 8202: token TIS on the weaver, its engine log-probs not dumped; rank 2's totals
    // of 1e5 leave entropy_coeff fitted 0 +- 4e-3. Rank 0 micro 0's loss file is
    // truncated: its total is the token-mean of its own weighted per-token loss less
    // 1e-4 * H, inside that error. It was inconsistent; the shift in rank 1 stays.
    let (code, r) = losscheck(&novel("total-only-coef-se-weights-8202").join("weaver_pt"));
    assert_eq!(code, 2, "the truncated loss file: {r}");
    assert_eq!(
        files_with(&r, "inconsistent"),
        ["is_loss_debug/step_000000_rank1_micro0.pt".to_string()].into()
    );
    assert_eq!(verdict(&r, "rank0_micro0.pt")["status"], "cannot-judge");
}

#[test]
fn a_weight_at_a_cap_of_ten_through_float16_log_probs_is_unseen_weights() {
    // seed 8226: sequence TIS cap 10, its log-probs not dumped, float16 log-probs. Row 1
    // of rank 1 micro 0 sits at the cap, recomputed as 10 x (1 + the rounding): beyond
    // 10 to f32, the cell was failed beside four "cannot judge" cells of the same weights.
    let (code, r) = losscheck(&novel("seq-cap-10-float16-8226").join("weaver_pt"));
    assert_eq!(code, 0, "{r}");
    assert!(files_with(&r, "inconsistent").is_empty(), "{r}");
    assert_eq!(verdict(&r, "rank1_micro0.pt")["status"], "cannot-judge");
}

#[test]
fn totals_inside_a_16_bit_allowance_fail_where_the_old_log_probs_differ() {
    // seed 8321 (--multi-turn): the weaver's old log-probs are stale (used consistently),
    // bf16 on both sides. Rank 0 micro 1's totals are 19 % apart inside the 0.016 the
    // log-probs' rounding allows: the is_loss cell failed, the loss cell passed (a miss).
    let (code, r) = dumpdiff(&novel("multi-turn-stale-old-totals-8321"));
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(cell(&r, "loss", 0, 1)["verdict"], "fail");
    let x = comparison(&r, "loss", 0, 1, "loss.loss");
    assert!(
        x["reason"]
            .as_str()
            .unwrap()
            .ends_with("but the cell's old log-probs differ (is_loss.old_log_probs), so the difference is not their rounding"),
        "{x}"
    );
}

#[test]
fn a_summed_pg_term_beside_unseen_weights_is_inconsistent_where_the_other_cells_show_a_mean() {
    // seed 8534 (--multi-turn): token TIS on the weaver, its engine log-probs not dumped, so
    // every cell's per-token loss carries weights nothing states (cannot judge). Rank 0
    // micro 0's pg_loss is the plain sum of its own elementwise_loss, where the other
    // cells' pg terms are the token-mean of theirs; its one row with tokens made the sum
    // read as seq-mean-token-sum, and the fault was called unseen weights (a miss).
    let (code, r) =
        losscheck(&novel("multi-turn-summed-pg-beside-unseen-weights-8534").join("weaver_pt"));
    assert_eq!(code, 1, "{r}");
    assert_eq!(
        files_with(&r, "inconsistent"),
        ["is_loss_debug/step_000000_rank0_micro0.pt".to_string()].into()
    );
    assert_eq!(files_with(&r, "cannot-judge").len(), 8, "{r}");
    let notes = verdict(&r, "rank0_micro0.pt")["notes"].to_string();
    assert!(notes.contains("a sum, not a mean"), "{notes}");
}

#[test]
fn a_zero_advantage_cell_says_the_aggregation_cannot_be_judged_through_a_loss_scale() {
    // seed 8424: NexRL's seq-mean-token-mean beside verl's seq-mean-token-sum, the
    // weaver's totals scaled by rows / 12, a KL term the self-hosted side does not state.
    // Rank 2 micro 0 has every advantage 0: its totals agree unscaled, the unstated KL term
    // warns, and the words that its aggregation cannot be judged were dropped with the
    // scale's reason.
    let (code, r) = dumpdiff(&novel("zero-adv-agg-beside-scale-8424"));
    assert_eq!(code, Some(1), "{r}");
    for sec in ["loss", "is_loss"] {
        let c = cell(&r, sec, 2, 0);
        assert_eq!(c["verdict"], "warn", "{c}");
        let why = c["reason"].as_str().unwrap();
        assert!(
            why.starts_with(&format!("{sec}.loss: equal unscaled")),
            "{why}"
        );
        assert!(
            why.contains("cannot judge the aggregation (loss_agg_mode) on this cell: the weaver's own elementwise_loss is 0 on all 20 tokens"),
            "{why}"
        );
    }
}

#[test]
fn rows_without_ids_or_old_log_probs_are_placed_where_nexrl_deals_them() {
    // seed 8461: no input_ids, no old log-probs (do_old_log_prob_compute false),
    // trajectories in arrival order with task ids. The rows were guessed at contiguous
    // trajectory-file positions, contradicted by their lengths in micro 3 of both ranks:
    // unplaced, so rank 0 micro 3's wrong advantages were never compared (cause not named).
    let (code, r) = dumpdiff(&novel("dealt-rows-no-old-8461"));
    assert_eq!(code, Some(2), "the truncated is_loss_debug file: {r}");
    let x = comparison(&r, "is_loss", 0, 3, "is_loss.advantages");
    assert_eq!(x["verdict"], "fail", "{x}");
    for (rank, micro) in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (1, 3)] {
        let x = comparison(&r, "is_loss", rank, micro, "is_loss.advantages");
        assert_eq!(x["verdict"], "pass", "rank {rank} micro {micro}: {x}");
    }
    let notes = r["conventions"].to_string();
    assert!(
        notes.contains(
            "rows placed as NexRL deals them, NexRL's batch order over ranks then micros"
        ),
        "{notes}"
    );
}

#[test]
fn rows_of_the_last_mini_batch_are_dealt_from_the_tail_of_each_ranks_share() {
    // seed 8602: no input_ids, no old log-probs, two mini-batches per rank: NexRL names its
    // micro files by micro index alone, so each rank's files hold its last mini-batch (2 and
    // 4 of its 6 rows; 6 of 12 dumped). Dealing needed every trajectory in a file, so the
    // whole self-hosted tree was unreadable: exit 2, no report.
    let tree = novel("dealt-last-mini-batch-no-old-8602").join("self_hosted_pt");
    let (code, r) = losscheck(&tree);
    assert_eq!(code, 0, "{r}");
    let s = statuses(&r);
    assert_eq!(s.len(), 2, "{r}");
    assert!(s.iter().all(|x| x.2 == "consistent"), "{r}");
    let notes = verdict(&r, "rank1_micro0.pt")["notes"].to_string();
    assert!(
        notes.contains("the micro files of each rank holding the last mini-batch of its 6 rows (6 of 12 rows dumped"),
        "{notes}"
    );
}

#[test]
fn a_coefficient_fitted_to_one_cells_total_stays_underdetermined_after_the_policy_search() {
    // seed 8751 (--multi-turn): one self-hosted cell, NexRL's KL loss (coefficient 0.001,
    // not echoed) in its total. The policy search settled the conventions again from the
    // settled ones, so the entropy_coeff fitted to that one total (5.589e-5, not the
    // preset's) was marked as the preset's and the cell called consistent.
    let (code, r) =
        losscheck(&novel("multi-turn-lone-coef-after-policy-search-8751").join("self_hosted_pt"));
    assert_eq!(code, 0, "{r}");
    assert_eq!(statuses(&r), [(0, 0, "undetermined".to_string())], "{r}");
    let c = convention(&r, "entropy_coeff");
    assert_eq!(c["source"], "inferred", "{c}");
    assert_eq!(c["value"], "5.589e-5", "{c}");
}
