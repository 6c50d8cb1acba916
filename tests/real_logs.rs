//! logscan on the real logs of the shared corpus (`../shared/corpus/real-logs`, the MLX
//! DebugTrainer runs in `droid-finetuning`): one test per file asserts the MUST findings of
//! its careful reading, that its TRAPs do not fire at warning or above, and that every other
//! finding at warning or above is one the reading calls worth reporting (SHOULD/NICE).
//! What is expected of each file is data, `tests/data/real_logs_truth.json`, which
//! `scripts/corpus_score.sh` scores too. Every test goes through the corpus rule.

use clap::Parser;
use rlforensics::cli::logscan::{run, LogscanArgs};
use serde_json::Value;

use crate::corpus::corpus;

/// The truth file's entry for corpus path `path`.
fn truth(path: &str) -> Value {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real_logs_truth.json"),
    )
    .unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    all["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .cloned()
        .unwrap_or_else(|| panic!("{path} has no entry in the truth file"))
}

/// Severity rank (info 0 … critical 3).
fn rank(s: &str) -> u8 {
    match s {
        "info" => 0,
        "warning" => 1,
        "error" => 2,
        "critical" => 3,
        other => panic!("unknown severity {other}"),
    }
}

/// True when finding `f` matches truth item `item` (detector listed, severity at least the
/// item's minimum, step range overlapping the item's when it names one).
fn matches(f: &Value, item: &Value) -> bool {
    let det = f["detector"].as_str().unwrap_or_default();
    let listed = item["detectors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d.as_str() == Some(det));
    let min = item["min_severity"].as_str().unwrap_or("warning");
    let severe = rank(f["severity"].as_str().unwrap_or("info")) >= rank(min);
    let overlap = match item["steps"].as_array() {
        Some(r) => {
            let (a, b) = (r[0].as_i64().unwrap(), r[1].as_i64().unwrap());
            match (f["first_step"].as_i64(), f["last_step"].as_i64()) {
                (Some(x), Some(y)) => x <= b && a <= y,
                _ => false,
            }
        }
        None => true,
    };
    listed && severe && overlap
}

/// Items of `kind` (`must`, `should`, `nice`, `traps`) of a truth entry.
fn items<'a>(t: &'a Value, kind: &str) -> Vec<&'a Value> {
    t[kind]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Scan the corpus file `path` as the command line does and check it against its truth.
fn check(path: &str) {
    let t = truth(path);
    let Some(p) = corpus(path) else { return };
    let args = LogscanArgs::try_parse_from([
        "logscan",
        p.to_str().unwrap(),
        "--format",
        "json",
        "--fail-on",
        "critical",
    ])
    .unwrap();
    let out = run(&args, false);
    if t["exit"].as_i64() == Some(2) {
        let err = out
            .err()
            .unwrap_or_else(|| panic!("{path}: expected exit 2"));
        let msg = err.to_string();
        assert!(
            msg.contains("nothing to scan") || msg.contains("read 0 records"),
            "{path}: {msg}"
        );
        return;
    }
    let out = out.unwrap_or_else(|e| panic!("{path}: {e}"));
    let r: Value = serde_json::from_str(&out.stdout).unwrap();
    for key in ["first_step", "last_step"] {
        if let Some(want) = t[key].as_i64() {
            assert_eq!(r[key].as_i64(), Some(want), "{path}: {key}");
        }
    }
    if let Some(n) = t["runs"].as_u64() {
        assert_eq!(r["files"][0]["runs"].as_u64(), Some(n), "{path}: runs");
    }
    let findings = r["findings"].as_array().unwrap();
    for m in items(&t, "must") {
        assert!(
            findings.iter().any(|f| matches(f, m)),
            "{path}: MUST not found: {}\n{findings:#?}",
            m["id"]
        );
    }
    for trap in items(&t, "traps") {
        let mut trap = trap.clone();
        trap["min_severity"] = "warning".into();
        let fired: Vec<&Value> = findings.iter().filter(|f| matches(f, &trap)).collect();
        assert!(
            fired.is_empty(),
            "{path}: TRAP fired: {}\n{fired:#?}",
            trap["id"]
        );
    }
    let wanted: Vec<&Value> = ["must", "should", "nice"]
        .iter()
        .flat_map(|k| items(&t, k))
        .collect();
    for f in findings {
        if rank(f["severity"].as_str().unwrap()) == 0 {
            continue;
        }
        assert!(
            wanted.iter().any(|w| {
                let mut w = (*w).clone();
                w["min_severity"] = "warning".into();
                matches(f, &w)
            }),
            "{path}: a finding the reading does not support (false alarm): {f:#?}"
        );
    }
}

#[test]
fn corpus_trl_3452_zero_loss_is_the_grpo_display() {
    check("real-logs/trl-3452-loss0-healthy.log");
}

#[test]
fn corpus_trl_ppo_episode_steps_and_no_eos_truncation() {
    check("real-logs/trl-ppo-hongbomiao-37684.log");
}

#[test]
fn corpus_msswift_braceless_dict_gradient_not_flowing() {
    check("real-logs/msswift-5571-gradnorm0.log");
}

#[test]
fn corpus_unsloth_notebook_table_dead_groups_not_zero_loss() {
    check("real-logs/unsloth-2291-notebook-table.md");
}

#[test]
fn corpus_llamafactory_current_steps_and_flat_reward() {
    check("real-logs/llamafactory-856-ppo-trainer_log.jsonl");
}

#[test]
fn corpus_verl_2060_val_step_and_rounded_values_are_healthy() {
    check("real-logs/verl-2060-step0-step1.log");
}

#[test]
fn corpus_verl_7412_ray_prefix_and_soft_wrap() {
    check("real-logs/verl-7412-clip-ratio.log");
    let Some(p) = corpus("real-logs/verl-7412-clip-ratio.log") else {
        return;
    };
    let opts = rlforensics::logscan::ScanOptions {
        keep_raw: true,
        ..Default::default()
    };
    let r = rlforensics::logscan::scan(&[p], &opts).unwrap();
    // The continuation line joins the key the wrap cut (`critic` + `/rewards/min`).
    assert_eq!(
        r.frame.raw("critic/rewards/min").and_then(|c| c.get(0)),
        Some(-1.0)
    );
    assert_eq!(
        r.frame.raw("response_length/min").and_then(|c| c.get(0)),
        Some(38.0)
    );
    assert_eq!(r.files[0].unrecognised_lines, 0);
}

#[test]
fn corpus_mlx_557_healthy_lora() {
    check("real-logs/mlx-557-lora-healthy.log");
}

#[test]
fn corpus_nanogpt_215_loss_nan_and_eval_checkpoint_spike_excluded() {
    check("real-logs/nanogpt-215-loss-nan.log");
}

#[test]
fn corpus_megatron_396_pipe_lines_grad_norm_nan() {
    check("real-logs/megatron-ds-396-gradnorm-nan.log");
}

#[test]
fn corpus_unslothgrpo_imjonezz_dead_groups_kl_and_grad_spikes() {
    check("real-logs/unslothgrpo-imjonezz/trainer_state.json");
}

#[test]
fn corpus_gemma3_healthy_grpo() {
    check("real-logs/gemma3-grpo-abdo/trainer_state.json");
}

#[test]
fn corpus_aaipl_truncation_and_zero_grad_with_signal() {
    check("real-logs/aaipl-grpo-srinath/trainer_state.json");
}

#[test]
fn corpus_droid_distill_zero_loss_and_faster_steps() {
    check("real-logs/droid-distill-train.jsonl");
}

#[test]
fn corpus_droid_nested_three_appended_runs() {
    check("real-logs/droid-nested-train_metrics.jsonl");
}

#[test]
fn corpus_debug_run_102145_empty_folder_exits_2() {
    check("droid-finetuning/20251008-102145");
}

#[test]
fn corpus_debug_run_102227_zero_loss_and_empty_completions() {
    check("droid-finetuning/20251008-102227");
}

#[test]
fn corpus_debug_run_110028_zero_loss_dead_groups_empty_completions() {
    check("droid-finetuning/20251008-110028");
}

#[test]
fn corpus_debug_run_115149_clipping_too_high() {
    check("droid-finetuning/20251008-115149");
}

#[test]
fn corpus_debug_run_153042_clipping_too_high_periodic_eval_not_slowdown() {
    check("droid-finetuning/20251008-153042");
}

/// Every corpus path in the truth file has its test above (a new corpus file needs one).
#[test]
fn corpus_truth_file_names_every_corpus_log() {
    let Some(root) = corpus("real-logs") else {
        return;
    };
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real_logs_truth.json"),
    )
    .unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    let listed: Vec<&str> = all["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    let mut missing = Vec::new();
    for e in std::fs::read_dir(&root).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name == "README.md" {
            continue;
        }
        let is_listed = listed.iter().any(|l| {
            l.strip_prefix("real-logs/")
                .is_some_and(|r| r.split('/').next() == Some(&name))
        });
        if !is_listed {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "corpus files without a truth entry: {missing:?}"
    );
    assert_eq!(listed.len(), 20);
}
