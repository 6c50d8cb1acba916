//! logscan across stacks (issue 31): consoles of DeepSpeed-Chat, minimind, slime, verl's
//! critic, today's transformers, TRL's DPO/KTO (fixtures/logs/stacks, from real pastes and
//! transformers' own writer: fixtures/README.md), the metric families by meaning, absolute
//! bounds and first-update checks, stage timings, several runs, and never a silent
//! "no findings" on records logscan does not understand.

use std::path::{Path, PathBuf};

use clap::Parser;
use rlforensics::cli::logscan::{run as cli_run, LogscanArgs};
use rlforensics::detect::preference::{algorithm, Algorithm};
use rlforensics::detect::Severity;
use rlforensics::logscan::{scan, ScanOptions, ScanReport};

fn stack(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/logs/stacks")
        .join(name)
}

fn run(paths: &[PathBuf]) -> ScanReport {
    scan(paths, &ScanOptions::default()).unwrap()
}

/// A temporary log file holding `lines`.
fn temp_log(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

fn values(r: &ScanReport, metric: &str) -> Vec<(i64, f64)> {
    r.frame.series(metric)
}

#[test]
fn deepspeed_chat_steps_rewards_and_inf_losses() {
    let r = run(&[stack("deepspeed_chat_444.log")]);
    assert_eq!(r.frame.steps().to_vec(), vec![3183, 3184, 3185]);
    assert_eq!(
        values(&r, "reward_mean"),
        vec![(3183, -7.80859375), (3184, -6.359375), (3185, -4.54296875)]
    );
    // The timing line before each step line is that step's.
    assert_eq!(
        values(&r, "step_time"),
        vec![(3183, 2.12), (3184, 2.14), (3185, 2.16)]
    );
    assert_eq!(values(&r, "loss")[0], (3183, 30.921875));
    let nan = r.by_detector("nan-grad");
    assert_eq!(nan.len(), 1);
    assert_eq!(nan[0].steps, vec![3184, 3185]);
    assert_eq!(
        nan[0].evidence["non_finite_by_metric"],
        serde_json::json!({"loss": 2, "critic_loss": 2})
    );
    assert_eq!(r.files[0].format, "text (kv_text)");
    assert_eq!(r.files[0].unrecognised_lines, 0);
}

#[test]
fn minimind_lines_keep_their_step_and_an_oom_at_the_end_is_seen() {
    let r = run(&[stack("minimind_26_pretrain.log")]);
    assert_eq!(
        values(&r, "loss"),
        vec![
            (0, 8.863),
            (100, 5.251),
            (200, 4.716),
            (300, 4.324),
            (400, 4.061),
            (500, 3.599)
        ]
    );
    // minimind's GRPO writer (trainer/train_grpo.py @ 42a4e8c): epoch 2 of 2, step k of N
    // is step N + k; the run ends on an out-of-memory error with no traceback header.
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (1..=3)
        .map(|k| {
            format!(
                "Epoch:[2/2]({k}/50), Actor Loss: 0.{k}000, Aux Loss: 0.0000, Reward: {}, Avg Response Len: 12{k}.00, Learning Rate: 0.00000008",
                if k == 2 { "'nan'".to_string() } else { format!("0.{k}") }
            )
        })
        .collect();
    lines.push("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB".into());
    let p = temp_log(dir.path(), "grpo.log", &lines);
    let r = run(&[p]);
    assert_eq!(r.frame.steps().to_vec(), vec![51, 52, 53]);
    assert_eq!(values(&r, "completion_len_mean")[2], (53, 123.0));
    assert!(values(&r, "reward_mean")[1].1.is_nan());
    let crash = r.by_detector("crash");
    assert_eq!(crash.len(), 1, "{:?}", r.findings);
    assert!(crash[0].explanation.contains("OutOfMemoryError"));
    assert_eq!(r.by_detector("nan-grad")[0].steps, vec![52]);
}

#[test]
fn verl_critic_nans_are_reported() {
    let r = run(&[stack("verl_498_vf_loss_nan.log")]);
    let nan = r.by_detector("nan-grad");
    assert_eq!(nan.len(), 1);
    assert_eq!(
        nan[0].evidence["non_finite_by_metric"],
        serde_json::json!({"critic_loss": 1, "critic_grad_norm": 1})
    );
    // Step 1 is the run's first update: ppo_kl and clip fraction 0.000 there, no finding.
    assert!(r.by_detector("first-update").is_empty());
}

#[test]
fn slime_rollout_metrics_and_perf_prefix_step() {
    let r = run(&[stack("slime_1837_rollout.log")]);
    assert_eq!(r.frame.steps().to_vec(), vec![0]);
    assert_eq!(values(&r, "truncation_ratio"), vec![(0, 0.46484375)]);
    assert_eq!(values(&r, "completion_len_mean"), vec![(0, 2773.71484375)]);
    assert_eq!(values(&r, "completion_len_max"), vec![(0, 4096.0)]);
    let t = r.by_detector("truncation");
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].severity, Severity::Warning);
    // slime's train-side metric is read under train/ as the logprob gap.
    let dir = tempfile::tempdir().unwrap();
    let p = temp_log(
        dir.path(),
        "train.log",
        &["step 3: {'train/loss': 0.1, 'train/train_rollout_logprob_abs_diff': 0.31}".into()],
    );
    let r = run(&[p]);
    assert_eq!(values(&r, "logp_abs_diff_mean"), vec![(3, 0.31)]);
    assert_eq!(r.by_detector("logprob-mismatch").len(), 1);
}

#[test]
fn transformers_quoted_values_are_read_and_judged_right() {
    let r = run(&[stack("transformers524_progress.log")]);
    assert_eq!(r.steps, 8);
    assert_eq!(values(&r, "loss")[0], (0, -4.967e-09));
    assert!(values(&r, "grad_norm")[6].1.is_nan());
    // Zero-loss spans never include step 2, whose gradient flows (1.2).
    let spans: Vec<Vec<i64>> = r
        .by_detector("zero-loss")
        .iter()
        .map(|f| f.steps.clone())
        .collect();
    assert_eq!(spans, vec![vec![0, 1], vec![3, 4, 5]]);
    // A gradient after zeros is not a 1e300x spike.
    assert!(r.by_detector("grad-spike").is_empty());
    // Every completion one token long and clipped_ratio 0: not truncation.
    assert!(r.by_detector("truncation").is_empty());
    let rc = r.by_detector("reward-constant");
    assert_eq!(rc.len(), 1);
    assert!(
        rc[0].explanation.contains("always matches"),
        "{}",
        rc[0].explanation
    );
    assert!(!rc[0]
        .likely_causes
        .iter()
        .any(|c| c.contains("never matches")));
    assert_eq!(r.by_detector("nan-grad")[0].steps, vec![6]);
}

#[test]
fn dpo_family_recognised_and_grpo_rules_kept_off() {
    let r = run(&[stack("trl_dpo_570.log")]);
    assert_eq!(algorithm(&r.frame), Algorithm::Dpo);
    assert!(
        !r.metrics.iter().any(|m| m.starts_with("reward/")),
        "{:?}",
        r.metrics
    );
    // The cut last record is salvaged: its whole pairs kept, the cut one dropped.
    assert_eq!(r.frame.steps().to_vec(), vec![0, 1, 2, 3]);
    // Step 1 is the eval record (its keys are eval_…).
    assert_eq!(
        values(&r, "pref_reward_chosen").last(),
        Some(&(3, -0.923618495464325))
    );
    assert_eq!(values(&r, "pref_accuracy").len(), 2);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);

    let r = run(&[stack("trl_kto_1447.log")]);
    assert_eq!(algorithm(&r.frame), Algorithm::Kto);
    // KTO's batch kl reaches 1.23: GRPO's per-token bound (1.0) would call it an explosion.
    assert!(values(&r, "kl").iter().any(|(_, v)| *v > 1.0));
    assert!(r.by_detector("kl-explosion").is_empty());
    assert!(r.by_detector("kl-zero").is_empty());
    assert_eq!(r.by_detector("nan-grad")[0].steps.first(), Some(&1));
}

/// A TRL DPO stdout dict line.
fn dpo_line(loss: f64, grad: f64, acc: f64, margin: f64, lc: f64, lr: f64) -> String {
    format!(
        "{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 5e-07, 'rewards/chosen': 0.5, 'rewards/rejected': {}, 'rewards/accuracies': {acc}, 'rewards/margins': {margin}, 'logps/chosen': {lc}, 'logps/rejected': {lr}, 'epoch': 0.1}}",
        0.5 - margin
    )
}

#[test]
fn dpo_failure_signatures() {
    let dir = tempfile::tempdir().unwrap();
    // Accuracies 1.0 everywhere, margins 2 -> 9, loss to 0.01, both log-probs falling
    // (chosen -100 -> -135, rejected -120 -> -190).
    let lines: Vec<String> = (0..8)
        .map(|i| {
            let i = i as f64;
            dpo_line(
                0.3 - 0.04 * i,
                1.0,
                1.0,
                2.0 + i,
                -100.0 - 5.0 * i,
                -120.0 - 10.0 * i,
            )
        })
        .collect();
    let r = run(&[temp_log(dir.path(), "dpo.log", &lines)]);
    let pref = r.by_detector("preference");
    assert_eq!(pref.len(), 3, "{pref:#?}");
    let with = |key: &str| {
        let f: Vec<_> = pref
            .iter()
            .filter(|f| f.evidence.contains_key(key))
            .collect();
        assert_eq!(f.len(), 1, "{key}: {pref:#?}");
        f[0]
    };
    let acc = with("accuracy");
    assert!(
        acc.explanation
            .starts_with("DPO: rewards/accuracies is 1 on 8 of 8"),
        "{}",
        acc.explanation
    );
    // Last quarter: steps 6, 7: margins 8, 9 (mean 8.5), loss 0.06, 0.02 (mean 0.04).
    let sat = with("last_quarter_margin");
    assert_eq!(sat.steps, vec![6, 7]);
    assert_eq!(sat.evidence["last_quarter_margin"], serde_json::json!(8.5));
    // First vs last quarter: chosen -102.5 -> -132.5 (30), rejected -125 -> -185 (60).
    let fall = with("chosen_drop");
    assert_eq!(fall.evidence["chosen_drop"], serde_json::json!(30.0));
    assert_eq!(fall.evidence["rejected_drop"], serde_json::json!(60.0));
    assert!(r.by_detector("kl-explosion").is_empty());

    // Accuracies stuck at 0.5 with zero margins, and one step of zero gradient.
    let lines: Vec<String> = (0..6)
        .map(|i| {
            dpo_line(
                std::f64::consts::LN_2,
                if i == 3 { 0.0 } else { 0.8 },
                0.5,
                0.0,
                -90.0,
                -90.0,
            )
        })
        .collect();
    let r = run(&[temp_log(dir.path(), "dpo_flat.log", &lines)]);
    let pref = r.by_detector("preference");
    assert_eq!(pref.len(), 1);
    assert_eq!(pref[0].severity, Severity::Error);
    assert_eq!(pref[0].steps, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(r.by_detector("zero-grad")[0].steps, vec![3]);
}

/// A verl console line for `step` with `extra` pairs.
fn verl_line(step: i64, extra: &str) -> String {
    format!("step:{step} - actor/pg_loss:0.01 - critic/score/mean:0.5 - {extra}")
}

#[test]
fn absolute_bounds_and_first_update() {
    let dir = tempfile::tempdir().unwrap();
    // A grad norm of 3e9 from the first step: no relative rule can see it.
    let lines: Vec<String> = (1..=6)
        .map(|s| {
            verl_line(
                s,
                &format!("actor/grad_norm:{} - actor/entropy:0.5", 3e9 + s as f64),
            )
        })
        .collect();
    let r = run(&[temp_log(dir.path(), "big.log", &lines)]);
    assert!(r.by_detector("grad-spike").is_empty());
    let b = r.by_detector("bounds");
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].severity, Severity::Error);
    assert_eq!(b[0].steps, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(b[0].evidence["from_first_step"], serde_json::json!(true));
    // Entropy above ln(262144) nats per token.
    let lines: Vec<String> = (1..=3)
        .map(|s| verl_line(s, "actor/grad_norm:0.5 - actor/entropy:15.2"))
        .collect();
    let r = run(&[temp_log(dir.path(), "ent.log", &lines)]);
    assert_eq!(r.by_detector("bounds")[0].evidence["metric"], "entropy");
    // First update: ppo_kl 0.05 and clip fraction 0.3 at step 1 fire; 0 there does not;
    // the same values at step 40 (not the run's start) do not.
    let first = |s0: i64, kl: f64, clip: f64| {
        let lines: Vec<String> = (s0..s0 + 3)
            .map(|s| {
                verl_line(
                    s,
                    &format!("actor/grad_norm:0.5 - actor/ppo_kl:{kl} - actor/pg_clipfrac:{clip}"),
                )
            })
            .collect();
        run(&[temp_log(dir.path(), &format!("f{s0}_{kl}.log"), &lines)])
    };
    let r = first(1, 0.05, 0.3);
    let fu = r.by_detector("first-update");
    assert_eq!(fu.len(), 1);
    assert_eq!(fu[0].steps, vec![1]);
    assert_eq!(fu[0].evidence["ppo_kl"], serde_json::json!(0.05));
    assert_eq!(fu[0].evidence["clip_ratio"], serde_json::json!(0.3));
    assert!(first(1, 0.0, 0.0).by_detector("first-update").is_empty());
    assert!(first(40, 0.05, 0.3).by_detector("first-update").is_empty());
}

#[test]
fn kl_exactly_zero_for_many_steps_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (1..=12)
        .map(|s| verl_line(s, "actor/grad_norm:0.5 - actor/kl_loss:0.0"))
        .collect();
    let r = run(&[temp_log(dir.path(), "kl0.log", &lines)]);
    let k = r.by_detector("kl-zero");
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].steps, (1..=12).collect::<Vec<_>>());
    // Nine steps are not enough (threshold 10).
    let r = run(&[temp_log(dir.path(), "kl9.log", &lines[..9])]);
    assert!(r.by_detector("kl-zero").is_empty());
}

/// `[Micro k] n. <stage>: mem=… MB, time=…s` lines of one iteration (two micro-batches), the
/// generation stage taking `gen` seconds, scoring 0.25 s, the loss 0.5 s (binary-exact).
fn micro_iteration(gen: f64) -> Vec<String> {
    let mut out = Vec::new();
    for m in 0..2 {
        out.push(format!(
            "[Micro {m}] 1. Iteration start: mem=812 MB, time=0.000s"
        ));
        out.push(format!(
            "[Micro {m}] 2. Samples generated: mem=900 MB, time={gen:.3}s"
        ));
        out.push(format!(
            "[Micro {m}] 3. Samples scored: mem=910 MB, time={:.3}s, rewards=0.5000±0.1000",
            gen + 0.25
        ));
        out.push(format!(
            "[Micro {m}] 4. Loss computed: mem=1200 MB, time={:.3}s, pg_loss=0.100000, kl=0.001000, total=0.100000",
            gen + 0.75
        ));
    }
    out
}

#[test]
fn stage_lines_alone_are_iterations_with_stage_timings() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = [1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
        .iter()
        .flat_map(|g| micro_iteration(*g))
        .collect();
    let r = run(&[temp_log(dir.path(), "micro.log", &lines)]);
    // Eight iterations (the micro index restarting at 0), not one step.
    assert_eq!(r.frame.steps().to_vec(), (0..8).collect::<Vec<_>>());
    // Per iteration, two micros: 2 x gen s of generation, 2 x 0.25 s scoring, 2 x 0.5 s loss.
    assert_eq!(values(&r, "stage/samples_generated")[0], (0, 2.0));
    assert_eq!(values(&r, "stage/samples_generated")[7], (7, 6.0));
    assert_eq!(values(&r, "stage/samples_scored")[0], (0, 0.5));
    assert_eq!(values(&r, "stage/loss_computed")[7], (7, 1.0));
    let st = r.by_detector("stages");
    assert_eq!(st.len(), 2, "{st:#?}");
    let dominant = st.iter().find(|f| f.severity == Severity::Info).unwrap();
    assert_eq!(dominant.evidence["dominant_stage"], "samples_generated");
    // (4 x 2 + 4 x 6) / (32 + 8 x 0.5 + 8 x 1.0) = 32 / 44
    assert_eq!(dominant.evidence["share"], serde_json::json!(32.0 / 44.0));
    let grows = st.iter().find(|f| f.severity == Severity::Warning).unwrap();
    assert_eq!(grows.evidence["stage"], "samples_generated");
    assert_eq!(grows.steps, vec![6, 7]);
    assert_eq!(grows.evidence["last_quarter_s"], serde_json::json!(6.0));
}

fn cli(argv: &[&str]) -> rlforensics::error::Result<rlforensics::cli::logscan::RunOutput> {
    let mut a = vec!["logscan"];
    a.extend_from_slice(argv);
    cli_run(&LogscanArgs::try_parse_from(a).unwrap(), false)
}

#[test]
fn several_inputs_are_several_runs_whatever_their_order() {
    let ds = stack("deepspeed_chat_444.log");
    let kto = stack("trl_kto_1447.log");
    let (ds, kto) = (ds.to_str().unwrap(), kto.to_str().unwrap());
    // Two files of one folder are one run; make two folders.
    let dir = tempfile::tempdir().unwrap();
    for (sub, src) in [("a", ds), ("b", kto)] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        std::fs::copy(src, dir.path().join(sub).join("train.log")).unwrap();
    }
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let ab = cli(&[a, b, "--format", "json"]).unwrap();
    let ba = cli(&[b, a, "--format", "json"]).unwrap();
    let runs = |o: &str| -> Vec<(String, serde_json::Value)> {
        let v: serde_json::Value = serde_json::from_str(o).unwrap();
        let mut r: Vec<(String, serde_json::Value)> = v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["run"].as_str().unwrap().to_string(),
                    r["report"]["findings"].clone(),
                )
            })
            .collect();
        r.sort_by(|x, y| x.0.cmp(&y.0));
        r
    };
    assert_eq!(runs(&ab.stdout), runs(&ba.stdout));
    assert_eq!(runs(&ab.stdout).len(), 2);
    assert_eq!(ab.code, 1);
    // The parent folder lists its run folders.
    let parent = cli(&[dir.path().to_str().unwrap(), "--format", "json"]).unwrap();
    assert_eq!(runs(&parent.stdout), runs(&ab.stdout));
    let table = cli(&[dir.path().to_str().unwrap()]).unwrap().stdout;
    assert!(
        table.starts_with("2 runs, each scanned on its own"),
        "{table}"
    );
    // --compare is for two runs: three are refused with their list.
    let e = cli(&["--compare", a, b, ds]).unwrap_err().to_string();
    assert!(e.contains("got 3") && e.contains(ds), "{e}");
}

#[test]
fn records_without_a_known_metric_are_not_no_findings() {
    let dir = tempfile::tempdir().unwrap();
    let p = temp_log(
        dir.path(),
        "odd.log",
        &[
            "{'wibble': 0.1, 'wobble': 2.0, 'epoch': 0.1}".into(),
            "{'wibble': 0.2, 'wobble': 2.5, 'epoch': 0.2}".into(),
        ],
    );
    let e = cli(&[p.to_str().unwrap()]).unwrap_err().to_string();
    assert!(
        e.contains("read 2 record(s)") && e.contains("keys not understood: wibble, wobble"),
        "{e}"
    );
    // With a metric read, the keys not understood are named next to "no findings".
    let p = temp_log(
        dir.path(),
        "some.log",
        &[
            "{'loss': 0.5, 'wibble': 0.1}".into(),
            "{'loss': 0.4, 'wibble': 0.2}".into(),
        ],
    );
    let out = cli(&[p.to_str().unwrap()]).unwrap();
    assert_eq!(out.code, 0);
    assert!(out.stdout.contains("no findings"), "{}", out.stdout);
    assert!(
        out.stdout.contains("not understood, so not judged: wibble"),
        "{}",
        out.stdout
    );
}

#[test]
fn corpus_gspo_clip_advice_speaks_gspo() {
    let Some(dir) = crate::corpus::corpus("droid-finetuning/20251008-115149") else {
        return;
    };
    let r = run(&[dir]);
    let clip = r.by_detector("clip-high");
    assert_eq!(clip.len(), 1);
    let causes = &clip[0].likely_causes;
    assert!(
        !causes.iter().any(|c| c.contains("instead of 0.2")),
        "{causes:?}"
    );
    assert!(
        causes[0].starts_with(
            "GSPO (sequence-level ratio): a clip epsilon of ~3e-4 is normal (this run: 0.0001)"
        ),
        "{causes:?}"
    );
}

/// slime's `rollout/zero_std/count_<reward>` (slime/ray/rollout.py
/// `_compute_zero_std_metrics`, THUDM/slime a51f0714179da87b1abdff81f99ae1e22034be92) count
/// the groups whose rewards all equal, one key per reward value: summed per step and divided
/// by the groups per step they are the dead-group share the dead-groups detector judges.
/// The slime console log of rollout metrics (beside, not in, the stacks folder, whose
/// merged scan it would change).
fn slime_log() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs/slime_zero_std.log")
}

#[test]
fn slime_zero_std_counts_are_a_dead_group_share() {
    let opts = ScanOptions {
        groups: Some(32),
        ..ScanOptions::default()
    };
    let r = scan(&[slime_log()], &opts).unwrap();
    // (count_0.0 + count_1.0) / 32, computed by hand from the fixture; step 7 has no count_1.0.
    let want = [12.0, 16.0, 18.0, 20.0, 22.0, 24.0, 28.0, 11.0];
    let want: Vec<(i64, f64)> = want
        .iter()
        .enumerate()
        .map(|(i, d)| (i as i64, d / 32.0))
        .collect();
    assert_eq!(values(&r, "frac_reward_zero_std"), want);
    assert_eq!(
        values(&r, "zero_std_groups")
            .iter()
            .map(|p| p.1)
            .collect::<Vec<_>>(),
        vec![12.0, 16.0, 18.0, 20.0, 22.0, 24.0, 28.0, 11.0]
    );
    assert!(!r.not_understood.iter().any(|k| k.contains("zero_std")));
    let d = r.by_detector("dead-groups");
    assert_eq!(d.len(), 1);
    // Steps 1–6 are at or above the 0.5 share: 6 of 8 steps, a warning (error from 90 %).
    assert_eq!(d[0].severity, Severity::Warning);
    assert_eq!(d[0].steps, vec![1, 2, 3, 4, 5, 6]);

    // Without the group count: no share is made up, the counts are named instead.
    let r = run(&[slime_log()]);
    assert!(values(&r, "frac_reward_zero_std").is_empty());
    let d = r.by_detector("dead-groups");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].severity, Severity::Info);
    assert_eq!(d[0].steps, vec![6]);
    assert!(
        d[0].explanation.contains("up to 28 groups") && d[0].explanation.contains("--groups"),
        "{}",
        d[0].explanation
    );

    // A run folder whose config gives slime's rollout_batch_size: the same share.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(slime_log(), dir.path().join("rollout.log")).unwrap();
    std::fs::write(
        dir.path().join("run_metadata.json"),
        r#"{"config": {"rollout_batch_size": 32, "n_samples_per_prompt": 8}}"#,
    )
    .unwrap();
    let r = run(&[dir.path().to_path_buf()]);
    assert_eq!(values(&r, "frac_reward_zero_std"), want);
    assert_eq!(r.by_detector("dead-groups")[0].severity, Severity::Warning);

    // The same through the command line's --groups.
    let args = LogscanArgs::try_parse_from([
        "logscan",
        slime_log().to_str().unwrap(),
        "--groups",
        "32",
        "--format",
        "json",
    ])
    .unwrap();
    assert_eq!(args.groups, Some(32));
}

/// A real paste's key, written before logscan was run on it (fixtures/README.md, "Console
/// logs of other stacks"): the steps read, every finding at warning or above as (detector,
/// severity, first step, last step), and the exit code.
struct PasteKey {
    file: &'static str,
    steps: &'static [i64],
    findings: &'static [(&'static str, Severity, i64, i64)],
    code: u8,
}

const PASTE_KEYS: &[PasteKey] = &[
    // verl: advantages max = min = 0 while the score spans 0..1: every group tied.
    PasteKey {
        file: "verl_sglang106_zero_adv.log",
        steps: &[83],
        findings: &[("dead-groups", Severity::Error, 83, 83)],
        code: 1,
    },
    // verl with validation metrics on the line: healthy.
    PasteKey {
        file: "verl_entropy21_val.log",
        steps: &[4],
        findings: &[],
        code: 0,
    },
    // slime: grad norm ~3e9 from step 1; a 0.03 logprob gap and ppo_kl 0 are normal.
    PasteKey {
        file: "slime_prorl40_grad_norm.log",
        steps: &[1, 28],
        findings: &[("bounds", Severity::Error, 1, 28)],
        code: 1,
    },
    // DeepSpeed-Chat: the reward model's score stuck within 0.5 % for six steps.
    PasteKey {
        file: "deepspeed_chat_586_reward_flat.log",
        steps: &[259, 260, 261, 262, 263, 264],
        findings: &[("plateau", Severity::Warning, 259, 264)],
        code: 0,
    },
    // ChatGLM-Efficient-Tuning PPO: loss NaN on the record printed at tqdm count 1.
    PasteKey {
        file: "chatglm_efficient_tuning_49_ppo_nan.log",
        steps: &[0, 1, 2, 3],
        findings: &[("nan-grad", Severity::Critical, 1, 1)],
        code: 1,
    },
    // LLaMA-Factory PPO: loss NaN at both logged steps, numbered by the tqdm bar.
    PasteKey {
        file: "llamafactory_357_ppo_nan.log",
        steps: &[9, 19],
        findings: &[("nan-grad", Severity::Critical, 9, 19)],
        code: 1,
    },
    // TRL GRPO: every group tied (frac_reward_zero_std 1): loss and grad norm 0; the cut
    // second record keeps its whole pairs.
    PasteKey {
        file: "trl_3857_zero_std.log",
        steps: &[0, 1],
        findings: &[
            ("zero-loss", Severity::Error, 0, 1),
            ("dead-groups", Severity::Error, 0, 0),
            ("zero-grad", Severity::Error, 0, 1),
        ],
        code: 1,
    },
    // unsloth GSPO: one record wrapped over four lines, then an eval record (not a step).
    PasteKey {
        file: "unsloth_3485_gspo_zero_std.log",
        steps: &[0, 1],
        findings: &[("dead-groups", Severity::Error, 0, 0)],
        code: 1,
    },
    // open-r1 notebook tables: kl NaN on every step with a finite loss; the second, wider
    // table repeats steps 1-2 (one run, not a restart); half the completions clipped.
    PasteKey {
        file: "trl_openr1_704_kl_nan_table.log",
        steps: &[1, 2, 3, 4],
        findings: &[
            ("nan-grad", Severity::Error, 1, 4),
            ("truncation", Severity::Error, 1, 2),
        ],
        code: 1,
    },
    // unsloth notebook table: match_format_exactly never matches; reward_std 0 at steps 3
    // and 5; loss 0 is GRPO's display (info).
    PasteKey {
        file: "unsloth_2291_table.log",
        steps: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        findings: &[
            ("reward-constant", Severity::Warning, 1, 11),
            ("dead-groups", Severity::Warning, 3, 5),
        ],
        code: 0,
    },
    // verl (Agent-R1): NaN in every actor metric, every score -1 so every advantage 0, every
    // response 257 tokens long (clip ratio 1).
    PasteKey {
        file: "verl_agentr1_30_nan_collapse.log",
        steps: &[83],
        findings: &[
            ("nan-grad", Severity::Critical, 83, 83),
            ("dead-groups", Severity::Error, 83, 83),
            ("truncation", Severity::Error, 83, 83),
        ],
        code: 1,
    },
    // ms-swift JSON lines: step from global_step/max_steps; the cut second line is not
    // salvaged (JSONL drops a cut line, as the corpus' LLaMA-Factory file wants).
    PasteKey {
        file: "msswift_5890_json.log",
        steps: &[2],
        findings: &[
            ("dead-groups", Severity::Error, 2, 2),
            ("truncation", Severity::Error, 2, 2),
        ],
        code: 1,
    },
    // The same issue's first paste (multi-node): grad norm and kl 0 while reward_std is
    // 0.13, half the groups tied, half the completions clipped.
    PasteKey {
        file: "msswift_5890_multinode.log",
        steps: &[1],
        findings: &[
            ("dead-groups", Severity::Error, 1, 1),
            ("truncation", Severity::Error, 1, 1),
            ("grad-not-flowing", Severity::Error, 1, 1),
        ],
        code: 1,
    },
    // ms-swift without braces: grad norm 0 although reward_std 0.44.
    PasteKey {
        file: "msswift_5571_zero_grad.log",
        steps: &[5],
        findings: &[("grad-not-flowing", Severity::Error, 5, 5)],
        code: 1,
    },
    // TRL PPO: no response ends with EOS; objective/entropy ~100 and objective/kl ~11 are
    // sums over the sequence, no per-token bound applies.
    PasteKey {
        file: "trl_ppo_37684_no_eos.log",
        steps: &[816, 832],
        findings: &[("truncation", Severity::Error, 816, 832)],
        code: 1,
    },
    // MiniLLM `train | … | global iter: 69/ 160| …`: read, and nothing wrong.
    PasteKey {
        file: "minillm_lmops118_pipes.log",
        steps: &[69, 70, 71, 72],
        findings: &[],
        code: 0,
    },
    // rl-swarm (TRL GRPO): four reward functions at exactly 0 on every record.
    PasteKey {
        file: "trl_rlswarm22_rewards_zero.log",
        steps: &[0, 1, 2],
        findings: &[
            ("reward-constant", Severity::Warning, 0, 2),
            ("reward-constant", Severity::Warning, 0, 2),
            ("reward-constant", Severity::Warning, 0, 2),
            ("reward-constant", Severity::Warning, 0, 2),
        ],
        code: 0,
    },
    // open-r1: loss 0 while the gradient flows: GRPO's display, nothing at warning.
    PasteKey {
        file: "trl_openr1_239_loss0_grad.log",
        steps: &[0, 1, 2],
        findings: &[],
        code: 0,
    },
    // NeMo-RL's `📊 Training Results:` and `⏱️  Timing:` blocks (no step banner in the
    // paste): one step, healthy.
    PasteKey {
        file: "nemorl_1052_timing.log",
        steps: &[0],
        findings: &[],
        code: 0,
    },
    // cosmos-reason1: Python-logging lines; only `Step: 826/4725, Loss: …` is a record (a
    // dict passed as `extra_info={…}` is not).
    PasteKey {
        file: "cosmos_reason1_19_controller.log",
        steps: &[826],
        findings: &[],
        code: 0,
    },
    // TinyLoRA (TRL GRPO, num_iterations > 1): healthy.
    PasteKey {
        file: "trl_tinylora4_healthy.log",
        steps: &[0, 1, 2],
        findings: &[],
        code: 0,
    },
    // Session 22's pastes (keys written before logscan was run on them).
    // Megatron-DeepSpeed: grad norm nan on every iteration; the first line is cut before
    // its iteration, the last after it (no metric).
    PasteKey {
        file: "megatron_ds_396_grad_norm_nan.log",
        steps: &[5426, 5427, 5428],
        findings: &[("nan-grad", Severity::Critical, 5426, 5428)],
        code: 1,
    },
    // Megatron-LLM: `lm loss` printed at 3383 and 3384, gone at 3385 although `loss scale`
    // after it is there: Megatron prints a loss only when it is > 0, so NaN hides it.
    PasteKey {
        file: "megatron_llm_33_loss_hidden.log",
        steps: &[3383, 3384, 3385],
        findings: &[("nan-grad", Severity::Critical, 3385, 3385)],
        code: 1,
    },
    // Megatron-LLM's bad grad_norm check: iteration 3634 skipped at loss scale 1 (bf16).
    PasteKey {
        file: "megatron_llm_34_bad_grad_norm.log",
        steps: &[3633, 3634],
        findings: &[("nan-grad", Severity::Critical, 3634, 3634)],
        code: 1,
    },
    // litgpt `iter N step M: loss …`: NaN from the iteration after the first optimizer step.
    PasteKey {
        file: "litgpt_291_loss_nan.log",
        steps: &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        findings: &[("nan-grad", Severity::Critical, 8, 14)],
        code: 1,
    },
    // LLaMA-Factory with a log viewer's line numbers: records numbered by the tqdm bars
    // around them (10 and 20), then the NCCL watchdog ends the run (no Python traceback);
    // the SFT loss printed as 0.0 at 20 with grad norm 1.41 (a supervised loss never is).
    PasteKey {
        file: "llamafactory_8261_nccl_timeout.log",
        steps: &[10, 20],
        findings: &[
            ("crash", Severity::Error, 20, 20),
            ("bounds", Severity::Warning, 20, 20),
        ],
        code: 1,
    },
    // verl: one step, then NCCL timeouts on every rank and a dead Ray worker.
    PasteKey {
        file: "verl_3873_nccl_hang.log",
        steps: &[1],
        findings: &[("crash", Severity::Error, 1, 1)],
        code: 1,
    },
    // prime-rl `SUCCESS Step 9 | … | Loss: 0.0000 | … | Grad. Norm: 0.0000 |`: nothing learns.
    PasteKey {
        file: "primerl_1117_loss_zero.log",
        steps: &[9, 10],
        findings: &[
            ("zero-loss", Severity::Error, 9, 10),
            ("zero-grad", Severity::Error, 9, 10),
        ],
        code: 1,
    },
    // TRL DPO at lr 7e-5: loss 0.0 where the margins are 17 and 11.7 (saturated batches).
    PasteKey {
        file: "trl_dpo_1236_loss_zero.log",
        steps: &[0, 1, 2, 3],
        findings: &[("preference", Severity::Warning, 0, 2)],
        code: 0,
    },
    // ETO (TRL DPO): loss ln 2, rewards 0, logps/chosen = logps/rejected = 0.
    PasteKey {
        file: "trl_dpo_eto14_logps_zero.log",
        steps: &[0],
        findings: &[("preference", Severity::Error, 0, 0)],
        code: 1,
    },
    // TRL GRPO: loss 0 with grad_norm ~0.1 and reward_std > 0 (the display, info only).
    PasteKey {
        file: "trl_3452_loss0_format1.log",
        steps: &[0, 1, 2, 3, 4],
        findings: &[],
        code: 0,
    },
    // open-r1 (TRL GRPO): a healthy start.
    PasteKey {
        file: "trl_openr1_255_healthy.log",
        steps: &[0, 1, 2],
        findings: &[],
        code: 0,
    },
    // `epoch: N loss: X` lines: NaN from epoch 3451 on.
    PasteKey {
        file: "gradnorm_tf_17_epoch_nan.log",
        steps: &[
            3442, 3443, 3444, 3445, 3446, 3447, 3448, 3449, 3450, 3451, 3452, 3453, 3454, 3455,
            3456, 3457, 3458,
        ],
        findings: &[("nan-grad", Severity::Critical, 3451, 3458)],
        code: 1,
    },
    // Round 2 (keys written before the run; the fixes above were made without these):
    // Dreamer `[5000] key value / key value / …`: the world model's grad norm NaN at 5000
    // and 7000, its loss inf at 7000 (an `aux_*` family: another part of the model), its
    // grad norm 4.5e15 and 3.6e15 at 6000 and 8000 (beyond any healthy run).
    PasteKey {
        file: "dreamer_58_grad_nan.log",
        steps: &[5000, 6000, 7000, 8000],
        findings: &[
            ("nan-grad", Severity::Critical, 5000, 7000),
            ("bounds", Severity::Error, 6000, 8000),
        ],
        code: 1,
    },
    // TRL ORPO: every number NaN from the first record, the loss logged as 0.0 (the NaN
    // hidden); the last record cut.
    PasteKey {
        file: "trl_orpo_1473_all_nan.log",
        steps: &[0, 1, 2, 3],
        findings: &[("nan-grad", Severity::Critical, 0, 3)],
        code: 1,
    },
    // rsl_rl's `Learning iteration 8391/10000` block: `Value function loss: inf`.
    PasteKey {
        file: "isaaclab_1999_value_inf.log",
        steps: &[8391],
        findings: &[("nan-grad", Severity::Critical, 8391, 8391)],
        code: 1,
    },
    // A PPO loop's `iteration N/M` banner, then its `k=v, …` metrics after the epochs; the
    // metrics before the first banner are the iteration before it. Healthy.
    PasteKey {
        file: "dotaclient_34_iterations.log",
        steps: &[8, 9, 10, 11],
        findings: &[],
        code: 0,
    },
    // Session 23 (keys written before the run). Gemma LoRA SFT: one grad-norm excursion
    // (11140 after ~8) is a spike against its history, not an absolute-bound error.
    PasteKey {
        file: "unsloth_5207_grad_spike.log",
        steps: &[0, 1, 2, 3, 4, 5, 6, 7, 8],
        findings: &[("grad-spike", Severity::Warning, 8, 8)],
        code: 0,
    },
    // verl GRPO: the validation-only `step:0` line, then one healthy training step.
    PasteKey {
        file: "verl_2060_val_step0.log",
        steps: &[0, 1],
        findings: &[],
        code: 0,
    },
    // verl PPO with a critic, the step line soft-wrapped inside keys and values; healthy.
    PasteKey {
        file: "verl_1224_critic_wrapped.log",
        steps: &[1049],
        findings: &[],
        code: 0,
    },
    PasteKey {
        file: "verl_7412_clip.log",
        steps: &[34],
        findings: &[],
        code: 0,
    },
    // LLaMA-Factory PPO `trainer_log`-style lines with no step: an oscillating PPO loss
    // while the reward rises is no failure.
    PasteKey {
        file: "llamafactory_845_ppo_oscillate.log",
        steps: &[0, 1, 2, 3],
        findings: &[],
        code: 0,
    },
    // KTO: mean logits of -2e8: broken numerics, from the first record.
    PasteKey {
        file: "llamafactory_7380_kto_logits.log",
        steps: &[0],
        findings: &[("bounds", Severity::Error, 0, 0)],
        code: 1,
    },
    // Megatron with a timestamp before each iteration line; the third line cut. Healthy.
    PasteKey {
        file: "megatron_lm_673_timestamped.log",
        steps: &[1, 2, 3],
        findings: &[],
        code: 0,
    },
    // Megatron BERT in fp16: the first interval's 10 updates all skipped while the scaler
    // calibrates (no loss printed), then `lm loss` and `sop loss`: no NaN.
    PasteKey {
        file: "megatron_nccl743_fp16_calibration.log",
        steps: &[10, 20],
        findings: &[],
        code: 0,
    },
    // Megatron-DeepSpeed: an iteration line with no loss and no skipped update: the
    // `avg > 0.0` rule hid a NaN loss (the PR's own reading).
    PasteKey {
        file: "megatron_ds_434_no_loss.log",
        steps: &[9],
        findings: &[("nan-grad", Severity::Critical, 9, 9)],
        code: 1,
    },
    // dllogger consoles (NVIDIA DeepLearningExamples BERT): healthy.
    PasteKey {
        file: "dllogger_dle1107_squad_bars.log",
        steps: &[1801, 1851, 1901],
        findings: &[],
        code: 0,
    },
    PasteKey {
        file: "dllogger_dle543_bert.log",
        steps: &[1787, 1887, 1987, 2087, 2187, 2287],
        findings: &[],
        code: 0,
    },
    // BERT pretraining behind mpirun: the loss within 0.1 % for 70 steps, MLM accuracy 0.
    PasteKey {
        file: "aws_dlm45_bert_flat.log",
        steps: &[1040, 1050, 1060, 1070, 1080, 1090, 1100, 1110],
        findings: &[("plateau", Severity::Warning, 1040, 1110)],
        code: 0,
    },
    // Online RiC (HF dicts): grad_norm NaN from the first record.
    PasteKey {
        file: "ric_20_grad_nan.log",
        steps: &[0, 1, 2, 3, 4],
        findings: &[("nan-grad", Severity::Critical, 0, 4)],
        code: 1,
    },
    // A GRPO run's metrics pasted with no step: every completion cut at 256 tokens, every
    // group tied at reward 0.
    PasteKey {
        file: "autocontext_1067_clipped.log",
        steps: &[0],
        findings: &[
            ("dead-groups", Severity::Error, 0, 0),
            ("truncation", Severity::Error, 0, 0),
        ],
        code: 1,
    },
    // mlx-lm GRPO: every reward, every group std and the loss exactly 0 on iterations
    // 20-22 (the third cut).
    PasteKey {
        file: "mlx_1233_grpo_zero.log",
        steps: &[20, 21, 22],
        findings: &[
            ("zero-loss", Severity::Error, 20, 22),
            ("dead-groups", Severity::Error, 20, 22),
        ],
        code: 1,
    },
    // DeepRM's `Iteration: \t N` blocks, `MeanRew: \t -257.4 +- 63.2`: read, no finding.
    PasteKey {
        file: "deeprm_10_iterations.log",
        steps: &[0, 1, 2, 3, 4],
        findings: &[],
        code: 0,
    },
    // DeepRL-Grounding: stepless `Time …, Avg Reward 0.064, …, Best Reward 0.184` lines,
    // one record each; the running best is no reward function stuck at a constant.
    PasteKey {
        file: "deeprl_grounding_7_flat.log",
        steps: &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        findings: &[],
        code: 0,
    },
    // tianshou PPO: `Epoch #N: …it [… rew=200.00]` bars, the epoch the step; CartPole
    // solved (reward at its maximum 200 on every epoch) is no plateau.
    PasteKey {
        file: "tianshou_449_ppo_epochs.log",
        steps: &[1, 2, 3, 4, 5],
        findings: &[],
        code: 0,
    },
    // LoRA-GA: a noisy grad norm (16-157) on a falling loss is no finding.
    PasteKey {
        file: "peft_2926_loraga_noisy.log",
        steps: &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
        findings: &[],
        code: 0,
    },
];

#[test]
fn real_pastes_give_their_keys_and_no_false_alarm() {
    for key in PASTE_KEYS {
        let p = stack(key.file);
        let r = run(std::slice::from_ref(&p));
        assert_eq!(r.frame.steps().to_vec(), key.steps, "{}", key.file);
        let got: Vec<(&str, Severity, i64, i64)> = r
            .findings
            .iter()
            .filter(|f| f.severity >= Severity::Warning)
            .map(|f| {
                (
                    f.detector.as_str(),
                    f.severity,
                    f.first_step.unwrap(),
                    f.last_step.unwrap(),
                )
            })
            .collect();
        assert_eq!(got, key.findings, "{}: {:#?}", key.file, r.findings);
        let out = cli(&[p.to_str().unwrap()]).unwrap();
        assert_eq!(out.code, key.code, "{}", key.file);
    }
}

#[test]
fn paste_causes_agree_with_their_findings() {
    // KL alone NaN, loss finite: not a diverged update, and no reward-std division.
    let r = run(&[stack("trl_openr1_704_kl_nan_table.log")]);
    let nan = &r.by_detector("nan-grad")[0];
    assert!(
        nan.explanation.starts_with("kl is non-finite on 4"),
        "{}",
        nan.explanation
    );
    assert!(
        nan.likely_causes[0].contains("reference"),
        "{:?}",
        nan.likely_causes
    );
    // A PPO loss NaN with no group reward std: not GRPO's std division first.
    let r = run(&[stack("llamafactory_357_ppo_nan.log")]);
    let causes = &r.by_detector("nan-grad")[0].likely_causes;
    assert!(
        causes[0].starts_with("learning rate too high"),
        "{causes:?}"
    );
    assert!(!causes.iter().any(|c| c.contains("reward std in advantage")));
    // GRPO's zero-loss display (info) is not blamed on tied rewards.
    let r = run(&[stack("trl_openr1_239_loss0_grad.log")]);
    let z = r.by_detector("zero-loss");
    assert_eq!(z[0].severity, Severity::Info);
    assert!(z[0].likely_causes[0].starts_with("GRPO's loss is ~0 by construction"));
    // verl's advantages say why the groups are dead.
    let r = run(&[stack("verl_sglang106_zero_adv.log")]);
    let d = &r.by_detector("dead-groups")[0];
    assert!(
        d.explanation.starts_with("every advantage is exactly 0"),
        "{}",
        d.explanation
    );
    assert_eq!(
        d.evidence["derived_from_advantages"],
        serde_json::json!(true)
    );
    // A gradient norm of 3e9 beside a loss of 0.1-0.15: not a summed loss.
    let r = run(&[stack("slime_prorl40_grad_norm.log")]);
    let b = &r.by_detector("bounds")[0];
    assert!(b.likely_causes[0].starts_with("the reported norm, not the update"));
    assert!(!b.likely_causes.iter().any(|c| c.starts_with("loss summed")));
    assert_eq!(
        b.evidence["max_abs_loss_there"],
        serde_json::json!(0.1451725959777832)
    );
    // Every response at the cap and every group tied, at the step everything turned NaN:
    // the broken update comes first, not the length limit or the task.
    let r = run(&[stack("verl_agentr1_30_nan_collapse.log")]);
    for d in ["truncation", "dead-groups"] {
        let c = &r.by_detector(d)[0].likely_causes;
        assert!(
            c[0].starts_with("weights broken by the non-finite update at step 83"),
            "{d}: {c:?}"
        );
    }
    // A kl-only NaN breaks no weights: open-r1's truncation keeps its own causes.
    let r = run(&[stack("trl_openr1_704_kl_nan_table.log")]);
    assert!(!r.by_detector("truncation")[0].likely_causes[0].contains("non-finite update"));
    // The reward-model score stuck: its spread in the evidence.
    let r = run(&[stack("deepspeed_chat_586_reward_flat.log")]);
    let p = &r.by_detector("plateau")[0];
    assert_eq!(p.evidence["min_reward"], serde_json::json!(0.20556640625));
    assert_eq!(p.evidence["max_reward"], serde_json::json!(0.20654296875));
}

#[test]
fn paste_formats_read_as_written() {
    // A dict wrapped over four lines is one record with every pair.
    let r = run(&[stack("unsloth_3485_gspo_zero_std.log")]);
    assert_eq!(values(&r, "reward_mean"), vec![(0, 4.0)]);
    assert_eq!(values(&r, "kl"), vec![(0, 0.0)]);
    assert_eq!(values(&r, "completion_len_max"), vec![(0, 81.0)]);
    // MiniLLM's pipes: the step is the global iteration, not the inner one or the epoch.
    let r = run(&[stack("minillm_lmops118_pipes.log")]);
    assert_eq!(values(&r, "loss")[2], (71, 1.8389));
    assert_eq!(values(&r, "reward_mean")[1], (70, -2.6641));
    // The wider second table adds its columns to the same steps.
    let r = run(&[stack("trl_openr1_704_kl_nan_table.log")]);
    assert_eq!(values(&r, "truncation_ratio"), vec![(1, 0.5), (2, 0.625)]);
    assert_eq!(values(&r, "loss")[0], (1, -0.2836));
    assert_eq!(r.by_detector("runs").len(), 0);
    // A second table whose values differ at a repeated step is a restart, as before.
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = [
        "Step | Training Loss | reward",
        "1 | 0.5 | 0.1",
        "2 | 0.4 | 0.2",
        "Step | Training Loss | reward",
        "1 | 0.9 | 0.0",
        "2 | 0.8 | 0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r = run(&[temp_log(dir.path(), "two.log", &lines)]);
    assert_eq!(r.by_detector("runs").len(), 1);
}

/// NeMo-RL's console (nemo_rl/algorithms/grpo.py @ 002cdc27b8019eafc470f0aab22d4a7206d0de81):
/// `{'=' * 25} Step {n}/{total} {'=' * 25}`, then `📊 Training Results:` with `  • Loss: …`,
/// `  • Avg Reward: …`, `  • Mean Generation Length: …` and `⏱️  Timing:` with `  • Total
/// step time: …s` and one `  • <stage>: …s (…%)` per stage, built here from those f-strings.
fn nemo_rl_step(n: usize, loss: f64, reward: f64, gen_s: f64) -> Vec<String> {
    vec![
        format!("{} Step {n}/100 {}", "=".repeat(25), "=".repeat(25)),
        "▶ Preparing batch...".into(),
        String::new(),
        "📊 Training Results:".into(),
        format!("  • Loss: {loss:.4}"),
        format!("  • Avg Reward: {reward:.4}"),
        "  • Mean Generation Length: 312.4000".into(),
        String::new(),
        "⏱️  Timing:".into(),
        format!("  • Total step time: {:.2}s", gen_s + 15.0),
        format!(
            "  • generation: {gen_s:.2}s ({:.1}%)",
            gen_s / (gen_s + 15.0) * 100.0
        ),
        format!(
            "  • policy_training: 15.00s ({:.1}%)",
            1500.0 / (gen_s + 15.0)
        ),
    ]
}

#[test]
fn nemo_rl_blocks_are_steps_with_stage_times() {
    let r = run(&[stack("nemorl_1052_timing.log")]);
    assert_eq!(values(&r, "loss"), vec![(0, 0.1032)]);
    assert_eq!(values(&r, "reward_mean"), vec![(0, 0.3486)]);
    assert_eq!(values(&r, "step_time"), vec![(0, 66.55)]);
    assert_eq!(values(&r, "stage/exposed_generation"), vec![(0, 32.52)]);
    let st = r.by_detector("stages");
    assert_eq!(st[0].evidence["dominant_stage"], "exposed_generation");

    // Banners name the steps; a NaN loss at step 3 and generation growing from 20 s to 60 s.
    let dir = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    for (n, (loss, gen)) in [(0.01, 20.0), (0.02, 20.0), (f64::NAN, 20.0), (0.01, 60.0)]
        .iter()
        .enumerate()
    {
        lines.extend(nemo_rl_step(n + 1, *loss, 0.4, *gen));
    }
    let r = run(&[temp_log(dir.path(), "nemo.log", &lines)]);
    assert_eq!(r.frame.steps().to_vec(), vec![1, 2, 3, 4]);
    assert_eq!(r.by_detector("nan-grad")[0].steps, vec![3]);
    assert_eq!(values(&r, "stage/generation")[3], (4, 60.0));
    assert_eq!(values(&r, "completion_len_mean")[0], (1, 312.4));
}

#[test]
fn areal_stats_tables_are_steps() {
    // fixtures/gen/make_areal_log.py: AReaL's StatsLogger lines and fancy_grid tables, with
    // colorlog's ANSI codes; every group tied from step 3 (advantages max = min = 0).
    let r = run(&[stack("areal_stats_main.log")]);
    assert_eq!(r.frame.steps().to_vec(), vec![1, 2, 3, 4]);
    assert_eq!(
        values(&r, "reward_mean"),
        vec![(1, 0.5), (2, 0.625), (3, 1.0), (4, 1.0)]
    );
    assert_eq!(values(&r, "grad_norm")[0], (1, 0.31));
    assert_eq!(values(&r, "truncation_ratio")[3], (4, 0.0625));
    assert_eq!(values(&r, "adv_min")[1], (2, -1.48));
    let d = r.by_detector("dead-groups");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].steps, vec![3, 4]);
    assert_eq!(
        d[0].evidence["derived_from_advantages"],
        serde_json::json!(true)
    );
    assert_eq!(r.by_detector("zero-grad")[0].steps, vec![3, 4]);
    assert_eq!(r.files[0].format, "text (kv_text)");
}

#[test]
fn a_reward_that_falls_to_zero_and_stays_is_a_collapse() {
    // OpenRLHF's progress-bar postfix (`Episode [1/1]: …, policy_loss=…, reward=…]`): the
    // loss turns NaN at the third step and the reward is 0 from then on (OpenRLHF#1120).
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = [(0.012, 0.31), (0.010, 0.34), (f64::NAN, 0.0), (f64::NAN, 0.0), (f64::NAN, 0.0)]
        .iter()
        .enumerate()
        .map(|(i, (loss, reward))| {
            format!(
                "Episode [1/1]:   {}%|▏         | {}/50 [01:02<51:03, 62.52s/it, policy_loss={loss}, kl=0.0005, reward={reward}, response_length=412, act_lr=5e-7]",
                2 * (i + 1),
                i + 1
            )
        })
        .collect();
    let r = run(&[temp_log(dir.path(), "orlhf.log", &lines)]);
    let p = r.by_detector("plateau");
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].steps, vec![2, 3, 4]);
    assert!(
        p[0].explanation
            .starts_with("reward falls to exactly 0 at step 2"),
        "{}",
        p[0].explanation
    );
    assert_eq!(p[0].evidence["reward_before"], serde_json::json!(0.34));
    assert_eq!(r.by_detector("nan-grad")[0].steps, vec![2, 3, 4]);
    // Two zeros at the end are not enough; a reward never earned is not a collapse.
    let r = run(&[temp_log(dir.path(), "short.log", &lines[..4])]);
    assert!(r.by_detector("plateau").is_empty());
}

#[test]
fn fatal_lines_without_a_traceback_end_the_run() {
    let r = run(&[stack("verl_3873_nccl_hang.log")]);
    let c = &r.by_detector("crash")[0];
    assert!(
        c.explanation
            .starts_with("the run stopped on a fatal error (no Python traceback) after step 1"),
        "{}",
        c.explanation
    );
    assert_eq!(
        c.evidence["signature"],
        serde_json::json!("collective-timeout")
    );
    assert!(c.evidence["then"]
        .as_str()
        .unwrap()
        .starts_with("A worker died or was killed"));
    // A watchdog message cut mid-word is still the NCCL timeout.
    let r = run(&[stack("llamafactory_8261_nccl_timeout.log")]);
    let c = &r.by_detector("crash")[0];
    assert_eq!(
        c.evidence["signature"],
        serde_json::json!("collective-timeout")
    );
    assert_eq!(values(&r, "loss"), vec![(10, 3.5534), (20, 0.0)]);
    // A fatal line the log goes on after (a worker restarted) did not stop the run.
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = [
        "step:1 - actor/pg_loss:0.1 - critic/score/mean:0.5",
        "(raylet) A worker died or was killed while executing a task by an unexpected system error.",
        "step:2 - actor/pg_loss:0.1 - critic/score/mean:0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r = run(&[temp_log(dir.path(), "restart.log", &lines)]);
    assert_eq!(r.by_detector("crash")[0].severity, Severity::Info);
}

#[test]
fn megatron_lines_say_what_they_leave_out() {
    // A loss the fp16 scaler skipped (its scale halves on that line) is calibration, not a
    // NaN: nothing. The same skip at a steady scale is a non-finite gradient.
    let line = |i: i64, loss: Option<f64>, scale: f64, skipped: i64| {
        let loss = loss.map_or(String::new(), |l| format!(" lm loss: {l:.6E} |"));
        format!(
            " iteration {i:>8}/ 1000 | consumed samples: {} | elapsed time per iteration (ms): 900.0 | learning rate: 1.000E-05 | global batch size: 8 |{loss} loss scale: {scale:.1} | grad norm: 0.900 | number of skipped iterations: {skipped:>3} | number of nan iterations:   0 |",
            i * 8
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let lines = vec![
        line(10, Some(2.5), 65536.0, 0),
        line(11, None, 32768.0, 1),
        line(12, Some(2.4), 32768.0, 0),
    ];
    let r = run(&[temp_log(dir.path(), "fp16.log", &lines)]);
    assert!(r.by_detector("nan-grad").is_empty(), "{:#?}", r.findings);
    assert!(!r.not_understood.iter().any(|k| k.contains("skipped")));
    let lines = vec![
        line(10, Some(2.5), 1.0, 0),
        line(11, None, 1.0, 1),
        line(12, Some(2.4), 1.0, 0),
    ];
    let r = run(&[temp_log(dir.path(), "bf16.log", &lines)]);
    assert_eq!(r.by_detector("nan-grad")[0].steps, vec![11]);
    let nan = &r.by_detector("nan-grad")[0];
    assert!(
        nan.explanation
            .contains("Megatron prints a loss only if it is > 0"),
        "{}",
        nan.explanation
    );
    let r = run(&[stack("megatron_llm_33_loss_hidden.log")]);
    assert!(r.by_detector("nan-grad")[0]
        .explanation
        .contains("missing from the iteration line at 1 step(s) (first 3385)"));
    // Fields the pasted line never printed are not made up: a first line without a loss.
    let r = run(&[stack("megatron_llm_34_bad_grad_norm.log")]);
    assert!(values(&r, "loss").is_empty());
}

#[test]
fn loss_and_grad_norm_families_by_their_names() {
    // Named by what they measure, not listed per file: the value model's, the policy's, and
    // another part's (Dreamer's world model) losses and gradient norms.
    let r = run(&[stack("dreamer_58_grad_nan.log")]);
    let nan = &r.by_detector("nan-grad")[0];
    assert_eq!(
        nan.evidence["non_finite_by_metric"],
        serde_json::json!({"aux_loss": 1, "aux_grad_norm": 2})
    );
    assert_eq!(values(&r, "critic_grad_norm")[0], (5000, 40.3));
    assert_eq!(values(&r, "loss")[0], (5000, -6.9));
    let r = run(&[stack("isaaclab_1999_value_inf.log")]);
    assert_eq!(values(&r, "loss"), vec![(8391, 0.0)]);
    assert_eq!(values(&r, "reward_mean"), vec![(8391, 25.66)]);
    // A named alias of the same metric in the record wins over a family member.
    let dir = tempfile::tempdir().unwrap();
    let p = temp_log(
        dir.path(),
        "t.log",
        &["[7000] image_loss 849.0 / model_loss inf / value_loss 5.0".into()],
    );
    assert!(values(&run(&[p]), "aux_loss")[0].1.is_infinite());
}

#[test]
fn preference_nans_get_the_algorithms_causes() {
    let r = run(&[stack("trl_orpo_1473_all_nan.log")]);
    assert_eq!(algorithm(&r.frame), Algorithm::Orpo);
    let nan = &r.by_detector("nan-grad")[0];
    assert_eq!(
        nan.evidence["loss_zero_with_nan_grad_steps"],
        serde_json::json!([0, 1, 2, 3])
    );
    assert!(
        nan.likely_causes[0].starts_with("ORPO's odds ratio"),
        "{:?}",
        nan.likely_causes
    );
    assert!(r.by_detector("zero-loss").is_empty() && r.by_detector("dead-groups").is_empty());
    let r = run(&[stack("trl_kto_1447.log")]);
    let causes = &r.by_detector("nan-grad")[0].likely_causes;
    assert!(
        causes[0].starts_with("a pair whose completion is truncated away"),
        "{causes:?}"
    );
    assert!(!causes.iter().any(|c| c.contains("reward std")));
}

#[test]
fn a_console_of_progress_bars_only_is_not_no_findings() {
    // OpenRLHF (issue 350): vLLM's `Processed prompts` and the `Episode [1/1]` bars, no
    // `Train epoch` postfix: no training step was logged. Exit 2 with what was read.
    let p = stack("openrlhf_350_no_train.log");
    let r = run(std::slice::from_ref(&p));
    assert_eq!((r.steps, r.files[0].records), (0, 0));
    let err = cli(&[p.to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("read 0 records"), "{err}");
    // It says what it saw: bars, not an unknown format.
    assert!(err.to_string().contains("only progress bars"), "{err}");
    assert!(!err.to_string().contains("not a format logscan knows"));
    assert!(
        r.files[0].progress_bars >= 10,
        "{}",
        r.files[0].progress_bars
    );
}

#[test]
fn session23_pastes_read_as_written() {
    // verl's step line wrapped inside `actor/ppo_kl:0.0|00` and `c|ritic/score/max`.
    let r = run(&[stack("verl_1224_critic_wrapped.log")]);
    assert_eq!(values(&r, "ppo_kl"), vec![(1049, 0.0)]);
    assert_eq!(values(&r, "critic_grad_norm"), vec![(1049, 65.55)]);
    assert_eq!(values(&r, "reward_mean"), vec![(1049, 0.104)]);
    let r = run(&[stack("verl_7412_clip.log")]);
    assert_eq!(values(&r, "completion_len_max"), vec![(34, 3072.0)]);
    // dllogger: `Training Iteration: N` is the step, `step_loss` the loss; a tqdm bar
    // printed after the record on the same line is not part of it.
    let r = run(&[stack("dllogger_dle1107_squad_bars.log")]);
    assert_eq!(
        values(&r, "loss"),
        vec![
            (1801, 0.8211057186126709),
            (1851, 2.275021553039551),
            (1901, 0.6579757928848267)
        ]
    );
    assert_eq!(r.files[0].unrecognised_lines, 0);
    let r = run(&[stack("dllogger_dle543_bert.log")]);
    assert_eq!(values(&r, "loss")[1], (1887, 1.75));
    // `[1,0]<stdout>:… __main__    : INFO     Train step 1040 -- Loss: 11.174, …`: read,
    // and the loss that does not move from batch to batch is a model not learning.
    let p = stack("aws_dlm45_bert_flat.log");
    let r = run(std::slice::from_ref(&p));
    assert_eq!(r.frame.steps().len(), 8);
    assert_eq!(values(&r, "loss")[0], (1040, 11.174));
    assert_eq!(cli(&[p.to_str().unwrap()]).unwrap().code, 0);
    let pl = &r.by_detector("plateau")[0];
    assert!(
        pl.explanation.contains("the same loss"),
        "{}",
        pl.explanation
    );
    assert!(pl.likely_causes[0].starts_with("the model's output ignores its input"));
    // Megatron BERT's calibrating first interval: no loss invented for it.
    let r = run(&[stack("megatron_nccl743_fp16_calibration.log")]);
    assert_eq!(values(&r, "loss"), vec![(20, 10.05022)]);
    // The hidden loss says why it is NaN.
    let r = run(&[stack("megatron_ds_434_no_loss.log")]);
    let n = &r.by_detector("nan-grad")[0];
    assert!(
        n.explanation
            .contains("Megatron prints a loss only if it is > 0"),
        "{}",
        n.explanation
    );
    // A spike in a supervised log: no reward-std cause.
    let r = run(&[stack("unsloth_5207_grad_spike.log")]);
    let c = &r.by_detector("grad-spike")[0].likely_causes;
    assert!(c[0].starts_with("one batch far from the rest"), "{c:?}");
    assert!(r.by_detector("bounds").is_empty());
    // `mean +- spread` values: the mean; stepless lines that repeat their keys: a record each.
    let r = run(&[stack("deeprm_10_iterations.log")]);
    assert_eq!(values(&r, "reward_mean")[0], (0, -257.43755677655673));
    let r = run(&[stack("deeprl_grounding_7_flat.log")]);
    assert_eq!(values(&r, "reward_mean")[1], (1, -0.056));
    // tianshou's postfix: `rew` the reward, `loss/vf` the critic's loss, `loss/ent` entropy.
    let r = run(&[stack("tianshou_449_ppo_epochs.log")]);
    assert_eq!(values(&r, "reward_mean")[0], (1, 200.0));
    assert_eq!(values(&r, "critic_loss")[0], (1, 0.044));
    assert_eq!(values(&r, "entropy")[4], (5, 0.257));
    // Tied groups on steps where every completion was cut: the cut is their first cause.
    let r = run(&[stack("autocontext_1067_clipped.log")]);
    let d = &r.by_detector("dead-groups")[0].likely_causes;
    assert!(
        d[0].starts_with("every completion cut at the length limit"),
        "{d:?}"
    );
    // KTO's logits: one finding for chosen and rejected alike.
    let r = run(&[stack("llamafactory_7380_kto_logits.log")]);
    let b = r.by_detector("bounds");
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].evidence["metric"], "pref_logits_chosen");
    // verl's bookkeeping and throughput keys are not "not understood".
    let r = run(&[stack("verl_2060_val_step0.log")]);
    assert!(!r
        .not_understood
        .iter()
        .any(|k| k.starts_with("global_seqlen/")
            || k.starts_with("perf/")
            || k == "training/epoch"
            || k == "actor/kl_coef"));
}

#[test]
fn why_on_a_supervised_log_says_the_rl_hypotheses_do_not_apply() {
    use rlforensics::detect::hypotheses::Verdict;
    let opts = ScanOptions {
        why: true,
        ..ScanOptions::default()
    };
    let r = scan(&[stack("aws_dlm45_bert_flat.log")], &opts).unwrap();
    let t = r.hypotheses.unwrap();
    assert_eq!(t.rows.len(), 6);
    for h in &t.rows {
        assert_eq!(h.verdict, Verdict::CannotTell, "{}", h.id);
        assert!(h.evidence.contains("do not apply"), "{}", h.evidence);
    }
    // An RL log keeps its per-hypothesis evidence (DeepSpeed-Chat's stuck reward score).
    let r = scan(&[stack("deepspeed_chat_586_reward_flat.log")], &opts).unwrap();
    let t = r.hypotheses.unwrap();
    assert!(t.plateau);
    assert!(!t.rows[0].evidence.contains("do not apply"));
}
