//! Helpers shared by the integration tests.

use std::path::Path;

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
