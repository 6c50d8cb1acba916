//! Tests of [`super::judge_under`] on one hand-built cell.

use super::*;
use crate::judge::cell::Stated;
use crate::judge::infer::{Convention, Resolved, Unstated};
use crate::judge::Layout;
use crate::kernels::loss::LossInputs;
use crate::kernels::presets::preset;
use candle_core::{Device, Tensor};

const LP: [f64; 6] = [-0.5, -1.0, -0.25, -2.0, -0.75, 0.0];
const OLD: [f64; 6] = [-0.55, -0.9, -0.25, -2.1, -0.7, 0.0];
const REF: [f64; 6] = [-0.6, -1.2, -0.5, -2.3, -0.8, 0.0];
const ENT: [f64; 6] = [1.5, 2.0, 0.5, 1.0, 1.25, 0.0];
const MASK: [f64; 6] = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
const ADV: [f64; 2] = [0.7, -0.7];

/// By hand, NexRL's token-mean over the 5 valid tokens: the pg term `−ratio·A`, the
/// entropy term and the k1 KL term `logp − ref`.
fn terms() -> (f64, f64, f64) {
    let (mut pg, mut h, mut kl) = (0.0, 0.0, 0.0);
    for i in 0..5 {
        pg += -(LP[i] - OLD[i]).exp() * ADV[i / 3];
        h += ENT[i];
        kl += LP[i] - REF[i];
    }
    (pg / 5.0, h / 5.0, kl / 5.0)
}

fn cell(dumped: f64) -> Cell {
    let t = |v: &[f64]| Tensor::from_vec(v.to_vec(), (2, 3), &Device::Cpu).unwrap();
    Cell {
        file: "w/is_loss_debug/step_000000_rank0_micro0.pt".into(),
        layout: Layout::Weaver,
        step: 0,
        rank: 0,
        micro: 0,
        inputs: LossInputs {
            log_probs: t(&LP),
            old_log_probs: Some(t(&OLD)),
            ref_log_probs: Some(t(&REF)),
            advantages: Tensor::from_vec(ADV.to_vec(), 2, &Device::Cpu).unwrap(),
            mask: t(&MASK),
            entropy: Some(t(&ENT)),
            rollout_log_probs: None,
        },
        entropy_dtype: None,
        logprob_dtype: None,
        dumped_loss: dumped,
        record: None,
        kl_loss: None,
        stated: Stated::default(),
        ratio: None,
        per_token: None,
        notes: Vec::new(),
        advantage_rows: None,
    }
}

fn judged(dumped: f64, unstated: Unstated) -> Verdict {
    let cfg = preset("nexrl-is").unwrap();
    let resolved = Resolved {
        conventions: vec![Convention::new("agg", cfg.agg.name(), None, Source::Flag)],
        cfg,
        uncertainty: Default::default(),
        total_uncertainty: Default::default(),
        unstated,
        cells: 1,
        agg_rival: None,
        own_pg_mode: None,
    };
    judge_under(&cell(dumped), &resolved, &Tolerance::default()).unwrap()
}

const BOTH: Unstated = Unstated {
    entropy: true,
    kl: true,
};

#[test]
fn a_total_an_unstated_coefficient_explains_is_undetermined() {
    let (pg, h, kl) = terms();
    assert!(h > 0.0 && kl > 0.0);
    let v = judged(pg + 0.001 * kl, BOTH);
    assert_eq!(v.status, Status::Undetermined, "{}", v.line());
    // (loss − pg)/kl_loss: 0.001 up to the last bit, printed either way
    let line = v.line();
    assert!(
        line.contains("kl_coef 1e-3 (K1)") || line.contains("kl_coef 0.001 (K1)"),
        "{line}"
    );
    assert!((v.recomputed_loss - pg).abs() < 1e-12);
    let v = judged(pg - 1e-4 * h, BOTH);
    assert_eq!(v.status, Status::Undetermined, "{}", v.line());
    assert!(v.line().contains("entropy_coeff 1e-4"), "{}", v.line());
    // the entropy coefficient stated (0 here): only a KL term may explain the total
    let kl_only = Unstated {
        entropy: false,
        kl: true,
    };
    assert_eq!(judged(pg - 1e-4 * h, kl_only).status, Status::Inconsistent);
    assert_eq!(
        judged(pg + 0.001 * kl, kl_only).status,
        Status::Undetermined
    );
}

#[test]
fn a_total_no_coefficient_in_range_explains_stays_inconsistent() {
    let (pg, h, kl) = terms();
    // entropy_coeff 3 (> MAX_COEF); every KL estimator is ≥ 0 here, so a lower total
    // is no KL term
    assert_eq!(judged(pg - 3.0 * h, BOTH).status, Status::Inconsistent);
    // a higher total: a negative entropy coefficient, or a KL coefficient above 1 (k1
    // is the largest estimator here: k2 and k3 are second order in logp − ref)
    assert!(2.0 * h / kl > MAX_COEF);
    assert_eq!(judged(pg + 2.0 * h, BOTH).status, Status::Inconsistent);
    // nothing unstated: the total is judged and does not follow
    assert_eq!(
        judged(pg + 0.001 * kl, Unstated::default()).status,
        Status::Inconsistent
    );
    // the total that follows is consistent whatever is unstated
    assert_eq!(judged(pg, BOTH).status, Status::Consistent);
}
