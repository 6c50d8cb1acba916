//! The weaver trainer (SPEC §2): `forward_data/step_N_rankR_microM` (the keys NexRL's
//! self-hosted trainer uses), `is_loss_debug/` (the importance-sampling loss's
//! intermediates), `loss/`, `batch_inputs/` (the micro's model inputs) and per-micro
//! `param/`, `gradient/`.

pub use crate::producers::nexrl_self_hosted::{
    loss_record, ENTROPY, ENTROPY_COEFF, ENTROPY_LOSS, EXTRA_INFO, INPUT_IDS, LOG_PROBS, LOSS,
    METRICS, OLD_LOG_PROBS, PG_LOSS, REF_LOG_PROBS, RESPONSE_MASK,
};

use std::path::Path;

use crate::error::Result;
use crate::model::step::{LogProbSource, LossRecord, ParamRecord, TokenBatch};
use crate::model::tree::Kind;
use crate::producers::{opt_tensor, StepMapping};
use crate::value::Value;

/// `is_loss_debug/`: per-token advantages `[mb, T]`.
pub const ADVANTAGES: &str = "advantages";
/// `is_loss_debug/`: `exp(log_probs − old_log_probs)`.
pub const PROB_RATIO: &str = "prob_ratio";
/// `is_loss_debug/`: the clipped surrogate per token.
pub const ELEMENTWISE_LOSS: &str = "elementwise_loss";
/// `is_loss_debug/`: the mask the loss averaged over.
pub const EFFECTIVE_VALID: &str = "effective_valid";
/// The rollout engine's log-probs, when the trainer dumps them beside its own (verl's
/// `rollout_log_probs`, what truncated importance sampling weighs against).
pub const ROLLOUT_LOG_PROBS: &str = "rollout_log_probs";
/// `batch_inputs/`: the micro's attention mask.
pub const ATTENTION_MASK: &str = "attention_mask";
/// Every per-token key of an `is_loss_debug/` file.
pub const IS_LOSS_DEBUG_KEYS: [&str; 6] = [
    LOG_PROBS,
    OLD_LOG_PROBS,
    ADVANTAGES,
    PROB_RATIO,
    ELEMENTWISE_LOSS,
    EFFECTIVE_VALID,
];
/// Where a weaver micro's token ids (its rows' identity) live, in the order they are
/// looked for: `forward_data/input_ids` when the trainer echoes them there, else
/// `batch_inputs/input_ids` (the model's inputs: the datum layout, `tokens[:-1]`).
pub const ROW_IDS: [(Kind, &str); 2] = [
    (Kind::ForwardData, INPUT_IDS),
    (Kind::BatchInputs, INPUT_IDS),
];
/// The keys of a `batch_inputs/` file the model reads.
pub const BATCH_INPUTS_KEYS: [&str; 2] = [INPUT_IDS, ATTENTION_MASK];

/// The per-token batch of an `is_loss_debug/` file: current and old log-probs,
/// advantages, the loss's mask (`effective_valid`), the ratio and the per-token loss.
///
/// Errors: one of them present but not a tensor.
pub fn is_loss_debug(file: &Path, v: &Value) -> Result<TokenBatch> {
    let mut b = TokenBatch {
        advantages: opt_tensor(v, ADVANTAGES, file)?,
        loss_mask: opt_tensor(v, EFFECTIVE_VALID, file)?,
        ratio: opt_tensor(v, PROB_RATIO, file)?,
        per_token_loss: opt_tensor(v, ELEMENTWISE_LOSS, file)?,
        ..TokenBatch::default()
    };
    for (key, source) in [
        (LOG_PROBS, LogProbSource::Current),
        (OLD_LOG_PROBS, LogProbSource::Old),
        (ROLLOUT_LOG_PROBS, LogProbSource::Rollout),
        (REF_LOG_PROBS, LogProbSource::Reference),
    ] {
        if let Some(t) = opt_tensor(v, key, file)? {
            b.log_probs.insert(source, t);
        }
    }
    Ok(b)
}

/// The loss an `is_loss_debug/` file read as `v` dumps beside its intermediates (`loss`,
/// a scalar or a one-element tensor).
///
/// Errors: absent or not a number, naming the key.
pub fn is_loss_debug_loss(file: &Path, v: &Value) -> Result<f64> {
    crate::producers::field(v, LOSS)
        .and_then(crate::producers::scalar_of)
        .ok_or_else(|| {
            crate::error::Error::format(
                file,
                crate::error::Position::Key(LOSS.into()),
                "missing or not a number",
            )
        })
}

/// The model inputs of a `batch_inputs/` file: `input_ids` (the rows' identity when
/// rows are reordered) and `attention_mask`.
///
/// Errors: one of them present but not a tensor.
pub fn batch_inputs(file: &Path, v: &Value) -> Result<TokenBatch> {
    Ok(TokenBatch {
        input_ids: opt_tensor(v, INPUT_IDS, file)?,
        attention_mask: opt_tensor(v, ATTENTION_MASK, file)?,
        ..TokenBatch::default()
    })
}

/// The per-token batch of a weaver `forward_data/` file (NexRL's keys).
pub fn forward_data(file: &Path, v: &Value) -> Result<TokenBatch> {
    crate::producers::nexrl_self_hosted::forward_data(file, v)
}

/// The weaver trainer's [`StepMapping`].
pub struct Weaver;

impl StepMapping for Weaver {
    fn conventions(
        &self,
        kind: Kind,
        file: &Path,
        v: &Value,
        c: &mut crate::model::conventions::Conventions,
    ) -> Result<()> {
        crate::producers::nexrl_self_hosted::loss_conventions(kind, file, v, c)
    }

    fn token_batch(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<TokenBatch>> {
        match kind {
            Kind::ForwardData => forward_data(file, v).map(Some),
            Kind::IsLossDebug => is_loss_debug(file, v).map(Some),
            Kind::BatchInputs => batch_inputs(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn loss_record(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<LossRecord>> {
        match kind {
            Kind::Loss => loss_record(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn param(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<ParamRecord>> {
        crate::producers::nexrl_self_hosted::param(kind, file, v)
    }
}

impl super::StepReader for Weaver {
    fn name(&self) -> &'static str {
        "nexrl-weaver"
    }

    fn detect(&self, root: &Path) -> bool {
        super::nexrl_tree::detect(root, crate::model::tree::Producer::Weaver)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        super::nexrl_tree::steps(root)
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<crate::model::step::StepDump> {
        super::nexrl_tree::read_step(root, step, self.name())
    }

    fn open_step(&self, root: &Path, step: i64) -> Result<Box<dyn crate::model::step::StepCells>> {
        Ok(Box::new(super::nexrl_tree::open_step(
            root,
            step,
            self.name(),
        )?))
    }
}
