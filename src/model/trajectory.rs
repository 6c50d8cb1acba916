//! Trajectories and datums: the rows of a step before the trainer batches them, as the
//! producers' mappings ([`crate::producers`]) read them from any dump layout.

use std::path::PathBuf;

use crate::model::tokens::{TokenSeq, TokensHasher};

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
    /// Which of `group_id`, `uid`, `run_id`, `task_id` (in that order) were dumped as
    /// integers: NexRL orders its batch by them, integers numerically and the rest as
    /// text ([`nexrl_batch_order`]).
    pub int_ids: [bool; 4],
}

/// One id as NexRL's `_stable_sort_key` orders it: integers first, numerically, then
/// everything else by its text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum SortId {
    Int(i64),
    Text(String),
}

fn sort_id(text: &str, int: bool) -> SortId {
    match (int, text.parse::<i64>()) {
        (true, Ok(i)) => SortId::Int(i),
        _ => SortId::Text(text.to_string()),
    }
}

/// The order NexRL's self-hosted GRPO trainer puts the step's batch in before it computes
/// `old_log_probs` and advantages (`nexrl/trainer/self_hosted_grpo_trainer.py`,
/// `_reorder_batch_by_group_and_run_id`, nex-agi/NexRL@6860191): sorted by `(task_id`
/// when present else the group`, group, int(run_id), arrival index)`, the group being
/// `uid` when the batch has it, else `group_id`. Its `trajectory/` file is dumped in
/// `train()` before that, in the order the rollouts arrived. Returns the permutation
/// (batch position → trajectory index), or `None` when NexRL leaves the batch as it
/// arrived (no group key or no `run_id`) or the order is the file's own.
pub fn nexrl_batch_order(rows: &[TrajectoryIds]) -> Option<Vec<usize>> {
    let first = rows.first()?;
    let by_uid = first.uid.is_some();
    let has_task = first.task_id.is_some();
    if first.run_id.is_none() || !(by_uid || first.group_id.is_some()) {
        return None;
    }
    let mut keys = Vec::with_capacity(rows.len());
    for (i, ids) in rows.iter().enumerate() {
        let group = if by_uid {
            sort_id(ids.uid.as_deref()?, ids.int_ids[1])
        } else {
            sort_id(ids.group_id.as_deref()?, ids.int_ids[0])
        };
        let primary = if has_task {
            sort_id(ids.task_id.as_deref()?, ids.int_ids[3])
        } else {
            group.clone()
        };
        // Python's int(): an integer or a numeric string; anything else counts as 0
        let run = ids
            .run_id
            .as_deref()
            .and_then(|r| r.trim().parse::<i64>().ok())
            .unwrap_or(0);
        keys.push((primary, group, run, i));
    }
    keys.sort();
    let perm: Vec<usize> = keys.into_iter().map(|k| k.3).collect();
    (!perm.iter().enumerate().all(|(j, i)| j == *i)).then_some(perm)
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
        // The masked ids hashed as they stream by, a block at a time (the bytes of
        // `tokens_hash` of their copy); ids past the shorter of the two are not paired.
        let n = tokens.len().min(mask.len());
        let mut h = TokensHasher::new();
        let (mut tb, mut mb) = ([0i64; 512], [0i64; 512]);
        let (mut at, mut any) = (0, false);
        while at < n {
            let k = tokens.widen_block(at, &mut tb[..(n - at).min(512)]);
            let k = mask.widen_block(at, &mut mb[..k]);
            if k == 0 {
                break;
            }
            for (&t, &m) in tb[..k].iter().zip(&mb[..k]) {
                if m != 0 {
                    h.push(t);
                    any = true;
                }
            }
            at += k;
        }
        any.then(|| h.finish())
    }

    /// How many tokens are under a nonzero `loss_mask` (paired with `tokens` as in
    /// [`Trajectory::response_hash`]): the response length a trainer row of this
    /// trajectory shows in its `response_mask`. `None` without tokens or mask.
    pub fn response_len(&self) -> Option<usize> {
        let (tokens, mask) = (self.tokens.as_ref()?, self.loss_mask.as_ref()?);
        let n = tokens.len().min(mask.len());
        let mut mb = [0i64; 512];
        let (mut at, mut count) = (0, 0);
        while at < n {
            let k = mask.widen_block(at, &mut mb[..(n - at).min(512)]);
            if k == 0 {
                break;
            }
            count += mb[..k].iter().filter(|m| **m != 0).count();
            at += k;
        }
        Some(count)
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
    /// `tokens_hash(tokens[:-1])` (the datum layout's input tokens); `None` when `tokens`
    /// is missing or shorter than two.
    pub tokens_short: Option<u64>,
    /// [`Trajectory::response_hash`].
    pub response: Option<u64>,
    /// [`Trajectory::response_len`].
    pub response_len: Option<usize>,
    /// [`Trajectory::reward`].
    pub reward: Option<f64>,
    /// [`Trajectory::group`].
    pub group: Option<String>,
    /// [`Trajectory::ids`].
    pub ids: TrajectoryIds,
}

impl TrajectoryRow {
    /// The summary of one trajectory.
    pub fn of(t: &Trajectory<'_>) -> TrajectoryRow {
        TrajectoryRow {
            tokens: t.tokens.as_ref().map(TokenSeq::hash),
            tokens_short: t
                .tokens
                .as_ref()
                .filter(|x| x.len() > 1)
                .map(|x| crate::model::tokens::tokens_hash_iter(x.iter().take(x.len() - 1))),
            response: t.response_hash(),
            response_len: t.response_len(),
            reward: t.reward,
            group: t.group.clone(),
            ids: t.ids.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(uid: &str, run: i64, task: Option<i64>) -> TrajectoryIds {
        TrajectoryIds {
            group_id: Some(format!("g-{uid}")),
            uid: Some(uid.to_string()),
            run_id: Some(run.to_string()),
            task_id: task.map(|t| t.to_string()),
            int_ids: [false, false, true, true],
        }
    }

    #[test]
    fn nexrl_sorts_by_task_then_group_then_run() {
        // arrival: (task 1, run 1), (task 0, run 1), (task 1, run 0), (task 0, run 0),
        // task 10 (numeric: after 1, not between 1 and 2 as text would put it)
        let rows = [
            ids("b", 1, Some(1)),
            ids("a", 1, Some(0)),
            ids("b", 0, Some(1)),
            ids("a", 0, Some(0)),
            ids("z", 0, Some(10)),
            ids("c", 0, Some(2)),
        ];
        assert_eq!(nexrl_batch_order(&rows), Some(vec![3, 1, 2, 0, 5, 4]));
        // without task_id the uid orders (as text), then run_id
        let rows: Vec<TrajectoryIds> = [("b", 1), ("a", 1), ("b", 0), ("a", 0)]
            .iter()
            .map(|(u, r)| ids(u, *r, None))
            .collect();
        assert_eq!(nexrl_batch_order(&rows), Some(vec![3, 1, 2, 0]));
        // no run_id: NexRL leaves the batch as it arrived
        let rows: Vec<TrajectoryIds> = rows
            .into_iter()
            .map(|mut i| {
                i.run_id = None;
                i
            })
            .collect();
        assert_eq!(nexrl_batch_order(&rows), None);
        // already in order
        let rows = [ids("a", 0, Some(0)), ids("a", 1, Some(0))];
        assert_eq!(nexrl_batch_order(&rows), None);
    }
    use crate::model::tokens::tokens_hash;
    use crate::value::Ints;

    fn traj<'v>(tokens: TokenSeq<'v>, mask: TokenSeq<'v>) -> Trajectory<'v> {
        Trajectory {
            index: 0,
            tokens: Some(tokens),
            loss_mask: Some(mask),
            reward: None,
            advantage: None,
            group: None,
            ids: TrajectoryIds::default(),
            is_val: None,
        }
    }

    /// The response hash is that of the masked ids' copy, whether the lists are packed or
    /// owned, across the 512-id blocks, with a mask shorter or longer than the tokens.
    #[test]
    fn response_hash_is_the_hash_of_the_masked_ids() {
        let tokens: Vec<i64> = (0..1300).map(|i| 1000 + (i * 37) % 4000).collect();
        for mask_len in [1300usize, 700, 1500] {
            let mask: Vec<i64> = (0..mask_len as i64)
                .map(|i| i64::from(i % 3 != 0 && i > 40))
                .collect();
            let masked: Vec<i64> = tokens
                .iter()
                .zip(&mask)
                .filter(|(_, &m)| m != 0)
                .map(|(&t, _)| t)
                .collect();
            let want = Some(tokens_hash(&masked));
            let packed_t = Ints::U16(tokens.iter().map(|&x| x as u16).collect());
            let packed_m = Ints::U8(mask.iter().map(|&x| x as u8).collect());
            let t = traj(TokenSeq::Packed(&packed_t), TokenSeq::Packed(&packed_m));
            assert_eq!(t.response_hash(), want, "mask {mask_len}");
            let t = traj(TokenSeq::Owned(tokens.clone()), TokenSeq::Packed(&packed_m));
            assert_eq!(t.response_hash(), want, "mask {mask_len}");
        }
        // No id masked in: no response.
        let zeros = Ints::U8(vec![0; 600]);
        let t = traj(TokenSeq::Owned(tokens.clone()), TokenSeq::Packed(&zeros));
        assert_eq!(t.response_hash(), None);
    }
}
