//! losscheck: reference kernels against the frameworks' own outputs
//! (`fixtures/kernels/`, written by `fixtures/gen/make_kernel_refs.py` from TRL's and
//! verl's actual functions), and the losscheck command on the dump fixtures.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use predicates::prelude::PredicateBooleanExt;
use rlforensics::kernels::advantage::{group_advantages, AdvantageConfig, SingletonRule, StdMode};
use rlforensics::kernels::aggregate::{aggregate, AggMode};
use rlforensics::kernels::kl::{kl, KlEstimator};
use rlforensics::kernels::loss::{
    compute_with_grad, compute_with_grad_candle, KlPlacement, KlTerm, LossConfig, LossInputs,
    PolicyKind, RatioLevel,
};
use rlforensics::kernels::policy_loss::ClipParams;
use rlforensics::kernels::presets::preset;
use rlforensics::kernels::{to_f64, to_f64_vec, Precision};
use rlforensics::losscheck::{
    check_tree, self_consistency_any, Layout, SelfHostedStep, Status, Tolerance,
};
use rlforensics::producers::layout::DumpTree;
use rlforensics::Value;

fn kdir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kernels")
}

fn cases() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(kdir().join("cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

struct Case {
    name: String,
    cfg: serde_json::Value,
    data: Value,
}

impl Case {
    fn t(&self, key: &str) -> Tensor {
        let t = self
            .data
            .get(key)
            .unwrap_or_else(|| panic!("{}: no {key}", self.name))
            .as_tensor()
            .unwrap();
        t.to_candle(&Device::Cpu).unwrap()
    }
    fn v(&self, key: &str) -> Vec<f64> {
        to_f64_vec(&self.t(key)).unwrap()
    }
    fn f(&self, key: &str) -> f64 {
        self.cfg[key].as_f64().unwrap()
    }
}

fn load(kind: &str) -> Vec<Case> {
    cases()
        .into_iter()
        .filter(|c| c["kind"] == kind)
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_string();
            let data = rlforensics::formats::read_any(&kdir().join(format!("{name}.safetensors")))
                .unwrap();
            Case {
                name,
                cfg: c["config"].clone(),
                data,
            }
        })
        .collect()
}

/// ≤ 1e-9 relative (absolute 1e-12 near zero); NaN matches NaN only.
fn close(a: f64, b: f64) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-12
}

fn check(errors: &mut Vec<String>, case: &str, what: &str, ours: &[f64], theirs: &[f64]) {
    if ours.len() != theirs.len() {
        errors.push(format!(
            "{case}: {what}: {} values vs {}",
            ours.len(),
            theirs.len()
        ));
        return;
    }
    if let Some((i, (a, b))) = ours
        .iter()
        .zip(theirs)
        .enumerate()
        .find(|(_, (a, b))| !close(**a, **b))
    {
        errors.push(format!(
            "{case}: {what}[{i}]: ours {a:e} vs framework {b:e}"
        ));
    }
}

fn finish(errors: Vec<String>, n: usize) {
    assert!(n > 0, "no cases loaded");
    assert!(
        errors.is_empty(),
        "{} mismatches:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

#[test]
fn advantages_match_trl_and_verl() {
    let cases = load("advantage");
    let mut errors = Vec::new();
    for c in &cases {
        let rewards = c.v("in.rewards");
        let expected = c.v("out.advantages");
        if c.cfg["framework"] == "trl" {
            let g = c.cfg["group_size"].as_u64().unwrap() as usize;
            let groups: Vec<usize> = (0..rewards.len()).map(|i| i / g).collect();
            let std = match c.cfg["scale_rewards"].as_str().unwrap() {
                "group" => StdMode::GroupUnbiased,
                "batch" => StdMode::BatchUnbiased,
                _ => StdMode::None,
            };
            let cfg = AdvantageConfig {
                std,
                ..preset("trl-grpo").unwrap().advantage
            };
            let ours = group_advantages(&rewards, &groups, &cfg).unwrap();
            check(&mut errors, &c.name, "advantages", &ours, &expected);
        } else {
            let groups: Vec<i64> = c.v("in.group_ids").iter().map(|g| *g as i64).collect();
            let name = if c.cfg["norm_adv_by_std_in_grpo"] == true {
                "verl-vanilla"
            } else {
                "verl-dr-grpo"
            };
            let cfg = preset(name).unwrap().advantage;
            let seq = group_advantages(&rewards, &groups, &cfg).unwrap();
            let mask = c.t("in.response_mask");
            let ours =
                rlforensics::kernels::advantage::token_advantages(&seq, &mask, Precision::F64)
                    .unwrap();
            check(
                &mut errors,
                &c.name,
                "advantages",
                &to_f64_vec(&ours).unwrap(),
                &expected,
            );
        }
    }
    finish(errors, cases.len());
}

#[test]
fn singleton_and_zero_std_groups_follow_each_convention() {
    let rewards = [1.0, 1.0, 1.0, 0.7];
    let groups = [0, 0, 0, 1];
    let verl = group_advantages(
        &rewards,
        &groups,
        &preset("verl-vanilla").unwrap().advantage,
    )
    .unwrap();
    assert_eq!(&verl[..3], &[0.0, 0.0, 0.0]);
    assert!(close(verl[3], 0.7 / (1.0 + 1e-6)));
    let mlx = group_advantages(&rewards, &groups, &preset("mlx-grpo").unwrap().advantage).unwrap();
    assert_eq!(mlx, vec![0.0; 4]);
    let pop = AdvantageConfig {
        std: StdMode::GroupPopulation,
        eps: 1e-4,
        singleton: SingletonRule::ZeroStd,
    };
    let a = group_advantages(&[1.0, 0.0], &[0, 0], &pop).unwrap();
    assert!(close(a[0], 0.5 / (0.5 + 1e-4)));
    assert!(group_advantages(&[1.0], &[0, 1], &pop).is_err());
}

#[test]
fn kl_estimators_match_verl_values_and_gradients() {
    let cases = load("kl");
    let mut errors = Vec::new();
    for c in &cases {
        let est = KlEstimator::parse(c.cfg["estimator"].as_str().unwrap()).unwrap();
        let logp = candle_core::Var::from_tensor(&c.t("in.log_probs")).unwrap();
        let k = kl(logp.as_tensor(), &c.t("in.ref_log_probs"), est).unwrap();
        let grads = k.sum_all().unwrap().backward().unwrap();
        let g = grads.get(logp.as_tensor()).unwrap();
        check(
            &mut errors,
            &c.name,
            "kl",
            &to_f64_vec(&k).unwrap(),
            &c.v("out.kl"),
        );
        check(
            &mut errors,
            &c.name,
            "grad",
            &to_f64_vec(g).unwrap(),
            &c.v("out.grad_sum"),
        );
    }
    finish(errors, cases.len());
}

#[test]
fn verl_aggregation_modes_including_empty_rows_and_empty_micro() {
    let cases = load("aggregate");
    let mut errors = Vec::new();
    for c in &cases {
        let mode = AggMode::parse(c.cfg["mode"].as_str().unwrap()).unwrap();
        let l = aggregate(&c.t("in.loss_mat"), &c.t("in.mask"), mode).unwrap();
        check(
            &mut errors,
            &c.name,
            "loss",
            &[to_f64(&l).unwrap()],
            &c.v("out.loss"),
        );
    }
    finish(errors, cases.len());
}

fn verl_config(c: &Case) -> LossConfig {
    let gspo = c.cfg["loss_mode"] == "gspo";
    let mut cfg = preset(if gspo { "verl-gspo" } else { "verl-vanilla" }).unwrap();
    cfg.agg = AggMode::parse(c.cfg["loss_agg_mode"].as_str().unwrap()).unwrap();
    let clip = c.f("clip_ratio");
    cfg.policy = PolicyKind::Clip(ClipParams {
        eps_low: c.cfg["clip_ratio_low"].as_f64().unwrap_or(clip),
        eps_high: c.cfg["clip_ratio_high"].as_f64().unwrap_or(clip),
        delta: None,
        clip_ratio_c: if gspo {
            None
        } else {
            Some(c.f("clip_ratio_c"))
        },
    });
    cfg
}

#[test]
fn verl_vanilla_and_gspo_losses_metrics_and_gradients_match_verl() {
    let cases = load("verl_policy");
    let mut errors = Vec::new();
    for c in &cases {
        let cfg = verl_config(c);
        let inputs = LossInputs {
            log_probs: c.t("in.log_probs"),
            old_log_probs: Some(c.t("in.old_log_probs")),
            ref_log_probs: None,
            advantages: c.t("in.advantages"),
            mask: c.t("in.mask"),
            entropy: None,
            rollout_log_probs: None,
        };
        let (out, grad) = compute_with_grad(&inputs, &cfg).unwrap();
        check(
            &mut errors,
            &c.name,
            "loss",
            &[to_f64(&out.loss).unwrap()],
            &c.v("out.loss"),
        );
        check(
            &mut errors,
            &c.name,
            "grad",
            &to_f64_vec(&grad).unwrap(),
            &c.v("out.grad"),
        );
        let m = &out.metrics;
        check(
            &mut errors,
            &c.name,
            "pg_clipfrac",
            &[m.pg_clipfrac],
            &c.v("out.pg_clipfrac"),
        );
        check(
            &mut errors,
            &c.name,
            "ppo_kl",
            &[m.ppo_kl],
            &c.v("out.ppo_kl"),
        );
        check(
            &mut errors,
            &c.name,
            "pg_clipfrac_lower",
            &[m.pg_clipfrac_lower],
            &c.v("out.pg_clipfrac_lower"),
        );
    }
    finish(errors, cases.len());
}

fn trl_config(c: &Case) -> LossConfig {
    let mut cfg = preset("trl-grpo").unwrap();
    cfg.agg = match c.cfg["loss_type"].as_str().unwrap() {
        "grpo" => AggMode::TrlGrpo,
        "bnpo" => AggMode::TrlBnpo,
        "dr_grpo" => AggMode::TrlDrGrpo {
            max_completion_length: c.cfg["max_completion_length"].as_f64(),
        },
        "dapo" => AggMode::TrlDapo {
            num_items_in_batch: c.cfg["num_items_in_batch"].as_f64(),
        },
        other => panic!("loss_type {other}"),
    };
    if c.cfg["importance_sampling_level"] == "sequence" {
        cfg.ratio_level = RatioLevel::Sequence;
    }
    cfg.policy = PolicyKind::Clip(ClipParams {
        eps_low: c.f("epsilon_low"),
        eps_high: c.f("epsilon_high"),
        delta: c.cfg["delta"].as_f64(),
        clip_ratio_c: None,
    });
    let beta = c.f("beta");
    if beta != 0.0 {
        cfg.kl = Some(KlTerm {
            estimator: KlEstimator::K3,
            coef: beta,
            placement: KlPlacement::PerToken,
        });
    }
    cfg
}

#[test]
fn trl_grpo_bnpo_dr_grpo_dapo_gspo_match_trl_compute_loss() {
    let cases = load("trl_policy");
    let mut errors = Vec::new();
    for c in &cases {
        let cfg = trl_config(c);
        let inputs = LossInputs {
            log_probs: c.t("in.log_probs"),
            old_log_probs: Some(c.t("in.old_log_probs")),
            ref_log_probs: Some(c.t("in.ref_log_probs")),
            advantages: c.t("in.advantages"),
            mask: c.t("in.mask"),
            entropy: None,
            rollout_log_probs: None,
        };
        let (out, grad) = compute_with_grad(&inputs, &cfg).unwrap();
        check(
            &mut errors,
            &c.name,
            "loss",
            &[to_f64(&out.loss).unwrap()],
            &c.v("out.loss"),
        );
        check(
            &mut errors,
            &c.name,
            "grad",
            &to_f64_vec(&grad).unwrap(),
            &c.v("out.grad"),
        );
        let m = &out.metrics;
        check(
            &mut errors,
            &c.name,
            "clip low",
            &[m.clip_ratio_low],
            &c.v("out.clip_ratio.low_mean"),
        );
        check(
            &mut errors,
            &c.name,
            "clip high",
            &[m.clip_ratio_high],
            &c.v("out.clip_ratio.high_mean"),
        );
        check(
            &mut errors,
            &c.name,
            "clip region",
            &[m.clip_ratio_region],
            &c.v("out.clip_ratio.region_mean"),
        );
        if let Some(kl) = m.kl {
            check(&mut errors, &c.name, "kl", &[kl], &c.v("out.kl"));
        }
    }
    finish(errors, cases.len());
}

/// The fused analytic backward (`compute_with_grad`) against candle's autograd
/// (`compute_with_grad_candle`) on every verl and TRL fixture case, in f64 (gradient
/// bit-identical, loss within 1e-12) and f32 (same zeros, gradient within 1e-6 of the
/// largest entry, loss within 1e-5): the same graph, differentiated twice. NaN (the empty
/// micro-batch's token mean) must be NaN on both sides.
#[test]
fn fused_gradient_equals_candle_autograd_on_every_framework_case() {
    let near = |a: f64, b: f64, tol: f64| (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol;
    let mut n = 0;
    for (kind, config) in [
        ("verl_policy", verl_config as fn(&Case) -> LossConfig),
        ("trl_policy", trl_config),
    ] {
        for c in &load(kind) {
            let inputs = LossInputs {
                log_probs: c.t("in.log_probs"),
                old_log_probs: Some(c.t("in.old_log_probs")),
                ref_log_probs: (kind == "trl_policy").then(|| c.t("in.ref_log_probs")),
                advantages: c.t("in.advantages"),
                mask: c.t("in.mask"),
                entropy: None,
                rollout_log_probs: None,
            };
            for precision in [Precision::F64, Precision::F32] {
                let cfg = LossConfig {
                    precision,
                    ..config(c)
                };
                let (fo, fg) = compute_with_grad(&inputs, &cfg).unwrap();
                let (co, cg) = compute_with_grad_candle(&inputs, &cfg).unwrap();
                let (fl, cl) = (to_f64(&fo.loss).unwrap(), to_f64(&co.loss).unwrap());
                let (fg, cg) = (to_f64_vec(&fg).unwrap(), to_f64_vec(&cg).unwrap());
                assert_eq!(fg.len(), cg.len(), "{}", c.name);
                let (tol_loss, tol_grad) = match precision {
                    Precision::F64 => (1e-12, 0.0),
                    Precision::F32 => (1e-5, 1e-6),
                };
                assert!(
                    near(fl, cl, tol_loss * cl.abs()),
                    "{}: {fl} vs {cl}",
                    c.name
                );
                let top = cg
                    .iter()
                    .filter(|x| x.is_finite())
                    .fold(0.0f64, |m, x| m.max(x.abs()));
                for (a, b) in fg.iter().zip(&cg) {
                    assert_eq!(*a == 0.0, *b == 0.0, "{}: {a} vs {b}", c.name);
                    assert!(near(*a, *b, tol_grad * top), "{}: {a} vs {b}", c.name);
                }
                n += 1;
            }
        }
    }
    assert!(n >= 4, "only {n} fixture cases");
}

#[test]
fn gspo_and_gspo_token_agree_in_loss_but_not_in_gradient() {
    // With token-varying advantages, the sequence ratio's gradient spreads each token's
    // advantage over the row; GSPO-token keeps it at its token. Same loss value.
    let c = &load("verl_policy")
        .into_iter()
        .find(|c| c.name == "verl_gspo_normal")
        .unwrap();
    let adv = c.t("in.advantages");
    let (_, t) = adv.dims2().unwrap();
    let ramp = Tensor::arange(0.0f64, t as f64, &Device::Cpu)
        .unwrap()
        .affine(0.1, 1.0)
        .unwrap();
    let inputs = LossInputs {
        log_probs: c.t("in.log_probs"),
        old_log_probs: Some(c.t("in.old_log_probs")),
        ref_log_probs: None,
        advantages: adv.broadcast_mul(&ramp).unwrap(),
        mask: c.t("in.mask"),
        entropy: None,
        rollout_log_probs: None,
    };
    let tok = verl_config(c);
    let seq = LossConfig {
        ratio_level: RatioLevel::Sequence,
        agg: AggMode::TokenMean,
        ..tok.clone()
    };
    let tok = LossConfig {
        agg: AggMode::TokenMean,
        ..tok
    };
    let (a, ga) = compute_with_grad(&inputs, &tok).unwrap();
    let (b, gb) = compute_with_grad(&inputs, &seq).unwrap();
    assert!(close(to_f64(&a.loss).unwrap(), to_f64(&b.loss).unwrap()));
    let (ga, gb) = (to_f64_vec(&ga).unwrap(), to_f64_vec(&gb).unwrap());
    assert!(ga.iter().zip(&gb).any(|(x, y)| !close(*x, *y)));
}

#[test]
fn f32_precision_reproduces_float32_rounding() {
    let c = &load("verl_policy")
        .into_iter()
        .find(|c| c.name == "verl_vanilla_normal")
        .unwrap();
    let mut cfg = verl_config(c);
    cfg.precision = Precision::F32;
    let inputs = LossInputs {
        log_probs: c.t("in.log_probs"),
        old_log_probs: Some(c.t("in.old_log_probs")),
        ref_log_probs: None,
        advantages: c.t("in.advantages"),
        mask: c.t("in.mask"),
        entropy: None,
        rollout_log_probs: None,
    };
    let (out, grad) = compute_with_grad(&inputs, &cfg).unwrap();
    assert_eq!(out.loss.dtype(), candle_core::DType::F32);
    assert_eq!(grad.dtype(), candle_core::DType::F32);
    let l = to_f64(&out.loss).unwrap();
    let r = c.v("out.loss")[0];
    assert!((l - r).abs() < 1e-5 * r.abs() && l != r);
}

#[test]
fn mismatched_shapes_are_refused_naming_both_sizes() {
    let a = Tensor::zeros((2, 3), candle_core::DType::F64, &Device::Cpu).unwrap();
    let b = Tensor::zeros((2, 4), candle_core::DType::F64, &Device::Cpu).unwrap();
    let inputs = LossInputs {
        log_probs: a.clone(),
        old_log_probs: Some(b),
        ref_log_probs: None,
        advantages: Tensor::zeros(2, candle_core::DType::F64, &Device::Cpu).unwrap(),
        mask: a,
        entropy: None,
        rollout_log_probs: None,
    };
    let err = compute_with_grad(&inputs, &preset("trl-grpo").unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("[2, 3]") && msg.contains("[2, 4]"), "{msg}");
    assert!(preset("nope").unwrap_err().to_string().contains("trl-grpo"));
}

fn losscheck() -> assert_cmd::Command {
    let mut c = assert_cmd::Command::cargo_bin("losscheck").unwrap();
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c.env_remove("COLUMNS");
    c
}

#[test]
fn faulty_weaver_tree_names_the_injected_ranks_and_micros() {
    let out = losscheck()
        .args([
            "--dump-dir",
            "fixtures/dumps/weaver_faulty_pt",
            "--step",
            "0",
            "--preset",
            "nexrl-is",
        ])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    // The table has a row per cell; what is wrong is said below it, a line per cell.
    let bad: Vec<&str> = text.lines().filter(|l| l.starts_with("rank ")).collect();
    assert_eq!(bad.len(), 2, "{text}");
    assert!(
        bad[0].starts_with("rank 3 micro 1 ") && bad[0].contains("prob_ratio at row 0 pos 1"),
        "{}",
        bad[0]
    );
    assert!(
        bad[1].starts_with("rank 5 micro 0 ") && bad[1].contains("a sum, not a mean"),
        "{}",
        bad[1]
    );
    // rank 7 micro 0 (rows swapped everywhere) is self-consistent; rank 10 is absent.
    assert!(text.contains("│ 7    ┆ 0     ┆ consistent ") && !text.contains("│ 10 "));
}

#[test]
fn clean_weaver_tree_is_consistent() {
    losscheck()
        .args([
            "--dump-dir",
            "fixtures/dumps/weaver_pt",
            "--step",
            "0",
            "--preset",
            "nexrl-is",
        ])
        .assert()
        .code(0);
    losscheck()
        .args([
            "--dump-dir",
            "fixtures/dumps/weaver_jsonl",
            "--preset",
            "nexrl-is",
            "--rank",
            "3",
            "--micro",
            "1",
        ])
        .assert()
        .code(0)
        .stdout(
            predicates::str::contains("│ 3    ┆ 1     ┆ consistent ")
                .and(predicates::str::contains("PASS — 1 cell consistent")),
        );
}

#[test]
fn inputs_file_prints_loss_metrics_and_gradient() {
    let out = losscheck()
        .args([
            "--inputs",
            "fixtures/kernels/trl_grpo_normal.safetensors",
            "--preset",
            "trl-grpo",
            "--format",
            "json",
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let c = load("trl_policy")
        .into_iter()
        .find(|c| c.name == "trl_grpo_normal")
        .unwrap();
    let expected = c.v("out.loss")[0];
    // the file also holds ref_log_probs but trl-grpo has beta = 0: same loss as TRL's.
    assert!(close(v["loss"].as_f64().unwrap(), expected));
    assert_eq!(v["grad_shape"], serde_json::json!([8, 10]));
}

#[test]
fn bad_preset_and_missing_dir_exit_2() {
    losscheck()
        .args(["--dump-dir", "fixtures/dumps/weaver_pt", "--preset", "nope"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("trl-grpo"));
    losscheck()
        .args(["--dump-dir", "fixtures/dumps/remote_api_pt"])
        .assert()
        .code(2)
        .stderr(
            predicates::str::contains("is_loss_debug")
                .and(predicates::str::contains("forward_data")),
        );
}

fn ground_truth() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/expected/ground_truth.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn gt_f64(v: &serde_json::Value) -> f64 {
    v.as_str().unwrap().parse().unwrap()
}

fn tree(name: &str) -> DumpTree {
    DumpTree::discover(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/dumps")
            .join(name),
    )
    .unwrap()
}

/// Every self-hosted micro: recomputed f64 loss = the generator's f64 reference (≤ 1e-12
/// relative), dumped loss = the generator's f32 loss, token counts as recorded.
fn assert_self_hosted_matches_ground_truth(name: &str) {
    let gt = ground_truth();
    let cfg = preset("nexrl-is").unwrap();
    let verdicts = check_tree(&tree(name), 0, None, None, &cfg, &Tolerance::default()).unwrap();
    let micros = gt["micros"].as_array().unwrap();
    assert_eq!(verdicts.len(), micros.len());
    for (v, m) in verdicts.iter().zip(micros) {
        assert_eq!(
            (v.rank as u64, v.micro as u64),
            (m["rank"].as_u64().unwrap(), m["micro"].as_u64().unwrap())
        );
        assert_eq!(v.status, Status::Consistent, "{}", v.line());
        assert_eq!(v.layout, Layout::SelfHosted);
        let reference = gt_f64(&m["reference_loss_f64"]);
        assert!(
            ((v.recomputed_loss - reference) / reference).abs() <= 1e-12,
            "{name} rank {} micro {}: {} vs {reference}",
            v.rank,
            v.micro,
            v.recomputed_loss
        );
        assert_eq!(v.dumped_loss, gt_f64(&m["self_hosted_loss"]));
        assert_eq!(v.tokens as u64, m["num_tokens"].as_u64().unwrap());
        let names: Vec<&str> = v.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "loss",
                "pg_loss",
                "entropy_loss",
                "metrics.pg_loss",
                "metrics.approx_kl",
                "metrics.avg_ratio",
                "metrics.clip_frac",
                "metrics.entropy",
                "metrics.num_tokens"
            ]
        );
    }
}

#[test]
fn self_hosted_pt_tree_is_consistent_and_matches_the_f64_reference() {
    assert_self_hosted_matches_ground_truth("self_hosted_pt");
}

#[test]
fn self_hosted_jsonl_tree_is_consistent_and_matches_the_f64_reference() {
    assert_self_hosted_matches_ground_truth("self_hosted_jsonl");
}

#[test]
fn self_hosted_rows_are_matched_by_tokens_and_get_the_recorded_advantages() {
    let gt = ground_truth();
    let t = tree("self_hosted_pt");
    let batch = SelfHostedStep::load(&t, 0, &preset("nexrl-is").unwrap().advantage).unwrap();
    assert_eq!(batch.len(), 48);
    for row in gt["rows"].as_array().unwrap() {
        let (r, m, j) = (
            row["rank"].as_u64().unwrap() as u32,
            row["micro"].as_u64().unwrap() as u32,
            row["row"].as_u64().unwrap() as usize,
        );
        // rank 2 micro 1 has a NaN under the mask, rank 4 micro 0 is a strided view.
        let mi = batch.micro_inputs(&t, 0, r, m).unwrap();
        let i = row["trajectory_index"].as_u64().unwrap() as usize;
        assert_eq!(mi.trajectory_rows[j], i, "rank {r} micro {m} row {j}");
        assert_eq!(mi.advantages[j], gt_f64(&row["advantage"]));
        assert_eq!(
            batch.group(i),
            Some(format!("group-{:02}", row["group"].as_u64().unwrap()).as_str())
        );
    }
}

#[test]
fn self_hosted_changed_loss_value_flags_that_micro_with_both_numbers() {
    let gt = ground_truth();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dumps/self_hosted_jsonl");
    let dir = tempfile::tempdir().unwrap();
    for kind in ["trajectory", "old_log_probs", "forward_data", "loss"] {
        std::fs::create_dir_all(dir.path().join(kind)).unwrap();
        for e in std::fs::read_dir(src.join(kind)).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dir.path().join(kind).join(p.file_name().unwrap())).unwrap();
        }
    }
    let lf = dir.path().join("loss/step_000000_rank5_micro1.jsonl");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&lf).unwrap()).unwrap();
    let was = v["loss"].as_f64().unwrap();
    v["loss"] = serde_json::json!(was + 0.25);
    std::fs::write(&lf, format!("{v}\n")).unwrap();

    let cell = gt["micros"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["rank"] == 5 && m["micro"] == 1)
        .unwrap();
    let reference = gt_f64(&cell["reference_loss_f64"]);
    let t = DumpTree::discover(dir.path()).unwrap();
    let cfg = preset("nexrl-is").unwrap();
    let v = self_consistency_any(&t, 0, 5, 1, &cfg, &Tolerance::default()).unwrap();
    assert_eq!(v.status, Status::Inconsistent);
    assert_eq!(v.dumped_loss, was + 0.25);
    assert!(((v.recomputed_loss - reference) / reference).abs() <= 1e-12);
    let bad: Vec<&str> = v
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(bad, ["loss"], "pg_loss and the metrics still agree");

    let out = losscheck()
        .args(["--dump-dir", dir.path().to_str().unwrap(), "--step", "0"])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let bad: Vec<&str> = text.lines().filter(|l| l.starts_with("rank ")).collect();
    assert_eq!(bad.len(), 1, "{text}");
    assert!(bad[0].starts_with("rank 5 micro 1 "), "{}", bad[0]);
    assert!(
        bad[0].contains(&{
            let (d, r) = rlforensics::fmt::pair(was + 0.25, reference);
            format!("dumped loss {d} ≠ recomputed {r}")
        }),
        "{}",
        bad[0]
    );
    // One table row per cell (the header row aside).
    assert_eq!(text.lines().filter(|l| l.contains(" ┆ ")).count(), 24 + 1);
}

#[test]
fn self_consistency_any_names_the_faulty_side_for_dumpdiff() {
    let cfg = preset("nexrl-is").unwrap();
    let tol = Tolerance::default();
    let (sh, faulty) = (tree("self_hosted_pt"), tree("weaver_faulty_pt"));
    for (rank, micro) in [(3, 1), (5, 0)] {
        let a = self_consistency_any(&sh, 0, rank, micro, &cfg, &tol).unwrap();
        let b = self_consistency_any(&faulty, 0, rank, micro, &cfg, &tol).unwrap();
        assert_eq!(
            (a.layout, a.status),
            (Layout::SelfHosted, Status::Consistent)
        );
        assert_eq!((b.layout, b.status), (Layout::Weaver, Status::Inconsistent));
    }
    // the swapped rows (rank 7 micro 0) are self-consistent on both sides.
    let b = self_consistency_any(&faulty, 0, 7, 0, &cfg, &tol).unwrap();
    assert_eq!(b.status, Status::Consistent);
    // rank 10 is absent on the weaver side: an error naming the cell, not a verdict.
    let e = self_consistency_any(&faulty, 0, 10, 0, &cfg, &tol).unwrap_err();
    assert!(e.to_string().contains("rank 10 micro 0"), "{e}");
    let e = self_consistency_any(&tree("remote_api_pt"), 0, 0, 0, &cfg, &tol).unwrap_err();
    assert!(e.to_string().contains("self-hosted layout"), "{e}");
}

#[test]
fn mlx_preset_follows_mlx_lm_lora_grpo_trainer() {
    // conventions cited in src/kernels/presets.rs (mlx cannot run here: Apple only).
    let cfg = preset("mlx-grpo").unwrap();
    assert_eq!(cfg.advantage.std, StdMode::GroupPopulation);
    assert_eq!(cfg.advantage.eps, 1e-4);
    assert_eq!(cfg.agg, AggMode::TokenMean);
    match cfg.policy {
        PolicyKind::Clip(p) => assert_eq!((p.eps_low, p.eps_high), (1e-4, 1e-4)),
        other => panic!("{other:?}"),
    }
    // population std of [1, 0, 0, 0] is sqrt(3)/4: advantages 0.75/(0.4330127+1e-4) ...
    let adv =
        group_advantages(&[1.0, 0.0, 0.0, 0.0, 5.0], &[0, 0, 0, 0, 1], &cfg.advantage).unwrap();
    let s = 3f64.sqrt() / 4.0 + 1e-4;
    assert_eq!(adv, [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0.0]);
    // mlx's KL at token level: exp(d)·exp(d) − d − 1, gradient 2·exp(2d) − 1.
    let lp = candle_core::Var::new(&[[-1.0f64, -2.0]], &Device::Cpu).unwrap();
    let rf = Tensor::new(&[[-1.1f64, -1.5]], &Device::Cpu).unwrap();
    let k = kl(lp.as_tensor(), &rf, KlEstimator::parse("mlx").unwrap()).unwrap();
    let g = k.sum_all().unwrap().backward().unwrap();
    let g = to_f64_vec(g.get(lp.as_tensor()).unwrap()).unwrap();
    let v = to_f64_vec(&k).unwrap();
    for (i, d) in [0.1f64, -0.5].iter().enumerate() {
        assert!((v[i] - (d.exp() * d.exp() - d - 1.0)).abs() < 1e-15);
        assert!((g[i] - (2.0 * (2.0 * d).exp() - 1.0)).abs() < 1e-14);
    }
}

#[test]
fn verl_entropy_bonus_and_separate_kl_loss_match_verl_ppo_loss() {
    let cases = load("verl_full");
    let mut errors = Vec::new();
    for c in &cases {
        let mut cfg = verl_config(c);
        cfg.entropy_coeff = c.f("entropy_coeff");
        cfg.entropy_agg = cfg.agg;
        cfg.kl = Some(KlTerm {
            estimator: KlEstimator::parse(c.cfg["kl_loss_type"].as_str().unwrap()).unwrap(),
            coef: c.f("kl_loss_coef"),
            placement: KlPlacement::Separate,
        });
        let inputs = LossInputs {
            log_probs: c.t("in.log_probs"),
            old_log_probs: Some(c.t("in.old_log_probs")),
            ref_log_probs: Some(c.t("in.ref_log_probs")),
            advantages: c.t("in.advantages"),
            mask: c.t("in.mask"),
            entropy: Some(c.t("in.entropy")),
            rollout_log_probs: None,
        };
        let (out, grad) = compute_with_grad(&inputs, &cfg).unwrap();
        let f = |t: &Option<Tensor>| to_f64(t.as_ref().unwrap()).unwrap();
        for (what, ours) in [
            ("loss", to_f64(&out.loss).unwrap()),
            ("pg_loss", to_f64(&out.pg_loss).unwrap()),
            ("entropy_loss", f(&out.entropy_loss)),
            ("kl_loss", f(&out.kl_loss)),
        ] {
            check(
                &mut errors,
                &c.name,
                what,
                &[ours],
                &c.v(&format!("out.{what}")),
            );
        }
        check(
            &mut errors,
            &c.name,
            "grad",
            &to_f64_vec(&grad).unwrap(),
            &c.v("out.grad"),
        );
    }
    assert_eq!(cases.len(), 6);
    finish(errors, cases.len());
}
