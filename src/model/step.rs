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
    /// Per-token rewards (verl `token_level_rewards`; a scalar reward sits on the last
    /// response token).
    pub token_rewards: Option<TokenTensor>,
    /// Per-token importance weights the trainer applied against the engine's log-probs
    /// (verl `rollout_is_weights`, TIS / IcePop weights).
    pub importance_weights: Option<TokenTensor>,
    /// Token ids of the response only `[rows, T]`, aligned with the log-prob columns when
    /// [`TokenBatch::positions`] is [`TokenPositions::Response`] (verl `responses`).
    pub response_ids: Option<TokenTensor>,
    /// What a column of the per-token tensors means.
    pub positions: TokenPositions,
    /// Per-row records (ids, scalar rewards, lengths), one per row, when dumped.
    pub rows: Vec<RowMeta>,
}

/// What column `t` of a batch's per-token tensors refers to. Producers differ: verl and
/// NexRL dump response-only tensors, NeMo-RL dumps whole sequences whose position `t`
/// holds `log p(token t | tokens < t)` with prompt positions 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenPositions {
    /// Column `t` is response token `t` (the producer's `responses` / loss-mask columns).
    #[default]
    Response,
    /// Column `t` is token `t` of prompt + response; the mask selects the response.
    Sequence,
}

/// One row's scalar record: ids, reward, lengths, as the producer dumped them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RowMeta {
    /// The GRPO group / verl `uid` / slime `group_index`, as text.
    pub group: Option<String>,
    /// The producer's own sample id (`idx`, `index`), as text.
    pub sample: Option<String>,
    /// The scalar reward (sequence score).
    pub reward: Option<f64>,
    /// The scalar advantage, when the producer dumps one per row.
    pub advantage: Option<f64>,
    /// Prompt length in tokens.
    pub prompt_len: Option<usize>,
    /// Response length in tokens.
    pub response_len: Option<usize>,
    /// Policy (weight) version that generated the row (AReaL / slime staleness).
    pub version: Option<i64>,
    /// The decoded prompt, when the producer dumps text (verl generations `input`, slime
    /// `prompt`, AReaL `prompt`): what a user reads next to the numbers.
    pub prompt_text: Option<String>,
    /// The decoded response (verl generations `output`, slime `response`, AReaL
    /// `completion`).
    pub response_text: Option<String>,
}

impl LogProbSource {
    /// The model's name of a role (`rollout`, `old`, `current`, `reference`), as every
    /// report prints it.
    pub fn name(self) -> &'static str {
        match self {
            LogProbSource::Rollout => "rollout",
            LogProbSource::Old => "old",
            LogProbSource::Current => "current",
            LogProbSource::Reference => "reference",
        }
    }
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
    /// Where in the file the coefficients were read (NexRL: `extra_info`), for reports
    /// that say where a coefficient came from.
    pub coefficients_at: Option<String>,
}

/// [`LossRecord::coefficients`] name of the entropy bonus's coefficient.
pub const ENTROPY_COEFF: &str = "entropy_coeff";
/// [`LossRecord::coefficients`] name of the KL penalty's coefficient.
pub const KL_COEF: &str = "kl_coef";
/// [`LossRecord::coefficients`] name some trainers give the KL coefficient (verl's
/// `kl_loss_coef`), read as [`KL_COEF`].
pub const KL_LOSS_COEF: &str = "kl_loss_coef";

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

/// One side of one step, as a producer's files hold it: every rank × micro cell, the
/// conventions the files state, and what the producer's mapping could not place.
/// This is what every tool reads; no tool sees a file, a key or a `Value`.
#[derive(Debug, Clone)]
pub struct StepDump {
    /// The producer whose mapping read it (`verl`, `nemo-rl`, `nexrl-self-hosted`, …).
    pub producer: String,
    /// The folder (or file) it was read from.
    pub root: std::path::PathBuf,
    /// The training step (`-1` for a validation-only step where a producer has one).
    pub step: i64,
    /// Every rank × micro cell, sorted by (rank, micro).
    pub cells: Vec<Cell>,
    /// The conventions stated by the files (others are inferred later by the judge).
    pub conventions: crate::model::conventions::Conventions,
    /// Keys or files the mapping saw and did not place, each with its file (never silent).
    pub unplaced: Vec<String>,
}

/// One rank × micro of a step: its per-token batch and its loss record.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    /// Data-parallel rank.
    pub rank: usize,
    /// Micro-batch index; `None` for a whole-batch record (verl's `DataProto` of a step).
    pub micro: Option<usize>,
    /// The per-token tensors.
    pub batch: TokenBatch,
    /// The loss record, when dumped.
    pub loss: Option<LossRecord>,
    /// The files the cell was read from.
    pub files: Vec<std::path::PathBuf>,
}

impl StepDump {
    /// A step held in one whole-batch cell (rank 0, no micro, no loss record), as a
    /// producer that writes a step's batch at once maps it (verl's `DataProto`, NeMo-RL's
    /// train data, AReaL, Miles' dashboard, verl's generations); no conventions stated,
    /// nothing unplaced until the caller says otherwise.
    pub fn whole_batch(
        producer: impl Into<String>,
        root: &std::path::Path,
        step: i64,
        batch: TokenBatch,
        files: Vec<std::path::PathBuf>,
    ) -> StepDump {
        StepDump {
            producer: producer.into(),
            root: root.to_path_buf(),
            step,
            cells: vec![Cell {
                rank: 0,
                micro: None,
                batch,
                loss: None,
                files,
            }],
            conventions: Default::default(),
            unplaced: Vec::new(),
        }
    }

    /// The log-prob roles every cell holds (the roles a comparison of this step can use).
    pub fn roles(&self) -> Vec<LogProbSource> {
        let mut roles: Option<Vec<LogProbSource>> = None;
        for c in &self.cells {
            let here: Vec<LogProbSource> = c.batch.log_probs.keys().copied().collect();
            roles = Some(match roles {
                None => here,
                Some(r) => r.into_iter().filter(|x| here.contains(x)).collect(),
            });
        }
        roles.unwrap_or_default()
    }
}

/// One side of one step handed out cell by cell, so a tool can read a cell, fold it into
/// its sums and drop it before the next: the memory a step costs is then that of the
/// cells in flight, not of the whole step. A [`StepDump`] is one (its cells already in
/// memory); a producer whose files are per cell (NexRL's trees) reads each cell's files
/// only when asked and releases them with the cell.
pub trait StepCells: Sync {
    /// The producer whose mapping reads it.
    fn producer(&self) -> &str;
    /// The folder (or file) it is read from.
    fn root(&self) -> &std::path::Path;
    /// The training step.
    fn step(&self) -> i64;
    /// The `(rank, micro)` of every cell, sorted.
    fn keys(&self) -> Vec<(usize, Option<usize>)>;
    /// Cell `i` (of [`StepCells::keys`]), borrowed when already in memory, else read now.
    ///
    /// Errors: a file of the cell unreadable or not of the expected shape (named with its
    /// position).
    fn cell(&self, i: usize) -> crate::error::Result<std::borrow::Cow<'_, Cell>>;
}

impl StepCells for StepDump {
    fn producer(&self) -> &str {
        &self.producer
    }
    fn root(&self) -> &std::path::Path {
        &self.root
    }
    fn step(&self) -> i64 {
        self.step
    }
    fn keys(&self) -> Vec<(usize, Option<usize>)> {
        self.cells.iter().map(|c| (c.rank, c.micro)).collect()
    }
    fn cell(&self, i: usize) -> crate::error::Result<std::borrow::Cow<'_, Cell>> {
        Ok(std::borrow::Cow::Borrowed(&self.cells[i]))
    }
}
