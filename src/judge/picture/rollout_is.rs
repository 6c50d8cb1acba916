//! Which importance weights does a side apply against the rollout engine's log-probs?
//! Read off its own dumped values (issue 28: "try the alternatives the evidence allows,
//! keep the one the evidence supports").
//!
//! A weaver cell dumps its per-token loss (`elementwise_loss`), `old_log_probs` and
//! `rollout_log_probs`; under a policy loss without weights the recomputed per-token loss
//! is known, and [`crate::kernels::rollout_is::read`] reads the scheme (token / sequence
//! level, TIS cap or IcePop band, verl 0.9.1 `rollout_corr_helper.py`) off the factors
//! between them. Proposals are only candidates: the policy search
//! ([`super::search_policy`]) judges every cell under each and keeps the one that
//! reproduces the most.

use crate::error::Result;
use crate::kernels::config::LossConfig;
use crate::kernels::loss::compute;
use crate::kernels::rollout_is::read::{push, read_off, tokens_of, IsToken};
use crate::kernels::rollout_is::RolloutIs;
use crate::kernels::to_f64_vec;

use crate::judge::cell::Cell;

/// The relative tolerance of a factor: f32 computation, looser for half-precision dumps
/// (the ratio recomputed from bf16 log-probs moves by `2^-9·(|logp| + |old|)`, over 1 %
/// for log-probs near −3: a proposal only, every cell is judged under it afterwards).
fn rel_tol(cell: &Cell) -> f64 {
    match cell.logprob_dtype {
        Some(crate::tensor::DType::BF16) => 1.6e-2,
        Some(crate::tensor::DType::F16) => 8e-3,
        _ => 1e-4,
    }
}

/// The tokens of a cell as `(dumped, ours, raw_token, raw_sequence)`, valid ones with a
/// recomputed loss clear of 0; `None` when the cell dumps no per-token loss, old or
/// rollout log-probs, or shapes differ.
fn tokens(cell: &Cell, plain: &LossConfig) -> Option<Vec<IsToken>> {
    let dumped = cell.per_token.as_ref()?;
    let old = to_f64_vec(cell.inputs.old_log_probs.as_ref()?).ok()?;
    let ro = to_f64_vec(cell.inputs.rollout_log_probs.as_ref()?).ok()?;
    let mask = to_f64_vec(&cell.inputs.mask).ok()?;
    let (rows, width) = cell.dims();
    let mut cfg = plain.clone();
    cfg.rollout_is = None;
    let out = compute(&cell.inputs, &cfg).ok()?;
    let ours = to_f64_vec(&out.per_token_loss).ok()?;
    let u = match cell.logprob_dtype {
        Some(crate::tensor::DType::BF16) => 2f64.powi(-9),
        Some(crate::tensor::DType::F16) => 2f64.powi(-12),
        _ => 0.0,
    };
    tokens_of(dumped, &ours, &old, &ro, &mask, rows, width, u)
}

/// The schemes the step's cells allow, best supported first ([`read_off`] under each
/// policy of `policies`, without weights; a scheme several policies give keeps the
/// evidence of the most cells), with the evidence in words.
pub(super) fn propose(cells: &[Cell], policies: &[LossConfig]) -> Result<Vec<(RolloutIs, String)>> {
    let mut out: Vec<(RolloutIs, String, usize)> = Vec::new();
    for plain in policies {
        let per_cell: Vec<(Vec<IsToken>, f64)> = cells
            .iter()
            .filter_map(|c| tokens(c, plain).map(|t| (t, rel_tol(c))))
            .collect();
        if per_cell.is_empty() {
            continue;
        }
        for (is, why, n) in read_off(&per_cell) {
            push(&mut out, is, why, n);
        }
    }
    out.sort_by_key(|x| std::cmp::Reverse(x.2));
    Ok(out.into_iter().map(|(i, w, _)| (i, w)).collect())
}
