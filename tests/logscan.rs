//! logscan over generated fixtures (fixtures/gen/make_logs.py: faults at known steps) and
//! the real DebugTrainer corpus.

use std::path::{Path, PathBuf};

use rlforensics::detect::Severity;
use rlforensics::logs::fastline::fast_record;
use rlforensics::logs::steps::LineQuality;
use rlforensics::logscan::scan::general_record;
use rlforensics::logscan::{scan, ScanOptions, ScanReport};
use rlforensics::model::log::{LogRecord, SourceKind};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/logs")
        .join(p)
}

fn corpus(run: &str) -> Option<PathBuf> {
    crate::corpus::corpus(&format!("droid-finetuning/{run}"))
}

fn run(paths: &[PathBuf]) -> ScanReport {
    scan(paths, &ScanOptions::default()).unwrap()
}

/// Steps listed by the single finding of `detector`.
fn steps_of(r: &ScanReport, detector: &str) -> Vec<i64> {
    let f = r.by_detector(detector);
    assert_eq!(f.len(), 1, "{detector}: {f:?}");
    f[0].steps.clone()
}

fn severity_of(r: &ScanReport, detector: &str) -> Severity {
    r.by_detector(detector)[0].severity
}

#[test]
fn healthy_run_has_no_findings() {
    let r = run(&[fixture("healthy")]);
    assert_eq!(r.steps, 60);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn debug_faults_each_detector_fires_at_its_steps() {
    let r = run(&[fixture("debug_faults")]);
    assert_eq!(r.steps, 100);
    assert_eq!(steps_of(&r, "zero-loss"), (20..25).collect::<Vec<_>>());
    assert_eq!(severity_of(&r, "zero-loss"), Severity::Error);
    assert_eq!(steps_of(&r, "zero-grad"), (20..25).collect::<Vec<_>>());
    assert_eq!(steps_of(&r, "truncation"), vec![30, 31, 32]);
    assert_eq!(severity_of(&r, "truncation"), Severity::Error);
    assert_eq!(steps_of(&r, "nan-grad"), vec![40]);
    assert_eq!(severity_of(&r, "nan-grad"), Severity::Critical);
    let nan = r.by_detector("nan-grad")[0];
    assert_eq!(
        nan.evidence["loss_zero_with_nan_grad_steps"],
        serde_json::json!([40])
    );
    assert_eq!(nan.evidence["nan_gradient_events"], serde_json::json!(1));
    assert_eq!(nan.evidence["max_grad_nan_count"], serde_json::json!(3.0));
    assert_eq!(steps_of(&r, "empty-completions"), vec![45]);
    let empty = r.by_detector("empty-completions")[0];
    assert_eq!(empty.evidence["events"], serde_json::json!(1)); // duplicate dropped
    assert_eq!(
        empty.evidence["empty_completions_in_events"],
        serde_json::json!(2)
    );
    assert_eq!(steps_of(&r, "grad-spike"), vec![50]);
    assert_eq!(steps_of(&r, "adv-explosion"), vec![55]);
    let mut dead: Vec<i64> = (20..25).collect();
    dead.extend(60..90);
    assert_eq!(r.by_detector("dead-groups")[0].count, 35);
    assert_eq!(steps_of(&r, "dead-groups"), dead);
    assert_eq!(steps_of(&r, "kl-explosion"), vec![70]);
    assert_eq!(steps_of(&r, "kl-negative"), vec![75]);
    assert_eq!(steps_of(&r, "logprob-mismatch"), vec![80]);
    assert_eq!(
        steps_of(&r, "entropy-collapse"),
        (90..100).collect::<Vec<_>>()
    );
    assert_eq!(steps_of(&r, "mem-growth"), vec![0, 99]);
    assert_eq!(steps_of(&r, "plateau"), vec![0, 99]);
    // slowdown: the spike at 65 (warning) and the compile step 0 (info), kept apart.
    let slow = r.by_detector("slowdown");
    assert_eq!(slow.len(), 2);
    let spike = slow
        .iter()
        .find(|f| f.severity == Severity::Warning)
        .unwrap();
    assert_eq!(spike.steps, vec![65]);
    let compile = slow.iter().find(|f| f.severity == Severity::Info).unwrap();
    assert_eq!(compile.steps, vec![0]);
    assert_eq!(r.findings.len(), 16);
}

#[test]
fn truncated_last_line_null_and_type_change_are_reported_not_fatal() {
    let r = run(&[fixture("debug_faults/steps.jsonl")]);
    let f = &r.files[0];
    assert_eq!(f.lines, 101);
    assert_eq!(f.records, 100);
    assert!(f.truncated_last_line);
    assert_eq!(f.bad_line_count, 1);
    assert_eq!(f.bad_lines[0].line, 101);
    assert_eq!(f.nulls, 1);
    assert_eq!(f.non_finite, 1);
    assert_eq!(f.type_changes.len(), 1);
    assert_eq!(f.type_changes[0].key, "lr");
    assert_eq!(
        (f.type_changes[0].first_line, f.type_changes[0].line),
        (1, 11)
    );
    // The string "1e-05" is still read as a number.
    assert_eq!(r.frame.at("lr", 10), Some(1e-5));
}

#[test]
fn selected_detectors_only() {
    let opts = ScanOptions {
        detectors: vec!["zero-loss".into(), "nan-grad".into()],
        ..ScanOptions::default()
    };
    let r = scan(&[fixture("debug_faults")], &opts).unwrap();
    let mut names: Vec<&str> = r.findings.iter().map(|f| f.detector.as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["nan-grad", "zero-loss"]);
}

#[test]
fn threshold_override_changes_result() {
    let opts = ScanOptions {
        thresholds: vec!["grad_spike.factor=100".into()],
        detectors: vec!["grad-spike".into()],
        ..ScanOptions::default()
    };
    let r = scan(&[fixture("debug_faults")], &opts).unwrap();
    assert!(r.findings.is_empty());
}

#[test]
fn verl_jsonl_null_is_nan_and_clip_ratio_truncation() {
    let r = run(&[fixture("verl/metrics.jsonl")]);
    assert_eq!(r.steps, 20);
    assert_eq!(r.files[0].format, "verl_jsonl");
    assert_eq!(steps_of(&r, "nan-grad"), vec![7]);
    assert_eq!(steps_of(&r, "truncation"), vec![10, 11, 12]);
    assert_eq!(r.findings.len(), 2);
}

#[test]
fn hf_trainer_state_kl_negative_and_dead_groups() {
    let r = run(&[fixture("hf/trainer_state.json")]);
    assert_eq!(r.steps, 10);
    assert_eq!(steps_of(&r, "kl-negative"), vec![30, 40]);
    assert_eq!(severity_of(&r, "dead-groups"), Severity::Error);
    assert_eq!(r.findings.len(), 2);
}

#[test]
fn nanogpt_seed_lines_zero_loss_and_slow_steps() {
    let r = run(&[fixture("text/nanogpt_seed.log")]);
    assert_eq!(r.frame.steps().to_vec(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(r.frame.at("step_time", 1), Some(103634.20 / 1000.0));
    assert_eq!(steps_of(&r, "zero-loss"), vec![1, 2, 3, 4, 5]);
    let z = r.by_detector("zero-loss")[0];
    assert_eq!(
        z.evidence["companions"],
        serde_json::json!(["reward_std = 0", "advantages = 0", "kl = 0"])
    );
    assert_eq!(steps_of(&r, "slowdown"), vec![1, 2, 3, 4, 5]);
    assert_eq!(r.event_counts["advantages_near_zero"], 10);
}

#[test]
fn trl_dict_nan_hidden_as_zero_loss() {
    let r = run(&[fixture("text/trl_stdout.log")]);
    assert_eq!(r.steps, 8);
    assert_eq!(r.files[0].unrecognised_lines, 1);
    assert_eq!(steps_of(&r, "nan-grad"), vec![3]);
    let f = r.by_detector("nan-grad")[0];
    assert_eq!(
        f.evidence["loss_zero_with_nan_grad_steps"],
        serde_json::json!([3])
    );
    assert!(r.by_detector("zero-loss").is_empty());
}

#[test]
fn verl_console_entropy_collapse() {
    let r = run(&[fixture("text/verl_console.log")]);
    assert_eq!(r.steps, 20);
    assert_eq!(
        steps_of(&r, "entropy-collapse"),
        (12..=20).collect::<Vec<_>>()
    );
    assert_eq!(r.findings.len(), 1);
}

#[test]
fn mlx_report_zero_loss() {
    let r = run(&[fixture("text/mlx_report.log")]);
    assert_eq!(r.frame.steps().to_vec(), vec![1, 10, 20, 30, 40, 50]);
    assert_eq!(steps_of(&r, "zero-loss"), vec![10, 20, 30, 40]);
}

#[test]
fn parquet_export_round_trips() {
    use polars::prelude::{ParquetReader, SerReader};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("frame.parquet");
    let opts = ScanOptions {
        keep_raw: true,
        ..ScanOptions::default()
    };
    let r = scan(&[fixture("healthy")], &opts).unwrap();
    r.frame.write_parquet(&out).unwrap();
    // Read the file back and compare with the numbers of steps.jsonl itself.
    let back = ParquetReader::new(std::fs::File::open(&out).unwrap())
        .finish()
        .unwrap();
    assert_eq!(back.height(), 60);
    let text = std::fs::read_to_string(fixture("healthy/steps.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 60);
    let col = |name: &str| -> Vec<Option<f64>> {
        let c = back
            .column(name)
            .unwrap()
            .cast(&polars::prelude::DataType::Float64)
            .unwrap();
        let ca = c.f64().unwrap();
        (0..ca.len()).map(|i| ca.get(i)).collect()
    };
    let want = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| -> Vec<Option<f64>> {
        lines.iter().map(f).collect()
    };
    assert_eq!(col("step"), want(&|l| l["step"].as_f64()));
    assert_eq!(col("timestamp"), want(&|l| l["timestamp"].as_f64()));
    assert_eq!(col("grad_norm"), want(&|l| l["grad_norm"].as_f64()));
    assert_eq!(
        col("truncation_ratio"),
        want(&|l| l["metrics"]["hit_max_tokens_ratio"].as_f64())
    );
    assert_eq!(
        col("raw:metrics.hit_max_tokens_ratio"),
        want(&|l| l["metrics"]["hit_max_tokens_ratio"].as_f64())
    );
    assert_eq!(
        col("reward_std"),
        want(&|l| l["metrics"]["reward_std"].as_f64())
    );
    let src = back.column("source").unwrap().str().unwrap().clone();
    let sources: Vec<Option<&str>> = (0..src.len()).map(|i| src.get(i)).collect();
    // events.jsonl's val_report rows (iterations 0, 20, 40) add to those steps' rows.
    let val: Vec<i64> = std::fs::read_to_string(fixture("healthy/events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "val_report")
        .map(|e| e["iteration"].as_i64().unwrap())
        .collect();
    assert_eq!(val, [0, 20, 40]);
    for (i, s) in sources.iter().enumerate() {
        let want = if val.contains(&(i as i64)) {
            "steps+events"
        } else {
            "steps"
        };
        assert_eq!(*s, Some(want), "row {i}");
    }
    // Every column of the file equals the in-memory frame's, nulls where it has none.
    let df = r.frame.to_polars().unwrap();
    assert_eq!(back.get_column_names(), df.get_column_names());
    assert!(back.equals_missing(&df));
}

/// What a human sees in run 20251008-102227 (GRPO, token-level IS): stopped after
/// iteration 20 of 200; train reports at 10 and 20 have loss 0.0, reward mean/std 0,
/// grouped std 0, kl 0; every generation has 2 of 4 completions empty (each event
/// written twice, its step field stuck at 0).
#[test]
fn corpus_102227_zero_loss_dead_groups_empty_completions() {
    let Some(dir) = corpus("20251008-102227") else {
        return;
    };
    let r = run(&[dir]);
    assert_eq!(r.frame.steps().to_vec(), vec![1, 10, 20]);
    assert_eq!(steps_of(&r, "zero-loss"), vec![10, 20]);
    assert_eq!(steps_of(&r, "dead-groups"), vec![10, 20]);
    assert_eq!(severity_of(&r, "dead-groups"), Severity::Error);
    let e = r.by_detector("empty-completions")[0];
    assert_eq!(e.severity, Severity::Error);
    assert_eq!(e.evidence["events"], serde_json::json!(5));
    assert_eq!(
        e.evidence["empty_completions_in_events"],
        serde_json::json!(10)
    );
    assert_eq!(
        e.evidence["completions_in_event_batches"],
        serde_json::json!(20)
    );
    let ev = &r
        .files
        .iter()
        .find(|f| f.path.ends_with("events.jsonl"))
        .unwrap();
    assert_eq!(ev.duplicate_events, 5);
    assert_eq!(r.findings.len(), 3);
    assert!(r.by_detector("nan-grad").is_empty());
}

/// What a human sees in run 20251008-110028 (GSPO, sequence-level IS, 200 iterations):
/// loss exactly 0 with grouped reward std 0 and kl 0 at iterations 10-40; after that small
/// non-zero losses but grouped reward std 0 in 12 of 20 reports; reward mean never
/// improves (0-0.15); 2 of 4 completions empty in most generations (80 events, 40 unique);
/// memory flat (5.04 -> 5.10 GB), throughput noisy but no trend, kl small and positive.
#[test]
fn corpus_110028_zero_loss_then_dead_groups_and_plateau() {
    let Some(dir) = corpus("20251008-110028") else {
        return;
    };
    let r = run(&[dir]);
    assert_eq!(r.steps, 21);
    assert_eq!(steps_of(&r, "zero-loss"), vec![10, 20, 30, 40]);
    assert_eq!(
        steps_of(&r, "dead-groups"),
        vec![10, 20, 30, 40, 60, 70, 80, 90, 120, 140, 150, 160]
    );
    assert_eq!(severity_of(&r, "dead-groups"), Severity::Warning);
    assert_eq!(steps_of(&r, "plateau"), vec![10, 200]);
    let e = r.by_detector("empty-completions")[0];
    assert_eq!(e.evidence["events"], serde_json::json!(40));
    assert_eq!(
        e.evidence["empty_completions_in_events"],
        serde_json::json!(67)
    );
    assert_eq!(
        e.evidence["completions_in_event_batches"],
        serde_json::json!(160)
    );
    for silent in [
        "nan-grad",
        "kl-negative",
        "kl-explosion",
        "mem-growth",
        "slowdown",
        "grad-spike",
    ] {
        assert!(r.by_detector(silent).is_empty(), "{silent} fired");
    }
    assert_eq!(r.findings.len(), 4);
}

#[test]
fn cli_exit_codes() {
    use assert_cmd::Command;
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(fixture("healthy"))
        .assert()
        .code(0);
    Command::cargo_bin("logscan")
        .unwrap()
        .args([
            fixture("debug_faults/steps.jsonl").as_os_str(),
            "--zero-loss".as_ref(),
            "--nan-grad".as_ref(),
        ])
        .assert()
        .code(1);
    // Findings below --fail-on: clean exit.
    Command::cargo_bin("logscan")
        .unwrap()
        .args([
            fixture("debug_faults").as_os_str(),
            "--plateau".as_ref(),
            "--fail-on".as_ref(),
            "error".as_ref(),
        ])
        .assert()
        .code(0);
    Command::cargo_bin("logscan")
        .unwrap()
        .arg("/no/such/file.jsonl")
        .assert()
        .code(2)
        .stderr(predicates::str::contains("/no/such/file.jsonl"));
}

#[test]
fn cli_output_json_has_schema_version() {
    use assert_cmd::Command;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.json");
    Command::cargo_bin("logscan")
        .unwrap()
        .args([
            fixture("verl").as_os_str(),
            "--output".as_ref(),
            out.as_os_str(),
            "--format".as_ref(),
            "markdown".as_ref(),
        ])
        .assert()
        .code(1)
        .stdout(predicates::str::contains("| critical | nan-grad | 7 |"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["findings"][0]["detector"], "nan-grad");
    assert_eq!(v["findings"][0]["first_step"], 7);
}

#[test]
fn plot_flag_draws_key_metrics_with_findings_marked() {
    use clap::Parser;
    use rlforensics::cli::logscan::{run as cli_run, LogscanArgs};
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("debug_faults");
    let go = |out: &Path| {
        let a = LogscanArgs::try_parse_from([
            "logscan".as_ref(),
            f.as_os_str(),
            "--plot".as_ref(),
            out.as_os_str(),
        ])
        .unwrap();
        cli_run(&a, false)
    };
    let png = dir.path().join("m.png");
    assert_eq!(go(&png).unwrap().code, 1);
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    let svg = dir.path().join("m.svg");
    go(&svg).unwrap();
    let s = std::fs::read_to_string(&svg).unwrap();
    for title in [
        "Loss",
        "Reward mean ± std",
        "Grad norm",
        "KL",
        "Entropy",
        "Peak memory (GB)",
    ] {
        assert!(s.contains(title), "{title}");
    }
    for detector in [
        "nan-grad",
        "grad-spike",
        "kl-explosion",
        "entropy-collapse",
        "truncation",
    ] {
        assert!(s.contains(detector), "{detector} not marked");
    }
    let e = go(&dir.path().join("m.gif")).unwrap_err().to_string();
    assert!(e.contains("must end in .png or .svg"), "{e}");
}

/// Lines the fast path must read exactly as the general (`parse_value`) path does.
const TRICKY_LINES: &[&str] = &[
    r#"{"step": 0, "train_loss": NaN, "grad_norm": -Infinity, "lr": Infinity, "metrics": {"kl": 0.5, "deep": {"x": -0.0, "y": 1e-320}}}"#,
    r#"{"step": 1, "train_loss": null, "token_count_summary": {"min": 0, "max": 120, "mean": 60.5, "empty_count": 2}, "timestamp": 1759944000.25}"#,
    r#"{"step": "7", "train_loss": "0.5", "kl": "nan", "tag": "run-1", "ok": true, "bad": false, "xs": [1, [2, {"a": NaN}], "s"]}"#,
    r#"{"iteration": 3.0, "loss": 12345678901234567, "big": 123456789012345678901234, "neg": -9223372036854775808, "u": 18446744073709551615}"#,
    r#"{"step": 2, "name": "caf\u00e9", "train_loss": 0.1, "uni": "naïve ✓", "ключ": 1.5}"#,
    r#"{"step": 4, "data": {"actor/pg_loss": null, "actor/grad_norm": 0.2, "timestamp": 99.5, "nested": {"a": 1}}, "timestamp": null}"#,
    r#"{"step": null, "data": {"critic/score/mean": 0.25}, "_timestamp": true}"#,
    r#"{"global_step": 9, "step": "x", "data": 3, "wall_time": "12", "empty": {}, "e2": []}"#,
    r#"{"train_loss": 0.0, "metrics": {"step": 5, "timestamp": 3}}"#,
    r#"  {"step":5,"train_loss":1E+2,"x":0.000001,"y":-12.5e-3,"z":0e5}  "#,
    r#"{"step": 6, "train_loss": 0.1, "train_loss2": 1e400}"#,
    r#"{"step": 6, "a": 1, "a": 2, "step": 7}"#,
    r#"{"step": 8, "msg": "NaN at -Infinity", "k": "~", "t": "\t"}"#,
    r#"{"step": 10, "train_loss": 0.3, "grad_norm": 0.1"#,
    r#"{"step": 11, "train_loss": 0.3,}"#,
    r#"{"step": 12, "x": 01}"#,
    r#"{"step": 13, "x": -NaN}"#,
    r#"{"step": 14, "x": NaNx}"#,
    r#"{"step": 15, "x": 1.}"#,
    r#"{"step": 16} {"step": 17}"#,
    r#"{"timestamp": 1.5, "event": "train_report", "iteration": 10, "train_loss": 0.0}"#,
    r#"{"step": 18, "x": tru}"#,
    r#"[1, 2]"#,
    r#"{}"#,
];

fn same_record(a: &(LogRecord, LineQuality), b: &(LogRecord, LineQuality)) -> bool {
    let bits = |r: &LogRecord| -> Vec<(String, u64)> {
        r.fields
            .iter()
            .map(|(k, v)| (k.clone(), v.to_bits()))
            .collect()
    };
    a.0.step == b.0.step
        && a.0.timestamp.map(f64::to_bits) == b.0.timestamp.map(f64::to_bits)
        && a.0.source == b.0.source
        && a.0.line == b.0.line
        && bits(&a.0) == bits(&b.0)
        && a.1 == b.1
}

#[test]
fn fast_path_matches_general_path_on_tricky_lines() {
    let mut fast_taken = 0;
    for (i, line) in TRICKY_LINES.iter().enumerate() {
        let general = general_record(line, 0, i as u64 + 1);
        // Declined lines go to the general path, whatever it makes of them.
        if let Some(fast) = fast_record(line, 0, i as u64 + 1) {
            fast_taken += 1;
            let general = general.unwrap_or_else(|| panic!("fast took a bad line: {line}"));
            assert!(
                same_record(&fast, &general),
                "{line}\nfast:    {fast:?}\ngeneral: {general:?}"
            );
        }
    }
    // The ordinary shapes must take the fast path.
    assert!(fast_taken >= 9, "fast path taken on {fast_taken} lines");
    for line in &TRICKY_LINES[..2] {
        assert!(fast_record(line, 0, 1).is_some(), "{line}");
    }
    assert!(fast_record(TRICKY_LINES[5], 0, 1).is_some());
}

#[test]
fn fast_path_declines_what_it_cannot_read_exactly() {
    // Escapes, truncation, trailing commas, bad numbers, events, repeated step keys.
    for line in [
        r#"{"step": 2, "name": "caf\u00e9"}"#,
        r#"{"step": 10, "train_loss": 0.3, "grad_norm": 0.1"#,
        r#"{"step": 11, "train_loss": 0.3,}"#,
        r#"{"step": 12, "x": 01}"#,
        r#"{"step": 13, "x": -NaN}"#,
        r#"{"step": 6, "train_loss2": 1e400}"#,
        r#"{"step": 6, "a": 1, "step": 7}"#,
        r#"{"timestamp": 1.5, "event": "train_report", "iteration": 10}"#,
        r#"{"loss": 123456789012345678901234}"#,
        r#"[1, 2]"#,
    ] {
        assert!(fast_record(line, 0, 1).is_none(), "{line}");
    }
}

#[test]
fn fast_path_reads_a_steps_line() {
    let (r, q) = fast_record(
        r#"{"step": 3, "train_loss": NaN, "grad_norm": null, "metrics": {"kl": 0.5, "tag": "x"}, "token_count_summary": {"min": 0, "empty_count": 2}, "timestamp": 12.5}"#,
        0,
        7,
    )
    .unwrap();
    assert_eq!(r.step, Some(3));
    assert_eq!(r.timestamp, Some(12.5));
    assert_eq!(r.source, SourceKind::Steps);
    let keys: Vec<&str> = r.fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "train_loss",
            "metrics.kl",
            "token_count_summary.min",
            "token_count_summary.empty_count"
        ]
    );
    assert!(r.fields[0].1.is_nan());
    assert_eq!((q.nulls, q.non_finite), (1, 1));
    assert_eq!(q.types, vec![("metrics.tag".to_string(), "str")]);
}

/// A file mixing fast and general lines (escapes, events, a truncated tail) scans to the
/// same report as the same lines would one by one.
#[test]
fn mixed_fast_and_general_lines_fold_in_order() {
    let dir = std::env::temp_dir().join(format!("rlf-fastmix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("steps.jsonl");
    let mut text = String::new();
    for s in 0..2000 {
        if s % 7 == 3 {
            text.push_str(&format!(
                "{{\"step\": {s}, \"train_loss\": 0.5, \"note\": \"a\\u00e9\", \"grad_norm\": 1}}\n"
            ));
        } else if s == 1000 {
            text.push_str(&format!(
                "{{\"step\": {s}, \"train_loss\": \"0.25\", \"grad_norm\": NaN}}\n"
            ));
        } else {
            text.push_str(&format!(
                "{{\"step\": {s}, \"train_loss\": 0.5, \"grad_norm\": 1.0}}\n"
            ));
        }
    }
    text.push_str("{\"step\": 2000, \"train_lo");
    std::fs::write(&p, &text).unwrap();
    let r = run(&[p]);
    assert_eq!(r.steps, 2000);
    let f = &r.files[0];
    assert_eq!(f.records, 2000);
    assert_eq!(f.lines, 2001);
    assert!(f.truncated_last_line);
    assert_eq!(f.bad_line_count, 1);
    assert_eq!(f.non_finite, 1);
    assert_eq!(f.type_changes.len(), 1, "{:?}", f.type_changes);
    assert_eq!(f.type_changes[0].key, "train_loss");
    assert_eq!(f.type_changes[0].line, 1001);
    assert!(r.frame.at("grad_norm", 1000).unwrap().is_nan());
    assert_eq!(r.frame.at("loss", 1000), Some(0.25));
    std::fs::remove_dir_all(&dir).ok();
}

/// Every fixture input a detector is run on in these tests.
fn fixture_inputs() -> Vec<PathBuf> {
    [
        "debug_faults",
        "healthy",
        "verl/metrics.jsonl",
        "hf/trainer_state.json",
        "text/nanogpt_seed.log",
        "text/trl_stdout.log",
        "text/verl_console.log",
        "text/mlx_report.log",
        "crash/torchrun_oom.log",
        "crash/handled_ray.log",
        "stacks/deepspeed_chat_444.log",
        "stacks/minimind_26_pretrain.log",
        "stacks/slime_1837_rollout.log",
        "stacks/transformers524_progress.log",
        "stacks/trl_dpo_570.log",
        "stacks/trl_kto_1447.log",
        "stacks/verl_498_vf_loss_nan.log",
    ]
    .iter()
    .map(|p| fixture(p))
    .collect()
}

/// Runs each detector alone on each input and demands exactly its findings from the run of
/// every detector; returns how many findings were compared.
fn each_detector_alone_matches_all(inputs: &[PathBuf]) -> usize {
    let names: Vec<&str> = rlforensics::detect::all_detectors()
        .iter()
        .map(|d| d.name())
        .collect();
    assert_eq!(names.len(), 24);
    let mut compared = 0;
    for input in inputs {
        let all = run(std::slice::from_ref(input));
        assert_eq!(
            all.frame.projection(),
            &rlforensics::frames::log::frame::Projection::All
        );
        for name in &names {
            let opts = ScanOptions {
                detectors: vec![name.to_string()],
                ..ScanOptions::default()
            };
            let alone = scan(std::slice::from_ref(input), &opts).unwrap();
            let want: Vec<_> = all.by_detector(name);
            // A cause's "(see other-detector)" pointer names only detectors that fired when
            // all ran, and every one when a detector runs alone: compared without it.
            let uncited = |v: serde_json::Value| -> serde_json::Value {
                let text = v.to_string();
                let mut out = String::new();
                let mut rest = text.as_str();
                while let Some(i) = rest.find(" (see ") {
                    out.push_str(&rest[..i]);
                    rest = &rest[i..];
                    rest = &rest[rest.find(')').map_or(rest.len(), |j| j + 1)..];
                }
                out.push_str(rest);
                serde_json::from_str(&out).unwrap()
            };
            let want = uncited(serde_json::to_value(&want).unwrap());
            let got = uncited(serde_json::to_value(&alone.findings).unwrap());
            assert_eq!(got, want, "{name} on {}", input.display());
            compared += alone.findings.len();
            // The report still lists every metric the logs have.
            assert_eq!(alone.metrics, all.metrics, "{name} on {}", input.display());
            assert_ne!(
                alone.frame.projection(),
                &rlforensics::frames::log::frame::Projection::All
            );
        }
    }
    compared
}

/// A detector run alone keeps only the metrics it declares (the frame's projection); its
/// findings must be exactly those it has in a run of every detector, on every input. In
/// debug builds a read of an undeclared metric also fails the run outright.
/// Findings the fixture inputs give across the 24 detectors run alone (the two crash logs:
/// one `crash` finding each; nanogpt_seed one `stages` and the plateau rule's collapse of its
/// reward to 0 from iteration 1; the stacks logs 13: deepspeed-chat, kto and verl one each,
/// slime two (truncation, and the info note that its dead-group counts lack the group
/// count), transformers 8 with empty-completions' one-token rule).
const FIXTURE_FINDINGS: usize = 44;

#[test]
fn each_detector_alone_finds_what_it_finds_among_all() {
    let compared = each_detector_alone_matches_all(&fixture_inputs());
    // The fixtures alone (no corpus) make every detector fire somewhere.
    assert_eq!(compared, FIXTURE_FINDINGS, "{compared}");
}

/// The same on the real DebugTrainer runs of the corpus.
#[test]
fn corpus_each_detector_alone_finds_what_it_finds_among_all() {
    let runs: Vec<PathBuf> = ["20251008-102227", "20251008-110028"]
        .iter()
        .filter_map(|r| corpus(r))
        .collect();
    if runs.is_empty() {
        return;
    }
    assert!(each_detector_alone_matches_all(&runs) > 0);
}

#[test]
fn zero_loss_and_nan_grad_keep_only_their_columns() {
    use rlforensics::frames::log::frame::Projection;
    let opts = ScanOptions {
        detectors: vec!["zero-loss".into(), "nan-grad".into()],
        ..ScanOptions::default()
    };
    let Projection::Only {
        metrics,
        timestamps,
    } = opts.projection()
    else {
        panic!("a selection projects");
    };
    assert!(!timestamps);
    let mut metrics = metrics;
    metrics.sort();
    assert_eq!(
        metrics,
        [
            "adv_max",
            "adv_min",
            "aux_grad_norm",
            "aux_loss",
            "critic_grad_norm",
            "critic_loss",
            "entropy",
            "frac_reward_zero_std",
            "grad_nan_count",
            "grad_norm",
            "kl",
            "loss",
            "loss_unprinted",
            "ppo_kl",
            "pref_accuracy",
            "pref_log_odds_ratio",
            "pref_logp_chosen",
            "pref_logp_rejected",
            "pref_margin",
            "pref_reward_chosen",
            "pref_reward_rejected",
            "reward_mean",
            "reward_std",
        ]
    );
    let r = scan(&[fixture("debug_faults")], &opts).unwrap();
    let all = run(&[fixture("debug_faults")]);
    assert!(r.frame.heap_bytes() < all.frame.heap_bytes());
    assert_eq!(r.metrics.len(), all.metrics.len());
    // --export (raw columns) and no selection keep everything.
    let export = ScanOptions {
        keep_raw: true,
        ..opts.clone()
    };
    assert_eq!(export.projection(), Projection::All);
    assert_eq!(ScanOptions::default().projection(), Projection::All);
}

#[test]
fn plot_with_one_detector_still_draws_every_panel() {
    use clap::Parser;
    use rlforensics::cli::logscan::{run as cli_run, LogscanArgs};
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("debug_faults");
    let draw = |out: &Path, only: &[&str]| {
        let mut argv: Vec<std::ffi::OsString> = vec![
            "logscan".into(),
            f.clone().into(),
            "--plot".into(),
            out.into(),
        ];
        argv.extend(only.iter().map(|d| format!("--{d}").into()));
        cli_run(&LogscanArgs::try_parse_from(argv).unwrap(), false).unwrap();
        std::fs::read_to_string(out).unwrap()
    };
    let alone = draw(&dir.path().join("one.svg"), &["zero-loss"]);
    let all = draw(&dir.path().join("all.svg"), &[]);
    for title in [
        "Loss",
        "Reward mean ± std",
        "Grad norm",
        "KL",
        "Entropy",
        "Completion length (tokens)",
        "Step time (s)",
        "Peak memory (GB)",
    ] {
        assert!(alone.contains(title), "{title}");
        assert!(all.contains(title), "{title}");
    }
    // Same lines; only the marks of the detectors that did not run are missing.
    assert!(all.contains("kl-explosion") && !alone.contains("kl-explosion"));
    assert!(alone.contains("zero-loss"));
}

/// A log read through a FIFO (`logscan <(zcat steps.jsonl.gz)`) gives the report the file
/// gives: the bytes read to tell the file's kind are not lost (they were once: the pipe
/// was opened twice and the first 4 KB, 10 steps, vanished).
#[cfg(unix)]
#[test]
fn a_log_piped_through_a_fifo_scans_like_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "debug_faults/steps.jsonl",
        "text/nanogpt_seed.log",
        "hf/trainer_state.json",
    ] {
        let src = fixture(name);
        let fifo = dir.path().join("pipe");
        let _ = std::fs::remove_file(&fifo);
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let (bytes, f) = (std::fs::read(&src).unwrap(), fifo.clone());
        // The steps and text logs are longer than the 4 KB read to tell the kind; the
        // trainer state is told by its content (the pipe's name says nothing).
        assert!(name.ends_with(".json") || bytes.len() > 4096, "{name}");
        let writer = std::thread::spawn(move || std::fs::write(f, bytes).unwrap());
        let piped = run(std::slice::from_ref(&fifo));
        writer.join().unwrap();
        let file = run(&[src]);
        assert_eq!(piped.files[0].lines, file.files[0].lines, "{name}");
        assert_eq!(piped.files[0].bytes, file.files[0].bytes, "{name}");
        assert_eq!(piped.files[0].format, file.files[0].format, "{name}");
        assert_eq!(
            (piped.steps, piped.first_step, piped.last_step),
            (file.steps, file.first_step, file.last_step),
            "{name}"
        );
        assert_eq!(piped.metrics, file.metrics, "{name}");
        let findings = |r: &ScanReport| serde_json::to_string(&r.findings).unwrap();
        assert_eq!(findings(&piped), findings(&file), "{name}");
    }
}

/// Never silent: an input from which nothing was read exits 2 and says what it saw, an
/// empty run folder says it is empty; a partly read text file counts its other lines.
#[test]
fn nothing_read_exits_2_naming_what_was_seen() {
    use assert_cmd::Command;
    let dir = tempfile::tempdir().unwrap();
    let prose = dir.path().join("notes.log");
    std::fs::write(&prose, "\nTraining started on 8 GPUs\nall good so far\n").unwrap();
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&prose)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("read 0 records from"))
        .stderr(predicates::str::contains(
            "first line looks like: Training started on 8 GPUs",
        ));
    let run = dir.path().join("20251008-000000");
    std::fs::create_dir(&run).unwrap();
    std::fs::write(run.join("steps.jsonl"), "").unwrap();
    std::fs::write(run.join("events.jsonl"), "").unwrap();
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&run)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("holds only empty logs"))
        .stderr(predicates::str::contains("nothing to scan"));
    // Partly understood: the records are scanned, the other lines counted in the table.
    let mixed = dir.path().join("mixed.log");
    std::fs::write(
        &mixed,
        "loading model\n{'loss': 0.5, 'grad_norm': 1.0}\nsome warning\n{'loss': 0.4, 'grad_norm': 0.9}\n",
    )
    .unwrap();
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&mixed)
        .assert()
        .code(0)
        .stdout(predicates::str::contains("2 records"))
        .stdout(predicates::str::contains("2 unrecognised text line(s)"));
}

/// An appended log whose step restarts holds several runs: each is scanned on its own (a
/// zero-loss streak at the end of run 1 and the start of run 2 is two streaks, not one).
#[test]
fn step_restart_splits_runs_and_detectors_run_per_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("metrics.jsonl");
    let mut text = String::new();
    for s in 0..4 {
        let loss = if s == 3 { 0.0 } else { 0.5 };
        text.push_str(&format!(
            "{{\"step\": {s}, \"loss\": {loss}, \"reward_std\": 0.0}}\n"
        ));
    }
    for s in 0..3 {
        let loss = if s == 0 { 0.0 } else { 0.5 };
        text.push_str(&format!(
            "{{\"step\": {s}, \"loss\": {loss}, \"reward_std\": 0.0}}\n"
        ));
    }
    std::fs::write(&p, text).unwrap();
    let r = run(&[p]);
    assert_eq!(r.files[0].runs, 2);
    assert_eq!(r.steps, 7);
    assert_eq!(r.frame.run_count(), 2);
    // One zero-loss row per run: no streak of 2 inside either run.
    assert!(r.by_detector("zero-loss").is_empty());
    let runs = r.by_detector("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].severity, Severity::Info);
    assert!(runs[0].explanation.contains("line 5 (step 0)"));
    // Dead groups are found in each run and say which.
    let dead = r.by_detector("dead-groups");
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0].run, Some(0));
    assert!(dead[0].explanation.starts_with("run 1 of 2 (steps 0–3)"));
    assert_eq!(dead[1].steps, vec![0, 1, 2]);
}

/// Slowdown and memory growth judge what is sustained: a periodic slow step (an eval every
/// 5 steps) is excluded and named, a rise of even the fast steps is a slowdown; memory that
/// grows during warm-up and then holds is not a leak, memory that keeps growing is.
#[test]
fn periodic_spikes_and_warm_up_are_not_trends() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, f: &dyn Fn(i64) -> (f64, f64)| {
        let p = dir.path().join(name);
        let text: String = (0..40)
            .map(|s| {
                let (t, m) = f(s);
                format!("{{\"step\": {s}, \"loss\": 0.5, \"step_time\": {t}, \"peak_memory_gb\": {m}}}\n")
            })
            .collect();
        std::fs::write(&p, text).unwrap();
        run(&[p])
    };
    // Every 5th step takes 10x longer; memory 10 -> 13 GB over 4 steps, then flat.
    let r = write("periodic.jsonl", &|s| {
        let t = if s % 5 == 4 { 10.0 } else { 1.0 };
        let m = 10.0 + (s.min(4) as f64) * 0.75;
        (t, m)
    });
    let slow = r.by_detector("slowdown");
    assert_eq!(slow.len(), 1, "{slow:#?}");
    assert_eq!(slow[0].severity, Severity::Info);
    assert!(slow[0].explanation.contains("periodic every 5 steps"));
    assert!(r.by_detector("mem-growth").is_empty());
    // Every step slower than the last by 5 %; memory +1 % a step throughout.
    let r = write("trend.jsonl", &|s| {
        (1.05f64.powi(s as i32), 10.0 * 1.01f64.powi(s as i32))
    });
    let trend: Vec<_> = r
        .by_detector("slowdown")
        .into_iter()
        .filter(|f| f.severity == Severity::Warning)
        .collect();
    assert_eq!(trend.len(), 1, "{trend:#?}");
    assert!(trend[0].explanation.contains("slow down over the run"));
    assert_eq!(r.by_detector("mem-growth").len(), 1);
}
