//! The causes dumpdiff names on committed real-convention scenarios (issue 28, session 20):
//! each fault or convention difference a flagged cell shows is named in the words of the
//! code — an importance weight, the old log-probs, a temperature, the clip bound, the
//! aggregation — and only where the cell's own evidence supports it.

use crate::real_weights::{cell, comparison, diagnosis, dumpdiff, files_with, novel};
use crate::support::losscheck_json as losscheck;

#[test]
fn importance_weights_are_named_beside_a_term_no_file_states() {
    // seeds 7116 (token IcePop read as TIS cap 2 on this cell) and 7213 (TIS cap 2): the
    // self-hosted loss holds an unstated KL term, so the totals cannot say which side is
    // wrong; the weaver's weights move the pg term within the bf16/f16 log-probs' rounding.
    // The cell warned with only the KL term named; the weights its is_loss read off the
    // weaver's own rollout_log_probs are the other difference of the totals
    for (name, rank, micro) in [
        ("weight-beside-kl-7116", 1, 0),
        ("weight-beside-kl-7213", 0, 1),
    ] {
        let (code, r) = dumpdiff(&novel(name));
        assert_eq!(code, Some(1), "{name}");
        for sec in ["loss", "is_loss"] {
            let c = cell(&r, sec, rank, micro);
            assert_eq!(c["verdict"], "warn", "{name} {c}");
            let why = c["reason"].as_str().unwrap();
            assert!(why.contains("cannot judge which side is wrong: the self-hosted loss holds a term no file states"), "{why}");
            assert!(
                why.ends_with(
                    "; besides, the weaver weighs its per-token loss by an importance weight \
                     (TIS cap 2, against its own rollout_log_probs) the self-hosted side does \
                     not apply"
                ),
                "{name} {why}"
            );
        }
    }
}

#[test]
fn a_clip_bound_is_read_off_the_weavers_own_ratio_when_16_bit_log_probs_blur_it() {
    // seed 6023 r0 m1: the weaver clips at 1 + 0.2 where clip_ratio_high is 0.28; bf16
    // log-probs on both sides, so the self-hosted ratio re-derived from them tied the two
    // ranges and the cell was called a ratio-level question. On the weaver's own f32
    // prob_ratio (equal to the self-hosted's) 0.28 gives the self-hosted pg_loss to 2e-10
    let (code, r) = dumpdiff(&novel("clip-bound-6023"));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "is_loss", 0, 1, "is_loss.elementwise_loss");
    assert_eq!(c["verdict"], "fail", "{c}");
    assert!(
        c["reason"].as_str().unwrap().ends_with(
            "a clip bound differs: the self-hosted pg_loss follows its clip range and the \
             weaver's own per-token loss another, the upper clip bound (clip_ratio_high): \
             1+0.28 vs 1+0.2 (self-hosted vs weaver)"
        ),
        "{c}"
    );
    assert!(!cell(&r, "is_loss", 0, 1)
        .to_string()
        .contains("ratio_level"));
    // seed 7261 r2 m1: the one band token moves the per-token loss less than the bf16 /
    // f16 log-probs' rounding, so every comparison passed (a miss); the two readings on
    // the same f32 values tell the ranges apart
    // (a truncated weaver file elsewhere: exit 2, every other cell reported)
    let (code, r) = dumpdiff(&novel("clip-bound-blurred-7261"));
    assert_eq!(code, Some(2));
    let c = comparison(&r, "is_loss", 2, 1, "is_loss.clip_bound");
    assert_eq!(c["verdict"], "fail", "{c}");
    let why = c["reason"].as_str().unwrap();
    assert!(
        why.starts_with(
            "the clip bound differs: on the weaver's own prob_ratio and advantages (equal to \
             the self-hosted's), the self-hosted pg_loss follows clip 1−0.2/1+0.28 (to "
        ),
        "{why}"
    );
    assert!(
        why.contains("and misses the weaver's clip 1−0.2/1+0.2 by 9.2e-5"),
        "{why}"
    );
}

#[test]
fn a_summed_loss_beside_batch_normalised_weights_names_the_aggregation() {
    // seed 9203 r0 m3: GSPO, token TIS batch-normalised by 1.097, verl's rejection
    // sampling; the weaver's loss is the sum of its weighted elementwise_loss. The weights
    // explain every per-token value, so only "an importance weight" was said; the weaver's
    // own values say its total is another reduction of them
    let (_, r) = dumpdiff(&novel("sum-beside-batch-norm-9203"));
    let c = comparison(&r, "is_loss", 0, 3, "is_loss.loss");
    assert_eq!(c["verdict"], "fail", "{c}");
    let why = c["reason"].as_str().unwrap();
    assert!(why.contains("an importance weight"), "{why}");
    assert!(
        why.ends_with(
            "; and the aggregation differs: the weaver's loss 3.894 is the seq-mean-token-sum \
             of its own elementwise_loss, not their seq-mean-token-mean (0.6491), the mode \
             the self-hosted pg_loss follows on its own terms"
        ),
        "{why}"
    );
    let line = diagnosis(&r, 0, 3).unwrap();
    assert!(
        line.contains("; and the aggregation differs: the weaver's loss 3.894"),
        "{line}"
    );
    // no cell whose weaver total is its elementwise_loss in the compared mode says it
    for (rank, micro) in [(1, 0), (1, 1)] {
        assert!(!cell(&r, "is_loss", rank, micro)
            .to_string()
            .contains("aggregation"));
    }
}

#[test]
fn a_temperature_on_a_three_token_micro_is_named() {
    // seed 7474 r1 m1: one row of three tokens whose weaver log-probs come from logits not
    // divided by T = 0.7; a systematic difference asked four tokens, so "from log_probs"
    // was said with no temperature. Every log-prob and entropy differs and each
    // correlates at 0.999 / 0.994
    let (_, r) = dumpdiff(&novel("temperature-one-row-7474"));
    let line = diagnosis(&r, 1, 1).unwrap();
    assert!(
        line.contains(
            "from log_probs: the forward pass differs on 100 % of the tokens' log-probs and \
             100 % of their entropies, each still correlated with the other side's (pearson \
             0.999, 0.994): the shape of logits divided by a sampling temperature on one \
             side only"
        ),
        "{line}"
    );
}

#[test]
fn old_log_probs_shifted_by_one_token_are_named_from_the_weavers_own_values() {
    // the weaver's ratio computed with old_log_probs shifted right by one token: seed 9213
    // r0 m2 at the token level (rejection sampling reduced its mask, so "the mask" was the
    // only cause said), seed 7112 r0 m0 at GSPO's sequence level (an unstated KL term made
    // its totals cannot judge, so no line named the ratio)
    // (the first position of each row keeps its own old log-prob: 2 tokens in 9213)
    for (name, rank, micro, level, n, k0) in [
        ("shift-9213", 0, 2, "token", 20, 2),
        ("shift-gspo-7112", 0, 0, "sequence (GSPO)", 18, 0),
    ] {
        let (_, r) = dumpdiff(&novel(name));
        let c = comparison(&r, "is_loss", rank, micro, "is_loss.prob_ratio");
        assert_eq!(c["verdict"], "fail", "{name} {c}");
        let why = c["reason"].as_str().unwrap();
        let want = format!(
            "old_log_probs shifted: the weaver's own prob_ratio is exp(log_probs − \
             old_log_probs shifted right by one token) at the {level} level on {n} of {n} \
             valid tokens of its dumped values, exp(log_probs − old_log_probs) on {k0}"
        );
        assert!(why.ends_with(&want), "{name} {why}");
    }
    // no other cell of either step says it
    for (name, cells) in [
        ("shift-9213", [(0, 0), (0, 1)]),
        ("shift-gspo-7112", [(1, 0), (2, 2)]),
    ] {
        let (_, r) = dumpdiff(&novel(name));
        for (rank, micro) in cells {
            let c = cell(&r, "is_loss", rank, micro).to_string();
            assert!(!c.contains("old_log_probs shifted"), "{name} {c}");
        }
    }
}

#[test]
fn a_weaver_total_summing_its_unseen_weighted_loss_names_the_aggregation() {
    // seed 7414: the weaver reduces seq-mean-token-sum (verl) where the self-hosted side
    // echoes NexRL's seq-mean-token-sum and reduces a mean, the weaver's TIS weights not
    // dumped: "cannot judge" named the weights only. The weaver's own total is the sum
    // of its own dumped elementwise_loss, whatever weights that holds
    let (code, r) = dumpdiff(&novel("agg-nexrl-unseen-7414"));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "loss", 0, 1, "loss.pg_loss");
    assert_eq!(c["verdict"], "warn", "{c}");
    let why = c["reason"].as_str().unwrap();
    assert!(why.contains("a per-token weight it does not dump"), "{why}");
    assert!(
        why.contains(
            "; and the aggregation differs: the weaver's loss -0.3267 is the \
             seq-mean-token-sum of its own elementwise_loss, not their token-mean (-0.04082)"
        ),
        "{why}"
    );
    // cells whose advantages are all 0 give every reduction alike: nothing is said
    for (rank, micro) in [(0, 0), (0, 2)] {
        let c = cell(&r, "is_loss", rank, micro).to_string();
        assert!(!c.contains("aggregation differs"), "{c}");
    }
}

#[test]
fn the_aggregation_is_read_off_the_weavers_pg_loss_when_its_entropy_term_blurs_its_total() {
    // seed 7573: verl's seq-mean-token-sum on the weaver, NexRL's mean on the self-hosted
    // side, TIS weights the weaver does not dump, verl's rejection sampling (r1 m0) and an
    // old_log_probs shift (r2 m2). The weaver's is_loss_debug total holds its entropy
    // term, 0.003·1.6, more than 2e-3 of a total near 1: no reduction was taken and only
    // the weights (r1 m0: the mask) were said. Its loss file's pg_loss is the sum mode's
    let (code, r) = dumpdiff(&novel("agg-beside-unseen-mask-7573"));
    assert_eq!(code, Some(1));
    // (the shift is still what fails r2 m2)
    let c = comparison(&r, "is_loss", 2, 2, "is_loss.prob_ratio");
    assert_eq!(c["verdict"], "fail", "{c}");
    for (rank, micro, want) in [
        (
            1,
            0,
            "the weaver's pg_loss -0.9575 is the seq-mean-token-sum of its own \
                elementwise_loss, not their token-mean (-0.1368), the mode the self-hosted \
                loss is compared in",
        ),
        (
            2,
            2,
            "the weaver's pg_loss -0.6933 is the seq-mean-token-sum of its own \
                elementwise_loss, not their seq-mean-token-mean (0.2018), the mode the \
                self-hosted pg_loss follows on its own terms",
        ),
    ] {
        for (sec, name) in [("is_loss", "is_loss.loss"), ("loss", "loss.loss")] {
            let c = comparison(&r, sec, rank, micro, name);
            assert_eq!(c["verdict"], "warn", "{c}");
            let why = c["reason"].as_str().unwrap();
            assert!(why.contains("a per-token weight it does not dump"), "{why}");
            assert!(
                why.contains(&format!("; and the aggregation differs: {want}")),
                "{why}"
            );
        }
    }
    // seed 7420 r0 m2: a weaver total scaled by rows / 36 and summed, beside weights it
    // does not dump; its pg_loss is unscaled
    let (_, r) = dumpdiff(&novel("gspo-rs-unseen-7420"));
    let c = comparison(&r, "loss", 0, 2, "loss.loss");
    let why = c["reason"].as_str().unwrap();
    assert!(
        why.contains(
            "; and the aggregation differs: the weaver's pg_loss 16.73 is the sum (no mean) \
             of its own elementwise_loss, not their seq-mean-token-mean (2.184)"
        ),
        "{why}"
    );
    // a cell whose advantages are all 0 gives every reduction alike: nothing is said
    assert_eq!(cell(&r, "loss", 0, 0)["verdict"], "warn");
    assert!(!cell(&r, "loss", 0, 0)
        .to_string()
        .contains("aggregation differs"));
}

#[test]
fn the_aggregation_is_named_beside_a_differing_loss_mask_without_weights() {
    // seed 7669 r0 m0: verl's rejection sampling reduced the weaver's mask (its rollout
    // log-probs are not dumped: "the loss mask differs") and the weaver reduces
    // seq-mean-token-sum where the self-hosted side means; no importance weights, so only
    // the mask was said. Its own pg_loss is the sum mode of its own elementwise_loss
    let (code, r) = dumpdiff(&novel("agg-beside-mask-7669"));
    assert_eq!(code, Some(2), "a truncated file elsewhere");
    let want = "; and the aggregation differs: the weaver's pg_loss 0.06057 is the \
                seq-mean-token-sum of its own elementwise_loss, not their token-mean \
                (0.01275), the mode the self-hosted loss is compared in";
    let c = comparison(&r, "is_loss", 0, 0, "is_loss.effective_valid");
    assert_eq!(c["verdict"], "fail", "{c}");
    assert!(c["reason"].as_str().unwrap().ends_with(want), "{c}");
    let c = comparison(&r, "loss", 0, 0, "loss.pg_loss");
    assert_eq!(c["verdict"], "fail", "{c}");
    let why = c["reason"].as_str().unwrap();
    assert!(
        why.contains(&format!("the loss mask differs){want}")),
        "{why}"
    );
    // the entropy term is not the pg term's reduction: its reason names the mask only
    let c = comparison(&r, "loss", 0, 0, "loss.entropy_loss");
    assert!(
        !c["reason"].as_str().unwrap().contains("aggregation"),
        "{c}"
    );
}

#[test]
fn clip_fractions_at_two_ratio_levels_name_the_level_not_a_clip_bound() {
    // seed 7221 r1 m1: GSPO configured, the weaver clips its token ratio. Its pg_clipfrac
    // (0.08333) differs from the self-hosted one (0) over prob_ratio, advantages and mask
    // that agree token by token, which the clip-fraction rule read as a clip bound; the
    // clip ranges are the same, the ratios clipped are not
    let (code, r) = dumpdiff(&novel("clip-fraction-level-7221"));
    assert_eq!(code, Some(1));
    let c = cell(&r, "is_loss", 1, 1);
    assert_eq!(c["verdict"], "fail", "{c}");
    assert_eq!(
        comparison(&r, "is_loss", 1, 1, "is_loss.ratio_level")["verdict"],
        "fail"
    );
    assert!(!c.to_string().contains("clip_bound"), "{c}");
    let c = comparison(&r, "loss", 1, 1, "loss.metrics.actor/pg_clipfrac");
    assert_eq!(c["verdict"], "fail", "{c}");
    let why = c["reason"].as_str().unwrap();
    assert!(
        why.ends_with(
            " — the ratio level differs: the sides' clip fractions differ (0 vs 0.08333) \
             because they clip ratios at two levels (is_loss.ratio_level: a token ratio \
             against GSPO's sequence ratio), not the same ratios at two clip bounds"
        ),
        "{why}"
    );
}

#[test]
fn a_clip_bound_under_seen_weights_is_read_off_the_weavers_own_ratio() {
    // seed 7543 r0 m0: off-policy, the weaver clips at 1 + 0.2 where clip_ratio_high is
    // 0.28 and weighs its loss by TIS (cap 2) against its bf16 rollout log-probs. The one
    // band token (r 1.206) moves its per-token loss by 7.7e-3, inside the allowance its
    // bf16 log-probs give, and the clip fractions within their boundary allowance: every
    // comparison passed (a miss). On the weaver's own f32 prob_ratio (equal to the
    // self-hosted's to f32) the self-hosted pg_loss follows 0.28 and misses 0.2
    let (code, r) = dumpdiff(&novel("clip-bound-under-weights-7543"));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "is_loss", 0, 0, "is_loss.clip_bound");
    assert_eq!(c["verdict"], "fail", "{c}");
    let why = c["reason"].as_str().unwrap();
    assert!(
        why.starts_with(
            "the clip bound differs: on the weaver's own prob_ratio and advantages (equal to \
             the self-hosted's), the self-hosted pg_loss follows clip 1−0.2/1+0.28, dual clip \
             3 (to "
        ),
        "{why}"
    );
    assert!(
        why.contains("and misses the weaver's clip 1−0.2/1+0.2, dual clip 3 by 9.34e-4"),
        "{why}"
    );
    // the step's other cells, weighted alike with no band token, say nothing of it
    for (rank, micro) in [(0, 1), (1, 0), (2, 0)] {
        assert!(!cell(&r, "is_loss", rank, micro)
            .to_string()
            .contains("clip_bound"));
    }
}

#[test]
fn rows_without_ids_pair_through_the_batch_when_a_temperature_moves_every_log_prob() {
    // seed 7006 r0 m1: NexRL's self-hosted forward_data holds no input_ids, and the weaver's
    // log-probs come from logits not divided by T = 0.6, so no row's log-probs place it
    // among the weaver's: the rows were paired by index, and the mask, advantages and old
    // log-probs "differed" while the temperature went unnamed. The self-hosted rows are
    // placed in the batch by their log-probs against their own old_log_probs, the weaver's
    // by their ids (tokens[:-1], the datum layout) through the trajectories
    let (code, r) = dumpdiff(&novel("temperature-no-ids-7006"));
    assert_eq!(code, Some(1));
    for sec in ["forward_data", "is_loss"] {
        let rows = &cell(&r, sec, 0, 1)["rows"];
        assert_eq!(rows["method"], "batch", "{sec} {rows}");
        assert_eq!(
            rows["pairs"],
            serde_json::json!([[0, 2], [1, 0], [2, 1]]),
            "{sec}"
        );
    }
    let c = comparison(&r, "forward_data", 0, 1, "forward_data.entropy");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("logits divided by a sampling temperature on one side only"),
        "{c}"
    );
    // what the wrong pairing made differ agrees once the rows are the same trajectories
    for name in [
        "is_loss.effective_valid",
        "is_loss.advantages",
        "is_loss.old_log_probs",
    ] {
        assert_eq!(
            comparison(&r, "is_loss", 0, 1, name)["verdict"],
            "pass",
            "{name}"
        );
    }
    // rank 0 micro 0, whose log-probs pair its rows, keeps that pairing
    assert_eq!(cell(&r, "is_loss", 0, 0)["rows"]["method"], "log_probs");
}

#[test]
fn a_coefficient_behind_a_rows_scaled_total_with_no_pg_term_is_read_and_differs() {
    // seed 7631: every advantage 0, the weaver's entropy_coeff 0.01 against the
    // self-hosted 0.02 and its totals scaled by micro rows / 8 (micros of 4, 2, 2 rows):
    // its own fit scattered, so its loss was said to hold a term no file states and the
    // changed coefficient was missed. Its totals give entropy_coeff / n = 0.00125 on every
    // cell; 0.02 would need a mini-batch of 16 rows in a rank of 8
    let (code, r) = dumpdiff(&novel("coef-rows-scaled-7631"));
    assert_eq!(code, Some(1));
    let c = &r["coefficients"][0];
    assert_eq!(c["name"], "entropy_coeff", "{c}");
    assert_eq!(c["differ"], true, "{c}");
    assert!((c["weaver"].as_f64().unwrap() - 0.01).abs() < 1e-8, "{c}");
    let how = c["weaver_from"].as_str().unwrap();
    assert!(
        how.contains(
            "entropy_coeff/n = 0.00125 on 3 cells; the other side's 0.02 would need a \
             mini-batch of 16 rows, more than the rank's 8"
        ),
        "{how}"
    );
    // dumpdiff's cells no longer say the weaver's loss holds a term no file states (the
    // adjudication, losscheck's picture, still cannot judge its totals)
    let cells = r["sections"].to_string();
    assert!(!cells.contains("term no file states"), "{cells}");
}

#[test]
fn a_dual_clip_other_than_3_is_read_off_the_weavers_own_values() {
    // seed 7779 (no fault): verl's vanilla loss with clip_ratio_c 2 on both sides. One
    // rank 1 micro 0 token with a negative advantage and a ratio above 2 is capped at
    // −A·2; the candidates knew dual clip 3 or none, so the self-hosted per-token loss was
    // derived uncapped there and the cell failed (a false alarm; 7743 alike)
    let (_, r) = dumpdiff(&novel("dual-clip-2-7779"));
    let c = comparison(&r, "is_loss", 1, 0, "is_loss.elementwise_loss");
    assert_eq!(c["verdict"], "pass", "{c}");
    assert!(
        c["origin_a"]["from"]
            .as_str()
            .unwrap()
            .starts_with("max(−A·r, −A·clip(r, 1−0.2, 1+0.2)), A<0 capped at −A·2 "),
        "{c}"
    );
    assert_ne!(cell(&r, "is_loss", 1, 0)["verdict"], "fail");
}

#[test]
fn importance_weights_beside_a_dual_clip_of_10_are_read_per_row() {
    // seed 7642 r1 m0: verl's dual clip 10, sequence-level TIS batch-normalised by 1.288,
    // and an old_log_probs shift; the step's other cells have zero advantages. The two
    // dual-capped tokens fitted no scheme (the candidates knew dual clip 3), so the weights
    // went unread and only the shift was named. Each row's weight is the factor most of its
    // tokens share; the capped tokens then give clip_ratio_c 10
    let (code, r) = dumpdiff(&novel("dual-clip-weights-7642"));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "is_loss", 1, 0, "is_loss.elementwise_loss");
    let from = c["origin_a"]["from"].as_str().unwrap();
    assert!(from.contains("A<0 capped at −A·10 "), "{from}");
    assert!(
        from.contains("sequence-level TIS, no cap reached, batch-normalised (÷ 1.288"),
        "{from}"
    );
    let why = comparison(&r, "loss", 1, 0, "loss.loss")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        why.contains("an importance weight: the weaver applies"),
        "{why}"
    );
    // the shift is still named
    let c = comparison(&r, "is_loss", 1, 0, "is_loss.prob_ratio");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("old_log_probs shifted"),
        "{c}"
    );
}

#[test]
fn totals_inside_the_allowance_fail_where_the_ratio_levels_differ() {
    // seed 7430 r0 m0 (and 7208 r0 m1 of the generated sets): the weaver computes a token ratio where the step's
    // cells use GSPO's sequence ratio; its is_loss cell fails on is_loss.ratio_level, but
    // the loss totals moved by less than the 16-bit log-probs' propagated allowance and
    // passed (a miss). The allowance bounds the rounding of inputs computed alike; these
    // are not, so a total beyond its own tolerance fails
    let (_, r) = dumpdiff(&novel("is-batch-norm-near-one-7430"));
    assert_eq!(
        comparison(&r, "is_loss", 0, 0, "is_loss.ratio_level")["verdict"],
        "fail"
    );
    let c = cell(&r, "loss", 0, 0);
    assert_eq!(c["verdict"], "fail", "{c}");
    assert!(
        c.to_string().contains(
            "within the error propagated from the log-probs, but the sides' ratio levels \
             differ (is_loss.ratio_level), so the difference is not their rounding"
        ),
        "{c}"
    );
}

#[test]
fn a_summed_pg_term_inside_the_rounding_allowance_fails_on_the_weavers_own_values() {
    // seed 7865 r1 m0: the weaver's pg_loss is the sum of its elementwise_loss over 12
    // tokens (0.068 against a mean of 0.0057); bf16 / f16 log-probs give the totals an
    // allowance of 0.023, so is_loss.loss passed (a miss). The sum is read off the weaver's
    // own dumped values, which no rounding of the log-probs moves
    let (code, r) = dumpdiff(&novel("sum-inside-allowance-7865"));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "is_loss", 1, 0, "is_loss.loss");
    assert_eq!(c["verdict"], "fail", "{c}");
    assert!(
        c["reason"].as_str().unwrap().contains(
            "(the log-probs' rounding allows the totals' difference), but the aggregation \
             differs: the weaver's pg_loss 0.06798 is the sum (no mean) of its own \
             elementwise_loss"
        ),
        "{c}"
    );
    // a clean cell of the step says nothing of it
    assert!(!cell(&r, "is_loss", 0, 1)
        .to_string()
        .contains("aggregation differs"));
}

#[test]
fn a_summed_pg_term_stays_inconsistent_where_the_steps_cells_settled_a_mean() {
    // seed 7879 r0 m1 (one row): the weaver's pg_loss is the sum of its own
    // elementwise_loss where the step's other cells settle token-mean; its per-token loss
    // carries batch-normalised TIS weights. A picture of its own (no weights, clip 0.2/0.2)
    // called the weights unseen and the cell "cannot judge" (a miss, exit 0): the
    // reduction is the cell's own whatever its weights
    let dir = novel("sum-settled-mean-7879");
    let (code, r) = losscheck(&dir.join("weaver_pt"));
    assert_eq!(code, 1);
    let bad = files_with(&r, "inconsistent");
    assert_eq!(
        bad.into_iter().collect::<Vec<_>>(),
        ["is_loss_debug/step_000000_rank0_micro1.pt"]
    );
    let (code, _) = losscheck(&dir.join("self_hosted_pt"));
    assert_eq!(code, 0);
}

#[test]
fn tokens_between_two_clip_bounds_fail_a_loss_cell_inside_the_rounding_allowance() {
    // seed 7942 r1 m0 (multi-turn, bf16 log-probs on both sides): the weaver clips at
    // 1+0.2 where clip_ratio_high is 0.28; two of 21 tokens lie between the bounds and
    // move the pg term by 2.03e-3, inside the totals' allowance of 1.5e-2, so the loss cell
    // passed (a miss) while its is_loss cell named the bound
    let (code, r) = dumpdiff(&novel("multi-turn-clip-band-7942"));
    assert_eq!(code, Some(1));
    let c = comparison(&r, "loss", 1, 0, "loss.pg_loss");
    assert_eq!(c["verdict"], "fail", "{c}");
    assert!(
        c["reason"].as_str().unwrap().ends_with(
            "(the log-probs' rounding allows the difference), but a clip bound differs: 2 of \
             21 valid tokens lie between the two sides' clip bounds (clip_ratio_high / \
             clip_ratio_low; read on the weaver's own prob_ratio and advantages) and move \
             the pg term by 0.00203, the difference of the totals"
        ),
        "{c}"
    );
    // rank 0 micro 1's one band token of 13 moves it by 1.77e-3: named alike (the truth's
    // other clip fault there, not required of the loss cell)
    let c = comparison(&r, "loss", 0, 1, "loss.pg_loss");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("1 of 13 valid tokens lie between"),
        "{c}"
    );
}

#[test]
fn the_aggregation_of_a_cell_whose_terms_are_all_zero_is_said_cannot_judge() {
    // seed 7626 r0 m0: every advantage the weaver's loss mask keeps is 0, so NexRL's mean
    // and verl's seq-mean-token-sum (the sides' modes by construction) give the same pg
    // term 0; the cell fails on its mask (verl's rejection sampling). The aggregation left
    // no trace, and the cell now says it cannot be judged there
    let (_, r) = dumpdiff(&novel("zero-adv-agg-7626"));
    for sec in ["loss", "is_loss"] {
        let c = cell(&r, sec, 0, 0);
        assert_eq!(c["verdict"], "fail", "{c}");
        assert!(
            c["reason"].as_str().unwrap().contains(
                "; cannot judge the aggregation (loss_agg_mode) on this cell: the weaver's \
                 own elementwise_loss is 0 on all 16 tokens its loss mask keeps (zero \
                 advantages), and every reduction of its pg term gives 0"
            ),
            "{sec} {c}"
        );
    }
    // a cell with advantages does not say it
    assert!(!cell(&r, "is_loss", 0, 1)
        .to_string()
        .contains("cannot judge the aggregation"));
}

#[test]
fn a_ratio_level_tie_is_said_in_the_flagged_cells_it_concerns() {
    // seed 9038: GSPO configured, no self-hosted old log-probs (ratio 1, no level shown);
    // the weaver's prob_ratio is GSPO-shaped in rank 0 micro 0 and a token ratio in micro 1
    // (the truth's fault). One against one: which departs cannot be told, and the tie was
    // said only in the section's notes, so the flagged cells named no ratio level
    let (_, r) = dumpdiff(&novel("ratio-level-tie-9038"));
    for micro in [0, 1] {
        let c = cell(&r, "is_loss", 0, micro);
        assert_eq!(c["verdict"], "warn", "{c}");
        assert!(
            c["reason"].as_str().unwrap().contains(
                "(ratio level: cannot judge — weaver's prob_ratio is constant along each row \
                 (GSPO's sequence ratio) in rank 0 micro 0 and varies (a token ratio) in \
                 rank 0 micro 1"
            ),
            "{c}"
        );
    }
}

#[test]
fn a_weaver_aggregation_read_off_its_own_pg_term_survives_its_loss_scale() {
    // seed 7947 r0 m0 (multi-turn): verl's seq-mean-token-sum on the weaver beside NexRL's
    // mean, totals scaled by micro rows / 36, an unstated KL term on the self-hosted side.
    // The weaver's pg_loss is its own seq-mean-token-sum to 1e-8 and the mean 6.5e-5 away:
    // the reading asked 100 times a tolerance of 1e-5 of a term and said nothing, and the
    // unscaled totals then passed as equal (the cause unnamed)
    let (_, r) = dumpdiff(&novel("multi-turn-agg-scaled-7947"));
    for sec in ["loss", "is_loss"] {
        let c = comparison(&r, sec, 0, 0, &format!("{sec}.loss"));
        assert_eq!(c["verdict"], "warn", "{c}");
        let why = c["reason"].as_str().unwrap();
        assert!(
            why.contains(
                "; and the aggregation differs: the weaver's pg_loss -0.002207 is the \
                 seq-mean-token-sum of its own elementwise_loss"
            ),
            "{sec} {why}"
        );
        assert!(
            why.contains("they agree within the room the comparison allows"),
            "{why}"
        );
        assert!(why.contains("cannot judge which side is wrong"), "{why}");
    }
}
