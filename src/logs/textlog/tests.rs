//! Line recognisers and the assembler on lines taken from real logs.

use super::*;

/// A line's fields, without the assembler's markers (`__record_tail`, …).
fn fields(item: &TextItem) -> Vec<(String, f64)> {
    match item {
        TextItem::Step { fields, .. } | TextItem::Micro { fields, .. } => fields
            .iter()
            .filter(|(k, _)| !k.starts_with("__"))
            .cloned()
            .collect(),
        _ => vec![],
    }
}

#[test]
fn nanogpt_line_with_parenthesised_parts() {
    let it = parse_text_line("iter 0: loss 0.1235 (main 0.1235, critic 0.0000), time 21747.97ms");
    assert!(matches!(
        it,
        TextItem::Step {
            source: SourceKind::NanoGpt,
            step: Some(0),
            ..
        }
    ));
    assert_eq!(
        fields(&it),
        vec![
            ("loss".to_string(), 0.1235),
            ("loss_main".to_string(), 0.1235),
            ("loss_critic".to_string(), 0.0),
            ("time_s".to_string(), 21747.97 / 1000.0),
        ]
    );
}

#[test]
fn mlx_report_line() {
    let it = parse_text_line("Iter 10: Train loss 0.000, Learning Rate 1.000e-05, It/sec 5.343, Tokens/sec 1736.078, Trained Tokens 3249, Peak mem 5.040 GB");
    assert!(matches!(
        it,
        TextItem::Step {
            source: SourceKind::MlxReport,
            step: Some(10),
            ..
        }
    ));
    let f = fields(&it);
    assert_eq!(f[0], ("train_loss".to_string(), 0.0));
    assert_eq!(f[1], ("learning_rate".to_string(), 1e-5));
    assert_eq!(f[2], ("it/sec".to_string(), 5.343));
    assert_eq!(f[5], ("peak_mem_gb".to_string(), 5.04));
    let val = parse_text_line("Iter 1: Val loss 0.002, Val took 21.048s");
    assert_eq!(
        fields(&val),
        vec![
            ("val_loss".to_string(), 0.002),
            ("val_took_s".to_string(), 21.048),
            (EVAL_MARK.to_string(), 1.0),
        ]
    );
}

#[test]
fn micro_and_warning_lines() {
    let it = parse_text_line(
        "[Micro 0] 3. Samples scored: mem=812 MB, time=0.412s, rewards=0.5000±0.1200",
    );
    assert_eq!(
        fields(&it),
        vec![
            ("micro_mem_gb".to_string(), 812.0 / 1024.0),
            ("micro_rewards_mean".to_string(), 0.5),
            ("micro_rewards_std".to_string(), 0.12),
        ]
    );
    assert_eq!(
        parse_text_line("WARNING: All advantages are near zero! rewards_grouped=[[0.0, 0.0]]"),
        TextItem::Warning("advantages_near_zero")
    );
}

#[test]
fn verl_console_and_trl_dict() {
    let it =
        parse_text_line("(TaskRunner pid=1) step:34 - actor/pg_loss:0.0424 - actor/grad_norm:nan");
    assert!(matches!(
        it,
        TextItem::Step {
            source: SourceKind::VerlConsole,
            step: Some(34),
            ..
        }
    ));
    let f = fields(&it);
    assert_eq!(f[0], ("actor/pg_loss".to_string(), 0.0424));
    assert!(f[1].1.is_nan());
    let d = parse_text_line("{'loss': 0.0, 'grad_norm': nan, 'reward': 0.5, 'completions/mean_length': 12.0, 'epoch': 0.01}");
    assert!(matches!(
        d,
        TextItem::Step {
            source: SourceKind::TrlDict,
            step: None,
            ..
        }
    ));
    assert_eq!(fields(&d).len(), 5);
}

#[test]
fn micro_lines_attach_to_next_iter() {
    let mut a = TextAssembler::new(0);
    let lines = [
        "[Micro 0] 3. Samples scored: mem=800 MB, time=0.4s, rewards=0.0000±0.0000",
        "[Micro 1] 3. Samples scored: mem=900 MB, time=0.4s, rewards=1.0000±0.0000",
        "WARNING: All advantages are near zero! rewards_grouped=[...]",
        "iter 1: loss 0.0000 (main 0.0000, critic 0.0000), time 103634.20ms",
    ];
    for (i, l) in lines.iter().enumerate() {
        a.push(i as u64 + 1, parse_text_line(l));
    }
    a.finish();
    assert_eq!(a.events.len(), 1);
    assert_eq!(a.events[0].step, Some(1));
    let micro = &a.records[0];
    assert_eq!(micro.step, Some(1));
    assert_eq!(
        micro.fields,
        vec![
            ("micro_mem_gb".to_string(), 900.0 / 1024.0),
            ("micro_rewards_mean".to_string(), 0.5),
            ("micro_rewards_std".to_string(), 0.0),
            // Each micro's clock reads 0.4 s at the end of its first logged stage: 0.8 s in
            // the iteration.
            ("stage_s/samples_scored".to_string(), 0.8),
        ]
    );
}

fn step_of(item: &TextItem) -> Option<i64> {
    match item {
        TextItem::Step { step, .. } => *step,
        _ => None,
    }
}

#[test]
fn megatron_pipe_line_units_and_step() {
    let it = parse_text_line(" iteration     5426/  250000 | consumed samples:        43408 | elapsed time per iteration (ms): 4247.9 | learning rate: 2.999E-04 | lm loss: 2.5E+00 | grad norm: nan |");
    assert_eq!(step_of(&it), Some(5426));
    let f = fields(&it);
    assert_eq!(f[0], ("consumed_samples".to_string(), 43408.0));
    assert_eq!(f[1], ("elapsed_time_per_iteration_s".to_string(), 4.2479));
    assert_eq!(f[2], ("learning_rate".to_string(), 2.999e-4));
    assert_eq!(f[3], ("lm_loss".to_string(), 2.5));
    assert_eq!(f[4].0, "grad_norm");
    assert!(f[4].1.is_nan());
    // A line cut before its first value is not a record.
    assert_eq!(
        parse_text_line(" iteration     5429/  250000 | consumed samples:"),
        TextItem::Other
    );
}

#[test]
fn msswift_dict_without_braces_reads_its_step() {
    let it = parse_text_line("'loss': -0.0, 'grad_norm': 0.0, 'reward_std': 0.44, 'global_step/max_steps': '5/3766', 'percentage': '0.13%', 'memory(GiB)': 56.74");
    assert_eq!(step_of(&it), Some(5));
    assert_eq!(
        fields(&it),
        vec![
            ("loss".to_string(), -0.0),
            ("grad_norm".to_string(), 0.0),
            ("reward_std".to_string(), 0.44),
            ("memory(GiB)".to_string(), 56.74),
        ]
    );
}

#[test]
fn notebook_table_rows_read_against_their_header_cut_row_drops_its_last_cell() {
    let mut a = TextAssembler::new(0);
    let lines = [
        "| Step | Training Loss | reward | rewards / match_format |",
        "|---|---|---|---|",
        "| 1 | 0.000000 | -17.25 | 0.0 |",
        "2 | 0.000100 | -10.5",
    ];
    for (i, l) in lines.iter().enumerate() {
        a.push(i as u64 + 1, parse_text_line(l));
    }
    a.finish();
    assert_eq!(a.unrecognised, 0);
    assert_eq!(a.records.len(), 2);
    assert_eq!(a.records[0].step, Some(1));
    assert_eq!(
        a.records[0].fields,
        vec![
            ("training_loss".to_string(), 0.0),
            ("reward".to_string(), -17.25),
            ("rewards/match_format".to_string(), 0.0),
        ]
    );
    // Row 2 has 3 of 4 cells: its last one (-10.5) may be cut, so it is dropped.
    assert_eq!(
        a.records[1].fields,
        vec![("training_loss".to_string(), 0.0001)]
    );
}

#[test]
fn verl_soft_wrap_joins_the_cut_key() {
    let mut a = TextAssembler::new(0);
    a.push(
        1,
        parse_text_line("(TaskRunner pid=7) step:34 - critic/rewards/max:1.0 - critic"),
    );
    a.push(
        2,
        parse_text_line("/rewards/min:-1.0 - response_length/min:38.0 -"),
    );
    a.finish();
    assert_eq!(a.unrecognised, 0);
    assert_eq!(
        a.records[0].fields,
        vec![
            ("critic/rewards/max".to_string(), 1.0),
            ("critic/rewards/min".to_string(), -1.0),
            ("response_length/min".to_string(), 38.0),
        ]
    );
}

#[test]
fn openrlhf_progress_bar_postfix_and_nanogpt_eval_line() {
    let it = parse_text_line("Train epoch [1/1]: 100%|##| 4/4 [00:30<00:00,  7.61s/it, pg=-0.0019, rm=0.53, glen=311, kl=0.000183]");
    assert_eq!(step_of(&it), None);
    assert_eq!(
        fields(&it),
        vec![
            ("policy_loss".to_string(), -0.0019),
            ("reward".to_string(), 0.53),
            ("response_length".to_string(), 311.0),
            ("kl".to_string(), 0.000183),
        ]
    );
    let ev = parse_text_line("> 2023-03-22 09:32:32 step 3000: train loss 4.0390, val loss 4.0427");
    assert_eq!(step_of(&ev), Some(3000));
    assert_eq!(
        fields(&ev),
        vec![
            ("eval/train_loss".to_string(), 4.039),
            ("val_loss".to_string(), 4.0427),
            (EVAL_MARK.to_string(), 1.0),
        ]
    );
    assert_eq!(parse_text_line("> "), TextItem::Blank);
    assert_eq!(
        parse_text_line("> saving checkpoint to out"),
        TextItem::Warning("checkpoint")
    );
}

#[test]
fn hf_closing_summary_line_is_not_a_loss() {
    let it = parse_text_line("{'train_runtime': 812.5, 'train_samples_per_second': 2.1, 'train_loss': 0.93, 'epoch': 3.0}");
    assert!(fields(&it).iter().all(|(k, _)| k.starts_with("summary/")));
}

#[test]
fn notebook_table_no_log_cells_are_missing_values() {
    let mut a = TextAssembler::new(0);
    for (i, l) in [
        "| Epoch | Training Loss | Validation Loss |",
        "| 1 | No log | 1.25 |",
        "| 2 | 0.9 | 1.1 |",
    ]
    .iter()
    .enumerate()
    {
        a.push(i as u64 + 1, parse_text_line(l));
    }
    a.finish();
    assert_eq!(a.unrecognised, 0);
    assert_eq!(a.records[0].step, Some(1));
    assert_eq!(
        a.records[0].fields,
        vec![
            ("epoch".to_string(), 1.0),
            ("validation_loss".to_string(), 1.25)
        ]
    );
    assert_eq!(a.records[1].fields.len(), 3);
}

#[test]
fn cut_dicts_are_salvaged_unless_their_step_was_cut_off() {
    // Unnumbered TRL dicts: the cut record keeps its whole pairs and is numbered on.
    let mut a = TextAssembler::new(0);
    for (i, l) in [
        "{'loss': 0.5, 'grad_norm': 1.5, 'epoch': 0.1}",
        "{'loss': 0.4, 'grad_norm': 1.25, 'lea",
    ]
    .iter()
    .enumerate()
    {
        a.push(i as u64 + 1, parse_text_line(l));
    }
    a.finish();
    assert_eq!(a.records.len(), 2);
    assert_eq!(a.records[1].step, Some(1));
    assert_eq!(
        a.records[1].fields,
        vec![
            ("loss".to_string(), 0.4),
            ("grad_norm".to_string(), 1.25),
            ("step_inferred".to_string(), 1.0)
        ]
    );
    // Numbered records (TRL PPO's `episode`): a cut record without its step is dropped, not
    // given a made-up one.
    let mut a = TextAssembler::new(0);
    for (i, l) in [
        "{'loss': 0.5, 'episode': 16}",
        "------------------------------",
        "{'loss': 0.4, 'episo",
    ]
    .iter()
    .enumerate()
    {
        a.push(i as u64 + 1, parse_text_line(l));
    }
    a.finish();
    assert_eq!(a.records.len(), 1);
    assert_eq!(a.unrecognised, 1);
}

#[test]
fn quoted_values_and_step_prefixes() {
    let it = parse_text_line("step 7: {'loss': '-4.967e-09', 'grad_norm': 'nan', 'kl': 'inf'}");
    let TextItem::Step { step, fields, .. } = it else {
        panic!("a step");
    };
    assert_eq!(step, Some(7));
    assert_eq!(fields[0], ("loss".to_string(), -4.967e-09));
    assert!(fields[1].1.is_nan());
    assert_eq!(fields[2].1, f64::INFINITY);
}
