//! The corpus rule: tests that read the real logs in `../shared/corpus` (kept beside the
//! repository, never in it) go through [`corpus`]. Where the corpus is found they run; where
//! it is not, they return early and one line on stderr says that the corpus tests did not
//! run — unless `RLF_REQUIRE_CORPUS=1` (set by `.ci/run`), which turns a missing corpus into
//! a failure. `RLF_CORPUS_DIR` points at another copy (`.ci/run` points it at nothing to
//! test the fresh-clone case). Every test that calls [`corpus`] is named `corpus_*`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Once;

/// The corpus root: `$RLF_CORPUS_DIR`, else `../shared/corpus` beside the repository.
pub fn corpus_root() -> PathBuf {
    match std::env::var_os("RLF_CORPUS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus"),
    }
}

/// True when `.ci/run` (or a developer) demands the corpus tests.
pub fn corpus_required() -> bool {
    std::env::var("RLF_REQUIRE_CORPUS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `sub` (e.g. `droid-finetuning/20251008-110028` or `real-logs/verl-7412-clip-ratio.log`)
/// inside the corpus, or `None` when the corpus is absent and not required. A corpus that is
/// present but lacks `sub` is always a failure: the test names a file that is not there.
pub fn corpus(sub: &str) -> Option<PathBuf> {
    let root = corpus_root();
    if !root.is_dir() {
        assert!(
            !corpus_required(),
            "RLF_REQUIRE_CORPUS is set but the corpus is missing: {} (needed for {sub})",
            root.display()
        );
        announce_missing(&root);
        return None;
    }
    let p = root.join(sub);
    assert!(
        p.exists(),
        "the corpus at {} has no {sub}: the test names a file that is not there",
        root.display()
    );
    Some(p)
}

/// One line, once per test binary, straight to stderr (libtest captures only the print
/// macros, so this shows under `cargo test` without `--nocapture`).
fn announce_missing(root: &std::path::Path) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "note: corpus tests not run (every test named corpus_*): no corpus at {} \
             (set RLF_CORPUS_DIR to a copy; RLF_REQUIRE_CORPUS=1 makes this a failure, as in CI)",
            root.display()
        );
    });
}
