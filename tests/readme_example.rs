use rlforensics::dumpdiff::{self, Options};
use rlforensics::logscan::{scan, ScanOptions};
use rlforensics::model::finding::Severity;

fn main() -> Result<(), rlforensics::Error> {
    // dumpdiff: compare two dump trees of step 0.
    let report = dumpdiff::run(&Options {
        self_hosted: "fixtures/dumps/self_hosted_pt".into(),
        weaver: Some("fixtures/dumps/weaver_faulty_pt".into()),
        step: 0,
        ..Options::default()
    })?;
    assert_eq!(dumpdiff::exit_code(&report, Severity::Error), 1);

    // logscan: failure signatures in a run's logs, worst first.
    let logs = scan(&["fixtures/logs/debug_faults".into()], &ScanOptions::default())?;
    for f in logs.findings.iter().filter(|f| f.severity >= Severity::Error) {
        println!("{:?} {}: {}", f.severity, f.detector, f.explanation);
    }

    // A whole command line, as the `losscheck` binary runs it: exit code 0.
    let code = rlforensics::cli::losscheck::run_cli([
        "losscheck",
        "--inputs",
        "fixtures/kernels/trl_grpo_normal.safetensors",
        "--preset",
        "trl-grpo",
        "-q",
    ]);
    assert_eq!(code, 0);
    Ok(())
}
