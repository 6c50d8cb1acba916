//! NexRL's self-hosted trainer (SPEC §2): `trajectory/step_N` (NexRL `Trajectory`
//! objects, also the format of the remote-API `prepared_trajectories/`),
//! `old_log_probs/step_N` (the whole batch), `forward_data/step_N_rankR_microM`
//! (the trainer's forward pass), `loss/step_N_rankR_microM`, `param/`, `gradient/`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;
use crate::model::conventions::{ConventionKey, ConventionSource, ConventionValue, Conventions};
use crate::model::step::{LogProbSource, LossRecord, ParamRecord, TokenBatch};
use crate::model::trajectory::{Provenance, Trajectory, TrajectoryBatch, TrajectoryIds};
use crate::model::tree::Kind;
use crate::producers::StepMapping;
use crate::producers::{
    field, id_text, opt_f64, opt_floats, opt_ints, opt_tensor, scalar_of, seq, unreadable,
};
use crate::value::Value;

/// `trajectory/` (and `prepared_trajectories/`): the list of trajectories.
pub const TRAJECTORIES: &str = "trajectories";
/// Batch-level advantages, one per trajectory (`prepared_trajectories/`).
pub const ADVANTAGES: &str = "advantages";
/// A trajectory's prompt + response token ids.
pub const TOKENS: &str = "tokens";
/// A trajectory's 0/1 mask of the tokens the loss sees.
pub const LOSS_MASK: &str = "loss_mask";
/// A trajectory's scalar reward.
pub const REWARD: &str = "reward";
/// A trajectory's free-form fields (group ids, score).
pub const EXTRA_FIELDS: &str = "extra_fields";
/// The reward when `reward` is absent: `extra_fields.score`.
pub const SCORE: &str = "score";
/// Validation-rollout flag.
pub const IS_VAL: &str = "is_val";
/// The id keys a trajectory carries, in `extra_fields` (or at its top level).
pub const ID_FIELDS: [&str; 4] = ["group_id", "uid", "run_id", "task_id"];
/// The keys that name a trajectory's group, in the order they are tried.
pub const GROUP_KEYS: [&str; 2] = ["group_id", "uid"];

/// `old_log_probs/`: the whole batch's `[N, T]` old log-probs, rows in `trajectory/` order.
pub const OLD_LOG_PROBS: &str = "old_log_probs";
/// `forward_data/`: the reference policy's log-probs `[mb, T]` (when a KL term is used).
pub const REF_LOG_PROBS: &str = "ref_log_probs";
/// `forward_data/`: the current policy's log-probs `[mb, T]`.
pub const LOG_PROBS: &str = "log_probs";
/// `forward_data/`: per-token entropy `[mb, T]`.
pub const ENTROPY: &str = "entropy";
/// `forward_data/`: 1 on response tokens `[mb, T]`.
pub const RESPONSE_MASK: &str = "response_mask";
/// `forward_data/`: prompt (left-padded) + response (right-padded) ids `[mb, S]`.
pub const INPUT_IDS: &str = "input_ids";
/// Every per-token key of a `forward_data/` file.
pub const FORWARD_DATA_KEYS: [&str; 4] = [LOG_PROBS, ENTROPY, RESPONSE_MASK, INPUT_IDS];
/// `loss/`: the optimised loss.
pub const LOSS: &str = "loss";
/// `loss/`: the policy-gradient term.
pub const PG_LOSS: &str = "pg_loss";
/// `loss/`: the entropy term.
pub const ENTROPY_LOSS: &str = "entropy_loss";
/// `loss/`: the trainer's metrics dict.
pub const METRICS: &str = "metrics";
/// `param/`: the parameter tensor.
pub const PARAM: &str = "param";
/// `gradient/`: the gradient tensor.
pub const GRADIENT: &str = "gradient";
/// `param/`, `gradient/`: the parameter's name.
pub const PARAM_NAME: &str = "param_name";
/// `loss/`: the trainer's settings echoed with the loss (coefficients among them).
pub const EXTRA_INFO: &str = "extra_info";
/// `extra_info`: the entropy coefficient of `loss = pg_loss − c · entropy_loss`.
pub const ENTROPY_COEFF: &str = "entropy_coeff";
/// `extra_info`: verl's `loss_agg_mode` (`token-mean`, `seq-mean-token-sum`, …), when echoed.
pub const LOSS_AGG_MODE: &str = "loss_agg_mode";
/// `extra_info`: the divisor of `seq-mean-token-sum-norm` (verl's `loss_scale_factor`).
pub const LOSS_SCALE_FACTOR: &str = "loss_scale_factor";
/// `extra_info`: the KL coefficient of `loss = pg_loss − … + c · kl_loss`.
pub const KL_COEF: &str = "kl_coef";
/// `extra_info`: verl's spelling of [`KL_COEF`] (`actor.kl_loss_coef`), read as the same.
pub const KL_LOSS_COEF: &str = "kl_loss_coef";
/// `extra_info`: verl's KL estimator (`kl_loss_type`: `kl`, `mse`, `low_var_kl`, …), when echoed.
pub const KL_LOSS_TYPE: &str = "kl_loss_type";
/// `extra_info` keys read as loss coefficients.
pub const COEFFICIENTS: [&str; 3] = [ENTROPY_COEFF, KL_COEF, KL_LOSS_COEF];

/// The KL coefficient among a loss record's echoed coefficients: [`KL_COEF`], else
/// verl's [`KL_LOSS_COEF`].
pub fn kl_coef(coefficients: &std::collections::BTreeMap<String, f64>) -> Option<f64> {
    coefficients
        .get(KL_COEF)
        .or_else(|| coefficients.get(KL_LOSS_COEF))
        .copied()
}
/// `metrics` keys read as KL terms.
pub const KL_METRICS: [&str; 3] = ["approx_kl", "kl_loss", "kl"];

/// A trajectory's group: `extra_fields.group_id`, else `extra_fields.uid`, else the same
/// keys at the top level (str or int; other types are skipped).
pub fn group_of(t: &Value) -> Option<String> {
    let ef = t.get(EXTRA_FIELDS);
    let sources = [ef, ef, Some(t), Some(t)];
    let keys = [GROUP_KEYS[0], GROUP_KEYS[1], GROUP_KEYS[0], GROUP_KEYS[1]];
    for (src, k) in sources.into_iter().zip(keys) {
        if let Some(x) = src.and_then(|s| s.get(k)) {
            if let Some(s) = x.as_str() {
                return Some(s.to_string());
            }
            if let Some(i) = x.as_i64() {
                return Some(i.to_string());
            }
        }
    }
    None
}

/// The trajectories of a `trajectory/` or `prepared_trajectories/` file read as `v`.
/// Advantages come from a top-level `advantages` list, else each trajectory's own
/// `advantages` (first value). The reward is `reward`, else `extra_fields.score`.
///
/// Errors: no `trajectories` list; a present field of the wrong type (named
/// `trajectories[i].key`).
pub fn trajectories<'v>(file: &Path, v: &'v Value) -> Result<TrajectoryBatch<'v>> {
    let items = seq(v, TRAJECTORIES, file)?;
    // NexRL's remote-API trainer dumps `advantages` as each trajectory's
    // `extra_fields.get("advantages", [])` where its advantage step wrote "advantage": a
    // list of empty lists (nexrl/trainer/remote_api_trainer.py train, nex-agi/NexRL@6860191),
    // which holds no advantage, not NaNs
    let empty = field(v, ADVANTAGES)
        .and_then(Value::as_seq)
        .is_some_and(|a| {
            !a.is_empty()
                && a.iter()
                    .all(|x| x.as_seq().is_some_and(<[Value]>::is_empty))
        });
    let top_adv = match empty {
        true => None,
        false => opt_floats(v, ADVANTAGES, file, ADVANTAGES)?,
    };
    let rows = items
        .iter()
        .enumerate()
        .map(|(i, t)| trajectory(file, i, t, top_adv.as_deref()))
        .collect::<Result<_>>()?;
    Ok(TrajectoryBatch {
        source: Provenance {
            file: file.to_path_buf(),
            key: TRAJECTORIES.into(),
        },
        rows,
        batch_advantages: top_adv,
    })
}

/// Item `i` of a trajectory file's `trajectories` list read as `t`, into the model; the
/// file's batch-level `advantages` (when it has them) give the advantage. One rule for
/// [`trajectories`] and for a reader that digests items as the unpickler builds them.
///
/// Errors: a present field of the wrong type (named `trajectories[i].key`).
pub fn trajectory<'v>(
    file: &Path,
    i: usize,
    t: &'v Value,
    top_adv: Option<&[f64]>,
) -> Result<Trajectory<'v>> {
    let at = |k: &str| format!("{TRAJECTORIES}[{i}].{k}");
    let extra = field(t, EXTRA_FIELDS);
    let reward = match opt_f64(t, REWARD, file, &at(REWARD))? {
        Some(r) => Some(r),
        None => match extra {
            Some(e) => opt_f64(e, SCORE, file, &at(&format!("{EXTRA_FIELDS}.{SCORE}")))?,
            None => None,
        },
    };
    let advantage = match top_adv.and_then(|a| a.get(i).copied()) {
        Some(a) => Some(a),
        None => opt_floats(t, ADVANTAGES, file, &at(ADVANTAGES))?.and_then(|a| a.first().copied()),
    };
    let id = |k: &str| id_text(extra.and_then(|e| e.get(k)));
    Ok(Trajectory {
        index: i,
        tokens: opt_ints(t, TOKENS, file, &at(TOKENS))?,
        loss_mask: opt_ints(t, LOSS_MASK, file, &at(LOSS_MASK))?,
        reward,
        advantage,
        group: group_of(t),
        ids: TrajectoryIds {
            group_id: id(ID_FIELDS[0]),
            uid: id(ID_FIELDS[1]),
            run_id: id(ID_FIELDS[2]),
            task_id: id(ID_FIELDS[3]),
            int_ids: ID_FIELDS.map(|k| {
                matches!(
                    extra.and_then(|e| e.get(k)),
                    Some(Value::Int(_) | Value::BigInt(_))
                )
            }),
        },
        is_val: t.get(IS_VAL).and_then(Value::as_i64).map(|b| b != 0),
    })
}

/// The loss record of a `loss/` file read as `v` (NexRL's self-hosted and weaver trainers
/// write the same dict): `loss`, `pg_loss`, `entropy_loss`, the numbers of `metrics`
/// (KL terms among them) and the coefficients echoed in `extra_info`.
///
/// Errors: `loss`, `pg_loss`, `entropy_loss` or a coefficient present but not a number;
/// `metrics` or `extra_info` present but not a dict. Other metrics that are not numbers
/// are free-form and left out.
pub fn loss_record(file: &Path, v: &Value) -> Result<LossRecord> {
    let mut rec = LossRecord {
        loss: opt_f64(v, LOSS, file, LOSS)?,
        pg_loss: opt_f64(v, PG_LOSS, file, PG_LOSS)?,
        entropy_loss: opt_f64(v, ENTROPY_LOSS, file, ENTROPY_LOSS)?,
        source: Some(Provenance {
            file: file.to_path_buf(),
            key: String::new(),
        }),
        coefficients_at: Some(EXTRA_INFO.to_string()),
        ..LossRecord::default()
    };
    if let Some(m) = field(v, METRICS) {
        let items = m
            .as_dict()
            .ok_or_else(|| unreadable(file, METRICS, "a dict", m))?;
        for (k, x) in items {
            if let (Some(k), Some(x)) = (k.as_str(), scalar_of(x)) {
                if KL_METRICS.contains(&k) {
                    rec.kl.insert(k.to_string(), x);
                }
                rec.metrics.insert(k.to_string(), x);
            }
        }
    }
    if let Some(e) = field(v, EXTRA_INFO) {
        if e.as_dict().is_none() {
            return Err(unreadable(file, EXTRA_INFO, "a dict", e));
        }
        for k in COEFFICIENTS {
            let at = format!("{EXTRA_INFO}.{k}");
            if let Some(c) = opt_f64(e, k, file, &at)? {
                rec.coefficients.insert(k.to_string(), c);
            }
        }
    }
    Ok(rec)
}

/// What a loss file read as `v` echoes of its composition beyond its coefficients:
/// `extra_info.loss_agg_mode`, `extra_info.kl_loss_type` (strings), `extra_info.
/// loss_scale_factor`, and its aggregated KL term (top-level `kl_loss`).
pub fn loss_echo(v: &Value) -> LossEcho {
    let extra = field(v, EXTRA_INFO);
    let text = |k: &str| {
        extra
            .and_then(|e| e.get(k))
            .and_then(|x| x.as_str().map(str::to_string))
    };
    LossEcho {
        agg: text(LOSS_AGG_MODE),
        kl_type: text(KL_LOSS_TYPE),
        scale: extra
            .and_then(|e| e.get(LOSS_SCALE_FACTOR))
            .and_then(Value::as_f64),
        kl_loss: field(v, KL_LOSS_KEY).and_then(Value::as_f64),
    }
}

/// The top-level key of a loss file's aggregated KL term.
pub const KL_LOSS_KEY: &str = "kl_loss";

/// See [`loss_echo`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossEcho {
    /// `extra_info.loss_agg_mode`.
    pub agg: Option<String>,
    /// `extra_info.kl_loss_type`.
    pub kl_type: Option<String>,
    /// `extra_info.loss_scale_factor`.
    pub scale: Option<f64>,
    /// The top-level `kl_loss`.
    pub kl_loss: Option<f64>,
}

/// The per-token batch of a `forward_data/` file: current log-probs, entropy, response
/// mask, input ids.
///
/// Errors: one of them present but not a tensor.
pub fn forward_data(file: &Path, v: &Value) -> Result<TokenBatch> {
    let mut b = TokenBatch {
        entropy: opt_tensor(v, ENTROPY, file)?,
        response_mask: opt_tensor(v, RESPONSE_MASK, file)?,
        input_ids: opt_tensor(v, INPUT_IDS, file)?,
        ..TokenBatch::default()
    };
    if let Some(t) = opt_tensor(v, LOG_PROBS, file)? {
        b.log_probs.insert(LogProbSource::Current, t);
    }
    if let Some(t) = opt_tensor(v, REF_LOG_PROBS, file)? {
        b.log_probs.insert(LogProbSource::Reference, t);
    }
    Ok(b)
}

/// The whole batch's old log-probs of an `old_log_probs/` file (rows in `trajectory/`
/// order).
///
/// Errors: the key present but not a tensor.
pub fn old_log_probs(file: &Path, v: &Value) -> Result<TokenBatch> {
    let mut b = TokenBatch::default();
    if let Some(t) = opt_tensor(v, OLD_LOG_PROBS, file)? {
        b.log_probs.insert(LogProbSource::Old, t);
    }
    Ok(b)
}

/// The conventions a loss file states in its `extra_info`: the coefficients the mapping
/// read (`coefficients`), `loss_agg_mode` with `loss_scale_factor`, `kl_loss_type`.
/// The first file that states one wins (NexRL's self-hosted and weaver trainers echo
/// their config there, `nexrl/trainer/*_trainer.py`); the others state the same in every NexRL dump
/// (the trainer's config), and a later difference is the judge's to find per cell.
pub fn stated_conventions(
    file: &Path,
    v: &Value,
    coefficients: &BTreeMap<String, f64>,
    conventions: &mut Conventions,
) {
    let mut set = |key: ConventionKey, value: ConventionValue, k: &str| {
        if conventions.get(key).is_none() {
            conventions.set(
                key,
                value,
                ConventionSource::Dumped {
                    at: Provenance {
                        file: file.to_path_buf(),
                        key: format!("{}.{k}", EXTRA_INFO),
                    },
                },
            );
        }
    };
    if let Some(c) = coefficients.get(ENTROPY_COEFF) {
        set(
            ConventionKey::EntropyCoeff,
            ConventionValue::Number(*c),
            ENTROPY_COEFF,
        );
    }
    for k in [KL_COEF, KL_LOSS_COEF] {
        if let Some(c) = coefficients.get(k) {
            set(ConventionKey::KlCoeff, ConventionValue::Number(*c), k);
        }
    }
    let echo = loss_echo(v);
    // the scale is stated beside a mode (a non-string mode is not an echo)
    if let Some(mode) = echo.agg {
        set(
            ConventionKey::Aggregation,
            ConventionValue::Name(mode),
            LOSS_AGG_MODE,
        );
        if let Some(s) = echo.scale {
            set(
                ConventionKey::LossScale,
                ConventionValue::Number(s),
                LOSS_SCALE_FACTOR,
            );
        }
    }
    if let Some(t) = echo.kl_type {
        set(
            ConventionKey::KlEstimator,
            ConventionValue::Name(t),
            KL_LOSS_TYPE,
        );
    }
}

/// The conventions a `loss/` file states ([`stated_conventions`]); nothing for another
/// kind.
///
/// Errors: the file's loss record unreadable ([`loss_record`]).
pub fn loss_conventions(kind: Kind, file: &Path, v: &Value, c: &mut Conventions) -> Result<()> {
    if kind == Kind::Loss {
        let rec = loss_record(file, v)?;
        stated_conventions(file, v, &rec.coefficients, c);
    }
    Ok(())
}

/// The self-hosted trainer's [`StepMapping`].
pub struct NexrlSelfHosted;

impl StepMapping for NexrlSelfHosted {
    fn conventions(&self, kind: Kind, file: &Path, v: &Value, c: &mut Conventions) -> Result<()> {
        loss_conventions(kind, file, v, c)
    }

    fn token_batch(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<TokenBatch>> {
        match kind {
            Kind::ForwardData => forward_data(file, v).map(Some),
            Kind::OldLogProbs => old_log_probs(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn trajectories<'v>(
        &self,
        kind: Kind,
        file: &Path,
        v: &'v Value,
    ) -> Result<Option<TrajectoryBatch<'v>>> {
        match kind {
            Kind::Trajectory => trajectories(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn loss_record(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<LossRecord>> {
        match kind {
            Kind::Loss => loss_record(file, v).map(Some),
            _ => Ok(None),
        }
    }

    fn param(&self, kind: Kind, file: &Path, v: &Value) -> Result<Option<ParamRecord>> {
        param(kind, file, v)
    }
}

/// The record of a `param/` or `gradient/` file (`None` for any other kind).
///
/// Errors: the tensor missing or not a tensor; `param_name` not a string.
pub fn param(kind: Kind, file: &Path, v: &Value) -> Result<Option<ParamRecord>> {
    let (key, gradient) = match kind {
        Kind::Param => (PARAM, false),
        Kind::Gradient => (GRADIENT, true),
        _ => return Ok(None),
    };
    let tensor = opt_tensor(v, key, file)?.ok_or_else(|| {
        crate::error::Error::format(
            file,
            crate::error::Position::Key(key.into()),
            "missing: no such key",
        )
    })?;
    let name = match field(v, PARAM_NAME) {
        Some(x) => Some(
            x.as_str()
                .ok_or_else(|| unreadable(file, PARAM_NAME, "a string", x))?
                .to_string(),
        ),
        None => None,
    };
    Ok(Some(ParamRecord {
        name,
        tensor,
        gradient,
    }))
}

impl super::StepReader for NexrlSelfHosted {
    fn name(&self) -> &'static str {
        "nexrl-self-hosted"
    }

    fn detect(&self, root: &Path) -> bool {
        super::nexrl_tree::detect(root, crate::model::tree::Producer::SelfHosted)
    }

    fn steps(&self, root: &Path) -> Result<Vec<i64>> {
        super::nexrl_tree::steps(root)
    }

    fn read_step(&self, root: &Path, step: i64) -> Result<crate::model::step::StepDump> {
        super::nexrl_tree::read_step(root, step, self.name())
    }

    fn open_step(&self, root: &Path, step: i64) -> Result<Box<dyn crate::model::step::StepCells>> {
        Ok(Box::new(super::nexrl_tree::open_step(
            root,
            step,
            self.name(),
        )?))
    }
}
