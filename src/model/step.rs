//! Per-token batches, loss records and parameters of one rank × micro of a step: what a
//! trainer computed, each tensor with its stored dtype and where it was read from.
//! Tensors are kept as the reader returned them (views of shared storage), never widened
//! to `Vec<f64>` here: a consumer decodes what it reads, chunk by chunk.

use std::collections::BTreeMap;

use crate::model::trajectory::Provenance;
use crate::tensor::{DType, Tensor};

/// Which policy a per-token log-probability was computed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogProbSource {
    /// The inference engine that sampled the tokens (vLLM, SGLang; remote-API `logprobs`).
    Rollout,
    /// The trainer's policy before this step's update (`old_log_probs`).
    Old,
    /// The trainer's current forward pass (`log_probs`).
    Current,
    /// The frozen reference policy (KL penalty).
    Reference,
}

/// One per-token tensor `[rows, T]` with its stored dtype and provenance.
#[derive(Debug, Clone)]
pub struct TokenTensor {
    /// The tensor as read (shared storage; a list is read into an f64/i64 tensor).
    pub tensor: Tensor,
    /// The dtype it was stored in, whose rounding it carries; `None` when the file held a
    /// list of numbers (JSON), which has no stored dtype.
    pub dtype: Option<DType>,
    /// File and key.
    pub source: Provenance,
}

/// The per-token tensors a producer dumped for one micro-batch (or the whole batch).
#[derive(Debug, Clone, Default)]
pub struct TokenBatch {
    /// Log-probabilities by the policy they were computed under.
    pub log_probs: BTreeMap<LogProbSource, TokenTensor>,
    /// Per-token entropy of the current policy.
    pub entropy: Option<TokenTensor>,
    /// 1 on response tokens the loss sees.
    pub response_mask: Option<TokenTensor>,
    /// Token ids `[rows, S]` (prompt + response), the rows' identity.
    pub input_ids: Option<TokenTensor>,
    /// 1 on real (not padding) tokens of `input_ids`.
    pub attention_mask: Option<TokenTensor>,
    /// Per-token advantages.
    pub advantages: Option<TokenTensor>,
    /// The mask the loss averaged over, when it differs from `response_mask` (weaver's
    /// `effective_valid`).
    pub loss_mask: Option<TokenTensor>,
    /// The importance ratio `exp(current − old)` as the trainer computed it.
    pub ratio: Option<TokenTensor>,
    /// The per-token loss before aggregation.
    pub per_token_loss: Option<TokenTensor>,
}

impl TokenBatch {
    /// The log-probs of `source`, when dumped.
    pub fn log_probs(&self, source: LogProbSource) -> Option<&TokenTensor> {
        self.log_probs.get(&source)
    }
}

/// The scalar record of one micro's loss, as dumped: each term the trainer reports and
/// the coefficients it combined them with, when it dumped them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossRecord {
    /// The optimised loss.
    pub loss: Option<f64>,
    /// The policy-gradient term.
    pub pg_loss: Option<f64>,
    /// The entropy term (before its coefficient).
    pub entropy_loss: Option<f64>,
    /// KL terms by name (`kl_loss`, `approx_kl`, …).
    pub kl: BTreeMap<String, f64>,
    /// Coefficients by name (`entropy_coeff`, `kl_coef`, …), when dumped.
    pub coefficients: BTreeMap<String, f64>,
    /// Every other scalar of the record's `metrics`, by key.
    pub metrics: BTreeMap<String, f64>,
    /// File it was read from.
    pub source: Option<Provenance>,
}

/// A parameter or gradient tensor of one rank (and micro, for producers that dump per micro).
#[derive(Debug, Clone)]
pub struct ParamRecord {
    /// Parameter name (`model.layers.0.mlp.up_proj.weight`), when dumped.
    pub name: Option<String>,
    /// The tensor as read.
    pub tensor: TokenTensor,
    /// True for a gradient, false for the parameter itself.
    pub gradient: bool,
}
