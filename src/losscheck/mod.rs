//! losscheck: recompute a micro-batch's loss from its own dumped inputs with the reference
//! kernels ([`crate::kernels`]) and say whether the dump is self-consistent.
//!
//! Entry points:
//! - [`self_consistency`]: one rank/micro of a dump tree → one [`Verdict`] (used by
//!   `losscheck --dump-dir` and meant for dumpdiff: when two sides disagree on a loss, run
//!   it on each side; the side whose verdict is [`Status::Consistent`] is the one whose
//!   loss follows from its inputs).
//! - [`check_tree`]: every rank/micro of a step.
//! - [`inputs_from_value`]: free-standing tensors (`--inputs FILE`) → [`LossInputs`].
//!
//! Supported layouts: weaver `is_loss_debug/` (log_probs, old_log_probs, advantages,
//! prob_ratio, elementwise_loss, effective_valid, loss), cross-checked with its `loss/`
//! file when present.

pub mod overrides;

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::error::{Error, Position, Result};
use crate::kernels::loss::{compute, LossConfig, LossInputs};
use crate::kernels::{to_f64, to_f64_vec, KernelError};
use crate::readers::layout::{DumpTree, Kind};
use crate::readers::read_any;
use crate::value::Value;

/// Tolerances for "dumped equals recomputed" (dumps are f32; the reference is f64).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Tolerance {
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            rtol: 1e-4,
            atol: 1e-6,
        }
    }
}

impl Tolerance {
    /// True when `a` and `b` agree (NaN only equals NaN).
    pub fn close(&self, a: f64, b: f64) -> bool {
        if a.is_nan() || b.is_nan() {
            return a.is_nan() && b.is_nan();
        }
        (a - b).abs() <= self.atol + self.rtol * b.abs().max(a.abs())
    }
}

/// The outcome of one self-consistency check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The dumped loss and intermediates follow from the dumped inputs.
    Consistent,
    /// Something dumped does not follow from the dumped inputs.
    Inconsistent,
}

/// The first intermediate (in computation order) whose dumped value differs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Divergence {
    /// Intermediate name (`prob_ratio`, `elementwise_loss`, ...).
    pub name: String,
    /// Row within the micro-batch.
    pub row: usize,
    /// Response position within the row.
    pub pos: usize,
    /// Dumped value.
    pub dumped: f64,
    /// Recomputed value.
    pub recomputed: f64,
    /// How many valid positions differ.
    pub count: usize,
}

/// The verdict on one rank/micro.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    /// The file holding the inputs.
    pub file: PathBuf,
    /// Step.
    pub step: i64,
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// Consistent or not.
    pub status: Status,
    /// Dumped loss.
    pub dumped_loss: f64,
    /// Recomputed loss.
    pub recomputed_loss: f64,
    /// First divergent intermediate, if any.
    pub first_divergence: Option<Divergence>,
    /// Valid tokens in the micro.
    pub tokens: usize,
    /// Other findings in words (e.g. "loss/ file disagrees with is_loss_debug").
    pub notes: Vec<String>,
}

impl Verdict {
    /// One line: `rank R micro M FILE: consistent` or `... dumped loss X ≠ recomputed Y —
    /// first divergent intermediate: NAME at row R pos P`.
    pub fn line(&self) -> String {
        let head = format!(
            "rank {} micro {} {}",
            self.rank,
            self.micro,
            self.file.display()
        );
        let mut s = match self.status {
            Status::Consistent => format!("{head}: consistent (loss {:.6})", self.recomputed_loss),
            Status::Inconsistent => {
                let mut s = format!(
                    "{head}: dumped loss {:.4} ≠ recomputed {:.4}",
                    self.dumped_loss, self.recomputed_loss
                );
                match &self.first_divergence {
                    Some(d) => s.push_str(&format!(
                        " — first divergent intermediate: {} at row {} pos {} ({:.4} vs {:.4}; {} positions differ)",
                        d.name, d.row, d.pos, d.dumped, d.recomputed, d.count
                    )),
                    None => s.push_str(" — every intermediate matches: the aggregation differs"),
                }
                s
            }
        };
        for n in &self.notes {
            s.push_str("; ");
            s.push_str(n);
        }
        s
    }
}

fn kerr(path: &Path, e: KernelError) -> Error {
    Error::format(path, Position::File, e.to_string())
}

fn tensor(v: &Value, path: &Path, key: &str) -> Result<candle_core::Tensor> {
    let t = v
        .get(key)
        .and_then(Value::to_tensor)
        .ok_or_else(|| Error::format(path, Position::Key(key.into()), "missing or not a tensor"))?;
    t.to_candle(&Device::Cpu)
        .and_then(|t| t.to_dtype(candle_core::DType::F64))
        .map_err(|e| Error::format(path, Position::Key(key.into()), e.to_string()))
}

fn scalar(v: &Value, path: &Path, key: &str) -> Result<f64> {
    v.get(key)
        .and_then(|x| {
            x.as_f64()
                .or_else(|| x.to_tensor().and_then(|t| t.scalar_f64()))
        })
        .ok_or_else(|| Error::format(path, Position::Key(key.into()), "missing or not a number"))
}

/// First position where `dumped` and `recomputed` (`[B, T]` row-major, `T` columns)
/// differ at a valid position.
fn first_diff(
    name: &str,
    dumped: &[f64],
    recomputed: &[f64],
    mask: &[f64],
    t: usize,
    tol: &Tolerance,
) -> Option<Divergence> {
    let mut first = None;
    let mut count = 0;
    for (i, ((d, r), m)) in dumped.iter().zip(recomputed).zip(mask).enumerate() {
        if *m != 0.0 && !tol.close(*d, *r) {
            count += 1;
            if first.is_none() {
                first = Some((i, *d, *r));
            }
        }
    }
    first.map(|(i, d, r)| Divergence {
        name: name.to_string(),
        row: i / t.max(1),
        pos: i % t.max(1),
        dumped: d,
        recomputed: r,
        count,
    })
}

/// Recompute one rank/micro of `tree` at `step` from its own dumped inputs under `cfg` and
/// compare with what was dumped (weaver `is_loss_debug/`, plus its `loss/` file).
///
/// Errors (exit 2 in the CLI): the file is absent, unreadable, or lacks an input; tensor
/// shapes disagree (both sizes named).
pub fn self_consistency(
    tree: &DumpTree,
    step: i64,
    rank: u32,
    micro: u32,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Verdict> {
    let file = tree
        .get(Kind::IsLossDebug, step, Some(rank), Some(micro))
        .ok_or_else(|| {
            Error::Usage(format!(
                "{}: no is_loss_debug file for step {step} rank {rank} micro {micro}",
                tree.root.display()
            ))
        })?;
    let path = file.path.as_path();
    let v = read_any(path)?;
    let mask = tensor(&v, path, "effective_valid")?;
    let inputs = LossInputs {
        log_probs: tensor(&v, path, "log_probs")?,
        old_log_probs: Some(tensor(&v, path, "old_log_probs")?),
        ref_log_probs: None,
        advantages: tensor(&v, path, "advantages")?,
        mask: mask.clone(),
        entropy: None,
    };
    let out = compute(&inputs, cfg).map_err(|e| kerr(path, e))?;
    let t = mask.dims().get(1).copied().unwrap_or(1);
    let m = to_f64_vec(&mask).map_err(|e| kerr(path, e))?;
    let mut first_divergence = None;
    if let Ok(dumped) = tensor(&v, path, "prob_ratio") {
        let ours = to_f64_vec(&out.ratio).map_err(|e| kerr(path, e))?;
        let d = to_f64_vec(&dumped).map_err(|e| kerr(path, e))?;
        first_divergence = first_diff("prob_ratio", &d, &ours, &m, t, tol);
    }
    if first_divergence.is_none() {
        if let Ok(dumped) = tensor(&v, path, "elementwise_loss") {
            let ours = to_f64_vec(&out.per_token_loss).map_err(|e| kerr(path, e))?;
            let d = to_f64_vec(&dumped).map_err(|e| kerr(path, e))?;
            first_divergence = first_diff("elementwise_loss", &d, &ours, &m, t, tol);
        }
    }
    let dumped_loss = scalar(&v, path, "loss")?;
    let recomputed_loss = to_f64(&out.loss).map_err(|e| kerr(path, e))?;
    let tokens = m.iter().filter(|x| **x != 0.0).count();
    let mut notes = Vec::new();
    let mut ok = tol.close(dumped_loss, recomputed_loss) && first_divergence.is_none();
    if !tol.close(dumped_loss, recomputed_loss) && first_divergence.is_none() && tokens > 0 {
        let sum = recomputed_loss * tokens as f64;
        if tol.close(dumped_loss, sum) {
            notes.push(format!(
                "the dumped loss equals the recomputed token-mean × {tokens} valid tokens: a sum, not a mean"
            ));
        }
    }
    if let Some(lf) = tree.get(Kind::Loss, step, Some(rank), Some(micro)) {
        let lv = read_any(&lf.path)?;
        for key in ["loss", "pg_loss"] {
            if let Ok(x) = scalar(&lv, &lf.path, key) {
                if !tol.close(x, recomputed_loss) {
                    ok = false;
                    notes.push(format!(
                        "{} {key} {x:.4} ≠ recomputed {recomputed_loss:.4}",
                        lf.path.display()
                    ));
                }
            }
        }
    }
    Ok(Verdict {
        file: file.path.clone(),
        step,
        rank,
        micro,
        status: if ok {
            Status::Consistent
        } else {
            Status::Inconsistent
        },
        dumped_loss,
        recomputed_loss,
        first_divergence,
        tokens,
        notes,
    })
}

/// [`self_consistency`] for every rank/micro with an `is_loss_debug` file at `step`
/// (restricted to `rank`/`micro` when given), in rank then micro order.
pub fn check_tree(
    tree: &DumpTree,
    step: i64,
    rank: Option<u32>,
    micro: Option<u32>,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Vec<Verdict>> {
    let mut cells: Vec<(u32, u32)> = tree
        .files_of(Kind::IsLossDebug, step)
        .filter_map(|f| Some((f.rank?, f.micro?)))
        .filter(|(r, m)| rank.is_none_or(|x| x == *r) && micro.is_none_or(|x| x == *m))
        .collect();
    cells.sort_unstable();
    if cells.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no is_loss_debug files for step {step}{}{} (losscheck needs the weaver layout)",
            tree.root.display(),
            rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
            micro.map(|m| format!(" micro {m}")).unwrap_or_default(),
        )));
    }
    cells
        .into_iter()
        .map(|(r, m)| self_consistency(tree, step, r, m, cfg, tol))
        .collect()
}

/// Free-standing inputs from a dict of tensors (`.safetensors`, `.pt`, ...): `log_probs`,
/// optional `old_log_probs`, `ref_log_probs`, `entropy`, a mask (`mask`, `response_mask`,
/// `loss_mask` or `effective_valid`; all ones when absent), and `advantages` `[B]`/`[B, T]`
/// or `rewards` `[B]` + `group_ids` `[B]` turned into advantages with `cfg.advantage`.
/// Keys may carry an `in.` prefix (the layout of `fixtures/kernels/*.safetensors`).
pub fn inputs_from_value(v: &Value, path: &Path, cfg: &LossConfig) -> Result<LossInputs> {
    let stripped = strip_in_prefix(v);
    let v = stripped.as_ref().unwrap_or(v);
    let log_probs = tensor(v, path, "log_probs")?;
    let opt = |k: &str| v.get(k).map(|_| tensor(v, path, k)).transpose();
    let mask = match ["mask", "response_mask", "loss_mask", "effective_valid"]
        .iter()
        .find(|k| v.get(k).is_some())
    {
        Some(k) => tensor(v, path, k)?,
        None => log_probs
            .ones_like()
            .map_err(|e| Error::format(path, Position::File, e.to_string()))?,
    };
    let advantages = match opt("advantages")? {
        Some(a) => a,
        None => {
            let rewards = to_f64_vec(&tensor(v, path, "rewards")?).map_err(|e| kerr(path, e))?;
            let groups: Vec<i64> = to_f64_vec(&tensor(v, path, "group_ids")?)
                .map_err(|e| kerr(path, e))?
                .iter()
                .map(|g| *g as i64)
                .collect();
            let adv =
                crate::kernels::advantage::group_advantages(&rewards, &groups, &cfg.advantage)
                    .map_err(|e| kerr(path, e))?;
            candle_core::Tensor::from_vec(adv, rewards.len(), &Device::Cpu)
                .map_err(|e| Error::format(path, Position::File, e.to_string()))?
        }
    };
    Ok(LossInputs {
        log_probs,
        old_log_probs: opt("old_log_probs")?,
        ref_log_probs: opt("ref_log_probs")?,
        advantages,
        mask,
        entropy: opt("entropy")?,
    })
}

/// A copy of a dict whose `in.`-prefixed keys lose the prefix; `None` when there are none.
fn strip_in_prefix(v: &Value) -> Option<Value> {
    let items = v.as_dict()?;
    if !items
        .iter()
        .any(|(k, _)| k.as_str().is_some_and(|s| s.starts_with("in.")))
    {
        return None;
    }
    Some(Value::Dict(
        items
            .iter()
            .filter_map(|(k, x)| {
                let s = k.as_str()?.strip_prefix("in.")?;
                Some((Value::Str(s.to_string()), x.clone()))
            })
            .collect(),
    ))
}
