//! Hostile and broken inputs (issue 7): every reader and every command must answer with an
//! error naming the file and a position (exit 2), never panic, never hang, never modify
//! the input. Cut and flipped files are generated here from committed fixtures; inputs the
//! fuzzers found are committed under `fixtures/fuzz-regressions/`.
//!
//! NaN semantics of `dumpdiff` (decided here, tested below): NaN on both sides at the same
//! valid position is *equal* (torch.testing's `equal_nan=True`), NaN against a number is
//! beyond any tolerance, and same-signed infinities are equal. A run whose values are all
//! NaN is still reported by `logscan` (nan-grad), whose job that is.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use assert_cmd::Command;
use rlforensics::formats::{dump_jsonl, npy, pt, read_any, safetensors};
use rlforensics::producers::layout::DumpTree;
use rlforensics::{Error, Position, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn bin(name: &str) -> Command {
    Command::cargo_bin(name).unwrap()
}

/// The words a message uses for a position (see `error::Position`'s Display).
const POSITION_WORDS: &[&str] = &["byte", "line", "zip member", "opcode", "file", "key"];

/// A library error that names `path` and says where in it the problem is.
#[track_caller]
fn assert_names_file_and_position(e: &Error, path: &Path) {
    let text = e.to_string();
    let name = path.file_name().unwrap().to_string_lossy();
    assert!(text.contains(name.as_ref()), "{name} not in {text}");
    match e {
        Error::Format { path: p, .. } => assert_eq!(p, path, "{text}"),
        // I/O errors (a directory, no permission, a symlink loop) are about the whole file.
        Error::Io { path: p, .. } => assert_eq!(p, path, "{text}"),
        other => panic!("expected a format or I/O error naming {name}, got {other:?}"),
    }
}

/// Run a command, expect exit 2 with `file_name` and a position on stderr, no panic.
#[track_caller]
fn assert_exit_2(cmd: &mut Command, file_name: &str, needles: &[&str]) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{cmd:?}: {stderr}");
    assert!(stderr.contains(file_name), "{file_name} not in {stderr}");
    assert!(
        POSITION_WORDS.iter().any(|w| stderr.contains(w))
            || stderr.contains("directory")
            || stderr.contains("ermission")
            || stderr.contains("symbolic links"),
        "no position in {stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// `dumpdiff --inspect path` exits 2 naming the file.
#[track_caller]
fn inspect_exits_2(path: &Path, needles: &[&str]) -> String {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let before = std::fs::read(path).ok();
    let stderr = assert_exit_2(bin("dumpdiff").arg("--inspect").arg(path), &name, needles);
    assert_eq!(std::fs::read(path).ok(), before, "{name} was modified");
    stderr
}

/// A zip holding `archive/data.pkl` = `pkl` (stored, with a correct CRC).
fn zip_with_pickle(pkl: &[u8]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.start_file("archive/data.pkl", opts).unwrap();
    w.write_all(pkl).unwrap();
    w.finish().unwrap().into_inner()
}

/// The fixture every cut and flip starts from: a real torch.save file with 4 storages.
fn forward_data_pt() -> PathBuf {
    fixtures().join("dumps/self_hosted_pt/forward_data/step_000000_rank0_micro0.pt")
}

/// Every structural boundary of a zip: each member's local header, data start and data
/// end, each central-directory entry, the (zip64) end records.
fn zip_boundaries(bytes: &[u8]) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    for i in 0..archive.len() {
        let f = archive.by_index_raw(i).unwrap();
        let start = f.data_start().unwrap() as usize;
        cuts.push(f.header_start() as usize);
        cuts.push(start);
        cuts.push(start + f.compressed_size() as usize);
    }
    // Central-directory entries and end records, by signature.
    for sig in [
        b"PK\x01\x02", // central directory entry
        b"PK\x05\x06", // end of central directory
        b"PK\x06\x06", // zip64 end of central directory
        b"PK\x06\x07", // zip64 end locator
    ] {
        cuts.extend(
            bytes
                .windows(4)
                .enumerate()
                .filter(|(_, w)| w == sig)
                .map(|(i, _)| i),
        );
    }
    let mut all: Vec<usize> = cuts
        .iter()
        .flat_map(|&c| [c.saturating_sub(1), c, c + 1])
        .filter(|&c| c < bytes.len())
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

#[test]
fn pt_truncated_at_every_zip_boundary_fails_cleanly() {
    let src = forward_data_pt();
    let bytes = std::fs::read(&src).unwrap();
    let boundaries = zip_boundaries(&bytes);
    // 4 storages + data.pkl + byteorder + version + serialization_id: many boundaries.
    assert!(boundaries.len() > 30, "{boundaries:?}");
    let dir = tempfile::tempdir().unwrap();
    let sampled: Vec<usize> = (0..bytes.len()).step_by(53).collect();
    for &cut in boundaries.iter().chain(&sampled) {
        let path = dir.path().join(format!("cut_{cut}.pt"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let e = pt::read_pt(&path).expect_err(&format!("cut at {cut} read fine"));
        assert_names_file_and_position(&e, &path);
        let e = pt::read_pt_bytes(Arc::new(bytes[..cut].to_vec())).unwrap_err();
        assert!(!e.msg.is_empty(), "cut at {cut}");
    }
    // The command line, at the boundaries only (one process each).
    for &cut in &boundaries {
        inspect_exits_2(&dir.path().join(format!("cut_{cut}.pt")), &[]);
    }
    assert_eq!(std::fs::read(&src).unwrap(), bytes);
}

/// Offset and length of member `name` (stored) in a zip.
fn member_span(bytes: &[u8], name_suffix: &str) -> (String, usize, usize) {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    for i in 0..archive.len() {
        let f = archive.by_index_raw(i).unwrap();
        let name = f.name().unwrap().into_owned();
        if name.ends_with(name_suffix) {
            return (name, f.data_start().unwrap() as usize, f.size() as usize);
        }
    }
    panic!("no member ending in {name_suffix}");
}

#[test]
fn flipped_byte_in_data_pkl_or_storage_fails_the_crc_check() {
    let bytes = std::fs::read(forward_data_pt()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for suffix in ["data.pkl", "data/0", "data/1", "data/3"] {
        let (member, start, len) = member_span(&bytes, suffix);
        assert!(len > 4, "{member}");
        for at in [start, start + len / 2, start + len - 1] {
            let mut b = bytes.clone();
            b[at] ^= 0x01;
            let path = dir
                .path()
                .join(format!("flip_{}_{at}.pt", suffix.replace('/', "_")));
            std::fs::write(&path, &b).unwrap();
            let e = pt::read_pt(&path).expect_err(&format!("flip in {member} at {at} read fine"));
            assert_names_file_and_position(&e, &path);
            let text = e.to_string();
            assert!(text.contains("CRC-32"), "{text}");
            assert!(text.contains(&member), "{member} not named: {text}");
            inspect_exits_2(&path, &["CRC-32", &member]);
        }
    }
}

/// A pickle calling `module.name` through GLOBAL (protocol 2) and STACK_GLOBAL (protocol 4).
fn pickles_calling(module: &str, name: &str) -> [Vec<u8>; 2] {
    let mut global = b"\x80\x02c".to_vec();
    global.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
    global.extend_from_slice(b"X\x02\x00\x00\x00id\x85R.");
    let mut stack = b"\x80\x04".to_vec();
    for s in [module, name] {
        stack.push(0x8c); // SHORT_BINUNICODE
        stack.push(s.len() as u8);
        stack.extend_from_slice(s.as_bytes());
    }
    stack.extend_from_slice(b"\x93X\x02\x00\x00\x00id\x85R.");
    [global, stack]
}

#[test]
fn code_execution_globals_are_refused_by_library_and_cli() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = [
        ("os", "system"),
        ("posix", "system"),
        ("nt", "system"),
        ("subprocess", "Popen"),
        ("subprocess", "check_output"),
        ("builtins", "eval"),
        ("builtins", "exec"),
        ("builtins", "getattr"),
        ("builtins", "__import__"),
        ("__builtin__", "eval"),
        ("torch.storage", "_load_from_bytes"),
        ("torch", "load"),
        ("torch.serialization", "load"),
        ("numpy", "load"),
        ("pickle", "loads"),
        ("runpy", "_run_code"),
    ];
    for (module, name) in hostile {
        let qual = format!("{module}.{name}");
        for (i, pkl) in pickles_calling(module, name).iter().enumerate() {
            let z = zip_with_pickle(pkl);
            let e = pt::read_pt_bytes(Arc::new(z.clone())).unwrap_err();
            assert!(e.msg.contains(&qual), "{qual}: {e}");
            assert!(matches!(e.pos, Position::PickleOp { .. }), "{qual}: {e}");
            let path = dir.path().join(format!("{module}_{name}_{i}.pt"));
            std::fs::write(&path, &z).unwrap();
            inspect_exits_2(&path, &[&qual, "opcode"]);
        }
    }
    // A __reduce__ trick hidden inside an allowed rebuild call's arguments:
    // torch._utils._rebuild_tensor_v2(builtins.getattr(...), ...) is refused at the getattr.
    let mut p = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(cbuiltins\ngetattr\n".to_vec();
    p.extend_from_slice(b"ctorch\nload\nX\x01\x00\x00\x00x\x86Rtq\x00R.");
    let e = pt::read_pt_bytes(Arc::new(zip_with_pickle(&p))).unwrap_err();
    assert!(e.msg.contains("builtins.getattr"), "{e}");
    // The committed hostile fixtures, through the command line.
    for (file, qual) in [
        ("os_system.pt", "os.system"),
        ("posix_system.pt", "posix.system"),
        ("subprocess_popen.pt", "subprocess.Popen"),
        ("builtins_eval.pt", "builtins.eval"),
    ] {
        inspect_exits_2(&fixtures().join("corrupt/pt").join(file), &[qual, "opcode"]);
    }
}

#[test]
fn forged_shapes_strides_and_offsets_exit_2_from_the_cli() {
    for (file, needle) in [
        ("huge_shape.pt", "opcode"),
        ("offset_past_end.pt", "opcode"),
        ("numel_past_member.pt", "opcode"),
        ("short_storage.pt", "opcode"),
        ("missing_storage.pt", "zip member"),
        ("memo_bomb.pt", "opcode"),
        ("deep_nested.pt", "opcode"),
        ("compressed.pt", "zip member"),
    ] {
        let path = fixtures().join("corrupt/pt").join(file);
        let e = pt::read_pt(&path).unwrap_err();
        assert_names_file_and_position(&e, &path);
        inspect_exits_2(&path, &[needle]);
    }
    for file in [
        "npy/forged_shape.npy",
        "safetensors/offsets_past_end.safetensors",
    ] {
        let path = fixtures().join("corrupt").join(file);
        let e = read_any(&path).unwrap_err();
        assert_names_file_and_position(&e, &path);
        inspect_exits_2(&path, &["byte"]);
    }
}

#[test]
fn hundred_thousand_brackets_in_a_jsonl_dump_do_not_overflow_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("open.jsonl", "[".repeat(100_000)),
        (
            "balanced.jsonl",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        ),
        (
            "in_object.jsonl",
            format!("{{\"a\": {}", "[".repeat(100_000)),
        ),
        ("objects.jsonl", "{\"a\":".repeat(100_000)),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        let e = dump_jsonl::read_dump_jsonl(&path).unwrap_err();
        assert_names_file_and_position(&e, &path);
        assert!(e.to_string().contains("recursion limit"), "{e}");
        assert!(
            matches!(&e, Error::Format { pos: Position::LineColumn(1, c), .. } if *c <= 1000),
            "{e}"
        );
        inspect_exits_2(&path, &["line 1"]);
    }
    // 127 levels (serde_json's limit is 128) still parse, and drop without trouble.
    let ok = format!("{}{}", "[".repeat(127), "]".repeat(127));
    assert!(rlforensics::json::parse_value(&ok).is_ok());
}

#[test]
fn hundred_thousand_brackets_in_a_steps_line_are_one_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let healthy = std::fs::read_to_string(fixtures().join("logs/healthy/steps.jsonl")).unwrap();
    let lines: Vec<&str> = healthy.lines().collect();
    let mut text = String::new();
    for l in &lines[..3] {
        text.push_str(l);
        text.push('\n');
    }
    text.push_str(&"[".repeat(100_000));
    text.push('\n');
    for l in &lines[3..] {
        text.push_str(l);
        text.push('\n');
    }
    let path = dir.path().join("steps.jsonl");
    std::fs::write(&path, &text).unwrap();
    let out = bin("logscan")
        .arg(&path)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let file = &report["files"][0];
    assert_eq!(file["bad_line_count"], 1, "{file}");
    assert_eq!(file["bad_lines"][0]["line"], 4, "{file}");
    assert_eq!(file["records"], lines.len(), "{file}");
}

/// Python-style JSON for a value tree (bare NaN/Infinity), to rewrite `.jsonl` dumps.
fn to_python_json(v: &Value, out: &mut String) {
    match v {
        Value::None => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::BigInt(s) => out.push_str(s),
        Value::Float(f) if f.is_nan() => out.push_str("NaN"),
        Value::Float(f) if f.is_infinite() => {
            out.push_str(if *f > 0.0 { "Infinity" } else { "-Infinity" })
        }
        Value::Float(f) => out.push_str(&format!("{f:?}")),
        Value::Str(s) => out.push_str(&serde_json::to_string(s).unwrap()),
        Value::List(_) | Value::Tuple(_) | Value::Packed(_) => {
            out.push('[');
            for (i, x) in v.items().unwrap().iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                to_python_json(x, out);
            }
            out.push(']');
        }
        Value::Dict(pairs) => {
            out.push('{');
            for (i, (k, x)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                to_python_json(k, out);
                out.push_str(": ");
                to_python_json(x, out);
            }
            out.push('}');
        }
        Value::Bytes(_) | Value::Tensor(_) => panic!("not in a .jsonl dump"),
    }
}

/// Every float of `v` through `f` (ints, bools, strings unchanged).
fn map_floats(v: &Value, f: &dyn Fn(f64) -> f64) -> Value {
    match v {
        Value::Float(x) => Value::Float(f(*x)),
        Value::List(_) | Value::Packed(_) => Value::List(
            v.items()
                .unwrap()
                .iter()
                .map(|x| map_floats(x, f))
                .collect(),
        ),
        Value::Dict(pairs) => Value::Dict(
            pairs
                .iter()
                .map(|(k, x)| (k.clone(), map_floats(x, f)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Copy a `.jsonl` dump tree with every float rewritten by `f`.
fn rewrite_tree(src: &Path, dst: &Path, f: &dyn Fn(f64) -> f64) {
    for kind in std::fs::read_dir(src).unwrap() {
        let kind = kind.unwrap().path();
        let out_dir = dst.join(kind.file_name().unwrap());
        std::fs::create_dir_all(&out_dir).unwrap();
        for file in std::fs::read_dir(&kind).unwrap() {
            let file = file.unwrap().path();
            let v = dump_jsonl::read_dump_jsonl(&file).unwrap();
            let mut text = String::new();
            to_python_json(&map_floats(&v, f), &mut text);
            text.push('\n');
            std::fs::write(out_dir.join(file.file_name().unwrap()), text).unwrap();
        }
    }
}

/// dumpdiff's JSON report of `a` vs `b` at step 0, and its exit code.
fn dumpdiff_json(a: &Path, b: &Path) -> (i32, serde_json::Value) {
    let out = bin("dumpdiff")
        .arg("--self-hosted-dir")
        .arg(a)
        .arg("--weaver-dir")
        .arg(b)
        .args(["--step", "0", "--format", "json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    (out.status.code().unwrap(), report)
}

fn section_verdict(report: &serde_json::Value, name: &str) -> String {
    report["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no section {name}"))["verdict"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn all_nan_and_all_inf_dumps_compare_with_equal_nan_semantics() {
    let dumps = fixtures().join("dumps");
    let dir = tempfile::tempdir().unwrap();
    let (sh_nan, w_nan) = (dir.path().join("sh_nan"), dir.path().join("w_nan"));
    let (sh_inf, w_inf) = (dir.path().join("sh_inf"), dir.path().join("w_inf"));
    let nan = |_: f64| f64::NAN;
    // Sign-preserving: +x → +inf, −x → −inf, 0 → NaN.
    let inf = |x: f64| {
        if x == 0.0 {
            f64::NAN
        } else {
            f64::INFINITY.copysign(x)
        }
    };
    rewrite_tree(&dumps.join("self_hosted_jsonl"), &sh_nan, &nan);
    rewrite_tree(&dumps.join("weaver_jsonl"), &w_nan, &nan);
    rewrite_tree(&dumps.join("self_hosted_jsonl"), &sh_inf, &inf);
    rewrite_tree(&dumps.join("weaver_jsonl"), &w_inf, &inf);

    // NaN on both sides at the same valid positions is equal…
    let (code, report) = dumpdiff_json(&sh_nan, &w_nan);
    for s in ["forward_data", "loss", "param", "gradient"] {
        assert_eq!(section_verdict(&report, s), "pass", "{s}");
    }
    // …but weaver's f32 `effective_valid` mask became NaN too, which is a real difference
    // from the mask derived from the self-hosted side: exit 1, not a crash.
    assert_eq!(section_verdict(&report, "is_loss"), "fail");
    assert_eq!(code, 1);
    // Same-signed infinities are equal.
    let (code, report) = dumpdiff_json(&sh_inf, &w_inf);
    assert_eq!(section_verdict(&report, "forward_data"), "pass");
    assert_eq!(code, 1);
    // NaN or ±inf against finite numbers is beyond every tolerance.
    for side in [&sh_nan, &sh_inf] {
        let (code, report) = dumpdiff_json(side, &dumps.join("weaver_jsonl"));
        assert_eq!(section_verdict(&report, "forward_data"), "fail");
        assert_eq!(code, 1);
    }
    // Inspecting and losschecking all-NaN trees does not panic either.
    bin("dumpdiff")
        .arg("--inspect")
        .arg(&sh_nan)
        .assert()
        .code(0);
    let out = bin("losscheck")
        .arg("--dump-dir")
        .arg(&w_nan)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0..=2)), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn all_nan_steps_log_is_a_nan_grad_finding() {
    let dir = tempfile::tempdir().unwrap();
    let healthy = fixtures().join("logs/healthy/steps.jsonl");
    let mut text = String::new();
    for line in std::fs::read_to_string(healthy).unwrap().lines() {
        let v = rlforensics::json::parse_value(line).unwrap();
        to_python_json(&map_floats(&v, &|_| f64::NAN), &mut text);
        text.push('\n');
    }
    assert!(text.contains("\"grad_norm\": NaN"));
    let path = dir.path().join("steps.jsonl");
    std::fs::write(&path, &text).unwrap();
    let out = bin("logscan")
        .arg(&path)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let detectors: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["detector"].as_str())
        .collect();
    assert!(detectors.contains(&"nan-grad"), "{detectors:?}");
    assert_eq!(report["files"][0]["bad_line_count"], 0);
}

#[test]
fn empty_files_are_errors_in_every_reader_and_command() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["pt", "safetensors", "npy", "npz", "jsonl"] {
        let path = dir.path().join(format!("step_000000_rank0_micro0.{ext}"));
        std::fs::write(&path, b"").unwrap();
        let e = read_any(&path).unwrap_err();
        assert_names_file_and_position(&e, &path);
        inspect_exits_2(&path, &[]);
    }
    let p = |ext: &str| dir.path().join(format!("step_000000_rank0_micro0.{ext}"));
    assert!(pt::read_pt(&p("pt")).is_err());
    assert!(safetensors::read_safetensors(&p("safetensors")).is_err());
    assert!(npy::read_npy(&p("npy")).is_err());
    assert!(npy::read_npz(&p("npz")).is_err());
    assert!(dump_jsonl::read_dump_jsonl(&p("jsonl")).is_err());
    // In-memory entry points.
    assert!(pt::read_pt_bytes(Arc::new(Vec::new())).is_err());
    assert!(safetensors::read_safetensors_bytes(Arc::new(Vec::new())).is_err());
    assert!(npy::read_npy_bytes(Arc::new(Vec::new())).is_err());
    assert!(npy::read_npz_bytes(&[]).is_err());

    // An empty file inside a dump tree: dumpdiff and losscheck exit 2 naming it.
    let tree = dir.path().join("tree");
    copy_tree(&fixtures().join("dumps/weaver_pt"), &tree);
    let victim = tree.join("forward_data/step_000000_rank3_micro1.pt");
    std::fs::write(&victim, b"").unwrap();
    assert_exit_2(
        bin("dumpdiff")
            .arg("--self-hosted-dir")
            .arg(fixtures().join("dumps/self_hosted_pt"))
            .arg("--weaver-dir")
            .arg(&tree)
            .args(["--step", "0"]),
        "step_000000_rank3_micro1.pt",
        &["empty"],
    );
    std::fs::write(tree.join("is_loss_debug/step_000000_rank3_micro1.pt"), b"").unwrap();
    let out = bin("losscheck")
        .arg("--dump-dir")
        .arg(&tree)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("step_000000_rank3_micro1.pt"), "{stderr}");

    // Empty logs: logscan reads nothing, says so, and does not panic.
    let steps = dir.path().join("steps.jsonl");
    std::fs::write(&steps, b"").unwrap();
    let out = bin("logscan").arg(&steps).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(matches!(out.status.code(), Some(0 | 2)), "{stderr}");
    let log = dir.path().join("train.log");
    std::fs::write(&log, b"").unwrap();
    let out = bin("logscan").arg(&log).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    assert!(matches!(out.status.code(), Some(0 | 2)));
}

/// Copy a dump tree (two levels: kind folders, files).
fn copy_tree(src: &Path, dst: &Path) {
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

#[test]
fn a_directory_named_like_a_dump_file_is_reported_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    copy_tree(&fixtures().join("dumps/weaver_pt"), &tree);
    let fake = tree.join("forward_data/step_000000_rank0_micro0.pt");
    std::fs::remove_file(&fake).unwrap();
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("data.pkl"), b"not a pickle").unwrap();
    // Readers refuse a directory by name.
    let e = pt::read_pt(&fake).unwrap_err();
    assert_names_file_and_position(&e, &fake);
    assert!(read_any(&fake).is_err());
    // `--inspect` takes folders too: this one is named like a file and holds no kind
    // folders, and it says both.
    inspect_exits_2(
        &fake,
        &["is a directory, not a .pt file", "holds no dump folders"],
    );
    // Discovery lists it as unrecognised and the cell as a hole, instead of reading it.
    let t = DumpTree::discover(&tree).unwrap();
    assert!(t.files().iter().all(|f| f.path != fake));
    assert!(t.files().len() == 143, "{}", t.files().len());
    let out = bin("dumpdiff")
        .arg("--self-hosted-dir")
        .arg(fixtures().join("dumps/self_hosted_pt"))
        .arg("--weaver-dir")
        .arg(&tree)
        // the hole is a file on one side only: a warning, exit 1 at --fail-on warning
        .args(["--step", "0", "--fail-on", "warning"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(matches!(out.status.code(), Some(1 | 2)), "{stderr}");
}

/// A command for `bin_name` that runs as the unprivileged user `nobody` (uid/gid 65534)
/// when this test runs as root, so that mode 000 really blocks reads.
#[cfg(unix)]
fn as_nobody(bin_name: &str, dir: &Path) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = if is_root() {
        // The build folder may not be reachable for `nobody` (a private home): run a copy
        // of the binary from the test's own world-traversable folder instead.
        let copy = dir.join(bin_name);
        if !copy.exists() {
            std::fs::copy(assert_cmd::cargo::cargo_bin(bin_name), &copy).unwrap();
        }
        let mut c = std::process::Command::new(copy);
        c.uid(65534).gid(65534);
        c
    } else {
        std::process::Command::new(assert_cmd::cargo::cargo_bin(bin_name))
    };
    cmd.current_dir(dir);
    cmd
}

/// Whether this process may read through file modes (root or CAP_DAC_OVERRIDE).
#[cfg(unix)]
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

#[cfg(unix)]
#[test]
fn unreadable_files_exit_2_naming_them() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // The folder stays traversable for `nobody`; only the files are mode 000.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("step_000000_rank0_micro0.pt");
    std::fs::copy(forward_data_pt(), &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    let steps = dir.path().join("steps.jsonl");
    std::fs::write(&steps, b"{\"step\": 0}\n").unwrap();
    std::fs::set_permissions(&steps, std::fs::Permissions::from_mode(0o000)).unwrap();
    if !is_root() {
        // In process too (as root a library call would read through mode 000).
        let e = pt::read_pt(&path).unwrap_err();
        assert_names_file_and_position(&e, &path);
        assert!(matches!(e, Error::Io { .. }), "{e}");
    }
    // As root the commands run as `nobody`, for whom mode 000 means what it says.
    let probe = as_nobody("dumpdiff", dir.path())
        .arg("--version")
        .output()
        .unwrap();
    assert!(probe.status.success(), "cannot run as nobody: {probe:?}");
    let mut inspect = as_nobody("dumpdiff", dir.path());
    inspect.arg("--inspect").arg(&path);
    assert_exit_2(
        &mut Command::from_std(inspect),
        "step_000000_rank0_micro0.pt",
        &["ermission"],
    );
    let mut scan = as_nobody("logscan", dir.path());
    scan.arg(&steps);
    assert_exit_2(&mut Command::from_std(scan), "steps.jsonl", &["ermission"]);
}

/// Run `cmd`, killing it after `secs` seconds: returns its output, or panics naming the hang.
/// Both pipes are drained while it runs, so a large report cannot block the child.
fn output_within(cmd: &mut std::process::Command, secs: u64) -> std::process::Output {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed().as_secs() >= secs {
            child.kill().unwrap();
            panic!("{cmd:?} hung for {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// `mkfifo path` (the tool, so that the tests need no libc binding).
#[cfg(unix)]
fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

#[cfg(unix)]
#[test]
fn sockets_fifos_and_devices_are_refused_or_streamed_never_hung_on() {
    let dir = tempfile::tempdir().unwrap();
    // A socket named like a dump: no one can open it, root included.
    let sock = dir.path().join("step_000000_rank0_micro0.pt");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let e = pt::read_pt(&sock).unwrap_err();
    assert_names_file_and_position(&e, &sock);
    assert!(e.to_string().contains("is a socket"), "{e}");
    inspect_exits_2(&sock, &["is a socket"]);
    // A device: refused by name, never read (reading /dev/zero would never end).
    let e = read_any(Path::new("/dev/zero")).unwrap_err();
    assert!(
        e.to_string().contains("/dev/zero") && e.to_string().contains("is a device"),
        "{e}"
    );
    assert_exit_2(
        bin("logscan").arg("/dev/zero"),
        "/dev/zero",
        &["is a device"],
    );
    // A FIFO nobody writes to inside a dump tree: listed as not a regular file and never
    // opened (opening it would block forever); the comparison runs.
    let tree = dir.path().join("tree");
    copy_tree(&fixtures().join("dumps/weaver_pt"), &tree);
    let fifo = tree.join("loss/step_000000_rank0_micro7.pt");
    mkfifo(&fifo);
    let t = DumpTree::discover(&tree).unwrap();
    assert!(t.files().iter().all(|f| f.path != fifo));
    assert!(
        t.unrecognised
            .iter()
            .any(|u| u.path == fifo && u.reason == "not a regular file"),
        "{:?}",
        t.unrecognised
    );
    let dd = |format: &str| {
        let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("dumpdiff"));
        c.arg("--self-hosted-dir")
            .arg(fixtures().join("dumps/self_hosted_pt"))
            .arg("--weaver-dir")
            .arg(&tree)
            .args(["--step", "0", "--format", format]);
        c
    };
    let out = output_within(&mut dd("json"), 120);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
    // The report says which file was not read and why (nothing is skipped silently).
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sides"][0]["not_placed"], serde_json::json!([]));
    assert_eq!(
        report["sides"][1]["not_placed"],
        serde_json::json!([{"path": fifo.to_string_lossy(), "reason": "not a regular file"}])
    );
    let out = output_within(&mut dd("table"), 120);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "not read: {} (not a regular file)",
            fifo.display()
        )),
        "{text}"
    );
    let mut inspect = std::process::Command::new(assert_cmd::cargo::cargo_bin("dumpdiff"));
    inspect.arg("--inspect").arg(&tree);
    let out = output_within(&mut inspect, 120);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("step_000000_rank0_micro7.pt"), "{text}");
}

#[cfg(unix)]
#[test]
fn a_dump_piped_through_a_fifo_reads_like_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("dump_from_ssh");
    mkfifo(&fifo);
    let inspect = |p: &Path| {
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("dumpdiff"));
        cmd.arg("--inspect").arg(p);
        cmd
    };
    let file_text = |p: &Path| {
        let out = output_within(&mut inspect(p), 120);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        // Everything after the first line (which names the path and its size).
        text.split_once('\n').unwrap().1.to_string()
    };
    for src in [
        forward_data_pt(),
        fixtures().join("tensors/safetensors/torch_all_dtypes.safetensors"),
        fixtures().join("tensors/npy/bigendian_fortran_f4.npy"),
        fixtures().join("tensors/npy/savez_compressed.npz"),
        fixtures().join("tensors/jsonl/step_000000_rank1_micro2.jsonl"),
    ] {
        let expected = file_text(&src);
        let (bytes, f) = (std::fs::read(&src).unwrap(), fifo.clone());
        let writer = std::thread::spawn(move || std::fs::write(f, bytes).unwrap());
        let mut cmd = inspect(&fifo);
        let out = output_within(&mut cmd, 120);
        writer.join().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.starts_with(&format!("{}  (stream)\n", fifo.display())),
            "{text}"
        );
        assert_eq!(
            text.split_once('\n').unwrap().1,
            expected,
            "{}",
            src.display()
        );
        // The same bytes under a name without a known extension: sniffed, same tree.
        let renamed = dir.path().join("renamed.bin");
        std::fs::copy(&src, &renamed).unwrap();
        assert_eq!(file_text(&renamed), expected, "{}", src.display());
    }
    let junk = dir.path().join("notes.bin");
    std::fs::write(&junk, b"step 1 loss 0.5\n").unwrap();
    inspect_exits_2(&junk, &["unknown format"]);
}

#[cfg(unix)]
#[test]
fn symlink_loops_are_io_errors_not_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.pt"), dir.path().join("b.pt"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let e = pt::read_pt(&a).unwrap_err();
    assert_names_file_and_position(&e, &a);
    inspect_exits_2(&a, &[]);
    // A looping file link and a looping folder link inside a dump tree and a log folder.
    let tree = dir.path().join("tree");
    copy_tree(&fixtures().join("dumps/weaver_pt"), &tree);
    let fd = tree.join("forward_data");
    std::os::unix::fs::symlink(
        fd.join("step_000000_rank99_micro1.pt"),
        fd.join("step_000000_rank99_micro0.pt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        fd.join("step_000000_rank99_micro0.pt"),
        fd.join("step_000000_rank99_micro1.pt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&tree, fd.join("loop")).unwrap();
    let t = DumpTree::discover(&tree).unwrap();
    assert_eq!(t.files().len(), 144);
    bin("dumpdiff").arg("--inspect").arg(&tree).assert().code(0);
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::copy(
        fixtures().join("logs/healthy/steps.jsonl"),
        logs.join("steps.jsonl"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&logs, logs.join("loop")).unwrap();
    let out = bin("logscan").arg(&logs).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(matches!(out.status.code(), Some(0..=2)), "{stderr}");
}

#[test]
fn ten_thousand_file_tree_is_discovered_inspected_and_compared() {
    const RANKS: u32 = 100;
    const MICROS: u32 = 100;
    let dir = tempfile::tempdir().unwrap();
    let (sh, w) = (dir.path().join("sh"), dir.path().join("w"));
    let src_sh = fixtures().join("dumps/self_hosted_pt/forward_data/step_000000_rank0_micro0.pt");
    let src_w = fixtures().join("dumps/weaver_pt/forward_data/step_000000_rank0_micro0.pt");
    for (root, src) in [(&sh, &src_sh), (&w, &src_w)] {
        let fd = root.join("forward_data");
        std::fs::create_dir_all(&fd).unwrap();
        let bytes = std::fs::read(src).unwrap();
        for r in 0..RANKS {
            for m in 0..MICROS {
                std::fs::write(fd.join(format!("step_000000_rank{r}_micro{m}.pt")), &bytes)
                    .unwrap();
            }
        }
    }
    let t = DumpTree::discover(&sh).unwrap();
    assert_eq!(t.files().len(), 10_000);
    let kind = t.files()[0].kind;
    assert_eq!(t.ranks(kind, 0).len(), RANKS as usize);
    assert_eq!(t.micros(kind, 0).len(), MICROS as usize);
    assert!(t.missing_cells(kind, 0).is_empty());
    bin("dumpdiff")
        .arg("--inspect")
        .arg(&sh)
        .assert()
        .code(0)
        .stdout(predicates::str::contains("files: 10000"));
    let (code, report) = dumpdiff_json(&sh, &w);
    assert_eq!(code, 0, "{}", report["verdict"]);
    let cells = report["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "forward_data")
        .unwrap()["cells"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(cells, 10_000);
    assert_eq!(report["files_read"], 20_000);
}

/// Feed `bytes` to the reader(s) of fuzz target `target`, as the fuzz target does.
fn replay(target: &str, bytes: &[u8]) {
    match target {
        "pt" => drop(pt::read_pt_bytes(Arc::new(bytes.to_vec()))),
        "safetensors" => drop(safetensors::read_safetensors_bytes(Arc::new(
            bytes.to_vec(),
        ))),
        "npy" => {
            drop(npy::read_npy_bytes(Arc::new(bytes.to_vec())));
            drop(npy::read_npz_bytes(bytes));
        }
        "json" | "log_jsonl" => {
            for line in String::from_utf8_lossy(bytes).lines() {
                if let Ok(v) = rlforensics::json::parse_value(line) {
                    drop(v.to_tensor());
                }
            }
            if let Ok(text) = std::str::from_utf8(bytes) {
                drop(rlforensics::json::parse_value(text));
            }
        }
        "textlog" => {
            let text = String::from_utf8_lossy(bytes);
            let mut asm = rlforensics::logs::textlog::TextAssembler::new(0);
            for (i, line) in text.lines().enumerate() {
                asm.push(
                    i as u64 + 1,
                    rlforensics::logs::textlog::parse_text_line(line),
                );
            }
            asm.finish();
        }
        other => panic!("fixtures/fuzz-regressions/{other}: no such fuzz target"),
    }
}

/// Every input a fuzzer ever crashed on (minimised), replayed through its reader: the
/// fix must hold. Folder = target name; a file's name says what broke.
#[test]
fn fuzz_regressions_do_not_panic() {
    let root = fixtures().join("fuzz-regressions");
    let mut n = 0;
    for target in std::fs::read_dir(&root).unwrap() {
        let target = target.unwrap().path();
        if !target.is_dir() {
            continue;
        }
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        for input in std::fs::read_dir(&target).unwrap() {
            let input = input.unwrap().path();
            replay(&name, &std::fs::read(&input).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "no regression inputs under {}", root.display());
}

/// Found by the `textlog` fuzzer: a `}` before the `{'` of a TRL dict line made
/// `parse_py_dict` slice backwards (`begin > end`) and panic.
#[test]
fn closing_brace_before_a_py_dict_line_is_not_a_panic() {
    use rlforensics::logs::textlog::{parse_text_line, TextItem};
    let text = std::fs::read_to_string(
        fixtures().join("fuzz-regressions/textlog/brace_before_py_dict.log"),
    )
    .unwrap();
    assert_eq!(parse_text_line(text.trim_end()), TextItem::Other);
    // The same dict without the stray brace still parses.
    assert!(matches!(
        parse_text_line("{'loss': 0.5}"),
        TextItem::Step { .. }
    ));
}

/// Found by the `textlog` fuzzer (a 9-minute run): a TRL dict line whose step is a huge
/// float (3.3e88 saturates to i64::MAX) followed by more lines made the end-of-file flush
/// compute `last_step + 1` and overflow (a panic in debug builds, a wrap to i64::MIN in
/// release). The flush now saturates.
#[test]
fn huge_step_then_end_of_file_flush_does_not_overflow() {
    use rlforensics::logs::textlog::{parse_text_line, TextAssembler};
    let data =
        std::fs::read(fixtures().join("fuzz-regressions/textlog/huge_step_then_micro_flush.log"))
            .unwrap();
    let text = String::from_utf8_lossy(&data);
    let mut asm = TextAssembler::new(0);
    for (i, line) in text.lines().enumerate() {
        asm.push(i as u64 + 1, parse_text_line(line));
    }
    asm.finish();
    let mut asm = TextAssembler::new(0);
    asm.push(1, parse_text_line("{'step': 1e300, 'loss': 0.5}"));
    asm.push(
        2,
        parse_text_line(
            "[Micro 0] 3. Samples scored: mem=812 MB, time=0.412s, rewards=0.5000±0.1200",
        ),
    );
    asm.finish();
}

/// Flip one byte in the middle of `file`'s member ending in `suffix`; returns the
/// member's name.
fn flip_member_byte(file: &Path, suffix: &str) -> String {
    let mut bytes = std::fs::read(file).unwrap();
    let (member, start, len) = member_span(&bytes, suffix);
    bytes[start + len / 2] ^= 0x01;
    std::fs::write(file, &bytes).unwrap();
    member
}

#[test]
fn a_corrupt_file_no_section_reads_is_named_and_set_aside() {
    // The weaver's batch_inputs are read by no cell when its forward_data holds the
    // token ids (this fixture): dumpdiff checks them on a second thread while the
    // self-hosted whole-batch files are read. A flipped byte there is named on stderr
    // with the CRC message (file and member), the file is set aside, the report of the
    // rest is printed, and the exit code is 2 (issue 28: one bad file never sinks the run).
    let dir = tempfile::tempdir().unwrap();
    let (sh, wv) = (dir.path().join("sh"), dir.path().join("wv"));
    copy_tree(&fixtures().join("dumps/self_hosted_pt"), &sh);
    copy_tree(&fixtures().join("dumps/weaver_pt"), &wv);
    let bi = wv.join("batch_inputs/step_000000_rank1_micro1.pt");
    let member = flip_member_byte(&bi, "data/0");
    let run = || {
        let mut cmd = bin("dumpdiff");
        cmd.arg("--self-hosted-dir")
            .arg(&sh)
            .arg("--weaver-dir")
            .arg(&wv)
            .args(["--step", "0", "--format", "json"]);
        cmd
    };
    let unreadable = || -> Vec<(String, String)> {
        let out = run().output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["unreadable"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| {
                (
                    u["kind"].as_str().unwrap().to_string(),
                    u["role"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let name = "step_000000_rank1_micro1.pt";
    let stderr = assert_exit_2(&mut run(), name, &["CRC-32", &member, "batch_inputs"]);
    assert!(!stderr.contains("trajectory"), "{stderr}");
    assert_eq!(unreadable(), [("batch_inputs".into(), "weaver".into())]);
    // The self-hosted trajectory and old_log_probs corrupt too: each is named with its
    // member, and set aside.
    let traj = sh.join("trajectory/step_000000.pt");
    let traj_member = flip_member_byte(&traj, "data.pkl");
    let old = sh.join("old_log_probs/step_000000.pt");
    let old_member = flip_member_byte(&old, "data/0");
    assert_exit_2(
        &mut run(),
        "step_000000.pt",
        &[
            "CRC-32",
            &traj_member,
            "trajectory",
            &old_member,
            "old_log_probs",
            name,
        ],
    );
    let mut got = unreadable();
    got.sort();
    assert_eq!(
        got,
        [
            ("batch_inputs".into(), "weaver".into()),
            ("old_log_probs".into(), "self-hosted".into()),
            ("trajectory".into(), "self-hosted".into())
        ]
    );
}
