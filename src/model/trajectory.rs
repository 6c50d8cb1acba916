//! Trajectories and datums: the rows of a step before the trainer batches them, as the
//! producers' mappings ([`crate::readers::producers`]) read them from any dump layout.

use std::path::PathBuf;

use crate::model::tokens::{tokens_hash_iter, TokenSeq};

/// Where a record was read from: the file and the key path inside it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Provenance {
    /// The dump file.
    pub file: PathBuf,
    /// The key (path) inside it, e.g. `trajectories` or `forward_data.log_probs`.
    pub key: String,
}

/// The id fields a producer attaches to a trajectory, as text whatever type it used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrajectoryIds {
    /// The GRPO group (same prompt), as the producer names it.
    pub group_id: Option<String>,
    /// verl / NexRL `uid` (also a group key).
    pub uid: Option<String>,
    /// The rollout run.
    pub run_id: Option<String>,
    /// The task (prompt) id.
    pub task_id: Option<String>,
}

/// One trajectory: prompt + response tokens, which of them the loss sees, its reward,
/// group and (when the producer dumps one) advantage.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory<'v> {
    /// Position in its file.
    pub index: usize,
    /// Prompt + response token ids (`None`: not dumped).
    pub tokens: Option<TokenSeq<'v>>,
    /// 1 on the tokens the loss sees (the response).
    pub loss_mask: Option<TokenSeq<'v>>,
    /// The scalar reward.
    pub reward: Option<f64>,
    /// The trajectory's advantage, when the producer dumps it.
    pub advantage: Option<f64>,
    /// The advantage-normalisation group (the first id the producer groups by).
    pub group: Option<String>,
    /// Every id field as dumped.
    pub ids: TrajectoryIds,
    /// Validation rollout flag.
    pub is_val: Option<bool>,
}

impl Trajectory<'_> {
    /// [`tokens_hash`] of the tokens under a nonzero `loss_mask` (the response); `None`
    /// when either is missing or no token is masked in.
    pub fn response_hash(&self) -> Option<u64> {
        let (tokens, mask) = (self.tokens.as_ref()?, self.loss_mask.as_ref()?);
        // hashed as the masked ids stream by (the bytes of `tokens_hash` of their copy)
        let mut any = false;
        let h = tokens_hash_iter(tokens.iter().zip(mask.iter()).filter(|(_, m)| *m != 0).map(
            |(x, _)| {
                any = true;
                x
            },
        ));
        any.then_some(h)
    }
}

/// The trajectories of one file.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajectoryBatch<'v> {
    /// The file and key they were read from.
    pub source: Provenance,
    /// In file order.
    pub rows: Vec<Trajectory<'v>>,
    /// A batch-level `advantages` list (one per trajectory), when the file holds one.
    pub batch_advantages: Option<Vec<f64>>,
}

/// One datum of a remote-API training call: a trajectory shifted by one token
/// (`input_tokens = tokens[:-1]`, `target_tokens[t] = tokens[t+1]`) with per-token inputs
/// of the loss at `t` describing `tokens[t+1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Datum<'v> {
    /// Position in its file.
    pub index: usize,
    /// `tokens[:-1]`.
    pub input_tokens: Option<TokenSeq<'v>>,
    /// `tokens[1:]`.
    pub target_tokens: Option<TokenSeq<'v>>,
    /// Log-prob of `target_tokens[t]` under the sampling (rollout) policy.
    pub logprobs: Option<Vec<f64>>,
    /// The trajectory's advantage at each position.
    pub advantages: Option<Vec<f64>>,
    /// 1.0 where `target_tokens[t]` is a response token.
    pub loss_mask: Option<Vec<f64>>,
}

impl Datum<'_> {
    /// The full sequence: the inputs plus the last target (the inputs alone without targets).
    pub fn tokens(&self) -> Option<Vec<i64>> {
        let mut inp = self.input_tokens.as_ref()?.to_vec();
        if let Some(last) = self.target_tokens.as_ref().and_then(|t| t.iter().last()) {
            inp.push(last);
        }
        Some(inp)
    }

    /// The advantage at the first masked-in position.
    pub fn first_masked_advantage(&self) -> Option<f64> {
        let (m, a) = (self.loss_mask.as_ref()?, self.advantages.as_ref()?);
        m.iter().zip(a).find(|(&mm, _)| mm != 0.0).map(|(_, &x)| x)
    }
}

/// The datums of one file.
#[derive(Debug, Clone, PartialEq)]
pub struct DatumBatch<'v> {
    /// The file and key they were read from.
    pub source: Provenance,
    /// In file order.
    pub rows: Vec<Datum<'v>>,
}

/// What the per-micro checks need of a trajectory file, without its token lists: each
/// trajectory's token hash, response hash, reward and group, `None` where the file lacks
/// one (the error waits for a check that needs it). dumpdiff and losscheck both read
/// this one summary, so both recompute advantages from the same rewards and groups.
#[derive(Debug, Clone)]
pub struct TrajectorySummary {
    /// The trajectory file, for messages.
    pub file: PathBuf,
    /// One row per trajectory, in file order.
    pub rows: Vec<TrajectoryRow>,
}

/// One trajectory of a [`TrajectorySummary`].
#[derive(Debug, Clone)]
pub struct TrajectoryRow {
    /// `tokens_hash(tokens)`; `None` when `tokens` is missing.
    pub tokens: Option<u64>,
    /// [`Trajectory::response_hash`].
    pub response: Option<u64>,
    /// [`Trajectory::reward`].
    pub reward: Option<f64>,
    /// [`Trajectory::group`].
    pub group: Option<String>,
}

impl TrajectoryRow {
    /// The summary of one trajectory.
    pub fn of(t: &Trajectory<'_>) -> TrajectoryRow {
        TrajectoryRow {
            tokens: t.tokens.as_ref().map(TokenSeq::hash),
            response: t.response_hash(),
            reward: t.reward,
            group: t.group.clone(),
        }
    }
}

impl TrajectorySummary {
    /// Summarise a file's trajectories.
    pub fn of(batch: &TrajectoryBatch<'_>) -> TrajectorySummary {
        let rows = batch.rows.iter().map(TrajectoryRow::of).collect();
        TrajectorySummary {
            file: batch.source.file.clone(),
            rows,
        }
    }
}
