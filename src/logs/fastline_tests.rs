//! Tests of [`super`] (the JSON-line fast path), kept apart so that fastline.rs stays under
//! the project's 800-line limit.

use super::*;

fn keys_of(b: &Batch, r: &FastRec) -> Vec<(String, f64)> {
    b.fields[r.fields.0 as usize..r.fields.1 as usize]
        .iter()
        .map(|&(k, v)| (b.keys.name(k).to_string(), v))
        .collect()
}

#[test]
fn one_batch_with_changing_key_order_keeps_names_right() {
    let mut sc = Scratch::default();
    let mut b = Batch::default();
    let lines = [
        r#"{"step": 1, "a": 1, "b": 2, "metrics": {"c": 3}}"#,
        r#"{"step": 2, "b": 4, "a": 5, "metrics": {"c": 6}}"#,
        r#"{"step": 3, "metrics": {"c": 7}, "z": 8}"#,
    ];
    let recs: Vec<FastRec> = lines
        .iter()
        .map(|l| parse_line(l.as_bytes(), &mut sc, &mut b).unwrap())
        .collect();
    let f = |x: &[(&str, f64)]| -> Vec<(String, f64)> {
        x.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    assert_eq!(
        keys_of(&b, &recs[0]),
        f(&[("a", 1.0), ("b", 2.0), ("metrics.c", 3.0)])
    );
    assert_eq!(
        keys_of(&b, &recs[1]),
        f(&[("b", 4.0), ("a", 5.0), ("metrics.c", 6.0)])
    );
    assert_eq!(keys_of(&b, &recs[2]), f(&[("metrics.c", 7.0), ("z", 8.0)]));
    assert_eq!(b.keys.names().len(), 4);
    assert_eq!(recs[2].step, Some(3));
}

#[test]
fn special_slot_is_the_position_in_special() {
    for (i, k) in SPECIAL.iter().enumerate() {
        assert_eq!(special_slot(k), Some(i), "{k}");
    }
    for k in ["", "steps", "Step", "data.step", "metrics", "time"] {
        assert_eq!(special_slot(k), None, "{k}");
    }
}

#[test]
fn floats_match_the_standard_parser_bit_for_bit() {
    let texts = [
        "0.08599796663725433",
        "0.47851442274776057",
        "1e-05",
        "1759944000.0",
        "2.2250738585072011e-308",
        "4.9e-324",
        "1.7976931348623157e308",
        "-0.0",
        "123456789012345678901234567890.5",
        "0.1000000000000000055511151231257827",
    ];
    for t in texts {
        let line = format!("{{\"step\": 1, \"x\": {t}}}");
        let (rec, _) = fast_record(&line, 0, 1).unwrap();
        let want: f64 = t.parse().unwrap();
        assert_eq!(rec.fields[0].1.to_bits(), want.to_bits(), "{t}");
    }
    // What JSON refuses goes to the general path, in objects and in lists.
    for t in ["1.", "1.e5", "1e", "1e+", "-", "01", ".5", "+1", "1.5e"] {
        for line in [
            format!("{{\"step\": 1, \"x\": {t}}}"),
            format!("{{\"step\": 1, \"x\": [{t}]}}"),
            format!("{{\"step\": 1, \"x\": {t}, \"y\": 2}}"),
        ] {
            assert!(fast_record(&line, 0, 1).is_none(), "{line}");
        }
    }
    let (rec, _) = fast_record(r#"{"step": 1, "x": 1.5E+3, "y": -2e-2}"#, 0, 1).unwrap();
    assert_eq!(rec.fields, vec![("x".into(), 1500.0), ("y".into(), -0.02)]);
}

#[test]
fn declined_line_adds_nothing() {
    let mut sc = Scratch::default();
    let mut b = Batch::default();
    assert!(parse_line(br#"{"step": 1, "a": 1, "b": "x\"y"}"#, &mut sc, &mut b).is_none());
    assert!(parse_line(b"{\"step\": 1, \"a\": \xff}", &mut sc, &mut b).is_none());
    assert!(parse_line(b"{\"step\": 1, \"a\": \"\xff\"}", &mut sc, &mut b).is_none());
    assert!(b.fields.is_empty() && b.types.is_empty());
}

/// A line read through the previous line's shape yields exactly what a fresh full scan
/// yields (or both decline it), whatever changed between the lines.
#[test]
fn replayed_shapes_read_like_the_full_scan() {
    let lines = [
        r#"{"step": 1, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": [1, 2]}, "timestamp": 10.0}"#,
        r#"{"step": 2, "train_loss": 0.25, "metrics": {"kl": 0.2, "r": []}, "timestamp": 11}"#,
        r#"{"step": 3, "train_loss": "nan", "metrics": {"kl": null, "r": true}, "timestamp": 12.5}"#,
        r#"{"step": "4/10", "train_loss": NaN, "metrics": {"kl": -0, "r": "x"}, "timestamp": false}"#,
        r#"{"step": 5, "train_loss": 1e400, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1}"#,
        r#"{"step": 6, "train_loss": 12345678901234567890, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1}"#,
        r#"{"step": 7, "train_loss": "a\"b", "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1}"#,
        r#"{"step": 8, "train_loss": {"x": 1}, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1}"#,
        r#"{"step": 9, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1} x"#,
        r#"{"step": 10, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1"#,
        r#"{"step": 11,  "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1}"#,
        r#"{"step": 12, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1, "step": 3}"#,
        r#"{"step": 13, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1}"#,
        r#"{"step": 14, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1.}"#,
        r#"{"step": 15, "train_loss": 0.5, "metrics": {"kl": 0.1, "r": 1}, "timestamp": 1e}"#,
        r#"{"step": 1, "data": {"actor/kl": 0.1, "timestamp": 5.0, "x": null}}"#,
        r#"{"step": 2, "data": {"actor/kl": 0.2, "timestamp": "t", "x": 3}}"#,
        r#"{"step": 3, "data": {"actor/kl": 0.3, "timestamp": {"a": 1}, "x": 3}}"#,
        r#"{"step": 4, "data": {"actor/kl": 0.3, "timestamp": 7, "x": 3}}"#,
        r#"{"iteration": 1, "lr": 0.1}"#,
        r#"{"iteration": 2.0, "lr": 0.2}"#,
        r#"{"iteration": 2.5, "lr": 0.2}"#,
        r#"{"event": 1, "lr": 0.2}"#,
        r#"{}"#,
        r#"{}"#,
        r#"{"a": {}, "b": 1}"#,
        r#"{"a": {}, "b": 2}"#,
    ];
    let view = |b: &Batch, r: &FastRec| {
        let types: Vec<(String, &str)> = b.types[r.types.0 as usize..r.types.1 as usize]
            .iter()
            .map(|&(k, t)| (b.keys.name(k).to_string(), t))
            .collect();
        let fields: Vec<(String, u64)> = b.fields[r.fields.0 as usize..r.fields.1 as usize]
            .iter()
            .map(|&(k, v)| (b.keys.name(k).to_string(), v.to_bits()))
            .collect();
        (
            r.step,
            r.timestamp.map(f64::to_bits),
            r.source,
            r.nulls,
            r.non_finite,
            fields,
            types,
        )
    };
    let mut shared = Scratch::default();
    let mut batch = Batch::default();
    let mut replayed = 0;
    for (i, l) in lines.iter().enumerate() {
        let had_shape = shape::replay(l, &mut shared);
        let got = parse_line(l.as_bytes(), &mut shared, &mut batch).map(|r| view(&batch, &r));
        let mut b = Batch::default();
        let want = parse_line(l.as_bytes(), &mut Scratch::default(), &mut b).map(|r| view(&b, &r));
        assert_eq!(got, want, "line {i}: {l}");
        replayed += (had_shape && got.is_some()) as usize;
    }
    // The shape did the reading on the lines that repeat the previous line's layout.
    // Lines 1, 2, 3, 16, 20, 21, 24, 26 (counted by hand: each repeats the layout of the
    // last line the full scan accepted and is itself accepted).
    assert_eq!(replayed, 8);
}
