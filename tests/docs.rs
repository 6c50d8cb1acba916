//! The documentation a user reads first, checked: README.md stays a page (≤ 300 lines), every
//! relative link in README.md, CHANGELOG.md, docs/*.md and fixtures/README.md points to a file
//! in the repository, every command the README shows runs as written with the exit code it
//! states and prints the excerpt shown under it, and its library example compiles and runs
//! (`tests/readme_example.rs` is that example, byte for byte).

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Files other branches of issue 27 add: a link to one of them is checked once it exists.
const PENDING: &[&str] = &[];

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn readme_is_at_most_300_lines() {
    let n = read("README.md").lines().count();
    assert!(n <= 300, "README.md has {n} lines");
}

/// The Markdown files whose links are checked, relative to the root.
fn markdown_files() -> Vec<String> {
    let mut v = vec![
        "README.md".to_string(),
        "CHANGELOG.md".to_string(),
        "fixtures/README.md".to_string(),
    ];
    let mut docs: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// The targets of `[text](target)` links in `md`, outside code spans and fenced blocks.
fn link_targets(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop code spans: a link inside backticks is text.
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_resolves_to_a_file_in_the_repository() {
    let root = Path::new(ROOT).canonicalize().unwrap();
    let mut checked = 0;
    let mut bad = Vec::new();
    for file in markdown_files() {
        let dir = Path::new(ROOT).join(&file).parent().unwrap().to_path_buf();
        for target in link_targets(&read(&file)) {
            if target.contains("://") || target.starts_with("mailto:") || target.starts_with('#') {
                continue;
            }
            let path = target.split('#').next().unwrap();
            let full = dir.join(path);
            let rel = full
                .canonicalize()
                .ok()
                .and_then(|p| p.strip_prefix(&root).ok().map(Path::to_path_buf));
            match rel {
                Some(r) if Path::new(ROOT).join(&r).exists() => checked += 1,
                _ => {
                    let pending = PENDING
                        .iter()
                        .any(|p| Path::new(ROOT).join(p) == normalise(&full));
                    if pending {
                        println!("skipped: {file} links {target}, which another branch adds");
                    } else {
                        bad.push(format!("{file}: {target}"));
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "links to nothing in the repository: {bad:#?}"
    );
    assert!(checked >= 20, "only {checked} links found");
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The fenced blocks of `md` with their language, in order.
fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in md.lines() {
        if let Some(lang) = line.strip_prefix("```") {
            match cur.take() {
                Some(b) => out.push(b),
                None => cur = Some((lang.trim().to_string(), String::new())),
            }
        } else if let Some((_, text)) = cur.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

const TOOLS: [&str; 5] = ["dumpdiff", "losscheck", "logscan", "mismatch", "postmortem"];

#[test]
fn every_readme_command_runs_as_written_with_its_exit_code_and_excerpt() {
    let bin = Path::new(env!("CARGO_BIN_EXE_dumpdiff")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A fresh folder holding only the fixtures, so outputs land outside the repository.
    let cwd = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        Path::new(ROOT).join("fixtures"),
        cwd.path().join("fixtures"),
    )
    .unwrap();
    let mut ran = 0;
    let mut last: Option<(String, String)> = None;
    for (lang, text) in blocks(&read("README.md")) {
        match lang.as_str() {
            "sh" => {
                for line in text.lines() {
                    let Some((cmd, code)) = line.split_once("   # exit ") else {
                        continue;
                    };
                    let tool = cmd.split(' ').next().unwrap();
                    assert!(TOOLS.contains(&tool), "{line}");
                    let want: i32 = code.trim().parse().unwrap();
                    let o = std::process::Command::new("bash")
                        .arg("-c")
                        .arg(cmd)
                        .current_dir(cwd.path())
                        .env("PATH", &path)
                        .env("COLUMNS", "100")
                        .env_remove("NO_COLOR")
                        .output()
                        .unwrap();
                    let stderr = String::from_utf8_lossy(&o.stderr);
                    assert_eq!(o.status.code(), Some(want), "{cmd}\n{stderr}");
                    assert_eq!(stderr, "", "{cmd}");
                    last = Some((cmd.to_string(), String::from_utf8(o.stdout).unwrap()));
                    ran += 1;
                }
            }
            "text" => {
                let (cmd, out) = last.as_ref().expect("an excerpt after a command");
                for l in text.lines().filter(|l| l.trim() != "…") {
                    let l = l.trim_end_matches('…').trim_end_matches("; ").trim_end();
                    assert!(
                        out.lines().any(|o| o.starts_with(l)),
                        "{cmd}: {l:?} is not in its output:\n{out}"
                    );
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        ran, 8,
        "one example per command (dumpdiff, losscheck and logscan: two)"
    );
}

mod readme_example {
    include!("readme_example.rs");

    /// The README's `main`, callable from the test.
    pub fn run() -> Result<(), rlforensics::Error> {
        main()
    }
}

#[test]
fn readme_library_example_is_this_one_and_runs() {
    let md = read("README.md");
    let rust: Vec<String> = blocks(&md)
        .into_iter()
        .filter(|(l, _)| l == "rust")
        .map(|(_, t)| t)
        .collect();
    assert_eq!(rust.len(), 1);
    assert_eq!(rust[0], read("tests/readme_example.rs"));
    // Cargo runs integration tests from the package root, where the fixture paths point.
    assert_eq!(
        std::env::current_dir().unwrap().canonicalize().unwrap(),
        Path::new(ROOT).canonicalize().unwrap()
    );
    readme_example::run().unwrap();
}
