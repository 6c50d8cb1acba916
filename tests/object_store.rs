//! Dump trees on object storage (issue 33, docs/storage.md): `dumpdiff s3://… s3://…` on
//! an S3 server started on 127.0.0.1 (moto's `ThreadedMotoServer`, from PyPI) gives the
//! report of the local copy, fetches only the step's files, and a missing key, wrong
//! credentials or a bad URL exit 2 naming the URL. Never the internet.
//!
//! The server needs `python3` with `moto[server]` and `boto3` (or the interpreter named by
//! `RLF_PYTHON`). Without them these tests print "skipped" and pass, unless
//! `RLF_REQUIRE_S3` is set (`.ci/run` sets it, with its venv's python): then they fail.
//!
//! Moto checks credentials only after `INITIAL_NO_AUTH_ACTION_COUNT` requests (moto
//! 5.2.1, `moto/core/responses.py`, `ActionAuthenticatorMixin`): the script makes its three
//! IAM set-up calls within that allowance, then every request must carry the IAM user's
//! access key id, or moto answers 403 `InvalidAccessKeyId` as AWS does. Its signature
//! check (`moto/iam/access_control.py`, `IAMRequestBase.check_signature`) is turned off in
//! the script: it canonicalises a LIST's query string (`delimiter=%2F`) otherwise than
//! AWS and object_store do and refuses every correctly signed listing. So the wrong
//! credentials here are a wrong key id, not a wrong secret.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command as StdCommand, Stdio};
use std::sync::{Mutex, OnceLock};

use assert_cmd::Command;
use serde_json::Value as Json;

/// Starts moto on 127.0.0.1 (a free port), makes an IAM user allowed `s3:*`, creates
/// `bucket`, uploads each `LOCAL=PREFIX` argument's files under `PREFIX/`, prints one JSON
/// line (endpoint, key, secret), and serves until its stdin closes.
const MOTO: &str = r#"
import json, os, sys
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
from moto.server import ThreadedMotoServer
import moto.iam.access_control as ac
import boto3
# moto's SigV4 check canonicalises a LIST's query (delimiter=%2F) unlike AWS and
# object_store and refuses it; keep its access-key check, drop the signature one.
ac.IAMRequestBase.check_signature = lambda self: None
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
url = f"http://127.0.0.1:{port}"
setup = dict(endpoint_url=url, region_name="us-east-1",
             aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **setup)
iam.create_user(UserName="rlf")
iam.put_user_policy(UserName="rlf", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17",
     "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="rlf")["AccessKey"]
s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                  aws_access_key_id=k["AccessKeyId"], aws_secret_access_key=k["SecretAccessKey"])
s3.create_bucket(Bucket="bucket")
for pair in sys.argv[1:]:
    local, prefix = pair.split("=", 1)
    for d, _, files in os.walk(local):
        for f in sorted(files):
            p = os.path.join(d, f)
            s3.upload_file(p, "bucket", prefix + "/" + os.path.relpath(p, local))
print(json.dumps({"endpoint": url, "key": k["AccessKeyId"], "secret": k["SecretAccessKey"]}),
      flush=True)
sys.stdin.read()
server.stop()
"#;

/// The trees uploaded, as (local fixture folder, key prefix in `bucket`).
const TREES: [(&str, &str); 3] = [
    ("self_hosted_pt", "run/self_hosted"),
    ("weaver_pt", "run/weaver"),
    ("weaver_faulty_pt", "run/weaver_faulty"),
];

/// A running server: its endpoint and the IAM user's key. The child stops when the test
/// process ends (its stdin closes).
struct Moto {
    endpoint: String,
    key: String,
    secret: String,
    _child: Mutex<(Child, ChildStdin)>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shared server, started once; `None` (after printing "skipped") when python or moto
/// is missing and `RLF_REQUIRE_S3` is not set.
fn moto() -> Option<&'static Moto> {
    static M: OnceLock<Option<Moto>> = OnceLock::new();
    M.get_or_init(start).as_ref()
}

fn start() -> Option<Moto> {
    let required = std::env::var_os("RLF_REQUIRE_S3").is_some();
    let python = std::env::var("RLF_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = StdCommand::new(&python)
        .args(["-c", "import moto.server, boto3, flask"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            !required,
            "RLF_REQUIRE_S3 is set but {python} cannot import moto[server] and boto3"
        );
        println!("skipped: {python} with moto[server] and boto3 is needed for the S3 tests");
        return None;
    }
    let mut cmd = StdCommand::new(&python);
    cmd.arg("-c").arg(MOTO);
    for (local, prefix) in TREES {
        cmd.arg(format!("fixtures/dumps/{local}={prefix}"));
    }
    let mut child = cmd
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the moto server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let j: Json = serde_json::from_str(&line).expect("the moto script's JSON line");
    let stdin = child.stdin.take().unwrap();
    Some(Moto {
        endpoint: j["endpoint"].as_str().unwrap().into(),
        key: j["key"].as_str().unwrap().into(),
        secret: j["secret"].as_str().unwrap().into(),
        _child: Mutex::new((child, stdin)),
    })
}

/// `dumpdiff` with the server's endpoint and the access key id `key` (the IAM user's
/// unless a test says).
fn dumpdiff(m: &Moto, key: &str) -> Command {
    let mut c = Command::cargo_bin("dumpdiff").unwrap();
    c.current_dir(root())
        .env("AWS_ENDPOINT_URL", &m.endpoint)
        .env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", &m.secret)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE");
    c
}

/// Sum of the sizes of the files of `step` (their names say `step_NNNNNN`) under a fixture.
fn step_bytes(tree: &str, step: i64) -> u64 {
    let prefix = format!("step_{step:06}");
    let mut total = 0;
    let mut stack = vec![root().join("fixtures/dumps").join(tree)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if file_name(&p).starts_with(&prefix) {
                total += p.metadata().unwrap().len();
            }
        }
    }
    total
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// `bytes` and `requests` of dumpdiff's `--stats` line on stderr.
fn fetched(stderr: &[u8]) -> (u64, u64) {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .find(|l| l.starts_with("dumpdiff: fetched "))
        .unwrap_or_else(|| panic!("no --stats line in {text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[2].parse().unwrap(), words[8].parse().unwrap())
}

/// The README's first command (the NexRL flags: `--self-hosted-dir`, `--weaver-dir`,
/// `--step 0`), as JSON, on the local trees and on their copies in the store: the same
/// report (paths aside) and exit code; the bytes fetched are those of the step's files,
/// not the step −1 trajectory the tree also holds, each fetched once (≤ 1.1×).
#[test]
fn dumpdiff_on_s3_gives_the_local_report_fetching_only_the_step() {
    let Some(m) = moto() else { return };
    for (weaver, prefix, code) in [
        ("weaver_pt", "run/weaver", 0),
        ("weaver_faulty_pt", "run/weaver_faulty", 1),
    ] {
        let local = Command::cargo_bin("dumpdiff")
            .unwrap()
            .current_dir(root())
            .args(["--self-hosted-dir", "fixtures/dumps/self_hosted_pt"])
            .args(["--weaver-dir", &format!("fixtures/dumps/{weaver}")])
            .args(["--step", "0", "--format", "json"])
            .output()
            .unwrap();
        assert_eq!(local.status.code(), Some(code), "{local:?}");
        let remote = dumpdiff(m, &m.key)
            .args(["--self-hosted-dir", "s3://bucket/run/self_hosted"])
            .args(["--weaver-dir", &format!("s3://bucket/{prefix}")])
            .args(["--step", "0", "--format", "json", "--stats"])
            .output()
            .unwrap();
        assert_eq!(
            remote.status.code(),
            Some(code),
            "{}",
            String::from_utf8_lossy(&remote.stderr)
        );
        let text = String::from_utf8(remote.stdout.clone())
            .unwrap()
            .replace(
                "s3://bucket/run/self_hosted",
                "fixtures/dumps/self_hosted_pt",
            )
            .replace(
                &format!("s3://bucket/{prefix}"),
                &format!("fixtures/dumps/{weaver}"),
            );
        assert_eq!(text, String::from_utf8(local.stdout).unwrap(), "{weaver}");
        let (bytes, requests) = fetched(&remote.stderr);
        let want = step_bytes("self_hosted_pt", 0) + step_bytes(weaver, 0);
        assert!(
            bytes >= want && bytes as f64 <= 1.1 * want as f64,
            "{weaver}: fetched {bytes} bytes, the step's files hold {want}"
        );
        assert!(requests > 0);
    }
}

/// A missing prefix, a missing bucket, wrong credentials and a URL without a bucket: exit
/// 2, the URL named on stderr with what was wrong, no panic.
#[test]
fn s3_errors_exit_2_naming_the_url() {
    let Some(m) = moto() else { return };
    let cases = [
        (
            "s3://bucket/run/nothing",
            m.key.as_str(),
            "no such object or prefix",
        ),
        ("s3://no-bucket/run", m.key.as_str(), "no such bucket"),
        (
            "s3://bucket/run/self_hosted",
            "AKIAWRONGWRONGWRONG1",
            "access denied",
        ),
        (
            "s3:///run/self_hosted",
            m.key.as_str(),
            "not a usable object-store URL",
        ),
    ];
    for (url, key, says) in cases {
        let out = dumpdiff(m, key)
            .args(["--self-hosted-dir", url])
            .args(["--weaver-dir", "fixtures/dumps/weaver_pt", "--step", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {err}");
        assert!(err.contains(url) && err.contains(says), "{url}: {err}");
        assert!(!err.contains("panicked"), "{url}: {err}");
    }
}

/// `--inspect` of one object: the same keys, dtypes, shapes and values as the local file
/// (the first line names the path and, locally, the size).
#[test]
fn inspect_reads_one_object() {
    let Some(m) = moto() else { return };
    let name = "forward_data/step_000000_rank4_micro0.pt";
    let local = Command::cargo_bin("dumpdiff")
        .unwrap()
        .current_dir(root())
        .args([
            "--inspect",
            &format!("fixtures/dumps/self_hosted_pt/{name}"),
        ])
        .output()
        .unwrap();
    let url = format!("s3://bucket/run/self_hosted/{name}");
    let remote = dumpdiff(m, &m.key)
        .args(["--inspect", &url])
        .output()
        .unwrap();
    assert_eq!(remote.status.code(), Some(0), "{remote:?}");
    let (local, remote) = (
        String::from_utf8(local.stdout).unwrap(),
        String::from_utf8(remote.stdout).unwrap(),
    );
    assert!(remote.starts_with(&url), "{remote}");
    let body = |t: &str| t.split_once('\n').map(|x| x.1.to_string());
    assert!(body(&local).is_some_and(|b| b.contains("log_probs") || b.len() > 40));
    assert_eq!(body(&remote), body(&local));
}
