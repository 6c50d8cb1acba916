//! One dumped record read by meaning. A producer decodes a file and says how it names
//! each [`Field`]; a tool asks for the field (`record.tensor(Field::OldLogProbs)`) and
//! never sees the producer's key or the file's byte format. This is the lazy face of the
//! step model that dumpdiff's hot path reads: tensors stay in the file's mapped storage
//! until a comparison decodes the rows it needs.

use std::sync::Arc;

use memmap2::{Mmap, UncheckedAdvice};

use crate::tensor::{DType, Tensor};
use crate::value::Value;

/// The memory map a whole-batch record's tensors are stored in: they stay mapped for the
/// whole run, but a comparison releases the rows it has read, so that peak memory follows
/// the cells in flight, not the batch.
#[derive(Debug, Clone)]
pub struct Pages {
    map: Arc<Mmap>,
}

impl Pages {
    /// The pages of `map`.
    pub fn new(map: Arc<Mmap>) -> Pages {
        Pages { map }
    }

    /// Let the kernel drop `bytes` (a window of this map) from this process's memory; a
    /// later read faults the same file bytes back in from the page cache.
    pub fn release(&self, bytes: &[u8]) {
        let base = self.map.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        let Some(offset) = start.checked_sub(base) else {
            return;
        };
        if bytes.is_empty() || offset + bytes.len() > self.map.len() {
            return;
        }
        // SAFETY: the map is a read-only shared mapping of a file (`Mmap::map`) that this
        // crate never writes: MADV_DONTNEED only drops page-table entries, and the next
        // read of any slice of it sees the same file bytes again. A failure (it is only
        // advice) changes nothing.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, offset, bytes.len())
        };
    }

    /// [`Pages::release`] of the whole map.
    pub fn release_all(&self) {
        self.release(&self.map[..]);
    }
}

/// What a dumped field means, whatever its producer calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// Token ids of each row `[B, T]` (the rows' identity).
    InputIds,
    /// The model input's attention mask `[B, T]`.
    AttentionMask,
    /// Response positions `[B, T]` (1 where the loss may count the token).
    ResponseMask,
    /// The mask the loss actually averaged over `[B, T]`.
    EffectiveMask,
    /// The trainer's current log-probs `[B, T]`.
    LogProbs,
    /// The trainer's recomputed old-policy log-probs `[B, T]`.
    OldLogProbs,
    /// The reference policy's log-probs `[B, T]`.
    RefLogProbs,
    /// The rollout engine's log-probs `[B, T]`.
    RolloutLogProbs,
    /// Per-token entropy `[B, T]`.
    Entropy,
    /// Per-token advantages `[B, T]`.
    Advantages,
    /// The importance ratio per token `[B, T]`.
    ProbRatio,
    /// The per-token loss before aggregation `[B, T]`.
    ElementwiseLoss,
    /// A parameter tensor (any shape).
    Param,
    /// A gradient tensor (any shape).
    Gradient,
    /// The total loss (scalar).
    Loss,
    /// The policy-gradient term (scalar).
    PgLoss,
    /// The entropy term (scalar).
    EntropyLoss,
    /// The KL term before its coefficient (scalar).
    KlLoss,
}

/// How a producer names each field in its files (`None`: it never dumps that field).
pub type FieldNames = fn(Field) -> Option<&'static str>;

/// A dumped number with the dtype it was stored in (`I64` for Python ints and bools, a
/// tensor's own dtype, else `F64`), so a comparison can allow for its precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Number {
    /// The value, widened to f64.
    pub value: f64,
    /// The dtype it was dumped in.
    pub dtype: DType,
}

impl Number {
    /// The number a scalar value holds (a 1-element tensor counts), else `None`.
    fn of(v: &Value) -> Option<Number> {
        let dtype = match v {
            Value::Int(_) | Value::Bool(_) => DType::I64,
            Value::Tensor(t) => t.dtype(),
            _ => DType::F64,
        };
        Some(Number {
            value: v.as_f64()?,
            dtype,
        })
    }
}

/// One decoded dump file with its producer's names for its fields.
#[derive(Debug, Clone)]
pub struct Record {
    value: Value,
    names: FieldNames,
    pages: Option<Pages>,
}

/// The name of the nested dict of run settings a loss record echoes (its `extra_info`).
const SETTINGS: &str = "extra_info";
/// The name of the nested dict of logged metrics a loss record holds.
const METRICS: &str = "metrics";

impl Record {
    /// A decoded file as its producer names its fields.
    pub fn new(value: Value, names: FieldNames) -> Record {
        Record {
            value,
            names,
            pages: None,
        }
    }

    /// This record with the memory map its tensors are stored in.
    pub fn with_pages(mut self, pages: Pages) -> Record {
        self.pages = Some(pages);
        self
    }

    /// The memory map its tensors are stored in, when it was read from one and kept.
    pub fn pages(&self) -> Option<&Pages> {
        self.pages.as_ref()
    }

    /// The raw entry under `f`, `None` when absent or Python `None`.
    fn entry(&self, f: Field) -> Option<&Value> {
        let key = (self.names)(f)?;
        self.value.get(key).filter(|v| !matches!(v, Value::None))
    }

    /// Whether the record holds `f`.
    pub fn has(&self, f: Field) -> bool {
        self.entry(f).is_some()
    }

    /// The tensor under `f` (a nested list becomes one), `None` when absent or not
    /// tensor-shaped.
    pub fn tensor(&self, f: Field) -> Option<Tensor> {
        self.entry(f)?.to_tensor()
    }

    /// The number under `f`, `None` when absent or not a scalar.
    pub fn number(&self, f: Field) -> Option<Number> {
        Number::of(self.entry(f)?)
    }

    /// A run setting the record echoes (`extra_info[name]`: coefficients, clip bounds),
    /// when it is a number.
    pub fn setting(&self, name: &str) -> Option<f64> {
        self.value.get(SETTINGS)?.get(name)?.as_f64()
    }

    /// A run setting the record echoes, when it is text (an aggregation mode's name).
    pub fn setting_text(&self, name: &str) -> Option<&str> {
        self.value.get(SETTINGS)?.get(name)?.as_str()
    }

    /// The logged metrics, in their dumped order: each name with its number (`None` when
    /// the entry is not a scalar). `None` when the record holds no metrics dict.
    pub fn metrics(&self) -> Option<Vec<(&str, Option<Number>)>> {
        let m = self.value.get(METRICS)?.as_dict()?;
        Some(
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?, Number::of(v))))
                .collect(),
        )
    }

    /// The metric `name`, `None` when absent.
    pub fn metric(&self, name: &str) -> Option<Option<Number>> {
        let v = self.value.get(METRICS)?.get(name)?;
        Some(Number::of(v))
    }

    /// The decoded contents as the file holds them, for a producer's own mapping (a
    /// trajectory list, a datum list). Tools read fields; `tests/layers.rs` flags a tool
    /// file that calls this.
    pub fn raw(&self) -> &Value {
        &self.value
    }

    /// Drop the decoded contents (the record stays, empty), freeing its memory early.
    pub fn clear(&mut self) {
        self.value = Value::None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(f: Field) -> Option<&'static str> {
        match f {
            Field::LogProbs => Some("lp"),
            Field::Loss => Some("loss"),
            _ => None,
        }
    }

    fn dict(items: Vec<(&str, Value)>) -> Value {
        Value::Dict(
            items
                .into_iter()
                .map(|(k, v)| (Value::Str(k.into()), v))
                .collect(),
        )
    }

    #[test]
    fn fields_are_read_by_the_producers_names() {
        let r = Record::new(
            dict(vec![
                (
                    "lp",
                    Value::List(vec![Value::Float(-1.5), Value::Float(-0.25)]),
                ),
                ("loss", Value::Int(3)),
                ("entropy", Value::Float(1.0)),
                (
                    "extra_info",
                    dict(vec![
                        ("kl_coef", Value::Float(0.1)),
                        ("mode", Value::Str("x".into())),
                    ]),
                ),
                (
                    "metrics",
                    dict(vec![
                        ("a", Value::Float(2.0)),
                        ("b", Value::Str("s".into())),
                    ]),
                ),
            ]),
            names,
        );
        assert_eq!(
            r.tensor(Field::LogProbs).unwrap().to_f64_vec(),
            vec![-1.5, -0.25]
        );
        assert_eq!(
            r.number(Field::Loss),
            Some(Number {
                value: 3.0,
                dtype: DType::I64
            })
        );
        // a key the producer does not map is not read, whatever the file holds
        assert!(!r.has(Field::Entropy));
        assert_eq!(r.setting("kl_coef"), Some(0.1));
        assert_eq!(r.setting("mode"), None);
        assert_eq!(r.setting_text("mode"), Some("x"));
        let m = r.metrics().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, "a");
        assert_eq!(m[0].1.map(|n| n.value), Some(2.0));
        assert_eq!(m[1].1, None);
        assert_eq!(r.metric("c"), None);
    }
}
