//! Tracker files (fixtures/gen/make_trackers.py: TensorBoard and W&B written by the real
//! packages offline, faults at known steps) and `logscan --compare`. Values are checked
//! against the manifest, which holds what tbparse and wandb's own protobuf classes read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::str::contains;
use rlforensics::logs::trackers::{self, TrackerKind};
use rlforensics::logscan::compare::{compare_reports, CompareReport};
use rlforensics::logscan::{scan, ScanOptions, ScanReport};
use rlforensics::model::log::SourceKind;

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/trackers")
        .join(p)
}

fn manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `{key: {step: value}}` of a manifest table, `"NaN"` read as NaN.
fn table(v: &serde_json::Value) -> BTreeMap<String, BTreeMap<i64, f64>> {
    let mut out = BTreeMap::new();
    for (k, steps) in v.as_object().unwrap() {
        let mut m = BTreeMap::new();
        for (s, x) in steps.as_object().unwrap() {
            let x = match x {
                serde_json::Value::String(t) if t == "NaN" => f64::NAN,
                other => other.as_f64().unwrap(),
            };
            m.insert(s.parse::<i64>().unwrap(), x);
        }
        out.insert(k.clone(), m);
    }
    out
}

/// Every tracker file under `dir`, read with the raw keys: `{key: {step: value}}`.
fn read_dir(dir: &Path) -> (BTreeMap<String, BTreeMap<i64, f64>>, Vec<SourceKind>) {
    let mut out: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    let mut sources = Vec::new();
    let files = trackers::find_in_dir(dir).unwrap();
    assert!(!files.is_empty(), "{}", dir.display());
    for (i, f) in files.iter().enumerate() {
        let kind = trackers::sniff(f, b"").unwrap();
        let input = std::fs::File::open(f).unwrap();
        trackers::read(kind, f, input, i, &mut |r| {
            sources.push(r.source);
            for (k, v) in &r.fields {
                let prev = out
                    .entry(k.clone())
                    .or_default()
                    .insert(r.step.unwrap(), *v);
                assert!(prev.is_none(), "{k} twice at {:?}", r.step);
            }
        })
        .unwrap();
    }
    (out, sources)
}

/// Exact equality, NaN equal to NaN.
fn assert_same(
    got: &BTreeMap<String, BTreeMap<i64, f64>>,
    want: &BTreeMap<String, BTreeMap<i64, f64>>,
) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (k, w) in want {
        let g = &got[k];
        assert_eq!(g.len(), w.len(), "{k}");
        for (s, x) in w {
            let y = g[s];
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{k} step {s}: got {y}, the package's reader {x}"
            );
        }
    }
}

#[test]
fn tensorboard_values_equal_tbparse_simple_and_tensor_scalars() {
    let m = manifest();
    for run in ["a", "b"] {
        let (got, sources) = read_dir(&fixture(&format!("tb/run_{run}")));
        assert_same(&got, &table(&m["runs"][run]["tensorboard"]));
        assert!(sources.iter().all(|s| *s == SourceKind::Tensorboard));
        // 6 simple_value tags in the main file, 2 tensor tags in timing/.
        assert_eq!(got.len(), 8);
        assert!(got["train/grad_norm"][&17].is_nan());
        // The tensor-encoded double keeps its 64 bits; simple_value is float32.
        let logged = m["runs"][run]["logged"]["timing_s/step"][3]
            .as_f64()
            .unwrap();
        assert_eq!(got["timing_s/step"][&3], logged);
    }
}

#[test]
fn wandb_values_equal_wandb_records_and_config_is_read() {
    let m = manifest();
    for run in ["a", "b"] {
        let dir = fixture(&format!("wandb/run_{run}"));
        let (got, sources) = read_dir(&dir);
        assert_same(&got, &table(&m["runs"][run]["wandb"]));
        assert!(sources.iter().all(|s| *s == SourceKind::Wandb));
        assert!(
            got["train/grad_norm"][&17].is_nan(),
            "bare NaN in value_json"
        );
        let cfg = trackers::run_config(&dir).unwrap();
        let lr = m["runs"][run]["wandb_config"]["learning_rate"]
            .as_f64()
            .unwrap();
        assert_eq!(cfg["learning_rate"].parse::<f64>().unwrap(), lr);
        assert_eq!(cfg["model"], "Qwen2.5-0.5B");
        assert_eq!(cfg["num_generations"], "8");
        assert!(!cfg.keys().any(|k| k.starts_with("_wandb")), "{cfg:?}");
    }
}

#[test]
fn mlflow_file_store_values_equal_mlflow_client_and_params_are_config() {
    let m = manifest();
    for run in ["a", "b"] {
        let dir = fixture(&format!("mlflow/run_{run}"));
        let (got, sources) = read_dir(&dir);
        assert_same(&got, &table(&m["runs"][run]["mlflow"]));
        assert!(sources.iter().all(|s| *s == SourceKind::Mlflow));
        let cfg = trackers::run_config(&dir).unwrap();
        let want: BTreeMap<String, String> = m["runs"][run]["mlflow_params"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        assert_eq!(cfg, want);
    }
    // MLflow params are text as written (`1e-06`), W&B config JSON (`0.000001`): the same.
    let same = compare_dirs("mlflow/run_a", "wandb/run_a");
    assert!(!same.diverged);
    assert_eq!(same.config_differences.map(|d| d.len()), Some(0));
    let r = compare_dirs("mlflow/run_a", "wandb/run_b");
    assert_eq!(r.first_divergence, Some(("kl".to_string(), 20)));
    let d = r.config_differences.unwrap();
    assert_eq!(
        d.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["learning_rate"]
    );
    // Two runs in one folder are two runs, not one merged frame: each scanned on its own,
    // side by side (issue 31).
    let two = tempfile::tempdir().unwrap();
    for run in ["a", "b"] {
        let src = fixture(&format!("mlflow/run_{run}/mlruns"));
        copy_tree(&src, &two.path().join(run));
    }
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(two.path())
        .assert()
        .code(1)
        .stdout(contains("2 runs, each scanned on its own"));
    let two_wb = tempfile::tempdir().unwrap();
    for run in ["a", "b"] {
        copy_tree(
            &fixture(&format!("wandb/run_{run}/wandb")),
            &two_wb.path().join(run),
        );
    }
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(two_wb.path())
        .assert()
        .code(1)
        .stdout(contains("2 runs, each scanned on its own"));
}

fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

#[test]
fn csv_export_and_plain_csv_equal_the_logged_values() {
    let m = manifest();
    let logged = &m["runs"]["a"]["logged"];
    for (file, format, keys) in [
        ("csv/wandb_export_a.csv", "wandb_csv", 4),
        ("csv/plain_a.csv", "csv", 8),
    ] {
        let path = fixture(file);
        let mut got: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
        let stats = trackers::read(
            TrackerKind::Csv,
            &path,
            std::fs::File::open(&path).unwrap(),
            0,
            &mut |r| {
                for (k, v) in &r.fields {
                    got.entry(k.clone())
                        .or_default()
                        .insert(r.step.unwrap(), *v);
                }
            },
        )
        .unwrap();
        assert_eq!(stats.format, format);
        assert_eq!(stats.records, 40);
        assert_eq!(stats.non_finite, 1);
        assert_eq!(got.len(), keys, "{file}: __MIN/__MAX skipped");
        for (k, steps) in &got {
            assert_eq!(steps.len(), 40, "{k}");
            for (s, v) in steps {
                let w = &logged[k][*s as usize];
                match w.as_f64() {
                    Some(x) => assert_eq!(*v, x, "{file} {k} step {s}"),
                    None => assert!(v.is_nan() && w == "NaN", "{file} {k} step {s}"),
                }
            }
        }
    }
}

fn scan_one(p: &Path) -> ScanReport {
    scan(&[p.to_path_buf()], &ScanOptions::default()).unwrap()
}

/// `(detector, first step, last step)` of every finding, sorted.
fn finding_spans(r: &ScanReport) -> Vec<(String, Option<i64>, Option<i64>)> {
    let mut v: Vec<_> = r
        .findings
        .iter()
        .map(|f| (f.detector.clone(), f.first_step, f.last_step))
        .collect();
    v.sort();
    v
}

#[test]
fn detectors_find_the_injected_faults_in_every_tracker_format() {
    let tb = scan_one(&fixture("tb/run_a"));
    assert_eq!(tb.steps, 40);
    assert_eq!((tb.first_step, tb.last_step), (Some(0), Some(39)));
    // train/… keys reach the canonical metrics (train/reward_std → reward_std, …).
    for m in [
        "loss",
        "grad_norm",
        "reward_mean",
        "reward_std",
        "frac_reward_zero_std",
        "entropy",
        "kl",
        "step_time",
    ] {
        assert!(tb.metrics.iter().any(|x| x == m), "{m}: {:?}", tb.metrics);
    }
    let nan = tb.by_detector("nan-grad");
    assert_eq!(nan.len(), 1);
    assert_eq!(nan[0].steps, vec![17]);
    let dead = tb.by_detector("dead-groups");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].steps, (25..40).collect::<Vec<_>>());
    assert!(
        tb.by_detector("slowdown")
            .iter()
            .any(|f| f.first_step == Some(30) && f.last_step == Some(39)),
        "{:#?}",
        tb.by_detector("slowdown")
    );
    // The same run through W&B gives the same findings at the same steps.
    let wb = scan_one(&fixture("wandb/run_a"));
    assert_eq!(finding_spans(&wb), finding_spans(&tb));
    // The plain CSV and MLflow carry every key: same findings again.
    let csv = scan_one(&fixture("csv/plain_a.csv"));
    assert_eq!(finding_spans(&csv), finding_spans(&tb));
    let ml = scan_one(&fixture("mlflow/run_a"));
    assert_eq!(finding_spans(&ml), finding_spans(&tb));
}

fn compare_dirs(a: &str, b: &str) -> CompareReport {
    let (pa, pb) = (fixture(a), fixture(b));
    let (ra, rb) = (scan_one(&pa), scan_one(&pb));
    let cfg = (
        trackers::run_config(&pa).unwrap(),
        trackers::run_config(&pb).unwrap(),
    );
    compare_reports((&pa, &ra), (&pb, &rb), 3.0, Some(cfg))
}

#[test]
fn compare_names_the_step_and_metric_where_b_leaves_a() {
    // Across formats: A from TensorBoard, B from W&B.
    let r = compare_dirs("tb/run_a", "wandb/run_b");
    assert!(r.diverged);
    assert_eq!(r.aligned_steps, 40);
    assert_eq!(r.first_divergence, Some(("kl".to_string(), 20)));
    let at = |m: &str| {
        r.metrics
            .iter()
            .find(|x| x.metric == m)
            .unwrap()
            .first_divergent_step
    };
    assert_eq!(at("kl"), Some(20));
    // Reward falls by 0.03 per step: at step 20 that is below 3σ of its noise, at 21 above.
    assert_eq!(at("reward_mean"), Some(21));
    for m in ["loss", "grad_norm", "entropy", "reward_std", "step_time"] {
        assert_eq!(at(m), None, "{m}");
    }
    let kl = r.metrics.iter().find(|x| x.metric == "kl").unwrap();
    assert!(kl.effect_size.unwrap() > 100.0, "{kl:?}");
    let rw = r
        .metrics
        .iter()
        .find(|x| x.metric == "reward_mean")
        .unwrap();
    assert!(rw.effect_size.unwrap() < -10.0, "{rw:?}");
    // kl-explosion is B's alone; TensorBoard carries no config.
    assert!(r
        .findings
        .iter()
        .any(|f| f.detector == "kl-explosion" && f.present_in == "b"));
    assert!(r.config_differences.is_none());
}

#[test]
fn compare_same_run_in_two_formats_reports_no_divergence() {
    // float32 TensorBoard against float64 W&B of the same numbers.
    let r = compare_dirs("tb/run_a", "wandb/run_a");
    assert!(!r.diverged, "{:#?}", r.metrics);
    assert_eq!(r.first_divergence, None);
    assert_eq!(r.metrics.len(), 8);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    let same = compare_dirs("wandb/run_b", "wandb/run_b");
    assert!(!same.diverged);
    assert_eq!(same.config_differences.map(|d| d.len()), Some(0));
}

#[test]
fn compare_reports_config_differences_when_both_runs_carry_them() {
    let r = compare_dirs("wandb/run_a", "wandb/run_b");
    let d = r.config_differences.unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].key, "learning_rate");
    assert_eq!(
        d[0].a.as_deref().map(|x| x.parse::<f64>().unwrap()),
        Some(1e-6)
    );
    assert_eq!(
        d[0].b.as_deref().map(|x| x.parse::<f64>().unwrap()),
        Some(3e-6)
    );
}

#[test]
fn compare_cli_exit_codes_and_formats() {
    let (a, b) = (fixture("tb/run_a"), fixture("wandb/run_b"));
    Command::cargo_bin("logscan")
        .unwrap()
        .args(["--compare".as_ref(), a.as_os_str(), b.as_os_str()])
        .assert()
        .code(1)
        .stdout(contains("runs diverge: kl first, from step 20"));
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .args(["--compare", "--format", "json"])
        .args([&a, &b])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["first_divergence"], serde_json::json!(["kl", 20]));
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("overlay.png");
    Command::cargo_bin("logscan")
        .unwrap()
        .args(["--compare", "--plot"])
        .args([&png, &a, &b])
        .assert()
        .code(1);
    let head = std::fs::read(&png).unwrap();
    assert_eq!(head.get(..8), Some(&b"\x89PNG\r\n\x1a\n"[..]));
    Command::cargo_bin("logscan")
        .unwrap()
        .args(["--compare", "--format", "markdown"])
        .args([fixture("wandb/run_a"), fixture("wandb/run_b")])
        .assert()
        .code(1)
        .stdout(contains("| learning_rate |"));
    // Identical runs: exit 0. A huge tolerance hides the divergence too.
    Command::cargo_bin("logscan")
        .unwrap()
        .arg("--compare")
        .args([fixture("tb/run_a"), fixture("wandb/run_a")])
        .assert()
        .code(0)
        .stdout(contains("no divergence beyond 3σ"));
    Command::cargo_bin("logscan")
        .unwrap()
        .args(["--compare", "--tolerance", "100000"])
        .args([&a, &b])
        .assert()
        .code(0);
    Command::cargo_bin("logscan")
        .unwrap()
        .arg("--compare")
        .arg(&a)
        .assert()
        .code(2)
        .stderr(contains("exactly two runs"));
}

/// Copy fixture file `src` into a temp dir under `name`, changed by `edit`.
fn altered(src: &Path, name: &str, edit: impl Fn(&mut Vec<u8>)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(src).unwrap();
    edit(&mut bytes);
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

fn the_file(dir: &str) -> PathBuf {
    trackers::find_in_dir(&fixture(dir))
        .unwrap()
        .into_iter()
        .next()
        .unwrap()
}

#[test]
fn corrupt_tracker_files_are_exit_2_with_the_position() {
    let tb = the_file("tb/run_a");
    let (_d1, bad_crc) = altered(&tb, "events.out.tfevents.1.host", |b| {
        let n = b.len();
        b[n - 10] ^= 0xFF;
    });
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&bad_crc)
        .assert()
        .code(2)
        .stderr(contains("TFRecord data CRC-32C mismatch"))
        .stderr(contains("byte "));
    let (_d2, not_tb) = altered(&tb, "events.out.tfevents.2.host", |b| {
        b.truncate(7);
    });
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&not_tb)
        .assert()
        .code(2)
        .stderr(contains("not a TensorBoard event file"));
    let wb = the_file("wandb/run_a");
    let (_d3, bad_wb) = altered(&wb, "run-x.wandb", |b| b[0] = b'X');
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&bad_wb)
        .assert()
        .code(2)
        .stderr(contains("not a W&B transaction log"));
    let (_d4, wb_crc) = altered(&wb, "run-y.wandb", |b| b[200] ^= 0x55);
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&wb_crc)
        .assert()
        .code(2)
        .stderr(contains("W&B record CRC mismatch"));
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("metrics.csv");
    std::fs::write(&csv, "a,b\n1,2\n").unwrap();
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&csv)
        .assert()
        .code(2)
        .stderr(contains("CSV has no step column"));
    // In a folder, a CSV without a step column is not a metric table: the folder's logs
    // are scanned without it.
    std::fs::copy(fixture("csv/plain_a.csv"), dir.path().join("plain_a.csv")).unwrap();
    let r = scan_one(dir.path());
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.steps, 40);
    let two = dir.path().join("export.csv");
    std::fs::write(&two, "Step,x - loss,y - loss\n0,1,2\n").unwrap();
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(&two)
        .assert()
        .code(2)
        .stderr(contains("holds 2 runs (x, y)"));
}

#[test]
fn truncated_tracker_files_keep_the_records_before_the_cut() {
    // A writer killed mid-record: the whole records stand, the cut is reported.
    let tb = the_file("tb/run_a");
    let (_d, cut) = altered(&tb, "events.out.tfevents.3.host", |b| {
        let n = b.len();
        b.truncate(n - 5);
    });
    let r = scan_one(&cut);
    assert!(r.files[0].truncated_last_line);
    assert_eq!(r.steps, 40);
    // The last event (step 39's last tag) is lost, step 39's other tags stand.
    let (full, _) = read_dir(&fixture("tb/run_a"));
    assert_eq!(
        r.frame.series("entropy").len(),
        full["train/entropy"].len() - 1
    );
    let wb = the_file("wandb/run_a");
    let (_d2, cut) = altered(&wb, "run-z.wandb", |b| {
        let n = b.len();
        b.truncate(n - 3);
    });
    let r = scan_one(&cut);
    assert!(r.files[0].truncated_last_line);
    assert_eq!(r.steps, 40);
}

/// Read one tracker file with the raw keys: `{key: {step: value}}` and the sources.
fn read_file(f: &Path) -> (BTreeMap<String, BTreeMap<i64, f64>>, Vec<SourceKind>) {
    let mut out: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    let mut sources = Vec::new();
    let kind = trackers::sniff(f, b"").unwrap();
    let input = std::fs::File::open(f).unwrap();
    trackers::read(kind, f, input, 0, &mut |r| {
        sources.push(r.source);
        for (k, v) in &r.fields {
            out.entry(k.clone())
                .or_default()
                .insert(r.step.unwrap(), *v);
        }
    })
    .unwrap();
    (out, sources)
}

/// A manifest object of strings as a map.
fn strings(v: &serde_json::Value) -> BTreeMap<String, String> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k.clone(), s.clone()),
            other => (k.clone(), other.to_string()),
        })
        .collect()
}

#[test]
fn mlflow_sqlite_values_equal_mlflow_client_nan_from_is_nan() {
    let m = manifest();
    for run in ["a", "b"] {
        let dir = fixture(&format!("mlflow_db/run_{run}"));
        let files = trackers::find_in_dir(&dir).unwrap();
        assert_eq!(files, vec![dir.join("mlflow.db")]);
        assert_eq!(trackers::sniff(&files[0], b""), Some(TrackerKind::Sqlite));
        let (got, sources) = read_dir(&dir);
        assert_same(&got, &table(&m["runs"][run]["mlflow_db"]));
        assert!(sources.iter().all(|s| *s == SourceKind::MlflowDb));
        // Stored as value 0 with is_nan = 1; MlflowClient and logscan read NaN.
        assert!(got["train/grad_norm"][&17].is_nan());
        assert_eq!(got.len(), 8);
        assert_eq!(got["train/kl"].len(), 40);
        let cfg = trackers::run_config(&dir).unwrap();
        assert_eq!(cfg, strings(&m["runs"][run]["mlflow_db_params"]));
        assert_eq!(
            cfg["learning_rate"],
            if run == "a" { "1e-06" } else { "3e-06" }
        );
    }
}

#[test]
fn trackio_database_and_parquet_export_equal_trackios_own_reader() {
    let m = manifest();
    for run in ["a", "b"] {
        let dir = fixture(&format!("trackio/run_{run}"));
        // The folder holds the database and its export: the database is read, once.
        let files = trackers::find_in_dir(&dir).unwrap();
        assert_eq!(files, vec![dir.join("rlf_fixture.db")]);
        let want = table(&m["runs"][run]["trackio"]);
        let (db, sources) = read_dir(&dir);
        assert_same(&db, &want);
        assert!(sources.iter().all(|s| *s == SourceKind::Trackio));
        // "NaN" in the metrics JSON is NaN.
        assert!(db["train/grad_norm"][&17].is_nan());
        let pq = dir.join("rlf_fixture.parquet");
        assert_eq!(trackers::sniff(&pq, b""), Some(TrackerKind::Parquet));
        let (pq_vals, pq_sources) = read_file(&pq);
        assert_same(&pq_vals, &want);
        assert!(pq_sources.iter().all(|s| *s == SourceKind::Trackio));
        let cfg = trackers::run_config(&dir).unwrap();
        let lr = m["runs"][run]["trackio_config"]["learning_rate"]
            .as_f64()
            .unwrap();
        assert_eq!(cfg["learning_rate"].parse::<f64>().unwrap(), lr);
        assert_eq!(cfg["model"], "Qwen2.5-0.5B");
        assert!(!cfg.keys().any(|k| k.starts_with('_')), "{cfg:?}");
    }
}

#[test]
fn wandb_summary_and_output_log_of_a_run_without_its_transaction_log() {
    let m = manifest();
    let dir = fixture("wandb_files/run_a");
    let files = trackers::find_in_dir(&dir).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["output.log", "wandb-summary.json"]);
    // The summary: one record at its `_step`, the SDK's last values.
    let summary = &m["runs"]["a"]["wandb_summary"];
    let step = summary["_step"].as_i64().unwrap();
    let (got, sources) = read_file(&files[1]);
    assert_eq!(sources, vec![SourceKind::WandbSummary]);
    assert_eq!(got.len(), 8, "{got:?}");
    for (k, steps) in &got {
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[&step], summary[k].as_f64().unwrap(), "{k}");
        // The summary's values are the ones logged at that step.
        assert_eq!(
            steps[&step],
            m["runs"]["a"]["logged"][k][step as usize].as_f64().unwrap(),
            "{k}"
        );
    }
    // output.log is console text: the text-log reader takes its verl-style lines.
    let r = scan_one(&dir);
    assert_eq!(r.files.len(), 2);
    assert_eq!(r.files[0].format, "text (verl_console)");
    assert_eq!(r.files[0].records, 40);
    let printed = table(&m["runs"]["a"]["wandb_output_log"]);
    for (key, canon) in [("train/kl", "kl"), ("train/loss", "loss")] {
        let series: BTreeMap<i64, f64> = r.frame.series(canon).into_iter().collect();
        assert_eq!(series, printed[key], "{key}");
    }
    assert_eq!(
        finding_spans(&r),
        finding_spans(&scan_one(&fixture("tb/run_a")))
    );
    // Beside a transaction log, the summary is not read again (the history is the
    // record); the console capture is, after the history.
    let both = tempfile::tempdir().unwrap();
    copy_tree(&fixture("wandb/run_a/wandb"), both.path());
    let run = std::fs::read_dir(both.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let src_files = files[0].parent().unwrap();
    copy_tree(src_files, &run.join("files"));
    let found = trackers::find_in_dir(both.path()).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].to_string_lossy().ends_with(".wandb"));
    assert!(found[1].ends_with("files/output.log"), "{found:?}");
}

#[test]
fn new_tracker_formats_find_the_injected_faults_and_compare_across_them() {
    let tb = finding_spans(&scan_one(&fixture("tb/run_a")));
    for p in [
        "mlflow_db/run_a",
        "trackio/run_a",
        "trackio/run_a/rlf_fixture.parquet",
    ] {
        assert_eq!(finding_spans(&scan_one(&fixture(p))), tb, "{p}");
    }
    let r = compare_dirs("mlflow_db/run_a", "trackio/run_b");
    assert!(r.diverged);
    assert_eq!(r.first_divergence, Some(("kl".to_string(), 20)));
    let d = r.config_differences.unwrap();
    assert_eq!(
        d.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["learning_rate"]
    );
    let same = compare_dirs("mlflow_db/run_a", "trackio/run_a");
    assert!(!same.diverged);
    assert_eq!(same.config_differences.map(|d| d.len()), Some(0));
}

/// logscan on `path` is exit 2 and its message holds every one of `want`.
fn refused(path: &Path, want: &[&str]) {
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg(path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}: {err}", path.display());
    for w in want {
        assert!(err.contains(w), "{}: {w:?} not in {err}", path.display());
    }
    assert!(!String::from_utf8_lossy(&out.stdout).contains("no findings"));
}

#[test]
fn corrupt_or_unknown_databases_parquet_and_summaries_are_exit_2_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    // A SQLite file cut in half.
    let db = fixture("mlflow_db/run_a/mlflow.db");
    let (_d1, cut) = altered(&db, "mlflow.db", |b| {
        let n = b.len();
        b.truncate(n / 2);
    });
    refused(&cut, &["mlflow.db", "SQLite"]);
    // A `.db` that is no database at all.
    let text = dir.path().join("notes.db");
    std::fs::write(&text, "this is not a database, just text long enough\n").unwrap();
    refused(&text, &["notes.db", "SQLite: file is not a database"]);
    // A database of no tracker.
    let other = dir.path().join("other.db");
    let conn = rusqlite::Connection::open(&other).unwrap();
    conn.execute_batch("CREATE TABLE t(a INTEGER); INSERT INTO t VALUES (1);")
        .unwrap();
    drop(conn);
    refused(&other, &["other.db", "no known tracker", "tables: t"]);
    // A Trackio project holding two runs: one run per input.
    let two = dir.path().join("project.db");
    std::fs::copy(fixture("trackio/run_a/rlf_fixture.db"), &two).unwrap();
    let conn = rusqlite::Connection::open(&two).unwrap();
    conn.execute(
        "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) \
         VALUES ('x', '2026-01-01T00:00:00', 'run_c', 0, '{\"train/loss\": 1.0}')",
        [],
    )
    .unwrap();
    drop(conn);
    refused(
        &two,
        &[
            "project.db",
            "holds 2 runs (run_a (",
            "), run_c (x)); logscan reads one run per input: pick one with --run NAME",
        ],
    );
    // --run picks one: the fixture's run equals the fixture alone, the added one has its
    // one step.
    let alone = scan_one(&fixture("trackio/run_a/rlf_fixture.db"));
    let picked = scan(
        std::slice::from_ref(&two),
        &ScanOptions {
            run: Some("run_a".into()),
            ..ScanOptions::default()
        },
    )
    .unwrap();
    assert_eq!(picked.steps, 40);
    assert_eq!(picked.frame.series("kl"), alone.frame.series("kl"));
    assert_eq!(finding_spans(&picked), finding_spans(&alone));
    let c = scan(
        std::slice::from_ref(&two),
        &ScanOptions {
            run: Some("x".into()),
            ..ScanOptions::default()
        },
    )
    .unwrap();
    assert_eq!(c.frame.series("loss"), vec![(0, 1.0)]);
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg(&two)
        .args(["--run", "run_z"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no run named \"run_z\""));
    // --run on inputs that hold one run each is a usage error, not ignored.
    Command::cargo_bin("logscan")
        .unwrap()
        .arg(fixture("tb/run_a"))
        .args(["--run", "run_a"])
        .assert()
        .code(2)
        .stderr(contains("no input holds several runs"));
    // An MLflow database with no run.
    let empty = dir.path().join("empty.db");
    std::fs::copy(&db, &empty).unwrap();
    let conn = rusqlite::Connection::open(&empty).unwrap();
    conn.execute_batch("DELETE FROM metrics; DELETE FROM latest_metrics; DELETE FROM params; DELETE FROM tags; DELETE FROM runs;")
        .unwrap();
    drop(conn);
    refused(&empty, &["empty.db", "MLflow database holds no run"]);
    // A Parquet file cut short, and one with no step column.
    let pq = fixture("trackio/run_a/rlf_fixture.parquet");
    let (_d2, cut_pq) = altered(&pq, "export.parquet", |b| {
        let n = b.len();
        b.truncate(n - 100);
    });
    refused(&cut_pq, &["export.parquet", "Parquet"]);
    let nostep = dir.path().join("nostep.parquet");
    {
        use polars::prelude::*;
        let mut df = df!("loss" => [1.0f64, 2.0]).unwrap();
        ParquetWriter::new(std::fs::File::create(&nostep).unwrap())
            .finish(&mut df)
            .unwrap();
    }
    refused(&nostep, &["nostep.parquet", "no step column"]);
    // W&B summaries: cut mid-object, and one without a step.
    let sum = trackers::find_in_dir(&fixture("wandb_files/run_a"))
        .unwrap()
        .into_iter()
        .find(|p| p.ends_with("wandb-summary.json"))
        .unwrap();
    let (_d3, cut_sum) = altered(&sum, "wandb-summary.json", |b| {
        let n = b.len();
        b.truncate(n - 20);
    });
    refused(&cut_sum, &["wandb-summary.json", "line 1"]);
    let d4 = tempfile::tempdir().unwrap();
    let nostep_sum = d4.path().join("wandb-summary.json");
    std::fs::write(&nostep_sum, "{\"train/loss\": NaN}").unwrap();
    refused(&nostep_sum, &["wandb-summary.json", "has no step"]);
}

/// Scan a plain CSV of `steps` rows with `column` set by `value(step)`.
fn scan_csv(steps: i64, column: &str, value: impl Fn(i64) -> f64) -> ScanReport {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.csv");
    let mut text = format!("step,{column},loss\n");
    for s in 0..steps {
        text.push_str(&format!("{s},{},0.01\n", value(s)));
    }
    std::fs::write(&p, text).unwrap();
    scan_one(&p)
}

#[test]
fn a_sustained_stretch_of_fully_dead_steps_is_a_finding_in_a_long_run() {
    // 12 fully dead steps of 200 (6 %, under the 25 % share threshold).
    let r = scan_csv(200, "frac_reward_zero_std", |s| {
        if (100..112).contains(&s) {
            1.0
        } else {
            0.1
        }
    });
    let dead = r.by_detector("dead-groups");
    assert_eq!(dead.len(), 1, "{:#?}", r.findings);
    assert_eq!(dead[0].steps, (100..112).collect::<Vec<_>>());
    assert!(
        dead[0]
            .explanation
            .contains("every group dead for 12 logged steps in a row (steps 100–111"),
        "{}",
        dead[0].explanation
    );
    assert_eq!(dead[0].evidence["sustained_dead_steps"], 12);
    // Nine in a row is under the ten-step threshold; twelve steps with most (not every)
    // group dead are not a fully dead stretch; twelve split 6 + 6 are not in a row.
    let nine = scan_csv(200, "frac_reward_zero_std", |s| {
        if (100..109).contains(&s) {
            1.0
        } else {
            0.1
        }
    });
    assert!(
        nine.by_detector("dead-groups").is_empty(),
        "{:#?}",
        nine.findings
    );
    let most = scan_csv(200, "frac_reward_zero_std", |s| {
        if (100..112).contains(&s) {
            0.9
        } else {
            0.1
        }
    });
    assert!(
        most.by_detector("dead-groups").is_empty(),
        "{:#?}",
        most.findings
    );
    let split = scan_csv(200, "frac_reward_zero_std", |s| {
        if (100..106).contains(&s) || (107..113).contains(&s) {
            1.0
        } else {
            0.1
        }
    });
    assert!(
        split.by_detector("dead-groups").is_empty(),
        "{:#?}",
        split.findings
    );
    // From reward_std exactly 0 (no frac column): 10 of 400 steps (2.5 %, under the 5 %
    // share that scattered zero-std steps need).
    let derived = scan_csv(400, "reward_std", |s| {
        if (300..310).contains(&s) {
            0.0
        } else {
            0.2
        }
    });
    let dead = derived.by_detector("dead-groups");
    assert_eq!(dead.len(), 1, "{:#?}", derived.findings);
    assert_eq!(dead[0].steps, (300..310).collect::<Vec<_>>());
    assert_eq!(dead[0].evidence["derived_from_reward_std"], true);
}

#[test]
fn mlflow_file_store_cut_or_garbage_metric_files() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("mlflow/run_a/mlruns"), dir.path());
    let files = trackers::find_in_dir(dir.path()).unwrap();
    let kl = files
        .iter()
        .find(|p| p.ends_with("metrics/train/kl"))
        .unwrap()
        .clone();
    // Cut mid-line (the crash case): the whole lines stand, the cut one is not read.
    let text = std::fs::read_to_string(&kl).unwrap();
    let cut = &text[..text.len() - 4];
    std::fs::write(&kl, cut).unwrap();
    let r = scan_one(dir.path());
    let stats = r.files.iter().find(|f| f.path == kl).unwrap();
    assert!(stats.truncated_last_line);
    assert_eq!(stats.records, 39);
    let kl_series = r.frame.series("kl");
    assert_eq!(kl_series.len(), 39);
    assert_eq!(kl_series.last().unwrap().0, 38);
    // A metric file of garbage is exit 2 naming it, not "no findings".
    std::fs::write(&kl, "not a metric line\n").unwrap();
    refused(
        dir.path(),
        &["metrics/train/kl", "mlflow file holds no scalar metrics"],
    );
}

#[test]
fn compare_two_runs_of_one_trackio_project_with_run_twice() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("project.db");
    std::fs::copy(fixture("trackio/run_a/rlf_fixture.db"), &db).unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "ATTACH ?1 AS b",
        [fixture("trackio/run_b/rlf_fixture.db").to_str().unwrap()],
    )
    .unwrap();
    conn.execute_batch(
        "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) \
           SELECT run_id, timestamp, run_name, step, metrics FROM b.metrics; \
         INSERT INTO configs (run_id, run_name, config, created_at) \
           SELECT run_id, run_name, config, created_at FROM b.configs;",
    )
    .unwrap();
    drop(conn);
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .arg("--compare")
        .arg(&db)
        .arg(&db)
        .args(["--run", "run_a", "--run", "run_b", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The same answer as the two fixture databases compared as two files.
    let want = compare_dirs("trackio/run_a", "trackio/run_b");
    assert_eq!(want.first_divergence, Some(("kl".to_string(), 20)));
    assert_eq!(j["first_divergence"][0], "kl");
    assert_eq!(j["first_divergence"][1], 20);
    let keys: Vec<&str> = j["config_differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["learning_rate"]);
    // One --run applies to both: the same run twice does not diverge.
    Command::cargo_bin("logscan")
        .unwrap()
        .arg("--compare")
        .arg(&db)
        .arg(&db)
        .args(["--run", "run_a"])
        .assert()
        .code(0)
        .stdout(contains("no divergence"));
}

#[test]
fn a_folder_of_several_tracker_databases_is_refused_with_their_names() {
    // Trackio keeps every project's database in one folder.
    let dir = tempfile::tempdir().unwrap();
    for p in ["proj_a.db", "proj_b.db"] {
        std::fs::copy(fixture("trackio/run_a/rlf_fixture.db"), dir.path().join(p)).unwrap();
    }
    refused(
        dir.path(),
        &["holds 2 tracker databases (proj_a.db, proj_b.db); pass one database file"],
    );
    // A `.db` beside logs that is not SQLite is not a tracker database.
    std::fs::remove_file(dir.path().join("proj_b.db")).unwrap();
    std::fs::write(dir.path().join("cache.db"), "plain text").unwrap();
    let r = scan_one(dir.path());
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].format, "trackio");
}

/// The W&B run folder of fixture `dir` (its one `offline-run-*`).
fn wandb_run_folder(dir: &str) -> PathBuf {
    std::fs::read_dir(fixture(dir).join("wandb"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap()
}

#[test]
fn wandb_run_with_its_console_capture_and_config_yaml() {
    let m = manifest();
    let dir = fixture("wandb_full/run_a");
    let run = wandb_run_folder("wandb_full/run_a");
    // History first, then the console capture; config.yaml is not a data file.
    let files = trackers::find_in_dir(&dir).unwrap();
    let wb = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "wandb"))
        .unwrap();
    assert_eq!(files, vec![wb.clone(), run.join("files/output.log")]);
    // The history equals wandb's own Record reading of the file.
    let (got, _) = read_file(&wb);
    assert_same(&got, &table(&m["runs"]["a"]["wandb_full"]));
    let r = scan_one(&dir);
    assert_eq!(r.files[0].format, "wandb");
    assert_eq!(r.files[1].format, "text (verl_console)");
    // The console has one step more than the history: the crash step, never logged.
    let crash = m["runs"]["a"]["wandb_full_console_grad_norm"]
        .as_object()
        .unwrap()
        .len() as i64
        - 1;
    assert_eq!(crash, 40);
    assert_eq!(
        (r.first_step, r.last_step, r.steps),
        (Some(0), Some(crash), 41)
    );
    // Where both hold a step the history's value stays (the console prints 6 digits).
    let grad: BTreeMap<i64, f64> = r.frame.series("grad_norm").into_iter().collect();
    let history = &table(&m["runs"]["a"]["wandb_full"])["train/grad_norm"];
    for (s, want) in history {
        assert!(
            grad[s] == *want || (grad[s].is_nan() && want.is_nan()),
            "step {s}"
        );
    }
    assert!(grad[&crash].is_nan());
    let printed = m["runs"]["a"]["wandb_full_console_grad_norm"]["3"]
        .as_f64()
        .unwrap();
    assert_ne!(
        grad[&3], printed,
        "the console's rounded value lost to the history's"
    );
    // One nan-grad finding with the history's NaN step and the console's crash step.
    let nan: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.detector == "nan-grad")
        .collect();
    assert_eq!(nan.len(), 1);
    assert_eq!(nan[0].steps, vec![17, crash]);
    // The other faults as in every format.
    let spans = finding_spans(&r);
    assert!(
        spans.contains(&("dead-groups".to_string(), Some(25), Some(39))),
        "{spans:?}"
    );
    // config.yaml (wandb's own config_util wrote it from the run's config records) is the
    // config of a files-only run, equal to the transaction log's config records.
    for run in ["a", "b"] {
        let cfg = trackers::run_config(&fixture(&format!("wandb_full/run_{run}"))).unwrap();
        let want = &m["runs"][run]["wandb_config"];
        assert_eq!(cfg.len(), 4, "{cfg:?}");
        assert_eq!(
            cfg["learning_rate"].parse::<f64>().unwrap(),
            want["learning_rate"].as_f64().unwrap()
        );
        assert_eq!(cfg["beta"], "0.04");
        assert_eq!(cfg["num_generations"], "8");
        assert_eq!(cfg["model"], "Qwen2.5-0.5B");
        assert!(m["runs"][run]["wandb_full_config_yaml"]
            .as_str()
            .unwrap()
            .contains("learning_rate:\n  desc: null\n  value: "));
    }
    assert!(!fixture("wandb_full/run_b").read_dir().unwrap().any(|e| e
        .unwrap()
        .path()
        .to_string_lossy()
        .ends_with(".wandb")));
    // --compare of the full run and the files-only run: their config difference.
    Command::cargo_bin("logscan")
        .unwrap()
        .args(["--compare", "--no-color"])
        .arg(&dir)
        .arg(fixture("wandb_full/run_b"))
        .assert()
        .stdout(contains("config learning_rate: A 0.000001 | B 0.000003"));
}

/// A manifest number: JSON numbers and the strings "NaN", "Infinity", "-Infinity".
fn num(v: &serde_json::Value) -> f64 {
    match v.as_str() {
        Some("NaN") => f64::NAN,
        Some("Infinity") => f64::INFINITY,
        Some("-Infinity") => f64::NEG_INFINITY,
        _ => v.as_f64().unwrap(),
    }
}

/// Equal as numbers, NaN equal to NaN.
fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

#[test]
fn appended_and_resumed_runs_read_every_launch_and_keep_the_first_value_per_step() {
    let m = manifest();
    for (dir, what) in [
        ("tb_appended/run", "tensorboard"),
        ("wandb_resumed/run", "wandb"),
    ] {
        // Both launches are one run: two event files in one folder, or two W&B folders of
        // one run id (not refused as two runs).
        let files = trackers::find_in_dir(&fixture(dir)).unwrap();
        assert_eq!(files.len(), 2, "{files:?}");
        // Every value of both launches, as the package's own reader returns them (tbparse
        // lists them by step, file order within a step; wandb's Record class file by file).
        let mut rows: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
        for f in &files {
            let kind = trackers::sniff(f, b"").unwrap();
            let input = std::fs::File::open(f).unwrap();
            trackers::read(kind, f, input, 0, &mut |r| {
                for (k, v) in &r.fields {
                    rows.entry(k.clone())
                        .or_default()
                        .push((r.step.unwrap(), *v));
                }
            })
            .unwrap();
        }
        if what == "tensorboard" {
            for v in rows.values_mut() {
                v.sort_by_key(|(s, _)| *s);
            }
        }
        let want = m["appended"][what].as_object().unwrap();
        assert_eq!(
            rows.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        for (k, w) in want {
            let w: Vec<(i64, f64)> = w
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_i64().unwrap(), num(&p[1])))
                .collect();
            assert_eq!(rows[k].len(), w.len(), "{what} {k}");
            for ((gs, gv), (ws, wv)) in rows[k].iter().zip(&w) {
                assert!(
                    *gs == *ws && same(*gv, *wv),
                    "{what} {k}: {gs} {gv} vs {ws} {wv}"
                );
            }
        }
        // The frame keeps one value per step: the first launch's where both logged it (as
        // W&B's server keeps a resumed run: a step logged again is dropped).
        let r = scan_one(&fixture(dir));
        assert_eq!((r.steps, r.first_step, r.last_step), (10, Some(0), Some(9)));
        let loss: BTreeMap<i64, f64> = r.frame.series("loss").into_iter().collect();
        let logged = &rows["train/loss"];
        for s in [4, 5] {
            // Launch 1 logged below 2, launch 2 above.
            let first = logged.iter().find(|(t, _)| *t == s).unwrap().1;
            assert!(first < 2.0, "{what} step {s}");
            assert_eq!(loss[&s], first, "{what} step {s}");
        }
        assert!(loss[&9] > 2.0, "{what}: launch 2's steps after the overlap");
        // NaN, +inf and -inf of launch 2 are values, counted and found.
        let grad: BTreeMap<i64, f64> = r.frame.series("grad_norm").into_iter().collect();
        assert!(grad[&6].is_nan());
        assert_eq!((grad[&7], grad[&8]), (f64::INFINITY, f64::NEG_INFINITY));
        assert_eq!(r.files[1].non_finite, 3, "{what}");
        let nan: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.detector == "nan-grad")
            .collect();
        assert_eq!(nan.len(), 1, "{what}");
        assert_eq!(nan[0].steps, vec![6, 7, 8], "{what}");
    }
    // Two W&B runs of different ids in one folder are still two runs.
    let two = tempfile::tempdir().unwrap();
    copy_tree(&fixture("wandb_resumed/run/wandb"), two.path());
    copy_tree(&fixture("wandb/run_a/wandb"), two.path());
    let err = trackers::find_in_dir(two.path()).unwrap_err().to_string();
    assert!(err.contains("holds 2 W&B runs"), "{err}");
}

#[test]
fn nan_and_infinities_are_values_in_the_text_and_parquet_formats() {
    // (TensorBoard and W&B: the appended-run fixtures; MLflow SQLite and Trackio: their
    // readers' unit tests.) Each file holds grad_norm NaN, +inf, -inf at steps 3, 4, 5 of
    // 12, written the way each producer writes them.
    let dir = tempfile::tempdir().unwrap();
    let cell = |s: usize, nan: &str, inf: &str, ninf: &str| match s {
        3 => nan.to_string(),
        4 => inf.to_string(),
        5 => ninf.to_string(),
        _ => "0.5".to_string(),
    };
    // Python's csv module / pandas: nan, inf, -inf.
    let plain: String = std::iter::once("step,grad_norm\n".to_string())
        .chain((0..12).map(|s| format!("{s},{}\n", cell(s, "nan", "inf", "-inf"))))
        .collect();
    std::fs::write(dir.path().join("plain.csv"), plain).unwrap();
    // The W&B UI's export: NaN, Infinity, -Infinity.
    let export: String = std::iter::once("Step,r - train/grad_norm\n".to_string())
        .chain((0..12).map(|s| format!("{s},{}\n", cell(s, "NaN", "Infinity", "-Infinity"))))
        .collect();
    std::fs::write(dir.path().join("export.csv"), export).unwrap();
    // MLflow's file store: `<ms> <str(value)> <step>` lines.
    let run = dir.path().join("mlruns/1/abc");
    std::fs::create_dir_all(run.join("metrics/train")).unwrap();
    std::fs::write(run.join("meta.yaml"), "run_id: abc\n").unwrap();
    let lines: String = (0..12)
        .map(|s| {
            format!(
                "{} {} {s}\n",
                1_700_000_000_000u64 + s as u64,
                cell(s, "nan", "inf", "-inf")
            )
        })
        .collect();
    std::fs::write(run.join("metrics/train/grad_norm"), lines).unwrap();
    // Parquet (polars, as a Trackio export or a pandas table would hold them).
    let mut df = polars::prelude::DataFrame::new(
        12,
        vec![
            polars::prelude::Column::new("step".into(), (0..12i64).collect::<Vec<_>>()),
            polars::prelude::Column::new(
                "grad_norm".into(),
                (0..12)
                    .map(|s| cell(s, "NaN", "inf", "-inf").parse::<f64>().unwrap())
                    .collect::<Vec<_>>(),
            ),
        ],
    )
    .unwrap();
    let pq = dir.path().join("table.parquet");
    polars::prelude::ParquetWriter::new(std::fs::File::create(&pq).unwrap())
        .finish(&mut df)
        .unwrap();
    for p in [
        dir.path().join("plain.csv"),
        dir.path().join("export.csv"),
        run.clone(),
        pq,
    ] {
        let r = scan_one(&p);
        let grad: BTreeMap<i64, f64> = r.frame.series("grad_norm").into_iter().collect();
        assert_eq!(grad.len(), 12, "{}", p.display());
        assert!(grad[&3].is_nan(), "{}", p.display());
        assert_eq!(
            (grad[&4], grad[&5]),
            (f64::INFINITY, f64::NEG_INFINITY),
            "{}",
            p.display()
        );
        assert_eq!(
            r.files.iter().map(|f| f.non_finite).sum::<u64>(),
            3,
            "{}",
            p.display()
        );
        let nan: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.detector == "nan-grad")
            .collect();
        assert_eq!(nan.len(), 1, "{}", p.display());
        assert_eq!(nan[0].steps, vec![3, 4, 5], "{}", p.display());
    }
}

/// A TFRecord of `data` (length, masked CRC-32C of it, data, masked CRC-32C of the data).
fn tfrecord(out: &mut Vec<u8>, data: &[u8]) {
    use rlforensics::logs::trackers::tfevents::masked_crc;
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

#[test]
fn long_tracker_files_read_across_many_batches_with_late_keys() {
    use prost::Message;
    use rlforensics::logs::trackers::tfevents::{Event, Summary, SummaryValue, TensorProto};
    use rlforensics::logs::trackers::wandb::{HistoryItem, HistoryRecord, HistoryStep, Record};
    // 30,000 steps of 3 keys (far more values than one batch holds), a 4th key only from
    // step 25,000, and every 1,000th step's kl as a tensor (the prost path) amid the
    // allocation-free walk.
    const N: i64 = 30_000;
    let value = |k: usize, s: i64| 0.5 + 0.001 * ((s * 7 + k as i64 * 13) % 997) as f64;
    let keys = ["train/loss", "train/kl", "train/grad_norm", "late/metric"];
    let has = |k: usize, s: i64| k < 3 || s >= 25_000;
    let dir = tempfile::tempdir().unwrap();
    let mut tf = Vec::new();
    for s in 0..N {
        for (k, key) in keys.iter().enumerate().filter(|(k, _)| has(*k, s)) {
            let v = value(k, s) as f32;
            let sv = if k == 1 && s % 1000 == 0 {
                SummaryValue {
                    tag: key.to_string(),
                    simple_value: None,
                    metadata: None,
                    tensor: Some(Box::new(TensorProto {
                        dtype: 1,
                        tensor_shape: None,
                        tensor_content: Vec::new(),
                        half_val: Vec::new(),
                        float_val: vec![v],
                        double_val: Vec::new(),
                        int_val: Vec::new(),
                        string_val: Vec::new(),
                        int64_val: Vec::new(),
                        bool_val: Vec::new(),
                        uint32_val: Vec::new(),
                        uint64_val: Vec::new(),
                    })),
                }
            } else {
                SummaryValue {
                    tag: key.to_string(),
                    simple_value: Some(v),
                    metadata: None,
                    tensor: None,
                }
            };
            let ev = Event {
                wall_time: 1.7e9 + s as f64,
                step: s,
                file_version: None,
                summary: Some(Summary { value: vec![sv] }),
            };
            tfrecord(&mut tf, &ev.encode_to_vec());
        }
    }
    // More than one 4 MiB read chunk: records straddle the chunk boundary.
    assert!(tf.len() > 4 << 20, "{}", tf.len());
    let tb = dir.path().join("events.out.tfevents.1.long");
    std::fs::write(&tb, &tf).unwrap();
    // The same file cut 5 bytes into a next record's header: every record stands.
    let cut_dir = tempfile::tempdir().unwrap();
    let cut = cut_dir.path().join("events.out.tfevents.2.cut");
    let head = tf[..5].to_vec();
    std::fs::write(&cut, [tf.as_slice(), head.as_slice()].concat()).unwrap();
    let r = scan_one(&cut);
    assert!(r.files[0].truncated_last_line);
    assert_eq!(
        (r.steps, r.files[0].bytes),
        (N as usize, tf.len() as u64 + 5)
    );
    // The same rows as a W&B transaction log (FULL records, padded at block ends).
    let mut wb = b":W&B\xe1\xbe\x00".to_vec();
    for s in 0..N {
        let mut item: Vec<HistoryItem> = keys
            .iter()
            .enumerate()
            .filter(|(k, _)| has(*k, s))
            .map(|(k, key)| HistoryItem {
                key: String::new(),
                nested_key: vec![key.to_string()],
                boolean: None,
                integer: None,
                number: None,
                value_json: format!("{}", value(k, s) as f32 as f64),
            })
            .collect();
        item.push(HistoryItem {
            key: "_step".to_string(),
            nested_key: Vec::new(),
            boolean: None,
            integer: None,
            number: None,
            value_json: s.to_string(),
        });
        let data = Record {
            history: Some(HistoryRecord {
                item,
                step: Some(HistoryStep { num: s }),
            }),
            config: None,
            run: None,
        }
        .encode_to_vec();
        let left = 32768 - wb.len() % 32768;
        if left < 7 + data.len() {
            wb.resize(wb.len() + left, 0);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&[1]);
        crc.update(&data);
        wb.extend_from_slice(&crc.finalize().to_le_bytes());
        wb.extend_from_slice(&(data.len() as u16).to_le_bytes());
        wb.push(1);
        wb.extend_from_slice(&data);
    }
    let wandb_dir = dir.path().join("wandb/offline-run-20250101_000000-long");
    std::fs::create_dir_all(&wandb_dir).unwrap();
    std::fs::write(wandb_dir.join("run-long.wandb"), &wb).unwrap();
    for (path, what) in [(tb, "tensorboard"), (dir.path().join("wandb"), "wandb")] {
        let r = scan(
            std::slice::from_ref(&path),
            &ScanOptions {
                keep_raw: true,
                ..ScanOptions::default()
            },
        )
        .unwrap();
        assert_eq!((r.steps, r.last_step), (N as usize, Some(N - 1)), "{what}");
        for (k, key) in keys.iter().enumerate() {
            // train/… keys reach the canonical metrics; the late key is a raw column.
            let col: Vec<(i64, f64)> = if k == 3 {
                let c = r.frame.raw(key).unwrap();
                c.present().map(|(i, v)| (r.frame.step(i), v)).collect()
            } else {
                r.frame.points(&key[6..]).collect()
            };
            let want: Vec<(i64, f64)> = (0..N)
                .filter(|s| has(k, *s))
                .map(|s| (s, value(k, s) as f32 as f64))
                .collect();
            assert_eq!(col.len(), want.len(), "{what} {key}");
            assert!(col == want, "{what} {key}");
        }
    }
}

#[test]
fn tracker_scans_run_inside_a_rayon_pool_too() {
    use rayon::prelude::*;
    // A caller scanning runs in parallel, more runs than pool threads: inside the pool each
    // scan reads its file on the worker itself, not on a reader thread it waits for; the
    // findings equal those of the threaded read outside the pool.
    let runs = ["wandb/run_a", "tb/run_a", "wandb_full/run_a"];
    let want: Vec<_> = runs
        .iter()
        .map(|r| finding_spans(&scan_one(&fixture(r))))
        .collect();
    let inputs: Vec<usize> = (0..rayon::current_num_threads() * 2 + 1).collect();
    let got: Vec<_> = inputs
        .par_iter()
        .map(|i| finding_spans(&scan_one(&fixture(runs[i % runs.len()]))))
        .collect();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, want[i % runs.len()], "{}", runs[i % runs.len()]);
    }
}

/// The CSV reader interns a column's key when a row first hands it on, as the
/// record-by-record reader did: a row refused for its step interns nothing, and a key
/// first seen later in a row comes after one seen earlier.
#[test]
fn csv_rows_intern_keys_in_the_order_rows_hand_them_on() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.csv");
    std::fs::write(&p, "step,a,b\nx,1,2\n0,,3\n1,4,true\n2,nan,\n").unwrap();
    let mut batches = Vec::new();
    let stats = trackers::read_rows(
        TrackerKind::Csv,
        &p,
        std::fs::File::open(&p).unwrap(),
        None,
        &mut |b| {
            batches.push(b);
            None
        },
    )
    .unwrap();
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!(b.new_keys, ["b", "a"]);
    let rows: Vec<(Option<i64>, u64, u32)> =
        b.rows.iter().map(|h| (h.step, h.line, h.fields)).collect();
    assert_eq!(rows, [(Some(0), 3, 1), (Some(1), 4, 2), (Some(2), 5, 1)]);
    assert_eq!(b.fields[..3], [(0, 3.0), (1, 4.0), (0, 1.0)]);
    assert_eq!(b.fields[3].0, 1);
    assert!(b.fields[3].1.is_nan());
    assert_eq!(
        (stats.records, stats.non_finite, stats.bad_line_count),
        (3, 1, 1)
    );
}
