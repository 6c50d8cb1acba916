//! Producer mappings: each producer's files mapped into the typed model
//! ([`crate::model`]) in one place — every key it spells, every alias, every strictness
//! rule. A new producer (verl, slime, NeMo-RL, SGLang's dumper, TRL) or a new key alias is
//! one file here.
//!
//! Adding a producer (say verl): write `verl.rs` here with its key constants and one
//! function per kind of file it writes, each returning a model record
//! ([`crate::model::step`], [`crate::model::trajectory`]); implement [`StepMapping`] for
//! it (only the methods for what it writes); add its variant to
//! [`crate::producers::layout::Producer`] and to [`mapping`]. A new spelling of a known key
//! is one constant and one lookup in the producer's file.
//!
//! Strictness, the same everywhere: a key that is absent (or Python `None`) is `None` in
//! the model and the check that needs it says so; a key that is present but unreadable
//! (wrong type) is an [`Error::Format`](crate::Error) naming the file and the key path.

pub mod areal;
pub mod columns;
pub mod layout;
pub mod loose_tensors;
pub mod mapping;
pub mod miles_dashboard;
pub mod nemo_rl;
pub mod nexrl_files;
pub mod nexrl_self_hosted;
mod nexrl_tree;
pub mod open;
pub mod remote_api;
pub mod sglang;
pub mod slime;
pub mod trl;
pub mod verl;
pub mod verl_generations;
pub mod walk;
pub mod weaver;

use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::model::step::{LossRecord, ParamRecord, TokenBatch, TokenTensor};
use crate::model::tokens::TokenSeq;
use crate::model::trajectory::Provenance;
use crate::model::trajectory::{DatumBatch, TrajectoryBatch};
use crate::model::tree::{Kind, Producer};
use crate::value::Value;

/// One producer's mapping of its files into the model: what each kind of file holds.
/// Each method returns `Ok(None)` for a kind the producer does not write that record in
/// (the default), so a producer overrides only what it writes.
pub trait StepMapping: Sync {
    /// The per-token batch of a file of `kind` (forward pass, old log-probs, loss
    /// intermediates, model inputs).
    fn token_batch(&self, _kind: Kind, _file: &Path, _v: &Value) -> Result<Option<TokenBatch>> {
        Ok(None)
    }
    /// The trajectories of a file of `kind`.
    fn trajectories<'v>(
        &self,
        _kind: Kind,
        _file: &Path,
        _v: &'v Value,
    ) -> Result<Option<TrajectoryBatch<'v>>> {
        Ok(None)
    }
    /// The datums of a file of `kind`.
    fn datums<'v>(
        &self,
        _kind: Kind,
        _file: &Path,
        _v: &'v Value,
    ) -> Result<Option<DatumBatch<'v>>> {
        Ok(None)
    }
    /// The loss record of a file of `kind`.
    fn loss_record(&self, _kind: Kind, _file: &Path, _v: &Value) -> Result<Option<LossRecord>> {
        Ok(None)
    }
    /// The parameter or gradient of a file of `kind`.
    fn param(&self, _kind: Kind, _file: &Path, _v: &Value) -> Result<Option<ParamRecord>> {
        Ok(None)
    }
    /// The per-token batch a file of `kind` adds to its cell of the step model
    /// ([`crate::model::step::StepDump`]): [`StepMapping::token_batch`], and for a
    /// producer whose per-token values are lists per row (remote-API datums) those lists
    /// made a batch.
    fn cell_batch(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<TokenBatch>> {
        self.token_batch(kind, file, v)
    }
    /// The conventions a file of `kind` states (coefficients, aggregation echoed with the
    /// loss), recorded with the file and key into `c`; nothing by default.
    fn conventions(
        &self,
        _kind: Kind,
        _file: &Path,
        _v: &Value,
        _c: &mut crate::model::conventions::Conventions,
    ) -> Result<()> {
        Ok(())
    }
}

/// The mapping of a producer identified by [`crate::producers::layout::DumpTree`]; an
/// unidentified tree is read with the NexRL keys every known layout shares.
pub fn mapping(producer: Producer) -> &'static dyn StepMapping {
    match producer {
        Producer::SelfHosted | Producer::Unknown => &nexrl_self_hosted::NexrlSelfHosted,
        Producer::RemoteApi => &remote_api::RemoteApi,
        Producer::Weaver => &weaver::Weaver,
    }
}

/// The per-token tensor keys a file of `kind` holds, as its producers spell them.
pub fn tensor_keys(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::ForwardData => &nexrl_self_hosted::FORWARD_DATA_KEYS,
        Kind::OldLogProbs => &[nexrl_self_hosted::OLD_LOG_PROBS],
        Kind::IsLossDebug => &weaver::IS_LOSS_DEBUG_KEYS,
        Kind::BatchInputs => &weaver::BATCH_INPUTS_KEYS,
        Kind::Param => &[nexrl_self_hosted::PARAM],
        Kind::Gradient => &[nexrl_self_hosted::GRADIENT],
        _ => &[],
    }
}

/// Check, without decoding anything, that every [`tensor_keys`] entry `v` holds is a
/// tensor or a list: a tool that reads a key lazily must not take a value of the wrong
/// type for "not dumped".
///
/// Errors: such a key holding something else (named with the file).
pub fn check_tensor_keys(kind: Kind, file: &Path, v: &Value) -> Result<()> {
    for &k in tensor_keys(kind) {
        if let Some(x) = field(v, k) {
            if !matches!(
                x,
                Value::Tensor(_) | Value::List(_) | Value::Tuple(_) | Value::Packed(_)
            ) {
                return Err(unreadable(
                    file,
                    k,
                    "a tensor or a rectangular nested list",
                    x,
                ));
            }
        }
    }
    Ok(())
}

/// `v[key]`, `None` when absent or Python `None`.
pub fn field<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.get(key).filter(|x| !matches!(x, Value::None))
}

/// The error for a key present with a value of the wrong type.
pub fn unreadable(file: &Path, key: &str, expected: &str, found: &Value) -> Error {
    Error::format(
        file,
        Position::Key(key.to_string()),
        format!("expected {expected}, found {}", found.type_name()),
    )
}

/// A number: a float, int, bool, one-element tensor or one-element list.
pub fn scalar_of(x: &Value) -> Option<f64> {
    x.as_f64()
        .or_else(|| x.to_tensor().and_then(|t| t.scalar_f64()))
}

/// `v[key]` as a number ([`scalar_of`]).
pub fn opt_f64(v: &Value, key: &str, file: &Path, path: &str) -> Result<Option<f64>> {
    field(v, key)
        .map(|x| scalar_of(x).ok_or_else(|| unreadable(file, path, "a number", x)))
        .transpose()
}

/// `v[key]` as integer ids (a tensor or a list of ints), borrowed when packed.
pub fn opt_ints<'v>(
    v: &'v Value,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<TokenSeq<'v>>> {
    field(v, key)
        .map(|x| TokenSeq::of(x).ok_or_else(|| unreadable(file, path, "a list of ints", x)))
        .transpose()
}

/// `v[key]` as numbers (a tensor or a list).
pub fn opt_floats(v: &Value, key: &str, file: &Path, path: &str) -> Result<Option<Vec<f64>>> {
    field(v, key)
        .map(|x| {
            match x {
                Value::Tensor(_) | Value::List(_) | Value::Packed(_) => x.to_f64s(),
                _ => None,
            }
            .ok_or_else(|| unreadable(file, path, "a list of numbers", x))
        })
        .transpose()
}

/// `v[key]` as a list of values.
pub fn seq<'v>(v: &'v Value, key: &str, file: &Path) -> Result<&'v [Value]> {
    match v.get(key) {
        Some(x) => x.as_seq().ok_or_else(|| unreadable(file, key, "a list", x)),
        None => Err(Error::format(
            file,
            Position::Key(key.to_string()),
            "missing: no such key",
        )),
    }
}

/// `v[key]` as a per-token tensor (a tensor or a rectangular nested list), with its
/// stored dtype (none for a list) and provenance.
pub fn opt_tensor(v: &Value, key: &str, file: &Path) -> Result<Option<TokenTensor>> {
    field(v, key)
        .map(|x| {
            let tensor = match x {
                Value::Tensor(t) => Some(t.clone()),
                _ => x.to_tensor(),
            }
            .ok_or_else(|| unreadable(file, key, "a tensor or a rectangular nested list", x))?;
            Ok(TokenTensor {
                tensor,
                dtype: x.as_tensor().map(|t| t.dtype()),
                source: Provenance {
                    file: file.to_path_buf(),
                    key: key.to_string(),
                },
            })
        })
        .transpose()
}

/// A Python id field (`group_id`, `uid`, …) as text, whatever type the producer used.
pub fn id_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Str(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::BigInt(s) => Some(s.clone()),
        Value::Float(f) => Some(f.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod step_tests;

/// A producer that reads whole steps into the model ([`crate::model::step::StepDump`]):
/// the door every tool goes through. One implementation per producer file.
pub trait StepReader: Sync {
    /// The producer's name as reports print it (`verl`, `nemo-rl`, …).
    fn name(&self) -> &'static str;
    /// Whether `root` (a folder or a file) holds this producer's files: cheap, by file
    /// names and, where names are not distinctive, by a file's first bytes.
    fn detect(&self, root: &Path) -> bool;
    /// The steps `root` holds, ascending.
    ///
    /// Errors: `root` unreadable.
    fn steps(&self, root: &Path) -> Result<Vec<i64>>;
    /// Step `step` of `root` in the model.
    ///
    /// Errors: a file unreadable or not of the expected shape (named with its position);
    /// the step absent (naming the steps there are).
    fn read_step(&self, root: &Path, step: i64) -> Result<crate::model::step::StepDump>;
    /// Step `step` of `root` handed out cell by cell, for a tool that folds each cell
    /// into sums and drops it (`mismatch`): by default the step read whole
    /// ([`StepReader::read_step`]); a producer whose files are per cell reads each cell
    /// only when asked, so the step's memory is that of the cells in flight.
    ///
    /// Errors: as [`StepReader::read_step`].
    fn open_step(&self, root: &Path, step: i64) -> Result<Box<dyn crate::model::step::StepCells>> {
        Ok(Box::new(self.read_step(root, step)?))
    }
}

/// Every producer that reads whole steps, in detection order.
pub fn step_readers() -> Vec<&'static dyn StepReader> {
    vec![
        &verl::Verl,
        &nemo_rl::NemoRl,
        &slime::Slime,
        &sglang::SglangDumper,
        &nexrl_self_hosted::NexrlSelfHosted,
        &weaver::Weaver,
        &remote_api::RemoteApi,
        &loose_tensors::LooseTensors,
        &areal::Areal,
        &verl_generations::VerlGenerations,
        &miles_dashboard::MilesDashboard,
        &trl::Trl,
    ]
}

/// The one producer whose files `root` holds.
///
/// Errors: no producer recognises it (naming what was expected), or several do (a tree
/// mixing producers is refused with the list, never read mixed).
pub fn step_reader_for(root: &Path) -> Result<&'static dyn StepReader> {
    let found: Vec<&'static dyn StepReader> = step_readers()
        .into_iter()
        .filter(|r| r.detect(root))
        .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(Error::format(
            root,
            Position::File,
            format!(
                "no known producer's dump layout (known: {})",
                step_readers()
                    .iter()
                    .map(|r| r.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        many => Err(Error::format(
            root,
            Position::File,
            format!(
                "files of several producers ({}): point at one producer's folder",
                many.iter().map(|r| r.name()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}
