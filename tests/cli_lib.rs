//! The four commands called as library functions (`rlforensics::cli::<tool>::run_cli`), as
//! the Python package calls them: the same exit codes as the binaries, clap's included.

use rlforensics::cli;

const SELF_HOSTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dumps/self_hosted_pt");
const REMOTE_API: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dumps/remote_api_pt");
const WEAVER_FAULTY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/dumps/weaver_faulty_pt"
);
const TRL_INPUTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/kernels/trl_grpo_normal.safetensors"
);
const DEBUG_FAULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/logs/debug_faults");

#[test]
fn run_cli_gives_each_verdict_its_exit_code() {
    let agree = [
        "dumpdiff",
        "--self-hosted-dir",
        SELF_HOSTED,
        "--remote-api-dir",
        REMOTE_API,
        "--step",
        "0",
        "-q",
    ];
    assert_eq!(cli::dumpdiff::run_cli(agree), 0);
    let faulty = [
        "dumpdiff",
        "--self-hosted-dir",
        SELF_HOSTED,
        "--weaver-dir",
        WEAVER_FAULTY,
        "--step",
        "0",
        "-q",
    ];
    assert_eq!(cli::dumpdiff::run_cli(faulty), 1);
    let inputs = [
        "losscheck",
        "--inputs",
        TRL_INPUTS,
        "--preset",
        "trl-grpo",
        "-q",
    ];
    assert_eq!(cli::losscheck::run_cli(inputs), 0);
    let tree = [
        "losscheck",
        "--dump-dir",
        WEAVER_FAULTY,
        "--step",
        "0",
        "-q",
    ];
    assert_eq!(cli::losscheck::run_cli(tree), 1);
    assert_eq!(cli::logscan::run_cli(["logscan", DEBUG_FAULTS, "-q"]), 1);
    let missing = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/no_such_run");
    assert_eq!(cli::postmortem::run_cli(["postmortem", missing, "-q"]), 2);
}

#[test]
fn run_cli_maps_clap_exits_as_the_binaries_do() {
    assert_eq!(cli::dumpdiff::run_cli(["dumpdiff", "--version"]), 0);
    assert_eq!(cli::losscheck::run_cli(["losscheck", "--version"]), 0);
    assert_eq!(cli::logscan::run_cli(["logscan", "--no-such-flag"]), 2);
    assert_eq!(
        cli::postmortem::run_cli(["postmortem", "--no-such-flag"]),
        2
    );
    assert_eq!(cli::dumpdiff::run_cli(["dumpdiff", "--step", "x"]), 2);
    // Arguments parse but the comparison has no reference side: a usage error.
    assert_eq!(cli::dumpdiff::run_cli(["dumpdiff", "--step", "0"]), 2);
}
