//! Free-standing loss inputs (`losscheck --inputs FILE`): one dict of tensors in any
//! container (`.safetensors`, `.pt`, `.npz`, `.jsonl`), the shape a user exports from a
//! notebook or a trainer hook. Keys may carry an `in.` prefix (the layout of
//! `fixtures/kernels/*.safetensors`).

use std::path::Path;

use crate::error::Result;
use crate::model::step::{LogProbSource, TokenBatch, TokenTensor};
use crate::producers::{field, opt_tensor};
use crate::value::Value;

/// Current-policy log-probs.
pub const LOG_PROBS: &str = "log_probs";
/// Old-policy log-probs.
pub const OLD_LOG_PROBS: &str = "old_log_probs";
/// Reference-policy log-probs.
pub const REF_LOG_PROBS: &str = "ref_log_probs";
/// Per-token entropy.
pub const ENTROPY: &str = "entropy";
/// Advantages `[B]` or `[B, T]`.
pub const ADVANTAGES: &str = "advantages";
/// Rewards `[B]` (advantages recomputed from them and `group_ids` when absent).
pub const REWARDS: &str = "rewards";
/// Group ids `[B]`.
pub const GROUP_IDS: &str = "group_ids";
/// The loss mask's spellings, the first present wins.
pub const MASK_ALIASES: [&str; 4] = ["mask", "response_mask", "loss_mask", "effective_valid"];
/// The prefix `fixtures/kernels/*.safetensors` put on input keys.
pub const INPUT_PREFIX: &str = "in.";

/// What a free-standing inputs file holds.
#[derive(Debug, Clone, Default)]
pub struct LooseInputs {
    /// Log-probs by source, entropy, advantages and the mask (`loss_mask`).
    pub batch: TokenBatch,
    /// Rewards `[B]`.
    pub rewards: Option<TokenTensor>,
    /// Group ids `[B]`.
    pub group_ids: Option<TokenTensor>,
    /// The key the mask was read from, when one was.
    pub mask_key: Option<&'static str>,
}

/// Map a free-standing inputs dict read from `file`.
///
/// Errors: a key present but not a tensor.
pub fn inputs(file: &Path, v: &Value) -> Result<LooseInputs> {
    let stripped = strip_prefix(v);
    let v = stripped.as_ref().unwrap_or(v);
    let mut batch = TokenBatch {
        entropy: opt_tensor(v, ENTROPY, file)?,
        advantages: opt_tensor(v, ADVANTAGES, file)?,
        ..TokenBatch::default()
    };
    for (key, source) in [
        (LOG_PROBS, LogProbSource::Current),
        (OLD_LOG_PROBS, LogProbSource::Old),
        (REF_LOG_PROBS, LogProbSource::Reference),
    ] {
        if let Some(t) = opt_tensor(v, key, file)? {
            batch.log_probs.insert(source, t);
        }
    }
    let mask_key = MASK_ALIASES.into_iter().find(|k| field(v, k).is_some());
    if let Some(k) = mask_key {
        batch.loss_mask = opt_tensor(v, k, file)?;
    }
    Ok(LooseInputs {
        batch,
        rewards: opt_tensor(v, REWARDS, file)?,
        group_ids: opt_tensor(v, GROUP_IDS, file)?,
        mask_key,
    })
}

/// A copy of a dict whose `in.`-prefixed keys lose the prefix (the others dropped);
/// `None` when no key has it.
fn strip_prefix(v: &Value) -> Option<Value> {
    let items = v.as_dict()?;
    if !items
        .iter()
        .any(|(k, _)| k.as_str().is_some_and(|s| s.starts_with(INPUT_PREFIX)))
    {
        return None;
    }
    Some(Value::Dict(
        items
            .iter()
            .filter_map(|(k, x)| {
                let s = k.as_str()?.strip_prefix(INPUT_PREFIX)?;
                Some((Value::Str(s.to_string()), x.clone()))
            })
            .collect(),
    ))
}
