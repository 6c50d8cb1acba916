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

/// Free-standing loss inputs as a producer: one file (`losscheck --inputs FILE`) read as
/// one step (0) of one cell (rank 0, the whole batch), its rewards and group ids as the
/// rows' records.
pub struct LooseTensors;

impl super::StepReader for LooseTensors {
    fn name(&self) -> &'static str {
        "loose-tensors"
    }

    /// A file whose dict holds `log_probs` (or `in.log_probs`): read to tell, since its
    /// name says nothing.
    fn detect(&self, root: &Path) -> bool {
        root.is_file()
            && crate::formats::read_any(root).is_ok_and(|v| {
                field(&v, LOG_PROBS).is_some()
                    || field(&v, &format!("{INPUT_PREFIX}{LOG_PROBS}")).is_some()
            })
    }

    fn steps(&self, _root: &Path) -> Result<Vec<i64>> {
        Ok(vec![0])
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<crate::model::step::StepDump> {
        if step != 0 {
            return Err(crate::error::Error::input(
                root,
                format!("a loose-tensors file holds one step, 0 (asked for {step})"),
            ));
        }
        let v = crate::formats::read_any(root)?;
        let li = inputs(root, &v)?;
        let mut batch = li.batch;
        let rewards = li.rewards.map(|t| t.tensor.to_f64_vec());
        let groups = li.group_ids.map(|t| t.tensor.to_i64_vec());
        let n = rewards
            .as_ref()
            .map(Vec::len)
            .or(groups.as_ref().map(Vec::len))
            .unwrap_or(0);
        batch.rows = (0..n)
            .map(|i| crate::model::step::RowMeta {
                reward: rewards.as_ref().and_then(|r| r.get(i).copied()),
                group: groups.as_ref().and_then(|g| g.get(i)).map(i64::to_string),
                ..Default::default()
            })
            .collect();
        Ok(crate::model::step::StepDump {
            producer: self.name().to_string(),
            root: root.to_path_buf(),
            step,
            cells: vec![crate::model::step::Cell {
                rank: 0,
                micro: None,
                batch,
                loss: None,
                files: vec![root.to_path_buf()],
            }],
            conventions: Default::default(),
            unplaced: Vec::new(),
        })
    }
}
