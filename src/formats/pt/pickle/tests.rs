//! Unit tests of the unpickler on hand-made and CPython-written pickles.

use super::*;
use crate::value::{Ints, Packed};

fn no_storage(_: &StorageRequest<'_>) -> Result<Bytes, String> {
    Err("no storages here".into())
}

fn run(p: &[u8]) -> Result<Value, FormatError> {
    unpickle(p, "t/data.pkl", &mut no_storage)
}

#[test]
fn long1_negative_and_huge_ints_match_python() {
    // pickle.dumps(-2**70, 2), pickle.dumps(2**64, 2), pickle.dumps(-2**63 - 1, 2)
    let v = run(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0.").unwrap();
    assert!(matches!(v, Value::BigInt(ref s) if s == "-1180591620717411303424"));
    let v = run(b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.").unwrap();
    assert!(matches!(v, Value::BigInt(ref s) if s == "18446744073709551616"));
    let v = run(b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff.").unwrap();
    assert!(matches!(v, Value::BigInt(ref s) if s == "-9223372036854775809"));
    // pickle.dumps(-2**63, 2): fits i64.
    let v = run(b"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.").unwrap();
    assert!(matches!(v, Value::Int(i64::MIN)));
}

#[test]
fn protocol0_text_opcodes() {
    // pickle.dumps([1, 2**70, 'h\xe9', 1.5, (True,)], 0)
    let p = b"(lp0\nI1\naL1180591620717411303424L\naVh\xe9\np1\naF1.5\na(I01\ntp2\na.";
    let v = run(p).unwrap();
    let items = v.as_seq().unwrap();
    assert!(matches!(items[0], Value::Int(1)));
    assert!(matches!(&items[1], Value::BigInt(s) if s == "1180591620717411303424"));
    assert!(matches!(&items[2], Value::Str(s) if s == "h\u{e9}"));
    assert!(matches!(items[3], Value::Float(f) if f == 1.5));
    assert!(matches!(&items[4], Value::Tuple(t) if matches!(t[0], Value::Bool(true))));
}

#[test]
fn memo_shares_mutations_like_python() {
    // d = {}; pickle.dumps([d, d], 2) with d filled after being memoised:
    // ] q0 ( } q1 h1 e h1 U a K1 s .  → [ {'a':1}, {'a':1} ] sharing one dict.
    let p = b"\x80\x02]q\x00(}q\x01h\x01eh\x01U\x01aK\x01s0.";
    let v = run(p).unwrap();
    let items = v.as_seq().unwrap();
    assert_eq!(items.len(), 2);
    for d in items {
        assert!(matches!(d.get("a"), Some(Value::Int(1))));
    }
}

#[test]
fn repeated_dict_key_replaces_in_place() {
    // { 'a': 1, 'b': 2, 'a': 3 } written by hand with SETITEMS
    let p = b"\x80\x02}(U\x01aK\x01U\x01bK\x02U\x01aK\x03u.";
    let v = run(p).unwrap();
    let d = v.as_dict().unwrap();
    assert_eq!(d.len(), 2);
    assert!(matches!(d[0], (Value::Str(ref k), Value::Int(3)) if k == "a"));
}

#[test]
fn cyclic_list_is_refused_not_looped() {
    // l = []; l.append(l): ] q0 h0 a .
    let e = run(b"\x80\x02]q\x00h\x00a.").unwrap_err();
    assert!(e.msg.contains("deeper than 512"), "{e}");
}

#[test]
fn refused_opcodes_name_themselves() {
    let e = run(b"\x80\x02(cos\nsystem\no.").unwrap_err();
    assert!(e.msg.contains("os.system"), "{e}");
    let e = run(b"Pfoo\n.").unwrap_err();
    assert!(
        e.msg.contains("persistent id must be a tuple, found str"),
        "{e}"
    );
    let e = run(b"\x80\x02\x82\x01.").unwrap_err();
    assert!(e.msg.contains("EXT1"), "{e}");
    assert_eq!(
        e.pos,
        Position::PickleOp {
            member: "t/data.pkl".into(),
            offset: 2
        }
    );
}

#[test]
fn truncated_pickles_fail_cleanly() {
    let p = b"\x80\x02}q\x00(X\x05\x00\x00\x00abcdeK\x01u.";
    for n in 0..p.len() {
        assert!(run(&p[..n]).is_err(), "prefix {n}");
    }
    assert!(run(p).is_ok());
}

#[test]
fn sets_bytes_and_text_forms_from_python_pickle() {
    // Each pickle is pickle.dumps(obj, proto) from CPython 3.
    let cases: &[(&[u8], &str)] = &[
        (b"\x80\x04\x95\t\x00\x00\x00\x00\x00\x00\x00\x8f\x94(K\x01K\x02\x90.", "List([Int(1), Int(2)])"),
        (b"\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00(K\x03\x91\x94.", "List([Int(3)])"),
        (b"\x80\x05\x95\r\x00\x00\x00\x00\x00\x00\x00\x96\x02\x00\x00\x00\x00\x00\x00\x00ab\x94.", "Bytes([97, 98])"),
        (b"\x80\x03C\x02abq\x00.", "Bytes([97, 98])"),
        (b"\x80\x02c__builtin__\nset\nq\x00]q\x01(K\x01K\x02e\x85q\x02Rq\x03.", "List([Int(1), Int(2)])"),
        (b"\x80\x02c__builtin__\nbytearray\nq\x00c_codecs\nencode\nq\x01X\x02\x00\x00\x00abq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05\x85q\x06Rq\x07.", "Bytes([97, 98])"),
        (b"\x80\x02c__builtin__\nbytes\nq\x00)Rq\x01.", "Bytes([])"),
        (b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.", "Dict([])"),
        (b"F1.5\n.", "Float(1.5)"),
        (b"Va\\u000ab\\u20ac\np0\n.", "Str(\"a\\nb\u{20ac}\")"),
        (b"L-1180591620717411303424L\n.", "BigInt(\"-1180591620717411303424\")"),
        (b"c_codecs\nencode\np0\n(Vx'\\u000a\np1\nVlatin1\np2\ntp3\nRp4\n.", "Bytes([120, 39, 10])"),
        // Hand-made: BUILD with an empty state on an OrderedDict is a no-op.
        (b"\x80\x02ccollections\nOrderedDict\n)R}b.", "Dict([])"),
    ];
    for (p, want) in cases {
        let v = run(p).unwrap_or_else(|e| panic!("{want}: {e}"));
        assert_eq!(format!("{v:?}"), *want);
    }
}

#[test]
fn memo_bomb_is_refused_by_the_budget() {
    // x = 1; then 200 times x = (x, x): 2**200 leaves if copied out.
    let mut p = b"\x80\x02K\x01".to_vec();
    for _ in 0..200 {
        p.extend_from_slice(b"2\x86");
    }
    p.push(b'.');
    let e = run(&p).unwrap_err();
    assert!(e.msg.contains("expands to too many objects"), "{e}");
}

#[test]
fn what_torchs_safe_loader_refuses_is_refused_by_name() {
    // BUILD with attributes on a plain dict (torch allows it on OrderedDict only).
    let e = run(b"\x80\x02}}U\x01aK\x01sb.").unwrap_err();
    assert!(
        e.msg.contains("BUILD with a non-empty state on a dict"),
        "{e}"
    );
    // The same state on an OrderedDict is its attributes: accepted, not items.
    let v = run(b"\x80\x02ccollections\nOrderedDict\n)R}U\x09_metadataK\x01sb.").unwrap();
    assert_eq!(format!("{v:?}"), "Dict([])");
    // `torch.float` is an alias torch's allow-list does not name (it names torch.float32).
    let e = run(b"\x80\x02ctorch\nfloat\n.").unwrap_err();
    assert!(e.msg.contains("refused global torch.float:"), "{e}");
    // _rebuild_from_type_v2 may only make torch.Tensor / Parameter.
    let e = run(
        b"\x80\x02ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n_rebuild_tensor_v2\n\
          ccollections\nOrderedDict\n)}tR.",
    )
    .unwrap_err();
    assert!(
        e.msg.contains("only torch.Tensor and torch.nn.Parameter"),
        "{e}"
    );
    // complex('1+2j') from a string is not the (re, im) form torch writes.
    let e = run(b"\x80\x02c__builtin__\ncomplex\nX\x04\x00\x00\x001+2j\x85R.").unwrap_err();
    assert!(
        e.msg.contains("builtins.complex") || e.msg.contains("complex"),
        "{e}"
    );
    // dtype and device objects read as their names.
    let v = run(b"\x80\x02(ctorch\nfloat8_e5m2\nctorch\ndevice\nX\x04\x00\x00\x00cudaK\x02\x86Rl.")
        .unwrap();
    assert_eq!(
        format!("{v:?}"),
        "List([Str(\"torch.float8_e5m2\"), Str(\"cuda:2\")])"
    );
    assert_eq!(
        e.pos,
        Position::PickleOp {
            member: "t/data.pkl".into(),
            offset: 33
        }
    );
}

/// A protocol-2 pickle of the list `xs` as CPython's pickler writes it (`EMPTY_LIST`,
/// `MARK … APPENDS` batches of 1,000, each int as the shortest of BININT1 / BININT2 /
/// BININT), written here from the opcode table rather than by the code under test.
fn pickled_int_list(xs: &[i64]) -> Vec<u8> {
    let mut p = vec![0x80, 2, b']'];
    for batch in xs.chunks(1000) {
        p.push(b'(');
        for &x in batch {
            match x {
                0..=0xff => p.extend([b'K', x as u8]),
                0x100..=0xffff => {
                    p.push(b'M');
                    p.extend((x as u16).to_le_bytes());
                }
                _ => {
                    p.push(b'J');
                    p.extend((x as i32).to_le_bytes());
                }
            }
        }
        p.push(b'e');
    }
    p.push(b'.');
    p
}

/// Ints whose opcodes mix at random, come in runs of one opcode shorter and longer than
/// four, and end a batch or the pickle with fewer than 5 bytes left: every one decoded,
/// in order, and packed in the narrowest storage that holds them all.
#[test]
fn binary_int_opcodes_decode_in_runs_and_mixed() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for n in [1usize, 3, 4, 5, 7, 8, 9, 999, 1000, 1001, 2500] {
        for kind in 0..5 {
            let xs: Vec<i64> = (0..n)
                .map(|i| {
                    let r = rand();
                    match kind {
                        0 => (r % 2) as i64,                                     // a mask: BININT1 runs
                        1 => 256 + (r % 60_000) as i64,                          // BININT2 runs
                        2 => [7, 300, 70_000, -5][(r % 4) as usize],             // all three, mixed
                        3 => [1, 2, 3][i % 3] * if i % 9 < 4 { 1 } else { 500 }, // short runs
                        _ => -((r % 100_000) as i64) - 1,                        // BININT, negative
                    }
                })
                .collect();
            let v = run(&pickled_int_list(&xs)).unwrap();
            let Some(Packed::Ints(ints)) = v.as_packed() else {
                panic!("n {n} kind {kind}: {v:?}");
            };
            assert_eq!(ints.to_vec(), xs, "n {n} kind {kind}");
            let (lo, hi) = (*xs.iter().min().unwrap(), *xs.iter().max().unwrap());
            let want = if lo >= 0 && hi <= 0xff {
                "u8"
            } else if lo >= 0 && hi <= 0xffff {
                "u16"
            } else {
                "i32"
            };
            let got = match ints {
                Ints::U8(_) => "u8",
                Ints::U16(_) => "u16",
                Ints::I32(_) => "i32",
                Ints::I64(_) => "i64",
            };
            assert_eq!(got, want, "n {n} kind {kind}");
        }
    }
}

/// Protocol 4 frames its pickle every ~64 KB: a FRAME opcode (and its 8-byte length) can
/// fall between two ints of a batch. The batch is still packed, with every int.
#[test]
fn a_frame_inside_a_batch_keeps_the_list_packed() {
    let xs: Vec<i64> = (0..2500).map(|i| (i * 37) % 70_000).collect();
    let plain = pickled_int_list(&xs);
    // After the protocol header and EMPTY_LIST, MARK: ints start at offset 4. Put a FRAME
    // before the 700th int's opcode, found by walking the opcodes' lengths.
    let mut at = 4;
    for &x in &xs[..700] {
        at += match x {
            0..=0xff => 2,
            0x100..=0xffff => 3,
            _ => 5,
        };
    }
    let frame = |at: usize| {
        let mut p = plain[..at].to_vec();
        p.push(0x95);
        p.extend(((plain.len() - at) as u64).to_le_bytes());
        p.extend(&plain[at..]);
        p
    };
    // Inside the batch, and first thing after its MARK.
    for p in [plain.clone(), frame(at), frame(4)] {
        let v = run(&p).unwrap();
        let Some(Packed::Ints(ints)) = v.as_packed() else {
            panic!("not packed: a {}", v.type_name());
        };
        assert_eq!(ints.to_vec(), xs);
    }
}

/// A list of Python bools (protocol 2: NEWTRUE / NEWFALSE, batches of 1,000, here with a
/// FRAME in a batch): one packed array of every bool, in order.
#[test]
fn bool_lists_are_packed_whole() {
    let xs: Vec<bool> = (0..2500).map(|i| (i * 7919) % 3 == 0).collect();
    let mut p = vec![0x80, 2, b']'];
    for (n, batch) in xs.chunks(1000).enumerate() {
        p.push(b'(');
        for (i, &b) in batch.iter().enumerate() {
            if n == 1 && i == 500 {
                p.push(0x95);
                p.extend(1000u64.to_le_bytes());
            }
            p.push(if b { 0x88 } else { 0x89 });
        }
        p.push(b'e');
    }
    p.push(b'.');
    let v = run(&p).unwrap();
    assert_eq!(v.as_packed(), Some(&Packed::Bools(xs)));
}
