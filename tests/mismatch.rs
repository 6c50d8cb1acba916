//! mismatch: producer metrics against independent float64 values and verl's own functions
//! (`fixtures/mismatch/`, written by `fixtures/gen/make_mismatch.py`), the what-if
//! corrections against verl's weights and masks with the loss by torch autograd, the
//! attribution on planted-mismatch steps, the trend findings, bad input.

use std::path::{Path, PathBuf};

use rlforensics::mismatch::{self, analyse, whatif, Options};
use rlforensics::model::step::{Cell, LogProbSource, RowMeta, StepDump, TokenBatch, TokenTensor};
use rlforensics::model::trajectory::Provenance;
use rlforensics::{DType, Tensor};
use serde_json::Value as J;

fn fixture(name: &str) -> J {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/mismatch")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn matrix(v: &J) -> (Vec<usize>, Vec<f64>) {
    let rows = v.as_array().unwrap();
    let t = rows[0].as_array().unwrap().len();
    let flat: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap_or(f64::NAN))
        })
        .collect();
    (vec![rows.len(), t], flat)
}

fn tt(v: &J, key: &str) -> TokenTensor {
    let (shape, flat) = matrix(v);
    TokenTensor {
        tensor: Tensor::from_f64(shape, &flat).unwrap(),
        dtype: Some(DType::F64),
        source: Provenance {
            file: PathBuf::from("fixture"),
            key: key.into(),
        },
    }
}

fn ti(v: &J, key: &str) -> TokenTensor {
    let (shape, flat) = matrix(v);
    let ints: Vec<i64> = flat.iter().map(|x| *x as i64).collect();
    TokenTensor {
        tensor: Tensor::from_i64(shape, &ints).unwrap(),
        dtype: Some(DType::I64),
        source: Provenance {
            file: PathBuf::from("fixture"),
            key: key.into(),
        },
    }
}

/// A StepDump from a fixture's cells, as a producer's reader would build it.
fn step_of(cells: &J, step: i64) -> StepDump {
    let cells = cells
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let mut b = TokenBatch::default();
            b.log_probs
                .insert(LogProbSource::Rollout, tt(&c["rollout"], "rollout"));
            b.log_probs.insert(LogProbSource::Old, tt(&c["old"], "old"));
            if !c["current"].is_null() {
                b.log_probs
                    .insert(LogProbSource::Current, tt(&c["current"], "current"));
            }
            b.response_mask = Some(ti(&c["mask"], "mask"));
            if !c["response_ids"].is_null() {
                b.response_ids = Some(ti(&c["response_ids"], "responses"));
            }
            if !c["advantages"].is_null() {
                b.advantages = Some(tt(&c["advantages"], "advantages"));
            }
            if let Some(rows) = c["rows"].as_array() {
                b.rows = rows
                    .iter()
                    .map(|r| RowMeta {
                        group: r["group"].as_str().map(String::from),
                        reward: r["reward"].as_f64(),
                        ..RowMeta::default()
                    })
                    .collect();
            }
            Cell {
                rank: c["rank"].as_u64().unwrap() as usize,
                micro: c["micro"].as_u64().map(|m| m as usize),
                batch: b,
                loss: None,
                files: vec![],
            }
        })
        .collect();
    StepDump {
        producer: "fixture".into(),
        root: PathBuf::from("fixtures/mismatch"),
        step,
        cells,
        conventions: Default::default(),
        unplaced: vec![],
    }
}

fn close(what: &str, got: f64, want: f64, tol: f64) {
    let ok = (got == want) || (got - want).abs() <= tol * want.abs().max(1.0);
    assert!(
        ok,
        "{what}: got {got:e}, want {want:e} (diff {:e})",
        got - want
    );
}

#[test]
fn every_metric_equals_the_independent_float64_value() {
    let fx = fixture("metrics_basic.json");
    let rep = analyse(&step_of(&fx["cells"], 3), &Options::default()).unwrap();
    let want = fx["expected_numpy"].as_object().unwrap();
    assert_eq!(want.len(), rep.named.len(), "every metric has a value");
    for m in &rep.named {
        close(&m.name, m.value, want[&m.name].as_f64().unwrap(), 1e-12);
    }
    assert_eq!(rep.coverage.cells, 4);
    assert_eq!(rep.coverage.rows, 20);
    assert_eq!(rep.coverage.unscored_tokens, 0);
}

#[test]
fn verl_metrics_equal_verls_own_functions() {
    let fx = fixture("metrics_basic.json");
    let Some(want) = fx["expected_verl"].as_object() else {
        println!("skipped: verl 0.9.1 was not importable when the fixture was written");
        return;
    };
    let rep = analyse(&step_of(&fx["cells"], 3), &Options::default()).unwrap();
    let mut seen = 0;
    for (k, v) in want {
        if let Some(got) = rep.metric(k) {
            close(k, got, v.as_f64().unwrap(), 1e-12);
            seen += 1;
        }
    }
    assert_eq!(seen, 17, "verl's 13 rollout_corr and 4 training metrics");
}

#[test]
fn whatif_matches_verls_weights_and_the_autograd_loss() {
    let fx = fixture("metrics_basic.json");
    let Some(want) = fx["expected_whatif"].as_object() else {
        println!("skipped: verl 0.9.1 was not importable when the fixture was written");
        return;
    };
    let opts = Options {
        corrections: want.keys().map(|k| whatif::parse(k).unwrap()).collect(),
        ..Options::default()
    };
    let rep = analyse(&step_of(&fx["cells"], 3), &opts).unwrap();
    assert_eq!(rep.whatif.len(), want.len());
    for w in &rep.whatif {
        let e = &want[&w.correction.name];
        let n = &w.correction.name;
        close(
            &format!("{n} tokens_masked"),
            w.tokens_masked,
            e["tokens_masked"].as_f64().unwrap(),
            1e-12,
        );
        close(
            &format!("{n} seqs_masked"),
            w.seqs_masked,
            e["seqs_masked"].as_f64().unwrap(),
            1e-12,
        );
        let ess = e["ess"].as_f64().unwrap_or(f64::INFINITY);
        close(&format!("{n} ess"), w.ess, ess, 1e-12);
        if w.correction.rs.is_empty() && w.correction.is.is_some() {
            close(
                &format!("{n} ess (verl's metric)"),
                w.ess,
                e["ess_verl"].as_f64().unwrap(),
                1e-12,
            );
        }
        close(
            &format!("{n} loss"),
            w.loss.unwrap(),
            e["loss"].as_f64().unwrap(),
            1e-12,
        );
        close(
            &format!("{n} grad"),
            w.grad_norm.unwrap(),
            e["grad_norm"].as_f64().unwrap(),
            1e-12,
        );
    }
    // The corrections differ: a wrong weight or mask would not give both numbers.
    let none = rep
        .whatif
        .iter()
        .find(|w| w.correction.name == "none")
        .unwrap();
    let tis = rep
        .whatif
        .iter()
        .find(|w| w.correction.name == "token-tis")
        .unwrap();
    assert_ne!(none.loss, tis.loss);
}

#[test]
fn uncorrected_loss_equals_the_kernels_own_aggregation() {
    // "none" is the preset's loss over each cell (fused kernel, token-mean), averaged.
    let fx = fixture("metrics_basic.json");
    let opts = Options {
        corrections: vec![whatif::preset("none").unwrap()],
        ..Options::default()
    };
    let rep = analyse(&step_of(&fx["cells"], 3), &opts).unwrap();
    use candle_core::{Device, Tensor as C};
    use rlforensics::kernels::config::LossInputs;
    let cfg = rlforensics::kernels::presets::preset("verl-vanilla").unwrap();
    let mut total = 0.0;
    let cells = fx["cells"].as_array().unwrap();
    for c in cells {
        let m = |k: &str| {
            let (s, v) = matrix(&c[k]);
            C::from_vec(v, (s[0], s[1]), &Device::Cpu).unwrap()
        };
        let inputs = LossInputs {
            log_probs: m("current"),
            old_log_probs: Some(m("old")),
            ref_log_probs: None,
            advantages: m("advantages"),
            mask: m("mask"),
            entropy: None,
            rollout_log_probs: None,
        };
        let out = rlforensics::kernels::loss::compute(&inputs, &cfg).unwrap();
        total += rlforensics::kernels::to_f64(&out.loss).unwrap();
    }
    close(
        "loss",
        rep.whatif[0].loss.unwrap(),
        total / cells.len() as f64,
        1e-12,
    );
}

#[test]
fn planted_token_ids_are_the_top_attributed_and_flagged() {
    let fx = fixture("planted_tokens.json");
    let rep = analyse(&step_of(&fx["cells"], 0), &Options::default()).unwrap();
    let top: Vec<&str> = rep.attribution.top_tokens[..2]
        .iter()
        .map(|s| s.key.as_str())
        .collect();
    let mut top = top.clone();
    top.sort();
    assert_eq!(top, ["42", "7"]);
    let flagged: Vec<String> = rep
        .findings
        .iter()
        .filter(|f| f.detector == "mismatch-token")
        .map(|f| f.evidence["token_id"].to_string())
        .collect();
    assert!(
        flagged.contains(&"7".to_string()) && flagged.contains(&"42".to_string()),
        "{flagged:?}"
    );
    assert!(!rep.findings.iter().any(|f| f.detector == "mismatch-rank"));
    assert!(rep.attribution.top1pct_share > 0.05);
}

#[test]
fn planted_position_range_is_found() {
    let fx = fixture("planted_positions.json");
    let opts = Options {
        bucket_width: Some(8),
        ..Options::default()
    };
    let rep = analyse(&step_of(&fx["cells"], 0), &opts).unwrap();
    let f = rep
        .findings
        .iter()
        .find(|f| f.detector == "mismatch-position")
        .expect("a position finding");
    assert_eq!(f.evidence["first_position"], 40);
    assert_eq!(f.evidence["last_position"], 55);
    // the largest-lift bucket is inside the planted range
    let best = rep
        .attribution
        .by_position
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.lift.total_cmp(&b.1.lift))
        .unwrap()
        .0;
    assert!((5..7).contains(&best), "{best}");
    assert!(!rep.findings.iter().any(|f| f.detector == "mismatch-token"));
}

#[test]
fn planted_rank_is_found() {
    let fx = fixture("planted_rank.json");
    let rep = analyse(&step_of(&fx["cells"], 0), &Options::default()).unwrap();
    let ranks: Vec<&rlforensics::model::finding::Finding> = rep
        .findings
        .iter()
        .filter(|f| f.detector == "mismatch-rank")
        .collect();
    assert_eq!(ranks.len(), 1, "{:?}", rep.findings);
    assert_eq!(ranks[0].evidence["rank"], 2);
    let worst = rep
        .attribution
        .by_rank
        .iter()
        .max_by(|a, b| a.share.total_cmp(&b.share))
        .unwrap();
    assert_eq!(worst.key, "rank 2");
    assert!(rep
        .attribution
        .worst_sequences
        .iter()
        .take(5)
        .all(|s| s.rank == 2));
}

fn steps_report(name: &str) -> mismatch::report::Report {
    let fx = fixture(name);
    let opts = Options {
        corrections: vec![],
        ..Options::default()
    };
    let steps: Vec<_> = fx["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let rep = analyse(&step_of(&s["cells"], s["step"].as_i64().unwrap()), &opts).unwrap();
            for (k, v) in s["expected_numpy"].as_object().unwrap() {
                close(k, rep.metric(k).unwrap(), v.as_f64().unwrap(), 1e-12);
            }
            rep
        })
        .collect();
    mismatch::build_report(steps, vec![], &opts)
}

#[test]
fn growing_mismatch_is_found_with_its_start() {
    let rep = steps_report("steps_growth.json");
    let f = rep
        .findings
        .iter()
        .find(|f| f.detector == "mismatch-growth")
        .expect("growth");
    let start = f.evidence["start_step"].as_i64().unwrap();
    assert!((40..=70).contains(&start), "start {start}");
    assert!(rep.trends[0].slope > 0.0);
    assert!(!rep.findings.iter().any(|f| f.detector == "mismatch-jump"));
}

#[test]
fn a_jump_is_found_at_its_step() {
    let rep = steps_report("steps_jump.json");
    let jumps: Vec<i64> = rep.trends[0].jumps.clone();
    assert_eq!(jumps, vec![70]);
    assert!(!rep.findings.iter().any(|f| f.detector == "mismatch-growth"));
}

#[test]
fn a_flat_run_has_no_trend_finding() {
    let rep = steps_report("steps_flat.json");
    assert!(rep
        .findings
        .iter()
        .all(|f| f.detector != "mismatch-growth" && f.detector != "mismatch-jump"));
}

#[test]
fn a_missing_role_names_the_roles_the_step_holds() {
    let fx = fixture("metrics_basic.json");
    let mut step = step_of(&fx["cells"], 3);
    for c in &mut step.cells {
        c.batch.log_probs.remove(&LogProbSource::Rollout);
    }
    let err = analyse(&step, &Options::default()).unwrap_err().to_string();
    assert!(err.contains("[old, current]"), "{err}");
    assert!(err.contains("rollout with old"), "{err}");
}

#[test]
fn unpaired_rows_and_unscored_tokens_are_counted_not_dropped() {
    let fx = fixture("metrics_basic.json");
    let mut step = step_of(&fx["cells"], 3);
    // cell 0: the engine lacks the last row; cell 1: a NaN engine log-prob under the mask.
    let b = &mut step.cells[0].batch;
    let r = b.log_probs[&LogProbSource::Rollout].tensor.clone();
    b.log_probs.get_mut(&LogProbSource::Rollout).unwrap().tensor = r.rows(0, 4).unwrap();
    let b = &mut step.cells[1].batch;
    let mut v = b.log_probs[&LogProbSource::Rollout].tensor.to_f64_vec();
    v[0] = f64::NAN;
    let shape = b.log_probs[&LogProbSource::Rollout].tensor.shape().to_vec();
    b.log_probs.get_mut(&LogProbSource::Rollout).unwrap().tensor =
        Tensor::from_f64(shape, &v).unwrap();
    let rep = analyse(&step, &Options::default()).unwrap();
    assert_eq!(rep.coverage.unmatched_rows, 1);
    assert_eq!(rep.coverage.unscored_tokens, 1);
    assert_eq!(rep.coverage.rows, 19);
    assert!(
        rep.named.iter().all(|m| m.value.is_finite()),
        "{:?}",
        rep.named
    );
}

#[test]
fn logged_metric_names_map_to_the_recomputed_ones() {
    use rlforensics::mismatch::metrics::canonical;
    assert_eq!(canonical("mismatch/mismatch_kl"), Some("rollout_corr/kl"));
    assert_eq!(
        canonical("actor/rollout_corr/k3_kl"),
        Some("rollout_corr/k3_kl")
    );
    assert_eq!(
        canonical("train/token_mult_prob_error"),
        Some("train/token_mult_prob_error")
    );
    assert_eq!(
        canonical("sampling/sampling_logp_difference/mean"),
        Some("sampling/sampling_logp_difference/mean")
    );
    assert_eq!(canonical("loss"), None);
}

fn basic_report() -> mismatch::report::Report {
    let fx = fixture("metrics_basic.json");
    let opts = Options {
        keep_tokens: true,
        ..Options::default()
    };
    let mut steps = vec![analyse(&step_of(&fx["cells"], 3), &opts).unwrap()];
    let fx = fixture("steps_jump.json");
    for s in fx["steps"].as_array().unwrap().iter().take(9) {
        steps.push(
            analyse(
                &step_of(&s["cells"], s["step"].as_i64().unwrap() + 100),
                &opts,
            )
            .unwrap(),
        );
    }
    mismatch::build_report(steps, vec![], &opts)
}

#[test]
fn renderers_print_every_section_with_the_values() {
    use rlforensics::render::{by_name, Format, Style};
    let rep = basic_report();
    let kl = rep.steps[0].metric("rollout_corr/kl").unwrap();
    let num = rlforensics::render::mismatch::num(kl);
    for f in [Format::Table, Format::Markdown] {
        let text = by_name::<mismatch::report::Report>(f, Style::default())
            .render(&rep)
            .unwrap();
        for needle in [
            "rollout_corr/kl",
            "by response position",
            "worst sequences",
            "what-if",
            "token-tis",
            "trend of",
            "mismatch-jump",
            &num,
        ] {
            assert!(text.contains(needle), "{f:?} lacks {needle}");
        }
    }
    let json = by_name::<mismatch::report::Report>(Format::Json, Style::default())
        .render(&rep)
        .unwrap();
    let v: J = serde_json::from_str(&json).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["tool"], "mismatch");
    assert_eq!(v["steps"][0]["metrics"]["verl"]["kl"].as_f64().unwrap(), kl);
    assert_eq!(v["steps"].as_array().unwrap().len(), 10);
    assert!(v["steps"][0]["whatif"][1]["loss"].is_f64());
}

#[test]
fn plots_and_frames_are_written() {
    use polars::prelude::*;
    let rep = basic_report();
    let dir = tempfile::tempdir().unwrap();
    let files = rlforensics::render::mismatch::plot::write_plots(&rep, dir.path(), "png").unwrap();
    assert_eq!(files.len(), 2 * rep.steps.len() + rep.trends.len());
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{}", f.display());
    }
    let svg =
        rlforensics::render::mismatch::plot::write_plots(&rep, &dir.path().join("svg"), "svg")
            .unwrap();
    assert!(std::fs::read_to_string(&svg[0]).unwrap().contains("<svg"));
    let s = &rep.steps[0];
    let t = mismatch::frames::tokens_frame(s.step, s.token_table.as_ref().unwrap()).unwrap();
    assert_eq!(t.height() as u64, s.coverage.tokens);
    let abs: f64 = t.column("abs_delta").unwrap().f64().unwrap().sum().unwrap();
    close(
        "Σ|Δ| of the token frame",
        abs,
        s.attribution.total.sum_abs,
        1e-12,
    );
    let q = mismatch::frames::sequences_frame(s.step, s.seq_table.as_ref().unwrap()).unwrap();
    assert_eq!(q.height() as u64, s.coverage.rows);
}

#[test]
fn the_command_refuses_a_folder_no_producer_reads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.txt"), "hello").unwrap();
    let code = rlforensics::cli::mismatch::run_cli(["mismatch", dir.path().to_str().unwrap()]);
    assert_eq!(code, 2);
    let code = rlforensics::cli::mismatch::run_cli(["mismatch", "x", "--pair", "rollout"]);
    assert_eq!(code, 2);
    let code =
        rlforensics::cli::mismatch::run_cli(["mismatch", "x", "--correction", "rs=seq_mean_k9:1"]);
    assert_eq!(code, 2);
}

#[test]
fn correction_specs_parse_as_verl_spells_them() {
    let c = whatif::parse("is=sequence:2+rs=seq_sum_k1:0.5_2.0").unwrap();
    assert_eq!(c.is.unwrap().level, whatif::IsLevel::Sequence);
    assert_eq!((c.rs[0].lower, c.rs[0].upper), (Some(0.5), 2.0));
    // a single k1 threshold u means [1/u, u] (verl _parse_rollout_rs_thresholds)
    let c = whatif::parse("rs=token_k1:2").unwrap();
    assert_eq!(c.rs[0].lower, Some(0.5));
    assert!(whatif::parse("rs=token_k2:0.5_2").is_err());
    assert!(whatif::parse("is=token:-1").is_err());
    for p in whatif::PRESETS {
        assert!(whatif::preset(p).is_some());
    }
}

#[test]
#[ignore = "prints the table of the basic fixture (cargo test -- --ignored --nocapture show_table)"]
fn show_table() {
    use rlforensics::render::{by_name, Format, Style};
    let rep = basic_report();
    let text = by_name::<mismatch::report::Report>(Format::Table, Style::default())
        .render(&rep)
        .unwrap();
    println!("{}", &text[..text.len().min(9000)]);
}

/// A synthetic step of `ranks × micros` cells of `rows × t` tokens as a reader returns it:
/// bf16 log-probs (rollout, old), f32 advantages, bool mask, i64 ids (xorshift noise).
fn synthetic_step(ranks: usize, micros: usize, rows: usize, t: usize) -> StepDump {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let prov = |k: &str| Provenance {
        file: PathBuf::from("synthetic"),
        key: k.into(),
    };
    let bf16 = |v: &[f32], k: &str| TokenTensor {
        tensor: Tensor::from_le_bytes(
            DType::BF16,
            vec![rows, t],
            v.iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
        )
        .unwrap(),
        dtype: Some(DType::BF16),
        source: prov(k),
    };
    let mut cells = Vec::new();
    for r in 0..ranks {
        for m in 0..micros {
            let n = rows * t;
            let old: Vec<f32> = (0..n)
                .map(|_| (next() * 0.999 + 1e-3).ln() as f32)
                .collect();
            let ro: Vec<f32> = old
                .iter()
                .map(|x| x + ((next() - 0.5) * 0.02) as f32)
                .collect();
            let lens: Vec<usize> = (0..rows)
                .map(|_| t / 2 + (next() * (t / 2) as f64) as usize)
                .collect();
            let mask: Vec<bool> = (0..n).map(|i| i % t < lens[i / t]).collect();
            let ids: Vec<i64> = (0..n).map(|_| (next() * 150_000.0) as i64).collect();
            let adv: Vec<u8> = (0..rows)
                .flat_map(|_| {
                    let a = (next() - 0.5) as f32;
                    std::iter::repeat_n(a, t).flat_map(|x| x.to_le_bytes())
                })
                .collect();
            let mut b = TokenBatch::default();
            b.log_probs
                .insert(LogProbSource::Rollout, bf16(&ro, "rollout"));
            b.log_probs.insert(LogProbSource::Old, bf16(&old, "old"));
            b.response_mask = Some(TokenTensor {
                tensor: Tensor::from_bool(vec![rows, t], &mask).unwrap(),
                dtype: Some(DType::Bool),
                source: prov("mask"),
            });
            b.response_ids = Some(TokenTensor {
                tensor: Tensor::from_i64(vec![rows, t], &ids).unwrap(),
                dtype: Some(DType::I64),
                source: prov("ids"),
            });
            b.advantages = Some(TokenTensor {
                tensor: Tensor::from_le_bytes(DType::F32, vec![rows, t], adv).unwrap(),
                dtype: Some(DType::F32),
                source: prov("adv"),
            });
            cells.push(Cell {
                rank: r,
                micro: Some(m),
                batch: b,
                loss: None,
                files: vec![],
            });
        }
    }
    StepDump {
        producer: "synthetic".into(),
        root: PathBuf::from("synthetic"),
        step: 0,
        cells,
        conventions: Default::default(),
        unplaced: vec![],
    }
}

#[test]
#[ignore = "bench: MISMATCH_BENCH=ranks,micros,rows,t cargo test --release --test tests bench_analyse -- --ignored --nocapture"]
fn bench_analyse() {
    let spec = std::env::var("MISMATCH_BENCH").unwrap_or_else(|_| "32,2,64,8192".into());
    let d: Vec<usize> = spec.split(',').map(|x| x.parse().unwrap()).collect();
    let step = synthetic_step(d[0], d[1], d[2], d[3]);
    let status = |key: &str| -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    };
    let rss_input_kb = status("VmRSS:");
    let rounds: usize = std::env::var("MISMATCH_ROUNDS")
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(3);
    let mut out = serde_json::Map::new();
    for (name, opts) in [
        (
            "metrics_attribution",
            Options {
                corrections: vec![],
                ..Options::default()
            },
        ),
        ("default_with_whatif", Options::default()),
    ] {
        let mut times = Vec::new();
        for _ in 0..rounds {
            let t0 = std::time::Instant::now();
            let rep = analyse(&step, &opts).unwrap();
            times.push(t0.elapsed().as_secs_f64());
            assert!(rep.coverage.tokens > 0);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{name}: {spec}: median {:.3} s, min {:.3} s, runs {times:?}",
            times[rounds / 2],
            times[0]
        );
        out.insert(
            name.into(),
            serde_json::json!({"shape": spec, "times_s": times, "median_s": times[rounds / 2]}),
        );
    }
    let peak_kb = status("VmHWM:");
    println!(
        "input step in memory {} MB, process peak {} MB: analysis above the input <= {} MB",
        rss_input_kb / 1024,
        peak_kb / 1024,
        peak_kb.saturating_sub(rss_input_kb) / 1024
    );
    out.insert(
        "memory".into(),
        serde_json::json!({"input_rss_mb": rss_input_kb / 1024, "peak_mb": peak_kb / 1024, "analysis_above_input_mb_at_most": peak_kb.saturating_sub(rss_input_kb) / 1024}),
    );
    if let Ok(p) = std::env::var("MISMATCH_BENCH_JSON") {
        std::fs::write(p, serde_json::to_string_pretty(&out).unwrap()).unwrap();
    }
}

/// The planted steps written in every layout a producer reader takes
/// (`fixtures/mismatch/layouts/<kind>/<layout>`, by make_stacks.py's writers).
fn layouts(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/mismatch/layouts")
        .join(kind);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    assert_eq!(
        v.len(),
        5,
        "verl, verl_numpy, nemo_rl, slime, sglang_dumper"
    );
    v
}

fn analyse_layout(dir: &Path) -> mismatch::report::StepReport {
    let reader = rlforensics::producers::step_reader_for(dir).unwrap();
    let step = reader.read_step(dir, 3).unwrap();
    let opts = Options {
        bucket_width: Some(8),
        corrections: vec![],
        ..Options::default()
    };
    analyse(&step, &opts).unwrap()
}

#[test]
fn planted_mismatch_is_found_in_every_producer_layout() {
    for dir in layouts("tokens") {
        let rep = analyse_layout(&dir);
        let mut top: Vec<&str> = rep.attribution.top_tokens[..2]
            .iter()
            .map(|s| s.key.as_str())
            .collect();
        top.sort();
        assert_eq!(top, ["42", "7"], "{}", dir.display());
        let flagged: Vec<&str> = rep.findings.iter().map(|f| f.detector.as_str()).collect();
        assert_eq!(
            flagged,
            ["mismatch-token", "mismatch-token"],
            "{}",
            dir.display()
        );
        assert_eq!(rep.coverage.tokens, 1024);
    }
    for dir in layouts("positions") {
        let rep = analyse_layout(&dir);
        assert_eq!(
            rep.findings.len(),
            1,
            "{}: {:?}",
            dir.display(),
            rep.findings
        );
        let f = &rep.findings[0];
        assert_eq!(f.detector, "mismatch-position");
        assert_eq!(
            (
                f.evidence["first_position"].as_u64(),
                f.evidence["last_position"].as_u64()
            ),
            (Some(40), Some(55)),
            "{}",
            dir.display()
        );
    }
    for dir in layouts("rank") {
        let rep = analyse_layout(&dir);
        let ranks: Vec<&rlforensics::model::finding::Finding> = rep
            .findings
            .iter()
            .filter(|f| f.detector == "mismatch-rank")
            .collect();
        if rep.attribution.by_rank.len() == 2 {
            // slime and the SGLang dumper put the odd rows on rank 1
            assert_eq!(ranks.len(), 1, "{}", dir.display());
            assert_eq!(ranks[0].evidence["rank"], 1);
        } else {
            // one rank: the planted rows are the worst sequences
            assert!(ranks.is_empty());
            assert!(
                rep.attribution
                    .worst_sequences
                    .iter()
                    .take(8)
                    .all(|s| s.row % 2 == 1),
                "{}",
                dir.display()
            );
        }
    }
}

#[test]
fn logged_metrics_are_judged_for_jumps_and_growth() {
    // A TRL-style log: sampling_logp_difference 0.015 then 0.201 after step 6 (trl#5312),
    // and verl's old name of the KL growing.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.jsonl");
    let mut text = String::new();
    for s in 0..12i64 {
        let d = if s >= 7 {
            0.201
        } else {
            0.015 + 0.0001 * s as f64
        };
        let kl = 0.001 * (1.0 + (s as f64 / 2.0).powi(2));
        text.push_str(&format!(
            "{{\"step\": {s}, \"sampling/sampling_logp_difference/mean\": {d}, \"mismatch/mismatch_kl\": {kl}}}\n"
        ));
    }
    std::fs::write(&log, text).unwrap();
    let scan = rlforensics::logscan::scan(
        std::slice::from_ref(&log),
        &rlforensics::logscan::ScanOptions {
            detectors: vec!["logprob-mismatch".into()],
            keep_raw: true,
            ..Default::default()
        },
    )
    .unwrap();
    let series = mismatch::trend::logged_series(&scan.frame, "steps.jsonl");
    let names: Vec<&str> = series.iter().map(|s| s.1.as_str()).collect();
    assert!(
        names.contains(&"sampling/sampling_logp_difference/mean"),
        "{names:?}"
    );
    assert!(names.contains(&"rollout_corr/kl"), "{names:?}");
    let rep = mismatch::build_report(vec![], series, &Options::default());
    let jump: Vec<&rlforensics::model::finding::Finding> = rep
        .findings
        .iter()
        .filter(|f| f.detector == "mismatch-jump")
        .collect();
    assert_eq!(jump.len(), 1, "{:?}", rep.findings);
    assert_eq!(jump[0].first_step, Some(7));
    let growth: Vec<&rlforensics::model::finding::Finding> = rep
        .findings
        .iter()
        .filter(|f| f.detector == "mismatch-growth")
        .collect();
    assert_eq!(growth.len(), 1);
    assert!(growth[0].explanation.starts_with("rollout_corr/kl"));
}

#[test]
fn the_command_reads_every_stack_fixture_or_names_what_it_lacks() {
    // fixtures/stacks/: the same step in each producer's layout (tests/stacks.rs).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks");
    let kl = |dir: &str| -> Option<f64> {
        let dir = root.join(dir);
        let reader = rlforensics::producers::step_reader_for(&dir).unwrap();
        let step = reader.read_step(&dir, 3).unwrap();
        analyse(&step, &Options::default())
            .ok()
            .map(|r| r.metric("rollout_corr/kl").unwrap())
    };
    let v = kl("verl").unwrap();
    for d in ["verl_numpy", "nemo_rl", "slime", "sglang_dumper"] {
        close(d, kl(d).unwrap(), v, 1e-12);
    }
    let dir = root.join("areal");
    let step = rlforensics::producers::step_reader_for(&dir)
        .unwrap()
        .read_step(&dir, 3)
        .unwrap();
    let err = analyse(&step, &Options::default()).unwrap_err().to_string();
    assert!(err.contains("holds no log-prob role"), "{err}");
    let dir = root.join("verl_rollout_skip");
    let step = rlforensics::producers::step_reader_for(&dir)
        .unwrap()
        .read_step(&dir, 3)
        .unwrap();
    let err = analyse(&step, &Options::default()).unwrap_err().to_string();
    assert!(err.contains("[rollout]"), "{err}");
    let code = rlforensics::cli::mismatch::run_cli(["mismatch", dir.to_str().unwrap(), "-q"]);
    assert_eq!(code, 2);
    let code = rlforensics::cli::mismatch::run_cli([
        "mismatch",
        root.join("verl").to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0);
}
