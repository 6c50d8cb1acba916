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
    /// Made for these tests and uploaded too: `trunc/` (the `self_hosted_pt` tree with one
    /// file truncated, as `run/self_hosted_trunc`) and, when torch imports, `ckpt/big.pt`
    /// (three 1 MiB tensors, as `ckpt/big.pt`).
    tmp: PathBuf,
    _child: Mutex<(Child, ChildStdin)>,
}

/// The file of `trunc/` cut to half its size.
const TRUNCATED: &str = "forward_data/step_000000_rank3_micro1.pt";

/// Writes `ckpt/big.pt` under the folder given: a dict of three 1 MiB float32 tensors and
/// an int, as `torch.save` writes it.
const CKPT: &str = r#"
import sys, torch
torch.save({"a": torch.arange(262144, dtype=torch.float32),
            "b": torch.arange(262144, dtype=torch.float32) * 0.5,
            "c": torch.full((512, 512), 3.0), "step": 7}, sys.argv[1] + "/ckpt/big.pt")
"#;

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let q = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &q);
        } else {
            std::fs::copy(&p, &q).unwrap();
        }
    }
}

/// Three 1 MiB float32 tensors `a` (0, 1, 2 …), `b` (0, 0.5, 1 …) and `c` (3.0) as the
/// safetensors format lays them out (8-byte length, JSON header padded with spaces to a
/// multiple of 8, data in header order).
fn write_safetensors(path: &Path) {
    let n = 262144usize;
    let mut header = String::from("{");
    for (i, k) in ["a", "b", "c"].iter().enumerate() {
        let (b, e) = (i * 4 * n, (i + 1) * 4 * n);
        header += &format!(
            "{}\"{k}\":{{\"dtype\":\"F32\",\"shape\":[{n}],\"data_offsets\":[{b},{e}]}}",
            if i > 0 { "," } else { "" }
        );
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for f in [|i: usize| i as f32, |i: usize| i as f32 * 0.5, |_| 3.0f32] {
        for i in 0..n {
            out.extend_from_slice(&f(i).to_le_bytes());
        }
    }
    std::fs::write(path, out).unwrap();
}

/// The test-made files (see [`Moto::tmp`]).
fn make_tmp(python: &str) -> PathBuf {
    // Under the target's own scratch folder, replaced on each run (not left in /tmp).
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rlf-s3");
    let _ = std::fs::remove_dir_all(&tmp);
    copy_tree(
        &root().join("fixtures/dumps/self_hosted_pt"),
        &tmp.join("trunc"),
    );
    let t = tmp.join("trunc").join(TRUNCATED);
    let bytes = std::fs::read(&t).unwrap();
    std::fs::write(&t, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::create_dir_all(tmp.join("ckpt")).unwrap();
    write_safetensors(&tmp.join("ckpt/big.safetensors"));
    std::fs::create_dir_all(tmp.join("conf")).unwrap();
    std::fs::copy(
        root().join("fixtures/tolerances.toml"),
        tmp.join("conf/tolerances.toml"),
    )
    .unwrap();
    let _ = StdCommand::new(python)
        .args(["-c", CKPT])
        .arg(&tmp)
        .stderr(Stdio::null())
        .status();
    let big = tmp.join("ckpt/big.pt");
    if big.is_file() {
        // `bad.pt`: big.pt with one byte of storage `2` (tensor `c`) flipped.
        let mut bytes = std::fs::read(&big).unwrap();
        let at = zip_data_start(&big, "big/data/2") as usize + 100;
        bytes[at] ^= 0xff;
        std::fs::write(tmp.join("ckpt/bad.pt"), bytes).unwrap();
    }
    tmp
}

/// Where member `name`'s data starts in the zip `path`, as the zip crate reads it.
fn zip_data_start(path: &Path, name: &str) -> u64 {
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    let mut z = zip::ZipArchive::with_config(config, std::fs::File::open(path).unwrap()).unwrap();
    let i = z.index_for_name(name).unwrap();
    let f = z.by_index_raw(i).unwrap();
    f.data_start().unwrap()
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
    let tmp = make_tmp(&python);
    let mut cmd = StdCommand::new(&python);
    cmd.arg("-c").arg(MOTO);
    for (local, prefix) in TREES {
        cmd.arg(format!("fixtures/dumps/{local}={prefix}"));
    }
    cmd.arg(format!(
        "{}=run/self_hosted_trunc",
        tmp.join("trunc").display()
    ));
    cmd.arg(format!("{}=ckpt", tmp.join("ckpt").display()));
    cmd.arg(format!("{}=conf", tmp.join("conf").display()));
    cmd.arg("fixtures/logs/debug_faults=logs/debug_faults");
    cmd.arg("fixtures/stacks=stacks");
    // Logs of every kind logscan and postmortem read (issue 33's second half), and a
    // run prefix that also holds checkpoints (`ckpt/`), which must not be fetched.
    for dir in ["trackers", "completions", "runs"] {
        cmd.arg(format!("fixtures/{dir}={dir}"));
    }
    cmd.arg("fixtures/logs/healthy=logs/healthy");
    cmd.arg(format!(
        "{}=logs/healthy/checkpoint-10",
        tmp.join("ckpt").display()
    ));
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
        tmp,
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

/// `cmd` with the server's endpoint and the access key id `key`.
fn in_store(mut cmd: Command, m: &Moto, key: &str) -> Command {
    cmd.current_dir(root())
        .env("AWS_ENDPOINT_URL", &m.endpoint)
        .env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", &m.secret)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE");
    cmd
}

/// One key of a 3 MiB `.pt` in the store (`read_pt_keys`): only `data.pkl`, `byteorder`, the
/// key's storage and the zip directory are fetched (≤ 1.1× their bytes, counted here from
/// the local file with the zip crate), the other two storages not; then the whole file
/// (`read_pt`) fetches the rest and nothing twice. Values equal the local file's. Also the
/// other stacks' trees read from the store ([`stacks_from_the_store`]). Runs
/// [`ranged_child`] in a process of its own, whose environment names the store.
#[test]
fn a_key_of_a_pt_fetches_only_its_members() {
    let Some(m) = moto() else { return };
    let big = m.tmp.join("ckpt/big.pt");
    let mut child = StdCommand::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "object_store::ranged_child", "--ignored"])
        .args(["--nocapture", "--test-threads", "1"])
        .env("RLF_S3_CHILD", &big)
        .env("AWS_ENDPOINT_URL", &m.endpoint)
        .env("AWS_ACCESS_KEY_ID", &m.key)
        .env("AWS_SECRET_ACCESS_KEY", &m.secret)
        .env("AWS_REGION", "us-east-1");
    let out = child.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ranged_child checked"), "{text}");
    if let Some(line) = text.lines().find(|l| l.contains("ranged_child checked")) {
        println!("{line}");
    }
}

/// Bytes of the members `names` of the zip `path` from their local headers to their data's
/// end, and of the central directory and end records, as the zip crate reads them.
fn zip_bytes(path: &Path, names: &[String]) -> u64 {
    let file = std::fs::File::open(path).unwrap();
    let size = file.metadata().unwrap().len();
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    let mut z = zip::ZipArchive::with_config(config, file).unwrap();
    let mut total = size - z.central_directory_start();
    for n in names {
        let i = z.index_for_name(n).unwrap();
        let f = z.by_index_raw(i).unwrap();
        total += f.data_start().unwrap() + f.compressed_size() - f.header_start();
    }
    total
}

/// The other stacks' trees (`fixtures/stacks`: verl, NeMo-RL, slime, SGLang, AReaL …)
/// read from the store by their step readers (`producers/walk.rs` lists and reads through
/// the source layer): the same reader, steps and step dump as the local tree.
fn stacks_from_the_store() {
    use rlforensics::producers::step_reader_for;
    let local_root = root().join("fixtures/stacks");
    let manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(local_root.join("manifest.json")).unwrap())
            .unwrap();
    let trees = manifest["trees"].as_object().unwrap();
    assert!(trees.len() >= 9);
    for tree in trees.keys() {
        let local = local_root.join(tree);
        let url = PathBuf::from(format!("s3://bucket/stacks/{tree}"));
        let (lr, rr) = (
            step_reader_for(&local).unwrap(),
            step_reader_for(&url).unwrap_or_else(|e| panic!("{tree}: {e}")),
        );
        assert_eq!(rr.name(), lr.name(), "{tree}");
        let steps = lr.steps(&local).unwrap();
        assert_eq!(rr.steps(&url).unwrap(), steps, "{tree}");
        let (l, r) = (
            lr.read_step(&local, steps[0]).unwrap(),
            rr.read_step(&url, steps[0]).unwrap(),
        );
        let r = format!("{r:?}").replace(&url.display().to_string(), &local.display().to_string());
        assert_eq!(r, format!("{l:?}"), "{tree}");
    }
}

#[test]
#[ignore = "run by a_key_of_a_pt_fetches_only_its_members, with the store in its environment"]
fn ranged_child() {
    use rlforensics::formats::{pt, safetensors, source};
    use rlforensics::value::Value;
    stacks_from_the_store();
    let big = PathBuf::from(std::env::var("RLF_S3_CHILD").expect("the local checkpoint"));
    if !big.is_file() {
        println!("ranged_child checked: stacks; skipped: torch is needed to write the checkpoint");
        return;
    }
    let url = Path::new("s3://bucket/ckpt/big.pt");
    let tensors = |v: &Value| -> Vec<(String, String, Vec<u8>)> {
        let Value::Dict(items) = v else {
            panic!("not a dict: {v:?}")
        };
        items
            .iter()
            .map(|(k, x)| match x {
                Value::Tensor(t) => (
                    format!("{k:?}"),
                    t.storage_key().unwrap().to_string(),
                    t.storage_bytes().to_vec(),
                ),
                other => (format!("{k:?}"), format!("{other:?}"), vec![]),
            })
            .collect()
    };
    let local = pt::read_pt_keys(&big, &["b"]).unwrap();
    let local_b = local.clone();
    let before = source::stats().bytes;
    let remote = pt::read_pt_keys(url, &["b"]).unwrap();
    let one = source::stats().bytes - before;
    assert_eq!(tensors(&remote), tensors(&local));
    let b = &tensors(&local)[0];
    assert_eq!((b.0.as_str(), b.2.len()), ("Str(\"b\")", 1 << 20));
    let names = |keys: &[&str]| {
        let mut n = vec!["big/data.pkl".to_string(), "big/byteorder".to_string()];
        n.extend(keys.iter().map(|k| format!("big/data/{k}")));
        n
    };
    let want = zip_bytes(&big, &names(&[&b.1]));
    let size = big.metadata().unwrap().len();
    assert!(
        one >= 1 << 20 && one as f64 <= 1.1 * want as f64,
        "one key: fetched {one} bytes for {want} bytes of members and directory ({size} in all)"
    );
    let whole_local = pt::read_pt(&big).unwrap();
    let whole = pt::read_pt(url).unwrap();
    let all = source::stats().bytes - before;
    assert_eq!(tensors(&whole), tensors(&whole_local));
    let keys: Vec<String> = tensors(&whole_local)
        .into_iter()
        .filter(|t| !t.2.is_empty())
        .map(|t| t.1)
        .collect();
    assert_eq!(keys.len(), 3);
    let want_all = zip_bytes(
        &big,
        &names(&keys.iter().map(|k| k.as_str()).collect::<Vec<_>>()),
    );
    assert!(
        all >= 3 << 20 && all as f64 <= 1.1 * want_all as f64,
        "whole: fetched {all} bytes for {want_all} of members and directory ({size} in all)"
    );
    // The same for a .safetensors: the length and header, then one tensor's bytes.
    let st = big.with_extension("safetensors");
    let url = Path::new("s3://bucket/ckpt/big.safetensors");
    let local = safetensors::read_safetensors_keys(&st, &["b"]).unwrap();
    let before = source::stats().bytes;
    let remote = safetensors::read_safetensors_keys(url, &["b"]).unwrap();
    let st_one = source::stats().bytes - before;
    assert_eq!(tensors(&remote), tensors(&local));
    let b = &tensors(&local)[0];
    assert_eq!(
        (b.0.as_str(), &b.2[4..8]),
        ("Str(\"b\")", &0.5f32.to_le_bytes()[..])
    );
    let raw = std::fs::read(&st).unwrap();
    let st_want = 8 + u64::from_le_bytes(raw[..8].try_into().unwrap()) + (1 << 20);
    assert!(
        st_one >= 1 << 20 && st_one as f64 <= 1.1 * st_want as f64,
        "safetensors: fetched {st_one} bytes for {st_want} of header and tensor ({} in all)",
        raw.len()
    );
    // CRC-32 still checked on the members fetched: `bad.pt` has a byte of `c`'s storage
    // flipped; `b` alone reads (its members are sound), the whole file fails naming it.
    let bad = Path::new("s3://bucket/ckpt/bad.pt");
    let only_b = pt::read_pt_keys(bad, &["b"]).unwrap();
    assert_eq!(tensors(&only_b), tensors(&local_b));
    let err = pt::read_pt(bad).unwrap_err().to_string();
    assert!(
        err.contains("s3://bucket/ckpt/bad.pt")
            && err.contains("big/data/2")
            && err.contains("CRC-32"),
        "{err}"
    );
    println!(
        "ranged_child checked: one key {one} of {want}, whole {all} of {want_all}, file {size}; safetensors one key {st_one} of {st_want}"
    );
}

/// A truncated object among good ones is set aside as a truncated local file is: the same
/// report for the rest, the same exit code (2), and the object's URL named.
#[test]
fn a_truncated_object_is_set_aside_like_a_local_file() {
    let Some(m) = moto() else { return };
    let trunc = m.tmp.join("trunc");
    let local = Command::cargo_bin("dumpdiff")
        .unwrap()
        .current_dir(root())
        .arg("--self-hosted-dir")
        .arg(&trunc)
        .args(["--weaver-dir", "fixtures/dumps/weaver_pt"])
        .args(["--step", "0", "--format", "json"])
        .output()
        .unwrap();
    let remote = dumpdiff(m, &m.key)
        .args(["--self-hosted-dir", "s3://bucket/run/self_hosted_trunc"])
        .args(["--weaver-dir", "s3://bucket/run/weaver"])
        .args(["--step", "0", "--format", "json"])
        .output()
        .unwrap();
    let (lerr, rerr) = (
        String::from_utf8_lossy(&local.stderr),
        String::from_utf8_lossy(&remote.stderr),
    );
    assert_eq!(local.status.code(), Some(2), "{lerr}");
    assert_eq!(remote.status.code(), Some(2), "{rerr}");
    let url = format!("s3://bucket/run/self_hosted_trunc/{TRUNCATED}");
    let text = String::from_utf8(remote.stdout).unwrap();
    assert!(text.contains(&url) || rerr.contains(&url), "{rerr}\n{text}");
    let text = text
        .replace(
            "s3://bucket/run/self_hosted_trunc",
            &trunc.display().to_string(),
        )
        .replace("s3://bucket/run/weaver", "fixtures/dumps/weaver_pt");
    assert!(!text.is_empty());
    assert_eq!(text, String::from_utf8(local.stdout).unwrap());
}

/// `losscheck --dump-dir` on the trees in the store: the local report and exit code (a
/// clean tree and the faulty weaver tree, exit 1).
#[test]
fn losscheck_on_s3_gives_the_local_report() {
    let Some(m) = moto() else { return };
    for (tree, prefix) in [
        ("weaver_faulty_pt", "run/weaver_faulty"),
        ("weaver_pt", "run/weaver"),
    ] {
        let run = |dir: &str| {
            in_store(Command::cargo_bin("losscheck").unwrap(), m, &m.key)
                .args(["--format", "json", "--step", "0", "--dump-dir", dir])
                .output()
                .unwrap()
        };
        let local = run(&format!("fixtures/dumps/{tree}"));
        let remote = run(&format!("s3://bucket/{prefix}"));
        assert_eq!(
            remote.status.code(),
            local.status.code(),
            "{}",
            String::from_utf8_lossy(&remote.stderr)
        );
        let text = String::from_utf8(remote.stdout).unwrap().replace(
            &format!("s3://bucket/{prefix}"),
            &format!("fixtures/dumps/{tree}"),
        );
        assert_eq!(text, String::from_utf8(local.stdout).unwrap(), "{tree}");
    }
    let faulty = in_store(Command::cargo_bin("losscheck").unwrap(), m, &m.key)
        .args(["--step", "0", "--dump-dir", "s3://bucket/run/weaver_faulty"])
        .output()
        .unwrap();
    assert_eq!(faulty.status.code(), Some(1));
}

/// `logscan` on a prefix of logs and on one log object in the store: the local report
/// (paths aside) and exit code (1: the fixture's faults); a missing object: exit 2 naming it.
#[test]
fn logscan_on_s3_gives_the_local_report() {
    let Some(m) = moto() else { return };
    let run = |arg: &str| {
        in_store(Command::cargo_bin("logscan").unwrap(), m, &m.key)
            .args(["--format", "json", arg])
            .output()
            .unwrap()
    };
    for (local, url) in [
        (
            "fixtures/logs/debug_faults",
            "s3://bucket/logs/debug_faults",
        ),
        (
            "fixtures/logs/debug_faults/steps.jsonl",
            "s3://bucket/logs/debug_faults/steps.jsonl",
        ),
    ] {
        let (l, r) = (run(local), run(url));
        assert_eq!(l.status.code(), Some(1), "{local}");
        assert_eq!(
            r.status.code(),
            Some(1),
            "{url}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        let text = String::from_utf8(r.stdout).unwrap().replace(
            "s3://bucket/logs/debug_faults",
            "fixtures/logs/debug_faults",
        );
        assert_eq!(text, String::from_utf8(l.stdout).unwrap(), "{url}");
    }
    let missing = run("s3://bucket/logs/debug_faults/nothing.jsonl");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{err}");
    assert!(
        err.contains("s3://bucket/logs/debug_faults/nothing.jsonl")
            && err.contains("no such object"),
        "{err}"
    );
}

/// `--tol-file` takes a URL as every dump path does: the tolerance file read from the
/// store gives the report the local file gives (and a missing one exits 2 naming it).
#[test]
fn a_tolerance_file_in_the_store_is_read() {
    let Some(m) = moto() else { return };
    let args = |tol: &str| {
        vec![
            "--self-hosted-dir".to_string(),
            "fixtures/dumps/self_hosted_pt".into(),
            "--weaver-dir".into(),
            "fixtures/dumps/weaver_faulty_pt".into(),
            "--step".into(),
            "0".into(),
            "--format".into(),
            "json".into(),
            "--tol-file".into(),
            tol.into(),
        ]
    };
    let local = dumpdiff(m, &m.key)
        .args(args("fixtures/tolerances.toml"))
        .output()
        .unwrap();
    assert_eq!(local.status.code(), Some(1), "{local:?}");
    let remote = dumpdiff(m, &m.key)
        .args(args("s3://bucket/conf/tolerances.toml"))
        .output()
        .unwrap();
    assert_eq!(remote.status.code(), Some(1), "{remote:?}");
    let text = String::from_utf8(remote.stdout).unwrap().replace(
        "s3://bucket/conf/tolerances.toml",
        "fixtures/tolerances.toml",
    );
    assert_eq!(text, String::from_utf8(local.stdout).unwrap());
    let missing = dumpdiff(m, &m.key)
        .args(args("s3://bucket/conf/none.toml"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("s3://bucket/conf/none.toml"));
}

/// `cmd` run from the repository root with the server's endpoint and the IAM user's key.
fn store_cmd(bin: &str, m: &Moto) -> Command {
    in_store(Command::cargo_bin(bin).unwrap(), m, &m.key)
}

/// The local fixture path of a URL of `bucket`: the keys mirror `fixtures/`.
fn as_local(text: &str) -> String {
    text.replace("s3://bucket/", "fixtures/")
}

/// logscan on every kind of log input in the store — tracker files named directly
/// (TensorBoard, W&B `.wandb`, MLflow's SQLite, CSV, Trackio's SQLite and Parquet) and
/// found under a prefix (TensorBoard sub-folders, W&B and MLflow folders), completions
/// named directly (TRL parquet, W&B table JSON, verl rollout JSONL) and sniffed under a
/// prefix (TRL + W&B table, verl, AReaL), a prefix of runs (several runs), a crash
/// bundle, text logs — gives the report and exit code of the local copy, with the URLs
/// where the local report has the fixture paths, and never the temporary copy's path.
#[test]
fn logscan_reads_every_log_kind_from_the_store() {
    let Some(m) = moto() else { return };
    let cases: [(&str, i32); 27] = [
        ("trackers/tb/run_a", 1),
        (
            "trackers/tb/run_a/events.out.tfevents.1795476587.vm.25321.0.run_a",
            1,
        ),
        ("trackers/tb_appended/run", 1),
        ("trackers/wandb/run_a", 1),
        (
            "trackers/wandb/run_a/wandb/offline-run-20261123_232949-fk02vmn2/run-fk02vmn2.wandb",
            1,
        ),
        ("trackers/wandb_full/run_a", 1),
        ("trackers/wandb_files/run_a", 1),
        ("trackers/wandb_resumed/run", 1),
        ("trackers/mlflow/run_a", 1),
        ("trackers/mlflow_db/run_a", 1),
        ("trackers/mlflow_db/run_a/mlflow.db", 1),
        ("trackers/csv/plain_a.csv", 1),
        ("trackers/csv/wandb_export_a.csv", 1),
        ("trackers/trackio/run_a/rlf_fixture.db", 1),
        ("trackers/trackio/run_a/rlf_fixture.parquet", 1),
        ("completions/trl_garbled", 1),
        (
            "completions/trl_blank/completions/completions_00001.parquet",
            1,
        ),
        (
            "completions/trl_blank/wandb_table/completions_17_feeab71b9b636e20f80d.table.json",
            1,
        ),
        ("completions/verl_leak", 1),
        ("completions/verl_leak/1.jsonl", 1),
        ("completions/areal_identical", 1),
        ("completions/verl_tb_leak", 1),
        ("runs", 1),
        ("runs/20251009-091500", 1),
        ("runs/20251009-130000/failures/20251009-130245-step-0041", 0),
        ("trackers/mlflow", 1),
        ("trackers/manifest.json", 2),
    ];
    for (key, code) in cases {
        let run = |arg: &str| {
            store_cmd("logscan", m)
                .args(["--format", "json", arg])
                .output()
                .unwrap()
        };
        let (l, r) = (
            run(&format!("fixtures/{key}")),
            run(&format!("s3://bucket/{key}")),
        );
        let (lerr, rerr) = (
            String::from_utf8_lossy(&l.stderr),
            String::from_utf8_lossy(&r.stderr),
        );
        assert_eq!(l.status.code(), Some(code), "{key}: {lerr}");
        assert_eq!(r.status.code(), Some(code), "{key}: {rerr}");
        let (lout, rout) = (
            String::from_utf8(l.stdout).unwrap(),
            String::from_utf8(r.stdout).unwrap(),
        );
        assert!(
            !rout.contains("rlf-fetch") && !rerr.contains("rlf-fetch"),
            "{key}"
        );
        if code == 2 {
            // A JSON that is no log: refused as locally, naming the URL.
            assert!(rerr.contains(&format!("s3://bucket/{key}")), "{rerr}");
            assert_eq!(as_local(&rerr), lerr.to_string(), "{key}");
            continue;
        }
        assert!(rout.contains("s3://bucket/"), "{key}: {rout}");
        assert_eq!(as_local(&rout), lout, "{key}");
    }
    // --compare of a run in the store and a local one, and --output: the local report.
    let compare = |a: &str| {
        store_cmd("logscan", m)
            .args([
                "--compare",
                "--format",
                "json",
                a,
                "fixtures/trackers/tb/run_b",
            ])
            .output()
            .unwrap()
    };
    let (l, r) = (
        compare("fixtures/trackers/tb/run_a"),
        compare("s3://bucket/trackers/tb/run_a"),
    );
    assert_eq!(l.status.code(), r.status.code());
    let rout = String::from_utf8(r.stdout).unwrap();
    assert!(rout.contains("s3://bucket/trackers/tb/run_a"), "{rout}");
    assert_eq!(as_local(&rout), String::from_utf8(l.stdout).unwrap());
    let out = m.tmp.join("logscan-output.json");
    let r = store_cmd("logscan", m)
        .args(["s3://bucket/logs/healthy", "--format", "json", "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(0));
    let written = std::fs::read_to_string(&out).unwrap();
    assert!(
        written.contains("\"s3://bucket/logs/healthy/steps.jsonl\""),
        "{written}"
    );
    assert!(!written.contains("rlf-fetch"));
    // Several runs under a prefix are listed as a local parent folder lists them.
    let several = store_cmd("logscan", m)
        .args(["s3://bucket/runs"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&several.stdout);
    assert!(
        text.starts_with(
            "3 runs, each scanned on its own: s3://bucket/runs/20251009-091500, \
             s3://bucket/runs/20251009-130000, s3://bucket/runs/20251009-160000"
        ),
        "{text}"
    );
}

/// A prefix fetches its logs and nothing else: `--stats` counts exactly the bytes of the
/// two logs (their local sizes), not the checkpoints beside them, which are named on
/// stderr as not fetched.
#[test]
fn a_log_prefix_fetches_only_its_logs() {
    let Some(m) = moto() else { return };
    let out = store_cmd("logscan", m)
        .args(["--stats", "--format", "json", "s3://bucket/logs/healthy"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let want: u64 = ["events.jsonl", "steps.jsonl"]
        .iter()
        .map(|f| {
            root()
                .join("fixtures/logs/healthy")
                .join(f)
                .metadata()
                .unwrap()
                .len()
        })
        .sum();
    let line = err
        .lines()
        .find(|l| l.starts_with("logscan: fetched "))
        .unwrap_or_else(|| panic!("no --stats line in {err}"));
    let bytes: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert_eq!(bytes, want, "{err}");
    let ckpt_bytes: u64 = std::fs::read_dir(m.tmp.join("ckpt"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let n = std::fs::read_dir(m.tmp.join("ckpt")).unwrap().count();
    assert!(
        err.contains(&format!(
            "logscan: not fetched: {n} object(s) of {ckpt_bytes} bytes"
        )) && err.contains("s3://bucket/logs/healthy/checkpoint-10/big.safetensors"),
        "{err}"
    );
}

/// The objects under `prefix` in `bucket` (sorted keys), listed with boto3.
fn list_keys(m: &Moto, prefix: &str) -> Vec<String> {
    let python = std::env::var("RLF_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import boto3, os, sys\n\
        s = boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL'], region_name='us-east-1')\n\
        r = s.list_objects_v2(Bucket='bucket', Prefix=sys.argv[1])\n\
        print('\\n'.join(sorted(o['Key'] for o in r.get('Contents', []))))";
    let out = StdCommand::new(python)
        .args(["-c", script, prefix])
        .env("AWS_ENDPOINT_URL", &m.endpoint)
        .env("AWS_ACCESS_KEY_ID", &m.key)
        .env("AWS_SECRET_ACCESS_KEY", &m.secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The text of one object of `bucket`, fetched with boto3 (independently of the
/// library's reader).
fn get_text(m: &Moto, key: &str) -> String {
    let python = std::env::var("RLF_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import boto3, os, sys\n\
        s = boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL'], region_name='us-east-1')\n\
        sys.stdout.write(s.get_object(Bucket='bucket', Key=sys.argv[1])['Body'].read().decode())";
    let out = StdCommand::new(python)
        .args(["-c", script, key])
        .env("AWS_ENDPOINT_URL", &m.endpoint)
        .env("AWS_ACCESS_KEY_ID", &m.key)
        .env("AWS_SECRET_ACCESS_KEY", &m.secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// postmortem on a run folder and on a crash bundle in the store: the local report
/// (JSON, markdown) and exit code; `--output` to a URL puts every file the local
/// `--output` writes, with the same text (URLs for paths); `--dumps` prefixes give the
/// local verdict.
#[test]
fn postmortem_reads_runs_and_bundles_from_the_store() {
    let Some(m) = moto() else { return };
    for (key, format) in [
        ("runs/20251009-091500", "json"),
        ("runs/20251009-130000", "markdown"),
        (
            "runs/20251009-160000/failures/20251009-161214-step-0057",
            "json",
        ),
        ("runs/partial_bundle/20251009-170000-step-0005", "markdown"),
    ] {
        let run = |arg: &str| {
            store_cmd("postmortem", m)
                .args(["--format", format, arg])
                .output()
                .unwrap()
        };
        let (l, r) = (
            run(&format!("fixtures/{key}")),
            run(&format!("s3://bucket/{key}")),
        );
        assert_eq!(l.status.code(), Some(1), "{key}: {l:?}");
        assert_eq!(r.status.code(), Some(1), "{key}: {r:?}");
        let rout = String::from_utf8(r.stdout).unwrap();
        assert!(!rout.contains("rlf-fetch"), "{key}");
        assert_eq!(
            as_local(&rout),
            String::from_utf8(l.stdout).unwrap(),
            "{key}"
        );
    }
    // --output to a URL: the files the local --output writes, the text ones equal.
    let dir = m.tmp.join("pm-local");
    let _ = std::fs::remove_dir_all(&dir);
    let local = store_cmd("postmortem", m)
        .args(["fixtures/runs/20251009-130000", "--output"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(local.status.code(), Some(1));
    let remote = store_cmd("postmortem", m)
        .args([
            "s3://bucket/runs/20251009-130000",
            "--output",
            "s3://bucket/out/pm/",
        ])
        .output()
        .unwrap();
    assert_eq!(remote.status.code(), Some(1), "{remote:?}");
    let stdout = String::from_utf8(remote.stdout).unwrap();
    assert!(
        stdout.ends_with("report: s3://bucket/out/pm/report.html\n"),
        "{stdout}"
    );
    let mut want: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| format!("out/pm/{}", file_name(&e.unwrap().path())))
        .collect();
    want.sort();
    assert_eq!(list_keys(m, "out/pm/"), want);
    for name in ["summary.json", "report.md", "report.html"] {
        let got = get_text(m, &format!("out/pm/{name}"));
        assert!(got.contains("s3://bucket/runs/20251009-130000"), "{name}");
        assert_eq!(
            as_local(&got),
            std::fs::read_to_string(dir.join(name)).unwrap(),
            "{name}"
        );
    }
    // A failed analysis puts nothing.
    let failed = store_cmd("postmortem", m)
        .args(["s3://bucket/runs", "--output", "s3://bucket/out/none"])
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(2));
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(err.contains("no run found in s3://bucket/runs;"), "{err}");
    assert!(list_keys(m, "out/none").is_empty());
    // --dumps prefixes: the local trees' verdict.
    let dumps = |sh: &str, wv: &str| {
        store_cmd("postmortem", m)
            .args([
                "fixtures/runs/20251009-091500",
                "--format",
                "json",
                "--step",
                "0",
            ])
            .args(["--dumps", sh, "--dumps", wv])
            .output()
            .unwrap()
    };
    let l = dumps(
        "fixtures/dumps/self_hosted_pt",
        "fixtures/dumps/weaver_faulty_pt",
    );
    let r = dumps(
        "s3://bucket/run/self_hosted",
        "s3://bucket/run/weaver_faulty",
    );
    assert_eq!(l.status.code(), Some(1));
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    let text = String::from_utf8(r.stdout)
        .unwrap()
        .replace(
            "s3://bucket/run/self_hosted",
            "fixtures/dumps/self_hosted_pt",
        )
        .replace(
            "s3://bucket/run/weaver_faulty",
            "fixtures/dumps/weaver_faulty_pt",
        );
    assert!(text.contains("FAIL"));
    assert_eq!(text, String::from_utf8(l.stdout).unwrap());
}

/// The new entry points' failures: a missing prefix, wrong credentials and a bad URL,
/// for logscan (a prefix) and postmortem (a run, an `--output`): exit 2, the URL named,
/// no panic, no temporary path.
#[test]
fn log_readers_fail_on_the_store_with_exit_2_naming_the_url() {
    let Some(m) = moto() else { return };
    let cases: [(&str, &[&str], &str, &str, &str); 7] = [
        (
            "logscan",
            &["s3://bucket/nothing/run"],
            "",
            "s3://bucket/nothing/run",
            "no such object",
        ),
        (
            "logscan",
            &["s3://bucket/runs"],
            "AKIAWRONGWRONGWRONG1",
            "s3://bucket/runs",
            "access denied",
        ),
        (
            "logscan",
            &["s3:///runs"],
            "",
            "s3:///runs",
            "not a usable object-store URL",
        ),
        (
            "postmortem",
            &["s3://bucket/runs/none"],
            "",
            "s3://bucket/runs/none",
            "no such object",
        ),
        (
            "postmortem",
            &["s3://bucket/runs/20251009-091500"],
            "AKIAWRONGWRONGWRONG1",
            "s3://bucket/runs/20251009-091500",
            "access denied",
        ),
        (
            "postmortem",
            &["s3:///r"],
            "",
            "s3:///r",
            "not a usable object-store URL",
        ),
        (
            "postmortem",
            &[
                "fixtures/runs/20251009-091500",
                "--output",
                "s3://no-bucket/pm",
            ],
            "",
            "s3://no-bucket/pm",
            "no such bucket",
        ),
    ];
    for (bin, args, key, url, says) in cases {
        let key = if key.is_empty() { m.key.as_str() } else { key };
        let out = in_store(Command::cargo_bin(bin).unwrap(), m, key)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {err}");
        assert!(
            err.contains(url) && err.contains(says),
            "{bin} {args:?}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("rlf-fetch"),
            "{err}"
        );
    }
}

/// `mismatch` on a stack's step in the store (verl's `step_3`, slime's `debug`): the local
/// report and exit code. Already read through `producers/walk.rs`; pinned here so that
/// docs/storage.md's "every reader" holds for it too.
#[test]
fn mismatch_reads_a_step_from_the_store() {
    let Some(m) = moto() else { return };
    for key in ["verl/step_3", "slime/debug"] {
        let run = |arg: &str| {
            store_cmd("mismatch", m)
                .args(["--format", "json", arg])
                .output()
                .unwrap()
        };
        let (l, r) = (
            run(&format!("fixtures/stacks/{key}")),
            run(&format!("s3://bucket/stacks/{key}")),
        );
        assert_eq!(l.status.code(), Some(0), "{key}: {l:?}");
        assert_eq!(r.status.code(), Some(0), "{key}: {r:?}");
        let rout = String::from_utf8(r.stdout).unwrap();
        assert!(rout.contains("s3://bucket/stacks/"), "{rout}");
        assert_eq!(
            as_local(&rout),
            String::from_utf8(l.stdout).unwrap(),
            "{key}"
        );
    }
}

/// A plain HTTP server (Python's `http.server` over `fixtures/`, no listing): a log and
/// an MLflow SQLite database named by `http://` URL give the local report; a missing one
/// exits 2 naming the URL. Skipped without python3.
#[test]
fn logscan_reads_one_object_over_plain_http() {
    let python = std::env::var("RLF_PYTHON").unwrap_or_else(|_| "python3".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    /// Stops the server however the test ends.
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let Ok(child) = StdCommand::new(&python)
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(root().join("fixtures"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        println!("skipped: no {python} for the HTTP server");
        return;
    };
    let _stop = Stop(child);
    let base = format!("http://127.0.0.1:{port}/");
    let up = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(up, "the HTTP server did not start");
    let run = |arg: &str| {
        Command::cargo_bin("logscan")
            .unwrap()
            .current_dir(root())
            .args(["--format", "json", arg])
            .output()
            .unwrap()
    };
    for rel in [
        "logs/debug_faults/steps.jsonl",
        "trackers/mlflow_db/run_a/mlflow.db",
    ] {
        let (l, r) = (
            run(&format!("fixtures/{rel}")),
            run(&format!("{base}{rel}")),
        );
        assert_eq!(l.status.code(), Some(1), "{rel}");
        assert_eq!(r.status.code(), Some(1), "{rel}: {r:?}");
        let rout = String::from_utf8(r.stdout)
            .unwrap()
            .replace(&base, "fixtures/");
        assert_eq!(rout, String::from_utf8(l.stdout).unwrap(), "{rel}");
    }
    let missing = run(&format!("{base}logs/nothing.jsonl"));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2));
    assert!(err.contains(&format!("{base}logs/nothing.jsonl")) && err.contains("no such object"));
}
