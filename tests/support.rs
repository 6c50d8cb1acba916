//! Helpers shared by the integration tests.

use std::path::Path;

use assert_cmd::Command;
use serde_json::Value as Json;

/// Copy a dump tree (two levels: kind folders, files).
pub fn copy_tree(src: &Path, dst: &Path) {
    for kind in std::fs::read_dir(src).unwrap() {
        let kind = kind.unwrap().path();
        let out = dst.join(kind.file_name().unwrap());
        std::fs::create_dir_all(&out).unwrap();
        for f in std::fs::read_dir(&kind).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, out.join(f.file_name().unwrap())).unwrap();
        }
    }
}

/// `losscheck --format json --dump-dir TREE`: its exit code and report.
pub fn losscheck_json(tree: &Path) -> (i32, Json) {
    let out = Command::cargo_bin("losscheck")
        .unwrap()
        .args(["--format", "json", "--dump-dir"])
        .arg(tree)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}
