//! The metric-alias table: which raw log keys mean which canonical metric (SPEC §3).
//!
//! The table is data (`aliases.json`, shipped inside the binary) so a user can extend it
//! with `logscan --aliases FILE` without rebuilding.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, FormatError, Position, Result};

/// The alias data file shipped with the crate.
pub const BUILTIN_ALIASES: &str = include_str!("aliases.json");

/// Name a detector lists in its metrics to keep every reward component column.
pub const REWARD_COMPONENTS: &str = "reward_components";
/// Prefix of the canonical name of one reward component (`reward/format_reward`).
pub const REWARD_COMPONENT_PREFIX: &str = "reward/";

/// Raw-key prefix of a stage's seconds in one iteration (`stage_s/samples_generated`), as the
/// text reader writes it from `[Micro k] 2. Samples generated: … time=…s` lines.
pub const STAGE_FIELD: &str = "stage_s/";
/// Canonical prefix of one stage's time (`stage/samples_generated`).
pub const STAGE_PREFIX: &str = "stage/";
/// Name a detector lists in its metrics to keep every stage column.
pub const STAGES: &str = "stages";

/// The canonical name of a stage-time raw key, when it is one.
pub fn stage_metric(raw: &str) -> Option<String> {
    let name = raw.strip_prefix(STAGE_FIELD)?;
    (!name.is_empty()).then(|| format!("{STAGE_PREFIX}{name}"))
}

/// Canonical metric: the prompt groups of a step whose samples all got the same reward
/// (no advantage signal), summed over slime's per-reward counts ([`is_zero_std_count`]).
pub const ZERO_STD_GROUPS: &str = "zero_std_groups";

/// Canonical metric the dead-group detector reads: the share of a step's groups whose
/// rewards all equal.
pub const FRAC_ZERO_STD: &str = "frac_reward_zero_std";

/// True for slime's dead-group counts `rollout/zero_std/count_<reward>`: the number of
/// prompt groups of a rollout whose samples all got reward `<reward>` (rounded to one
/// decimal, `count_0.0`; older slime wrote `count_0`), one key per reward value, none
/// when no group is dead (THUDM/slime `slime/ray/rollout.py` `_compute_zero_std_metrics`,
/// commit a51f0714179da87b1abdff81f99ae1e22034be92). Evaluation's
/// `eval/<dataset>/zero_std/count_…` are not training groups and are left out.
pub fn is_zero_std_count(raw: &str) -> bool {
    let raw = raw.strip_prefix("metrics.").unwrap_or(raw);
    raw.strip_prefix("rollout/zero_std/count_")
        .or_else(|| raw.strip_prefix("zero_std/count_"))
        .is_some_and(|r| r.parse::<f64>().is_ok())
}

/// True for a raw key of a preference-optimisation trainer's family (TRL DPO/KTO/CPO/ORPO/
/// SimPO: `rewards/chosen`, `rewards/rejected`, `rewards/margins`, `rewards/accuracies`,
/// `logps/…`, `logits/…`): they are the implicit rewards of the preference loss, not reward
/// functions.
pub fn is_preference_key(raw: &str) -> bool {
    let raw = raw.strip_prefix("train/").unwrap_or(raw);
    ["rewards/", "logps/", "logits/"].iter().any(|p| {
        raw.strip_prefix(p).is_some_and(|rest| {
            ["chosen", "rejected", "margins", "accuracies"]
                .iter()
                .any(|k| rest.starts_with(k))
        })
    })
}

/// True when the built-in aliases (or a loss/grad-norm family) name `raw` as a training
/// metric: what tells a pasted block of metrics from a line of settings
/// (`master_port=…, rank=2, world_size=5`).
pub fn names_a_metric(raw: &str) -> bool {
    static TABLE: std::sync::OnceLock<Option<AliasTable>> = std::sync::OnceLock::new();
    let known = TABLE
        .get_or_init(|| AliasTable::builtin().ok())
        .as_ref()
        .is_some_and(|t| t.resolve(raw).is_some());
    known || family_of(raw).is_some()
}

/// Keys that say where a record is, not how training goes (never a metric to map).
pub fn is_bookkeeping_key(k: &str) -> bool {
    matches!(
        k,
        "step"
            | "global_step"
            | "epoch"
            | "episode"
            | "iteration"
            | "iter"
            | "step_inferred"
            | "timestamp"
            | "time"
            | "current_steps"
            | "total_steps"
            | "samples_processed"
            // Megatron's iteration line: where the run is, and the fp16 scaler's state
            | "consumed_samples"
            | "consumed_tokens"
            | "global_batch_size"
            | "loss_scale"
            | "number_of_skipped_iterations"
    ) || k.starts_with("summary/")
        || is_progress_or_throughput(k)
}

/// Where the run is (an epoch or step counter under another name: verl `training/epoch`,
/// `training/global_step`, dllogger's `Training Epoch`), how fast or how big it runs
/// (verl `perf/*`, `global_seqlen/*`, `prompt_length/*`; Megatron-DeepSpeed `samples per
/// second`, `TFLOPs`, `actual seqlen`; `it/s`) and the schedule's settings (`actor/lr`,
/// `actor/kl_coef`, slime `train/lr-pg_0`): read, and rightly judged by no failure rule.
fn is_progress_or_throughput(k: &str) -> bool {
    let last = k.rsplit('/').next().unwrap_or(k);
    let under = |p: &str| k.starts_with(p) || k.contains(&format!("/{p}"));
    last.ends_with("epoch")
        || matches!(
            last,
            "global_step" | "lr" | "kl_coef" | "it/s" | "s" | "tflops"
        )
        || last.starts_with("lr-")
        || under("perf/")
        || under("global_seqlen/")
        || under("prompt_length/")
        || k.contains("per_second")
        || k.contains("mfu")
        || k == "actual_seqlen"
}

/// The reward function a raw key reports the per-step mean of, when it does: TRL
/// `rewards/<fn>/mean` (≥ 0.17) and `rewards/<fn>` (older, notebook tables), ms-swift
/// `rewards/<Fn>/mean`, DebugTrainer `train_<fn>_reward_mean`.
pub fn reward_component(raw: &str) -> Option<String> {
    let raw = raw.strip_prefix("metrics.").unwrap_or(raw);
    if is_preference_key(raw) {
        return None;
    }
    if let Some(rest) = raw.strip_prefix("rewards/") {
        let name = match rest.split_once('/') {
            Some((name, "mean")) => name,
            Some(_) => return None,
            None => rest,
        };
        return (!name.is_empty() && name != "mean" && name != "std").then(|| name.to_string());
    }
    let mid = raw.strip_prefix("train_")?.strip_suffix("_reward_mean")?;
    (!mid.is_empty() && mid != "total" && mid != "grouped").then(|| format!("{mid}_reward"))
}

/// Canonical metric marking evaluation activity at a step (its value is not read): the
/// eval mark readers add, and every key an evaluation writes (`val-core/…`, `eval_…`).
pub const EVAL_ACTIVITY: &str = "eval_activity";

/// True for a raw key only an evaluation writes: verl `val-core/…`, `val-aux/…`, HF
/// `eval_…`, `eval/…` (not TRL PPO's `val/…`, which are value-head statistics).
pub fn is_eval_key(raw: &str) -> bool {
    ["val-core/", "val-aux/", "eval_", "eval/"]
        .iter()
        .any(|p| raw.starts_with(p))
}

/// Raw key → (canonical metric index, priority; lower wins) lookups.
#[derive(Debug, Clone)]
pub struct AliasTable {
    canonical: Vec<String>,
    map: HashMap<String, (usize, u32)>,
}

impl AliasTable {
    /// The built-in table.
    pub fn builtin() -> Result<AliasTable> {
        let mut t = AliasTable {
            canonical: Vec::new(),
            map: HashMap::new(),
        };
        t.extend_from_str(BUILTIN_ALIASES, Path::new("<builtin aliases.json>"), 1000)?;
        Ok(t)
    }

    /// The built-in table extended by a user file whose keys take precedence.
    pub fn with_user_file(path: &Path) -> Result<AliasTable> {
        let text = if crate::formats::source::is_remote(path) {
            // an object-storage URL (Python's `aliases=`): one GET
            String::from_utf8(crate::formats::source::read_all(path)?)
                .map_err(|_| Error::format(path, crate::error::Position::File, "not UTF-8"))?
        } else {
            std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?
        };
        let mut t = AliasTable {
            canonical: Vec::new(),
            map: HashMap::new(),
        };
        t.extend_from_str(&text, path, 0)?;
        t.extend_from_str(BUILTIN_ALIASES, Path::new("<builtin aliases.json>"), 1000)?;
        Ok(t)
    }

    /// Add `{canonical: [raw, …]}` entries; an existing raw key keeps its mapping.
    fn extend_from_str(&mut self, text: &str, path: &Path, base_priority: u32) -> Result<()> {
        let v = crate::json::parse_value(text).map_err(|e| e.in_file(path))?;
        let entries = v.as_dict().ok_or_else(|| {
            Error::format(
                path,
                Position::File,
                "alias file must be a JSON object {\"canonical\": [\"raw key\", …]}",
            )
        })?;
        for (k, raws) in entries {
            let Some(canon) = k.as_str() else { continue };
            if canon.starts_with('_') {
                continue;
            }
            let list = raws.as_seq().ok_or_else(|| {
                FormatError::new(
                    Position::Key(canon.to_string()),
                    "expected a list of raw key names",
                )
                .in_file(path)
            })?;
            let idx = self.canonical_index_or_insert(canon);
            // The canonical name itself always maps to itself.
            self.map
                .entry(canon.to_string())
                .or_insert((idx, base_priority));
            for (i, raw) in list.iter().enumerate() {
                let Some(raw) = raw.as_str() else {
                    return Err(FormatError::new(
                        Position::Key(format!("{canon}[{i}]")),
                        format!("expected a string, found {}", raw.type_name()),
                    )
                    .in_file(path));
                };
                self.map
                    .entry(raw.to_string())
                    .or_insert((idx, base_priority + i as u32 + 1));
            }
        }
        Ok(())
    }

    fn canonical_index_or_insert(&mut self, name: &str) -> usize {
        match self.canonical.iter().position(|c| c == name) {
            Some(i) => i,
            None => {
                self.canonical.push(name.to_string());
                self.canonical.len() - 1
            }
        }
    }

    /// Add canonical metric `name` (a reward component found in a log) if new; its index.
    pub fn add_canonical(&mut self, name: &str) -> usize {
        let idx = self.canonical_index_or_insert(name);
        self.map.entry(name.to_string()).or_insert((idx, 0));
        idx
    }

    /// The canonical metric names, in table order.
    pub fn canonical_names(&self) -> &[String] {
        &self.canonical
    }

    /// The index of canonical metric `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.canonical.iter().position(|c| c == name)
    }

    /// The canonical metric (index, priority) a raw key means, trying the key as written,
    /// then without a `metrics.` prefix.
    pub fn resolve(&self, raw: &str) -> Option<(usize, u32)> {
        if let Some(r) = self.map.get(raw) {
            return Some(*r);
        }
        // `metrics.` (DebugTrainer nesting) and `train/` (W&B / tracker exports of TRL and
        // HF runs: `train/loss`, `train/reward_std`) name the same metrics.
        ["metrics.", "train/"]
            .iter()
            .find_map(|prefix| {
                raw.strip_prefix(prefix)
                    .and_then(|rest| self.map.get(rest))
                    .map(|&(i, p)| (i, p + 100))
            })
            .or_else(|| {
                // AReaL's stats scope the actor's numbers (`ppo_actor/…`, its optimiser
                // step's under `ppo_actor/update/…`) and name a mean `…/avg`
                // (`ppo_actor/update/actor_loss/avg`, `ppo_actor/advantages/max`).
                let rest = raw.strip_prefix("ppo_actor/")?;
                let rest = rest.strip_prefix("update/").unwrap_or(rest);
                let rest = rest.strip_suffix("/avg").unwrap_or(rest);
                self.map.get(rest).map(|&(i, p)| (i, p + 200))
            })
            .or_else(|| {
                // below every named alias (a named key of the same metric in the record wins)
                let name = family_of(raw)?;
                self.index_of(name).map(|i| (i, 1_000_000))
            })
    }
}

/// The metric a key no alias names stands for by its family (issue 31: map by meaning, not
/// a list per file): a `…grad_norm` or `…loss` of the value model (`value_`, `critic_`,
/// `vf_`), of the policy (`actor_`, `policy_`, `pg_`, rsl_rl's `surrogate_loss`), or of
/// another part (Dreamer's `model_grad_norm`, `image_loss`, an auxiliary head): `aux_*`,
/// whose non-finite values `nan-grad` reports like any other. Evaluation keys stay apart.
pub fn family_of(raw: &str) -> Option<&'static str> {
    let key = raw.rsplit('/').next().unwrap_or(raw).to_ascii_lowercase();
    if is_eval_key(raw) || key.starts_with("eval") || key.starts_with("val_") {
        return None;
    }
    let (grad, loss) = (key.ends_with("grad_norm"), key.ends_with("loss"));
    if !grad && !loss {
        return None;
    }
    let part = |prefixes: &[&str]| prefixes.iter().any(|p| key.starts_with(p));
    Some(if part(&["value", "critic", "vf_"]) {
        if grad {
            "critic_grad_norm"
        } else {
            "critic_loss"
        }
    } else if part(&["actor", "policy", "pg_", "surrogate"]) {
        if grad {
            "grad_norm"
        } else {
            "loss"
        }
    } else if grad {
        "aux_grad_norm"
    } else {
        "aux_loss"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_table_maps_spec_examples() {
        let t = AliasTable::builtin().unwrap();
        let name = |raw: &str| t.resolve(raw).map(|(i, _)| t.canonical_names()[i].clone());
        assert_eq!(name("actor/pg_loss").as_deref(), Some("loss"));
        assert_eq!(name("train_kl").as_deref(), Some("kl"));
        assert_eq!(name("metrics.kl").as_deref(), Some("kl"));
        assert_eq!(name("critic/score/mean").as_deref(), Some("reward_mean"));
        assert_eq!(
            name("token_count_summary.min").as_deref(),
            Some("completion_len_min")
        );
        assert_eq!(name("no_such_key"), None);
        // Metric families by meaning (issue 31): critic, rollout side, preference.
        for (raw, canonical) in [
            ("critic/vf_loss", "critic_loss"),
            ("cri_loss", "critic_loss"),
            ("critic/grad_norm", "critic_grad_norm"),
            ("rollout/truncated_ratio", "truncation_ratio"),
            ("rollout/response_len/mean", "completion_len_mean"),
            ("train/train_rollout_logprob_abs_diff", "logp_abs_diff_mean"),
            ("train/mean_gen_tokens_per_sample", "completion_len_mean"),
            ("train/token_mult_prob_error", "ratio_mean"),
            ("average_reward_score", "reward_mean"),
            ("rewards/accuracies", "pref_accuracy"),
            ("logps/rejected", "pref_logp_rejected"),
            // AReaL's actor stats (areal/engine/ppo/actor.py scopes).
            ("ppo_actor/task_reward/avg", "reward_mean"),
            ("ppo_actor/advantages/max", "adv_max"),
            ("ppo_actor/update/actor_loss/avg", "loss"),
            ("ppo_actor/update/grad_norm", "grad_norm"),
            ("ppo_actor/update/approx_kl/avg", "ppo_kl"),
            ("ppo_actor/no_eos_ratios/avg", "truncation_ratio"),
        ] {
            assert_eq!(name(raw).as_deref(), Some(canonical), "{raw}");
        }
        // DPO's implicit rewards are not reward functions; TRL GRPO's are.
        assert_eq!(reward_component("rewards/margins"), None);
        assert_eq!(reward_component("rewards/chosen"), None);
        assert_eq!(
            reward_component("rewards/format_reward/mean").as_deref(),
            Some("format_reward")
        );
        assert_eq!(
            stage_metric("stage_s/samples_generated").as_deref(),
            Some("stage/samples_generated")
        );
        // train_loss outranks step_loss.
        assert!(t.resolve("train_loss").unwrap().1 < t.resolve("step_loss").unwrap().1);
    }
}
