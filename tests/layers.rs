//! The crate's structure, checked (ARCHITECTURE.md): imports point down the layers only,
//! no two sibling modules import each other, and no source file is over 800 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer of each top-level module of `src/`, bottom first. A module may import its own
/// layer or a lower one; imports within a layer must not form a circle.
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

/// The `crate::a::b` paths a file names (each item of a `use crate::{a, b::{c, d}}` group
/// counts too), as `(a, b)` pairs (`b` empty when only `a` is named), and its `super::`
/// paths resolved against `module`. Comments are left out.
fn imports(text: &str, module: &[String]) -> BTreeSet<(String, String)> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + 7..];
        if let Some(group) = after.strip_prefix('{') {
            for item in top_level_items(group) {
                let (a, b) = first_two(item);
                if !a.is_empty() {
                    out.insert((a, b));
                }
            }
        } else {
            out.insert(first_two(after));
        }
        rest = after;
    }
    // `super::x` from `a::b` (a file two deep) names `a::x`; deeper files' `super` stays
    // inside their own second-level module and is not an edge between siblings.
    let mut rest = code.as_str();
    while let Some(i) = rest.find("super::") {
        let preceded_by_path = rest[..i].ends_with("::");
        let after = &rest[i + 7..];
        if !preceded_by_path && module.len() == 2 && !after.starts_with("super::") {
            let (x, _) = first_two(after);
            if !x.is_empty() {
                out.insert((module[0].clone(), x));
            }
        }
        rest = after;
    }
    out
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

/// `a` and `b` of a path `a::b…` (`b` empty when there is none or it opens a group); a
/// root re-export (`crate::Error`) is named by its module.
fn first_two(path: &str) -> (String, String) {
    let path = path.trim_start();
    let a = ident(path);
    if let Some((_, m)) = ROOT_ITEMS.iter().find(|(item, _)| *item == a) {
        return (m.to_string(), String::new());
    }
    let b = path[a.len()..]
        .strip_prefix("::")
        .map(ident)
        .unwrap_or_default();
    (a, b)
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
    items
}

/// Files of the library: (path relative to `src/`, module path, text), `lib.rs` and `bin/`
/// left out.
fn library_files() -> Vec<(PathBuf, Vec<String>, String)> {
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

#[test]
fn imports_point_down_the_layers() {
    let mut upward = BTreeSet::new();
    for (rel, module, text) in library_files() {
        let own = layer(&module[0]);
        for (a, _) in imports(&text, &module) {
            if a == module[0] || a == "self" || a == "super" {
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
fn no_circle_between_modules() {
    // Top-level modules, and the second-level modules inside each top-level one.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut inner: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, text) in library_files() {
        for (a, b) in imports(&text, &module) {
            if a == "self" || a == "super" {
                continue;
            }
            if a != module[0] {
                top.entry(module[0].clone()).or_default().insert(a);
            } else if module.len() >= 2 && !b.is_empty() && b != module[1] {
                // A parent's `mod.rs` using its children is not a sibling edge.
                let from = format!("{}::{}", module[0], module[1]);
                inner.entry(from).or_default().insert(format!("{a}::{b}"));
            }
        }
    }
    assert_eq!(find_circle(&top), None, "circle between top-level modules");
    assert_eq!(find_circle(&inner), None, "circle between sibling modules");
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

#[test]
fn the_checks_see_what_they_check() {
    // The import reader itself, on the forms the crate uses.
    let m = vec!["kernels".to_string(), "fused".to_string()];
    let got = imports(
        "use crate::{\n    error::{Error, Result},\n    model::log,\n};\nuse super::loss::Config;\n// crate::x\nlet y = crate::fmt::num(1.0);",
        &m,
    );
    let want: BTreeSet<(String, String)> = [
        ("error", ""),
        ("model", "log"),
        ("kernels", "loss"),
        ("fmt", "num"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
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
