//! The `crash` detector on logs written by the real producers
//! (`fixtures/gen/make_crash_logs.py`: CPython's traceback printing, torchrun) and on the
//! debug trainer's `crash` events.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use rlforensics::detect::Severity;
use rlforensics::logscan::{scan, ScanOptions, ScanReport};
use rlforensics::model::finding::Finding;

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(p)
}

fn run(p: &Path) -> ScanReport {
    scan(&[p.to_path_buf()], &ScanOptions::default()).unwrap()
}

/// The one crash finding of `p`.
fn crash(p: &Path) -> Finding {
    let r = run(p);
    let f = r.by_detector("crash");
    assert_eq!(f.len(), 1, "{p:?}: {f:?}");
    f[0].clone()
}

fn ev<'a>(f: &'a Finding, k: &str) -> &'a serde_json::Value {
    &f.evidence[k]
}

#[test]
fn torchrun_oom_is_one_crash_after_the_last_step_with_its_root_cause() {
    // four TRL dict lines (steps 0–3, numbered in order), the rank's OOM traceback behind
    // `[rank0]: `, then torchrun's own ChildFailedError traceback: one incident
    let f = crash(&fixture("logs/crash/torchrun_oom.log"));
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.steps, [3]);
    assert_eq!(ev(&f, "last_step_logged"), 3);
    assert_eq!(ev(&f, "signature"), "oom");
    assert!(ev(&f, "message")
        .as_str()
        .unwrap()
        .starts_with("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"));
    assert_eq!(
        ev(&f, "then"),
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    );
    assert_eq!(ev(&f, "line"), 8);
    assert!(f.explanation.starts_with(
        "the run stopped on a Python traceback after step 3 (its last step logged): `torch.OutOfMemoryError"
    ));
    assert_eq!(f.likely_causes[0], "Out of GPU memory");
    // an error: logscan exits 1
    let code = Command::cargo_bin("logscan")
        .unwrap()
        .arg(fixture("logs/crash/torchrun_oom.log"))
        .output()
        .unwrap()
        .status
        .code();
    assert_eq!(code, Some(1));
}

#[test]
fn a_handled_traceback_the_run_went_on_after_is_info() {
    // verl console lines behind Ray's actor prefix; a KeyError printed by
    // traceback.print_exc() after step 3, steps 4–6 after it
    let path = fixture("logs/crash/handled_ray.log");
    let f = crash(&path);
    assert_eq!(f.severity, Severity::Info);
    assert_eq!(f.steps, [4]);
    assert_eq!(ev(&f, "message"), "KeyError: 'missing'");
    assert_eq!(ev(&f, "signature"), "unknown");
    assert!(f.likely_causes.is_empty());
    assert!(
        f.explanation
            .ends_with("and the log goes on to step 6: the run did not stop on it"),
        "{}",
        f.explanation
    );
    // the traceback's lines are not metrics: the six steps are read as before
    assert_eq!(run(&path).steps, 6);
    let code = Command::cargo_bin("logscan")
        .unwrap()
        .arg(&path)
        .output()
        .unwrap()
        .status
        .code();
    assert_eq!(code, Some(0));
}

#[test]
fn a_chained_exception_quotes_the_first_and_keeps_the_last() {
    let f = crash(&fixture("logs/crash/chained.log"));
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.count, 1);
    assert_eq!(
        ev(&f, "message"),
        "ValueError: max_new_tokens must be positive, got 0"
    );
    assert_eq!(
        ev(&f, "then"),
        "RuntimeError: generation failed for batch 3"
    );
    assert_eq!(f.steps, [2]);
}

#[test]
fn a_debug_trainer_crash_event_is_a_finding() {
    // events.jsonl: {"event": "crash", "message": "[METAL] Command buffer execution
    // failed: Insufficient Memory (…OutOfMemory)"} after step 56
    let f = crash(&fixture("runs/20251009-160000"));
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.steps, [56]);
    assert_eq!(ev(&f, "signature"), "oom");
    assert!(f
        .explanation
        .starts_with("the run stopped on a crash event after step 56"));
}

#[test]
fn no_crash_without_a_traceback() {
    // an exception-shaped line that ends no traceback is not a crash, and logs without one
    // have no crash finding
    let dir = std::env::temp_dir().join(format!("rlf-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("trl.log");
    std::fs::write(
        &p,
        "{'loss': 0.1, 'grad_norm': 0.3, 'epoch': 0.01}\nRuntimeError: printed, not raised\n{'loss': 0.1, 'grad_norm': 0.3, 'epoch': 0.02}\n",
    )
    .unwrap();
    assert!(run(&p).by_detector("crash").is_empty());
    std::fs::remove_dir_all(&dir).ok();
    for p in [
        "logs/text/trl_stdout.log",
        "logs/text/verl_console.log",
        "logs/text/nanogpt_seed.log",
        "logs/healthy",
    ] {
        assert!(run(&fixture(p)).by_detector("crash").is_empty(), "{p}");
    }
}

/// A log written to a temporary folder (removed by the caller).
fn temp_log(name: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rlf-crash-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.log"));
    std::fs::write(&p, text).unwrap();
    (dir, p)
}

#[test]
fn a_log_cut_inside_a_traceback_says_so() {
    // a paste that stops after the frames: no exception line to quote
    let (dir, p) = temp_log(
        "cut",
        "{'loss': 0.1, 'grad_norm': 0.3, 'epoch': 0.01}\n\
         {'loss': 0.1, 'grad_norm': 0.3, 'epoch': 0.02}\n\
         Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    trainer.train()\n",
    );
    let f = crash(&p);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.steps, [1]);
    assert_eq!(ev(&f, "line"), 3);
    assert_eq!(
        ev(&f, "message"),
        "(the log ends inside a traceback, before its exception line)"
    );
}

#[test]
fn one_exception_on_every_rank_is_one_incident_quoted_once() {
    // torchrun's prefixes, the same OOM on two ranks, their lines interleaved
    let tb = |r: u32| {
        format!(
            "[rank{r}]: Traceback (most recent call last):\n[rank{r}]:   File \"t.py\", line 3, in <module>\n[rank{r}]: torch.OutOfMemoryError: CUDA out of memory.\n"
        )
    };
    let (dir, p) = temp_log(
        "ranks",
        &format!(
            "{{'loss': 0.2, 'grad_norm': 0.3, 'epoch': 0.01}}\n{}{}",
            tb(0),
            tb(1)
        ),
    );
    let f = crash(&p);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(f.count, 1);
    assert_eq!(
        ev(&f, "message"),
        "torch.OutOfMemoryError: CUDA out of memory."
    );
    assert!(f.evidence.get("then").is_none(), "{:?}", f.evidence);
    assert_eq!(ev(&f, "signature"), "oom");
}
