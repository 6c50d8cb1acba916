//! `.safetensors`, `.npy`/`.npz` and one-line `.jsonl` dumps against the values their real
//! producers wrote (`fixtures/gen/make_array_cases.py` → `fixtures/tensors/arrays_expected.json`),
//! and every corrupt case → an error naming the file and the position.

use std::path::{Path, PathBuf};

use rlforensics::formats::{dump_jsonl, npy, read_any, safetensors};
use rlforensics::{Error, Position, Tensor, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("fixtures/tensors/arrays_expected.json"))
        .expect("arrays_expected.json is committed");
    serde_json::from_str(&text).expect("arrays_expected.json is valid JSON")
}

/// The expected files whose path starts with `prefix`, with their entries.
fn expected_files(prefix: &str) -> Vec<(String, serde_json::Value)> {
    let exp = expected();
    let files = exp["files"].as_object().expect("files object");
    let out: Vec<_> = files
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(!out.is_empty(), "no expected files under {prefix}");
    out
}

/// Assert a tensor has exactly the dtype, shape and values the producer recorded.
fn assert_tensor(what: &str, t: &Tensor, exp: &serde_json::Value) {
    assert_eq!(t.dtype().torch_name(), exp["dtype"], "{what}: dtype");
    let shape: Vec<usize> = exp["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(t.shape(), shape.as_slice(), "{what}: shape");
    let values: Vec<&str> = exp["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(t.numel(), values.len(), "{what}: numel");
    if t.dtype().is_float() {
        let got = t.to_f64_vec();
        for (i, (g, e)) in got.iter().zip(&values).enumerate() {
            let e: f64 = e.parse().unwrap();
            assert!(
                g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                "{what}[{i}]: got {g:?}, producer wrote {e:?}"
            );
        }
    } else {
        let got = t.to_i64_vec();
        let want: Vec<i64> = values.iter().map(|v| v.parse().unwrap()).collect();
        assert_eq!(got, want, "{what}: values");
    }
}

/// Compare a dict of tensors (safetensors, npz) with its expected entry.
fn assert_tensor_dict(file: &str, v: &Value, exp: &serde_json::Value) {
    let tensors = exp["tensors"].as_object().unwrap();
    let dict = v.as_dict().expect("a dict");
    let names: Vec<&str> = dict
        .iter()
        .map(|(k, _)| k.as_str().unwrap())
        .filter(|k| *k != "__metadata__")
        .collect();
    let want_order: Vec<&str> = match exp.get("order") {
        Some(o) => o
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect(),
        None => tensors.keys().map(String::as_str).collect(),
    };
    assert_eq!(names, want_order, "{file}: names in file order");
    for (name, e) in tensors {
        let t = v
            .get(name)
            .and_then(Value::as_tensor)
            .unwrap_or_else(|| panic!("{file}: no tensor {name}"));
        assert_tensor(&format!("{file}:{name}"), t, e);
    }
    match &exp["metadata"] {
        serde_json::Value::Null => assert!(v.get("__metadata__").is_none(), "{file}"),
        serde_json::Value::Object(m) => {
            let got = v.get("__metadata__").expect("metadata").as_dict().unwrap();
            let got: Vec<(&str, &str)> = got
                .iter()
                .map(|(k, v)| (k.as_str().unwrap(), v.as_str().unwrap()))
                .collect();
            let want: Vec<(&str, &str)> = m
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
                .collect();
            let mut got_sorted = got.clone();
            got_sorted.sort();
            let mut want_sorted = want.clone();
            want_sorted.sort();
            assert_eq!(got_sorted, want_sorted, "{file}: metadata");
        }
        other => panic!("bad metadata entry {other}"),
    }
}

#[test]
fn safetensors_match_torch_and_numpy_writers() {
    for (file, exp) in expected_files("fixtures/tensors/safetensors/") {
        let path = root().join(&file);
        let v = safetensors::read_safetensors(&path).unwrap();
        assert_tensor_dict(&file, &v, &exp);
        let via_any = read_any(&path).unwrap();
        assert_eq!(via_any.as_dict().unwrap().len(), v.as_dict().unwrap().len());
    }
}

#[test]
fn safetensors_tensors_are_windows_of_the_map() {
    let path = root().join("fixtures/tensors/safetensors/torch_all_dtypes.safetensors");
    let v = safetensors::read_safetensors(&path).unwrap();
    let t = v.get("f32").and_then(Value::as_tensor).unwrap();
    // A window holds exactly its tensor's bytes, not a copy of the file.
    assert_eq!(t.storage_bytes().len(), 8 * 4);
    assert_eq!(t.storage_key(), Some("f32"));
    let meta = v.get("__metadata__").unwrap();
    assert_eq!(meta.get("format").and_then(Value::as_str), Some("pt"));
    // __metadata__ comes first, as in the header torch wrote.
    assert_eq!(v.as_dict().unwrap()[0].0.as_str(), Some("__metadata__"));
}

#[test]
fn npy_match_numpy_save() {
    let files = expected_files("fixtures/tensors/npy/");
    let mut seen = 0;
    for (file, exp) in files.iter().filter(|(f, _)| f.ends_with(".npy")) {
        let path = root().join(file);
        let v = npy::read_npy(&path).unwrap();
        let t = v.as_tensor().expect("a tensor");
        assert_tensor(file, t, &exp["tensors"][""]);
        seen += 1;
    }
    assert_eq!(seen, 18);
}

#[test]
fn fortran_order_npy_is_a_strided_view_without_copy() {
    let v = npy::read_npy(&root().join("fixtures/tensors/npy/fortran_f4.npy")).unwrap();
    let t = v.as_tensor().unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.strides(), &[1, 2]);
    assert!(!t.is_contiguous());
    assert_eq!(t.to_f64_vec(), vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.25]);
}

#[test]
fn npz_stored_and_deflate_match_numpy() {
    let files = expected_files("fixtures/tensors/npy/");
    let mut seen = 0;
    for (file, exp) in files.iter().filter(|(f, _)| f.ends_with(".npz")) {
        let path = root().join(file);
        let v = npy::read_npz(&path).unwrap();
        assert_tensor_dict(file, &v, exp);
        assert_eq!(read_any(&path).unwrap().as_dict().unwrap().len(), 3);
        seen += 1;
    }
    assert_eq!(seen, 2);
}

#[test]
fn jsonl_dump_matches_tolist_values() {
    let files = expected_files("fixtures/tensors/jsonl/");
    for (file, exp) in files {
        let path = root().join(&file);
        let v = dump_jsonl::read_dump_jsonl(&path).unwrap();
        let keys: Vec<&str> = v
            .as_dict()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        let want: Vec<&str> = exp["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(keys, want);
        for (name, e) in exp["tensors"].as_object().unwrap() {
            let t = v.get(name).and_then(Value::to_tensor).unwrap();
            assert_tensor(&format!("{file}:{name}"), &t, e);
        }
        assert_eq!(v.get("rank").and_then(Value::as_i64), Some(1));
        let extra = v.get("extra_info").unwrap();
        assert_eq!(
            extra.get("note").and_then(Value::as_str),
            Some("NaN and -Infinity in a string stay text")
        );
        assert!(extra.get("loss").and_then(Value::as_f64).unwrap().is_nan());
        assert!(matches!(extra.get("big"), Some(Value::BigInt(s)) if s == "9223372036854775808"));
        assert!(read_any(&path).is_ok());
    }
}

/// Read a corrupt fixture, expecting a format error at `pos`; the message names the file.
fn corrupt(rel: &str, pos: Position, needle: &str) {
    let path = root().join("fixtures/corrupt").join(rel);
    let err = read_any(&path).expect_err(rel);
    let text = err.to_string();
    match &err {
        Error::Format {
            path: p,
            pos: got,
            msg,
        } => {
            assert_eq!(p, &path, "{rel}");
            assert_eq!(got, &pos, "{rel}: {text}");
            assert!(
                msg.contains(needle),
                "{rel}: message {msg:?} lacks {needle:?}"
            );
        }
        other => panic!("{rel}: expected a format error, got {other:?}"),
    }
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains(&pos.to_string()), "{text}");
}

#[test]
fn corrupt_safetensors_name_file_and_position() {
    corrupt(
        "safetensors/empty.safetensors",
        Position::File,
        "empty file",
    );
    corrupt(
        "safetensors/short_length.safetensors",
        Position::Byte(0),
        "too short",
    );
    corrupt(
        "safetensors/truncated_header.safetensors",
        Position::Byte(0),
        "past the end of the file",
    );
    corrupt(
        "safetensors/header_longer_than_file.safetensors",
        Position::Byte(0),
        "past the end of the file",
    );
    corrupt(
        "safetensors/offsets_past_end.safetensors",
        Position::Byte(8),
        "tensor 'response_mask' has data_offsets [64, 4184]",
    );
    corrupt(
        "safetensors/float8_dtype.safetensors",
        Position::Byte(8),
        "tensor 'w8' has dtype F8_E4M3",
    );
}

#[test]
fn corrupt_header_json_points_into_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    let header = br#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},, }"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0, 0, 128, 63]);
    std::fs::write(&path, &bytes).unwrap();
    let err = safetensors::read_safetensors(&path).unwrap_err();
    let Error::Format { pos, .. } = &err else {
        panic!("{err:?}")
    };
    // The second comma is at index 61 of the header, 8 bytes into the file.
    assert_eq!(pos, &Position::Byte(8 + 61), "{err}");
    // A valid header whose sizes disagree with the dtype is refused by validation.
    let header = br#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0, 0, 128, 63]);
    std::fs::write(&path, &bytes).unwrap();
    assert!(safetensors::read_safetensors(&path).is_err());
}

#[test]
fn corrupt_npy_name_file_and_position() {
    corrupt("npy/empty.npy", Position::File, "empty file");
    corrupt("npy/bad_magic.npy", Position::Byte(0), "magic");
    corrupt(
        "npy/forged_shape.npy",
        Position::Byte(128),
        "shape [9999999, 4] of float32",
    );
    corrupt(
        "npy/forged_shape.npy",
        Position::Byte(128),
        "but only 48 follow the header",
    );
    corrupt(
        "npy/truncated_payload.npy",
        Position::Byte(128),
        "but only 43 follow the header",
    );
    corrupt(
        "npy/truncated_header.npy",
        Position::Byte(8),
        "header length 118",
    );
    corrupt("npy/object_array.npy", Position::Byte(10), "'|O'");
    corrupt("npy/unicode_array.npy", Position::Byte(10), "'<U3'");
    corrupt(
        "npy/object_member.npz",
        Position::Member("bad.npy, byte 10".into()),
        "'|O'",
    );
    corrupt("npy/not_a_zip.npz", Position::File, "not a zip archive");
}

#[test]
fn corrupt_jsonl_name_file_and_position() {
    corrupt("jsonl/empty.jsonl", Position::File, "empty dump");
    corrupt("jsonl/blank_lines.jsonl", Position::File, "empty dump");
    corrupt(
        "jsonl/truncated_line.jsonl",
        Position::LineColumn(1, 406),
        "EOF",
    );
    corrupt(
        "jsonl/two_objects.jsonl",
        Position::LineColumn(2, 1),
        "more content follows",
    );
    corrupt("jsonl/not_an_object.jsonl", Position::File, "found a list");
    corrupt(
        "jsonl/bad_token.jsonl",
        // serde_json stops at the `a` of `nan` (it expected `null`).
        Position::LineColumn(2, 11),
        "invalid JSON",
    );
}

#[test]
fn pretty_printed_json_dump_and_trailing_newlines_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loss.json");
    std::fs::write(
        &path,
        "{\n  \"loss\": NaN,\n  \"x\": [1, -Infinity]\n}\n\n\n",
    )
    .unwrap();
    let v = read_any(&path).unwrap();
    assert!(v.get("loss").and_then(Value::as_f64).unwrap().is_nan());
    let x = v.get("x").and_then(Value::to_tensor).unwrap();
    assert_eq!(x.to_f64_vec(), vec![1.0, f64::NEG_INFINITY]);
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let path = Path::new("fixtures/tensors/npy/does_not_exist.npy");
    let err = npy::read_npy(path).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    assert!(err.to_string().contains("does_not_exist.npy"));
}

#[test]
fn cut_files_never_panic() {
    // Every prefix of every good fixture is either read or refused, never a panic.
    let dir = tempfile::tempdir().unwrap();
    for sub in ["safetensors", "npy", "jsonl"] {
        for entry in std::fs::read_dir(root().join("fixtures/tensors").join(sub)).unwrap() {
            let src = entry.unwrap().path();
            let bytes = std::fs::read(&src).unwrap();
            let dst = dir.path().join(src.file_name().unwrap());
            let step = (bytes.len() / 40).max(1);
            for cut in (0..bytes.len()).step_by(step) {
                std::fs::write(&dst, &bytes[..cut]).unwrap();
                if let Err(e) = read_any(&dst) {
                    assert!(e.to_string().contains(&dst.display().to_string()));
                }
            }
        }
    }
}
