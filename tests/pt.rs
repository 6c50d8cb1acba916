//! The `.pt` reader against files written by real `torch.save` (fixtures/gen/make_pt_cases.py)
//! and against corrupt or hostile archives.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rlforensics::readers::pt::{read_pt, read_pt_bytes};
use rlforensics::{DType, Position, Tensor, Value};
use serde_json::Value as Json;

fn good(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tensors/pt")
        .join(name)
}

fn corrupt(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/corrupt/pt")
        .join(name)
}

fn expected() -> serde_json::Map<String, Json> {
    let text = std::fs::read_to_string(good("expected.json")).unwrap();
    match serde_json::from_str(&text).unwrap() {
        Json::Object(m) => m,
        other => panic!("expected.json is not an object: {other}"),
    }
}

/// Same float, bit for bit (any NaN matches any NaN: bf16/f16 NaN payloads widen).
fn same_float(got: f64, want: &str) -> bool {
    let w: f64 = want.parse().unwrap();
    (got.is_nan() && w.is_nan()) || got.to_bits() == w.to_bits()
}

/// [`check`] of one item of a packed list (a scalar: no tensors to collect).
fn check_item(got: &Value, want: &Json, path: &str) {
    check(got, want, path, &mut Vec::new());
}

/// Compare a value with torch.load's tree; collect tensors with their storage groups.
fn check<'a>(got: &'a Value, want: &Json, path: &str, tensors: &mut Vec<(&'a Tensor, u64)>) {
    let ty = want["type"].as_str().unwrap();
    match (ty, got) {
        ("none", Value::None) => {}
        ("bool", Value::Bool(b)) => assert_eq!(Json::Bool(*b), want["value"], "{path}"),
        ("int", Value::Int(i)) => {
            assert_eq!(i.to_string(), want["value"].as_str().unwrap(), "{path}")
        }
        ("int", Value::BigInt(s)) => assert_eq!(s, want["value"].as_str().unwrap(), "{path}"),
        ("float", Value::Float(f)) => {
            assert!(
                same_float(*f, want["value"].as_str().unwrap()),
                "{path}: {f} vs {}",
                want["value"]
            )
        }
        ("str", Value::Str(s)) => assert_eq!(s, want["value"].as_str().unwrap(), "{path}"),
        ("bytes", Value::Bytes(b)) => {
            let w: Vec<u8> = want["value"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u8)
                .collect();
            assert_eq!(b, &w, "{path}");
        }
        ("list", Value::Packed(p)) => {
            let w = want["items"].as_array().unwrap();
            assert_eq!(p.len(), w.len(), "{path}");
            for (i, w) in w.iter().enumerate() {
                check_item(&p.get(i).unwrap(), w, &format!("{path}[{i}]"));
            }
        }
        ("list", Value::List(items)) | ("tuple", Value::Tuple(items)) => {
            let w = want["items"].as_array().unwrap();
            assert_eq!(items.len(), w.len(), "{path}");
            for (i, (g, w)) in items.iter().zip(w).enumerate() {
                check(g, w, &format!("{path}[{i}]"), tensors);
            }
        }
        ("dict", Value::Dict(items)) => {
            let w = want["items"].as_array().unwrap();
            assert_eq!(items.len(), w.len(), "{path}");
            for (i, ((gk, gv), w)) in items.iter().zip(w).enumerate() {
                check(gk, &w[0], &format!("{path}.key{i}"), tensors);
                let key = gk
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{gk:?}"));
                check(gv, &w[1], &format!("{path}.{key}"), tensors);
            }
        }
        ("tensor", Value::Tensor(t)) => {
            let dtype = DType::from_torch_name(want["dtype"].as_str().unwrap()).unwrap();
            assert_eq!(t.dtype(), dtype, "{path}");
            let ints = |k: &str| -> Vec<usize> {
                want[k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as usize)
                    .collect()
            };
            assert_eq!(t.shape(), ints("shape").as_slice(), "{path} shape");
            assert_eq!(t.strides(), ints("strides").as_slice(), "{path} strides");
            assert_eq!(
                t.offset() as u64,
                want["offset"].as_u64().unwrap(),
                "{path} offset"
            );
            let values: Vec<&str> = want["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(t.numel(), values.len(), "{path} numel");
            if dtype.is_float() {
                for (i, (g, w)) in t.to_f64_vec().iter().zip(&values).enumerate() {
                    assert!(same_float(*g, w), "{path}[{i}]: {g} vs {w}");
                }
            } else {
                let got: Vec<String> = t.to_i64_vec().iter().map(|x| x.to_string()).collect();
                assert_eq!(got, values, "{path} values");
            }
            tensors.push((t, want["storage_group"].as_u64().unwrap()));
        }
        _ => panic!("{path}: expected {ty}, read {}", got.type_name()),
    }
}

#[test]
fn every_fixture_matches_torch_load() {
    let exp = expected();
    assert_eq!(exp.len(), 7, "fixtures listed in expected.json");
    for (name, want) in &exp {
        let got = read_pt(&good(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut tensors = Vec::new();
        check(&got, want, name, &mut tensors);
        // Tensors share storage exactly when torch's tensors share storage.
        for (a, ga) in &tensors {
            for (b, gb) in &tensors {
                assert_eq!(a.shares_storage(b), ga == gb, "{name}: {a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn views_share_one_storage_by_key() {
    let v = read_pt(&good("views.pt")).unwrap();
    let base = v.get("base").and_then(Value::as_tensor).unwrap();
    assert_eq!(base.storage_key(), Some("0"));
    for key in ["transposed", "row_slice", "strided", "element", "narrow_1d"] {
        let t = v.get(key).and_then(Value::as_tensor).unwrap();
        assert!(t.shares_storage(base), "{key}");
        assert_eq!(t.storage_key(), Some("0"), "{key}");
    }
    let expanded = v.get("expanded").and_then(Value::as_tensor).unwrap();
    assert!(!expanded.shares_storage(base));
    assert_eq!(expanded.strides(), &[0, 1]);
    assert_eq!(expanded.storage_numel(), 3);
}

#[test]
fn storages_are_windows_of_the_input_not_copies() {
    let bytes = std::fs::read(good("dtypes.pt")).unwrap();
    let buf: Arc<Vec<u8>> = Arc::new(bytes);
    let range = buf.as_ptr_range();
    let v = read_pt_bytes(buf.clone()).unwrap();
    let d = v.as_dict().unwrap();
    assert_eq!(d.len(), 10);
    for (k, t) in d {
        let t = t.as_tensor().unwrap();
        let p = t.storage_bytes().as_ptr();
        assert!(range.contains(&p), "{k:?} storage is a copy");
    }
}

#[test]
fn big_endian_storages_are_byteswapped() {
    let v = read_pt(&good("bigendian.pt")).unwrap();
    assert_eq!(
        v.get("a").and_then(Value::as_tensor).unwrap().to_f64_vec(),
        vec![1.5, -2.0]
    );
    assert_eq!(
        v.get("b").and_then(Value::as_tensor).unwrap().to_i64_vec(),
        vec![258, -3]
    );
    assert_eq!(
        v.get("c").and_then(Value::as_tensor).unwrap().to_f64_vec(),
        vec![1.0, 0.5]
    );
}

#[test]
fn archive_prefix_is_whatever_torch_wrote() {
    // torch.save names the zip folder after the file stem, or "archive" for a buffer.
    let v = read_pt(&good("custom_archive_name.pt")).unwrap();
    assert!(matches!(v.get("step"), Some(Value::Int(3))));
    let t = read_pt(&good("bare_tensor_bytesio.pt")).unwrap();
    let t = t.as_tensor().unwrap();
    assert_eq!(t.to_i64_vec(), vec![1, 3, 2, 4]);
}

fn err_of(path: &Path) -> String {
    match read_pt(path) {
        Ok(v) => panic!("{}: read {:?}", path.display(), v.type_name()),
        Err(e) => e.to_string(),
    }
}

fn assert_err(name: &str, fragments: &[&str]) {
    let msg = err_of(&corrupt(name));
    assert!(msg.contains(name), "{name}: no file name in {msg:?}");
    for f in fragments {
        assert!(msg.contains(f), "{name}: {f:?} not in {msg:?}");
    }
}

#[test]
fn forbidden_globals_are_refused_by_name_at_their_opcode() {
    let op = |m: &str, o: u64| format!("zip member {m}, pickle opcode at byte {o}");
    assert_err(
        "posix_system.pt",
        &["refused global posix.system", &op("archive/data.pkl", 13)],
    );
    assert_err(
        "os_system.pt",
        &["refused global os.system", &op("archive/data.pkl", 2)],
    );
    assert_err(
        "builtins_eval.pt",
        &["refused global builtins.eval", &op("archive/data.pkl", 31)],
    );
    assert_err(
        "subprocess_popen.pt",
        &[
            "refused global subprocess.Popen",
            &op("archive/data.pkl", 2),
        ],
    );
}

#[test]
fn forged_views_fail_cleanly_at_the_reduce() {
    let op = |o: u64| format!("zip member archive/data.pkl, pickle opcode at byte {o}");
    assert_err(
        "huge_shape.pt",
        &[
            &op(163),
            "_rebuild_tensor_v2",
            "reaches element 1099511627776",
            "holds 4 elements",
        ],
    );
    assert_err(
        "offset_past_end.pt",
        &[&op(157), "reaches element 14", "holds 4 elements"],
    );
    assert_err(
        "numel_past_member.pt",
        &[
            &op(110),
            "archive/data/0 holds 16 bytes",
            "claims 1000 float32 elements",
        ],
    );
}

#[test]
fn missing_or_short_storage_members_are_named() {
    let op = |o: u64| format!("zip member _real/data.pkl, pickle opcode at byte {o}");
    assert_err(
        "missing_storage.pt",
        &[&op(110), "member _real/data/0 is missing"],
    );
    assert_err(
        "short_storage.pt",
        &[&op(211), "_real/data/1 holds 10 bytes", "claims 3 int64"],
    );
}

#[test]
fn broken_archives_give_clean_errors() {
    assert_err("truncated.pt", &["truncated"]);
    assert_err("compressed.pt", &["zip member _real/", "is compressed"]);
    assert_err("empty.pt", &["empty file"]);
    assert_err("not_zip.pt", &["byte 0", "not a zip archive"]);
    let dir = good("");
    let msg = err_of(&dir);
    assert!(
        msg.contains("is a directory") && msg.contains("fixtures/tensors/pt"),
        "{msg}"
    );
    let missing = good("no_such_file.pt");
    assert!(err_of(&missing).contains("no_such_file.pt"));
}

#[test]
fn deep_nesting_and_memo_bombs_are_bounded() {
    assert_err(
        "deep_nested.pt",
        &["nested deeper than 512", "pickle opcode at byte"],
    );
    assert_err("memo_bomb.pt", &["expands to too many objects"]);
}

/// A torch-like archive holding `pkl` as its data.pkl, built in memory.
fn zip_with_pickle(pkl: &[u8]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.start_file("archive/data.pkl", opts).unwrap();
    w.write_all(pkl).unwrap();
    w.finish().unwrap().into_inner()
}

#[test]
fn hundred_thousand_nested_lists_do_not_overflow_the_stack() {
    let n = 100_000;
    let mut p = b"\x80\x02".to_vec();
    p.extend(std::iter::repeat_n(b']', n));
    p.extend(std::iter::repeat_n(b'a', n - 1));
    p.push(b'.');
    let e = read_pt_bytes(Arc::new(zip_with_pickle(&p))).unwrap_err();
    assert!(e.msg.contains("deeper than 512"), "{e}");
    // Exactly at the limit it reads; the value drops without recursion trouble.
    let mut p = b"\x80\x02".to_vec();
    p.extend(std::iter::repeat_n(b']', 512));
    p.extend(std::iter::repeat_n(b'a', 511));
    p.push(b'.');
    let v = read_pt_bytes(Arc::new(zip_with_pickle(&p))).unwrap();
    let mut depth = 0;
    let mut cur = &v;
    while let Some(items) = cur.as_seq() {
        depth += 1;
        match items.first() {
            Some(x) => cur = x,
            None => break,
        }
    }
    assert_eq!(depth, 512);
}

#[test]
fn numpy_scalars_and_protocol4_read_as_python_numbers() {
    let v = read_pt(&good("protocol4.pt")).unwrap();
    assert!(matches!(v.get("b"), Some(Value::Bytes(b)) if b == b"xy"));
    let n = read_pt(&good("nested.pt")).unwrap();
    let np = n.get("np").and_then(Value::as_seq).unwrap();
    assert!(matches!(np[0], Value::Float(f) if f == 1.25));
    assert!(matches!(np[1], Value::Int(-7)));
    assert!(matches!(np[2], Value::Bool(true)));
}

#[test]
fn flipped_and_cut_bytes_never_panic() {
    let bytes = std::fs::read(good("nested.pt")).unwrap();
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0xff;
        let _ = read_pt_bytes(Arc::new(b));
        let _ = read_pt_bytes(Arc::new(bytes[..i].to_vec()));
    }
    // The pickle alone, cut anywhere, inside a valid archive.
    let z = zip_with_pickle(b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.");
    assert!(read_pt_bytes(Arc::new(z)).is_ok());
    let e = read_pt_bytes(Arc::new(zip_with_pickle(b"\x80\x02}q\x00(X\x01\x00\x00"))).unwrap_err();
    assert_eq!(
        e.pos,
        Position::PickleOp {
            member: "archive/data.pkl".into(),
            offset: 6
        }
    );
}
