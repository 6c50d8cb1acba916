//! The `.pt` reader against files written by real `torch.save` (fixtures/gen/make_pt_cases.py)
//! and against corrupt or hostile archives.

use std::io::Write;

use predicates::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rlforensics::formats::pt::{read_pt, read_pt_bytes};
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

// ------------------------------------------------------------ torch's safe loader
// Files from fixtures/gen/make_pt_safe_cases.py: real torch.save output of every class
// torch.load(weights_only=True) reads, with torch's values in safe_expected.json.

fn safe(name: &str) -> PathBuf {
    good("safe").join(name)
}

fn safe_expected() -> serde_json::Map<String, Json> {
    let text = std::fs::read_to_string(safe("safe_expected.json")).unwrap();
    match serde_json::from_str(&text).unwrap() {
        Json::Object(m) => m,
        other => panic!("safe_expected.json is not an object: {other}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn strs(want: &Json, key: &str) -> Vec<String> {
    want[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Compare a value with torch's tree; tensors bit for bit (element bytes), decoded values
/// where torch decodes them, quantization parameters, storage sharing.
fn check_safe<'a>(got: &'a Value, want: &Json, path: &str, tensors: &mut Vec<(&'a Tensor, u64)>) {
    let ty = want["type"].as_str().unwrap();
    match (ty, got) {
        ("list", Value::List(items)) | ("tuple", Value::Tuple(items)) => {
            let w = want["items"].as_array().unwrap();
            assert_eq!(items.len(), w.len(), "{path}");
            for (i, (g, w)) in items.iter().zip(w).enumerate() {
                check_safe(g, w, &format!("{path}[{i}]"), tensors);
            }
        }
        ("dict", Value::Dict(items)) => {
            let w = want["items"].as_array().unwrap();
            assert_eq!(items.len(), w.len(), "{path}: {items:?}");
            for (i, ((gk, gv), w)) in items.iter().zip(w).enumerate() {
                check_safe(gk, &w[0], &format!("{path}.key{i}"), tensors);
                let key = gk.as_str().map(str::to_string).unwrap_or(format!("{gk:?}"));
                check_safe(gv, &w[1], &format!("{path}.{key}"), tensors);
            }
        }
        ("tensor", Value::Tensor(t)) => {
            let name = want["dtype"].as_str().unwrap();
            let dtype = DType::from_torch_name(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(t.dtype(), dtype, "{path}");
            assert_eq!(format!("torch.{}", t.dtype()), name, "{path}");
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
                "{path}"
            );
            // Bit-identical elements, whatever the dtype.
            assert_eq!(
                hex(&t.element_bytes()),
                want["hex"].as_str().unwrap(),
                "{path} bytes"
            );
            if want.get("values").is_some() {
                let values = strs(want, "values");
                if dtype.is_float() {
                    let got = t.to_f64_vec();
                    assert_eq!(got.len(), values.len(), "{path}");
                    for (i, (g, w)) in got.iter().zip(&values).enumerate() {
                        assert!(same_float(*g, w), "{path}[{i}]: {g} vs {w}");
                    }
                } else {
                    // Unsigned ints, u64 above i64::MAX included, from the exact bytes.
                    let s = dtype.size();
                    let got: Vec<String> = t
                        .element_bytes()
                        .chunks_exact(s)
                        .map(|c| {
                            let mut a = [0u8; 8];
                            a[..s].copy_from_slice(c);
                            u64::from_le_bytes(a).to_string()
                        })
                        .collect();
                    assert_eq!(got, values, "{path} values");
                    let small: Vec<i64> = values
                        .iter()
                        .map(|v| v.parse::<u64>().unwrap().min(i64::MAX as u64) as i64)
                        .collect();
                    assert_eq!(t.to_i64_vec(), small, "{path} to_i64_vec");
                }
            }
            if let Some(pairs) = want.get("pairs") {
                let got = t.to_f64_vec();
                let pairs = pairs.as_array().unwrap();
                assert_eq!(got.len(), pairs.len() * 2, "{path}");
                for (i, p) in pairs.iter().enumerate() {
                    for j in 0..2 {
                        let w = p[j].as_str().unwrap();
                        assert!(
                            same_float(got[2 * i + j], w),
                            "{path}[{i}].{j}: {} vs {w}",
                            got[2 * i + j]
                        );
                    }
                }
            }
            if let Some(ir) = want.get("int_repr") {
                let w: Vec<i64> = ir
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect();
                assert_eq!(t.to_i64_vec(), w, "{path} int_repr");
                let q = t
                    .quantization()
                    .unwrap_or_else(|| panic!("{path}: no quantization"));
                assert_eq!(q.scheme, want["qscheme"].as_str().unwrap(), "{path}");
                let floats = |v: &[f64]| v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>();
                assert_eq!(floats(&q.scales), strs(want, "scales"), "{path} scales");
                assert_eq!(
                    floats(&q.zero_points),
                    strs(want, "zero_points"),
                    "{path} zero points"
                );
                assert_eq!(
                    q.axis.map(|a| a as u64),
                    want.get("axis").and_then(Json::as_u64),
                    "{path}"
                );
            } else {
                assert!(t.quantization().is_none(), "{path}");
            }
            if let Some(g) = want.get("storage_group").and_then(Json::as_u64) {
                tensors.push((t, g));
            }
        }
        _ => check(got, want, path, &mut Vec::new()),
    }
}

#[test]
fn every_safe_loader_class_matches_torch() {
    let exp = safe_expected();
    let names: Vec<&str> = exp.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "state_dict.pt",
            "checkpoint_epoch_0010.pt",
            "adam_state.pt",
            "new_dtypes.pt",
            "complex.pt",
            "quantized.pt",
            "config_objects.pt",
            "tensor_attrs.pt",
            "sparse.pt",
            "meta.pt",
            "storages.pt",
            "no_crc32.pt",
            "legacy.pt",
            "legacy_model.bin",
        ]
    );
    for (name, want) in &exp {
        // read_any: the .bin name is recognised by its first bytes.
        let got =
            rlforensics::formats::read_any(&safe(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut tensors = Vec::new();
        check_safe(&got, want, name, &mut tensors);
        for (a, ga) in &tensors {
            for (b, gb) in &tensors {
                assert_eq!(a.shares_storage(b), ga == gb, "{name}: {a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn state_dict_of_a_module_reads_despite_its_metadata_attribute() {
    // OrderedDict + BUILD {'_metadata': …}: the keys are the module's, nothing more.
    let v = read_pt(&safe("state_dict.pt")).unwrap();
    let keys: Vec<&str> = v
        .as_dict()
        .unwrap()
        .iter()
        .filter_map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "steps",
            "extra",
            "embed.weight",
            "norm.weight",
            "norm.bias",
            "proj.weight",
            "proj.bias"
        ]
    );
    let adam = read_pt(&safe("adam_state.pt")).unwrap();
    let groups = adam.get("param_groups").and_then(Value::as_seq).unwrap();
    assert_eq!(groups[0].get("lr").and_then(Value::as_f64), Some(1e-3));
    assert!(matches!(groups[0].get("betas"), Some(Value::Tuple(b)) if b.len() == 2));
}

#[test]
fn a_21_byte_stem_archive_reads() {
    // torch writes the stem as the zip folder; 21 bytes made the zip crate misplace the
    // central directory.
    assert_eq!("checkpoint_epoch_0010".len(), 21);
    let v = read_pt(&safe("checkpoint_epoch_0010.pt")).unwrap();
    assert!(matches!(v.get("epoch"), Some(Value::Int(10))));
}

#[test]
fn zero_crc_from_set_crc32_options_false_is_not_corruption() {
    let bytes = std::fs::read(safe("no_crc32.pt")).unwrap();
    assert!(read_pt_bytes(Arc::new(bytes.clone())).is_ok());
    // A real CRC that does not match still fails: flip a storage byte of a checked file.
    let mut good_bytes = std::fs::read(safe("state_dict.pt")).unwrap();
    let at = memchr_last(&good_bytes, b"data/0") + 200;
    good_bytes[at] ^= 0x40;
    let e = read_pt_bytes(Arc::new(good_bytes)).unwrap_err();
    assert!(e.msg.contains("CRC-32"), "{e}");
}

fn memchr_last(h: &[u8], n: &[u8]) -> usize {
    h.windows(n.len()).position(|w| w == n).unwrap()
}

#[test]
fn legacy_format_reads_under_any_name_and_truncation_is_named() {
    let v = rlforensics::formats::read_any(&safe("legacy_model.bin")).unwrap();
    assert_eq!(v.as_dict().unwrap().len(), 7);
    let bytes = std::fs::read(safe("legacy.pt")).unwrap();
    let v = read_pt_bytes(Arc::new(bytes.clone())).unwrap();
    let w = v.get("w").and_then(Value::as_tensor).unwrap();
    let view = v.get("view").and_then(Value::as_tensor).unwrap();
    assert_eq!(view.to_f64_vec(), vec![3.0, 4.0, 5.0]);
    assert!(view.shares_storage(w));
    // Every cut of the file fails cleanly with a message, never a panic.
    for n in (0..bytes.len()).step_by(7) {
        let e = read_pt_bytes(Arc::new(bytes[..n].to_vec()));
        assert!(e.is_err(), "prefix {n} read");
    }
    let e = read_pt_bytes(Arc::new(bytes[..bytes.len() - 4].to_vec())).unwrap_err();
    assert!(e.msg.contains("past the end of the file"), "{e}");
}

#[test]
fn complex_float8_and_raw_dtypes_keep_their_dtype() {
    let v = read_pt(&safe("new_dtypes.pt")).unwrap();
    let t = |k: &str| v.get(k).and_then(Value::as_tensor).unwrap().clone();
    // Every float8 e4m3fn code, decoded exactly (computed here by hand for a few).
    let all = t("f8_all_codes_e4m3fn").to_f64_vec();
    assert_eq!(all[0x00], 0.0);
    assert_eq!(all[0x01], 2f64.powi(-9)); // smallest subnormal
    assert_eq!(all[0x38], 1.0);
    assert_eq!(all[0x7e], 448.0);
    assert!(all[0x7f].is_nan() && all[0xff].is_nan());
    assert_eq!(all[0xfe], -448.0);
    let e5 = t("f8_all_codes_e5m2").to_f64_vec();
    assert_eq!(e5[0x7c], f64::INFINITY);
    assert_eq!(e5[0x7b], 57344.0);
    let fnuz = t("f8_all_codes_e4m3fnuz").to_f64_vec();
    assert!(fnuz[0x80].is_nan());
    assert_eq!(fnuz[0x7f], 240.0);
    let e8 = t("f8_all_codes_e8m0fnu").to_f64_vec();
    assert_eq!(e8[127], 1.0);
    assert!(e8[255].is_nan());
    assert_eq!(t("f4x2").dtype(), DType::F4E2M1FNX2);
    assert_eq!(t("f4x2").to_i64_vec(), vec![0x12, 0xff, 0x70]);
    assert_eq!(t("complex32").to_f64_vec(), vec![1.0, 2.0, -0.5, -0.25]);
    assert!(t("complex32").to_candle(&candle_core::Device::Cpu).is_err());
    let c = read_pt(&safe("config_objects.pt")).unwrap();
    assert_eq!(
        c.get("dtype").and_then(Value::as_str),
        Some("torch.bfloat16")
    );
    assert_eq!(c.get("device").and_then(Value::as_str), Some("cuda:1"));
    let counter = c.get("counter").and_then(Value::as_dict).unwrap();
    assert!(matches!(counter[0], (Value::Str(ref k), Value::Int(3)) if k == "a"));
}

#[test]
fn inspect_one_file_exports_its_frames() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("fixtures/dumps/self_hosted_pt/forward_data/step_000000_rank4_micro0.pt");
    let out = tempfile::tempdir().unwrap();
    assert_cmd::Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--inspect")
        .arg(&file)
        .arg("--export-frames")
        .arg(out.path())
        .assert()
        .code(0)
        .stdout(predicates::str::contains("wrote"));
    for f in ["scalars.parquet", "tokens.parquet", "trajectories.parquet"] {
        assert!(out.path().join(f).is_file(), "{f}");
    }
    // A file outside any dump tree has no kind/step to put in rows: named, exit 2.
    assert_cmd::Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--inspect")
        .arg(safe("meta.pt"))
        .arg("--export-frames")
        .arg(out.path().join("x"))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("meta.pt").and(predicates::str::contains("kind folder")));
}

#[test]
fn flipped_bytes_of_legacy_files_never_panic() {
    // The legacy format has no CRC: every flipped byte reaches the unpickler or the
    // storage table, and must give a value or a clean error.
    for name in ["legacy.pt", "legacy_model.bin"] {
        let bytes = std::fs::read(safe(name)).unwrap();
        for i in 0..bytes.len() {
            for x in [0xff, 0x01, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= x;
                let _ = read_pt_bytes(Arc::new(b));
            }
        }
    }
}
