//! SGLang's dumper (also used by Miles on its Megatron side) mapped into the model
//! ([`StepDump`]).
//!
//! What it writes (sgl-project/sglang 00d35548c30a58ac5925d3b59d01c634120d8d98,
//! `python/sglang/srt/debug_utils/dumper.py`, `_Dumper._dump_single`): one file per
//! `dumper.dump(name, value, **tags)` call, `{dir}/{exp_name}/` + `"___".join(f"{k}={v}")`
//! over `step, rank, dump_index, name, recompute_status, **tags` + `.pt`, holding
//! `torch.save({"value": tensor, "meta": {those keys, world_rank, world_size, …}})`.
//! `step` counts `dumper.step()` calls; `rank` is the global rank; `dump_index` counts
//! dumps per process.
//!
//! The tensor names are the user's. The names below are read into the model (the first
//! spelling of each is the one verl and slime use); any other name is listed as not
//! placed — a declarative mapping (TOML) can name them. Per-token tensors
//! are `[rows, T]` over response tokens ([`TokenPositions::Response`]). The same name
//! dumped several times by one rank in one step (once per micro-batch) gives micro-batch
//! cells in `dump_index` order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{walk, StepReader};
use crate::error::{Error, Position, Result};
use crate::model::step::{Cell, LogProbSource, StepDump, TokenBatch, TokenTensor};
use crate::model::trajectory::Provenance;
use crate::value::Value;

/// Where a dumped name goes in a [`TokenBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Log-probs of a role.
    LogProbs(LogProbSource),
    /// `input_ids`.
    InputIds,
    /// `response_ids`.
    ResponseIds,
    /// `response_mask`.
    ResponseMask,
    /// `attention_mask`.
    AttentionMask,
    /// `advantages`.
    Advantages,
    /// `entropy`.
    Entropy,
    /// `loss_mask`.
    LossMask,
    /// Per-token importance weights (TIS / `rollout_is_weights`).
    ImportanceWeights,
    /// The per-token loss the trainer computed.
    PerTokenLoss,
}

/// The tensor names read, and where each goes.
pub const NAMES: [(&str, Field); 16] = [
    ("rollout_log_probs", Field::LogProbs(LogProbSource::Rollout)),
    ("rollout_logprobs", Field::LogProbs(LogProbSource::Rollout)),
    ("old_log_probs", Field::LogProbs(LogProbSource::Old)),
    ("old_logprobs", Field::LogProbs(LogProbSource::Old)),
    ("log_probs", Field::LogProbs(LogProbSource::Current)),
    ("ref_log_probs", Field::LogProbs(LogProbSource::Reference)),
    ("ref_log_prob", Field::LogProbs(LogProbSource::Reference)),
    ("input_ids", Field::InputIds),
    ("response_ids", Field::ResponseIds),
    ("responses", Field::ResponseIds),
    ("response_mask", Field::ResponseMask),
    ("attention_mask", Field::AttentionMask),
    ("advantages", Field::Advantages),
    ("entropy", Field::Entropy),
    ("loss_mask", Field::LossMask),
    ("loss_masks", Field::LossMask),
];

/// Put `t` in its field of `b`.
pub fn place(b: &mut TokenBatch, f: Field, t: TokenTensor) {
    match f {
        Field::LogProbs(r) => {
            b.log_probs.insert(r, t);
        }
        Field::InputIds => b.input_ids = Some(t),
        Field::ResponseIds => b.response_ids = Some(t),
        Field::ResponseMask => b.response_mask = Some(t),
        Field::AttentionMask => b.attention_mask = Some(t),
        Field::Advantages => b.advantages = Some(t),
        Field::Entropy => b.entropy = Some(t),
        Field::LossMask => b.loss_mask = Some(t),
        Field::ImportanceWeights => b.importance_weights = Some(t),
        Field::PerTokenLoss => b.per_token_loss = Some(t),
    }
}

/// The SGLang dumper producer.
pub struct SglangDumper;

/// The `k=v` tags of a dumper file name, `None` when it is not one.
pub fn name_tags(p: &Path) -> Option<BTreeMap<String, String>> {
    let stem = p.file_name()?.to_str()?.strip_suffix(".pt")?;
    let tags: BTreeMap<String, String> = stem
        .split("___")
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect::<Option<_>>()?;
    ["step", "rank", "dump_index", "name"]
        .iter()
        .all(|k| tags.contains_key(*k))
        .then_some(tags)
}

/// A dumper file: its step, rank, dump index and name.
struct Entry {
    path: PathBuf,
    step: i64,
    rank: usize,
    index: i64,
    name: String,
}

fn entries(root: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for p in walk::files_under(root)? {
        let Some(t) = name_tags(&p) else { continue };
        let num = |k: &str| t.get(k).and_then(|v| v.parse::<i64>().ok());
        let (Some(step), Some(rank), Some(index)) = (num("step"), num("rank"), num("dump_index"))
        else {
            return Err(Error::format(
                &p,
                Position::File,
                "step, rank and dump_index in the name must be integers",
            ));
        };
        out.push(Entry {
            step,
            rank: rank.max(0) as usize,
            index,
            name: t["name"].clone(),
            path: p,
        });
    }
    Ok(out)
}

impl StepReader for SglangDumper {
    fn name(&self) -> &'static str {
        "sglang-dumper"
    }

    fn detect(&self, root: &Path) -> bool {
        walk::files_under(root)
            .map(|fs| fs.iter().any(|p| name_tags(p).is_some()))
            .unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        let s: BTreeSet<i64> = entries(root)?.iter().map(|e| e.step).collect();
        Ok(s.into_iter().collect())
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let all = entries(root)?;
        let steps: BTreeSet<i64> = all.iter().map(|e| e.step).collect();
        let mut mine: Vec<Entry> = all.into_iter().filter(|e| e.step == step).collect();
        if mine.is_empty() {
            return Err(Error::input(
                root,
                format!("no dumper file of step {step} (steps there: {steps:?})"),
            ));
        }
        mine.sort_by_key(|e| (e.rank, e.index));
        // Micro-batch k of a rank = the k-th dump of each name by that rank.
        let mut seen: BTreeMap<(usize, String), usize> = BTreeMap::new();
        let mut cells: BTreeMap<(usize, usize), Cell> = BTreeMap::new();
        let mut unplaced = Vec::new();
        for e in &mine {
            let field = NAMES.iter().find(|(n, _)| *n == e.name).map(|(_, f)| *f);
            let Some(field) = field else {
                unplaced.push(format!("{}: name {}", e.path.display(), e.name));
                continue;
            };
            let k = seen.entry((e.rank, e.name.clone())).or_insert(0);
            let micro = *k;
            *k += 1;
            let v = crate::formats::pt::read_pt(&e.path)?;
            let t = match super::field(&v, "value") {
                Some(Value::Tensor(t)) => t.clone(),
                Some(other) => return Err(super::unreadable(&e.path, "value", "a tensor", other)),
                None => {
                    return Err(Error::format(
                        &e.path,
                        Position::Key("value".into()),
                        "missing: no such key",
                    ))
                }
            };
            let tt = TokenTensor {
                dtype: Some(t.dtype()),
                tensor: t,
                source: Provenance {
                    file: e.path.clone(),
                    key: "value".into(),
                },
            };
            let cell = cells.entry((e.rank, micro)).or_insert_with(|| Cell {
                rank: e.rank,
                ..Cell::default()
            });
            cell.micro = Some(micro);
            cell.files.push(e.path.clone());
            place(&mut cell.batch, field, tt);
        }
        // A rank that dumped each name once has whole-batch cells, not micro-batches.
        let mut cells: Vec<Cell> = cells.into_values().collect();
        let multi: BTreeSet<usize> = cells
            .iter()
            .filter(|c| c.micro != Some(0))
            .map(|c| c.rank)
            .collect();
        for c in &mut cells {
            if !multi.contains(&c.rank) {
                c.micro = None;
            }
        }
        Ok(StepDump {
            producer: "sglang-dumper".into(),
            root: root.to_path_buf(),
            step,
            cells,
            conventions: Default::default(),
            unplaced,
        })
    }
}
