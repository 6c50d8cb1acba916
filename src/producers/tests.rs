//! The producer mappings on hand-built values: aliases, fallbacks and strictness.

use std::path::Path;
use std::sync::Arc;

use super::{nexrl_self_hosted, remote_api};
use crate::error::{Error, Position};
use crate::model::tokens::{tokens_hash, TokenSeq};
use crate::model::trajectory::TrajectorySummary;
use crate::value::{Ints, Packed, Value};

fn s(x: &str) -> Value {
    Value::Str(x.into())
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn ints(xs: &[i64]) -> Value {
    Value::List(xs.iter().map(|&x| Value::Int(x)).collect())
}

fn packed(xs: &[i64]) -> Value {
    let mut p = Ints::default();
    p.extend_from_i64(xs);
    Value::Packed(Arc::new(Packed::Ints(p)))
}

fn file() -> &'static Path {
    Path::new("t/trajectory/step_000000.pt")
}

#[test]
fn trajectories_read_rewards_groups_and_advantages_with_their_fallbacks() {
    let v = dict(vec![(
        "trajectories",
        Value::List(vec![
            dict(vec![
                ("tokens", packed(&[5, 6, 7, 8])),
                ("loss_mask", ints(&[0, 0, 1, 1])),
                ("reward", Value::Float(1.0)),
                ("advantages", Value::List(vec![Value::Float(0.5)])),
                (
                    "extra_fields",
                    dict(vec![("group_id", s("g0")), ("run_id", Value::Int(3))]),
                ),
                ("is_val", Value::Bool(true)),
            ]),
            dict(vec![
                ("tokens", ints(&[9])),
                ("extra_fields", dict(vec![("score", Value::Float(0.25))])),
                ("uid", Value::Int(7)),
            ]),
        ]),
    )]);
    let b = nexrl_self_hosted::trajectories(file(), &v).unwrap();
    assert_eq!(b.rows.len(), 2);
    let (t0, t1) = (&b.rows[0], &b.rows[1]);
    assert!(
        matches!(t0.tokens, Some(TokenSeq::Packed(_))),
        "read in place"
    );
    assert_eq!(t0.tokens.as_ref().unwrap().to_vec(), vec![5, 6, 7, 8]);
    assert_eq!(
        t0.tokens.as_ref().unwrap().hash(),
        tokens_hash(&[5, 6, 7, 8])
    );
    assert_eq!(t0.response_hash(), Some(tokens_hash(&[7, 8])));
    assert_eq!((t0.reward, t0.advantage), (Some(1.0), Some(0.5)));
    assert_eq!(t0.group.as_deref(), Some("g0"));
    assert_eq!(t0.ids.run_id.as_deref(), Some("3"));
    assert_eq!(t0.is_val, Some(true));
    // `reward` absent: `extra_fields.score`; the group from a top-level `uid`.
    assert_eq!((t1.reward, t1.advantage), (Some(0.25), None));
    assert_eq!(t1.group.as_deref(), Some("7"));
    assert_eq!(t1.ids.group_id, None);
    assert_eq!(t1.response_hash(), None);
    let sum = TrajectorySummary::of(&b);
    assert_eq!(sum.rows[1].tokens, Some(tokens_hash(&[9])));
    assert_eq!(sum.rows[1].reward, Some(0.25));
}

#[test]
fn batch_advantages_come_before_each_trajectorys_own() {
    let v = dict(vec![
        (
            "trajectories",
            Value::List(vec![
                dict(vec![("advantages", Value::List(vec![Value::Float(9.0)]))]),
                dict(vec![("advantages", Value::List(vec![Value::Float(8.0)]))]),
            ]),
        ),
        ("advantages", Value::List(vec![Value::Float(-1.5)])),
    ]);
    let b = nexrl_self_hosted::trajectories(file(), &v).unwrap();
    assert_eq!(b.batch_advantages, Some(vec![-1.5]));
    // Row 0 from the batch list; row 1 is past its end, so its own list.
    assert_eq!(b.rows[0].advantage, Some(-1.5));
    assert_eq!(b.rows[1].advantage, Some(8.0));
}

#[test]
fn an_unreadable_field_is_a_format_error_naming_file_and_key() {
    let v = dict(vec![(
        "trajectories",
        Value::List(vec![
            dict(vec![("tokens", ints(&[1]))]),
            dict(vec![("tokens", s("not ids"))]),
        ]),
    )]);
    match nexrl_self_hosted::trajectories(file(), &v) {
        Err(Error::Format { path, pos, msg }) => {
            assert_eq!(path, file());
            assert_eq!(pos, Position::Key("trajectories[1].tokens".into()));
            assert_eq!(msg, "expected a list of ints, found str");
        }
        other => panic!("{other:?}"),
    }
    let v = dict(vec![(
        "trajectories",
        Value::List(vec![dict(vec![("reward", s("high"))])]),
    )]);
    let e = nexrl_self_hosted::trajectories(file(), &v).unwrap_err();
    assert!(
        matches!(&e, Error::Format { pos: Position::Key(k), .. } if k == "trajectories[0].reward"),
        "{e:?}"
    );
    // Absent (or Python None) is not an error: the model says None.
    let v = dict(vec![(
        "trajectories",
        Value::List(vec![dict(vec![("reward", Value::None)])]),
    )]);
    let b = nexrl_self_hosted::trajectories(file(), &v).unwrap();
    assert_eq!((b.rows[0].reward, b.rows[0].tokens.is_none()), (None, true));
    // No list at all.
    let e = nexrl_self_hosted::trajectories(file(), &dict(vec![])).unwrap_err();
    assert!(
        matches!(&e, Error::Format { pos: Position::Key(k), msg, .. }
            if k == "trajectories" && msg == "missing: no such key"),
        "{e:?}"
    );
}

#[test]
fn datums_rebuild_the_sequence_across_the_shift() {
    let v = dict(vec![(
        "datums",
        Value::List(vec![dict(vec![
            ("input_tokens", ints(&[1, 2, 3])),
            (
                "loss_fn_inputs",
                dict(vec![
                    ("target_tokens", ints(&[2, 3, 4])),
                    (
                        "loss_mask",
                        Value::List(vec![
                            Value::Float(0.0),
                            Value::Float(1.0),
                            Value::Float(1.0),
                        ]),
                    ),
                    (
                        "advantages",
                        Value::List(vec![
                            Value::Float(0.0),
                            Value::Float(0.7),
                            Value::Float(0.7),
                        ]),
                    ),
                ]),
            ),
        ])]),
    )]);
    let d = remote_api::datums(Path::new("d.pt"), &v).unwrap();
    assert_eq!(d.rows[0].tokens(), Some(vec![1, 2, 3, 4]));
    assert_eq!(d.rows[0].first_masked_advantage(), Some(0.7));
    assert_eq!(d.rows[0].logprobs, None);
    let bad = dict(vec![(
        "datums",
        Value::List(vec![dict(vec![(
            "loss_fn_inputs",
            dict(vec![("logprobs", s("x"))]),
        )])]),
    )]);
    let e = remote_api::datums(Path::new("d.pt"), &bad).unwrap_err();
    assert!(
        matches!(&e, Error::Format { pos: Position::Key(k), .. } if k == "datums[0].loss_fn_inputs.logprobs"),
        "{e:?}"
    );
}

#[test]
fn loss_records_read_terms_kl_metrics_and_coefficients() {
    let v = dict(vec![
        ("loss", Value::Float(-0.25)),
        ("pg_loss", Value::Float(-0.2)),
        ("entropy_loss", Value::Float(500.0)),
        (
            "metrics",
            dict(vec![
                ("approx_kl", Value::Float(0.01)),
                ("num_tokens", Value::Int(47)),
                ("note", s("free-form")),
            ]),
        ),
        (
            "extra_info",
            dict(vec![("entropy_coeff", Value::Float(1e-4))]),
        ),
    ]);
    let r = nexrl_self_hosted::loss_record(Path::new("l.pt"), &v).unwrap();
    assert_eq!(
        (r.loss, r.pg_loss, r.entropy_loss),
        (Some(-0.25), Some(-0.2), Some(500.0))
    );
    assert_eq!(r.kl.get("approx_kl"), Some(&0.01));
    assert_eq!(r.metrics.get("num_tokens"), Some(&47.0));
    assert!(!r.metrics.contains_key("note"));
    assert_eq!(r.coefficients.get("entropy_coeff"), Some(&1e-4));
    let bad = dict(vec![(
        "extra_info",
        dict(vec![("entropy_coeff", s("1e-4"))]),
    )]);
    let e = nexrl_self_hosted::loss_record(Path::new("l.pt"), &bad).unwrap_err();
    assert!(
        matches!(&e, Error::Format { pos: Position::Key(k), .. } if k == "extra_info.entropy_coeff"),
        "{e:?}"
    );
}

#[test]
fn loose_inputs_take_the_first_mask_alias_and_drop_the_in_prefix() {
    use super::loose_tensors;
    use crate::model::step::LogProbSource;
    let row = |x: f64| Value::List(vec![Value::List(vec![Value::Float(x), Value::Float(x)])]);
    let v = dict(vec![
        ("in.log_probs", row(-1.0)),
        ("in.loss_mask", row(1.0)),
        ("in.effective_valid", row(0.0)),
        ("out.loss", Value::Float(3.0)),
    ]);
    let li = loose_tensors::inputs(Path::new("k.safetensors"), &v).unwrap();
    assert_eq!(li.mask_key, Some("loss_mask"));
    let mask = li.batch.loss_mask.as_ref().unwrap();
    assert_eq!(mask.tensor.to_f64_vec(), vec![1.0, 1.0]);
    assert_eq!(mask.source.key, "loss_mask");
    assert_eq!(mask.dtype, None, "a list has no stored dtype");
    let lp = li.batch.log_probs(LogProbSource::Current).unwrap();
    assert_eq!(lp.tensor.shape(), &[1, 2]);
    assert!(li.batch.log_probs(LogProbSource::Old).is_none());
    assert!(li.rewards.is_none());
    let bad = dict(vec![("log_probs", s("x"))]);
    let e = loose_tensors::inputs(Path::new("k.pt"), &bad).unwrap_err();
    assert!(
        matches!(&e, Error::Format { pos: Position::Key(k), .. } if k == "log_probs"),
        "{e:?}"
    );
}
