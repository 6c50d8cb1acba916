//! Generic `key: value` / `key=value` step lines, pipe-, comma- or space-separated, with a
//! step key anywhere on the line, and the consoles that write them:
//! - DeepSpeed-Chat step 3 (`applications/DeepSpeed-Chat/training/step3_rlhf_finetuning/main.py`,
//!   deepspeedai/DeepSpeedExamples): `epoch: 0|step: 3183|ppo_ep: 1|act_loss: 30.92|cri_loss:
//!   30.51|unsuper_loss: 0.0`, then `average reward score: -7.80` (attached to that step), and
//!   before it the timing line `|E2E latency=2.12s |Gather latency=0.00s (0.00%) |Generate
//!   time=1.59s (75.13%) |…` (attached to the step printed next);
//! - minimind (`trainer/train_grpo.py` @ 42a4e8c86a0e2157efb78f985fb5b5d716e40e11,
//!   jingyaogong/minimind): `Epoch:[1/1](5/100), Actor Loss: 0.1234, Aux Loss: 0.0000, Reward:
//!   0.5678, Avg Response Len: 123.45, Learning Rate: 0.00000008` — the step is `(k/N)` of
//!   epoch `e`, numbered `(e - 1) * N + k` so a second epoch does not restart the step;
//! - any line such as `step 12 | loss=0.3 | kl=0.01` or `iteration 5: loss: 0.3, reward: 1`.
//!
//! A step line needs a step and at least one other number; the step is never renumbered.

use super::lines::{split_top, value_with_unit};
use super::step_prefix::prefix_step;
use super::TextItem;
use crate::logs::steps::parse_number_text;
use crate::model::log::SourceKind;

/// Keys that carry the step (lowercased, spaces as `_`).
const STEP_KEYS: &[&str] = &[
    "step",
    "global_step",
    "steps",
    "iter",
    "iteration",
    "train/step",
    "training/global_step",
    // dllogger's `Training Iteration: 1787` (NVIDIA DeepLearningExamples' BERT), `Train step
    // 1040` written as a key
    "training_iteration",
    "training_step",
    "train_step",
    "train_iteration",
];

/// True for a key that carries the step: one of [`STEP_KEYS`], or a `global_…` counter
/// (`global iter: 69/ 160` of MiniLLM's `train | … | global iter: …` lines, `global_steps`);
/// an `inner iter` or `ppo epoch` counter is not the step.
fn is_step_key(k: &str) -> bool {
    STEP_KEYS.contains(&k)
        || k.strip_prefix("global_")
            .is_some_and(|r| matches!(r, "step" | "steps" | "iter" | "iteration" | "iterations"))
}

/// A key as written (`Avg Response Len`, `act_loss`) as a field name: lowercased, words
/// joined by `_`.
fn key_name(k: &str) -> String {
    // `Grad. Norm`, `Peak Mem.` (prime-rl's console): an abbreviation's dot is not a name.
    let words: Vec<&str> = k
        .split(|c: char| c.is_whitespace())
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| !w.is_empty())
        .collect();
    words.join("_").to_ascii_lowercase()
}

/// `key: value`, `key:value` or `key=value` → (key, value text); `None` when the part has no
/// separator or the key is not a name.
fn split_pair(part: &str) -> Option<(String, &str)> {
    let part = part.trim();
    let Some(i) = part.find(['=', ':']) else {
        return name_value(part);
    };
    let (k, v) = (&part[..i], &part[i + 1..]);
    // A Python logging prefix before the key (`… - cosmos - INFO - Step: 826/4725`): the
    // key is what follows its last ` - `.
    let k = k.rsplit(" - ").next().unwrap_or(k);
    let k = k.trim().trim_matches(|c| c == '\'' || c == '"');
    if k.is_empty()
        || k.len() > 60
        || !k.chars().next().is_some_and(|c| c.is_alphabetic())
        || !k
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '/' | ' ' | '.' | '-' | '(' | ')'))
    {
        return None;
    }
    Some((key_name(k), v.trim()))
}

/// `model_loss 5864.5`, `Avg Ep length 5.26` (DeepRL-Grounding's `Avg Reward 0.064`): one
/// to four words of letters, then one number (no separator), else `None`.
fn name_value(part: &str) -> Option<(String, &str)> {
    let part = part.trim();
    let (k, v) = part.rsplit_once(' ')?;
    let k = k.trim();
    let words: Vec<&str> = k.split_whitespace().collect();
    let ident = |w: &str| {
        w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/'))
    };
    (!words.is_empty()
        && words.len() <= 4
        && words.iter().all(|w| ident(w))
        && parse_number_text(v).is_some())
    .then(|| (key_name(k), v))
}

/// A value text (`0.123`, `'nan'`, `2.12s (75.13%)`, `3/100`, `812 MB`) → number, key suffix
/// of its unit.
fn value_of(v: &str) -> Option<(f64, &'static str)> {
    let v = v.trim().trim_matches(|c| c == '\'' || c == '"');
    // `1.59s (75.13%)`: the share in parentheses is derived, the value comes first.
    let v = match v.find(" (") {
        Some(i) => &v[..i],
        None => v,
    };
    // `-257.43 +- 63.18` (a mean and its spread): the mean
    let v = match v.find(" +- ").or_else(|| v.find(" ± ")) {
        Some(i) => &v[..i],
        None => v,
    };
    if let Some(x) = parse_number_text(v) {
        return Some((x, ""));
    }
    let mut words = v.split_whitespace();
    let num = words.next()?;
    let unit = words.next();
    if words.next().is_some() {
        return None;
    }
    value_with_unit(num, unit).map(|(x, suffix, used)| (x, if used { suffix } else { "" }))
}

/// The step of a `k/N` value or a plain integer.
fn step_value(v: &str) -> Option<i64> {
    let v = v.trim().trim_matches(|c| c == '\'' || c == '"');
    let head = v.split('/').next()?.trim();
    head.parse::<i64>().ok()
}

/// minimind's `Epoch:[e/E](k/N)` head → (step, rest of the line).
fn minimind_head(t: &str) -> Option<(i64, &str)> {
    let at = t.find("Epoch")?;
    let rest = t[at + 5..].trim_start_matches([':', ' ']);
    let rest = rest.strip_prefix('[')?;
    let (epoch, rest) = rest.split_once(']')?;
    let e: i64 = epoch.split('/').next()?.trim().parse().ok()?;
    let rest = rest.trim_start().strip_prefix('(')?;
    let (kn, rest) = rest.split_once(')')?;
    let (k, n) = kn.split_once('/')?;
    let (k, n): (i64, i64) = (k.trim().parse().ok()?, n.trim().parse().ok()?);
    let step = (e.max(1) - 1).saturating_mul(n).saturating_add(k);
    Some((step, rest.trim_start_matches([',', ' ', ':'])))
}

/// `step 12: loss: 0.3, …` → (12, `loss: 0.3, …`): a step prefix ending at the first colon.
fn strip_step_prefix(t: &str) -> Option<(i64, &str)> {
    let colon = t.find(':')?;
    let s = prefix_step(&t[..=colon])?;
    Some((s, &t[colon + 1..]))
}

/// The parts of a line: `|`-separated when it has pipes, else `,`-separated (outside
/// brackets and quotes) when it has commas, else whitespace-separated `key=value` tokens.
fn parts_of(body: &str) -> Vec<&str> {
    if body.contains('|') {
        body.split('|').collect()
    } else if body.contains(" / ") {
        // Dreamer's `expl_amount 0.0 / model_grad_norm nan / …`
        body.split(" / ").collect()
    } else if body.contains(", ") || body.contains(',') {
        split_top(body, ',')
    } else if body.contains('=') || (body.contains(':') && !body.contains(": ")) {
        // `loss=0.5 grad_norm=1.5`, minimind's `loss:8.863 lr:0.0002`.
        body.split_whitespace().collect()
    } else if let Some(pairs) = spaced_pairs(body) {
        pairs
    } else {
        vec![body]
    }
}

/// `epoch: 3451 loss: nan`, dllogger's `Training Epoch: 0 Training Iteration: 1787
/// average_loss: 2.35`: keys of one to four words (letters, `_`, `/`) each followed by `: `
/// and a number, nothing else on the line → the `key: value` parts.
fn spaced_pairs(body: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let colon = rest.find(": ")?;
        let key = &rest[..colon];
        let words = key.split_whitespace().count();
        if key.is_empty()
            || words > 4
            || !key.split_whitespace().all(|w| {
                w.starts_with(|c: char| c.is_ascii_alphabetic())
                    && w.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/'))
            })
        {
            return None;
        }
        let after = rest[colon + 2..].trim_start();
        let end = after.find(char::is_whitespace).unwrap_or(after.len());
        parse_number_text(&after[..end])?;
        let used = rest.len() - after.len() + end;
        parts.push(&rest[..used]);
        rest = after[end..].trim_start();
    }
    (parts.len() >= 2).then_some(parts)
}

/// `line` without a Python logging prefix of a time and a level (`2019-02-03
/// 08:03:36,499 INFO     …`, `15:41:30 SUCCESS …`): the message.
pub(super) fn without_log_prefix(t: &str) -> &str {
    for level in [" INFO ", " DEBUG ", " WARNING ", " ERROR ", " SUCCESS "] {
        if let Some(at) = t.find(level) {
            let head = &t[..at];
            let plain = t.starts_with(|c: char| c.is_ascii_digit())
                && head.chars().all(|c| {
                    c.is_ascii_digit() || matches!(c, '-' | ':' | ',' | '.' | ' ' | 'T' | '/')
                });
            // `%(asctime)s %(name)-12s: %(levelname)-8s %(message)s` behind mpirun's
            // `[1,0]<stdout>:` (`… 23:07:21,094 __main__    : INFO     Train step 1040 -- …`):
            // a head that holds a clock time and ends with the logger name's colon.
            let named = head.len() <= 120 && head.trim_end().ends_with(':') && has_clock(head);
            if plain || named {
                return t[at + level.len()..].trim_start();
            }
        }
    }
    t
}

/// True when `s` holds a clock time `hh:mm:ss`.
fn has_clock(s: &str) -> bool {
    let b = s.as_bytes();
    b.windows(8).any(|w| {
        w[0].is_ascii_digit()
            && w[1].is_ascii_digit()
            && w[2] == b':'
            && w[3].is_ascii_digit()
            && w[4].is_ascii_digit()
            && w[5] == b':'
            && w[6].is_ascii_digit()
            && w[7].is_ascii_digit()
    })
}

/// A dllogger console line (NVIDIA/dllogger `StdOutBackend`: `prefix_format` `"DLL {} - "`
/// of the timestamp, then the step as the script formats it, then each metric as
/// `"{} : {} {}"` of name, value and unit): `DLL 2020-05-29 11:31:45.763470 - Training
/// Epoch: 0 Training Iteration: 1787  average_loss : 2.35  step_loss : 3.14  learning_rate :
/// 0.0053 ` → the same line as `key: value` pairs; a tqdm bar printed after it on the same
/// line (`…  Iteration:  67%|███▌  | 1850/2771 […]`) is not part of it. `None` for any
/// other line.
pub(super) fn dllogger_body(t: &str) -> Option<String> {
    let rest = t.strip_prefix("DLL ")?;
    let (_, body) = rest.split_once(" - ")?;
    let body = match body.find("%|") {
        Some(p) => body[..p].rfind("   ").map_or(body, |cut| &body[..cut]),
        None => body,
    };
    Some(body.replace(" : ", ": ").trim().to_string())
}

/// A generic step line, a DeepSpeed-Chat timing line (pending for the next step) or its
/// `average reward score:` line (attached to the last step).
pub(super) fn parse_kv_line(t: &str) -> Option<TextItem> {
    if let Some(rest) = t.strip_prefix("average reward score:") {
        let v = parse_number_text(rest)?;
        return Some(TextItem::Attach(vec![("average_reward_score".into(), v)]));
    }
    let t = without_log_prefix(t);
    // ` -- ` between groups of pairs (`Train step 1040 -- Loss: 11.174, MLM: 10.479 -- It/s:
    // 1.69`) separates pairs like a comma.
    let dashed;
    let t = if t.contains(" -- ") {
        dashed = t.replace(" -- ", ", ");
        dashed.as_str()
    } else {
        t
    };
    let (mut step, body, source) = match minimind_head(t) {
        Some((s, rest)) => (Some(s), rest, SourceKind::KvText),
        None => match strip_step_prefix(t) {
            Some((s, rest)) => (Some(s), rest, SourceKind::KvText),
            None => (None, t, SourceKind::KvText),
        },
    };
    let mut fields = Vec::new();
    let mut pairs = 0usize;
    let mut epoch = None;
    let parts = parts_of(body);
    for (i, part) in parts.iter().enumerate() {
        let Some((k, v)) = split_pair(part) else {
            // `step 12: loss=…` / `[iteration 5] loss: …`: a step prefix on the first part.
            if i == 0 && step.is_none() {
                step = prefix_step(part);
            }
            continue;
        };
        if is_step_key(&k) {
            if step.is_none() {
                step = step_value(v);
            }
            pairs += 1;
            continue;
        }
        // `epoch: 3451 loss: nan` (a script that counts epochs): the step only when no
        // step key names one.
        if k == "epoch" {
            epoch = step_value(v).filter(|_| v.trim().parse::<i64>().is_ok());
        }
        if let Some((x, suffix)) = value_of(v) {
            pairs += 1;
            fields.push((format!("{k}{suffix}"), x));
        }
    }
    if step.is_none() && epoch.is_some() {
        fields.retain(|(k, _)| k != "epoch");
    }
    // an epoch counter alone is where the run is, not a record (a line cut after its step)
    if fields.iter().all(|(k, _)| k == "epoch") {
        return None;
    }
    let step = step.or(epoch);
    match step {
        Some(s) => Some(TextItem::Step {
            source,
            step: Some(s),
            fields,
            tail: None,
        }),
        // DeepSpeed-Chat's timing line: several `key=value` cells between pipes, no step.
        None if t.contains('|') && pairs >= 3 && fields.iter().any(|(k, _)| k.ends_with("_s")) => {
            Some(TextItem::Pending(fields))
        }
        // Several pairs and no step: fields of the step a banner named before them
        // (`iteration 9/10000`, then `steps_per_s=443.39, loss=0.2225, …`).
        None if pairs >= 2 => Some(TextItem::Fields(fields)),
        None => None,
    }
}

/// A line that names only a step: NeMo-RL's banner `========================= Step 3/100
/// =========================` (nemo_rl/algorithms/grpo.py prints it before each step's
/// `📊 Training Results:` block), `--- iteration 12 ---`, `Iteration: 5`. The fields that
/// follow on their own lines ([`parse_field_line`]) are that step's.
pub(super) fn parse_step_header(t: &str) -> Option<i64> {
    let core = without_log_prefix(t).trim_matches(|c: char| {
        c.is_whitespace() || matches!(c, '=' | '-' | '#' | '*' | '~' | '[' | ']' | '<' | '>' | '|')
    });
    let lower = core.to_ascii_lowercase();
    // rsl_rl's `Learning iteration 8391/10000` block title
    let lower = lower
        .strip_prefix("learning ")
        .unwrap_or(&lower)
        .to_string();
    let rest = ["step", "iteration", "iter"]
        .iter()
        .find_map(|w| lower.strip_prefix(w))?;
    let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ':');
    if rest.len() == lower.len() || rest.is_empty() {
        return None;
    }
    let (n, total) = match rest.split_once('/') {
        Some((n, m)) => (n.trim(), Some(m.trim())),
        None => (rest.trim(), None),
    };
    if total.is_some_and(|m| m.parse::<i64>().is_err()) {
        return None;
    }
    n.parse::<i64>().ok()
}

/// AReaL's StatsLogger line before each step's stats table (areal/utils/stats_logger.py
/// `commit`): `Epoch 1/5 Step 3/10 Train step 3/50 done.` — the global train step.
pub(super) fn train_step_done(t: &str) -> Option<i64> {
    let at = t.find("Train step ")?;
    let rest = t[at + "Train step ".len()..].strip_suffix("done.")?;
    let (n, m) = rest.trim().split_once('/')?;
    m.trim().parse::<i64>().ok()?;
    n.trim().parse().ok()
}

/// One `key: value` line of a step's block: NeMo-RL's `  • Loss: 0.0123`, `  • Total step
/// time: 45.23s`, `  • generation: 20.12s (44.5%)`; `- Loss: …` and bare `Loss: …` too.
pub(super) fn parse_field_line(t: &str) -> Option<(String, f64)> {
    let body = t
        .trim_start_matches(|c: char| c.is_whitespace() || matches!(c, '•' | '-' | '*' | '·' | '–'))
        .trim_end();
    let (k, v) = split_pair(body)?;
    if k.is_empty() || body.contains(", ") {
        return None;
    }
    let (x, suffix) = value_of(v)?;
    Some((format!("{k}{suffix}"), x))
}

/// A section title with no value: `📊 Training Results:`, `⏱️  Timing:`, `Online DPO
/// training results:` — words ending with a colon, no digit.
pub(super) fn is_section_title(t: &str) -> bool {
    let Some(head) = t.trim().strip_suffix(':') else {
        return false;
    };
    head.len() <= 80
        && !head.contains(':')
        && head.chars().any(char::is_alphabetic)
        && !head.chars().any(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_of(item: &TextItem) -> (Option<i64>, Vec<(String, f64)>) {
        match item {
            TextItem::Step { step, fields, .. } => (*step, fields.clone()),
            other => panic!("not a step: {other:?}"),
        }
    }

    #[test]
    fn prefixes_give_the_step() {
        assert_eq!(prefix_step("step 12: "), Some(12));
        assert_eq!(prefix_step("[INFO] iteration 7 |"), Some(7));
        assert_eq!(prefix_step("rollout.py:1193 - perf 3: "), Some(3));
        assert_eq!(prefix_step("mystep 12: "), None);
        assert_eq!(prefix_step("step 12 of the loop: "), None);
        assert_eq!(prefix_step("Step 40/100: "), Some(40));
    }

    #[test]
    fn deepspeed_chat_lines() {
        let (s, f) = step_of(
            &parse_kv_line(
                "epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf|unsuper_loss: 0.0",
            )
            .unwrap(),
        );
        assert_eq!(s, Some(3184));
        let keys: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["epoch", "ppo_ep", "act_loss", "cri_loss", "unsuper_loss"]
        );
        assert_eq!(f[2].1, f64::INFINITY);
        assert_eq!(
            parse_kv_line("average reward score: -6.359375"),
            Some(TextItem::Attach(vec![(
                "average_reward_score".into(),
                -6.359375
            )]))
        );
        let TextItem::Pending(f) = parse_kv_line("|E2E latency=2.12s |Gather latency=0.00s (0.00%) |Generate time=1.59s (75.13%) |Training time=0.42s (19.78%) |Others=0.11 (5.09%)|CurSamplesPerSec=1.89 |AvgSamplesPerSec=1.95").unwrap() else {
            panic!("timing line")
        };
        assert_eq!(f[0], ("e2e_latency_s".into(), 2.12));
        assert_eq!(f[2], ("generate_time_s".into(), 1.59));
        assert_eq!(f[4], ("others".into(), 0.11));
    }

    #[test]
    fn step_banners_and_their_field_lines() {
        let banner = "========================= Step 3/100 =========================";
        assert_eq!(parse_step_header(banner), Some(3));
        assert_eq!(parse_step_header("Iteration: \t 0"), Some(0));
        assert_eq!(parse_step_header("--- iteration 12 ---"), Some(12));
        assert_eq!(parse_step_header("Step 3/100 loss 0.5"), None);
        assert_eq!(parse_step_header("Steps taken"), None);
        assert_eq!(parse_step_header("stepping 4"), None);
        assert_eq!(
            parse_field_line("  • Total step time: 45.23s"),
            Some(("total_step_time_s".into(), 45.23))
        );
        assert_eq!(
            parse_field_line("  • generation: 20.12s (44.5%)"),
            Some(("generation_s".into(), 20.12))
        );
        assert_eq!(
            parse_field_line("  - Loss: 0.0123"),
            Some(("loss".into(), 0.0123))
        );
        assert_eq!(parse_field_line("📊 Training Results:"), None);
        assert_eq!(parse_field_line("RuntimeError: CUDA error"), None);
    }

    #[test]
    fn areal_train_step_line() {
        assert_eq!(
            train_step_done("[AReaL] 20250801-12:00:00.123 StatsLogger INFO: Epoch 1/5 Step 3/10 Train step 3/50 done."),
            Some(3)
        );
        assert_eq!(train_step_done("Train step 3/50 started"), None);
    }

    #[test]
    fn a_logging_prefix_before_the_key_is_dropped() {
        let (s, f) = step_of(&parse_kv_line("[rank0]:[cosmos] 2025-06-13 11:29:05,978 - cosmos - INFO - Step: 826/4725, Loss: -0.01001, Learning rate: 2.00000e-06, Iteration time: 80.240s, Completion length: 426, Reward: 1.5").unwrap());
        assert_eq!(s, Some(826));
        assert_eq!(f[0], ("loss".into(), -0.01001));
        assert_eq!(f[2], ("iteration_time_s".into(), 80.24));
        assert_eq!(f[4], ("reward".into(), 1.5));
    }

    #[test]
    fn minimind_and_generic_lines() {
        let (s, f) = step_of(
            &parse_kv_line("Epoch:[2/2](5/100), Actor Loss: 0.1234, Aux Loss: 0.0000, Reward: 'nan', Avg Response Len: 123.45, Learning Rate: 0.00000008").unwrap(),
        );
        assert_eq!(s, Some(105));
        assert_eq!(f[0], ("actor_loss".into(), 0.1234));
        assert!(f[2].1.is_nan());
        assert_eq!(f[3], ("avg_response_len".into(), 123.45));
        let (s, f) = step_of(&parse_kv_line("step 12 | loss=0.3 | kl=0.01").unwrap());
        assert_eq!((s, f.len()), (Some(12), 2));
        let (s, f) = step_of(&parse_kv_line("iteration 5: loss: 0.3, reward: 1").unwrap());
        assert_eq!((s, f.len()), (Some(5), 2));
        let (s, f) = step_of(&parse_kv_line("global_step=40 loss=0.5 grad_norm=1.5").unwrap());
        assert_eq!((s, f[1].clone()), (Some(40), ("grad_norm".into(), 1.5)));
        // No step: not a step line, fields for a banner's step; prose with a colon: nothing.
        assert_eq!(
            parse_kv_line("loss: 0.3, kl: 0.1"),
            Some(TextItem::Fields(vec![
                ("loss".into(), 0.3),
                ("kl".into(), 0.1)
            ]))
        );
        assert_eq!(parse_kv_line("Number of parameters: 1234"), None);
        assert_eq!(parse_kv_line("Loading step 3 of the pipeline"), None);
    }
}
