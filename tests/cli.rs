//! The `dumpdiff` binary as a user meets it: `--inspect` on good and malformed inputs,
//! exit codes of SPEC §1, errors naming file and position, inputs never modified.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn dumpdiff() -> Command {
    Command::cargo_bin("dumpdiff").unwrap()
}

#[test]
fn inspect_prints_the_tree_of_a_pt_file() {
    let f = fixtures().join("dumps/self_hosted_pt/forward_data/step_000000_rank0_micro0.pt");
    dumpdiff()
        .arg("--inspect")
        .arg(&f)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("log_probs: tensor float32 [2, "))
        .stdout(predicate::str::contains("entropy: tensor bfloat16"))
        .stdout(predicate::str::contains("response_mask: tensor int32"))
        .stdout(predicate::str::contains("input_ids: tensor int64"));
}

#[test]
fn inspect_shows_a_strided_view_and_its_storage() {
    // The generator slices this file's log_probs out of a wider tensor (manifest:
    // strides [25, 1], storage offset 1, storage of 50 elements).
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("expected/manifest.json")).unwrap(),
    )
    .unwrap();
    let f = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["tree"] == "self_hosted_pt"
                && f["tensors"]["log_probs"]["storage_offset"].as_u64() == Some(1)
        })
        .expect("a view in the fixtures");
    let t = &f["tensors"]["log_probs"];
    let strides = format!(
        "strides [{}, {}] offset 1",
        t["strides"][0], t["strides"][1]
    );
    let storage = format!("with {} elements", t["storage_numel"]);
    dumpdiff()
        .arg("--inspect")
        .arg(fixtures().join("dumps").join(f["path"].as_str().unwrap()))
        .assert()
        .code(0)
        .stdout(predicate::str::contains(strides))
        .stdout(predicate::str::contains(storage));
}

#[test]
fn inspect_a_folder_shows_its_layout_and_holes() {
    dumpdiff()
        .arg("--inspect")
        .arg(fixtures().join("dumps/weaver_faulty_pt"))
        .assert()
        .code(0)
        .stdout(predicate::str::contains("producer: weaver"))
        .stdout(predicate::str::contains("0-9,11"));
}

#[test]
fn export_frames_writes_three_parquet_files() {
    let dir = tempfile::tempdir().unwrap();
    dumpdiff()
        .arg("--inspect")
        .arg(fixtures().join("dumps/self_hosted_pt"))
        .arg("--export-frames")
        .arg(dir.path())
        .arg("--step")
        .arg("0")
        .assert()
        .code(0);
    for name in ["scalars", "tokens", "trajectories"] {
        use polars::prelude::SerReader;
        let file = std::fs::File::open(dir.path().join(format!("{name}.parquet"))).unwrap();
        let df = polars::prelude::ParquetReader::new(file).finish().unwrap();
        assert!(df.height() > 0, "{name}");
    }
}

/// Each malformed input: exit 2, the file named, a position given, nothing modified.
#[test]
fn malformed_inputs_exit_2_naming_file_and_position() {
    let cases: &[(&str, &[&str])] = &[
        ("corrupt/pt/truncated.pt", &[]),
        ("corrupt/pt/missing_storage.pt", &["zip member"]),
        ("corrupt/pt/os_system.pt", &["os.system", "opcode"]),
        ("corrupt/pt/builtins_eval.pt", &["builtins.eval", "opcode"]),
        (
            "corrupt/pt/subprocess_popen.pt",
            &["subprocess.Popen", "opcode"],
        ),
        ("corrupt/pt/huge_shape.pt", &["opcode"]),
        ("corrupt/pt/empty.pt", &[]),
        ("corrupt/pt/not_zip.pt", &[]),
        ("corrupt/pt/deep_nested.pt", &["opcode"]),
        ("corrupt/npy/forged_shape.npy", &[]),
        ("corrupt/jsonl/truncated_line.jsonl", &["line"]),
    ];
    for (rel, needles) in cases {
        let path = fixtures().join(rel);
        let before = std::fs::read(&path).unwrap();
        let out = dumpdiff().arg("--inspect").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{rel}: {stderr}");
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(stderr.contains(name.as_ref()), "{rel}: {stderr}");
        assert!(
            ["byte", "line", "zip member", "opcode", "file"]
                .iter()
                .any(|p| stderr.contains(p)),
            "{rel}: no position in {stderr}"
        );
        for n in *needles {
            assert!(stderr.contains(n), "{rel}: {n:?} not in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{rel}: {stderr}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "{rel} was modified");
    }
}

#[test]
fn not_a_dump_folder_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    dumpdiff()
        .arg("--inspect")
        .arg(dir.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no dump folders found"));
    dumpdiff()
        .arg("--inspect")
        .arg(dir.path().join("absent.pt"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("absent.pt"));
}
