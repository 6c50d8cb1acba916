//! The crate's structure, checked (ARCHITECTURE.md): imports point down the layers only;
//! no circle between modules at any depth; tools are peers (none imports another, except
//! the one orchestrator, postmortem); tools read dumps only through the model (no
//! `producers`, `formats`, `value::Value` or producer key in a tool module); no source
//! file is over 800 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer of each top-level module of `src/`, bottom first. A module may import its own
/// layer or a lower one; no circle anywhere (checked separately).
const LAYERS: &[(&str, u8)] = &[
    ("error", 0),
    ("exit_codes", 0),
    ("fmt", 0),
    ("json", 0),
    ("tensor", 0),
    ("value", 0),
    ("model", 1),
    ("formats", 2),
    ("logs", 2),
    ("producers", 3),
    ("frames", 4),
    ("compare", 5),
    ("conventions", 5),
    ("detect", 5),
    ("kernels", 5),
    ("judge", 6),
    ("dumpdiff", 7),
    ("inspect", 7),
    ("logscan", 7),
    ("losscheck", 7),
    ("mismatch", 7),
    ("postmortem", 7),
    ("render", 8),
    ("cli", 9),
];

/// The tools: each builds one report. They are peers: none imports another, except
/// [`ORCHESTRATOR`].
const TOOLS: &[&str] = &[
    "dumpdiff",
    "inspect",
    "logscan",
    "losscheck",
    "mismatch",
    "postmortem",
];

/// The one tool allowed to call the others (it runs them on a run's folder and writes one
/// report of their reports).
const ORCHESTRATOR: &str = "postmortem";

/// Modules below the model a tool must not import: a tool reads a step as
/// `model::step` records handed to it by a producer, never a file's bytes or keys.
const BELOW_THE_MODEL: &[&str] = &["producers", "formats", "value"];

/// Longest source file allowed, in lines.
const MAX_LINES: usize = 800;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Module path of a file below `src/`: `src/kernels/fused/row.rs` → `[kernels, fused, row]`
/// (`mod.rs` names its folder; `lib.rs` and `bin/` are not modules of the library).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// `text` without its `//` comments and without an inline `#[cfg(test)] mod … { … }`
/// at its end (a test module's `super::` names the file itself, not its parent).
fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut end = lines.len();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.contains('{'))
        {
            end = i;
            break;
        }
    }
    lines[..end]
        .iter()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The leading identifier of `s`.
fn ident(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Items `lib.rs` re-exports at the crate root, with the module they live in.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("Error", "error"),
    ("FormatError", "error"),
    ("Position", "error"),
    ("Result", "error"),
    ("DType", "tensor"),
    ("Tensor", "tensor"),
    ("Value", "value"),
];

/// The paths a use tree starting at `s` names, each appended to `prefix`: `a::b`,
/// `a::{b, c::{d, self}}`, `a::*` (the glob names `a`).
fn expand(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        for item in top_level_items(group) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if ident(item) == "self" {
                out.push(prefix.clone());
            } else {
                expand(item, prefix.clone(), out);
            }
        }
        return;
    }
    if s.starts_with('*') {
        out.push(prefix);
        return;
    }
    let id = ident(s);
    if id.is_empty() {
        out.push(prefix);
        return;
    }
    let mut p = prefix;
    p.push(id.clone());
    match s.trim_start()[id.len()..].strip_prefix("::") {
        Some(rest) => expand(rest, p, out),
        None => out.push(p),
    }
}

/// Every path a file of module `module` names from the crate root: `crate::…` (each
/// item of a group counts), `super::…` (any number of them) and `self::…`, resolved
/// against `module`, a root re-export (`crate::Error`) named by its module. Comments and
/// an inline test module are left out ([`code_of`]).
fn paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = code_of(text);
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|k| rest.starts_with(**k));
        let Some(k) = starts else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let before = if i == 0 { b' ' } else { b[i - 1] };
        if before.is_ascii_alphanumeric() || before == b'_' || before == b'$' || before == b':' {
            i += k.len();
            continue;
        }
        let mut base: Vec<String> = match *k {
            "crate::" => Vec::new(),
            "self::" => module.to_vec(),
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        let mut after = &rest[k.len()..];
        while let Some(r) = after.strip_prefix("super::") {
            base.pop();
            after = r;
        }
        let mut found = Vec::new();
        expand(after, base, &mut found);
        for mut p in found {
            if let Some(first) = p.first() {
                if let Some((_, m)) = ROOT_ITEMS.iter().find(|(item, _)| item == first) {
                    p = vec![m.to_string()];
                }
            }
            if !p.is_empty() {
                out.push(p);
            }
        }
        i += k.len() + (rest.len() - k.len() - after.len());
    }
    out
}

/// [`paths`] of a file of this crate, less those whose first segment is no top-level
/// module (an inline module's `super::` resolved as if it were the file's: `alloc.rs`'s
/// `mod imp { use super::HugeBlocks; }`).
fn crate_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    paths(text, module)
        .into_iter()
        .filter(|p| LAYERS.iter().any(|(m, _)| *m == p[0]))
        .collect()
}

/// `a` and `b` of each path a file names (`b` empty when there is none): the form the
/// layer check reads.
fn imports(text: &str, module: &[String]) -> BTreeSet<(String, String)> {
    crate_paths(text, module)
        .into_iter()
        .map(|p| (p[0].clone(), p.get(1).cloned().unwrap_or_default()))
        .collect()
}

/// The items of a `{…}` group up to its closing brace, split at top-level commas.
fn top_level_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// One file's imports: its path relative to `src/`, its module path, the paths it names.
type ImportMap = (String, Vec<String>, Vec<Vec<String>>);

/// One file of the library: path relative to `src/`, module path, text.
type File = (PathBuf, Vec<String>, String);

/// Files of the library, `lib.rs` and `bin/` left out.
fn library_files() -> Vec<File> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(src()).expect("under src").to_path_buf();
            if rel.starts_with("bin") || rel == Path::new("lib.rs") {
                return None;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel:?}: {e}"));
            Some((rel.clone(), module_of(&rel), text))
        })
        .collect()
}

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| panic!("module `{module}` has no layer in tests/layers.rs"))
}

/// A circle in `edges` (a directed graph), as the list of nodes around it.
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == m).expect("on the stack");
                    let mut circle = stack[from..].to_vec();
                    circle.push(m.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The module graph at every depth: a file of module `M` naming a path into module `Q`
/// (the longest prefix of the path that is a module of `modules`) is an edge between the
/// two children of their common ancestor that lead to `M` and to `Q` —
/// `postmortem::document::build` using `postmortem::document::dumps::x` is the edge
/// `postmortem::document::build → postmortem::document::dumps`, `dumpdiff::…` using
/// `losscheck::…` the edge `dumpdiff → losscheck`. A module using its own ancestor or
/// descendant is no edge (a parent's `mod.rs` uses its children; a child its parent).
fn module_edges(
    files: &[(Vec<String>, Vec<Vec<String>>)],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, ps) in files {
        for p in ps {
            let q: Vec<String> = (1..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|pre| modules.contains(pre))
                .unwrap_or_else(|| p[..1].to_vec());
            let common = m.iter().zip(&q).take_while(|(a, b)| a == b).count();
            if common == m.len() || common == q.len() {
                continue;
            }
            edges
                .entry(m[..=common].join("::"))
                .or_default()
                .insert(q[..=common].join("::"));
        }
    }
    edges
}

/// Each file of a tool other than [`ORCHESTRATOR`] that names another tool, as
/// `file imports crate::tool`.
fn tools_importing_tools(files: &[ImportMap]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (rel, m, ps) in files {
        if !TOOLS.contains(&m[0].as_str()) || m[0] == ORCHESTRATOR {
            continue;
        }
        for p in ps {
            if p[0] != m[0] && TOOLS.contains(&p[0].as_str()) {
                out.insert(format!("{rel} imports crate::{}", p[0]));
            }
        }
    }
    out.into_iter().collect()
}

/// The key constants producers spell (`pub const NAME: &str` or an array of them) in
/// the files of `producers/`.
fn producer_keys(files: &[File]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (_, m, text) in files.iter().filter(|(_, m, _)| m[0] == "producers") {
        let _ = m;
        for line in code_of(text).lines() {
            let Some(rest) = line.trim_start().strip_prefix("pub const ") else {
                continue;
            };
            let name = ident(rest);
            let ty = rest[name.len()..].split('=').next().unwrap_or("");
            if ty.contains("str") {
                keys.insert(name);
            }
        }
    }
    keys
}

/// Whether the file at `rel` is a test module: its parent declares it under
/// `#[cfg(test)]` (`#[cfg(test)]\nmod tests;`), so it builds a record's raw contents freely.
fn test_only(rel: &Path, files: &[File]) -> bool {
    let Some(stem) = rel.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let Some(dir) = rel.parent() else {
        return false;
    };
    let parents = [dir.join("mod.rs"), dir.with_extension("rs")];
    files
        .iter()
        .filter(|(p, _, _)| parents.contains(p))
        .any(|(_, _, text)| {
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            lines
                .windows(2)
                .any(|w| w[0] == "#[cfg(test)]" && w[1] == format!("mod {stem};"))
        })
}

/// What a tool file names below the model: a path into [`BELOW_THE_MODEL`], or a
/// producer key constant (`keys::LOSS`, `use …::{LOSS}`) from `keys`.
fn below_the_model(
    m: &[String],
    text: &str,
    ps: &[Vec<String>],
    keys: &BTreeSet<String>,
    defines: &dyn Fn(&[String], &str) -> bool,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    if !TOOLS.contains(&m[0].as_str()) {
        return Vec::new();
    }
    for p in ps {
        if BELOW_THE_MODEL.contains(&p[0].as_str()) {
            out.insert(format!("crate::{}", p.join("::")));
        }
    }
    let code = code_of(text);
    // a record's raw contents are a producer's to map, never a tool's to read
    if code.contains(".raw()") || code.contains("Record::raw") {
        out.insert("Record::raw".to_string());
    }
    for k in keys {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(k.as_str()) {
            let before = rest[..i].chars().last();
            let after = rest[i + k.len()..].chars().next();
            let word = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let line_start = rest[..i].rfind('\n').map_or(0, |n| n + 1);
            let in_use = rest[line_start..i].trim_start().starts_with("use ")
                || rest[..i]
                    .rfind("use ")
                    .is_some_and(|u| !rest[u..i].contains(';') && rest[u..i].contains('{'));
            // The path the name ends (`crate::detect::x::METRICS`, `keys::LOSS`): one
            // rooted outside `producers` names another module's constant.
            let path_start = rest[..i]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(0, |n| n + 1);
            let path = &rest[path_start..i];
            // A path rooted at `crate::` whose module defines the name itself names that
            // module's constant, not a producer's (a re-export still counts).
            let use_start = rest[..i].rfind("use ").unwrap_or(0);
            let full = if path.is_empty() && in_use {
                // a grouped name hangs from what precedes the innermost open `{`
                let u = &rest[use_start + 4..i];
                u.rsplit_once('{').map_or(u, |(p, _)| p).trim().to_string()
            } else {
                path.to_string()
            };
            let elsewhere = full.trim_start().strip_prefix("crate::").is_some_and(|p| {
                let module: Vec<String> = p
                    .split("::")
                    .filter(|x| !x.is_empty())
                    .map(String::from)
                    .collect();
                module.first().is_some_and(|t| t != "producers") && defines(&module, k)
            });
            if word && !elsewhere && (rest[..i].ends_with("::") || in_use) {
                out.insert(format!("producer key {k}"));
            }
            rest = &rest[i + k.len()..];
        }
    }
    out.into_iter().collect()
}

#[test]
fn imports_point_down_the_layers() {
    let mut upward = BTreeSet::new();
    for (rel, module, text) in library_files() {
        let own = layer(&module[0]);
        for (a, _) in imports(&text, &module) {
            if a == module[0] {
                continue;
            }
            if layer(&a) > own {
                upward.insert(format!(
                    "{} (layer {own}) imports crate::{a}",
                    rel.display()
                ));
            }
        }
    }
    let upward: Vec<String> = upward.into_iter().collect();
    assert!(
        upward.is_empty(),
        "imports pointing up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_circle_between_modules_at_any_depth() {
    let files = library_files();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(_, m, _)| m.clone()).collect();
    let map: Vec<(Vec<String>, Vec<Vec<String>>)> = files
        .iter()
        .map(|(_, m, t)| (m.clone(), crate_paths(t, m)))
        .collect();
    assert_eq!(find_circle(&module_edges(&map, &modules)), None);
}

#[test]
fn tools_are_peers_except_the_orchestrator() {
    let map: Vec<ImportMap> = library_files()
        .into_iter()
        .map(|(rel, m, t)| (rel.display().to_string(), m.clone(), crate_paths(&t, &m)))
        .collect();
    let found = tools_importing_tools(&map);
    assert!(
        found.is_empty(),
        "tools importing tools:\n{}",
        found.join("\n")
    );
}

#[test]
fn tools_read_dumps_only_through_the_model() {
    let files = library_files();
    let keys = producer_keys(&files);
    assert!(keys.contains("OLD_LOG_PROBS"), "{keys:?}");
    let defines = |module: &[String], name: &str| {
        files.iter().any(|(_, fm, text)| {
            fm.as_slice() == module
                && code_of(text)
                    .lines()
                    .any(|l| l.contains(&format!("const {name}:")))
        })
    };
    let mut found = Vec::new();
    for (rel, m, text) in &files {
        if test_only(rel, &files) {
            continue;
        }
        let what = below_the_model(m, text, &crate_paths(text, m), &keys, &defines);
        if !what.is_empty() {
            found.push(format!("{}: {}", rel.display(), what.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "tool files reading below the model:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_source_file_over_800_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} has {n} lines", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

fn v(path: &str) -> Vec<String> {
    path.split("::").map(String::from).collect()
}

#[test]
fn the_checks_see_what_they_check() {
    // The import reader itself, on the forms the crate uses.
    let m = v("kernels::fused");
    let got = imports(
        "use crate::{\n    error::{Error, Result},\n    model::log,\n};\nuse super::loss::Config;\n// crate::x\nlet y = crate::fmt::num(1.0);",
        &m,
    );
    let want: BTreeSet<(String, String)> = [
        ("error", "Error"),
        ("error", "Result"),
        ("model", "log"),
        ("kernels", "loss"),
        ("fmt", "num"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
    // Full paths at any depth: `super::super`, `self`, groups in groups, a root item, and
    // nothing from a trailing test module.
    let got = paths(
        "use super::super::x::{a, b::{self, c}};\nuse self::y::*;\nfn f() -> crate::Result<()> {}\n#[cfg(test)]\nmod tests {\n    use super::z;\n}",
        &v("p::q::r"),
    );
    assert_eq!(
        got,
        vec![
            v("p::x::a"),
            v("p::x::b"),
            v("p::x::b::c"),
            v("p::q::r::y"),
            v("error")
        ]
    );
    // A circle is found, and a chain is not one.
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_circle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_circle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    // Every module of src/ has a layer (a new module must be placed).
    for (_, module, _) in library_files() {
        layer(&module[0]);
    }
}

#[test]
fn the_structure_rules_fail_on_a_synthetic_crate() {
    // Modules of a small crate, and what each file names.
    let modules: BTreeSet<Vec<String>> = [
        "dumpdiff",
        "dumpdiff::sections",
        "dumpdiff::sections::rows",
        "losscheck",
        "postmortem",
        "postmortem::document",
        "postmortem::document::build",
        "postmortem::document::dumps",
        "judge",
        "producers",
        "producers::weaver",
    ]
    .iter()
    .map(|m| v(m))
    .collect();
    let file = |m: &str, ps: &[&str]| (v(m), ps.iter().map(|p| v(p)).collect::<Vec<_>>());
    // A circle three deep, which a sibling check of depth 2 does not see.
    let deep = vec![
        file(
            "postmortem::document::build",
            &["postmortem::document::dumps::section"],
        ),
        file(
            "postmortem::document::dumps",
            &["postmortem::document::build::cell"],
        ),
        // A parent using its child and a child its parent are not edges.
        file(
            "postmortem::document",
            &["postmortem::document::build::document"],
        ),
        file("dumpdiff::sections::rows", &["dumpdiff::sections::Side"]),
    ];
    assert_eq!(
        find_circle(&module_edges(&deep, &modules)),
        Some(vec![
            "postmortem::document::build".into(),
            "postmortem::document::dumps".into(),
            "postmortem::document::build".into()
        ])
    );
    assert_eq!(find_circle(&module_edges(&deep[1..], &modules)), None);
    // A circle between top-level modules through deep files.
    let top = vec![
        file("dumpdiff::sections::rows", &["judge::StepCheck"]),
        file("judge", &["dumpdiff::sections::rows::Row"]),
    ];
    assert_eq!(
        find_circle(&module_edges(&top, &modules)),
        Some(vec!["dumpdiff".into(), "judge".into(), "dumpdiff".into()])
    );
    // Tools are peers; the orchestrator may call them.
    let tools = vec![
        (
            "dumpdiff/verdicts.rs".to_string(),
            v("dumpdiff::verdicts"),
            vec![v("losscheck::StepCheck"), v("judge::StepCheck")],
        ),
        (
            "postmortem/dumps.rs".to_string(),
            v("postmortem::dumps"),
            vec![v("dumpdiff::run"), v("losscheck::check_tree")],
        ),
        (
            "judge/mod.rs".to_string(),
            v("judge"),
            vec![v("dumpdiff::x")],
        ),
    ];
    assert_eq!(
        tools_importing_tools(&tools),
        vec!["dumpdiff/verdicts.rs imports crate::losscheck".to_string()]
    );
    // A tool naming a producer, a format, a Value or a producer's key is caught; the
    // model, and a non-tool module, are not.
    let keys: BTreeSet<String> = ["OLD_LOG_PROBS".to_string(), "LOSS".to_string()].into();
    // `detect::h` defines its own LOSS; `judge::self_hosted` only re-exports a producer's.
    let defines =
        |module: &[String], name: &str| module == v("detect::h").as_slice() && name == "LOSS";
    let text = "use crate::producers::weaver;\nuse crate::Value;\nuse crate::judge::{self_hosted::{OLD_LOG_PROBS}};\nfn f() { let x = keys::LOSS; let y = LOSS_X; }";
    let m = v("dumpdiff::sections::rows");
    assert_eq!(
        below_the_model(&m, text, &paths(text, &m), &keys, &defines),
        vec![
            "crate::producers::weaver".to_string(),
            "crate::value".to_string(),
            "producer key LOSS".to_string(),
            "producer key OLD_LOG_PROBS".to_string(),
        ]
    );
    let raw = "fn f(r: &Record) -> usize { r.raw().len() }";
    assert_eq!(
        below_the_model(&m, raw, &paths(raw, &m), &keys, &defines),
        vec!["Record::raw".to_string()]
    );
    // (a grouped import names the module before its `{`, for every name in the group)
    let clean = "use crate::model::step::StepDump;\nuse crate::detect::h::{Other, LOSS};\nfn f(s: &StepDump) -> usize { crate::detect::h::LOSS.len() + s.cells.len() }";
    assert!(below_the_model(&m, clean, &paths(clean, &m), &keys, &defines).is_empty());
    assert!(below_the_model(
        &v("producers::weaver"),
        text,
        &paths(text, &m),
        &keys,
        &defines
    )
    .is_empty());
}
