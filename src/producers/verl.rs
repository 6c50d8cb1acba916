//! verl's `DataProto` pickles mapped into the model ([`StepDump`]).
//!
//! What verl writes (verl 0.9.1, `verl/protocol.py`, PyPI wheel `verl-0.9.1`):
//! `DataProto.save_to_disk` is `pickle.dump(self)`; `DataProto.__getstate__` returns
//! `(batch, non_tensor_batch, meta_info)` where `batch` is the `TensorDict` as
//! `torch.save` bytes (consolidated first: tensordict ≥ 0.5 pickles it as
//! `_rebuild_tensordict_files_consolidated(metadata, storage)`, one flat byte storage with
//! `(dtype, shape, start, stop, pad)` per key), or, when
//! `VERL_DATAPROTO_SERIALIZATION_METHOD=numpy`, `serialize_tensordict`'s
//! `(batch_size, device, {key: (dtype name, shape, uint8 array)})`; `non_tensor_batch`
//! maps keys to numpy arrays (`uid`: an object array of strings).
//! Where: RolloutSkip (`verl/utils/skip/rollout_skip.py`) writes
//! `{dump_dir}/{exp}_{project}/GBS{gbs}_N{n}_in{P}_out{R}/{step}/gen_batch.dp` and a
//! `meta.json` `{"global_steps": step}`; users save batches where they like, so a file is
//! recognised by content (a pickle naming `verl.protocol.DataProto`), and its step is
//! `meta_info["global_steps"]` (set by `ray_trainer.fit`), else `meta.json` beside it,
//! else the last number of its name or its folder's name.
//!
//! Roles (verl 0.9.1 `trainer/ppo/ray_trainer.py`): `rollout_log_probs` the engine's
//! (vLLM/SGLang `calculate_log_probs`), `old_log_probs` the trainer's recompute before the
//! update (`compute_log_prob`), `ref_log_prob` the reference policy. Columns are response
//! tokens (`responses`, right-padded); `input_ids` = left-padded prompt ++ responses.
//!
//! The pickle is read by the restricted unpickler, which accepts `DataProto` and the
//! tensordict rebuild function as data (`pt/pickle/globals.rs`, `DATA_CLASSES`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::walk;
use super::StepReader;
use crate::error::{Error, Position, Result};
use crate::model::conventions::{ConventionKey, ConventionSource, ConventionValue};
use crate::model::step::{LogProbSource, RowMeta, StepDump, TokenBatch, TokenTensor};
use crate::model::trajectory::Provenance;
use crate::tensor::{contiguous_strides, Bytes, DType, Tensor};
use crate::value::Value;

/// The pickled class a verl dump names.
pub const DATAPROTO: &str = "verl.protocol.DataProto";
/// The rebuild function of a consolidated `TensorDict`.
pub const TD_CONSOLIDATED: &str = "tensordict._reductions._rebuild_tensordict_files_consolidated";

/// Per-token keys of `DataProto.batch` and where they go.
pub const ROLLOUT_LOG_PROBS: &str = "rollout_log_probs";
/// The trainer's recompute before the update.
pub const OLD_LOG_PROBS: &str = "old_log_probs";
/// The reference policy's log-probs.
pub const REF_LOG_PROB: &str = "ref_log_prob";
/// Keys read into [`TokenBatch`] fields other than log-probs.
pub const ENTROPYS: &str = "entropys";
const RESPONSES: &str = "responses";
const RESPONSE_MASK: &str = "response_mask";
const INPUT_IDS: &str = "input_ids";
const ATTENTION_MASK: &str = "attention_mask";
const ADVANTAGES: &str = "advantages";
const TOKEN_LEVEL_SCORES: &str = "token_level_scores";
const TOKEN_LEVEL_REWARDS: &str = "token_level_rewards";
const ROLLOUT_IS_WEIGHTS: &str = "rollout_is_weights";
const UID: &str = "uid";
const GLOBAL_STEPS: &str = "global_steps";

/// The verl producer.
pub struct Verl;

/// One `DataProto` file read: its batch tensors by key, non-tensor values, meta_info.
struct DataProtoFile {
    path: PathBuf,
    tensors: Vec<(String, Tensor)>,
    non_tensor: Vec<(String, Value)>,
    meta: Value,
    unplaced: Vec<String>,
}

/// Whether `path`'s first bytes are a pickle naming `verl.protocol.DataProto`.
pub fn is_dataproto(path: &Path) -> bool {
    let h = walk::head(path, 96);
    h.first() == Some(&0x80)
        && walk::contains(&h, b"verl.protocol")
        && walk::contains(&h, b"DataProto")
}

fn dataproto_files(root: &Path) -> Result<Vec<PathBuf>> {
    Ok(walk::files_under(root)?
        .into_iter()
        .filter(|p| is_dataproto(p))
        .collect())
}

fn bad(path: &Path, key: &str, msg: impl Into<String>) -> Error {
    Error::format(path, Position::Key(key.to_string()), msg)
}

/// Read one `DataProto` pickle.
fn read_file(path: &Path) -> Result<DataProtoFile> {
    let bytes = super::walk::read(path)?;
    let v = crate::formats::pt::pickle::unpickle(&bytes, "pickle", &mut |_| {
        Err("a DataProto pickle holds no storage members".into())
    })
    .map_err(|e| e.in_file(path))?;
    if v.get("__class__").and_then(Value::as_str) != Some(DATAPROTO) {
        return Err(Error::format(
            path,
            Position::File,
            format!("expected a pickled {DATAPROTO}, found {}", v.type_name()),
        ));
    }
    let state = v
        .get("__state__")
        .and_then(Value::as_seq)
        .filter(|s| s.len() == 3)
        .ok_or_else(|| {
            bad(
                path,
                "__getstate__",
                "expected (batch, non_tensor_batch, meta_info)",
            )
        })?;
    let mut unplaced = Vec::new();
    let tensors = match &state[0] {
        Value::None => Vec::new(),
        Value::Bytes(b) => torch_batch(path, b, &mut unplaced)?,
        Value::Tuple(t) | Value::List(t) => numpy_batch(path, t, &mut unplaced)?,
        other => {
            return Err(super::unreadable(
                path,
                "batch",
                "torch.save bytes or a numpy encoding",
                other,
            ))
        }
    };
    let non_tensor = match &state[1] {
        Value::None => Vec::new(),
        Value::Dict(items) => items
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.clone())))
            .collect(),
        other => return Err(super::unreadable(path, "non_tensor_batch", "a dict", other)),
    };
    Ok(DataProtoFile {
        path: path.to_path_buf(),
        tensors,
        non_tensor,
        meta: state[2].clone(),
        unplaced,
    })
}

/// The batch of the default serialization: `torch.save(TensorDict)` bytes.
fn torch_batch(path: &Path, b: &[u8], unplaced: &mut Vec<String>) -> Result<Vec<(String, Tensor)>> {
    let buf: crate::formats::Buf = Arc::new(b.to_vec());
    let td = crate::formats::pt::read_pt_bytes(buf)
        .map_err(|e| bad(path, "batch", format!("the batch's torch.save bytes: {e}")))?;
    if matches!(td, Value::None) {
        return Ok(Vec::new());
    }
    if td.get("__class__").and_then(Value::as_str) != Some(TD_CONSOLIDATED) {
        return Err(bad(
            path,
            "batch",
            format!(
                "expected a consolidated TensorDict ({TD_CONSOLIDATED}), found {}",
                td.type_name()
            ),
        ));
    }
    let args = td.get("__args__").and_then(Value::as_seq).unwrap_or(&[]);
    let [meta, storage] = args else {
        return Err(bad(path, "batch", "expected (metadata, storage)"));
    };
    let storage = storage
        .as_tensor()
        .ok_or_else(|| bad(path, "batch.storage", "expected a uint8 tensor"))?;
    let flat = Bytes::from_vec(storage.element_bytes());
    let mut out = Vec::new();
    consolidated_leaves(path, meta, &flat, "", &mut out, unplaced)?;
    Ok(out)
}

/// The leaves of a consolidated TensorDict's metadata (tensordict `_reductions.py`,
/// `_rebuild_tensordict_files_consolidated`: `(dtype, shape, start, stop, pad[, ragged])`
/// byte windows of the flat storage); nested TensorDicts are walked with `a.b` keys.
fn consolidated_leaves(
    path: &Path,
    meta: &Value,
    flat: &Bytes,
    prefix: &str,
    out: &mut Vec<(String, Tensor)>,
    unplaced: &mut Vec<String>,
) -> Result<()> {
    let items = meta
        .as_dict()
        .ok_or_else(|| bad(path, "batch.metadata", "expected a dict"))?;
    for (k, v) in items {
        let Some(k) = k.as_str() else { continue };
        match k {
            "leaves" => {
                for (name, leaf) in v.as_dict().unwrap_or(&[]) {
                    let name = format!("{prefix}{}", name.as_str().unwrap_or("?"));
                    let key = format!("batch.{name}");
                    let f = leaf.as_seq().unwrap_or(&[]);
                    let (Some(dt), Some(shape), Some(start), Some(stop)) = (
                        f.first()
                            .and_then(Value::as_str)
                            .and_then(DType::from_torch_name),
                        f.get(1).and_then(Value::to_i64s),
                        f.get(2).and_then(Value::as_i64),
                        f.get(3).and_then(Value::as_i64),
                    ) else {
                        return Err(bad(path, &key, "expected (dtype, shape, start, stop, pad)"));
                    };
                    if name.contains("<NJT") {
                        unplaced.push(format!("{}: {key} (nested jagged tensor)", path.display()));
                        continue;
                    }
                    let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
                    let len = (stop - start).max(0) as usize;
                    let t = flat
                        .slice(start.max(0) as usize, len)
                        .and_then(|b| {
                            let s = contiguous_strides(&shape);
                            Tensor::from_parts(dt, shape, s, 0, b, None).ok()
                        })
                        .ok_or_else(|| {
                            bad(path, &key, "byte window outside the storage or too short")
                        })?;
                    out.push((name, t));
                }
            }
            "non_tensors" => {
                for (name, _) in v.as_dict().unwrap_or(&[]) {
                    unplaced.push(format!(
                        "{}: batch.{prefix}{} (non-tensor data)",
                        path.display(),
                        name.as_str().unwrap_or("?")
                    ));
                }
            }
            "cls" | "cls_metadata" | "size" => {}
            sub => consolidated_leaves(path, v, flat, &format!("{prefix}{sub}."), out, unplaced)?,
        }
    }
    Ok(())
}

/// The batch of the numpy serialization (`serialize_tensordict`).
fn numpy_batch(
    path: &Path,
    t: &[Value],
    unplaced: &mut Vec<String>,
) -> Result<Vec<(String, Tensor)>> {
    let items = t.get(2).and_then(Value::as_dict).ok_or_else(|| {
        bad(
            path,
            "batch",
            "expected (batch_size, device, {key: (dtype, shape, bytes)})",
        )
    })?;
    let mut out = Vec::new();
    for (k, v) in items {
        let name = k.as_str().unwrap_or("?").to_string();
        let key = format!("batch.{name}");
        let f = v.as_seq().unwrap_or(&[]);
        if f.len() == 2 {
            unplaced.push(format!("{}: {key} (nested tensor)", path.display()));
            continue;
        }
        let (Some(dt), Some(shape), Some(data)) = (
            f.first()
                .and_then(Value::as_str)
                .and_then(DType::from_torch_name),
            f.get(1).and_then(Value::to_i64s),
            f.get(2).and_then(Value::as_tensor),
        ) else {
            return Err(bad(path, &key, "expected (dtype name, shape, uint8 array)"));
        };
        let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        let t = Tensor::from_le_bytes(dt, shape, data.element_bytes())
            .map_err(|e| bad(path, &key, e.to_string()))?;
        out.push((name, t));
    }
    Ok(out)
}

/// The step of a read file: `meta_info["global_steps"]`, `meta.json` beside it, or the
/// last number of its name (or its folder's).
fn step_of(f: &DataProtoFile) -> Option<i64> {
    if let Some(s) = f.meta.get(GLOBAL_STEPS).and_then(Value::as_i64) {
        return Some(s);
    }
    let meta_json = f.path.with_file_name("meta.json");
    if let Ok(text) = super::walk::read_to_string(&meta_json) {
        if let Ok(j) = serde_json::from_str::<serde_json::Value>(&text) {
            if let Some(s) = j.get(GLOBAL_STEPS).and_then(serde_json::Value::as_i64) {
                return Some(s);
            }
        }
    }
    walk::step_from_path(&f.path)
}

fn read_all(root: &Path) -> Result<Vec<(i64, DataProtoFile)>> {
    let mut out = Vec::new();
    for p in dataproto_files(root)? {
        let f = read_file(&p)?;
        let step = step_of(&f).ok_or_else(|| {
            Error::format(&p, Position::File, "no step: meta_info has no global_steps, no meta.json beside it, no number in its name")
        })?;
        out.push((step, f));
    }
    Ok(out)
}

impl StepReader for Verl {
    fn name(&self) -> &'static str {
        "verl"
    }

    fn detect(&self, root: &Path) -> bool {
        walk::files_under(root)
            .map(|fs| fs.iter().any(|p| is_dataproto(p)))
            .unwrap_or(false)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        let mut s: Vec<i64> = read_all(root)?.into_iter().map(|(s, _)| s).collect();
        s.sort_unstable();
        s.dedup();
        Ok(s)
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<StepDump> {
        let all = read_all(root)?;
        let steps: Vec<i64> = all.iter().map(|(s, _)| *s).collect();
        let files: Vec<DataProtoFile> = all
            .into_iter()
            .filter(|(s, _)| *s == step)
            .map(|(_, f)| f)
            .collect();
        if files.is_empty() {
            return Err(Error::input(
                root,
                format!("no verl DataProto of step {step} (steps there: {steps:?})"),
            ));
        }
        Ok(to_step(root, step, files))
    }
}

/// The files of one step as one whole-batch cell (rank 0, no micro): each key from the
/// first file (by path) that holds it; a key held again by a later file is listed in
/// `unplaced`.
fn to_step(root: &Path, step: i64, files: Vec<DataProtoFile>) -> StepDump {
    let mut unplaced = Vec::new();
    let mut tensors: BTreeMap<String, TokenTensor> = BTreeMap::new();
    let mut non_tensor: BTreeMap<String, (PathBuf, Value)> = BTreeMap::new();
    for f in &files {
        unplaced.extend(f.unplaced.iter().cloned());
        for (k, t) in &f.tensors {
            if tensors.contains_key(k) {
                unplaced.push(format!(
                    "{}: batch.{k} (also in an earlier file; the first kept)",
                    f.path.display()
                ));
                continue;
            }
            tensors.insert(
                k.clone(),
                TokenTensor {
                    tensor: t.clone(),
                    dtype: Some(t.dtype()),
                    source: Provenance {
                        file: f.path.clone(),
                        key: format!("batch.{k}"),
                    },
                },
            );
        }
        for (k, v) in &f.non_tensor {
            non_tensor
                .entry(k.clone())
                .or_insert_with(|| (f.path.clone(), v.clone()));
        }
    }
    let mut b = TokenBatch::default();
    let mut take = |k: &str| tensors.remove(k);
    for (k, role) in [
        (ROLLOUT_LOG_PROBS, LogProbSource::Rollout),
        (OLD_LOG_PROBS, LogProbSource::Old),
        (REF_LOG_PROB, LogProbSource::Reference),
    ] {
        if let Some(t) = take(k) {
            b.log_probs.insert(role, t);
        }
    }
    b.entropy = take(ENTROPYS);
    b.response_ids = take(RESPONSES);
    b.response_mask = take(RESPONSE_MASK);
    b.input_ids = take(INPUT_IDS);
    b.attention_mask = take(ATTENTION_MASK);
    b.advantages = take(ADVANTAGES);
    let scores = take(TOKEN_LEVEL_SCORES);
    b.token_rewards = take(TOKEN_LEVEL_REWARDS).or_else(|| scores.clone());
    b.importance_weights = take(ROLLOUT_IS_WEIGHTS);
    b.rows = rows_of(&b, scores.as_ref(), non_tensor.get(UID).map(|(_, v)| v));
    let mut conventions = crate::model::conventions::Conventions::default();
    if let Some(t) = b.log_probs.values().next() {
        conventions.set(
            ConventionKey::LogProbDtype,
            ConventionValue::Name(t.tensor.dtype().torch_name().to_string()),
            ConventionSource::Dumped {
                at: t.source.clone(),
            },
        );
    }
    conventions.set(
        ConventionKey::PaddingSide,
        ConventionValue::Name("left".into()),
        ConventionSource::Default {
            whose: "verl 0.9.1 verl/utils/dataset/rl_dataset.py (prompts left-padded)".into(),
        },
    );
    for (k, t) in tensors {
        unplaced.push(format!(
            "{}: {}",
            t.source.file.display(),
            if k.is_empty() { "batch" } else { &t.source.key }
        ));
    }
    for (k, (p, _)) in non_tensor {
        if k != UID {
            unplaced.push(format!("{}: non_tensor_batch.{k}", p.display()));
        }
    }
    let paths: Vec<PathBuf> = files.iter().map(|f| f.path.clone()).collect();
    StepDump {
        conventions,
        unplaced,
        ..StepDump::whole_batch("verl", root, step, b, paths)
    }
}

/// Per-row records: `uid` as the group, the sequence score (sum of
/// `token_level_scores`), prompt length (attention over the prompt columns) and response
/// length (`response_mask`, else attention over the response columns).
fn rows_of(b: &TokenBatch, scores: Option<&TokenTensor>, uid: Option<&Value>) -> Vec<RowMeta> {
    let n = [&b.response_ids, &b.input_ids, &b.response_mask]
        .iter()
        .find_map(|t| {
            t.as_ref()
                .map(|t| t.tensor.shape().first().copied().unwrap_or(0))
        })
        .unwrap_or(0);
    let uids: Vec<Option<String>> = match uid {
        Some(v) => match v.items() {
            Some(items) => items.iter().map(|x| super::id_text(Some(x))).collect(),
            None => Vec::new(),
        },
        None => Vec::new(),
    };
    let mat = |t: &Option<TokenTensor>| {
        t.as_ref()
            .map(|t| (t.tensor.shape().to_vec(), t.tensor.to_f64_vec()))
    };
    let scores = scores.map(|t| (t.tensor.shape().to_vec(), t.tensor.to_f64_vec()));
    let am = mat(&b.attention_mask);
    let rm = mat(&b.response_mask);
    let width_r = b
        .response_ids
        .as_ref()
        .and_then(|t| t.tensor.shape().get(1).copied());
    let row_sum = |m: &Option<(Vec<usize>, Vec<f64>)>, i: usize, from: usize, to: Option<usize>| {
        m.as_ref().and_then(|(s, v)| {
            let w = *s.get(1)?;
            let to = to.unwrap_or(w).min(w);
            Some(v.get(i * w + from..i * w + to)?.iter().sum::<f64>())
        })
    };
    (0..n)
        .map(|i| {
            let prompt_w = am.as_ref().and_then(|(s, _)| Some(s.get(1)? - width_r?));
            RowMeta {
                group: uids.get(i).cloned().flatten(),
                reward: row_sum(&scores, i, 0, None),
                prompt_len: prompt_w
                    .and_then(|pw| row_sum(&am, i, 0, Some(pw)))
                    .map(|x| x as usize),
                response_len: row_sum(&rm, i, 0, None)
                    .or_else(|| {
                        let pw = am.as_ref().and_then(|(s, _)| Some(s.get(1)? - width_r?))?;
                        row_sum(&am, i, pw, None)
                    })
                    .map(|x| x as usize),
                ..RowMeta::default()
            }
        })
        .collect()
}
