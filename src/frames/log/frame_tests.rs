//! Tests of [`super`] (the frame builder), kept apart so that frame.rs stays under the
//! project's 800-line limit.

use super::*;

fn rec(step: i64, fields: &[(&str, f64)]) -> LogRecord {
    LogRecord {
        step: Some(step),
        timestamp: Some(1000.0 + step as f64),
        source: SourceKind::Steps,
        file: 0,
        line: 1,
        fields: fields.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

fn builder() -> FrameBuilder {
    FrameBuilder::new(AliasTable::builtin().unwrap(), false)
}

#[test]
fn nan_is_a_value_and_missing_is_not_in_step_order_after_a_merge() {
    let mut b = builder();
    // Steps arrive descending, then an earlier step is merged into: rows get sorted.
    for s in (0..3 * BLOCK_ROWS as i64).rev() {
        let loss = if s % 3 == 0 { f64::NAN } else { s as f64 };
        if s % 5 == 0 {
            b.push(&rec(s, &[("train_loss", loss)]));
        } else {
            b.push(&rec(s, &[("train_loss", loss), ("grad_norm", 0.5)]));
        }
    }
    b.push(&rec(7, &[("grad_norm", 9.0), ("kl", f64::NAN)]));
    let f = b.finish();
    assert_eq!(f.len(), 3 * BLOCK_ROWS);
    assert_eq!(f.steps().first(), Some(0));
    assert_eq!(f.steps().last(), Some(3 * BLOCK_ROWS as i64 - 1));
    for i in 0..f.len() {
        let s = i as i64;
        assert_eq!(f.step(i), s);
        let loss = f.at("loss", i).unwrap();
        assert_eq!(loss.is_nan(), s % 3 == 0, "row {i}");
        let g = f.at("grad_norm", i);
        assert_eq!(g, if s % 5 == 0 { None } else { Some(0.5) }, "row {i}");
    }
    // First value wins; a NaN is present, other rows have no kl at all.
    assert_eq!(f.at("grad_norm", 7), Some(0.5));
    assert!(f.at("kl", 7).is_some_and(f64::is_nan));
    assert_eq!(f.at("kl", 8), None);
    assert_eq!(f.col("kl").map(|c| c.present().count()), Some(1));
    assert_eq!(f.timestamps().get(10), Some(1010.0));
}

#[test]
fn projection_keeps_named_metrics_and_lists_all() {
    let projection = Projection::Only {
        metrics: vec!["loss".to_string(), "val_loss".to_string()],
        timestamps: false,
    };
    let mut b = builder().with_projection(projection.clone());
    for s in 0..10 {
        b.push(&rec(
            s,
            &[("train_loss", 0.1), ("lr", 1e-5), ("grad_norm", 1.0)],
        ));
    }
    let f = b.finish();
    assert_eq!(f.metrics(), ["loss", "grad_norm", "lr"]);
    assert_eq!(f.projection(), &projection);
    assert_eq!(f.series("loss").len(), 10);
    assert_eq!(f.col("val_loss").map(Column::len), None);
    assert!(f.columns.iter().all(|(n, _)| n == "loss"));
    assert!(f.timestamps.present().next().is_none());
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "read but not kept")]
fn reading_a_dropped_metric_is_caught_in_debug_builds() {
    let projection = Projection::Only {
        metrics: vec!["loss".to_string()],
        timestamps: false,
    };
    let mut b = builder().with_projection(projection);
    b.push(&rec(0, &[("train_loss", 0.1), ("grad_norm", 1.0)]));
    let _ = b.finish().col("grad_norm");
}

#[test]
fn constant_and_counting_columns_cost_no_values() {
    let mut b = builder();
    let rows = 4 * BLOCK_ROWS;
    for s in 0..rows as i64 {
        let noisy = ((s * 7919) % 1000) as f64 / 997.0;
        b.push(&rec(
            s,
            &[
                ("train_loss", noisy),
                ("lr", 1e-5),
                ("trained_tokens", 1000.0 * s as f64),
            ],
        ));
    }
    let f = b.finish();
    // One dense column (8 bytes a row), everything else (steps, timestamps, lr,
    // trained_tokens) a line per block; sources 4 bytes a row.
    let dense = rows * 8 + rows * 4;
    assert!(f.heap_bytes() >= dense);
    assert!(f.heap_bytes() < dense + 4096, "{}", f.heap_bytes());
    assert_eq!(
        f.at("trained_tokens", rows - 1),
        Some(1000.0 * (rows - 1) as f64)
    );
    assert_eq!(f.at("lr", 5), Some(1e-5));
}
