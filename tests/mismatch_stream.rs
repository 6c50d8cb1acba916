//! mismatch read cell by cell (`StepReader::open_step` + `analyse_cells`) against the
//! whole step in memory (`read_step` + `analyse`): the same report, every value to 1e-12,
//! on a multi-rank NexRL weaver tree (12 ranks × 2 micros, old and current log-probs,
//! advantages: every section, the what-if loss included).

use std::path::Path;

use rlforensics::mismatch::{analyse, analyse_cells, Options};
use rlforensics::model::step::LogProbSource;
use serde_json::Value as J;

/// Every number of `a` equals the one at the same place of `b` to 1e-12 (relative above
/// 1), every other leaf equal, the same keys and lengths.
fn same(at: &str, a: &J, b: &J) {
    match (a, b) {
        (J::Number(x), J::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-12 * y.abs().max(1.0),
                "{at}: {x} vs {y}"
            );
        }
        (J::Array(x), J::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: lengths");
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                same(&format!("{at}[{i}]"), p, q);
            }
        }
        (J::Object(x), J::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}: keys"
            );
            for (k, p) in x {
                same(&format!("{at}.{k}"), p, &y[k]);
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[test]
fn the_per_cell_read_gives_the_whole_step_report() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dumps/weaver_pt");
    let reader = rlforensics::producers::step_reader_for(&dir).unwrap();
    assert_eq!(reader.name(), "nexrl-weaver");
    let opts = Options {
        pair: (LogProbSource::Old, LogProbSource::Current),
        keep_tokens: true,
        ..Options::default()
    };
    let whole = analyse(&reader.read_step(&dir, 0).unwrap(), &opts).unwrap();
    let cells = reader.open_step(&dir, 0).unwrap();
    assert_eq!(cells.keys().len(), 24, "12 ranks × 2 micros, read lazily");
    let streamed = analyse_cells(cells.as_ref(), &opts).unwrap();
    // Not vacuous: tokens on every cell, the loss on every cell, a non-zero mismatch.
    assert_eq!(whole.coverage.cells, 24);
    assert_eq!(whole.coverage.loss_cells, 24);
    assert_eq!(whole.coverage.tokens, 701);
    assert!(whole.metric("rollout_corr/k3_kl").unwrap() > 0.0);
    assert_eq!(whole.whatif.len(), opts.corrections.len());
    same(
        "report",
        &serde_json::to_value(&streamed).unwrap(),
        &serde_json::to_value(&whole).unwrap(),
    );
    assert_eq!(streamed.token_table, whole.token_table);
    assert_eq!(
        streamed.seq_table.as_ref().map(|s| s.len()),
        whole.seq_table.as_ref().map(|s| s.len())
    );
}

#[test]
fn a_cell_read_lazily_without_a_role_is_named_as_in_the_whole_step() {
    // The weaver tree holds old and current, not the engine's: the same exit-2 message
    // from either path.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dumps/weaver_pt");
    let reader = rlforensics::producers::step_reader_for(&dir).unwrap();
    let opts = Options::default();
    let whole = analyse(&reader.read_step(&dir, 0).unwrap(), &opts).unwrap_err();
    let cells = reader.open_step(&dir, 0).unwrap();
    let streamed = analyse_cells(cells.as_ref(), &opts).unwrap_err();
    assert_eq!(streamed.to_string(), whole.to_string());
    assert!(
        whole
            .to_string()
            .contains("holds the log-prob roles [old, current] in every cell"),
        "{whole}"
    );
}
