//! Packed lists: a pickled (any protocol) or `.jsonl`-dumped list of ints, floats or bools
//! reads as one typed array ([`Value::Packed`]) holding exactly the values Python wrote,
//! and a list that is not homogeneous still reads item by item.

use std::path::Path;

use rlforensics::formats::pt::pickle::unpickle;
use rlforensics::formats::read_any;
use rlforensics::value::{Ints, Packed};
use rlforensics::Value;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

/// The manifest entry of `path` (relative to fixtures/dumps).
fn manifest_entry(path: &str) -> Json {
    let m: Json =
        serde_json::from_str(&std::fs::read_to_string("fixtures/expected/manifest.json").unwrap())
            .unwrap();
    m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("{path} not in the manifest"))
        .clone()
}

/// sha256 of the ints joined by `,`, as the fixture generator hashes token lists.
fn joined_sha256(ints: &[i64]) -> String {
    let text: Vec<String> = ints.iter().map(i64::to_string).collect();
    let digest = Sha256::digest(text.join(",").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn read(path: &str) -> Value {
    read_any(&Path::new("fixtures/dumps").join(path)).unwrap()
}

/// A `.jsonl` dump parsed item by item (no packing): the reference the packed reads are
/// checked against.
fn read_plain(path: &str) -> Value {
    let text = std::fs::read_to_string(Path::new("fixtures/dumps").join(path)).unwrap();
    rlforensics::json::parse_value(&text).unwrap()
}

/// The packed ints under `key` of `v`, with their storage width.
fn packed_ints<'a>(v: &'a Value, key: &str) -> &'a Ints {
    match v.get(key).and_then(Value::as_packed) {
        Some(Packed::Ints(ints)) => ints,
        other => panic!("{key}: expected packed ints, found {other:?}"),
    }
}

fn packed_floats<'a>(v: &'a Value, key: &str) -> &'a [f64] {
    match v.get(key).and_then(Value::as_packed) {
        Some(Packed::Floats(f)) => f,
        other => panic!("{key}: expected packed floats, found {other:?}"),
    }
}

/// The list of ints under `key` of a `.jsonl` twin read by [`read_plain`], item by item.
fn json_ints(v: &Value, key: &str) -> Vec<i64> {
    v.get(key)
        .and_then(Value::as_seq)
        .unwrap()
        .iter()
        .map(|x| match x {
            Value::Int(i) => *i,
            other => panic!("{key}: {other:?} is not an int"),
        })
        .collect()
}

#[test]
fn trajectory_token_lists_read_packed_with_the_manifest_values() {
    for (pt, jsonl) in [
        (
            "self_hosted_pt/trajectory/step_000000.pt",
            Some("self_hosted_jsonl/trajectory/step_000000.jsonl"),
        ),
        ("self_hosted_pt/trajectory/step_-00001.pt", None),
        (
            "remote_api_pt/prepared_trajectories/step_000000.pt",
            Some("remote_api_jsonl/prepared_trajectories/step_000000.jsonl"),
        ),
    ] {
        let want = manifest_entry(pt);
        let items = want["trajectories"]["items"].as_array().unwrap();
        let v = read(pt);
        let trajs = v.get("trajectories").and_then(Value::as_seq).unwrap();
        assert_eq!(trajs.len(), items.len(), "{pt}");
        assert_eq!(
            want["trajectories"]["count"].as_u64(),
            Some(items.len() as u64)
        );
        let twin = jsonl.map(read_plain);
        let twin_trajs = twin
            .as_ref()
            .map(|t| t.get("trajectories").and_then(Value::as_seq).unwrap());
        // The `.jsonl` twin as the dump reader reads it: its lists packed too.
        let twin_packed = jsonl.map(read);
        let twin_packed = twin_packed
            .as_ref()
            .map(|t| t.get("trajectories").and_then(Value::as_seq).unwrap());
        for (i, (t, w)) in trajs.iter().zip(items).enumerate() {
            let tokens = packed_ints(t, "tokens");
            let mask = packed_ints(t, "loss_mask");
            // Token ids 100..31999 take two bytes each, the 0/1 mask one.
            assert!(matches!(tokens, Ints::U16(_)), "{pt}[{i}] {tokens:?}");
            assert!(matches!(mask, Ints::U8(_)), "{pt}[{i}] {mask:?}");
            let tokens = tokens.to_vec();
            assert_eq!(joined_sha256(&tokens), w["tokens_sha256"], "{pt}[{i}]");
            assert_eq!(
                tokens.len() as u64,
                w["length"].as_u64().unwrap(),
                "{pt}[{i}]"
            );
            assert_eq!(
                mask.iter().sum::<i64>(),
                w["loss_mask_sum"].as_i64().unwrap(),
                "{pt}[{i}]"
            );
            assert_eq!(mask.len(), tokens.len(), "{pt}[{i}]");
            if let Some(tt) = &twin_trajs {
                assert_eq!(tokens, json_ints(&tt[i], "tokens"), "{pt}[{i}]");
                assert_eq!(mask.to_vec(), json_ints(&tt[i], "loss_mask"), "{pt}[{i}]");
            }
            if let Some(tp) = &twin_packed {
                let jt = packed_ints(&tp[i], "tokens");
                let jm = packed_ints(&tp[i], "loss_mask");
                assert!(matches!(jt, Ints::U16(_)), "{jsonl:?}[{i}] {jt:?}");
                assert!(matches!(jm, Ints::U8(_)), "{jsonl:?}[{i}] {jm:?}");
                assert_eq!(jt.to_vec(), tokens, "{jsonl:?}[{i}]");
                assert_eq!(jm.to_vec(), mask.to_vec(), "{jsonl:?}[{i}]");
            }
            // The same list to every reader: a list type, its length, its tensor.
            let tv = t.get("tokens").unwrap();
            assert_eq!(tv.type_name(), "list");
            assert_eq!(tv.seq_len(), Some(tokens.len()));
            assert_eq!(tv.to_tensor().unwrap().to_i64_vec(), tokens);
            assert_eq!(tv.to_i64s().unwrap(), tokens);
        }
    }
}

#[test]
fn prepared_advantages_and_datum_lists_read_packed_bit_for_bit() {
    let pt = read("remote_api_pt/prepared_trajectories/step_000000.pt");
    let js = read_plain("remote_api_jsonl/prepared_trajectories/step_000000.jsonl");
    let js_packed = read("remote_api_jsonl/prepared_trajectories/step_000000.jsonl");
    let adv = packed_floats(&pt, "advantages");
    let bits = |x: &[f64]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(packed_floats(&js_packed, "advantages")), bits(adv));
    let want: Vec<f64> = js
        .get("advantages")
        .and_then(Value::as_seq)
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(adv.len(), 48);
    assert!(adv
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));

    let path = "remote_api_pt/datums/step_000000.pt";
    let m = manifest_entry(path);
    let items = m["datums"]["items"].as_array().unwrap();
    let pt = read(path);
    let js = read_plain("remote_api_jsonl/datums/step_000000.jsonl");
    let js_packed = read("remote_api_jsonl/datums/step_000000.jsonl");
    let datums = pt.get("datums").and_then(Value::as_seq).unwrap();
    let twins = js.get("datums").and_then(Value::as_seq).unwrap();
    let twins_packed = js_packed.get("datums").and_then(Value::as_seq).unwrap();
    assert_eq!(twins_packed.len(), 40);
    assert_eq!(datums.len(), 40);
    assert_eq!(items.len(), 40);
    for (i, ((d, tw), w)) in datums.iter().zip(twins).zip(items).enumerate() {
        let input = packed_ints(d, "input_tokens").to_vec();
        assert_eq!(joined_sha256(&input), w["input_tokens_sha256"], "datum {i}");
        assert_eq!(
            input.len() as u64,
            w["length"].as_u64().unwrap(),
            "datum {i}"
        );
        let f = d.get("loss_fn_inputs").unwrap();
        let tf = tw.get("loss_fn_inputs").unwrap();
        let tp = twins_packed[i].get("loss_fn_inputs").unwrap();
        assert_eq!(
            packed_ints(&twins_packed[i], "input_tokens").to_vec(),
            input,
            "datum {i}"
        );
        let target = packed_ints(f, "target_tokens").to_vec();
        assert_eq!(
            packed_ints(tp, "target_tokens").to_vec(),
            target,
            "datum {i}"
        );
        assert_eq!(
            joined_sha256(&target),
            w["target_tokens_sha256"],
            "datum {i}"
        );
        for key in ["logprobs", "advantages", "loss_mask"] {
            let got = packed_floats(f, key);
            let want: Vec<f64> = tf
                .get(key)
                .and_then(Value::as_seq)
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(got.len(), want.len(), "datum {i} {key}");
            assert_eq!(bits(packed_floats(tp, key)), bits(got), "datum {i} {key}");
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "datum {i} {key}"
            );
        }
        assert_eq!(
            packed_floats(f, "loss_mask").iter().sum::<f64>(),
            w["loss_mask_sum"].as_str().unwrap().parse::<f64>().unwrap(),
            "datum {i}"
        );
    }
}

// ---------------------------------------------------------------- hand-made pickles

/// Opcodes as `pickle` (protocol 2) writes a list: EMPTY_LIST, BINPUT, then batches
/// of MARK … APPENDS.
fn int_op(x: i64) -> Vec<u8> {
    match x {
        0..=0xff => vec![b'K', x as u8],
        0x100..=0xffff => {
            let mut v = vec![b'M'];
            v.extend_from_slice(&(x as u16).to_le_bytes());
            v
        }
        _ if i32::try_from(x).is_ok() => {
            let mut v = vec![b'J'];
            v.extend_from_slice(&(x as i32).to_le_bytes());
            v
        }
        _ => {
            let mut v = vec![0x8a, 8];
            v.extend_from_slice(&x.to_le_bytes());
            v
        }
    }
}

fn float_op(x: f64) -> Vec<u8> {
    let mut v = vec![b'G'];
    v.extend_from_slice(&x.to_be_bytes());
    v
}

/// `\x80\x02 ] q\x00 ( batch1 e ( batch2 e … .`
fn list_pickle(batches: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut p = b"\x80\x02]q\x00".to_vec();
    for b in batches {
        p.push(b'(');
        for item in b {
            p.extend_from_slice(item);
        }
        p.push(b'e');
    }
    p.push(b'.');
    p
}

fn load(p: &[u8]) -> Value {
    unpickle(p, "data.pkl", &mut |_| Err("no storages here".into())).unwrap()
}

#[test]
fn ints_widen_to_the_narrowest_storage_that_holds_them() {
    let width = |i: &Ints| match i {
        Ints::U8(_) => "u8",
        Ints::U16(_) => "u16",
        Ints::I32(_) => "i32",
        Ints::I64(_) => "i64",
    };
    let cases: [(&[i64], &str); 4] = [
        (&[0, 1, 255], "u8"),
        (&[0, 255, 256, 65535], "u16"),
        (&[1, 300, 70_000, -5], "i32"),
        (&[1, 300, -5, 1 << 40, i64::MIN], "i64"),
    ];
    for (xs, want) in cases {
        let v = load(&list_pickle(&[xs.iter().map(|&x| int_op(x)).collect()]));
        let ints = match v.as_packed() {
            Some(Packed::Ints(i)) => i,
            other => panic!("{xs:?}: {other:?}"),
        };
        assert_eq!(width(ints), want, "{xs:?}");
        assert_eq!(ints.to_vec(), xs);
    }
    // Widening across batches keeps the earlier ones.
    let v = load(&list_pickle(&[
        vec![int_op(7), int_op(8)],
        vec![int_op(-(1 << 35)), int_op(9)],
    ]));
    assert_eq!(v.to_i64s().unwrap(), vec![7, 8, -(1 << 35), 9]);
}

#[test]
fn float_and_bool_lists_read_packed() {
    let v = load(&list_pickle(&[vec![
        float_op(1.5),
        float_op(f64::NEG_INFINITY),
        float_op(-0.0),
    ]]));
    match v.as_packed() {
        Some(Packed::Floats(f)) => {
            assert_eq!(f.len(), 3);
            assert_eq!(f[0], 1.5);
            assert_eq!(f[1], f64::NEG_INFINITY);
            assert_eq!(f[2].to_bits(), (-0.0f64).to_bits());
        }
        other => panic!("{other:?}"),
    }
    let v = load(&list_pickle(&[vec![vec![0x88], vec![0x89], vec![0x88]]]));
    assert_eq!(v.as_packed(), Some(&Packed::Bools(vec![true, false, true])));
    // Bools stay bools, read as ints 0/1 where numbers are wanted.
    assert_eq!(v.to_i64s().unwrap(), vec![1, 0, 1]);
    assert_eq!(v.to_tensor().unwrap().to_i64_vec(), vec![1, 0, 1]);
}

#[test]
fn a_list_that_turns_heterogeneous_reads_item_by_item() {
    // ints, then a batch with a float: Python's [1, 2, 3, 2.5] keeps each item's type.
    let v = load(&list_pickle(&[
        vec![int_op(1), int_op(2)],
        vec![int_op(3), float_op(2.5)],
    ]));
    let items = v.as_seq().expect("a list of values");
    assert!(matches!(
        items,
        [Value::Int(1), Value::Int(2), Value::Int(3), Value::Float(f)] if *f == 2.5
    ));
    // ints and bools are different Python types: not packed together.
    let v = load(&list_pickle(&[vec![int_op(1), vec![0x88]]]));
    assert!(matches!(
        v.as_seq().unwrap(),
        [Value::Int(1), Value::Bool(true)]
    ));
    // A string inside a batch: the batch reads the ordinary way.
    let mut s = b"X\x02\x00\x00\x00hi".to_vec();
    s.extend_from_slice(b"q\x01");
    let v = load(&list_pickle(&[
        vec![int_op(4), int_op(5)],
        vec![int_op(6), s],
    ]));
    assert!(matches!(
        v.as_seq().unwrap(),
        [Value::Int(4), Value::Int(5), Value::Int(6), Value::Str(h)] if h == "hi"
    ));
    // A single APPEND of the list's kind stays packed; of another kind, it unpacks.
    let mut p = list_pickle(&[vec![int_op(1), int_op(2)]]);
    p.pop();
    p.extend_from_slice(&int_op(3));
    p.push(b'a');
    p.push(b'.');
    assert_eq!(load(&p).to_i64s().unwrap(), vec![1, 2, 3]);
    assert!(load(&p).as_packed().is_some());
    let mut p = list_pickle(&[vec![int_op(1), int_op(2)]]);
    p.pop();
    p.push(b'N');
    p.push(b'a');
    p.push(b'.');
    assert!(matches!(
        load(&p).as_seq().unwrap(),
        [Value::Int(1), Value::Int(2), Value::None]
    ));
}

#[test]
fn a_shared_packed_list_is_the_same_list_everywhere() {
    // d = {"a": xs, "b": xs} with xs = [1, 2, 3]: the memo reference reads the same values.
    let mut p = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01K\x02K\x03eX\x01\x00\x00\x00bq\x03h\x02u.".to_vec();
    let v = load(&p);
    assert_eq!(v.get("a").unwrap().to_i64s().unwrap(), vec![1, 2, 3]);
    assert_eq!(v.get("b").unwrap().to_i64s().unwrap(), vec![1, 2, 3]);
    // A packed list given to a call is unpacked first: bytes([104, 105]) == b"hi".
    p = b"\x80\x02c__builtin__\nbytes\nq\x00]q\x01(KhKie\x85q\x02Rq\x03.".to_vec();
    assert!(matches!(load(&p), Value::Bytes(b) if b == b"hi"));
    // MARK APPENDS with nothing between adds nothing; the list stays an empty list.
    let v = load(b"\x80\x02]q\x00(e.");
    assert!(matches!(v, Value::List(ref xs) if xs.is_empty()));
}

#[test]
fn a_truncated_batch_is_refused_with_its_offset() {
    // The batch runs off the end: the ordinary reader reports where.
    let p = b"\x80\x02]q\x00(K\x01K\x02M\x01";
    let e = unpickle(p, "data.pkl", &mut |_| Err("none".into())).unwrap_err();
    assert!(e.to_string().contains("data.pkl"), "{e}");
    assert!(e.to_string().contains("ends early"), "{e}");
}

#[test]
fn repeated_references_to_a_packed_list_spend_the_expansion_budget() {
    // [xs] * 5000 with xs = [1] * 1000: 12 KB of pickle standing for 5 million ints. Each
    // memo reference counts its elements, as it would for a list of values: refused.
    let mut p = b"\x80\x02]q\x00(".to_vec();
    for _ in 0..1000 {
        p.extend_from_slice(b"K\x01");
    }
    p.extend_from_slice(b"e]q\x01(");
    for _ in 0..5000 {
        p.extend_from_slice(b"h\x00");
    }
    p.extend_from_slice(b"e.");
    let e = unpickle(&p, "data.pkl", &mut |_| Err("none".into())).unwrap_err();
    assert!(e.to_string().contains("too many objects"), "{e}");
    // Fifty references are fine, and each is the same list.
    let mut p = b"\x80\x02]q\x00(".to_vec();
    for _ in 0..1000 {
        p.extend_from_slice(b"K\x01");
    }
    p.extend_from_slice(b"e]q\x01(");
    for _ in 0..50 {
        p.extend_from_slice(b"h\x00");
    }
    p.extend_from_slice(b"e.");
    let v = load(&p);
    let t = v.to_tensor().unwrap();
    assert_eq!(t.shape(), &[50, 1000]);
    assert_eq!(t.to_i64_vec().iter().sum::<i64>(), 50_000);
}

// ---------------------------------------------------------------- protocols 0 and 1

#[test]
fn protocol_0_and_1_lists_read_packed() {
    // Each pickle is pickle.dumps(obj, proto) from CPython 3.12: protocol 0 writes
    // MARK LIST then one APPEND per item (text INT/LONG/FLOAT, I01/I00 bools); protocol 1
    // EMPTY_LIST then MARK ... APPENDS with binary ints, text LONG beyond 32 bits,
    // BINFLOAT and text bools.
    let ints = |v: &Value| match v.as_packed() {
        Some(Packed::Ints(i)) => i.to_vec(),
        other => panic!("expected packed ints, found {other:?}"),
    };
    let p0 = load(b"(lp0\nI1\naI2\naI70000\naI-5\naL1099511627776L\na.");
    assert_eq!(ints(&p0), vec![1, 2, 70000, -5, 1 << 40]);
    let p0 = load(b"(lp0\nF1.5\naF-0.0\naFinf\na.");
    match p0.as_packed() {
        Some(Packed::Floats(f)) => {
            assert_eq!(f.len(), 3);
            assert_eq!(f[0], 1.5);
            assert_eq!(f[1].to_bits(), (-0.0f64).to_bits());
            assert_eq!(f[2], f64::INFINITY);
        }
        other => panic!("{other:?}"),
    }
    let p0 = load(b"(lp0\nI01\naI00\naI01\na.");
    assert_eq!(
        p0.as_packed(),
        Some(&Packed::Bools(vec![true, false, true]))
    );
    let p1 = load(b"]q\x00(K\x03M,\x01L1099511627776L\nL-34359738368L\ne.");
    assert_eq!(ints(&p1), vec![3, 300, 1 << 40, -(1 << 35)]);
    let p1 = load(b"]q\x00(I01\nI00\ne.");
    assert_eq!(p1.as_packed(), Some(&Packed::Bools(vec![true, false])));
    let p1 = load(b"]q\x00(G?\xd0\x00\x00\x00\x00\x00\x00G\xc0\x00\x00\x00\x00\x00\x00\x00e.");
    assert_eq!(p1.as_packed(), Some(&Packed::Floats(vec![0.25, -2.0])));
    // Hand-made MARK x1 ... xn LIST of ints.
    assert_eq!(
        ints(&load(b"(K\x07K\x08J\x00\x00\x01\x00l.")),
        vec![7, 8, 65536]
    );
    // Text LONG beyond i64 in a batch: read item by item, a big int kept exactly.
    let v = load(b"]q\x00(K\x01L18446744073709551616L\ne.");
    assert!(matches!(
        v.as_seq().unwrap(),
        [Value::Int(1), Value::BigInt(b)] if b == "18446744073709551616"
    ));
    // Protocol 0 list turning heterogeneous: ints then a string, read item by item.
    let v = load(b"(lp0\nI1\naI2\naVx\np1\na.");
    assert!(matches!(
        v.as_seq().unwrap(),
        [Value::Int(1), Value::Int(2), Value::Str(x)] if x == "x"
    ));
}

#[test]
fn a_scalar_still_referenced_elsewhere_keeps_its_value() {
    // x = 7 memoized, appended, then fetched again: [x, x] and x itself in a tuple.
    let v = load(b"(lp0\nI7\np1\nag1\nag1\n\x86.");
    let items = v.as_seq().unwrap();
    assert_eq!(items[0].to_i64s().unwrap(), vec![7, 7]);
    assert!(matches!(items[1], Value::Int(7)));
    // x = 7 duplicated (DUP) below a MARK, the copy packed into a list: (7, [7]).
    let v = load(b"I7\n(2l\x86.");
    let items = v.as_seq().unwrap();
    assert!(matches!(items[0], Value::Int(7)), "{items:?}");
    assert_eq!(items[1].to_i64s().unwrap(), vec![7]);
    assert!(items[1].as_packed().is_some());
}

#[test]
fn jsonl_lists_read_packed_and_heterogeneous_ones_item_by_item() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.jsonl");
    std::fs::write(
        &path,
        "{\"ints\": [1, 2, 70000], \"floats\": [0.5, NaN, -Infinity], \"bools\": [true, false], \
         \"mixed\": [1, 2.5], \"rows\": [[1.0, 2.0], [3.0, 4.0]], \"empty\": [], \
         \"big\": [1, 18446744073709551615]}\n",
    )
    .unwrap();
    let v = read_any(&path).unwrap();
    assert_eq!(
        v.get("ints").unwrap().as_packed(),
        Some(&Packed::Ints(Ints::I32(vec![1, 2, 70000])))
    );
    match v.get("floats").unwrap().as_packed() {
        Some(Packed::Floats(f)) => {
            assert_eq!(f[0], 0.5);
            assert!(f[1].is_nan());
            assert_eq!(f[2], f64::NEG_INFINITY);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        v.get("bools").unwrap().as_packed(),
        Some(&Packed::Bools(vec![true, false]))
    );
    assert!(matches!(
        v.get("mixed").unwrap().as_seq().unwrap(),
        [Value::Int(1), Value::Float(f)] if *f == 2.5
    ));
    let rows = v.get("rows").unwrap();
    assert_eq!(rows.seq_len(), Some(2));
    let t = rows.to_tensor().unwrap();
    assert_eq!(t.shape(), &[2, 2]);
    assert_eq!(t.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    assert!(matches!(v.get("empty").unwrap(), Value::List(x) if x.is_empty()));
    assert!(matches!(
        v.get("big").unwrap().as_seq().unwrap(),
        [Value::Int(1), Value::BigInt(b)] if b == "18446744073709551615"
    ));
}

// ---------------------------------------------------------------- streaming reads

#[test]
fn trajectories_handed_over_one_by_one_are_the_items_of_a_whole_read() {
    use rlforensics::formats::pt::{pickle::Each, read_pt_map_each};
    let path = Path::new("fixtures/dumps/self_hosted_pt/trajectory/step_000000.pt");
    let whole = read_any(path).unwrap();
    let want = whole.get("trajectories").and_then(Value::as_seq).unwrap();
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a fixture nobody writes while the test runs.
    let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
    let mut got = Vec::new();
    let mut each = |i: usize, t: Value| -> Result<Value, String> {
        got.push((i, t));
        Ok(Value::Int(i as i64 * 10))
    };
    let v = read_pt_map_each(
        map,
        Each {
            key: "trajectories",
            each: &mut each,
        },
    )
    .unwrap();
    assert_eq!(got.len(), want.len());
    assert!(want.len() > 1);
    for ((i, t), w) in got.iter().zip(want) {
        for key in ["tokens", "loss_mask"] {
            let (a, b) = (t.get(key).unwrap(), w.get(key).unwrap());
            assert!(a.as_packed().is_some(), "[{i}] {key}");
            assert_eq!(a.to_i64s(), b.to_i64s(), "[{i}] {key}");
        }
        assert_eq!(
            t.get("reward").and_then(Value::as_f64).map(f64::to_bits),
            w.get("reward").and_then(Value::as_f64).map(f64::to_bits)
        );
    }
    // What the hook returned took each item's place; the rest of the file is as read whole.
    let kept: Vec<i64> = v
        .get("trajectories")
        .and_then(Value::as_seq)
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    assert_eq!(
        kept,
        (0..want.len() as i64).map(|i| i * 10).collect::<Vec<_>>()
    );
    assert_eq!(
        v.get("step").and_then(Value::as_i64),
        whole.get("step").and_then(Value::as_i64)
    );
}

/// Unpickle `p` handing the items under root key "t" to a hook that keeps their length:
/// the read's outcome and the indices of the items handed over, whether it failed or not.
fn each_run(p: &[u8]) -> (Result<Value, String>, Vec<usize>) {
    use rlforensics::formats::pt::pickle::{unpickle_each, Each};
    let mut seen = Vec::new();
    let mut each = |i: usize, t: Value| -> Result<Value, String> {
        seen.push(i);
        Ok(Value::Int(t.seq_len().unwrap_or(0) as i64))
    };
    let r = unpickle_each(
        p,
        "data.pkl",
        &mut |_| Err("no storages".into()),
        &mut |_| {},
        Some(Each {
            key: "t",
            each: &mut each,
        }),
    );
    (r.map(|(v, _)| v).map_err(|e| e.to_string()), seen)
}

/// [`each_run`] of a pickle that reads: its value and the items handed over.
fn each_lengths(p: &[u8]) -> Result<(Value, Vec<usize>), String> {
    let (r, seen) = each_run(p);
    r.map(|v| (v, seen))
}

#[test]
fn only_the_root_key_is_streamed_and_a_shared_item_is_refused() {
    // {"t": [[1, 2], [3]], "u": {"t": [[4]], "x": 1}}, protocol 2.
    let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00tq\x01]q\x02(]q\x03(K\x01K\x02e]q\x04K\x03aeX\x01\x00\x00\x00uq\x05}q\x06(h\x01]q\x07]q\x08K\x04aaX\x01\x00\x00\x00xq\tK\x01uu.";
    let (v, seen) = each_lengths(p).unwrap();
    assert_eq!(seen, vec![0, 1]);
    let t: Vec<i64> = v
        .get("t")
        .and_then(Value::as_seq)
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    assert_eq!(t, vec![2, 1]);
    // The nested "t" is not the root's: read as is.
    let inner = v.get("u").and_then(|u| u.get("t")).unwrap();
    assert_eq!(inner.to_tensor().unwrap().to_i64_vec(), vec![4]);
    // {"u": {"t": [[4]]}, "t": [[5]]}: a one-key nested dict looks like the root on the
    // stack; its items are handed too, and the read fails at the end rather than return
    // them as the root's (the caller reads the file whole).
    let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00uq\x01}q\x02X\x01\x00\x00\x00tq\x03]q\x04]q\x05K\x04aash\x03]q\x06]q\x07K\x05aau.";
    let e = each_lengths(p).unwrap_err();
    assert!(e.contains("not all those of the root"), "{e}");
    // {"t": [xs], "again": xs}: the handed item's list is freed, so the second reference
    // fails (the caller then reads the file whole) instead of reading other values.
    let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00tq\x01]q\x02]q\x03(K\x01K\x02eaX\x05\x00\x00\x00againq\x04h\x03u.";
    let e = each_lengths(p).unwrap_err();
    assert!(e.contains("referenced again"), "{e}");
}

#[test]
fn items_are_handed_over_as_the_next_begins_not_at_the_batch_end() {
    // pickle.dumps({"t": [{"a": 1, "b": [1, 2]}, {"a": 2, "b": [3]}, {"a": 3, "b": [4]}]},
    // protocol=2): one MARK … APPENDS batch of three two-key dicts, each `MARK … SETITEMS`.
    let p = b"\x80\x02}q\x00X\x01\x00\x00\x00tq\x01]q\x02(}q\x03(X\x01\x00\x00\x00aq\x04K\x01X\x01\x00\x00\x00bq\x05]q\x06(K\x01K\x02eu}q\x07(h\x04K\x02h\x05]q\x08K\x03au}q\t(h\x04K\x03h\x05]q\nK\x04aues.";
    let (v, seen) = each_lengths(p).unwrap();
    assert_eq!(seen, vec![0, 1, 2]);
    // What the hook returned (a dict's `seq_len` is none: 0) took each item's place.
    let t: Vec<Option<i64>> = v
        .get("t")
        .and_then(Value::as_seq)
        .unwrap()
        .iter()
        .map(Value::as_i64)
        .collect();
    assert_eq!(t, vec![Some(0); 3]);
    // Cut inside the third dict (after its MARK, offset 69): the first two were handed
    // over already — each as the next one opened its MARK — though the batch never ends.
    let (r, seen) = each_run(&p[..72]);
    assert_eq!(seen, vec![0, 1]);
    let e = r.unwrap_err();
    assert!(e.contains("STOP") || e.contains("ends"), "{e}");
    // The same value at protocol 4 (FRAME, MEMOIZE, SHORT_BINUNICODE; torch.save's
    // `pickle_protocol=4`): handed over alike, the first two before the third's MARK
    // (offset 59) is followed by its end.
    let p4 = b"\x80\x04\x95@\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01t\x94]\x94(}\x94(\x8c\x01a\x94K\x01\x8c\x01b\x94]\x94(K\x01K\x02eu}\x94(h\x04K\x02h\x05]\x94K\x03au}\x94(h\x04K\x03h\x05]\x94K\x04aues.";
    let (_, seen) = each_lengths(p4).unwrap();
    assert_eq!(seen, vec![0, 1, 2]);
    assert_eq!(each_run(&p4[..62]).1, vec![0, 1]);
    // {"t": [{"a": 1, "b": xs}, {"a": 2, "b": xs}]}: the second item reaches the first's
    // list, freed when the first was handed over: the read fails (the caller reads the
    // file whole) instead of reading other values.
    let p = b"\x80\x02}q\x00X\x01\x00\x00\x00tq\x01]q\x02(}q\x03(X\x01\x00\x00\x00aq\x04K\x01X\x01\x00\x00\x00bq\x05]q\x06(K\x07K\x08eu}q\x07(h\x04K\x02h\x05h\x06ues.";
    let e = each_lengths(p).unwrap_err();
    assert!(e.contains("referenced again"), "{e}");
}

#[test]
fn a_dict_handed_early_that_was_part_of_an_item_fails_the_streamed_read() {
    // pickle.dumps({"t": [(d0, d1), (d2, d3)]}, protocol=2) with two-key dicts: d1's MARK
    // finds d0 below it, complete, and hands it as an item, but TUPLE2 then makes (d0, d1)
    // the item. The batch's APPENDS sees that the item handed early is not its first item:
    // the read fails (the caller reads the file whole) rather than return a wrong count.
    let p = b"\x80\x02}q\x00X\x01\x00\x00\x00tq\x01]q\x02(}q\x03(X\x01\x00\x00\x00aq\x04K\x01X\x01\x00\x00\x00bq\x05]q\x06(K\x01K\x02eu}q\x07(h\x04K\x02h\x05]q\x08K\x03au\x86q\t}q\n(h\x04K\x03h\x05]q\x0bK\x04au}q\x0c(h\x04K\x04h\x05]q\rK\x05au\x86q\x0ees.";
    let e = each_lengths(p).unwrap_err();
    assert!(e.contains("not the batch's first items"), "{e}");
    // Read without the hook, the same bytes are a list of two pairs of dicts.
    let v = rlforensics::formats::pt::pickle::unpickle(p, "data.pkl", &mut |_| {
        Err("no storages".into())
    })
    .unwrap();
    let t = v.get("t").and_then(Value::as_seq).unwrap();
    assert_eq!(t.len(), 2);
    assert!(t
        .iter()
        .all(|x| matches!(x, Value::Tuple(p) if p.len() == 2)));
}

/// The trajectory fixture's `data.pkl` (CPython's pickler through `torch.save`), read from
/// its zip with the `zip` crate rather than the code under test.
fn trajectory_pickle() -> Vec<u8> {
    use std::io::Read;
    let f = std::fs::File::open("fixtures/dumps/self_hosted_pt/trajectory/step_000000.pt").unwrap();
    let mut z = zip::ZipArchive::new(f).unwrap();
    let mut m = z.by_name("step_000000/data.pkl").unwrap();
    let mut out = Vec::new();
    m.read_to_end(&mut out).unwrap();
    out
}

/// Seeded mutations of a real trajectory pickle (a byte replaced by an opcode that opens,
/// closes, duplicates or fetches objects; a byte removed; the end cut): whenever a streamed
/// read succeeds with every item of the list handed over, the items handed are exactly
/// those a whole read finds there, in order. Early hand-over never hands a wrong item.
#[test]
fn streamed_items_are_the_whole_reads_items_under_mutation() {
    use rlforensics::formats::pt::pickle::{unpickle_each, Each};
    let base = trajectory_pickle();
    let ops = b"()eus012hq}]at\x85\x86\x87KMJN.";
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let (mut streamed_ok, mut checked) = (0, 0);
    for i in 0..3000 {
        let mut p = base.clone();
        match i % 3 {
            0 => {
                let at = rand(p.len());
                p[at] = ops[rand(ops.len())];
            }
            1 => {
                p.remove(rand(p.len()));
            }
            _ => p.truncate(rand(p.len())),
        }
        let mut handed = Vec::new();
        let mut each = |_: usize, t: Value| -> Result<Value, String> {
            handed.push(format!("{t:?}"));
            Ok(Value::None)
        };
        let streamed = unpickle_each(
            &p,
            "data.pkl",
            &mut |_| Err("no storages".into()),
            &mut |_| {},
            Some(Each {
                key: "trajectories",
                each: &mut each,
            }),
        );
        let Ok((v, _)) = streamed else { continue };
        streamed_ok += 1;
        let list = v.get("trajectories").and_then(Value::as_seq);
        let all_handed = list
            .is_some_and(|l| l.len() == handed.len() && l.iter().all(|x| matches!(x, Value::None)));
        if !all_handed {
            continue;
        }
        checked += 1;
        let whole = unpickle(&p, "data.pkl", &mut |_| Err("no storages".into()))
            .unwrap_or_else(|e| panic!("mutation {i}: streamed read succeeded, whole failed: {e}"));
        let want: Vec<String> = whole
            .get("trajectories")
            .and_then(Value::as_seq)
            .unwrap()
            .iter()
            .map(|t| format!("{t:?}"))
            .collect();
        assert_eq!(handed, want, "mutation {i}");
    }
    // Most mutations break the pickle; enough survive to test the property.
    assert!(
        checked >= 100,
        "only {checked} of {streamed_ok} streamed reads checked"
    );
}
