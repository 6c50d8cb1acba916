//! slime's and Miles' debug dumps mapped into the model ([`StepDump`]).
//!
//! What they write (THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515):
//! - `--save-debug-rollout-data T` (`slime/observability/rollout_data_utils.py`,
//!   `save_debug_rollout_data`): `torch.save({"rollout_id", "samples": [Sample.to_dict()]},
//!   T.format(rollout_id))`; evaluation rollouts as `eval_{id}`. A sample holds `tokens`
//!   (prompt ++ response), `response_length`, `loss_mask` and `rollout_log_probs` (the
//!   engine's, response tokens only), `reward`, `group_index`, `index`, `status`,
//!   `weight_versions`.
//! - `--save-debug-train-data T` (`train_data_utils.py`, `_build_dump_payload`),
//!   `format_version` 2: `{"format_version", "rollout_id", "rank", "samples",
//!   "dp_shards", "raw_reward"}`; one sample dict per training sample, sorted by its
//!   position in the rollout dump (`rollout_position`), with its `data_parallel_rank`,
//!   `tokens`, `response_lengths`, `total_lengths`, `loss_masks`, `rollout_log_probs`
//!   (engine), `log_probs` (the trainer's recompute before the update: old),
//!   `ref_log_probs`, `advantages`, `returns`, `rewards`, `kl`, `entropy` — per-token
//!   values over response tokens only ([`TokenPositions::Response`]).
//! - Miles `--dump-details D` = `D/rollout_data/{id}.pt` + `D/train_data/{id}.pt`
//!   (`slime/utils/arguments.py`; radixark/miles the same).
//!
//! Files are recognised by content (a `torch.save` archive whose pickle starts with a
//! `rollout_id` or `format_version` key); the step is the file's `rollout_id`. The sample
//! dicts may hold `Sample.Status` and `Sample.SpecInfo` objects: the restricted unpickler
//! reads them as data (`pt/pickle/globals.rs`, `DATA_CLASSES`). A train dump gives one
//! cell per data-parallel rank; the rollout dump of the same id gives the rows' groups and
//! weight versions.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::columns::{listed, padded_f64, padded_i64};
use super::{walk, StepReader};
use crate::error::{Error, Position, Result};
use crate::model::step::{Cell, LogProbSource, RowMeta, StepDump, TokenBatch, TokenTensor};
use crate::value::Value;

/// Keys of a train dump's sample and where they go.
pub const TRAIN_LOG_PROB_KEYS: [(&str, LogProbSource); 3] = [
    ("rollout_log_probs", LogProbSource::Rollout),
    ("log_probs", LogProbSource::Old),
    ("ref_log_probs", LogProbSource::Reference),
];
const FORMAT_VERSION: &str = "format_version";
const ROLLOUT_ID: &str = "rollout_id";
const SAMPLES: &str = "samples";
/// Keys of a sample this mapping reads (others are listed as not placed).
const KNOWN: [&str; 22] = [
    "tokens",
    "response_length",
    "response_lengths",
    "total_lengths",
    "loss_mask",
    "loss_masks",
    "rollout_log_probs",
    "log_probs",
    "ref_log_probs",
    "entropy",
    "advantages",
    "reward",
    "rewards",
    "group_index",
    "index",
    "sample_index",
    "rollout_position",
    "data_parallel_rank",
    "weight_versions",
    "status",
    "prompt",
    "response",
];

/// The slime (and Miles) producer.
pub struct Slime;

/// Whether `path` is a `torch.save` archive whose pickle starts with slime's keys.
pub fn is_slime_dump(path: &Path) -> bool {
    let h = walk::head(path, 512);
    h.starts_with(b"PK\x03\x04")
        && walk::contains(&h, b"data.pkl")
        && walk::contains(&h, ROLLOUT_ID.as_bytes())
}

fn is_eval(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| n.to_string_lossy().contains("eval_"))
}

/// One dump read: train (format_version present) or rollout, with its rollout id.
struct Dump {
    path: PathBuf,
    train: bool,
    id: i64,
    v: Value,
}

fn read_all(root: &Path) -> Result<(Vec<Dump>, Vec<PathBuf>)> {
    let mut out = Vec::new();
    let mut evals = Vec::new();
    for p in walk::files_under(root)?
        .into_iter()
        .filter(|p| is_slime_dump(p))
    {
        if is_eval(&p) {
            evals.push(p);
            continue;
        }
        let v = crate::formats::pt::read_pt(&p)?;
        let id = v.get(ROLLOUT_ID).and_then(Value::as_i64).ok_or_else(|| {
            Error::format(
                &p,
                Position::Key(ROLLOUT_ID.into()),
                "expected an integer rollout_id",
            )
        })?;
        let train = v.get(FORMAT_VERSION).is_some();
        if train {
            let ver = v.get(FORMAT_VERSION).and_then(Value::as_i64);
            if ver != Some(2) {
                return Err(Error::format(
                    &p,
                    Position::Key(FORMAT_VERSION.into()),
                    format!("train dump format_version {ver:?}: this reader knows version 2"),
                ));
            }
        }
        out.push(Dump {
            path: p,
            train,
            id,
            v,
        });
    }
    Ok((out, evals))
}

impl StepReader for Slime {
    fn name(&self) -> &'static str {
        "slime"
    }

    fn detect(&self, root: &Path) -> bool {
        walk::files_under(root)
            .map(|fs| fs.iter().any(|p| is_slime_dump(p)))
            .unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        let mut s: Vec<i64> = read_all(root)?.0.iter().map(|d| d.id).collect();
        s.sort_unstable();
        s.dedup();
        Ok(s)
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let (all, evals) = read_all(root)?;
        let steps: BTreeSet<i64> = all.iter().map(|d| d.id).collect();
        let mine: Vec<Dump> = all.into_iter().filter(|d| d.id == step).collect();
        let pick = |train: bool| -> Result<Option<&Dump>> {
            let of: Vec<&Dump> = mine.iter().filter(|d| d.train == train).collect();
            match of.as_slice() {
                [] => Ok(None),
                [one] => Ok(Some(*one)),
                [a, b, ..] => Err(Error::input(
                    root,
                    format!(
                        "two {} dumps of rollout {step} ({} and {}): point at one run's folder",
                        if train { "train" } else { "rollout" },
                        a.path.display(),
                        b.path.display()
                    ),
                )),
            }
        };
        let (train, rollout) = (pick(true)?, pick(false)?);
        let mut unplaced: BTreeSet<String> = evals
            .iter()
            .map(|p| format!("{}: evaluation rollout (not a training step)", p.display()))
            .collect();
        let rollout_samples = match rollout {
            Some(d) => Some(super::seq(&d.v, SAMPLES, &d.path)?),
            None => None,
        };
        let cells = match (train, rollout) {
            (Some(t), _) => train_cells(t, rollout_samples, &mut unplaced)?,
            (None, Some(r)) => {
                let samples = rollout_samples.unwrap_or(&[]);
                let all: Vec<&Value> = samples.iter().collect();
                vec![cell(0, &all, &r.path, None, &mut unplaced)?]
            }
            (None, None) => {
                return Err(Error::input(
                    root,
                    format!("no slime dump of rollout {step} (rollout ids there: {steps:?})"),
                ))
            }
        };
        Ok(StepDump {
            producer: "slime".into(),
            root: root.to_path_buf(),
            step,
            cells,
            conventions: Default::default(),
            unplaced: unplaced.into_iter().collect(),
        })
    }
}

/// A train dump's samples grouped into one cell per data-parallel rank (ascending), each
/// in the dump's order.
fn train_cells(
    t: &Dump,
    rollout: Option<&[Value]>,
    unplaced: &mut BTreeSet<String>,
) -> Result<Vec<Cell>> {
    let samples = super::seq(&t.v, SAMPLES, &t.path)?;
    let mut ranks: Vec<i64> = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let r = s
            .get("data_parallel_rank")
            .and_then(Value::as_i64)
            .ok_or_else(|| {
                Error::format(
                    &t.path,
                    Position::Key(format!("samples[{i}].data_parallel_rank")),
                    "expected an integer",
                )
            })?;
        if !ranks.contains(&r) {
            ranks.push(r);
        }
    }
    ranks.sort_unstable();
    let mut cells = Vec::new();
    for r in ranks {
        let mine: Vec<&Value> = samples
            .iter()
            .filter(|s| s.get("data_parallel_rank").and_then(Value::as_i64) == Some(r))
            .collect();
        cells.push(cell(r.max(0) as usize, &mine, &t.path, rollout, unplaced)?);
    }
    for (k, _) in t.v.as_dict().unwrap_or(&[]) {
        if let Some(k) = k.as_str() {
            if ![
                "format_version",
                "rollout_id",
                "rank",
                "samples",
                "dp_shards",
            ]
            .contains(&k)
            {
                unplaced.insert(format!("{}: {k}", t.path.display()));
            }
        }
    }
    Ok(cells)
}

/// One cell from sample dicts (a train dump's samples of one rank, or a rollout dump's).
fn cell(
    rank: usize,
    samples: &[&Value],
    file: &Path,
    rollout: Option<&[Value]>,
    unplaced: &mut BTreeSet<String>,
) -> Result<Cell> {
    let mut tokens = Vec::new();
    let mut resp = Vec::new();
    let mut rows = Vec::new();
    let lp_keys = [
        "rollout_log_probs",
        "log_probs",
        "ref_log_probs",
        "entropy",
        "advantages",
    ];
    let mut lp: Vec<Vec<Vec<f64>>> = vec![Vec::new(); lp_keys.len()];
    let mut lp_dtype = vec![None; lp_keys.len()];
    let mut present = vec![false; lp_keys.len()];
    let mut mask = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let at = |k: &str| format!("samples[{i}].{k}");
        let toks = s.get("tokens").and_then(Value::to_i64s).ok_or_else(|| {
            Error::format(
                file,
                Position::Key(at("tokens")),
                "expected a list of token ids",
            )
        })?;
        let rl = super::field(s, "response_lengths")
            .or_else(|| super::field(s, "response_length"))
            .and_then(Value::as_i64)
            .ok_or_else(|| {
                Error::format(
                    file,
                    Position::Key(at("response_length")),
                    "expected an integer",
                )
            })?
            .max(0) as usize;
        if rl > toks.len() {
            return Err(Error::format(
                file,
                Position::Key(at("response_length")),
                "longer than tokens",
            ));
        }
        for (k, key) in lp_keys.iter().enumerate() {
            let v = match super::field(s, key) {
                Some(x) => {
                    present[k] = true;
                    if lp_dtype[k].is_none() {
                        lp_dtype[k] = x.as_tensor().map(|t| t.dtype());
                    }
                    x.to_f64s()
                        .ok_or_else(|| super::unreadable(file, &at(key), "a list of numbers", x))?
                }
                None => Vec::new(),
            };
            lp[k].push(v);
        }
        let m = super::field(s, "loss_masks")
            .or_else(|| super::field(s, "loss_mask"))
            .map(|x| {
                x.to_i64s()
                    .ok_or_else(|| super::unreadable(file, &at("loss_mask"), "a list of ints", x))
            })
            .transpose()?
            .unwrap_or_else(|| vec![1; rl]);
        mask.push(m);
        let pos = s.get("rollout_position").and_then(Value::as_i64);
        let src = pos.and_then(|p| rollout?.get(p as usize)).unwrap_or(s);
        rows.push(RowMeta {
            group: super::id_text(super::field(src, "group_index")),
            sample: super::id_text(
                super::field(s, "sample_index").or_else(|| super::field(s, "index")),
            ),
            reward: super::field(s, "rewards")
                .or_else(|| super::field(s, "reward"))
                .and_then(super::scalar_of),
            prompt_len: Some(toks.len() - rl),
            response_len: Some(rl),
            // The oldest weight version that generated the row (Miles `oldest_weight_version`).
            version: super::field(src, "weight_versions")
                .and_then(Value::as_seq)
                .and_then(|v| {
                    v.iter()
                        .filter_map(|x| x.as_str()?.parse::<i64>().ok().or(x.as_i64()))
                        .min()
                }),
            // text where the sample holds it (a chat prompt, a list of messages, is not text)
            prompt_text: super::field(src, "prompt")
                .and_then(Value::as_str)
                .map(str::to_string),
            response_text: super::field(src, "response")
                .and_then(Value::as_str)
                .map(str::to_string),
            ..RowMeta::default()
        });
        resp.push(toks[toks.len() - rl..].to_vec());
        tokens.push(toks);
        for (k, _) in s.as_dict().unwrap_or(&[]) {
            if let Some(k) = k.as_str() {
                if !KNOWN.contains(&k) {
                    unplaced.insert(format!("{}: samples[].{k}", file.display()));
                }
            }
        }
    }
    let tt = |k: usize| -> Option<TokenTensor> {
        present[k].then(|| {
            let mut t = listed(
                padded_f64(&lp[k]),
                file,
                &format!("samples[].{}", lp_keys[k]),
            );
            t.dtype = lp_dtype[k];
            t
        })
    };
    let mut b = TokenBatch {
        rows,
        ..TokenBatch::default()
    };
    for (k, role) in [
        (0, LogProbSource::Rollout),
        (1, LogProbSource::Old),
        (2, LogProbSource::Reference),
    ] {
        if let Some(t) = tt(k) {
            b.log_probs.insert(role, t);
        }
    }
    b.entropy = tt(3);
    b.advantages = tt(4);
    b.input_ids = Some(listed(padded_i64(&tokens), file, "samples[].tokens"));
    b.response_ids = Some(listed(padded_i64(&resp), file, "samples[].tokens"));
    b.response_mask = Some(listed(padded_i64(&mask), file, "samples[].loss_mask"));
    Ok(Cell {
        rank,
        micro: None,
        batch: b,
        loss: None,
        files: vec![file.to_path_buf()],
    })
}
