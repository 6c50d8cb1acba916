//! Completions forensics (issue 31): the completions files TRL's GRPOTrainer wrote on CPU
//! with a tiny random Llama (fixtures/gen/make_completions.py: garbled, EOS forced first),
//! the W&B tables wandb wrote for them offline, verl and AReaL rollout dumps written the
//! way their trainers write them (fixtures/gen/make_completions_rollouts.py), and the
//! per-hypothesis verdicts (`--why`) on seed 003's story. Expected counts come from the
//! generators' settings (3 steps x 4 completions; 2 steps x 8 rows; 4 prompts x 2 samples).

use std::path::{Path, PathBuf};

use rlforensics::detect::hypotheses::Verdict;
use rlforensics::detect::Severity;
use rlforensics::logs::completions::{self, CompletionsFormat};
use rlforensics::logscan::{scan, ScanOptions, ScanReport};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/completions")
        .join(p)
}

fn run(p: &str) -> ScanReport {
    scan(&[fixture(p)], &ScanOptions::default()).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn one<'a>(r: &'a ScanReport, detector: &str) -> &'a rlforensics::detect::Finding {
    let f = r.by_detector(detector);
    assert_eq!(f.len(), 1, "{detector}: {:#?}", r.findings);
    f[0]
}

fn ev<'a>(f: &'a rlforensics::detect::Finding, k: &str) -> &'a serde_json::Value {
    f.evidence
        .get(k)
        .unwrap_or_else(|| panic!("{}: no evidence {k}: {:?}", f.detector, f.evidence))
}

#[test]
fn trl_parquet_rows_are_read_with_prompt_rewards_and_advantage() {
    let p = fixture("trl_blank/completions/completions_00002.parquet");
    let head = std::fs::read(&p).unwrap();
    assert_eq!(
        completions::sniff(&p, &head[..64]),
        Some(CompletionsFormat::TrlParquet)
    );
    let f = completions::read(&p, CompletionsFormat::TrlParquet).unwrap();
    assert_eq!(f.items.len(), 4);
    assert_eq!(f.reward_columns, vec!["reward_len", "reward_format"]);
    for c in &f.items {
        assert_eq!(c.step, Some(2));
        assert_eq!(c.text, "");
        // Both reward functions score "" as 0; all equal, so every advantage is 0.
        assert_eq!(c.reward, Some(0.0));
        assert_eq!(c.advantage, Some(0.0));
    }
    // Conversational prompts: the user message's content. The dataset repeats its four
    // questions in order; batch 2 (after shuffling) holds one of them, four times.
    let questions = [
        "What is 2+3?",
        "Name a colour.",
        "Spell cat.",
        "What is 7*6?",
    ];
    let p0 = f.items[0].prompt.clone().unwrap();
    assert!(questions.contains(&p0.as_str()), "{p0}");
    assert!(f.items.iter().all(|c| c.prompt.as_deref() == Some(&p0)));
}

#[test]
fn garbled_run_is_called_garbage_and_the_cap_is_not_the_cause() {
    let r = run("trl_garbled");
    let g = one(&r, "completions-garbled");
    // 3 parquet files x 4 + the W&B table's 4 rows.
    assert_eq!(ev(g, "completions"), 16);
    assert_eq!(ev(g, "garbled"), 16);
    assert_eq!(g.severity, Severity::Error);
    assert_eq!(g.steps, vec![1, 2, 3]);
    let ex = ev(g, "examples").as_array().unwrap();
    assert_eq!(ex.len(), 2);
    assert!(ex[0].as_str().unwrap().starts_with("step 1: \""), "{ex:?}");
    // TRL's metrics: clipped_ratio 1 on every step (max_completion_length 24).
    let u = one(&r, "completions-unterminated");
    assert_eq!(ev(u, "mean_truncation_ratio"), 1.0);
    assert_eq!(ev(u, "likely_cause"), "weights / tokenizer");
    let t = one(&r, "truncation");
    assert!(
        t.likely_causes[0].contains("completions-unterminated"),
        "{:?}",
        t.likely_causes
    );
    assert!(r.by_detector("completions-blank").is_empty());
}

#[test]
fn blank_run_is_eos_first_not_truncation() {
    let r = run("trl_blank");
    let b = one(&r, "completions-blank");
    assert_eq!(ev(b, "blank"), 16);
    assert_eq!(ev(b, "blank_share"), 1.0);
    assert_eq!(
        ev(b, "likely_cause"),
        "EOS first: chat template / EOS token"
    );
    assert!(b.likely_causes[0].starts_with("chat template"));
    // completions/max_length 1 on each of the 3 steps: EOS first.
    let e = one(&r, "empty-completions");
    assert_eq!(ev(e, "steps_eos_first"), 3);
    assert_eq!(e.steps, vec![1, 2, 3]);
    assert!(
        r.by_detector("truncation").is_empty(),
        "{:#?}",
        r.by_detector("truncation")
    );
    // Dead groups' first cause is the blank completions.
    assert!(one(&r, "dead-groups").likely_causes[0].contains("completions-blank"));
}

#[test]
fn wandb_table_alone_is_read_and_diagnosed() {
    let dir = fixture("trl_blank/wandb_table");
    let r = scan(&[dir], &ScanOptions::default()).unwrap();
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].records, 4);
    assert_eq!(ev(one(&r, "completions-blank"), "blank"), 4);
}

#[test]
fn verl_rollouts_leak_the_next_turn_and_loop() {
    let r = run("verl_leak");
    let l = one(&r, "completions-template-leak");
    // Per step: 4 leaking answers + 2 short leaking answers of 8 rows, 2 steps.
    assert_eq!(l.count, 2);
    assert_eq!(ev(l, "leak_share"), 12.0 / 16.0);
    assert_eq!(ev(l, "likely_cause"), "EOS token");
    let rep = one(&r, "completions-repetition");
    assert_eq!(ev(rep, "loop_share"), 4.0 / 16.0);
    assert_eq!(rep.severity, Severity::Warning);
}

/// verl 0.9.1's own `_log_rollout_data` → `_dump_generations` (fixtures/gen/
/// make_completions_verl091.py): the dump decodes with `skip_special_tokens=True`, so a
/// sampler that runs past `<|im_end|>` leaves only the next turn's role names.
#[test]
fn verl_091_dump_next_turn_without_template_tokens() {
    let r = run("verl091_leak");
    assert_eq!(r.files.len(), 2);
    assert_eq!(r.files[0].records, 4);
    let l = one(&r, "completions-template-leak");
    assert_eq!(ev(l, "leak_share"), 1.0);
    assert_eq!(ev(l, "markers"), &serde_json::json!(["a line \"user\""]));
    // The answer, then a new turn: the sampler did not stop, not a prompt templated twice.
    assert_eq!(ev(l, "likely_cause"), "EOS token");
    assert!(
        l.likely_causes[0].contains("skip_special_tokens"),
        "{:?}",
        l.likely_causes
    );
    let r = run("verl091_healthy");
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

/// AReaL 1.0.4's own `WorkflowExecutor._dump_trajectory` (fixtures/gen/
/// make_completions_areal104.py): `rollout/<tail_version>/<task_id>.jsonl`, found under the
/// log folder, each sample at its `tail_version` (the file is named after the task), the
/// trailing `<|im_end|>` AReaL keeps (it decodes special tokens) not a leak by itself.
#[test]
fn areal_104_rollout_jsonl_steps_and_next_turn() {
    let r = run("areal104_leak");
    assert_eq!(r.files.len(), 4);
    assert!(r.files.iter().all(|f| f.records == 2));
    let l = one(&r, "completions-template-leak");
    assert_eq!((l.first_step, l.last_step), (Some(1), Some(2)));
    assert_eq!(ev(l, "leak_share"), 1.0);
    assert_eq!(ev(l, "likely_cause"), "EOS token");
    let r = run("areal104_healthy");
    assert_eq!(r.files.len(), 4);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

/// AReaL's `rollout/` folder passed itself is one run whose version folders are steps: the
/// same report as its log folder's, not one run per version.
#[test]
fn areal_rollout_folder_itself_is_one_run() {
    use clap::Parser;
    use rlforensics::cli::logscan::{run as cli_run, LogscanArgs};
    let out = |p: &std::path::Path| {
        let args =
            LogscanArgs::try_parse_from(["logscan", p.to_str().unwrap(), "--format", "json"])
                .unwrap();
        cli_run(&args, false).unwrap()
    };
    let rollout = out(&fixture("areal104_leak").join("rollout"));
    let folder = out(&fixture("areal104_leak"));
    let v: serde_json::Value = serde_json::from_str(&rollout.stdout).unwrap();
    assert!(v.get("runs").is_none(), "{}", rollout.stdout);
    let w: serde_json::Value = serde_json::from_str(&folder.stdout).unwrap();
    assert_eq!(v["findings"], w["findings"]);
    let leak = &v["findings"][0];
    assert_eq!(leak["detector"], "completions-template-leak");
    assert_eq!(
        (leak["first_step"].as_i64(), leak["last_step"].as_i64()),
        (Some(1), Some(2))
    );
    assert_eq!(rollout.code, folder.code);
}

#[test]
fn healthy_rollouts_have_no_findings() {
    let r = run("verl_healthy");
    assert_eq!(r.files.len(), 2);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn areal_dump_one_answer_for_every_prompt() {
    let r = run("areal_identical");
    let i = one(&r, "completions-identical");
    assert_eq!(ev(i, "distinct_prompts"), 4);
    assert_eq!(ev(i, "share"), 1.0);
    assert_eq!(i.steps, vec![3]);
    // The trailing <|im_end|> is AReaL's decoded stop token, not a leak.
    assert!(r.by_detector("completions-template-leak").is_empty());
}

#[test]
fn unreadable_or_empty_completions_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("completions_1_x.table.json");
    std::fs::write(
        &t,
        r#"{"columns": ["step", "prompt", "completion"], "data": []}"#,
    )
    .unwrap();
    let e = scan(std::slice::from_ref(&t), &ScanOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("completions_1_x.table.json") && e.contains("0 completions"),
        "{e}"
    );
    let j = dir.path().join("5.jsonl");
    std::fs::write(
        &j,
        "{\"input\": \"q\", \"output\": \"a\", \"score\": 1.0, \"step\": 5}\n{\"input\": \"q\", \"outp\n",
    )
    .unwrap();
    let e = scan(std::slice::from_ref(&j), &ScanOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("5.jsonl") && e.contains("line 2"), "{e}");
}

#[test]
fn a_few_blank_completions_are_not_reported() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("1.jsonl");
    // 3 blanks of 16 (19 %, under the 25 % bar), answers all different.
    let mut s = String::new();
    for i in 0..16 {
        let out = if i < 3 {
            String::new()
        } else {
            format!("The answer is {i}.")
        };
        s.push_str(&format!(
            "{{\"input\": \"q{i}\", \"output\": \"{out}\", \"score\": 0.5, \"step\": 1}}\n"
        ));
    }
    std::fs::write(&j, s).unwrap();
    let r = scan(&[j], &ScanOptions::default()).unwrap();
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn seed_003_verdict_per_hypothesis() {
    let opts = ScanOptions {
        why: true,
        ..ScanOptions::default()
    };
    let r = scan(&[fixture("no_improvement")], &opts).unwrap();
    let t = r.hypotheses.as_ref().unwrap();
    assert!(t.plateau);
    let v: Vec<(&str, Verdict)> = t.rows.iter().map(|h| (h.id, h.verdict)).collect();
    assert_eq!(
        v,
        vec![
            ("H01", Verdict::NotSupported),
            ("H02", Verdict::CannotTell),
            ("H03", Verdict::NotSupported),
            ("H04", Verdict::CannotTell),
            ("H05", Verdict::Supported),
            ("H06", Verdict::Supported),
        ]
    );
    // Evidence names what fired and the steps; cannot-tell rows say what to run.
    assert!(t.rows[4].evidence.contains("reward-constant (steps 1–60)"));
    assert!(t.rows[5]
        .evidence
        .contains("kl exactly 0 on all 59 logged steps after the first (steps 2–60)"));
    assert!(t.rows[1].to_decide.is_some() && t.rows[3].to_decide.is_some());
    assert!(t.rows[5]
        .to_decide
        .as_deref()
        .unwrap()
        .contains("logscan --compare lora full"));
    // Without --why there is no table, in the report or its JSON.
    let plain = scan(&[fixture("no_improvement")], &ScanOptions::default()).unwrap();
    assert!(plain.hypotheses.is_none());
    assert!(!serde_json::to_string(&plain)
        .unwrap()
        .contains("hypotheses"));
}

/// The command line: a folder of completions only is judged (exit 1 on an error finding,
/// 0 on healthy text), never refused as "no metric"; `--why` prints the table.
#[test]
fn command_line_judges_completions_only_inputs() {
    use assert_cmd::Command;
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg(fixture("verl_leak"))
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completions_read"], 16);
    let names: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["detector"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["completions-template-leak", "completions-repetition"]
    );
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg(fixture("verl_healthy"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg(fixture("no_improvement"))
        .args(["--why", "--format", "markdown"])
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.contains("## Why: a verdict per hypothesis"), "{md}");
    assert!(md.contains("| H06 | LoRA / weight sync"), "{md}");
}

/// The completions detectors run with every detector or with the families they extend
/// (`--empty-completions`, `--truncation`), not with an unrelated flag.
#[test]
fn detector_flags_select_the_completions_detectors() {
    let only = |d: &str| ScanOptions {
        detectors: vec![d.to_string()],
        ..ScanOptions::default()
    };
    let r = scan(&[fixture("verl_leak")], &only("nan-grad")).unwrap();
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.completions_read, 16);
    let r = scan(&[fixture("verl_leak")], &only("truncation")).unwrap();
    assert_eq!(r.findings.len(), 2);
}

/// verl's validation generations in TensorBoard, written by verl 0.9.1's own
/// `ValidationGenerationsLogger` and `Tracking` (fixtures/gen/make_completions_tensorboard.py):
/// 3 steps × 4 samples of `### Sample i` markdown in one text summary per step.
#[test]
fn verl_generations_logged_to_tensorboard_are_read_and_judged() {
    let texts = fixture("verl_tb_leak/events.out.tfevents.1.fixture");
    let f = completions::read(&texts, CompletionsFormat::TensorboardText).unwrap();
    assert_eq!(f.items.len(), 12);
    let steps: Vec<i64> = f.items.iter().filter_map(|c| c.step).collect();
    assert_eq!(steps, [10, 10, 10, 10, 20, 20, 20, 20, 30, 30, 30, 30]);
    let c = &f.items[1];
    assert_eq!(
        c.prompt.as_deref(),
        Some("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n")
    );
    assert_eq!(
        c.text,
        "The answer is 56.<|im_end|>\n<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\nThe answer is 56."
    );
    assert_eq!(c.reward, Some(0.0));
    let healthy = completions::read(
        &fixture("verl_tb_healthy/events.out.tfevents.1.fixture"),
        CompletionsFormat::TensorboardText,
    )
    .unwrap();
    assert_eq!(healthy.items[3].text, "9 gives 81. The answer is 81.");
    assert_eq!(healthy.items[3].reward, Some(1.0));
    // the scalars file has no text: nothing read from it as completions
    let scalars = fixture("verl_tb_leak/events.out.tfevents.0.fixture");
    assert!(
        completions::read(&scalars, CompletionsFormat::TensorboardText)
            .unwrap()
            .items
            .is_empty()
    );

    // the run folder: metrics and generations together
    let r = run("verl_tb_leak");
    let leak = one(&r, "completions-template-leak");
    assert_eq!(ev(leak, "leak_share"), 1.0);
    assert_eq!(leak.steps, vec![10, 20, 30]);
    let r = run("verl_tb_healthy");
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert!(r
        .files
        .iter()
        .any(|f| f.format.starts_with("tensorboard text") && f.records == 12));
}

/// Findings at warning or above.
fn alarms(r: &ScanReport) -> Vec<&str> {
    r.findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| f.detector.as_str())
        .collect()
}

/// TRL 1.16's GRPOTrainer with `<|endoftext|>` as its only stop id while the ChatML
/// template ends turns with `<|im_end|>` (a plain added token, so TRL's
/// `skip_special_tokens=True` keeps it): fixtures/gen/make_completions_chatml.py. Of the
/// 12 completions 11 hold `<|im_end|>` with the next user turn after it (the twelfth is
/// cut before any end token); TRL's `completions/clipped_ratio` is 1, 0.75, 1.
#[test]
fn trl_wrong_eos_is_named_an_eos_token_mismatch() {
    let r = run("trl_wrong_eos");
    let e = one(&r, "completions-eos-mismatch");
    assert_eq!(e.severity, Severity::Error);
    assert!(
        e.explanation.starts_with(
            "generation does not stop on the chat template's end token: EOS token mismatch (generation_config.eos_token_id): <|im_end|> appears inside 11 of 12 completions (92%)"
        ),
        "{}",
        e.explanation
    );
    assert_eq!(ev(e, "end_token"), "<|im_end|>");
    assert_eq!(ev(e, "runs_past_end"), 11);
    assert_eq!(ev(e, "mean_truncation_ratio"), 2.75 / 3.0);
    assert_eq!(ev(e, "likely_cause"), "EOS token mismatch");
    assert_eq!(e.steps, vec![1, 2, 3]);
    let ex: Vec<&str> = ev(e, "examples")
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(
        ex,
        vec![
            "step 1: \"It is 5.<|im_end|>\\n<|im_start|>user\\nName a It is 2+3\"",
            "step 1: \"5<|im_end|>\\n<|im_start|>user\\nName a colour.<|im_end|>\\n<|im_s…\"",
        ]
    );
    assert!(e.likely_causes[0].starts_with("EOS token mismatch"));
    // The cap is explained by the end token, not by max_completion_length; the next turn
    // in the text is this finding, not a second "template leak".
    let u = one(&r, "completions-unterminated");
    assert_eq!(ev(u, "likely_cause"), "EOS token mismatch");
    assert!(one(&r, "truncation").likely_causes[0].contains("EOS token mismatch"));
    assert!(r.by_detector("completions-template-leak").is_empty());
    assert!(r.by_detector("completions-garbled").is_empty());
}

/// The same model and trainer, each prompt a message whose content is already
/// `apply_chat_template(..., add_generation_prompt=True)` text, which TRL templates again.
#[test]
fn trl_prompts_templated_twice_are_named() {
    let r = run("trl_templated_twice");
    let t = one(&r, "completions-prompt-templated-twice");
    assert_eq!(t.severity, Severity::Error);
    assert!(
        t.explanation.starts_with(
            "prompt templated twice (apply_chat_template on an already templated prompt): 12 of 12 prompts (100%)"
        ),
        "{}",
        t.explanation
    );
    assert_eq!(
        ev(t, "what"),
        "a chat message's content already holds <|im_start|>, and the trainer applies the template to the messages again"
    );
    assert_eq!(
        ev(t, "example_prompt"),
        "\"<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|…\""
    );
    assert_eq!(
        ev(t, "examples").as_array().unwrap()[0],
        "step 1: \"It is 55.\""
    );
    assert_eq!(ev(t, "likely_cause"), "prompt templated twice");
    // The model answers "It is 5." to three different questions: that symptom's first
    // cause is the prompt.
    let i = one(&r, "completions-identical");
    assert!(i.likely_causes[0].starts_with("the prompt is templated twice"));
    assert!(r.by_detector("completions-eos-mismatch").is_empty());
}

/// No false alarm: the healthy ChatML run (end of turn = EOS), and the garbled and blank
/// runs keep their own causes.
#[test]
fn healthy_trl_run_and_earlier_runs_raise_no_template_finding() {
    let r = run("trl_chatml_healthy");
    assert!(alarms(&r).is_empty(), "{:#?}", r.findings);
    for p in [
        "trl_garbled",
        "trl_blank",
        "verl_leak",
        "verl_tb_leak",
        "areal_identical",
    ] {
        let r = run(p);
        assert!(
            r.by_detector("completions-eos-mismatch").is_empty()
                && r.by_detector("completions-prompt-templated-twice")
                    .is_empty(),
            "{p}: {:#?}",
            r.findings
        );
    }
    assert_eq!(
        ev(
            one(&run("trl_garbled"), "completions-unterminated"),
            "likely_cause"
        ),
        "weights / tokenizer"
    );
}

/// Exit codes: 1 on the two error findings, 0 on the healthy run.
#[test]
fn command_line_exit_codes_for_the_chatml_runs() {
    use assert_cmd::Command;
    for (p, code, detector) in [
        ("trl_wrong_eos", 1, Some("completions-eos-mismatch")),
        (
            "trl_templated_twice",
            1,
            Some("completions-prompt-templated-twice"),
        ),
        ("trl_chatml_healthy", 0, None),
    ] {
        let out = Command::cargo_bin("logscan")
            .unwrap()
            .arg(fixture(p))
            .args(["--format", "json"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{p}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["completions_read"], 12, "{p}");
        let names: Vec<&str> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["detector"].as_str().unwrap())
            .collect();
        if let Some(d) = detector {
            assert!(names.contains(&d), "{p}: {names:?}");
        }
    }
}
